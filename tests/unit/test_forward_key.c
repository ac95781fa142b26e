/*
 * tests/unit/test_forward_key.c: the forward kernel's cache key as the
 * runtime derives it (runtime/kernels.c), through the public API.
 *
 * 1. Each ingredient a user can change (head dim, dtype, target, template,
 *    a constant of the spec, a param's type) gives a new key.
 * 2. The source key of a fixed spec is pinned, so that an accidental change
 *    of the key (key records, the emitted translation unit, configuration)
 *    is caught. It covers every byte of the unit, templates included: after
 *    a deliberate change of a template, the emitter or the key, run this
 *    test with FJ_PRINT_KEYS=1 and paste the printed value below.
 *
 * Needs NVRTC (keys come with a compile); skips without it. No GPU.
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
#include "runtime/nvrtc.h"

/* Source key of kPinnedSpec, sm_80, D=64, bf16, sm80 template. */
#define PINNED_SOURCE_KEY "4e4df9bcbd74730b96300b3bc53a246d"

static const char kPinnedSpec[] =
    "return { name = 'pinned', mask_mod = causal() }\n";

typedef struct variant {
  const char *what;
  const char *spec;
  int head_dim;
  fj_dtype dtype;
  const char *arch;
  const char *tmpl;
} variant;

/* block_q: fj_kernel_options.block_mask_block_q. */
static void key_of_bq(const variant *v, int block_q, fj_kernel_info *info) {
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = ""; /* memory only: every context compiles afresh */
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  assert_int_equal(
      fj_spec_load_string(ctx, v->spec, strlen(v->spec), "key.lua", &spec),
      FJ_OK);
  fj_kernel_options ko = {.head_dim = v->head_dim, .dtype = v->dtype,
                          .arch = v->arch, .kernel_template = v->tmpl,
                          .block_mask_block_q = block_q};
  if (fj_compile_forward(ctx, spec, &ko, info) != FJ_OK)
    fail_msg("%s: %s", v->what, fj_context_last_error(ctx));
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

static void key_of(const variant *v, fj_kernel_info *info) { key_of_bq(v, 0, info); }

static int have_nvrtc(void) {
  char err[256];
  return fjr_nvrtc_load(NULL, &(const fjr_nvrtc *){NULL}, err, sizeof err) == FJ_OK;
}

static void test_each_ingredient_changes_the_key(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  static const char window4[] =
      "return { mask_mod = sliding_window(4) }\n";
  static const char window5[] =
      "return { mask_mod = sliding_window(5) }\n";
  static const char param_i32[] =
      "local w = param('w', 'i32')\n"
      "return { mask_mod = function(b, h, q, kv) return lt(q - kv, w) end }\n";
  static const char param_f32[] =
      "local w = param('w', 'f32')\n"
      "return { mask_mod = function(b, h, q, kv) return lt(q - kv, w) end }\n";
  const variant base = {"base", window4, 64, FJ_DTYPE_BF16, "sm_80", "sm80"};
  variant vs[] = {
      base,
      {"head dim", window4, 128, FJ_DTYPE_BF16, "sm_80", "sm80"},
      {"dtype", window4, 64, FJ_DTYPE_F16, "sm_80", "sm80"},
      {"target", window4, 64, FJ_DTYPE_BF16, "sm_86", "sm80"},
      {"target a", window4, 64, FJ_DTYPE_BF16, "sm_90a", "sm80"},
      {"template", window4, 64, FJ_DTYPE_BF16, "sm_90a", "sm90"},
      {"constant", window5, 64, FJ_DTYPE_BF16, "sm_80", "sm80"},
      {"param i32", param_i32, 64, FJ_DTYPE_BF16, "sm_80", "sm80"},
      {"param f32", param_f32, 64, FJ_DTYPE_BF16, "sm_80", "sm80"},
  };
  enum { N = sizeof vs / sizeof vs[0] };
  fj_kernel_info info[N];
  for (int i = 0; i < N; i++) key_of(&vs[i], &info[i]);
  for (int i = 0; i < N; i++) {
    /* The full key adds the compiler to the source key. */
    assert_string_not_equal(info[i].key, info[i].source_key);
    for (int j = 0; j < i; j++)
      if (!strcmp(info[i].source_key, info[j].source_key))
        fail_msg("'%s' and '%s' share the key %s", vs[i].what, vs[j].what,
                 info[i].source_key);
  }
  /* The same inputs in a fresh context give the same key. */
  fj_kernel_info again;
  key_of(&base, &again);
  assert_string_equal(again.key, info[0].key);
  assert_string_equal(again.source_key, info[0].source_key);
}

/* The serving layouts' variant (fj_kernel_options.varlen: FJ_VARLEN) and
 * Skip Softmax's (skip_softmax: FJ_SKIP) have their own keys and names, on
 * both templates. */
static void test_serving_variant(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  static const char *const tmpl[][2] = {{"sm_80", "sm80"}, {"sm_90a", "sm90"}};
  for (int t = 0; t < 2; t++) {
    fj_context *ctx = NULL;
    fj_spec *spec = NULL;
    fj_context_options o;
    fj_context_options_init(&o);
    o.cache_dir = "";
    assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
    assert_int_equal(fj_spec_load_string(ctx, kPinnedSpec, strlen(kPinnedSpec), "k.lua", &spec),
                     FJ_OK);
    fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = tmpl[t][0],
                            .kernel_template = tmpl[t][1]};
    fj_kernel_info plain, serving;
    if (fj_compile_forward(ctx, spec, &ko, &plain) != FJ_OK)
      fail_msg("%s", fj_context_last_error(ctx));
    ko.varlen = 1;
    if (fj_compile_forward(ctx, spec, &ko, &serving) != FJ_OK)
      fail_msg("%s", fj_context_last_error(ctx));
    assert_string_not_equal(plain.source_key, serving.source_key);
    assert_null(strstr(plain.name, "_varlen"));
    assert_non_null(strstr(serving.name, "_varlen"));
    /* Skip Softmax's variant (FJ_SKIP) likewise. */
    fj_kernel_info skip;
    ko.varlen = 0, ko.skip_softmax = 1;
    if (fj_compile_forward(ctx, spec, &ko, &skip) != FJ_OK)
      fail_msg("%s", fj_context_last_error(ctx));
    assert_string_not_equal(plain.source_key, skip.source_key);
    assert_string_not_equal(serving.source_key, skip.source_key);
    assert_non_null(strstr(skip.name, "_skip"));
    fj_spec_destroy(spec);
    fj_context_destroy(ctx);
  }
}

/* FLEXJIT_KERNEL_DEFINES sets optional template macros (ablations) and is
 * part of the key; a malformed entry is refused with its text. */
static void test_kernel_defines(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  const variant v = {"sm90", kPinnedSpec, 64, FJ_DTYPE_BF16, "sm_90a",
                     "sm90"};
  fj_kernel_info plain, ablated;
  key_of(&v, &plain);
  setenv("FLEXJIT_KERNEL_DEFINES", " FJ_PINGPONG=0  FJ_INTRA_WG_OVERLAP=0", 1);
  key_of(&v, &ablated);
  assert_string_not_equal(plain.source_key, ablated.source_key);
  assert_int_equal(ablated.from_cache, 0);

  setenv("FLEXJIT_KERNEL_DEFINES", "FJ_OK=1 2BAD=3", 1);
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  assert_int_equal(fj_context_create(NULL, &ctx), FJ_OK);
  assert_int_equal(fj_spec_load_string(ctx, kPinnedSpec, strlen(kPinnedSpec),
                                       "k.lua", &spec),
                   FJ_OK);
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16,
                          .arch = "sm_80"};
  assert_int_equal(fj_compile_forward(ctx, spec, &ko, NULL), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "'2BAD=3'"));
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  unsetenv("FLEXJIT_KERNEL_DEFINES");
}

/* FLEXJIT_PERSISTENT=1 asks for the persistent sm90 kernel: its own key and
 * readable name; sm80 kernels ignore it. */
static void test_persistent(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  const variant v = {"sm90", kPinnedSpec, 64, FJ_DTYPE_BF16, "sm_90a", "sm90"};
  const variant v80 = {"sm80", kPinnedSpec, 64, FJ_DTYPE_BF16, "sm_80", "sm80"};
  fj_kernel_info plain, persistent, plain80, persistent80;
  key_of(&v, &plain);
  key_of(&v80, &plain80);
  setenv("FLEXJIT_PERSISTENT", "1", 1);
  key_of(&v, &persistent);
  key_of(&v80, &persistent80);
  unsetenv("FLEXJIT_PERSISTENT");
  assert_string_not_equal(plain.source_key, persistent.source_key);
  assert_non_null(strstr(persistent.name, "_sm90p_"));
  assert_null(strstr(plain.name, "_sm90p_"));
  assert_string_equal(plain80.source_key, persistent80.source_key);
}

/* Block masks' blocks must be whole tiles: at D=64, where the sm90 tile
 * has 192 rows, masks of 128-row blocks get the 128-row kernel (its own key
 * and name), masks of 192k-row blocks the default one; at D=128 the tile
 * has 128 rows either way. */
static void test_block_mask_rows(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  const variant d64 = {"d64", kPinnedSpec, 64, FJ_DTYPE_BF16, "sm_90a", "sm90"};
  const variant d128 = {"d128", kPinnedSpec, 128, FJ_DTYPE_BF16, "sm_90a", "sm90"};
  fj_kernel_info a, b, c, d, e;
  key_of(&d64, &a);
  key_of_bq(&d64, 128, &b);
  key_of_bq(&d64, 384, &c);
  key_of(&d128, &d);
  key_of_bq(&d128, 128, &e);
  assert_string_not_equal(a.source_key, b.source_key);
  assert_non_null(strstr(b.name, "_sm90_m128_"));
  assert_null(strstr(a.name, "_m128"));
  assert_string_equal(a.source_key, c.source_key);
  assert_string_equal(d.source_key, e.source_key);
  assert_null(strstr(d.name, "_m128"));
}

/* FLEXJIT_CONSUMERS=2 gives D=64 the 128-row kernel; 3 where it cannot
 * be (D=128, the persistent kernel, a block mask of 128-row blocks), or a
 * value neither 2 nor 3, is refused by name. */
static void test_consumers_env(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  const variant d64 = {"d64", kPinnedSpec, 64, FJ_DTYPE_BF16, "sm_90a", "sm90"};
  fj_kernel_info plain, two, masked;
  key_of(&d64, &plain);
  key_of_bq(&d64, 128, &masked);
  setenv("FLEXJIT_CONSUMERS", "2", 1);
  key_of(&d64, &two);
  assert_string_equal(two.source_key, masked.source_key);
  assert_string_not_equal(two.source_key, plain.source_key);
  /* value, head dim, FLEXJIT_PERSISTENT, block mask's block_q */
  static const char *const bad[][4] = {{"3", "128", "", "0"},  {"x", "64", "", "0"},
                                       {"4", "64", "", "0"},   {"3", "64", "1", "0"},
                                       {"3", "64", "", "128"}};
  for (int i = 0; i < 5; i++) {
    setenv("FLEXJIT_CONSUMERS", bad[i][0], 1);
    if (bad[i][2][0]) setenv("FLEXJIT_PERSISTENT", bad[i][2], 1);
    fj_context *ctx = NULL;
    fj_spec *spec = NULL;
    assert_int_equal(fj_context_create(NULL, &ctx), FJ_OK);
    /* The context read the variable; the message names what it read. */
    setenv("FLEXJIT_CONSUMERS", "changed", 1);
    unsetenv("FLEXJIT_PERSISTENT");
    assert_int_equal(fj_spec_load_string(ctx, kPinnedSpec, strlen(kPinnedSpec), "k.lua",
                                         &spec), FJ_OK);
    fj_kernel_options ko = {.head_dim = atoi(bad[i][1]), .dtype = FJ_DTYPE_BF16,
                            .arch = "sm_90a", .kernel_template = "sm90",
                            .block_mask_block_q = atoi(bad[i][3])};
    /* A value that is not 2 or 3 is malformed; the others do not fit. */
    const int malformed = i == 1 || i == 2;
    assert_int_equal(fj_compile_forward(ctx, spec, &ko, NULL),
                     malformed ? FJ_EINVAL : FJ_EUNSUPPORTED);
    char want[64];
    snprintf(want, sizeof want, "FLEXJIT_CONSUMERS=%s:", bad[i][0]);
    assert_non_null(strstr(fj_context_last_error(ctx), want));
    fj_spec_destroy(spec);
    fj_context_destroy(ctx);
  }
  unsetenv("FLEXJIT_CONSUMERS");
}

/* FLEXJIT_FAST_COMPILE=1 compiles with NVRTC's --Ofast-compile=max: its
 * own key, so a fast-compiled kernel never stands in for an optimized one. */
static void test_fast_compile(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  const variant v = {"sm80", kPinnedSpec, 64, FJ_DTYPE_BF16, "sm_80", "sm80"};
  fj_kernel_info plain, fast;
  key_of(&v, &plain);
  setenv("FLEXJIT_FAST_COMPILE", "1", 1);
  key_of(&v, &fast);
  unsetenv("FLEXJIT_FAST_COMPILE");
  assert_string_not_equal(plain.source_key, fast.source_key);
  assert_string_not_equal(plain.key, fast.key);
  assert_int_equal(fast.from_cache, 0);
}

static void test_pinned_key(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  const variant v = {"pinned", kPinnedSpec, 64, FJ_DTYPE_BF16, "sm_80",
                     "sm80"};
  fj_kernel_info info;
  key_of(&v, &info);
  if (getenv("FJ_PRINT_KEYS"))
    printf("pinned source key: %s\n", info.source_key);
  if (strcmp(info.source_key, PINNED_SOURCE_KEY) != 0)
    fail_msg("the source key of a fixed spec changed: %s, pinned %s.\n"
             "If a template, the key records or the configuration changed on "
             "purpose, rerun with FJ_PRINT_KEYS=1 and update PINNED_SOURCE_KEY "
             "in %s; otherwise something changed the key by accident.",
             info.source_key, PINNED_SOURCE_KEY, __FILE__);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_ingredient_changes_the_key),
      cmocka_unit_test(test_serving_variant),
      cmocka_unit_test(test_kernel_defines),
      cmocka_unit_test(test_persistent),
      cmocka_unit_test(test_fast_compile),
      cmocka_unit_test(test_block_mask_rows),
      cmocka_unit_test(test_consumers_env),
      cmocka_unit_test(test_pinned_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
