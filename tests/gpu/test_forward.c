/*
 * tests/gpu/test_forward.c: the forward kernel against the float64 CPU
 * reference over a matrix of specs, dtypes, head dims, GQA ratios, sizes,
 * Lq != Lk and layouts. Every case uses fresh random inputs and NaN-poisoned
 * outputs and must pass fjg_ref_check (error at most 2x that of the same
 * computation in the input dtype, plus a floor; NaN never passes; fully
 * masked rows must give exactly 0 and LSE -inf).
 *
 * Exits 77 (skipped) without a GPU. Prints one line per case and
 * "N passed, N failed"; exit status 1 when any failed. Kernels are compiled
 * up front by a few threads (one context each) into the disk cache, so the
 * matrix is not bound by serial NVRTC time.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "gpu/gpu_util.h"
#include "runtime/forward.h"

#define FLOOR_O 1e-3
#define FLOOR_LSE 1e-3
#define MAX_SPECS 64
#define MAX_CASES 256

typedef struct spec_src {
  char name[64];
  char *src; /* owned */
} spec_src;

typedef struct tcase {
  int spec;
  fj_dtype dt;
  int D, B, Hq, Hkv, Lq, Lk, bshd;
  int long_rows; /* the launch's rows must count as long (or not) */
} tcase;

static spec_src specs[MAX_SPECS];
static int nspecs;
static tcase cases[MAX_CASES];
static int ncases;

/* Every prelude mask and mod, alone and combined. */
static const char *const inline_specs[][2] = {
    {"full", "return { mask_mod = noop_mask() }"},
    {"causal", "return { mask_mod = causal() }"},
    {"causal_br", "return { mask_mod = causal{align = \"bottom_right\"} }"},
    {"sliding_window",
     "return { mask_mod = sliding_window(param(\"window\", \"i32\")) }"},
    {"window_bidir",
     "return { mask_mod = sliding_window(16, {causal = false}) }"},
    {"prefix_lm", "return { mask_mod = prefix_lm(param(\"prefix\", \"i32\")) }"},
    {"document", "return { mask_mod = document(buffer(\"doc\", \"i32\")) }"},
    {"doc_bidir",
     "return { mask_mod = document(buffer(\"doc\", \"i32\"), {causal = false}) }"},
    {"chunked", "return { mask_mod = chunked(32) }"},
    {"late_rows", /* rows q < 5 fully masked */
     "return { mask_mod = function(b, h, q, kv) return ge(q, 5) end }"},
    {"alibi_causal", "return { mask_mod = causal(), score_mod = alibi() }"},
    {"alibi_slopes",
     "return { score_mod = alibi(buffer(\"slopes\", \"f32\")) }"},
    {"softcap_causal",
     "return { mask_mod = causal(), score_mod = softcap(30) }"},
    {"softcap_param",
     "return { score_mod = softcap(param(\"cap\", \"f32\")) }"},
    {"relative_bias",
     "return { mask_mod = causal(),\n"
     "  score_mod = relative_bias(buffer(\"bias\", \"f32\")) }"},
    /* Relative biases clamped to a window of distances: one value over
     * the tiles away from the diagonal (FJ_SCORE_TILE); the second in both
     * directions and without a mask, with an invariant factor. */
    {"clamped_bias",
     "local bias = buffer(\"bias\", \"f32\")\n"
     "return { mask_mod = causal(),\n"
     "  score_mod = function(score, b, h, q, kv)\n"
     "    return score + bias[h * 32 + min(max(q - kv, 0), 31)] end }"},
    {"clamped_bias_full",
     "local bias = buffer(\"bias\", \"f32\")\n"
     "return { score_mod = function(score, b, h, q, kv)\n"
     "    return score - 0.5 * bias[h * 32 + min(max(q - kv + 16, 0), 31)] end }"},
    {"or_and_masks",
     "return { mask_mod = or_masks(prefix_lm(8),\n"
     "  and_masks(causal(), sliding_window(16))) }"},
    {"compose_scores",
     "return { score_mod = compose_scores(alibi(), softcap(5)) }"},
    {"noop_score", "return { score_mod = noop_score() }"},
};

static int add_spec(const char *name, const char *src) {
  if (nspecs == MAX_SPECS) return -1;
  snprintf(specs[nspecs].name, sizeof specs[nspecs].name, "%s", name);
  specs[nspecs].src = strdup(src);
  return specs[nspecs].src ? nspecs++ : -1;
}

static int find_spec(const char *name) {
  for (int i = 0; i < nspecs; i++)
    if (!strcmp(specs[i].name, name)) return i;
  return -1;
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s && fread(s, 1, (size_t)n, f) == (size_t)n) {
    s[n] = '\0';
  } else {
    free(s);
    s = NULL;
  }
  fclose(f);
  return s;
}

/* The example specs (examples/NAME.lua), named "ex:NAME". */
static void add_example_specs(void) {
  char path[2048];
  DIR *d = opendir(FJ_SOURCE_DIR "/examples");
  struct dirent *e;
  if (!d) { /* never a run that silently leaves the examples out */
    fprintf(stderr, "cannot open %s/examples: run from the source tree\n", FJ_SOURCE_DIR);
    exit(1);
  }
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".lua")) continue;
    if (!strncmp(e->d_name, "manifest", 8)) continue; /* not a spec */
    snprintf(path, sizeof path, "%s/examples/%s", FJ_SOURCE_DIR, e->d_name);
    char *src = read_text(path), name[64];
    snprintf(name, sizeof name, "ex:%.*s", (int)(n - 4), e->d_name);
    if (src) add_spec(name, src);
    free(src);
  }
  closedir(d);
}

/* ---- the matrix ---- */

static void add_case(const char *spec, fj_dtype dt, int D, int B, int Hq,
                     int Hkv, int Lq, int Lk, int bshd) {
  int s = find_spec(spec);
  if (s < 0 || ncases == MAX_CASES) {
    fprintf(stderr, "test matrix: no spec '%s' or too many cases\n", spec);
    exit(1);
  }
  cases[ncases++] = (tcase){s, dt, D, B, Hq, Hkv, Lq, Lk, bshd, 0};
}

/* add_case, for a launch whose rows must count as long (the long-row
 * variant's kernel). */
static void add_long_case(const char *spec, fj_dtype dt, int D, int B, int Hq, int Hkv,
                          int Lq, int Lk, int bshd) {
  add_case(spec, dt, D, B, Hq, Hkv, Lq, Lk, bshd);
  cases[ncases - 1].long_rows = 1;
}

static void build_matrix(void) {
  const fj_dtype BF = FJ_DTYPE_BF16, FP = FJ_DTYPE_F16;
  /* Every spec in both dtypes and head dims, GQA 2 and 4, both layouts. */
  for (int s = 0; s < nspecs; s++) {
    add_case(specs[s].name, BF, 128, 2, 4, 2, 129, 129, 0);
    add_case(specs[s].name, FP, 64, 2, 4, 1, 127, 200, 1);
  }
  /* Sizes around the tile edges, GQA 1/4/8 in turn. */
  static const int sizes[] = {1, 17, 127, 128, 129, 1000};
  static const int ratios[] = {1, 4, 8};
  for (int i = 0; i < 6; i++) {
    int L = sizes[i], r = ratios[i % 3], Hq = 8, B = L >= 1000 ? 1 : 2;
    const char *spec = i % 2 ? "causal" : "full";
    add_case(spec, BF, 128, B, Hq, Hq / r, L, L, 0);
    add_case(spec, FP, 64, B, Hq, Hq / ratios[(i + 1) % 3], L, L, 1);
    add_case(i % 2 ? "full" : "causal", FP, 128, B, Hq, Hq / r, L, L, i % 2);
    add_case(i % 2 ? "document" : "sliding_window", BF, 64, B, Hq, Hq / r, L,
             L, !(i % 2));
  }
  /* Lq != Lk, including causal bottom-right with Lq > Lk (masked rows). */
  static const char *const rect[] = {"causal", "causal_br", "full",
                                     "document", "sliding_window",
                                     "late_rows"};
  for (int i = 0; i < 6; i++) {
    add_case(rect[i], BF, 128, 1, 2, 2, 129, 1000, i % 2);
    add_case(rect[i], i % 2 ? BF : FP, i % 2 ? 64 : 128, 1, 4, 1, 1000, 129,
             !(i % 2));
  }
  /* 1337: kept to B=1, H=2 so the CPU reference stays quick. */
  add_case("causal", BF, 128, 1, 2, 1, 1337, 1337, 0);
  add_case("causal", FP, 64, 1, 2, 2, 1337, 1337, 1);
  add_case("full", BF, 128, 1, 2, 2, 1337, 1337, 1);
  add_case("document", BF, 128, 1, 2, 1, 1337, 1337, 0);
  add_case("alibi_causal", FP, 128, 1, 2, 2, 1337, 1337, 0);
  add_case("softcap_causal", BF, 64, 1, 2, 1, 1337, 1337, 0);
  /* GQA 8 with data-dependent masks. */
  add_case("document", BF, 128, 1, 8, 1, 257, 257, 1);
  add_case("sliding_window", FP, 64, 1, 8, 1, 257, 257, 0);
  add_case("relative_bias", BF, 128, 1, 8, 1, 300, 257, 0);
  add_case("clamped_bias", BF, 128, 1, 8, 2, 1000, 1000, 0);
  add_case("clamped_bias", FP, 64, 2, 4, 4, 777, 777, 1);
  add_case("clamped_bias_full", FP, 128, 1, 4, 1, 600, 900, 1);
  add_case("clamped_bias_full", BF, 64, 1, 4, 4, 900, 600, 0);
  /* Hundreds of query blocks: more work items than the H200's 132 SMs, so
   * that the persistent kernel's CTAs each run several items in turn (the
   * ping-pong turn, the K/V stages and the two Q buffers carried from item
   * to item), with items without tiles among them (causal_br: its first 871
   * rows have no allowed pair). */
  add_case("sliding_window", BF, 128, 2, 40, 8, 700, 700, 0);
  add_case("document", BF, 128, 1, 48, 16, 1000, 1000, 1);
  add_case("causal_br", FP, 128, 1, 40, 40, 1000, 129, 0);
  add_case("late_rows", BF, 128, 1, 40, 8, 1000, 1000, 1);
  add_case("causal", FP, 128, 3, 24, 24, 640, 640, 1);
  add_case("full", BF, 64, 2, 36, 4, 513, 513, 0);
  /* 1000 rows at D=64: query tiles 1.. moved toward row 0 by a kv tile,
   * tile 0 overlapping tile 1 (fjh_tile_q0), over several items a CTA. */
  add_case("causal", BF, 64, 2, 24, 8, 1000, 1000, 1);
  add_case("softcap_causal", BF, 128, 1, 64, 8, 600, 777, 0);
  /* D = 256 (the sm90 template; under sm80 each must be refused, see
   * run_case): both dtypes and layouts, GQA, Lq != Lk, odd sizes. */
  add_case("causal", BF, 256, 2, 4, 2, 129, 129, 0);
  add_case("full", FP, 256, 1, 2, 1, 17, 17, 1);
  add_case("document", BF, 256, 1, 2, 2, 300, 300, 1);
  add_case("sliding_window", FP, 256, 1, 4, 1, 129, 1000, 0);
  add_case("softcap_causal", BF, 256, 1, 2, 1, 1000, 129, 0);
  add_case("alibi_causal", BF, 256, 1, 2, 2, 1337, 1337, 0);
  /* Rows of FJ_LONG_ROW_KEYS keys and more: at D=128, for these specs
   * without a score_mod, the long-row variant (kv tiles of 176 rows, its
   * last one ragged here), which the launch chooses; kept to a few short
   * query blocks for the CPU reference. */
  add_long_case("full", BF, 128, 1, 2, 1, 129, 9001, 0);
  add_long_case("causal_br", FP, 128, 1, 4, 2, 300, 8500, 1);
  add_long_case("late_rows", BF, 128, 2, 16, 4, 129, 8300, 0);
  /* A mask that reads a buffer counts its rows by its index part, here every
   * key (unit/test_long_rows): its masked tiles read the ids over 176-row
   * tiles. */
  add_long_case("doc_bidir", BF, 128, 1, 2, 1, 129, 9001, 1);
  add_case("chunked", FP, 128, 1, 2, 2, 77, 8400, 0); /* its rows stay short */
}

/* ---- compiling ahead, in parallel ---- */

typedef struct precompile {
  const char *arch;
  int jobs[MAX_CASES][3]; /* spec, D, dtype */
  int njobs;
  atomic_int next;
} precompile;

static void *precompile_worker(void *arg) {
  precompile *p = arg;
  fj_context_options o;
  fj_context *ctx = NULL;
  fj_context_options_init(&o);
  o.arch = p->arch;
  if (fj_context_create(&o, &ctx) != FJ_OK) return NULL;
  for (;;) {
    int j = atomic_fetch_add(&p->next, 1);
    if (j >= p->njobs) break;
    fj_spec *spec = NULL;
    const spec_src *s = &specs[p->jobs[j][0]];
    if (fj_spec_load_string(ctx, s->src, strlen(s->src), s->name, &spec) ==
        FJ_OK) {
      fj_kernel_options ko = {.head_dim = p->jobs[j][1], .dtype = (fj_dtype)p->jobs[j][2]};
      fj_compile_forward(ctx, spec, &ko, NULL); /* errors show up later */
    }
    fj_spec_destroy(spec);
  }
  fj_context_destroy(ctx);
  return NULL;
}

static void compile_ahead(fj_context *ctx) {
  static precompile p;
  pthread_t tid[16];
  int started = 0;
  if (fjr_context_arch(ctx, &p.arch) != FJ_OK) return;
  for (int c = 0; c < ncases; c++) {
    int dup = 0;
    for (int j = 0; j < p.njobs && !dup; j++)
      dup = p.jobs[j][0] == cases[c].spec && p.jobs[j][1] == cases[c].D &&
            p.jobs[j][2] == (int)cases[c].dt;
    if (!dup) {
      p.jobs[p.njobs][0] = cases[c].spec;
      p.jobs[p.njobs][1] = cases[c].D;
      p.jobs[p.njobs][2] = (int)cases[c].dt;
      p.njobs++;
    }
  }
  atomic_init(&p.next, 0);
  for (int t = 0; t < 16 && t < p.njobs; t++)
    if (pthread_create(&tid[started], NULL, precompile_worker, &p) == 0)
      started++;
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  printf("compiled %d kernels ahead for %s\n", p.njobs, p.arch);
}

/* ---- one case ---- */

typedef struct case_io {
  double *q, *k, *v, *ro, *rl;
  float *o, *lse, *lo, *ll;
  gpu_tensor dq, dk, dv, dout, dlse;
  gpu_values vals;
} case_io;

static void case_free(const fjr_driver *drv, case_io *io) {
  free(io->q), free(io->k), free(io->v), free(io->ro), free(io->rl);
  free(io->o), free(io->lse), free(io->lo), free(io->ll);
  gpu_free(drv, &io->dq), gpu_free(drv, &io->dk), gpu_free(drv, &io->dv);
  gpu_free(drv, &io->dout), gpu_free(drv, &io->dlse);
  gpu_values_free(drv, &io->vals);
}

/* Inputs, device tensors, NaN poison, launch, download. */
static int case_launch(fj_context *ctx, const fjr_driver *drv,
                       const fj_spec *spec, const tcase *c, uint64_t seed,
                       case_io *io) {
  size_t nq = (size_t)c->B * c->Hq * c->Lq * c->D;
  size_t nk = (size_t)c->B * c->Hkv * c->Lk * c->D;
  size_t nl = (size_t)c->B * c->Hq * c->Lq;
  uint64_t s = seed;
  io->q = gpu_random_inputs(nq, c->dt, &s);
  io->k = gpu_random_inputs(nk, c->dt, &s);
  io->v = gpu_random_inputs(nk, c->dt, &s);
  io->o = malloc(sizeof(float) * nq);
  io->lse = malloc(sizeof(float) * nl);
  if (!io->q || !io->k || !io->v || !io->o || !io->lse) return 0;
  if (!gpu_alloc_bhld(drv, &io->dq, c->dt, c->bshd, c->B, c->Hq, c->Lq, c->D) ||
      !gpu_alloc_bhld(drv, &io->dk, c->dt, c->bshd, c->B, c->Hkv, c->Lk, c->D) ||
      !gpu_alloc_bhld(drv, &io->dv, c->dt, c->bshd, c->B, c->Hkv, c->Lk, c->D) ||
      !gpu_alloc_bhld(drv, &io->dout, c->dt, c->bshd, c->B, c->Hq, c->Lq,
                      c->D) ||
      !gpu_alloc_lse(drv, &io->dlse, c->B, c->Hq, c->Lq) ||
      !gpu_upload_bhld(drv, &io->dq, io->q, c->dt, c->bshd, c->B, c->Hq, c->Lq,
                       c->D) ||
      !gpu_upload_bhld(drv, &io->dk, io->k, c->dt, c->bshd, c->B, c->Hkv,
                       c->Lk, c->D) ||
      !gpu_upload_bhld(drv, &io->dv, io->v, c->dt, c->bshd, c->B, c->Hkv,
                       c->Lk, c->D) ||
      !gpu_values_fill(drv, spec, c->Hq, c->Lq, c->Lk, &s, &io->vals) ||
      !gpu_poison(drv, &io->dout, c->dt, &io->dlse))
    return 0;
  fj_forward_args a = {.q = &io->dq.t, .k = &io->dk.t, .v = &io->dv.t, .o = &io->dout.t,
                       .lse = &io->dlse.t, .args = io->vals.args, .num_args = io->vals.n};
  if (fjr_forward_long_rows(ctx, spec, &a) != c->long_rows) {
    printf("      the launch's rows %s as long\n", c->long_rows ? "do not count" : "count");
    return 0;
  }
  if (fj_attention_forward(ctx, spec, &a) != FJ_OK) {
    printf("      launch failed: %s\n", fj_context_last_error(ctx));
    return 0;
  }
  return gpu_cu_ok(drv, drv->cuCtxSynchronize(), "the kernel") &&
         gpu_download_bhld(drv, &io->dout, io->o, c->dt, c->bshd, c->B, c->Hq,
                           c->Lq, c->D) &&
         gpu_cu_ok(drv, drv->cuMemcpyDtoH(io->lse, io->dlse.ptr, nl * 4),
                   "cuMemcpyDtoH");
}

static int case_check(const fj_spec *spec, const tcase *c, case_io *io,
                      fjg_check_report *ro, fjg_check_report *rl) {
  size_t nq = (size_t)c->B * c->Hq * c->Lq * c->D;
  size_t nl = (size_t)c->B * c->Hq * c->Lq;
  fjg_ref_problem p = {c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->D,
                       (double)(1.0f / sqrtf((float)c->D)),
                       fjr_spec_graph(spec), &io->vals.env, 0, 0};
  io->ro = malloc(sizeof(double) * nq);
  io->rl = malloc(sizeof(double) * nl);
  io->lo = malloc(sizeof(float) * nq);
  io->ll = malloc(sizeof(float) * nl);
  if (!io->ro || !io->rl || !io->lo || !io->ll ||
      fjg_reference_dense(&p, io->q, io->k, io->v, io->ro, io->rl) != FJ_OK ||
      fjg_reference_lowp(&p, c->dt, io->q, io->k, io->v, io->lo, io->ll) !=
          FJ_OK)
    return 0;
  int a = fjg_ref_check(io->ro, io->lo, io->o, nq, FLOOR_O, ro);
  int b = fjg_ref_check(io->rl, io->ll, io->lse, nl, FLOOR_LSE, rl);
  return a && b;
}

static void print_problems(const fjg_check_report *r, const char *what) {
  if (r->pass) return;
  printf("      %s: %zu NaN/Inf, %zu -inf mismatches, %zu nonzero masked, "
         "worst index %zu\n",
         what, r->nonfinite, r->inf_mismatch, r->zero_mismatch, r->worst);
}

/* Whether the context's template has head dim 256 (sm90 does, sm80 not). */
static int has_d256(fj_context *ctx, const fj_spec *spec) {
  fj_kernel_options ko = {.head_dim = 256, .dtype = FJ_DTYPE_BF16};
  return fj_compile_forward(ctx, spec, &ko, NULL) != FJ_EUNSUPPORTED;
}

/* Without D = 256, compiling for it must fail with an error that says so. */
static int expect_d256_refused(fj_context *ctx, const fj_spec *spec, const tcase *c) {
  fj_kernel_options ko = {.head_dim = 256, .dtype = c->dt};
  fj_status st = fj_compile_forward(ctx, spec, &ko, NULL);
  const char *why = fj_context_last_error(ctx);
  int ok = st == FJ_EUNSUPPORTED && strstr(why, "head dim 256") != NULL;
  printf("refused: %s  %s\n", why, ok ? "PASS" : "FAIL");
  return ok;
}

static int run_case(fj_context *ctx, const fjr_driver *drv,
                    fj_spec *const *loaded, int idx) {
  const tcase *c = &cases[idx];
  case_io io;
  fjg_check_report ro, rl;
  int pass = 0;
  memset(&io, 0, sizeof io);
  memset(&ro, 0, sizeof ro);
  memset(&rl, 0, sizeof rl);
  printf("[%3d] %-18s %s D%-3d B%d H%d/%d %4dx%-4d %s  ", idx,
         specs[c->spec].name, c->dt == FJ_DTYPE_F16 ? "fp16" : "bf16", c->D,
         c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->bshd ? "bshd" : "bhsd");
  fflush(stdout);
  if (!loaded[c->spec]) {
    printf("FAIL (spec did not load)\n");
    return 0;
  }
  if (c->D == 256 && !has_d256(ctx, loaded[c->spec]))
    return expect_d256_refused(ctx, loaded[c->spec], c);
  if (case_launch(ctx, drv, loaded[c->spec], c, 0x5eed0000ull + idx, &io))
    pass = case_check(loaded[c->spec], c, &io, &ro, &rl);
  else
    printf("(no result) ");
  printf("o %.2e/%.2e  lse %.2e/%.2e  %s\n", ro.max_err, ro.tolerance,
         rl.max_err, rl.tolerance, pass ? "PASS" : "FAIL");
  print_problems(&ro, "o");
  print_problems(&rl, "lse");
  case_free(drv, &io);
  return pass;
}

/* A spec launched twice compiles once: the second lookup is a cache hit. */
static int test_kernel_reuse(const fjr_driver *drv) {
  fj_context_options o;
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  fj_kernel_info a, b;
  const char *src = "return { mask_mod = causal(), score_mod = softcap(7) }";
  tcase c = {0, FJ_DTYPE_BF16, 64, 1, 2, 2, 64, 64, 0, 0};
  case_io io;
  int ok = 0;
  memset(&io, 0, sizeof io);
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  fj_context_options_init(&o);
  o.cache_dir = ""; /* memory only: the first lookup must compile */
  if (fj_context_create(&o, &ctx) != FJ_OK ||
      fj_spec_load_string(ctx, src, strlen(src), "reuse", &spec) != FJ_OK)
    goto done;
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16};
  if (fj_compile_forward(ctx, spec, &ko, &a) != FJ_OK ||
      fjr_context_device(ctx, NULL) != FJ_OK ||
      !case_launch(ctx, drv, spec, &c, 1, &io) ||
      fj_compile_forward(ctx, spec, &ko, &b) != FJ_OK)
    goto done;
  ok = !a.from_cache && b.from_cache && b.compile_ms == 0 &&
       !strcmp(a.key, b.key);
done:
  printf("[reuse] first lookup %s, second %s (%s): %s\n",
         a.from_cache ? "cached" : "compiled", b.from_cache ? "cached" :
         "compiled", ctx ? fj_context_last_error(ctx) : "", ok ? "PASS" :
         "FAIL");
  case_free(drv, &io);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  return ok;
}

int main(void) {
  const fjr_driver *drv = NULL;
  fj_context *ctx = gpu_open(&drv);
  fj_spec *loaded[MAX_SPECS] = {0};
  int passed = 0, failed = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (size_t i = 0; i < sizeof inline_specs / sizeof inline_specs[0]; i++)
    add_spec(inline_specs[i][0], inline_specs[i][1]);
  add_example_specs();
  for (int s = 0; s < nspecs; s++)
    if (fj_spec_load_string(ctx, specs[s].src, strlen(specs[s].src),
                            specs[s].name, &loaded[s]) != FJ_OK)
      printf("spec %s: %s\n", specs[s].name, fj_context_last_error(ctx));
  build_matrix();
  compile_ahead(ctx);
  for (int i = 0; i < ncases; i++)
    run_case(ctx, drv, loaded, i) ? passed++ : failed++;
  test_kernel_reuse(drv) ? passed++ : failed++;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("%d passed, %d failed (%.1f s)\n", passed, failed,
         (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
  for (int s = 0; s < nspecs; s++) {
    fj_spec_destroy(loaded[s]);
    free(specs[s].src);
  }
  fj_context_destroy(ctx);
  return failed ? 1 : 0;
}
