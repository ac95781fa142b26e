// templates/sm80/fwd.cuh: FlashAttention-2 style forward kernel for sm_80 and
// newer (mma.sync m16n8k16, ldmatrix, cp.async). Runs unchanged on sm_86,
// sm_89, sm_90(a) and later.
//
// ---- Contract with the generator -----------------------------------------
// Macros (all required unless marked optional):
//   FJ_HEAD_DIM        64 | 128                  head dim of q, k, v and o
//   FJ_DTYPE_BF16 1  or  FJ_DTYPE_F16 1          element type (exactly one)
//   FJ_BLOCK_M         query rows per CTA; FJ_BLOCK_M / FJ_NUM_WARPS must be
//                      16 or 32 (each warp owns 1 or 2 m16 row tiles)
//   FJ_BLOCK_N         kv rows per tile, multiple of 16
//   FJ_NUM_WARPS       warps per CTA (threads = 32 * FJ_NUM_WARPS)
//   FJ_NUM_STAGES      K/V shared-memory stages, >= 2 (prefetch distance
//                      FJ_NUM_STAGES - 1 tiles)
//   FJ_HAS_MASK        0 | 1: 1 calls fj_tile_class per tile and fj_mask per
//                      element of PARTIAL tiles; 0 never calls either. With
//                      a block mask in the parameters (p.bm_kv_num), the
//                      kv tiles and their classes come from its lists
//                      instead, and fj_tile_class only refines PARTIAL ones
//                      per warp
//   FJ_HAS_SCORE_MOD   0 | 1: 1 calls fj_score_mod per element
// Hooks (from the generated prologue; see common/fj_common.cuh):
//   struct fj_user_params;                               always
//   fj_tile_class(user, sz, b, h, q0, q1, kv0, kv1)      when FJ_HAS_MASK
//   fj_mask(user, sz, b, h, q, kv)                       when FJ_HAS_MASK
//   fj_score_mod(user, sz, score, b, h, q, kv)           when FJ_HAS_SCORE_MOD
//   (fj_tile_class and fj_mask receive query-head h; kv head is h / kv_group.)
//   fj_score_mod may be called with kv >= Lk (the element is masked after),
//   so it must be total; generated code is (buffer reads are bounds-checked).
// Launch: grid (ceil(Lq / FJ_BLOCK_M), Hq, B), FJ_NUM_WARPS * 32 threads,
//   dynamic shared memory (FJ_BLOCK_M + 2 * FJ_NUM_STAGES * FJ_BLOCK_N)
//   * FJ_HEAD_DIM * 2 bytes (no static shared memory). Block x processes query
//   block gridDim.x - 1 - blockIdx.x, so the heaviest causal blocks start first.
// Requirements the host checks: q, k, v, o 16-byte aligned; every batch, head
//   and sequence stride of q, k, v, o a multiple of 8 elements (16-byte cp.async
//   and 16-byte stores); head dim contiguous; p.scale > 0 when
//   FJ_HAS_SCORE_MOD is 0 (the running max is taken on unscaled q.k);
//   Hq == Hkv * kv_group; Lq, Lk >= 0. lse may be null.
// Semantics: score = q.k * scale, then fj_score_mod if present; pairs with
//   kv >= Lk or fj_mask false get probability 0; a row with no allowed pair
//   gets O = 0 and LSE = -inf. LSE is natural log, float32.
// ---------------------------------------------------------------------------
#pragma once

#if !defined(FJ_HEAD_DIM) || !defined(FJ_BLOCK_M) || !defined(FJ_BLOCK_N) || \
    !defined(FJ_NUM_WARPS) || !defined(FJ_NUM_STAGES) ||                      \
    !defined(FJ_HAS_MASK) || !defined(FJ_HAS_SCORE_MOD)
#error "sm80/fwd.cuh: a configuration macro from the generator is missing"
#endif
#if defined(FJ_DTYPE_BF16) == defined(FJ_DTYPE_F16)
#error "sm80/fwd.cuh: define exactly one of FJ_DTYPE_BF16, FJ_DTYPE_F16"
#endif
// The Q fragments stay in registers for the whole kv loop when a warp owns
// 16 rows; with 32 they would take the registers S and O need, and are read
// from shared memory at every k step instead.
#define FJK_Q_IN_REGISTERS (FJ_BLOCK_M / FJ_NUM_WARPS == 16)

// Shapes derived from the configuration.
constexpr int FJK_THREADS = FJ_NUM_WARPS * 32;
constexpr int FJK_WARP_ROWS = FJ_BLOCK_M / FJ_NUM_WARPS;
constexpr int FJK_MT = FJK_WARP_ROWS / 16;         // m16 tiles per warp
constexpr int FJK_KT = FJ_HEAD_DIM / 16;           // k16 steps of Q.K^T
constexpr int FJK_DT = FJ_HEAD_DIM / 8;            // n8 tiles of O per warp
// A kv tile is computed in sub-tiles of FJK_SUB_N columns, each a full online
// softmax step: S lives in registers for one sub-tile only. Default: the
// widest power-of-two divisor of BLOCK_N that keeps S and O within 160 f32
// registers a thread, which leaves the compiler room to prefetch fragments
// without spilling (S + O = 192 at 32 rows x D=128 x 64 columns spilled).
// With a score_mod, at most 32 scores a thread: its code is inlined once per
// score, and that is what NVRTC time grows with.
constexpr int fjk_default_sub_n() {
  int n = FJ_BLOCK_N;
  while (n > 16 && n % 2 == 0 &&
         (FJK_MT * n / 2 + FJK_MT * FJ_HEAD_DIM / 2 > 160 ||
          (FJ_HAS_SCORE_MOD && FJK_MT * n / 2 > 32) || FJ_BLOCK_N % n != 0))
    n /= 2;
  return n;
}
constexpr int FJK_SUB_N = fjk_default_sub_n();
constexpr int FJK_NT = FJK_SUB_N / 8;              // n8 tiles of S per warp
constexpr int FJK_PT = FJK_SUB_N / 16;             // k16 steps of P.V
// The exponent shift of a row is raised only when its max grows by more than
// FJK_RESCALE_THRESHOLD log2 units, and O is rescaled only when some row of
// the warp raised it. 0 is the exact FlashAttention-2 update, which still
// skips the O rescale on sub-tiles where no row's max grew. (A threshold of
// 8, FlashAttention-4's lazy rescaling, leaves the dominant key of a near
// one-hot row without P = 1 exactly, and its rounding roughly doubles the
// output error there.)
constexpr float FJK_RESCALE_THRESHOLD = 0.0f;
constexpr int FJK_CHUNKS = FJ_HEAD_DIM / 8;        // 16-byte chunks per row
constexpr int FJK_ROW_BYTES = FJ_HEAD_DIM * 2;
constexpr int FJK_TILE_BYTES = FJ_BLOCK_N * FJK_ROW_BYTES;
constexpr int FJK_LOAD_ROWS = FJK_THREADS / FJK_CHUNKS;  // rows per load pass

static_assert(FJ_HEAD_DIM == 64 || FJ_HEAD_DIM == 128, "head dim 64 or 128");
static_assert(FJK_WARP_ROWS == 16 || FJK_WARP_ROWS == 32, "16 or 32 rows a warp");
static_assert(FJK_WARP_ROWS * FJ_NUM_WARPS == FJ_BLOCK_M, "BLOCK_M / warps");
static_assert(FJ_BLOCK_N % 16 == 0 && FJ_BLOCK_N >= 16, "BLOCK_N multiple of 16");
static_assert(FJ_NUM_STAGES >= 2, "K/V pipeline needs two stages");
static_assert(FJK_SUB_N % 16 == 0 && FJ_BLOCK_N % FJK_SUB_N == 0, "sub-tile width");
// The swizzle below XORs the chunk index with (row & 7); every load pass and
// every ldmatrix group must start at a multiple of 8 rows for it to be uniform.
static_assert(FJK_LOAD_ROWS % 8 == 0, "rows per load pass multiple of 8");
static_assert(FJ_BLOCK_M % FJK_LOAD_ROWS == 0 && FJ_BLOCK_N % FJK_LOAD_ROWS == 0,
              "tiles must be whole load passes");

#define FJK_LOG2E 1.4426950408889634f
#define FJK_LN2 0.6931471805599453f

// ---- PTX wrappers: the TU includes no CUDA header (NVRTC needs no include
// path and parses less) ------------------------------------------------------

// 16-byte global->shared copy; src_bytes 0 zero-fills without reading.
__device__ __forceinline__ void fjk_cp_async16(unsigned dst, const void *src,
                                               int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void fjk_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void fjk_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ void fjk_ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void fjk_ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// c += a * b with a the m16k16 fragment and (b0, b1) the k16n8 fragment.
__device__ __forceinline__ void fjk_mma(float (&c)[4], const unsigned (&a)[4],
                                        unsigned b0, unsigned b1) {
#if defined(FJ_DTYPE_BF16)
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
#endif
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Copies rows [0, ROWS) of a tile whose first row is `g`, rows `ss` elements
// apart, into swizzled shared memory at `s`: 16-byte chunk c of row r lands
// at chunk c ^ (r & 7), so the 8 row addresses of one ldmatrix hit 8
// different bank groups. Rows >= valid (>= 1) are zero-filled from a clamped,
// in-bounds address: V rows past Lk must be finite, since P = 0 times NaN
// garbage would still be NaN. Each row address is computed from the clamped
// row on the spot; precomputed 64-bit row offsets would be loop invariants
// that the compiler keeps in registers (32 of them for K and V at D=128).
template <int ROWS>
__device__ __forceinline__ void fjk_load_tile(unsigned s, const fj_u16 *g,
                                              long long ss, int valid) {
  const int tid = fj_tid();
  const int r = tid / FJK_CHUNKS, c = tid % FJK_CHUNKS;
  const unsigned dst = s + r * FJK_ROW_BYTES + ((c ^ (r & 7)) << 4);
#pragma unroll
  for (int i = 0; i < ROWS / FJK_LOAD_ROWS; ++i) {
    const int row = r + i * FJK_LOAD_ROWS;
    const fj_u16 *src = g + (long long)min(row, valid - 1) * ss + c * 8;
    fjk_cp_async16(dst + i * FJK_LOAD_ROWS * FJK_ROW_BYTES, src, row < valid ? 16 : 0);
  }
}

// ---- block mask (p.bm_kv_num != nullptr) ----
// The CTA's tiles are its row's PARTIAL blocks, then its FULL blocks, each
// block a run of bm_kv_ratio tiles: positions 0, 1, ... of that sequence.

// Index of this CTA's row in the block mask's count arrays.
__device__ __forceinline__ int fjk_bm_row(const fj_fwd_params &p, int b, int h,
                                          int m_block) {
  return b * p.bm_b_stride + h * p.bm_h_stride + m_block / p.bm_q_ratio;
}

// The tile at sequence position *t, or the next one that starts below Lk
// (the tail of a last block may not); *t is moved to it and *cls receives
// its class. -1 past the end of the sequence.
__device__ __forceinline__ int fjk_bm_tile(const fj_fwd_params &p, int row,
                                           int *t, int *cls) {
  const int r = p.bm_kv_ratio;
  const int np = __ldg(p.bm_kv_num + row) * r;
  const int n = np + __ldg(p.bm_full_num + row) * r;
  const long long base = (long long)row * p.bm_nkv;
  for (; *t < n; ++*t) {
    const bool partial = *t < np;
    const int k = partial ? *t : *t - np;
    const int blk = __ldg((partial ? p.bm_kv_idx : p.bm_full_idx) + base + k / r);
    const int j = blk * r + k % r;
    if (j * FJ_BLOCK_N < p.sz.Lk) {
      *cls = partial ? FJ_TILE_PARTIAL : FJ_TILE_FULL;
      return j;
    }
  }
  return -1;
}

// The tile after j: the block mask's next (bm_row >= 0, *t its position),
// else the classifier's next non-EMPTY block below j.
__device__ __forceinline__ int fjk_advance(const fj_fwd_params &p, int bm_row,
                                           int b, int h, int q0, int q1, int j,
                                           int lo, int *t, int *cls) {
  if (bm_row >= 0) {
    ++*t;
    return fjk_bm_tile(p, bm_row, t, cls);
  }
  return fj_next_block(p, b, h, q0, q1, j, lo, cls);
}

// Per-lane ldmatrix addressing. Every ldmatrix group starts at a multiple
// of 8 rows, so the swizzle term of a lane is (lane & 7) throughout:
// physical chunk = logical chunk ^ (lane & 7). Logical chunks are 2*k + c
// with c in {0, 1} fixed per lane, so chunk ^ (lane & 7) = 2*k ^ x_lane.
// Q (A operand): matrices (rows 0-7, k lo), (rows 8-15, k lo), (0-7, hi), (8-15, hi).
// K (B operand of Q.K^T): (n 0-7, k lo), (n 0-7, k hi), (n 8-15, lo), (8-15, hi).
// V (B operand of P.V, transposed): (kv 0-7, d lo), (kv 8-15, d lo), (0-7, hi), (8-15, hi).
#define FJK_LANE_ADDRESSING(lane_)                                                      \
  const int x_q = ((lane_) >> 4) ^ ((lane_) & 7);                                      \
  const unsigned q_row =                                                                \
      (warp * FJK_WARP_ROWS + (((lane_) >> 3) & 1) * 8 + ((lane_) & 7)) * FJK_ROW_BYTES; \
  const int x_k = (((lane_) >> 3) & 1) ^ ((lane_) & 7);                                \
  const unsigned k_row = ((((lane_) >> 4) * 8) + ((lane_) & 7)) * FJK_ROW_BYTES;         \
  const int x_v = x_q;                                                                  \
  const unsigned v_row = ((((lane_) >> 3) & 1) * 8 + ((lane_) & 7)) * FJK_ROW_BYTES;    \
  (void)x_q, (void)q_row, (void)x_k, (void)k_row, (void)x_v, (void)v_row;

// One online-softmax step of a warp over FJK_SUB_N kv columns starting at
// kv0, K and V rows at sk / sv in shared memory: S = Q K^T, score_mod, mask,
// running max and sum, O += P V.
__device__ __forceinline__ void fjk_tile_step(
    const fj_fwd_params &p, int b, int h, int wq0, int kv0, bool need_mask,
    bool ragged, unsigned sk, unsigned sv, unsigned s_q, float exp_scale,
#if FJK_Q_IN_REGISTERS
    const unsigned (&qf)[FJK_MT][FJK_KT][4],
#endif
    float (&acc)[FJK_MT][FJK_DT][4], float (&row_m)[FJK_MT][2],
    float (&row_l)[FJK_MT][2]) {
  const int lt = fj_tid();
  const int warp = lt >> 5, lane = lt & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int Lk = p.sz.Lk;
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
#pragma unroll
  for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < FJK_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = wq0 + mt * 16 + g + (e >> 1) * 8;
        const int ki = kv0 + nt * 8 + 2 * t4 + (e & 1);
        s[mt][nt][e] =
            fj_score_mod(p.user, p.sz, s[mt][nt][e] * p.scale, b, h, qi, ki) * FJK_LOG2E;
      }
#endif
  // The mask is evaluated on every element, past Lk too (fj_mask is total;
  // such results are dropped), without a branch per element: its buffer
  // reads then depend only on the row or the column, and the compiler loads
  // each once per sub-tile instead of once per element.
#if FJ_HAS_MASK
  if (need_mask) {
#pragma unroll
    for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < FJK_NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ki = kv0 + nt * 8 + 2 * t4 + (e & 1);
          const int qi = wq0 + mt * 16 + g + (e >> 1) * 8;
          const bool keep = (ki < Lk) & fj_mask(p.user, p.sz, b, h, qi, ki);
          s[mt][nt][e] = keep ? s[mt][nt][e] : fj_neg_inf();
        }
  } else
#endif
  if (ragged) {
#pragma unroll
    for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < FJK_NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ki = kv0 + nt * 8 + 2 * t4 + (e & 1);
          if (ki >= Lk) s[mt][nt][e] = fj_neg_inf();
        }
  }

  // ---- online softmax: rows g and g + 8 of each m16 tile ----
  float alpha[FJK_MT][2], shift[FJK_MT][2];
  bool grow_any = false;
#pragma unroll
  for (int mt = 0; mt < FJK_MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = fj_neg_inf();
#pragma unroll
      for (int nt = 0; nt < FJK_NT; ++nt)
        mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hh], s[mt][nt][2 * hh + 1]));
      // The four lanes of a quad hold the row between them.
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_old = row_m[mt][hh];
      const float m_tile = mx * exp_scale;
      // Raise the shift only when the max outgrows it by the threshold
      // (always when it was -inf and is no longer). -inf - -inf never occurs.
      const bool grow = m_tile > m_old + FJK_RESCALE_THRESHOLD;
      alpha[mt][hh] = grow ? fj_exp2(m_old - m_tile) : 1.0f;
      const float m_use = grow ? m_tile : m_old;
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

extern "C" __global__ void __launch_bounds__(FJK_THREADS, 1)
fj_attention_fwd(const __grid_constant__ fj_fwd_params p) {
  extern __shared__ __align__(128) unsigned char fjk_smem[];

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;  // mma fragment row group, column pair
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int Lq = p.sz.Lq, Lk = p.sz.Lk;
  const int q0 = m_block * FJ_BLOCK_M;
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
    fj_tile_range(p, b, h, q0, q1, &lo, &hi, &hi_cls);
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
    const fj_u16 *gq = (const fj_u16 *)p.q + b * p.q_sb + h * p.q_sh + q0 * p.q_ss;
    const int hk = h / p.kv_group;
    const fj_u16 *gk = (const fj_u16 *)p.k + b * p.k_sb + hk * p.k_sh;
    const fj_u16 *gv = (const fj_u16 *)p.v + b * p.v_sb + hk * p.v_sh;

    // cp.async groups, in commit order: Q, then one group per kv tile (K and V
    // together). Empty groups keep the count uniform so that wait_group can
    // take a constant.
    fjk_load_tile<FJ_BLOCK_M>(s_q, gq, p.q_ss, Lq - q0);
    fjk_cp_async_commit();

    int ji = hi, ji_cls = hi_cls;  // next tile to issue
#pragma unroll
    for (int st = 0; st < FJ_NUM_STAGES - 1; ++st) {
      if (ji >= lo) {
        const int kv0 = ji * FJ_BLOCK_N;
        fjk_load_tile<FJ_BLOCK_N>(s_k + st * FJK_TILE_BYTES, gk + kv0 * p.k_ss,
                                  p.k_ss, Lk - kv0);
        fjk_load_tile<FJ_BLOCK_N>(s_v + st * FJK_TILE_BYTES, gv + kv0 * p.v_ss,
                                  p.v_ss, Lk - kv0);
        ji = fjk_advance(p, bm_row, b, h, q0, q1, ji, lo, &ti, &ji_cls);
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
        const int kv0 = ji * FJ_BLOCK_N;
        fjk_load_tile<FJ_BLOCK_N>(s_k + stage_i * FJK_TILE_BYTES, gk + kv0 * p.k_ss,
                                  p.k_ss, Lk - kv0);
        fjk_load_tile<FJ_BLOCK_N>(s_v + stage_i * FJK_TILE_BYTES, gv + kv0 * p.v_ss,
                                  p.v_ss, Lk - kv0);
#if FJ_NUM_STAGES == 2
        jn = ji;
        jn_cls = ji_cls;
#endif
        ji = fjk_advance(p, bm_row, b, h, q0, q1, ji, lo, &ti, &ji_cls);
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
          const int wc = fj_tile_class(p.user, p.sz, b, h, wq0, wq1, skv0,
                                       min(skv0 + FJK_SUB_N, Lk) - 1);
          run = wc != FJ_TILE_EMPTY;
          need_mask = wc == FJ_TILE_PARTIAL;
        }
#endif
        if (run)
          fjk_tile_step(p, b, h, wq0, skv0, need_mask, skv0 + FJK_SUB_N > Lk,
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
        jc = fjk_advance(p, bm_row, b, h, q0, q1, jc, lo, &tc, &jc_cls);
      }
#else
      jc = fjk_advance(p, bm_row, b, h, q0, q1, jc, lo, &tc, &jc_cls);
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
    fj_u16 *go = (fj_u16 *)p.o + b * p.o_sb + h * p.o_sh;
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
    float *gl = p.lse + b * p.lse_sb + h * p.lse_sh;
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
