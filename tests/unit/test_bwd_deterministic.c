/*
 * tests/unit/test_bwd_deterministic.c: the deterministic backward's host
 * side, through the public API, without a GPU (docs/backward.md).
 *
 * 1. fj_backward_workspace_size holds the semaphores after delta and
 *    dq_accum: one int32 per 16 query rows of every (batch, query head),
 *    enough for the query tiles of every backward configuration.
 * 2. fj_compile_backward with fj_kernel_options.deterministic compiles a
 *    kernel of its own (readable name ..._det, another key) for sm_80 and
 *    sm_90a, for masked (causal, sliding window), block-mask (document ids)
 *    and score_mod (softcap) specs; asked again, the same kernel.
 * 3. A spec with a trainable buffer is refused in deterministic mode, with
 *    a message naming the buffer, before anything touches a GPU.
 *
 * Part 2 needs NVRTC and skips without it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flexjit.h"
#include "gen/config.h"
#include "runtime/nvrtc.h"

static size_t round256(size_t n) { return (n + 255) / 256 * 256; }

static void test_workspace_size(void **state) {
  (void)state;
  /* delta 2*3*128 floats (a head's rows rounded up to 64), dq_accum times
   * D=64, the persistent kernel's tile counter, 2*3*ceil(100/16) = 42
   * semaphores and 1 + 2*3 conversion counters (ints), and room for the persistent kernel's
   * split tiles: 32 of dK and dV blocks of two consumers' 64 x D floats. */
  const size_t tail64 = 32 * 4 * 64 * 64 * 4, tail128 = 32 * 4 * 64 * 128 * 4;
  assert_int_equal(fj_backward_workspace_size(2, 3, 100, 64),
                   round256(768 * 4) + round256(768 * 64 * 4) + round256(50 * 4) + tail64);
  /* The semaphores' part grows with the query tiles: 16 rows each. */
  const int64_t B = 4, H = 32, D = 128;
  for (int64_t L = 1; L <= 4096; L = L * 3 + 1) {
    const size_t rows = (size_t)(B * H * ((L + 63) / 64 * 64));
    const size_t sems = 2 + (size_t)(B * H * ((L + 15) / 16 + 1));
    assert_int_equal(fj_backward_workspace_size(B, H, L, D),
                     round256(rows * 4) + round256(rows * D * 4) + round256(sems * 4) +
                         tail128);
  }
  assert_int_equal(fj_backward_workspace_size(0, 1, 1, 64), 0);
  assert_int_equal(fj_backward_workspace_size(1, 1, 0, 64), 0);
  /* Every backward configuration's query tiles are whole multiples of the
   * rows a semaphore is sized for. */
  static const char *archs[] = {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120"};
  for (size_t a = 0; a < sizeof archs / sizeof *archs; a++)
    for (int d = 64; d <= 128; d += 64) {
      fjg_config c;
      char err[256];
      if (fjg_config_choose_backward(d, FJ_DTYPE_BF16, archs[a], NULL, &c, err,
                                     sizeof err) != FJ_OK)
        fail_msg("%s D=%d: %s", archs[a], d, err);
      assert_int_equal(c.block_m % FJG_BWD_SEM_ROWS, 0);
    }
}

static int have_nvrtc(void) {
  char err[256];
  return fjr_nvrtc_load(NULL, &(const fjr_nvrtc *){NULL}, err, sizeof err) == FJ_OK;
}

static fj_context *context(void) {
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = ""; /* memory only */
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  return ctx;
}

static fj_spec *load(fj_context *ctx, const char *name, const char *src) {
  fj_spec *spec = NULL;
  if (fj_spec_load_string(ctx, src, strlen(src), name, &spec) != FJ_OK)
    fail_msg("%s: %s", name, fj_context_last_error(ctx));
  return spec;
}

static const char *const kSpecs[][2] = {
    {"causal", "return { mask_mod = causal() }"},
    {"sliding", "local window = param('window', 'i32')\n"
                "return { mask_mod = sliding_window(window) }"},
    {"document", "local doc = buffer('doc', 'i32')\n"
                 "return { mask_mod = and_masks(causal(), function(b, h, q, kv)\n"
                 "  return eq(doc[q], doc[kv]) end) }"},
    {"softcap", "return { mask_mod = causal(), score_mod = softcap(20.0) }"},
};

static void test_compile_keys(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  static const char *archs[] = {"sm_80", "sm_90a"};
  fj_context *ctx = context();
  for (size_t s = 0; s < sizeof kSpecs / sizeof kSpecs[0]; s++) {
    fj_spec *spec = load(ctx, kSpecs[s][0], kSpecs[s][1]);
    for (size_t a = 0; a < 2; a++) {
      fj_kernel_info plain, det, again;
      /* The sm80 template on both targets (the sm90 one's variant: below
       * and unit/test_bwd_compile). */
      fj_kernel_options ko = {.head_dim = s % 2 ? 64 : 128, .dtype = FJ_DTYPE_BF16,
                              .arch = archs[a], .kernel_template = "sm80"};
      if (fj_compile_backward(ctx, spec, &ko, &plain) != FJ_OK)
        fail_msg("%s %s: %s", kSpecs[s][0], archs[a], fj_context_last_error(ctx));
      ko.deterministic = 1;
      if (fj_compile_backward(ctx, spec, &ko, &det) != FJ_OK)
        fail_msg("%s %s deterministic: %s", kSpecs[s][0], archs[a],
                 fj_context_last_error(ctx));
      printf("  %-44s %s\n  %-44s %s (%.0f ms)\n", plain.name, plain.key, det.name, det.key,
             det.compile_ms);
      assert_string_not_equal(plain.key, det.key);
      assert_string_not_equal(plain.source_key, det.source_key);
      assert_int_equal(det.from_cache, 0);
      const size_t n = strlen(det.name);
      assert_true(n > 4 && strcmp(det.name + n - 4, "_det") == 0);
      assert_int_equal(strncmp(det.name, plain.name, strlen(plain.name)), 0);
      assert_null(strstr(plain.name, "_det"));
      /* The same options find the same kernel in the spec's table. */
      assert_int_equal(fj_compile_backward(ctx, spec, &ko, &again), FJ_OK);
      assert_string_equal(again.key, det.key);
      assert_int_equal(again.from_cache, 1);
    }
    /* On sm_90a deterministic mode takes sm90's one-tile kernel by itself
     * (the persistent one's tile order cannot wait in turn), and sm80's
     * when asked for. */
    fj_kernel_info info;
    fj_kernel_options ko = {.head_dim = 128, .dtype = FJ_DTYPE_BF16, .arch = "sm_90a",
                            .deterministic = 1};
    assert_int_equal(fj_compile_backward(ctx, spec, &ko, &info), FJ_OK);
    assert_non_null(strstr(info.name, "_sm90_"));
    assert_non_null(strstr(info.name, "_det"));
    ko.kernel_template = "sm80";
    assert_int_equal(fj_compile_backward(ctx, spec, &ko, &info), FJ_OK);
    assert_non_null(strstr(info.name, "_sm80_"));
    fj_spec_destroy(spec);
  }
  fj_context_destroy(ctx);
}

/* Trainable buffers' gradients have no fixed order: refused, by name,
 * before the tensors are looked at (no GPU needed). */
static void test_trainable_refused(void **state) {
  (void)state;
  fj_context *ctx = context();
  fj_spec *spec = load(ctx, "rel_bias",
                       "local bias = buffer('bias', 'f32', {grad = true})\n"
                       "return { mask_mod = causal(), score_mod = function(s, b, h, q, kv)\n"
                       "  return s + bias[min(max(q - kv, 0), 63)] end }");
  fj_backward_args ba;
  memset(&ba, 0, sizeof ba);
  ba.deterministic = 1;
  assert_int_equal(fj_attention_backward(ctx, spec, &ba), FJ_EUNSUPPORTED);
  const char *msg = fj_context_last_error(ctx);
  assert_non_null(strstr(msg, "deterministic"));
  assert_non_null(strstr(msg, "'bias'"));
  /* Without the mode the same call fails on its (missing) tensors. */
  ba.deterministic = 0;
  assert_int_equal(fj_attention_backward(ctx, spec, &ba), FJ_ETENSOR);
  fj_spec_destroy(spec);
  /* A spec without one gets past the mode's check to the tensors. */
  spec = load(ctx, "causal", kSpecs[0][1]);
  ba.deterministic = 1;
  assert_int_equal(fj_attention_backward(ctx, spec, &ba), FJ_ETENSOR);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_workspace_size),
      cmocka_unit_test(test_trainable_refused),
      cmocka_unit_test(test_compile_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
