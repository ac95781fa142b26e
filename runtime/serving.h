/*
 * runtime/serving.h: the serving layouts of an attention launch
 * (docs/serving.md): per-sequence kv lengths, paged KV and packed
 * variable-length batches. Which layout a launch uses, the checks of its
 * int32 arrays and scalars, and the parameter fields they fill.
 *
 * Values inside the device arrays cannot be read on the host; the kernels
 * clamp what they can (a sequence's lengths to [0, Lq] and [0, Lk]; no kv
 * position at or past a sequence's length is read) and trust the rest (the
 * offsets in cu_seqlens lie inside the packed tensors, block-table entries
 * name pages of the pool).
 */
#ifndef FJR_SERVING_H
#define FJR_SERVING_H

#include <stdint.h>

#include "flexjit.h"
#include "runtime/launch_params.h"

/* A launch's layout, from which serving fields are set. */
typedef struct fjr_layout {
  int q_packed;  /* cu_seqlens_q: q, o [total_q, Hq, D], lse [Hq, total_q] */
  int kv_packed; /* cu_seqlens_k: k, v [total_k, Hkv, D] */
  int kv_paged;  /* block_table: k, v page pools [num_pages, page_size, Hkv, D] */
} fjr_layout;

/* The forward's layout, and the checks that need no tensor's shape: which
 * fields go together (cu_seqlens_k needs cu_seqlens_q; block_table and
 * seqlens_k exclude cu_seqlens_k; max_seqlen_q/k only with cu_seqlens_q/k,
 * then at least 1) and skip_softmax_threshold in [0, 1). */
fj_status fjr_serving_layout(fj_context *ctx, const fj_forward_args *a, fjr_layout *l);

/* Packed batches (forward and backward): cu_q (required) and cu_k (may be
 * NULL) are int32 [B + 1], contiguous, 4-byte aligned, of one length;
 * *B = that length - 1 (at least 1). max_q (and max_k with cu_k) at least
 * 1. The device addresses go to *pq and *pk (0 for a NULL cu_k). */
fj_status fjr_varlen_bind(fj_context *ctx, const DLTensor *cu_q, const DLTensor *cu_k,
                          int max_q, int max_k, int64_t *B, uint64_t *pq, uint64_t *pk);

/* The forward's seqlens_k (int32 [B]) and block_table (int32 [B,
 * max_pages], last dimension contiguous) for a batch of B sequences, k the
 * already checked page pool when l->kv_paged (page_size = its dimension 1:
 * a multiple of 16, at most 256). Fills p's seqlens_k, block_table,
 * bt_stride, page_size and skip_log2; *Lk_paged = max_pages * page_size
 * when paged (else untouched). */
fj_status fjr_serving_bind(fj_context *ctx, const fj_forward_args *a, const fjr_layout *l,
                           int64_t B, int64_t *Lk_paged, fjr_fwd_params_fixed *p);

/* Context parallel offsets (fj_forward_args.q_offset, kv_offset; the
 * backward's the same) into sz: both 0 leaves sz alone; else both >= 0,
 * offset + length below 2^31, and refused with a packed batch or a spec
 * (graph g) that reads Lq or Lk. A block mask must have been built at the
 * same offsets (blockmask.c checks). */
struct fjg_graph;
fj_status fjr_offsets_bind(fj_context *ctx, const struct fjg_graph *g, int64_t q_offset,
                           int64_t kv_offset, int packed, fjr_sizes *sz);

#endif /* FJR_SERVING_H */
