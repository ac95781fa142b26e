/*
 * tests/fuzz/input_spec.c: spec text as bytes, for libFuzzer (an input
 * fuzzer: docs/precision.md; tests/fuzz/replay.c runs it over seeds where
 * libFuzzer is not linked).
 *
 * Loads the bytes as a spec (fj_spec_load_string). One that loads has its
 * prologue and backward hooks emitted, its mask classified through the
 * public call on two blocks (the second at context-parallel offsets), and
 * the spec fuzzer's mask checks (mask_checks.h) run under runtime values
 * drawn from a hash of the input: a census, block mask or tile class that
 * disagrees with brute-force evaluation is a failure, and so are a crash,
 * a sanitizer's finding and a hang. Errors are the expected answer to most
 * inputs.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "flexjit.h"
#include "gen/emit_cuda.h"
#include "gen/graph.h"
#include "runtime/context.h"
#include "tests/fuzz/mask_checks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A mask check's failure: printed with the input, then abort(), which is
 * how a fuzzer is told. */
static int fail_check(void *user, const char *what, ...) __attribute__((format(printf, 2, 3)));
static int fail_check(void *user, const char *what, ...) {
  va_list ap;
  va_start(ap, what);
  fprintf(stderr, "mask check failed: ");
  vfprintf(stderr, what, ap);
  va_end(ap);
  fprintf(stderr, "\n--- spec ---\n%s\n---\n", (const char *)user);
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static fj_context *ctx;
  if (!ctx && fj_context_create(NULL, &ctx) != FJ_OK) abort();
  fj_spec *spec = NULL;
  if (fj_spec_load_string(ctx, (const char *)data, size, "input", &spec) != FJ_OK) return 0;
  fjg_buf src;
  fjg_buf_init(&src);
  fjg_emit_prologue(fjr_spec_graph(spec), &src);
  fjg_emit_backward_hooks(fjr_spec_graph(spec), &src);
  fjg_buf_free(&src);

  /* Every param given a value (buffers are not read on the host). */
  fj_arg args[32];
  int n = 0;
  for (int i = 0; i < fj_spec_num_args(spec) && n < 32; i++, n++) {
    memset(&args[n], 0, sizeof args[n]);
    fj_spec_arg_info(spec, i, &args[n].name, NULL);
    args[n].i32 = 7 * i - 3;
    args[n].f32 = 0.5f * (float)i - 1.f;
  }
  fj_block_query q = {.B = 2, .Hq = 4, .Hkv = 2, .Lq = 300, .Lk = 517,
                      .q0 = 10, .q1 = 137, .kv0 = 0, .kv1 = 516};
  int cls;
  fj_spec_block_class(spec, args, n, &q, &cls);
  q.q_offset = 4096;
  q.kv_offset = 1000;
  fj_spec_block_class(spec, args, n, &q, &cls);
  (void)fj_spec_mask_deps(spec);

  char *text = malloc(size + 1);
  if (!text) abort();
  memcpy(text, data, size);
  text[size] = '\0';
  const uint64_t seed = XXH3_64bits(data, size);
  long elements = 0, uncertain = 0;
  for (int k = 0; k < 3; k++) {
    rng r = {seed + 7919u * (uint64_t)k};
    check_masks(fjr_spec_graph(spec), &r, fail_check, text, &elements, &uncertain);
  }
  free(text);
  fj_spec_destroy(spec);
  return 0;
}
