// templates/common/bwd_order.cuh: the order of the backward's dQ additions
// to a query tile of dq_accum, which is not zeroed where the first of them
// is a store (FJB_DQ_FIRST_STORE: every sm90 kernel, and the deterministic
// mode on every template; docs/backward.md). Two disciplines over one
// semaphore a query tile:
//   - the deterministic mode's fixed order (FJ_DETERMINISTIC, below);
//   - the default mode's first claim (fjb_claim_*, at the end): the kv
//     tiles add in arrival order; the first to claim the tile stores, and
//     the others add once that store is done.
//
// The deterministic order. Every kv tile whose walk (common/bwd_walk.cuh)
// holds a work item (query head h, query tile i) adds its part of dQ to
// tile i's rows of dq_accum. Added in arrival order, the fp32 sum rounds
// differently from run to run; here the kv tiles of a (batch, kv head) add
// to a query tile one after another in descending kv-tile order. The
// scratch holds a semaphore per (b, h, i) (fjb_order_sem, zeroed by the pre
// kernel): the number of kv tiles that have added to the tile. Kv tile n
// computes its rank, the number of kv tiles above n whose walks hold (h,
// i) (fjb_order_rank), waits until the semaphore reaches it, adds (stores,
// at rank 0), and sets it to rank + 1.
//
// Deadlock freedom. The main kernel (sm80's, or sm90's one-tile kernel:
// the persistent one takes no part) runs kv tile n of (kv head hk, batch b)
// in CTA (nk - 1 - n, hk, b) (fjb_cta_kv_tile), so a CTA waits only on
// CTAs of its own y and z and a smaller x, which come before it in linear
// blockIdx order (x fastest), the order in which the hardware dispatches
// CTAs: once a CTA waits, those before it have started or finished (the
// assumption every semaphore-ordered reduction on GPUs makes). The lowest unfinished CTA
// thus waits on finished ones only. The query heads of a GQA group are
// items of one CTA. No CTA waits for a kv tile that will not add: the rank
// counts exactly the walks that hold (h, i), with the walk's classification
// (fjb_pair_class) or, with a block mask, the mask's lists per query block
// (the transposes of the lists the walk reads; fj_block_mask_build
// compacts both from one classification). In a packed batch nk is the
// launch's (max_seqlen_k); the CTAs of kv tiles past a shorter sequence's
// end return at once, and the rank counts only tiles below the sequence's
// own, which all run.
//
// Why descending: under causal, sliding-window and document masks the kv
// tiles above n begin their walks at later query tiles and have no more
// items than n, so each is ahead of n on every tile they share and the
// waits are short; in ascending order every CTA of a head would trail the
// first one, which holds all the query tiles.
//
// Needs fj_bwd_params, common/ptx.cuh, common/bwd_walk.cuh (fjb_kv_last,
// fjb_pair_class), FJ_BLOCK_M and FJ_BLOCK_N. The semaphore primitives
// (fjb_sem_*) know nothing of attention; fjb_order_wait and
// fjb_order_release wrap them for a CTA whose threads all take part.
// FJ_DEBUG_WAIT_LIMIT (undefined; debugging only, through
// $FLEXJIT_KERNEL_DEFINES): trap after that many polls of one semaphore.
#pragma once

// The host sizes the semaphores for query tiles of this many rows
// (gen/config.h's FJG_BWD_SEM_ROWS), so any tile of a multiple of it fits.
constexpr int FJB_SEM_ROWS = 16;
static_assert(FJ_BLOCK_M % FJB_SEM_ROWS == 0,
              "backward: the semaphores are sized for 16-row query tiles");

// The kv tile of the CTA at x = blockIdx.x of a one-tile grid (grid
// (ceil(Lk / FJ_BLOCK_N), Hkv, B), Lk the launch's): x, or with
// FJ_DETERMINISTIC the tiles in descending order, so that a CTA waits only
// on the CTAs before it.
__device__ __forceinline__ int fjb_cta_kv_tile(const fj_bwd_params &p, int x) {
  return FJ_DETERMINISTIC ? (p.sz.Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N - 1 - x : x;
}

// The persistent kernel's tile counter (sm90/bwd.cuh, fjhb_take_tile),
// zeroed by the pre kernel: the first int of dq_sem, the query tiles'
// semaphores after it (runtime/backward.c's scratch_layout sizes both).
__device__ __forceinline__ int *fjb_tile_counter(const fj_bwd_params &p) { return p.dq_sem; }

// The semaphore of query tile i of query head h, batch b: p.sz.Lq (the
// launch's, max_seqlen_q for a packed batch) spaces the heads, so every
// sequence's tiles have their own.
__device__ __forceinline__ int *fjb_order_sem(const fj_bwd_params &p, int b, int h, int i) {
  const int nq = (p.sz.Lq + FJ_BLOCK_M - 1) / FJ_BLOCK_M;
  return fjb_tile_counter(p) + 1 + ((long long)b * p.sz.Hq + h) * nq + i;
}

// The main kernel's conversion of dq_accum (FJB_DQ_IN_MAIN, sm90/bwd.cuh),
// after the query tiles' semaphores (which the host sizes for 16-row
// tiles and one more int a (batch, query head)): the count of 64-row
// blocks taken for conversion, then per (batch, kv head) hb = b * Hkv + hk
// the count of its kv tiles whose dQ additions are done. Zeroed by the pre
// kernel.
__device__ __forceinline__ int *fjb_convert_counter(const fj_bwd_params &p) {
  const int nq = (p.sz.Lq + FJ_BLOCK_M - 1) / FJ_BLOCK_M;
  return fjb_order_sem(p, 0, 0, 0) + (long long)p.sz.B * p.sz.Hq * nq;
}
__device__ __forceinline__ int *fjb_kv_head_done(const fj_bwd_params &p, int hb) {
  return fjb_convert_counter(p) + 1 + hb;
}

// Zeroes the semaphores of head h's query tiles that start in rows
// [q0, q0 + rows) (rows [q0, Lq) at the end; Lq the sequence's): each tile
// starts in the rows of exactly one pre CTA. Thread tid of `threads`
// threads.
__device__ __forceinline__ void fjb_order_zero(const fj_bwd_params &p, int Lq, int b, int h,
                                               int q0, int rows, int tid, int threads) {
  const int i0 = (q0 + FJ_BLOCK_M - 1) / FJ_BLOCK_M;
  const int i1 = (min(q0 + rows, Lq) + FJ_BLOCK_M - 1) / FJ_BLOCK_M;
  int *sem = fjb_order_sem(p, b, h, 0);
  for (int i = i0 + tid; i < i1; i += threads) sem[i] = 0;
}

// One thread polls *sem until it reaches `value`, then reads with acquire
// semantics what the threads that released it wrote before.
// SLEEP_NS: the back-off between polls.
template <int SLEEP_NS = 64>
__device__ __forceinline__ void fjb_sem_wait_thread(const int *sem, int value) {
#ifdef FJ_DEBUG_WAIT_LIMIT
  unsigned polls = 0;
#endif
  for (;;) {
    int v;
    asm volatile(
        "{\n .reg .u64 g;\n cvta.to.global.u64 g, %1;\n"
        " ld.acquire.gpu.global.b32 %0, [g];\n}\n"
        : "=r"(v) : "l"(sem) : "memory");
    if (v >= value) break;
#ifdef FJ_DEBUG_WAIT_LIMIT
    if (++polls > (unsigned)(FJ_DEBUG_WAIT_LIMIT)) asm volatile("trap;");
#endif
    asm volatile("nanosleep.u32 %0;\n" :: "n"(SLEEP_NS) : "memory");
  }
}

// One thread sets *sem to `value`, after a fence that makes every write
// it has seen (its own, and its CTA's before a barrier) visible first.
__device__ __forceinline__ void fjb_sem_release_thread(int *sem, int value) {
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %0;\n"
      " fence.acq_rel.gpu;\n st.relaxed.gpu.global.b32 [g], %1;\n}\n"
      :: "l"(sem), "r"(value) : "memory");
}

// One thread adds `value` to *sem, after the same fence.
__device__ __forceinline__ void fjb_sem_add_thread(int *sem, int value) {
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %0;\n"
      " fence.acq_rel.gpu;\n red.relaxed.gpu.global.add.s32 [g], %1;\n}\n"
      :: "l"(sem), "r"(value) : "memory");
}

// How many of a round's NT threads hold x: the CTA's NT threads by
// __syncthreads_count (a barrier of the whole CTA), or, NT = 32, one warp's
// lanes by a ballot.
template <int NT>
__device__ __forceinline__ int fjb_order_count(bool x) {
  if constexpr (NT == 32)
    return __popc(__ballot_sync(0xffffffffu, x));
  else
    return __syncthreads_count(x);
}

// The rank of kv tile n on query tile i of query head h, batch b: how many
// kv tiles above n (n + 1 .. nk - 1, nk those of the sequence's Lk in z)
// hold (h, i) in their walks, counted NT kv tiles or list entries a round
// (one round up to NT * FJ_BLOCK_N keys) by fjb_order_count: by the whole
// CTA (NT its threads; then it is also a barrier of the CTA), or by one
// warp (NT = 32: the sm90 kernel's dQ writer). All NT threads call it with
// the same arguments.
//   Without a block mask: kv tile t holds (h, i) when fjb_pair_class is
//   not EMPTY (every t without a mask); thread k classifies t = n + 1 + k.
//   With one: when i's block is listed in t's kv block's row of the
//   transposed lists, i.e. when t's kv block is listed in the row of i's
//   query block; the row's entries (PARTIAL, then FULL) each stand for
//   bm_kv_ratio kv tiles (those below nk), and thread k takes tile k %
//   bm_kv_ratio of entry k / bm_kv_ratio.
template <int NT>
__device__ __forceinline__ int fjb_order_rank(const fj_bwd_params &p, const fj_sizes &z,
                                              int b, int n, int h, int i) {
  const int nk = (z.Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N;
  const int tid = NT == 32 ? fj_tid() & 31 : fj_tid();
  int rank = 0;
  if (p.bm_q_num != nullptr) {
    const int r = p.bm_kv_ratio;
    const int row = b * p.bm_qb_stride + h * p.bm_qh_stride + i / p.bm_q_ratio;
    const int np = __ldg(p.bm_kv_num + row);
    const int span = (np + __ldg(p.bm_full_kv_num + row)) * r;
    const long long base = (long long)row * p.bm_nkv;
    // Rounds not unrolled: the unrolled copies made sm_80's D=128 masked
    // kernel spill (its dK and dV fill the registers around this).
#pragma unroll 1
    for (int k0 = 0;; k0 += NT) {
      const int k = k0 + tid;
      bool before = false;
      if (k < span) {
        const int e = k / r;
        const int blk = e < np ? __ldg(p.bm_kv_idx + base + e)
                               : __ldg(p.bm_full_kv_idx + base + (e - np));
        const int t = blk * r + k % r;
        before = t > n && t < nk;
      }
      rank += fjb_order_count<NT>(before);
      if (k0 + NT >= span) break;
    }
  } else {
#pragma unroll 1
    for (int t0 = n + 1;; t0 += NT) {
      const int t = t0 + tid;
      bool before = t < nk;
#if FJ_HAS_MASK
      if (before)
        before =
            fjb_pair_class(p, z, b, h, i, t * FJ_BLOCK_N, fjb_kv_last(z, t)) != FJ_TILE_EMPTY;
#endif
      rank += fjb_order_count<NT>(before);
      if (t0 + NT >= nk) break;
    }
  }
  return rank;
}

// Every thread of the CTA: until *sem reaches rank (thread 0 polls), then
// a barrier, after which the CTA's additions follow those before it.
__device__ __forceinline__ void fjb_order_wait(const int *sem, int rank) {
  if (fj_tid() == 0) fjb_sem_wait_thread(sem, rank);
  __syncthreads();
}

// Every thread of the CTA, after its additions: a barrier, then thread 0
// sets *sem to rank + 1, the next kv tile's turn.
__device__ __forceinline__ void fjb_order_release(int *sem, int rank) {
  __syncthreads();
  if (fj_tid() == 0) fjb_sem_release_thread(sem, rank + 1);
}

// The default mode's first claim (FJB_DQ_FIRST_STORE without
// FJ_DETERMINISTIC: the sm90 dQ writer). A query tile's semaphore counts
// the claims of the kv tiles that add to it, and FJB_SEM_STORED is set in
// it once the first claimant's store is done in global memory. Only that
// store must precede the others' additions, which may run in any order.
// No deadlock: a claimant waits only for a store that a kv tile already
// running has claimed for the item it is on, and a writer flags each of
// its stores before it takes its next item (sm90/bwd.cuh, fjhb_write_dq),
// so the store it waits for depends on no other CTA.
constexpr int FJB_SEM_STORED = 1 << 30;

// One thread claims the tile: returns the semaphore before the claim, 0 for
// the first claimant, which is to store; a later one waits until
// FJB_SEM_STORED is set in it (fjb_sem_wait_thread) unless it already is.
// Acquire semantics: a later claimant that sees the flag reads what the
// first wrote.
__device__ __forceinline__ int fjb_claim_thread(int *sem) {
  int old;
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %1;\n"
      " atom.acquire.gpu.global.add.u32 %0, [g], 1;\n}\n"
      : "=r"(old) : "l"(sem) : "memory");
  return old;
}

// The first claimant's thread, once its store is done: sets FJB_SEM_STORED,
// after a fence that makes the store visible first (the claims of others
// may add to the semaphore meanwhile, so the flag is or-ed in).
__device__ __forceinline__ void fjb_claim_stored_thread(int *sem) {
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %0;\n"
      " fence.acq_rel.gpu;\n red.relaxed.gpu.global.or.b32 [g], %1;\n}\n"
      :: "l"(sem), "r"(FJB_SEM_STORED) : "memory");
}
