/*
 * tests/fuzz/input_npy.c: .npy files as bytes (the CLI's --buffer, --inputs
 * and --dump reader, cli/npy.c), for libFuzzer; an input fuzzer like
 * input_spec.c. A file that reads is converted to float32.
 */
#include <stdint.h>
#include <stdlib.h>

#include "cli/npy.h"
#include "tests/fuzz/input_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  npy_array a;
  char err[256];
  if (npy_read(fuzz_write_file(data, size, ".npy"), &a, err, sizeof err) != 0) return 0;
  free(npy_to_f32(&a));
  npy_free(&a);
  return 0;
}
