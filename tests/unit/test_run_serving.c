/*
 * tests/unit/test_run_serving.c: the host side of `flexjit run`'s serving
 * layouts (cli/run_serving.c, compiled into this test): random varlen
 * lengths, page pools and block tables, the per-sequence reference against
 * an independent naive computation (the forward's and the backward's),
 * and the counts behind --bench's TFLOP/s and TB/s.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/random.c"
#include "cli/run_serving.c"
#include "lua/spec.h"

static run_config config(int B, int Hq, int Hkv, int Lq, int Lk, int D) {
  run_config c;
  memset(&c, 0, sizeof c);
  c.B = B, c.Hq = Hq, c.Hkv = Hkv, c.Lq = Lq, c.Lk = Lk, c.D = D;
  c.dtype = FJ_DTYPE_BF16;
  return c;
}

static float *random_floats(size_t n, uint64_t seed) {
  float *x = malloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++)
    x[i] = (float)((int)(cli_splitmix64(&seed) % 2001) - 1000) / 500.0f;
  return x;
}

/* --varlen N: lengths >= 1, summing to B * Lq, not all equal, the same for
 * the same seed and different for another; kv = q + (Lk - Lq). */
static void test_varlen_lengths(void **state) {
  (void)state;
  char err[256];
  run_config c = config(2, 4, 2, 512, 600, 64);
  c.varlen_n = 64;
  cli_seqs a, b;
  assert_int_equal(cli_seqs_build(&a, &c, err, sizeof err), 0);
  assert_int_equal(a.n, 64);
  assert_true(a.varlen);
  int64_t sum = 0;
  int equal = 1;
  for (int i = 0; i < a.n; i++) {
    assert_true(a.lq[i] >= 1);
    assert_int_equal(a.lk[i], a.lq[i] + 88);
    assert_int_equal(a.cu_q[i + 1] - a.cu_q[i], a.lq[i]);
    assert_int_equal(a.cu_k[i + 1] - a.cu_k[i], a.lk[i]);
    equal &= a.lq[i] == a.lq[0];
    sum += a.lq[i];
  }
  assert_false(equal);
  assert_int_equal(sum, 1024);
  assert_int_equal(a.total_q, 1024);
  assert_int_equal(a.total_k, 1024 + 64 * 88);
  assert_int_equal(cli_seqs_build(&b, &c, err, sizeof err), 0);
  assert_memory_equal(a.lq, b.lq, 4 * 64);
  cli_seqs_free(&b);
  c.seed = 1;
  assert_int_equal(cli_seqs_build(&b, &c, err, sizeof err), 0);
  assert_true(memcmp(a.lq, b.lq, 4 * 64) != 0);
  cli_seqs_free(&a), cli_seqs_free(&b);
  /* N dividing the total evenly still gives unequal lengths; N == total
   * can only give ones. */
  c = config(1, 1, 1, 8, 8, 64);
  c.varlen_n = 2;
  for (uint64_t seed = 0; seed < 50; seed++) {
    c.seed = seed;
    assert_int_equal(cli_seqs_build(&a, &c, err, sizeof err), 0);
    assert_int_equal(a.lq[0] + a.lq[1], 8);
    assert_int_not_equal(a.lq[0], a.lq[1]);
    cli_seqs_free(&a);
  }
  c.varlen_n = 8;
  assert_int_equal(cli_seqs_build(&a, &c, err, sizeof err), 0);
  for (int i = 0; i < 8; i++) assert_int_equal(a.lq[i], 1);
  cli_seqs_free(&a);
}

/* --page-size: every kv position of every sequence is in the pool where the
 * block table says, the pages are a permutation, and rows past a
 * sequence's length are 0. Gathering through the table gives back the
 * logical K. */
static void test_pages(void **state) {
  (void)state;
  char err[256];
  run_config c = config(3, 4, 2, 1, 100, 8);
  c.page_size = 16;
  c.seqlens_k = CLI_SEQLENS_RANDOM;
  c.seed = 5;
  cli_seqs L;
  assert_int_equal(cli_seqs_build(&L, &c, err, sizeof err), 0);
  assert_true(L.per_seq_k);
  assert_int_equal(L.max_pages, 7);
  int pages = 0;
  for (int b = 0; b < 3; b++) {
    assert_true(L.lk[b] >= 1 && L.lk[b] <= 100);
    pages += (L.lk[b] + 15) / 16;
  }
  assert_int_equal(L.num_pages, pages);
  int *seen = calloc((size_t)pages, sizeof(int)), shuffled = 0, next = 0;
  for (int b = 0; b < 3; b++)
    for (int j = 0; j < L.max_pages; j++) {
      int32_t pg = L.block_table[b * L.max_pages + j];
      if (j >= (L.lk[b] + 15) / 16) {
        assert_int_equal(pg, 0);
        continue;
      }
      assert_true(pg >= 0 && pg < pages);
      seen[pg]++;
      shuffled |= pg != next++;
    }
  for (int i = 0; i < pages; i++) assert_int_equal(seen[i], 1);
  assert_true(shuffled);
  free(seen);

  size_t nk = cli_seqs_nk(&L, &c);
  assert_int_equal(nk, (size_t)3 * 2 * 100 * 8);
  float *k = random_floats(nk, 9);
  float *pool = malloc(sizeof(float) * cli_seqs_pool_elems(&L, &c));
  cli_seqs_fill_pool(&L, &c, k, pool);
  size_t filled = 0;
  for (int b = 0; b < 3; b++)
    for (int j = 0; j < L.lk[b]; j++)
      for (int hk = 0; hk < 2; hk++) {
        /* [num_pages, page_size, Hkv, D], the logical k [B, Hkv, Lk, D]. */
        int pg = L.block_table[b * L.max_pages + j / 16];
        const float *row = pool + (((size_t)pg * 16 + j % 16) * 2 + hk) * 8;
        assert_memory_equal(row, k + (((size_t)b * 2 + hk) * 100 + j) * 8, 32);
        filled++;
      }
  size_t zero = 0, elems = cli_seqs_pool_elems(&L, &c);
  for (size_t i = 0; i < elems; i++) zero += pool[i] == 0.0f;
  assert_true(zero >= elems - filled * 8);
  free(k), free(pool);
  cli_seqs_free(&L);
}

/* Attention of one (b, h, i) row done naively: q row, the sequence's k and
 * v rows (stride between kv positions), n keys; scale 1/sqrt(D). */
static void naive_row(const float *q, const float *k, const float *v,
                      size_t stride, int n, int D, double *o, double *lse) {
  double m = -INFINITY, l = 0, *s = malloc(sizeof(double) * (size_t)n);
  for (int j = 0; j < n; j++) {
    s[j] = 0;
    for (int d = 0; d < D; d++) s[j] += (double)q[d] * k[j * stride + d];
    s[j] /= sqrt((double)D);
    if (s[j] > m) m = s[j];
  }
  for (int d = 0; d < D; d++) o[d] = 0;
  for (int j = 0; j < n; j++) {
    double p = exp(s[j] - m);
    l += p;
    for (int d = 0; d < D; d++) o[d] += p * v[j * stride + d];
  }
  for (int d = 0; d < D; d++) o[d] /= l;
  *lse = m + log(l);
  free(s);
}

/* The per-sequence reference (full attention, GQA) against naive_row with
 * the layouts written out here: varlen packed [total, H, D] with lse
 * [Hq, total], and contiguous BHSD with random seqlens_k. */
static void test_reference_per_sequence(void **state) {
  (void)state;
  char err[256];
  for (int varlen = 0; varlen < 2; varlen++) {
    const int Hq = 4, Hkv = 2, D = 16;
    run_config c = config(2, Hq, Hkv, 24, varlen ? 30 : 40, D);
    if (varlen)
      c.varlen_n = 5;
    else
      c.seqlens_k = CLI_SEQLENS_RANDOM;
    cli_seqs L;
    assert_int_equal(cli_seqs_build(&L, &c, err, sizeof err), 0);
    size_t nq = cli_seqs_nq(&L, &c), nk = cli_seqs_nk(&L, &c), nl = cli_seqs_nl(&L, &c);
    float *q = random_floats(nq, 1), *k = random_floats(nk, 2), *v = random_floats(nk, 3);
    double *ro = malloc(8 * nq), *rl = malloc(8 * nl);
    float *lo = malloc(4 * nq), *ll = malloc(4 * nl);
    uint8_t *so = calloc(nl, 1), *sl = calloc(nl, 1);
    assert_int_equal(cli_seqs_reference(&L, &c, NULL, NULL, 0, q, k, v, ro, lo, rl,
                                        ll, so, sl, err, sizeof err),
                     0);
    double o[16], lse, worst = 0, worst_lowp = 0;
    int q0 = 0, k0 = 0;
    for (int b = 0; b < L.n; b++) {
      for (int h = 0; h < Hq; h++)
        for (int i = 0; i < L.lq[b]; i++) {
          size_t qa, la, ka;
          if (varlen) {
            qa = ((size_t)(q0 + i) * Hq + h) * D;
            la = (size_t)h * L.total_q + q0 + i;
            ka = ((size_t)k0 * Hkv + h / 2) * D;
          } else {
            qa = (((size_t)b * Hq + h) * 24 + i) * D;
            la = ((size_t)b * Hq + h) * 24 + i;
            ka = (((size_t)b * Hkv + h / 2) * 40) * D;
          }
          naive_row(q + qa, k + ka, v + ka, varlen ? (size_t)Hkv * D : (size_t)D,
                    L.lk[b], D, o, &lse);
          for (int d = 0; d < D; d++) {
            worst = fmax(worst, fabs(ro[qa + d] - o[d]));
            worst_lowp = fmax(worst_lowp, fabs(lo[qa + d] - o[d]));
          }
          worst = fmax(worst, fabs(rl[la] - lse));
          assert_int_equal(so[qa / D], 0);
          assert_int_equal(sl[la], 0);
        }
      q0 += L.lq[b], k0 += L.lk[b];
    }
    assert_true(worst < 1e-9);
    assert_true(worst_lowp < 0.05); /* bf16 inputs and P */
    assert_true(worst_lowp > 0);
    free(q), free(k), free(v), free(ro), free(rl), free(lo), free(ll), free(so), free(sl);
    cli_seqs_free(&L);
  }
}

/* The backward of one sequence (lq queries, lk keys; row strides qs of q,
 * dout and dq, ks of k, v, dk and dv between positions), one query head
 * against its KV head, done naively in float64: scores scale q.k + bias[kv]
 * where kv <= q (top-left causal: keys past lq - 1 get no query), softmax,
 * dS = P (dP - dO.O); dq, dk, dv and dbias ([lk]) added to. */
static void naive_backward_head(const float *q, const float *k, const float *v,
                                const float *dout, size_t qs, size_t ks, int lq, int lk,
                                int D, double scale, const float *bias, double *dq,
                                double *dk, double *dv, double *dbias) {
  double *p = malloc(sizeof(double) * (size_t)lk), *dp = malloc(sizeof(double) * (size_t)lk);
  for (int i = 0; i < lq; i++) {
    const float *qi = q + i * qs, *doi = dout + i * qs;
    double m = -INFINITY, l = 0, delta = 0;
    const int n = i + 1 < lk ? i + 1 : lk; /* keys 0..min(i, lk - 1) */
    for (int j = 0; j < n; j++) {
      double sc = 0;
      for (int d = 0; d < D; d++) sc += (double)qi[d] * k[j * ks + d];
      p[j] = scale * sc + bias[j];
      if (p[j] > m) m = p[j];
    }
    for (int j = 0; j < n; j++) l += (p[j] = exp(p[j] - m));
    for (int j = 0; j < n; j++) {
      p[j] /= l;
      dp[j] = 0;
      for (int d = 0; d < D; d++) dp[j] += (double)doi[d] * v[j * ks + d];
      delta += p[j] * dp[j];
    }
    for (int j = 0; j < n; j++) {
      double ds = p[j] * (dp[j] - delta);
      for (int d = 0; d < D; d++) {
        dq[i * qs + d] += scale * ds * k[j * ks + d];
        dk[j * ks + d] += scale * ds * qi[d];
        dv[j * ks + d] += p[j] * doi[d];
      }
      dbias[j] += ds;
    }
  }
  free(p), free(dp);
}

/* The per-sequence backward reference of a packed batch (GQA, lk = lq + 3,
 * a causal mask that leaves each sequence's last 3 keys unattended, a
 * trainable bias[kv]) against naive_backward_head over the packed layout
 * written out here: dq, dk, dv to rounding, the dtype's computation near
 * them, the zero rows exactly the unattended keys, the bias gradient summed
 * over the sequences. */
static void test_backward_reference_per_sequence(void **state) {
  (void)state;
  char err[1024] = "";
  enum { NB = 16 };
  const int Hq = 4, Hkv = 2, D = 8;
  const double scale = 0.3;
  static const char spec[] =
      "local bias = buffer('bias', 'f32', {grad = true})\n"
      "return { mask_mod = function(b, h, q, kv) return ge(q, kv) end,\n"
      "         score_mod = function(s, b, h, q, kv) return s + bias[kv] end }\n";
  fjg_graph *g = NULL;
  if (fjl_trace_spec(spec, strlen(spec), "spec.lua", &g, NULL, err, sizeof err) != FJ_OK)
    fail_msg("trace failed: %s", err);
  const int a = fjg_find_arg(g, "bias");
  assert_true(a >= 0 && a < FJG_MAX_ARGS);
  float *bias = random_floats(NB, 7);
  const void *bdata[FJG_MAX_ARGS] = {0};
  int64_t blen[FJG_MAX_ARGS] = {0};
  bdata[a] = bias, blen[a] = NB;
  fjg_env env;
  memset(&env, 0, sizeof env);
  env.buffer_data = bdata, env.buffer_len = blen;

  run_config c = config(2, Hq, Hkv, 6, 9, D);
  c.varlen_n = 3;
  cli_seqs L;
  assert_int_equal(cli_seqs_build(&L, &c, err, sizeof err), 0);
  assert_true(L.max_k <= NB);
  size_t nq = cli_seqs_nq(&L, &c), nk = cli_seqs_nk(&L, &c);
  float *q = random_floats(nq, 1), *k = random_floats(nk, 2), *v = random_floats(nk, 3);
  float *dout = random_floats(nq, 4);
  double *rq = malloc(8 * nq), *rk = malloc(8 * nk), *rv = malloc(8 * nk);
  float *lq = malloc(4 * nq), *lk = malloc(4 * nk), *lv = malloc(4 * nk);
  uint8_t *zq = malloc(nq / D), *zk = malloc(nk / D);
  double *rg[FJG_MAX_ARGS] = {0};
  float *lg[FJG_MAX_ARGS] = {0};
  rg[a] = malloc(8 * NB), lg[a] = malloc(4 * NB);
  const cli_bwd_ref ref = {rq, rk, rv, lq, lk, lv, zq, zk, rg, lg};
  assert_int_equal(cli_seqs_backward_reference(&L, &c, g, &env, scale, q, k, v, dout, &ref,
                                               err, sizeof err),
                   0);

  /* The naive gradients over the packed [total, H, D] tensors. */
  double *nq_ = calloc(nq, 8), *nk_ = calloc(nk, 8), *nv_ = calloc(nk, 8);
  double nbias[NB] = {0};
  int q0 = 0, k0 = 0;
  for (int b = 0; b < L.n; b++) {
    assert_int_equal(L.lk[b], L.lq[b] + 3);
    for (int h = 0; h < Hq; h++) {
      size_t qa = ((size_t)q0 * Hq + h) * D, ka = ((size_t)k0 * Hkv + h / 2) * D;
      naive_backward_head(q + qa, k + ka, v + ka, dout + qa, (size_t)Hq * D,
                          (size_t)Hkv * D, L.lq[b], L.lk[b], D, scale, bias, nq_ + qa,
                          nk_ + ka, nv_ + ka, nbias);
    }
    /* Keys past the last query (lq .. lq + 2) are its zero rows, no other. */
    for (int hk = 0; hk < Hkv; hk++)
      for (int j = 0; j < L.lk[b]; j++)
        assert_int_equal(zk[(size_t)(k0 + j) * Hkv + hk], j >= L.lq[b]);
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < L.lq[b]; i++) assert_int_equal(zq[(size_t)(q0 + i) * Hq + h], 0);
    q0 += L.lq[b], k0 += L.lk[b];
  }
  double worst = 0, worst_lowp = 0, biggest = 0;
  const double *r[3] = {rq, rk, rv}, *n[3] = {nq_, nk_, nv_};
  const float *lo[3] = {lq, lk, lv};
  const size_t len[3] = {nq, nk, nk};
  for (int t = 0; t < 3; t++)
    for (size_t i = 0; i < len[t]; i++) {
      worst = fmax(worst, fabs(r[t][i] - n[t][i]));
      worst_lowp = fmax(worst_lowp, fabs(lo[t][i] - n[t][i]));
      biggest = fmax(biggest, fabs(n[t][i]));
    }
  /* The score_mod runs in float32 at the float32 score, as the kernel's. */
  assert_true(worst < 1e-5);
  assert_true(worst_lowp < 0.05 * biggest); /* bf16 inputs, P and dS */
  assert_true(worst_lowp > 0);
  assert_true(biggest > 0.1);
  /* The bias gradient: every sequence's dS summed at its kv positions
   * (none reach past the longest sequence). */
  double gworst = 0, gworst_lowp = 0, gbig = 0;
  for (int j = 0; j < NB; j++) {
    gworst = fmax(gworst, fabs(rg[a][j] - nbias[j]));
    gworst_lowp = fmax(gworst_lowp, fabs(lg[a][j] - nbias[j]));
    gbig = fmax(gbig, fabs(nbias[j]));
    if (j >= L.max_k) assert_true(rg[a][j] == 0 && lg[a][j] == 0);
  }
  assert_true(gbig > 0.1);
  assert_true(gworst < 1e-5);
  assert_true(gworst_lowp > 0 && gworst_lowp < 0.05 * gbig);

  free(nq_), free(nk_), free(nv_), free(rg[a]), free(lg[a]);
  free(q), free(k), free(v), free(dout), free(rq), free(rk), free(rv);
  free(lq), free(lk), free(lv), free(zq), free(zk), free(bias);
  cli_seqs_free(&L);
  fjg_graph_destroy(g);
}

/* kv <= q + (Lk - Lq) (causal, bottom right), optionally also kv > q +
 * (Lk - Lq) - window, and optionally reading b. */
static fjg_graph *mask_graph(int window, int read_b) {
  fjg_graph *g = fjg_graph_create();
  /* As the tracer does: a node for every argument, read or not. */
  fjg_input_node(g, FJG_IN_B), fjg_size_node(g, FJG_SZ_B);
  int q = fjg_input_node(g, FJG_IN_Q), kv = fjg_input_node(g, FJG_IN_KV);
  int shift = fjg_binary(g, FJG_OP_SUB, fjg_size_node(g, FJG_SZ_LK),
                         fjg_size_node(g, FJG_SZ_LQ));
  int last = fjg_binary(g, FJG_OP_ADD, q, shift);
  int m = fjg_binary(g, FJG_OP_LE, kv, last);
  if (window) {
    int lo = fjg_binary(g, FJG_OP_SUB, last, fjg_const_i32(g, window));
    m = fjg_binary(g, FJG_OP_AND, m, fjg_binary(g, FJG_OP_GT, kv, lo));
  }
  if (read_b)
    m = fjg_binary(g, FJG_OP_AND, m,
                   fjg_binary(g, FJG_OP_GE, fjg_input_node(g, FJG_IN_B),
                              fjg_const_i32(g, 0)));
  assert_true(fjg_set_mask_root(g, m) >= 0);
  return g;
}

/* The counts of --bench: pairs and kv positions read, per sequence at its
 * lengths; specs reading b are found. */
static void test_counts(void **state) {
  (void)state;
  char err[256];
  fjg_env env;
  memset(&env, 0, sizeof env);
  run_config c = config(3, 8, 2, 4, 200, 16);
  c.seqlens_k = CLI_SEQLENS_RANDOM;
  c.seed = 3;
  cli_seqs L;
  assert_int_equal(cli_seqs_build(&L, &c, err, sizeof err), 0);
  int64_t lk = 0, pairs = 0, win = 0;
  for (int b = 0; b < 3; b++) {
    lk += L.lk[b];
    for (int i = 0; i < 4; i++) {
      int allowed = L.lk[b] - 4 + i + 1; /* kv <= i + lk - 4 */
      pairs += allowed > 0 ? allowed : 0;
    }
    win += L.lk[b] < 3 + 10 ? L.lk[b] : 3 + 10; /* the last query's 10 + 3 */
  }
  assert_int_equal(cli_seqs_kv_read(&L, &c, NULL, &env), lk);
  fjg_graph *causal = mask_graph(0, 0), *window = mask_graph(10, 0);
  fjg_graph *with_b = mask_graph(0, 1);
  assert_int_equal(cli_seqs_pairs(&L, &c, causal, &env), pairs * 8);
  assert_int_equal(cli_seqs_kv_read(&L, &c, causal, &env), lk);
  assert_int_equal(cli_seqs_kv_read(&L, &c, window, &env), win);
  assert_false(cli_graph_reads_batch(causal));
  assert_true(cli_graph_reads_batch(with_b));
  fjg_graph_destroy(causal), fjg_graph_destroy(window), fjg_graph_destroy(with_b);
  cli_seqs_free(&L);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_varlen_lengths),
      cmocka_unit_test(test_pages),
      cmocka_unit_test(test_reference_per_sequence),
      cmocka_unit_test(test_backward_reference_per_sequence),
      cmocka_unit_test(test_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
