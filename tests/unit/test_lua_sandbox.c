/* tests/unit/test_lua_sandbox.c: what a spec can reach (base, string, table,
 * math only) and the limits that make a bad spec an error, never a hang or
 * a crash of the host. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "lua/spec.h"

static fj_status trace_with(const char *src, const fjl_limits *limits,
                            char *err, size_t errlen) {
  fjg_graph *g = NULL;
  fj_status st = fjl_trace_spec_ex(src, strlen(src), "spec.lua", limits, &g,
                                   NULL, err, errlen);
  fjg_graph_destroy(g);
  return st;
}

static void expect_error(const char *src, const char *where, const char *text) {
  char err[1024] = "";
  fj_status st = trace_with(src, NULL, err, sizeof err);
  if (st != FJ_ELUA)
    fail_msg("expected FJ_ELUA, got %d (%s) for:\n%s", st, err, src);
  if (strncmp(err, where, strlen(where)) != 0)
    fail_msg("message does not start with '%s': %s", where, err);
  if (!strstr(err, text))
    fail_msg("message lacks '%s': %s", text, err);
}

/* A chunk that asserts something about its environment and still returns a
 * valid spec. */
static void expect_true(const char *cond) {
  char src[512];
  snprintf(src, sizeof src,
           "if not (%s) then error(\"sandbox check failed: %s\") end\n"
           "return { mask_mod = causal() }",
           cond, cond);
  char err[1024] = "";
  fj_status st = trace_with(src, NULL, err, sizeof err);
  if (st != FJ_OK)
    fail_msg("%s", err);
}

static void test_no_host_access(void **state) {
  (void)state;
  const char *absent[] = {"io", "os", "require", "debug", "package", "dofile",
                          "loadfile", "load", "loadstring", "collectgarbage",
                          "print", "pcall", "xpcall", "coroutine", "utf8",
                          "warn", "string.dump", "string.find", "string.gsub",
                          "string.match", "string.gmatch"};
  for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
    char cond[128];
    snprintf(cond, sizeof cond, "%s == nil", absent[i]);
    expect_true(cond);
  }
  expect_error("local f = io.open(\"/etc/passwd\")", "spec.lua:1:",
               "attempt to index a nil value (global 'io')");
  expect_error("os.exit(1)", "spec.lua:1:", "global 'os'");
  expect_error("\nrequire(\"socket\")", "spec.lua:2:",
               "attempt to call a nil value (global 'require')");
  expect_error("debug.sethook()", "spec.lua:1:", "global 'debug'");
}

static void test_what_remains(void **state) {
  (void)state;
  expect_true("math.floor(2.5) == 2 and math.type(1) == 'integer'");
  expect_true("string.rep('ab', 2) == 'abab' and ('x'):upper() == 'X'");
  expect_true("table.concat({1, 2}, ',') == '1,2' and select('#', 1, 2) == 2");
  expect_true("type(tostring) == 'function' and type(setmetatable) == "
              "'function' and type(ipairs) == 'function'");
}

static void test_traced_values_are_locked(void **state) {
  (void)state;
  expect_true("getmetatable(Lq) == 'traced value'");
  expect_true("getmetatable(buffer('doc', 'i32')) == 'buffer'");
  expect_true("tostring(Lq):sub(1, 16) == 'traced i32 node '");
  expect_error("setmetatable(Lq, {})", "spec.lua:1:", "bad argument #1");
}

static void test_instruction_limit(void **state) {
  (void)state;
  clock_t t0 = clock();
  expect_error("local x = 0\nwhile true do\n  x = x + 1\nend\n", "spec.lua:",
               "instruction limit exceeded");
  double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  assert_true(secs < 10.0);
  /* Inside a mod too, and with a smaller budget. */
  fjl_limits lim;
  fjl_limits_default(&lim);
  lim.instructions = 100000;
  char err[512];
  const char *src = "return { mask_mod = function(b, h, q, kv)\n"
                    "  repeat until false\nend }";
  assert_int_equal(trace_with(src, &lim, err, sizeof err), FJ_ELUA);
  assert_non_null(strstr(err, "spec.lua:2: instruction limit exceeded"));
  /* A recursion that never ends is a stack overflow error, not a crash. */
  expect_error("local function f(n) return f(n + 1) + 1 end\nf(1)",
               "spec.lua:1:", "stack overflow");
}

static void test_memory_limit(void **state) {
  (void)state;
  expect_error("local t = {}\nfor i = 1, 1e9 do\n"
               "  t[i] = string.rep('x', 64) .. i\nend",
               "spec.lua:", "memory limit exceeded (64 MiB)");
  expect_error("local s = string.rep('x', 1 << 30)", "spec.lua",
               "memory limit exceeded");
  fjl_limits lim;
  fjl_limits_default(&lim);
  lim.memory_bytes = (size_t)2 << 20;
  char err[512];
  const char *src = "local parts = {}\nfor i = 1, 1e7 do\n"
                    "  parts[#parts + 1] = {i}\nend";
  assert_int_equal(trace_with(src, &lim, err, sizeof err), FJ_ELUA);
  assert_non_null(strstr(err, "memory limit exceeded (2 MiB)"));
}

static void test_spec_table_metamethods_are_ignored(void **state) {
  (void)state;
  /* The spec table is read raw: an __index cannot smuggle code in. */
  expect_error("return setmetatable({}, { __index = function() "
               "while true do end end })",
               "spec.lua:", "has neither");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_host_access),
      cmocka_unit_test(test_what_remains),
      cmocka_unit_test(test_traced_values_are_locked),
      cmocka_unit_test(test_instruction_limit),
      cmocka_unit_test(test_memory_limit),
      cmocka_unit_test(test_spec_table_metamethods_are_ignored),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
