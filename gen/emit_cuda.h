/*
 * gen/emit_cuda.h: CUDA source for a graph.
 *
 * The prologue holds what a kernel template needs from the spec (see the
 * contract at the top of templates/common/fj_common.cuh):
 *   struct fj_user_params { long long fj_reserved_; <args> };
 *   fj_mask, fj_score_mod  SSA code, one statement per line (t0, t1, ...)
 *   fj_tile_class          the interval analysis of gen/interval.c, as calls
 *                          to the same fj_iv_* rules, which
 *                          fjg_emit_interval_rules writes (once per
 *                          translation unit, before the prologue).
 * Argument members are prefixed so Lua names cannot clash with C++ keywords:
 * an i32 param `w` is `int a_w;`, an f32 param `float a_w;`, a buffer `d` is
 * `const int *a_d; long long n_d;` (const float * for f32 elements).
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

#endif /* FJG_EMIT_CUDA_H */
