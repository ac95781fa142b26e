/*
 * lua/state.c: the sandboxed Lua state (see state.h).
 */
#include "lua/state.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lualib.h>

/* The hook runs every this many VM instructions. */
#define FJL_HOOK_STEP 1000
/* How many frames the hook looks through for one outside the prelude. */
#define FJL_HOOK_WHERE_DEPTH 16

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

int fjl_is_prelude_source(const char *source) {
  size_t n = strlen(FJL_PRELUDE_SOURCE_PREFIX);
  return strncmp(source, FJL_PRELUDE_SOURCE_PREFIX, n) == 0;
}

/* The registry's table of origins: function -> "chunk:line: " of the spec
 * line that made it (weak keys). Pushed; created on first use. */
static const char origins_key = 'o';

static void push_origins(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &origins_key) == LUA_TTABLE)
    return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_newtable(L);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &origins_key);
}

int fjl_push_origin(lua_State *L, int fn) {
  fn = lua_absindex(L, fn);
  push_origins(L);
  lua_pushvalue(L, fn);
  if (lua_rawget(L, -2) == LUA_TSTRING) {
    lua_remove(L, -2);
    return 1;
  }
  lua_pop(L, 2);
  return 0;
}

void fjl_where(lua_State *L, int level) {
  lua_Debug ar;
  int base = lua_gettop(L);
  int found = 0; /* 1: slot base + 1 holds an origin, 2: a prelude line */
  lua_pushnil(L);
  for (; lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "Slf", &ar))
      continue;
    if (ar.currentline > 0 && !fjl_is_prelude_source(ar.source)) {
      lua_pop(L, 1);
      lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
      lua_replace(L, base + 1);
      return;
    }
    /* A prelude frame: kept in case no spec frame is above (a prelude mod
     * called from C), preferably as the line that built its function. */
    if (ar.currentline > 0 && found != 1 && fjl_push_origin(L, -1)) {
      lua_replace(L, base + 1);
      found = 1;
    } else if (ar.currentline > 0 && !found) {
      lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
      lua_replace(L, base + 1);
      found = 2;
    }
    lua_pop(L, 1);
  }
  if (!found) {
    lua_pushliteral(L, "");
    lua_replace(L, base + 1);
  }
}

void fjl_note_origin(lua_State *L, int fn, int level) {
  lua_Debug ar;
  fn = lua_absindex(L, fn);
  for (; lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0 ||
        fjl_is_prelude_source(ar.source))
      continue;
    push_origins(L);
    lua_pushvalue(L, fn);
    lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
    lua_rawset(L, -3);
    lua_pop(L, 1);
    return;
  }
}

/* Remembers where the VM is, for the message of a memory error (which Lua
 * raises without a position and without calling the message handler): the
 * first frame outside the prelude among the innermost few, else the
 * innermost prelude frame unless a spec line is already known. */
static void remember_where(fjl_sandbox *sb, lua_State *L) {
  lua_Debug ar;
  for (int level = 0; level < FJL_HOOK_WHERE_DEPTH; level++) {
    if (!lua_getstack(L, level, &ar))
      return;
    if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0)
      continue;
    int prelude = fjl_is_prelude_source(ar.source);
    if (prelude && (level > 0 || sb->last_where[0]))
      continue;
    snprintf(sb->last_where, sizeof sb->last_where, "%s:%d", ar.short_src,
             ar.currentline);
    if (!prelude)
      return;
  }
}

/* Counts instructions and remembers the position. The limit's error has
 * no position of its own: the message handler adds the spec line. */
static void count_hook(lua_State *L, lua_Debug *ar) {
  fjl_sandbox *sb = sandbox_of(L);
  (void)ar;
  sb->instr_count += FJL_HOOK_STEP;
  remember_where(sb, L);
  if (sb->instr_count > sb->instr_limit) {
    lua_pushfstring(L, "instruction limit exceeded (%d million): does the "
                    "spec loop forever?", (int)(sb->instr_limit / 1000000));
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

/* setmetatable without __gc: Lua runs finalizers with hooks off, so a
 * __gc that loops would escape the instruction limit (at any collection and
 * at lua_close). Lua marks an object for finalization only when its
 * metatable already has the field at setmetatable time, and reads it raw. */
static int setmetatable_no_gc(lua_State *L) {
  if (lua_type(L, 2) == LUA_TTABLE) {
    lua_pushliteral(L, "__gc");
    int type = lua_rawget(L, 2);
    lua_pop(L, 1);
    if (type != LUA_TNIL)
      return luaL_error(L, "setmetatable: __gc metamethods are not allowed "
                        "in a spec (finalizers run outside the instruction "
                        "limit)");
  }
  lua_settop(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, 2, 1);
  return 1;
}

static int open_sandbox_libraries(lua_State *L) {
  open_library(L, LUA_GNAME, luaopen_base);
  open_library(L, LUA_STRLIBNAME, luaopen_string);
  open_library(L, LUA_TABLIBNAME, luaopen_table);
  open_library(L, LUA_MATHLIBNAME, luaopen_math);
  /* package.loaded would still hold them under their names: drop it. */
  lua_pushnil(L);
  lua_setfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_getglobal(L, "setmetatable");
  lua_pushcclosure(L, setmetatable_no_gc, 1);
  lua_setglobal(L, "setmetatable");
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

/* ---- printable text ---- */

/* Length of the printable UTF-8 character at s (n bytes left), or 0 when
 * the byte at s must be escaped: a C0 control or DEL, a C1 control
 * (U+0080..U+009F, which some terminals obey), or not valid UTF-8 (a stray
 * continuation byte, a truncated, overlong or surrogate sequence, or a
 * code point above U+10FFFF). */
static size_t printable_char(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x20 || c == 0x7f)
    return 0;
  if (c < 0x80)
    return 1;
  size_t len;
  uint32_t cp, min;
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2, cp = c & 0x1f, min = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3, cp = c & 0x0f, min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (len > n)
    return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ||
      (cp >= 0x80 && cp <= 0x9f))
    return 0;
  return len;
}

/* One unit of escaped text at s: the bytes it consumes (returned) and the
 * bytes it writes (*out_len: the character itself, or 4 for \xHH). */
static size_t text_unit(const unsigned char *s, size_t n, size_t *out_len) {
  size_t len = printable_char(s, n);
  *out_len = len ? len : 4;
  return len ? len : 1;
}

/* Appends the unit at s (consuming `used` bytes) to out[*pos], if it fits
 * with the NUL; returns 0 once out is full. */
static int put_unit(const unsigned char *s, size_t used, size_t written,
                    char *out, size_t outlen, size_t *pos) {
  if (*pos + written + 1 > outlen)
    return 0;
  if (written == used)
    memcpy(out + *pos, s, used);
  else
    snprintf(out + *pos, 5, "\\x%02X", s[0]);
  *pos += written;
  return 1;
}

size_t fjl_escape(const char *s, size_t len, char *out, size_t outlen) {
  const unsigned char *p = (const unsigned char *)s;
  size_t pos = 0, escaped = 0, i = 0;
  int room = outlen > 0;
  while (i < len) {
    size_t written, used = text_unit(p + i, len - i, &written);
    escaped += written != used;
    if (room)
      room = put_unit(p + i, used, written, out, outlen, &pos);
    i += used;
  }
  if (outlen > 0)
    out[pos] = '\0';
  return escaped;
}

void fjl_chunkname(const char *chunkname, char *out, size_t outlen) {
  char mark = '@';
  if (chunkname && (chunkname[0] == '@' || chunkname[0] == '='))
    mark = *chunkname++;
  if (!chunkname || !*chunkname)
    chunkname = "spec";
  const unsigned char *p = (const unsigned char *)chunkname;
  size_t len = strlen(chunkname), total = 0, written;
  for (size_t i = 0; i < len;) {
    i += text_unit(p + i, len - i, &written);
    total += written;
  }
  /* Longer than Lua shows: keep the tail after "...", whole units only, so
   * that Lua's short_src is exactly this text. */
  size_t i = 0, pos = 0;
  const size_t room = LUA_IDSIZE - 1;
  if (outlen < 2)
    return;
  out[pos++] = mark;
  out[pos] = '\0';
  if (total > room) {
    while (i < len && total > room - 3) {
      i += text_unit(p + i, len - i, &written);
      total -= written;
    }
    if (pos + 4 > outlen)
      return;
    memcpy(out + pos, "...", 4);
    pos += 3;
  }
  while (i < len) {
    size_t used = text_unit(p + i, len - i, &written);
    if (!put_unit(p + i, used, written, out, outlen, &pos))
      break;
    i += used;
  }
  out[pos] = '\0';
}

void fjl_error_text(lua_State *L, int idx, char *err, size_t errlen) {
  size_t len;
  const char *msg = lua_tolstring(L, idx, &len);
  if (msg)
    fjl_escape(msg, len, err, errlen);
  else
    snprintf(err, errlen, "(error object is a %s value)",
             luaL_typename(L, idx));
}

/* 1 when msg already starts with the chunk's name and a colon: a position
 * ("spec.lua:3: ..."), or the chunk itself ("spec.lua: the chunk must
 * return a table ..."). */
static int has_position(const fjl_sandbox *sb, const char *msg) {
  size_t n = strlen(sb->chunk);
  return n > 0 && strncmp(msg, sb->chunk, n) == 0 && msg[n] == ':';
}

/* Writes "where: msg" (where may be empty) to err, escaped. */
static void position_message(const char *where, const char *msg, char *err,
                             size_t errlen) {
  size_t n = strlen(where) + strlen(msg) + 3;
  char *text = malloc(n);
  if (!text) {
    fjl_escape(msg, strlen(msg), err, errlen);
    return;
  }
  snprintf(text, n, "%s%s%s", where, where[0] ? ": " : "", msg);
  fjl_escape(text, strlen(text), err, errlen);
  free(text);
}

/* ---- loading ---- */

/* Hands Lua the source a line at a time and counts the lines handed out:
 * the line the parser was reading when it failed, for the few parser errors
 * that come without one (a C stack overflow on deep nesting). */
typedef struct line_reader {
  const char *p, *end;
  int line;
} line_reader;

static const char *read_line(lua_State *L, void *ud, size_t *size) {
  line_reader *r = ud;
  (void)L;
  if (r->p >= r->end) {
    *size = 0;
    return NULL;
  }
  const char *piece = r->p;
  const char *nl = memchr(piece, '\n', (size_t)(r->end - piece));
  r->p = nl ? nl + 1 : r->end;
  r->line++;
  *size = (size_t)(r->p - piece);
  return piece;
}

fj_status fjl_sandbox_load(fjl_sandbox *sb, const char *source, size_t len,
                           const char *chunkname, char *err, size_t errlen) {
  lua_State *L = sb->L;
  const char *end = source + len;
  char where[LUA_IDSIZE + 16];
  snprintf(sb->chunk, sizeof sb->chunk, "%s", chunkname + 1);
  /* Like luaL_loadfilex: a UTF-8 byte order mark, then a first line that
   * starts with '#' (#!/usr/bin/env flexjit), are skipped; the newline
   * ending that line stays, so line numbers do not move. */
  if (len >= 3 && memcmp(source, "\xEF\xBB\xBF", 3) == 0)
    source += 3;
  const char *body = source; /* where bytecode would start */
  if (source < end && source[0] == '#') {
    const char *nl = memchr(source, '\n', (size_t)(end - source));
    source = nl ? nl : end;
    body = nl ? nl + 1 : end;
  }
  if (body < end && body[0] == LUA_SIGNATURE[0]) {
    snprintf(where, sizeof where, "%s", sb->chunk);
    position_message(where, "precompiled Lua bytecode is not accepted; give "
                     "the spec as Lua source text", err, errlen);
    return FJ_ELUA;
  }
  line_reader r = {source, end, 0};
  sb->memory_refused = 0;
  int status = lua_load(L, read_line, &r, chunkname, "t");
  if (status == LUA_OK)
    return FJ_OK;
  snprintf(where, sizeof where, "%s:%d", sb->chunk, r.line > 0 ? r.line : 1);
  if (status == LUA_ERRMEM && sb->memory_refused) {
    position_message(where, "memory limit exceeded while compiling", err,
                     errlen);
  } else {
    const char *msg = lua_tostring(L, -1);
    if (!msg)
      fjl_error_text(L, -1, err, errlen);
    else
      position_message(has_position(sb, msg) ? "" : where, msg, err, errlen);
  }
  lua_pop(L, 1);
  return FJ_ELUA;
}

/* ---- running ---- */

/* Makes every error "chunk:line: message": a message without a position
 * (error("x", 0), error({}), a C function's "C stack overflow") or with the
 * prelude's gets the innermost spec line in front. Non-string error values
 * are described, never converted by a __tostring of the spec's. */
static int message_handler(lua_State *L) {
  fjl_sandbox *sb = sandbox_of(L);
  if (!lua_isstring(L, 1)) {
    lua_pushfstring(L, "error object is a %s value", luaL_typename(L, 1));
    lua_replace(L, 1);
  }
  lua_settop(L, 1);
  const char *msg = lua_tostring(L, 1);
  fjl_where(L, 1);
  size_t n;
  const char *where = lua_tolstring(L, 2, &n);
  if (n == 0 || has_position(sb, msg) || strncmp(msg, where, n) == 0) {
    lua_settop(L, 1);
    return 1;
  }
  lua_insert(L, 1);
  lua_concat(L, 2);
  return 1;
}

fj_status fjl_sandbox_pcall(fjl_sandbox *sb, int nargs, int nresults,
                            char *err, size_t errlen) {
  lua_State *L = sb->L;
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, message_handler);
  lua_insert(L, base);
  sb->memory_refused = 0;
  int status = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  if (status == LUA_OK)
    return FJ_OK;
  /* Memory errors and errors inside the handler (LUA_ERRERR) skip it: name
   * the last position the count hook saw. */
  const char *where = sb->last_where[0] ? sb->last_where
                                        : (sb->chunk[0] ? sb->chunk : "?");
  if (status == LUA_ERRMEM && sb->memory_refused) {
    char msg[96];
    snprintf(msg, sizeof msg, "memory limit exceeded (%zu MiB)",
             sb->memory_limit >> 20);
    position_message(where, msg, err, errlen);
  } else if (status != LUA_ERRRUN && lua_isstring(L, -1) &&
             !has_position(sb, lua_tostring(L, -1))) {
    position_message(where, lua_tostring(L, -1), err, errlen);
  } else {
    fjl_error_text(L, -1, err, errlen);
  }
  lua_pop(L, 1);
  return FJ_ELUA;
}
