/*
 * tests/unit/test_bwd_compile.c: the backward pass's configuration
 * (fjg_config_choose_backward), its part list, and its translation unit
 * compiled with NVRTC (CPU only, no GPU needed): for sm_80, sm_86 and sm_90a,
 * head dims 64 and 128, bf16 and fp16, with and without a mask and a
 * score_mod (the hand-written prologue of tests/unit/template_tu.h, with a
 * trainable buffer), every one of its three kernels without spills and
 * within the target's shared memory, the template's shared-memory map equal
 * to the configuration's; and the deterministic variant (FJ_DETERMINISTIC)
 * for sm_80, sm_86 and sm_90a the same way, with its ordered dQ (acquire polls,
 * the rank's counting barriers, release fences); the first dQ addition to a
 * query tile a store, so that the pre kernel zeroes no dq_accum, in the
 * deterministic units and in every sm90 one (whose default units claim
 * each query tile; the sm80 default unit has none of this); and
 * the packed-batch variant (FJ_VARLEN), alone and deterministic, which reads
 * cu_seqlens_q (the parameter's bytes at 464) where no other unit does; and
 * the sm90 kernel's query tiles: 128 rows at head dim 64, 64 for a packed
 * batch or a block mask of 64-row blocks (fjg_config_backward_variant),
 * each compiled; the persistent sm90 kernel's own conversion of dq.
 * Set FJ_TEST_NVRTC_DUMP=DIR to write the translation units and logs.
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

#define FJT_STR2(x) #x
#define FJT_STR(x) FJT_STR2(x)

static void test_config(void **state) {
  (void)state;
  static const char *archs[] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a",
                                "sm_120"};
  static const int dims[] = {64, 128};
  static const fj_dtype dts[] = {FJ_DTYPE_BF16, FJ_DTYPE_F16};
  for (size_t a = 0; a < sizeof archs / sizeof *archs; a++)
    for (size_t d = 0; d < 2; d++)
      for (size_t t = 0; t < 2; t++) {
        fjg_config c;
        char err[256];
        for (int named = 0; named < 2; named++) {
          if (fjg_config_choose_backward(dims[d], dts[t], archs[a], named ? "sm80" : NULL,
                                         &c, err, sizeof err) != FJ_OK)
            fail_msg("%s D=%d: %s", archs[a], dims[d], err);
          assert_string_equal(c.template_name, "sm80");
          assert_int_equal(c.head_dim, dims[d]);
          assert_int_equal(c.dtype, dts[t]);
          assert_string_equal(c.arch, archs[a]);
          assert_int_equal(c.block_n, 16 * c.num_warps);
          assert_int_equal(c.threads, 32 * c.num_warps);
          assert_int_equal(c.num_stages, 2);
          assert_true(c.block_m >= 16 && c.block_m <= 128 && c.block_m % 16 == 0);
          assert_int_equal(c.num_warps % (c.block_m / 16), 0);
          assert_true(c.smem_bytes > 0 && c.smem_bytes <= fjt_smem_limit(archs[a]));
          assert_int_equal(c.uses_tma, 0);
          assert_int_equal(c.persistent, 0);
          assert_int_equal(c.deterministic, 0); /* fjg_config_backward_variant sets it */
          assert_null(c.spill_fallback);
        }
      }

  fjg_config c;
  char err[256];
  assert_int_equal(fjg_config_choose_backward(256, FJ_DTYPE_BF16, "sm_90a", NULL, &c, err,
                                              sizeof err),
                   FJ_EUNSUPPORTED);
  assert_non_null(strstr(err, "64 and 128"));
  /* The sm90 backward: sm_90a only, 128 kv rows a CTA, query tiles of 64
   * rows, 128 at head dim 64. */
  for (int d = 64; d <= 128; d *= 2) {
    assert_int_equal(fjg_config_choose_backward(d, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, err,
                                                sizeof err),
                     FJ_OK);
    assert_string_equal(c.template_name, "sm90");
    assert_int_equal(c.uses_tma, 1);
    assert_int_equal(c.block_m, d == 64 ? 128 : 64);
    assert_int_equal(c.block_m, fjg_sm90_bwd_block_m(d));
    assert_int_equal(c.block_n, 128);
    assert_int_equal(c.threads, 384);
    assert_true(c.smem_bytes > 0 && c.smem_bytes <= fjt_smem_limit("sm_90a"));
  }
  assert_int_equal(fjg_config_choose_backward(128, FJ_DTYPE_BF16, "sm_90", "sm90", &c, err,
                                              sizeof err),
                   FJ_EUNSUPPORTED);
  assert_non_null(strstr(err, "sm_90a"));
  assert_int_equal(fjg_config_choose_backward(128, FJ_DTYPE_BF16, "sm_80", "sm70", &c, err,
                                              sizeof err),
                   FJ_EINVAL);
  assert_non_null(strstr(err, "sm70"));
  assert_int_equal(fjg_config_choose_backward(96, FJ_DTYPE_BF16, "sm_80", NULL, &c, err,
                                              sizeof err),
                   FJ_EUNSUPPORTED);
  assert_int_equal(fjg_config_choose_backward(64, FJ_DTYPE_BF16, "sm_75", NULL, &c, err,
                                              sizeof err),
                   FJ_EUNSUPPORTED);
  assert_int_equal(fjg_config_choose_backward(64, FJ_DTYPE_BF16, "gfx90a", NULL, &c, err,
                                              sizeof err),
                   FJ_EINVAL);
  assert_int_equal(fjg_config_choose_backward(64, FJ_DTYPE_BF16, "sm_80", NULL, NULL, err,
                                              sizeof err),
                   FJ_EINVAL);
}

/* The part list: the prologue after fj_common.cuh and fj_grad.cuh (which
 * the generated hooks use) and before the parameter struct that holds its
 * types; every part embedded. */
static void test_parts(void **state) {
  (void)state;
  const char *const *parts = fjg_template_parts("sm80", "backward");
  assert_non_null(parts);
  assert_string_equal(parts[0], "common/fj_common.cuh");
  assert_string_equal(parts[1], "common/fj_grad.cuh");
  assert_string_equal(parts[2], FJG_PART_PROLOGUE);
  assert_string_equal(parts[3], "common/fj_bwd.cuh");
  int n = 0;
  for (const char *const *p = parts; *p; p++, n++)
    if (strcmp(*p, FJG_PART_PROLOGUE) != 0 && !fjg_template_text(*p, NULL))
      fail_msg("part %s is not embedded", *p);
  assert_true(n >= 4);
  const char *const *p90 = fjg_template_parts("sm90", "backward");
  assert_non_null(p90);
  for (const char *const *p = p90; *p; p++)
    if (strcmp(*p, FJG_PART_PROLOGUE) != 0 && !fjg_template_text(*p, NULL))
      fail_msg("part %s is not embedded", *p);
}

/* Whether the PTX of entry `name` (up to the next entry) holds `what`. */
static int entry_has(const char *ptx, const char *name, const char *what) {
  char head[96];
  snprintf(head, sizeof head, ".entry %s(", name);
  const char *at = strstr(ptx, head);
  if (!at) fail_msg("no entry %s", name);
  const char *end = strstr(at + 1, ".entry ");
  const char *hit = strstr(at, what);
  return hit && (!end || hit < end);
}

/* block_q: a block mask's (0: none), which may change the sm90 kernel's
 * query tiles; one_tile: the sm90 kernel of one CTA a kv tile, not the
 * persistent one (FLEXJIT_PERSISTENT=0). */
static void compile_one_as(const char *arch, const char *tmpl, int head_dim, fj_dtype dt,
                           int has_mask, int has_score_mod, int det, int varlen, int block_q,
                           int one_tile) {
  fjg_config c;
  char err[256];
  if (fjg_config_choose_backward(head_dim, dt, arch, tmpl, &c, err, sizeof err) != FJ_OK)
    fail_msg("config: %s", err);
  fjg_config_backward_variant(&c, det, varlen, block_q);
  if (one_tile) c.persistent = 0;
  /* The sm90 kernel is persistent but for packed batches and the
   * deterministic mode. */
  assert_int_equal(c.persistent, c.uses_tma && !varlen && !det && !one_tile);
  const int sm90 = c.uses_tma;
  /* The template's numbers must be the configuration's and config.h's. */
  char tail[640];
  snprintf(tail, sizeof tail,
           "static_assert(%s == %d, \"smem: template vs gen/config.c\");\n"
           "static_assert(%s == %d, \"threads: template vs gen/config.c\");\n"
           "static_assert(FJB_ROW_BLOCK == %d && FJB_ROW_THREADS == %d, \"row kernels\");\n"
           "static_assert(FJ_DETERMINISTIC == %d, \"FJ_DETERMINISTIC\");\n"
           "static_assert(FJB_SEM_ROWS == " FJT_STR(FJG_BWD_SEM_ROWS)
           ", \"semaphores: template vs gen/config.h\");\n",
           sm90 ? "FJHB_SMEM_BYTES" : "FJB_SMEM_BYTES", c.smem_bytes,
           sm90 ? "FJHB_THREADS" : "FJK_THREADS", c.threads, FJG_BWD_ROW_BLOCK,
           FJG_BWD_ROW_THREADS, det);
  char *tu = fjt_build_kernel_tu(&c, "backward", has_mask, has_score_mod,
                                 fjt_bwd_causal_softcap_bias, tail);
  char what[128];
  snprintf(what, sizeof what, "bwd_%s%s%s%s_m%d_s%d_d%d_%s_%s_bm%d", c.template_name,
           det ? "_det" : "", varlen ? "_varlen" : "", one_tile ? "_1t" : "", has_mask,
           has_score_mod, head_dim, dt == FJ_DTYPE_F16 ? "f16" : "bf16", arch, c.block_m);
  fjt_dump(what, "cu", tu);

  char archopt[64];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
  const char *opts[] = {"-std=c++17", "-default-device", archopt, "--ptxas-options=-v"};
  double t0 = fjt_now_ms();
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, tu, "fj_bwd.cu", 0, NULL, NULL), NVRTC_SUCCESS);
  nvrtcResult r = nvrtcCompileProgram(prog, 4, opts);
  double ms = fjt_now_ms() - t0;
  char *log = fjt_program_log(prog);
  fjt_dump(what, "log", log);
  fjt_require_compiled(r, log, what);
  /* One spill line per kernel: pre, main, post. */
  assert_int_equal(fjt_check_no_spills(log, what), 3);
  /* ptxas serializes every wgmma of a kernel (C7514) or injects waits
   * (C7517, C7519) when registers of an in-flight wgmma are touched: a
   * silent slowdown of the sm90 kernel. */
  if (sm90 && strstr(log, "(C751"))
    fail_msg("%s: ptxas serialized the wgmma pipeline:\n%s", what, log);
  if (fjt_max_static_smem(log) + c.smem_bytes > fjt_smem_limit(arch))
    fail_msg("%s: %d static + %d dynamic bytes of shared memory", what,
             fjt_max_static_smem(log), c.smem_bytes);

  char *ptx = fjt_program_ptx(prog);
  assert_non_null(strstr(ptx, ".entry fj_attention_bwd_pre("));
  assert_non_null(strstr(ptx, ".entry fj_attention_bwd("));
  assert_non_null(strstr(ptx, ".entry fj_attention_bwd_post("));
  if (sm90) {
    assert_non_null(strstr(ptx, "wgmma.mma_async.sync.aligned.m64n64k16.f32"));
    /* S^T and dP^T of 128-row items */
    if (c.block_m == 128)
      assert_non_null(strstr(ptx, "wgmma.mma_async.sync.aligned.m64n128k16.f32"));
    assert_non_null(strstr(ptx, "cp.async.bulk.tensor.4d.shared::cluster.global"));
    /* dq_accum's reduce-adds, dK and dV's stores */
    assert_non_null(strstr(ptx, "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"));
    assert_non_null(strstr(ptx, "cp.async.bulk.tensor.4d.global.shared::cta"));
    assert_non_null(strstr(ptx, "setmaxnreg.inc"));
    /* The persistent kernel's tile counter */
    if (c.persistent)
      assert_non_null(strstr(ptx, "atom.global.add.u32"));
    else
      assert_null(strstr(ptx, "atom.global.add.u32"));
  } else {
    assert_non_null(strstr(ptx, "mma.sync.aligned.m16n8k16"));
    assert_non_null(strstr(ptx, "ldmatrix.sync.aligned.m8n8.x4.trans"));
    assert_non_null(strstr(ptx, "cp.async.cg.shared.global"));
    assert_non_null(strstr(ptx, ".global.add")); /* dq_accum's atomics */
    if (strcmp(arch, "sm_90a") == 0) assert_non_null(strstr(ptx, "red.global.add.v2.f32"));
  }
  /* The persistent kernel converts dq itself (sm90/bwd.cuh,
   * fjhb_convert_dq): each kv tile's dQ writer counts the tile done, and
   * the converting warps read dq_accum through L2; no other kernel does.
   * The three kernels are launched plainly: no programmatic dependence. */
  const int converts = sm90 && c.persistent;
  assert_int_equal(entry_has(ptx, "fj_attention_bwd", "red.relaxed.gpu.global.add.s32"),
                   converts);
  assert_int_equal(entry_has(ptx, "fj_attention_bwd", "ld.global.cg.v4.b32"), converts);
  assert_false(entry_has(ptx, "fj_attention_bwd_post", "ld.global.cg.v4.b32"));
  assert_false(strstr(ptx, "griddepcontrol"));
  /* cu_seqlens_q (fj_bwd_params at byte 472) is read by the packed-batch
   * variant's kernels and by no kernel of the others. */
  if (varlen) {
    assert_non_null(strstr(ptx, "fj_attention_bwd_param_0+472]"));
    assert_non_null(strstr(ptx, "fj_attention_bwd_pre_param_0+472]"));
    assert_non_null(strstr(ptx, "fj_attention_bwd_post_param_0+472]"));
  } else {
    assert_null(strstr(ptx, "_param_0+472]"));
  }
  /* The order of the dQ additions (common/bwd_order.cuh). A query tile's
   * first addition is a store (sm90: a bulk copy; sm80: a store of two
   * floats) in every sm90 unit and every deterministic one
   * (FJB_DQ_FIRST_STORE), whose pre kernels zero no dq_accum (the
   * persistent one zeroes its split tiles' dkv_accum) and whose post
   * kernels poll nothing; the sm80 default unit adds to a zeroed dq_accum
   * and orders nothing. The deterministic units count a rank (sm80: the
   * CTA's counting barrier; sm90: the dQ writer warp's ballots, then its
   * wait for the adds' writes and the proxy fences around them), poll and
   * release; the sm90 default units claim (an acquiring atomic add), wait
   * for the first claimant's store, and flag it done (an or after a
   * fence). */
  const int first_store = det || sm90;
  if (first_store) {
    if (sm90)
      assert_true(
          entry_has(ptx, "fj_attention_bwd", "cp.async.bulk.global.shared::cta.bulk_group ["));
    else
      assert_true(entry_has(ptx, "fj_attention_bwd", "st.global.v2.f32"));
    if (!c.persistent) assert_false(entry_has(ptx, "fj_attention_bwd_pre", "st.global.v4.b32"));
    assert_non_null(strstr(ptx, "ld.acquire.gpu.global.b32"));
    assert_non_null(strstr(ptx, "fence.acq_rel.gpu"));
  } else {
    assert_null(strstr(ptx, "cp.async.bulk.global.shared::cta.bulk_group ["));
    assert_true(entry_has(ptx, "fj_attention_bwd_pre", "st.global.v4.b32"));
    assert_null(strstr(ptx, "ld.acquire"));
    assert_null(strstr(ptx, "fence.acq_rel"));
  }
  if (sm90) {
    assert_non_null(strstr(ptx, "cp.async.bulk.wait_group 0;"));
    assert_non_null(strstr(ptx, "fence.proxy.async.global"));
  } else {
    assert_null(strstr(ptx, "cp.async.bulk.wait_group 0;"));
    assert_null(strstr(ptx, "fence.proxy.async.global"));
  }
  if (det && !sm90)
    assert_non_null(strstr(ptx, "bar.red.popc"));
  else
    assert_null(strstr(ptx, "bar.red.popc"));
  if (sm90 && !det) {
    assert_non_null(strstr(ptx, "atom.acquire.gpu.global.add.u32"));
    assert_non_null(strstr(ptx, "red.relaxed.gpu.global.or.b32"));
  } else {
    assert_null(strstr(ptx, "atom.acquire"));
    assert_null(strstr(ptx, ".global.or.b32"));
  }
  size_t cubin_size = 0;
  assert_int_equal(nvrtcGetCUBINSize(prog, &cubin_size), NVRTC_SUCCESS);
  assert_true(cubin_size > 0);
  printf("  %-28s %3d x %-3d w%d, smem %6d: %6.0f ms, cubin %zu bytes\n", what, c.block_m,
         c.block_n, c.num_warps, c.smem_bytes, ms, cubin_size);
  free(ptx);
  free(log);
  nvrtcDestroyProgram(&prog);
  free(tu);
}
static void compile_one(const char *arch, const char *tmpl, int head_dim, fj_dtype dt,
                        int has_mask, int has_score_mod, int det, int varlen, int block_q) {
  compile_one_as(arch, tmpl, head_dim, dt, has_mask, has_score_mod, det, varlen, block_q, 0);
}

static void run_arch(const char *arch, const char *tmpl) {
  static const int dims[] = {64, 128};
  static const fj_dtype dts[] = {FJ_DTYPE_BF16, FJ_DTYPE_F16};
  for (size_t d = 0; d < 2; d++)
    for (size_t t = 0; t < 2; t++)
      for (int mask = 0; mask < 2; mask++)
        for (int mod = 0; mod < 2; mod++)
          compile_one(arch, tmpl, dims[d], dts[t], mask, mod, 0, 0, 0);
}

/* The deterministic variant: every combination of mask and score_mod (the
 * block-mask and GQA paths are runtime branches of the same unit); sm_86
 * has the smaller tiles of parts with about 100 KiB of shared memory; on
 * sm_90a both templates (sm90's one-tile kernel). */
static void run_arch_det(const char *arch, const char *tmpl) {
  static const int dims[] = {64, 128};
  for (size_t d = 0; d < 2; d++)
    for (int mask = 0; mask < 2; mask++)
      for (int mod = 0; mod < 2; mod++)
        compile_one(arch, tmpl, dims[d], mod ? FJ_DTYPE_F16 : FJ_DTYPE_BF16, mask, mod, 1, 0,
                    0);
}

/* The packed-batch variant (FJ_VARLEN): every combination of mask and
 * score_mod at both head dims, one dtype each; det: its deterministic
 * form. */
static void run_arch_varlen(const char *arch, const char *tmpl, int det) {
  static const int dims[] = {64, 128};
  for (size_t d = 0; d < 2; d++)
    for (int mask = 0; mask < 2; mask++)
      for (int mod = 0; mod < 2; mod++)
        compile_one(arch, tmpl, dims[d], mod ? FJ_DTYPE_F16 : FJ_DTYPE_BF16, mask, mod, det, 1,
                    0);
}

static void test_compile_sm80(void **state) {
  (void)state;
  run_arch("sm_80", NULL);
}
static void test_compile_sm86(void **state) {
  (void)state;
  run_arch("sm_86", NULL);
}
static void test_compile_sm90a(void **state) {
  (void)state;
  run_arch("sm_90a", "sm80");
  run_arch("sm_90a", "sm90");
  /* The sm90 kernel's 64-row tiles at head dim 64, for block masks of
   * 64-row blocks (packed batches take them too: run_arch_varlen). */
  static const fj_dtype dts[] = {FJ_DTYPE_BF16, FJ_DTYPE_F16};
  for (size_t t = 0; t < 2; t++)
    for (int mask = 0; mask < 2; mask++)
      for (int mod = 0; mod < 2; mod++)
        compile_one("sm_90a", "sm90", 64, dts[t], mask, mod, 0, 0, 64);
  /* The one-CTA-a-tile form (FLEXJIT_PERSISTENT=0) at both head dims. */
  for (int d = 64; d <= 128; d += 64)
    for (int mask = 0; mask < 2; mask++)
      compile_one_as("sm_90a", "sm90", d, FJ_DTYPE_BF16, mask, 1, 0, 0, 0, 1);
}
static void test_compile_varlen_sm80(void **state) {
  (void)state;
  run_arch_varlen("sm_80", "sm80", 0);
  run_arch_varlen("sm_86", "sm80", 0);
  run_arch_varlen("sm_80", "sm80", 1);
}
static void test_compile_varlen_sm90a(void **state) {
  (void)state;
  run_arch_varlen("sm_90a", "sm80", 0);
  run_arch_varlen("sm_90a", "sm90", 0);
  run_arch_varlen("sm_90a", "sm80", 1);
  run_arch_varlen("sm_90a", "sm90", 1);
}
static void test_compile_det_sm80(void **state) {
  (void)state;
  run_arch_det("sm_80", "sm80");
}
static void test_compile_det_sm86(void **state) {
  (void)state;
  run_arch_det("sm_86", "sm80");
}
static void test_compile_det_sm90a(void **state) {
  (void)state;
  run_arch_det("sm_90a", "sm80");
  run_arch_det("sm_90a", "sm90");
}

/* FJ_DEBUG_WAIT_LIMIT (debugging only): the deterministic kernel's polls
 * trap after that many. */
static void test_det_wait_limit(void **state) {
  (void)state;
  fjg_config c;
  char err[256];
  if (fjg_config_choose_backward(64, FJ_DTYPE_BF16, "sm_80", NULL, &c, err, sizeof err) !=
      FJ_OK)
    fail_msg("config: %s", err);
  c.deterministic = 1;
  char *tu = fjt_build_kernel_tu(&c, "backward", 1, 0, fjt_bwd_causal_softcap_bias, "");
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, tu, "wait.cu", 0, NULL, NULL), NVRTC_SUCCESS);
  const char *opts[] = {"-std=c++17", "-default-device", "--gpu-architecture=sm_80",
                        "-DFJ_DEBUG_WAIT_LIMIT=1000"};
  if (nvrtcCompileProgram(prog, 4, opts) != NVRTC_SUCCESS) {
    char *log = fjt_program_log(prog);
    fail_msg("FJ_DEBUG_WAIT_LIMIT: %s", log);
  }
  char *ptx = fjt_program_ptx(prog);
  assert_non_null(strstr(ptx, "trap;"));
  free(ptx);
  nvrtcDestroyProgram(&prog);
  free(tu);
}

/* The template must reject a configuration it cannot run, at compile time:
 * a CTA's kv rows that are not 16 a warp. */
static void test_bad_config_rejected(void **state) {
  (void)state;
  fjg_config c;
  char err[256];
  if (fjg_config_choose_backward(64, FJ_DTYPE_BF16, "sm_80", NULL, &c, err, sizeof err) !=
      FJ_OK)
    fail_msg("config: %s", err);
  c.block_n = 32 * c.num_warps;
  char *src = fjt_build_kernel_tu(&c, "backward", 0, 0, fjt_bwd_causal_softcap_bias, "");
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, src, "bad.cu", 0, NULL, NULL), NVRTC_SUCCESS);
  const char *opts[] = {"-std=c++17", "-default-device", "--gpu-architecture=sm_80"};
  assert_int_not_equal(nvrtcCompileProgram(prog, 3, opts), NVRTC_SUCCESS);
  char *log = fjt_program_log(prog);
  assert_non_null(strstr(log, "FJ_BLOCK_N is 16 rows a warp"));
  free(log);
  nvrtcDestroyProgram(&prog);
  free(src);
}

int main(void) {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  printf("NVRTC %d.%d\n", major, minor);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_parts),
      cmocka_unit_test(test_bad_config_rejected),
      cmocka_unit_test(test_det_wait_limit),
      cmocka_unit_test(test_compile_sm80),
      cmocka_unit_test(test_compile_sm86),
      cmocka_unit_test(test_compile_sm90a),
      cmocka_unit_test(test_compile_det_sm80),
      cmocka_unit_test(test_compile_det_sm86),
      cmocka_unit_test(test_compile_det_sm90a),
      cmocka_unit_test(test_compile_varlen_sm80),
      cmocka_unit_test(test_compile_varlen_sm90a),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
