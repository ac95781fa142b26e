/*
 * runtime/context.c: fj_context: its settings (runtime/options.c), errors,
 * logging, the disk store and mounted packs, and the device (driver and
 * primary context).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/context_impl.h"

void fj_context_options_init(fj_context_options *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof(*opts));
}

static fj_status mount(fj_context *ctx, const char *path) {
  if (ctx->num_packs == FJR_MAX_PACKS)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "too many packs mounted (%d)", FJR_MAX_PACKS);
  char err[1024] = "";
  fjc_pack *pack = NULL;
  fj_status st = fjc_pack_open(path, &pack, err, sizeof(err));
  if (st != FJ_OK) return fjr_fail(ctx, st, "%s", err);
  fjc_pack_set_log(pack, ctx->opts.log, ctx->opts.log_user);
  ctx->packs[ctx->num_packs++] = pack;
  return FJ_OK;
}

fj_status fj_context_create(const fj_context_options *opts, fj_context **out) {
  if (!out) return FJ_EINVAL;
  *out = NULL;
  fj_context *ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return FJ_ENOMEM;
  fj_status st = fjr_options_init(opts, &ctx->opts);
  if (st != FJ_OK) {
    free(ctx);
    return st;
  }
  if (ctx->opts.arch)
    fjg_arch_check(ctx->opts.arch, NULL, ctx->opts.bad, sizeof ctx->opts.bad);
  /* Packs named by FLEXJIT_PACKS: one that does not mount makes every
   * later kernel request fail with its message. */
  for (int i = 0; i < ctx->opts.num_packs && !ctx->opts.bad[0]; i++)
    if (mount(ctx, ctx->opts.packs[i]) != FJ_OK)
      snprintf(ctx->opts.bad, sizeof ctx->opts.bad, "FLEXJIT_PACKS: %.480s", ctx->err);
  ctx->err[0] = '\0';
  *out = ctx;
  return FJ_OK;
}

void fj_context_destroy(fj_context *ctx) {
  if (!ctx) return;
  fj_spec_destroy(ctx->builtin);
  if (ctx->store) fjc_store_close(ctx->store);
  for (int i = 0; i < ctx->num_packs; i++) fjc_pack_close(ctx->packs[i]);
  /* Released once the last counter taken from it is freed. */
  if (ctx->pool_state == 1) ctx->drv->cuMemPoolDestroy(ctx->pool);
  if (ctx->cuctx && ctx->drv) ctx->drv->cuDevicePrimaryCtxRelease(ctx->cudev);
  fjr_options_free(&ctx->opts);
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
  fj_status st = fjr_driver_load(ctx->opts.libcuda_path, &ctx->drv, err, sizeof(err));
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
  d->cuDeviceGetAttribute(&ctx->l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, ctx->cudev);
  if (ctx->l2_bytes < 0) ctx->l2_bytes = 0;
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

/* The context's memory pool (work counters, backward scratch): one that
 * keeps its memory when the caller synchronizes. The device's default pool releases its unused memory
 * at every synchronization (release threshold 0); taking the counters from
 * it put a fresh mapping of memory inside some launches (the sliding
 * window's took up to 0.72 ms instead of a steady 0.513-0.54). NULL when it
 * cannot be made. */
CUmemoryPool fjr_context_pool(fj_context *ctx) {
  if (ctx->pool_state == 0) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = (int)ctx->cudev;
    cuuint64_t keep = UINT64_MAX; /* never hand memory back */
    ctx->pool_state = -1;
    if (ctx->drv->cuMemPoolCreate(&ctx->pool, &props) == CUDA_SUCCESS) {
      ctx->pool_state = 1;
      if (ctx->drv->cuMemPoolSetAttribute(ctx->pool,
                                          CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                          &keep) != CUDA_SUCCESS)
        fjr_log(ctx, FJ_LOG_WARN, "memory pool: it keeps no memory across synchronizations");
    }
  }
  return ctx->pool_state == 1 ? ctx->pool : NULL;
}

fj_status fjr_context_arch(fj_context *ctx, const char **arch) {
  if (ctx->opts.arch) {
    *arch = ctx->opts.arch;
    return FJ_OK;
  }
  fj_status st = fjr_context_device(ctx, NULL);
  if (st != FJ_OK) return st;
  *arch = ctx->device_arch;
  return FJ_OK;
}

fj_status fjr_context_store(fj_context *ctx, fjc_store **store) {
  if (!ctx->store_opened) {
    char err[512] = "";
    ctx->store_opened = 1;
    if (ctx->opts.cache_note[0])
      fjr_log(ctx, FJ_LOG_WARN, "kernel cache disabled: %s; kernels are kept in memory "
              "only", ctx->opts.cache_note);
    fj_status st = fjc_store_open(ctx->opts.cache_dir, ctx->opts.cache_max_bytes,
                                  ctx->opts.log, ctx->opts.log_user, &ctx->store, err,
                                  sizeof(err));
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
  return mount(ctx, path);
}
