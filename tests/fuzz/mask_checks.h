/*
 * tests/fuzz/mask_checks.h: the mask checks that the spec fuzzer
 * (fuzz_specs.c) runs on the specs it writes and the spec-text input
 * fuzzer (input_spec.c) on the specs it is given: the census and the CPU
 * block mask against brute-force evaluation, and the interval analysis's
 * soundness on random tiles, under random runtime values (a world), drawn
 * from a seeded PRNG.
 */
#ifndef FJ_FUZZ_MASK_CHECKS_H
#define FJ_FUZZ_MASK_CHECKS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "flexjit.h"
#include "gen/blockmask_cpu.h"
#include "gen/eval.h"
#include "gen/graph.h"
#include "gen/interval.h"

/* ---- PRNG ---- */

typedef struct rng {
  uint64_t s;
} rng;

static uint64_t next(rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static int pick(rng *r, int n) { return (int)(next(r) % (uint64_t)n); }
static int between(rng *r, int lo, int hi) { return lo + pick(r, hi - lo + 1); }
static int chance(rng *r, int percent) { return pick(r, 100) < percent; }

/* ---- runtime values ---- */

typedef struct world {
  int32_t pi[FJG_MAX_ARGS];
  float pf[FJG_MAX_ARGS];
  const void *data[FJG_MAX_ARGS];
  int64_t len[FJG_MAX_ARGS];
  int32_t ibuf[FJG_MAX_ARGS][64];
  float fbuf[FJG_MAX_ARGS][64];
  fjg_env env;
} world;

static float random_float(rng *r) {
  static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 49.0f,
                                  1e30f, -1e30f, INFINITY, -INFINITY, NAN,
                                  1e-40f, 0.1f, 3.0f, 1024.0f};
  if (chance(r, 30)) return special[pick(r, 15)];
  return (float)between(r, -2000, 2000) / (float)between(r, 1, 64);
}

static int32_t random_int(rng *r) {
  static const int32_t special[] = {0, 1, -1, 2, 7, 31, 64, INT32_MAX,
                                    INT32_MIN, -64, 100};
  if (chance(r, 30)) return special[pick(r, 11)];
  return between(r, -40, 120);
}

static void world_init(world *w, const fjg_graph *g, rng *r, int lq, int lk,
                       int B, int H) {
  memset(w, 0, sizeof *w);
  for (int a = 0; a < fjg_num_args(g); a++) {
    const fjg_arg *d = fjg_arg_at(g, a);
    w->pi[a] = random_int(r);
    w->pf[a] = random_float(r);
    if (d->kind == FJ_ARG_BUFFER) {
      w->len[a] = between(r, 1, 64);
      int docs = chance(r, 50);
      for (int i = 0; i < 64; i++) {
        w->ibuf[a][i] = docs ? i / between(r, 1, 16) : random_int(r);
        w->fbuf[a][i] = random_float(r);
      }
      w->data[a] = d->type == FJG_I32 ? (const void *)w->ibuf[a]
                                      : (const void *)w->fbuf[a];
    }
  }
  w->env.param_i32 = w->pi;
  w->env.param_f32 = w->pf;
  w->env.buffer_data = w->data;
  w->env.buffer_len = w->len;
  w->env.sizes[FJG_SZ_B] = B;
  w->env.sizes[FJG_SZ_HQ] = H;
  w->env.sizes[FJG_SZ_HKV] = H;
  w->env.sizes[FJG_SZ_LQ] = lq;
  w->env.sizes[FJG_SZ_LK] = lk;
  /* Context parallel offsets, half the time: the hooks see q + q_off and
   * kv + kv_off (fj_sizes' q_off, kv_off), the CPU too. */
  const int shard = between(r, 0, 1);
  w->env.q_off = shard ? between(r, 0, 4096) : 0;
  w->env.kv_off = shard ? between(r, 0, 4096) : 0;
}

/* ---- the checks ---- */

/* How check_masks reports a failure (printf-style); returns 1. */
typedef int (*mask_fail_fn)(void *user, const char *what, ...)
    __attribute__((format(printf, 2, 3)));

/* Census and block-mask builder against brute force on one random shape;
 * interval soundness on random tiles. Adds the elements it evaluates to
 * *elements, and 1 to *uncertain_specs where some are uncertain. Returns 1
 * on a failure (reported through fail), else 0. */
static int check_masks(const fjg_graph *g, rng *r, mask_fail_fn fail, void *user,
                       long *elements, long *uncertain_specs) {
  int lq = between(r, 1, 70), lk = between(r, 1, 70);
  int B = between(r, 1, 2), H = between(r, 1, 3);
  int bq = between(r, 1, 40), bk = between(r, 1, 40);
  world w;
  world_init(&w, g, r, lq, lk, B, H);
  fjg_evaluator e;
  if (fjg_evaluator_init(&e, g, &w.env) != FJ_OK) return fail(user, "evaluator: no memory");
  int b = pick(r, B), h = pick(r, H), failed = 0;
  int nq = (lq + bq - 1) / bq, nkv = (lk + bk - 1) / bk;
  uint8_t cls[70 * 70];
  fjg_census c;
  fj_status s = fjg_mask_census(g, &w.env, b, h, lq, lk, bq, bk, UINT64_MAX, cls, &c);
  if (s != FJ_OK) {
    fjg_evaluator_free(&e);
    return fail(user, "census: %s", fj_strerror(s));
  }
  fjg_block_mask_host m;
  s = fjg_block_mask_cpu_build(g, &w.env, B, H, lq, lk, bq, bk, &m);
  if (s != FJ_OK) {
    fjg_evaluator_free(&e);
    return fail(user, "block mask: %s", fj_strerror(s));
  }
  int64_t total[3] = {0, 0, 0};
  for (int i = 0; i < nq && !failed; i++)
    for (int j = 0; j < nkv && !failed; j++) {
      int64_t n[3] = {0, 0, 0};
      int q0 = i * bq, kv0 = j * bk;
      int q1 = q0 + bq > lq ? lq - 1 : q0 + bq - 1;
      int kv1 = kv0 + bk > lk ? lk - 1 : kv0 + bk - 1;
      for (int q = q0; q <= q1; q++)
        for (int kv = kv0; kv <= kv1; kv++) n[fjg_eval_mask3(&e, b, h, q, kv)]++;
      *elements += (q1 - q0 + 1) * (kv1 - kv0 + 1);
      int want = n[FJG_UNCERTAIN] || (n[FJG_ALLOWED] && n[FJG_MASKED])
                     ? FJG_TILE_PARTIAL
                     : n[FJG_ALLOWED] ? FJG_TILE_FULL : FJG_TILE_EMPTY;
      int flag = n[FJG_UNCERTAIN] ? FJG_BLOCK_UNCERTAIN : 0;
      if (cls[i * nkv + j] != (want | flag))
        failed = fail(user, "census block (%d, %d) of %dx%d (Lq %d Lk %d, b %d h %d): "
                        "class %d, brute force %d", i, j, bq, bk, lq, lk, b, h,
                        cls[i * nkv + j], want | flag);
      size_t t = (((size_t)(m.B > 1 ? b : 0) * m.H + (m.H > 1 ? h : 0)) * nq + i) * nkv + j;
      if (!failed && m.cls[t] != want)
        failed = fail(user, "block mask block (%d, %d): class %d, brute force %d", i,
                        j, m.cls[t], want);
      for (int k = 0; k < 3; k++) total[k] += n[k];
    }
  if (!failed && (c.allowed != total[FJG_ALLOWED] || c.uncertain != total[FJG_UNCERTAIN]))
    failed = fail(user, "census counts %lld allowed %lld uncertain, brute force %lld %lld",
                    (long long)c.allowed, (long long)c.uncertain,
                    (long long)total[FJG_ALLOWED], (long long)total[FJG_UNCERTAIN]);
  if (total[FJG_UNCERTAIN]) ++*uncertain_specs;
  fjg_block_mask_host_free(&m);

  /* Interval soundness: tiles anywhere, also past the lengths and negative,
   * and a quarter of them far out (indices near 2^31, where i32 arithmetic
   * wraps). */
  for (int t = 0; t < 24 && !failed; t++) {
    int q0 = between(r, -8, lq), kv0 = between(r, -8, lk);
    if (t % 4 == 3) {
      q0 = (int)(next(r) % 2147483000u) - (chance(r, 30) ? 1073741800 : 0);
      kv0 = chance(r, 50) ? q0 - between(r, -40, 40)
                          : (int)(next(r) % 2147483000u);
    }
    int q1 = q0 + pick(r, 24), kv1 = kv0 + pick(r, 24);
    int bb = pick(r, B), hh = pick(r, H);
    int cl = fjg_tile_class_cpu(g, &w.env, bb, hh, q0, q1, kv0, kv1);
    if (cl == FJG_TILE_PARTIAL) continue;
    for (int q = q0; q <= q1 && !failed; q++)
      for (int kv = kv0; kv <= kv1 && !failed; kv++) {
        int v = fjg_eval_mask3(&e, bb, hh, q, kv);
        if (v != (cl == FJG_TILE_FULL ? FJG_ALLOWED : FJG_MASKED))
          failed = fail(user, "interval class %s on q [%d, %d] kv [%d, %d] (b %d h %d, "
                          "Lq %d Lk %d) but element (%d, %d) is %s",
                          cl == FJG_TILE_FULL ? "FULL" : "EMPTY", q0, q1, kv0, kv1,
                          bb, hh, lq, lk, q, kv,
                          v == FJG_ALLOWED ? "allowed" : v == FJG_MASKED ? "masked"
                                                                          : "uncertain");
      }
  }
  fjg_evaluator_free(&e);
  return failed;
}

#endif /* FJ_FUZZ_MASK_CHECKS_H */
