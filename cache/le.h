/*
 * cache/le.h: little-endian fields of the on-disk formats (cache entries and
 * packs), independent of the host's byte order.
 */
#ifndef FJC_LE_H
#define FJC_LE_H

#include <stdint.h>

static inline void fjc_put_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static inline void fjc_put_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t fjc_get_le32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static inline uint64_t fjc_get_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

#endif /* FJC_LE_H */
