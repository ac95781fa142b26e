/*
 * runtime/dl.h: shared libraries loaded at run time (libcuda, NVRTC), each
 * loaded once per process and path and never unloaded.
 *
 * A library is named by a list of candidate paths (the caller's choice, or
 * its defaults) tried in order; the first that loads is kept. `init` then
 * fills the caller's table of entry points from the handle (and may call
 * into the library, e.g. cuInit). The result, success or failure with its
 * message, is remembered under the kind and the first candidate, so a
 * second context that names the same library shares the table, and one that
 * names another library gets its own. Tables are immutable once loaded:
 * readers need no lock. Thread-safe.
 */
#ifndef FJR_DL_H
#define FJR_DL_H

#include <stddef.h>

#include "flexjit.h"

/* Fills `table` from `handle` (the library `lib`); 0, or -1 with a message
 * in err. */
typedef int (*fjr_dl_init_fn)(void *handle, const char *lib, void *table,
                              char *err, size_t errlen);

/* Resolves `name` in `handle` into *slot (a function pointer's storage);
 * 0, or -1 with "<lib> lacks <name>" in err. */
int fjr_dl_sym(void *handle, const char *lib, const char *name, void *slot,
               char *err, size_t errlen);

/*
 * Loads the library of `kind` ("libcuda", "NVRTC"). candidates: n paths
 * tried in order. On success *table points to a table of table_size bytes
 * that init filled, valid for the life of the process. On failure returns
 * fail_status with the reason in err (the paths tried and the first
 * loader error, or init's message); FJ_ENOMEM.
 */
fj_status fjr_dl_load(const char *kind, const char *const *candidates, int n,
                      fjr_dl_init_fn init, size_t table_size,
                      fj_status fail_status, const void **table, char *err,
                      size_t errlen);

#endif /* FJR_DL_H */
