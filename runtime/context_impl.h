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
#include "runtime/options.h"

struct fjr_kernel;

struct fj_context {
  fjr_options opts; /* merged from fj_context_options and the environment */
  char err[8192];
  fjc_store *store;
  int store_opened;
  fjc_pack *packs[FJR_MAX_PACKS];
  int num_packs;
  const fjr_driver *drv;
  CUdevice cudev;
  CUcontext cuctx;
  char device_arch[16];
  int max_smem_optin;
  int num_sms; /* multiprocessors: the persistent kernel's grid */
  int l2_bytes; /* the device's L2 cache; 0: unknown */
  /* The memory pool of work counters and backward scratch (created at the
   * first launch that needs one; state 1 ready, -1 could not be made: the
   * device's default pool then). */
  CUmemoryPool pool;
  int pool_state;
  /* A spec without mask or score_mod that holds the spec-independent
   * kernels (runtime/decode.c: the LSE merge, the CSR conversion); made at
   * their first use, destroyed with the context. */
  struct fj_spec *builtin;
};

struct fj_spec {
  fj_context *ctx;
  fjg_graph *graph;
  char *name;
  char *source;
  size_t source_len;
  char *chunkname;
  struct fjr_kernel *kernels; /* the in-process table of this spec */
  /* The forward kernels launched lately, by what a launch decides them
   * from (runtime/forward.c): a launch that finds its own here skips
   * deciding the configuration again. The context's settings, which the
   * decision also reads, do not change. */
  struct fjr_launch_memo {
    int head_dim, dtype, block_q, block_kv;
    int varlen; /* the serving layouts' variant (FJ_VARLEN) */
    int skip;   /* the Skip Softmax variant (FJ_SKIP) */
    int long_rows; /* the long-row variant (fjg_config_set_long_rows) */
    struct fjr_kernel *kernel;
  } launches[4];
  int num_launches;
  /* The last forward launch's long-row estimate (runtime/forward.c), by
   * what it was computed from: a launch of the same sizes and param values
   * takes it without classifying tiles again. */
  struct fjr_long_rows_memo {
    int valid, long_rows;
    int32_t Lq, Lk, q_off, kv_off;
    int32_t i32s[FJG_MAX_ARGS];
    float f32s[FJG_MAX_ARGS];
  } long_rows_memo;
};

void fjr_clear_error(fj_context *ctx);
/* The context's memory pool (see fj_context.pool), NULL when it cannot be
 * made; needs the device (fjr_context_device). */
CUmemoryPool fjr_context_pool(fj_context *ctx);
fj_status fjr_cu_fail(fj_context *ctx, const char *call, CUresult r);
fj_status fjr_context_store(fj_context *ctx, fjc_store **store);

#endif /* FJR_CONTEXT_IMPL_H */
