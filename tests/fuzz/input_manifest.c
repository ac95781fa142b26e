/*
 * tests/fuzz/input_manifest.c: precompile manifests as bytes (cli/manifest.c,
 * Lua in the sandbox), for libFuzzer; an input fuzzer like input_spec.c.
 */
#include <stdint.h>

#include "cli/manifest.h"
#include "tests/fuzz/input_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  cli_manifest m;
  char err[512];
  cli_manifest_load(fuzz_write_file(data, size, ".lua"), &m, err, sizeof err);
  cli_manifest_free(&m);
  return 0;
}
