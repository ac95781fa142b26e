/*
 * tests/unit/test_pack.c: .fjpack writing, mounting and lookup
 * (cache/pack.c), including corrupt headers, indexes and blobs.
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
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/key.h"
#include "cache/pack.h"

#define HEADER 64
#define RECORD 256

typedef struct fixture {
  char dir[256];
  char path[300];
  int warnings;
  char last[1024];
  unsigned char blobs[3][5000];
  fjc_key src[3], full[3];
} fixture;

static void count_log(void *user, fj_log_level level, const char *msg) {
  fixture *f = user;
  if (level >= FJ_LOG_WARN)
    f->warnings++;
  snprintf(f->last, sizeof f->last, "%s", msg);
}

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static void make_key(const char *tag, int i, fjc_key *k) {
  fjc_key_builder b;
  fjc_key_begin(&b);
  fjc_key_add_int(&b, tag, i);
  fjc_key_finish(&b, k);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/fj-pack-XXXXXX");
  if (!mkdtemp(f->dir))
    return -1;
  snprintf(f->path, sizeof f->path, "%s/kernels.fjpack", f->dir);
  for (int i = 0; i < 3; i++) {
    for (size_t j = 0; j < sizeof f->blobs[i]; j++)
      f->blobs[i][j] = (unsigned char)(j * (i + 3) + i);
    make_key("source", i, &f->src[i]);
    make_key("full", i, &f->full[i]);
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  nftw(f->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(f);
  return 0;
}

static fjc_pack_entry entry(const fixture *f, int i, int src, const char *arch,
                            const char *nvrtc, size_t size) {
  fjc_pack_entry e;
  memset(&e, 0, sizeof e);
  e.source_key = f->src[src];
  e.full_key = f->full[i];
  snprintf(e.arch, sizeof e.arch, "%s", arch);
  snprintf(e.nvrtc, sizeof e.nvrtc, "%s", nvrtc);
  snprintf(e.name, sizeof e.name, "fj_fwd_k%d_%s", i, arch);
  e.data = f->blobs[i];
  e.size = size;
  return e;
}

/* Entries: 0 (src 0, sm_80, 12.8), 1 (src 0, sm_80, 13.0: the same source
 * built by a newer NVRTC), 2 (src 2, sm_90a, 13.0, odd size). */
static void write_pack(fixture *f) {
  fjc_pack_writer *w = NULL;
  char err[512];
  fjc_pack_entry e[3] = {entry(f, 0, 0, "sm_80", "12.8", 5000),
                         entry(f, 1, 0, "sm_80", "13.0", 4000),
                         entry(f, 2, 2, "sm_90a", "13.0", 1234)};
  assert_int_equal(fjc_pack_writer_open(f->path, &w, err, sizeof err), FJ_OK);
  for (int i = 0; i < 3; i++)
    assert_int_equal(fjc_pack_writer_add(w, &e[i], err, sizeof err), FJ_OK);
  /* The same (full key, arch) again is skipped. */
  assert_int_equal(fjc_pack_writer_add(w, &e[1], err, sizeof err), FJ_OK);
  assert_int_equal(fjc_pack_writer_count(w), 3);
  /* Not published before finish. */
  assert_int_equal(access(f->path, F_OK), -1);
  assert_int_equal(fjc_pack_writer_finish(w, err, sizeof err), FJ_OK);
}

static fjc_pack *open_ok(fixture *f) {
  fjc_pack *p = NULL;
  char err[512] = "";
  fj_status st = fjc_pack_open(f->path, &p, err, sizeof err);
  if (st != FJ_OK)
    fail_msg("fjc_pack_open: %s", err);
  fjc_pack_set_log(p, count_log, f);
  return p;
}

static void expect_open_error(fixture *f, const char *what) {
  fjc_pack *p = (fjc_pack *)1;
  char err[512] = "";
  assert_int_equal(fjc_pack_open(f->path, &p, err, sizeof err), FJ_ECACHE);
  assert_null(p);
  assert_non_null(strstr(err, f->path));
  if (!strstr(err, what))
    fail_msg("error '%s' does not mention '%s'", err, what);
}

static void test_round_trip(void **state) {
  fixture *f = *state;
  void *data;
  size_t size;
  const char *name;
  write_pack(f);
  fjc_pack *p = open_ok(f);
  assert_int_equal(fjc_pack_count(p), 3);
  assert_string_equal(fjc_pack_path(p), f->path);

  fjc_pack_entry e;
  assert_int_equal(fjc_pack_entry_at(p, 2, &e), FJ_OK);
  assert_string_equal(e.arch, "sm_90a");
  assert_string_equal(e.nvrtc, "13.0");
  assert_string_equal(e.name, "fj_fwd_k2_sm_90a");
  assert_string_equal(e.full_key.hex, f->full[2].hex);
  assert_string_equal(e.source_key.hex, f->src[2].hex);
  assert_int_equal(e.size, 1234);
  assert_int_equal(e.offset % 64, 0); /* blobs are aligned */
  assert_null(e.data);
  assert_int_equal(fjc_pack_entry_at(p, 3, &e), FJ_EINVAL);

  for (int i = 0; i < 3; i++) {
    const char *arch = i == 2 ? "sm_90a" : "sm_80";
    assert_int_equal(fjc_pack_find(p, arch, &f->full[i], &f->src[i], &data,
                                   &size, &name),
                     FJ_OK);
    assert_int_equal(size, i == 0 ? 5000 : i == 1 ? 4000 : 1234);
    assert_memory_equal(data, f->blobs[i], size);
    free(data);
    assert_null(fjc_pack_check_blob(p, i));
  }
  assert_string_equal(name, "fj_fwd_k2_sm_90a");
  /* The exact target only: sm_90a's kernel is not sm_90's. */
  assert_int_equal(fjc_pack_find(p, "sm_90", &f->full[2], NULL, &data, &size,
                                 NULL),
                   FJ_ENOTFOUND);
  assert_null(data);
  /* An unknown full key misses, even when its source key is present. */
  fjc_key other;
  make_key("other", 0, &other);
  assert_int_equal(fjc_pack_find(p, "sm_80", &other, &f->src[0], &data, &size,
                                 NULL),
                   FJ_ENOTFOUND);
  assert_int_equal(f->warnings, 0);
  fjc_pack_close(p);
}

static void test_find_by_source_key_without_nvrtc(void **state) {
  fixture *f = *state;
  void *data;
  size_t size;
  const char *name;
  write_pack(f);
  fjc_pack *p = open_ok(f);
  /* Two builds of source 0: the newest NVRTC's wins. */
  assert_int_equal(
      fjc_pack_find(p, "sm_80", NULL, &f->src[0], &data, &size, &name),
      FJ_OK);
  assert_int_equal(size, 4000);
  assert_memory_equal(data, f->blobs[1], size);
  free(data);
  assert_string_equal(name, "fj_fwd_k1_sm_80");
  assert_int_equal(
      fjc_pack_find(p, "sm_90a", NULL, &f->src[2], &data, &size, NULL),
      FJ_OK);
  assert_int_equal(size, 1234);
  free(data);
  assert_int_equal(
      fjc_pack_find(p, "sm_80", NULL, &f->src[2], &data, &size, NULL),
      FJ_ENOTFOUND);
  assert_int_equal(fjc_pack_find(p, "sm_80", NULL, NULL, &data, &size, NULL),
                   FJ_EINVAL);
  fjc_pack_close(p);
}

static void patch(const char *path, long at, const void *bytes, size_t n) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, bytes, n, at), (ssize_t)n);
  close(fd);
}

static long file_size(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return (long)st.st_size;
}

static void test_corrupt_blob_is_a_miss(void **state) {
  fixture *f = *state;
  void *data;
  size_t size;
  write_pack(f);

  /* Corrupt entry 1's blob (the newest build of source 0) on disk; the
   * first blob starts right after the header. */
  fjc_pack *p = open_ok(f);
  fjc_pack_entry e0, e1;
  assert_int_equal(fjc_pack_entry_at(p, 0, &e0), FJ_OK);
  assert_int_equal(fjc_pack_entry_at(p, 1, &e1), FJ_OK);
  long blob1 = (long)e1.offset;
  assert_int_equal(e0.offset, HEADER); /* the first blob follows the header */
  fjc_pack_close(p);
  unsigned char x = 0xff;
  patch(f->path, blob1 + 100, &x, 1);

  p = open_ok(f); /* blobs are not checked at mount time */
  assert_non_null(fjc_pack_check_blob(p, 1));
  assert_int_equal(fjc_pack_find(p, "sm_80", &f->full[1], NULL, &data, &size,
                                 NULL),
                   FJ_ENOTFOUND);
  assert_null(data);
  assert_int_equal(f->warnings, 1);
  assert_non_null(strstr(f->last, "fj_fwd_k1_sm_80"));
  assert_non_null(strstr(f->last, f->path));
  /* By source key, the older sound build is used instead. */
  assert_int_equal(
      fjc_pack_find(p, "sm_80", NULL, &f->src[0], &data, &size, NULL), FJ_OK);
  assert_int_equal(size, 5000);
  assert_memory_equal(data, f->blobs[0], 5000);
  free(data);
  assert_int_equal(f->warnings, 2);
  fjc_pack_close(p);
}

/* Builds of one source whose NVRTC versions are not numbers (a pack crafted
 * or damaged with its index checksum mended), all with corrupt blobs: the
 * lookup tries each once and misses. With a comparison of versions that is
 * not an order (under which these three could each rank above the next, in a
 * ring) the lookup would go round them for ever. */
static void test_corrupt_blobs_of_odd_versions_end(void **state) {
  fixture *f = *state;
  fjc_pack_writer *w = NULL;
  char err[512];
  void *data;
  size_t size;
  fjc_pack_entry e[3] = {entry(f, 0, 0, "sm_80", "13.0sm_80", 5000),
                         entry(f, 1, 0, "sm_80", "13.\xfe\xff\xff\xff", 4000),
                         entry(f, 2, 0, "sm_80", "13.\xff" "0", 1234)};
  assert_int_equal(fjc_pack_writer_open(f->path, &w, err, sizeof err), FJ_OK);
  for (int i = 0; i < 3; i++)
    assert_int_equal(fjc_pack_writer_add(w, &e[i], err, sizeof err), FJ_OK);
  assert_int_equal(fjc_pack_writer_finish(w, err, sizeof err), FJ_OK);
  fjc_pack *p = open_ok(f);
  long at[3];
  for (int i = 0; i < 3; i++) {
    fjc_pack_entry x;
    assert_int_equal(fjc_pack_entry_at(p, i, &x), FJ_OK);
    at[i] = (long)x.offset;
  }
  fjc_pack_close(p);
  unsigned char bad = 0xff;
  for (int i = 0; i < 3; i++)
    patch(f->path, at[i] + 10, &bad, 1);
  p = open_ok(f);
  assert_int_equal(
      fjc_pack_find(p, "sm_80", NULL, &f->src[0], &data, &size, NULL),
      FJ_ENOTFOUND);
  assert_null(data);
  assert_int_equal(f->warnings, 3);
  fjc_pack_close(p);
}

static void test_corrupt_header_is_an_error_at_mount(void **state) {
  fixture *f = *state;
  unsigned char orig[HEADER];
  write_pack(f);
  long size = file_size(f->path);
  FILE *fp = fopen(f->path, "rb");
  assert_int_equal(fread(orig, 1, HEADER, fp), HEADER);
  fclose(fp);

  patch(f->path, 0, "FJPACK99", 8);
  expect_open_error(f, "bad magic");
  patch(f->path, 0, orig, HEADER);

  unsigned char count[8] = {200, 0, 0, 0, 0, 0, 0, 0};
  patch(f->path, 16, count, 8);
  expect_open_error(f, "header checksum");
  patch(f->path, 0, orig, HEADER);

  /* An index byte: caught by the index checksum. */
  unsigned char x = 0x55;
  patch(f->path, size - RECORD + 40, &x, 1);
  expect_open_error(f, "index checksum");
  patch(f->path, 0, orig, HEADER);

  /* Truncation and trailing junk. */
  assert_int_equal(truncate(f->path, size - 10), 0);
  expect_open_error(f, "truncated");
  assert_int_equal(truncate(f->path, size + 10), 0);
  expect_open_error(f, "trailing");
  assert_int_equal(truncate(f->path, 20), 0);
  expect_open_error(f, "too short");
  assert_int_equal(truncate(f->path, 0), 0);
  expect_open_error(f, "too short");

  fjc_pack *p = (fjc_pack *)1;
  char err[512];
  char missing[400];
  snprintf(missing, sizeof missing, "%s/none.fjpack", f->dir);
  assert_int_equal(fjc_pack_open(missing, &p, err, sizeof err), FJ_EIO);
  assert_null(p);
  assert_non_null(strstr(err, "none.fjpack"));
  /* A directory is not a pack, and says so. */
  p = (fjc_pack *)1;
  assert_int_equal(fjc_pack_open(f->dir, &p, err, sizeof err), FJ_ECACHE);
  assert_null(p);
  assert_non_null(strstr(err, "is not a regular file"));
}

static void test_writer_failures_leave_nothing(void **state) {
  fixture *f = *state;
  fjc_pack_writer *w = NULL;
  char err[512], bad[400];
  fjc_pack_entry e = entry(f, 0, 0, "sm_80", "13.0", 100);

  snprintf(bad, sizeof bad, "%s/no/such/dir/x.fjpack", f->dir);
  assert_int_equal(fjc_pack_writer_open(bad, &w, err, sizeof err), FJ_EIO);
  assert_null(w);
  assert_non_null(strstr(err, "no/such/dir"));

  assert_int_equal(fjc_pack_writer_open(f->path, &w, err, sizeof err), FJ_OK);
  fjc_pack_entry bad_arch = e;
  snprintf(bad_arch.arch, sizeof bad_arch.arch, "../x");
  assert_int_equal(fjc_pack_writer_add(w, &bad_arch, err, sizeof err),
                   FJ_EINVAL);
  fjc_pack_entry empty = e;
  empty.size = 0;
  assert_int_equal(fjc_pack_writer_add(w, &empty, err, sizeof err), FJ_EINVAL);
  assert_int_equal(fjc_pack_writer_add(w, &e, err, sizeof err), FJ_OK);
  fjc_pack_writer_abort(w);
  /* Neither the pack nor its temp file remains. */
  DIR *d = opendir(f->dir);
  struct dirent *de;
  int files = 0;
  while ((de = readdir(d)))
    files += de->d_name[0] != '.';
  closedir(d);
  assert_int_equal(files, 0);
  fjc_pack_writer_abort(NULL);
}

static void test_empty_pack(void **state) {
  fixture *f = *state;
  fjc_pack_writer *w = NULL;
  char err[512];
  void *data;
  size_t size;
  assert_int_equal(fjc_pack_writer_open(f->path, &w, err, sizeof err), FJ_OK);
  assert_int_equal(fjc_pack_writer_finish(w, err, sizeof err), FJ_OK);
  assert_int_equal(file_size(f->path), HEADER);
  fjc_pack *p = open_ok(f);
  assert_int_equal(fjc_pack_count(p), 0);
  assert_int_equal(fjc_pack_find(p, "sm_80", &f->full[0], NULL, &data, &size,
                                 NULL),
                   FJ_ENOTFOUND);
  fjc_pack_close(p);
  fjc_pack_close(NULL);
}

/* Replaces the pack's bytes in place, as `cp other.fjpack live.fjpack`
 * does: the same file (inode), truncated and rewritten. */
static void overwrite_in_place(const char *path, const char *with) {
  unsigned char buf[1 << 15];
  FILE *in = fopen(with, "rb");
  assert_non_null(in);
  size_t n = fread(buf, 1, sizeof buf, in);
  fclose(in);
  int fd = open(path, O_WRONLY | O_TRUNC);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, buf, n), (ssize_t)n);
  close(fd);
}

/* Runs the lookups of a mounted pack whose file changed in a child, so a
 * signal (a fault on a mapping) fails the test instead of killing it.
 * The child exits 0 when every lookup missed with a warning (or, for
 * entries still intact, found their true bytes). */
static void expect_changed_pack_is_a_miss(fixture *f, fjc_pack *p) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGBUS, SIG_DFL); /* cmocka's handlers would hide the signal */
    signal(SIGSEGV, SIG_DFL);
    for (int i = 0; i < 3; i++) {
      void *data = NULL;
      size_t size = 0;
      const char *arch = i == 2 ? "sm_90a" : "sm_80";
      fj_status st = fjc_pack_find(p, arch, &f->full[i], NULL, &data, &size,
                                   NULL);
      if (st == FJ_OK && memcmp(data, f->blobs[i], size) != 0)
        _exit(20 + i);
      free(data);
      if (st != FJ_OK && st != FJ_ENOTFOUND)
        _exit(30 + i);
      if (fjc_pack_check_blob(p, i) == NULL && st != FJ_OK)
        _exit(40 + i);
    }
    _exit(f->warnings > 0 ? 0 : 50);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status))
    fail_msg("the lookup died of signal %d (%s)", WTERMSIG(status),
             strsignal(WTERMSIG(status)));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* A host must not crash when a mounted pack is overwritten in place (with
 * another, smaller pack) or truncated: the lookups miss with a warning. */
static void test_pack_changed_under_a_mount(void **state) {
  fixture *f = *state;
  char other[400];
  write_pack(f);
  /* Another pack, much smaller: one short entry. */
  snprintf(other, sizeof other, "%s/other.fjpack", f->dir);
  {
    fjc_pack_writer *w = NULL;
    char err[512];
    fjc_pack_entry e = entry(f, 2, 2, "sm_90a", "13.0", 100);
    assert_int_equal(fjc_pack_writer_open(other, &w, err, sizeof err), FJ_OK);
    assert_int_equal(fjc_pack_writer_add(w, &e, err, sizeof err), FJ_OK);
    assert_int_equal(fjc_pack_writer_finish(w, err, sizeof err), FJ_OK);
  }
  fjc_pack *p = open_ok(f);
  overwrite_in_place(f->path, other);
  expect_changed_pack_is_a_miss(f, p);
  fjc_pack_close(p);

  assert_int_equal(unlink(f->path), 0);
  write_pack(f);
  p = open_ok(f);
  assert_int_equal(truncate(f->path, HEADER + 100), 0);
  expect_changed_pack_is_a_miss(f, p);
  assert_int_equal(truncate(f->path, 0), 0);
  expect_changed_pack_is_a_miss(f, p);
  fjc_pack_close(p);

  /* Replaced by rename (the safe way): the mount keeps the old file. */
  assert_int_equal(unlink(f->path), 0);
  write_pack(f);
  p = open_ok(f);
  assert_int_equal(rename(other, f->path), 0);
  void *data = NULL;
  size_t size = 0;
  assert_int_equal(fjc_pack_find(p, "sm_80", &f->full[0], NULL, &data, &size,
                                 NULL),
                   FJ_OK);
  assert_int_equal(size, 5000);
  assert_memory_equal(data, f->blobs[0], size);
  free(data);
  assert_int_equal(f->warnings, 0);
  fjc_pack_close(p);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_round_trip),
      T(test_find_by_source_key_without_nvrtc),
      T(test_corrupt_blob_is_a_miss),
      T(test_corrupt_blobs_of_odd_versions_end),
      T(test_corrupt_header_is_an_error_at_mount),
      T(test_writer_failures_leave_nothing),
      T(test_empty_pack),
      T(test_pack_changed_under_a_mount),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
