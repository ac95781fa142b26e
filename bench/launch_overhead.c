/*
 * bench/launch_overhead.c: host-side cost of the launch path.
 *
 * 1. Warm-disk load: a fresh context finds the kernel in the disk cache
 *    (spec load, key, store read, module load), timed with a host clock.
 * 2. Per-call overhead on a warm in-process table: N fj_attention_forward
 *    calls against N bare cuLaunchKernel calls of the same function with the
 *    same parameters, on a tiny problem so that the GPU queue never blocks
 *    the host. Reported per call.
 *
 * Both templates are measured where the GPU runs them (sm90 needs sm_90a);
 * the sm90 bare launch passes the same prebuilt TMA descriptors.
 *
 * Usage: launch_overhead [SPEC.lua]  (a spec without params or buffers;
 * needs a GPU, exits 77 without one)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flexjit.h"
#include "gen/emit_cuda.h"
#include "runtime/context_impl.h"
#include "runtime/forward.h"
#include "runtime/kernels.h"
#include "runtime/launch_params.h"
#include "runtime/tma.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define CHECK(call)                                                    \
  do {                                                                 \
    fj_status st_ = (call);                                            \
    if (st_ != FJ_OK) {                                                \
      fprintf(stderr, "%s failed: %s\n%s\n", #call, fj_status_name(st_), \
              fj_context_last_error(ctx));                             \
      return 1;                                                        \
    }                                                                  \
  } while (0)

static DLTensor tensor4(CUdeviceptr p, int64_t *shape, DLDataType dt) {
  DLTensor t = {0};
  t.data = (void *)(uintptr_t)p;
  t.device = (DLDevice){kDLCUDA, 0};
  t.ndim = 4;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

enum { B = 1, H = 1, L = 64, D = 128 };

typedef struct bufs {
  CUdeviceptr q, k, v, o;
  int64_t shape[4];
  DLTensor tq, tk, tv, to;
} bufs;

/* Per-call cost of fj_attention_forward against bare cuLaunchKernel, and the
 * warm-disk load of a fresh context, for one template. */
static int measure(const fjr_driver *drv, const char *spec_path,
                   const char *tmpl, bufs *m) {
  fj_context_options opts;
  fj_context_options_init(&opts);
  opts.kernel_template = tmpl;
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  if (fj_context_create(&opts, &ctx) != FJ_OK) return 1;
  fj_forward_args a = {&m->tq, &m->tk, &m->tv, &m->to, NULL, 0.0f,
                       NULL, 0, NULL, NULL};
  /* Put the kernel on disk, then time a fresh context finding it there. */
  CHECK(fj_spec_load_file(ctx, spec_path, &spec));
  fj_kernel_options ko = {.head_dim = D, .dtype = FJ_DTYPE_BF16};
  CHECK(fj_compile_forward(ctx, spec, &ko, NULL));
  {
    fj_context *ctx2 = NULL;
    fj_spec *spec2 = NULL;
    fj_context_create(&opts, &ctx2);
    double t0 = now_us();
    fj_status st = fj_spec_load_file(ctx2, spec_path, &spec2);
    double t1 = now_us();
    if (st == FJ_OK) st = fj_attention_forward(ctx2, spec2, &a);
    double t2 = now_us();
    if (st != FJ_OK) {
      fprintf(stderr, "second context: %s\n", fj_context_last_error(ctx2));
      return 1;
    }
    drv->cuCtxSynchronize();
    printf("[%s] warm-disk load: spec load %.2f ms, first launch (key, store "
           "read, module load, launch) %.2f ms, total %.2f ms\n",
           tmpl, (t1 - t0) / 1e3, (t2 - t1) / 1e3, (t2 - t0) / 1e3);
    fj_spec_destroy(spec2);
    fj_context_destroy(ctx2);
  }
  CHECK(fj_attention_forward(ctx, spec, &a)); /* warms the table */
  drv->cuCtxSynchronize();
  fjr_kernel *kern = spec->kernels;

  /* The same parameters the API packs, for a spec without params or
   * buffers and no block mask. */
  _Alignas(16) unsigned char pbuf[4096];
  memset(pbuf, 0, sizeof(pbuf));
  fjr_fwd_params_fixed *p = (fjr_fwd_params_fixed *)pbuf;
  p->q = m->q, p->k = m->k, p->v = m->v, p->o = m->o, p->lse = 0;
  p->q_ss = p->k_ss = p->v_ss = p->o_ss = D;
  p->q_sh = p->k_sh = p->v_sh = p->o_sh = (int64_t)L * D;
  p->q_sb = p->k_sb = p->v_sb = p->o_sb = (int64_t)H * L * D;
  p->sz = (fjr_sizes){B, H, H, L, L};
  p->kv_group = 1;
  p->scale = 1.0f / sqrtf((float)D);
  p->scale_log2 = p->scale * 1.4426950408889634f;
  size_t psize = FJR_FWD_USER_OFFSET + fjg_user_params_size(spec->graph);
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, pbuf,
                   CU_LAUNCH_PARAM_BUFFER_SIZE, &psize, CU_LAUNCH_PARAM_END};
  _Alignas(128) fjr_tma_maps maps;
  void *kp[] = {pbuf, &maps};
  if (kern->cfg.uses_tma) {
    char err[256];
    if (fjr_tma_maps_build(drv, &kern->cfg, p, NULL, &maps, err, sizeof(err)) !=
        FJ_OK) {
      fprintf(stderr, "tma maps: %s\n", err);
      return 1;
    }
  }
  /* The grid fj_attention_forward launches. The bare launch passes no work
   * counter to the persistent kernel (maps.sched = 0: the static order), so
   * where fj_attention_forward takes one (more items than CTAs) the
   * overhead below includes its allocation, zeroing and free. */
  unsigned grid[3];
  fjr_kernel_grid(&kern->cfg, ctx->num_sms, (L + kern->cfg.block_m - 1) / kern->cfg.block_m, H, B,
                  grid);
  enum { N = 2000, ROUNDS = 7 };
  double fj_round[ROUNDS], bare_round[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    double s0 = now_us();
    for (int i = 0; i < N; i++) fj_attention_forward(ctx, spec, &a);
    double s1 = now_us();
    drv->cuCtxSynchronize();
    double s2 = now_us();
    for (int i = 0; i < N; i++)
      drv->cuLaunchKernel(kern->fn[0], grid[0], grid[1], grid[2], kern->cfg.threads, 1, 1,
                          kern->cfg.smem_bytes, NULL,
                          kern->cfg.uses_tma ? kp : NULL,
                          kern->cfg.uses_tma ? NULL : extra);
    double s3 = now_us();
    drv->cuCtxSynchronize();
    fj_round[r] = (s1 - s0) / N;
    bare_round[r] = (s3 - s2) / N;
  }
  qsort(fj_round, ROUNDS, sizeof(double), cmp_double);
  qsort(bare_round, ROUNDS, sizeof(double), cmp_double);
  printf("[%s%s] per call, median of %d rounds of %d: fj_attention_forward "
         "%.3f us, bare cuLaunchKernel %.3f us, overhead %.3f us\n",
         tmpl, kern->cfg.persistent ? ", persistent" : "", ROUNDS, N,
         fj_round[ROUNDS / 2], bare_round[ROUNDS / 2],
         fj_round[ROUNDS / 2] - bare_round[ROUNDS / 2]);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  return 0;
}

int main(int argc, char **argv) {
  const char *spec_path =
      argc > 1 ? argv[1] : FJ_SOURCE_DIR "/examples/causal.lua";
  fj_context *ctx = NULL;
  const fjr_driver *drv = NULL;
  if (fj_context_create(NULL, &ctx) != FJ_OK) return 1;
  if (fjr_context_device(ctx, &drv) != FJ_OK) {
    printf("no GPU: %s\n", fj_context_last_error(ctx));
    fj_context_destroy(ctx);
    return 77;
  }
  const char *arch = NULL;
  fjr_context_arch(ctx, &arch);
  int hopper = arch && strcmp(arch, "sm_90a") == 0;
  bufs m = {0};
  size_t bytes = (size_t)B * H * L * D * 2;
  drv->cuMemAlloc(&m.q, bytes);
  drv->cuMemAlloc(&m.k, bytes);
  drv->cuMemAlloc(&m.v, bytes);
  drv->cuMemAlloc(&m.o, bytes);
  drv->cuMemsetD8(m.q, 0x3c, bytes); /* small finite bf16 values */
  drv->cuMemsetD8(m.k, 0x3c, bytes);
  drv->cuMemsetD8(m.v, 0x3c, bytes);
  m.shape[0] = B, m.shape[1] = H, m.shape[2] = L, m.shape[3] = D;
  DLDataType bf16 = {kDLBfloat, 16, 1};
  m.tq = tensor4(m.q, m.shape, bf16);
  m.tk = tensor4(m.k, m.shape, bf16);
  m.tv = tensor4(m.v, m.shape, bf16);
  m.to = tensor4(m.o, m.shape, bf16);
  int rc = measure(drv, spec_path, "sm80", &m);
  if (rc == 0 && hopper) rc = measure(drv, spec_path, "sm90", &m);
  drv->cuMemFree(m.q);
  drv->cuMemFree(m.k);
  drv->cuMemFree(m.v);
  drv->cuMemFree(m.o);
  fj_context_destroy(ctx);
  return rc;
}
