/*
 * lua/spec.h: running a spec and tracing its mods into a graph.
 *
 * This is the lua/ module's entry point for the rest of the library
 * (fj_spec_load_file reads the file and passes the buffer; fj_spec_load_string
 * passes its arguments through).
 */
#ifndef FJL_SPEC_H
#define FJL_SPEC_H

#include <stddef.h>

#include "flexjit.h"
#include "gen/graph.h"
#include "lua/state.h"

/*
 * Runs the Lua source `source` (len bytes, need not be NUL-terminated) in a
 * fresh sandbox with the prelude loaded, and traces the returned table's
 * mask_mod(b, h, q, kv) and/or score_mod(score, b, h, q, kv) into a new
 * graph. `chunkname` names the source in messages ("spec.lua" or "@spec.lua"
 * gives "spec.lua:3: ..."); NULL means "spec".
 *
 * On success: *out_graph is owned by the caller (fjg_graph_destroy);
 * *out_name (if out_name is not NULL) is a malloc'd string owned by the
 * caller: the spec's `name` field (refused unless it is printable UTF-8
 * without control characters), or the chunk name as messages show it
 * (control characters and invalid UTF-8 escaped) when the spec has none.
 * On failure: nothing is returned, err holds "chunk:line: message" and the
 * status is FJ_ELUA (any error in or about the Lua code, including the
 * sandbox limits), FJ_ENOMEM or FJ_EINVAL (NULL arguments).
 * The Lua state is closed before returning. Thread-safe: no shared state.
 */
fj_status fjl_trace_spec(const char *source, size_t len, const char *chunkname,
                         fjg_graph **out_graph, char **out_name, char *err,
                         size_t errlen);

/* Same, with explicit sandbox limits (NULL: the defaults of state.h). */
fj_status fjl_trace_spec_ex(const char *source, size_t len,
                            const char *chunkname, const fjl_limits *limits,
                            fjg_graph **out_graph, char **out_name, char *err,
                            size_t errlen);

/* The embedded prelude file `name` ("prelude.lua"), or NULL; its length in
 * *len when len is not NULL. Static storage. */
const char *fjl_prelude_source(const char *name, size_t *len);

#endif /* FJL_SPEC_H */
