/*
 * tests/unit/test_random.c: `flexjit run`'s random inputs (cli/random.c,
 * compiled into this test): the normal fill gives the same values for a
 * seed whatever the number of threads, values of the dtype, a standard
 * normal's moments, and writes exactly n values.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/random.c"

static float *fill(size_t n, uint64_t seed, fj_dtype dt, int threads) {
  float *x = malloc(sizeof(float) * (n + 1));
  assert_non_null(x);
  x[n] = 12345.f; /* one past the end: must stay */
  cli_fill_normal(x, n, seed, dt, threads);
  assert_true(x[n] == 12345.f);
  return x;
}

/* Five blocks and an odd tail: 1, 3 and 16 threads agree bit for bit. */
static void test_threads_agree(void **state) {
  (void)state;
  const size_t n = 5 * CLI_NORMAL_BLOCK + 7;
  float *one = fill(n, 42, FJ_DTYPE_BF16, 1);
  for (int t = 3; t <= 16; t += 13) {
    float *many = fill(n, 42, FJ_DTYPE_BF16, t);
    assert_memory_equal(one, many, n * sizeof(float));
    free(many);
  }
  free(one);
}

/* Another seed gives other values, and no block repeats another. */
static void test_seeds_and_blocks_differ(void **state) {
  (void)state;
  const size_t n = 2 * CLI_NORMAL_BLOCK;
  float *a = fill(n, 1, FJ_DTYPE_BF16, 0), *b = fill(n, 2, FJ_DTYPE_BF16, 0);
  assert_memory_not_equal(a, b, n * sizeof(float));
  assert_memory_not_equal(a, a + CLI_NORMAL_BLOCK, CLI_NORMAL_BLOCK * sizeof(float));
  free(a);
  free(b);
}

/* Each value is one of the dtype's; mean 0 and variance 1 (to 0.01 over
 * 2^20 values: the standard error of each is about 0.001). */
static void test_dtype_and_moments(void **state) {
  (void)state;
  const size_t n = (size_t)1 << 20;
  const fj_dtype dts[2] = {FJ_DTYPE_BF16, FJ_DTYPE_F16};
  for (int d = 0; d < 2; d++) {
    float *x = fill(n, 7, dts[d], 0);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) {
      assert_true(isfinite(x[i]));
      assert_true(fjg_round_to_dtype(x[i], dts[d]) == x[i]);
      sum += x[i], sq += (double)x[i] * x[i];
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    assert_true(fabs(mean) < 0.01);
    assert_true(fabs(var - 1.0) < 0.01);
    free(x);
  }
}

/* No value, and one: exactly as many written. */
static void test_tiny(void **state) {
  (void)state;
  free(fill(0, 3, FJ_DTYPE_BF16, 0));
  float *x = fill(1, 3, FJ_DTYPE_BF16, 4);
  assert_true(isfinite(x[0]));
  free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads_agree),
      cmocka_unit_test(test_seeds_and_blocks_differ),
      cmocka_unit_test(test_dtype_and_moments),
      cmocka_unit_test(test_tiny),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
