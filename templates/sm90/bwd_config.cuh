// templates/sm90/bwd_config.cuh: the sm90 backward kernel's contract with
// the generator, the shapes derived from it, its shared-memory map and the
// budgets it must fit. The kernel is written in sm90/bwd_mainloop.cuh (a
// consumer's work) and sm90/bwd.cuh (the roles and the entry point); the
// pre and post kernels are common/bwd_rows.cuh's.
//
// ---- Contract with the generator -----------------------------------------
// Macros the generator defines (gen/config.c, choose_sm90_backward):
//   FJ_HEAD_DIM        64 | 128
//   FJ_DTYPE_BF16 1  or  FJ_DTYPE_F16 1
//   FJ_BLOCK_M         64, or 128 at FJ_HEAD_DIM 64: query rows of a work
//                      item
//   FJ_BLOCK_N         128: kv rows of a CTA, 64 a consumer warpgroup
//   FJ_NUM_WARPS       12: warpgroup 0 produces, warpgroups 1 and 2 compute
//   FJ_NUM_STAGES      2: Q / dO stages in shared memory
//   FJ_HAS_MASK, FJ_HAS_SCORE_MOD: as sm80/config.cuh
//   FJ_VARLEN          1 or undefined (0): the packed-batch variant, as the
//                      sm80 backward's (sm80/bwd_config.cuh)
//   FJ_PERSISTENT      1 or undefined (0): the persistent kernel (not with
//                      FJ_VARLEN or FJ_DETERMINISTIC), below
//   FJ_DETERMINISTIC   1 or undefined (0): dQ added to each query tile in
//                      descending kv-tile order (common/bwd_order.cuh), by
//                      the dQ writer (sm90/bwd.cuh)
// Hooks: fj_user_params, fj_tile_class, fj_mask, fj_score_log2 and the
//   backward's fj_user_grads and fj_score_grad, as the sm80 backward; with
//   FJ_SCORE_TILE (the generator's) fj_score_tile and fj_score_log2_tile
//   (common/fj_common.cuh), which P^T uses where the terms are one value.
// Kernel (bwd.cuh):
//   extern "C" __global__ void fj_attention_bwd(
//       const __grid_constant__ fj_bwd_params p,
//       const __grid_constant__ fj_bwd_maps maps)
//   launched with kernelParams {&params, &maps}, grid (ceil(Lk / 128), Hkv,
//   B) or, FJ_PERSISTENT, (min(SMs, ceil(Lk / 128) * Hkv * B), 1, 1), 384
//   threads, no cluster, FJHB_SMEM_BYTES of dynamic shared memory
//   (gen/config.c computes the same), after fj_attention_bwd_pre (which
//   zeroes the persistent kernel's tile counter, p.dq_sem[0]) and before
//   fj_attention_bwd_post on the same stream. maps (runtime/tma.c,
//   fjr_tma_bwd_maps_build): q, dout (boxes of 64 x FJ_BLOCK_M), k, v (64 x
//   FJ_BLOCK_N), dk, dv (64 x 64) over the 4-D tensors (D, L, H, B) of the
//   element type with 128-byte swizzle (packed ones (D, total, H, 1): the
//   kernel adds a sequence's first row). dq_accum is in its tiled form
//   (common/fj_bwd.cuh, FJB_DQ_TILED), which the post kernel reads.
// Requirements the host checks: those of the sm80 backward (which are also
//   TMA's: 16-byte aligned tensors, strides multiples of 8 elements).
// ---------------------------------------------------------------------------
//
// How a CTA works (kv tile n_block of kv head hk, batch b): the producer
// warp loads K and V once, then Q and dO of each work item (the walk of
// common/bwd_walk.cuh: the group's query heads, their non-EMPTY query tiles)
// into two stages by TMA; a second producer warp writes the item's LSE (in
// log2 units) and delta into the stage. Consumer c owns kv rows [64 c, 64 c
// + 64) and keeps their dK and dV (fp32) in registers. For each item it
// computes, in the transposed orientation (rows kv, columns queries):
//   S^T  = K_c Q^T,  dP^T = V_c dO^T       (wgmma, both from shared memory)
//   P^T  = exp2(score_mod(scale S^T) log2 e - LSE),  dS^T = P^T (dP^T -
//          delta), times d score_mod / d score     (registers)
//   dV_c += P^T dO,  dK_c += dS^T Q          (wgmma, A from registers: the
//                                             accumulators repacked)
// writes dS^T into shared memory and, after both consumers have, computes
// its part of dQ = dS K over all 128 kv rows (wgmma, both operands read
// MN-major from shared memory): with 64-row items, by columns, all the
// item's rows for its half of the head dim,
//   dQ[:, cols_c] = dS K[:, cols_c],
// with 128-row items, by rows, its 64 query rows for all of the head dim,
//   dQ[rows_c, :] = dS[rows_c, :] K,
// (at D=64 the split by rows makes it an n64 product where the split by
// columns is n32): a tile of dq_accum's tiled form (FJB_DQ_TILE_COLS). It
// stores that part, times scale, into one of its dQ buffers in the tile's
// order (two buffers with 64-row items, one with 128: no shared memory is
// left for a second); a producer warp (the writer) adds each buffer to
// dq_accum with one bulk reduce-add and releases it. At the
// end the consumer stores dK (times scale) and dV by TMA through its
// buffers.
//
// The persistent kernel (FJ_PERSISTENT): one CTA a multiprocessor, each
// taking kv tiles from a counter as it finishes one, in the order of
// common/bwd_walk.cuh's fjb_tile_order (groups of kv heads, kv tile slowest
// within a group, so that a causal mask's long tiles are dealt before its
// short ones). Producer warp 0 takes them and hands each to
// the other roles through a ring of two slots in shared memory. The stage,
// dS^T and dQ buffer counts run on from tile to tile; V of the next tile
// loads once both consumers have their tile's last dP^T product (v_empty),
// while the last item's other products run, and K once they have waited for
// their last product (k_empty), while they store dK and dV. So part of a
// tile's fixed cost (K and V in flight, the first items' loads), which the one-tile
// kernel pays with the SM idle (about two items' time a CTA at D=128),
// overlaps the tile before. Where the tiles are one round and a few more
// (runtime/backward.c, tail_split), the last round's few tiles would each
// run on one CTA while the others wait: those tiles are taken in pieces
// instead, equal shares of their items (fjb_piece), and a piece's consumers
// add their dK and dV in fp32 to the tile's blocks of p.dkv_accum (through
// their dQ buffers, by bulk reduce-add), which the post kernel converts.
//
// With 128-row items a consumer holds 64-register S^T and dP^T
// accumulators: P^T packed into its A fragments lets S^T die, and dS^T is
// computed from the packed P^T (FJHB_DS_FROM_PACKED_P: P rounded to the
// element type, as dV's product reads it), which keeps the consumer within
// its registers.
#pragma once

// dq_accum in its tiled form (common/fj_bwd.cuh), for the post kernel
// (common/bwd_rows.cuh, which comes after this part): its tiles are a
// consumer's dQ parts (FJHB_DQ_COLS wide, below).
#define FJB_DQ_TILED 1
// A query tile's first dQ addition is a store, so dq_accum is not zeroed
// (common/bwd_order.cuh; the dQ writer, sm90/bwd.cuh).
#define FJB_DQ_FIRST_STORE 1
// The persistent kernel (never deterministic) converts dq_accum into dq
// itself, in warps that have no tile to work on (sm90/bwd.cuh,
// fjhb_convert_dq), where it splits no tile; runtime/backward.c then
// launches no post kernel.
#if FJ_PERSISTENT
#define FJB_DQ_IN_MAIN 1
#endif
#ifdef FJB_ROW_KERNELS
#error "sm90 backward: its configuration must precede common/bwd_rows.cuh"
#endif

// ---- shapes ----------------------------------------------------------------

constexpr int FJHB_THREADS = 384;
constexpr int FJHB_WG_KV = 64;                            // kv rows of a consumer
constexpr int FJHB_CHUNKS64 = FJ_HEAD_DIM / 64;           // 128-byte column blocks
constexpr int FJHB_KV_BYTES = FJ_BLOCK_N * FJ_HEAD_DIM * 2;  // K or V
constexpr int FJHB_Q_BYTES = FJ_BLOCK_M * FJ_HEAD_DIM * 2;   // Q or dO of a stage
constexpr int FJHB_DS_BYTES = FJ_BLOCK_N * FJ_BLOCK_M * 2;   // dS^T [kv][query]
constexpr int FJHB_ROWS_BYTES = FJHB_WG_KV * FJ_HEAD_DIM * 2;  // a consumer's dK or dV
// dQ by rows (128-row items) or by columns (64-row items): a consumer's
// part is 64 query rows x FJHB_DQ_COLS, starting at the item's row
// fjhb_dq_row0(c) and column fjhb_dq_col0(c).
constexpr bool FJHB_DQ_BY_ROWS = FJ_BLOCK_M == 128;
constexpr int FJHB_DQ_ROWS = 64;
constexpr int FJHB_DQ_COLS = FJHB_DQ_BY_ROWS ? FJ_HEAD_DIM : FJ_HEAD_DIM / 2;
constexpr int FJB_DQ_TILE_COLS = FJHB_DQ_COLS;
constexpr int FJHB_DQ_BYTES = FJHB_DQ_ROWS * FJHB_DQ_COLS * 4;  // one dQ buffer
constexpr int FJHB_DQ_BUFS = FJHB_DQ_BY_ROWS ? 1 : 2;     // dQ buffers a consumer
constexpr int FJHB_S_REGS = FJ_BLOCK_M / 2;               // S^T, dP^T accumulators
constexpr int FJHB_D_REGS = FJ_HEAD_DIM / 2;              // dK, dV accumulators
constexpr int FJHB_DQ_REGS = FJHB_DQ_COLS / 2;            // dQ accumulators
constexpr int FJHB_PK = FJ_BLOCK_M / 16;                  // k16 steps of P^T dO
// dS^T from the packed P^T rather than from the fp32 one (with 128-row
// items the fp32 one does not fit beside dP^T, dK, dV and the fragments).
constexpr bool FJHB_DS_FROM_PACKED_P = FJ_BLOCK_M == 128;
__device__ __forceinline__ int fjhb_dq_row0(int c) { return FJHB_DQ_BY_ROWS ? 64 * c : 0; }
__device__ __forceinline__ int fjhb_dq_col0(int c) {
  return FJHB_DQ_BY_ROWS ? 0 : c * FJHB_DQ_COLS;
}

// Shared memory, byte offsets from the 1024-aligned base: K, V, the stages'
// Q and dO, two dS^T buffers (items alternate), each consumer's
// FJHB_DQ_BUFS dQ buffers (consecutive), the stages' LSE and delta
// (FJ_BLOCK_M floats each), each stage's next item (fjhb_put_item: the
// item after the stage's, as producer warp 1's walk found it), then the
// mbarriers: K/V full; per stage Q/dO
// full, LSE/delta full, stage empty; per consumer and dQ buffer full (the
// consumer's 128 threads have written it) and empty (the writer's
// reduce-add has read it); the persistent kernel's K empty and V empty
// (both consumers are done with the tile's K, its V) and per ring slot full
// and empty; then the sequence's record (common/fj_bwd.cuh's fjb_seq_sts:
// FJB_SEQ_WORDS words), which the roles read where they use it, and the
// ring's two slots of two words (a kv tile's position in the one-tile
// grid's order, -1: no more; its piece, -1: the whole tile). Tiles
// of 2-byte elements are stored as blocks of (rows x 64 elements), 128-byte
// swizzled (TMA's layout); a dS^T buffer is
// FJ_BLOCK_M / 64 such blocks of FJ_BLOCK_N rows; a dQ buffer is a tile of
// dq_accum's tiled form (64 x FJHB_DQ_COLS floats). At a tile's end
// consumer c stages its dK tile (FJHB_ROWS_BYTES) in dS^T buffer c and its
// dV tile after it where both fit (FJHB_ROWS_IN_DS), else in the dQ buffer
// its tile's last item did not use (fjhb_smem::dv_out).
constexpr int FJHB_OFF_K = 0;
constexpr int FJHB_OFF_V = FJHB_OFF_K + FJHB_KV_BYTES;
constexpr int FJHB_OFF_Q = FJHB_OFF_V + FJHB_KV_BYTES;
constexpr int FJHB_OFF_DO = FJHB_OFF_Q + FJ_NUM_STAGES * FJHB_Q_BYTES;
constexpr int FJHB_OFF_DS = FJHB_OFF_DO + FJ_NUM_STAGES * FJHB_Q_BYTES;
constexpr int FJHB_OFF_DQ = FJHB_OFF_DS + 2 * FJHB_DS_BYTES;
constexpr int FJHB_OFF_LSE = FJHB_OFF_DQ + 2 * FJHB_DQ_BUFS * FJHB_DQ_BYTES;
constexpr int FJHB_OFF_DELTA = FJHB_OFF_LSE + FJ_NUM_STAGES * FJ_BLOCK_M * 4;
constexpr int FJHB_OFF_ITEM = FJHB_OFF_DELTA + FJ_NUM_STAGES * FJ_BLOCK_M * 4;
constexpr int FJHB_OFF_BAR = FJHB_OFF_ITEM + FJ_NUM_STAGES * 16;
constexpr int FJHB_BARS = 1 + 3 * FJ_NUM_STAGES + 4 * FJHB_DQ_BUFS + 6;
constexpr int FJHB_OFF_SEQ = FJHB_OFF_BAR + 8 * FJHB_BARS;
constexpr int FJHB_OFF_RING = FJHB_OFF_SEQ + 4 * FJB_SEQ_WORDS;
// Whether a consumer's dK and dV tiles both fit in its dS^T buffer (not
// at D=128 with 64-query items: dV goes to a dQ buffer).
constexpr bool FJHB_ROWS_IN_DS = 2 * FJHB_ROWS_BYTES <= FJHB_DS_BYTES;
// FJHB_ROWV: where the mask has one row value (FJ_MASK_ROWS, the generator's
// fj_mask_rows: a query row's document id), producer warp 1 stores each
// stage's rows' values after the ring, beside their LSE and delta, and the
// consumers' masked loops read them there (fj_mask_from_rows) instead of
// loading them per element. The bytes are reserved in every kernel (the
// host's size does not know the spec).
#if defined(FJ_MASK_ROWS) && FJ_MASK_ROWS == 1
#define FJHB_ROWV 1
#else
#define FJHB_ROWV 0
#endif
constexpr int FJHB_OFF_ROWV = FJHB_OFF_RING + 16;
// What gen/config.c computes as smem_bytes (1024 to align the base).
constexpr int FJHB_SMEM_BYTES = 1024 + FJHB_OFF_ROWV + FJ_NUM_STAGES * FJ_BLOCK_M * 4;

// setmaxnreg targets: the producer warps walk the items (the classifier is
// inlined there), the consumers hold dK, dV, S^T, dP^T and dQ.
constexpr int FJHB_PRODUCER_REGS = 40;
constexpr int FJHB_CONSUMER_REGS = 232;

// Named barriers (0 is __syncthreads): both consumers have written an
// item's dS^T (FJHB_BAR_DS_FULL, 256 threads); consumer c's own, 128
// threads: FJHB_BAR_WG + c.
enum { FJHB_BAR_DS_FULL = 1, FJHB_BAR_WG = 2 };

// ---- budgets ---------------------------------------------------------------

static_assert(FJ_HEAD_DIM == 64 || FJ_HEAD_DIM == 128, "sm90 backward: head dim 64 or 128");
static_assert((FJ_BLOCK_M == 64 || (FJ_BLOCK_M == 128 && FJ_HEAD_DIM == 64)) &&
                  FJ_BLOCK_N == 2 * FJHB_WG_KV && FJ_NUM_WARPS == 12,
              "sm90 backward: 64-query items (128 at head dim 64), 128 kv rows, two "
              "consumer warpgroups");
static_assert(FJ_NUM_STAGES == 2, "sm90 backward: two Q / dO stages");
static_assert(!(FJ_PERSISTENT && FJ_VARLEN), "sm90 backward: the persistent kernel is not packed");
static_assert(!(FJ_PERSISTENT && FJ_DETERMINISTIC),
              "sm90 backward: the deterministic order needs the one-tile grid");
static_assert(FJHB_DS_BYTES >= FJHB_ROWS_BYTES &&
                  (FJHB_ROWS_IN_DS || (FJHB_DQ_BUFS == 2 && FJHB_DQ_BYTES >= FJHB_ROWS_BYTES)),
              "sm90 backward: a consumer's dS^T buffer holds its dK tile, and its dV tile "
              "or a dQ buffer the last item did not use does");
static_assert(FJHB_SMEM_BYTES <= 227 * 1024, "sm90 backward: shared memory over 227 KiB");
static_assert(FJHB_DQ_ROWS == FJB_SEQ_PAD && FJHB_DQ_REGS / 4 * 128 * 16 == FJHB_DQ_BYTES,
              "sm90 backward: a consumer's dQ part is a tile of dq_accum");
static_assert(FJHB_PRODUCER_REGS + 2 * FJHB_CONSUMER_REGS <= 3 * ((65536 / FJHB_THREADS) & ~7),
              "sm90 backward: register split over the CTA's pool");

#define FJHB_LOG2E 1.4426950408889634f

// ---- kernel parameter and shared-memory map --------------------------------

// The kernel's second parameter: the tensor maps (runtime/tma.c builds
// them; the host mirror is runtime/tma.h's fjr_tma_bwd_maps): 768 bytes.
struct __align__(128) fj_bwd_maps {
  fjh_tensor_map q, k, v, dout, dk, dv;
};

struct fjhb_smem {
  unsigned base;  // 1024-aligned
  __device__ unsigned k() const { return base + FJHB_OFF_K; }
  __device__ unsigned v() const { return base + FJHB_OFF_V; }
  __device__ unsigned q(int s) const { return base + FJHB_OFF_Q + s * FJHB_Q_BYTES; }
  __device__ unsigned dout(int s) const { return base + FJHB_OFF_DO + s * FJHB_Q_BYTES; }
  __device__ unsigned ds(int i) const { return base + FJHB_OFF_DS + i * FJHB_DS_BYTES; }
  // Consumer c's dQ buffer i (below FJHB_DQ_BUFS).
  __device__ unsigned dq(int c, int i) const {
    return base + FJHB_OFF_DQ + (FJHB_DQ_BUFS * c + i) * FJHB_DQ_BYTES;
  }
  // Where consumer c stages its dK and dV tiles at the end of a tile of n
  // items in all (the count run on across tiles): dS^T buffer c, which
  // both consumers' last dQ products have read by then; dV after dK where
  // it fits, else dQ buffer n % FJHB_DQ_BUFS, which item n - 1 did not use.
  __device__ unsigned dk_out(int c) const { return ds(c); }
  __device__ unsigned dv_out(int c, int n) const {
    return FJHB_ROWS_IN_DS ? ds(c) + FJHB_ROWS_BYTES : dq(c, n % FJHB_DQ_BUFS);
  }
  __device__ unsigned lse(int s) const { return base + FJHB_OFF_LSE + s * FJ_BLOCK_M * 4; }
  __device__ unsigned delta(int s) const { return base + FJHB_OFF_DELTA + s * FJ_BLOCK_M * 4; }
  // Stage s's next item: four int32 (h, t, i, cls of fjb_item).
  __device__ unsigned next_item(int s) const { return base + FJHB_OFF_ITEM + 16 * s; }
  __device__ unsigned kv_full() const { return base + FJHB_OFF_BAR; }
  __device__ unsigned q_full(int s) const { return base + FJHB_OFF_BAR + 8 * (1 + s); }
  __device__ unsigned rows_full(int s) const {
    return base + FJHB_OFF_BAR + 8 * (1 + FJ_NUM_STAGES + s);
  }
  __device__ unsigned empty(int s) const {
    return base + FJHB_OFF_BAR + 8 * (1 + 2 * FJ_NUM_STAGES + s);
  }
  __device__ unsigned dq_full(int c, int i) const {
    return base + FJHB_OFF_BAR + 8 * (1 + 3 * FJ_NUM_STAGES + FJHB_DQ_BUFS * c + i);
  }
  __device__ unsigned dq_empty(int c, int i) const {
    return base + FJHB_OFF_BAR +
           8 * (1 + 3 * FJ_NUM_STAGES + 2 * FJHB_DQ_BUFS + FJHB_DQ_BUFS * c + i);
  }
  // The persistent kernel's: both consumers are done with the tile's K
  // (k_empty) and with its V (v_empty); the ring's slots.
  __device__ unsigned k_empty() const {
    return base + FJHB_OFF_BAR + 8 * (1 + 3 * FJ_NUM_STAGES + 4 * FJHB_DQ_BUFS);
  }
  __device__ unsigned v_empty() const { return k_empty() + 8; }
  __device__ unsigned ring_full(int s) const { return k_empty() + 8 * (2 + s); }
  __device__ unsigned ring_empty(int s) const { return k_empty() + 8 * (4 + s); }
  __device__ unsigned seq() const { return base + FJHB_OFF_SEQ; }
  // Ring slot s: the take's tile, then its piece (ring_piece).
  __device__ unsigned ring(int s) const { return base + FJHB_OFF_RING + 8 * s; }
  __device__ unsigned ring_piece(int s) const { return ring(s) + 4; }
  // Stage s's row values (FJHB_ROWV), FJ_BLOCK_M int32.
  __device__ unsigned rowv(int s) const { return base + FJHB_OFF_ROWV + s * FJ_BLOCK_M * 4; }
};

// A stage's next item (fjhb_smem::next_item): producer warp 1 walks one
// item ahead of the stage it fills and stores the item there, and the
// consumers take their next item from it instead of walking themselves: a
// walk step (a block mask's chain of loads and divisions, or the
// classifier's scan) beside the dQ product outlasts it, on the path from
// one item's products to the next's.
__device__ __forceinline__ void fjhb_put_item(unsigned addr, const fjb_item &it) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(it.h), "r"(it.t),
               "r"(it.i), "r"(it.cls) : "memory");
}
__device__ __forceinline__ fjb_item fjhb_get_item(unsigned addr) {
  fjb_item it;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(it.h), "=r"(it.t), "=r"(it.i), "=r"(it.cls) : "r"(addr) : "memory");
  return it;
}
