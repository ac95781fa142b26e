/*
 * runtime/context.c: fj_context and fj_spec: options, errors, logging, spec
 * loading and the device (driver + primary context).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/prune.h"
#include "runtime/context_impl.h"
#include "lua/spec.h"

void fj_context_options_init(fj_context_options *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof(*opts));
}

static char *dup_or_null(const char *s) {
  return s ? strdup(s) : NULL;
}

fj_status fj_context_create(const fj_context_options *opts, fj_context **out) {
  if (!out) return FJ_EINVAL;
  *out = NULL;
  fj_context *ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return FJ_ENOMEM;
  if (opts) ctx->opts = *opts;
  ctx->opts.cache_dir = NULL;
  ctx->opts.arch = NULL;
  ctx->opts.kernel_template = NULL;
  const char *tmpl = opts ? opts->kernel_template : NULL;
  if (!tmpl || !*tmpl) tmpl = getenv("FLEXJIT_TEMPLATE");
  if (tmpl && !*tmpl) tmpl = NULL;
  ctx->cache_dir = dup_or_null(opts ? opts->cache_dir : NULL);
  ctx->arch_opt = dup_or_null(opts ? opts->arch : NULL);
  ctx->template_opt = dup_or_null(tmpl);
  /* FLEXJIT_PERSISTENT=1 / =0 asks for (or against) the persistent sm90
   * kernel; unset or anything else: the configuration's default (-1). */
  const char *pe = getenv("FLEXJIT_PERSISTENT");
  ctx->persistent_opt = pe && !strcmp(pe, "1") ? 1 : pe && !strcmp(pe, "0") ? 0 : -1;
  /* FLEXJIT_STAGES=N: the sm90 kernel's K/V pipeline depth (tuning and
   * ablation); a depth that does not fit is refused when a kernel is made. */
  const char *ns = getenv("FLEXJIT_STAGES");
  ctx->stages_opt = ns && ns[0] >= '2' && ns[0] <= '9' && !ns[1] ? ns[0] - '0' : 0;
  /* FLEXJIT_CONSUMERS=2|3: the sm90 kernel's consumer warpgroups (3 at head
   * dim 64 only); another value is refused when a kernel is made. */
  const char *nc = getenv("FLEXJIT_CONSUMERS");
  ctx->consumers_opt = !nc || !*nc ? 0 : !strcmp(nc, "2") ? 2 : !strcmp(nc, "3") ? 3 : -1;
  snprintf(ctx->consumers_env, sizeof ctx->consumers_env, "%s", nc ? nc : "");
  /* FLEXJIT_FAST_COMPILE=1: NVRTC's --Ofast-compile=max (runtime/forward.c). */
  const char *fc = getenv("FLEXJIT_FAST_COMPILE");
  ctx->fast_compile = fc && !strcmp(fc, "1");
  /* FLEXJIT_KERNEL_DEFINES: optional template macros (runtime/forward.c,
   * compile_options, says which are accepted). */
  const char *kd = getenv("FLEXJIT_KERNEL_DEFINES");
  ctx->kernel_defines = kd && *kd ? strdup(kd) : NULL;
  if ((opts && opts->cache_dir && !ctx->cache_dir) ||
      (opts && opts->arch && !ctx->arch_opt) || (tmpl && !ctx->template_opt) ||
      (kd && *kd && !ctx->kernel_defines)) {
    fj_context_destroy(ctx);
    return FJ_ENOMEM;
  }
  if (ctx->opts.device < 0) {
    fj_context_destroy(ctx);
    return FJ_EINVAL;
  }
  *out = ctx;
  return FJ_OK;
}

void fj_context_destroy(fj_context *ctx) {
  if (!ctx) return;
  if (ctx->store) fjc_store_close(ctx->store);
  for (int i = 0; i < ctx->num_packs; i++) fjc_pack_close(ctx->packs[i]);
  /* Released once the last counter taken from it is freed. */
  if (ctx->counter_pool_state == 1) ctx->drv->cuMemPoolDestroy(ctx->counter_pool);
  if (ctx->cuctx && ctx->drv) ctx->drv->cuDevicePrimaryCtxRelease(ctx->cudev);
  free(ctx->cache_dir);
  free(ctx->arch_opt);
  free(ctx->template_opt);
  free(ctx->kernel_defines);
  free(ctx);
}

const char *fj_context_last_error(const fj_context *ctx) {
  return ctx ? ctx->err : "no context";
}

fj_status fjr_fail(fj_context *ctx, fj_status status, const char *fmt, ...) {
  if (!ctx) return status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
  va_end(ap);
  return status;
}

void fjr_log(fj_context *ctx, fj_log_level level, const char *fmt, ...) {
  if (!ctx || !ctx->opts.log) return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  ctx->opts.log(ctx->opts.log_user, level, msg);
}

void fjr_clear_error(fj_context *ctx) {
  if (ctx) ctx->err[0] = '\0';
}

/* Text of a CUresult for messages. */
static void cu_text(fj_context *ctx, CUresult r, char *buf, size_t n) {
  fjr_driver_error_text(ctx->drv, r, buf, n);
}

fj_status fjr_cu_fail(fj_context *ctx, const char *call, CUresult r) {
  char text[256];
  cu_text(ctx, r, text, sizeof(text));
  return fjr_fail(ctx, FJ_ECUDA, "%s failed: %s", call, text);
}

fj_status fjr_context_device(fj_context *ctx, const fjr_driver **drv) {
  if (ctx->cuctx) {
    /* Keep the primary context current on whatever thread calls us. */
    CUcontext cur = NULL;
    if (ctx->drv->cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != ctx->cuctx) {
      CUresult r = ctx->drv->cuCtxSetCurrent(ctx->cuctx);
      if (r != CUDA_SUCCESS) return fjr_cu_fail(ctx, "cuCtxSetCurrent", r);
    }
    if (drv) *drv = ctx->drv;
    return FJ_OK;
  }
  char err[512];
  fj_status st = fjr_driver_load(&ctx->drv, err, sizeof(err));
  if (st != FJ_OK) {
    ctx->drv = NULL;
    return fjr_fail(ctx, st, "%s", err);
  }
  const fjr_driver *d = ctx->drv;
  int count = 0;
  CUresult r = d->cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return fjr_cu_fail(ctx, "cuDeviceGetCount", r);
  if (ctx->opts.device >= count)
    return fjr_fail(ctx, FJ_ENODRIVER,
                    "CUDA device %d requested but %d device(s) present",
                    ctx->opts.device, count);
  r = d->cuDeviceGet(&ctx->cudev, ctx->opts.device);
  if (r != CUDA_SUCCESS) return fjr_cu_fail(ctx, "cuDeviceGet", r);
  int major = 0, minor = 0;
  d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                          ctx->cudev);
  d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                          ctx->cudev);
  /* Hopper's and Blackwell's arch-specific features need the "a" target. */
  snprintf(ctx->device_arch, sizeof(ctx->device_arch), "sm_%d%d%s", major,
           minor, (major == 9 || major == 10) ? "a" : "");
  d->cuDeviceGetAttribute(&ctx->max_smem_optin,
                          CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                          ctx->cudev);
  d->cuDeviceGetAttribute(&ctx->num_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                          ctx->cudev);
  if (ctx->num_sms < 1) ctx->num_sms = 1;
  r = d->cuDevicePrimaryCtxRetain(&ctx->cuctx, ctx->cudev);
  if (r != CUDA_SUCCESS) {
    ctx->cuctx = NULL;
    return fjr_cu_fail(ctx, "cuDevicePrimaryCtxRetain", r);
  }
  r = d->cuCtxSetCurrent(ctx->cuctx);
  if (r != CUDA_SUCCESS) return fjr_cu_fail(ctx, "cuCtxSetCurrent", r);
  if (drv) *drv = d;
  return FJ_OK;
}

fj_status fjr_context_arch(fj_context *ctx, const char **arch) {
  if (ctx->arch_opt) {
    *arch = ctx->arch_opt;
    return FJ_OK;
  }
  fj_status st = fjr_context_device(ctx, NULL);
  if (st != FJ_OK) return st;
  *arch = ctx->device_arch;
  return FJ_OK;
}

fj_status fjr_context_store(fj_context *ctx, fjc_store **store) {
  if (!ctx->store_opened) {
    char err[512] = "", buf[4096];
    const char *why = NULL, *root = ctx->cache_dir;
    ctx->store_opened = 1;
    /* The root: the option, else FLEXJIT_CACHE_DIR, XDG_CACHE_HOME, HOME.
     * The limit: the option, else FLEXJIT_CACHE_MAX_BYTES (a bad value is
     * a warning: a typo in the environment never stops an application). */
    if (!root)
      root = fjc_store_default_root(getenv("FLEXJIT_CACHE_DIR"),
                                    getenv("XDG_CACHE_HOME"), getenv("HOME"),
                                    buf, sizeof buf, &why);
    if (why)
      fjr_log(ctx, FJ_LOG_WARN, "kernel cache disabled: %s; kernels are kept "
              "in memory only", why);
    uint64_t max = ctx->opts.cache_max_bytes;
    const char *env = getenv("FLEXJIT_CACHE_MAX_BYTES");
    if (!max && env && env[0] && fjc_parse_size(env, &max) != 0) {
      fjr_log(ctx, FJ_LOG_WARN, "ignoring FLEXJIT_CACHE_MAX_BYTES='%s': "
              "expected a byte count such as 500000000, 500M or 2G", env);
      max = 0;
    }
    fj_status st = fjc_store_open(root, max, ctx->opts.log, ctx->opts.log_user,
                                  &ctx->store, err, sizeof(err));
    if (st != FJ_OK) {
      /* No disk cache: keep going in memory only. */
      ctx->store = NULL;
      fjr_log(ctx, FJ_LOG_WARN, "kernel cache disabled: %s", err);
    }
  }
  *store = ctx->store;
  return FJ_OK;
}

fj_status fj_context_mount_pack(fj_context *ctx, const char *path) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!path) return fjr_fail(ctx, FJ_EINVAL, "pack path is NULL");
  if (ctx->num_packs == (int)(sizeof(ctx->packs) / sizeof(ctx->packs[0])))
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "too many packs mounted (16)");
  char err[1024] = "";
  fjc_pack *pack = NULL;
  fj_status st = fjc_pack_open(path, &pack, err, sizeof(err));
  if (st != FJ_OK) return fjr_fail(ctx, st, "%s", err);
  fjc_pack_set_log(pack, ctx->opts.log, ctx->opts.log_user);
  ctx->packs[ctx->num_packs++] = pack;
  return FJ_OK;
}

/* ---- specs ---- */

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
  if (!spec->name) spec->name = strdup(spec->chunkname);
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
  if (spec->ctx) fjr_spec_kernels_release(spec);
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

const fjg_graph *fjr_spec_graph(const fj_spec *spec) { return spec->graph; }

const char *fjr_spec_source(const fj_spec *spec, size_t *len) {
  if (len) *len = spec->source_len;
  return spec->source;
}
