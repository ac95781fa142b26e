/*
 * tests/unit/test_nvrtc.c: NVRTC loading and compilation (runtime/nvrtc.c).
 * Needs NVRTC but no GPU; the compile tests skip when NVRTC is missing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/nvrtc.h"

static const char *const good_source =
    "extern \"C\" __global__ void fj_add_one(float *x, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) x[i] += 1.0f;\n"
    "}\n";

static const char *const bad_source =
    "extern \"C\" __global__ void fj_broken(float *x) {\n"
    "  x[0] = undefined_name;\n"
    "}\n";

static const fjr_nvrtc *nv;

static void skip_without_nvrtc(void) {
  char err[512];
  if (fjr_nvrtc_load(NULL, &nv, err, sizeof err) != FJ_OK) {
    print_message("NVRTC unavailable, skipping: %s\n", err);
    skip();
  }
}

static void test_version(void **state) {
  (void)state;
  int major = 0, minor = -1;
  char err[512] = "x";
  skip_without_nvrtc();
  assert_int_equal(fjr_nvrtc_load(NULL, &nv, err, sizeof err), FJ_OK);
  assert_string_equal(err, "");
  fjr_nvrtc_version(nv, &major, &minor);
  assert_true(major >= 12);
  assert_true(minor >= 0);
  /* The targets the templates need, and none below them. */
  assert_true(fjr_nvrtc_supports(nv, 80));
  assert_true(fjr_nvrtc_supports(nv, 90));
  assert_false(fjr_nvrtc_supports(nv, 999));
}

static void test_base_options(void **state) {
  (void)state;
  int n = 0;
  const char *const *opts = fjr_nvrtc_base_options(&n);
  assert_int_equal(n, 2);
  assert_string_equal(opts[0], "-std=c++17");
  assert_string_equal(opts[1], "-default-device");
  assert_non_null(fjr_nvrtc_base_options(NULL));
}

static void compile_good(const char *arch) {
  int n = 0;
  const char *const *opts = fjr_nvrtc_base_options(&n);
  void *cubin = NULL;
  size_t size = 0;
  char *log = (char *)1;
  char err[512];
  fj_status st = fjr_nvrtc_compile(nv, good_source, "add_one.cu", arch, opts, n,
                                   &cubin, &size, &log, err, sizeof err);
  if (st != FJ_OK)
    print_message("%s: %s\n%s\n", arch, err, log ? log : "");
  assert_int_equal(st, FJ_OK);
  assert_non_null(cubin);
  assert_true(size > 64);
  /* A cubin is an ELF image, not PTX text. */
  assert_memory_equal(cubin, "\x7f" "ELF", 4);
  assert_true(log == NULL || log != (char *)1);
  free(log);
  free(cubin);
}

static void test_compile_sm80(void **state) {
  (void)state;
  skip_without_nvrtc();
  compile_good("sm_80");
}

static void test_compile_sm90a(void **state) {
  (void)state;
  skip_without_nvrtc();
  compile_good("sm_90a");
}

static void test_compile_without_log_or_options(void **state) {
  (void)state;
  void *cubin = NULL;
  size_t size = 0;
  skip_without_nvrtc();
  /* No extra options at all: plain C++ kernels still compile. */
  assert_int_equal(fjr_nvrtc_compile(nv, good_source, NULL, "sm_80", NULL, 0,
                                     &cubin, &size, NULL, NULL, 0),
                   FJ_OK);
  assert_non_null(cubin);
  free(cubin);
}

static void test_compile_error_has_log(void **state) {
  (void)state;
  void *cubin = (void *)1;
  size_t size = 1;
  char *log = NULL;
  char err[512];
  skip_without_nvrtc();
  assert_int_equal(fjr_nvrtc_compile(nv, bad_source, "broken.cu", "sm_80", NULL,
                                     0, &cubin, &size, &log, err, sizeof err),
                   FJ_ECOMPILE);
  assert_null(cubin);
  assert_int_equal(size, 0);
  assert_non_null(log);
  assert_non_null(strstr(log, "undefined_name"));
  /* One line: what failed, for which target, and the first error. */
  assert_non_null(strstr(err, "broken.cu"));
  assert_non_null(strstr(err, "sm_80"));
  assert_non_null(strstr(err, "undefined_name"));
  assert_null(strchr(err, '\n'));
  free(log);
}

static void test_bad_option(void **state) {
  (void)state;
  const char *opts[] = {"--no-such-option"};
  void *cubin = NULL;
  size_t size = 0;
  char err[512];
  skip_without_nvrtc();
  assert_int_equal(fjr_nvrtc_compile(nv, good_source, "k.cu", "sm_80", opts, 1,
                                     &cubin, &size, NULL, err, sizeof err),
                   FJ_ECOMPILE);
  assert_null(cubin);
  assert_non_null(strstr(err, "NVRTC_ERROR_INVALID_OPTION"));
}

static void test_virtual_arch_rejected(void **state) {
  (void)state;
  void *cubin = NULL;
  size_t size = 0;
  char err[512];
  const char *bad[] = {"compute_90", "sm_", "sm_90a;rm", "90", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(fjr_nvrtc_compile(nv, good_source, "k.cu", bad[i], NULL, 0,
                                       &cubin, &size, NULL, err, sizeof err),
                     FJ_EINVAL);
    assert_null(cubin);
  }
  assert_non_null(strstr(err, "real GPU architecture"));
}

/* A library that does not load, or is not NVRTC, leaves NVRTC unavailable
 * with a message naming it; the failure is remembered, and compiling
 * without a table fails the same way. */
static void expect_unavailable(const char *lib, const char *text) {
  char err[1024];
  void *cubin = NULL;
  size_t size = 0;
  const fjr_nvrtc *none = (const fjr_nvrtc *)1;
  for (int i = 0; i < 2; i++) {
    assert_int_equal(fjr_nvrtc_load(lib, &none, err, sizeof err), FJ_ENONVRTC);
    assert_null(none);
    assert_non_null(strstr(err, text));
  }
  assert_int_equal(fjr_nvrtc_compile(NULL, good_source, "k.cu", "sm_80", NULL, 0,
                                     &cubin, &size, NULL, err, sizeof err),
                   FJ_ENONVRTC);
  assert_null(cubin);
}

static void test_env_names_missing_library(void **state) {
  (void)state;
  expect_unavailable("/nonexistent/libnvrtc.so", "FLEXJIT_NVRTC");
}

static void test_env_names_wrong_library(void **state) {
  (void)state;
  /* Loads, but is not NVRTC. */
  expect_unavailable("libm.so.6", "libm.so.6 lacks nvrtc");
}

/* The spill count the sm90 compile reads (runtime/forward.c, refit_spilling). */
static void test_log_spill_bytes(void **state) {
  (void)state;
  assert_int_equal(fjr_nvrtc_log_spill_bytes(NULL), 0);
  assert_int_equal(fjr_nvrtc_log_spill_bytes("no report here\n"), 0);
  const char *clean =
      "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
      "ptxas info    : Function properties for k\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
  assert_int_equal(fjr_nvrtc_log_spill_bytes(clean), 0);
  const char *spilled =
      "ptxas info    : Function properties for a\n"
      "    16 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads\n"
      "ptxas info    : Function properties for b\n"
      "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n";
  assert_int_equal(fjr_nvrtc_log_spill_bytes(spilled), 44);
  assert_int_equal(fjr_nvrtc_log_spill_bytes("x, many bytes spill stores\n"), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      /* The fork tests first: their children must not inherit a loaded
       * NVRTC (harmless, but it would not exercise the load path). */
      cmocka_unit_test(test_log_spill_bytes),
      cmocka_unit_test(test_env_names_missing_library),
      cmocka_unit_test(test_env_names_wrong_library),
      cmocka_unit_test(test_base_options),
      cmocka_unit_test(test_virtual_arch_rejected),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_compile_sm80),
      cmocka_unit_test(test_compile_sm90a),
      cmocka_unit_test(test_compile_without_log_or_options),
      cmocka_unit_test(test_compile_error_has_log),
      cmocka_unit_test(test_bad_option),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
