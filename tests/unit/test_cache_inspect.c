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
  if (fjc_store_open(f->root, NULL, NULL, &f->store, err, sizeof err))
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
    assert_int_equal(fjc_store_put(f->store, archs[i], &f->keys[i], f->cubin,
                                   sizeof f->cubin - (size_t)i,
                                   i == 3 ? NULL : meta, NULL, 0),
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
  assert_int_equal(fjc_store_list(f->store, remember, &s), FJ_OK);
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
  assert_int_equal(fjc_store_list(f->store, stop_at_first, &calls), FJ_OK);
  assert_int_equal(calls, 0);
  put_all(f);
  assert_int_equal(fjc_store_list(f->store, stop_at_first, &calls), FJ_OK);
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
  assert_int_equal(fjc_store_verify(f->store, 0, note_bad, &bad, &rep), FJ_OK);
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
  assert_int_equal(fjc_store_verify(f->store, 0, note_bad, &bad, &rep), FJ_OK);
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
  assert_int_equal(fjc_store_verify(f->store, 1, NULL, NULL, &rep), FJ_OK);
  assert_int_equal(rep.bad, 2);
  assert_int_equal(rep.removed, 2);
  assert_int_equal(rep.stale_temps, 1);
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(access(other, F_OK), -1);
  assert_int_equal(access(tmp_old, F_OK), -1);
  assert_int_equal(access(tmp_new, F_OK), 0);
  assert_int_equal(fjc_store_verify(f->store, 0, NULL, NULL, &rep), FJ_OK);
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
  assert_int_equal(fjc_store_verify(f->store, 1, NULL, NULL, &rep), FJ_OK);
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
  assert_int_equal(fjc_store_lock(f->store, "sm_80", &f->keys[0], &fd), FJ_OK);
  fjc_store_unlock(fd);
  snprintf(keep, sizeof keep, "%s/notes.txt", f->root);
  write_file(keep, "mine", 4);
  assert_int_equal(fjc_store_clear(f->store, &removed, &bytes), FJ_OK);
  assert_int_equal(removed, 4);
  assert_true(bytes >= 4 * 48 + 4 * sizeof f->cubin - 6);
  assert_int_equal(access(keep, F_OK), 0);
  snprintf(path, sizeof path, "%s/%s", f->root, FJ_VERSION_STRING);
  assert_int_equal(access(path, F_OK), -1); /* empty directories went too */
  seen s = {0};
  assert_int_equal(fjc_store_list(f->store, remember, &s), FJ_OK);
  assert_int_equal(s.n, 0);
}

static void test_entry_check_file(void **state) {
  fixture *f = *state;
  char path[1024];
  uint8_t key[16];
  int foreign = -1;
  put_all(f);
  entry_path(f, 0, path, sizeof path);
  assert_null(fjc_entry_check_file(path, NULL, key, &foreign));
  assert_int_equal(foreign, 0);
  assert_memory_equal(key, f->keys[0].bytes, 16);
  assert_null(fjc_entry_check_file(path, &f->keys[0], NULL, &foreign));
  assert_non_null(fjc_entry_check_file(path, &f->keys[1], NULL, &foreign));
  assert_non_null(fjc_entry_check_file("/nonexistent/x.cubin", NULL, NULL,
                                       &foreign));
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
      T(test_entry_check_file),
      T(test_meta_string),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
