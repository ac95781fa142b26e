// templates/common/bwd_walk.cuh: the backward CTA's walk over its work
// items. A CTA owns kv tile n_block (rows [kv0, kv1]) of one kv head and
// batch; its items are the (query head, query tile) pairs that are not
// EMPTY: for each query head h of the kv head's group in turn, its query
// tiles of FJ_BLOCK_M rows in ascending order, from the block mask's
// transposed lists (its PARTIAL blocks, then its FULL blocks) or, without
// one, from fj_tile_class. The roles of a CTA see the same items in the
// same order: each warp that walks computes them for itself (the sm90
// consumers take theirs from producer warp 1's walk instead:
// sm90/bwd_config.cuh, fjhb_put_item). `z` is the
// sequence's sizes (fjb_seq_of: p.sz, or its own Lq and Lk in a packed
// batch), which bound its tiles and which fj_tile_class sees. Needs
// fj_bwd_params, fj_tile_class (when FJ_HAS_MASK), FJ_BLOCK_M and
// FJ_BLOCK_N. Before the walk, the pieces a persistent kernel takes a
// split tile in (fjb_piece); at the end, the order in which its CTAs take
// their kv tiles (fjb_tile_order).
#pragma once

struct fjb_item {
  int h;    // query head; the group's end when there is no item left
  int t;    // position in head h's walk: the list position (block mask)
            // or the query tile (classifier)
  int i;    // query tile: rows [i * FJ_BLOCK_M, ...)
  int cls;  // FJ_TILE_FULL or FJ_TILE_PARTIAL, bounds apart
};

// The last kv row of kv tile n (its first is n * FJ_BLOCK_N).
__device__ __forceinline__ int fjb_kv_last(const fj_sizes &z, int n) {
  return min(n * FJ_BLOCK_N + FJ_BLOCK_N, z.Lk) - 1;
}

// Whether a part of a work item, query rows [q0, q0 + rows) against kv rows
// [kv0, kv0 + cols), reaches past Lq or Lk (its elements there are masked).
__device__ __forceinline__ bool fjb_edge(const fj_sizes &z, int q0, int rows, int kv0,
                                         int cols) {
  return q0 + rows > z.Lq || kv0 + cols > z.Lk;
}

// How such a part of head h's item (class cls) is computed: a warp's in the
// sm80 kernels, a consumer warpgroup's in the sm90 ones; q0 < Lq (a part
// wholly past Lq is the caller's to skip). As bits: FJB_RUN, the part holds
// an allowed pair (a PARTIAL item is reclassified on the part; a part
// wholly past Lk holds none); FJB_NEED_MASK, fj_mask is evaluated per
// element; FJB_EDGE, fjb_edge.
enum { FJB_RUN = 1, FJB_NEED_MASK = 2, FJB_EDGE = 4 };
__device__ __forceinline__ unsigned fjb_classify(const fj_bwd_params &p, const fj_sizes &z,
                                                 int b, int h, int cls, int q0, int rows,
                                                 int kv0, int cols) {
  unsigned how = kv0 < z.Lk ? FJB_RUN : 0u;
#if FJ_HAS_MASK
  if (how && cls == FJ_TILE_PARTIAL) {
    const int wc = fj_tile_class(p.user, z, b, h, q0, min(q0 + rows, z.Lq) - 1, kv0,
                                 min(kv0 + cols, z.Lk) - 1);
    how = wc == FJ_TILE_EMPTY ? 0u : wc == FJ_TILE_PARTIAL ? FJB_RUN | FJB_NEED_MASK : FJB_RUN;
  }
#else
  (void)p, (void)b, (void)h, (void)cls;
#endif
  if (fjb_edge(z, q0, rows, kv0, cols)) how |= FJB_EDGE;
  return how;
}

#if FJ_HAS_MASK
// The class of query tile i of head h against kv rows [kv0, kv1] (a kv
// tile: n * FJ_BLOCK_N and fjb_kv_last): the one classification of a pair
// of tiles that the walk and the deterministic order (common/bwd_order.cuh)
// both use, so that they agree on every pair.
__device__ __forceinline__ int fjb_pair_class(const fj_bwd_params &p, const fj_sizes &z,
                                              int b, int h, int i, int kv0, int kv1) {
  const int q0 = i * FJ_BLOCK_M;
  return fj_tile_class(p.user, z, b, h, q0, min(q0 + FJ_BLOCK_M, z.Lq) - 1, kv0, kv1);
}

// The first query tile >= i below nq that is not EMPTY for kv rows
// [kv0, kv1] of head h, nq when none; *cls its class. Lane l classifies
// tile i + l, 32 tiles a round, so a long run of EMPTY tiles (the rows
// above a causal diagonal) costs a round per 32 of them. Every lane of the
// warp must call it with the same arguments.
__device__ __forceinline__ int fjb_scan_q(const fj_bwd_params &p, const fj_sizes &z, int b,
                                          int h, int i, int nq, int kv0, int kv1, int *cls) {
  const int lane = fj_tid() & 31;
  for (; i < nq; i += 32) {
    const int ii = i + lane;
    int c = FJ_TILE_EMPTY;
    if (ii < nq) c = fjb_pair_class(p, z, b, h, ii, kv0, kv1);
    const unsigned hit = __ballot_sync(0xffffffffu, c != FJ_TILE_EMPTY);
    if (hit != 0u) {
      const int src = __ffs(hit) - 1;
      *cls = __shfl_sync(0xffffffffu, c, src);
      return i + src;
    }
  }
  return nq;
}
#endif

// The block mask's query tile at list position *t of count row `row`, or
// the next one that starts below Lq (the tail of a last block may not); *t
// is moved to it and *cls receives its class. -1 past the end of the list.
// A kv tile's walk thus holds query tile i (below Lq) exactly when the
// tile's block is listed in the kv block's row (common/bwd_order.cuh counts
// on it). Block masks are not combined with packed batches: p.sz is the
// launch's and the sequence's.
__device__ __forceinline__ int fjb_bm_q_tile(const fj_bwd_params &p, int row, int *t,
                                             int *cls) {
  const int r = p.bm_q_ratio;
  const int np = __ldg(p.bm_q_num + row) * r;
  const int n = np + __ldg(p.bm_full_q_num + row) * r;
  const long long base = (long long)row * p.bm_nq;
  for (; *t < n; ++*t) {
    const bool partial = *t < np;
    const int k = partial ? *t : *t - np;
    const int blk = __ldg((partial ? p.bm_q_idx : p.bm_full_q_idx) + base + k / r);
    const int i = blk * r + k % r;
    if (i * FJ_BLOCK_M < p.sz.Lq) {
      *cls = partial ? FJ_TILE_PARTIAL : FJ_TILE_FULL;
      return i;
    }
  }
  return -1;
}

// The first item at or after position t of head h, heads below h_end; the
// next item after `it` is fjb_find(..., it.h, it.t + 1, ...).
__device__ __forceinline__ fjb_item fjb_find(const fj_bwd_params &p, const fj_sizes &z,
                                             int b, int n_block, int h, int t, int h_end,
                                             int kv0, int kv1) {
  fjb_item it;
  const int nq = (z.Lq + FJ_BLOCK_M - 1) / FJ_BLOCK_M;
  for (; h < h_end; ++h, t = 0) {
    if (p.bm_q_num != nullptr) {
      const int row = b * p.bm_b_stride + h * p.bm_h_stride + n_block / p.bm_kv_ratio;
      int c = FJ_TILE_EMPTY;
      const int i = fjb_bm_q_tile(p, row, &t, &c);
      if (i >= 0) {
        it.h = h, it.t = t, it.i = i, it.cls = c;
        return it;
      }
    } else {
#if FJ_HAS_MASK
      int c = FJ_TILE_EMPTY;
      const int i = fjb_scan_q(p, z, b, h, t, nq, kv0, kv1, &c);
      if (i < nq) {
        it.h = h, it.t = i, it.i = i, it.cls = c;
        return it;
      }
#else
      (void)kv0, (void)kv1;
      if (t < nq) {
        it.h = h, it.t = t, it.i = t, it.cls = FJ_TILE_FULL;
        return it;
      }
#endif
    }
  }
  it.h = h_end, it.t = 0, it.i = -1, it.cls = FJ_TILE_EMPTY;
  return it;
}

// The first of share k's items when n items are dealt in `shares` equal
// shares (share `shares` starts at n).
__device__ __forceinline__ int fjb_share(int k, int n, int shares) {
  return (int)((long long)k * n / shares);
}

// Whether item it comes before position (h, t) of a walk.
__device__ __forceinline__ bool fjb_before(const fjb_item &it, int h, int t) {
  return (it.h < h) | ((it.h == h) & (it.t < t));
}

// The persistent kernel's split tiles (FJB_PIECES: only where every kv
// tile's walk is every query tile of every head of its group, without a
// mask or block mask, which the host also requires: runtime/backward.c).
// Piece k of `pieces` of such a walk over the query heads [h0, h_end):
// its items j (in the walk's order, N of them) with fjb_share(k, N,
// pieces) <= j < fjb_share(k + 1, N, pieces), which may be none, as
// positions: pos = {head, query tile} of the first, {head, query tile} of
// the one after the last (the walk's end, {h_end, 0}, for the last piece).
#define FJB_PIECES (!FJ_HAS_MASK)
__device__ __forceinline__ void fjb_piece(const fj_sizes &z, int h0, int h_end, int k,
                                          int pieces, int (&pos)[4]) {
  const int nq = max((z.Lq + FJ_BLOCK_M - 1) / FJ_BLOCK_M, 1);  // an empty walk: at its end
  const int n = z.Lq > 0 ? (h_end - h0) * nq : 0;
  const int j0 = fjb_share(k, n, pieces), j1 = fjb_share(k + 1, n, pieces);
  pos[0] = h0 + j0 / nq, pos[1] = j0 % nq;
  pos[2] = h0 + j1 / nq, pos[3] = j1 % nq;
}

// A CTA's walk: kv tile n_block of kv head hk, batch b, over the query
// heads of hk's group, for the roles of the sm90 kernel, which must see the
// same items in the same order: its producer warps walk on their own, its
// consumers take their first item here (and the next ones from producer
// warp 1). The sequence's sizes are read at each step from its record in
// shared memory (s_seq: fjb_seq_sts, written by every thread before), not
// held in registers across the roles' loops. (The sm80 kernel calls
// fjb_find itself: with these fields held across its loop it spilled at
// D=128.)
//
// A walk takes the items from position (h_s, t_s) up to, not including,
// position (h_e, t_e) (positions ordered by head, then t): the whole tile,
// or after piece() one share of its items (FJB_PIECES).
struct fjb_walk {
  unsigned s_seq;
  int b, n_block, h_end, kv0, kv1;
  int h_s, t_s, h_e, t_e;
  __device__ __forceinline__ fjb_walk(const fj_bwd_params &p, unsigned s_seq_, int n_block_,
                                      int hk, int b_)
      : s_seq(s_seq_), b(b_), n_block(n_block_), h_end((hk + 1) * p.kv_group),
        kv0(n_block_ * FJ_BLOCK_N), kv1(fjb_kv_last(fjb_seq_lds_sizes(p, s_seq_), n_block_)),
        h_s(hk * p.kv_group), t_s(0), h_e((hk + 1) * p.kv_group), t_e(0) {}
  // The sequence's sizes and rows, read from shared memory.
  __device__ __forceinline__ fj_sizes sizes(const fj_bwd_params &p) const {
    return fjb_seq_lds_sizes(p, s_seq);
  }
  __device__ __forceinline__ fjb_seq seq(const fj_bwd_params &p) const {
    return fjb_seq_lds(p, s_seq, b);
  }
  __device__ __forceinline__ fjb_item first(const fj_bwd_params &p) const {
    return fjb_find(p, sizes(p), b, n_block, h_s, t_s, h_end, kv0, kv1);
  }
  __device__ __forceinline__ fjb_item next(const fj_bwd_params &p, const fjb_item &it) const {
    return fjb_find(p, sizes(p), b, n_block, it.h, it.t + 1, h_end, kv0, kv1);
  }
  // (A walk that is never a piece ends at its group's end.)
  __device__ __forceinline__ bool done(const fjb_item &it) const {
    return FJB_PIECES ? !fjb_before(it, h_e, t_e) : it.h >= h_end;
  }
  // Narrows the whole tile's walk to piece k of `pieces` (fjb_piece).
  __device__ __forceinline__ void piece(const fj_bwd_params &p, int k, int pieces) {
    int pos[4];
    fjb_piece(sizes(p), h_s, h_end, k, pieces, pos);
    h_s = pos[0], t_s = pos[1], h_e = pos[2], t_e = pos[3];
  }
};

// A persistent kernel's t-th kv tile (its blockIdx.x, then its counter's
// values): the kv heads of every batch (hb = b * Hkv + hk, `heads` of
// them) in groups of `group` (at least 1; the last group takes the
// remainder), and within a group kv tile slowest, then kv head. Returns
// the kv tile (of nkv a head) and sets *hb. The host chooses the group
// (runtime/backward.h, fjr_bwd_kv_head_group, which says why).
__device__ __forceinline__ int fjb_tile_order(int t, int nkv, int heads, int group, int *hb) {
  const int groups = max(heads / group, 1);
  const int g = min(t / (group * nkv), groups - 1);
  const int h0 = g * group;
  const int size = g == groups - 1 ? heads - h0 : group;
  const int r = t - h0 * nkv;
  *hb = h0 + r % size;
  return r / size;
}
