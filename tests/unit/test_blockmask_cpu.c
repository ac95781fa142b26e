/*
 * tests/unit/test_blockmask_cpu.c: the CPU block-mask builder
 * (gen/blockmask_cpu.c) against brute force: every block's class from all
 * of its elements, every list from that class matrix, for index-only and
 * data-dependent masks, odd sizes and block shapes, and B/H broadcast or
 * not, and masks with pairs the CPU cannot decide the kernel's way
 * (uncertain: never in a FULL or EMPTY block). Also the census `flexjit
 * mask` prints (classes, allowed and uncertain pairs, its work limit) and
 * the argument checks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gen/blockmask_cpu.h"
#include "gen/eval.h"
#include "gen/interval.h"
#include "runtime/context.h"

/* Specs exercising both classifier outcomes and data-dependent masks. */
static const char *const kSpecs[][2] = {
    {"causal", "return { mask_mod = causal() }"},
    {"causal_br", "return { mask_mod = causal{align = \"bottom_right\"} }"},
    {"window", "return { mask_mod = sliding_window(param(\"window\", \"i32\")) }"},
    {"prefix", "return { mask_mod = prefix_lm(param(\"prefix\", \"i32\")) }"},
    {"chunked", "return { mask_mod = chunked(24) }"},
    {"dilated", "return { mask_mod = function(b, h, q, kv)\n"
                "  return eq((q - kv) % 3, 0) & ge(q, kv) end }"},
    {"document", "return { mask_mod = document(buffer(\"doc\", \"i32\")) }"},
    {"doc_bidir", "return { mask_mod = document(buffer(\"doc\", \"i32\"),"
                  " {causal = false}) }"},
    {"per_head", "return { mask_mod = function(b, h, q, kv)\n"
                 "  return ge(q + h * 7 - b * 11, kv) end }"},
    {"doc_or_sink", "return { mask_mod = or_masks(document(buffer(\"doc\","
                    " \"i32\")), function(b, h, q, kv) return lt(kv, 4) end) }"},
    {"none", "return { score_mod = softcap(20) }"},
    /* Uncertain where q - kv + 1 is a power of two, and on the diagonal. */
    {"log2_pow", "return { mask_mod = function(b, h, q, kv)\n"
                 "  local l = log2(q - kv + 1)\n"
                 "  return eq(l, floor(l)) & ge(q, kv) end }"},
    {"tanh_diag", "return { mask_mod = function(b, h, q, kv)\n"
                  "  return lt(tanh((q - kv) * 0.5), 0.0) | lt(kv, 5) end }"},
    {"q49", "return { mask_mod = function(b, h, q, kv)\n"
            "  return lt(q / 49.0 * 49.0, q) | eq(kv % 7, 0) end }"},
};

typedef struct world {
  int32_t params[8];
  const void *bufs[8];
  int64_t lens[8];
  int32_t doc[4096];
  fjg_env env;
} world;

static uint64_t rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Runtime values by name: window 37, prefix 50, doc = random segments of
 * 1..max_seg positions. */
static void world_init(world *w, const fjg_graph *g, uint64_t seed,
                       int max_seg) {
  memset(w, 0, sizeof *w);
  for (int i = 0, id = 0; i < 4096; id++) {
    int seg = 1 + (int)(rng(&seed) % (uint64_t)max_seg);
    for (int j = 0; j < seg && i < 4096; j++) w->doc[i++] = id;
  }
  for (int a = 0; a < fjg_num_args(g); a++) {
    const fjg_arg *d = fjg_arg_at(g, a);
    if (d->kind == FJ_ARG_BUFFER) {
      w->bufs[a] = w->doc;
      w->lens[a] = 4096;
    } else {
      w->params[a] = !strcmp(d->name, "window") ? 37 : 50;
    }
  }
  w->env.param_i32 = w->params;
  w->env.buffer_data = w->bufs;
  w->env.buffer_len = w->lens;
}

static fj_spec *load(fj_context *ctx, const char *src) {
  fj_spec *spec = NULL;
  fj_status st = fj_spec_load_string(ctx, src, strlen(src), "t", &spec);
  if (st != FJ_OK) fail_msg("spec: %s", fj_context_last_error(ctx));
  return spec;
}

/* Checks one line of the lists against the class matrix. */
static void check_line(const uint8_t *cls, int n, size_t stride, int32_t num,
                       const int32_t *idx, int32_t full_num,
                       const int32_t *full_idx) {
  int np = 0, nf = 0;
  for (int i = 0; i < n; i++) {
    uint8_t c = cls[(size_t)i * stride];
    if (c == FJG_TILE_PARTIAL) assert_int_equal(idx[np++], i);
    if (c == FJG_TILE_FULL) assert_int_equal(full_idx[nf++], i);
  }
  assert_int_equal(num, np);
  assert_int_equal(full_num, nf);
  for (int k = np; k < n; k++) assert_int_equal(idx[k], 0);
  for (int k = nf; k < n; k++) assert_int_equal(full_idx[k], 0);
}

static int64_t uncertain_seen;

/* The whole mask against brute force. */
static void check_mask(const fjg_graph *g, const world *w, int B, int H,
                       int Lq, int Lk, int bq, int bk) {
  fjg_block_mask_host m;
  assert_int_equal(fjg_block_mask_cpu_build(g, &w->env, B, H, Lq, Lk, bq, bk,
                                            &m),
                   FJ_OK);
  assert_int_equal(m.nq, (Lq + bq - 1) / bq);
  assert_int_equal(m.nkv, (Lk + bk - 1) / bk);
  fjg_env env = w->env;
  env.sizes[FJG_SZ_B] = B;
  env.sizes[FJG_SZ_HQ] = env.sizes[FJG_SZ_HKV] = H;
  env.sizes[FJG_SZ_LQ] = Lq;
  env.sizes[FJG_SZ_LK] = Lk;
  size_t nq = (size_t)m.nq, nkv = (size_t)m.nkv;
  uint8_t *ccls = malloc(nq * nkv);
  fjg_evaluator e;
  assert_int_equal(fjg_evaluator_init(&e, g, &env), FJ_OK);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      size_t bh = (size_t)b * H + h;
      const uint8_t *cls = m.cls + bh * nq * nkv;
      int64_t n[3] = {0, 0, 0};
      fjg_census c;
      assert_int_equal(fjg_mask_census(g, &env, b, h, Lq, Lk, bq, bk, UINT64_MAX,
                                       ccls, &c), FJ_OK);
      for (size_t i = 0; i < nq; i++)
        for (size_t j = 0; j < nkv; j++) {
          int q0 = (int)i * bq, kv0 = (int)j * bk;
          int q1 = q0 + bq > Lq ? Lq - 1 : q0 + bq - 1;
          int kv1 = kv0 + bk > Lk ? Lk - 1 : kv0 + bk - 1;
          int want = fjg_block_class_brute(g, &env, b, h, q0, q1, kv0, kv1);
          if (cls[i * nkv + j] != want)
            fail_msg("b %d h %d block (%zu, %zu): class %d, brute force %d",
                     b, h, i, j, cls[i * nkv + j], want);
          int64_t u = n[FJG_UNCERTAIN];
          for (int q = q0; q <= q1; q++)
            for (int kv = kv0; kv <= kv1; kv++) n[fjg_eval_mask3(&e, b, h, q, kv)]++;
          int flag = n[FJG_UNCERTAIN] > u ? FJG_BLOCK_UNCERTAIN : 0;
          if (ccls[i * nkv + j] != (want | flag))
            fail_msg("b %d h %d block (%zu, %zu): census class %d, brute force %d",
                     b, h, i, j, ccls[i * nkv + j], want | flag);
          if (flag) assert_int_equal(want, FJG_TILE_PARTIAL);
        }
      for (size_t i = 0; i < nq; i++)
        check_line(cls + i * nkv, m.nkv, 1, m.kv_num[bh * nq + i],
                   m.kv_idx + (bh * nq + i) * nkv, m.full_kv_num[bh * nq + i],
                   m.full_kv_idx + (bh * nq + i) * nkv);
      for (size_t j = 0; j < nkv; j++)
        check_line(cls + j, m.nq, nkv, m.q_num[bh * nkv + j],
                   m.q_idx + (bh * nkv + j) * nq, m.full_q_num[bh * nkv + j],
                   m.full_q_idx + (bh * nkv + j) * nq);
      assert_int_equal(c.allowed, n[FJG_ALLOWED]);
      assert_int_equal(c.uncertain, n[FJG_UNCERTAIN]);
      uncertain_seen += n[FJG_UNCERTAIN];
    }
  fjg_evaluator_free(&e);
  free(ccls);
  fjg_block_mask_host_free(&m);
}

static void test_against_brute_force(void **state) {
  (void)state;
  fj_context_options o;
  fj_context *ctx = NULL;
  fj_context_options_init(&o);
  o.cache_dir = "";
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  static const int shapes[][6] = {
      /* B, H, Lq, Lk, block_q, block_kv */
      {1, 1, 128, 128, 16, 16}, {1, 1, 77, 130, 16, 32},
      {2, 3, 100, 100, 32, 8},  {1, 2, 200, 57, 64, 16},
      {1, 1, 31, 31, 1, 1},     {1, 1, 300, 300, 128, 128},
      {2, 1, 45, 90, 7, 13},
  };
  uint64_t seed = 7;
  for (size_t s = 0; s < sizeof kSpecs / sizeof kSpecs[0]; s++) {
    fj_spec *spec = load(ctx, kSpecs[s][1]);
    const fjg_graph *g = fjr_spec_graph(spec);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
      const int *x = shapes[k];
      world w;
      /* Short documents make partial blocks, long ones full and empty. */
      world_init(&w, g, seed++, k % 2 ? 12 : 90);
      check_mask(g, &w, x[0], x[1], x[2], x[3], x[4], x[5]);
    }
    fj_spec_destroy(spec);
  }
  /* The uncertain specs had uncertain pairs. */
  assert_true(uncertain_seen > 0);
  fj_context_destroy(ctx);
}

/* A document mask on long documents has all three classes, and the
 * interval classifier alone decides the blocks above the diagonal. */
static void test_document_classes(void **state) {
  (void)state;
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(NULL, &ctx), FJ_OK);
  fj_spec *spec = load(ctx, kSpecs[6][1]);
  const fjg_graph *g = fjr_spec_graph(spec);
  world w;
  world_init(&w, g, 3, 600);
  fjg_block_mask_host m;
  assert_int_equal(fjg_block_mask_cpu_build(g, &w.env, 1, 1, 2048, 2048, 128,
                                            128, &m),
                   FJ_OK);
  int counts[3] = {0, 0, 0};
  for (int t = 0; t < m.nq * m.nkv; t++) counts[m.cls[t]]++;
  print_message("document 2048: %d empty, %d partial, %d full\n", counts[0],
                counts[1], counts[2]);
  assert_true(counts[0] > 0 && counts[1] > 0 && counts[2] > 0);
  for (int i = 0; i < m.nq; i++) /* nothing above the diagonal */
    for (int j = i + 1; j < m.nkv; j++)
      assert_int_equal(m.cls[i * m.nkv + j], FJG_TILE_EMPTY);
  fjg_block_mask_host_free(&m);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

/* The census counts a causal mask of 65536 x 65536 in one block from the
 * diagonal's small tiles, and stops at its work limit on a mask that needs
 * every element. */
static void test_census_bounded(void **state) {
  (void)state;
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(NULL, &ctx), FJ_OK);
  fj_spec *spec = load(ctx, kSpecs[0][1]);
  const fjg_graph *g = fjr_spec_graph(spec);
  fjg_env env;
  memset(&env, 0, sizeof env);
  env.sizes[FJG_SZ_LQ] = env.sizes[FJG_SZ_LK] = 65536;
  uint8_t cls;
  fjg_census c;
  assert_int_equal(fjg_mask_census(g, &env, 0, 0, 65536, 65536, 65536, 65536,
                                   (uint64_t)1 << 26, &cls, &c), FJ_OK);
  assert_int_equal(c.allowed, 65536LL * 65537 / 2);
  assert_int_equal(c.uncertain, 0);
  assert_int_equal(cls, FJG_TILE_PARTIAL);
  print_message("causal 65536: %llu node evaluations\n", (unsigned long long)c.work);
  fj_spec_destroy(spec);

  spec = load(ctx, kSpecs[5][1]); /* dilated: partial everywhere */
  g = fjr_spec_graph(spec);
  assert_int_equal(fjg_mask_census(g, &env, 0, 0, 65536, 65536, 128, 128,
                                   (uint64_t)1 << 24, NULL, &c), FJ_EUNSUPPORTED);
  assert_true(c.work <= ((uint64_t)1 << 24) + 64);
  assert_int_equal(fjg_mask_census(g, &env, 0, 0, 0, 8, 4, 4, 100, NULL, &c),
                   FJ_EINVAL);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

static void test_bad_arguments(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  fjg_block_mask_host m;
  assert_int_equal(fjg_block_mask_cpu_build(g, NULL, 0, 1, 8, 8, 4, 4, &m),
                   FJ_EINVAL);
  assert_int_equal(fjg_block_mask_cpu_build(g, NULL, 1, 1, 0, 8, 4, 4, &m),
                   FJ_EINVAL);
  assert_int_equal(fjg_block_mask_cpu_build(g, NULL, 1, 1, 8, 8, 0, 4, &m),
                   FJ_EINVAL);
  assert_null(m.cls);
  fjg_block_mask_host_free(&m); /* zeroed: a no-op */
  /* No mask_mod: every block FULL. */
  assert_int_equal(fjg_block_mask_cpu_build(g, NULL, 1, 1, 10, 20, 4, 8, &m),
                   FJ_OK);
  assert_int_equal(m.nq, 3);
  assert_int_equal(m.nkv, 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(m.full_kv_num[i], 3);
    assert_int_equal(m.kv_num[i], 0);
    assert_int_equal(m.full_q_num[i], 3);
  }
  fjg_block_mask_host_free(&m);
  fjg_block_mask_host_free(NULL);
  fjg_graph_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_against_brute_force),
      cmocka_unit_test(test_document_classes),
      cmocka_unit_test(test_census_bounded),
      cmocka_unit_test(test_bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
