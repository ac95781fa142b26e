/*
 * runtime/tensor.c: the tensor checks (see tensor.h).
 */
#include "runtime/tensor.h"

#include <stdio.h>
#include <string.h>

#include "runtime/context_impl.h"

uint64_t fjr_tensor_ptr(const DLTensor *t) {
  return (uint64_t)(uintptr_t)t->data + t->byte_offset;
}

int fjr_tensor_is(const DLTensor *t, uint8_t code, uint8_t bits) {
  return t->dtype.code == code && t->dtype.bits == bits && t->dtype.lanes == 1;
}

const char *fjr_dtype_text(DLDataType t, char *buf, size_t n) {
  const char *k = t.code == kDLFloat    ? "float"
                  : t.code == kDLBfloat ? "bfloat"
                  : t.code == kDLInt    ? "int"
                  : t.code == kDLUInt   ? "uint"
                                        : "code?";
  snprintf(buf, n, "%s%u%s", k, t.bits, t.lanes == 1 ? "" : "xN");
  return buf;
}

fj_status fjr_tensor_check(fj_context *ctx, const char *what, const DLTensor *t,
                           int ndim, DLDataType dtype, int64_t *strides) {
  char a[32], b[32];
  if (!t) return fjr_fail(ctx, FJ_ETENSOR, "%s: tensor is NULL", what);
  if (t->ndim != ndim)
    return fjr_fail(ctx, FJ_ETENSOR, "%s: expected %d dimensions, got %d", what,
                    ndim, t->ndim);
  if (!t->shape) return fjr_fail(ctx, FJ_ETENSOR, "%s: shape is NULL", what);
  if (t->device.device_type != kDLCUDA && t->device.device_type != kDLCUDAManaged)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "%s: tensor is not on a CUDA device (device_type %d)", what,
                    (int)t->device.device_type);
  if (t->device.device_id != ctx->opts.device)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "%s: tensor is on CUDA device %d, the context uses %d", what,
                    t->device.device_id, ctx->opts.device);
  if (!fjr_tensor_is(t, dtype.code, dtype.bits))
    return fjr_fail(ctx, FJ_ETENSOR, "%s: dtype %s, expected %s", what,
                    fjr_dtype_text(t->dtype, a, sizeof a), fjr_dtype_text(dtype, b, sizeof b));
  if (!t->data) return fjr_fail(ctx, FJ_ETENSOR, "%s: data pointer is NULL", what);
  int64_t expect = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    if (t->shape[i] <= 0)
      return fjr_fail(ctx, FJ_ETENSOR, "%s: dimension %d has size %lld", what, i,
                      (long long)t->shape[i]);
    strides[i] = t->strides ? t->strides[i] : expect;
    if (__builtin_mul_overflow(expect, t->shape[i], &expect))
      return fjr_fail(ctx, FJ_ETENSOR, "%s: shape has more than 2^63 elements", what);
  }
  if (strides[ndim - 1] != 1 && t->shape[ndim - 1] > 1)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "%s: the last dimension must be contiguous (stride %lld)", what,
                    (long long)strides[ndim - 1]);
  for (int i = 0; i < ndim; i++)
    if (strides[i] < 0)
      return fjr_fail(ctx, FJ_ETENSOR, "%s: negative stride in dimension %d", what,
                      i);
  return FJ_OK;
}

static void shape_text(const int64_t *s, int n, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && used < len; i++) {
    int k = snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (k < 0) break;
    used += (size_t)k;
  }
}

fj_status fjr_tensor_check_shape(fj_context *ctx, const char *what,
                                 const DLTensor *t, const int64_t *want) {
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] != want[i]) {
      char have[128], expect[128];
      shape_text(t->shape, t->ndim, have, sizeof have);
      shape_text(want, t->ndim, expect, sizeof expect);
      return fjr_fail(ctx, FJ_ETENSOR,
                      "%s: shape [%s] does not match the expected [%s]", what, have,
                      expect);
    }
  return FJ_OK;
}

fj_status fjr_tensor_check_aligned16(fj_context *ctx, const char *what,
                                     const DLTensor *t, const int64_t *s) {
  if (fjr_tensor_ptr(t) % 16 != 0)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "%s: data must be 16-byte aligned (address %% 16 = %llu)", what,
                    (unsigned long long)(fjr_tensor_ptr(t) % 16));
  for (int i = 0; i < t->ndim - 1; i++)
    if (s[i] % 8 != 0 && t->shape[i] > 1)
      return fjr_fail(ctx, FJ_ETENSOR,
                      "%s: stride of dimension %d (%lld elements) must be a "
                      "multiple of 8",
                      what, i, (long long)s[i]);
  return FJ_OK;
}

fj_status fjr_tensor_query(fj_context *ctx, const DLTensor *q, int ndim, fj_dtype *dtype,
                           DLDataType *dl) {
  if (!q || q->ndim != ndim || !q->shape)
    return fjr_fail(ctx, FJ_ETENSOR,
                    ndim == 3 ? "q: expected a 3-D tensor [total_q, Hq, D] (packed: "
                                "cu_seqlens_q is set)"
                              : "q: expected a 4-D tensor [B, Hq, Lq, D]");
  if (fjr_tensor_is(q, kDLBfloat, 16)) {
    *dtype = FJ_DTYPE_BF16;
    *dl = (DLDataType){kDLBfloat, 16, 1};
  } else if (fjr_tensor_is(q, kDLFloat, 16)) {
    *dtype = FJ_DTYPE_F16;
    *dl = (DLDataType){kDLFloat, 16, 1};
  } else {
    char t[32];
    return fjr_fail(ctx, FJ_ETENSOR, "q: dtype %s is not supported (bfloat16 or float16)",
                    fjr_dtype_text(q->dtype, t, sizeof t));
  }
  return FJ_OK;
}
