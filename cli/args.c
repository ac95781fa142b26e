/*
 * cli/args.c: the parsing helpers every subcommand uses (see cli/cli.h).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

void cli_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, cmd ? "flexjit %s: " : "flexjit: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
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
