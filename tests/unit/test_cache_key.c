/*
 * tests/unit/test_cache_key.c: cache key derivation (cache/key.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cache/key.h"

/* The key of a fixed set of ingredients, committed so that an accidental
 * change of the record format or the hash shows up here. If the change is
 * intended, bump FJC_KEY_SCHEMA and paste the value this test prints. */
#define GOLDEN_HEX "ac51bfaee3a31c39e11b5613ce28d3b4"

typedef struct ingredients {
  const char *libver;
  const char *graph;
  const char *templ;
  const char *arch;
  int64_t head_dim;
  int64_t nvrtc;
  const char *opt;
} ingredients;

static const ingredients base = {"0.1.0", "graph-bytes", "template-bytes",
                                 "sm_90a", 128, 13000, "-std=c++17"};

static void key_of(const ingredients *in, fjc_key *out) {
  fjc_key_builder b;
  fjc_key_begin(&b);
  fjc_key_add_str(&b, "libver", in->libver);
  fjc_key_add(&b, "graph", in->graph, strlen(in->graph));
  fjc_key_add(&b, "template", in->templ, strlen(in->templ));
  fjc_key_add_str(&b, "arch", in->arch);
  fjc_key_add_int(&b, "head_dim", in->head_dim);
  fjc_key_add_int(&b, "nvrtc", in->nvrtc);
  fjc_key_add_str(&b, "opt", in->opt);
  fjc_key_finish(&b, out);
}

static void test_golden(void **state) {
  (void)state;
  fjc_key k;
  key_of(&base, &k);
  if (strcmp(k.hex, GOLDEN_HEX) != 0)
    print_message("key of the fixed ingredients is %s (expected %s)\n", k.hex,
                  GOLDEN_HEX);
  assert_string_equal(k.hex, GOLDEN_HEX);
}

static void test_hex_matches_bytes(void **state) {
  (void)state;
  fjc_key k, parsed;
  key_of(&base, &k);
  assert_int_equal(strlen(k.hex), 32);
  for (int i = 0; i < 32; i++)
    assert_true((k.hex[i] >= '0' && k.hex[i] <= '9') ||
                (k.hex[i] >= 'a' && k.hex[i] <= 'f'));
  assert_int_equal(fjc_key_from_hex(k.hex, &parsed), 0);
  assert_memory_equal(parsed.bytes, k.bytes, 16);
  assert_string_equal(parsed.hex, k.hex);
  assert_int_equal(fjc_key_from_hex("xyz", &parsed), -1);
  assert_int_equal(
      fjc_key_from_hex("0123456789abcdef0123456789abcdeg", &parsed), -1);
}

static void test_deterministic(void **state) {
  (void)state;
  fjc_key a, b;
  key_of(&base, &a);
  key_of(&base, &b);
  assert_memory_equal(a.bytes, b.bytes, 16);
  assert_string_equal(a.hex, b.hex);
}

static void assert_differs(const ingredients *in) {
  fjc_key a, b;
  key_of(&base, &a);
  key_of(in, &b);
  assert_string_not_equal(a.hex, b.hex);
}

static void test_each_ingredient_changes_key(void **state) {
  (void)state;
  ingredients in;
  in = base, in.libver = "0.1.1", assert_differs(&in);
  in = base, in.graph = "graph-bytez", assert_differs(&in);
  in = base, in.templ = "template-bytes ", assert_differs(&in);
  in = base, in.arch = "sm_90", assert_differs(&in);
  in = base, in.head_dim = 64, assert_differs(&in);
  in = base, in.nvrtc = 12080, assert_differs(&in);
  in = base, in.opt = "-std=c++20", assert_differs(&in);
}

static void two_records(const char *a, const char *b, fjc_key *out) {
  fjc_key_builder kb;
  fjc_key_begin(&kb);
  fjc_key_add_str(&kb, "x", a);
  fjc_key_add_str(&kb, "x", b);
  fjc_key_finish(&kb, out);
}

static void test_framing(void **state) {
  (void)state;
  fjc_key k1, k2;
  two_records("ab", "c", &k1);
  two_records("a", "bc", &k2);
  assert_string_not_equal(k1.hex, k2.hex);

  /* The same bytes under another tag, or moved between tag and data. */
  fjc_key_builder b;
  fjc_key_begin(&b);
  fjc_key_add_str(&b, "t", "v");
  fjc_key_finish(&b, &k1);
  fjc_key_begin(&b);
  fjc_key_add_str(&b, "u", "v");
  fjc_key_finish(&b, &k2);
  assert_string_not_equal(k1.hex, k2.hex);
  fjc_key_begin(&b);
  fjc_key_add_str(&b, "tv", "");
  fjc_key_finish(&b, &k2);
  assert_string_not_equal(k1.hex, k2.hex);
}

static void test_empty_and_null(void **state) {
  (void)state;
  fjc_key k_empty, k_null, k_none;
  fjc_key_builder b;
  fjc_key_begin(&b);
  fjc_key_add_str(&b, "s", "");
  fjc_key_finish(&b, &k_empty);
  fjc_key_begin(&b);
  fjc_key_add_str(&b, "s", NULL);
  fjc_key_finish(&b, &k_null);
  fjc_key_begin(&b);
  fjc_key_finish(&b, &k_none);
  assert_string_equal(k_empty.hex, k_null.hex);
  /* An empty record still counts. */
  assert_string_not_equal(k_empty.hex, k_none.hex);
}

static void test_int_is_width_independent_of_host(void **state) {
  (void)state;
  fjc_key a, b;
  fjc_key_builder kb;
  fjc_key_begin(&kb);
  fjc_key_add_int(&kb, "n", 1);
  fjc_key_finish(&kb, &a);
  /* add_int is 8 little-endian bytes, whatever the host. */
  const unsigned char le[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  fjc_key_begin(&kb);
  fjc_key_add(&kb, "n", le, sizeof le);
  fjc_key_finish(&kb, &b);
  assert_string_equal(a.hex, b.hex);
  fjc_key_begin(&kb);
  fjc_key_add_int(&kb, "n", -1);
  fjc_key_finish(&kb, &b);
  assert_string_not_equal(a.hex, b.hex);
}

/* The full key of a pack entry: committed like GOLDEN_HEX, since packs
 * built by one release must be found by the next. */
#define GOLDEN_FULL_HEX "eb62f85e8a72ff66c48afc3c3918c403"

static void test_key_with_nvrtc(void **state) {
  (void)state;
  fjc_key src, a, b, c;
  key_of(&base, &src);
  fjc_key_with_nvrtc(&src, "13.0", &a);
  fjc_key_with_nvrtc(&src, "13.0", &b);
  assert_string_equal(a.hex, b.hex);
  assert_string_not_equal(a.hex, src.hex);
  fjc_key_with_nvrtc(&src, "12.8", &c);
  assert_string_not_equal(a.hex, c.hex);
  fjc_key_with_nvrtc(&src, NULL, &b);
  fjc_key_with_nvrtc(&src, "", &c);
  assert_string_equal(b.hex, c.hex);
  if (strcmp(a.hex, GOLDEN_FULL_HEX) != 0)
    print_message("full key of the fixed ingredients is %s (expected %s)\n",
                  a.hex, GOLDEN_FULL_HEX);
  assert_string_equal(a.hex, GOLDEN_FULL_HEX);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden),
      cmocka_unit_test(test_hex_matches_bytes),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_each_ingredient_changes_key),
      cmocka_unit_test(test_framing),
      cmocka_unit_test(test_empty_and_null),
      cmocka_unit_test(test_int_is_width_independent_of_host),
      cmocka_unit_test(test_key_with_nvrtc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
