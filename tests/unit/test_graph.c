/* tests/unit/test_graph.c: hash-consing, promotion, folding, declarations,
 * roots and every builder error of gen/graph.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gen/derivative.h"
#include "gen/graph.h"
#include "gen/interval.h"

static int in(fjg_graph *g, fjg_input which) {
  int id = fjg_input_node(g, which);
  assert_true(id >= 0);
  return id;
}

static const fjg_node *node(fjg_graph *g, int id) {
  const fjg_node *n = fjg_node_at(g, id);
  assert_non_null(n);
  return n;
}

static void assert_error(fjg_graph *g, int result, const char *needle) {
  assert_int_equal(result, -1);
  if (!strstr(fjg_graph_error(g), needle))
    fail_msg("error '%s' does not mention '%s'", fjg_graph_error(g), needle);
}

static void test_hash_consing(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int q = in(g, FJG_IN_Q), kv = in(g, FJG_IN_KV);
  assert_int_equal(in(g, FJG_IN_Q), q);
  int ge = fjg_binary(g, FJG_OP_GE, q, kv);
  assert_int_equal(fjg_binary(g, FJG_OP_GE, q, kv), ge);
  assert_int_not_equal(fjg_binary(g, FJG_OP_GE, kv, q), ge);
  assert_int_not_equal(fjg_binary(g, FJG_OP_GT, q, kv), ge);
  assert_int_equal(fjg_const_i32(g, 7), fjg_const_i32(g, 7));
  assert_int_not_equal(fjg_const_i32(g, 7), fjg_const_i32(g, 8));
  /* 1 (i32), 1.0 (f32) and true are three different constants. */
  assert_int_not_equal(fjg_const_i32(g, 1), fjg_const_f32(g, 1.0f));
  assert_int_not_equal(fjg_const_i32(g, 1), fjg_const_bool(g, 1));
  /* -0.0 and 0.0 differ bitwise and must stay apart. */
  assert_int_not_equal(fjg_const_f32(g, 0.0f), fjg_const_f32(g, -0.0f));
  assert_int_equal(fjg_size_node(g, FJG_SZ_LQ), fjg_size_node(g, FJG_SZ_LQ));
  /* Many nodes: the table grows and still finds every one. */
  int ids[3000];
  for (int i = 0; i < 3000; i++)
    ids[i] = fjg_binary(g, FJG_OP_ADD, q, fjg_const_i32(g, i + 1));
  for (int i = 0; i < 3000; i++)
    assert_int_equal(fjg_binary(g, FJG_OP_ADD, q, fjg_const_i32(g, i + 1)),
                     ids[i]);
  /* Operands precede users. */
  for (int id = 0; id < fjg_num_nodes(g); id++) {
    const fjg_node *n = node(g, id);
    int arity = fjg_op_arity((fjg_op)n->op);
    if (arity >= 1) assert_true(n->a < id);
    if (arity >= 2) assert_true(n->b < id);
    if (arity >= 3) assert_true(n->c < id);
  }
  fjg_graph_destroy(g);
}

static void test_promotion(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int q = in(g, FJG_IN_Q), kv = in(g, FJG_IN_KV), s = in(g, FJG_IN_SCORE);
  int half = fjg_const_f32(g, 0.5f);

  int x = fjg_binary(g, FJG_OP_ADD, q, half);
  assert_int_equal(node(g, x)->type, FJG_F32);
  assert_int_equal(node(g, node(g, x)->a)->op, FJG_OP_TO_F32);
  assert_int_equal(node(g, node(g, x)->a)->a, q);
  assert_int_equal(node(g, x)->b, half);

  int d = fjg_binary(g, FJG_OP_DIV, q, kv);
  assert_int_equal(node(g, d)->type, FJG_F32);
  assert_int_equal(node(g, node(g, d)->b)->op, FJG_OP_TO_F32);

  assert_int_equal(node(g, fjg_binary(g, FJG_OP_IDIV, q, kv))->type, FJG_I32);
  assert_int_equal(node(g, fjg_binary(g, FJG_OP_IDIV, s, kv))->type, FJG_F32);
  assert_int_equal(node(g, fjg_binary(g, FJG_OP_MOD, q, kv))->type, FJG_I32);
  assert_int_equal(node(g, fjg_binary(g, FJG_OP_MIN, q, s))->type, FJG_F32);
  assert_int_equal(node(g, fjg_unary(g, FJG_OP_EXP, q))->type, FJG_F32);
  assert_int_equal(node(g, fjg_unary(g, FJG_OP_ABS, q))->type, FJG_I32);
  assert_int_equal(node(g, fjg_unary(g, FJG_OP_NEG, s))->type, FJG_F32);
  /* Comparisons of mixed operands compare as f32. */
  int lt = fjg_binary(g, FJG_OP_LT, q, s);
  assert_int_equal(node(g, lt)->type, FJG_BOOL);
  assert_int_equal(node(g, node(g, lt)->a)->type, FJG_F32);
  int w = fjg_where(g, lt, q, s);
  assert_int_equal(node(g, w)->type, FJG_F32);
  /* floor/ceil of an integer is the integer; to_f32 of a float is itself. */
  assert_int_equal(fjg_unary(g, FJG_OP_FLOOR, q), q);
  assert_int_equal(fjg_unary(g, FJG_OP_CEIL, q), q);
  assert_int_equal(fjg_unary(g, FJG_OP_TO_F32, s), s);
  fjg_graph_destroy(g);
}

static int32_t const_i(fjg_graph *g, int id) {
  assert_int_equal(node(g, id)->op, FJG_OP_CONST);
  return node(g, id)->imm.i;
}

static void test_folding(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int c7 = fjg_const_i32(g, 7), cm7 = fjg_const_i32(g, -7);
  int c2 = fjg_const_i32(g, 2), cm2 = fjg_const_i32(g, -2);
  int c0 = fjg_const_i32(g, 0);
  assert_int_equal(const_i(g, fjg_binary(g, FJG_OP_ADD, c7, c2)), 9);
  assert_int_equal(const_i(g, fjg_binary(g, FJG_OP_IDIV, cm7, c2)), -4);
  assert_int_equal(const_i(g, fjg_binary(g, FJG_OP_MOD, cm7, c2)), 1);
  assert_int_equal(const_i(g, fjg_binary(g, FJG_OP_MOD, c7, cm2)), -1);
  assert_int_equal(const_i(g, fjg_binary(g, FJG_OP_IDIV, c7, c0)), 0);
  assert_int_equal(const_i(g, fjg_binary(g, FJG_OP_MOD, c7, c0)), 0);
  int big = fjg_const_i32(g, INT32_MAX);
  assert_int_equal(const_i(g, fjg_binary(g, FJG_OP_ADD, big, c2)),
                   INT32_MIN + 1);
  assert_int_equal(const_i(g, fjg_binary(g, FJG_OP_LT, c2, c7)), 1);
  assert_int_equal(node(g, fjg_binary(g, FJG_OP_LT, c2, c7))->type, FJG_BOOL);
  /* f32 folding. */
  int e = fjg_unary(g, FJG_OP_EXP, fjg_const_f32(g, 0.0f));
  assert_int_equal(node(g, e)->op, FJG_OP_CONST);
  assert_true(node(g, e)->imm.f == 1.0f);
  int h = fjg_binary(g, FJG_OP_DIV, c7, c2);
  assert_true(node(g, h)->imm.f == 3.5f);
  int m = fjg_binary(g, FJG_OP_MOD, fjg_const_f32(g, -7.5f), c2);
  assert_true(node(g, m)->imm.f == 0.5f);

  /* Identities. */
  int q = in(g, FJG_IN_Q), kv = in(g, FJG_IN_KV);
  int ge = fjg_binary(g, FJG_OP_GE, q, kv);
  int t = fjg_const_bool(g, 1), f = fjg_const_bool(g, 0);
  assert_int_equal(fjg_binary(g, FJG_OP_AND, ge, t), ge);
  assert_int_equal(fjg_binary(g, FJG_OP_AND, t, ge), ge);
  assert_int_equal(fjg_binary(g, FJG_OP_AND, ge, f), f);
  assert_int_equal(fjg_binary(g, FJG_OP_OR, ge, f), ge);
  assert_int_equal(fjg_binary(g, FJG_OP_OR, ge, t), t);
  assert_int_equal(fjg_binary(g, FJG_OP_XOR, ge, f), ge);
  assert_int_equal(fjg_where(g, t, q, kv), q);
  assert_int_equal(fjg_where(g, f, q, kv), kv);
  assert_int_equal(fjg_where(g, ge, q, q), q);
  assert_int_equal(fjg_unary(g, FJG_OP_NOT, fjg_unary(g, FJG_OP_NOT, ge)), ge);
  assert_int_equal(fjg_binary(g, FJG_OP_ADD, q, c0), q);
  assert_int_equal(fjg_binary(g, FJG_OP_MUL, fjg_const_i32(g, 1), q), q);
  /* Not for floats: -0 + 0 is +0. */
  int s = in(g, FJG_IN_SCORE);
  assert_int_not_equal(fjg_binary(g, FJG_OP_ADD, s, fjg_const_f32(g, 0)), s);
  fjg_graph_destroy(g);
}

/* The value of i32 node `expr` at q, read through the evaluator: the mask
 * eq(expr, p) with p a param set to the candidate value. */
static int32_t eval_i32(fjg_graph *g, int expr, int p, int32_t q,
                        int32_t expect) {
  int root = fjg_binary(g, FJG_OP_EQ, expr, p);
  assert_true(root >= 0);
  assert_int_equal(fjg_set_mask_root(g, root), 0);
  int32_t params[1] = {expect};
  fjg_env env;
  memset(&env, 0, sizeof env);
  env.param_i32 = params;
  return fjg_eval_mask(g, &env, 0, 0, q, 0);
}

static int chain_depth(fjg_graph *g, int id) {
  const fjg_node *n = node(g, id);
  int arity = fjg_op_arity((fjg_op)n->op), d = 0;
  if (arity >= 1 && chain_depth(g, n->a) > d) d = chain_depth(g, n->a);
  if (arity >= 2 && chain_depth(g, n->b) > d) d = chain_depth(g, n->b);
  return d + (arity > 0);
}

static void test_i32_chains_fold(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int q = in(g, FJG_IN_Q), one = fjg_const_i32(g, 1);
  /* The hostile loop: x = x + 1, a hundred thousand times. */
  int x = q;
  for (int i = 0; i < 100000; i++) x = fjg_binary(g, FJG_OP_ADD, x, one);
  assert_int_equal(node(g, x)->op, FJG_OP_ADD);
  assert_int_equal(node(g, x)->a, q);
  assert_int_equal(const_i(g, node(g, x)->b), 100000);
  /* ... and back down, with sub and with constants on the left. */
  for (int i = 0; i < 50000; i++) x = fjg_binary(g, FJG_OP_SUB, x, one);
  for (int i = 0; i < 50000; i++) x = fjg_binary(g, FJG_OP_ADD, one, x);
  assert_int_equal(const_i(g, node(g, x)->b), 100000);
  for (int i = 0; i < 100000; i++) x = fjg_binary(g, FJG_OP_SUB, x, one);
  assert_int_equal(x, q);
  /* Negative sums read as a sub; c - x folds into one sub. */
  int c5 = fjg_const_i32(g, 5), c3 = fjg_const_i32(g, 3);
  int y = fjg_binary(g, FJG_OP_SUB, fjg_binary(g, FJG_OP_ADD, q, c3), c5);
  assert_int_equal(node(g, y)->op, FJG_OP_SUB);
  assert_int_equal(node(g, y)->a, q);
  assert_int_equal(const_i(g, node(g, y)->b), 2);
  int z = fjg_binary(g, FJG_OP_SUB, c5, y); /* 5 - (q - 2) = 7 - q */
  assert_int_equal(node(g, z)->op, FJG_OP_SUB);
  assert_int_equal(const_i(g, node(g, z)->a), 7);
  assert_int_equal(node(g, z)->b, q);
  assert_int_equal(fjg_unary(g, FJG_OP_NEG, fjg_unary(g, FJG_OP_NEG, q)), q);
  /* Products of products; 2^32 wraps to 0. */
  int two = fjg_const_i32(g, 2);
  int p = q;
  for (int i = 0; i < 10; i++) p = fjg_binary(g, FJG_OP_MUL, p, two);
  assert_int_equal(node(g, p)->op, FJG_OP_MUL);
  assert_int_equal(const_i(g, node(g, p)->b), 1024);
  for (int i = 0; i < 22; i++) p = fjg_binary(g, FJG_OP_MUL, two, p);
  assert_int_equal(const_i(g, p), 0);
  /* 2 * q + 1 keeps the user's product node. */
  int tq = fjg_binary(g, FJG_OP_MUL, two, q);
  int tq1 = fjg_binary(g, FJG_OP_ADD, tq, one);
  assert_int_equal(fjg_binary(g, FJG_OP_ADD, fjg_binary(g, FJG_OP_SUB, tq1,
                                                        c5), c5), tq1);
  assert_int_equal(node(g, tq1)->a, tq);
  /* (q + 1) * 2 distributes to q * 2 + 2, so x = (x + 1) * 3 in a loop
   * stays small too. */
  int m = fjg_binary(g, FJG_OP_MUL, fjg_binary(g, FJG_OP_ADD, q, one), two);
  assert_int_equal(node(g, m)->op, FJG_OP_ADD);
  assert_int_equal(node(g, node(g, m)->a)->op, FJG_OP_MUL);
  assert_int_equal(const_i(g, node(g, m)->b), 2);
  int three = fjg_const_i32(g, 3);
  for (int i = 0; i < 1000; i++)
    m = fjg_binary(g, FJG_OP_MUL, fjg_binary(g, FJG_OP_ADD, m, one), three);
  assert_true(chain_depth(g, m) <= 3);
  /* Wrapping: (q + INT32_MAX) + 1 is q + INT32_MIN. */
  int w = fjg_binary(g, FJG_OP_ADD,
                     fjg_binary(g, FJG_OP_ADD, q, fjg_const_i32(g, INT32_MAX)),
                     one);
  assert_int_equal(node(g, w)->op, FJG_OP_ADD);
  assert_int_equal(const_i(g, node(g, w)->b), INT32_MIN);
  /* Floats are not reassociated. */
  int s = in(g, FJG_IN_SCORE), f1 = fjg_const_f32(g, 1.0f);
  int sf = fjg_binary(g, FJG_OP_ADD, fjg_binary(g, FJG_OP_ADD, s, f1), f1);
  assert_int_equal(chain_depth(g, sf), 2);
  fjg_graph_destroy(g);
}

/* Random chains of i32 + - * neg with constants (extremes included) agree
 * with the same arithmetic done modulo 2^32, at extreme inputs too, and stay
 * at most three levels deep. */
static void test_i32_chains_match_wrapping(void **state) {
  (void)state;
  static const int32_t consts[] = {0, 1, -1, 2, -3, 7, 1000, 65536,
                                   INT32_MAX, INT32_MIN, INT32_MIN + 1,
                                   123456789};
  static const int32_t inputs[] = {0, 1, -1, 5, -77, INT32_MAX, INT32_MIN,
                                   99999};
  const int nc = sizeof consts / sizeof consts[0];
  uint32_t seed = 12345;
  for (int trial = 0; trial < 300; trial++) {
    fjg_graph *g = fjg_graph_create();
    int q = in(g, FJG_IN_Q);
    int p = fjg_param(g, "expect", FJG_I32);
    int x = q;
    int ops[40], cs[40];
    int len = 1 + trial % 40;
    for (int i = 0; i < len; i++) {
      seed = seed * 1664525u + 1013904223u;
      ops[i] = (int)(seed >> 28) % 6;
      cs[i] = (int)((seed >> 8) % (uint32_t)nc);
      int c = fjg_const_i32(g, consts[cs[i]]);
      switch (ops[i]) {
      case 0: x = fjg_binary(g, FJG_OP_ADD, x, c); break;
      case 1: x = fjg_binary(g, FJG_OP_ADD, c, x); break;
      case 2: x = fjg_binary(g, FJG_OP_SUB, x, c); break;
      case 3: x = fjg_binary(g, FJG_OP_SUB, c, x); break;
      case 4: x = fjg_binary(g, FJG_OP_MUL, x, c); break;
      default: x = fjg_unary(g, FJG_OP_NEG, x); break;
      }
      assert_true(x >= 0);
    }
    if (node(g, x)->op != FJG_OP_CONST) assert_true(chain_depth(g, x) <= 3);
    for (size_t k = 0; k < sizeof inputs / sizeof inputs[0]; k++) {
      uint32_t v = (uint32_t)inputs[k];
      for (int i = 0; i < len; i++) {
        uint32_t c = (uint32_t)consts[cs[i]];
        switch (ops[i]) {
        case 0: case 1: v += c; break;
        case 2: v -= c; break;
        case 3: v = c - v; break;
        case 4: v *= c; break;
        default: v = 0u - v; break;
        }
      }
      assert_int_equal(eval_i32(g, x, p, inputs[k], (int32_t)v), 1);
      assert_int_equal(eval_i32(g, x, p, inputs[k], (int32_t)(v + 1)), 0);
    }
    fjg_graph_destroy(g);
  }
}

static void test_limits(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  /* FJG_MAX_ARGS params and buffers together, then no more (redeclaring
   * one still works). */
  char name[16];
  for (int i = 0; i < FJG_MAX_ARGS; i++) {
    snprintf(name, sizeof name, "a%d", i);
    if (i % 2) assert_true(fjg_buffer(g, name, FJG_I32) >= 0);
    else assert_true(fjg_param(g, name, FJG_F32) >= 0);
  }
  assert_error(g, fjg_param(g, "one_more", FJG_I32), "FJG_MAX_ARGS");
  assert_error(g, fjg_buffer(g, "one_more", FJG_I32), "at most 64 params");
  assert_true(fjg_param(g, "a0", FJG_F32) >= 0);
  assert_int_equal(fjg_num_args(g), FJG_MAX_ARGS);
  fjg_graph_destroy(g);

  /* A mod may depend on FJG_MAX_MOD_NODES nodes, not more (here every node
   * of the graph: score, 0.5 and the chain of adds). */
  g = fjg_graph_create();
  int s = in(g, FJG_IN_SCORE), half = fjg_const_f32(g, 0.5f);
  int x = s;
  while (fjg_num_nodes(g) < FJG_MAX_MOD_NODES)
    x = fjg_binary(g, FJG_OP_ADD, x, half);
  assert_int_equal(fjg_set_score_root(g, x), 0);
  x = fjg_binary(g, FJG_OP_ADD, x, half);
  assert_error(g, fjg_set_score_root(g, x), "FJG_MAX_MOD_NODES");
  assert_error(g, fjg_set_mask_root(g, fjg_binary(g, FJG_OP_LT, x, half)),
               "the result of mask_mod depends on");
  fjg_graph_destroy(g);

  /* FJG_MAX_NODES in one graph, dead ones included. */
  g = fjg_graph_create();
  int made = 0;
  while (fjg_const_i32(g, made) >= 0) made++;
  assert_int_equal(made, FJG_MAX_NODES);
  assert_error(g, fjg_const_i32(g, -1), "FJG_MAX_NODES");
  assert_int_equal(fjg_const_i32(g, 5), 5); /* existing nodes still found */
  fjg_graph_destroy(g);
}

static void test_declarations(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int w = fjg_param(g, "window", FJG_I32);
  assert_true(w >= 0);
  assert_int_equal(fjg_param(g, "window", FJG_I32), w);
  int doc = fjg_buffer(g, "doc_id", FJG_I32);
  assert_int_equal(doc, 1);
  assert_int_equal(fjg_buffer(g, "doc_id", FJG_I32), doc);
  int scale = fjg_param(g, "slope_scale", FJG_F32);
  assert_int_equal(node(g, scale)->type, FJG_F32);
  assert_int_equal(fjg_num_args(g), 3);
  assert_string_equal(fjg_arg_at(g, 0)->name, "window");
  assert_int_equal(fjg_arg_at(g, 0)->kind, FJ_ARG_I32);
  assert_int_equal(fjg_arg_at(g, 1)->kind, FJ_ARG_BUFFER);
  assert_int_equal(fjg_arg_at(g, 1)->type, FJG_I32);
  assert_int_equal(fjg_arg_at(g, 2)->kind, FJ_ARG_F32);
  assert_int_equal(fjg_find_arg(g, "doc_id"), 1);
  assert_int_equal(fjg_find_arg(g, "nope"), -1);
  assert_null(fjg_arg_at(g, 3));
  int ld = fjg_load(g, doc, in(g, FJG_IN_Q));
  assert_int_equal(node(g, ld)->type, FJG_I32);
  assert_int_equal(node(g, ld)->arg, doc);
  assert_int_equal(node(g, w)->arg, 0);
  char name63[64];
  memset(name63, 'x', 63);
  name63[63] = '\0';
  assert_true(fjg_param(g, name63, FJG_I32) >= 0);
  fjg_graph_destroy(g);
}

/* Only f32 buffers can be trainable; the flag is per argument and shows in
 * the bit set. */
static void test_trainable(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int w = fjg_param(g, "w", FJG_F32);
  int ids = fjg_buffer(g, "ids", FJG_I32);
  int bias = fjg_buffer(g, "bias", FJG_F32);
  int slopes = fjg_buffer(g, "slopes", FJG_F32);
  assert_true(w >= 0 && ids == 1 && bias == 2 && slopes == 3);
  assert_int_equal(fjg_trainable_args(g), 0);
  assert_int_equal(fjg_arg_at(g, bias)->trainable, 0);
  assert_int_equal(fjg_set_trainable(g, bias), 0);
  assert_int_equal(fjg_set_trainable(g, bias), 0);
  assert_int_equal(fjg_arg_at(g, bias)->trainable, 1);
  assert_int_equal(fjg_arg_at(g, slopes)->trainable, 0);
  assert_int_equal(fjg_trainable_args(g), 1u << 2);
  assert_error(g, fjg_set_trainable(g, ids), "'ids' cannot have a gradient");
  assert_error(g, fjg_set_trainable(g, 0), "'w' cannot have a gradient");
  assert_error(g, fjg_set_trainable(g, 9), "no argument 9");
  assert_int_equal(fjg_set_trainable(g, slopes), 0);
  assert_int_equal(fjg_trainable_args(g), (1u << 2) | (1u << 3));
  fjg_graph_destroy(g);
}

/* The graph keeps the derivative; its nodes, shared ones included, form
 * list 2 of fjg_reachable; a derivative past FJG_MAX_GRAD_NODES is
 * refused and leaves none set. */
static void test_derivative_kept(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int bias = fjg_buffer(g, "bias", FJG_F32);
  assert_int_equal(fjg_set_trainable(g, bias), 0);
  int s = in(g, FJG_IN_SCORE);
  int idx = fjg_binary(g, FJG_OP_SUB, in(g, FJG_IN_Q), in(g, FJG_IN_KV));
  int t = fjg_unary(g, FJG_OP_TANH, s);
  int root = fjg_binary(g, FJG_OP_ADD, fjg_binary(g, FJG_OP_MUL, t, fjg_load(g, bias, idx)),
                        fjg_const_f32(g, 1.0f));
  assert_int_equal(fjg_set_score_root(g, root), 0);
  assert_null(fjg_graph_derivative(g));
  int count = -1;
  fjg_reachable(g, 2, &count);
  assert_int_equal(count, 0);
  fjg_derivative d;
  assert_int_equal(fjg_derive_score(g, fjg_trainable_args(g), &d, NULL, 0), FJ_OK);
  assert_int_equal(d.num_buffer_grads, 1);
  assert_int_equal(fjg_set_derivative(g, &d), 0);
  const fjg_derivative *kept = fjg_graph_derivative(g);
  assert_non_null(kept);
  assert_int_equal(kept->dscore, d.dscore);
  assert_int_equal(kept->buffer_grads[0].index, idx);
  const int32_t *list = fjg_reachable(g, 2, &count);
  int has_t = 0, has_idx = 0, has_grad = 0;
  for (int k = 0; k < count; k++) {
    if (k) assert_true(list[k] > list[k - 1]);
    has_t |= list[k] == t;
    has_idx |= list[k] == idx;
    has_grad |= list[k] == d.buffer_grads[0].grad;
  }
  assert_true(has_t && has_idx && has_grad);
  /* Nodes that are not f32 values, or an i32 buffer, are refused. */
  fjg_derivative bad = d;
  bad.dscore = idx;
  assert_error(g, fjg_set_derivative(g, &bad), "not an f32 node");
  bad = d;
  bad.buffer_grads[0].index = t;
  assert_error(g, fjg_set_derivative(g, &bad), "not an i32 node");
  fjg_graph_destroy(g);

  /* A chain of min(x * 1.5, score): about 900 nodes, within the mod's
   * limit, whose derivative has several nodes per min. */
  g = fjg_graph_create();
  s = in(g, FJG_IN_SCORE);
  int x = fjg_unary(g, FJG_OP_TANH, s);
  for (int k = 0; k < 450; k++)
    x = fjg_binary(g, FJG_OP_MIN, fjg_binary(g, FJG_OP_MUL, x, fjg_const_f32(g, 1.5f)), s);
  assert_int_equal(fjg_set_score_root(g, x), 0);
  assert_int_equal(fjg_derive_score(g, 0, &d, NULL, 0), FJ_OK);
  assert_error(g, fjg_set_derivative(g, &d), "FJG_MAX_GRAD_NODES");
  assert_null(fjg_graph_derivative(g));
  fjg_reachable(g, 2, &count);
  assert_int_equal(count, 0);
  fjg_graph_destroy(g);
}

static void test_errors(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int q = in(g, FJG_IN_Q), kv = in(g, FJG_IN_KV), s = in(g, FJG_IN_SCORE);
  int ge = fjg_binary(g, FJG_OP_GE, q, kv);
  assert_error(g, fjg_binary(g, FJG_OP_ADD, ge, q),
               "arithmetic on a boolean (use where(c, a, b))");
  assert_error(g, fjg_binary(g, FJG_OP_MUL, q, ge), "arithmetic on a boolean");
  assert_error(g, fjg_unary(g, FJG_OP_NEG, ge), "of a boolean");
  assert_error(g, fjg_unary(g, FJG_OP_EXP, ge), "of a boolean");
  assert_error(g, fjg_binary(g, FJG_OP_AND, ge, q), "logical and of a number");
  assert_error(g, fjg_binary(g, FJG_OP_OR, q, ge), "logical or of a number");
  assert_error(g, fjg_unary(g, FJG_OP_NOT, q), "logical not of a number");
  assert_error(g, fjg_binary(g, FJG_OP_LT, ge, ge), "comparison lt of a bool");
  assert_error(g, fjg_where(g, q, q, kv), "condition must be a boolean");
  assert_error(g, fjg_where(g, ge, ge, kv), "must both be booleans or both numbers");
  assert_error(g, fjg_binary(g, FJG_OP_ADD, q, 9999), "invalid operand");
  assert_error(g, fjg_binary(g, FJG_OP_NOT, q, kv), "not a binary operator");
  assert_error(g, fjg_unary(g, FJG_OP_ADD, q), "not a unary operator");
  assert_error(g, fjg_unary(g, FJG_OP_LOAD, q), "not a unary operator");
  assert_error(g, fjg_input_node(g, (fjg_input)9), "unknown input");
  assert_error(g, fjg_size_node(g, (fjg_size)9), "unknown size");

  assert_error(g, fjg_param(g, "1x", FJG_I32), "not a Lua identifier");
  assert_error(g, fjg_param(g, "end", FJG_I32), "not a Lua identifier");
  assert_error(g, fjg_param(g, "", FJG_I32), "not a Lua identifier");
  assert_error(g, fjg_param(g, "a-b", FJG_I32), "not a Lua identifier");
  char name64[65];
  memset(name64, 'x', 64);
  name64[64] = '\0';
  assert_error(g, fjg_param(g, name64, FJG_I32), "at most 63");
  assert_error(g, fjg_param(g, "flag", FJG_BOOL), "must be i32 or f32");
  assert_error(g, fjg_buffer(g, "mask", FJG_BOOL), "must be i32 or f32");
  assert_true(fjg_param(g, "w", FJG_I32) >= 0);
  assert_error(g, fjg_param(g, "w", FJG_F32), "already declared with type i32");
  assert_error(g, fjg_buffer(g, "w", FJG_I32), "already declared as a param");
  int buf = fjg_buffer(g, "bias", FJG_F32);
  assert_true(buf >= 0);
  assert_error(g, fjg_param(g, "bias", FJG_F32), "already declared as a buffer");
  assert_error(g, fjg_buffer(g, "bias", FJG_I32), "already declared with type");
  assert_error(g, fjg_load(g, 0, q), "not a buffer");
  assert_error(g, fjg_load(g, 42, q), "not a buffer");
  assert_error(g, fjg_load(g, buf, s), "the index must be an i32");
  assert_error(g, fjg_load(g, buf, ge), "the index must be an i32");

  assert_error(g, fjg_set_mask_root(g, q), "mask_mod must return a boolean");
  assert_error(g, fjg_set_score_root(g, ge), "score_mod must return a number");
  assert_error(g, fjg_set_mask_root(g, 12345), "invalid node");
  assert_int_equal(fjg_mask_root(g), -1);
  assert_int_equal(fjg_score_root(g), -1);
  fjg_graph_destroy(g);
}

static void test_roots_and_deps(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int q = in(g, FJG_IN_Q), kv = in(g, FJG_IN_KV), h = in(g, FJG_IN_H);
  int s = in(g, FJG_IN_SCORE);
  int ge = fjg_binary(g, FJG_OP_GE, q, kv);
  assert_int_equal(fjg_set_mask_root(g, ge), 0);
  assert_int_equal(fjg_mask_root(g), ge);
  assert_int_equal(fjg_input_deps(g, ge), (1u << FJG_IN_Q) | (1u << FJG_IN_KV));
  /* An i32 score root is converted to f32. */
  int hq = fjg_binary(g, FJG_OP_SUB, h, q);
  assert_int_equal(fjg_set_score_root(g, hq), 0);
  int root = fjg_score_root(g);
  assert_int_equal(node(g, root)->type, FJG_F32);
  assert_int_equal(node(g, root)->op, FJG_OP_TO_F32);
  assert_int_equal(fjg_input_deps(g, root), (1u << FJG_IN_H) | (1u << FJG_IN_Q));
  int sm = fjg_binary(g, FJG_OP_MUL, s, fjg_const_f32(g, 2.0f));
  assert_int_equal(fjg_input_deps(g, sm), 1u << FJG_IN_SCORE);
  assert_int_equal(fjg_input_deps(g, -1), 0u);
  assert_int_equal(fjg_set_score_root(g, -1), 0);
  assert_int_equal(fjg_score_root(g), -1);
  fjg_graph_destroy(g);
}

static void test_names_and_buf(void **state) {
  (void)state;
  assert_string_equal(fjg_op_name(FJG_OP_WHERE), "where");
  assert_string_equal(fjg_op_name(FJG_OP_TO_F32), "to_f32");
  assert_string_equal(fjg_op_name(FJG_OP_IDIV), "idiv");
  assert_int_equal(fjg_op_arity(FJG_OP_WHERE), 3);
  assert_int_equal(fjg_op_arity(FJG_OP_LOAD), 1);
  assert_int_equal(fjg_op_arity(FJG_OP_CONST), 0);
  assert_string_equal(fjg_op_name(FJG_NUM_OPS), "?");
  assert_string_equal(fjg_type_name(FJG_BOOL), "bool");
  assert_string_equal(fjg_type_name(FJG_I32), "i32");
  assert_string_equal(fjg_type_name(FJG_F32), "f32");

  fjg_buf b;
  fjg_buf_init(&b);
  fjg_buf_printf(&b, "%d-%s", 42, "x");
  char big[1000];
  memset(big, 'y', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  fjg_buf_printf(&b, "%s", big);
  fjg_buf_append(&b, "!", 1);
  assert_int_equal(b.len, 4 + 999 + 1);
  assert_memory_equal(b.data, "42-x", 4);
  assert_int_equal(b.data[b.len - 1], '!');
  assert_int_equal(b.data[b.len], '\0');
  assert_false(b.failed);
  fjg_buf_free(&b);
  assert_null(b.data);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hash_consing),
      cmocka_unit_test(test_promotion),
      cmocka_unit_test(test_folding),
      cmocka_unit_test(test_i32_chains_fold),
      cmocka_unit_test(test_i32_chains_match_wrapping),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_declarations),
      cmocka_unit_test(test_trainable),
      cmocka_unit_test(test_derivative_kept),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_roots_and_deps),
      cmocka_unit_test(test_names_and_buf),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
