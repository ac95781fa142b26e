/*
 * tests/unit/test_bwd_args.c: the backward's checks of its tensors and of
 * packed variable-length batches without a GPU (runtime/backward.c,
 * fjr_backward_check). Each bad input must fail with an error that names
 * the tensor or field and the rule; good inputs must fill the parameter
 * struct's strides, sizes, cu_seqlens and scratch row count as the kernels
 * read them. The public entry point must run the same checks, and the
 * workspace rule for packed batches, before touching a device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flexjit.h"
#include "runtime/backward.h"
#include "runtime/launch_params.h"
#include "tests/unit/fake_tensors.h"

/* A packed batch of 3 sequences (300 query rows, 280 kv rows in all), 8
 * query heads over 2 kv heads at D = 128, with every tensor of the
 * backward. */
typedef struct launch {
  fjt_packed_shapes sh;
  DLTensor q, k, v, o, dout, dq, dk, dv, lse, dlse, cu_q, cu_k;
  fj_backward_args a;
} launch;

static void packed(launch *t) {
  memset(t, 0, sizeof *t);
  fjt_packed_shapes_init(&t->sh);
  t->q = fjt_tensor(t->sh.qs, 3, fjt_bf16, 0x100000);
  t->k = fjt_tensor(t->sh.ks, 3, fjt_bf16, 0x200000);
  t->v = fjt_tensor(t->sh.ks, 3, fjt_bf16, 0x300000);
  t->o = fjt_tensor(t->sh.qs, 3, fjt_bf16, 0x400000);
  t->dout = fjt_tensor(t->sh.qs, 3, fjt_bf16, 0x500000);
  t->dq = fjt_tensor(t->sh.qs, 3, fjt_bf16, 0x600000);
  t->dk = fjt_tensor(t->sh.ks, 3, fjt_bf16, 0x700000);
  t->dv = fjt_tensor(t->sh.ks, 3, fjt_bf16, 0x800000);
  t->lse = fjt_tensor(t->sh.ls, 2, fjt_f32, 0x900000);
  t->dlse = fjt_tensor(t->sh.ls, 2, fjt_f32, 0xa00000);
  t->cu_q = fjt_tensor(t->sh.cus, 1, fjt_i32, 0xb00000);
  t->cu_k = fjt_tensor(t->sh.cuks, 1, fjt_i32, 0xb01000);
  t->a = (fj_backward_args){.q = &t->q, .k = &t->k, .v = &t->v, .o = &t->o,
                            .dout = &t->dout, .dq = &t->dq, .dk = &t->dk, .dv = &t->dv,
                            .lse = &t->lse, .dlse = &t->dlse, .cu_seqlens_q = &t->cu_q,
                            .cu_seqlens_k = &t->cu_k, .max_seqlen_q = 150,
                            .max_seqlen_k = 140};
}

static void expect_bad(fj_context *ctx, launch *t, fj_status status, const char *text) {
  fjr_bwd_params_fixed p;
  memset(&p, 0, sizeof p);
  fj_dtype dt;
  fj_status st = fjr_backward_check(ctx, &t->a, &dt, &p);
  if (st != status || !strstr(fj_context_last_error(ctx), text))
    fail_msg("expected %s with '%s', got %s: %s", fj_status_name(status), text,
             fj_status_name(st), fj_context_last_error(ctx));
}

static void expect_good(fj_context *ctx, launch *t, fjr_bwd_params_fixed *p) {
  memset(p, 0, sizeof *p);
  fj_dtype dt;
  fj_status st = fjr_backward_check(ctx, &t->a, &dt, p);
  if (st != FJ_OK) fail_msg("%s: %s", fj_status_name(st), fj_context_last_error(ctx));
  assert_int_equal(dt, FJ_DTYPE_BF16);
}

static void test_packed_fills_params(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  launch t;
  fjr_bwd_params_fixed p;
  packed(&t);
  expect_good(ctx, &t, &p);
  assert_int_equal(p.sz.B, 3);
  assert_int_equal(p.sz.Hq, 8);
  assert_int_equal(p.sz.Hkv, 2);
  assert_int_equal(p.sz.Lq, 150);
  assert_int_equal(p.sz.Lk, 140);
  assert_int_equal(p.kv_group, 4);
  /* Rows are dimension 0: the row stride is H * D, the batch stride 0. */
  const struct {
    int64_t sb, sh, ss, want_ss;
  } rows[] = {{p.q_sb, p.q_sh, p.q_ss, 8 * 128},    {p.o_sb, p.o_sh, p.o_ss, 8 * 128},
              {p.do_sb, p.do_sh, p.do_ss, 8 * 128}, {p.dq_sb, p.dq_sh, p.dq_ss, 8 * 128},
              {p.k_sb, p.k_sh, p.k_ss, 2 * 128},    {p.v_sb, p.v_sh, p.v_ss, 2 * 128},
              {p.dk_sb, p.dk_sh, p.dk_ss, 2 * 128}, {p.dv_sb, p.dv_sh, p.dv_ss, 2 * 128}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    assert_int_equal(rows[i].sb, 0);
    assert_int_equal(rows[i].sh, 128);
    assert_int_equal(rows[i].ss, rows[i].want_ss);
  }
  assert_int_equal(p.q, 0x100000);
  assert_int_equal(p.dv, 0x800000);
  /* lse and dlse [Hq, total_q]. */
  assert_int_equal(p.lse_sb, 0);
  assert_int_equal(p.lse_sh, 300);
  assert_int_equal(p.dlse_sb, 0);
  assert_int_equal(p.dlse_sh, 300);
  assert_int_equal(p.lse, 0x900000);
  assert_int_equal(p.dlse, 0xa00000);
  assert_int_equal(p.cu_seqlens_q, 0xb00000);
  assert_int_equal(p.cu_seqlens_k, 0xb01000);
  /* A query head's scratch rows: total_q + 64 a sequence. */
  assert_int_equal(p.acc_sh, 300 + 64 * 3);

  /* Packed queries over k and v of [B, Hkv, Lk, D]. */
  int64_t ks4[4] = {3, 2, 500, 128};
  DLTensor k4 = fjt_tensor(ks4, 4, fjt_bf16, 0x200000);
  t.a.k = t.a.v = t.a.dk = t.a.dv = &k4;
  t.a.cu_seqlens_k = NULL;
  t.a.max_seqlen_k = 0;
  expect_good(ctx, &t, &p);
  assert_int_equal(p.sz.Lk, 500);
  assert_int_equal(p.sz.Lq, 150);
  assert_int_equal(p.k_sb, 2 * 500 * 128);
  assert_int_equal(p.k_sh, 500 * 128);
  assert_int_equal(p.k_ss, 128);
  assert_int_equal(p.dv_ss, 128);
  assert_int_equal(p.q_sb, 0);
  assert_int_equal(p.cu_seqlens_k, 0);
  assert_int_equal(p.acc_sh, 300 + 64 * 3);
  fj_context_destroy(ctx);
}

/* Without cu_seqlens: [B, H, S, D] (BSHD through strides), no packed
 * fields, a head's scratch rows are Lq. */
static void test_unpacked_fills_params(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  int64_t qs[4] = {2, 4, 100, 64}, ks[4] = {2, 2, 90, 64}, ls[3] = {2, 4, 100};
  /* q as BSHD: [B, S, H, D] in memory. */
  int64_t qst[4] = {100 * 4 * 64, 64, 4 * 64, 1};
  DLTensor q = fjt_tensor(qs, 4, fjt_bf16, 0x100000),
           k = fjt_tensor(ks, 4, fjt_bf16, 0x200000),
           lse = fjt_tensor(ls, 3, fjt_f32, 0x300000);
  q.strides = qst;
  fj_backward_args a = {.q = &q, .k = &k, .v = &k, .o = &q, .dout = &q, .dq = &q,
                        .dk = &k, .dv = &k, .lse = &lse};
  fjr_bwd_params_fixed p;
  memset(&p, 0, sizeof p);
  fj_dtype dt;
  if (fjr_backward_check(ctx, &a, &dt, &p) != FJ_OK) fail_msg("%s", fj_context_last_error(ctx));
  assert_int_equal(p.sz.B, 2);
  assert_int_equal(p.sz.Lq, 100);
  assert_int_equal(p.sz.Lk, 90);
  assert_int_equal(p.q_sb, 100 * 4 * 64);
  assert_int_equal(p.q_sh, 64);
  assert_int_equal(p.q_ss, 4 * 64);
  assert_int_equal(p.lse_sb, 4 * 100);
  assert_int_equal(p.lse_sh, 100);
  assert_int_equal(p.cu_seqlens_q, 0);
  assert_int_equal(p.cu_seqlens_k, 0);
  assert_int_equal(p.acc_sh, 128); /* Lq rounded up to 64 */
  fj_context_destroy(ctx);
}

static void test_packed_rejects_bad_input(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  launch t;

  /* Which fields go together (the forward's rules). */
  packed(&t);
  t.a.cu_seqlens_q = NULL;
  expect_bad(ctx, &t, FJ_EINVAL, "cu_seqlens_k is set but cu_seqlens_q is NULL");
  packed(&t);
  t.a.cu_seqlens_q = t.a.cu_seqlens_k = NULL;
  expect_bad(ctx, &t, FJ_EINVAL, "max_seqlen_q is 150 but cu_seqlens_q is NULL");
  packed(&t);
  t.a.cu_seqlens_k = NULL;
  expect_bad(ctx, &t, FJ_EINVAL, "max_seqlen_k is 140 but cu_seqlens_k is NULL");
  packed(&t);
  t.a.max_seqlen_q = 0;
  expect_bad(ctx, &t, FJ_EINVAL, "max_seqlen_q is 0");
  packed(&t);
  t.a.max_seqlen_k = -1;
  expect_bad(ctx, &t, FJ_EINVAL, "max_seqlen_k is -1");

  /* The int32 arrays. */
  packed(&t);
  t.sh.cus[0] = 1;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_q: 1 entries");
  packed(&t);
  t.sh.cuks[0] = 5;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_k has 5 entries and cu_seqlens_q 4");
  packed(&t);
  t.cu_q.dtype = fjt_i64;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_q");
  packed(&t);
  t.cu_k.data = (void *)0xb01002;
  expect_bad(ctx, &t, FJ_ETENSOR, "cu_seqlens_k: data must be 4-byte aligned");

  /* Packed tensors are 3-D, [total, H, D], of one total per side. */
  packed(&t);
  int64_t q4[4] = {3, 8, 100, 128};
  DLTensor q4t = fjt_tensor(q4, 4, fjt_bf16, 0x100000);
  t.a.q = &q4t;
  expect_bad(ctx, &t, FJ_ETENSOR, "q");
  packed(&t);
  int64_t short_q[3] = {299, 8, 128};
  t.dq.shape = short_q;
  expect_bad(ctx, &t, FJ_ETENSOR, "dq: shape");
  packed(&t);
  t.dout.shape = short_q;
  expect_bad(ctx, &t, FJ_ETENSOR, "dout: shape");
  packed(&t);
  int64_t long_k[3] = {281, 2, 128};
  t.dk.shape = long_k;
  expect_bad(ctx, &t, FJ_ETENSOR, "dk: shape");
  packed(&t);
  int64_t heads_k[3] = {280, 4, 128};
  t.dv.shape = heads_k;
  expect_bad(ctx, &t, FJ_ETENSOR, "dv: shape");
  packed(&t);
  t.dv.data = (void *)0x800008;
  expect_bad(ctx, &t, FJ_ETENSOR, "dv: data must be 16-byte aligned");
  packed(&t);
  int64_t k3[3] = {280, 3, 128};
  t.k.shape = k3;
  expect_bad(ctx, &t, FJ_ETENSOR, "multiple of key/value heads (3)");
  packed(&t);
  int64_t d256[3] = {300, 8, 256};
  t.q.shape = d256;
  expect_bad(ctx, &t, FJ_EUNSUPPORTED, "head dim 256");

  /* lse and dlse [Hq, total_q]. */
  packed(&t);
  int64_t l3[3] = {3, 8, 150};
  DLTensor l3t = fjt_tensor(l3, 3, fjt_f32, 0x900000);
  t.a.lse = &l3t;
  expect_bad(ctx, &t, FJ_ETENSOR, "lse");
  packed(&t);
  int64_t lshort[2] = {8, 299};
  t.lse.shape = lshort;
  expect_bad(ctx, &t, FJ_ETENSOR, "lse: shape");
  packed(&t);
  t.dlse.shape = lshort;
  expect_bad(ctx, &t, FJ_ETENSOR, "dlse: shape");
  packed(&t);
  t.a.lse = NULL;
  expect_bad(ctx, &t, FJ_ETENSOR, "lse: the forward's LSE is required");

  /* Sequences are masked as their own: no block mask. */
  packed(&t);
  t.a.block_mask = (const fj_block_mask *)0x1; /* never read: refused first */
  expect_bad(ctx, &t, FJ_EUNSUPPORTED, "a block mask cannot be combined with a packed batch");

  fj_context_destroy(ctx);
}

/* fj_attention_backward runs the checks, and the workspace rule of a
 * packed batch, before it touches a device; every case here fails before
 * that. fj_backward_workspace_size(B, Hq, max_seqlen_q + 64, D) covers a
 * packed batch whose q holds only its sequences' rows. */
static void test_public_entry_checks(void **state) {
  (void)state;
  fj_context *ctx = fjt_new_context();
  const char src[] = "return { mask_mod = causal() }\n";
  fj_spec *spec = NULL;
  assert_int_equal(fj_spec_load_string(ctx, src, strlen(src), "c.lua", &spec), FJ_OK);
  launch t;
  packed(&t);
  t.sh.cus[0] = 1;
  assert_int_equal(fj_attention_backward(ctx, spec, &t.a), FJ_ETENSOR);
  assert_non_null(strstr(fj_context_last_error(ctx), "cu_seqlens_q: 1 entries"));

  /* The scratch of this batch: delta and dq_accum over 8 x (300 + 3 x 64)
   * rows, semaphores for 3 x 8 x ceil(150 / 16) tiles and the counters
   * (2 + 3 x 8 ints), each 256-aligned. */
  const size_t rows = 8 * (300 + 3 * 64);
  const size_t need = (rows * 4 + 255) / 256 * 256 + (rows * 128 * 4 + 255) / 256 * 256 +
                      ((2 + 3 * 8 * 11) * 4 + 255) / 256 * 256;
  packed(&t);
  t.a.workspace = (void *)0x1000000;
  t.a.workspace_bytes = need - 1;
  assert_int_equal(fj_attention_backward(ctx, spec, &t.a), FJ_EINVAL);
  char want[96];
  snprintf(want, sizeof want, "the backward needs %zu bytes", need);
  if (!strstr(fj_context_last_error(ctx), want))
    fail_msg("expected '%s': %s", want, fj_context_last_error(ctx));
  assert_non_null(strstr(fj_context_last_error(ctx), "max_seqlen_q + 64"));
  assert_true(fj_backward_workspace_size(3, 8, 150 + 64, 128) >= need);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_packed_fills_params),
      cmocka_unit_test(test_unpacked_fills_params),
      cmocka_unit_test(test_packed_rejects_bad_input),
      cmocka_unit_test(test_public_entry_checks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
