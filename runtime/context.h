/*
 * runtime/context.h: internals of fj_context and fj_spec shared by the
 * library's own modules, the CLI and the tests (not part of the public API).
 */
#ifndef FJR_CONTEXT_H
#define FJR_CONTEXT_H

#include <stdarg.h>

#include "flexjit.h"
#include "gen/graph.h"
#include "runtime/driver.h"

/* The spec's traced graph (borrowed; lives with spec). */
const fjg_graph *fjr_spec_graph(const fj_spec *spec);
/* Loads the driver, retains the primary context of the context's device and
 * makes it current on the calling thread. Idempotent; cheap after the first
 * call. On failure the context's last error says why. */
fj_status fjr_context_device(fj_context *ctx, const fjr_driver **drv);

/* The target architecture this context compiles for ("sm_90a", ...): the
 * option, else the device's (which loads the driver), else FJ_ENODRIVER. */
fj_status fjr_context_arch(fj_context *ctx, const char **arch);

/* Records a failure: sets the context's last error to the formatted message
 * and returns `status`, so callers can `return fjr_fail(ctx, FJ_EINVAL, ...)`. */
fj_status fjr_fail(fj_context *ctx, fj_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sends a message to the context's log callback, if any. */
void fjr_log(fj_context *ctx, fj_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* FJR_CONTEXT_H */
