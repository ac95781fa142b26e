/*
 * tests/unit/test_reference.c: the CPU reference (gen/reference.c).
 *
 * The worked examples of the seed tutorial (scores [1, 2, 3] -> 25.7521 and
 * the cheat sheet's [2, 1, 3, 0] -> 24.71) with q and k chosen so the scores
 * come out exactly; dense vs streaming agreement on random problems (causal,
 * GQA, Lq != Lk, fully masked rows, score_mods, params and buffers); the
 * 16-bit rounding helpers; the comparison rule; masks evaluated in float32
 * as the kernel does, and the rows the CPU cannot decide the kernel's way
 * (uncertain) left out of the check instead of failing it.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gen/graph.h"
#include "gen/reference.h"

/* ---- helpers ---- */

typedef struct rng {
  uint64_t s;
} rng;

static double rng_uniform(rng *r) {
  r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
  return ((r->s >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double rng_normal(rng *r) {
  double u = rng_uniform(r), v = rng_uniform(r);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static double *random_array(rng *r, size_t n) {
  double *x = malloc(sizeof(double) * n);
  assert_non_null(x);
  for (size_t i = 0; i < n; i++) x[i] = rng_normal(r);
  return x;
}

static int in(fjg_graph *g, fjg_input w) {
  int n = fjg_input_node(g, w);
  assert_true(n >= 0);
  return n;
}

static int bin(fjg_graph *g, fjg_op op, int a, int b) {
  int n = fjg_binary(g, op, a, b);
  assert_true(n >= 0);
  return n;
}

static int ci(fjg_graph *g, int32_t v) {
  int n = fjg_const_i32(g, v);
  assert_true(n >= 0);
  return n;
}

/* mask_mod = q >= kv (top-left causal). */
static fjg_graph *causal_graph(void) {
  fjg_graph *g = fjg_graph_create();
  assert_non_null(g);
  assert_true(fjg_set_mask_root(g, bin(g, FJG_OP_GE, in(g, FJG_IN_Q),
                                       in(g, FJG_IN_KV))) >= 0);
  return g;
}

/* One query, keys whose scores are exactly `s` (scale 1, D = 4, q = e0) and
 * values whose first component is `val`. */
typedef struct row_problem {
  double q[4], k[8 * 4], v[8 * 4];
  fjg_ref_problem p;
} row_problem;

static void row_init(row_problem *r, const double *s, const double *val,
                     int n, const fjg_graph *g) {
  memset(r, 0, sizeof *r);
  r->q[0] = 1;
  for (int j = 0; j < n; j++) {
    r->k[j * 4] = s[j];
    r->k[j * 4 + 1] = 3.0 * j; /* ignored by q = e0 */
    r->v[j * 4] = val[j];
    r->v[j * 4 + 1] = j + 1;
    r->v[j * 4 + 2] = -val[j];
  }
  fjg_ref_problem p = {1, 1, 1, 1, n, 4, 1.0, g, NULL, 0, 0};
  r->p = p;
}

static double softmax_avg(const double *s, const double *val, int n,
                          double *lse) {
  double m = -INFINITY, l = 0, u = 0;
  for (int j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
  for (int j = 0; j < n; j++) l += exp(s[j] - m), u += exp(s[j] - m) * val[j];
  *lse = m + log(l);
  return u / l;
}

/* ---- worked examples ---- */

static void test_tutorial_row(void **state) {
  (void)state;
  const double s[3] = {1, 2, 3}, val[3] = {10, 20, 30};
  row_problem r;
  double o[4], lse, o2[4], lse2;
  row_init(&r, s, val, 3, NULL);
  assert_int_equal(fjg_reference_dense(&r.p, r.q, r.k, r.v, o, &lse), FJ_OK);
  assert_true(fabs(o[0] - 25.7521) < 5e-5);
  assert_true(fabs(o[2] + 25.7521) < 5e-5);
  assert_true(fabs(lse - (3 + log(1 + exp(-1) + exp(-2)))) < 1e-14);
  /* Section 4.2 streams [1, 2] and then [3]. */
  assert_int_equal(
      fjg_reference_streaming(&r.p, 1, 2, r.q, r.k, r.v, o2, &lse2), FJ_OK);
  for (int d = 0; d < 4; d++) assert_true(fabs(o2[d] - o[d]) < 1e-12);
  assert_true(fabs(lse2 - lse) < 1e-12);
}

static void test_cheat_sheet_row(void **state) {
  (void)state;
  const double s[4] = {2, 1, 3, 0}, val[4] = {10, 20, 30, 40};
  row_problem r;
  double o[4], lse, o2[4], lse2, want_lse;
  row_init(&r, s, val, 4, NULL);
  double want = softmax_avg(s, val, 4, &want_lse);
  assert_int_equal(fjg_reference_dense(&r.p, r.q, r.k, r.v, o, &lse), FJ_OK);
  assert_true(fabs(o[0] - 24.71) < 5e-3);
  assert_true(fabs(o[0] - want) < 1e-12);
  assert_true(fabs(lse - want_lse) < 1e-12);
  /* Two 2-token tiles, as in the cheat sheet. */
  assert_int_equal(
      fjg_reference_streaming(&r.p, 1, 2, r.q, r.k, r.v, o2, &lse2), FJ_OK);
  assert_true(fabs(o2[0] - 24.71) < 5e-3);
  assert_true(fabs(o2[0] - o[0]) < 1e-12 && fabs(lse2 - lse) < 1e-12);
}

/* Adding 1000 to every score changes nothing but the LSE. */
static void test_shift_invariance(void **state) {
  (void)state;
  const double s[3] = {1001, 1002, 1003}, val[3] = {10, 20, 30};
  row_problem r;
  double o[4], lse;
  row_init(&r, s, val, 3, NULL);
  assert_int_equal(fjg_reference_dense(&r.p, r.q, r.k, r.v, o, &lse), FJ_OK);
  assert_true(fabs(o[0] - 25.7521) < 5e-5);
  assert_true(fabs(lse - (1003 + log(1 + exp(-1) + exp(-2)))) < 1e-10);
}

/* Masking the third key renormalizes the remaining weights. */
static void test_masked_key_renormalizes(void **state) {
  (void)state;
  const double s[3] = {1, 2, 3}, val[3] = {10, 20, 30};
  fjg_graph *g = fjg_graph_create();
  assert_non_null(g);
  assert_true(fjg_set_mask_root(
                  g, bin(g, FJG_OP_NE, in(g, FJG_IN_KV), ci(g, 2))) >= 0);
  row_problem r;
  double o[4], lse, want_lse;
  row_init(&r, s, val, 3, g);
  double want = softmax_avg(s, val, 2, &want_lse);
  assert_int_equal(fjg_reference_dense(&r.p, r.q, r.k, r.v, o, &lse), FJ_OK);
  assert_true(fabs(o[0] - want) < 1e-12 && fabs(lse - want_lse) < 1e-12);
  assert_true(fabs(o[0] - (10 + 20 * exp(1)) / (1 + exp(1))) < 1e-12);
  fjg_graph_destroy(g);
}

/* ---- dense vs streaming on random problems ---- */

typedef struct rand_case {
  const char *what;
  int B, Hq, Hkv, Lq, Lk, D, bm, bn;
  fjg_graph *g;
  const fjg_env *env;
  int expect_masked_rows; /* some rows must come out fully masked */
} rand_case;

static void check_dense_vs_streaming(const rand_case *c, uint64_t seed) {
  rng r = {seed};
  size_t nq = (size_t)c->B * c->Hq * c->Lq * c->D;
  size_t nk = (size_t)c->B * c->Hkv * c->Lk * c->D;
  size_t nl = (size_t)c->B * c->Hq * c->Lq;
  double *q = random_array(&r, nq), *k = random_array(&r, nk);
  double *v = random_array(&r, nk);
  double *o1 = malloc(sizeof(double) * nq), *o2 = malloc(sizeof(double) * nq);
  double *l1 = malloc(sizeof(double) * nl), *l2 = malloc(sizeof(double) * nl);
  assert_true(o1 && o2 && l1 && l2);
  fjg_ref_problem p = {c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->D, 0,
                       c->g, c->env, 3, 0};
  assert_int_equal(fjg_reference_dense(&p, q, k, v, o1, l1), FJ_OK);
  assert_int_equal(fjg_reference_streaming(&p, c->bm, c->bn, q, k, v, o2, l2),
                   FJ_OK);
  double worst = 0;
  size_t masked = 0;
  for (size_t i = 0; i < nq; i++) {
    assert_true(isfinite(o1[i]) && isfinite(o2[i]));
    worst = fmax(worst, fabs(o1[i] - o2[i]));
  }
  for (size_t i = 0; i < nl; i++) {
    if (l1[i] == -INFINITY) {
      masked++;
      assert_true(l2[i] == -INFINITY);
      for (int d = 0; d < c->D; d++) {
        assert_true(o1[i * c->D + d] == 0.0);
        assert_true(o2[i * c->D + d] == 0.0);
      }
      continue;
    }
    worst = fmax(worst, fabs(l1[i] - l2[i]));
  }
  if (worst > 1e-12) fail_msg("%s: dense vs streaming %g", c->what, worst);
  if (c->expect_masked_rows && masked == 0)
    fail_msg("%s: expected fully masked rows", c->what);
  if (!c->expect_masked_rows && masked != 0)
    fail_msg("%s: %zu unexpected fully masked rows", c->what, masked);
  free(q), free(k), free(v), free(o1), free(o2), free(l1), free(l2);
}

/* causal bottom-right: q + (Lk - Lq) >= kv. */
static fjg_graph *causal_bottom_right_graph(void) {
  fjg_graph *g = fjg_graph_create();
  assert_non_null(g);
  int off = bin(g, FJG_OP_SUB, fjg_size_node(g, FJG_SZ_LK),
                fjg_size_node(g, FJG_SZ_LQ));
  int qq = bin(g, FJG_OP_ADD, in(g, FJG_IN_Q), off);
  assert_true(fjg_set_mask_root(g, bin(g, FJG_OP_GE, qq, in(g, FJG_IN_KV))) >=
              0);
  return g;
}

/* mask q >= 5 (rows 0..4 fully masked) and a softcap score_mod. */
static fjg_graph *late_rows_softcap_graph(void) {
  fjg_graph *g = fjg_graph_create();
  assert_non_null(g);
  assert_true(fjg_set_mask_root(
                  g, bin(g, FJG_OP_GE, in(g, FJG_IN_Q), ci(g, 5))) >= 0);
  int cap = fjg_const_f32(g, 2.0f);
  int t = fjg_unary(g, FJG_OP_TANH,
                    bin(g, FJG_OP_DIV, in(g, FJG_IN_SCORE), cap));
  assert_true(t >= 0);
  assert_true(fjg_set_score_root(g, bin(g, FJG_OP_MUL, t, cap)) >= 0);
  return g;
}

/* Document mask from a buffer (doc[q] == doc[kv], and causal) plus an
 * ALiBi-like bias scaled by an f32 param and the head index. */
static fjg_graph *document_alibi_graph(void) {
  fjg_graph *g = fjg_graph_create();
  assert_non_null(g);
  int doc = fjg_buffer(g, "doc", FJG_I32);
  assert_true(doc >= 0);
  int dq = fjg_load(g, doc, in(g, FJG_IN_Q));
  int dk = fjg_load(g, doc, in(g, FJG_IN_KV));
  int same = bin(g, FJG_OP_EQ, dq, dk);
  int caus = bin(g, FJG_OP_GE, in(g, FJG_IN_Q), in(g, FJG_IN_KV));
  assert_true(fjg_set_mask_root(g, bin(g, FJG_OP_AND, same, caus)) >= 0);
  int slope = fjg_param(g, "slope", FJG_F32);
  assert_true(slope >= 0);
  int hp1 = bin(g, FJG_OP_ADD, in(g, FJG_IN_H), ci(g, 1));
  int dist = bin(g, FJG_OP_SUB, in(g, FJG_IN_KV), in(g, FJG_IN_Q));
  int bias = bin(g, FJG_OP_MUL, bin(g, FJG_OP_MUL, slope, hp1), dist);
  assert_true(fjg_set_score_root(
                  g, bin(g, FJG_OP_ADD, in(g, FJG_IN_SCORE), bias)) >= 0);
  return g;
}

static void test_dense_vs_streaming(void **state) {
  (void)state;
  fjg_graph *causal = causal_graph();
  fjg_graph *br = causal_bottom_right_graph();
  fjg_graph *late = late_rows_softcap_graph();
  fjg_graph *docg = document_alibi_graph();
  int32_t doc[40];
  for (int i = 0; i < 40; i++) doc[i] = i < 7 ? 0 : i < 23 ? 1 : 2;
  const void *bufs[2] = {doc, NULL};
  int64_t lens[2] = {40, 0};
  float pf[2] = {0, 0.25f};
  int32_t pi[2] = {0, 0};
  fjg_env env;
  memset(&env, 0, sizeof env);
  env.buffer_data = bufs, env.buffer_len = lens;
  env.param_f32 = pf, env.param_i32 = pi;
  const rand_case cases[] = {
      {"full", 2, 3, 3, 19, 23, 8, 4, 5, NULL, NULL, 0},
      {"causal", 1, 2, 2, 37, 37, 16, 16, 8, causal, NULL, 0},
      {"causal gqa 4", 2, 8, 2, 33, 33, 8, 5, 7, causal, NULL, 0},
      {"causal mqa", 1, 4, 1, 20, 20, 4, 3, 3, causal, NULL, 0},
      {"causal Lq<Lk", 1, 2, 1, 9, 31, 8, 4, 6, causal, NULL, 0},
      {"bottom-right Lq>Lk", 1, 2, 2, 31, 9, 8, 4, 4, br, NULL, 1},
      {"bottom-right Lq<Lk", 2, 2, 1, 9, 31, 8, 3, 16, br, NULL, 0},
      {"q>=5 + softcap", 1, 2, 2, 17, 29, 8, 4, 8, late, NULL, 1},
      {"document + alibi", 2, 4, 2, 40, 40, 8, 8, 6, docg, &env, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    check_dense_vs_streaming(&cases[i], 0x9e3779b97f4a7c15ull + i);
  fjg_graph_destroy(causal);
  fjg_graph_destroy(br);
  fjg_graph_destroy(late);
  fjg_graph_destroy(docg);
}

/* A causal problem against a direct, single-threaded evaluation. */
static void test_dense_matches_direct(void **state) {
  (void)state;
  enum { L = 11, D = 4 };
  rng r = {77};
  fjg_graph *g = causal_graph();
  double *q = random_array(&r, L * D), *k = random_array(&r, L * D);
  double *v = random_array(&r, L * D), o[L * D], lse[L];
  fjg_ref_problem p = {1, 1, 1, L, L, D, 0.5, g, NULL, 0, 0};
  assert_int_equal(fjg_reference_dense(&p, q, k, v, o, lse), FJ_OK);
  for (int i = 0; i < L; i++) {
    double s[L], m = -INFINITY, l = 0;
    for (int j = 0; j <= i; j++) {
      s[j] = 0;
      for (int d = 0; d < D; d++) s[j] += q[i * D + d] * k[j * D + d];
      s[j] *= 0.5;
      m = fmax(m, s[j]);
    }
    for (int j = 0; j <= i; j++) l += exp(s[j] - m);
    assert_true(fabs(lse[i] - (m + log(l))) < 1e-12);
    for (int d = 0; d < D; d++) {
      double u = 0;
      for (int j = 0; j <= i; j++) u += exp(s[j] - m) * v[j * D + d];
      assert_true(fabs(o[i * D + d] - u / l) < 1e-12);
    }
  }
  free(q), free(k), free(v);
  fjg_graph_destroy(g);
}

static void test_count_allowed(void **state) {
  (void)state;
  fjg_graph *g = causal_graph();
  fjg_ref_problem p = {2, 3, 1, 200, 200, 8, 0, g, NULL, 0, 0};
  assert_int_equal(fjg_reference_count_allowed(&p), 2 * 3 * 200 * 201 / 2);
  p.g = NULL;
  assert_int_equal(fjg_reference_count_allowed(&p), 2 * 3 * 200 * 200);
  fjg_graph_destroy(g);
  g = causal_bottom_right_graph();
  fjg_ref_problem p2 = {1, 1, 1, 100, 30, 8, 0, g, NULL, 0, 0};
  /* rows q >= 70 see kv <= q - 70: sum over q of (q - 69) for q in 70..99. */
  assert_int_equal(fjg_reference_count_allowed(&p2), 30 * 31 / 2);
  fjg_graph_destroy(g);
}

static int cf(fjg_graph *g, float v) {
  int n = fjg_const_f32(g, v);
  assert_true(n >= 0);
  return n;
}

/* lt(q / 49.0 * 49.0, q) holds for q = 27, 54, 55 below 64 in float32 (the
 * kernel); in double also at q = 1, 2, 4, 8, 16, 32. */
static void test_mask_in_float(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int qf = fjg_unary(g, FJG_OP_TO_F32, in(g, FJG_IN_Q));
  int c = cf(g, 49.0f);
  assert_true(fjg_set_mask_root(g, bin(g, FJG_OP_LT, bin(g, FJG_OP_MUL,
                                       bin(g, FJG_OP_DIV, qf, c), c), qf)) >= 0);
  fjg_ref_problem p = {1, 1, 1, 64, 8, 8, 0, g, NULL, 0, 0};
  assert_int_equal(fjg_reference_count_allowed(&p), 3 * 8);
  fjg_graph_destroy(g);
}

/* le(tanh((q - kv) * 0.5), 0): allowed where kv > q, masked where kv < q;
 * on the diagonal the kernel's tanh.approx(0) may be either sign. */
static fjg_graph *tanh_mask(int kernel_masks_diagonal) {
  fjg_graph *g = fjg_graph_create();
  int d = bin(g, FJG_OP_SUB, in(g, FJG_IN_Q), in(g, FJG_IN_KV));
  int m = kernel_masks_diagonal
              ? bin(g, FJG_OP_LT, d, ci(g, 0))
              : bin(g, FJG_OP_LE, fjg_unary(g, FJG_OP_TANH, bin(g, FJG_OP_MUL, d, cf(g, 0.5f))),
                    cf(g, 0.0f));
  assert_true(fjg_set_mask_root(g, m) >= 0);
  return g;
}

static void test_uncertain_rows(void **state) {
  (void)state;
  enum { B = 1, H = 2, LQ = 40, LK = 30, D = 16 };
  fjg_graph *g = tanh_mask(0);
  uint8_t rows[B * H * LQ];
  fjg_ref_problem p = {B, H, 1, LQ, LK, D, 0, g, NULL, 2, 0};
  /* Rows q < 30 meet the diagonal; rows past Lk do not. */
  assert_int_equal(fjg_reference_uncertain_rows(&p, rows), 2 * 30);
  for (int h = 0; h < H; h++)
    for (int q = 0; q < LQ; q++) assert_int_equal(rows[h * LQ + q], q < LK);
  /* Integer masks are exact: no rows, at no cost. */
  fjg_graph *c = causal_graph();
  p.g = c;
  assert_int_equal(fjg_reference_uncertain_rows(&p, rows), 0);
  /* A score_mod that decides on the kernel's exp marks its rows too. */
  int s = in(c, FJG_IN_SCORE);
  int e = fjg_unary(c, FJG_OP_EXP, bin(c, FJG_OP_MUL, fjg_unary(c, FJG_OP_TO_F32,
                                                                 in(c, FJG_IN_KV)),
                                       cf(c, 0.0f)));
  assert_true(fjg_set_score_root(c, fjg_where(c, bin(c, FJG_OP_LE, e, cf(c, 1.0f)), s,
                                              cf(c, -3.0f))) >= 0);
  assert_int_equal(fjg_reference_uncertain_rows(&p, rows), B * H * LQ);
  fjg_graph_destroy(c);

  /* A kernel that masks the diagonal (where the CPU's tanhf(0) = 0 allows
   * it) is right; the check must not fail it, and does fail it once the
   * uncertain rows are compared. */
  p.g = g;
  fjg_reference_uncertain_rows(&p, rows);
  rng r = {0x5eed};
  size_t nq = (size_t)B * H * LQ * D, nk = (size_t)B * LK * D, nl = (size_t)B * H * LQ;
  double *q = random_array(&r, nq), *k = random_array(&r, nk), *v = random_array(&r, nk);
  double *ro = malloc(sizeof(double) * nq), *rl = malloc(sizeof(double) * nl);
  double *ko = malloc(sizeof(double) * nq), *kl = malloc(sizeof(double) * nl);
  float *lo = malloc(sizeof(float) * nq), *ll = malloc(sizeof(float) * nl);
  float *out = malloc(sizeof(float) * nq), *outl = malloc(sizeof(float) * nl);
  assert_int_equal(fjg_reference_dense(&p, q, k, v, ro, rl), FJ_OK);
  assert_int_equal(fjg_reference_lowp(&p, FJ_DTYPE_BF16, q, k, v, lo, ll), FJ_OK);
  fjg_graph *kernel = tanh_mask(1);
  fjg_ref_problem pk = p;
  pk.g = kernel;
  assert_int_equal(fjg_reference_dense(&pk, q, k, v, ko, kl), FJ_OK);
  for (size_t i = 0; i < nq; i++) out[i] = (float)ko[i];
  for (size_t i = 0; i < nl; i++) outl[i] = (float)kl[i];
  fjg_check_report rep;
  assert_true(fjg_ref_check_rows(ro, lo, out, nq, D, rows, 1e-3, &rep));
  assert_int_equal(rep.skipped, 2 * 30 * D);
  assert_true(fjg_ref_check_rows(rl, ll, outl, nl, 1, rows, 1e-3, &rep));
  assert_int_equal(rep.skipped, 2 * 30);
  assert_false(fjg_ref_check(ro, lo, out, nq, 1e-3, &rep));
  assert_false(fjg_ref_check_rows(rl, ll, outl, nl, 1, NULL, 1e-3, &rep));
  free(q), free(k), free(v), free(ro), free(rl), free(ko), free(kl);
  free(lo), free(ll), free(out), free(outl);
  fjg_graph_destroy(kernel);
  fjg_graph_destroy(g);
}

/* ---- low precision ---- */

static void lowp_error(fj_dtype dt, int rounded_rowsum, double *err_o,
                       double *err_lse) {
  enum { B = 1, H = 2, L = 64, D = 32 };
  rng r = {5};
  size_t n = (size_t)B * H * L * D;
  double *q = random_array(&r, n), *k = random_array(&r, n);
  double *v = random_array(&r, n);
  for (size_t i = 0; i < n; i++) { /* the kernel sees rounded inputs */
    q[i] = fjg_round_to_dtype((float)q[i], dt);
    k[i] = fjg_round_to_dtype((float)k[i], dt);
    v[i] = fjg_round_to_dtype((float)v[i], dt);
  }
  double *o = malloc(sizeof(double) * n), lse[B * H * L];
  float *of = malloc(sizeof(float) * n), lsef[B * H * L];
  fjg_graph *g = causal_graph();
  fjg_ref_problem p = {B, H, H, L, L, D, 0, g, NULL, 0, rounded_rowsum};
  assert_int_equal(fjg_reference_dense(&p, q, k, v, o, lse), FJ_OK);
  assert_int_equal(fjg_reference_lowp(&p, dt, q, k, v, of, lsef), FJ_OK);
  for (size_t i = 0; i < n; i++) /* O comes out in the input dtype */
    assert_true(of[i] == fjg_round_to_dtype(of[i], dt));
  *err_o = *err_lse = 0;
  for (size_t i = 0; i < n; i++) *err_o = fmax(*err_o, fabs(of[i] - o[i]));
  for (size_t i = 0; i < B * H * L; i++)
    *err_lse = fmax(*err_lse, fabs(lsef[i] - lse[i]));
  fjg_check_report rep;
  assert_true(fjg_ref_check(o, of, of, n, 0, &rep)); /* lowp vs itself */
  free(q), free(k), free(v), free(o), free(of);
  fjg_graph_destroy(g);
}

static void test_lowp_error_sizes(void **state) {
  (void)state;
  double eo, el;
  /* bf16 keeps 8 bits: rounding P and O costs a few 1e-3 on O; a row sum
   * of rounded P moves the LSE by up to ~2^-9 in rows of few keys. */
  lowp_error(FJ_DTYPE_BF16, 1, &eo, &el); /* row sum of rounded P */
  assert_true(eo > 1e-4 && eo < 3e-2);
  assert_true(el > 1e-5 && el < 4e-3);
  lowp_error(FJ_DTYPE_BF16, 0, &eo, &el); /* float32 row sum (kernels) */
  assert_true(eo > 1e-4 && eo < 3e-2);
  assert_true(el < 1e-5);
  lowp_error(FJ_DTYPE_F16, 0, &eo, &el); /* 11 bits: 8x smaller */
  assert_true(eo > 1e-5 && eo < 4e-3);
  assert_true(el < 5e-4);
}

/* ---- 16-bit rounding ---- */

static float fbits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static void test_bf16_rounding(void **state) {
  (void)state;
  assert_int_equal(fjg_f32_to_bf16(1.0f), 0x3f80);
  assert_int_equal(fjg_f32_to_bf16(-2.0f), 0xc000);
  /* ties to even: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6 */
  assert_int_equal(fjg_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  assert_int_equal(fjg_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  assert_int_equal(fjg_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  assert_int_equal(fjg_f32_to_bf16(fbits(0x7f7fffffu)), 0x7f80); /* -> inf */
  assert_true(isnan(fjg_bf16_to_f32(fjg_f32_to_bf16(NAN))));
  for (uint32_t h = 0; h < 65536; h++) {
    float x = fjg_bf16_to_f32((uint16_t)h);
    if (!isnan(x)) assert_int_equal(fjg_f32_to_bf16(x), h);
  }
}

static void test_f16_rounding(void **state) {
  (void)state;
  assert_int_equal(fjg_f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(fjg_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(fjg_f32_to_f16(65519.0f), 0x7bff);
  assert_int_equal(fjg_f32_to_f16(65520.0f), 0x7c00);
  assert_int_equal(fjg_f32_to_f16(0x1p-24f), 0x0001);
  assert_int_equal(fjg_f32_to_f16(0x1p-25f), 0x0000);     /* tie to even */
  assert_int_equal(fjg_f32_to_f16(3 * 0x1p-25f), 0x0002); /* tie to even */
  assert_int_equal(fjg_f32_to_f16(-0.0f), 0x8000);
  assert_true(isnan(fjg_f16_to_f32(fjg_f32_to_f16(NAN))));
  for (uint32_t h = 0; h < 65536; h++) {
    float x = fjg_f16_to_f32((uint16_t)h);
    if (!isnan(x)) assert_int_equal(fjg_f32_to_f16(x), h);
  }
#ifdef __FLT16_MAX__
  /* Against the compiler's own conversion on many random floats. */
  rng r = {123};
  for (int i = 0; i < 2000000; i++) {
    r.s = r.s * 6364136223846793005ull + 1;
    uint32_t u = (uint32_t)r.s ^ (uint32_t)(r.s >> 32);
    /* Mostly values in the fp16 range, some anywhere. */
    if (i % 4) u = (u & 0x83ffffffu) | ((0x67u + (u >> 26) % 0x18u) << 23);
    float x = fbits(u);
    if (isnan(x)) continue;
    _Float16 h = (_Float16)x;
    uint16_t want;
    memcpy(&want, &h, 2);
    if (fjg_f32_to_f16(x) != want)
      fail_msg("f16(%a): got %04x want %04x", x, fjg_f32_to_f16(x), want);
  }
#endif
}

/* ---- the comparison rule ---- */

static void test_check_rule(void **state) {
  (void)state;
  double ref[4] = {1.0, 2.0, 0.0, -INFINITY};
  float lowp[4] = {1.01f, 2.0f, 0.0f, -INFINITY};
  float out[4] = {1.015f, 1.99f, 0.0f, -INFINITY};
  fjg_check_report rep;
  assert_true(fjg_ref_check(ref, lowp, out, 4, 0, &rep));
  assert_true(fabs(rep.max_err_lowp - 0.01) < 1e-6);
  assert_true(fabs(rep.tolerance - 0.02) < 1e-6);
  assert_true(rep.rel_l2 > 0 && rep.rel_l2_lowp > 0);
  out[0] = 1.025f; /* 2.5x the lowp error */
  assert_false(fjg_ref_check(ref, lowp, out, 4, 0, &rep));
  assert_int_equal(rep.worst, 0);
  assert_true(fjg_ref_check(ref, lowp, out, 4, 0.01, &rep)); /* the floor */
  out[0] = 1.0f;
  out[1] = NAN;
  assert_false(fjg_ref_check(ref, lowp, out, 4, 1e9, &rep));
  assert_int_equal(rep.nonfinite, 1);
  out[1] = INFINITY;
  assert_false(fjg_ref_check(ref, lowp, out, 4, 1e9, &rep));
  out[1] = 2.0f;
  out[3] = -1e30f; /* LSE of a fully masked row must be exactly -inf */
  assert_false(fjg_ref_check(ref, lowp, out, 4, 1e9, &rep));
  assert_int_equal(rep.inf_mismatch, 1);
  out[3] = -INFINITY;
  out[2] = 1e-7f; /* output of a fully masked row must be exactly 0 */
  assert_false(fjg_ref_check(ref, lowp, out, 4, 1e9, &rep));
  assert_int_equal(rep.zero_mismatch, 1);
  out[2] = 0.0f;
  assert_true(fjg_ref_check(ref, lowp, out, 4, 0, NULL));
}

static void test_rejects_bad_problems(void **state) {
  (void)state;
  double x[16] = {0}, o[16], l[4];
  fjg_ref_problem p = {1, 3, 2, 1, 1, 4, 0, NULL, NULL, 0, 0}; /* 3 % 2 != 0 */
  assert_int_equal(fjg_reference_dense(&p, x, x, x, o, l), FJ_EINVAL);
  p.Hq = 2;
  assert_int_equal(fjg_reference_streaming(&p, 0, 4, x, x, x, o, l),
                   FJ_EINVAL);
  assert_int_equal(fjg_reference_dense(&p, x, x, x, NULL, l), FJ_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tutorial_row),
      cmocka_unit_test(test_cheat_sheet_row),
      cmocka_unit_test(test_shift_invariance),
      cmocka_unit_test(test_masked_key_renormalizes),
      cmocka_unit_test(test_dense_vs_streaming),
      cmocka_unit_test(test_dense_matches_direct),
      cmocka_unit_test(test_count_allowed),
      cmocka_unit_test(test_mask_in_float),
      cmocka_unit_test(test_uncertain_rows),
      cmocka_unit_test(test_lowp_error_sizes),
      cmocka_unit_test(test_bf16_rounding),
      cmocka_unit_test(test_f16_rounding),
      cmocka_unit_test(test_check_rule),
      cmocka_unit_test(test_rejects_bad_problems),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
