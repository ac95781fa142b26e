/*
 * tests/unit/test_npy.c: the CLI's .npy reader and writer (cli/npy.c, which
 * is part of the flexjit executable, not the library, so it is compiled in
 * here directly).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/npy.c"

static char tmpdir[256];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "%s/test_npy.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp_path(const char *name) {
  static char p[400];
  snprintf(p, sizeof p, "%s/%s", tmpdir, name);
  return p;
}

/* Writes magic, version, a header dict (padded to 64) and raw data. */
static void write_raw(const char *path, int major, const char *dict,
                      const void *data, size_t bytes) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  size_t pre = major == 1 ? 10 : 12, n = strlen(dict);
  size_t len = n + 1 + (64 - (pre + n + 1) % 64) % 64;
  unsigned char head[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)major,
                            0};
  head[8] = (unsigned char)len, head[9] = (unsigned char)(len >> 8);
  fwrite(head, 1, pre, f);
  fwrite(dict, 1, n, f);
  for (size_t i = n; i + 1 < len; i++) fputc(' ', f);
  fputc('\n', f);
  if (bytes) fwrite(data, 1, bytes, f);
  fclose(f);
}

static void test_roundtrip_f32(void **state) {
  (void)state;
  float x[2 * 3 * 4];
  int64_t shape[3] = {2, 3, 4};
  char err[256];
  for (int i = 0; i < 24; i++) x[i] = 0.5f * i - 3;
  const char *p = tmp_path("a.npy");
  assert_int_equal(npy_write(p, NPY_F32, x, 3, shape, err, sizeof err), 0);
  npy_array a;
  assert_int_equal(npy_read(p, &a, err, sizeof err), 0);
  assert_int_equal(a.dtype, NPY_F32);
  assert_int_equal(a.ndim, 3);
  assert_int_equal(a.shape[0], 2);
  assert_int_equal(a.shape[1], 3);
  assert_int_equal(a.shape[2], 4);
  assert_int_equal(a.count, 24);
  assert_memory_equal(a.data, x, sizeof x);
  npy_free(&a);
  /* Data starts on a 64-byte boundary, as NumPy writes it. */
  FILE *f = fopen(p, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  assert_int_equal((size - (long)sizeof x) % 64, 0);
}

static void test_roundtrip_i32_1d(void **state) {
  (void)state;
  int32_t x[5] = {0, 0, 1, 1, 7};
  int64_t shape[1] = {5};
  char err[256];
  const char *p = tmp_path("doc.npy");
  assert_int_equal(npy_write(p, NPY_I32, x, 1, shape, err, sizeof err), 0);
  npy_array a;
  assert_int_equal(npy_read(p, &a, err, sizeof err), 0);
  assert_int_equal(a.dtype, NPY_I32);
  assert_int_equal(a.ndim, 1);
  assert_int_equal(a.shape[0], 5);
  assert_memory_equal(a.data, x, sizeof x);
  float *fx = npy_to_f32(&a);
  assert_non_null(fx);
  assert_true(fx[4] == 7.0f);
  free(fx);
  npy_free(&a);
}

static void test_reads_numpy_headers(void **state) {
  (void)state;
  double d[3] = {1.5, -2.25, 1e300};
  char err[256];
  npy_array a;
  const char *p = tmp_path("v1.npy");
  write_raw(p, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
            d, sizeof d);
  assert_int_equal(npy_read(p, &a, err, sizeof err), 0);
  assert_int_equal(a.dtype, NPY_F64);
  assert_int_equal(a.count, 3);
  float *f = npy_to_f32(&a);
  assert_true(f[0] == 1.5f && f[1] == -2.25f);
  free(f);
  npy_free(&a);
  /* version 2.0 (4-byte header length), keys in another order */
  float x[6] = {1, 2, 3, 4, 5, 6};
  p = tmp_path("v2.npy");
  write_raw(p, 2, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
            x, sizeof x);
  assert_int_equal(npy_read(p, &a, err, sizeof err), 0);
  assert_int_equal(a.ndim, 2);
  assert_int_equal(a.shape[1], 3);
  assert_memory_equal(a.data, x, sizeof x);
  npy_free(&a);
  /* 0-d array: one element */
  p = tmp_path("scalar.npy");
  write_raw(p, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (), }",
            x, 4);
  assert_int_equal(npy_read(p, &a, err, sizeof err), 0);
  assert_int_equal(a.ndim, 0);
  assert_int_equal(a.count, 1);
  npy_free(&a);
}

static void expect_error(const char *path, const char *needle) {
  char err[256] = "";
  npy_array a;
  assert_int_equal(npy_read(path, &a, err, sizeof err), -1);
  if (!strstr(err, needle)) fail_msg("error '%s' lacks '%s'", err, needle);
  assert_null(a.data);
}

static void test_rejects_bad_files(void **state) {
  (void)state;
  float x[4] = {0};
  const char *p = tmp_path("fortran.npy");
  write_raw(p, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
            x, sizeof x);
  expect_error(p, "Fortran-ordered");
  p = tmp_path("big.npy");
  write_raw(p, 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }",
            x, sizeof x);
  expect_error(p, "unsupported dtype '>f4'");
  p = tmp_path("i8.npy");
  write_raw(p, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
            x, sizeof x);
  expect_error(p, "'<i8'");
  p = tmp_path("short.npy");
  write_raw(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }",
            x, sizeof x);
  expect_error(p, "shorter");
  p = tmp_path("magic.npy");
  FILE *f = fopen(p, "wb");
  fputs("hello, world", f);
  fclose(f);
  expect_error(p, "not a .npy file");
  expect_error(tmp_path("missing.npy"), "No such file");
  p = tmp_path("noshape.npy");
  write_raw(p, 1, "{'descr': '<f4', 'fortran_order': False}", x, sizeof x);
  expect_error(p, "'shape'");
}

/* A small file that declares a huge array is refused for its size, before
 * anything of that size is allocated. */
static void test_declared_size_checked_against_file(void **state) {
  (void)state;
  float x[4] = {0};
  const char *p = tmp_path("huge.npy");
  write_raw(p, 1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (65536, 65536, "
            "65536), }",
            x, sizeof x);
  expect_error(p, "shorter than its shape says");
  p = tmp_path("huge2.npy");
  write_raw(p, 1,
            "{'descr': '<f8', 'fortran_order': False, 'shape': (4096, 4096, "
            "64), }",
            x, sizeof x);
  expect_error(p, "shorter than its shape says");
}

/* NumPy takes the last of a repeated key; a reader that takes the first
 * would see another array, so a repeated key is refused. */
static void test_rejects_repeated_keys(void **state) {
  (void)state;
  float x[4] = {0};
  const char *p = tmp_path("twice.npy");
  write_raw(p, 1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), "
            "'descr': '<i4', }",
            x, sizeof x);
  expect_error(p, "'descr' appears twice");
  p = tmp_path("twice-shape.npy");
  write_raw(p, 1,
            "{'shape': (2,), 'descr': '<f4', 'fortran_order': False, "
            "'shape': (4,)}",
            x, sizeof x);
  expect_error(p, "'shape' appears twice");
  /* A key name inside a value is not a key. */
  p = tmp_path("unknown.npy");
  write_raw(p, 1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), "
            "'extra': 'descr'}",
            x, sizeof x);
  expect_error(p, "'extra'");
}

static void test_rejects_trailing_bytes(void **state) {
  (void)state;
  float x[5] = {1, 2, 3, 4, 5};
  const char *p = tmp_path("junk.npy");
  write_raw(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
            x, sizeof x);
  expect_error(p, "4 bytes after the data");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_f32),
      cmocka_unit_test(test_roundtrip_i32_1d),
      cmocka_unit_test(test_reads_numpy_headers),
      cmocka_unit_test(test_rejects_bad_files),
      cmocka_unit_test(test_declared_size_checked_against_file),
      cmocka_unit_test(test_rejects_repeated_keys),
      cmocka_unit_test(test_rejects_trailing_bytes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
