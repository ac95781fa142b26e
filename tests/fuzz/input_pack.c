/*
 * tests/fuzz/input_pack.c: .fjpack files as bytes (cache/pack.c), for
 * libFuzzer; an input fuzzer like input_spec.c. A pack that mounts has
 * every entry listed and its blob checked, and its first entries looked up
 * by full and by source key.
 *
 * Checksums guard the header, the index and each blob, and a mutation
 * almost never keeps one right, so on its own the fuzzer would only ever
 * reach the first check. The input's first byte says which to mend after
 * the rest is laid out as the file (cache/pack.h gives the layout): bit 0
 * the file size field, bit 1 the index checksum, bit 2 (with bit 1) each
 * blob checksum, bit 3 the header checksum.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache/le.h"
#include "cache/pack.h"
#include "tests/fuzz/input_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void mend(unsigned char *f, uint64_t size, unsigned flags) {
  if (size < 64) return;
  const uint64_t count = fjc_get_le64(f + 16), index = fjc_get_le64(f + 24),
                 index_size = fjc_get_le64(f + 32);
  if (flags & 1) fjc_put_le64(f + 48, size);
  if ((flags & 2) && index <= size && index_size <= size - index) {
    for (uint64_t i = 0; (flags & 4) && i < count && (i + 1) * 256 <= index_size; i++) {
      unsigned char *r = f + index + 256 * i;
      const uint64_t at = fjc_get_le64(r + 208), n = fjc_get_le64(r + 216);
      if (at <= size && n <= size - at) fjc_put_le64(r + 224, XXH3_64bits(f + at, n));
    }
    fjc_put_le64(f + 40, XXH3_64bits(f + index, index_size));
  }
  if (flags & 8) fjc_put_le64(f + 56, XXH3_64bits(f, 56));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  unsigned char *file = malloc(size);
  if (!file) abort();
  memcpy(file, data + 1, size - 1);
  mend(file, size - 1, data[0]);
  const char *path = fuzz_write_file(file, size - 1, ".fjpack");
  free(file);

  fjc_pack *pack;
  char err[512];
  if (fjc_pack_open(path, &pack, err, sizeof err) != FJ_OK) return 0;
  const int n = fjc_pack_count(pack);
  for (int i = 0; i < n; i++) {
    fjc_pack_entry e;
    if (fjc_pack_entry_at(pack, i, &e) == FJ_OK) (void)fjc_pack_check_blob(pack, i);
  }
  for (int i = 0; i < n && i < 4; i++) {
    fjc_pack_entry e;
    void *cubin;
    size_t bytes;
    if (fjc_pack_entry_at(pack, i, &e) != FJ_OK) continue;
    if (fjc_pack_find(pack, e.arch, &e.full_key, NULL, &cubin, &bytes, NULL) == FJ_OK)
      free(cubin);
    if (fjc_pack_find(pack, e.arch, NULL, &e.source_key, &cubin, &bytes, NULL) == FJ_OK)
      free(cubin);
  }
  fjc_pack_close(pack);
  return 0;
}
