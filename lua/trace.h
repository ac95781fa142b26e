/*
 * lua/trace.h: traced values and the DSL globals.
 *
 * A traced value is a full userdata holding a graph node id; its metatable
 * turns Lua arithmetic into graph nodes and turns every operator Lua would
 * silently get wrong on a userdata (comparisons, indexing, calls) into an
 * error naming the spec's line and the helper to use. A buffer is a second
 * kind of userdata, indexable by a traced i32 (`doc[q]` -> a LOAD node).
 *
 * Everything here runs inside the sandbox; errors are Lua errors that begin
 * with "chunk:line: " (the first frame outside the prelude).
 */
#ifndef FJL_TRACE_H
#define FJL_TRACE_H

#include <lua.h>

#include "gen/graph.h"
#include "lua/state.h"

typedef struct fjl_tracer {
  fjg_graph *g; /* borrowed; outlives the Lua state */
} fjl_tracer;

/* lua_CFunction: expects the fjl_tracer as a light userdata argument; creates
 * the metatables and sets the DSL globals (lt le gt ge eq ne where, the math
 * functions, logical_and logical_or logical_not, param, buffer, and the size
 * symbols B Hq Hkv Lq Lk). Call it through lua_pcall. */
int fjl_open_dsl(lua_State *L);

/* Pushes a new traced value for `node`. */
void fjl_push_traced(lua_State *L, int node);

/* Node id of the traced value at idx, or -1 when it is not one. */
int fjl_traced_node(lua_State *L, int idx);

/* The node of the value at idx: a traced value's own node, or a constant for
 * a plain integer (i32; an error outside int32), float (f32) or boolean.
 * Raises "chunk:line: ..." for anything else or when the graph refuses. */
int fjl_to_node(lua_State *L, fjg_graph *g, int idx);

/* 1 when the value at idx is a buffer object. */
int fjl_is_buffer(lua_State *L, int idx);

/* Describes the value at idx for messages: "number", "traced i32", ... */
const char *fjl_describe(lua_State *L, fjg_graph *g, int idx);

#endif /* FJL_TRACE_H */
