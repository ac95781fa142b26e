/*
 * tests/unit/test_tma_maps.c: the forward's tensor maps under the serving
 * layouts (runtime/tma.c, docs/serving.md), built against a stand-in for
 * cuTensorMapEncodeTiled that records each call's dims, strides and box:
 *   - packed q, k, v are one batch of all rows, (D, total, H, 1), and
 *     packed O gets no map (o_ok 0: the kernel's threads store it, so no
 *     64-row box writes into the next sequence);
 *   - page pools are (D, page_size, Hkv, num_pages) with boxes of the
 *     largest power of two that divides the page size, at most a tile's
 *     rows (never across a page), for page sizes 16 to 256;
 *   - seqlens_k alone leaves every map as without serving fields;
 *   - a packed or paged tensor without its rows is refused (the backward's
 *     maps too).
 * CPU only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gen/config.h"
#include "runtime/tma.h"

/* What the stand-in saw, one record a call. */
typedef struct enc {
  uint64_t addr;
  cuuint64_t dims[4], strides[3];
  cuuint32_t box[4];
} enc;
static enc encs[8];
static int nenc;

static CUresult fake_encode(CUtensorMap *m, CUtensorMapDataType dt, cuuint32_t rank,
                            void *addr, const cuuint64_t *dims, const cuuint64_t *strides,
                            const cuuint32_t *box, const cuuint32_t *estride,
                            CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                            CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  (void)dt; (void)estride; (void)il; (void)sw; (void)l2; (void)oob;
  memset(m, 0, sizeof *m);
  if (nenc < 8 && rank == 4) {
    enc *e = &encs[nenc];
    e->addr = (uint64_t)(uintptr_t)addr;
    memcpy(e->dims, dims, sizeof e->dims);
    memcpy(e->strides, strides, sizeof e->strides);
    memcpy(e->box, box, sizeof e->box);
  }
  nenc++;
  return CUDA_SUCCESS;
}

static fjr_driver fake_driver(void) {
  fjr_driver drv;
  memset(&drv, 0, sizeof drv);
  drv.cuTensorMapEncodeTiled = fake_encode;
  return drv;
}

static fjg_config sm90(int D, int persistent) {
  fjg_config c;
  assert_int_equal(fjg_config_choose_template(D, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, NULL, 0),
                   FJ_OK);
  fjg_config_set_persistent(&c, persistent);
  return c;
}

static void expect(const enc *e, uint64_t addr, const int64_t dims[4], const int64_t bytes[3],
                   uint32_t box_rows) {
  assert_int_equal(e->addr, addr);
  for (int i = 0; i < 4; i++) assert_int_equal(e->dims[i], dims[i]);
  for (int i = 0; i < 3; i++) assert_int_equal(e->strides[i], bytes[i]);
  assert_int_equal(e->box[0], 64);
  assert_int_equal(e->box[1], box_rows);
  assert_int_equal(e->box[2], 1);
  assert_int_equal(e->box[3], 1);
}

/* Packed q [total_q = 1000, Hq = 4, D] and k, v [total_k = 700, Hkv = 2,
 * D] (as runtime/forward.c packs them: batch stride 0, row stride H * D),
 * B = 3, max_seqlen_q 400, max_seqlen_k 300. */
static void test_packed(void **state) {
  (void)state;
  const fjr_driver drv = fake_driver();
  for (int persistent = 0; persistent <= 1; persistent++) {
    const int D = 128;
    const fjg_config c = sm90(D, persistent);
    fjr_fwd_params_fixed p;
    memset(&p, 0, sizeof p);
    p.q = 4096, p.k = 8192, p.v = 12288, p.o = 16384;
    p.sz.B = 3, p.sz.Hq = 4, p.sz.Hkv = 2, p.sz.Lq = 400, p.sz.Lk = 300;
    p.q_ss = p.o_ss = 4 * D, p.q_sh = p.o_sh = D;
    p.k_ss = p.v_ss = 2 * D, p.k_sh = p.v_sh = D;
    p.cu_seqlens_q = 256, p.cu_seqlens_k = 512;
    const fjr_tma_rows rows = {1000, 700};
    fjr_tma_maps maps;
    char err[256] = "";
    nenc = 0;
    assert_int_equal(fjr_tma_maps_build(&drv, &c, &p, &rows, &maps, err, sizeof err), FJ_OK);
    assert_int_equal(nenc, 3); /* q, k, v: packed O has no map */
    assert_int_equal(maps.o_ok, 0);
    /* The unit batch dimension's stride is normalized (runtime/tma.c: the
     * head stride times the heads). */
    const int64_t qd[4] = {D, 1000, 4, 1}, qs[3] = {4 * D * 2, D * 2, 4 * D * 2};
    const int64_t kd[4] = {D, 700, 2, 1}, ks[3] = {2 * D * 2, D * 2, 2 * D * 2};
    expect(&encs[0], 4096, qd, qs, (uint32_t)c.block_m);
    expect(&encs[1], 8192, kd, ks, (uint32_t)c.block_n);
    expect(&encs[2], 12288, kd, ks, (uint32_t)c.block_n);

    /* Packed q over contiguous k and v [B, Hkv, Lk, D]: only q is packed. */
    p.cu_seqlens_k = 0;
    p.k_sb = p.v_sb = 2 * 300 * D, p.k_sh = p.v_sh = 300 * D, p.k_ss = p.v_ss = D;
    const fjr_tma_rows qrows = {1000, 0};
    nenc = 0;
    assert_int_equal(fjr_tma_maps_build(&drv, &c, &p, &qrows, &maps, err, sizeof err), FJ_OK);
    assert_int_equal(nenc, 3);
    assert_int_equal(maps.o_ok, 0);
    const int64_t kd2[4] = {D, 300, 2, 3}, ks2[3] = {D * 2, 300 * D * 2, 2 * 300 * D * 2};
    expect(&encs[1], 8192, kd2, ks2, (uint32_t)c.block_n);
  }
}

/* Page pools [num_pages = 37, page_size, Hkv = 2, D]: (D, page_size, Hkv,
 * num_pages), boxes that never cross a page. */
static void test_paged(void **state) {
  (void)state;
  const fjr_driver drv = fake_driver();
  static const int head_dims[] = {64, 128, 256};
  static const int page_sizes[] = {16, 32, 48, 64, 80, 128, 144, 192, 256};
  for (size_t di = 0; di < 3; di++) {
    const int D = head_dims[di];
    const fjg_config c = sm90(D, D == 128);
    for (size_t pi = 0; pi < sizeof page_sizes / sizeof page_sizes[0]; pi++) {
      const int ps = page_sizes[pi];
      fjr_fwd_params_fixed p;
      memset(&p, 0, sizeof p);
      p.q = 4096, p.k = 8192, p.v = 12288, p.o = 16384;
      p.sz.B = 2, p.sz.Hq = 4, p.sz.Hkv = 2, p.sz.Lq = 100, p.sz.Lk = 10 * ps;
      p.q_ss = p.o_ss = D, p.q_sh = p.o_sh = 100 * D, p.q_sb = p.o_sb = 400 * D;
      p.k_ss = p.v_ss = 2 * D, p.k_sh = p.v_sh = D, p.k_sb = p.v_sb = 2 * ps * D;
      p.seqlens_k = 256, p.block_table = 512, p.bt_stride = 10, p.page_size = ps;
      const fjr_tma_rows rows = {0, 37};
      fjr_tma_maps maps;
      char err[256] = "";
      nenc = 0;
      assert_int_equal(fjr_tma_maps_build(&drv, &c, &p, &rows, &maps, err, sizeof err), FJ_OK);
      /* The box: the largest power of two dividing ps, at most block_n. */
      uint32_t box = 1;
      while (ps % (int)(box * 2) == 0 && (int)(box * 2) <= c.block_n) box *= 2;
      assert_true(ps % box == 0 && c.block_n % box == 0 && box >= 16);
      const int64_t kd[4] = {D, ps, 2, 37}, ks[3] = {2 * D * 2, D * 2, 2 * ps * D * 2};
      expect(&encs[1], 8192, kd, ks, box);
      expect(&encs[2], 12288, kd, ks, box);
      /* q and o are as without serving fields. */
      const int64_t qd[4] = {D, 100, 4, 2}, qs[3] = {D * 2, 100 * D * 2, 400 * D * 2};
      expect(&encs[0], 4096, qd, qs, (uint32_t)c.block_m);
      const int o_used = !(c.persistent && c.q_bufs < 2);
      assert_int_equal(maps.o_ok, o_used);
      assert_int_equal(nenc, 3 + o_used);
      if (o_used) expect(&encs[3], 16384, qd, qs, 64);
    }
  }
}

/* seqlens_k over contiguous k and v: every map as without it. */
static void test_seqlens_only(void **state) {
  (void)state;
  const fjr_driver drv = fake_driver();
  const int D = 64;
  const fjg_config c = sm90(D, 0);
  fjr_fwd_params_fixed p;
  memset(&p, 0, sizeof p);
  p.q = 4096, p.k = 8192, p.v = 12288, p.o = 16384;
  p.sz.B = 2, p.sz.Hq = 2, p.sz.Hkv = 1, p.sz.Lq = 64, p.sz.Lk = 500;
  p.q_ss = p.o_ss = D, p.q_sh = p.o_sh = 64 * D, p.q_sb = p.o_sb = 128 * D;
  p.k_ss = p.v_ss = D, p.k_sh = p.v_sh = 500 * D, p.k_sb = p.v_sb = 500 * D;
  p.seqlens_k = 256;
  fjr_tma_maps maps;
  char err[256] = "";
  nenc = 0;
  assert_int_equal(fjr_tma_maps_build(&drv, &c, &p, NULL, &maps, err, sizeof err), FJ_OK);
  assert_int_equal(nenc, 4);
  assert_int_equal(maps.o_ok, 1);
  const int64_t kd[4] = {D, 500, 1, 2}, ks[3] = {D * 2, 500 * D * 2, 500 * D * 2};
  expect(&encs[1], 8192, kd, ks, (uint32_t)c.block_n);
}

/* A packed or paged tensor without its dimension 0 is refused by name. */
static void test_rows_missing(void **state) {
  (void)state;
  const fjr_driver drv = fake_driver();
  const fjg_config c = sm90(128, 1);
  fjr_fwd_params_fixed p;
  memset(&p, 0, sizeof p);
  p.q = p.k = p.v = p.o = 4096;
  p.sz.B = 1, p.sz.Hq = p.sz.Hkv = 1, p.sz.Lq = p.sz.Lk = 64;
  p.q_ss = p.k_ss = p.v_ss = p.o_ss = 128;
  p.q_sh = p.k_sh = p.v_sh = p.o_sh = 128;
  fjr_tma_maps maps;
  char err[256] = "";
  p.cu_seqlens_q = 256;
  assert_int_equal(fjr_tma_maps_build(&drv, &c, &p, NULL, &maps, err, sizeof err), FJ_EINVAL);
  assert_non_null(strstr(err, "rows"));
  p.cu_seqlens_q = 0, p.block_table = 512, p.page_size = 16;
  const fjr_tma_rows no_pages = {0, 0};
  assert_int_equal(fjr_tma_maps_build(&drv, &c, &p, &no_pages, &maps, err, sizeof err),
                   FJ_EINVAL);
  assert_non_null(strstr(err, "rows"));
  /* The backward's maps likewise, for packed k. */
  fjg_config bc;
  assert_int_equal(fjg_config_choose_backward(128, FJ_DTYPE_BF16, "sm_90a", "sm90", &bc, err,
                                              sizeof err),
                   FJ_OK);
  fjr_bwd_params_fixed bp;
  memset(&bp, 0, sizeof bp);
  bp.q = bp.k = bp.v = bp.dout = bp.dk = bp.dv = bp.dq_accum = 4096;
  bp.sz.B = 1, bp.sz.Hq = bp.sz.Hkv = 1, bp.sz.Lq = bp.sz.Lk = 64;
  bp.cu_seqlens_q = bp.cu_seqlens_k = 256;
  const fjr_tma_rows q_only = {300, 0};
  fjr_tma_bwd_maps bmaps;
  assert_int_equal(fjr_tma_bwd_maps_build(&drv, &bc, &bp, &q_only, &bmaps, err, sizeof err),
                   FJ_EINVAL);
  assert_non_null(strstr(err, "fjr_tma_bwd_maps_build: a packed tensor without its rows"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_packed),
      cmocka_unit_test(test_paged),
      cmocka_unit_test(test_seqlens_only),
      cmocka_unit_test(test_rows_missing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
