/*
 * cache/meta.c: top-level string fields of a sidecar's JSON (see meta.h).
 */
#include "cache/meta.h"
#include "cache/key.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct scanner {
  const char *p, *end;
} scanner;

static void skip_space(scanner *s) {
  while (s->p < s->end &&
         (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
    s->p++;
}

/* Appends one code point as UTF-8 (surrogate halves are kept as they come:
 * names and keys are ASCII, this only has to stay in bounds). */
static void put_utf8(char *out, size_t outlen, size_t *n, unsigned cp) {
  unsigned char b[4];
  int k;
  if (cp < 0x80) {
    b[0] = (unsigned char)cp, k = 1;
  } else if (cp < 0x800) {
    b[0] = (unsigned char)(0xc0 | cp >> 6);
    b[1] = (unsigned char)(0x80 | (cp & 0x3f)), k = 2;
  } else {
    b[0] = (unsigned char)(0xe0 | cp >> 12);
    b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    b[2] = (unsigned char)(0x80 | (cp & 0x3f)), k = 3;
  }
  for (int i = 0; i < k; i++)
    if (out && *n + 1 < outlen)
      out[(*n)++] = (char)b[i];
}

static int escape_char(char c, char *decoded) {
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  const char *hit = strchr(from, c);
  if (!hit || !c)
    return -1;
  *decoded = to[hit - from];
  return 0;
}

/* Scans a string starting at the opening quote; decodes it into out when out
 * is not NULL. Returns 0 with s->p after the closing quote, or -1. */
static int scan_string(scanner *s, char *out, size_t outlen) {
  size_t n = 0;
  if (s->p >= s->end || *s->p != '"')
    return -1;
  s->p++;
  while (s->p < s->end && *s->p != '"') {
    char c = *s->p++;
    if (c == '\\') {
      if (s->p >= s->end)
        return -1;
      char e = *s->p++;
      if (e == 'u') {
        unsigned cp = 0;
        for (int i = 0; i < 4; i++) {
          int d = s->p < s->end ? fjc_hex_value(*s->p++) : -1;
          if (d < 0)
            return -1;
          cp = cp << 4 | (unsigned)d;
        }
        put_utf8(out, outlen, &n, cp);
        continue;
      }
      if (escape_char(e, &c))
        return -1;
    }
    if (out && n + 1 < outlen)
      out[n++] = c;
  }
  if (s->p >= s->end)
    return -1;
  s->p++;
  if (out && outlen)
    out[n] = '\0';
  return 0;
}

/* Skips any value: a string, or everything up to the matching bracket, or a
 * bare token (number, true, false, null). */
static int skip_value(scanner *s) {
  int depth = 0;
  skip_space(s);
  if (s->p < s->end && *s->p == '"')
    return scan_string(s, NULL, 0);
  while (s->p < s->end) {
    char c = *s->p;
    if (c == '"') {
      if (scan_string(s, NULL, 0))
        return -1;
      continue;
    }
    if (c == '{' || c == '[')
      depth++;
    else if (c == '}' || c == ']') {
      if (depth == 0)
        return 0; /* the end of the enclosing object */
      depth--;
    } else if (c == ',' && depth == 0)
      return 0;
    s->p++;
  }
  return depth == 0 ? 0 : -1;
}

int fjc_meta_string(const char *json, size_t len, const char *field, char *out,
                    size_t outlen) {
  scanner s = {json, json + len};
  char name[128];
  if (out && outlen)
    out[0] = '\0';
  skip_space(&s);
  if (s.p >= s.end || *s.p++ != '{')
    return -1;
  for (;;) {
    skip_space(&s);
    if (s.p >= s.end || *s.p == '}')
      return -1;
    if (scan_string(&s, name, sizeof name))
      return -1;
    skip_space(&s);
    if (s.p >= s.end || *s.p++ != ':')
      return -1;
    skip_space(&s);
    if (strcmp(name, field) == 0)
      return s.p < s.end && *s.p == '"' ? scan_string(&s, out, outlen) : -1;
    if (skip_value(&s))
      return -1;
    skip_space(&s);
    if (s.p >= s.end || *s.p != ',')
      return -1;
    s.p++;
  }
}

int fjc_meta_fd_string(int fd, size_t max_bytes, const char *field,
                       char *out, size_t outlen) {
  char *buf;
  ssize_t n;
  int rc;
  if (out && outlen)
    out[0] = '\0';
  buf = malloc(max_bytes ? max_bytes : 1);
  if (!buf)
    return -1;
  do
    n = pread(fd, buf, max_bytes, 0);
  while (n < 0 && errno == EINTR);
  rc = n < 0 ? -1 : fjc_meta_string(buf, (size_t)n, field, out, outlen);
  free(buf);
  return rc;
}

int fjc_meta_file_string(const char *path, size_t max_bytes, const char *field,
                         char *out, size_t outlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC), rc;
  if (out && outlen)
    out[0] = '\0';
  if (fd < 0)
    return -1;
  rc = fjc_meta_fd_string(fd, max_bytes, field, out, outlen);
  close(fd);
  return rc;
}
