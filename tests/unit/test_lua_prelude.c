/* tests/unit/test_lua_prelude.c: every prelude builder and every example
 * spec traces, passes the bytecode check, and evaluates (gen/eval.c) to the
 * same values as a brute-force C version, on small sizes with Lq != Lk. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "lua/spec.h"

#define MAX_ARGS 8

/* Launch-time values, filled by name once the graph says their index. */
typedef struct launch {
  fjg_env env;
  int32_t i32[MAX_ARGS];
  float f32[MAX_ARGS];
  const void *data[MAX_ARGS];
  int64_t len[MAX_ARGS];
} launch;

typedef struct shape {
  int hq, lq, lk;
} shape;

static const shape shapes[] = {{4, 8, 8}, {4, 5, 9}, {2, 9, 6}};

static fjg_graph *trace_ok(const char *src) {
  fjg_graph *g = NULL;
  char err[1024] = "";
  fj_status st =
      fjl_trace_spec(src, strlen(src), "spec.lua", &g, NULL, err, sizeof err);
  if (st != FJ_OK)
    fail_msg("trace failed (%d): %s\n%s", st, err, src);
  return g;
}

static void launch_init(launch *l, shape s) {
  memset(l, 0, sizeof *l);
  l->env.sizes[FJG_SZ_B] = 1;
  l->env.sizes[FJG_SZ_HQ] = s.hq;
  l->env.sizes[FJG_SZ_HKV] = s.hq / 2;
  l->env.sizes[FJG_SZ_LQ] = s.lq;
  l->env.sizes[FJG_SZ_LK] = s.lk;
  l->env.param_i32 = l->i32;
  l->env.param_f32 = l->f32;
  l->env.buffer_data = l->data;
  l->env.buffer_len = l->len;
}

static int arg_index(const fjg_graph *g, const char *name) {
  int i = fjg_find_arg(g, name);
  if (i < 0 || i >= MAX_ARGS)
    fail_msg("the spec declares no argument '%s'", name);
  return i;
}

static void set_i32(launch *l, const fjg_graph *g, const char *name, int v) {
  l->i32[arg_index(g, name)] = v;
}

static void set_f32(launch *l, const fjg_graph *g, const char *name, float v) {
  l->f32[arg_index(g, name)] = v;
}

static void set_buffer(launch *l, const fjg_graph *g, const char *name,
                       const void *data, int64_t len) {
  int i = arg_index(g, name);
  l->data[i] = data;
  l->len[i] = len;
}

/* Context of the brute-force versions. */
typedef struct ref {
  shape s;
  int w;         /* window, prefix, chunk, heads: the builder's number */
  double c;      /* softcap */
  const int32_t *doc, *kv_doc;
  const float *table;
  int offset;
} ref;

typedef int (*mask_fn)(const ref *r, int h, int q, int kv);
typedef double (*score_fn)(const ref *r, double s, int h, int q, int kv);

static void expect_mask(const fjg_graph *g, const launch *l, const ref *r,
                        mask_fn want, const char *what) {
  for (int h = 0; h < r->s.hq; h++)
    for (int q = 0; q < r->s.lq; q++)
      for (int kv = 0; kv < r->s.lk; kv++) {
        int got = fjg_eval_mask(g, &l->env, 0, h, q, kv);
        if (got != want(r, h, q, kv))
          fail_msg("%s: Lq=%d Lk=%d h=%d q=%d kv=%d: got %d", what, r->s.lq,
                   r->s.lk, h, q, kv, got);
      }
}

static void expect_score(const fjg_graph *g, const launch *l, const ref *r,
                         score_fn want, const char *what) {
  const double scores[] = {-3.5, 0.0, 0.25, 7.0};
  for (int i = 0; i < 4; i++)
    for (int h = 0; h < r->s.hq; h++)
      for (int q = 0; q < r->s.lq; q++)
        for (int kv = 0; kv < r->s.lk; kv++) {
          double got = fjg_eval_score(g, &l->env, scores[i], 0, h, q, kv);
          double exp = want(r, scores[i], h, q, kv);
          if (!(fabs(got - exp) <= 1e-4 * (1 + fabs(exp))))
            fail_msg("%s: Lq=%d Lk=%d h=%d q=%d kv=%d s=%g: got %.9g want "
                     "%.9g", what, r->s.lq, r->s.lk, h, q, kv, scores[i],
                     got, exp);
        }
}

/* ---- brute-force masks ---- */

static int m_causal(const ref *r, int h, int q, int kv) { return kv <= q; }
static int m_causal_br(const ref *r, int h, int q, int kv) {
  return kv <= q + r->s.lk - r->s.lq;
}
static int m_window(const ref *r, int h, int q, int kv) {
  return kv <= q && q - kv < r->w;
}
static int m_window_br(const ref *r, int h, int q, int kv) {
  int qq = q + r->s.lk - r->s.lq;
  return kv <= qq && qq - kv < r->w;
}
static int m_window_sym(const ref *r, int h, int q, int kv) {
  return abs(q - kv) < r->w;
}
static int m_prefix(const ref *r, int h, int q, int kv) {
  return kv <= q || kv < r->w;
}
static int m_document(const ref *r, int h, int q, int kv) {
  return r->doc[q] == r->kv_doc[kv] && kv <= q;
}
static int m_document_any(const ref *r, int h, int q, int kv) {
  return r->doc[q] == r->kv_doc[kv];
}
static int m_chunked(const ref *r, int h, int q, int kv) {
  return q / r->w == kv / r->w && kv <= q;
}
static int m_and(const ref *r, int h, int q, int kv) {
  return m_causal(r, h, q, kv) && m_prefix(r, h, q, kv) &&
         m_window_sym(r, h, q, kv);
}
static int m_or(const ref *r, int h, int q, int kv) {
  return m_window(r, h, q, kv) || m_prefix(r, h, q, kv);
}
static int m_all(const ref *r, int h, int q, int kv) { return 1; }
static int m_none(const ref *r, int h, int q, int kv) { return 0; }

static void check_mask(const char *src, const ref *r0, mask_fn want,
                       void (*bind)(launch *, const fjg_graph *, const ref *)) {
  fjg_graph *g = trace_ok(src);
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    ref r = *r0;
    r.s = shapes[i];
    launch l;
    launch_init(&l, r.s);
    if (bind)
      bind(&l, g, &r);
    expect_mask(g, &l, &r, want, src);
  }
  fjg_graph_destroy(g);
}

static void bind_window(launch *l, const fjg_graph *g, const ref *r) {
  set_i32(l, g, "w", r->w);
}

static const int32_t doc_ids[9] = {0, 0, 0, 1, 1, 2, 2, 2, 2};
static const int32_t kv_doc_ids[9] = {0, 1, 1, 1, 2, 2, 2, 3, 3};

static void bind_doc(launch *l, const fjg_graph *g, const ref *r) {
  set_buffer(l, g, "doc", doc_ids, 9);
}

static void bind_two_docs(launch *l, const fjg_graph *g, const ref *r) {
  set_buffer(l, g, "doc", doc_ids, 9);
  set_buffer(l, g, "kvdoc", kv_doc_ids, 9);
}

static void test_causal(void **state) {
  (void)state;
  ref r = {0};
  check_mask("return { mask_mod = causal() }", &r, m_causal, NULL);
  check_mask("return { mask_mod = causal{align = 'top_left'} }", &r, m_causal,
             NULL);
  check_mask("return { mask_mod = causal{align = 'bottom_right'} }", &r,
             m_causal_br, NULL);
}

static void test_sliding_window(void **state) {
  (void)state;
  ref r = {0};
  r.w = 3;
  check_mask("return { mask_mod = sliding_window(3) }", &r, m_window, NULL);
  check_mask("local w = param('w', 'i32')\n"
             "return { mask_mod = sliding_window(w) }",
             &r, m_window, bind_window);
  /* The prelude writes q - kv < w as q - max(w, 0) < kv: the same pairs for
   * every window, the empty and the extreme ones included. */
  const int32_t extreme[] = {0, -5, 1, INT32_MIN, INT32_MAX, INT32_MAX - 3};
  for (size_t i = 0; i < sizeof extreme / sizeof extreme[0]; i++) {
    r.w = extreme[i];
    check_mask("local w = param('w', 'i32')\n"
               "return { mask_mod = sliding_window(w) }",
               &r, m_window, bind_window);
  }
  r.w = 2;
  check_mask("return { mask_mod = sliding_window(2, {align = 'bottom_right'}) }",
             &r, m_window_br, NULL);
  check_mask("return { mask_mod = sliding_window(2, {causal = false}) }", &r,
             m_window_sym, NULL);
}

static void test_prefix_lm(void **state) {
  (void)state;
  ref r = {0};
  r.w = 3;
  check_mask("return { mask_mod = prefix_lm(3) }", &r, m_prefix, NULL);
  check_mask("local w = param('w', 'i32')\n"
             "return { mask_mod = prefix_lm(w) }",
             &r, m_prefix, bind_window);
}

static void test_document(void **state) {
  (void)state;
  ref r = {0};
  r.doc = doc_ids;
  r.kv_doc = doc_ids;
  check_mask("return { mask_mod = document(buffer('doc', 'i32')) }", &r,
             m_document, bind_doc);
  check_mask("return { mask_mod = document(buffer('doc', 'i32'), "
             "{causal = false}) }",
             &r, m_document_any, bind_doc);
  r.kv_doc = kv_doc_ids;
  check_mask("local d, k = buffer('doc', 'i32'), buffer('kvdoc', 'i32')\n"
             "return { mask_mod = document(d, {kv_doc = k}) }",
             &r, m_document, bind_two_docs);
}

static void test_chunked_and_combinators(void **state) {
  (void)state;
  ref r = {0};
  r.w = 3;
  check_mask("return { mask_mod = chunked(3) }", &r, m_chunked, NULL);
  r.w = 2;
  check_mask("return { mask_mod = and_masks(causal(), prefix_lm(2), "
             "sliding_window(2, {causal = false})) }",
             &r, m_and, NULL);
  check_mask("return { mask_mod = or_masks(sliding_window(2), prefix_lm(2)) }",
             &r, m_or, NULL);
  check_mask("return { mask_mod = and_masks() }", &r, m_all, NULL);
  check_mask("return { mask_mod = noop_mask() }", &r, m_all, NULL);
  check_mask("return { mask_mod = or_masks() }", &r, m_none, NULL);
  check_mask("return { mask_mod = and_masks(causal(), function() return false "
             "end) }",
             &r, m_none, NULL);
}

/* ---- brute-force score mods ---- */

static double s_alibi(const ref *r, double s, int h, int q, int kv) {
  return s + exp2(-8.0 * (h + 1) / r->w) * (kv - q);
}
static double s_alibi_table(const ref *r, double s, int h, int q, int kv) {
  return s + r->table[h] * (double)(kv - q);
}
static double s_softcap(const ref *r, double s, int h, int q, int kv) {
  return r->c * tanh(s / r->c);
}
static double s_noop(const ref *r, double s, int h, int q, int kv) {
  return s;
}
static double s_relative(const ref *r, double s, int h, int q, int kv) {
  int i = q - kv + r->offset;
  return s + (i >= 0 && i < 16 ? r->table[i] : 0.0);
}
static double s_composed(const ref *r, double s, int h, int q, int kv) {
  return s_softcap(r, s_alibi(r, s, h, q, kv), h, q, kv);
}

static const float table16[16] = {0.5f,  -1.0f, 2.0f,  0.25f, -0.75f, 1.5f,
                                  3.0f,  -2.5f, 0.125f, 1.0f, -0.5f, 2.25f,
                                  -3.0f, 0.75f, 1.25f, -1.25f};

static void bind_table(launch *l, const fjg_graph *g, const ref *r) {
  set_buffer(l, g, "t", table16, 16);
}

static void bind_cap(launch *l, const fjg_graph *g, const ref *r) {
  set_f32(l, g, "cap", (float)r->c);
}

static void check_score(const char *src, const ref *r0, score_fn want,
                        void (*bind)(launch *, const fjg_graph *,
                                     const ref *)) {
  fjg_graph *g = trace_ok(src);
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    ref r = *r0;
    r.s = shapes[i];
    if (r0->w == 0)
      r.w = r.s.hq; /* alibi() takes the head count of the launch */
    if (r0->offset < 0)
      r.offset = r.s.lk - 1;
    launch l;
    launch_init(&l, r.s);
    if (bind)
      bind(&l, g, &r);
    expect_score(g, &l, &r, want, src);
  }
  fjg_graph_destroy(g);
}

static void test_alibi(void **state) {
  (void)state;
  ref r = {0};
  check_score("return { score_mod = alibi() }", &r, s_alibi, NULL);
  r.w = 8;
  check_score("return { score_mod = alibi(8) }", &r, s_alibi, NULL);
  r.table = table16;
  check_score("return { score_mod = alibi(buffer('t', 'f32')) }", &r,
              s_alibi_table, bind_table);
}

static void test_softcap_relative_compose(void **state) {
  (void)state;
  ref r = {0};
  r.c = 2.5;
  check_score("return { score_mod = softcap(2.5) }", &r, s_softcap, NULL);
  check_score("return { score_mod = softcap(param('cap', 'f32')) }", &r,
              s_softcap, bind_cap);
  check_score("return { score_mod = noop_score() }", &r, s_noop, NULL);
  r.table = table16;
  r.offset = -1; /* default: Lk - 1 */
  check_score("return { score_mod = relative_bias(buffer('t', 'f32')) }", &r,
              s_relative, bind_table);
  r.offset = 4;
  check_score("return { score_mod = relative_bias(buffer('t', 'f32'), "
              "{offset = 4}) }",
              &r, s_relative, bind_table);
  r.offset = 0;
  r.w = 4;
  check_score("return { score_mod = compose_scores(alibi(4), softcap(2.5)) }",
              &r, s_composed, NULL);
}

/* ---- the examples ---- */

static char *read_example(const char *name, size_t *len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/examples/%s", FJ_SOURCE_DIR, name);
  FILE *f = fopen(path, "rb");
  if (!f)
    fail_msg("cannot open %s", path);
  char *text = malloc(1 << 16);
  *len = fread(text, 1, (1 << 16) - 1, f);
  fclose(f);
  return text;
}

static fjg_graph *trace_example(const char *name, char **spec_name) {
  size_t len;
  char *text = read_example(name, &len);
  fjg_graph *g = NULL;
  char err[1024] = "";
  fj_status st = fjl_trace_spec(text, len, name, &g, spec_name, err, sizeof err);
  free(text);
  if (st != FJ_OK)
    fail_msg("%s: %s", name, err);
  return g;
}

static void test_examples_trace(void **state) {
  (void)state;
  static const struct {
    const char *file, *name;
    int has_mask, has_score;
  } examples[] = {
      {"causal.lua", "causal", 1, 0},
      {"causal_bottom_right.lua", "causal_bottom_right", 1, 0},
      {"sliding_window.lua", "sliding_window", 1, 0},
      {"prefix_lm.lua", "prefix_lm", 1, 0},
      {"document.lua", "document_causal", 1, 0},
      {"alibi.lua", "alibi_causal", 1, 1},
      {"softcap.lua", "softcap_causal", 1, 1},
      {"relative_buckets.lua", "t5_relative_buckets", 1, 1},
  };
  for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
    char *name = NULL;
    fjg_graph *g = trace_example(examples[i].file, &name);
    assert_non_null(name);
    assert_string_equal(name, examples[i].name);
    assert_int_equal(fjg_mask_root(g) >= 0, examples[i].has_mask);
    assert_int_equal(fjg_score_root(g) >= 0, examples[i].has_score);
    free(name);
    fjg_graph_destroy(g);
  }
}

/* T5 bucketing, written the way the T5 paper's code does it (with logs). */
static int t5_bucket(int n) {
  const int num_buckets = 32, max_distance = 128, exact = 16;
  if (n < exact)
    return n;
  int large = exact + (int)(log((double)n / exact) /
                            log((double)max_distance / exact) *
                            (num_buckets - exact));
  return large < num_buckets - 1 ? large : num_buckets - 1;
}

static void test_relative_buckets_example(void **state) {
  (void)state;
  fjg_graph *g = trace_example("relative_buckets.lua", NULL);
  enum { HQ = 2, L = 200 };
  static float bias[HQ * 32];
  for (int i = 0; i < HQ * 32; i++)
    bias[i] = (float)(i * 0.5 - 7);
  launch l;
  launch_init(&l, (shape){HQ, L, L});
  set_buffer(&l, g, "rel_bias", bias, HQ * 32);
  for (int h = 0; h < HQ; h++)
    for (int q = 0; q < L; q += 3)
      for (int kv = 0; kv <= q; kv++) {
        double want = 1.0 + bias[h * 32 + t5_bucket(q - kv)];
        double got = fjg_eval_score(g, &l.env, 1.0, 0, h, q, kv);
        if (fabs(got - want) > 1e-6)
          fail_msg("h=%d q=%d kv=%d (bucket %d): got %g want %g", h, q, kv,
                   t5_bucket(q - kv), got, want);
      }
  fjg_graph_destroy(g);
}

static void test_prelude_is_embedded(void **state) {
  (void)state;
  size_t len = 0;
  const char *text = fjl_prelude_source("prelude.lua", &len);
  assert_non_null(text);
  assert_true(len > 100);
  assert_int_equal(strlen(text), len);
  assert_null(fjl_prelude_source("nope.lua", NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_causal),
      cmocka_unit_test(test_sliding_window),
      cmocka_unit_test(test_prefix_lm),
      cmocka_unit_test(test_document),
      cmocka_unit_test(test_chunked_and_combinators),
      cmocka_unit_test(test_alibi),
      cmocka_unit_test(test_softcap_relative_compose),
      cmocka_unit_test(test_examples_trace),
      cmocka_unit_test(test_relative_buckets_example),
      cmocka_unit_test(test_prelude_is_embedded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
