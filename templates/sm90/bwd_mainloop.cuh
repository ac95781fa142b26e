// templates/sm90/bwd_mainloop.cuh: a consumer warpgroup's share of the
// backward (the scheme: sm90/bwd_config.cuh): for each work item S^T and
// dP^T, the elementwise P^T and dS^T, dV += P^T dO and dK += dS^T Q, dS^T
// into shared memory, its part of dQ = dS K (its half of the head dim, or
// with 128-row items its 64 query rows) into a dQ buffer for the writer
// warp (bwd.cuh); at the end dK and dV to global memory.
//
// A wgmma m64nN accumulator (N / 2 floats a thread of the warpgroup; t the
// thread's index in it, w = t / 32, g = (t % 32) / 4, t4 = t % 4): element
// i = 4 j + e is row 16 w + g + 8 (e >> 1), column 8 j + 2 t4 + (e & 1).
#pragma once

// acc (64 x FJ_BLOCK_M) = A B^T over the head dim, A the consumer's 64 rows
// of K or V (descriptor low word a_lo; the tile's 64-column blocks are
// FJ_BLOCK_N rows apart), B the stage's Q or dO (b_lo; blocks FJ_BLOCK_M
// rows apart); both K-major.
__device__ __forceinline__ void fjhb_issue_rows_d(float (&acc)[FJHB_S_REGS], unsigned a_lo,
                                                  unsigned b_lo) {
#pragma unroll
  for (int kk = 0; kk < FJ_HEAD_DIM / 16; ++kk) {
    const unsigned a = (kk / 4) * (FJ_BLOCK_N * 128) + (kk % 4) * 32;
    const unsigned b = (kk / 4) * (FJ_BLOCK_M * 128) + (kk % 4) * 32;
    if (kk == 0)
      fjh_wgmma_ss<true>(acc, fjh_desc(a_lo, a), fjh_desc(b_lo, b));
    else
      fjh_wgmma_ss<false>(acc, fjh_desc(a_lo, a), fjh_desc(b_lo, b));
  }
}

// acc (64 x FJ_HEAD_DIM) += A B over the item's queries: A in registers (P^T
// or dS^T repacked), B the stage's dO or Q read MN-major (b_lo, with the
// distance of its 64-column blocks as lbo).
__device__ __forceinline__ void fjhb_issue_rows_q(float (&acc)[FJHB_D_REGS],
                                                  const unsigned (&a)[FJHB_PK][4],
                                                  unsigned b_lo) {
#pragma unroll
  for (int kk = 0; kk < FJHB_PK; ++kk) fjh_wgmma_rs(acc, a[kk], fjh_desc(b_lo, kk * 16 * 128));
}

// The consumer's part of dQ = dS K (64 query rows x FJHB_DQ_COLS) over
// the CTA's FJ_BLOCK_N kv rows: A = dS^T (ds_lo: the 64-column block of
// the part's query rows) and B = K (k_lo: the part's first column) both
// MN-major, 16 kv rows (2048 bytes) a step.
__device__ __forceinline__ void fjhb_issue_dq(float (&acc)[FJHB_DQ_REGS], unsigned ds_lo,
                                              unsigned k_lo) {
#pragma unroll
  for (int kk = 0; kk < FJ_BLOCK_N / 16; ++kk) {
    if (kk == 0)
      fjh_wgmma_ss<true, 1>(acc, fjh_desc(ds_lo, 0), fjh_desc(k_lo, 0));
    else
      fjh_wgmma_ss<false, 1>(acc, fjh_desc(ds_lo, kk * 2048), fjh_desc(k_lo, kk * 2048));
  }
}

// Accumulators (64 x FJ_BLOCK_M) as the A fragments of a k16 step each:
// n8 blocks 2 kk and 2 kk + 1 are step kk's fragment, rounded to the
// element type. fjhb_pack_step packs step kk alone, for loops that let
// the accumulators die a step at a time.
__device__ __forceinline__ void fjhb_pack_step(const float (&x)[FJHB_S_REGS], int kk,
                                               unsigned (&a)[4]) {
  a[0] = fj_pack2(x[8 * kk + 0], x[8 * kk + 1]);
  a[1] = fj_pack2(x[8 * kk + 2], x[8 * kk + 3]);
  a[2] = fj_pack2(x[8 * kk + 4], x[8 * kk + 5]);
  a[3] = fj_pack2(x[8 * kk + 6], x[8 * kk + 7]);
}
__device__ __forceinline__ void fjhb_pack(const float (&x)[FJHB_S_REGS],
                                          unsigned (&a)[FJHB_PK][4]) {
#pragma unroll
  for (int kk = 0; kk < FJHB_PK; ++kk) fjhb_pack_step(x, kk, a[kk]);
}

__device__ __forceinline__ void fjhb_ld_shared_f2(unsigned addr, float &x, float &y) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(x), "=f"(y) : "r"(addr));
}
__device__ __forceinline__ void fjhb_st_shared_u32(unsigned addr, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(v) : "memory");
}

// The mask of query qi and kv row ki; with FJHB_ROWV from the query row's
// value rv (the stage's, read beside its LSE), else from fj_mask's own
// loads.
__device__ __forceinline__ bool fjhb_mask(const fj_bwd_params &p, const fj_sizes &z, int b,
                                          int h, int qi, int ki, unsigned rv) {
#if FJHB_ROWV
  const unsigned r[1] = {rv};
  return fj_mask_from_rows(p.user, z, b, h, qi, ki, r);
#else
  (void)rv;
  return fj_mask(p.user, z, b, h, qi, ki);
#endif
}
// The row values of a stage's rows 8 j + 2 t4 and the one after (FJHB_ROWV),
// else zeros.
__device__ __forceinline__ void fjhb_rowv_pair(unsigned s_rowv, int j, int t4,
                                               unsigned (&rv)[2]) {
#if FJHB_ROWV
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(rv[0]), "=r"(rv[1])
               : "r"(s_rowv + (8 * j + 2 * t4) * 4));
#else
  (void)s_rowv, (void)j, (void)t4;
  rv[0] = rv[1] = 0u;
#endif
}

// A masked pair's P is 0. With 64-row query tiles the loops below compute
// every element's exponential and then select (FJHB_SELECT_P): written as
// a conditional, ptxas makes each element's exponential a branch of its
// own, which slows masked items and, with a one-pass score_mod, every item.
// With 128-row tiles (D=64) the selecting forms spill (the document,
// prefix-LM and softcap kernels), so the conditional stays there.
#define FJHB_SELECT_P (FJ_BLOCK_M == 64)

// P^T and dS^T from S^T (s) and dP^T (dp), elementwise, packed into their
// A fragments (pa, dsa) a k16 step at a time, so that s and dp die step by
// step: query q0 + column, kv row wkv0 + row (the accumulator layout
// above) of a sequence of sizes z (fjb_seq_of); LSE (log2 units, +inf for
// a row without an allowed pair or past Lq) and delta from the stage's
// rows. need_mask: evaluate fj_mask per element; edge: rows or columns
// reach past Lk or Lq, which are masked. CHECK as for fjhb_probs below
// (the score_mod path takes true only).
template <bool CHECK>
__device__ __forceinline__ void fjhb_elementwise(const fj_bwd_params &p, const fj_sizes &z,
                                                 int b, int h, int q0,
                                                 int wkv0, bool need_mask, bool edge,
                                                 unsigned s_lse, unsigned s_delta,
                                                 unsigned s_rowv,
                                                 float (&s)[FJHB_S_REGS],
                                                 float (&dp)[FJHB_S_REGS],
                                                 unsigned (&pa)[FJHB_PK][4],
                                                 unsigned (&dsa)[FJHB_PK][4],
                                                 fj_grad_cache &gc) {
  const int t = fj_tid() & 127;
  const int w = t >> 5, g = (t >> 2) & 7, t4 = t & 3;
#pragma unroll
  for (int j = 0; j < FJ_BLOCK_M / 8; ++j) {
    float l2[2], dl[2];
    fjhb_ld_shared_f2(s_lse + (8 * j + 2 * t4) * 4, l2[0], l2[1]);
    fjhb_ld_shared_f2(s_delta + (8 * j + 2 * t4) * 4, dl[0], dl[1]);
    unsigned rv[2];
    fjhb_rowv_pair(s_rowv, j, t4, rv);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * j + e;
      const int qi = q0 + 8 * j + 2 * t4 + (e & 1);
      const int ki = wkv0 + 16 * w + g + 8 * (e >> 1);
#if FJ_HAS_SCORE_MOD
      const float score = s[i] * p.scale;
      const float x = fj_score_log2(p.user, z, s[i], p.scale, b, h, q0 + 2 * t4, 8 * j + (e & 1),
                                    wkv0 + 16 * w + g, 8 * (e >> 1));
#else
      const float x = s[i] * p.scale_log2;
#endif
      bool keep = true;
      if constexpr (CHECK) {
#if FJ_HAS_MASK
        if (need_mask) keep = fjhb_mask(p, z, b, h, qi, ki, rv[e & 1]);
#endif
        if (edge) keep = keep & (qi < z.Lq) & (ki < z.Lk);
      }
#if FJHB_SELECT_P
      const float ex = fj_exp2(x - l2[e & 1]);
      const float pr = keep ? ex : 0.f;
#else
      const float pr = keep ? fj_exp2(x - l2[e & 1]) : 0.f;
#endif
      float ds = pr * (dp[i] - dl[e & 1]);
#if FJ_HAS_SCORE_MOD
      // d score_mod / d score, and the trainable buffers' gradients, only
      // where the pair is allowed.
      if (keep) ds = fj_score_grad(p.user, p.grads, gc, z, score, b, h, qi, ki, ds);
#endif
      s[i] = pr;
      dp[i] = ds;
    }
    if (j % 2 == 1) {
      fjhb_pack_step(s, j / 2, pa[j / 2]);
      fjhb_pack_step(dp, j / 2, dsa[j / 2]);
    }
  }
  (void)need_mask, (void)edge, (void)gc;
}

// Without a score_mod, or with one whose derivative is 1 (FJ_SCORE_GRAD_ONE:
// an additive bias, applied here), the elementwise step is split in two so
// that each half runs beside a product on the tensor cores: P^T
// (fjhb_probs, while dP^T is computed), then dS^T (fjhb_dsoft, while dV +=
// P^T dO is), which needs no mask (a masked P is 0) and no score.
// CHECK (need_mask or edge, uniform over the warpgroup) is a template
// argument: the caller branches once, and the unmasked tiles' loop holds no
// index arithmetic (as one loop with per-element selects it ran 6% slower
// on causal attention).
//
// FJHB_MASK_SELECT: without a score_mod, the checked loop (PARTIAL and
// edge items only) evaluates the mask on every element, without a branch
// on need_mask or edge: with 64-row tiles always, with 128-row tiles when
// the mask reads no buffer (with a buffer read the document kernel
// spills). With a score_mod every item takes that loop, FULL ones too,
// which must not pay for the mask.
#define FJHB_MASK_SELECT \
  (!FJ_HAS_SCORE_MOD && (FJHB_SELECT_P || !FJ_MASK_LOADS))
// ONE_TERMS (FJ_SCORE_TILE): the score_mod's terms are one value over the
// tile, terms (fj_score_tile), and each score is one FMA with it.
template <bool CHECK, bool ONE_TERMS = false>
__device__ __forceinline__ void fjhb_probs(const fj_bwd_params &p, const fj_sizes &z, int b,
                                           int h, int q0,
                                           int wkv0, bool need_mask, bool edge,
                                           unsigned s_lse, unsigned s_rowv,
                                           float (&s)[FJHB_S_REGS],
                                           float terms = 0.f) {
  const int t = fj_tid() & 127;
  const int w = t >> 5, g = (t >> 2) & 7, t4 = t & 3;
#pragma unroll
  for (int j = 0; j < FJ_BLOCK_M / 8; ++j) {
    float l2[2];
    fjhb_ld_shared_f2(s_lse + (8 * j + 2 * t4) * 4, l2[0], l2[1]);
    unsigned rv[2] = {0u, 0u};
    if constexpr (CHECK) fjhb_rowv_pair(s_rowv, j, t4, rv);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * j + e;
      const int qi = q0 + 8 * j + 2 * t4 + (e & 1);
      const int ki = wkv0 + 16 * w + g + 8 * (e >> 1);
      bool keep = true;
      if constexpr (CHECK) {
#if FJHB_MASK_SELECT
#if FJ_HAS_MASK
        keep = fjhb_mask(p, z, b, h, qi, ki, rv[e & 1]) | !need_mask;
#endif
        keep = keep & ((qi < z.Lq) & (ki < z.Lk) | !edge);
#else
#if FJ_HAS_MASK
        if (need_mask) keep = fjhb_mask(p, z, b, h, qi, ki, rv[e & 1]);
#endif
        if (edge) keep = keep & (qi < z.Lq) & (ki < z.Lk);
#endif
      }
#if FJ_HAS_SCORE_MOD
      float x;
#if FJ_SCORE_TILE
      if constexpr (ONE_TERMS)
        x = fj_score_log2_tile(s[i], p.scale, terms);
      else
#endif
        x = fj_score_log2(p.user, z, s[i], p.scale, b, h, q0 + 2 * t4, 8 * j + (e & 1),
                          wkv0 + 16 * w + g, 8 * (e >> 1));
      s[i] = keep ? fj_exp2(x - l2[e & 1]) : 0.f;
#else
      // The exponent on every element, so that with 128-row tiles only the
      // exponential is under the condition, which ptxas predicates (fewer
      // instructions than with the fma under it too: docs/backward.md).
      (void)qi, (void)ki;
      const float x = fmaf(s[i], p.scale_log2, -l2[e & 1]);
#if FJHB_SELECT_P
      const float ex = fj_exp2(x);
      s[i] = keep ? ex : 0.f;
#else
      s[i] = keep ? fj_exp2(x) : 0.f;
#endif
#endif
    }
  }
  (void)need_mask, (void)b, (void)h, (void)w, (void)g, (void)q0, (void)wkv0, (void)edge;
  (void)terms;
}
// dS^T = P^T (dP^T - delta) into dp, P^T from its fp32 accumulators (pr)
// or, FJHB_DS_FROM_PACKED_P, from its A fragments (pa: rounded to the
// element type, as dV's product reads it), so that the fp32 P^T need not
// live until here.
__device__ __forceinline__ void fjhb_dsoft(unsigned s_delta, const float (&pr)[FJHB_S_REGS],
                                           const unsigned (&pa)[FJHB_PK][4],
                                           float (&dp)[FJHB_S_REGS]) {
  const int t4 = fj_tid() & 3;
#pragma unroll
  for (int j = 0; j < FJ_BLOCK_M / 8; ++j) {
    float dl[2], pj[4];
    fjhb_ld_shared_f2(s_delta + (8 * j + 2 * t4) * 4, dl[0], dl[1]);
    if constexpr (FJHB_DS_FROM_PACKED_P) {
      // n8 block j is registers 2 (j % 2) and 2 (j % 2) + 1 of fragment j / 2.
      fjb_unpack2(pa[j / 2][2 * (j % 2)], pj[0], pj[1]);
      fjb_unpack2(pa[j / 2][2 * (j % 2) + 1], pj[2], pj[3]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) pj[e] = pr[4 * j + e];
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[4 * j + e] = pj[e] * (dp[4 * j + e] - dl[e & 1]);
  }
}
// An additive score_mod's trainable reads: dS^T's elements to their
// gradients (fj_grad_bufs; a masked element's dS is 0), then the tile's sums
// to the slots. Called once the dK product that reads dS^T is issued, so
// that it runs beside the tensor cores. Where fj_grad_tile found every
// read's index one value over the tile (all but a band of tiles for a
// relative bias) the loop is a sum: the same loop is written under both
// branches so that the compiler, knowing every gc.u there, drops the index
// arithmetic and the atomics from the first copy and the sums from the
// second.
__device__ __forceinline__ void fjhb_grad_bufs(const fj_bwd_params &p, const fj_sizes &z, int b,
                                               int h, int q0, int wkv0,
                                               const float (&ds)[FJHB_S_REGS],
                                               fj_grad_cache &gc) {
  const int t = fj_tid() & 127;
  const int w = t >> 5, g = (t >> 2) & 7, t4 = t & 3;
  // Element (j, e) is query 8 j + 2 t4 + (e & 1), kv row 16 w + g + 8 (e >> 1).
  const auto add = [&](int j, int e) {
    fj_grad_bufs(p.user, p.grads, gc, z, b, h, q0 + 8 * j + 2 * t4 + (e & 1),
                 wkv0 + 16 * w + g + 8 * (e >> 1), ds[4 * j + e]);
  };
  const auto rows = [&] {
#pragma unroll
    for (int j = 0; j < FJ_BLOCK_M / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) add(j, e);
  };
  if (fj_grad_tile_uniform(gc)) {
    rows();
  } else if (FJ_GRAD_DIAGONAL) {
    // Elements with one q - kv in turn, (j, e) then (j + 1, e + 2), so
    // that a relative position's adds meet in the slot: about 10 atomics a
    // thread in a tile of the diagonal band of a clamped relative bias, 17
    // in row-major order (CPU count over the fragment layout).
#pragma unroll
    for (int par = 0; par < 2; ++par)
#pragma unroll
      for (int j = -1; j < FJ_BLOCK_M / 8; ++j) {
        if (j >= 0) add(j, par);
        if (j + 1 < FJ_BLOCK_M / 8) add(j + 1, par + 2);
      }
  } else {
    rows();
  }
  fj_grad_tile_end(p.grads, gc);
}

// The consumer's dS^T fragments into its 64 rows of the dS^T tile: blocks
// of 64 query columns (FJ_BLOCK_N rows apart), 128-byte swizzled (16-byte
// chunk k of row r at k ^ (r & 7)), one stmatrix a k16 step. Fragment kk
// holds columns 16 kk + 2 t4 (+1), in block kk / 4: [0] row g, chunk
// 2 (kk % 4); [1] row g + 8; [2], [3] the next chunk; lane l addresses row
// l % 8 of matrix l / 8 (rows + 8 for odd matrices, chunk + 1 for the
// upper two).
__device__ __forceinline__ void fjhb_store_ds(unsigned s_ds, int c,
                                              const unsigned (&a)[FJHB_PK][4]) {
  const int t = fj_tid() & 127;
  const int w = t >> 5, l = t & 31, r = l & 7, m = l >> 3;
  const unsigned row = s_ds + (c * FJHB_WG_KV + 16 * w + r + 8 * (m & 1)) * 128;
#pragma unroll
  for (int kk = 0; kk < FJHB_PK; ++kk) {
    const unsigned blk = row + (kk / 4) * (FJ_BLOCK_N * 128);
    const unsigned chunk = (unsigned)(2 * (kk % 4) + (m >> 1));
    fjh_stmatrix_x4(blk + ((chunk ^ (unsigned)r) << 4), a[kk][0], a[kk][1], a[kk][2], a[kk][3]);
  }
}

// An accumulator (times mul) into shared memory at buf in its register
// order, four a 16-byte store: a consumer's dQ part into a dQ buffer, as a
// tile of dq_accum's tiled form (common/fj_bwd.cuh), and a tail piece's dK
// and dV, as blocks of dkv_accum.
template <int N>
__device__ __forceinline__ void fjhb_store_acc(unsigned buf, const float (&acc)[N], float mul) {
  const unsigned t = fj_tid() & 127;
#pragma unroll
  for (int k = 0; k < N / 4; ++k)
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(buf + (128 * k + t) * 16),
                 "f"(acc[4 * k] * mul), "f"(acc[4 * k + 1] * mul), "f"(acc[4 * k + 2] * mul),
                 "f"(acc[4 * k + 3] * mul)
                 : "memory");
}

// A 64 x FJ_HEAD_DIM accumulator (times mul) in the element type into buf:
// FJHB_CHUNKS64 blocks of 64 rows x 64 elements, 128-byte swizzled as the
// dK / dV store's map reads them.
__device__ __forceinline__ void fjhb_store_rows(unsigned buf, const float (&acc)[FJHB_D_REGS],
                                                float mul) {
  const int t = fj_tid() & 127;
  const int w = t >> 5, g = (t >> 2) & 7, t4 = t & 3;
#pragma unroll
  for (int j = 0; j < FJ_HEAD_DIM / 8; ++j) {
    const unsigned blk = buf + (j / 8) * (64 * 128);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = 16 * w + g + 8 * hh;
      fjhb_st_shared_u32(blk + r * 128 + (((unsigned)(j % 8) ^ (unsigned)g) << 4) + 4 * t4,
                         fj_pack2(acc[4 * j + 2 * hh] * mul, acc[4 * j + 2 * hh + 1] * mul));
    }
  }
}

// fjhb_wait_dq_buf: consumer c's dQ buffer for item m (m % FJHB_DQ_BUFS)
// is free, the writer warp having released it (its reduce-add of item m -
// FJHB_DQ_BUFS has read it). fjhb_store_dq_buf: item m's dQ part, times
// mul, into that buffer once it is free. The writer gets it from fjhb_publish_dq, after
// a proxy fence: in the item loop the one that follows the next item's dS^T
// stores, by when these stores are done (a fence of its own here would wait
// for them beside the S^T product, with the tensor cores short of work).
__device__ __forceinline__ void fjhb_wait_dq_buf(const fjhb_smem &sm, int c, int m) {
  fjh_mbar_wait_warp(sm.dq_empty(c, m % FJHB_DQ_BUFS), ((unsigned)(m / FJHB_DQ_BUFS) & 1u) ^ 1u);
}
__device__ __forceinline__ void fjhb_store_dq_buf(const fjhb_smem &sm, int c, int m,
                                                  const float (&dq)[FJHB_DQ_REGS],
                                                  float mul) {
  fjhb_wait_dq_buf(sm, c, m);
  fjhb_store_acc(sm.dq(c, m % FJHB_DQ_BUFS), dq, mul);
}
__device__ __forceinline__ void fjhb_publish_dq(const fjhb_smem &sm, int c, int m) {
  fjh_mbar_arrive(sm.dq_full(c, m % FJHB_DQ_BUFS));
}

// dK and dV, staged as the element type (fjhb_store_rows) where
// fjhb_smem's dk_out and dv_out put them after the tile's n items, to dk
// and dv: by TMA, or by the threads where a packed sequence ends inside
// the consumer's rows.
__device__ __forceinline__ void fjhb_write_rows(const fj_bwd_params &p, const fj_bwd_maps &maps,
                                                const fjhb_smem &sm, int c, const fjb_walk &w,
                                                int hk, int n, bool leader) {
  const int b = w.b;
  const int wkv0 = w.kv0 + c * FJHB_WG_KV;
  fjh_fence_proxy_async();
  fjh_bar_sync(FJHB_BAR_WG + c, 128);
  const fjb_seq sq = w.seq(p);
  const int Lk = sq.sz.Lk;
  // A packed sequence's rows past its Lk are the next sequence's: a tile
  // that reaches past it is stored by the threads, its own rows only (a
  // TMA box would write all 64; the maps of unpacked k stop at Lk).
  const bool by_threads = FJ_VARLEN && p.cu_seqlens_k != nullptr && wkv0 + FJHB_WG_KV > Lk;
  if (leader && wkv0 < Lk && !by_threads) {
    const int kr = sq.k_row0 + wkv0, kb = FJ_VARLEN && p.cu_seqlens_k != nullptr ? 0 : b;
#pragma unroll
    for (int x = 0; x < FJHB_CHUNKS64; ++x) {
      fjh_tma_store_4d(&maps.dk, sm.dk_out(c) + x * (64 * 128), 64 * x, kr, hk, kb);
      fjh_tma_store_4d(&maps.dv, sm.dv_out(c, n) + x * (64 * 128), 64 * x, kr, hk, kb);
    }
    fjh_bulk_commit();
    fjh_bulk_wait_read();
  }
#if FJ_VARLEN
  else if (by_threads && wkv0 < Lk) {
    // 16 bytes a thread: chunk x of row r is at x ^ (r & 7) in its
    // 64-column block, as fjhb_store_rows writes it.
    constexpr int CH = FJ_HEAD_DIM / 8;  // 16-byte chunks a row
    const int rows = Lk - wkv0;
    const long long r0 = (long long)(sq.k_row0 + wkv0);
    fj_u16 *gdk = (fj_u16 *)p.dk + b * p.dk_sb + hk * p.dk_sh + r0 * p.dk_ss;
    fj_u16 *gdv = (fj_u16 *)p.dv + b * p.dv_sb + hk * p.dv_sh + r0 * p.dv_ss;
    for (int e = fj_tid() & 127; e < rows * CH; e += 128) {
      const int r = e / CH, x = e % CH;
      const unsigned off =
          (unsigned)((x / 8) * (64 * 128) + r * 128 + (((x % 8) ^ (r & 7)) << 4));
      unsigned v0, v1, v2, v3;
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(sm.dk_out(c) + off));
      fj_st_global_v4(gdk + r * p.dk_ss + x * 8, v0, v1, v2, v3);
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(sm.dv_out(c, n) + off));
      fj_st_global_v4(gdv + r * p.dv_ss + x * 8, v0, v1, v2, v3);
    }
  }
#endif
}

// A tail piece's dK (times scale) and dV, fp32, added to its tile's blocks
// of dkv_accum (common/fj_bwd.cuh): each through the consumer's dQ buffers
// (consecutive: one 64 x FJ_HEAD_DIM block of fp32 in all), in the
// register order, by one bulk reduce-add, which the leader waits to have
// read the buffers before they are written again. Rows past Lk add zeros
// (their P and dS are 0); the post kernel stores none of them.
__device__ __forceinline__ void fjhb_add_rows(const fj_bwd_params &p, const fjhb_smem &sm, int c,
                                              int piece, const float (&dk)[FJHB_D_REGS],
                                              const float (&dv)[FJHB_D_REGS], bool leader) {
  constexpr int BLOCK = 64 * FJ_HEAD_DIM;  // floats of a consumer's block
  static_assert(FJHB_DQ_BUFS * FJHB_DQ_BYTES == 4 * BLOCK,
                "sm90 backward: a consumer's dQ buffers hold its fp32 dK block");
  float *acc = p.dkv_accum + (long long)(piece / p.tail_pieces) * (4 * BLOCK) + c * BLOCK;
  fjhb_store_acc(sm.dq(c, 0), dk, p.scale);
  fjh_fence_proxy_async();
  fjh_bar_sync(FJHB_BAR_WG + c, 128);
  if (leader) {
    fjh_bulk_reduce_add_f32(acc, sm.dq(c, 0), 4 * BLOCK);
    fjh_bulk_commit();
    fjh_bulk_wait_read();
  }
  fjh_bar_sync(FJHB_BAR_WG + c, 128);
  fjhb_store_acc(sm.dq(c, 0), dv, 1.f);
  fjh_fence_proxy_async();
  fjh_bar_sync(FJHB_BAR_WG + c, 128);
  if (leader) {
    fjh_bulk_reduce_add_f32(acc + 2 * BLOCK, sm.dq(c, 0), 4 * BLOCK);
    fjh_bulk_commit();
    fjh_bulk_wait_read();
  }
}

// How consumer c computes item it on its kv rows (common/bwd_walk.cuh,
// fjb_classify: one register across the item loop). FJHB_CLASSIFY_AHEAD:
// found a whole item ahead, beside the dQ product (fjhb_consume), off the
// path from one item's last product to the next one's first. Kernels that
// ask a score_mod's terms once a tile (FJ_SCORE_TILE: relative-bias
// tables, T5's buckets) classify at the item's top instead: ahead, their
// backward was 6-8% slower (docs/backward.md).
#if FJ_SCORE_TILE
#define FJHB_CLASSIFY_AHEAD 0
#else
#define FJHB_CLASSIFY_AHEAD 1
#endif
// FJHB_ST_AHEAD: each item's S^T is issued ahead of it, beside the dQ
// product of the item before, and waited for at the item's top, so that
// no gap on the tensor cores separates an item's last product from the
// next one's first (fjhb_consume). Not in the kernels that classify at the
// item's top (their trained relative bias's backward took 3.7% more time
// with it), nor in the deterministic mode's and packed batches' (with it
// they spilled: 56 bytes at D=64, 32-92 at D=128).
#define FJHB_ST_AHEAD (FJHB_CLASSIFY_AHEAD && !FJ_DETERMINISTIC && !FJ_VARLEN)
__device__ __forceinline__ unsigned fjhb_classify(const fj_bwd_params &p, const fjb_walk &w,
                                                  const fjb_item &it, int wkv0) {
  return fjb_classify(p, w.sizes(p), w.b, it.h, it.cls, it.i * FJ_BLOCK_M, FJ_BLOCK_M, wkv0,
                      FJHB_WG_KV);
}

// Item m's S^T (the consumer's kv rows of K against its stage's Q), once
// the stage is loaded (loaded false: issued past the walk's end, on what
// the stage holds, its result unread); the caller commits it.
__device__ __forceinline__ void fjhb_issue_st(const fjhb_smem &sm, int m, unsigned k_lo,
                                              float (&sacc)[FJHB_S_REGS], bool loaded) {
  if (loaded) fjh_mbar_wait_warp(sm.q_full(m & 1), (unsigned)(m >> 1) & 1u);
  fjh_wgmma_fence();
  fjhb_issue_rows_d(sacc, k_lo, fjh_desc_lo(sm.q(m & 1), 16));
}

// The registers an item's dV and dK products use (their accumulators, and
// P^T and dS^T as A fragments), once those products are waited for.
__device__ __forceinline__ void fjhb_fence_item(float (&dk)[FJHB_D_REGS],
                                                float (&dv)[FJHB_D_REGS],
                                                unsigned (&pa)[FJHB_PK][4],
                                                unsigned (&dsa)[FJHB_PK][4]) {
  fjh_fence_regs(dk);
  fjh_fence_regs(dv);
  fjh_fence_regs(pa);
  fjh_fence_regs(dsa);
}

// An item's products from dP^T on, once its S^T is issued: dP^T = V_c dO^T;
// P^T and dS^T elementwise beside the products; dV += P^T dO and dK +=
// dS^T Q; an additive score_mod's trainable gradients. S^T (sacc) is
// waited for here where ST_PENDING (issued just before dP^T), else it was
// waited for alone before. need_mask, edge: fjb_classify's flags.
template <bool ST_PENDING>
__device__ __forceinline__ void fjhb_item_products(
    const fj_bwd_params &p, const fjhb_smem &sm, const fjb_walk &w, int b, const fjb_item &it,
    int q0, int s, unsigned ph, int wkv0, unsigned v_lo, bool need_mask, bool edge,
    float (&sacc)[FJHB_S_REGS], unsigned (&pa)[FJHB_PK][4], unsigned (&dsa)[FJHB_PK][4],
    float (&dk)[FJHB_D_REGS], float (&dv)[FJHB_D_REGS], fj_grad_cache &gc) {
  float dpacc[FJHB_S_REGS];
  fjh_wgmma_fence();
  fjhb_issue_rows_d(dpacc, v_lo, fjh_desc_lo(sm.dout(s), 16));
  fjh_wgmma_commit();
  fjh_mbar_wait_warp(sm.rows_full(s), ph);
#if FJ_HAS_SCORE_MOD && !FJ_SCORE_GRAD_ONE
  // The score_mod's derivative needs the score next to dP^T: both
  // products first, then the elementwise step in one pass.
  fjh_wgmma_wait<0>();
  if constexpr (ST_PENDING) fjh_fence_regs(sacc);
  fjh_fence_regs(dpacc);
  // One loop for every tile (a second, unchecked copy spills at D=128).
  // Trainable reads go element by element here (fj_grad_tile's sums
  // spill this step with a large score_mod).
  fjhb_elementwise<true>(p, w.sizes(p), b, it.h, q0, wkv0, need_mask, edge, sm.lse(s),
                         sm.delta(s), sm.rowv(s), sacc, dpacc, pa, dsa, gc);
  fjh_wgmma_fence();
  fjhb_issue_rows_q(dv, pa, fjh_desc_lo(sm.dout(s), FJ_BLOCK_M * 128));
  fjhb_issue_rows_q(dk, dsa, fjh_desc_lo(sm.q(s), FJ_BLOCK_M * 128));
  fjh_wgmma_commit();
#else
  if constexpr (ST_PENDING) {
    fjh_wgmma_wait<1>();  // S^T is ready; dP^T runs on
    fjh_fence_regs(sacc);
  }
  // With a score_mod (an additive one), one loop for every tile, as the
  // one-pass step: a second, unchecked copy spills with a large one;
  // but where its terms are one value over the tile (a relative bias
  // away from the diagonal, FJ_SCORE_TILE) a copy whose scores are an
  // FMA each, asked once an item (keeping the answers over the walk, as
  // the forward does, spilled the trained relative bias's kernel). Its
  // trainable reads' indices over the tile first (fj_grad_tile).
#if FJ_SCORE_TILE
  float terms;
  const bool one_terms = fj_score_tile(p.user, w.sizes(p), p.scale, b, it.h, q0,
                                       q0 + FJ_BLOCK_M - 1, wkv0, wkv0 + FJHB_WG_KV - 1,
                                       terms);
#endif
#if FJ_HAS_SCORE_MOD
  fj_grad_tile(p.user, w.sizes(p), b, it.h, q0, q0 + FJ_BLOCK_M - 1, wkv0,
               wkv0 + FJHB_WG_KV - 1, gc);
#endif
#if FJ_SCORE_TILE
  if (one_terms)
    fjhb_probs<true, true>(p, w.sizes(p), b, it.h, q0, wkv0, need_mask, edge, sm.lse(s),
                           sm.rowv(s), sacc, terms);
  else
#endif
  if (FJ_HAS_SCORE_MOD || need_mask || edge)
    fjhb_probs<true>(p, w.sizes(p), b, it.h, q0, wkv0, need_mask, edge, sm.lse(s),
                     sm.rowv(s), sacc);
  else
    fjhb_probs<false>(p, p.sz, b, it.h, q0, wkv0, need_mask, edge, sm.lse(s), sm.rowv(s),
                      sacc);
  fjhb_pack(sacc, pa);
  fjh_wgmma_fence();
  fjhb_issue_rows_q(dv, pa, fjh_desc_lo(sm.dout(s), FJ_BLOCK_M * 128));
  fjh_wgmma_commit();
  fjh_wgmma_wait<1>();  // dP^T is ready; dV += P^T dO runs on
  fjh_fence_regs(dpacc);
  // With FJHB_DS_FROM_PACKED_P this reads pa while the dV product, which
  // reads it too, is in flight: the PTX ISA leaves any access to an
  // in-flight wgmma's A registers undefined, but a read beside a read
  // is what ptxas allows here (no wait inserted, no C751x) and what the
  // GPU tests check (D=64, tests/gpu/test_backward.c).
  fjhb_dsoft(sm.delta(s), sacc, pa, dpacc);
  fjhb_pack(dpacc, dsa);
  fjh_wgmma_fence();
  fjhb_issue_rows_q(dk, dsa, fjh_desc_lo(sm.q(s), FJ_BLOCK_M * 128));
  fjh_wgmma_commit();
#if FJ_HAS_SCORE_MOD
  fjhb_grad_bufs(p, w.sizes(p), b, it.h, q0, wkv0, dpacc, gc);
#endif
#endif
}

// Consumer c's part of a kv tile (the walk w, kv head hk): its items, then
// dK and dV; k and n as bwd.cuh's roles take them. Its dQ goes to dq_accum
// through the writer warp (bwd.cuh, fjhb_write_dq). The sequence's sizes
// are read from the walk's record where they are used (held across the
// loop they cost the masked D=128 kernel a spill).
//
// Latencies hidden behind the tensor cores: item n + 1 is read from stage
// n's record (producer warp 1 walked to it: fjhb_get_item) and, with
// FJHB_CLASSIFY_AHEAD, classified (fjhb_classify) while item n's dQ product
// runs; with FJHB_ST_AHEAD item n + 1's S^T is issued there too, in flight
// across the loop's back edge, and item n's dQ is stored in its buffer
// while that S^T runs; otherwise S^T is issued at the item's top and item
// n's dQ stored beside item n + 1's S^T. Either way the buffer goes to the
// writer after item n + 1's dS^T stores, under the proxy fence that covers
// both. A product in flight across the back edge is waited for alone
// (waited for beside a later one, ptxas serialized every wgmma: C7514,
// C7518), and no product is issued under a branch in the loop (C7515).
__device__ __forceinline__ void fjhb_consume(const fj_bwd_params &p, const fj_bwd_maps &maps,
                                             const fjhb_smem &sm, int c, const fjb_walk &w,
                                             int hk, int k, int &n) {
  const int b = w.b;
  const int wkv0 = w.kv0 + c * FJHB_WG_KV;
  const bool leader = (fj_tid() & 127) == 0;  // issues the dK, dV stores

  float dk[FJHB_D_REGS], dv[FJHB_D_REGS];
#pragma unroll
  for (int i = 0; i < FJHB_D_REGS; ++i) dk[i] = dv[i] = 0.f;

  // Descriptor low words: the consumer's rows of K and V (K-major); for
  // its part of dQ, dS^T's block of the part's query rows and K's block of
  // its first column (MN-major).
  const unsigned k_lo = fjh_desc_lo(sm.k() + c * FJHB_WG_KV * 128, 16);
  const unsigned v_lo = fjh_desc_lo(sm.v() + c * FJHB_WG_KV * 128, 16);
  const unsigned ds_lo =
      fjh_desc_lo(sm.ds(0) + (fjhb_dq_row0(c) / 64) * (FJ_BLOCK_N * 128), FJ_BLOCK_N * 128);
  const unsigned kq_lo = fjh_desc_lo(sm.k() + (fjhb_dq_col0(c) / 64) * (FJ_BLOCK_N * 128) +
                                         (fjhb_dq_col0(c) % 64) * 2,
                                     FJ_BLOCK_N * 128);

  fj_grad_cache gc;  // trainable buffers' gradients, flushed at the end
  fjb_item it = w.first(p);
#if FJHB_CLASSIFY_AHEAD
  // The item's classification; the next one's is found while the item's
  // dQ product runs.
  unsigned how = fjhb_classify(p, w, it, wkv0);
#endif
  fjh_mbar_wait_warp(sm.kv_full(), (unsigned)k & 1u);
  // FJHB_ST_AHEAD: the item's dQ, stored (times scale) once its product is
  // done; else the item before's (times scale) until stored.
  float dq[FJHB_DQ_REGS];
  bool put = false;  // the item before's dQ is not yet handed to the writer
#if FJHB_ST_AHEAD
  float sacc[FJHB_S_REGS];  // the item's S^T, issued ahead of it
  if (!w.done(it)) {
    // dK and dV's zeros are set before a product is in flight.
    fjh_fence_regs(dk);
    fjh_fence_regs(dv);
    fjhb_issue_st(sm, n, k_lo, sacc, true);
    fjh_wgmma_commit();
  }
#endif
  while (!w.done(it)) {
    const int s = n & 1;
    const unsigned ph = (unsigned)(n >> 1) & 1u;
    const int q0 = it.i * FJ_BLOCK_M;
#if FJHB_ST_AHEAD
    // Every item issues the same products: where the consumer's rows hold
    // none of the item (!run) its elements are all masked (past Lk, edge
    // masks them), P^T = dS^T = 0. With the products or the elementwise
    // steps under a branch ptxas serialized every wgmma (C7512, C7515).
    const bool need_mask = how & FJB_NEED_MASK || !(how & FJB_RUN), edge = how & FJB_EDGE;
#elif FJHB_CLASSIFY_AHEAD
    const bool run = how & FJB_RUN, need_mask = how & FJB_NEED_MASK, edge = how & FJB_EDGE;
#else
    // fjb_classify's decision as three flags: the form whose code was
    // timed (through fjb_classify's bits these kernels compile differently).
    bool run = wkv0 < w.sizes(p).Lk;
    bool need_mask = false;
    bool edge;
    {
      const fj_sizes z = w.sizes(p);
#if FJ_HAS_MASK
      if (run && it.cls == FJ_TILE_PARTIAL) {
        const int wc = fj_tile_class(p.user, z, b, it.h, q0, min(q0 + FJ_BLOCK_M, z.Lq) - 1,
                                     wkv0, min(wkv0 + FJHB_WG_KV, z.Lk) - 1);
        run = wc != FJ_TILE_EMPTY;
        need_mask = wc == FJ_TILE_PARTIAL;
      }
#endif
      edge = fjb_edge(z, q0, FJ_BLOCK_M, wkv0, FJHB_WG_KV);
    }
#endif
    // P^T and dS^T as A fragments: read by the in-flight dV and dK products
    // until the wait below, so they live across it.
    unsigned pa[FJHB_PK][4], dsa[FJHB_PK][4];
#if FJHB_ST_AHEAD
    // S^T is waited for alone: waited for beside dP^T, ptxas serialized
    // every wgmma (C7514).
    fjh_wgmma_wait<0>();
    fjh_fence_regs(sacc);
    fjhb_item_products<false>(p, sm, w, b, it, q0, s, ph, wkv0, v_lo, need_mask, edge, sacc,
                              pa, dsa, dk, dv, gc);
#else
    fjh_mbar_wait_warp(sm.q_full(s), ph);
    if (run) {
      float sacc[FJHB_S_REGS];
      fjh_wgmma_fence();
      fjhb_issue_rows_d(sacc, k_lo, fjh_desc_lo(sm.q(s), 16));
      fjh_wgmma_commit();
      if (put) fjhb_store_dq_buf(sm, c, n - 1, dq, 1.f);
      fjhb_item_products<true>(p, sm, w, b, it, q0, s, ph, wkv0, v_lo, need_mask, edge, sacc,
                               pa, dsa, dk, dv, gc);
    } else {
      if (put) fjhb_store_dq_buf(sm, c, n - 1, dq, 1.f);
      fjh_mbar_wait_warp(sm.rows_full(s), ph);  // the next item
#pragma unroll
      for (int kk = 0; kk < FJHB_PK; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) pa[kk][e] = dsa[kk][e] = 0u;
    }
#endif
    // The tile's last dP^T product is done: the producer may load the next
    // tile's V while the last item's other products run.
    if (FJ_PERSISTENT && w.done(fjhb_get_item(sm.next_item(s)))) fjh_mbar_arrive(sm.v_empty());
    // dS^T into buffer n & 1: the other consumer finished reading it (two
    // items ago) before it arrived at the previous item's barrier below.
    const int bi = n & 1;
    fjhb_store_ds(sm.ds(bi), c, dsa);
    fjh_fence_proxy_async();  // dS^T for the dQ product, item n - 1's dQ for the writer
    if (put) fjhb_publish_dq(sm, c, n - 1);
    fjh_bar_sync(FJHB_BAR_DS_FULL, 256);
    fjh_wgmma_fence();
    fjhb_issue_dq(dq, ds_lo + bi * (FJHB_DS_BYTES >> 4), kq_lo);
    fjh_wgmma_commit();
    // Beside the dQ product: the next item and (FJHB_CLASSIFY_AHEAD) its
    // classification, once dV and dK are done (their A fragments free);
    // with FJHB_ST_AHEAD its S^T.
    const fjb_item nxt = fjhb_get_item(sm.next_item(s));
#if FJHB_CLASSIFY_AHEAD
    fjh_wgmma_wait<1>();
    fjhb_fence_item(dk, dv, pa, dsa);
    if (!w.done(nxt)) how = fjhb_classify(p, w, nxt, wkv0);
#endif
#if FJHB_ST_AHEAD
    // Q, dO, LSE and delta of stage s are read.
    fjh_mbar_arrive(sm.empty(s));
    it = nxt;
    ++n;
    // Past the walk's end too: with the issue under a branch ptxas
    // serialized every wgmma (C7515).
    fjhb_issue_st(sm, n, k_lo, sacc, !w.done(it));
    fjh_wgmma_commit();
    fjh_wgmma_wait<1>();  // dQ is done; S^T runs on
    fjh_fence_regs(dq);
    fjhb_store_dq_buf(sm, c, n - 1, dq, p.scale);
#else
    fjh_wgmma_wait<0>();
    fjh_fence_regs(dq);
    // Scaled here, with no product in flight: registers a wgmma wrote and
    // that are read while a later one runs (fjhb_store_dq_buf, beside the next
    // S^T) make ptxas wait for that one first (C7517).
#pragma unroll
    for (int i = 0; i < FJHB_DQ_REGS; ++i) dq[i] *= p.scale;
#if !FJHB_CLASSIFY_AHEAD
    fjhb_fence_item(dk, dv, pa, dsa);
#endif
    // Q, dO, LSE and delta of stage s are read.
    fjh_mbar_arrive(sm.empty(s));
    it = nxt;
    ++n;
#endif
    put = true;
  }
#if FJHB_ST_AHEAD
  // The last S^T, unread, is done before K goes back to the producer.
  fjh_wgmma_wait<0>();
  fjh_fence_regs(sacc);
#endif
  // K is read (the last dQ product was waited for): the producer may load
  // the next tile's while dK and dV go out; and V, where the tile had no item.
  if (FJ_PERSISTENT) {
    if (!put) fjh_mbar_arrive(sm.v_empty());
    fjh_mbar_arrive(sm.k_empty());
  }
  if (put) {
    if (!FJHB_ST_AHEAD) fjhb_store_dq_buf(sm, c, n - 1, dq, 1.f);
    fjh_fence_proxy_async();
    fjhb_publish_dq(sm, c, n - 1);
  }

  fj_grad_flush(p.grads, gc);

  // The tile's piece (bwd.cuh, fjhb_take), from its ring slot, which the
  // warp has held since it read the tile there, and now releases.
  int piece = -1;
  if (FJ_PERSISTENT && FJB_PIECES) {
    asm volatile("ld.volatile.shared.b32 %0, [%1];\n" : "=r"(piece) : "r"(sm.ring_piece(k & 1))
                 : "memory");
    __syncwarp();
    if ((fj_tid() & 31) == 0) fjh_mbar_arrive(sm.ring_empty(k & 1));
  }
  // The consumer's dQ buffers are free as items n, n + 1, ... would take
  // them (fjhb_wait_dq_buf).
  if (piece >= 0) {
    // A piece's dK and dV are added through all of them (fjhb_add_rows).
#pragma unroll
    for (int i = 0; i < FJHB_DQ_BUFS; ++i) fjhb_wait_dq_buf(sm, c, n + i);
    if (put) fjhb_add_rows(p, sm, c, piece, dk, dv, leader);
  } else {
    // dK (times scale) and dV where dk_out and dv_out put them: in the
    // consumer's dS^T buffer once both consumers' last dQ products, which
    // read both buffers, are done (the barrier), and in the dQ buffer the
    // last item did not use where dV does not fit beside dK. So the tile's
    // end waits for none of its last item's reduce-adds.
    if (!FJHB_ROWS_IN_DS) fjhb_wait_dq_buf(sm, c, n);
    fjh_bar_sync(FJHB_BAR_DS_FULL, 256);
    fjhb_store_rows(sm.dk_out(c), dk, p.scale);
    fjhb_store_rows(sm.dv_out(c, n), dv, 1.f);
    fjhb_write_rows(p, maps, sm, c, w, hk, n, leader);
  }
  // The next tile's dS^T and dQ go to the buffers once both consumers'
  // stores have read them (each consumer's dS^T goes to both dS^T buffers).
  if (FJ_PERSISTENT) fjh_bar_sync(FJHB_BAR_DS_FULL, 256);
}
