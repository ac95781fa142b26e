/* tests/unit/test_interval.c: tile classification (gen/interval.c) is sound
 * against brute force, and precise where it matters (causal diagonals). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gen/graph.h"
#include "gen/interval.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

/* Uniform in [lo, hi]. */
static int range(int lo, int hi) {
  return lo + (int)(rnd() % (uint32_t)(hi - lo + 1));
}

typedef struct world {
  int32_t params[4];
  int32_t buf[16];
  const void *data[4];
  int64_t lens[4];
  fjg_env env;
} world;

static void world_init(world *w, int lq, int lk) {
  memset(w, 0, sizeof *w);
  for (int i = 0; i < 16; i++) w->buf[i] = range(-3, 3);
  for (int i = 0; i < 4; i++) w->params[i] = range(-40, 200);
  for (int i = 0; i < 4; i++) w->data[i] = w->buf, w->lens[i] = 16;
  int32_t sizes[FJG_NUM_SIZES] = {2, 4, 2, lq, lk};
  memcpy(w->env.sizes, sizes, sizeof sizes);
  w->env.param_i32 = w->params;
  w->env.buffer_data = w->data;
  w->env.buffer_len = w->lens;
}

/* Checks the class of one tile against every pair in it. Returns it. */
static int check_tile(const fjg_graph *g, const fjg_env *env, int b, int h,
                      int q0, int q1, int kv0, int kv1) {
  int cls = fjg_tile_class_cpu(g, env, b, h, q0, q1, kv0, kv1);
  assert_true(cls >= 0 && cls <= 2);
  if (cls == FJG_TILE_PARTIAL) return cls;
  for (int q = q0; q <= q1; q++)
    for (int kv = kv0; kv <= kv1; kv++) {
      int m = fjg_eval_mask(g, env, b, h, q, kv);
      if (m != (cls == FJG_TILE_FULL))
        fail_msg("tile q[%d,%d] kv[%d,%d] b=%d h=%d classified %d but "
                 "mask(%d, %d) = %d", q0, q1, kv0, kv1, b, h, cls, q, kv, m);
    }
  return cls;
}

/* Random tiles, including ones outside [0, L) and of width 1; counts[]
 * gets how many of each class were seen. */
static void check_random_tiles(const fjg_graph *g, const fjg_env *env, int n,
                               int counts[3]) {
  for (int i = 0; i < n; i++) {
    int q0 = range(-70, 330), kv0 = range(-70, 330);
    int q1 = q0 + range(0, i % 3 == 0 ? 3 : 40);
    int kv1 = kv0 + range(0, i % 5 == 0 ? 3 : 40);
    counts[check_tile(g, env, range(0, 1), range(0, 3), q0, q1, kv0, kv1)]++;
  }
}

/* ---- the standard masks ---- */

typedef struct nodes {
  int q, kv, b, h, lq, lk, window, prefix, doc;
} nodes;

static nodes leaves(fjg_graph *g) {
  nodes n;
  n.q = fjg_input_node(g, FJG_IN_Q);
  n.kv = fjg_input_node(g, FJG_IN_KV);
  n.b = fjg_input_node(g, FJG_IN_B);
  n.h = fjg_input_node(g, FJG_IN_H);
  n.lq = fjg_size_node(g, FJG_SZ_LQ);
  n.lk = fjg_size_node(g, FJG_SZ_LK);
  n.window = fjg_param(g, "window", FJG_I32);
  n.prefix = fjg_param(g, "prefix", FJG_I32);
  n.doc = fjg_buffer(g, "doc", FJG_I32);
  return n;
}

static int bin(fjg_graph *g, fjg_op op, int a, int b) {
  int r = fjg_binary(g, op, a, b);
  if (r < 0) fail_msg("%s", fjg_graph_error(g));
  return r;
}

static int k(fjg_graph *g, int v) { return fjg_const_i32(g, v); }

enum { NUM_MASKS = 12 };

/* Mask number `which` on g's leaves. */
static int standard_mask(fjg_graph *g, const nodes *n, int which) {
  int causal = bin(g, FJG_OP_GE, n->q, n->kv);
  int shift = bin(g, FJG_OP_SUB, n->lk, n->lq);
  int bottom_right = bin(g, FJG_OP_GE, bin(g, FJG_OP_ADD, n->q, shift), n->kv);
  int d = bin(g, FJG_OP_SUB, n->q, n->kv);
  int window = bin(g, FJG_OP_AND, causal, bin(g, FJG_OP_LT, d, n->window));
  int prefix = bin(g, FJG_OP_OR, bin(g, FJG_OP_LT, n->kv, n->prefix), causal);
  int chunk = bin(g, FJG_OP_EQ, bin(g, FJG_OP_IDIV, n->q, k(g, 64)),
                  bin(g, FJG_OP_IDIV, n->kv, k(g, 64)));
  int dilated = bin(g, FJG_OP_EQ, bin(g, FJG_OP_MOD, d, k(g, 4)), k(g, 0));
  int doc = bin(g, FJG_OP_EQ, fjg_load(g, n->doc, n->q), fjg_load(g, n->doc, n->kv));
  switch (which) {
  case 0: return causal;
  case 1: return bottom_right;
  case 2: return window;
  case 3: return prefix;
  case 4: return chunk;
  case 5: return dilated;
  case 6: return bin(g, FJG_OP_AND, chunk, causal);
  case 7: return bin(g, FJG_OP_OR, window, fjg_unary(g, FJG_OP_NOT, dilated));
  case 8: return bin(g, FJG_OP_XOR, prefix, chunk);
  case 9: return bin(g, FJG_OP_AND, doc, causal);
  case 10: /* symmetric window through abs, per-head sizes via where */
    return bin(g, FJG_OP_LE, fjg_unary(g, FJG_OP_ABS, d),
               fjg_where(g, bin(g, FJG_OP_EQ, n->h, k(g, 0)), k(g, 16),
                         bin(g, FJG_OP_MUL, n->h, k(g, 32))));
  default: /* min/max and a negative divisor */
    return bin(g, FJG_OP_GT, bin(g, FJG_OP_MAX, bin(g, FJG_OP_IDIV, n->q, k(g, -7)),
                                 bin(g, FJG_OP_MIN, n->kv, n->prefix)),
               bin(g, FJG_OP_MOD, n->kv, k(g, -9)));
  }
}

static void test_standard_masks_sound(void **state) {
  (void)state;
  for (int which = 0; which < NUM_MASKS; which++) {
    for (int rep = 0; rep < 3; rep++) {
      fjg_graph *g = fjg_graph_create();
      nodes n = leaves(g);
      assert_int_equal(fjg_set_mask_root(g, standard_mask(g, &n, which)), 0);
      world w;
      world_init(&w, range(1, 300), range(1, 300));
      w.params[0] = range(1, 100); /* window */
      int counts[3] = {0, 0, 0};
      check_random_tiles(g, &w.env, 1500, counts);
      /* Index-only masks must decide some tiles. */
      if (which != 9 && which != 5 && which != 7)
        assert_true(counts[0] + counts[2] > 0);
      assert_int_equal(fjg_mask_is_index_only(g), which != 9);
      fjg_graph_destroy(g);
    }
  }
}

/* ---- random expressions ---- */

static int rand_i32(fjg_graph *g, const nodes *n, int depth);

static int rand_bool(fjg_graph *g, const nodes *n, int depth) {
  static const fjg_op cmps[] = {FJG_OP_LT, FJG_OP_LE, FJG_OP_GT,
                                FJG_OP_GE, FJG_OP_EQ, FJG_OP_NE};
  static const fjg_op logic[] = {FJG_OP_AND, FJG_OP_OR, FJG_OP_XOR};
  int pick = depth <= 0 ? 0 : range(0, 9);
  if (pick <= 4)
    return bin(g, cmps[range(0, 5)], rand_i32(g, n, depth - 1),
               rand_i32(g, n, depth - 1));
  if (pick <= 7)
    return bin(g, logic[range(0, 2)], rand_bool(g, n, depth - 1),
               rand_bool(g, n, depth - 1));
  if (pick == 8) return fjg_unary(g, FJG_OP_NOT, rand_bool(g, n, depth - 1));
  /* A float comparison: unknown to the analysis, still must be sound. */
  int f = bin(g, FJG_OP_DIV, rand_i32(g, n, depth - 1), k(g, 3));
  return bin(g, FJG_OP_LT, f, fjg_const_f32(g, 2.5f));
}

static int rand_leaf(fjg_graph *g, const nodes *n) {
  switch (range(0, 9)) {
  case 0: case 1: return n->q;
  case 2: case 3: return n->kv;
  case 4: return range(0, 1) ? n->b : n->h;
  case 5: return range(0, 1) ? n->lq : n->lk;
  case 6: return range(0, 1) ? n->window : n->prefix;
  case 7: return k(g, range(0, 20) == 0 ? 1 << range(16, 30) : range(-70, 70));
  case 8: return fjg_load(g, n->doc, n->q);
  default: return k(g, range(-5, 5));
  }
}

static int rand_i32(fjg_graph *g, const nodes *n, int depth) {
  static const fjg_op ops[] = {FJG_OP_ADD, FJG_OP_SUB, FJG_OP_MUL,
                               FJG_OP_MIN, FJG_OP_MAX, FJG_OP_IDIV,
                               FJG_OP_MOD};
  int pick = depth <= 0 ? 0 : range(0, 11);
  if (pick <= 2) return rand_leaf(g, n);
  if (pick <= 8)
    return bin(g, ops[range(0, 6)], rand_i32(g, n, depth - 1),
               rand_i32(g, n, depth - 1));
  if (pick == 9)
    return fjg_unary(g, range(0, 1) ? FJG_OP_NEG : FJG_OP_ABS,
                     rand_i32(g, n, depth - 1));
  if (pick == 10)
    return fjg_where(g, rand_bool(g, n, depth - 1), rand_i32(g, n, depth - 1),
                     rand_i32(g, n, depth - 1));
  /* Small divisors around zero exercise the split rules. */
  return bin(g, range(0, 1) ? FJG_OP_IDIV : FJG_OP_MOD,
             rand_i32(g, n, depth - 1),
             bin(g, FJG_OP_SUB, n->kv, k(g, range(-5, 300))));
}

static void test_random_expressions_sound(void **state) {
  (void)state;
  int decided = 0;
  for (int t = 0; t < 400; t++) {
    fjg_graph *g = fjg_graph_create();
    nodes n = leaves(g);
    int root = rand_bool(g, &n, range(1, 4));
    assert_true(root >= 0);
    assert_int_equal(fjg_set_mask_root(g, root), 0);
    world w;
    world_init(&w, range(1, 300), range(1, 300));
    int counts[3] = {0, 0, 0};
    check_random_tiles(g, &w.env, 40, counts);
    decided += counts[0] + counts[2];
    fjg_graph_destroy(g);
  }
  print_message("random expressions: %d of 16000 tiles decided\n", decided);
  assert_true(decided > 1000);
}

/* ---- inclusion: a decided range decides its sub-ranges ---- */

/* Interval analysis must be inclusion-monotonic, not only sound: a range
 * classified EMPTY or FULL must give every sub-tile the same class (so one
 * classification of a whole kv range can stand for each block in it, as a
 * CTA's tile range does). */
static void check_subtiles(const fjg_graph *g, const fjg_env *env, int n, int *decided) {
  for (int i = 0; i < n; i++) {
    int b = range(0, 1), h = range(0, 3);
    int q0 = range(-70, 330), kv0 = range(-70, 330);
    int q1 = q0 + range(0, 60), kv1 = kv0 + range(0, 300);
    int cls = fjg_tile_class_cpu(g, env, b, h, q0, q1, kv0, kv1);
    if (cls == FJG_TILE_PARTIAL) continue;
    ++*decided;
    for (int j = 0; j < 8; j++) {
      int sq0 = range(q0, q1), skv0 = range(kv0, kv1);
      int sq1 = range(sq0, q1), skv1 = range(skv0, kv1);
      int sub = fjg_tile_class_cpu(g, env, b, h, sq0, sq1, skv0, skv1);
      if (sub != cls)
        fail_msg("q[%d,%d] kv[%d,%d] classified %d, its sub-tile q[%d,%d] kv[%d,%d] %d",
                 q0, q1, kv0, kv1, cls, sq0, sq1, skv0, skv1, sub);
    }
  }
}

static void test_subranges_keep_the_class(void **state) {
  (void)state;
  int decided = 0;
  for (int which = 0; which < NUM_MASKS; which++) {
    fjg_graph *g = fjg_graph_create();
    nodes n = leaves(g);
    assert_int_equal(fjg_set_mask_root(g, standard_mask(g, &n, which)), 0);
    world w;
    world_init(&w, range(1, 300), range(1, 300));
    w.params[0] = range(1, 100);
    check_subtiles(g, &w.env, 400, &decided);
    fjg_graph_destroy(g);
  }
  for (int t = 0; t < 200; t++) {
    fjg_graph *g = fjg_graph_create();
    nodes n = leaves(g);
    assert_int_equal(fjg_set_mask_root(g, rand_bool(g, &n, range(1, 4))), 0);
    world w;
    world_init(&w, range(1, 300), range(1, 300));
    check_subtiles(g, &w.env, 20, &decided);
    fjg_graph_destroy(g);
  }
  print_message("sub-ranges: %d decided ranges checked\n", decided);
  assert_true(decided > 500);
}

/* ---- precision ---- */

static void test_causal_precision(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  nodes n = leaves(g);
  fjg_set_mask_root(g, standard_mask(g, &n, 0));
  world w;
  world_init(&w, 1024, 1024);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      int q0 = 64 * i, q1 = q0 + 63, kv0 = 64 * j, kv1 = kv0 + 63;
      int cls = check_tile(g, &w.env, 0, 0, q0, q1, kv0, kv1);
      int want = i > j ? FJG_TILE_FULL : i < j ? FJG_TILE_EMPTY
                                               : FJG_TILE_PARTIAL;
      assert_int_equal(cls, want);
    }
  fjg_graph_destroy(g);

  /* Bottom-right causal with Lk - Lq = 100: the diagonal moves right. */
  g = fjg_graph_create();
  n = leaves(g);
  fjg_set_mask_root(g, standard_mask(g, &n, 1));
  world_init(&w, 156, 256);
  assert_int_equal(check_tile(g, &w.env, 0, 0, 0, 31, 0, 99), FJG_TILE_FULL);
  assert_int_equal(check_tile(g, &w.env, 0, 0, 0, 31, 101, 132), FJG_TILE_PARTIAL);
  assert_int_equal(check_tile(g, &w.env, 0, 0, 0, 31, 132, 163), FJG_TILE_EMPTY);
  fjg_graph_destroy(g);

  /* Sliding window 128: inside the band FULL, far below it EMPTY. */
  g = fjg_graph_create();
  n = leaves(g);
  fjg_set_mask_root(g, standard_mask(g, &n, 2));
  world_init(&w, 1024, 1024);
  w.params[0] = 128;
  assert_int_equal(check_tile(g, &w.env, 0, 0, 64, 127, 0, 63), FJG_TILE_FULL);
  assert_int_equal(check_tile(g, &w.env, 0, 0, 512, 575, 0, 63), FJG_TILE_EMPTY);
  assert_int_equal(check_tile(g, &w.env, 0, 0, 512, 575, 640, 703), FJG_TILE_EMPTY);
  assert_int_equal(check_tile(g, &w.env, 0, 0, 128, 191, 0, 63), FJG_TILE_PARTIAL);
  fjg_graph_destroy(g);

  /* Chunks of 64: same chunk FULL, other chunks EMPTY. */
  g = fjg_graph_create();
  n = leaves(g);
  fjg_set_mask_root(g, standard_mask(g, &n, 4));
  world_init(&w, 1024, 1024);
  assert_int_equal(check_tile(g, &w.env, 0, 0, 64, 127, 64, 127), FJG_TILE_FULL);
  assert_int_equal(check_tile(g, &w.env, 0, 0, 64, 127, 128, 191), FJG_TILE_EMPTY);
  assert_int_equal(check_tile(g, &w.env, 0, 0, 32, 95, 64, 127), FJG_TILE_PARTIAL);
  fjg_graph_destroy(g);

  /* No mask at all: every tile is full. */
  g = fjg_graph_create();
  assert_int_equal(fjg_tile_class_cpu(g, NULL, 0, 0, 0, 63, 0, 63), FJG_TILE_FULL);
  assert_true(fjg_mask_is_index_only(g));
  fjg_graph_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_standard_masks_sound),
      cmocka_unit_test(test_random_expressions_sound),
      cmocka_unit_test(test_subranges_keep_the_class),
      cmocka_unit_test(test_causal_precision),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
