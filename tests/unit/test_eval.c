/* tests/unit/test_eval.c: the CPU evaluator (gen/eval.c) against real Lua
 * for // and %, wrapping, loads, and its speed. */
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
  fjg_graph *gd = binary_of_params(FJG_OP_IDIV, FJG_I32);
  fjg_graph *gm = binary_of_params(FJG_OP_MOD, FJG_I32);
  int32_t vals[] = {-1000003, -130, -64, -63, -9, -8, -7, -2, -1, 0, 1, 2, 3,
                    7, 8, 63, 64, 65, 129, 999983, INT32_MAX, INT32_MIN + 1};
  int n = (int)(sizeof vals / sizeof vals[0]);
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < n; j++) {
      if (vals[j] == 0) continue;
      int32_t p[2] = {vals[i], vals[j]};
      fjg_env env = {{0}, p, NULL, NULL, NULL};
      char expr[96];
      snprintf(expr, sizeof expr, "(%d) // (%d)", (int)p[0], (int)p[1]);
      double want = lua_eval(L, expr);
      double got = fjg_eval_score(gd, &env, 0, 0, 0, 0, 0);
      if (got != want) fail_msg("%s: lua %.17g, eval %.17g", expr, want, got);
      snprintf(expr, sizeof expr, "(%d) %% (%d)", (int)p[0], (int)p[1]);
      want = lua_eval(L, expr);
      got = fjg_eval_score(gm, &env, 0, 0, 0, 0, 0);
      if (got != want) fail_msg("%s: lua %.17g, eval %.17g", expr, want, got);
    }
    /* x // 0 and x % 0 are 0 (Lua would raise an error). */
    int32_t p[2] = {vals[i], 0};
    fjg_env env = {{0}, p, NULL, NULL, NULL};
    assert_true(fjg_eval_score(gd, &env, 0, 0, 0, 0, 0) == 0.0);
    assert_true(fjg_eval_score(gm, &env, 0, 0, 0, 0, 0) == 0.0);
  }
  fjg_graph_destroy(gd);
  fjg_graph_destroy(gm);
  lua_close(L);
}

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
      fjg_env env = {{0}, NULL, p, NULL, NULL};
      const char *ops[] = {"//", "%", "/"};
      fjg_graph *gs[] = {gd, gm, gq};
      for (int k = 0; k < 3; k++) {
        char expr[96];
        snprintf(expr, sizeof expr, "(%.17g) %s (%.17g)", (double)p[0], ops[k],
                 (double)p[1]);
        double want = lua_eval(L, expr);
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
  fjg_graph *add = binary_of_params(FJG_OP_ADD, FJG_I32);
  fjg_graph *mul = binary_of_params(FJG_OP_MUL, FJG_I32);
  fjg_graph *div = binary_of_params(FJG_OP_IDIV, FJG_I32);
  fjg_graph *mod = binary_of_params(FJG_OP_MOD, FJG_I32);
  int32_t p[2] = {INT32_MAX, 1};
  fjg_env env = {{0}, p, NULL, NULL, NULL};
  assert_true(fjg_eval_score(add, &env, 0, 0, 0, 0, 0) == (double)INT32_MIN);
  p[0] = 65536, p[1] = 65536;
  assert_true(fjg_eval_score(mul, &env, 0, 0, 0, 0, 0) == 0.0);
  p[0] = INT32_MIN, p[1] = -1;
  assert_true(fjg_eval_score(div, &env, 0, 0, 0, 0, 0) == (double)INT32_MIN);
  assert_true(fjg_eval_score(mod, &env, 0, 0, 0, 0, 0) == 0.0);
  fjg_graph_destroy(add);
  fjg_graph_destroy(mul);
  fjg_graph_destroy(div);
  fjg_graph_destroy(mod);

  fjg_graph *g = fjg_graph_create();
  int x = fjg_param(g, "x", FJG_I32);
  fjg_set_score_root(g, fjg_unary(g, FJG_OP_ABS, x));
  int32_t v = INT32_MIN;
  fjg_env env2 = {{0}, &v, NULL, NULL, NULL};
  assert_true(fjg_eval_score(g, &env2, 0, 0, 0, 0, 0) == (double)INT32_MIN);
  v = -5;
  assert_true(fjg_eval_score(g, &env2, 0, 0, 0, 0, 0) == 5.0);
  fjg_graph_destroy(g);
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
  fjg_env env = {{1, 1, 1, 5, 5}, NULL, NULL, data, lens};
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

static void test_f32_math_in_double(void **state) {
  (void)state;
  /* softcap: 30 * tanh(score / 30), alibi: score - slope * (q - kv). */
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
  double got = fjg_eval_score(g, NULL, 12.0, 0, 3, 10, 4);
  double want = 30.0 * tanh(12.0 / 30.0) - 0.125 * 6.0;
  assert_true(fabs(got - want) < 1e-12);
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
  fjg_env env = {{1, 1, 1, 4096, 4096}, &window, NULL, NULL, NULL};
  clock_t t0 = clock();
  long long allowed = 0;
  for (int qi = 0; qi < 4096; qi++)
    for (int ki = 0; ki < 4096; ki++) allowed += fjg_eval_mask(g, &env, 0, 0, qi, ki);
  double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  /* rows 0..255 allow q+1 keys, the rest 256. */
  assert_int_equal(allowed, 256LL * 257 / 2 + (4096LL - 256) * 256);
  print_message("16.8M mask evaluations in %.2f s\n", secs);
  assert_true(secs < 10.0);
  fjg_graph_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_integer_floor_div_mod_match_lua),
      cmocka_unit_test(test_float_floor_div_mod_match_lua),
      cmocka_unit_test(test_wrapping),
      cmocka_unit_test(test_loads_and_masks),
      cmocka_unit_test(test_f32_math_in_double),
      cmocka_unit_test(test_speed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
