/*
 * tests/unit/test_serving_args.c: the forward's checks of the serving
 * layouts without a GPU (runtime/serving.c, fjr_forward_check): packed
 * variable-length batches, per-sequence kv lengths, paged KV and Skip
 * Softmax's threshold. Each bad input must fail with an error that names
 * the tensor or field and the rule; good inputs must fill the parameter
 * struct's strides, sizes and serving fields as the kernels read them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flexjit.h"
#include "runtime/forward.h"
#include "runtime/launch_params.h"
#include "tests/unit/fake_tensors.h"

/* A packed batch of 3 sequences (300 query rows, 280 kv rows in all), 8
 * query heads over 2 kv heads at D = 128, and the same queries over a page
 * pool of 40 pages of 64 rows with a [3, 10] block table. */
typedef struct launch {
  fjt_packed_shapes sh;
  int64_t pools[4], bts[2], sls[1];
  DLTensor q, k, v, o, lse, cu_q, cu_k, pool_k, pool_v, bt, seqlens;
  fj_forward_args a;
} launch;

static void packed(launch *t) {
  memset(t, 0, sizeof *t);
  fjt_packed_shapes_init(&t->sh);
  t->q = fjt_tensor(t->sh.qs, 3, fjt_bf16, 0x10000);
  t->k = fjt_tensor(t->sh.ks, 3, fjt_bf16, 0x20000);
  t->v = fjt_tensor(t->sh.ks, 3, fjt_bf16, 0x30000);
  t->o = fjt_tensor(t->sh.qs, 3, fjt_bf16, 0x40000);
  t->lse = fjt_tensor(t->sh.ls, 2, fjt_f32, 0x50000);
  t->cu_q = fjt_tensor(t->sh.cus, 1, fjt_i32, 0x60000);
  t->cu_k = fjt_tensor(t->sh.cuks, 1, fjt_i32, 0x61000);
  t->a = (fj_forward_args){.q = &t->q, .k = &t->k, .v = &t->v, .o = &t->o,
                           .lse = &t->lse, .cu_seqlens_q = &t->cu_q,
                           .cu_seqlens_k = &t->cu_k, .max_seqlen_q = 150,
                           .max_seqlen_k = 140};
}

/* packed(), with k and v page pools, a block table and kv lengths. */
static void paged(launch *t) {
  packed(t);
  const int64_t pools[4] = {40, 64, 2, 128}, bts[2] = {3, 10};
  memcpy(t->pools, pools, sizeof pools);
  memcpy(t->bts, bts, sizeof bts);
  t->sls[0] = 3;
  t->pool_k = fjt_tensor(t->pools, 4, fjt_bf16, 0x80000);
  t->pool_v = fjt_tensor(t->pools, 4, fjt_bf16, 0x90000);
  t->bt = fjt_tensor(t->bts, 2, fjt_i32, 0xa0000);
  t->seqlens = fjt_tensor(t->sls, 1, fjt_i32, 0xa1000);
  t->a.k = &t->pool_k;
  t->a.v = &t->pool_v;
  t->a.cu_seqlens_k = NULL;
  t->a.max_seqlen_k = 0;
  t->a.block_table = &t->bt;
  t->a.seqlens_k = &t->seqlens;
}

/* fjr_forward_check on t->a must fail with `status` and `text`. */
static void expect_bad(fj_context *ctx, launch *t, fj_status status, const char *text) {
  fjr_fwd_params_fixed p;
  memset(&p, 0, sizeof p);
  fj_dtype dt;
  fj_status st = fjr_forward_check(ctx, &t->a, &dt, &p);
  if (st != status || !strstr(fj_context_last_error(ctx), text))
    fail_msg("expected %s with '%s', got %s: %s", fj_status_name(status), text,
             fj_status_name(st), fj_context_last_error(ctx));
}

static void expect_good(fj_context *ctx, launch *t, fjr_fwd_params_fixed *p) {
  memset(p, 0, sizeof *p);
  fj_dtype dt;
  fj_status st = fjr_forward_check(ctx, &t->a, &dt, p);
  if (st != FJ_OK) fail_msg("%s: %s", fj_status_name(st), fj_context_last_error(ctx));
  assert_int_equal(dt, FJ_DTYPE_BF16);
}

static void test_packed_fills_params(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  launch t;
  fjr_fwd_params_fixed p;
  packed(&t);
  expect_good(ctx, &t, &p);
  assert_int_equal(p.sz.B, 3);
  assert_int_equal(p.sz.Hq, 8);
  assert_int_equal(p.sz.Hkv, 2);
  assert_int_equal(p.sz.Lq, 150);
  assert_int_equal(p.sz.Lk, 140);
  assert_int_equal(p.kv_group, 4);
  /* Rows are dimension 0: the row stride is Hq * D, the batch stride 0. */
  assert_int_equal(p.q_sb, 0);
  assert_int_equal(p.q_ss, 8 * 128);
  assert_int_equal(p.q_sh, 128);
  assert_int_equal(p.o_ss, 8 * 128);
  assert_int_equal(p.k_sb, 0);
  assert_int_equal(p.k_ss, 2 * 128);
  assert_int_equal(p.k_sh, 128);
  assert_int_equal(p.v_ss, 2 * 128);
  assert_int_equal(p.lse_sb, 0);
  assert_int_equal(p.lse_sh, 300);
  assert_int_equal(p.cu_seqlens_q, 0x60000);
  assert_int_equal(p.cu_seqlens_k, 0x61000);
  assert_int_equal(p.seqlens_k, 0);
  assert_int_equal(p.block_table, 0);
  assert_true(p.skip_log2 == 0.0f);

  /* Packed queries over kv of [B, Hkv, Lk, D] with per-sequence lengths. */
  int64_t ks4[4] = {3, 2, 500, 128}, sls[1] = {3};
  DLTensor k4 = fjt_tensor(ks4, 4, fjt_bf16, 0x20000),
           sl = fjt_tensor(sls, 1, fjt_i32, 0x62000);
  t.a.k = t.a.v = &k4;
  t.a.cu_seqlens_k = NULL;
  t.a.max_seqlen_k = 0;
  t.a.seqlens_k = &sl;
  expect_good(ctx, &t, &p);
  assert_int_equal(p.sz.Lk, 500);
  assert_int_equal(p.k_sb, 2 * 500 * 128);
  assert_int_equal(p.k_ss, 128);
  assert_int_equal(p.seqlens_k, 0x62000);
  assert_int_equal(p.cu_seqlens_k, 0);

  /* Skip Softmax's threshold as log2. */
  t.a.skip_softmax_threshold = 0.25f;
  expect_good(ctx, &t, &p);
  assert_true(p.skip_log2 == -2.0f);
  fj_context_destroy(ctx);
}

static void test_paged_fills_params(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  launch t;
  fjr_fwd_params_fixed p;
  paged(&t);
  expect_good(ctx, &t, &p);
  assert_int_equal(p.sz.B, 3);
  assert_int_equal(p.sz.Hkv, 2);
  assert_int_equal(p.sz.Lk, 10 * 64);
  assert_int_equal(p.page_size, 64);
  assert_int_equal(p.bt_stride, 10);
  assert_int_equal(p.block_table, 0xa0000);
  assert_int_equal(p.seqlens_k, 0xa1000);
  /* The batch stride is the page stride, rows then heads. */
  assert_int_equal(p.k_sb, 64 * 2 * 128);
  assert_int_equal(p.k_ss, 2 * 128);
  assert_int_equal(p.k_sh, 128);
  assert_int_equal(p.v_sb, 64 * 2 * 128);

  /* Dense queries [B, Hq, Lq, D] over the pool, without kv lengths. */
  int64_t qs4[4] = {3, 8, 33, 128}, ls3[3] = {3, 8, 33};
  DLTensor q4 = fjt_tensor(qs4, 4, fjt_bf16, 0x10000),
           o4 = fjt_tensor(qs4, 4, fjt_bf16, 0x40000),
           l3 = fjt_tensor(ls3, 3, fjt_f32, 0x50000);
  t.a.q = &q4, t.a.o = &o4, t.a.lse = &l3;
  t.a.cu_seqlens_q = NULL;
  t.a.max_seqlen_q = 0;
  t.a.seqlens_k = NULL;
  expect_good(ctx, &t, &p);
  assert_int_equal(p.sz.Lq, 33);
  assert_int_equal(p.q_sb, 8 * 33 * 128);
  assert_int_equal(p.lse_sb, 8 * 33);
  assert_int_equal(p.seqlens_k, 0);
  assert_int_equal(p.block_table, 0xa0000);
  fj_context_destroy(ctx);
}

static void test_packed_rejects_bad_input(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  launch t;

  packed(&t);
  t.cu_q.dtype = fjt_i64;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_q: dtype int64, expected int32");

  packed(&t);
  int64_t cu2[2] = {2, 2};
  t.cu_q.shape = cu2;
  t.cu_q.ndim = 2;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_q: expected 1 dimensions");

  packed(&t);
  int64_t stride2[1] = {2};
  t.cu_k.strides = stride2;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_k: the last dimension must be contiguous");

  packed(&t);
  t.cu_q.device.device_type = kDLCPU;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_q: tensor is not on a CUDA device");

  packed(&t);
  t.cu_q.data = (void *)0x60002;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_q: data must be 4-byte aligned");

  packed(&t);
  t.sh.cuks[0] = 5;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_k has 5 entries and cu_seqlens_q 4");

  packed(&t);
  t.sh.cus[0] = t.sh.cuks[0] = 1;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_q: 1 entries; it is [B + 1] with B >= 1");

  packed(&t);
  t.a.max_seqlen_q = 0;
  expect_bad(ctx, &t, FJ_EINVAL, "max_seqlen_q is 0");

  packed(&t);
  t.a.max_seqlen_k = -3;
  expect_bad(ctx, &t, FJ_EINVAL, "max_seqlen_k is -3");

  packed(&t);
  t.a.cu_seqlens_q = NULL;
  t.a.max_seqlen_q = 0;
  expect_bad(ctx, &t, FJ_EINVAL, "cu_seqlens_k is set but cu_seqlens_q is NULL");

  packed(&t);
  t.a.cu_seqlens_q = NULL;
  t.a.cu_seqlens_k = NULL;
  t.a.max_seqlen_k = 0;
  expect_bad(ctx, &t, FJ_EINVAL, "max_seqlen_q is 150 but cu_seqlens_q is NULL");

  packed(&t);
  t.a.cu_seqlens_k = NULL;
  expect_bad(ctx, &t, FJ_EINVAL, "max_seqlen_k is 140 but cu_seqlens_k is NULL");

  packed(&t);
  int64_t q4[4] = {3, 8, 100, 128};
  t.q.shape = q4;
  t.q.ndim = 4;
  expect_bad(ctx, &t, FJ_ETENSOR, "q: expected a 3-D tensor [total_q, Hq, D]");

  packed(&t);
  int64_t k4[4] = {3, 2, 100, 128};
  t.k.shape = k4;
  t.k.ndim = 4;
  expect_bad(ctx, &t, FJ_ETENSOR, "k: expected 3 dimensions");

  packed(&t);
  int64_t v3[3] = {281, 2, 128};
  t.v.shape = v3;
  expect_bad(ctx, &t, FJ_ETENSOR, "v: shape [281, 2, 128] does not match the expected "
                                  "[280, 2, 128]");

  packed(&t);
  int64_t o3[3] = {300, 4, 128};
  t.o.shape = o3;
  expect_bad(ctx, &t, FJ_ETENSOR, "o: shape");

  packed(&t);
  int64_t l3[3] = {3, 8, 150};
  t.lse.shape = l3;
  t.lse.ndim = 3;
  expect_bad(ctx, &t, FJ_ETENSOR, "lse: expected 2 dimensions");

  packed(&t);
  t.sh.ls[1] = 299;
  expect_bad(ctx, &t, FJ_ETENSOR, "lse: shape [8, 299] does not match the expected [8, 300]");

  packed(&t);
  t.sh.ks[1] = 3;
  expect_bad(ctx, &t, FJ_ETENSOR, "query heads (8) must be a multiple of key/value heads (3)");

  packed(&t);
  int64_t badq[3] = {8 * 128, 128, 2};
  t.q.strides = badq;
  expect_bad(ctx, &t, FJ_ETENSOR, "q: the last dimension must be contiguous");

  packed(&t);
  int64_t sls[1] = {3};
  DLTensor sl = fjt_tensor(sls, 1, fjt_i32, 0x62000);
  t.a.seqlens_k = &sl;
  expect_bad(ctx, &t, FJ_EINVAL, "seqlens_k and cu_seqlens_k are both set");

  fj_context_destroy(ctx);
}

static void test_paged_rejects_bad_input(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  launch t;

  static const int64_t bad_pages[] = {24, 8, 272, 512};
  for (size_t i = 0; i < sizeof bad_pages / sizeof bad_pages[0]; i++) {
    paged(&t);
    t.pools[1] = bad_pages[i];
    char want[96];
    snprintf(want, sizeof want, "k: page size %lld", (long long)bad_pages[i]);
    expect_bad(ctx, &t, FJ_ETENSOR, want);
    assert_non_null(strstr(fj_context_last_error(ctx), "multiple of 16, at most 256"));
  }

  /* Page sizes that are multiples of 16 but not sizes. */
  static const int64_t not_sizes[] = {-16, INT64_MIN};
  for (size_t i = 0; i < sizeof not_sizes / sizeof not_sizes[0]; i++) {
    paged(&t);
    t.pools[1] = not_sizes[i];
    expect_bad(ctx, &t, FJ_ETENSOR, "k: ");
  }

  /* A block table whose pages reach past 2^31 kv positions, also where
   * their count times the page size does not fit an int64. */
  static const int64_t many_pages[] = {(int64_t)1 << 25, (int64_t)1 << 60};
  for (size_t i = 0; i < sizeof many_pages / sizeof many_pages[0]; i++) {
    paged(&t);
    t.bts[1] = many_pages[i];
    expect_bad(ctx, &t, FJ_ETENSOR, "reach past 2^31 kv positions");
  }

  paged(&t);
  t.bt.dtype = fjt_i64;
  expect_bad(ctx, &t, FJ_ETENSOR, "block_table: dtype int64, expected int32");

  paged(&t);
  t.bt.ndim = 1;
  expect_bad(ctx, &t, FJ_ETENSOR, "block_table: expected 2 dimensions");

  paged(&t);
  t.bts[0] = 4;
  expect_bad(ctx, &t, FJ_ETENSOR, "block_table: 4 rows for a batch of 3 sequences");

  paged(&t);
  int64_t bt_strides[2] = {1, 3};
  t.bt.strides = bt_strides;
  expect_bad(ctx, &t, FJ_ETENSOR, "block_table: the last dimension must be contiguous");

  paged(&t);
  t.sls[0] = 2;
  expect_bad(ctx, &t, FJ_ETENSOR, "seqlens_k: 2 entries for a batch of 3 sequences");

  paged(&t);
  t.seqlens.dtype = fjt_f32;
  expect_bad(ctx, &t, FJ_ETENSOR, "seqlens_k: dtype float32, expected int32");

  paged(&t);
  t.seqlens.data = (void *)0xa1002;
  expect_bad(ctx, &t, FJ_ETENSOR, "seqlens_k: data must be 4-byte aligned");

  paged(&t);
  t.a.cu_seqlens_k = &t.cu_k;
  t.a.seqlens_k = NULL;
  t.a.max_seqlen_k = 140;
  expect_bad(ctx, &t, FJ_EINVAL, "block_table and cu_seqlens_k are both set");

  paged(&t);
  t.a.max_seqlen_k = 640;
  expect_bad(ctx, &t, FJ_EINVAL, "max_seqlen_k is 640 but cu_seqlens_k is NULL");

  paged(&t);
  t.pool_k.ndim = 3;
  expect_bad(ctx, &t, FJ_ETENSOR, "k: expected 4 dimensions");

  paged(&t);
  int64_t vpool[4] = {40, 32, 2, 128};
  t.pool_v.shape = vpool;
  expect_bad(ctx, &t, FJ_ETENSOR, "v: shape [40, 32, 2, 128] does not match the expected "
                                  "[40, 64, 2, 128]");

  paged(&t);
  int64_t kpool[4] = {40, 64, 2, 64};
  t.pool_k.shape = kpool;
  expect_bad(ctx, &t, FJ_ETENSOR, "k: shape [40, 64, 2, 64]");

  paged(&t);
  t.pools[2] = 3;
  expect_bad(ctx, &t, FJ_ETENSOR, "multiple of key/value heads (3)");

  paged(&t);
  t.pool_k.data = (void *)0x80008;
  expect_bad(ctx, &t, FJ_ETENSOR, "k: data must be 16-byte aligned");

  fj_context_destroy(ctx);
}

static void test_threshold(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  launch t;
  const float bad[] = {-0.1f, 1.0f, 2.0f, NAN, INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    packed(&t);
    t.a.skip_softmax_threshold = bad[i];
    expect_bad(ctx, &t, FJ_EINVAL, "skip_softmax_threshold");
    assert_non_null(strstr(fj_context_last_error(ctx), "outside [0, 1)"));
  }
  fj_context_destroy(ctx);
}

/* The public entry point runs the same checks before touching a device. */
static void test_public_entry_checks(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  const char src[] = "return { mask_mod = causal() }\n";
  fj_spec *spec = NULL;
  assert_int_equal(fj_spec_load_string(ctx, src, strlen(src), "c.lua", &spec), FJ_OK);
  launch t;
  paged(&t);
  t.pools[1] = 40;
  assert_int_equal(fj_attention_forward(ctx, spec, &t.a), FJ_ETENSOR);
  assert_non_null(strstr(fj_context_last_error(ctx), "k: page size 40"));
  packed(&t);
  t.a.max_seqlen_q = 0;
  assert_int_equal(fj_attention_forward(ctx, spec, &t.a), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "max_seqlen_q is 0"));
  /* A negative scale would turn the kernels' running max into a minimum. */
  packed(&t);
  t.a.scale = -0.1f;
  assert_int_equal(fj_attention_forward(ctx, spec, &t.a), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "must be positive"));
  /* Sizes whose product does not fit an int64: refused, not multiplied. */
  packed(&t);
  int64_t huge[3] = {(int64_t)1 << 40, (int64_t)1 << 20, (int64_t)1 << 10};
  t.q.shape = huge;
  assert_int_equal(fj_attention_forward(ctx, spec, &t.a), FJ_ETENSOR);
  assert_non_null(strstr(fj_context_last_error(ctx), "q: shape has more than 2^63 elements"));
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

/* fj_merge_states and fj_paged_from_csr check their tensors before touching
 * a device. */
static void test_merge_and_csr_checks(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  int64_t ps[5] = {3, 2, 4, 5, 64}, ls[4] = {3, 2, 4, 5}, os[4] = {2, 4, 5, 64};
  DLTensor parts = fjt_tensor(ps, 5, fjt_f32, 0x10000),
           lse = fjt_tensor(ls, 4, fjt_f32, 0x20000),
           o = fjt_tensor(os, 4, fjt_bf16, 0x30000);
  fj_merge_args m = {.o_parts = &parts, .lse_parts = &lse, .o = &o};
  o.dtype = fjt_f32;
  assert_int_equal(fj_merge_states(ctx, &m), FJ_ETENSOR);
  assert_non_null(strstr(fj_context_last_error(ctx), "o must be a 4-D"));
  o.dtype = fjt_bf16;
  os[3] = 72;
  assert_int_equal(fj_merge_states(ctx, &m), FJ_ETENSOR);
  assert_non_null(strstr(fj_context_last_error(ctx), "o:"));
  os[3] = 64;
  parts.data = (void *)0x10002; /* not float-aligned */
  assert_int_equal(fj_merge_states(ctx, &m), FJ_ETENSOR);
  assert_non_null(strstr(fj_context_last_error(ctx), "element size"));
  parts.data = (void *)0x10000;
  ps[4] = 60, os[3] = 60; /* not a multiple of 8 */
  assert_int_equal(fj_merge_states(ctx, &m), FJ_EUNSUPPORTED);
  assert_non_null(strstr(fj_context_last_error(ctx), "head dim 60"));
  m.o_parts = NULL;
  assert_int_equal(fj_merge_states(ctx, &m), FJ_EINVAL);

  int64_t ip[1] = {4}, ix[1] = {9}, ll[1] = {3}, bt[2] = {3, 4}, sl[1] = {3};
  DLTensor indptr = fjt_tensor(ip, 1, fjt_i32, 0x40000),
           indices = fjt_tensor(ix, 1, fjt_i32, 0x41000),
           last = fjt_tensor(ll, 1, fjt_i32, 0x42000),
           table = fjt_tensor(bt, 2, fjt_i32, 0x43000),
           lens = fjt_tensor(sl, 1, fjt_i32, 0x44000);
  fj_paged_csr_args c = {.kv_indptr = &indptr, .kv_indices = &indices,
                         .kv_last_page_len = &last, .page_size = 24,
                         .block_table = &table, .seqlens_k = &lens};
  assert_int_equal(fj_paged_from_csr(ctx, &c), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "page_size 24"));
  c.page_size = 16;
  ip[0] = 3;
  assert_int_equal(fj_paged_from_csr(ctx, &c), FJ_ETENSOR);
  assert_non_null(strstr(fj_context_last_error(ctx), "kv_indptr"));
  ip[0] = 4;
  indices.dtype = fjt_i64;
  assert_int_equal(fj_paged_from_csr(ctx, &c), FJ_ETENSOR);
  assert_non_null(strstr(fj_context_last_error(ctx), "kv_indices"));
  indices.dtype = fjt_i32;
  /* Block tables whose pages times the page size, or whose rows plus one,
   * do not fit an int64: refused by the limits, not computed. */
  int64_t far[2] = {1, (int64_t)1 << 60}, tall[2] = {INT64_MAX, 1};
  table.shape = far;
  ip[0] = 2, ll[0] = 1, sl[0] = 1; /* shaped for its one row */
  assert_int_equal(fj_paged_from_csr(ctx, &c), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "below 2^31"));
  table.shape = tall;
  assert_int_equal(fj_paged_from_csr(ctx, &c), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "B at most 65535"));
  fj_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_packed_fills_params),
      cmocka_unit_test(test_paged_fills_params),
      cmocka_unit_test(test_packed_rejects_bad_input),
      cmocka_unit_test(test_paged_rejects_bad_input),
      cmocka_unit_test(test_threshold),
      cmocka_unit_test(test_public_entry_checks),
      cmocka_unit_test(test_merge_and_csr_checks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
