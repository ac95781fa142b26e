/*
 * tests/unit/test_block_class.c: fj_spec_block_class, the host's
 * classification of a block of pairs (for context parallel rings, which skip
 * the pairs a mask leaves empty), without a GPU: each class on index-only
 * masks, with offsets and params, a mask that reads a buffer (decided by its
 * index part alone), one that depends on the head, against the CPU
 * evaluator over every pair of small blocks, and each refusal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "flexjit.h"
#include "gen/graph.h"
#include "runtime/context_impl.h"
#include "tests/unit/fake_tensors.h"

static fj_spec *load(fj_context *ctx, const char *src) {
  fj_spec *s = NULL;
  assert_int_equal(fj_spec_load_string(ctx, src, strlen(src), "block_class", &s), FJ_OK);
  return s;
}

static const char CAUSAL[] = "return { mask_mod = causal() }";
static const char FULL[] = "return { score_mod = function(s, b, h, q, kv) return s end }";
static const char WINDOW[] = "return { mask_mod = sliding_window(param(\"window\", \"i32\")) }";
static const char DOCUMENT[] = "return { mask_mod = document(buffer(\"doc\", \"i32\")) }";
static const char HEAD0[] = "return { mask_mod = function(b, h, q, kv) return eq(h, 0) end }";

static int classify(fj_spec *s, const fj_arg *args, int n, fj_block_query q) {
  int cls = -1;
  assert_int_equal(fj_spec_block_class(s, args, n, &q, &cls), FJ_OK);
  return cls;
}

static fj_block_query block(int64_t q0, int64_t q1, int64_t kv0, int64_t kv1) {
  return (fj_block_query){.B = 2, .Hq = 4, .Hkv = 2, .Lq = 1000, .Lk = 1000,
                          .q0 = q0, .q1 = q1, .kv0 = kv0, .kv1 = kv1};
}

static void test_classes(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  fj_spec *causal = load(ctx, CAUSAL), *full = load(ctx, FULL), *window = load(ctx, WINDOW);
  fj_spec *doc = load(ctx, DOCUMENT), *head0 = load(ctx, HEAD0);

  assert_int_equal(classify(causal, NULL, 0, block(0, 99, 100, 199)), FJ_BLOCK_EMPTY);
  assert_int_equal(classify(causal, NULL, 0, block(100, 199, 0, 99)), FJ_BLOCK_FULL);
  assert_int_equal(classify(causal, NULL, 0, block(0, 99, 0, 99)), FJ_BLOCK_PARTIAL);
  assert_int_equal(classify(full, NULL, 0, block(0, 99, 500, 999)), FJ_BLOCK_FULL);

  /* Offsets place the rows in the whole sequence: q rows 0..99 at 1000 see
   * kv rows 0..99 at 0 (FULL), and the reverse sees nothing. */
  fj_block_query b = block(0, 99, 0, 99);
  b.q_offset = 1000;
  assert_int_equal(classify(causal, NULL, 0, b), FJ_BLOCK_FULL);
  b.q_offset = 0, b.kv_offset = 1000;
  assert_int_equal(classify(causal, NULL, 0, b), FJ_BLOCK_EMPTY);

  /* A param: window 50 over q 1000..1099 leaves kv 0..99 empty; a window of
   * 2000 covers them. Buffers among the args are ignored. */
  fj_arg w = {.name = "window", .i32 = 50};
  b = block(0, 99, 0, 99);
  b.q_offset = 1000;
  assert_int_equal(classify(window, &w, 1, b), FJ_BLOCK_EMPTY);
  w.i32 = 2000;
  assert_int_equal(classify(window, &w, 1, b), FJ_BLOCK_FULL);

  /* A buffer's values are not read: the document mask's causal part decides
   * the blocks above the diagonal; below it every block is PARTIAL. */
  const fj_arg d = {.name = "doc"};
  assert_int_equal(classify(doc, &d, 1, block(0, 99, 100, 199)), FJ_BLOCK_EMPTY);
  assert_int_equal(classify(doc, NULL, 0, block(100, 199, 0, 99)), FJ_BLOCK_PARTIAL);

  /* Head 0 alone: FULL with one head, PARTIAL across four (EMPTY on the
   * others). */
  b = block(0, 9, 0, 9);
  assert_int_equal(classify(head0, NULL, 0, b), FJ_BLOCK_PARTIAL);
  b.Hq = 1, b.Hkv = 1;
  assert_int_equal(classify(head0, NULL, 0, b), FJ_BLOCK_FULL);
  fj_spec *all[] = {causal, full, window, doc, head0};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) fj_spec_destroy(all[i]);
  fj_context_destroy(ctx);
}

/* The classes against the evaluator over every pair: a block called EMPTY
 * has no allowed pair and FULL no masked one, for blocks of a sliding window
 * with offsets. */
static void test_sound(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  fj_spec *window = load(ctx, WINDOW);
  const fjg_graph *g = fjr_spec_graph(window);
  int32_t pi[1] = {37};
  float pf[1] = {0};
  const fj_arg w = {.name = "window", .i32 = 37};
  int seen[3] = {0, 0, 0};
  for (int64_t qo = 0; qo <= 96; qo += 48)
    for (int q0 = 0; q0 < 120; q0 += 17)
      for (int kv0 = 0; kv0 < 120; kv0 += 13) {
        fj_block_query b = {.B = 1, .Hq = 1, .Hkv = 1, .Lq = 128, .Lk = 128, .q_offset = qo,
                            .q0 = q0, .q1 = q0 + 7, .kv0 = kv0, .kv1 = kv0 + 11};
        if (b.kv1 >= b.Lk) b.kv1 = b.Lk - 1;
        const int cls = classify(window, &w, 1, b);
        seen[cls]++;
        const fjg_env env = {.sizes = {1, 1, 1, 128, 128}, .q_off = (int32_t)qo,
                             .param_i32 = pi, .param_f32 = pf};
        int any = 0, all = 1;
        for (int64_t q = b.q0; q <= b.q1; q++)
          for (int64_t kv = b.kv0; kv <= b.kv1; kv++) {
            const int m = fjg_eval_mask(g, &env, 0, 0, (int)q, (int)kv);
            any |= m, all &= m;
          }
        if (cls == FJ_BLOCK_EMPTY) assert_false(any);
        if (cls == FJ_BLOCK_FULL) assert_true(all);
      }
  /* The blocks were of every class. */
  assert_true(seen[FJ_BLOCK_EMPTY] > 0 && seen[FJ_BLOCK_FULL] > 0 && seen[FJ_BLOCK_PARTIAL] > 0);
  fj_spec_destroy(window);
  fj_context_destroy(ctx);
}

static void expect_refused(fj_context *ctx, fj_spec *s, const fj_arg *args, int n,
                           fj_block_query q, const char *text) {
  int cls = -1;
  assert_int_equal(fj_spec_block_class(s, args, n, &q, &cls), FJ_EINVAL);
  if (!strstr(fj_context_last_error(ctx), text))
    fail_msg("error '%s' does not say '%s'", fj_context_last_error(ctx), text);
  assert_int_equal(cls, -1);
}

static void test_refusals(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  fj_spec *causal = load(ctx, CAUSAL), *window = load(ctx, WINDOW);
  int cls;
  fj_block_query b = block(0, 9, 0, 9);
  assert_int_equal(fj_spec_block_class(NULL, NULL, 0, &b, &cls), FJ_EINVAL);
  assert_int_equal(fj_spec_block_class(causal, NULL, 0, NULL, &cls), FJ_EINVAL);
  assert_int_equal(fj_spec_block_class(causal, NULL, 0, &b, NULL), FJ_EINVAL);
  expect_refused(ctx, window, NULL, 0, b, "needs param 'window'");
  const fj_arg other = {.name = "width", .i32 = 3};
  expect_refused(ctx, causal, &other, 1, b, "no param or buffer named 'width'");
  expect_refused(ctx, causal, NULL, 0, block(0, 1000, 0, 9), "outside Lq 1000");
  expect_refused(ctx, causal, NULL, 0, block(5, 4, 0, 9), "(or empty)");
  b.Hq = 0;
  expect_refused(ctx, causal, NULL, 0, b, "must be 1 to 2^31 - 1");
  /* The offsets by the launches' rule (runtime/serving.c). */
  b = block(0, 9, 0, 9);
  b.kv_offset = -1;
  expect_refused(ctx, causal, NULL, 0, b, "must be >= 0");
  b.kv_offset = INT32_MAX;
  expect_refused(ctx, causal, NULL, 0, b, "below 2^31");
  fj_spec *br = load(ctx, "return { mask_mod = causal{align = \"bottom_right\"} }");
  b.kv_offset = 100;
  int got = -1;
  assert_int_equal(fj_spec_block_class(br, NULL, 0, &b, &got), FJ_EUNSUPPORTED);
  assert_non_null(strstr(fj_context_last_error(ctx), "reads the lengths Lq or Lk"));
  b.kv_offset = 0;
  assert_int_equal(classify(br, NULL, 0, b), FJ_BLOCK_PARTIAL);
  fj_spec_destroy(br);
  fj_spec_destroy(causal);
  fj_spec_destroy(window);
  fj_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_classes),
      cmocka_unit_test(test_sound),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
