/*
 * cache/key.c: XXH3-128 cache keys (see key.h).
 */
#include "cache/key.h"

#include <stdalign.h>
#include <string.h>

/* Inline everything so no XXH_ symbol leaks into the host application. */
#define XXH_INLINE_ALL
#include <xxhash.h>

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((fjc_key_builder *)0)->state),
               "fjc_key_builder too small for XXH3_state_t");
_Static_assert(alignof(XXH3_state_t) <= alignof(fjc_key_builder),
               "fjc_key_builder under-aligned for XXH3_state_t");

static XXH3_state_t *state_of(fjc_key_builder *b) {
  return (XXH3_state_t *)(void *)b->state;
}

static void add_u64(XXH3_state_t *s, uint64_t v) {
  unsigned char le[8];
  for (int i = 0; i < 8; i++)
    le[i] = (unsigned char)(v >> (8 * i));
  XXH3_128bits_update(s, le, sizeof le);
}

void fjc_key_begin(fjc_key_builder *b) {
  XXH3_state_t *s = state_of(b);
  XXH3_INITSTATE(s);
  XXH3_128bits_reset(s);
  fjc_key_add_int(b, "schema", FJC_KEY_SCHEMA);
}

void fjc_key_add(fjc_key_builder *b, const char *tag, const void *data,
                 size_t len) {
  XXH3_state_t *s = state_of(b);
  size_t tag_len = tag ? strlen(tag) : 0;
  add_u64(s, tag_len);
  if (tag_len)
    XXH3_128bits_update(s, tag, tag_len);
  add_u64(s, len);
  if (len)
    XXH3_128bits_update(s, data, len);
}

void fjc_key_add_str(fjc_key_builder *b, const char *tag, const char *str) {
  fjc_key_add(b, tag, str, str ? strlen(str) : 0);
}

void fjc_key_add_int(fjc_key_builder *b, const char *tag, int64_t value) {
  unsigned char le[8];
  uint64_t v = (uint64_t)value;
  for (int i = 0; i < 8; i++)
    le[i] = (unsigned char)(v >> (8 * i));
  fjc_key_add(b, tag, le, sizeof le);
}

void fjc_key_from_bytes(const uint8_t bytes[16], fjc_key *out) {
  static const char digits[] = "0123456789abcdef";
  memmove(out->bytes, bytes, sizeof out->bytes);
  for (int i = 0; i < 16; i++) {
    out->hex[2 * i] = digits[out->bytes[i] >> 4];
    out->hex[2 * i + 1] = digits[out->bytes[i] & 15];
  }
  out->hex[32] = '\0';
}

void fjc_key_finish(fjc_key_builder *b, fjc_key *out) {
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(state_of(b)));
  fjc_key_from_bytes(canon.digest, out);
}

void fjc_key_with_nvrtc(const fjc_key *source_key, const char *nvrtc_version,
                        fjc_key *out) {
  fjc_key_builder b;
  fjc_key_begin(&b);
  fjc_key_add(&b, "source_key", source_key->bytes, sizeof source_key->bytes);
  fjc_key_add_str(&b, "nvrtc", nvrtc_version);
  fjc_key_finish(&b, out);
}

int fjc_hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

int fjc_key_from_hex(const char *hex, fjc_key *out) {
  if (!hex || strlen(hex) != 32)
    return -1;
  for (int i = 0; i < 16; i++) {
    int hi = fjc_hex_value(hex[2 * i]), lo = fjc_hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return -1;
    out->bytes[i] = (uint8_t)(hi << 4 | lo);
  }
  for (int i = 0; i < 32; i++)
    out->hex[i] = (char)(fjc_hex_value(hex[i]) < 10 ? hex[i] : (hex[i] | 0x20));
  out->hex[32] = '\0';
  return 0;
}
