/*
 * tests/unit/test_cache_precompile.c: the precompile manifest
 * (cli/manifest.c) and `flexjit precompile` end to end (cli/cmd_precompile.c)
 * into a cache directory and into a .fjpack. The end-to-end tests need NVRTC
 * (no GPU) and skip without it.
 *
 * The CLI files are compiled into this test directly: they depend on the
 * library only, not on cli/main.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/pack.h"
#include "cli/commands.h"
#include "cli/manifest.h"
#include "runtime/nvrtc.h"
#include "tests/unit/store_count.h"

#include "cli/args.c"
#include "cli/cmd_precompile.c"
#include "cli/manifest.c"

typedef struct fixture {
  char dir[256];
} fixture;

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/fj-precompile-XXXXXX");
  if (!mkdtemp(f->dir))
    return -1;
  unsetenv("FLEXJIT_CACHE_MAX_BYTES");
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  nftw(f->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(f);
  return 0;
}

static void write_text(const fixture *f, const char *name, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", f->dir, name);
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs(text, fp);
  fclose(fp);
}

static int load(const fixture *f, const char *text, cli_manifest *m,
                char *err, size_t n) {
  char path[512];
  write_text(f, "m.lua", text);
  snprintf(path, sizeof path, "%s/m.lua", f->dir);
  return cli_manifest_load(path, m, err, n);
}

static void test_manifest_ok(void **state) {
  fixture *f = *state;
  cli_manifest m;
  char err[1024] = "", want[600];
  assert_int_equal(
      load(f,
           "local dims = {}\n"
           "for d = 64, 128, 64 do dims[#dims + 1] = d end\n"
           "return { specs = {'a.lua', 'sub/b.lua', '/abs/c.lua'},\n"
           "  head_dims = dims, dtypes = {'bf16', 'float16'},\n"
           "  archs = {'sm_80', 'sm_90a'} }\n",
           &m, err, sizeof err),
      0);
  assert_int_equal(m.n_specs, 3);
  snprintf(want, sizeof want, "%s/a.lua", f->dir);
  assert_string_equal(m.specs[0], want);
  snprintf(want, sizeof want, "%s/sub/b.lua", f->dir);
  assert_string_equal(m.specs[1], want);
  assert_string_equal(m.specs[2], "/abs/c.lua");
  assert_int_equal(m.n_head_dims, 2);
  assert_int_equal(m.head_dims[1], 128);
  assert_int_equal(m.n_dtypes, 2);
  assert_int_equal(m.dtypes[0], FJ_DTYPE_BF16);
  assert_int_equal(m.dtypes[1], FJ_DTYPE_F16);
  assert_int_equal(m.n_archs, 2);
  assert_string_equal(m.archs[1], "sm_90a");
  assert_int_equal(m.n_passes, 1); /* the default */
  assert_string_equal(m.passes[0], "forward");
  cli_manifest_free(&m);
  cli_manifest_free(&m); /* idempotent */
}

static void expect_error(const fixture *f, const char *text,
                         const char *needle) {
  cli_manifest m;
  char err[1024] = "";
  assert_int_equal(load(f, text, &m, err, sizeof err), -1);
  assert_int_equal(m.n_specs, 0);
  assert_null(m.specs);
  if (!strstr(err, needle))
    fail_msg("error '%s' does not mention '%s'", err, needle);
  if (!strstr(err, "m.lua"))
    fail_msg("error '%s' does not name the manifest", err);
}

static void test_manifest_errors(void **state) {
  fixture *f = *state;
  const char *base = "specs = {'a.lua'}, head_dims = {64}, dtypes = {'bf16'},"
                     " archs = {'sm_80'}";
  char text[512];
  expect_error(f, "return 42", "must return a table");
  expect_error(f, "return {", "m.lua:1:");
  expect_error(f, "local x = nil\nreturn x.y", "m.lua:2:");
  snprintf(text, sizeof text, "return { %s, head_dim = {64} }", base);
  expect_error(f, text, "unknown field 'head_dim'");
  expect_error(f, "return { specs = {}, head_dims = {64}, dtypes = {'bf16'}, "
                  "archs = {'sm_80'} }",
               "'specs' is empty");
  expect_error(f, "return { specs = {'a.lua'}, dtypes = {'bf16'}, "
                  "archs = {'sm_80'} }",
               "'head_dims' must be a list");
  expect_error(f, "return { specs = {'a.lua'}, head_dims = {64.5}, dtypes = "
                  "{'bf16'}, archs = {'sm_80'} }",
               "head_dims");
  expect_error(f, "return { specs = {'a.lua'}, head_dims = {64}, dtypes = "
                  "{'fp8'}, archs = {'sm_80'} }",
               "unknown dtype 'fp8'");
  expect_error(f, "return { specs = {'a.lua'}, head_dims = {64}, dtypes = "
                  "{'bf16'}, archs = {'compute_80'} }",
               "not a real target");
  expect_error(f, "return { specs = {'a.lua', 3}, head_dims = {64}, dtypes = "
                  "{'bf16'}, archs = {'sm_80'} }",
               "item 2 must be a string");
  /* The sandbox: no io, no os, no endless loops. */
  expect_error(f, "io.open('/etc/passwd')", "m.lua:1:");
  expect_error(f, "os.exit(3)", "m.lua:1:");
  expect_error(f, "while true do end", "instruction limit");
  /* Metatables do not run while the table is read. */
  snprintf(text, sizeof text,
           "return setmetatable({ %s }, { __index = function() "
           "error('boom') end })",
           base);
  cli_manifest m;
  char err[1024];
  assert_int_equal(load(f, text, &m, err, sizeof err), 0);
  cli_manifest_free(&m);
  char missing[400];
  snprintf(missing, sizeof missing, "%s/none.lua", f->dir);
  assert_int_equal(cli_manifest_load(missing, &m, err, sizeof err), -1);
  assert_non_null(strstr(err, "none.lua"));
}

/* ---- end to end ---------------------------------------------------------- */

static const char causal_spec[] =
    "return { name = 'pc_causal', mask_mod = causal() }\n";
static const char window_spec[] =
    "return { name = 'pc_window', mask_mod = sliding_window(64) }\n";

static int have_nvrtc(void) {
  char err[512];
  const fjr_nvrtc *nv = NULL;
  return fjr_nvrtc_load(NULL, &nv, err, sizeof err) == FJ_OK;
}

static void write_manifest(const fixture *f) {
  write_text(f, "causal.lua", causal_spec);
  write_text(f, "window.lua", window_spec);
  write_text(f, "manifest.lua",
             "return { specs = {'causal.lua', 'window.lua'},\n"
             "  head_dims = {64}, dtypes = {'bf16'}, archs = {'sm_80'},\n"
             "  passes = {'forward'} }\n");
}

static int precompile(const fixture *f, const char *out) {
  char manifest[512];
  snprintf(manifest, sizeof manifest, "%s/manifest.lua", f->dir);
  char *argv[] = {"precompile", manifest, "--out", (char *)out, "-j", "2",
                  "-v", NULL};
  fflush(stdout);
  return fj_cli_precompile(7, argv);
}

/* Compiles spec_text in a context on cache_dir; returns its info. */
static void compile_spec(const char *cache_dir, const char *spec_text,
                         fj_kernel_info *info) {
  fj_context_options o;
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16, .arch = "sm_80"};
  fj_context_options_init(&o);
  o.cache_dir = cache_dir;
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  assert_int_equal(fj_spec_load_string(ctx, spec_text, strlen(spec_text),
                                       "spec.lua", &spec),
                   FJ_OK);
  if (fj_compile_forward(ctx, spec, &ko, info) != FJ_OK)
    fail_msg("compile: %s", fj_context_last_error(ctx));
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
}

static void test_precompile_to_directory(void **state) {
  fixture *f = *state;
  char out[512];
  if (!have_nvrtc())
    skip();
  write_manifest(f);
  snprintf(out, sizeof out, "%s/cache", f->dir);
  double t0 = now_s();
  assert_int_equal(precompile(f, out), 0);
  printf("cold precompile of 2 kernels, -j 2: %.2f s\n", now_s() - t0);

  assert_int_equal(fjt_store_count(out), 2);

  /* A host program pointed at the directory finds both without NVRTC. */
  fj_kernel_info info;
  compile_spec(out, causal_spec, &info);
  assert_int_equal(info.from_cache, 1);
  compile_spec(out, window_spec, &info);
  assert_int_equal(info.from_cache, 1);

  /* A second run compiles nothing. */
  t0 = now_s();
  assert_int_equal(precompile(f, out), 0);
  printf("warm precompile: %.3f s\n", now_s() - t0);
}

static void test_precompile_to_pack(void **state) {
  fixture *f = *state;
  char out[512], cache[512], err[1024];
  if (!have_nvrtc())
    skip();
  write_manifest(f);
  snprintf(out, sizeof out, "%s/kernels.fjpack", f->dir);
  assert_int_equal(precompile(f, out), 0);

  fjc_pack *p = NULL;
  assert_int_equal(fjc_pack_open(out, &p, err, sizeof err), FJ_OK);
  assert_int_equal(fjc_pack_count(p), 2);

  /* The pack holds what a context would compile: same keys. */
  snprintf(cache, sizeof cache, "%s/check-cache", f->dir);
  const char *specs[2] = {causal_spec, window_spec};
  for (int i = 0; i < 2; i++) {
    fj_kernel_info info;
    fjc_key full;
    void *data;
    size_t size;
    const char *name;
    compile_spec(cache, specs[i], &info);
    assert_int_equal(fjc_key_from_hex(info.key, &full), 0);
    assert_int_equal(
        fjc_pack_find(p, "sm_80", &full, NULL, &data, &size, &name), FJ_OK);
    assert_string_equal(name, info.name);
    assert_int_equal(size, info.cubin_size);
    free(data);
    /* Source-key lookup (no NVRTC): the pack holds the source key and
     * NVRTC version the runtime recorded, which give back the full key. */
    fjc_pack_entry e;
    for (int k = 0; k < 2; k++) {
      fjc_key derived;
      assert_int_equal(fjc_pack_entry_at(p, k, &e), FJ_OK);
      if (strcmp(e.full_key.hex, full.hex) != 0)
        continue;
      assert_string_not_equal(e.nvrtc, "");
      assert_string_not_equal(e.source_key.hex, e.full_key.hex);
      fjc_key_with_nvrtc(&e.source_key, e.nvrtc, &derived);
      assert_string_equal(derived.hex, e.full_key.hex);
      assert_int_equal(fjc_pack_find(p, "sm_80", NULL, &e.source_key, &data,
                                     &size, NULL),
                       FJ_OK);
      assert_int_equal(size, info.cubin_size);
      free(data);
    }
  }
  fjc_pack_close(p);
  /* No temp directory is left behind next to the pack. */
  assert_int_equal(access(out, F_OK), 0);
}

/* Runs in a fresh process (this test re-executed) with NVRTC made
 * unavailable: a context with no disk cache and the pack mounted gets the
 * kernel from the pack; one the pack lacks fails naming its name and key.
 * Returns the exit status: 0 when both hold. */
static int child_pack_without_nvrtc(const char *pack) {
  char err[512];
  if (fjr_nvrtc_load(getenv("FLEXJIT_NVRTC"), &(const fjr_nvrtc *){NULL}, err, sizeof err) !=
      FJ_ENONVRTC) {
    fprintf(stderr, "child: NVRTC is still loadable\n");
    return 10;
  }
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = "";
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  if (fj_context_create(&o, &ctx) != FJ_OK ||
      fj_context_mount_pack(ctx, pack) != FJ_OK ||
      fj_spec_load_string(ctx, causal_spec, strlen(causal_spec), "spec.lua",
                          &spec) != FJ_OK) {
    fprintf(stderr, "child: setup: %s\n", fj_context_last_error(ctx));
    return 11;
  }
  fj_kernel_options ko = {.head_dim = 64, .dtype = FJ_DTYPE_BF16,
                          .arch = "sm_80"};
  fj_kernel_info info;
  if (fj_compile_forward(ctx, spec, &ko, &info) != FJ_OK || !info.from_cache) {
    fprintf(stderr, "child: from pack: %s\n", fj_context_last_error(ctx));
    return 12;
  }
  ko.head_dim = 128; /* not in the pack */
  fj_status st = fj_compile_forward(ctx, spec, &ko, &info);
  const char *msg = fj_context_last_error(ctx);
  if (st != FJ_ENONVRTC ||
      !strstr(msg, "fj_fwd_pc_causal_d128_bf16_sm80_sm_80") ||
      !strstr(msg, "key ")) {
    fprintf(stderr, "child: missing kernel: %s: %s\n", fj_status_name(st),
            msg);
    return 13;
  }
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  return 0;
}

static void test_pack_serves_without_nvrtc(void **state) {
  fixture *f = *state;
  char out[512], cmd[1200];
  if (!have_nvrtc())
    skip();
  write_manifest(f);
  snprintf(out, sizeof out, "%s/kernels.fjpack", f->dir);
  assert_int_equal(precompile(f, out), 0);
  /* A fresh process: NVRTC's loader state is per process. */
  snprintf(cmd, sizeof cmd,
           "FLEXJIT_NVRTC=/nonexistent/libnvrtc.so /proc/%d/exe "
           "--child-pack-without-nvrtc %s",
           (int)getpid(), out);
  assert_int_equal(system(cmd), 0);
}

static void test_precompile_usage_and_failures(void **state) {
  fixture *f = *state;
  char manifest[512], out[512];
  char *help[] = {"precompile", "--help", NULL};
  char *no_out[] = {"precompile", "m.lua", NULL};
  char *bad_j[] = {"precompile", "m.lua", "--out", "x", "-j", "0", NULL};
  assert_int_equal(fj_cli_precompile(2, help), 0);
  assert_int_equal(fj_cli_precompile(2, no_out), 2);
  assert_int_equal(fj_cli_precompile(6, bad_j), 2);
  /* A spec that does not load fails the run and writes no pack. */
  write_text(f, "broken.lua", "return { mask_mod = 1 +\n");
  write_text(f, "manifest.lua",
             "return { specs = {'broken.lua'}, head_dims = {64},\n"
             "  dtypes = {'bf16'}, archs = {'sm_80'} }\n");
  snprintf(manifest, sizeof manifest, "%s/manifest.lua", f->dir);
  snprintf(out, sizeof out, "%s/k.fjpack", f->dir);
  char *argv[] = {"precompile", manifest, "--out", out, NULL};
  assert_int_equal(fj_cli_precompile(4, argv), 1);
  assert_int_equal(access(out, F_OK), -1);
  write_text(f, "manifest.lua",
             "return { specs = {'nope.lua'}, head_dims = {64},\n"
             "  dtypes = {'bf16'}, archs = {'sm_80'}, passes = {'backward'} }\n");
  assert_int_equal(fj_cli_precompile(4, argv), 1);
}

/* Precompiles causal.lua by a manifest of the given fields into a cache
 * directory, and counts its entries. */
static int precompile_count(fixture *f, const char *fields) {
  char out[512], manifest[512], text[1024];
  write_text(f, "causal.lua", causal_spec);
  snprintf(text, sizeof text, "return { specs = {'causal.lua'}, dtypes = {'bf16'}, %s }\n",
           fields);
  write_text(f, "manifest.lua", text);
  snprintf(manifest, sizeof manifest, "%s/manifest.lua", f->dir);
  snprintf(out, sizeof out, "%s/cache", f->dir);
  char *argv[] = {"precompile", manifest, "--out", out, "-j", "4", NULL};
  assert_int_equal(fj_cli_precompile(6, argv), 0);
  return fjt_store_count(out);
}

/* forward_blockmask: at D=64 on sm_90a the 128-row kernel, a second entry
 * beside the plain one, which a launch with a 128 x 128 block mask finds
 * without NVRTC; where it is the plain kernel (sm_80), one entry for both. */
static void test_precompile_blockmask_pass(void **state) {
  if (!have_nvrtc())
    skip();
  assert_int_equal(precompile_count(*state, "head_dims = {64}, archs = {'sm_80', 'sm_90a'}, "
                                            "passes = {'forward', 'forward_blockmask'}"),
                   3); /* sm_80 once, sm_90a plain and 128-row */
}

/* forward_long: at D=128 on sm_90a the long-row kernel, a second entry
 * beside the plain one; at D=64, where there is no such variant, one entry
 * for both. */
static void test_precompile_long_pass(void **state) {
  if (!have_nvrtc())
    skip();
  assert_int_equal(precompile_count(*state, "head_dims = {64, 128}, archs = {'sm_90a'}, "
                                            "passes = {'forward', 'forward_long'}"),
                   3); /* D=64 once, D=128 plain and long-row */
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child-pack-without-nvrtc") == 0)
    return child_pack_without_nvrtc(argv[2]);
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_manifest_ok),
      T(test_manifest_errors),
      T(test_precompile_usage_and_failures),
      T(test_precompile_to_directory),
      T(test_precompile_blockmask_pass),
      T(test_precompile_long_pass),
      T(test_precompile_to_pack),
      T(test_pack_serves_without_nvrtc),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
