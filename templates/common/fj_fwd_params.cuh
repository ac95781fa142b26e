// templates/common/fj_fwd_params.cuh: the forward kernel's one parameter,
// and the tile-range search both forward templates start with.
//
// The host mirror is runtime/launch_params.h (struct fjr_fwd_params_fixed):
// every field up to `user` must match it member for member. The kernel is
//   extern "C" __global__ void fj_attention_fwd(const __grid_constant__ fj_fwd_params p)
// launched on grid (ceil(Lq / FJ_BLOCK_M), Hq, B) with FJ_NUM_WARPS * 32 threads
// and the dynamic shared memory gen/config.c computes.
#pragma once

struct fj_fwd_params {
  const void *q;
  const void *k;
  const void *v;
  void *o;
  float *lse;  // may be null
  // Strides in elements for batch, head and sequence; the head dim is contiguous.
  long long q_sb, q_sh, q_ss;
  long long k_sb, k_sh, k_ss;
  long long v_sb, v_sh, v_ss;
  long long o_sb, o_sh, o_ss;
  long long lse_sb, lse_sh;  // lse's sequence stride is 1
  fj_sizes sz;
  int kv_group;      // Hq / Hkv
  float scale;       // multiplies q.k
  float scale_log2;  // scale * log2(e)
  // Block mask (runtime/blockmask.c), or bm_kv_num == nullptr: none, and
  // tiles are classified by fj_tile_class. Count arrays are indexed by
  // b * bm_b_stride + h * bm_h_stride + m_block / bm_q_ratio (strides 0
  // broadcast); index arrays hold bm_nkv entries per count. A listed block
  // covers bm_kv_ratio kv tiles of FJ_BLOCK_N.
  const int *bm_kv_num;    // PARTIAL kv blocks per query block
  const int *bm_kv_idx;
  const int *bm_full_num;  // FULL kv blocks per query block
  const int *bm_full_idx;
  int bm_b_stride, bm_h_stride;
  int bm_nkv;
  int bm_q_ratio;   // block_q / FJ_BLOCK_M
  int bm_kv_ratio;  // block_kv / FJ_BLOCK_N
  fj_user_params user;
};

#if FJ_HAS_MASK
// The kv blocks of FJ_BLOCK_N columns that are not EMPTY for the query rows
// [q0, q1] (no block mask): *lo the first, *hi the last (lo > hi when there
// is none) and *hi_cls the class of hi. Every thread of the CTA classifies
// its share of the blocks, one round for up to blockDim.x of them, where a
// serial scan cost a causal or sliding-window row of a 16k sequence up to a
// hundred classifications before its first tile. Every thread of the CTA
// must call it (two __syncthreads).
__device__ __forceinline__ void fj_tile_range(const fj_fwd_params &p, int b, int h,
                                              int q0, int q1, int *lo, int *hi,
                                              int *hi_cls) {
  __shared__ int fj_range[2];  // first block; 4 * last block + its class
  const int Lk = p.sz.Lk;
  const int nb = (Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N;
  if (threadIdx.x == 0) {
    fj_range[0] = nb;
    fj_range[1] = -1;
  }
  __syncthreads();
  int first = nb, last = -1;
  for (int j = threadIdx.x; j < nb; j += blockDim.x) {
    const int kv0 = j * FJ_BLOCK_N;
    const int c = fj_tile_class(p.user, p.sz, b, h, q0, q1, kv0,
                                min(kv0 + FJ_BLOCK_N, Lk) - 1);
    if (c != FJ_TILE_EMPTY) {
      first = min(first, j);
      last = 4 * j + c;  // j grows: the thread's last hit is its largest
    }
  }
  first = __reduce_min_sync(0xffffffffu, first);
  last = __reduce_max_sync(0xffffffffu, last);
  if ((threadIdx.x & 31) == 0) {
    atomicMin(&fj_range[0], first);
    atomicMax(&fj_range[1], last);
  }
  __syncthreads();
  const int l = fj_range[1];
  *lo = fj_range[0];
  *hi = l < 0 ? -1 : l >> 2;
  *hi_cls = l < 0 ? FJ_TILE_FULL : (l & 3);
}
#endif
