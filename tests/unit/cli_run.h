/*
 * tests/unit/cli_run.h: running the `flexjit` command (FJ_BINARY_DIR/flexjit)
 * as a separate process from a cmocka test, for test_cli and
 * test_blockmask_cli: a private temporary folder, its file paths, and the
 * command's exit status with its stdout and stderr captured in fjt_out and
 * fjt_err. Commands that must behave as on a machine without a GPU run with
 * NO_GPU in front, so a test means the same on a GPU host; commands that
 * must meet a read-only directory run as another user when the test runs as
 * root (fjt_flexjit_unprivileged).
 * Include after <cmocka.h>; needs FJ_BINARY_DIR.
 */
#ifndef FJ_TESTS_CLI_RUN_H
#define FJ_TESTS_CLI_RUN_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/other_user.h"

#define NO_GPU "CUDA_VISIBLE_DEVICES= "

static char fjt_tmpdir[256];
static char fjt_out[1 << 20], fjt_err[65536];

/* A fresh TMPDIR/<prefix>.XXXXXX for this test program; 0 or -1. */
static int fjt_make_tmpdir(const char *prefix) {
  snprintf(fjt_tmpdir, sizeof fjt_tmpdir, "%s/%s.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", prefix);
  return mkdtemp(fjt_tmpdir) ? 0 : -1;
}

static int fjt_remove_tmpdir(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fjt_tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

/* fjt_tmpdir/name, in one of four rotating buffers: copy a path that must
 * outlive the next few calls. */
static const char *fjt_path(const char *name) {
  static char p[4][400];
  static int which;
  which = (which + 1) % 4;
  snprintf(p[which], sizeof p[which], "%s/%s", fjt_tmpdir, name);
  return p[which];
}

static void fjt_slurp_into(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = 0;
  if (f) {
    n = fread(buf, 1, cap - 1, f);
    fclose(f);
  }
  buf[n] = '\0';
}

/* Runs "[env] flexjit ARGS" (env may be NULL); returns the exit status,
 * the output in fjt_out and fjt_err. */
static int fjt_flexjit(const char *env, const char *fmt, ...) {
  char args[4096], cmd[8192], o[400], e[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(o, sizeof o, "%s/stdout", fjt_tmpdir);
  snprintf(e, sizeof e, "%s/stderr", fjt_tmpdir);
  snprintf(cmd, sizeof cmd, "%s'%s/flexjit' %s >'%s' 2>'%s'", env ? env : "",
           FJ_BINARY_DIR, args, o, e);
  int st = system(cmd);
  fjt_slurp_into(o, fjt_out, sizeof fjt_out);
  fjt_slurp_into(e, fjt_err, sizeof fjt_err);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* As fjt_flexjit, but as user nobody when this process is root: root
 * writes into a read-only (0555) directory anyway, so a test of a read-only
 * cache needs another user. The temporary folder becomes traversable. */
static inline int fjt_flexjit_unprivileged(const char *env, const char *fmt, ...) {
  char args[4096], o[400], e[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  if (geteuid() != 0) return fjt_flexjit(env, "%s", args);
  snprintf(o, sizeof o, "%s/stdout", fjt_tmpdir);
  snprintf(e, sizeof e, "%s/stderr", fjt_tmpdir);
  chmod(fjt_tmpdir, 0755);
  for (int i = 0; i < 2; i++) {
    FILE *f = fopen(i ? e : o, "w");
    if (f) fclose(f);
    if (chown(i ? e : o, 65534, 65534) != 0) return -1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (fjt_drop_root() != 0)
      _exit(125);
    _exit(fjt_flexjit(env, "%s", args) & 0xff);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  fjt_slurp_into(o, fjt_out, sizeof fjt_out);
  fjt_slurp_into(e, fjt_err, sizeof fjt_err);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static inline void fjt_expect_not_in(const char *hay, const char *needle) {
  if (strstr(hay, needle))
    fail_msg("did not expect '%s' in:\n%s", needle, hay);
}

static void fjt_expect_in(const char *hay, const char *needle) {
  if (!strstr(hay, needle))
    fail_msg("expected '%s' in:\n%s\n(stderr: %s)", needle, hay, fjt_err);
}

/* Writes text to fjt_tmpdir/name; returns its path (fjt_path's buffer). */
static const char *fjt_write_text(const char *name, const char *text) {
  const char *p = fjt_path(name);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  return p;
}

#endif /* FJ_TESTS_CLI_RUN_H */
