// templates/sm90/pipeline.cuh: the shared-memory pipeline: where the Q
// buffers, the K/V stages and their mbarriers live, how a role steps from
// stage to stage, and a TMA load of one tile into a stage once the stage is
// free. It knows nothing of what the consumers compute.
#pragma once

// Shared-memory map: FJ_Q_BUFS Q buffers (FJ_BLOCK_M rows), then
// FJ_NUM_STAGES K tiles, then FJ_NUM_STAGES V tiles, each stored as
// FJH_CHUNKS64 blocks of (rows x 64 elements) in TMA's 128-byte swizzle;
// then the mbarriers: Q buffer 0 full, and each stage's K full, V full,
// K empty and V empty. The persistent kernel has more, in static shared
// memory at pbar (fjh_persist): Q buffer 0 empty, the work ring's two full
// and two empty slots, Q buffer 1 full, Q buffer 1 empty.
struct fjh_smem_map {
  unsigned q, k, v, bar;
  unsigned pbar;  // persistent kernel only
  __device__ unsigned k_tile(int s) const { return k + s * FJH_KV_BYTES; }
  __device__ unsigned v_tile(int s) const { return v + s * FJH_KV_BYTES; }
  __device__ unsigned q_tile(int i) const { return q + i * FJH_Q_BYTES; }
  __device__ unsigned q_full(int i) const { return i == 0 ? bar : pbar + 8 * 5; }
  __device__ unsigned q_empty(int i) const { return pbar + 8 * 6 * i; }
  __device__ unsigned k_full(int s) const { return bar + 8 * (1 + s); }
  __device__ unsigned v_full(int s) const { return bar + 8 * (1 + FJ_NUM_STAGES + s); }
  __device__ unsigned k_empty(int s) const { return bar + 8 * (1 + 2 * FJ_NUM_STAGES + s); }
  __device__ unsigned v_empty(int s) const { return bar + 8 * (1 + 3 * FJ_NUM_STAGES + s); }
};

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

// The stage's K (or V: tile, full and empty are that stage's) for kv block j
// of item it, KV head hk (rows kv0 = j * FJ_BLOCK_N ..), once the consumers
// have released that stage's previous use (the empty barrier's phase
// before). Contiguous or packed k and v: the map is (D, L, Hkv, B), one box
// a 64-column block at row k_row0 + kv0 of batch b (batch 0 when packed:
// the map is one batch of total_k rows; rows past the sequence's end are
// the next sequence's or zero fill, masked in S and zeroed in V by
// fjh_v_tail).
//
// Paged KV: the map is the pool (D, page_size, Hkv, num_pages), in boxes of
// R rows, R = the largest power of two that divides page_size, at most
// FJ_BLOCK_N (runtime/tma.c encodes the same R): each box lies in one page
// (R divides page_size and kv0), at row r of page block_table[b][pi]. Only
// boxes with rows below the sequence's Lk are issued and only their
// block-table entries read; the full barrier expects those boxes' bytes,
// and the tile's rows past them keep what the stage held, which the kv
// bound masks in S and fjh_v_tail zeroes in V. The entries are copied into
// shared memory all together (cp.async, before the wait for the stage):
// loaded into registers one before each box, their latencies added up (the
// TMA's asm orders memory), and all in registers the one-tile kernel's
// 24-register producer spilled them. which: 0 for K, 1 for V (their
// threads differ in the persistent kernel: a row of entries each).
__device__ __forceinline__ unsigned fjh_page_stage(int which) {
  __shared__ int pages[2][FJ_BLOCK_N / 16];
  return fj_smem_u32(&pages[which][0]);
}
__device__ __forceinline__ void fjh_load_kv_paged(const fj_fwd_params &p,
                                                  const fjh_tensor_map *map, unsigned tile,
                                                  unsigned full, unsigned empty, fjh_stage st,
                                                  const fjh_item &it, int kv0, int hk,
                                                  int which) {
  const int ps = p.page_size;
  const int R = min(ps & -ps, FJ_BLOCK_N);
  const int end = min(it.Lk, kv0 + FJ_BLOCK_N);  // boxes from kv0 while below it
  const int *bt = p.block_table + it.b * p.bt_stride;
  const unsigned pages = fjh_page_stage(which);
  // Few values live in these loops (a position, the page's by a division):
  // the producer has 24 to 56 registers.
  for (int pos = kv0; pos < end; pos += R)
    fjh_cp_async4(pages + 4 * ((pos - kv0) / R), bt + pos / ps);
  fjh_mbar_wait(empty, st.ph ^ 1u);
  fjh_cp_async_wait_all();
  fjh_mbar_arrive_expect_tx(full, (end - kv0 + R - 1) / R * R * (FJ_HEAD_DIM * 2));
  for (int pos = kv0; pos < end; pos += R) {
    const int pi = pos / ps;
    int page;
    asm volatile("ld.shared.b32 %0, [%1];\n"
                 : "=r"(page) : "r"(pages + 4 * ((pos - kv0) / R)) : "memory");
#pragma unroll
    for (int c = 0; c < FJH_CHUNKS64; ++c)
      fjh_tma_load_4d(tile + c * FJ_BLOCK_N * 128 + (pos - kv0) * 128, map, c * 64,
                      pos - pi * ps, hk, page, full);
  }
}
__device__ __forceinline__ void fjh_load_kv(const fj_fwd_params &p, const fjh_tensor_map *map,
                                            unsigned tile, unsigned full, unsigned empty,
                                            fjh_stage st, const fjh_item &it, int j, int hk,
                                            int which) {
  const int kv0 = j * FJ_BLOCK_N;
  if (fj_block_table(p) != nullptr) {
    fjh_load_kv_paged(p, map, tile, full, empty, st, it, kv0, hk, which);
    return;
  }
  const int b = fj_cu_seqlens_k(p) != nullptr ? 0 : it.b;
  const int row = fjh_k_row0(p, it.b) + kv0;
  fjh_mbar_wait(empty, st.ph ^ 1u);
  fjh_mbar_arrive_expect_tx(full, FJH_KV_BYTES);
#pragma unroll
  for (int c = 0; c < FJH_CHUNKS64; ++c)
    fjh_tma_load_4d(tile + c * FJ_BLOCK_N * 128, map, c * 64, row, hk, b, full);
}
