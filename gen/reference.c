/*
 * gen/reference.c: CPU reference attention (float64 dense and streaming, the
 * low-precision emulation), the 16-bit rounding helpers and the comparison
 * rule. See gen/reference.h.
 *
 * Work is split into items of a few query rows of one (b, h) and handed to a
 * small pool of pthreads through an atomic counter, so the reference of a
 * 2x16x1337x1337 problem takes seconds, not minutes.
 */
#include "gen/reference.h"

#include "gen/derivative.h"
#include "gen/eval.h"
#include "gen/interval.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_THREADS 64
#define ROWS_PER_ITEM 16
#define COUNT_TILE 64

typedef enum {
  KIND_DENSE,
  KIND_STREAMING,
  KIND_LOWP,
  KIND_COUNT,
  KIND_UNCERTAIN,
  /* The backward pass: rows (per query row: the forward, delta, dq and the
   * trainable buffers' gradients) then columns (per key: dk, dv). */
  KIND_BWD_ROWS,
  KIND_BWD_COLS,
  KIND_LOWP_BWD_ROWS,
  KIND_LOWP_BWD_COLS
} job_kind;

/* The derivative of score_mod (fjg_reachable list 2) as a program over the
 * graph's nodes, evaluated in float32 as fj_score_grad computes it: each
 * node rounded once (gen/eval.h's semantics through fjg_apply_op), a
 * division by a constant that decides nothing as a multiplication by its
 * reciprocal. Read-only once built; each thread has its own values. */
typedef struct grad_step {
  uint8_t op, type, otype, recip;
  int32_t id, a, b, c, arg;
  fjg_value imm; /* CONST, SIZE, PARAM: the value; recip: the reciprocal */
} grad_step;

typedef struct grad_prog {
  const fjg_derivative *d; /* NULL: the score passes unchanged */
  grad_step *steps;
  int count, nvals;
  /* Per argument: where its gradient's accumulator starts in a thread's
   * flat array, -1 when no gradient is asked for it. */
  int64_t acc_off[FJG_MAX_ARGS];
  int64_t acc_len;
} grad_prog;

typedef struct ref_job {
  job_kind kind;
  int B, Hq, Hkv, Lq, Lk, D, group;
  double scale;
  const fjg_graph *g;
  int has_mask, has_score;
  fjg_env env;
  int block_m, block_n;
  fj_dtype dtype;
  int fp32_rowsum;
  const double *q, *k, *v; /* float64 inputs */
  const float *qf, *kf, *vf; /* rounded inputs for the lowp kind */
  double *o, *lse;
  float *of, *lsef;
  uint8_t *uncertain_rows; /* KIND_UNCERTAIN: the output, per row */
  /* Backward kinds. dout, dlse: float64 (dlse may be NULL); lowp kinds
   * read doutf (rounded) and the lowp forward's of/lsef. delta per row:
   * written by the rows pass, read by the columns pass. */
  const double *dout, *dlse;
  const float *doutf;
  double *delta, *dq, *dk, *dv;
  float *deltaf, *dqf, *dkf, *dvf;
  const grad_prog *gp;
  /* Trainable buffers' gradients per argument (NULL: not asked); threads
   * add their accumulators under merge_lock. */
  double *const *dbuf;
  float *const *dbuff;
  pthread_mutex_t merge_lock;
  int rows_per_item, items_per_bh;
  long num_items;
  atomic_long next;
  atomic_int failed;
  atomic_llong count; /* KIND_COUNT result */
  int count_bh;       /* KIND_COUNT: 1 when the mask depends on b or h */
} ref_job;

/* Per-thread scratch, sized for the largest kind, and the thread's
 * evaluator of the graph. */
typedef struct ref_scratch {
  double *s;  /* scores: Lk (dense) or block_m * block_n (streaming) */
  double *m, *l, *u; /* streaming state: block_m, block_m, block_m * D */
  float *sf, *accf;  /* lowp: Lk scores, D accumulators */
  fjg_evaluator ev;
  int has_ev;
  int uncertain; /* the current row met an uncertain element */
  /* Backward: raw scores (before score_mod) of a row, two D-long
   * accumulators, the derivative's values, the buffer-gradient
   * accumulators (gp->acc_len, double or float by kind). */
  double *raw, *acc2;
  float *acc2f;
  fjg_value *gvals;
  double *gacc;
  float *gaccf;
} ref_scratch;

/* ---- 16-bit formats ---- */

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

uint16_t fjg_f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  /* Adding 0x7fff plus the lowest kept bit rounds half to even; a carry
   * into the exponent is the correct result (up to inf). */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float fjg_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t fjg_f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t ax = u & 0x7fffffffu;
  if (ax >= 0x7f800000u) /* inf or NaN */
    return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) /* >= 65520 rounds (half to even) to inf */
    return (uint16_t)(sign | 0x7c00u);
  if (ax < 0x38800000u) {
    /* Below 2^-14: a subnormal, in units of 2^-24. Scaling by 2^24 is exact
     * and nearbyintf rounds half to even; 0x400 encodes 2^-14 correctly. */
    float a = bits_f32(ax) * 16777216.0f;
    return (uint16_t)(sign | (uint16_t)nearbyintf(a));
  }
  uint32_t e = (ax >> 23) - 127 + 15;
  uint32_t mant = ax & 0x7fffffu;
  uint32_t h = (e << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry is ok */
  return (uint16_t)(sign | h);
}

float fjg_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (e == 0) { /* zero or subnormal: mant * 2^-24 is exact in float */
    float v = (float)mant * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((e - 15 + 127) << 23) | (mant << 13));
}

float fjg_round_to_dtype(float x, fj_dtype dtype) {
  if (dtype == FJ_DTYPE_F16) return fjg_f16_to_f32(fjg_f32_to_f16(x));
  return fjg_bf16_to_f32(fjg_f32_to_bf16(x));
}

/* ---- rows ---- */

/* The mask and the score_mod as the kernel computes them (float32); an
 * element the CPU cannot decide the kernel's way marks the row. */
static int allowed(const ref_job *j, ref_scratch *t, int b, int h, int qi,
                   int kj) {
  if (!j->has_mask) return 1;
  int uncertain;
  int v = fjg_eval_mask_guess(&t->ev, b, h, qi, kj, &uncertain);
  t->uncertain |= uncertain;
  return v;
}

static double modded(const ref_job *j, ref_scratch *t, double s, int b, int h,
                     int qi, int kj) {
  if (!j->has_score) return s;
  int uncertain;
  float v = fjg_eval_score_f32(&t->ev, (float)s, b, h, qi, kj, &uncertain);
  t->uncertain |= uncertain;
  return v;
}

static size_t q_off(const ref_job *j, int b, int h, int i) {
  return (((size_t)b * j->Hq + h) * j->Lq + i) * j->D;
}

static size_t kv_off(const ref_job *j, int b, int h) {
  return ((size_t)b * j->Hkv + h / j->group) * j->Lk * j->D;
}

static size_t lse_off(const ref_job *j, int b, int h, int i) {
  return ((size_t)b * j->Hq + h) * j->Lq + i;
}

static double dot_d(const double *a, const double *b, int n) {
  double s = 0;
  for (int d = 0; d < n; d++) s += a[d] * b[d];
  return s;
}

/* Scores of one row (-inf where masked out); returns their maximum. */
static double row_scores(const ref_job *j, ref_scratch *t, int b, int h,
                         int i, double *s) {
  const double *qr = j->q + q_off(j, b, h, i);
  const double *kb = j->k + kv_off(j, b, h);
  double m = -INFINITY;
  for (int c = 0; c < j->Lk; c++) {
    s[c] = -INFINITY;
    if (!allowed(j, t, b, h, i, c)) continue;
    s[c] = modded(j, t, j->scale * dot_d(qr, kb + (size_t)c * j->D, j->D), b,
                  h, i, c);
    if (s[c] > m) m = s[c];
  }
  return m;
}

static void dense_row(const ref_job *j, int b, int h, int i, ref_scratch *t) {
  double *o = j->o + q_off(j, b, h, i);
  const double *vb = j->v + kv_off(j, b, h);
  double m = row_scores(j, t, b, h, i, t->s);
  memset(o, 0, sizeof(double) * j->D);
  if (m == -INFINITY) {
    j->lse[lse_off(j, b, h, i)] = -INFINITY;
    return;
  }
  double sum = 0;
  for (int c = 0; c < j->Lk; c++) {
    if (t->s[c] == -INFINITY) continue;
    double p = exp(t->s[c] - m);
    const double *vr = vb + (size_t)c * j->D;
    sum += p;
    for (int d = 0; d < j->D; d++) o[d] += p * vr[d];
  }
  for (int d = 0; d < j->D; d++) o[d] /= sum;
  j->lse[lse_off(j, b, h, i)] = m + log(sum);
}

/* Folds one kv tile into the (m, l, u) state of one query row, guarding the
 * empty state: a tile that leaves the maximum at -inf changes nothing. */
static void stream_update(const ref_job *j, const double *s, int n,
                          const double *vt, double *m, double *l, double *u) {
  double tmax = -INFINITY;
  for (int c = 0; c < n; c++)
    if (s[c] > tmax) tmax = s[c];
  double new_m = tmax > *m ? tmax : *m;
  if (new_m == -INFINITY) return;
  double alpha = exp(*m - new_m); /* exp(-inf) = 0 for the empty state */
  *l *= alpha;
  for (int d = 0; d < j->D; d++) u[d] *= alpha;
  for (int c = 0; c < n; c++) {
    if (s[c] == -INFINITY) continue;
    double p = exp(s[c] - new_m);
    *l += p;
    for (int d = 0; d < j->D; d++) u[d] += p * vt[(size_t)c * j->D + d];
  }
  *m = new_m;
}

static void stream_tile_scores(const ref_job *j, ref_scratch *t, int b,
                               int h, int i, int j0, int n, double *s) {
  const double *qr = j->q + q_off(j, b, h, i);
  const double *kb = j->k + kv_off(j, b, h);
  for (int c = 0; c < n; c++) {
    int kj = j0 + c;
    s[c] = -INFINITY;
    if (!allowed(j, t, b, h, i, kj)) continue;
    s[c] = modded(j, t, j->scale * dot_d(qr, kb + (size_t)kj * j->D, j->D),
                  b, h, i, kj);
  }
}

static void stream_finish(const ref_job *j, int b, int h, int i, double m,
                          double l, const double *u) {
  double *o = j->o + q_off(j, b, h, i);
  if (l > 0) {
    for (int d = 0; d < j->D; d++) o[d] = u[d] / l;
    j->lse[lse_off(j, b, h, i)] = m + log(l);
  } else {
    memset(o, 0, sizeof(double) * j->D);
    j->lse[lse_off(j, b, h, i)] = -INFINITY;
  }
}

/* One block of block_m query rows, streamed over kv tiles of block_n. */
static void stream_block(const ref_job *j, int b, int h, int i0, int rows,
                         ref_scratch *t) {
  const double *vb = j->v + kv_off(j, b, h);
  for (int r = 0; r < rows; r++) {
    t->m[r] = -INFINITY;
    t->l[r] = 0;
    memset(t->u + (size_t)r * j->D, 0, sizeof(double) * j->D);
  }
  for (int j0 = 0; j0 < j->Lk; j0 += j->block_n) {
    int n = j->Lk - j0 < j->block_n ? j->Lk - j0 : j->block_n;
    for (int r = 0; r < rows; r++) {
      double *s = t->s + (size_t)r * j->block_n;
      stream_tile_scores(j, t, b, h, i0 + r, j0, n, s);
      stream_update(j, s, n, vb + (size_t)j0 * j->D, &t->m[r], &t->l[r],
                    t->u + (size_t)r * j->D);
    }
  }
  for (int r = 0; r < rows; r++)
    stream_finish(j, b, h, i0 + r, t->m[r], t->l[r], t->u + (size_t)r * j->D);
}

/* The kernel's arithmetic: float32 scores from rounded inputs, float32
 * softmax, P rounded to the input dtype for PV (and for the row sum unless
 * fp32_rowsum), float32 accumulation, O rounded to the input dtype. */
static void lowp_row(const ref_job *j, int b, int h, int i, ref_scratch *t) {
  const float *qr = j->qf + q_off(j, b, h, i);
  const float *kb = j->kf + kv_off(j, b, h);
  const float *vb = j->vf + kv_off(j, b, h);
  float *s = t->sf, m = -INFINITY, scale = (float)j->scale;
  for (int c = 0; c < j->Lk; c++) {
    s[c] = -INFINITY;
    if (!allowed(j, t, b, h, i, c)) continue;
    const float *kr = kb + (size_t)c * j->D;
    float acc = 0;
    for (int d = 0; d < j->D; d++) acc += qr[d] * kr[d];
    s[c] = (float)modded(j, t, (double)(acc * scale), b, h, i, c);
    if (s[c] > m) m = s[c];
  }
  float *o = j->of + q_off(j, b, h, i);
  memset(t->accf, 0, sizeof(float) * j->D);
  float l = 0;
  for (int c = 0; m != -INFINITY && c < j->Lk; c++) {
    if (s[c] == -INFINITY) continue;
    float p = expf(s[c] - m);
    float pr = fjg_round_to_dtype(p, j->dtype);
    const float *vr = vb + (size_t)c * j->D;
    l += j->fp32_rowsum ? p : pr;
    for (int d = 0; d < j->D; d++) t->accf[d] += pr * vr[d];
  }
  /* O is stored in the input dtype, as the kernel stores it. */
  for (int d = 0; d < j->D; d++)
    o[d] = l > 0 ? fjg_round_to_dtype(t->accf[d] / l, j->dtype) : 0.0f;
  j->lsef[lse_off(j, b, h, i)] = l > 0 ? m + logf(l) : -INFINITY;
}

/* Allowed pairs of query rows [i0, i1): tiles that interval analysis proves
 * full or empty are counted without evaluating the mask, so index-only masks
 * over 16k x 16k cost a few thousand classifications, not 268M evaluations. */
static long long count_rows(const ref_job *j, ref_scratch *t, int b, int h,
                            int i0, int i1) {
  long long n = 0;
  for (int c0 = 0; c0 < j->Lk; c0 += COUNT_TILE) {
    int c1 = c0 + COUNT_TILE < j->Lk ? c0 + COUNT_TILE : j->Lk;
    int cls = fjg_tile_class_cpu(j->g, &j->env, b, h, i0, i1 - 1, c0, c1 - 1);
    if (cls == FJG_TILE_FULL) n += (long long)(i1 - i0) * (c1 - c0);
    if (cls != FJG_TILE_PARTIAL) continue;
    for (int i = i0; i < i1; i++)
      for (int c = c0; c < c1; c++) n += allowed(j, t, b, h, i, c) ? 1 : 0;
  }
  return n;
}

/* Whether row i has an uncertain element (the score_mod only matters where
 * the mask allows, or may allow). */
static void uncertain_row(ref_job *j, ref_scratch *t, int b, int h, int i) {
  t->uncertain = 0;
  for (int c = 0; c < j->Lk && !t->uncertain; c++)
    if (allowed(j, t, b, h, i, c)) modded(j, t, 0.0, b, h, i, c);
  if (t->uncertain) {
    j->uncertain_rows[lse_off(j, b, h, i)] = 1;
    atomic_fetch_add(&j->count, 1);
  }
}

/* ---- backward ---- */

/* The derivative's nodes at one element; their values land in vals (by
 * node id). */
static void grad_run(const ref_job *j, fjg_value *vals, float score, int b,
                     int h, int q, int kv) {
  const grad_prog *gp = j->gp;
  fjg_value in[FJG_NUM_INPUTS];
  fjg_set_inputs(&j->env, in, score, b, h, q, kv);
  for (int k = 0; k < gp->count; k++) {
    const grad_step *n = &gp->steps[k];
    fjg_value v;
    switch (n->op) {
    case FJG_OP_CONST: case FJG_OP_SIZE: case FJG_OP_PARAM: v = n->imm; break;
    case FJG_OP_INPUT: v = in[n->arg]; break;
    case FJG_OP_LOAD:
      v = fjg_load_value(&j->env, n->arg, (fjg_type)n->type, vals[n->a].i);
      break;
    default:
      if (n->recip) {
        v.f = vals[n->a].f * n->imm.f;
      } else {
        v = fjg_apply_op((fjg_op)n->op, (fjg_type)n->type, (fjg_type)n->otype,
                         vals[n->a], vals[n->b], vals[n->c]);
      }
      break;
    }
    vals[n->id] = v;
  }
}

/* d score_mod / d score at raw score s, after adding dsp (dS'; 0: add
 * nothing) times each trainable read's derivative to the thread's
 * accumulators (float when lowp, else double). Without a derivative: 1. */
static double grad_at(const ref_job *j, ref_scratch *t, double dsp, float s,
                      int b, int h, int qi, int kj, int lowp) {
  const grad_prog *gp = j->gp;
  if (!gp || !gp->d) return 1.0;
  grad_run(j, t->gvals, s, b, h, qi, kj);
  const fjg_derivative *d = gp->d;
  for (int r = 0; dsp != 0 && r < d->num_buffer_grads; r++) {
    const fjg_buffer_grad *bg = &d->buffer_grads[r];
    int64_t off = gp->acc_off[bg->buffer];
    int32_t idx = t->gvals[bg->index].i;
    if (off < 0 || idx < 0 || idx >= j->env.buffer_len[bg->buffer]) continue;
    float gv = t->gvals[bg->grad].f;
    if (lowp)
      t->gaccf[off + idx] += (float)dsp * gv;
    else
      t->gacc[off + idx] += dsp * (double)gv;
  }
  return t->gvals[d->dscore].f;
}

/* Float64, one query row: scores, the forward (O, LSE), delta = dO.O -
 * dLSE, dS' = P (dP - delta) for each allowed key, dq = scale sum dS K
 * with dS = dS' d mod / d s, and the trainable buffers' dS' d mod / d buf.
 * An element with dS' == 0 adds nothing (as fj_score_grad). */
static void bwd_row(const ref_job *j, int b, int h, int i, ref_scratch *t) {
  const size_t qo = q_off(j, b, h, i), r = lse_off(j, b, h, i);
  const double *qr = j->q + qo, *dor = j->dout + qo;
  const double *kb = j->k + kv_off(j, b, h), *vb = j->v + kv_off(j, b, h);
  double *o = j->o + qo, *dq = j->dq + qo;
  double m = -INFINITY;
  for (int c = 0; c < j->Lk; c++) {
    t->s[c] = -INFINITY;
    if (!allowed(j, t, b, h, i, c)) continue;
    t->raw[c] = j->scale * dot_d(qr, kb + (size_t)c * j->D, j->D);
    t->s[c] = modded(j, t, t->raw[c], b, h, i, c);
    if (t->s[c] > m) m = t->s[c];
  }
  memset(o, 0, sizeof(double) * j->D);
  memset(dq, 0, sizeof(double) * j->D);
  if (m == -INFINITY) {
    j->lse[r] = -INFINITY;
    j->delta[r] = 0;
    return;
  }
  double sum = 0;
  for (int c = 0; c < j->Lk; c++)
    if (t->s[c] != -INFINITY) sum += exp(t->s[c] - m);
  const double L = m + log(sum);
  for (int c = 0; c < j->Lk; c++) {
    if (t->s[c] == -INFINITY) continue;
    double p = exp(t->s[c] - L);
    const double *vr = vb + (size_t)c * j->D;
    for (int d = 0; d < j->D; d++) o[d] += p * vr[d];
  }
  const double delta = dot_d(dor, o, j->D) - (j->dlse ? j->dlse[r] : 0.0);
  j->lse[r] = L;
  j->delta[r] = delta;
  for (int c = 0; c < j->Lk; c++) {
    if (t->s[c] == -INFINITY) continue;
    double p = exp(t->s[c] - L);
    double dsp = p * (dot_d(dor, vb + (size_t)c * j->D, j->D) - delta);
    if (dsp == 0) continue;
    double ds = dsp * grad_at(j, t, dsp, (float)t->raw[c], b, h, i, c, 0);
    const double *kr = kb + (size_t)c * j->D;
    for (int d = 0; d < j->D; d++) dq[d] += ds * kr[d];
  }
  for (int d = 0; d < j->D; d++) dq[d] *= j->scale;
}

/* Float64, one key of KV head hk: dv = sum P dO and dk = scale sum dS Q
 * over the query heads of its group and their rows (LSE and delta from the
 * rows pass). */
static void bwd_col(const ref_job *j, int b, int hk, int c, ref_scratch *t) {
  const size_t ko = ((size_t)b * j->Hkv + hk) * j->Lk * j->D + (size_t)c * j->D;
  const double *kr = j->k + ko, *vr = j->v + ko;
  double *dk = t->acc2, *dv = t->acc2 + j->D;
  memset(t->acc2, 0, sizeof(double) * 2 * j->D);
  for (int h = hk * j->group; h < (hk + 1) * j->group; h++)
    for (int i = 0; i < j->Lq; i++) {
      const size_t r = lse_off(j, b, h, i), qo = q_off(j, b, h, i);
      if (j->lse[r] == -INFINITY || !allowed(j, t, b, h, i, c)) continue;
      const double *qr = j->q + qo, *dor = j->dout + qo;
      double raw = j->scale * dot_d(qr, kr, j->D);
      double s = modded(j, t, raw, b, h, i, c);
      if (s == -INFINITY) continue;
      double p = exp(s - j->lse[r]);
      for (int d = 0; d < j->D; d++) dv[d] += p * dor[d];
      double dsp = p * (dot_d(dor, vr, j->D) - j->delta[r]);
      if (dsp == 0) continue;
      /* The rows pass added the buffer gradients. */
      double ds = dsp * grad_at(j, t, 0.0, (float)raw, b, h, i, c, 0);
      for (int d = 0; d < j->D; d++) dk[d] += ds * qr[d];
    }
  for (int d = 0; d < j->D; d++) {
    j->dk[ko + d] = dk[d] * j->scale;
    j->dv[ko + d] = dv[d];
  }
}

static float dot_f(const float *a, const float *b, int n) {
  float s = 0;
  for (int d = 0; d < n; d++) s += a[d] * b[d];
  return s;
}

/* In the input dtype, one query row, as FlashAttention's backward computes
 * it: the forward kernel's O (in the dtype) and LSE (float32), float32
 * scores from rounded inputs, delta and dP in float32, dS rounded to the
 * dtype before dq += dS K (float32 accumulation), dq rounded at the end;
 * buffer gradients from the float32 dS' as fj_score_grad adds them. */
static void lowp_bwd_row(const ref_job *j, int b, int h, int i,
                         ref_scratch *t) {
  const size_t qo = q_off(j, b, h, i), r = lse_off(j, b, h, i);
  const float *qr = j->qf + qo, *dor = j->doutf + qo, *o = j->of + qo;
  const float *kb = j->kf + kv_off(j, b, h), *vb = j->vf + kv_off(j, b, h);
  const float L = j->lsef[r], scale = (float)j->scale;
  float *acc = t->accf;
  memset(acc, 0, sizeof(float) * j->D);
  j->deltaf[r] = L == -INFINITY ? 0.0f
                 : dot_f(dor, o, j->D) - (j->dlse ? (float)j->dlse[r] : 0.0f);
  for (int c = 0; L != -INFINITY && c < j->Lk; c++) {
    if (!allowed(j, t, b, h, i, c)) continue;
    const float *kr = kb + (size_t)c * j->D;
    float raw = dot_f(qr, kr, j->D) * scale;
    float s = (float)modded(j, t, (double)raw, b, h, i, c);
    if (s == -INFINITY) continue;
    float p = expf(s - L);
    float dsp = p * (dot_f(dor, vb + (size_t)c * j->D, j->D) - j->deltaf[r]);
    if (dsp == 0) continue;
    float ds = dsp * (float)grad_at(j, t, dsp, raw, b, h, i, c, 1);
    float dsr = fjg_round_to_dtype(ds, j->dtype);
    for (int d = 0; d < j->D; d++) acc[d] += dsr * kr[d];
  }
  for (int d = 0; d < j->D; d++)
    j->dqf[qo + d] = fjg_round_to_dtype(acc[d] * scale, j->dtype);
}

/* In the input dtype, one key: P rounded before dv += P dO, dS rounded
 * before dk += dS Q, float32 accumulation, dk and dv rounded at the end. */
static void lowp_bwd_col(const ref_job *j, int b, int hk, int c,
                         ref_scratch *t) {
  const size_t ko = ((size_t)b * j->Hkv + hk) * j->Lk * j->D + (size_t)c * j->D;
  const float *kr = j->kf + ko, *vr = j->vf + ko, scale = (float)j->scale;
  float *dk = t->acc2f, *dv = t->acc2f + j->D;
  memset(t->acc2f, 0, sizeof(float) * 2 * j->D);
  for (int h = hk * j->group; h < (hk + 1) * j->group; h++)
    for (int i = 0; i < j->Lq; i++) {
      const size_t r = lse_off(j, b, h, i), qo = q_off(j, b, h, i);
      if (j->lsef[r] == -INFINITY || !allowed(j, t, b, h, i, c)) continue;
      const float *qr = j->qf + qo, *dor = j->doutf + qo;
      float raw = dot_f(qr, kr, j->D) * scale;
      float s = (float)modded(j, t, (double)raw, b, h, i, c);
      if (s == -INFINITY) continue;
      float p = expf(s - j->lsef[r]);
      float pr = fjg_round_to_dtype(p, j->dtype);
      for (int d = 0; d < j->D; d++) dv[d] += pr * dor[d];
      float dsp = p * (dot_f(dor, vr, j->D) - j->deltaf[r]);
      if (dsp == 0) continue;
      float ds = dsp * (float)grad_at(j, t, 0.0, raw, b, h, i, c, 1);
      float dsr = fjg_round_to_dtype(ds, j->dtype);
      for (int d = 0; d < j->D; d++) dk[d] += dsr * qr[d];
    }
  for (int d = 0; d < j->D; d++) {
    j->dkf[ko + d] = fjg_round_to_dtype(dk[d] * scale, j->dtype);
    j->dvf[ko + d] = fjg_round_to_dtype(dv[d], j->dtype);
  }
}

/* ---- the pool ---- */

static int is_cols(job_kind kind) {
  return kind == KIND_BWD_COLS || kind == KIND_LOWP_BWD_COLS;
}

static void run_item(ref_job *j, long item, ref_scratch *t) {
  long bh = item / j->items_per_bh;
  int i0 = (int)(item % j->items_per_bh) * j->rows_per_item;
  if (is_cols(j->kind)) { /* items over (b, KV head, keys) */
    int b = (int)(bh / j->Hkv), hk = (int)(bh % j->Hkv);
    int c1 = i0 + j->rows_per_item < j->Lk ? i0 + j->rows_per_item : j->Lk;
    for (int c = i0; c < c1; c++) {
      if (j->kind == KIND_BWD_COLS)
        bwd_col(j, b, hk, c, t);
      else
        lowp_bwd_col(j, b, hk, c, t);
    }
    return;
  }
  int b = (int)(bh / j->Hq), h = (int)(bh % j->Hq);
  int i1 = i0 + j->rows_per_item < j->Lq ? i0 + j->rows_per_item : j->Lq;
  if (j->kind == KIND_BWD_ROWS || j->kind == KIND_LOWP_BWD_ROWS) {
    for (int i = i0; i < i1; i++) {
      if (j->kind == KIND_BWD_ROWS)
        bwd_row(j, b, h, i, t);
      else
        lowp_bwd_row(j, b, h, i, t);
    }
  } else if (j->kind == KIND_STREAMING) {
    stream_block(j, b, h, i0, i1 - i0, t);
  } else if (j->kind == KIND_COUNT) {
    atomic_fetch_add(&j->count, count_rows(j, t, b, h, i0, i1));
  } else if (j->kind == KIND_UNCERTAIN) {
    for (int i = i0; i < i1; i++) uncertain_row(j, t, b, h, i);
  } else {
    for (int i = i0; i < i1; i++) {
      if (j->kind == KIND_DENSE)
        dense_row(j, b, h, i, t);
      else
        lowp_row(j, b, h, i, t);
    }
  }
}

static void scratch_free(ref_scratch *t) {
  if (t->has_ev) fjg_evaluator_free(&t->ev);
  free(t->s);
  free(t->m);
  free(t->l);
  free(t->u);
  free(t->sf);
  free(t->accf);
  free(t->raw);
  free(t->acc2);
  free(t->acc2f);
  free(t->gvals);
  free(t->gacc);
  free(t->gaccf);
}

static int scratch_alloc(const ref_job *j, ref_scratch *t) {
  size_t ns = (size_t)(j->Lk > 0 ? j->Lk : 1);
  size_t bm = (size_t)j->block_m, d = (size_t)j->D;
  memset(t, 0, sizeof *t);
  if (j->kind == KIND_STREAMING) ns = bm * (size_t)j->block_n;
  t->s = malloc(sizeof(double) * ns);
  t->m = malloc(sizeof(double) * bm);
  t->l = malloc(sizeof(double) * bm);
  t->u = malloc(sizeof(double) * bm * d);
  t->sf = malloc(sizeof(float) * ns);
  t->accf = malloc(sizeof(float) * d);
  if (j->g) t->has_ev = fjg_evaluator_init(&t->ev, j->g, &j->env) == FJ_OK;
  int ok = t->s && t->m && t->l && t->u && t->sf && t->accf &&
           (!j->g || t->has_ev);
  if (j->kind == KIND_BWD_ROWS || j->kind == KIND_LOWP_BWD_ROWS ||
      is_cols(j->kind)) {
    const grad_prog *gp = j->gp;
    size_t acc = gp && gp->acc_len ? (size_t)gp->acc_len : 1;
    t->raw = malloc(sizeof(double) * ns);
    t->acc2 = malloc(sizeof(double) * 2 * d);
    t->acc2f = malloc(sizeof(float) * 2 * d);
    t->gvals = calloc(gp && gp->nvals ? (size_t)gp->nvals : 1, sizeof(fjg_value));
    t->gacc = calloc(acc, sizeof(double));
    t->gaccf = calloc(acc, sizeof(float));
    ok = ok && t->raw && t->acc2 && t->acc2f && t->gvals &&
         t->gacc && t->gaccf;
  }
  if (ok) return 0;
  scratch_free(t);
  return -1;
}

/* Adds a thread's buffer-gradient accumulators to the caller's arrays. */
static void merge_grads(ref_job *j, const ref_scratch *t) {
  const grad_prog *gp = j->gp;
  if (!gp || !gp->acc_len) return;
  pthread_mutex_lock(&j->merge_lock);
  for (int a = 0; a < FJG_MAX_ARGS; a++) {
    int64_t off = gp->acc_off[a];
    if (off < 0) continue;
    for (int64_t n = 0; n < j->env.buffer_len[a]; n++) {
      if (j->dbuf) j->dbuf[a][n] += t->gacc[off + n];
      if (j->dbuff) j->dbuff[a][n] += t->gaccf[off + n];
    }
  }
  pthread_mutex_unlock(&j->merge_lock);
}

static void *worker(void *arg) {
  ref_job *j = arg;
  ref_scratch t;
  if (scratch_alloc(j, &t) != 0) {
    atomic_store(&j->failed, 1);
    return NULL;
  }
  for (;;) {
    long item = atomic_fetch_add(&j->next, 1);
    if (item >= j->num_items) break;
    run_item(j, item, &t);
  }
  if (j->kind == KIND_BWD_ROWS || j->kind == KIND_LOWP_BWD_ROWS)
    merge_grads(j, &t);
  scratch_free(&t);
  return NULL;
}

static int thread_count(const fjg_ref_problem *p, long items) {
  long n = p->threads > 0 ? p->threads : sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 2) n = 2;
  if (n > MAX_THREADS) n = MAX_THREADS;
  if (n > items) n = items;
  return n < 1 ? 1 : (int)n;
}

/* Runs every item; the calling thread works too, so a pthread_create
 * failure only costs speed. */
static fj_status run_pool(const fjg_ref_problem *p, ref_job *j) {
  pthread_t tid[MAX_THREADS];
  int n = thread_count(p, j->num_items), started = 0;
  for (int t = 1; t < n; t++) {
    if (pthread_create(&tid[started], NULL, worker, j) != 0) break;
    started++;
  }
  worker(j);
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  return atomic_load(&j->failed) ? FJ_ENOMEM : FJ_OK;
}

static int problem_valid(const fjg_ref_problem *p) {
  return p && p->B > 0 && p->Hq > 0 && p->Hkv > 0 && p->Lq >= 0 &&
         p->Lk >= 0 && p->D > 0 && p->Hq % p->Hkv == 0;
}

static void job_init(ref_job *j, const fjg_ref_problem *p, job_kind kind,
                     int rows_per_item) {
  memset(j, 0, sizeof *j);
  j->kind = kind;
  j->B = p->B, j->Hq = p->Hq, j->Hkv = p->Hkv;
  j->Lq = p->Lq, j->Lk = p->Lk, j->D = p->D;
  j->group = p->Hq / p->Hkv;
  j->scale = p->scale != 0 ? p->scale : 1.0 / sqrt((double)p->D);
  j->g = p->g;
  j->has_mask = p->g && fjg_mask_root(p->g) >= 0;
  j->has_score = p->g && fjg_score_root(p->g) >= 0;
  if (p->env) j->env = *p->env;
  j->env.sizes[FJG_SZ_B] = p->B;
  j->env.sizes[FJG_SZ_HQ] = p->Hq;
  j->env.sizes[FJG_SZ_HKV] = p->Hkv;
  j->env.sizes[FJG_SZ_LQ] = p->Lq;
  j->env.sizes[FJG_SZ_LK] = p->Lk;
  j->block_m = rows_per_item;
  j->block_n = 1;
  j->rows_per_item = rows_per_item;
  j->items_per_bh = (p->Lq + rows_per_item - 1) / rows_per_item;
  j->num_items = (long)p->B * p->Hq * j->items_per_bh;
  atomic_init(&j->next, 0);
  atomic_init(&j->failed, 0);
  atomic_init(&j->count, 0);
}

fj_status fjg_reference_dense(const fjg_ref_problem *p, const double *q,
                              const double *k, const double *v, double *o,
                              double *lse) {
  ref_job j;
  if (!problem_valid(p) || !q || !k || !v || !o || !lse) return FJ_EINVAL;
  job_init(&j, p, KIND_DENSE, ROWS_PER_ITEM);
  j.q = q, j.k = k, j.v = v, j.o = o, j.lse = lse;
  return run_pool(p, &j);
}

fj_status fjg_reference_streaming(const fjg_ref_problem *p, int block_m,
                                  int block_n, const double *q,
                                  const double *k, const double *v, double *o,
                                  double *lse) {
  ref_job j;
  if (!problem_valid(p) || block_m < 1 || block_n < 1 || !q || !k || !v ||
      !o || !lse)
    return FJ_EINVAL;
  job_init(&j, p, KIND_STREAMING, block_m);
  j.block_n = block_n;
  j.q = q, j.k = k, j.v = v, j.o = o, j.lse = lse;
  return run_pool(p, &j);
}

static float *rounded_copy(const double *x, size_t n, fj_dtype dtype) {
  float *r = malloc(sizeof(float) * (n ? n : 1));
  if (!r) return NULL;
  for (size_t i = 0; i < n; i++) r[i] = fjg_round_to_dtype((float)x[i], dtype);
  return r;
}

fj_status fjg_reference_lowp(const fjg_ref_problem *p, fj_dtype dtype,
                             const double *q, const double *k,
                             const double *v, float *o, float *lse) {
  ref_job j;
  fj_status st = FJ_ENOMEM;
  float *qf = NULL, *kf = NULL, *vf = NULL;
  if (!problem_valid(p) || !q || !k || !v || !o || !lse) return FJ_EINVAL;
  if (dtype != FJ_DTYPE_BF16 && dtype != FJ_DTYPE_F16) return FJ_EINVAL;
  size_t nq = (size_t)p->B * p->Hq * p->Lq * p->D;
  size_t nk = (size_t)p->B * p->Hkv * p->Lk * p->D;
  qf = rounded_copy(q, nq, dtype);
  kf = rounded_copy(k, nk, dtype);
  vf = rounded_copy(v, nk, dtype);
  if (!qf || !kf || !vf) goto fail;
  job_init(&j, p, KIND_LOWP, ROWS_PER_ITEM);
  j.dtype = dtype;
  j.fp32_rowsum = !p->lowp_rounded_rowsum;
  j.qf = qf, j.kf = kf, j.vf = vf, j.of = o, j.lsef = lse;
  st = run_pool(p, &j);
fail:
  free(qf);
  free(kf);
  free(vf);
  return st;
}

int64_t fjg_reference_count_allowed(const fjg_ref_problem *p) {
  ref_job j;
  if (!problem_valid(p)) return -1;
  int64_t all = (int64_t)p->B * p->Hq * p->Lq * p->Lk;
  if (!p->g || fjg_mask_root(p->g) < 0) return all;
  unsigned deps = fjg_input_deps(p->g, fjg_mask_root(p->g));
  int per_bh = (deps & ((1u << FJG_IN_B) | (1u << FJG_IN_H))) != 0;
  fjg_ref_problem one = *p;
  if (!per_bh) one.B = 1, one.Hq = 1, one.Hkv = 1; /* same count each (b,h) */
  job_init(&j, &one, KIND_COUNT, COUNT_TILE);
  /* Sizes stay those of the real problem: masks may read them. */
  j.env.sizes[FJG_SZ_B] = p->B;
  j.env.sizes[FJG_SZ_HQ] = p->Hq;
  j.env.sizes[FJG_SZ_HKV] = p->Hkv;
  if (run_pool(&one, &j) != FJ_OK) return -1;
  int64_t n = (int64_t)atomic_load(&j.count);
  return per_bh ? n : n * p->B * p->Hq;
}

int64_t fjg_reference_uncertain_rows(const fjg_ref_problem *p, uint8_t *rows) {
  ref_job j;
  fjg_evaluator e;
  if (!problem_valid(p) || !rows) return -1;
  memset(rows, 0, (size_t)p->B * p->Hq * p->Lq);
  if (!p->g) return 0;
  job_init(&j, p, KIND_UNCERTAIN, ROWS_PER_ITEM);
  if (fjg_evaluator_init(&e, p->g, &j.env) != FJ_OK) return -1;
  int bounded = e.bounded[0] || e.bounded[1];
  fjg_evaluator_free(&e);
  if (!bounded) return 0; /* every element exact */
  j.uncertain_rows = rows;
  if (run_pool(p, &j) != FJ_OK) return -1;
  return (int64_t)atomic_load(&j.count);
}

/* ---- the backward pass ---- */

static void grad_prog_free(grad_prog *gp) { free(gp->steps); }

/* Builds the program of g's derivative and lays out one accumulator per
 * argument whose gradient is asked: a trainable buffer with an output
 * array (dbuf[a], the callers' double or float arrays; dbuf NULL: none).
 * FJ_EINVAL when g has a score_mod but no derivative. */
static fj_status grad_prog_init(grad_prog *gp, const fjg_graph *g,
                                const fjg_env *env, const void *const *dbuf) {
  memset(gp, 0, sizeof *gp);
  for (int a = 0; a < FJG_MAX_ARGS; a++) gp->acc_off[a] = -1;
  if (!g) return FJ_OK;
  gp->d = fjg_graph_derivative(g);
  if (fjg_score_root(g) >= 0 && !gp->d) return FJ_EINVAL;
  for (int a = 0; a < fjg_num_args(g) && a < FJG_MAX_ARGS; a++) {
    if (!dbuf || !dbuf[a] || !fjg_arg_at(g, a)->trainable || !env->buffer_len) continue;
    gp->acc_off[a] = gp->acc_len;
    gp->acc_len += env->buffer_len[a];
  }
  if (!gp->d) return FJ_OK;
  int count;
  const int32_t *list = fjg_reachable(g, 2, &count);
  gp->steps = malloc(sizeof(grad_step) * ((size_t)count + 1));
  uint8_t *decisive = calloc((size_t)fjg_num_nodes(g) + 1, 1);
  if (!gp->steps || !decisive) {
    free(gp->steps);
    free(decisive);
    gp->steps = NULL;
    return FJ_ENOMEM;
  }
  fjg_decisive_nodes(g, 2, decisive);
  const fjg_node *nodes = fjg_node_at(g, 0);
  for (int k = 0; k < count; k++) {
    const fjg_node *n = &nodes[list[k]];
    grad_step *st = &gp->steps[k];
    const int arity = fjg_op_arity((fjg_op)n->op);
    memset(st, 0, sizeof *st);
    st->op = n->op, st->type = n->type, st->id = list[k], st->arg = n->arg;
    /* Missing operands read any valid slot (unused). */
    st->a = arity >= 1 ? n->a : list[0];
    st->b = arity >= 2 ? n->b : list[0];
    st->c = arity >= 3 ? n->c : list[0];
    if (arity >= 1) st->otype = nodes[n->op == FJG_OP_WHERE ? n->b : n->a].type;
    switch (n->op) {
    case FJG_OP_CONST:
      if (n->type == FJG_F32) st->imm.f = n->imm.f;
      else st->imm.i = n->imm.i;
      break;
    case FJG_OP_SIZE: st->imm.i = env->sizes[n->arg]; break;
    case FJG_OP_PARAM:
      if (n->type == FJG_F32) st->imm.f = env->param_f32 ? env->param_f32[n->arg] : 0.0f;
      else st->imm.i = env->param_i32 ? env->param_i32[n->arg] : 0;
      break;
    case FJG_OP_DIV:
      st->recip = !decisive[list[k]] && fjg_div_recip(g, n->b, &st->imm.f);
      break;
    default: break;
    }
  }
  gp->count = count;
  gp->nvals = count ? list[count - 1] + 1 : 0;
  free(decisive);
  return FJ_OK;
}

/* A job over (b, KV head, keys) instead of (b, query head, rows). */
static void job_init_cols(ref_job *j, const fjg_ref_problem *p, job_kind kind) {
  job_init(j, p, kind, ROWS_PER_ITEM);
  j->items_per_bh = (p->Lk + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM;
  j->num_items = (long)p->B * p->Hkv * j->items_per_bh;
}

/* The rows pass then the columns pass (rows and cols set up by the
 * caller but for what they share). */
static fj_status run_backward(const fjg_ref_problem *p, ref_job *rows,
                              ref_job *cols) {
  pthread_mutex_init(&rows->merge_lock, NULL);
  fj_status st = run_pool(p, rows);
  pthread_mutex_destroy(&rows->merge_lock);
  return st == FJ_OK ? run_pool(p, cols) : st;
}

fj_status fjg_reference_backward(const fjg_ref_problem *p, const double *q,
                                 const double *k, const double *v,
                                 const double *dout, const double *dlse,
                                 double *o, double *lse, double *dq,
                                 double *dk, double *dv, double *const *dbuf) {
  ref_job rows, cols;
  grad_prog gp;
  double *own_o = NULL, *own_lse = NULL, *delta = NULL;
  fj_status st = FJ_ENOMEM;
  if (!problem_valid(p) || !q || !k || !v || !dout || !dq || !dk || !dv)
    return FJ_EINVAL;
  const size_t nq = (size_t)p->B * p->Hq * p->Lq * p->D;
  const size_t nl = (size_t)p->B * p->Hq * p->Lq;
  job_init(&rows, p, KIND_BWD_ROWS, ROWS_PER_ITEM);
  st = grad_prog_init(&gp, p->g, &rows.env, (const void *const *)dbuf);
  if (st != FJ_OK) return st;
  st = FJ_ENOMEM;
  if (!o) o = own_o = malloc(sizeof(double) * (nq ? nq : 1));
  if (!lse) lse = own_lse = malloc(sizeof(double) * (nl ? nl : 1));
  delta = malloc(sizeof(double) * (nl ? nl : 1));
  if (!o || !lse || !delta) goto fail;
  for (int a = 0; a < FJG_MAX_ARGS; a++)
    if (gp.acc_off[a] >= 0)
      memset(dbuf[a], 0, sizeof(double) * (size_t)rows.env.buffer_len[a]);
  rows.q = q, rows.k = k, rows.v = v, rows.dout = dout, rows.dlse = dlse;
  rows.o = o, rows.lse = lse, rows.delta = delta, rows.dq = dq;
  rows.gp = &gp, rows.dbuf = dbuf;
  job_init_cols(&cols, p, KIND_BWD_COLS);
  cols.q = q, cols.k = k, cols.v = v, cols.dout = dout;
  cols.lse = lse, cols.delta = delta, cols.dk = dk, cols.dv = dv, cols.gp = &gp;
  st = run_backward(p, &rows, &cols);
fail:
  grad_prog_free(&gp);
  free(own_o);
  free(own_lse);
  free(delta);
  return st;
}

fj_status fjg_reference_backward_lowp(const fjg_ref_problem *p,
                                      fj_dtype dtype, const double *q,
                                      const double *k, const double *v,
                                      const double *dout, const double *dlse,
                                      float *dq, float *dk, float *dv,
                                      float *const *dbuf) {
  ref_job rows, cols;
  grad_prog gp;
  float *qf = NULL, *kf = NULL, *vf = NULL, *dof = NULL;
  float *of = NULL, *lsef = NULL, *deltaf = NULL;
  fj_status st;
  if (!problem_valid(p) || !q || !k || !v || !dout || !dq || !dk || !dv)
    return FJ_EINVAL;
  if (dtype != FJ_DTYPE_BF16 && dtype != FJ_DTYPE_F16) return FJ_EINVAL;
  const size_t nq = (size_t)p->B * p->Hq * p->Lq * p->D;
  const size_t nk = (size_t)p->B * p->Hkv * p->Lk * p->D;
  const size_t nl = (size_t)p->B * p->Hq * p->Lq;
  job_init(&rows, p, KIND_LOWP_BWD_ROWS, ROWS_PER_ITEM);
  st = grad_prog_init(&gp, p->g, &rows.env, (const void *const *)dbuf);
  if (st != FJ_OK) return st;
  st = FJ_ENOMEM;
  qf = rounded_copy(q, nq, dtype);
  kf = rounded_copy(k, nk, dtype);
  vf = rounded_copy(v, nk, dtype);
  dof = rounded_copy(dout, nq, dtype);
  of = malloc(sizeof(float) * (nq ? nq : 1));
  lsef = malloc(sizeof(float) * (nl ? nl : 1));
  deltaf = malloc(sizeof(float) * (nl ? nl : 1));
  if (!qf || !kf || !vf || !dof || !of || !lsef || !deltaf) goto fail;
  /* The forward kernel's O (in the dtype) and LSE, which the backward
   * kernels read. */
  st = fjg_reference_lowp(p, dtype, q, k, v, of, lsef);
  if (st != FJ_OK) goto fail;
  for (int a = 0; a < FJG_MAX_ARGS; a++)
    if (gp.acc_off[a] >= 0)
      memset(dbuf[a], 0, sizeof(float) * (size_t)rows.env.buffer_len[a]);
  rows.dtype = dtype;
  rows.qf = qf, rows.kf = kf, rows.vf = vf, rows.doutf = dof, rows.dlse = dlse;
  rows.of = of, rows.lsef = lsef, rows.deltaf = deltaf, rows.dqf = dq;
  rows.gp = &gp, rows.dbuff = dbuf;
  job_init_cols(&cols, p, KIND_LOWP_BWD_COLS);
  cols.dtype = dtype;
  cols.qf = qf, cols.kf = kf, cols.vf = vf, cols.doutf = dof;
  cols.lsef = lsef, cols.deltaf = deltaf, cols.dkf = dk, cols.dvf = dv;
  cols.gp = &gp;
  st = run_backward(p, &rows, &cols);
fail:
  grad_prog_free(&gp);
  free(qf), free(kf), free(vf), free(dof);
  free(of), free(lsef), free(deltaf);
  return st;
}

int64_t fjg_reference_uncertain_kv_rows(const fjg_ref_problem *p,
                                        const uint8_t *q_rows,
                                        uint8_t *kv_rows) {
  ref_job j;
  fjg_evaluator e;
  if (!problem_valid(p) || !q_rows || !kv_rows) return -1;
  memset(kv_rows, 0, (size_t)p->B * p->Hkv * p->Lk);
  if (!p->g) return 0;
  job_init(&j, p, KIND_UNCERTAIN, 1);
  if (fjg_evaluator_init(&e, p->g, &j.env) != FJ_OK) return -1;
  int64_t count = 0;
  for (int b = 0; b < p->B; b++)
    for (int h = 0; h < p->Hq; h++)
      for (int i = 0; i < p->Lq; i++) {
        if (!q_rows[((size_t)b * p->Hq + h) * p->Lq + i]) continue;
        uint8_t *row = kv_rows + ((size_t)b * p->Hkv + h / j.group) * p->Lk;
        for (int c = 0; c < p->Lk; c++) {
          if (row[c] || fjg_eval_mask3(&e, b, h, i, c) == FJG_MASKED) continue;
          row[c] = 1;
          count++;
        }
      }
  fjg_evaluator_free(&e);
  return count;
}

int fjg_reference_zero_grad_rows(const fjg_ref_problem *p, uint8_t *q_rows,
                                 uint8_t *kv_rows) {
  ref_job j;
  fjg_evaluator e;
  if (!problem_valid(p) || !q_rows || !kv_rows) return -1;
  const size_t nq = (size_t)p->B * p->Hq * p->Lq, nk = (size_t)p->B * p->Hkv * p->Lk;
  memset(q_rows, 1, nq);
  memset(kv_rows, 1, nk);
  if (!p->g || fjg_mask_root(p->g) < 0) {
    memset(q_rows, 0, nq);
    memset(kv_rows, 0, nk);
    return 0;
  }
  job_init(&j, p, KIND_UNCERTAIN, 1);
  if (fjg_evaluator_init(&e, p->g, &j.env) != FJ_OK) return -1;
  for (int b = 0; b < p->B; b++)
    for (int h = 0; h < p->Hq; h++)
      for (int i = 0; i < p->Lq; i++) {
        uint8_t *qz = q_rows + ((size_t)b * p->Hq + h) * p->Lq + i;
        uint8_t *kz = kv_rows + ((size_t)b * p->Hkv + h / j.group) * p->Lk;
        for (int c = 0; c < p->Lk; c++)
          if (fjg_eval_mask3(&e, b, h, i, c) != FJG_MASKED) *qz = 0, kz[c] = 0;
      }
  fjg_evaluator_free(&e);
  return 0;
}

/* ---- the comparison rule ---- */

/* Which elements must be exactly 0 in out. */
typedef enum {
  ZERO_WHERE_REF_AND_LOWP, /* the forward's outputs */
  ZERO_IN_ROWS,            /* gradients: the rows given (NULL: none) */
} zero_rule;

static int check_rows(const double *ref, const float *lowp, const float *out,
                      size_t n, size_t row_len, const uint8_t *skip_rows,
                      zero_rule rule, const uint8_t *zero_rows, double factor,
                      double floor, fjg_check_report *rep);

int fjg_ref_check(const double *ref, const float *lowp, const float *out,
                  size_t n, double floor, fjg_check_report *rep) {
  return check_rows(ref, lowp, out, n, 1, NULL, ZERO_WHERE_REF_AND_LOWP, NULL,
                    FJG_CHECK_FACTOR, floor, rep);
}

int fjg_ref_check_rows(const double *ref, const float *lowp, const float *out,
                       size_t n, size_t row_len, const uint8_t *skip_rows,
                       double floor, fjg_check_report *rep) {
  return check_rows(ref, lowp, out, n, row_len, skip_rows, ZERO_WHERE_REF_AND_LOWP, NULL,
                    FJG_CHECK_FACTOR,
                    floor, rep);
}

int fjg_ref_check_grad(const double *ref, const float *lowp, const float *out,
                       size_t n, size_t row_len, const uint8_t *skip_rows,
                       const uint8_t *zero_rows, double floor, fjg_check_report *rep) {
  return check_rows(ref, lowp, out, n, row_len, skip_rows, ZERO_IN_ROWS, zero_rows,
                    FJG_CHECK_GRAD_FACTOR, floor, rep);
}

static int check_rows(const double *ref, const float *lowp, const float *out,
                      size_t n, size_t row_len, const uint8_t *skip_rows,
                      zero_rule rule, const uint8_t *zero_rows, double factor,
                      double floor, fjg_check_report *rep) {
  fjg_check_report r;
  double e2 = 0, e2l = 0, r2 = 0;
  memset(&r, 0, sizeof r);
  r.n = n;
  if (row_len < 1) row_len = 1;
  for (size_t i = 0; i < n; i++) {
    if (skip_rows && skip_rows[i / row_len]) {
      r.skipped++;
      continue;
    }
    double x = ref[i], y = out[i], z = lowp[i];
    if (x == -INFINITY) {
      if (y != -INFINITY) r.inf_mismatch++;
      continue;
    }
    if (!isfinite(x) || !isfinite(y)) { /* NaN never passes */
      r.nonfinite++;
      continue;
    }
    const int must_be_zero = rule == ZERO_WHERE_REF_AND_LOWP
                                 ? x == 0 && z == 0
                                 : zero_rows && zero_rows[i / row_len];
    if (must_be_zero && y != 0) r.zero_mismatch++;
    double e = fabs(y - x), el = isfinite(z) ? fabs(z - x) : 0;
    if (e > r.max_err) r.max_err = e, r.worst = i;
    if (el > r.max_err_lowp) r.max_err_lowp = el;
    e2 += e * e, e2l += el * el, r2 += x * x;
  }
  r.tolerance = factor * r.max_err_lowp + floor;
  r.rel_l2 = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
  r.rel_l2_lowp = r2 > 0 ? sqrt(e2l / r2) : sqrt(e2l);
  r.pass = r.max_err <= r.tolerance && r.nonfinite == 0 &&
           r.inf_mismatch == 0 && r.zero_mismatch == 0;
  if (rep) *rep = r;
  return r.pass;
}
