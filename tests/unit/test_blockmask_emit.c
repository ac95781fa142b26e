/*
 * tests/unit/test_blockmask_emit.c: the block-mask builder's translation
 * unit (gen/emit_blockmask.c) is deterministic, holds both kernels and the
 * spec's prologue, and compiles with NVRTC for sm_80 and sm_90a (no GPU
 * needed); and fj_block_mask_build checks its options before touching a
 * device, and fails cleanly without one. Runs with CUDA_VISIBLE_DEVICES=""
 * so it means the same on a GPU host.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gen/emit_blockmask.h"
#include "runtime/context.h"
#include "runtime/nvrtc.h"

static const char *const kSpecs[] = {
    "return { mask_mod = document(buffer(\"doc\", \"i32\")) }",
    "return { mask_mod = sliding_window(param(\"window\", \"i32\")) }",
    "return { mask_mod = function(b, h, q, kv)\n"
    "  return lt(buffer(\"bias\", \"f32\")[kv] * 2.5, 1.0) & ge(q, kv) end }",
    "return { score_mod = softcap(20) }", /* no mask: every block FULL */
};

static fj_spec *load(fj_context *ctx, const char *src) {
  fj_spec *spec = NULL;
  if (fj_spec_load_string(ctx, src, strlen(src), "t", &spec) != FJ_OK)
    fail_msg("spec: %s", fj_context_last_error(ctx));
  return spec;
}

static void emit(const fj_spec *spec, fjg_buf *out) {
  fjg_buf_init(out);
  assert_int_equal(fjg_emit_blockmask_tu(fjr_spec_graph(spec), out),
                   FJ_OK);
  fjg_buf_append(out, "", 1);
}

static void test_emit_deterministic(void **state) {
  (void)state;
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(NULL, &ctx), FJ_OK);
  fj_spec *spec = load(ctx, kSpecs[0]);
  fjg_buf a, b;
  emit(spec, &a);
  emit(spec, &b);
  assert_int_equal(a.len, b.len);
  assert_memory_equal(a.data, b.data, a.len);
  assert_non_null(strstr(a.data, "fj_blockmask_classify"));
  assert_non_null(strstr(a.data, "fj_blockmask_compact"));
  assert_non_null(strstr(a.data, "fj_tile_class"));
  assert_non_null(strstr(a.data, "fj_load_i32(u.a_doc"));
  assert_non_null(strstr(a.data, "#define FJ_HAS_MASK 1"));
  assert_non_null(strstr(fjg_blockmask_kernel_source(), "struct fj_bm_params"));
  fjg_buf_free(&a);
  fjg_buf_free(&b);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

static void test_nvrtc_compiles(void **state) {
  (void)state;
  char err[1024];
  const fjr_nvrtc *nv = NULL;
  if (fjr_nvrtc_load(NULL, &nv, err, sizeof err) != FJ_OK) {
    print_message("skipped: %s\n", err);
    skip();
  }
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(NULL, &ctx), FJ_OK);
  int nopt = 0;
  const char *const *opts = fjr_nvrtc_base_options(&nopt);
  static const char *const archs[] = {"sm_80", "sm_90a"};
  for (size_t s = 0; s < sizeof kSpecs / sizeof kSpecs[0]; s++) {
    fj_spec *spec = load(ctx, kSpecs[s]);
    fjg_buf src;
    emit(spec, &src);
    for (int a = 0; a < 2; a++) {
      void *cubin = NULL;
      size_t size = 0;
      char *log = NULL;
      fj_status st = fjr_nvrtc_compile(nv, src.data, "blockmask", archs[a], opts,
                                       nopt, &cubin, &size, &log, err,
                                       sizeof err);
      if (st != FJ_OK)
        fail_msg("spec %zu for %s: %s\n%s", s, archs[a], err, log ? log : "");
      assert_true(size > 0);
      free(cubin);
      free(log);
    }
    fjg_buf_free(&src);
    fj_spec_destroy(spec);
  }
  fj_context_destroy(ctx);
}

static void test_build_checks(void **state) {
  (void)state;
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(NULL, &ctx), FJ_OK);
  fj_spec *spec = load(ctx, kSpecs[0]);
  fj_block_mask *m = (fj_block_mask *)1;
  fj_block_mask_options o;
  fj_block_mask_options_init(&o);
  assert_int_equal(o.B, 1);
  assert_int_equal(o.H, 1);
  /* Missing lengths, bad block sizes, bad broadcast extents: FJ_EINVAL
   * with a message, before any device is touched. */
  assert_int_equal(fj_block_mask_build(ctx, spec, &o, &m), FJ_EINVAL);
  assert_null(m);
  assert_non_null(strstr(fj_context_last_error(ctx), "q_len"));
  o.q_len = o.kv_len = 1024;
  o.block_q = -4;
  assert_int_equal(fj_block_mask_build(ctx, spec, &o, &m), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "block sizes"));
  o.block_q = 0;
  o.H = 0;
  assert_int_equal(fj_block_mask_build(ctx, spec, &o, &m), FJ_EINVAL);
  o.H = 1;
  o.num_args = 1;
  assert_int_equal(fj_block_mask_build(ctx, spec, &o, &m), FJ_EINVAL);
  o.num_args = 0;
  assert_int_equal(fj_block_mask_build(ctx, NULL, &o, &m), FJ_EINVAL);
  assert_int_equal(fj_block_mask_build(NULL, spec, &o, &m), FJ_EINVAL);
  /* Valid options without a GPU: the driver's status, and nothing built. */
  assert_int_equal(fj_block_mask_build(ctx, spec, &o, &m), FJ_ENODRIVER);
  assert_null(m);
  assert_true(strlen(fj_context_last_error(ctx)) > 0);
  fj_block_mask_destroy(NULL);
  assert_int_equal(fj_block_mask_update(NULL, NULL, 0, NULL), FJ_EINVAL);
  assert_int_equal(fj_block_mask_get_info(NULL, NULL), FJ_EINVAL);
  assert_int_equal(fj_block_mask_download(NULL, FJ_BM_KV_INDICES, NULL, 0),
                   FJ_EINVAL);
  /* The caller's arrays need the caller's scratch, and no 0 among them. */
  uint64_t arrays[FJ_BM_NUM_ARRAYS];
  for (int i = 0; i < FJ_BM_NUM_ARRAYS; i++) arrays[i] = 0x100000 + 0x1000 * (uint64_t)i;
  o.arrays = arrays;
  assert_int_equal(fj_block_mask_build(ctx, spec, &o, &m), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "scratch"));
  o.scratch = 0x200000;
  arrays[5] = 0;
  assert_int_equal(fj_block_mask_build(ctx, spec, &o, &m), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "array 5"));
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

/* fj_block_mask_wrap: a mask of the caller's arrays, made on the host. */
static void test_wrap(void **state) {
  (void)state;
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(NULL, &ctx), FJ_OK);
  uint64_t arrays[FJ_BM_NUM_ARRAYS];
  for (int i = 0; i < FJ_BM_NUM_ARRAYS; i++) arrays[i] = 0x100000 + 0x1000 * (uint64_t)i;
  /* 1000 x 300 over 128 x 128 blocks: 8 x 3 blocks, rows of 8 and 4. */
  fj_block_mask_info info = {.B = 2, .H = 1, .q_len = 1000, .kv_len = 300,
                             .block_q = 128, .block_kv = 128,
                             .num_q_blocks = 8, .num_kv_blocks = 4};
  fj_block_mask *m = NULL;
  assert_int_equal(fj_block_mask_wrap(ctx, &info, arrays, &m), FJ_OK);
  fj_block_mask_info got;
  assert_int_equal(fj_block_mask_get_info(m, &got), FJ_OK);
  assert_int_equal(got.q_len, 1000);
  assert_int_equal(got.num_q_blocks, 8);
  assert_int_equal(got.num_kv_blocks, 4);
  uint64_t dptr = 0;
  size_t count = 0;
  assert_int_equal(fj_block_mask_array_device(m, FJ_BM_FULL_KV_INDICES, &dptr, &count),
                   FJ_OK);
  assert_int_equal(dptr, arrays[FJ_BM_FULL_KV_INDICES]);
  assert_int_equal(count, 2 * 1 * 8 * 4);
  assert_int_equal(fj_block_mask_array_device(m, FJ_BM_Q_INDICES, NULL, &count), FJ_OK);
  assert_int_equal(count, 2 * 1 * 4 * 8);
  assert_int_equal(fj_block_mask_update(m, NULL, 0, NULL), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "fj_block_mask_wrap"));
  fj_block_mask_destroy(m);

  /* Forward-only: no q_* arrays; download of one names it. */
  for (int i = FJ_BM_Q_NUM_BLOCKS; i < FJ_BM_NUM_ARRAYS; i++) arrays[i] = 0;
  assert_int_equal(fj_block_mask_wrap(ctx, &info, arrays, &m), FJ_OK);
  int32_t host[64];
  assert_int_equal(fj_block_mask_download(m, FJ_BM_Q_INDICES, host, 64), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "not given"));
  fj_block_mask_destroy(m);

  /* Rows shorter than the lengths need, a missing kv array, bad sizes. */
  info.num_kv_blocks = 2;
  assert_int_equal(fj_block_mask_wrap(ctx, &info, arrays, &m), FJ_EINVAL);
  assert_null(m);
  assert_non_null(strstr(fj_context_last_error(ctx), "at least 8 and 3"));
  info.num_kv_blocks = 3;
  arrays[FJ_BM_KV_INDICES] = 0;
  assert_int_equal(fj_block_mask_wrap(ctx, &info, arrays, &m), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "array 1"));
  arrays[FJ_BM_KV_INDICES] = 0x101002; /* not 4-byte aligned */
  assert_int_equal(fj_block_mask_wrap(ctx, &info, arrays, &m), FJ_EINVAL);
  assert_non_null(strstr(fj_context_last_error(ctx), "aligned"));
  arrays[FJ_BM_KV_INDICES] = 0x101000;
  info.block_q = 0;
  assert_int_equal(fj_block_mask_wrap(ctx, &info, arrays, &m), FJ_EINVAL);
  assert_int_equal(fj_block_mask_wrap(ctx, NULL, arrays, &m), FJ_EINVAL);
  assert_int_equal(fj_block_mask_wrap(NULL, &info, arrays, &m), FJ_EINVAL);
  fj_context_destroy(ctx);
}

int main(void) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_emit_deterministic),
      cmocka_unit_test(test_nvrtc_compiles),
      cmocka_unit_test(test_build_checks),
      cmocka_unit_test(test_wrap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
