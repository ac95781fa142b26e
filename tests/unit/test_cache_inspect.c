/*
 * tests/unit/test_cache_inspect.c: listing, verifying and clearing a store
 * (cache/inspect.c) and the sidecar field reader (cache/meta.c).
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

#include "cache/inspect.h"
#include "tests/unit/other_user.h"
#include "cache/key.h"
#include "cache/meta.h"
#include "cache/store.h"

typedef struct fixture {
  char root[256];
  fjc_store *store;
  fjc_key keys[4];
  unsigned char cubin[777];
} fixture;

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  char err[256];
  snprintf(f->root, sizeof f->root, "/tmp/fj-inspect-XXXXXX");
  if (!mkdtemp(f->root))
    return -1;
  unsetenv("FLEXJIT_CACHE_MAX_BYTES");
  if (fjc_store_open(f->root, 0, NULL, NULL, &f->store, err, sizeof err))
    return -1;
  for (int i = 0; i < 4; i++) {
    fjc_key_builder b;
    fjc_key_begin(&b);
    fjc_key_add_int(&b, "inspect", i);
    fjc_key_finish(&b, &f->keys[i]);
  }
  for (size_t i = 0; i < sizeof f->cubin; i++)
    f->cubin[i] = (unsigned char)(i * 13);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  fjc_store_close(f->store);
  nftw(f->root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(f);
  return 0;
}

static const char *const archs[4] = {"sm_80", "sm_80", "sm_90a", "sm_90a"};

static void put_all(fixture *f) {
  for (int i = 0; i < 4; i++) {
    char meta[256];
    snprintf(meta, sizeof meta,
             "{\"spec\": \"x.lua\", \"head_dim\": 64, \"nested\": {\"name\": "
             "\"wrong\"}, \"name\": \"fj_fwd_k%d_d64_bf16_%s\"}",
             i, archs[i]);
    assert_int_equal(fjc_store_put(f->store, archs[i], &f->keys[i], NULL,
                                   f->cubin, sizeof f->cubin - (size_t)i,
                                   i == 3 ? NULL : meta, NULL, 0, NULL, 0),
                     FJ_OK);
  }
}

static void entry_path(const fixture *f, int i, char *out, size_t n) {
  snprintf(out, n, "%s/%s/%s/%.2s/%s.cubin", f->root, FJ_VERSION_STRING,
           archs[i], f->keys[i].hex, f->keys[i].hex);
}

typedef struct seen {
  int n;
  fjc_entry_info e[8];
  char paths[8][1024];
} seen;

static int remember(void *user, const fjc_entry_info *e) {
  seen *s = user;
  if (s->n < 8) {
    s->e[s->n] = *e;
    snprintf(s->paths[s->n], sizeof s->paths[0], "%s", e->path);
  }
  s->n++;
  return 0;
}

static const fjc_entry_info *find_seen(const seen *s, const fjc_key *k) {
  for (int i = 0; i < s->n && i < 8; i++)
    if (strcmp(s->e[i].key.hex, k->hex) == 0)
      return &s->e[i];
  return NULL;
}

static void test_list(void **state) {
  fixture *f = *state;
  seen s = {0};
  char path[1024];
  put_all(f);
  /* Files the store does not own are not entries. */
  snprintf(path, sizeof path, "%s/%s/sm_80/README", f->root,
           FJ_VERSION_STRING);
  FILE *fp = fopen(path, "w");
  fclose(fp);
  assert_int_equal(fjc_store_list(f->store, remember, &s, NULL, 0), FJ_OK);
  assert_int_equal(s.n, 4);
  for (int i = 0; i < 4; i++) {
    const fjc_entry_info *e = find_seen(&s, &f->keys[i]);
    char want[96];
    assert_non_null(e);
    assert_string_equal(e->arch, archs[i]);
    assert_string_equal(e->libver, FJ_VERSION_STRING);
    assert_int_equal(e->cubin_bytes, 48 + sizeof f->cubin - (size_t)i);
    assert_true(e->mtime.tv_sec > time(NULL) - 60);
    if (i == 3) {
      assert_string_equal(e->name, "");
      assert_int_equal(e->meta_bytes, 0);
    } else {
      snprintf(want, sizeof want, "fj_fwd_k%d_d64_bf16_%s", i, archs[i]);
      assert_string_equal(e->name, want);
      assert_true(e->meta_bytes > 0);
    }
  }
}

static int stop_at_first(void *user, const fjc_entry_info *e) {
  (void)e;
  ++*(int *)user;
  return 1;
}

static void test_list_stops_and_handles_empty(void **state) {
  fixture *f = *state;
  int calls = 0;
  assert_int_equal(fjc_store_list(f->store, stop_at_first, &calls, NULL, 0),
                   FJ_OK);
  assert_int_equal(calls, 0);
  put_all(f);
  assert_int_equal(fjc_store_list(f->store, stop_at_first, &calls, NULL, 0),
                   FJ_OK);
  assert_int_equal(calls, 1);
}

typedef struct bad_list {
  int n;
  char why[4][128];
  char path[4][1024];
} bad_list;

static void note_bad(void *user, const char *path, const char *why) {
  bad_list *b = user;
  if (b->n < 4) {
    snprintf(b->why[b->n], sizeof b->why[0], "%s", why);
    snprintf(b->path[b->n], sizeof b->path[0], "%s", path);
  }
  b->n++;
}

static void flip_byte(const char *path, long at) {
  int fd = open(path, O_RDWR);
  unsigned char c;
  assert_true(fd >= 0);
  assert_int_equal(pread(fd, &c, 1, at), 1);
  c ^= 0x10;
  assert_int_equal(pwrite(fd, &c, 1, at), 1);
  close(fd);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(data, 1, n, fp), n);
  fclose(fp);
}

static void test_verify_finds_corrupt_entry(void **state) {
  fixture *f = *state;
  fjc_verify_report rep;
  bad_list bad = {0};
  char path[1024], other[1024], tmp_old[1100], tmp_new[1100];
  put_all(f);
  assert_int_equal(fjc_store_verify(f->store, 0, note_bad, &bad, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.checked, 4);
  assert_int_equal(rep.bad, 0);

  entry_path(f, 1, path, sizeof path);
  flip_byte(path, 48 + 300);
  /* Entry 2's file copied under entry 0's name: sound bytes, wrong key. */
  entry_path(f, 0, other, sizeof other);
  entry_path(f, 2, tmp_old, sizeof tmp_old);
  {
    unsigned char buf[2048];
    FILE *fp = fopen(tmp_old, "rb");
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    write_file(other, buf, n);
  }
  /* A crashed writer's temp file, old; and one being written right now. */
  snprintf(tmp_old, sizeof tmp_old, "%s/%s/sm_80/%.2s/.tmp.AAAAAA", f->root,
           FJ_VERSION_STRING, f->keys[1].hex);
  snprintf(tmp_new, sizeof tmp_new, "%s/%s/sm_80/%.2s/.tmp.BBBBBB", f->root,
           FJ_VERSION_STRING, f->keys[1].hex);
  write_file(tmp_old, "x", 1);
  write_file(tmp_new, "y", 1);
  struct timespec t[2] = {{1000, 0}, {1000, 0}};
  assert_int_equal(utimensat(AT_FDCWD, tmp_old, t, 0), 0);

  /* Report only. */
  assert_int_equal(fjc_store_verify(f->store, 0, note_bad, &bad, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.checked, 4);
  assert_int_equal(rep.bad, 2);
  assert_int_equal(rep.removed, 0);
  assert_int_equal(bad.n, 2);
  int saw_checksum = 0, saw_key = 0;
  for (int i = 0; i < 2; i++) {
    saw_checksum |= strcmp(bad.path[i], path) == 0 &&
                    strstr(bad.why[i], "checksum") != NULL;
    saw_key |= strcmp(bad.path[i], other) == 0 &&
               strstr(bad.why[i], "another key") != NULL;
  }
  assert_true(saw_checksum);
  assert_true(saw_key);
  assert_int_equal(access(path, F_OK), 0);

  /* Repair. */
  assert_int_equal(fjc_store_verify(f->store, 1, NULL, NULL, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.bad, 2);
  assert_int_equal(rep.removed, 2);
  assert_int_equal(rep.stale_temps, 1);
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(access(other, F_OK), -1);
  assert_int_equal(access(tmp_old, F_OK), -1);
  assert_int_equal(access(tmp_new, F_OK), 0);
  assert_int_equal(fjc_store_verify(f->store, 0, NULL, NULL, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.checked, 2);
  assert_int_equal(rep.bad, 0);
}

static void test_verify_leaves_foreign_format(void **state) {
  fixture *f = *state;
  fjc_verify_report rep;
  char path[1024];
  put_all(f);
  entry_path(f, 2, path, sizeof path);
  flip_byte(path, 8); /* format version 1 -> 17 */
  assert_int_equal(fjc_store_verify(f->store, 1, NULL, NULL, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.foreign, 1);
  assert_int_equal(rep.bad, 0);
  assert_int_equal(access(path, F_OK), 0);
}

static void test_clear(void **state) {
  fixture *f = *state;
  char keep[512], path[1024];
  int removed = -1;
  uint64_t bytes = 0;
  int fd;
  put_all(f);
  assert_int_equal(fjc_store_lock(f->store, "sm_80", &f->keys[0], &fd, NULL, 0),
                   FJ_OK);
  fjc_store_unlock(fd);
  snprintf(keep, sizeof keep, "%s/notes.txt", f->root);
  write_file(keep, "mine", 4);
  assert_int_equal(fjc_store_clear(f->store, &removed, &bytes, NULL, 0), FJ_OK);
  assert_int_equal(removed, 4);
  assert_true(bytes >= 4 * 48 + 4 * sizeof f->cubin - 6);
  assert_int_equal(access(keep, F_OK), 0);
  snprintf(path, sizeof path, "%s/%s", f->root, FJ_VERSION_STRING);
  assert_int_equal(access(path, F_OK), -1); /* empty directories went too */
  seen s = {0};
  assert_int_equal(fjc_store_list(f->store, remember, &s, NULL, 0), FJ_OK);
  assert_int_equal(s.n, 0);
}

static const char *check_path(const char *path, const fjc_key *key,
                              uint8_t key_out[16], int *foreign) {
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  const char *why = fjc_entry_check_fd(fd, key, key_out, foreign);
  close(fd);
  return why;
}

static void test_entry_check_fd(void **state) {
  fixture *f = *state;
  char path[1024];
  uint8_t key[16];
  int foreign = -1;
  put_all(f);
  entry_path(f, 0, path, sizeof path);
  assert_null(check_path(path, NULL, key, &foreign));
  assert_int_equal(foreign, 0);
  assert_memory_equal(key, f->keys[0].bytes, 16);
  assert_null(check_path(path, &f->keys[0], NULL, &foreign));
  assert_non_null(check_path(path, &f->keys[1], NULL, &foreign));
  assert_int_equal(truncate(path, 20), 0);
  assert_non_null(check_path(path, NULL, NULL, &foreign));
}

static void make_dir(const char *path) {
  if (mkdir(path, 0755) != 0)
    fail_msg("mkdir %s failed", path);
}

/* A two-digit directory name that no key of the fixture starts with. */
static void unused_aa(const fixture *f, char out[3]) {
  for (int v = 0xff; v >= 0; v--) {
    snprintf(out, 3, "%02x", v);
    int used = 0;
    for (int i = 0; i < 4; i++)
      used |= strncmp(f->keys[i].hex, out, 2) == 0;
    if (!used)
      return;
  }
}

/* Fills dir with files named like cache entries: a sound copy of entry 0
 * (so verify keeps it) and a corrupt one (so verify --remove would not). */
static void fill_outside(const fixture *f, const char *dir) {
  char path[1024], src[1024];
  unsigned char buf[2048];
  entry_path(f, 0, src, sizeof src);
  FILE *fp = fopen(src, "rb");
  size_t n = fread(buf, 1, sizeof buf, fp);
  fclose(fp);
  snprintf(path, sizeof path, "%s/%s.cubin", dir, f->keys[0].hex);
  write_file(path, buf, n);
  snprintf(path, sizeof path, "%s/%s.cubin", dir, f->keys[1].hex);
  write_file(path, "junk", 4);
  snprintf(path, sizeof path, "%s/%s.json", dir, f->keys[1].hex);
  write_file(path, "{}", 2);
}

static int count_outside(const char *dir) {
  int n = 0;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "find '%s' -type f | wc -l", dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  assert_int_equal(fscanf(p, "%d", &n), 1);
  pclose(p);
  return n;
}

/* No walker follows a symlink below the root: a symlinked release, arch or
 * <aa> directory (or entry file) leading out of the cache is not walked,
 * and the key-named files it leads to stay. */
static void test_walkers_do_not_follow_symlinks(void **state) {
  fixture *f = *state;
  char out[300], link[1024], target[1024], aa[3];
  put_all(f);
  snprintf(out, sizeof out, "%s-outside", f->root);
  make_dir(out);
  /* <root>/<ver>/sm_80/<aa> -> out/aa: key-named files */
  snprintf(target, sizeof target, "%s/aa", out);
  make_dir(target);
  fill_outside(f, target);
  unused_aa(f, aa);
  snprintf(link, sizeof link, "%s/%s/sm_80/%s", f->root, FJ_VERSION_STRING, aa);
  assert_int_equal(symlink(target, link), 0);
  /* <root>/<ver>/sm_86 -> out/arch, holding <aa>/files */
  snprintf(target, sizeof target, "%s/arch", out);
  make_dir(target);
  snprintf(target, sizeof target, "%s/arch/%s", out, aa);
  make_dir(target);
  fill_outside(f, target);
  snprintf(target, sizeof target, "%s/arch", out);
  snprintf(link, sizeof link, "%s/%s/sm_86", f->root, FJ_VERSION_STRING);
  assert_int_equal(symlink(target, link), 0);
  /* <root>/0.0.1 -> out/release, holding sm_80/<aa>/files */
  snprintf(target, sizeof target, "%s/release/sm_80/%s", out, aa);
  assert_int_equal(system(strcat(strcpy(link, "mkdir -p "), target)), 0);
  fill_outside(f, target);
  snprintf(target, sizeof target, "%s/release", out);
  snprintf(link, sizeof link, "%s/0.0.1", f->root);
  assert_int_equal(symlink(target, link), 0);
  /* An entry file that is a symlink to a sound entry outside. */
  snprintf(target, sizeof target, "%s/aa/%s.cubin", out, f->keys[0].hex);
  snprintf(link, sizeof link, "%s/%s/sm_90a/%.2s/%s.cubin", f->root,
           FJ_VERSION_STRING, f->keys[2].hex, f->keys[0].hex);
  assert_int_equal(symlink(target, link), 0);
  int outside_files = count_outside(out);
  assert_int_equal(outside_files, 9);

  seen s = {0};
  assert_int_equal(fjc_store_list(f->store, remember, &s, NULL, 0), FJ_OK);
  assert_int_equal(s.n, 4);
  fjc_verify_report rep;
  assert_int_equal(fjc_store_verify(f->store, 1, NULL, NULL, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.checked, 4);
  assert_int_equal(rep.bad, 0);
  assert_int_equal(count_outside(out), outside_files);
  assert_int_equal(fjc_store_clear(f->store, NULL, NULL, NULL, 0), FJ_OK);
  assert_int_equal(count_outside(out), outside_files);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
  assert_int_equal(system(cmd), 0);
}

/* The shipped library has no fault injection: FLEXJIT_CACHE_FAULT is read
 * only by test builds of cache/store.c. */
static void test_shipped_store_ignores_fault_variable(void **state) {
  fixture *f = *state;
  fjc_store *s = NULL;
  char err[256];
  setenv("FLEXJIT_CACHE_FAULT", "erofs", 1);
  assert_int_equal(fjc_store_open(f->root, 0, NULL, NULL, &s, err, sizeof err),
                   FJ_OK);
  unsetenv("FLEXJIT_CACHE_FAULT");
  assert_int_equal(fjc_store_put(s, "sm_80", &f->keys[0], NULL, f->cubin, 100,
                                 NULL, NULL, 0, NULL, 0),
                   FJ_OK);
  fjc_store_close(s);
}

/* ---- source-key aliases ---- */

static void make_source(int i, fjc_key *k) {
  fjc_key_builder b;
  fjc_key_begin(&b);
  fjc_key_add_int(&b, "source", i);
  fjc_key_finish(&b, k);
}

static void alias_path(const fixture *f, int i, const fjc_key *source,
                       char *out, size_t n) {
  snprintf(out, n, "%s/%s/%s/%.2s/%s.src", f->root, FJ_VERSION_STRING,
           archs[i], source->hex, source->hex);
}

/* Entries 0..3 with aliases from sources 0..3. */
static void put_all_with_aliases(fixture *f) {
  for (int i = 0; i < 4; i++) {
    fjc_key source;
    make_source(i, &source);
    assert_int_equal(fjc_store_put(f->store, archs[i], &f->keys[i], &source,
                                   f->cubin, 100, "{}", NULL, 0, NULL, 0),
                     FJ_OK);
  }
}

typedef struct alias_seen {
  int n, dangling, corrupt;
} alias_seen;

static int count_alias(void *user, const fjc_alias_info *a) {
  alias_seen *s = user;
  s->n++;
  s->dangling += a->dangling;
  s->corrupt += a->corrupt;
  if (!a->corrupt && !a->dangling) {
    /* A sound alias names an entry that is there. */
    char want[96];
    snprintf(want, sizeof want, "/%s/%.2s/%s.src", a->arch,
             a->source_key.hex, a->source_key.hex);
    assert_non_null(strstr(a->path, want));
  }
  return 0;
}

static alias_seen aliases(fixture *f) {
  alias_seen s = {0, 0, 0};
  assert_int_equal(fjc_store_list_aliases(f->store, count_alias, &s, NULL, 0),
                   FJ_OK);
  return s;
}

/* Aliases are listed apart from entries, checked by verify (dangling and
 * corrupt ones reported, and deleted with remove_bad) and deleted by
 * clear. */
static void test_aliases_list_verify_clear(void **state) {
  fixture *f = *state;
  fjc_verify_report rep;
  bad_list bad = {0};
  char path[1024], alias[1024];
  fjc_key source;
  put_all_with_aliases(f);
  seen s = {0};
  assert_int_equal(fjc_store_list(f->store, remember, &s, NULL, 0), FJ_OK);
  assert_int_equal(s.n, 4);
  alias_seen a = aliases(f);
  assert_int_equal(a.n, 4);
  assert_int_equal(a.dangling + a.corrupt, 0);
  assert_int_equal(fjc_store_verify(f->store, 0, note_bad, &bad, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.aliases, 4);
  assert_int_equal(rep.bad_aliases, 0);

  /* Entry 1 gone: its alias dangles. Alias 2 overwritten with junk. */
  entry_path(f, 1, path, sizeof path);
  assert_int_equal(unlink(path), 0);
  make_source(2, &source);
  alias_path(f, 2, &source, alias, sizeof alias);
  write_file(alias, "junk", 4);
  a = aliases(f);
  assert_int_equal(a.dangling, 1);
  assert_int_equal(a.corrupt, 1);
  assert_int_equal(fjc_store_verify(f->store, 0, note_bad, &bad, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.bad_aliases, 2);
  assert_int_equal(bad.n, 2);
  assert_true(strstr(bad.why[0], "dangling") || strstr(bad.why[1], "dangling"));
  assert_int_equal(fjc_store_verify(f->store, 1, NULL, NULL, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.removed_aliases, 2);
  assert_int_equal(access(alias, F_OK), -1);
  a = aliases(f);
  assert_int_equal(a.n, 2);

  /* verify --remove of a corrupt entry takes its alias in the same run. */
  entry_path(f, 3, path, sizeof path);
  flip_byte(path, 48 + 50);
  assert_int_equal(fjc_store_verify(f->store, 1, NULL, NULL, &rep, NULL, 0),
                   FJ_OK);
  assert_int_equal(rep.removed, 1);
  assert_int_equal(rep.removed_aliases, 1);
  a = aliases(f);
  assert_int_equal(a.n, 1);

  /* clear deletes aliases too, and the folders that held them. */
  int removed = 0;
  assert_int_equal(fjc_store_clear(f->store, &removed, NULL, NULL, 0), FJ_OK);
  assert_int_equal(removed, 2);
  a = aliases(f);
  assert_int_equal(a.n, 0);
  snprintf(path, sizeof path, "%s/%s", f->root, FJ_VERSION_STRING);
  assert_int_equal(access(path, F_OK), -1);
}

static int failing_walks(void *arg) {
  fixture *f = arg;
  fjc_store *s = NULL;
  fjc_verify_report rep;
  char err[1200] = "";
  int removed = -1, rc = 0;
  if (fjc_store_open(f->root, 0, NULL, NULL, &s, err, sizeof err) != FJ_OK)
    return 10;
  /* clear and verify --remove on a read-only cache: FJ_EIO naming a path
   * under the root and the reason. */
  if (fjc_store_clear(s, &removed, NULL, err, sizeof err) != FJ_EIO ||
      removed != 0)
    rc = 11;
  else if (!strstr(err, f->root) || !strstr(err, "Permission denied"))
    rc = 12;
  else if (fjc_store_verify(s, 1, NULL, NULL, &rep, err, sizeof err) !=
               FJ_EIO ||
           rep.bad != 1 || rep.removed != 0)
    rc = 13;
  if (rc)
    fprintf(stderr, "child: %s\n", err);
  fjc_store_close(s);
  return rc;
}

static int unreadable_listing(void *arg) {
  fixture *f = arg;
  fjc_store *s = NULL;
  char err[1200] = "";
  seen sn = {0};
  int rc = 0;
  if (fjc_store_open(f->root, 0, NULL, NULL, &s, err, sizeof err) != FJ_OK)
    return 10;
  if (fjc_store_list(s, remember, &sn, err, sizeof err) != FJ_EIO)
    rc = 11;
  else if (!strstr(err, "cannot read"))
    rc = 12;
  fjc_store_close(s);
  return rc;
}

/* Walks that cannot do their job say so instead of reporting success. */
static void test_walk_failures_are_errors(void **state) {
  fixture *f = *state;
  char cmd[700], path[1024];
  put_all(f);
  entry_path(f, 1, path, sizeof path);
  flip_byte(path, 48 + 10);
  snprintf(cmd, sizeof cmd, "chmod -R a-w '%s' && chmod a+rx '%s'", f->root,
           f->root);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(fjt_as_other_user(failing_walks, f), 0);
  snprintf(cmd, sizeof cmd, "chmod -R u+w '%s' && chmod 0 '%s/%s/sm_80'",
           f->root, f->root, FJ_VERSION_STRING);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(fjt_as_other_user(unreadable_listing, f), 0);
  snprintf(cmd, sizeof cmd, "chmod 755 '%s/%s/sm_80'", f->root,
           FJ_VERSION_STRING);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(access(path, F_OK), 0);
}

/* An entry that cannot be evicted says why, in the caller's buffer; one
 * already gone is no failure and leaves the buffer alone. */
static void test_evict_failure_says_why(void **state) {
  fixture *f = *state;
  char dir[600], aa[700], cmd[1500], err[1200] = "untouched";
  fjc_key key;
  assert_int_equal(fjc_key_from_hex("ab000000000000000000000000000000", &key),
                   0);
  assert_int_equal(fjc_entry_evict(f->store, FJ_VERSION_STRING, "sm_80", &key,
                                   err, sizeof err),
                   0);
  assert_string_equal(err, "untouched");
  /* <aa> is a file, not a directory: the entry cannot be reached. */
  snprintf(dir, sizeof dir, "%s/%s/sm_80", f->root, FJ_VERSION_STRING);
  snprintf(aa, sizeof aa, "%s/ab", dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s' && touch '%s'", dir, aa);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(fjc_entry_evict(f->store, FJ_VERSION_STRING, "sm_80", &key,
                                   err, sizeof err),
                   -1);
  assert_non_null(strstr(err, aa));
  assert_non_null(strstr(err, "Not a directory"));
  assert_int_equal(
      fjc_entry_evict(f->store, "a/b", "sm_80", &key, err, sizeof err), -1);
  assert_non_null(strstr(err, "invalid argument"));
}

static void test_meta_string(void **state) {
  (void)state;
  char out[64];
  const char *j =
      "{ \"a\": 1.5e3, \"b\": [1, {\"name\": \"no\"}, \"]\"], \"c\": true,"
      "\"name\" : \"fj\\\"x\\\\y\\n\\u0041\", \"source_key\": \"abc\", "
      "\"nvrtc\": \"13.0\", \"n\": null }";
  assert_int_equal(fjc_meta_string(j, strlen(j), "name", out, sizeof out), 0);
  assert_string_equal(out, "fj\"x\\y\nA");
  assert_int_equal(fjc_meta_string(j, strlen(j), "nvrtc", out, sizeof out), 0);
  assert_string_equal(out, "13.0");
  assert_int_equal(
      fjc_meta_string(j, strlen(j), "source_key", out, sizeof out), 0);
  assert_string_equal(out, "abc");
  assert_int_equal(fjc_meta_string(j, strlen(j), "a", out, sizeof out), -1);
  assert_int_equal(fjc_meta_string(j, strlen(j), "zz", out, sizeof out), -1);
  assert_string_equal(out, "");
  /* Truncated output stays terminated; bad input never overruns. */
  assert_int_equal(fjc_meta_string(j, strlen(j), "name", out, 4), 0);
  assert_string_equal(out, "fj\"");
  assert_int_equal(fjc_meta_string("{\"name\": \"abc", 13, "name", out,
                                   sizeof out),
                   -1);
  assert_int_equal(fjc_meta_string("[1]", 3, "name", out, sizeof out), -1);
  assert_int_equal(fjc_meta_string("", 0, "name", out, sizeof out), -1);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_list),
      T(test_list_stops_and_handles_empty),
      T(test_verify_finds_corrupt_entry),
      T(test_verify_leaves_foreign_format),
      T(test_clear),
      T(test_entry_check_fd),
      T(test_meta_string),
      T(test_walkers_do_not_follow_symlinks),
      T(test_aliases_list_verify_clear),
      T(test_walk_failures_are_errors),
      T(test_evict_failure_says_why),
      T(test_shipped_store_ignores_fault_variable),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
