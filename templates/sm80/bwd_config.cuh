// templates/sm80/bwd_config.cuh: the sm80 backward kernel's contract with the
// generator, the shapes derived from its macros, its shared-memory map.
//
// FlashAttention-2's backward with mma.sync m16n8k16, ldmatrix and cp.async,
// for sm_80 and newer (runs unchanged on sm_86, sm_89, sm_90(a) and later).
// The translation unit's parts, in the order gen/templates.c lists them
// ("sm80", "backward"): common/fj_common.cuh, the generated prologue,
// common/fj_bwd.cuh, common/ptx.cuh, common/bwd_walk.cuh,
// common/bwd_order.cuh, common/bwd_rows.cuh (the pre and post kernels),
// then sm80/bwd_config.cuh,
// sm80/ptx.cuh, sm80/tile_load.cuh, sm80/bwd_mainloop.cuh, sm80/bwd.cuh.
//
// ---- Contract with the generator -----------------------------------------
// Macros (from gen/config.c's fjg_config_choose_backward):
//   FJ_HEAD_DIM        64 | 128
//   FJ_DTYPE_BF16 1  or  FJ_DTYPE_F16 1
//   FJ_BLOCK_M         query rows of a streamed Q / dO tile (a work item):
//                      a multiple of 16, at most 128, FJ_BLOCK_M / 16
//                      dividing FJ_NUM_WARPS
//   FJ_BLOCK_N         kv rows a CTA owns: 16 * FJ_NUM_WARPS (16 a warp)
//   FJ_NUM_WARPS       warps per CTA (threads = 32 * FJ_NUM_WARPS)
//   FJ_NUM_STAGES      2: Q / dO stages (the next item loads while one is
//                      computed)
//   FJ_HAS_MASK        0 | 1: 1 classifies (query tile, kv tile) pairs with
//                      fj_tile_class and evaluates fj_mask on PARTIAL ones
//   FJ_HAS_SCORE_MOD   0 | 1: 1 calls fj_score_log2 and fj_score_grad per
//                      element
//   FJ_DETERMINISTIC   1 or undefined (0): 1 adds dQ to each query tile in
//                      descending kv-tile order (common/bwd_order.cuh), the
//                      CTA of kv tile n at blockIdx.x = nk - 1 - n
//   FJ_VARLEN          1 or undefined (0): 1 is the packed-batch variant
//                      (cu_seqlens_q, and cu_seqlens_k or k [B, Hkv, Lk,
//                      D]): each sequence's sizes and rows from fjb_seq_of
//                      (common/fj_bwd.cuh), Lq and Lk of the grid being
//                      max_seqlen_q and max_seqlen_k
// Hooks (the generated prologue): struct fj_user_params and struct
//   fj_user_grads always; fj_tile_class and fj_mask when FJ_HAS_MASK;
//   fj_score_log2 and fj_score_grad (docs/backward.md) when FJ_HAS_SCORE_MOD.
//   All receive the query head h; they may be called with q >= Lq or
//   kv >= Lk (the element is dropped after), so they must be total.
// Launch of fj_attention_bwd: grid (ceil(Lk / FJ_BLOCK_N), Hkv, B),
//   FJ_NUM_WARPS * 32 threads, FJB_SMEM_BYTES of dynamic shared memory (no
//   static). After fj_attention_bwd_pre and before fj_attention_bwd_post
//   (common/bwd_rows.cuh), on the same stream; FJ_DETERMINISTIC: with
//   dq_sem in the scratch and, with a block mask, its lists per query block;
//   FJ_VARLEN: no block mask, CTAs past a sequence's Lk return at once.
// Requirements the host checks: q, k, v, o, dout, dq, dk, dv 16-byte aligned,
//   their batch, head and sequence strides multiples of 8 elements, head
//   dim contiguous; lse, dlse float32 with sequence stride 1; delta and
//   dq_accum of the sizes fj_bwd_params gives, dq_accum 16-byte aligned;
//   Hq == Hkv * kv_group; a block mask's block_q a multiple of FJ_BLOCK_M
//   and its block_kv a multiple of FJ_BLOCK_N.
// ---------------------------------------------------------------------------
//
// How a CTA works (kv tile n_block of kv head hk, batch b): K and V of its
// FJ_BLOCK_N rows stay in shared memory; warp w owns kv rows [16 w, 16 w +
// 16) of them and keeps their dK and dV (fp32) in registers. For every work
// item (common/bwd_walk.cuh: a query head of the group and one of its query
// tiles) it streams Q, dO, LSE and delta in, and each warp computes, in the
// transposed orientation (rows are kv, columns are queries):
//   S^T  = K_w Q^T,  dP^T = V_w dO^T          (A from K / V, B from Q / dO)
//   P^T  = exp(score_mod(scale S^T) - LSE),  dS^T = P^T (dP^T - delta),
//          times d score_mod / d score        (registers, elementwise)
//   dV_w += P^T dO,  dK_w += dS^T Q           (A: the accumulators of S^T and
//                                              dP^T repacked, as the forward
//                                              repacks P; B: dO / Q transposed)
// (in passes of FJB_SUB_M query columns) and writes dS^T to shared memory;
// after a barrier the CTA computes
//   dQ = dS K over all FJ_BLOCK_N kv rows     (A: dS^T read transposed)
// split over the warps by query rows and head-dim columns, and adds it,
// times scale, to dq_accum with fp32 atomics (FJ_DETERMINISTIC: the same
// atomics, once the kv tiles before this one have added theirs). At the end it writes dK
// (times scale) and dV in the element type. P^T and dS^T never leave
// registers for the two transposed products; only dS^T goes through shared
// memory, for dQ.
#pragma once

// Shapes derived from the configuration.
constexpr int FJK_THREADS = FJ_NUM_WARPS * 32;
constexpr int FJK_CHUNKS = FJ_HEAD_DIM / 8;        // 16-byte chunks per row
constexpr int FJK_ROW_BYTES = FJ_HEAD_DIM * 2;
constexpr int FJK_LOAD_ROWS = FJK_THREADS / FJK_CHUNKS;  // rows per load pass
// A warp computes a work item in passes of FJB_SUB_M query columns, each
// S^T, dP^T, the elementwise step and the two transposed products: its S^T
// and dP^T (FJB_SUB_M fp32 a thread together) live next to dK and dV
// (FJ_HEAD_DIM). Default: the whole tile while that stays within 192
// registers, 160 with a score_mod (its code and that of fj_score_grad are
// inlined per element next to them), and 160 in the deterministic
// variant for packed batches (its rank's classification and the
// sequences' sizes); at D=128, 64 query columns spilled in both. Each
// further pass reads the warp's K and V fragments from shared memory again.
constexpr int fjb_default_sub_m() {
  const int budget = FJ_HAS_SCORE_MOD || (FJ_VARLEN && FJ_DETERMINISTIC) ? 160 : 192;
  int m = FJ_BLOCK_M;
  while (m > 16 && m % 32 == 0 && FJ_HEAD_DIM + m > budget) m /= 2;
  return m;
}
constexpr int FJB_SUB_M = fjb_default_sub_m();
constexpr int FJB_QT = FJB_SUB_M / 8;      // n8 tiles (query columns) of S^T, dP^T
constexpr int FJB_QK = FJB_SUB_M / 16;     // k16 steps of P^T dO and dS^T Q
constexpr int FJB_DK = FJ_HEAD_DIM / 16;   // k16 steps of K Q^T and V dO^T
constexpr int FJB_DT = FJ_HEAD_DIM / 8;    // n8 tiles of a warp's dK, dV
// dQ = dS K: warp w computes query rows [16 wm, 16 wm + 16) (wm = w %
// FJB_DQ_WM) and head-dim columns [FJB_DQ_COLS wd, ...) (wd = w / FJB_DQ_WM).
constexpr int FJB_DQ_WM = FJ_BLOCK_M / 16;
constexpr int FJB_DQ_WD = FJ_NUM_WARPS / FJB_DQ_WM;
constexpr int FJB_DQ_COLS = FJ_HEAD_DIM / FJB_DQ_WD;
constexpr int FJB_DQ_NT = FJB_DQ_COLS / 8;  // n8 tiles of a warp's dQ part
constexpr int FJB_NK = FJ_BLOCK_N / 16;     // k16 steps of dS K

// Shared memory, byte offsets from the dynamic base: K and V (FJ_BLOCK_N
// rows each), FJ_NUM_STAGES stages of Q, of dO, of LSE and of delta
// (FJ_BLOCK_M rows each), dS^T (FJ_BLOCK_N rows of FJ_BLOCK_M elements).
// K, V, Q and dO rows are swizzled as sm80/tile_load.cuh writes them (chunk
// c of row r at c ^ (r & 7)). dS^T rows are padded by 16 bytes instead: a
// row is FJ_BLOCK_M / 8 chunks (4 at 32 queries, too few for the xor), and
// with the pad the 8 rows of an ldmatrix and the 8 rows of a warp's 4-byte
// stores fall in distinct banks.
constexpr int FJB_DS_STRIDE = FJ_BLOCK_M * 2 + 16;
constexpr int FJB_KV_BYTES = FJ_BLOCK_N * FJK_ROW_BYTES;
constexpr int FJB_QTILE_BYTES = FJ_BLOCK_M * FJK_ROW_BYTES;
constexpr int FJB_OFF_K = 0;
constexpr int FJB_OFF_V = FJB_OFF_K + FJB_KV_BYTES;
constexpr int FJB_OFF_Q = FJB_OFF_V + FJB_KV_BYTES;
constexpr int FJB_OFF_DO = FJB_OFF_Q + FJ_NUM_STAGES * FJB_QTILE_BYTES;
constexpr int FJB_OFF_LSE = FJB_OFF_DO + FJ_NUM_STAGES * FJB_QTILE_BYTES;
constexpr int FJB_OFF_DELTA = FJB_OFF_LSE + FJ_NUM_STAGES * FJ_BLOCK_M * 4;
constexpr int FJB_OFF_DS = FJB_OFF_DELTA + FJ_NUM_STAGES * FJ_BLOCK_M * 4;
// What gen/config.c computes as smem_bytes (unit/test_bwd_compile checks).
constexpr int FJB_SMEM_BYTES = FJB_OFF_DS + FJ_BLOCK_N * FJB_DS_STRIDE;

static_assert(FJ_HEAD_DIM == 64 || FJ_HEAD_DIM == 128, "head dim 64 or 128");
static_assert(FJ_BLOCK_N == 16 * FJ_NUM_WARPS, "backward: FJ_BLOCK_N is 16 rows a warp");
static_assert(FJ_BLOCK_M % 16 == 0 && FJ_BLOCK_M >= 16 && FJ_BLOCK_M <= 128,
              "backward: FJ_BLOCK_M a multiple of 16, at most 128");
static_assert(FJ_NUM_WARPS % FJB_DQ_WM == 0, "backward: FJ_BLOCK_M / 16 divides the warps");
static_assert(FJB_DQ_COLS % 16 == 0 && FJB_DQ_COLS * FJB_DQ_WD == FJ_HEAD_DIM,
              "backward: dQ's head-dim split in whole k16 pairs");
static_assert(FJ_NUM_STAGES == 2, "backward: two Q / dO stages");
static_assert(FJB_SUB_M % 16 == 0 && FJ_BLOCK_M % FJB_SUB_M == 0, "query pass width");
static_assert(FJK_LOAD_ROWS % 8 == 0, "rows per load pass multiple of 8");
static_assert(FJ_BLOCK_M % FJK_LOAD_ROWS == 0 && FJ_BLOCK_N % FJK_LOAD_ROWS == 0,
              "tiles must be whole load passes");

#define FJB_LOG2E 1.4426950408889634f
