/*
 * gen/eval.c: the CPU evaluator (see eval.h), the semantics that constant
 * folding, the interval analysis and the CUDA emitter follow.
 *
 * Built with -ffp-contract=off (CMakeLists.txt): every float operation here
 * rounds once, to float, as the kernel's round-to-nearest intrinsics do.
 */
#include "gen/eval.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gen/interval.h"

/* float expressions must round to float at every step (SSE, not x87). */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "gen/eval.c needs FLT_EVAL_METHOD == 0 (float arithmetic in float)"
#endif

/* Error bounds of the kernel's transcendentals, in float ulps of the exact
 * result: CUDA's documented maxima (expf, exp2f 2; logf, log2f 1) plus two,
 * one for the rounding of the double-precision value the bounds start from
 * and one because the documented figures come from tests, not proofs.
 * tanh.approx.f32: relative error about 2^-11 (PTX ISA); 2^-10 used. */
enum { EXP_ULPS = 4, LOG_ULPS = 3 };
#define TANH_REL 0x1p-10

/* ---- i32 ---- */

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

/* ---- f32 ---- */

/* fminf/fmaxf: a NaN operand gives the other one. For two zeros of opposite
 * sign the kernel may return either (bounded mode treats that case); the
 * CPU returns b. */
static float min_f32(float a, float b) {
  if (isnan(a)) return b;
  if (isnan(b)) return a;
  return a < b ? a : b;
}
static float max_f32(float a, float b) {
  if (isnan(a)) return b;
  if (isnan(b)) return a;
  return a > b ? a : b;
}

static float floordiv_f32(float a, float b) { return floorf(a / b); }
static float mod_f32(float a, float b) {
  float f = floorf(a / b);
  float p = f * b;
  return a - p;
}

static float apply_f32(fjg_op op, float a, float b) {
  switch (op) {
  case FJG_OP_NEG: return -a;
  case FJG_OP_ABS: return fabsf(a);
  case FJG_OP_EXP: return expf(a);
  case FJG_OP_EXP2: return exp2f(a);
  case FJG_OP_LOG: return logf(a);
  case FJG_OP_LOG2: return log2f(a);
  case FJG_OP_SQRT: return sqrtf(a);
  case FJG_OP_TANH: return tanhf(a);
  case FJG_OP_FLOOR: return floorf(a);
  case FJG_OP_CEIL: return ceilf(a);
  case FJG_OP_ADD: return a + b;
  case FJG_OP_SUB: return a - b;
  case FJG_OP_MUL: return a * b;
  case FJG_OP_DIV: return a / b;
  case FJG_OP_IDIV: return floordiv_f32(a, b);
  case FJG_OP_MOD: return mod_f32(a, b);
  case FJG_OP_MIN: return min_f32(a, b);
  case FJG_OP_MAX: return max_f32(a, b);
  default: return 0.0f;
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

static inline fjg_value apply_op(fjg_op op, fjg_type type,
                                 fjg_type operand_type, fjg_value a,
                                 fjg_value b, fjg_value c) {
  fjg_value r;
  r.i = 0;
  switch (op) {
  case FJG_OP_NOT: r.i = !a.i; return r;
  case FJG_OP_AND: r.i = a.i && b.i; return r;
  case FJG_OP_OR: r.i = a.i || b.i; return r;
  case FJG_OP_XOR: r.i = (a.i != 0) != (b.i != 0); return r;
  case FJG_OP_WHERE: return a.i ? b : c;
  case FJG_OP_TO_F32: r.f = (float)a.i; return r;
  case FJG_OP_LT: case FJG_OP_LE: case FJG_OP_GT:
  case FJG_OP_GE: case FJG_OP_EQ: case FJG_OP_NE:
    r.i = compare(op, operand_type, a, b);
    return r;
  default: break;
  }
  if (type == FJG_F32)
    r.f = apply_f32(op, a.f, b.f);
  else
    r.i = apply_i32(op, a.i, b.i);
  return r;
}

fjg_value fjg_apply_op(fjg_op op, fjg_type type, fjg_type operand_type,
                       fjg_value a, fjg_value b, fjg_value c) {
  return apply_op(op, type, operand_type, a, b, c);
}

static int is_transcendental(int op) {
  return op == FJG_OP_EXP || op == FJG_OP_EXP2 || op == FJG_OP_LOG ||
         op == FJG_OP_LOG2 || op == FJG_OP_TANH;
}

/* ---- decisions shared with the emitter ---- */

static int decides(const fjg_node *n, const fjg_node *nodes) {
  switch (n->op) {
  case FJG_OP_LT: case FJG_OP_LE: case FJG_OP_GT:
  case FJG_OP_GE: case FJG_OP_EQ: case FJG_OP_NE:
    return 1;
  case FJG_OP_FLOOR: case FJG_OP_CEIL: case FJG_OP_IDIV: case FJG_OP_MOD:
    return nodes[n->a].type == FJG_F32;
  default: return 0;
  }
}

void fjg_decisive_nodes(const fjg_graph *g, int which, uint8_t *mark) {
  int count;
  const int32_t *list = fjg_reachable(g, which, &count);
  const fjg_node *nodes = fjg_node_at(g, 0);
  /* Users have larger ids than their operands: walk down from the root. */
  for (int k = count - 1; k >= 0; k--) {
    const fjg_node *n = &nodes[list[k]];
    if (n->op <= FJG_OP_PARAM) continue;
    int pass = decides(n, nodes) || (n->type == FJG_F32 && mark[list[k]]);
    if (!pass) continue;
    int arity = fjg_op_arity((fjg_op)n->op);
    int ops[3] = {n->a, n->b, n->c};
    for (int i = 0; i < arity; i++)
      if (nodes[ops[i]].type == FJG_F32) mark[ops[i]] = 1;
  }
}

int fjg_div_recip(const fjg_graph *g, int divisor, float *recip) {
  const fjg_node *c = fjg_node_at(g, divisor);
  if (c->op != FJG_OP_CONST || c->type != FJG_F32) return 0;
  double r = 1.0 / (double)c->imm.f;
  if (!isfinite(r) || fabs(r) < 0x1p-126 || fabs(r) > 0x1p126) return 0;
  *recip = (float)r;
  return 1;
}

/* ---- the program ---- */

/* One node of a root's evaluation, in graph order. Leaves other than inputs
 * are resolved when the evaluator is set up (env does not change). */
typedef struct fjg_instr {
  uint8_t op, type, arity;
  uint8_t otype; /* the numeric operands' type (the branches' for WHERE) */
  uint8_t recip; /* score_mod DIV by a constant: multiply by imm instead */
  int32_t id, a, b, c, arg;
  fjg_value imm; /* CONST, SIZE, PARAM: the value; recip: the reciprocal */
} fjg_instr;

fjg_value fjg_load_value(const fjg_env *env, int arg, fjg_type type, int32_t index) {
  fjg_value v;
  v.i = 0;
  if (!env->buffer_data || !env->buffer_len) return v;
  const void *data = env->buffer_data[arg];
  if (!data || index < 0 || index >= env->buffer_len[arg]) return v;
  if (type == FJG_F32)
    v.f = ((const float *)data)[index];
  else
    v.i = ((const int32_t *)data)[index];
  return v;
}

static fjg_value leaf_value(const fjg_env *env, const fjg_node *n) {
  fjg_value v;
  v.i = 0;
  switch (n->op) {
  case FJG_OP_CONST:
    if (n->type == FJG_F32)
      v.f = n->imm.f;
    else
      v.i = n->imm.i;
    break;
  case FJG_OP_SIZE: v.i = env->sizes[n->arg]; break;
  case FJG_OP_PARAM:
    if (n->type == FJG_F32)
      v.f = env->param_f32 ? env->param_f32[n->arg] : 0.0f;
    else
      v.i = env->param_i32 ? env->param_i32[n->arg] : 0;
    break;
  default: break;
  }
  return v;
}

/* The value of a non-leaf, non-LOAD instruction from its operands'. */
static inline fjg_value apply_instr(const fjg_instr *n, fjg_value a,
                                    fjg_value b, fjg_value c) {
  if (n->recip) {
    fjg_value r;
    r.f = a.f * n->imm.f;
    return r;
  }
  return apply_op((fjg_op)n->op, (fjg_type)n->type, (fjg_type)n->otype, a, b,
                  c);
}

/* ---- exact mode ---- */

/* The cost of one evaluation besides its nodes, in node evaluations. */
enum { CALL_COST = 3 };

static fjg_value run_exact(fjg_evaluator *e, int which,
                           const fjg_value *inputs) {
  const fjg_instr *prog = e->prog[which];
  int count = e->prog_len[which];
  fjg_value *vals = e->vals;
  for (int k = 0; k < count; k++) {
    const fjg_instr *n = &prog[k];
    fjg_value v;
    switch (n->op) {
    case FJG_OP_CONST: case FJG_OP_SIZE: case FJG_OP_PARAM: v = n->imm; break;
    case FJG_OP_INPUT: v = inputs[n->arg]; break;
    case FJG_OP_LOAD:
      v = fjg_load_value(&e->env, n->arg, (fjg_type)n->type, vals[n->a].i);
      break;
    default: v = apply_instr(n, vals[n->a], vals[n->b], vals[n->c]); break;
    }
    vals[n->id] = v;
  }
  e->work += (uint64_t)count + CALL_COST;
  return vals[prog[count - 1].id];
}

/* ---- bounded mode ---- */

/* The f32 values an aval allows: [lo, hi] (lo > hi: no number), or NaN. */
typedef struct frange {
  float lo, hi;
  int nan;
} frange;

static frange range_of(const fjg_aval *a) {
  frange r;
  if (!a->exact) {
    r.lo = a->flo, r.hi = a->fhi, r.nan = a->nan;
  } else if (isnan(a->v.f)) {
    r.lo = INFINITY, r.hi = -INFINITY, r.nan = 1;
  } else {
    r.lo = r.hi = a->v.f, r.nan = 0;
  }
  return r;
}

static int has_num(frange r) { return r.lo <= r.hi; }
static int has_zero(frange r) { return r.lo <= 0 && r.hi >= 0; }
static int has_inf(frange r) { return r.lo == -INFINITY || r.hi == INFINITY; }

static frange nan_only(void) {
  frange r = {INFINITY, -INFINITY, 1};
  return r;
}
static frange full_range(void) {
  frange r = {-INFINITY, INFINITY, 1};
  return r;
}

static fjg_aval av_exact_i(int32_t v) {
  fjg_aval a;
  memset(&a, 0, sizeof a);
  a.v.i = v;
  a.lo = a.hi = v;
  a.exact = 1;
  return a;
}

static fjg_aval av_exact_f(float v) {
  fjg_aval a;
  memset(&a, 0, sizeof a);
  a.v.f = v;
  a.flo = a.fhi = v;
  a.exact = 1;
  return a;
}

/* An aval from a range: exact when it holds one nonzero number (or only
 * NaN), else an interval. `nominal` is the CPU's own value. */
static fjg_aval av_range(frange r, float nominal, int jump) {
  fjg_aval a;
  if (!has_num(r)) return av_exact_f(NAN);
  if (r.lo == r.hi && r.lo != 0 && !r.nan) return av_exact_f(r.lo);
  memset(&a, 0, sizeof a);
  a.v.f = nominal;
  a.flo = r.lo, a.fhi = r.hi;
  a.nan = (uint8_t)r.nan;
  /* A possible NaN (or a pole) is no small error. */
  a.jump = (uint8_t)(jump || r.nan);
  return a;
}

static float fmin2(float a, float b) { return a < b ? a : b; }
static float fmax2(float a, float b) { return a > b ? a : b; }

static frange r_neg(frange a) {
  frange r = {-a.hi, -a.lo, a.nan};
  return r;
}

static frange r_add(frange a, frange b) {
  if (!has_num(a) || !has_num(b)) return nan_only();
  frange r;
  r.lo = a.lo + b.lo;
  r.hi = a.hi + b.hi;
  r.nan = a.nan || b.nan || (a.hi == INFINITY && b.lo == -INFINITY) ||
          (a.lo == -INFINITY && b.hi == INFINITY);
  if (isnan(r.lo)) r.lo = -INFINITY;
  if (isnan(r.hi)) r.hi = INFINITY;
  return r;
}

/* Extremes over the four corners; a NaN corner (0 * inf, inf / inf) makes
 * the whole line possible. */
static frange corners(fjg_op op, frange a, frange b) {
  float c[4];
  c[0] = apply_f32(op, a.lo, b.lo);
  c[1] = apply_f32(op, a.lo, b.hi);
  c[2] = apply_f32(op, a.hi, b.lo);
  c[3] = apply_f32(op, a.hi, b.hi);
  frange r = {c[0], c[0], a.nan || b.nan};
  for (int i = 0; i < 4; i++) {
    if (isnan(c[i])) return full_range();
    r.lo = fmin2(r.lo, c[i]);
    r.hi = fmax2(r.hi, c[i]);
  }
  return r;
}

static frange r_mul(frange a, frange b) {
  if (!has_num(a) || !has_num(b)) return nan_only();
  frange r = corners(FJG_OP_MUL, a, b);
  if ((has_zero(a) && has_inf(b)) || (has_zero(b) && has_inf(a))) r.nan = 1;
  return r;
}

/* *pole is set when the divisor may be zero. */
static frange r_div(frange a, frange b, int *pole) {
  if (!has_num(a) || !has_num(b)) return nan_only();
  if (has_zero(b)) {
    *pole = 1;
    return full_range();
  }
  frange r = corners(FJG_OP_DIV, a, b);
  if (has_inf(a) && has_inf(b)) r.nan = 1;
  return r;
}

/* floorf / ceilf; *jump when the result is not one integer. */
static frange r_round(fjg_op op, frange a, int *jump) {
  if (!has_num(a)) return a;
  frange r = {apply_f32(op, a.lo, 0), apply_f32(op, a.hi, 0), a.nan};
  if (r.lo != r.hi) *jump = 1;
  return r;
}

static frange r_abs(frange a) {
  if (!has_num(a)) return a;
  if (a.lo >= 0) return a;
  if (a.hi <= 0) return r_neg(a);
  frange r = {0, fmax2(-a.lo, a.hi), a.nan};
  return r;
}

static frange r_sqrt(frange a) {
  if (!has_num(a)) return a;
  if (a.hi < 0) return nan_only();
  frange r = {sqrtf(fmax2(a.lo, 0)), sqrtf(a.hi), a.nan || a.lo < 0};
  return r;
}

static frange r_minmax(fjg_op op, frange a, frange b) {
  if (!has_num(a)) return b;
  if (!has_num(b)) return a;
  frange r;
  r.nan = a.nan && b.nan;
  if (op == FJG_OP_MIN) {
    r.lo = fmin2(a.lo, b.lo);
    r.hi = fmin2(a.hi, b.hi);
    if (a.nan) r.hi = fmax2(r.hi, b.hi);
    if (b.nan) r.hi = fmax2(r.hi, a.hi);
  } else {
    r.lo = fmax2(a.lo, b.lo);
    r.hi = fmax2(a.hi, b.hi);
    if (a.nan) r.lo = fmin2(r.lo, b.lo);
    if (b.nan) r.lo = fmin2(r.lo, a.lo);
  }
  return r;
}

/* The float at or below y, then k ulps further down (and the mirror). */
static float down_ulps(double y, int k) {
  float f = (float)y;
  if ((double)f > y) f = nextafterf(f, -INFINITY);
  while (k-- > 0) f = nextafterf(f, -INFINITY);
  return f;
}
static float up_ulps(double y, int k) {
  float f = (float)y;
  if ((double)f < y) f = nextafterf(f, INFINITY);
  while (k-- > 0) f = nextafterf(f, INFINITY);
  return f;
}

static double exact_fn(fjg_op op, double x) {
  switch (op) {
  case FJG_OP_EXP: return exp(x);
  case FJG_OP_EXP2: return exp2(x);
  case FJG_OP_LOG: return log(x);
  case FJG_OP_LOG2: return log2(x);
  default: return tanh(x);
  }
}

/* Everything the kernel's exp, exp2, log, log2 or tanh.approx can return on
 * [a.lo, a.hi]; each is monotone increasing. */
static frange r_transcendental(fjg_op op, frange a) {
  if (!has_num(a)) return a;
  frange r = a;
  if (op == FJG_OP_LOG || op == FJG_OP_LOG2) {
    if (a.hi < 0) return nan_only();
    if (a.lo < 0) r.nan = 1, a.lo = 0;
  }
  double y0 = exact_fn(op, a.lo), y1 = exact_fn(op, a.hi);
  if (op == FJG_OP_TANH) {
    r.lo = down_ulps(y0 - fabs(y0) * TANH_REL, 1);
    r.hi = up_ulps(y1 + fabs(y1) * TANH_REL, 1);
    /* The special-function unit may flush subnormal inputs and results. */
    if (a.lo < FLT_MIN && a.hi > -FLT_MIN)
      r.lo = fmin2(r.lo, 0), r.hi = fmax2(r.hi, 0);
    return r;
  }
  int k = op == FJG_OP_EXP || op == FJG_OP_EXP2 ? EXP_ULPS : LOG_ULPS;
  r.lo = down_ulps(y0, k);
  r.hi = up_ulps(y1, k);
  if (op == FJG_OP_EXP || op == FJG_OP_EXP2) {
    if (r.lo < FLT_MIN) r.lo = 0; /* never negative; may flush */
  } else if (a.lo < FLT_MIN) {
    r.lo = -INFINITY; /* a subnormal input may be taken as 0 */
  }
  return r;
}

/* An f32 op with at least one inexact operand, or an op the kernel does not
 * compute exactly. */
static fjg_aval f32_bounds(fjg_op op, const fjg_aval *a, const fjg_aval *b,
                           float nominal, float recip, int use_recip) {
  frange x = range_of(a), y = b ? range_of(b) : x, r;
  int jump = a->jump || (b && b->jump);
  if (use_recip) y.lo = y.hi = recip, y.nan = 0, op = FJG_OP_MUL;
  switch (op) {
  case FJG_OP_NEG: r = r_neg(x); break;
  case FJG_OP_ABS: r = r_abs(x); break;
  case FJG_OP_SQRT: r = r_sqrt(x); break;
  case FJG_OP_FLOOR:
  case FJG_OP_CEIL: r = r_round(op, x, &jump); break;
  case FJG_OP_ADD: r = r_add(x, y); break;
  case FJG_OP_SUB: r = r_add(x, r_neg(y)); break;
  case FJG_OP_MUL: r = r_mul(x, y); break;
  case FJG_OP_DIV: r = r_div(x, y, &jump); break;
  case FJG_OP_IDIV: r = r_round(FJG_OP_FLOOR, r_div(x, y, &jump), &jump); break;
  case FJG_OP_MOD: {
    frange f = r_round(FJG_OP_FLOOR, r_div(x, y, &jump), &jump);
    r = r_add(x, r_neg(r_mul(f, y)));
    break;
  }
  case FJG_OP_MIN:
  case FJG_OP_MAX:
    r = r_minmax(op, x, y);
    /* Zeros of opposite sign: either comes back, continuously. */
    if (a->exact && b->exact && a->v.f == 0 && b->v.f == 0 &&
        signbit(a->v.f) != signbit(b->v.f))
      r.lo = -0.0f, r.hi = 0.0f;
    break;
  default: r = r_transcendental(op, x); break;
  }
  return av_range(r, nominal, jump);
}

/* An f32 comparison with an inexact operand: decided when every pair of
 * values the operands allow gives the same answer. */
static fjg_aval f32_compare(fjg_op op, const fjg_aval *a, const fjg_aval *b,
                            int nominal) {
  frange x = range_of(a), y = range_of(b);
  int nan = x.nan || y.nan, can_true, can_false;
  if (!has_num(x) || !has_num(y)) return av_exact_i(op == FJG_OP_NE);
  if (op == FJG_OP_GT || op == FJG_OP_GE) {
    frange t = x;
    x = y, y = t;
    op = op == FJG_OP_GT ? FJG_OP_LT : FJG_OP_LE;
  }
  switch (op) {
  case FJG_OP_LT:
    can_true = x.lo < y.hi;
    can_false = x.hi >= y.lo || nan;
    break;
  case FJG_OP_LE:
    can_true = x.lo <= y.hi;
    can_false = x.hi > y.lo || nan;
    break;
  default: { /* EQ, NE */
    int overlap = x.lo <= y.hi && y.lo <= x.hi;
    int same = x.lo == x.hi && y.lo == y.hi && x.lo == y.lo;
    can_true = overlap;
    can_false = !same || nan;
    if (op == FJG_OP_NE) {
      int t = can_true;
      can_true = can_false, can_false = t;
    }
    break;
  }
  }
  fjg_aval r = av_exact_i(can_true && !can_false);
  if (can_true && can_false) r.lo = 0, r.hi = 1, r.exact = 0, r.v.i = nominal;
  return r;
}

/* i32 and bool ops on operands of which one is not a single value. */
static fjg_aval int_bounds(const fjg_instr *n, const fjg_aval *a,
                           const fjg_aval *b, const fjg_aval *c,
                           int32_t nominal) {
  int64_t ia[2] = {a->lo, a->hi}, ib[2] = {0, 0}, ic[2] = {0, 0}, out[2];
  if (b) ib[0] = b->lo, ib[1] = b->hi;
  if (c) ic[0] = c->lo, ic[1] = c->hi;
  fjg_iv_apply((fjg_op)n->op, (fjg_type)n->otype, ia, ib, ic, out);
  fjg_aval r = av_exact_i(nominal);
  r.lo = out[0], r.hi = out[1];
  r.exact = out[0] == out[1];
  if (r.exact) r.v.i = (int32_t)out[0];
  return r;
}

static fjg_value nominal_of(const fjg_aval *a) {
  fjg_value v;
  v.i = a->v.i;
  return v;
}

static fjg_aval bounded_where(const fjg_instr *n, const fjg_aval *c,
                              const fjg_aval *a, const fjg_aval *b) {
  if (c->lo == c->hi) return c->lo ? *a : *b;
  if (n->type != FJG_F32)
    return int_bounds(n, c, a, b, c->v.i ? a->v.i : b->v.i);
  if (a->exact && b->exact && memcmp(&a->v.f, &b->v.f, sizeof(float)) == 0)
    return *a;
  frange x = range_of(a), y = range_of(b), r;
  r.lo = fmin2(x.lo, y.lo);
  r.hi = fmax2(x.hi, y.hi);
  r.nan = x.nan || y.nan;
  return av_range(r, c->v.i ? a->v.f : b->v.f, 1);
}

static fjg_aval bounded_op(const fjg_instr *n, const fjg_aval *vals) {
  int arity = n->arity;
  const fjg_aval *a = &vals[n->a];
  const fjg_aval *b = arity >= 2 ? &vals[n->b] : NULL;
  const fjg_aval *c = arity >= 3 ? &vals[n->c] : NULL;
  if (n->op == FJG_OP_WHERE) return bounded_where(n, a, b, c);
  fjg_value zero = {0};
  fjg_value nom = apply_instr(n, nominal_of(a), b ? nominal_of(b) : zero,
                              c ? nominal_of(c) : zero);
  int exact = a->exact && (!b || b->exact);
  if (n->type != FJG_F32) {
    if (exact) return av_exact_i(nom.i);
    if (n->otype == FJG_F32) return f32_compare((fjg_op)n->op, a, b, nom.i);
    return int_bounds(n, a, b, NULL, nom.i);
  }
  if (n->op == FJG_OP_TO_F32) {
    if (exact) return av_exact_f(nom.f);
    frange r = {(float)a->lo, (float)a->hi, 0};
    return av_range(r, nom.f, 1);
  }
  int zero_pair = (n->op == FJG_OP_MIN || n->op == FJG_OP_MAX) && exact &&
                  a->v.f == 0 && b->v.f == 0 &&
                  signbit(a->v.f) != signbit(b->v.f);
  if (exact && !is_transcendental(n->op) && !zero_pair)
    return av_exact_f(nom.f);
  if (exact && isnan(a->v.f) && is_transcendental(n->op))
    return av_exact_f(NAN);
  return f32_bounds((fjg_op)n->op, a, b, nom.f, n->imm.f, n->recip);
}

static fjg_aval bounded_load(const fjg_env *env, const fjg_instr *n,
                             const fjg_aval *index) {
  fjg_value v = fjg_load_value(env, n->arg, (fjg_type)n->type, index->v.i);
  if (index->lo == index->hi)
    return n->type == FJG_F32 ? av_exact_f(v.f) : av_exact_i(v.i);
  if (n->type == FJG_F32) return av_range(full_range(), v.f, 1);
  fjg_aval r = av_exact_i(v.i);
  r.lo = INT32_MIN, r.hi = INT32_MAX, r.exact = 0;
  return r;
}

static const fjg_aval *run_bounded(fjg_evaluator *e, int which,
                                   const fjg_value *inputs) {
  const fjg_instr *prog = e->prog[which];
  int count = e->prog_len[which];
  fjg_aval *vals = e->vals;
  for (int k = 0; k < count; k++) {
    const fjg_instr *n = &prog[k];
    fjg_aval *v = &vals[n->id];
    switch (n->op) {
    case FJG_OP_CONST: case FJG_OP_SIZE: case FJG_OP_PARAM: case FJG_OP_INPUT: {
      fjg_value x = n->op == FJG_OP_INPUT ? inputs[n->arg] : n->imm;
      *v = n->type == FJG_F32 ? av_exact_f(x.f) : av_exact_i(x.i);
      break;
    }
    case FJG_OP_LOAD: *v = bounded_load(&e->env, n, &vals[n->a]); break;
    default: *v = bounded_op(n, vals); break;
    }
  }
  e->work += 4 * (uint64_t)count + CALL_COST;
  return &vals[prog[count - 1].id];
}

/* ---- the evaluator ---- */

/* A root needs bounded mode when it reaches an op the kernel does not
 * compute exactly like the CPU. */
static int needs_bounds(const fjg_instr *prog, int count) {
  for (int k = 0; k < count; k++) {
    if (is_transcendental(prog[k].op)) return 1;
    if ((prog[k].op == FJG_OP_MIN || prog[k].op == FJG_OP_MAX) &&
        prog[k].type == FJG_F32)
      return 1;
  }
  return 0;
}

/* Writes root `which`'s program. In a score_mod, a division by a constant
 * that decides nothing multiplies by its reciprocal, as the emitter writes
 * it (decisive: scratch, one byte per node up to the root). */
static void compile(fjg_evaluator *e, int which, fjg_instr *prog,
                    uint8_t *decisive) {
  int count;
  const fjg_graph *g = e->g;
  const int32_t *list = fjg_reachable(g, which, &count);
  const fjg_node *nodes = fjg_node_at(g, 0);
  if (which == 1) fjg_decisive_nodes(g, 1, decisive);
  for (int k = 0; k < count; k++) {
    const fjg_node *n = &nodes[list[k]];
    fjg_instr *p = &prog[k];
    int arity = fjg_op_arity((fjg_op)n->op);
    memset(p, 0, sizeof *p);
    p->op = n->op, p->type = n->type, p->id = list[k], p->arg = n->arg;
    p->arity = (uint8_t)arity;
    /* Missing operands read node 0's slot (any valid one; unused). */
    p->a = arity >= 1 ? n->a : list[0];
    p->b = arity >= 2 ? n->b : list[0];
    p->c = arity >= 3 ? n->c : list[0];
    if (arity >= 1) p->otype = nodes[n->op == FJG_OP_WHERE ? n->b : n->a].type;
    if (n->op == FJG_OP_CONST || n->op == FJG_OP_SIZE || n->op == FJG_OP_PARAM)
      p->imm = leaf_value(&e->env, n);
    if (which == 1 && n->op == FJG_OP_DIV && !decisive[list[k]] &&
        fjg_div_recip(g, n->b, &p->imm.f))
      p->recip = 1;
  }
  e->prog_len[which] = count;
  e->bounded[which] = count > 0 && needs_bounds(prog, count);
}

enum { SMALL_GRAPH = 128 };

typedef struct small_space {
  fjg_aval vals[SMALL_GRAPH];
  fjg_instr prog[2][SMALL_GRAPH];
  uint8_t decisive[SMALL_GRAPH];
} small_space;

/* Sets e up, with its memory in `small` when the graph fits (and small is
 * not NULL), else on the heap. */
static fj_status setup(fjg_evaluator *e, const fjg_graph *g,
                       const fjg_env *env, small_space *small) {
  memset(e, 0, sizeof *e);
  e->g = g;
  if (env) e->env = *env;
  int n = fjg_mask_root(g) > fjg_score_root(g) ? fjg_mask_root(g)
                                               : fjg_score_root(g);
  n = n < 0 ? 1 : n + 1;
  int len[2];
  fjg_reachable(g, 0, &len[0]);
  fjg_reachable(g, 1, &len[1]);
  uint8_t *decisive;
  if (small && n <= SMALL_GRAPH) {
    e->vals = small->vals;
    e->prog[0] = small->prog[0], e->prog[1] = small->prog[1];
    decisive = small->decisive;
    e->own = 0;
  } else {
    e->vals = malloc((size_t)n * sizeof(fjg_aval));
    e->prog[0] = malloc(((size_t)len[0] + 1) * sizeof(fjg_instr));
    e->prog[1] = malloc(((size_t)len[1] + 1) * sizeof(fjg_instr));
    decisive = malloc((size_t)n);
    e->own = 1;
    if (!e->vals || !e->prog[0] || !e->prog[1] || !decisive) {
      free(decisive);
      fjg_evaluator_free(e);
      return FJ_ENOMEM;
    }
  }
  memset(decisive, 0, (size_t)n);
  compile(e, 0, e->prog[0], decisive);
  compile(e, 1, e->prog[1], decisive);
  if (e->own) free(decisive);
  return FJ_OK;
}

fj_status fjg_evaluator_init(fjg_evaluator *e, const fjg_graph *g,
                             const fjg_env *env) {
  return setup(e, g, env, NULL);
}

void fjg_evaluator_free(fjg_evaluator *e) {
  if (!e) return;
  if (e->own) {
    free(e->vals);
    free(e->prog[0]);
    free(e->prog[1]);
  }
  memset(e, 0, sizeof *e);
}

void fjg_set_inputs(const fjg_env *env, fjg_value in[FJG_NUM_INPUTS], float score, int b,
                    int h, int q, int kv) {
  in[FJG_IN_SCORE].f = score;
  in[FJG_IN_B].i = b;
  in[FJG_IN_H].i = h;
  in[FJG_IN_Q].i = q + env->q_off;
  in[FJG_IN_KV].i = kv + env->kv_off;
}

const fjg_aval *fjg_eval_root(fjg_evaluator *e, int which, float score, int b,
                              int h, int q, int kv) {
  if (!e->prog_len[which]) return NULL;
  fjg_value in[FJG_NUM_INPUTS];
  fjg_set_inputs(&e->env, in, score, b, h, q, kv);
  if (e->bounded[which]) return run_bounded(e, which, in);
  fjg_value v = run_exact(e, which, in);
  const fjg_instr *root = (const fjg_instr *)e->prog[which] + e->prog_len[which] - 1;
  e->result = root->type == FJG_F32 ? av_exact_f(v.f) : av_exact_i(v.i);
  return &e->result;
}

int fjg_eval_mask3(fjg_evaluator *e, int b, int h, int q, int kv) {
  int uncertain, v = fjg_eval_mask_guess(e, b, h, q, kv, &uncertain);
  return uncertain ? FJG_UNCERTAIN : v;
}

int fjg_eval_mask_guess(fjg_evaluator *e, int b, int h, int q, int kv,
                        int *uncertain) {
  if (uncertain) *uncertain = 0;
  if (!e->prog_len[0]) return 1;
  if (!e->bounded[0]) {
    fjg_value in[FJG_NUM_INPUTS];
    fjg_set_inputs(&e->env, in, 0, b, h, q, kv);
    return run_exact(e, 0, in).i != 0;
  }
  const fjg_aval *r = fjg_eval_root(e, 0, 0, b, h, q, kv);
  if (uncertain) *uncertain = r->lo != r->hi;
  return r->v.i != 0;
}

float fjg_eval_score_f32(fjg_evaluator *e, float score, int b, int h, int q,
                         int kv, int *uncertain) {
  if (uncertain) *uncertain = 0;
  if (!e->prog_len[1]) return score;
  if (!e->bounded[1]) {
    fjg_value in[FJG_NUM_INPUTS];
    fjg_set_inputs(&e->env, in, score, b, h, q, kv);
    return run_exact(e, 1, in).f;
  }
  const fjg_aval *r = fjg_eval_root(e, 1, score, b, h, q, kv);
  if (uncertain) *uncertain = r->jump;
  return r->v.f;
}

int fjg_eval_cost(const fjg_evaluator *e, int which) {
  which &= 1;
  int n = e->prog_len[which];
  return (e->bounded[which] ? 4 * n : n) + CALL_COST;
}

/* ---- one-shot wrappers (gen/graph.h) ---- */

int fjg_eval_mask(const fjg_graph *g, const fjg_env *env, int b, int h, int q,
                  int kv) {
  small_space small;
  fjg_evaluator e;
  if (setup(&e, g, env, &small) != FJ_OK) return 0;
  int v = fjg_eval_mask_guess(&e, b, h, q, kv, NULL);
  fjg_evaluator_free(&e);
  return v;
}

double fjg_eval_score(const fjg_graph *g, const fjg_env *env, double score,
                      int b, int h, int q, int kv) {
  small_space small;
  fjg_evaluator e;
  if (setup(&e, g, env, &small) != FJ_OK) return NAN;
  float v = fjg_eval_score_f32(&e, (float)score, b, h, q, kv, NULL);
  fjg_evaluator_free(&e);
  return v;
}
