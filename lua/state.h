/*
 * lua/state.h: the sandboxed Lua state a spec runs in.
 *
 * A sandbox owns one lua_State created with an allocator that refuses to
 * grow past a memory limit and a count hook that stops the chunk after an
 * instruction budget. Only the base, string, table and math libraries are
 * opened, and the base functions that reach outside the sandbox (dofile,
 * loadfile, load, collectgarbage, print, require) are removed, as is
 * string.dump. The state exists only while one spec is being traced.
 */
#ifndef FJL_STATE_H
#define FJL_STATE_H

#include <stddef.h>
#include <stdint.h>

#include <lua.h>

#include "flexjit.h"

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
  char chunk[128];       /* short name of the chunk loaded last */
} fjl_sandbox;

/* Creates the state. `limits` may be NULL (defaults). On failure writes a
 * message to err and returns FJ_ENOMEM. */
fj_status fjl_sandbox_open(fjl_sandbox *sb, const fjl_limits *limits,
                           char *err, size_t errlen);
/* Closes the state; safe on a zeroed or already closed sandbox. */
void fjl_sandbox_close(fjl_sandbox *sb);

/* Normalizes a caller's chunk name into Lua's "@name" form so messages read
 * "name:line:". Writes into out (at least 2 bytes). */
void fjl_chunkname(const char *chunkname, char *out, size_t outlen);

/* Compiles Lua source text (never bytecode) and pushes the chunk function.
 * `chunkname` is already in "@name" form. On failure pushes nothing, writes
 * the message ("name:line: ...") to err and returns FJ_ELUA. */
fj_status fjl_sandbox_load(fjl_sandbox *sb, const char *source, size_t len,
                           const char *chunkname, char *err, size_t errlen);

/* lua_pcall with a message handler. On failure writes the error message,
 * made specific for memory and instruction limits, to err, leaves the stack
 * as it was without the function and arguments, and returns FJ_ELUA. */
fj_status fjl_sandbox_pcall(fjl_sandbox *sb, int nargs, int nresults,
                            char *err, size_t errlen);

/* Copies the string at the top of the stack (or a description of a non-string
 * error value) into err. */
void fjl_error_text(lua_State *L, int idx, char *err, size_t errlen);

#endif /* FJL_STATE_H */
