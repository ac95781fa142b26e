/*
 * lua/check.h: the static check that keeps a spec from silently computing a
 * different function.
 *
 * Lua cannot overload `if`, `and`, `or`, `not`, or `==` between a userdata
 * and a number: on a traced value they quietly act on the proxy object (which
 * is always true, never equal to 5) instead of the traced number. The check
 * dumps a mod's bytecode (lua_dump, with debug info), parses the Lua 5.4
 * binary chunk, and runs a forward "may hold a traced value" dataflow over
 * every function prototype in it (per instruction, following jumps, merging
 * at join points); a test, `not` or comparison on a register that may hold a
 * traced value is reported with the spec's line and the helper to use.
 *
 * Sound but conservative: parameters, call results, upvalues and globals
 * holding traced values or buffers, and values derived from them are assumed
 * traced. Lua closures reachable from the mod through upvalues (also inside
 * tables, two levels deep) and through globals it reads are checked too, as
 * if called with traced arguments, except `trusted` ones (the prelude's
 * builders).
 */
#ifndef FJL_CHECK_H
#define FJL_CHECK_H

#include <lua.h>

/* lua_CFunction. Arguments: the mod (a function) and a table whose keys are
 * trusted functions, or nil. Returns nothing; raises an error
 * "chunk:line: <what>: use <helper>" at the first misuse found. Run it through
 * lua_pcall: it may also raise memory errors. */
int fjl_check_mod(lua_State *L);

#endif /* FJL_CHECK_H */
