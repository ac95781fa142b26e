/*
 * tests/gpu/test_serving.c: the forward's serving layouts (docs/serving.md)
 * against the float64 CPU reference, one sequence at a time: packed
 * variable-length batches (cu_seqlens_q/k, lse [Hq, total_q]; 64 sequences
 * of random lengths, empty ones included), per-sequence kv lengths
 * (seqlens_k, with bottom-right causal masks following each sequence's own
 * length) and paged KV (page pools with shuffled block tables, page sizes
 * 16 to 256, prefill chunks of 512 queries over caches of about 4k
 * positions). Fresh random inputs, NaN-poisoned outputs; the kv rows past
 * each sequence's length and the pool's unused pages hold NaN and
 * block-table entries past a sequence's pages hold a page index far outside
 * the pool, so a kernel that reads either fails. Sequences without kv give
 * O = 0 and LSE = -inf. The tolerance rule is fjg_ref_check's.
 *
 * Every case runs with the template the runtime picks (sm90 on an H200) and
 * again with the sm80 template named on the context; head dim 256 (sm90
 * only) runs on sm_90a devices alone.
 *
 * Exits 77 (skipped) without a GPU. Prints one line per case and "N passed,
 * N failed"; exit status 1 when any failed.
 */
#include <time.h>

#include "gpu/gpu_util.h"

#define FLOOR_O 1e-3
#define FLOOR_LSE 1e-3
#define MAXB 64

typedef struct scase {
  const char *spec;
  fj_dtype dt;
  int D, Hq, Hkv, B;
  int lq[MAXB], lk[MAXB];
  int q_packed;  /* cu_seqlens_q; else q [B, Hq, lq[0], D], every lq equal */
  int kv_packed; /* cu_seqlens_k */
  int page_size; /* > 0: paged KV with seqlens_k */
  int kv_dense;  /* k, v [B, Hkv, kv_dense, D] with seqlens_k */
  int gen;       /* > 0: B packed sequences of random lengths (lq = lk, some
                    0, odd ones) summing to about gen tokens */
} scase;

static const char *const spec_src[][2] = {
    {"full", "return { mask_mod = noop_mask() }"},
    {"causal", "return { mask_mod = causal() }"},
    {"causal_br", "return { mask_mod = causal{align = \"bottom_right\"} }"},
    {"sliding_window", "return { mask_mod = sliding_window(param(\"window\", \"i32\")) }"},
    {"window_br",
     "return { mask_mod = sliding_window(param(\"window\", \"i32\"),\n"
     "  {align = \"bottom_right\"}) }"},
    {"softcap_br",
     "return { mask_mod = causal{align = \"bottom_right\"}, score_mod = softcap(30) }"},
};
#define NSPECS (int)(sizeof spec_src / sizeof spec_src[0])

static const fj_dtype BF = FJ_DTYPE_BF16, FP = FJ_DTYPE_F16;

static const scase cases[] = {
    /* Packed self-attention batches of odd lengths. */
    {"causal", BF, 128, 4, 2, 4, {1, 129, 300, 77}, {1, 129, 300, 77}, 1, 1, 0, 0, 0},
    {"sliding_window", FP, 64, 8, 1, 3, {513, 17, 200}, {513, 17, 200}, 1, 1, 0, 0, 0},
    {"full", BF, 64, 2, 2, 5, {33, 0, 128, 1, 250}, {100, 10, 1, 300, 64}, 1, 1, 0, 0, 0},
    /* Packed, Lq != Lk per sequence: bottom-right rows past the kv are fully
     * masked, and a sequence without kv is all masked. */
    {"causal_br", BF, 128, 2, 2, 3, {50, 300, 5}, {400, 100, 0}, 1, 1, 0, 0, 0},
    {"softcap_br", FP, 128, 4, 4, 3, {129, 64, 200}, {1000, 64, 333}, 1, 1, 0, 0, 0},
    /* seqlens_k over dense k and v. */
    {"causal_br", BF, 128, 4, 2, 3, {100, 100, 100}, {700, 333, 101}, 0, 0, 0, 700, 0},
    {"window_br", FP, 64, 4, 1, 2, {64, 64}, {64, 499}, 0, 0, 0, 500, 0},
    {"causal_br", BF, 64, 2, 1, 3, {10, 200, 1}, {300, 250, 7}, 1, 0, 0, 301, 0},
    /* Paged: shuffled pages, prefill chunks over long caches. */
    {"causal_br", BF, 128, 4, 2, 2, {100, 100}, {1500, 2013}, 0, 0, 16, 0, 0},
    {"causal_br", FP, 64, 8, 2, 3, {337, 337, 337}, {3000, 337, 4100}, 0, 0, 64, 0, 0},
    {"full", BF, 128, 2, 1, 2, {600, 600}, {2500, 900}, 0, 0, 256, 0, 0},
    {"window_br", BF, 128, 4, 2, 2, {100, 250}, {1000, 2000}, 1, 0, 48, 0, 0},
    {"softcap_br", FP, 128, 2, 2, 3, {1, 16, 17}, {4000, 16, 1}, 1, 0, 128, 0, 0},
    /* 64 packed sequences of random lengths, about 8k tokens (the varlen
     * target's shape, smaller). */
    {"causal", BF, 128, 4, 2, 64, {0}, {0}, 1, 1, 0, 0, 8192},
    {"full", FP, 64, 4, 4, 64, {0}, {0}, 1, 1, 0, 0, 8192},
    /* Chunked prefill: 512 new tokens over a cache of about 4k, GQA,
     * bottom-right causal; paged (pages of 16, 64, 128 and 256), packed q
     * over pages, and contiguous with seqlens_k. */
    {"causal_br", BF, 128, 8, 2, 2, {512, 512}, {4096, 3900}, 0, 0, 16, 0, 0},
    {"causal_br", BF, 128, 4, 1, 2, {512, 512}, {4000, 4096}, 0, 0, 64, 0, 0},
    {"causal_br", FP, 128, 4, 1, 2, {512, 512}, {3999, 4200}, 0, 0, 128, 0, 0},
    {"causal_br", BF, 128, 4, 1, 2, {512, 512}, {4096, 2500}, 0, 0, 256, 0, 0},
    {"causal_br", BF, 128, 4, 1, 2, {512, 300}, {4096, 3333}, 1, 0, 64, 0, 0},
    {"causal_br", BF, 128, 8, 2, 2, {512, 512}, {4096, 3001}, 0, 0, 0, 4200, 0},
    /* Head dim 256 (sm90 only). */
    {"causal", BF, 256, 2, 1, 3, {1, 129, 300}, {1, 129, 300}, 1, 1, 0, 0, 0},
    {"causal_br", FP, 256, 4, 2, 2, {250, 250}, {1000, 517}, 0, 0, 16, 0, 0},
    {"window_br", BF, 256, 2, 2, 2, {64, 64}, {64, 499}, 0, 0, 0, 500, 0},
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

/* A device copy of n bytes of host memory, described as a tensor. */
static int upload(const fjr_driver *drv, gpu_tensor *t, const void *h, size_t bytes, int ndim,
                  const int64_t *shape, DLDataType dt) {
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    t->shape[i] = shape[i];
    t->strides[i] = stride;
    stride *= shape[i];
  }
  if (!gpu_alloc(drv, t, bytes) ||
      (h && !gpu_cu_ok(drv, drv->cuMemcpyHtoD(t->ptr, h, bytes), "cuMemcpyHtoD")))
    return 0;
  gpu_describe(t, ndim, dt);
  return 1;
}

typedef struct io {
  double *q[MAXB], *k[MAXB], *v[MAXB]; /* per sequence, [H][L][D] */
  gpu_tensor dq, dk, dv, dout, dlse, cu_q, cu_k, seqlens, bt;
  gpu_values vals;
  uint16_t *ho; /* o downloaded */
  float *hl;    /* lse downloaded */
} io;

static void io_free(const fjr_driver *drv, io *x) {
  for (int b = 0; b < MAXB; b++) free(x->q[b]), free(x->k[b]), free(x->v[b]);
  gpu_tensor *ts[] = {&x->dq, &x->dk, &x->dv, &x->dout, &x->dlse,
                      &x->cu_q, &x->cu_k, &x->seqlens, &x->bt};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) gpu_free(drv, ts[i]);
  gpu_values_free(drv, &x->vals);
  free(x->ho), free(x->hl);
}

/* Element offset of q/o row i of sequence b, head h. */
static size_t q_off(const scase *c, const int *cu, int b, int h, int i) {
  if (c->q_packed) return ((size_t)(cu[b] + i) * c->Hq + h) * c->D;
  return (((size_t)b * c->Hq + h) * c->lq[0] + i) * c->D;
}
static size_t lse_off(const scase *c, const int *cu, int total_q, int b, int h, int i) {
  if (c->q_packed) return (size_t)h * total_q + cu[b] + i;
  return ((size_t)b * c->Hq + h) * c->lq[0] + i;
}

static int launch(fj_context *ctx, const fjr_driver *drv, const fj_spec *spec, const scase *c,
                  uint64_t seed, io *x, int *cu, int *total_q) {
  const DLDataType t16 = {c->dt == FJ_DTYPE_F16 ? kDLFloat : kDLBfloat, 16, 1};
  const DLDataType i32 = {kDLInt, 32, 1}, f32 = {kDLFloat, 32, 1};
  const int D = c->D, Hq = c->Hq, Hkv = c->Hkv, B = c->B;
  const uint16_t nan16 = c->dt == FJ_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
  uint64_t s = seed;
  int cuk[MAXB + 1], maxq = 0, maxk = 0;
  cu[0] = cuk[0] = 0;
  for (int b = 0; b < B; b++) {
    if (!c->q_packed && c->lq[b] != c->lq[0]) {
      printf("(a case with dense q needs one length) ");
      return 0;
    }
    x->q[b] = gpu_random_inputs((size_t)Hq * c->lq[b] * D, c->dt, &s);
    x->k[b] = gpu_random_inputs((size_t)Hkv * c->lk[b] * D, c->dt, &s);
    x->v[b] = gpu_random_inputs((size_t)Hkv * c->lk[b] * D, c->dt, &s);
    if (!x->q[b] || !x->k[b] || !x->v[b]) return 0;
    cu[b + 1] = cu[b] + c->lq[b];
    cuk[b + 1] = cuk[b] + c->lk[b];
    maxq = c->lq[b] > maxq ? c->lq[b] : maxq;
    maxk = c->lk[b] > maxk ? c->lk[b] : maxk;
  }
  *total_q = c->q_packed ? cu[B] : B * c->lq[0];
  const size_t nq = (size_t)*total_q * Hq * D;
  /* q and o. */
  uint16_t *hq = malloc(2 * (nq ? nq : 1));
  if (!hq) return 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < c->lq[b]; i++)
        for (int d = 0; d < D; d++)
          hq[q_off(c, cu, b, h, i) + d] = to16(x->q[b][((size_t)h * c->lq[b] + i) * D + d], c->dt);
  const int64_t qshape4[4] = {B, Hq, c->lq[0], D}, qshape3[3] = {*total_q, Hq, D};
  int ok = upload(drv, &x->dq, hq, 2 * nq, c->q_packed ? 3 : 4, c->q_packed ? qshape3 : qshape4,
                  t16) &&
           upload(drv, &x->dout, NULL, 2 * nq, c->q_packed ? 3 : 4,
                  c->q_packed ? qshape3 : qshape4, t16);
  free(hq);
  if (!ok) return 0;
  const int64_t lshape2[2] = {Hq, *total_q}, lshape3[3] = {B, Hq, c->lq[0]};
  if (!upload(drv, &x->dlse, NULL, 4 * (size_t)Hq * *total_q, c->q_packed ? 2 : 3,
              c->q_packed ? lshape2 : lshape3, f32) ||
      !gpu_poison(drv, &x->dout, c->dt, &x->dlse))
    return 0;
  /* k and v: packed, dense with NaN past each length, or paged. */
  size_t nkv = 0, rows = 0;
  int max_pages = 0, num_pages = 0;
  int *table = NULL;
  if (c->kv_packed) {
    rows = (size_t)cuk[B];
  } else if (c->page_size) {
    for (int b = 0; b < B; b++) {
      const int np = (c->lk[b] + c->page_size - 1) / c->page_size;
      max_pages = np + 1 > max_pages ? np + 1 : max_pages; /* a spare column */
      num_pages += np;
    }
    num_pages += 5; /* pages nobody uses: NaN */
    rows = (size_t)num_pages * c->page_size;
  } else {
    rows = (size_t)B * c->kv_dense;
  }
  nkv = rows * Hkv * D;
  uint16_t *hk = malloc(2 * (nkv ? nkv : 1)), *hv = malloc(2 * (nkv ? nkv : 1));
  int *perm = malloc(sizeof(int) * (size_t)(num_pages + 1));
  table = calloc((size_t)B * (max_pages ? max_pages : 1), sizeof(int));
  ok = hk && hv && perm && table;
  for (size_t i = 0; ok && i < nkv; i++) hk[i] = hv[i] = nan16;
  if (ok && c->page_size) { /* a shuffled assignment of pages */
    for (int i = 0; i < num_pages; i++) perm[i] = i;
    for (int i = num_pages - 1; i > 0; i--) {
      int j = (int)(gpu_rand(&s) % (uint64_t)(i + 1)), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    for (int b = 0, used = 0; b < B; b++) {
      const int np = (c->lk[b] + c->page_size - 1) / c->page_size;
      for (int j = 0; j < max_pages; j++)
        table[b * max_pages + j] = j < np ? perm[used + j] : 0x3fffffff;
      used += np;
    }
  }
  for (int b = 0; ok && b < B; b++)
    for (int h = 0; h < Hkv; h++)
      for (int i = 0; i < c->lk[b]; i++) {
        size_t row;
        if (c->kv_packed)
          row = (size_t)cuk[b] + i;
        else if (c->page_size)
          row = (size_t)table[b * max_pages + i / c->page_size] * c->page_size +
                i % c->page_size;
        else
          row = (size_t)b * c->kv_dense + i;
        /* packed and paged rows are [row][Hkv][D]; dense [b][h][i][D] */
        const size_t off = c->kv_packed || c->page_size
                               ? (row * Hkv + h) * D
                               : (((size_t)b * Hkv + h) * c->kv_dense + i) * D;
        for (int d = 0; d < D; d++) {
          hk[off + d] = to16(x->k[b][((size_t)h * c->lk[b] + i) * D + d], c->dt);
          hv[off + d] = to16(x->v[b][((size_t)h * c->lk[b] + i) * D + d], c->dt);
        }
      }
  const int64_t kshape3[3] = {(int64_t)rows, Hkv, D},
                kpool[4] = {num_pages, c->page_size, Hkv, D},
                kdense[4] = {B, Hkv, c->kv_dense, D};
  const int knd = c->kv_packed ? 3 : 4;
  const int64_t *kshape = c->kv_packed ? kshape3 : c->page_size ? kpool : kdense;
  ok = ok && upload(drv, &x->dk, hk, 2 * nkv, knd, kshape, t16) &&
       upload(drv, &x->dv, hv, 2 * nkv, knd, kshape, t16);
  const int64_t bshape[1] = {B + 1}, sshape[1] = {B}, tshape[2] = {B, max_pages};
  if (ok && c->q_packed) ok = upload(drv, &x->cu_q, cu, 4 * (size_t)(B + 1), 1, bshape, i32);
  if (ok && c->kv_packed) ok = upload(drv, &x->cu_k, cuk, 4 * (size_t)(B + 1), 1, bshape, i32);
  if (ok && (c->page_size || c->kv_dense))
    ok = upload(drv, &x->seqlens, c->lk, 4 * (size_t)B, 1, sshape, i32);
  if (ok && c->page_size)
    ok = upload(drv, &x->bt, table, 4 * (size_t)B * max_pages, 2, tshape, i32);
  free(hk), free(hv), free(perm), free(table);
  if (!ok || !gpu_values_fill(drv, spec, Hq, maxq, maxk > 0 ? maxk : 1, &s, &x->vals)) return 0;

  fj_forward_args a = {.q = &x->dq.t, .k = &x->dk.t, .v = &x->dv.t, .o = &x->dout.t,
                       .lse = &x->dlse.t, .args = x->vals.args, .num_args = x->vals.n};
  if (c->q_packed) a.cu_seqlens_q = &x->cu_q.t, a.max_seqlen_q = maxq;
  if (c->kv_packed) a.cu_seqlens_k = &x->cu_k.t, a.max_seqlen_k = maxk > 0 ? maxk : 1;
  if (c->page_size || c->kv_dense) a.seqlens_k = &x->seqlens.t;
  if (c->page_size) a.block_table = &x->bt.t;
  if (fj_attention_forward(ctx, spec, &a) != FJ_OK) {
    printf("launch failed: %s ", fj_context_last_error(ctx));
    return 0;
  }
  x->ho = malloc(2 * (nq ? nq : 1));
  x->hl = malloc(4 * (size_t)Hq * (*total_q ? *total_q : 1));
  return x->ho && x->hl && gpu_cu_ok(drv, drv->cuCtxSynchronize(), "the kernel") &&
         gpu_cu_ok(drv, drv->cuMemcpyDtoH(x->ho, x->dout.ptr, 2 * nq), "cuMemcpyDtoH") &&
         gpu_cu_ok(drv, drv->cuMemcpyDtoH(x->hl, x->dlse.ptr, 4 * (size_t)Hq * *total_q),
                   "cuMemcpyDtoH");
}

/* The reference one sequence at a time, all sequences' values side by side
 * for one fjg_ref_check. */
static int check(const fj_spec *spec, const scase *c, io *x, const int *cu, int total_q,
                 fjg_check_report *ro, fjg_check_report *rl) {
  const int D = c->D, Hq = c->Hq;
  size_t no = 0, nl = 0;
  for (int b = 0; b < c->B; b++) no += (size_t)Hq * c->lq[b] * D, nl += (size_t)Hq * c->lq[b];
  double *ref_o = malloc(8 * (no + 1)), *ref_l = malloc(8 * (nl + 1));
  float *low_o = malloc(4 * (no + 1)), *low_l = malloc(4 * (nl + 1));
  float *out_o = malloc(4 * (no + 1)), *out_l = malloc(4 * (nl + 1));
  int ok = ref_o && ref_l && low_o && low_l && out_o && out_l;
  size_t po = 0, pl = 0;
  for (int b = 0; ok && b < c->B; b++) {
    const int lq = c->lq[b], lk = c->lk[b];
    if (!lq) continue;
    const size_t so = (size_t)Hq * lq * D, sl = (size_t)Hq * lq;
    if (lk == 0) { /* no kv: every row fully masked */
      for (size_t i = 0; i < so; i++) ref_o[po + i] = 0.0, low_o[po + i] = 0.0f;
      for (size_t i = 0; i < sl; i++) ref_l[pl + i] = -INFINITY, low_l[pl + i] = -INFINITY;
    } else {
      fjg_ref_problem p = {1, Hq, c->Hkv, lq, lk, D, (double)(1.0f / sqrtf((float)D)),
                           fjr_spec_graph(spec), &x->vals.env, 0, 0};
      ok = fjg_reference_dense(&p, x->q[b], x->k[b], x->v[b], ref_o + po, ref_l + pl) ==
               FJ_OK &&
           fjg_reference_lowp(&p, c->dt, x->q[b], x->k[b], x->v[b], low_o + po,
                              low_l + pl) == FJ_OK;
    }
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < lq; i++) {
        for (int d = 0; d < D; d++)
          out_o[po + ((size_t)h * lq + i) * D + d] = from16(x->ho[q_off(c, cu, b, h, i) + d], c->dt);
        out_l[pl + (size_t)h * lq + i] = x->hl[lse_off(c, cu, total_q, b, h, i)];
      }
    po += so, pl += sl;
  }
  if (ok) {
    const int a = fjg_ref_check(ref_o, low_o, out_o, no, FLOOR_O, ro);
    const int l = fjg_ref_check(ref_l, low_l, out_l, nl, FLOOR_LSE, rl);
    ok = a && l;
  }
  free(ref_o), free(ref_l), free(low_o), free(low_l), free(out_o), free(out_l);
  return ok;
}

/* A case of B packed sequences of random lengths (lq = lk) summing to
 * about c->gen tokens: one in eight empty, the rest uniform in [1, 2 * mean
 * - 1] (odd lengths and sequences of one token among them). */
static void gen_lengths(scase *c, uint64_t seed) {
  const int mean = c->gen / c->B;
  for (int b = 0; b < c->B; b++) {
    const uint64_t r = gpu_rand(&seed);
    c->lq[b] = c->lk[b] = r % 8 == 0 ? 0 : 1 + (int)((r >> 8) % (uint64_t)(2 * mean - 1));
  }
}

static int run_case(fj_context *ctx, const fjr_driver *drv, fj_spec *const *loaded, int idx) {
  scase cg = cases[idx];
  if (cg.gen) gen_lengths(&cg, 0x9e3779b9ull + (uint64_t)idx);
  const scase *c = &cg;
  io x;
  int cu[MAXB + 1], total_q = 0, pass = 0;
  fjg_check_report ro, rl;
  memset(&x, 0, sizeof x);
  memset(&ro, 0, sizeof ro);
  memset(&rl, 0, sizeof rl);
  printf("[%2d] %-14s %s D%-3d H%d/%d B%d %s%s", idx, c->spec,
         c->dt == FJ_DTYPE_F16 ? "fp16" : "bf16", c->D, c->Hq, c->Hkv, c->B,
         c->q_packed ? "varlen-q " : "", c->kv_packed ? "varlen-kv " : "");
  if (c->page_size) printf("paged(%d) ", c->page_size);
  if (c->kv_dense) printf("seqlens_k(Lk %d) ", c->kv_dense);
  fflush(stdout);
  const int s = find_spec(c->spec);
  if (s < 0 || !loaded[s]) {
    printf("FAIL (no spec)\n");
    return 0;
  }
  if (launch(ctx, drv, loaded[s], c, 0x5e7e0000ull + (uint64_t)idx, &x, cu, &total_q))
    pass = check(loaded[s], c, &x, cu, total_q, &ro, &rl);
  else
    printf("(no result) ");
  printf(" o %.2e/%.2e lse %.2e/%.2e %s\n", ro.max_err, ro.tolerance, rl.max_err,
         rl.tolerance, pass ? "PASS" : "FAIL");
  if (!pass && (ro.nonfinite || ro.inf_mismatch || ro.zero_mismatch || rl.nonfinite ||
                rl.inf_mismatch))
    printf("      o: %zu NaN/Inf, %zu nonzero masked; lse: %zu NaN/Inf, %zu -inf "
           "mismatches\n",
           ro.nonfinite, ro.zero_mismatch, rl.nonfinite, rl.inf_mismatch);
  io_free(drv, &x);
  return pass;
}

/* Whether the context's device is sm_90a (head dim 256 runs there only). */
static int is_sm90a(fj_context *ctx) {
  const char *arch = NULL;
  return fjr_context_arch(ctx, &arch) == FJ_OK && arch && !strcmp(arch, "sm_90a");
}

/* Every case on a context (tmpl: the template it names, or NULL: the
 * runtime's choice), its specs loaded on it. */
static void run_all(const fjr_driver *drv, const char *tmpl, int sm90a, int only, int *passed,
                    int *failed) {
  fj_context_options o;
  fj_context_options_init(&o);
  o.kernel_template = tmpl;
  fj_context *ctx = NULL;
  if (fj_context_create(&o, &ctx) != FJ_OK) {
    printf("context (template %s): cannot create\n", tmpl ? tmpl : "default");
    (*failed)++;
    return;
  }
  printf("-- template %s\n", tmpl ? tmpl : "chosen by the runtime");
  fj_spec *loaded[NSPECS] = {0};
  for (int s = 0; s < NSPECS; s++)
    if (fj_spec_load_string(ctx, spec_src[s][1], strlen(spec_src[s][1]), spec_src[s][0],
                            &loaded[s]) != FJ_OK)
      printf("spec %s: %s\n", spec_src[s][0], fj_context_last_error(ctx));
  for (int i = 0; i < NCASES; i++) {
    if (only >= 0 && i != only) continue;
    /* Head dim 256: the sm90 forward's alone. */
    if (cases[i].D == 256 && (!sm90a || (tmpl && strcmp(tmpl, "sm90") != 0))) continue;
    run_case(ctx, drv, loaded, i) ? (*passed)++ : (*failed)++;
  }
  for (int s = 0; s < NSPECS; s++) fj_spec_destroy(loaded[s]);
  fj_context_destroy(ctx);
}

/* Usage: gpu_test_serving [CASE]: every case, or the one of that index. */
int main(int argc, char **argv) {
  const fjr_driver *drv = NULL;
  fj_context *ctx = gpu_open(&drv);
  const int only = argc > 1 ? atoi(argv[1]) : -1;
  int passed = 0, failed = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const int sm90a = is_sm90a(ctx);
  run_all(drv, NULL, sm90a, only, &passed, &failed);
  /* On an H200 the runtime picks sm90: the sm80 template's serving path
   * runs too. */
  if (sm90a) run_all(drv, "sm80", sm90a, only, &passed, &failed);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("%d passed, %d failed (%.1f s)\n", passed, failed,
         (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
  fj_context_destroy(ctx);
  return failed ? 1 : 0;
}
