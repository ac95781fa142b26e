/* tests/unit/test_lua_errors.c: every way a spec can be wrong fails with
 * FJ_ELUA, the spec's "file:line:" and the helper to use instead. Most of
 * these would otherwise trace silently into a different function. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lua/spec.h"

/* Traces src as "spec.lua"; asserts it fails with FJ_ELUA, that the
 * message starts with `where` and contains `text`. */
static void expect_error(const char *src, const char *where, const char *text) {
  fjg_graph *g = NULL;
  char *name = NULL;
  char err[1024] = "";
  fj_status st = fjl_trace_spec(src, strlen(src), "spec.lua", &g, &name, err,
                                sizeof err);
  if (st != FJ_ELUA)
    fail_msg("expected FJ_ELUA, got %d (%s) for:\n%s", st, err, src);
  assert_null(g);
  assert_null(name);
  if (strncmp(err, where, strlen(where)) != 0)
    fail_msg("message does not start with '%s': %s", where, err);
  if (!strstr(err, text))
    fail_msg("message lacks '%s': %s", text, err);
}

static void expect_ok(const char *src) {
  fjg_graph *g = NULL;
  char err[1024] = "";
  fj_status st =
      fjl_trace_spec(src, strlen(src), "spec.lua", &g, NULL, err, sizeof err);
  if (st != FJ_OK)
    fail_msg("expected success, got %d: %s\n%s", st, err, src);
  fjg_graph_destroy(g);
}

static void test_less_than(void **state) {
  (void)state;
  expect_error("return {\n"
               "  mask_mod = function(b, h, q, kv)\n"
               "    return q < kv\n"
               "  end,\n"
               "}\n",
               "spec.lua:3:", "use lt(a, b)");
  expect_error("return { mask_mod = function(b, h, q, kv)\n return q > 3 end }",
               "spec.lua:2:", "use lt(a, b) or gt(a, b)");
}

static void test_less_equal(void **state) {
  (void)state;
  expect_error("local x = 1\nreturn { mask_mod = function(b, h, q, kv)\n"
               "  return q <= kv\nend }",
               "spec.lua:3:", "use le(a, b)");
  expect_error("return { mask_mod = function(b, h, q, kv)\n return 4 <= kv end }",
               "spec.lua:2:", "use le(a, b) or ge(a, b)");
}

static void test_equal_to_number(void **state) {
  (void)state;
  /* Lua never calls __eq for userdata == number: silently false. */
  expect_error("return { mask_mod = function(b, h, q, kv)\n\n return q == 5 end }",
               "spec.lua:3:", "use eq(a, b)");
  expect_error("return { mask_mod = function(b, h, q, kv)\n return q ~= kv end }",
               "spec.lua:2:", "ne(a, b)");
  /* EQK: against a string or a float constant. */
  expect_error("return { mask_mod = function(b, h, q, kv)\n return q == 'a' end }",
               "spec.lua:2:", "use eq(a, b)");
  expect_error("return { mask_mod = function(b, h, q, kv)\n\n"
               " return eq(q, 1) == 2.5 end }",
               "spec.lua:3:", "use eq(a, b)");
}

static void test_if_on_traced(void **state) {
  (void)state;
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  if q then\n    return true\n  end\n  return false\nend }",
               "spec.lua:2:", "'if'/'and'/'or' on a traced value");
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  while kv do end return true end }",
               "spec.lua:2:", "use where(c, a, b)");
}

static void test_and_or_not(void **state) {
  (void)state;
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  return q and kv\nend }",
               "spec.lua:2:", "& | ~");
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  local m = ge(q, kv)\n  return not m\nend }",
               "spec.lua:3:", "use ~x");
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  local a, c = ge(q, kv), le(q, 4)\n\n  return a or c\nend }",
               "spec.lua:4:", "and_masks/or_masks");
}

static void test_misuse_in_functions_the_mod_reaches(void **state) {
  (void)state;
  /* A closure handed to a prelude combinator. */
  expect_error("local m = function(b, h, q, kv)\n  if q then return true end\n"
               "  return false\nend\nreturn { mask_mod = and_masks(causal(), m) }",
               "spec.lua:2:", "'if'/'and'/'or'");
  /* A local helper reached through an upvalue. */
  expect_error("local function pos(x) return x > 0 end\n"
               "return { mask_mod = function(b, h, q, kv) return pos(q) end }",
               "spec.lua:1:", "use lt(a, b) or gt(a, b)");
  /* A global helper. */
  expect_error("function flip(m)\n  return not m\nend\n"
               "return { mask_mod = function(b, h, q, kv)\n"
               "  return flip(ge(q, kv))\nend }",
               "spec.lua:2:", "use ~x");
  /* A nested closure inside the mod. */
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  local f = function(x) return x == 1 end\n"
               "  return f(q)\nend }",
               "spec.lua:2:", "use eq(a, b)");
  /* A traced value held in an upvalue table, and in a global. */
  expect_error("local cfg = { w = param(\"w\", \"i32\") }\n"
               "return { mask_mod = function(b, h, q, kv)\n"
               "  if cfg.w then return true end return false end }",
               "spec.lua:3:", "'if'/'and'/'or'");
  expect_error("W = param(\"w\", \"i32\")\n"
               "return { mask_mod = function(b, h, q, kv)\n  return W > 3 end }",
               "spec.lua:3:", "gt(a, b)");
  /* Stored into a variable by a nested closure, tested afterwards. */
  expect_error("return { mask_mod = function(b, h, q, kv)\n  local x = 1\n"
               "  local function set() x = q end\n  set()\n"
               "  if x == 2 then end\n  return true\nend }",
               "spec.lua:5:", "use eq(a, b)");
}

static void test_plain_control_flow_is_fine(void **state) {
  (void)state;
  /* Conditions on plain Lua values inside a mod are not traced: allowed. */
  expect_ok("local n = 3\nreturn { mask_mod = function(b, h, q, kv)\n"
            "  local m = ge(q, kv)\n"
            "  for i = 1, n do\n"
            "    if i % 2 == 0 and i > 1 then m = m & lt(q - kv, i * 10) end\n"
            "  end\n"
            "  local k = 0\n  while k < 3 do k = k + 1 end\n"
            "  if n > 2 then m = m | eq(q, 0) end\n"
            "  return m\nend }");
  expect_ok("local opts = { window = 8, causal = true }\n"
            "return { mask_mod = function(b, h, q, kv)\n"
            "  local w = opts.window or 4\n"
            "  if opts.causal then return ge(q, kv) & lt(q - kv, w) end\n"
            "  return lt(abs(q - kv), w)\nend }");
}

static void test_runtime_metamethod_errors(void **state) {
  (void)state;
  /* Outside a mod (at chunk level) the metamethods still catch these. */
  expect_error("local w = param(\"w\", \"i32\")\nlocal big = w < 4\n",
               "spec.lua:2:", "use lt(a, b)");
  expect_error("return { score_mod = function(s, b, h, q, kv)\n"
               "  return s ^ 2 end }",
               "spec.lua:2:", "use exp(b * log(a))");
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  return q.x end }",
               "spec.lua:2:", "indexing a traced value");
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  return q .. \"x\" end }",
               "spec.lua:2:", "'..' on a traced value");
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  return q & kv end }",
               "spec.lua:2:", "'&' combines booleans");
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  return ge(q + 3000000000, kv) end }",
               "spec.lua:2:", "integer constant 3000000000 does not fit in i32");
  expect_error("local t = {1, 2}\nreturn { mask_mod = function(b, h, q, kv)\n"
               "  return ge(t[q], 1) end }",
               "spec.lua:3:", "declare the table with buffer(name, dtype)");
  expect_error("local d = buffer(\"doc\", \"i32\")\n"
               "return { mask_mod = function(b, h, q, kv)\n"
               "  return eq(d[q * 0.5], 1) end }",
               "spec.lua:3:", "buffer 'doc' must be indexed with an i32");
  expect_error("local p = param(\"p\", \"i64\")", "spec.lua:1:",
               "the type must be \"i32\" or \"f32\"");
}

static void test_syntax_and_runtime_errors(void **state) {
  (void)state;
  expect_error("return {\n  mask_mod = function(b, h, q, kv)\n"
               "    return q +\n  end\n}",
               "spec.lua:4:", "unexpected symbol near 'end'");
  expect_error("local x = nil\nlocal y = x.field\n", "spec.lua:2:",
               "attempt to index a nil value");
  expect_error("error(\"custom failure\")", "spec.lua:1:", "custom failure");
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  return ge(nil, kv) end }",
               "spec.lua:2:", "expected a traced value, a number or a boolean");
}

static void test_wrong_return_types(void **state) {
  (void)state;
  expect_error("return {\n  mask_mod = function(b, h, q, kv)\n"
               "    return 1\n  end }",
               "spec.lua:2:", "mask_mod must return a boolean (got number)");
  expect_error("return { mask_mod = function(b, h, q, kv) return q + 1 end }",
               "spec.lua:1:", "mask_mod must return a boolean (got traced i32)");
  expect_error("return {\n score_mod = function(s, b, h, q, kv)\n"
               "  return lt(s, 1) end }",
               "spec.lua:2:", "score_mod must return a number (got traced bool)");
  expect_error("return { score_mod = function(s, b, h, q, kv) return \"x\" end }",
               "spec.lua:1:", "score_mod must return a number (got string)");
}

static void test_missing_table(void **state) {
  (void)state;
  expect_error("local x = 1\n", "spec.lua:",
               "the chunk must return a table with mask_mod and/or score_mod");
  expect_error("return 5", "spec.lua:", "(got number)");
  expect_error("return { name = \"x\" }", "spec.lua:", "has neither");
  expect_error("return { mask_mod = 3 }", "spec.lua:",
               "mask_mod must be a function (got number)");
  expect_error("return { mask_mod = causal(), name = 7 }", "spec.lua:",
               "name must be a string");
}

static void test_bytecode_rejected(void **state) {
  (void)state;
  static const char chunk[] = "\x1bLua\x54\x00\x19\x93\r\n\x1a\n";
  fjg_graph *g = NULL;
  char err[512];
  fj_status st = fjl_trace_spec(chunk, sizeof chunk - 1, "spec.luac", &g, NULL,
                                err, sizeof err);
  assert_int_equal(st, FJ_ELUA);
  assert_non_null(strstr(err, "spec.luac: precompiled Lua bytecode is not "
                              "accepted"));
}

static void test_prelude_errors_name_the_spec_line(void **state) {
  (void)state;
  expect_error("local x = 1\nreturn { mask_mod = causal{align = \"left\"} }",
               "spec.lua:2:", "causal: align must be");
  expect_error("\n\nreturn { mask_mod = sliding_window(-3) }", "spec.lua:3:",
               "sliding_window: the window must be a positive number");
  expect_error("return { mask_mod = and_masks(causal(), 4) }", "spec.lua:1:",
               "and_masks: argument 2 must be a mask_mod");
  expect_error("return { mask_mod = document(3) }", "spec.lua:1:",
               "document: doc must be a buffer");
}

static void test_chunk_name_forms(void **state) {
  (void)state;
  const char *src = "return { mask_mod = function(b, h, q, kv)\n"
                    "  return q < kv end }";
  const char *names[] = {"dir/my spec.lua", "@dir/my spec.lua"};
  for (int i = 0; i < 2; i++) {
    fjg_graph *g = NULL;
    char err[512];
    assert_int_equal(fjl_trace_spec(src, strlen(src), names[i], &g, NULL, err,
                                    sizeof err),
                     FJ_ELUA);
    assert_int_equal(strncmp(err, "dir/my spec.lua:2:", 18), 0);
  }
}

/* Every error names chunk:line, also those that come from Lua without a
 * position: non-string error values, error(msg, 0), "C stack overflow"
 * raised inside a C function or the parser, a value the mod returns. */
static void test_errors_without_a_position_get_one(void **state) {
  (void)state;
  expect_error("local x = 1\nerror({})", "spec.lua:2:",
               "error object is a table value");
  expect_error("return { mask_mod = function(b, h, q, kv)\n"
               "  error(nil) end }",
               "spec.lua:2:", "error object is a nil value");
  expect_error("\nerror(\"plain\", 0)", "spec.lua:2: plain", "plain");
  expect_error("error(setmetatable({}, { __tostring = function() "
               "while true do end end }))",
               "spec.lua:1:", "error object is a table value");
  /* Returned after the mod finished: the mod's line. */
  expect_error("\nreturn { score_mod = function(s, b, h, q, kv)\n"
               "  return 1 << 40 end }",
               "spec.lua:2:", "score_mod returned the integer 1099511627776, "
               "which does not fit in i32");
  /* C stack overflow: recursion through a C function (tostring calling
   * __tostring), through metamethods and the DSL, and parser nesting. */
  expect_error("local t = setmetatable({}, {__tostring = function(t)\n"
               "  return tostring(t) end})\nlocal x = tostring(t)\n",
               "spec.lua:2:", "C stack overflow");
  expect_error("local mt = {}\nmt.__index = function(t, k) return "
               "min(t[k], 1) end\nlocal x = setmetatable({}, mt)\n"
               "return { mask_mod = function(b, h, q, kv)\n"
               "  return lt(x.y, kv) end }",
               "spec.lua:2:", "C stack overflow");
  char deep[2048];
  int n = snprintf(deep, sizeof deep, "local a = 1\nlocal x = ");
  for (int i = 0; i < 300; i++) deep[n++] = '(';
  deep[n++] = '1';
  for (int i = 0; i < 300; i++) deep[n++] = ')';
  deep[n] = '\0';
  expect_error(deep, "spec.lua:2:", "C stack overflow");
  /* Too many locals is a parser error that names the line itself. */
  char locals[8192];
  n = snprintf(locals, sizeof locals, "return { mask_mod = function(b, h, "
               "q, kv)\n");
  for (int i = 0; i < 210; i++)
    n += snprintf(locals + n, sizeof locals - n, "local a%d = %d\n", i, i);
  snprintf(locals + n, sizeof locals - n, "return lt(q, kv) end }\n");
  expect_error(locals, "spec.lua:198:", "too many local variables");
}

/* A failure inside the prelude names the spec line that led there (the
 * prelude's own position follows), also for the limits. */
static void test_prelude_failures_name_the_spec_line(void **state) {
  (void)state;
  expect_error("local m = causal()\nfor i = 1, 1e7 do m = and_masks(m, "
               "causal()) end",
               "spec.lua:2:", "limit exceeded");
  /* A mod built by a prelude combinator fails while it is traced, with no
   * spec frame on the stack: the line that built it. */
  expect_error("local x = 1\n\nreturn { mask_mod = and_masks(causal(),\n"
               "  function(b, h, q, kv) return 5 end) }",
               "spec.lua:3:", "logical_and combines booleans (got number)");
  expect_error("local s = compose_scores(function(s) return s end,\n"
               "  function(s) return lt(s, 1) end)\n"
               "return { score_mod = s }",
               "spec.lua:1:", "score_mod must return a number (got traced "
               "bool)");
  expect_error("local c = causal()\nlocal m = c\nfor i = 1, 1100 do\n"
               "  m = or_masks(m, function(b, h, q, kv) return lt(q, kv + i)"
               " end)\nend\nreturn { mask_mod = m }",
               "spec.lua:4:", "FJG_MAX_MOD_NODES");
}

static void test_check_failures_name_the_mod(void **state) {
  (void)state;
  /* Functions that each need one more sweep of the dataflow than the last
   * (quadratic): refused at a bounded cost, at the mod's line. */
  enum { N = 4000 };
  size_t cap = (size_t)N * 48 + 256;
  char *src = malloc(cap);
  assert_non_null(src);
  int n = snprintf(src, cap, "F = {}\n\nreturn { mask_mod = function(b, h, "
                   "q, kv)\n  G0 = q\n");
  for (int i = N; i >= 1; i--)
    n += snprintf(src + n, cap - n, "  F[%d] = function() G%d = G%d end\n",
                  i, i, i - 1);
  snprintf(src + n, cap - n, "  return lt(q, kv)\nend }\n");
  expect_error(src, "spec.lua:3:", "cannot check this function: it takes "
               "more than 20 million steps");
  free(src);
}

static void test_null_arguments(void **state) {
  (void)state;
  char err[128];
  assert_int_equal(fjl_trace_spec(NULL, 0, "x", NULL, NULL, err, sizeof err),
                   FJ_EINVAL);
}

/* Gradients: only f32 buffers have them, the options table has one key,
 * and the derivative of score_mod must fit its limits. */
static void test_grad_options(void **state) {
  (void)state;
  expect_error("local ids = buffer('ids', 'i32', {grad = true})",
               "spec.lua:1:", "'ids' cannot have a gradient: only f32 buffers can");
  expect_error("local x = 1\nlocal w = param('w', 'f32', {grad = true})",
               "spec.lua:2:", "'w' cannot have a gradient: only f32 buffers can");
  expect_error("local b = buffer('b', 'f32', {grad = true, lr = 2})",
               "spec.lua:1:", "buffer 'b': unknown option 'lr'");
  expect_error("local b = buffer('b', 'f32', {true})",
               "spec.lua:1:", "buffer 'b': unknown option (a number key)");
  expect_error("local w = param('w', 'i32', {gard = true})",
               "spec.lua:1:", "param 'w': unknown option 'gard'");
  expect_error("local b = buffer('b', 'f32', {grad = 1})",
               "spec.lua:1:", "grad must be true or false (got number)");
  expect_error("local b = buffer('b', 'f32', 'grad')",
               "spec.lua:1:", "the options must be a table such as {grad = true}");
  expect_error("local b = buffer('b', 'f32', {grad = true})\n"
               "local c = buffer('b', 'f32')",
               "spec.lua:2:", "buffer 'b' is already declared with grad = true");
  expect_error("local b = buffer('b', 'f32')\n"
               "local c = buffer('b', 'f32', {grad = true})",
               "spec.lua:2:", "buffer 'b' is already declared without grad = true");
  expect_ok("local b = buffer('b', 'f32', {grad = true})\n"
            "local c = buffer('b', 'f32', {grad = true})\n"
            "local w = param('w', 'f32', {grad = false})\n"
            "return { score_mod = function(s, b_, h, q, kv) return s + c[q] * w end }");
  /* Reads of trainable buffers past FJG_MAX_BUFFER_GRADS, at the mod. */
  expect_error("local bias = buffer('bias', 'f32', {grad = true})\n"
               "return { score_mod = function(s, b, h, q, kv)\n"
               "  for i = 1, 17 do s = s + bias[q + i] end\n"
               "  return s\nend }",
               "spec.lua:2:", "cannot differentiate score_mod (for the backward "
               "pass): score_mod reads trainable buffers at more than 16 places");
  /* A score_mod within its own limit whose derivative is past its limit. */
  expect_error("return { score_mod = function(s, b, h, q, kv)\n"
               "  local x = tanh(s)\n"
               "  for i = 1, 450 do x = min(x * 1.5, s) end\n"
               "  return x\nend }",
               "spec.lua:1:", "the derivative of score_mod (for the backward pass) "
               "depends on");
  expect_error("return { score_mod = function(s, b, h, q, kv)\n"
               "  local x = tanh(s)\n"
               "  for i = 1, 450 do x = min(x * 1.5, s) end\n"
               "  return x\nend }",
               "spec.lua:1:", "(FJG_MAX_GRAD_NODES)");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grad_options),
      cmocka_unit_test(test_less_than),
      cmocka_unit_test(test_less_equal),
      cmocka_unit_test(test_equal_to_number),
      cmocka_unit_test(test_if_on_traced),
      cmocka_unit_test(test_and_or_not),
      cmocka_unit_test(test_misuse_in_functions_the_mod_reaches),
      cmocka_unit_test(test_plain_control_flow_is_fine),
      cmocka_unit_test(test_runtime_metamethod_errors),
      cmocka_unit_test(test_syntax_and_runtime_errors),
      cmocka_unit_test(test_wrong_return_types),
      cmocka_unit_test(test_missing_table),
      cmocka_unit_test(test_bytecode_rejected),
      cmocka_unit_test(test_prelude_errors_name_the_spec_line),
      cmocka_unit_test(test_chunk_name_forms),
      cmocka_unit_test(test_errors_without_a_position_get_one),
      cmocka_unit_test(test_prelude_failures_name_the_spec_line),
      cmocka_unit_test(test_check_failures_name_the_mod),
      cmocka_unit_test(test_null_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
