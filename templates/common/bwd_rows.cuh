// templates/common/bwd_rows.cuh: the backward's two row kernels, around the
// main one (docs/backward.md); no tensor cores, so every backward template
// shares them. Needs fj_bwd_params (common/fj_bwd.cuh), common/ptx.cuh and,
// when FJB_DQ_FIRST_STORE, common/bwd_order.cuh.
//   fj_attention_bwd_pre:  delta = dO . O - dLSE per query row (0 where
//                          LSE = -inf), and zeroes its rows' dq_accum,
//                          padding included (FJB_DQ_FIRST_STORE: not
//                          dq_accum, whose first addition to a query tile
//                          is a store, but the semaphores of the query
//                          tiles that start in its rows: common/bwd_order.cuh;
//                          FJ_PERSISTENT, the main kernel's tile counter,
//                          its conversion counters and its split tiles'
//                          dkv_accum too)
//   fj_attention_bwd_post: dq = dq_accum in the element type (row-major
//                          or tiled: common/fj_bwd.cuh; FJB_DQ_FIRST_STORE,
//                          0 for a query tile that no kv tile added to,
//                          its semaphore still 0); FJ_PERSISTENT, the
//                          split tiles' dk and dv from dkv_accum. Not
//                          launched where the persistent kernel converts
//                          dq itself (FJB_DQ_IN_MAIN, a launch that splits
//                          no tile: runtime/backward.c)
// Launch: grid (ceil(Lq / FJB_ROW_BLOCK), Hq, B) (Lq: max_seqlen_q for a
// packed batch, whose shorter sequences' CTAs past their rows return at
// once), FJB_ROW_THREADS threads,
// no dynamic shared memory (gen/config.h's FJG_BWD_ROW_BLOCK and
// FJG_BWD_ROW_THREADS name the same numbers for the host).
// A row of D elements is read by FJB_ROW_LANES lanes, 16 bytes each (o,
// dout and dq 16-byte aligned, strides multiples of 8 elements: the host
// checks, as for the forward's o); dq_accum rows are 16-byte aligned (D * 4
// bytes a row from a 16-byte aligned base).
#pragma once
// Read by a configuration that chooses dq_accum's form (FJB_DQ_TILED, and
// FJB_DQ_FIRST_STORE), to check that it comes first.
#define FJB_ROW_KERNELS 1
// FJB_DQ_FIRST_STORE: the main kernel stores a query tile's first dQ
// addition (common/bwd_order.cuh), so dq_accum is not zeroed here: the sm90
// kernels (sm90/bwd_config.cuh), and the deterministic mode.
#ifndef FJB_DQ_FIRST_STORE
#define FJB_DQ_FIRST_STORE FJ_DETERMINISTIC
#endif
// FJB_DQ_IN_MAIN: the main kernel converts dq_accum into dq itself, where
// it splits no tile (sm90/bwd.cuh; the host launches the post kernel only
// where it does); the pre kernel zeroes its counters (common/bwd_order.cuh).
#ifndef FJB_DQ_IN_MAIN
#define FJB_DQ_IN_MAIN 0
#endif

constexpr int FJB_ROW_BLOCK = FJB_SEQ_PAD;  // query rows of a CTA
constexpr int FJB_ROW_THREADS = 128;  // threads of a CTA
constexpr int FJB_ROW_LANES = FJ_HEAD_DIM / 8;                 // lanes a row
constexpr int FJB_ROW_PASS = FJB_ROW_THREADS / FJB_ROW_LANES;  // rows a pass
static_assert(FJB_ROW_BLOCK % FJB_ROW_PASS == 0, "row kernels: whole passes");
static_assert(FJB_ROW_LANES <= 32 && (FJB_ROW_LANES & (FJB_ROW_LANES - 1)) == 0,
              "row kernels: a row's lanes are a power-of-two part of a warp");

__device__ __forceinline__ void fjb_ld_global_v4(unsigned (&r)[4], const void *src) {
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %4;\n"
      " ld.global.nc.v4.b32 {%0, %1, %2, %3}, [g];\n}\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(src));
}

// The same through L2 only (no non-coherent cache): for data written
// during the kernel that reads it.
__device__ __forceinline__ void fjb_ld_global_cg_v4(unsigned (&r)[4], const void *src) {
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %4;\n"
      " ld.global.cg.v4.b32 {%0, %1, %2, %3}, [g];\n}\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(src) : "memory");
}

// The pair of elements packed in v as floats, `lo` from the lower address.
__device__ __forceinline__ void fjb_unpack2(unsigned v, float &lo, float &hi) {
#if defined(FJ_DTYPE_BF16)
  lo = __uint_as_float(v << 16);
  hi = __uint_as_float(v & 0xffff0000u);
#else
  asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n"
      " cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}\n"
      : "=f"(lo), "=f"(hi) : "r"(v));
#endif
}

// The CTA's index in its grid, x fastest.
__device__ __forceinline__ int fjb_row_cta() {
  return (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}

// Lane c of a row's FJB_ROW_LANES reads elements [8 c, 8 c + 8) of O and dO;
// the row's lanes are aligned within the warp, so the xor shuffles below
// stay among them.
extern "C" __global__ void __launch_bounds__(FJB_ROW_THREADS)
fj_attention_bwd_pre(const __grid_constant__ fj_bwd_params p) {
  const int tid = threadIdx.x;
  const int c = tid % FJB_ROW_LANES, r = tid / FJB_ROW_LANES;
  const int h = blockIdx.y, b = blockIdx.z;
  // The sequence's rows (fjb_seq_of: p.sz unless packed); a row block past
  // a shorter sequence's end has nothing to do (without FJ_VARLEN the grid
  // holds none).
  const fjb_seq sq = fjb_seq_of(p, b);
  const int Lq = sq.sz.Lq;
  const int q0 = blockIdx.x * FJB_ROW_BLOCK;
#if FJ_VARLEN
  if (q0 >= Lq) return;
#endif
  const fj_u16 *go = (const fj_u16 *)p.o + b * p.o_sb + h * p.o_sh +
                     (long long)sq.q_row0 * p.o_ss + c * 8;
  const fj_u16 *gd = (const fj_u16 *)p.dout + b * p.do_sb + h * p.do_sh +
                     (long long)sq.q_row0 * p.do_ss + c * 8;
  // This head's row 0 in delta and dq_accum.
  const long long row0 = fjb_acc_row(p, sq, h);
#pragma unroll
  for (int i = 0; i < FJB_ROW_BLOCK / FJB_ROW_PASS; ++i) {
    const int q = q0 + i * FJB_ROW_PASS + r;
    float dot = 0.f;
    if (q < Lq) {
      unsigned ov[4], dv[4];
      fjb_ld_global_v4(ov, go + q * p.o_ss);
      fjb_ld_global_v4(dv, gd + q * p.do_ss);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float o0, o1, d0, d1;
        fjb_unpack2(ov[e], o0, o1);
        fjb_unpack2(dv[e], d0, d1);
        dot = fmaf(o0, d0, dot);
        dot = fmaf(o1, d1, dot);
      }
    }
#pragma unroll
    for (int off = FJB_ROW_LANES / 2; off > 0; off >>= 1)
      dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (c == 0 && q < Lq) {
      const int qr = sq.q_row0 + q;
      const float L = p.lse[b * p.lse_sb + h * p.lse_sh + qr];
      const float dl = p.dlse != nullptr ? p.dlse[b * p.dlse_sb + h * p.dlse_sh + qr] : 0.f;
      p.delta[row0 + q] = L == fj_neg_inf() ? 0.f : dot - dl;
    }
  }
#if FJB_DQ_FIRST_STORE
  fjb_order_zero(p, Lq, b, h, q0, FJB_ROW_BLOCK, tid, FJB_ROW_THREADS);
#else
  // The CTA's rows of dq_accum, padding included, are contiguous (a block
  // of the tiled form): zero them 16 bytes a thread.
  float *acc = p.dq_accum + (row0 + q0) * FJ_HEAD_DIM;
  for (int k = tid; k < FJB_ROW_BLOCK * (FJ_HEAD_DIM / 4); k += FJB_ROW_THREADS)
    fj_st_global_v4(acc + 4 * k, 0u, 0u, 0u, 0u);
#endif
#if FJ_PERSISTENT
  if ((blockIdx.x | blockIdx.y | blockIdx.z | tid) == 0) *fjb_tile_counter(p) = 0;
#if FJB_DQ_IN_MAIN
  if ((blockIdx.x | blockIdx.y | blockIdx.z | tid) == 0) *fjb_convert_counter(p) = 0;
  if ((blockIdx.x | tid) == 0 && h < p.sz.Hkv) *fjb_kv_head_done(p, b * p.sz.Hkv + h) = 0;
#endif
  // The split tiles' dkv_accum blocks, 16 bytes a thread over the grid.
  const int n4 = FJB_PIECES ? p.tail_tiles * (4 * 64 * FJ_HEAD_DIM / 4) : 0;
  for (int k = fjb_row_cta() * FJB_ROW_THREADS + tid; k < n4;
       k += gridDim.x * gridDim.y * gridDim.z * FJB_ROW_THREADS)
    fj_st_global_v4(p.dkv_accum + 4 * k, 0u, 0u, 0u, 0u);
#endif
}

#if FJ_PERSISTENT && FJB_PIECES
// The persistent kernel's split tiles (p.tail_tiles, the last of its order:
// common/fj_bwd.cuh) to dk and dv from their dkv_accum blocks, spread over
// the post kernel's grid: a thread takes rows r and r + 8 of 8 columns of a
// block, as for the tiled dq_accum below (a block is a tile FJ_HEAD_DIM
// wide), and stores the rows below Lk.
__device__ __forceinline__ void fjb_post_tail(const fj_bwd_params &p, int tid) {
  constexpr int CHUNKS = FJ_HEAD_DIM / 8;  // 8-column chunks a row
  constexpr int PER_BLOCK = 32 * CHUNKS;   // a 64-row block's row pairs x chunks
  const int nkv = (p.sz.Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N;
  const int heads = p.sz.Hkv * p.sz.B;
  const int n = p.tail_tiles * 4 * PER_BLOCK;
  for (int i = fjb_row_cta() * FJB_ROW_THREADS + tid; i < n;
       i += gridDim.x * gridDim.y * gridDim.z * FJB_ROW_THREADS) {
    // Block (tail tile, dK or dV, consumer), and its row pair and chunk.
    const int blk = i / PER_BLOCK, e = i % PER_BLOCK;
    const int x = (blk >> 1) & 1, c = blk & 1;
    int hb;
    const int kt = fjb_tile_order(p.tail_first + (blk >> 2), nkv, heads, p.kv_head_group, &hb);
    const int hk = hb % p.sz.Hkv, b = hb / p.sz.Hkv;
    const int ch = e % CHUNKS, pr = e / CHUNKS;
    const int r = 16 * (pr / 8) + pr % 8, col = 8 * ch;
    const float *t =
        p.dkv_accum + (long long)blk * (64 * FJ_HEAD_DIM) + 4 * fjb_dq_tiled_f4(r, col);
    unsigned v[4][4];
#pragma unroll
    for (int f = 0; f < 4; ++f) fjb_ld_global_v4(v[f], t + 4 * f);
    fj_u16 *g = x ? (fj_u16 *)p.dv + b * p.dv_sb + hk * p.dv_sh
                  : (fj_u16 *)p.dk + b * p.dk_sb + hk * p.dk_sh;
    const long long ss = x ? p.dv_ss : p.dk_ss;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int kr = kt * FJ_BLOCK_N + 64 * c + r + 8 * hh;
      if (kr < p.sz.Lk)
        fj_st_global_v4(g + kr * ss + col,
                        fj_pack2(__uint_as_float(v[0][2 * hh]), __uint_as_float(v[0][2 * hh + 1])),
                        fj_pack2(__uint_as_float(v[1][2 * hh]), __uint_as_float(v[1][2 * hh + 1])),
                        fj_pack2(__uint_as_float(v[2][2 * hh]), __uint_as_float(v[2][2 * hh + 1])),
                        fj_pack2(__uint_as_float(v[3][2 * hh]), __uint_as_float(v[3][2 * hh + 1])));
    }
  }
}
#endif

// Whether query row q of head h, batch b, has dQ in dq_accum: always, but
// where dq_accum is not zeroed (FJB_DQ_FIRST_STORE) only when a kv tile
// added to its query tile (the tile's semaphore is not 0; a tile of rows
// that allow nothing has none, and its dq is 0). COHERENT: read where the
// semaphores are still being written (the main kernel's conversion, below).
template <bool COHERENT = false>
__device__ __forceinline__ bool fjb_row_added(const fj_bwd_params &p, int b, int h, int q) {
#if FJB_DQ_FIRST_STORE
  const int *sem = fjb_order_sem(p, b, h, q / FJ_BLOCK_M);
  if constexpr (COHERENT) {
    int v;
    asm volatile(
        "{\n .reg .u64 g;\n cvta.to.global.u64 g, %1;\n"
        " ld.relaxed.gpu.global.b32 %0, [g];\n}\n"
        : "=r"(v) : "l"(sem) : "memory");
    return v != 0;
  } else {
    return __ldg(sem) != 0;
  }
#else
  (void)p, (void)b, (void)h, (void)q;
  return true;
#endif
}

#if FJB_DQ_TILED
// dq = dq_accum for the FJB_ROW_BLOCK rows of head h, batch b, from q0
// (a block of the tiled form, within one query tile; sq: batch b's
// sequence, fjb_seq_of), by thread tid of
// THREADS: a thread takes rows r and r + 8 of 8 columns, four float4s of
// one 64-byte run, then stores two 16-byte row pieces. COHERENT: dq_accum
// and the semaphores were written in this kernel (the main kernel's
// conversion, which has acquired them), so the loads bypass the
// non-coherent caches.
template <bool COHERENT, int THREADS>
__device__ __forceinline__ void fjb_dq_convert_block(const fj_bwd_params &p, const fjb_seq &sq,
                                                     int b, int h, int q0, int tid) {
  static_assert(FJ_BLOCK_M % FJB_ROW_BLOCK == 0, "backward: a block within one query tile");
  const bool added = fjb_row_added<COHERENT>(p, b, h, q0);
  const int Lq = sq.sz.Lq;
  const float *acc = p.dq_accum + (fjb_acc_row(p, sq, h) + q0) * FJ_HEAD_DIM;
  fj_u16 *gq = (fj_u16 *)p.dq + b * p.dq_sb + h * p.dq_sh +
               (long long)(sq.q_row0 + q0) * p.dq_ss;
  constexpr int CHUNKS = FJ_HEAD_DIM / 8;  // 8-column chunks a row
  // The main kernel's one warp keeps a pass's loads in its few registers.
#pragma unroll(THREADS < FJB_ROW_THREADS ? 1 : 32 * CHUNKS / THREADS)
  for (int i = tid; i < 32 * CHUNKS; i += THREADS) {
    const int ch = i % CHUNKS, pr = i / CHUNKS;
    const int r = 16 * (pr / 8) + pr % 8, col = 8 * ch;
    const float *t = acc + (col / FJB_DQ_TILE_COLS) * (FJB_SEQ_PAD * FJB_DQ_TILE_COLS) +
                     4 * fjb_dq_tiled_f4(r, col % FJB_DQ_TILE_COLS);
    unsigned v[4][4] = {};
    if (added)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (COHERENT)
          fjb_ld_global_cg_v4(v[e], t + 4 * e);
        else
          fjb_ld_global_v4(v[e], t + 4 * e);
      }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      if (q0 + r + 8 * hh < Lq)
        fj_st_global_v4(gq + (r + 8 * hh) * p.dq_ss + col,
                        fj_pack2(__uint_as_float(v[0][2 * hh]), __uint_as_float(v[0][2 * hh + 1])),
                        fj_pack2(__uint_as_float(v[1][2 * hh]), __uint_as_float(v[1][2 * hh + 1])),
                        fj_pack2(__uint_as_float(v[2][2 * hh]), __uint_as_float(v[2][2 * hh + 1])),
                        fj_pack2(__uint_as_float(v[3][2 * hh]), __uint_as_float(v[3][2 * hh + 1])));
  }
}
#endif

extern "C" __global__ void __launch_bounds__(FJB_ROW_THREADS)
fj_attention_bwd_post(const __grid_constant__ fj_bwd_params p) {
  const int tid = threadIdx.x;
#if FJ_PERSISTENT && FJB_PIECES
  fjb_post_tail(p, tid);
#endif
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = blockIdx.x * FJB_ROW_BLOCK;
  const fjb_seq sq = fjb_seq_of(p, b);
#if FJ_VARLEN
  if (q0 >= sq.sz.Lq) return;
#endif
#if FJB_DQ_TILED
  fjb_dq_convert_block<false, FJB_ROW_THREADS>(p, sq, b, h, q0, tid);
#else
  const int Lq = sq.sz.Lq;
  const float *acc = p.dq_accum + (fjb_acc_row(p, sq, h) + q0) * FJ_HEAD_DIM;
  fj_u16 *gq = (fj_u16 *)p.dq + b * p.dq_sb + h * p.dq_sh +
               (long long)(sq.q_row0 + q0) * p.dq_ss;
  const int c = tid % FJB_ROW_LANES, r = tid / FJB_ROW_LANES;
#pragma unroll
  for (int i = 0; i < FJB_ROW_BLOCK / FJB_ROW_PASS; ++i) {
    const int q = i * FJB_ROW_PASS + r;
    if (q0 + q < Lq) {
      unsigned lo[4] = {}, hi[4] = {};
      if (fjb_row_added(p, b, h, q0 + q)) {
        fjb_ld_global_v4(lo, acc + (long long)q * FJ_HEAD_DIM + c * 8);
        fjb_ld_global_v4(hi, acc + (long long)q * FJ_HEAD_DIM + c * 8 + 4);
      }
      fj_st_global_v4(gq + q * p.dq_ss + c * 8,
                      fj_pack2(__uint_as_float(lo[0]), __uint_as_float(lo[1])),
                      fj_pack2(__uint_as_float(lo[2]), __uint_as_float(lo[3])),
                      fj_pack2(__uint_as_float(hi[0]), __uint_as_float(hi[1])),
                      fj_pack2(__uint_as_float(hi[2]), __uint_as_float(hi[3])));
    }
  }
#endif
}
