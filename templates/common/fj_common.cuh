// templates/common/fj_common.cuh: types and helpers shared by every kernel.
//
// The generator (gen/emit_cuda.c) assembles one translation unit, in order:
//   1. #defines of the kernel configuration (C decides, templates obey):
//        FJ_HEAD_DIM       64 | 128 | 256 (256: sm90 only)
//        FJ_DTYPE_BF16 1   or   FJ_DTYPE_F16 1
//        FJ_BLOCK_M, FJ_BLOCK_N, FJ_NUM_WARPS, FJ_NUM_STAGES
//        FJ_HAS_MASK       0 | 1   (0: every in-range pair is allowed)
//        FJ_HAS_SCORE_MOD  0 | 1   (0: score is q.k * scale)
//        FJ_SCORE_SFU      1 or undefined (0): the score_mod calls a special
//                          function (exp, log, sqrt, tanh, a division) on
//                          every element (sm90/config.cuh, FJ_EXP2_EMU)
//        FJ_SCORE_TILE     1 or undefined (0): the prologue has fj_score_tile
//                          and fj_score_log2_tile (below)
//   2. this file
//   3. the generated prologue:
//        struct fj_user_params { long long fj_reserved_; <args...> };
//        __device__ bool  fj_mask(const fj_user_params&, const fj_sizes&,
//                                 int b, int h, int q, int kv);
//        __device__ float fj_score_mod(const fj_user_params&, const fj_sizes&,
//                                      float score, int b, int h, int q, int kv);
//        __device__ float fj_score_log2(const fj_user_params&, const fj_sizes&,
//                                       float qk, float scale, int b, int h,
//                                       int qb, int dq, int kvb, int dk);
//      fj_score_log2 is what the kernels call: fj_score_mod(qk * scale) times
//      log2 e at q = qb + dq, kv = kvb + dk. A caller passes the same qb and
//      kvb for all the elements of its unrolled loop and their constant
//      offsets as dq and dk, so that what only the offsets change is all the
//      element computes (any split gives the value; this one gives the speed).
//        __device__ int   fj_tile_class(const fj_user_params&, const fj_sizes&,
//                                       int b, int h, int q0, int q1,
//                                       int kv0, int kv1);
//      fj_tile_class gets inclusive index ranges and returns FJ_TILE_EMPTY
//      when the mask is false for every pair of the tile, FJ_TILE_FULL when it
//      is true for every pair, FJ_TILE_PARTIAL otherwise (always sound; it
//      does not know about Lq/Lk bounds, which the kernel handles itself).
//      h is the query head; b the batch index.
//        __device__ bool  fj_score_tile(const fj_user_params&, const fj_sizes&,
//                                       float scale, int b, int h, int q0,
//                                       int q1, int kv0, int kv1, float &terms);
//        __device__ float fj_score_log2_tile(float qk, float scale, float terms);
//      With FJ_SCORE_TILE only (an additive score_mod whose terms can be
//      one value over a tile): fj_score_tile returns true when, by the same
//      interval analysis, the terms are one value over the inclusive ranges,
//      and sets terms to it (log2 units); fj_score_log2_tile(qk, scale,
//      terms) is then the score of every element of the tile (fj_score_log2's
//      value within a few ulp of the terms).
//   4. the kernel's other parts, in the order gen/templates.c lists them
//      (for a forward kernel: common/fj_fwd.cuh, common/ptx.cuh,
//      common/tile_walk.cuh, then the architecture template's parts).
#pragma once

typedef unsigned short fj_u16;

// The problem's sizes, and the positions of q's and k's first rows in the
// whole sequence (context parallel shards; 0 otherwise), which the spec's
// hooks add to the row indices they are given.
struct fj_sizes {
  int B, Hq, Hkv, Lq, Lk;
  int q_off, kv_off;
};

enum { FJ_TILE_EMPTY = 0, FJ_TILE_PARTIAL = 1, FJ_TILE_FULL = 2 };

// Lua's floor division and floored modulo on i32 (x // 0 and x % 0 are 0).
// Selects, not branches: the divisor is often a param, the same for every
// element, and these sit in unrolled per-element code; with branches each
// element got its own (and the registers to go with them).
__device__ __forceinline__ int fj_idiv_i32(int a, int b) {
  const bool odd = b == 0 || b == -1;
  const int d = odd ? 1 : b;
  const int q = a / d;
  const int floored = q - ((a - q * d != 0) && ((a < 0) != (d < 0)) ? 1 : 0);
  // INT32_MIN // -1 wraps
  return b == 0 ? 0 : b == -1 ? (int)(0u - (unsigned)a) : floored;
}
__device__ __forceinline__ int fj_mod_i32(int a, int b) {
  const bool odd = b == 0 || b == -1;
  const int d = odd ? 1 : b;
  const int r = a % d;
  const int floored = (r != 0 && ((r < 0) != (d < 0))) ? r + d : r;
  return odd ? 0 : floored;
}
__device__ __forceinline__ float fj_idiv_f32(float a, float b) { return floorf(a / b); }
__device__ __forceinline__ float fj_mod_f32(float a, float b) { return a - floorf(a / b) * b; }

// tanh on the special-function unit (sm_75+): one instruction, relative
// error about 2^-11 (below bf16/fp16 rounding), exactly +-1 when it
// saturates. The accurate tanhf costs several times more, and in a softcap
// kernel it competes with the softmax's exp2 for the same unit.
__device__ __forceinline__ float fj_tanh_f32(float x) {
#ifdef __CUDA_ARCH__
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return tanhf(x);  // the host build of unit/test_emit_cuda
#endif
}

// Buffer reads: an index outside [0, len) reads 0.
// The load itself is unconditional (index 0 when out of range; buffers are
// never empty at launch) so that the compiler can share the loads of one row
// or column across a tile instead of keeping each behind its own branch.
// The bound is taken in 32 bits (an int index is below 2^31 whatever the
// length) and the offset is unsigned: one compare and one wide multiply-add
// an element instead of 64-bit compares and sign extensions.
__device__ __forceinline__ bool fj_buf_in(long long len, int i) {
  const unsigned n = len > 0x7fffffffLL ? 0x80000000u : (unsigned)len;
  return (unsigned)i < n;
}
__device__ __forceinline__ int fj_load_i32(const int *p, long long len, int i) {
  const bool in = fj_buf_in(len, i);
  const int v = __ldg(p + (in ? (unsigned)i : 0u));
  return in ? v : 0;
}
__device__ __forceinline__ float fj_load_f32(const float *p, long long len, int i) {
  const bool in = fj_buf_in(len, i);
  const float v = __ldg(p + (in ? (unsigned)i : 0u));
  return in ? v : 0.0f;
}
