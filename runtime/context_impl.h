/*
 * runtime/context_impl.h: the layout of fj_context and fj_spec, private to
 * runtime/ (other modules use runtime/context.h).
 */
#ifndef FJR_CONTEXT_IMPL_H
#define FJR_CONTEXT_IMPL_H

#include <cuda.h>

#include "cache/key.h"
#include "cache/pack.h"
#include "cache/store.h"
#include "gen/config.h"
#include "runtime/context.h"

/* A kernel resident in this process: compiled or loaded, bound to a spec. */
typedef struct fjr_kernel {
  int head_dim;
  fj_dtype dtype;
  fjg_config cfg;
  fjc_key source_key; /* everything but the NVRTC version */
  fjc_key key;        /* source key + NVRTC version */
  CUmodule module; /* NULL until first launched */
  CUfunction fn;
  void *cubin; /* owned until loaded */
  size_t cubin_size;
  struct fjr_kernel *next;
} fjr_kernel;

struct fj_context {
  fj_context_options opts; /* cache_dir and arch live below */
  char *cache_dir;
  char *arch_opt;
  char *template_opt; /* option, else $FLEXJIT_TEMPLATE, else NULL */
  int persistent_opt; /* $FLEXJIT_PERSISTENT: 1, 0, or -1 (the default) */
  int stages_opt;     /* $FLEXJIT_STAGES: sm90 K/V stages, 0: the default */
  int consumers_opt;  /* $FLEXJIT_CONSUMERS: 2, 3, 0 (unset), -1 (neither) */
  char consumers_env[16]; /* its text as read (for errors), truncated */
  int fast_compile;   /* $FLEXJIT_FAST_COMPILE=1: NVRTC --Ofast-compile=max */
  char *kernel_defines; /* $FLEXJIT_KERNEL_DEFINES, checked when compiling */
  char err[8192];
  fjc_store *store;
  int store_opened;
  fjc_pack *packs[16];
  int num_packs;
  const fjr_driver *drv;
  CUdevice cudev;
  CUcontext cuctx;
  char device_arch[16];
  int max_smem_optin;
  int num_sms; /* multiprocessors: the persistent kernel's grid */
  /* The persistent kernel's work counters come from this pool (created at
   * the first launch that needs one; state 1 ready, -1 could not be made:
   * the device's default pool then). */
  CUmemoryPool counter_pool;
  int counter_pool_state;
};

struct fj_spec {
  fj_context *ctx;
  fjg_graph *graph;
  char *name;
  char *source;
  size_t source_len;
  char *chunkname;
  fjr_kernel *kernels; /* the in-process table of this spec */
};

void fjr_clear_error(fj_context *ctx);
fj_status fjr_cu_fail(fj_context *ctx, const char *call, CUresult r);
fj_status fjr_context_store(fj_context *ctx, fjc_store **store);
void fjr_spec_kernels_release(fj_spec *spec);

#endif /* FJR_CONTEXT_IMPL_H */
