/*
 * gen/graph.c: the traced expression graph (hash-consed nodes, type
 * promotion, constant folding, declared arguments, roots) and fjg_buf.
 */
#include "gen/graph.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/derivative.h"
#include "gen/interval.h"

struct fjg_graph {
  fjg_node *nodes;
  int num_nodes, cap_nodes;
  /* Open-addressing hash of node ids (-1: empty slot), power-of-two size. */
  int32_t *slots;
  size_t num_slots;
  fjg_arg *args;
  int num_args, cap_args;
  int mask_root, score_root;
  /* The derivative of score_mod, when has_derivative. */
  fjg_derivative derivative;
  int has_derivative;
  /* Nodes reachable from the mask root, the score root and the
   * derivative's nodes, ascending (see fjg_reachable). */
  int32_t *reach[3];
  int reach_count[3];
  char error[256];
};

/* ---- names ---- */

static const char *const op_names[] = {
#define FJG_OP_NAME_(name, text, arity) text,
    FJG_OP_MAP(FJG_OP_NAME_)
#undef FJG_OP_NAME_
};
static const int op_arities[] = {
#define FJG_OP_ARITY_(name, text, arity) arity,
    FJG_OP_MAP(FJG_OP_ARITY_)
#undef FJG_OP_ARITY_
};

const char *fjg_op_name(fjg_op op) {
  return (unsigned)op < FJG_NUM_OPS ? op_names[op] : "?";
}

int fjg_op_arity(fjg_op op) {
  return (unsigned)op < FJG_NUM_OPS ? op_arities[op] : -1;
}

const char *fjg_type_name(fjg_type type) {
  switch (type) {
  case FJG_BOOL: return "bool";
  case FJG_I32: return "i32";
  case FJG_F32: return "f32";
  }
  return "?";
}

/* ---- lifetime and errors ---- */

fjg_graph *fjg_graph_create(void) {
  fjg_graph *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->mask_root = -1;
  g->score_root = -1;
  return g;
}

void fjg_graph_destroy(fjg_graph *g) {
  if (!g) return;
  free(g->nodes);
  free(g->slots);
  free(g->args);
  free(g->reach[0]);
  free(g->reach[1]);
  free(g->reach[2]);
  free(g);
}

const char *fjg_graph_error(const fjg_graph *g) { return g->error; }

/* Records the message of a failed builder call; returns -1 for `return`. */
static int fail(fjg_graph *g, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int fail(fjg_graph *g, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->error, sizeof g->error, fmt, ap);
  va_end(ap);
  return -1;
}

int fjg_num_nodes(const fjg_graph *g) { return g->num_nodes; }

const fjg_node *fjg_node_at(const fjg_graph *g, int id) {
  return (id >= 0 && id < g->num_nodes) ? &g->nodes[id] : NULL;
}

int fjg_num_args(const fjg_graph *g) { return g->num_args; }

const fjg_arg *fjg_arg_at(const fjg_graph *g, int index) {
  return (index >= 0 && index < g->num_args) ? &g->args[index] : NULL;
}

int fjg_find_arg(const fjg_graph *g, const char *name) {
  for (int i = 0; i < g->num_args; i++)
    if (strcmp(g->args[i].name, name) == 0) return i;
  return -1;
}

/* ---- hash-consing ---- */

static uint32_t imm_bits(const fjg_node *n) {
  uint32_t u;
  memcpy(&u, &n->imm, sizeof u);
  return u;
}

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

static uint64_t node_hash(const fjg_node *n) {
  uint64_t h = mix(n->op, n->type);
  h = mix(h, (uint32_t)n->a);
  h = mix(h, (uint32_t)n->b);
  h = mix(h, (uint32_t)n->c);
  h = mix(h, (uint32_t)n->arg);
  h = mix(h, imm_bits(n));
  return h ^ (h >> 29);
}

static int node_equal(const fjg_node *x, const fjg_node *y) {
  return x->op == y->op && x->type == y->type && x->a == y->a &&
         x->b == y->b && x->c == y->c && x->arg == y->arg &&
         imm_bits(x) == imm_bits(y);
}

static size_t find_slot(const int32_t *slots, size_t num_slots,
                        const fjg_node *nodes, const fjg_node *key) {
  size_t mask = num_slots - 1;
  size_t i = (size_t)node_hash(key) & mask;
  while (slots[i] >= 0 && !node_equal(&nodes[slots[i]], key))
    i = (i + 1) & mask;
  return i;
}

/* Keeps the table at most half full. */
static int grow_slots(fjg_graph *g) {
  size_t n = g->num_slots ? g->num_slots * 2 : 64;
  int32_t *slots = malloc(n * sizeof *slots);
  if (!slots) return -1;
  for (size_t i = 0; i < n; i++) slots[i] = -1;
  for (int id = 0; id < g->num_nodes; id++)
    slots[find_slot(slots, n, g->nodes, &g->nodes[id])] = id;
  free(g->slots);
  g->slots = slots;
  g->num_slots = n;
  return 0;
}

/* Returns the id of the node equal to *key, adding it when new. */
static int intern(fjg_graph *g, const fjg_node *key) {
  if ((size_t)(g->num_nodes + 1) * 2 > g->num_slots && grow_slots(g) < 0)
    return fail(g, "out of memory while building the graph");
  size_t slot = find_slot(g->slots, g->num_slots, g->nodes, key);
  if (g->slots[slot] >= 0) return g->slots[slot];
  if (g->num_nodes >= FJG_MAX_NODES)
    return fail(g, "the graph has more than %d nodes (the limit, "
                   "FJG_MAX_NODES): a loop keeps building traced values",
                FJG_MAX_NODES);
  if (g->num_nodes == g->cap_nodes) {
    int cap = g->cap_nodes ? g->cap_nodes * 2 : 64;
    fjg_node *nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
    if (!nodes) return fail(g, "out of memory while building the graph");
    g->nodes = nodes;
    g->cap_nodes = cap;
  }
  int id = g->num_nodes++;
  g->nodes[id] = *key;
  g->slots[slot] = id;
  return id;
}

static fjg_node make_node(fjg_op op, fjg_type type, int a, int b, int c,
                          int arg) {
  fjg_node n;
  memset(&n, 0, sizeof n);
  n.op = (uint8_t)op;
  n.type = (uint8_t)type;
  n.a = a;
  n.b = b;
  n.c = c;
  n.arg = arg;
  return n;
}

/* ---- leaves ---- */

int fjg_const_bool(fjg_graph *g, int value) {
  fjg_node n = make_node(FJG_OP_CONST, FJG_BOOL, -1, -1, -1, -1);
  n.imm.i = value ? 1 : 0;
  return intern(g, &n);
}

int fjg_const_i32(fjg_graph *g, int32_t value) {
  fjg_node n = make_node(FJG_OP_CONST, FJG_I32, -1, -1, -1, -1);
  n.imm.i = value;
  return intern(g, &n);
}

int fjg_const_f32(fjg_graph *g, float value) {
  fjg_node n = make_node(FJG_OP_CONST, FJG_F32, -1, -1, -1, -1);
  n.imm.f = value;
  return intern(g, &n);
}

int fjg_input_node(fjg_graph *g, fjg_input which) {
  if ((unsigned)which >= FJG_NUM_INPUTS)
    return fail(g, "unknown input %d", (int)which);
  fjg_type type = which == FJG_IN_SCORE ? FJG_F32 : FJG_I32;
  fjg_node n = make_node(FJG_OP_INPUT, type, -1, -1, -1, (int)which);
  return intern(g, &n);
}

int fjg_size_node(fjg_graph *g, fjg_size which) {
  if ((unsigned)which >= FJG_NUM_SIZES)
    return fail(g, "unknown size symbol %d", (int)which);
  fjg_node n = make_node(FJG_OP_SIZE, FJG_I32, -1, -1, -1, (int)which);
  return intern(g, &n);
}

/* ---- declared arguments ---- */

static int is_lua_keyword(const char *s) {
  static const char *const words[] = {
      "and", "break", "do", "else", "elseif", "end", "false", "for",
      "function", "goto", "if", "in", "local", "nil", "not", "or",
      "repeat", "return", "then", "true", "until", "while"};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (strcmp(s, words[i]) == 0) return 1;
  return 0;
}

static int is_identifier(const char *s) {
  size_t len = strlen(s);
  if (len == 0 || len > 63) return 0;
  for (size_t i = 0; i < len; i++) {
    char ch = s[i];
    int alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                ch == '_';
    int digit = ch >= '0' && ch <= '9';
    if (!alpha && !(digit && i > 0)) return 0;
  }
  return !is_lua_keyword(s);
}

static const char *kind_text(fj_arg_kind kind) {
  return kind == FJ_ARG_BUFFER ? "buffer" : "param";
}

/* Finds or declares an argument; returns its index or -1. */
static int declare_arg(fjg_graph *g, const char *name, fj_arg_kind kind,
                       fjg_type type) {
  if (!name || !is_identifier(name))
    return fail(g, "%s name '%s' is not a Lua identifier of at most 63 "
                   "characters", kind_text(kind), name ? name : "(null)");
  int index = fjg_find_arg(g, name);
  if (index >= 0) {
    const fjg_arg *old = &g->args[index];
    if ((old->kind == FJ_ARG_BUFFER) != (kind == FJ_ARG_BUFFER))
      return fail(g, "'%s' is already declared as a %s", name,
                  kind_text(old->kind));
    if (old->type != type)
      return fail(g, "%s '%s' is already declared with type %s, not %s",
                  kind_text(kind), name, fjg_type_name(old->type),
                  fjg_type_name(type));
    return index;
  }
  if (g->num_args >= FJG_MAX_ARGS)
    return fail(g, "cannot declare %s '%s': a spec has at most %d params "
                   "and buffers together (FJG_MAX_ARGS, what a launch takes)",
                kind_text(kind), name, FJG_MAX_ARGS);
  if (g->num_args == g->cap_args) {
    int cap = g->cap_args ? g->cap_args * 2 : 8;
    fjg_arg *args = realloc(g->args, (size_t)cap * sizeof *args);
    if (!args) return fail(g, "out of memory while declaring '%s'", name);
    g->args = args;
    g->cap_args = cap;
  }
  fjg_arg *arg = &g->args[g->num_args];
  memset(arg, 0, sizeof *arg);
  memcpy(arg->name, name, strlen(name) + 1);
  arg->kind = kind;
  arg->type = type;
  return g->num_args++;
}

int fjg_param(fjg_graph *g, const char *name, fjg_type type) {
  if (type != FJG_I32 && type != FJG_F32)
    return fail(g, "param '%s': type must be i32 or f32, not %s",
                name ? name : "(null)", fjg_type_name(type));
  fj_arg_kind kind = type == FJG_I32 ? FJ_ARG_I32 : FJ_ARG_F32;
  int index = declare_arg(g, name, kind, type);
  if (index < 0) return -1;
  fjg_node n = make_node(FJG_OP_PARAM, type, -1, -1, -1, index);
  return intern(g, &n);
}

int fjg_buffer(fjg_graph *g, const char *name, fjg_type elem) {
  if (elem != FJG_I32 && elem != FJG_F32)
    return fail(g, "buffer '%s': element type must be i32 or f32, not %s",
                name ? name : "(null)", fjg_type_name(elem));
  return declare_arg(g, name, FJ_ARG_BUFFER, elem);
}

int fjg_set_trainable(fjg_graph *g, int arg) {
  if (arg < 0 || arg >= g->num_args)
    return fail(g, "trainable: no argument %d", arg);
  fjg_arg *a = &g->args[arg];
  if (a->kind != FJ_ARG_BUFFER || a->type != FJG_F32)
    return fail(g, "'%s' cannot have a gradient: only f32 buffers can (it "
                   "is %s %s)", a->name, a->kind == FJ_ARG_BUFFER ? "an i32"
                                                                  : "a",
                a->kind == FJ_ARG_BUFFER ? "buffer" : "param");
  a->trainable = 1;
  return 0;
}

uint64_t fjg_trainable_args(const fjg_graph *g) {
  uint64_t set = 0;
  for (int i = 0; i < g->num_args && i < 64; i++)
    if (g->args[i].trainable) set |= 1ull << i;
  return set;
}

/* ---- operators ---- */

static int valid_node(const fjg_graph *g, int id) {
  return id >= 0 && id < g->num_nodes;
}

static int type_of(const fjg_graph *g, int id) { return g->nodes[id].type; }

static int is_const(const fjg_graph *g, int id) {
  return g->nodes[id].op == FJG_OP_CONST;
}

static fjg_value const_value(const fjg_graph *g, int id) {
  fjg_value v;
  const fjg_node *n = &g->nodes[id];
  if (n->type == FJG_F32)
    v.f = n->imm.f;
  else
    v.i = n->imm.i;
  return v;
}

static int const_of_value(fjg_graph *g, fjg_type type, fjg_value v) {
  if (type == FJG_F32) return fjg_const_f32(g, (float)v.f);
  if (type == FJG_I32) return fjg_const_i32(g, v.i);
  return fjg_const_bool(g, v.i);
}

/* Interns op(a, b, c), or folds it to a constant when every operand is one:
 * folding uses the evaluator's own fjg_apply_op, so the two cannot differ
 * (except that a folded f32 is stored rounded to float). */
static int build(fjg_graph *g, fjg_op op, fjg_type type, int a, int b, int c) {
  int ids[3] = {a, b, c};
  int all_const = 1;
  for (int i = 0; i < 3; i++)
    if (ids[i] >= 0 && !is_const(g, ids[i])) all_const = 0;
  if (all_const) {
    fjg_value zero = {0};
    fjg_value va = a >= 0 ? const_value(g, a) : zero;
    fjg_value vb = b >= 0 ? const_value(g, b) : zero;
    fjg_value vc = c >= 0 ? const_value(g, c) : zero;
    /* The numeric operand type: the branches for WHERE, else the first. */
    fjg_type operand_type = (fjg_type)type_of(g, op == FJG_OP_WHERE ? b : a);
    return const_of_value(g, type,
                          fjg_apply_op(op, type, operand_type, va, vb, vc));
  }
  fjg_node n = make_node(op, type, a, b, c, -1);
  return intern(g, &n);
}

/* i32 -> f32 by a TO_F32 node; f32 unchanged. */
static int promote_f32(fjg_graph *g, int id) {
  if (type_of(g, id) == FJG_F32) return id;
  return build(g, FJG_OP_TO_F32, FJG_F32, id, -1, -1);
}

static int is_arith(fjg_op op) {
  return op == FJG_OP_ADD || op == FJG_OP_SUB || op == FJG_OP_MUL ||
         op == FJG_OP_DIV || op == FJG_OP_IDIV || op == FJG_OP_MOD ||
         op == FJG_OP_MIN || op == FJG_OP_MAX;
}

static int is_compare(fjg_op op) {
  return op >= FJG_OP_LT && op <= FJG_OP_NE;
}

static int is_logic(fjg_op op) {
  return op == FJG_OP_AND || op == FJG_OP_OR || op == FJG_OP_XOR;
}

static int is_f32_math(fjg_op op) {
  return op >= FJG_OP_EXP && op <= FJG_OP_TANH;
}

static int check_operand(fjg_graph *g, fjg_op op, int id) {
  if (valid_node(g, id)) return 0;
  return fail(g, "%s: invalid operand node %d", fjg_op_name(op), id);
}

/* ---- i32 chains with constants ----
 *
 * i32 add, sub, mul and neg wrap (modulo 2^32, in the evaluator and in the
 * emitted CUDA alike), so they obey the ring laws exactly: (x + c1) + c2 is
 * x + (c1 + c2), (x + c1) * c2 is x * c2 + c1 * c2, -(x - c) is c - x.
 * A node built from one non-constant `base` by those ops and constants
 * reads as base * m + k; combining it with another constant folds into a
 * new (m, k) instead of adding a level, so a loop that adds 1 a hundred
 * thousand times yields x + 100000, not a chain, and any such chain is at
 * most three levels deep. Floats are never reassociated: rounding makes (x + a) + b
 * differ from x + (a + b). */
typedef struct affine {
  int base;
  int scaled;    /* the node for base * m as it stands in the graph */
  uint32_t m, k; /* modulo 2^32 */
} affine;

/* The other operand of binary node n when one is a constant (whose value
 * goes to *c, its side to *const_left), else -1. */
static int split_const(const fjg_graph *g, const fjg_node *n, int *const_left,
                       uint32_t *c) {
  int left = is_const(g, n->a);
  if (!left && !is_const(g, n->b)) return -1;
  *const_left = left;
  *c = (uint32_t)g->nodes[left ? n->a : n->b].imm.i;
  return left ? n->b : n->a;
}

/* Reads i32 node id as base * m + k, looking through at most one add or
 * sub with a constant above at most one mul by a constant or neg (the
 * shapes from_affine builds); otherwise base is id itself, m 1 and k 0. */
static affine affine_of(const fjg_graph *g, int id) {
  affine f = {id, id, 1, 0};
  const fjg_node *n = &g->nodes[id];
  int left = 0;
  uint32_t c = 0, sign = 1;
  if (n->op == FJG_OP_ADD || n->op == FJG_OP_SUB) {
    int inner = split_const(g, n, &left, &c);
    if (inner < 0) return f;
    if (n->op == FJG_OP_ADD) {
      f.k = c;
    } else if (!left) {
      f.k = 0u - c; /* inner - c */
    } else {
      f.k = c; /* c - inner */
      sign = 0u - 1u;
    }
    f.base = f.scaled = inner;
    n = &g->nodes[inner];
  }
  f.m = sign;
  int inner = -1;
  if (n->op == FJG_OP_MUL) {
    inner = split_const(g, n, &left, &c);
    if (inner >= 0) f.m = sign * c;
  } else if (n->op == FJG_OP_NEG) {
    inner = n->a;
    f.m = 0u - sign;
  }
  if (inner >= 0) f.base = inner;
  if (sign != 1) f.scaled = -1; /* the graph holds only -(base * m) */
  return f;
}

/* Builds base * m + k: a constant when m is 0, k - base when m is -1, else
 * (base | -base | base * m) followed by + k or - |k|. `was` is the shape
 * the operand had: its base * m node is reused while m is unchanged. */
static int from_affine(fjg_graph *g, affine f, const affine *was) {
  if (f.m == 0) return fjg_const_i32(g, (int32_t)f.k);
  if (f.m == 0u - 1u && f.k != 0) {
    int k = fjg_const_i32(g, (int32_t)f.k);
    return k < 0 ? -1 : build(g, FJG_OP_SUB, FJG_I32, k, f.base, -1);
  }
  int t = f.base;
  if (f.m == was->m && was->scaled >= 0) {
    t = was->scaled;
  } else if (f.m == 0u - 1u) {
    t = build(g, FJG_OP_NEG, FJG_I32, f.base, -1, -1);
  } else if (f.m != 1) {
    int m = fjg_const_i32(g, (int32_t)f.m);
    t = m < 0 ? -1 : build(g, FJG_OP_MUL, FJG_I32, f.base, m, -1);
  }
  if (t < 0 || f.k == 0) return t;
  /* x - 3 reads better than x + -3; INT32_MIN has no positive twin. */
  int32_t k = (int32_t)f.k;
  int neg = k < 0 && k != INT32_MIN;
  int kc = fjg_const_i32(g, neg ? -k : k);
  return kc < 0 ? -1
                : build(g, neg ? FJG_OP_SUB : FJG_OP_ADD, FJG_I32, t, kc, -1);
}

#define NOT_FOLDED (-2)

/* Folds i32 op(a, b) (or neg a, with b < 0) when one operand is a constant
 * and the other already reads as base * m + k with m != 1 or k != 0: the
 * folded node, or -1 on failure; NOT_FOLDED when the plain node should be
 * built. */
static int fold_affine(fjg_graph *g, fjg_op op, int a, int b) {
  if (type_of(g, a) != FJG_I32) return NOT_FOLDED;
  if (op == FJG_OP_NEG) {
    affine was = affine_of(g, a), f = was;
    if (f.m == 1 && f.k == 0) return NOT_FOLDED;
    f.m = 0u - f.m;
    f.k = 0u - f.k;
    return from_affine(g, f, &was);
  }
  if (op != FJG_OP_ADD && op != FJG_OP_SUB && op != FJG_OP_MUL)
    return NOT_FOLDED;
  if (is_const(g, a) == is_const(g, b)) return NOT_FOLDED;
  int const_left = is_const(g, a);
  uint32_t c = (uint32_t)g->nodes[const_left ? a : b].imm.i;
  affine was = affine_of(g, const_left ? b : a), f = was;
  if (f.m == 1 && f.k == 0) return NOT_FOLDED;
  if (op == FJG_OP_ADD) {
    f.k += c;
  } else if (op == FJG_OP_MUL) {
    f.m *= c;
    f.k *= c;
  } else if (!const_left) { /* (base * m + k) - c */
    f.k -= c;
  } else { /* c - (base * m + k) */
    f.m = 0u - f.m;
    f.k = c - f.k;
  }
  return from_affine(g, f, &was);
}

int fjg_unary(fjg_graph *g, fjg_op op, int a) {
  if (fjg_op_arity(op) != 1 || op == FJG_OP_LOAD)
    return fail(g, "'%s' is not a unary operator", fjg_op_name(op));
  if (check_operand(g, op, a) < 0) return -1;
  fjg_type ta = (fjg_type)type_of(g, a);
  if (op == FJG_OP_NOT) {
    if (ta != FJG_BOOL)
      return fail(g, "logical not of a number (compare first, e.g. "
                     "eq(x, 0))");
    /* not(not x) is x. */
    if (g->nodes[a].op == FJG_OP_NOT) return g->nodes[a].a;
    return build(g, op, FJG_BOOL, a, -1, -1);
  }
  if (ta == FJG_BOOL)
    return fail(g, "%s of a boolean (use where(c, a, b))", fjg_op_name(op));
  if (is_f32_math(op) || op == FJG_OP_TO_F32) {
    int x = promote_f32(g, a);
    if (x < 0 || op == FJG_OP_TO_F32) return x;
    return build(g, op, FJG_F32, x, -1, -1);
  }
  /* floor and ceil of an integer are the integer itself. */
  if ((op == FJG_OP_FLOOR || op == FJG_OP_CEIL) && ta == FJG_I32) return a;
  if (op == FJG_OP_NEG && ta == FJG_I32 && !is_const(g, a)) {
    int folded = fold_affine(g, op, a, -1);
    if (folded != NOT_FOLDED) return folded;
  }
  return build(g, op, ta, a, -1, -1);
}

/* Cheap algebraic identities that keep the exact semantics; -1 if none. */
static int binary_identity(fjg_graph *g, fjg_op op, int a, int b) {
  int ca = is_const(g, a), cb = is_const(g, b);
  int32_t va = g->nodes[a].imm.i, vb = g->nodes[b].imm.i;
  if (type_of(g, a) == FJG_BOOL) {
    if (op == FJG_OP_AND) {
      if (cb) return vb ? a : b; /* x & true = x, x & false = false */
      if (ca) return va ? b : a;
      if (a == b) return a;
    } else if (op == FJG_OP_OR) {
      if (cb) return vb ? b : a; /* x | true = true, x | false = x */
      if (ca) return va ? a : b;
      if (a == b) return a;
    } else if (op == FJG_OP_XOR) {
      if (cb && !vb) return a;
      if (ca && !va) return b;
      if (a == b) return fjg_const_bool(g, 0);
    }
    return -1;
  }
  if (type_of(g, a) != FJG_I32) return -1;
  /* Integer identities only: for floats, x + 0 is not x when x is -0. */
  if (op == FJG_OP_ADD && cb && vb == 0) return a;
  if (op == FJG_OP_ADD && ca && va == 0) return b;
  if (op == FJG_OP_SUB && cb && vb == 0) return a;
  if (op == FJG_OP_MUL && cb && vb == 1) return a;
  if (op == FJG_OP_MUL && ca && va == 1) return b;
  if (op == FJG_OP_MUL && ((cb && vb == 0) || (ca && va == 0)))
    return fjg_const_i32(g, 0); /* wrapping: x * 0 is 0 for every x */
  if ((op == FJG_OP_MIN || op == FJG_OP_MAX) && a == b) return a;
  return -1;
}

/* Brings two numeric operands to one type (f32 if either is). */
static int unify_numeric(fjg_graph *g, int *a, int *b) {
  if (type_of(g, *a) == type_of(g, *b)) return 0;
  *a = promote_f32(g, *a);
  if (*a < 0) return -1;
  *b = promote_f32(g, *b);
  return *b < 0 ? -1 : 0;
}

int fjg_binary(fjg_graph *g, fjg_op op, int a, int b) {
  if (fjg_op_arity(op) != 2)
    return fail(g, "'%s' is not a binary operator", fjg_op_name(op));
  if (check_operand(g, op, a) < 0 || check_operand(g, op, b) < 0) return -1;
  int bool_a = type_of(g, a) == FJG_BOOL, bool_b = type_of(g, b) == FJG_BOOL;
  if (is_logic(op)) {
    if (!bool_a || !bool_b)
      return fail(g, "logical %s of a number (compare first, e.g. lt(a, b))",
                  fjg_op_name(op));
  } else if (is_arith(op)) {
    if (bool_a || bool_b)
      return fail(g, "arithmetic on a boolean (use where(c, a, b))");
  } else if (is_compare(op)) {
    if (bool_a || bool_b)
      return fail(g, "comparison %s of a boolean (combine booleans with "
                     "&, | and ~)", fjg_op_name(op));
  } else {
    return fail(g, "'%s' is not a binary operator", fjg_op_name(op));
  }
  if (op == FJG_OP_DIV) {
    a = promote_f32(g, a);
    b = a < 0 ? -1 : promote_f32(g, b);
    if (b < 0) return -1;
  } else if (!is_logic(op) && unify_numeric(g, &a, &b) < 0) {
    return -1;
  }
  int same = binary_identity(g, op, a, b);
  if (same >= 0) return same;
  int folded = fold_affine(g, op, a, b);
  if (folded != NOT_FOLDED) return folded;
  fjg_type type = (is_compare(op) || is_logic(op)) ? FJG_BOOL
                                                    : (fjg_type)type_of(g, a);
  return build(g, op, type, a, b, -1);
}

int fjg_where(fjg_graph *g, int cond, int a, int b) {
  fjg_op op = FJG_OP_WHERE;
  if (check_operand(g, op, cond) < 0 || check_operand(g, op, a) < 0 ||
      check_operand(g, op, b) < 0)
    return -1;
  if (type_of(g, cond) != FJG_BOOL)
    return fail(g, "where: the condition must be a boolean, not %s "
                   "(compare first, e.g. lt(a, b))",
                fjg_type_name((fjg_type)type_of(g, cond)));
  int bool_a = type_of(g, a) == FJG_BOOL, bool_b = type_of(g, b) == FJG_BOOL;
  if (bool_a != bool_b)
    return fail(g, "where: the two branches must both be booleans or both "
                   "numbers");
  if (!bool_a && unify_numeric(g, &a, &b) < 0) return -1;
  if (is_const(g, cond)) return g->nodes[cond].imm.i ? a : b;
  if (a == b) return a;
  return build(g, op, (fjg_type)type_of(g, a), cond, a, b);
}

int fjg_load(fjg_graph *g, int buffer_arg, int index_node) {
  const fjg_arg *arg = fjg_arg_at(g, buffer_arg);
  if (!arg || arg->kind != FJ_ARG_BUFFER)
    return fail(g, "load: argument %d is not a buffer", buffer_arg);
  if (check_operand(g, FJG_OP_LOAD, index_node) < 0) return -1;
  if (type_of(g, index_node) != FJG_I32)
    return fail(g, "buffer '%s' indexed by a %s value; the index must be "
                   "an i32", arg->name,
                fjg_type_name((fjg_type)type_of(g, index_node)));
  fjg_node n = make_node(FJG_OP_LOAD, arg->type, index_node, -1, -1,
                         buffer_arg);
  return intern(g, &n);
}

/* ---- roots ---- */

/* Marks the nodes reachable from roots[0..n) (-1: none); returns a
 * calloc'd flag array, and the largest root in *top. */
static uint8_t *mark_reachable_n(const fjg_graph *g, const int *roots, int n,
                                 int *top) {
  uint8_t *mark = calloc((size_t)g->num_nodes + 1, 1);
  int root = -1;
  for (int i = 0; mark && i < n; i++) {
    if (roots[i] < 0) continue;
    mark[roots[i]] = 1;
    if (roots[i] > root) root = roots[i];
  }
  if (top) *top = root;
  if (!mark || root < 0) return mark;
  for (int id = root; id >= 0; id--) {
    if (!mark[id]) continue;
    const fjg_node *n = &g->nodes[id];
    int arity = fjg_op_arity((fjg_op)n->op);
    if (arity >= 1) mark[n->a] = 1;
    if (arity >= 2) mark[n->b] = 1;
    if (arity >= 3) mark[n->c] = 1;
  }
  return mark;
}

static uint8_t *mark_reachable(const fjg_graph *g, int root) {
  return mark_reachable_n(g, &root, 1, NULL);
}

/* Keeps the nodes reachable from roots[0..n) as list `which` (0 mask, 1
 * score, 2 derivative), refusing more than the list's limit. */
static int set_reachable(fjg_graph *g, int which, const int *roots, int n) {
  int root;
  uint8_t *mark = mark_reachable_n(g, roots, n, &root);
  if (!mark) return fail(g, "out of memory while setting a root");
  int count = 0;
  for (int id = 0; id <= root; id++) count += mark[id];
  if (which < 2 && count > FJG_MAX_MOD_NODES) {
    free(mark);
    return fail(g, "the result of %s depends on %d nodes, more than the "
                   "limit of %d (FJG_MAX_MOD_NODES): the kernel would take "
                   "minutes to compile; compute tables with buffer() or "
                   "simplify the expression",
                which == 0 ? "mask_mod" : "score_mod", count,
                FJG_MAX_MOD_NODES);
  }
  if (which == 2 && count > FJG_MAX_GRAD_NODES) {
    free(mark);
    return fail(g, "the derivative of score_mod (for the backward pass) "
                   "depends on %d nodes, more than the limit of %d "
                   "(FJG_MAX_GRAD_NODES): its kernel would take minutes to "
                   "compile; compute tables with buffer() or simplify the "
                   "expression", count, FJG_MAX_GRAD_NODES);
  }
  int32_t *list = malloc(((size_t)count + 1) * sizeof *list);
  if (!list) {
    free(mark);
    return fail(g, "out of memory while setting a root");
  }
  count = 0;
  for (int id = 0; id <= root; id++)
    if (mark[id]) list[count++] = id;
  free(mark);
  free(g->reach[which]);
  g->reach[which] = list;
  g->reach_count[which] = count;
  return 0;
}

int fjg_set_mask_root(fjg_graph *g, int node) {
  if (node >= 0) {
    if (!valid_node(g, node)) return fail(g, "mask root: invalid node %d", node);
    if (type_of(g, node) != FJG_BOOL)
      return fail(g, "mask_mod must return a boolean, not %s (compare "
                     "first, e.g. ge(q, kv))",
                  fjg_type_name((fjg_type)type_of(g, node)));
  }
  int root = node < 0 ? -1 : node;
  if (set_reachable(g, 0, &root, 1) < 0) return -1;
  g->mask_root = node < 0 ? -1 : node;
  return 0;
}

int fjg_set_score_root(fjg_graph *g, int node) {
  if (node >= 0) {
    if (!valid_node(g, node))
      return fail(g, "score root: invalid node %d", node);
    if (type_of(g, node) == FJG_BOOL)
      return fail(g, "score_mod must return a number, not a boolean (use "
                     "where(c, score, -math.huge))");
    node = promote_f32(g, node);
    if (node < 0) return -1;
  }
  int root = node < 0 ? -1 : node;
  if (set_reachable(g, 1, &root, 1) < 0) return -1;
  g->score_root = node < 0 ? -1 : node;
  return 0;
}

int fjg_mask_root(const fjg_graph *g) { return g->mask_root; }
int fjg_score_root(const fjg_graph *g) { return g->score_root; }

int fjg_has_score_mod(const fjg_graph *g) {
  if (g->score_root < 0) return 0;
  const fjg_node *n = fjg_node_at(g, g->score_root);
  return !(n->op == FJG_OP_INPUT && n->arg == FJG_IN_SCORE);
}

int fjg_has_mask(const fjg_graph *g) {
  if (g->mask_root < 0) return 0;
  const fjg_node *n = fjg_node_at(g, g->mask_root);
  return !(n->op == FJG_OP_CONST && n->imm.i != 0);
}

static int is_f32_node(const fjg_graph *g, int id) {
  return valid_node(g, id) && type_of(g, id) == FJG_F32;
}

int fjg_set_derivative(fjg_graph *g, const fjg_derivative *d) {
  int roots[1 + 2 * FJG_MAX_BUFFER_GRADS], n = 0;
  if (d->num_buffer_grads < 0 || d->num_buffer_grads > FJG_MAX_BUFFER_GRADS)
    return fail(g, "derivative: %d buffer gradients", d->num_buffer_grads);
  if (!is_f32_node(g, d->dscore))
    return fail(g, "derivative: node %d is not an f32 node", d->dscore);
  roots[n++] = d->dscore;
  for (int i = 0; i < d->num_buffer_grads; i++) {
    const fjg_buffer_grad *r = &d->buffer_grads[i];
    const fjg_arg *arg = fjg_arg_at(g, r->buffer);
    if (!arg || arg->kind != FJ_ARG_BUFFER || arg->type != FJG_F32)
      return fail(g, "derivative: argument %d is not an f32 buffer", r->buffer);
    if (!valid_node(g, r->index) || type_of(g, r->index) != FJG_I32)
      return fail(g, "derivative: index node %d is not an i32 node", r->index);
    if (!is_f32_node(g, r->grad))
      return fail(g, "derivative: node %d is not an f32 node", r->grad);
    roots[n++] = r->index;
    roots[n++] = r->grad;
  }
  if (set_reachable(g, 2, roots, n) < 0) return -1;
  g->derivative = *d;
  g->has_derivative = 1;
  return 0;
}

const fjg_derivative *fjg_graph_derivative(const fjg_graph *g) {
  return g->has_derivative ? &g->derivative : NULL;
}

const int32_t *fjg_reachable(const fjg_graph *g, int which, int *count) {
  int present = which == 0   ? g->mask_root >= 0
                : which == 1 ? g->score_root >= 0
                             : g->has_derivative;
  *count = present ? g->reach_count[which] : 0;
  return g->reach[which];
}

/* The args (bit set) of the `leaf` nodes (INPUT or SIZE) root reaches; of
 * `count` leaves. */
static unsigned leaf_deps(const fjg_graph *g, int root, fjg_op leaf, int count) {
  if (!valid_node(g, root)) return 0;
  uint8_t *mark = mark_reachable(g, root);
  /* Without memory to mark, claim every leaf: the safe answer. */
  if (!mark) return (1u << count) - 1;
  unsigned deps = 0;
  for (int id = 0; id <= root; id++)
    if (mark[id] && g->nodes[id].op == leaf) deps |= 1u << g->nodes[id].arg;
  free(mark);
  return deps;
}

unsigned fjg_input_deps(const fjg_graph *g, int root) {
  return leaf_deps(g, root, FJG_OP_INPUT, FJG_NUM_INPUTS);
}

unsigned fjg_size_deps(const fjg_graph *g, int root) {
  return leaf_deps(g, root, FJG_OP_SIZE, FJG_NUM_SIZES);
}

/* ---- fjg_buf ---- */

void fjg_buf_init(fjg_buf *b) { memset(b, 0, sizeof *b); }

void fjg_buf_free(fjg_buf *b) {
  free(b->data);
  fjg_buf_init(b);
}

/* Ensures room for `extra` more bytes plus a NUL. */
static int buf_reserve(fjg_buf *b, size_t extra) {
  if (b->failed) return -1;
  if (b->len + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) cap *= 2;
  char *data = realloc(b->data, cap);
  if (!data) {
    b->failed = 1;
    return -1;
  }
  b->data = data;
  b->cap = cap;
  return 0;
}

void fjg_buf_append(fjg_buf *b, const void *data, size_t len) {
  if (buf_reserve(b, len) < 0) return;
  if (len) memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = '\0';
}

void fjg_buf_printf(fjg_buf *b, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->failed = 1;
    return;
  }
  if ((size_t)n < sizeof small) {
    fjg_buf_append(b, small, (size_t)n);
    return;
  }
  if (buf_reserve(b, (size_t)n) < 0) return;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}
