/*
 * cli/args.c: the parsing helpers every subcommand uses (see cli/cli.h).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

/* One fputs per message, so lines of threads that log at once (demo,
 * precompile) do not interleave. */
void cli_error(const char *cmd, const char *fmt, ...) {
  char msg[8192];
  int n = snprintf(msg, sizeof msg, cmd ? "flexjit %s: " : "flexjit: ", cmd);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < sizeof msg - 1)
    vsnprintf(msg + n, sizeof msg - 1 - (size_t)n, fmt, ap);
  va_end(ap);
  strcat(msg, "\n");
  fputs(msg, stderr);
}

void cli_log(void *cmd, fj_log_level level, const char *msg) {
  if (level < FJ_LOG_WARN) return;
  cli_error(cmd, "%s: %s", level >= FJ_LOG_ERROR ? "error" : "warning", msg);
}

int cli_check_output_dir(const char *dir, int parents, char *err,
                         size_t errlen) {
  char path[4096];
  struct stat st;
  int missing = 0;
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
    snprintf(err, errlen, "%s: path too long", dir);
    return -1;
  }
  for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--)
    path[n - 1] = '\0';
  /* The nearest existing folder on the way up decides. */
  while (stat(path, &st) != 0) {
    char *slash = strrchr(path, '/');
    if (errno != ENOENT || (missing && !parents)) {
      snprintf(err, errlen, "%s: %s", path, strerror(errno));
      return -1;
    }
    missing = 1;
    if (!slash) {
      snprintf(path, sizeof path, ".");
    } else {
      while (slash > path && slash[-1] == '/') slash--;
      *(slash == path ? slash + 1 : slash) = '\0';
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s: %s", path, strerror(ENOTDIR));
    return -1;
  }
  if (access(path, W_OK | X_OK) != 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

int cli_parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (!*s || *end || errno || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int cli_parse_float(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno || !isfinite(v)) return -1;
  *out = v;
  return 0;
}

int cli_opt_value(int argc, char **argv, int *i, const char *name,
                  const char **value) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0) return 0;
  if (a[n] == '=') {
    *value = a + n + 1;
    return 1;
  }
  if (a[n] != '\0') return 0;
  if (*i + 1 >= argc) return -1;
  *value = argv[++*i];
  return 1;
}

int cli_is_help(const char *arg) {
  return !strcmp(arg, "--help") || !strcmp(arg, "-h");
}

int cli_split_assign(const char *s, char *name, size_t namelen,
                     const char **value) {
  const char *eq = strchr(s, '=');
  if (!eq || eq == s || (size_t)(eq - s) >= namelen) return -1;
  memcpy(name, s, (size_t)(eq - s));
  name[eq - s] = '\0';
  *value = eq + 1;
  return 0;
}
