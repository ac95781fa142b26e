/*
 * util/errmsg.h: writing a failure's message into the caller's buffer
 * (char *err, size_t errlen), the way the functions of gen/, cache/ and
 * runtime/ that take no context report why they failed. The library's
 * bottom layer: it uses nothing else of the library.
 */
#ifndef FJU_ERRMSG_H
#define FJU_ERRMSG_H

#include <stddef.h>

#include "flexjit.h"

/* Formats the message into err, truncated to errlen - 1 bytes and
 * NUL-terminated; a NULL err or a zero errlen is a no-op (the caller wants
 * the status only). */
void fju_errmsg(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The same, returning st: `return fju_fail(err, errlen, FJ_EINVAL, ...)`. */
fj_status fju_fail(char *err, size_t errlen, fj_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* FJU_ERRMSG_H */
