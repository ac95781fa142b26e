/*
 * runtime/serving.c: the serving layouts' checks and parameter fields (see
 * serving.h, docs/serving.md).
 */
#include "runtime/serving.h"

#include <math.h>

#include "gen/graph.h"
#include "runtime/context_impl.h"
#include "runtime/tensor.h"

static const DLDataType i32 = {kDLInt, 32, 1};

fj_status fjr_serving_layout(fj_context *ctx, const fj_forward_args *a, fjr_layout *l) {
  l->q_packed = a->cu_seqlens_q != NULL;
  l->kv_packed = a->cu_seqlens_k != NULL;
  l->kv_paged = a->block_table != NULL;
  if (l->kv_packed && !l->q_packed)
    return fjr_fail(ctx, FJ_EINVAL,
                    "cu_seqlens_k is set but cu_seqlens_q is NULL: a packed batch gives "
                    "both (or cu_seqlens_q alone, with k and v [B, Hkv, Lk, D] or paged)");
  if (l->kv_packed && l->kv_paged)
    return fjr_fail(ctx, FJ_EINVAL,
                    "block_table and cu_seqlens_k are both set: with paged KV, "
                    "seqlens_k gives the kv lengths and cu_seqlens_k is NULL");
  if (l->kv_packed && a->seqlens_k)
    return fjr_fail(ctx, FJ_EINVAL,
                    "seqlens_k and cu_seqlens_k are both set: in a packed batch the kv "
                    "lengths come from cu_seqlens_k");
  if (!l->q_packed && a->max_seqlen_q != 0)
    return fjr_fail(ctx, FJ_EINVAL,
                    "max_seqlen_q is %d but cu_seqlens_q is NULL (it sizes packed "
                    "batches only; leave it 0)",
                    a->max_seqlen_q);
  if (!l->kv_packed && a->max_seqlen_k != 0)
    return fjr_fail(ctx, FJ_EINVAL,
                    "max_seqlen_k is %d but cu_seqlens_k is NULL (it sizes packed "
                    "batches only; with block_table the kv bound is max_pages * "
                    "page_size; leave it 0)",
                    a->max_seqlen_k);
  const float t = a->skip_softmax_threshold;
  if (!(t >= 0.0f && t < 1.0f))
    return fjr_fail(ctx, FJ_EINVAL,
                    "skip_softmax_threshold %g is outside [0, 1) (0: exact attention)",
                    (double)t);
  return FJ_OK;
}

/* An int32 array of `len` entries (dimension 0) and `ndim` dimensions:
 * on the device, last dimension contiguous, 4-byte aligned. */
static fj_status check_i32(fj_context *ctx, const char *what, const DLTensor *t, int ndim,
                           int64_t *strides) {
  fj_status st = fjr_tensor_check(ctx, what, t, ndim, i32, strides);
  if (st != FJ_OK) return st;
  if (fjr_tensor_ptr(t) % 4 != 0)
    return fjr_fail(ctx, FJ_ETENSOR, "%s: data must be 4-byte aligned", what);
  return FJ_OK;
}

fj_status fjr_varlen_bind(fj_context *ctx, const DLTensor *cu_q, const DLTensor *cu_k,
                          int max_q, int max_k, int64_t *B, uint64_t *pq, uint64_t *pk) {
  int64_t s[1];
  fj_status st = check_i32(ctx, "cu_seqlens_q", cu_q, 1, s);
  if (st != FJ_OK) return st;
  const int64_t n = cu_q->shape[0];
  if (n < 2)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "cu_seqlens_q: %lld entries; it is [B + 1] with B >= 1 (offsets from 0)",
                    (long long)n);
  if (max_q < 1)
    return fjr_fail(ctx, FJ_EINVAL,
                    "max_seqlen_q is %d: with cu_seqlens_q it must be at least 1 (the "
                    "longest query sequence; it sizes the grid)",
                    max_q);
  *pq = fjr_tensor_ptr(cu_q);
  *pk = 0;
  if (cu_k) {
    if ((st = check_i32(ctx, "cu_seqlens_k", cu_k, 1, s)) != FJ_OK) return st;
    if (cu_k->shape[0] != n)
      return fjr_fail(ctx, FJ_ETENSOR,
                      "cu_seqlens_k has %lld entries and cu_seqlens_q %lld: both are "
                      "[B + 1]",
                      (long long)cu_k->shape[0], (long long)n);
    if (max_k < 1)
      return fjr_fail(ctx, FJ_EINVAL,
                      "max_seqlen_k is %d: with cu_seqlens_k it must be at least 1 (the "
                      "longest key/value sequence)",
                      max_k);
    *pk = fjr_tensor_ptr(cu_k);
  }
  *B = n - 1;
  return FJ_OK;
}

fj_status fjr_serving_bind(fj_context *ctx, const fj_forward_args *a, const fjr_layout *l,
                           int64_t B, int64_t *Lk_paged, fjr_fwd_params_fixed *p) {
  int64_t s[2];
  fj_status st;
  if (a->seqlens_k) {
    if ((st = check_i32(ctx, "seqlens_k", a->seqlens_k, 1, s)) != FJ_OK) return st;
    if (a->seqlens_k->shape[0] != B)
      return fjr_fail(ctx, FJ_ETENSOR,
                      "seqlens_k: %lld entries for a batch of %lld sequences (it is [B])",
                      (long long)a->seqlens_k->shape[0], (long long)B);
    p->seqlens_k = fjr_tensor_ptr(a->seqlens_k);
  }
  if (l->kv_paged) {
    const int64_t page_size = a->k->shape[1];
    if (page_size <= 0 || page_size % 16 != 0 || page_size > 256)
      return fjr_fail(ctx, FJ_ETENSOR,
                      "k: page size %lld (dimension 1 of the page pool [num_pages, "
                      "page_size, Hkv, D]) must be a multiple of 16, at most 256",
                      (long long)page_size);
    if ((st = check_i32(ctx, "block_table", a->block_table, 2, s)) != FJ_OK) return st;
    if (a->block_table->shape[0] != B)
      return fjr_fail(ctx, FJ_ETENSOR,
                      "block_table: %lld rows for a batch of %lld sequences (it is [B, "
                      "max_pages])",
                      (long long)a->block_table->shape[0], (long long)B);
    const int64_t pages = a->block_table->shape[1];
    if (pages > INT32_MAX / page_size)
      return fjr_fail(ctx, FJ_ETENSOR,
                      "block_table: %lld pages of %lld rows reach past 2^31 kv positions",
                      (long long)pages, (long long)page_size);
    p->block_table = fjr_tensor_ptr(a->block_table);
    p->bt_stride = s[0];
    p->page_size = (int32_t)page_size;
    *Lk_paged = pages * page_size;
  }
  const float t = a->skip_softmax_threshold;
  p->skip_log2 = t > 0.0f ? log2f(t) : 0.0f;
  return FJ_OK;
}

/* Whether mask_mod or score_mod reads Lq or Lk (its derivative reads what it reads). */
static int reads_lengths(const fjg_graph *g) {
  const unsigned lengths = (1u << FJG_SZ_LQ) | (1u << FJG_SZ_LK);
  return ((fjg_size_deps(g, fjg_mask_root(g)) | fjg_size_deps(g, fjg_score_root(g))) &
          lengths) != 0;
}

fj_status fjr_offsets_bind(fj_context *ctx, const fjg_graph *g, int64_t q_offset,
                           int64_t kv_offset, int packed, fjr_sizes *sz) {
  if (q_offset == 0 && kv_offset == 0) return FJ_OK;
  if (q_offset < 0 || kv_offset < 0)
    return fjr_fail(ctx, FJ_EINVAL, "q_offset (%lld) and kv_offset (%lld) must be >= 0",
                    (long long)q_offset, (long long)kv_offset);
  if (q_offset > INT32_MAX - sz->Lq || kv_offset > INT32_MAX - sz->Lk)
    return fjr_fail(ctx, FJ_EINVAL,
                    "q_offset + q length and kv_offset + kv length must be below 2^31");
  if (packed)
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "q_offset and kv_offset are not supported with packed batches "
                    "(cu_seqlens): each sequence's positions start at 0");
  if (reads_lengths(g))
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "this spec reads the lengths Lq or Lk (bottom-right alignment, a "
                    "relative bias's default offset): with q_offset and kv_offset it would "
                    "see a shard's lengths, not the whole sequence's; pass the whole "
                    "lengths as params instead");
  sz->q_off = (int32_t)q_offset;
  sz->kv_off = (int32_t)kv_offset;
  return FJ_OK;
}
