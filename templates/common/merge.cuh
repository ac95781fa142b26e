// templates/common/merge.cuh: the serving layer's spec-independent kernels
// (runtime/decode.c compiles this unit once per target): merging attention
// states by their LSE (fj_merge_states, and the decode kernel's split-KV
// combine) and FlashInfer's CSR page layout to a block table
// (fj_paged_from_csr). Needs common/fj_common.cuh and common/ptx.cuh.
#pragma once

// Host mirror: runtime/decode.c's merge_params, member for member.
struct fj_merge_params {
  const void *o_parts;    // [N][B][H][L][D], in_dtype
  const float *lse_parts; // [N][B][H][L], natural log
  void *o;                // [B][H][L][D], out_dtype
  float *lse;             // [B][H][L], may be null
  long long op_sn, op_sb, op_sh, op_sl;  // strides in elements
  long long lp_sn, lp_sb, lp_sh, lp_sl;
  long long o_sb, o_sh, o_sl;
  long long l_sb, l_sh, l_sl;
  int N, B, H, L, D;
  int in_dtype;   // 0 float32, 1 bf16, 2 fp16
  int out_dtype;  // 1 bf16, 2 fp16
  int wpr;        // warps a row: 1, 2 or 4 (runtime/decode.c, merge_warps_per_row)
};

// Four consecutive elements i .. i + 3 of p as floats; vec: one 16-byte
// (float32) or 8-byte (16-bit) load, the address being aligned to it.
__device__ __forceinline__ void fjm_load4(const void *p, long long i, int dtype, bool vec,
                                          float (&x)[4]) {
  if (dtype == 0) {
    const float *f = (const float *)p + i;
    if (vec) {
      const float4 v = *(const float4 *)f;
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = f[e];
    }
    return;
  }
  const unsigned short *h = (const unsigned short *)p + i;
  unsigned short u[4];
  if (vec) {
    const uint2 v = *(const uint2 *)h;
    u[0] = v.x & 0xffff, u[1] = v.x >> 16, u[2] = v.y & 0xffff, u[3] = v.y >> 16;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) u[e] = h[e];
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (dtype == 1) {
      x[e] = __uint_as_float((unsigned)u[e] << 16);
    } else {
      asm("cvt.f32.f16 %0, %1;" : "=f"(x[e]) : "h"(u[e]));
    }
  }
}

__device__ __forceinline__ unsigned short fjm_round(float x, int dtype) {
  unsigned short u;
  if (dtype == 1)
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(u) : "f"(x));
  else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(u) : "f"(x));
  return u;
}

// Segments a warp loads at once: with p.wpr warps a row (the host gives a
// row more warps when it has more segments, up to 4 x FJM_UNROLL), a row's
// partials arrive in one memory latency, not one after another.
#define FJM_UNROLL 16

// p.wpr warps a row (b, h, l): o = sum_i exp(lse_i - lse) o_i, lse = log
// sum_i exp(lse_i); segments with lse_i = -inf add nothing; a row without
// any gets o = 0 and lse = -inf, a row with a NaN LSE gets NaN (as the
// unsplit computation would). Warp k of a row takes segments k, k + wpr,
// ..., FJM_UNROLL at a time, each segment's LSE and O loaded together (one
// memory latency a batch), with a running max as in the online softmax;
// the row's warps share a CTA and add their states in shared memory, in
// warp order (the same result every run). Grid ceil(B * H * L * wpr / 4),
// 128 threads.
extern "C" __global__ void __launch_bounds__(128)
fj_merge_states_kernel(const __grid_constant__ fj_merge_params p) {
  __shared__ __align__(16) float part[4][128];  // [warp][d - d0]
  __shared__ float part_m[4], part_s[4];
  __shared__ int part_nan[4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // The row and its addresses come first: as a dependent launch (below)
  // this overlaps the decode kernel's end.
  const long long gw = (long long)blockIdx.x * 4 + warp;
  const long long row = gw / p.wpr;
  const int sub = (int)(gw % p.wpr);
  const long long rows = (long long)p.B * p.H * p.L;
  // Warps past the last row stay for the barriers below.
  const bool active = row < rows;
  const long long rc = active ? row : rows - 1;
  const int l = (int)(rc % p.L), h = (int)(rc / p.L % p.H), b = (int)(rc / p.L / p.H);
  const long long lp0 = b * p.lp_sb + h * p.lp_sh + l * p.lp_sl;
  const long long op0 = b * p.op_sb + h * p.op_sh + l * p.op_sl;
  // Vector loads where every segment's 4 elements are aligned to them.
  const int esz = p.in_dtype == 0 ? 4 : 2;
  const bool vec = ((unsigned long long)p.o_parts + op0 * esz) % (4 * esz) == 0 &&
                   p.op_sn % 4 == 0;
  unsigned short *o = (unsigned short *)p.o + b * p.o_sb + h * p.o_sh + l * p.o_sl;
  // Launched as a programmatic dependent of the decode kernel (sm_90 and
  // newer): its partials are complete and visible past this point.
  fj_grid_dep_wait();
  // A lane takes 4 consecutive elements (D is a multiple of 8).
  for (int d0 = 0; d0 < p.D; d0 += 128) {
    const int d = d0 + 4 * lane;
    float m = fj_neg_inf(), sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
    bool nan = false;
    for (int i0 = sub; active && i0 < p.N; i0 += p.wpr * FJM_UNROLL) {
      float li[FJM_UNROLL], x[FJM_UNROLL][4];
#pragma unroll
      for (int u = 0; u < FJM_UNROLL; ++u) {
        const int i = min(i0 + u * p.wpr, p.N - 1);
        li[u] = p.lse_parts[lp0 + i * p.lp_sn];
        if (d < p.D)
          fjm_load4(p.o_parts, op0 + i * p.op_sn + d, p.in_dtype, vec, x[u]);
        else
          x[u][0] = x[u][1] = x[u][2] = x[u][3] = 0.f;
      }
      // Every lane loads the same LSEs: the batch's max is warp-uniform.
      float mb = m;
#pragma unroll
      for (int u = 0; u < FJM_UNROLL; ++u)
        if (i0 + u * p.wpr < p.N) {
          nan |= li[u] != li[u];
          mb = fmaxf(mb, li[u]);
        }
      if (mb == fj_neg_inf()) continue;  // nothing yet has keys
      const float scale = __expf(m - mb);  // 0 while m is -inf
      sum *= scale;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] *= scale;
      m = mb;
      // A segment past N or without keys adds nothing (its o may be
      // anything: 0 times NaN would still be NaN).
#pragma unroll
      for (int u = 0; u < FJM_UNROLL; ++u) {
        if (i0 + u * p.wpr >= p.N || li[u] == fj_neg_inf() || li[u] != li[u]) continue;
        const float w = __expf(li[u] - m);
        sum += w;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] = fmaf(w, x[u][e], acc[e]);
      }
    }
    if (p.wpr > 1) {
      // The row's warps are this CTA's warps warp - sub .. warp - sub +
      // wpr - 1 (wpr divides 4); the first adds the others' states in order.
      *(float4 *)&part[warp][4 * lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      if (lane == 0) part_m[warp] = m, part_s[warp] = sum, part_nan[warp] = nan;
      __syncthreads();
      if (sub == 0) {
#pragma unroll 1
        for (int k = 1; k < p.wpr; ++k) m = fmaxf(m, part_m[warp + k]);
        const float own = m == fj_neg_inf() ? 0.f : __expf(part_m[warp] - m);
        sum *= own;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] *= own;
#pragma unroll 1
        for (int k = 1; k < p.wpr; ++k) {
          const float mk = part_m[warp + k];
          nan |= part_nan[warp + k] != 0;
          if (mk == fj_neg_inf()) continue;
          const float f = __expf(mk - m);
          const float4 y = *(const float4 *)&part[warp + k][4 * lane];
          sum = fmaf(f, part_s[warp + k], sum);
          acc[0] = fmaf(f, y.x, acc[0]), acc[1] = fmaf(f, y.y, acc[1]);
          acc[2] = fmaf(f, y.z, acc[2]), acc[3] = fmaf(f, y.w, acc[3]);
        }
      }
      __syncthreads();
    }
    if (!active || sub != 0) continue;
    const bool none = m == fj_neg_inf();
    if (nan) m = __int_as_float(0x7fffffff);
    if (d < p.D) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o[d + e] = fjm_round(nan ? m : none ? 0.f : acc[e] / sum, p.out_dtype);
    }
    if (d0 == 0 && lane == 0 && p.lse != nullptr)
      p.lse[b * p.l_sb + h * p.l_sh + l * p.l_sl] = none && !nan ? fj_neg_inf()
                                                               : m + __logf(sum);
  }
}

// Host mirror: runtime/decode.c's csr_params.
struct fj_csr_params {
  const int *indptr;    // [B + 1]
  const int *indices;   // [indptr[B]]
  const int *last_len;  // [B]
  int *block_table;     // [B][bt_stride]
  int *seqlens;         // [B]
  long long bt_stride;
  int B, max_pages, page_size;
};

// One thread an entry (b, j) of the block table; j == 0 also writes b's
// length. Grid (ceil(max_pages / 128), B), 128 threads.
extern "C" __global__ void __launch_bounds__(128)
fj_paged_from_csr_kernel(const __grid_constant__ fj_csr_params p) {
  const int b = blockIdx.y, j = blockIdx.x * 128 + threadIdx.x;
  if (j >= p.max_pages) return;
  const int start = p.indptr[b];
  const int n = max(p.indptr[b + 1] - start, 0);
  const int kept = min(n, p.max_pages);
  p.block_table[b * p.bt_stride + j] = j < kept ? p.indices[start + j] : 0;
  if (j == 0) {
    const int last = min(max(p.last_len[b], 1), p.page_size);
    p.seqlens[b] = n == 0 ? 0 : kept < n ? kept * p.page_size : (n - 1) * p.page_size + last;
  }
}
