/*
 * gen/emit_cuda.h: CUDA source for a graph.
 *
 * The prologue holds what a kernel template needs from the spec (see the
 * contract at the top of templates/common/fj_common.cuh):
 *   struct fj_user_params { long long fj_reserved_; <args> };
 *   fj_mask, fj_score_mod  SSA code, one statement per line (t0, t1, ...)
 *   fj_score_log2(u, z, qk, scale, b, h, qb, dq, kvb, dk)
 *                          what the kernels call: fj_score_mod(qk * scale)
 *                          times log2 e at q = qb + dq, kv = kvb + dk, where
 *                          a caller keeps qb and kvb the same over its
 *                          unrolled elements and dq, dk constants. For an
 *                          additive score_mod (fjg_score_is_additive) it is
 *                          written so that what depends on the element
 *                          costs least: the factor folded into every term,
 *                          an affine index's float the base's plus a
 *                          constant (within a few ulp of the terms of the
 *                          product; exact conversions while the indices
 *                          lie within 2^24); at most eight values hoisted
 *                          out of the element loop, each factor defined
 *                          once (k0, k1, ...)
 *   fj_tile_class          the interval analysis of gen/interval.c, as calls
 *                          to the same fj_iv_* rules, which
 *                          fjg_emit_interval_rules writes (once per
 *                          translation unit, before the prologue).
 *   fj_score_tile(u, z, scale, b, h, q0, q1, kv0, kv1, terms)
 *                          only where fjg_score_has_tile_terms: true when
 *                          the same rules find every term one value over
 *                          the tile, with terms (log2 units) set to it;
 *                          each of the tile's scores is then
 *   fj_score_log2_tile(qk, scale, terms)
 *                          qk * (log2 e * scale) + terms, within a few ulp
 *                          of the terms of fj_score_log2's value.
 * Argument members are prefixed so Lua names cannot clash with C++ keywords:
 * an i32 param `w` is `int a_w;`, an f32 param `float a_w;`, a buffer `d` is
 * `const int *a_d; long long n_d;` (const float * for f32 elements).
 *
 * A backward unit adds, right after the prologue, the hooks of
 * docs/backward.md (fjg_emit_backward_hooks):
 *   struct fj_user_grads { float *g_<name>; ... };  one per trainable buffer,
 *                        in declaration order (long long fj_reserved_ when
 *                        there is none, so it is never empty)
 *   struct fj_grad_cache a write-combining slot (fj_grad_slot, common/
 *                        fj_common.cuh) per trainable read, which a thread
 *                        keeps across its calls
 *   fj_grad_flush(gr, gc) adds what the slots hold (atomicAdd); a thread
 *                        calls it once, after its last fj_score_grad
 *   fj_grad_tile(u, z, b, h, q0, q1, kv0, kv1, gc)
 *                        before a tile's fj_score_grad calls: each trainable
 *                        read whose index is one value over the tile
 *                        (interval analysis over the derivative's nodes,
 *                        the rules of the prologue, emitted here when it has
 *                        none) sums its adds in gc instead
 *   fj_grad_tile_uniform(gc) whether every read's index was one value
 *                        (a kernel branches on it: under the branch its
 *                        loop of adds is a sum)
 *   fj_grad_tile_end(gr, gc) after them: those sums into the slots
 *   fj_score_grad(u, gr, gc, z, score, b, h, q, kv, ds)
 *                        ds * d score_mod / d score, after adding
 *                        ds * d score_mod / d buf[n] to gr.g_<name>[n]
 *                        through its slot of gc (fj_grad_add) for every
 *                        trainable read whose index n is inside the
 *                        buffer; SSA code over the derivative's
 *                        nodes (fjg_graph_derivative) with a score_mod's f32
 *                        rules. ds == 0 returns 0 and adds nothing (even
 *                        where the derivative is inf or NaN). Without a
 *                        derivative (no score_mod) it returns ds.
 * The forward unit never has them: its bytes are its cache key.
 *
 * Output is deterministic: the same graph gives the same bytes.
 * Functions append to `out`; on FJ_ENOMEM `out->failed` is set.
 */
#ifndef FJG_EMIT_CUDA_H
#define FJG_EMIT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "gen/graph.h"

/* Defined in gen/config.h (kernel configuration). */
typedef struct fjg_config fjg_config;

/* The fj_iv_* interval rules of gen/interval.c as CUDA, which a prologue's
 * fj_tile_class calls; nothing when g has no mask (every tile is FULL), and
 * always when g is NULL. Spec-independent text. */
fj_status fjg_emit_interval_rules(const fjg_graph *g, fjg_buf *out);

/* The prologue. It needs the interval rules (fjg_emit_interval_rules)
 * before it. Only the graph reaches it: no byte of the spec's source text
 * (comments, names) is copied into CUDA. */
fj_status fjg_emit_prologue(const fjg_graph *g, fjg_buf *out);

/* 1 when g's score_mod is the score plus (or minus) terms that do not read
 * it, such as ALiBi's bias: fj_score_log2 then folds the scale and log2 e
 * into the score's product and the terms' invariant factors. */
int fjg_score_is_additive(const fjg_graph *g);

/* 1 when g's score_mod is additive and each of its terms that reads q or
 * kv can be one value over a tile: q and kv reach it only through clamps,
 * comparisons, selections or integer divisions (a relative-position bias
 * or bucket, constant far from the diagonal). Its prologue then has
 * fj_score_tile and fj_score_log2_tile, and its units define
 * FJ_SCORE_TILE 1. */
int fjg_score_has_tile_terms(const fjg_graph *g);

/* The number of g's mask's row values: its loads whose index reads q but
 * not kv (a query row's document id). Where there are any, the prologue
 * has, under #ifdef FJ_MASK_ROWS, fj_mask_rows (a row's values into
 * unsigned v[N]) and fj_mask_from_rows (fj_mask from them), and backward
 * units define FJ_MASK_ROWS N. -1 when out of memory. */
int fjg_mask_row_values(const fjg_graph *g);

/* The same for its column values, loads whose index reads kv but not q (a
 * key's document id): fj_mask_cols and fj_mask_from_cols under #ifdef
 * FJ_MASK_COLS, which forward units define as N. */
int fjg_mask_col_values(const fjg_graph *g);

/* A kernel's parts (fjg_template_parts) in order: each template's text
 * under a "// ---- template NAME ----" line, and at FJG_PART_PROLOGUE the
 * interval rules and the prologue of g. FJ_ENOTFOUND when parts is NULL or
 * a template is missing. */
fj_status fjg_emit_parts(const fjg_graph *g, const char *const *parts, fjg_buf *out);

/* The whole forward translation unit but the banner (runtime/kernels.c
 * writes it): the configuration #defines, then the parts of
 * cfg->template_name's "forward" kernel (gen/templates.c). FJ_ENOTFOUND
 * when the template or one of its parts is missing, FJ_EINVAL on a NULL
 * cfg. */
fj_status fjg_emit_forward_tu(const fjg_graph *g, const fjg_config *cfg,
                              fjg_buf *out);

/* The backward hooks (see the top of this file); they need the prologue
 * before them. */
fj_status fjg_emit_backward_hooks(const fjg_graph *g, fjg_buf *out);

/* The whole backward translation unit but the banner: the configuration
 * #defines as fjg_emit_forward_tu writes them (and `#define
 * FJ_DETERMINISTIC 1` when cfg->deterministic), then the parts of
 * cfg->template_name's "backward" kernel (gen/templates.c), with the
 * backward hooks after the prologue. FJ_ENOTFOUND when the template has no
 * backward kernel or one of its parts is missing, FJ_EINVAL on a NULL
 * cfg. */
fj_status fjg_emit_backward_tu(const fjg_graph *g, const fjg_config *cfg,
                               fjg_buf *out);

/* Any other kernel's translation unit but the banner: the configuration
 * #defines, then the parts of cfg->template_name's `kernel` (gen/
 * templates.c: "decode", "util"). FJ_ENOTFOUND without such a kernel. */
fj_status fjg_emit_kernel_tu(const fjg_graph *g, const fjg_config *cfg, const char *kernel,
                             fjg_buf *out);

/* Host layout of struct fj_user_params (natural alignment; x86-64 and CUDA
 * agree): 8-byte fj_reserved_, then the arguments in declaration order. */
size_t fjg_user_params_size(const fjg_graph *g);
/* Byte offset of argument `arg`'s value (a buffer's pointer; its length
 * follows 8 bytes later). 0 when arg is out of range. */
size_t fjg_user_params_offset(const fjg_graph *g, int arg);
/* Writes fjg_user_params_size(g) bytes to dst. The arrays are indexed by
 * argument index; each is read only for arguments of its kind (and may be
 * NULL when the graph has none of that kind). Padding and fj_reserved_ are
 * zero. */
void fjg_user_params_pack(const fjg_graph *g, const int32_t *i32_by_arg,
                          const float *f32_by_arg, const uint64_t *ptr_by_arg,
                          const int64_t *len_by_arg, void *dst);

/* Host layout of struct fj_user_grads: 8 bytes per trainable buffer (its
 * gradient's device pointer), in declaration order; 8 (the placeholder)
 * when there is none. */
size_t fjg_user_grads_size(const fjg_graph *g);
/* Writes fjg_user_grads_size(g) bytes to dst: grad_ptr_by_arg[i] for each
 * trainable argument i (indexed by argument index, read only for those;
 * may be NULL when there is none). The placeholder is zero. */
void fjg_user_grads_pack(const fjg_graph *g, const uint64_t *grad_ptr_by_arg,
                         void *dst);

#endif /* FJG_EMIT_CUDA_H */
