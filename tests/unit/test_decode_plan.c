/*
 * tests/unit/test_decode_plan.c: the decode launch's plan (fjr_decode_warps,
 * fjr_decode_plan) and scratch (fj_forward_workspace_size): the kernel's
 * warps, row blocks of a KV group, splits that fill whole waves without
 * exceeding the tiles or the partials' budget, and the scratch every plan
 * fits in. CPU only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "flexjit.h"
#include "runtime/decode.h"

/* The H200 with two decode CTAs a multiprocessor. */
#define SMS 132
#define PER_SM 2
#define SLOTS (PER_SM * SMS)

static void plan(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int bm,
                 int64_t *rb, int *s) {
  fjr_decode_plan(B, Hq, Hkv, Lq, Lk, bm, 64, SMS, PER_SM, rb, s);
}

static void test_issue_shapes(void **state) {
  (void)state;
  int64_t rb;
  int s;
  /* GQA 32/8, one token: 4 rows a group, one row block. */
  plan(4, 32, 8, 1, 65536, 16, &rb, &s);
  assert_int_equal(rb, 1);
  /* 32 CTAs unsplit; 8 splits make 256 CTAs, one wave of 264 slots. */
  assert_int_equal(s, 8);
  plan(1, 32, 8, 1, 131072, 16, &rb, &s);
  assert_true(8 * s <= SLOTS && 8 * s > SLOTS / 2);
  plan(64, 32, 8, 1, 2048, 16, &rb, &s);
  assert_int_equal(s, 1); /* 512 CTAs already */
  /* 128 CTAs cover 97% of the multiprocessors: unsplit. */
  plan(16, 32, 8, 1, 8192, 16, &rb, &s);
  assert_int_equal(s, 1);
  /* 112 cover 85%: split. */
  plan(14, 32, 8, 1, 8192, 16, &rb, &s);
  assert_true(s >= 2);
}

/* 8 warps only for pages of 16 or 32 rows where the CTAs fill one wave of
 * one a multiprocessor; unsplit there (one CTA a multiprocessor). */
static void test_warps(void **state) {
  (void)state;
  assert_int_equal(fjr_decode_warps(16, 32, 8, 1, 16, 16, SMS), 8);
  assert_int_equal(fjr_decode_warps(16, 32, 8, 1, 16, 32, SMS), 8);
  assert_int_equal(fjr_decode_warps(16, 32, 8, 1, 16, 64, SMS), 4);
  assert_int_equal(fjr_decode_warps(16, 32, 8, 1, 16, 128, SMS), 4);
  assert_int_equal(fjr_decode_warps(16, 32, 8, 1, 16, 0, SMS), 8); /* contiguous */
  /* 112 CTAs (85%), 136 (more than one a multiprocessor), 512. */
  assert_int_equal(fjr_decode_warps(14, 32, 8, 1, 16, 16, SMS), 4);
  assert_int_equal(fjr_decode_warps(17, 32, 8, 1, 16, 16, SMS), 4);
  assert_int_equal(fjr_decode_warps(64, 32, 8, 1, 16, 16, SMS), 4);
  /* Row blocks count: 41 x 3 KV heads x one 32-row block (24 rows). */
  assert_int_equal(fjr_decode_warps(41, 24, 3, 3, 32, 16, SMS), 8);
  assert_int_equal(fjr_decode_warps(41, 24, 3, 6, 32, 16, SMS), 4);
  int64_t rb;
  int s;
  fjr_decode_plan(16, 32, 8, 1, 8192, 16, 128, SMS, 1, &rb, &s);
  assert_int_equal(s, 1);
}

static void test_limits(void **state) {
  (void)state;
  int64_t rb;
  int s;
  /* 16 tokens of an 8-head group: 128 rows, four 32-row blocks. */
  plan(1, 8, 1, 16, 100000, 32, &rb, &s);
  assert_int_equal(rb, 4);
  assert_true(s >= 1 && s <= 64);
  /* Never more splits than tiles, nor than the partials' budget. */
  plan(1, 1, 1, 1, 100, 16, &rb, &s);
  assert_true(s <= 2);
  plan(1, 1, 1, 1, 10000000, 16, &rb, &s);
  assert_true(s <= 64);
  plan(256, 64, 64, 16, 100000, 32, &rb, &s);
  assert_int_equal(s, 1);
  /* Nothing to read: one split (the kernel writes O = 0, LSE = -inf). */
  plan(2, 8, 2, 1, 0, 16, &rb, &s);
  assert_int_equal(s, 1);
}

/* The scratch covers the partials of every plan: splits x B x Hq x Lq rows
 * of D + 1 floats, and the forward's counter besides. */
static void test_workspace(void **state) {
  (void)state;
  static const int64_t shapes[][5] = {{4, 32, 8, 1, 65536},   {1, 32, 8, 1, 131072},
                                      {1, 1, 1, 1, 10000000}, {3, 12, 4, 16, 5000},
                                      {64, 32, 8, 1, 2048},   {1, 64, 1, 16, 777777}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int64_t *x = shapes[i];
    for (int D = 64; D <= 128; D *= 2) {
      int64_t rb;
      int s;
      plan(x[0], x[1], x[2], x[3], x[4], x[1] / x[2] * x[3] > 16 ? 32 : 16, &rb, &s);
      const size_t need = (size_t)s * x[0] * x[1] * x[3] * (D + 1) * 4;
      assert_true(fj_forward_workspace_size(x[0], x[1], x[3], D) >= need);
    }
  }
  /* Longer queries use only the forward's counter. */
  assert_int_equal(fj_forward_workspace_size(2, 8, 17, 128), 4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_issue_shapes),
      cmocka_unit_test(test_warps),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_workspace),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
