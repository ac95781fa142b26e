/*
 * lua/state.c: the sandboxed Lua state (see state.h).
 */
#include "lua/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lualib.h>

/* The hook runs every this many VM instructions. */
#define FJL_HOOK_STEP 1000

void fjl_limits_default(fjl_limits *limits) {
  limits->memory_bytes = FJL_DEFAULT_MEMORY_BYTES;
  limits->instructions = FJL_DEFAULT_INSTRUCTIONS;
}

/* Lua's allocator contract, plus a ceiling: growth past the limit is refused,
 * which Lua turns into a memory error; shrinking and freeing always work. */
static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  fjl_sandbox *sb = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    sb->used -= old;
    return NULL;
  }
  if (nsize > old && sb->used - old + nsize > sb->memory_limit) {
    sb->memory_refused = 1;
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (p)
    sb->used = sb->used - old + nsize;
  return p;
}

static fjl_sandbox *sandbox_of(lua_State *L) {
  void *ud = NULL;
  lua_getallocf(L, &ud);
  return ud;
}

/* Counts instructions and remembers the position, so that a memory error
 * (raised by Lua without one) can still name a line. */
static void count_hook(lua_State *L, lua_Debug *ar) {
  fjl_sandbox *sb = sandbox_of(L);
  sb->instr_count += FJL_HOOK_STEP;
  if (lua_getinfo(L, "Sl", ar) && ar->currentline > 0)
    snprintf(sb->last_where, sizeof sb->last_where, "%s:%d", ar->short_src,
             ar->currentline);
  if (sb->instr_count > sb->instr_limit) {
    if (ar->currentline > 0)
      lua_pushfstring(L, "%s:%d: instruction limit exceeded (%d million): "
                      "does the spec loop forever?",
                      ar->short_src, ar->currentline,
                      (int)(sb->instr_limit / 1000000));
    else
      lua_pushfstring(L, "instruction limit exceeded (%d million)",
                      (int)(sb->instr_limit / 1000000));
    lua_error(L);
  }
}

static void open_library(lua_State *L, const char *name, lua_CFunction open) {
  luaL_requiref(L, name, open, 1);
  lua_pop(L, 1);
}

static void remove_field(lua_State *L, int table, const char *name) {
  table = lua_absindex(L, table);
  lua_pushnil(L);
  lua_setfield(L, table, name);
}

/* Base functions that load code or reach the host, and the string functions
 * that could run unbounded C work (pattern matching backtracks without
 * counting instructions) or produce bytecode. pcall/xpcall go too: a spec
 * could otherwise catch the instruction-limit error and keep running. */
static int strip_globals(lua_State *L) {
  static const char *const base_names[] = {
      "dofile", "loadfile", "load",   "loadstring", "collectgarbage",
      "print",  "require",  "pcall",  "xpcall",     "warn",
      "module", "package",  "io",     "os",         "debug",
      "coroutine", "utf8", NULL};
  static const char *const string_names[] = {"dump", "find", "match",
                                             "gmatch", "gsub", NULL};
  lua_pushglobaltable(L);
  for (int i = 0; base_names[i]; i++)
    remove_field(L, -1, base_names[i]);
  lua_getfield(L, -1, "string");
  for (int i = 0; string_names[i]; i++)
    remove_field(L, -1, string_names[i]);
  lua_pop(L, 2);
  return 0;
}

static int open_sandbox_libraries(lua_State *L) {
  open_library(L, LUA_GNAME, luaopen_base);
  open_library(L, LUA_STRLIBNAME, luaopen_string);
  open_library(L, LUA_TABLIBNAME, luaopen_table);
  open_library(L, LUA_MATHLIBNAME, luaopen_math);
  /* package.loaded would still hold them under their names: drop it. */
  lua_pushnil(L);
  lua_setfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  return strip_globals(L);
}

fj_status fjl_sandbox_open(fjl_sandbox *sb, const fjl_limits *limits,
                           char *err, size_t errlen) {
  fjl_limits def;
  if (!limits) {
    fjl_limits_default(&def);
    limits = &def;
  }
  memset(sb, 0, sizeof *sb);
  sb->memory_limit = limits->memory_bytes;
  sb->instr_limit = limits->instructions;
  sb->L = lua_newstate(sandbox_alloc, sb);
  if (!sb->L) {
    snprintf(err, errlen, "cannot create a Lua state (out of memory)");
    return FJ_ENOMEM;
  }
  lua_sethook(sb->L, count_hook, LUA_MASKCOUNT, FJL_HOOK_STEP);
  lua_pushcfunction(sb->L, open_sandbox_libraries);
  if (lua_pcall(sb->L, 0, 0, 0) != LUA_OK) {
    snprintf(err, errlen, "cannot open the Lua libraries: %s",
             lua_tostring(sb->L, -1));
    fjl_sandbox_close(sb);
    return FJ_ENOMEM;
  }
  return FJ_OK;
}

void fjl_sandbox_close(fjl_sandbox *sb) {
  if (sb && sb->L) {
    lua_close(sb->L);
    sb->L = NULL;
  }
}

void fjl_chunkname(const char *chunkname, char *out, size_t outlen) {
  if (!chunkname || !*chunkname)
    chunkname = "spec";
  if (chunkname[0] == '@' || chunkname[0] == '=')
    snprintf(out, outlen, "%s", chunkname);
  else
    snprintf(out, outlen, "@%s", chunkname);
}

void fjl_error_text(lua_State *L, int idx, char *err, size_t errlen) {
  const char *msg = lua_tostring(L, idx);
  if (msg)
    snprintf(err, errlen, "%s", msg);
  else
    snprintf(err, errlen, "(error object is a %s value)",
             luaL_typename(L, idx));
}

fj_status fjl_sandbox_load(fjl_sandbox *sb, const char *source, size_t len,
                           const char *chunkname, char *err, size_t errlen) {
  lua_State *L = sb->L;
  if (len > 0 && source[0] == LUA_SIGNATURE[0]) {
    snprintf(err, errlen,
             "%s: precompiled Lua bytecode is not accepted; give the spec "
             "as Lua source text",
             chunkname + 1);
    return FJ_ELUA;
  }
  snprintf(sb->chunk, sizeof sb->chunk, "%s", chunkname + 1);
  int status = luaL_loadbufferx(L, source, len, chunkname, "t");
  if (status == LUA_OK)
    return FJ_OK;
  if (status == LUA_ERRMEM && sb->memory_refused)
    snprintf(err, errlen, "%s: memory limit exceeded while compiling",
             chunkname + 1);
  else
    fjl_error_text(L, -1, err, errlen);
  lua_pop(L, 1);
  return FJ_ELUA;
}

/* Keeps messages short (no traceback) and makes non-string errors readable. */
static int message_handler(lua_State *L) {
  if (lua_type(L, 1) == LUA_TSTRING)
    return 1;
  if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
    return 1;
  luaL_where(L, 1);
  lua_pushfstring(L, "error object is a %s value", luaL_typename(L, 1));
  lua_concat(L, 2);
  return 1;
}

fj_status fjl_sandbox_pcall(fjl_sandbox *sb, int nargs, int nresults,
                            char *err, size_t errlen) {
  lua_State *L = sb->L;
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, message_handler);
  lua_insert(L, base);
  int status = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  if (status == LUA_OK)
    return FJ_OK;
  if (status == LUA_ERRMEM && sb->memory_refused) {
    if (sb->last_where[0])
      snprintf(err, errlen, "%s: memory limit exceeded (%zu MiB)",
               sb->last_where, sb->memory_limit >> 20);
    else
      snprintf(err, errlen, "%s: memory limit exceeded (%zu MiB)",
               sb->chunk[0] ? sb->chunk : "?", sb->memory_limit >> 20);
  } else {
    fjl_error_text(L, -1, err, errlen);
  }
  lua_pop(L, 1);
  return FJ_ELUA;
}
