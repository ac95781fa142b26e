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
// any gets o = 0 and lse = -inf. Warp k of a row sums segments k, k + wpr,
// ...; the row's warps share a CTA and add their sums in shared memory, in
// warp order (the same result every run). Grid ceil(B * H * L * wpr / 4),
// 128 threads.
extern "C" __global__ void __launch_bounds__(128)
fj_merge_states_kernel(const __grid_constant__ fj_merge_params p) {
#if __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the decode kernel (sm_90 and
  // newer): its partials are complete and visible past this point. A plain
  // launch passes at once.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  __shared__ __align__(16) float part[4][128];  // [warp][d - d0]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long gw = (long long)blockIdx.x * 4 + warp;
  const long long row = gw / p.wpr;
  const int sub = (int)(gw % p.wpr);
  const long long rows = (long long)p.B * p.H * p.L;
  // Warps past the last row stay for the barriers below.
  const bool active = row < rows;
  const long long rc = active ? row : rows - 1;
  const int l = (int)(rc % p.L), h = (int)(rc / p.L % p.H), b = (int)(rc / p.L / p.H);
  const long long lp0 = b * p.lp_sb + h * p.lp_sh + l * p.lp_sl;
  // A NaN LSE (NaN in a segment's inputs) makes the row NaN, as the
  // unsplit computation would be: fmaxf alone would drop it.
  float m = fj_neg_inf();
  bool nan = false;
  for (int i = lane; i < p.N; i += 32) {
    const float li = p.lse_parts[lp0 + i * p.lp_sn];
    nan |= li != li;
    m = fmaxf(m, li);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (__any_sync(0xffffffffu, nan)) m = __int_as_float(0x7fffffff);
  float sum = 0.f;
  for (int i = lane; i < p.N; i += 32) {
    const float li = p.lse_parts[lp0 + i * p.lp_sn];
    sum += li == fj_neg_inf() ? 0.f : __expf(li - m);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const bool none = m == fj_neg_inf();
  const long long op0 = b * p.op_sb + h * p.op_sh + l * p.op_sl;
  // Vector loads where every segment's 4 elements are aligned to them.
  const int esz = p.in_dtype == 0 ? 4 : 2;
  const bool vec = ((unsigned long long)p.o_parts + op0 * esz) % (4 * esz) == 0 &&
                   p.op_sn % 4 == 0;
  unsigned short *o = (unsigned short *)p.o + b * p.o_sb + h * p.o_sh + l * p.o_sl;
  // A lane takes 4 consecutive elements (D is a multiple of 8) and its
  // warp's segments FJM_UNROLL at a time: their loads are independent, so
  // they are in flight together.
  for (int d0 = 0; d0 < p.D; d0 += 128) {
    const int d = d0 + 4 * lane;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i0 = sub; active && !none && d < p.D && i0 < p.N; i0 += p.wpr * FJM_UNROLL) {
      float w[FJM_UNROLL], x[FJM_UNROLL][4];
#pragma unroll
      for (int u = 0; u < FJM_UNROLL; ++u) {
        const int iu = i0 + u * p.wpr;
        const int i = min(iu, p.N - 1);
        const float li = p.lse_parts[lp0 + i * p.lp_sn];
        // A segment past N or without keys adds nothing (its o may be
        // anything: 0 times NaN would still be NaN).
        w[u] = iu >= p.N || li == fj_neg_inf() ? -1.f : __expf(li - m);
        fjm_load4(p.o_parts, op0 + i * p.op_sn + d, p.in_dtype, vec, x[u]);
      }
#pragma unroll
      for (int u = 0; u < FJM_UNROLL; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] = w[u] < 0.f ? acc[e] : fmaf(w[u], x[u][e], acc[e]);
    }
    if (p.wpr > 1) {
      // The row's warps are this CTA's warps warp - sub .. warp - sub +
      // wpr - 1 (wpr divides 4); the first adds the others' sums in order.
      *(float4 *)&part[warp][4 * lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      __syncthreads();
      if (sub == 0) {
        for (int k = 1; k < p.wpr; ++k) {
          const float4 y = *(const float4 *)&part[warp + k][4 * lane];
          acc[0] += y.x, acc[1] += y.y, acc[2] += y.z, acc[3] += y.w;
        }
      }
      __syncthreads();
    }
    if (active && sub == 0 && d < p.D) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[d + e] = fjm_round(none ? 0.f : acc[e] / sum, p.out_dtype);
    }
  }
  if (active && sub == 0 && lane == 0 && p.lse != nullptr)
    p.lse[b * p.l_sb + h * p.l_sh + l * p.l_sl] = none ? fj_neg_inf() : m + __logf(sum);
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
