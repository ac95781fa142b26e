/*
 * util/errmsg.c: a failure's message into the caller's buffer (see
 * errmsg.h).
 */
#include "util/errmsg.h"

#include <stdarg.h>
#include <stdio.h>

static void format(char *err, size_t errlen, const char *fmt, va_list ap) {
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
}

void fju_errmsg(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  format(err, errlen, fmt, ap);
  va_end(ap);
}

fj_status fju_fail(char *err, size_t errlen, fj_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  format(err, errlen, fmt, ap);
  va_end(ap);
  return st;
}
