// templates/sm90/mainloop.cuh: a consumer warpgroup's pass over one work
// item's kv tiles: S = Q K^T and O += P V on the tensor cores (wgmma), the
// ping-pong with the other consumers, the softmax between the GEMMs, and
// the release of each K and V stage. Then fjh_consume, a consumer's whole
// item: the pass and the epilogue. Scheduler-specific steps (when the Q
// buffer is freed, how O is stored, whether the ping-pong ring restarts at
// an item) come from the scheduler's types (scheduler.cuh).
#pragma once

// A consumer warpgroup's part of an item: consumer c (0 .. FJH_NC - 1) owns
// query rows wq0 = q0 + 64 c .. + 63, in Q buffer qb (phase q_ph for this
// item), whose rows start at sq in shared memory.
struct fjh_rows {
  int c, wq0, qb;
  unsigned q_ph, sq;
};
// wgmma descriptor low words of the consumer's Q rows and of K and V
// stage s (s * FJH_KV_BYTES further than stage 0).
struct fjh_descs {
  unsigned q, k, v;  // stage 0 of K and V
  __device__ __forceinline__ fjh_descs(const fjh_smem_map &sm, unsigned sq)
      : q(fjh_desc_lo(sq, 16)), k(fjh_desc_lo(sm.k, 16)),
        v(fjh_desc_lo(sm.v, FJ_BLOCK_N * 128)) {}
  __device__ __forceinline__ unsigned k_at(int s) const { return k + s * (FJH_KV_BYTES >> 4); }
  __device__ __forceinline__ unsigned v_at(int s) const { return v + s * (FJH_KV_BYTES >> 4); }
};

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

// One k16 step of O += P V. At D=256 (128 accumulators, more than one asm
// statement carries) as two m64n128k16 in the layout of one m64n256k16:
// columns 0-127 from V's 64-column blocks 0 and 1, columns 128-255 from
// blocks 2 and 3 (2 * FJ_BLOCK_N * 128 bytes further).
template <int N>
__device__ __forceinline__ void fjh_pv_step(float (&o)[N], const unsigned (&a)[4],
                                            unsigned long long db) {
  if constexpr (N == 128) {
    fjh_wgmma_rs(*reinterpret_cast<float(*)[64]>(&o[0]), a, db);
    fjh_wgmma_rs(*reinterpret_cast<float(*)[64]>(&o[64]), a,
                 db + ((2u * FJ_BLOCK_N * 128u) >> 4));
  } else {
    fjh_wgmma_rs(o, a, db);
  }
}
// O += P V with P (this thread's A fragments) in registers; dv is the
// descriptor low word of the V tile.
__device__ __forceinline__ void fjh_issue_pv(float (&o)[FJH_O_REGS],
                                             const unsigned (&pf)[FJH_PK][4], unsigned dv) {
#pragma unroll
  for (int kk = 0; kk < FJH_PK; ++kk) fjh_pv_step(o, pf[kk], fjh_desc(dv, kk * 16 * 128));
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

// Ping-pong (FJ_PINGPONG): consumer c issues its GEMMs once the one before
// it in the ring 0, 1 (, 2), 0, ... has issued its own (barrier 1 + c, 256
// threads: 128 arrive, 128 wait). The last consumer gives consumer 0 the
// first turn. ACROSS_ITEMS (the persistent kernel): once a CTA, and the
// turns run on from item to item, so consumer 0 starts the next item's
// first Q K^T while the last consumer finishes this one; else once an item,
// whose last turn the last consumer then keeps. Every bar.sync gets exactly
// one arrival.
template <bool ACROSS_ITEMS>
struct fjh_pingpong {
  __device__ __forceinline__ static void begin_cta(int c) {
    if (FJ_PINGPONG && ACROSS_ITEMS && c == FJH_NC - 1) fjh_bar_arrive(FJH_BAR_SCHED + 0, 256);
  }
  __device__ __forceinline__ static void begin_item(int c) {
    if (FJ_PINGPONG && !ACROSS_ITEMS && c == FJH_NC - 1)
      fjh_bar_arrive(FJH_BAR_SCHED + 0, 256);
  }
  __device__ __forceinline__ static void wait(int c) {
    if (FJ_PINGPONG) fjh_bar_sync(FJH_BAR_SCHED + c, 256);
  }
  __device__ __forceinline__ static void arrive(int c, bool last) {
    if (FJ_PINGPONG && (ACROSS_ITEMS || !(last && c == FJH_NC - 1)))
      fjh_bar_arrive(FJH_BAR_SCHED + (c == FJH_NC - 1 ? 0 : c + 1), 256);
  }
  // Consumer 0 takes the last consumer's last arrival.
  __device__ __forceinline__ static void end_cta(int c) {
    if (ACROSS_ITEMS && c == 0) wait(0);
  }
};

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
// beside it (bench/sass_check.py checks the order).
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

// Under the serving layouts (fjh_kv_ragged) the V rows at or past the
// sequence's Lk of the tile at kv0 may hold anything: a page's unwritten
// tail (NaN included), the next sequence's rows, or what the stage held
// before where a paged box was not issued; P V would turn their zero
// probabilities times NaN into NaN. Consumer c zeroes them in stage st once
// the tile has landed and before its P V reads them: its own writes, fenced
// for the async proxy (wgmma's reads) and ordered by its warpgroup's
// barrier (the other consumers write the same zeros). Only a tile that
// reaches past Lk has such rows: the walk's first (it is walked from hi
// down), so this costs nothing on the others.
__device__ __forceinline__ void fjh_v_tail(const fj_fwd_params &p, const fjh_smem_map &sm,
                                           fjh_stage st, int c, int kv0, int Lk) {
  if (!fjh_kv_ragged(p) || kv0 + FJ_BLOCK_N <= Lk) return;
  fjh_mbar_wait_warp(sm.v_full(st.s), st.ph);
  const unsigned v = sm.v_tile(st.s);
  // 16-byte pieces i = 8 r + k of the rows r >= Lk - kv0 of each 64-column
  // block (a row is 128 bytes whatever its swizzle).
  for (int i = (Lk - kv0) * 8 + (int)(threadIdx.x & 127); i < FJ_BLOCK_N * 8; i += 128) {
#pragma unroll
    for (int cb = 0; cb < FJH_CHUNKS64; ++cb)
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n"
                   :: "r"(v + cb * (FJ_BLOCK_N * 128) + i * 16), "r"(0) : "memory");
  }
  fjh_fence_proxy_async();
  fjh_bar_sync(FJH_BAR_EPI + c, 128);
}

// Without a score_mod the exponent is fma(qk, scale_log2, -m) and the max
// is taken on unscaled q.k; with one, scores are in log2 units already.
__device__ __forceinline__ float fjh_exp_scale(const fj_fwd_params &p) {
#if FJ_HAS_SCORE_MOD
  (void)p;
  return 1.0f;
#else
  return p.scale_log2;
#endif
}

// The start of a consumer's item: its rows, O = 0, no max and no sum yet.
__device__ __forceinline__ fjh_rows fjh_item_begin(const fjh_smem_map &sm, int c,
                                                   const fjh_item &it, float (&o)[FJH_O_REGS],
                                                   float (&row_m)[2], float (&row_l)[2]) {
  const int wq0 = it.q0 + FJH_WG_ROWS * c;
  const int qb = it.k % FJ_Q_BUFS;
  const unsigned q_ph = (unsigned)(it.k / FJ_Q_BUFS) & 1u;
  const unsigned sq = sm.q_tile(qb) + c * FJH_WG_ROWS * 128;
#pragma unroll
  for (int i = 0; i < FJH_O_REGS; ++i) o[i] = 0.f;
  row_m[0] = row_m[1] = fj_neg_inf();
  row_l[0] = row_l[1] = 0.f;
  return fjh_rows{c, wq0, qb, q_ph, sq};
}

// The item's tiles without the intra-warpgroup overlap (FJ_INTRA_WG_OVERLAP
// =0, the spill fallback): S, softmax, P V, one tile after the other.
template <class Sched>
__device__ __forceinline__ void fjh_tiles_serial(const fj_fwd_params &p, const fjh_smem_map &sm,
                                                 const fjh_item &it, const fjh_rows &r,
                                                 int &n_io, typename Sched::epilogue &epi,
                                                 float exp_scale, float (&o)[FJH_O_REGS],
                                                 float (&row_m)[2], float (&row_l)[2],
                                                 fjh_trace_consumer &tr) {
  using pingpong = typename Sched::pingpong;
  float s[FJH_S_REGS];
  unsigned pf[FJH_PK][4];
  float alpha[2];
  int n = n_io, j = it.hi, cls = it.hi_cls, t = it.t;
  fjh_terms tc(it);
  const fjh_descs d(sm, r.sq);
  fjh_stage st0 = fjh_stage_of(n);
  epi.after_first_qk(sm);
  while (j >= it.lo) {
    int cls_n;
    const int jn = fjh_advance(p, it, j, &t, &cls_n);
    pingpong::wait(r.c);
    fjh_mbar_wait_warp(sm.k_full(st0.s), st0.ph);
    fjh_wgmma_fence();
    fjh_issue_qk(s, d.q, d.k_at(st0.s));
    fjh_wgmma_commit();
    pingpong::arrive(r.c, jn < it.lo);
    fjh_wgmma_wait<0>();
    fjh_fence_regs(s);
    fjh_mbar_arrive(sm.k_empty(st0.s));
    fjh_softmax(p, fjh_sz(p, it), it.b, it.h, r.wq0, j * FJ_BLOCK_N,
                fjh_tile_mode(p, it, r.wq0, j * FJ_BLOCK_N, cls), exp_scale, tc, s, row_m,
                row_l, alpha);
    fjh_rescale_o(o, alpha);
    fjh_pack_p(s, pf);
    fjh_v_tail(p, sm, st0, r.c, j * FJ_BLOCK_N, it.Lk);
    fjh_mbar_wait_warp(sm.v_full(st0.s), st0.ph);
    fjh_wgmma_fence();
    fjh_issue_pv(o, pf, d.v_at(st0.s));
    fjh_wgmma_commit();
    fjh_pv_wait(o, pf, sm.v_empty(st0.s));
    j = jn;
    cls = cls_n;
    ++n;
    st0 = fjh_stage_next(st0);
  }
  tr.tiles(n - n_io);
  n_io = n;  // one past the last tile
  epi.after_last_qk(sm, r.qb);
}

// Consumer c's part of one work item: its tiles, then the epilogue. With
// the intra-warpgroup overlap (FJ_INTRA_WG_OVERLAP, the default), Q K^T of
// the next tile and P V of the current one are in flight together, and the
// softmax of the next runs while P V of the current one is still on the
// tensor cores. No register an in-flight wgmma reads or writes is defined
// in between: P is packed and O rescaled only after P V completed (ptxas
// would serialize every wgmma of the kernel otherwise, C7513). n counts the
// tiles the consumer walked (stages and phases), across items. (That loop
// is written out here, not in a function of its own: as a function, its
// parameters changed where the compiler placed their loads.)
template <class Sched>
__device__ __forceinline__ void fjh_consume(const fj_fwd_params &p, const fj_tma_maps &maps,
                                            const fjh_smem_map &sm, int c, const fjh_item &it,
                                            int &n_io, typename Sched::epilogue &epi) {
  using pingpong = typename Sched::pingpong;
  float o[FJH_O_REGS], row_m[2], row_l[2];
  const fjh_rows r = fjh_item_begin(sm, c, it, o, row_m, row_l);
  fjh_trace_consumer tr(p, it.b, it.h, it.q0, c);
  const float exp_scale = fjh_exp_scale(p);
  if (it.lo <= it.hi) {
    pingpong::begin_item(c);
    fjh_mbar_wait_warp(sm.q_full(r.qb), r.q_ph);
    tr.at(1);
    if constexpr (!FJ_INTRA_WG_OVERLAP) {
      fjh_tiles_serial<Sched>(p, sm, it, r, n_io, epi, exp_scale, o, row_m, row_l, tr);
    } else {
      float s[FJH_S_REGS];  // written first by fjh_wgmma_ss<true>
      unsigned pf[FJH_PK][4];
      float alpha[2];
      int n = n_io, j = it.hi, t = it.t;
      fjh_terms tc(it);
      const fjh_descs d(sm, r.sq);
      fjh_stage st0 = fjh_stage_of(n);  // tile j's stage, st1 the next tile's
      // Tile 0: S alone.
      pingpong::wait(c);
      fjh_mbar_wait_warp(sm.k_full(st0.s), st0.ph);
      tr.at(2);
      fjh_wgmma_fence();
      fjh_issue_qk(s, d.q, d.k_at(st0.s));
      fjh_wgmma_commit();
      pingpong::arrive(c, false);
      epi.after_first_qk(sm);
      fjh_wgmma_wait<0>();
      fjh_fence_regs(s);
      fjh_mbar_arrive(sm.k_empty(st0.s));
      fjh_softmax(p, fjh_sz(p, it), it.b, it.h, r.wq0, j * FJ_BLOCK_N,
                  fjh_tile_mode(p, it, r.wq0, j * FJ_BLOCK_N, it.hi_cls), exp_scale, tc, s,
                  row_m, row_l, alpha);
      fjh_pack_p(s, pf);
      fjh_v_tail(p, sm, st0, c, j * FJ_BLOCK_N, it.Lk);
      tr.at(3);
      int cls_n;
      int jn = fjh_advance(p, it, j, &t, &cls_n);
      fjh_stage st1 = fjh_stage_next(st0);
      int mode_n =
          jn >= it.lo ? fjh_tile_mode(p, it, r.wq0, jn * FJ_BLOCK_N, cls_n) : 0;
      // Steady state: S of tile jn, P V of tile j.
      while (jn >= it.lo) {
        tr.iteration(n - n_io);
        tr.loop(0);
        tr.loop(1);
        pingpong::wait(c);
        tr.loop(2);
        fjh_mbar_wait_warp(sm.k_full(st1.s), st1.ph);
        tr.loop(3);
        fjh_wgmma_fence();
        fjh_issue_qk(s, d.q, d.k_at(st1.s));
        fjh_wgmma_commit();
        fjh_mbar_wait_warp(sm.v_full(st0.s), st0.ph);
        fjh_issue_pv(o, pf, d.v_at(st0.s));
        fjh_wgmma_commit();
        pingpong::arrive(c, false);
        // The tile after jn and its mode while the tensor cores work: the
        // walk (a block mask's list in shared memory, or the classifier)
        // needs nothing of S, and its latency hides behind the GEMMs.
        const int j_after = fjh_advance(p, it, jn, &t, &cls_n);
        const int mode_after =
            j_after >= it.lo
                ? fjh_tile_mode(p, it, r.wq0, j_after * FJ_BLOCK_N, cls_n)
                : 0;
        tr.loop(4);
        fjh_wgmma_wait<1>();  // S of tile jn is ready, P V of tile j runs on
        fjh_fence_regs(s);
        tr.loop(5);
        fjh_mbar_arrive(sm.k_empty(st1.s));
        fjh_softmax(p, fjh_sz(p, it), it.b, it.h, r.wq0, jn * FJ_BLOCK_N, mode_n, exp_scale, tc,
                    s, row_m, row_l, alpha);
        tr.loop(6);
        fjh_pv_done(o, pf, alpha, sm.v_empty(st0.s));
        tr.loop(7);
        fjh_pack_p(s, pf);
        j = jn;
        ++n;
        st0 = st1;
        st1 = fjh_stage_next(st1);
        jn = j_after;
        mode_n = mode_after;
        tr.loop(8);
      }
      // Last tile: P V alone.
      tr.at(4);
      epi.after_last_qk(sm, r.qb);
      pingpong::wait(c);
      fjh_mbar_wait_warp(sm.v_full(st0.s), st0.ph);
      fjh_wgmma_fence();
      fjh_issue_pv(o, pf, d.v_at(st0.s));
      fjh_wgmma_commit();
      pingpong::arrive(c, true);
      fjh_pv_wait(o, pf, sm.v_empty(st0.s));
      tr.at(5);
      tr.tiles(n + 1 - n_io);
      n_io = n + 1;  // n was the last tile
    }
  }
  if (Sched::epilogue::empty_apart && it.lo > it.hi) {
    epi.empty(p, sm, it, r);
    return;
  }
  epi.store(p, maps, sm, it, r, o, row_m, row_l);
  tr.finish();
}
