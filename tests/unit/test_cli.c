/*
 * tests/unit/test_cli.c: the `flexjit` command, run as a separate process
 * (FJ_BINARY_DIR/flexjit). Commands that must behave as on a machine without
 * a GPU run with CUDA_VISIBLE_DEVICES="" so the test means the same on a GPU
 * host. Compiling needs NVRTC (the CUDA toolkit), not a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/cli_run.h"

static int setup(void **state) {
  (void)state;
  if (fjt_make_tmpdir("test_cli") != 0) return -1;
  return setenv("FLEXJIT_CACHE_DIR", fjt_path("cache"), 1);
}

static const char causal_spec[] =
    "return { name = \"test_causal\",\n"
    "  mask_mod = function(b, h, q, kv) return ge(q, kv) end }\n";

static const char document_spec[] =
    "local doc = buffer(\"doc\", \"i32\")\n"
    "local window = param(\"window\", \"i32\")\n"
    "return { name = \"test_document\",\n"
    "  mask_mod = function(b, h, q, kv)\n"
    "    return eq(doc[q], doc[kv]) & ge(q, kv) & lt(q - kv, window) end }\n";

/* ---- top level ---- */

static void test_version_and_help(void **state) {
  (void)state;
  assert_int_equal(fjt_flexjit(NULL, "--version"), 0);
  fjt_expect_in(fjt_out, "flexjit 0.1.0");
  assert_int_equal(fjt_flexjit(NULL, "--help"), 0);
  fjt_expect_in(fjt_out, "usage: flexjit SUBCOMMAND");
  fjt_expect_in(fjt_out, "compile");
  fjt_expect_in(fjt_out, "demo");
  assert_int_equal(fjt_flexjit(NULL, ""), 2);
  fjt_expect_in(fjt_err, "usage:");
  assert_int_equal(fjt_flexjit(NULL, "frobnicate"), 2);
  fjt_expect_in(fjt_err, "unknown subcommand 'frobnicate'");
}

static void test_subcommand_help(void **state) {
  (void)state;
  assert_int_equal(fjt_flexjit(NULL, "compile --help"), 0);
  fjt_expect_in(fjt_out, "usage: flexjit compile SPEC.lua");
  fjt_expect_in(fjt_out, "--emit-cuda");
  assert_int_equal(fjt_flexjit(NULL, "run --help"), 0);
  fjt_expect_in(fjt_out, "usage: flexjit run SPEC.lua");
  fjt_expect_in(fjt_out, "--buffer NAME=FILE.npy");
  fjt_expect_in(fjt_out, "triton.testing.do_bench's rules");
  fjt_expect_in(fjt_out, "256 MiB");
  fjt_expect_in(fjt_out, "--rep-ms MS");
  assert_int_equal(fjt_flexjit(NULL, "run x.lua --heads 2 -h"), 0);
  assert_int_equal(fjt_flexjit(NULL, "demo --help"), 0);
  fjt_expect_in(fjt_out, "usage: flexjit demo");
}

/* ---- usage errors ---- */

static void test_run_usage_errors(void **state) {
  (void)state;
  const char *spec = fjt_write_text("causal.lua", causal_spec);
  assert_int_equal(fjt_flexjit(NULL, "run"), 2);
  fjt_expect_in(fjt_err, "no spec given");
  assert_int_equal(fjt_flexjit(NULL, "run %s --q-len 16", spec), 2);
  fjt_expect_in(fjt_err, "--heads and --q-len are required");
  assert_int_equal(fjt_flexjit(NULL, "run %s --heads two --q-len 16", spec), 2);
  fjt_expect_in(fjt_err, "--heads: 'two' is not an integer");
  assert_int_equal(fjt_flexjit(NULL, "run %s --heads 6 --kv-heads 4 --q-len 8",
                           spec), 2);
  fjt_expect_in(fjt_err, "not a multiple of --kv-heads");
  assert_int_equal(fjt_flexjit(NULL, "run %s --heads 2 --q-len 8 --layout sbhd",
                           spec), 2);
  fjt_expect_in(fjt_err, "--layout: 'sbhd'");
  assert_int_equal(fjt_flexjit(NULL, "run %s --heads 2 --q-len 8 --frob", spec),
                   2);
  fjt_expect_in(fjt_err, "unknown option '--frob'");
  assert_int_equal(fjt_flexjit(NULL, "run %s --heads", spec), 2);
  fjt_expect_in(fjt_err, "--heads needs a value");
  assert_int_equal(fjt_flexjit(NULL, "run %s --heads 2 --q-len 8 --param w", spec),
                   2);
  fjt_expect_in(fjt_err, "expected NAME=VALUE");
  assert_int_equal(fjt_flexjit(NULL, "compile"), 2);
  fjt_expect_in(fjt_err, "no spec given");
  assert_int_equal(fjt_flexjit(NULL, "compile %s --dtype fp8", spec), 2);
  fjt_expect_in(fjt_err, "--dtype: 'fp8'");
}

/* --bench's budgets and counts: checked, and good ones accepted (then only
 * the GPU is missing). */
static void test_run_bench_options(void **state) {
  (void)state;
  char spec[400];
  snprintf(spec, sizeof spec, "%s", fjt_write_text("causal.lua", causal_spec));
  static const char *const bad[][2] = {
      {"--warmup-ms 0", "--warmup-ms: '0'"},
      {"--rep-ms -5", "--rep-ms: '-5'"},
      {"--warmup-ms=nan", "--warmup-ms: 'nan'"},
      {"--rep-ms 1e9", "--rep-ms: '1e9'"},
      {"--iters 0", "--iters: '0'"},
      {"--warmup -1", "--warmup: '-1'"},
      {"--warmup-ms", "--warmup-ms needs a value"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 --bench "
                                         "%s", spec, bad[i][0]),
                     2);
    fjt_expect_in(fjt_err, bad[i][1]);
    fjt_expect_not_in(fjt_err, "no GPU");
  }
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 --bench "
                                       "--rep-ms abc", spec),
                   2);
  fjt_expect_in(fjt_err, "--rep-ms: 'abc' is not a time in milliseconds");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 --bench "
                                       "--warmup-ms 2.5 --rep-ms=50 --warmup 0 "
                                       "--iters 3", spec),
                   2);
  fjt_expect_in(fjt_err, "no GPU");
}

/* --backward: a head dim the backward lacks is refused before the GPU;
 * one it has gets as far as the missing GPU, with --deterministic too,
 * which alone is refused. */
static void test_run_backward_options(void **state) {
  (void)state;
  char spec[400];
  snprintf(spec, sizeof spec, "%s", fjt_write_text("causal.lua", causal_spec));
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 --head-dim 256 "
                                       "--backward", spec),
                   2);
  fjt_expect_in(fjt_err, "--backward at --head-dim 256");
  fjt_expect_not_in(fjt_err, "no GPU");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 --head-dim 64 "
                                       "--backward --check --bench", spec),
                   2);
  fjt_expect_in(fjt_err, "no GPU");
  assert_int_equal(fjt_flexjit(NULL, "run --help"), 0);
  fjt_expect_in(fjt_out, "--backward");
  /* --deterministic is a mode of the backward. */
  fjt_expect_in(fjt_out, "--deterministic");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 --deterministic", spec),
                   2);
  fjt_expect_in(fjt_err, "--deterministic is a mode of the backward pass");
  fjt_expect_not_in(fjt_err, "no GPU");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 --backward "
                                       "--deterministic --check", spec),
                   2);
  fjt_expect_in(fjt_err, "no GPU");
}

/* ---- errors that need the spec, not the GPU ---- */

static void test_spec_errors(void **state) {
  (void)state;
  const char *bad = fjt_write_text("bad.lua", "return {\n  mask_mod = \n");
  assert_int_equal(fjt_flexjit(NO_GPU, "compile %s --arch sm_80", bad), 1);
  fjt_expect_in(fjt_err, "bad.lua:");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 2 --q-len 8", bad), 1);
  fjt_expect_in(fjt_err, "bad.lua:");
  assert_int_equal(fjt_flexjit(NO_GPU, "compile %s --arch sm_80",
                           fjt_path("missing.lua")),
                   1);
  fjt_expect_in(fjt_err, "missing.lua");
}

static void test_runtime_values_are_checked(void **state) {
  (void)state;
  char spec[512], npy[512];
  snprintf(spec, sizeof spec, "%s", fjt_write_text("document.lua", document_spec));
  /* A 1-D int32 .npy with 8 zeros. */
  unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 118, 0};
  const char *dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (8,), }";
  snprintf(npy, sizeof npy, "%s", fjt_path("doc.npy"));
  FILE *f = fopen(npy, "wb");
  assert_non_null(f);
  fwrite(head, 1, 10, f);
  fprintf(f, "%-117s\n", dict);
  for (int i = 0; i < 8; i++) fwrite("\0\0\0\0", 1, 4, f);
  fclose(f);

  /* A buffer not given is generated (and said so); the param is not. */
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 2 --q-len 8", spec), 2);
  fjt_expect_in(fjt_out, "buffer  doc: generated document ids");
  fjt_expect_in(fjt_err, "param 'window'");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --param "
                                   "window=4", spec),
                   2);
  fjt_expect_in(fjt_err, "no GPU");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --buffer "
                                   "doc=%s", spec, npy),
                   2);
  fjt_expect_in(fjt_err, "param 'window'");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --buffer "
                                   "doc=%s --param window=wide", spec, npy),
                   2);
  fjt_expect_in(fjt_err, "--param window: 'wide' is not an i32");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --buffer "
                                   "doc=%s --param window=4 --param x=1",
                           spec, npy),
                   2);
  fjt_expect_in(fjt_err, "no param or buffer named 'x'");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --param "
                                   "doc=3 --param window=4", spec),
                   2);
  fjt_expect_in(fjt_err, "'doc' is a buffer");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --buffer "
                                   "doc=%s", spec, fjt_path("nope.npy")),
                   1);
  fjt_expect_in(fjt_err, "nope.npy");
  /* Everything in order: only the GPU is missing. */
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --buffer "
                                   "doc=%s --param window=4", spec, npy),
                   2);
  fjt_expect_in(fjt_err, "no GPU");
}

/* ---- compiling without a GPU ---- */

static void test_compile_needs_arch_without_gpu(void **state) {
  (void)state;
  const char *spec = fjt_write_text("causal.lua", causal_spec);
  assert_int_equal(fjt_flexjit(NO_GPU, "compile %s", spec), 2);
  fjt_expect_in(fjt_err, "no GPU found: pass --arch");
}

static void test_compile_and_cache(void **state) {
  (void)state;
  const char *spec = fjt_write_text("causal.lua", causal_spec);
  const char *cu = fjt_path("causal.cu");
  int rc = fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 "
                           "--emit-cuda %s", spec, cu);
  if (rc != 0) fail_msg("compile failed (%d): %s", rc, fjt_err);
  fjt_expect_in(fjt_out, "key     ");
  fjt_expect_in(fjt_out, "compiled in");
  fjt_expect_in(fjt_out, "sm_80");
  struct stat st;
  assert_int_equal(stat(cu, &st), 0);
  assert_true(st.st_size > 100);
  /* Same spec again: found in the disk cache, NVRTC not called; its cubin
   * (an ELF file, as NVRTC made it, without the cache entry's header)
   * written out. */
  const char *cubin = fjt_path("causal.cubin");
  assert_int_equal(fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 "
                                   "--emit-cubin %s", spec, cubin), 0);
  fjt_expect_in(fjt_out, "from cache");
  fjt_expect_in(fjt_out, "cubin   written to");
  FILE *f = fopen(cubin, "rb");
  assert_non_null(f);
  unsigned char magic[4] = {0};
  assert_int_equal(fread(magic, 1, 4, f), 4);
  fclose(f);
  assert_memory_equal(magic, "\x7f" "ELF", 4);
  assert_int_equal(fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 "
                                   "--emit-cubin %s/none/k.cubin", spec, fjt_tmpdir), 1);
  fjt_expect_in(fjt_err, "--emit-cubin");
  fjt_expect_in(fjt_err, "No such file or directory");
  /* Another dtype is another kernel. */
  assert_int_equal(fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 "
                                   "--dtype fp16", spec),
                   0);
  fjt_expect_in(fjt_out, "compiled in");
}

/* ---- the cache and packs without NVRTC ---- */

#define NO_NVRTC NO_GPU "FLEXJIT_NVRTC=/nonexistent/libnvrtc.so "

/* The 32 hex digits after "key     " in `compile`'s output. */
static void printed_key(char key[33]) {
  const char *k = strstr(fjt_out, "key     ");
  if (!k) fail_msg("no key in:\n%s", fjt_out);
  memcpy(key, k + 8, 32);
  key[32] = '\0';
}

/* The cache entry's path after "cubin   " in `compile`'s output. */
static void printed_cubin(char *path, size_t len) {
  const char *p = strstr(fjt_out, "cubin   ");
  if (!p) fail_msg("no cubin path in:\n%s", fjt_out);
  p += 8;
  const size_t n = strcspn(p, " ");
  assert_true(n > 0 && n < len);
  memcpy(path, p, n);
  path[n] = '\0';
}

/* A kernel compiled into the cache is found there by a process without
 * NVRTC, which cannot know the full key (it holds the NVRTC version). */
static void test_cache_serves_without_nvrtc(void **state) {
  (void)state;
  char spec[512], key[33], again[33];
  snprintf(spec, sizeof spec, "%s", fjt_write_text("causal.lua", causal_spec));
  int rc = fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64", spec);
  if (rc != 0) fail_msg("compile failed (%d): %s", rc, fjt_err);
  printed_key(key);
  rc = fjt_flexjit(NO_NVRTC, "compile %s --arch sm_80 --head-dim 64", spec);
  if (rc != 0) fail_msg("compile without NVRTC failed (%d): %s", rc, fjt_err);
  fjt_expect_in(fjt_out, "from cache");
  printed_key(again);
  assert_string_equal(again, key);
  /* A kernel the cache lacks fails, naming why. */
  assert_int_equal(fjt_flexjit(NO_NVRTC, "compile %s --arch sm_80 --head-dim "
                                         "128 --dtype fp16", spec),
                   1);
  fjt_expect_in(fjt_err, "cannot be compiled here");
  fjt_expect_in(fjt_err, "FLEXJIT_NVRTC");
}

/* --pack FILE mounts a pack for `compile` and `run`. */
static void test_pack_option(void **state) {
  (void)state;
  char dir[400], manifest[400], pack[400], spec[400], empty[400];
  snprintf(dir, sizeof dir, "%s", fjt_path("pk"));
  assert_int_equal(mkdir(dir, 0777), 0);
  snprintf(spec, sizeof spec, "%s", fjt_write_text("pk/causal.lua", causal_spec));
  snprintf(manifest, sizeof manifest, "%s",
           fjt_write_text("pk/manifest.lua",
                          "return { specs = {'causal.lua'}, head_dims = {64},\n"
                          "  dtypes = {'bf16'}, archs = {'sm_80'} }\n"));
  snprintf(pack, sizeof pack, "%s", fjt_path("pk/k.fjpack"));
  snprintf(empty, sizeof empty, "%s", fjt_path("pk/empty-cache"));
  int rc = fjt_flexjit(NO_GPU, "precompile %s --out %s -j 1", manifest, pack);
  if (rc != 0) fail_msg("precompile failed (%d): %s", rc, fjt_err);
  rc = fjt_flexjit(NO_NVRTC, "compile %s --arch sm_80 --head-dim 64 "
                             "--cache-dir %s --pack %s", spec, empty, pack);
  if (rc != 0) fail_msg("compile from the pack failed (%d): %s", rc, fjt_err);
  fjt_expect_in(fjt_out, "from cache");
  assert_int_equal(fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --pack %s/none.fjpack",
                               spec, dir),
                   1);
  fjt_expect_in(fjt_err, "none.fjpack");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 --pack "
                                       "%s/none.fjpack", spec, dir),
                   1);
  fjt_expect_in(fjt_err, "none.fjpack");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 --pack %s",
                               spec, pack),
                   2);
  fjt_expect_in(fjt_err, "no GPU");
  assert_int_equal(fjt_flexjit(NULL, "compile --help"), 0);
  fjt_expect_in(fjt_out, "--pack FILE");
  assert_int_equal(fjt_flexjit(NULL, "run --help"), 0);
  fjt_expect_in(fjt_out, "--pack FILE");
}

/* ---- warnings and failures are said ---- */

static void flip_file_byte(const char *path, long at) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, at, SEEK_SET), 0);
  int c = fgetc(f);
  assert_int_equal(fseek(f, at, SEEK_SET), 0);
  fputc(c ^ 0x21, f);
  fclose(f);
}

/* The library's warnings (an unwritable cache, a corrupt entry) reach
 * stderr through the log callback the command installs. */
static void test_warnings_reach_stderr(void **state) {
  (void)state;
  char spec[400], file[400], cubin[1024];
  snprintf(spec, sizeof spec, "%s", fjt_write_text("causal.lua", causal_spec));
  snprintf(file, sizeof file, "%s", fjt_write_text("not-a-dir", "x"));
  int rc = fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 "
                               "--cache-dir %s/sub", spec, file);
  if (rc != 0) fail_msg("compile failed (%d): %s", rc, fjt_err);
  fjt_expect_in(fjt_out, "(memory only)");
  fjt_expect_in(fjt_err, "warning");
  fjt_expect_in(fjt_err, "Not a directory");

  rc = fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 "
                           "--cache-dir %s", spec, fjt_path("cache-c"));
  if (rc != 0) fail_msg("compile failed (%d): %s", rc, fjt_err);
  printed_cubin(cubin, sizeof cubin);
  flip_file_byte(cubin, 200);
  rc = fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 "
                           "--cache-dir %s", spec, fjt_path("cache-c"));
  if (rc != 0) fail_msg("recompile failed (%d): %s", rc, fjt_err);
  fjt_expect_in(fjt_out, "compiled in");
  fjt_expect_in(fjt_err, "corrupt");
  fjt_expect_in(fjt_err, cubin);
}

/* `cache clear` and `cache prune` that cannot remove entries fail, naming
 * the path and the reason. */
static void test_cache_maintenance_reports_failures(void **state) {
  (void)state;
  char spec[400], ro[400], cmd[1024];
  snprintf(spec, sizeof spec, "%s", fjt_write_text("causal.lua", causal_spec));
  snprintf(ro, sizeof ro, "%s", fjt_path("cache-ro"));
  int rc = fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 "
                               "--cache-dir %s", spec, ro);
  if (rc != 0) fail_msg("compile failed (%d): %s", rc, fjt_err);
  snprintf(cmd, sizeof cmd, "chmod -R a-w '%s'", ro);
  assert_int_equal(system(cmd), 0);
  rc = fjt_flexjit_unprivileged(NULL, "cache clear --dir %s", ro);
  assert_int_equal(rc, 1);
  fjt_expect_in(fjt_err, ro);
  fjt_expect_in(fjt_err, "Permission denied");
  rc = fjt_flexjit_unprivileged(NULL, "cache prune --max-bytes 0 --dir %s", ro);
  assert_int_equal(rc, 1);
  fjt_expect_in(fjt_err, ro);
  fjt_expect_in(fjt_err, "Permission denied");
  snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'", ro);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(fjt_flexjit(NULL, "cache ls --dir %s", ro), 0);
  fjt_expect_in(fjt_out, "fj_fwd_test_causal_d64_bf16");
}

/* `cache export` writes an entry's cubin as NVRTC made it (an ELF file,
 * byte for byte --emit-cubin's), and refuses a corrupt entry, an unknown
 * key, a target without the key and a bad key, naming why. */
static void test_cache_export(void **state) {
  (void)state;
  char spec[400], dir[400], key[33], good[33], cubin[1024], ref[400], out[400];
  snprintf(spec, sizeof spec, "%s", fjt_write_text("causal.lua", causal_spec));
  snprintf(dir, sizeof dir, "%s", fjt_path("cache-x"));
  snprintf(ref, sizeof ref, "%s", fjt_path("ref.cubin"));
  snprintf(out, sizeof out, "%s", fjt_path("out.cubin"));
  int rc = fjt_flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 --cache-dir %s "
                               "--emit-cubin %s", spec, dir, ref);
  if (rc != 0) fail_msg("compile failed (%d): %s", rc, fjt_err);
  printed_key(key);
  memcpy(good, key, sizeof good);
  printed_cubin(cubin, sizeof cubin);

  rc = fjt_flexjit(NULL, "cache export %s --out %s --dir %s", key, out, dir);
  if (rc != 0) fail_msg("export failed (%d): %s", rc, fjt_err);
  fjt_expect_in(fjt_out, "sm_80");
  fjt_expect_in(fjt_out, "fj_fwd_test_causal_d64_bf16");
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", ref, out);
  assert_int_equal(system(cmd), 0);

  assert_int_equal(fjt_flexjit(NULL, "cache export %s --arch sm_90a --out %s --dir %s", key,
                               out, dir), 1);
  fjt_expect_in(fjt_err, "no entry with key");
  key[0] = key[0] == '0' ? '1' : '0';
  assert_int_equal(fjt_flexjit(NULL, "cache export %s --out %s --dir %s", key, out, dir), 1);
  fjt_expect_in(fjt_err, "no entry with key");
  key[0] = 'g';
  assert_int_equal(fjt_flexjit(NULL, "cache export %s --out %s --dir %s", key, out, dir), 2);
  fjt_expect_in(fjt_err, "is not a key");
  assert_int_equal(fjt_flexjit(NULL, "cache export --out %s --dir %s", out, dir), 2);
  fjt_expect_in(fjt_err, "needs KEY");

  flip_file_byte(cubin, 300);
  assert_int_equal(fjt_flexjit(NULL, "cache export %s --out %s --dir %s", good, out, dir), 1);
  fjt_expect_in(fjt_err, "checksum mismatch");
  fjt_expect_in(fjt_err, cubin);
}

/* A 1-D int32 .npy of n values in the test's folder (format 1.0). */
static const char *write_npy_i32(const char *name, const int32_t *x, int n) {
  const char *path = fjt_path(name);
  char header[128];
  int len = snprintf(header, sizeof header,
                     "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }", n);
  while ((10 + len + 1) % 64) header[len++] = ' ';
  header[len++] = '\n';
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                           (unsigned char)(len & 255), (unsigned char)(len >> 8)};
  fwrite(pre, 1, 10, f);
  fwrite(header, 1, (size_t)len, f);
  fwrite(x, 4, (size_t)n, f);
  fclose(f);
  return path;
}

/* The serving options (--page-size, --seqlens-k, --varlen, --skip-softmax):
 * checked against each other and the sizes before the GPU; good ones get
 * as far as the missing GPU. --backward takes --varlen and refuses the
 * inference-only ones by name. */
static void test_run_serving_options(void **state) {
  (void)state;
  char spec[400], lens[400], bad_lens[400], with_b[400];
  snprintf(spec, sizeof spec, "%s", fjt_write_text("causal.lua", causal_spec));
  snprintf(with_b, sizeof with_b, "%s",
           fjt_write_text("with_b.lua",
                          "return { mask_mod = function(b, h, q, kv) "
                          "return ge(q + b, kv) end }\n"));
  const int32_t good[3] = {5, 20, 7}, zero[3] = {5, 0, 27};
  snprintf(lens, sizeof lens, "%s", write_npy_i32("lens.npy", good, 3));
  snprintf(bad_lens, sizeof bad_lens, "%s", write_npy_i32("zero.npy", zero, 3));
  static const char *const bad[][2] = {
      {"--page-size 24", "--page-size 24 is not a multiple of 16"},
      {"--page-size 8", "--page-size: '8' is not an integer in [16, 256]"},
      {"--page-size 272", "--page-size: '272'"},
      {"--seqlens-k 65", "--seqlens-k 65 is longer than --kv-len 64"},
      {"--seqlens-k some", "--seqlens-k: 'some' is not 'random' or a length"},
      {"--varlen 0", "--varlen: 0 sequences"},
      {"--varlen 33", "--varlen 33: more sequences than the 32 query tokens"},
      {"--varlen missing.npy", "not a readable .npy"},
      {"--varlen 4 --seqlens-k 9", "--seqlens-k with --varlen"},
      {"--varlen 4 --layout bshd", "--layout bshd with --varlen"},
      {"--varlen 4 --kv-len 8", "--varlen with --kv-len 8 < --q-len 16"},
      {"--skip-softmax 1", "--skip-softmax: '1' is not a threshold in [0, 1)"},
      {"--skip-softmax -1", "--skip-softmax: '-1'"},
      {"--page-size 16 --backward", "--backward with --page-size: paged KV is inference-only"},
      {"--varlen 3 --page-size 16 --backward", "--backward with --page-size: paged KV"},
      {"--seqlens-k 9 --backward", "--backward with --seqlens-k: seqlens_k is inference-only"},
      {"--skip-softmax 0.5 --backward",
       "--backward with --skip-softmax: Skip Softmax is inference-only"},
      {"--varlen 3 --deterministic", "--deterministic is a mode of the backward pass"},
      {"--seqlens-k 4 --block-mask on", "--block-mask on: a block mask covers"},
      {"--q-offset -1", "--q-offset: '-1' is not an integer in [0, 1073741824]"},
      {"--kv-offset x", "--kv-offset: 'x' is not an integer"},
      {"--q-offset 64 --varlen 3", "--q-offset/--kv-offset with --varlen"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(fjt_flexjit(NO_GPU, "run %s --batch 2 --heads 4 --kv-heads 2 "
                                         "--q-len 16 --kv-len 64 %s", spec, bad[i][0]),
                     2);
    fjt_expect_in(fjt_err, bad[i][1]);
    fjt_expect_not_in(fjt_err, "no GPU");
  }
  /* A lengths file: int32 >= 1, summing to B * Lq. */
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --batch 2 --heads 4 --q-len 16 "
                                       "--varlen %s", spec, bad_lens), 2);
  fjt_expect_in(fjt_err, "sequence 1 has length 0");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --batch 1 --heads 4 --q-len 16 "
                                       "--varlen %s", spec, lens), 2);
  fjt_expect_in(fjt_err, "the lengths sum to 32, not --batch x --q-len = 16");
  /* --inputs with --varlen are packed [total, H, D]. */
  assert_int_not_equal(fjt_flexjit(NO_GPU, "run %s --batch 2 --heads 4 --q-len 16 "
                                           "--varlen 3 --inputs %s", spec, fjt_tmpdir), 0);
  fjt_expect_in(fjt_err, "q.npy");
  fjt_expect_not_in(fjt_err, "no GPU");
  /* A spec that reads b cannot be checked one sequence at a time. */
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 4 --q-len 16 --page-size 16",
                               with_b), 2);
  fjt_expect_in(fjt_err, "reads b (or the batch size)");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 4 --q-len 16", with_b), 2);
  fjt_expect_in(fjt_err, "no GPU");
  /* Offsets that pass the checks get as far as the missing GPU. */
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 4 --q-len 16 --q-offset 4096 "
                                       "--kv-offset 4000 --check --backward", spec), 2);
  fjt_expect_in(fjt_err, "no GPU");
  static const char *const good_opts[] = {
      "--page-size 16", "--page-size 256 --seqlens-k random", "--seqlens-k 9",
      "--varlen 3", "--varlen 3 --kv-len 80 --page-size 32",
      "--q-len 1 --skip-softmax 0.25 --check --bench",
      /* The backward takes packed batches. */
      "--varlen 3 --backward --check --bench",
      "--varlen 5 --head-dim 64 --dtype fp16 --backward --deterministic --check",
  };
  for (size_t i = 0; i < sizeof good_opts / sizeof good_opts[0]; i++) {
    assert_int_equal(fjt_flexjit(NO_GPU, "run %s --batch 2 --heads 4 --kv-heads 2 "
                                         "--q-len 16 --kv-len 64 %s", spec, good_opts[i]),
                     2);
    fjt_expect_in(fjt_err, "no GPU");
  }
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --batch 2 --heads 4 --q-len 16 "
                                       "--varlen=%s", spec, lens), 2);
  fjt_expect_in(fjt_err, "no GPU");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --batch 2 --heads 4 --q-len 16 "
                                       "--varlen %s --backward --check", spec, lens), 2);
  fjt_expect_in(fjt_err, "no GPU");
  /* A spec that reads b is refused with the packed backward too. */
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 4 --q-len 16 --varlen 2 "
                                       "--backward --check", with_b), 2);
  fjt_expect_in(fjt_err, "reads b (or the batch size)");
  assert_int_equal(fjt_flexjit(NULL, "run --help"), 0);
  fjt_expect_in(fjt_out, "--page-size N");
  fjt_expect_in(fjt_out, "--varlen N|FILE.npy");
  fjt_expect_in(fjt_out, "--skip-softmax T");
  fjt_expect_in(fjt_out, "TB/s of K and V read");
  fjt_expect_in(fjt_out, "With --varlen the backward gets the packed batch");
  fjt_expect_in(fjt_out, "are inference-only: refused with --backward");
}

/* ---- options are checked before anything runs ---- */

static void test_run_checks_options_before_the_gpu(void **state) {
  (void)state;
  char spec[400], file[400];
  snprintf(spec, sizeof spec, "%s", fjt_write_text("causal.lua", causal_spec));
  snprintf(file, sizeof file, "%s", fjt_write_text("plain-file", "x"));
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 "
                                       "--head-dim 96", spec),
                   2);
  fjt_expect_in(fjt_err, "head dim 96");
  fjt_expect_not_in(fjt_err, "no GPU");
  assert_int_not_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 "
                                           "--inputs %s/none", spec, fjt_tmpdir),
                       0);
  fjt_expect_in(fjt_err, "q.npy");
  fjt_expect_not_in(fjt_err, "no GPU");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 "
                                       "--dump %s/sub", spec, file),
                   2);
  fjt_expect_in(fjt_err, "--dump");
  fjt_expect_in(fjt_err, "Not a directory");
  fjt_expect_not_in(fjt_err, "no GPU");
  /* A dump folder that can be made is fine: then only the GPU is missing. */
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 8 --dump %s",
                               spec, fjt_path("dump")),
                   2);
  fjt_expect_in(fjt_err, "no GPU");
}

static void test_precompile_checks_output_first(void **state) {
  (void)state;
  char manifest[400], file[400];
  fjt_write_text("broken.lua", "return { mask_mod = 1 +\n");
  snprintf(manifest, sizeof manifest, "%s",
           fjt_write_text("broken-manifest.lua",
                          "return { specs = {'broken.lua'}, head_dims = {64},\n"
                          "  dtypes = {'bf16'}, archs = {'sm_80'} }\n"));
  snprintf(file, sizeof file, "%s", fjt_write_text("plain-file", "x"));
  assert_int_equal(fjt_flexjit(NO_GPU, "precompile %s --out %s/missing/x.fjpack",
                               manifest, fjt_tmpdir),
                   1);
  fjt_expect_in(fjt_err, "missing");
  fjt_expect_not_in(fjt_err, "broken.lua");
  assert_int_equal(fjt_flexjit(NO_GPU, "precompile %s --out %s/sub", manifest,
                               file),
                   1);
  fjt_expect_in(fjt_err, "Not a directory");
  fjt_expect_not_in(fjt_err, "broken.lua");
}

static void test_demo_without_gpu(void **state) {
  (void)state;
  char dir[400];  /* fjt_path's buffers are reused by fjt_write_text */
  snprintf(dir, sizeof dir, "%s", fjt_path("examples"));
  assert_int_equal(mkdir(dir, 0777), 0);
  fjt_write_text("examples/causal.lua", causal_spec);
  int rc = fjt_flexjit(NO_GPU, "demo --examples %s", dir);
  if (rc != 0) fail_msg("demo failed (%d): %s", rc, fjt_err);
  fjt_expect_in(fjt_out, "no GPU: compiled and cached 2 kernels");
  assert_int_equal(fjt_flexjit(NO_GPU, "demo --examples %s", dir), 0);
  fjt_expect_in(fjt_out, "2 already cached");
  assert_int_equal(fjt_flexjit(NO_GPU, "demo --examples %s/none", fjt_tmpdir), 2);
  fjt_expect_in(fjt_err, "--examples");
  /* A broken spec among good ones: the others still compile (in parallel),
   * the broken one is named, and the demo fails. */
  fjt_write_text("examples/broken.lua", "return { mask_mod = function(b, h, q, kv) return q >= kv end\n");
  rc = fjt_flexjit(NO_GPU, "demo --examples %s", dir);
  assert_int_not_equal(rc, 0);
  fjt_expect_in(fjt_err, "broken.lua");
  fjt_expect_in(fjt_out, "2 already cached");
  fjt_expect_in(fjt_out, "some failed");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version_and_help),
      cmocka_unit_test(test_subcommand_help),
      cmocka_unit_test(test_run_usage_errors),
      cmocka_unit_test(test_run_bench_options),
      cmocka_unit_test(test_run_backward_options),
      cmocka_unit_test(test_spec_errors),
      cmocka_unit_test(test_runtime_values_are_checked),
      cmocka_unit_test(test_compile_needs_arch_without_gpu),
      cmocka_unit_test(test_compile_and_cache),
      cmocka_unit_test(test_cache_serves_without_nvrtc),
      cmocka_unit_test(test_pack_option),
      cmocka_unit_test(test_warnings_reach_stderr),
      cmocka_unit_test(test_cache_maintenance_reports_failures),
      cmocka_unit_test(test_cache_export),
      cmocka_unit_test(test_run_checks_options_before_the_gpu),
      cmocka_unit_test(test_run_serving_options),
      cmocka_unit_test(test_precompile_checks_output_first),
      cmocka_unit_test(test_demo_without_gpu),
  };
  return cmocka_run_group_tests(tests, setup, fjt_remove_tmpdir);
}
