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

#define NO_GPU "CUDA_VISIBLE_DEVICES= "

static char tmpdir[256];
static char out[65536], err[65536];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "%s/test_cli.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(tmpdir)) return -1;
  char cache[300];
  snprintf(cache, sizeof cache, "%s/cache", tmpdir);
  return setenv("FLEXJIT_CACHE_DIR", cache, 1);
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp_path(const char *name) {
  static char p[2][400];
  static int which;
  which ^= 1;
  snprintf(p[which], sizeof p[which], "%s/%s", tmpdir, name);
  return p[which];
}

static void slurp(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = 0;
  if (f) {
    n = fread(buf, 1, cap - 1, f);
    fclose(f);
  }
  buf[n] = '\0';
}

/* Runs "[env] flexjit ARGS"; returns the exit status, output in out/err. */
static int flexjit(const char *env, const char *fmt, ...) {
  char args[4096], cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  char o[400], e[400];
  snprintf(o, sizeof o, "%s/stdout", tmpdir);
  snprintf(e, sizeof e, "%s/stderr", tmpdir);
  snprintf(cmd, sizeof cmd, "%s'%s/flexjit' %s >'%s' 2>'%s'", env ? env : "",
           FJ_BINARY_DIR, args, o, e);
  int st = system(cmd);
  slurp(o, out, sizeof out);
  slurp(e, err, sizeof err);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_in(const char *hay, const char *needle) {
  if (!strstr(hay, needle))
    fail_msg("expected '%s' in:\n%s\n(stderr: %s)", needle, hay, err);
}

static const char *write_spec(const char *name, const char *text) {
  const char *p = tmp_path(name);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  return p;
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
  assert_int_equal(flexjit(NULL, "--version"), 0);
  expect_in(out, "flexjit 0.1.0");
  assert_int_equal(flexjit(NULL, "--help"), 0);
  expect_in(out, "usage: flexjit SUBCOMMAND");
  expect_in(out, "compile");
  expect_in(out, "demo");
  assert_int_equal(flexjit(NULL, ""), 2);
  expect_in(err, "usage:");
  assert_int_equal(flexjit(NULL, "frobnicate"), 2);
  expect_in(err, "unknown subcommand 'frobnicate'");
}

static void test_subcommand_help(void **state) {
  (void)state;
  assert_int_equal(flexjit(NULL, "compile --help"), 0);
  expect_in(out, "usage: flexjit compile SPEC.lua");
  expect_in(out, "--emit-cuda");
  assert_int_equal(flexjit(NULL, "run --help"), 0);
  expect_in(out, "usage: flexjit run SPEC.lua");
  expect_in(out, "--buffer NAME=FILE.npy");
  assert_int_equal(flexjit(NULL, "run x.lua --heads 2 -h"), 0);
  assert_int_equal(flexjit(NULL, "demo --help"), 0);
  expect_in(out, "usage: flexjit demo");
}

/* ---- usage errors ---- */

static void test_run_usage_errors(void **state) {
  (void)state;
  const char *spec = write_spec("causal.lua", causal_spec);
  assert_int_equal(flexjit(NULL, "run"), 2);
  expect_in(err, "no spec given");
  assert_int_equal(flexjit(NULL, "run %s --q-len 16", spec), 2);
  expect_in(err, "--heads and --q-len are required");
  assert_int_equal(flexjit(NULL, "run %s --heads two --q-len 16", spec), 2);
  expect_in(err, "--heads: 'two' is not an integer");
  assert_int_equal(flexjit(NULL, "run %s --heads 6 --kv-heads 4 --q-len 8",
                           spec), 2);
  expect_in(err, "not a multiple of --kv-heads");
  assert_int_equal(flexjit(NULL, "run %s --heads 2 --q-len 8 --layout sbhd",
                           spec), 2);
  expect_in(err, "--layout: 'sbhd'");
  assert_int_equal(flexjit(NULL, "run %s --heads 2 --q-len 8 --frob", spec),
                   2);
  expect_in(err, "unknown option '--frob'");
  assert_int_equal(flexjit(NULL, "run %s --heads", spec), 2);
  expect_in(err, "--heads needs a value");
  assert_int_equal(flexjit(NULL, "run %s --heads 2 --q-len 8 --param w", spec),
                   2);
  expect_in(err, "expected NAME=VALUE");
  assert_int_equal(flexjit(NULL, "compile"), 2);
  expect_in(err, "no spec given");
  assert_int_equal(flexjit(NULL, "compile %s --dtype fp8", spec), 2);
  expect_in(err, "--dtype: 'fp8'");
}

/* ---- errors that need the spec, not the GPU ---- */

static void test_spec_errors(void **state) {
  (void)state;
  const char *bad = write_spec("bad.lua", "return {\n  mask_mod = \n");
  assert_int_equal(flexjit(NO_GPU, "compile %s --arch sm_80", bad), 1);
  expect_in(err, "bad.lua:");
  assert_int_equal(flexjit(NO_GPU, "run %s --heads 2 --q-len 8", bad), 1);
  expect_in(err, "bad.lua:");
  assert_int_equal(flexjit(NO_GPU, "compile %s --arch sm_80",
                           tmp_path("missing.lua")),
                   1);
  expect_in(err, "missing.lua");
}

static void test_runtime_values_are_checked(void **state) {
  (void)state;
  char spec[512], npy[512];
  snprintf(spec, sizeof spec, "%s", write_spec("document.lua", document_spec));
  /* A 1-D int32 .npy with 8 zeros. */
  unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 118, 0};
  const char *dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (8,), }";
  snprintf(npy, sizeof npy, "%s", tmp_path("doc.npy"));
  FILE *f = fopen(npy, "wb");
  assert_non_null(f);
  fwrite(head, 1, 10, f);
  fprintf(f, "%-117s\n", dict);
  for (int i = 0; i < 8; i++) fwrite("\0\0\0\0", 1, 4, f);
  fclose(f);

  /* A buffer not given is generated (and said so); the param is not. */
  assert_int_equal(flexjit(NO_GPU, "run %s --heads 2 --q-len 8", spec), 2);
  expect_in(out, "buffer  doc: generated document ids");
  expect_in(err, "param 'window'");
  assert_int_equal(flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --param "
                                   "window=4", spec),
                   2);
  expect_in(err, "no GPU");
  assert_int_equal(flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --buffer "
                                   "doc=%s", spec, npy),
                   2);
  expect_in(err, "param 'window'");
  assert_int_equal(flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --buffer "
                                   "doc=%s --param window=wide", spec, npy),
                   2);
  expect_in(err, "--param window: 'wide' is not an i32");
  assert_int_equal(flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --buffer "
                                   "doc=%s --param window=4 --param x=1",
                           spec, npy),
                   2);
  expect_in(err, "no param or buffer named 'x'");
  assert_int_equal(flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --param "
                                   "doc=3 --param window=4", spec),
                   2);
  expect_in(err, "'doc' is a buffer");
  assert_int_equal(flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --buffer "
                                   "doc=%s", spec, tmp_path("nope.npy")),
                   1);
  expect_in(err, "nope.npy");
  /* Everything in order: only the GPU is missing. */
  assert_int_equal(flexjit(NO_GPU, "run %s --heads 2 --q-len 8 --buffer "
                                   "doc=%s --param window=4", spec, npy),
                   2);
  expect_in(err, "no GPU");
}

/* ---- compiling without a GPU ---- */

static void test_compile_needs_arch_without_gpu(void **state) {
  (void)state;
  const char *spec = write_spec("causal.lua", causal_spec);
  assert_int_equal(flexjit(NO_GPU, "compile %s", spec), 2);
  expect_in(err, "no GPU found: pass --arch");
}

static void test_compile_and_cache(void **state) {
  (void)state;
  const char *spec = write_spec("causal.lua", causal_spec);
  const char *cu = tmp_path("causal.cu");
  int rc = flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 "
                           "--emit-cuda %s", spec, cu);
  if (rc != 0) fail_msg("compile failed (%d): %s", rc, err);
  expect_in(out, "key     ");
  expect_in(out, "compiled in");
  expect_in(out, "sm_80");
  struct stat st;
  assert_int_equal(stat(cu, &st), 0);
  assert_true(st.st_size > 100);
  /* Same spec again: found in the disk cache, NVRTC not called. */
  assert_int_equal(flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64",
                           spec), 0);
  expect_in(out, "from cache");
  /* Another dtype is another kernel. */
  assert_int_equal(flexjit(NO_GPU, "compile %s --arch sm_80 --head-dim 64 "
                                   "--dtype fp16", spec),
                   0);
  expect_in(out, "compiled in");
}

static void test_demo_without_gpu(void **state) {
  (void)state;
  char dir[400];  /* tmp_path's buffer is reused by write_spec */
  snprintf(dir, sizeof dir, "%s", tmp_path("examples"));
  assert_int_equal(mkdir(dir, 0777), 0);
  write_spec("examples/causal.lua", causal_spec);
  int rc = flexjit(NO_GPU, "demo --examples %s", dir);
  if (rc != 0) fail_msg("demo failed (%d): %s", rc, err);
  expect_in(out, "no GPU: compiled and cached 2 kernels");
  assert_int_equal(flexjit(NO_GPU, "demo --examples %s", dir), 0);
  expect_in(out, "2 already cached");
  assert_int_equal(flexjit(NO_GPU, "demo --examples %s/none", tmpdir), 2);
  expect_in(err, "--examples");
  /* A broken spec among good ones: the others still compile (in parallel),
   * the broken one is named, and the demo fails. */
  write_spec("examples/broken.lua", "return { mask_mod = function(b, h, q, kv) return q >= kv end\n");
  rc = flexjit(NO_GPU, "demo --examples %s", dir);
  assert_int_not_equal(rc, 0);
  expect_in(err, "broken.lua");
  expect_in(out, "2 already cached");
  expect_in(out, "some failed");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version_and_help),
      cmocka_unit_test(test_subcommand_help),
      cmocka_unit_test(test_run_usage_errors),
      cmocka_unit_test(test_spec_errors),
      cmocka_unit_test(test_runtime_values_are_checked),
      cmocka_unit_test(test_compile_needs_arch_without_gpu),
      cmocka_unit_test(test_compile_and_cache),
      cmocka_unit_test(test_demo_without_gpu),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
