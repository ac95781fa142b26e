/* tests/unit/test_lua_trace.c: tracing Lua arithmetic into the graph, and
 * checking that the graph computes what Lua itself would. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "gen/derivative.h"
#include "lua/spec.h"

#define assert_near(got, want, tol)                                        \
  do {                                                                     \
    double got_ = (got), want_ = (want);                                   \
    if (!(fabs(got_ - want_) <= (tol)))                                    \
      fail_msg("%s = %.9g, expected %.9g", #got, got_, want_);             \
  } while (0)

static fjg_graph *trace_ok(const char *src, char **name) {
  fjg_graph *g = NULL;
  char err[1024] = "";
  fj_status st =
      fjl_trace_spec(src, strlen(src), "spec.lua", &g, name, err, sizeof err);
  if (st != FJ_OK)
    fail_msg("trace failed (%d): %s\n%s", st, err, src);
  return g;
}

static fjg_env sizes_env(int lq, int lk) {
  fjg_env env;
  memset(&env, 0, sizeof env);
  env.sizes[FJG_SZ_B] = 2;
  env.sizes[FJG_SZ_HQ] = 4;
  env.sizes[FJG_SZ_HKV] = 2;
  env.sizes[FJG_SZ_LQ] = lq;
  env.sizes[FJG_SZ_LK] = lk;
  return env;
}

/* Evaluates `expr` in a plain (unsandboxed) Lua state after `setup`. */
static double lua_value(lua_State *L, const char *setup, const char *expr) {
  char chunk[512];
  snprintf(chunk, sizeof chunk, "%s; return %s", setup, expr);
  if (luaL_dostring(L, chunk) != LUA_OK)
    fail_msg("lua: %s", lua_tostring(L, -1));
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static void test_arithmetic_matches_lua(void **state) {
  (void)state;
  fjg_graph *g = trace_ok(
      "return { score_mod = function(s, b, h, q, kv)\n"
      "  return s * 0.5 + (q - kv) * 3 - -h + b / 4 + min(q, kv, 2) "
      "- max(q, 1) + abs(kv - q)\nend }",
      NULL);
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  fjg_env env = sizes_env(6, 6);
  for (int q = 0; q < 6; q++) {
    for (int kv = 0; kv < 6; kv++) {
      char setup[128];
      snprintf(setup, sizeof setup, "local s, b, h, q, kv = 1.25, 1, 3, %d, %d",
               q, kv);
      double want = lua_value(L, setup,
                              "s * 0.5 + (q - kv) * 3 - -h + b / 4 + "
                              "math.min(q, kv, 2) - math.max(q, 1) + "
                              "math.abs(kv - q)");
      assert_near(fjg_eval_score(g, &env, 1.25, 1, 3, q, kv), want,
                          1e-6);
    }
  }
  lua_close(L);
  fjg_graph_destroy(g);
}

/* // and % of negative operands: floored, like Lua, for i32 and f32. */
static void test_floor_div_and_mod_match_lua(void **state) {
  (void)state;
  const char *ops[] = {"//", "%"};
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  for (int o = 0; o < 2; o++) {
    char src[256];
    snprintf(src, sizeof src,
             "local x, y = param('x', 'i32'), param('y', 'i32')\n"
             "return { score_mod = function(s, b, h, q, kv) return x %s y end }",
             ops[o]);
    fjg_graph *gi = trace_ok(src, NULL);
    snprintf(src, sizeof src,
             "local x, y = param('x', 'f32'), param('y', 'f32')\n"
             "return { score_mod = function(s, b, h, q, kv) return x %s y end }",
             ops[o]);
    fjg_graph *gf = trace_ok(src, NULL);
    for (int x = -9; x <= 9; x++) {
      for (int y = -4; y <= 4; y++) {
        if (y == 0)
          continue;
        char setup[96], expr[32];
        snprintf(expr, sizeof expr, "x %s y", ops[o]);
        /* i32 */
        int32_t pi[2] = {x, y};
        fjg_env env = sizes_env(1, 1);
        env.param_i32 = pi;
        snprintf(setup, sizeof setup, "local x, y = %d, %d", x, y);
        assert_near(fjg_eval_score(gi, &env, 0, 0, 0, 0, 0),
                            lua_value(L, setup, expr), 0);
        /* f32, with exactly representable halves */
        float pf[2] = {x * 0.5f, y * 1.5f};
        env.param_i32 = NULL;
        env.param_f32 = pf;
        snprintf(setup, sizeof setup, "local x, y = %.17g, %.17g", (double)pf[0],
                 (double)pf[1]);
        assert_near(fjg_eval_score(gf, &env, 0, 0, 0, 0, 0),
                            lua_value(L, setup, expr), 1e-6);
      }
    }
    fjg_graph_destroy(gi);
    fjg_graph_destroy(gf);
  }
  /* On traced indices inside a mask. */
  fjg_graph *g = trace_ok(
      "return { mask_mod = function(b, h, q, kv)\n"
      "  return eq((q - kv) // 3, -1) | eq((kv - q) % 4, 3) end }",
      NULL);
  fjg_env env = sizes_env(8, 8);
  for (int q = 0; q < 8; q++)
    for (int kv = 0; kv < 8; kv++) {
      char setup[64];
      snprintf(setup, sizeof setup, "local q, kv = %d, %d", q, kv);
      double want = lua_value(L, setup,
                              "(((q - kv) // 3 == -1) or ((kv - q) % 4 == 3)) "
                              "and 1 or 0");
      assert_int_equal(fjg_eval_mask(g, &env, 0, 0, q, kv), (int)want);
    }
  fjg_graph_destroy(g);
  lua_close(L);
}

static void test_constants_and_types(void **state) {
  (void)state;
  /* Integers are i32 constants, floats f32, booleans bool. */
  fjg_graph *g = trace_ok(
      "return { mask_mod = function(b, h, q, kv) return true end,\n"
      "         score_mod = function(s, b, h, q, kv) return 7 end }",
      NULL);
  const fjg_node *m = fjg_node_at(g, fjg_mask_root(g));
  assert_int_equal(m->op, FJG_OP_CONST);
  assert_int_equal(m->type, FJG_BOOL);
  assert_int_equal(m->imm.i, 1);
  fjg_env env = sizes_env(2, 2);
  assert_near(fjg_eval_score(g, &env, 3.0, 0, 0, 0, 0), 7.0, 0);
  fjg_graph_destroy(g);

  g = trace_ok("return { score_mod = function(s, b, h, q, kv)\n"
               "  return where(lt(q, 2), q + 1, q * 2.5) end }",
               NULL);
  assert_near(fjg_eval_score(g, &env, 0, 0, 0, 1, 0), 2.0, 0);
  assert_near(fjg_eval_score(g, &env, 0, 0, 0, 3, 0), 7.5, 1e-6);
  fjg_graph_destroy(g);

  /* A plain false mask: every pair masked. */
  g = trace_ok("return { mask_mod = function() return false end }", NULL);
  assert_int_equal(fjg_eval_mask(g, &env, 0, 0, 1, 1), 0);
  fjg_graph_destroy(g);
}

static void test_math_functions(void **state) {
  (void)state;
  fjg_graph *g = trace_ok(
      "return { score_mod = function(s, b, h, q, kv)\n"
      "  return exp(s) + exp2(q) + log(s + 2) + log2(kv + 1) + sqrt(s * s)\n"
      "       + tanh(s) + floor(s) + ceil(s) end }",
      NULL);
  fjg_env env = sizes_env(4, 4);
  double s = 0.75;
  for (int q = 0; q < 4; q++) {
    double want = exp(s) + exp2(q) + log(s + 2) + log2(2 + 1) + sqrt(s * s) +
                  tanh(s) + floor(s) + ceil(s);
    assert_near(fjg_eval_score(g, &env, s, 0, 0, q, 2), want, 1e-4);
  }
  fjg_graph_destroy(g);
}

static void test_logical_operators(void **state) {
  (void)state;
  fjg_graph *g = trace_ok(
      "return { mask_mod = function(b, h, q, kv)\n"
      "  local a, c = ge(q, kv), eq(q % 2, 0)\n"
      "  return (a & ~c) | (~a ~ c) | logical_and(ne(q, q), true) end }",
      NULL);
  fjg_env env = sizes_env(5, 5);
  for (int q = 0; q < 5; q++)
    for (int kv = 0; kv < 5; kv++) {
      int a = q >= kv, c = q % 2 == 0;
      assert_int_equal(fjg_eval_mask(g, &env, 0, 0, q, kv),
                       (a && !c) || ((!a) != c));
    }
  fjg_graph_destroy(g);
}

static void test_params_buffers_sizes(void **state) {
  (void)state;
  char *name = NULL;
  fjg_graph *g = trace_ok(
      "local w = param('window', 'i32')\n"
      "local doc = buffer('doc', 'i32')\n"
      "local scale = param('scale', 'f32')\n"
      "return { name = 'mine',\n"
      "  mask_mod = function(b, h, q, kv)\n"
      "    return eq(doc[q], doc[kv]) & lt(q - kv, w) & ge(q + (Lk - Lq), kv) "
      "end,\n"
      "  score_mod = function(s, b, h, q, kv) return s * scale + Hq - Hkv + B "
      "end }",
      &name);
  assert_string_equal(name, "mine");
  free(name);
  assert_int_equal(fjg_num_args(g), 3);
  assert_string_equal(fjg_arg_at(g, 0)->name, "window");
  assert_int_equal(fjg_arg_at(g, 0)->kind, FJ_ARG_I32);
  assert_string_equal(fjg_arg_at(g, 1)->name, "doc");
  assert_int_equal(fjg_arg_at(g, 1)->kind, FJ_ARG_BUFFER);
  assert_int_equal(fjg_arg_at(g, 1)->type, FJG_I32);
  assert_int_equal(fjg_arg_at(g, 2)->kind, FJ_ARG_F32);

  int32_t pi[3] = {3, 0, 0};
  float pf[3] = {0, 0, 0.5f};
  int32_t docs[8] = {0, 0, 0, 1, 1, 1, 1, 2};
  const void *bufs[3] = {NULL, docs, NULL};
  int64_t lens[3] = {0, 8, 0};
  fjg_env env = sizes_env(6, 8);
  env.param_i32 = pi;
  env.param_f32 = pf;
  env.buffer_data = bufs;
  env.buffer_len = lens;
  for (int q = 0; q < 6; q++)
    for (int kv = 0; kv < 8; kv++) {
      int want = docs[q] == docs[kv] && q - kv < 3 && q + 2 >= kv;
      assert_int_equal(fjg_eval_mask(g, &env, 0, 0, q, kv), want);
    }
  assert_near(fjg_eval_score(g, &env, 2.0, 0, 0, 0, 0),
                      2.0 * 0.5 + 4 - 2 + 2, 1e-6);
  fjg_graph_destroy(g);
}

/* buffer(name, "f32", {grad = true}) marks a buffer trainable; the spec
 * comes with the derivative of its score_mod, with a gradient for each
 * read of a trainable buffer and none for the others, the mask's included. */
static void test_trainable_buffers(void **state) {
  (void)state;
  fjg_graph *g = trace_ok(
      "local rel = buffer('rel', 'f32', {grad = true})\n"
      "local slopes = buffer('slopes', 'f32', {grad = false})\n"
      "local gate = buffer('gate', 'f32', {grad = true})\n"
      "local again = buffer('rel', 'f32', {grad = true})\n"
      "return {\n"
      "  mask_mod = function(b, h, q, kv) return gt(gate[kv], 0.0) end,\n"
      "  score_mod = function(s, b, h, q, kv)\n"
      "    return s * slopes[h] + again[q - kv + 8] * rel[h]\n"
      "  end }",
      NULL);
  assert_int_equal(fjg_num_args(g), 3);
  assert_int_equal(fjg_arg_at(g, 0)->trainable, 1);
  assert_int_equal(fjg_arg_at(g, 1)->trainable, 0);
  assert_int_equal(fjg_arg_at(g, 2)->trainable, 1);
  assert_int_equal(fjg_trainable_args(g), 5);
  const fjg_derivative *d = fjg_graph_derivative(g);
  assert_non_null(d);
  assert_int_equal(d->num_buffer_grads, 2); /* rel twice, gate never */
  for (int i = 0; i < d->num_buffer_grads; i++)
    assert_int_equal(d->buffer_grads[i].buffer, 0);
  /* d/ds = slopes[h] = 0.5 here; d/d rel[q - kv + 8] = rel[h]. */
  float rel[16], slopes[4] = {0.5f, 0.5f, 0.5f, 0.5f}, gate[16];
  for (int i = 0; i < 16; i++) rel[i] = 0.25f * (float)i, gate[i] = 1.0f;
  const void *bufs[3] = {rel, slopes, gate};
  int64_t lens[3] = {16, 4, 16};
  fjg_env env = sizes_env(8, 8);
  env.buffer_data = bufs;
  env.buffer_len = lens;
  const int saved = fjg_score_root(g);
  assert_int_equal(fjg_set_score_root(g, d->dscore), 0);
  assert_near(fjg_eval_score(g, &env, 1.0, 0, 2, 5, 3), 0.5, 0);
  for (int i = 0; i < d->num_buffer_grads; i++) {
    assert_int_equal(fjg_set_score_root(g, d->buffer_grads[i].grad), 0);
    double grad = fjg_eval_score(g, &env, 1.0, 0, 2, 5, 3);
    /* rel[h] = rel[2] for the read at q - kv + 8 = 10, rel[10] for the
     * read at h = 2 */
    assert_true(grad == 0.5 || grad == 2.5);
  }
  assert_int_equal(fjg_set_score_root(g, saved), 0);
  fjg_graph_destroy(g);

  /* Without a score_mod there is no derivative; the prelude's builders
   * take trainable buffers like any other. */
  g = trace_ok("local d = buffer('d', 'f32', {grad = true})\n"
               "return { mask_mod = causal() }", NULL);
  assert_null(fjg_graph_derivative(g));
  assert_int_equal(fjg_trainable_args(g), 1);
  fjg_graph_destroy(g);
  g = trace_ok("local bias = buffer('bias', 'f32', {grad = true})\n"
               "return { mask_mod = causal(), score_mod = relative_bias(bias) }",
               NULL);
  d = fjg_graph_derivative(g);
  assert_non_null(d);
  assert_int_equal(d->num_buffer_grads, 1);
  const fjg_node *one = fjg_node_at(g, d->buffer_grads[0].grad);
  assert_int_equal(one->op, FJG_OP_CONST);
  assert_true(one->imm.f == 1.0f);
  fjg_graph_destroy(g);
}

static int serialize_equal(const char *a, const char *b) {
  fjg_graph *ga = trace_ok(a, NULL), *gb = trace_ok(b, NULL);
  fjg_buf ba, bb;
  fjg_buf_init(&ba);
  fjg_buf_init(&bb);
  assert_int_equal(fjg_serialize(ga, &ba), FJ_OK);
  assert_int_equal(fjg_serialize(gb, &bb), FJ_OK);
  int same = ba.len == bb.len && memcmp(ba.data, bb.data, ba.len) == 0;
  fjg_buf_free(&ba);
  fjg_buf_free(&bb);
  fjg_graph_destroy(ga);
  fjg_graph_destroy(gb);
  return same;
}

static void test_canonical_bytes(void **state) {
  (void)state;
  const char *a =
      "local window = param('window', 'i32')\n"
      "return {\n"
      "  mask_mod = function(b, h, q, kv)\n"
      "    return ge(q, kv) & lt(q - kv, window)\n"
      "  end,\n"
      "  score_mod = function(score, b, h, q, kv) return score * 0.5 end,\n"
      "}\n";
  const char *b =
      "-- same function, other spelling\n"
      "local   W=param( \"window\",\"i32\" )\n"
      "local function m(bb,hh,qi,ki)\n"
      "  local d=qi-ki\n"
      "  return ge(qi,ki)&lt(d,W)\n"
      "end\n"
      "local function s(x,...) return x*0.5 end\n"
      "return {score_mod=s,mask_mod=m}";
  const char *c = /* a different constant */
      "local window = param('window', 'i32')\n"
      "return {\n"
      "  mask_mod = function(b, h, q, kv)\n"
      "    return ge(q, kv) & lt(q - kv, window)\n"
      "  end,\n"
      "  score_mod = function(score, b, h, q, kv) return score * 0.25 end,\n"
      "}\n";
  assert_true(serialize_equal(a, b));
  assert_false(serialize_equal(a, c));
  /* The prelude's combinators give the same graph as writing it out. */
  assert_true(serialize_equal(
      "return { mask_mod = and_masks(causal(), prefix_lm(4)) }",
      "return { mask_mod = function(b, h, q, kv)\n"
      "  return ge(q, kv) & (ge(q, kv) | lt(kv, 4)) end }"));
  assert_false(serialize_equal("return { mask_mod = sliding_window(4) }",
                               "return { mask_mod = sliding_window(5) }"));
}

static void test_traced_value_tostring(void **state) {
  (void)state;
  fjg_graph *g = NULL;
  char err[512];
  const char *src = "return { mask_mod = function(b, h, q, kv)\n"
                    "  error('got ' .. tostring(q) .. ' and ' .. "
                    "tostring(lt(q, kv))) end }";
  assert_int_equal(fjl_trace_spec(src, strlen(src), "spec.lua", &g, NULL, err,
                                  sizeof err),
                   FJ_ELUA);
  assert_non_null(strstr(err, "spec.lua:2: got traced i32 node"));
  assert_non_null(strstr(err, "and traced bool node"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_arithmetic_matches_lua),
      cmocka_unit_test(test_floor_div_and_mod_match_lua),
      cmocka_unit_test(test_constants_and_types),
      cmocka_unit_test(test_math_functions),
      cmocka_unit_test(test_logical_operators),
      cmocka_unit_test(test_params_buffers_sizes),
      cmocka_unit_test(test_trainable_buffers),
      cmocka_unit_test(test_canonical_bytes),
      cmocka_unit_test(test_traced_value_tostring),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
