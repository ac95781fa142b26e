/*
 * tests/unit/test_nvrtc_templates.c: the forward template compiles with
 * NVRTC (CPU only, no GPU needed) for sm_80 and sm_90a, both dtypes and both
 * head dims, with two hand-written prologues in the generator's format:
 *   - a causal mask with score_mod = score;
 *   - no mask, a tanh softcap plus a bias read from an i32 buffer at an index
 *     taken modulo an i32 param.
 * The translation unit is assembled as gen/emit_cuda.c does (defines,
 * fj_common.cuh, prologue, fj_fwd.cuh, sm80/fwd.cuh) and needs no
 * include path: the template uses PTX for every conversion, mma, ldmatrix
 * and cp.async. Prints the NVRTC log on failure and each compile time.
 * Set FJ_TEST_NVRTC_DUMP=DIR to write the translation units.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <nvrtc.h>

#include "gen/config.h"

#ifndef FJ_SOURCE_DIR
#error "FJ_SOURCE_DIR must name the source tree"
#endif

static const char kCausal[] =
    "struct fj_user_params {\n  long long fj_reserved_;\n};\n"
    "__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,\n"
    "    int b, int h, int q, int kv) {\n  bool t0 = kv <= q;\n  return t0;\n}\n"
    "__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,\n"
    "    const fj_sizes &z, float score, int b, int h, int q, int kv) {\n"
    "  return score;\n}\n"
    "__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,\n"
    "    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1) {\n"
    "  if (kv0 > q1) return FJ_TILE_EMPTY;\n"
    "  if (kv1 <= q0) return FJ_TILE_FULL;\n"
    "  return FJ_TILE_PARTIAL;\n}\n";

static const char kSoftcapBias[] =
    "struct fj_user_params {\n  long long fj_reserved_;\n  int a_period;\n"
    "  const int *a_bias;\n  long long n_bias;\n};\n"
    "__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,\n"
    "    int b, int h, int q, int kv) {\n  return true;\n}\n"
    "__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,\n"
    "    const fj_sizes &z, float score, int b, int h, int q, int kv) {\n"
    "  float t0 = score / 30.0f;\n  float t1 = tanhf(t0);\n  float t2 = t1 * 30.0f;\n"
    "  int t3 = fj_mod_i32(kv, u.a_period);\n"
    "  int t4 = fj_load_i32(u.a_bias, u.n_bias, t3);\n"
    "  float t5 = (float)t4;\n  float t6 = t5 * 0.125f;\n  return t2 + t6;\n}\n"
    "__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,\n"
    "    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1) {\n"
    "  return FJ_TILE_FULL;\n}\n";

static char *slurp(const char *rel) {
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

static char *build_tu(const fjg_config *c, int has_mask, int has_score_mod,
                      const char *prologue) {
  char *common = slurp("templates/common/fj_common.cuh");
  char *params = slurp("templates/common/fj_fwd.cuh");
  char *fwd = slurp("templates/sm80/fwd.cuh");
  char defs[512];
  snprintf(defs, sizeof defs,
           "#define FJ_HEAD_DIM %d\n#define %s 1\n#define FJ_BLOCK_M %d\n"
           "#define FJ_BLOCK_N %d\n#define FJ_NUM_WARPS %d\n#define FJ_NUM_STAGES %d\n"
           "#define FJ_HAS_MASK %d\n#define FJ_HAS_SCORE_MOD %d\n",
           c->head_dim, c->dtype == FJ_DTYPE_F16 ? "FJ_DTYPE_F16" : "FJ_DTYPE_BF16",
           c->block_m, c->block_n, c->num_warps, c->num_stages, has_mask,
           has_score_mod);
  size_t n = strlen(defs) + strlen(common) + strlen(prologue) + strlen(params) +
             strlen(fwd) + 8;
  char *tu = malloc(n);
  assert_non_null(tu);
  snprintf(tu, n, "%s%s\n%s\n%s\n%s", defs, common, prologue, params, fwd);
  free(common);
  free(params);
  free(fwd);
  return tu;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Compiles one kernel and checks that a non-empty cubin comes out; returns
 * the NVRTC time in milliseconds. */
static double compile_one(const char *arch, int head_dim, fj_dtype dt, int has_mask,
                          int has_score_mod, const char *prologue, const char *what) {
  fjg_config c;
  char err[256];
  if (fjg_config_choose(head_dim, dt, arch, &c, err, sizeof err) != FJ_OK)
    fail_msg("config: %s", err);
  char *tu = build_tu(&c, has_mask, has_score_mod, prologue);
  const char *dump = getenv("FJ_TEST_NVRTC_DUMP");
  if (dump && *dump) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s_d%d_%s_%s.cu", dump, what, head_dim,
             dt == FJ_DTYPE_F16 ? "f16" : "bf16", arch);
    FILE *f = fopen(path, "w");
    if (f) {
      fputs(tu, f);
      fclose(f);
    }
  }
  char archopt[64];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
  const char *opts[] = {"-std=c++17", "-default-device", archopt};

  double t0 = now_ms();
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, tu, "fj_fwd.cu", 0, NULL, NULL), NVRTC_SUCCESS);
  nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  double ms = now_ms() - t0;
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  char *log = malloc(log_size + 1);
  assert_non_null(log);
  log[0] = '\0';
  if (log_size) nvrtcGetProgramLog(prog, log);
  if (r != NVRTC_SUCCESS) {
    fprintf(stderr, "NVRTC log (%s, D=%d, %s, %s):\n%s\n", what, head_dim,
            dt == FJ_DTYPE_F16 ? "f16" : "bf16", arch, log);
    fail_msg("nvrtcCompileProgram: %s", nvrtcGetErrorString(r));
  }
  size_t cubin_size = 0;
  assert_int_equal(nvrtcGetCUBINSize(prog, &cubin_size), NVRTC_SUCCESS);
  assert_true(cubin_size > 0);
  char *cubin = malloc(cubin_size);
  assert_non_null(cubin);
  assert_int_equal(nvrtcGetCUBIN(prog, cubin), NVRTC_SUCCESS);
  assert_memory_equal(cubin, "\177ELF", 4);
  printf("  %-12s D=%-3d %-4s %-7s %4d x %-3d w%d: %7.0f ms, cubin %zu bytes\n", what,
         head_dim, dt == FJ_DTYPE_F16 ? "f16" : "bf16", arch, c.block_m, c.block_n,
         c.num_warps, ms, cubin_size);
  free(cubin);
  free(log);
  nvrtcDestroyProgram(&prog);
  free(tu);
  return ms;
}

static void run_matrix(int has_mask, int has_score_mod, const char *prologue,
                       const char *what) {
  static const char *archs[] = {"sm_80", "sm_90a"};
  static const int dims[] = {64, 128};
  static const fj_dtype dts[] = {FJ_DTYPE_BF16, FJ_DTYPE_F16};
  double total = 0;
  int n = 0;
  for (size_t a = 0; a < 2; a++)
    for (size_t d = 0; d < 2; d++)
      for (size_t t = 0; t < 2; t++, n++)
        total += compile_one(archs[a], dims[d], dts[t], has_mask, has_score_mod,
                             prologue, what);
  printf("  %s: %d kernels, mean %.0f ms\n", what, n, total / n);
}

static void test_causal(void **state) {
  (void)state;
  run_matrix(1, 1, kCausal, "causal");
}

static void test_softcap_bias(void **state) {
  (void)state;
  run_matrix(0, 1, kSoftcapBias, "softcap+bias");
}

/* The template must reject a configuration it cannot run, at compile time. */
static void test_bad_config_rejected(void **state) {
  (void)state;
  const char *tu =
      "#define FJ_HEAD_DIM 96\n#define FJ_DTYPE_BF16 1\n#define FJ_BLOCK_M 128\n"
      "#define FJ_BLOCK_N 64\n#define FJ_NUM_WARPS 4\n#define FJ_NUM_STAGES 2\n"
      "#define FJ_HAS_MASK 0\n#define FJ_HAS_SCORE_MOD 0\n";
  char *common = slurp("templates/common/fj_common.cuh");
  char *params = slurp("templates/common/fj_fwd.cuh");
  char *fwd = slurp("templates/sm80/fwd.cuh");
  const char *pro = "struct fj_user_params { long long fj_reserved_; };\n";
  size_t n = strlen(tu) + strlen(common) + strlen(pro) + strlen(params) + strlen(fwd) + 8;
  char *src = malloc(n);
  assert_non_null(src);
  snprintf(src, n, "%s%s\n%s\n%s\n%s", tu, common, pro, params, fwd);
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, src, "bad.cu", 0, NULL, NULL), NVRTC_SUCCESS);
  const char *opts[] = {"-std=c++17", "-default-device", "--gpu-architecture=sm_80"};
  assert_int_not_equal(nvrtcCompileProgram(prog, 3, opts), NVRTC_SUCCESS);
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  char *log = calloc(1, log_size + 1);
  assert_non_null(log);
  nvrtcGetProgramLog(prog, log);
  assert_non_null(strstr(log, "head dim 64 or 128"));
  free(log);
  nvrtcDestroyProgram(&prog);
  free(src);
  free(common);
  free(params);
  free(fwd);
}

int main(void) {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  printf("NVRTC %d.%d\n", major, minor);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_causal),
      cmocka_unit_test(test_softcap_bias),
      cmocka_unit_test(test_bad_config_rejected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
