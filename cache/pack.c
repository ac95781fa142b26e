/*
 * cache/pack.c: writing and reading .fjpack files (see pack.h for the
 * layout).
 */
#include "cache/pack.h"

#include "cache/le.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/fileio.h"
#include "cache/store.h"
#include "util/errmsg.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#define PACK_MAGIC "FJPACK01"
#define PACK_FORMAT 1u
#define PACK_HEADER_SIZE 64u
#define PACK_RECORD_SIZE 256u
#define PACK_BLOB_ALIGN 64u
/* Far above any real deployment; bounds what a corrupt count can claim. */
#define PACK_MAX_ENTRIES (1u << 20)

/* Record field offsets. */
enum {
  REC_SOURCE_KEY = 0,
  REC_FULL_KEY = 16,
  REC_ARCH = 32,
  REC_NVRTC = 64,
  REC_NAME = 80,
  REC_OFFSET = 208,
  REC_SIZE = 216,
  REC_CHECKSUM = 224,
};

/* ---- writer ----------------------------------------------------------- */

struct fjc_pack_writer {
  char *path, *tmp;
  int fd;
  uint64_t offset;       /* where the next blob goes */
  unsigned char *index;  /* count records */
  int count, cap;
};

void fjc_pack_writer_abort(fjc_pack_writer *w) {
  if (!w)
    return;
  if (w->fd >= 0)
    close(w->fd);
  if (w->tmp)
    unlink(w->tmp);
  free(w->tmp);
  free(w->path);
  free(w->index);
  free(w);
}

fj_status fjc_pack_writer_open(const char *path, fjc_pack_writer **out,
                               char *err, size_t errlen) {
  unsigned char zero[PACK_HEADER_SIZE] = {0};
  fjc_pack_writer *w = NULL;
  fj_status st = FJ_ENOMEM;
  if (!path || !out) {
    fju_errmsg(err, errlen, "fjc_pack_writer_open: NULL argument");
    return FJ_EINVAL;
  }
  *out = NULL;
  w = calloc(1, sizeof *w);
  if (w)
    w->fd = -1;
  if (!w || !(w->path = strdup(path)) ||
      asprintf(&w->tmp, "%s.tmp.XXXXXX", path) < 0) {
    if (w)
      w->tmp = NULL;
    fju_errmsg(err, errlen, "out of memory starting pack %s", path);
    goto fail;
  }
  w->fd = mkstemp(w->tmp);
  if (w->fd < 0) {
    st = FJ_EIO;
    fju_errmsg(err, errlen, "cannot create pack %s: %s", path, strerror(errno));
    free(w->tmp);
    w->tmp = NULL;
    goto fail;
  }
  fchmod(w->fd, 0644);
  /* The header is written last, once the index is known. */
  if (fjc_write_all(w->fd, zero, sizeof zero)) {
    st = FJ_EIO;
    fju_errmsg(err, errlen, "cannot write %s: %s", w->tmp, strerror(errno));
    goto fail;
  }
  w->offset = PACK_HEADER_SIZE;
  *out = w;
  return FJ_OK;
fail:
  fjc_pack_writer_abort(w);
  return st;
}

int fjc_pack_writer_count(const fjc_pack_writer *w) {
  return w ? w->count : 0;
}

static int has_entry(const fjc_pack_writer *w, const fjc_pack_entry *e) {
  for (int i = 0; i < w->count; i++) {
    const unsigned char *r = w->index + (size_t)i * PACK_RECORD_SIZE;
    if (memcmp(r + REC_FULL_KEY, e->full_key.bytes, 16) == 0 &&
        strncmp((const char *)r + REC_ARCH, e->arch, FJC_PACK_ARCH_MAX) == 0)
      return 1;
  }
  return 0;
}

/* NUL-padded copy; 0, or -1 when text leaves no room for the NUL. */
static int put_text(unsigned char *dst, size_t cap, const char *text) {
  size_t n = strlen(text);
  if (n >= cap)
    return -1;
  memset(dst, 0, cap);
  memcpy(dst, text, n);
  return 0;
}

static fj_status check_entry(const fjc_pack_entry *e, char *err,
                             size_t errlen) {
  if (!e->data || e->size == 0) {
    fju_errmsg(err, errlen, "pack entry %s has no cubin", e->name);
    return FJ_EINVAL;
  }
  if (!fjc_arch_is_valid(e->arch)) {
    fju_errmsg(err, errlen, "pack entry %s: bad arch '%s'", e->name, e->arch);
    return FJ_EINVAL;
  }
  if (strnlen(e->name, sizeof e->name) >= sizeof e->name ||
      strnlen(e->nvrtc, sizeof e->nvrtc) >= sizeof e->nvrtc) {
    fju_errmsg(err, errlen, "pack entry: name or NVRTC version too long");
    return FJ_EINVAL;
  }
  return FJ_OK;
}

static unsigned char *new_record(fjc_pack_writer *w) {
  if (w->count == w->cap) {
    int cap = w->cap ? 2 * w->cap : 32;
    unsigned char *grown = realloc(w->index, (size_t)cap * PACK_RECORD_SIZE);
    if (!grown)
      return NULL;
    w->index = grown;
    w->cap = cap;
  }
  unsigned char *r = w->index + (size_t)w->count * PACK_RECORD_SIZE;
  memset(r, 0, PACK_RECORD_SIZE);
  return r;
}

/* Pads the file to the next blob boundary. */
static int align_blob(fjc_pack_writer *w) {
  static const unsigned char zero[PACK_BLOB_ALIGN];
  size_t pad = (size_t)((PACK_BLOB_ALIGN - w->offset % PACK_BLOB_ALIGN) %
                        PACK_BLOB_ALIGN);
  if (pad && fjc_write_all(w->fd, zero, pad))
    return -1;
  w->offset += pad;
  return 0;
}

fj_status fjc_pack_writer_add(fjc_pack_writer *w, const fjc_pack_entry *e,
                              char *err, size_t errlen) {
  unsigned char *r;
  fj_status st;
  if (!w || !e) {
    fju_errmsg(err, errlen, "fjc_pack_writer_add: NULL argument");
    return FJ_EINVAL;
  }
  if ((st = check_entry(e, err, errlen)) != FJ_OK)
    return st;
  if (has_entry(w, e))
    return FJ_OK;
  if (w->count >= (int)PACK_MAX_ENTRIES) {
    fju_errmsg(err, errlen, "a pack holds at most %u entries",
               PACK_MAX_ENTRIES);
    return FJ_EINVAL;
  }
  if (!(r = new_record(w))) {
    fju_errmsg(err, errlen, "out of memory adding to pack %s", w->path);
    return FJ_ENOMEM;
  }
  if (align_blob(w) || fjc_write_all(w->fd, e->data, e->size)) {
    fju_errmsg(err, errlen, "cannot write %s: %s", w->tmp, strerror(errno));
    return FJ_EIO;
  }
  memcpy(r + REC_SOURCE_KEY, e->source_key.bytes, 16);
  memcpy(r + REC_FULL_KEY, e->full_key.bytes, 16);
  put_text(r + REC_ARCH, FJC_PACK_ARCH_MAX, e->arch);
  put_text(r + REC_NVRTC, FJC_PACK_NVRTC_MAX, e->nvrtc);
  put_text(r + REC_NAME, FJC_PACK_NAME_MAX, e->name);
  fjc_put_le64(r + REC_OFFSET, w->offset);
  fjc_put_le64(r + REC_SIZE, (uint64_t)e->size);
  fjc_put_le64(r + REC_CHECKSUM, XXH3_64bits(e->data, e->size));
  w->offset += e->size;
  w->count++;
  return FJ_OK;
}

static void encode_header(unsigned char *h, uint64_t count,
                          uint64_t index_offset, uint64_t index_size,
                          uint64_t index_sum) {
  memset(h, 0, PACK_HEADER_SIZE);
  memcpy(h, PACK_MAGIC, 8);
  fjc_put_le32(h + 8, PACK_FORMAT);
  fjc_put_le32(h + 12, PACK_HEADER_SIZE);
  fjc_put_le64(h + 16, count);
  fjc_put_le64(h + 24, index_offset);
  fjc_put_le64(h + 32, index_size);
  fjc_put_le64(h + 40, index_sum);
  fjc_put_le64(h + 48, index_offset + index_size);
  fjc_put_le64(h + 56, XXH3_64bits(h, 56));
}

static void sync_parent_dir(const char *path) {
  char *dir = strdup(path);
  char *slash = dir ? strrchr(dir, '/') : NULL;
  if (!dir)
    return;
  if (slash)
    *(slash == dir ? slash + 1 : slash) = '\0';
  fjc_sync_dir(slash ? dir : ".");
  free(dir);
}

fj_status fjc_pack_writer_finish(fjc_pack_writer *w, char *err,
                                 size_t errlen) {
  unsigned char header[PACK_HEADER_SIZE];
  size_t index_size;
  const char *what = "write";
  fj_status st = FJ_EIO;
  if (!w) {
    fju_errmsg(err, errlen, "fjc_pack_writer_finish: NULL writer");
    return FJ_EINVAL;
  }
  index_size = (size_t)w->count * PACK_RECORD_SIZE;
  if (align_blob(w) || (index_size && fjc_write_all(w->fd, w->index, index_size)))
    goto fail;
  encode_header(header, (uint64_t)w->count, w->offset, index_size,
                XXH3_64bits(w->index ? (const void *)w->index : "", index_size));
  if (pwrite(w->fd, header, sizeof header, 0) != (ssize_t)sizeof header)
    goto fail;
  what = "fsync";
  if (fsync(w->fd) != 0)
    goto fail;
  what = "close";
  int rc = close(w->fd);
  w->fd = -1;
  if (rc != 0)
    goto fail;
  what = "rename";
  if (rename(w->tmp, w->path) != 0)
    goto fail;
  sync_parent_dir(w->path);
  free(w->tmp);
  w->tmp = NULL; /* published: nothing for abort to unlink */
  st = FJ_OK;
  fjc_pack_writer_abort(w);
  return st;
fail:
  fju_errmsg(err, errlen, "cannot %s pack %s: %s", what, w->path,
             strerror(errno));
  fjc_pack_writer_abort(w);
  return st;
}

/* ---- reader ----------------------------------------------------------- */

/* The header and the index live in memory from the mount on; blobs are
 * read with pread when looked up. Nothing maps the file, so a file changed
 * under a mount (overwritten in place, truncated) can only make reads
 * short or bytes wrong: a miss with a warning, never a fault. */
struct fjc_pack {
  char *path;
  int fd;
  unsigned char header[PACK_HEADER_SIZE]; /* as read at mount time */
  uint64_t file_size;
  unsigned char *index; /* count records */
  int count;
  uint64_t blob_end; /* the index offset: blobs live in [64, blob_end) */
  fj_log_fn log;
  void *log_user;
};

static void pack_log(const fjc_pack *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void pack_log(const fjc_pack *p, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  if (!p->log)
    return;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  p->log(p->log_user, FJ_LOG_WARN, msg);
}

static const unsigned char *record(const fjc_pack *p, int i) {
  return p->index + (size_t)i * PACK_RECORD_SIZE;
}

/* Validates the header against the file size; NULL or why not. Sets the
 * index's place and count. */
static const char *check_header(fjc_pack *p) {
  const unsigned char *h = p->header;
  if (memcmp(h, PACK_MAGIC, 8) != 0)
    return "not a flexjit pack (bad magic)";
  if (fjc_get_le32(h + 8) != PACK_FORMAT)
    return "unsupported pack format version";
  if (fjc_get_le32(h + 12) != PACK_HEADER_SIZE)
    return "bad header size";
  if (fjc_get_le64(h + 56) != XXH3_64bits(h, 56))
    return "header checksum mismatch";
  uint64_t count = fjc_get_le64(h + 16), off = fjc_get_le64(h + 24),
           size = fjc_get_le64(h + 32), total = fjc_get_le64(h + 48);
  if (total != p->file_size)
    return total > p->file_size ? "truncated" : "trailing bytes after the index";
  if (count > PACK_MAX_ENTRIES || size != count * PACK_RECORD_SIZE)
    return "implausible entry count";
  if (off < PACK_HEADER_SIZE || off > p->file_size ||
      p->file_size - off != size)
    return "index out of bounds";
  p->count = (int)count;
  p->blob_end = off;
  return NULL;
}

/* Reads the index (after check_header) and checks its checksum. */
static const char *read_index(fjc_pack *p) {
  size_t size = (size_t)p->count * PACK_RECORD_SIZE;
  if (!(p->index = malloc(size ? size : 1)))
    return "out of memory for the index";
  if (size && fjc_pread_all(p->fd, p->index, size, p->blob_end) != 0)
    return "cannot read the index";
  if (XXH3_64bits(p->index, size) != fjc_get_le64(p->header + 40))
    return "index checksum mismatch";
  return NULL;
}

static int text_ok(const unsigned char *s, size_t cap) {
  return memchr(s, '\0', cap) != NULL;
}

/* Validates record i: terminated strings and a blob inside the blob area. */
static const char *check_record(const fjc_pack *p, int i) {
  const unsigned char *r = record(p, i);
  uint64_t off = fjc_get_le64(r + REC_OFFSET), size = fjc_get_le64(r + REC_SIZE);
  if (!text_ok(r + REC_ARCH, FJC_PACK_ARCH_MAX) ||
      !text_ok(r + REC_NVRTC, FJC_PACK_NVRTC_MAX) ||
      !text_ok(r + REC_NAME, FJC_PACK_NAME_MAX))
    return "unterminated text in the index";
  if (!fjc_arch_is_valid((const char *)r + REC_ARCH))
    return "bad arch in the index";
  if (size == 0 || off < PACK_HEADER_SIZE || off > p->blob_end ||
      p->blob_end - off < size)
    return "blob out of bounds";
  return NULL;
}

fj_status fjc_pack_open(const char *path, fjc_pack **out, char *err,
                        size_t errlen) {
  struct stat st;
  fjc_pack *p = NULL;
  const char *why;
  fj_status status = FJ_EIO;
  if (!path || !out) {
    fju_errmsg(err, errlen, "fjc_pack_open: NULL argument");
    return FJ_EINVAL;
  }
  *out = NULL;
  if ((p = calloc(1, sizeof *p)))
    p->fd = -1;
  if (!p || !(p->path = strdup(path))) {
    status = FJ_ENOMEM;
    fju_errmsg(err, errlen, "out of memory opening pack %s", path);
    goto fail;
  }
  p->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (p->fd < 0 || fstat(p->fd, &st) != 0) {
    fju_errmsg(err, errlen, "cannot open pack %s: %s", path, strerror(errno));
    goto fail;
  }
  status = FJ_ECACHE;
  p->file_size = (uint64_t)st.st_size;
  if (!S_ISREG(st.st_mode)) {
    fju_errmsg(err, errlen, "pack %s is not a regular file", path);
    goto fail;
  }
  if (p->file_size < PACK_HEADER_SIZE ||
      fjc_pread_all(p->fd, p->header, PACK_HEADER_SIZE, 0) != 0) {
    fju_errmsg(err, errlen,
               "pack %s is corrupt: file too short for a pack header", path);
    goto fail;
  }
  if ((why = check_header(p)) != NULL || (why = read_index(p)) != NULL) {
    fju_errmsg(err, errlen, "pack %s is corrupt: %s", path, why);
    goto fail;
  }
  for (int i = 0; i < p->count; i++)
    if ((why = check_record(p, i)) != NULL) {
      fju_errmsg(err, errlen, "pack %s is corrupt: entry %d: %s", path, i, why);
      goto fail;
    }
  *out = p;
  return FJ_OK;
fail:
  fjc_pack_close(p);
  return status;
}

void fjc_pack_close(fjc_pack *pack) {
  if (!pack)
    return;
  if (pack->fd >= 0)
    close(pack->fd);
  free(pack->index);
  free(pack->path);
  free(pack);
}

void fjc_pack_set_log(fjc_pack *pack, fj_log_fn log, void *log_user) {
  if (!pack)
    return;
  pack->log = log;
  pack->log_user = log_user;
}

const char *fjc_pack_path(const fjc_pack *pack) {
  return pack ? pack->path : "";
}

int fjc_pack_count(const fjc_pack *pack) { return pack ? pack->count : 0; }

fj_status fjc_pack_entry_at(const fjc_pack *pack, int i, fjc_pack_entry *out) {
  if (!pack || !out || i < 0 || i >= pack->count)
    return FJ_EINVAL;
  const unsigned char *r = record(pack, i);
  fjc_key_from_bytes(r + REC_SOURCE_KEY, &out->source_key);
  fjc_key_from_bytes(r + REC_FULL_KEY, &out->full_key);
  snprintf(out->arch, sizeof out->arch, "%s", (const char *)r + REC_ARCH);
  snprintf(out->nvrtc, sizeof out->nvrtc, "%s", (const char *)r + REC_NVRTC);
  snprintf(out->name, sizeof out->name, "%s", (const char *)r + REC_NAME);
  out->data = NULL;
  out->size = (size_t)fjc_get_le64(r + REC_SIZE);
  out->offset = fjc_get_le64(r + REC_OFFSET);
  return FJ_OK;
}

/* Reads blob i into *data (malloc'd) and verifies it; NULL, or why not. A
 * header that differs from the mounted one means the file was replaced in
 * place: nothing in it can be trusted. */
static const char *read_blob(const fjc_pack *p, int i, void **data) {
  const unsigned char *r = record(p, i);
  uint64_t off = fjc_get_le64(r + REC_OFFSET);
  size_t size = (size_t)fjc_get_le64(r + REC_SIZE);
  unsigned char now[PACK_HEADER_SIZE];
  unsigned char *blob;
  int rc;
  *data = NULL;
  rc = fjc_pread_all(p->fd, now, sizeof now, 0);
  if (rc == FJC_SHORT_READ)
    return "the file was truncated after it was mounted";
  if (rc != 0)
    return "cannot read the file";
  if (memcmp(now, p->header, sizeof now) != 0)
    return "the file was overwritten after it was mounted (replace packs by "
           "rename, not in place)";
  if (!(blob = malloc(size)))
    return "out of memory";
  rc = fjc_pread_all(p->fd, blob, size, off);
  if (rc != 0 || XXH3_64bits(blob, size) != fjc_get_le64(r + REC_CHECKSUM)) {
    free(blob);
    return rc == FJC_SHORT_READ ? "the file was truncated after it was mounted"
           : rc != 0            ? "cannot read the file"
                                : "checksum mismatch";
  }
  *data = blob;
  return NULL;
}

const char *fjc_pack_check_blob(const fjc_pack *pack, int i) {
  void *data = NULL;
  const char *why;
  if (!pack || i < 0 || i >= pack->count)
    return "no such entry";
  why = read_blob(pack, i, &data);
  free(data);
  return why;
}

/* One dot-separated part of an NVRTC version against another: numbers
 * (digits only) by value, and below every other part; other parts by their
 * bytes. */
static int version_part_cmp(const char *a, size_t na, const char *b, size_t nb) {
  int da = na > 0 && strspn(a, "0123456789") >= na;
  int db = nb > 0 && strspn(b, "0123456789") >= nb;
  if (da != db)
    return da ? -1 : 1;
  if (da) { /* by value, of any length: leading zeros aside, longer is larger */
    for (; na > 1 && *a == '0'; a++, na--) {}
    for (; nb > 1 && *b == '0'; b++, nb--) {}
    if (na != nb)
      return na < nb ? -1 : 1;
  }
  int c = memcmp(a, b, na < nb ? na : nb);
  if (c != 0)
    return c < 0 ? -1 : 1;
  return na < nb ? -1 : na > nb;
}

/* NVRTC versions compare part by part ("12.10" > "12.8", "13" < "13.0"),
 * then, where the parts are equal ("13.01" and "13.1"), by their bytes. A
 * total order for any text, as fjc_pack_find's walk down the candidates
 * needs (whatever an index holds). */
static int version_cmp(const char *a, const char *b) {
  const char *pa = a, *pb = b;
  for (;;) {
    size_t na = strcspn(pa, "."), nb = strcspn(pb, ".");
    int c = version_part_cmp(pa, na, pb, nb);
    if (c != 0)
      return c;
    int more_a = pa[na] == '.', more_b = pb[nb] == '.';
    if (more_a != more_b)
      return more_a ? 1 : -1;
    if (!more_a)
      break;
    pa += na + 1;
    pb += nb + 1;
  }
  int c = strcmp(a, b);
  return c < 0 ? -1 : c > 0;
}

static int record_matches(const unsigned char *r, const char *arch,
                          const fjc_key *full_key, const fjc_key *source_key) {
  if (strcmp((const char *)r + REC_ARCH, arch) != 0)
    return 0;
  if (full_key)
    return memcmp(r + REC_FULL_KEY, full_key->bytes, 16) == 0;
  return source_key && memcmp(r + REC_SOURCE_KEY, source_key->bytes, 16) == 0;
}

/* Index of the best match (highest NVRTC version, then highest index) that
 * ranks below the one tried before (floor_index >= 0), or -1: a corrupt
 * blob makes fjc_pack_find move on to the next best. */
static int best_match(const fjc_pack *p, const char *arch,
                      const fjc_key *full_key, const fjc_key *source_key,
                      const char *floor_nvrtc, int floor_index) {
  int best = -1;
  for (int i = 0; i < p->count; i++) {
    const unsigned char *r = record(p, i);
    if (!record_matches(r, arch, full_key, source_key))
      continue;
    const char *v = (const char *)r + REC_NVRTC;
    /* Candidates strictly below the last tried one, in (version, index)
     * order, so each is tried once. */
    if (floor_index >= 0) {
      int c = version_cmp(v, floor_nvrtc);
      if (c > 0 || (c == 0 && i >= floor_index))
        continue;
    }
    if (best < 0) {
      best = i;
      continue;
    }
    int c = version_cmp(v, (const char *)record(p, best) + REC_NVRTC);
    if (c > 0 || (c == 0 && i > best))
      best = i;
  }
  return best;
}

fj_status fjc_pack_find(const fjc_pack *pack, const char *arch,
                        const fjc_key *full_key, const fjc_key *source_key,
                        void **data, size_t *size, const char **name) {
  const char *floor_nvrtc = "";
  int i = -1;
  if (!pack || !arch || !data || !size || (!full_key && !source_key))
    return FJ_EINVAL;
  *data = NULL;
  *size = 0;
  if (name)
    *name = NULL;
  for (;;) {
    i = best_match(pack, arch, full_key, source_key, floor_nvrtc, i);
    if (i < 0)
      return FJ_ENOTFOUND;
    const unsigned char *r = record(pack, i);
    floor_nvrtc = (const char *)r + REC_NVRTC;
    const char *why = read_blob(pack, i, data);
    if (why) {
      pack_log(pack,
               "pack %s: ignoring entry %s (key %s, %s): %s",
               pack->path, (const char *)r + REC_NAME,
               full_key ? full_key->hex : source_key->hex,
               (const char *)r + REC_ARCH, why);
      continue;
    }
    *size = (size_t)fjc_get_le64(r + REC_SIZE);
    if (name)
      *name = (const char *)r + REC_NAME;
    return FJ_OK;
  }
}
