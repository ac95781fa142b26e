/*
 * cli/npy.c: .npy reading and writing (see cli/npy.h).
 *
 * The header is a Python dict literal written by NumPy, e.g.
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * with exactly those three keys, each once, as NumPy itself requires; the
 * data that follows must be exactly what the shape declares.
 */
#include "cli/npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_MAX_HEADER (1 << 20)

const char *npy_dtype_descr(npy_dtype dtype) {
  return dtype == NPY_I32 ? "<i4" : dtype == NPY_F64 ? "<f8" : "<f4";
}

size_t npy_dtype_size(npy_dtype dtype) { return dtype == NPY_F64 ? 8 : 4; }

static int set_error(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int set_error(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

static void skip_space(const char **p) {
  while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r') (*p)++;
}

/* A quoted string ('...' or "...") into out; 0, or -1 when *p is not one
 * that fits. */
static int parse_quoted(const char **p, char *out, size_t cap) {
  char q = **p;
  if (q != '\'' && q != '"') return -1;
  const char *end = strchr(*p + 1, q);
  if (!end || (size_t)(end - *p - 1) >= cap) return -1;
  memcpy(out, *p + 1, (size_t)(end - *p - 1));
  out[end - *p - 1] = '\0';
  *p = end + 1;
  return 0;
}

static int parse_descr(const char *path, const char **p, npy_dtype *dtype,
                       char *err, size_t errlen) {
  char descr[16];
  if (parse_quoted(p, descr, sizeof descr) != 0)
    return set_error(err, errlen,
                     "%s: 'descr' is not a plain dtype string (need float32 "
                     "'<f4', int32 '<i4' or float64 '<f8')", path);
  if (!strcmp(descr, "<f4"))
    *dtype = NPY_F32;
  else if (!strcmp(descr, "<i4"))
    *dtype = NPY_I32;
  else if (!strcmp(descr, "<f8"))
    *dtype = NPY_F64;
  else
    return set_error(err, errlen,
                "%s: unsupported dtype '%s' (need float32 '<f4', int32 "
                "'<i4' or float64 '<f8')",
                path, descr);
  return 0;
}

static int parse_order(const char *path, const char **p, char *err,
                       size_t errlen) {
  if (!strncmp(*p, "True", 4))
    return set_error(err, errlen,
                "%s: Fortran-ordered arrays are not supported; save a C-order "
                "array (numpy.ascontiguousarray)",
                path);
  if (strncmp(*p, "False", 5))
    return set_error(err, errlen, "%s: malformed 'fortran_order'", path);
  *p += 5;
  return 0;
}

static int parse_shape(const char *path, const char **pp, npy_array *a,
                       char *err, size_t errlen) {
  const char *p = *pp;
  if (*p != '(')
    return set_error(err, errlen, "%s: 'shape' is not a tuple", path);
  p++;
  a->ndim = 0;
  a->count = 1;
  for (;;) {
    while (*p == ' ' || *p == ',') p++;
    if (*p == ')') break;
    char *end;
    errno = 0;
    long long d = strtoll(p, &end, 10);
    if (end == p || errno || d < 0)
      return set_error(err, errlen, "%s: malformed 'shape'", path);
    if (a->ndim == NPY_MAX_DIMS)
      return set_error(err, errlen, "%s: more than %d dimensions", path,
                  NPY_MAX_DIMS);
    if (d > 0 && a->count > (SIZE_MAX / 8) / (size_t)d)
      return set_error(err, errlen, "%s: shape too large", path);
    a->shape[a->ndim++] = d;
    a->count *= (size_t)d;
    p = end;
  }
  *pp = p + 1;
  return 0;
}

/* The header dict, e.g. {'descr': '<f4', 'fortran_order': False, 'shape':
 * (3, 4), }: exactly the three keys NumPy writes, each once (NumPy takes
 * the last of a repeated key, so a reader taking another would read another
 * array), then only the padding. */
static int parse_dict(const char *path, const char *hdr, npy_array *a,
                      char *err, size_t errlen) {
  static const char *const keys[3] = {"descr", "fortran_order", "shape"};
  int seen[3] = {0, 0, 0};
  const char *p = hdr;
  skip_space(&p);
  if (*p++ != '{')
    return set_error(err, errlen, "%s: .npy header is not a dict", path);
  for (;;) {
    char key[32];
    int k = -1, rc = 0;
    skip_space(&p);
    if (*p == '}') break;
    if (parse_quoted(&p, key, sizeof key) != 0)
      return set_error(err, errlen, "%s: malformed .npy header", path);
    skip_space(&p);
    if (*p++ != ':')
      return set_error(err, errlen, "%s: malformed .npy header", path);
    skip_space(&p);
    for (int i = 0; i < 3; i++)
      if (!strcmp(key, keys[i])) k = i;
    if (k < 0)
      return set_error(err, errlen,
                       "%s: unexpected key '%s' in the .npy header (NumPy "
                       "writes only descr, fortran_order and shape)",
                       path, key);
    if (seen[k]++)
      return set_error(err, errlen, "%s: '%s' appears twice in the .npy header",
                       path, key);
    if (k == 0) rc = parse_descr(path, &p, &a->dtype, err, errlen);
    if (k == 1) rc = parse_order(path, &p, err, errlen);
    if (k == 2) rc = parse_shape(path, &p, a, err, errlen);
    if (rc) return rc;
    skip_space(&p);
    if (*p == ',') {
      p++;
      continue;
    }
    if (*p != '}')
      return set_error(err, errlen, "%s: malformed .npy header", path);
  }
  p++;
  skip_space(&p);
  if (*p)
    return set_error(err, errlen, "%s: junk after the .npy header dict", path);
  for (int i = 0; i < 3; i++)
    if (!seen[i])
      return set_error(err, errlen, "%s: .npy header has no '%s'", path,
                       keys[i]);
  return 0;
}

/* Reads magic, version and the header dict (NUL-terminated, malloc'd). */
static int read_header(FILE *f, const char *path, char **hdr, char *err,
                       size_t errlen) {
  unsigned char pre[12];
  size_t len;
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN))
    return set_error(err, errlen, "%s: not a .npy file (bad magic)", path);
  if (pre[6] == 1) {
    len = pre[8] | (size_t)pre[9] << 8;
  } else if (pre[6] == 2 || pre[6] == 3) {
    if (fread(pre + 10, 1, 2, f) != 2)
      return set_error(err, errlen, "%s: truncated .npy header", path);
    len = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
          (size_t)pre[11] << 24;
  } else {
    return set_error(err, errlen, "%s: unsupported .npy version %d.%d", path,
                pre[6], pre[7]);
  }
  if (len > NPY_MAX_HEADER)
    return set_error(err, errlen, "%s: .npy header too large", path);
  *hdr = malloc(len + 1);
  if (!*hdr) return set_error(err, errlen, "%s: out of memory", path);
  if (fread(*hdr, 1, len, f) != len) {
    free(*hdr);
    *hdr = NULL;
    return set_error(err, errlen, "%s: truncated .npy header", path);
  }
  (*hdr)[len] = '\0';
  return 0;
}

int npy_read(const char *path, npy_array *out, char *err, size_t errlen) {
  FILE *f = NULL;
  char *hdr = NULL;
  npy_array a;
  int rc = -1;
  memset(&a, 0, sizeof a);
  memset(out, 0, sizeof *out);
  f = fopen(path, "rb");
  if (!f) {
    set_error(err, errlen, "%s: %s", path, strerror(errno));
    goto fail;
  }
  if (read_header(f, path, &hdr, err, errlen) ||
      parse_dict(path, hdr, &a, err, errlen))
    goto fail;
  /* The file must hold exactly the data its shape declares: checked before
   * allocating, so a small file cannot ask for a huge buffer. */
  size_t bytes = a.count * npy_dtype_size(a.dtype);
  struct stat st;
  long at = ftell(f);
  if (at < 0 || fstat(fileno(f), &st) != 0) {
    set_error(err, errlen, "%s: %s", path, strerror(errno));
    goto fail;
  }
  uint64_t present = st.st_size > at ? (uint64_t)(st.st_size - at) : 0;
  if (present < bytes) {
    set_error(err, errlen,
              "%s: file shorter than its shape says (%zu data bytes "
              "declared, %llu present)",
              path, bytes, (unsigned long long)present);
    goto fail;
  }
  if (present > bytes) {
    set_error(err, errlen,
              "%s: %llu bytes after the data its shape declares (%zu bytes)",
              path, (unsigned long long)(present - bytes), bytes);
    goto fail;
  }
  a.data = malloc(bytes ? bytes : 1);
  if (!a.data) {
    set_error(err, errlen, "%s: out of memory for %zu bytes", path, bytes);
    goto fail;
  }
  if (fread(a.data, 1, bytes, f) != bytes) {
    set_error(err, errlen, "%s: file shorter than its shape says (%zu data bytes)",
         path, bytes);
    goto fail;
  }
  *out = a;
  a.data = NULL;
  rc = 0;
fail:
  free(a.data);
  free(hdr);
  if (f) fclose(f);
  return rc;
}

/* The header dict padded with spaces so the data starts at a multiple of
 * 64 bytes, as NumPy writes it. */
static size_t format_header(char *buf, size_t cap, npy_dtype dtype, int ndim,
                            const int64_t *shape) {
  int n = snprintf(buf, cap, "{'descr': '%s', 'fortran_order': False, "
                   "'shape': (", npy_dtype_descr(dtype));
  for (int i = 0; i < ndim; i++)
    n += snprintf(buf + n, cap - (size_t)n, "%lld%s", (long long)shape[i],
                  ndim == 1 || i + 1 < ndim ? ", " : "");
  n += snprintf(buf + n, cap - (size_t)n, "), }");
  size_t total = 10 + (size_t)n + 1;
  size_t pad = (64 - total % 64) % 64;
  memset(buf + n, ' ', pad);
  buf[n + pad] = '\n';
  return (size_t)n + pad + 1;
}

int npy_write(const char *path, npy_dtype dtype, const void *data, int ndim,
              const int64_t *shape, char *err, size_t errlen) {
  char hdr[512];
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
  size_t count = 1;
  FILE *f = NULL;
  int rc = -1;
  if (ndim < 0 || ndim > NPY_MAX_DIMS || dtype == NPY_F64)
    return set_error(err, errlen, "%s: cannot write this array", path);
  for (int i = 0; i < ndim; i++) count *= (size_t)shape[i];
  size_t len = format_header(hdr, sizeof hdr, dtype, ndim, shape);
  pre[8] = (unsigned char)(len & 0xff);
  pre[9] = (unsigned char)(len >> 8);
  f = fopen(path, "wb");
  if (!f) {
    set_error(err, errlen, "%s: %s", path, strerror(errno));
    goto fail;
  }
  if (fwrite(pre, 1, 10, f) != 10 || fwrite(hdr, 1, len, f) != len ||
      fwrite(data, npy_dtype_size(dtype), count, f) != count) {
    set_error(err, errlen, "%s: write failed: %s", path, strerror(errno));
    goto fail;
  }
  rc = 0;
fail:
  if (f && fclose(f) != 0 && rc == 0)
    rc = set_error(err, errlen, "%s: write failed: %s", path, strerror(errno));
  return rc;
}

float *npy_to_f32(const npy_array *a) {
  float *r = malloc(sizeof(float) * (a->count ? a->count : 1));
  if (!r) return NULL;
  for (size_t i = 0; i < a->count; i++) {
    if (a->dtype == NPY_F32)
      r[i] = ((const float *)a->data)[i];
    else if (a->dtype == NPY_I32)
      r[i] = (float)((const int32_t *)a->data)[i];
    else
      r[i] = (float)((const double *)a->data)[i];
  }
  return r;
}

void npy_free(npy_array *a) {
  if (!a) return;
  free(a->data);
  a->data = NULL;
  a->count = 0;
}
