/*
 * tests/unit/test_deploy.c: a deployment that ships precompiled kernels and
 * runs where NVRTC is not installed (FLEXJIT_NVRTC naming a library that
 * does not exist stands for that machine).
 *
 * 1. A cache directory filled by `flexjit precompile --out DIR` serves its
 *    kernels, block-mask builders included, to a context without NVRTC
 *    (found by source key: the store's alias), and a kernel it lacks fails
 *    naming its name and keys.
 * 2. A pack named by FLEXJIT_PACKS serves a host that cannot change its code
 *    to mount it; a pack that does not open makes every kernel request fail
 *    naming it.
 * 3. The .json sidecar beside a stored cubin is valid JSON (UTF-8) whatever
 *    bytes the spec's source holds.
 * 4. precompile's summary and -v lines count every kernel it wrote (the
 *    decode pass writes five cubins a job).
 *
 * Needs NVRTC to precompile; skips without it. No GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/key.h"
#include "cache/meta.h"
#include "cache/pack.h"
#include "flexjit.h"
#include "runtime/nvrtc.h"
#include "tests/unit/cli_run.h"
#include "tests/unit/store_count.h"

static const char kCausal[] = "return { name = 'deploy', mask_mod = causal() }\n";

static int setup(void **state) {
  (void)state;
  char err[256];
  const fjr_nvrtc *nv = NULL;
  if (fjr_nvrtc_load(NULL, &nv, err, sizeof err) != FJ_OK) return 0;
  if (fjt_make_tmpdir("fj-deploy") != 0) return -1;
  fjt_write_text("deploy.lua", kCausal);
  fjt_write_text("manifest.lua",
                 "return { specs = {'deploy.lua'}, head_dims = {64}, dtypes = {'bf16'},\n"
                 "  archs = {'sm_80'}, passes = {'forward', 'blockmask', 'backward', 'decode'} }\n");
  return 0;
}

static int teardown(void **state) {
  return fjt_tmpdir[0] ? fjt_remove_tmpdir(state) : 0;
}

static void skip_without_nvrtc(void) {
  if (!fjt_tmpdir[0]) skip();
}

/* A context as the deployed host makes it: the environment as given, no
 * NVRTC. */
static fj_context *deployed(const char *cache_dir) {
  setenv("FLEXJIT_NVRTC", "/nonexistent/libnvrtc.so", 1);
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = cache_dir;
  fj_context *ctx = NULL;
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  unsetenv("FLEXJIT_NVRTC");
  unsetenv("FLEXJIT_PACKS");
  return ctx;
}

/* Compiles the forward kernel at head_dim for sm_80; returns the status. */
static fj_status compile(fj_context *ctx, int head_dim, fj_kernel_info *info) {
  fj_spec *spec = NULL;
  assert_int_equal(fj_spec_load_string(ctx, kCausal, strlen(kCausal), "deploy.lua", &spec),
                   FJ_OK);
  fj_kernel_options ko = {.head_dim = head_dim, .dtype = FJ_DTYPE_BF16, .arch = "sm_80"};
  fj_status st = fj_compile_forward(ctx, spec, &ko, info);
  fj_spec_destroy(spec);
  return st;
}

static void expect_missing(fj_context *ctx) {
  fj_kernel_info info;
  assert_int_equal(compile(ctx, 128, &info), FJ_ENONVRTC);
  const char *msg = fj_context_last_error(ctx);
  fjt_expect_in(msg, "fj_fwd_deploy_d128_bf16_sm80_sm_80");
  fjt_expect_in(msg, "source key");
}

static void test_cache_directory_without_nvrtc(void **state) {
  (void)state;
  skip_without_nvrtc();
  const char *dir = fjt_path("cache");
  char cache[400];
  snprintf(cache, sizeof cache, "%s", dir);
  assert_int_equal(fjt_flexjit(NULL, "precompile '%s' --out '%s'", fjt_path("manifest.lua"),
                               cache),
                   0);
  fj_context *ctx = deployed(cache);
  fj_kernel_info info;
  if (compile(ctx, 64, &info) != FJ_OK) fail_msg("%s", fj_context_last_error(ctx));
  assert_true(info.from_cache);
  assert_non_null(strstr(info.cubin_path, cache));
  expect_missing(ctx);
  /* The block-mask builder came with the "blockmask" pass. */
  fj_spec *spec = NULL;
  assert_int_equal(fj_spec_load_string(ctx, kCausal, strlen(kCausal), "deploy.lua", &spec),
                   FJ_OK);
  if (fj_compile_block_mask(ctx, spec, "sm_80", &info) != FJ_OK)
    fail_msg("%s", fj_context_last_error(ctx));
  assert_true(info.from_cache);
  fjt_expect_in(info.name, "fj_blockmask_deploy_sm_80");
  assert_int_equal(fj_compile_block_mask(ctx, spec, "sm_90a", &info), FJ_ENONVRTC);
  /* And the backward's kernels with the "backward" pass. */
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = "sm_80"};
  if (fj_compile_backward(ctx, spec, &ko, &info) != FJ_OK)
    fail_msg("%s", fj_context_last_error(ctx));
  assert_true(info.from_cache);
  fjt_expect_in(info.name, "fj_bwd_deploy_d64_bf16_sm80_sm_80");
  ko.head_dim = 128;
  assert_int_equal(fj_compile_backward(ctx, spec, &ko, &info), FJ_ENONVRTC);
  /* And the decode kernels (both row blocks) and the merge with "decode". */
  ko.head_dim = 64;
  if (fj_compile_decode(ctx, spec, &ko, &info) != FJ_OK)
    fail_msg("%s", fj_context_last_error(ctx));
  assert_true(info.from_cache);
  fjt_expect_in(info.name, "fj_dec_deploy_d64_bf16_m32");
  ko.head_dim = 128;
  assert_int_equal(fj_compile_decode(ctx, spec, &ko, &info), FJ_ENONVRTC);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

static void test_precompile_counts_every_kernel(void **state) {
  (void)state;
  skip_without_nvrtc();
  char cache[400];
  snprintf(cache, sizeof cache, "%s", fjt_path("counted"));
  assert_int_equal(fjt_flexjit(NULL, "precompile '%s' --out '%s' -v -j 1",
                               fjt_path("manifest.lua"), cache),
                   0);
  const int stored = fjt_store_count(cache);
  /* forward, blockmask and backward one each; decode its four kernels and
   * the util kernels (the LSE merge, the CSR conversion). */
  assert_int_equal(stored, 8);
  fjt_expect_in(fjt_out, "compiled 8 kernels (0 from cache)");
  int lines = 0;
  for (const char *l = fjt_out; (l = strstr(l, ".cubin\n")) != NULL; l++) lines++;
  assert_int_equal(lines, 8);
  fjt_expect_in(fjt_out, "fj_util_sm_80");
}

static void test_packs_from_the_environment(void **state) {
  (void)state;
  skip_without_nvrtc();
  char pack[400];
  snprintf(pack, sizeof pack, "%s", fjt_path("kernels.fjpack"));
  assert_int_equal(fjt_flexjit(NULL, "precompile '%s' --out '%s'", fjt_path("manifest.lua"),
                               pack),
                   0);
  char list[900];
  snprintf(list, sizeof list, "/nonexistent.fjpack-unused:%s", pack);
  setenv("FLEXJIT_PACKS", pack, 1);
  fj_context *ctx = deployed("");
  fj_kernel_info info;
  if (compile(ctx, 64, &info) != FJ_OK) fail_msg("%s", fj_context_last_error(ctx));
  assert_true(info.from_cache);
  assert_string_equal(info.cubin_path, pack);
  expect_missing(ctx);
  /* The decode pass packed all five of its kernels: both row blocks of 4
   * and of 8 warps, and the merge (fj_compile_decode needs each; without
   * NVRTC a missing one fails). */
  fj_spec *spec = NULL;
  assert_int_equal(fj_spec_load_string(ctx, kCausal, strlen(kCausal), "deploy.lua", &spec),
                   FJ_OK);
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = "sm_80"};
  if (fj_compile_decode(ctx, spec, &ko, &info) != FJ_OK)
    fail_msg("%s", fj_context_last_error(ctx));
  assert_string_equal(info.cubin_path, pack);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  /* One pack of the list that does not open fails every request, naming it. */
  setenv("FLEXJIT_PACKS", list, 1);
  ctx = deployed("");
  assert_int_equal(compile(ctx, 64, &info), FJ_EINVAL);
  fjt_expect_in(fj_context_last_error(ctx), "FLEXJIT_PACKS");
  fjt_expect_in(fj_context_last_error(ctx), "/nonexistent.fjpack-unused");
  fj_context_destroy(ctx);
}

/* With an NVRTC that does not compile for the target (here sm_999, which no
 * NVRTC knows), a kernel built elsewhere is still found by its source key:
 * a pack holding a build for that target serves it. */
static void test_target_this_nvrtc_lacks(void **state) {
  (void)state;
  skip_without_nvrtc();
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = "";
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  assert_int_equal(fj_spec_load_string(ctx, kCausal, strlen(kCausal), "deploy.lua", &spec),
                   FJ_OK);
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = "sm_999",
                          .kernel_template = "sm80"};
  /* Not in any pack: refused, naming why. */
  assert_int_equal(fj_compile_forward(ctx, spec, &ko, NULL), FJ_EUNSUPPORTED);
  fjt_expect_in(fj_context_last_error(ctx), "does not compile for sm_999");
  /* The unit's source key, from its banner. */
  const char *tu = fjt_path("sm999.cu");
  if (fj_emit_forward_source(ctx, spec, &ko, tu) != FJ_OK)
    fail_msg("%s", fj_context_last_error(ctx));
  static char text[1 << 20];
  fjt_slurp_into(tu, text, sizeof text);
  const char *at = strstr(text, "source key ");
  assert_non_null(at);
  char hex[33];
  snprintf(hex, sizeof hex, "%s", at + strlen("source key "));
  fjc_pack_entry e;
  memset(&e, 0, sizeof e);
  assert_int_equal(fjc_key_from_hex(hex, &e.source_key), 0);
  fjc_key_with_nvrtc(&e.source_key, "99.0", &e.full_key); /* another compiler's build */
  snprintf(e.arch, sizeof e.arch, "sm_999");
  snprintf(e.nvrtc, sizeof e.nvrtc, "99.0");
  snprintf(e.name, sizeof e.name, "fj_fwd_deploy_d64_bf16_sm80_sm_999");
  static const char blob[] = "a cubin built elsewhere";
  e.data = blob, e.size = sizeof blob;
  char pack[400], err[256];
  snprintf(pack, sizeof pack, "%s", fjt_path("sm999.fjpack"));
  fjc_pack_writer *w = NULL;
  assert_int_equal(fjc_pack_writer_open(pack, &w, err, sizeof err), FJ_OK);
  assert_int_equal(fjc_pack_writer_add(w, &e, err, sizeof err), FJ_OK);
  assert_int_equal(fjc_pack_writer_finish(w, err, sizeof err), FJ_OK);
  assert_int_equal(fj_context_mount_pack(ctx, pack), FJ_OK);
  fj_kernel_info info;
  if (fj_compile_forward(ctx, spec, &ko, &info) != FJ_OK)
    fail_msg("%s", fj_context_last_error(ctx));
  assert_true(info.from_cache);
  assert_string_equal(info.cubin_path, pack);
  assert_int_equal(info.cubin_size, sizeof blob);
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

/* 1 when s[0, n) is UTF-8 without control characters other than \n. */
static int valid_utf8(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || i + len > n || (c < 0x20 && c != '\n')) return 0;
    for (int k = 1; k < len; k++)
      if ((s[i + k] & 0xc0) != 0x80) return 0;
    i += (size_t)len;
  }
  return 1;
}

static void test_sidecar_is_json_whatever_the_source(void **state) {
  (void)state;
  skip_without_nvrtc();
  static const char spec_src[] =
      "-- \xff\xfe not UTF-8, \"quoted\", back\\slash, \x01 control\n"
      "return { name = 'sidecar', mask_mod = causal() }\n";
  char cache[400];
  snprintf(cache, sizeof cache, "%s", fjt_path("sidecar-cache"));
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = cache;
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  assert_int_equal(fj_spec_load_string(ctx, spec_src, strlen(spec_src), "s.lua", &spec),
                   FJ_OK);
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = "sm_80"};
  fj_kernel_info info;
  if (fj_compile_forward(ctx, spec, &ko, &info) != FJ_OK)
    fail_msg("%s", fj_context_last_error(ctx));
  char json[1200];
  snprintf(json, sizeof json, "%s", info.cubin_path);
  char *dot = strrchr(json, '.');
  assert_non_null(dot);
  strcpy(dot, ".json");
  static char text[65536];
  fjt_slurp_into(json, text, sizeof text);
  assert_true(strlen(text) > 0);
  assert_true(valid_utf8((const unsigned char *)text, strlen(text)));
  char name[128];
  assert_int_equal(fjc_meta_string(text, strlen(text), "name", name, sizeof name), 0);
  assert_string_equal(name, info.name);
  fjt_expect_in(text, "\\ufffd\\ufffd not UTF-8, \\\"quoted\\\", back\\\\slash, \\u0001");
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cache_directory_without_nvrtc),
      cmocka_unit_test(test_precompile_counts_every_kernel),
      cmocka_unit_test(test_packs_from_the_environment),
      cmocka_unit_test(test_target_this_nvrtc_lacks),
      cmocka_unit_test(test_sidecar_is_json_whatever_the_source),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
