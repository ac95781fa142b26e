// templates/sm90/config.cuh: the sm90 kernels' contract with the generator,
// every tunable with its default, the shapes derived from them, and the
// register and shared-memory budgets they must fit.
//
// The sm90 forward kernel is FlashAttention-3 style, for sm_90a (Hopper):
// TMA loads into 128-byte-swizzled shared memory completing on mbarriers, a
// K/V pipeline of FJ_NUM_STAGES stages, one producer warpgroup and two
// consumer warpgroups (three at head dim 64) with register reallocation
// (setmaxnreg), wgmma for S = Q K^T (both operands in shared memory) and
// O += P V (P from registers), ping-pong between the consumer warpgroups
// (named barriers) and intra-warpgroup overlap of the softmax with the next
// Q K^T. Its parts, in the order gen/templates.c pastes them: config.cuh,
// ptx.cuh, trace.cuh, tile_walk.cuh, pipeline.cuh, producer.cuh,
// softmax.cuh, mainloop.cuh, epilogue.cuh, scheduler.cuh, fwd.cuh.
//
// ---- Contract with the generator -----------------------------------------
// Macros the generator defines (gen/emit_cuda.c, from gen/config.c):
//   FJ_HEAD_DIM        64 | 128 | 256
//   FJ_DTYPE_BF16 1  or  FJ_DTYPE_F16 1
//   FJ_BLOCK_M         64 query rows per consumer warpgroup: 128, or 192
//                      with FJ_NUM_WARPS 16
//   FJ_BLOCK_N         64 | 128 | 176: kv rows per tile (the N of S = Q K^T);
//                      176 only for the long-row variant at head dim 128,
//                      without the serving layouts (runtime/forward.c)
//   FJ_NUM_WARPS       12: warpgroup 0 produces, warpgroups 1 and 2 compute;
//                      or 16 at head dim 64: warpgroups 1-3 compute
//   FJ_NUM_STAGES      >= 2: K and V tiles in shared memory
//   FJ_HAS_MASK        0 | 1: as in sm80/config.cuh
//   FJ_HAS_SCORE_MOD   0 | 1: as in sm80/config.cuh
//   FJ_SCORE_SFU       optional, 1: the score_mod calls a special function
//                      on every element (the generator's; FJ_EXP2_EMU below)
//   FJ_SCORE_TILE      optional, 1: the score_mod's terms can be one value
//                      over a tile (the generator's fjg_score_has_tile_terms):
//                      the softmax asks fj_score_tile (fjh_terms), as does
//                      the backward's P^T
//   FJ_PERSISTENT      optional, 0 | 1 (fjg_config.persistent): the
//                      persistent kernel, grid (min(SMs, items), 1, 1)
//   FJ_Q_BUFS          optional, 1 | 2 (fjg_config.q_bufs): Q buffers of the
//                      persistent kernel (two where shared memory allows)
// Tunables (optional, from $FLEXJIT_KERNEL_DEFINES; defaults below):
//   FJ_PINGPONG, FJ_INTRA_WG_OVERLAP, FJ_PRODUCER_REGS, FJ_CONSUMER_REGS,
//   FJ_EXP2_EMU, FJ_BM_CACHE, FJ_TRACE, FJ_DEBUG_WAIT_LIMIT
// Hooks: those of sm80/config.cuh (fj_user_params, fj_tile_class,
//   fj_mask, fj_score_log2; see common/fj_common.cuh), same semantics, and
//   with FJ_SCORE_TILE fj_score_tile and fj_score_log2_tile.
// Block masks: as sm80/config.cuh. With p.bm_kv_num set, the kv tiles and
//   their classes come from the mask row's lists (PARTIAL blocks, then FULL
//   ones, each bm_kv_ratio tiles of FJ_BLOCK_N) instead of fj_tile_class;
//   FULL tiles skip the mask, PARTIAL ones are refined per consumer
//   warpgroup by fj_tile_class. The host guarantees block_q % FJ_BLOCK_M
//   == 0 and block_kv % FJ_BLOCK_N == 0 (runtime/blockmask.c). The producer
//   and the consumers compute the same walk from the same lists: the
//   arrays must not change while the kernel runs (a difference would stall
//   the mbarrier pipeline, not just give a wrong answer).
// Kernel (fwd.cuh):
//   extern "C" __global__ void fj_attention_fwd(
//       const __grid_constant__ fj_fwd_params p,
//       const __grid_constant__ fj_tma_maps maps)
//   launched with kernelParams {&params, &maps} (two parameters: not the
//   CU_LAUNCH_PARAM_BUFFER_POINTER path), grid (ceil(Lq / FJ_BLOCK_M), Hq, B)
//   or for the persistent kernel (min(SMs, work items), 1, 1), FJH_THREADS
//   (384; 512 with three consumers), no cluster, and FJH_SMEM_BYTES of
//   dynamic shared memory:
//     1024 + (FJ_Q_BUFS * FJ_BLOCK_M + 2 * FJ_NUM_STAGES * FJ_BLOCK_N)
//          * FJ_HEAD_DIM * 2 + 8 * (1 + 4 * FJ_NUM_STAGES)
//   (gen/config.c computes it), beside at most 5120 bytes of static shared
//   memory (9216 in the persistent kernel).
//   maps.q/k/v are CUtensorMaps (runtime/tma.c builds them) over the 4-D
//   tensors (D, L, H, B), innermost first, with 128-byte swizzle, boxes of
//   (64, FJ_BLOCK_M, 1, 1) for q and (64, FJ_BLOCK_N, 1, 1) for k and v,
//   zero fill out of bounds; packed q, k, v (cu_seqlens) as (D, total, H,
//   1); page pools (block_table) as (D, page_size, Hkv, num_pages) with
//   boxes of (64, R, 1, 1), R the largest power of two dividing page_size,
//   at most FJ_BLOCK_N (pipeline.cuh); maps.o (boxes of (64, 64, 1, 1): one
//   consumer's rows) stores O when maps.o_ok is 1, else O is stored with
//   ordinary predicated stores (packed O always).
// Requirements the host checks: as sm80/config.cuh (16-byte aligned pointers,
//   strides multiples of 8 elements), plus what cuTensorMapEncodeTiled needs.
// Semantics: as sm80/config.cuh; LSE natural log; rows with no allowed pair get
//   O = 0 and LSE = -inf.
// ---------------------------------------------------------------------------
#pragma once

#ifndef FJ_PERSISTENT
#define FJ_PERSISTENT 0
#endif
#ifndef FJ_Q_BUFS
#define FJ_Q_BUFS 1
#endif

// ---- tunables --------------------------------------------------------------

// FJ_PINGPONG (1): the consumer warpgroups take turns issuing their GEMMs,
// so that one's softmax runs while the others' GEMMs occupy the tensor cores.
#ifndef FJ_PINGPONG
#define FJ_PINGPONG 1
#endif
// FJ_INTRA_WG_OVERLAP (1): a consumer issues Q K^T of tile j+1 before P V
// of tile j and runs the softmax of j+1 while P V of j is in flight. 0 is
// the spill fallback: runtime/forward.c compiles with it when ptxas reports
// spills (fewer registers live).
#ifndef FJ_INTRA_WG_OVERLAP
#define FJ_INTRA_WG_OVERLAP 1
#endif
// FJ_PRODUCER_REGS, FJ_CONSUMER_REGS: setmaxnreg targets of the producer and
// consumer warpgroups, 24 and 240 by default. The persistent producer warps
// also classify tiles (fj_tile_scan_warp) and walk them in two threads,
// which spills in 24 and 40 registers (and in 48 beside a longer consumer):
// they take 56, the most beside two 224-register consumers (56 + 2 * 224 =
// 504), or 40 beside the 232 that D=256's consumers need. The FJ_TRACE
// build's stamps spill in a 24-register producer too, and beside the paged
// loads in a 40-register one: it takes 48 and 224 (224 is the persistent
// kernel's consumers' budget), and the traced persistent kernel, which
// spilled in 56, 64 and 216 (timing builds' splits, not measured against
// the untraced ones). With three consumers,
// (512 - 24) / 3 rounded down to 8: 160.
#ifndef FJ_PRODUCER_REGS
#if FJ_PERSISTENT && defined(FJ_TRACE) && FJ_HEAD_DIM != 256
#define FJ_PRODUCER_REGS 64
#elif FJ_PERSISTENT
#define FJ_PRODUCER_REGS (FJ_HEAD_DIM == 256 ? 40 : 56)
#elif defined(FJ_TRACE)
#define FJ_PRODUCER_REGS 48
#else
#define FJ_PRODUCER_REGS 24
#endif
#endif
#ifndef FJ_CONSUMER_REGS
#if FJ_NUM_WARPS == 16
#define FJ_CONSUMER_REGS 160
#elif FJ_PERSISTENT && defined(FJ_TRACE) && FJ_HEAD_DIM != 256
#define FJ_CONSUMER_REGS 216
#elif FJ_PERSISTENT
#define FJ_CONSUMER_REGS (FJ_HEAD_DIM == 256 ? 232 : 224)
#elif defined(FJ_TRACE)
#define FJ_CONSUMER_REGS 224
#else
#define FJ_CONSUMER_REGS 240
#endif
#endif
// FJ_SCORE_TILE: the generator's, undefined (0) for most specs.
#ifndef FJ_SCORE_TILE
#define FJ_SCORE_TILE 0
#endif
// FJ_EXP2_EMU (4 at D=64 with two consumers, or with a score_mod that calls
// a special function on every element (FJ_SCORE_SFU, from the generator:
// softcap's tanh); else 0 = off): one exponential in every FJ_EXP2_EMU of a
// row is computed on the FMA pipe (fjh_exp2_poly) instead of the MUFU unit
// (16 results a clock per SM), FlashAttention-4's trick. It pays where the
// softmax outweighs the two GEMMs and MUFU is the bottleneck: at D=64 with
// two consumers, and with three where the score_mod's own special function
// shares the unit; at D=128 it costs (softcap too), and with three
// consumers at D=64 without such a score_mod (docs/architecture.md).
#ifndef FJ_SCORE_SFU
#define FJ_SCORE_SFU 0
#endif
#ifndef FJ_EXP2_EMU
#define FJ_EXP2_EMU (FJ_HEAD_DIM == 64 && (FJ_NUM_WARPS == 12 || FJ_SCORE_SFU) ? 4 : 0)
#endif
// FJ_BM_CACHE (1024): a block mask's row is copied into shared memory when
// it has at most this many blocks, else read from global memory (tests set
// it low to reach that path).
#ifndef FJ_BM_CACHE
#define FJ_BM_CACHE 1024
#endif
// FJ_TRACE (undefined): timing only, for bench/trace.py: SM clock stamps of
// each CTA's (or persistent work item's) phases written over the LSE, which
// is then not computed (trace.cuh).
// FJ_DEBUG_WAIT_LIMIT (undefined): debugging only: trap after that many
// polls of an mbarrier, so that a pipeline bug fails the launch instead of
// hanging the GPU (the counter's registers make ptxas serialize the
// consumers' wgmma: timings of such a build mean nothing).

// ---- shapes ----------------------------------------------------------------

// Consumer warpgroups: two (12 warps, BLOCK_M 128), or three at head dim
// 64 (16 warps, BLOCK_M 192: FlashAttention-3's tile for small heads, a
// third warp on each scheduler to hide the softmax's latencies).
constexpr int FJH_NC = FJ_NUM_WARPS / 4 - 1;
constexpr int FJH_THREADS = 128 * (FJH_NC + 1);
constexpr int FJH_WG_ROWS = 64;                   // query rows of one consumer
constexpr int FJH_CHUNKS64 = FJ_HEAD_DIM / 64;    // 128-byte column blocks
constexpr int FJH_Q_BYTES = FJ_BLOCK_M * FJ_HEAD_DIM * 2;
constexpr int FJH_KV_BYTES = FJ_BLOCK_N * FJ_HEAD_DIM * 2;
constexpr int FJH_BAR_BYTES = 8 * (1 + 4 * FJ_NUM_STAGES);
constexpr int FJH_SMEM_BYTES =
    1024 + FJ_Q_BUFS * FJH_Q_BYTES + 2 * FJ_NUM_STAGES * FJH_KV_BYTES + FJH_BAR_BYTES;
constexpr int FJH_S_REGS = FJ_BLOCK_N / 2;        // S accumulators a thread
constexpr int FJH_O_REGS = FJ_HEAD_DIM / 2;       // O accumulators a thread
constexpr int FJH_PK = FJ_BLOCK_N / 16;           // k16 steps of P V
constexpr int FJH_BM_CACHE = FJ_BM_CACHE;

// Named barrier ids: 0 is __syncthreads; 1 + c orders consumer c's GEMMs
// (ping-pong); 1 + FJH_NC + c is consumer c's own epilogue barrier.
enum { FJH_BAR_SCHED = 1, FJH_BAR_EPI = 1 + FJH_NC };

// ---- budgets ---------------------------------------------------------------

static_assert(FJ_HEAD_DIM == 64 || FJ_HEAD_DIM == 128 || FJ_HEAD_DIM == 256,
              "head dim 64, 128 or 256");
static_assert(FJ_NUM_WARPS == 12 || (FJ_NUM_WARPS == 16 && FJ_HEAD_DIM == 64),
              "sm90: 12 warps (one producer, two consumer warpgroups), or 16 (three) "
              "at head dim 64");
static_assert(FJ_BLOCK_M == FJH_WG_ROWS * FJH_NC, "sm90: BLOCK_M is 64 rows a consumer");
static_assert(FJ_BLOCK_N == 64 || FJ_BLOCK_N == 128 || FJ_BLOCK_N == 176,
              "sm90: BLOCK_N 64, 128 or 176");
// A tile of 176 kv rows starts inside a page wherever pages are 32 rows or
// more, and the paged loads' boxes (pipeline.cuh) assume it starts at a
// page boundary; head dim 128 is the one it is compiled and tested at.
static_assert(FJ_BLOCK_N != 176 || (FJ_HEAD_DIM == 128 && !FJ_VARLEN),
              "sm90: BLOCK_N 176 only at head dim 128, without the serving layouts");
#if FJ_NUM_WARPS == 16 && (FJ_PERSISTENT || defined(FJ_TRACE))
#error "sm90: three consumers only in the non-persistent, untraced kernel"
#endif
static_assert(FJ_NUM_STAGES >= 2, "sm90: at least two K/V stages");
static_assert(FJ_Q_BUFS == 1 || (FJ_Q_BUFS == 2 && FJ_PERSISTENT),
              "sm90: two Q buffers only in the persistent kernel");
static_assert(FJH_SMEM_BYTES <= 227 * 1024, "sm90: shared memory over 227 KiB");
// The CTA starts with 65536 / threads registers a thread, rounded down to 8
// (168 with 384 threads, 128 with 512), and setmaxnreg only moves registers
// within that pool: asking for more makes setmaxnreg.inc wait forever.
static_assert(FJ_PRODUCER_REGS + FJH_NC * FJ_CONSUMER_REGS <=
                  (FJH_NC + 1) * ((65536 / FJH_THREADS) & ~7),
              "sm90: register split over the CTA's pool (setmaxnreg.inc would hang)");
static_assert(FJ_PRODUCER_REGS % 8 == 0 && FJ_CONSUMER_REGS % 8 == 0 &&
              FJ_PRODUCER_REGS >= 24 && FJ_CONSUMER_REGS <= 256,
              "sm90: setmaxnreg takes multiples of 8 in [24, 256]");
static_assert(FJ_EXP2_EMU >= 0, "sm90: FJ_EXP2_EMU is 0 (off) or N (one in N)");
static_assert(FJH_BM_CACHE >= 1, "sm90: FJ_BM_CACHE is at least 1");

// ---- helpers ---------------------------------------------------------------

// One of two types by a compile-time condition (no <type_traits> here).
template <bool C, class T, class F>
struct fjh_type_if {
  using type = T;
};
template <class T, class F>
struct fjh_type_if<false, T, F> {
  using type = F;
};

#define FJH_LOG2E 1.4426950408889634f
#define FJH_LN2 0.6931471805599453f
