/*
 * tests/unit/test_decode_compile.c: the decode kernel's configuration
 * (fjg_config_choose_decode), its part list, and its translation unit
 * compiled with NVRTC (CPU only): sm_80, sm_86 and sm_90a, head dims 64 and
 * 128, bf16 and fp16, 16 and 32-row blocks, 4 and 8 warps, with and without
 * a mask and a score_mod, without spills, within the target's shared memory, the
 * template's shared-memory map equal to the configuration's; and the
 * serving utility unit (LSE merge, CSR conversion). Set
 * FJ_TEST_NVRTC_DUMP=DIR to write the translation units and logs.
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

static void test_config(void **state) {
  (void)state;
  static const char *archs[] = {"sm_80", "sm_86", "sm_90a", "sm_100a", "sm_120"};
  for (size_t a = 0; a < sizeof archs / sizeof *archs; a++)
    for (int d = 64; d <= 128; d *= 2)
      for (int rows = 1; rows <= 64; rows *= 2) {
        fjg_config c;
        char err[256];
        if (fjg_config_choose_decode(d, FJ_DTYPE_BF16, archs[a], rows, 0, 0, &c, err,
                                     sizeof err) != FJ_OK)
          fail_msg("%s D=%d rows %d: %s", archs[a], d, rows, err);
        assert_int_equal(c.num_warps, 4);
        assert_string_equal(c.template_name, "sm80");
        assert_int_equal(c.block_m, rows > 16 ? 32 : 16);
        assert_int_equal(c.block_n, 16 * c.num_warps);
        assert_int_equal(c.threads, 32 * c.num_warps);
        assert_true(c.num_stages >= 2);
        assert_true(c.smem_bytes > 0 && c.smem_bytes <= fjt_smem_limit(archs[a]));
        assert_int_equal(c.uses_tma, 0);
      }
  fjg_config c;
  char err[256];
  /* 8 warps: two stages, one CTA a multiprocessor; not at D=128 on parts of
   * 100 KiB. */
  assert_int_equal(fjg_config_choose_decode(128, FJ_DTYPE_BF16, "sm_90a", 4, 8, 0, &c, err,
                                            sizeof err),
                   FJ_OK);
  assert_int_equal(c.num_warps, 8);
  assert_int_equal(c.block_n, 128);
  assert_int_equal(c.threads, 256);
  assert_int_equal(c.num_stages, 2);
  assert_int_equal(fjg_config_choose_decode(128, FJ_DTYPE_BF16, "sm_86", 4, 8, 0, &c, err,
                                            sizeof err),
                   FJ_EUNSUPPORTED);
  assert_non_null(strstr(err, "shared memory"));
  assert_int_equal(fjg_config_choose_decode(64, FJ_DTYPE_BF16, "sm_86", 4, 8, 0, &c, err,
                                            sizeof err),
                   FJ_OK);
  assert_int_equal(fjg_config_choose_decode(128, FJ_DTYPE_BF16, "sm_90a", 4, 6, 0, &c, err,
                                            sizeof err),
                   FJ_EUNSUPPORTED);
  assert_non_null(strstr(err, "4 or 8 warps"));
  assert_int_equal(fjg_config_choose_decode(256, FJ_DTYPE_BF16, "sm_90a", 4, 0, 0, &c, err,
                                            sizeof err),
                   FJ_EUNSUPPORTED);
  assert_non_null(strstr(err, "64 and 128"));
  assert_int_equal(fjg_config_choose_decode(128, FJ_DTYPE_BF16, "sm_90a", 4, 0, 1, &c, err,
                                            sizeof err),
                   FJ_EUNSUPPORTED);
  assert_int_equal(fjg_config_choose_decode(128, FJ_DTYPE_BF16, "sm_90a", 4, 0, 40, &c, err,
                                            sizeof err),
                   FJ_EUNSUPPORTED);
  assert_non_null(strstr(err, "shared memory"));
  assert_int_equal(fjg_config_choose_util(FJ_DTYPE_BF16, "sm_90a", &c, err, sizeof err), FJ_OK);
  assert_string_equal(c.template_name, "common");
}

static void test_parts(void **state) {
  (void)state;
  const char *const *kinds[] = {fjg_template_parts("sm80", "decode"),
                                fjg_template_parts("common", "util")};
  for (int i = 0; i < 2; i++) {
    assert_non_null(kinds[i]);
    for (const char *const *p = kinds[i]; *p; p++)
      if (strcmp(*p, FJG_PART_PROLOGUE) != 0 && !fjg_template_text(*p, NULL))
        fail_msg("part %s is not embedded", *p);
  }
}

/* Compiles tu for arch (with `def`, an NVRTC option, unless NULL);
 * returns the PTX (malloc'd) after checking spills. */
static char *compile_with(const char *tu, const char *arch, const char *what, int kernels,
                          const char *def) {
  fjt_dump(what, "cu", tu);
  char archopt[64];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
  const char *opts[] = {"-std=c++17", "-default-device", archopt, "--ptxas-options=-v", def};
  const double t0 = fjt_now_ms();
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, tu, "fj_dec.cu", 0, NULL, NULL), NVRTC_SUCCESS);
  nvrtcResult r = nvrtcCompileProgram(prog, def ? 5 : 4, opts);
  const double ms = fjt_now_ms() - t0;
  char *log = fjt_program_log(prog);
  fjt_dump(what, "log", log);
  fjt_require_compiled(r, log, what);
  assert_int_equal(fjt_check_no_spills(log, what), kernels);
  const char *regs = strstr(log, "Used ");
  printf("  %-36s %6.0f ms  %.40s\n", what, ms, regs ? regs : "");
  char *ptx = fjt_program_ptx(prog);
  free(log);
  nvrtcDestroyProgram(&prog);
  return ptx;
}

static char *compile(const char *tu, const char *arch, const char *what, int kernels) {
  return compile_with(tu, arch, what, kernels, NULL);
}

static void compile_decode(const char *arch, int head_dim, fj_dtype dt, int rows, int warps,
                           int mask, int mod) {
  fjg_config c;
  char err[256];
  if (fjg_config_choose_decode(head_dim, dt, arch, rows, warps, 0, &c, err, sizeof err) != FJ_OK)
    fail_msg("config: %s", err);
  char tail[256];
  snprintf(tail, sizeof tail,
           "static_assert(FJD_SMEM_BYTES == %d, \"smem: template vs gen/config.c\");\n"
           "static_assert(FJD_THREADS == %d, \"threads: template vs gen/config.c\");\n",
           c.smem_bytes, c.threads);
  const char *prologue = mod ? fjt_softcap_bias : fjt_causal;
  char *tu = fjt_build_kernel_tu(&c, "decode", mask, mod, prologue, tail);
  char what[128];
  snprintf(what, sizeof what, "dec_m%d_s%d_d%d_r%d_w%d_%s_%s", mask, mod, head_dim, c.block_m,
           c.num_warps, dt == FJ_DTYPE_F16 ? "f16" : "bf16", arch);
  char *ptx = compile(tu, arch, what, 1);
  assert_non_null(strstr(ptx, ".entry fj_attention_decode("));
  assert_non_null(strstr(ptx, "mma.sync.aligned.m16n8k16"));
  assert_non_null(strstr(ptx, "cp.async.cg.shared.global"));
  free(ptx);
  free(tu);
}

static void test_decode_sm80(void **state) {
  (void)state;
  for (int d = 64; d <= 128; d *= 2)
    for (int mask = 0; mask < 2; mask++)
      for (int mod = 0; mod < 2; mod++)
        compile_decode("sm_80", d, mod ? FJ_DTYPE_F16 : FJ_DTYPE_BF16, mask ? 32 : 4, 4, mask,
                       mod);
  compile_decode("sm_80", 128, FJ_DTYPE_BF16, 32, 8, 1, 1);
}

static void test_decode_sm90a(void **state) {
  (void)state;
  for (int d = 64; d <= 128; d *= 2)
    for (int rows = 4; rows <= 32; rows *= 8)
      for (int mask = 0; mask < 2; mask++)
        for (int mod = 0; mod < 2; mod++)
          compile_decode("sm_90a", d, FJ_DTYPE_BF16, rows, 4, mask, mod);
  /* The 8-warp kernel: both row blocks, the largest hooks. */
  for (int d = 64; d <= 128; d *= 2)
    for (int rows = 4; rows <= 32; rows *= 8)
      compile_decode("sm_90a", d, FJ_DTYPE_BF16, rows, 8, 1, 1);
}

static void test_decode_sm86(void **state) {
  (void)state;
  compile_decode("sm_86", 128, FJ_DTYPE_BF16, 32, 4, 1, 1);
  compile_decode("sm_86", 64, FJ_DTYPE_BF16, 32, 8, 1, 1);
}

static void test_util(void **state) {
  (void)state;
  fjg_config c;
  char err[256];
  assert_int_equal(fjg_config_choose_util(FJ_DTYPE_BF16, "sm_80", &c, err, sizeof err), FJ_OK);
  char *tu = fjt_build_kernel_tu(&c, "util", 0, 0, "", "");
  char *ptx = compile(tu, "sm_80", "util_sm_80", 2);
  assert_non_null(strstr(ptx, ".entry fj_merge_states_kernel("));
  assert_non_null(strstr(ptx, ".entry fj_paged_from_csr_kernel("));
  free(ptx);
  free(tu);
}

/* The sm80 forward's variants for the serving layouts (FJ_VARLEN), which
 * launches with seqlens_k, packed batches or paged KV take, and for Skip
 * Softmax (FJ_SKIP): compiled without spills at the shapes of sm_80 and
 * sm_90a. (The sm90 ones: unit/test_sm90_compile.) */
static void test_forward_varlen_sm80(void **state) {
  (void)state;
  static const char *const archs[] = {"sm_80", "sm_90a"};
  for (int a = 0; a < 2; a++)
    for (int d = 64; d <= 128; d *= 2) {
      fjg_config c;
      char err[256];
      if (fjg_config_choose_template(d, FJ_DTYPE_BF16, archs[a], "sm80", &c, err,
                                     sizeof err) != FJ_OK)
        fail_msg("config: %s", err);
      char *tu = fjt_build_kernel_tu(&c, "forward", 1, d == 64, d == 64 ? fjt_softcap_bias
                                                                       : fjt_causal, "");
      char what[64];
      snprintf(what, sizeof what, "fwd_sm80_varlen_d%d_%s", d, archs[a]);
      char *ptx = compile_with(tu, archs[a], what, 1, "-DFJ_VARLEN=1");
      char *plain = compile(tu, archs[a], what, 1);
      assert_true(strlen(plain) < strlen(ptx)); /* the serving reads are there */
      /* Skip Softmax's variant (FJ_SKIP) too. */
      snprintf(what, sizeof what, "fwd_sm80_skip_d%d_%s", d, archs[a]);
      char *skip = compile_with(tu, archs[a], what, 1, "-DFJ_SKIP=1");
      assert_true(strlen(plain) < strlen(skip));
      free(skip);
      free(plain);
      free(ptx);
      free(tu);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),      cmocka_unit_test(test_parts),
      cmocka_unit_test(test_util),        cmocka_unit_test(test_decode_sm86),
      cmocka_unit_test(test_decode_sm80), cmocka_unit_test(test_decode_sm90a),
      cmocka_unit_test(test_forward_varlen_sm80),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
