/*
 * tests/unit/test_reference_backward.c: the CPU reference of the backward
 * pass (gen/reference.c).
 *
 * fjg_reference_backward's dq, dk, dv and trainable-buffer gradients are
 * compared with central finite differences of the float64 forward
 * reference's loss sum(O * dO) + sum(LSE * dLSE) on small random problems:
 * odd sizes, GQA, Lq != Lk, causal, sliding-window and document masks, a
 * fully masked row, softcap, ALiBi with trainable slopes and a trainable
 * relative bias. The computation in the input dtype must be close to it,
 * closer in fp16 than in bf16, and the comparison rule for gradients
 * (3x) must pass it and fail larger errors.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gen/graph.h"
#include "gen/reference.h"
#include "lua/spec.h"

typedef struct rng {
  uint64_t s;
} rng;

static double uniform(rng *r) {
  r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
  return ((r->s >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double normal(rng *r) {
  double u = uniform(r), v = uniform(r);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static double *random_array(rng *r, size_t n) {
  double *x = malloc(sizeof(double) * (n ? n : 1));
  assert_non_null(x);
  for (size_t i = 0; i < n; i++) x[i] = normal(r);
  return x;
}

static fjg_graph *trace(const char *src) {
  fjg_graph *g = NULL;
  char err[1024] = "";
  if (fjl_trace_spec(src, strlen(src), "spec.lua", &g, NULL, err, sizeof err) != FJ_OK)
    fail_msg("trace failed: %s\n%s", err, src);
  return g;
}

/* A problem, its inputs and the runtime values of its spec. */
enum { MAX_ARGS = 4, BUF_MAX = 32 };

typedef struct bwd_case {
  const char *name;
  int B, Hq, Hkv, Lq, Lk, D;
  double scale;
  const char *spec; /* NULL: full attention */
  /* Runtime values by name: f32 params, i32 and f32 buffers. */
  struct {
    const char *name;
    float f;
    int len;
    int32_t ints[BUF_MAX];
    int random_floats; /* f32 buffer: random values */
  } args[MAX_ARGS];
  int use_dlse;
} bwd_case;

typedef struct problem {
  fjg_graph *g;
  fjg_ref_problem p;
  fjg_env env;
  float f32s[MAX_ARGS];
  int32_t i32s[MAX_ARGS];
  const void *data[MAX_ARGS];
  int64_t lens[MAX_ARGS];
  int32_t ibuf[MAX_ARGS][BUF_MAX];
  float fbuf[MAX_ARGS][BUF_MAX];
  double *q, *k, *v, *dout, *dlse;
  size_t nq, nk, nl;
} problem;

static void problem_init(problem *pr, const bwd_case *c, rng *r) {
  memset(pr, 0, sizeof *pr);
  pr->g = c->spec ? trace(c->spec) : NULL;
  for (int a = 0; pr->g && a < fjg_num_args(pr->g); a++) {
    const fjg_arg *arg = fjg_arg_at(pr->g, a);
    int found = -1;
    for (int i = 0; i < MAX_ARGS && c->args[i].name; i++)
      if (strcmp(c->args[i].name, arg->name) == 0) found = i;
    if (found < 0) fail_msg("%s: no value for '%s'", c->name, arg->name);
    if (arg->kind == FJ_ARG_F32) pr->f32s[a] = c->args[found].f;
    if (arg->kind != FJ_ARG_BUFFER) continue;
    pr->lens[a] = c->args[found].len;
    for (int i = 0; i < c->args[found].len; i++) {
      pr->ibuf[a][i] = c->args[found].ints[i];
      pr->fbuf[a][i] = c->args[found].random_floats ? (float)(uniform(r) * 2 - 1) : 0.0f;
    }
    pr->data[a] = arg->type == FJG_F32 ? (const void *)pr->fbuf[a] : (const void *)pr->ibuf[a];
  }
  pr->env.param_f32 = pr->f32s;
  pr->env.param_i32 = pr->i32s;
  pr->env.buffer_data = pr->data;
  pr->env.buffer_len = pr->lens;
  fjg_ref_problem p = {c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->D, c->scale, pr->g,
                       &pr->env, 2, 0};
  pr->p = p;
  pr->nq = (size_t)c->B * c->Hq * c->Lq * c->D;
  pr->nk = (size_t)c->B * c->Hkv * c->Lk * c->D;
  pr->nl = (size_t)c->B * c->Hq * c->Lq;
  pr->q = random_array(r, pr->nq);
  pr->k = random_array(r, pr->nk);
  pr->v = random_array(r, pr->nk);
  pr->dout = random_array(r, pr->nq);
  pr->dlse = c->use_dlse ? random_array(r, pr->nl) : NULL;
}

static void problem_free(problem *pr) {
  free(pr->q), free(pr->k), free(pr->v), free(pr->dout), free(pr->dlse);
  fjg_graph_destroy(pr->g);
}

/* sum(O * dO) + sum(LSE * dLSE) over rows with a finite LSE. */
static double loss(problem *pr) {
  double *o = malloc(sizeof(double) * (pr->nq ? pr->nq : 1));
  double *lse = malloc(sizeof(double) * (pr->nl ? pr->nl : 1));
  assert_int_equal(fjg_reference_dense(&pr->p, pr->q, pr->k, pr->v, o, lse), FJ_OK);
  double f = 0;
  for (size_t i = 0; i < pr->nq; i++) f += o[i] * pr->dout[i];
  for (size_t i = 0; pr->dlse && i < pr->nl; i++)
    if (isfinite(lse[i])) f += lse[i] * pr->dlse[i];
  free(o), free(lse);
  return f;
}

/* Central difference of the loss in x[i] (double), step h. */
static double fd_double(problem *pr, double *x, size_t i, double h) {
  const double x0 = x[i];
  x[i] = x0 + h;
  double hi = loss(pr);
  x[i] = x0 - h;
  double lo = loss(pr);
  x[i] = x0;
  return (hi - lo) / (2 * h);
}

/* Central difference in a float buffer element: the step as float. */
static double fd_float(problem *pr, float *x, int i, float h) {
  const float x0 = x[i];
  x[i] = x0 + h;
  double hi = loss(pr);
  const float up = x[i];
  x[i] = x0 - h;
  double lo = loss(pr);
  const float down = x[i];
  x[i] = x0;
  return (hi - lo) / ((double)up - (double)down);
}

static double max_abs(const double *x, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
  return m;
}

/* Every element of x: the analytic gradient an[i] against the finite
 * difference, within tol * (max |an| + 1e-3). */
static void compare_fd(problem *pr, const char *what, const char *tensor, double *x,
                       const double *an, size_t n, double h, double tol) {
  const double scale = max_abs(an, n) + 1e-3;
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double fd = fd_double(pr, x, i, h);
    if (fabs(fd - an[i]) > tol * scale)
      fail_msg("%s: d%s[%zu] = %.9g, finite difference %.9g (scale %.3g)", what, tensor, i,
               an[i], fd, scale);
    worst = fmax(worst, fabs(fd - an[i]) / scale);
  }
  print_message("%s: d%s, %zu elements, max |fd - grad| / max |grad| = %.2g\n", what, tensor,
                n, worst);
}

static void check_case(const bwd_case *c, uint64_t seed) {
  rng r = {seed};
  problem pr;
  problem_init(&pr, c, &r);
  double *o = malloc(sizeof(double) * pr.nq), *lse = malloc(sizeof(double) * pr.nl);
  double *dq = malloc(sizeof(double) * pr.nq);
  double *dk = malloc(sizeof(double) * pr.nk), *dv = malloc(sizeof(double) * pr.nk);
  double *dbuf_store[MAX_ARGS] = {0};
  double *dbuf[MAX_ARGS] = {0};
  const int nargs = pr.g ? fjg_num_args(pr.g) : 0;
  for (int a = 0; a < nargs; a++)
    if (fjg_arg_at(pr.g, a)->trainable) {
      dbuf_store[a] = malloc(sizeof(double) * BUF_MAX);
      dbuf[a] = dbuf_store[a];
      for (int i = 0; i < BUF_MAX; i++) dbuf[a][i] = NAN; /* must be overwritten */
    }
  assert_int_equal(fjg_reference_backward(&pr.p, pr.q, pr.k, pr.v, pr.dout, pr.dlse, o, lse,
                                          dq, dk, dv, dbuf),
                   FJ_OK);
  /* The forward it computed is the dense reference's. */
  double *o2 = malloc(sizeof(double) * pr.nq), *lse2 = malloc(sizeof(double) * pr.nl);
  assert_int_equal(fjg_reference_dense(&pr.p, pr.q, pr.k, pr.v, o2, lse2), FJ_OK);
  for (size_t i = 0; i < pr.nq; i++) assert_true(fabs(o[i] - o2[i]) < 1e-12);
  for (size_t i = 0; i < pr.nl; i++)
    assert_true(lse[i] == lse2[i] || fabs(lse[i] - lse2[i]) < 1e-12);
  /* Scores through a float32 score_mod carry rounding noise of ~1e-7: a
   * larger step keeps it small against the step. */
  const int f32_scores = pr.g && fjg_score_root(pr.g) >= 0;
  const double h = f32_scores ? 2e-3 : 1e-5, tol = f32_scores ? 1e-3 : 1e-6;
  compare_fd(&pr, c->name, "q", pr.q, dq, pr.nq, h, tol);
  compare_fd(&pr, c->name, "k", pr.k, dk, pr.nk, h, tol);
  compare_fd(&pr, c->name, "v", pr.v, dv, pr.nk, h, tol);
  for (int a = 0; a < nargs; a++) {
    if (!dbuf[a]) continue;
    const double scale = max_abs(dbuf[a], (size_t)pr.lens[a]) + 1e-3;
    double worst = 0;
    for (int i = 0; i < pr.lens[a]; i++) {
      double fd = fd_float(&pr, pr.fbuf[a], i, 0x1p-9f);
      if (fabs(fd - dbuf[a][i]) > tol * scale)
        fail_msg("%s: d%s[%d] = %.9g, finite difference %.9g", c->name,
                 fjg_arg_at(pr.g, a)->name, i, dbuf[a][i], fd);
      worst = fmax(worst, fabs(fd - dbuf[a][i]) / scale);
    }
    print_message("%s: d%s, %d elements, max |fd - grad| / max |grad| = %.2g\n", c->name,
                  fjg_arg_at(pr.g, a)->name, (int)pr.lens[a], worst);
    for (int i = (int)pr.lens[a]; i < BUF_MAX; i++) assert_true(isnan(dbuf[a][i]));
  }
  /* A fully masked row: lse -inf, o and dq exactly 0. */
  for (size_t row = 0; row < pr.nl; row++) {
    if (lse[row] != -INFINITY) continue;
    for (int d = 0; d < c->D; d++) {
      assert_true(o[row * c->D + d] == 0);
      assert_true(dq[row * c->D + d] == 0);
    }
  }
  free(o), free(lse), free(o2), free(lse2), free(dq), free(dk), free(dv);
  for (int a = 0; a < MAX_ARGS; a++) free(dbuf_store[a]);
  problem_free(&pr);
}

static const bwd_case cases[] = {
    {"full, GQA", 1, 4, 2, 5, 7, 3, 0, NULL, {{0}}, 1},
    {"bottom-right causal, softcap, GQA", 2, 2, 1, 6, 9, 5, 0,
     "local cap = param('cap', 'f32')\n"
     "return { mask_mod = causal({align = 'bottom_right'}), score_mod = softcap(cap) }",
     {{"cap", 2.5f, 0, {0}, 0}}, 0},
    {"document with a fully masked row, trainable relative bias", 1, 3, 3, 7, 6, 4, 0.4,
     "local doc = buffer('doc', 'i32')\n"
     "local kv_doc = buffer('kv_doc', 'i32')\n"
     "local bias = buffer('bias', 'f32', {grad = true})\n"
     "return { mask_mod = document(doc, {causal = false, kv_doc = kv_doc}),\n"
     "         score_mod = relative_bias(bias) }",
     {{"doc", 0, 7, {0, 0, 1, 9, 1, 2, 2}, 0},
      {"kv_doc", 0, 6, {0, 1, 1, 1, 2, 2}, 0},
      {"bias", 0, 12, {0}, 1}},
     1},
    {"sliding window, trainable ALiBi slopes and bias table, GQA", 1, 4, 1, 8, 11, 2, 0.7,
     "local slopes = buffer('slopes', 'f32', {grad = true})\n"
     "local bias = buffer('bias', 'f32', {grad = true})\n"
     "return { mask_mod = sliding_window(5, {causal = false}),\n"
     "         score_mod = function(s, b, h, q, kv)\n"
     "           return s + slopes[h] * (kv - q) + tanh(bias[(q + kv) % 9]) * 2\n"
     "         end }",
     {{"slopes", 0, 4, {0}, 1}, {"bias", 0, 9, {0}, 1}},
     1},
};

static void test_gradients_match_finite_differences(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], 1000 + i);
}

/* ---- the input dtype ---- */

typedef struct grads {
  double *dq, *dk, *dv, *db;
  float *fq, *fk, *fv, *fb;
} grads;

/* Max |lowp - ref| / max |ref| over dq, dk, dv and the bias gradient. */
static void lowp_errors(fj_dtype dt, double err[4], grads *out, problem *pr) {
  const size_t n[4] = {pr->nq, pr->nk, pr->nk, BUF_MAX};
  out->dq = malloc(sizeof(double) * pr->nq), out->fq = malloc(sizeof(float) * pr->nq);
  out->dk = malloc(sizeof(double) * pr->nk), out->fk = malloc(sizeof(float) * pr->nk);
  out->dv = malloc(sizeof(double) * pr->nk), out->fv = malloc(sizeof(float) * pr->nk);
  out->db = calloc(BUF_MAX, sizeof(double)), out->fb = calloc(BUF_MAX, sizeof(float));
  const int bias = fjg_find_arg(pr->g, "bias");
  double *dbuf[MAX_ARGS] = {0};
  float *fbuf[MAX_ARGS] = {0};
  dbuf[bias] = out->db, fbuf[bias] = out->fb;
  assert_int_equal(fjg_reference_backward(&pr->p, pr->q, pr->k, pr->v, pr->dout, pr->dlse, NULL,
                                          NULL, out->dq, out->dk, out->dv, dbuf),
                   FJ_OK);
  assert_int_equal(fjg_reference_backward_lowp(&pr->p, dt, pr->q, pr->k, pr->v, pr->dout,
                                               pr->dlse, out->fq, out->fk, out->fv, fbuf),
                   FJ_OK);
  const double *ref[4] = {out->dq, out->dk, out->dv, out->db};
  const float *low[4] = {out->fq, out->fk, out->fv, out->fb};
  for (int t = 0; t < 4; t++) {
    double e = 0;
    for (size_t i = 0; i < n[t]; i++) {
      if (t < 3) assert_true(low[t][i] == fjg_round_to_dtype(low[t][i], dt));
      e = fmax(e, fabs(low[t][i] - ref[t][i]));
    }
    err[t] = e / max_abs(ref[t], n[t]);
  }
}

static void grads_free(grads *g) {
  free(g->dq), free(g->dk), free(g->dv), free(g->db);
  free(g->fq), free(g->fk), free(g->fv), free(g->fb);
}

static const bwd_case lowp_case = {
    "causal, bias", 2, 4, 2, 48, 40, 32, 0,
    "local bias = buffer('bias', 'f32', {grad = true})\n"
    "return { mask_mod = causal({align = 'bottom_right'}),\n"
    "         score_mod = function(s, b, h, q, kv) return s + bias[(q - kv) % 32] end }",
    {{"bias", 0, 32, {0}, 1}},
    1};

static void test_lowp_error_sizes(void **state) {
  (void)state;
  double ebf[4], ef16[4];
  grads gb, gh;
  rng r = {77};
  problem pr;
  problem_init(&pr, &lowp_case, &r);
  lowp_errors(FJ_DTYPE_BF16, ebf, &gb, &pr);
  lowp_errors(FJ_DTYPE_F16, ef16, &gh, &pr);
  for (int t = 0; t < 4; t++) {
    print_message("relative error %s: bf16 %.3g, fp16 %.3g\n",
                  (const char *[]){"dq", "dk", "dv", "dbias"}[t], ebf[t], ef16[t]);
    /* bf16 keeps 8 bits, fp16 11: a few 1e-3 against a few 1e-4. */
    assert_true(ebf[t] > 1e-4 && ebf[t] < 5e-2);
    assert_true(ef16[t] < ebf[t] / 3);
  }

  /* The rule for gradients: 3x the emulation's error. */
  fjg_check_report rep;
  const size_t n = pr.nk;
  float *out = malloc(sizeof(float) * n);
  assert_true(fjg_ref_check_grad(gb.dk, gb.fk, gb.fk, n, 1, NULL, NULL, 0, &rep));
  assert_true(fabs(rep.tolerance - 3 * rep.max_err_lowp) < 1e-12);
  for (size_t i = 0; i < n; i++) out[i] = (float)(gb.dk[i] + 2.5 * (gb.fk[i] - gb.dk[i]));
  assert_true(fjg_ref_check_grad(gb.dk, gb.fk, out, n, 1, NULL, NULL, 0, &rep));
  assert_false(fjg_ref_check_rows(gb.dk, gb.fk, out, n, 1, NULL, 0, &rep)); /* 2x */
  for (size_t i = 0; i < n; i++) out[i] = (float)(gb.dk[i] + 3.5 * (gb.fk[i] - gb.dk[i]));
  assert_false(fjg_ref_check_grad(gb.dk, gb.fk, out, n, 1, NULL, NULL, 0, &rep));
  /* Keys no query attends have dk exactly 0 in both; so must the kernel. */
  size_t zeros = 0;
  for (size_t i = 0; i < n; i++) zeros += gb.dk[i] == 0 && gb.fk[i] == 0;
  assert_int_equal(zeros, 0); /* bottom-right causal: every key is attended */
  free(out);
  grads_free(&gb);
  grads_free(&gh);
  problem_free(&pr);
}

/* A fully masked row and keys nobody attends give exact zeros in both
 * computations; fjg_reference_zero_grad_rows finds those rows and the rule
 * requires them, and only them. */
static void test_exact_zeros(void **state) {
  (void)state;
  rng r = {5};
  problem pr;
  problem_init(&pr, &cases[2], &r); /* doc 9 of query 3 has no key */
  double *dq = malloc(sizeof(double) * pr.nq), *dk = malloc(sizeof(double) * pr.nk);
  double *dv = malloc(sizeof(double) * pr.nk);
  float *fq = malloc(sizeof(float) * pr.nq), *fk = malloc(sizeof(float) * pr.nk);
  float *fv = malloc(sizeof(float) * pr.nk);
  assert_int_equal(fjg_reference_backward(&pr.p, pr.q, pr.k, pr.v, pr.dout, pr.dlse, NULL, NULL,
                                          dq, dk, dv, NULL),
                   FJ_OK);
  assert_int_equal(fjg_reference_backward_lowp(&pr.p, FJ_DTYPE_BF16, pr.q, pr.k, pr.v, pr.dout,
                                               pr.dlse, fq, fk, fv, NULL),
                   FJ_OK);
  const int D = cases[2].D, Lq = cases[2].Lq;
  for (int h = 0; h < cases[2].Hq; h++)
    for (int d = 0; d < D; d++) {
      assert_true(dq[((size_t)h * Lq + 3) * D + d] == 0);
      assert_true(fq[((size_t)h * Lq + 3) * D + d] == 0);
    }
  uint8_t *qz = malloc(pr.nq / D), *kz = malloc(pr.nk / D);
  assert_int_equal(fjg_reference_zero_grad_rows(&pr.p, qz, kz), 0);
  for (int h = 0; h < cases[2].Hq; h++) assert_int_equal(qz[(size_t)h * Lq + 3], 1);
  fjg_check_report rep;
  float *out = malloc(sizeof(float) * pr.nq);
  memcpy(out, fq, sizeof(float) * pr.nq);
  assert_true(fjg_ref_check_grad(dq, fq, out, pr.nq, D, NULL, qz, 0, &rep));
  out[3 * D] = 1e-6f; /* head 0, row 3 */
  assert_false(fjg_ref_check_grad(dq, fq, out, pr.nq, D, NULL, qz, 1, &rep));
  assert_int_equal(rep.zero_mismatch, 1);
  /* Without the rows, a small value there is within the tolerance. */
  assert_true(fjg_ref_check_grad(dq, fq, out, pr.nq, D, NULL, NULL, 1, &rep));
  free(qz), free(kz);
  free(dq), free(dk), free(dv), free(fq), free(fk), free(fv), free(out);
  problem_free(&pr);
}

/* dLSE alone (dO = 0): dS' = P dL, so dq = scale sum_j P_ij dL_i k_j. */
static void test_dlse_alone(void **state) {
  (void)state;
  bwd_case c = cases[0];
  rng r = {11};
  problem pr;
  problem_init(&pr, &c, &r);
  memset(pr.dout, 0, sizeof(double) * pr.nq);
  double *dq = malloc(sizeof(double) * pr.nq), *dk = malloc(sizeof(double) * pr.nk);
  double *dv = malloc(sizeof(double) * pr.nk), *lse = malloc(sizeof(double) * pr.nl);
  assert_int_equal(fjg_reference_backward(&pr.p, pr.q, pr.k, pr.v, pr.dout, pr.dlse, NULL, lse,
                                          dq, dk, dv, NULL),
                   FJ_OK);
  const double scale = 1 / sqrt((double)c.D);
  for (int h = 0; h < c.Hq; h++)
    for (int i = 0; i < c.Lq; i++) {
      const size_t row = (size_t)h * c.Lq + i;
      const double *qi = pr.q + row * c.D;
      const double *kb = pr.k + (size_t)(h / (c.Hq / c.Hkv)) * c.Lk * c.D;
      for (int d = 0; d < c.D; d++) {
        double want = 0;
        for (int j = 0; j < c.Lk; j++) {
          double s = 0;
          for (int e = 0; e < c.D; e++) s += qi[e] * kb[j * c.D + e];
          want += exp(scale * s - lse[row]) * pr.dlse[row] * kb[j * c.D + d];
        }
        assert_true(fabs(dq[row * c.D + d] - scale * want) < 1e-12);
      }
    }
  for (size_t i = 0; i < pr.nk; i++) assert_true(dv[i] == 0);
  free(dq), free(dk), free(dv), free(lse);
  problem_free(&pr);
}

/* Keys an uncertain query row reaches: row 3's mask decides on tanh(0), so
 * its keys 3 and later (allowed, or maybe) are marked in its KV head. */
static void test_uncertain_kv_rows(void **state) {
  (void)state;
  fjg_graph *g = trace(
      "return { mask_mod = function(b, h, q, kv)\n"
      "  return where(eq(q, 3), le(tanh((q - kv) * 0.5), 0.0), ge(q, kv))\nend }");
  enum { B = 2, HQ = 4, HKV = 2, LQ = 6, LK = 9 };
  fjg_ref_problem p = {B, HQ, HKV, LQ, LK, 8, 0, g, NULL, 2, 0};
  uint8_t qrows[B * HQ * LQ], kvrows[B * HKV * LK];
  assert_int_equal(fjg_reference_uncertain_rows(&p, qrows), B * HQ);
  assert_int_equal(fjg_reference_uncertain_kv_rows(&p, qrows, kvrows), B * HKV * (LK - 3));
  for (int b = 0; b < B; b++)
    for (int hk = 0; hk < HKV; hk++)
      for (int c = 0; c < LK; c++) assert_int_equal(kvrows[(b * HKV + hk) * LK + c], c >= 3);
  assert_int_equal(fjg_reference_uncertain_kv_rows(&p, qrows, NULL), -1);
  fjg_graph_destroy(g);
}

static void test_rejects_bad_input(void **state) {
  (void)state;
  double x[64] = {0}, y[64];
  float f[64];
  fjg_ref_problem p = {1, 3, 2, 1, 1, 4, 0, NULL, NULL, 0, 0}; /* 3 % 2 != 0 */
  assert_int_equal(fjg_reference_backward(&p, x, x, x, x, NULL, NULL, NULL, y, y, y, NULL),
                   FJ_EINVAL);
  p.Hq = 2;
  assert_int_equal(fjg_reference_backward(&p, x, x, x, NULL, NULL, NULL, NULL, y, y, y, NULL),
                   FJ_EINVAL);
  assert_int_equal(fjg_reference_backward_lowp(&p, (fj_dtype)99, x, x, x, x, NULL, f, f, f, NULL),
                   FJ_EINVAL);
  /* A score_mod without its derivative cannot be differentiated. */
  fjg_graph *g = fjg_graph_create();
  assert_int_equal(fjg_set_score_root(g, fjg_unary(g, FJG_OP_TANH,
                                                   fjg_input_node(g, FJG_IN_SCORE))), 0);
  p.g = g;
  assert_int_equal(fjg_reference_backward(&p, x, x, x, x, NULL, NULL, NULL, y, y, y, NULL),
                   FJ_EINVAL);
  fjg_graph_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gradients_match_finite_differences),
      cmocka_unit_test(test_lowp_error_sizes),
      cmocka_unit_test(test_exact_zeros),
      cmocka_unit_test(test_dlse_alone),
      cmocka_unit_test(test_uncertain_kv_rows),
      cmocka_unit_test(test_rejects_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
