/*
 * tests/unit/test_offsets_args.c: the checks of context parallel offsets
 * (fj_forward_args.q_offset, kv_offset; runtime/serving.c's
 * fjr_offsets_bind) without a GPU: what they fill, and each refusal with an
 * error that names the rule, directly and through fj_attention_forward and
 * fj_attention_backward (where they come before any device is touched); a
 * block mask's offsets (fj_block_mask_options, fj_block_mask_info) and the
 * launch's check that they are its own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "flexjit.h"
#include "runtime/blockmask.h"
#include "runtime/context_impl.h"
#include "runtime/launch_params.h"
#include "runtime/serving.h"
#include "tests/unit/fake_tensors.h"

static fj_spec *load(fj_context *ctx, const char *src) {
  fj_spec *s = NULL;
  assert_int_equal(fj_spec_load_string(ctx, src, strlen(src), "offsets", &s), FJ_OK);
  return s;
}

static const char CAUSAL[] = "return { mask_mod = causal() }";
static const char WINDOW[] =
    "return { mask_mod = sliding_window(param(\"window\", \"i32\")), score_mod = alibi() }";
static const char BOTTOM_RIGHT[] = "return { mask_mod = causal{align = \"bottom_right\"} }";
static const char READS_LK[] =
    "return { score_mod = function(s, b, h, q, kv) return s + (Lk - kv) * 0.01 end }";

static void expect_refused(fj_context *ctx, fj_status got, fj_status want, const char *text) {
  assert_int_equal(got, want);
  if (!strstr(fj_context_last_error(ctx), text))
    fail_msg("error '%s' does not say '%s'", fj_context_last_error(ctx), text);
}

static void test_bind_fills_and_refuses(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  fj_spec *causal = load(ctx, CAUSAL), *window = load(ctx, WINDOW);
  fj_spec *br = load(ctx, BOTTOM_RIGHT), *lk = load(ctx, READS_LK);
  const fjr_sizes base = {2, 8, 2, 300, 500, 0, 0};
  fjr_sizes sz = base;
  /* No offsets: nothing to check, even for a spec that reads the lengths. */
  assert_int_equal(fjr_offsets_bind(ctx, fjr_spec_graph(br), 0, 0, 1, &sz), FJ_OK);
  assert_memory_equal(&sz, &base, sizeof sz);
  /* Offsets into the parameters' sizes. */
  assert_int_equal(fjr_offsets_bind(ctx, fjr_spec_graph(causal), 4096, 1024, 0, &sz), FJ_OK);
  assert_int_equal(sz.q_off, 4096);
  assert_int_equal(sz.kv_off, 1024);
  assert_int_equal(sz.Lq, 300);
  sz = base;
  assert_int_equal(fjr_offsets_bind(ctx, fjr_spec_graph(window), 0, 7, 0, &sz), FJ_OK);
  assert_int_equal(sz.q_off, 0);
  assert_int_equal(sz.kv_off, 7);
  /* Refusals. */
  sz = base;
  expect_refused(ctx, fjr_offsets_bind(ctx, fjr_spec_graph(causal), -1, 0, 0, &sz),
                 FJ_EINVAL, "must be >= 0");
  expect_refused(ctx, fjr_offsets_bind(ctx, fjr_spec_graph(causal), 0, INT32_MAX - 100, 0, &sz),
                 FJ_EINVAL, "below 2^31");
  /* Offsets near 2^63, whose sum with a length does not fit an int64. */
  expect_refused(ctx, fjr_offsets_bind(ctx, fjr_spec_graph(causal), INT64_MAX, 0, 0, &sz),
                 FJ_EINVAL, "below 2^31");
  expect_refused(ctx, fjr_offsets_bind(ctx, fjr_spec_graph(causal), 5, INT64_MAX - 200, 0, &sz),
                 FJ_EINVAL, "below 2^31");
  expect_refused(ctx, fjr_offsets_bind(ctx, fjr_spec_graph(causal), 64, 0, 1, &sz),
                 FJ_EUNSUPPORTED, "packed batches");
  expect_refused(ctx, fjr_offsets_bind(ctx, fjr_spec_graph(br), 64, 64, 0, &sz),
                 FJ_EUNSUPPORTED, "reads the lengths Lq or Lk");
  expect_refused(ctx, fjr_offsets_bind(ctx, fjr_spec_graph(lk), 0, 64, 0, &sz),
                 FJ_EUNSUPPORTED, "reads the lengths Lq or Lk");
  assert_memory_equal(&sz, &base, sizeof sz); /* a refusal fills nothing */
  fj_spec_destroy(causal), fj_spec_destroy(window), fj_spec_destroy(br), fj_spec_destroy(lk);
  fj_context_destroy(ctx);
}

static void test_launches_refuse_before_the_device(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  fj_spec *br = load(ctx, BOTTOM_RIGHT), *causal = load(ctx, CAUSAL);
  fjt_dense t; /* 2 x 8 x 64 x 128 queries over 2 x 2 x 96 x 128 keys */
  fjt_dense_init(&t, 2, 8, 2, 64, 96, 128);
  fj_forward_args fa = {.q = &t.q, .k = &t.k, .v = &t.v, .o = &t.o, .lse = &t.lse,
                        .q_offset = 4096, .kv_offset = 4000};
  expect_refused(ctx, fj_attention_forward(ctx, br, &fa), FJ_EUNSUPPORTED,
                 "reads the lengths Lq or Lk");
  fa.kv_offset = -5;
  expect_refused(ctx, fj_attention_forward(ctx, causal, &fa), FJ_EINVAL, "must be >= 0");
  fj_backward_args ba = {.q = &t.q, .k = &t.k, .v = &t.v, .o = &t.o, .lse = &t.lse,
                         .dout = &t.dout, .dq = &t.dq, .dk = &t.dk, .dv = &t.dv,
                         .q_offset = 64};
  expect_refused(ctx, fj_attention_backward(ctx, br, &ba), FJ_EUNSUPPORTED,
                 "reads the lengths Lq or Lk");
  /* Accepted offsets get past the checks: whatever fails next (no GPU
   * here) is not about them. */
  fa.kv_offset = 4000;
  const fj_status st = fj_attention_forward(ctx, causal, &fa);
  if (st != FJ_OK && strstr(fj_context_last_error(ctx), "offset"))
    fail_msg("accepted offsets refused: %s", fj_context_last_error(ctx));
  fj_spec_destroy(br), fj_spec_destroy(causal);
  fj_context_destroy(ctx);
}

/* A wrapped mask keeps its offsets; a launch binds it only at the same
 * offsets; the builder refuses offsets as launches do, before the device. */
static void test_block_mask_offsets(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  fj_spec *br = load(ctx, BOTTOM_RIGHT);
  const uint64_t arrays[FJ_BM_NUM_ARRAYS] = {0x1000, 0x2000, 0x3000, 0x4000,
                                             0x5000, 0x6000, 0x7000, 0x8000};
  fj_block_mask_info info = {1, 1, 256, 512, 128, 128, 2, 4, 4096, 1024};
  fj_block_mask *m = NULL;
  assert_int_equal(fj_block_mask_wrap(ctx, &info, arrays, &m), FJ_OK);
  fj_block_mask_info back;
  assert_int_equal(fj_block_mask_get_info(m, &back), FJ_OK);
  assert_memory_equal(&back, &info, sizeof info);
  fjr_fwd_params_fixed fp;
  fjr_bwd_params_fixed bp;
  fjr_sizes sz = {2, 8, 2, 256, 512, 4096, 1024};
  assert_int_equal(fjr_block_mask_bind(ctx, m, &sz, 128, 128, &fp), FJ_OK);
  assert_int_equal(fjr_block_mask_bind_bwd(ctx, m, &sz, 64, 128, &bp), FJ_OK);
  sz.kv_off = 0;
  expect_refused(ctx, fjr_block_mask_bind(ctx, m, &sz, 128, 128, &fp), FJ_EINVAL,
                 "block mask is for q_offset 4096, kv_offset 1024");
  sz.kv_off = 1024, sz.q_off = 0;
  expect_refused(ctx, fjr_block_mask_bind_bwd(ctx, m, &sz, 64, 128, &bp), FJ_EINVAL,
                 "the launch has q_offset 0, kv_offset 1024");
  fj_block_mask_destroy(m);
  info.kv_offset = -1;
  m = NULL;
  expect_refused(ctx, fj_block_mask_wrap(ctx, &info, arrays, &m), FJ_EINVAL, "must be >= 0");
  assert_null(m);
  fj_block_mask_options o;
  fj_block_mask_options_init(&o);
  assert_int_equal(o.q_offset, 0);
  assert_int_equal(o.kv_offset, 0);
  o.q_len = 300, o.kv_len = 300, o.q_offset = 64;
  expect_refused(ctx, fj_block_mask_build(ctx, br, &o, &m), FJ_EUNSUPPORTED,
                 "reads the lengths Lq or Lk");
  o.q_offset = -3;
  expect_refused(ctx, fj_block_mask_build(ctx, br, &o, &m), FJ_EINVAL, "must be >= 0");
  assert_null(m);
  fj_spec_destroy(br);
  fj_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bind_fills_and_refuses),
      cmocka_unit_test(test_launches_refuse_before_the_device),
      cmocka_unit_test(test_block_mask_offsets),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
