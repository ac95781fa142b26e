/* tests/unit/test_lua_limits.c: a spec cannot make loading, emitting or
 * compiling take unbounded time or memory. Constant chains fold; graph
 * size, mod size and the number of params and buffers are limited with
 * errors that name the limit and the spec line; the bytecode check does
 * bounded work; finalizers cannot escape the instruction limit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "gen/graph.h"
#include "gen/interval.h"
#include "lua/spec.h"

static fjg_graph *trace_ok(const char *src) {
  fjg_graph *g = NULL;
  char err[1024] = "";
  fj_status st =
      fjl_trace_spec(src, strlen(src), "spec.lua", &g, NULL, err, sizeof err);
  if (st != FJ_OK)
    fail_msg("trace failed (%d): %s", st, err);
  return g;
}

static void expect_error(const char *src, const char *where, const char *text) {
  fjg_graph *g = NULL;
  char err[1024] = "";
  fj_status st =
      fjl_trace_spec(src, strlen(src), "spec.lua", &g, NULL, err, sizeof err);
  if (st != FJ_ELUA)
    fail_msg("expected FJ_ELUA, got %d (%s)", st, err);
  assert_null(g);
  if (strncmp(err, where, strlen(where)) != 0)
    fail_msg("message does not start with '%s': %s", where, err);
  if (!strstr(err, text))
    fail_msg("message lacks '%s': %s", text, err);
}

static double cpu_seconds(clock_t since) {
  return (double)(clock() - since) / CLOCKS_PER_SEC;
}

/* Nodes the mask root depends on. */
static int mask_nodes(const fjg_graph *g) {
  int count = 0;
  fjg_reachable(g, 0, &count);
  return count;
}

static void test_constant_chains_fold(void **state) {
  (void)state;
  /* The hostile loop: 10^5 additions of a constant to q. */
  fjg_graph *g = trace_ok(
      "return { mask_mod = function(b, h, q, kv)\n"
      "  local x = q\n"
      "  for i = 1, 100000 do x = x + 1 end\n"
      "  return lt(x, kv)\nend }");
  assert_true(mask_nodes(g) <= 5); /* q, 100000, q + 100000, kv, lt */
  fjg_env env;
  memset(&env, 0, sizeof env);
  assert_int_equal(fjg_eval_mask(g, &env, 0, 0, 0, 100001), 1);
  assert_int_equal(fjg_eval_mask(g, &env, 0, 0, 0, 100000), 0);
  /* Wrapping arithmetic: past INT32_MAX the sum wraps, like the kernel. */
  assert_int_equal(fjg_eval_mask(g, &env, 0, 0, INT32_MAX - 5, 0), 1);
  fjg_graph_destroy(g);
  /* Sub, mul and constants on the left fold too. */
  g = trace_ok("return { mask_mod = function(b, h, q, kv)\n"
               "  local x = q\n"
               "  for i = 1, 50000 do x = 3 - (x * 1 - 2) end\n"
               "  return lt(x, kv)\nend }");
  assert_true(mask_nodes(g) <= 6);
  fjg_graph_destroy(g);
}

static void test_float_chains_hit_the_mod_limit(void **state) {
  (void)state;
  /* Floats are not reassociated: the chain is refused, quickly, at the
   * mod's line, naming the limit. */
  clock_t t0 = clock();
  expect_error("local k = 0.5\n"
               "return { score_mod = function(s, b, h, q, kv)\n"
               "  for i = 1, 100000 do s = s * 0.999 + k end\n"
               "  return s\nend }",
               "spec.lua:2:", "more than the limit of 1024 (FJG_MAX_MOD_NODES)");
  assert_true(cpu_seconds(t0) < 10.0);
}

static void test_graph_node_limit(void **state) {
  (void)state;
  /* Distinct nodes that are never used still take memory: the graph stops
   * at FJG_MAX_NODES, at the line that asked for one more. */
  expect_error("local x\nfor i = 1, 2000000 do\n  x = lt(Lq, i)\nend\n"
               "return { mask_mod = causal() }",
               "spec.lua:3:", "more than 1048576 nodes (the limit, "
               "FJG_MAX_NODES)");
}

static void test_param_and_buffer_limit(void **state) {
  (void)state;
  /* 64 is what a launch takes: 5,000 params stop at the 65th. */
  expect_error("local s = 0\nfor i = 1, 5000 do\n"
               "  s = s + param(\"p\" .. i, \"i32\")\nend\n"
               "return { mask_mod = function(b, h, q, kv) return lt(q, s) end }",
               "spec.lua:3:", "cannot declare param 'p65': a spec has at "
               "most 64 params and buffers together (FJG_MAX_ARGS");
  expect_error("local bufs = {}\nfor i = 1, 300 do\n"
               "  bufs[i] = buffer(\"b\" .. i, \"i32\")\nend",
               "spec.lua:3:", "cannot declare buffer 'b65'");
  expect_error("for i = 1, 40 do param(\"p\" .. i, \"f32\") end\n"
               "for i = 1, 40 do buffer(\"b\" .. i, \"f32\") end",
               "spec.lua:2:", "FJG_MAX_ARGS");
  /* Exactly 64, redeclared as often as wanted, is fine. */
  fjg_graph *g = trace_ok(
      "local s = 0\nfor r = 1, 3 do for i = 1, 64 do\n"
      "  s = s + param(\"p\" .. i, \"i32\")\nend end\n"
      "return { mask_mod = function(b, h, q, kv) return lt(q, s) end }");
  assert_int_equal(fjg_num_args(g), FJG_MAX_ARGS);
  fjg_graph_destroy(g);
}

/* A mod that reads a big captured table many times: the check looks
 * through the table once, not once per read and per sweep. */
static void test_check_reads_big_tables_once(void **state) {
  (void)state;
  enum { READS = 200 };
  size_t cap = READS * 48 + 512;
  char *src = malloc(cap);
  assert_non_null(src);
  int n = snprintf(src, cap,
                   "G = {}\nfor i = 1, 1000 do local t = {}\n"
                   "  for j = 1, 1000 do t[j] = j end G[i] = t end\n"
                   "return { mask_mod = function(b, h, q, kv)\n"
                   "  local m = lt(q, kv)\n");
  for (int i = 0; i < READS; i++)
    n += snprintf(src + n, cap - n, "  m = m & lt(G[%d][1], kv)\n", i + 1);
  snprintf(src + n, cap - n, "  return m\nend }\n");
  clock_t t0 = clock();
  fjg_graph_destroy(trace_ok(src));
  double secs = cpu_seconds(t0);
  if (secs > 3.0)
    fail_msg("tracing took %.1f s of CPU", secs);
  free(src);
}

/* Many closures of one large function: each is checked, but the total
 * work is bounded and the error names the function. */
static void test_check_work_is_bounded(void **state) {
  (void)state;
  enum { LINES = 1500 };
  size_t cap = LINES * 32 + 512;
  char *src = malloc(cap);
  assert_non_null(src);
  int n = snprintf(src, cap, "local fs = {}\nlocal function make()\n"
                   "  return function(x)\n    local y = x\n");
  for (int i = 0; i < LINES; i++)
    n += snprintf(src + n, cap - n, "    y = y + %d * x\n", i);
  snprintf(src + n, cap - n,
           "    return y\n  end\nend\nfor i = 1, 4000 do fs[i] = make() end\n"
           "return { mask_mod = function(b, h, q, kv)\n"
           "  return lt(fs[1](q), kv) end }\n");
  clock_t t0 = clock();
  expect_error(src, "spec.lua:3:", "cannot check this function: it takes "
               "more than 20 million steps of analysis (CHECK_MAX_STEPS)");
  assert_true(cpu_seconds(t0) < 10.0);
  free(src);
}

/* Lua runs __gc finalizers with hooks off: a looping one would hang the
 * host at the next collection or at lua_close. */
static void test_finalizers_are_refused(void **state) {
  (void)state;
  expect_error("\nsetmetatable({}, {__gc = function() while true do end "
               "end})\nreturn { mask_mod = causal() }",
               "spec.lua:2:", "__gc metamethods are not allowed");
  expect_error("local mt = {__gc = false}\nlocal t = setmetatable({}, mt)",
               "spec.lua:2:", "__gc");
  /* Added after setmetatable, __gc is never called (Lua's rule): fine. */
  fjg_graph_destroy(trace_ok(
      "local mt = {}\nlocal t = setmetatable({}, mt)\n"
      "mt.__gc = function() while true do end end\n"
      "return { mask_mod = causal() }"));
  /* A __close that loops is still under the instruction limit. */
  expect_error("local x <close> = setmetatable({}, {__close = function()\n"
               "  while true do end end})\nreturn { mask_mod = causal() }",
               "spec.lua:2:", "instruction limit exceeded");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_constant_chains_fold),
      cmocka_unit_test(test_float_chains_hit_the_mod_limit),
      cmocka_unit_test(test_graph_node_limit),
      cmocka_unit_test(test_param_and_buffer_limit),
      cmocka_unit_test(test_check_reads_big_tables_once),
      cmocka_unit_test(test_check_work_is_bounded),
      cmocka_unit_test(test_finalizers_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
