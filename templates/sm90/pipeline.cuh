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

// Loads kv block j of head hk, batch b (rows j * FJ_BLOCK_N ..) into stage
// st of K (or V: tile, full and empty are that stage's) once the consumers
// have released that stage's previous use (the empty barrier's phase
// before).
__device__ __forceinline__ void fjh_load_kv(const fjh_tensor_map *map, unsigned tile,
                                            unsigned full, unsigned empty, fjh_stage st,
                                            int j, int hk, int b) {
  fjh_mbar_wait(empty, st.ph ^ 1u);
  fjh_mbar_arrive_expect_tx(full, FJH_KV_BYTES);
#pragma unroll
  for (int c = 0; c < FJH_CHUNKS64; ++c)
    fjh_tma_load_4d(tile + c * FJ_BLOCK_N * 128, map, c * 64, j * FJ_BLOCK_N, hk, b, full);
}
