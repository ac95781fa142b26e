// templates/sm90/tile_walk.cuh: a work item and the walk over its kv tiles,
// which the producer and every consumer compute alike (each role advances on
// its own, once per tile): a block mask's row, copied into shared memory,
// or the interval classifier (common/tile_walk.cuh), and how a consumer
// treats a tile (evaluate the mask or not).
#pragma once

// A work item: query rows [q0, q1] of head h, batch b, the k-th item of
// its CTA, and its kv tiles, walked from hi (class hi_cls) down: without a
// block mask the non-EMPTY blocks of [lo, hi]; with one (p.bm_kv_num !=
// nullptr) the mask row's PARTIAL blocks, then its FULL blocks, each a run
// of bm_kv_ratio tiles, at positions t = 0, 1, ... of that sequence, from
// the row's copy in shared memory (fjh_bm_cache(k)). The block-mask walk
// ends with -1 and lo is 0 then, so every `j >= lo` test serves both walks.
// Lq and Lk are sequence b's (fj_seq_of: p.sz's unless serving layouts are
// in use).
struct fjh_item {
  int b, h, q0, q1;
  int lo, hi, hi_cls, t;
  int k;
  int Lq, Lk;
};

// The sizes the hooks (fj_mask, fj_score_mod, fj_tile_class) see for an
// item: p.sz with its sequence's Lq and Lk.
__device__ __forceinline__ fj_sizes fjh_sz(const fj_fwd_params &p, const fjh_item &it) {
  fj_sizes sz = p.sz;
  sz.Lq = it.Lq;
  sz.Lk = it.Lk;
  return sz;
}

// Sequence b's first row in packed q, o and lse (0 unless packed), read
// again where the epilogue needs it rather than kept in a register across
// the kv loop.
__device__ __forceinline__ int fjh_q_row0(const fj_fwd_params &p, int b) {
  return fj_cu_seqlens_q(p) != nullptr ? __ldg(p.cu_seqlens_q + b) : 0;
}

// The first row of query tile m of a sequence of Lq rows. Where Lq is not a
// whole number of tiles, tiles 1, 2, ... move toward row 0 by as many whole
// kv tiles as the last one's rows past Lq allow, and tile 0 starts at row 0,
// overlapping tile 1, whose rows it computes but does not store
// (fjh_tile_q_end). So under a causal mask the part-used tile is the one
// with the fewest kv tiles (at D=64, 192-row tiles and 4096 rows: 364 kv
// steps a head against 384 with the part-used tile last), and without a
// mask it costs the same. Whole kv tiles, so that a query tile crosses as
// many kv tiles on the diagonal as unmoved (a 128-row tile moved by 96 rows
// would cross two, each a masked tile). Every row stays at 0 or above. A block mask's blocks are whole tiles from row 0, and so
// are a packed sequence's tiles.
__device__ __forceinline__ int fjh_tile_q0(const fj_fwd_params &p, int m, int Lq) {
  const bool from_end = p.bm_kv_num == nullptr && fj_cu_seqlens_q(p) == nullptr;
  const int spare = (FJ_BLOCK_M - Lq % FJ_BLOCK_M) % FJ_BLOCK_M;
  const int shift = from_end ? spare / FJ_BLOCK_N * FJ_BLOCK_N : 0;
  return m == 0 ? 0 : m * FJ_BLOCK_M - shift;
}

// The end of the rows item it stores: Lq, or for tile 0 where it overlaps
// tile 1 (fjh_tile_q0) tile 1's first row.
__device__ __forceinline__ int fjh_tile_q_end(const fj_fwd_params &p, const fjh_item &it) {
  return it.q0 == 0 ? min(it.Lq, fjh_tile_q0(p, 1, it.Lq)) : it.Lq;
}

// Its first row in packed k and v (0 unless packed), read where a K or V
// load needs it: in the item it would take a register that the persistent
// kernel's producer warp does not have.
__device__ __forceinline__ int fjh_k_row0(const fj_fwd_params &p, int b) {
  return fj_cu_seqlens_k(p) != nullptr ? __ldg(p.cu_seqlens_k + b) : 0;
}

// Whether K/V rows at or past a sequence's kv length may lie inside the
// tensor maps (seqlens_k, packed or paged KV), where they may hold anything:
// the consumers then zero the V rows past Lk of the tile that reaches past
// it (fjh_v_tail). Without serving layouts the maps end at Lk and TMA
// fills such rows with zeros.
__device__ __forceinline__ bool fjh_kv_ragged(const fj_fwd_params &p) {
  return fj_seqlens_k(p) != nullptr || fj_cu_seqlens_k(p) != nullptr ||
         fj_block_table(p) != nullptr;
}

// Index of the row of query block q0 / FJ_BLOCK_M in the block mask's
// count arrays.
__device__ __forceinline__ int fjh_bm_row(const fj_fwd_params &p, int b, int h, int q0) {
  return b * p.bm_b_stride + h * p.bm_h_stride + (q0 / FJ_BLOCK_M) / p.bm_q_ratio;
}

// An item's row of the block mask in shared memory: its PARTIAL blocks,
// then its FULL ones, so that the producer and the consumers step from tile
// to tile without a chain of dependent global loads between them. Rows
// longer than FJH_BM_CACHE blocks are read from global memory instead.
struct fjh_bm_row_cache {
  int np, n;  // PARTIAL blocks; PARTIAL + FULL blocks
  int blk[FJH_BM_CACHE];
};
// The copy of the CTA's k-th item, in static shared memory: the CTA keeps
// one for each item it holds at a time (the persistent kernel's ring has
// two).
enum { FJH_BM_ROWS = FJ_PERSISTENT ? 2 : 1 };
__device__ __forceinline__ fjh_bm_row_cache &fjh_bm_cache(int k) {
  __shared__ fjh_bm_row_cache c[FJH_BM_ROWS];
  return c[FJH_BM_ROWS == 1 ? 0 : k & 1];
}

// Threads i = first, first + stride, ... of the caller copy the block-mask
// row of query block q0 into c (the caller then synchronizes them).
__device__ __forceinline__ void fjh_bm_fill(const fj_fwd_params &p, int b, int h, int q0,
                                            fjh_bm_row_cache &c, int first, int stride) {
  const int row = fjh_bm_row(p, b, h, q0);
  const int np = __ldg(p.bm_kv_num + row);
  const int n = np + __ldg(p.bm_full_num + row);
  const long long base = (long long)row * p.bm_nkv;
  // Entry i of both lists is loaded before the counts are known (the lists
  // are nkv long, read past their counts too): one round trip to global
  // memory before the CTA's first K load instead of two.
  const int m = min(p.bm_nkv, FJH_BM_CACHE);
  for (int i = first; i < m; i += stride) {
    const int a = __ldg(p.bm_kv_idx + base + i);
    const int f = __ldg(p.bm_full_idx + base + i);
    // Past FJH_BM_CACHE blocks the walk reads global memory instead.
    if (i < np) c.blk[i] = a;
    if (i < n - np && np + i < FJH_BM_CACHE) c.blk[np + i] = f;
  }
  if (first == 0) {
    c.np = np;
    c.n = n;
  }
}

// The tile at position *t, or the first after it that starts below Lk (the
// tail of a row's last block may not); *t moves to it and *cls receives its
// class. -1 past the end of the row's lists (at once for an empty row).
__device__ __forceinline__ int fjh_bm_tile(const fj_fwd_params &p, const fjh_item &it,
                                           int *t, int *cls) {
  const fjh_bm_row_cache &c = fjh_bm_cache(it.k);
  const int cnp = c.np, cn = c.n;
  const bool cached = cn <= FJH_BM_CACHE;
  const int *cblk = c.blk;
  const int r = p.bm_kv_ratio;
  const int np = cnp * r;
  const int n = cn * r;
  for (; *t < n; ++*t) {
    const bool partial = *t < np;
    // r is 1 unless the mask's blocks are wider than a tile: no division
    // by a runtime value on every tile then.
    const int k = r == 1 ? *t : *t / r;
    int blk;
    if (cached) {
      blk = cblk[k];
    } else {
      const long long base = (long long)fjh_bm_row(p, it.b, it.h, it.q0) * p.bm_nkv;
      blk = partial ? __ldg(p.bm_kv_idx + base + k)
                    : __ldg(p.bm_full_idx + base + k - cnp);
    }
    const int j = r == 1 ? blk : blk * r + *t % r;
    if (j * FJ_BLOCK_N < p.sz.Lk) {
      *cls = partial ? FJ_TILE_PARTIAL : FJ_TILE_FULL;
      return j;
    }
  }
  return -1;
}

// The tile after j (at position *t with a block mask): the block mask's
// next, else the classifier's next non-EMPTY block below j. Every role
// advances only through here, once per tile.
__device__ __forceinline__ int fjh_advance(const fj_fwd_params &p, const fjh_item &it, int j,
                                           int *t, int *cls) {
  if (p.bm_kv_num != nullptr) {
    ++*t;
    return fjh_bm_tile(p, it, t, cls);
  }
  return fj_next_block(p, fjh_sz(p, it), it.b, it.h, it.q0, it.q1, j, it.lo, cls);
}

// What a consumer does to the scores of a tile: 0 nothing (FULL for its
// rows), 1 evaluate the mask. There is no "mask everything" mode: ptxas
// turned its per-element s = -inf into moves and selects paid on every
// tile; a tile EMPTY for the warpgroup's rows evaluates the mask instead
// (all false: the same result), and rows past Lq, which are never stored,
// are computed as if FULL.
enum { FJH_TILE_KEEP = 0, FJH_TILE_MASK = 1 };

// The mode of the tile at kv0 (class cls for the CTA's rows) for the 64
// rows from wq0 of item it.
__device__ __forceinline__ int fjh_tile_mode(const fj_fwd_params &p, const fjh_item &it,
                                             int wq0, int kv0, int cls) {
  if (wq0 >= it.Lq) return FJH_TILE_KEEP;  // never stored
#if FJ_HAS_MASK
  if (cls == FJ_TILE_PARTIAL) {
    const int wq1 = min(wq0 + FJH_WG_ROWS, it.Lq) - 1;
    const int wc = fj_tile_class(p.user, fjh_sz(p, it), it.b, it.h, wq0, wq1, kv0,
                                 min(kv0 + FJ_BLOCK_N, it.Lk) - 1);
    return wc == FJ_TILE_FULL ? FJH_TILE_KEEP : FJH_TILE_MASK;
  }
#endif
  (void)p; (void)kv0; (void)cls;
  return FJH_TILE_KEEP;
}
