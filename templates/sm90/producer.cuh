// templates/sm90/producer.cuh: the forward kernel's tensor maps and its
// loads: Q of a work item, and the K and V tiles of its walk, issued by one
// thread (fjh_produce) or by one thread each (fjh_produce_one).
#pragma once

// The kernel's second parameter: the tensor maps of q, k, v and o, built per
// launch by the host (runtime/tma.c; its mirror is runtime/tma.h's
// fjr_tma_maps), 128-byte aligned like the host's: 640 bytes.
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

__device__ __forceinline__ void fjh_load_k(const fj_fwd_params &p, const fj_tma_maps &maps,
                                           const fjh_smem_map &sm, fjh_stage st,
                                           const fjh_item &it, int j, int hk) {
  fjh_load_kv(p, &maps.k, sm.k_tile(st.s), sm.k_full(st.s), sm.k_empty(st.s), st, it, j, hk,
              0);
}
__device__ __forceinline__ void fjh_load_v(const fj_fwd_params &p, const fj_tma_maps &maps,
                                           const fjh_smem_map &sm, fjh_stage st,
                                           const fjh_item &it, int j, int hk) {
  fjh_load_kv(p, &maps.v, sm.v_tile(st.s), sm.v_full(st.s), sm.v_empty(st.s), st, it, j, hk,
              1);
}

// Q of query block q0 of sequence b (first row q_row0 in packed q, whose
// map is then one batch of total_q rows: batch 0) into Q buffer i. Rows
// past the sequence's end (the next sequence's, or zero fill) are computed
// and never stored.
__device__ __forceinline__ void fjh_load_q(const fj_fwd_params &p, const fj_tma_maps &maps,
                                           const fjh_smem_map &sm, int i, int b, int h, int q0,
                                           int q_row0) {
  const int qb = fj_cu_seqlens_q(p) != nullptr ? 0 : b;
  fjh_mbar_arrive_expect_tx(sm.q_full(i), FJH_Q_BYTES);
#pragma unroll
  for (int c = 0; c < FJH_CHUNKS64; ++c)
    fjh_tma_load_4d(sm.q_tile(i) + c * FJ_BLOCK_M * 128, &maps.q, c * 64, q_row0 + q0, h, qb,
                    sm.q_full(i));
}

// An item's K and V tiles from one thread, in the order the consumers need
// them: K(0), then K(n+1) before V(n) (Q K^T of the next tile is issued
// before P V of the current one). Q is the caller's. n counts the K/V tiles
// loaded so far.
__device__ __forceinline__ void fjh_produce(const fj_fwd_params &p, const fj_tma_maps &maps,
                                            const fjh_smem_map &sm, const fjh_item &it,
                                            int &n) {
  const int hk = it.h / p.kv_group;
  int cls = FJ_TILE_FULL, t = it.t;
  int j = it.hi;
  fjh_stage st0 = fjh_stage_of(n);  // tile j's stage
  fjh_trace_loads tr(p, it.b, it.h, it.q0);
  fjh_load_k(p, maps, sm, st0, it, j, hk);
  tr.k_issued();
  for (int jn = fjh_advance(p, it, j, &t, &cls); jn >= it.lo;
       jn = fjh_advance(p, it, jn, &t, &cls)) {
    const fjh_stage st1 = fjh_stage_next(st0);
    fjh_load_k(p, maps, sm, st1, it, jn, hk);
    tr.k_issued();
    fjh_load_v(p, maps, sm, st0, it, j, hk);
    tr.v_issued();
    j = jn;
    st0 = st1;
    ++n;
  }
  fjh_load_v(p, maps, sm, st0, it, j, hk);
  ++n;
}

// An item's K tiles (which == 0) or V tiles (1) from a thread of their own,
// each walking the item's tiles on its own, so that a V load never waits
// behind a K load for a stage (at an item's start the stages are still held
// by the consumer that trails in the ping-pong: with one thread, V of tile
// 1 waited for K of tile 2, that is for both consumers' first Q K^T). n as
// for fjh_produce.
__device__ __forceinline__ void fjh_produce_one(const fj_fwd_params &p,
                                                const fj_tma_maps &maps,
                                                const fjh_smem_map &sm, int which,
                                                const fjh_item &it, int &n) {
  const int hk = it.h / p.kv_group;
  int cls = FJ_TILE_FULL, t = it.t;
  fjh_stage st = fjh_stage_of(n);
  fjh_trace_loads tr(p, it.b, it.h, it.q0);
  for (int j = it.hi; j >= it.lo; j = fjh_advance(p, it, j, &t, &cls)) {
    if (which == 0) {
      fjh_load_k(p, maps, sm, st, it, j, hk);
      tr.k_issued();
    } else {
      fjh_load_v(p, maps, sm, st, it, j, hk);
      tr.v_issued();
    }
    st = fjh_stage_next(st);
    ++n;
  }
}
