/*
 * tests/fuzz/fuzz_specs.c: a spec fuzzer.
 *
 * Generates random specs as Lua text from a seeded PRNG (arithmetic,
 * comparisons, & | ~, where, min/max/abs/floor/ceil, exp/exp2/log/log2/
 * sqrt/tanh, // and % including by zero, params, buffers, size symbols,
 * shared locals, prelude builders), then for each one:
 *   1. loads it (fj_spec_load_string): a generated spec must load;
 *   2. emits its forward source (fj_emit_forward_source, sm_80);
 *   3. every --nvrtc-every-th spec: compiles it with NVRTC for sm_80
 *      (fj_compile_forward; skipped when NVRTC is unavailable);
 *   4. checks the census `flexjit mask` prints (gen/blockmask_cpu.c) and the
 *      CPU block-mask builder against brute-force evaluation, on random
 *      small sizes, blocks, params and buffers;
 *   5. checks the interval analysis for soundness: on random tiles,
 *      fjg_tile_class_cpu never says FULL or EMPTY where an element is
 *      masked / allowed / uncertain;
 *   6. in batches of --host-batch specs: compiles the emitted prologues for
 *      the host (g++, the round-to-nearest intrinsics as plain float ops,
 *      no contraction) and runs fj_mask, fj_score_mod and fj_tile_class on
 *      random points: the evaluator must agree bit for bit where it says
 *      exact, hold the host's value inside its bounds elsewhere (glibc's exp,
 *      log, tanh standing in for CUDA's), and give the same tile classes;
 *      and fj_mask_from_rows of fj_mask_rows, and fj_mask_from_cols of
 *      fj_mask_cols, must equal fj_mask.
 *
 * Usage (the ctest entry fuzz/specs runs the first):
 *   build/fuzz_specs --seed 1 --count 300
 *   build/fuzz_specs --seed S --count N [--first I] [--nvrtc-every K]
 *                    [--host-batch M] [--verbose] [--show I]
 * Spec I of seed S is the same on every run and machine: a failure prints
 * its seed, index and Lua text, and `--seed S --first I --count 1` repeats
 * it; `--show I` prints the text only. Exit status 0 when every check
 * passed, 1 otherwise, 2 on a usage error.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flexjit.h"
#include "gen/blockmask_cpu.h"
#include "gen/emit_cuda.h"
#include "gen/eval.h"
#include "gen/graph.h"
#include "gen/interval.h"
#include "gen/templates.h"
#include "tests/fuzz/mask_checks.h"
#include "tests/unit/host_prelude.h"
#include "runtime/context.h"

/* ---- strings ---- */

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0) abort();
  va_end(ap);
  return s;
}

/* ---- the spec generator ---- */

enum { T_BOOL, T_I32, T_F32, NUM_T };

typedef struct expr {
  char *text;
  int traced; /* 0: a plain Lua value (a literal) */
} expr;

enum { MAX_NAMES = 48 };

typedef struct gen {
  rng r;
  /* Names by type that hold traced values: inputs, sizes, params, locals. */
  const char *names[NUM_T][MAX_NAMES];
  int num_names[NUM_T];
  int first_local[NUM_T]; /* names from here on are the mod's locals */
  char *owned[MAX_NAMES * 2];
  int num_owned;
  const char *ibufs[4], *fbufs[4];
  int num_ibufs, num_fbufs;
  int nodes; /* rough count of operations emitted, to bound the graph */
} gen;

static void add_name(gen *g, int type, const char *name) {
  if (g->num_names[type] < MAX_NAMES) g->names[type][g->num_names[type]++] = name;
}

static char *own(gen *g, char *s) {
  if (g->num_owned < MAX_NAMES * 2) g->owned[g->num_owned++] = s;
  return s;
}

static expr plain(char *text) {
  expr e = {text, 0};
  return e;
}
static expr traced(char *text) {
  expr e = {text, 1};
  return e;
}

static expr int_literal(gen *g) {
  static const int32_t special[] = {0, 1, -1, 2, 3, 7, 16, 49, 64, 128, 1000,
                                    2147483647, -2147483647, 65536, -7};
  int32_t v = chance(&g->r, 60) ? special[pick(&g->r, 15)]
                                : between(&g->r, -300, 300);
  return plain(v < 0 ? fmt("(%d)", (int)v) : fmt("%d", (int)v));
}

static expr float_literal(gen *g) {
  static const char *const special[] = {
      "0.0", "(-0.0)", "1.0", "0.5", "49.0", "0.1", "0.3", "1.5", "(-2.25)",
      "1e30", "3.0e38", "1e-40", "0x1p-149", "1e39", "(-1e39)", "7.25",
      "0.001", "100.0", "math.pi", "(1/3)"};
  if (chance(&g->r, 70)) return plain(fmt("%s", special[pick(&g->r, 20)]));
  return plain(fmt("%.6g", (double)between(&g->r, -4000, 4000) / 64.0));
}

static expr gen_expr(gen *g, int type, int depth, int need_traced);

static expr traced_leaf(gen *g, int type) {
  if (type == T_BOOL) {
    /* A comparison is the simplest traced bool. */
    expr a = traced_leaf(g, T_I32);
    expr r = traced(fmt("lt(%s, %d)", a.text, between(&g->r, -5, 100)));
    free(a.text);
    return r;
  }
  if (type == T_I32 && g->num_ibufs && chance(&g->r, 12)) {
    expr i = traced_leaf(g, T_I32);
    expr r = traced(fmt("%s[%s]", g->ibufs[pick(&g->r, g->num_ibufs)], i.text));
    free(i.text);
    return r;
  }
  if (type == T_F32 && g->num_fbufs && chance(&g->r, 20)) {
    expr i = traced_leaf(g, T_I32);
    expr r = traced(fmt("%s[%s]", g->fbufs[pick(&g->r, g->num_fbufs)], i.text));
    free(i.text);
    return r;
  }
  if (type == T_F32 && (!g->num_names[T_F32] || chance(&g->r, 40))) {
    /* An index as f32. */
    expr i = traced_leaf(g, T_I32);
    expr r = traced(chance(&g->r, 50) ? fmt("(%s * 1.0)", i.text)
                                      : fmt("(%s / %d)", i.text,
                                            between(&g->r, 1, 64)));
    free(i.text);
    return r;
  }
  int n = g->num_names[type], from = g->first_local[type];
  /* Mostly locals when there are any: a DAG, not a tree. */
  int i = from < n && chance(&g->r, 65) ? between(&g->r, from, n - 1)
                                        : pick(&g->r, n);
  return traced(fmt("%s", g->names[type][i]));
}

static expr leaf(gen *g, int type, int need_traced) {
  if (need_traced || type == T_BOOL || chance(&g->r, 65)) return traced_leaf(g, type);
  return type == T_I32 ? int_literal(g) : float_literal(g);
}

/* f(a, b) with at least one traced operand when need_traced (and always
 * when both would be plain: Lua would compute it, `3 // 0` raises). */
static expr binary(gen *g, const char *pattern, int ta, int tb, int depth,
                   int need_traced) {
  expr a = gen_expr(g, ta, depth - 1, 0);
  (void)need_traced; /* a traced operand makes the result traced */
  expr b = gen_expr(g, tb, depth - 1, !a.traced);
  expr r = traced(fmt(pattern, a.text, b.text));
  free(a.text);
  free(b.text);
  g->nodes++;
  return r;
}

static expr unary(gen *g, const char *pattern, int ta, int depth) {
  expr a = gen_expr(g, ta, depth - 1, 1);
  expr r = traced(fmt(pattern, a.text));
  free(a.text);
  g->nodes++;
  return r;
}

static expr where_expr(gen *g, int type, int depth) {
  expr c = gen_expr(g, T_BOOL, depth - 1, 1);
  expr a = gen_expr(g, type, depth - 1, 0);
  expr b = gen_expr(g, type, depth - 1, 0);
  expr r = traced(fmt("where(%s, %s, %s)", c.text, a.text, b.text));
  free(c.text), free(a.text), free(b.text);
  g->nodes++;
  return r;
}

static int numeric(gen *g) { return chance(&g->r, 50) ? T_I32 : T_F32; }

static expr gen_i32(gen *g, int depth, int need_traced) {
  static const char *const ops[] = {"(%s + %s)", "(%s - %s)", "(%s * %s)",
                                    "(%s // %s)", "(%s %% %s)",
                                    "min(%s, %s)", "max(%s, %s)"};
  switch (pick(&g->r, 10)) {
  case 0: return unary(g, chance(&g->r, 50) ? "(-%s)" : "abs(%s)", T_I32, depth);
  case 1: return unary(g, chance(&g->r, 50) ? "floor(%s)" : "ceil(%s)", T_I32, depth);
  case 2: return where_expr(g, T_I32, depth);
  default: return binary(g, ops[pick(&g->r, 7)], T_I32, T_I32, depth, need_traced);
  }
}

static expr gen_f32(gen *g, int depth, int need_traced) {
  static const char *const ops[] = {"(%s + %s)", "(%s - %s)", "(%s * %s)",
                                    "(%s / %s)", "(%s // %s)", "(%s %% %s)",
                                    "min(%s, %s)", "max(%s, %s)"};
  static const char *const fns[] = {"exp(%s)", "exp2(%s)", "log(%s)",
                                    "log2(%s)", "sqrt(%s)", "tanh(%s)",
                                    "abs(%s)", "floor(%s)", "ceil(%s)",
                                    "(-%s)"};
  switch (pick(&g->r, 10)) {
  case 0: case 1: {
    int f = pick(&g->r, 10);
    /* abs, floor, ceil and - keep the type: give them an f32. */
    return unary(g, fns[f], f >= 6 ? T_F32 : numeric(g), depth);
  }
  case 2: return where_expr(g, T_F32, depth);
  default: {
    int op = pick(&g->r, 8);
    /* One f32 operand makes the result f32; / is f32 always. */
    int ta = op == 3 ? numeric(g) : T_F32, tb = numeric(g);
    if (chance(&g->r, 50)) {
      int t = ta;
      ta = tb, tb = t;
    }
    return binary(g, ops[op], ta, tb, depth, need_traced);
  }
  }
}

static expr gen_bool(gen *g, int depth) {
  static const char *const cmps[] = {"lt(%s, %s)", "le(%s, %s)", "gt(%s, %s)",
                                     "ge(%s, %s)", "eq(%s, %s)", "ne(%s, %s)"};
  static const char *const logic[] = {"(%s & %s)", "(%s | %s)", "(%s ~ %s)",
                                      "logical_and(%s, %s)",
                                      "logical_or(%s, %s)"};
  static const char *const edges[] = {
      "lt(tanh(%s), 0.0)", "eq(log2(%s), floor(log2(%s)))",
      "le(exp(%s * 0.0), 1.0)", "ge(exp2(log2(%s)), %s)",
      "lt(1.0 / min(%s * (-0.0), 0.0), 0.0)", "eq(sqrt(%s) * sqrt(%s), %s)"};
  int k = pick(&g->r, 13);
  if (k == 12) {
    /* Comparisons on the error bounds of the kernel's exp/log/tanh. */
    expr a = gen_expr(g, numeric(g), depth - 1, 1);
    expr r = traced(fmt(edges[pick(&g->r, 6)], a.text, a.text, a.text));
    free(a.text);
    g->nodes += 3;
    return r;
  }
  if (k < 6) {
    int t = numeric(g);
    return binary(g, cmps[pick(&g->r, 6)], t, chance(&g->r, 70) ? t : numeric(g),
                  depth, 1);
  }
  if (k < 10) {
    expr a = gen_expr(g, T_BOOL, depth - 1, 1);
    expr b = gen_expr(g, T_BOOL, depth - 1, 1);
    expr r = traced(fmt(logic[pick(&g->r, 5)], a.text, b.text));
    free(a.text), free(b.text);
    g->nodes++;
    return r;
  }
  if (k == 10) return unary(g, chance(&g->r, 50) ? "(~%s)" : "logical_not(%s)", T_BOOL, depth);
  return where_expr(g, T_BOOL, depth);
}

static expr gen_expr(gen *g, int type, int depth, int need_traced) {
  if (depth <= 0 || g->nodes > 400 || chance(&g->r, 20)) return leaf(g, type, need_traced);
  if (type == T_BOOL) return gen_bool(g, depth);
  if (type == T_I32) return gen_i32(g, depth, need_traced);
  return gen_f32(g, depth, need_traced);
}

/* Locals t<i> inside a mod body (shared subexpressions), then the return. */
static void gen_body(gen *g, FILE *f, int ret_type, const char *indent) {
  int locals = pick(&g->r, 4) == 0 ? 0 : between(&g->r, 1, 12);
  int base[NUM_T] = {g->num_names[0], g->num_names[1], g->num_names[2]};
  for (int t = 0; t < NUM_T; t++) g->first_local[t] = g->num_names[t];
  for (int i = 0; i < locals; i++) {
    int t = pick(&g->r, NUM_T);
    expr e = gen_expr(g, t, between(&g->r, 1, 4), 1);
    char *name = own(g, fmt("t%d", g->num_owned));
    fprintf(f, "%slocal %s = %s\n", indent, name, e.text);
    free(e.text);
    add_name(g, t, name);
  }
  expr e = gen_expr(g, ret_type, between(&g->r, 3, 6), 1);
  fprintf(f, "%sreturn %s\n", indent, e.text);
  free(e.text);
  for (int t = 0; t < NUM_T; t++) g->num_names[t] = g->first_local[t] = base[t];
}

static void set_args(gen *g, int score) {
  for (int t = 0; t < NUM_T; t++) g->num_names[t] = 0;
  static const char *const ints[] = {"b", "h", "q", "kv", "q", "kv", "q",
                                     "kv", "h", "Lq", "Lk", "B", "Hq", "Hkv"};
  for (int i = 0; i < 14; i++) add_name(g, T_I32, ints[i]);
  if (score) add_name(g, T_F32, "score");
}

/* The whole chunk, written to f. Params and buffers are declared at the
 * top and added to the names of every mod. */
static void gen_spec(gen *g, FILE *f) {
  int nparams = between(&g->r, 0, 3), nbufs = between(&g->r, 0, 2);
  char *pnames[3];
  int ptypes[3];
  g->num_ibufs = g->num_fbufs = 0;
  for (int i = 0; i < nparams; i++) {
    ptypes[i] = chance(&g->r, 50) ? T_I32 : T_F32;
    pnames[i] = own(g, fmt("p%d", i));
    fprintf(f, "local %s = param(\"%s\", \"%s\")\n", pnames[i], pnames[i],
            ptypes[i] == T_I32 ? "i32" : "f32");
  }
  for (int i = 0; i < nbufs; i++) {
    int t = chance(&g->r, 50) ? T_I32 : T_F32;
    char *name = own(g, fmt("d%d", i));
    fprintf(f, "local %s = buffer(\"%s\", \"%s\")\n", name, name,
            t == T_I32 ? "i32" : "f32");
    if (t == T_I32)
      g->ibufs[g->num_ibufs++] = name;
    else
      g->fbufs[g->num_fbufs++] = name;
  }
  int has_mask = chance(&g->r, 85), has_score = !has_mask || chance(&g->r, 50);
  fprintf(f, "return {\n");
  if (has_mask) {
    set_args(g, 0);
    for (int i = 0; i < nparams; i++) add_name(g, ptypes[i], pnames[i]);
    /* A prelude builder around the generated function, sometimes. */
    char wrap[160] = "";
    const char *ip = NULL;
    for (int i = 0; i < nparams; i++)
      if (ptypes[i] == T_I32) ip = pnames[i];
    int k = pick(&g->r, 12);
    if (k == 0) snprintf(wrap, sizeof wrap, "and_masks(causal(), ");
    if (k == 1) snprintf(wrap, sizeof wrap, "or_masks(sliding_window(%s), ", ip ? ip : "33");
    if (k == 2) snprintf(wrap, sizeof wrap, "and_masks(chunked(%d), ", between(&g->r, 1, 40));
    if (k == 3 && g->num_ibufs)
      snprintf(wrap, sizeof wrap, "and_masks(document(%s), ", g->ibufs[0]);
    if (k == 3 && !g->num_ibufs)
      snprintf(wrap, sizeof wrap, "or_masks(prefix_lm(%s), ", ip ? ip : "5");
    if (k == 4)
      snprintf(wrap, sizeof wrap, "and_masks(causal{align = \"bottom_right\"}, ");
    if (k == 5)
      snprintf(wrap, sizeof wrap, "and_masks(sliding_window(%d, {causal = false}), ",
               between(&g->r, 1, 50));
    fprintf(f, "  mask_mod = %sfunction(b, h, q, kv)\n", wrap);
    gen_body(g, f, T_BOOL, "    ");
    fprintf(f, "  end%s,\n", wrap[0] ? ")" : "");
  }
  if (has_score) {
    set_args(g, 1);
    for (int i = 0; i < nparams; i++) add_name(g, ptypes[i], pnames[i]);
    char wrap[160] = "";
    int k = pick(&g->r, 12);
    if (k == 0) snprintf(wrap, sizeof wrap, "compose_scores(softcap(%d), ", between(&g->r, 1, 50));
    if (k == 1) snprintf(wrap, sizeof wrap, "compose_scores(alibi(), ");
    if (k == 2) snprintf(wrap, sizeof wrap, "compose_scores(alibi(%d), ", between(&g->r, 1, 16));
    if (k == 3 && g->num_fbufs)
      snprintf(wrap, sizeof wrap, "compose_scores(relative_bias(%s), ", g->fbufs[0]);
    fprintf(f, "  score_mod = %sfunction(score, b, h, q, kv)\n", wrap);
    gen_body(g, f, chance(&g->r, 80) ? T_F32 : T_I32, "    ");
    fprintf(f, "  end%s,\n", wrap[0] ? ")" : "");
  }
  fprintf(f, "}\n");
}

/* Spec `index` of `seed` as Lua text (malloc'd). */
static char *spec_text(uint64_t seed, long index) {
  gen g;
  memset(&g, 0, sizeof g);
  g.r.s = seed * 0x2545f4914f6cdd1dull + (uint64_t)index * 0x9e3779b97f4a7c15ull;
  next(&g.r);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) abort();
  fprintf(f, "-- fuzz_specs seed %llu spec %ld\n", (unsigned long long)seed, index);
  gen_spec(&g, f);
  fclose(f);
  for (int i = 0; i < g.num_owned; i++) free(g.owned[i]);
  return text;
}

/* ---- the run ---- */

typedef struct options {
  uint64_t seed;
  long first, count;
  int nvrtc_every, host_batch, verbose;
  long show;
} options;

typedef struct stats {
  long specs, failures, nodes, uncertain_specs, nvrtc, nvrtc_skipped;
  long host_points, elements;
} stats;

static int vreport(const char *spec, uint64_t seed, long index, const char *what,
                   va_list ap) {
  printf("FAIL seed %llu spec %ld: ", (unsigned long long)seed, index);
  vprintf(what, ap);
  printf("\n--- spec (repeat: --seed %llu --first %ld --count 1) ---\n%s---\n",
         (unsigned long long)seed, index, spec);
  fflush(stdout);
  return 1;
}

static int report(const char *spec, uint64_t seed, long index,
                  const char *what, ...) __attribute__((format(printf, 4, 5)));
static int report(const char *spec, uint64_t seed, long index,
                  const char *what, ...) {
  va_list ap;
  va_start(ap, what);
  vreport(spec, seed, index, what, ap);
  va_end(ap);
  return 1;
}

/* check_masks's failures, reported with the spec's text, seed and index. */
typedef struct spec_ref {
  const char *text;
  uint64_t seed;
  long index;
} spec_ref;

static int report_mask(void *user, const char *what, ...) __attribute__((format(printf, 2, 3)));
static int report_mask(void *user, const char *what, ...) {
  const spec_ref *ref = user;
  va_list ap;
  va_start(ap, what);
  vreport(ref->text, ref->seed, ref->index, what, ap);
  va_end(ap);
  return 1;
}

/* ---- host execution of emitted prologues ---- */

typedef struct pending {
  char *text;
  long index;
  fj_spec *spec;
} pending;

static const char *const host_prelude = FJT_HOST_PRELUDE;

typedef int (*mask_fn)(const void *, const int *, int, int, int, int);
typedef float (*score_fn)(const void *, const int *, float, int, int, int, int);
typedef int (*tile_fn)(const void *, const int *, int, int, int, int, int, int);
typedef float (*log2_fn)(const void *, const int *, float, float, int, int, int, int, int,
                         int);

static int within(const fjg_aval *a, float got) {
  if (isnan(got)) return a->exact ? isnan(a->v.f) : a->nan;
  if (a->exact) return memcmp(&a->v.f, &got, sizeof got) == 0;
  return a->flo <= got && got <= a->fhi;
}

static int host_check_one(void *lib, int k, const pending *p, const options *o,
                          stats *st) {
  const fjg_graph *g = fjr_spec_graph(p->spec);
  char name[32];
  snprintf(name, sizeof name, "mask_%d", k);
  mask_fn mask = (mask_fn)dlsym(lib, name);
  snprintf(name, sizeof name, "score_%d", k);
  score_fn score = (score_fn)dlsym(lib, name);
  snprintf(name, sizeof name, "tile_%d", k);
  tile_fn tile = (tile_fn)dlsym(lib, name);
  snprintf(name, sizeof name, "log2_%d", k);
  log2_fn log2v = (log2_fn)dlsym(lib, name);
  snprintf(name, sizeof name, "rows_%d", k);
  mask_fn rows = (mask_fn)dlsym(lib, name);
  snprintf(name, sizeof name, "cols_%d", k);
  mask_fn cols = (mask_fn)dlsym(lib, name);
  if (!mask || !score || !tile || !log2v || !rows || !cols)
    return report(p->text, o->seed, p->index, "dlsym");
  /* The kernels' form of a score_mod that is not additive is fj_score_mod's
   * value times log2 e, bit for bit (an additive one is rearranged:
   * unit/test_emit_cuda bounds it). */
  const int additive = fjg_score_is_additive(g);
  rng r = {o->seed ^ ((uint64_t)p->index << 20) ^ 0x51ed27};
  world w;
  world_init(&w, g, &r, between(&r, 1, 300), between(&r, 1, 300), 2, 4);
  int32_t i32s[8];
  float f32s[8];
  uint64_t ptrs[8];
  for (int a = 0; a < 8; a++) {
    i32s[a] = w.pi[a], f32s[a] = w.pf[a];
    ptrs[a] = (uint64_t)(uintptr_t)w.data[a];
  }
  unsigned char params[512];
  if (fjg_user_params_size(g) > sizeof params) return 0;
  fjg_user_params_pack(g, i32s, f32s, ptrs, w.len, params);
  fjg_evaluator e;
  if (fjg_evaluator_init(&e, g, &w.env) != FJ_OK) return report(p->text, o->seed, p->index, "no memory");
  int failed = 0;
  for (int t = 0; t < 64 && !failed; t++) {
    int b = pick(&r, 2), h = pick(&r, 4), q = between(&r, -3, 300), kv = between(&r, -3, 300);
    int want = fjg_eval_mask3(&e, b, h, q, kv), got = mask(params, w.env.sizes, b, h, q, kv);
    const int certain = want != FJG_UNCERTAIN;
    if (certain && want != got)
      failed = report(p->text, o->seed, p->index,
                      "host mask(b %d h %d q %d kv %d) = %d, evaluator %d", b, h, q, kv, got, want);
    /* fj_mask and its forms from row or column values are compiled apart:
     * an element the evaluator finds uncertain (fminf of -0 and +0, say:
     * docs/precision.md) each may decide its own way, as the kernels may. */
    const int from_rows = rows(params, w.env.sizes, b, h, q, kv);
    if (!failed && certain && from_rows != got)
      failed = report(p->text, o->seed, p->index,
                      "host mask from its row values (b %d h %d q %d kv %d) = %d, mask %d", b, h,
                      q, kv, from_rows, got);
    const int from_cols = cols(params, w.env.sizes, b, h, q, kv);
    if (!failed && certain && from_cols != got)
      failed = report(p->text, o->seed, p->index,
                      "host mask from its column values (b %d h %d q %d kv %d) = %d, mask %d", b,
                      h, q, kv, from_cols, got);
    float s = chance(&r, 10) ? random_float(&r) : (float)between(&r, -800, 800) / 32.0f;
    float gs = score(params, w.env.sizes, s, b, h, q, kv);
    const fjg_aval *ws = fjg_eval_root(&e, 1, s, b, h, q, kv);
    if (!failed && ws && !within(ws, gs))
      failed = report(p->text, o->seed, p->index,
                      "host score(%a, b %d h %d q %d kv %d) = %a, evaluator %a [%a, %a]%s%s",
                      s, b, h, q, kv, gs, ws->v.f, ws->flo, ws->fhi,
                      ws->exact ? " exact" : "", ws->nan ? " nan" : "");
    if (!failed && !additive) {
      const int dq = pick(&r, 64), dk = pick(&r, 64);
      const float want = gs * 1.4426950408889634f;
      const float got = log2v(params, w.env.sizes, s, 1.0f, b, h, q - dq, dq, kv - dk, dk);
      if (!(isnan(want) && isnan(got)) && memcmp(&want, &got, sizeof got) != 0)
        failed = report(p->text, o->seed, p->index,
                        "host score_log2(%a, b %d h %d q %d kv %d) = %a, not %a", s, b, h, q,
                        kv, got, want);
    }
    int q0 = between(&r, -10, 300), kv0 = between(&r, -10, 300);
    int q1 = q0 + pick(&r, 64), kv1 = kv0 + pick(&r, 64);
    int wc = fjg_tile_class_cpu(g, &w.env, b, h, q0, q1, kv0, kv1);
    int gc = tile(params, w.env.sizes, b, h, q0, q1, kv0, kv1);
    if (!failed && wc != gc)
      failed = report(p->text, o->seed, p->index,
                      "host tile class q [%d, %d] kv [%d, %d] = %d, CPU %d", q0, q1, kv0, kv1, gc, wc);
    st->host_points++;
  }
  fjg_evaluator_free(&e);
  return failed;
}

/* Compiles the batch's prologues into one shared object and checks each. */
/* extern "C" int WHAT_k(u, z, b, h, q, kv): spec k's mask from its n values
 * of one side (fj_mask_WHAT of `index`, then fj_mask_from_WHAT), or fj_mask
 * where it has none. */
static void put_from_values(fjg_buf *src, int k, const char *what, const char *index, int n) {
  fjg_buf_printf(src,
      "extern \"C\" int %s_%d(const void *u, const int *z, int b, int h, int q, int kv) {\n"
      "  const g%d::fj_user_params &p = *(const g%d::fj_user_params *)u;\n"
      "  const fj_sizes &s = *(const fj_sizes *)z;\n",
      what, k, k, k);
  if (n > 0)
    fjg_buf_printf(src,
        "  unsigned v[%d];\n"
        "  g%d::fj_mask_%s(p, s, b, h, %s, v);\n"
        "  return g%d::fj_mask_from_%s(p, s, b, h, q, kv, v);\n}\n",
        n, k, what, index, k, what);
  else
    fjg_buf_printf(src, "  return g%d::fj_mask(p, s, b, h, q, kv);\n}\n", k);
}

static long host_check(pending *batch, int n, const options *o, stats *st) {
  if (!n) return 0;
  char dir[] = "/tmp/fuzz_specs_XXXXXX";
  if (!mkdtemp(dir)) return report("", o->seed, batch[0].index, "mkdtemp");
  fjg_buf src;
  fjg_buf_init(&src);
  fjg_buf_printf(&src, "%s", host_prelude);
  /* The prologues' fj_mask_rows and fj_mask_from_rows, fj_mask_cols and
   * fj_mask_from_cols, where a mask has such values (each sized by its own
   * count). */
  fjg_buf_printf(&src, "#define FJ_MASK_ROWS 1\n#define FJ_MASK_COLS 1\n");
  size_t len;
  const char *common = fjg_template_text("common/fj_common.cuh", &len);
  fjg_buf_append(&src, common, len);
  fjg_emit_interval_rules(NULL, &src);
  for (int k = 0; k < n; k++) {
    fjg_buf_printf(&src, "namespace g%d {\n", k);
    fjg_emit_prologue(fjr_spec_graph(batch[k].spec), &src);
    fjg_buf_printf(&src,
        "}\nextern \"C\" int mask_%d(const void *u, const int *z, int b, int h, int q, int kv) {\n"
        "  return g%d::fj_mask(*(const g%d::fj_user_params *)u, *(const fj_sizes *)z, b, h, q, kv);\n}\n"
        "extern \"C\" float score_%d(const void *u, const int *z, float s, int b, int h, int q, int kv) {\n"
        "  return g%d::fj_score_mod(*(const g%d::fj_user_params *)u, *(const fj_sizes *)z, s, b, h, q, kv);\n}\n"
        "extern \"C\" int tile_%d(const void *u, const int *z, int b, int h, int q0, int q1, int k0, int k1) {\n"
        "  return g%d::fj_tile_class(*(const g%d::fj_user_params *)u, *(const fj_sizes *)z, b, h, q0, q1, k0, k1);\n}\n"
        "extern \"C\" float log2_%d(const void *u, const int *z, float qk, float scale, int b, int h,\n"
        "    int qb, int dq, int kvb, int dk) {\n"
        "  return g%d::fj_score_log2(*(const g%d::fj_user_params *)u, *(const fj_sizes *)z, qk,\n"
        "      scale, b, h, qb, dq, kvb, dk);\n}\n",
        k, k, k, k, k, k, k, k, k, k, k, k);
    /* fj_mask again, from its row values and from its column values (the
     * mask itself without any). */
    put_from_values(&src, k, "rows", "q", fjg_mask_row_values(fjr_spec_graph(batch[k].spec)));
    put_from_values(&src, k, "cols", "kv", fjg_mask_col_values(fjr_spec_graph(batch[k].spec)));
  }
  char cpp[256], so[256], cmd[1024];
  snprintf(cpp, sizeof cpp, "%s/host.cpp", dir);
  snprintf(so, sizeof so, "%s/host.so", dir);
  FILE *f = fopen(cpp, "wb");
  long failures = 0;
  if (!f || src.failed) {
    failures = report("", o->seed, batch[0].index, "writing %s", cpp);
    goto done;
  }
  fwrite(src.data, 1, src.len, f);
  fclose(f);
  snprintf(cmd, sizeof cmd,
           "g++ -std=c++17 -O1 -ffp-contract=off -fPIC -shared -w -o %s %s", so, cpp);
  if (system(cmd) != 0) {
    for (int k = 0; k < n; k++)
      failures += report(batch[k].text, o->seed, batch[k].index,
                         "host compile of the batch failed (%s)", cmd);
    goto done;
  }
  void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    failures = report("", o->seed, batch[0].index, "dlopen: %s", dlerror());
    goto done;
  }
  for (int k = 0; k < n; k++) failures += host_check_one(lib, k, &batch[k], o, st);
  dlclose(lib);
done:
  fjg_buf_free(&src);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return failures;
}

/* ---- main ---- */

static int parse(int argc, char **argv, options *o) {
  o->seed = 1, o->first = 0, o->count = 300;
  o->nvrtc_every = 100, o->host_batch = 100, o->verbose = 0, o->show = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--verbose")) {
      o->verbose = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "fuzz_specs: unknown option or missing value '%s'\n", a);
      return 2;
    }
    char *end;
    long long x = strtoll(v, &end, 0);
    if (*end || x < 0) {
      fprintf(stderr, "fuzz_specs: %s: '%s' is not a number >= 0\n", a, v);
      return 2;
    }
    i++;
    if (!strcmp(a, "--seed")) o->seed = (uint64_t)x;
    else if (!strcmp(a, "--first")) o->first = (long)x;
    else if (!strcmp(a, "--count")) o->count = (long)x;
    else if (!strcmp(a, "--nvrtc-every")) o->nvrtc_every = (int)x;
    else if (!strcmp(a, "--host-batch")) o->host_batch = (int)(x > 400 ? 400 : x);
    else if (!strcmp(a, "--show")) o->show = (long)x;
    else {
      fprintf(stderr, "fuzz_specs: unknown option '%s'\n", a);
      return 2;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  options o;
  int rc = parse(argc, argv, &o);
  if (rc) return rc;
  if (o.show >= 0) {
    char *text = spec_text(o.seed, o.show);
    fputs(text, stdout);
    free(text);
    return 0;
  }
  fj_context_options co;
  fj_context_options_init(&co);
  co.cache_dir = ""; /* compile in memory only */
  co.arch = "sm_80";
  fj_context *ctx = NULL;
  if (fj_context_create(&co, &ctx) != FJ_OK) {
    fprintf(stderr, "fuzz_specs: cannot create a context\n");
    return 1;
  }
  stats st;
  memset(&st, 0, sizeof st);
  pending *batch = calloc((size_t)(o.host_batch > 0 ? o.host_batch : 1), sizeof *batch);
  int in_batch = 0, nvrtc_ok = 1;
  char src_path[] = "/tmp/fuzz_specs_src_XXXXXX";
  int fd = mkstemp(src_path);
  if (fd >= 0) close(fd);
  if (o.host_batch > 0 && system("g++ --version > /dev/null 2>&1") != 0) {
    printf("g++ not found: host checks skipped\n");
    o.host_batch = 0;
  }
  time_t t0 = time(NULL);
  for (long i = o.first; i < o.first + o.count; i++) {
    char *text = spec_text(o.seed, i);
    fj_spec *spec = NULL;
    st.specs++;
    if (fj_spec_load_string(ctx, text, strlen(text), "fuzz.lua", &spec) != FJ_OK) {
      st.failures += report(text, o.seed, i, "load: %s", fj_context_last_error(ctx));
      free(text);
      continue;
    }
    const fjg_graph *g = fjr_spec_graph(spec);
    st.nodes += fjg_num_nodes(g);
    if (o.verbose) printf("spec %ld: %d nodes\n", i, fjg_num_nodes(g));
    fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = "sm_80",
                            .kernel_template = "sm80"};
    fj_status s = fj_emit_forward_source(ctx, spec, &ko, src_path);
    if (s != FJ_OK)
      st.failures += report(text, o.seed, i, "emit: %s", fj_context_last_error(ctx));
    if (nvrtc_ok && o.nvrtc_every > 0 && (i - o.first) % o.nvrtc_every == 0) {
      fj_kernel_info info;
      s = fj_compile_forward(ctx, spec, &ko, &info);
      if (s == FJ_ENONVRTC) {
        nvrtc_ok = 0;
        printf("NVRTC unavailable: compiles skipped\n");
      } else if (s != FJ_OK) {
        st.failures += report(text, o.seed, i, "NVRTC: %s", fj_context_last_error(ctx));
      } else {
        st.nvrtc++;
      }
    }
    rng r = {o.seed * 31 + (uint64_t)i};
    spec_ref ref = {text, o.seed, i};
    st.failures += check_masks(g, &r, report_mask, &ref, &st.elements, &st.uncertain_specs);
    if (o.host_batch > 0) {
      batch[in_batch].text = text;
      batch[in_batch].index = i;
      batch[in_batch++].spec = spec;
      if (in_batch == o.host_batch) {
        st.failures += host_check(batch, in_batch, &o, &st);
        for (int k = 0; k < in_batch; k++) free(batch[k].text), fj_spec_destroy(batch[k].spec);
        in_batch = 0;
      }
    } else {
      free(text);
      fj_spec_destroy(spec);
    }
    if ((i - o.first + 1) % 1000 == 0) {
      printf("%ld specs, %ld failures, %ld s\n", i - o.first + 1, st.failures,
             (long)(time(NULL) - t0));
      fflush(stdout);
    }
  }
  st.failures += host_check(batch, in_batch, &o, &st);
  for (int k = 0; k < in_batch; k++) free(batch[k].text), fj_spec_destroy(batch[k].spec);
  free(batch);
  unlink(src_path);
  printf("fuzz_specs seed %llu specs %ld..%ld: %ld specs (%.1f nodes on average), "
         "%ld with uncertain elements, %ld elements and %ld host points checked, "
         "%ld NVRTC compiles: %ld failures (%ld s)\n",
         (unsigned long long)o.seed, o.first, o.first + o.count - 1, st.specs,
         st.specs ? (double)st.nodes / st.specs : 0.0, st.uncertain_specs,
         st.elements, st.host_points, st.nvrtc, st.failures,
         (long)(time(NULL) - t0));
  fj_context_destroy(ctx);
  return st.failures ? 1 : 0;
}
