// templates/sm80/mainloop.cuh: one step of a warp over a sub-tile of
// FJK_SUB_N kv columns: S = Q K^T with mma.sync from ldmatrix fragments,
// score_mod, the mask and the kv bound, the online softmax, and O += P V.
// (The softmax stays in this one function: split off, its scores crossed a
// function boundary and the compiler numbered their registers otherwise,
// which changed ptxas's schedule.)
#pragma once

// The exponent shift of a row is raised only when its max grows by more than
// FJK_RESCALE_THRESHOLD log2 units, and O is rescaled only when some row of
// the warp raised it. 0 is the exact FlashAttention-2 update, which still
// skips the O rescale on sub-tiles where no row's max grew. (A threshold of
// 8, FlashAttention-4's lazy rescaling, leaves the dominant key of a near
// one-hot row without P = 1 exactly, and its rounding roughly doubles the
// output error there.)
#define FJK_RESCALE_THRESHOLD 0.0f

// f(x, mt, nt, e) for every score of a warp's sub-tile: element e of n8
// block nt of m16 tile mt, row wq0 + 16 mt + g + 8 (e >> 1), column kv0 +
// 8 nt + 2 t4 + (e & 1).
template <class F>
__device__ __forceinline__ void fjk_each_score(float (&s)[FJK_MT][FJK_NT][4], const F &f) {
#pragma unroll
  for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < FJK_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(s[mt][nt][e], mt, nt, e);
}

// One online-softmax step of a warp over FJK_SUB_N kv columns starting at
// kv0, K and V rows at sk / sv in shared memory: S = Q K^T, score_mod, mask,
// running max and sum, O += P V.
__device__ __forceinline__ void fjk_tile_step(
    const fj_fwd_params &p, const fj_sizes &sz, int b, int h, int wq0, int kv0, bool need_mask,
    bool ragged, unsigned sk, unsigned sv, unsigned s_q, float exp_scale,
#if FJK_Q_IN_REGISTERS
    const unsigned (&qf)[FJK_MT][FJK_KT][4],
#endif
    float (&acc)[FJK_MT][FJK_DT][4], float (&row_m)[FJK_MT][2],
    float (&row_l)[FJK_MT][2]) {
  const int lt = fj_tid();
  const int warp = lt >> 5, lane = lt & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int Lk = sz.Lk;
  FJK_LANE_ADDRESSING(lane)
  (void)s_q;
  (void)h;
  (void)b;
  (void)wq0;
  (void)g;

  // ---- S = Q K^T ----
  float s[FJK_MT][FJK_NT][4];
#pragma unroll
  for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < FJK_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < FJK_KT; ++kk) {
#if FJK_Q_IN_REGISTERS
#define FJK_QA(mt) qf[mt][kk]
#else
    unsigned qa[FJK_MT][4];
#pragma unroll
    for (int mt = 0; mt < FJK_MT; ++mt)
      fjk_ldsm_x4(qa[mt], s_q + q_row + mt * 16 * FJK_ROW_BYTES + (((2 * kk) ^ x_q) << 4));
#define FJK_QA(mt) qa[mt]
#endif
    const unsigned k_col = ((2 * kk) ^ x_k) << 4;
#pragma unroll
    for (int np = 0; np < FJK_NT / 2; ++np) {
      unsigned kb[4];
      fjk_ldsm_x4(kb, sk + k_row + np * 16 * FJK_ROW_BYTES + k_col);
#pragma unroll
      for (int mt = 0; mt < FJK_MT; ++mt) {
        fjk_mma(s[mt][2 * np], FJK_QA(mt), kb[0], kb[1]);
        fjk_mma(s[mt][2 * np + 1], FJK_QA(mt), kb[2], kb[3]);
      }
    }
#undef FJK_QA
  }

  // ---- score_mod, then the mask and the kv bound ----
#if FJ_HAS_SCORE_MOD
  // Terms one value over the warp's sub-tile (FJ_SCORE_TILE: a relative
  // bias away from the diagonal) are computed once, an FMA a score.
#if FJ_SCORE_TILE
  float terms;
  if (fj_score_tile(p.user, sz, p.scale, b, h, wq0, wq0 + FJK_MT * 16 - 1, kv0,
                    kv0 + FJK_NT * 8 - 1, terms)) {
    fjk_each_score(s, [&](float &x, int, int, int) { x = fj_score_log2_tile(x, p.scale, terms); });
  } else
#endif
  {
    fjk_each_score(s, [&](float &x, int mt, int nt, int e) {
      x = fj_score_log2(p.user, sz, x, p.scale, b, h, wq0 + g, mt * 16 + (e >> 1) * 8,
                        kv0 + 2 * t4, nt * 8 + (e & 1));
    });
  }
#endif
  // The mask is evaluated on every element, past Lk too (fj_mask is total;
  // such results are dropped), without a branch per element: its buffer
  // reads then depend only on the row or the column, and the compiler loads
  // each once per sub-tile instead of once per element.
#if FJ_HAS_MASK
  if (need_mask) {
    fjk_each_score(s, [&](float &x, int mt, int nt, int e) {
      const int ki = kv0 + nt * 8 + 2 * t4 + (e & 1);
      const int qi = wq0 + mt * 16 + g + (e >> 1) * 8;
      const bool keep = (ki < Lk) & fj_mask(p.user, sz, b, h, qi, ki);
      x = keep ? x : fj_neg_inf();
    });
  } else
#endif
  if (ragged) {
    fjk_each_score(s, [&](float &x, int, int nt, int e) {
      if (kv0 + nt * 8 + 2 * t4 + (e & 1) >= Lk) x = fj_neg_inf();
    });
  }

  // ---- each row's max on the tile (log2 units): rows g and g + 8 of each
  // m16 tile, the four lanes of a quad holding the row between them ----
  float m_tile[FJK_MT][2];
#pragma unroll
  for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = fj_neg_inf();
#pragma unroll
      for (int nt = 0; nt < FJK_NT; ++nt)
        mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hh], s[mt][nt][2 * hh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      m_tile[mt][hh] = mx * exp_scale;
    }

#if FJ_SKIP
  // ---- Skip Softmax: when every row of the warp whose max on this
  // sub-tile is finite lies more than -skip_log2 below its running max
  // (rows past Lq agree), the warp skips the softmax update and P V. ----
  {
    bool skip = true;
#pragma unroll
    for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float m = m_tile[mt][hh];
        skip &= m == fj_neg_inf() || m < row_m[mt][hh] + p.skip_log2 ||
                wq0 + mt * 16 + g + 8 * hh >= sz.Lq;
      }
    if (__all_sync(0xffffffffu, skip)) return;
  }
#endif

  // ---- online softmax ----
  float alpha[FJK_MT][2], shift[FJK_MT][2];
  bool grow_any = false;
#pragma unroll
  for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float m_old = row_m[mt][hh], m_new = m_tile[mt][hh];
      // Raise the shift only when the max outgrows it by the threshold
      // (always when it was -inf and is no longer). -inf - -inf never occurs.
      const bool grow = m_new > m_old + FJK_RESCALE_THRESHOLD;
      alpha[mt][hh] = grow ? fj_exp2(m_old - m_new) : 1.0f;
      const float m_use = grow ? m_new : m_old;
      row_m[mt][hh] = m_use;
      // A row with nothing allowed yet keeps m = -inf; shifting by 0 instead
      // avoids (-inf) - (-inf) = NaN, and all its terms are 0 anyway.
      shift[mt][hh] = m_use == fj_neg_inf() ? 0.f : m_use;
      row_l[mt][hh] *= alpha[mt][hh];
      grow_any |= grow;
    }
  // Rescaling O costs a multiply per accumulator; skip it when no row of the
  // warp moved its shift (the common case after the first tiles).
  if (__any_sync(0xffffffffu, grow_any)) {
#pragma unroll
    for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
      for (int dt = 0; dt < FJK_DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][dt][e] *= alpha[mt][e >> 1];
  }

  unsigned pf[FJK_MT][FJK_PT][4];  // P as A fragments of P.V
#pragma unroll
  for (int mt = 0; mt < FJK_MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < FJK_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[mt][nt][e] = fj_exp2(fmaf(s[mt][nt][e], exp_scale, -shift[mt][e >> 1]));
    // The accumulator layout of S (n8 tiles 2k and 2k+1) is exactly the
    // A-fragment layout of P for k16 step k: no shared-memory round trip.
#pragma unroll
    for (int kt = 0; kt < FJK_PT; ++kt) {
      pf[mt][kt][0] = fj_pack2(s[mt][2 * kt][0], s[mt][2 * kt][1]);
      pf[mt][kt][1] = fj_pack2(s[mt][2 * kt][2], s[mt][2 * kt][3]);
      pf[mt][kt][2] = fj_pack2(s[mt][2 * kt + 1][0], s[mt][2 * kt + 1][1]);
      pf[mt][kt][3] = fj_pack2(s[mt][2 * kt + 1][2], s[mt][2 * kt + 1][3]);
    }
    // Partial row sums of the f32 P (not the rounded P that P.V uses: the
    // LSE must be the log of the true sum) stay per lane; the quad is summed
    // once at the end.
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < FJK_NT; ++nt) {
      sum0 += s[mt][nt][0] + s[mt][nt][1];
      sum1 += s[mt][nt][2] + s[mt][nt][3];
    }
    row_l[mt][0] += sum0;
    row_l[mt][1] += sum1;
  }

  // ---- O += P V ----
#pragma unroll
  for (int dp = 0; dp < FJK_DT / 2; ++dp) {
    const unsigned v_col = ((2 * dp) ^ x_v) << 4;
#pragma unroll
    for (int kt = 0; kt < FJK_PT; ++kt) {
      unsigned vb[4];
      fjk_ldsm_x4_trans(vb, sv + v_row + kt * 16 * FJK_ROW_BYTES + v_col);
#pragma unroll
      for (int mt = 0; mt < FJK_MT; ++mt) {
        fjk_mma(acc[mt][2 * dp], pf[mt][kt], vb[0], vb[1]);
        fjk_mma(acc[mt][2 * dp + 1], pf[mt][kt], vb[2], vb[3]);
      }
    }
  }
}
