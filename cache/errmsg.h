/*
 * cache/errmsg.h: writing a failure's message into the caller's buffer, the
 * way every cache/ function that can fail reports why (char *err, size_t
 * errlen). The bottom layer of cache/: it uses no other cache/ module.
 */
#ifndef FJC_ERRMSG_H
#define FJC_ERRMSG_H

#include <stddef.h>

/* Formats the message into err, truncated to errlen - 1 bytes and
 * NUL-terminated; a NULL err or a zero errlen is a no-op (the caller wants
 * the status only). */
void fjc_errmsg(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* FJC_ERRMSG_H */
