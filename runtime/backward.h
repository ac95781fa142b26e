/*
 * runtime/backward.h: the backward launch path's internals that tests
 * share with runtime/backward.c (not part of the public API).
 */
#ifndef FJR_BACKWARD_H
#define FJR_BACKWARD_H

#include "flexjit.h"
#include "gen/graph.h"
#include "runtime/launch_params.h"

/* The checks of a backward launch's tensors, scale and packed-batch fields
 * (docs/backward.md, docs/serving.md), each failure naming the tensor or
 * field and the rule: tensors [B, H, S, D], or packed [total, H, D] with
 * lse and dlse [Hq, total_q] (cu_seqlens_q: q, o, dout, dq; cu_seqlens_k:
 * k, v, dk, dv; the forward's rules for which fields go together,
 * runtime/serving.c); a block mask is refused with a packed batch. Fills
 * the fixed part of the parameter struct (pointers, strides, sizes, scale,
 * cu_seqlens, acc_sh; not the scratch nor the block mask) and *dtype, the
 * inputs' element type. With packed q, B = len(cu_seqlens_q) - 1 and Lq =
 * max_seqlen_q; with packed k and v, Lk = max_seqlen_k. Touches no
 * device. */
fj_status fjr_backward_check(fj_context *ctx, const fj_backward_args *args, fj_dtype *dtype,
                             fjr_bwd_params_fixed *p);

/* The persistent sm90 kernel's tile order (common/bwd_walk.cuh's
 * fjb_tile_order): kv heads (B * Hkv of them, every batch's) in groups of
 * the returned count, the last group taking the remainder, and kv tile
 * slowest within a group. Where a kv tile's walk shrinks with its index
 * (fjr_bwd_walks_shrink), a group deals its longest tiles first and its
 * shortest last; kv tile fastest over every head instead (one head a
 * group), the last head's first tile started when little else was left,
 * and the kernel waited for it. A group holds at least twice the grid's
 * tiles, so that its long tiles start while the group's work still fills
 * every CTA, and no more kv heads than whose Q, dO and dq_accum rows
 * (bytes_per_kv_head) fit in two thirds of L2. 1 (one head a group) where
 * l2_bytes is 0, unknown. */
int fjr_bwd_kv_head_group(int64_t grid, int64_t kv_tiles, int64_t kv_heads,
                          int64_t bytes_per_kv_head, int64_t l2_bytes);

/* Whether a kv tile's walk shrinks with its index, as under a causal mask:
 * the first query tile misses the last kv tile while the last query tile
 * meets the first (the mask's interval analysis, fjg_tile_class_cpu, at
 * batch 0 and head 0 with env's sizes and params; tiles of block_m query
 * and block_n kv rows). Only then is the tile order grouped: with walks of
 * one length the one-head order deals as evenly, and a head's tiles,
 * started together, read each of its query tiles at about the same time.
 * A mask that reads a buffer is never EMPTY to the analysis: 0. */
int fjr_bwd_walks_shrink(const fjg_graph *g, const fjg_env *env, int block_m, int block_n);

/* The persistent sm90 kernel's last round split (templates/sm90/
 * bwd_config.cuh): where `tiles` kv tiles on `grid` CTAs fill whole rounds
 * and leave a last round of a few (tiles % grid: at most
 * FJR_BWD_TAIL_TILES and at most half the grid), that round's tiles would
 * each run on one CTA while the rest wait; they are taken in pieces
 * instead, grid / (their count) pieces a tile (at most `items`, the most
 * items a tile holds), so that every CTA takes a piece. tail[0]: the split
 * tiles, tail[1]: pieces a tile; 0 and 0 where there is no such round
 * (fewer tiles than CTAs, whole rounds, a last round of many tiles). */
enum { FJR_BWD_TAIL_TILES = 32 };
void fjr_bwd_tail_split(int64_t grid, int64_t tiles, int64_t items, int tail[2]);

#endif /* FJR_BACKWARD_H */
