/*
 * tests/gpu/test_blockmask.c: block masks on the GPU.
 *
 *  1. The GPU builder (fj_block_mask_build / _update) writes exactly the
 *     arrays of the CPU builder (gen/blockmask_cpu.c) for document masks
 *     with random document ids, sliding window, prefix-LM, chunked and
 *     head/batch-dependent masks, B/H broadcast or not, odd sizes and block
 *     shapes.
 *  2. The forward kernel launched with a block mask matches the float64
 *     reference (fjg_ref_check) for document masks at several sizes, dtypes
 *     and head dims, with broadcast and per-head masks and blocks larger
 *     than the kernel's tiles; a mask that does not fit the launch is
 *     refused with FJ_EINVAL.
 *  3. Timing: rebuilding the document block mask at 16384 x 16384 (median
 *     of CUDA-event timings, printed), and the first build's wall time.
 *
 * Exits 77 (skipped) without a GPU; 1 when any case fails.
 */
#include <stdarg.h>
#include <time.h>

#include "gen/blockmask_cpu.h"
#include "gpu/gpu_util.h"

static const char *const kSpecs[][2] = {
    {"document", "return { mask_mod = document(buffer(\"doc\", \"i32\")) }"},
    {"doc_bidir", "return { mask_mod = document(buffer(\"doc\", \"i32\"),"
                  " {causal = false}) }"},
    {"doc_window", "return { mask_mod = and_masks(document(buffer(\"doc\","
                   " \"i32\")), sliding_window(param(\"window\", \"i32\"))) }"},
    {"sliding_window",
     "return { mask_mod = sliding_window(param(\"window\", \"i32\")) }"},
    {"prefix_lm", "return { mask_mod = prefix_lm(param(\"prefix\", \"i32\")) }"},
    {"chunked", "return { mask_mod = chunked(100) }"},
    {"per_head", "return { mask_mod = function(b, h, q, kv)\n"
                 "  return ge(q + h * 37 - b * 51, kv) end }"},
    /* float32 masks: with blocks of 1 x 1 the two builders compare fj_mask
     * on the GPU with the CPU evaluator element by element (exact: the
     * emitter's __f*_rn arithmetic is never contracted). */
    {"f32_q49", "return { mask_mod = function(b, h, q, kv)\n"
                "  return lt(q / 49.0 * 49.0, q) | lt(q * 0.1 + kv * 0.3, 7.0)"
                " end }"},
    {"f32_mix", "return { mask_mod = function(b, h, q, kv)\n"
                "  return lt((q * 0.7 + kv * 0.3) % 5.5 * 1.3,"
                " kv // 3.0 / 7.0 + 0.25) end }"},
};
#define NSPECS ((int)(sizeof kSpecs / sizeof kSpecs[0]))

static fj_spec *specs[NSPECS];
static int passed, failed;

static void report(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("  %s\n", ok ? "PASS" : "FAIL");
  ok ? passed++ : failed++;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* ---- 1. GPU builder == CPU builder ---- */

static const char *const kArrayNames[8] = {
    "kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
    "q_num_blocks",  "q_indices",  "full_q_num_blocks",  "full_q_indices"};

static int same_arrays(fj_context *ctx, fj_block_mask *gm,
                       const fjg_block_mask_host *cm) {
  int32_t *cpu[8];
  fjg_block_mask_arrays(cm, cpu);
  for (int a = 0; a < 8; a++) {
    size_t n = 0;
    fj_block_mask_array_device(gm, (fj_block_mask_array)a, NULL, &n);
    int32_t *x = malloc(4 * n);
    if (!x || fj_block_mask_download(gm, (fj_block_mask_array)a, x, n) !=
                  FJ_OK) {
      printf("\n      download failed: %s", fj_context_last_error(ctx));
      free(x);
      return 0;
    }
    for (size_t i = 0; i < n; i++)
      if (x[i] != cpu[a][i]) {
        printf("\n      %s[%zu]: GPU %d, CPU %d", kArrayNames[a], i, x[i],
               cpu[a][i]);
        free(x);
        return 0;
      }
    free(x);
  }
  return 1;
}

typedef struct bm_case {
  int spec, B, H, Lq, Lk, bq, bk;
} bm_case;

static void builder_case(fj_context *ctx, const fjr_driver *drv,
                         const bm_case *c, uint64_t seed) {
  gpu_values v;
  fjg_block_mask_host cm;
  fj_block_mask *gm = NULL;
  memset(&cm, 0, sizeof cm);
  int ok = gpu_values_fill(drv, specs[c->spec], c->H, c->Lq, c->Lk, &seed, &v);
  fj_block_mask_options o;
  fj_block_mask_options_init(&o);
  o.B = c->B, o.H = c->H, o.q_len = c->Lq, o.kv_len = c->Lk;
  o.block_q = c->bq, o.block_kv = c->bk;
  o.args = v.args, o.num_args = v.n;
  if (ok && fj_block_mask_build(ctx, specs[c->spec], &o, &gm) != FJ_OK) {
    printf("      build failed: %s\n", fj_context_last_error(ctx));
    ok = 0;
  }
  printf("[build] %-14s B%d H%d %5dx%-5d blocks %3dx%-3d", kSpecs[c->spec][0],
         c->B, c->H, c->Lq, c->Lk, c->bq ? c->bq : 128, c->bk ? c->bk : 128);
  ok = ok && fjg_block_mask_cpu_build(fjr_spec_graph(specs[c->spec]), &v.env,
                                      c->B, c->H, c->Lq, c->Lk,
                                      c->bq ? c->bq : 128, c->bk ? c->bk : 128,
                                      &cm) == FJ_OK;
  ok = ok && same_arrays(ctx, gm, &cm);
  fjg_block_mask_host_free(&cm);
  /* Update in place with new values (new document ids): same again. */
  gpu_values w;
  memset(&w, 0, sizeof w);
  if (ok && fj_spec_num_args(specs[c->spec]) > 0) {
    ok = gpu_values_fill(drv, specs[c->spec], c->H, c->Lq, c->Lk, &seed, &w) &&
         fj_block_mask_update(gm, w.args, w.n, NULL) == FJ_OK &&
         fjg_block_mask_cpu_build(fjr_spec_graph(specs[c->spec]), &w.env, c->B,
                                  c->H, c->Lq, c->Lk, c->bq ? c->bq : 128,
                                  c->bk ? c->bk : 128, &cm) == FJ_OK &&
         same_arrays(ctx, gm, &cm);
    fjg_block_mask_host_free(&cm);
  }
  report(ok, "");
  fj_block_mask_destroy(gm);
  gpu_values_free(drv, &v);
  gpu_values_free(drv, &w);
}

static void test_builder(fj_context *ctx, const fjr_driver *drv) {
  static const bm_case cases[] = {
      {0, 1, 1, 1000, 1000, 0, 0},    {0, 1, 1, 2048, 2048, 64, 64},
      {0, 1, 1, 777, 1300, 32, 96},   {0, 2, 4, 300, 300, 16, 16},
      {1, 1, 1, 1500, 1500, 0, 0},    {2, 1, 1, 1024, 1024, 16, 32},
      {3, 1, 1, 1000, 1000, 0, 0},    {3, 1, 1, 129, 4097, 64, 128},
      {4, 1, 1, 1000, 999, 16, 16},   {5, 1, 1, 1000, 1000, 7, 13},
      {6, 2, 3, 500, 500, 32, 32},    {6, 1, 1, 500, 500, 32, 32},
      {0, 1, 1, 1, 1, 0, 0},          {0, 1, 1, 5000, 5000, 128, 128},
      {7, 1, 1, 300, 300, 1, 1},      {8, 1, 1, 300, 300, 1, 1},
      {8, 1, 1, 1000, 1000, 16, 16},
  };
  uint64_t seed = 0xb10c;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    builder_case(ctx, drv, &cases[i], seed + i);
}

/* ---- 2. forward with a block mask == reference ---- */

typedef struct fwd_case {
  int spec;
  fj_dtype dt;
  int D, B, Hq, Hkv, Lq, Lk;
  int mB, mH, bq, bk; /* block mask extents and blocks */
} fwd_case;

typedef struct fwd_io {
  double *q, *k, *v, *ro, *rl;
  float *o, *lse, *lo, *ll;
  gpu_tensor dq, dk, dv, dout, dlse;
  gpu_values vals;
} fwd_io;

static void fwd_free(const fjr_driver *drv, fwd_io *io) {
  free(io->q), free(io->k), free(io->v), free(io->ro), free(io->rl);
  free(io->o), free(io->lse), free(io->lo), free(io->ll);
  gpu_free(drv, &io->dq), gpu_free(drv, &io->dk), gpu_free(drv, &io->dv);
  gpu_free(drv, &io->dout), gpu_free(drv, &io->dlse);
  gpu_values_free(drv, &io->vals);
}

static int fwd_setup(const fjr_driver *drv, const fwd_case *c, uint64_t s,
                     fwd_io *io) {
  size_t nq = (size_t)c->B * c->Hq * c->Lq * c->D;
  size_t nk = (size_t)c->B * c->Hkv * c->Lk * c->D;
  size_t nl = (size_t)c->B * c->Hq * c->Lq;
  io->q = gpu_random_inputs(nq, c->dt, &s);
  io->k = gpu_random_inputs(nk, c->dt, &s);
  io->v = gpu_random_inputs(nk, c->dt, &s);
  io->o = malloc(4 * nq), io->lse = malloc(4 * nl);
  io->ro = malloc(8 * nq), io->rl = malloc(8 * nl);
  io->lo = malloc(4 * nq), io->ll = malloc(4 * nl);
  return io->q && io->k && io->v && io->o && io->lse && io->ro && io->rl &&
         io->lo && io->ll &&
         gpu_alloc_bhld(drv, &io->dq, c->dt, 0, c->B, c->Hq, c->Lq, c->D) &&
         gpu_alloc_bhld(drv, &io->dk, c->dt, 0, c->B, c->Hkv, c->Lk, c->D) &&
         gpu_alloc_bhld(drv, &io->dv, c->dt, 0, c->B, c->Hkv, c->Lk, c->D) &&
         gpu_alloc_bhld(drv, &io->dout, c->dt, 0, c->B, c->Hq, c->Lq, c->D) &&
         gpu_alloc_lse(drv, &io->dlse, c->B, c->Hq, c->Lq) &&
         gpu_upload_bhld(drv, &io->dq, io->q, c->dt, 0, c->B, c->Hq, c->Lq,
                         c->D) &&
         gpu_upload_bhld(drv, &io->dk, io->k, c->dt, 0, c->B, c->Hkv, c->Lk,
                         c->D) &&
         gpu_upload_bhld(drv, &io->dv, io->v, c->dt, 0, c->B, c->Hkv, c->Lk,
                         c->D) &&
         gpu_values_fill(drv, specs[c->spec], c->Hq, c->Lq, c->Lk, &s,
                         &io->vals) &&
         gpu_poison(drv, &io->dout, c->dt, &io->dlse);
}

static int fwd_check(const fwd_case *c, fwd_io *io) {
  size_t nq = (size_t)c->B * c->Hq * c->Lq * c->D;
  size_t nl = (size_t)c->B * c->Hq * c->Lq;
  fjg_ref_problem p = {c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->D,
                       (double)(1.0f / sqrtf((float)c->D)),
                       fjr_spec_graph(specs[c->spec]), &io->vals.env, 0, 0};
  fjg_check_report ro, rl;
  if (fjg_reference_dense(&p, io->q, io->k, io->v, io->ro, io->rl) != FJ_OK ||
      fjg_reference_lowp(&p, c->dt, io->q, io->k, io->v, io->lo, io->ll) !=
          FJ_OK)
    return 0;
  int a = fjg_ref_check(io->ro, io->lo, io->o, nq, 1e-3, &ro);
  int b = fjg_ref_check(io->rl, io->ll, io->lse, nl, 1e-3, &rl);
  printf("o %.2e/%.2e lse %.2e/%.2e", ro.max_err, ro.tolerance, rl.max_err,
         rl.tolerance);
  if (!a || !b)
    printf(" (nan %zu/%zu, -inf %zu/%zu, zero %zu/%zu)", ro.nonfinite,
           rl.nonfinite, ro.inf_mismatch, rl.inf_mismatch, ro.zero_mismatch,
           rl.zero_mismatch);
  return a && b;
}

static void forward_case(fj_context *ctx, const fjr_driver *drv,
                         const fwd_case *c, uint64_t seed) {
  fwd_io io;
  fj_block_mask *bm = NULL;
  memset(&io, 0, sizeof io);
  printf("[fwd]   %-14s %s D%-3d B%d H%d/%d %4dx%-4d mask B%d H%d %dx%d  ",
         kSpecs[c->spec][0], c->dt == FJ_DTYPE_F16 ? "fp16" : "bf16", c->D,
         c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->mB, c->mH, c->bq, c->bk);
  fflush(stdout);
  int ok = fwd_setup(drv, c, seed, &io);
  fj_block_mask_options o;
  fj_block_mask_options_init(&o);
  o.B = c->mB, o.H = c->mH, o.q_len = c->Lq, o.kv_len = c->Lk;
  o.block_q = c->bq, o.block_kv = c->bk;
  o.args = io.vals.args, o.num_args = io.vals.n;
  ok = ok && fj_block_mask_build(ctx, specs[c->spec], &o, &bm) == FJ_OK;
  fj_forward_args a = {.q = &io.dq.t, .k = &io.dk.t, .v = &io.dv.t, .o = &io.dout.t,
                       .lse = &io.dlse.t, .args = io.vals.args, .num_args = io.vals.n,
                       .block_mask = bm};
  ok = ok && fj_attention_forward(ctx, specs[c->spec], &a) == FJ_OK;
  if (!ok) printf("(%s) ", fj_context_last_error(ctx));
  ok = ok && gpu_cu_ok(drv, drv->cuCtxSynchronize(), "the kernel") &&
       gpu_download_bhld(drv, &io.dout, io.o, c->dt, 0, c->B, c->Hq, c->Lq,
                         c->D) &&
       gpu_cu_ok(drv, drv->cuMemcpyDtoH(io.lse, io.dlse.ptr,
                                        (size_t)c->B * c->Hq * c->Lq * 4),
                 "cuMemcpyDtoH") &&
       fwd_check(c, &io);
  report(ok, "");
  fj_block_mask_destroy(bm);
  fwd_free(drv, &io);
}

static void test_forward(fj_context *ctx, const fjr_driver *drv) {
  const fj_dtype BF = FJ_DTYPE_BF16, FP = FJ_DTYPE_F16;
  static fwd_case cases[16];
  int n = 0;
  cases[n++] = (fwd_case){0, BF, 128, 2, 4, 2, 257, 257, 1, 1, 128, 128};
  cases[n++] = (fwd_case){0, FP, 64, 2, 4, 1, 1000, 1000, 1, 1, 128, 128};
  cases[n++] = (fwd_case){0, BF, 128, 1, 2, 1, 1337, 1337, 1, 2, 256, 256};
  cases[n++] = (fwd_case){0, BF, 64, 1, 2, 2, 700, 1500, 1, 1, 128, 256};
  cases[n++] = (fwd_case){1, BF, 128, 1, 2, 2, 1000, 1000, 1, 1, 128, 128};
  cases[n++] = (fwd_case){2, FP, 128, 1, 2, 1, 2048, 2048, 1, 1, 128, 64};
  cases[n++] = (fwd_case){3, BF, 128, 1, 2, 2, 1000, 1000, 1, 1, 128, 128};
  cases[n++] = (fwd_case){6, BF, 128, 2, 3, 3, 500, 500, 2, 3, 128, 128};
  cases[n++] = (fwd_case){0, BF, 128, 1, 4, 1, 4096, 4096, 1, 1, 128, 128};
  /* Several work items a CTA in the persistent kernel (hundreds of query
   * blocks against 132 SMs), each item's block-mask row in a slot of the
   * two-item ring. */
  cases[n++] = (fwd_case){0, BF, 128, 2, 40, 8, 900, 900, 2, 1, 128, 128};
  cases[n++] = (fwd_case){1, FP, 128, 1, 48, 48, 1000, 1000, 1, 48, 128, 128};
  /* D = 256 where the template has it (sm90: 64-row kv tiles, so a block of
   * 128 is two tiles and one of 64 is one). */
  fj_kernel_options ko = {.head_dim = 256, .dtype = BF};
  if (fj_compile_forward(ctx, specs[0], &ko, NULL) != FJ_EUNSUPPORTED) {
    cases[n++] = (fwd_case){0, BF, 256, 1, 2, 2, 1000, 1000, 1, 1, 128, 128};
    cases[n++] = (fwd_case){1, FP, 256, 1, 2, 1, 700, 700, 1, 1, 128, 64};
  } else {
    printf("[fwd]   D=256 skipped: %s\n", fj_context_last_error(ctx));
  }
  for (int i = 0; i < n; i++) forward_case(ctx, drv, &cases[i], 0xf00d + i);
}

/* A mask that does not fit the launch is refused with a clear message. */
static void test_mismatch(fj_context *ctx, const fjr_driver *drv) {
  fwd_case c = {0, FJ_DTYPE_BF16, 128, 1, 2, 2, 256, 256, 1, 1, 128, 128};
  fwd_io io;
  memset(&io, 0, sizeof io);
  int ok = fwd_setup(drv, &c, 5, &io);
  struct {
    int B, H, Lq, Lk, bq, bk;
    const char *needle;
  } bad[] = {
      {1, 1, 255, 256, 128, 128, "q_len 255"},
      {3, 1, 256, 256, 128, 128, "must be 1 or match"},
      {1, 1, 256, 256, 64, 128, "multiple of"},
      {1, 1, 256, 256, 128, 32, "multiple of"},
  };
  for (size_t i = 0; ok && i < sizeof bad / sizeof bad[0]; i++) {
    fj_block_mask *bm = NULL;
    fj_block_mask_options o;
    fj_block_mask_options_init(&o);
    o.B = bad[i].B, o.H = bad[i].H, o.q_len = bad[i].Lq, o.kv_len = bad[i].Lk;
    o.block_q = bad[i].bq, o.block_kv = bad[i].bk;
    o.args = io.vals.args, o.num_args = io.vals.n;
    ok = fj_block_mask_build(ctx, specs[0], &o, &bm) == FJ_OK;
    fj_forward_args a = {.q = &io.dq.t, .k = &io.dk.t, .v = &io.dv.t, .o = &io.dout.t,
                         .args = io.vals.args, .num_args = io.vals.n, .block_mask = bm};
    ok = ok && fj_attention_forward(ctx, specs[0], &a) == FJ_EINVAL &&
         strstr(fj_context_last_error(ctx), bad[i].needle) != NULL;
    printf("[misfit] %s\n", fj_context_last_error(ctx));
    fj_block_mask_destroy(bm);
  }
  report(ok, "[misfit] mismatched block masks refused");
  fwd_free(drv, &io);
}

/* ---- 3. build time ---- */

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Document ids like the anchors' (documents of S/16 .. S/2 tokens) or
 * short ones (1..300 tokens, many partial blocks). */
static void doc_ids(int32_t *x, int S, int lo, int hi, uint64_t seed) {
  for (int i = 0, id = 0; i < S; id++) {
    int len = lo + (int)(gpu_uniform(&seed) * (hi - lo));
    for (int j = 0; j < len && i < S; j++) x[i++] = id;
  }
}

static void time_build(fj_context *ctx, const fjr_driver *drv, int S, int lo,
                       int hi, const char *label, int compare) {
  int32_t *ids = malloc(4 * (size_t)S);
  gpu_tensor t;
  memset(&t, 0, sizeof t);
  fj_block_mask *bm = NULL;
  CUevent e0 = NULL, e1 = NULL;
  float ms[50];
  int ok = ids != NULL;
  if (ok) doc_ids(ids, S, lo, hi, 1);
  ok = ok && gpu_alloc(drv, &t, 4 * (size_t)S) &&
       gpu_cu_ok(drv, drv->cuMemcpyHtoD(t.ptr, ids, 4 * (size_t)S), "copy");
  t.shape[0] = S, t.strides[0] = 1;
  gpu_describe(&t, 1, (DLDataType){kDLInt, 32, 1});
  fj_arg arg = {.name = "doc", .buffer = &t.t};
  fj_block_mask_options o;
  fj_block_mask_options_init(&o);
  o.q_len = o.kv_len = S;
  o.args = &arg, o.num_args = 1;
  double t0 = now_ms();
  ok = ok && fj_block_mask_build(ctx, specs[0], &o, &bm) == FJ_OK &&
       gpu_cu_ok(drv, drv->cuCtxSynchronize(), "build");
  double first = now_ms() - t0;
  ok = ok && gpu_cu_ok(drv, drv->cuEventCreate(&e0, 0), "event") &&
       gpu_cu_ok(drv, drv->cuEventCreate(&e1, 0), "event");
  for (int i = 0; ok && i < 5; i++)
    ok = fj_block_mask_update(bm, &arg, 1, NULL) == FJ_OK;
  for (int i = 0; ok && i < 50; i++)
    ok = gpu_cu_ok(drv, drv->cuEventRecord(e0, NULL), "record") &&
         fj_block_mask_update(bm, &arg, 1, NULL) == FJ_OK &&
         gpu_cu_ok(drv, drv->cuEventRecord(e1, NULL), "record") &&
         gpu_cu_ok(drv, drv->cuEventSynchronize(e1), "sync") &&
         gpu_cu_ok(drv, drv->cuEventElapsedTime(&ms[i], e0, e1), "elapsed");
  if (ok) qsort(ms, 50, sizeof(float), cmp_float);
  /* The arrays at this size must agree with the CPU builder too (several
   * seconds of CPU time, so once). */
  fjg_block_mask_host cm;
  memset(&cm, 0, sizeof cm);
  fjg_env env;
  memset(&env, 0, sizeof env);
  const void *bufs[1] = {ids};
  int64_t lens[1] = {S};
  env.buffer_data = bufs, env.buffer_len = lens;
  ok = ok && (!compare ||
               (fjg_block_mask_cpu_build(fjr_spec_graph(specs[0]), &env, 1, 1,
                                         S, S, 128, 128, &cm) == FJ_OK &&
                same_arrays(ctx, bm, &cm)));
  /* Block counts come from the CPU build, which runs only when compare is
   * set (it takes seconds): without it they are not printed. */
  int counts[3] = {0, 0, 0};
  for (size_t i = 0; ok && cm.cls && i < (size_t)cm.nq * cm.nkv; i++)
    counts[cm.cls[i]]++;
  char blocks[96] = "blocks not counted (no CPU build at this size)";
  if (compare && cm.cls)
    snprintf(blocks, sizeof blocks, "blocks %d empty %d partial %d full", counts[0],
             counts[1], counts[2]);
  report(ok && ms[25] < 1.0f,
         "[time]  document %s %dx%d: build %.4f ms median of 50 (min %.4f, "
         "max %.4f); first build %.1f ms wall (module load, NVRTC on a cache "
         "miss); %s",
         label, S, S, ok ? ms[25] : -1.0, ok ? ms[0] : -1.0,
         ok ? ms[49] : -1.0, first, blocks);
  fjg_block_mask_host_free(&cm);
  if (e0) drv->cuEventDestroy(e0);
  if (e1) drv->cuEventDestroy(e1);
  fj_block_mask_destroy(bm);
  gpu_free(drv, &t);
  free(ids);
}

int main(void) {
  const fjr_driver *drv = NULL;
  fj_context *ctx = gpu_open(&drv);
  for (int s = 0; s < NSPECS; s++)
    if (fj_spec_load_string(ctx, kSpecs[s][1], strlen(kSpecs[s][1]),
                            kSpecs[s][0], &specs[s]) != FJ_OK) {
      printf("spec %s: %s\n", kSpecs[s][0], fj_context_last_error(ctx));
      return 1;
    }
  test_builder(ctx, drv);
  test_forward(ctx, drv);
  test_mismatch(ctx, drv);
  time_build(ctx, drv, 16384, 16384 / 16, 16384 / 2, "(anchor-like docs)", 1);
  time_build(ctx, drv, 16384, 1, 300, "(docs of 1..300)", 0);
  printf("%d passed, %d failed\n", passed, failed);
  for (int s = 0; s < NSPECS; s++) fj_spec_destroy(specs[s]);
  fj_context_destroy(ctx);
  return failed ? 1 : 0;
}
