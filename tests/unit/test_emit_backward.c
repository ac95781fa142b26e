/* tests/unit/test_emit_backward.c: the backward hooks of gen/emit_cuda.c
 * (struct fj_user_grads, fj_score_grad) and the backward translation unit.
 *
 * The emitted prologue and hooks are compiled for the HOST with g++ (CUDA
 * qualifiers defined away, the round-to-nearest intrinsics as plain float
 * operations, atomicAdd as a plain add, no contraction) and run:
 * fj_score_grad's return value and the gradients it adds must be ds times
 * the derivative's nodes (gen/derivative.c) as the CPU evaluator computes
 * them, on the prelude's score_mods (alibi, softcap, relative_bias, T5
 * buckets with a trainable table) and random score_mods reading a
 * trainable buffer; and on tiles (fj_grad_tile, where a read's index is one
 * value over the tile, and fj_grad_tile_end) as element by element. NVRTC compiles the hooks for sm_80. Adding the
 * derivative to a graph leaves the forward translation unit's bytes as
 * they were. */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <nvrtc.h>

#include "gen/config.h"
#include "gen/derivative.h"
#include "gen/emit_cuda.h"
#include "gen/eval.h"
#include "gen/graph.h"
#include "gen/templates.h"
#include "tests/unit/host_prelude.h"
#include "lua/spec.h"

static uint64_t rng_state = 0x8c3a5f1e2d4b6978ull;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}
static int range(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); }

static fjg_graph *trace(const char *src) {
  fjg_graph *g = NULL;
  char err[1024] = "";
  if (fjl_trace_spec(src, strlen(src), "spec.lua", &g, NULL, err, sizeof err) != FJ_OK)
    fail_msg("trace failed: %s\n%s", err, src);
  return g;
}

static fjg_config sm80_config(void) {
  fjg_config c;
  memset(&c, 0, sizeof c);
  c.head_dim = 128;
  c.dtype = FJ_DTYPE_BF16;
  snprintf(c.arch, sizeof c.arch, "sm_80");
  c.sm = 80;
  c.block_m = 128;
  c.block_n = 64;
  c.num_warps = 4;
  c.num_stages = 2;
  c.threads = 128;
  c.template_name = "sm80";
  return c;
}

/* ---- layout ---- */

/* What the emitted struct is for trainable rel and slopes among other
 * arguments, written by hand. */
struct grads_mirror {
  float *g_rel;
  float *g_slopes;
};

static void test_user_grads_layout(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  fjg_param(g, "w", FJG_I32);
  int rel = fjg_buffer(g, "rel", FJG_F32);
  fjg_buffer(g, "ids", FJG_I32);
  fjg_buffer(g, "frozen", FJG_F32);
  int slopes = fjg_buffer(g, "slopes", FJG_F32);
  assert_int_equal(fjg_set_trainable(g, slopes), 0);
  assert_int_equal(fjg_set_trainable(g, rel), 0);
  assert_int_equal(fjg_user_grads_size(g), sizeof(struct grads_mirror));
  uint64_t ptrs[5] = {0x11, 0x1000, 0x22, 0x33, 0x2000};
  struct grads_mirror m;
  memset(&m, 0xff, sizeof m);
  fjg_user_grads_pack(g, ptrs, &m);
  assert_int_equal((uintptr_t)m.g_rel, 0x1000);
  assert_int_equal((uintptr_t)m.g_slopes, 0x2000);
  fjg_buf b;
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_backward_hooks(g, &b), FJ_OK);
  assert_non_null(strstr(b.data, "struct fj_user_grads {\n  float *g_rel;\n"
                                 "  float *g_slopes;\n};\n"));
  /* No derivative (no score_mod): the score passes unchanged. */
  assert_non_null(strstr(b.data, "int kv, float ds) {\n  return ds;\n}\n"));
  /* ... and no slot to flush. */
  assert_non_null(strstr(b.data, "struct fj_grad_cache {\n};\n"));
  fjg_buf_free(&b);
  fjg_graph_destroy(g);

  /* None trainable: one zeroed placeholder, so the struct is never empty. */
  g = fjg_graph_create();
  fjg_buffer(g, "frozen", FJG_F32);
  assert_int_equal(fjg_user_grads_size(g), 8);
  unsigned char bytes[8];
  memset(bytes, 0xff, sizeof bytes);
  fjg_user_grads_pack(g, NULL, bytes);
  for (int i = 0; i < 8; i++) assert_int_equal(bytes[i], 0);
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_backward_hooks(g, &b), FJ_OK);
  assert_non_null(strstr(b.data, "struct fj_user_grads {\n  long long fj_reserved_;\n};\n"));
  fjg_buf_free(&b);
  fjg_graph_destroy(g);
}

/* ---- the forward unit does not change ---- */

static const char *const example_specs[] = {
    "return { mask_mod = causal(), score_mod = alibi() }",
    "local cap = param('cap', 'f32')\nreturn { score_mod = softcap(cap) }",
    "local bias = buffer('rel_bias', 'f32', {grad = true})\n"
    "return { mask_mod = causal(), score_mod = relative_bias(bias) }",
    "local slopes = buffer('slopes', 'f32', {grad = true})\n"
    "local bias = buffer('bias', 'f32', {grad = true})\n"
    "return { score_mod = compose_scores(alibi(slopes), relative_bias(bias, {offset = 6}),\n"
    "                                    softcap(20.0)) }",
    /* T5 buckets with a trainable table: examples/relative_buckets.lua */
    "local num_buckets, max_distance = 8, 32\n"
    "local exact = num_buckets // 2\n"
    "local bias = buffer('rel_bias', 'f32', {grad = true})\n"
    "local thresholds = {}\n"
    "for k = 1, num_buckets - exact - 1 do\n"
    "  thresholds[k] = math.ceil(exact * (max_distance / exact) ^ (k / (num_buckets - exact)))\n"
    "end\n"
    "return { mask_mod = causal(), score_mod = function(score, b, h, q, kv)\n"
    "  local n = max(q - kv, 0)\n"
    "  local index = min(n, exact)\n"
    "  for k = 1, #thresholds do index = index + where(ge(n, thresholds[k]), 1, 0) end\n"
    "  return score + bias[h * num_buckets + index]\nend }",
    /* Kinks and branches on the score, two reads of one trainable table,
     * a frozen f32 buffer and an f32 param. */
    "local t = buffer('t', 'f32', {grad = true})\n"
    "local frozen = buffer('frozen', 'f32')\n"
    "local w = param('w', 'f32')\n"
    "return { score_mod = function(s, b, h, q, kv)\n"
    "  local x = abs(s - t[h]) * w + max(s, t[kv % 8]) - min(s * 0.5, frozen[q % 8])\n"
    "  local y = where(gt(s, 0.25), sqrt(abs(s) + 1) * t[h], exp(s * 0.125) / 3)\n"
    "  return x + y + floor(s) + log(abs(t[kv % 8]) + 1)\nend }",
    /* Derivatives inf at score 0 (and at t[h] == 0 for the buffer). */
    "local t = buffer('t', 'f32', {grad = true})\n"
    "return { score_mod = function(s, b, h, q, kv)\n"
    "  return log(abs(s * t[h])) + sqrt(abs(s)) end }",
    /* A score_mod with no trainable buffer, and none at all. */
    "return { score_mod = function(s, b, h, q, kv) return tanh(s / 7) * 7 - (q - kv) / 16 end }",
    "local doc = buffer('doc', 'i32')\n"
    "local g = buffer('g', 'f32', {grad = true})\n"
    "return { mask_mod = function(b, h, q, kv) return eq(doc[q], doc[kv]) & gt(g[kv], 0.0) end }",
};
enum { NUM_EXAMPLES = sizeof example_specs / sizeof example_specs[0] };

/* ---- the backward unit ---- */

static void test_backward_unit(void **state) {
  (void)state;
  fjg_graph *g = trace(example_specs[2]);
  fjg_config c = sm80_config();
  fjg_buf b;
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_backward_tu(g, NULL, &b), FJ_EINVAL);
  c.template_name = "sm999";
  assert_int_equal(fjg_emit_backward_tu(g, &c, &b), FJ_ENOTFOUND);
  fjg_buf_free(&b);
  for (int t = 0; t < 2; t++) {
    c = sm80_config();
    c.template_name = t ? "sm90" : "sm80";
    const char *const *parts = fjg_template_parts(c.template_name, "backward");
    fjg_buf_init(&b);
    fj_status st = fjg_emit_backward_tu(g, &c, &b);
    if (!parts) { /* the template has no backward kernel */
      assert_int_equal(st, FJ_ENOTFOUND);
      fjg_buf_free(&b);
      continue;
    }
    assert_int_equal(st, FJ_OK);
    const char *s = b.data, *p = s;
    assert_true(strncmp(s, "#define FJ_HEAD_DIM 128\n", 24) == 0);
    assert_non_null(strstr(s, "#define FJ_HAS_SCORE_MOD 1\n"));
    /* The parts in order, the hooks right after the prologue. */
    for (const char *const *part = parts; *part; part++) {
      char line[256];
      if (strcmp(*part, FJG_PART_PROLOGUE) == 0) {
        p = strstr(p, "// ---- end of generated prologue ----\n");
        assert_non_null(p);
        p += strlen("// ---- end of generated prologue ----\n");
        assert_true(strncmp(p, "// ---- generated backward hooks", 32) == 0);
        continue;
      }
      snprintf(line, sizeof line, "// ---- template %s ----\n", *part);
      p = strstr(p, line);
      if (!p) fail_msg("part %s missing or out of order", *part);
    }
    fjg_buf_free(&b);
  }
  fjg_graph_destroy(g);
}

/* Whether g's backward unit (sm80) defines flag as 1. */
static int backward_defines(const fjg_graph *g, const char *flag) {
  fjg_config c = sm80_config();
  fjg_buf b;
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_backward_tu(g, &c, &b), FJ_OK);
  char line[96];
  snprintf(line, sizeof line, "#define %s 1\n", flag);
  const int found = strstr(b.data, line) != NULL;
  fjg_buf_free(&b);
  return found;
}

/* A spec and whether its backward unit defines a flag. */
typedef struct flag_case {
  const char *src;
  int defined;
} flag_case;

/* Each case's backward unit defines flag as the case says; the forward unit
 * never names it. */
static void check_flag(const char *flag, const flag_case *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    fjg_graph *g = trace(cases[i].src);
    const int defined = backward_defines(g, flag);
    if (defined != cases[i].defined)
      fail_msg("case %zu: %s %d, expected %d\n%s", i, flag, defined, cases[i].defined,
               cases[i].src);
    fjg_config c = sm80_config();
    fjg_buf b;
    fjg_buf_init(&b);
    assert_int_equal(fjg_emit_forward_tu(g, &c, &b), FJ_OK);
    assert_null(strstr(b.data, flag));
    fjg_buf_free(&b);
    fjg_graph_destroy(g);
  }
}

/* FJ_SCORE_GRAD_ONE marks the backward units of additive score_mods (the
 * derivative with respect to the score the constant 1, each trainable
 * read's 0 or 1): ALiBi, a frozen or trainable bias; not softcap, trainable
 * ALiBi slopes, a trainable scale or no score_mod. */
static void test_score_grad_one(void **state) {
  (void)state;
  static const flag_case cases[] = {
      {"return { mask_mod = causal(), score_mod = alibi() }", 1},
      {"local bias = buffer('bias', 'f32')\n"
       "return { score_mod = function(s, b, h, q, kv) return s + bias[q - kv + 8] end }", 1},
      {"local cap = param('cap', 'f32')\nreturn { score_mod = softcap(cap) }", 0},
      {"local bias = buffer('rel_bias', 'f32', {grad = true})\n"
       "return { mask_mod = causal(), score_mod = relative_bias(bias) }", 1},
      {"local slopes = buffer('slopes', 'f32', {grad = true})\n"
       "return { score_mod = function(s, b, h, q, kv) return s + slopes[h] * (kv - q) end }", 0},
      {"local t = buffer('t', 'f32', {grad = true})\n"
       "return { score_mod = function(s, b, h, q, kv) return s * t[h] end }", 0},
      {"return { mask_mod = causal() }", 0},
      {"return { score_mod = function(s, b, h, q, kv) return s * 2 end }", 0},
  };
  check_flag("FJ_SCORE_GRAD_ONE", cases, sizeof cases / sizeof cases[0]);
}

/* FJ_GRAD_DIAGONAL: defined where every trainable read's index reads q (a
 * relative position, a per-query element), not for an index of kv alone,
 * nor without trainable reads. */
static void test_grad_diagonal(void **state) {
  (void)state;
  static const flag_case cases[] = {
      {"local bias = buffer('rel_bias', 'f32', {grad = true})\n"
       "return { mask_mod = causal(), score_mod = relative_bias(bias) }", 1},
      {"local t = buffer('t', 'f32', {grad = true})\n"
       "return { score_mod = function(s, b, h, q, kv) return s + t[q] end }", 1},
      {"local t = buffer('t', 'f32', {grad = true})\n"
       "return { score_mod = function(s, b, h, q, kv) return s + t[kv] end }", 0},
      {"local t = buffer('t', 'f32', {grad = true})\n"
       "return { score_mod = function(s, b, h, q, kv) return s + t[q - kv + 8] + t[kv] end }",
       0},
      {"local t = buffer('t', 'f32', {grad = true})\n"
       "return { score_mod = function(s, b, h, q, kv) return s + t[h] end }", 0},
      {"local bias = buffer('bias', 'f32')\n"
       "return { score_mod = function(s, b, h, q, kv) return s + bias[q - kv + 8] end }", 0},
      {"return { mask_mod = causal(), score_mod = alibi() }", 0},
  };
  check_flag("FJ_GRAD_DIAGONAL", cases, sizeof cases / sizeof cases[0]);
}

/* FJ_MASK_LOADS: defined where the mask_mod reads a buffer
 * (document ids, per-batch lengths), not for an index-only mask, no mask, a
 * constant-true one, or a buffer read by the score_mod alone. */
static void test_mask_loads(void **state) {
  (void)state;
  static const flag_case cases[] = {
      {"local doc = buffer('doc', 'i32')\n"
       "return { mask_mod = and_masks(causal(), function(b, h, q, kv)\n"
       "  return eq(doc[q], doc[kv]) end) }", 1},
      {"local n = buffer('n', 'i32')\n"
       "return { mask_mod = function(b, h, q, kv) return lt(kv, n[b]) end }", 1},
      {"return { mask_mod = causal() }", 0},
      {"local w = param('window', 'i32')\nreturn { mask_mod = sliding_window(w) }", 0},
      {"return { mask_mod = function(b, h, q, kv) return true end }", 0},
      {"return { score_mod = noop_score() }", 0},
      {"local bias = buffer('bias', 'f32')\n"
       "return { mask_mod = causal(), score_mod = function(s, b, h, q, kv)\n"
       "  return s + bias[q - kv + 8] end }", 0},
  };
  check_flag("FJ_MASK_LOADS", cases, sizeof cases / sizeof cases[0]);
}

/* The hooks are valid CUDA: the prologue and hooks of every example, with
 * a kernel calling fj_score_grad, through NVRTC for sm_80. */
static void test_hooks_compile_with_nvrtc(void **state) {
  (void)state;
  fjg_buf src;
  fjg_buf_init(&src);
  size_t len;
  const char *common = fjg_template_text("common/fj_common.cuh", &len);
  assert_non_null(common);
  fjg_buf_append(&src, common, len);
  const char *grad = fjg_template_text("common/fj_grad.cuh", &len);
  assert_non_null(grad);
  fjg_buf_append(&src, grad, len);
  assert_int_equal(fjg_emit_interval_rules(NULL, &src), FJ_OK);
  for (int i = 0; i < NUM_EXAMPLES; i++) {
    fjg_graph *g = trace(example_specs[i]);
    fjg_buf_printf(&src, "namespace g%d {\n", i);
    assert_int_equal(fjg_emit_prologue(g, &src), FJ_OK);
    assert_int_equal(fjg_emit_backward_hooks(g, &src), FJ_OK);
    fjg_buf_printf(&src,
        "__global__ void k(fj_user_params u, fj_user_grads gr, fj_sizes z, float *out) {\n"
        "  fj_grad_cache gc;\n"
        "  out[threadIdx.x] = fj_score_grad(u, gr, gc, z, out[threadIdx.x], 0, 1, threadIdx.x, 3,"
        " 0.5f);\n"
        "  fj_grad_flush(gr, gc);\n"
        "}\n}\n");
    fjg_graph_destroy(g);
  }
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, src.data, "bwd_hooks.cu", 0, NULL, NULL),
                   NVRTC_SUCCESS);
  const char *opts[] = {"--gpu-architecture=sm_80", "-std=c++17", "-default-device"};
  nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    char *log = calloc(1, n + 1);
    nvrtcGetProgramLog(prog, log);
    fail_msg("NVRTC failed on the hooks: %s\n%.4000s", nvrtcGetErrorString(r), log);
  }
  nvrtcDestroyProgram(&prog);
  fjg_buf_free(&src);
}

/* ---- host execution ---- */

enum { BUF_LEN = 24, NUM_RANDOM = 60, MAX_GRAPHS = NUM_EXAMPLES + NUM_RANDOM };

/* A random f32 expression over the score, indices, an f32 param, a frozen
 * f32 buffer and the trainable buffer `t` at small indices (some outside
 * it), with every op the derivative handles. */
typedef struct rgen {
  fjg_graph *g;
  int t, frozen, w;
} rgen;

static int r_index(rgen *r) {
  fjg_graph *g = r->g;
  int q = fjg_input_node(g, FJG_IN_Q), kv = fjg_input_node(g, FJG_IN_KV);
  switch (range(0, 3)) {
  case 0: return fjg_input_node(g, FJG_IN_H);
  case 1: return fjg_binary(g, FJG_OP_SUB, q, kv); /* negative half the time */
  case 2: return fjg_binary(g, FJG_OP_MOD, fjg_binary(g, FJG_OP_ADD, q, kv),
                            fjg_const_i32(g, BUF_LEN + 4)); /* past the end at times */
  default: return fjg_binary(g, FJG_OP_MOD, kv, fjg_const_i32(g, 8));
  }
}

static int r_expr(rgen *r, int depth) {
  fjg_graph *g = r->g;
  static const fjg_op bins[] = {FJG_OP_ADD, FJG_OP_SUB, FJG_OP_MUL, FJG_OP_DIV,
                                FJG_OP_MIN, FJG_OP_MAX, FJG_OP_MOD, FJG_OP_IDIV};
  static const fjg_op uns[] = {FJG_OP_TANH, FJG_OP_ABS, FJG_OP_NEG, FJG_OP_FLOOR,
                               FJG_OP_CEIL};
  if (depth <= 0 || range(0, 4) == 0) {
    switch (range(0, 6)) {
    case 0: case 1: return fjg_input_node(g, FJG_IN_SCORE);
    case 2: return fjg_const_f32(g, (float)range(-64, 64) / 16.0f);
    case 3: return fjg_unary(g, FJG_OP_TO_F32, r_index(r));
    case 4: return fjg_binary(g, FJG_OP_MUL, r->w, fjg_load(g, r->frozen, r_index(r)));
    default: return fjg_load(g, r->t, r_index(r));
    }
  }
  int a = r_expr(r, depth - 1);
  switch (range(0, 8)) {
  case 0: return fjg_unary(g, uns[range(0, 4)], a);
  case 1: /* exp and log of bounded / positive values */
    return fjg_unary(g, FJG_OP_EXP, fjg_unary(g, FJG_OP_TANH, a));
  case 2:
    return fjg_unary(g, range(0, 1) ? FJG_OP_LOG : FJG_OP_SQRT,
                     fjg_binary(g, FJG_OP_ADD, fjg_unary(g, FJG_OP_ABS, a),
                                fjg_const_f32(g, 0.5f)));
  case 3: {
    int b = r_expr(r, depth - 1);
    return fjg_where(g, fjg_binary(g, FJG_OP_LT, a, fjg_const_f32(g, 0.25f)), a, b);
  }
  default: {
    fjg_op op = bins[range(0, 7)];
    int b = r_expr(r, depth - 1);
    if (op == FJG_OP_DIV || op == FJG_OP_MOD || op == FJG_OP_IDIV)
      b = fjg_binary(g, FJG_OP_ADD, fjg_unary(g, FJG_OP_ABS, b), fjg_const_f32(g, 1.0f));
    return fjg_binary(g, op, a, b);
  }
  }
}

static void set_derivative(fjg_graph *g) {
  fjg_derivative d;
  char err[256];
  if (fjg_derive_score(g, fjg_trainable_args(g), &d, err, sizeof err) != FJ_OK)
    fail_msg("derive: %s", err);
  if (fjg_set_derivative(g, &d) != 0) fail_msg("set derivative: %s", fjg_graph_error(g));
}

/* A random score_mod reading the trainable buffer `t`; with its
 * derivative set when `derive`. */
static fjg_graph *random_graph(int derive) {
  fjg_graph *g = fjg_graph_create();
  rgen r = {g, fjg_buffer(g, "t", FJG_F32), fjg_buffer(g, "frozen", FJG_F32),
            fjg_param(g, "w", FJG_F32)};
  assert_true(r.t == 0 && r.frozen == 1 && r.w >= 0);
  assert_int_equal(fjg_set_trainable(g, r.t), 0);
  int root = r_expr(&r, range(1, 5));
  assert_true(root >= 0);
  assert_int_equal(fjg_set_score_root(g, root), 0);
  if (derive) set_derivative(g);
  return g;
}

/* The forward unit's bytes are its cache key: adding the derivative to a
 * graph (as loading a spec does) leaves them as they were, and it has no
 * backward hook. */
static void test_forward_unit_unchanged(void **state) {
  (void)state;
  fjg_config c = sm80_config();
  for (int i = 0; i < 40; i++) {
    fjg_graph *g = random_graph(0);
    if (i % 2) { /* and a mask reading the trainable buffer */
      int m = fjg_binary(g, FJG_OP_GT, fjg_load(g, 0, fjg_input_node(g, FJG_IN_KV)),
                         fjg_const_f32(g, 0.0f));
      assert_int_equal(fjg_set_mask_root(g, m), 0);
    }
    fjg_buf a, b;
    fjg_buf_init(&a);
    fjg_buf_init(&b);
    assert_int_equal(fjg_emit_forward_tu(g, &c, &a), FJ_OK);
    set_derivative(g);
    assert_non_null(fjg_graph_derivative(g));
    assert_int_equal(fjg_emit_forward_tu(g, &c, &b), FJ_OK);
    if (a.len != b.len || memcmp(a.data, b.data, a.len) != 0)
      fail_msg("graph %d: the derivative changed the forward unit", i);
    assert_null(strstr(b.data, "fj_score_grad"));
    assert_null(strstr(b.data, "fj_user_grads"));
    fjg_buf_free(&a);
    fjg_buf_free(&b);
    fjg_graph_destroy(g);
  }
}

static const char *const host_prelude = FJT_HOST_PRELUDE FJT_HOST_ATOMIC;

typedef float (*grad_fn)(const void *u, const void *gr, const int *z, float s, int b, int h,
                         int q, int kv, float ds);

/* One C++ file with every graph's prologue and hooks in a namespace and
 * an extern "C" entry point each, built into a shared object. */
static void *build_host_library(fjg_graph **graphs, int n, const char *dir) {
  fjg_buf src;
  fjg_buf_init(&src);
  fjg_buf_printf(&src, "%s", host_prelude);
  size_t len;
  const char *common = fjg_template_text("common/fj_common.cuh", &len);
  fjg_buf_append(&src, common, len);
  const char *grad = fjg_template_text("common/fj_grad.cuh", &len);
  fjg_buf_append(&src, grad, len);
  assert_int_equal(fjg_emit_interval_rules(NULL, &src), FJ_OK);
  for (int i = 0; i < n; i++) {
    fjg_buf_printf(&src, "namespace g%d {\n", i);
    assert_int_equal(fjg_emit_prologue(graphs[i], &src), FJ_OK);
    assert_int_equal(fjg_emit_backward_hooks(graphs[i], &src), FJ_OK);
    fjg_buf_printf(&src,
        "}\nextern \"C\" float grad_%d(const void *u, const void *gr, const int *z, float s,\n"
        "    int b, int h, int q, int kv, float ds) {\n"
        "  g%d::fj_grad_cache gc;\n"
        "  const float r = g%d::fj_score_grad(*(const g%d::fj_user_params *)u,\n"
        "      *(const g%d::fj_user_grads *)gr, gc, *(const fj_sizes *)z, s, b, h, q, kv, ds);\n"
        "  g%d::fj_grad_flush(*(const g%d::fj_user_grads *)gr, gc);\n"
        "  return r;\n}\n",
        i, i, i, i, i, i, i);
    /* A tile as the kernels run it: fj_grad_tile, fj_score_grad on every
     * element (row-major), fj_grad_tile_end; *one counts the reads whose
     * index fj_grad_tile found to be one value. */
    fjg_buf_printf(&src,
        "extern \"C\" void tile_%d(const void *u, const void *gr, const int *z, int b, int h,\n"
        "    int q0, int q1, int kv0, int kv1, const float *s, const float *ds, float *ret,\n"
        "    int *one) {\n"
        "  const g%d::fj_user_params &uu = *(const g%d::fj_user_params *)u;\n"
        "  const g%d::fj_user_grads &gg = *(const g%d::fj_user_grads *)gr;\n"
        "  const fj_sizes &zz = *(const fj_sizes *)z;\n"
        "  g%d::fj_grad_cache gc;\n"
        "  g%d::fj_grad_tile(uu, zz, b, h, q0, q1, kv0, kv1, gc);\n"
        "  *one = 0",
        i, i, i, i, i, i, i);
    const fjg_derivative *d = fjg_graph_derivative(graphs[i]);
    for (int r = 0; d && r < d->num_buffer_grads; r++) {
      const fjg_node *gn = fjg_node_at(graphs[i], d->buffer_grads[r].grad);
      if (!(gn->op == FJG_OP_CONST && gn->imm.f == 0.0f))
        fjg_buf_printf(&src, " + (gc.u%d != FJ_GRAD_VARIES)", r);
    }
    fjg_buf_printf(&src,
        ";\n  int e = 0;\n"
        "  for (int q = q0; q <= q1; q++)\n"
        "    for (int kv = kv0; kv <= kv1; kv++, e++)\n"
        "      ret[e] = g%d::fj_score_grad(uu, gg, gc, zz, s[e], b, h, q, kv, ds[e]);\n"
        "  g%d::fj_grad_tile_end(gg, gc);\n"
        "  g%d::fj_grad_flush(gg, gc);\n}\n",
        i, i, i);
    /* The same tile through fj_grad_bufs, as the sm90 kernel's split step
     * runs an additive score_mod. */
    fjg_buf_printf(&src,
        "extern \"C\" void bufs_%d(const void *u, const void *gr, const int *z, int b, int h,\n"
        "    int q0, int q1, int kv0, int kv1, const float *ds) {\n"
        "  const g%d::fj_user_params &uu = *(const g%d::fj_user_params *)u;\n"
        "  const g%d::fj_user_grads &gg = *(const g%d::fj_user_grads *)gr;\n"
        "  const fj_sizes &zz = *(const fj_sizes *)z;\n"
        "  g%d::fj_grad_cache gc;\n"
        "  g%d::fj_grad_tile(uu, zz, b, h, q0, q1, kv0, kv1, gc);\n"
        "  int e = 0;\n"
        "  for (int q = q0; q <= q1; q++)\n"
        "    for (int kv = kv0; kv <= kv1; kv++, e++)\n"
        "      g%d::fj_grad_bufs(uu, gg, gc, zz, b, h, q, kv, ds[e]);\n"
        "  g%d::fj_grad_tile_end(gg, gc);\n"
        "  g%d::fj_grad_flush(gg, gc);\n}\n",
        i, i, i, i, i, i, i, i, i, i);
  }
  assert_false(src.failed);
  char cpp[512], so[512], cmd[1600];
  snprintf(cpp, sizeof cpp, "%s/emitted_bwd.cpp", dir);
  snprintf(so, sizeof so, "%s/emitted_bwd.so", dir);
  FILE *f = fopen(cpp, "wb");
  assert_non_null(f);
  fwrite(src.data, 1, src.len, f);
  fclose(f);
  fjg_buf_free(&src);
  snprintf(cmd, sizeof cmd, "g++ -std=c++17 -O1 -ffp-contract=off -fPIC -shared -w -o %s %s", so,
           cpp);
  if (system(cmd) != 0) fail_msg("host compile failed: %s", cmd);
  void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!lib) fail_msg("dlopen: %s", dlerror());
  return lib;
}

typedef struct point {
  float s;
  int b, h, q, kv;
} point;

/* Node `id` at p as the CPU evaluator computes it (the graph's score root
 * set to it for the call; i32 nodes come back converted exactly, being
 * small). *jump is set where the value depends on a decision the CPU cannot
 * make the kernel's way. */
static double node_value(fjg_graph *g, const fjg_env *env, int id, const point *p, int *jump) {
  const int saved = fjg_score_root(g);
  assert_int_equal(fjg_set_score_root(g, id), 0);
  fjg_evaluator ev;
  assert_int_equal(fjg_evaluator_init(&ev, g, env), FJ_OK);
  int uncertain = 0;
  double v = fjg_eval_score_f32(&ev, p->s, p->b, p->h, p->q, p->kv, &uncertain);
  *jump |= uncertain;
  fjg_evaluator_free(&ev);
  assert_int_equal(fjg_set_score_root(g, saved), 0);
  return v;
}

static int close_to(double got, double want) {
  if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
  if (isinf(want) || isinf(got)) return got == want;
  return fabs(got - want) <= 2e-5 * (1 + fabs(want));
}

/* A graph's arguments for the emitted code on the host: every buffer
 * BUF_LEN long (f32 values, i32 document ids), random params, packed as
 * fj_user_params. */
typedef struct host_args {
  float fdata[8][BUF_LEN];
  int32_t idata[8][BUF_LEN];
  const void *data[8];
  int32_t i32s[8];
  float f32s[8];
  uint64_t ptrs[8];
  int64_t lens[8];
  unsigned char params[512];
} host_args;

static void host_args_fill(host_args *A, fjg_graph *g) {
  memset(A, 0, sizeof *A);
  const int nargs = fjg_num_args(g);
  assert_true(nargs <= 8);
  for (int a = 0; a < nargs; a++) {
    const fjg_arg *arg = fjg_arg_at(g, a);
    for (int j = 0; j < BUF_LEN; j++)
      A->fdata[a][j] = (float)range(-96, 96) / 32.0f, A->idata[a][j] = range(0, 2);
    A->f32s[a] = (float)range(8, 64) / 16.0f;
    A->i32s[a] = range(1, 9);
    A->data[a] = arg->type == FJG_F32 ? (const void *)A->fdata[a] : (const void *)A->idata[a];
    A->ptrs[a] = (uint64_t)(uintptr_t)A->data[a];
    A->lens[a] = BUF_LEN;
  }
  assert_true(fjg_user_params_size(g) <= sizeof A->params);
  fjg_user_params_pack(g, A->i32s, A->f32s, A->ptrs, A->lens, A->params);
}

/* fj_user_grads pointing at gdata[a] for each trainable argument a. */
static void host_grads(fjg_graph *g, float (*gdata)[BUF_LEN], unsigned char out[128]) {
  uint64_t p[8] = {0};
  for (int a = 0; a < fjg_num_args(g); a++) p[a] = (uint64_t)(uintptr_t)gdata[a];
  assert_true(fjg_user_grads_size(g) <= 128);
  fjg_user_grads_pack(g, p, out);
}

/* Checks fj_score_grad of graph i at random points: the return value and
 * the gradient buffers against the derivative's nodes. */
static int check_graph(void *lib, int i, fjg_graph *g) {
  char name[32];
  snprintf(name, sizeof name, "grad_%d", i);
  grad_fn grad = (grad_fn)dlsym(lib, name);
  assert_non_null(grad);
  const int nargs = fjg_num_args(g);
  host_args A;
  host_args_fill(&A, g);
  float gdata[8][BUF_LEN], want[8][BUF_LEN];
  unsigned char grads[128];
  host_grads(g, gdata, grads);
  fjg_env env = {{2, 4, 2, 40, 40}, 0, 0, A.i32s, A.f32s, A.data, A.lens};
  const fjg_derivative *d = fjg_graph_derivative(g);
  int checked = 0;
  for (int t = 0; t < 60; t++) {
    point p = {(float)range(-300, 300) / 32.0f, range(0, 1), range(0, 3), range(0, 39),
               range(0, 39)};
    float ds = t % 10 == 9 ? 0.0f : (float)range(-64, 64) / 16.0f;
    if (t < 2) p.s = 0.0f, ds = (float)t; /* where log and sqrt have inf slopes */
    memset(gdata, 0, sizeof gdata);
    memset(want, 0, sizeof want);
    float got = grad(A.params, grads, env.sizes, p.s, p.b, p.h, p.q, p.kv, ds);
    int jump = 0;
    double dscore = d ? node_value(g, &env, d->dscore, &p, &jump) : 1.0;
    for (int r = 0; d && r < d->num_buffer_grads; r++) {
      const fjg_buffer_grad *bg = &d->buffer_grads[r];
      int at = (int)node_value(g, &env, bg->index, &p, &jump);
      float v = (float)node_value(g, &env, bg->grad, &p, &jump);
      if (at >= 0 && at < BUF_LEN && ds != 0) want[bg->buffer][at] += ds * v;
    }
    if (ds == 0 && d) dscore = 0; /* no contribution, even from inf or NaN */
    if (jump) continue; /* the kernel's value there cannot be predicted */
    checked++;
    if (!close_to(got, (double)(ds * (float)dscore)))
      fail_msg("graph %d at s=%g b=%d h=%d q=%d kv=%d: fj_score_grad returned %.9g, "
               "ds * dscore = %.9g", i, p.s, p.b, p.h, p.q, p.kv, got, ds * dscore);
    for (int a = 0; a < nargs; a++)
      for (int j = 0; j < BUF_LEN; j++) {
        int trainable = fjg_arg_at(g, a)->trainable;
        if (!trainable ? gdata[a][j] != 0 : !close_to(gdata[a][j], want[a][j]))
          fail_msg("graph %d at s=%g b=%d h=%d q=%d kv=%d: gradient of %s[%d] %.9g, "
                   "expected %.9g", i, p.s, p.b, p.h, p.q, p.kv, fjg_arg_at(g, a)->name, j,
                   gdata[a][j], want[a][j]);
      }
  }
  return checked;
}

typedef void (*tile_fn)(const void *u, const void *gr, const int *z, int b, int h, int q0,
                        int q1, int kv0, int kv1, const float *s, const float *ds, float *ret,
                        int *one);
typedef void (*bufs_fn)(const void *u, const void *gr, const int *z, int b, int h, int q0,
                        int q1, int kv0, int kv1, const float *ds);

/* Whether g's score_mod is additive, as gen/emit_cuda.c decides where it
 * defines FJ_SCORE_GRAD_ONE: dscore the constant 1, each trainable read's
 * derivative the constant 0 or 1 at an index that does not read the
 * score. */
static int additive(fjg_graph *g) {
  const fjg_derivative *d = fjg_graph_derivative(g);
  if (!d) return 0;
  for (int r = 0; r < d->num_buffer_grads; r++) {
    const fjg_node *gn = fjg_node_at(g, d->buffer_grads[r].grad);
    if (gn->op != FJG_OP_CONST || (gn->imm.f != 0.0f && gn->imm.f != 1.0f) ||
        (fjg_input_deps(g, d->buffer_grads[r].index) & (1u << FJG_IN_SCORE)))
      return 0;
  }
  const fjg_node *n = fjg_node_at(g, d->dscore);
  return n->op == FJG_OP_CONST && n->imm.f == 1.0f;
}

/* Graph i on random tiles (up to 6 x 6, some of one row or column) through
 * tile_i, against fj_score_grad element by element (grad_i, itself checked
 * against the evaluator): the same return values and, up to the order of
 * the sums, the same gradients. Returns how many tiles had a read whose
 * index fj_grad_tile found to be one value. */
static int check_tiles(void *lib, int i, fjg_graph *g, int *additive_tiles) {
  char name[32];
  snprintf(name, sizeof name, "bufs_%d", i);
  bufs_fn bufs = (bufs_fn)dlsym(lib, name);
  assert_non_null(bufs);
  snprintf(name, sizeof name, "tile_%d", i);
  tile_fn tile = (tile_fn)dlsym(lib, name);
  snprintf(name, sizeof name, "grad_%d", i);
  grad_fn grad = (grad_fn)dlsym(lib, name);
  assert_non_null(tile);
  assert_non_null(grad);
  const int nargs = fjg_num_args(g);
  host_args A;
  host_args_fill(&A, g);
  float got_g[8][BUF_LEN], want_g[8][BUF_LEN];
  unsigned char grads_got[128], grads_want[128];
  host_grads(g, got_g, grads_got);
  host_grads(g, want_g, grads_want);
  const int sizes[5] = {2, 4, 2, 40, 40};
  int with_one = 0;
  for (int t = 0; t < 40; t++) {
    const int b = range(0, 1), h = range(0, 3);
    const int q0 = range(0, 39), kv0 = range(0, 39);
    const int dq = t % 4 == 0 ? 0 : range(0, 5), dkv = t % 4 == 1 ? 0 : range(0, 5);
    const int q1 = q0 + dq > 39 ? 39 : q0 + dq, kv1 = kv0 + dkv > 39 ? 39 : kv0 + dkv;
    float sv[36], dsv[36], ret[36];
    const int n = (q1 - q0 + 1) * (kv1 - kv0 + 1);
    for (int e = 0; e < n; e++) {
      sv[e] = (float)range(-300, 300) / 32.0f;
      dsv[e] = e % 7 == 6 ? 0.0f : (float)range(-64, 64) / 16.0f;
    }
    memset(got_g, 0, sizeof got_g);
    memset(want_g, 0, sizeof want_g);
    int one = 0;
    tile(A.params, grads_got, sizes, b, h, q0, q1, kv0, kv1, sv, dsv, ret, &one);
    with_one += one > 0;
    int e = 0;
    for (int q = q0; q <= q1; q++)
      for (int kv = kv0; kv <= kv1; kv++, e++) {
        const float r = grad(A.params, grads_want, sizes, sv[e], b, h, q, kv, dsv[e]);
        if (!(r == ret[e] || (isnan(r) && isnan(ret[e]))))
          fail_msg("graph %d, tile q %d..%d kv %d..%d: fj_score_grad returned %.9g in the "
                   "tile, %.9g alone at q=%d kv=%d", i, q0, q1, kv0, kv1, ret[e], r, q, kv);
      }
    for (int a = 0; a < nargs; a++)
      for (int j = 0; j < BUF_LEN; j++)
        if (!close_to(got_g[a][j], want_g[a][j]))
          fail_msg("graph %d, tile q %d..%d kv %d..%d (%d reads of one index): gradient of "
                   "%s[%d] %.9g, element by element %.9g", i, q0, q1, kv0, kv1, one,
                   fjg_arg_at(g, a)->name, j, got_g[a][j], want_g[a][j]);
    if (!additive(g)) continue;
    /* An additive score_mod: fj_grad_bufs adds what fj_score_grad does. */
    memset(got_g, 0, sizeof got_g);
    bufs(A.params, grads_got, sizes, b, h, q0, q1, kv0, kv1, dsv);
    (*additive_tiles)++;
    for (int a = 0; a < nargs; a++)
      for (int j = 0; j < BUF_LEN; j++)
        if (!close_to(got_g[a][j], want_g[a][j]))
          fail_msg("graph %d, tile q %d..%d kv %d..%d: gradient of %s[%d] %.9g by "
                   "fj_grad_bufs, element by element %.9g", i, q0, q1, kv0, kv1,
                   fjg_arg_at(g, a)->name, j, got_g[a][j], want_g[a][j]);
  }
  return with_one;
}

static void test_score_grad_matches_derivative(void **state) {
  (void)state;
  if (system("g++ --version > /dev/null 2>&1") != 0) {
    print_message("g++ not found; skipping the host run of emitted code\n");
    skip();
  }
  char dir[] = "/tmp/fj_emit_bwd_XXXXXX";
  assert_non_null(mkdtemp(dir));
  fjg_graph *graphs[MAX_GRAPHS];
  for (int i = 0; i < NUM_EXAMPLES; i++) graphs[i] = trace(example_specs[i]);
  for (int i = NUM_EXAMPLES; i < MAX_GRAPHS; i++) graphs[i] = random_graph(1);
  void *lib = build_host_library(graphs, MAX_GRAPHS, dir);
  int checked = 0, nonzero_grads = 0, tiles_with_one = 0, additive_tiles = 0;
  for (int i = 0; i < MAX_GRAPHS; i++) {
    tiles_with_one += check_tiles(lib, i, graphs[i], &additive_tiles);
    int n = check_graph(lib, i, graphs[i]);
    if (n < 30) fail_msg("graph %d: only %d of 60 points predictable", i, n);
    checked += n;
    const fjg_derivative *d = fjg_graph_derivative(graphs[i]);
    nonzero_grads += d && d->num_buffer_grads > 0;
  }
  /* The examples with trainable reads and most random graphs have some. */
  assert_true(nonzero_grads > MAX_GRAPHS / 2);
  /* fj_grad_tile's one-index path ran, not only the element-wise one, and
   * fj_grad_bufs on the additive examples. */
  assert_true(tiles_with_one > MAX_GRAPHS);
  assert_true(additive_tiles >= 40);
  print_message("%d points checked on %d graphs (%d with buffer gradients); %d tiles with a "
                "read of one index; %d tiles of additive score_mods through fj_grad_bufs\n",
                checked, MAX_GRAPHS, nonzero_grads, tiles_with_one, additive_tiles);
  dlclose(lib);
  for (int i = 0; i < MAX_GRAPHS; i++) fjg_graph_destroy(graphs[i]);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_user_grads_layout),
      cmocka_unit_test(test_forward_unit_unchanged),
      cmocka_unit_test(test_backward_unit),
      cmocka_unit_test(test_score_grad_one),
      cmocka_unit_test(test_grad_diagonal),
      cmocka_unit_test(test_mask_loads),
      cmocka_unit_test(test_hooks_compile_with_nvrtc),
      cmocka_unit_test(test_score_grad_matches_derivative),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
