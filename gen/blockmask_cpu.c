/*
 * gen/blockmask_cpu.c: the block mask of a graph on the CPU (see
 * blockmask_cpu.h). Mirrors the GPU builder step for step: classify every
 * block (interval analysis first, elements when it says PARTIAL), then
 * compact each row and each column of the class matrix into index lists.
 */
#include "gen/blockmask_cpu.h"

#include <stdlib.h>
#include <string.h>

#include "gen/eval.h"
#include "gen/interval.h"

void fjg_block_mask_counts(int B, int H, int nq, int nkv, size_t counts[8]) {
  size_t bh = (size_t)B * (size_t)H;
  size_t tiles = bh * (size_t)nq * (size_t)nkv;
  counts[0] = counts[2] = bh * (size_t)nq;
  counts[4] = counts[6] = bh * (size_t)nkv;
  counts[1] = counts[3] = counts[5] = counts[7] = tiles;
}

void fjg_block_mask_arrays(const fjg_block_mask_host *m, int32_t *arrays[8]) {
  arrays[0] = m->kv_num, arrays[1] = m->kv_idx;
  arrays[2] = m->full_kv_num, arrays[3] = m->full_kv_idx;
  arrays[4] = m->q_num, arrays[5] = m->q_idx;
  arrays[6] = m->full_q_num, arrays[7] = m->full_q_idx;
}

void fjg_block_mask_host_free(fjg_block_mask_host *m) {
  if (!m) return;
  int32_t *arrays[8];
  fjg_block_mask_arrays(m, arrays);
  for (int i = 0; i < 8; i++) free(arrays[i]);
  free(m->cls);
  memset(m, 0, sizeof *m);
}

/* Pairs of a rectangle by outcome (FJG_MASKED, FJG_ALLOWED, FJG_UNCERTAIN). */
static void count_pairs(fjg_evaluator *e, int b, int h, int q0, int q1,
                        int kv0, int kv1, int64_t n[3]) {
  for (int q = q0; q <= q1; q++)
    for (int kv = kv0; kv <= kv1; kv++) n[fjg_eval_mask3(e, b, h, q, kv)]++;
}

/* FULL when every pair is allowed, EMPTY when every one is masked: an
 * uncertain pair makes a block PARTIAL (the kernel decides it). */
static int class_of(const int64_t n[3]) {
  if (n[FJG_UNCERTAIN] || (n[FJG_ALLOWED] && n[FJG_MASKED]))
    return FJG_TILE_PARTIAL;
  return n[FJG_ALLOWED] ? FJG_TILE_FULL : FJG_TILE_EMPTY;
}

int fjg_block_class_brute(const fjg_graph *g, const fjg_env *env, int b,
                          int h, int q0, int q1, int kv0, int kv1) {
  fjg_evaluator e;
  int64_t n[3] = {0, 0, 0};
  if (fjg_evaluator_init(&e, g, env) != FJ_OK) return FJG_TILE_PARTIAL;
  count_pairs(&e, b, h, q0, q1, kv0, kv1, n);
  fjg_evaluator_free(&e);
  return class_of(n);
}

/* The exact class of a block: the interval classifier when it decides,
 * else elements until both a true and a false, or an uncertain one, have
 * been seen. */
static int block_class(fjg_evaluator *e, int b, int h, int q0, int q1,
                       int kv0, int kv1) {
  int cls = fjg_tile_class_cpu(e->g, &e->env, b, h, q0, q1, kv0, kv1);
  if (cls != FJG_TILE_PARTIAL) return cls;
  int64_t n[3] = {0, 0, 0};
  for (int q = q0; q <= q1; q++) {
    count_pairs(e, b, h, q, q, kv0, kv1, n);
    if (class_of(n) == FJG_TILE_PARTIAL) return FJG_TILE_PARTIAL;
  }
  return class_of(n);
}

/* Writes the PARTIAL and FULL entries of one line of the class matrix (n
 * classes `stride` apart) as ascending lists padded with 0. */
static void compact_line(const uint8_t *cls, int n, size_t stride,
                         int32_t *num, int32_t *idx, int32_t *full_num,
                         int32_t *full_idx) {
  int np = 0, nf = 0;
  for (int i = 0; i < n; i++) {
    uint8_t c = cls[(size_t)i * stride];
    if (c == FJG_TILE_PARTIAL) idx[np++] = i;
    if (c == FJG_TILE_FULL) full_idx[nf++] = i;
  }
  memset(idx + np, 0, (size_t)(n - np) * sizeof *idx);
  memset(full_idx + nf, 0, (size_t)(n - nf) * sizeof *full_idx);
  *num = np;
  *full_num = nf;
}

static int alloc_arrays(fjg_block_mask_host *m) {
  size_t counts[8];
  int32_t **arrays[8] = {&m->kv_num, &m->kv_idx, &m->full_kv_num,
                         &m->full_kv_idx, &m->q_num, &m->q_idx,
                         &m->full_q_num, &m->full_q_idx};
  fjg_block_mask_counts(m->B, m->H, m->nq, m->nkv, counts);
  for (int i = 0; i < 8; i++)
    if (!(*arrays[i] = calloc(counts[i] ? counts[i] : 1, sizeof(int32_t))))
      return 0;
  m->cls = calloc(counts[1] ? counts[1] : 1, 1);
  return m->cls != NULL;
}

static void classify_all(fjg_evaluator *e, fjg_block_mask_host *m) {
  for (int b = 0; b < m->B; b++)
    for (int h = 0; h < m->H; h++)
      for (int i = 0; i < m->nq; i++)
        for (int j = 0; j < m->nkv; j++) {
          int q0 = i * m->block_q, kv0 = j * m->block_kv;
          int q1 = q0 + m->block_q < m->q_len ? q0 + m->block_q - 1
                                              : m->q_len - 1;
          int kv1 = kv0 + m->block_kv < m->kv_len ? kv0 + m->block_kv - 1
                                                  : m->kv_len - 1;
          size_t t = (((size_t)b * m->H + h) * m->nq + i) * m->nkv + j;
          m->cls[t] = (uint8_t)block_class(e, b, h, q0, q1, kv0, kv1);
        }
}

static void compact_all(fjg_block_mask_host *m) {
  size_t nq = (size_t)m->nq, nkv = (size_t)m->nkv;
  for (size_t bh = 0; bh < (size_t)m->B * m->H; bh++) {
    const uint8_t *c = m->cls + bh * nq * nkv;
    for (size_t i = 0; i < nq; i++) {
      size_t r = bh * nq + i;
      compact_line(c + i * nkv, m->nkv, 1, &m->kv_num[r], m->kv_idx + r * nkv,
                   &m->full_kv_num[r], m->full_kv_idx + r * nkv);
    }
    for (size_t j = 0; j < nkv; j++) {
      size_t r = bh * nkv + j;
      compact_line(c + j, m->nq, nkv, &m->q_num[r], m->q_idx + r * nq,
                   &m->full_q_num[r], m->full_q_idx + r * nq);
    }
  }
}

fj_status fjg_block_mask_cpu_build(const fjg_graph *g, const fjg_env *env,
                                   int B, int H, int q_len, int kv_len,
                                   int block_q, int block_kv,
                                   fjg_block_mask_host *out) {
  memset(out, 0, sizeof *out);
  if (!g || B < 1 || H < 1 || q_len < 1 || kv_len < 1 || block_q < 1 ||
      block_kv < 1)
    return FJ_EINVAL;
  fjg_env local;
  memset(&local, 0, sizeof local);
  if (env) local = *env;
  local.sizes[FJG_SZ_B] = B;
  local.sizes[FJG_SZ_HQ] = H;
  local.sizes[FJG_SZ_HKV] = H;
  local.sizes[FJG_SZ_LQ] = q_len;
  local.sizes[FJG_SZ_LK] = kv_len;
  fjg_block_mask_host m = {B, H, q_len, kv_len, block_q, block_kv,
                           (q_len + block_q - 1) / block_q,
                           (kv_len + block_kv - 1) / block_kv,
                           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                           NULL};
  fjg_evaluator e;
  if (!alloc_arrays(&m) || fjg_evaluator_init(&e, g, &local) != FJ_OK) {
    fjg_block_mask_host_free(&m);
    return FJ_ENOMEM;
  }
  classify_all(&e, &m);
  fjg_evaluator_free(&e);
  compact_all(&m);
  *out = m;
  return FJ_OK;
}

/* ---- census ---- */

/* Tiles of at most this many pairs are evaluated element by element; larger
 * ones the classifier did not decide are halved. */
enum { LEAF_PAIRS = 64 };

typedef struct census {
  fjg_evaluator e;
  int b, h;
  uint64_t budget, tile_cost;
  int over;
  int64_t n[3];
} census;

static uint64_t spent(const census *c) { return c->e.work; }

/* Counts the pairs of [q0, q1] x [kv0, kv1] by outcome into c->n. */
static void census_tile(census *c, int q0, int q1, int kv0, int kv1) {
  if (c->over) return;
  int64_t rows = (int64_t)q1 - q0 + 1, cols = (int64_t)kv1 - kv0 + 1;
  c->e.work += c->tile_cost;
  if (spent(c) > c->budget) {
    c->over = 1;
    return;
  }
  int cls = fjg_tile_class_cpu(c->e.g, &c->e.env, c->b, c->h, q0, q1, kv0,
                               kv1);
  if (cls == FJG_TILE_FULL) c->n[FJG_ALLOWED] += rows * cols;
  if (cls == FJG_TILE_EMPTY) c->n[FJG_MASKED] += rows * cols;
  if (cls != FJG_TILE_PARTIAL) return;
  if (rows * cols <= LEAF_PAIRS) {
    uint64_t need = (uint64_t)(rows * cols) *
                    (uint64_t)fjg_eval_cost(&c->e, 0);
    if (spent(c) + need > c->budget) {
      c->over = 1;
      return;
    }
    count_pairs(&c->e, c->b, c->h, q0, q1, kv0, kv1, c->n);
    return;
  }
  if (rows >= cols) {
    int mid = q0 + (int)(rows / 2) - 1;
    census_tile(c, q0, mid, kv0, kv1);
    census_tile(c, mid + 1, q1, kv0, kv1);
  } else {
    int mid = kv0 + (int)(cols / 2) - 1;
    census_tile(c, q0, q1, kv0, mid);
    census_tile(c, q0, q1, mid + 1, kv1);
  }
}

fj_status fjg_mask_census(const fjg_graph *g, const fjg_env *env, int b,
                          int h, int q_len, int kv_len, int block_q,
                          int block_kv, uint64_t budget, uint8_t *cls,
                          fjg_census *out) {
  census c;
  memset(out, 0, sizeof *out);
  if (!g || q_len < 1 || kv_len < 1 || block_q < 1 || block_kv < 1)
    return FJ_EINVAL;
  memset(&c, 0, sizeof c);
  if (fjg_evaluator_init(&c.e, g, env) != FJ_OK) return FJ_ENOMEM;
  c.b = b, c.h = h, c.budget = budget;
  int count;
  fjg_reachable(g, 0, &count);
  /* A tile classification costs about three evaluations a node. */
  c.tile_cost = 3 * ((uint64_t)count + 1);
  int nq = (q_len - 1) / block_q + 1, nkv = (kv_len - 1) / block_kv + 1;
  for (int i = 0; i < nq && !c.over; i++)
    for (int j = 0; j < nkv && !c.over; j++) {
      int q0 = i * block_q, kv0 = j * block_kv;
      int q1 = q_len - q0 > block_q ? q0 + block_q - 1 : q_len - 1;
      int kv1 = kv_len - kv0 > block_kv ? kv0 + block_kv - 1 : kv_len - 1;
      int64_t before[3] = {c.n[0], c.n[1], c.n[2]};
      census_tile(&c, q0, q1, kv0, kv1);
      int64_t n[3] = {c.n[0] - before[0], c.n[1] - before[1],
                      c.n[2] - before[2]};
      if (cls)
        cls[(size_t)i * nkv + j] =
            (uint8_t)(class_of(n) | (n[FJG_UNCERTAIN] ? FJG_BLOCK_UNCERTAIN : 0));
    }
  out->allowed = c.n[FJG_ALLOWED];
  out->uncertain = c.n[FJG_UNCERTAIN];
  out->work = spent(&c);
  fjg_evaluator_free(&c.e);
  return c.over ? FJ_EUNSUPPORTED : FJ_OK;
}
