/*
 * runtime/tensor.c: tensor and runtime-value checks (see tensor.h).
 */
#include "runtime/tensor.h"

#include <stdio.h>
#include <string.h>

#include "gen/emit_cuda.h"
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
    expect *= t->shape[i];
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

/* A buffer: a non-empty, contiguous, 4-byte aligned 1-D tensor of the
 * declared element type on the context's device. */
static fj_status check_buffer(fj_context *ctx, const fjg_arg *decl,
                              const DLTensor *t, uint64_t *ptr, int64_t *len) {
  char what[96];
  snprintf(what, sizeof what, "buffer '%s'", decl->name);
  DLDataType want = {decl->type == FJG_I32 ? kDLInt : kDLFloat, 32, 1};
  int64_t s[1] = {0};
  fj_status st = fjr_tensor_check(ctx, what, t, 1, want, s);
  if (st != FJ_OK) return st;
  if (s[0] != 1 && t->shape[0] > 1)
    return fjr_fail(ctx, FJ_ETENSOR, "%s: must be contiguous", what);
  if (fjr_tensor_ptr(t) % 4 != 0)
    return fjr_fail(ctx, FJ_ETENSOR, "%s: data must be 4-byte aligned", what);
  *ptr = fjr_tensor_ptr(t);
  *len = t->shape[0];
  return FJ_OK;
}

fj_status fjr_args_declared(fj_context *ctx, const char *who, const fjg_graph *g,
                            const fj_arg *args, int num_args) {
  if (num_args < 0 || (num_args > 0 && !args))
    return fjr_fail(ctx, FJ_EINVAL, "the runtime values: bad args array");
  if (fjg_num_args(g) > FJG_MAX_ARGS)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "spec '%s' declares more than %d params "
                    "and buffers", who, FJG_MAX_ARGS);
  for (int i = 0; i < num_args; i++)
    if (!args[i].name || fjg_find_arg(g, args[i].name) < 0)
      return fjr_fail(ctx, FJ_EINVAL, "spec '%s' declares no param or buffer named '%s'",
                      who, args[i].name ? args[i].name : "(null)");
  return FJ_OK;
}

const fj_arg *fjr_arg_given(const fj_arg *args, int num_args, const char *name) {
  const fj_arg *given = NULL;
  for (int i = 0; i < num_args; i++)
    if (!strcmp(args[i].name, name)) given = &args[i];
  return given;
}

int fjr_param_values(const fjg_graph *g, const fj_arg *args, int num_args, int32_t *i32s,
                     float *f32s) {
  int missing = -1;
  for (int a = 0; a < fjg_num_args(g); a++) {
    const fjg_arg *decl = fjg_arg_at(g, a);
    const fj_arg *given = decl->kind == FJ_ARG_BUFFER
                              ? NULL
                              : fjr_arg_given(args, num_args, decl->name);
    i32s[a] = given && decl->kind == FJ_ARG_I32 ? given->i32 : 0;
    f32s[a] = given && decl->kind == FJ_ARG_F32 ? given->f32 : 0.f;
    if (!given && decl->kind != FJ_ARG_BUFFER && missing < 0) missing = a;
  }
  return missing;
}

fjg_env fjr_launch_env(const fjr_sizes *sz, const int32_t *i32s, const float *f32s) {
  return (fjg_env){.sizes = {sz->B, sz->Hq, sz->Hkv, sz->Lq, sz->Lk},
                   .q_off = sz->q_off,
                   .kv_off = sz->kv_off,
                   .param_i32 = i32s,
                   .param_f32 = f32s};
}

fj_status fjr_bind_args(fj_context *ctx, const char *who, const fjg_graph *g,
                        const fj_arg *args, int num_args, void *dst) {
  const int n = fjg_num_args(g);
  int32_t i32s[FJG_MAX_ARGS];
  float f32s[FJG_MAX_ARGS];
  uint64_t ptrs[FJG_MAX_ARGS];
  int64_t lens[FJG_MAX_ARGS];
  fj_status st = fjr_args_declared(ctx, who, g, args, num_args);
  if (st != FJ_OK) return st;
  if (n == 0 && num_args == 0) return FJ_OK;
  memset(i32s, 0, sizeof i32s[0] * (size_t)n);
  memset(f32s, 0, sizeof f32s[0] * (size_t)n);
  memset(ptrs, 0, sizeof ptrs[0] * (size_t)n);
  memset(lens, 0, sizeof lens[0] * (size_t)n);
  for (int a = 0; a < n; a++) {
    const fjg_arg *decl = fjg_arg_at(g, a);
    const fj_arg *given = fjr_arg_given(args, num_args, decl->name);
    if (!given)
      return fjr_fail(ctx, FJ_EINVAL, "spec '%s' needs %s '%s' but no value was given",
                      who, decl->kind == FJ_ARG_BUFFER ? "buffer" : "param",
                      decl->name);
    if (decl->kind == FJ_ARG_I32) i32s[a] = given->i32;
    if (decl->kind == FJ_ARG_F32) f32s[a] = given->f32;
    if (decl->kind == FJ_ARG_BUFFER &&
        (st = check_buffer(ctx, decl, given->buffer, &ptrs[a], &lens[a])) != FJ_OK)
      return st;
  }
  fjg_user_params_pack(g, i32s, f32s, ptrs, lens, dst);
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
