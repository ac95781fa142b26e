/*
 * tests/unit/test_nvrtc_templates.c: the forward template compiles with
 * NVRTC (CPU only, no GPU needed) for sm_80 and sm_90a, both dtypes and both
 * head dims (and the sm_89 shapes), with two hand-written prologues in the
 * generator's format:
 *   - a causal mask with score_mod = score;
 *   - no mask, a tanh softcap plus a bias read from an i32 buffer at an index
 *     taken modulo an i32 param.
 * The translation unit is assembled as gen/emit_cuda.c does (defines, then
 * the parts gen/templates.c lists for the sm80 forward kernel;
 * tests/unit/template_tu.h) and needs no include path: the template uses PTX for every conversion, mma, ldmatrix
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
#include "tests/unit/template_tu.h"

/* Compiles one kernel and checks that a non-empty cubin comes out; returns
 * the NVRTC time in milliseconds. */
static double compile_one(const char *arch, int head_dim, fj_dtype dt, int has_mask,
                          int has_score_mod, const char *prologue, const char *what) {
  fjg_config c;
  char err[256];
  if (fjg_config_choose(head_dim, dt, arch, &c, err, sizeof err) != FJ_OK)
    fail_msg("config: %s", err);
  char *tu = fjt_build_tu(&c, has_mask, has_score_mod, prologue, "");
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

  double t0 = fjt_now_ms();
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, tu, "fj_fwd.cu", 0, NULL, NULL), NVRTC_SUCCESS);
  nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  double ms = fjt_now_ms() - t0;
  char *log = fjt_program_log(prog);
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
  run_matrix(1, 1, fjt_causal, "causal");
}

static void test_softcap_bias(void **state) {
  (void)state;
  run_matrix(0, 1, fjt_softcap_bias, "softcap+bias");
}

/* The shapes of parts with about 100 KiB of shared memory (sm_86, sm_89,
 * sm_120): at D=128 a warp owns 16 rows and keeps Q in registers, a path
 * the sm_80 and sm_90a shapes (32 rows a warp) do not take. */
static void test_small_smem_shapes(void **state) {
  (void)state;
  fjg_config c;
  assert_int_equal(fjg_config_choose(128, FJ_DTYPE_BF16, "sm_89", &c, NULL, 0), FJ_OK);
  assert_int_equal(c.block_m / c.num_warps, 16);
  compile_one("sm_89", 128, FJ_DTYPE_BF16, 1, 1, fjt_causal, "causal");
  compile_one("sm_89", 64, FJ_DTYPE_F16, 0, 1, fjt_softcap_bias, "softcap+bias");
}

/* The template must reject a configuration it cannot run, at compile time. */
static void test_bad_config_rejected(void **state) {
  (void)state;
  fjg_config c;
  char err[256];
  if (fjg_config_choose(64, FJ_DTYPE_BF16, "sm_80", &c, err, sizeof err) != FJ_OK)
    fail_msg("config: %s", err);
  c.head_dim = 96;  /* what fjg_config_choose refuses; the template must too */
  char *src = fjt_build_tu(&c, 0, 0, "struct fj_user_params { long long fj_reserved_; };\n", "");
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, src, "bad.cu", 0, NULL, NULL), NVRTC_SUCCESS);
  const char *opts[] = {"-std=c++17", "-default-device", "--gpu-architecture=sm_80"};
  assert_int_not_equal(nvrtcCompileProgram(prog, 3, opts), NVRTC_SUCCESS);
  char *log = fjt_program_log(prog);
  assert_non_null(strstr(log, "head dim 64 or 128"));
  free(log);
  nvrtcDestroyProgram(&prog);
  free(src);
}

int main(void) {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  printf("NVRTC %d.%d\n", major, minor);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_causal),
      cmocka_unit_test(test_softcap_bias),
      cmocka_unit_test(test_small_smem_shapes),
      cmocka_unit_test(test_bad_config_rejected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
