/* tests/unit/test_emit_cuda.c: the CUDA emitter (gen/emit_cuda.c).
 *
 * Besides layout and assembly checks, the emitted prologue is compiled for
 * the HOST with g++ (CUDA qualifiers defined away, the round-to-nearest
 * intrinsics as plain float operations, no contraction) and run: fj_mask,
 * fj_score_mod and fj_tile_class must agree with the CPU evaluator (bit for
 * bit where it says exact, inside its bounds where the kernel's exp/log/tanh
 * differ from glibc's) and fjg_tile_class_cpu on random graphs, random f32
 * masks, and i32 edge values against Lua's semantics written out here. That
 * checks the emitted expressions and the shared interval rules without a
 * GPU. NVRTC's PTX shows that f32 arithmetic deciding a comparison is never
 * contracted into an FMA. */
#include <dlfcn.h>
#include <float.h>
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
#include "gen/emit_cuda.h"
#include "gen/eval.h"
#include "gen/graph.h"
#include "gen/interval.h"
#include "gen/templates.h"
#include "tests/unit/host_prelude.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}
static int range(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); }

/* ---- user params layout ---- */

/* What the emitted struct is for args (w i32, doc buffer i32, cap f32,
 * x i32, bias buffer f32), written by hand. */
struct mirror {
  long long reserved;
  int a_w;
  const int *a_doc;
  long long n_doc;
  float a_cap;
  int a_x;
  const float *a_bias;
  long long n_bias;
};

static fjg_graph *five_args(void) {
  fjg_graph *g = fjg_graph_create();
  fjg_param(g, "w", FJG_I32);
  fjg_buffer(g, "doc", FJG_I32);
  fjg_param(g, "cap", FJG_F32);
  fjg_param(g, "x", FJG_I32);
  fjg_buffer(g, "bias", FJG_F32);
  return g;
}

static void test_user_params_layout(void **state) {
  (void)state;
  fjg_graph *g = five_args();
  assert_int_equal(fjg_user_params_size(g), sizeof(struct mirror));
  assert_int_equal(fjg_user_params_offset(g, 0), offsetof(struct mirror, a_w));
  assert_int_equal(fjg_user_params_offset(g, 1), offsetof(struct mirror, a_doc));
  assert_int_equal(fjg_user_params_offset(g, 2), offsetof(struct mirror, a_cap));
  assert_int_equal(fjg_user_params_offset(g, 3), offsetof(struct mirror, a_x));
  assert_int_equal(fjg_user_params_offset(g, 4), offsetof(struct mirror, a_bias));
  int32_t i32s[5] = {7, 0, 0, -3, 0};
  float f32s[5] = {0, 0, 2.5f, 0, 0};
  uint64_t ptrs[5] = {0, 0x1000, 0, 0, 0x2000};
  int64_t lens[5] = {0, 11, 0, 0, 22};
  struct mirror m;
  memset(&m, 0xff, sizeof m);
  fjg_user_params_pack(g, i32s, f32s, ptrs, lens, &m);
  assert_int_equal(m.reserved, 0);
  assert_int_equal(m.a_w, 7);
  assert_int_equal((uintptr_t)m.a_doc, 0x1000);
  assert_int_equal(m.n_doc, 11);
  assert_true(m.a_cap == 2.5f);
  assert_int_equal(m.a_x, -3);
  assert_int_equal((uintptr_t)m.a_bias, 0x2000);
  assert_int_equal(m.n_bias, 22);
  fjg_graph_destroy(g);

  fjg_graph *e = fjg_graph_create();
  assert_int_equal(fjg_user_params_size(e), 8);
  fjg_graph_destroy(e);
}

/* ---- the forward translation unit ---- */

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

static fjg_graph *window_graph(void) {
  fjg_graph *g = fjg_graph_create();
  int w = fjg_param(g, "window", FJG_I32);
  int q = fjg_input_node(g, FJG_IN_Q), kv = fjg_input_node(g, FJG_IN_KV);
  int m = fjg_binary(g, FJG_OP_AND, fjg_binary(g, FJG_OP_GE, q, kv),
                     fjg_binary(g, FJG_OP_LT, fjg_binary(g, FJG_OP_SUB, q, kv), w));
  fjg_set_mask_root(g, m);
  return g;
}

static const char *after(const char *hay, const char *needle, const char *from) {
  const char *p = strstr(from, needle);
  if (!p) fail_msg("'%s' missing or out of order in the translation unit", needle);
  (void)hay;
  return p;
}

static void test_forward_tu_layout(void **state) {
  (void)state;
  fjg_graph *g = window_graph();
  fjg_config c = sm80_config();
  fjg_buf b;
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_forward_tu(g, &c, &b), FJ_OK);
  const char *s = b.data, *p = s;
  p = after(s, "#define FJ_HEAD_DIM 128\n", p);
  p = after(s, "#define FJ_DTYPE_BF16 1\n", p);
  p = after(s, "#define FJ_BLOCK_M 128\n", p);
  p = after(s, "#define FJ_BLOCK_N 64\n", p);
  p = after(s, "#define FJ_NUM_WARPS 4\n", p);
  p = after(s, "#define FJ_NUM_STAGES 2\n", p);
  p = after(s, "#define FJ_HAS_MASK 1\n", p);
  p = after(s, "#define FJ_HAS_SCORE_MOD 0\n", p);
  /* The parts in the order of gen/templates.c's list, the prologue among
   * them, each once. */
  const char *const *parts = fjg_template_parts("sm80", "forward");
  assert_non_null(parts);
  for (const char *const *part = parts; *part; part++) {
    char line[256];
    if (strcmp(*part, FJG_PART_PROLOGUE) == 0) {
      p = after(s, "generated prologue", p);
      p = after(s, "int a_window;", p);
      continue;
    }
    snprintf(line, sizeof line, "// ---- template %s ----\n", *part);
    p = after(s, line, p);
    assert_null(strstr(p + 1, line));
  }
  p = after(s, "fj_attention_fwd", p);
  assert_null(strstr(s, "#define FJ_DTYPE_F16"));
  fjg_buf_free(&b);

  c.dtype = FJ_DTYPE_F16;
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_forward_tu(g, &c, &b), FJ_OK);
  assert_non_null(strstr(b.data, "#define FJ_DTYPE_F16 1\n"));
  fjg_buf_free(&b);

  c.template_name = "sm999";
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_forward_tu(g, &c, &b), FJ_ENOTFOUND);
  fjg_buf_free(&b);
  assert_int_equal(fjg_emit_forward_tu(g, NULL, &b), FJ_EINVAL);
  fjg_graph_destroy(g);

  /* The template table has what the TU needs, and covers it in the hash. */
  assert_non_null(fjg_template_text("common/fj_common.cuh", NULL));
  assert_null(fjg_template_text("nope.cuh", NULL));
  assert_true(fjg_template_count_get() >= 2);
  fjg_buf all;
  fjg_buf_init(&all);
  fjg_templates_append_all(&all);
  size_t len;
  const char *common = fjg_template_text("common/fj_common.cuh", &len);
  assert_true(all.len > len);
  assert_non_null(memmem(all.data, all.len, common, len));
  fjg_buf_free(&all);
}

/* FJ_SCORE_SFU (sm90/config.cuh's FJ_EXP2_EMU): a score_mod that calls a
 * special function on every element says so; one whose special function
 * reads no element input (ALiBi's slope) or divides by a constant does not. */
static void test_score_sfu_define(void **state) {
  (void)state;
  struct { int op; int on_element; int want; } cases[] = {
      {FJG_OP_TANH, 1, 1}, {FJG_OP_EXP, 1, 1}, {FJG_OP_LOG2, 1, 1}, {FJG_OP_SQRT, 1, 1},
      {FJG_OP_DIV, 1, 1}, {FJG_OP_EXP2, 0, 0}, {FJG_OP_TANH, 0, 0}, {FJG_OP_MUL, 1, 0},
      {FJG_OP_NEG, 1, 0}, {-1, 1, 0},
  };
  fjg_config c = sm80_config();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fjg_graph *g = fjg_graph_create();
    int score = fjg_input_node(g, FJG_IN_SCORE);
    int x = cases[i].on_element ? score
                                : fjg_unary(g, FJG_OP_TO_F32, fjg_input_node(g, FJG_IN_H));
    int f;
    if (cases[i].op < 0)
      f = fjg_binary(g, FJG_OP_DIV, score, fjg_const_f32(g, 30.0f)); /* times the reciprocal */
    else if (cases[i].op == FJG_OP_DIV || cases[i].op == FJG_OP_MUL)
      f = fjg_binary(g, (fjg_op)cases[i].op, fjg_const_f32(g, 2.0f), x);
    else
      f = fjg_unary(g, (fjg_op)cases[i].op, x);
    assert_true(fjg_set_score_root(g, fjg_binary(g, FJG_OP_ADD, f, score)) >= 0);
    fjg_buf b;
    fjg_buf_init(&b);
    assert_int_equal(fjg_emit_forward_tu(g, &c, &b), FJ_OK);
    if ((strstr(b.data, "#define FJ_SCORE_SFU 1\n") != NULL) != cases[i].want)
      fail_msg("case %zu (%s of %s): FJ_SCORE_SFU %s", i,
               cases[i].op < 0 ? "div by constant" : fjg_op_name((fjg_op)cases[i].op),
               cases[i].on_element ? "the score" : "h", cases[i].want ? "missing" : "set");
    fjg_buf_free(&b);
    fjg_graph_destroy(g);
  }
}

/* Every kernel's part list names embedded templates, the prologue once;
 * every embedded template is a part of some kernel (none is dead weight in
 * the cache key). */
static void test_template_parts(void **state) {
  (void)state;
  static const char *const kernels[][2] = {
      {"sm80", "forward"},    {"sm90", "forward"}, {"sm90", "backward"}, {"sm80", "backward"},
      {"common", "blockmask"}, {"sm80", "decode"}, {"common", "util"}};
  const int count = fjg_template_count_get();
  int *used = calloc((size_t)count, sizeof *used);
  assert_non_null(used);
  for (size_t k = 0; k < sizeof kernels / sizeof kernels[0]; k++) {
    const char *const *parts = fjg_template_parts(kernels[k][0], kernels[k][1]);
    assert_non_null(parts);
    int prologues = 0;
    for (const char *const *part = parts; *part; part++) {
      if (strcmp(*part, FJG_PART_PROLOGUE) == 0) {
        prologues++;
        continue;
      }
      if (!fjg_template_text(*part, NULL))
        fail_msg("%s %s: part %s is not embedded", kernels[k][0], kernels[k][1], *part);
      for (int i = 0; i < count; i++)
        if (strcmp(fjg_template_name_at(i), *part) == 0) used[i] = 1;
    }
    /* The util unit's kernels are spec-independent: no prologue. */
    assert_int_equal(prologues, strcmp(kernels[k][1], "util") != 0);
  }
  for (int i = 0; i < count; i++)
    if (!used[i]) fail_msg("template %s is in no kernel's part list", fjg_template_name_at(i));
  free(used);
  assert_null(fjg_template_parts("sm999", "forward"));
  assert_null(fjg_template_parts(NULL, "forward"));
}

/* The whole forward TU through NVRTC, for sm_80: generator and kernel
 * template together. */
static void test_forward_tu_compiles_with_nvrtc(void **state) {
  (void)state;
  fjg_graph *g = window_graph();
  fjg_config c = sm80_config();
  fjg_buf b;
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_forward_tu(g, &c, &b), FJ_OK);
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, b.data, "fwd.cu", 0, NULL, NULL),
                   NVRTC_SUCCESS);
  /* The options the runtime compiles with. */
  const char *opts[] = {"--gpu-architecture=sm_80", "-std=c++17",
                        "-default-device"};
  nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    char *log = calloc(1, n + 1);
    nvrtcGetProgramLog(prog, log);
    fail_msg("NVRTC failed on the forward TU: %s\n%.4000s", nvrtcGetErrorString(r), log);
  }
  nvrtcDestroyProgram(&prog);
  fjg_buf_free(&b);
  fjg_graph_destroy(g);
}

/* ---- host execution of the emitted prologue ---- */

typedef struct nodes {
  int q, kv, b, h, lq, lk, hq, w, p, fp, doc, fbuf;
} nodes;

static nodes leaves(fjg_graph *g) {
  nodes n;
  n.q = fjg_input_node(g, FJG_IN_Q);
  n.kv = fjg_input_node(g, FJG_IN_KV);
  n.b = fjg_input_node(g, FJG_IN_B);
  n.h = fjg_input_node(g, FJG_IN_H);
  n.lq = fjg_size_node(g, FJG_SZ_LQ);
  n.lk = fjg_size_node(g, FJG_SZ_LK);
  n.hq = fjg_size_node(g, FJG_SZ_HQ);
  n.w = fjg_param(g, "w", FJG_I32);
  n.doc = fjg_buffer(g, "doc", FJG_I32);
  n.p = fjg_param(g, "p", FJG_I32);
  n.fp = fjg_param(g, "fp", FJG_F32);
  n.fbuf = fjg_buffer(g, "fbuf", FJG_F32);
  return n;
}

static int bin(fjg_graph *g, fjg_op op, int a, int b) {
  int r = fjg_binary(g, op, a, b);
  if (r < 0) fail_msg("%s", fjg_graph_error(g));
  return r;
}

static int rand_i32(fjg_graph *g, const nodes *n, int depth);

static int rand_bool(fjg_graph *g, const nodes *n, int depth) {
  static const fjg_op cmps[] = {FJG_OP_LT, FJG_OP_LE, FJG_OP_GT,
                                FJG_OP_GE, FJG_OP_EQ, FJG_OP_NE};
  static const fjg_op logic[] = {FJG_OP_AND, FJG_OP_OR, FJG_OP_XOR};
  int pick = depth <= 0 ? 0 : range(0, 9);
  if (pick <= 4)
    return bin(g, cmps[range(0, 5)], rand_i32(g, n, depth - 1), rand_i32(g, n, depth - 1));
  if (pick <= 7)
    return bin(g, logic[range(0, 2)], rand_bool(g, n, depth - 1), rand_bool(g, n, depth - 1));
  if (pick == 8) return fjg_unary(g, FJG_OP_NOT, rand_bool(g, n, depth - 1));
  return bin(g, FJG_OP_LT, bin(g, FJG_OP_DIV, rand_i32(g, n, depth - 1), n->fp),
             fjg_const_f32(g, 2.5f));
}

static int rand_i32(fjg_graph *g, const nodes *n, int depth) {
  static const fjg_op ops[] = {FJG_OP_ADD, FJG_OP_SUB, FJG_OP_MUL, FJG_OP_MIN,
                               FJG_OP_MAX, FJG_OP_IDIV, FJG_OP_MOD};
  int pick = depth <= 0 ? range(0, 2) : range(0, 11);
  if (pick <= 2) {
    int leaves_[] = {n->q, n->kv, n->b, n->h, n->lq, n->lk, n->w, n->p};
    int r = range(0, 10);
    if (r < 8) return leaves_[r];
    if (r == 8) return fjg_load(g, n->doc, n->q);
    return fjg_const_i32(g, range(-70, 70));
  }
  if (pick <= 8)
    return bin(g, ops[range(0, 6)], rand_i32(g, n, depth - 1), rand_i32(g, n, depth - 1));
  if (pick == 9)
    return fjg_unary(g, range(0, 1) ? FJG_OP_NEG : FJG_OP_ABS, rand_i32(g, n, depth - 1));
  return fjg_where(g, rand_bool(g, n, depth - 1), rand_i32(g, n, depth - 1),
                   rand_i32(g, n, depth - 1));
}

static int rand_f32(fjg_graph *g, const nodes *n, int depth) {
  static const fjg_op un[] = {FJG_OP_EXP, FJG_OP_TANH, FJG_OP_ABS, FJG_OP_NEG,
                              FJG_OP_FLOOR, FJG_OP_CEIL, FJG_OP_SQRT};
  static const fjg_op ops[] = {FJG_OP_ADD, FJG_OP_SUB, FJG_OP_MUL, FJG_OP_DIV,
                               FJG_OP_MIN, FJG_OP_MAX, FJG_OP_IDIV, FJG_OP_MOD};
  int pick = depth <= 0 ? range(0, 3) : range(0, 9);
  switch (pick) {
  case 0: return fjg_input_node(g, FJG_IN_SCORE);
  case 1: return fjg_const_f32(g, (float)range(-900, 900) / 64.0f);
  case 2: return bin(g, FJG_OP_MUL, n->fp, fjg_load(g, n->fbuf, n->kv));
  case 3: return fjg_unary(g, FJG_OP_TO_F32, rand_i32(g, n, 0));
  case 4: case 5:
    return fjg_unary(g, un[range(0, 6)],
                     bin(g, FJG_OP_MUL, rand_f32(g, n, depth - 1), fjg_const_f32(g, 0.125f)));
  case 6:
    return fjg_where(g, rand_bool(g, n, depth - 1), rand_f32(g, n, depth - 1),
                     rand_f32(g, n, depth - 1));
  default:
    return bin(g, ops[range(0, 7)], rand_f32(g, n, depth - 1),
               bin(g, FJG_OP_ADD, rand_f32(g, n, depth - 1), fjg_const_f32(g, 1.5f)));
  }
}

static int k32(fjg_graph *g, int v) { return fjg_const_i32(g, v); }

/* One mask per interval rule, shaped so tiles are often decided: a wrong
 * rule in either the C or the emitted classifier changes classes. */
static int rule_mask(fjg_graph *g, const nodes *n, int i) {
  int q = n->q, kv = n->kv, d = bin(g, FJG_OP_SUB, n->q, n->kv);
  switch (i) {
  case 2: return bin(g, FJG_OP_LT, bin(g, FJG_OP_ADD, q, kv), bin(g, FJG_OP_MUL, n->w, k32(g, 4)));
  case 3: return bin(g, FJG_OP_GE, d, n->p);
  case 4: return bin(g, FJG_OP_LT, bin(g, FJG_OP_MUL, q, kv), bin(g, FJG_OP_MUL, n->p, k32(g, 50)));
  case 5: return bin(g, FJG_OP_LT, bin(g, FJG_OP_MIN, q, kv), n->p);
  case 6: return bin(g, FJG_OP_GT, bin(g, FJG_OP_MAX, q, kv), n->p);
  case 7: return bin(g, FJG_OP_EQ, bin(g, FJG_OP_IDIV, q, k32(g, 16)), bin(g, FJG_OP_IDIV, kv, k32(g, 16)));
  case 8: return bin(g, FJG_OP_LT, bin(g, FJG_OP_MOD, d, k32(g, 9)), k32(g, 4));
  case 9: return bin(g, FJG_OP_GT, fjg_unary(g, FJG_OP_NEG, q), fjg_unary(g, FJG_OP_NEG, kv));
  case 10: return bin(g, FJG_OP_LE, fjg_unary(g, FJG_OP_ABS, d), n->w);
  case 11: return fjg_where(g, bin(g, FJG_OP_LT, q, n->p), bin(g, FJG_OP_GE, q, kv),
                            bin(g, FJG_OP_LT, kv, n->w));
  case 12: return bin(g, FJG_OP_XOR, bin(g, FJG_OP_GE, q, kv), bin(g, FJG_OP_LT, kv, n->p));
  default:
    return bin(g, FJG_OP_OR, bin(g, FJG_OP_NE, bin(g, FJG_OP_IDIV, q, k32(g, -5)),
                                 bin(g, FJG_OP_IDIV, kv, k32(g, -5))),
               bin(g, FJG_OP_EQ, bin(g, FJG_OP_MOD, q, k32(g, -6)), k32(g, 0)));
  }
}

/* An f32 expression of a mask (no score): indices as floats, an f32 param
 * and buffer, constants, and every f32 op. */
static int rand_mask_f32(fjg_graph *g, const nodes *n, int depth) {
  static const fjg_op un[] = {FJG_OP_EXP, FJG_OP_TANH, FJG_OP_ABS, FJG_OP_NEG,
                              FJG_OP_FLOOR, FJG_OP_CEIL, FJG_OP_SQRT, FJG_OP_LOG,
                              FJG_OP_EXP2, FJG_OP_LOG2};
  static const fjg_op ops[] = {FJG_OP_ADD, FJG_OP_SUB, FJG_OP_MUL, FJG_OP_DIV,
                               FJG_OP_MIN, FJG_OP_MAX, FJG_OP_IDIV, FJG_OP_MOD};
  int pick = depth <= 0 ? range(0, 3) : range(0, 9);
  switch (pick) {
  case 0: return fjg_unary(g, FJG_OP_TO_F32, range(0, 1) ? n->q : n->kv);
  case 1: return fjg_const_f32(g, (float)range(-900, 900) / (float)range(1, 99));
  case 2: return range(0, 1) ? n->fp : fjg_load(g, n->fbuf, n->kv);
  case 3: return fjg_unary(g, FJG_OP_TO_F32, rand_i32(g, n, 1));
  case 4: return fjg_unary(g, un[range(0, 9)], rand_mask_f32(g, n, depth - 1));
  case 5:
    return fjg_where(g, rand_bool(g, n, 1), rand_mask_f32(g, n, depth - 1),
                     rand_mask_f32(g, n, depth - 1));
  default:
    return bin(g, ops[range(0, 7)], rand_mask_f32(g, n, depth - 1),
               rand_mask_f32(g, n, depth - 1));
  }
}

static int f32_mask(fjg_graph *g, const nodes *n) {
  static const fjg_op cmps[] = {FJG_OP_LT, FJG_OP_LE, FJG_OP_GT,
                                FJG_OP_GE, FJG_OP_EQ, FJG_OP_NE};
  return bin(g, cmps[range(0, 5)], rand_mask_f32(g, n, range(1, 4)),
             rand_mask_f32(g, n, range(0, 3)));
}

enum { NUM_GRAPHS = 70, FIRST_RANDOM = 14, FIRST_F32_MASK = 40 };

static fjg_graph *make_graph(int i) {
  fjg_graph *g = fjg_graph_create();
  nodes n = leaves(g);
  if (i == 0) { /* causal + sliding window + alibi-like score */
    int d = bin(g, FJG_OP_SUB, n.q, n.kv);
    fjg_set_mask_root(g, bin(g, FJG_OP_AND, bin(g, FJG_OP_GE, n.q, n.kv),
                             bin(g, FJG_OP_LT, d, n.w)));
    int slope = fjg_unary(g, FJG_OP_EXP2, bin(g, FJG_OP_DIV,
        bin(g, FJG_OP_MUL, fjg_const_i32(g, -8), bin(g, FJG_OP_ADD, n.h, fjg_const_i32(g, 1))), n.hq));
    fjg_set_score_root(g, bin(g, FJG_OP_SUB, fjg_input_node(g, FJG_IN_SCORE),
                              bin(g, FJG_OP_MUL, slope, d)));
    return g;
  }
  if (i == 1) { /* document + softcap with exact odd constants */
    fjg_set_mask_root(g, bin(g, FJG_OP_EQ, fjg_load(g, n.doc, n.q), fjg_load(g, n.doc, n.kv)));
    int s = fjg_input_node(g, FJG_IN_SCORE);
    int t = fjg_unary(g, FJG_OP_TANH, bin(g, FJG_OP_DIV, s, fjg_const_f32(g, 30.0f)));
    int r = bin(g, FJG_OP_MUL, t, fjg_const_f32(g, 30.0f));
    r = bin(g, FJG_OP_ADD, r, fjg_const_f32(g, 1.0f / 3.0f));
    r = bin(g, FJG_OP_ADD, r, fjg_const_f32(g, FLT_MIN / 4)); /* subnormal */
    r = bin(g, FJG_OP_MUL, r, fjg_const_f32(g, -0.0f));
    r = bin(g, FJG_OP_MIN, r, fjg_const_f32(g, FLT_MAX));
    r = bin(g, FJG_OP_MAX, r, fjg_const_f32(g, -INFINITY));
    fjg_set_score_root(g, r);
    return g;
  }
  if (i < FIRST_RANDOM) {
    fjg_set_mask_root(g, rule_mask(g, &n, i));
    return g;
  }
  if (i >= FIRST_F32_MASK) {
    fjg_set_mask_root(g, f32_mask(g, &n));
    return g;
  }
  fjg_set_mask_root(g, rand_bool(g, &n, range(1, 4)));
  fjg_set_score_root(g, i % 3 ? rand_f32(g, &n, range(1, 4)) : rand_i32(g, &n, 3));
  return g;
}

typedef int (*mask_fn)(const void *, const int *, int, int, int, int);
typedef float (*score_fn)(const void *, const int *, float, int, int, int, int);
typedef int (*tile_fn)(const void *, const int *, int, int, int, int, int, int);
typedef float (*log2_fn)(const void *, const int *, float, float, int, int, int, int, int,
                         int);

/* log2 e as the emitter and the templates round it. */
static const float LOG2E_F = 1.4426950408889634f;

static const char *const host_prelude = FJT_HOST_PRELUDE;

/* Writes one C++ file holding the prologue of each of the count graphs in
 * its own namespace, with extern "C" entry points, and builds it into a
 * shared object. */
static void *build_host_library(fjg_graph **graphs, int count, const char *dir) {
  fjg_buf src;
  fjg_buf_init(&src);
  fjg_buf_printf(&src, "%s", host_prelude);
  size_t len;
  const char *common = fjg_template_text("common/fj_common.cuh", &len);
  fjg_buf_append(&src, common, len);
  assert_int_equal(fjg_emit_interval_rules(NULL, &src), FJ_OK);
  for (int i = 0; i < count; i++) {
    fjg_buf_printf(&src, "namespace g%d {\n", i);
    assert_int_equal(fjg_emit_prologue(graphs[i], &src), FJ_OK);
    fjg_buf_printf(&src,
        "}\nextern \"C\" int mask_%d(const void *u, const int *z, int b, int h, int q, int kv) {\n"
        "  return g%d::fj_mask(*(const g%d::fj_user_params *)u, *(const fj_sizes *)z, b, h, q, kv);\n}\n"
        "extern \"C\" float score_%d(const void *u, const int *z, float s, int b, int h, int q, int kv) {\n"
        "  return g%d::fj_score_mod(*(const g%d::fj_user_params *)u, *(const fj_sizes *)z, s, b, h, q, kv);\n}\n"
        "extern \"C\" int tile_%d(const void *u, const int *z, int b, int h, int q0, int q1, int k0, int k1) {\n"
        "  return g%d::fj_tile_class(*(const g%d::fj_user_params *)u, *(const fj_sizes *)z, b, h, q0, q1, k0, k1);\n}\n"
        "extern \"C\" float log2_%d(const void *u, const int *z, float qk, float scale, int b, int h,\n"
        "    int qb, int dq, int kvb, int dk) {\n"
        "  return g%d::fj_score_log2(*(const g%d::fj_user_params *)u, *(const fj_sizes *)z, qk, scale,\n"
        "      b, h, qb, dq, kvb, dk);\n}\n",
        i, i, i, i, i, i, i, i, i, i, i, i);
    if (fjg_score_has_tile_terms(graphs[i]))
      fjg_buf_printf(&src,
          "extern \"C\" int tile_terms_%d(const void *u, const int *z, float scale, int b, int h,\n"
          "    int q0, int q1, int k0, int k1, float *terms) {\n"
          "  return g%d::fj_score_tile(*(const g%d::fj_user_params *)u, *(const fj_sizes *)z,\n"
          "      scale, b, h, q0, q1, k0, k1, *terms);\n}\n"
          "extern \"C\" float log2_tile_%d(float qk, float scale, float terms) {\n"
          "  return g%d::fj_score_log2_tile(qk, scale, terms);\n}\n",
          i, i, i, i, i);
  }
  char cpp[512], so[512], cmd[1600];
  snprintf(cpp, sizeof cpp, "%s/emitted_host.cpp", dir);
  snprintf(so, sizeof so, "%s/emitted_host.so", dir);
  FILE *f = fopen(cpp, "wb");
  assert_non_null(f);
  fwrite(src.data, 1, src.len, f);
  fclose(f);
  fjg_buf_free(&src);
  /* No contraction: the host stands in for the kernel's rounding. */
  snprintf(cmd, sizeof cmd, "g++ -std=c++17 -O1 -ffp-contract=off -fPIC -shared -w -o %s %s", so, cpp);
  if (system(cmd) != 0) fail_msg("host compile failed: %s", cmd);
  void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!lib) fail_msg("dlopen: %s", dlerror());
  return lib;
}

/* Unloads what build_host_library built, frees its graphs and removes its
 * directory. */
static void close_host_library(void *lib, fjg_graph **graphs, int count, const char *dir) {
  dlclose(lib);
  for (int i = 0; i < count; i++) fjg_graph_destroy(graphs[i]);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void *sym(void *lib, const char *kind, int i) {
  char name[32];
  snprintf(name, sizeof name, "%s_%d", kind, i);
  void *p = dlsym(lib, name);
  assert_non_null(p);
  return p;
}

/* The host's value (glibc standing in for CUDA's exp, log, tanh) must be
 * the evaluator's exactly where it says exact, else inside its bounds. */
static int within(const fjg_aval *a, float got) {
  if (isnan(got)) return a->exact ? isnan(a->v.f) : a->nan;
  if (a->exact) return memcmp(&a->v.f, &got, sizeof got) == 0;
  return a->flo <= got && got <= a->fhi;
}

/* A graph's arguments as the leaves() graphs declare them (w, doc, p, fp,
 * fbuf), drawn at random: packed for the emitted hooks in params, and as
 * the CPU evaluator's env (sizes B=2, Hq=8, Hkv=2, Lq, Lk, no offsets).
 * env points into the struct: initialize it in place, never copy it. */
typedef struct host_args {
  int32_t docs[32], i32s[8];
  float fvals[32], f32s[8];
  uint64_t ptrs[8];
  int64_t lens[8];
  const void *data[8];
  unsigned char params[256];
  fjg_env env;
} host_args;

static void host_args_init(host_args *a, const fjg_graph *g, int lq, int lk) {
  memset(a, 0, sizeof *a);
  for (int j = 0; j < 32; j++) a->docs[j] = range(0, 2), a->fvals[j] = (float)range(-64, 64) / 8.0f;
  a->i32s[0] = range(1, 64);               /* w */
  a->i32s[2] = range(-10, 100);            /* p */
  a->f32s[3] = (float)range(1, 40) / 4.0f; /* fp */
  a->ptrs[1] = (uint64_t)(uintptr_t)a->docs, a->lens[1] = 32;
  a->ptrs[4] = (uint64_t)(uintptr_t)a->fvals, a->lens[4] = 32;
  a->data[1] = a->docs, a->data[4] = a->fvals;
  assert_true(fjg_user_params_size(g) <= sizeof a->params);
  fjg_user_params_pack(g, a->i32s, a->f32s, a->ptrs, a->lens, a->params);
  a->env = (fjg_env){{2, 8, 2, lq, lk}, 0, 0, a->i32s, a->f32s, a->data, a->lens};
}

static void check_graph(void *lib, int i, fjg_graph *g) {
  mask_fn mask = (mask_fn)sym(lib, "mask", i);
  score_fn score = (score_fn)sym(lib, "score", i);
  tile_fn tile = (tile_fn)sym(lib, "tile", i);
  log2_fn log2v = (log2_fn)sym(lib, "log2", i);
  const int additive = fjg_score_is_additive(g);
  host_args args;
  host_args_init(&args, g, 0, 0);
  const unsigned char *params = args.params;
  fjg_env env = args.env;
  env.sizes[FJG_SZ_LQ] = range(1, 200), env.sizes[FJG_SZ_LK] = range(1, 200);
  /* Context parallel offsets on every other graph: q and kv as the spec
   * sees them, in the emitted hooks (fj_sizes' q_off, kv_off) and on the CPU. */
  if (i % 2) env.q_off = range(0, 5000), env.kv_off = range(0, 5000);
  fjg_evaluator ev;
  assert_int_equal(fjg_evaluator_init(&ev, g, &env), FJ_OK);
  for (int t = 0; t < 300; t++) {
    int b = range(0, 1), h = range(0, 7), q = range(-5, 200), kv = range(-5, 200);
    int want = fjg_eval_mask3(&ev, b, h, q, kv);
    int got = mask(params, env.sizes, b, h, q, kv);
    if (want != FJG_UNCERTAIN && want != got)
      fail_msg("graph %d: mask(b=%d h=%d q=%d kv=%d) cpu %d emitted %d", i, b, h, q, kv, want, got);
    float s = (float)range(-400, 400) / 16.0f;
    float gs = score(params, env.sizes, s, b, h, q, kv);
    const fjg_aval *ws = fjg_eval_root(&ev, 1, s, b, h, q, kv);
    if (ws && !within(ws, gs))
      fail_msg("graph %d: score(%g, b=%d h=%d q=%d kv=%d) cpu %.9g [%.9g, %.9g]%s "
               "emitted %.9g", i, s, b, h, q, kv, ws->v.f, ws->flo, ws->fhi,
               ws->exact ? " exact" : "", gs);
    /* The kernels' form of a score_mod that is not additive is
     * fj_score_mod's value times log2 e, whatever the split of q and kv
     * (the additive form: test_score_log2_additive). */
    if (!additive) {
      const int dq = range(0, 40), dk = range(0, 40);
      const float want = gs * LOG2E_F, got = log2v(params, env.sizes, 2.0f * s, 0.5f, b, h,
                                                   q - dq, dq, kv - dk, dk);
      if (!(isnan(want) && isnan(got)) && memcmp(&want, &got, sizeof got) != 0)
        fail_msg("graph %d: score_log2(%g, b=%d h=%d q=%d kv=%d) %.9g, not %.9g", i, s, b,
                 h, q, kv, got, want);
    }
    int q0 = range(-20, 200), kv0 = range(-20, 200);
    int q1 = q0 + range(0, 40), kv1 = kv0 + range(0, 40);
    int wc = fjg_tile_class_cpu(g, &env, b, h, q0, q1, kv0, kv1);
    int gc = tile(params, env.sizes, b, h, q0, q1, kv0, kv1);
    if (wc != gc)
      fail_msg("graph %d: tile class q[%d,%d] kv[%d,%d] cpu %d emitted %d", i, q0, q1, kv0, kv1, wc, gc);
  }
  fjg_evaluator_free(&ev);
}

static void test_emitted_code_matches_cpu(void **state) {
  (void)state;
  if (system("g++ --version > /dev/null 2>&1") != 0) {
    print_message("g++ not found; skipping the host run of emitted code\n");
    skip();
  }
  char dir[] = "/tmp/fj_emit_host_XXXXXX";
  assert_non_null(mkdtemp(dir));
  fjg_graph *graphs[NUM_GRAPHS];
  for (int i = 0; i < NUM_GRAPHS; i++) graphs[i] = make_graph(i);
  void *lib = build_host_library(graphs, NUM_GRAPHS, dir);
  for (int i = 0; i < NUM_GRAPHS; i++) check_graph(lib, i, graphs[i]);
  close_host_library(lib, graphs, NUM_GRAPHS, dir);
}

/* A float division by a constant is a multiplication by the reciprocal in a
 * score_mod (per element of every tile) and stays an exactly rounded
 * division in a mask, whose comparisons must agree with the CPU evaluator;
 * a division by a param stays a division in both. */
static void test_division_by_constant(void **state) {
  (void)state;
  fjg_graph *g = fjg_graph_create();
  int score = fjg_input_node(g, FJG_IN_SCORE);
  int cap = fjg_param(g, "cap", FJG_F32);
  int kv = fjg_input_node(g, FJG_IN_KV);
  int kvf = fjg_unary(g, FJG_OP_TO_F32, kv);
  int thirty = fjg_const_f32(g, 30.0f);
  int sm = fjg_binary(g, FJG_OP_ADD, fjg_binary(g, FJG_OP_DIV, score, thirty),
                      fjg_binary(g, FJG_OP_DIV, score, cap));
  assert_true(fjg_set_score_root(g, sm) >= 0);
  int m = fjg_binary(g, FJG_OP_LT, fjg_binary(g, FJG_OP_DIV, kvf, fjg_const_f32(g, 3.0f)),
                     fjg_const_f32(g, 7.0f));
  fjg_set_mask_root(g, m);
  fjg_buf b;
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_prologue(g, &b), FJ_OK);
  const char *mask = strstr(b.data, "fj_mask(");
  const char *score_fn = strstr(b.data, "fj_score_mod(");
  assert_non_null(mask);
  assert_non_null(score_fn);
  assert_true(mask < score_fn);
  /* 1/30 rounded to float is 0x1.111112p-5 */
  const char *recip = strstr(score_fn, "score * 0x1.111112p-5f");
  if (!recip) fail_msg("no reciprocal in the score_mod:\n%s", score_fn);
  assert_non_null(strstr(score_fn, "score / u.a_cap"));
  const char *mask_div = strstr(mask, "__fdiv_rn(t0, 0x1.8p+1f");
  if (!mask_div || mask_div > score_fn) fail_msg("the mask lost its division:\n%s", mask);
  fjg_buf_free(&b);
  fjg_graph_destroy(g);
}

/* ---- the additive score in log2 units ---- */

/* A random term of an additive score_mod that reads no score, and in
 * *bound a bound on its magnitude over check_additive's inputs (|q|, |kv|
 * <= 600 with the offsets, w <= 64, fp in [0.25, 10], fbuf in [-8, 8]):
 * the forms fj_score_log2 rewrites (sums, invariant factors, reciprocals,
 * floats of affine indices) and a few it keeps whole. Factors are at least
 * 1/4, so that a wrong dq or dk moves the result by more than the
 * tolerance. */
static int rand_bias(fjg_graph *g, const nodes *n, int depth, double *bound) {
  double b1, b2;
  int pick = depth <= 0 ? range(0, 3) : range(0, 8);
  switch (pick) {
  case 0: {
    int c = range(-14, 14);
    *bound = abs(c);
    return fjg_const_f32(g, (float)c);
  }
  case 1: *bound = 10; return n->fp;
  case 2: { /* a q + c kv + w + d */
    int a = range(-3, 3), c = range(-3, 3), d = range(-70, 70);
    int x = bin(g, FJG_OP_ADD, bin(g, FJG_OP_MUL, n->q, k32(g, a)),
                bin(g, FJG_OP_MUL, k32(g, c), n->kv));
    if (range(0, 1)) x = bin(g, FJG_OP_SUB, x, n->w);
    if (range(0, 1)) x = fjg_unary(g, FJG_OP_NEG, x);
    *bound = 600.0 * (abs(a) + abs(c)) + 64 + abs(d);
    return fjg_unary(g, FJG_OP_TO_F32, bin(g, FJG_OP_ADD, x, k32(g, d)));
  }
  case 3: *bound = 8; return fjg_load(g, n->fbuf, n->kv);
  case 4: case 5: { /* an invariant factor, on either side */
    int f = range(0, 1) ? n->fp : fjg_const_f32(g, (float)range(1, 16) / 4.0f);
    int t = rand_bias(g, n, depth - 1, &b1);
    *bound = 10 * b1;
    return range(0, 1) ? bin(g, FJG_OP_MUL, f, t) : bin(g, FJG_OP_MUL, t, f);
  }
  case 6: { /* a division by a constant */
    static const float divs[] = {2.0f, 3.0f, 7.0f, 0.5f};
    float d = divs[range(0, 3)];
    int t = rand_bias(g, n, depth - 1, &b1);
    *bound = b1 / d;
    return bin(g, FJG_OP_DIV, t, fjg_const_f32(g, d));
  }
  case 7: {
    int t = rand_bias(g, n, depth - 1, &b1);
    *bound = b1;
    return fjg_unary(g, FJG_OP_NEG, t);
  }
  default: {
    int t = rand_bias(g, n, depth - 1, &b1), u = rand_bias(g, n, depth - 1, &b2);
    *bound = b1 + b2;
    return bin(g, range(0, 1) ? FJG_OP_ADD : FJG_OP_SUB, t, u);
  }
  }
}

enum { NUM_ADDITIVE = 40 };

/* fj_score_log2 of an additive score_mod against the evaluator's value
 * times log2 e, within a few ulp of the terms' magnitudes, at random
 * splits of q and kv; and fjg_score_is_additive's answer on forms that are
 * not additive. */
static void test_score_log2_additive(void **state) {
  (void)state;
  if (system("g++ --version > /dev/null 2>&1") != 0) skip();
  fjg_graph *graphs[NUM_ADDITIVE];
  double bounds[NUM_ADDITIVE];
  for (int i = 0; i < NUM_ADDITIVE; i++) {
    fjg_graph *g = graphs[i] = fjg_graph_create();
    nodes n = leaves(g);
    int score = fjg_input_node(g, FJG_IN_SCORE);
    int bias = rand_bias(g, &n, range(1, 4), &bounds[i]);
    int root;
    switch (i % 4) {
    case 0: root = bin(g, FJG_OP_ADD, score, bias); break;
    case 1: root = bin(g, FJG_OP_ADD, bias, score); break;
    case 2: root = bin(g, FJG_OP_SUB, score, bias); break;
    default: root = bin(g, FJG_OP_SUB, bias, fjg_unary(g, FJG_OP_NEG, score)); break;
    }
    assert_true(fjg_set_score_root(g, root) >= 0);
    if (!fjg_score_is_additive(g)) fail_msg("graph %d is additive", i);
  }
  char dir[] = "/tmp/fj_emit_log2_XXXXXX";
  assert_non_null(mkdtemp(dir));
  void *lib = build_host_library(graphs, NUM_ADDITIVE, dir);
  for (int i = 0; i < NUM_ADDITIVE; i++) {
    fjg_graph *g = graphs[i];
    log2_fn log2v = (log2_fn)sym(lib, "log2", i);
    host_args args;
    host_args_init(&args, g, 300, 300);
    const unsigned char *params = args.params;
    fjg_env env = args.env;
    env.q_off = range(0, 300), env.kv_off = range(0, 300);
    fjg_evaluator ev;
    assert_int_equal(fjg_evaluator_init(&ev, g, &env), FJ_OK);
    for (int t = 0; t < 300; t++) {
      int b = range(0, 1), h = range(0, 7), q = range(-5, 290), kv = range(-5, 290);
      int dq = range(0, 63), dk = range(0, 63);
      float s = (float)range(-400, 400) / 16.0f;
      const fjg_aval *ws = fjg_eval_root(&ev, 1, s, b, h, q, kv);
      float got = log2v(params, env.sizes, 4.0f * s, 0.25f, b, h, q - dq, dq, kv - dk, dk);
      double want = (double)ws->v.f * LOG2E_F;
      double tol = 0x1p-18 * (fabs(s) + bounds[i]) + (ws->exact ? 0 : ws->fhi - ws->flo);
      if (!(fabs(got - want) <= tol))
        fail_msg("graph %d: score_log2(%g, b=%d h=%d q=%d (%d + %d) kv=%d (%d + %d)) %.9g, "
                 "want %.9g (tolerance %.3g)", i, s, b, h, q, q - dq, dq, kv, kv - dk, dk, got,
                 want, tol);
    }
    fjg_evaluator_free(&ev);
  }
  close_host_library(lib, graphs, NUM_ADDITIVE, dir);

  /* Not additive: the score scaled, under a function, or twice. */
  fjg_graph *g = fjg_graph_create();
  int score = fjg_input_node(g, FJG_IN_SCORE), h = fjg_input_node(g, FJG_IN_H);
  int hf = fjg_unary(g, FJG_OP_TO_F32, h);
  const int roots[] = {
      bin(g, FJG_OP_MUL, score, fjg_const_f32(g, 2.0f)),
      bin(g, FJG_OP_ADD, fjg_unary(g, FJG_OP_TANH, score), hf),
      bin(g, FJG_OP_ADD, score, bin(g, FJG_OP_MUL, score, hf)),
      bin(g, FJG_OP_SUB, hf, score),
  };
  for (size_t r = 0; r < sizeof roots / sizeof roots[0]; r++) {
    assert_true(fjg_set_score_root(g, roots[r]) >= 0);
    assert_int_equal(fjg_score_is_additive(g), 0);
  }
  assert_true(fjg_set_score_root(g, bin(g, FJG_OP_SUB, hf, fjg_unary(g, FJG_OP_NEG, score))) >= 0);
  assert_int_equal(fjg_score_is_additive(g), 1);
  fjg_graph_destroy(g);
}

typedef int (*tile_terms_fn)(const void *, const int *, float, int, int, int, int, int, int,
                             float *);
typedef float (*log2_tile_fn)(float, float, float);

/* A term of a relative-position bias that is one value over a tile far
 * enough from the diagonal, drawn at random (|value| <= *bound): a table
 * read at a clamped relative position, a T5-style bucket, the float of a
 * clamped distance times an invariant factor, a selection by a threshold;
 * or an invariant term. */
static int rand_tile_term(fjg_graph *g, const nodes *n, double *bound) {
  const int d = bin(g, FJG_OP_SUB, n->q, n->kv), c = range(-20, 20);
  const int dc = bin(g, FJG_OP_ADD, d, k32(g, c));
  switch (range(0, 4)) {
  case 0: /* fbuf[clamp(q - kv + c, 0, 31)] */
    *bound = 8;
    return fjg_load(g, n->fbuf, bin(g, FJG_OP_MIN, bin(g, FJG_OP_MAX, dc, k32(g, 0)), k32(g, 31)));
  case 1: { /* fbuf[min(n, 8) + (n >= t1) + (n >= t2)], n = max(q - kv, 0) */
    const int nn = bin(g, FJG_OP_MAX, d, k32(g, 0));
    int x = bin(g, FJG_OP_MIN, nn, k32(g, 8));
    for (int t = 12; t <= 40; t += 28)
      x = bin(g, FJG_OP_ADD, x,
              fjg_where(g, bin(g, FJG_OP_GE, nn, k32(g, t)), k32(g, 1), k32(g, 0)));
    *bound = 8;
    return fjg_load(g, n->fbuf, x);
  }
  case 2: /* fp * float(clamp(kv - q + c, -6, 6)) */
    *bound = 60;
    return bin(g, FJG_OP_MUL, n->fp,
               fjg_unary(g, FJG_OP_TO_F32,
                         bin(g, FJG_OP_MAX, bin(g, FJG_OP_MIN, fjg_unary(g, FJG_OP_NEG, dc),
                                                k32(g, 6)), k32(g, -6))));
  case 3: /* q - kv >= c ? 1.5 : -2 */
    *bound = 2;
    return fjg_where(g, bin(g, FJG_OP_GE, d, k32(g, c)), fjg_const_f32(g, 1.5f),
                     fjg_const_f32(g, -2.0f));
  default: /* invariant: fp, or fbuf[h] */
    *bound = 10;
    return range(0, 1) ? n->fp : fjg_load(g, n->fbuf, n->h);
  }
}

enum { NUM_TILE_TERMS = 30 };

/* fj_score_tile: where it says an additive score_mod's terms are one value
 * over a tile, fj_score_log2_tile with them is fj_score_log2's value at
 * every element of the tile (within a few ulp of the terms); over random
 * tiles near and far from the diagonal it says both. And which score_mods
 * have such terms (fjg_score_has_tile_terms, FJ_SCORE_TILE). */
static void test_score_tile(void **state) {
  (void)state;
  if (system("g++ --version > /dev/null 2>&1") != 0) skip();
  fjg_graph *graphs[NUM_TILE_TERMS];
  double bounds[NUM_TILE_TERMS];
  for (int i = 0; i < NUM_TILE_TERMS; i++) {
    fjg_graph *g = graphs[i] = fjg_graph_create();
    nodes n = leaves(g);
    int root = fjg_input_node(g, FJG_IN_SCORE), clamped = 0;
    bounds[i] = 0;
    for (int t = range(1, 3); t > 0 || !clamped; t--) {
      double b;
      const int term = rand_tile_term(g, &n, &b);
      clamped |= (fjg_input_deps(g, term) & (1u << FJG_IN_Q)) != 0;
      bounds[i] += b;
      root = bin(g, range(0, 1) ? FJG_OP_ADD : FJG_OP_SUB, root, term);
    }
    assert_true(fjg_set_score_root(g, root) >= 0);
    if (!fjg_score_has_tile_terms(g)) fail_msg("graph %d has tile terms", i);
  }
  char dir[] = "/tmp/fj_emit_tile_XXXXXX";
  assert_non_null(mkdtemp(dir));
  void *lib = build_host_library(graphs, NUM_TILE_TERMS, dir);
  int uniform = 0, varying = 0;
  for (int i = 0; i < NUM_TILE_TERMS; i++) {
    tile_terms_fn tile_terms = (tile_terms_fn)sym(lib, "tile_terms", i);
    log2_tile_fn log2_tile = (log2_tile_fn)sym(lib, "log2_tile", i);
    log2_fn log2v = (log2_fn)sym(lib, "log2", i);
    host_args args;
    host_args_init(&args, graphs[i], 400, 400);
    const unsigned char *params = args.params;
    int sizes[7];
    memcpy(sizes, args.env.sizes, sizeof(int) * 5);
    sizes[5] = i % 2 ? range(0, 300) : 0, sizes[6] = i % 2 ? range(0, 300) : 0; /* offsets */
    for (int t = 0; t < 200; t++) {
      const int b = range(0, 1), h = range(0, 7);
      const int q0 = range(-5, 380), kv0 = range(-5, 380);
      const int q1 = q0 + range(0, 63), kv1 = kv0 + range(0, 63);
      float terms = NAN;
      if (!tile_terms(params, sizes, 0.25f, b, h, q0, q1, kv0, kv1, &terms)) {
        varying++;
        continue;
      }
      uniform++;
      for (int e = 0; e < 40; e++) {
        const int q = range(q0, q1), kv = range(kv0, kv1);
        const float qk = (float)range(-400, 400) / 4.0f;
        const float want = log2v(params, sizes, qk, 0.25f, b, h, q, 0, kv, 0);
        const float got = log2_tile(qk, 0.25f, terms);
        const double tol = 0x1p-18 * (fabs(qk) * 0.25 * LOG2E_F + bounds[i] * LOG2E_F);
        if (!(fabs((double)got - want) <= tol))
          fail_msg("graph %d: tile q[%d,%d] kv[%d,%d] offsets %d, %d: at q=%d kv=%d "
                   "%.9g, fj_score_log2 %.9g", i, q0, q1, kv0, kv1, sizes[5], sizes[6], q, kv,
                   got, want);
      }
    }
  }
  /* Both answers, each often: a classifier that always or never says
   * "one value" fails here or above. */
  if (uniform < 600 || varying < 600)
    fail_msg("%d tiles with one value, %d without", uniform, varying);
  close_host_library(lib, graphs, NUM_TILE_TERMS, dir);

  /* No tile terms: ALiBi's affine distance, a score that is not additive,
   * a clamped term beside one of q and kv through no clamp, a term of
   * neither q nor kv (already the same over a thread's elements), no
   * score_mod at all. */
  fjg_config c = sm80_config();
  for (int k = 0; k < 5; k++) {
    fjg_graph *g = fjg_graph_create();
    nodes n = leaves(g);
    const int score = fjg_input_node(g, FJG_IN_SCORE);
    const int d = bin(g, FJG_OP_SUB, n.kv, n.q);
    const int clamped =
        fjg_load(g, n.fbuf, bin(g, FJG_OP_MIN, bin(g, FJG_OP_MAX, d, k32(g, 0)), k32(g, 31)));
    int root = -1;
    switch (k) {
    case 0:
      root = bin(g, FJG_OP_ADD, score, bin(g, FJG_OP_MUL, n.fp, fjg_unary(g, FJG_OP_TO_F32, d)));
      break;
    case 1:
      root = bin(g, FJG_OP_MUL, bin(g, FJG_OP_ADD, score, clamped), fjg_const_f32(g, 2.0f));
      break;
    case 2:
      root = bin(g, FJG_OP_ADD, bin(g, FJG_OP_ADD, score, clamped), fjg_load(g, n.fbuf, d));
      break;
    case 3: root = bin(g, FJG_OP_ADD, score, fjg_load(g, n.fbuf, n.h)); break;
    default: break;
    }
    if (root >= 0) assert_true(fjg_set_score_root(g, root) >= 0);
    assert_int_equal(fjg_score_has_tile_terms(g), 0);
    fjg_buf b;
    fjg_buf_init(&b);
    assert_int_equal(fjg_emit_forward_tu(g, &c, &b), FJ_OK);
    assert_null(strstr(b.data, "#define FJ_SCORE_TILE"));
    assert_null(strstr(b.data, "bool fj_score_tile("));
    fjg_buf_free(&b);
    /* The clamped term alone has them. */
    assert_true(fjg_set_score_root(g, bin(g, FJG_OP_ADD, score, clamped)) >= 0);
    assert_int_equal(fjg_score_has_tile_terms(g), 1);
    fjg_buf_init(&b);
    assert_int_equal(fjg_emit_forward_tu(g, &c, &b), FJ_OK);
    assert_non_null(strstr(b.data, "#define FJ_SCORE_TILE 1\n"));
    fjg_buf_free(&b);
    fjg_graph_destroy(g);
  }
}

/* A mask's row values (fjg_mask_row_values): its loads whose index reads q
 * but not kv, counted once each; a backward unit defines FJ_MASK_ROWS and
 * its prologue has fj_mask_rows and fj_mask_from_rows only where there are
 * any; its column values (fjg_mask_col_values) likewise, loads whose index
 * reads kv but not q, FJ_MASK_COLS in a forward unit (fuzz/specs checks
 * both against fj_mask). */
static void test_mask_values(void **state) {
  (void)state;
  fjg_config c, f;
  assert_int_equal(fjg_config_choose_backward(128, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, NULL, 0),
                   FJ_OK);
  assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, "sm_90a", "sm90", &f, NULL, 0),
                   FJ_OK);
  for (int k = 0; k < 5; k++) {
    fjg_graph *g = fjg_graph_create();
    nodes n = leaves(g);
    const int dq = fjg_load(g, n.doc, n.q), dkv = fjg_load(g, n.doc, n.kv);
    const int causal = bin(g, FJG_OP_GE, n.q, n.kv);
    int root = -1, want = 0, want_cols = 0;
    switch (k) {
    case 0:
      root = bin(g, FJG_OP_AND, bin(g, FJG_OP_EQ, dq, dkv), causal), want = 1, want_cols = 1;
      break;
    case 1: root = bin(g, FJG_OP_EQ, dkv, n.w), want_cols = 1; break;  /* kv only */
    case 2: root = causal; break;                                     /* no load */
    case 3:                                                           /* q + kv */
      root = bin(g, FJG_OP_EQ, fjg_load(g, n.doc, bin(g, FJG_OP_ADD, n.q, n.kv)), n.w);
      break;
    case 4:                                /* two: doc[q] and doc[doc[q] + h] */
      root = bin(g, FJG_OP_LT, fjg_load(g, n.doc, bin(g, FJG_OP_ADD, dq, n.h)), dkv), want = 2,
      want_cols = 1;
      break;
    default: break;
    }
    assert_true(fjg_set_mask_root(g, root) >= 0);
    if (fjg_mask_row_values(g) != want)
      fail_msg("case %d: %d row values, expected %d", k, fjg_mask_row_values(g), want);
    fjg_buf b;
    fjg_buf_init(&b);
    assert_int_equal(fjg_emit_backward_tu(g, &c, &b), FJ_OK);
    char def[48];
    snprintf(def, sizeof def, "#define FJ_MASK_ROWS %d\n", want);
    assert_int_equal(strstr(b.data, def) != NULL, want > 0);
    assert_int_equal(strstr(b.data, "void fj_mask_rows(") != NULL, want > 0);
    assert_int_equal(strstr(b.data, "bool fj_mask_from_rows(") != NULL, want > 0);
    fjg_buf_free(&b);
    if (fjg_mask_col_values(g) != want_cols)
      fail_msg("case %d: %d column values, expected %d", k, fjg_mask_col_values(g), want_cols);
    fjg_buf_init(&b);
    assert_int_equal(fjg_emit_forward_tu(g, &f, &b), FJ_OK);
    snprintf(def, sizeof def, "#define FJ_MASK_COLS %d\n", want_cols);
    assert_int_equal(strstr(b.data, def) != NULL, want_cols > 0);
    assert_int_equal(strstr(b.data, "void fj_mask_cols(") != NULL, want_cols > 0);
    assert_int_equal(strstr(b.data, "bool fj_mask_from_cols(") != NULL, want_cols > 0);
    fjg_buf_free(&b);
    fjg_graph_destroy(g);
  }
}

/* A score_mod that nests many products with invariant factors, or sums
 * many affine indices, keeps fj_score_log2 linear in its size: at most
 * eight values hoisted out of the element loop (k0 .. k7 and affine
 * splits), each factor defined once, not repeated at every leaf. */
static void test_score_log2_is_bounded(void **state) {
  (void)state;
  for (int shape = 0; shape < 2; shape++) {
    fjg_graph *g = fjg_graph_create();
    nodes n = leaves(g);
    int d = fjg_unary(g, FJG_OP_TO_F32, bin(g, FJG_OP_SUB, n.kv, n.q));
    int t = d, score = fjg_input_node(g, FJG_IN_SCORE);
    for (int i = 0; i < 150; i++) { /* within FJG_MAX_MOD_NODES */
      int di = fjg_unary(g, FJG_OP_TO_F32,
                         bin(g, FJG_OP_ADD, bin(g, FJG_OP_SUB, n.kv, n.q), k32(g, i + 1)));
      t = shape == 0 ? bin(g, FJG_OP_MUL, bin(g, FJG_OP_ADD, t, d), n.fp) /* a chain */
                     : bin(g, FJG_OP_ADD, t, di);                         /* a sum */
    }
    assert_true(fjg_set_score_root(g, bin(g, FJG_OP_ADD, score, t)) >= 0);
    assert_true(fjg_score_is_additive(g));
    fjg_buf b;
    fjg_buf_init(&b);
    assert_int_equal(fjg_emit_prologue(g, &b), FJ_OK);
    const char *body = strstr(b.data, "fj_score_log2(");
    const char *end = strstr(body, "fj_tile_class(");
    assert_non_null(body);
    assert_non_null(end);
    int splits = 0;
    for (const char *p = body; (p = strstr(p, "(unsigned)dq * ")) && p < end; p++) splits++;
    int factors = 0;
    for (const char *p = body; (p = strstr(p, "const float k")) && p < end; p++) factors++;
    if (factors + splits > 8 || factors < 1 || end - body > 100000)
      fail_msg("shape %d: %d factors, %d splits, %ld bytes", shape, factors, splits,
               (long)(end - body));
    fjg_buf_free(&b);
    fjg_graph_destroy(g);
  }
}

/* ---- i32 semantics at the edges ---- */

/* Lua's semantics written out independently: wrapping + - * and unary -,
 * floor division and floored modulo, x // 0 = x % 0 = 0. */
static int32_t lua_i32(fjg_op op, int32_t x, int32_t y) {
  int64_t a = x, b = y;
  switch (op) {
  case FJG_OP_ADD: return (int32_t)(uint32_t)(a + b);
  case FJG_OP_SUB: return (int32_t)(uint32_t)(a - b);
  case FJG_OP_MUL: return (int32_t)(uint32_t)(uint64_t)(a * b);
  case FJG_OP_NEG: return (int32_t)(uint32_t)(-a);
  case FJG_OP_ABS: return (int32_t)(uint32_t)(a < 0 ? -a : a);
  case FJG_OP_IDIV: {
    if (b == 0) return 0;
    int64_t q = a / b;
    if (q * b != a && ((a < 0) != (b < 0))) q--;
    return (int32_t)(uint32_t)q;
  }
  default: { /* MOD */
    if (b == 0) return 0;
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return (int32_t)r;
  }
  }
}

/* eq(op(x, y), z) for params x, y, z is true on the host-compiled emitted
 * code and in the evaluator for z = Lua's answer, on every pair of edge
 * values (INT32_MIN // -1, x % 0, wrapping products, ...). */
static void test_i32_edges(void **state) {
  (void)state;
  if (system("g++ --version > /dev/null 2>&1") != 0) skip();
  static const fjg_op ops[] = {FJG_OP_ADD, FJG_OP_SUB, FJG_OP_MUL, FJG_OP_NEG,
                               FJG_OP_ABS, FJG_OP_IDIV, FJG_OP_MOD};
  enum { N = sizeof ops / sizeof ops[0] };
  static const int32_t vals[] = {INT32_MIN, INT32_MIN + 1, -65536, -7, -2, -1, 0,
                                 1, 2, 3, 7, 65536, 46341, INT32_MAX - 1, INT32_MAX};
  fjg_graph *graphs[NUM_GRAPHS];
  for (int i = 0; i < NUM_GRAPHS; i++) {
    graphs[i] = fjg_graph_create();
    fjg_op op = ops[i % N];
    int x = fjg_param(graphs[i], "x", FJG_I32), y = fjg_param(graphs[i], "y", FJG_I32);
    int z = fjg_param(graphs[i], "z", FJG_I32);
    int r = op == FJG_OP_NEG || op == FJG_OP_ABS ? fjg_unary(graphs[i], op, x)
                                                 : bin(graphs[i], op, x, y);
    fjg_set_mask_root(graphs[i], bin(graphs[i], FJG_OP_EQ, r, z));
  }
  char dir[] = "/tmp/fj_emit_i32_XXXXXX";
  assert_non_null(mkdtemp(dir));
  void *lib = build_host_library(graphs, NUM_GRAPHS, dir);
  int sizes[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < N; i++) {
    mask_fn mask = (mask_fn)sym(lib, "mask", i);
    fjg_evaluator ev;
    for (size_t a = 0; a < sizeof vals / sizeof vals[0]; a++)
      for (size_t b = 0; b < sizeof vals / sizeof vals[0]; b++) {
        int32_t p[3] = {vals[a], vals[b], lua_i32(ops[i], vals[a], vals[b])};
        unsigned char params[64];
        fjg_user_params_pack(graphs[i], p, NULL, NULL, NULL, params);
        fjg_env env = {{1, 1, 1, 1, 1}, 0, 0, p, NULL, NULL, NULL};
        assert_int_equal(fjg_evaluator_init(&ev, graphs[i], &env), FJ_OK);
        if (fjg_eval_mask3(&ev, 0, 0, 0, 0) != FJG_ALLOWED ||
            !mask(params, sizes, 0, 0, 0, 0))
          fail_msg("%s(%d, %d): want %d, evaluator %d, emitted %d", fjg_op_name(ops[i]),
                   vals[a], vals[b], p[2], fjg_eval_mask3(&ev, 0, 0, 0, 0),
                   mask(params, sizes, 0, 0, 0, 0));
        fjg_evaluator_free(&ev);
      }
  }
  close_host_library(lib, graphs, NUM_GRAPHS, dir);
}

/* ---- the kernel's rounding, seen in PTX ---- */

/* PTX of the emitted prologue plus a kernel that calls fj_mask (or
 * fj_score_mod), for compute_80 through NVRTC. */
static char *probe_ptx(const fjg_graph *g, int score) {
  fjg_buf src;
  fjg_buf_init(&src);
  size_t len;
  const char *common = fjg_template_text("common/fj_common.cuh", &len);
  fjg_buf_append(&src, common, len);
  assert_int_equal(fjg_emit_interval_rules(g, &src), FJ_OK);
  assert_int_equal(fjg_emit_prologue(g, &src), FJ_OK);
  if (score)
    fjg_buf_printf(&src, "extern \"C\" __global__ void probe(fj_user_params u, fj_sizes z, float *o) {\n"
                         "  o[threadIdx.x] = fj_score_mod(u, z, o[threadIdx.x], 0, 0, threadIdx.x, blockIdx.x);\n}\n");
  else
    fjg_buf_printf(&src, "extern \"C\" __global__ void probe(fj_user_params u, fj_sizes z, int *o) {\n"
                         "  o[threadIdx.x] = fj_mask(u, z, 0, 0, threadIdx.x, blockIdx.x);\n}\n");
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, src.data, "probe.cu", 0, NULL, NULL), NVRTC_SUCCESS);
  const char *opts[] = {"--gpu-architecture=compute_80", "-std=c++17", "-default-device"};
  nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    char *log = calloc(1, n + 1);
    nvrtcGetProgramLog(prog, log);
    fail_msg("NVRTC: %s\n%.3000s\n%s", nvrtcGetErrorString(r), log, src.data);
  }
  size_t n = 0;
  nvrtcGetPTXSize(prog, &n);
  char *ptx = calloc(1, n + 1);
  nvrtcGetPTX(prog, ptx);
  nvrtcDestroyProgram(&prog);
  fjg_buf_free(&src);
  return ptx;
}

/* f32 arithmetic that decides something must round like the CPU's: every
 * add, sub, mul, div and sqrt with an explicit .rn (which ptxas never fuses)
 * and no fma. Without it NVRTC writes q / 49.0 * 49.0 as div.rn then mul.f32,
 * and a * b + c as one fma. */
static void assert_exact_ptx(const char *what, const char *ptx) {
  static const char *const loose[] = {"fma.", "add.f32", "sub.f32", "mul.f32",
                                      "div.f32", "div.approx", "div.full",
                                      "sqrt.approx", "add.ftz", "mul.ftz"};
  for (size_t i = 0; i < sizeof loose / sizeof loose[0]; i++)
    if (strstr(ptx, loose[i]))
      fail_msg("%s: '%s' in the PTX:\n%.6000s", what, loose[i], ptx);
}

static fjg_graph *q49_mask(void) {
  fjg_graph *g = fjg_graph_create();
  int q = fjg_unary(g, FJG_OP_TO_F32, fjg_input_node(g, FJG_IN_Q));
  int c = fjg_const_f32(g, 49.0f);
  fjg_set_mask_root(g, bin(g, FJG_OP_LT, bin(g, FJG_OP_MUL, bin(g, FJG_OP_DIV, q, c), c), q));
  return g;
}

static void test_decisive_f32_is_not_contracted(void **state) {
  (void)state;
  fjg_graph *g = q49_mask();
  char *ptx = probe_ptx(g, 0);
  assert_non_null(strstr(ptx, "div.rn.f32"));
  assert_non_null(strstr(ptx, "mul.rn.f32"));
  assert_exact_ptx("q / 49 * 49 < q", ptx);
  free(ptx);
  fjg_graph_destroy(g);

  /* a * b + c < d, sqrt, //, % in a mask. */
  g = fjg_graph_create();
  nodes n = leaves(g);
  int qf = fjg_unary(g, FJG_OP_TO_F32, n.q), kf = fjg_unary(g, FJG_OP_TO_F32, n.kv);
  int fma_like = bin(g, FJG_OP_ADD, bin(g, FJG_OP_MUL, qf, n.fp), kf);
  int r = bin(g, FJG_OP_MOD, fma_like, fjg_const_f32(g, 7.25f));
  r = bin(g, FJG_OP_SUB, r, bin(g, FJG_OP_IDIV, kf, fjg_unary(g, FJG_OP_SQRT, qf)));
  fjg_set_mask_root(g, bin(g, FJG_OP_LT, r, bin(g, FJG_OP_MUL, kf, kf)));
  ptx = probe_ptx(g, 0);
  assert_exact_ptx("a mask with * + % // sqrt", ptx);
  free(ptx);

  /* A score_mod's comparison operands are exact too; its continuous part
   * (score * 0.5 + q) may still be one fma. */
  int s = fjg_input_node(g, FJG_IN_SCORE);
  int cond = bin(g, FJG_OP_LT, bin(g, FJG_OP_ADD, bin(g, FJG_OP_MUL, kf, fjg_const_f32(g, 0.1f)),
                                    fjg_const_f32(g, 0.3f)), qf);
  fjg_set_score_root(g, fjg_where(g, cond, s, fjg_const_f32(g, -1e30f)));
  ptx = probe_ptx(g, 1);
  assert_exact_ptx("a score_mod's comparison", ptx);
  free(ptx);
  fjg_set_score_root(g, bin(g, FJG_OP_ADD, bin(g, FJG_OP_MUL, s, fjg_const_f32(g, 0.5f)), qf));
  ptx = probe_ptx(g, 1);
  assert_non_null(strstr(ptx, "fma.rn.f32"));
  free(ptx);
  fjg_graph_destroy(g);

  /* Random f32 masks without transcendentals (libdevice's expf has its own
   * fmas, which are part of its documented error). */
  for (int i = 0; i < 12; i++) {
    g = fjg_graph_create();
    n = leaves(g);
    int m;
    do {
      m = f32_mask(g, &n);
    } while (fjg_set_mask_root(g, m) < 0);
    int count, transcendental = 0;
    const int32_t *list = fjg_reachable(g, 0, &count);
    for (int k = 0; k < count; k++) {
      int op = fjg_node_at(g, list[k])->op;
      transcendental |= op == FJG_OP_EXP || op == FJG_OP_EXP2 || op == FJG_OP_LOG ||
                        op == FJG_OP_LOG2 || op == FJG_OP_TANH;
    }
    if (!transcendental) {
      ptx = probe_ptx(g, 0);
      assert_exact_ptx("a random f32 mask", ptx);
      free(ptx);
    }
    fjg_graph_destroy(g);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_user_params_layout),
      cmocka_unit_test(test_forward_tu_layout),
      cmocka_unit_test(test_score_sfu_define),
      cmocka_unit_test(test_template_parts),
      cmocka_unit_test(test_forward_tu_compiles_with_nvrtc),
      cmocka_unit_test(test_emitted_code_matches_cpu),
      cmocka_unit_test(test_division_by_constant),
      cmocka_unit_test(test_score_log2_additive),
      cmocka_unit_test(test_score_log2_is_bounded),
      cmocka_unit_test(test_score_tile),
      cmocka_unit_test(test_mask_values),
      cmocka_unit_test(test_i32_edges),
      cmocka_unit_test(test_decisive_f32_is_not_contracted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
