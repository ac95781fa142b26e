/* tests/unit/test_golden_emit.c: snapshots of the emitted prologue for the
 * standard specs (tests/golden/<name>.cu), and an NVRTC compile of each for
 * sm_80 to prove the emitted code is valid CUDA.
 *
 * To accept a deliberate change of the emitter, regenerate the snapshots:
 *   FJ_GOLDEN_UPDATE=1 ctest -R golden     (or: cmake --build . -t golden-update)
 * and review the diff of tests/golden/. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <nvrtc.h>

#include "gen/emit_cuda.h"
#include "gen/graph.h"
#include "gen/templates.h"

typedef struct spec {
  const char *name;
  const char *source; /* what a user would have written */
  void (*build)(fjg_graph *g);
} spec;

static int in(fjg_graph *g, fjg_input which) { return fjg_input_node(g, which); }

static int causal_of(fjg_graph *g) {
  return fjg_binary(g, FJG_OP_GE, in(g, FJG_IN_Q), in(g, FJG_IN_KV));
}

static void build_causal(fjg_graph *g) {
  assert_int_equal(fjg_set_mask_root(g, causal_of(g)), 0);
}

static void build_sliding_window(fjg_graph *g) {
  int w = fjg_param(g, "window", FJG_I32);
  int d = fjg_binary(g, FJG_OP_SUB, in(g, FJG_IN_Q), in(g, FJG_IN_KV));
  int m = fjg_binary(g, FJG_OP_AND, causal_of(g), fjg_binary(g, FJG_OP_LT, d, w));
  assert_int_equal(fjg_set_mask_root(g, m), 0);
}

static void build_document(fjg_graph *g) {
  int doc = fjg_buffer(g, "doc_id", FJG_I32);
  int same = fjg_binary(g, FJG_OP_EQ, fjg_load(g, doc, in(g, FJG_IN_Q)),
                        fjg_load(g, doc, in(g, FJG_IN_KV)));
  assert_int_equal(fjg_set_mask_root(g, fjg_binary(g, FJG_OP_AND, same, causal_of(g))), 0);
}

/* slope = 2^(-8 (h + 1) / Hq); score - slope * (q - kv), under causal. */
static void build_alibi(fjg_graph *g) {
  int h1 = fjg_binary(g, FJG_OP_ADD, in(g, FJG_IN_H), fjg_const_i32(g, 1));
  int e = fjg_binary(g, FJG_OP_DIV, fjg_binary(g, FJG_OP_MUL, fjg_const_i32(g, -8), h1),
                     fjg_size_node(g, FJG_SZ_HQ));
  int slope = fjg_unary(g, FJG_OP_EXP2, e);
  int d = fjg_binary(g, FJG_OP_SUB, in(g, FJG_IN_Q), in(g, FJG_IN_KV));
  int s = fjg_binary(g, FJG_OP_SUB, in(g, FJG_IN_SCORE),
                     fjg_binary(g, FJG_OP_MUL, slope, d));
  assert_int_equal(fjg_set_mask_root(g, causal_of(g)), 0);
  assert_int_equal(fjg_set_score_root(g, s), 0);
}

/* cap * tanh(score / cap), with a float bias table and a 1/3 constant. */
static void build_softcap(fjg_graph *g) {
  int cap = fjg_param(g, "cap", FJG_F32);
  int bias = fjg_buffer(g, "rel_bias", FJG_F32);
  int s = in(g, FJG_IN_SCORE);
  int t = fjg_unary(g, FJG_OP_TANH, fjg_binary(g, FJG_OP_DIV, s, cap));
  int d = fjg_unary(g, FJG_OP_ABS, fjg_binary(g, FJG_OP_SUB, in(g, FJG_IN_Q),
                                              in(g, FJG_IN_KV)));
  int b = fjg_binary(g, FJG_OP_MUL, fjg_load(g, bias, fjg_binary(g, FJG_OP_MOD, d,
                                                                fjg_const_i32(g, 32))),
                     fjg_const_f32(g, 1.0f / 3.0f));
  int r = fjg_binary(g, FJG_OP_ADD, fjg_binary(g, FJG_OP_MUL, cap, t), b);
  assert_int_equal(fjg_set_score_root(g, r), 0);
}

static const spec specs[] = {
    {"causal", "return { name = \"causal\", mask_mod = causal() }\n",
     build_causal},
    {"sliding_window",
     "local window = param(\"window\", \"i32\")\n"
     "return {\n  name = \"sliding_window\",\n"
     "  mask_mod = and_masks(causal(), function(b, h, q, kv) return lt(q - kv, window) end),\n}\n",
     build_sliding_window},
    {"document",
     "-- packed sequences; a comment that tries to end the C comment: */\n"
     "local doc = buffer(\"doc_id\", \"i32\")\n"
     "return { mask_mod = and_masks(causal(), document(doc)) }\n",
     build_document},
    {"alibi",
     "return {\n  mask_mod = causal(),\n"
     "  score_mod = function(s, b, h, q, kv)\n"
     "    return s - exp2(-8 * (h + 1) / Hq) * (q - kv)\n  end,\n}\n",
     build_alibi},
    {"softcap",
     "local cap = param(\"cap\", \"f32\")\nlocal bias = buffer(\"rel_bias\", \"f32\")\n"
     "return { score_mod = function(s, b, h, q, kv)\n"
     "  return cap * tanh(s / cap) + bias[abs(q - kv) % 32] * (1 / 3)\nend }\n",
     build_softcap},
};
enum { NUM_SPECS = sizeof specs / sizeof specs[0] };

static char *emit(const spec *sp) {
  fjg_graph *g = fjg_graph_create();
  sp->build(g);
  fjg_buf b;
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_prologue(g, &b), FJ_OK);
  fjg_graph_destroy(g);
  return b.data; /* NUL-terminated by fjg_buf */
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = '\0';
  fclose(f);
  return s;
}

static void test_goldens(void **state) {
  (void)state;
  const char *update = getenv("FJ_GOLDEN_UPDATE");
  for (int i = 0; i < NUM_SPECS; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/tests/golden/%s.cu", FJ_SOURCE_DIR, specs[i].name);
    char *got = emit(&specs[i]);
    /* Deterministic: emitting twice gives the same bytes. */
    char *again = emit(&specs[i]);
    assert_string_equal(got, again);
    free(again);
    if (update && strcmp(update, "1") == 0) {
      FILE *f = fopen(path, "wb");
      assert_non_null(f);
      fputs(got, f);
      fclose(f);
      print_message("updated %s\n", path);
    } else {
      char *want = read_file(path);
      if (!want)
        fail_msg("missing %s; run with FJ_GOLDEN_UPDATE=1 to create it", path);
      if (strcmp(got, want) != 0)
        fail_msg("%s differs from the emitter's output; if the change is "
                 "intended, rerun with FJ_GOLDEN_UPDATE=1 and review the diff",
                 path);
      free(want);
    }
    free(got);
  }
}

/* A kernel that calls the three hooks, so each is instantiated. */
static const char *const hook_kernel =
    "\nextern \"C\" __global__ void fj_test_hooks(fj_user_params u, fj_sizes z,\n"
    "    float *out, int *cls) {\n"
    "  int q = threadIdx.x, kv = blockIdx.x;\n"
    "  out[q] = fj_mask(u, z, 0, 1, q, kv) ? fj_score_mod(u, z, 1.0f, 0, 1, q, kv) : 0.0f;\n"
    "  cls[q] = fj_tile_class(u, z, 0, 1, q, q + 63, kv, kv + 63);\n"
    "}\n";

static void nvrtc_compile(const char *name, const char *prologue) {
  fjg_buf src;
  fjg_buf_init(&src);
  size_t len;
  const char *common = fjg_template_text("common/fj_common.cuh", &len);
  assert_non_null(common);
  fjg_buf_append(&src, common, len);
  assert_int_equal(fjg_emit_interval_rules(NULL, &src), FJ_OK);
  fjg_buf_printf(&src, "%s%s", prologue, hook_kernel);
  assert_false(src.failed);
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, src.data, name, 0, NULL, NULL),
                   NVRTC_SUCCESS);
  const char *opts[] = {"--gpu-architecture=sm_80", "-std=c++17"};
  nvrtcResult r = nvrtcCompileProgram(prog, 2, opts);
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  char *log = calloc(1, log_size + 1);
  nvrtcGetProgramLog(prog, log);
  if (r != NVRTC_SUCCESS)
    fail_msg("NVRTC failed on %s (%s):\n%s", name, nvrtcGetErrorString(r), log);
  size_t cubin = 0;
  assert_int_equal(nvrtcGetCUBINSize(prog, &cubin), NVRTC_SUCCESS);
  assert_true(cubin > 0);
  free(log);
  nvrtcDestroyProgram(&prog);
  fjg_buf_free(&src);
}

static void test_nvrtc_compiles(void **state) {
  (void)state;
  for (int i = 0; i < NUM_SPECS; i++) {
    char *got = emit(&specs[i]);
    nvrtc_compile(specs[i].name, got);
    free(got);
  }
  /* An empty spec (no mask, no score_mod) compiles too. */
  fjg_graph *g = fjg_graph_create();
  fjg_buf b;
  fjg_buf_init(&b);
  assert_int_equal(fjg_emit_prologue(g, &b), FJ_OK);
  nvrtc_compile("empty", b.data);
  fjg_buf_free(&b);
  fjg_graph_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_goldens),
      cmocka_unit_test(test_nvrtc_compiles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
