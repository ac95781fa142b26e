/*
 * tests/gpu/test_decode.c: the decode kernel (query lengths 1 to
 * FJ_DECODE_MAX_Q: GQA packing, split-KV and the LSE merge) against the
 * float64 reference: specs with masks and score_mods, bottom-right causal,
 * odd kv lengths, GQA 1 to 8, both dtypes and head dims, BHSD and BSHD;
 * per-sequence kv lengths (one of them 0: O = 0, LSE = -inf); paged caches
 * of 16, 32, 64 and 256-row pages with shuffled block tables and NaN in
 * every pool row no sequence owns, through the 4- and the 8-warp kernel; Skip Softmax against the exact kernel within
 * its bound, in the decode kernel and (48 and 100 tokens) in the forward's
 * variant; fj_merge_states and fj_paged_from_csr against the CPU.
 * Fresh random inputs, NaN-poisoned outputs.
 *
 * Exits 77 (skipped) without a GPU. Prints one line per case and
 * "N passed, N failed"; exit status 1 when any failed.
 */
#include "gpu/gpu_util.h"

#define FLOOR_O 1e-3
#define FLOOR_LSE 1e-3

typedef struct dcase {
  const char *name, *src;
  fj_dtype dt;
  int D, B, Hq, Hkv, Lq, Lk, bshd;
  int page;    /* 0: contiguous k, v; else the page size of a paged cache */
  int seqlens; /* 1: random per-sequence kv lengths (one 0), else all Lk */
  float skip;  /* Skip Softmax threshold, 0: exact */
} dcase;

static const char FULL[] = "return { score_mod = noop_score() }";
static const char CAUSAL_BR[] = "return { mask_mod = causal{align = \"bottom_right\"} }";
static const char WINDOW_BR[] =
    "return { mask_mod = sliding_window(param(\"window\", \"i32\"), "
    "{align = \"bottom_right\"}) }";
static const char ALIBI_BR[] =
    "return { mask_mod = causal{align = \"bottom_right\"}, score_mod = alibi() }";
static const char SOFTCAP[] = "return { score_mod = softcap(30) }";
static const char DOCUMENT[] = "return { mask_mod = document(buffer(\"doc\", \"i32\")) }";
static const char LATE_KV[] = /* keys below 40 masked: rows of short sequences empty */
    "return { mask_mod = function(b, h, q, kv) return ge(kv, 40) end }";

static const dcase cases[] = {
    /* name, src, dtype, D, B, Hq, Hkv, Lq, Lk, bshd, page, seqlens, skip */
    {"full", FULL, FJ_DTYPE_BF16, 128, 3, 32, 8, 1, 1000, 0, 0, 0, 0},
    {"full", FULL, FJ_DTYPE_F16, 64, 2, 8, 8, 1, 77, 1, 0, 0, 0},
    {"full (split)", FULL, FJ_DTYPE_BF16, 128, 1, 8, 2, 1, 20011, 0, 0, 0, 0},
    {"causal_br", CAUSAL_BR, FJ_DTYPE_BF16, 128, 2, 16, 2, 5, 3001, 0, 0, 0, 0},
    {"causal_br spec", CAUSAL_BR, FJ_DTYPE_F16, 128, 2, 32, 4, 16, 999, 1, 0, 0, 0},
    {"causal_br Lq>Lk", CAUSAL_BR, FJ_DTYPE_BF16, 64, 1, 4, 1, 16, 9, 0, 0, 0, 0},
    {"window_br", WINDOW_BR, FJ_DTYPE_BF16, 128, 2, 32, 8, 1, 9000, 0, 0, 0, 0},
    {"window_br spec", WINDOW_BR, FJ_DTYPE_F16, 64, 1, 8, 2, 7, 4097, 1, 0, 0, 0},
    {"alibi_br", ALIBI_BR, FJ_DTYPE_BF16, 128, 2, 16, 4, 3, 2500, 0, 0, 0, 0},
    {"softcap", SOFTCAP, FJ_DTYPE_BF16, 64, 1, 12, 4, 2, 1500, 0, 0, 0, 0},
    {"document", DOCUMENT, FJ_DTYPE_BF16, 128, 2, 8, 8, 1, 1777, 0, 0, 0, 0},
    {"late_kv", LATE_KV, FJ_DTYPE_BF16, 128, 3, 8, 2, 2, 300, 0, 0, 1, 0},
    {"seqlens", CAUSAL_BR, FJ_DTYPE_BF16, 128, 5, 32, 8, 1, 3000, 0, 0, 1, 0},
    {"seqlens bshd", WINDOW_BR, FJ_DTYPE_F16, 64, 4, 8, 2, 4, 2000, 1, 0, 1, 0},
    {"paged 16", CAUSAL_BR, FJ_DTYPE_BF16, 128, 4, 32, 8, 1, 2048, 0, 16, 1, 0},
    {"paged 64", FULL, FJ_DTYPE_BF16, 128, 3, 16, 4, 3, 5000, 0, 64, 1, 0},
    {"paged 256", ALIBI_BR, FJ_DTYPE_F16, 64, 2, 8, 2, 2, 3000, 0, 256, 1, 0},
    {"paged 16 split", FULL, FJ_DTYPE_BF16, 128, 1, 8, 1, 1, 30000, 0, 16, 0, 0},
    /* 120 and 123 CTAs from pages of 16 and 32 rows and from contiguous
     * caches: the 8-warp kernel on GPUs of 123 to 133 multiprocessors (the
     * H100's and H200's 132), fjr_decode_warps. */
    {"8 warps", WINDOW_BR, FJ_DTYPE_BF16, 128, 15, 32, 8, 1, 3001, 1, 0, 1, 0},
    {"8 warps skip 1e-3", FULL, FJ_DTYPE_BF16, 64, 41, 3, 3, 1, 2000, 0, 0, 0, 1e-3f},
    {"paged 16 8 warps", CAUSAL_BR, FJ_DTYPE_BF16, 128, 15, 16, 8, 1, 1500, 0, 16, 1, 0},
    {"paged 32 8 warps", ALIBI_BR, FJ_DTYPE_F16, 64, 41, 24, 3, 3, 700, 0, 32, 1, 0},
    {"skip 1e-2", FULL, FJ_DTYPE_BF16, 128, 2, 8, 8, 1, 8000, 0, 0, 0, 1e-2f},
    {"skip 1e-3 paged", FULL, FJ_DTYPE_BF16, 64, 3, 4, 4, 1, 6000, 0, 64, 1, 1e-3f},
    /* More than 16 tokens: the forward's Skip Softmax variant (prefill). */
    {"skip prefill", FULL, FJ_DTYPE_BF16, 128, 2, 4, 4, 48, 6000, 0, 0, 0, 1e-2f},
    {"skip prefill d64", FULL, FJ_DTYPE_F16, 64, 1, 2, 2, 100, 5000, 1, 0, 0, 1e-3f},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

typedef struct io {
  double *q, *k, *v, *ro, *rl;
  float *o, *lse, *lo, *ll, *o2;
  int32_t *lens, *table;
  gpu_tensor dq, dk, dv, dout, dlse, dtable, dlens;
  gpu_values vals;
} io_t;

static void io_free(const fjr_driver *drv, io_t *io) {
  free(io->q), free(io->k), free(io->v), free(io->ro), free(io->rl);
  free(io->o), free(io->lse), free(io->lo), free(io->ll), free(io->o2);
  free(io->lens), free(io->table);
  gpu_free(drv, &io->dq), gpu_free(drv, &io->dk), gpu_free(drv, &io->dv);
  gpu_free(drv, &io->dout), gpu_free(drv, &io->dlse), gpu_free(drv, &io->dtable);
  gpu_free(drv, &io->dlens);
  gpu_values_free(drv, &io->vals);
}

static int upload_i32(const fjr_driver *drv, gpu_tensor *t, const int32_t *x, int ndim,
                      int64_t d0, int64_t d1) {
  const size_t n = (size_t)d0 * (ndim == 2 ? (size_t)d1 : 1);
  t->shape[0] = d0, t->shape[1] = d1;
  t->strides[0] = ndim == 2 ? d1 : 1, t->strides[1] = 1;
  if (!gpu_alloc(drv, t, n * 4) ||
      !gpu_cu_ok(drv, drv->cuMemcpyHtoD(t->ptr, x, n * 4), "cuMemcpyHtoD"))
    return 0;
  gpu_describe(t, ndim, (DLDataType){kDLInt, 32, 1});
  return 1;
}

/* A paged pool [num_pages, page, Hkv, D] of the logical [B, Hkv, Lk, D] x:
 * sequence b's page j at table[b][j] (a shuffled permutation over two spare
 * pages too); every row past a sequence's length, and the spare pages, NaN. */
static int upload_paged(const fjr_driver *drv, gpu_tensor *t, const double *x, const dcase *c,
                        const int32_t *lens, const int32_t *table, int max_pages,
                        int num_pages) {
  const size_t row = (size_t)c->Hkv * c->D, n = (size_t)num_pages * c->page * row;
  uint16_t *h = malloc(n * 2);
  if (!h) return 0;
  const uint16_t nan16 = c->dt == FJ_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
  for (size_t i = 0; i < n; i++) h[i] = nan16;
  for (int b = 0; b < c->B; b++)
    for (int j = 0; j < max_pages; j++)
      for (int r = 0; r < c->page; r++) {
        const int pos = j * c->page + r;
        if (pos >= lens[b]) continue;
        for (int hk = 0; hk < c->Hkv; hk++)
          for (int d = 0; d < c->D; d++) {
            const double v = x[(((size_t)b * c->Hkv + hk) * c->Lk + pos) * c->D + d];
            h[((size_t)table[b * max_pages + j] * c->page + r) * row + (size_t)hk * c->D + d] =
                c->dt == FJ_DTYPE_F16 ? fjg_f32_to_f16((float)v) : fjg_f32_to_bf16((float)v);
          }
      }
  const int64_t shape[4] = {num_pages, c->page, c->Hkv, c->D};
  const int64_t strides[4] = {(int64_t)c->page * row, (int64_t)row, c->D, 1};
  memcpy(t->shape, shape, sizeof shape);
  memcpy(t->strides, strides, sizeof strides);
  int ok = gpu_alloc(drv, t, n * 2) &&
           gpu_cu_ok(drv, drv->cuMemcpyHtoD(t->ptr, h, n * 2), "cuMemcpyHtoD");
  free(h);
  if (ok)
    gpu_describe(t, 4, (DLDataType){c->dt == FJ_DTYPE_F16 ? kDLFloat : kDLBfloat, 16, 1});
  return ok;
}

static int launch(fj_context *ctx, const fjr_driver *drv, const fj_spec *spec, const dcase *c,
                  io_t *io, float skip, float *o_out, float *lse_out) {
  if (!gpu_poison(drv, &io->dout, c->dt, &io->dlse)) return 0;
  fj_forward_args a = {.q = &io->dq.t, .k = &io->dk.t, .v = &io->dv.t, .o = &io->dout.t,
                       .lse = &io->dlse.t, .args = io->vals.args, .num_args = io->vals.n,
                       .skip_softmax_threshold = skip};
  if (c->seqlens || c->page) a.seqlens_k = &io->dlens.t;
  if (c->page) a.block_table = &io->dtable.t;
  if (fj_attention_forward(ctx, spec, &a) != FJ_OK) {
    printf("launch failed: %s ", fj_context_last_error(ctx));
    return 0;
  }
  const size_t nl = (size_t)c->B * c->Hq * c->Lq;
  return gpu_cu_ok(drv, drv->cuCtxSynchronize(), "the kernel") &&
         gpu_download_bhld(drv, &io->dout, o_out, c->dt, c->bshd, c->B, c->Hq, c->Lq, c->D) &&
         gpu_cu_ok(drv, drv->cuMemcpyDtoH(lse_out, io->dlse.ptr, nl * 4), "cuMemcpyDtoH");
}

/* The reference, one sequence at a time with its own kv length. */
static int reference(const fj_spec *spec, const dcase *c, io_t *io) {
  const size_t nq1 = (size_t)c->Hq * c->Lq * c->D, nl1 = (size_t)c->Hq * c->Lq;
  const float scale = 1.0f / sqrtf((float)c->D);
  double *k1 = malloc(sizeof(double) * (size_t)c->Hkv * c->Lk * c->D);
  double *v1 = malloc(sizeof(double) * (size_t)c->Hkv * c->Lk * c->D);
  int ok = k1 && v1;
  for (int b = 0; ok && b < c->B; b++) {
    const int L = io->lens[b];
    if (L == 0) { /* nothing to attend to: O = 0, LSE = -inf */
      for (size_t i = 0; i < nq1; i++) io->ro[b * nq1 + i] = 0, io->lo[b * nq1 + i] = 0;
      for (size_t i = 0; i < nl1; i++)
        io->rl[b * nl1 + i] = -INFINITY, io->ll[b * nl1 + i] = -INFINITY;
      continue;
    }
    for (int hk = 0; hk < c->Hkv; hk++)
      for (int r = 0; r < L; r++)
        for (int d = 0; d < c->D; d++) {
          const size_t from = (((size_t)b * c->Hkv + hk) * c->Lk + r) * c->D + d;
          const size_t to = ((size_t)hk * L + r) * c->D + d;
          k1[to] = io->k[from], v1[to] = io->v[from];
        }
    fjg_ref_problem p = {1, c->Hq, c->Hkv, c->Lq, L, c->D, (double)scale,
                         fjr_spec_graph(spec), &io->vals.env, 0, 0};
    ok = fjg_reference_dense(&p, io->q + b * nq1, k1, v1, io->ro + b * nq1, io->rl + b * nl1) ==
             FJ_OK &&
         fjg_reference_lowp(&p, c->dt, io->q + b * nq1, k1, v1, io->lo + b * nq1,
                            io->ll + b * nl1) == FJ_OK;
  }
  free(k1), free(v1);
  return ok;
}

/* Skip Softmax cases (Hq == Hkv, no mask). Each head's query rows share a
 * direction u (row 0, and u + 0.3 x its own noise for the others); every
 * kv position p with p % 256 in {0, 16, 32, 48} (the first key of each
 * decode warp's slice in every fourth tile) gets k = c u, a score near 12
 * for every row where the others are about N(0, 1): after a needle, the
 * keys between needles lie about 10 below the running max and their slices
 * (decode) or warps' tiles (forward) are skipped at these thresholds. */
static void plant_needles(const dcase *c, io_t *io) {
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->Hkv; h++) {
      double *u = io->q + (((size_t)b * c->Hq + h) * c->Lq) * c->D;
      for (int t = 1; t < c->Lq; t++)
        for (int d = 0; d < c->D; d++) {
          double *x = u + (size_t)t * c->D + d;
          *x = fjg_round_to_dtype((float)(u[d] + 0.3 * *x), c->dt);
        }
      double uu = 0;
      for (int d = 0; d < c->D; d++) uu += u[d] * u[d];
      const double f = 12.0 * sqrt((double)c->D) / uu;
      for (int pos = 0; pos < c->Lk; pos++) {
        if (pos % 256 >= 64 || pos % 16 != 0) continue;
        double *k = io->k + (((size_t)b * c->Hkv + h) * c->Lk + pos) * c->D;
        for (int d = 0; d < c->D; d++) k[d] = fjg_round_to_dtype((float)(f * u[d]), c->dt);
      }
    }
}

/* The Skip Softmax run against the exact one, row by row. A skipped key's
 * score lies more than ln(1 / lambda) below its row's final max (the
 * running max never exceeds it), so the skipped mass S is at most S_max,
 * the mass of all such keys, a fraction f = S_max / Z of the row's total:
 * 0 <= LSE_exact - LSE_skip <= -ln(1 - f), and O moves by at most 2 f max|v|
 * (plus the outputs' rounding). Skipping must have happened: some row's
 * LSE lower by more than float noise. */
static int check_skip(fj_context *ctx, const fjr_driver *drv, const fj_spec *spec,
                      const dcase *c, io_t *io) {
  const size_t nl = (size_t)c->B * c->Hq * c->Lq;
  float *lse2 = malloc(4 * nl);
  double *sc = malloc(sizeof(double) * (c->Lk ? c->Lk : 1));
  int pass = lse2 && sc && launch(ctx, drv, spec, c, io, c->skip, io->o2, lse2);
  double vmax = 0, most = 0, worst_o = 0;
  const double scale = 1.0 / sqrt((double)c->D), ln_lambda = log((double)c->skip);
  for (size_t i = 0; i < (size_t)c->B * c->Hkv * c->Lk * c->D; i++) vmax = fmax(vmax, fabs(io->v[i]));
  for (int b = 0; pass && b < c->B; b++)
    for (int h = 0; pass && h < c->Hq; h++)
      for (int t = 0; pass && t < c->Lq; t++) {
        const size_t row = ((size_t)b * c->Hq + h) * c->Lq + t;
        const double *q = io->q + row * c->D;
        const int L = io->lens[b], hk = h / (c->Hq / c->Hkv);
        if (L == 0) {
          pass = lse2[row] == -INFINITY && io->lse[row] == -INFINITY;
          continue;
        }
        double m = -INFINITY, z = 0, small = 0;
        for (int pos = 0; pos < L; pos++) {
          const double *k = io->k + (((size_t)b * c->Hkv + hk) * c->Lk + pos) * c->D;
          double dot = 0;
          for (int d = 0; d < c->D; d++) dot += q[d] * k[d];
          sc[pos] = dot * scale;
          m = fmax(m, sc[pos]);
        }
        for (int pos = 0; pos < L; pos++) {
          z += exp(sc[pos] - m);
          if (sc[pos] < m + ln_lambda) small += exp(sc[pos] - m);
        }
        const double f = small / z;
        const double dl = (double)io->lse[row] - lse2[row];
        most = fmax(most, dl);
        const double lse_slack = 4e-6 * fabs(io->lse[row]) + 1e-5;
        if (!(dl >= -lse_slack && dl <= -log1p(-f) + lse_slack)) pass = 0;
        for (int d = 0; d < c->D; d++) {
          const double e = fabs((double)io->o2[row * c->D + d] - io->o[row * c->D + d]);
          worst_o = fmax(worst_o, e);
          if (!(e <= 2 * f * vmax + 1e-2)) pass = 0;
        }
      }
  if (most <= 1e-4) pass = 0; /* nothing was skipped */
  printf("  skip: LSE lower by up to %.2e, max |o - exact| %.2e", most, worst_o);
  free(lse2);
  free(sc);
  return pass;
}

static int run_case(fj_context *ctx, const fjr_driver *drv, int idx) {
  const dcase *c = &cases[idx];
  io_t io;
  memset(&io, 0, sizeof io);
  printf("[%2d] %-16s %s D%-3d B%d H%d/%d %2dx%-5d %s%s  ", idx, c->name,
         c->dt == FJ_DTYPE_F16 ? "fp16" : "bf16", c->D, c->B, c->Hq, c->Hkv, c->Lq, c->Lk,
         c->bshd ? "bshd" : "bhsd", c->page ? " paged" : "");
  fflush(stdout);
  fj_spec *spec = NULL;
  if (fj_spec_load_string(ctx, c->src, strlen(c->src), c->name, &spec) != FJ_OK) {
    printf("FAIL (spec: %s)\n", fj_context_last_error(ctx));
    return 0;
  }
  uint64_t s = 0xdec0de00ull + (uint64_t)idx * 7919;
  const size_t nq = (size_t)c->B * c->Hq * c->Lq * c->D, nl = (size_t)c->B * c->Hq * c->Lq;
  const size_t nk = (size_t)c->B * c->Hkv * c->Lk * c->D;
  io.q = gpu_random_inputs(nq, c->dt, &s);
  io.k = gpu_random_inputs(nk, c->dt, &s);
  io.v = gpu_random_inputs(nk, c->dt, &s);
  io.o = malloc(4 * nq), io.o2 = malloc(4 * nq), io.lo = malloc(4 * nq);
  io.lse = malloc(4 * nl), io.ll = malloc(4 * nl);
  io.ro = malloc(8 * nq), io.rl = malloc(8 * nl);
  io.lens = malloc(4 * (size_t)c->B);
  const int max_pages = c->page ? (c->Lk + c->page - 1) / c->page : 0;
  const int num_pages = c->B * max_pages + 2;
  io.table = malloc(4 * (size_t)(c->B * max_pages + 1));
  int ok = io.q && io.k && io.v && io.o && io.o2 && io.lo && io.lse && io.ll && io.ro &&
           io.rl && io.lens && io.table;
  for (int b = 0; ok && b < c->B; b++)
    io.lens[b] = !c->seqlens ? c->Lk
                 : b == 0    ? c->Lk
                 : b == 1    ? 0
                 : b == 2    ? (c->Lk > 23 ? 23 : 1) /* below late_kv's 40: no tile at all */
                             : 1 + (int)(gpu_uniform(&s) * (c->Lk - 1));
  if (ok && c->page) { /* a shuffled permutation of the pool's pages */
    int32_t *perm = malloc(4 * (size_t)num_pages);
    ok = perm != NULL;
    for (int i = 0; ok && i < num_pages; i++) perm[i] = i;
    for (int i = num_pages - 1; ok && i > 0; i--) {
      const int j = (int)(gpu_uniform(&s) * (i + 1));
      const int32_t t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; ok && i < c->B * max_pages; i++) io.table[i] = perm[i];
    free(perm);
  }
  if (ok && c->skip > 0) plant_needles(c, &io);
  ok = ok && gpu_alloc_bhld(drv, &io.dq, c->dt, c->bshd, c->B, c->Hq, c->Lq, c->D) &&
       gpu_alloc_bhld(drv, &io.dout, c->dt, c->bshd, c->B, c->Hq, c->Lq, c->D) &&
       gpu_alloc_lse(drv, &io.dlse, c->B, c->Hq, c->Lq) &&
       gpu_upload_bhld(drv, &io.dq, io.q, c->dt, c->bshd, c->B, c->Hq, c->Lq, c->D) &&
       gpu_values_fill(drv, spec, c->Hq, c->Lq, c->Lk, &s, &io.vals) &&
       upload_i32(drv, &io.dlens, io.lens, 1, c->B, 0);
  if (ok && c->page)
    ok = upload_paged(drv, &io.dk, io.k, c, io.lens, io.table, max_pages, num_pages) &&
         upload_paged(drv, &io.dv, io.v, c, io.lens, io.table, max_pages, num_pages) &&
         upload_i32(drv, &io.dtable, io.table, 2, c->B, max_pages);
  else if (ok)
    ok = gpu_alloc_bhld(drv, &io.dk, c->dt, c->bshd, c->B, c->Hkv, c->Lk, c->D) &&
         gpu_alloc_bhld(drv, &io.dv, c->dt, c->bshd, c->B, c->Hkv, c->Lk, c->D) &&
         gpu_upload_bhld(drv, &io.dk, io.k, c->dt, c->bshd, c->B, c->Hkv, c->Lk, c->D) &&
         gpu_upload_bhld(drv, &io.dv, io.v, c->dt, c->bshd, c->B, c->Hkv, c->Lk, c->D);
  /* The paged pool's rows past Lk hold NaN; the logical k, v the reference
   * reads are the dense ones. */
  ok = ok && launch(ctx, drv, spec, c, &io, 0.0f, io.o, io.lse) && reference(spec, c, &io);
  fjg_check_report ro, rl;
  memset(&ro, 0, sizeof ro), memset(&rl, 0, sizeof rl);
  int pass = ok && fjg_ref_check(io.ro, io.lo, io.o, nq, FLOOR_O, &ro) &&
             fjg_ref_check(io.rl, io.ll, io.lse, nl, FLOOR_LSE, &rl);
  printf("o %.2e/%.2e  lse %.2e/%.2e", ro.max_err, ro.tolerance, rl.max_err, rl.tolerance);
  if (pass && c->skip > 0) pass = check_skip(ctx, drv, spec, c, &io);
  printf("  %s\n", pass ? "PASS" : "FAIL");
  io_free(drv, &io);
  fj_spec_destroy(spec);
  return pass;
}

/* fj_merge_states over N random segments (one row with all of them empty,
 * one with a NaN LSE: its O and LSE are NaN) against the CPU; fp32 and bf16
 * parts, and fp32 parts at an address 4 bytes past 16-byte alignment (the
 * kernel's scalar loads). N 5, 23 and 45 take one, two and four warps a
 * row; N 150, several batches of segments a warp. */
static int test_merge_n(fj_context *ctx, const fjr_driver *drv, int N) {
  const int B = 2, H = 3, L = 7, D = 72;
  const size_t rows = (size_t)B * H * L;
  uint64_t s = 0x3e96e;
  float *op = malloc(4 * N * rows * D), *lp = malloc(4 * N * rows);
  float *o = malloc(4 * rows * D), *l = malloc(4 * rows);
  uint16_t *op16 = malloc(2 * N * rows * D);
  int ok = op && lp && o && l && op16;
  for (size_t i = 0; ok && i < N * rows * D; i++) {
    op[i] = (float)gpu_normal(&s);
    op16[i] = fjg_f32_to_bf16(op[i]);
    op[i] = (float)fjg_round_to_dtype(op[i], FJ_DTYPE_BF16);
  }
  for (size_t i = 0; ok && i < N * rows; i++)
    lp[i] = (i % rows == 4 || gpu_uniform(&s) < 0.2) ? -INFINITY : (float)(3 * gpu_normal(&s));
  if (ok) lp[(N / 2) * rows + 5] = NAN;
  int pass = ok;
  for (int variant = 0; pass && variant < 3; variant++) {
    gpu_tensor tp, tl, to, tlse;
    memset(&tp, 0, sizeof tp), memset(&tl, 0, sizeof tl);
    memset(&to, 0, sizeof to), memset(&tlse, 0, sizeof tlse);
    const int esz = variant == 1 ? 2 : 4, skew = variant == 2 ? 4 : 0;
    int64_t pshape[5] = {N, B, H, L, D}, pstr[5] = {(int64_t)rows * D, (int64_t)H * L * D,
                                                    (int64_t)L * D, D, 1};
    int64_t lshape[4] = {N, B, H, L}, lstr[4] = {(int64_t)rows, H * L, L, 1};
    DLTensor dp = {0}, dl = {0};
    pass = gpu_alloc(drv, &tp, N * rows * D * esz + skew) &&
           gpu_cu_ok(drv, drv->cuMemcpyHtoD(tp.ptr + skew,
                                            variant == 1 ? (void *)op16 : (void *)op,
                                            N * rows * D * esz), "upload") &&
           gpu_alloc(drv, &tl, N * rows * 4) &&
           gpu_cu_ok(drv, drv->cuMemcpyHtoD(tl.ptr, lp, N * rows * 4), "upload") &&
           gpu_alloc_bhld(drv, &to, FJ_DTYPE_BF16, 0, B, H, L, D) &&
           gpu_alloc_lse(drv, &tlse, B, H, L) && gpu_poison(drv, &to, FJ_DTYPE_BF16, &tlse);
    dp.data = (void *)(uintptr_t)(tp.ptr + skew), dp.device = (DLDevice){kDLCUDA, 0};
    dp.ndim = 5;
    dp.dtype = (DLDataType){variant == 1 ? kDLBfloat : kDLFloat, (uint8_t)(esz * 8), 1};
    dp.shape = pshape, dp.strides = pstr;
    dl.data = (void *)(uintptr_t)tl.ptr, dl.device = (DLDevice){kDLCUDA, 0}, dl.ndim = 4;
    dl.dtype = (DLDataType){kDLFloat, 32, 1}, dl.shape = lshape, dl.strides = lstr;
    fj_merge_args m = {.o_parts = &dp, .lse_parts = &dl, .o = &to.t, .lse = &tlse.t};
    if (pass && fj_merge_states(ctx, &m) != FJ_OK) {
      printf("merge: %s\n", fj_context_last_error(ctx));
      pass = 0;
    }
    pass = pass && gpu_cu_ok(drv, drv->cuCtxSynchronize(), "merge") &&
           gpu_download_bhld(drv, &to, o, FJ_DTYPE_BF16, 0, B, H, L, D) &&
           gpu_cu_ok(drv, drv->cuMemcpyDtoH(l, tlse.ptr, rows * 4), "download");
    double worst = 0;
    for (size_t r = 0; pass && r < rows; r++) {
      if (r == 5) {
        for (int d = 0; d < D; d++) pass = pass && isnan(o[r * D + d]);
        pass = pass && isnan(l[r]);
        continue;
      }
      double m0 = -INFINITY, sum = 0;
      for (int i = 0; i < N; i++) m0 = fmax(m0, lp[i * rows + r]);
      for (int i = 0; i < N; i++)
        if (lp[i * rows + r] != -INFINITY) sum += exp(lp[i * rows + r] - m0);
      const double lse = sum > 0 ? m0 + log(sum) : -INFINITY;
      if (lse == -INFINITY ? l[r] != -INFINITY : fabs(l[r] - lse) > 1e-4) pass = 0;
      for (int d = 0; d < D; d++) {
        double acc = 0;
        for (int i = 0; i < N; i++)
          if (lp[i * rows + r] != -INFINITY)
            acc += exp(lp[i * rows + r] - lse) * op[(i * rows + r) * D + d];
        const double e = fabs(o[r * D + d] - (sum > 0 ? acc : 0.0));
        if (!(e <= 2e-2)) pass = 0;
        worst = fmax(worst, e);
      }
    }
    printf("[merge] N=%d %s parts: max err %.2e  %s\n", N,
           variant == 1 ? "bf16" : variant == 2 ? "fp32, unaligned" : "fp32", worst,
           pass ? "PASS" : "FAIL");
    gpu_free(drv, &tp), gpu_free(drv, &tl), gpu_free(drv, &to), gpu_free(drv, &tlse);
  }
  free(op), free(lp), free(o), free(l), free(op16);
  return pass;
}

static int test_merge(fj_context *ctx, const fjr_driver *drv) {
  return test_merge_n(ctx, drv, 5) && test_merge_n(ctx, drv, 23) && test_merge_n(ctx, drv, 45) &&
         test_merge_n(ctx, drv, 150);
}

/* fj_paged_from_csr: three sequences (one empty, one cut to max_pages). */
static int test_csr(fj_context *ctx, const fjr_driver *drv) {
  const int B = 3, max_pages = 4, page = 16;
  const int32_t indptr[] = {0, 3, 3, 9}, indices[] = {7, 2, 5, 1, 0, 3, 4, 6, 8};
  const int32_t last[] = {5, 16, 9};
  gpu_tensor ti, tx, tl, tb, ts;
  memset(&ti, 0, sizeof ti), memset(&tx, 0, sizeof tx), memset(&tl, 0, sizeof tl);
  memset(&tb, 0, sizeof tb), memset(&ts, 0, sizeof ts);
  int32_t table[12], lens[3], junk[12];
  for (int i = 0; i < 12; i++) junk[i] = -99;
  int pass = upload_i32(drv, &ti, indptr, 1, B + 1, 0) && upload_i32(drv, &tx, indices, 1, 9, 0) &&
             upload_i32(drv, &tl, last, 1, B, 0) && upload_i32(drv, &tb, junk, 2, B, max_pages) &&
             upload_i32(drv, &ts, junk, 1, B, 0);
  fj_paged_csr_args a = {.kv_indptr = &ti.t, .kv_indices = &tx.t, .kv_last_page_len = &tl.t,
                         .page_size = page, .block_table = &tb.t, .seqlens_k = &ts.t};
  if (pass && fj_paged_from_csr(ctx, &a) != FJ_OK) {
    printf("csr: %s\n", fj_context_last_error(ctx));
    pass = 0;
  }
  pass = pass && gpu_cu_ok(drv, drv->cuCtxSynchronize(), "csr") &&
         gpu_cu_ok(drv, drv->cuMemcpyDtoH(table, tb.ptr, sizeof table), "download") &&
         gpu_cu_ok(drv, drv->cuMemcpyDtoH(lens, ts.ptr, sizeof lens), "download");
  const int32_t want_t[12] = {7, 2, 5, 0, 0, 0, 0, 0, 1, 0, 3, 4};
  const int32_t want_l[3] = {2 * 16 + 5, 0, 4 * 16};
  pass = pass && !memcmp(table, want_t, sizeof table) && !memcmp(lens, want_l, sizeof lens);
  printf("[csr] block table and lengths  %s\n", pass ? "PASS" : "FAIL");
  gpu_free(drv, &ti), gpu_free(drv, &tx), gpu_free(drv, &tl), gpu_free(drv, &tb);
  gpu_free(drv, &ts);
  return pass;
}

int main(int argc, char **argv) {
  const fjr_driver *drv = NULL;
  fj_context *ctx = gpu_open(&drv);
  int passed = 0, failed = 0;
  const char *only = argc > 1 ? argv[1] : NULL;
  for (int i = 0; i < NCASES; i++) {
    if (only && !strstr(cases[i].name, only)) continue;
    run_case(ctx, drv, i) ? passed++ : failed++;
  }
  if (!only) {
    test_merge(ctx, drv) ? passed++ : failed++;
    test_csr(ctx, drv) ? passed++ : failed++;
  }
  printf("%d passed, %d failed\n", passed, failed);
  fj_context_destroy(ctx);
  return failed ? 1 : 0;
}
