// templates/common/fj_fwd.cuh: what both forward templates (sm80/fwd.cuh,
// sm90/fwd.cuh) share: the kernel's one parameter, small PTX helpers, and
// the tile walk (block classes, the CTA's tile range, the next non-EMPTY
// block, a block-mask row's tiles).
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

// ---- PTX helpers (the TU includes no CUDA header) ------------------------

__device__ __forceinline__ unsigned fj_smem_u32(const void *ptr) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
      : "=r"(r) : "l"(ptr));
  return r;
}

// Two floats to a packed pair of the element type, `lo` at the lower address.
__device__ __forceinline__ unsigned fj_pack2(float lo, float hi) {
  unsigned r;
#if defined(FJ_DTYPE_BF16)
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

// 2^x on the special-function unit; 2^-inf = 0, which the masking relies on.
__device__ __forceinline__ float fj_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// One 16-byte store to global memory (the runtime checks that O and its
// strides are 16-byte aligned). Through PTX: a store of a 16-byte struct
// came out of NVVM as four 4-byte stores (SASS STG.E x 4).
__device__ __forceinline__ void fj_st_global_v4(void *dst, unsigned a, unsigned b,
                                                unsigned c, unsigned d) {
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %0;\n"
      " st.global.v4.b32 [g], {%1, %2, %3, %4};\n}\n"
      :: "l"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// threadIdx.x through a volatile read: values derived from it are recomputed
// where they are used (a few integer ops per tile) instead of being kept in
// registers for the whole kv loop, where every register is taken by S, P and O.
__device__ __forceinline__ int fj_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

__device__ __forceinline__ float fj_neg_inf() { return __int_as_float(0xff800000); }

// ---- tile walk ------------------------------------------------------------

#if FJ_HAS_MASK
// Class of kv block j for query rows [q0, q1], ranges clipped to the bounds.
__device__ __forceinline__ int fj_block_class(const fj_fwd_params &p, int b, int h,
                                              int q0, int q1, int j) {
  const int kv0 = j * FJ_BLOCK_N;
  const int kv1 = min(kv0 + FJ_BLOCK_N, p.sz.Lk) - 1;
  return fj_tile_class(p.user, p.sz, b, h, q0, q1, kv0, kv1);
}

// The kv blocks j = first_j, first_j + stride, ... below nb (the block
// count) classified by this thread, reduced over its warp: *first the lowest
// non-EMPTY one (nb when none), *last 4 * the highest + its class (-1 when
// none).
__device__ __forceinline__ void fj_tile_scan_warp(const fj_fwd_params &p, int b, int h,
                                                  int q0, int q1, int nb, int first_j,
                                                  unsigned stride, int *first, int *last) {
  int f = nb, l = -1;
  for (int j = first_j; j < nb; j += stride) {
    const int kv0 = j * FJ_BLOCK_N;
    const int c = fj_tile_class(p.user, p.sz, b, h, q0, q1, kv0,
                                min(kv0 + FJ_BLOCK_N, p.sz.Lk) - 1);
    if (c != FJ_TILE_EMPTY) {
      f = min(f, j);
      l = 4 * j + c;  // j grows: the thread's last hit is its largest
    }
  }
  *first = __reduce_min_sync(0xffffffffu, f);
  *last = __reduce_max_sync(0xffffffffu, l);
}

// [lo, hi] and the class of hi from a scan's first and last.
__device__ __forceinline__ void fj_tile_range_of(int first, int last, int *lo, int *hi,
                                                 int *hi_cls) {
  *lo = first;
  *hi = last < 0 ? -1 : last >> 2;
  *hi_cls = last < 0 ? FJ_TILE_FULL : (last & 3);
}

// The kv blocks that are not EMPTY for the query rows [q0, q1] (no block
// mask): *lo the first, *hi the last (lo > hi when there is none) and
// *hi_cls the class of hi. Every thread of the CTA classifies its share of
// the blocks, one round for up to blockDim.x of them, where a serial scan
// cost a causal or sliding-window row of a 16k sequence up to a hundred
// classifications before its first tile. Every thread of the CTA must call
// it (two __syncthreads).
__device__ __forceinline__ void fj_tile_range(const fj_fwd_params &p, int b, int h,
                                              int q0, int q1, int *lo, int *hi,
                                              int *hi_cls) {
  __shared__ int fj_range[2];  // first block; 4 * last block + its class
  const int nb = (p.sz.Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N;
  if (threadIdx.x == 0) {
    fj_range[0] = nb;
    fj_range[1] = -1;
  }
  __syncthreads();
  int first, last;
  fj_tile_scan_warp(p, b, h, q0, q1, nb, threadIdx.x, blockDim.x, &first, &last);
  if ((threadIdx.x & 31) == 0) {
    atomicMin(&fj_range[0], first);
    atomicMax(&fj_range[1], last);
  }
  __syncthreads();
  fj_tile_range_of(fj_range[0], fj_range[1], lo, hi, hi_cls);
}
#endif

// Next kv block below j that is not EMPTY for the rows [q0, q1], or a value
// < lo when none is left; *cls receives its class. Visiting only these
// blocks is what makes empty tiles free: neither loaded nor multiplied.
__device__ __forceinline__ int fj_next_block(const fj_fwd_params &p, int b, int h,
                                             int q0, int q1, int j, int lo, int *cls) {
  --j;
#if FJ_HAS_MASK
  for (; j >= lo; --j) {
    *cls = fj_block_class(p, b, h, q0, q1, j);
    if (*cls != FJ_TILE_EMPTY) break;
  }
#else
  (void)p; (void)b; (void)h; (void)q0; (void)q1; (void)lo;
  *cls = FJ_TILE_FULL;
#endif
  return j;
}
