// templates/sm80/fwd.cuh: the forward kernel (contract: config.cuh): the
// CTA's query block, its kv tiles walked from the last down through a
// cp.async pipeline of FJ_NUM_STAGES stages, each tile in sub-tiles of
// FJK_SUB_N columns (fjk_tile_step), then the epilogue. (The epilogue stays
// in the kernel: as a function of its own, the compiler placed its
// thread-index arithmetic otherwise, which changed ptxas's schedule.)
#pragma once

extern "C" __global__ void __launch_bounds__(FJK_THREADS, 1)
fj_attention_fwd(const __grid_constant__ fj_fwd_params p) {
  extern __shared__ __align__(128) unsigned char fjk_smem[];

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;  // mma fragment row group, column pair
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  // The sequence's sizes and first rows (fj_seq_of: p.sz unless serving
  // layouts are in use); a query block past a shorter sequence's end has
  // nothing to do.
  const fj_seq sq = fj_seq_of(p, b);
  const int Lq = sq.sz.Lq, Lk = sq.sz.Lk;
  const int q0 = m_block * FJ_BLOCK_M;
  if (q0 >= Lq) return;
  const int q1 = min(q0 + FJ_BLOCK_M, Lq) - 1;
  const int wq0 = q0 + warp * FJK_WARP_ROWS;  // this warp's first query row
  const int wq1 = min(wq0 + FJK_WARP_ROWS, Lq) - 1;
  const bool warp_active = wq0 < Lq;

  // Range [lo, hi] of kv blocks that are not EMPTY; the loop walks it from
  // hi down, so a causal diagonal is the first tile and nothing above it is
  // ever touched.
  // With a block mask the tiles come from its lists instead (lo stays 0 and
  // -1 ends the walk); ti and tc are the list positions of the next tile to
  // issue and to compute.
  const int bm_row = p.bm_kv_num != nullptr ? fjk_bm_row(p, b, h, m_block) : -1;
  int ti = 0;
  int lo = 0, hi = (Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N - 1;
  int hi_cls = FJ_TILE_FULL;
  if (bm_row >= 0) {
    hi = fjk_bm_tile(p, bm_row, &ti, &hi_cls);
  } else {
#if FJ_HAS_MASK
    fj_tile_range(p, sq.sz, b, h, q0, q1, &lo, &hi, &hi_cls);
#endif
  }
  int tc = ti;

  const unsigned s_q = fj_smem_u32(fjk_smem);
  const unsigned s_k = s_q + FJ_BLOCK_M * FJK_ROW_BYTES;
  const unsigned s_v = s_k + FJ_NUM_STAGES * FJK_TILE_BYTES;

  float acc[FJK_MT][FJK_DT][4];
  float row_m[FJK_MT][2], row_l[FJK_MT][2];  // running max (log2 units), sum
#pragma unroll
  for (int mt = 0; mt < FJK_MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < FJK_DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][dt][e] = 0.f;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      row_m[mt][hh] = fj_neg_inf();
      row_l[mt][hh] = 0.f;
    }
  }

  // Without a score_mod the exponent is fma(qk, scale_log2, -m): one FFMA per
  // element, the max taken on unscaled q.k. With one, scores are already in
  // log2 units when the max is taken.
#if FJ_HAS_SCORE_MOD
  const float exp_scale = 1.0f;
#else
  const float exp_scale = p.scale_log2;
#endif

  if (lo <= hi) {
    const fj_u16 *gq =
        (const fj_u16 *)p.q + b * p.q_sb + h * p.q_sh + (sq.q_row0 + q0) * p.q_ss;
    const int hk = h / p.kv_group;
    // Paged KV: the head's rows of the pool, each tile row's page from the
    // sequence's row of the block table (fjk_load_kv).
    const int *bt = fj_block_table(p) != nullptr ? p.block_table + b * p.bt_stride : nullptr;
    const long long kb = bt != nullptr ? 0 : b * p.k_sb + sq.k_row0 * p.k_ss;
    const long long vb = bt != nullptr ? 0 : b * p.v_sb + sq.k_row0 * p.v_ss;
    const fj_u16 *gk = (const fj_u16 *)p.k + kb + hk * p.k_sh;
    const fj_u16 *gv = (const fj_u16 *)p.v + vb + hk * p.v_sh;

    // cp.async groups, in commit order: Q, then one group per kv tile (K and V
    // together). Empty groups keep the count uniform so that wait_group can
    // take a constant.
    fjk_load_tile<FJ_BLOCK_M>(s_q, gq, p.q_ss, Lq - q0);
    fjk_cp_async_commit();

    int ji = hi, ji_cls = hi_cls;  // next tile to issue
#pragma unroll
    for (int st = 0; st < FJ_NUM_STAGES - 1; ++st) {
      if (ji >= lo) {
        fjk_load_kv(p, s_k, s_v, st, gk, gv, bt, ji, Lk);
        ji = fjk_advance(p, sq.sz, bm_row, b, h, q0, q1, ji, lo, &ti, &ji_cls);
      }
      fjk_cp_async_commit();
    }

#if FJK_Q_IN_REGISTERS
    unsigned qf[FJK_MT][FJK_KT][4];
    fjk_cp_async_wait<FJ_NUM_STAGES - 1>();  // the Q group
    __syncthreads();
    {
    FJK_LANE_ADDRESSING(lane)
#pragma unroll
    for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < FJK_KT; ++kk)
        fjk_ldsm_x4(qf[mt][kk], s_q + q_row + mt * 16 * FJK_ROW_BYTES +
                                    (((2 * kk) ^ x_q) << 4));
    }
#endif

    int jc = hi, jc_cls = hi_cls;  // tile being computed
    int stage = 0;
    while (jc >= lo) {
      // The prefetch goes to the stage computed last iteration.
      const int stage_i = stage == 0 ? FJ_NUM_STAGES - 1 : stage - 1;
      // Tile jc has landed (only the FJ_NUM_STAGES - 2 younger tile groups
      // may still be in flight), and after the barrier every warp is done
      // with the stage that the next prefetch overwrites.
      fjk_cp_async_wait<FJ_NUM_STAGES - 2>();
      __syncthreads();
#if FJ_NUM_STAGES == 2
      // With two stages the tile prefetched now is the next one computed:
      // a block mask's walk is then done once, not again for jc.
      int jn = -1, jn_cls = FJ_TILE_EMPTY;
#endif
      if (ji >= lo) {
        fjk_load_kv(p, s_k, s_v, stage_i, gk, gv, bt, ji, Lk);
#if FJ_NUM_STAGES == 2
        jn = ji;
        jn_cls = ji_cls;
#endif
        ji = fjk_advance(p, sq.sz, bm_row, b, h, q0, q1, ji, lo, &ti, &ji_cls);
      }
      fjk_cp_async_commit();

      const int kv0 = jc * FJ_BLOCK_N;
      const unsigned sk = s_k + stage * FJK_TILE_BYTES;
      const unsigned sv = s_v + stage * FJK_TILE_BYTES;
      // Not unrolled: one copy of the body keeps NVRTC time and code size
      // down; the sub-tile only moves the shared-memory bases.
#pragma unroll 1
      for (int sub = 0; sub < FJ_BLOCK_N / FJK_SUB_N; ++sub) {
        const int skv0 = kv0 + sub * FJK_SUB_N;
        // A PARTIAL CTA tile is reclassified on this warp's rows and this
        // sub-tile: the warp may skip it (EMPTY) or skip the mask (FULL).
        bool run = warp_active && skv0 < Lk;
        bool need_mask = false;
#if FJ_HAS_MASK
        if (run && jc_cls == FJ_TILE_PARTIAL) {
          const int wc = fj_tile_class(p.user, sq.sz, b, h, wq0, wq1, skv0,
                                       min(skv0 + FJK_SUB_N, Lk) - 1);
          run = wc != FJ_TILE_EMPTY;
          need_mask = wc == FJ_TILE_PARTIAL;
        }
#endif
        if (run)
          fjk_tile_step(p, sq.sz, b, h, wq0, skv0, need_mask, skv0 + FJK_SUB_N > Lk,
                        sk + sub * FJK_SUB_N * FJK_ROW_BYTES,
                        sv + sub * FJK_SUB_N * FJK_ROW_BYTES, s_q, exp_scale,
#if FJK_Q_IN_REGISTERS
                        qf,
#endif
                        acc, row_m, row_l);
      }

      stage = stage + 1 == FJ_NUM_STAGES ? 0 : stage + 1;
#if FJ_NUM_STAGES == 2
      if (bm_row >= 0) {
        jc = jn;
        jc_cls = jn_cls;
      } else {
        jc = fjk_advance(p, sq.sz, bm_row, b, h, q0, q1, jc, lo, &tc, &jc_cls);
      }
#else
      jc = fjk_advance(p, sq.sz, bm_row, b, h, q0, q1, jc, lo, &tc, &jc_cls);
#endif
    }
    fjk_cp_async_wait<0>();
  }
  // ---- epilogue: O = acc / l through this warp's own rows of the Q area ----
  // Each warp only ever read its own Q rows, so once its ldmatrix reads are
  // done (they are synchronous) it may overwrite them without a CTA barrier.
  float inv_l[FJK_MT][2];
#pragma unroll
  for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float l = row_l[mt][hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      row_l[mt][hh] = l;
      inv_l[mt][hh] = l > 0.f ? 1.f / l : 0.f;
    }
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = warp * FJK_WARP_ROWS + mt * 16 + g + hh * 8;  // r & 7 == g
      const unsigned row_addr = s_q + r * FJK_ROW_BYTES + t4 * 4;
#pragma unroll
      for (int dt = 0; dt < FJK_DT; ++dt) {
        const unsigned v = fj_pack2(acc[mt][dt][2 * hh] * inv_l[mt][hh],
                                     acc[mt][dt][2 * hh + 1] * inv_l[mt][hh]);
        asm volatile("st.shared.b32 [%0], %1;\n"
                     :: "r"(row_addr + ((dt ^ g) << 4)), "r"(v) : "memory");
      }
    }
  __syncwarp();
  {
    fj_u16 *go = (fj_u16 *)p.o + b * p.o_sb + h * p.o_sh + sq.q_row0 * p.o_ss;
#pragma unroll
    for (int i = 0; i < FJK_WARP_ROWS * FJK_CHUNKS / 32; ++i) {
      const int idx = i * 32 + lane;
      const int r = warp * FJK_WARP_ROWS + idx / FJK_CHUNKS, c = idx % FJK_CHUNKS;
      if (q0 + r < Lq) {
        unsigned v0, v1, v2, v3;
        asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                     : "r"(s_q + r * FJK_ROW_BYTES + ((c ^ (r & 7)) << 4)));
        fj_st_global_v4(go + (q0 + r) * p.o_ss + c * 8, v0, v1, v2, v3);
      }
    }
  }
  if (p.lse != nullptr && t4 == 0) {
    float *gl = p.lse + b * p.lse_sb + h * p.lse_sh + sq.q_row0;
#pragma unroll
    for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int qi = wq0 + mt * 16 + g + hh * 8;
        if (qi < Lq) {
          const float l = row_l[mt][hh];
          gl[qi] = l > 0.f ? (row_m[mt][hh] + log2f(l)) * FJK_LN2 : fj_neg_inf();
        }
      }
  }
}

