/*
 * lua/spec.c: running a spec in the sandbox and tracing its mods (spec.h).
 */
#include "lua/spec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "gen/derivative.h"
#include "lua/check.h"
#include "lua/trace.h"

/* The prelude, embedded at build time from the .lua files of lua/. */
extern const char *const fjl_prelude_names[];
extern const char *const fjl_prelude_texts[];
extern const size_t fjl_prelude_sizes[];
extern const int fjl_prelude_count;

const char *fjl_prelude_source(const char *name, size_t *len) {
  for (int i = 0; i < fjl_prelude_count; i++) {
    if (strcmp(fjl_prelude_names[i], name) == 0) {
      if (len)
        *len = fjl_prelude_sizes[i];
      return fjl_prelude_texts[i];
    }
  }
  return NULL;
}

/* Pushes "src:line: " for where the function at idx was defined in the
 * spec, or for the spec line whose prelude call built it. */
static void push_definition(lua_State *L, int idx, const char *chunk) {
  lua_Debug ar;
  idx = lua_absindex(L, idx);
  lua_pushvalue(L, idx);
  if (lua_getinfo(L, ">S", &ar) && ar.linedefined > 0 &&
      !fjl_is_prelude_source(ar.source))
    lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.linedefined);
  else if (!fjl_push_origin(L, idx))
    lua_pushfstring(L, "%s: ", chunk);
}

static int raise_at_definition(lua_State *L, int fn, const char *chunk,
                               const char *what, const char *want,
                               const char *got) {
  push_definition(L, fn, chunk);
  lua_pushfstring(L, "%s must return %s (got %s)", what, want, got);
  lua_concat(L, 2);
  return lua_error(L);
}

/* Upvalue 1 of the C functions below: the fjl_tracer. */
static fjl_tracer *tracer_of(lua_State *L) {
  return lua_touserdata(L, lua_upvalueindex(1));
}

static void check_mod(lua_State *L, int fn, int trusted) {
  lua_pushcfunction(L, fjl_check_mod);
  lua_pushvalue(L, fn);
  lua_pushvalue(L, trusted);
  lua_call(L, 2, 0);
}

/* Calls the mod at fn with traced inputs first..FJG_IN_KV; leaves the result
 * on the stack. */
static void call_mod(lua_State *L, fjg_graph *g, int fn, fjg_input first) {
  lua_pushvalue(L, fn);
  int nargs = 0;
  for (int in = first; in <= FJG_IN_KV; in++, nargs++) {
    int node = fjg_input_node(g, (fjg_input)in);
    if (node < 0)
      luaL_error(L, "%s", fjg_graph_error(g));
    fjl_push_traced(L, node);
  }
  lua_call(L, nargs, 1);
}

static void trace_mask(lua_State *L, fjg_graph *g, int fn, int trusted,
                       const char *chunk) {
  check_mod(L, fn, trusted);
  call_mod(L, g, fn, FJG_IN_B);
  int node = -1;
  if (lua_type(L, -1) == LUA_TBOOLEAN)
    node = fjg_const_bool(g, lua_toboolean(L, -1));
  else if (fjl_traced_node(L, -1) >= 0 &&
           fjg_node_at(g, fjl_traced_node(L, -1))->type == FJG_BOOL)
    node = fjl_traced_node(L, -1);
  else
    raise_at_definition(L, fn, chunk, "mask_mod", "a boolean",
                        fjl_describe(L, g, -1));
  if (node < 0 || fjg_set_mask_root(g, node) < 0) {
    push_definition(L, fn, chunk);
    lua_pushstring(L, fjg_graph_error(g));
    lua_concat(L, 2);
    lua_error(L);
  }
  lua_pop(L, 1);
}

static void trace_score(lua_State *L, fjg_graph *g, int fn, int trusted,
                        const char *chunk) {
  check_mod(L, fn, trusted);
  call_mod(L, g, fn, FJG_IN_SCORE);
  int node = -1;
  /* fjl_to_node would name no line: the mod has returned. */
  lua_Integer v = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 0;
  if (v < INT32_MIN || v > INT32_MAX) {
    push_definition(L, fn, chunk);
    lua_pushfstring(L, "score_mod returned the integer %I, which does not "
                    "fit in i32", v);
    lua_concat(L, 2);
    lua_error(L);
  }
  if (lua_type(L, -1) == LUA_TNUMBER || fjl_traced_node(L, -1) >= 0)
    node = fjl_to_node(L, g, -1);
  if (node < 0 || fjg_node_at(g, node)->type == FJG_BOOL)
    raise_at_definition(L, fn, chunk, "score_mod", "a number",
                        fjl_describe(L, g, -1));
  if (fjg_set_score_root(g, node) < 0) {
    push_definition(L, fn, chunk);
    lua_pushstring(L, fjg_graph_error(g));
    lua_concat(L, 2);
    lua_error(L);
  }
  lua_pop(L, 1);
}

/* The derivative of score_mod for the backward pass, computed once here so
 * that the loaded graph never changes; an error names the mod's line. */
static void derive_score(lua_State *L, fjg_graph *g, int fn,
                         const char *chunk) {
  fjg_derivative d;
  char msg[256] = "";
  fj_status st = fjg_derive_score(g, fjg_trainable_args(g), &d, msg,
                                  sizeof msg);
  if (st == FJ_OK && fjg_set_derivative(g, &d) == 0)
    return;
  push_definition(L, fn, chunk);
  if (st == FJ_OK)
    lua_pushstring(L, fjg_graph_error(g));
  else
    lua_pushfstring(L, "cannot differentiate score_mod (for the backward "
                    "pass): %s", msg);
  lua_concat(L, 2);
  lua_error(L);
}

/* The spec's name is printed by hosts and the CLI: refuse one that could
 * drive a terminal (control characters, escape sequences) or is not UTF-8,
 * rather than print it or change it. */
static void check_name(lua_State *L, int idx, const char *chunk) {
  size_t len;
  const char *name = lua_tolstring(L, idx, &len);
  char shown[160];
  if (!name || fjl_escape(name, len, shown, sizeof shown) == 0)
    return;
  luaL_error(L, "%s: name must be printable UTF-8 text, without control "
             "characters (got \"%s\")", chunk, shown);
}

/* Fetches spec[field] without metamethods: only a function, or nil. */
static int get_mod(lua_State *L, int spec, const char *field,
                   const char *chunk) {
  lua_getfield(L, spec, field);
  int t = lua_type(L, -1);
  if (t != LUA_TNIL && t != LUA_TFUNCTION)
    luaL_error(L, "%s: %s must be a function (got %s)", chunk, field,
               luaL_typename(L, -1));
  return t == LUA_TFUNCTION;
}

/* Arguments: the chunk's result, the trusted set, the short chunk name.
 * Traces the mods into the graph; returns the spec's name or nil. */
static int trace_spec_table(lua_State *L) {
  fjg_graph *g = tracer_of(L)->g;
  const char *chunk = lua_tostring(L, 3);
  if (!lua_istable(L, 1))
    return luaL_error(L, "%s: the chunk must return a table with mask_mod "
                      "and/or score_mod (got %s)", chunk, luaL_typename(L, 1));
  /* No metamethods: the spec is data, and __index code would escape the
   * checks. */
  lua_newtable(L);
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, 4);
  }
  int has_mask = get_mod(L, 4, "mask_mod", chunk);
  int has_score = get_mod(L, 4, "score_mod", chunk);
  if (!has_mask && !has_score)
    return luaL_error(L, "%s: the chunk must return a table with mask_mod "
                      "and/or score_mod (the table has neither)", chunk);
  if (has_mask)
    trace_mask(L, g, 5, 2, chunk);
  if (has_score) {
    trace_score(L, g, 6, 2, chunk);
    derive_score(L, g, 6, chunk);
  }
  lua_getfield(L, 4, "name");
  if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
    return luaL_error(L, "%s: name must be a string (got %s)", chunk,
                      luaL_typename(L, -1));
  check_name(L, -1, chunk);
  return 1;
}

/* The trusted set: every Lua function among the globals right after the
 * prelude ran. Before it, the globals hold only C functions, so these are
 * exactly the prelude's builders (causal, and_masks, ...). */
static int collect_trusted(lua_State *L) {
  lua_newtable(L);
  lua_pushglobaltable(L);
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    if (lua_type(L, -1) == LUA_TFUNCTION && !lua_iscfunction(L, -1)) {
      lua_pushboolean(L, 1);
      lua_rawset(L, -5);
    } else {
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  return 1;
}

/* A prelude builder, called through this C closure (upvalue 1: the
 * builder), notes the spec line of the call as the origin of the mod it
 * returns: errors about that mod, or raised inside it while it is traced
 * (with no spec frame on the stack), name that line. */
static int call_builder(lua_State *L) {
  int nargs = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, nargs, LUA_MULTRET);
  if (lua_gettop(L) >= 1 && lua_type(L, 1) == LUA_TFUNCTION)
    fjl_note_origin(L, 1, 1);
  return lua_gettop(L);
}

/* Wraps every global Lua function (the prelude's builders) in call_builder.
 * Assigning to existing fields during the traversal is allowed. */
static int wrap_builders(lua_State *L) {
  lua_pushglobaltable(L);
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    if (lua_type(L, -1) == LUA_TFUNCTION && !lua_iscfunction(L, -1)) {
      lua_pushcclosure(L, call_builder, 1);
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_rawset(L, 1);
    } else {
      lua_pop(L, 1);
    }
  }
  return 0;
}

static fj_status load_prelude(fjl_sandbox *sb, char *err, size_t errlen) {
  for (int i = 0; i < fjl_prelude_count; i++) {
    char name[256];
    snprintf(name, sizeof name, "%s%s", FJL_PRELUDE_SOURCE_PREFIX,
             fjl_prelude_names[i]);
    fj_status st = fjl_sandbox_load(sb, fjl_prelude_texts[i],
                                    fjl_prelude_sizes[i], name, err, errlen);
    if (st == FJ_OK)
      st = fjl_sandbox_pcall(sb, 0, 0, err, errlen);
    if (st != FJ_OK)
      return st;
  }
  lua_pushcfunction(sb->L, collect_trusted);
  fj_status st = fjl_sandbox_pcall(sb, 0, 1, err, errlen);
  if (st != FJ_OK)
    return st;
  lua_pushcfunction(sb->L, wrap_builders);
  return fjl_sandbox_pcall(sb, 0, 0, err, errlen);
}

static fj_status open_dsl(fjl_sandbox *sb, fjl_tracer *t, char *err,
                          size_t errlen) {
  lua_pushcfunction(sb->L, fjl_open_dsl);
  lua_pushlightuserdata(sb->L, t);
  return fjl_sandbox_pcall(sb, 1, 0, err, errlen);
}

/* The spec's name, else the chunk's display name (already escaped). */
static fj_status copy_name(lua_State *L, int idx, const char *chunk,
                           char **out_name, char *err, size_t errlen) {
  size_t len;
  const char *name = lua_tolstring(L, idx, &len);
  if (!out_name)
    return FJ_OK;
  if (!name) {
    name = chunk;
    len = strlen(chunk);
  }
  *out_name = malloc(len + 1);
  if (!*out_name) {
    snprintf(err, errlen, "out of memory");
    return FJ_ENOMEM;
  }
  memcpy(*out_name, name, len + 1);
  return FJ_OK;
}

fj_status fjl_trace_spec_ex(const char *source, size_t len,
                            const char *chunkname, const fjl_limits *limits,
                            fjg_graph **out_graph, char **out_name, char *err,
                            size_t errlen) {
  fjl_sandbox sb = {0};
  fjl_tracer tracer = {0};
  char cn[256];
  fj_status st;
  if (out_name)
    *out_name = NULL;
  if (!source || !out_graph) {
    snprintf(err, errlen, "fjl_trace_spec: source and out_graph are needed");
    return FJ_EINVAL;
  }
  *out_graph = NULL;
  fjl_chunkname(chunkname, cn, sizeof cn);
  tracer.g = fjg_graph_create();
  if (!tracer.g) {
    snprintf(err, errlen, "out of memory");
    return FJ_ENOMEM;
  }
  if ((st = fjl_sandbox_open(&sb, limits, err, errlen)) != FJ_OK)
    goto fail;
  if ((st = open_dsl(&sb, &tracer, err, errlen)) != FJ_OK)
    goto fail;
  if ((st = load_prelude(&sb, err, errlen)) != FJ_OK) /* pushes trusted */
    goto fail;
  lua_pushlightuserdata(sb.L, &tracer);
  lua_pushcclosure(sb.L, trace_spec_table, 1);
  if ((st = fjl_sandbox_load(&sb, source, len, cn, err, errlen)) != FJ_OK)
    goto fail;
  if ((st = fjl_sandbox_pcall(&sb, 0, 1, err, errlen)) != FJ_OK)
    goto fail;
  lua_pushvalue(sb.L, 1); /* trusted */
  lua_pushstring(sb.L, cn + 1);
  if ((st = fjl_sandbox_pcall(&sb, 3, 1, err, errlen)) != FJ_OK)
    goto fail;
  if ((st = copy_name(sb.L, -1, cn + 1, out_name, err, errlen)) != FJ_OK)
    goto fail;
  fjl_sandbox_close(&sb);
  *out_graph = tracer.g;
  return FJ_OK;
fail:
  fjl_sandbox_close(&sb);
  fjg_graph_destroy(tracer.g);
  return st;
}

fj_status fjl_trace_spec(const char *source, size_t len, const char *chunkname,
                         fjg_graph **out_graph, char **out_name, char *err,
                         size_t errlen) {
  return fjl_trace_spec_ex(source, len, chunkname, NULL, out_graph, out_name,
                           err, errlen);
}
