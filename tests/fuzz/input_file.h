/*
 * tests/fuzz/input_file.h: the input fuzzers' scratch file, for readers
 * that take a path: one per process under $TMPDIR (else /tmp), rewritten
 * for each input and removed at exit.
 */
#ifndef FJ_FUZZ_INPUT_FILE_H
#define FJ_FUZZ_INPUT_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char fuzz_path[512];

static void fuzz_remove_file(void) { unlink(fuzz_path); }

/* Writes data to the scratch file (named with suffix) and returns its path;
 * aborts when it cannot, which is the machine's fault, not the input's. */
static const char *fuzz_write_file(const uint8_t *data, size_t size, const char *suffix) {
  if (!fuzz_path[0]) {
    const char *dir = getenv("TMPDIR");
    snprintf(fuzz_path, sizeof fuzz_path, "%s/fj_fuzz_%d%s", dir && *dir ? dir : "/tmp",
             (int)getpid(), suffix);
    atexit(fuzz_remove_file);
  }
  FILE *f = fopen(fuzz_path, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
  return fuzz_path;
}

#endif /* FJ_FUZZ_INPUT_FILE_H */
