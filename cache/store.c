/*
 * cache/store.c: the on-disk cubin store (see store.h for the layout and the
 * entry format).
 */
#include "cache/le.h"
#include "cache/store.h"

#include "cache/fileio.h"
#include "util/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define ENTRY_MAGIC "FJCUBIN1"
#define ENTRY_FORMAT 1u
#define ENTRY_HEADER_SIZE 48u
/* Cubins are megabytes; anything near this is corruption, not a kernel. */
#define ENTRY_MAX_PAYLOAD ((uint64_t)1 << 31)
#define STORE_PATH_MAX 4096
/* A source-key alias: the magic, the entry's key in hex, a newline. */
#define ALIAS_MAGIC "FJSRC1 "
#define ALIAS_MAGIC_LEN 7
#define ALIAS_SIZE (ALIAS_MAGIC_LEN + 32 + 1)

typedef enum {
  FAULT_NONE = 0,
  FAULT_ENOSPC, /* partial write, then ENOSPC */
  FAULT_EACCES, /* file creation fails with EACCES */
  FAULT_EROFS,  /* file creation fails with EROFS */
  FAULT_CRASH,  /* the process dies halfway through writing the temp file */
} store_fault;

struct fjc_store {
  char *root; /* NULL: disabled */
  fj_log_fn log;
  void *log_user;
  int write_warned; /* the first write failure is a warning, later ones not */
  store_fault fault;  /* FAULT_NONE outside test builds */
  uint64_t max_bytes; /* 0: no size limit */
  char **in_use;      /* hex keys served by this store: never pruned */
  int n_in_use, cap_in_use;
};

typedef struct entry_header {
  uint64_t payload_len;
  uint64_t checksum;
  uint8_t key[16];
} entry_header;

/* ---- small helpers ---------------------------------------------------- */

void fjc_store_log(const fjc_store *s, fj_log_level level, const char *fmt,
                   ...) {
  char msg[1200];
  va_list ap;
  if (!s || !s->log)
    return;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  s->log(s->log_user, level, msg);
}

static void put_path(char *out, size_t n, const char *path) {
  if (out && n)
    snprintf(out, n, "%s", path ? path : "");
}

/* The arch becomes a path component, so only a plain name is accepted. */
int fjc_arch_is_valid(const char *arch) {
  size_t n = arch ? strlen(arch) : 0;
  if (n == 0 || n > 31)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = arch[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_'))
      return 0;
  }
  return 1;
}

/* "<root>/<libver>/<arch>/<aa>" */
static int entry_dir(const fjc_store *s, const char *arch, const fjc_key *key,
                     char *buf, size_t n) {
  int len = snprintf(buf, n, "%s/%s/%s/%.2s", s->root, FJ_VERSION_STRING,
                     arch, key->hex);
  return len < 0 || (size_t)len >= n ? -1 : 0;
}

/* "<dir>/<keyhex><ext>" */
static int entry_file(const fjc_store *s, const char *arch, const fjc_key *key,
                      const char *ext, char *buf, size_t n) {
  char dir[STORE_PATH_MAX];
  if (entry_dir(s, arch, key, dir, sizeof dir))
    return -1;
  int len = snprintf(buf, n, "%s/%s%s", dir, key->hex, ext);
  return len < 0 || (size_t)len >= n ? -1 : 0;
}

#ifdef FJC_FAULT_INJECTION
/* Test builds only: FLEXJIT_CACHE_FAULT (see store.h). */
static store_fault fault_from_env(void) {
  const char *f = getenv("FLEXJIT_CACHE_FAULT");
  if (!f)
    return FAULT_NONE;
  if (strcmp(f, "enospc") == 0)
    return FAULT_ENOSPC;
  if (strcmp(f, "eacces") == 0)
    return FAULT_EACCES;
  if (strcmp(f, "erofs") == 0)
    return FAULT_EROFS;
  if (strcmp(f, "crash") == 0)
    return FAULT_CRASH;
  return FAULT_NONE;
}
#else
static store_fault fault_from_env(void) { return FAULT_NONE; }
#endif

/* Creation failures injected by FLEXJIT_CACHE_FAULT; 0 when none. */
static int injected_create_errno(const fjc_store *s) {
  if (s->fault == FAULT_EACCES)
    return EACCES;
  if (s->fault == FAULT_EROFS)
    return EROFS;
  return 0;
}

/* mkdir -p: creates each missing component; an existing directory is fine.
 * Returns 0 or -1 with errno set. */
static int make_dirs(const char *path) {
  char buf[STORE_PATH_MAX];
  struct stat st;
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0')
      continue;
    char saved = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return -1;
    buf[i] = saved;
  }
  if (stat(path, &st) != 0)
    return -1;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return -1;
  }
  return 0;
}

/* ---- open / close ----------------------------------------------------- */

const char *fjc_store_default_root(const char *cache_dir_env,
                                   const char *xdg_cache_home,
                                   const char *home, char *buf, size_t n,
                                   const char **why) {
  if (why)
    *why = NULL;
  if (cache_dir_env)
    return cache_dir_env;
  if (xdg_cache_home && xdg_cache_home[0] == '/') {
    snprintf(buf, n, "%s/flexjit", xdg_cache_home);
    return buf;
  }
  if (home && home[0]) {
    snprintf(buf, n, "%s/.cache/flexjit", home);
    return buf;
  }
  if (why)
    *why = "neither FLEXJIT_CACHE_DIR, XDG_CACHE_HOME nor HOME is set";
  return "";
}

fj_status fjc_store_open(const char *root, uint64_t max_bytes, fj_log_fn log,
                         void *log_user, fjc_store **out, char *err,
                         size_t errlen) {
  fjc_store *s = NULL;
  fj_status st = FJ_ENOMEM;

  if (out)
    *out = NULL;
  if (!out || !root) {
    fju_errmsg(err, errlen, "fjc_store_open: %s is NULL", out ? "root" : "out");
    return FJ_EINVAL;
  }
  /* Room for "/<libver>/<arch>/<aa>/<key>.cubin" and a temp suffix. */
  if (strlen(root) >= STORE_PATH_MAX - 128) {
    st = FJ_EINVAL;
    fju_errmsg(err, errlen,
               "cache directory path is too long (%zu bytes, at most %d): "
               "%.64s...",
               strlen(root), STORE_PATH_MAX - 129, root);
    goto fail;
  }
  s = calloc(1, sizeof *s);
  if (!s || (root[0] && !(s->root = strdup(root)))) {
    fju_errmsg(err, errlen, "out of memory opening the kernel cache %s", root);
    goto fail;
  }
  /* "dir/" and "dir" name one store; keep printed paths clean. */
  size_t len = s->root ? strlen(s->root) : 0;
  while (len > 1 && s->root[len - 1] == '/')
    s->root[--len] = '\0';
  s->log = log;
  s->log_user = log_user;
  s->fault = fault_from_env();
  s->max_bytes = max_bytes;
  *out = s;
  return FJ_OK;
fail:
  fjc_store_close(s);
  return st;
}

void fjc_store_close(fjc_store *store) {
  if (!store)
    return;
  for (int i = 0; i < store->n_in_use; i++)
    free(store->in_use[i]);
  free(store->in_use);
  free(store->root);
  free(store);
}

uint64_t fjc_store_max_bytes(const fjc_store *store) {
  return store ? store->max_bytes : 0;
}

const char *const *fjc_store_in_use(const fjc_store *store, int *n) {
  *n = store ? store->n_in_use : 0;
  return store ? (const char *const *)store->in_use : NULL;
}

fj_status fjc_store_mark_in_use(fjc_store *store, const fjc_key *key) {
  if (!store || !key)
    return FJ_EINVAL;
  for (int i = 0; i < store->n_in_use; i++)
    if (strcmp(store->in_use[i], key->hex) == 0)
      return FJ_OK;
  if (store->n_in_use == store->cap_in_use) {
    int cap = store->cap_in_use ? 2 * store->cap_in_use : 16;
    char **grown = realloc(store->in_use, (size_t)cap * sizeof *grown);
    if (!grown)
      return FJ_ENOMEM;
    store->in_use = grown;
    store->cap_in_use = cap;
  }
  if (!(store->in_use[store->n_in_use] = strdup(key->hex)))
    return FJ_ENOMEM;
  store->n_in_use++;
  return FJ_OK;
}

int fjc_store_enabled(const fjc_store *store) {
  return store && store->root != NULL;
}

const char *fjc_store_root(const fjc_store *store) {
  return store && store->root ? store->root : "";
}

/* ---- get -------------------------------------------------------------- */

/* Checks a header against the file and the key; NULL when it is sound, else
 * why it is not. */
static const char *parse_header(const unsigned char *raw, off_t file_size,
                                const fjc_key *key, entry_header *h) {
  if (memcmp(raw, ENTRY_MAGIC, 8) != 0)
    return "bad magic";
  if (fjc_get_le32(raw + 8) != ENTRY_FORMAT)
    return "unknown format version";
  if (fjc_get_le32(raw + 12) != ENTRY_HEADER_SIZE)
    return "bad header size";
  h->payload_len = fjc_get_le64(raw + 16);
  h->checksum = fjc_get_le64(raw + 24);
  memcpy(h->key, raw + 32, 16);
  if (h->payload_len == 0 || h->payload_len > ENTRY_MAX_PAYLOAD)
    return "implausible payload length";
  if ((uint64_t)file_size - ENTRY_HEADER_SIZE != h->payload_len)
    return (uint64_t)file_size - ENTRY_HEADER_SIZE < h->payload_len
               ? "truncated"
               : "trailing bytes after the payload";
  if (memcmp(h->key, key->bytes, 16) != 0)
    return "entry belongs to another key";
  return NULL;
}

/* Reads and verifies an open entry from offset 0. NULL and *data on
 * success, else why the entry is corrupt. */
static const char *read_entry(int fd, const fjc_key *key, void **data,
                              size_t *size) {
  unsigned char raw[ENTRY_HEADER_SIZE];
  entry_header h;
  struct stat st;
  const char *why;
  if (fstat(fd, &st) != 0)
    return "cannot stat";
  if (st.st_size < (off_t)ENTRY_HEADER_SIZE)
    return "truncated header";
  if (fjc_pread_all(fd, raw, sizeof raw, 0))
    return "cannot read header";
  why = parse_header(raw, st.st_size, key, &h);
  if (why)
    return why;
  unsigned char *payload = malloc((size_t)h.payload_len);
  if (!payload)
    return "out of memory";
  if (fjc_pread_all(fd, payload, (size_t)h.payload_len, ENTRY_HEADER_SIZE)) {
    free(payload);
    return "cannot read payload";
  }
  if (XXH3_64bits(payload, (size_t)h.payload_len) != h.checksum) {
    free(payload);
    return "checksum mismatch";
  }
  *data = payload;
  *size = (size_t)h.payload_len;
  return NULL;
}

/* What both lookups (who) check first: the arguments (FJ_EINVAL), then
 * whether there is a file to read, <keyhex><ext> of (arch, key), which
 * lands in path (FJ_ENOTFOUND when not). FJ_OK with *data NULL and *size 0
 * to go on; otherwise err says why. */
static fj_status lookup_file(const char *who, const fjc_store *store,
                             const char *arch, const fjc_key *key,
                             const char *ext, void **data, size_t *size,
                             char *path, size_t n, char *err, size_t errlen) {
  if (!store || !key || !data || !size || !fjc_arch_is_valid(arch)) {
    fju_errmsg(err, errlen, "%s: invalid argument (arch '%s')", who,
               arch ? arch : "(null)");
    return FJ_EINVAL;
  }
  *data = NULL;
  *size = 0;
  if (!store->root) {
    fju_errmsg(err, errlen, "the kernel cache is disabled");
    return FJ_ENOTFOUND;
  }
  if (entry_file(store, arch, key, ext, path, n)) {
    fju_errmsg(err, errlen, "cache path too long under %s", store->root);
    return FJ_ENOTFOUND;
  }
  return FJ_OK;
}

fj_status fjc_store_get(fjc_store *store, const char *arch, const fjc_key *key,
                        void **data, size_t *size, char *path_out,
                        size_t path_len, char *err, size_t errlen) {
  char path[STORE_PATH_MAX];
  const char *why;
  int fd = -1;
  fj_status st;

  put_path(path_out, path_len, "");
  st = lookup_file("fjc_store_get", store, arch, key, ".cubin", data, size,
                   path, sizeof path, err, errlen);
  if (st != FJ_OK)
    return st;
  st = FJ_ENOTFOUND;
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    /* A missing entry is the normal miss; anything else is worth a note. */
    fju_errmsg(err, errlen, "%s: %s", path, strerror(e));
    if (e != ENOENT && e != ENOTDIR)
      fjc_store_log(store, FJ_LOG_WARN, "cannot read cache entry %s: %s", path,
                    strerror(e));
    goto fail;
  }
  why = read_entry(fd, key, data, size);
  if (why) {
    fju_errmsg(err, errlen, "cache entry %s is corrupt (%s)", path, why);
    fjc_store_log(store, FJ_LOG_WARN,
              "ignoring corrupt cache entry %s (%s); it will be recompiled",
              path, why);
    goto fail;
  }
  /* The mtime is the entry's LRU age; a read-only cache simply keeps its
   * old age. */
  futimens(fd, NULL);
  fjc_store_mark_in_use(store, key);
  put_path(path_out, path_len, path);
  st = FJ_OK;
fail:
  if (fd >= 0)
    close(fd);
  return st;
}

/* fjc_entry_read_fd, and the key the header names into key_out (if not
 * NULL) when sound. */
static const char *read_checked(int fd, const fjc_key *key, uint8_t key_out[16],
                                void **data, size_t *size, int *foreign) {
  unsigned char raw[ENTRY_HEADER_SIZE];
  fjc_key named;
  *data = NULL;
  *size = 0;
  *foreign = 0;
  if (fjc_pread_all(fd, raw, sizeof raw, 0) != 0)
    return "truncated header";
  /* Another release's format: not ours to call corrupt. */
  if (memcmp(raw, ENTRY_MAGIC, 8) == 0 && fjc_get_le32(raw + 8) != ENTRY_FORMAT) {
    *foreign = 1;
    return "written in another entry format version";
  }
  /* Without an expected key, check against the key the header names. */
  memcpy(named.bytes, raw + 32, 16);
  const char *why = read_entry(fd, key ? key : &named, data, size);
  if (!why && key_out)
    memcpy(key_out, named.bytes, 16);
  return why;
}

const char *fjc_entry_read_fd(int fd, const fjc_key *key, void **data, size_t *size,
                              int *foreign) {
  return read_checked(fd, key, NULL, data, size, foreign);
}

const char *fjc_entry_check_fd(int fd, const fjc_key *key, uint8_t key_out[16],
                               int *foreign) {
  void *data;
  size_t size;
  const char *why = read_checked(fd, key, key_out, &data, &size, foreign);
  free(data);
  return why;
}

/* ---- source-key aliases ----------------------------------------------- */

int fjc_alias_read_fd(int fd, fjc_key *key) {
  char raw[ALIAS_SIZE + 1], hex[33];
  ssize_t n;
  do
    n = pread(fd, raw, sizeof raw, 0);
  while (n < 0 && errno == EINTR);
  if (n != ALIAS_SIZE || memcmp(raw, ALIAS_MAGIC, ALIAS_MAGIC_LEN) != 0 ||
      raw[ALIAS_SIZE - 1] != '\n')
    return -1;
  memcpy(hex, raw + ALIAS_MAGIC_LEN, 32);
  hex[32] = '\0';
  /* Lowercase only, as written: the file names use the same digits. */
  if (strspn(hex, "0123456789abcdef") != 32 || fjc_key_from_hex(hex, key))
    return -1;
  return 0;
}

fj_status fjc_store_get_by_source(fjc_store *store, const char *arch,
                                  const fjc_key *source_key, fjc_key *key_out,
                                  void **data, size_t *size, char *path_out,
                                  size_t path_len, char *err, size_t errlen) {
  char path[STORE_PATH_MAX];
  fjc_key key;
  int fd, bad;
  fj_status st;
  put_path(path_out, path_len, "");
  st = lookup_file("fjc_store_get_by_source", store, arch, source_key, ".src",
                   data, size, path, sizeof path, err, errlen);
  if (st != FJ_OK)
    return st;
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    fju_errmsg(err, errlen, "%s: %s", path, strerror(errno));
    return FJ_ENOTFOUND;
  }
  bad = fjc_alias_read_fd(fd, &key);
  close(fd);
  if (bad) {
    fju_errmsg(err, errlen, "source-key alias %s is corrupt", path);
    fjc_store_log(store, FJ_LOG_WARN, "ignoring corrupt source-key alias %s",
                  path);
    return FJ_ENOTFOUND;
  }
  /* A dangling alias is the entry's plain miss; a bad entry warns there. */
  st = fjc_store_get(store, arch, &key, data, size, path_out, path_len, err,
                     errlen);
  if (st == FJ_OK && key_out)
    *key_out = key;
  return st;
}

/* ---- put -------------------------------------------------------------- */

/* Writes the temp file's content, honouring the ENOSPC fault injection: half
 * of the bytes land, then the write "fails". */
static int write_parts(const fjc_store *s, int fd, const void *a, size_t na,
                       const void *b, size_t nb) {
  if (s->fault == FAULT_ENOSPC || s->fault == FAULT_CRASH) {
    size_t half = (na + nb) / 2;
    if (fjc_write_all(fd, a, half < na ? half : na))
      return -1;
    if (s->fault == FAULT_CRASH)
      _exit(86); /* no cleanup, no rename: what a crash leaves behind */
    errno = ENOSPC;
    return -1;
  }
  if (fjc_write_all(fd, a, na))
    return -1;
  return nb ? fjc_write_all(fd, b, nb) : 0;
}

/* Publishes a + b as `final` via a temp file in `dir` + fsync + rename. On
 * failure the temp file is gone, *what names the failing step ("write") and
 * errno says why. */
static int publish_file(const fjc_store *s, const char *dir, const char *final,
                        const void *a, size_t na, const void *b, size_t nb,
                        const char **what) {
  char tmp[STORE_PATH_MAX];
  int fd = -1, saved;
  snprintf(tmp, sizeof tmp, "%s/.tmp.XXXXXX", dir);
  *what = "create a temp file for";
  fd = mkstemp(tmp);
  if (fd < 0)
    return -1;
  /* mkstemp makes 0600; entries may be shared read-only (deployments). */
  fchmod(fd, 0644);
  *what = "write";
  if (write_parts(s, fd, a, na, b, nb))
    goto fail;
  *what = "fsync";
  if (fsync(fd) != 0)
    goto fail;
  *what = "close";
  if (close(fd) != 0) {
    fd = -1;
    goto fail;
  }
  fd = -1;
  *what = "rename a temp file onto";
  if (rename(tmp, final) != 0)
    goto fail;
  return 0;
fail:
  saved = errno;
  if (fd >= 0)
    close(fd);
  unlink(tmp);
  errno = saved;
  return -1;
}

/* Reports a write failure: into err, and through the log, a warning the
 * first time, debug afterwards. */
static fj_status write_failed(fjc_store *s, const char *what, const char *path,
                              int errnum, char *err, size_t errlen) {
  char msg[STORE_PATH_MAX + 256];
  snprintf(msg, sizeof msg, "cannot %s %s: %s", what, path, strerror(errnum));
  fju_errmsg(err, errlen, "%s", msg);
  fjc_store_log(s, s->write_warned ? FJ_LOG_DEBUG : FJ_LOG_WARN,
                "kernel cache: %s; kernels are kept in memory only", msg);
  s->write_warned = 1;
  return FJ_ECACHE;
}

static void encode_header(unsigned char *raw, const fjc_key *key,
                          const void *data, size_t size) {
  memcpy(raw, ENTRY_MAGIC, 8);
  fjc_put_le32(raw + 8, ENTRY_FORMAT);
  fjc_put_le32(raw + 12, ENTRY_HEADER_SIZE);
  fjc_put_le64(raw + 16, (uint64_t)size);
  fjc_put_le64(raw + 24, XXH3_64bits(data, size));
  memcpy(raw + 32, key->bytes, 16);
}

static void put_sidecar(fjc_store *s, const char *arch, const fjc_key *key,
                        const char *dir, const char *meta_json) {
  char path[STORE_PATH_MAX];
  const char *what;
  if (entry_file(s, arch, key, ".json", path, sizeof path))
    return;
  if (publish_file(s, dir, path, meta_json, strlen(meta_json), NULL, 0,
                   &what))
    fjc_store_log(s, FJ_LOG_DEBUG, "kernel cache: cannot %s %s: %s", what, path,
              strerror(errno));
}

/* Publishes <source key>.src naming key, after the entry it names, so an
 * alias never names an entry not yet there. Its directory is the source
 * key's <aa>. A failure is a warning: without the alias a process without
 * NVRTC does not find the entry. */
static void put_alias(fjc_store *s, const char *arch, const fjc_key *key,
                      const fjc_key *source_key) {
  char dir[STORE_PATH_MAX], path[STORE_PATH_MAX], text[ALIAS_SIZE + 1];
  const char *what = "create";
  if (entry_dir(s, arch, source_key, dir, sizeof dir) ||
      entry_file(s, arch, source_key, ".src", path, sizeof path))
    return;
  snprintf(text, sizeof text, "%s%s\n", ALIAS_MAGIC, key->hex);
  if (make_dirs(dir) == 0 &&
      publish_file(s, dir, path, text, ALIAS_SIZE, NULL, 0, &what) == 0) {
    fjc_sync_dir(dir);
    return;
  }
  fjc_store_log(s, FJ_LOG_WARN,
                "kernel cache: cannot %s %s: %s; entry %s is found only "
                "where NVRTC is available",
                what, path, strerror(errno), key->hex);
}

fj_status fjc_store_put(fjc_store *store, const char *arch, const fjc_key *key,
                        const fjc_key *source_key, const void *data,
                        size_t size, const char *meta_json, char *path_out,
                        size_t path_len, char *err, size_t errlen) {
  char dir[STORE_PATH_MAX], path[STORE_PATH_MAX];
  unsigned char raw[ENTRY_HEADER_SIZE];
  const char *what;

  put_path(path_out, path_len, "");
  if (!store || !key || !data || size == 0 || size > ENTRY_MAX_PAYLOAD ||
      !fjc_arch_is_valid(arch)) {
    fju_errmsg(err, errlen,
               "fjc_store_put: invalid argument (arch '%s', %zu bytes)",
               arch ? arch : "(null)", size);
    return FJ_EINVAL;
  }
  if (!store->root)
    return FJ_OK;
  if (entry_dir(store, arch, key, dir, sizeof dir) ||
      entry_file(store, arch, key, ".cubin", path, sizeof path))
    return write_failed(store, "build a path under", store->root, ENAMETOOLONG,
                        err, errlen);
  if (injected_create_errno(store))
    return write_failed(store, "create", dir, injected_create_errno(store), err,
                        errlen);
  if (make_dirs(dir))
    return write_failed(store, "create", dir, errno, err, errlen);
  encode_header(raw, key, data, size);
  if (publish_file(store, dir, path, raw, sizeof raw, data, size, &what))
    return write_failed(store, what, path, errno, err, errlen);
  if (meta_json)
    put_sidecar(store, arch, key, dir, meta_json);
  fjc_sync_dir(dir);
  if (source_key && memcmp(source_key->bytes, key->bytes, 16) != 0)
    put_alias(store, arch, key, source_key);
  put_path(path_out, path_len, path);
  fjc_store_mark_in_use(store, key);
  return FJ_OK;
}

/* ---- locking ---------------------------------------------------------- */

static int open_lock_file(const char *path) {
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  /* flock works on a read-only descriptor too (an existing lock file in a
   * directory we cannot write). */
  if (fd < 0)
    fd = open(path, O_RDONLY | O_CLOEXEC);
  return fd;
}

fj_status fjc_store_lock(fjc_store *store, const char *arch, const fjc_key *key,
                         int *lock_fd, char *err, size_t errlen) {
  char dir[STORE_PATH_MAX], path[STORE_PATH_MAX];
  int fd;
  if (lock_fd)
    *lock_fd = -1;
  if (!lock_fd || !store || !key || !fjc_arch_is_valid(arch)) {
    fju_errmsg(err, errlen, "fjc_store_lock: invalid argument (arch '%s')",
               arch ? arch : "(null)");
    return FJ_EINVAL;
  }
  if (!store->root || injected_create_errno(store))
    return FJ_OK;
  if (entry_dir(store, arch, key, dir, sizeof dir) ||
      entry_file(store, arch, key, ".lock", path, sizeof path) ||
      make_dirs(dir))
    return FJ_OK;
  fd = open_lock_file(path);
  if (fd < 0) {
    fjc_store_log(store, FJ_LOG_DEBUG, "kernel cache: no lock %s: %s", path,
              strerror(errno));
    return FJ_OK;
  }
  while (flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR)
      continue;
    fjc_store_log(store, FJ_LOG_DEBUG, "kernel cache: flock %s: %s", path,
              strerror(errno));
    close(fd);
    return FJ_OK;
  }
  *lock_fd = fd;
  return FJ_OK;
}

void fjc_store_unlock(int lock_fd) {
  if (lock_fd < 0)
    return;
  flock(lock_fd, LOCK_UN);
  close(lock_fd);
}
