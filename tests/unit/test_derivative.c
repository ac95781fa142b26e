/*
 * tests/unit/test_derivative.c: gen/derivative.c against finite differences
 * of the graph evaluator, and the conventions where a derivative is not
 * defined (PyTorch's).
 *
 * The derivative nodes are evaluated by making each the score root in turn
 * (fjg_eval_score evaluates the score root); finite differences are central
 * differences of the original root at two step sizes. A point where the two
 * disagree sits near a kink or a jump (floor, where, min, abs) and is left
 * out; the test requires most points to be kept.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/derivative.h"
#include "gen/graph.h"

enum { BIAS_LEN = 16 };

typedef struct point {
  float score;
  int b, h, q, kv;
} point;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static float unit(void) { return (float)((rnd() >> 11) * 0x1.0p-53); }

/* The score root's value at p with the score root set to `node`. */
static double value_at(fjg_graph *g, int node, const fjg_env *env, const point *p) {
  const int saved = fjg_score_root(g);
  assert_int_equal(fjg_set_score_root(g, node), 0);
  double v = fjg_eval_score(g, env, p->score, p->b, p->h, p->q, p->kv);
  assert_int_equal(fjg_set_score_root(g, saved), 0);
  return v;
}

static double f_at(fjg_graph *g, const fjg_env *env, point p, float score) {
  p.score = score;
  return fjg_eval_score(g, env, score, p.b, p.h, p.q, p.kv);
}

/* Central difference of the score_mod in the score; NAN when two step
 * sizes disagree (a kink or a jump nearby). */
static double fd_score(fjg_graph *g, const fjg_env *env, const point *p) {
  double est[2];
  for (int k = 0; k < 2; k++) {
    float h = ldexpf(fmaxf(1.0f, fabsf(p->score)), k ? -8 : -7);
    est[k] = (f_at(g, env, *p, p->score + h) - f_at(g, env, *p, p->score - h)) /
             (double)((p->score + h) - (p->score - h));
  }
  if (!isfinite(est[0]) || !isfinite(est[1])) return NAN;
  if (fabs(est[0] - est[1]) > 2e-3 * (1 + fabs(est[1]))) return NAN;
  return est[1];
}

/* Central difference in bias[i]. */
static double fd_bias(fjg_graph *g, const fjg_env *env, float *bias, int i, const point *p) {
  double est[2];
  const float x = bias[i];
  for (int k = 0; k < 2; k++) {
    float h = ldexpf(fmaxf(1.0f, fabsf(x)), k ? -8 : -7);
    bias[i] = x + h;
    double hi = f_at(g, env, *p, p->score);
    bias[i] = x - h;
    double lo = f_at(g, env, *p, p->score);
    est[k] = (hi - lo) / (double)((x + h) - (x - h));
  }
  bias[i] = x;
  if (!isfinite(est[0]) || !isfinite(est[1])) return NAN;
  if (fabs(est[0] - est[1]) > 2e-3 * (1 + fabs(est[1]))) return NAN;
  return est[1];
}

/* d score_mod / d bias[i] from the derivative: the sum of the grads of the
 * reads whose index is i. */
static double bias_grad(fjg_graph *g, const fjg_derivative *d, const fjg_env *env,
                        int i, const point *p) {
  double sum = 0;
  for (int r = 0; r < d->num_buffer_grads; r++) {
    int index = (int)value_at(g, d->buffer_grads[r].index, env, p);
    if (index == i) sum += value_at(g, d->buffer_grads[r].grad, env, p);
  }
  return sum;
}

/* ---- random score_mods ---- */

typedef struct builder {
  fjg_graph *g;
  int bias;  /* argument index of the trainable buffer */
  int depth;
} builder;

static int leaf(builder *t) {
  fjg_graph *g = t->g;
  switch (rnd() % 6) {
  case 0:
  case 1: return fjg_input_node(g, FJG_IN_SCORE);
  case 2: return fjg_const_f32(g, (float)(unit() * 4 - 2));
  case 3: return fjg_unary(g, FJG_OP_TO_F32, fjg_binary(g, FJG_OP_SUB, fjg_input_node(g, FJG_IN_Q),
                                                         fjg_input_node(g, FJG_IN_KV)));
  default: { /* bias[(q - kv) % 16] or bias[h] */
    int idx = rnd() % 2 ? fjg_input_node(g, FJG_IN_H)
                        : fjg_binary(g, FJG_OP_MOD,
                                     fjg_binary(g, FJG_OP_SUB, fjg_input_node(g, FJG_IN_Q),
                                                fjg_input_node(g, FJG_IN_KV)),
                                     fjg_const_i32(g, BIAS_LEN));
    return fjg_load(g, t->bias, idx);
  }
  }
}

static int expr(builder *t, int depth) {
  fjg_graph *g = t->g;
  if (depth == 0 || rnd() % 4 == 0) return leaf(t);
  int a = expr(t, depth - 1);
  static const fjg_op binops[] = {FJG_OP_ADD, FJG_OP_SUB, FJG_OP_MUL, FJG_OP_DIV,
                                  FJG_OP_MIN, FJG_OP_MAX, FJG_OP_MOD};
  switch (rnd() % 9) {
  case 0: return fjg_unary(g, FJG_OP_TANH, a);
  case 1: /* exp of a bounded value */
    return fjg_unary(g, FJG_OP_EXP, fjg_unary(g, FJG_OP_TANH, a));
  case 2: /* log and sqrt of a positive value */
    return fjg_unary(g, rnd() % 2 ? FJG_OP_LOG : FJG_OP_SQRT,
                     fjg_binary(g, FJG_OP_ADD, fjg_unary(g, FJG_OP_ABS, a),
                                fjg_const_f32(g, 0.5f)));
  case 3: return fjg_unary(g, rnd() % 2 ? FJG_OP_ABS : FJG_OP_NEG, a);
  case 4: {
    int b = expr(t, depth - 1);
    int c = fjg_binary(g, FJG_OP_LT, a, fjg_const_f32(g, 0.25f));
    return fjg_where(g, c, a, b);
  }
  case 5: return fjg_unary(g, FJG_OP_FLOOR, a);
  default: {
    fjg_op op = binops[rnd() % 7];
    int b = expr(t, depth - 1);
    if (op == FJG_OP_DIV || op == FJG_OP_MOD) /* keep the divisor away from 0 */
      b = fjg_binary(g, FJG_OP_ADD, fjg_unary(g, FJG_OP_ABS, b), fjg_const_f32(g, 1.0f));
    return fjg_binary(g, op, a, b);
  }
  }
}

static void test_random_graphs_against_finite_differences(void **state) {
  (void)state;
  float bias[BIAS_LEN];
  const void *data[1] = {bias};
  const int64_t len[1] = {BIAS_LEN};
  fjg_env env = {.sizes = {2, 4, 4, 64, 64}, .buffer_data = data, .buffer_len = len};
  int checked = 0, skipped = 0;
  for (int graph = 0; graph < 300; graph++) {
    fjg_graph *g = fjg_graph_create();
    builder t = {g, fjg_buffer(g, "bias", FJG_F32), 0};
    assert_int_equal(t.bias, 0);
    int root = expr(&t, 1 + (int)(rnd() % 5));
    assert_true(root >= 0);
    if (fjg_node_at(g, root)->type != FJG_F32) root = fjg_unary(g, FJG_OP_TO_F32, root);
    assert_int_equal(fjg_set_score_root(g, root), 0);
    fjg_derivative d;
    char err[256];
    const int before = fjg_num_nodes(g);
    if (fjg_derive_score(g, 1, &d, err, sizeof err) != FJ_OK)
      fail_msg("graph %d: %s", graph, err);
    /* No product by 1 or -1 among the new nodes: it is the operand itself,
     * or its negation. */
    for (int id = before; id < fjg_num_nodes(g); id++) {
      const fjg_node *n = fjg_node_at(g, id);
      if (n->op != FJG_OP_MUL) continue;
      for (int k = 0; k < 2; k++) {
        const fjg_node *o = fjg_node_at(g, k ? n->b : n->a);
        if (o->op == FJG_OP_CONST && o->type == FJG_F32 && fabsf(o->imm.f) == 1.0f)
          fail_msg("graph %d: node %d multiplies by %g", graph, id, (double)o->imm.f);
      }
    }
    for (int i = 0; i < BIAS_LEN; i++) bias[i] = unit() * 2 - 1;
    for (int k = 0; k < 8; k++) {
      point p = {unit() * 6 - 3, 0, (int)(rnd() % 4), (int)(rnd() % 64), (int)(rnd() % 64)};
      double fd = fd_score(g, &env, &p);
      double an = value_at(g, d.dscore, &env, &p);
      if (isnan(fd)) {
        skipped++;
      } else {
        checked++;
        if (fabs(an - fd) > 1e-2 * (1 + fabs(fd)))
          fail_msg("graph %d point %d: d/dscore %.8g, finite difference %.8g", graph, k, an,
                   fd);
      }
      int i = (int)(rnd() % BIAS_LEN);
      fd = fd_bias(g, &env, bias, i, &p);
      an = bias_grad(g, &d, &env, i, &p);
      if (isnan(fd)) {
        skipped++;
      } else {
        checked++;
        if (fabs(an - fd) > 1e-2 * (1 + fabs(fd)))
          fail_msg("graph %d point %d: d/dbias[%d] %.8g, finite difference %.8g", graph, k, i,
                   an, fd);
      }
    }
    fjg_graph_destroy(g);
  }
  print_message("checked %d derivatives, %d points near a kink left out\n", checked, skipped);
  assert_true(checked > 4 * skipped);
}

/* One score_mod from a lambda of graph-building calls. */
static fjg_graph *one(int (*build)(fjg_graph *g)) {
  fjg_graph *g = fjg_graph_create();
  int root = build(g);
  assert_true(root >= 0);
  assert_int_equal(fjg_set_score_root(g, root), 0);
  return g;
}

static int s(fjg_graph *g) { return fjg_input_node(g, FJG_IN_SCORE); }
static int c(fjg_graph *g, float v) { return fjg_const_f32(g, v); }
static int build_abs(fjg_graph *g) { return fjg_unary(g, FJG_OP_ABS, s(g)); }
static int build_max(fjg_graph *g) { return fjg_binary(g, FJG_OP_MAX, s(g), c(g, 1.0f)); }
static int build_min(fjg_graph *g) { return fjg_binary(g, FJG_OP_MIN, s(g), c(g, 1.0f)); }
static int build_mod(fjg_graph *g) { return fjg_binary(g, FJG_OP_MOD, s(g), c(g, 3.0f)); }
static int build_floor(fjg_graph *g) {
  return fjg_binary(g, FJG_OP_ADD, fjg_unary(g, FJG_OP_FLOOR, s(g)),
                    fjg_binary(g, FJG_OP_IDIV, s(g), c(g, 2.0f)));
}
static int build_where(fjg_graph *g) {
  return fjg_where(g, fjg_binary(g, FJG_OP_GT, s(g), c(g, 0.0f)),
                   fjg_binary(g, FJG_OP_MUL, s(g), c(g, 3.0f)), c(g, 7.0f));
}
static int build_none(fjg_graph *g) { return c(g, 2.5f); }

static double dscore(int (*build)(fjg_graph *g), float at) {
  fjg_graph *g = one(build);
  fjg_derivative d;
  assert_int_equal(fjg_derive_score(g, 0, &d, NULL, 0), FJ_OK);
  fjg_env env = {.sizes = {1, 1, 1, 1, 1}};
  point p = {at, 0, 0, 0, 0};
  double v = value_at(g, d.dscore, &env, &p);
  fjg_graph_destroy(g);
  return v;
}

/* PyTorch's choices where the derivative is not defined. */
static void test_conventions(void **state) {
  (void)state;
  assert_true(dscore(build_abs, 0.0f) == 0.0);   /* sgn(0) = 0 */
  assert_true(dscore(build_abs, -2.0f) == -1.0);
  assert_true(dscore(build_max, 1.0f) == 0.5);   /* a tie splits evenly */
  assert_true(dscore(build_max, 2.0f) == 1.0);
  assert_true(dscore(build_max, 0.0f) == 0.0);
  assert_true(dscore(build_min, 1.0f) == 0.5);
  assert_true(dscore(build_min, 0.0f) == 1.0);
  assert_true(dscore(build_mod, 4.5f) == 1.0);   /* remainder: 1 for the dividend */
  assert_true(dscore(build_floor, 1.5f) == 0.0); /* floor, //: 0 */
  assert_true(dscore(build_where, 2.0f) == 3.0); /* the branch taken */
  assert_true(dscore(build_where, -2.0f) == 0.0);
  assert_true(dscore(build_none, 1.0f) == 0.0);  /* a score_mod ignoring score */
}

/* Without a score_mod the derivative is 1; a trainable argument must be an
 * f32 buffer; shared subexpressions are reused, not rebuilt. */
static void test_contract(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  fjg_derivative d;
  assert_int_equal(fjg_derive_score(g, 0, &d, NULL, 0), FJ_OK);
  const fjg_node *n = fjg_node_at(g, d.dscore);
  assert_int_equal(n->op, FJG_OP_CONST);
  assert_true(n->imm.f == 1.0f);
  int p = fjg_param(g, "w", FJG_F32);
  int ib = fjg_buffer(g, "ids", FJG_I32);
  assert_true(p >= 0 && ib >= 0);
  char err[256] = "";
  assert_int_equal(fjg_derive_score(g, 1u << 0, &d, err, sizeof err), FJ_EINVAL);
  assert_non_null(strstr(err, "'w'"));
  assert_int_equal(fjg_derive_score(g, 1u << 1, &d, err, sizeof err), FJ_EINVAL);
  assert_non_null(strstr(err, "'ids'"));
  fjg_graph_destroy(g);

  /* tanh(s) * tanh(s): the derivative reuses the tanh node. */
  g = fjg_graph_create();
  int t = fjg_unary(g, FJG_OP_TANH, fjg_input_node(g, FJG_IN_SCORE));
  assert_int_equal(fjg_set_score_root(g, fjg_binary(g, FJG_OP_MUL, t, t)), 0);
  int before = fjg_num_nodes(g);
  assert_int_equal(fjg_derive_score(g, 0, &d, NULL, 0), FJ_OK);
  int tanhs = 0;
  for (int i = 0; i < fjg_num_nodes(g); i++) tanhs += fjg_node_at(g, i)->op == FJG_OP_TANH;
  assert_int_equal(tanhs, 1);
  assert_true(fjg_num_nodes(g) - before < 10);
  fjg_graph_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_graphs_against_finite_differences),
      cmocka_unit_test(test_conventions),
      cmocka_unit_test(test_contract),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
