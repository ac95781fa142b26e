/* tests/unit/test_config.c: gen/config.c (kernel configuration choice). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gen/config.h"

static void expect_ok(int d, fj_dtype dt, const char *arch, fjg_config *c) {
  char err[256] = "untouched";
  fj_status st = fjg_config_choose(d, dt, arch, c, err, sizeof err);
  if (st != FJ_OK) fail_msg("%d %s: %d %s", d, arch, st, err);
  assert_string_equal(err, "");
}

static void test_h100_class(void **state) {
  (void)state;
  fjg_config c;
  expect_ok(128, FJ_DTYPE_BF16, "sm_90a", &c);
  assert_int_equal(c.head_dim, 128);
  assert_int_equal(c.dtype, FJ_DTYPE_BF16);
  assert_string_equal(c.arch, "sm_90a");
  assert_int_equal(c.sm, 90);
  assert_int_equal(c.block_m, 128);
  assert_int_equal(c.block_n, 64);
  assert_int_equal(c.num_warps, 4);
  assert_int_equal(c.num_stages, 2);
  assert_int_equal(c.threads, 128);
  assert_int_equal(c.smem_bytes, 98304);
  assert_string_equal(c.template_name, "sm80");

  expect_ok(64, FJ_DTYPE_F16, "sm_80", &c);
  assert_int_equal(c.sm, 80);
  assert_int_equal(c.block_m, 128);
  assert_int_equal(c.block_n, 128);
  assert_int_equal(c.smem_bytes, 81920);
  assert_string_equal(c.template_name, "sm80");
}

static void test_arch_parsing(void **state) {
  (void)state;
  static const struct {
    const char *arch;
    int sm;
  } ok[] = {{"sm_80", 80}, {"sm_86", 86},   {"sm_89", 89},     {"sm_90", 90},
            {"sm_90a", 90}, {"sm_100a", 100}, {"sm_120", 120}, {"sm_100f", 100}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    fjg_config c;
    expect_ok(128, FJ_DTYPE_BF16, ok[i].arch, &c);
    assert_int_equal(c.sm, ok[i].sm);
    assert_string_equal(c.arch, ok[i].arch);
  }
  static const char *bad[] = {"",      "sm80",   "sm_",     "sm_9",  "sm_9x",
                              "sm_90ab", "sm_1000", "compute_90", "SM_90", " sm_90",
                              "sm_90 ", "sm_-90", "sm_90a_"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fjg_config c;
    char err[256] = "";
    assert_int_equal(fjg_config_choose(128, FJ_DTYPE_BF16, bad[i], &c, err, sizeof err),
                     FJ_EINVAL);
    assert_non_null(strstr(err, "invalid architecture"));
  }
}

static void test_old_arch_rejected(void **state) {
  (void)state;
  fjg_config c;
  char err[256] = "";
  assert_int_equal(fjg_config_choose(64, FJ_DTYPE_F16, "sm_75", &c, err, sizeof err),
                   FJ_EUNSUPPORTED);
  assert_non_null(strstr(err, "sm_75"));
  assert_non_null(strstr(err, "sm_80 or newer"));
  assert_int_equal(fjg_config_choose(64, FJ_DTYPE_F16, "sm_70", &c, NULL, 0),
                   FJ_EUNSUPPORTED);
}

static void test_head_dim_and_dtype(void **state) {
  (void)state;
  static const int bad[] = {0, 32, 96, 127, 512, -64};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fjg_config c;
    char err[256] = "";
    assert_int_equal(fjg_config_choose(bad[i], FJ_DTYPE_BF16, "sm_90", &c, err, sizeof err),
                     FJ_EUNSUPPORTED);
    assert_non_null(strstr(err, "supported: 64, 128"));
  }
  /* 256: the sm90 template only, with 64-row kv tiles. */
  fjg_config c;
  char err[256] = "";
  assert_int_equal(fjg_config_choose_template(256, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, err,
                                              sizeof err), FJ_OK);
  assert_int_equal(c.block_m, 128);
  assert_int_equal(c.block_n, 64);
  assert_int_equal(c.num_stages, 2);
  assert_true(c.smem_bytes <= 227 * 1024);
  static const char *sm80_archs[] = {"sm_80", "sm_89", "sm_90a"};
  for (size_t i = 0; i < 3; i++) {
    assert_int_equal(fjg_config_choose_template(256, FJ_DTYPE_F16, sm80_archs[i], "sm80", &c,
                                                err, sizeof err), FJ_EUNSUPPORTED);
    assert_non_null(strstr(err, "head dim 256 needs the sm90 template"));
  }
  assert_int_equal(fjg_config_choose(64, (fj_dtype)7, "sm_90", &c, err, sizeof err),
                   FJ_EUNSUPPORTED);
  assert_non_null(strstr(err, "dtype"));
}

static void test_null_arguments(void **state) {
  (void)state;
  fjg_config c;
  char err[8];
  assert_int_equal(fjg_config_choose(64, FJ_DTYPE_BF16, "sm_90", NULL, err, sizeof err),
                   FJ_EINVAL);
  assert_int_equal(fjg_config_choose(64, FJ_DTYPE_BF16, NULL, &c, NULL, 0), FJ_EINVAL);
  /* A short error buffer is truncated, never overrun. */
  assert_int_equal(fjg_config_choose(96, FJ_DTYPE_BF16, "sm_90", &c, err, sizeof err),
                   FJ_EUNSUPPORTED);
  assert_int_equal(strlen(err), sizeof err - 1);
}

/* Invariants the template relies on, for every supported combination. */
static void test_template_contract(void **state) {
  (void)state;
  static const char *archs[] = {"sm_80", "sm_86", "sm_87", "sm_89", "sm_90",
                                "sm_90a", "sm_100a", "sm_120"};
  static const int dims[] = {64, 128};
  static const fj_dtype dts[] = {FJ_DTYPE_BF16, FJ_DTYPE_F16};
  for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++)
    for (size_t d = 0; d < 2; d++)
      for (size_t t = 0; t < 2; t++) {
        fjg_config c;
        expect_ok(dims[d], dts[t], archs[a], &c);
        int rows_per_warp = c.block_m / c.num_warps;
        assert_true(rows_per_warp == 16 || rows_per_warp == 32);
        assert_int_equal(c.block_m % c.num_warps, 0);
        assert_int_equal(c.block_n % 16, 0);
        assert_true(c.num_stages >= 2);
        assert_int_equal(c.threads, c.num_warps * 32);
        /* Rows a load pass covers must be a multiple of 8 (swizzle). */
        int load_rows = c.threads / (c.head_dim / 8);
        assert_int_equal(load_rows % 8, 0);
        assert_int_equal(c.block_m % load_rows, 0);
        assert_int_equal(c.block_n % load_rows, 0);
        assert_int_equal(c.smem_bytes,
                         (c.block_m + 2 * c.num_stages * c.block_n) * c.head_dim * 2);
        /* Within the architecture's per-block opt-in limit. */
        int limit = (c.sm == 86 || c.sm == 89 || c.sm == 120) ? 99 * 1024
                    : c.sm == 80 || c.sm == 87                ? 163 * 1024
                                                              : 227 * 1024;
        assert_true(c.smem_bytes <= limit);
      }
}

/* The spill fallback is the sm90 template's, persistent or not; the sm90
 * kernel is persistent by default at head dim 128 only; persistence applies
 * to sm90 only. */
static void test_spill_fallback_and_persistence(void **state) {
  (void)state;
  fjg_config c90, c80;
  assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, "sm_90a", "sm90", &c90,
                                              NULL, 0), FJ_OK);
  assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, "sm_90a", "sm80", &c80,
                                              NULL, 0), FJ_OK);
  assert_string_equal(c90.spill_fallback, "-DFJ_INTRA_WG_OVERLAP=0");
  assert_int_equal(c90.persistent, 1);
  assert_int_equal(c90.q_bufs, 2);
  assert_int_equal(c80.persistent, 0);
  assert_null(c80.spill_fallback);
  for (int d = 64; d <= 256; d *= 2) {
    fjg_config c;
    assert_int_equal(fjg_config_choose_template(d, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, NULL,
                                                0), FJ_OK);
    assert_int_equal(c.persistent, d == 128);
  }
  fjg_config_set_persistent(&c90, 0);
  assert_int_equal(c90.persistent, 0);
  assert_int_equal(c90.q_bufs, 1);
  assert_string_equal(c90.spill_fallback, "-DFJ_INTRA_WG_OVERLAP=0");
  fjg_config_set_persistent(&c90, 1);
  assert_int_equal(c90.persistent, 1);
  assert_string_equal(c90.spill_fallback, "-DFJ_INTRA_WG_OVERLAP=0");
  fjg_config_set_persistent(&c90, 0);
  assert_int_equal(c90.persistent, 0);
  assert_string_equal(c90.spill_fallback, "-DFJ_INTRA_WG_OVERLAP=0");
  fjg_config_set_persistent(&c80, 1);
  assert_int_equal(c80.persistent, 0);
  fjg_config_set_persistent(NULL, 1);
}

/* The persistent kernel's second Q buffer: where it fits beside the K/V
 * stages (D=64 and 128), counted in smem_bytes, and given up for stages. */
static void test_persistent_q_buffers(void **state) {
  (void)state;
  static const int dims[] = {64, 128, 256};
  for (size_t i = 0; i < 3; i++) {
    fjg_config c;
    assert_int_equal(fjg_config_choose_template(dims[i], FJ_DTYPE_BF16, "sm_90a", "sm90", &c,
                                                NULL, 0), FJ_OK);
    /* The persistent kernel has two consumers (D=64's default has three);
     * D=128's default is persistent: plain is the other kernel's. */
    fjg_config_set_persistent(&c, 0);
    assert_int_equal(fjg_config_set_consumers(&c, 2), 0);
    const int plain = c.smem_bytes;
    assert_true(c.q_bufs <= 1);
    fjg_config_set_persistent(&c, 1);
    const int q_tile = c.block_m * c.head_dim * 2;
    if (dims[i] == 256) {  /* Q 64 KiB + two 64 KiB stages: no room */
      assert_int_equal(c.q_bufs, 1);
      assert_int_equal(c.smem_bytes, plain);
    } else {
      assert_int_equal(c.q_bufs, 2);
      assert_int_equal(c.smem_bytes, plain + q_tile);
    }
    assert_true(c.smem_bytes + 9216 <= 227 * 1024);  /* and its static rows */
    fjg_config_set_persistent(&c, 0);
    assert_int_equal(c.q_bufs, 1);
    assert_int_equal(c.smem_bytes, plain);
  }
  /* D=64: six stages leave room for one Q buffer only, whichever is set
   * first; five stages keep two. */
  fjg_config c;
  assert_int_equal(fjg_config_choose_template(64, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, NULL,
                                              0), FJ_OK);
  fjg_config_set_persistent(&c, 1);
  assert_int_equal(fjg_config_set_stages(&c, 5), 0);
  assert_int_equal(c.q_bufs, 2);
  assert_int_equal(fjg_config_set_stages(&c, 6), 0);
  assert_int_equal(c.q_bufs, 1);
  assert_int_equal(c.smem_bytes, 1024 + (128 + 12 * 128) * 64 * 2 + 8 * (1 + 24));
  assert_int_equal(fjg_config_set_stages(&c, 7), -1);
  assert_int_equal(fjg_config_choose_template(64, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, NULL,
                                              0), FJ_OK);
  assert_int_equal(fjg_config_set_stages(&c, 6), 0);
  fjg_config_set_persistent(&c, 1);
  assert_int_equal(c.q_bufs, 1);
  assert_int_equal(c.num_stages, 6);
}

/* Consumer warpgroups: three at D=64 by default (192-row tiles, 16 warps),
 * two elsewhere and in the persistent kernel; three nowhere else. */
static void test_consumers(void **state) {
  (void)state;
  fjg_config c;
  assert_int_equal(fjg_config_choose_template(64, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, NULL,
                                              0), FJ_OK);
  assert_int_equal(c.block_m, 192);
  assert_int_equal(c.num_warps, 16);
  assert_int_equal(c.threads, 512);
  assert_int_equal(c.smem_bytes, 1024 + (192 + 6 * 128) * 64 * 2 + 8 * (1 + 12));
  assert_int_equal(fjg_config_set_consumers(&c, 4), -1);
  assert_int_equal(c.block_m, 192);
  assert_int_equal(fjg_config_set_consumers(&c, 2), 0);
  assert_int_equal(c.block_m, 128);
  assert_int_equal(c.num_warps, 12);
  assert_int_equal(c.threads, 384);
  assert_int_equal(c.smem_bytes, 1024 + (128 + 6 * 128) * 64 * 2 + 8 * (1 + 12));
  assert_int_equal(fjg_config_set_consumers(&c, 3), 0);
  fjg_config_set_persistent(&c, 1);
  assert_int_equal(c.block_m, 128);
  assert_int_equal(fjg_config_set_consumers(&c, 3), -1);
  assert_int_equal(c.block_m, 128);
  assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, NULL,
                                              0), FJ_OK);
  assert_int_equal(c.block_m, 128);
  assert_int_equal(c.num_warps, 12);
  assert_int_equal(fjg_config_set_consumers(&c, 3), -1);
  assert_int_equal(fjg_config_choose_template(64, FJ_DTYPE_BF16, "sm_80", NULL, &c, NULL, 0),
                   FJ_OK);
  assert_int_equal(fjg_config_set_consumers(&c, 2), -1); /* sm80: no consumers */
}

/* The launch path's tile lookup says what the sm90 configuration says. */
static void test_sm90_tile(void **state) {
  (void)state;
  static const int dims[] = {64, 128, 256};
  for (size_t i = 0; i < 3; i++) {
    fjg_config c;
    int m = 0, n = 0;
    assert_int_equal(fjg_config_choose_template(dims[i], FJ_DTYPE_F16, "sm_90a", "sm90", &c,
                                                NULL, 0), FJ_OK);
    assert_int_equal(fjg_sm90_tile(dims[i], &m, &n), 0);
    assert_int_equal(m, c.block_m);
    assert_int_equal(n, c.block_n);
  }
  int m = 0, n = 0;
  assert_int_equal(fjg_sm90_tile(96, &m, &n), -1);
  /* Which tile a block mask's block_q takes: the given one when it fits (or
   * without a mask), else 128 rows, else none. */
  assert_int_equal(fjg_sm90_block_m_for(192, 0), 192);
  assert_int_equal(fjg_sm90_block_m_for(192, 384), 192);
  assert_int_equal(fjg_sm90_block_m_for(192, 128), 128);
  assert_int_equal(fjg_sm90_block_m_for(192, 256), 128);
  assert_int_equal(fjg_sm90_block_m_for(128, 256), 128);
  assert_int_equal(fjg_sm90_block_m_for(192, 64), 0);
  assert_int_equal(fjg_sm90_block_m_for(128, 64), 0);
}

/* $FLEXJIT_STAGES's setter: sm90 only, and only depths that fit. */
static void test_set_stages(void **state) {
  (void)state;
  fjg_config c;
  assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, "sm_90a", "sm90", &c,
                                              NULL, 0), FJ_OK);
  const int smem2 = c.smem_bytes;
  /* D = 128: a third stage fits the dynamic limit (230504 bytes) but not
   * with the kernel's 5120 static bytes (the H200 refused that launch). */
  assert_int_equal(fjg_config_set_stages(&c, 3), -1);
  assert_int_equal(fjg_config_set_stages(&c, 1), -1);
  assert_int_equal(c.num_stages, 2);
  assert_int_equal(c.smem_bytes, smem2);
  assert_int_equal(fjg_config_choose_template(64, FJ_DTYPE_BF16, "sm_90a", "sm90", &c,
                                              NULL, 0), FJ_OK);
  const int smem3 = c.smem_bytes;
  assert_int_equal(fjg_config_set_stages(&c, 6), 0);
  assert_int_equal(c.num_stages, 6);
  /* Three more K and V tiles of 128 x 64, and twelve more barriers. */
  assert_int_equal(c.smem_bytes, smem3 + 3 * 2 * 128 * 64 * 2 + 12 * 8);
  assert_int_equal(fjg_config_set_stages(&c, 7), -1);
  assert_int_equal(fjg_config_choose_template(64, FJ_DTYPE_BF16, "sm_90a", "sm80", &c,
                                              NULL, 0), FJ_OK);
  assert_int_equal(fjg_config_set_stages(&c, 3), -1);
  assert_int_equal(c.num_stages, 2);
  assert_int_equal(fjg_config_set_stages(NULL, 3), -1);
}

/* The sm90 backward's query tiles: 128 rows at head dim 64 (64 at 128),
 * lowered to 64 by fjg_config_backward_variant for a packed batch and for a
 * block mask whose block_q 128 does not divide, with smem_bytes (the
 * template's FJHB_SMEM_BYTES, unit/test_bwd_compile) following; the sm80
 * backward keeps its tiles. */
static void test_sm90_backward_tiles(void **state) {
  (void)state;
  fjg_config c;
  assert_int_equal(fjg_sm90_bwd_block_m(64), 128);
  assert_int_equal(fjg_sm90_bwd_block_m(128), 64);
  static const struct {
    int d, det, varlen, block_q, block_m;
  } cases[] = {
      {64, 0, 0, 0, 128},   {64, 0, 0, 128, 128}, {64, 0, 0, 256, 128},
      {64, 0, 0, 384, 128}, {64, 0, 0, 64, 64},   {64, 0, 0, 192, 64},
      {64, 0, 1, 0, 64},    {64, 0, 1, 128, 64},  {128, 0, 0, 0, 64},
      {128, 0, 0, 64, 64},  {128, 0, 1, 0, 64},   {128, 0, 0, 128, 64},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(fjg_config_choose_backward(cases[i].d, FJ_DTYPE_BF16, "sm_90a", "sm90", &c,
                                                NULL, 0),
                     FJ_OK);
    const int smem = c.smem_bytes, block_m = c.block_m;
    fjg_config_backward_variant(&c, cases[i].det, cases[i].varlen, cases[i].block_q);
    if (c.block_m != cases[i].block_m)
      fail_msg("case %zu: D=%d varlen %d block_q %d: block_m %d, expected %d", i, cases[i].d,
               cases[i].varlen, cases[i].block_q, c.block_m, cases[i].block_m);
    assert_int_equal(c.varlen, cases[i].varlen);
    assert_int_equal(c.deterministic, cases[i].det);
    if (c.block_m == block_m) assert_int_equal(c.smem_bytes, smem);
  }
  /* D=64: 195 KiB with 128-row tiles (one dQ buffer a consumer), 131 KiB
   * with 64-row ones; each with two stages' next items before the barriers
   * and two stages of row values last. */
  assert_int_equal(fjg_config_choose_backward(64, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, NULL, 0),
                   FJ_OK);
  assert_int_equal(c.smem_bytes, 1024 + 2 * 16384 + 4 * 16384 + 2 * 32768 + 2 * 16384 +
                                     4 * 128 * 4 + 2 * 16 + 8 * (1 + 6 + 4 + 6) + 24 + 16 +
                                     2 * 128 * 4);
  fjg_config_backward_variant(&c, 0, 1, 0);
  assert_int_equal(c.smem_bytes, 1024 + 2 * 16384 + 4 * 8192 + 2 * 16384 + 4 * 8192 +
                                     4 * 64 * 4 + 2 * 16 + 8 * (1 + 6 + 8 + 6) + 24 + 16 +
                                     2 * 64 * 4);
  /* The sm80 backward's tiles do not change. */
  assert_int_equal(fjg_config_choose_backward(64, FJ_DTYPE_BF16, "sm_90a", "sm80", &c, NULL, 0),
                   FJ_OK);
  const fjg_config before = c;
  fjg_config_backward_variant(&c, 1, 1, 128);
  assert_int_equal(c.block_m, before.block_m);
  assert_int_equal(c.smem_bytes, before.smem_bytes);
  assert_int_equal(c.deterministic, 1);
  assert_int_equal(c.varlen, 1);
  fjg_config_backward_variant(NULL, 0, 0, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_h100_class),        cmocka_unit_test(test_arch_parsing),
      cmocka_unit_test(test_old_arch_rejected), cmocka_unit_test(test_head_dim_and_dtype),
      cmocka_unit_test(test_null_arguments),    cmocka_unit_test(test_template_contract),
      cmocka_unit_test(test_consumers),
      cmocka_unit_test(test_sm90_tile),
      cmocka_unit_test(test_set_stages),
      cmocka_unit_test(test_spill_fallback_and_persistence),
      cmocka_unit_test(test_persistent_q_buffers),
      cmocka_unit_test(test_sm90_backward_tiles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
