/*
 * gen/emit_blockmask.h: CUDA source of the block-mask builder of a graph.
 *
 * The translation unit is: the FJ_HAS_MASK and FJ_BM_WARPS
 * defines, common/fj_common.cuh, the spec's generated prologue (the same
 * fj_mask and fj_tile_class the forward kernel uses, gen/emit_cuda.c), then
 * the builder's two kernels, fj_blockmask_classify and fj_blockmask_compact
 * (their contract is at the top of fjg_blockmask_kernel_source()). The
 * runtime (runtime/blockmask.c) compiles, caches and launches them.
 */
#ifndef FJG_EMIT_BLOCKMASK_H
#define FJG_EMIT_BLOCKMASK_H

#include "gen/graph.h"

/* Warps per CTA of both builder kernels (FJ_BM_WARPS). */
#define FJG_BLOCKMASK_WARPS 8

/* The builder kernels' text (static), also hashed into the cache key. */
const char *fjg_blockmask_kernel_source(void);

/* Appends the whole translation unit but the banner (runtime/kernels.c
 * writes it) to out. FJ_ENOTFOUND
 * when common/fj_common.cuh is not embedded, FJ_ENOMEM. */
fj_status fjg_emit_blockmask_tu(const fjg_graph *g, fjg_buf *out);

#endif /* FJG_EMIT_BLOCKMASK_H */
