/*
 * lua/check.c: bytecode check of mask_mod/score_mod (see check.h).
 *
 * The binary chunk format and the instruction encoding are those of Lua 5.4
 * (ldump.c, lopcodes.h), which lua_dump writes for the running interpreter;
 * the header is verified, so another version is reported, not misread.
 */
#include "lua/check.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "lua/trace.h"

/* Lua 5.4 opcodes, in lopcodes.h order. */
enum {
  OP_MOVE, OP_LOADI, OP_LOADF, OP_LOADK, OP_LOADKX, OP_LOADFALSE,
  OP_LFALSESKIP, OP_LOADTRUE, OP_LOADNIL, OP_GETUPVAL, OP_SETUPVAL,
  OP_GETTABUP, OP_GETTABLE, OP_GETI, OP_GETFIELD, OP_SETTABUP, OP_SETTABLE,
  OP_SETI, OP_SETFIELD, OP_NEWTABLE, OP_SELF, OP_ADDI, OP_ADDK, OP_SUBK,
  OP_MULK, OP_MODK, OP_POWK, OP_DIVK, OP_IDIVK, OP_BANDK, OP_BORK, OP_BXORK,
  OP_SHRI, OP_SHLI, OP_ADD, OP_SUB, OP_MUL, OP_MOD, OP_POW, OP_DIV, OP_IDIV,
  OP_BAND, OP_BOR, OP_BXOR, OP_SHL, OP_SHR, OP_MMBIN, OP_MMBINI, OP_MMBINK,
  OP_UNM, OP_BNOT, OP_NOT, OP_LEN, OP_CONCAT, OP_CLOSE, OP_TBC, OP_JMP,
  OP_EQ, OP_LT, OP_LE, OP_EQK, OP_EQI, OP_LTI, OP_LEI, OP_GTI, OP_GEI,
  OP_TEST, OP_TESTSET, OP_CALL, OP_TAILCALL, OP_RETURN, OP_RETURN0,
  OP_RETURN1, OP_FORLOOP, OP_FORPREP, OP_TFORPREP, OP_TFORCALL, OP_TFORLOOP,
  OP_SETLIST, OP_CLOSURE, OP_VARARG, OP_VARARGPREP, OP_EXTRAARG
};

/* iABC: op 7 bits, A 8, k 1, B 8, C 8 (lopcodes.h). */
#define INS_OP(i) ((int)((i) & 0x7f))
#define INS_A(i) ((int)(((i) >> 7) & 0xff))
#define INS_K(i) ((int)(((i) >> 15) & 1))
#define INS_B(i) ((int)(((i) >> 16) & 0xff))
#define INS_C(i) ((int)(((i) >> 24) & 0xff))

#define MAX_REGS 256
#define TABLE_DEPTH 2       /* how deep upvalue tables are searched */
#define TABLE_SCAN_MAX 4096 /* entries looked at per table */

/* Work bounds for one mod (every function it reaches together), far above
 * what real mods need (a few thousand steps, a few KiB). Without them a
 * spec could make the check superlinear: many closures of one large
 * function, or a chain of functions that each need one more sweep. A step
 * is one instruction analysed or one table entry looked at. */
#define CHECK_MAX_STEPS 20000000
#define CHECK_MAX_BYTES ((size_t)64 << 20) /* analysis memory per closure */

static const char msg_test[] =
    "'if'/'and'/'or' on a traced value (Lua treats it as always true): use "
    "where(c, a, b), & | ~, or and_masks/or_masks";
static const char msg_not[] =
    "'not' on a traced value (Lua treats it as always true): use ~x or "
    "logical_not(x)";
static const char msg_eq[] =
    "comparison '=='/'~=' on a traced value: use eq(a, b) or ne(a, b)";
static const char msg_lt[] =
    "comparison '<'/'>' on a traced value: use lt(a, b) or gt(a, b)";
static const char msg_le[] =
    "comparison '<='/'>=' on a traced value: use le(a, b) or ge(a, b)";
static const char msg_index[] =
    "indexing a Lua table with a traced value (its value is only known in "
    "the kernel): declare the table with buffer(name, dtype)";

/* ---- memory: released by __gc if an error unwinds through us ---- */

typedef struct arena {
  void **ptrs;
  size_t n, cap;
  char *dump;
  size_t len, dcap;
  size_t bytes; /* allocated for the analysis, up to CHECK_MAX_BYTES */
  int over;     /* a request would have passed CHECK_MAX_BYTES */
} arena;

/* Counts a request against CHECK_MAX_BYTES; 0 when it would pass it. */
static int arena_charge(arena *a, size_t bytes) {
  if (bytes > CHECK_MAX_BYTES - a->bytes) {
    a->over = 1;
    return 0;
  }
  a->bytes += bytes;
  return 1;
}

static void arena_release(arena *a) {
  for (size_t i = 0; i < a->n; i++)
    free(a->ptrs[i]);
  free(a->ptrs);
  free(a->dump);
  memset(a, 0, sizeof *a);
}

static int arena_gc(lua_State *L) {
  arena_release(lua_touserdata(L, 1));
  return 0;
}

static void *arena_calloc(arena *a, size_t count, size_t size) {
  if (size && count > CHECK_MAX_BYTES / size)
    count = CHECK_MAX_BYTES / size + 1; /* refused below, without overflow */
  if (!arena_charge(a, (count ? count : 1) * size))
    return NULL;
  if (a->n == a->cap) {
    size_t cap = a->cap ? 2 * a->cap : 16;
    void **p = realloc(a->ptrs, cap * sizeof *p);
    if (!p)
      return NULL;
    a->ptrs = p;
    a->cap = cap;
  }
  void *mem = calloc(count ? count : 1, size);
  if (mem)
    a->ptrs[a->n++] = mem;
  return mem;
}

static int dump_writer(lua_State *L, const void *p, size_t sz, void *ud) {
  arena *a = ud;
  if (a->len + sz > a->dcap) {
    size_t cap = a->dcap ? 2 * a->dcap : 4096;
    while (cap < a->len + sz)
      cap *= 2;
    if (!arena_charge(a, cap - a->dcap))
      return 1;
    char *d = realloc(a->dump, cap);
    if (!d)
      return 1;
    a->dump = d;
    a->dcap = cap;
  }
  memcpy(a->dump + a->len, p, sz);
  a->len += sz;
  return 0;
}

static arena *push_arena(lua_State *L) {
  arena *a = lua_newuserdatauv(L, sizeof *a, 0);
  memset(a, 0, sizeof *a);
  if (luaL_newmetatable(L, "fjl.arena")) {
    lua_pushcfunction(L, arena_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  return a;
}

/* ---- parsing the binary chunk ---- */

typedef struct kvalue {
  int tag; /* Lua's variant tag: 0x04/0x14 strings, others unused here */
  const char *str;
  size_t len;
} kvalue;

typedef struct regset {
  uint64_t w[MAX_REGS / 64];
} regset;

typedef struct proto {
  struct proto *parent;
  const char *source;
  size_t source_len;
  int linedefined, numparams, is_vararg, maxstack;
  int ncode;
  const unsigned char *code;
  int nk;
  kvalue *k;
  int nup;
  const unsigned char *up; /* 3 bytes each: instack, idx, kind */
  int np;
  struct proto **p;
  int nline;
  const signed char *lineinfo;
  int nabs;
  int *abs; /* pc, line pairs */
  /* Analysis state. A regset has bit r set when register r may hold a
   * traced value. */
  regset *in; /* state before each instruction */
  unsigned char *reached;
  int *work; /* worklist of pcs */
  unsigned char *queued;
  regset any;    /* union of all states: what a nested closure sees */
  regset forced; /* registers a nested closure stores a traced value in */
  unsigned char uptaint[MAX_REGS]; /* upvalue may hold a traced value */
} proto;

typedef struct reader {
  const unsigned char *p, *end;
  arena *a;
  int bad;
  int oom;
} reader;

static int rd_byte(reader *r) {
  if (r->p >= r->end) {
    r->bad = 1;
    return 0;
  }
  return *r->p++;
}

/* ldump.c's dumpSize: 7 bits a byte, most significant first, the last byte
 * marked with 0x80. */
static size_t rd_size(reader *r) {
  size_t x = 0;
  int b;
  do {
    b = rd_byte(r);
    if (x > (SIZE_MAX >> 7)) {
      r->bad = 1;
      return 0;
    }
    x = (x << 7) | (size_t)(b & 0x7f);
  } while (!(b & 0x80) && !r->bad);
  return x;
}

static int rd_int(reader *r) {
  size_t x = rd_size(r);
  if (x > INT_MAX) {
    r->bad = 1;
    return 0;
  }
  return (int)x;
}

static const unsigned char *rd_block(reader *r, size_t n) {
  if ((size_t)(r->end - r->p) < n) {
    r->bad = 1;
    return NULL;
  }
  const unsigned char *s = r->p;
  r->p += n;
  return s;
}

static const char *rd_string(reader *r, size_t *len) {
  size_t n = rd_size(r);
  *len = 0;
  if (n == 0)
    return NULL;
  *len = n - 1;
  return (const char *)rd_block(r, n - 1);
}

/* An array of `count` items of `size` bytes, refusing counts the remaining
 * input could not hold (each item takes at least one byte). */
static void *rd_alloc(reader *r, int count, size_t size) {
  if (r->bad || (size_t)count > (size_t)(r->end - r->p) + 1) {
    r->bad = 1;
    return NULL;
  }
  void *p = arena_calloc(r->a, (size_t)count, size);
  if (!p)
    r->bad = r->oom = 1;
  return p;
}

static void rd_header(reader *r) {
  static const unsigned char expect[15] = {
      0x1b, 'L', 'u', 'a', 0x54, 0x00, 0x19, 0x93, '\r', '\n', 0x1a, '\n',
      4 /* Instruction */, 8 /* lua_Integer */, 8 /* lua_Number */};
  const unsigned char *h = rd_block(r, sizeof expect);
  if (!h || memcmp(h, expect, sizeof expect) != 0)
    r->bad = 1;
  rd_block(r, 16); /* LUAC_INT, LUAC_NUM: written by this very machine */
  rd_byte(r);      /* upvalue count of the main function */
}

static void rd_constants(reader *r, proto *f) {
  f->nk = rd_int(r);
  f->k = rd_alloc(r, f->nk, sizeof *f->k);
  for (int i = 0; i < f->nk && !r->bad; i++) {
    int tag = rd_byte(r);
    f->k[i].tag = tag;
    switch (tag) {
    case 0x03: /* integer */
    case 0x13: /* float */
      rd_block(r, 8);
      break;
    case 0x04: /* short string */
    case 0x14: /* long string */
      f->k[i].str = rd_string(r, &f->k[i].len);
      break;
    case 0x00: case 0x01: case 0x11: /* nil, false, true */
      break;
    default:
      r->bad = 1;
    }
  }
}

static void rd_debug(reader *r, proto *f) {
  f->nline = rd_int(r);
  f->lineinfo = (const signed char *)rd_block(r, (size_t)f->nline);
  f->nabs = rd_int(r);
  f->abs = rd_alloc(r, 2 * f->nabs, sizeof *f->abs);
  for (int i = 0; i < f->nabs && !r->bad; i++) {
    f->abs[2 * i] = rd_int(r);
    f->abs[2 * i + 1] = rd_int(r);
  }
  int nlocvars = rd_int(r);
  for (int i = 0; i < nlocvars && !r->bad; i++) {
    size_t len;
    rd_string(r, &len);
    rd_int(r);
    rd_int(r);
  }
  int nupnames = rd_int(r);
  for (int i = 0; i < nupnames && !r->bad; i++) {
    size_t len;
    rd_string(r, &len);
  }
}

static proto *rd_function(reader *r, proto *parent, int depth) {
  if (depth > 200) {
    r->bad = 1;
    return NULL;
  }
  proto *f = rd_alloc(r, 1, sizeof *f);
  if (!f)
    return NULL;
  f->parent = parent;
  f->source = rd_string(r, &f->source_len);
  if (!f->source && parent) { /* same source as the enclosing function */
    f->source = parent->source;
    f->source_len = parent->source_len;
  }
  f->linedefined = rd_int(r);
  rd_int(r); /* lastlinedefined */
  f->numparams = rd_byte(r);
  f->is_vararg = rd_byte(r);
  f->maxstack = rd_byte(r);
  f->ncode = rd_int(r);
  f->code = rd_block(r, (size_t)f->ncode * 4);
  if (!r->bad) { /* ncode is bounded by the code just read */
    f->in = arena_calloc(r->a, (size_t)f->ncode, sizeof *f->in);
    f->reached = arena_calloc(r->a, (size_t)f->ncode, 1);
    f->work = arena_calloc(r->a, (size_t)f->ncode, sizeof *f->work);
    f->queued = arena_calloc(r->a, (size_t)f->ncode, 1);
    if (!f->in || !f->reached || !f->work || !f->queued)
      r->bad = r->oom = 1;
  }
  rd_constants(r, f);
  f->nup = rd_int(r);
  f->up = rd_block(r, (size_t)f->nup * 3);
  f->np = rd_int(r);
  f->p = rd_alloc(r, f->np, sizeof *f->p);
  for (int i = 0; i < f->np && !r->bad; i++)
    f->p[i] = rd_function(r, f, depth + 1);
  rd_debug(r, f);
  if (f->nup > MAX_REGS || f->maxstack > MAX_REGS)
    r->bad = 1;
  return r->bad ? NULL : f;
}

/* ---- the dataflow ---- */

typedef struct checker {
  lua_State *L;
  int fn;      /* stack index of the closure being analysed */
  int queue;   /* array of functions still to check */
  int tail;
  int visited; /* set of functions already checked */
  int trusted; /* set of functions never checked, or 0 */
  int stored;  /* set of global names a traced value was stored under */
  int memo[TABLE_DEPTH + 1]; /* per depth: table -> classify's answer */
  int changed; /* something that other functions depend on grew */
  long steps;  /* work done, up to CHECK_MAX_STEPS */
} checker;

/* Raises "chunk:line: cannot check this function: <why>" at the definition
 * of the closure being checked. */
static int cannot_check(checker *c, const char *why) {
  lua_State *L = c->L;
  lua_Debug ar;
  lua_pushvalue(L, c->fn);
  if (lua_getinfo(L, ">S", &ar) && ar.linedefined > 0)
    lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.linedefined);
  else
    lua_pushfstring(L, "%s: ", ar.short_src);
  lua_pushfstring(L, "cannot check this function: %s", why);
  lua_concat(L, 2);
  return lua_error(L);
}

static void spend(checker *c, long steps) {
  c->steps += steps;
  if (c->steps > CHECK_MAX_STEPS)
    cannot_check(c, "it takes more than 20 million steps of analysis "
                 "(CHECK_MAX_STEPS); split the mod, or capture smaller "
                 "tables");
}

static uint32_t ins_at(const proto *f, int pc) {
  uint32_t i;
  memcpy(&i, f->code + 4 * (size_t)pc, 4);
  return i;
}

static int line_at(const proto *f, int pc) {
  if (!f->lineinfo || pc >= f->nline)
    return f->linedefined;
  int basepc = -1, line = f->linedefined;
  for (int i = 0; i < f->nabs && f->abs[2 * i] <= pc; i++) {
    basepc = f->abs[2 * i];
    line = f->abs[2 * i + 1];
  }
  while (basepc++ < pc)
    line += f->lineinfo[basepc];
  return line;
}

static int is_tainted(const regset *s, int r) {
  return r >= 0 && r < MAX_REGS && (s->w[r >> 6] >> (r & 63) & 1);
}

static int any_tainted(const regset *s, int from, int to) {
  for (int r = from; r <= to && r < MAX_REGS; r++)
    if (is_tainted(s, r))
      return 1;
  return 0;
}

/* Strong update: the register now holds exactly this. */
static void set_reg(regset *s, int r, int v) {
  if (r < 0 || r >= MAX_REGS)
    return;
  uint64_t bit = (uint64_t)1 << (r & 63);
  s->w[r >> 6] = v ? s->w[r >> 6] | bit : s->w[r >> 6] & ~bit;
}

/* Weak update: the register may also hold a traced value now. */
static void or_reg(regset *s, int r, int v) {
  if (v)
    set_reg(s, r, 1);
}

static void set_range(regset *s, int from, int to, int v) {
  for (int r = from; r <= to; r++)
    set_reg(s, r, v);
}

/* dst |= src; 1 when dst grew. */
static int merge(regset *dst, const regset *src) {
  int grew = 0;
  for (int k = 0; k < MAX_REGS / 64; k++) {
    uint64_t w = dst->w[k] | src->w[k];
    grew |= w != dst->w[k];
    dst->w[k] = w;
  }
  return grew;
}

static void taint_upvalue(checker *c, proto *f, int u) {
  if (u >= 0 && u < f->nup && !f->uptaint[u]) {
    f->uptaint[u] = 1;
    c->changed = 1;
  }
}

/* Index of the closure's own upvalue that upvalue u of f refers to, or -1
 * when it lives in a register of an enclosing function. */
static int closure_upvalue(const proto *f, int u) {
  while (f->parent) {
    if (f->up[3 * u])
      return -1;
    u = f->up[3 * u + 1];
    f = f->parent;
  }
  return u;
}

static void enqueue(checker *c, int idx) {
  lua_pushvalue(c->L, idx);
  lua_rawseti(c->L, c->queue, ++c->tail);
}

static int is_globals(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
  int same = lua_rawequal(L, idx, -1);
  lua_pop(L, 1);
  return same;
}

/* 1 when the value at idx is, or holds in a table up to `depth` levels
 * deep, a traced value or a buffer. Lua functions met on the way are queued
 * for checking: a mod may call them with traced arguments. The globals
 * table is not searched: its entries are looked up by name (GETTABUP). */
static int classify(checker *c, int idx, int depth) {
  lua_State *L = c->L;
  idx = lua_absindex(L, idx);
  if (fjl_traced_node(L, idx) >= 0 || fjl_is_buffer(L, idx))
    return 1;
  if (lua_type(L, idx) == LUA_TFUNCTION) {
    if (!lua_iscfunction(L, idx))
      enqueue(c, idx);
    return 0;
  }
  if (lua_type(L, idx) != LUA_TTABLE || depth <= 0 || is_globals(L, idx))
    return 0;
  /* A table is looked through once per depth: the dataflow asks again at
   * every read of it, in every sweep. */
  lua_pushvalue(L, idx);
  if (lua_rawget(L, c->memo[depth]) != LUA_TNIL) {
    int found = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return found;
  }
  lua_pop(L, 1);
  int found = 0, seen = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    spend(c, 1);
    found |= classify(c, -1, depth - 1);
    lua_pop(L, 1);
    if (++seen > TABLE_SCAN_MAX) { /* too big to look through: assume */
      lua_pop(L, 1);
      found = 1;
      break;
    }
  }
  lua_pushvalue(L, idx);
  lua_pushboolean(L, found);
  lua_rawset(L, c->memo[depth]);
  return found;
}

static const kvalue *string_constant(const proto *f, int k) {
  if (k < 0 || k >= f->nk || !f->k[k].str)
    return NULL;
  return &f->k[k];
}

/* Taint of UpValue[u][K[k]] in f: the upvalue's own taint, the real value
 * when the upvalue is one of the closure's, and names a traced value was
 * stored under. */
static int global_taint(checker *c, proto *f, int u, int k) {
  lua_State *L = c->L;
  const kvalue *key = string_constant(f, k);
  int t = u < f->nup && f->uptaint[u];
  if (!key)
    return 1;
  lua_pushlstring(L, key->str, key->len);
  if (lua_rawget(L, c->stored) != LUA_TNIL)
    t = 1;
  lua_pop(L, 1);
  int cu = closure_upvalue(f, u);
  if (cu >= 0 && lua_getupvalue(L, c->fn, cu + 1)) {
    if (lua_type(L, -1) == LUA_TTABLE) {
      lua_pushlstring(L, key->str, key->len);
      lua_rawget(L, -2);
      t |= classify(c, -1, TABLE_DEPTH);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  return t;
}

static void remember_stored(checker *c, proto *f, int k) {
  const kvalue *key = string_constant(f, k);
  if (!key)
    return;
  lua_pushlstring(c->L, key->str, key->len);
  if (lua_rawget(c->L, c->stored) == LUA_TNIL) {
    lua_pushlstring(c->L, key->str, key->len);
    lua_pushboolean(c->L, 1);
    lua_rawset(c->L, c->stored);
    c->changed = 1;
  }
  lua_pop(c->L, 1);
}

/* A nested function stores a traced value into upvalue u: the variable it
 * names (a register or upvalue of the enclosing function) may hold one
 * from then on, anywhere. */
static void store_upvalue(checker *c, proto *f, int u) {
  taint_upvalue(c, f, u);
  if (!f->parent || u >= f->nup)
    return;
  int idx = f->up[3 * u + 1];
  if (!f->up[3 * u]) {
    taint_upvalue(c, f->parent, idx);
  } else if (!is_tainted(&f->parent->forced, idx)) {
    set_reg(&f->parent->forced, idx, 1);
    c->changed = 1;
  }
}

/* RK(C) of the SET instructions: a constant when k is set. */
static int rk_tainted(const regset *s, uint32_t i) {
  return !INS_K(i) && is_tainted(s, INS_C(i));
}

/* The state after instruction i, given the state s before it. */
static void transfer(checker *c, proto *f, uint32_t i, regset *s) {
  int a = INS_A(i), b = INS_B(i), cc = INS_C(i);
  int top = f->maxstack - 1;
  switch (INS_OP(i)) {
  case OP_MOVE: case OP_UNM: case OP_BNOT: case OP_LEN:
  case OP_GETFIELD: case OP_GETI: case OP_ADDI: case OP_ADDK: case OP_SUBK:
  case OP_MULK: case OP_MODK: case OP_POWK: case OP_DIVK: case OP_IDIVK:
  case OP_BANDK: case OP_BORK: case OP_BXORK: case OP_SHRI: case OP_SHLI:
    set_reg(s, a, is_tainted(s, b));
    break;
  case OP_GETTABLE: case OP_ADD: case OP_SUB: case OP_MUL: case OP_MOD:
  case OP_POW: case OP_DIV: case OP_IDIV: case OP_BAND: case OP_BOR:
  case OP_BXOR: case OP_SHL: case OP_SHR:
    set_reg(s, a, is_tainted(s, b) || is_tainted(s, cc));
    break;
  case OP_LOADI: case OP_LOADF: case OP_LOADK: case OP_LOADKX:
  case OP_LOADFALSE: case OP_LFALSESKIP: case OP_LOADTRUE: case OP_NOT:
  case OP_NEWTABLE: case OP_CLOSURE:
    set_reg(s, a, 0);
    break;
  case OP_LOADNIL:
    set_range(s, a, a + b, 0);
    break;
  case OP_SELF: {
    int v = is_tainted(s, b);
    set_reg(s, a + 1, v);
    set_reg(s, a, v);
    break;
  }
  case OP_GETUPVAL:
    set_reg(s, a, b < f->nup && f->uptaint[b]);
    break;
  case OP_SETUPVAL:
    if (is_tainted(s, a))
      store_upvalue(c, f, b);
    break;
  case OP_GETTABUP:
    set_reg(s, a, global_taint(c, f, b, cc));
    break;
  case OP_SETTABUP:
    if (rk_tainted(s, i))
      remember_stored(c, f, b);
    break;
  case OP_SETTABLE: case OP_SETI: case OP_SETFIELD:
    or_reg(s, a, rk_tainted(s, i)); /* the table now holds one */
    break;
  case OP_SETLIST:
    or_reg(s, a, any_tainted(s, a + 1, b ? a + b : top));
    break;
  case OP_CONCAT:
    set_reg(s, a, any_tainted(s, a, a + b - 1));
    break;
  case OP_TESTSET: /* copies R[B] on one of its two paths */
    or_reg(s, a, is_tainted(s, b));
    break;
  case OP_CALL: /* results of any call may be traced; above them is dead */
    set_range(s, a, cc ? a + cc - 2 : top, 1);
    if (cc)
      set_range(s, a + cc - 1, top, 0);
    break;
  case OP_VARARG:
    set_range(s, a, cc ? a + cc - 2 : top, 1);
    break;
  case OP_TFORCALL:
    set_range(s, a + 4, a + 3 + cc, 1);
    break;
  case OP_TFORLOOP:
    or_reg(s, a + 2, is_tainted(s, a + 4));
    break;
  case OP_FORPREP: case OP_FORLOOP: /* (re)sets the control variable */
    set_reg(s, a + 3, any_tainted(s, a, a + 2));
    break;
  default: /* jumps, tests, comparisons, returns: no register written */
    break;
  }
  merge(s, &f->forced);
}

/* Successors of the instruction at pc (lvm.c's pc arithmetic); returns
 * how many were written. */
static int successors(const proto *f, int pc, uint32_t i, int succ[2]) {
  int bx = (int)(i >> 15);
  int n = 0;
  switch (INS_OP(i)) {
  case OP_JMP:
    succ[n++] = pc + 1 + ((int)((i >> 7) & 0x1ffffff) - 0xffffff);
    break;
  case OP_EQ: case OP_LT: case OP_LE: case OP_EQK: case OP_EQI: case OP_LTI:
  case OP_LEI: case OP_GTI: case OP_GEI: case OP_TEST: case OP_TESTSET:
    succ[n++] = pc + 1; /* the jump that follows */
    succ[n++] = pc + 2;
    break;
  case OP_LFALSESKIP:
    succ[n++] = pc + 2;
    break;
  case OP_FORPREP:
    succ[n++] = pc + 1;
    succ[n++] = pc + bx + 2;
    break;
  case OP_FORLOOP: case OP_TFORLOOP:
    succ[n++] = pc + 1;
    succ[n++] = pc + 1 - bx;
    break;
  case OP_TFORPREP:
    succ[n++] = pc + 1 + bx;
    break;
  case OP_RETURN: case OP_RETURN0: case OP_RETURN1:
    break;
  default:
    succ[n++] = pc + 1;
    break;
  }
  int kept = 0;
  for (int k = 0; k < n; k++)
    if (succ[k] >= 0 && succ[k] < f->ncode)
      succ[kept++] = succ[k];
  return kept;
}

static void push_work(proto *f, int *nwork, int pc) {
  if (!f->queued[pc]) {
    f->queued[pc] = 1;
    f->work[(*nwork)++] = pc;
  }
}

/* Forward worklist over f's instructions until the states stop growing. */
static void analyse(checker *c, proto *f) {
  int nwork = 0;
  regset entry = {{0}};
  set_range(&entry, 0, f->numparams - 1, 1); /* arguments may be traced */
  merge(&entry, &f->forced);
  if (f->ncode == 0)
    return;
  merge(&f->in[0], &entry);
  f->reached[0] = 1;
  for (int pc = 0; pc < f->ncode; pc++)
    if (f->reached[pc])
      push_work(f, &nwork, pc);
  while (nwork > 0) {
    int pc = f->work[--nwork];
    f->queued[pc] = 0;
    spend(c, 1);
    uint32_t i = ins_at(f, pc);
    regset s = f->in[pc];
    transfer(c, f, i, &s);
    int grew_any = merge(&f->any, &s);
    grew_any |= merge(&f->any, &f->in[pc]);
    if (grew_any)
      c->changed = 1;
    int succ[2];
    int n = successors(f, pc, i, succ);
    for (int k = 0; k < n; k++) {
      int grew = merge(&f->in[succ[k]], &s);
      if (grew || !f->reached[succ[k]]) {
        f->reached[succ[k]] = 1;
        push_work(f, &nwork, succ[k]);
      }
    }
  }
}

static void inherit_upvalues(checker *c, proto *f) {
  for (int u = 0; u < f->nup; u++) {
    int instack = f->up[3 * u], idx = f->up[3 * u + 1];
    int v = instack ? is_tainted(&f->parent->any, idx)
                    : idx < f->parent->nup && f->parent->uptaint[idx];
    if (v)
      taint_upvalue(c, f, u);
  }
}

static void sweep(checker *c, proto *f) {
  if (f->parent)
    inherit_upvalues(c, f);
  analyse(c, f);
  for (int i = 0; i < f->np; i++)
    sweep(c, f->p[i]);
}

/* The message for an instruction that would act on the proxy object rather
 * than the traced value, given the state s before it, or NULL. */
static const char *misuse(const regset *s, uint32_t i) {
  int a = INS_A(i), b = INS_B(i);
  switch (INS_OP(i)) {
  case OP_TEST:
    return is_tainted(s, a) ? msg_test : NULL;
  case OP_TESTSET:
    return is_tainted(s, b) ? msg_test : NULL;
  case OP_NOT:
    return is_tainted(s, b) ? msg_not : NULL;
  case OP_EQ:
    return is_tainted(s, a) || is_tainted(s, b) ? msg_eq : NULL;
  case OP_EQK: case OP_EQI:
    return is_tainted(s, a) ? msg_eq : NULL;
  case OP_LT:
    return is_tainted(s, a) || is_tainted(s, b) ? msg_lt : NULL;
  case OP_LTI: case OP_GTI:
    return is_tainted(s, a) ? msg_lt : NULL;
  case OP_LE:
    return is_tainted(s, a) || is_tainted(s, b) ? msg_le : NULL;
  case OP_LEI: case OP_GEI:
    return is_tainted(s, a) ? msg_le : NULL;
  case OP_GETTABLE:
    return is_tainted(s, INS_C(i)) && !is_tainted(s, b) ? msg_index : NULL;
  default:
    return NULL;
  }
}

/* Pushes "chunk:line: message" for the first misuse in f (or its nested
 * functions), in code order; returns 0 when there is none. */
static int report(lua_State *L, const proto *f) {
  for (int pc = 0; pc < f->ncode; pc++) {
    const char *msg = f->reached[pc] ? misuse(&f->in[pc], ins_at(f, pc)) : NULL;
    if (!msg)
      continue;
    const char *src = f->source ? f->source : "?";
    size_t len = f->source ? f->source_len : 1;
    if (len > 0 && (src[0] == '@' || src[0] == '=')) {
      src++;
      len--;
    }
    lua_pushlstring(L, src, len);
    lua_pushfstring(L, ":%d: %s", line_at(f, pc), msg);
    lua_concat(L, 2);
    return 1;
  }
  for (int i = 0; i < f->np; i++)
    if (report(L, f->p[i]))
      return 1;
  return 0;
}

static void closure_upvalue_taint(checker *c, proto *f) {
  for (int u = 0; u < f->nup; u++) {
    if (!lua_getupvalue(c->L, c->fn, u + 1))
      break;
    if (!is_globals(c->L, -1) && classify(c, -1, TABLE_DEPTH))
      f->uptaint[u] = 1;
    lua_pop(c->L, 1);
  }
}

/* Checks the Lua closure at c->fn; raises at the first misuse. */
static void check_closure(checker *c) {
  lua_State *L = c->L;
  arena *a = push_arena(L);
  lua_pushvalue(L, c->fn);
  int dumped = lua_dump(L, dump_writer, a, 0);
  lua_pop(L, 1);
  if (dumped != 0 && !a->over)
    cannot_check(c, "out of memory");
  if (a->over)
    cannot_check(c, "its analysis needs more than 64 MiB "
                 "(CHECK_MAX_BYTES); split the mod");
  reader r = {(const unsigned char *)a->dump,
              (const unsigned char *)a->dump + a->len, a, 0, 0};
  rd_header(&r);
  proto *top = rd_function(&r, NULL, 0);
  if (!top && a->over)
    cannot_check(c, "its analysis needs more than 64 MiB "
                 "(CHECK_MAX_BYTES); split the mod");
  if (!top)
    cannot_check(c, r.oom ? "out of memory"
                          : "unexpected Lua bytecode format (flexjit reads "
                            "Lua 5.4)");
  closure_upvalue_taint(c, top);
  /* Upvalue, global-name and `any` taint only grow: this terminates. */
  do {
    c->changed = 0;
    sweep(c, top);
  } while (c->changed);
  if (report(L, top))
    lua_error(L);
  arena_release(a);
  lua_pop(L, 1);
}

static int in_set(lua_State *L, int set, int idx) {
  if (!set)
    return 0;
  lua_pushvalue(L, idx);
  int found = lua_rawget(L, set) != LUA_TNIL;
  lua_pop(L, 1);
  return found;
}

int fjl_check_mod(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  checker c;
  memset(&c, 0, sizeof c);
  c.L = L;
  c.trusted = lua_istable(L, 2) ? 2 : 0;
  lua_settop(L, 2);
  lua_newtable(L);
  c.queue = lua_gettop(L);
  lua_newtable(L);
  c.visited = lua_gettop(L);
  lua_newtable(L);
  c.stored = lua_gettop(L);
  for (int d = 1; d <= TABLE_DEPTH; d++) {
    lua_newtable(L);
    c.memo[d] = lua_gettop(L);
  }
  enqueue(&c, 1);
  for (int head = 1; head <= c.tail; head++) {
    lua_rawgeti(L, c.queue, head);
    int fn = lua_gettop(L);
    if (!lua_iscfunction(L, fn) && !in_set(L, c.visited, fn) &&
        !in_set(L, c.trusted, fn)) {
      lua_pushvalue(L, fn);
      lua_pushboolean(L, 1);
      lua_rawset(L, c.visited);
      c.fn = fn;
      check_closure(&c);
    }
    lua_pop(L, 1);
  }
  return 0;
}
