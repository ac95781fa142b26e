/*
 * runtime/spec.c: fj_spec: loading a spec (the Lua trace, lua/spec.c), its
 * runtime-value declarations, and its kernel table's lifetime.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua/spec.h"
#include "runtime/context_impl.h"
#include "runtime/kernels.h"

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

const fjg_graph *fjr_spec_graph(const fj_spec *spec) { return spec->graph; }
