/*
 * gen/blockmask_cpu.c: the block mask of a graph on the CPU (see
 * blockmask_cpu.h). Mirrors the GPU builder step for step: classify every
 * block (interval analysis first, elements when it says PARTIAL), then
 * compact each row and each column of the class matrix into index lists.
 */
#include "gen/blockmask_cpu.h"

#include <stdlib.h>
#include <string.h>

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

int fjg_block_class_brute(const fjg_graph *g, const fjg_env *env, int b,
                          int h, int q0, int q1, int kv0, int kv1) {
  int seen_true = 0, seen_false = 0;
  for (int q = q0; q <= q1; q++)
    for (int kv = kv0; kv <= kv1; kv++) {
      if (fjg_eval_mask(g, env, b, h, q, kv))
        seen_true = 1;
      else
        seen_false = 1;
    }
  if (seen_true && seen_false) return FJG_TILE_PARTIAL;
  return seen_true ? FJG_TILE_FULL : FJG_TILE_EMPTY;
}

/* The exact class of a block: the interval classifier when it decides,
 * else elements until both a true and a false have been seen. */
static int block_class(const fjg_graph *g, const fjg_env *env, int b, int h,
                       int q0, int q1, int kv0, int kv1) {
  int cls = fjg_tile_class_cpu(g, env, b, h, q0, q1, kv0, kv1);
  if (cls != FJG_TILE_PARTIAL) return cls;
  int seen_true = 0, seen_false = 0;
  for (int q = q0; q <= q1; q++) {
    for (int kv = kv0; kv <= kv1; kv++) {
      if (fjg_eval_mask(g, env, b, h, q, kv))
        seen_true = 1;
      else
        seen_false = 1;
    }
    if (seen_true && seen_false) return FJG_TILE_PARTIAL;
  }
  return seen_true ? FJG_TILE_FULL : FJG_TILE_EMPTY;
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

static void classify_all(const fjg_graph *g, const fjg_env *env,
                         fjg_block_mask_host *m) {
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
          m->cls[t] = (uint8_t)block_class(g, env, b, h, q0, q1, kv0, kv1);
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
  if (!alloc_arrays(&m)) {
    fjg_block_mask_host_free(&m);
    return FJ_ENOMEM;
  }
  classify_all(g, &local, &m);
  compact_all(&m);
  *out = m;
  return FJ_OK;
}

int64_t fjg_block_mask_count_allowed(const fjg_graph *g, const fjg_env *env,
                                     const fjg_block_mask_host *m, int b,
                                     int h) {
  fjg_env local;
  memset(&local, 0, sizeof local);
  if (env) local = *env;
  local.sizes[FJG_SZ_B] = m->B;
  local.sizes[FJG_SZ_HQ] = m->H;
  local.sizes[FJG_SZ_HKV] = m->H;
  local.sizes[FJG_SZ_LQ] = m->q_len;
  local.sizes[FJG_SZ_LK] = m->kv_len;
  int64_t n = 0;
  for (int i = 0; i < m->nq; i++)
    for (int j = 0; j < m->nkv; j++) {
      int q0 = i * m->block_q, kv0 = j * m->block_kv;
      int q1 = q0 + m->block_q < m->q_len ? q0 + m->block_q : m->q_len;
      int kv1 = kv0 + m->block_kv < m->kv_len ? kv0 + m->block_kv : m->kv_len;
      uint8_t c = m->cls[(((size_t)b * m->H + h) * m->nq + i) * m->nkv + j];
      if (c == FJG_TILE_FULL) n += (int64_t)(q1 - q0) * (kv1 - kv0);
      if (c != FJG_TILE_PARTIAL) continue;
      for (int q = q0; q < q1; q++)
        for (int kv = kv0; kv < kv1; kv++)
          n += fjg_eval_mask(g, &local, b, h, q, kv);
    }
  return n;
}
