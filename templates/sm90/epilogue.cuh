// templates/sm90/epilogue.cuh: a consumer's O / l and LSE to global memory,
// and the three ways the schedulers use (one for each kind of kernel, as
// Sched::epilogue): through the CTA's Q area (the one-tile kernel), through
// the item's own Q buffer (the persistent kernel with two), or from
// registers (the persistent kernel with one Q buffer, which the producer
// refills while the epilogue runs). Each also says when the item's Q buffer
// is free again.
#pragma once

// Sequence b's rows of O for head h (its first row q_row0 in packed o).
__device__ __forceinline__ fj_u16 *fjh_o_rows(const fj_fwd_params &p, int b, int h,
                                              int q_row0) {
  return (fj_u16 *)p.o + b * p.o_sb + h * p.o_sh + q_row0 * p.o_ss;
}
// Its LSE row for head h ([B, Hq, Lq], or [Hq, total_q] packed).
__device__ __forceinline__ float *fjh_lse_row(const fj_fwd_params &p, int b, int h,
                                              int q_row0) {
  return p.lse + b * p.lse_sb + h * p.lse_sh + q_row0;
}

// A consumer's 64 rows of O from shared memory (sq, 128-byte swizzle) to
// global memory, 16 bytes a thread at a time, the item's stored rows only
// (below fjh_tile_q_end): the epilogue's copy where O has no tensor map
// (packed O among others: a TMA store would write past the sequence's end
// into the next), or where the rows end inside the consumer's 64.
__device__ __forceinline__ void fjh_store_o_rows(const fj_fwd_params &p, const fjh_item &it,
                                                 int wq0, unsigned sq, int q_row0) {
  const int tid = threadIdx.x & 127;
  const int q_end = fjh_tile_q_end(p, it);
  fj_u16 *go = fjh_o_rows(p, it.b, it.h, q_row0);
  constexpr int CH = FJ_HEAD_DIM / 8;  // 16-byte chunks per row
#pragma unroll
  for (int it = 0; it < FJH_WG_ROWS * CH / 128; ++it) {
    const int idx = it * 128 + tid;
    const int r = idx / CH, ch = idx % CH;
    if (wq0 + r < q_end) {
      const unsigned addr = sq + (ch / 8) * (FJ_BLOCK_M * 128) + r * 128 +
                            (((ch % 8) ^ (r & 7)) << 4);
      unsigned v0, v1, v2, v3;
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(addr));
      fj_st_global_v4(go + (long long)(wq0 + r) * p.o_ss + ch * 8, v0, v1, v2, v3);
    }
  }
}


// Epilogue of consumer c: O / l into its 64 rows of the Q area (the Q tile
// is dead once its last Q K^T completed), then to global memory (a TMA
// store issued by its thread 0, which waits only until the copy has read
// the buffer, or where O has no tensor map or the item's stored rows end
// inside the consumer's 64, 16-byte coalesced stores of the stored rows by
// all its threads: fjh_store_o_rows), and the LSE.
// defer: thread 0 leaves the wait for the store's reads to its caller
// (fjh_epi_q_buffer).
__device__ __forceinline__ void fjh_epilogue(const fj_fwd_params &p, const fj_tma_maps &maps,
                                             int c, const fjh_item &it, int wq0, unsigned sq,
                                             float (&o)[FJH_O_REGS], const float (&row_m)[2],
                                             float (&row_l)[2], bool defer = false) {
  const int b = it.b, h = it.h;
  const int q_row0 = fjh_q_row0(p, b);
  const int tid = threadIdx.x & 127;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  float inv_l[2];
  fjh_row_sums(row_l, inv_l);
  // Every warp of this consumer is past its last wgmma before Q is reused.
  fjh_bar_sync(FJH_BAR_EPI + c, 128);
  // One stmatrix.x4 stores four 8 x 8 blocks: 8-column groups i and i + 1,
  // rows g and g + 8 of the warp's 16 (the accumulator's own layout); lane
  // l gives the address of row l % 8 of block l / 8 (as fast as a 32-bit
  // store per element pair, with 8 instructions instead of 64 at D=128).
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
    fjh_stmatrix_x4(addr, v0, v1, v2, v3);
  }
  // A TMA box writes all 64 rows (those past Lq fall outside the map): not
  // where tile 0 ends inside them, before tile 1's rows.
  const int q_end = fjh_tile_q_end(p, it);
  if (maps.o_ok && (q_end == it.Lq || wq0 + FJH_WG_ROWS <= q_end)) {
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
    fjh_store_o_rows(p, it, wq0, sq, q_row0);
  }
  if (!FJH_TRACING && p.lse != nullptr && t4 == 0) {
    float *gl = fjh_lse_row(p, b, h, q_row0);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int qi = wq0 + 16 * warp + g + 8 * hh;
      if (qi < q_end) {
        gl[qi] = fjh_lse(row_m[hh], row_l[hh]);
      }
    }
  }
}


// Epilogue of the persistent kernel: O / l straight from registers to
// global memory (each quad of lanes writes 16 contiguous bytes of a row),
// without the Q area, which the producer refills with the next item's Q
// while this runs.
__device__ __forceinline__ void fjh_epilogue_regs(const fj_fwd_params &p, const fjh_item &it,
                                                  int wq0, const float (&o)[FJH_O_REGS],
                                                  const float (&row_m)[2],
                                                  float (&row_l)[2]) {
  const int tid = threadIdx.x & 127;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int q_end = fjh_tile_q_end(p, it);
  const int q_row0 = fjh_q_row0(p, it.b);
  fj_u16 *go = fjh_o_rows(p, it.b, it.h, q_row0);
  float inv_l[2];
  fjh_row_sums(row_l, inv_l);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int qi = wq0 + 16 * warp + g + 8 * hh;
    if (qi < q_end) {
      unsigned *row = (unsigned *)(go + (long long)qi * p.o_ss) + t4;
#pragma unroll
      for (int i = 0; i < FJH_O_REGS / 4; ++i)
        row[4 * i] =
            fj_pack2(o[4 * i + 2 * hh] * inv_l[hh], o[4 * i + 2 * hh + 1] * inv_l[hh]);
      if (!FJH_TRACING && p.lse != nullptr && t4 == 0)
        fjh_lse_row(p, it.b, it.h, q_row0)[qi] = fjh_lse(row_m[hh], row_l[hh]);
    }
  }
}

// Epilogue of a work item without tiles: O = 0 and LSE = -inf for the
// consumer's stored rows (below fjh_tile_q_end), without shared memory.
__device__ __forceinline__ void fjh_epilogue_empty(const fj_fwd_params &p, const fjh_item &it,
                                                   int wq0) {
  const int tid = threadIdx.x & 127;
  const int q_end = fjh_tile_q_end(p, it);
  const int q_row0 = fjh_q_row0(p, it.b);
  fj_u16 *go = fjh_o_rows(p, it.b, it.h, q_row0);
  constexpr int CH = FJ_HEAD_DIM / 8;  // 16-byte chunks per row
  for (int idx = tid; idx < FJH_WG_ROWS * CH; idx += 128) {
    const int r = idx / CH, ch = idx % CH;
    if (wq0 + r < q_end)
      fj_st_global_v4(go + (long long)(wq0 + r) * p.o_ss + ch * 8, 0u, 0u, 0u, 0u);
  }
  if (p.lse != nullptr && tid < FJH_WG_ROWS && wq0 + tid < q_end)
    fjh_lse_row(p, it.b, it.h, q_row0)[wq0 + tid] = fj_neg_inf();
}

// The one-tile kernel's epilogue: through the CTA's Q area.
struct fjh_epi_q_area {
  enum { empty_apart = 0 };  // an item without tiles takes store() too
  __device__ __forceinline__ void after_first_qk(const fjh_smem_map &) {}
  __device__ __forceinline__ void after_last_qk(const fjh_smem_map &, int) {}
  __device__ __forceinline__ void store(const fj_fwd_params &p, const fj_tma_maps &maps,
                                        const fjh_smem_map &sm, const fjh_item &it,
                                        const fjh_rows &r, float (&o)[FJH_O_REGS],
                                        const float (&row_m)[2], float (&row_l)[2]) {
    // A row without tiles still had its Q loaded (at the start of the
    // kernel): the epilogue writes over the Q area only once it has landed.
    if (it.lo > it.hi) fjh_mbar_wait_warp(sm.q_full(0), 0);
    fjh_epilogue(p, maps, r.c, it, r.wq0, r.sq, o, row_m, row_l);
  }
  __device__ __forceinline__ void empty(const fj_fwd_params &, const fjh_smem_map &,
                                        const fjh_item &, const fjh_rows &) {}
  __device__ __forceinline__ void finish(const fjh_smem_map &) {}
};

// The persistent kernel's epilogue with two Q buffers: O through the item's
// own Q buffer (its Q K^T are done), which is then the producer's again.
// The stmatrix writes (generic proxy) come before the next TMA load into it
// (async proxy): fence, then arrive. The storing thread does not wait for
// its TMA store to read the buffer before the next item: its arrival waits
// in q_pending (the buffer, -1 when none) until it has issued the next
// item's first Q K^T (after_first_qk), since the buffer's next Q is an item
// away.
struct fjh_epi_q_buffer {
  enum { empty_apart = 1 };  // an item without tiles takes empty()
  int q_pending = -1;
  // The storing thread's arrival on the pending buffer, once the TMA store
  // that read it is done reading.
  __device__ __forceinline__ void release(const fjh_smem_map &sm) {
    if (q_pending >= 0) {
      fjh_bulk_wait_read();
      fjh_mbar_arrive(sm.q_empty(q_pending));
      q_pending = -1;
    }
  }
  __device__ __forceinline__ void after_first_qk(const fjh_smem_map &sm) { release(sm); }
  __device__ __forceinline__ void after_last_qk(const fjh_smem_map &, int) {}
  __device__ __forceinline__ void store(const fj_fwd_params &p, const fj_tma_maps &maps,
                                        const fjh_smem_map &sm, const fjh_item &it,
                                        const fjh_rows &r, float (&o)[FJH_O_REGS],
                                        const float (&row_m)[2], float (&row_l)[2]) {
    const bool defer = maps.o_ok;
    // A guard: q_pending is -1 here on every path (the item's first Q K^T
    // released the one before). Kept because removing it reschedules the
    // persistent kernels, whose speed was measured with it.
    release(sm);
    fjh_epilogue(p, maps, r.c, it, r.wq0, r.sq, o, row_m, row_l, defer);
    fjh_fence_proxy_async();
    if (defer && (threadIdx.x & 127) == 0)
      q_pending = r.qb;
    else
      fjh_mbar_arrive(sm.q_empty(r.qb));
  }
  // No tile: the item's Q was loaded all the same (the producer issues it
  // before the scan); once it has landed the buffer is free again. O = 0
  // and LSE = -inf straight to global memory.
  __device__ __forceinline__ void empty(const fj_fwd_params &p, const fjh_smem_map &sm,
                                        const fjh_item &it, const fjh_rows &r) {
    release(sm);
    fjh_mbar_wait_warp(sm.q_full(r.qb), r.q_ph);
    fjh_mbar_arrive(sm.q_empty(r.qb));
    fjh_epilogue_empty(p, it, r.wq0);
  }
  // The last store has read shared memory.
  __device__ __forceinline__ void finish(const fjh_smem_map &sm) { release(sm); }
};

// The persistent kernel's epilogue with one Q buffer (D=256): O from
// registers; the buffer is free for the next item's Q once every Q K^T of
// this one has completed.
struct fjh_epi_registers {
  enum { empty_apart = 1 };  // an item without tiles takes empty()
  __device__ __forceinline__ void after_first_qk(const fjh_smem_map &) {}
  __device__ __forceinline__ void after_last_qk(const fjh_smem_map &sm, int qb) {
    fjh_mbar_arrive(sm.q_empty(qb));
  }
  __device__ __forceinline__ void store(const fj_fwd_params &p, const fj_tma_maps &,
                                        const fjh_smem_map &, const fjh_item &it,
                                        const fjh_rows &r, float (&o)[FJH_O_REGS],
                                        const float (&row_m)[2], float (&row_l)[2]) {
    fjh_epilogue_regs(p, it, r.wq0, o, row_m, row_l);
  }
  // As fjh_epi_q_buffer's.
  __device__ __forceinline__ void empty(const fj_fwd_params &p, const fjh_smem_map &sm,
                                        const fjh_item &it, const fjh_rows &r) {
    fjh_mbar_wait_warp(sm.q_full(r.qb), r.q_ph);
    fjh_mbar_arrive(sm.q_empty(r.qb));
    fjh_epilogue_empty(p, it, r.wq0);
  }
  __device__ __forceinline__ void finish(const fjh_smem_map &) {}
};
