/*
 * gen/emit_cuda.c: the CUDA emitter (see emit_cuda.h).
 *
 * Every expression follows the evaluator's semantics (gen/eval.h): i32
 * add/sub/mul/neg/abs go through unsigned so they wrap without undefined
 * behaviour, // and % use the Lua-semantics helpers of fj_common.cuh, float
 * constants are written as hex literals so they round-trip exactly, and the
 * math functions are the accurate ones (expf, not __expf), except tanh,
 * which uses fj_tanh_f32 (the hardware tanh: relative error about 2^-11,
 * one special-function instruction).
 *
 * f32 nodes whose value decides something (fjg_decisive_nodes: every f32
 * node of a mask, and a score_mod's operands of comparisons, floor, ceil,
 * // and %) are written with the round-to-nearest intrinsics (__fadd_rn,
 * __fmul_rn, __fdiv_rn, __fsqrt_rn, ...), which NVRTC never contracts into
 * an FMA: they round exactly as the CPU evaluator does. The rest of a
 * score_mod keeps plain operators, which NVRTC may contract (the reference's
 * tolerance covers that rounding), and a division by a constant there
 * multiplies by its reciprocal (fjg_div_recip).
 */
#include "gen/emit_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/config.h"
#include "gen/derivative.h"
#include "gen/eval.h"
#include "gen/interval.h"
#include "gen/templates.h"

/* ---- user params layout ---- */

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Offset of each argument's first member; returns the struct size. */
static size_t layout(const fjg_graph *g, int want, size_t *offset) {
  size_t at = 8; /* long long fj_reserved_ */
  for (int i = 0; i < fjg_num_args(g); i++) {
    int buffer = fjg_arg_at(g, i)->kind == FJ_ARG_BUFFER;
    at = align_up(at, buffer ? 8 : 4);
    if (i == want) *offset = at;
    at += buffer ? 16 : 4; /* pointer + long long, or one scalar */
  }
  return align_up(at, 8);
}

size_t fjg_user_params_size(const fjg_graph *g) {
  size_t unused = 0;
  return layout(g, -1, &unused);
}

size_t fjg_user_params_offset(const fjg_graph *g, int arg) {
  size_t offset = 0;
  layout(g, arg, &offset);
  return offset;
}

void fjg_user_params_pack(const fjg_graph *g, const int32_t *i32_by_arg,
                          const float *f32_by_arg, const uint64_t *ptr_by_arg,
                          const int64_t *len_by_arg, void *dst) {
  unsigned char *p = dst;
  memset(p, 0, fjg_user_params_size(g));
  for (int i = 0; i < fjg_num_args(g); i++) {
    size_t at = fjg_user_params_offset(g, i);
    switch (fjg_arg_at(g, i)->kind) {
    case FJ_ARG_I32: memcpy(p + at, &i32_by_arg[i], 4); break;
    case FJ_ARG_F32: memcpy(p + at, &f32_by_arg[i], 4); break;
    case FJ_ARG_BUFFER:
      memcpy(p + at, &ptr_by_arg[i], 8);
      memcpy(p + at + 8, &len_by_arg[i], 8);
      break;
    }
  }
}

/* ---- user grads layout ---- */

static int num_trainable(const fjg_graph *g) {
  int n = 0;
  for (int i = 0; i < fjg_num_args(g); i++) n += fjg_arg_at(g, i)->trainable != 0;
  return n;
}

size_t fjg_user_grads_size(const fjg_graph *g) {
  int n = num_trainable(g);
  return 8 * (size_t)(n ? n : 1); /* one pointer each, or the placeholder */
}

void fjg_user_grads_pack(const fjg_graph *g, const uint64_t *grad_ptr_by_arg,
                         void *dst) {
  unsigned char *p = dst;
  memset(p, 0, fjg_user_grads_size(g));
  for (int i = 0; i < fjg_num_args(g); i++) {
    if (!fjg_arg_at(g, i)->trainable) continue;
    memcpy(p, &grad_ptr_by_arg[i], 8);
    p += 8;
  }
}

/* ---- expressions ---- */

static const char *ctype(int type) {
  return type == FJG_BOOL ? "bool" : type == FJG_I32 ? "int" : "float";
}

static int is_leaf(const fjg_node *n) { return n->op <= FJG_OP_PARAM; }

/* Exact float literal: hex for finite values, bit pattern otherwise. */
static void put_float(fjg_buf *out, float f) {
  if (!isfinite(f)) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    fjg_buf_printf(out, "__int_as_float(0x%08x)", bits);
    return;
  }
  if (signbit(f))
    fjg_buf_printf(out, "(%af /* %.9g */)", (double)f, (double)f);
  else
    fjg_buf_printf(out, "%af /* %.9g */", (double)f, (double)f);
}

static void put_int(fjg_buf *out, int32_t v) {
  if (v == INT32_MIN)
    fjg_buf_printf(out, "(-2147483647 - 1)");
  else if (v < 0)
    fjg_buf_printf(out, "(%d)", (int)v);
  else
    fjg_buf_printf(out, "%d", (int)v);
}

/* q and kv as the spec sees them: positions in the whole sequence (the
 * offsets are 0 but for context parallel shards). */
static const char *const input_names[] = {"score", "b", "h", "(q + z.q_off)",
                                          "(kv + z.kv_off)"};
static const char *const size_names[] = {"z.B", "z.Hq", "z.Hkv", "z.Lq",
                                         "z.Lk"};

/* A leaf as an expression: a literal, an input, a size or a param. */
static void put_leaf(fjg_buf *out, const fjg_graph *g, const fjg_node *n) {
  switch (n->op) {
  case FJG_OP_CONST:
    if (n->type == FJG_BOOL)
      fjg_buf_printf(out, "%s", n->imm.i ? "true" : "false");
    else if (n->type == FJG_I32)
      put_int(out, n->imm.i);
    else
      put_float(out, n->imm.f);
    break;
  case FJG_OP_INPUT: fjg_buf_printf(out, "%s", input_names[n->arg]); break;
  case FJG_OP_SIZE: fjg_buf_printf(out, "%s", size_names[n->arg]); break;
  default: fjg_buf_printf(out, "u.a_%s", fjg_arg_at(g, n->arg)->name); break;
  }
}

typedef struct emitter {
  const fjg_graph *g;
  fjg_buf *out;
  int32_t *slot; /* node id -> temporary number, -1 when none */
  uint8_t *decisive; /* node id -> 1: computed exactly (fjg_decisive_nodes) */
  uint8_t *reads; /* node id -> which of score, q and kv it reads (READS_*) */
  int score;     /* emitting the score_mod body */
  fjg_buf *defs; /* put_scaled: where its factors' definitions go */
  int num_hoisted; /* put_scaled: its factors (k0, k1, ...) and affine splits so far */
} emitter;

/* emitter.reads: the inputs that differ from one element of a tile to the
 * next. What reads none of them (b, h, sizes, params, constants) is the
 * same for all of a thread's elements in the kernels' loops. */
enum { READS_SCORE = 1, READS_Q = 2, READS_KV = 4 };

static void put_operand(emitter *e, int id) {
  const fjg_node *n = fjg_node_at(e->g, id);
  if (is_leaf(n))
    put_leaf(e->out, e->g, n);
  else
    fjg_buf_printf(e->out, "t%d", (int)e->slot[id]);
}

static const char *math_fn(fjg_op op) {
  switch (op) {
  case FJG_OP_EXP: return "expf";
  case FJG_OP_EXP2: return "exp2f";
  case FJG_OP_LOG: return "logf";
  case FJG_OP_LOG2: return "log2f";
  case FJG_OP_SQRT: return "sqrtf";
  case FJG_OP_TANH: return "fj_tanh_f32";
  case FJG_OP_FLOOR: return "floorf";
  case FJG_OP_CEIL: return "ceilf";
  case FJG_OP_ABS: return "fabsf";
  default: return NULL;
  }
}

static const char *infix(fjg_op op) {
  switch (op) {
  case FJG_OP_ADD: return "+";
  case FJG_OP_SUB: return "-";
  case FJG_OP_MUL: return "*";
  case FJG_OP_DIV: return "/";
  case FJG_OP_LT: return "<";
  case FJG_OP_LE: return "<=";
  case FJG_OP_GT: return ">";
  case FJG_OP_GE: return ">=";
  case FJG_OP_EQ: return "==";
  case FJG_OP_NE: return "!=";
  case FJG_OP_AND: return "&&";
  case FJG_OP_OR: return "||";
  case FJG_OP_XOR: return "!=";
  default: return NULL;
  }
}

/* The node being emitted is decisive f32: round-to-nearest intrinsics. */
static int exact_f32(const emitter *e, const fjg_node *n) {
  return n->type == FJG_F32 && e->decisive[n - fjg_node_at(e->g, 0)];
}

static void put_unary(emitter *e, const fjg_node *n) {
  fjg_buf *out = e->out;
  fjg_op op = (fjg_op)n->op;
  int i32 = n->type == FJG_I32;
  if (op == FJG_OP_NOT) {
    fjg_buf_printf(out, "!");
    put_operand(e, n->a);
  } else if (op == FJG_OP_TO_F32) {
    fjg_buf_printf(out, "(float)");
    put_operand(e, n->a);
  } else if (op == FJG_OP_NEG && i32) {
    fjg_buf_printf(out, "(int)(0u - (unsigned)");
    put_operand(e, n->a);
    fjg_buf_printf(out, ")");
  } else if (op == FJG_OP_NEG) {
    fjg_buf_printf(out, "-");
    put_operand(e, n->a);
  } else if (op == FJG_OP_ABS && i32) {
    put_operand(e, n->a);
    fjg_buf_printf(out, " < 0 ? (int)(0u - (unsigned)");
    put_operand(e, n->a);
    fjg_buf_printf(out, ") : ");
    put_operand(e, n->a);
  } else if (i32) { /* floor, ceil of an integer */
    put_operand(e, n->a);
  } else {
    int rn = op == FJG_OP_SQRT && exact_f32(e, n);
    fjg_buf_printf(out, "%s(", rn ? "__fsqrt_rn" : math_fn(op));
    put_operand(e, n->a);
    fjg_buf_printf(out, ")");
  }
}

static void put_call2(emitter *e, const char *fn, const fjg_node *n) {
  fjg_buf_printf(e->out, "%s(", fn);
  put_operand(e, n->a);
  fjg_buf_printf(e->out, ", ");
  put_operand(e, n->b);
  fjg_buf_printf(e->out, ")");
}

/* Decisive f32 arithmetic, each operation rounded on its own:
 * a // b = floorf(a / b), a % b = a - floorf(a / b) * b. */
static void put_exact_binary(emitter *e, const fjg_node *n) {
  fjg_buf *out = e->out;
  switch (n->op) {
  case FJG_OP_ADD: put_call2(e, "__fadd_rn", n); break;
  case FJG_OP_SUB: put_call2(e, "__fsub_rn", n); break;
  case FJG_OP_MUL: put_call2(e, "__fmul_rn", n); break;
  case FJG_OP_DIV: put_call2(e, "__fdiv_rn", n); break;
  case FJG_OP_IDIV:
    fjg_buf_printf(out, "floorf(");
    put_call2(e, "__fdiv_rn", n);
    fjg_buf_printf(out, ")");
    break;
  default: /* MOD */
    fjg_buf_printf(out, "__fsub_rn(");
    put_operand(e, n->a);
    fjg_buf_printf(out, ", __fmul_rn(floorf(");
    put_call2(e, "__fdiv_rn", n);
    fjg_buf_printf(out, "), ");
    put_operand(e, n->b);
    fjg_buf_printf(out, "))");
    break;
  }
}

static void put_binary(emitter *e, const fjg_node *n) {
  fjg_buf *out = e->out;
  fjg_op op = (fjg_op)n->op;
  int i32 = n->type == FJG_I32;
  int arith = op == FJG_OP_ADD || op == FJG_OP_SUB || op == FJG_OP_MUL ||
              op == FJG_OP_DIV || op == FJG_OP_IDIV || op == FJG_OP_MOD;
  float recip;
  if (i32 && (op == FJG_OP_ADD || op == FJG_OP_SUB || op == FJG_OP_MUL)) {
    fjg_buf_printf(out, "(int)((unsigned)");
    put_operand(e, n->a);
    fjg_buf_printf(out, " %s (unsigned)", infix(op));
    put_operand(e, n->b);
    fjg_buf_printf(out, ")");
  } else if (arith && exact_f32(e, n)) {
    put_exact_binary(e, n);
  } else if (op == FJG_OP_DIV && e->score && fjg_div_recip(e->g, n->b, &recip)) {
    put_operand(e, n->a);
    fjg_buf_printf(out, " * ");
    put_float(out, recip);
  } else if (op == FJG_OP_IDIV) {
    put_call2(e, i32 ? "fj_idiv_i32" : "fj_idiv_f32", n);
  } else if (op == FJG_OP_MOD) {
    put_call2(e, i32 ? "fj_mod_i32" : "fj_mod_f32", n);
  } else if ((op == FJG_OP_MIN || op == FJG_OP_MAX) && !i32) {
    put_call2(e, op == FJG_OP_MIN ? "fminf" : "fmaxf", n);
  } else if (op == FJG_OP_MIN || op == FJG_OP_MAX) {
    put_operand(e, n->a);
    fjg_buf_printf(out, op == FJG_OP_MIN ? " < " : " > ");
    put_operand(e, n->b);
    fjg_buf_printf(out, " ? ");
    put_operand(e, n->a);
    fjg_buf_printf(out, " : ");
    put_operand(e, n->b);
  } else {
    put_operand(e, n->a);
    fjg_buf_printf(out, " %s ", infix(op));
    put_operand(e, n->b);
  }
}

static void put_expr(emitter *e, const fjg_node *n) {
  fjg_buf *out = e->out;
  if (n->op == FJG_OP_LOAD) {
    const char *name = fjg_arg_at(e->g, n->arg)->name;
    fjg_buf_printf(out, "fj_load_%s(u.a_%s, u.n_%s, ",
                   n->type == FJG_I32 ? "i32" : "f32", name, name);
    put_operand(e, n->a);
    fjg_buf_printf(out, ")");
  } else if (n->op == FJG_OP_WHERE) {
    put_operand(e, n->a);
    fjg_buf_printf(out, " ? ");
    put_operand(e, n->b);
    fjg_buf_printf(out, " : ");
    put_operand(e, n->c);
  } else if (fjg_op_arity((fjg_op)n->op) == 1) {
    put_unary(e, n);
  } else {
    put_binary(e, n);
  }
}

/* A mask's row values: its loads whose index reads q but not kv (a query
 * row's document id), the same for every kv of a row, so that a kernel may
 * read them once a row (fj_mask_rows) and the mask from them
 * (fj_mask_from_rows); its column values likewise, loads whose index reads
 * kv but not q (a key's document id: fj_mask_cols, fj_mask_from_cols).
 * `side` is READS_Q for rows, READS_KV for columns. */
static int is_side_load(const emitter *e, int id, unsigned side) {
  return fjg_node_at(e->g, id)->op == FJG_OP_LOAD &&
         (e->reads[id] & (READS_SCORE | READS_Q | READS_KV)) == side;
}

/* How put_temps emits: every node (TEMPS_ALL); only the nodes of one
 * side's values (reading neither the score nor the other index), each value
 * stored in v[k] (TEMPS_VALUES); or every node, each of one side's values
 * read from v[k] (TEMPS_FROM_VALUES). */
enum { TEMPS_ALL, TEMPS_VALUES, TEMPS_FROM_VALUES };

/* One statement per non-leaf node reachable from root `which` (0 the
 * mask, 1 the score_mod, 2 the score_mod's derivative: fjg_reachable's
 * lists), each in a temporary of its own; 1 and 2 with a score_mod's f32
 * rules. `mode`: TEMPS_ALL, or for the mask (0) TEMPS_VALUES or
 * TEMPS_FROM_VALUES of side `side` (READS_Q, READS_KV). */
static void put_temps(emitter *e, int which, int mode, unsigned side) {
  int count, next = 0, value = 0;
  const int32_t *list = fjg_reachable(e->g, which, &count);
  const unsigned other = side == READS_Q ? READS_KV : READS_Q;
  e->score = which != 0;
  memset(e->decisive, 0, (size_t)fjg_num_nodes(e->g));
  fjg_decisive_nodes(e->g, which, e->decisive);
  for (int k = 0; k < count; k++) {
    const fjg_node *n = fjg_node_at(e->g, list[k]);
    if (is_leaf(n)) continue;
    if (mode == TEMPS_VALUES && (e->reads[list[k]] & (READS_SCORE | other))) continue;
    const int is_value = mode != TEMPS_ALL && is_side_load(e, list[k], side);
    e->slot[list[k]] = next;
    fjg_buf_printf(e->out, "  const %s t%d = ", ctype(n->type), next++);
    if (mode == TEMPS_FROM_VALUES && is_value)
      fjg_buf_printf(e->out, n->type == FJG_I32 ? "(int)v[%d]" : "__uint_as_float(v[%d])",
                     value++);
    else
      put_expr(e, n);
    fjg_buf_printf(e->out, ";\n");
    if (mode == TEMPS_VALUES && is_value)
      fjg_buf_printf(e->out, n->type == FJG_I32 ? "  v[%d] = (unsigned)t%d;\n"
                                                : "  v[%d] = __float_as_uint(t%d);\n",
                     value++, next - 1);
  }
}

/* The number of the mask's values of one side (is_side_load). */
static int mask_values(const emitter *e, unsigned side) {
  const int root = fjg_mask_root(e->g);
  if (root < 0) return 0;
  int count, n = 0;
  const int32_t *list = fjg_reachable(e->g, 0, &count);
  for (int k = 0; k < count; k++) n += is_side_load(e, list[k], side);
  return n;
}
static int mask_rows(const emitter *e) { return mask_values(e, READS_Q); }
static int mask_cols(const emitter *e) { return mask_values(e, READS_KV); }

/* The body of fj_mask (which == 0) or fj_score_mod (1): its temporaries,
 * then the return. */
static void put_body(emitter *e, int which, const char *absent) {
  int root = which == 0 ? fjg_mask_root(e->g) : fjg_score_root(e->g);
  if (root < 0) {
    fjg_buf_printf(e->out, "  return %s;\n", absent);
    return;
  }
  put_temps(e, which, TEMPS_ALL, 0);
  fjg_buf_printf(e->out, "  return ");
  put_operand(e, root);
  fjg_buf_printf(e->out, ";\n");
}

/* Whether read r adds to a gradient (its derivative is not the constant
 * 0). */
static int has_grad(const fjg_graph *g, const fjg_buffer_grad *r) {
  const fjg_node *grad = fjg_node_at(g, r->grad);
  return !(grad->op == FJG_OP_CONST && grad->imm.f == 0.0f);
}

/* The number of trainable reads that add to a gradient. */
static int num_grad_reads(const fjg_graph *g) {
  const fjg_derivative *d = fjg_graph_derivative(g);
  int n = 0;
  for (int i = 0; d && i < d->num_buffer_grads; i++) n += has_grad(g, &d->buffer_grads[i]);
  return n;
}

static void put_iv_nodes(emitter *e, int which);

/* 1 when g's score_mod is additive: its derivative with respect to the
 * score is the constant 1, and each trainable read's is the constant 0 or
 * 1 at an index that does not read the score. Its dS is then P (dP -
 * delta) and its buffers' gradients need that and the indices alone
 * (common/fj_bwd.cuh, FJ_SCORE_GRAD_ONE; fj_grad_bufs). */
static int score_grad_one(const fjg_graph *g) {
  const fjg_derivative *d = fjg_graph_derivative(g);
  if (!fjg_has_score_mod(g) || !d) return 0;
  for (int i = 0; i < d->num_buffer_grads; i++) {
    const fjg_buffer_grad *r = &d->buffer_grads[i];
    const fjg_node *grad = fjg_node_at(g, r->grad);
    if (grad->op != FJG_OP_CONST || (grad->imm.f != 0.0f && grad->imm.f != 1.0f) ||
        (fjg_input_deps(g, r->index) & (1u << FJG_IN_SCORE)))
      return 0;
  }
  const fjg_node *n = fjg_node_at(g, d->dscore);
  return n->op == FJG_OP_CONST && n->type == FJG_F32 && n->imm.f == 1.0f;
}

/* The body of fj_grad_tile: the intervals of the derivative's i32 and
 * bool nodes over the tile (as fj_tile_class's over the mask's), then for
 * each trainable read whose index is one value over the whole tile that
 * value (-1 outside the buffer: no gradient), else FJ_GRAD_VARIES. */
static void put_grad_tile_body(emitter *e) {
  const fjg_derivative *d = fjg_graph_derivative(e->g);
  if (!num_grad_reads(e->g)) {
    fjg_buf_printf(e->out, "  (void)u, (void)z, (void)b, (void)h, (void)q0, (void)q1, "
                           "(void)kv0, (void)kv1, (void)gc;\n");
    return;
  }
  put_iv_nodes(e, 2);
  for (int i = 0; i < d->num_buffer_grads; i++) {
    const fjg_buffer_grad *r = &d->buffer_grads[i];
    if (!has_grad(e->g, r)) continue;
    const int v = (int)e->slot[r->index];
    fjg_buf_printf(e->out,
                   "  gc.u%d = v%d.lo != v%d.hi ? FJ_GRAD_VARIES\n"
                   "          : fj_buf_in(u.n_%s, (int)v%d.lo) ? (int)v%d.lo : -1;\n",
                   i, v, v, fjg_arg_at(e->g, r->buffer)->name, v, v);
  }
}

/* The body of fj_grad_tile_uniform: whether fj_grad_tile found every
 * read's index one value (true without reads). A kernel branches on it so
 * that the copy of its loop under the branch adds to the tile's sums alone. */
static void put_grad_tile_uniform_body(emitter *e) {
  const fjg_derivative *d = fjg_graph_derivative(e->g);
  if (!num_grad_reads(e->g)) fjg_buf_printf(e->out, "  (void)gc;\n");
  fjg_buf_printf(e->out, "  return true");
  for (int i = 0; d && i < d->num_buffer_grads; i++)
    if (has_grad(e->g, &d->buffer_grads[i]))
      fjg_buf_printf(e->out, " && gc.u%d != FJ_GRAD_VARIES", i);
  fjg_buf_printf(e->out, ";\n");
}

/* The body of fj_grad_tile_end: each read's tile sum into its slot. */
static void put_grad_tile_end_body(emitter *e) {
  const fjg_derivative *d = fjg_graph_derivative(e->g);
  if (!num_grad_reads(e->g)) {
    fjg_buf_printf(e->out, "  (void)gr, (void)gc;\n");
    return;
  }
  for (int i = 0; i < d->num_buffer_grads; i++) {
    const fjg_buffer_grad *r = &d->buffer_grads[i];
    if (!has_grad(e->g, r)) continue;
    fjg_buf_printf(e->out,
                   "  if (gc.u%d != FJ_GRAD_VARIES)\n"
                   "    fj_grad_add(gc.s%d, gr.g_%s, gc.u%d >= 0, gc.u%d, gc.a%d);\n"
                   "  gc.u%d = FJ_GRAD_VARIES;\n  gc.a%d = 0.0f;\n",
                   i, i, fjg_arg_at(e->g, r->buffer)->name, i, i, i, i, i);
  }
}

/* Each trainable read's add of ds times its derivative where live: to the
 * tile's sum where fj_grad_tile found its index one value, else through
 * its slot where the index is inside the buffer. */
static void put_grad_adds(emitter *e) {
  const fjg_derivative *d = fjg_graph_derivative(e->g);
  for (int i = 0; d && i < d->num_buffer_grads; i++) {
    const fjg_buffer_grad *r = &d->buffer_grads[i];
    if (!has_grad(e->g, r)) continue;
    const char *name = fjg_arg_at(e->g, r->buffer)->name;
    /* A derivative of the constant 1 adds ds itself: where ds == 0 that
     * adds nothing, and a NaN ds is live either way. */
    const fjg_node *gn = fjg_node_at(e->g, r->grad);
    if (gn->op == FJG_OP_CONST && gn->type == FJG_F32 && gn->imm.f == 1.0f) {
      fjg_buf_printf(e->out, "  if (gc.u%d != FJ_GRAD_VARIES)\n    gc.a%d += ds;\n  else\n  ", i,
                     i);
    } else {
      fjg_buf_printf(e->out, "  if (gc.u%d != FJ_GRAD_VARIES)\n    gc.a%d += live ? ds * ", i, i);
      put_operand(e, r->grad);
      fjg_buf_printf(e->out, " : 0.0f;\n  else\n  ");
    }
    fjg_buf_printf(e->out, "  fj_grad_add(gc.s%d, gr.g_%s, live && fj_buf_in(u.n_%s, ", i, name,
                   name);
    put_operand(e, r->index);
    fjg_buf_printf(e->out, "), ");
    put_operand(e, r->index);
    fjg_buf_printf(e->out, ", ds * ");
    put_operand(e, r->grad);
    fjg_buf_printf(e->out, ");\n");
  }
}

/* The body of fj_score_grad: one statement per non-leaf node of the
 * derivative (fjg_reachable list 2, which holds the score_mod's nodes it
 * reads, so they are computed here once), with the f32 rules of a
 * score_mod; then ds times each trainable read's derivative added to its
 * gradient through the read's slot of the caller's fj_grad_cache
 * (fj_grad_add: atomics when the element changes and at fj_grad_flush)
 * where the index is inside the buffer (a read outside reads 0 and has
 * none), and ds times d score_mod / d score.
 * An element with ds == 0 (P == 0: a score_mod's -inf, or underflow)
 * contributes nothing and costs no atomic, also where the derivative there
 * is infinite or NaN (log at 0, an overflowing exp): selected away, not
 * branched around, so the caller's unrolled loop stays one block. */
static void put_grad_body(emitter *e) {
  const fjg_derivative *d = fjg_graph_derivative(e->g);
  if (!d) { /* no score_mod: the score passes unchanged */
    fjg_buf_printf(e->out, "  return ds;\n");
    return;
  }
  fjg_buf_printf(e->out, "  const bool live = ds != 0.0f;\n");
  put_temps(e, 2, TEMPS_ALL, 0);
  put_grad_adds(e);
  fjg_buf_printf(e->out, "  return live ? ds * ");
  put_operand(e, d->dscore);
  fjg_buf_printf(e->out, " : 0.0f;\n");
}

/* The body of fj_grad_bufs: fj_score_grad's adds alone, for an additive
 * score_mod (score_grad_one), whose reads' indices and derivatives do not
 * read the score; empty for any other. */
static void put_grad_bufs_body(emitter *e) {
  if (!score_grad_one(e->g) || !num_grad_reads(e->g)) {
    fjg_buf_printf(e->out, "  (void)u, (void)gr, (void)gc, (void)z, (void)b, (void)h, (void)q, "
                           "(void)kv, (void)ds;\n");
    return;
  }
  fjg_buf_printf(e->out, "  const bool live = ds != 0.0f;\n");
  put_temps(e, 2, TEMPS_ALL, 0);
  put_grad_adds(e);
}

/* ---- tile classifier ---- */

static const char *iv_rule(fjg_op op) {
  switch (op) {
  case FJG_OP_NEG: return "neg";
  case FJG_OP_ABS: return "abs";
  case FJG_OP_ADD: return "add";
  case FJG_OP_SUB: return "sub";
  case FJG_OP_MUL: return "mul";
  case FJG_OP_IDIV: return "idiv";
  case FJG_OP_MOD: return "mod";
  case FJG_OP_MIN: return "min";
  case FJG_OP_MAX: return "max";
  case FJG_OP_LT: return "lt";
  case FJG_OP_LE: return "le";
  case FJG_OP_GT: return "gt";
  case FJG_OP_GE: return "ge";
  case FJG_OP_EQ: return "eq";
  case FJG_OP_NE: return "ne";
  case FJG_OP_NOT: return "not";
  case FJG_OP_AND: return "and";
  case FJG_OP_OR: return "or";
  case FJG_OP_XOR: return "xor";
  default: return NULL;
  }
}

/* The interval of a leaf, as node_iv/leaf_iv in interval.c computes it. */
static void put_iv_leaf(emitter *e, const fjg_node *n) {
  fjg_buf *out = e->out;
  if (n->op == FJG_OP_LOAD) {
    fjg_buf_printf(out, "fj_iv_full()");
  } else if (n->op == FJG_OP_INPUT && n->arg == FJG_IN_Q) {
    fjg_buf_printf(out, "fj_iv_make(q0 + (long long)z.q_off, q1 + (long long)z.q_off)");
  } else if (n->op == FJG_OP_INPUT && n->arg == FJG_IN_KV) {
    fjg_buf_printf(out, "fj_iv_make(kv0 + (long long)z.kv_off, kv1 + (long long)z.kv_off)");
  } else {
    fjg_buf_printf(out, "fj_iv_make(");
    put_leaf(out, e->g, n);
    fjg_buf_printf(out, ", ");
    put_leaf(out, e->g, n);
    fjg_buf_printf(out, ")");
  }
}

static void put_iv_args(emitter *e, const fjg_node *n) {
  int arity = fjg_op_arity((fjg_op)n->op);
  int ops[3] = {n->a, n->b, n->c};
  for (int i = 0; i < arity; i++)
    fjg_buf_printf(e->out, "%sv%d", i ? ", " : "", (int)e->slot[ops[i]]);
}

/* The interval of a non-f32 node, as node_iv in interval.c computes it. */
static void put_iv_expr(emitter *e, const fjg_node *n) {
  fjg_buf *out = e->out;
  const char *rule = iv_rule((fjg_op)n->op);
  if (n->op <= FJG_OP_LOAD) {
    put_iv_leaf(e, n);
  } else if (n->op == FJG_OP_WHERE) {
    fjg_buf_printf(out, "fj_iv_where(");
    put_iv_args(e, n);
    fjg_buf_printf(out, ")");
  } else if (n->type == FJG_I32 && (n->op == FJG_OP_FLOOR ||
                                    n->op == FJG_OP_CEIL)) {
    fjg_buf_printf(out, "v%d", (int)e->slot[n->a]);
  } else if (!rule) {
    fjg_buf_printf(out, n->type == FJG_I32 ? "fj_iv_full()"
                                           : "fj_iv_unknown_bool()");
  } else if (n->type == FJG_BOOL &&
             fjg_node_at(e->g, n->a)->type == FJG_F32) {
    fjg_buf_printf(out, "fj_iv_unknown_bool()");
  } else {
    fjg_buf_printf(out, "fj_iv_%s(", rule);
    put_iv_args(e, n);
    fjg_buf_printf(out, ")");
  }
}

/* One fj_iv statement per i32 or bool node of fjg_reachable(which), v0,
 * v1, ... in order (e->slot maps a node to its number); f32 nodes are
 * unknown and no rule reads them. */
static void put_iv_nodes(emitter *e, int which) {
  int count, next = 0;
  const int32_t *list = fjg_reachable(e->g, which, &count);
  for (int k = 0; k < count; k++) {
    const fjg_node *n = fjg_node_at(e->g, list[k]);
    if (n->type == FJG_F32) continue;
    e->slot[list[k]] = next;
    fjg_buf_printf(e->out, "  const fj_iv v%d = ", next++);
    put_iv_expr(e, n);
    fjg_buf_printf(e->out, ";\n");
  }
}

static void put_tile_class_body(emitter *e) {
  int root = fjg_mask_root(e->g);
  if (root < 0) {
    fjg_buf_printf(e->out, "  return FJ_TILE_FULL;\n");
    return;
  }
  put_iv_nodes(e, 0);
  fjg_buf_printf(e->out, "  return fj_iv_tile_class(v%d);\n",
                 (int)e->slot[root]);
}

/* ---- prologue ---- */

static void put_indent(fjg_buf *out, int depth) {
  for (int i = 0; i < depth; i++) fjg_buf_append(out, "  ", 2);
}

/* The interval rules arrive as one line (they are stringified C); lay them
 * out one statement per line, indented by brace depth. */
static void put_reflowed(fjg_buf *out, const char *src) {
  int depth = 0, parens = 0, line_start = 1;
  for (const char *p = src; *p; p++) {
    if (line_start && *p == ' ') continue;
    if (*p == '}') depth--;
    if (line_start) put_indent(out, depth);
    line_start = 0;
    fjg_buf_append(out, p, 1);
    if (*p == '(') parens++;
    if (*p == ')') parens--;
    if (*p == '{') depth++;
    if (*p == '}' && p[1] == ';') fjg_buf_append(out, ++p, 1);
    if (*p == '{' || *p == '}' || (*p == ';' && parens == 0)) {
      fjg_buf_append(out, "\n", 1);
      line_start = 1;
    }
  }
}

static void put_params_struct(fjg_buf *out, const fjg_graph *g) {
  fjg_buf_printf(out, "struct fj_user_params {\n  long long fj_reserved_;\n");
  for (int i = 0; i < fjg_num_args(g); i++) {
    const fjg_arg *arg = fjg_arg_at(g, i);
    if (arg->kind == FJ_ARG_BUFFER)
      fjg_buf_printf(out, "  const %s *a_%s;\n  long long n_%s;\n",
                     ctype(arg->type), arg->name, arg->name);
    else
      fjg_buf_printf(out, "  %s a_%s;\n", ctype(arg->type), arg->name);
  }
  fjg_buf_printf(out, "};\n\n");
}

static void put_interval_rules(fjg_buf *out) {
  fjg_buf_printf(out,
      "// Interval rules shared with gen/interval.c (fj_tile_class uses them).\n"
      "#define FJ_IV_FN static __device__ __forceinline__\n");
  put_reflowed(out, fjg_interval_rules_source());
  fjg_buf_printf(out, "\n");
}

/* An emitter over g writing to out: its per-node tables allocated, no
 * slot assigned yet. emitter_close frees them and says whether the output
 * is complete. */
static fj_status emitter_open(emitter *e, const fjg_graph *g, fjg_buf *out) {
  const size_t n = (size_t)fjg_num_nodes(g) + 1;
  *e = (emitter){g, out, malloc(n * sizeof(int32_t)), malloc(n), calloc(n, 1), 0, NULL, 0};
  if (!e->slot || !e->decisive || !e->reads) {
    free(e->slot);
    free(e->decisive);
    free(e->reads);
    return FJ_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) e->slot[i] = -1;
  /* Operands come before the nodes that use them. */
  for (int id = 0; id < fjg_num_nodes(g); id++) {
    const fjg_node *nd = fjg_node_at(g, id);
    if (nd->op == FJG_OP_INPUT) {
      e->reads[id] = nd->arg == FJG_IN_SCORE ? READS_SCORE
                     : nd->arg == FJG_IN_Q   ? READS_Q
                     : nd->arg == FJG_IN_KV  ? READS_KV
                                             : 0;
    } else if (!is_leaf(nd)) {
      const int arity = fjg_op_arity((fjg_op)nd->op);
      e->reads[id] = e->reads[nd->a] | (arity > 1 ? e->reads[nd->b] : 0) |
                     (arity > 2 ? e->reads[nd->c] : 0);
    }
  }
  return FJ_OK;
}

static fj_status emitter_close(emitter *e) {
  free(e->slot);
  free(e->decisive);
  free(e->reads);
  return e->out->failed ? FJ_ENOMEM : FJ_OK;
}

/* ---- the score in log2 units ---- */

/* log2 e, as the templates' FJH_LOG2E rounds it. */
static const float LOG2E = 1.4426950408889634f;

/* 1 when the i32 node id is aq * q + akv * kv + r (modulo 2^32, as i32
 * arithmetic wraps) with constants aq and akv and an r that reads no
 * element input. */
static int affine(const emitter *e, int id, uint32_t *aq, uint32_t *akv) {
  const fjg_node *n = fjg_node_at(e->g, id);
  uint32_t q1, k1, q2, k2;
  if (n->type != FJG_I32 || (e->reads[id] & READS_SCORE)) return 0;
  if (!e->reads[id]) {
    *aq = *akv = 0;
    return 1;
  }
  switch (n->op) {
  case FJG_OP_INPUT:
    *aq = n->arg == FJG_IN_Q;
    *akv = n->arg == FJG_IN_KV;
    return 1;
  case FJG_OP_FLOOR:
  case FJG_OP_CEIL: return affine(e, n->a, aq, akv); /* of an integer: itself */
  case FJG_OP_NEG:
    if (!affine(e, n->a, &q1, &k1)) return 0;
    *aq = 0u - q1;
    *akv = 0u - k1;
    return 1;
  case FJG_OP_ADD:
  case FJG_OP_SUB:
    if (!affine(e, n->a, &q1, &k1) || !affine(e, n->b, &q2, &k2)) return 0;
    *aq = n->op == FJG_OP_ADD ? q1 + q2 : q1 - q2;
    *akv = n->op == FJG_OP_ADD ? k1 + k2 : k1 - k2;
    return 1;
  case FJG_OP_MUL: {
    const fjg_node *a = fjg_node_at(e->g, n->a), *b = fjg_node_at(e->g, n->b);
    const fjg_node *c = a->op == FJG_OP_CONST ? a : b->op == FJG_OP_CONST ? b : NULL;
    if (!c || !affine(e, c == a ? n->b : n->a, &q1, &k1)) return 0;
    *aq = (uint32_t)c->imm.i * q1;
    *akv = (uint32_t)c->imm.i * k1;
    return 1;
  }
  default: return 0;
  }
}

/* An affine node's value at the element whose q and kv are qb and kvb
 * (its dq and dk taken away): the same for every element of the loop. */
static void put_affine_base(emitter *e, int id) {
  const fjg_node *n = fjg_node_at(e->g, id);
  fjg_buf *out = e->out;
  if (!e->reads[id]) {
    put_operand(e, id);
  } else if (n->op == FJG_OP_INPUT) {
    fjg_buf_printf(out, n->arg == FJG_IN_Q ? "(qb + z.q_off)" : "(kvb + z.kv_off)");
  } else if (n->op == FJG_OP_FLOOR || n->op == FJG_OP_CEIL) {
    put_affine_base(e, n->a);
  } else if (n->op == FJG_OP_NEG) {
    fjg_buf_printf(out, "(int)(0u - (unsigned)");
    put_affine_base(e, n->a);
    fjg_buf_printf(out, ")");
  } else { /* ADD, SUB, MUL by a constant */
    fjg_buf_printf(out, "(int)((unsigned)");
    put_affine_base(e, n->a);
    fjg_buf_printf(out, " %s (unsigned)", infix((fjg_op)n->op));
    put_affine_base(e, n->b);
    fjg_buf_printf(out, ")");
  }
}

static void put_scaled(emitter *e, int id, const char *k);

/* The most values put_scaled hoists out of the element loop (its factors,
 * k0 included, and the bases of its affine splits): each is live across a
 * kernel's element loop, and a score_mod that nests many products with
 * invariant factors, or sums many affine indices, would pay registers for
 * them, spill, and compile for minutes; past them a term is taken whole. */
enum { MAX_HOISTED = 8 };

/* put_scaled of node id by k times an invariant factor: node `factor`, or
 * the constant c when factor is -1. The product is a factor of its own,
 * defined in e->defs (a chain of products under the sum would otherwise
 * repeat its text at every leaf: a source quadratic in the chain's length). */
static void put_scaled_by_factor(emitter *e, int id, const char *k, int factor, float c) {
  fjg_buf *expr = e->out;
  const int n = e->num_hoisted++;
  e->out = e->defs;
  fjg_buf_printf(e->out, "  const float k%d = %s * ", n, k);
  if (factor >= 0) put_operand(e, factor);
  else put_float(e->out, c);
  fjg_buf_printf(e->out, ";\n");
  e->out = expr;
  char name[16];
  snprintf(name, sizeof name, "k%d", n);
  put_scaled(e, id, name);
}

/* k times f32 node id, written so that what does not change from element
 * to element is computed once: k is an invariant expression, pushed
 * through sums, differences, negations and products with invariant factors
 * into the leaves of the sum. An i32 that is affine in q and kv (aq q + akv
 * kv + r) becomes float as its base (put_affine_base) plus aq dq + akv dk,
 * both converted exactly while they lie within 2^24 of 0, so that the
 * element pays one FMA for it, k (base) being invariant. The rounding
 * differs from k * node by a few ulp of the terms: a score_mod's values
 * decide nothing (decisive nodes are left whole). */
static void put_scaled(emitter *e, int id, const char *k) {
  const fjg_node *n = fjg_node_at(e->g, id);
  fjg_buf *out = e->out;
  const int whole = n->type != FJG_F32 || e->decisive[id] || !e->reads[id];
  uint32_t aq, akv;
  float recip;
  if (n->op == FJG_OP_INPUT && n->arg == FJG_IN_SCORE) {
    fjg_buf_printf(out, "qk * (%s * scale)", k);
  } else if (!whole && (n->op == FJG_OP_ADD || n->op == FJG_OP_SUB)) {
    fjg_buf_printf(out, "(");
    put_scaled(e, n->a, k);
    fjg_buf_printf(out, " %s ", infix((fjg_op)n->op));
    put_scaled(e, n->b, k);
    fjg_buf_printf(out, ")");
  } else if (!whole && n->op == FJG_OP_NEG) {
    fjg_buf_printf(out, "(-");
    put_scaled(e, n->a, k);
    fjg_buf_printf(out, ")");
  } else if (!whole && n->op == FJG_OP_MUL && (!e->reads[n->a] || !e->reads[n->b]) &&
             e->num_hoisted < MAX_HOISTED) {
    const int factor = e->reads[n->a] ? n->b : n->a;
    put_scaled_by_factor(e, factor == n->a ? n->b : n->a, k, factor, 0.0f);
  } else if (!whole && n->op == FJG_OP_DIV && fjg_div_recip(e->g, n->b, &recip) &&
             e->num_hoisted < MAX_HOISTED) {
    put_scaled_by_factor(e, n->a, k, -1, recip);
  } else if (!whole && n->op == FJG_OP_TO_F32 && e->num_hoisted < MAX_HOISTED &&
             affine(e, n->a, &aq, &akv)) {
    e->num_hoisted++;
    fjg_buf_printf(out, "(%s * (float)", k);
    put_affine_base(e, n->a);
    fjg_buf_printf(out, " + %s * (float)(int)((unsigned)dq * (unsigned)(%d) + (unsigned)dk * "
                   "(unsigned)(%d)))", k, (int)aq, (int)akv);
  } else {
    fjg_buf_printf(out, "%s * ", k);
    put_operand(e, id);
  }
}

/* The terms of a sum at node id, each with its sign: how many read the
 * score, and in *alone the sign (1 or -1) when one is the score itself. */
static int score_terms(const emitter *e, int id, int sign, int *alone) {
  const fjg_node *n = fjg_node_at(e->g, id);
  if (!(e->reads[id] & READS_SCORE)) return 0;
  if (n->op == FJG_OP_INPUT) {
    *alone = sign;
    return 1;
  }
  if (n->type == FJG_F32 && (n->op == FJG_OP_ADD || n->op == FJG_OP_SUB))
    return score_terms(e, n->a, sign, alone) +
           score_terms(e, n->b, n->op == FJG_OP_SUB ? -sign : sign, alone);
  if (n->type == FJG_F32 && n->op == FJG_OP_NEG) return score_terms(e, n->a, -sign, alone);
  *alone = 0;
  return 1;
}

static int additive(const emitter *e) {
  const int root = fjg_score_root(e->g);
  int alone = 0;
  return root >= 0 && score_terms(e, root, 1, &alone) == 1 && alone == 1;
}

/* 1 when the score_mod calls a special function (MUFU: exp, exp2, log,
 * log2, sqrt, tanh, a division by a non-constant) on a value that changes
 * from element to element, beside the softmax's own exponential. */
static int score_uses_sfu(const emitter *e) {
  if (fjg_score_root(e->g) < 0) return 0;
  int count;
  float recip;
  const int32_t *list = fjg_reachable(e->g, 1, &count);
  for (int k = 0; k < count; k++) {
    const fjg_node *n = fjg_node_at(e->g, list[k]);
    if (!e->reads[list[k]] || n->type != FJG_F32) continue;
    switch (n->op) {
    case FJG_OP_EXP: case FJG_OP_EXP2: case FJG_OP_LOG: case FJG_OP_LOG2:
    case FJG_OP_SQRT: case FJG_OP_TANH: return 1;
    case FJG_OP_DIV:
      if (!fjg_div_recip(e->g, n->b, &recip)) return 1;
      break;
    default: break;
    }
  }
  return 0;
}

/* ask(e) of an emitter over g that writes nothing (its per-node tables
 * are what ask reads); -1 when they cannot be allocated. */
static int ask_emitter(const fjg_graph *g, int (*ask)(const emitter *)) {
  emitter e;
  fjg_buf unused;
  fjg_buf_init(&unused);
  if (emitter_open(&e, g, &unused) != FJ_OK) return -1;
  const int answer = ask(&e);
  emitter_close(&e);
  return answer;
}

int fjg_score_is_additive(const fjg_graph *g) { return ask_emitter(g, additive) == 1; }

/* ---- an additive score_mod's terms over a tile ---- */

/* 1 when node n, of i32 or bool operands, can be one value over a range
 * of its operands' values: a clamp, a comparison, a bucket's division. */
static int narrows(const emitter *e, const fjg_node *n) {
  if (n->type == FJG_F32) return 0;
  switch (n->op) {
  case FJG_OP_WHERE: return 1;
  case FJG_OP_MIN: case FJG_OP_MAX: case FJG_OP_IDIV: case FJG_OP_MOD:
  case FJG_OP_LT: case FJG_OP_LE: case FJG_OP_GT: case FJG_OP_GE: case FJG_OP_EQ:
  case FJG_OP_NE: case FJG_OP_AND: case FJG_OP_OR: case FJG_OP_XOR: case FJG_OP_NOT:
    return fjg_node_at(e->g, n->a)->type != FJG_F32;
  default: return 0;
  }
}

/* 1 when node id can be one value over a tile of q and kv: it reads
 * neither, or every path from them to it passes a node that narrows
 * (memo: 0 not yet known, 1 no, 2 yes). */
static int may_be_uniform(const emitter *e, int id, uint8_t *memo) {
  if (memo[id]) return memo[id] == 2;
  const fjg_node *n = fjg_node_at(e->g, id);
  int yes;
  if (!(e->reads[id] & (READS_Q | READS_KV))) {
    yes = 1;
  } else if ((e->reads[id] & READS_SCORE) || is_leaf(n)) {
    yes = 0;
  } else if (narrows(e, n)) {
    yes = 1;
  } else {
    const int arity = fjg_op_arity((fjg_op)n->op);
    yes = may_be_uniform(e, n->a, memo) && (arity < 2 || may_be_uniform(e, n->b, memo)) &&
          (arity < 3 || may_be_uniform(e, n->c, memo));
  }
  memo[id] = yes ? 2 : 1;
  return yes;
}

/* The terms of an additive score_mod's sum under node id that read q or
 * kv (the summands that do not read the score, under the sums,
 * differences and negations that do: an additive score_mod has no other
 * node reading it), appended to terms[*n]. */
static void qkv_terms(const emitter *e, int id, int *terms, int *n) {
  const fjg_node *nd = fjg_node_at(e->g, id);
  if (!(e->reads[id] & READS_SCORE)) {
    if (e->reads[id] & (READS_Q | READS_KV)) terms[(*n)++] = id;
    return;
  }
  if (nd->op == FJG_OP_INPUT) return;
  qkv_terms(e, nd->a, terms, n);
  if (fjg_op_arity((fjg_op)nd->op) > 1) qkv_terms(e, nd->b, terms, n);
}

/* 1 when the score_mod is additive and its terms read q or kv in a way
 * that can be one value over a tile (a clamped relative position, a
 * bucket): a relative-position bias far from the diagonal. Its kernels
 * then ask fj_score_tile. */
static int tile_terms(const emitter *e) {
  if (!additive(e)) return 0;
  const size_t nodes = (size_t)fjg_num_nodes(e->g) + 1;
  uint8_t *memo = calloc(nodes, 1);
  int *terms = malloc(nodes * sizeof *terms);
  int n = 0, all_may = 1;
  if (memo && terms) {
    qkv_terms(e, fjg_score_root(e->g), terms, &n);
    for (int i = 0; i < n; i++) all_may &= may_be_uniform(e, terms[i], memo);
  }
  const int answer = !memo || !terms ? -1 : n > 0 && all_may;
  free(memo);
  free(terms);
  return answer;
}

int fjg_score_has_tile_terms(const fjg_graph *g) { return ask_emitter(g, tile_terms) == 1; }

int fjg_mask_row_values(const fjg_graph *g) { return ask_emitter(g, mask_rows); }
int fjg_mask_col_values(const fjg_graph *g) { return ask_emitter(g, mask_cols); }

/* 1 when the prologue of g reads the interval rules: fj_tile_class of a
 * mask, fj_score_tile of terms that can be one value over a tile. */
static int prologue_reads_rules(const emitter *e) {
  return fjg_mask_root(e->g) >= 0 || tile_terms(e) != 0;
}

fj_status fjg_emit_interval_rules(const fjg_graph *g, fjg_buf *out) {
  /* Without them every tile is full and no term uniform, and the rules
   * would be dead code (a backward unit's hooks add them when its
   * gradients need them). */
  if (g && ask_emitter(g, prologue_reads_rules) == 0) return FJ_OK;
  put_interval_rules(out);
  return out->failed ? FJ_ENOMEM : FJ_OK;
}

/* The body of fj_score_tile: the intervals of the score_mod's i32 and
 * bool nodes over the tile (fj_tile_class's rules), then for each node
 * that reads q or kv whether it is one value there, w<id>: an i32 or
 * bool node whose interval is a point, or a node whose operands that read
 * q or kv all are. When every term is, the terms in log2 units at the
 * tile's first element (fj_score_log2 of a zero product). */
static void put_score_tile_body(emitter *e) {
  int count;
  const int32_t *list = fjg_reachable(e->g, 1, &count);
  put_iv_nodes(e, 1);
  for (int k = 0; k < count; k++) {
    const int id = list[k];
    const fjg_node *n = fjg_node_at(e->g, id);
    if (!(e->reads[id] & (READS_Q | READS_KV)) || (e->reads[id] & READS_SCORE)) continue;
    fjg_buf_printf(e->out, "  const bool w%d = ", id);
    if (n->type != FJG_F32)
      fjg_buf_printf(e->out, "v%d.lo == v%d.hi", (int)e->slot[id], (int)e->slot[id]);
    if (!is_leaf(n)) {
      const int ops[3] = {n->a, n->b, n->c};
      const char *sep = n->type != FJG_F32 ? " || (" : "(";
      for (int i = 0; i < fjg_op_arity((fjg_op)n->op); i++) {
        if (!(e->reads[ops[i]] & (READS_Q | READS_KV))) continue;
        fjg_buf_printf(e->out, "%sw%d", sep, ops[i]);
        sep = " && ";
      }
      fjg_buf_printf(e->out, ")");
    }
    fjg_buf_printf(e->out, ";\n");
  }
  /* Whether every term that reads q or kv is one value. */
  int *terms = malloc(((size_t)fjg_num_nodes(e->g) + 1) * sizeof *terms), num_terms = 0;
  if (!terms) {
    e->out->failed = 1;
    return;
  }
  qkv_terms(e, fjg_score_root(e->g), terms, &num_terms);
  fjg_buf_printf(e->out, "  if (!(true");
  for (int i = 0; i < num_terms; i++) fjg_buf_printf(e->out, " && w%d", terms[i]);
  free(terms);
  fjg_buf_printf(e->out, ")) return false;\n"
                         "  terms = fj_score_log2(u, z, 0.0f, scale, b, h, q0, 0, kv0, 0);\n"
                         "  return true;\n");
}

/* The body of fj_score_log2: for an additive score_mod the terms scaled
 * by log2 e (put_scaled), the scale folded into the score's, so that a
 * score costs its terms and one FMA; for any other, fj_score_mod's value
 * times log2 e. */
static void put_log2_body(emitter *e) {
  const int root = fjg_score_root(e->g);
  fjg_buf_printf(e->out, "  const int q = (int)((unsigned)qb + (unsigned)dq);\n"
                         "  const int kv = (int)((unsigned)kvb + (unsigned)dk);\n");
  if (root < 0 || !additive(e)) {
    fjg_buf_printf(e->out, "  return fj_score_mod(u, z, qk * scale, b, h, q, kv) * ");
    put_float(e->out, LOG2E);
    fjg_buf_printf(e->out, ";\n");
    return;
  }
  fjg_buf_printf(e->out, "  const float score = qk * scale;\n");
  put_temps(e, 1, TEMPS_ALL, 0);
  fjg_buf_printf(e->out, "  const float k0 = ");
  put_float(e->out, LOG2E);
  fjg_buf_printf(e->out, ";\n");
  /* The sum into its own buffer; the factors it defines go first. */
  fjg_buf sum, *body = e->out;
  fjg_buf_init(&sum);
  e->defs = body;
  e->num_hoisted = 1;
  e->out = &sum;
  put_scaled(e, root, "k0");
  e->out = body;
  if (sum.failed) body->failed = 1;
  else fjg_buf_printf(body, "  return %s;\n", sum.data);
  fjg_buf_free(&sum);
}

/* Where the mask has values of one side (is_side_load), under #ifdef
 * FJ_MASK_ROWS (side READS_Q: the backward's sm90 kernel reads them, and
 * its units define it) or FJ_MASK_COLS (READS_KV: the sm90 forward's):
 * fj_mask_rows (a query row's values into v) and fj_mask_from_rows (the
 * mask from them, loading the rest), or fj_mask_cols and
 * fj_mask_from_cols (a key's). */
static void put_mask_values(emitter *e, unsigned side) {
  const int n = mask_values(e, side);
  if (n <= 0) return;
  const char *what = side == READS_Q ? "rows" : "cols", *index = side == READS_Q ? "q" : "kv";
  fjg_buf_printf(e->out,
      "#ifdef FJ_MASK_%s\n"
      "__device__ __forceinline__ void fj_mask_%s(const fj_user_params &u, "
      "const fj_sizes &z,\n    int b, int h, int %s, unsigned (&v)[%d]) {\n",
      side == READS_Q ? "ROWS" : "COLS", what, index, n);
  put_temps(e, 0, TEMPS_VALUES, side);
  fjg_buf_printf(e->out, "}\n\n"
      "__device__ __forceinline__ bool fj_mask_from_%s(const fj_user_params &u, "
      "const fj_sizes &z,\n    int b, int h, int q, int kv, const unsigned (&v)[%d]) {\n",
      what, n);
  put_temps(e, 0, TEMPS_FROM_VALUES, side);
  fjg_buf_printf(e->out, "  return ");
  put_operand(e, fjg_mask_root(e->g));
  fjg_buf_printf(e->out, ";\n}\n#endif\n\n");
}

fj_status fjg_emit_prologue(const fjg_graph *g, fjg_buf *out) {
  emitter e;
  if (emitter_open(&e, g, out) != FJ_OK) return FJ_ENOMEM;

  fjg_buf_printf(out, "// ---- generated prologue (gen/emit_cuda.c) ----\n");
  put_params_struct(out, g);
  fjg_buf_printf(out,
      "__device__ __forceinline__ bool fj_mask(const fj_user_params &u, "
      "const fj_sizes &z,\n    int b, int h, int q, int kv) {\n");
  put_body(&e, 0, "true");
  fjg_buf_printf(out, "}\n\n");
  put_mask_values(&e, READS_Q);
  put_mask_values(&e, READS_KV);
  fjg_buf_printf(out,
      "__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,"
      "\n    const fj_sizes &z, float score, int b, int h, int q, int kv) {\n");
  put_body(&e, 1, "score");
  fjg_buf_printf(out, "}\n\n");
  fjg_buf_printf(out,
      "__device__ __forceinline__ float fj_score_log2(const fj_user_params &u,"
      "\n    const fj_sizes &z, float qk, float scale, int b, int h, int qb, int dq, "
      "int kvb,\n    int dk) {\n");
  put_log2_body(&e);
  fjg_buf_printf(out, "}\n\n");
  fjg_buf_printf(out,
      "__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,"
      "\n    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, "
      "int kv1) {\n");
  put_tile_class_body(&e);
  fjg_buf_printf(out, "}\n");
  const int tiles = tile_terms(&e);
  if (tiles < 0) out->failed = 1;
  if (tiles > 0) {
    fjg_buf_printf(out,
        "\n__device__ __forceinline__ bool fj_score_tile(const fj_user_params &u,"
        "\n    const fj_sizes &z, float scale, int b, int h, int q0, int q1, int kv0, "
        "int kv1,\n    float &terms) {\n");
    put_score_tile_body(&e);
    fjg_buf_printf(out, "}\n\n"
        "__device__ __forceinline__ float fj_score_log2_tile(float qk, float scale, "
        "float terms) {\n  return qk * (");
    put_float(out, LOG2E);
    fjg_buf_printf(out, " * scale) + terms;\n}\n");
  }
  fjg_buf_printf(out, "// ---- end of generated prologue ----\n");
  return emitter_close(&e);
}

static void put_grads_struct(fjg_buf *out, const fjg_graph *g) {
  fjg_buf_printf(out, "struct fj_user_grads {\n");
  for (int i = 0; i < fjg_num_args(g); i++) {
    const fjg_arg *arg = fjg_arg_at(g, i);
    if (arg->trainable) fjg_buf_printf(out, "  float *g_%s;\n", arg->name);
  }
  if (!num_trainable(g)) fjg_buf_printf(out, "  long long fj_reserved_;\n");
  fjg_buf_printf(out, "};\n\n");
}

/* struct fj_grad_cache (a slot per trainable read that has a gradient, as
 * put_grad_body numbers them) and fj_grad_flush, which adds what the slots
 * hold. */
static void put_grad_cache(fjg_buf *out, const fjg_graph *g) {
  const fjg_derivative *d = fjg_graph_derivative(g);
  const int n = d ? d->num_buffer_grads : 0;
  fjg_buf_printf(out, "struct fj_grad_cache {\n");
  for (int i = 0; i < n; i++)
    fjg_buf_printf(out,
                   "  fj_grad_slot s%d;\n"
                   "  int u%d = FJ_GRAD_VARIES;  // the tile's one index (fj_grad_tile)\n"
                   "  float a%d = 0.0f;  // the tile's sum for u%d\n",
                   i, i, i, i);
  fjg_buf_printf(out, "};\n");
  fjg_buf_printf(out,
      "__device__ __forceinline__ void fj_grad_flush(const fj_user_grads &gr, "
      "fj_grad_cache &gc) {\n");
  for (int i = 0; i < n; i++) {
    const fjg_buffer_grad *r = &d->buffer_grads[i];
    fjg_buf_printf(out, "  fj_grad_slot_flush(gc.s%d, gr.g_%s);\n", i,
                   fjg_arg_at(g, r->buffer)->name);
  }
  if (!n) fjg_buf_printf(out, "  (void)gr, (void)gc;\n");
  fjg_buf_printf(out, "}\n");
}

fj_status fjg_emit_backward_hooks(const fjg_graph *g, fjg_buf *out) {
  emitter e;
  if (emitter_open(&e, g, out) != FJ_OK) return FJ_ENOMEM;
  fjg_buf_printf(out, "// ---- generated backward hooks (gen/emit_cuda.c) ----\n");
  /* fj_grad_tile reads the interval rules, which the prologue has only
   * with a mask or tile terms. */
  if (!prologue_reads_rules(&e) && num_grad_reads(g)) put_interval_rules(out);
  put_grads_struct(out, g);
  put_grad_cache(out, g);
  fjg_buf_printf(out,
      "__device__ __forceinline__ void fj_grad_tile(const fj_user_params &u,"
      "\n    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1, "
      "fj_grad_cache &gc) {\n");
  put_grad_tile_body(&e);
  fjg_buf_printf(out, "}\n");
  fjg_buf_printf(out,
      "__device__ __forceinline__ bool fj_grad_tile_uniform(const fj_grad_cache &gc) {\n");
  put_grad_tile_uniform_body(&e);
  fjg_buf_printf(out, "}\n");
  fjg_buf_printf(out,
      "__device__ __forceinline__ void fj_grad_tile_end(const fj_user_grads &gr, "
      "fj_grad_cache &gc) {\n");
  put_grad_tile_end_body(&e);
  fjg_buf_printf(out, "}\n");
  fjg_buf_printf(out,
      "__device__ __forceinline__ float fj_score_grad(const fj_user_params &u,"
      "\n    const fj_user_grads &gr, fj_grad_cache &gc, const fj_sizes &z, float score, "
      "int b,\n    int h, int q, int kv, float ds) {\n");
  put_grad_body(&e);
  fjg_buf_printf(out, "}\n");
  fjg_buf_printf(out,
      "__device__ __forceinline__ void fj_grad_bufs(const fj_user_params &u,"
      "\n    const fj_user_grads &gr, fj_grad_cache &gc, const fj_sizes &z, int b, int h, "
      "int q,\n    int kv, float ds) {\n");
  put_grad_bufs_body(&e);
  fjg_buf_printf(out, "}\n// ---- end of generated backward hooks ----\n");
  return emitter_close(&e);
}

/* ---- translation unit ---- */

static fj_status put_template(fjg_buf *out, const char *name) {
  size_t len;
  const char *text = fjg_template_text(name, &len);
  if (!text) return FJ_ENOTFOUND;
  fjg_buf_printf(out, "\n// ---- template %s ----\n", name);
  fjg_buf_append(out, text, len);
  if (len && text[len - 1] != '\n') fjg_buf_append(out, "\n", 1);
  return FJ_OK;
}

/* A mask that is constant true and a score_mod that returns the score
 * unchanged are no hooks at all (fjg_has_mask, fjg_has_score_mod): the
 * templates then take their fastest paths (no per-element calls, full
 * softmax/GEMM overlap). */
static void put_config_defines(fjg_buf *out, const fjg_graph *g,
                               const fjg_config *cfg) {
  fjg_buf_printf(out, "#define FJ_HEAD_DIM %d\n", cfg->head_dim);
  fjg_buf_printf(out, "#define %s 1\n", cfg->dtype == FJ_DTYPE_F16
                                            ? "FJ_DTYPE_F16"
                                            : "FJ_DTYPE_BF16");
  fjg_buf_printf(out, "#define FJ_BLOCK_M %d\n", cfg->block_m);
  fjg_buf_printf(out, "#define FJ_BLOCK_N %d\n", cfg->block_n);
  fjg_buf_printf(out, "#define FJ_NUM_WARPS %d\n", cfg->num_warps);
  fjg_buf_printf(out, "#define FJ_NUM_STAGES %d\n", cfg->num_stages);
  fjg_buf_printf(out, "#define FJ_HAS_MASK %d\n", fjg_has_mask(g));
  fjg_buf_printf(out, "#define FJ_HAS_SCORE_MOD %d\n", fjg_has_score_mod(g));
  const int sfu = ask_emitter(g, score_uses_sfu);
  if (sfu < 0) out->failed = 1;
  if (sfu > 0) fjg_buf_printf(out, "#define FJ_SCORE_SFU 1\n");
  const int tiles = ask_emitter(g, tile_terms);
  if (tiles < 0) out->failed = 1;
  if (tiles > 0) fjg_buf_printf(out, "#define FJ_SCORE_TILE 1\n");
  if (cfg->persistent) fjg_buf_printf(out, "#define FJ_PERSISTENT 1\n");
  if (cfg->q_bufs > 1) fjg_buf_printf(out, "#define FJ_Q_BUFS %d\n", cfg->q_bufs);
  if (cfg->deterministic) fjg_buf_printf(out, "#define FJ_DETERMINISTIC 1\n");
  if (cfg->varlen) fjg_buf_printf(out, "#define FJ_VARLEN 1\n");
  if (cfg->skip) fjg_buf_printf(out, "#define FJ_SKIP 1\n");
}

/* The parts in order; at FJG_PART_PROLOGUE the interval rules, the
 * prologue and, for a backward unit, the backward hooks. */
static fj_status emit_parts(const fjg_graph *g, const char *const *parts,
                            int backward, fjg_buf *out) {
  if (!parts) return FJ_ENOTFOUND;
  for (const char *const *part = parts; *part; part++) {
    fj_status st = FJ_OK;
    if (strcmp(*part, FJG_PART_PROLOGUE) == 0) {
      fjg_buf_printf(out, "\n");
      st = fjg_emit_interval_rules(g, out);
      if (st == FJ_OK) st = fjg_emit_prologue(g, out);
      if (st == FJ_OK && backward) st = fjg_emit_backward_hooks(g, out);
    } else {
      st = put_template(out, *part);
    }
    if (st != FJ_OK) return st;
  }
  return out->failed ? FJ_ENOMEM : FJ_OK;
}

fj_status fjg_emit_parts(const fjg_graph *g, const char *const *parts, fjg_buf *out) {
  return emit_parts(g, parts, 0, out);
}

fj_status fjg_emit_forward_tu(const fjg_graph *g, const fjg_config *cfg,
                              fjg_buf *out) {
  if (!cfg || !cfg->template_name) return FJ_EINVAL;
  const char *const *parts = fjg_template_parts(cfg->template_name, "forward");
  if (!parts) return FJ_ENOTFOUND;
  put_config_defines(out, g, cfg);
  const int cols = fjg_mask_col_values(g);
  if (cols < 0) out->failed = 1;
  if (cols > 0) fjg_buf_printf(out, "#define FJ_MASK_COLS %d\n", cols);
  return emit_parts(g, parts, 0, out);
}

/* 1 when every trainable read's index reads q (a relative position, or a
 * per-query element): then a thread's dS^T elements (j, e) and (j + 1, e +
 * 2), which share q - kv, and (j, e) and (j, e + 2), which share q, are best
 * visited in the order that sm90's fjhb_grad_bufs takes under
 * FJ_GRAD_DIAGONAL; an index of kv alone keeps the row-major order, whose
 * neighbours share kv. */
static int grad_diagonal(const fjg_graph *g) {
  const fjg_derivative *d = fjg_graph_derivative(g);
  if (!d || !num_grad_reads(g)) return 0;
  for (int i = 0; i < d->num_buffer_grads; i++) {
    const fjg_buffer_grad *r = &d->buffer_grads[i];
    if (has_grad(g, r) && !(fjg_input_deps(g, r->index) & (1u << FJG_IN_Q))) return 0;
  }
  return 1;
}

fj_status fjg_emit_backward_tu(const fjg_graph *g, const fjg_config *cfg,
                               fjg_buf *out) {
  if (!cfg || !cfg->template_name) return FJ_EINVAL;
  const char *const *parts = fjg_template_parts(cfg->template_name, "backward");
  if (!parts) return FJ_ENOTFOUND;
  put_config_defines(out, g, cfg);
  if (score_grad_one(g)) fjg_buf_printf(out, "#define FJ_SCORE_GRAD_ONE 1\n");
  if (grad_diagonal(g)) fjg_buf_printf(out, "#define FJ_GRAD_DIAGONAL 1\n");
  if (!fjg_mask_is_index_only(g)) fjg_buf_printf(out, "#define FJ_MASK_LOADS 1\n");
  const int rows = fjg_mask_row_values(g);
  if (rows < 0) out->failed = 1;
  if (rows > 0) fjg_buf_printf(out, "#define FJ_MASK_ROWS %d\n", rows);
  return emit_parts(g, parts, 1, out);
}

fj_status fjg_emit_kernel_tu(const fjg_graph *g, const fjg_config *cfg, const char *kernel,
                             fjg_buf *out) {
  if (!cfg || !cfg->template_name || !kernel) return FJ_EINVAL;
  const char *const *parts = fjg_template_parts(cfg->template_name, kernel);
  if (!parts) return FJ_ENOTFOUND;
  put_config_defines(out, g, cfg);
  return emit_parts(g, parts, 0, out);
}
