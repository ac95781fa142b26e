// templates/sm90/fwd.cuh: FlashAttention-3 style forward kernel for sm_90a
// (Hopper): TMA loads into 128-byte-swizzled shared memory completing on
// mbarriers, a K/V pipeline of FJ_NUM_STAGES stages, one producer warpgroup
// and two consumer warpgroups (three at head dim 64) with register
// reallocation (setmaxnreg),
// wgmma for S = Q K^T (both operands in shared memory) and O += P V (P from
// registers), ping-pong between the consumer warpgroups (named barriers) and
// intra-warpgroup overlap of softmax with the next Q K^T.
//
// ---- Contract with the generator -----------------------------------------
// Macros (all required unless marked optional):
//   FJ_HEAD_DIM        64 | 128 | 256
//   FJ_DTYPE_BF16 1  or  FJ_DTYPE_F16 1
//   FJ_BLOCK_M         64 query rows per consumer warpgroup: 128, or 192
//                      with FJ_NUM_WARPS 16
//   FJ_BLOCK_N         64 | 128: kv rows per tile (the N of S = Q K^T)
//   FJ_NUM_WARPS       12: warpgroup 0 produces, warpgroups 1 and 2 compute;
//                      or 16 at head dim 64: warpgroups 1-3 compute
//   FJ_NUM_STAGES      >= 2: K and V tiles in shared memory
//   FJ_HAS_MASK        0 | 1: as in sm80/fwd.cuh
//   FJ_HAS_SCORE_MOD   0 | 1: as in sm80/fwd.cuh
//   FJ_PINGPONG        optional, 0 | 1 (default 1): order the two consumer
//                      warpgroups' GEMMs so that one's softmax overlaps the
//                      other's GEMMs
//   FJ_INTRA_WG_OVERLAP optional, 0 | 1: issue Q K^T of tile j+1 before
//                      P V of tile j and run the softmax of j+1 while P V of
//                      j is in flight (default 1; the runtime compiles with
//                      0 when ptxas reports spills, runtime/forward.c)
//   FJ_PERSISTENT      optional, 0 | 1 (the generator's fjg_config.persistent):
//                      the persistent kernel, grid (min(SMs, items), 1, 1)
//   FJ_BM_CACHE, FJ_EXP2_EMU, FJ_Q_BUFS optional,
//                      each described where it is defined below
//   FJ_DEBUG_WAIT_LIMIT optional: trap after that many mbarrier polls
//                      (debugging only: the counter makes the kernel spill)
//   FJ_TRACE           optional, timing only (bench/trace.py): SM clock
//                      stamps of each CTA's phases written over the LSE
//                      (which is then not computed); in the persistent
//                      kernel, per work item
//   FJ_PRODUCER_REGS, FJ_CONSUMER_REGS optional: setmaxnreg targets
//                      (default 24 and 240; for the persistent kernel, whose
//                      producer warp classifies tiles, 56 and 224, or 40
//                      and 232 at head dim 256; 24 and 160 with three
//                      consumers). The CTA starts with 168 a
//                      thread (65536 / 384, rounded down to 8; 128 with 512
//                      threads) and setmaxnreg only moves registers within
//                      that pool, so PRODUCER + 2 * CONSUMER must not exceed
//                      3 * 168 = 504 (PRODUCER + 3 * CONSUMER 4 * 128 = 512):
//                      asking for more makes setmaxnreg.inc wait forever
// Hooks: exactly those of sm80/fwd.cuh (fj_user_params, fj_tile_class,
//   fj_mask, fj_score_mod; see common/fj_common.cuh), same semantics.
// Block masks: as sm80/fwd.cuh. With p.bm_kv_num set, the kv tiles and
//   their classes come from the mask row's lists (PARTIAL blocks, then FULL
//   ones, each bm_kv_ratio tiles of FJ_BLOCK_N) instead of fj_tile_class;
//   FULL tiles skip the mask, PARTIAL ones are refined per consumer
//   warpgroup by fj_tile_class. The host guarantees block_q % FJ_BLOCK_M
//   == 0 and block_kv % FJ_BLOCK_N == 0 (runtime/blockmask.c). The producer
//   and both consumers compute the same walk from the same lists: the
//   arrays must not change while the kernel runs (a difference would stall
//   the mbarrier pipeline, not just give a wrong answer).
// Kernel:
//   extern "C" __global__ void fj_attention_fwd(
//       const __grid_constant__ fj_fwd_params p,
//       const __grid_constant__ fj_tma_maps maps)
//   launched with kernelParams {&params, &maps} (two parameters: not the
//   CU_LAUNCH_PARAM_BUFFER_POINTER path), grid (ceil(Lq / FJ_BLOCK_M), Hq, B),
//   FJH_THREADS (384; 512 with three consumers), no cluster, and
//   FJH_SMEM_BYTES of dynamic shared memory:
//     1024 + (FJ_BLOCK_M + 2 * FJ_NUM_STAGES * FJ_BLOCK_N) * FJ_HEAD_DIM * 2
//          + 8 * (1 + 4 * FJ_NUM_STAGES)        (gen/config.c computes it)
//   maps.q/k/v are CUtensorMaps (runtime/tma.c builds them) over the 4-D
//   tensors (D, L, H, B), innermost first, with 128-byte swizzle, boxes of
//   (64, FJ_BLOCK_M, 1, 1) for q and (64, FJ_BLOCK_N, 1, 1) for k and v,
//   zero fill out of bounds; maps.o (boxes of (64, 64, 1, 1): one
//   consumer's rows) stores O when maps.o_ok is 1, else O is stored with
//   ordinary predicated stores.
// Requirements the host checks: as sm80/fwd.cuh (16-byte aligned pointers,
//   strides multiples of 8 elements), plus what cuTensorMapEncodeTiled needs.
// Semantics: as sm80/fwd.cuh; LSE natural log; rows with no allowed pair get
//   O = 0 and LSE = -inf.
// ---------------------------------------------------------------------------
#pragma once

#if !defined(FJ_HEAD_DIM) || !defined(FJ_BLOCK_M) || !defined(FJ_BLOCK_N) || \
    !defined(FJ_NUM_WARPS) || !defined(FJ_NUM_STAGES) ||                      \
    !defined(FJ_HAS_MASK) || !defined(FJ_HAS_SCORE_MOD)
#error "sm90/fwd.cuh: a configuration macro from the generator is missing"
#endif
#if defined(FJ_DTYPE_BF16) == defined(FJ_DTYPE_F16)
#error "sm90/fwd.cuh: define exactly one of FJ_DTYPE_BF16, FJ_DTYPE_F16"
#endif
#ifndef FJ_PINGPONG
#define FJ_PINGPONG 1
#endif
#ifndef FJ_INTRA_WG_OVERLAP
#define FJ_INTRA_WG_OVERLAP 1
#endif
#ifndef FJ_PERSISTENT
#define FJ_PERSISTENT 0
#endif
// The persistent producer warps also classify tiles (fj_tile_scan_warp)
// and walk them in two threads, which spills in 24 registers (and in 40 at
// D=128). They take 56 below D=256, the most beside two 224-register
// consumers, which also holds the FJ_TRACE build's stamps (48 spilled in a
// variant with a longer consumer, session 11); at D=256 the consumers need
// 232. The non-persistent FJ_TRACE build's stamps spill in a 24-register
// producer too: it takes 40 (232 for the consumers measured the same
// speed, bench/RESULTS.md, session 5, run 1).
#ifndef FJ_PRODUCER_REGS
#if FJ_PERSISTENT
#define FJ_PRODUCER_REGS (FJ_HEAD_DIM == 256 ? 40 : 56)
#elif defined(FJ_TRACE)
#define FJ_PRODUCER_REGS 40
#else
#define FJ_PRODUCER_REGS 24
#endif
#endif
#ifndef FJ_CONSUMER_REGS
#if FJ_NUM_WARPS == 16
#define FJ_CONSUMER_REGS 160  // three consumers: (512 - 24) / 3, rounded down to 8
#elif FJ_PERSISTENT
#define FJ_CONSUMER_REGS (FJ_HEAD_DIM == 256 ? 232 : 224)
#elif defined(FJ_TRACE)
#define FJ_CONSUMER_REGS 232
#else
#define FJ_CONSUMER_REGS 240
#endif
#endif
// Q buffers: the persistent kernel takes two where shared memory allows
// (the host's configuration decides, gen/config.c), so that the next
// item's Q loads while this item still reads its own.
#ifndef FJ_Q_BUFS
#define FJ_Q_BUFS 1
#endif
// The persistent kernel's ping-pong turn passes from item to item as from
// tile to tile: consumer 0 starts the next item's first Q K^T once consumer
// 1 has issued its last P V of this one, while consumer 1 finishes.
#define FJH_SCHED_CARRY (FJ_PERSISTENT && FJ_PINGPONG)
// With two Q buffers the persistent kernel's epilogue stages O in the
// item's own Q buffer and frees it for the producer afterwards.
#define FJH_PERSIST_EPI_SMEM (FJ_PERSISTENT && FJ_Q_BUFS == 2)

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

static_assert(FJ_HEAD_DIM == 64 || FJ_HEAD_DIM == 128 || FJ_HEAD_DIM == 256,
              "head dim 64, 128 or 256");
static_assert(FJ_NUM_WARPS == 12 || (FJ_NUM_WARPS == 16 && FJ_HEAD_DIM == 64),
              "sm90: 12 warps (one producer, two consumer warpgroups), or 16 (three) "
              "at head dim 64");
static_assert(FJ_BLOCK_M == FJH_WG_ROWS * FJH_NC, "sm90: BLOCK_M is 64 rows a consumer");
static_assert(FJ_BLOCK_N == 64 || FJ_BLOCK_N == 128, "sm90: BLOCK_N 64 or 128");
#if FJ_NUM_WARPS == 16 && (FJ_PERSISTENT || defined(FJ_TRACE))
#error "sm90: three consumers only in the non-persistent, untraced kernel"
#endif
static_assert(FJ_NUM_STAGES >= 2, "sm90: at least two K/V stages");
static_assert(FJ_Q_BUFS == 1 || (FJ_Q_BUFS == 2 && FJ_PERSISTENT),
              "sm90: two Q buffers only in the persistent kernel");
static_assert(FJH_SMEM_BYTES <= 227 * 1024, "sm90: shared memory over 227 KiB");
static_assert(FJ_PRODUCER_REGS + FJH_NC * FJ_CONSUMER_REGS <=
                  (FJH_NC + 1) * ((65536 / FJH_THREADS) & ~7),
              "sm90: register split over the CTA's pool (setmaxnreg.inc would hang)");
static_assert(FJ_PRODUCER_REGS % 8 == 0 && FJ_CONSUMER_REGS % 8 == 0 &&
              FJ_PRODUCER_REGS >= 24 && FJ_CONSUMER_REGS <= 256,
              "sm90: setmaxnreg takes multiples of 8 in [24, 256]");

#define FJH_LOG2E 1.4426950408889634f
#define FJH_LN2 0.6931471805599453f
#if defined(FJ_DTYPE_BF16)
#define FJH_AB ".bf16.bf16"
#else
#define FJH_AB ".f16.f16"
#endif

// FJ_TRACE: raw %clock stamps (one SM's counter, so comparable between the
// CTAs of one SM) kept in registers by one thread of each role and written
// at the end into the LSE of the CTA's rows q0 + slot: consumer c at slots
// 32 c + 0.., the producer at 64.. (bench/trace.py reads them back).
#ifdef FJ_TRACE
__device__ __forceinline__ unsigned fjh_clock() {
  unsigned c;
  asm volatile("mov.u32 %0, %%clock;\n" : "=r"(c) :: "memory");
  return c;
}
__device__ __forceinline__ unsigned fjh_smid() {
  unsigned c;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(c));
  return c;
}
#define FJH_TR(k) (fjh_tr[k] = fjh_clock())
// A stamp stored at once (loop iterations): slot k of the role's area.
#define FJH_TRG(k) \
  do { \
    if (fjh_trg != nullptr) fjh_trg[k] = __uint_as_float(fjh_clock()); \
  } while (0)
// Stamp x of the consumer loop's iteration 1 or 2 (fjh_k: its first slot,
// -1 for the other iterations).
#define FJH_TRL(x) \
  do { \
    if (fjh_k >= 0) FJH_TRG(fjh_k + (x)); \
  } while (0)
#else
#define FJH_TR(k) ((void)0)
#define FJH_TRG(k) ((void)0)
#define FJH_TRL(x) ((void)0)
#endif

#ifdef FJ_TRACE
// A role's trace slots: the LSE of rows q0 + first .. (nullptr without an
// LSE). Consumer c's start at 32 c, the producer's at 64.
__device__ __forceinline__ float *fjh_trace_slots(const fj_fwd_params &p, int b, int h,
                                                  int q0, int first) {
  return p.lse != nullptr ? p.lse + b * p.lse_sb + h * p.lse_sh + q0 + first : nullptr;
}
// The producer's stamps of a work item (entry, start of its loads, last
// load issued), its SM, the global timer (ns, to convert clock cycles) and
// its tile count, at slots 64.. of the item's rows.
__device__ __forceinline__ void fjh_trace_producer(const fj_fwd_params &p, int b, int h,
                                                   int q0, const unsigned (&tr)[8],
                                                   int ntiles) {
  float *gl = fjh_trace_slots(p, b, h, q0, 64);
  if (gl == nullptr) return;
  for (int k = 0; k < 3; ++k) gl[k] = __uint_as_float(tr[k]);
  gl[3] = __uint_as_float(fjh_smid());
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(ns));
  gl[4] = __uint_as_float((unsigned)ns);
  gl[5] = __uint_as_float((unsigned)(ns >> 32));
  gl[6] = __uint_as_float((unsigned)ntiles);
}
#endif

// Named barrier ids: 0 is __syncthreads; 1 + c orders consumer c's GEMMs
// (ping-pong); 1 + FJH_NC + c is consumer c's own epilogue barrier.
enum { FJH_BAR_SCHED = 1, FJH_BAR_EPI = 1 + FJH_NC };

// ---- host-visible parameter: the tensor maps ------------------------------
// Opaque 128-byte CUtensorMap images (cuda.h is not included); the host
// mirror is runtime/tma.h's fjr_tma_maps.
struct __align__(64) fjh_tensor_map {
  unsigned long long opaque[16];
};
// 128-byte aligned like the host's (runtime/tma.h): 640 bytes.
struct __align__(128) fj_tma_maps {
  fjh_tensor_map q, k, v;
  // O in boxes of 64 rows (one consumer's), for the epilogue's TMA store;
  // valid when o_ok is 1 (the host could encode it: 16-byte aligned O).
  fjh_tensor_map o;
  // The persistent kernel's work counter (zeroed before the launch), or
  // null: items are then dealt out statically (fjh_item_pos).
  int *sched;
  int o_ok;
};

// ---- PTX wrappers ----------------------------------------------------------

__device__ __forceinline__ void fjh_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count)
               : "memory");
}
// Makes the initialized barriers visible to the async proxy (TMA).
__device__ __forceinline__ void fjh_fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void fjh_mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fjh_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Blocks until the phase of parity `parity` has completed. FJ_DEBUG_WAIT_LIMIT
// (optional, test harnesses only) traps after that many polls, so that a
// pipeline bug fails the launch instead of hanging the GPU.
__device__ __forceinline__ void fjh_mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
#ifdef FJ_DEBUG_WAIT_LIMIT
  unsigned polls = 0;
#endif
  do {
#ifdef FJ_DEBUG_WAIT_LIMIT
    if (++polls > (unsigned)(FJ_DEBUG_WAIT_LIMIT)) asm volatile("trap;");
#endif
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
// The same for a whole consumer warp: lanes may leave the spin loop at
// different trips, and the wgmma and bar instructions that follow need the
// warp converged. (The producer thread runs alone in its warp, whose other
// lanes have exited, so it must not use this one.)
__device__ __forceinline__ void fjh_mbar_wait_warp(unsigned bar, unsigned parity) {
  fjh_mbar_wait(bar, parity);
  __syncwarp();
}

// TMA: a (64 x rows) box of the 4-D tensor at (c0, c1, c2, c3) into shared
// memory, completing `bar`'s transaction count.
__device__ __forceinline__ void fjh_tma_load_4d(unsigned dst, const fjh_tensor_map *map,
                                                int c0, int c1, int c2, int c3,
                                                unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// Shared to global (the box at coordinates c0..c3; rows outside the
// tensor are not written), in the calling thread's bulk group.
__device__ __forceinline__ void fjh_tma_store_4d(const fjh_tensor_map *map, unsigned src,
                                                 int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
      :: "l"(map), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void fjh_bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// The thread's bulk stores have read their shared memory.
__device__ __forceinline__ void fjh_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void fjh_tma_prefetch_desc(const fjh_tensor_map *map) {
  asm volatile("prefetch.tensormap [%0];\n" :: "l"(map) : "memory");
}

template <int N>
__device__ __forceinline__ void fjh_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N>
__device__ __forceinline__ void fjh_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}

__device__ __forceinline__ void fjh_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void fjh_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// Generic-proxy shared-memory accesses before async-proxy ones (and back).
__device__ __forceinline__ void fjh_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void fjh_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void fjh_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void fjh_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

// Registers read or written by an in-flight wgmma must stay where they are
// until its wait: these empty asm statements make the compiler treat them
// as used and redefined at this point, so it neither moves them nor reuses
// them for other values in between.
template <int N>
__device__ __forceinline__ void fjh_fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}
template <int N>
__device__ __forceinline__ void fjh_fence_regs(unsigned (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e]) :: "memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle. For K-major operands
// (Q, K) lbo is unused and sbo = 1024 (8 rows of 128 bytes); for the
// MN-major V, lbo is the distance between 64-column blocks and sbo = 1024
// (8 kv rows). Tile bases are 1024-byte aligned, so the base offset is 0.
// A descriptor is built from its low word (address >> 4 in bits 0-13, lbo
// in 16-29) and a constant high word: fjh_desc_lo once for a tile, then
// fjh_desc adds each k step's byte offset to the low word. That is exact
// because shared memory ends below 256 KiB (no carry out of bits 0-13), and
// costs one add a wgmma instead of rebuilding all fields (the D=64 kernel
// is issue-bound).
__device__ __forceinline__ unsigned fjh_desc_lo(unsigned addr, unsigned lbo) {
  return ((addr & 0x3FFFFu) >> 4) | (((lbo >> 4) & 0x3FFFu) << 16);
}
__device__ __forceinline__ unsigned long long fjh_desc(unsigned lo, unsigned byte_off) {
  constexpr unsigned hi = ((1024u >> 4) & 0x3FFFu) | (1u << 30);  // sbo, swizzle 128B
  return ((unsigned long long)hi << 32) | (lo + (byte_off >> 4));
}

// The accumulator operands of a wgmma m64nN (N / 2 floats a thread): the
// register list in the instruction text, and the asm operands that bind it
// to d[0..], with constraint C ("+f": read and written, "=f": written).
#define FJH_D32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
  "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FJH_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
  "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
  "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63}"
#define FJH_F8(C, d, i) \
  C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), \
      C(d[i + 6]), C(d[i + 7])
#define FJH_F32(C, d) FJH_F8(C, d, 0), FJH_F8(C, d, 8), FJH_F8(C, d, 16), FJH_F8(C, d, 24)
#define FJH_F64(C, d) \
  FJH_F32(C, d), FJH_F8(C, d, 32), FJH_F8(C, d, 40), FJH_F8(C, d, 48), FJH_F8(C, d, 56)
#define FJH_RW(x) "+f"(x)
#define FJH_WO(x) "=f"(x)

// d = A * B (first = true: d is written, not read, the first k step of
// S = Q K^T, so no instruction but this one defines a new S) or d += A * B,
// with A and B in shared memory, both K-major: m64n64k16 / m64n128k16.
template <bool FIRST>
__device__ __forceinline__ void fjh_wgmma_ss(float (&d)[32], unsigned long long da,
                                             unsigned long long db) {
  if constexpr (FIRST)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32" FJH_AB " " FJH_D32
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : FJH_F32(FJH_WO, d) : "l"(da), "l"(db), "r"(0));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32" FJH_AB " " FJH_D32
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : FJH_F32(FJH_RW, d) : "l"(da), "l"(db), "r"(1));
}
template <bool FIRST>
__device__ __forceinline__ void fjh_wgmma_ss(float (&d)[64], unsigned long long da,
                                             unsigned long long db) {
  if constexpr (FIRST)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32" FJH_AB " " FJH_D64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : FJH_F64(FJH_WO, d) : "l"(da), "l"(db), "r"(0));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32" FJH_AB " " FJH_D64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : FJH_F64(FJH_RW, d) : "l"(da), "l"(db), "r"(1));
}

// d += A * B with A (P) in registers and B (V) in shared memory, MN-major
// (imm-trans-b = 1): m64n64k16 / m64n128k16.
__device__ __forceinline__ void fjh_wgmma_rs(float (&d)[32], const unsigned (&a)[4],
                                             unsigned long long db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32" FJH_AB " " FJH_D32
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
               : FJH_F32(FJH_RW, d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void fjh_wgmma_rs(float (&d)[64], const unsigned (&a)[4],
                                             unsigned long long db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32" FJH_AB " " FJH_D64
               ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
               : FJH_F64(FJH_RW, d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// D=256: O += P V as two m64n128k16, columns 0-127 from V's 64-column
// blocks 0 and 1, columns 128-255 from blocks 2 and 3 (2 * FJ_BLOCK_N * 128
// bytes further); the per-thread layout is that of one m64n256k16, whose
// 128 accumulators one asm statement would have to carry.
__device__ __forceinline__ void fjh_wgmma_rs(float (&d)[128], const unsigned (&a)[4],
                                             unsigned long long db) {
  fjh_wgmma_rs(*reinterpret_cast<float(*)[64]>(&d[0]), a, db);
  fjh_wgmma_rs(*reinterpret_cast<float(*)[64]>(&d[64]), a,
               db + ((2u * FJ_BLOCK_N * 128u) >> 4));
}

// ---- tile walk: the producer and both consumers visit the same tiles -----

// A work item: query block m of head h, batch b. The non-persistent grid has
// one CTA per item and the hardware starts them in launch order (x
// fastest): query blocks from the last down (longest causal rows first)
// within each head, whose CTAs then run together and share its K and V in
// L2. (A longest-first order over the whole grid was measured no faster:
// bench/RESULTS.md, session 2, run 7.)
struct fjh_work {
  int m, h, b;
};
__device__ __forceinline__ fjh_work fjh_work_of_cta() {
  return fjh_work{(int)gridDim.x - 1 - (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z};
}

// With a block mask (p.bm_kv_num != nullptr) the tiles are the mask row's
// PARTIAL blocks, then its FULL blocks, each a run of bm_kv_ratio tiles:
// positions t = 0, 1, ... of that sequence. The walk ends with -1 and lo is
// 0 then, so every `j >= lo` test below serves both walks.

// Index of the row of query block q0 / FJ_BLOCK_M in the block mask's
// count arrays.
__device__ __forceinline__ int fjh_bm_row(const fj_fwd_params &p, int b, int h, int q0) {
  return b * p.bm_b_stride + h * p.bm_h_stride + (q0 / FJ_BLOCK_M) / p.bm_q_ratio;
}

// The CTA's row of the block mask in shared memory: its PARTIAL blocks,
// then its FULL ones, loaded once by the whole CTA (fjh_bm_stage), so that
// the producer and the consumers step from tile to tile without a chain of
// dependent global loads between them. Rows longer than FJH_BM_CACHE
// blocks are read from global memory instead (FJ_BM_CACHE, optional,
// lowers the limit so that tests reach that path).
#ifndef FJ_BM_CACHE
#define FJ_BM_CACHE 1024
#endif
constexpr int FJH_BM_CACHE = FJ_BM_CACHE;
struct fjh_bm_row_cache {
  int np, n;  // PARTIAL blocks; PARTIAL + FULL blocks
  int blk[FJH_BM_CACHE];
};
// k: the work item's number among the CTA's (0 in the non-persistent
// kernel); the persistent kernel keeps the rows of two items, its ring's.
__device__ __forceinline__ fjh_bm_row_cache &fjh_bm_cache(int k) {
#if FJ_PERSISTENT
  __shared__ fjh_bm_row_cache c[2];
  return c[k & 1];
#else
  __shared__ fjh_bm_row_cache c;
  (void)k;
  return c;
#endif
}

// Threads i = first, first + stride, ... of the caller copy the block-mask
// row of query block q0 into c (the caller then synchronizes them).
__device__ __forceinline__ void fjh_bm_fill(const fj_fwd_params &p, int b, int h, int q0,
                                            fjh_bm_row_cache &c, int first, int stride) {
  const int row = fjh_bm_row(p, b, h, q0);
  const int np = __ldg(p.bm_kv_num + row);
  const int n = np + __ldg(p.bm_full_num + row);
  const long long base = (long long)row * p.bm_nkv;
  // Entry i of both lists is loaded before the counts are known (the lists
  // are nkv long, read past their counts too): one round trip to global
  // memory before the CTA's first K load instead of two.
  const int m = min(p.bm_nkv, FJH_BM_CACHE);
  for (int i = first; i < m; i += stride) {
    const int a = __ldg(p.bm_kv_idx + base + i);
    const int f = __ldg(p.bm_full_idx + base + i);
    // Past FJH_BM_CACHE blocks the walk reads global memory instead.
    if (i < np) c.blk[i] = a;
    if (i < n - np && np + i < FJH_BM_CACHE) c.blk[np + i] = f;
  }
  if (first == 0) {
    c.np = np;
    c.n = n;
  }
}

#if !FJ_PERSISTENT
// Every thread of the CTA calls it (one __syncthreads).
__device__ __forceinline__ void fjh_bm_stage(const fj_fwd_params &p, int b, int h, int q0) {
  fjh_bm_fill(p, b, h, q0, fjh_bm_cache(0), threadIdx.x, blockDim.x);
  __syncthreads();
}
#endif

// The tile at position *t, or the first after it that starts below Lk (the
// tail of a row's last block may not); *t moves to it and *cls receives its
// class. -1 past the end of the row's lists (at once for an empty row).
// The row is item kq's copy in shared memory (fjh_bm_cache).
__device__ __forceinline__ int fjh_bm_tile(const fj_fwd_params &p, int b, int h, int q0,
                                           int *t, int *cls, int kq) {
  const fjh_bm_row_cache &c = fjh_bm_cache(kq);
  const int cnp = c.np, cn = c.n;
  const bool cached = cn <= FJH_BM_CACHE;
  const int *cblk = c.blk;
  const int r = p.bm_kv_ratio;
  const int np = cnp * r;
  const int n = cn * r;
  for (; *t < n; ++*t) {
    const bool partial = *t < np;
    // r is 1 unless the mask's blocks are wider than a tile: no division
    // by a runtime value on every tile then.
    const int k = r == 1 ? *t : *t / r;
    int blk;
    if (cached) {
      blk = cblk[k];
    } else {
      const long long base = (long long)fjh_bm_row(p, b, h, q0) * p.bm_nkv;
      blk = partial ? __ldg(p.bm_kv_idx + base + k)
                    : __ldg(p.bm_full_idx + base + k - cnp);
    }
    const int j = r == 1 ? blk : blk * r + *t % r;
    if (j * FJ_BLOCK_N < p.sz.Lk) {
      *cls = partial ? FJ_TILE_PARTIAL : FJ_TILE_FULL;
      return j;
    }
  }
  return -1;
}

// The tile after j (at position *t with a block mask): the block mask's
// next, else the classifier's next non-EMPTY block below j. The producer
// and both consumers advance only through here, once per tile.
__device__ __forceinline__ int fjh_advance(const fj_fwd_params &p, int b, int h, int q0,
                                           int q1, int j, int lo, int *t, int *cls,
                                           int kq) {
  if (p.bm_kv_num != nullptr) {
    ++*t;
    return fjh_bm_tile(p, b, h, q0, t, cls, kq);
  }
  return fj_next_block(p, b, h, q0, q1, j, lo, cls);
}

// Shared-memory map: Q (FJ_BLOCK_M rows), then FJ_NUM_STAGES K tiles, then
// FJ_NUM_STAGES V tiles, each stored as FJH_CHUNKS64 blocks of (rows x 64
// elements) in TMA's 128-byte swizzle; then the mbarriers.
struct fjh_smem_map {
  unsigned q, k, v, bar;
  __device__ unsigned k_tile(int s) const { return k + s * FJH_KV_BYTES; }
  __device__ unsigned v_tile(int s) const { return v + s * FJH_KV_BYTES; }
  __device__ unsigned q_tile(int i) const { return q + i * FJH_Q_BYTES; }
#if FJ_PERSISTENT
  unsigned pbar;  // fjh_persist's barriers (static shared memory)
  __device__ unsigned q_full(int i) const { return i == 0 ? bar : pbar + 8 * 5; }
  __device__ unsigned q_empty(int i) const { return pbar + 8 * 6 * i; }
  __device__ unsigned item_full(int s) const { return pbar + 8 * (1 + s); }
  __device__ unsigned item_empty(int s) const { return pbar + 8 * (3 + s); }
#else
  __device__ unsigned q_full(int i) const { return (void)i, bar; }
#endif
  __device__ unsigned k_full(int s) const { return bar + 8 * (1 + s); }
  __device__ unsigned v_full(int s) const { return bar + 8 * (1 + FJ_NUM_STAGES + s); }
  __device__ unsigned k_empty(int s) const { return bar + 8 * (1 + 2 * FJ_NUM_STAGES + s); }
  __device__ unsigned v_empty(int s) const { return bar + 8 * (1 + 3 * FJ_NUM_STAGES + s); }
};

#if FJ_PERSISTENT
// The persistent kernel's own shared state: barriers (q_empty(i): 256
// consumer arrivals once they are done with Q buffer i; item_full /
// item_empty: a two-slot ring of work items from the producer warp to the
// consumers and the V thread; q_full(1): Q buffer 1 loaded) and the ring's
// slots (the item's position in the order of fjh_item, -1 when there are
// no more; lo, hi, class of hi, block-mask position t).
struct fjh_item_tiles {
  int item, lo, hi, hi_cls, t;
};
struct fjh_persist {
  unsigned long long bar[7];
  fjh_item_tiles item[2];
};
__device__ __forceinline__ fjh_persist &fjh_persist_smem() {
  __shared__ fjh_persist ps;
  return ps;
}
// A slot of the ring, read once its item_full phase completed (volatile:
// the producer warp wrote it, the barrier ordered it).
__device__ __forceinline__ fjh_item_tiles fjh_item_read(int slot) {
  const volatile fjh_item_tiles &v = fjh_persist_smem().item[slot];
  return fjh_item_tiles{v.item, v.lo, v.hi, v.hi_cls, v.t};
}
#endif

// A K/V stage and the parity of its mbarriers' current phase for the n-th
// tile a role walks (n counts on across the persistent kernel's items).
// Roles step it along instead of dividing n by the stage count each tile.
struct fjh_stage {
  int s;
  unsigned ph;
};
__device__ __forceinline__ fjh_stage fjh_stage_of(int n) {
  return fjh_stage{n % FJ_NUM_STAGES, (unsigned)(n / FJ_NUM_STAGES) & 1u};
}
__device__ __forceinline__ fjh_stage fjh_stage_next(fjh_stage st) {
  return st.s == FJ_NUM_STAGES - 1 ? fjh_stage{0, st.ph ^ 1u} : fjh_stage{st.s + 1, st.ph};
}

// ---- producer: one thread issues every TMA load --------------------------

// Loads kv block j into stage st of K (or V) once the consumers have
// released that stage's previous use (the empty barrier's phase before).
__device__ __forceinline__ void fjh_load_kv(const fjh_tensor_map *map, unsigned tile,
                                            unsigned full, unsigned empty, fjh_stage st,
                                            int j, int hk, int b) {
  fjh_mbar_wait(empty, st.ph ^ 1u);
  fjh_mbar_arrive_expect_tx(full, FJH_KV_BYTES);
#pragma unroll
  for (int c = 0; c < FJH_CHUNKS64; ++c)
    fjh_tma_load_4d(tile + c * FJ_BLOCK_N * 128, map, c * 64, j * FJ_BLOCK_N, hk, b, full);
}
__device__ __forceinline__ void fjh_load_k(const fj_tma_maps &maps, const fjh_smem_map &sm,
                                           fjh_stage st, int j, int hk, int b) {
  fjh_load_kv(&maps.k, sm.k_tile(st.s), sm.k_full(st.s), sm.k_empty(st.s), st, j, hk, b);
}
__device__ __forceinline__ void fjh_load_v(const fj_tma_maps &maps, const fjh_smem_map &sm,
                                           fjh_stage st, int j, int hk, int b) {
  fjh_load_kv(&maps.v, sm.v_tile(st.s), sm.v_full(st.s), sm.v_empty(st.s), st, j, hk, b);
}

// Q of query block q0 into Q buffer i.
__device__ __forceinline__ void fjh_load_q(const fj_tma_maps &maps, const fjh_smem_map &sm,
                                           int i, int b, int h, int q0) {
  fjh_mbar_arrive_expect_tx(sm.q_full(i), FJH_Q_BYTES);
#pragma unroll
  for (int c = 0; c < FJH_CHUNKS64; ++c)
    fjh_tma_load_4d(sm.q_tile(i) + c * FJ_BLOCK_M * 128, &maps.q, c * 64, q0, h, b,
                    sm.q_full(i));
}

// Order of loads: K(0), then K(n+1) before V(n), which is the order in
// which the consumers need them (Q K^T of the next tile is issued before
// P V of the current one), from one thread (the non-persistent kernel's;
// the persistent kernel splits them, fjh_produce_one). Q is the caller's:
// issued before the tile scan. n counts the K/V tiles loaded so far.
__device__ __forceinline__ void fjh_produce(const fj_fwd_params &p, const fj_tma_maps &maps,
                                         const fjh_smem_map &sm, int b, int h, int q0,
                                         int q1, int lo, int hi, int t, int &n) {
  const int hk = h / p.kv_group;
  const int kq = 0;  // the one item (its block-mask row: fjh_bm_cache)
  int cls = FJ_TILE_FULL;
  int j = hi;
  fjh_stage st0 = fjh_stage_of(n);  // tile j's stage
  fjh_load_k(maps, sm, st0, j, hk, b);
#ifdef FJ_TRACE
  float *fjh_trg = fjh_trace_slots(p, b, h, q0, 64);
  int fjh_it = 0;
#endif
  for (int jn = fjh_advance(p, b, h, q0, q1, j, lo, &t, &cls, kq); jn >= lo;
       jn = fjh_advance(p, b, h, q0, q1, jn, lo, &t, &cls, kq)) {
    const fjh_stage st1 = fjh_stage_next(st0);
    fjh_load_k(maps, sm, st1, jn, hk, b);
#ifdef FJ_TRACE
    if (fjh_it < 24) FJH_TRG(8 + 2 * fjh_it);
#endif
    fjh_load_v(maps, sm, st0, j, hk, b);
#ifdef FJ_TRACE
    if (fjh_it < 24) FJH_TRG(9 + 2 * fjh_it);
    ++fjh_it;
#endif
    j = jn;
    st0 = st1;
    ++n;
  }
  fjh_load_v(maps, sm, st0, j, hk, b);
  ++n;
}

#if FJ_PERSISTENT
// The persistent kernel's K and V loads come from two threads, each
// walking the item's tiles on its own, so that a V load never waits behind
// a K load for a stage (at an item's start the stages are still held by
// the consumer that trails in the ping-pong: with one thread, V of tile 1
// waited for K of tile 2, that is for both consumers' first Q K^T).
// which: 0 loads K, 1 loads V; n as for fjh_produce; kq: the item's number
// among the CTA's.
__device__ __forceinline__ void fjh_produce_one(const fj_fwd_params &p,
                                                const fj_tma_maps &maps,
                                                const fjh_smem_map &sm, int which, int b,
                                                int h, int q0, int q1, int lo, int hi, int t,
                                                int &n, int kq) {
  const int hk = h / p.kv_group;
  int cls = FJ_TILE_FULL;
  fjh_stage st = fjh_stage_of(n);
#ifdef FJ_TRACE
  // The stamps of fjh_produce: K(i + 1) at slot 8 + 2 i, V(i) at 9 + 2 i.
  float *fjh_trg = fjh_trace_slots(p, b, h, q0, 64);
  int fjh_it = 0;
#endif
  for (int j = hi; j >= lo; j = fjh_advance(p, b, h, q0, q1, j, lo, &t, &cls, kq)) {
    if (which == 0) fjh_load_k(maps, sm, st, j, hk, b);
    else fjh_load_v(maps, sm, st, j, hk, b);
#ifdef FJ_TRACE
    const int fjh_s = which == 0 ? 6 + 2 * fjh_it : 9 + 2 * fjh_it;
    if (fjh_s >= 8 && fjh_s < 56) FJH_TRG(fjh_s);
    ++fjh_it;
#endif
    st = fjh_stage_next(st);
    ++n;
  }
}
#endif

// ---- consumers ------------------------------------------------------------

// S = Q K^T for one consumer: descriptor low words of its 64 Q rows (dq)
// and of the K tile (dk).
__device__ __forceinline__ void fjh_issue_qk(float (&s)[FJH_S_REGS], unsigned dq,
                                             unsigned dk) {
#pragma unroll
  for (int kk = 0; kk < FJ_HEAD_DIM / 16; ++kk) {
    const unsigned qa = (kk / 4) * (FJ_BLOCK_M * 128) + (kk % 4) * 32;
    const unsigned kb = (kk / 4) * (FJ_BLOCK_N * 128) + (kk % 4) * 32;
    if (kk == 0)
      fjh_wgmma_ss<true>(s, fjh_desc(dq, qa), fjh_desc(dk, kb));
    else
      fjh_wgmma_ss<false>(s, fjh_desc(dq, qa), fjh_desc(dk, kb));
  }
}

// O += P V with P (this thread's A fragments) in registers; dv is the
// descriptor low word of the V tile.
__device__ __forceinline__ void fjh_issue_pv(float (&o)[FJH_O_REGS],
                                             const unsigned (&pf)[FJH_PK][4], unsigned dv) {
#pragma unroll
  for (int kk = 0; kk < FJH_PK; ++kk) fjh_wgmma_rs(o, pf[kk], fjh_desc(dv, kk * 16 * 128));
}

// Ping-pong: consumer c may issue its GEMMs once the one before it in the
// ring 0, 1 (, 2), 0, ... has issued its own (barrier 1 + c, 256 threads:
// 128 arrive, 128 wait).
__device__ __forceinline__ void fjh_sched_wait(int c) {
#if FJ_PINGPONG
  fjh_bar_sync(FJH_BAR_SCHED + c, 256);
#endif
}
// The last consumer starts with an arrival for consumer 0 (see
// fjh_consume), so it skips its very last arrival: every bar.sync gets
// exactly one arrival. With FJH_SCHED_CARRY that start and end are the
// CTA's (fjh_consume_all), not the item's: no arrival is skipped.
__device__ __forceinline__ void fjh_sched_arrive(int c, bool last) {
#if FJ_PINGPONG
  if (FJH_SCHED_CARRY || !(last && c == FJH_NC - 1))
    fjh_bar_arrive(FJH_BAR_SCHED + (c == FJH_NC - 1 ? 0 : c + 1), 256);
#endif
}

// What a consumer does to the scores of a tile: 0 nothing (FULL for its
// rows), 1 evaluate the mask. There is no "mask everything" mode: ptxas
// turned its per-element s = -inf into moves and selects paid on every
// tile (11% of a D=64 consumer's instructions per FULL tile); a tile EMPTY
// for the warpgroup's rows evaluates the mask instead (all false: the same
// result), and rows past Lq, which are never stored, are computed as if
// FULL (bench/RESULTS.md, session 3, run 1: full 8 x 4096 +9%).
enum { FJH_TILE_KEEP = 0, FJH_TILE_MASK = 1 };

// The softmax keeps its running max until a row's scores exceed it by more
// than this many log2 units, so O is rescaled only then (see fjh_softmax).
// Exponents stay below 2^FJH_RESCALE_SLACK.
#define FJH_RESCALE_SLACK 8

// FJ_EXP2_EMU (0: off): one exponential in every FJ_EXP2_EMU of a row is
// computed on the FMA pipe (fjh_exp2_poly) instead of the MUFU unit (16
// results a clock per SM), FlashAttention-4's trick. It pays at D=64, where
// the softmax outweighs the two GEMMs: 1 in 4 measured +3% there, 1 in 2
// even, all of them -13%; at D=128 1 in 4 cost 4% (bench/RESULTS.md,
// session 5, run 5). With three consumers at D=64 it costs instead (415
// off, 394 at 1 in 4, 411 at 1 in 6: session 7, run 4). Default: 4 for
// two consumers at D=64, off otherwise.
#ifndef FJ_EXP2_EMU
#define FJ_EXP2_EMU (FJ_HEAD_DIM == 64 && FJ_NUM_WARPS == 12 ? 4 : 0)
#endif
// 2^x for x <= 2^22: x = j + f with j = round(x) (the 1.5 * 2^23 rounding
// trick: j lands in t's low mantissa bits) and f in [-1/2, 1/2]; 2^f by a
// degree-3 polynomial (fitted to relative error, at most 1.1e-4: below a
// bf16 rounding of P), 2^j added to its exponent field. x is clamped at
// -127, where j = -127 and p = 1 give exactly +0 (the field wraps to 0),
// so masked scores (-inf) and underflows come out as 0, as ex2.approx.ftz
// gives.
__device__ __forceinline__ float fjh_exp2_poly(float x) {
  const float xc = fmaxf(x, -127.f);
  const float t = xc + 12582912.f;
  const float f = xc - (t - 12582912.f);
  const float p = fmaf(fmaf(fmaf(0.0550088269f, f, 0.242211024f), f, 0.693282951f), f, 1.0f);
  return __uint_as_float(__float_as_uint(p) + (__float_as_uint(t) << 23));
}
// Element E (0 ..) of a row of this thread's scores: 2^x on MUFU or, with
// FJ_EXP2_EMU, every FJ_EXP2_EMU-th one on the FMA pipe. A template so
// that the choice is made at compile time for each element.
template <int E>
__device__ __forceinline__ float fjh_exp2_at(float x) {
#if FJ_EXP2_EMU > 0
  if (E % FJ_EXP2_EMU == FJ_EXP2_EMU - 1) return fjh_exp2_poly(x);
#endif
  return fj_exp2(x);
}
// P = 2^(s * exp_scale - shift) for row hh of s (elements 4 i + 2 hh and
// 4 i + 2 hh + 1, i = I .. N - 1), summed into sum.
template <int I, int N>
struct fjh_exp_row {
  __device__ __forceinline__ static void run(float (&s)[FJH_S_REGS], int hh,
                                             float exp_scale, float shift, float &sum) {
    s[4 * I + 2 * hh] = fjh_exp2_at<2 * I>(fmaf(s[4 * I + 2 * hh], exp_scale, -shift));
    s[4 * I + 2 * hh + 1] =
        fjh_exp2_at<2 * I + 1>(fmaf(s[4 * I + 2 * hh + 1], exp_scale, -shift));
    sum += s[4 * I + 2 * hh] + s[4 * I + 2 * hh + 1];
    fjh_exp_row<I + 1, N>::run(s, hh, exp_scale, shift, sum);
  }
};
template <int N>
struct fjh_exp_row<N, N> {
  __device__ __forceinline__ static void run(float (&)[FJH_S_REGS], int, float, float,
                                             float &) {}
};

// The max of m[0 .. 2W-1] by a tree of halvings (a compile-time walk: a
// loop over the levels left the array in local memory).
template <int W>
struct fjh_max_tree {
  __device__ __forceinline__ static float run(float (&m)[FJH_S_REGS / 4]) {
#pragma unroll
    for (int i = 0; i < W; ++i) m[i] = fmaxf(m[i], m[i + W]);
    return fjh_max_tree<W / 2>::run(m);
  }
};
template <>
struct fjh_max_tree<0> {
  __device__ __forceinline__ static float run(float (&m)[FJH_S_REGS / 4]) { return m[0]; }
};

__device__ __forceinline__ int fjh_tile_mode(const fj_fwd_params &p, int b, int h,
                                             int wq0, int kv0, int cls) {
  if (wq0 >= p.sz.Lq) return FJH_TILE_KEEP;  // never stored
#if FJ_HAS_MASK
  if (cls == FJ_TILE_PARTIAL) {
    const int wq1 = min(wq0 + FJH_WG_ROWS, p.sz.Lq) - 1;
    const int wc = fj_tile_class(p.user, p.sz, b, h, wq0, wq1, kv0,
                                 min(kv0 + FJ_BLOCK_N, p.sz.Lk) - 1);
    return wc == FJ_TILE_FULL ? FJH_TILE_KEEP : FJH_TILE_MASK;
  }
#endif
  (void)b; (void)h; (void)kv0; (void)cls;
  return FJH_TILE_KEEP;
}

// Per-thread view of the accumulator layout of wgmma m64nN: this thread
// holds rows qr and qr + 8 (qr = first row of its warp + lane / 4), and in
// each n8 block i the columns 8 i + 2 (lane % 4) + {0, 1}; element 4 i + e
// is row qr + 8 (e >> 1), column 8 i + 2 (lane % 4) + (e & 1).
//
// score_mod, the mask and the kv bound on S, then the online-softmax update:
// running max (log2 units) and sum, alpha (the factor O must be scaled by)
// and P = exp2(...) in place of S. Same arithmetic as sm80/fwd.cuh.
__device__ __forceinline__ void fjh_softmax(const fj_fwd_params &p, int b, int h, int wq0,
                                            int kv0, int mode, float exp_scale,
                                            float (&s)[FJH_S_REGS], float (&row_m)[2],
                                            float (&row_l)[2], float (&alpha)[2]) {
  const int tid = fj_tid();
  const int t4 = tid & 3;
  // This thread's first row, derived here from a fresh read of tid rather
  // than kept in a register across the kv loop (that spilled at D=128).
  const int qr = wq0 + 16 * ((tid & 127) >> 5) + ((tid & 31) >> 2);
  const int Lk = p.sz.Lk;
  (void)b; (void)h; (void)qr;
#if FJ_HAS_SCORE_MOD
#pragma unroll
  for (int i = 0; i < FJH_S_REGS; ++i) {
    const int qi = qr + 8 * ((i & 3) >> 1);
    const int ki = kv0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
    s[i] = fj_score_mod(p.user, p.sz, s[i] * p.scale, b, h, qi, ki) * FJH_LOG2E;
  }
#endif
  // The mask is evaluated on every element, past Lk too (fj_mask is total;
  // such results are dropped), without a branch per element: with one
  // (a short-circuit around the call) ptxas kept a branch and a
  // convergence barrier per element and a buffer mask's loads ran one after
  // the other; without, they issue together (bench/RESULTS.md, session 4).
#if FJ_HAS_MASK
  if (mode == FJH_TILE_MASK) {
#pragma unroll
    for (int i = 0; i < FJH_S_REGS; ++i) {
      const int ki = kv0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
      const bool keep = fj_mask(p.user, p.sz, b, h, qr + 8 * ((i & 3) >> 1), ki);
      s[i] = keep ? s[i] : fj_neg_inf();
    }
  }
#endif
  if (kv0 + FJ_BLOCK_N > Lk) {
#pragma unroll
    for (int i = 0; i < FJH_S_REGS; ++i) {
      const int ki = kv0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
      if (ki >= Lk) s[i] = fj_neg_inf();
    }
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    // A tree: log2 of the row's length deep instead of a chain through
    // all of it.
    float mt[FJH_S_REGS / 4];
#pragma unroll
    for (int i = 0; i < FJH_S_REGS / 4; ++i)
      mt[i] = fmaxf(s[4 * i + 2 * hh], s[4 * i + 2 * hh + 1]);
    float mx = fjh_max_tree<FJH_S_REGS / 8>::run(mt);
    // The four lanes of a quad hold the row between them.
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_old = row_m[hh];
    // The running max moves only when a score exceeds it by more than the
    // slack; below that, exponents stay at most 2^slack and O keeps its
    // scale (FlashAttention-4's conditional rescaling). l and the LSE use
    // the same stale max, so the result is unchanged but for rounding.
    const float m_cand = mx * exp_scale;
    const float m_new = m_cand > m_old + (float)FJH_RESCALE_SLACK ? m_cand : m_old;
    // m_old = -inf: alpha = 0 (O and l are 0 anyway); both -inf: shift by 0
    // instead of computing (-inf) - (-inf) = NaN, all terms are 0 then.
    alpha[hh] = m_new == m_old ? 1.0f : fj_exp2(m_old - m_new);
    row_m[hh] = m_new;
    const float shift = m_new == fj_neg_inf() ? 0.f : m_new;
    float sum = 0.f;
    fjh_exp_row<0, FJH_S_REGS / 4>::run(s, hh, exp_scale, shift, sum);
    // Row sums of the f32 P (the LSE must be the log of the true sum) stay
    // per lane; the quad is summed once in the epilogue.
    row_l[hh] = row_l[hh] * alpha[hh] + sum;
  }
}

// P (f32, in S's registers) to the A fragments of P V. The accumulator
// layout of S (n8 blocks 2k and 2k+1) is the A-fragment layout of P for k16
// step k: no shared-memory round trip.
__device__ __forceinline__ void fjh_pack_p(const float (&s)[FJH_S_REGS],
                                           unsigned (&pf)[FJH_PK][4]) {
#pragma unroll
  for (int kk = 0; kk < FJH_PK; ++kk) {
    pf[kk][0] = fj_pack2(s[8 * kk + 0], s[8 * kk + 1]);
    pf[kk][1] = fj_pack2(s[8 * kk + 2], s[8 * kk + 3]);
    pf[kk][2] = fj_pack2(s[8 * kk + 4], s[8 * kk + 5]);
    pf[kk][3] = fj_pack2(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// O *= alpha, skipped when no row of the warp moved its max (the common
// case once the first tiles are done).
__device__ __forceinline__ bool fjh_rescale_needed(const float (&alpha)[2]) {
  return __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f);
}
__device__ __forceinline__ void fjh_rescale_by(float (&o)[FJH_O_REGS],
                                               const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < FJH_O_REGS; ++i) o[i] *= alpha[(i & 3) >> 1];
}
__device__ __forceinline__ void fjh_rescale_o(float (&o)[FJH_O_REGS],
                                              const float (&alpha)[2]) {
  if (fjh_rescale_needed(alpha)) fjh_rescale_by(o, alpha);
}

// P V of a tile has completed: O and P may be touched again (P stays put
// until then: its wgmma reads it from registers), and V's stage is free.
__device__ __forceinline__ void fjh_pv_wait(float (&o)[FJH_O_REGS],
                                            unsigned (&pf)[FJH_PK][4], unsigned v_empty) {
  fjh_wgmma_wait<0>();
  fjh_fence_regs(o);
  fjh_fence_regs(pf);
  fjh_mbar_arrive(v_empty);
}
// The end of a steady-state iteration, after the softmax of the next tile:
// wait for P V of the current one, free its V stage, rescale O. The vote
// comes first and each of its branches waits on its own: with the wait in
// the softmax's basic block, ptxas scheduled it (WARPGROUP.DEPBAR) above
// the softmax's exponentials, and the softmax ran after P V instead of
// beside it.
__device__ __forceinline__ void fjh_pv_done(float (&o)[FJH_O_REGS],
                                            unsigned (&pf)[FJH_PK][4],
                                            const float (&alpha)[2], unsigned v_empty) {
  if (fjh_rescale_needed(alpha)) {
    fjh_pv_wait(o, pf, v_empty);
    fjh_rescale_by(o, alpha);
  } else {
    fjh_pv_wait(o, pf, v_empty);
  }
}

// The epilogue's reciprocal and logarithm on the special-function unit: l
// is a sum of exponentials of which the row's largest is at least 1 (2^0 at
// the running max, which only lags the true max), so it is normal and at
// least 1 where it is used; the approximations' relative errors (about
// 2^-23 and 2^-22) are far below O's bf16 rounding and the LSE's tolerance,
// and they drop the IEEE paths' denormal and slow-path branches from every
// item's epilogue.
__device__ __forceinline__ float fjh_rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float fjh_log2(float x) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// The quad's partial row sums of this thread's two rows summed (in place),
// and 1 / l (0 for a row with no allowed pair, whose O is then 0).
__device__ __forceinline__ void fjh_row_sums(float (&row_l)[2], float (&inv_l)[2]) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float l = row_l[hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    row_l[hh] = l;
    inv_l[hh] = l > 0.f ? fjh_rcp(l) : 0.f;
  }
}
// The natural-log LSE of a row from its max (log2 units) and summed l;
// -inf for a row with no allowed pair.
__device__ __forceinline__ float fjh_lse(float m, float l) {
  return l > 0.f ? (m + fjh_log2(l)) * FJH_LN2 : fj_neg_inf();
}

// A consumer's 64 rows of O from shared memory (sq, 128-byte swizzle) to
// global memory, 16 bytes a thread at a time, rows below Lq only: the
// epilogue's copy where O has no tensor map.
__device__ __forceinline__ void fjh_store_o_rows(const fj_fwd_params &p, int b, int h,
                                                 int wq0, unsigned sq) {
  const int tid = threadIdx.x & 127;
  const int Lq = p.sz.Lq;
  fj_u16 *go = (fj_u16 *)p.o + b * p.o_sb + h * p.o_sh;
  constexpr int CH = FJ_HEAD_DIM / 8;  // 16-byte chunks per row
#pragma unroll
  for (int it = 0; it < FJH_WG_ROWS * CH / 128; ++it) {
    const int idx = it * 128 + tid;
    const int r = idx / CH, ch = idx % CH;
    if (wq0 + r < Lq) {
      const unsigned addr = sq + (ch / 8) * (FJ_BLOCK_M * 128) + r * 128 +
                            (((ch % 8) ^ (r & 7)) << 4);
      unsigned v0, v1, v2, v3;
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(addr));
      fj_st_global_v4(go + (long long)(wq0 + r) * p.o_ss + ch * 8, v0, v1, v2, v3);
    }
  }
}

// In the persistent kernel with two Q buffers the storing thread does not
// wait for the TMA store to read the item's Q buffer before the next item;
// it waits, and frees the buffer for the producer, once it has issued the
// next item's first Q K^T (fjh_release_q): the buffer's next Q is an item
// away.
#define FJH_EPI_DEFER FJH_PERSIST_EPI_SMEM

// Epilogue of consumer c: O / l into its 64 rows of the Q area (the Q tile
// is dead once its last Q K^T completed), then to global memory (a TMA
// store issued by its thread 0, which waits only until the copy has read
// the buffer, or where O has no tensor map 16-byte coalesced stores of the
// rows below Lq by all its threads), and the LSE.
// defer: thread 0 leaves the wait for the store's reads to its caller
// (fjh_release_q).
__device__ __forceinline__ void fjh_epilogue(const fj_fwd_params &p, const fj_tma_maps &maps,
                                             int c, int b, int h, int wq0, unsigned sq,
                                             float (&o)[FJH_O_REGS], const float (&row_m)[2],
                                             float (&row_l)[2], bool defer = false) {
  const int tid = threadIdx.x & 127;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  float inv_l[2];
  fjh_row_sums(row_l, inv_l);
  // Every warp of this consumer is past its last wgmma before Q is reused.
  fjh_bar_sync(FJH_BAR_EPI + c, 128);
  // One stmatrix.x4 stores four 8 x 8 blocks: 8-column groups i and i + 1,
  // rows g and g + 8 of the warp's 16 (the accumulator's own layout); lane
  // l gives the address of row l % 8 of block l / 8 (measured as fast as a
  // 32-bit store per element pair, with 8 instructions instead of 64 at
  // D=128: bench/RESULTS.md, session 5, run 4).
  const int mi = lane >> 3, rr = lane & 7;
  const int sr = 16 * warp + rr + 8 * (mi & 1);  // its row; sr & 7 == rr
#pragma unroll
  for (int i = 0; i < FJH_O_REGS / 4; i += 2) {
    const int d = 8 * (i + (mi >> 1));
    const unsigned addr =
        sq + (d / 64) * (FJ_BLOCK_M * 128) + sr * 128 + ((((d % 64) / 8) ^ rr) << 4);
    const unsigned v0 = fj_pack2(o[4 * i] * inv_l[0], o[4 * i + 1] * inv_l[0]);
    const unsigned v1 = fj_pack2(o[4 * i + 2] * inv_l[1], o[4 * i + 3] * inv_l[1]);
    const unsigned v2 = fj_pack2(o[4 * i + 4] * inv_l[0], o[4 * i + 5] * inv_l[0]);
    const unsigned v3 = fj_pack2(o[4 * i + 6] * inv_l[1], o[4 * i + 7] * inv_l[1]);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(addr), "r"(v0), "r"(v1), "r"(v2), "r"(v3) : "memory");
  }
  if (maps.o_ok) {
    // The stmatrix writes (generic proxy) before the TMA's reads (async).
    fjh_fence_proxy_async();
    fjh_bar_sync(FJH_BAR_EPI + c, 128);
    if (tid == 0) {
#pragma unroll
      for (int ch = 0; ch < FJH_CHUNKS64; ++ch)
        fjh_tma_store_4d(&maps.o, sq + ch * (FJ_BLOCK_M * 128), ch * 64, wq0, h, b);
      fjh_bulk_commit();
      if (!defer) fjh_bulk_wait_read();  // the buffer is free again
    }
  } else {
    fjh_bar_sync(FJH_BAR_EPI + c, 128);
    fjh_store_o_rows(p, b, h, wq0, sq);
  }
  const int Lq = p.sz.Lq;
#ifndef FJ_TRACE
  if (p.lse != nullptr && t4 == 0) {
    float *gl = p.lse + b * p.lse_sb + h * p.lse_sh;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int qi = wq0 + 16 * warp + g + 8 * hh;
      if (qi < Lq) {
        gl[qi] = fjh_lse(row_m[hh], row_l[hh]);
      }
    }
  }
#endif
}

#if FJ_PERSISTENT
// Epilogue of the persistent kernel: O / l straight from registers to
// global memory (each quad of lanes writes 16 contiguous bytes of a row),
// without the Q area, which the producer refills with the next item's Q
// while this runs.
__device__ __forceinline__ void fjh_epilogue_regs(const fj_fwd_params &p, int b, int h,
                                                  int wq0, const float (&o)[FJH_O_REGS],
                                                  const float (&row_m)[2],
                                                  float (&row_l)[2]) {
  const int tid = threadIdx.x & 127;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int Lq = p.sz.Lq;
  fj_u16 *go = (fj_u16 *)p.o + b * p.o_sb + h * p.o_sh;
  float inv_l[2];
  fjh_row_sums(row_l, inv_l);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int qi = wq0 + 16 * warp + g + 8 * hh;
    if (qi < Lq) {
      unsigned *row = (unsigned *)(go + (long long)qi * p.o_ss) + t4;
#pragma unroll
      for (int i = 0; i < FJH_O_REGS / 4; ++i)
        row[4 * i] =
            fj_pack2(o[4 * i + 2 * hh] * inv_l[hh], o[4 * i + 2 * hh + 1] * inv_l[hh]);
#ifndef FJ_TRACE
      if (p.lse != nullptr && t4 == 0)
        p.lse[b * p.lse_sb + h * p.lse_sh + qi] = fjh_lse(row_m[hh], row_l[hh]);
#endif
    }
  }
}

// Epilogue of a work item without tiles: O = 0 and LSE = -inf for the
// consumer's rows below Lq, without shared memory.
__device__ __forceinline__ void fjh_epilogue_empty(const fj_fwd_params &p, int b, int h,
                                                   int wq0) {
  const int tid = threadIdx.x & 127;
  const int Lq = p.sz.Lq;
  fj_u16 *go = (fj_u16 *)p.o + b * p.o_sb + h * p.o_sh;
  constexpr int CH = FJ_HEAD_DIM / 8;  // 16-byte chunks per row
  for (int idx = tid; idx < FJH_WG_ROWS * CH; idx += 128) {
    const int r = idx / CH, ch = idx % CH;
    if (wq0 + r < Lq)
      fj_st_global_v4(go + (long long)(wq0 + r) * p.o_ss + ch * 8, 0u, 0u, 0u, 0u);
  }
  if (p.lse != nullptr && tid < FJH_WG_ROWS && wq0 + tid < Lq)
    p.lse[b * p.lse_sb + h * p.lse_sh + wq0 + tid] = fj_neg_inf();
}
#endif

// FJH_EPI_DEFER: the storing thread's arrival on the Q buffer of the
// previous item (q_pending, -1 when none), once the TMA store that read it
// is done reading.
__device__ __forceinline__ void fjh_release_q(const fjh_smem_map &sm, int &q_pending) {
#if FJH_EPI_DEFER
  if (q_pending >= 0) {
    fjh_bulk_wait_read();
    fjh_mbar_arrive(sm.q_empty(q_pending));
    q_pending = -1;
  }
#else
  (void)sm;
  (void)q_pending;
#endif
}

#if FJH_PERSIST_EPI_SMEM
// The persistent kernel's epilogue of item kq for consumer c: O through the
// item's Q buffer (its Q K^T are done), then the buffer is the producer's
// again. The stmatrix writes (generic proxy) come before the next TMA load
// into it (async proxy): fence, then arrive; with FJH_EPI_DEFER the storing
// thread's arrival waits in q_pending for its store (fjh_release_q).
__device__ __forceinline__ void fjh_epilogue_item(const fj_fwd_params &p,
                                                  const fj_tma_maps &maps,
                                                  const fjh_smem_map &sm, int c, int b, int h,
                                                  int wq0, int kq, float (&o)[FJH_O_REGS],
                                                  const float (&row_m)[2], float (&row_l)[2],
                                                  int &q_pending) {
  const int qb = kq % FJ_Q_BUFS;
  const bool defer = FJH_EPI_DEFER && maps.o_ok;
  // A guard: q_pending is -1 here on every path of fjh_consume (the item's
  // first Q K^T released the one before). Left in because removing it
  // reschedules the persistent kernels, which were measured with it.
  fjh_release_q(sm, q_pending);
  fjh_epilogue(p, maps, c, b, h, wq0, sm.q_tile(qb) + c * FJH_WG_ROWS * 128, o, row_m, row_l,
               defer);
  fjh_fence_proxy_async();
  if (defer && (threadIdx.x & 127) == 0)
    q_pending = qb;
  else
    fjh_mbar_arrive(sm.q_empty(qb));
}
#endif

// Consumer c (0 .. FJH_NC - 1) owns query rows q0 + 64 c .. + 63 of the
// CTA's tile.
// n as for fjh_produce; kq: the item's number among the CTA's items (0 in
// the non-persistent kernel), which picks the Q buffer and its phase.
__device__ __forceinline__ void fjh_consume(const fj_fwd_params &p, const fj_tma_maps &maps,
                                            const fjh_smem_map &sm, int c, int b, int h,
                                            int q0, int q1, int lo, int hi, int hi_cls, int t,
                                            int &n_io, int kq, int &q_pending) {
  const int wq0 = q0 + FJH_WG_ROWS * c;
  const int qb = kq % FJ_Q_BUFS;
  const unsigned q_ph = (unsigned)(kq / FJ_Q_BUFS) & 1u;
  const unsigned sq = sm.q_tile(qb) + c * FJH_WG_ROWS * 128;
#ifdef FJ_TRACE
  unsigned fjh_tr[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int fjh_ntiles = 0;
  float *fjh_trg =
      (threadIdx.x & 127) == 0 ? fjh_trace_slots(p, b, h, q0, 32 * c) : nullptr;
  FJH_TR(0);
#endif
  float o[FJH_O_REGS];
#pragma unroll
  for (int i = 0; i < FJH_O_REGS; ++i) o[i] = 0.f;
  float row_m[2] = {fj_neg_inf(), fj_neg_inf()}, row_l[2] = {0.f, 0.f};
  // Without a score_mod the exponent is fma(qk, scale_log2, -m) and the max
  // is taken on unscaled q.k; with one, scores are in log2 units already.
#if FJ_HAS_SCORE_MOD
  const float exp_scale = 1.0f;
#else
  const float exp_scale = p.scale_log2;
#endif

  if (lo <= hi) {
    float s[FJH_S_REGS];  // written first by fjh_wgmma_ss<true>
    unsigned pf[FJH_PK][4];
    float alpha[2];
#if FJ_PINGPONG
    // Consumer 0 goes first (once a CTA with FJH_SCHED_CARRY).
    if (c == FJH_NC - 1 && !FJH_SCHED_CARRY) fjh_bar_arrive(FJH_BAR_SCHED + 0, 256);
#endif
    fjh_mbar_wait_warp(sm.q_full(qb), q_ph);
    FJH_TR(1);
    int n = n_io, j = hi, cls = hi_cls;
    // Descriptor low words: this consumer's Q rows, and stage 0 of K and V
    // (stage s is s * FJH_KV_BYTES further).
    const unsigned dq = fjh_desc_lo(sq, 16);
    const unsigned dk = fjh_desc_lo(sm.k, 16), dv = fjh_desc_lo(sm.v, FJ_BLOCK_N * 128);
    constexpr unsigned DS = FJH_KV_BYTES >> 4;
    fjh_stage st0 = fjh_stage_of(n);  // tile j's stage, st1 the next tile's
#if FJ_INTRA_WG_OVERLAP
    // Tile 0: S alone.
    fjh_sched_wait(c);
    fjh_mbar_wait_warp(sm.k_full(st0.s), st0.ph);
    FJH_TR(2);
    fjh_wgmma_fence();
    fjh_issue_qk(s, dq, dk + st0.s * DS);
    fjh_wgmma_commit();
    fjh_sched_arrive(c, false);
    fjh_release_q(sm, q_pending);
    fjh_wgmma_wait<0>();
    fjh_fence_regs(s);
    fjh_mbar_arrive(sm.k_empty(st0.s));
    fjh_softmax(p, b, h, wq0, j * FJ_BLOCK_N, fjh_tile_mode(p, b, h, wq0, j * FJ_BLOCK_N, cls),
                exp_scale, s, row_m, row_l, alpha);
    fjh_pack_p(s, pf);
    FJH_TR(3);
    int cls_n;
    int jn = fjh_advance(p, b, h, q0, q1, j, lo, &t, &cls_n, kq);
    fjh_stage st1 = fjh_stage_next(st0);
    int mode_n = jn >= lo ? fjh_tile_mode(p, b, h, wq0, jn * FJ_BLOCK_N, cls_n) : 0;
    // Steady state: Q K^T of tile jn and P V of tile j in flight together;
    // the softmax of jn runs while P V of j is still on the tensor cores. No
    // register an in-flight wgmma reads or writes is defined in between: P
    // is packed and O rescaled only after P V completed (ptxas would
    // serialize every wgmma of the kernel otherwise, C7513).
    while (jn >= lo) {
#ifdef FJ_TRACE
      // Loop iterations 1 and 2: nine stamps each (bench/trace.py).
      const int fjh_it = n - n_io;
      const int fjh_k = fjh_it == 1 || fjh_it == 2 ? 8 + 9 * (fjh_it - 1) : -1;
#endif
      FJH_TRL(0);
      FJH_TRL(1);
      fjh_sched_wait(c);
      FJH_TRL(2);
      fjh_mbar_wait_warp(sm.k_full(st1.s), st1.ph);
      FJH_TRL(3);
      fjh_wgmma_fence();
      fjh_issue_qk(s, dq, dk + st1.s * DS);
      fjh_wgmma_commit();
      fjh_mbar_wait_warp(sm.v_full(st0.s), st0.ph);
      fjh_issue_pv(o, pf, dv + st0.s * DS);
      fjh_wgmma_commit();
      fjh_sched_arrive(c, false);
      // The tile after jn and its mode while the tensor cores work: the
      // walk (a block mask's list in shared memory, or the classifier)
      // needs nothing of S, and its latency hides behind the GEMMs.
      const int j_after = fjh_advance(p, b, h, q0, q1, jn, lo, &t, &cls_n, kq);
      const int mode_after =
          j_after >= lo ? fjh_tile_mode(p, b, h, wq0, j_after * FJ_BLOCK_N, cls_n) : 0;
      FJH_TRL(4);
      fjh_wgmma_wait<1>();  // S of tile jn is ready, P V of tile j runs on
      fjh_fence_regs(s);
      FJH_TRL(5);
      fjh_mbar_arrive(sm.k_empty(st1.s));
      fjh_softmax(p, b, h, wq0, jn * FJ_BLOCK_N, mode_n, exp_scale, s, row_m, row_l, alpha);
      FJH_TRL(6);
      fjh_pv_done(o, pf, alpha, sm.v_empty(st0.s));
      FJH_TRL(7);
      fjh_pack_p(s, pf);
      j = jn;
      ++n;
      st0 = st1;
      st1 = fjh_stage_next(st1);
      jn = j_after;
      mode_n = mode_after;
      FJH_TRL(8);
    }
    // Last tile: P V alone.
    FJH_TR(4);
#if FJ_PERSISTENT && !FJH_PERSIST_EPI_SMEM
    // Every Q K^T of the item has completed: the producer may load Q into
    // this buffer again.
    fjh_mbar_arrive(sm.q_empty(qb));
#endif
    fjh_sched_wait(c);
    fjh_mbar_wait_warp(sm.v_full(st0.s), st0.ph);
    fjh_wgmma_fence();
    fjh_issue_pv(o, pf, dv + st0.s * DS);
    fjh_wgmma_commit();
    fjh_sched_arrive(c, true);
    fjh_pv_wait(o, pf, sm.v_empty(st0.s));
    FJH_TR(5);
#ifdef FJ_TRACE
    fjh_ntiles = n + 1 - n_io;
#endif
    n_io = n + 1;  // n was the last tile
#else
    // Without the overlap: S, softmax, P V, one tile after the other.
    fjh_release_q(sm, q_pending);
    while (j >= lo) {
      int cls_n;
      const int jn = fjh_advance(p, b, h, q0, q1, j, lo, &t, &cls_n, kq);
      fjh_sched_wait(c);
      fjh_mbar_wait_warp(sm.k_full(st0.s), st0.ph);
      fjh_wgmma_fence();
      fjh_issue_qk(s, dq, dk + st0.s * DS);
      fjh_wgmma_commit();
      fjh_sched_arrive(c, jn < lo);
      fjh_wgmma_wait<0>();
      fjh_fence_regs(s);
      fjh_mbar_arrive(sm.k_empty(st0.s));
      fjh_softmax(p, b, h, wq0, j * FJ_BLOCK_N,
                  fjh_tile_mode(p, b, h, wq0, j * FJ_BLOCK_N, cls), exp_scale, s, row_m,
                  row_l, alpha);
      fjh_rescale_o(o, alpha);
      fjh_pack_p(s, pf);
      fjh_mbar_wait_warp(sm.v_full(st0.s), st0.ph);
      fjh_wgmma_fence();
      fjh_issue_pv(o, pf, dv + st0.s * DS);
      fjh_wgmma_commit();
      fjh_pv_wait(o, pf, sm.v_empty(st0.s));
      j = jn;
      cls = cls_n;
      ++n;
      st0 = fjh_stage_next(st0);
    }
#ifdef FJ_TRACE
    fjh_ntiles = n - n_io;
#endif
    n_io = n;  // one past the last tile
#if FJ_PERSISTENT && !FJH_PERSIST_EPI_SMEM
    fjh_mbar_arrive(sm.q_empty(qb));  // as above: the item's Q K^T are done
#endif
#endif
  }
#if FJ_PERSISTENT
  if (lo > hi) {
    // No tile: the item's Q was loaded all the same (the producer issues it
    // before the scan); once it has landed the buffer is free again. O = 0
    // and LSE = -inf straight to global memory.
    fjh_release_q(sm, q_pending);
    fjh_mbar_wait_warp(sm.q_full(qb), q_ph);
    fjh_mbar_arrive(sm.q_empty(qb));
    fjh_epilogue_empty(p, b, h, wq0);
    return;
  }
#if FJH_PERSIST_EPI_SMEM
  fjh_epilogue_item(p, maps, sm, c, b, h, wq0, kq, o, row_m, row_l, q_pending);
#else
  fjh_epilogue_regs(p, b, h, wq0, o, row_m, row_l);
#endif
#else
  // A row without tiles still had its Q loaded (at the start of the
  // kernel): the epilogue writes over the Q area only once it has landed.
  if (lo > hi) fjh_mbar_wait_warp(sm.q_full(0), 0);
  fjh_epilogue(p, maps, c, b, h, wq0, sq, o, row_m, row_l);
#endif
#ifdef FJ_TRACE
  FJH_TR(6);
  if (fjh_trg != nullptr) {
    for (int k = 0; k < 7; ++k) fjh_trg[k] = __uint_as_float(fjh_tr[k]);
    fjh_trg[7] = __uint_as_float((unsigned)fjh_ntiles);
  }
#endif
}

// The dynamic shared memory's map (Q buffers, K stages, V stages, barriers).
__device__ __forceinline__ fjh_smem_map fjh_smem_layout(unsigned char *smem) {
  fjh_smem_map sm;
  sm.q = (fj_smem_u32(smem) + 1023u) & ~1023u;  // swizzle atoms: 1024-aligned
  sm.k = sm.q + FJ_Q_BUFS * FJH_Q_BYTES;
  sm.v = sm.k + FJ_NUM_STAGES * FJH_KV_BYTES;
  sm.bar = sm.v + FJ_NUM_STAGES * FJH_KV_BYTES;
  return sm;
}

// Thread 0 initializes the Q and K/V barriers (the caller synchronizes).
__device__ __forceinline__ void fjh_init_pipeline_barriers(const fjh_smem_map &sm) {
  fjh_mbar_init(sm.q_full(0), 1);
  for (int s = 0; s < FJ_NUM_STAGES; ++s) {
    fjh_mbar_init(sm.k_full(s), 1);
    fjh_mbar_init(sm.v_full(s), 1);
    fjh_mbar_init(sm.k_empty(s), 128 * FJH_NC);  // every consumer thread arrives
    fjh_mbar_init(sm.v_empty(s), 128 * FJH_NC);
  }
}

#if FJ_PERSISTENT
// ---- persistent kernel ------------------------------------------------------
// gridDim.x CTAs (the host launches min(SMs, work items)) share the work
// items, query block m of head h, batch b, in the order of fjh_item, each
// CTA taking the next one when it is free (fjh_next_item). One producer
// warp finds each item's tiles and hands them to the consumers through a
// two-slot ring; three producer threads stream Q, K and V
// (fjh_produce_all); the K/V stages and their phases run on from item to
// item, and so does the ping-pong turn (FJH_SCHED_CARRY). Q has two buffers
// where shared memory allows (FJ_Q_BUFS): the next item's Q is in place
// before this one ends, and O leaves through the item's own buffer
// (FJH_PERSIST_EPI_SMEM). With one (D=256), Q loads once both consumers
// have issued their last Q K^T, and the epilogue writes O from registers.

__device__ __forceinline__ int fjh_num_m(const fj_fwd_params &p) {
  return (p.sz.Lq + FJ_BLOCK_M - 1) / FJ_BLOCK_M;
}
// The item at position i of the order: the query blocks of one head from
// the last down (under a causal mask, the longest rows first), then the
// next head: the CTAs at work at one time share a head's K and V in L2
// (all heads' query block m together was measured 24% slower on full
// attention, bench/RESULTS.md, session 4).
//
// In masked kernels the first FJH_TAIL_ROWS query blocks of every head come
// last, block FJH_TAIL_ROWS - 1 of each head, then the block before, ...,
// after all the other items in the order above. Under causal, sliding-window or document masks those
// rows are the shortest, and a run of short items at the end evens out
// when the CTAs finish (with equal items, as under a sliding window, the
// last wave otherwise leaves most CTAs idle for up to an item); their K and
// V are a few tiles a head, which stay in L2. Full attention, whose rows
// are all alike and read all of K and V, keeps the head-by-head order.
#define FJH_TAIL_ROWS 8
__device__ __forceinline__ fjh_work fjh_item(const fj_fwd_params &p, int i) {
  const int nm = fjh_num_m(p);
#if FJ_HAS_MASK
  const int nt = min(nm, FJH_TAIL_ROWS), nh = nm - nt;  // tail rows, head rows
  const int hbs = p.sz.Hq * p.sz.B;
  if (i >= nh * hbs) {
    const int r = i - nh * hbs, k = r / hbs, hb = r - k * hbs;
    return fjh_work{nt - 1 - k, hb % p.sz.Hq, hb / p.sz.Hq};
  }
  const int hb = i / nh;
  return fjh_work{nm - 1 - (i - hb * nh), hb % p.sz.Hq, hb / p.sz.Hq};
#else
  const int hb = i / nm;
  return fjh_work{nm - 1 - (i - hb * nm), hb % p.sz.Hq, hb / p.sz.Hq};
#endif
}
// Position of this CTA's k-th item: rounds of gridDim.x positions, every
// other round in reverse (a snake), so that where rows shorten along the
// order each CTA's items add up to about the same work (a static stand-in
// for longest-processing-time-first). Increasing in k.
__device__ __forceinline__ int fjh_item_pos(int k) {
  const int g = (int)gridDim.x, x = (int)blockIdx.x;
  return k * g + ((k & 1) ? g - 1 - x : x);
}
// With a work counter (maps.sched), a CTA's first item is its blockIdx.x
// and each next one the counter's next value plus gridDim.x: whichever CTA
// is free first takes the next item of the order, as the hardware deals out
// the non-persistent kernel's CTAs. Without one (a device without memory
// pools), the static snake of fjh_item_pos. Called by all of warp 0 for its
// k-th item (k = 0, 1, ... in turn).
__device__ __forceinline__ int fjh_next_item(const fj_tma_maps &maps, int k, int lane) {
  if (maps.sched != nullptr) {
    if (k == 0) return (int)blockIdx.x;
    int i = 0;
    if (lane == 0) i = atomicAdd(maps.sched, 1);
    return __shfl_sync(0xffffffffu, i, 0) + (int)gridDim.x;
  }
  return fjh_item_pos(k);
}

// The producer warpgroup over the CTA's items: warp 0 takes each item, finds
// its tiles (all its lanes classify, or copy its block-mask row) and hands
// it to the consumers and to warps 1 and 2 through a two-slot ring, and its
// lane 0 loads K; lane 0 of warp 1 loads every item's Q as soon as its
// buffer is free, lane 0 of warp 2 loads V. Each walks the items' tiles on
// its own: none waits behind another's load.
__device__ __forceinline__ int fjh_num_items(const fj_fwd_params &p) {
  return fjh_num_m(p) * p.sz.Hq * p.sz.B;
}
__device__ __forceinline__ void fjh_produce_all(const fj_fwd_params &p,
                                                const fj_tma_maps &maps,
                                                const fjh_smem_map &sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  fjh_persist &ps = fjh_persist_smem();
  const int total = fjh_num_items(p);
  if (warp == 1) {
    if (lane != 0) return;
    fjh_tma_prefetch_desc(&maps.q);
    // Every item's Q is loaded (an item without tiles too: its consumers
    // wait for it and free the buffer), into buffer k % FJ_Q_BUFS once the
    // consumers are done with that buffer's previous item. The item comes
    // from the ring (its slot is not reused before the consumers have
    // finished that item, which needs this Q: no arrival from here).
    for (int k = 0;; ++k) {
      fjh_mbar_wait(sm.item_full(k & 1), (k >> 1) & 1);
      const int item = fjh_item_read(k & 1).item;
      if (item < 0) break;
      const fjh_work w = fjh_item(p, item);
      const int qb = k % FJ_Q_BUFS;
      fjh_mbar_wait(sm.q_empty(qb), ((unsigned)(k / FJ_Q_BUFS) & 1u) ^ 1u);
      fjh_load_q(maps, sm, qb, w.b, w.h, w.m * FJ_BLOCK_M);
    }
    return;
  }
  if (warp == 2) {
    if (lane != 0) return;
    fjh_tma_prefetch_desc(&maps.v);
    int n = 0;
    for (int k = 0;; ++k) {
      const int slot = k & 1;
      fjh_mbar_wait(sm.item_full(slot), (k >> 1) & 1);
      const fjh_item_tiles it = fjh_item_read(slot);
      if (it.item < 0) break;
      const fjh_work w = fjh_item(p, it.item);
      const int q0 = w.m * FJ_BLOCK_M, q1 = min(q0 + FJ_BLOCK_M, p.sz.Lq) - 1;
      fjh_produce_one(p, maps, sm, 1, w.b, w.h, q0, q1, it.lo, it.hi, it.t, n, k);
      // The walk read the slot's block-mask row until here.
      fjh_mbar_arrive(sm.item_empty(slot));
    }
    return;
  }
  if (warp != 0) return;
  if (lane == 0) fjh_tma_prefetch_desc(&maps.k);
  const int Lq = p.sz.Lq, Lk = p.sz.Lk;
  int n = 0, k = 0;
  for (int item = fjh_next_item(maps, 0, lane); item < total;
       item = fjh_next_item(maps, ++k, lane)) {
#ifdef FJ_TRACE
    unsigned fjh_tr[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    FJH_TR(0);
#endif
    const fjh_work w = fjh_item(p, item);
    const int q0 = w.m * FJ_BLOCK_M, q1 = min(q0 + FJ_BLOCK_M, Lq) - 1;
    int lo = 0, hi = (Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N - 1, hi_cls = FJ_TILE_FULL, t = 0;
    const int slot = k & 1;
    if (p.bm_kv_num != nullptr) {
      // The item's block-mask row into the slot's copy (fjh_bm_cache(k)),
      // once every reader of the slot's previous item is done with it.
      fjh_mbar_wait(sm.item_empty(slot), ((k >> 1) & 1) ^ 1);
      fjh_bm_fill(p, w.b, w.h, q0, fjh_bm_cache(k), lane, 32);
      __syncwarp();
      hi = fjh_bm_tile(p, w.b, w.h, q0, &t, &hi_cls, k);
    } else {
#if FJ_HAS_MASK
      int first, last;
      fj_tile_scan_warp(p, w.b, w.h, q0, q1, (Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N, lane, 32,
                        &first, &last);
      fj_tile_range_of(first, last, &lo, &hi, &hi_cls);
#endif
    }
    if (lane == 0) {
      // Free once both consumers and the V thread are done with its item.
      fjh_mbar_wait(sm.item_empty(slot), ((k >> 1) & 1) ^ 1);
      ps.item[slot] = fjh_item_tiles{item, lo, hi, hi_cls, t};
      fjh_mbar_arrive(sm.item_full(slot));  // release: the slot is written
      FJH_TR(1);
#ifdef FJ_TRACE
      const int n0 = n;
#endif
      fjh_produce_one(p, maps, sm, 0, w.b, w.h, q0, q1, lo, hi, t, n, k);
#ifdef FJ_TRACE
      FJH_TR(2);
      fjh_trace_producer(p, w.b, w.h, q0, fjh_tr, n - n0);
#endif
    }
    __syncwarp();
  }
  // No more items: a last slot tells the other roles so.
  if (lane == 0) {
    const int slot = k & 1;
    fjh_mbar_wait(sm.item_empty(slot), ((k >> 1) & 1) ^ 1);
    ps.item[slot] = fjh_item_tiles{-1, 0, -1, FJ_TILE_FULL, 0};
    fjh_mbar_arrive(sm.item_full(slot));
  }
}

// The shared-memory map with the persistent kernel's own barriers.
__device__ __forceinline__ fjh_smem_map fjh_persist_layout(unsigned char *smem) {
  fjh_smem_map sm = fjh_smem_layout(smem);
  sm.pbar = fj_smem_u32(&fjh_persist_smem().bar[0]);
  return sm;
}

// Consumer warpgroup c over the same items.
__device__ __forceinline__ void fjh_consume_all(const fj_fwd_params &p,
                                                const fj_tma_maps &maps,
                                                const fjh_smem_map &sm, int c) {
  int n = 0;
#if FJH_SCHED_CARRY
  // The ping-pong ring runs across items: consumer 0 takes the first turn;
  // consumer 1's last arrival is matched by the bar.sync after the loop.
  if (c == FJH_NC - 1) fjh_bar_arrive(FJH_BAR_SCHED + 0, 256);
#endif
  // Only k, n and q_pending (FJH_EPI_DEFER) live across an item (the rest
  // is recomputed from the parameters): these registers come out of the
  // softmax's.
  int q_pending = -1;
  for (int k = 0;; ++k) {
    const int slot = k & 1;
    fjh_mbar_wait_warp(sm.item_full(slot), (k >> 1) & 1);
    const fjh_item_tiles it = fjh_item_read(slot);
    if (it.item < 0) break;
    const fjh_work w = fjh_item(p, it.item);
    const int q0 = w.m * FJ_BLOCK_M, q1 = min(q0 + FJ_BLOCK_M, p.sz.Lq) - 1;
    fjh_consume(p, maps, sm, c, w.b, w.h, q0, q1, it.lo, it.hi, it.hi_cls, it.t, n, k,
                q_pending);
    // The walk read the slot's block-mask row until here.
    fjh_mbar_arrive(sm.item_empty(slot));
  }
  fjh_release_q(sm, q_pending);  // the last store has read shared memory
#if FJH_SCHED_CARRY
  if (c == 0) fjh_sched_wait(0);
#endif
}

extern "C" __global__ void __launch_bounds__(FJH_THREADS, 1)
fj_attention_fwd(const __grid_constant__ fj_fwd_params p,
                 const __grid_constant__ fj_tma_maps maps) {
  extern __shared__ __align__(1024) unsigned char fjh_smem[];
  if (threadIdx.x == 0) {
    const fjh_smem_map sm = fjh_persist_layout(fjh_smem);
    fjh_init_pipeline_barriers(sm);
    fjh_mbar_init(sm.q_full(1), 1);
    fjh_mbar_init(sm.q_empty(0), 256);
    fjh_mbar_init(sm.q_empty(1), 256);
    for (int s = 0; s < 2; ++s) {
      fjh_mbar_init(sm.item_full(s), 1);
      fjh_mbar_init(sm.item_empty(s), 257);  // the consumers and the V thread
    }
    fjh_fence_barrier_init();
  }
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
  // The map is computed after the register reallocation, in each role:
  // values live across setmaxnreg went through local memory.
  if (wg == 0) {
    fjh_setmaxnreg_dec<FJ_PRODUCER_REGS>();
    if (threadIdx.x < 96) fjh_produce_all(p, maps, fjh_persist_layout(fjh_smem));
  } else {
    fjh_setmaxnreg_inc<FJ_CONSUMER_REGS>();
    fjh_consume_all(p, maps, fjh_persist_layout(fjh_smem), wg - 1);
  }
}
#else  // !FJ_PERSISTENT

extern "C" __global__ void __launch_bounds__(FJH_THREADS, 1)
fj_attention_fwd(const __grid_constant__ fj_fwd_params p,
                 const __grid_constant__ fj_tma_maps maps) {
  extern __shared__ __align__(1024) unsigned char fjh_smem[];
  const fjh_smem_map sm = fjh_smem_layout(fjh_smem);
#ifdef FJ_TRACE
  unsigned fjh_tr[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  FJH_TR(0);
#endif

  const fjh_work w = fjh_work_of_cta();
  const int m_block = w.m, h = w.h, b = w.b;
  const int Lq = p.sz.Lq, Lk = p.sz.Lk;
  const int q0 = m_block * FJ_BLOCK_M;
  const int q1 = min(q0 + FJ_BLOCK_M, Lq) - 1;

  // Q is on its way before the CTA looks for its tiles: its load latency
  // (about 1 us) overlaps the scan below. The barriers are initialized
  // first; the __syncthreads after the scan publishes them to the others.
  if (threadIdx.x == 0) {
    fjh_init_pipeline_barriers(sm);
    fjh_fence_barrier_init();
    fjh_tma_prefetch_desc(&maps.k);
    fjh_tma_prefetch_desc(&maps.v);
    fjh_load_q(maps, sm, 0, b, h, q0);
  }

  // kv blocks [lo, hi] that are not EMPTY for the CTA, walked from hi down
  // (a causal diagonal first). Every role computes the same walk. With a
  // block mask, hi is the first listed tile (t its position) or -1 for a
  // row with none, and fjh_advance follows the lists from there.
  int lo = 0, hi = (Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N - 1;
  int hi_cls = FJ_TILE_FULL;
  int t = 0;
  if (p.bm_kv_num != nullptr) {
    fjh_bm_stage(p, b, h, q0);
    hi = fjh_bm_tile(p, b, h, q0, &t, &hi_cls, 0);
  } else {
#if FJ_HAS_MASK
    fj_tile_range(p, b, h, q0, q1, &lo, &hi, &hi_cls);
#endif
  }
  __syncthreads();

  // The role must be warp-uniform for setmaxnreg (.aligned): take lane 0's.
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
  if (wg == 0) {
    fjh_setmaxnreg_dec<FJ_PRODUCER_REGS>();
    int n = 0;
    FJH_TR(1);
    if (threadIdx.x == 0 && lo <= hi) fjh_produce(p, maps, sm, b, h, q0, q1, lo, hi, t, n);
#ifdef FJ_TRACE
    FJH_TR(2);
    if (threadIdx.x == 0) fjh_trace_producer(p, b, h, q0, fjh_tr, n);
#endif
  } else {
    fjh_setmaxnreg_inc<FJ_CONSUMER_REGS>();
    int n = 0;
    int q_pending = -1;
    fjh_consume(p, maps, sm, wg - 1, b, h, q0, q1, lo, hi, hi_cls, t, n, 0, q_pending);
  }
}
#endif  // FJ_PERSISTENT
