/*
 * tests/unit/test_kernel_grid.c: the launch grid of the forward's and the
 * backward's kernels (fjr_kernel_grid): one CTA a (tile, head, batch) item,
 * or for a persistent kernel no more CTAs than multiprocessors and never
 * more than items. CPU only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gen/config.h"
#include "runtime/kernels.h"

static void test_one_cta_an_item(void **state) {
  (void)state;
  fjg_config c = {0};
  unsigned g[3] = {0, 0, 0};
  assert_int_equal(fjr_kernel_grid(&c, 132, 32, 8, 4, g), 32 * 8 * 4);
  assert_int_equal(g[0], 32);
  assert_int_equal(g[1], 8);
  assert_int_equal(g[2], 4);
}

static void test_persistent(void **state) {
  (void)state;
  fjg_config c = {0};
  c.persistent = 1;
  unsigned g[3] = {0, 0, 0};
  /* More items than SMs: one CTA an SM. */
  assert_int_equal(fjr_kernel_grid(&c, 132, 32, 16, 8, g), 4096);
  assert_int_equal(g[0], 132);
  assert_int_equal(g[1], 1);
  assert_int_equal(g[2], 1);
  /* Fewer: one CTA an item, none idle. */
  assert_int_equal(fjr_kernel_grid(&c, 132, 3, 5, 2, g), 30);
  assert_int_equal(g[0], 30);
  assert_int_equal(g[1], 1);
  assert_int_equal(g[2], 1);
  /* Items past 32 bits still count, and the grid stays the SM count. */
  assert_int_equal(fjr_kernel_grid(&c, 132, 1 << 20, 1 << 10, 8, g), (int64_t)1 << 33);
  assert_int_equal(g[0], 132);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_cta_an_item),
      cmocka_unit_test(test_persistent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
