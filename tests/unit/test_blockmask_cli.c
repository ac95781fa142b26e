/*
 * tests/unit/test_blockmask_cli.c: `flexjit mask` (cli/cmd_mask.c), run as a
 * separate process (FJ_BINARY_DIR/flexjit) with CUDA_VISIBLE_DEVICES="": the
 * element and block grids, the density and block counts, --param and
 * --buffer, the SVG picture and usage errors, the uncertain pairs (float32
 * exp/log/tanh the CPU cannot decide the kernel's way), the limits on work;
 * and `run --block-mask`'s option checking.
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

#include "tests/unit/cli_run.h"

static int setup(void **state) {
  (void)state;
  return fjt_make_tmpdir("test_bm_cli");
}

/* A 1-D int32 .npy (format 1.0). */
static const char *write_npy_i32(const char *name, const int32_t *x, int n) {
  const char *p = fjt_path(name);
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
  const char *spec = fjt_write_text("win.lua", window_spec);
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 40 --param window=8", spec), 0);
  /* Sum over rows of min(q + 1, 8) = 36 + 32 * 8. */
  fjt_expect_in(fjt_out, "density 0.182500 (292 of 1600 pairs allowed)");
  fjt_expect_in(fjt_out, "'#' allowed");
  fjt_expect_in(fjt_out, "\n#.......................................\n");
  fjt_expect_in(fjt_out, "\n..########..............................\n");
  fjt_expect_in(fjt_out, "\n................................########\n");
}

static void test_block_grid(void **state) {
  (void)state;
  const char *spec = fjt_write_text("causal.lua", causal_spec);
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 1000 --block 100", spec), 0);
  fjt_expect_in(fjt_out, "density 0.500500 (500500 of 1000000 pairs allowed)");
  fjt_expect_in(fjt_out, "10 x 10 of 100 x 100: 45 full, 10 partial, 45 empty");
  fjt_expect_in(fjt_out, "\n+.........\n#+........\n");
  fjt_expect_in(fjt_out, "\n#########+\n");
  /* More than 128 blocks a side: several blocks a character. */
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 300 --kv-len 600 --block 2", spec),
                   0);
  fjt_expect_in(fjt_out, "150 x 300 of 2 x 2");
  fjt_expect_in(fjt_out, "a character is 2 x 3 blocks");
}

/* --at draws one batch entry and head of a mask that reads them. */
static void test_at_batch_and_head(void **state) {
  (void)state;
  const char *spec = fjt_write_text(
      "per_head.lua",
      "return { mask_mod = function(b, h, q, kv)\n"
      "  return ge(q, kv) & lt(q - kv, (h + 1) * 8 + b) end }\n");
  /* window w on a causal 1000 x 1000: w * 1000 - w * (w - 1) / 2 pairs. */
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 1000", spec), 0);
  fjt_expect_in(fjt_out, "b 0 h 0");
  fjt_expect_in(fjt_out, "(7972 of 1000000 pairs allowed)");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 1000 --at 2,3", spec), 0);
  fjt_expect_in(fjt_out, "b 2 h 3");
  fjt_expect_in(fjt_out, "(33439 of 1000000 pairs allowed)"); /* w = 34 */
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 40 --at 0,1", spec), 0);
  fjt_expect_in(fjt_out, "\n################........................\n");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 40 --at 1", spec), 2);
  fjt_expect_in(fjt_err, "--at: '1' is not B,H");
}

static void test_document_and_svg(void **state) {
  (void)state;
  const char *spec = fjt_write_text("doc.lua", document_spec);
  int32_t ids[512];
  for (int i = 0; i < 512; i++) ids[i] = i < 200 ? 0 : i < 450 ? 1 : 2;
  const char *npy = write_npy_i32("doc.npy", ids, 512);
  const char *svg = fjt_path("doc.svg");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 512 --block 64 --buffer doc=%s "
                           "--svg %s", spec, npy, svg),
                   0);
  /* Documents 0..199, 200..449, 450..511, each causal. */
  long allowed = 200L * 201 / 2 + 250L * 251 / 2 + 62L * 63 / 2;
  char want[128];
  snprintf(want, sizeof want, "(%ld of 262144 pairs allowed)", allowed);
  fjt_expect_in(fjt_out, want);
  fjt_expect_in(fjt_out, "reads buffers");
  fjt_expect_in(fjt_out, "svg     ");
  static char pic[1 << 20];
  fjt_slurp_into(svg, pic, sizeof pic);
  fjt_expect_in(pic, "<svg xmlns=\"http://www.w3.org/2000/svg\"");
  fjt_expect_in(pic, "</svg>");
  fjt_expect_in(pic, "full block");
  fjt_expect_in(pic, "fill=\"#1f4e9a\"");
  /* Small: the picture shows elements. */
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 20 --buffer doc=%s --svg %s",
                           spec, npy, svg), 0);
  fjt_slurp_into(svg, pic, sizeof pic);
  fjt_expect_in(pic, "allowed");
}

/* The mask is evaluated in float32 as the kernel does: q / 49 * 49 is q in
 * float (in double it was below q at q = 1, 2, 4, 8, 16). Pairs where the
 * kernel's tanh may fall on either side of 0 are uncertain, drawn '?'. */
static void test_float_and_uncertain(void **state) {
  (void)state;
  const char *q49 = fjt_write_text(
      "q49.lua", "return { mask_mod = function(b, h, q, kv)\n"
                 "  return lt(q / 49.0 * 49.0, q) end }\n");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 20", q49), 0);
  fjt_expect_in(fjt_out, "density 0.000000 (0 of 400 pairs allowed)");
  const char *spec = fjt_write_text(
      "tanh.lua", "return { mask_mod = function(b, h, q, kv)\n"
                  "  return lt(tanh((q - kv) * 0.5), 0.0) | lt(kv, 5) end }\n");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 12", spec), 0);
  /* The diagonal from (5, 5) on is uncertain; below it tanh < 0. */
  fjt_expect_in(fjt_out, "density 0.805556 (116 of 144 pairs allowed)");
  fjt_expect_in(fjt_out, "uncertain 7 pairs");
  fjt_expect_in(fjt_out, "'?' uncertain");
  fjt_expect_in(fjt_out, "\n#####?######\n#####.?#####\n");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 1000 --block 100", spec), 0);
  fjt_expect_in(fjt_out, "uncertain 995 pairs (0.000995) in 10 blocks");
  fjt_expect_in(fjt_out, "\n?#########\n+?########\n");
  const char *svg = fjt_path("tanh.svg");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 30 --svg %s", spec, svg), 0);
  static char pic[1 << 20];
  fjt_slurp_into(svg, pic, sizeof pic);
  fjt_expect_in(pic, "fill=\"#e8a33d\"");
  fjt_expect_in(pic, ">uncertain<");
}

/* Work is bounded: causal at 65536 in one block counts the diagonal's
 * small tiles only; a mask that interval analysis cannot decide stops at the
 * work limit, and too many blocks are refused up front. */
static void test_limits(void **state) {
  (void)state;
  const char *spec = fjt_write_text("causal2.lua", causal_spec);
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 65536 --block 65536", spec), 0);
  fjt_expect_in(fjt_out, "(2147516416 of 4294967296 pairs allowed)");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 1000000 --block 1", spec), 2);
  fjt_expect_in(fjt_err, "more than 4194304 blocks");
  const char *dilated = fjt_write_text(
      "dilated.lua", "return { mask_mod = function(b, h, q, kv)\n"
                     "  return eq((q - kv) % 3, 0) end }\n");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 65536 --work-limit 1000000",
                               dilated), 1);
  fjt_expect_in(fjt_err, "needs more than 1000000 mask node evaluations (--work-limit");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 300 --work-limit 10000000",
                               dilated), 0);
  fjt_expect_in(fjt_out, "(30000 of 90000 pairs allowed)");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 30 --work-limit 0", dilated), 2);
  fjt_expect_in(fjt_err, "--work-limit: '0' is not a positive integer");
}

static void test_usage_errors(void **state) {
  (void)state;
  const char *spec = fjt_write_text("doc2.lua", document_spec);
  assert_int_equal(fjt_flexjit(NO_GPU, "--help"), 0);
  fjt_expect_in(fjt_out, "mask SPEC.lua");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask --help"), 0);
  fjt_expect_in(fjt_out, "usage: flexjit mask SPEC.lua");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask"), 2);
  fjt_expect_in(fjt_err, "no spec given");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s", spec), 2);
  fjt_expect_in(fjt_err, "--q-len is required");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 16", spec), 2);
  fjt_expect_in(fjt_err, "--buffer doc=FILE.npy");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 16 --param doc=3", spec), 2);
  fjt_expect_in(fjt_err, "is a buffer of the spec");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 0", spec), 2);
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 16 --frob", spec), 2);
  fjt_expect_in(fjt_err, "unknown option '--frob'");
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s --q-len 16 --buffer doc=/nonexistent.npy",
                           spec), 1);
  assert_int_equal(fjt_flexjit(NO_GPU, "mask %s/missing.lua --q-len 16", fjt_tmpdir), 1);
  /* run's --block-mask is checked before any GPU is needed. */
  assert_int_equal(fjt_flexjit(NO_GPU, "run --help"), 0);
  fjt_expect_in(fjt_out, "--block-mask M");
  assert_int_equal(fjt_flexjit(NO_GPU, "run %s --heads 1 --q-len 16 --block-mask maybe",
                           spec), 2);
  fjt_expect_in(fjt_err, "--block-mask: 'maybe' is not auto, on or off");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_element_grid),
      cmocka_unit_test(test_block_grid),
      cmocka_unit_test(test_at_batch_and_head),
      cmocka_unit_test(test_document_and_svg),
      cmocka_unit_test(test_float_and_uncertain),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_usage_errors),
  };
  return cmocka_run_group_tests(tests, setup, fjt_remove_tmpdir);
}
