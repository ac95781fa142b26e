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
#include "runtime/launch_params.h"

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

int main(int argc, char **argv) {
  const char *spec_path = argc > 1 ? argv[1] : FJ_SOURCE_DIR "/examples/causal.lua";
  fj_context *ctx = NULL;
  const fjr_driver *drv = NULL;
  if (fj_context_create(NULL, &ctx) != FJ_OK) return 1;
  if (fjr_context_device(ctx, &drv) != FJ_OK) {
    printf("no GPU: %s\n", fj_context_last_error(ctx));
    fj_context_destroy(ctx);
    return 77;
  }
  /* Make sure the kernel is on disk, then measure a cold process-like load
   * with a second context. */
  fj_spec *spec = NULL;
  CHECK(fj_spec_load_file(ctx, spec_path, &spec));
  fj_kernel_options ko = {128, FJ_DTYPE_BF16, NULL};
  fj_kernel_info info;
  CHECK(fj_compile_forward(ctx, spec, &ko, &info));

  const int B = 1, H = 1, L = 64, D = 128;
  int64_t shape[4] = {B, H, L, D};
  size_t bytes = (size_t)B * H * L * D * 2;
  CUdeviceptr q, k, v, o;
  drv->cuMemAlloc(&q, bytes);
  drv->cuMemAlloc(&k, bytes);
  drv->cuMemAlloc(&v, bytes);
  drv->cuMemAlloc(&o, bytes);
  drv->cuMemsetD8(q, 0x3c, bytes); /* small finite bf16 values */
  drv->cuMemsetD8(k, 0x3c, bytes);
  drv->cuMemsetD8(v, 0x3c, bytes);
  DLDataType bf16 = {kDLBfloat, 16, 1};
  DLTensor tq = tensor4(q, shape, bf16), tk = tensor4(k, shape, bf16),
           tv = tensor4(v, shape, bf16), to = tensor4(o, shape, bf16);
  fj_forward_args a = {&tq, &tk, &tv, &to, NULL, 0.0f, NULL, 0, NULL};

  fj_context *ctx2 = NULL;
  fj_spec *spec2 = NULL;
  fj_context_create(NULL, &ctx2);
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
  printf("warm-disk load: spec load %.2f ms, first launch (key, store read, "
         "module load, launch) %.2f ms, total %.2f ms\n",
         (t1 - t0) / 1e3, (t2 - t1) / 1e3, (t2 - t0) / 1e3);
  fj_spec_destroy(spec2);
  fj_context_destroy(ctx2);

  /* Warm the table. */
  CHECK(fj_attention_forward(ctx, spec, &a));
  drv->cuCtxSynchronize();
  fjr_kernel *kern = spec->kernels;

  enum { N = 2000, ROUNDS = 7 };
  double fj_round[ROUNDS], bare_round[ROUNDS];
  unsigned char pbuf[4096];
  size_t psize = 0;
  {
    /* The same parameter struct the API packs, for a spec without params
     * or buffers (the default, causal). */
    memset(pbuf, 0, sizeof(pbuf));
    fjr_fwd_params_fixed *p = (fjr_fwd_params_fixed *)pbuf;
    p->q = q, p->k = k, p->v = v, p->o = o, p->lse = 0;
    p->q_ss = p->k_ss = p->v_ss = p->o_ss = D;
    p->q_sh = p->k_sh = p->v_sh = p->o_sh = (int64_t)L * D;
    p->q_sb = p->k_sb = p->v_sb = p->o_sb = (int64_t)H * L * D;
    p->sz = (fjr_sizes){B, H, H, L, L};
    p->kv_group = 1;
    p->scale = 1.0f / sqrtf((float)D);
    p->scale_log2 = p->scale * 1.4426950408889634f;
    psize = FJR_FWD_USER_OFFSET + fjg_user_params_size(spec->graph);
  }
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, pbuf,
                   CU_LAUNCH_PARAM_BUFFER_SIZE, &psize, CU_LAUNCH_PARAM_END};
  unsigned grid_x = (unsigned)((L + kern->cfg.block_m - 1) / kern->cfg.block_m);
  for (int r = 0; r < ROUNDS; r++) {
    double s0 = now_us();
    for (int i = 0; i < N; i++) fj_attention_forward(ctx, spec, &a);
    double s1 = now_us();
    drv->cuCtxSynchronize();
    double s2 = now_us();
    for (int i = 0; i < N; i++)
      drv->cuLaunchKernel(kern->fn, grid_x, H, B, kern->cfg.threads, 1, 1,
                          kern->cfg.smem_bytes, NULL, NULL, extra);
    double s3 = now_us();
    drv->cuCtxSynchronize();
    fj_round[r] = (s1 - s0) / N;
    bare_round[r] = (s3 - s2) / N;
  }
  qsort(fj_round, ROUNDS, sizeof(double), cmp_double);
  qsort(bare_round, ROUNDS, sizeof(double), cmp_double);
  printf("per call, median of %d rounds of %d: fj_attention_forward %.3f us, "
         "bare cuLaunchKernel %.3f us, overhead %.3f us\n",
         ROUNDS, N, fj_round[ROUNDS / 2], bare_round[ROUNDS / 2],
         fj_round[ROUNDS / 2] - bare_round[ROUNDS / 2]);
  drv->cuMemFree(q);
  drv->cuMemFree(k);
  drv->cuMemFree(v);
  drv->cuMemFree(o);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  return 0;
}
