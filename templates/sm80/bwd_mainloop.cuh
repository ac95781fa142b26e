// templates/sm80/bwd_mainloop.cuh: a work item's loads and a warp's share
// of its computation (the scheme: sm80/bwd_config.cuh): S^T and dP^T, the
// elementwise P^T and dS^T, dV += P^T dO, dK += dS^T Q, dS^T to shared
// memory; then dQ = dS K into dq_accum.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16 / .f16, 32 lanes, g =
// lane / 4, t4 = lane % 4):
//   A (16 x 16, row-major): a0 = A[g][2t4, 2t4+1], a1 = A[g+8][2t4, 2t4+1],
//                           a2 = A[g][2t4+8, +9], a3 = A[g+8][2t4+8, +9]
//   B (16 x 8, k x n):      b0 = B[2t4, 2t4+1][g], b1 = B[2t4+8, +9][g]
//   C (16 x 8, fp32):       c0, c1 = C[g][2t4, 2t4+1], c2, c3 = C[g+8][2t4, 2t4+1]
// ldmatrix.x4: lanes 8m .. 8m+7 give the row addresses of 8 x 8 matrix m
// (16 bytes a row) and lane T receives element pair (T / 4, 2 (T % 4)) of
// each matrix; with .trans, of its transpose. In a swizzled tile every
// ldmatrix group starts at a multiple of 8 rows, so lane l's rows have
// (row & 7) == (l & 7), and its physical chunk is its logical chunk ^ (l & 7).
#pragma once

// One work item into stage buffers s_q, s_do, s_lse, s_delta: Q and dO rows
// [q0, q0 + FJ_BLOCK_M) of query head h of sequence sq (zero-filled past
// its Lq), LSE and delta of those rows (zero past Lq; such rows are masked).
__device__ __forceinline__ void fjb_load_item(const fj_bwd_params &p, const fjb_seq &sq, int b,
                                              const fjb_item &it, unsigned s_q,
                                              unsigned s_do, unsigned s_lse,
                                              unsigned s_delta) {
  const int Lq = sq.sz.Lq;
  const int q0 = it.i * FJ_BLOCK_M;
  const int qr0 = sq.q_row0 + q0;  // the tile's first row in q and dout
  const fj_u16 *gq = (const fj_u16 *)p.q + b * p.q_sb + it.h * p.q_sh + qr0 * p.q_ss;
  const fj_u16 *gd = (const fj_u16 *)p.dout + b * p.do_sb + it.h * p.do_sh + qr0 * p.do_ss;
  fjk_load_tile<FJ_BLOCK_M>(s_q, gq, p.q_ss, Lq - q0);
  fjk_load_tile<FJ_BLOCK_M>(s_do, gd, p.do_ss, Lq - q0);
  const float *gl = p.lse + b * p.lse_sb + it.h * p.lse_sh + sq.q_row0;
  const float *gdl = p.delta + fjb_acc_row(p, sq, it.h);
  for (int k = fj_tid(); k < 2 * FJ_BLOCK_M; k += FJK_THREADS) {
    const bool is_lse = k < FJ_BLOCK_M;
    const int r = is_lse ? k : k - FJ_BLOCK_M;
    const int q = min(q0 + r, Lq - 1);
    fjk_cp_async4((is_lse ? s_lse : s_delta) + 4 * r, (is_lse ? gl : gdl) + q,
                  q0 + r < Lq ? 4 : 0);
  }
}

__device__ __forceinline__ void fjb_ld_shared_f2(unsigned addr, float &x, float &y) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(x), "=f"(y) : "r"(addr));
}
__device__ __forceinline__ void fjb_st_shared_u32(unsigned addr, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(addr), "r"(v) : "memory");
}

// The accumulators of two n8 tiles (2 kt and 2 kt + 1) of a 16-row product
// as the A fragment of k16 step kt, rounded to the element type: c0, c1 of
// tile 2 kt are A[g][2t4, +1] (a0), its c2, c3 A[g+8][2t4, +1] (a1), and
// those of tile 2 kt + 1 the columns 8 further (a2, a3).
template <int NT>
__device__ __forceinline__ void fjb_pack_a(unsigned (&a)[NT / 2][4],
                                           const float (&c)[NT][4]) {
#pragma unroll
  for (int kt = 0; kt < NT / 2; ++kt) {
    a[kt][0] = fj_pack2(c[2 * kt][0], c[2 * kt][1]);
    a[kt][1] = fj_pack2(c[2 * kt][2], c[2 * kt][3]);
    a[kt][2] = fj_pack2(c[2 * kt + 1][0], c[2 * kt + 1][1]);
    a[kt][3] = fj_pack2(c[2 * kt + 1][2], c[2 * kt + 1][3]);
  }
}

// acc (16 x FJB_SUB_M) = A B^T over the head dim: A the warp's 16 rows of
// a kv tile (K or V) at s_a, B FJB_SUB_M rows of a query tile (Q or dO) at
// s_b, both [row][d] swizzled (s_a and s_b at multiples of 16 rows).
//   A, ldmatrix.x4: matrices (rows 0-7, k lo), (rows 8-15, k lo),
//     (rows 0-7, k hi), (rows 8-15, k hi): lane l addresses row l & 15,
//     chunk 2 kk + (l >> 4).
//   B = the query tile read as [n = query][k = d], ldmatrix.x4: matrices
//     (n 0-7, k lo), (n 0-7, k hi), (n 8-15, k lo), (n 8-15, k hi), i.e. b0,
//     b1 of n8 tile 2 np, then b0, b1 of 2 np + 1: lane l addresses row
//     16 np + (l >> 4) * 8 + (l & 7), chunk 2 kk + ((l >> 3) & 1).
__device__ __forceinline__ void fjb_gemm_rows_d(float (&acc)[FJB_QT][4], unsigned s_a,
                                                unsigned s_b, int lane) {
  const int x_a = (lane >> 4) ^ (lane & 7);
  const int x_b = ((lane >> 3) & 1) ^ (lane & 7);
  const unsigned a_row = s_a + (lane & 15) * FJK_ROW_BYTES;
  const unsigned b_row = s_b + ((lane >> 4) * 8 + (lane & 7)) * FJK_ROW_BYTES;
#pragma unroll
  for (int nt = 0; nt < FJB_QT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < FJB_DK; ++kk) {
    unsigned a[4];
    fjk_ldsm_x4(a, a_row + (((2 * kk) ^ x_a) << 4));
#pragma unroll
    for (int np = 0; np < FJB_QT / 2; ++np) {
      unsigned bb[4];
      fjk_ldsm_x4(bb, b_row + np * 16 * FJK_ROW_BYTES + (((2 * kk) ^ x_b) << 4));
      fjk_mma(acc[2 * np], a, bb[0], bb[1]);
      fjk_mma(acc[2 * np + 1], a, bb[2], bb[3]);
    }
  }
}

// acc (16 x FJ_HEAD_DIM) += A B over FJB_SUB_M queries: A (16 x FJB_SUB_M)
// in registers (fjb_pack_a), B those rows of the query tile at s_b read as
// [k = query][n = d], transposed by ldmatrix.x4.trans: matrices (k 0-7, n lo), (k 8-15, n
// lo), (k 0-7, n hi), (k 8-15, n hi), i.e. b0, b1 of n8 tile 2 dp, then of
// 2 dp + 1: lane l addresses row 16 kt + ((l >> 3) & 1) * 8 + (l & 7),
// chunk 2 dp + (l >> 4).
__device__ __forceinline__ void fjb_gemm_rows_q(float (&acc)[FJB_DT][4],
                                                const unsigned (&a)[FJB_QK][4],
                                                unsigned s_b, int lane) {
  const int x_b = (lane >> 4) ^ (lane & 7);
  const unsigned b_row = s_b + (((lane >> 3) & 1) * 8 + (lane & 7)) * FJK_ROW_BYTES;
#pragma unroll
  for (int dp = 0; dp < FJB_DT / 2; ++dp)
#pragma unroll
    for (int kt = 0; kt < FJB_QK; ++kt) {
      unsigned bb[4];
      fjk_ldsm_x4_trans(bb, b_row + kt * 16 * FJK_ROW_BYTES + (((2 * dp) ^ x_b) << 4));
      fjk_mma(acc[2 * dp], a[kt], bb[0], bb[1]);
      fjk_mma(acc[2 * dp + 1], a[kt], bb[2], bb[3]);
    }
}

// A warp's pass over FJB_SUB_M queries of a work item: query rows [q0, q0 +
// FJB_SUB_M) of head h of a sequence of sizes z (fjb_seq_of) (Q, dO, LSE and delta from s_q, s_do, s_lse and
// s_delta, their first row) against its kv rows [wkv0, wkv0 + 16); dS^T goes
// to the columns of s_ds (its column q0). run: the pair of tiles is not
// EMPTY (else dS^T is 0 and only that is stored); need_mask: evaluate
// fj_mask per element; edge: the tiles reach past Lq or Lk, whose rows and
// columns are masked. Element e of n8 tile nt of S^T (C layout) is kv row
// wkv0 + g + 8 (e >> 1), query q0 + 8 nt + 2 t4 + (e & 1).
__device__ __forceinline__ void fjb_step(const fj_bwd_params &p, const fj_sizes &z, int b,
                                         int h, int q0,
                                         int wkv0, bool run, bool need_mask, bool edge,
                                         unsigned s_k, unsigned s_v, unsigned s_q,
                                         unsigned s_do, unsigned s_lse, unsigned s_delta,
                                         unsigned s_ds, float (&dk)[FJB_DT][4],
                                         float (&dv)[FJB_DT][4], fj_grad_cache &gc) {
  const int lt = fj_tid();
  const int warp = lt >> 5, lane = lt & 31;
  const int g = lane >> 2, t4 = lane & 3;
  unsigned dsa[FJB_QK][4];  // dS^T as A fragments (of dK += dS^T Q)
  if (run) {
    float s[FJB_QT][4], dp[FJB_QT][4];
    fjb_gemm_rows_d(s, s_k + warp * 16 * FJK_ROW_BYTES, s_q, lane);
    fjb_gemm_rows_d(dp, s_v + warp * 16 * FJK_ROW_BYTES, s_do, lane);
    // ---- P^T into s, dS^T into dp ----
#pragma unroll
    for (int nt = 0; nt < FJB_QT; ++nt) {
      // LSE and delta of this lane's two query columns 8 nt + 2 t4 + {0, 1}.
      float lse2[2], dlt[2];
      fjb_ld_shared_f2(s_lse + (nt * 8 + 2 * t4) * 4, lse2[0], lse2[1]);
      fjb_ld_shared_f2(s_delta + (nt * 8 + 2 * t4) * 4, dlt[0], dlt[1]);
      // To log2 units; a fully masked row's -inf becomes +inf, so that
      // every P of it is 2^-inf = 0 (and its dS, delta being 0, too).
#pragma unroll
      for (int c = 0; c < 2; ++c)
        lse2[c] = lse2[c] == fj_neg_inf() ? -fj_neg_inf() : lse2[c] * FJB_LOG2E;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = q0 + nt * 8 + 2 * t4 + (e & 1);
        const int ki = wkv0 + g + (e >> 1) * 8;
#if FJ_HAS_SCORE_MOD
        const float score = s[nt][e] * p.scale;
        const float x = fj_score_log2(p.user, z, s[nt][e], p.scale, b, h, q0 + 2 * t4,
                                      nt * 8 + (e & 1), wkv0 + g, (e >> 1) * 8);
#else
        const float x = s[nt][e] * p.scale_log2;
#endif
        // The mask on every element without a branch (fj_mask is total), as
        // the forward evaluates it.
        bool keep = true;
#if FJ_HAS_MASK
        if (need_mask) keep = fj_mask(p.user, z, b, h, qi, ki);
#endif
        if (edge) keep = keep & (qi < z.Lq) & (ki < z.Lk);
        const float pr = keep ? fj_exp2(x - lse2[e & 1]) : 0.f;
        float ds = pr * (dp[nt][e] - dlt[e & 1]);
#if FJ_HAS_SCORE_MOD
        // d score_mod / d score, and the trainable buffers' gradients, only
        // where the pair is allowed: a masked pair has no gradient. (A call
        // for every element, not a branch, as the sm90 kernel makes it,
        // spills here.)
        if (keep) ds = fj_score_grad(p.user, p.grads, gc, z, score, b, h, qi, ki, ds);
#endif
        s[nt][e] = pr;
        dp[nt][e] = ds;
      }
    }
    (void)need_mask;
    // ---- dV += P^T dO, dK += dS^T Q ----
    {
      unsigned pa[FJB_QK][4];
      fjb_pack_a<FJB_QT>(pa, s);
      fjb_gemm_rows_q(dv, pa, s_do, lane);
    }
    fjb_pack_a<FJB_QT>(dsa, dp);
    fjb_gemm_rows_q(dk, dsa, s_q, lane);
  } else {
    (void)gc;
#pragma unroll
    for (int kt = 0; kt < FJB_QK; ++kt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dsa[kt][e] = 0u;
  }
  // ---- dS^T to shared memory: row = kv row in the CTA, column = query ----
  // dsa[kt][0] is (row g, columns 16 kt + 2 t4, +1), [1] row g + 8, [2] and
  // [3] the same 8 columns further.
  const unsigned row_lo = s_ds + (warp * 16 + g) * FJB_DS_STRIDE + t4 * 4;
#pragma unroll
  for (int kt = 0; kt < FJB_QK; ++kt) {
    fjb_st_shared_u32(row_lo + kt * 32, dsa[kt][0]);
    fjb_st_shared_u32(row_lo + 8 * FJB_DS_STRIDE + kt * 32, dsa[kt][1]);
    fjb_st_shared_u32(row_lo + kt * 32 + 16, dsa[kt][2]);
    fjb_st_shared_u32(row_lo + 8 * FJB_DS_STRIDE + kt * 32 + 16, dsa[kt][3]);
  }
}

// p[0] += x and p[1] += y in global memory (p 8-byte aligned): one vector
// reduction from sm_90 on (half the instructions of two scalar ones).
__device__ __forceinline__ void fjb_red_add2(float *p, float x, float y) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %0;\n"
      " red.global.add.v2.f32 [g], {%1, %2};\n}\n"
      :: "l"(p), "f"(x), "f"(y) : "memory");
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

// p[0] = x and p[1] = y (store), or += (fjb_red_add2).
__device__ __forceinline__ void fjb_put2(float *p, float x, float y, bool store) {
  if (store)
    *(float2 *)p = make_float2(x, y);
  else
    fjb_red_add2(p, x, y);
}

// dQ of query rows [q0, q0 + FJ_BLOCK_M) of head h of sequence sq, this
// warp's part (rows
// 16 wm .., head-dim columns FJB_DQ_COLS wd ..): dS K over the CTA's
// FJ_BLOCK_N kv rows, times scale, added to dq_accum (each element by one
// thread of the CTA). After a barrier that follows every warp's fjb_step.
//   A = dS (16 queries x 16 kv rows of step kk) from dS^T [kv][query],
//     ldmatrix.x4.trans: matrix (m 0-7, k 0-7) is the transpose of the
//     stored 8 x 8 block at kv rows 16 kk + 0-7, query columns 16 wm + 0-7;
//     (m 8-15, k 0-7) the block 8 columns right; (m 0-7, k 8-15) 8 rows
//     down; (m 8-15, k 8-15) both: lane l addresses kv row 16 kk +
//     (l >> 4) * 8 + (l & 7), query column 16 wm + ((l >> 3) & 1) * 8.
//   B = K read as [k = kv][n = d], as fjb_gemm_rows_q reads a query tile,
//     at head-dim chunk FJB_DQ_COLS / 8 * wd + 2 dp (even, so the swizzle
//     xor applies as there).
// FJ_DETERMINISTIC: the CTA waits for its turn on query tile (h, q0)'s
// semaphore `sem` (its rank: common/bwd_order.cuh) between the product and
// the additions, which at rank 0 are stores; every thread calls it (the
// wait ends in a barrier).
__device__ __forceinline__ void fjb_dq_step(const fj_bwd_params &p, const fjb_seq &sq, int h,
                                            int q0, unsigned s_k, unsigned s_ds,
                                            const int *sem = nullptr, int rank = 0) {
  const int lt = fj_tid();
  const int warp = lt >> 5, lane = lt & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int wm = warp % FJB_DQ_WM, wd = warp / FJB_DQ_WM;
  float acc[FJB_DQ_NT][4];
#pragma unroll
  for (int nt = 0; nt < FJB_DQ_NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
  const unsigned a_row = s_ds + ((lane >> 4) * 8 + (lane & 7)) * FJB_DS_STRIDE +
                         (wm * 16 + ((lane >> 3) & 1) * 8) * 2;
  const int x_b = (lane >> 4) ^ (lane & 7);
  const unsigned b_row = s_k + (((lane >> 3) & 1) * 8 + (lane & 7)) * FJK_ROW_BYTES;
  const int c0 = wd * (FJB_DQ_COLS / 8);
#pragma unroll
  for (int kk = 0; kk < FJB_NK; ++kk) {
    unsigned a[4];
    fjk_ldsm_x4_trans(a, a_row + kk * 16 * FJB_DS_STRIDE);
#pragma unroll
    for (int dp = 0; dp < FJB_DQ_NT / 2; ++dp) {
      unsigned bb[4];
      fjk_ldsm_x4_trans(bb, b_row + kk * 16 * FJK_ROW_BYTES + (((c0 + 2 * dp) ^ x_b) << 4));
      fjk_mma(acc[2 * dp], a, bb[0], bb[1]);
      fjk_mma(acc[2 * dp + 1], a, bb[2], bb[3]);
    }
  }
#if FJ_DETERMINISTIC
  fjb_order_wait(sem, rank);
#else
  (void)sem;
#endif
  // The first in the order stores: dq_accum is not zeroed (common/bwd_rows.cuh).
  const bool first = FJ_DETERMINISTIC && rank == 0;
  const int Lq = sq.sz.Lq;
  float *gq = p.dq_accum + (fjb_acc_row(p, sq, h) + q0) * FJ_HEAD_DIM + wd * FJB_DQ_COLS +
              2 * t4;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = wm * 16 + g + hh * 8;
    if (q0 + r < Lq) {
#pragma unroll
      for (int nt = 0; nt < FJB_DQ_NT; ++nt)
        fjb_put2(gq + r * FJ_HEAD_DIM + nt * 8, acc[nt][2 * hh] * p.scale,
                 acc[nt][2 * hh + 1] * p.scale, first);
    }
  }
}
