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
//   FJ_BLOCK_M         64: query rows of a work item
//   FJ_BLOCK_N         128: kv rows of a CTA, 64 a consumer warpgroup
//   FJ_NUM_WARPS       12: warpgroup 0 produces, warpgroups 1 and 2 compute
//   FJ_NUM_STAGES      2: Q / dO stages in shared memory
//   FJ_HAS_MASK, FJ_HAS_SCORE_MOD: as sm80/config.cuh
//   FJ_VARLEN          1 or undefined (0): the packed-batch variant, as the
//                      sm80 backward's (sm80/bwd_config.cuh)
// Hooks: fj_user_params, fj_tile_class, fj_mask, fj_score_mod and the
//   backward's fj_user_grads and fj_score_grad, as the sm80 backward.
// Kernel (bwd.cuh):
//   extern "C" __global__ void fj_attention_bwd(
//       const __grid_constant__ fj_bwd_params p,
//       const __grid_constant__ fj_bwd_maps maps)
//   launched with kernelParams {&params, &maps}, grid (ceil(Lk / 128), Hkv,
//   B), 384 threads, no cluster, FJHB_SMEM_BYTES of dynamic shared memory
//   (gen/config.c computes the same), after fj_attention_bwd_pre and before
//   fj_attention_bwd_post on the same stream. maps (runtime/tma.c,
//   fjr_tma_bwd_maps_build): q, dout (boxes of 64 x FJ_BLOCK_M), k, v (64 x
//   FJ_BLOCK_N), dk, dv (64 x 64) over the 4-D tensors (D, L, H, B) of the
//   element type with 128-byte swizzle (packed ones (D, total, H, 1): the
//   kernel adds a sequence's first row); dq_accum over fp32 (D, acc_sh,
//   heads: B * Hq, or Hq packed) with boxes of 32 x 64 and 128-byte
//   swizzle, the target of the dQ reduce-adds.
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
//   dQ[:, cols_c] = dS K[:, cols_c]           (wgmma, both operands read
//                                             MN-major from shared memory)
// over all 128 kv rows for its half of the head dim, and adds it, times
// scale, into one of its two dQ buffers; a producer warp (the writer)
// adds each buffer to dq_accum with TMA reduce-adds and releases it. At the
// end the consumer stores dK (times scale) and dV by TMA through the same
// buffers.
#pragma once

// ---- shapes ----------------------------------------------------------------

constexpr int FJHB_THREADS = 384;
constexpr int FJHB_WG_KV = 64;                            // kv rows of a consumer
constexpr int FJHB_CHUNKS64 = FJ_HEAD_DIM / 64;           // 128-byte column blocks
constexpr int FJHB_KV_BYTES = FJ_BLOCK_N * FJ_HEAD_DIM * 2;  // K or V
constexpr int FJHB_Q_BYTES = FJ_BLOCK_M * FJ_HEAD_DIM * 2;   // Q or dO of a stage
constexpr int FJHB_DS_BYTES = FJ_BLOCK_N * FJ_BLOCK_M * 2;   // dS^T [kv][query]
constexpr int FJHB_DQ_COLS = FJ_HEAD_DIM / 2;             // dQ columns of a consumer
constexpr int FJHB_DQ_BOXES = FJHB_DQ_COLS / 32;          // fp32 boxes of 32 columns
constexpr int FJHB_DQ_BYTES = FJ_BLOCK_M * FJHB_DQ_COLS * 4;  // one dQ buffer
constexpr int FJHB_S_REGS = FJ_BLOCK_M / 2;               // S^T, dP^T accumulators
constexpr int FJHB_D_REGS = FJ_HEAD_DIM / 2;              // dK, dV accumulators
constexpr int FJHB_DQ_REGS = FJHB_DQ_COLS / 2;            // dQ accumulators
constexpr int FJHB_PK = FJ_BLOCK_M / 16;                  // k16 steps of P^T dO

// Shared memory, byte offsets from the 1024-aligned base: K, V, the stages'
// Q and dO, two dS^T buffers (items alternate), each consumer's two dQ
// buffers, the stages' LSE and delta (FJ_BLOCK_M floats each), then the
// mbarriers: K/V full; per stage Q/dO full, LSE/delta full, stage empty;
// per consumer and dQ buffer full (the consumer's 128 threads have written
// it) and empty (the writer's reduce-add has read it); then the sequence's
// record (common/fj_bwd.cuh's fjb_seq_sts: FJB_SEQ_WORDS words), which the
// roles read where they use it. Tiles of 2-byte
// elements are stored as blocks of (rows x 64 elements), 128-byte swizzled
// (TMA's layout); a dS^T buffer is one such block of FJ_BLOCK_N rows; a dQ
// buffer is FJHB_DQ_BOXES blocks of (64 rows x 32 floats), 128-byte
// swizzled.
constexpr int FJHB_OFF_K = 0;
constexpr int FJHB_OFF_V = FJHB_OFF_K + FJHB_KV_BYTES;
constexpr int FJHB_OFF_Q = FJHB_OFF_V + FJHB_KV_BYTES;
constexpr int FJHB_OFF_DO = FJHB_OFF_Q + FJ_NUM_STAGES * FJHB_Q_BYTES;
constexpr int FJHB_OFF_DS = FJHB_OFF_DO + FJ_NUM_STAGES * FJHB_Q_BYTES;
constexpr int FJHB_OFF_DQ = FJHB_OFF_DS + 2 * FJHB_DS_BYTES;
constexpr int FJHB_OFF_LSE = FJHB_OFF_DQ + 4 * FJHB_DQ_BYTES;
constexpr int FJHB_OFF_DELTA = FJHB_OFF_LSE + FJ_NUM_STAGES * FJ_BLOCK_M * 4;
constexpr int FJHB_OFF_BAR = FJHB_OFF_DELTA + FJ_NUM_STAGES * FJ_BLOCK_M * 4;
constexpr int FJHB_BARS = 1 + 3 * FJ_NUM_STAGES + 8;
constexpr int FJHB_OFF_SEQ = FJHB_OFF_BAR + 8 * FJHB_BARS;
// What gen/config.c computes as smem_bytes (1024 to align the base).
constexpr int FJHB_SMEM_BYTES = 1024 + FJHB_OFF_SEQ + 4 * FJB_SEQ_WORDS;

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
static_assert(FJ_BLOCK_M == 64 && FJ_BLOCK_N == 2 * FJHB_WG_KV && FJ_NUM_WARPS == 12,
              "sm90 backward: 64-query items, 128 kv rows, two consumer warpgroups");
static_assert(FJ_NUM_STAGES == 2, "sm90 backward: two Q / dO stages");
static_assert(FJHB_DQ_BYTES * 2 >= FJ_HEAD_DIM * FJHB_WG_KV * 2,
              "sm90 backward: a consumer's dQ buffers hold its dK (or dV) tile");
static_assert(FJHB_SMEM_BYTES <= 227 * 1024, "sm90 backward: shared memory over 227 KiB");
static_assert(FJHB_PRODUCER_REGS + 2 * FJHB_CONSUMER_REGS <= 3 * ((65536 / FJHB_THREADS) & ~7),
              "sm90 backward: register split over the CTA's pool");

#define FJHB_LOG2E 1.4426950408889634f

// ---- kernel parameter and shared-memory map --------------------------------

// The kernel's second parameter: the tensor maps (runtime/tma.c builds
// them; the host mirror is runtime/tma.h's fjr_tma_bwd_maps): 896 bytes.
struct __align__(128) fj_bwd_maps {
  fjh_tensor_map q, k, v, dout, dk, dv, dq_accum;
};

struct fjhb_smem {
  unsigned base;  // 1024-aligned
  __device__ unsigned k() const { return base + FJHB_OFF_K; }
  __device__ unsigned v() const { return base + FJHB_OFF_V; }
  __device__ unsigned q(int s) const { return base + FJHB_OFF_Q + s * FJHB_Q_BYTES; }
  __device__ unsigned dout(int s) const { return base + FJHB_OFF_DO + s * FJHB_Q_BYTES; }
  __device__ unsigned ds(int i) const { return base + FJHB_OFF_DS + i * FJHB_DS_BYTES; }
  // Consumer c's dQ buffer i (0, 1).
  __device__ unsigned dq(int c, int i) const {
    return base + FJHB_OFF_DQ + (2 * c + i) * FJHB_DQ_BYTES;
  }
  __device__ unsigned lse(int s) const { return base + FJHB_OFF_LSE + s * FJ_BLOCK_M * 4; }
  __device__ unsigned delta(int s) const { return base + FJHB_OFF_DELTA + s * FJ_BLOCK_M * 4; }
  __device__ unsigned kv_full() const { return base + FJHB_OFF_BAR; }
  __device__ unsigned q_full(int s) const { return base + FJHB_OFF_BAR + 8 * (1 + s); }
  __device__ unsigned rows_full(int s) const {
    return base + FJHB_OFF_BAR + 8 * (1 + FJ_NUM_STAGES + s);
  }
  __device__ unsigned empty(int s) const {
    return base + FJHB_OFF_BAR + 8 * (1 + 2 * FJ_NUM_STAGES + s);
  }
  __device__ unsigned dq_full(int c, int i) const {
    return base + FJHB_OFF_BAR + 8 * (1 + 3 * FJ_NUM_STAGES + 2 * c + i);
  }
  __device__ unsigned dq_empty(int c, int i) const {
    return base + FJHB_OFF_BAR + 8 * (1 + 3 * FJ_NUM_STAGES + 4 + 2 * c + i);
  }
  __device__ unsigned seq() const { return base + FJHB_OFF_SEQ; }
};
