/*
 * tests/unit/test_cache_store.c: the on-disk cubin store (cache/store.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/key.h"
#include "cache/store.h"

#define ARCH "sm_90a"
#define ENTRY_HEADER 48

typedef struct log_count {
  int warn;
  int debug;
  char last[1200];
} log_count;

static void count_log(void *user, fj_log_level level, const char *msg) {
  log_count *c = user;
  if (level >= FJ_LOG_WARN)
    c->warn++;
  else
    c->debug++;
  snprintf(c->last, sizeof c->last, "%s", msg);
}

typedef struct fixture {
  char root[256];
  log_count log;
  fjc_store *store;
  fjc_key key;
  unsigned char cubin[3000];
  char miss[1200]; /* why the last expect_miss missed */
} fixture;

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static void remove_tree(const char *path) {
  nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void make_key(const char *what, fjc_key *key) {
  fjc_key_builder b;
  fjc_key_begin(&b);
  fjc_key_add_str(&b, "test", what);
  fjc_key_finish(&b, key);
}

static fjc_store *open_store(const char *root, log_count *log) {
  fjc_store *s = NULL;
  char err[256];
  assert_int_equal(fjc_store_open(root, 0, count_log, log, &s, err, sizeof err),
                   FJ_OK);
  assert_non_null(s);
  return s;
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  snprintf(f->root, sizeof f->root, "/tmp/fj-store-XXXXXX");
  if (!mkdtemp(f->root))
    return -1;
  f->store = open_store(f->root, &f->log);
  make_key("entry", &f->key);
  for (size_t i = 0; i < sizeof f->cubin; i++)
    f->cubin[i] = (unsigned char)(i * 7 + 3);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  fjc_store_close(f->store);
  remove_tree(f->root);
  free(f);
  return 0;
}

static void put_entry(fixture *f, char *path, size_t n) {
  assert_int_equal(fjc_store_put(f->store, ARCH, &f->key, NULL, f->cubin,
                                 sizeof f->cubin, "{\"name\": \"t\"}", path, n,
                                 NULL, 0),
                   FJ_OK);
}

static void expect_miss(fixture *f) {
  void *data = (void *)1;
  size_t size = 1;
  char path[1024] = "x";
  assert_int_equal(fjc_store_get(f->store, ARCH, &f->key, &data, &size, path,
                                 sizeof path, f->miss, sizeof f->miss),
                   FJ_ENOTFOUND);
  assert_null(data);
  assert_int_equal(size, 0);
  assert_string_equal(path, "");
}

/* Rewrites the entry file through `edit`. */
static void corrupt_entry(const char *path, void (*edit)(unsigned char *,
                                                         size_t *)) {
  unsigned char buf[8192];
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  size_t n = fread(buf, 1, sizeof buf, fp);
  fclose(fp);
  edit(buf, &n);
  fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(buf, 1, n, fp), n);
  fclose(fp);
}

static void test_round_trip(void **state) {
  fixture *f = *state;
  char path[1024], want[1024], json[1024];
  void *data = NULL;
  size_t size = 0;

  expect_miss(f);
  assert_int_equal(f->log.warn, 0);
  put_entry(f, path, sizeof path);
  snprintf(want, sizeof want, "%s/%s/%s/%.2s/%s.cubin", f->root,
           FJ_VERSION_STRING, ARCH, f->key.hex, f->key.hex);
  assert_string_equal(path, want);

  assert_int_equal(fjc_store_get(f->store, ARCH, &f->key, &data, &size, path,
                                 sizeof path, NULL, 0),
                   FJ_OK);
  assert_string_equal(path, want);
  assert_int_equal(size, sizeof f->cubin);
  assert_memory_equal(data, f->cubin, size);
  free(data);

  /* The metadata sidecar sits next to the entry. */
  snprintf(json, sizeof json, "%s/%s/%s/%.2s/%s.json", f->root,
           FJ_VERSION_STRING, ARCH, f->key.hex, f->key.hex);
  FILE *fp = fopen(json, "r");
  assert_non_null(fp);
  char text[64] = "";
  assert_non_null(fgets(text, sizeof text, fp));
  fclose(fp);
  assert_string_equal(text, "{\"name\": \"t\"}");

  /* Another arch is another entry. */
  assert_int_equal(
      fjc_store_get(f->store, "sm_80", &f->key, &data, &size, NULL, 0, NULL, 0),
      FJ_ENOTFOUND);
  assert_int_equal(f->log.warn, 0);
  assert_int_equal(fjc_store_enabled(f->store), 1);
  assert_string_equal(fjc_store_root(f->store), f->root);
}

static void test_overwrite(void **state) {
  fixture *f = *state;
  void *data = NULL;
  size_t size = 0;
  unsigned char other[10] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
  put_entry(f, NULL, 0);
  assert_int_equal(fjc_store_put(f->store, ARCH, &f->key, NULL, other,
                                 sizeof other, NULL, NULL, 0, NULL, 0),
                   FJ_OK);
  assert_int_equal(
      fjc_store_get(f->store, ARCH, &f->key, &data, &size, NULL, 0, NULL, 0),
      FJ_OK);
  assert_int_equal(size, sizeof other);
  assert_memory_equal(data, other, sizeof other);
  free(data);
}

static void truncate_payload(unsigned char *buf, size_t *n) {
  (void)buf;
  *n -= 100;
}
static void truncate_header(unsigned char *buf, size_t *n) {
  (void)buf;
  *n = 20;
}
static void flip_payload_byte(unsigned char *buf, size_t *n) {
  buf[ENTRY_HEADER + *n / 3] ^= 0x40;
}
static void wrong_magic(unsigned char *buf, size_t *n) {
  (void)n;
  memcpy(buf, "FJCUBIN0", 8);
}
static void wrong_version(unsigned char *buf, size_t *n) {
  (void)n;
  buf[8] = 2;
}
static void trailing_bytes(unsigned char *buf, size_t *n) {
  buf[(*n)++] = 0;
}

static void check_corruption(fixture *f,
                             void (*edit)(unsigned char *, size_t *),
                             const char *reason) {
  char path[1024];
  int before = f->log.warn;
  put_entry(f, path, sizeof path);
  corrupt_entry(path, edit);
  expect_miss(f);
  assert_int_equal(f->log.warn, before + 1);
  assert_non_null(strstr(f->log.last, reason));
  assert_non_null(strstr(f->miss, reason));
  /* A fresh put repairs it. */
  put_entry(f, NULL, 0);
  void *data = NULL;
  size_t size = 0;
  assert_int_equal(
      fjc_store_get(f->store, ARCH, &f->key, &data, &size, NULL, 0, NULL, 0),
      FJ_OK);
  free(data);
}

static void test_truncated_is_miss(void **state) {
  check_corruption(*state, truncate_payload, "truncated");
  check_corruption(*state, truncate_header, "truncated");
}

static void test_flipped_byte_is_miss(void **state) {
  check_corruption(*state, flip_payload_byte, "checksum");
}

static void test_wrong_magic_is_miss(void **state) {
  check_corruption(*state, wrong_magic, "magic");
  check_corruption(*state, wrong_version, "version");
  check_corruption(*state, trailing_bytes, "trailing");
}

static void test_entry_of_other_key_is_miss(void **state) {
  fixture *f = *state;
  char path[1024], other_path[1024];
  fjc_key other;
  make_key("other", &other);
  put_entry(f, path, sizeof path);
  assert_int_equal(fjc_store_put(f->store, ARCH, &other, NULL, f->cubin, 100,
                                 NULL, other_path, sizeof other_path, NULL, 0),
                   FJ_OK);
  assert_int_equal(rename(other_path, path), 0);
  expect_miss(f);
  assert_non_null(strstr(f->log.last, "another key"));
}

static void test_invalid_arch(void **state) {
  fixture *f = *state;
  void *data;
  size_t size;
  int fd;
  assert_int_equal(
      fjc_store_get(f->store, "../x", &f->key, &data, &size, NULL, 0, NULL, 0),
      FJ_EINVAL);
  assert_int_equal(fjc_store_put(f->store, "", &f->key, NULL, f->cubin, 10,
                                 NULL, NULL, 0, NULL, 0),
                   FJ_EINVAL);
  assert_int_equal(fjc_store_lock(f->store, "a/b", &f->key, &fd, NULL, 0),
                   FJ_EINVAL);
  assert_int_equal(fd, -1);
}

/* Counts the entries of a directory tree that are not directories. */
static int file_count;
static int count_file(const char *path, const struct stat *st, int flag,
                      struct FTW *ftw) {
  (void)path, (void)st, (void)ftw;
  if (flag == FTW_F)
    file_count++;
  return 0;
}

static int count_files(const char *root) {
  file_count = 0;
  nftw(root, count_file, 16, FTW_PHYS);
  return file_count;
}

static void test_read_only_root(void **state) {
  fixture *f = *state;
  char file[512], root[600];
  log_count log = {0};
  int fd;

  /* Root under a regular file: every mkdir fails (ENOTDIR), even as root,
   * where a chmod 0555 directory would still be writable. */
  snprintf(file, sizeof file, "%s/file.txt", f->root);
  FILE *fp = fopen(file, "w");
  assert_non_null(fp);
  fclose(fp);
  snprintf(root, sizeof root, "%s/sub", file);
  fjc_store *s = open_store(root, &log);

  char path[1024] = "x", err[1200] = "";
  assert_int_equal(fjc_store_put(s, ARCH, &f->key, NULL, f->cubin,
                                 sizeof f->cubin, "{}", path, sizeof path, err,
                                 sizeof err),
                   FJ_ECACHE);
  assert_string_equal(path, "");
  assert_non_null(strstr(err, "Not a directory"));
  assert_int_equal(fjc_store_put(s, ARCH, &f->key, NULL, f->cubin,
                                 sizeof f->cubin, "{}", NULL, 0, NULL, 0),
                   FJ_ECACHE);
  assert_int_equal(log.warn, 1); /* warned once per store */
  assert_non_null(strstr(log.last, "memory only"));

  void *data = NULL;
  size_t size = 0;
  assert_int_equal(
      fjc_store_get(s, ARCH, &f->key, &data, &size, NULL, 0, NULL, 0),
      FJ_ENOTFOUND);
  assert_null(data);
  assert_int_equal(fjc_store_lock(s, ARCH, &f->key, &fd, NULL, 0), FJ_OK);
  assert_int_equal(fd, -1);
  fjc_store_unlock(fd);
  assert_int_equal(log.warn, 1);
  fjc_store_close(s);
}

static fjc_store *open_with_fault(const char *root, const char *fault,
                                  log_count *log) {
  setenv("FLEXJIT_CACHE_FAULT", fault, 1);
  fjc_store *s = open_store(root, log);
  unsetenv("FLEXJIT_CACHE_FAULT");
  return s;
}

static void test_enospc_leaves_nothing(void **state) {
  fixture *f = *state;
  log_count log = {0};
  char path[1024] = "x", err[1200] = "";
  fjc_store *s = open_with_fault(f->root, "enospc", &log);

  assert_int_equal(fjc_store_put(s, ARCH, &f->key, NULL, f->cubin,
                                 sizeof f->cubin, "{}", path, sizeof path, err,
                                 sizeof err),
                   FJ_ECACHE);
  assert_string_equal(path, "");
  assert_non_null(strstr(err, "No space left"));
  assert_int_equal(log.warn, 1);
  /* Neither an entry, nor a sidecar, nor a temp file remains. */
  assert_int_equal(count_files(f->root), 0);
  expect_miss(f);
  fjc_store_close(s);
}

/* A process that dies halfway through writing an entry leaves at most a temp
 * file: the entry is a miss, and a later put publishes a good one. */
static void test_crash_mid_write_is_never_loaded(void **state) {
  fixture *f = *state;
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    log_count child_log = {0};
    fjc_store *s = open_with_fault(f->root, "crash", &child_log);
    fjc_store_put(s, ARCH, &f->key, NULL, f->cubin, sizeof f->cubin, "{}", NULL,
                  0, NULL, 0);
    _exit(0); /* not reached: the fault exits with 86 mid-write */
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 86);
  assert_true(count_files(f->root) >= 1); /* the half-written temp file */
  expect_miss(f);
  log_count log = {0};
  fjc_store *s = open_store(f->root, &log);
  assert_int_equal(fjc_store_put(s, ARCH, &f->key, NULL, f->cubin,
                                 sizeof f->cubin, "{}", NULL, 0, NULL, 0),
                   FJ_OK);
  void *data = NULL;
  size_t size = 0;
  assert_int_equal(
      fjc_store_get(s, ARCH, &f->key, &data, &size, NULL, 0, NULL, 0), FJ_OK);
  assert_int_equal(size, sizeof f->cubin);
  assert_memory_equal(data, f->cubin, size);
  free(data);
  fjc_store_close(s);
}

static void test_injected_eacces_erofs(void **state) {
  fixture *f = *state;
  const char *faults[] = {"eacces", "erofs"};
  const char *texts[] = {"Permission denied", "Read-only file system"};
  for (int i = 0; i < 2; i++) {
    log_count log = {0};
    int fd;
    char err[1200] = "";
    fjc_store *s = open_with_fault(f->root, faults[i], &log);
    assert_int_equal(fjc_store_put(s, ARCH, &f->key, NULL, f->cubin, 64, NULL,
                                   NULL, 0, err, sizeof err),
                     FJ_ECACHE);
    assert_non_null(strstr(err, texts[i]));
    assert_int_equal(fjc_store_lock(s, ARCH, &f->key, &fd, NULL, 0), FJ_OK);
    assert_int_equal(fd, -1);
    assert_int_equal(log.warn, 1);
    fjc_store_close(s);
  }
  assert_int_equal(count_files(f->root), 0);
}

static void test_disabled_store(void **state) {
  fixture *f = *state;
  log_count log = {0};
  char path[64] = "x";
  void *data = NULL;
  size_t size = 0;
  int fd;
  fjc_store *s = open_store("", &log);
  assert_int_equal(fjc_store_enabled(s), 0);
  assert_string_equal(fjc_store_root(s), "");
  assert_int_equal(fjc_store_put(s, ARCH, &f->key, NULL, f->cubin, 64, NULL,
                                 path, sizeof path, NULL, 0),
                   FJ_OK);
  assert_string_equal(path, "");
  assert_int_equal(
      fjc_store_get(s, ARCH, &f->key, &data, &size, NULL, 0, NULL, 0),
      FJ_ENOTFOUND);
  assert_int_equal(fjc_store_lock(s, ARCH, &f->key, &fd, NULL, 0), FJ_OK);
  assert_int_equal(fd, -1);
  assert_int_equal(log.warn, 0);
  fjc_store_close(s);
  fjc_store_close(NULL);
}

static void expect_root(const char *dir_env, const char *xdg, const char *home,
                        const char *want, int want_why) {
  char buf[256];
  const char *why = "x";
  const char *root =
      fjc_store_default_root(dir_env, xdg, home, buf, sizeof buf, &why);
  assert_string_equal(root, want);
  assert_int_equal(why != NULL, want_why);
}

/* The default root from the values the caller read; the store itself reads
 * no environment variable. */
static void test_default_root(void **state) {
  fixture *f = *state;
  expect_root("/tmp/fj-a//", "/tmp/xdg", "/tmp/home", "/tmp/fj-a//", 0);
  expect_root("", "/tmp/xdg", "/tmp/home", "", 0); /* disabled on purpose */
  expect_root(NULL, "/tmp/xdg", "/tmp/home", "/tmp/xdg/flexjit", 0);
  /* A relative XDG_CACHE_HOME is ignored, as XDG says. */
  expect_root(NULL, "relative", "/tmp/home", "/tmp/home/.cache/flexjit", 0);
  expect_root(NULL, NULL, NULL, "", 1);
  expect_root(NULL, NULL, "", "", 1);

  /* "dir/" and "dir" name one store; NULL is no root at all. */
  log_count log = {0};
  fjc_store *s = open_store("/tmp/fj-a//", &log);
  assert_string_equal(fjc_store_root(s), "/tmp/fj-a");
  fjc_store_close(s);
  char err[128];
  assert_int_equal(fjc_store_open(NULL, 0, NULL, NULL, &s, err, sizeof err),
                   FJ_EINVAL);
  assert_null(s);

  /* The environment changes nothing. */
  setenv("FLEXJIT_CACHE_DIR", "/nonexistent/elsewhere", 1);
  setenv("FLEXJIT_CACHE_MAX_BYTES", "1", 1);
  s = open_store(f->root, &log);
  assert_string_equal(fjc_store_root(s), f->root);
  assert_int_equal(fjc_store_max_bytes(s), 0);
  fjc_store_close(s);
  unsetenv("FLEXJIT_CACHE_DIR");
  unsetenv("FLEXJIT_CACHE_MAX_BYTES");
  assert_int_equal(log.warn, 0);
}

/* ---- source-key aliases ---- */

static void alias_path(const fixture *f, const fjc_key *source, char *out,
                       size_t n) {
  snprintf(out, n, "%s/%s/%s/%.2s/%s.src", f->root, FJ_VERSION_STRING, ARCH,
           source->hex, source->hex);
}

static void put_with_source(fixture *f, const fjc_key *key,
                            const fjc_key *source, size_t size) {
  assert_int_equal(fjc_store_put(f->store, ARCH, key, source, f->cubin, size,
                                 NULL, NULL, 0, NULL, 0),
                   FJ_OK);
}

static void expect_source_miss(fixture *f, const fjc_key *source) {
  void *data = (void *)1;
  size_t size = 1;
  fjc_key got;
  memset(&got, 0x5a, sizeof got);
  assert_int_equal(fjc_store_get_by_source(f->store, ARCH, source, &got, &data,
                                           &size, NULL, 0, NULL, 0),
                   FJ_ENOTFOUND);
  assert_null(data);
  assert_int_equal(size, 0);
  assert_int_equal(got.bytes[0], 0x5a); /* untouched on a miss */
}

/* A put with a source key lets a process that knows only the source key
 * (no NVRTC: the full key holds its version) find the entry. */
static void test_source_key_alias(void **state) {
  fixture *f = *state;
  fjc_key source, other, got;
  char path[1024], alias[1024], text[64] = "";
  void *data = NULL;
  size_t size = 0;
  make_key("source", &source);
  make_key("other build", &other);
  expect_source_miss(f, &source);
  put_with_source(f, &f->key, &source, 1000);
  alias_path(f, &source, alias, sizeof alias);
  FILE *fp = fopen(alias, "r");
  assert_non_null(fp);
  assert_non_null(fgets(text, sizeof text, fp));
  fclose(fp);
  assert_memory_equal(text, "FJSRC1 ", 7);
  assert_memory_equal(text + 7, f->key.hex, 32);

  assert_int_equal(fjc_store_get_by_source(f->store, ARCH, &source, &got, &data,
                                           &size, path, sizeof path, NULL, 0),
                   FJ_OK);
  assert_string_equal(got.hex, f->key.hex);
  assert_int_equal(size, 1000);
  assert_memory_equal(data, f->cubin, size);
  assert_non_null(strstr(path, f->key.hex));
  free(data);
  /* Another target is another alias. */
  assert_int_equal(fjc_store_get_by_source(f->store, "sm_80", &source, NULL,
                                           &data, &size, NULL, 0, NULL, 0),
                   FJ_ENOTFOUND);

  /* The latest put of a source key wins (another NVRTC's build). */
  put_with_source(f, &other, &source, 500);
  assert_int_equal(fjc_store_get_by_source(f->store, ARCH, &source, &got, &data,
                                           &size, NULL, 0, NULL, 0),
                   FJ_OK);
  assert_string_equal(got.hex, other.hex);
  assert_int_equal(size, 500);
  free(data);
  /* No source key, or the key itself: no alias. */
  fjc_key lone;
  make_key("lone", &lone);
  put_with_source(f, &lone, NULL, 100);
  put_with_source(f, &lone, &lone, 100);
  alias_path(f, &lone, alias, sizeof alias);
  assert_int_equal(access(alias, F_OK), -1);
  assert_int_equal(f->log.warn, 0);
}

/* An alias whose entry is gone, or whose bytes are not an alias, is a
 * miss; a corrupt one says so. */
static void test_bad_alias_is_a_miss(void **state) {
  fixture *f = *state;
  fjc_key source;
  char path[1024], alias[1024];
  make_key("source", &source);
  put_with_source(f, &f->key, &source, 1000);
  alias_path(f, &source, alias, sizeof alias);
  /* Dangling: the entry is gone. */
  snprintf(path, sizeof path, "%s/%s/%s/%.2s/%s.cubin", f->root,
           FJ_VERSION_STRING, ARCH, f->key.hex, f->key.hex);
  assert_int_equal(unlink(path), 0);
  expect_source_miss(f, &source);
  assert_int_equal(f->log.warn, 0);
  /* Corrupt: other bytes, a short file, uppercase hex. */
  const char *bad[] = {"FJSRC1 0123\n", "hello", "",
                       "FJSRC1 0123456789ABCDEF0123456789ABCDEF\n",
                       "FJSRC2 0123456789abcdef0123456789abcdef\n"};
  put_with_source(f, &f->key, &source, 1000);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    FILE *fp = fopen(alias, "w");
    assert_non_null(fp);
    fputs(bad[i], fp);
    fclose(fp);
    int before = f->log.warn;
    expect_source_miss(f, &source);
    assert_int_equal(f->log.warn, before + 1);
    assert_non_null(strstr(f->log.last, alias));
  }
  /* A sound alias naming a corrupt entry: the entry's own check. */
  put_with_source(f, &f->key, &source, 1000);
  corrupt_entry(path, flip_payload_byte);
  expect_source_miss(f, &source);
  assert_non_null(strstr(f->log.last, "checksum"));
}

/* One of the racing processes: lock, re-check, "compile" on a miss (counted
 * in a shared file), publish, unlock. Returns the exit status. */
static int compile_once(const char *root, const fjc_key *key,
                        const char *counter, const unsigned char *cubin,
                        size_t size) {
  log_count log = {0};
  fjc_store *s = NULL;
  void *data = NULL;
  size_t got = 0;
  int fd = -1, rc = 1;
  if (fjc_store_open(root, 0, count_log, &log, &s, NULL, 0) != FJ_OK)
    return 2;
  if (fjc_store_lock(s, ARCH, key, &fd, NULL, 0) != FJ_OK || fd < 0)
    goto done;
  if (fjc_store_get(s, ARCH, key, &data, &got, NULL, 0, NULL, 0) == FJ_OK) {
    rc = got == size && memcmp(data, cubin, size) == 0 ? 0 : 3;
    goto done;
  }
  int c = open(counter, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (c < 0 || write(c, "x", 1) != 1)
    goto done;
  close(c);
  usleep(100 * 1000); /* a slow compile widens the race */
  rc = fjc_store_put(s, ARCH, key, NULL, cubin, size, NULL, NULL, 0, NULL, 0) ==
               FJ_OK
           ? 0
           : 4;
done:
  free(data);
  fjc_store_unlock(fd);
  fjc_store_close(s);
  return rc;
}

/* The caller's buffer gets the message of a failure, naming the path and
 * the reason, and is left alone on success. */
static void test_err_written_only_on_failure(void **state) {
  fixture *f = *state;
  char err[1200] = "untouched", want[1024];
  void *data = NULL;
  size_t size = 0;
  int fd = -1;
  fjc_key source;
  make_key("source", &source);

  assert_int_equal(fjc_store_get(f->store, ARCH, &f->key, &data, &size, NULL, 0,
                                 err, sizeof err),
                   FJ_ENOTFOUND);
  snprintf(want, sizeof want, "%s/%s/%s/%.2s/%s.cubin", f->root,
           FJ_VERSION_STRING, ARCH, f->key.hex, f->key.hex);
  assert_non_null(strstr(err, want));
  assert_non_null(strstr(err, "No such file"));
  assert_int_equal(fjc_store_get_by_source(f->store, ARCH, &source, NULL, &data,
                                           &size, NULL, 0, err, sizeof err),
                   FJ_ENOTFOUND);
  assert_non_null(strstr(err, ".src"));
  assert_int_equal(fjc_store_get(f->store, "../x", &f->key, &data, &size, NULL,
                                 0, err, sizeof err),
                   FJ_EINVAL);
  assert_non_null(strstr(err, "invalid argument (arch '../x')"));
  assert_int_equal(fjc_store_put(f->store, "../x", &f->key, NULL, f->cubin,
                                 sizeof f->cubin, NULL, NULL, 0, err,
                                 sizeof err),
                   FJ_EINVAL);
  assert_non_null(strstr(err, "fjc_store_put: invalid argument"));
  assert_int_equal(
      fjc_store_lock(f->store, ARCH, &f->key, NULL, err, sizeof err),
      FJ_EINVAL);
  assert_non_null(strstr(err, "fjc_store_lock: invalid argument"));
  /* Truncated to the buffer, terminated. */
  char small[8] = "xxxxxxx";
  assert_int_equal(fjc_store_get(f->store, ARCH, &f->key, &data, &size, NULL, 0,
                                 small, sizeof small),
                   FJ_ENOTFOUND);
  assert_int_equal(strlen(small), sizeof small - 1);

  snprintf(err, sizeof err, "untouched");
  assert_int_equal(fjc_store_put(f->store, ARCH, &f->key, &source, f->cubin,
                                 sizeof f->cubin, "{}", NULL, 0, err,
                                 sizeof err),
                   FJ_OK);
  assert_int_equal(fjc_store_get(f->store, ARCH, &f->key, &data, &size, NULL, 0,
                                 err, sizeof err),
                   FJ_OK);
  free(data);
  assert_int_equal(fjc_store_get_by_source(f->store, ARCH, &source, NULL, &data,
                                           &size, NULL, 0, err, sizeof err),
                   FJ_OK);
  free(data);
  assert_int_equal(
      fjc_store_lock(f->store, ARCH, &f->key, &fd, err, sizeof err), FJ_OK);
  fjc_store_unlock(fd);
  assert_string_equal(err, "untouched");

  /* Opening: the same. */
  char root[5000];
  fjc_store *s = NULL;
  assert_int_equal(fjc_store_open(f->root, 0, NULL, NULL, &s, err, sizeof err),
                   FJ_OK);
  fjc_store_close(s);
  assert_string_equal(err, "untouched");
  memset(root, 'r', sizeof root - 1);
  root[0] = '/';
  root[sizeof root - 1] = '\0';
  assert_int_equal(fjc_store_open(root, 0, NULL, NULL, &s, err, sizeof err),
                   FJ_EINVAL);
  assert_null(s);
  assert_non_null(strstr(err, "too long (4999 bytes"));
  assert_non_null(strstr(err, "/rrr"));
}

static void test_concurrent_compile_once(void **state) {
  fixture *f = *state;
  char counter[512];
  int gate[2];
  pid_t pids[4];
  struct stat st;

  snprintf(counter, sizeof counter, "%s/compiles", f->root);
  assert_int_equal(pipe(gate), 0);
  for (int i = 0; i < 4; i++) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) {
      char c;
      close(gate[1]);
      /* All start together when the parent closes the gate. */
      if (read(gate[0], &c, 1) < 0)
        _exit(5);
      _exit(compile_once(f->root, &f->key, counter, f->cubin,
                         sizeof f->cubin));
    }
  }
  close(gate[0]);
  close(gate[1]);
  for (int i = 0; i < 4; i++) {
    int status = 0;
    assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  assert_int_equal(stat(counter, &st), 0);
  assert_int_equal(st.st_size, 1); /* exactly one compile */

  void *data = NULL;
  size_t size = 0;
  assert_int_equal(
      fjc_store_get(f->store, ARCH, &f->key, &data, &size, NULL, 0, NULL, 0),
      FJ_OK);
  free(data);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_round_trip),
      T(test_overwrite),
      T(test_truncated_is_miss),
      T(test_flipped_byte_is_miss),
      T(test_wrong_magic_is_miss),
      T(test_entry_of_other_key_is_miss),
      T(test_invalid_arch),
      T(test_read_only_root),
      T(test_enospc_leaves_nothing),
      T(test_crash_mid_write_is_never_loaded),
      T(test_injected_eacces_erofs),
      T(test_disabled_store),
      T(test_default_root),
      T(test_source_key_alias),
      T(test_bad_alias_is_a_miss),
      T(test_concurrent_compile_once),
      T(test_err_written_only_on_failure),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
