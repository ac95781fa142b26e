/*
 * runtime/spec.c: fj_spec: loading a spec (the Lua trace, lua/spec.c), its
 * runtime-value declarations, and its kernel table's lifetime.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/interval.h"
#include "lua/spec.h"
#include "runtime/args.h"
#include "runtime/context_impl.h"
#include "runtime/kernels.h"
#include "runtime/serving.h"

static fj_status spec_from_source(fj_context *ctx, const char *source,
                                  size_t len, const char *chunkname,
                                  fj_spec **out) {
  fj_spec *spec = calloc(1, sizeof(*spec));
  if (!spec) return fjr_fail(ctx, FJ_ENOMEM, "out of memory loading a spec");
  spec->ctx = ctx;
  spec->source = malloc(len + 1);
  spec->chunkname = strdup(chunkname ? chunkname : "spec");
  if (!spec->source || !spec->chunkname) {
    fj_spec_destroy(spec);
    return fjr_fail(ctx, FJ_ENOMEM, "out of memory loading a spec");
  }
  memcpy(spec->source, source, len);
  spec->source[len] = '\0';
  spec->source_len = len;
  char err[2048] = "";
  fj_status st = fjl_trace_spec(spec->source, len, spec->chunkname,
                                &spec->graph, &spec->name, err, sizeof(err));
  if (st != FJ_OK) {
    fj_spec_destroy(spec);
    return fjr_fail(ctx, st, "%s", err);
  }
  *out = spec;
  return FJ_OK;
}

fj_status fj_spec_load_string(fj_context *ctx, const char *source, size_t len,
                              const char *chunkname, fj_spec **out) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!out || !source)
    return fjr_fail(ctx, FJ_EINVAL, "fj_spec_load_string: NULL argument");
  *out = NULL;
  return spec_from_source(ctx, source, len, chunkname, out);
}

fj_status fj_spec_load_file(fj_context *ctx, const char *path, fj_spec **out) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!out || !path)
    return fjr_fail(ctx, FJ_EINVAL, "fj_spec_load_file: NULL argument");
  *out = NULL;
  fj_status st = FJ_OK;
  char *buf = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return fjr_fail(ctx, FJ_EIO, "%s: %s", path, strerror(errno));
  size_t cap = 4096, len = 0;
  buf = malloc(cap);
  if (!buf) {
    st = fjr_fail(ctx, FJ_ENOMEM, "out of memory reading %s", path);
    goto fail;
  }
  for (;;) {
    size_t n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (n == 0) break;
    if (len == cap) {
      if (cap >= (16u << 20)) {
        st = fjr_fail(ctx, FJ_EIO, "%s: spec larger than 16 MiB", path);
        goto fail;
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        st = fjr_fail(ctx, FJ_ENOMEM, "out of memory reading %s", path);
        goto fail;
      }
      buf = nb;
      cap *= 2;
    }
  }
  if (ferror(f)) {
    st = fjr_fail(ctx, FJ_EIO, "%s: read error", path);
    goto fail;
  }
  st = spec_from_source(ctx, buf, len, path, out);
fail:
  free(buf);
  fclose(f);
  return st;
}

void fj_spec_destroy(fj_spec *spec) {
  if (!spec) return;
  if (spec->ctx) fjr_kernels_release(spec->ctx, spec->kernels);
  if (spec->graph) fjg_graph_destroy(spec->graph);
  free(spec->name);
  free(spec->source);
  free(spec->chunkname);
  free(spec);
}

const char *fj_spec_name(const fj_spec *spec) {
  return spec ? spec->name : NULL;
}

unsigned fj_spec_mask_deps(const fj_spec *spec) {
  const int root = spec ? fjg_mask_root(spec->graph) : -1;
  if (root < 0) return 0;
  const unsigned in = fjg_input_deps(spec->graph, root);
  return (fjg_mask_is_index_only(spec->graph) ? 0u : FJ_MASK_READS_BUFFER) |
         (in & (1u << FJG_IN_B) ? FJ_MASK_READS_B : 0u) |
         (in & (1u << FJG_IN_H) ? FJ_MASK_READS_H : 0u);
}

int fj_spec_num_args(const fj_spec *spec) {
  return spec ? fjg_num_args(spec->graph) : 0;
}

fj_status fj_spec_arg_info(const fj_spec *spec, int index, const char **name,
                           fj_arg_kind *kind) {
  if (!spec || index < 0 || index >= fjg_num_args(spec->graph))
    return FJ_EINVAL;
  const fjg_arg *a = fjg_arg_at(spec->graph, index);
  if (name) *name = a->name;
  if (kind) *kind = a->kind;
  return FJ_OK;
}

fj_status fj_spec_arg_dtype(const fj_spec *spec, int index, DLDataType *dtype) {
  if (!spec || !dtype || index < 0 || index >= fjg_num_args(spec->graph))
    return FJ_EINVAL;
  const fjg_arg *a = fjg_arg_at(spec->graph, index);
  *dtype = (DLDataType){a->type == FJG_I32 ? kDLInt : kDLFloat, 32, 1};
  return FJ_OK;
}

fj_status fj_spec_arg_trainable(const fj_spec *spec, int index, int *trainable) {
  if (!spec || !trainable || index < 0 || index >= fjg_num_args(spec->graph))
    return FJ_EINVAL;
  *trainable = fjg_arg_at(spec->graph, index)->trainable ? 1 : 0;
  return FJ_OK;
}

fj_status fj_spec_block_class(const fj_spec *spec, const fj_arg *args, int num_args,
                              const fj_block_query *query, int *out_class) {
  if (!spec || !query || !out_class || num_args < 0 || (num_args > 0 && !args))
    return FJ_EINVAL;
  fj_context *ctx = spec->ctx;
  const fj_block_query *b = query;
  const int64_t lim = INT32_MAX;
  if (b->B < 1 || b->Hq < 1 || b->Hkv < 1 || b->Lq < 1 || b->Lk < 1 || b->B > lim ||
      b->Hq > lim || b->Hkv > lim || b->Lq > lim || b->Lk > lim)
    return fjr_fail(ctx, FJ_EINVAL,
                    "fj_spec_block_class: sizes B %lld, Hq %lld, Hkv %lld, Lq %lld, Lk %lld "
                    "must be 1 to 2^31 - 1",
                    (long long)b->B, (long long)b->Hq, (long long)b->Hkv, (long long)b->Lq,
                    (long long)b->Lk);
  if (b->q0 < 0 || b->q0 > b->q1 || b->q1 >= b->Lq || b->kv0 < 0 || b->kv0 > b->kv1 ||
      b->kv1 >= b->Lk)
    return fjr_fail(ctx, FJ_EINVAL,
                    "fj_spec_block_class: rows q %lld..%lld, kv %lld..%lld outside Lq %lld, "
                    "Lk %lld (or empty)",
                    (long long)b->q0, (long long)b->q1, (long long)b->kv0, (long long)b->kv1,
                    (long long)b->Lq, (long long)b->Lk);
  const fjg_graph *g = spec->graph;
  /* The offsets by the launches' rule (a spec that reads Lq or Lk is
   * refused with them, as the kernels refuse it). */
  fjr_sizes sz = {(int32_t)b->B, (int32_t)b->Hq, (int32_t)b->Hkv, (int32_t)b->Lq,
                  (int32_t)b->Lk, 0, 0};
  fj_status st = fjr_offsets_bind(ctx, g, b->q_offset, b->kv_offset, 0, &sz);
  if (st != FJ_OK) return st;
  int32_t i32s[FJG_MAX_ARGS];
  float f32s[FJG_MAX_ARGS];
  if ((st = fjr_args_declared(ctx, spec->name, g, args, num_args)) != FJ_OK) return st;
  const int missing = fjr_param_values(g, args, num_args, i32s, f32s);
  if (missing >= 0)
    return fjr_fail(ctx, FJ_EINVAL, "spec '%s' needs param '%s' but no value was given",
                    spec->name, fjg_arg_at(g, missing)->name);
  const fjg_env env = fjr_launch_env(&sz, i32s, f32s);
  /* EMPTY (or FULL) only when every (b, h) is; a mixed or PARTIAL one
   * decides the block. */
  int cls = -1;
  for (int64_t bi = 0; bi < b->B; bi++)
    for (int64_t h = 0; h < b->Hq; h++) {
      const int c = fjg_tile_class_cpu(g, &env, (int)bi, (int)h, (int)b->q0, (int)b->q1,
                                       (int)b->kv0, (int)b->kv1);
      if (cls < 0) cls = c;
      if (c != cls || c == FJG_TILE_PARTIAL) {
        *out_class = FJ_BLOCK_PARTIAL;
        return FJ_OK;
      }
    }
  *out_class = cls == FJG_TILE_EMPTY ? FJ_BLOCK_EMPTY : FJ_BLOCK_FULL;
  return FJ_OK;
}

const fjg_graph *fjr_spec_graph(const fj_spec *spec) { return spec->graph; }
