/*
 * tests/unit/test_blockmask_cli.c: `flexjit mask` (cli/cmd_mask.c), run as a
 * separate process (FJ_BINARY_DIR/flexjit) with CUDA_VISIBLE_DEVICES="": the
 * element and block grids, the density and block counts, --param and
 * --buffer, the SVG picture and usage errors; and `run --block-mask`'s
 * option checking.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define NO_GPU "CUDA_VISIBLE_DEVICES= "

static char tmpdir[256];
static char out[1 << 20], err[65536];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "%s/test_bm_cli.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp_path(const char *name) {
  static char p[4][400];
  static int which;
  which = (which + 1) % 4;
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

/* Runs "flexjit ARGS" without a GPU; exit status, output in out/err. */
static int flexjit(const char *fmt, ...) {
  char args[4096], cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, NO_GPU "'%s/flexjit' %s >'%s/stdout' 2>'%s/stderr'",
           FJ_BINARY_DIR, args, tmpdir, tmpdir);
  int st = system(cmd);
  char p[400];
  snprintf(p, sizeof p, "%s/stdout", tmpdir);
  slurp(p, out, sizeof out);
  snprintf(p, sizeof p, "%s/stderr", tmpdir);
  slurp(p, err, sizeof err);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_in(const char *hay, const char *needle) {
  if (!strstr(hay, needle))
    fail_msg("expected '%s' in:\n%s\n(stderr: %s)", needle, hay, err);
}

static const char *write_text(const char *name, const char *text) {
  const char *p = tmp_path(name);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  return p;
}

/* A 1-D int32 .npy (format 1.0). */
static const char *write_npy_i32(const char *name, const int32_t *x, int n) {
  const char *p = tmp_path(name);
  char header[128];
  int len = snprintf(header, sizeof header,
                     "{'descr': '<i4', 'fortran_order': False, 'shape': "
                     "(%d,), }", n);
  while ((10 + len + 1) % 64) header[len++] = ' ';
  header[len++] = '\n';
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  unsigned char hl[2] = {(unsigned char)(len & 255), (unsigned char)(len >> 8)};
  fwrite(hl, 1, 2, f);
  fwrite(header, 1, (size_t)len, f);
  fwrite(x, 4, (size_t)n, f);
  fclose(f);
  return p;
}

static const char window_spec[] =
    "return { name = \"win\", mask_mod = sliding_window(param(\"window\", "
    "\"i32\")) }\n";
static const char causal_spec[] = "return { mask_mod = causal() }\n";
static const char document_spec[] =
    "return { name = \"doc\", mask_mod = document(buffer(\"doc\", \"i32\")) }\n";

static void test_element_grid(void **state) {
  (void)state;
  const char *spec = write_text("win.lua", window_spec);
  assert_int_equal(flexjit("mask %s --q-len 40 --param window=8", spec), 0);
  /* Sum over rows of min(q + 1, 8) = 36 + 32 * 8. */
  expect_in(out, "density 0.182500 (292 of 1600 pairs allowed)");
  expect_in(out, "'#' allowed");
  expect_in(out, "\n#.......................................\n");
  expect_in(out, "\n..########..............................\n");
  expect_in(out, "\n................................########\n");
}

static void test_block_grid(void **state) {
  (void)state;
  const char *spec = write_text("causal.lua", causal_spec);
  assert_int_equal(flexjit("mask %s --q-len 1000 --block 100", spec), 0);
  expect_in(out, "density 0.500500 (500500 of 1000000 pairs allowed)");
  expect_in(out, "10 x 10 of 100 x 100: 45 full, 10 partial, 45 empty");
  expect_in(out, "\n+.........\n#+........\n");
  expect_in(out, "\n#########+\n");
  /* More than 128 blocks a side: several blocks a character. */
  assert_int_equal(flexjit("mask %s --q-len 300 --kv-len 600 --block 2", spec),
                   0);
  expect_in(out, "150 x 300 of 2 x 2");
  expect_in(out, "a character is 2 x 3 blocks");
}

/* --at draws one batch entry and head of a mask that reads them. */
static void test_at_batch_and_head(void **state) {
  (void)state;
  const char *spec = write_text(
      "per_head.lua",
      "return { mask_mod = function(b, h, q, kv)\n"
      "  return ge(q, kv) & lt(q - kv, (h + 1) * 8 + b) end }\n");
  /* window w on a causal 1000 x 1000: w * 1000 - w * (w - 1) / 2 pairs. */
  assert_int_equal(flexjit("mask %s --q-len 1000", spec), 0);
  expect_in(out, "b 0 h 0");
  expect_in(out, "(7972 of 1000000 pairs allowed)");
  assert_int_equal(flexjit("mask %s --q-len 1000 --at 2,3", spec), 0);
  expect_in(out, "b 2 h 3");
  expect_in(out, "(33439 of 1000000 pairs allowed)"); /* w = 34 */
  assert_int_equal(flexjit("mask %s --q-len 40 --at 0,1", spec), 0);
  expect_in(out, "\n################........................\n");
  assert_int_equal(flexjit("mask %s --q-len 40 --at 1", spec), 2);
  expect_in(err, "--at: '1' is not B,H");
}

static void test_document_and_svg(void **state) {
  (void)state;
  const char *spec = write_text("doc.lua", document_spec);
  int32_t ids[512];
  for (int i = 0; i < 512; i++) ids[i] = i < 200 ? 0 : i < 450 ? 1 : 2;
  const char *npy = write_npy_i32("doc.npy", ids, 512);
  const char *svg = tmp_path("doc.svg");
  assert_int_equal(flexjit("mask %s --q-len 512 --block 64 --buffer doc=%s "
                           "--svg %s", spec, npy, svg),
                   0);
  /* Documents 0..199, 200..449, 450..511, each causal. */
  long allowed = 200L * 201 / 2 + 250L * 251 / 2 + 62L * 63 / 2;
  char want[128];
  snprintf(want, sizeof want, "(%ld of 262144 pairs allowed)", allowed);
  expect_in(out, want);
  expect_in(out, "reads buffers");
  expect_in(out, "svg     ");
  static char pic[1 << 20];
  slurp(svg, pic, sizeof pic);
  expect_in(pic, "<svg xmlns=\"http://www.w3.org/2000/svg\"");
  expect_in(pic, "</svg>");
  expect_in(pic, "full block");
  expect_in(pic, "fill=\"#1f4e9a\"");
  /* Small: the picture shows elements. */
  assert_int_equal(flexjit("mask %s --q-len 20 --buffer doc=%s --svg %s",
                           spec, npy, svg), 0);
  slurp(svg, pic, sizeof pic);
  expect_in(pic, "allowed");
}

static void test_usage_errors(void **state) {
  (void)state;
  const char *spec = write_text("doc2.lua", document_spec);
  assert_int_equal(flexjit("--help"), 0);
  expect_in(out, "mask SPEC.lua");
  assert_int_equal(flexjit("mask --help"), 0);
  expect_in(out, "usage: flexjit mask SPEC.lua");
  assert_int_equal(flexjit("mask"), 2);
  expect_in(err, "no spec given");
  assert_int_equal(flexjit("mask %s", spec), 2);
  expect_in(err, "--q-len is required");
  assert_int_equal(flexjit("mask %s --q-len 16", spec), 2);
  expect_in(err, "--buffer doc=FILE.npy");
  assert_int_equal(flexjit("mask %s --q-len 16 --param doc=3", spec), 2);
  expect_in(err, "is a buffer of the spec");
  assert_int_equal(flexjit("mask %s --q-len 0", spec), 2);
  assert_int_equal(flexjit("mask %s --q-len 16 --frob", spec), 2);
  expect_in(err, "unknown option '--frob'");
  assert_int_equal(flexjit("mask %s --q-len 16 --buffer doc=/nonexistent.npy",
                           spec), 1);
  assert_int_equal(flexjit("mask %s/missing.lua --q-len 16", tmpdir), 1);
  /* run's --block-mask is checked before any GPU is needed. */
  assert_int_equal(flexjit("run --help"), 0);
  expect_in(out, "--block-mask M");
  assert_int_equal(flexjit("run %s --heads 1 --q-len 16 --block-mask maybe",
                           spec), 2);
  expect_in(err, "--block-mask: 'maybe' is not auto, on or off");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_element_grid),
      cmocka_unit_test(test_block_grid),
      cmocka_unit_test(test_at_batch_and_head),
      cmocka_unit_test(test_document_and_svg),
      cmocka_unit_test(test_usage_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
