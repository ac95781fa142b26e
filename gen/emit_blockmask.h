/*
 * gen/emit_blockmask.h: CUDA source of the block-mask builder of a graph.
 *
 * The translation unit is: a banner, the FJ_HAS_MASK and FJ_BM_WARPS
 * defines, common/fj_common.cuh, the spec's generated prologue (the same
 * fj_mask and fj_tile_class the forward kernel uses, gen/emit_cuda.c), then
 * the builder's three kernels, fj_blockmask_classify, fj_blockmask_compact
 * and fj_blockmask_order (their contract is at the top of
 * fjg_blockmask_kernel_source()). The
 * runtime (runtime/blockmask.c) compiles, caches and launches them.
 */
#ifndef FJG_EMIT_BLOCKMASK_H
#define FJG_EMIT_BLOCKMASK_H

#include "gen/graph.h"

/* Warps per CTA of the classify and compact kernels (FJ_BM_WARPS). */
#define FJG_BLOCKMASK_WARPS 8

/* fj_blockmask_order sorts a row's query blocks by their kv-block count
 * with one shared-memory bin per count (nkv + 1 of them, 4 bytes each):
 * up to this many kv blocks; beyond, the order is simply last to first
 * (FJ_BM_ORDER_BINS; gen/blockmask_cpu.c mirrors both). */
#define FJG_BLOCKMASK_ORDER_MAX_NKV 12287

/* The builder kernels' text (static), also hashed into the cache key. */
const char *fjg_blockmask_kernel_source(void);

/* Appends the whole translation unit to out. key_hex (may be NULL) goes
 * into the banner, spec_source (may be NULL) into a comment. FJ_ENOTFOUND
 * when common/fj_common.cuh is not embedded, FJ_ENOMEM. */
fj_status fjg_emit_blockmask_tu(const fjg_graph *g, const char *spec_source,
                                const char *key_hex, fjg_buf *out);

#endif /* FJG_EMIT_BLOCKMASK_H */
