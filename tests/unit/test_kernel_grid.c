/*
 * tests/unit/test_kernel_grid.c: the launch grid of the forward's and the
 * backward's kernels (fjr_kernel_grid): one CTA a (tile, head, batch) item,
 * or for a persistent kernel no more CTAs than multiprocessors and never
 * more than items; and the persistent backward's tile order: its groups of
 * kv heads (fjr_bwd_kv_head_group), taken where a kv tile's walk shrinks
 * with its index (fjr_bwd_walks_shrink), and its last round split
 * (fjr_bwd_tail_split). CPU only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gen/config.h"
#include "lua/spec.h"
#include "runtime/backward.h"
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

/* The backward's tile order groups kv heads: at least twice the grid's
 * tiles a group, no more heads than fit in two thirds of L2, between 1 and
 * every head. */
static void test_bwd_kv_head_group(void **state) {
  (void)state;
  const int64_t l2 = 60 << 20;                   /* the H200's */
  const int64_t head = (int64_t)128 * 8;        /* bytes a query row at D=128 */
  /* H=16, D=128: 8 x 4096 (32 kv tiles a head, 128 heads; twice the grid,
   * 264 tiles, bounds it), then L2: 4 x 8192, 2 x 16384, 1 x 65536. */
  assert_int_equal(fjr_bwd_kv_head_group(132, 32, 128, 4096 * head, l2), 9);
  assert_int_equal(fjr_bwd_kv_head_group(132, 64, 64, 8192 * head, l2), 5);
  assert_int_equal(fjr_bwd_kv_head_group(132, 128, 32, 16384 * head, l2), 2);
  assert_int_equal(fjr_bwd_kv_head_group(132, 512, 16, 65536 * head, l2), 1);
  /* L2 bounds it below twice the grid: 40 MiB of 6 MiB heads. */
  assert_int_equal(fjr_bwd_kv_head_group(132, 32, 128, 6 << 20, l2), 6);
  /* A kv head of four query heads (GQA) counts their rows. */
  assert_int_equal(fjr_bwd_kv_head_group(132, 32, 32, 4 * 4096 * head, l2), 2);
  /* Never more than the heads there are; a small grid asks for fewer. */
  assert_int_equal(fjr_bwd_kv_head_group(132, 2, 5, 300 * head, l2), 5);
  assert_int_equal(fjr_bwd_kv_head_group(10, 5, 40, 600 * head, l2), 4);
  /* L2 unknown, or a head larger than it: one head a group. */
  assert_int_equal(fjr_bwd_kv_head_group(132, 32, 128, 4096 * head, 0), 1);
  assert_int_equal(fjr_bwd_kv_head_group(132, 8, 128, l2, l2), 1);
}

/* fjr_bwd_tail_split(grid, tiles, items): {tiles split, pieces a tile}. */
static void expect_split(int64_t grid, int64_t tiles, int64_t items, int t0, int t1) {
  int tail[2] = {-1, -1};
  fjr_bwd_tail_split(grid, tiles, items, tail);
  if (tail[0] != t0 || tail[1] != t1)
    fail_msg("grid %ld, %ld tiles of %ld items: %d tiles in %d pieces, expected %d in %d",
             (long)grid, (long)tiles, (long)items, tail[0], tail[1], t0, t1);
}

static void test_bwd_tail_split(void **state) {
  (void)state;
  /* 8 x 4096 x 16 heads, D=128: 4096 tiles of 64 items on 132 SMs leave 4
   * in the last round, each in 33 pieces (one take a CTA). */
  expect_split(132, 4096, 64, 4, 33);
  /* D=64 H=32: 8192 tiles, 8 left: 16 pieces each. */
  expect_split(132, 8192, 32, 8, 16);
  /* No more pieces than a tile's items. */
  expect_split(132, 4096, 16, 4, 16);
  /* The most tiles split, 32: 4 pieces each. */
  expect_split(132, 132 + 32, 64, 32, 4);
  /* Whole rounds, one partial round only, a last round of many tiles (more
   * than 32, or more than half the grid), one item a tile, one CTA: none. */
  expect_split(132, 4092, 64, 0, 0);
  expect_split(132, 100, 64, 0, 0);
  expect_split(132, 132 + 33, 64, 0, 0);
  expect_split(40, 40 + 21, 64, 0, 0);
  expect_split(40, 40 + 20, 64, 20, 2);
  expect_split(132, 4096, 1, 0, 0);
  expect_split(1, 5, 64, 0, 0);
  /* The takes must count in an int: 2147483584 tiles leave 4, whose 33
   * pieces would take it past INT32_MAX. */
  expect_split(132, INT32_MAX - 63, 64, 0, 0);
  expect_split(132, INT32_MAX - 63 - 132 * 1000, 64, 4, 33);
}

/* fjr_bwd_walks_shrink of spec src at Lq x Lk (64 x 128 tiles), its first
 * param (if any) = param. */
static int shrinks(const char *src, int Lq, int Lk, int32_t param) {
  fjg_graph *g = NULL;
  char err[1024] = "";
  if (fjl_trace_spec(src, strlen(src), "spec.lua", &g, NULL, err, sizeof err) != FJ_OK)
    fail_msg("trace failed: %s\n%s", err, src);
  const int32_t i32s[1] = {param};
  const float f32s[1] = {0.f};
  const fjg_env env = {.sizes = {2, 4, 4, Lq, Lk}, .param_i32 = i32s, .param_f32 = f32s};
  const int r = fjr_bwd_walks_shrink(g, &env, 64, 128);
  fjg_graph_destroy(g);
  return r;
}

static void test_bwd_walks_shrink(void **state) {
  (void)state;
  const char *causal = "return { mask_mod = causal() }";
  assert_int_equal(shrinks(causal, 1000, 1000, 0), 1);
  assert_int_equal(shrinks(causal, 4096, 4096, 0), 1);
  /* Bottom-right: a chunk of 300 queries over 1000 keys. */
  assert_int_equal(shrinks("return { mask_mod = causal{align = 'bottom_right'} }", 300, 1000, 0),
                   1);
  /* A prefix of 100 keys seen by every query, causal after it. */
  assert_int_equal(shrinks("local p = param('prefix', 'i32')\n"
                           "return { mask_mod = function(b, h, q, kv)\n"
                           "  return le(kv, q) | lt(kv, p) end }",
                           1000, 1000, 100),
                   1);
  /* Document ids are causal within a document: the causal part decides. */
  assert_int_equal(shrinks("local doc = buffer('doc', 'i32')\n"
                           "return { mask_mod = document(doc) }",
                           4096, 4096, 0),
                   1);
  /* Walks of one length: no mask, a sliding window's band; and a mask
   * that only reads a buffer (never EMPTY to the analysis). */
  assert_int_equal(shrinks("return { score_mod = noop_score() }", 1000, 1000, 0), 0);
  assert_int_equal(shrinks("local w = param('window', 'i32')\n"
                           "return { mask_mod = sliding_window(w) }",
                           4096, 4096, 256),
                   0);
  assert_int_equal(shrinks("local doc = buffer('doc', 'i32')\n"
                           "return { mask_mod = document(doc, {causal = false}) }",
                           4096, 4096, 0),
                   0);
  /* One kv tile: nothing to deal. The transpose of causal grows. */
  assert_int_equal(shrinks(causal, 60, 100, 0), 0);
  assert_int_equal(shrinks("return { mask_mod = function(b, h, q, kv) return ge(kv, q) end }",
                           1000, 1000, 0),
                   0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_cta_an_item),
      cmocka_unit_test(test_persistent),
      cmocka_unit_test(test_bwd_kv_head_group),
      cmocka_unit_test(test_bwd_walks_shrink),
      cmocka_unit_test(test_bwd_tail_split),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
