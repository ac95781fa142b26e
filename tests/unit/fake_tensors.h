/*
 * tests/unit/fake_tensors.h: the fixtures of the tests of the launch checks
 * (test_bwd_args for the backward, test_serving_args for the forward's
 * serving layouts), which run before a device is touched: a memory-only
 * context, the dtypes, DLTensors on a CUDA device at fake addresses, and
 * the shapes of one packed batch.
 * Include after <cmocka.h>.
 */
#ifndef FJ_TESTS_FAKE_TENSORS_H
#define FJ_TESTS_FAKE_TENSORS_H

#include <stdint.h>
#include <string.h>

#include "flexjit.h"

static const DLDataType fjt_bf16 = {kDLBfloat, 16, 1}, fjt_f32 = {kDLFloat, 32, 1},
                        fjt_i32 = {kDLInt, 32, 1}, fjt_i64 = {kDLInt, 64, 1};

/* A context without a cache directory (memory only). */
static inline fj_context *fjt_new_context(void) {
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = "";
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  return ctx;
}

/* A dense tensor of `shape` (borrowed) on CUDA device 0 at addr, which is
 * never dereferenced on the host. */
static inline DLTensor fjt_tensor(int64_t *shape, int ndim, DLDataType dt, uintptr_t addr) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = (void *)addr;
  t.device = (DLDevice){kDLCUDA, 0};
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

/* The tensors of a dense BHSD launch: q and o [B, Hq, Lq, D], k and v [B,
 * Hkv, Lk, D], lse [B, Hq, Lq], and the backward's dq, dk, dv and dout
 * shaped alike. */
typedef struct fjt_dense {
  int64_t qs[4], ks[4], ls[3];
  DLTensor q, k, v, o, lse, dq, dk, dv, dout;
} fjt_dense;

static inline void fjt_dense_init(fjt_dense *t, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq,
                                  int64_t Lk, int64_t D) {
  const int64_t qs[4] = {B, Hq, Lq, D}, ks[4] = {B, Hkv, Lk, D}, ls[3] = {B, Hq, Lq};
  memcpy(t->qs, qs, sizeof qs);
  memcpy(t->ks, ks, sizeof ks);
  memcpy(t->ls, ls, sizeof ls);
  t->q = fjt_tensor(t->qs, 4, fjt_bf16, 0x10000);
  t->k = fjt_tensor(t->ks, 4, fjt_bf16, 0x20000);
  t->v = fjt_tensor(t->ks, 4, fjt_bf16, 0x30000);
  t->o = fjt_tensor(t->qs, 4, fjt_bf16, 0x40000);
  t->lse = fjt_tensor(t->ls, 3, fjt_f32, 0x50000);
  t->dq = fjt_tensor(t->qs, 4, fjt_bf16, 0x60000);
  t->dk = fjt_tensor(t->ks, 4, fjt_bf16, 0x70000);
  t->dv = fjt_tensor(t->ks, 4, fjt_bf16, 0x80000);
  t->dout = fjt_tensor(t->qs, 4, fjt_bf16, 0x90000);
}

/* The shapes of a packed batch of 3 sequences, 300 query rows and 280 kv
 * rows in all, 8 query heads over 2 kv heads at D = 128: q [300, 8, 128],
 * k [280, 2, 128], lse [8, 300], cu_seqlens_q and cu_seqlens_k [4]. */
typedef struct fjt_packed_shapes {
  int64_t qs[3], ks[3], ls[2], cus[1], cuks[1];
} fjt_packed_shapes;

static inline void fjt_packed_shapes_init(fjt_packed_shapes *s) {
  const int64_t qs[3] = {300, 8, 128}, ks[3] = {280, 2, 128}, ls[2] = {8, 300};
  memcpy(s->qs, qs, sizeof qs);
  memcpy(s->ks, ks, sizeof ks);
  memcpy(s->ls, ls, sizeof ls);
  s->cus[0] = s->cuks[0] = 4;
}

#endif /* FJ_TESTS_FAKE_TENSORS_H */
