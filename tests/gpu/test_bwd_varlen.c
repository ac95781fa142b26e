/*
 * tests/gpu/test_bwd_varlen.c: fj_attention_backward on packed
 * variable-length batches (cu_seqlens_q/k; docs/serving.md,
 * docs/backward.md) against the float64 reference, one sequence at a time:
 * each sequence is attended as its own (its Lq and Lk, positions from 0),
 * so its dq, dk and dv must be the reference's for that sequence alone,
 * within the tolerance rule for gradients (fjg_ref_check_grad: 3x the
 * error of the computation in the input dtype, plus a floor); trainable
 * buffers' gradients sum over the sequences. Sequences of odd lengths, an
 * empty one (no queries: its dk and dv are exactly 0; no keys: its dq is
 * exactly 0), causal, bottom-right causal and sliding-window masks, a
 * softcap and a trainable relative bias, GQA, fp16 and bf16, D 64 and 128,
 * dLSE, the deterministic mode (three runs bitwise equal), and k and v of
 * [B, Hkv, Lk, D] under packed queries. O and LSE come from the packed
 * forward. dq, dk and dv are poisoned with NaN, and each is followed by a
 * guard of 64 poisoned rows that must stay untouched. Every case runs with
 * the runtime's template (sm90 on sm_90a) and again with the sm80 template
 * named.
 *
 * Exits 77 (skipped) without a GPU. Prints one line per case and "N passed,
 * N failed"; exit status 1 when any failed.
 */
#include "gpu/gpu_util.h"

#define FLOOR_GRAD 1e-3
#define MAXB 6
#define GUARD_ROWS 64

static const char *const spec_src[][2] = {
    {"causal", "return { mask_mod = causal() }"},
    {"causal_br", "return { mask_mod = causal{align = \"bottom_right\"} }"},
    {"sliding_window", "return { mask_mod = sliding_window(param(\"window\", \"i32\")) }"},
    {"softcap_br",
     "return { mask_mod = causal{align = \"bottom_right\"}, score_mod = softcap(2.0) }"},
    {"rel_bias", "local bias = buffer('bias', 'f32', {grad = true})\n"
                 "return { mask_mod = causal(), score_mod = function(s, b, h, q, kv)\n"
                 "  return s + bias[h * 64 + min(max(q - kv, 0), 63)] end }"},
};
#define NSPECS (int)(sizeof spec_src / sizeof spec_src[0])

typedef struct vcase {
  const char *spec;
  fj_dtype dt;
  int D, Hq, Hkv, B;
  int lq[MAXB], lk[MAXB];
  int kv_packed; /* 0: k, v [B, Hkv, lk[0], D], every lk equal */
  int dlse, det;
} vcase;

static const fj_dtype BF = FJ_DTYPE_BF16, FP = FJ_DTYPE_F16;

static const vcase cases[] = {
    {"causal", BF, 128, 4, 2, 4, {1, 129, 300, 77}, {1, 129, 300, 77}, 1, 0, 0},
    {"causal", FP, 64, 2, 2, 5, {33, 0, 200, 1, 250}, {33, 0, 200, 1, 250}, 1, 1, 0},
    {"causal_br", BF, 64, 4, 1, 4, {50, 300, 5, 0}, {400, 100, 0, 70}, 1, 0, 0},
    {"causal_br", FP, 128, 2, 2, 3, {129, 64, 200}, {513, 64, 333}, 1, 0, 0},
    {"sliding_window", FP, 64, 8, 2, 3, {513, 17, 200}, {513, 17, 200}, 1, 0, 0},
    {"sliding_window", BF, 128, 2, 1, 3, {97, 0, 260}, {97, 0, 260}, 1, 1, 0},
    {"softcap_br", BF, 128, 4, 2, 3, {65, 191, 7}, {300, 191, 64}, 1, 0, 0},
    {"rel_bias", FP, 64, 2, 1, 3, {150, 1, 99}, {150, 1, 99}, 1, 0, 0},
    /* Packed queries over k and v of [B, Hkv, Lk, D]. */
    {"causal_br", BF, 128, 4, 2, 3, {100, 1, 250}, {300, 300, 300}, 0, 0, 0},
    /* The deterministic mode. */
    {"causal", BF, 128, 4, 2, 4, {300, 0, 611, 129}, {300, 0, 611, 129}, 1, 0, 1},
    {"sliding_window", FP, 64, 4, 4, 3, {400, 33, 700}, {400, 33, 700}, 1, 0, 1},
    {"causal_br", FP, 64, 2, 1, 3, {200, 64, 3}, {700, 0, 129}, 1, 1, 1},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static int find_spec(const char *name) {
  for (int i = 0; i < NSPECS; i++)
    if (!strcmp(spec_src[i][0], name)) return i;
  return -1;
}

static uint16_t to16(double x, fj_dtype dt) {
  return dt == FJ_DTYPE_F16 ? fjg_f32_to_f16((float)x) : fjg_f32_to_bf16((float)x);
}
static float from16(uint16_t x, fj_dtype dt) {
  return dt == FJ_DTYPE_F16 ? fjg_f16_to_f32(x) : fjg_bf16_to_f32(x);
}

/* A contiguous device tensor of `shape`, from host memory h (or
 * uninitialized), with `guard` bytes more allocated after it. */
static int upload(const fjr_driver *drv, gpu_tensor *t, const void *h, size_t bytes,
                  size_t guard, int ndim, const int64_t *shape, DLDataType dt) {
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    t->shape[i] = shape[i];
    t->strides[i] = stride;
    stride *= shape[i];
  }
  if (!gpu_alloc(drv, t, bytes + guard) ||
      (h && !gpu_cu_ok(drv, drv->cuMemcpyHtoD(t->ptr, h, bytes), "cuMemcpyHtoD")))
    return 0;
  t->bytes = (bytes + 3) & ~(size_t)3; /* the tensor; its guard lies after it */
  gpu_describe(t, ndim, dt);
  return 1;
}

typedef struct io {
  /* per sequence, [H][L][D] ([H][L] for dlse) */
  double *q[MAXB], *k[MAXB], *v[MAXB], *dout[MAXB], *dlse[MAXB];
  gpu_tensor q_d, k_d, v_d, o_d, do_d, lse_d, dlse_d, dq_d, dk_d, dv_d, cu_q, cu_k;
  gpu_tensor grads[GPU_MAX_ARGS];
  gpu_values vals;
  int cu[MAXB + 1], cuk[MAXB + 1], total_q, total_k, maxq, maxk;
} io;

static void io_free(const fjr_driver *drv, io *x) {
  for (int b = 0; b < MAXB; b++)
    free(x->q[b]), free(x->k[b]), free(x->v[b]), free(x->dout[b]), free(x->dlse[b]);
  gpu_tensor *ts[] = {&x->q_d,  &x->k_d,  &x->v_d,  &x->o_d,  &x->do_d, &x->lse_d,
                      &x->dlse_d, &x->dq_d, &x->dk_d, &x->dv_d, &x->cu_q, &x->cu_k};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) gpu_free(drv, ts[i]);
  for (int a = 0; a < GPU_MAX_ARGS; a++) gpu_free(drv, &x->grads[a]);
  gpu_values_free(drv, &x->vals);
}

/* Element offsets of row i of sequence b, head h: packed q-side rows, and
 * k-side rows (packed, or [B, Hkv, Lk, D]). */
static size_t q_off(const vcase *c, const io *x, int b, int h, int i) {
  return ((size_t)(x->cu[b] + i) * c->Hq + h) * c->D;
}
static size_t k_off(const vcase *c, const io *x, int b, int h, int i) {
  if (c->kv_packed) return ((size_t)(x->cuk[b] + i) * c->Hkv + h) * c->D;
  return (((size_t)b * c->Hkv + h) * c->lk[0] + i) * c->D;
}

/* Per-sequence inputs, packed on the device; the packed forward for O and
 * LSE; dq, dk, dv and their guards poisoned. */
static int prepare(fj_context *ctx, const fjr_driver *drv, const fj_spec *spec,
                   const vcase *c, uint64_t seed, io *x) {
  const DLDataType t16 = {c->dt == FJ_DTYPE_F16 ? kDLFloat : kDLBfloat, 16, 1};
  const DLDataType i32 = {kDLInt, 32, 1}, f32 = {kDLFloat, 32, 1};
  const int D = c->D, Hq = c->Hq, Hkv = c->Hkv, B = c->B;
  uint64_t s = seed;
  x->cu[0] = x->cuk[0] = 0;
  for (int b = 0; b < B; b++) {
    const size_t nq = (size_t)Hq * c->lq[b] * D, nk = (size_t)Hkv * c->lk[b] * D;
    x->q[b] = gpu_random_inputs(nq, c->dt, &s);
    x->dout[b] = gpu_random_inputs(nq, c->dt, &s);
    x->k[b] = gpu_random_inputs(nk, c->dt, &s);
    x->v[b] = gpu_random_inputs(nk, c->dt, &s);
    x->dlse[b] = c->dlse ? gpu_random_inputs((size_t)Hq * c->lq[b], FJ_DTYPE_BF16, &s) : NULL;
    if (!x->q[b] || !x->dout[b] || !x->k[b] || !x->v[b] || (c->dlse && !x->dlse[b])) return 0;
    x->cu[b + 1] = x->cu[b] + c->lq[b];
    x->cuk[b + 1] = x->cuk[b] + c->lk[b];
    x->maxq = c->lq[b] > x->maxq ? c->lq[b] : x->maxq;
    x->maxk = c->lk[b] > x->maxk ? c->lk[b] : x->maxk;
  }
  x->total_q = x->cu[B];
  x->total_k = c->kv_packed ? x->cuk[B] : B * c->lk[0];
  const size_t nq = (size_t)x->total_q * Hq * D, nk = (size_t)x->total_k * Hkv * D;
  const size_t nl = (size_t)Hq * x->total_q;
  uint16_t *hq = malloc(2 * nq), *hdo = malloc(2 * nq), *hk = malloc(2 * nk),
           *hv = malloc(2 * nk);
  float *hdl = malloc(4 * nl);
  int ok = hq && hdo && hk && hv && hdl;
  for (int b = 0; ok && b < B; b++) {
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < c->lq[b]; i++) {
        const size_t src = ((size_t)h * c->lq[b] + i) * D;
        for (int d = 0; d < D; d++) {
          hq[q_off(c, x, b, h, i) + d] = to16(x->q[b][src + d], c->dt);
          hdo[q_off(c, x, b, h, i) + d] = to16(x->dout[b][src + d], c->dt);
        }
        hdl[(size_t)h * x->total_q + x->cu[b] + i] =
            c->dlse ? (float)x->dlse[b][(size_t)h * c->lq[b] + i] : 0.0f;
      }
    for (int h = 0; h < Hkv; h++)
      for (int i = 0; i < c->lk[b]; i++)
        for (int d = 0; d < D; d++) {
          const size_t src = ((size_t)h * c->lk[b] + i) * D + d;
          hk[k_off(c, x, b, h, i) + d] = to16(x->k[b][src], c->dt);
          hv[k_off(c, x, b, h, i) + d] = to16(x->v[b][src], c->dt);
        }
  }
  const int64_t qs[3] = {x->total_q, Hq, D}, ks3[3] = {x->total_k, Hkv, D},
                ks4[4] = {B, Hkv, c->lk[0], D}, ls[2] = {Hq, x->total_q}, cs[1] = {B + 1};
  const int knd = c->kv_packed ? 3 : 4;
  const int64_t *ks = c->kv_packed ? ks3 : ks4;
  const size_t gq = (size_t)GUARD_ROWS * Hq * D * 2, gk = (size_t)GUARD_ROWS * Hkv * D * 2;
  ok = ok && upload(drv, &x->q_d, hq, 2 * nq, 0, 3, qs, t16) &&
       upload(drv, &x->do_d, hdo, 2 * nq, 0, 3, qs, t16) &&
       upload(drv, &x->o_d, NULL, 2 * nq, 0, 3, qs, t16) &&
       upload(drv, &x->dq_d, NULL, 2 * nq, gq, 3, qs, t16) &&
       upload(drv, &x->k_d, hk, 2 * nk, 0, knd, ks, t16) &&
       upload(drv, &x->v_d, hv, 2 * nk, 0, knd, ks, t16) &&
       upload(drv, &x->dk_d, NULL, 2 * nk, gk, knd, ks, t16) &&
       upload(drv, &x->dv_d, NULL, 2 * nk, gk, knd, ks, t16) &&
       upload(drv, &x->lse_d, NULL, 4 * nl, 0, 2, ls, f32) &&
       upload(drv, &x->dlse_d, hdl, 4 * nl, 0, 2, ls, f32) &&
       upload(drv, &x->cu_q, x->cu, 4 * (size_t)(B + 1), 0, 1, cs, i32) &&
       upload(drv, &x->cu_k, x->cuk, 4 * (size_t)(B + 1), 0, 1, cs, i32);
  free(hq), free(hdo), free(hk), free(hv), free(hdl);
  if (!ok || !gpu_values_fill(drv, spec, Hq, x->maxq, x->maxk > 0 ? x->maxk : 1, &s, &x->vals))
    return 0;
  /* Trainable buffers: a zeroed fp32 gradient each. */
  const fjg_graph *g = fjr_spec_graph(spec);
  for (int a = 0; a < x->vals.n; a++) {
    if (!fjg_arg_at(g, a)->trainable) continue;
    gpu_tensor *t = &x->grads[a];
    t->shape[0] = x->vals.len[a];
    t->strides[0] = 1;
    if (!gpu_alloc(drv, t, 4 * (size_t)x->vals.len[a]) ||
        !gpu_cu_ok(drv, drv->cuMemsetD32(t->ptr, 0, (size_t)x->vals.len[a]), "memset"))
      return 0;
    gpu_describe(t, 1, f32);
    x->vals.args[a].grad = &t->t;
  }
  fj_forward_args fa = {.q = &x->q_d.t, .k = &x->k_d.t, .v = &x->v_d.t, .o = &x->o_d.t,
                        .lse = &x->lse_d.t, .args = x->vals.args, .num_args = x->vals.n,
                        .cu_seqlens_q = &x->cu_q.t, .max_seqlen_q = x->maxq};
  if (c->kv_packed)
    fa.cu_seqlens_k = &x->cu_k.t, fa.max_seqlen_k = x->maxk > 0 ? x->maxk : 1;
  if (fj_attention_forward(ctx, spec, &fa) != FJ_OK) {
    printf("forward: %s ", fj_context_last_error(ctx));
    return 0;
  }
  /* dq, dk, dv and the guards after them. */
  gpu_tensor *outs[3] = {&x->dq_d, &x->dk_d, &x->dv_d};
  for (int t = 0; t < 3; t++) {
    gpu_tensor whole = *outs[t];
    whole.bytes += t == 0 ? gq : gk;
    if (!gpu_poison(drv, &whole, c->dt, NULL)) return 0;
  }
  return 1;
}

static fj_backward_args backward_args(const vcase *c, io *x) {
  fj_backward_args ba = {.q = &x->q_d.t, .k = &x->k_d.t, .v = &x->v_d.t, .o = &x->o_d.t,
                         .lse = &x->lse_d.t, .dout = &x->do_d.t,
                         .dlse = c->dlse ? &x->dlse_d.t : NULL, .dq = &x->dq_d.t,
                         .dk = &x->dk_d.t, .dv = &x->dv_d.t, .args = x->vals.args,
                         .num_args = x->vals.n, .deterministic = c->det,
                         .cu_seqlens_q = &x->cu_q.t, .max_seqlen_q = x->maxq};
  if (c->kv_packed)
    ba.cu_seqlens_k = &x->cu_k.t, ba.max_seqlen_k = x->maxk > 0 ? x->maxk : 1;
  return ba;
}

/* The guard after a gradient: still NaN everywhere. */
static int guard_ok(const fjr_driver *drv, const gpu_tensor *t, size_t guard, fj_dtype dt,
                    const char *what) {
  const uint16_t nan16 = dt == FJ_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
  uint16_t *h = malloc(guard);
  int ok = h && gpu_cu_ok(drv, drv->cuMemcpyDtoH(h, t->ptr + t->bytes - guard, guard), "DtoH");
  size_t bad = 0;
  for (size_t i = 0; ok && i < guard / 2; i++) bad += h[i] != nan16;
  if (bad) printf(" %s: %zu elements written past its end!", what, bad);
  free(h);
  return ok && !bad;
}

/* Three runs of the deterministic mode, each on poisoned outputs: dq, dk,
 * dv bitwise equal. */
static int repeat_equal(fj_context *ctx, const fjr_driver *drv, const fj_spec *spec,
                        const fj_backward_args *ba, gpu_tensor *const out[3], fj_dtype dt) {
  unsigned char *first[3] = {0}, *again[3] = {0};
  int ok = 1;
  for (int t = 0; t < 3; t++) {
    first[t] = malloc(out[t]->bytes), again[t] = malloc(out[t]->bytes);
    ok &= first[t] && again[t] &&
          gpu_cu_ok(drv, drv->cuMemcpyDtoH(first[t], out[t]->ptr, out[t]->bytes), "DtoH");
  }
  for (int run = 2; ok && run <= 3; run++) {
    for (int t = 0; t < 3; t++) ok &= gpu_poison(drv, out[t], dt, NULL);
    if (!ok || fj_attention_backward(ctx, spec, ba) != FJ_OK) {
      printf("backward (run %d): %s ", run, fj_context_last_error(ctx));
      ok = 0;
      break;
    }
    ok &= gpu_cu_ok(drv, drv->cuCtxSynchronize(), "the kernels");
    for (int t = 0; ok && t < 3; t++) {
      ok &= gpu_cu_ok(drv, drv->cuMemcpyDtoH(again[t], out[t]->ptr, out[t]->bytes), "DtoH");
      if (ok && memcmp(first[t], again[t], out[t]->bytes) != 0) {
        printf(" run %d differs from run 1 (gradient %d)!", run, t);
        ok = 0;
      }
    }
  }
  if (ok) printf(" 3 runs bitwise equal;");
  for (int t = 0; t < 3; t++) free(first[t]), free(again[t]);
  return ok;
}

static int check_one(const char *what, const double *ref, const float *lowp, const float *out,
                     size_t n, size_t row_len, const uint8_t *zero_rows) {
  fjg_check_report r;
  int ok = fjg_ref_check_grad(ref, lowp, out, n, row_len, NULL, zero_rows, FLOOR_GRAD, &r);
  printf(" %s %.2e/%.2e%s", what, r.max_err, r.tolerance, ok ? "" : "!");
  if (!ok) printf("(nan %zu, zero %zu, worst %zu)", r.nonfinite, r.zero_mismatch, r.worst);
  return ok;
}

/* The reference one sequence at a time (a batch of one: the specs here do
 * not read b), every sequence's gradients side by side for one check each;
 * a trainable buffer's gradient summed over the sequences. */
static int check(const fjr_driver *drv, const fj_spec *spec, const vcase *c, io *x) {
  const int D = c->D, Hq = c->Hq, Hkv = c->Hkv;
  const fjg_graph *g = fjr_spec_graph(spec);
  size_t nq = 0, nk = 0;
  for (int b = 0; b < c->B; b++)
    nq += (size_t)Hq * c->lq[b] * D, nk += (size_t)Hkv * c->lk[b] * D;
  const size_t pq = (size_t)x->total_q * Hq * D, pk = (size_t)x->total_k * Hkv * D;
  uint16_t *hdq = malloc(2 * pq + 2), *hdk = malloc(2 * pk + 2), *hdv = malloc(2 * pk + 2);
  double *rq = calloc(nq + 1, 8), *rk = calloc(nk + 1, 8), *rv = calloc(nk + 1, 8);
  float *lq = calloc(nq + 1, 4), *lk = calloc(nk + 1, 4), *lv = calloc(nk + 1, 4);
  float *oq = malloc(4 * nq + 4), *ok_ = malloc(4 * nk + 4), *ov = malloc(4 * nk + 4);
  uint8_t *qz = malloc(nq / D + 1), *kz = malloc(nk / D + 1);
  double *rgrad[GPU_MAX_ARGS] = {0}, *sgrad[GPU_MAX_ARGS] = {0};
  float *lgrad[GPU_MAX_ARGS] = {0}, *tgrad[GPU_MAX_ARGS] = {0}, *ggrad[GPU_MAX_ARGS] = {0};
  int ok = hdq && hdk && hdv && rq && rk && rv && lq && lk && lv && oq && ok_ && ov && qz &&
           kz && gpu_cu_ok(drv, drv->cuMemcpyDtoH(hdq, x->dq_d.ptr, 2 * pq), "DtoH") &&
           gpu_cu_ok(drv, drv->cuMemcpyDtoH(hdk, x->dk_d.ptr, 2 * pk), "DtoH") &&
           gpu_cu_ok(drv, drv->cuMemcpyDtoH(hdv, x->dv_d.ptr, 2 * pk), "DtoH");
  for (int a = 0; ok && a < x->vals.n; a++) {
    if (!x->grads[a].ptr) continue;
    const size_t n = (size_t)x->vals.len[a];
    rgrad[a] = calloc(n, 8), sgrad[a] = calloc(n, 8);
    lgrad[a] = calloc(n, 4), tgrad[a] = calloc(n, 4), ggrad[a] = malloc(4 * n);
    ok = rgrad[a] && sgrad[a] && lgrad[a] && tgrad[a] && ggrad[a] &&
         gpu_cu_ok(drv, drv->cuMemcpyDtoH(ggrad[a], x->grads[a].ptr, 4 * n), "DtoH");
  }
  size_t at_q = 0, at_k = 0;
  for (int b = 0; ok && b < c->B; b++) {
    const int Lq = c->lq[b], Lk = c->lk[b];
    const size_t sq = (size_t)Hq * Lq * D, sk = (size_t)Hkv * Lk * D;
    if (Lq > 0 && Lk > 0) {
      fjg_ref_problem p = {1, Hq, Hkv, Lq, Lk, D, (double)(1.0f / sqrtf((float)D)), g,
                           &x->vals.env, 0, 0};
      for (int a = 0; a < x->vals.n; a++)
        if (rgrad[a]) {
          memset(sgrad[a], 0, 8 * (size_t)x->vals.len[a]);
          memset(tgrad[a], 0, 4 * (size_t)x->vals.len[a]);
        }
      ok = fjg_reference_backward(&p, x->q[b], x->k[b], x->v[b], x->dout[b], x->dlse[b],
                                  NULL, NULL, rq + at_q, rk + at_k, rv + at_k, sgrad) ==
               FJ_OK &&
           fjg_reference_backward_lowp(&p, c->dt, x->q[b], x->k[b], x->v[b], x->dout[b],
                                       x->dlse[b], lq + at_q, lk + at_k, lv + at_k,
                                       tgrad) == FJ_OK &&
           fjg_reference_zero_grad_rows(&p, qz + at_q / D, kz + at_k / D) == 0;
      for (int a = 0; ok && a < x->vals.n; a++)
        for (int64_t i = 0; rgrad[a] && i < x->vals.len[a]; i++)
          rgrad[a][i] += sgrad[a][i], lgrad[a][i] += tgrad[a][i];
    } else {
      /* No keys: dq exactly 0; no queries: dk and dv exactly 0. */
      memset(qz + at_q / D, 1, sq / D);
      memset(kz + at_k / D, 1, sk / D);
    }
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < Lq; i++)
        for (int d = 0; d < D; d++)
          oq[at_q + ((size_t)h * Lq + i) * D + d] = from16(hdq[q_off(c, x, b, h, i) + d], c->dt);
    for (int h = 0; h < Hkv; h++)
      for (int i = 0; i < Lk; i++)
        for (int d = 0; d < D; d++) {
          const size_t to = at_k + ((size_t)h * Lk + i) * D + d;
          ok_[to] = from16(hdk[k_off(c, x, b, h, i) + d], c->dt);
          ov[to] = from16(hdv[k_off(c, x, b, h, i) + d], c->dt);
        }
    at_q += sq, at_k += sk;
  }
  if (!ok) printf(" (reference failed)");
  if (ok) {
    int pass = check_one("dq", rq, lq, oq, nq, (size_t)D, qz);
    pass &= check_one("dk", rk, lk, ok_, nk, (size_t)D, kz);
    pass &= check_one("dv", rv, lv, ov, nk, (size_t)D, kz);
    for (int a = 0; a < x->vals.n; a++)
      if (ggrad[a])
        pass &= check_one(fjg_arg_at(g, a)->name, rgrad[a], lgrad[a], ggrad[a],
                          (size_t)x->vals.len[a], (size_t)x->vals.len[a], NULL);
    ok = pass;
  }
  free(hdq), free(hdk), free(hdv), free(rq), free(rk), free(rv), free(lq), free(lk), free(lv);
  free(oq), free(ok_), free(ov), free(qz), free(kz);
  for (int a = 0; a < GPU_MAX_ARGS; a++)
    free(rgrad[a]), free(sgrad[a]), free(lgrad[a]), free(tgrad[a]), free(ggrad[a]);
  return ok;
}

static int run_case(fj_context *ctx, const fjr_driver *drv, fj_spec *const *loaded, int idx) {
  const vcase *c = &cases[idx];
  io x;
  memset(&x, 0, sizeof x);
  int pass = 0;
  printf("[%2d] %-14s %s D%-3d H%d/%d B%d lq", idx, c->spec,
         c->dt == FJ_DTYPE_F16 ? "fp16" : "bf16", c->D, c->Hq, c->Hkv, c->B);
  for (int b = 0; b < c->B; b++) printf("%s%d", b ? "," : " ", c->lq[b]);
  printf(" lk");
  for (int b = 0; b < c->B; b++) printf("%s%d", b ? "," : " ", c->lk[b]);
  printf("%s%s%s ", c->kv_packed ? "" : " kv-dense", c->dlse ? " dlse" : "",
         c->det ? " det" : "");
  fflush(stdout);
  const int s = find_spec(c->spec);
  if (s < 0 || !loaded[s]) {
    printf("FAIL (no spec)\n");
    return 0;
  }
  if (!prepare(ctx, drv, loaded[s], c, 0xba2e0000ull + (uint64_t)idx, &x)) goto done;
  const fj_backward_args ba = backward_args(c, &x);
  if (fj_attention_backward(ctx, loaded[s], &ba) != FJ_OK) {
    printf("backward: %s ", fj_context_last_error(ctx));
    goto done;
  }
  if (!gpu_cu_ok(drv, drv->cuCtxSynchronize(), "the kernels")) goto done;
  gpu_tensor *const outs[3] = {&x.dq_d, &x.dk_d, &x.dv_d};
  gpu_tensor wq = x.dq_d, wk = x.dk_d, wv = x.dv_d; /* with their guards */
  const size_t gq = (size_t)GUARD_ROWS * c->Hq * c->D * 2;
  const size_t gk = (size_t)GUARD_ROWS * c->Hkv * c->D * 2;
  wq.bytes += gq, wk.bytes += gk, wv.bytes += gk;
  pass = guard_ok(drv, &wq, gq, c->dt, "dq") & guard_ok(drv, &wk, gk, c->dt, "dk") &
         guard_ok(drv, &wv, gk, c->dt, "dv");
  if (c->det) pass &= repeat_equal(ctx, drv, loaded[s], &ba, outs, c->dt);
  pass &= check(drv, loaded[s], c, &x);
done:
  printf("  %s\n", pass ? "PASS" : "FAIL");
  io_free(drv, &x);
  return pass;
}

/* Every case in a context: the runtime's choice of template (tmpl NULL) or
 * the one named. */
static void run_all(const fjr_driver *drv, fj_context *ctx, const char *tmpl, int *passed,
                    int *failed) {
  fj_spec *loaded[NSPECS] = {0};
  printf("-- template: %s\n", tmpl ? tmpl : "the runtime's");
  for (int s = 0; s < NSPECS; s++)
    if (fj_spec_load_string(ctx, spec_src[s][1], strlen(spec_src[s][1]), spec_src[s][0],
                            &loaded[s]) != FJ_OK)
      printf("spec %s: %s\n", spec_src[s][0], fj_context_last_error(ctx));
  for (int i = 0; i < NCASES; i++) run_case(ctx, drv, loaded, i) ? (*passed)++ : (*failed)++;
  for (int s = 0; s < NSPECS; s++) fj_spec_destroy(loaded[s]);
}

int main(void) {
  const fjr_driver *drv = NULL;
  fj_context *ctx = gpu_open(&drv);
  int passed = 0, failed = 0;
  run_all(drv, ctx, NULL, &passed, &failed);
  fj_context_options o;
  fj_context_options_init(&o);
  o.kernel_template = "sm80";
  fj_context *ctx80 = NULL;
  if (fj_context_create(&o, &ctx80) == FJ_OK) {
    run_all(drv, ctx80, "sm80", &passed, &failed);
  } else {
    printf("context with the sm80 template: FAIL\n");
    failed++;
  }
  printf("%d passed, %d failed\n", passed, failed);
  fj_context_destroy(ctx80);
  fj_context_destroy(ctx);
  return failed ? 1 : 0;
}
