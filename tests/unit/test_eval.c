/* tests/unit/test_eval.c: the CPU evaluator (gen/eval.c): Lua's // and %,
 * wrapping, loads, float32 arithmetic in the kernel's order, the elements it
 * cannot decide (uncertain), and its speed. */
#include <float.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <math.h>
#include <time.h>

#include <cmocka.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "gen/eval.h"
#include "gen/graph.h"

/* Runs `return <expr>` in a plain Lua state and returns the number. */
static double lua_eval(lua_State *L, const char *expr) {
  char chunk[256];
  snprintf(chunk, sizeof chunk, "return %s", expr);
  if (luaL_dostring(L, chunk) != LUA_OK) fail_msg("lua: %s", lua_tostring(L, -1));
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

/* mask = (op(x, y) == z) with i32 params x, y, z: an i32 result checked
 * without passing through the score's f32. */
static fjg_graph *i32_op_equals(fjg_op op) {
  fjg_graph *g = fjg_graph_create();
  int x = fjg_param(g, "x", FJG_I32), y = fjg_param(g, "y", FJG_I32);
  int z = fjg_param(g, "z", FJG_I32);
  int r = op == FJG_OP_NEG || op == FJG_OP_ABS ? fjg_unary(g, op, x)
                                               : fjg_binary(g, op, x, y);
  assert_true(fjg_set_mask_root(g, fjg_binary(g, FJG_OP_EQ, r, z)) >= 0);
  return g;
}

static int i32_is(fjg_graph *g, int32_t x, int32_t y, int32_t want) {
  int32_t p[3] = {x, y, want};
  fjg_env env = {{0}, 0, 0, p, NULL, NULL, NULL};
  return fjg_eval_mask(g, &env, 0, 0, 0, 0);
}

/* score_mod(x, y params) = op(x, y) as f32, so one graph evaluates any
 * operand values through env. */
static fjg_graph *binary_of_params(fjg_op op, fjg_type type) {
  fjg_graph *g = fjg_graph_create();
  int x = fjg_param(g, "x", type), y = fjg_param(g, "y", type);
  assert_int_equal(fjg_set_score_root(g, fjg_binary(g, op, x, y)), 0);
  return g;
}

static void test_integer_floor_div_mod_match_lua(void **state) {
  (void)state;
  lua_State *L = luaL_newstate();
  fjg_graph *gd = i32_op_equals(FJG_OP_IDIV);
  fjg_graph *gm = i32_op_equals(FJG_OP_MOD);
  int32_t vals[] = {-1000003, -130, -64, -63, -9, -8, -7, -2, -1, 0, 1, 2, 3,
                    7, 8, 63, 64, 65, 129, 999983, INT32_MAX, INT32_MIN + 1};
  int n = (int)(sizeof vals / sizeof vals[0]);
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < n; j++) {
      if (vals[j] == 0) continue;
      char expr[96];
      snprintf(expr, sizeof expr, "(%d) // (%d)", (int)vals[i], (int)vals[j]);
      int32_t want = (int32_t)lua_eval(L, expr);
      if (!i32_is(gd, vals[i], vals[j], want)) fail_msg("%s: lua %d", expr, (int)want);
      snprintf(expr, sizeof expr, "(%d) %% (%d)", (int)vals[i], (int)vals[j]);
      want = (int32_t)lua_eval(L, expr);
      if (!i32_is(gm, vals[i], vals[j], want)) fail_msg("%s: lua %d", expr, (int)want);
    }
    /* x // 0 and x % 0 are 0 (Lua would raise an error). */
    assert_true(i32_is(gd, vals[i], 0, 0));
    assert_true(i32_is(gm, vals[i], 0, 0));
  }
  fjg_graph_destroy(gd);
  fjg_graph_destroy(gm);
  lua_close(L);
}

/* Lua computes in double; f32 // and % agree with it on these values
 * (a / b never rounds across an integer, the products are exact), and f32
 * / is Lua's quotient rounded to float. */
static void test_float_floor_div_mod_match_lua(void **state) {
  (void)state;
  lua_State *L = luaL_newstate();
  fjg_graph *gd = binary_of_params(FJG_OP_IDIV, FJG_F32);
  fjg_graph *gm = binary_of_params(FJG_OP_MOD, FJG_F32);
  fjg_graph *gq = binary_of_params(FJG_OP_DIV, FJG_F32);
  float vals[] = {-7.5f, -7.0f, -2.25f, -0.5f, 0.0f, 0.5f, 2.0f, 2.25f, 7.0f,
                  7.5f, 1024.75f};
  int n = (int)(sizeof vals / sizeof vals[0]);
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < n; j++) {
      if (vals[j] == 0.0f) continue;
      float p[2] = {vals[i], vals[j]};
      fjg_env env = {{0}, 0, 0, NULL, p, NULL, NULL};
      const char *ops[] = {"//", "%", "/"};
      fjg_graph *gs[] = {gd, gm, gq};
      for (int k = 0; k < 3; k++) {
        char expr[96];
        snprintf(expr, sizeof expr, "(%.17g) %s (%.17g)", (double)p[0], ops[k],
                 (double)p[1]);
        double want = (float)lua_eval(L, expr);
        double got = fjg_eval_score(gs[k], &env, 0, 0, 0, 0, 0);
        if (got != want) fail_msg("%s: lua %.17g, eval %.17g", expr, want, got);
      }
    }
  }
  fjg_graph_destroy(gd);
  fjg_graph_destroy(gm);
  fjg_graph_destroy(gq);
  lua_close(L);
}

static void test_wrapping(void **state) {
  (void)state;
  fjg_graph *add = i32_op_equals(FJG_OP_ADD);
  fjg_graph *sub = i32_op_equals(FJG_OP_SUB);
  fjg_graph *mul = i32_op_equals(FJG_OP_MUL);
  fjg_graph *div = i32_op_equals(FJG_OP_IDIV);
  fjg_graph *mod = i32_op_equals(FJG_OP_MOD);
  fjg_graph *neg = i32_op_equals(FJG_OP_NEG);
  fjg_graph *abs_ = i32_op_equals(FJG_OP_ABS);
  assert_true(i32_is(add, INT32_MAX, 1, INT32_MIN));
  assert_true(i32_is(sub, INT32_MIN, 1, INT32_MAX));
  assert_true(i32_is(mul, 65536, 65536, 0));
  assert_true(i32_is(mul, INT32_MIN, -1, INT32_MIN));
  assert_true(i32_is(div, INT32_MIN, -1, INT32_MIN));
  assert_true(i32_is(mod, INT32_MIN, -1, 0));
  assert_true(i32_is(div, INT32_MIN, 1, INT32_MIN));
  assert_true(i32_is(mod, INT32_MIN, INT32_MAX, INT32_MAX - 1));
  assert_true(i32_is(neg, INT32_MIN, 0, INT32_MIN));
  assert_true(i32_is(abs_, INT32_MIN, 0, INT32_MIN));
  assert_true(i32_is(abs_, -5, 0, 5));
  fjg_graph *gs[] = {add, sub, mul, div, mod, neg, abs_};
  for (int i = 0; i < 7; i++) fjg_graph_destroy(gs[i]);
}

/* Document mask: doc[q] == doc[kv]; out-of-range indices read 0. */
static void test_loads_and_masks(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int doc = fjg_buffer(g, "doc", FJG_I32);
  int bias = fjg_buffer(g, "bias", FJG_F32);
  int q = fjg_input_node(g, FJG_IN_Q), kv = fjg_input_node(g, FJG_IN_KV);
  int same = fjg_binary(g, FJG_OP_EQ, fjg_load(g, doc, q), fjg_load(g, doc, kv));
  fjg_set_mask_root(g, fjg_binary(g, FJG_OP_AND, same,
                                  fjg_binary(g, FJG_OP_GE, q, kv)));
  int d = fjg_binary(g, FJG_OP_SUB, q, kv);
  int s = fjg_input_node(g, FJG_IN_SCORE);
  fjg_set_score_root(g, fjg_binary(g, FJG_OP_ADD, s, fjg_load(g, bias, d)));
  int32_t docs[] = {1, 1, 2, 2, 2};
  float biases[] = {0.5f, -1.0f, 2.0f};
  const void *data[] = {docs, biases};
  int64_t lens[] = {5, 3};
  fjg_env env = {{1, 1, 1, 5, 5}, 0, 0, NULL, NULL, data, lens};
  assert_int_equal(fjg_eval_mask(g, &env, 0, 0, 1, 0), 1);
  assert_int_equal(fjg_eval_mask(g, &env, 0, 0, 2, 1), 0);
  assert_int_equal(fjg_eval_mask(g, &env, 0, 0, 4, 2), 1);
  assert_int_equal(fjg_eval_mask(g, &env, 0, 0, 1, 2), 0);
  /* q = 7 and kv = 6 are both past the end: 0 == 0. */
  assert_int_equal(fjg_eval_mask(g, &env, 0, 0, 7, 6), 1);
  assert_int_equal(fjg_eval_mask(g, &env, 0, 0, 7, 1), 0);
  assert_true(fjg_eval_score(g, &env, 1.0, 0, 0, 2, 1) == 0.0);
  assert_true(fjg_eval_score(g, &env, 1.0, 0, 0, 2, 0) == 3.0);
  assert_true(fjg_eval_score(g, &env, 1.0, 0, 0, 5, 0) == 1.0); /* past end */
  assert_true(fjg_eval_score(g, &env, 1.0, 0, 0, 0, 1) == 1.0); /* index -1 */
  fjg_graph_destroy(g);

  /* No roots: mask 1, score unchanged. */
  fjg_graph *e = fjg_graph_create();
  assert_int_equal(fjg_eval_mask(e, NULL, 0, 0, 3, 9), 1);
  assert_true(fjg_eval_score(e, NULL, -2.5, 0, 0, 3, 9) == -2.5);
  fjg_graph_destroy(e);
}

/* fn(to_f32(q)) compared with a constant, as a mask. */
static fjg_graph *f32_mask(fjg_op cmp, fjg_op fn, float scale, float bound) {
  fjg_graph *g = fjg_graph_create();
  int q = fjg_unary(g, FJG_OP_TO_F32, fjg_input_node(g, FJG_IN_Q));
  int x = fjg_binary(g, FJG_OP_MUL, q, fjg_const_f32(g, scale));
  if (fn != FJG_OP_CONST) x = fjg_unary(g, fn, x);
  assert_true(fjg_set_mask_root(g, fjg_binary(g, cmp, x, fjg_const_f32(g, bound))) >= 0);
  return g;
}

/* lt(q / 49.0 * 49.0, q): in float32 (the kernel) q / 49 * 49 is never
 * below q for these q; in double it is at q = 1, 2, 4, 8, 16. */
static void test_q_div_49_times_49(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int q = fjg_unary(g, FJG_OP_TO_F32, fjg_input_node(g, FJG_IN_Q));
  int c = fjg_const_f32(g, 49.0f);
  fjg_set_mask_root(g, fjg_binary(g, FJG_OP_LT, fjg_binary(g, FJG_OP_MUL,
                                     fjg_binary(g, FJG_OP_DIV, q, c), c), q));
  fjg_evaluator e;
  assert_int_equal(fjg_evaluator_init(&e, g, NULL), FJ_OK);
  int powers[] = {1, 2, 4, 8, 16};
  for (int i = 0; i < 5; i++)
    assert_int_equal(fjg_eval_mask3(&e, 0, 0, powers[i], 0), FJG_MASKED);
  for (int qi = 0; qi < 5000; qi++) {
    volatile float x = (float)qi, d = x / 49.0f, p = d * 49.0f;
    assert_int_equal(fjg_eval_mask3(&e, 0, 0, qi, 0), p < x);
  }
  fjg_evaluator_free(&e);
  fjg_graph_destroy(g);
}

/* softcap and alibi in float32 in the kernel's order: score / 30 is
 * score * (1 / 30) as emitted, tanh is the CPU's tanhf (the kernel's differs
 * by its approximation, which no decision depends on). */
static void test_score_in_float(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int s = fjg_input_node(g, FJG_IN_SCORE);
  int cap = fjg_const_f32(g, 30.0f);
  int t = fjg_unary(g, FJG_OP_TANH, fjg_binary(g, FJG_OP_DIV, s, cap));
  int h = fjg_input_node(g, FJG_IN_H);
  int slope = fjg_unary(g, FJG_OP_EXP2, fjg_unary(g, FJG_OP_NEG, h));
  int d = fjg_binary(g, FJG_OP_SUB, fjg_input_node(g, FJG_IN_Q),
                     fjg_input_node(g, FJG_IN_KV));
  int r = fjg_binary(g, FJG_OP_SUB, fjg_binary(g, FJG_OP_MUL, cap, t),
                     fjg_binary(g, FJG_OP_MUL, slope, d));
  fjg_set_score_root(g, r);
  fjg_evaluator e;
  assert_int_equal(fjg_evaluator_init(&e, g, NULL), FJ_OK);
  for (int i = 0; i < 200; i++) {
    float score = (float)(i - 100) * 0.37f;
    int uncertain = 1;
    float got = fjg_eval_score_f32(&e, score, 0, 3, 10, 4, &uncertain);
    volatile float x = score * (float)(1.0 / 30.0), th = tanhf(x), a = 30.0f * th;
    volatile float sl = exp2f(-3.0f), b = sl * 6.0f, want = a - b;
    if (got != want) fail_msg("score %g: eval %.9g, float %.9g", score, got, want);
    assert_int_equal(uncertain, 0);
  }
  fjg_evaluator_free(&e);
  fjg_graph_destroy(g);
}

/* Where the kernel's exp, log or tanh may land on either side of a
 * comparison the element is uncertain; elsewhere it is decided. */
static void test_uncertain_elements(void **state) {
  (void)state;
  fjg_evaluator e;
  /* exp(0 * q) is 1 give or take a few ulps: <= 1 is undecidable, < 2 is not. */
  fjg_graph *g = f32_mask(FJG_OP_LE, FJG_OP_EXP, 0.0f, 1.0f);
  assert_int_equal(fjg_evaluator_init(&e, g, NULL), FJ_OK);
  assert_int_equal(fjg_eval_mask3(&e, 0, 0, 5, 0), FJG_UNCERTAIN);
  fjg_evaluator_free(&e);
  fjg_graph_destroy(g);
  g = f32_mask(FJG_OP_LT, FJG_OP_EXP, 0.0f, 2.0f);
  assert_int_equal(fjg_evaluator_init(&e, g, NULL), FJ_OK);
  assert_int_equal(fjg_eval_mask3(&e, 0, 0, 5, 0), FJG_ALLOWED);
  fjg_evaluator_free(&e);
  fjg_graph_destroy(g);

  /* exp(q / 100) < 3: decided on both sides of q = 109.86. */
  g = f32_mask(FJG_OP_LT, FJG_OP_EXP, 0.01f, 3.0f);
  assert_int_equal(fjg_evaluator_init(&e, g, NULL), FJ_OK);
  for (int q = 0; q < 300; q++)
    assert_int_equal(fjg_eval_mask3(&e, 0, 0, q, 0), q <= 109);
  fjg_evaluator_free(&e);
  fjg_graph_destroy(g);

  /* tanh(q - 10) < 0: the approximation's sign at 0 is not known. */
  g = fjg_graph_create();
  int q = fjg_unary(g, FJG_OP_TO_F32, fjg_input_node(g, FJG_IN_Q));
  int t = fjg_unary(g, FJG_OP_TANH, fjg_binary(g, FJG_OP_SUB, q, fjg_const_f32(g, 10.0f)));
  fjg_set_mask_root(g, fjg_binary(g, FJG_OP_LT, t, fjg_const_f32(g, 0.0f)));
  assert_int_equal(fjg_evaluator_init(&e, g, NULL), FJ_OK);
  assert_int_equal(fjg_eval_mask3(&e, 0, 0, 9, 0), FJG_ALLOWED);
  assert_int_equal(fjg_eval_mask3(&e, 0, 0, 10, 0), FJG_UNCERTAIN);
  assert_int_equal(fjg_eval_mask3(&e, 0, 0, 11, 0), FJG_MASKED);
  fjg_evaluator_free(&e);
  fjg_graph_destroy(g);

  /* log2(q) == floor(log2(q)): decided false off the powers of two; at a
   * power of two the floor may go either way. */
  g = fjg_graph_create();
  q = fjg_unary(g, FJG_OP_TO_F32, fjg_input_node(g, FJG_IN_Q));
  int l = fjg_unary(g, FJG_OP_LOG2, q);
  fjg_set_mask_root(g, fjg_binary(g, FJG_OP_EQ, l, fjg_unary(g, FJG_OP_FLOOR, l)));
  assert_int_equal(fjg_evaluator_init(&e, g, NULL), FJ_OK);
  assert_int_equal(fjg_eval_mask3(&e, 0, 0, 3, 0), FJG_MASKED);
  assert_int_equal(fjg_eval_mask3(&e, 0, 0, 8, 0), FJG_UNCERTAIN);
  int uncertain = 0;
  assert_int_equal(fjg_eval_mask_guess(&e, 0, 0, 8, 0, &uncertain), 1);
  assert_int_equal(uncertain, 1);
  fjg_evaluator_free(&e);
  fjg_graph_destroy(g);

  /* min(-0 * q, 0) is a zero of either sign: 1 / it is -inf or +inf. */
  g = fjg_graph_create();
  q = fjg_unary(g, FJG_OP_TO_F32, fjg_input_node(g, FJG_IN_Q));
  int z = fjg_binary(g, FJG_OP_MIN, fjg_binary(g, FJG_OP_MUL, q, fjg_const_f32(g, -0.0f)),
                     fjg_const_f32(g, 0.0f));
  fjg_set_mask_root(g, fjg_binary(g, FJG_OP_LT, fjg_binary(g, FJG_OP_DIV,
                                     fjg_const_f32(g, 1.0f), z), fjg_const_f32(g, 0.0f)));
  assert_int_equal(fjg_evaluator_init(&e, g, NULL), FJ_OK);
  assert_int_equal(fjg_eval_mask3(&e, 0, 0, 3, 0), FJG_UNCERTAIN);
  fjg_evaluator_free(&e);
  fjg_graph_destroy(g);

  /* A score_mod that decides on exp(0 * q) <= 1 is uncertain; exp(score)
   * alone is not (its rounding is within the reference's tolerance). */
  g = fjg_graph_create();
  q = fjg_unary(g, FJG_OP_TO_F32, fjg_input_node(g, FJG_IN_Q));
  int s = fjg_input_node(g, FJG_IN_SCORE);
  int c = fjg_binary(g, FJG_OP_LE, fjg_unary(g, FJG_OP_EXP, fjg_binary(g, FJG_OP_MUL, q,
                     fjg_const_f32(g, 0.0f))), fjg_const_f32(g, 1.0f));
  fjg_set_score_root(g, fjg_where(g, c, s, fjg_const_f32(g, 0.0f)));
  assert_int_equal(fjg_evaluator_init(&e, g, NULL), FJ_OK);
  uncertain = 0;
  fjg_eval_score_f32(&e, 1.5f, 0, 0, 4, 0, &uncertain);
  assert_int_equal(uncertain, 1);
  fjg_evaluator_free(&e);
  fjg_set_score_root(g, fjg_unary(g, FJG_OP_EXP, s));
  assert_int_equal(fjg_evaluator_init(&e, g, NULL), FJ_OK);
  uncertain = 1;
  float v = fjg_eval_score_f32(&e, 1.5f, 0, 0, 4, 0, &uncertain);
  assert_int_equal(uncertain, 0);
  assert_true(v == expf(1.5f));
  const fjg_aval *a = fjg_eval_root(&e, 1, 1.5f, 0, 0, 4, 0);
  assert_false(a->exact);
  assert_true(a->flo < (float)exp(1.5) && (float)exp(1.5) < a->fhi);
  assert_true(a->fhi - a->flo < 1e-5f);
  fjg_evaluator_free(&e);
  fjg_graph_destroy(g);
}

/* The block-mask builder evaluates the mask tens of millions of times. */
static void test_speed(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int w = fjg_param(g, "window", FJG_I32);
  int q = fjg_input_node(g, FJG_IN_Q), kv = fjg_input_node(g, FJG_IN_KV);
  int m = fjg_binary(g, FJG_OP_AND, fjg_binary(g, FJG_OP_GE, q, kv),
                     fjg_binary(g, FJG_OP_LT, fjg_binary(g, FJG_OP_SUB, q, kv), w));
  fjg_set_mask_root(g, m);
  int32_t window = 256;
  fjg_env env = {{1, 1, 1, 4096, 4096}, 0, 0, &window, NULL, NULL, NULL};
  fjg_evaluator e;
  assert_int_equal(fjg_evaluator_init(&e, g, &env), FJ_OK);
  clock_t t0 = clock();
  long long allowed = 0;
  for (int qi = 0; qi < 4096; qi++)
    for (int ki = 0; ki < 4096; ki++) allowed += fjg_eval_mask3(&e, 0, 0, qi, ki);
  double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  /* rows 0..255 allow q+1 keys, the rest 256. */
  assert_int_equal(allowed, 256LL * 257 / 2 + (4096LL - 256) * 256);
  print_message("16.8M mask evaluations in %.2f s\n", secs);
  assert_true(secs < 10.0);
  fjg_evaluator_free(&e);

  /* Bounded mode (an exp in the mask): 1M evaluations. */
  int x = fjg_unary(g, FJG_OP_EXP, fjg_binary(g, FJG_OP_MUL, fjg_unary(g, FJG_OP_TO_F32, kv),
                                              fjg_const_f32(g, 0.001f)));
  fjg_set_mask_root(g, fjg_binary(g, FJG_OP_AND, m, fjg_binary(g, FJG_OP_LT, x,
                                                               fjg_const_f32(g, 2.0f))));
  assert_int_equal(fjg_evaluator_init(&e, g, &env), FJ_OK);
  t0 = clock();
  allowed = 0;
  for (int qi = 0; qi < 1024; qi++)
    for (int ki = 0; ki < 1024; ki++) allowed += fjg_eval_mask3(&e, 0, 0, qi, ki) == FJG_ALLOWED;
  secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  print_message("1M bounded mask evaluations in %.2f s\n", secs);
  assert_true(allowed > 0);
  assert_true(secs < 10.0);
  fjg_evaluator_free(&e);
  fjg_graph_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_integer_floor_div_mod_match_lua),
      cmocka_unit_test(test_float_floor_div_mod_match_lua),
      cmocka_unit_test(test_wrapping),
      cmocka_unit_test(test_loads_and_masks),
      cmocka_unit_test(test_q_div_49_times_49),
      cmocka_unit_test(test_score_in_float),
      cmocka_unit_test(test_uncertain_elements),
      cmocka_unit_test(test_speed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
