/*
 * lua/state.h: the sandboxed Lua state a spec runs in.
 *
 * A sandbox owns one lua_State created with an allocator that refuses to
 * grow past a memory limit and a count hook that stops the chunk after an
 * instruction budget. Only the base, string, table and math libraries are
 * opened, and the base functions that reach outside the sandbox (dofile,
 * loadfile, load, collectgarbage, print, require) are removed, as is
 * string.dump; setmetatable refuses __gc (finalizers run with the count
 * hook off). The state exists only while one spec is being traced.
 *
 * Every error message the sandbox hands back starts with "chunk:line:"
 * (the first frame outside the prelude) and is printable text: control
 * characters and invalid UTF-8, from the chunk name or from the spec's own
 * strings, are written as \xHH escapes.
 */
#ifndef FJL_STATE_H
#define FJL_STATE_H

#include <stddef.h>
#include <stdint.h>

#include <lua.h>

#include "flexjit.h"

/* Chunk names of prelude files start with this, so that errors can skip the
 * prelude's frames and name the user's line instead. */
#define FJL_PRELUDE_SOURCE_PREFIX "=(prelude) "

/* Bounds on what a spec may use. */
typedef struct fjl_limits {
  size_t memory_bytes;    /* live bytes the Lua heap may hold */
  uint64_t instructions;  /* VM instructions, counted in steps of 1000 */
} fjl_limits;

#define FJL_DEFAULT_MEMORY_BYTES ((size_t)64 << 20)
#define FJL_DEFAULT_INSTRUCTIONS ((uint64_t)50000000)

/* Fills the defaults above. */
void fjl_limits_default(fjl_limits *limits);

typedef struct fjl_sandbox {
  lua_State *L;
  size_t used;           /* bytes currently allocated by the state */
  size_t memory_limit;
  uint64_t instr_limit;
  uint64_t instr_count;  /* instructions executed so far (approximate) */
  int memory_refused;    /* the allocator refused a request */
  /* Where the count hook last saw the VM: "chunk:line", for the message of
   * a memory error, which Lua raises without a position. */
  char last_where[128];
  /* Display name of the chunk loaded last, as Lua's short_src shows it. */
  char chunk[LUA_IDSIZE];
} fjl_sandbox;

/* Creates the state. `limits` may be NULL (defaults). On failure writes a
 * message to err and returns FJ_ENOMEM. */
fj_status fjl_sandbox_open(fjl_sandbox *sb, const fjl_limits *limits,
                           char *err, size_t errlen);
/* Closes the state; safe on a zeroed or already closed sandbox. */
void fjl_sandbox_close(fjl_sandbox *sb);

/* Normalizes a caller's chunk name into Lua's "@name" form so messages read
 * "name:line:": NULL or "" is "spec", a leading '@' or '=' is kept, control
 * characters and invalid UTF-8 become \xHH escapes, and a name longer than
 * Lua shows (LUA_IDSIZE - 1 bytes) keeps its tail after "...". (A C string
 * ends at its first NUL: bytes after one never reach the library.) Writes
 * into out (at least LUA_IDSIZE + 1 bytes for the whole name). */
void fjl_chunkname(const char *chunkname, char *out, size_t outlen);

/* Copies len bytes of s into out (NUL-terminated, truncated to outlen) with
 * every control character (C0, DEL, C1) and every byte that is not part of
 * valid UTF-8 written as \xHH, so the text cannot move a terminal's cursor.
 * Returns the number of bytes that needed an escape. */
size_t fjl_escape(const char *s, size_t len, char *out, size_t outlen);

/* Compiles Lua source text (never bytecode) and pushes the chunk function.
 * `chunkname` comes from fjl_chunkname. A UTF-8 byte order mark and a first
 * line starting with '#' (a shebang) are skipped the way luaL_loadfilex
 * skips them, keeping line numbers. On failure pushes nothing, writes the
 * message ("name:line: ...") to err and returns FJ_ELUA. */
fj_status fjl_sandbox_load(fjl_sandbox *sb, const char *source, size_t len,
                           const char *chunkname, char *err, size_t errlen);

/* lua_pcall with a message handler. On failure writes the error message,
 * made specific for memory and instruction limits, to err, leaves the stack
 * as it was without the function and arguments, and returns FJ_ELUA. */
fj_status fjl_sandbox_pcall(fjl_sandbox *sb, int nargs, int nresults,
                            char *err, size_t errlen);

/* Copies the string at idx (or a description of a non-string error value)
 * into err, escaped as fjl_escape does. */
void fjl_error_text(lua_State *L, int idx, char *err, size_t errlen);

/* Pushes "chunk:line: " of the first Lua frame at or above `level` whose code
 * is not the prelude's; without one, the spec line that built the innermost
 * prelude function running (fjl_note_origin), else the innermost prelude
 * frame's position ("" when there is no Lua frame with a line). */
void fjl_where(lua_State *L, int level);

/* Remembers that the function at fn was made at the first spec line (not
 * the prelude's) at or above `level`: errors about it, or inside it while
 * no spec frame is on the stack, name that line. */
void fjl_note_origin(lua_State *L, int fn, int level);

/* Pushes the "chunk:line: " remembered for the function at fn and returns
 * 1, or pushes nothing and returns 0. */
int fjl_push_origin(lua_State *L, int fn);

/* 1 when a chunk's source name (lua_Debug.source) is a prelude file's. */
int fjl_is_prelude_source(const char *source);

#endif /* FJL_STATE_H */
