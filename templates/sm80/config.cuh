// templates/sm80/config.cuh: the sm80 kernel's contract with the generator,
// the shapes derived from its macros, and the budgets they must fit.
//
// The sm80 forward kernel is FlashAttention-2 style, for sm_80 and newer
// (mma.sync m16n8k16, ldmatrix, cp.async); it runs unchanged on sm_86,
// sm_89, sm_90(a) and later. Its parts, in the order gen/templates.c pastes
// them: config.cuh, ptx.cuh, tile_load.cuh, pipeline.cuh, tile_walk.cuh,
// mainloop.cuh, fwd.cuh.
//
// ---- Contract with the generator -----------------------------------------
// Macros the generator defines (gen/emit_cuda.c, from gen/config.c):
//   FJ_HEAD_DIM        64 | 128                  head dim of q, k, v and o
//   FJ_DTYPE_BF16 1  or  FJ_DTYPE_F16 1          element type (exactly one)
//   FJ_BLOCK_M         query rows per CTA; FJ_BLOCK_M / FJ_NUM_WARPS must be
//                      16 or 32 (each warp owns 1 or 2 m16 row tiles)
//   FJ_BLOCK_N         kv rows per tile, multiple of 16
//   FJ_NUM_WARPS       warps per CTA (threads = 32 * FJ_NUM_WARPS)
//   FJ_NUM_STAGES      K/V shared-memory stages, >= 2 (prefetch distance
//                      FJ_NUM_STAGES - 1 tiles)
//   FJ_HAS_MASK        0 | 1: 1 calls fj_tile_class per tile and fj_mask per
//                      element of PARTIAL tiles; 0 never calls either. With
//                      a block mask in the parameters (p.bm_kv_num), the
//                      kv tiles and their classes come from its lists
//                      instead, and fj_tile_class only refines PARTIAL ones
//                      per warp
//   FJ_HAS_SCORE_MOD   0 | 1: 1 calls fj_score_log2 per element
//   FJ_SCORE_TILE      1 or undefined (0), the generator's: the forward's
//                      warp step asks fj_score_tile once a sub-tile, and where
//                      the terms are one value calls fj_score_log2_tile
// Hooks (from the generated prologue; see common/fj_common.cuh):
//   struct fj_user_params;                               always
//   fj_tile_class(user, sz, b, h, q0, q1, kv0, kv1)      when FJ_HAS_MASK
//   fj_mask(user, sz, b, h, q, kv)                       when FJ_HAS_MASK
//   fj_score_log2(user, sz, qk, scale, b, h, qb, dq, kvb, dk)
//                                                        when FJ_HAS_SCORE_MOD
//   fj_score_tile, fj_score_log2_tile                    when FJ_SCORE_TILE
//   (fj_tile_class and fj_mask receive query-head h; kv head is h / kv_group.)
//   fj_score_log2 may be called with kv >= Lk (the element is masked after),
//   so it must be total; generated code is (buffer reads are bounds-checked).
// Launch: grid (ceil(Lq / FJ_BLOCK_M), Hq, B), FJ_NUM_WARPS * 32 threads,
//   dynamic shared memory (FJ_BLOCK_M + 2 * FJ_NUM_STAGES * FJ_BLOCK_N)
//   * FJ_HEAD_DIM * 2 bytes (no static shared memory). Block x processes query
//   block gridDim.x - 1 - blockIdx.x, so the heaviest causal blocks start first.
// Requirements the host checks: q, k, v, o 16-byte aligned; every batch, head
//   and sequence stride of q, k, v, o a multiple of 8 elements (16-byte cp.async
//   and 16-byte stores); head dim contiguous; p.scale > 0 when
//   FJ_HAS_SCORE_MOD is 0 (the running max is taken on unscaled q.k);
//   Hq == Hkv * kv_group; Lq, Lk >= 0. lse may be null.
// Semantics: score = q.k * scale, then the score_mod if present; pairs with
//   kv >= Lk or fj_mask false get probability 0; a row with no allowed pair
//   gets O = 0 and LSE = -inf. LSE is natural log, float32.
// ---------------------------------------------------------------------------
#pragma once

// The Q fragments stay in registers for the whole kv loop when a warp owns
// 16 rows; with 32 they would take the registers S and O need, and are read
// from shared memory at every k step instead.
#define FJK_Q_IN_REGISTERS (FJ_BLOCK_M / FJ_NUM_WARPS == 16)

// Shapes derived from the configuration.
constexpr int FJK_THREADS = FJ_NUM_WARPS * 32;
constexpr int FJK_WARP_ROWS = FJ_BLOCK_M / FJ_NUM_WARPS;
constexpr int FJK_MT = FJK_WARP_ROWS / 16;         // m16 tiles per warp
constexpr int FJK_KT = FJ_HEAD_DIM / 16;           // k16 steps of Q.K^T
constexpr int FJK_DT = FJ_HEAD_DIM / 8;            // n8 tiles of O per warp
// A kv tile is computed in sub-tiles of FJK_SUB_N columns, each a full online
// softmax step: S lives in registers for one sub-tile only. Default: the
// widest power-of-two divisor of BLOCK_N that keeps S and O within 160 f32
// registers a thread, which leaves the compiler room to prefetch fragments
// without spilling (S + O = 192 at 32 rows x D=128 x 64 columns spilled).
// With a score_mod, at most 32 scores a thread: its code is inlined once per
// score, and that is what NVRTC time grows with.
constexpr int fjk_default_sub_n() {
  int n = FJ_BLOCK_N;
  while (n > 16 && n % 2 == 0 &&
         (FJK_MT * n / 2 + FJK_MT * FJ_HEAD_DIM / 2 > 160 ||
          (FJ_HAS_SCORE_MOD && FJK_MT * n / 2 > 32) || FJ_BLOCK_N % n != 0))
    n /= 2;
  return n;
}
constexpr int FJK_SUB_N = fjk_default_sub_n();
constexpr int FJK_NT = FJK_SUB_N / 8;              // n8 tiles of S per warp
constexpr int FJK_PT = FJK_SUB_N / 16;             // k16 steps of P.V
constexpr int FJK_CHUNKS = FJ_HEAD_DIM / 8;        // 16-byte chunks per row
constexpr int FJK_ROW_BYTES = FJ_HEAD_DIM * 2;
constexpr int FJK_TILE_BYTES = FJ_BLOCK_N * FJK_ROW_BYTES;
constexpr int FJK_LOAD_ROWS = FJK_THREADS / FJK_CHUNKS;  // rows per load pass

static_assert(FJ_HEAD_DIM == 64 || FJ_HEAD_DIM == 128, "head dim 64 or 128");
static_assert(FJK_WARP_ROWS == 16 || FJK_WARP_ROWS == 32, "16 or 32 rows a warp");
static_assert(FJK_WARP_ROWS * FJ_NUM_WARPS == FJ_BLOCK_M, "BLOCK_M / warps");
static_assert(FJ_BLOCK_N % 16 == 0 && FJ_BLOCK_N >= 16, "BLOCK_N multiple of 16");
static_assert(FJ_NUM_STAGES >= 2, "K/V pipeline needs two stages");
static_assert(FJK_SUB_N % 16 == 0 && FJ_BLOCK_N % FJK_SUB_N == 0, "sub-tile width");
// The swizzle below XORs the chunk index with (row & 7); every load pass and
// every ldmatrix group must start at a multiple of 8 rows for it to be uniform.
static_assert(FJK_LOAD_ROWS % 8 == 0, "rows per load pass multiple of 8");
static_assert(FJ_BLOCK_M % FJK_LOAD_ROWS == 0 && FJ_BLOCK_N % FJK_LOAD_ROWS == 0,
              "tiles must be whole load passes");

#define FJK_LOG2E 1.4426950408889634f
#define FJK_LN2 0.6931471805599453f
