/*
 * runtime/nvrtc.h: NVRTC, loaded at run time and only when a kernel must be
 * compiled.
 *
 * A library is dlopened once per process and path (runtime/dl.h) and its
 * entry points kept in an immutable table, so these functions are safe to
 * call from any thread. Which library: the path the context's options name
 * ($FLEXJIT_NVRTC; one that does not load means NVRTC is unavailable: only
 * cached or packed kernels can be used), else libnvrtc.so.13,
 * libnvrtc.so.12, libnvrtc.so, and finally
 * /usr/local/cuda/lib64/libnvrtc.so.13. There is no link-time dependency on
 * NVRTC.
 */
#ifndef FJR_NVRTC_H
#define FJR_NVRTC_H

#include <stddef.h>

#include "flexjit.h"

typedef struct fjr_nvrtc fjr_nvrtc;

/* Loads NVRTC from path (NULL: the default candidates). FJ_ENONVRTC, with
 * the libraries tried and why in err, when it cannot be loaded. */
fj_status fjr_nvrtc_load(const char *path, const fjr_nvrtc **out, char *err,
                         size_t errlen);

/* Its version. */
void fjr_nvrtc_version(const fjr_nvrtc *nvrtc, int *major, int *minor);

/* 1 when it compiles for sm (80 for sm_80 and sm_80a alike, 90, 100...). */
int fjr_nvrtc_supports(const fjr_nvrtc *nvrtc, int sm);

/* The fixed options every flexjit kernel is compiled with, besides the
 * architecture (static strings; *n receives the count). The caller passes
 * them (and anything else) as extra_opts, and hashes them into the cache key
 * because they shape the cubin. */
const char *const *fjr_nvrtc_base_options(int *n);

/*
 * Compiles CUDA C++ `source` (program name `name`, used in diagnostics) to a
 * cubin for `arch`, a real architecture such as "sm_80" or "sm_90a" (a
 * virtual "compute_XX" would only give PTX: FJ_EINVAL). The options passed to
 * NVRTC are "--gpu-architecture=<arch>" followed by the n_extra strings of
 * extra_opts (may be NULL when n_extra is 0); no include paths are added.
 *
 * On success returns FJ_OK, *cubin (malloc'd, the caller frees) and
 * *cubin_size. If `log` is not NULL, *log receives NVRTC's log (malloc'd,
 * the caller frees) or NULL when the log is empty; this is also done on
 * failure, so the caller can show the compiler's errors.
 * Failures: FJ_ENONVRTC (nvrtc NULL), FJ_ECOMPILE (err holds a one-line
 * summary with the first error line; *log the whole log), FJ_EINVAL, FJ_ENOMEM.
 * The NVRTC program is released on every path.
 */
fj_status fjr_nvrtc_compile(const fjr_nvrtc *nvrtc, const char *source,
                            const char *name,
                            const char *arch, const char *const *extra_opts,
                            int n_extra, void **cubin, size_t *cubin_size,
                            char **log, char *err, size_t errlen);

/* Bytes of spill stores plus spill loads that a ptxas -v report in an
 * NVRTC log names, summed over its functions; 0 with no report, -1 when a
 * report line cannot be read. */
long fjr_nvrtc_log_spill_bytes(const char *log);

#endif /* FJR_NVRTC_H */
