// templates/sm90/scheduler.cuh: which work items a CTA computes and how
// its roles learn of them. Two schedulers with one interface, which the
// kernel body (fwd.cuh) is written against:
//   fjh_sched_one_tile    one item a CTA, grid (query blocks, Hq, B)
//   fjh_sched_persistent  min(SMs, items) CTAs, each looping over items
// Each provides
//   using epilogue       how O is stored (epilogue.cuh)
//   using pingpong       fjh_pingpong<across items or not> (mainloop.cuh)
//   struct cta           what start() hands to the roles
//   static cta start(p, maps, smem)           every thread; ends in a
//                                             __syncthreads, unless idle
//   static bool idle(const cta &)             the CTA has nothing to do
//                                             (every thread leaves at once)
//   static void produce(p, maps, smem, cta)   the producer warpgroup
//   static void consume(p, maps, smem, cta, c)  consumer warpgroup c
// A work item is query block m of head h, batch b. Under the serving layouts
// (docs/serving.md) each item takes its sequence's sizes and first rows
// (fj_seq_of), and an item past its sequence's query length is skipped at
// once: items are sized by max_seqlen_q.
#pragma once

struct fjh_work {
  int m, h, b;
};

// ---- one item a CTA --------------------------------------------------------

// The grid has one CTA per item and the hardware starts them in launch order
// (x fastest): query blocks from the last down (longest causal rows first)
// within each head, whose CTAs then run together and share its K and V in
// L2. (A longest-first order over the whole grid was no faster.)
struct fjh_sched_one_tile {
  using epilogue = fjh_epi_q_area;
  using pingpong = fjh_pingpong<false>;
  struct cta {
    fjh_smem_map sm;
    fjh_item it;
    fjh_stamps tr;  // FJ_TRACE: the producer's
    bool idle;      // the query block lies past its sequence's end
  };
  __device__ __forceinline__ static bool idle(const cta &x) { return x.idle; }

  // Q is on its way before the CTA looks for its tiles: its load latency
  // (about 1 us) overlaps the scan. The barriers are initialized first; the
  // __syncthreads after the scan publishes them to the others. The kv tiles
  // are walked from hi down (a causal diagonal first); every role computes
  // the same walk. With a block mask, hi is the first listed tile (t its
  // position) or -1 for a row with none. A query block past its sequence's
  // end (serving layouts) is idle: the CTA leaves before touching anything.
  __device__ __forceinline__ static cta start(const fj_fwd_params &p, const fj_tma_maps &maps,
                                              unsigned char *smem) {
    cta x;
    x.sm = fjh_smem_layout(smem);
    x.tr.at(0);
    const fjh_work w{(int)gridDim.x - 1 - (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z};
    const fj_seq sq = fj_seq_of(p, w.b);
    const int Lq = sq.sz.Lq, Lk = sq.sz.Lk;
    const int q0 = fjh_tile_q0(p, w.m, Lq), q1 = min(q0 + FJ_BLOCK_M, Lq) - 1;
    x.idle = q0 >= Lq;
    if (x.idle) return x;
    if (threadIdx.x == 0) {
      fjh_init_pipeline_barriers(x.sm);
      fjh_fence_barrier_init();
      fjh_tma_prefetch_desc(&maps.k);
      fjh_tma_prefetch_desc(&maps.v);
      fjh_load_q(p, maps, x.sm, 0, w.b, w.h, q0, sq.q_row0);
    }
    // The walk's start, in locals declared in this order and copied into the
    // item at the end: the compiler numbers their registers in this order,
    // and ptxas's schedule of the whole kernel follows the numbering.
    int t = 0;
    int hi_cls = FJ_TILE_FULL;
    int hi = (Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N - 1, lo = 0;
    if (p.bm_kv_num != nullptr) {
      fjh_bm_fill(p, w.b, w.h, q0, fjh_bm_cache(0), threadIdx.x, blockDim.x);
      __syncthreads();
      hi = fjh_bm_tile(p, fjh_item{w.b, w.h, q0, q1, 0, 0, 0, 0, 0}, &t, &hi_cls);
    } else {
#if FJ_HAS_MASK
      fj_tile_range(p, sq.sz, w.b, w.h, q0, q1, &lo, &hi, &hi_cls);
#endif
    }
    __syncthreads();
    x.it = fjh_item{w.b, w.h, q0, q1, lo, hi, hi_cls, t, 0, Lq, Lk};
    return x;
  }

  // One thread loads the item's K and V tiles.
  __device__ __forceinline__ static void produce(const fj_fwd_params &p,
                                                 const fj_tma_maps &maps, unsigned char *,
                                                 cta &x) {
    int n = 0;
    x.tr.at(1);
    if (threadIdx.x == 0 && x.it.lo <= x.it.hi) fjh_produce(p, maps, x.sm, x.it, n);
    x.tr.at(2);
    if (threadIdx.x == 0) fjh_trace_producer(p, x.it.b, x.it.h, x.it.q0, x.tr, n);
  }

  __device__ __forceinline__ static void consume(const fj_fwd_params &p,
                                                 const fj_tma_maps &maps, unsigned char *,
                                                 cta &x, int c) {
    int n = 0;
    epilogue epi;
    fjh_consume<fjh_sched_one_tile>(p, maps, x.sm, c, x.it, n, epi);
  }
};

// ---- persistent: items a CTA ---------------------------------------------

// The order of the items: the query blocks of one head from the last down
// (under a causal mask, the longest rows first), then the next head: the
// CTAs at work at one time share a head's K and V in L2 (all heads' query
// block m together was 24% slower on full attention). In masked kernels the
// first p.tail_rows query blocks of every head come last, block
// tail_rows - 1 of each head, then the block before, ..., after all the
// other items: under causal, sliding-window or document masks those rows
// are the shortest, and a run of short items at the end evens out when the
// CTAs finish (with equal items, as under a sliding window, the last wave
// otherwise leaves most CTAs idle for up to an item); their K and V are a
// few tiles a head, which stay in L2. The host sets tail_rows (0: none; the
// rule is runtime/forward.c's tail_rows), a parameter rather than a value
// the kernel derives, so the producer warp, short of registers, need not
// keep it live. Full attention, whose rows are all alike and read all of K
// and V, keeps the head-by-head order.
__device__ __forceinline__ int fjh_num_m(const fj_fwd_params &p) {
  return (p.sz.Lq + FJ_BLOCK_M - 1) / FJ_BLOCK_M;
}
__device__ __forceinline__ int fjh_num_items(const fj_fwd_params &p) {
  return fjh_num_m(p) * p.sz.Hq * p.sz.B;
}
// The item at position i of the order.
__device__ __forceinline__ fjh_work fjh_work_at(const fj_fwd_params &p, int i) {
  const int nm = fjh_num_m(p);
#if FJ_HAS_MASK
  const int nt = p.tail_rows;  // tail rows, at most nm
  const int nh = nm - nt;      // head rows
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
// the one-tile kernel's CTAs. Without one (a device without memory pools),
// the static snake of fjh_item_pos. Called by all of warp 0 for its k-th
// item (k = 0, 1, ... in turn).
__device__ __forceinline__ int fjh_next_item(const fj_tma_maps &maps, int k, int lane) {
  if (maps.sched != nullptr) {
    if (k == 0) return (int)blockIdx.x;
    int i = 0;
    if (lane == 0) i = atomicAdd(maps.sched, 1);
    return __shfl_sync(0xffffffffu, i, 0) + (int)gridDim.x;
  }
  return fjh_item_pos(k);
}

// The persistent kernel's own shared state: barriers (at pbar in the
// shared-memory map: q_empty(0), ring full 0 and 1, ring empty 0 and 1,
// q_full(1), q_empty(1)) and the two slots of the ring through which warp
// 0 of the producer hands each item to the consumers and to the Q and V
// threads: the item's position in the order (-1: no more items), its
// tiles (lo, hi, class of hi, block-mask position t), and its sequence's
// sizes and first row in packed q (fj_seq_of). A slot and its row of
// the block-mask copy are reused once the consumers and the V thread have
// finished its item (ring empty: 257 arrivals).
struct fjh_ring_slot {
  int item, lo, hi, hi_cls, t;
  int Lq, Lk, q_row0;
};
struct fjh_persist {
  unsigned long long bar[7];
  fjh_ring_slot slot[2];
  int items;  // the number of items (fjh_num_items), for warp 0's loop
};
__device__ __forceinline__ fjh_persist &fjh_persist_smem() {
  __shared__ fjh_persist ps;
  return ps;
}
__device__ __forceinline__ unsigned fjh_ring_full(const fjh_smem_map &sm, int s) {
  return sm.pbar + 8 * (1 + s);
}
__device__ __forceinline__ unsigned fjh_ring_empty(const fjh_smem_map &sm, int s) {
  return sm.pbar + 8 * (3 + s);
}
// A slot, read once its ring-full phase completed (volatile: the producer
// warp wrote it, the barrier ordered it).
__device__ __forceinline__ fjh_ring_slot fjh_ring_read(int slot) {
  const volatile fjh_ring_slot &v = fjh_persist_smem().slot[slot];
  return fjh_ring_slot{v.item, v.lo, v.hi, v.hi_cls, v.t, v.Lq, v.Lk, v.q_row0};
}
// The k-th item of the CTA from its slot s.
__device__ __forceinline__ fjh_item fjh_ring_item(const fj_fwd_params &p,
                                                 const fjh_ring_slot &s, int k) {
  const fjh_work w = fjh_work_at(p, s.item);
  const int q0 = fjh_tile_q0(p, w.m, s.Lq);
  return fjh_item{w.b, w.h, q0, min(q0 + FJ_BLOCK_M, s.Lq) - 1, s.lo, s.hi, s.hi_cls, s.t,
                  k, s.Lq, s.Lk};
}
// The shared-memory map with the persistent kernel's own barriers.
__device__ __forceinline__ fjh_smem_map fjh_persist_layout(unsigned char *smem) {
  fjh_smem_map sm = fjh_smem_layout(smem);
  sm.pbar = fj_smem_u32(&fjh_persist_smem().bar[0]);
  return sm;
}

// The persistent kernel: gridDim.x CTAs share the items, each taking the
// next one when it is free (fjh_next_item). The producer warpgroup's warp 0
// takes each item, finds its tiles (all its lanes classify, or copy its
// block-mask row) and hands it on through the ring, and its lane 0 loads K;
// lane 0 of warp 1 loads every item's Q as soon as its buffer is free, lane
// 0 of warp 2 loads V. Each walks the items' tiles on its own: none waits
// behind another's load. The K/V stages and their phases run on from item
// to item, and so does the ping-pong turn. Q has two buffers where shared
// memory allows (FJ_Q_BUFS): the next item's Q is in place before this one
// ends, and O leaves through the item's own buffer; with one (D=256), Q
// loads once both consumers have issued their last Q K^T, and O is written
// from registers.
struct fjh_sched_persistent {
  using epilogue = fjh_type_if<FJ_Q_BUFS == 2, fjh_epi_q_buffer, fjh_epi_registers>::type;
  using pingpong = fjh_pingpong<true>;
  struct cta {};

  __device__ __forceinline__ static bool idle(const cta &) { return false; }
  __device__ __forceinline__ static cta start(const fj_fwd_params &, const fj_tma_maps &,
                                              unsigned char *smem) {
    if (threadIdx.x == 0) {
      const fjh_smem_map sm = fjh_persist_layout(smem);
      fjh_init_pipeline_barriers(sm);
      fjh_mbar_init(sm.q_full(1), 1);
      fjh_mbar_init(sm.q_empty(0), 256);
      fjh_mbar_init(sm.q_empty(1), 256);
      for (int s = 0; s < 2; ++s) {
        fjh_mbar_init(fjh_ring_full(sm, s), 1);
        fjh_mbar_init(fjh_ring_empty(sm, s), 257);  // the consumers and the V thread
      }
      fjh_fence_barrier_init();
    }
    __syncthreads();
    return cta{};
  }

  // Warp 1's lane 0: every item's Q (an item without tiles too: its
  // consumers wait for it and free the buffer), into buffer k % FJ_Q_BUFS
  // once the consumers are done with that buffer's previous item. The item
  // comes from the ring (its slot is not reused before the consumers have
  // finished that item, which needs this Q: no arrival from here).
  __device__ __forceinline__ static void produce_q(const fj_fwd_params &p,
                                                   const fj_tma_maps &maps,
                                                   const fjh_smem_map &sm) {
    fjh_tma_prefetch_desc(&maps.q);
    for (int k = 0;; ++k) {
      fjh_mbar_wait(fjh_ring_full(sm, k & 1), (k >> 1) & 1);
      const fjh_ring_slot s = fjh_ring_read(k & 1);
      if (s.item < 0) break;
      const fjh_work w = fjh_work_at(p, s.item);
      const int qb = k % FJ_Q_BUFS;
      fjh_mbar_wait(sm.q_empty(qb), ((unsigned)(k / FJ_Q_BUFS) & 1u) ^ 1u);
      fjh_load_q(p, maps, sm, qb, w.b, w.h, fjh_tile_q0(p, w.m, s.Lq), s.q_row0);
    }
  }

  // Warp 2's lane 0: every item's V tiles.
  __device__ __forceinline__ static void produce_v(const fj_fwd_params &p,
                                                   const fj_tma_maps &maps,
                                                   const fjh_smem_map &sm) {
    fjh_tma_prefetch_desc(&maps.v);
    int n = 0;
    for (int k = 0;; ++k) {
      const int slot = k & 1;
      fjh_mbar_wait(fjh_ring_full(sm, slot), (k >> 1) & 1);
      const fjh_ring_slot s = fjh_ring_read(slot);
      if (s.item < 0) break;
      fjh_produce_one(p, maps, sm, 1, fjh_ring_item(p, s, k), n);
      // The walk read the slot's block-mask row until here.
      fjh_mbar_arrive(fjh_ring_empty(sm, slot));
    }
  }

  // Warp 0: takes the items (fjh_num_items of them), finds their tiles, fills
  // the ring; its lane 0 loads every item's K tiles. An item past its
  // sequence's query length (serving layouts) is dropped here, before it
  // costs a slot, a Q load or the consumers' time: k counts the items put
  // in the ring, taken those taken. A last slot with item -1 stops every
  // role.
  __device__ __forceinline__ static void schedule(const fj_fwd_params &p,
                                                  const fj_tma_maps &maps,
                                                  const fjh_smem_map &sm, int lane) {
    if (lane == 0) fjh_tma_prefetch_desc(&maps.k);
    fjh_persist &ps = fjh_persist_smem();
    int n = 0, k = 0, taken = 0;
    // The loop's bound is read from shared memory at each item: held in a
    // register across the loop it was one too many (spilled) beside the
    // serving layouts' paged loads.
    volatile int &items = ps.items;
    if (lane == 0) items = fjh_num_items(p);
    __syncwarp();
    for (int item = fjh_next_item(maps, 0, lane); item < items;
         item = fjh_next_item(maps, ++taken, lane)) {
      fjh_stamps tr;
      tr.at(0);
      const fjh_work w = fjh_work_at(p, item);
      const fj_sizes sz = fj_seq_of(p, w.b).sz;
      const int Lq = sz.Lq, Lk = sz.Lk;
      const int q0 = fjh_tile_q0(p, w.m, Lq), q1 = min(q0 + FJ_BLOCK_M, Lq) - 1;
      if (q0 >= Lq) continue;
      // The item's tiles, found by all of the warp.
      int lo = 0, hi = (Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N - 1, hi_cls = FJ_TILE_FULL, t = 0;
      const int slot = k & 1;
      if (p.bm_kv_num != nullptr) {
        // The item's block-mask row into the slot's copy, once every reader
        // of the slot's previous item is done with it.
        fjh_mbar_wait(fjh_ring_empty(sm, slot), ((k >> 1) & 1) ^ 1);
        fjh_bm_fill(p, w.b, w.h, q0, fjh_bm_cache(k), lane, 32);
        __syncwarp();
        hi = fjh_bm_tile(p, fjh_item{w.b, w.h, q0, q1, 0, 0, 0, 0, k}, &t, &hi_cls);
      } else {
#if FJ_HAS_MASK
        int first, last;
        fj_tile_scan_warp(p, sz, w.b, w.h, q0, q1, (Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N, lane,
                          32, &first, &last);
        fj_tile_range_of(first, last, &lo, &hi, &hi_cls);
#endif
      }
      if (lane == 0) {
        // Free once the consumers and the V thread are done with its item.
        fjh_mbar_wait(fjh_ring_empty(sm, slot), ((k >> 1) & 1) ^ 1);
        // The first row is read here, not kept across the scan (a register
        // the producer lacks).
        ps.slot[slot] = fjh_ring_slot{item, lo, hi, hi_cls, t, Lq, Lk, fjh_q_row0(p, w.b)};
        fjh_mbar_arrive(fjh_ring_full(sm, slot));  // release: the slot is written
        tr.at(1);
        const int n0 = n;
        fjh_produce_one(p, maps, sm, 0, fjh_item{w.b, w.h, q0, q1, lo, hi, hi_cls, t, k, Lq, Lk},
                        n);
        tr.at(2);
        fjh_trace_producer(p, w.b, w.h, q0, tr, n - n0);
      }
      __syncwarp();
      ++k;
    }
    if (lane == 0) {
      const int slot = k & 1;
      fjh_mbar_wait(fjh_ring_empty(sm, slot), ((k >> 1) & 1) ^ 1);
      ps.slot[slot] = fjh_ring_slot{-1, 0, -1, FJ_TILE_FULL, 0, 0, 0, 0};
      fjh_mbar_arrive(fjh_ring_full(sm, slot));
    }
  }

  // The shared-memory map is computed after the register reallocation, in
  // each role: values live across setmaxnreg went through local memory.
  __device__ __forceinline__ static void produce(const fj_fwd_params &p,
                                                 const fj_tma_maps &maps, unsigned char *smem,
                                                 cta &) {
    if (threadIdx.x >= 96) return;
    const fjh_smem_map sm = fjh_persist_layout(smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp == 1) {
      if (lane == 0) produce_q(p, maps, sm);
      return;
    }
    if (warp == 2) {
      if (lane == 0) produce_v(p, maps, sm);
      return;
    }
    if (warp == 0) schedule(p, maps, sm, lane);
  }

  // Only k, n and the epilogue's pending Q buffer live across an item (the
  // rest is recomputed from the parameters): these registers come out of
  // the softmax's.
  __device__ __forceinline__ static void consume(const fj_fwd_params &p,
                                                 const fj_tma_maps &maps, unsigned char *smem,
                                                 cta &, int c) {
    const fjh_smem_map sm = fjh_persist_layout(smem);
    int n = 0;
    pingpong::begin_cta(c);
    epilogue epi;
    for (int k = 0;; ++k) {
      const int slot = k & 1;
      fjh_mbar_wait_warp(fjh_ring_full(sm, slot), (k >> 1) & 1);
      const fjh_ring_slot s = fjh_ring_read(slot);
      if (s.item < 0) break;
      fjh_consume<fjh_sched_persistent>(p, maps, sm, c, fjh_ring_item(p, s, k), n, epi);
      // The walk read the slot's block-mask row until here.
      fjh_mbar_arrive(fjh_ring_empty(sm, slot));
    }
    epi.finish(sm);
    pingpong::end_cta(c);
  }
};
