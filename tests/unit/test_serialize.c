/* tests/unit/test_serialize.c: canonical bytes of gen/serialize.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gen/graph.h"

/* Serializes g into a fresh buffer (caller frees). */
static fjg_buf bytes_of(const fjg_graph *g) {
  fjg_buf b;
  fjg_buf_init(&b);
  assert_int_equal(fjg_serialize(g, &b), FJ_OK);
  assert_false(b.failed);
  return b;
}

static int same_bytes(const fjg_graph *x, const fjg_graph *y) {
  fjg_buf a = bytes_of(x), b = bytes_of(y);
  int same = a.len == b.len && memcmp(a.data, b.data, a.len) == 0;
  fjg_buf_free(&a);
  fjg_buf_free(&b);
  return same;
}

/* Sliding window: ge(q, kv) & lt(q - kv, window), nodes built in one order. */
static fjg_graph *window_forward(int32_t window) {
  fjg_graph *g = fjg_graph_create();
  int q = fjg_input_node(g, FJG_IN_Q), kv = fjg_input_node(g, FJG_IN_KV);
  int causal = fjg_binary(g, FJG_OP_GE, q, kv);
  int d = fjg_binary(g, FJG_OP_SUB, q, kv);
  int near = fjg_binary(g, FJG_OP_LT, d, fjg_const_i32(g, window));
  fjg_set_mask_root(g, fjg_binary(g, FJG_OP_AND, causal, near));
  return g;
}

/* The same function, built backwards, with unused nodes along the way. */
static fjg_graph *window_backward(int32_t window) {
  fjg_graph *g = fjg_graph_create();
  int c = fjg_const_i32(g, window);
  int h = fjg_input_node(g, FJG_IN_H);
  fjg_binary(g, FJG_OP_MUL, h, fjg_const_i32(g, 3)); /* unused */
  int kv = fjg_input_node(g, FJG_IN_KV), q = fjg_input_node(g, FJG_IN_Q);
  int d = fjg_binary(g, FJG_OP_SUB, q, kv);
  int near = fjg_binary(g, FJG_OP_LT, d, c);
  fjg_binary(g, FJG_OP_EQ, q, kv); /* unused */
  int causal = fjg_binary(g, FJG_OP_GE, q, kv);
  fjg_set_mask_root(g, fjg_binary(g, FJG_OP_AND, causal, near));
  return g;
}

static void test_equivalent_builds_match(void **state) {
  (void)state;
  fjg_graph *a = window_forward(128), *b = window_backward(128);
  assert_int_not_equal(fjg_num_nodes(a), fjg_num_nodes(b));
  assert_true(same_bytes(a, b));
  assert_true(same_bytes(a, a));
  fjg_graph_destroy(a);
  fjg_graph_destroy(b);
}

static void test_constants_differ(void **state) {
  (void)state;
  fjg_graph *a = window_forward(128), *b = window_forward(256);
  assert_false(same_bytes(a, b));
  fjg_graph_destroy(a);
  fjg_graph_destroy(b);
  /* f32 constants differ by bits. */
  fjg_graph *x = fjg_graph_create(), *y = fjg_graph_create();
  fjg_set_score_root(x, fjg_binary(x, FJG_OP_MUL, fjg_input_node(x, FJG_IN_SCORE),
                                   fjg_const_f32(x, 0.5f)));
  fjg_set_score_root(y, fjg_binary(y, FJG_OP_MUL, fjg_input_node(y, FJG_IN_SCORE),
                                   fjg_const_f32(y, 0.50000006f)));
  assert_false(same_bytes(x, y));
  fjg_graph_destroy(x);
  fjg_graph_destroy(y);
}

static void test_unreachable_ignored(void **state) {
  (void)state;
  fjg_graph *a = window_forward(64), *b = window_forward(64);
  int q = fjg_input_node(b, FJG_IN_Q);
  for (int i = 0; i < 50; i++)
    fjg_binary(b, FJG_OP_ADD, q, fjg_const_i32(b, i + 1000));
  assert_true(same_bytes(a, b));
  fjg_graph_destroy(a);
  fjg_graph_destroy(b);
}

static void test_args_and_roots_count(void **state) {
  (void)state;
  /* Declared arguments are part of the bytes even when unused: they shape
   * the kernel's parameter struct. */
  fjg_graph *a = window_forward(64), *b = window_forward(64);
  fjg_param(b, "window", FJG_I32);
  assert_false(same_bytes(a, b));
  fjg_graph *c = window_forward(64);
  fjg_param(c, "other", FJG_I32);
  assert_false(same_bytes(b, c));
  fjg_graph *d = window_forward(64);
  fjg_param(d, "window", FJG_F32);
  assert_false(same_bytes(b, d));
  /* The same expression as mask vs. as score root (through a where). */
  fjg_graph *e = window_forward(64);
  fjg_set_score_root(e, fjg_input_node(e, FJG_IN_SCORE));
  assert_false(same_bytes(a, e));
  fjg_graph *f = fjg_graph_create();
  fjg_buf none = bytes_of(f);
  assert_true(none.len > 8);
  assert_memory_equal(none.data, "FJG\0", 4);
  fjg_buf_free(&none);
  fjg_graph_destroy(a);
  fjg_graph_destroy(b);
  fjg_graph_destroy(c);
  fjg_graph_destroy(d);
  fjg_graph_destroy(e);
  fjg_graph_destroy(f);
}

/* Mask and score sharing a subexpression: the shared node is numbered once,
 * under the mask, whatever order the spec built things in. */
static fjg_graph *shared(int score_first) {
  fjg_graph *g = fjg_graph_create();
  int q, kv;
  if (score_first) {
    kv = fjg_input_node(g, FJG_IN_KV);
    q = fjg_input_node(g, FJG_IN_Q);
    fjg_input_node(g, FJG_IN_SCORE);
  } else {
    q = fjg_input_node(g, FJG_IN_Q);
    kv = fjg_input_node(g, FJG_IN_KV);
  }
  int d = fjg_binary(g, FJG_OP_SUB, q, kv);
  int s = fjg_input_node(g, FJG_IN_SCORE);
  int score = fjg_binary(g, FJG_OP_ADD, s, d);
  int mask = fjg_binary(g, FJG_OP_GE, d, fjg_const_i32(g, 0));
  fjg_set_mask_root(g, mask);
  fjg_set_score_root(g, score);
  return g;
}

static void test_shared_subexpressions(void **state) {
  (void)state;
  fjg_graph *a = shared(0), *b = shared(1);
  assert_true(same_bytes(a, b));
  fjg_graph_destroy(a);
  fjg_graph_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equivalent_builds_match),
      cmocka_unit_test(test_constants_differ),
      cmocka_unit_test(test_unreachable_ignored),
      cmocka_unit_test(test_args_and_roots_count),
      cmocka_unit_test(test_shared_subexpressions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
