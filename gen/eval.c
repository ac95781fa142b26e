/*
 * gen/eval.c: the CPU evaluator of a graph, the reference semantics that
 * constant folding, the interval analysis and the CUDA emitter follow.
 *
 * i32 arithmetic wraps (computed as uint32); f32 values are computed in
 * double; // and % are Lua's floor division and floored modulo, with
 * x // 0 = x % 0 = 0 on integers; a buffer index outside [0, len) reads 0.
 */
#include <math.h>
#include <stdlib.h>

#include "gen/graph.h"
#include "gen/interval.h"

static int32_t wrap_add(int32_t a, int32_t b) {
  return (int32_t)((uint32_t)a + (uint32_t)b);
}
static int32_t wrap_sub(int32_t a, int32_t b) {
  return (int32_t)((uint32_t)a - (uint32_t)b);
}
static int32_t wrap_mul(int32_t a, int32_t b) {
  return (int32_t)((uint32_t)a * (uint32_t)b);
}

/* Floor division; INT32_MIN // -1 wraps to INT32_MIN like the other ops. */
static int32_t idiv_i32(int32_t a, int32_t b) {
  if (b == 0) return 0;
  if (b == -1) return wrap_sub(0, a);
  int32_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) q -= 1;
  return q;
}

/* Floored modulo: the result has the sign of b. */
static int32_t mod_i32(int32_t a, int32_t b) {
  if (b == 0 || b == -1) return 0;
  int32_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

static int32_t apply_i32(fjg_op op, int32_t a, int32_t b) {
  switch (op) {
  case FJG_OP_NEG: return wrap_sub(0, a);
  case FJG_OP_ABS: return a < 0 ? wrap_sub(0, a) : a;
  case FJG_OP_FLOOR:
  case FJG_OP_CEIL: return a;
  case FJG_OP_ADD: return wrap_add(a, b);
  case FJG_OP_SUB: return wrap_sub(a, b);
  case FJG_OP_MUL: return wrap_mul(a, b);
  case FJG_OP_IDIV: return idiv_i32(a, b);
  case FJG_OP_MOD: return mod_i32(a, b);
  case FJG_OP_MIN: return a < b ? a : b;
  case FJG_OP_MAX: return a > b ? a : b;
  default: return 0;
  }
}

static double apply_f64(fjg_op op, double a, double b) {
  switch (op) {
  case FJG_OP_NEG: return -a;
  case FJG_OP_ABS: return fabs(a);
  case FJG_OP_EXP: return exp(a);
  case FJG_OP_EXP2: return exp2(a);
  case FJG_OP_LOG: return log(a);
  case FJG_OP_LOG2: return log2(a);
  case FJG_OP_SQRT: return sqrt(a);
  case FJG_OP_TANH: return tanh(a);
  case FJG_OP_FLOOR: return floor(a);
  case FJG_OP_CEIL: return ceil(a);
  case FJG_OP_ADD: return a + b;
  case FJG_OP_SUB: return a - b;
  case FJG_OP_MUL: return a * b;
  case FJG_OP_DIV: return a / b;
  case FJG_OP_IDIV: return floor(a / b);
  case FJG_OP_MOD: return a - floor(a / b) * b;
  /* fmin/fmax ignore a NaN operand, like CUDA's fminf/fmaxf. */
  case FJG_OP_MIN: return fmin(a, b);
  case FJG_OP_MAX: return fmax(a, b);
  default: return 0.0;
  }
}

static int compare(fjg_op op, fjg_type type, fjg_value a, fjg_value b) {
  if (type == FJG_F32) {
    switch (op) {
    case FJG_OP_LT: return a.f < b.f;
    case FJG_OP_LE: return a.f <= b.f;
    case FJG_OP_GT: return a.f > b.f;
    case FJG_OP_GE: return a.f >= b.f;
    case FJG_OP_EQ: return a.f == b.f;
    default: return a.f != b.f;
    }
  }
  switch (op) {
  case FJG_OP_LT: return a.i < b.i;
  case FJG_OP_LE: return a.i <= b.i;
  case FJG_OP_GT: return a.i > b.i;
  case FJG_OP_GE: return a.i >= b.i;
  case FJG_OP_EQ: return a.i == b.i;
  default: return a.i != b.i;
  }
}

fjg_value fjg_apply_op(fjg_op op, fjg_type type, fjg_type operand_type,
                       fjg_value a, fjg_value b, fjg_value c) {
  fjg_value r;
  r.f = 0.0;
  switch (op) {
  case FJG_OP_NOT: r.i = !a.i; return r;
  case FJG_OP_AND: r.i = a.i && b.i; return r;
  case FJG_OP_OR: r.i = a.i || b.i; return r;
  case FJG_OP_XOR: r.i = (a.i != 0) != (b.i != 0); return r;
  case FJG_OP_WHERE: return a.i ? b : c;
  case FJG_OP_TO_F32: r.f = (double)a.i; return r;
  case FJG_OP_LT: case FJG_OP_LE: case FJG_OP_GT:
  case FJG_OP_GE: case FJG_OP_EQ: case FJG_OP_NE:
    r.i = compare(op, operand_type, a, b);
    return r;
  default: break;
  }
  if (type == FJG_F32)
    r.f = apply_f64(op, a.f, b.f);
  else
    r.i = apply_i32(op, a.i, b.i);
  return r;
}

static fjg_value load(const fjg_env *env, const fjg_node *n, int32_t index) {
  fjg_value v;
  v.f = 0.0;
  if (n->type == FJG_I32) v.i = 0;
  if (!env || !env->buffer_data || !env->buffer_len) return v;
  const void *data = env->buffer_data[n->arg];
  if (!data || index < 0 || index >= env->buffer_len[n->arg]) return v;
  if (n->type == FJG_F32)
    v.f = ((const float *)data)[index];
  else
    v.i = ((const int32_t *)data)[index];
  return v;
}

static fjg_value leaf(const fjg_env *env, const fjg_node *n,
                      const fjg_value *inputs) {
  fjg_value v;
  v.f = 0.0;
  switch (n->op) {
  case FJG_OP_CONST:
    if (n->type == FJG_F32)
      v.f = n->imm.f;
    else
      v.i = n->imm.i;
    break;
  case FJG_OP_INPUT: v = inputs[n->arg]; break;
  case FJG_OP_SIZE: v.i = env ? env->sizes[n->arg] : 0; break;
  case FJG_OP_PARAM:
    if (n->type == FJG_F32)
      v.f = (env && env->param_f32) ? env->param_f32[n->arg] : 0.0f;
    else
      v.i = (env && env->param_i32) ? env->param_i32[n->arg] : 0;
    break;
  default: break;
  }
  return v;
}

/* Evaluates the nodes reachable from a root into vals (indexed by node id)
 * and returns the root's value. */
static fjg_value run(const fjg_graph *g, int which, const fjg_env *env,
                     const fjg_value *inputs, fjg_value *vals) {
  int count;
  const int32_t *list = fjg_reachable(g, which, &count);
  const fjg_node *nodes = fjg_node_at(g, 0);
  int id = 0;
  for (int k = 0; k < count; k++) {
    id = list[k];
    const fjg_node *n = &nodes[id];
    if (n->op <= FJG_OP_PARAM) {
      vals[id] = leaf(env, n, inputs);
    } else if (n->op == FJG_OP_LOAD) {
      vals[id] = load(env, n, vals[n->a].i);
    } else {
      fjg_value zero = {0};
      int arity = fjg_op_arity((fjg_op)n->op);
      int typed = n->op == FJG_OP_WHERE ? n->b : n->a;
      vals[id] = fjg_apply_op((fjg_op)n->op, (fjg_type)n->type,
                              (fjg_type)nodes[typed].type, vals[n->a],
                              arity >= 2 ? vals[n->b] : zero,
                              arity >= 3 ? vals[n->c] : zero);
    }
  }
  return vals[id];
}

enum { SMALL_GRAPH = 256 };

/* Runs with a stack array for small graphs; ok is 0 when out of memory. */
static fjg_value run_root(const fjg_graph *g, int which, const fjg_env *env,
                          const fjg_value *inputs, int *ok) {
  fjg_value small[SMALL_GRAPH];
  fjg_value result = {0};
  int n = fjg_num_nodes(g);
  fjg_value *vals = n <= SMALL_GRAPH ? small : malloc((size_t)n * sizeof *vals);
  *ok = vals != NULL;
  if (!vals) return result;
  result = run(g, which, env, inputs, vals);
  if (vals != small) free(vals);
  return result;
}

static void set_inputs(fjg_value *in, double score, int b, int h, int q,
                       int kv) {
  in[FJG_IN_SCORE].f = score;
  in[FJG_IN_B].i = b;
  in[FJG_IN_H].i = h;
  in[FJG_IN_Q].i = q;
  in[FJG_IN_KV].i = kv;
}

int fjg_eval_mask(const fjg_graph *g, const fjg_env *env, int b, int h, int q,
                  int kv) {
  if (fjg_mask_root(g) < 0) return 1;
  fjg_value in[FJG_NUM_INPUTS];
  set_inputs(in, 0.0, b, h, q, kv);
  int ok;
  fjg_value v = run_root(g, 0, env, in, &ok);
  return ok ? v.i != 0 : 0;
}

double fjg_eval_score(const fjg_graph *g, const fjg_env *env, double score,
                      int b, int h, int q, int kv) {
  if (fjg_score_root(g) < 0) return score;
  fjg_value in[FJG_NUM_INPUTS];
  set_inputs(in, score, b, h, q, kv);
  int ok;
  fjg_value v = run_root(g, 1, env, in, &ok);
  return ok ? v.f : NAN;
}
