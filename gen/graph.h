/*
 * gen/graph.h: the traced expression graph of a spec.
 *
 * A graph holds the nodes of mask_mod and score_mod, hash-consed (building a
 * node that already exists returns the existing id), the runtime arguments a
 * spec declared (param() scalars and buffer() arrays) in declaration order,
 * and the two roots. Node ids are dense, non-negative ints; an operand always
 * has a smaller id than its user, so id order is a topological order.
 *
 * Builders return a node id >= 0, or -1 with a message kept in the graph
 * (fjg_graph_error). The Lua layer prefixes that message with chunk:line.
 */
#ifndef FJG_GRAPH_H
#define FJG_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "flexjit.h"

typedef enum { FJG_BOOL = 0, FJG_I32 = 1, FJG_F32 = 2 } fjg_type;

/*
 * Limits on what a spec may build, checked by the builders while the spec
 * loads. They sit far above real specs (the examples' mods have a few dozen
 * nodes and a few arguments) and keep a hostile or runaway spec from making
 * tracing, emission or NVRTC take unbounded time and memory.
 */
/* Nodes in one graph, unreachable ones included: bounds the memory and time
 * of tracing (about 40 bytes a node). */
#define FJG_MAX_NODES (1 << 20)
/* Nodes the result of one mod depends on: bounds the emitted code and
 * NVRTC's compile time, which grows about linearly with them (measured:
 * some 13 ms a node at sm_80 and 90 ms at sm_90a, so a mod at the limit
 * compiles in one to two minutes). */
#define FJG_MAX_MOD_NODES 1024
/* Declared params and buffers together: the most a launch passes. */
#define FJG_MAX_ARGS 64
/* Nodes the derivative of score_mod (fjg_set_derivative: the backward
 * pass's fj_score_grad) depends on, the score_mod's own nodes included:
 * bounds the backward kernel's emitted code and compile time as
 * FJG_MAX_MOD_NODES bounds a mod's. Reverse mode adds a few nodes per node
 * differentiated, so a mod far below its own limit stays far below this
 * one. */
#define FJG_MAX_GRAD_NODES (4 * FJG_MAX_MOD_NODES)

/* Inputs of mask_mod(b, h, q_idx, kv_idx) and score_mod(score, b, h, q, kv). */
typedef enum {
  FJG_IN_SCORE = 0, /* f32; only in score_mod */
  FJG_IN_B = 1,
  FJG_IN_H = 2, /* query head */
  FJG_IN_Q = 3,
  FJG_IN_KV = 4,
  FJG_NUM_INPUTS = 5
} fjg_input;

/* Size symbols, known at launch. */
typedef enum {
  FJG_SZ_B = 0,
  FJG_SZ_HQ = 1,
  FJG_SZ_HKV = 2,
  FJG_SZ_LQ = 3,
  FJG_SZ_LK = 4,
  FJG_NUM_SIZES = 5
} fjg_size;

/*
 * Ops. X(name, text, arity). Semantics (the CPU evaluator and the CUDA
 * emitter agree on them):
 *  - ADD SUB MUL NEG MIN MAX: i32 when both operands are i32 (wrapping,
 *    i.e. modulo 2^32, so i32 + - * and neg reassociate exactly), else f32.
 *  - DIV: always f32 (Lua's "/").
 *  - IDIV: floor division (Lua's "//"); i32 x i32 -> i32, x // 0 = 0;
 *    otherwise floor(a / b) in f32.
 *  - MOD: floored modulo (Lua's "%", result has the sign of b); i32 -> i32,
 *    x % 0 = 0; otherwise a - floor(a / b) * b in f32.
 *  - LT LE GT GE EQ NE: numeric comparison -> bool.
 *  - AND OR XOR NOT: on bools only.
 *  - WHERE(c, a, b): c bool; a, b of one type after promotion.
 *  - EXP EXP2 LOG LOG2 SQRT TANH: f32 -> f32 (i32 operands promoted).
 *  - ABS FLOOR CEIL: keep the operand type.
 *  - TO_F32: i32 -> f32 (inserted by promotion).
 *  - LOAD(buffer, index): element of a buffer argument at an i32 index; an
 *    index outside [0, length) reads 0.
 */
#define FJG_OP_MAP(X)    \
  X(CONST, "const", 0)   \
  X(INPUT, "input", 0)   \
  X(SIZE, "size", 0)     \
  X(PARAM, "param", 0)   \
  X(LOAD, "load", 1)     \
  X(NEG, "neg", 1)       \
  X(NOT, "not", 1)       \
  X(ABS, "abs", 1)       \
  X(EXP, "exp", 1)       \
  X(EXP2, "exp2", 1)     \
  X(LOG, "log", 1)       \
  X(LOG2, "log2", 1)     \
  X(SQRT, "sqrt", 1)     \
  X(TANH, "tanh", 1)     \
  X(FLOOR, "floor", 1)   \
  X(CEIL, "ceil", 1)     \
  X(TO_F32, "to_f32", 1) \
  X(ADD, "add", 2)       \
  X(SUB, "sub", 2)       \
  X(MUL, "mul", 2)       \
  X(DIV, "div", 2)       \
  X(IDIV, "idiv", 2)     \
  X(MOD, "mod", 2)       \
  X(MIN, "min", 2)       \
  X(MAX, "max", 2)       \
  X(LT, "lt", 2)         \
  X(LE, "le", 2)         \
  X(GT, "gt", 2)         \
  X(GE, "ge", 2)         \
  X(EQ, "eq", 2)         \
  X(NE, "ne", 2)         \
  X(AND, "and", 2)       \
  X(OR, "or", 2)         \
  X(XOR, "xor", 2)       \
  X(WHERE, "where", 3)

typedef enum {
#define FJG_OP_ENUM_(name, text, arity) FJG_OP_##name,
  FJG_OP_MAP(FJG_OP_ENUM_)
#undef FJG_OP_ENUM_
  FJG_NUM_OPS
} fjg_op;

const char *fjg_op_name(fjg_op op);
int fjg_op_arity(fjg_op op);
const char *fjg_type_name(fjg_type type); /* "bool", "i32", "f32" */

typedef struct fjg_node {
  uint8_t op;   /* fjg_op */
  uint8_t type; /* fjg_type of the result */
  /* Operands (node ids) for ops of arity >= 1; for INPUT the fjg_input, for
   * SIZE the fjg_size, for PARAM and LOAD (in `arg`) the argument index. */
  int32_t a, b, c;
  int32_t arg;
  union {
    int32_t i; /* CONST i32, and CONST bool (0 or 1) */
    float f;   /* CONST f32 */
  } imm;
} fjg_node;

/* A declared runtime argument. */
typedef struct fjg_arg {
  char name[64];
  fj_arg_kind kind;
  fjg_type type; /* scalar type, or element type of a buffer (i32 or f32) */
  int trainable; /* 1: an f32 buffer with a gradient (fjg_set_trainable) */
} fjg_arg;

typedef struct fjg_graph fjg_graph;

fjg_graph *fjg_graph_create(void);
void fjg_graph_destroy(fjg_graph *g);

/* Message of the last failed builder call (borrowed; valid until the next). */
const char *fjg_graph_error(const fjg_graph *g);

int fjg_num_nodes(const fjg_graph *g);
const fjg_node *fjg_node_at(const fjg_graph *g, int id);

int fjg_num_args(const fjg_graph *g);
const fjg_arg *fjg_arg_at(const fjg_graph *g, int index);
/* Index of the argument named `name`, or -1. */
int fjg_find_arg(const fjg_graph *g, const char *name);

/* Builders. Constants are folded: an op whose operands are all constants
 * yields a constant, and chains of i32 + - * and neg with constants collapse
 * to base * m + k ((x + 1) + 1 is x + 2; floats are never reassociated).
 * A builder fails once the graph would exceed FJG_MAX_NODES. */
int fjg_const_bool(fjg_graph *g, int value);
int fjg_const_i32(fjg_graph *g, int32_t value);
int fjg_const_f32(fjg_graph *g, float value);
int fjg_input_node(fjg_graph *g, fjg_input which);
int fjg_size_node(fjg_graph *g, fjg_size which);
/* Declares a scalar param (i32 or f32) and returns its node. Declaring the
 * same name again with the same type returns the same node; with another
 * type, or the name of a buffer, fails; so does a declaration past
 * FJG_MAX_ARGS params and buffers. */
int fjg_param(fjg_graph *g, const char *name, fjg_type type);
/* Declares a buffer argument (element type i32 or f32); returns its argument
 * index (not a node). Same redeclaration rules as fjg_param. */
int fjg_buffer(fjg_graph *g, const char *name, fjg_type elem);
/* Marks argument `arg` trainable: the backward pass computes its gradient
 * (docs/backward.md). Only an f32 buffer can be; fails otherwise. Marking
 * it again is a no-op. */
int fjg_set_trainable(fjg_graph *g, int arg);
/* The trainable arguments as a bit set (bit i: argument i). */
uint64_t fjg_trainable_args(const fjg_graph *g);
int fjg_load(fjg_graph *g, int buffer_arg, int index_node);
int fjg_unary(fjg_graph *g, fjg_op op, int a);
int fjg_binary(fjg_graph *g, fjg_op op, int a, int b);
int fjg_where(fjg_graph *g, int cond, int a, int b);

/* Roots: -1 when the spec has no mask_mod / score_mod. The mask root must be
 * bool; the score root is converted to f32. Fails when the root depends on
 * more than FJG_MAX_MOD_NODES nodes. */
int fjg_set_mask_root(fjg_graph *g, int node);
int fjg_set_score_root(fjg_graph *g, int node);
int fjg_mask_root(const fjg_graph *g);
int fjg_score_root(const fjg_graph *g);
/* 1 when g has a score_mod that is not the identity (which the kernels
 * treat as none: FJ_HAS_SCORE_MOD 0). */
int fjg_has_score_mod(const fjg_graph *g);
/* 1 when g has a mask_mod that is not the constant true (which the kernels
 * treat as none: FJ_HAS_MASK 0). */
int fjg_has_mask(const fjg_graph *g);

/* The derivative of score_mod (gen/derivative.h), kept with the graph so
 * that a loaded spec never changes: the spec loader computes it once, after
 * the roots are set, and the backward emitter and reference read it.
 * fjg_set_derivative copies *d (whose nodes must exist) and fails when the
 * nodes it depends on, together, are more than FJG_MAX_GRAD_NODES (then
 * the graph keeps the derivative it had). Setting the score root again
 * does not recompute it.
 * fjg_graph_derivative returns it (borrowed, valid while g lives), or NULL
 * when none was set. */
struct fjg_derivative;
int fjg_set_derivative(fjg_graph *g, const struct fjg_derivative *d);
const struct fjg_derivative *fjg_graph_derivative(const fjg_graph *g);

/* Which inputs a root depends on, as a bit set (1 << fjg_input). */
unsigned fjg_input_deps(const fjg_graph *g, int root);
/* The same for the sizes (bit fjg_size) that root reads. */
unsigned fjg_size_deps(const fjg_graph *g, int root);

/* Growable byte buffer used by serialization and emission. */
typedef struct fjg_buf {
  char *data;
  size_t len, cap;
  int failed; /* set when an allocation failed; later appends are ignored */
} fjg_buf;

void fjg_buf_init(fjg_buf *b);
void fjg_buf_free(fjg_buf *b);
void fjg_buf_append(fjg_buf *b, const void *data, size_t len);
void fjg_buf_printf(fjg_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Canonical bytes of the graph: only nodes reachable from the roots, in a
 * deterministic post-order, plus the declared arguments (name, kind, type) in
 * declaration order. Two specs that trace to the same function give the same
 * bytes whatever their spacing or local names. */
fj_status fjg_serialize(const fjg_graph *g, fjg_buf *out);

/* ---- CPU evaluator ---- */

typedef struct fjg_env {
  int32_t sizes[FJG_NUM_SIZES];
  /* Added to the q and kv inputs: the positions of the tensors' first rows
   * in the whole sequence (context parallel shards); 0 otherwise. With
   * sizes, laid out as the kernels' struct fj_sizes. */
  int32_t q_off, kv_off;
  /* Indexed by argument index: */
  const int32_t *param_i32; /* value of i32 params */
  const float *param_f32;   /* value of f32 params */
  const void *const *buffer_data; /* host pointer of buffers (int32 or float) */
  const int64_t *buffer_len;      /* element count of buffers */
} fjg_env;

/* Evaluates the mask (1 when no mask_mod) and the score_mod (score itself
 * when none) once, in float32 as the kernel does (gen/eval.h, which also has
 * the evaluator object for loops and the uncertain elements, where the
 * kernel's exp/log/tanh may decide otherwise; these return the CPU's
 * value there). */
int fjg_eval_mask(const fjg_graph *g, const fjg_env *env, int b, int h, int q,
                  int kv);
double fjg_eval_score(const fjg_graph *g, const fjg_env *env, double score,
                      int b, int h, int q, int kv);

#endif /* FJG_GRAPH_H */
