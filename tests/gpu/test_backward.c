/*
 * tests/gpu/test_backward.c: fj_attention_backward against the float64
 * reference (gen/reference.c's fjg_reference_backward), with the tolerance
 * rule of DESIGN.md for gradients: the error of dq, dk, dv and trainable
 * buffers' gradients at most 3x that of the same computation in the input
 * dtype, plus a small floor; NaN never passes; a fully masked row's dq and
 * a key no query reaches must be exactly 0 (fjg_reference_zero_grad_rows).
 *
 * Each case: random q, k, v, dO (and dLSE) rounded to the dtype, the
 * forward on the GPU for O and LSE, dq, dk, dv poisoned with NaN, trainable
 * buffers' gradients zeroed, then the backward. Sizes are odd (no multiple
 * of a tile), GQA and Lq != Lk among them, BHSD and BSHD; block masks of
 * 128-row blocks and of 64 and 192 (the sm90 kernel's 64-row tiles at head
 * dim 64, where it takes 128 otherwise). The deterministic
 * mode's cases (det) run the backward three times, each on poisoned
 * outputs (the third with a NaN-filled workspace of the caller's): dq, dk
 * and dv must be bitwise equal in all three, and the first within the
 * tolerance. The other cases run it once, the odd-numbered ones with a
 * NaN-filled workspace of the caller's: the sm90 kernels do not zero
 * dq_accum (a query tile's first addition stores), so a row read unwritten
 * would show. Exits 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"

#define FLOOR_GRAD 1e-3

static const char *const specs[][2] = {
    {"full", "return { score_mod = noop_score() }"},
    {"causal", "return { mask_mod = causal() }"},
    {"sliding", "local window = param('window', 'i32')\n"
                "return { mask_mod = sliding_window(window) }"},
    {"document", "local doc = buffer('doc', 'i32')\n"
                 "return { mask_mod = and_masks(causal(), function(b, h, q, kv)\n"
                 "  return eq(doc[q], doc[kv]) end) }"},
    {"softcap", "return { mask_mod = causal(), score_mod = softcap(2.0) }"},
    {"alibi", "local slopes = buffer('slopes', 'f32')\n"
              "return { mask_mod = causal(), score_mod = function(s, b, h, q, kv)\n"
              "  return s + slopes[h] * (kv - q) end }"},
    /* A learnable relative bias: 64 buckets a head, clamped q - kv. */
    {"rel_bias", "local bias = buffer('bias', 'f32', {grad = true})\n"
                 "return { mask_mod = causal(), score_mod = function(s, b, h, q, kv)\n"
                 "  return s + bias[h * 64 + min(max(q - kv, 0), 63)] end }"},
    /* The relative bias without a mask (the persistent kernel splits such
     * launches' last round: runtime/backward.c). */
    {"rel_bias_full", "local bias = buffer('bias', 'f32', {grad = true})\n"
                      "return { score_mod = function(s, b, h, q, kv)\n"
                      "  return s + bias[h * 64 + min(max(q - kv, 0), 63)] end }"},
    /* Rows q < 9 allow nothing: their dq must be exactly 0. */
    {"empty_rows", "return { mask_mod = function(b, h, q, kv)\n"
                   "  return ge(q, 9) & le(kv, q) end }"},
    /* Rows q < 150 allow nothing: whole query tiles without a kv tile's
     * addition, whose dq is written as 0 with no addition to read where
     * dq_accum is not zeroed (the sm90 kernels, the deterministic mode). */
    {"empty_tiles", "return { mask_mod = function(b, h, q, kv)\n"
                    "  return ge(q, 150) & le(kv, q) end }"},
};
enum { NSPECS = sizeof specs / sizeof specs[0] };

/* block_q: a block mask's (of 128-column blocks), 0 for none. */
typedef struct tcase {
  int spec;
  fj_dtype dt;
  int D, B, Hq, Hkv, Lq, Lk, bshd, dlse, block_q, det;
} tcase;

static const tcase cases[] = {
    {0, FJ_DTYPE_BF16, 64, 1, 2, 2, 77, 77, 0, 0, 0, 0},
    {0, FJ_DTYPE_F16, 128, 2, 4, 1, 130, 61, 0, 0, 0, 0},
    {1, FJ_DTYPE_BF16, 128, 2, 4, 2, 199, 199, 0, 0, 0, 0},
    {1, FJ_DTYPE_F16, 64, 1, 6, 2, 257, 257, 1, 1, 0, 0},
    {1, FJ_DTYPE_BF16, 64, 1, 2, 1, 33, 300, 0, 0, 0, 0},
    {2, FJ_DTYPE_BF16, 128, 1, 4, 4, 333, 333, 0, 0, 0, 0},
    {2, FJ_DTYPE_F16, 64, 2, 2, 1, 150, 150, 1, 0, 0, 0},
    {3, FJ_DTYPE_BF16, 128, 2, 4, 2, 500, 500, 0, 0, 0, 0},
    {3, FJ_DTYPE_BF16, 64, 2, 4, 4, 384, 384, 0, 0, 128, 0},
    {3, FJ_DTYPE_F16, 128, 1, 2, 2, 256, 256, 0, 1, 128, 0},
    {3, FJ_DTYPE_F16, 64, 1, 4, 2, 321, 321, 0, 0, 64, 0},
    {1, FJ_DTYPE_BF16, 64, 2, 2, 1, 450, 450, 1, 0, 64, 0},
    {1, FJ_DTYPE_F16, 64, 1, 4, 2, 400, 400, 0, 0, 192, 0},
    {6, FJ_DTYPE_BF16, 64, 1, 2, 2, 260, 260, 0, 0, 128, 0},
    {4, FJ_DTYPE_BF16, 128, 1, 4, 2, 221, 221, 0, 0, 0, 0},
    {4, FJ_DTYPE_F16, 64, 2, 2, 2, 129, 129, 1, 0, 0, 0},
    {5, FJ_DTYPE_BF16, 64, 1, 8, 2, 190, 190, 0, 0, 0, 0},
    {5, FJ_DTYPE_F16, 128, 1, 4, 4, 131, 131, 0, 0, 0, 0},
    {6, FJ_DTYPE_BF16, 128, 1, 4, 2, 300, 300, 0, 0, 0, 0},
    {6, FJ_DTYPE_F16, 64, 2, 2, 2, 97, 97, 0, 1, 0, 0},
    /* Long enough that most tiles' bias is one value (FJ_SCORE_TILE). */
    {6, FJ_DTYPE_BF16, 64, 1, 4, 2, 700, 700, 0, 0, 0, 0},
    {7, FJ_DTYPE_F16, 128, 1, 2, 1, 600, 900, 1, 0, 0, 0},
    {8, FJ_DTYPE_BF16, 64, 1, 2, 2, 100, 100, 0, 0, 0, 0},
    {8, FJ_DTYPE_F16, 128, 2, 4, 1, 45, 70, 1, 0, 0, 0},
    /* Head dim 64 beside the cases above: Lq > Lk, a 128-row tile whose
     * second half is past Lq. */
    {1, FJ_DTYPE_F16, 64, 2, 4, 2, 301, 130, 0, 0, 0, 0},
    {4, FJ_DTYPE_BF16, 64, 1, 2, 1, 70, 200, 1, 1, 0, 0},
    /* The persistent sm90 kernel's tile order in two groups of kv heads,
     * the second taking the remainder (276 heads of 2 kv tiles on the
     * H200's 132 multiprocessors: groups of 132). */
    {1, FJ_DTYPE_BF16, 128, 4, 69, 69, 150, 150, 0, 0, 0, 0},
    /* The persistent kernel's last round split (on 132 multiprocessors):
     * 134 kv tiles leave 2, in 4 pieces of one item (the second tile's
     * rows end at 250); D=64 GQA, BSHD: 138 leave 6, in 12 pieces of one
     * 128-row item; a trainable bias, dLSE: 140 leave 8, in 16 pieces of
     * 20 items (Lq 1234 against Lk 500). */
    {0, FJ_DTYPE_BF16, 128, 1, 67, 67, 250, 250, 0, 0, 0, 0},
    {0, FJ_DTYPE_F16, 64, 1, 46, 23, 700, 700, 1, 0, 0, 0},
    {7, FJ_DTYPE_BF16, 128, 1, 35, 35, 1234, 500, 0, 1, 0, 0},
    /* Fully masked query tiles. */
    {9, FJ_DTYPE_BF16, 128, 2, 4, 2, 333, 333, 0, 0, 0, 0},
    {9, FJ_DTYPE_F16, 64, 1, 2, 2, 401, 401, 1, 0, 0, 0},
    /* The deterministic mode: causal (GQA; Lq < Lk and Lq > Lk), document
     * ids with and without a block mask, a sliding window with a group of
     * 4, softcap, ALiBi, no mask with Lq != Lk, fully masked rows,
     * fully masked query tiles. */
    {1, FJ_DTYPE_BF16, 128, 2, 4, 2, 611, 611, 0, 0, 0, 1},
    {1, FJ_DTYPE_F16, 64, 1, 4, 4, 300, 1000, 1, 1, 0, 1},
    {1, FJ_DTYPE_BF16, 128, 2, 2, 1, 777, 333, 0, 0, 0, 1},
    {3, FJ_DTYPE_BF16, 128, 2, 4, 2, 1000, 1000, 0, 0, 128, 1},
    {3, FJ_DTYPE_F16, 64, 1, 2, 2, 700, 700, 0, 0, 0, 1},
    {2, FJ_DTYPE_BF16, 64, 2, 8, 2, 900, 900, 1, 0, 0, 1},
    {4, FJ_DTYPE_BF16, 128, 1, 4, 2, 513, 513, 0, 0, 0, 1},
    {5, FJ_DTYPE_F16, 64, 1, 4, 2, 390, 390, 0, 0, 0, 1},
    {0, FJ_DTYPE_F16, 128, 1, 2, 1, 200, 450, 0, 0, 0, 1},
    {8, FJ_DTYPE_BF16, 64, 1, 2, 2, 300, 300, 0, 0, 0, 1},
    {9, FJ_DTYPE_BF16, 128, 2, 4, 2, 333, 333, 0, 0, 0, 1},
    {9, FJ_DTYPE_F16, 64, 1, 2, 2, 401, 401, 1, 0, 0, 1},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

typedef struct io {
  double *q, *k, *v, *dout, *dlse;
  gpu_tensor tq, tk, tv, to, tlse, tdo, tdlse, tdq, tdk, tdv;
  gpu_tensor ws; /* a workspace of the caller's, or none */
  gpu_tensor grads[GPU_MAX_ARGS];
  gpu_values vals;
  fj_block_mask *bm;
} io_t;

static void io_free(const fjr_driver *drv, io_t *io) {
  free(io->q), free(io->k), free(io->v), free(io->dout), free(io->dlse);
  gpu_tensor *all[] = {&io->tq, &io->tk, &io->tv, &io->to, &io->tlse,
                       &io->tdo, &io->tdlse, &io->tdq, &io->tdk, &io->tdv, &io->ws};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gpu_free(drv, all[i]);
  for (int a = 0; a < GPU_MAX_ARGS; a++) gpu_free(drv, &io->grads[a]);
  fj_block_mask_destroy(io->bm);
  gpu_values_free(drv, &io->vals);
}

static int download_f32(const fjr_driver *drv, const gpu_tensor *t, size_t n,
                        float **out) {
  *out = malloc(sizeof(float) * (n ? n : 1));
  return *out && gpu_cu_ok(drv, drv->cuMemcpyDtoH(*out, t->ptr, 4 * n), "cuMemcpyDtoH");
}

/* A workspace of the caller's for ba's launch, filled with NaN, in ws; ba
 * takes it. */
static int nan_workspace(const fjr_driver *drv, fj_backward_args *ba, gpu_tensor *ws) {
  const int64_t *qs = ba->q->shape; /* [B, Hq, Lq, D] */
  if (!gpu_alloc(drv, ws, fj_backward_workspace_size(qs[0], qs[1], qs[2], qs[3])) ||
      !gpu_cu_ok(drv, drv->cuMemsetD32(ws->ptr, 0xffffffffu, ws->bytes / 4), "cuMemsetD32"))
    return 0;
  ba->workspace = (void *)(uintptr_t)ws->ptr;
  ba->workspace_bytes = ws->bytes;
  return 1;
}

/* The deterministic mode: two more backward runs, each on NaN-poisoned
 * outputs, must write dq, dk and dv bitwise equal to the first run's (the
 * device bytes of each, compared whole). The third takes a workspace of
 * the caller's filled with NaN: the mode does not zero dq_accum (its first
 * addition to a query tile stores), so a row it read unwritten would show. */
static int repeat_equal(fj_context *ctx, const fjr_driver *drv, const fj_spec *spec,
                        const fj_backward_args *ba_pool, gpu_tensor *const out[3],
                        fj_dtype dt) {
  static const char *const names[3] = {"dq", "dk", "dv"};
  unsigned char *first[3] = {0}, *again[3] = {0};
  gpu_tensor ws = {0};
  fj_backward_args ba_ws = *ba_pool;
  int ok = nan_workspace(drv, &ba_ws, &ws);
  for (int t = 0; t < 3; t++) {
    first[t] = malloc(out[t]->bytes), again[t] = malloc(out[t]->bytes);
    ok &= first[t] && again[t] &&
          gpu_cu_ok(drv, drv->cuMemcpyDtoH(first[t], out[t]->ptr, out[t]->bytes), "DtoH");
  }
  for (int run = 2; ok && run <= 3; run++) {
    for (int t = 0; t < 3; t++) ok &= gpu_poison(drv, out[t], dt, NULL);
    if (!ok) break;
    if (fj_attention_backward(ctx, spec, run == 3 ? &ba_ws : ba_pool) != FJ_OK) {
      printf("backward (run %d): %s ", run, fj_context_last_error(ctx));
      ok = 0;
      break;
    }
    ok &= gpu_cu_ok(drv, drv->cuCtxSynchronize(), "the kernels");
    for (int t = 0; ok && t < 3; t++) {
      ok &= gpu_cu_ok(drv, drv->cuMemcpyDtoH(again[t], out[t]->ptr, out[t]->bytes), "DtoH");
      size_t differ = 0;
      for (size_t i = 0; ok && i < out[t]->bytes; i += 2)
        differ += memcmp(first[t] + i, again[t] + i, 2) != 0;
      if (differ) {
        printf(" %s of run %d differs from run 1 in %zu elements!", names[t], run, differ);
        ok = 0;
      }
    }
  }
  if (ok) printf(" 3 runs bitwise equal;");
  for (int t = 0; t < 3; t++) free(first[t]), free(again[t]);
  gpu_free(drv, &ws);
  return ok;
}

static int check_one(const char *what, const double *ref, const float *lowp,
                     const float *out, size_t n, size_t row_len, const uint8_t *zero_rows) {
  fjg_check_report r;
  int ok = fjg_ref_check_grad(ref, lowp, out, n, row_len, NULL, zero_rows, FLOOR_GRAD, &r);
  printf(" %s %.2e/%.2e%s", what, r.max_err, r.tolerance, ok ? "" : "!");
  if (!ok)
    printf("(nan %zu, zero %zu, worst %zu)", r.nonfinite, r.zero_mismatch, r.worst);
  return ok;
}

static int run_case(fj_context *ctx, const fjr_driver *drv, int idx) {
  const tcase *c = &cases[idx];
  io_t io;
  memset(&io, 0, sizeof io);
  int pass = 0;
  fj_spec *spec = NULL;
  char bm[16] = "";
  if (c->block_q) snprintf(bm, sizeof bm, " bm%d", c->block_q);
  printf("[%2d] %-10s %s D%-3d B%d H%d/%d %3dx%-3d %s%s%s%s ", idx, specs[c->spec][0],
         c->dt == FJ_DTYPE_F16 ? "fp16" : "bf16", c->D, c->B, c->Hq, c->Hkv, c->Lq, c->Lk,
         c->bshd ? "bshd" : "bhsd", c->dlse ? " dlse" : "", bm, c->det ? " det" : "");
  fflush(stdout);
  const char *src = specs[c->spec][1];
  if (fj_spec_load_string(ctx, src, strlen(src), specs[c->spec][0], &spec) != FJ_OK) {
    printf("spec: %s FAIL\n", fj_context_last_error(ctx));
    return 0;
  }
  const size_t nq = (size_t)c->B * c->Hq * c->Lq * c->D;
  const size_t nk = (size_t)c->B * c->Hkv * c->Lk * c->D;
  const size_t nl = (size_t)c->B * c->Hq * c->Lq;
  uint64_t s = 0xbacc0000ull + (uint64_t)idx;
  io.q = gpu_random_inputs(nq, c->dt, &s);
  io.k = gpu_random_inputs(nk, c->dt, &s);
  io.v = gpu_random_inputs(nk, c->dt, &s);
  io.dout = gpu_random_inputs(nq, c->dt, &s);
  io.dlse = c->dlse ? gpu_random_inputs(nl, FJ_DTYPE_BF16, &s) : NULL;
  float *dq = NULL, *dk = NULL, *dv = NULL, *lq = NULL, *lk = NULL, *lv = NULL;
  double *rq = NULL, *rk = NULL, *rv = NULL;
  uint8_t *qz = NULL, *kz = NULL;
  double *rgrad[GPU_MAX_ARGS] = {0};
  float *lgrad[GPU_MAX_ARGS] = {0}, *ggrad[GPU_MAX_ARGS] = {0};
  if (!io.q || !io.k || !io.v || !io.dout || (c->dlse && !io.dlse)) goto done;
#define ALLOC16(t, H, L) gpu_alloc_bhld(drv, &io.t, c->dt, c->bshd, c->B, H, L, c->D)
  if (!ALLOC16(tq, c->Hq, c->Lq) || !ALLOC16(tk, c->Hkv, c->Lk) ||
      !ALLOC16(tv, c->Hkv, c->Lk) || !ALLOC16(to, c->Hq, c->Lq) ||
      !ALLOC16(tdo, c->Hq, c->Lq) || !ALLOC16(tdq, c->Hq, c->Lq) ||
      !ALLOC16(tdk, c->Hkv, c->Lk) || !ALLOC16(tdv, c->Hkv, c->Lk) ||
      !gpu_alloc_lse(drv, &io.tlse, c->B, c->Hq, c->Lq) ||
      (c->dlse && !gpu_alloc_lse(drv, &io.tdlse, c->B, c->Hq, c->Lq)))
    goto done;
#undef ALLOC16
  if (!gpu_upload_bhld(drv, &io.tq, io.q, c->dt, c->bshd, c->B, c->Hq, c->Lq, c->D) ||
      !gpu_upload_bhld(drv, &io.tk, io.k, c->dt, c->bshd, c->B, c->Hkv, c->Lk, c->D) ||
      !gpu_upload_bhld(drv, &io.tv, io.v, c->dt, c->bshd, c->B, c->Hkv, c->Lk, c->D) ||
      !gpu_upload_bhld(drv, &io.tdo, io.dout, c->dt, c->bshd, c->B, c->Hq, c->Lq, c->D) ||
      !gpu_values_fill(drv, spec, c->Hq, c->Lq, c->Lk, &s, &io.vals))
    goto done;
  if (c->dlse) {
    float *h = malloc(4 * nl);
    if (!h) goto done;
    for (size_t i = 0; i < nl; i++) h[i] = (float)io.dlse[i];
    int ok = gpu_cu_ok(drv, drv->cuMemcpyHtoD(io.tdlse.ptr, h, 4 * nl), "cuMemcpyHtoD");
    free(h);
    if (!ok) goto done;
  }
  /* Trainable buffers: a zeroed fp32 gradient each. */
  const fjg_graph *g = fjr_spec_graph(spec);
  for (int a = 0; a < io.vals.n; a++) {
    if (!fjg_arg_at(g, a)->trainable) continue;
    gpu_tensor *t = &io.grads[a];
    t->shape[0] = io.vals.len[a];
    t->strides[0] = 1;
    if (!gpu_alloc(drv, t, 4 * (size_t)io.vals.len[a]) ||
        !gpu_cu_ok(drv, drv->cuMemsetD32(t->ptr, 0, (size_t)io.vals.len[a]), "memset"))
      goto done;
    gpu_describe(t, 1, (DLDataType){kDLFloat, 32, 1});
    io.vals.args[a].grad = &t->t;
  }
  if (c->block_q) {
    fj_block_mask_options bo;
    fj_block_mask_options_init(&bo);
    bo.B = c->B, bo.H = 1, bo.q_len = c->Lq, bo.kv_len = c->Lk, bo.block_q = c->block_q;
    bo.args = io.vals.args, bo.num_args = io.vals.n;
    if (fj_block_mask_build(ctx, spec, &bo, &io.bm) != FJ_OK) {
      printf("block mask: %s ", fj_context_last_error(ctx));
      goto done;
    }
  }
  /* Every forward kernel takes blocks of 128 rows, not every one 64 or 192:
   * the forward classifies its own tiles for those. */
  fj_forward_args fa = {.q = &io.tq.t, .k = &io.tk.t, .v = &io.tv.t, .o = &io.to.t,
                        .lse = &io.tlse.t, .args = io.vals.args, .num_args = io.vals.n,
                        .block_mask = c->block_q % 128 == 0 ? io.bm : NULL};
  if (fj_attention_forward(ctx, spec, &fa) != FJ_OK) {
    printf("forward: %s ", fj_context_last_error(ctx));
    goto done;
  }
  if (!gpu_poison(drv, &io.tdq, c->dt, NULL) || !gpu_poison(drv, &io.tdk, c->dt, NULL) ||
      !gpu_poison(drv, &io.tdv, c->dt, NULL))
    goto done;
  fj_backward_args ba = {.q = &io.tq.t, .k = &io.tk.t, .v = &io.tv.t, .o = &io.to.t,
                         .lse = &io.tlse.t, .dout = &io.tdo.t,
                         .dlse = c->dlse ? &io.tdlse.t : NULL, .dq = &io.tdq.t,
                         .dk = &io.tdk.t, .dv = &io.tdv.t, .args = io.vals.args,
                         .num_args = io.vals.n, .block_mask = io.bm,
                         .deterministic = c->det};
  fj_backward_args ba_run = ba;
  if (!c->det && idx % 2) {
    if (!nan_workspace(drv, &ba_run, &io.ws)) goto done;
    printf("nan-ws ");
  }
  if (fj_attention_backward(ctx, spec, &ba_run) != FJ_OK) {
    printf("backward: %s ", fj_context_last_error(ctx));
    goto done;
  }
  if (!gpu_cu_ok(drv, drv->cuCtxSynchronize(), "the kernels")) goto done;
  gpu_tensor *const outs[3] = {&io.tdq, &io.tdk, &io.tdv};
  if (c->det && !repeat_equal(ctx, drv, spec, &ba, outs, c->dt)) goto done;
  dq = malloc(4 * nq), dk = malloc(4 * nk), dv = malloc(4 * nk);
  lq = malloc(4 * nq), lk = malloc(4 * nk), lv = malloc(4 * nk);
  rq = malloc(8 * nq), rk = malloc(8 * nk), rv = malloc(8 * nk);
  if (!dq || !dk || !dv || !lq || !lk || !lv || !rq || !rk || !rv) goto done;
  if (!gpu_download_bhld(drv, &io.tdq, dq, c->dt, c->bshd, c->B, c->Hq, c->Lq, c->D) ||
      !gpu_download_bhld(drv, &io.tdk, dk, c->dt, c->bshd, c->B, c->Hkv, c->Lk, c->D) ||
      !gpu_download_bhld(drv, &io.tdv, dv, c->dt, c->bshd, c->B, c->Hkv, c->Lk, c->D))
    goto done;
  for (int a = 0; a < io.vals.n; a++) {
    if (!io.grads[a].ptr) continue;
    size_t n = (size_t)io.vals.len[a];
    rgrad[a] = calloc(n, 8), lgrad[a] = calloc(n, 4);
    if (!rgrad[a] || !lgrad[a] || !download_f32(drv, &io.grads[a], n, &ggrad[a])) goto done;
  }
  fjg_ref_problem p = {c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->D, 0, g, &io.vals.env, 0, 0};
  if (fjg_reference_backward(&p, io.q, io.k, io.v, io.dout, io.dlse, NULL, NULL, rq, rk,
                             rv, rgrad) != FJ_OK ||
      fjg_reference_backward_lowp(&p, c->dt, io.q, io.k, io.v, io.dout, io.dlse, lq, lk,
                                  lv, lgrad) != FJ_OK) {
    printf("reference failed ");
    goto done;
  }
  /* Fully masked query rows and keys no query attends: exactly 0. */
  qz = malloc(nq / c->D), kz = malloc(nk / c->D);
  if (!qz || !kz || fjg_reference_zero_grad_rows(&p, qz, kz) != 0) goto done;
  pass = check_one("dq", rq, lq, dq, nq, (size_t)c->D, qz);
  pass &= check_one("dk", rk, lk, dk, nk, (size_t)c->D, kz);
  pass &= check_one("dv", rv, lv, dv, nk, (size_t)c->D, kz);
  for (int a = 0; a < io.vals.n; a++)
    if (ggrad[a])
      pass &= check_one(fjg_arg_at(g, a)->name, rgrad[a], lgrad[a], ggrad[a],
                        (size_t)io.vals.len[a], (size_t)io.vals.len[a], NULL);
done:
  printf("  %s\n", pass ? "PASS" : "FAIL");
  free(dq), free(dk), free(dv), free(lq), free(lk), free(lv), free(rq), free(rk), free(rv);
  free(qz), free(kz);
  for (int a = 0; a < GPU_MAX_ARGS; a++) free(rgrad[a]), free(lgrad[a]), free(ggrad[a]);
  io_free(drv, &io);
  fj_spec_destroy(spec);
  return pass;
}

/* Misuse is refused with a message, before any launch: the deterministic
 * mode of a spec with a trainable buffer, whose gradient has no fixed
 * order. */
static int test_refusals(fj_context *ctx) {
  const char *src = specs[6][1];
  fj_spec *spec = NULL;
  if (fj_spec_load_string(ctx, src, strlen(src), "rel_bias", &spec) != FJ_OK) return 0;
  fj_backward_args ba;
  memset(&ba, 0, sizeof ba);
  int ok = fj_attention_backward(ctx, spec, &ba) == FJ_ETENSOR;
  ba.deterministic = 1;
  ok &= fj_attention_backward(ctx, spec, &ba) == FJ_EUNSUPPORTED &&
        strstr(fj_context_last_error(ctx), "deterministic") != NULL &&
        strstr(fj_context_last_error(ctx), "'bias'") != NULL;
  printf("refusals: %s\n", ok ? "PASS" : "FAIL");
  fj_spec_destroy(spec);
  return ok;
}

int main(void) {
  const fjr_driver *drv = NULL;
  fj_context *ctx = gpu_open(&drv);
  int passed = 0, failed = 0;
  for (int i = 0; i < NCASES; i++) run_case(ctx, drv, i) ? passed++ : failed++;
  test_refusals(ctx) ? passed++ : failed++;
  printf("%d passed, %d failed\n", passed, failed);
  fj_context_destroy(ctx);
  return failed ? 1 : 0;
}
