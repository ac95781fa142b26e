/*
 * cache/meta.h: reading fields of an entry's .json sidecar.
 *
 * The sidecar is written by the runtime for people and tools: a flat JSON
 * object such as {"name": "fj_fwd_causal_d64_bf16_sm_80", "source_key":
 * "<32 hex>", "nvrtc": "13.0", ...}. flexjit only ever needs a few of its
 * top-level string fields, so this is a small scanner, not a JSON library:
 * it skips over strings, numbers, nested objects and arrays correctly and
 * decodes the escapes the runtime writes (\" \\ \/ \n \t \r \b \f \uXXXX).
 */
#ifndef FJC_META_H
#define FJC_META_H

#include <stddef.h>

/* Copies the top-level string field `field` of the JSON object text (len
 * bytes, need not be NUL-terminated) into out (NUL-terminated, truncated to
 * outlen - 1 bytes). Returns 0, or -1 when the field is missing, is not a
 * string, or the text is not a JSON object (out is then ""). */
int fjc_meta_string(const char *json, size_t len, const char *field, char *out,
                    size_t outlen);

/* Reads at most max_bytes of the file at path and extracts `field` the same
 * way. Returns 0 or -1 (unreadable file or missing field). */
int fjc_meta_file_string(const char *path, size_t max_bytes, const char *field,
                         char *out, size_t outlen);

/* The same from an open file, read from offset 0. */
int fjc_meta_fd_string(int fd, size_t max_bytes, const char *field,
                       char *out, size_t outlen);

#endif /* FJC_META_H */
