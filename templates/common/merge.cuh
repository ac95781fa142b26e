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
};

__device__ __forceinline__ float fjm_load(const void *p, long long i, int dtype) {
  if (dtype == 0) return ((const float *)p)[i];
  const unsigned short u = ((const unsigned short *)p)[i];
  if (dtype == 1) return __uint_as_float((unsigned)u << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(u));
  return f;
}

__device__ __forceinline__ unsigned short fjm_round(float x, int dtype) {
  unsigned short u;
  if (dtype == 1)
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(u) : "f"(x));
  else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(u) : "f"(x));
  return u;
}

// One warp a row (b, h, l): o = sum_i exp(lse_i - lse) o_i, lse = log sum_i
// exp(lse_i); segments with lse_i = -inf add nothing; a row without any gets
// o = 0 and lse = -inf. Grid ceil(B * H * L / 4), 128 threads.
extern "C" __global__ void __launch_bounds__(128)
fj_merge_states_kernel(const __grid_constant__ fj_merge_params p) {
  const long long row = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= (long long)p.B * p.H * p.L) return;
  const int l = (int)(row % p.L), h = (int)(row / p.L % p.H), b = (int)(row / p.L / p.H);
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
  unsigned short *o = (unsigned short *)p.o + b * p.o_sb + h * p.o_sh + l * p.o_sl;
  // A lane takes 4 consecutive elements (D is a multiple of 8), and the
  // segments FJM_UNROLL at a time: their loads are independent, so that
  // many are in flight, not one segment's latency after another's.
  constexpr int FJM_UNROLL = 8;
  for (int d = 4 * lane; d < p.D; d += 128) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i0 = 0; !none && i0 < p.N; i0 += FJM_UNROLL) {
      float w[FJM_UNROLL], x[FJM_UNROLL][4];
#pragma unroll
      for (int u = 0; u < FJM_UNROLL; ++u) {
        const int i = min(i0 + u, p.N - 1);
        const float li = p.lse_parts[lp0 + i * p.lp_sn];
        // A segment past N or without keys adds nothing (its o may be
        // anything: 0 times NaN would still be NaN).
        w[u] = i0 + u >= p.N || li == fj_neg_inf() ? -1.f : __expf(li - m);
#pragma unroll
        for (int e = 0; e < 4; ++e) x[u][e] = fjm_load(p.o_parts, op0 + i * p.op_sn + d + e, p.in_dtype);
      }
#pragma unroll
      for (int u = 0; u < FJM_UNROLL; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] = w[u] < 0.f ? acc[e] : fmaf(w[u], x[u][e], acc[e]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) o[d + e] = fjm_round(none ? 0.f : acc[e] / sum, p.out_dtype);
  }
  if (lane == 0 && p.lse != nullptr)
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
