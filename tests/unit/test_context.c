/*
 * tests/unit/test_context.c: the public API without a GPU: contexts, spec
 * loading and its errors, argument introspection, compiling for a named
 * target, and fj_attention_forward's checks of bad tensors and arguments
 * (all made before the device is touched, so each must name the problem).
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
#include "tests/unit/fake_tensors.h"

static const char window_spec[] =
    "local window = param('window', 'i32')\n"
    "local doc = buffer('doc', 'i32')\n"
    "return { name = 'win', mask_mod = and_masks(sliding_window(window),\n"
    "  function(b, h, q, kv) return eq(doc[q], doc[kv]) end) }\n";

static fj_context *new_context(void) {
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = ""; /* memory only */
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  return ctx;
}

static void test_status_table(void **state) {
  (void)state;
  assert_string_equal(fj_status_name(FJ_OK), "FJ_OK");
  assert_string_equal(fj_status_name(FJ_ETENSOR), "FJ_ETENSOR");
  assert_string_equal(fj_status_name((fj_status)-999), "FJ_UNKNOWN");
  assert_string_equal(fj_strerror(FJ_ENONVRTC), "NVRTC not available");
  assert_string_equal(fj_version_string(), FJ_VERSION_STRING);
  assert_int_equal(fj_version_number(), FJ_VERSION_NUMBER);
  fj_context_destroy(NULL);
  fj_spec_destroy(NULL);
}

/* window_spec, loaded (the load must succeed). */
static fj_spec *load_window(fj_context *ctx) {
  fj_spec *spec = NULL;
  assert_int_equal(fj_spec_load_string(ctx, window_spec, strlen(window_spec),
                                       "win.lua", &spec),
                   FJ_OK);
  return spec;
}

static void test_spec_errors_name_the_line(void **state) {
  (void)state;
  fj_context *ctx = new_context();
  fj_spec *spec = NULL;
  const char bad[] = "return {\n  mask_mod = function(b, h, q, kv)\n"
                     "    return q < kv\n  end }\n";
  assert_int_equal(fj_spec_load_string(ctx, bad, strlen(bad), "bad.lua", &spec),
                   FJ_ELUA);
  assert_null(spec);
  assert_non_null(strstr(fj_context_last_error(ctx), "bad.lua:3:"));
  assert_non_null(strstr(fj_context_last_error(ctx), "lt("));
  assert_int_equal(fj_spec_load_file(ctx, "/nonexistent/spec.lua", &spec),
                   FJ_EIO);
  assert_non_null(strstr(fj_context_last_error(ctx), "/nonexistent/spec.lua"));
  fj_context_destroy(ctx);
}

static void test_arg_introspection(void **state) {
  (void)state;
  fj_context *ctx = new_context();
  fj_spec *spec = load_window(ctx);
  assert_string_equal(fj_spec_name(spec), "win");
  assert_int_equal(fj_spec_num_args(spec), 2);
  const char *name;
  fj_arg_kind kind;
  DLDataType dt;
  assert_int_equal(fj_spec_arg_info(spec, 0, &name, &kind), FJ_OK);
  assert_string_equal(name, "window");
  assert_int_equal(kind, FJ_ARG_I32);
  assert_int_equal(fj_spec_arg_info(spec, 1, &name, &kind), FJ_OK);
  assert_string_equal(name, "doc");
  assert_int_equal(kind, FJ_ARG_BUFFER);
  assert_int_equal(fj_spec_arg_dtype(spec, 1, &dt), FJ_OK);
  assert_int_equal(dt.code, kDLInt);
  assert_int_equal(dt.bits, 32);
  assert_int_equal(fj_spec_arg_info(spec, 2, &name, &kind), FJ_EINVAL);
  assert_int_equal(fj_spec_arg_dtype(spec, -1, &dt), FJ_EINVAL);
  assert_int_equal(fj_spec_mask_deps(spec), FJ_MASK_READS_BUFFER); /* doc[q] == doc[kv] */
  int trainable = -1;
  assert_int_equal(fj_spec_arg_trainable(spec, 1, &trainable), FJ_OK);
  assert_int_equal(trainable, 0);
  assert_int_equal(fj_spec_arg_trainable(spec, 2, &trainable), FJ_EINVAL);
  fj_spec_destroy(spec);

  /* A trainable bias after a plain param: only the bias says so. */
  const char biased[] = "local s = param('s', 'f32')\n"
                        "local bias = buffer('bias', 'f32', {grad = true})\n"
                        "return { score_mod = function(score, b, h, q, kv)\n"
                        "  return score * s + bias[kv] end }\n";
  assert_int_equal(fj_spec_load_string(ctx, biased, strlen(biased), "bias.lua", &spec),
                   FJ_OK);
  assert_int_equal(fj_spec_arg_trainable(spec, 0, &trainable), FJ_OK);
  assert_int_equal(trainable, 0);
  assert_int_equal(fj_spec_arg_trainable(spec, 1, &trainable), FJ_OK);
  assert_int_equal(trainable, 1);
  assert_int_equal(fj_spec_arg_trainable(spec, 1, NULL), FJ_EINVAL);
  assert_int_equal(fj_spec_mask_deps(spec), 0); /* no mask_mod */
  fj_spec_destroy(spec);
  /* A buffer read by the score_mod only: the mask is index-only. */
  const char alibi[] = "local slope = buffer('slope', 'f32')\n"
                       "return { mask_mod = causal(), score_mod = function(s, b, h, q, kv)\n"
                       "  return s + slope[h] * (kv - q) end }\n";
  assert_int_equal(fj_spec_load_string(ctx, alibi, strlen(alibi), "alibi.lua", &spec), FJ_OK);
  assert_int_equal(fj_spec_mask_deps(spec), 0);
  fj_spec_destroy(spec);
  /* Per-head document ids: a buffer, read at h. */
  const char perhead[] = "local doc = buffer('doc', 'i32')\n"
                         "return { mask_mod = function(b, h, q, kv)\n"
                         "  return eq(doc[h * 4096 + q], doc[h * 4096 + kv]) end }\n";
  assert_int_equal(fj_spec_load_string(ctx, perhead, strlen(perhead), "ph.lua", &spec), FJ_OK);
  assert_int_equal(fj_spec_mask_deps(spec), FJ_MASK_READS_BUFFER | FJ_MASK_READS_H);
  fj_spec_destroy(spec);
  assert_int_equal(fj_spec_mask_deps(NULL), 0u);
  fj_context_destroy(ctx);
}

static void test_compile_options(void **state) {
  (void)state;
  fj_context *ctx = new_context();
  fj_spec *spec = load_window(ctx);
  fj_kernel_options ko = {.head_dim = 96, .dtype = FJ_DTYPE_BF16,
                          .arch = "sm_80"};
  assert_int_equal(fj_compile_forward(ctx, spec, &ko, NULL), FJ_EUNSUPPORTED);
  assert_non_null(strstr(fj_context_last_error(ctx), "96"));
  ko.head_dim = 64;
  ko.arch = "sm_70";
  assert_int_not_equal(fj_compile_forward(ctx, spec, &ko, NULL), FJ_OK);
  assert_non_null(strstr(fj_context_last_error(ctx), "sm_70"));
  ko.arch = "sm_80";
  ko.kernel_template = "sm90"; /* needs sm_90a */
  assert_int_not_equal(fj_compile_forward(ctx, spec, &ko, NULL), FJ_OK);
  assert_non_null(strstr(fj_context_last_error(ctx), "sm_90a"));
  ko.kernel_template = "sm42";
  assert_int_not_equal(fj_compile_forward(ctx, spec, &ko, NULL), FJ_OK);
  assert_non_null(strstr(fj_context_last_error(ctx), "sm42"));
  /* Target names are checked before anything is compiled: the "a" suffix
   * exists from sm_90, "f" from sm_100. */
  ko.kernel_template = NULL;
  static const char *const bad_arch[] = {"sm_80a", "sm_90f", "sm_8", "sm_1000",
                                         "sm_90ab", "compute_90", "sm_90 "};
  for (size_t i = 0; i < sizeof bad_arch / sizeof bad_arch[0]; i++) {
    ko.arch = bad_arch[i];
    assert_int_equal(fj_compile_forward(ctx, spec, &ko, NULL), FJ_EINVAL);
    assert_non_null(strstr(fj_context_last_error(ctx), "invalid architecture"));
  }
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

/* A target NVRTC does not compile for is refused by name, not inside
 * NVRTC; a bad context option names itself at the first kernel request. */
static void test_unknown_targets(void **state) {
  (void)state;
  fj_context *ctx = new_context();
  fj_spec *spec = load_window(ctx);
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = "sm_999"};
  fj_status st = fj_compile_forward(ctx, spec, &ko, NULL);
  if (st != FJ_ENONVRTC) {
    assert_int_equal(st, FJ_EUNSUPPORTED);
    assert_non_null(strstr(fj_context_last_error(ctx), "does not compile for sm_999"));
  }
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = "";
  o.arch = "sm_80a";
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  spec = load_window(ctx);
  ko.arch = NULL;
  assert_int_equal(fj_compile_forward(ctx, spec, &ko, NULL), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "'sm_80a'"));
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

/* The environment is read once, when a context is created: a bad value
 * is reported by name at the first kernel request (not when the context
 * is made, which has no context to hold a message), and changing the
 * variable afterwards changes nothing. */
static void test_environment_read_at_creation(void **state) {
  (void)state;
  static const struct {
    const char *name, *value, *text;
  } bad[] = {
      {"FLEXJIT_STAGES", "x", "FLEXJIT_STAGES=x"},
      {"FLEXJIT_PERSISTENT", "yes", "FLEXJIT_PERSISTENT=yes"},
      {"FLEXJIT_FAST_COMPILE", "2", "FLEXJIT_FAST_COMPILE=2"},
      {"FLEXJIT_TEMPLATE", "sm42", "sm42"},
      {"FLEXJIT_CACHE_MAX_BYTES", "lots", "FLEXJIT_CACHE_MAX_BYTES=lots"},
      {"FLEXJIT_PACKS", "/nonexistent/kernels.fjpack", "/nonexistent/kernels.fjpack"},
  };
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = "sm_80"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv(bad[i].name, bad[i].value, 1);
    fj_context *ctx = new_context();
    unsetenv(bad[i].name);
    fj_spec *spec = load_window(ctx);
    fj_status st = fj_compile_forward(ctx, spec, &ko, NULL);
    if (st == FJ_OK || !strstr(fj_context_last_error(ctx), bad[i].text))
      fail_msg("%s=%s: %s: %s", bad[i].name, bad[i].value, fj_status_name(st),
               fj_context_last_error(ctx));
    fj_spec_destroy(spec);
    fj_context_destroy(ctx);
  }
}

/* ---- tensor checks ---- */

/* 2 x 8 x 100 x 128 queries over 2 x 2 x 90 x 128 keys, afresh. */
static void good_tensors(fjt_dense *t) { fjt_dense_init(t, 2, 8, 2, 100, 90, 128); }

/* Launches with one thing broken; expects `status` and `text` in the error. */
static void expect_bad_ws(fj_context *ctx, fj_spec *spec, fjt_dense *t,
                          const fj_arg *args, int nargs, void *workspace,
                          size_t workspace_bytes, fj_status status, const char *text) {
  fj_forward_args a = {.q = &t->q, .k = &t->k, .v = &t->v, .o = &t->o, .lse = &t->lse,
                       .args = args, .num_args = nargs, .workspace = workspace,
                       .workspace_bytes = workspace_bytes};
  fj_status st = fj_attention_forward(ctx, spec, &a);
  if (st != status || !strstr(fj_context_last_error(ctx), text))
    fail_msg("expected %s with '%s', got %s: %s", fj_status_name(status),
             text, fj_status_name(st), fj_context_last_error(ctx));
}

static void expect_bad(fj_context *ctx, fj_spec *spec, fjt_dense *t,
                       const fj_arg *args, int nargs, fj_status status,
                       const char *text) {
  expect_bad_ws(ctx, spec, t, args, nargs, NULL, 0, status, text);
}

static void test_forward_rejects_bad_input(void **state) {
  (void)state;
  fj_context *ctx = new_context();
  fj_spec *spec = load_window(ctx);
  int64_t doc_shape[1] = {100};
  DLTensor doc = fjt_tensor(doc_shape, 1, (DLDataType){kDLInt, 32, 1}, 0x60000);
  fj_arg args[2] = {{.name = "window", .i32 = 16}, {.name = "doc", .buffer = &doc}};
  fjt_dense t;

  good_tensors(&t);
  t.q.dtype = (DLDataType){kDLFloat, 32, 1};
  expect_bad(ctx, spec, &t, args, 2, FJ_ETENSOR, "not supported");

  good_tensors(&t);
  t.ks[3] = 64;
  expect_bad(ctx, spec, &t, args, 2, FJ_ETENSOR, "k: shape");

  good_tensors(&t);
  t.qs[3] = 96; /* q and o */
  expect_bad(ctx, spec, &t, args, 2, FJ_EUNSUPPORTED, "head dim 96");

  good_tensors(&t);
  t.ks[1] = 3; /* 8 query heads over 3 kv heads */
  expect_bad(ctx, spec, &t, args, 2, FJ_ETENSOR, "multiple");

  good_tensors(&t);
  t.o.device.device_type = kDLCPU;
  expect_bad(ctx, spec, &t, args, 2, FJ_ETENSOR, "o: tensor is not on a CUDA");

  good_tensors(&t);
  int64_t bad_strides[4] = {2 * 8 * 100 * 128, 100 * 128, 128, 2};
  t.q.strides = bad_strides;
  expect_bad(ctx, spec, &t, args, 2, FJ_ETENSOR, "last dimension");

  good_tensors(&t);
  t.v.data = (void *)0x30008;
  expect_bad(ctx, spec, &t, args, 2, FJ_ETENSOR, "16-byte aligned");

  good_tensors(&t);
  t.ls[2] = 99;
  expect_bad(ctx, spec, &t, args, 2, FJ_ETENSOR, "lse: shape");

  good_tensors(&t);
  expect_bad(ctx, spec, &t, args, 1, FJ_EINVAL, "buffer 'doc'");

  good_tensors(&t);
  fj_arg unknown[3] = {args[0], args[1], {.name = "widow", .i32 = 3}};
  expect_bad(ctx, spec, &t, unknown, 3, FJ_EINVAL, "'widow'");

  good_tensors(&t);
  DLTensor doc_f = fjt_tensor(doc_shape, 1, (DLDataType){kDLFloat, 32, 1}, 0x60000);
  fj_arg wrong_type[2] = {args[0], {.name = "doc", .buffer = &doc_f}};
  expect_bad(ctx, spec, &t, wrong_type, 2, FJ_ETENSOR, "buffer 'doc': dtype");

  /* A caller's workspace: 256-byte aligned and large enough. */
  const size_t ws = fj_forward_workspace_size(2, 8, 100, 128);
  assert_true(ws > 0);
  good_tensors(&t);
  expect_bad_ws(ctx, spec, &t, args, 2, (void *)0x70010, ws, FJ_EINVAL, "256-byte aligned");
  good_tensors(&t);
  expect_bad_ws(ctx, spec, &t, args, 2, (void *)0x70000, ws - 1, FJ_EINVAL, "workspace");

  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_table),
      cmocka_unit_test(test_spec_errors_name_the_line),
      cmocka_unit_test(test_arg_introspection),
      cmocka_unit_test(test_compile_options),
      cmocka_unit_test(test_unknown_targets),
      cmocka_unit_test(test_environment_read_at_creation),
      cmocka_unit_test(test_forward_rejects_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
