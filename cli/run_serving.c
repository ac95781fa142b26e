/*
 * cli/run_serving.c: the host side of `flexjit run`'s serving layouts (see
 * cli/run_serving.h): lengths, row offsets, page pools and block table, the
 * per-sequence reference and counts.
 */
#include "cli/run_serving.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/random.h"
#include "gen/eval.h"
#include "gen/reference.h"

int cli_seqs_wanted(const run_config *c) {
  return c->page_size || c->seqlens_k || c->varlen_n;
}

int cli_graph_reads_batch(const fjg_graph *g) {
  const int n = g ? fjg_num_nodes(g) : 0;
  const int roots[2] = {g ? fjg_mask_root(g) : -1, g ? fjg_score_root(g) : -1};
  uint8_t *live = calloc((size_t)n + 1, 1);
  int reads = 0;
  if (!live) return 1; /* cannot tell: refuse rather than guess */
  for (int r = 0; r < 2; r++)
    if (roots[r] >= 0) live[roots[r]] = 1;
  /* Operands come before their node (the graph is built in order), so one
   * sweep down from the roots finds every node they reach. */
  for (int i = n - 1; i >= 0 && !reads; i--) {
    if (!live[i]) continue;
    const fjg_node *x = fjg_node_at(g, i);
    const int ar = fjg_op_arity((fjg_op)x->op), ops[3] = {x->a, x->b, x->c};
    reads = (x->op == FJG_OP_INPUT && x->arg == FJG_IN_B) ||
            (x->op == FJG_OP_SIZE && x->arg == FJG_SZ_B);
    for (int k = 0; k < ar && k < 3; k++)
      if (ops[k] >= 0 && ops[k] < n) live[ops[k]] = 1;
  }
  free(live);
  return reads;
}

/* n lengths >= 1 summing to total, drawn from st: each gets 1 plus a share
 * of the rest proportional to a uniform weight in (0, 1], the remainder
 * one token each to the first ones; drawn again while all are equal (only
 * possible when n divides total, and certain when total == n). */
static int random_lengths(int32_t *len, int n, int64_t total, uint64_t *st) {
  double *w = malloc(sizeof(double) * (size_t)n);
  if (!w) return -1;
  for (int attempt = 0;; attempt++) {
    double sum = 0;
    int64_t left = total - n;
    for (int i = 0; i < n; i++) {
      w[i] = ((cli_splitmix64(st) >> 11) + 1) * 0x1p-53;
      sum += w[i];
    }
    int64_t given = 0;
    for (int i = 0; i < n; i++) {
      int64_t e = (int64_t)((double)left * (w[i] / sum));
      if (e > left - given) e = left - given;
      len[i] = (int32_t)(1 + e);
      given += e;
    }
    for (int i = 0; given < left; i = (i + 1) % n) len[i]++, given++;
    int equal = 1;
    for (int i = 1; i < n && equal; i++) equal = len[i] == len[0];
    if (!equal || n == 1 || total == n || attempt == 100) break;
  }
  free(w);
  return 0;
}

int cli_seqs_build(cli_seqs *L, const run_config *c, char *err, size_t errlen) {
  memset(L, 0, sizeof *L);
  L->varlen = c->varlen_n > 0;
  L->n = L->varlen ? c->varlen_n : c->B;
  L->per_seq_k = c->page_size || c->seqlens_k;
  size_t n = (size_t)L->n;
  L->lq = malloc(4 * n), L->lk = malloc(4 * n);
  L->cu_q = malloc(4 * (n + 1)), L->cu_k = malloc(4 * (n + 1));
  if (!L->lq || !L->lk || !L->cu_q || !L->cu_k) goto oom;
  uint64_t st = c->seed * 0xd1342543de82ef95ull + 0x5e9;
  if (L->varlen) {
    if (c->varlen_lens.data)
      memcpy(L->lq, c->varlen_lens.data, 4 * n);
    else if (random_lengths(L->lq, L->n, (int64_t)c->B * c->Lq, &st) != 0)
      goto oom;
    for (int b = 0; b < L->n; b++) L->lk[b] = L->lq[b] + (c->Lk - c->Lq);
  } else {
    for (int b = 0; b < L->n; b++) {
      L->lq[b] = c->Lq;
      L->lk[b] = c->seqlens_k > 0 ? c->seqlens_k : c->Lk;
      if (c->seqlens_k == CLI_SEQLENS_RANDOM)
        L->lk[b] = (int32_t)(1 + cli_splitmix64(&st) % (uint64_t)c->Lk);
    }
  }
  L->cu_q[0] = L->cu_k[0] = 0;
  for (int b = 0; b < L->n; b++) {
    /* Contiguous layouts keep every sequence Lq x Lk rows apart. */
    L->cu_q[b + 1] = L->cu_q[b] + (L->varlen ? L->lq[b] : c->Lq);
    L->cu_k[b + 1] = L->cu_k[b] + (L->varlen ? L->lk[b] : c->Lk);
    if (L->lq[b] > L->max_q) L->max_q = L->lq[b];
    if (L->lk[b] > L->max_k) L->max_k = L->lk[b];
  }
  L->total_q = L->cu_q[L->n], L->total_k = L->cu_k[L->n];
  if (!c->page_size) return 0;

  /* Pages: ceil(lk / page_size) for each sequence, a shuffle of all. */
  const int ps = c->page_size;
  int64_t pages = 0;
  L->page_size = ps;
  /* The block table's width: what the longest sequence may hold. */
  L->max_pages = ((L->varlen ? L->max_k : c->Lk) + ps - 1) / ps;
  for (int b = 0; b < L->n; b++) pages += (L->lk[b] + ps - 1) / ps;
  if (pages > INT32_MAX) {
    snprintf(err, errlen, "--page-size %d: %lld pages do not fit the int32 "
             "block table", ps, (long long)pages);
    return -1;
  }
  L->num_pages = (int)pages;
  int32_t *perm = malloc(4 * (size_t)(pages ? pages : 1));
  L->block_table = calloc((size_t)L->n * L->max_pages + 1, 4);
  if (!perm || !L->block_table) {
    free(perm);
    goto oom;
  }
  for (int64_t i = 0; i < pages; i++) perm[i] = (int32_t)i;
  for (int64_t i = pages - 1; i > 0; i--) {
    int64_t j = (int64_t)(cli_splitmix64(&st) % (uint64_t)(i + 1));
    int32_t t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  int64_t next = 0;
  for (int b = 0; b < L->n; b++)
    for (int j = 0; j < (L->lk[b] + ps - 1) / ps; j++)
      L->block_table[(size_t)b * L->max_pages + j] = perm[next++];
  free(perm);
  return 0;
oom:
  snprintf(err, errlen, "out of host memory for the sequence layout");
  return -1;
}

void cli_seqs_free(cli_seqs *L) {
  free(L->lq), free(L->lk), free(L->cu_q), free(L->cu_k);
  free(L->block_table);
  memset(L, 0, sizeof *L);
}

size_t cli_seqs_q_at(const cli_seqs *L, const run_config *c, int b, int h, int i) {
  if (L->varlen) return (((size_t)L->cu_q[b] + i) * c->Hq + h) * c->D;
  return (((size_t)b * c->Hq + h) * c->Lq + i) * c->D;
}

size_t cli_seqs_k_at(const cli_seqs *L, const run_config *c, int b, int hk, int j) {
  if (L->varlen) return (((size_t)L->cu_k[b] + j) * c->Hkv + hk) * c->D;
  return (((size_t)b * c->Hkv + hk) * c->Lk + j) * c->D;
}

size_t cli_seqs_lse_at(const cli_seqs *L, const run_config *c, int b, int h, int i) {
  if (L->varlen) return (size_t)h * L->total_q + L->cu_q[b] + i;
  return ((size_t)b * c->Hq + h) * c->Lq + i;
}

size_t cli_seqs_nq(const cli_seqs *L, const run_config *c) {
  return (size_t)L->total_q * c->Hq * c->D;
}

size_t cli_seqs_nk(const cli_seqs *L, const run_config *c) {
  return (size_t)L->total_k * c->Hkv * c->D;
}

size_t cli_seqs_nl(const cli_seqs *L, const run_config *c) {
  return (size_t)L->total_q * c->Hq;
}

size_t cli_seqs_pool_elems(const cli_seqs *L, const run_config *c) {
  return (size_t)L->num_pages * L->page_size * c->Hkv * c->D;
}

void cli_seqs_fill_pool(const cli_seqs *L, const run_config *c, const float *x,
                        float *pool) {
  const size_t D = (size_t)c->D, ps = (size_t)L->page_size;
  memset(pool, 0, sizeof(float) * cli_seqs_pool_elems(L, c));
  for (int b = 0; b < L->n; b++)
    for (int j = 0; j < L->lk[b]; j++) {
      size_t page = (size_t)L->block_table[(size_t)b * L->max_pages + j / ps];
      for (int hk = 0; hk < c->Hkv; hk++) {
        float *dst = pool + ((page * ps + (size_t)j % ps) * c->Hkv + hk) * D;
        memcpy(dst, x + cli_seqs_k_at(L, c, b, hk, j), sizeof(float) * D);
      }
    }
}

/* Sequence b's problem: one sequence at its own lengths. */
static fjg_ref_problem seq_problem(const cli_seqs *L, const run_config *c,
                                   const fjg_graph *g, const fjg_env *env,
                                   double scale, int b) {
  fjg_ref_problem p = {1, c->Hq, c->Hkv, L->lq[b], L->lk[b], c->D,
                       scale, g, env, 0, 0};
  return p;
}

/* Sequence b's rows of the host tensor x (is_q: q's layout, else k's) as
 * float64 [1, H, len, D], its own problem's layout. */
static void gather_seq(const cli_seqs *L, const run_config *c, int b, int is_q,
                       const float *x, double *out) {
  const int H = is_q ? c->Hq : c->Hkv, len = is_q ? L->lq[b] : L->lk[b];
  const size_t D = (size_t)c->D;
  for (int h = 0; h < H; h++)
    for (int i = 0; i < len; i++) {
      const float *src = x + (is_q ? cli_seqs_q_at(L, c, b, h, i) : cli_seqs_k_at(L, c, b, h, i));
      double *dst = out + ((size_t)h * len + i) * D;
      for (size_t d = 0; d < D; d++) dst[d] = src[d];
    }
}

int cli_seqs_reference(const cli_seqs *L, const run_config *c,
                       const fjg_graph *g, const fjg_env *env, double scale,
                       const float *q, const float *k, const float *v,
                       double *ro, float *lo, double *rl, float *ll,
                       uint8_t *skip_o, uint8_t *skip_l, char *err,
                       size_t errlen) {
  const size_t D = (size_t)c->D;
  const size_t nq1 = (size_t)c->Hq * L->max_q * D, nk1 = (size_t)c->Hkv * L->max_k * D;
  const size_t nl1 = (size_t)c->Hq * L->max_q;
  double *q1 = malloc(8 * nq1 + 8), *k1 = malloc(8 * nk1 + 8), *v1 = malloc(8 * nk1 + 8);
  double *ro1 = malloc(8 * nq1 + 8), *rl1 = malloc(8 * nl1 + 8);
  float *lo1 = malloc(4 * nq1 + 4), *ll1 = malloc(4 * nl1 + 4);
  uint8_t *sk1 = malloc(nl1 + 1);
  int rc = -1;
  if (!q1 || !k1 || !v1 || !ro1 || !rl1 || !lo1 || !ll1 || !sk1) {
    snprintf(err, errlen, "out of host memory for the reference");
    goto fail;
  }
  for (int b = 0; b < L->n; b++) {
    const int lq = L->lq[b];
    gather_seq(L, c, b, 1, q, q1);
    gather_seq(L, c, b, 0, k, k1);
    gather_seq(L, c, b, 0, v, v1);
    fjg_ref_problem p = seq_problem(L, c, g, env, scale, b);
    if (fjg_reference_dense(&p, q1, k1, v1, ro1, rl1) != FJ_OK ||
        fjg_reference_lowp(&p, c->dtype, q1, k1, v1, lo1, ll1) != FJ_OK ||
        fjg_reference_uncertain_rows(&p, sk1) < 0) {
      snprintf(err, errlen, "the CPU reference failed on sequence %d "
               "(out of memory?)", b);
      goto fail;
    }
    for (int h = 0; h < c->Hq; h++)
      for (int i = 0; i < lq; i++) {
        size_t r1 = (size_t)h * lq + i, at = cli_seqs_q_at(L, c, b, h, i);
        size_t l = cli_seqs_lse_at(L, c, b, h, i);
        memcpy(ro + at, ro1 + r1 * D, 8 * D);
        memcpy(lo + at, lo1 + r1 * D, 4 * D);
        rl[l] = rl1[r1], ll[l] = ll1[r1];
        skip_o[at / D] = skip_l[l] = sk1[r1];
      }
  }
  rc = 0;
fail:
  free(q1), free(k1), free(v1), free(ro1), free(rl1), free(lo1), free(ll1);
  free(sk1);
  return rc;
}

/* Sequence b's gradients [1, H, len, D] (float64 r1 and float l1) into
 * the host layout of q (is_q) or k, their zero-row marks z1 into z (when
 * not NULL: dv's are dk's). */
static void scatter_grad(const cli_seqs *L, const run_config *c, int b, int is_q,
                         const double *r1, const float *l1, const uint8_t *z1,
                         double *r, float *l, uint8_t *z) {
  const int H = is_q ? c->Hq : c->Hkv, len = is_q ? L->lq[b] : L->lk[b];
  const size_t D = (size_t)c->D;
  for (int h = 0; h < H; h++)
    for (int i = 0; i < len; i++) {
      size_t at = is_q ? cli_seqs_q_at(L, c, b, h, i) : cli_seqs_k_at(L, c, b, h, i);
      size_t row = (size_t)h * len + i;
      memcpy(r + at, r1 + row * D, 8 * D);
      memcpy(l + at, l1 + row * D, 4 * D);
      if (z) z[at / D] = z1[row];
    }
}

int cli_seqs_backward_reference(const cli_seqs *L, const run_config *c,
                                const fjg_graph *g, const fjg_env *env,
                                double scale, const float *q, const float *k,
                                const float *v, const float *dout,
                                const cli_bwd_ref *out, char *err, size_t errlen) {
  const size_t D = (size_t)c->D;
  const size_t nq1 = (size_t)c->Hq * L->max_q * D, nk1 = (size_t)c->Hkv * L->max_k * D;
  const int nargs = g ? fjg_num_args(g) : 0;
  double *q1 = malloc(8 * nq1 + 8), *do1 = malloc(8 * nq1 + 8);
  double *k1 = malloc(8 * nk1 + 8), *v1 = malloc(8 * nk1 + 8);
  double *rq1 = malloc(8 * nq1 + 8), *rk1 = malloc(8 * nk1 + 8), *rv1 = malloc(8 * nk1 + 8);
  float *lq1 = malloc(4 * nq1 + 4), *lk1 = malloc(4 * nk1 + 4), *lv1 = malloc(4 * nk1 + 4);
  uint8_t *zq1 = malloc(nq1 / D + 1), *zk1 = malloc(nk1 / D + 1);
  /* Each sequence's buffer gradients, added into out->rg and out->lg. */
  double *rg1[FJG_MAX_ARGS] = {0};
  float *lg1[FJG_MAX_ARGS] = {0};
  int rc = -1, ok = q1 && do1 && k1 && v1 && rq1 && rk1 && rv1 && lq1 && lk1 && lv1 &&
                   zq1 && zk1;
  for (int a = 0; ok && a < nargs && a < FJG_MAX_ARGS; a++) {
    if (!out->rg || !out->rg[a] || !out->lg || !out->lg[a] || !fjg_arg_at(g, a)->trainable)
      continue;
    size_t n = (size_t)env->buffer_len[a];
    ok = (rg1[a] = malloc(8 * n + 8)) && (lg1[a] = malloc(4 * n + 4));
    if (ok) memset(out->rg[a], 0, 8 * n), memset(out->lg[a], 0, 4 * n);
  }
  if (!ok) {
    snprintf(err, errlen, "out of host memory for the backward's reference");
    goto fail;
  }
  for (int b = 0; b < L->n; b++) {
    gather_seq(L, c, b, 1, q, q1);
    gather_seq(L, c, b, 1, dout, do1);
    gather_seq(L, c, b, 0, k, k1);
    gather_seq(L, c, b, 0, v, v1);
    fjg_ref_problem p = seq_problem(L, c, g, env, scale, b);
    if (fjg_reference_backward(&p, q1, k1, v1, do1, NULL, NULL, NULL, rq1, rk1, rv1,
                               rg1) != FJ_OK ||
        fjg_reference_backward_lowp(&p, c->dtype, q1, k1, v1, do1, NULL, lq1, lk1, lv1,
                                    lg1) != FJ_OK ||
        fjg_reference_zero_grad_rows(&p, zq1, zk1) != 0) {
      snprintf(err, errlen, "the backward's CPU reference failed on sequence %d "
               "(out of memory?)", b);
      goto fail;
    }
    scatter_grad(L, c, b, 1, rq1, lq1, zq1, out->rq, out->lq, out->zq);
    scatter_grad(L, c, b, 0, rk1, lk1, zk1, out->rk, out->lk, out->zk);
    scatter_grad(L, c, b, 0, rv1, lv1, NULL, out->rv, out->lv, NULL);
    for (int a = 0; a < FJG_MAX_ARGS; a++)
      if (rg1[a])
        for (int64_t i = 0; i < env->buffer_len[a]; i++)
          out->rg[a][i] += rg1[a][i], out->lg[a][i] += lg1[a][i];
  }
  rc = 0;
fail:
  free(q1), free(do1), free(k1), free(v1), free(rq1), free(rk1), free(rv1);
  free(lq1), free(lk1), free(lv1), free(zq1), free(zk1);
  for (int a = 0; a < FJG_MAX_ARGS; a++) free(rg1[a]), free(lg1[a]);
  return rc;
}

int64_t cli_seqs_pairs(const cli_seqs *L, const run_config *c,
                       const fjg_graph *g, const fjg_env *env) {
  int64_t total = 0, last = -1;
  for (int b = 0; b < L->n; b++) {
    if (b == 0 || L->lq[b] != L->lq[b - 1] || L->lk[b] != L->lk[b - 1]) {
      fjg_ref_problem p = seq_problem(L, c, g, env, 0, b);
      if ((last = fjg_reference_count_allowed(&p)) < 0) return -1;
    }
    total += last;
  }
  return total;
}

int64_t cli_seqs_kv_read(const cli_seqs *L, const run_config *c,
                         const fjg_graph *g, const fjg_env *env) {
  int64_t total = 0;
  int root = g ? fjg_mask_root(g) : -1;
  if (root < 0) {
    for (int b = 0; b < L->n; b++) total += L->lk[b];
    return total;
  }
  const unsigned deps = fjg_input_deps(g, root);
  const int heads = deps & (1u << FJG_IN_H) ? c->Hq : 1;
  fjg_env e;
  if (env)
    e = *env;
  else
    memset(&e, 0, sizeof e);
  e.sizes[FJG_SZ_B] = L->n;
  e.sizes[FJG_SZ_HQ] = c->Hq;
  e.sizes[FJG_SZ_HKV] = c->Hkv;
  for (int b = 0; b < L->n; b++) {
    fjg_evaluator ev;
    e.sizes[FJG_SZ_LQ] = L->lq[b];
    e.sizes[FJG_SZ_LK] = L->lk[b];
    if (fjg_evaluator_init(&ev, g, &e) != FJ_OK) return -1;
    /* The batch index each sequence has in the launch; specs that read it
     * are refused in the serving layouts, so this is b for plain runs. */
    for (int j = 0; j < L->lk[b]; j++) {
      int seen = 0;
      /* Later queries first: with bottom-right alignment the last one
       * sees every key. */
      for (int h = 0; h < heads && !seen; h++)
        for (int i = L->lq[b] - 1; i >= 0 && !seen; i--)
          seen = fjg_eval_mask_guess(&ev, b, h, i, j, NULL);
      total += seen;
    }
    fjg_evaluator_free(&ev);
  }
  return total;
}
