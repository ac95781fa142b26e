// templates/sm90/bwd.cuh: the sm90 backward's main kernel (contract and
// scheme: sm90/bwd_config.cuh): the producer warpgroup's warps (Q and dO
// loads, LSE and delta rows, the dQ writer, and in the persistent kernel the
// conversion of dq), the persistent kernel's ring of kv tiles, and the entry
// point that splits the CTA into its roles.
//
// Each role's function does one kv tile (the walk w), the CTA's k-th
// (kv_full's, k_empty's and v_empty's phases follow it), and takes by
// reference n, the items so far, which runs on from tile to tile (the
// stages, the dS^T and dQ buffers and their phases follow it).
#pragma once

// Producer warp 0: K and V of the tile (in the persistent kernel each once
// the consumers are done with the tile before's: V first, v_empty; a tile
// without an item loads none, a CTA must not exit with loads in flight, and
// completes kv_full's phase by a bare arrival), then each item's Q and dO
// into its stage once the consumers have released it. Lane 0 issues; every
// lane walks (the walk's scan votes across the warp).
__device__ __forceinline__ void fjhb_produce(const fj_bwd_params &p, const fj_bwd_maps &maps,
                                             const fjhb_smem &sm, const fjb_walk &w, int hk,
                                             int k, int &n) {
  const int lane = fj_tid() & 31;
  // Packed tensors' maps are (D, total, H, 1): the sequence's first row and
  // batch 0 (rows past its end are masked by the consumers).
  const int qb = FJ_VARLEN && p.cu_seqlens_q != nullptr ? 0 : w.b;
  const int kb = FJ_VARLEN && p.cu_seqlens_k != nullptr ? 0 : w.b;
  fjb_item it = w.first(p);
  const unsigned kph = ((unsigned)k & 1u) ^ 1u;  // the tile before's
  if (lane == 0 && w.done(it)) {
    if (FJ_PERSISTENT) fjh_mbar_wait(sm.v_empty(), kph);
    if (FJ_PERSISTENT) fjh_mbar_wait(sm.k_empty(), kph);
    fjh_mbar_arrive(sm.kv_full());
  }
  if (!w.done(it) && lane == 0) {
    fjh_tma_prefetch_desc(&maps.q);
    fjh_tma_prefetch_desc(&maps.dout);
    const int kr = w.seq(p).k_row0 + w.kv0;
    if (FJ_PERSISTENT) fjh_mbar_wait(sm.v_empty(), kph);
    fjh_mbar_arrive_expect_tx(sm.kv_full(), 2 * FJHB_KV_BYTES);
#pragma unroll
    for (int x = 0; x < FJHB_CHUNKS64; ++x)
      fjh_tma_load_4d(sm.v() + x * (FJ_BLOCK_N * 128), &maps.v, 64 * x, kr, hk, kb,
                      sm.kv_full());
    if (FJ_PERSISTENT) fjh_mbar_wait(sm.k_empty(), kph);
#pragma unroll
    for (int x = 0; x < FJHB_CHUNKS64; ++x)
      fjh_tma_load_4d(sm.k() + x * (FJ_BLOCK_N * 128), &maps.k, 64 * x, kr, hk, kb,
                      sm.kv_full());
  }
  for (; !w.done(it); ++n) {
    const int s = n & 1;
    const unsigned ph = (unsigned)(n >> 1) & 1u;
    if (lane == 0) {
      const int qr = w.seq(p).q_row0 + it.i * FJ_BLOCK_M;
      fjh_mbar_wait(sm.empty(s), ph ^ 1u);
      fjh_mbar_arrive_expect_tx(sm.q_full(s), 2 * FJHB_Q_BYTES);
#pragma unroll
      for (int x = 0; x < FJHB_CHUNKS64; ++x) {
        fjh_tma_load_4d(sm.q(s) + x * (FJ_BLOCK_M * 128), &maps.q, 64 * x, qr, it.h, qb,
                        sm.q_full(s));
        fjh_tma_load_4d(sm.dout(s) + x * (FJ_BLOCK_M * 128), &maps.dout, 64 * x, qr, it.h, qb,
                        sm.q_full(s));
      }
    }
    __syncwarp();
    it = w.next(p, it);
  }
}

// Producer warp 1: each item's LSE, in log2 units (+inf for a row without
// an allowed pair, and past Lq, so that its P is 0), delta (0 past Lq) and,
// for a PARTIAL item, its rows' mask values (FJHB_ROWV) into its stage, two
// rows a lane, and the item after it, from which the consumers take their
// next item (fjhb_put_item, lane 0; the walk's step runs before the arrival:
// the consumers wait for a stage's rows more than an item after they free
// it); every lane arrives on the stage's rows-full barrier.
__device__ __forceinline__ void fjhb_produce_rows(const fj_bwd_params &p, const fjhb_smem &sm,
                                                  const fjb_walk &w, int &n) {
  const int lane = fj_tid() & 31;
  fjb_item it = w.first(p);
  for (; !w.done(it); ++n) {
    const int s = n & 1;
    const unsigned ph = (unsigned)(n >> 1) & 1u;
    const int q0 = it.i * FJ_BLOCK_M;
    const fjb_seq sq = w.seq(p);
    const int Lq = sq.sz.Lq;
    const float *gl = p.lse + w.b * p.lse_sb + it.h * p.lse_sh + sq.q_row0;
    const float *gd = p.delta + fjb_acc_row(p, sq, it.h);
    float l[FJ_BLOCK_M / 32], d[FJ_BLOCK_M / 32];
    unsigned rv[FJ_BLOCK_M / 32];  // FJHB_ROWV: a PARTIAL item's row values
#pragma unroll
    for (int r = 0; r < FJ_BLOCK_M / 32; ++r) {
      const int q = q0 + 32 * r + lane;
      const float x = q < Lq ? __ldg(gl + q) : fj_neg_inf();
      l[r] = x == fj_neg_inf() ? -fj_neg_inf() : x * FJHB_LOG2E;
      d[r] = q < Lq ? gd[q] : 0.f;
      unsigned v[1] = {0u};
#if FJHB_ROWV
      if (it.cls == FJ_TILE_PARTIAL && q < Lq) fj_mask_rows(p.user, sq.sz, w.b, it.h, q, v);
#endif
      rv[r] = v[0];
    }
    fjh_mbar_wait(sm.empty(s), ph ^ 1u);
#pragma unroll
    for (int r = 0; r < FJ_BLOCK_M / 32; ++r) {
      asm volatile("st.shared.f32 [%0], %1;\n" :: "r"(sm.lse(s) + (32 * r + lane) * 4),
                   "f"(l[r]) : "memory");
      asm volatile("st.shared.f32 [%0], %1;\n" :: "r"(sm.delta(s) + (32 * r + lane) * 4),
                   "f"(d[r]) : "memory");
      if (FJHB_ROWV)
        asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(sm.rowv(s) + (32 * r + lane) * 4),
                     "r"(rv[r]) : "memory");
    }
    const fjb_item nxt = w.next(p, it);
    if (lane == 0) fjhb_put_item(sm.next_item(s), nxt);
    fjh_mbar_arrive(sm.rows_full(s));
    it = nxt;
  }
}

// Producer warp 2, the dQ writer: each item's dQ buffers, once a consumer
// has filled its own, added to their tiles of dq_accum by bulk reduce-adds
// (rows past Lq fall in the head's or sequence's own padding rows, which
// the post kernel does not read; a part wholly past Lq is not added), and
// released once the reduce-add has read them: with two buffers a consumer,
// at the next item's start, before its claim's round trip and any wait for
// another CTA's store (a buffer is read while the consumer fills the other);
// with one, at once (the consumer fills it again only after its next S^T
// product). The tile's last buffers are released at its end (a tail
// piece's dK and dV are added through them: fjhb_add_rows). Lane 0
// issues; every lane walks.
// dq_accum is not zeroed (FJB_DQ_FIRST_STORE): a query tile's first
// addition is a bulk copy (common/bwd_order.cuh). By default the writer
// claims each item's query tile; the first claimant stores, and marks the
// tile stored once its copy's writes are done; the others add after that.
// FJ_DETERMINISTIC (the one-tile kernel, kv tiles in descending order):
// the warp counts the item's rank, lane 0 waits for the query tile's
// semaphore to reach it, adds (stores, at rank 0), releases the buffers once
// the adds have read them and the semaphore once their writes are done in
// global memory.
__device__ __forceinline__ void fjhb_write_dq(const fj_bwd_params &p,
                                              const fjhb_smem &sm, const fjb_walk &w, int &n) {
  const int lane = fj_tid() & 31;
  fjb_item it = w.first(p);
  const int n0 = n;
  for (; !w.done(it); ++n) {
    const int bi = n % FJHB_DQ_BUFS;
#if FJ_DETERMINISTIC
    const int rank = fjb_order_rank<32>(p, w.sizes(p), w.b, w.n_block, it.h, it.i);
#endif
    if (lane == 0) {
      const fjb_seq sq = w.seq(p);
      // The item's first scratch row.
      const long long row = fjb_acc_row(p, sq, it.h) + it.i * FJ_BLOCK_M;
      int *sem = fjb_order_sem(p, w.b, it.h, it.i);
#if FJ_DETERMINISTIC
      const bool first = rank == 0;
      fjb_sem_wait_thread(sem, rank);
#else
      // The item before's buffers go back once its adds have read them,
      // ahead of this item's claim (an acquire: nothing after it is done
      // before its round trip) and of any wait for another CTA's store,
      // so that neither holds the consumers, who fill them next.
      if (FJHB_DQ_BUFS == 2 && n > n0) {
        fjh_bulk_wait_read();
        fjh_mbar_arrive(sm.dq_empty(0, bi ^ 1));
        fjh_mbar_arrive(sm.dq_empty(1, bi ^ 1));
      }
      const int claim = fjb_claim_thread(sem);
      const bool first = claim == 0;
#endif
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        fjh_mbar_wait(sm.dq_full(c, bi), (unsigned)(n / FJHB_DQ_BUFS) & 1u);
#if !FJ_DETERMINISTIC
        // A later claimant adds once the first's store is done, waited for
        // as late as possible: once its own part is ready.
        if (c == 0 && !first && !(claim & FJB_SEM_STORED))
          fjb_sem_wait_thread(sem, FJB_SEM_STORED);
#endif
        if (c == 0 && !first) fjh_fence_proxy_async_global();
        // A part that starts past Lq, and so past the head's scratch rows
        // (the upper half of a last 128-row tile), is zeros, and those rows
        // are the next head's (or past dq_accum's end): not added. Its group
        // is committed all the same, empty, for the counts of groups below.
        // (A part starting at the item's first row is always added: the walk
        // holds only items that start below Lq.)
        if (fjhb_dq_row0(c) == 0 || it.i * FJ_BLOCK_M + fjhb_dq_row0(c) < sq.sz.Lq) {
          float *dst =
              p.dq_accum + (row + fjhb_dq_row0(c)) * FJ_HEAD_DIM + fjhb_dq_col0(c) * FJB_SEQ_PAD;
          if (first)
            fjh_bulk_copy_out(dst, sm.dq(c, bi), FJHB_DQ_BYTES);
          else
            fjh_bulk_reduce_add_f32(dst, sm.dq(c, bi), FJHB_DQ_BYTES);
        }
        fjh_bulk_commit();
        if constexpr (FJHB_DQ_BUFS == 1 && !FJ_DETERMINISTIC) {
          fjh_bulk_wait_read();
          fjh_mbar_arrive(sm.dq_empty(c, 0));
        }
      }
#if FJ_DETERMINISTIC
      // The buffers go back once read, the turn once the adds are done.
      fjh_bulk_wait_read();
      fjh_mbar_arrive(sm.dq_empty(0, bi));
      fjh_mbar_arrive(sm.dq_empty(1, bi));
      fjh_bulk_wait();
      fjh_fence_proxy_async_global();
      fjb_sem_release_thread(sem, rank + 1);
#else
      // A first claimant's store, flagged once its writes are done.
      if (first) {
        fjh_bulk_wait();
        fjh_fence_proxy_async_global();
        fjb_claim_stored_thread(sem);
      }
#endif
    }
    __syncwarp();
    it = w.next(p, it);
  }
  if (FJHB_DQ_BUFS == 2 && !FJ_DETERMINISTIC && lane == 0 && n > n0) {
    fjh_bulk_wait_read();
    fjh_mbar_arrive(sm.dq_empty(0, (n - 1) & 1));
    fjh_mbar_arrive(sm.dq_empty(1, (n - 1) & 1));
  }
}

#if FJ_PERSISTENT
// A kv tile is named by its position t in the one-tile grid's order (kv
// tile fastest, then kv head, then batch: blockIdx x, y, z); the CTAs take
// them in another order (fjhb_take_tile), the last round's tiles maybe in
// pieces.
//
// What a CTA takes: a kv tile (t, -1 past the last) and, when it is one of
// the last round's split tiles (p.tail_tiles), which piece: tail tile
// piece / p.tail_pieces (its block of dkv_accum), its piece piece %
// p.tail_pieces; -1 for a whole tile.
struct fjhb_take {
  int t, piece;
};
__device__ __forceinline__ fjb_walk fjhb_tile_walk(const fj_bwd_params &p, const fjhb_smem &sm,
                                                   fjhb_take x, int *hk) {
  const int nkv = (p.sz.Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N;
  const int hb = x.t / nkv;
  *hk = hb % p.sz.Hkv;
  fjb_walk w(p, sm.seq(), x.t - hb * nkv, *hk, hb / p.sz.Hkv);
  if (FJB_PIECES && x.piece >= 0) w.piece(p, x.piece % p.tail_pieces, p.tail_pieces);
  return w;
}

// Producer warp 0's lane 0: the CTA's k-th take (its blockIdx.x first, then
// the counter's next value plus gridDim.x; p.takes in all) of the order of
// common/bwd_walk.cuh's fjb_tile_order (groups of p.kv_head_group kv
// heads), where the last p.tail_tiles tiles are each taken as
// p.tail_pieces pieces (takes p.tail_first on), named by its position in
// the one-tile grid's order and its piece, into ring slot k & 1 once every
// reader is done with the slot's previous take. All of the warp calls it and gets the take. (Only
// this lane maps the order: in the consumers the mapping's arithmetic
// moved ptxas to branch over a masked item's exponentials.)
__device__ __forceinline__ fjhb_take fjhb_take_tile(const fj_bwd_params &p,
                                                    const fjhb_smem &sm, int k) {
  fjhb_take x{0, -1};
  if ((fj_tid() & 31) == 0) {
    const int n = k == 0 ? (int)blockIdx.x : atomicAdd(fjb_tile_counter(p), 1) + (int)gridDim.x;
    if (n >= p.takes) {
      x.t = -1;
    } else {
      int pos = n;
      if (FJB_PIECES && n >= p.tail_first) {
        x.piece = n - p.tail_first;
        pos = p.tail_first + x.piece / p.tail_pieces;
      }
      const int nkv = (p.sz.Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N;
      int hb;
      const int kt = fjb_tile_order(pos, nkv, p.sz.Hkv * p.sz.B, p.kv_head_group, &hb);
      x.t = hb * nkv + kt;
    }
    fjh_mbar_wait(sm.ring_empty(k & 1), ((unsigned)(k >> 1) & 1u) ^ 1u);
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(sm.ring(k & 1)), "r"(x.t),
                 "r"(x.piece) : "memory");
    fjh_mbar_arrive(sm.ring_full(k & 1));
  }
  x.t = __shfl_sync(0xffffffffu, x.t, 0);
  x.piece = __shfl_sync(0xffffffffu, x.piece, 0);
  return x;
}

// Every other warp: the k-th take from its slot; the warp's lane 0 then
// releases the slot (FJHB_RING_READERS arrivals: producer warps 1 and 2 and
// the consumers' eight warps), at once, or with release false at the
// tile's end (the consumers of a kernel with pieces, FJB_PIECES:
// fjhb_consume reads the piece again there rather than hold it in a
// register across the tile).
constexpr int FJHB_RING_READERS = 10;
__device__ __forceinline__ fjhb_take fjhb_read_tile(const fjhb_smem &sm, int k, bool release) {
  fjh_mbar_wait_warp(sm.ring_full(k & 1), (unsigned)(k >> 1) & 1u);
  fjhb_take x;
  asm volatile("ld.volatile.shared.v2.b32 {%0, %1}, [%2];\n"
               : "=r"(x.t), "=r"(x.piece) : "r"(sm.ring(k & 1)) : "memory");
  __syncwarp();
  if (release && (fj_tid() & 31) == 0) fjh_mbar_arrive(sm.ring_empty(k & 1));
  return x;
}
#endif

// Whether this launch's main kernel converts dq itself (FJB_DQ_IN_MAIN: the
// persistent kernel, where it splits no tile; runtime/backward.c's
// post_needed is the host's side of the same rule).
__device__ __forceinline__ bool fjhb_dq_in_main(const fj_bwd_params &p) {
  return FJB_DQ_IN_MAIN && p.tail_tiles == 0;
}

// The dQ writer, after a kv tile of kv head hb (b * Hkv + hk) where
// fjhb_dq_in_main: once the tile's dQ additions are done in global
// memory, counts the tile in fjb_kv_head_done.
__device__ __forceinline__ void fjhb_kv_tile_done(const fj_bwd_params &p, int hb) {
  if ((fj_tid() & 31) == 0) {
    fjh_bulk_wait();
    fjh_fence_proxy_async_global();
    fjb_sem_add_thread(fjb_kv_head_done(p, hb), 1);
  }
  __syncwarp();
}

// dq from dq_accum (fjhb_dq_in_main), by
// whole warps: producer warp 3 from the start, the consumers' warps once
// they have run out of tiles (producer warps 0 to 2 do not: in their 40
// registers the conversion spilled). A warp takes 64-row blocks of query heads
// from a counter, kv head by kv head in the order the kernel deals their
// tiles (fjb_tile_order: ascending), waits until every kv tile of the
// block's kv head has done its dQ additions, and converts the block.
__device__ __forceinline__ void fjhb_convert_dq(const fj_bwd_params &p) {
  const int lane = fj_tid() & 31;
  const int nblk = (p.sz.Lq + FJB_SEQ_PAD - 1) / FJB_SEQ_PAD;
  const int per_hb = p.kv_group * nblk;
  const int total = p.sz.B * p.sz.Hkv * per_hb;
  const int nkv = (p.sz.Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N;
  for (;;) {
    int c = 0;
    if (lane == 0) c = atomicAdd(fjb_convert_counter(p), 1);
    c = __shfl_sync(0xffffffffu, c, 0);
    if (c >= total) break;
    const int hb = c / per_hb, r = c - hb * per_hb;
    if (lane == 0) fjb_sem_wait_thread<1024>(fjb_kv_head_done(p, hb), nkv);
    __syncwarp();
    const int b = hb / p.sz.Hkv;
    fjb_dq_convert_block<true, 32>(p, fjb_seq_of(p, b), b,
                                   (hb % p.sz.Hkv) * p.kv_group + r / nblk,
                                   (r % nblk) * FJB_SEQ_PAD, lane);
  }
}

// The producer warpgroup's warp `warp` (0, 1 or 2) on a tile: its role.
__device__ __forceinline__ void fjhb_producer_tile(const fj_bwd_params &p,
                                                   const fj_bwd_maps &maps,
                                                   const fjhb_smem &sm, int warp,
                                                   const fjb_walk &w, int hk, int k, int &n) {
  if (warp == 0)
    fjhb_produce(p, maps, sm, w, hk, k, n);
  else if (warp == 1)
    fjhb_produce_rows(p, sm, w, n);
  else {
    fjhb_write_dq(p, sm, w, n);
    if (fjhb_dq_in_main(p)) fjhb_kv_tile_done(p, w.b * p.sz.Hkv + hk);
  }
}

extern "C" __global__ void __launch_bounds__(FJHB_THREADS, 1)
fj_attention_bwd(const __grid_constant__ fj_bwd_params p,
                 const __grid_constant__ fj_bwd_maps maps) {
  extern __shared__ __align__(1024) unsigned char fjhb_smem_raw[];
  fjhb_smem sm;
  sm.base = (fj_smem_u32(fjhb_smem_raw) + 1023u) & ~1023u;  // swizzle atoms
#if !FJ_PERSISTENT
  const int hk = blockIdx.y;
  const int n_block = fjb_cta_kv_tile(p, (int)blockIdx.x);
  // The sequence's sizes and rows (fjb_seq_of: p.sz unless packed), as a
  // record in shared memory that every role reads where it needs it
  // (fjb_walk); a kv tile past a shorter sequence's end has nothing to do
  // (the whole CTA returns before any barrier or load; without FJ_VARLEN
  // the grid holds none).
#if FJ_VARLEN
  {
    const fjb_seq sq = fjb_seq_of(p, blockIdx.z);
    fjb_seq_sts(sm.seq(), sq);
    if (n_block * FJ_BLOCK_N >= sq.sz.Lk) return;
  }
#endif
  const fjb_walk w(p, sm.seq(), n_block, hk, blockIdx.z);
#endif
  if (threadIdx.x == 0) {
    fjh_mbar_init(sm.kv_full(), 1);
    for (int s = 0; s < FJ_NUM_STAGES; ++s) {
      fjh_mbar_init(sm.q_full(s), 1);
      fjh_mbar_init(sm.rows_full(s), 32);
      fjh_mbar_init(sm.empty(s), 256);  // every consumer thread arrives
    }
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < FJHB_DQ_BUFS; ++i) {
        fjh_mbar_init(sm.dq_full(c, i), 128);  // every thread of consumer c
        fjh_mbar_init(sm.dq_empty(c, i), 1);   // the writer
      }
#if FJ_PERSISTENT
    fjh_mbar_init(sm.k_empty(), 256);  // every consumer thread
    fjh_mbar_init(sm.v_empty(), 256);
    for (int s = 0; s < 2; ++s) {
      fjh_mbar_init(sm.ring_full(s), 1);
      fjh_mbar_init(sm.ring_empty(s), FJHB_RING_READERS);
    }
#endif
    fjh_fence_barrier_init();
  }
  __syncthreads();
  // The role must be warp-uniform for setmaxnreg (.aligned): take lane 0's.
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
  // The counts are declared after setmaxnreg: values live across it go
  // through local memory.
  if (wg == 0) {
    fjh_setmaxnreg_dec<FJHB_PRODUCER_REGS>();
    int n = 0;
    const int warp = __shfl_sync(0xffffffffu, (int)threadIdx.x / 32, 0);
    if (warp > 2) {
      if (fjhb_dq_in_main(p)) fjhb_convert_dq(p);
      return;
    }
#if FJ_PERSISTENT
    for (int k = 0;; ++k) {
      const fjhb_take x = warp == 0 ? fjhb_take_tile(p, sm, k) : fjhb_read_tile(sm, k, true);
      if (x.t < 0) break;
      int hk;
      const fjb_walk w = fjhb_tile_walk(p, sm, x, &hk);
      fjhb_producer_tile(p, maps, sm, warp, w, hk, k, n);
    }
#else
    fjhb_producer_tile(p, maps, sm, warp, w, hk, 0, n);
#endif
  } else {
    fjh_setmaxnreg_inc<FJHB_CONSUMER_REGS>();
    int n = 0;
#if FJ_PERSISTENT
    for (int k = 0;; ++k) {
      const fjhb_take x = fjhb_read_tile(sm, k, !FJB_PIECES);
      if (x.t < 0) break;
      // The map's addresses are derived anew for each tile (from a base the
      // compiler cannot see through): held across tiles they were one
      // register too many for the masked D=64 kernel.
      fjhb_smem st;
      asm volatile("mov.b32 %0, %1;\n" : "=r"(st.base) : "r"(sm.base));
      int hk;
      const fjb_walk w = fjhb_tile_walk(p, st, x, &hk);
      fjhb_consume(p, maps, st, wg - 1, w, hk, k, n);
    }
    if (fjhb_dq_in_main(p)) fjhb_convert_dq(p);
#else
    fjhb_consume(p, maps, sm, wg - 1, w, hk, 0, n);
#endif
  }
}
