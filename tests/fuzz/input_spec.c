/*
 * tests/fuzz/input_spec.c: spec text as bytes, for libFuzzer (an input
 * fuzzer: docs/precision.md; tests/fuzz/replay.c runs it over seeds where
 * libFuzzer is not linked).
 *
 * Loads the bytes as a spec (fj_spec_load_string). One that loads has its
 * prologue and backward hooks emitted and its mask classified on the host
 * on two blocks, the second at context-parallel offsets. Errors are the
 * expected answer to most inputs; a crash, a sanitizer's finding or a hang
 * is a failure.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flexjit.h"
#include "gen/emit_cuda.h"
#include "gen/graph.h"
#include "runtime/context.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
  fj_spec_destroy(spec);
  return 0;
}
