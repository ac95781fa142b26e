/*
 * runtime/args.c: a launch's runtime values (see args.h).
 */
#include "runtime/args.h"

#include <stdio.h>
#include <string.h>

#include "gen/emit_cuda.h"
#include "runtime/context_impl.h"
#include "runtime/tensor.h"

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
