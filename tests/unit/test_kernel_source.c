/*
 * tests/unit/test_kernel_source.c: what reaches NVRTC (runtime/kernels.c).
 *
 * 1. No byte of a spec's text reaches the compiler except through its
 *    graph: specs that differ only in comments, strings and names (line
 *    splices, #include, #pragma, _Pragma, stray comment ends, bytes that are
 *    not UTF-8) emit a translation unit identical to the plain spec's, so
 *    they share its key and its cubin, and nothing they hold can change what
 *    another user of that key gets.
 * 2. --emit-cuda (fj_emit_forward_source) writes exactly the translation
 *    unit that fj_compile_forward compiles, banner and key included, under
 *    every setting that changes the configuration.
 *
 * Needs NVRTC for the compiles; the emit checks run without it. No GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flexjit.h"
#include "runtime/nvrtc.h"

static const char kPlain[] = "return { name = 'causal', mask_mod = causal() }\n";

/* Each holds kPlain's graph and something a hostile spec might try. */
static const char *const kHostile[] = {
    /* A backslash-newline splice ends a // or block comment early. */
    "--[[ *\\\n/\n#undef FJ_HAS_MASK\n#define FJ_HAS_MASK 0\n/* ]]\n"
    "return { name = 'causal', mask_mod = causal() }\n",
    "--[[ \\\n#include \"/etc/passwd\"\n]]\nreturn { mask_mod = causal() }\n",
    "-- */ #pragma nv_diag_suppress 177\nreturn { mask_mod = causal() }\n",
    "local s = '_Pragma(\"message(\\\"x\\\")\") */ /*'\n"
    "return { name = s, mask_mod = causal() }\n",
    "-- \xff\xfe non-UTF-8 \xc0\xaf and \xe2\x82\xac\n"
    "local unused = 'caus\xffl'\nreturn { mask_mod = causal() }\n",
    "return { name = '*/ #error injected /*', mask_mod = causal() }\n",
};

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static fj_context *context(void) {
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = ""; /* memory only */
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  return ctx;
}

static fj_spec *load(fj_context *ctx, const char *src) {
  fj_spec *spec = NULL;
  if (fj_spec_load_string(ctx, src, strlen(src), "hostile.lua", &spec) != FJ_OK)
    fail_msg("load: %s", fj_context_last_error(ctx));
  return spec;
}

/* The forward translation unit of src for sm_80, D=64, bf16. */
static char *emit(const char *src, size_t *len) {
  char path[] = "/tmp/fj-kernel-source-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  fj_context *ctx = context();
  fj_spec *spec = load(ctx, src);
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = "sm_80"};
  if (fj_emit_forward_source(ctx, spec, &ko, path) != FJ_OK)
    fail_msg("emit: %s", fj_context_last_error(ctx));
  char *text = read_all(path, len);
  unlink(path);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  return text;
}

static int have_nvrtc(void) {
  char err[256];
  return fjr_nvrtc_load(NULL, &(const fjr_nvrtc *){NULL}, err, sizeof err) == FJ_OK;
}

static void test_spec_text_never_reaches_cuda(void **state) {
  (void)state;
  size_t plain_len;
  char *plain = emit(kPlain, &plain_len);
  for (size_t i = 0; i < sizeof kHostile / sizeof kHostile[0]; i++) {
    size_t len;
    char *tu = emit(kHostile[i], &len);
    if (len != plain_len || memcmp(tu, plain, len) != 0)
      fail_msg("hostile spec %zu changed the translation unit", i);
    /* Nothing above 0x7e either: the unit is plain ASCII. */
    for (size_t j = 0; j < len; j++)
      if ((unsigned char)tu[j] > 0x7e) fail_msg("byte 0x%02x at %zu", tu[j] & 0xff, j);
    free(tu);
  }
  assert_null(strstr(plain, "passwd"));
  free(plain);
}

/* The hostile specs compile (a 0xff byte once made NVRTC fail with
 * "comment unclosed") to the plain spec's key. */
static void test_hostile_specs_compile_to_the_plain_key(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  fj_context *ctx = context();
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = "sm_80"};
  fj_spec *plain = load(ctx, kPlain);
  fj_kernel_info want, got;
  assert_int_equal(fj_compile_forward(ctx, plain, &ko, &want), FJ_OK);
  for (size_t i = 0; i < sizeof kHostile / sizeof kHostile[0]; i += 4) {
    fj_spec *spec = load(ctx, kHostile[i]);
    if (fj_compile_forward(ctx, spec, &ko, &got) != FJ_OK)
      fail_msg("hostile spec %zu: %s", i, fj_context_last_error(ctx));
    assert_string_equal(got.key, want.key);
    assert_int_equal(got.cubin_size, want.cubin_size);
    fj_spec_destroy(spec);
  }
  fj_spec_destroy(plain);
  fj_context_destroy(ctx);
}

/* The banner's source key of an emitted unit. */
static void banner_key(const char *tu, char out[33]) {
  const char *k = strstr(tu, "source key ");
  assert_non_null(k);
  assert_true(k < strchr(tu, '\n'));
  snprintf(out, 33, "%s", k + strlen("source key "));
}

/* fj_emit_forward_source writes what fj_compile_forward compiles, with its
 * key, also where the context's settings change the configuration
 * (FLEXJIT_CONSUMERS=2 turns D=64's 192-row sm90 tile into 128 rows). */
static void test_emit_writes_what_compiles(void **state) {
  (void)state;
  if (!have_nvrtc()) skip();
  static const struct {
    const char *env;
    const char *arch, *tmpl;
    const char *rows;
  } cases[] = {
      {NULL, "sm_80", "sm80", "#define FJ_BLOCK_M 128\n"},
      {NULL, "sm_90a", "sm90", "#define FJ_BLOCK_M 192\n"},
      {"2", "sm_90a", "sm90", "#define FJ_BLOCK_M 128\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].env) setenv("FLEXJIT_CONSUMERS", cases[i].env, 1);
    fj_context *ctx = context();
    unsetenv("FLEXJIT_CONSUMERS");
    fj_spec *spec = load(ctx, kPlain);
    fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16,
                            .arch = cases[i].arch, .kernel_template = cases[i].tmpl};
    char path[] = "/tmp/fj-kernel-source-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    fj_kernel_info info;
    if (fj_emit_forward_source(ctx, spec, &ko, path) != FJ_OK ||
        fj_compile_forward(ctx, spec, &ko, &info) != FJ_OK)
      fail_msg("case %zu: %s", i, fj_context_last_error(ctx));
    size_t len;
    char *tu = read_all(path, &len);
    unlink(path);
    char key[33];
    banner_key(tu, key);
    assert_string_equal(key, info.source_key);
    assert_non_null(strstr(tu, cases[i].rows));
    free(tu);
    fj_spec_destroy(spec);
    fj_context_destroy(ctx);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spec_text_never_reaches_cuda),
      cmocka_unit_test(test_hostile_specs_compile_to_the_plain_key),
      cmocka_unit_test(test_emit_writes_what_compiles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
