/*
 * tests/unit/test_spill_refit.c: the runtime's answer to a kernel that
 * spills (runtime/forward.c, refit_spilling). No shipped configuration
 * spills, so the test makes one: FJ_CONSUMER_REGS=168 leaves the sm90
 * consumers the registers they start with, too few for the intra-warpgroup
 * overlap at D=128 with a score_mod. The runtime must then compile again with
 * the configuration's fallback (-DFJ_INTRA_WG_OVERLAP=0), keep it because it
 * spills less, and say so through the log callback; with the fallback
 * already among the options it must not try.
 *
 * Needs NVRTC (compiles for sm_90a); skips without it. No GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flexjit.h"
#include "runtime/nvrtc.h"

static const char kSpec[] =
    "return { mask_mod = causal(), score_mod = softcap(30) }\n";

typedef struct messages {
  char text[8192];
} messages;

static void collect(void *user, fj_log_level level, const char *msg) {
  messages *m = user;
  (void)level;
  size_t n = strlen(m->text);
  snprintf(m->text + n, sizeof m->text - n, "%s\n", msg);
}

/* Compiles kSpec for sm_90a, D=128, with FLEXJIT_KERNEL_DEFINES = defines;
 * the log lands in *m. Skips the test without NVRTC. */
static void compile_with(const char *defines, messages *m) {
  char err[256];
  if (fjr_nvrtc_load(NULL, &(const fjr_nvrtc *){NULL}, err, sizeof err) != FJ_OK) skip();
  setenv("FLEXJIT_KERNEL_DEFINES", defines, 1);
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = ""; /* memory only: every run compiles */
  o.log = collect;
  o.log_user = m;
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  assert_int_equal(fj_spec_load_string(ctx, kSpec, strlen(kSpec), "s.lua", &spec), FJ_OK);
  fj_kernel_options ko = {.head_dim = 128, .dtype = FJ_DTYPE_BF16, .arch = "sm_90a",
                          .kernel_template = "sm90"};
  fj_status st = fj_compile_forward(ctx, spec, &ko, NULL);
  if (st != FJ_OK) fail_msg("compile: %s", fj_context_last_error(ctx));
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  unsetenv("FLEXJIT_KERNEL_DEFINES");
}

static void test_spilling_kernel_is_refit(void **state) {
  (void)state;
  static messages m;
  compile_with("FJ_CONSUMER_REGS=168", &m);
  if (!strstr(m.text, "with -DFJ_INTRA_WG_OVERLAP=0: compiled with it"))
    fail_msg("no refit reported; log:\n%s", m.text);
}

static void test_fallback_already_set(void **state) {
  (void)state;
  static messages m;
  compile_with("FJ_CONSUMER_REGS=168 FJ_INTRA_WG_OVERLAP=0", &m);
  assert_null(strstr(m.text, "compiled with it"));
  assert_non_null(strstr(m.text, "compiled fj_fwd_"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spilling_kernel_is_refit),
      cmocka_unit_test(test_fallback_already_set),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
