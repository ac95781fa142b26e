/*
 * tests/unit/test_long_rows.c: the forward's long-row variant, without a
 * GPU: its configuration (gen/config.c), the host's estimate of a launch's
 * row length (fjr_mean_row_keys) against the exact mean over every row, the
 * launch's answer (fjr_forward_long_rows: sizes, params and its memo; 0,
 * with no estimate made, for a launch the variant may not serve), and which
 * kernels the variant applies to (its name and key).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "flexjit.h"
#include "gen/config.h"
#include "gen/eval.h"
#include "gen/graph.h"
#include "runtime/context_impl.h"
#include "runtime/forward.h"
#include "runtime/nvrtc.h"
#include "tests/unit/fake_tensors.h"

static const char CAUSAL[] = "return { mask_mod = causal() }";
static const char BOTTOM_RIGHT[] = "return { mask_mod = causal{ align = \"bottom_right\" } }";
static const char FULL[] = "return { score_mod = function(s, b, h, q, kv) return s end }";
static const char WINDOW[] = "return { mask_mod = sliding_window(param(\"window\", \"i32\")) }";
static const char SCALED[] =
    "return { mask_mod = causal(), score_mod = function(s, b, h, q, kv) return s * 0.5 end }";
static const char DOCUMENT[] = "return { mask_mod = document(buffer(\"doc\", \"i32\")) }";
static const char DOC_BIDIR[] =
    "return { mask_mod = document(buffer(\"doc\", \"i32\"), {causal = false}) }";

static fj_spec *load(fj_context *ctx, const char *src) {
  fj_spec *s = NULL;
  assert_int_equal(fj_spec_load_string(ctx, src, strlen(src), "long_rows", &s), FJ_OK);
  return s;
}

static void test_config(void **state) {
  (void)state;
  fjg_config c;
  assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, NULL, 0),
                   FJ_OK);
  fjg_config_set_persistent(&c, 1);
  assert_int_equal(fjg_config_set_long_rows(&c), 0);
  assert_int_equal(c.block_n, FJG_SM90_LONG_ROW_BLOCK_N);
  assert_int_equal(c.block_m, 128);
  assert_int_equal(c.persistent, 0);
  assert_int_equal(c.q_bufs, 1);
  /* Q and two stages of K and V, 176 rows each, within 227 KiB. */
  assert_true(c.smem_bytes >= (128 + 2 * 2 * 176) * 128 * 2);
  assert_true(c.smem_bytes <= 227 * 1024);

  /* No such variant at head dims 64 and 256, nor in the sm80 template. */
  const int dims[] = {64, 256};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(
        fjg_config_choose_template(dims[i], FJ_DTYPE_BF16, "sm_90a", "sm90", &c, NULL, 0), FJ_OK);
    const fjg_config before = c;
    assert_int_equal(fjg_config_set_long_rows(&c), -1);
    assert_memory_equal(&before, &c, sizeof c);
  }
  assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, "sm_80", "sm80", &c, NULL, 0),
                   FJ_OK);
  assert_int_equal(fjg_config_set_long_rows(&c), -1);
}

/* The exact mean of the keys a row may see, over every row (batch 0, head
 * 0), by the CPU evaluator. */
static double exact_mean(const fjg_graph *g, const fjg_env *env, int Lq, int Lk) {
  fjg_evaluator e;
  assert_int_equal(fjg_evaluator_init(&e, g, env), FJ_OK);
  double keys = 0;
  for (int q = 0; q < Lq; q++)
    for (int kv = 0; kv < Lk; kv++) keys += fjg_eval_mask_guess(&e, 0, 0, q, kv, NULL) != 0;
  fjg_evaluator_free(&e);
  return keys / Lq;
}

static int64_t estimate(fj_spec *s, int32_t window, int Lq, int Lk, double *exact) {
  const int32_t i32s[1] = {window};
  const float f32s[1] = {0};
  const fjg_env env = {.sizes = {1, 1, 1, Lq, Lk}, .param_i32 = i32s, .param_f32 = f32s};
  if (exact) *exact = exact_mean(s->graph, &env, Lq, Lk);
  return fjr_mean_row_keys(s->graph, &env, Lq, Lk);
}

/* The estimate lies within the exact mean minus a query block (four
 * sampled blocks of a causal mask stand for every row) and the mean plus
 * two kv chunks and a block (the sampled block's own rows, and the chunk a
 * row's end falls in), on masks whose rows grow (causal) or stay put
 * (window, bottom right, full); and the decisions the threshold makes at
 * the measured shapes. */
static void test_estimate(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  fj_spec *causal = load(ctx, CAUSAL), *br = load(ctx, BOTTOM_RIGHT), *full = load(ctx, FULL);
  fj_spec *window = load(ctx, WINDOW), *doc = load(ctx, DOCUMENT);
  const struct {
    fj_spec *s;
    int32_t window;
    int Lq, Lk;
  } cases[] = {{causal, 0, 1000, 1000},  {causal, 0, 4099, 4099}, {br, 0, 300, 5000},
               {full, 0, 777, 3001},     {window, 200, 3000, 3000}, {window, 1500, 2500, 2500}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double exact = 0;
    const int64_t est = estimate(cases[i].s, cases[i].window, cases[i].Lq, cases[i].Lk, &exact);
    const int chunk = cases[i].Lk / 32 > 128 ? (cases[i].Lk / 32 + 127) / 128 * 128 : 128;
    assert_true((double)est >= exact - 128);
    assert_true((double)est <= exact + 2 * chunk + 128);
  }
  /* The shapes measured on the H200 (bench/RESULTS.md, session 32). */
  assert_true(estimate(causal, 0, 16384, 16384, NULL) >= FJ_LONG_ROW_KEYS);
  assert_true(estimate(causal, 0, 8192, 8192, NULL) < FJ_LONG_ROW_KEYS);
  assert_true(estimate(full, 0, 16384, 16384, NULL) >= FJ_LONG_ROW_KEYS);
  assert_true(estimate(full, 0, 4096, 4096, NULL) < FJ_LONG_ROW_KEYS);
  assert_true(estimate(br, 0, 512, 16384, NULL) >= FJ_LONG_ROW_KEYS);
  assert_true(estimate(window, 1024, 16384, 16384, NULL) < FJ_LONG_ROW_KEYS);
  assert_true(estimate(window, 4096, 16384, 16384, NULL) < FJ_LONG_ROW_KEYS);
  /* A mask that reads a buffer: intervals see its index part alone (the
   * document mask's causal one). */
  assert_int_equal(estimate(doc, 0, 3000, 9000, NULL), estimate(causal, 0, 3000, 9000, NULL));
  /* Without the causal part, every key: gpu/test_forward's long-row case of
   * a buffer mask (129 x 9001). */
  fj_spec *bidir = load(ctx, DOC_BIDIR);
  assert_int_equal(estimate(bidir, 0, 129, 9001, NULL), estimate(full, 0, 129, 9001, NULL));
  assert_true(estimate(bidir, 0, 129, 9001, NULL) >= FJ_LONG_ROW_KEYS);
  fj_spec_destroy(bidir);
  fj_spec_destroy(causal), fj_spec_destroy(br), fj_spec_destroy(full);
  fj_spec_destroy(window), fj_spec_destroy(doc);
  fj_context_destroy(ctx);
}

/* The forward args of a dense launch of 2 x 16 heads, Lq x Lk at head dim D. */
typedef struct launch {
  fjt_dense t;
  fj_forward_args a;
} launch;

static void launch_init(launch *l, int64_t Lq, int64_t Lk, int64_t D) {
  fjt_dense_init(&l->t, 2, 16, 16, Lq, Lk, D);
  l->a = (fj_forward_args){.q = &l->t.q, .k = &l->t.k, .v = &l->t.v, .o = &l->t.o,
                           .lse = &l->t.lse};
}

static void test_launch_choice(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  fj_spec *causal = load(ctx, CAUSAL), *window = load(ctx, WINDOW), *scaled = load(ctx, SCALED);
  launch t;
  launch_init(&t, 16384, 16384, 128);
  assert_int_equal(fjr_forward_long_rows(ctx, causal, &t.a), 1);
  assert_int_equal(causal->long_rows_memo.valid, 1);
  assert_int_equal(fjr_forward_long_rows(ctx, causal, &t.a), 1); /* from the memo */

  /* A launch the variant may not serve asks for it no more than short rows
   * do, and makes no estimate: a score_mod, Skip Softmax. */
  assert_int_equal(fjr_forward_long_rows(ctx, scaled, &t.a), 0);
  assert_int_equal(scaled->long_rows_memo.valid, 0);
  t.a.skip_softmax_threshold = 1e-3f;
  assert_int_equal(fjr_forward_long_rows(ctx, causal, &t.a), 0);
  assert_string_equal(fj_context_last_error(ctx), ""); /* not refused: not served */
  t.a.skip_softmax_threshold = 0.f;

  /* Whether the head dim has the variant is the configuration's
   * (test_kernel_name): the launch asks. */
  launch d64;
  launch_init(&d64, 16384, 16384, 64);
  assert_int_equal(fjr_forward_long_rows(ctx, causal, &d64.a), 1);

  /* Shorter rows, then the long ones again (the memo follows the sizes). */
  launch s;
  launch_init(&s, 4096, 4096, 128);
  assert_int_equal(fjr_forward_long_rows(ctx, causal, &s.a), 0);
  assert_int_equal(fjr_forward_long_rows(ctx, causal, &t.a), 1);

  /* The params decide too: the memo follows their values. */
  fj_arg w = {.name = "window", .i32 = 1024};
  t.a.args = &w, t.a.num_args = 1;
  assert_int_equal(fjr_forward_long_rows(ctx, window, &t.a), 0);
  w.i32 = 16384;
  assert_int_equal(fjr_forward_long_rows(ctx, window, &t.a), 1);
  w.i32 = 1024;
  assert_int_equal(fjr_forward_long_rows(ctx, window, &t.a), 0);

  /* A launch the checks refuse is not this variant (the launch reports it). */
  t.a.num_args = 0;
  assert_int_equal(fjr_forward_long_rows(ctx, window, &t.a), 0);
  t.a.q = NULL;
  assert_int_equal(fjr_forward_long_rows(ctx, causal, &t.a), 0);
  fj_spec_destroy(causal), fj_spec_destroy(window), fj_spec_destroy(scaled);
  fj_context_destroy(ctx);
}

/* The key of spec's forward kernel under o, with and without long_rows. */
static void keys_of(fj_context *ctx, fj_spec *spec, fj_kernel_options o, fj_kernel_info *plain,
                    fj_kernel_info *longer) {
  o.long_rows = 0;
  assert_int_equal(fj_compile_forward(ctx, spec, &o, plain), FJ_OK);
  o.long_rows = 1;
  assert_int_equal(fj_compile_forward(ctx, spec, &o, longer), FJ_OK);
}

/* The variant's kernel has a name and key of its own; where it does not
 * apply, long_rows gives the same kernel as without (needs NVRTC). */
static void test_kernel_name(void **state) {
  (void)state;
  char err[512];
  if (fjr_nvrtc_load(NULL, &(const fjr_nvrtc *){NULL}, err, sizeof err) != FJ_OK) skip();
  fj_context *ctx = fjt_new_context();
  fj_spec *causal = load(ctx, CAUSAL), *scaled = load(ctx, SCALED);
  const fj_kernel_options o = {.head_dim = 128, .dtype = FJ_DTYPE_BF16, .arch = "sm_90a"};
  fj_kernel_info plain, longer;
  keys_of(ctx, causal, o, &plain, &longer);
  assert_string_equal(plain.name, "fj_fwd_long_rows_d128_bf16_sm90p_sm_90a");
  assert_string_equal(longer.name, "fj_fwd_long_rows_d128_bf16_sm90_n176_sm_90a");
  assert_string_not_equal(plain.key, longer.key);

  fj_kernel_options no[6] = {o, o, o, o, o, o};
  no[0].head_dim = 64;            /* no such variant */
  no[1].arch = "sm_80";           /* nor in the sm80 template */
  no[2].block_mask_block_q = 128; /* 128-key blocks are not whole tiles */
  no[3].varlen = 1;               /* paged boxes */
  no[4].skip_softmax = 1;
  for (int i = 0; i < 6; i++) {
    keys_of(ctx, i == 5 ? scaled : causal, no[i], &plain, &longer); /* 5: a score_mod */
    assert_string_equal(plain.key, longer.key);
    assert_null(strstr(longer.name, "_n176"));
  }
  fj_spec_destroy(causal), fj_spec_destroy(scaled);
  fj_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_estimate),
      cmocka_unit_test(test_launch_choice),
      cmocka_unit_test(test_kernel_name),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
