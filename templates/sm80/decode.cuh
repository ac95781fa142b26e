// templates/sm80/decode.cuh: the decode kernel (contract and design:
// decode_config.cuh): a CTA's rows and kv run, each warp's slice stream with
// its online softmax, and the epilogue that merges the warps' states.
#pragma once

// What a CTA works on: sequence b, KV head hkv, its row block's query rows
// and the sequence's sizes as the spec sees them (Lk its own).
struct fjd_cta {
  int b, hkv, G, Lq, Lk;
  int row0;   // the row block's first packed row (g * Lq + t)
  int h0, nh; // its query heads: h0 .. h0 + nh - 1
  fj_sizes z;
};

// Row r of the block: query head and token (clamped into range for padded
// rows, whose results are never stored).
__device__ __forceinline__ void fjd_row(const fjd_cta &c, int r, int *h, int *t, bool *valid) {
  const int gr = c.row0 + r;
  *valid = gr < c.G * c.Lq;
  const int gc = min(gr, c.G * c.Lq - 1);
  const int g = c.Lq == 1 ? gc : gc / c.Lq;  // one token: no division
  *h = c.hkv * c.G + g;
  *t = gc - g * c.Lq;
}

#if FJ_HAS_MASK
// The class of kv rows [kv0, kv1] for every query row of the block: each of
// the block's heads over tokens [0, Lq) (a superset of its rows: sound).
// Lanes take heads; a warp-uniform result.
__device__ __forceinline__ int fjd_class(const fj_fwd_params &p, const fjd_cta &c, int kv0,
                                         int kv1) {
  bool empty = true, full = true;
  for (int i = threadIdx.x & 31; i < c.nh; i += 32) {
    const int cls = fj_tile_class(p.user, c.z, c.b, c.h0 + i, 0, c.Lq - 1, kv0, kv1);
    empty &= cls == FJ_TILE_EMPTY;
    full &= cls == FJ_TILE_FULL;
  }
  if (__all_sync(0xffffffffu, empty)) return FJ_TILE_EMPTY;
  return __all_sync(0xffffffffu, full) ? FJ_TILE_FULL : FJ_TILE_PARTIAL;
}

// First and last tile in [0, nt) that is not EMPTY for the block's rows
// (lo > hi: none). Threads take tiles, each looping over the heads; the
// CTA reduces through shared memory.
__device__ __forceinline__ void fjd_tile_range(const fj_fwd_params &p, const fjd_cta &c, int nt,
                                               int *lo, int *hi) {
  __shared__ int range[2];
  if (threadIdx.x == 0) range[0] = nt, range[1] = -1;
  __syncthreads();
  int f = nt, l = -1;
  for (int j = threadIdx.x; j < nt; j += FJD_THREADS) {
    const int kv0 = j * FJ_BLOCK_N, kv1 = min(kv0 + FJ_BLOCK_N, c.Lk) - 1;
    bool any = false;
    for (int i = 0; i < c.nh && !any; ++i)
      any = fj_tile_class(p.user, c.z, c.b, c.h0 + i, 0, c.Lq - 1, kv0, kv1) != FJ_TILE_EMPTY;
    if (any) f = min(f, j), l = j;
  }
  f = __reduce_min_sync(0xffffffffu, f);
  l = __reduce_max_sync(0xffffffffu, l);
  if ((threadIdx.x & 31) == 0) {
    atomicMin(&range[0], f);
    atomicMax(&range[1], l);
  }
  __syncthreads();
  *lo = range[0];
  *hi = range[1];
}
#endif

// The class of warp slice j (rows j * FJ_BLOCK_N + 16 w ..): EMPTY past Lk;
// else the class of the warp's whole run (span) unless that is PARTIAL,
// when the slice is classified on its own.
__device__ __forceinline__ int fjd_slice_class(const fj_fwd_params &p, const fjd_cta &c,
                                               int j, int warp, int span) {
  const int kv0 = j * FJ_BLOCK_N + warp * FJD_SLICE;
  if (kv0 >= c.Lk) return FJ_TILE_EMPTY;
#if FJ_HAS_MASK
  if (span != FJ_TILE_PARTIAL) return span;
  return fjd_class(p, c, kv0, min(kv0 + FJD_SLICE, c.Lk) - 1);
#else
  (void)p, (void)span;
  return FJ_TILE_FULL;
#endif
}

// The next slice after j below j_end that is not EMPTY (j_end: none).
__device__ __forceinline__ int fjd_next(const fj_fwd_params &p, const fjd_cta &c, int j,
                                        int j_end, int warp, int span, int *cls) {
  for (++j; j < j_end; ++j) {
    *cls = fjd_slice_class(p, c, j, warp, span);
    if (*cls != FJ_TILE_EMPTY) break;
  }
  return j;
}

// Where slice kv0's rows lie in K and V: the block (sequence b, or the
// page the block table gives: a slice never crosses a page), the row
// within it, and how many of the slice's rows are below Lk (>= 1).
struct fjd_at {
  long long blk;
  int row, valid;
};

__device__ __forceinline__ fjd_at fjd_slice_at(const fj_fwd_params &p, const fjd_cta &c,
                                               int kv0) {
  fjd_at a;
  a.valid = c.Lk - kv0;
  if (p.block_table == nullptr) {
    a.blk = c.b;
    a.row = kv0;
  } else {
    a.blk = __ldg(p.block_table + (long long)c.b * p.bt_stride + kv0 / p.page_size);
    a.row = kv0 % p.page_size;
  }
  return a;
}

// Copies the slice at `at` of K or V (base and strides given) into
// swizzled shared memory at s: chunk ch of row r lands at chunk ch ^ (r &
// 7). Rows at or past Lk are zero-filled, not read (V rows must be finite:
// P = 0 times NaN would still be NaN). A lane copies chunk ch of rows r0,
// r0 + ROWS_PER_PASS, ...: one address computed, then a stride added.
__device__ __forceinline__ void fjd_load_slice(const fjd_cta &c, const fjd_at &at, unsigned s,
                                               const void *base, long long sb, long long sh,
                                               long long ss) {
  const int lane = threadIdx.x & 31;
  constexpr int ROWS_PER_PASS = 32 / FJD_CHUNKS;
  const int r0 = lane / FJD_CHUNKS, ch = lane % FJD_CHUNKS;
  const fj_u16 *src = (const fj_u16 *)base + (long long)c.hkv * sh + at.blk * sb +
                      (long long)(at.row + r0) * ss + ch * 8;
  const long long step = ROWS_PER_PASS * ss;
  // r & 7 = r0 | (i * ROWS_PER_PASS & 7): r0 is below ROWS_PER_PASS, a
  // power of two.
  const unsigned dst = s + r0 * FJD_ROW_BYTES;
  const int sw = ch ^ r0;
  if (at.valid >= FJD_SLICE) {
#pragma unroll
    for (int i = 0; i < FJD_SLICE / ROWS_PER_PASS; ++i, src += step)
      fjk_cp_async16(dst + i * ROWS_PER_PASS * FJD_ROW_BYTES +
                         ((sw ^ ((i * ROWS_PER_PASS) & 7)) << 4),
                     src, 16);
  } else {
#pragma unroll
    for (int i = 0; i < FJD_SLICE / ROWS_PER_PASS; ++i, src += step) {
      const bool in = r0 + i * ROWS_PER_PASS < at.valid;
      fjk_cp_async16(dst + i * ROWS_PER_PASS * FJD_ROW_BYTES +
                         ((sw ^ ((i * ROWS_PER_PASS) & 7)) << 4),
                     in ? src : base, in ? 16 : 0);
    }
  }
}

// K and V of slice j into stage st of this warp's ring at s_w.
__device__ __forceinline__ void fjd_load_stage(const fj_fwd_params &p, const fjd_cta &c,
                                               unsigned s_w, int st, int j, int warp,
                                               bool with_v) {
  const fjd_at at = fjd_slice_at(p, c, j * FJ_BLOCK_N + warp * FJD_SLICE);
  const unsigned sk = s_w + st * FJD_STAGE_BYTES;
  fjd_load_slice(c, at, sk, p.k, p.k_sb, p.k_sh, p.k_ss);
  if (with_v) fjd_load_slice(c, at, sk + FJD_SLICE_BYTES, p.v, p.v_sb, p.v_sh, p.v_ss);
}

// A warp's stream over its slices of tiles [j_begin, j_end): for each, S =
// Q K^T, score_mod, the mask and the kv bound, the online softmax and O +=
// P V, with the next FJ_NUM_STAGES - 1 slices in flight. SKIP: Skip Softmax
// (p.skip_log2 < 0): V is loaded only for a slice that is kept, after the
// decision, so a skipped slice costs its K alone; its latency is paid once
// a kept slice (the next K loads meanwhile, and other warps run).
template <bool SKIP>
__device__ __forceinline__ void fjd_stream(const fj_fwd_params &p, const fjd_cta &c,
                                           int j_begin, int j_end, int whole, int j_guess,
                                           unsigned s_q, unsigned s_w,
                                           float (&acc)[FJD_MT][FJD_DT][4],
                                           float (&row_m)[FJD_MT][2],
                                           float (&row_l)[FJD_MT][2]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g8 = lane >> 2, t4 = lane & 3;
  // ldmatrix addressing (sm80/pipeline.cuh's scheme on 16-row slices).
  const int x_q = (lane >> 4) ^ (lane & 7);
  const unsigned q_row = (((lane >> 3) & 1) * 8 + (lane & 7)) * FJD_ROW_BYTES;
  const int x_k = ((lane >> 3) & 1) ^ (lane & 7);
  const unsigned k_row = (((lane >> 4) * 8) + (lane & 7)) * FJD_ROW_BYTES;
  const int x_v = x_q;
  const unsigned v_row = q_row;

  // This lane's rows (g8 and g8 + 8 of each row tile): head, token, valid.
  int rh[FJD_MT][2], rt[FJD_MT][2];
  bool rv[FJD_MT][2];
#pragma unroll
  for (int mt = 0; mt < FJD_MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      fjd_row(c, mt * 16 + g8 + 8 * hh, &rh[mt][hh], &rt[mt][hh], &rv[mt][hh]);

#if FJ_HAS_SCORE_MOD
  const float exp_scale = 1.0f;
#else
  const float exp_scale = p.scale_log2;
#endif

  // The class of the warp's run: FULL (or EMPTY) spares each slice its own
  // classification. Inside a FULL whole range it is FULL.
  int span = FJ_TILE_FULL;
#if FJ_HAS_MASK
  if (whole != FJ_TILE_FULL && j_begin < j_end && j_begin * FJ_BLOCK_N < c.Lk)
    span = fjd_class(p, c, j_begin * FJ_BLOCK_N, min(j_end * FJ_BLOCK_N, c.Lk) - 1);
#else
  (void)whole;
#endif

  // Prologue: the first FJ_NUM_STAGES - 1 slices. Stage 0 holds slice
  // j_guess, issued with Q (the kernel's start): when that is the warp's
  // first slice it is not loaded again; otherwise it is let land before
  // stage 0 takes the first slice.
  int cls_l = FJ_TILE_FULL, cls_c = FJ_TILE_FULL;
  int jl = fjd_next(p, c, j_begin - 1, j_end, warp, span, &cls_l);
  int jc = jl;
  cls_c = cls_l;
  const bool guessed = jl == j_guess;
  if (!guessed) fjk_cp_async_wait<0>();
#pragma unroll
  for (int st = 0; st < FJ_NUM_STAGES - 1; ++st) {
    if (jl < j_end) {
      if (st != 0 || !guessed) fjd_load_stage(p, c, s_w, st, jl, warp, !SKIP);
      jl = fjd_next(p, c, jl, j_end, warp, span, &cls_l);
    }
    fjk_cp_async_commit();
  }
  // Q and the guess (the oldest group, issued at the kernel's start) have
  // landed once at most FJ_NUM_STAGES - 1 groups are pending.
  fjk_cp_async_wait<FJ_NUM_STAGES - 1>();
  __syncthreads();
#if FJD_Q_IN_REGISTERS
  unsigned qf[FJD_KT][4];
#pragma unroll
  for (int kk = 0; kk < FJD_KT; ++kk) fjk_ldsm_x4(qf[kk], s_q + q_row + (((2 * kk) ^ x_q) << 4));
#endif

  for (int st = 0; jc < j_end; st = st + 1 == FJ_NUM_STAGES ? 0 : st + 1) {
    // The stage consumed last iteration takes the next slice in flight:
    // before this slice's wait, or with SKIP after its V load (below).
    const int st_load = st == 0 ? FJ_NUM_STAGES - 1 : st - 1;
    if (!SKIP) {
      if (jl < j_end) {
        fjd_load_stage(p, c, s_w, st_load, jl, warp, true);
        jl = fjd_next(p, c, jl, j_end, warp, span, &cls_l);
      }
      fjk_cp_async_commit();
      fjk_cp_async_wait<FJ_NUM_STAGES - 1>();
    } else {
      // Pending: this slice's K and the FJ_NUM_STAGES - 2 after it (every
      // V load was waited for in its own iteration).
      fjk_cp_async_wait<FJ_NUM_STAGES - 2>();
    }
    __syncwarp();

    const unsigned sk = s_w + st * FJD_STAGE_BYTES, sv = sk + FJD_SLICE_BYTES;
    const int kv0 = jc * FJ_BLOCK_N + warp * FJD_SLICE;

    // ---- S = Q K^T: FJD_MT x (16 rows x 16 kv) ----
    float s[FJD_MT][2][4];
#pragma unroll
    for (int mt = 0; mt < FJD_MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < FJD_KT; ++kk) {
      unsigned kb[4];
      fjk_ldsm_x4(kb, sk + k_row + (((2 * kk) ^ x_k) << 4));
#pragma unroll
      for (int mt = 0; mt < FJD_MT; ++mt) {
#if FJD_Q_IN_REGISTERS
        const unsigned(&qa)[4] = qf[kk];
#else
        unsigned qa[4];
        fjk_ldsm_x4(qa, s_q + q_row + mt * 16 * FJD_ROW_BYTES + (((2 * kk) ^ x_q) << 4));
#endif
        fjk_mma(s[mt][0], qa, kb[0], kb[1]);
        fjk_mma(s[mt][1], qa, kb[2], kb[3]);
      }
    }

    // ---- score_mod, then the mask and the kv bound ----
#pragma unroll
    for (int mt = 0; mt < FJD_MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hh = e >> 1;
          (void)hh;
          const int ki = kv0 + nt * 8 + 2 * t4 + (e & 1);
          float v = s[mt][nt][e];
#if FJ_HAS_SCORE_MOD
          v = fj_score_log2(p.user, c.z, v, p.scale, c.b, rh[mt][hh], rt[mt][hh], 0,
                            kv0 + 2 * t4, nt * 8 + (e & 1));
#endif
          s[mt][nt][e] = ki < c.Lk ? v : fj_neg_inf();
        }
#if FJ_HAS_MASK
    if (cls_c == FJ_TILE_PARTIAL) {  // one branch a slice, not one an element
#pragma unroll
      for (int mt = 0; mt < FJD_MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int hh = e >> 1, ki = kv0 + nt * 8 + 2 * t4 + (e & 1);
            if (!fj_mask(p.user, c.z, c.b, rh[mt][hh], rt[mt][hh], ki))
              s[mt][nt][e] = fj_neg_inf();
          }
    }
#endif

    // ---- the online softmax: rows g8 and g8 + 8 of each row tile ----
    float m_new[FJD_MT][2];
    bool skip = SKIP;
#pragma unroll
    for (int mt = 0; mt < FJD_MT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = fmaxf(fmaxf(s[mt][0][2 * hh], s[mt][0][2 * hh + 1]),
                         fmaxf(s[mt][1][2 * hh], s[mt][1][2 * hh + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        m_new[mt][hh] = mx * exp_scale;
        // Skip Softmax: every valid row's tile max lies more than
        // -skip_log2 below its running max (a row with no running max yet
        // keeps the slice, unless the slice has nothing for it either).
        if (SKIP && rv[mt][hh])
          skip &= m_new[mt][hh] == fj_neg_inf() ||
                  m_new[mt][hh] < row_m[mt][hh] + p.skip_log2;
      }
    if (SKIP) {
      // V of a kept slice, then the next slice's K, each its own group.
      skip = __all_sync(0xffffffffu, skip);
      if (!skip) {
        fjd_load_slice(c, fjd_slice_at(p, c, kv0), sv, p.v, p.v_sb, p.v_sh, p.v_ss);
        fjk_cp_async_commit();
      }
      if (jl < j_end) {
        fjd_load_stage(p, c, s_w, st_load, jl, warp, false);
        jl = fjd_next(p, c, jl, j_end, warp, span, &cls_l);
      }
      fjk_cp_async_commit();
    }
    if (!skip) {
      float alpha[FJD_MT][2], shift[FJD_MT][2];
      bool grow_any = false;
#pragma unroll
      for (int mt = 0; mt < FJD_MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float m_old = row_m[mt][hh];
          const bool grow = m_new[mt][hh] > m_old;
          alpha[mt][hh] = grow ? fj_exp2(m_old - m_new[mt][hh]) : 1.0f;
          const float m_use = grow ? m_new[mt][hh] : m_old;
          row_m[mt][hh] = m_use;
          shift[mt][hh] = m_use == fj_neg_inf() ? 0.f : m_use;
          row_l[mt][hh] *= alpha[mt][hh];
          grow_any |= grow;
        }
      if (__any_sync(0xffffffffu, grow_any)) {
#pragma unroll
        for (int mt = 0; mt < FJD_MT; ++mt)
#pragma unroll
          for (int dt = 0; dt < FJD_DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][dt][e] *= alpha[mt][e >> 1];
      }
      unsigned pf[FJD_MT][4];
#pragma unroll
      for (int mt = 0; mt < FJD_MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[mt][nt][e] = fj_exp2(fmaf(s[mt][nt][e], exp_scale, -shift[mt][e >> 1]));
        pf[mt][0] = fj_pack2(s[mt][0][0], s[mt][0][1]);
        pf[mt][1] = fj_pack2(s[mt][0][2], s[mt][0][3]);
        pf[mt][2] = fj_pack2(s[mt][1][0], s[mt][1][1]);
        pf[mt][3] = fj_pack2(s[mt][1][2], s[mt][1][3]);
        row_l[mt][0] += s[mt][0][0] + s[mt][0][1] + s[mt][1][0] + s[mt][1][1];
        row_l[mt][1] += s[mt][0][2] + s[mt][0][3] + s[mt][1][2] + s[mt][1][3];
      }
      if (SKIP) {  // this slice's V: all but the newest group (the next K)
        fjk_cp_async_wait<1>();
        __syncwarp();
      }
      // ---- O += P V ----
#pragma unroll
      for (int dp = 0; dp < FJD_DT / 2; ++dp) {
        unsigned vb[4];
        fjk_ldsm_x4_trans(vb, sv + v_row + (((2 * dp) ^ x_v) << 4));
#pragma unroll
        for (int mt = 0; mt < FJD_MT; ++mt) {
          fjk_mma(acc[mt][2 * dp], pf[mt], vb[0], vb[1]);
          fjk_mma(acc[mt][2 * dp + 1], pf[mt], vb[2], vb[3]);
        }
      }
    }
    __syncwarp();  // every lane is done with stage st before it is reloaded
    jc = fjd_next(p, c, jc, j_end, warp, span, &cls_c);
  }
  fjk_cp_async_wait<0>();
}

// This warp's O, times its factor f a row, into the epilogue's fp32 tile
// red_o (rows FJD_RED_STRIDE floats apart): stored when first, else added.
__device__ __forceinline__ void fjd_add_o(float *red_o, const float (&acc)[FJD_MT][FJD_DT][4],
                                          const float (&f)[FJD_MT][2], bool first) {
  const int lane = threadIdx.x & 31;
  const int g8 = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mt = 0; mt < FJD_MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = mt * 16 + g8 + 8 * hh;
#pragma unroll
      for (int dt = 0; dt < FJD_DT; ++dt) {
        float2 *dst = (float2 *)(red_o + r * FJD_RED_STRIDE + dt * 8 + 2 * t4);
        float2 x = make_float2(acc[mt][dt][2 * hh] * f[mt][hh],
                               acc[mt][dt][2 * hh + 1] * f[mt][hh]);
        if (!first) {
          const float2 y = *dst;
          x.x += y.x;
          x.y += y.y;
        }
        *dst = x;
      }
    }
}

// FJD_MIN_CTAS a multiprocessor at least (what the stages' shared memory
// allows at D=128): registers up to 255 a thread either way.
extern "C" __global__ void __launch_bounds__(FJD_THREADS, FJD_MIN_CTAS)
fj_attention_decode(const __grid_constant__ fj_fwd_params p) {
  extern __shared__ __align__(128) unsigned char fjd_smem[];
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int g8 = lane >> 2, t4 = lane & 3;

  // Q's load is issued first, with a guess at each warp's first K and V
  // slice: a CTA has one warp a scheduler, so the setup below (the mask's
  // classification, the kv run) runs at its instructions' latency, and Q
  // and the slice arrive meanwhile.
  fjd_cta c;
  c.b = blockIdx.z;
  c.hkv = blockIdx.y;
  c.G = p.kv_group;
  c.Lq = p.sz.Lq;
  const int lk_b = p.seqlens_k != nullptr ? __ldg(p.seqlens_k + c.b) : p.sz.Lk;
  const int row_blocks = (c.G * c.Lq + FJ_BLOCK_M - 1) / FJ_BLOCK_M;
  const int rb = row_blocks == 1 ? 0 : (int)blockIdx.x % row_blocks;
  const int split = row_blocks == 1 ? (int)blockIdx.x : (int)blockIdx.x / row_blocks;
  c.row0 = rb * FJ_BLOCK_M;

  // Q rows into shared memory (swizzled like a slice), zeros for padding.
  const unsigned s_q = fj_smem_u32(fjd_smem);
  const unsigned s_w = s_q + FJD_Q_BYTES + warp * FJD_WARP_BYTES;
  constexpr int Q_CHUNKS = FJ_BLOCK_M * FJD_CHUNKS;
#pragma unroll
  for (int pass = 0; pass < (Q_CHUNKS + FJD_THREADS - 1) / FJD_THREADS; ++pass) {
    const int i = tid + pass * FJD_THREADS;
    if (Q_CHUNKS % FJD_THREADS != 0 && i >= Q_CHUNKS) break;
    const int r = i / FJD_CHUNKS, ch = i % FJD_CHUNKS;
    int h, t;
    bool valid;
    fjd_row(c, r, &h, &t, &valid);
    const fj_u16 *src = (const fj_u16 *)p.q + (long long)c.b * p.q_sb + (long long)h * p.q_sh +
                        (long long)t * p.q_ss + ch * 8;
    fjk_cp_async16(s_q + r * FJD_ROW_BYTES + ((ch ^ (r & 7)) << 4), src, valid ? 16 : 0);
  }

  c.Lk = p.seqlens_k != nullptr ? min(max(lk_b, 0), p.sz.Lk) : p.sz.Lk;
  c.z = p.sz;
  c.z.Lk = c.Lk;
  const int nt = (c.Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N;
  const bool skip_mode = p.skip_log2 < 0.f;

  // The guess: this split's first tile as if no tile were EMPTY (decode
  // under a causal mask, or none), its warp's slice into stage 0. With Q,
  // the oldest cp.async group.
  const int j_guess = p.num_splits == 1 ? 0 : (int)((long long)nt * split / p.num_splits);
  if (j_guess * FJ_BLOCK_N + warp * FJD_SLICE < c.Lk)
    fjd_load_stage(p, c, s_w, 0, j_guess, warp, !skip_mode);
  fjk_cp_async_commit();
  const int last_row = min(c.row0 + FJ_BLOCK_M, c.G * c.Lq) - 1;
  c.h0 = c.hkv * c.G + (c.Lq == 1 ? c.row0 : c.row0 / c.Lq);
  c.nh = c.hkv * c.G + (c.Lq == 1 ? last_row : last_row / c.Lq) - c.h0 + 1;

  // The kv run of this split: an equal share of the span [lo, hi] from the
  // first to the last non-EMPTY tile (EMPTY tiles inside it are skipped).
  int lo = 0, hi = nt - 1;
#if FJ_HAS_MASK
  // The same for every warp: the whole range FULL (decode under a causal
  // mask) or EMPTY needs no walk over its tiles.
  const int whole = c.Lk > 0 ? fjd_class(p, c, 0, c.Lk - 1) : FJ_TILE_EMPTY;
  if (whole == FJ_TILE_EMPTY)
    hi = -1;
  else if (whole == FJ_TILE_PARTIAL)
    fjd_tile_range(p, c, nt, &lo, &hi);
#else
  const int whole = FJ_TILE_FULL;
#endif
  const int n = max(hi - lo + 1, 0);
  int j_begin = lo, j_end = lo + n;
  if (p.num_splits > 1) {
    j_begin = lo + (int)((long long)n * split / p.num_splits);
    j_end = lo + (int)((long long)n * (split + 1) / p.num_splits);
  }

  float acc[FJD_MT][FJD_DT][4];
  float row_m[FJD_MT][2], row_l[FJD_MT][2];  // running max (log2 units), sum
#pragma unroll
  for (int mt = 0; mt < FJD_MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < FJD_DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][dt][e] = 0.f;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) row_m[mt][hh] = fj_neg_inf(), row_l[mt][hh] = 0.f;
  }
  if (skip_mode)
    fjd_stream<true>(p, c, j_begin, j_end, whole, j_guess, s_q, s_w, acc, row_m, row_l);
  else
    fjd_stream<false>(p, c, j_begin, j_end, whole, j_guess, s_q, s_w, acc, row_m, row_l);

  // The merge kernel may launch now (runtime/decode.c); it waits for this
  // grid's partials before reading them.
  fj_grid_dep_launch();
  // ---- epilogue: merge the warps' states through shared memory ----
  __syncthreads();  // every warp is done with its stages
  float *red_m = (float *)(fjd_smem + FJD_Q_BYTES);  // [warp][row]
  float *red_l = red_m + FJ_NUM_WARPS * FJ_BLOCK_M;
  float *red_lse = red_l + FJ_NUM_WARPS * FJ_BLOCK_M;  // [row]
  float *red_o = red_lse + FJ_BLOCK_M;  // [region][row][FJD_RED_STRIDE]
#pragma unroll
  for (int mt = 0; mt < FJD_MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float l = row_l[mt][hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      row_l[mt][hh] = l;
      if (t4 == 0) {
        const int r = mt * 16 + g8 + 8 * hh;
        red_m[warp * FJ_BLOCK_M + r] = row_m[mt][hh];
        red_l[warp * FJ_BLOCK_M + r] = l;
      }
    }
  __syncthreads();
  // This warp's factor a row: its O scaled to the rows' common max and
  // divided by their total sum.
  float f[FJD_MT][2];
#pragma unroll
  for (int mt = 0; mt < FJD_MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = mt * 16 + g8 + 8 * hh;
      float m = fj_neg_inf();
#pragma unroll
      for (int w = 0; w < FJ_NUM_WARPS; ++w) m = fmaxf(m, red_m[w * FJ_BLOCK_M + r]);
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < FJ_NUM_WARPS; ++w) {
        const float mw = red_m[w * FJ_BLOCK_M + r];
        l += mw == fj_neg_inf() ? 0.f : red_l[w * FJ_BLOCK_M + r] * fj_exp2(mw - m);
      }
      const float mine = row_m[mt][hh];
      f[mt][hh] = (mine == fj_neg_inf() || l == 0.f) ? 0.f : fj_exp2(mine - m) / l;
      // The row's LSE (natural log), kept where the store below finds it.
      if (warp == 0 && t4 == 0)
        red_lse[r] = l == 0.f ? fj_neg_inf() : (m + __log2f(l)) * FJD_LN2;
    }
  // Warp w adds its O into region w / FJD_RED_ROUNDS in round w %
  // FJD_RED_ROUNDS (the first round stores), and the output below sums the
  // regions in order: shared memory has no float atomic add (it would be a
  // compare-and-swap loop, and the warps contend for the same words), and a
  // fixed order gives the same sum every run.
#pragma unroll 1
  for (int k = 0; k < FJD_RED_ROUNDS; ++k) {
    if (warp % FJD_RED_ROUNDS == k)
      fjd_add_o(red_o + warp / FJD_RED_ROUNDS * FJD_RED_REGION, acc, f, k == 0);
    __syncthreads();
  }

  // ---- out: O and LSE, or this split's partials ----
  const bool part = p.num_splits > 1;
  constexpr int O_CHUNKS = FJ_BLOCK_M * (FJ_HEAD_DIM / 8);
#pragma unroll
  for (int pass = 0; pass < (O_CHUNKS + FJD_THREADS - 1) / FJD_THREADS; ++pass) {
    const int i = tid + pass * FJD_THREADS;
    if (O_CHUNKS % FJD_THREADS != 0 && i >= O_CHUNKS) break;
    const int r = i / (FJ_HEAD_DIM / 8), d = (i % (FJ_HEAD_DIM / 8)) * 8;
    int h, t;
    bool valid;
    fjd_row(c, r, &h, &t, &valid);
    if (!valid) continue;
    const float4 *src = (const float4 *)(red_o + r * FJD_RED_STRIDE + d);
    float4 o0 = src[0], o1 = src[1];
#pragma unroll
    for (int g = 1; g < FJD_RED_REGIONS; ++g) {
      const float4 a0 = src[g * FJD_RED_REGION / 4], a1 = src[g * FJD_RED_REGION / 4 + 1];
      o0.x += a0.x, o0.y += a0.y, o0.z += a0.z, o0.w += a0.w;
      o1.x += a1.x, o1.y += a1.y, o1.z += a1.z, o1.w += a1.w;
    }
    const float o[8] = {o0.x, o0.y, o0.z, o0.w, o1.x, o1.y, o1.z, o1.w};
    const float lse = red_lse[r];
    if (part) {
      const long long row =
          (((long long)split * p.sz.B + c.b) * p.sz.Hq + h) * p.sz.Lq + t;
      float4 *dst = (float4 *)(p.part_o + row * FJ_HEAD_DIM + d);
      dst[0] = o0;
      dst[1] = o1;
      if (d == 0) p.part_lse[row] = lse;
    } else {
      fj_u16 *dst = (fj_u16 *)p.o + (long long)c.b * p.o_sb + (long long)h * p.o_sh +
                    (long long)t * p.o_ss + d;
      fj_st_global_v4(dst, fj_pack2(o[0], o[1]), fj_pack2(o[2], o[3]), fj_pack2(o[4], o[5]),
                      fj_pack2(o[6], o[7]));
      if (d == 0 && p.lse != nullptr)
        p.lse[(long long)c.b * p.lse_sb + (long long)h * p.lse_sh + t] = lse;
    }
  }
}
