/* tests/unit/test_lua_text.c: the bytes of a spec and of its chunk name.
 * A byte order mark and a shebang line are skipped like Lua's own loader
 * does; any byte may appear in comments and strings; nothing the library
 * hands back for printing (the spec's name, chunk names, error messages)
 * can carry control characters or invalid UTF-8. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lua/spec.h"

static fj_status trace(const char *src, size_t len, const char *chunk,
                       char **name, char *err, size_t errlen) {
  fjg_graph *g = NULL;
  fj_status st = fjl_trace_spec(src, len, chunk, &g, name, err, errlen);
  fjg_graph_destroy(g);
  return st;
}

static void expect_ok(const char *src, size_t len) {
  char err[1024] = "";
  if (trace(src, len, "spec.lua", NULL, err, sizeof err) != FJ_OK)
    fail_msg("expected success: %s", err);
}

static void expect_error(const char *src, size_t len, const char *chunk,
                         const char *where, const char *text) {
  char err[1024] = "";
  char *name = NULL;
  if (trace(src, len, chunk, &name, err, sizeof err) != FJ_ELUA)
    fail_msg("expected FJ_ELUA (%s)", err);
  assert_null(name);
  if (strncmp(err, where, strlen(where)) != 0)
    fail_msg("message does not start with '%s': %s", where, err);
  if (!strstr(err, text))
    fail_msg("message lacks '%s': %s", text, err);
}

/* No byte below 0x20, no DEL, and only valid UTF-8 without C1 controls. */
static void assert_printable(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    if (*p < 0x20 || *p == 0x7f)
      fail_msg("control byte 0x%02x in '%s'", *p, s);
    if (*p < 0x80) {
      p++;
      continue;
    }
    int len = *p >= 0xf0 ? 4 : *p >= 0xe0 ? 3 : *p >= 0xc2 ? 2 : 0;
    if (len == 0)
      fail_msg("invalid UTF-8 lead byte 0x%02x in '%s'", *p, s);
    for (int i = 1; i < len; i++)
      if ((p[i] & 0xc0) != 0x80)
        fail_msg("truncated UTF-8 sequence in '%s'", s);
    if (p[0] == 0xc2 && p[1] < 0xa0)
      fail_msg("C1 control in '%s'", s);
    p += len;
  }
}

#define LIT(s) s, sizeof(s) - 1

static void test_bom_and_shebang(void **state) {
  (void)state;
  expect_ok(LIT("\xEF\xBB\xBFreturn { mask_mod = causal() }"));
  expect_ok(LIT("#!/usr/bin/env flexjit\nreturn { mask_mod = causal() }"));
  expect_ok(LIT("\xEF\xBB\xBF#!/usr/bin/env flexjit\n"
                "return { mask_mod = causal() }"));
  /* Line numbers stay those of the file. */
  expect_error(LIT("#!/usr/bin/env flexjit\n\nreturn { mask_mod = "
                   "function(b, h, q, kv) return q < kv end }"),
               "spec.lua", "spec.lua:3:", "use lt(a, b)");
  expect_error(LIT("\xEF\xBB\xBF\nerror('here')"), "spec.lua", "spec.lua:2:",
               "here");
  expect_error(LIT("\xEF\xBB\xBF#!x\n\n\nlocal y = = 2"), "spec.lua",
               "spec.lua:4:", "unexpected symbol");
  /* Only a first line is a shebang; only a leading BOM is skipped. */
  expect_error(LIT("local a = 1\n#!/bin/x\n"), "spec.lua", "spec.lua:2:",
               "unexpected symbol near '#'");
  /* Bytecode after them is still refused. */
  expect_error(LIT("#!x\n\x1bLua\x54"), "spec.lua", "spec.lua:",
               "not accepted");
}

static void test_any_byte_in_comments_and_strings(void **state) {
  (void)state;
  expect_ok(LIT("-- \xFF\xFE \xC3\x28 \x80 comment\n"
                "local s = \"\xFF\xC0\xAF\" .. '\\xff'\n"
                "--[[ \xFF\x00 block ]]\n"
                "return { mask_mod = causal() }"));
  /* A NUL in the source is data too. */
  expect_ok(LIT("local s = '\x00'\nreturn { mask_mod = causal() }"));
}

static void test_spec_name_must_be_printable(void **state) {
  (void)state;
  expect_error(LIT("return { name = '\\27[2J', mask_mod = causal() }"),
               "spec.lua", "spec.lua:",
               "name must be printable UTF-8 text, without control "
               "characters (got \"\\x1B[2J\")");
  expect_error(LIT("return { name = 'a\\0b', mask_mod = causal() }"),
               "spec.lua", "spec.lua:", "(got \"a\\x00b\")");
  expect_error(LIT("return { name = 'ok\\rfake', mask_mod = causal() }"),
               "spec.lua", "spec.lua:", "\\x0D");
  expect_error(LIT("return { name = '\\xff\\xfe', mask_mod = causal() }"),
               "spec.lua", "spec.lua:", "\\xFF\\xFE");
  /* U+009B, the 8-bit CSI, encoded as UTF-8. */
  expect_error(LIT("return { name = 'x\\u{9B}2J', mask_mod = causal() }"),
               "spec.lua", "spec.lua:", "\\xC2\\x9B");
  /* Overlong and surrogate encodings are not UTF-8. */
  expect_error(LIT("return { name = '\\xC0\\xAF', mask_mod = causal() }"),
               "spec.lua", "spec.lua:", "\\xC0\\xAF");
  expect_error(LIT("return { name = '\\xED\\xA0\\x80', mask_mod = causal() }"),
               "spec.lua", "spec.lua:", "\\xED\\xA0\\x80");
  /* Printable UTF-8 is kept as it is. */
  char *name = NULL;
  char err[512];
  const char src[] = "return { name = '注意力 – ünïcode', mask_mod = causal() }";
  assert_int_equal(trace(src, sizeof src - 1, "spec.lua", &name, err,
                         sizeof err), FJ_OK);
  assert_string_equal(name, "注意力 – ünïcode");
  free(name);
}

static void test_chunk_names_are_escaped(void **state) {
  (void)state;
  const char src[] = "return { mask_mod = function(b, h, q, kv)\n"
                     "  return q < kv end }";
  /* Control characters and invalid UTF-8 in a path, in messages and in
   * the default name. */
  expect_error(src, sizeof src - 1, "x\x1b[31mred\xff.lua",
               "x\\x1B[31mred\\xFF.lua:2:", "use lt(a, b)");
  char *name = NULL;
  char err[512];
  const char ok[] = "return { mask_mod = causal() }";
  assert_int_equal(trace(ok, sizeof ok - 1, "\x1b]0;title\x07spec.lua", &name,
                         err, sizeof err), FJ_OK);
  assert_string_equal(name, "\\x1B]0;title\\x07spec.lua");
  free(name);
  /* Without a name field the name is the chunk name as messages show it. */
  assert_int_equal(trace(ok, sizeof ok - 1, "@dir/plain.lua", &name, err,
                         sizeof err), FJ_OK);
  assert_string_equal(name, "dir/plain.lua");
  free(name);
  /* A C string ends at its first NUL: nothing after it is part of the
   * chunk name (a binding must refuse such names, as Python's os module
   * does). */
  expect_error(src, sizeof src - 1, "cut\0\x1b[2J.lua", "cut:2:",
               "use lt(a, b)");
  /* A long name keeps its tail, whole, after "..."; every message uses the
   * same text, so the escapes are never cut in half. */
  static const char tail[] = "/\x1b\x1b\x1b\x1b\x1b\x1b\x1b\x1b\xe6\xb3\xa8.lua";
  char longname[200];
  memset(longname, 'd', 150);
  memcpy(longname + 150, tail, sizeof tail);
  /* Lua shows LUA_IDSIZE - 1 = 59 bytes: "...", then 56 of the escaped
   * tail: 16 d's and "/", eight \x1B, the CJK character and ".lua" (40). */
  char where[128];
  snprintf(where, sizeof where, "...%s:2:",
           "dddddddddddddddd/\\x1B\\x1B\\x1B\\x1B\\x1B\\x1B\\x1B\\x1B"
           "\xe6\xb3\xa8.lua");
  expect_error(src, sizeof src - 1, longname, where, "use lt(a, b)");
  assert_int_equal(trace("error('x')", 10, longname, NULL, err, sizeof err),
                   FJ_ELUA);
  assert_int_equal(strncmp(err, where, strlen(where) - 2), 0);
  assert_printable(err);
}

static void test_error_messages_are_printable(void **state) {
  (void)state;
  char err[512];
  const char *srcs[] = {
      "error('\\27[2J\\r\\xff')",
      "error('\\xc2\\x9b\\x07')",
      "local t = {} t['\\27[2J'].x = 1",
      "param('w', '\\27[2J')",
      "return { mask_mod = causal{align = '\\27[31m'} }",
      "local x = \"\x1b[2J\n",
  };
  for (size_t i = 0; i < sizeof srcs / sizeof srcs[0]; i++) {
    assert_int_equal(trace(srcs[i], strlen(srcs[i]), "spec.lua", NULL, err,
                           sizeof err), FJ_ELUA);
    assert_int_equal(strncmp(err, "spec.lua:1:", 11), 0);
    assert_printable(err);
    assert_non_null(strstr(err, "\\x"));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bom_and_shebang),
      cmocka_unit_test(test_any_byte_in_comments_and_strings),
      cmocka_unit_test(test_spec_name_must_be_printable),
      cmocka_unit_test(test_chunk_names_are_escaped),
      cmocka_unit_test(test_error_messages_are_printable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
