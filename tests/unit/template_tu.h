/*
 * tests/unit/template_tu.h: what the template compile tests (test_nvrtc_templates
 * for sm80, test_sm90_compile for sm90, test_bwd_compile for the backward,
 * test_decode_compile for decode) share: hand-written prologues in the
 * generator's format, and the translation unit assembled the way
 * gen/emit_cuda.c does (defines, then the kernel's parts as gen/templates.c
 * lists them, the prologue among them), from the source tree's templates;
 * FJ_DETERMINISTIC and FJ_VARLEN where the configuration asks for them; and
 * what they do with a compile: its PTX, its failure, ptxas's log read for
 * spills and static shared memory, the targets' shared-memory limits, and
 * the files FJ_TEST_NVRTC_DUMP asks for.
 * Include after <cmocka.h> and <nvrtc.h>; needs FJ_SOURCE_DIR.
 */
#ifndef FJ_TESTS_TEMPLATE_TU_H
#define FJ_TESTS_TEMPLATE_TU_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gen/config.h"
#include "gen/templates.h"

#ifndef FJ_SOURCE_DIR
#error "FJ_SOURCE_DIR must name the source tree"
#endif

/* fj_score_log2 in the generator's form for a score_mod that is not
 * additive, after each prologue's fj_score_mod. */
#define FJT_SCORE_LOG2                                                                     \
  "__device__ __forceinline__ float fj_score_log2(const fj_user_params &u,\n"             \
  "    const fj_sizes &z, float qk, float scale, int b, int h, int qb, int dq, int kvb,\n" \
  "    int dk) {\n"                                                                        \
  "  return fj_score_mod(u, z, qk * scale, b, h, qb + dq, kvb + dk) * 1.44269502f;\n}\n"

/* A causal mask, score_mod = score. */
static const char fjt_causal[] =
    "struct fj_user_params {\n  long long fj_reserved_;\n};\n"
    "__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,\n"
    "    int b, int h, int q, int kv) {\n  bool t0 = kv <= q;\n  return t0;\n}\n"
    "__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,\n"
    "    const fj_sizes &z, float score, int b, int h, int q, int kv) {\n"
    "  return score;\n}\n" FJT_SCORE_LOG2
    "__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,\n"
    "    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1) {\n"
    "  if (kv0 > q1) return FJ_TILE_EMPTY;\n"
    "  if (kv1 <= q0) return FJ_TILE_FULL;\n"
    "  return FJ_TILE_PARTIAL;\n}\n";

/* No mask; a tanh softcap (as the emitter writes it: the constant division
 * as a multiplication) plus a bias read from an i32 buffer at an index taken
 * modulo an i32 param. */
static const char fjt_softcap_bias[] =
    "struct fj_user_params {\n  long long fj_reserved_;\n  int a_period;\n"
    "  const int *a_bias;\n  long long n_bias;\n};\n"
    "__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,\n"
    "    int b, int h, int q, int kv) {\n  return true;\n}\n"
    "__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,\n"
    "    const fj_sizes &z, float score, int b, int h, int q, int kv) {\n"
    "  float t0 = score * 0.0333333351f;\n  float t1 = fj_tanh_f32(t0);\n  float t2 = t1 * 30.0f;\n"
    "  int t3 = fj_mod_i32(kv, u.a_period);\n"
    "  int t4 = fj_load_i32(u.a_bias, u.n_bias, t3);\n"
    "  float t5 = (float)t4;\n  float t6 = t5 * 0.125f;\n  return t2 + t6;\n}\n" FJT_SCORE_LOG2
    "__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,\n"
    "    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1) {\n"
    "  return FJ_TILE_FULL;\n}\n";

/* For the backward unit: a causal mask; a tanh softcap plus a bias from a
 * trainable f32 buffer read at the relative position kv - q + 64 (the
 * generator's fj_score_grad: ds times d score_mod / d score returned, ds
 * added to the buffer's gradient where the read is inside it, summed over a
 * tile where fj_grad_tile finds its index one value). Compiled with
 * every combination of FJ_HAS_MASK and FJ_HAS_SCORE_MOD. */
static const char fjt_bwd_causal_softcap_bias[] =
    "struct fj_user_params {\n  long long fj_reserved_;\n  const float *a_bias;\n"
    "  long long n_bias;\n};\n"
    "struct fj_user_grads {\n  float *g_bias;\n};\n"
    "struct fj_grad_cache {\n  fj_grad_slot s0;\n  int u0 = FJ_GRAD_VARIES;\n"
    "  float a0 = 0.0f;\n};\n"
    "__device__ __forceinline__ void fj_grad_flush(const fj_user_grads &gr, "
    "fj_grad_cache &gc) {\n  fj_grad_slot_flush(gc.s0, gr.g_bias);\n}\n"
    "__device__ __forceinline__ void fj_grad_tile(const fj_user_params &u,\n"
    "    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1, "
    "fj_grad_cache &gc) {\n"
    "  const long long lo = kv0 - (long long)q1 + 64, hi = kv1 - (long long)q0 + 64;\n"
    "  gc.u0 = lo != hi ? FJ_GRAD_VARIES : fj_buf_in(u.n_bias, (int)lo) ? (int)lo : -1;\n}\n"
    "__device__ __forceinline__ bool fj_grad_tile_uniform(const fj_grad_cache &gc) {\n"
    "  return gc.u0 != FJ_GRAD_VARIES;\n}\n"
    "__device__ __forceinline__ void fj_grad_tile_end(const fj_user_grads &gr, "
    "fj_grad_cache &gc) {\n"
    "  if (gc.u0 != FJ_GRAD_VARIES) fj_grad_add(gc.s0, gr.g_bias, gc.u0 >= 0, gc.u0, gc.a0);\n"
    "  gc.u0 = FJ_GRAD_VARIES;\n  gc.a0 = 0.0f;\n}\n"
    "__device__ __forceinline__ void fj_grad_bufs(const fj_user_params &u,\n"
    "    const fj_user_grads &gr, fj_grad_cache &gc, const fj_sizes &z, int b, int h, int q,\n"
    "    int kv, float ds) {}\n"
    "__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,\n"
    "    int b, int h, int q, int kv) {\n  bool t0 = kv <= q;\n  return t0;\n}\n"
    "__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,\n"
    "    const fj_sizes &z, float score, int b, int h, int q, int kv) {\n"
    "  float t0 = score * 0.0333333351f;\n  float t1 = fj_tanh_f32(t0);\n"
    "  float t2 = t1 * 30.0f;\n  int t3 = kv - q;\n  int t4 = t3 + 64;\n"
    "  float t5 = fj_load_f32(u.a_bias, u.n_bias, t4);\n  return t2 + t5;\n}\n" FJT_SCORE_LOG2
    "__device__ __forceinline__ float fj_score_grad(const fj_user_params &u,\n"
    "    const fj_user_grads &g, fj_grad_cache &gc, const fj_sizes &z, float score, int b,\n"
    "    int h, int q, int kv, float ds) {\n"
    "  float t0 = score * 0.0333333351f;\n  float t1 = fj_tanh_f32(t0);\n"
    "  float t2 = t1 * t1;\n  float t3 = 1.0f - t2;\n  int t4 = kv - q;\n"
    "  int t5 = t4 + 64;\n"
    "  if (gc.u0 != FJ_GRAD_VARIES)\n    gc.a0 += ds != 0.0f ? ds : 0.0f;\n  else\n"
    "    fj_grad_add(gc.s0, g.g_bias, ds != 0.0f && fj_buf_in(u.n_bias, t5), t5, ds);\n"
    "  return ds * t3;\n}\n"
    "__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,\n"
    "    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1) {\n"
    "  if (kv0 > q1) return FJ_TILE_EMPTY;\n"
    "  if (kv1 <= q0) return FJ_TILE_FULL;\n"
    "  return FJ_TILE_PARTIAL;\n}\n";

/* A file of the source tree, NUL-terminated (malloc'd). */
static char *fjt_slurp(const char *rel) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", FJ_SOURCE_DIR, rel);
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  assert_non_null(s);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = '\0';
  fclose(f);
  return s;
}

/* The translation unit of c->template_name's `kernel` ("forward",
 * "backward") with this prologue, then `tail` (extra checks; may be ""): its
 * parts in the order gen/templates.c lists them, read from the source tree.
 * malloc'd. */
static char *fjt_build_kernel_tu(const fjg_config *c, const char *kernel, int has_mask,
                                 int has_score_mod, const char *prologue,
                                 const char *tail) {
  const char *const *parts = fjg_template_parts(c->template_name, kernel);
  assert_non_null(parts);
  char defs[512];
  snprintf(defs, sizeof defs,
           "#define FJ_HEAD_DIM %d\n#define %s 1\n#define FJ_BLOCK_M %d\n"
           "#define FJ_BLOCK_N %d\n#define FJ_NUM_WARPS %d\n#define FJ_NUM_STAGES %d\n"
           "#define FJ_HAS_MASK %d\n#define FJ_HAS_SCORE_MOD %d\n"
           "#define FJ_PERSISTENT %d\n#define FJ_Q_BUFS %d\n%s%s",
           c->head_dim, c->dtype == FJ_DTYPE_F16 ? "FJ_DTYPE_F16" : "FJ_DTYPE_BF16",
           c->block_m, c->block_n, c->num_warps, c->num_stages, has_mask,
           has_score_mod, c->persistent, c->q_bufs > 1 ? c->q_bufs : 1,
           c->deterministic ? "#define FJ_DETERMINISTIC 1\n" : "",
           c->varlen ? "#define FJ_VARLEN 1\n" : "");
  size_t n = strlen(defs) + strlen(tail) + 1, used = 0;
  char *tu = malloc(n);
  assert_non_null(tu);
  memcpy(tu, defs, strlen(defs) + 1);
  used = strlen(defs);
  for (const char *const *part = parts; *part; part++) {
    char rel[256];
    snprintf(rel, sizeof rel, "templates/%s", *part);
    char *text = strcmp(*part, FJG_PART_PROLOGUE) == 0 ? NULL : fjt_slurp(rel);
    const char *piece = text ? text : prologue;
    const size_t len = strlen(piece);
    n += len + 1;
    tu = realloc(tu, n);
    assert_non_null(tu);
    memcpy(tu + used, piece, len);
    tu[used + len] = '\n';
    used += len + 1;
    free(text);
  }
  memcpy(tu + used, tail, strlen(tail) + 1);
  return tu;
}

/* The forward kernel's translation unit (fjt_build_kernel_tu). */
static inline char *fjt_build_tu(const fjg_config *c, int has_mask, int has_score_mod,
                          const char *prologue, const char *tail) {
  return fjt_build_kernel_tu(c, "forward", has_mask, has_score_mod, prologue, tail);
}

/* NVRTC's log of a program (malloc'd, "" when empty). */
static char *fjt_program_log(nvrtcProgram prog) {
  size_t n = 0;
  nvrtcGetProgramLogSize(prog, &n);
  char *log = calloc(1, n + 1);
  assert_non_null(log);
  if (n) nvrtcGetProgramLog(prog, log);
  return log;
}

/* The PTX of a compiled program (malloc'd). */
static inline char *fjt_program_ptx(nvrtcProgram prog) {
  size_t n = 0;
  assert_int_equal(nvrtcGetPTXSize(prog, &n), NVRTC_SUCCESS);
  char *ptx = malloc(n);
  assert_non_null(ptx);
  assert_int_equal(nvrtcGetPTX(prog, ptx), NVRTC_SUCCESS);
  return ptx;
}

/* Fails the test, with NVRTC's log on stderr, unless `what` compiled. */
static inline void fjt_require_compiled(nvrtcResult r, const char *log, const char *what) {
  if (r == NVRTC_SUCCESS) return;
  fprintf(stderr, "NVRTC log (%s):\n%s\n", what, log);
  fail_msg("nvrtcCompileProgram (%s): %s", what, nvrtcGetErrorString(r));
}

/* With FJ_TEST_NVRTC_DUMP=DIR, writes text (a translation unit, its log,
 * its PTX) to DIR/stem.ext, so a failing compile can be read and rerun. */
static inline void fjt_dump(const char *stem, const char *ext, const char *text) {
  const char *dir = getenv("FJ_TEST_NVRTC_DUMP");
  if (!dir || !*dir) return;
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.%s", dir, stem, ext);
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

/* ptxas -v says "N bytes spill stores, M bytes spill loads" per function;
 * every such line must read 0 and 0 (`what` names the unit in a failure).
 * Returns the number of lines seen, one a kernel. */
static inline int fjt_check_no_spills(const char *log, const char *what) {
  int lines = 0;
  for (const char *p = strstr(log, "bytes spill stores"); p;
       p = strstr(p + 1, "bytes spill stores")) {
    const char *line = p;
    while (line > log && line[-1] != '\n') line--;
    unsigned long st = 0, ld = 0;
    const char *comma = strchr(line, ',');
    assert_non_null(comma);
    if (sscanf(comma + 1, " %lu bytes spill stores, %lu bytes spill loads", &st, &ld) != 2)
      fail_msg("%s: cannot parse ptxas line: %.80s", what, line);
    if (st || ld) fail_msg("%s spills: %.100s", what, line);
    lines++;
  }
  return lines;
}

/* The largest "N bytes smem" of ptxas's log (a function's static shared
 * memory), 0 when no function has any. */
static inline int fjt_max_static_smem(const char *log) {
  int most = 0;
  for (const char *p = strstr(log, "bytes smem"); p; p = strstr(p + 1, "bytes smem")) {
    const char *s = p;
    while (s > log && s[-1] == ' ') s--;
    while (s > log && s[-1] >= '0' && s[-1] <= '9') s--;
    if (atoi(s) > most) most = atoi(s);
  }
  return most;
}

/* Largest dynamic shared memory a block may opt in to on arch (gen/config.c's
 * table, restated: a test must catch a configuration that outgrows it). */
static inline int fjt_smem_limit(const char *arch) {
  if (!strcmp(arch, "sm_80")) return 163 * 1024;
  if (!strcmp(arch, "sm_86") || !strcmp(arch, "sm_89") || !strcmp(arch, "sm_120"))
    return 99 * 1024;
  return 227 * 1024;
}

static double fjt_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#endif /* FJ_TESTS_TEMPLATE_TU_H */
