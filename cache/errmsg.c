/*
 * cache/errmsg.c: a failure's message into the caller's buffer (see
 * errmsg.h).
 */
#include "cache/errmsg.h"

#include <stdarg.h>
#include <stdio.h>

void fjc_errmsg(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  if (!err || !errlen)
    return;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}
