/*
 * lua/trace.c: traced values, buffers and the DSL globals (see trace.h).
 */
#include "lua/trace.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include <lauxlib.h>

#define TRACED_MT "fjl.traced"
#define BUFFER_MT "fjl.buffer"

typedef struct traced {
  int32_t node;
} traced;

typedef struct buffer {
  int32_t arg;  /* argument index in the graph */
  int32_t elem; /* fjg_type of the elements */
} buffer;

static fjl_tracer *tracer_of(lua_State *L) {
  return lua_touserdata(L, lua_upvalueindex(1));
}

/* Raises "chunk:line: <message>". */
static int raise(lua_State *L, const char *fmt, ...) {
  va_list ap;
  fjl_where(L, 1);
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 2);
  return lua_error(L);
}

int fjl_traced_node(lua_State *L, int idx) {
  traced *t = luaL_testudata(L, idx, TRACED_MT);
  return t ? t->node : -1;
}

int fjl_is_buffer(lua_State *L, int idx) {
  return luaL_testudata(L, idx, BUFFER_MT) != NULL;
}

static fjg_type node_type(fjg_graph *g, int node) {
  return (fjg_type)fjg_node_at(g, node)->type;
}

const char *fjl_describe(lua_State *L, fjg_graph *g, int idx) {
  int node = fjl_traced_node(L, idx);
  if (node >= 0) {
    switch (node_type(g, node)) {
    case FJG_BOOL: return "traced bool";
    case FJG_I32: return "traced i32";
    default: return "traced f32";
    }
  }
  if (fjl_is_buffer(L, idx))
    return "buffer";
  return luaL_typename(L, idx);
}

void fjl_push_traced(lua_State *L, int node) {
  traced *t = lua_newuserdatauv(L, sizeof *t, 0);
  t->node = node;
  luaL_setmetatable(L, TRACED_MT);
}

/* A builder's result, or an error naming the line and the graph's reason. */
static int checked(lua_State *L, fjg_graph *g, int node) {
  if (node < 0)
    raise(L, "%s", fjg_graph_error(g));
  return node;
}

/* The node for a traced value or a plain Lua constant at idx: integers are
 * i32 constants, floats f32 constants, booleans bool constants. */
int fjl_to_node(lua_State *L, fjg_graph *g, int idx) {
  int node = fjl_traced_node(L, idx);
  if (node >= 0)
    return node;
  switch (lua_type(L, idx)) {
  case LUA_TBOOLEAN:
    return checked(L, g, fjg_const_bool(g, lua_toboolean(L, idx)));
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx)) {
      lua_Integer v = lua_tointeger(L, idx);
      if (v < INT32_MIN || v > INT32_MAX)
        raise(L, "integer constant %I does not fit in i32", v);
      return checked(L, g, fjg_const_i32(g, (int32_t)v));
    }
    return checked(L, g, fjg_const_f32(g, (float)lua_tonumber(L, idx)));
  default:
    return raise(L, "expected a traced value, a number or a boolean "
                 "(got %s)", fjl_describe(L, g, idx));
  }
}

static int push_node(lua_State *L, int node) {
  fjl_push_traced(L, node);
  return 1;
}

static int binary(lua_State *L, fjg_op op) {
  fjg_graph *g = tracer_of(L)->g;
  int a = fjl_to_node(L, g, 1);
  int b = fjl_to_node(L, g, 2);
  return push_node(L, checked(L, g, fjg_binary(g, op, a, b)));
}

static int unary(lua_State *L, fjg_op op) {
  fjg_graph *g = tracer_of(L)->g;
  int a = fjl_to_node(L, g, 1);
  return push_node(L, checked(L, g, fjg_unary(g, op, a)));
}

/* &, | and ~ are the logical operators of masks; integer bit operations
 * have no node, and guessing would change the function. */
static int logical(lua_State *L, fjg_op op, const char *symbol) {
  fjg_graph *g = tracer_of(L)->g;
  int n = op == FJG_OP_NOT ? 1 : 2;
  int nodes[2];
  for (int i = 0; i < n; i++) {
    nodes[i] = fjl_to_node(L, g, i + 1);
    if (node_type(g, nodes[i]) != FJG_BOOL)
      raise(L, "'%s' combines booleans (masks), got %s: integer bitwise "
            "operations are not supported on traced values",
            symbol, fjl_describe(L, g, i + 1));
  }
  int r = n == 1 ? fjg_unary(g, op, nodes[0])
                 : fjg_binary(g, op, nodes[0], nodes[1]);
  return push_node(L, checked(L, g, r));
}

static int mm_add(lua_State *L) { return binary(L, FJG_OP_ADD); }
static int mm_sub(lua_State *L) { return binary(L, FJG_OP_SUB); }
static int mm_mul(lua_State *L) { return binary(L, FJG_OP_MUL); }
static int mm_div(lua_State *L) { return binary(L, FJG_OP_DIV); }
static int mm_idiv(lua_State *L) { return binary(L, FJG_OP_IDIV); }
static int mm_mod(lua_State *L) { return binary(L, FJG_OP_MOD); }
static int mm_unm(lua_State *L) { return unary(L, FJG_OP_NEG); }
static int mm_band(lua_State *L) { return logical(L, FJG_OP_AND, "&"); }
static int mm_bor(lua_State *L) { return logical(L, FJG_OP_OR, "|"); }
static int mm_bxor(lua_State *L) { return logical(L, FJG_OP_XOR, "~"); }
static int mm_bnot(lua_State *L) { return logical(L, FJG_OP_NOT, "~"); }

static int mm_pow(lua_State *L) {
  return raise(L, "'^' on a traced value: use exp(b * log(a)) or exp2(x)");
}

static int mm_shift(lua_State *L) {
  return raise(L, "'<<' or '>>' on a traced value: integer bitwise "
               "operations are not supported; use * and // by powers of 2");
}

static int mm_lt(lua_State *L) {
  return raise(L, "comparison '<' or '>' on a traced value: use lt(a, b) "
               "or gt(a, b)");
}

static int mm_le(lua_State *L) {
  return raise(L, "comparison '<=' or '>=' on a traced value: use le(a, b) "
               "or ge(a, b)");
}

static int mm_eq(lua_State *L) {
  return raise(L, "comparison '==' or '~=' on traced values: use eq(a, b) "
               "or ne(a, b)");
}

static int mm_index(lua_State *L) {
  return raise(L, "indexing a traced value (%s): traced values are numbers "
               "or booleans, not tables", fjl_describe(L, tracer_of(L)->g, 1));
}

static int mm_newindex(lua_State *L) {
  return raise(L, "assigning a field of a traced value: traced values are "
               "numbers or booleans, not tables");
}

static int mm_call(lua_State *L) {
  return raise(L, "calling a traced value: it is a number or a boolean, "
               "not a function");
}

static int mm_concat(lua_State *L) {
  return raise(L, "'..' on a traced value: its value is only known inside "
               "the kernel (use tostring() for a description)");
}

static int mm_len(lua_State *L) {
  return raise(L, "'#' on a traced value: it is a number or a boolean");
}

static int mm_tostring(lua_State *L) {
  fjg_graph *g = tracer_of(L)->g;
  int node = fjl_traced_node(L, 1);
  lua_pushfstring(L, "traced %s node %d",
                  fjg_type_name(node_type(g, node)), node);
  return 1;
}

static const luaL_Reg traced_meta[] = {
    {"__add", mm_add},     {"__sub", mm_sub},         {"__mul", mm_mul},
    {"__div", mm_div},     {"__idiv", mm_idiv},       {"__mod", mm_mod},
    {"__unm", mm_unm},     {"__pow", mm_pow},         {"__band", mm_band},
    {"__bor", mm_bor},     {"__bxor", mm_bxor},       {"__bnot", mm_bnot},
    {"__shl", mm_shift},   {"__shr", mm_shift},        {"__lt", mm_lt},
    {"__le", mm_le},       {"__eq", mm_eq},           {"__index", mm_index},
    {"__newindex", mm_newindex}, {"__call", mm_call}, {"__concat", mm_concat},
    {"__len", mm_len},     {"__tostring", mm_tostring}, {NULL, NULL}};

/* ---- buffers ---- */

static int buffer_index(lua_State *L) {
  fjg_graph *g = tracer_of(L)->g;
  buffer *buf = luaL_checkudata(L, 1, BUFFER_MT);
  const char *name = fjg_arg_at(g, buf->arg)->name;
  if (lua_type(L, 2) == LUA_TSTRING)
    return raise(L, "buffer '%s' has no fields: index it with a traced i32, "
                 "as in %s[q]", name, name);
  int idx = fjl_to_node(L, g, 2);
  if (node_type(g, idx) != FJG_I32)
    return raise(L, "buffer '%s' must be indexed with an i32 (got %s)", name,
                 fjl_describe(L, g, 2));
  return push_node(L, checked(L, g, fjg_load(g, buf->arg, idx)));
}

static int buffer_newindex(lua_State *L) {
  return raise(L, "buffers are read-only inside a spec");
}

static int buffer_tostring(lua_State *L) {
  fjg_graph *g = tracer_of(L)->g;
  buffer *buf = luaL_checkudata(L, 1, BUFFER_MT);
  lua_pushfstring(L, "buffer '%s' (%s)", fjg_arg_at(g, buf->arg)->name,
                  fjg_type_name((fjg_type)buf->elem));
  return 1;
}

static int buffer_misuse(lua_State *L) {
  return raise(L, "a buffer can only be indexed (buf[i]); its length and "
               "contents are known at launch");
}

static const luaL_Reg buffer_meta[] = {
    {"__index", buffer_index},   {"__newindex", buffer_newindex},
    {"__tostring", buffer_tostring}, {"__len", buffer_misuse},
    {"__call", buffer_misuse},   {"__add", buffer_misuse},
    {"__sub", buffer_misuse},    {"__mul", buffer_misuse},
    {"__lt", buffer_misuse},     {"__le", buffer_misuse},
    {"__eq", buffer_misuse},     {"__concat", buffer_misuse},
    {NULL, NULL}};

/* ---- DSL functions ---- */

static int dsl_lt(lua_State *L) { return binary(L, FJG_OP_LT); }
static int dsl_le(lua_State *L) { return binary(L, FJG_OP_LE); }
static int dsl_gt(lua_State *L) { return binary(L, FJG_OP_GT); }
static int dsl_ge(lua_State *L) { return binary(L, FJG_OP_GE); }
static int dsl_eq(lua_State *L) { return binary(L, FJG_OP_EQ); }
static int dsl_ne(lua_State *L) { return binary(L, FJG_OP_NE); }
static int dsl_exp(lua_State *L) { return unary(L, FJG_OP_EXP); }
static int dsl_exp2(lua_State *L) { return unary(L, FJG_OP_EXP2); }
static int dsl_log(lua_State *L) { return unary(L, FJG_OP_LOG); }
static int dsl_log2(lua_State *L) { return unary(L, FJG_OP_LOG2); }
static int dsl_sqrt(lua_State *L) { return unary(L, FJG_OP_SQRT); }
static int dsl_tanh(lua_State *L) { return unary(L, FJG_OP_TANH); }
static int dsl_abs(lua_State *L) { return unary(L, FJG_OP_ABS); }
static int dsl_floor(lua_State *L) { return unary(L, FJG_OP_FLOOR); }
static int dsl_ceil(lua_State *L) { return unary(L, FJG_OP_CEIL); }
static int dsl_logical_not(lua_State *L) {
  return logical(L, FJG_OP_NOT, "logical_not");
}

static int dsl_where(lua_State *L) {
  fjg_graph *g = tracer_of(L)->g;
  int c = fjl_to_node(L, g, 1);
  if (node_type(g, c) != FJG_BOOL)
    return raise(L, "where(c, a, b): c must be a boolean (got %s)",
                 fjl_describe(L, g, 1));
  int a = fjl_to_node(L, g, 2);
  int b = fjl_to_node(L, g, 3);
  return push_node(L, checked(L, g, fjg_where(g, c, a, b)));
}

/* min/max/logical_and/logical_or of two or more values, folded left. */
static int fold(lua_State *L, fjg_op op, const char *name) {
  fjg_graph *g = tracer_of(L)->g;
  int n = lua_gettop(L);
  if (n < 2)
    return raise(L, "%s needs at least two arguments", name);
  int acc = fjl_to_node(L, g, 1);
  for (int i = 2; i <= n; i++) {
    int x = fjl_to_node(L, g, i);
    if ((op == FJG_OP_AND || op == FJG_OP_OR) &&
        (node_type(g, acc) != FJG_BOOL || node_type(g, x) != FJG_BOOL))
      return raise(L, "%s combines booleans (got %s)", name,
                   fjl_describe(L, g, node_type(g, acc) != FJG_BOOL ? 1 : i));
    acc = checked(L, g, fjg_binary(g, op, acc, x));
  }
  return push_node(L, acc);
}

static int dsl_min(lua_State *L) { return fold(L, FJG_OP_MIN, "min"); }
static int dsl_max(lua_State *L) { return fold(L, FJG_OP_MAX, "max"); }
static int dsl_logical_and(lua_State *L) {
  return fold(L, FJG_OP_AND, "logical_and");
}
static int dsl_logical_or(lua_State *L) {
  return fold(L, FJG_OP_OR, "logical_or");
}

static fjg_type check_dtype(lua_State *L, int idx, const char *fn) {
  const char *t = lua_tostring(L, idx);
  if (t && strcmp(t, "i32") == 0)
    return FJG_I32;
  if (t && strcmp(t, "f32") == 0)
    return FJG_F32;
  raise(L, "%s: the type must be \"i32\" or \"f32\" (got %s)", fn,
        t ? t : luaL_typename(L, idx));
  return FJG_I32;
}

static const char *check_name(lua_State *L, const char *fn) {
  size_t len = 0;
  const char *name = lua_type(L, 1) == LUA_TSTRING ? lua_tolstring(L, 1, &len)
                                                   : NULL;
  if (!name || len == 0 || len >= sizeof(((fjg_arg *)0)->name))
    raise(L, "%s: the first argument must be a name of 1 to %d characters",
          fn, (int)sizeof(((fjg_arg *)0)->name) - 1);
  return name;
}

/* The options table of param()/buffer() at argument 3 (nil: none), read
 * without metamethods. Its only key is `grad` (true: the argument has a
 * gradient in the backward pass); returns that flag. */
static int check_options(lua_State *L, const char *fn, const char *name) {
  int grad = 0;
  if (lua_isnoneornil(L, 3))
    return 0;
  if (!lua_istable(L, 3))
    raise(L, "%s '%s': the options must be a table such as {grad = true} "
          "(got %s)", fn, name, luaL_typename(L, 3));
  lua_pushnil(L);
  while (lua_next(L, 3)) {
    if (lua_type(L, -2) != LUA_TSTRING)
      raise(L, "%s '%s': unknown option (a %s key); the only option is "
            "grad", fn, name, luaL_typename(L, -2));
    const char *key = lua_tostring(L, -2);
    if (strcmp(key, "grad") != 0)
      raise(L, "%s '%s': unknown option '%s'; the only option is grad", fn,
            name, key);
    if (lua_type(L, -1) != LUA_TBOOLEAN)
      raise(L, "%s '%s': grad must be true or false (got %s)", fn, name,
            luaL_typename(L, -1));
    grad = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  return grad;
}

static int dsl_param(lua_State *L) {
  fjg_graph *g = tracer_of(L)->g;
  const char *name = check_name(L, "param");
  fjg_type type = check_dtype(L, 2, "param");
  int grad = check_options(L, "param", name);
  int node = checked(L, g, fjg_param(g, name, type));
  if (grad) /* refused: only f32 buffers have gradients */
    checked(L, g, fjg_set_trainable(g, fjg_node_at(g, node)->arg));
  return push_node(L, node);
}

static int dsl_buffer(lua_State *L) {
  fjg_graph *g = tracer_of(L)->g;
  const char *name = check_name(L, "buffer");
  fjg_type elem = check_dtype(L, 2, "buffer");
  int grad = check_options(L, "buffer", name);
  int declared = fjg_num_args(g);
  int arg = checked(L, g, fjg_buffer(g, name, elem));
  if (arg < declared && fjg_arg_at(g, arg)->trainable != grad)
    raise(L, "buffer '%s' is already declared %s grad = true", name,
          grad ? "without" : "with");
  if (grad)
    checked(L, g, fjg_set_trainable(g, arg));
  buffer *buf = lua_newuserdatauv(L, sizeof *buf, 0);
  buf->arg = arg;
  buf->elem = elem;
  luaL_setmetatable(L, BUFFER_MT);
  return 1;
}

/* spec_error(msg): raises msg at the first line outside the prelude, so a
 * builder's complaint names the spec line that called it. */
static int dsl_spec_error(lua_State *L) {
  return raise(L, "%s", luaL_checkstring(L, 1));
}

static const luaL_Reg dsl_functions[] = {
    {"lt", dsl_lt},       {"le", dsl_le},         {"gt", dsl_gt},
    {"ge", dsl_ge},       {"eq", dsl_eq},         {"ne", dsl_ne},
    {"where", dsl_where}, {"exp", dsl_exp},       {"exp2", dsl_exp2},
    {"log", dsl_log},     {"log2", dsl_log2},     {"sqrt", dsl_sqrt},
    {"tanh", dsl_tanh},   {"abs", dsl_abs},       {"floor", dsl_floor},
    {"ceil", dsl_ceil},   {"min", dsl_min},       {"max", dsl_max},
    {"logical_and", dsl_logical_and}, {"logical_or", dsl_logical_or},
    {"logical_not", dsl_logical_not}, {"param", dsl_param},
    {"buffer", dsl_buffer}, {"spec_error", dsl_spec_error}, {NULL, NULL}};

static void new_metatable(lua_State *L, const char *name, const luaL_Reg *fns,
                          fjl_tracer *t, const char *lock) {
  luaL_newmetatable(L, name);
  lua_pushlightuserdata(L, t);
  luaL_setfuncs(L, fns, 1);
  /* getmetatable() returns this string, so a spec cannot reach or change
   * the metamethods. */
  lua_pushstring(L, lock);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
}

static void set_size_symbols(lua_State *L, fjg_graph *g) {
  static const struct {
    const char *name;
    fjg_size which;
  } sizes[] = {{"B", FJG_SZ_B},   {"Hq", FJG_SZ_HQ}, {"Hkv", FJG_SZ_HKV},
               {"Lq", FJG_SZ_LQ}, {"Lk", FJG_SZ_LK}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    push_node(L, checked(L, g, fjg_size_node(g, sizes[i].which)));
    lua_setglobal(L, sizes[i].name);
  }
}

int fjl_open_dsl(lua_State *L) {
  fjl_tracer *t = lua_touserdata(L, 1);
  new_metatable(L, TRACED_MT, traced_meta, t, "traced value");
  new_metatable(L, BUFFER_MT, buffer_meta, t, "buffer");
  lua_pushglobaltable(L);
  lua_pushlightuserdata(L, t);
  luaL_setfuncs(L, dsl_functions, 1);
  lua_pop(L, 1);
  set_size_symbols(L, t->g);
  return 0;
}
