// templates/sm90/softmax.cuh: the online softmax of one consumer
// warpgroup over a tile of scores in wgmma's accumulator layout: score_mod,
// the mask and the kv bound, the running max and sum, P in place of S, the
// factor O must be rescaled by, and at the end 1 / l and the LSE. It knows
// nothing of where S comes from or where P goes.
#pragma once

// The softmax keeps its running max until a row's scores exceed it by more
// than this many log2 units, so O is rescaled only then (FlashAttention-4's
// conditional rescaling); exponents stay below 2^FJH_RESCALE_SLACK.
#define FJH_RESCALE_SLACK 8

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

// The max of m[0 .. N-1] by a tree of halvings (a compile-time walk: a
// loop over the levels left the array in local memory); an odd middle
// element passes to the next level untouched.
template <int N>
struct fjh_max_tree {
  __device__ __forceinline__ static float run(float (&m)[FJH_S_REGS / 4]) {
    constexpr int H = (N + 1) / 2;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) m[i] = fmaxf(m[i], m[i + H]);
    return fjh_max_tree<H>::run(m);
  }
};
template <>
struct fjh_max_tree<1> {
  __device__ __forceinline__ static float run(float (&m)[FJH_S_REGS / 4]) { return m[0]; }
};

// The max of row hh (0: the thread's first row, 1: 8 below) of S: a tree,
// log2 of the row's length deep instead of a chain through all of it, then
// across the quad, whose four lanes hold the row between them.
__device__ __forceinline__ float fjh_row_max(const float (&s)[FJH_S_REGS], int hh) {
  float mt[FJH_S_REGS / 4];
#pragma unroll
  for (int i = 0; i < FJH_S_REGS / 4; ++i) mt[i] = fmaxf(s[4 * i + 2 * hh], s[4 * i + 2 * hh + 1]);
  float mx = fjh_max_tree<FJH_S_REGS / 4>::run(mt);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}

// Terms of the score_mod that are one value over many tiles (FJ_SCORE_TILE:
// a relative-position bias away from the diagonal), a consumer's state over
// an item's walk: the kv range [lo_kv, hi_kv] over which its rows' terms
// are one value, and that value. A tile inside it needs no check; a tile
// whose own check (fj_score_tile) finds its terms one value after a tile
// that did not (or as the item's first) checks the range from the item's
// first kv to its own end too, which under a causal mask, walked from the
// diagonal down, covers every tile left: a few checks an item rather than
// one a tile. Empty without FJ_SCORE_TILE.
struct fjh_terms {
#if FJ_SCORE_TILE
  int first_kv, lo_kv, hi_kv;
  float value;
  bool after_varied;
  __device__ __forceinline__ explicit fjh_terms(const fjh_item &it)
      : first_kv(it.lo * FJ_BLOCK_N), lo_kv(1), hi_kv(0), value(0.f), after_varied(true) {}
  // Whether the terms of rows wq0 .. wq0 + 63 are one value over the tile
  // at kv0, and that value.
  __device__ __forceinline__ bool at(const fj_fwd_params &p, const fj_sizes &sz, int b, int h,
                                     int wq0, int kv0, float &terms) {
    const int kv1 = kv0 + FJ_BLOCK_N - 1;
    if (lo_kv <= kv0 && kv1 <= hi_kv) {
      terms = value;
      return true;
    }
    const int q1 = wq0 + FJH_WG_ROWS - 1;
    const bool one = fj_score_tile(p.user, sz, p.scale, b, h, wq0, q1, kv0, kv1, terms);
    if (one && after_varied &&
        fj_score_tile(p.user, sz, p.scale, b, h, wq0, q1, first_kv, kv1, value)) {
      lo_kv = first_kv;
      hi_kv = kv1;
    }
    after_varied = !one;
    return one;
  }
#else
  __device__ __forceinline__ explicit fjh_terms(const fjh_item &) {}
#endif
};

#ifdef FJ_MASK_COLS
// A mask's column values over a kv tile, spread over a warp's lanes: lane L
// holds in cv[r] the values of the key 8 a + 2 (L % 4) + (L / 4) % 2 of the
// tile, a = (L / 8) FJH_COL_REGS + r (none where a is past the tile's
// FJ_BLOCK_N / 8 n8 blocks), so that the lanes that need a key (those with
// its L % 4, as the accumulator layout below deals columns) read it from
// register a % FJH_COL_REGS, a constant once the loops are unrolled, of
// lane fjh_col_lane.
constexpr int FJH_COL_REGS = (FJ_BLOCK_N / 8 + 3) / 4;
__device__ __forceinline__ int fjh_col_lane(int a, int e, int t4) {
  return 8 * (a / FJH_COL_REGS) + 4 * e + t4;
}
__device__ __forceinline__ void fjh_mask_cols(const fj_fwd_params &p, const fj_sizes &sz,
                                              int b, int h, int kv0,
                                              unsigned (&cv)[FJH_COL_REGS][FJ_MASK_COLS]) {
  const int lane = fj_tid() & 31;
  const int kv = kv0 + 2 * (lane & 3) + ((lane >> 2) & 1);
#pragma unroll
  for (int r = 0; r < FJH_COL_REGS; ++r) {
    const int a = (lane >> 3) * FJH_COL_REGS + r;
#pragma unroll
    for (int k = 0; k < FJ_MASK_COLS; ++k) cv[r][k] = 0u;
    if ((FJ_BLOCK_N / 8) % 4 == 0 || a < FJ_BLOCK_N / 8)
      fj_mask_cols(p.user, sz, b, h, kv + 8 * a, cv[r]);
  }
}
#endif

// Per-thread view of the accumulator layout of wgmma m64nN: this thread
// holds rows qr and qr + 8 (qr = first row of its warp + lane / 4), and in
// each n8 block i the columns 8 i + 2 (lane % 4) + {0, 1}; element 4 i + e
// is row qr + 8 (e >> 1), column 8 i + 2 (lane % 4) + (e & 1).
//
// score_mod, the mask and the kv bound on S, then the online-softmax update:
// running max (log2 units) and sum, alpha (the factor O must be scaled by)
// and P = exp2(...) in place of S. Same arithmetic as sm80/mainloop.cuh.
// sz: the sequence's sizes (fjh_sz), which the hooks see and whose Lk
// bounds the keys.
__device__ __forceinline__ void fjh_softmax(const fj_fwd_params &p, const fj_sizes &sz, int b,
                                            int h, int wq0, int kv0, int mode, float exp_scale,
                                            fjh_terms &tc, float (&s)[FJH_S_REGS],
                                            float (&row_m)[2], float (&row_l)[2],
                                            float (&alpha)[2]) {
  const int tid = fj_tid();
  const int t4 = tid & 3;
  // This thread's first row, derived here from a fresh read of tid rather
  // than kept in a register across the kv loop (that spilled at D=128).
  const int qr = wq0 + 16 * ((tid & 127) >> 5) + ((tid & 31) >> 2);
  const int Lk = sz.Lk;
  (void)b; (void)h; (void)qr; (void)tc;
#if FJ_HAS_SCORE_MOD
  // Terms that are one value over the consumer's rows of the tile (a
  // relative-position bias away from the diagonal, FJ_SCORE_TILE) are
  // computed once, and each score costs an FMA.
#if FJ_SCORE_TILE
  float terms;
  if (tc.at(p, sz, b, h, wq0, kv0, terms)) {
#pragma unroll
    for (int i = 0; i < FJH_S_REGS; ++i) s[i] = fj_score_log2_tile(s[i], p.scale, terms);
  } else
#endif
  {
#pragma unroll
    for (int i = 0; i < FJH_S_REGS; ++i) {
      s[i] = fj_score_log2(p.user, sz, s[i], p.scale, b, h, qr, 8 * ((i & 3) >> 1),
                           kv0 + 2 * t4, 8 * (i >> 2) + (i & 1));
    }
  }
#endif
  // The mask is evaluated on every element, past Lk too (fj_mask is total;
  // such results are dropped), without a branch per element: with one
  // (a short-circuit around the call) ptxas kept a branch and a
  // convergence barrier per element and a buffer mask's loads ran one after
  // the other; without, they issue together.
#if FJ_HAS_MASK
  if (mode == FJH_TILE_MASK) {
#ifdef FJ_MASK_COLS
    // A mask with column values (fj_mask_cols: a key's document id) reads
    // them once a warp, FJH_COL_REGS keys a lane, issued together, and hands
    // each to the lanes whose columns it is by a shuffle (fjh_col_lane),
    // instead of loading each of a thread's columns itself.
    unsigned cv[FJH_COL_REGS][FJ_MASK_COLS];
    fjh_mask_cols(p, sz, b, h, kv0, cv);
#pragma unroll
    for (int a = 0; a < FJ_BLOCK_N / 8; ++a) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        unsigned c[FJ_MASK_COLS];
#pragma unroll
        for (int k = 0; k < FJ_MASK_COLS; ++k)
          c[k] = __shfl_sync(0xffffffffu, cv[a % FJH_COL_REGS][k], fjh_col_lane(a, e, t4));
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int i = 4 * a + 2 * hh + e;
          const bool keep =
              fj_mask_from_cols(p.user, sz, b, h, qr + 8 * hh, kv0 + 8 * a + 2 * t4 + e, c);
          s[i] = keep ? s[i] : fj_neg_inf();
        }
      }
    }
#else
#pragma unroll
    for (int i = 0; i < FJH_S_REGS; ++i) {
      const int ki = kv0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
      const bool keep = fj_mask(p.user, sz, b, h, qr + 8 * ((i & 3) >> 1), ki);
      s[i] = keep ? s[i] : fj_neg_inf();
    }
#endif
  }
#endif
  if (kv0 + FJ_BLOCK_N > Lk) {
#pragma unroll
    for (int i = 0; i < FJH_S_REGS; ++i) {
      const int ki = kv0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
      if (ki >= Lk) s[i] = fj_neg_inf();
    }
  }
  // Each row's max on the tile; with Skip Softmax (FJ_SKIP) both first:
  // when every row of this warp whose max is finite lies more than
  // -skip_log2 below its running max (rows past Lq agree), its P is 0: no
  // exponentials, max and sum unchanged. (P V is the warpgroup's one wgmma:
  // it still runs, adding nothing.)
#if FJ_SKIP
  float mxs[2];
  bool skip = true;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    mxs[hh] = fjh_row_max(s, hh);
    const float m = mxs[hh] * exp_scale;
    skip &= m == fj_neg_inf() || m < row_m[hh] + p.skip_log2 || qr + 8 * hh >= sz.Lq;
  }
  if (__all_sync(0xffffffffu, skip)) {
#pragma unroll
    for (int i = 0; i < FJH_S_REGS; ++i) s[i] = 0.f;
    alpha[0] = alpha[1] = 1.0f;
    return;
  }
#endif
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
#if FJ_SKIP
    const float mx = mxs[hh];
#else
    const float mx = fjh_row_max(s, hh);
#endif
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

