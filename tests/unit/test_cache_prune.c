/*
 * tests/unit/test_cache_prune.c: the size limit and LRU eviction
 * (cache/prune.c), the LRU touch and in-use set of cache/store.c, and how
 * a context resolves the limit (runtime/context.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/unit/other_user.h"
#include "cache/key.h"
#include "cache/prune.h"
#include "cache/store.h"
#include "runtime/context_impl.h"

#define ARCH "sm_80"
#define PAYLOAD 1000
#define ENTRY_BYTES (48 + PAYLOAD + 2) /* header + cubin + "{}" sidecar */

typedef struct fixture {
  char root[256];
  int warnings;
  fjc_store *store;
  fjc_key keys[6];
  unsigned char cubin[PAYLOAD];
} fixture;

static void count_log(void *user, fj_log_level level, const char *msg) {
  (void)msg;
  if (level >= FJ_LOG_WARN)
    ++*(int *)user;
}

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static fjc_store *open_store(fixture *f) {
  fjc_store *s = NULL;
  char err[256];
  assert_int_equal(
      fjc_store_open(f->root, 0, count_log, &f->warnings, &s, err, sizeof err),
      FJ_OK);
  return s;
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  snprintf(f->root, sizeof f->root, "/tmp/fj-prune-XXXXXX");
  if (!mkdtemp(f->root))
    return -1;
  unsetenv("FLEXJIT_CACHE_MAX_BYTES");
  f->store = open_store(f);
  for (int i = 0; i < 6; i++) {
    fjc_key_builder b;
    fjc_key_begin(&b);
    fjc_key_add_int(&b, "entry", i);
    fjc_key_finish(&b, &f->keys[i]);
  }
  memset(f->cubin, 0x5a, sizeof f->cubin);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  fjc_store_close(f->store);
  nftw(f->root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  unsetenv("FLEXJIT_CACHE_MAX_BYTES");
  free(f);
  return 0;
}

static void entry_path(const fixture *f, int i, const char *ext, char *out,
                       size_t n) {
  snprintf(out, n, "%s/%s/%s/%.2s/%s%s", f->root, FJ_VERSION_STRING, ARCH,
           f->keys[i].hex, f->keys[i].hex, ext);
}

static int exists(const fixture *f, int i, const char *ext) {
  char path[1024];
  entry_path(f, i, ext, path, sizeof path);
  return access(path, F_OK) == 0;
}

/* Sets the entry's LRU age: seconds since the epoch. */
static void set_age(const fixture *f, int i, time_t when) {
  char path[1024];
  struct timespec t[2] = {{when, 0}, {when, 0}};
  entry_path(f, i, ".cubin", path, sizeof path);
  assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

static time_t age_of(const fixture *f, int i) {
  char path[1024];
  struct stat st;
  entry_path(f, i, ".cubin", path, sizeof path);
  assert_int_equal(stat(path, &st), 0);
  return st.st_mtime;
}

/* Puts entries 0..n-1 through a separate store (so they are not in use by
 * f->store) with a sidecar and a lock file, entry i aged 1000 + i. */
static void put_aged(fixture *f, int n) {
  fjc_store *other = open_store(f);
  for (int i = 0; i < n; i++) {
    int fd;
    assert_int_equal(fjc_store_put(other, ARCH, &f->keys[i], NULL, f->cubin,
                                   sizeof f->cubin, "{}", NULL, 0, NULL, 0),
                     FJ_OK);
    assert_int_equal(fjc_store_lock(other, ARCH, &f->keys[i], &fd, NULL, 0),
                     FJ_OK);
    fjc_store_unlock(fd);
    set_age(f, i, 1000 + i);
  }
  fjc_store_close(other);
}

static void test_get_touches_entry(void **state) {
  fixture *f = *state;
  void *data = NULL;
  size_t size = 0;
  put_aged(f, 1);
  assert_int_equal(age_of(f, 0), 1000);
  assert_int_equal(fjc_store_get(f->store, ARCH, &f->keys[0], &data, &size,
                                 NULL, 0, NULL, 0),
                   FJ_OK);
  free(data);
  assert_true(age_of(f, 0) > time(NULL) - 60);
  /* A hit marks the key in use. */
  int n = 0;
  const char *const *keys = fjc_store_in_use(f->store, &n);
  assert_int_equal(n, 1);
  assert_string_equal(keys[0], f->keys[0].hex);
}

static void test_prune_evicts_oldest_first(void **state) {
  fixture *f = *state;
  fjc_prune_report rep;
  put_aged(f, 5);
  /* Entry 3 was used recently: it is now the youngest. */
  set_age(f, 3, 5000);
  assert_int_equal(
      fjc_store_prune(f->store, 3 * ENTRY_BYTES, NULL, 0, &rep, NULL, 0),
      FJ_OK);
  assert_int_equal(rep.entries, 5);
  assert_int_equal(rep.removed, 2);
  assert_int_equal(rep.bytes_before, 5 * ENTRY_BYTES);
  assert_int_equal(rep.bytes_removed, 2 * ENTRY_BYTES);
  assert_int_equal(rep.bytes_after, 3 * ENTRY_BYTES);
  assert_false(exists(f, 0, ".cubin"));
  assert_false(exists(f, 0, ".json"));
  assert_false(exists(f, 0, ".lock"));
  assert_false(exists(f, 1, ".cubin"));
  for (int i = 2; i < 5; i++) {
    assert_true(exists(f, i, ".cubin"));
    assert_true(exists(f, i, ".json"));
  }
  /* Under the limit: nothing to do. */
  assert_int_equal(
      fjc_store_prune(f->store, 3 * ENTRY_BYTES, NULL, 0, &rep, NULL, 0),
      FJ_OK);
  assert_int_equal(rep.removed, 0);
  /* One byte less evicts the next oldest, 2 (3 is younger). */
  assert_int_equal(
      fjc_store_prune(f->store, 3 * ENTRY_BYTES - 1, NULL, 0, &rep, NULL, 0),
      FJ_OK);
  assert_int_equal(rep.removed, 1);
  assert_false(exists(f, 2, ".cubin"));
  assert_true(exists(f, 3, ".cubin"));
  assert_true(exists(f, 4, ".cubin"));
}

static void test_prune_never_evicts_in_use(void **state) {
  fixture *f = *state;
  fjc_prune_report rep;
  const char *in_use[2];
  char upper[33];
  put_aged(f, 4);
  /* Oldest and third, one of them written in uppercase hex. */
  for (int i = 0; i < 33; i++)
    upper[i] = (char)(f->keys[2].hex[i] >= 'a' ? f->keys[2].hex[i] - 32
                                               : f->keys[2].hex[i]);
  in_use[0] = f->keys[0].hex;
  in_use[1] = upper;
  assert_int_equal(fjc_store_prune(f->store, 0, in_use, 2, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.removed, 2);
  assert_int_equal(rep.kept_in_use, 2);
  assert_int_equal(rep.bytes_after, 2 * ENTRY_BYTES);
  assert_true(exists(f, 0, ".cubin"));
  assert_true(exists(f, 2, ".cubin"));
  assert_false(exists(f, 1, ".cubin"));
  assert_false(exists(f, 3, ".cubin"));
}

static void test_prune_skips_entry_being_compiled(void **state) {
  fixture *f = *state;
  fjc_prune_report rep;
  int fd = -1;
  put_aged(f, 2);
  /* Another "process" (a separate open file description) compiles 0. */
  fjc_store *other = open_store(f);
  assert_int_equal(fjc_store_lock(other, ARCH, &f->keys[0], &fd, NULL, 0),
                   FJ_OK);
  assert_true(fd >= 0);
  assert_int_equal(fjc_store_prune(f->store, 0, NULL, 0, &rep, NULL, 0), FJ_OK);
  assert_int_equal(rep.removed, 1);
  assert_true(exists(f, 0, ".cubin"));
  assert_false(exists(f, 1, ".cubin"));
  fjc_store_unlock(fd);
  fjc_store_close(other);
  assert_int_equal(fjc_store_prune(f->store, 0, NULL, 0, &rep, NULL, 0), FJ_OK);
  assert_false(exists(f, 0, ".cubin"));
}

/* The store never prunes by itself; fjc_store_prune_to_limit, which
 * whoever puts calls, keeps it under the limit it was opened with, never
 * evicting the entry just put nor one the store has served. */
static void test_prune_to_limit(void **state) {
  fixture *f = *state;
  void *data = NULL;
  size_t size = 0;
  fjc_store *s = NULL;
  char err[256];
  put_aged(f, 3);
  assert_int_equal(fjc_store_open(f->root, 3 * ENTRY_BYTES, count_log,
                                  &f->warnings, &s, err, sizeof err),
                   FJ_OK);
  assert_int_equal(fjc_store_max_bytes(s), 3 * ENTRY_BYTES);
  assert_int_equal(
      fjc_store_get(s, ARCH, &f->keys[0], &data, &size, NULL, 0, NULL, 0),
      FJ_OK);
  free(data);
  set_age(f, 0, 900); /* oldest on disk, but in use by s */
  assert_int_equal(fjc_store_put(s, ARCH, &f->keys[3], NULL, f->cubin,
                                 sizeof f->cubin, "{}", NULL, 0, NULL, 0),
                   FJ_OK);
  for (int i = 0; i < 4; i++)
    assert_true(exists(f, i, ".cubin")); /* a put alone evicts nothing */
  fjc_store_prune_to_limit(s);
  assert_true(exists(f, 0, ".cubin"));
  assert_false(exists(f, 1, ".cubin"));
  assert_true(exists(f, 2, ".cubin"));
  assert_true(exists(f, 3, ".cubin"));
  fjc_store_close(s);
  /* No limit: nothing to do. */
  fjc_store_prune_to_limit(f->store);
  assert_true(exists(f, 2, ".cubin"));
  assert_int_equal(f->warnings, 0);
}

/* Evicting an entry takes its source-key alias with it. */
static void test_prune_removes_aliases_of_evicted(void **state) {
  fixture *f = *state;
  fjc_prune_report rep;
  char alias[1024];
  fjc_key source;
  fjc_key_builder b;
  fjc_key_begin(&b);
  fjc_key_add_str(&b, "source", "of entry 5");
  fjc_key_finish(&b, &source);
  put_aged(f, 2);
  fjc_store *other = open_store(f);
  assert_int_equal(fjc_store_put(other, ARCH, &f->keys[5], &source, f->cubin,
                                 sizeof f->cubin, "{}", NULL, 0, NULL, 0),
                   FJ_OK);
  fjc_store_close(other);
  set_age(f, 5, 500); /* the oldest */
  snprintf(alias, sizeof alias, "%s/%s/%s/%.2s/%s.src", f->root,
           FJ_VERSION_STRING, ARCH, source.hex, source.hex);
  assert_int_equal(access(alias, F_OK), 0);
  assert_int_equal(
      fjc_store_prune(f->store, 2 * ENTRY_BYTES, NULL, 0, &rep, NULL, 0),
      FJ_OK);
  assert_int_equal(rep.removed, 1);
  assert_int_equal(rep.aliases_removed, 1);
  assert_false(exists(f, 5, ".cubin"));
  assert_int_equal(access(alias, F_OK), -1);
  assert_true(exists(f, 0, ".cubin"));
}

static int prune_read_only(void *arg) {
  fixture *f = arg;
  fjc_prune_report rep;
  fjc_store *s = NULL;
  char err[256], msg[1300] = "";
  if (fjc_store_open(f->root, 0, NULL, NULL, &s, err, sizeof err) != FJ_OK)
    return 10;
  fj_status st = fjc_store_prune(s, 0, NULL, 0, &rep, msg, sizeof msg);
  int rc = st != FJ_EIO                         ? 11
           : rep.removed != 0                   ? 12
           : !strstr(msg, f->root)              ? 13
           : !strstr(msg, "Permission denied") ? 14
                                                : 0;
  if (rc)
    fprintf(stderr, "prune: %s, removed %d: %s\n", fj_status_name(st),
            rep.removed, msg);
  fjc_store_close(s);
  return rc;
}

/* A prune that cannot delete says so: FJ_EIO, naming the path and why. */
static void test_prune_read_only_fails(void **state) {
  fixture *f = *state;
  char cmd[600];
  put_aged(f, 2);
  snprintf(cmd, sizeof cmd, "chmod -R a-w '%s' && chmod a+rx '%s'", f->root,
           f->root);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(fjt_as_other_user(prune_read_only, f), 0);
  snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'", f->root);
  assert_int_equal(system(cmd), 0);
  assert_true(exists(f, 0, ".cubin"));
}

/* The context resolves the limit: its option, else
 * FLEXJIT_CACHE_MAX_BYTES; a bad value is a warning, never a failure. */
static void test_context_limit(void **state) {
  fixture *f = *state;
  const char *env[] = {"3150", "lots", NULL};
  const uint64_t want[] = {3150, 0, 0};
  for (int i = 0; i < 3; i++) {
    fj_context_options o;
    fj_context *ctx = NULL;
    fjc_store *s = NULL;
    fj_context_options_init(&o);
    o.cache_dir = f->root;
    o.log = count_log;
    o.log_user = &f->warnings;
    f->warnings = 0;
    if (env[i])
      setenv("FLEXJIT_CACHE_MAX_BYTES", env[i], 1);
    else
      unsetenv("FLEXJIT_CACHE_MAX_BYTES");
    assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
    assert_int_equal(fjr_context_store(ctx, &s), FJ_OK);
    assert_non_null(s);
    /* "lots" is no size: the first kernel request fails naming it
     * (unit/test_context); the store itself has no limit then. */
    assert_int_equal(fjc_store_max_bytes(s), want[i]);
    assert_int_equal(f->warnings, 0);
    fj_context_destroy(ctx);
  }
  fj_context_options o;
  fj_context *ctx = NULL;
  fjc_store *s = NULL;
  fj_context_options_init(&o);
  o.cache_dir = f->root;
  o.cache_max_bytes = 5000; /* the option wins */
  setenv("FLEXJIT_CACHE_MAX_BYTES", "3150", 1);
  assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
  assert_int_equal(fjr_context_store(ctx, &s), FJ_OK);
  assert_int_equal(fjc_store_max_bytes(s), 5000);
  fj_context_destroy(ctx);
}

static void test_prune_disabled_or_missing_root(void **state) {
  fixture *f = *state;
  fjc_prune_report rep;
  fjc_store *s = NULL;
  char err[128];
  assert_int_equal(fjc_store_open("", 0, NULL, NULL, &s, err, sizeof err), FJ_OK);
  assert_int_equal(fjc_store_prune(s, 0, NULL, 0, &rep, NULL, 0), FJ_OK);
  assert_int_equal(rep.entries, 0);
  fjc_store_close(s);
  char missing[300];
  snprintf(missing, sizeof missing, "%s/nothing-here", f->root);
  assert_int_equal(fjc_store_open(missing, 0, NULL, NULL, &s, err, sizeof err),
                   FJ_OK);
  assert_int_equal(fjc_store_prune(s, 0, NULL, 0, &rep, NULL, 0), FJ_OK);
  fjc_store_close(s);
  assert_int_equal(fjc_store_prune(f->store, 0, NULL, 1, &rep, NULL, 0),
                   FJ_EINVAL);
}

static void test_parse_size(void **state) {
  (void)state;
  uint64_t v = 0;
  assert_int_equal(fjc_parse_size("0", &v), 0);
  assert_int_equal(v, 0);
  assert_int_equal(fjc_parse_size("12345", &v), 0);
  assert_int_equal(v, 12345);
  assert_int_equal(fjc_parse_size("100B", &v), 0);
  assert_int_equal(v, 100);
  assert_int_equal(fjc_parse_size("4K", &v), 0);
  assert_int_equal(v, 4096);
  assert_int_equal(fjc_parse_size("500M", &v), 0);
  assert_int_equal(v, 500ull << 20);
  assert_int_equal(fjc_parse_size("2GiB", &v), 0);
  assert_int_equal(v, 2ull << 30);
  assert_int_equal(fjc_parse_size("1tb", &v), 0);
  assert_int_equal(v, 1ull << 40);
  const char *bad[] = {"", "-1", "M", "5X", "5MM", " 5", "5 ", "1e9",
                       "99999999999999999999", "20000000T"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    assert_int_equal(fjc_parse_size(bad[i], &v), -1);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_get_touches_entry),
      T(test_prune_evicts_oldest_first),
      T(test_prune_never_evicts_in_use),
      T(test_prune_skips_entry_being_compiled),
      T(test_prune_to_limit),
      T(test_prune_removes_aliases_of_evicted),
      T(test_prune_read_only_fails),
      T(test_context_limit),
      T(test_prune_disabled_or_missing_root),
      T(test_parse_size),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
