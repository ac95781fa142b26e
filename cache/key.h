/*
 * cache/key.h: cache keys, XXH3-128 over length-prefixed, tagged records.
 *
 * Every ingredient that shapes a cubin is added as a record
 *   u64 tag length | tag bytes | u64 data length | data bytes   (little-endian)
 * so ("ab","c") and ("a","bc") differ, and so do the same bytes under two
 * tags. fjc_key_begin adds the schema version (FJC_KEY_SCHEMA) first: bump it
 * whenever the record layout or the meaning of an ingredient changes.
 * A builder lives on the caller's stack; it needs no cleanup.
 */
#ifndef FJC_KEY_H
#define FJC_KEY_H

#include <stddef.h>
#include <stdint.h>

#define FJC_KEY_SCHEMA 1

typedef struct fjc_key {
  uint8_t bytes[16]; /* canonical (big-endian) XXH3-128 */
  char hex[33];      /* the same, lowercase hex, NUL-terminated */
} fjc_key;

/* Storage for an XXH3 state, kept opaque so that users of this header need
 * neither xxhash.h nor its include path (key.c checks size and alignment). */
typedef struct fjc_key_builder {
  _Alignas(64) unsigned char state[640];
} fjc_key_builder;

/* Starts a key and adds the schema version record. */
void fjc_key_begin(fjc_key_builder *b);
/* Adds one tagged record. data may be NULL when len is 0. */
void fjc_key_add(fjc_key_builder *b, const char *tag, const void *data,
                 size_t len);
/* A NUL-terminated string (without its NUL); NULL is added as "". */
void fjc_key_add_str(fjc_key_builder *b, const char *tag, const char *str);
/* An integer as 8 little-endian bytes. */
void fjc_key_add_int(fjc_key_builder *b, const char *tag, int64_t value);
/* Writes the key; the builder may be begun again afterwards. */
void fjc_key_finish(fjc_key_builder *b, fjc_key *out);

/* The full (store) key of a kernel from its source key, the key of every
 * ingredient except the NVRTC version, and that version ("13.0"; NULL is
 * ""). Packs index kernels by both, so a machine without NVRTC, which
 * cannot know the version, can still find a kernel by its source key. */
void fjc_key_with_nvrtc(const fjc_key *source_key, const char *nvrtc_version,
                        fjc_key *out);

/* A key from its 16 canonical bytes (as files store it). */
void fjc_key_from_bytes(const uint8_t bytes[16], fjc_key *out);

/* Parses 32 hex digits (either case) into *out. Returns 0, or -1 when hex is
 * not a key. */
int fjc_key_from_hex(const char *hex, fjc_key *out);

/* The value of one hex digit (either case), or -1. */
int fjc_hex_value(char c);

#endif /* FJC_KEY_H */
