/*
 * gen/interval.c: tile classification by interval analysis (see interval.h).
 */
#include "gen/interval.h"

#include <stdlib.h>

/*
 * The per-op rules, written once in the common subset of C and CUDA C++.
 * FJG_IV_RULES(FJG_EXPAND) compiles them here; FJG_IV_RULES(FJG_STRINGIFY)
 * is their text for the emitter. Keep them free of comments, string literals
 * and `else` (the emitter reflows the text one statement per line).
 *
 * An fj_iv of an i32 node is [lo, hi] inside the int32 range; fj_iv_make
 * widens any bound past it to the full range, since the real value wrapped.
 * A bool is [lo, hi] inside [0, 1]: lo == 0 can be false, hi == 1 can be true.
 * Floor division and modulo on a divisor range that excludes 0 take their
 * extremes at the corners (they are monotone in each operand while the
 * divisor keeps its sign); a range containing 0 is split around it.
 */
#define FJG_IV_RULES(F)                                                       \
  F(struct fj_iv { long long lo; long long hi; };                             \
    typedef struct fj_iv fj_iv;                                               \
    FJ_IV_FN fj_iv fj_iv_make(long long lo, long long hi) {                   \
      fj_iv r;                                                                \
      r.lo = lo;                                                              \
      r.hi = hi;                                                              \
      if (lo < -2147483648LL || hi > 2147483647LL) r.lo = -2147483648LL;      \
      if (lo < -2147483648LL || hi > 2147483647LL) r.hi = 2147483647LL;       \
      return r;                                                               \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_full(void) {                                         \
      return fj_iv_make(-2147483648LL, 2147483647LL);                         \
    }                                                                         \
    FJ_IV_FN long long fj_iv_min2(long long a, long long b) {                 \
      return a < b ? a : b;                                                   \
    }                                                                         \
    FJ_IV_FN long long fj_iv_max2(long long a, long long b) {                 \
      return a > b ? a : b;                                                   \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_hull(fj_iv a, fj_iv b) {                             \
      return fj_iv_make(fj_iv_min2(a.lo, b.lo), fj_iv_max2(a.hi, b.hi));      \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_add(fj_iv a, fj_iv b) {                              \
      return fj_iv_make(a.lo + b.lo, a.hi + b.hi);                            \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_sub(fj_iv a, fj_iv b) {                              \
      return fj_iv_make(a.lo - b.hi, a.hi - b.lo);                            \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_mul(fj_iv a, fj_iv b) {                              \
      long long p0 = a.lo * b.lo;                                             \
      long long p1 = a.lo * b.hi;                                             \
      long long p2 = a.hi * b.lo;                                             \
      long long p3 = a.hi * b.hi;                                             \
      return fj_iv_make(fj_iv_min2(fj_iv_min2(p0, p1), fj_iv_min2(p2, p3)),   \
                        fj_iv_max2(fj_iv_max2(p0, p1), fj_iv_max2(p2, p3)));  \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_neg(fj_iv a) { return fj_iv_make(-a.hi, -a.lo); }    \
    FJ_IV_FN fj_iv fj_iv_min(fj_iv a, fj_iv b) {                              \
      return fj_iv_make(fj_iv_min2(a.lo, b.lo), fj_iv_min2(a.hi, b.hi));      \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_max(fj_iv a, fj_iv b) {                              \
      return fj_iv_make(fj_iv_max2(a.lo, b.lo), fj_iv_max2(a.hi, b.hi));      \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_abs(fj_iv a) {                                       \
      if (a.lo >= 0) return a;                                                \
      if (a.hi <= 0) return fj_iv_neg(a);                                     \
      return fj_iv_make(0, fj_iv_max2(-a.lo, a.hi));                          \
    }                                                                         \
    FJ_IV_FN long long fj_iv_fdiv(long long a, long long b) {                 \
      long long q = a / b;                                                    \
      if (q * b != a && ((a < 0) != (b < 0))) q = q - 1;                      \
      return q;                                                               \
    }                                                                         \
    FJ_IV_FN long long fj_iv_fmod(long long a, long long b) {                 \
      return a - fj_iv_fdiv(a, b) * b;                                        \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_idiv_nz(fj_iv a, fj_iv b) {                          \
      long long d0 = fj_iv_fdiv(a.lo, b.lo);                                  \
      long long d1 = fj_iv_fdiv(a.lo, b.hi);                                  \
      long long d2 = fj_iv_fdiv(a.hi, b.lo);                                  \
      long long d3 = fj_iv_fdiv(a.hi, b.hi);                                  \
      return fj_iv_make(fj_iv_min2(fj_iv_min2(d0, d1), fj_iv_min2(d2, d3)),   \
                        fj_iv_max2(fj_iv_max2(d0, d1), fj_iv_max2(d2, d3)));  \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_idiv(fj_iv a, fj_iv b) {                             \
      fj_iv r = fj_iv_make(0, 0);                                             \
      if (b.lo > 0 || b.hi < 0) return fj_iv_idiv_nz(a, b);                   \
      if (b.lo < 0) r = fj_iv_hull(r, fj_iv_idiv_nz(a, fj_iv_make(b.lo, -1)));\
      if (b.hi > 0) r = fj_iv_hull(r, fj_iv_idiv_nz(a, fj_iv_make(1, b.hi))); \
      return r;                                                               \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_mod_nz(fj_iv a, fj_iv b) {                           \
      long long d = b.lo;                                                     \
      if (b.lo == b.hi && fj_iv_fdiv(a.lo, d) == fj_iv_fdiv(a.hi, d))         \
        return fj_iv_make(fj_iv_fmod(a.lo, d), fj_iv_fmod(a.hi, d));          \
      if (b.lo > 0 && a.lo >= 0 && a.hi < b.lo) return a;                     \
      if (b.lo > 0) return fj_iv_make(0, b.hi - 1);                           \
      if (a.hi <= 0 && a.lo > b.hi) return a;                                 \
      return fj_iv_make(b.lo + 1, 0);                                         \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_mod(fj_iv a, fj_iv b) {                              \
      fj_iv r = fj_iv_make(0, 0);                                             \
      if (b.lo > 0 || b.hi < 0) return fj_iv_mod_nz(a, b);                    \
      if (b.lo < 0) r = fj_iv_hull(r, fj_iv_mod_nz(a, fj_iv_make(b.lo, -1))); \
      if (b.hi > 0) r = fj_iv_hull(r, fj_iv_mod_nz(a, fj_iv_make(1, b.hi)));  \
      return r;                                                               \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_bool(int can_true, int can_false) {                  \
      return fj_iv_make(can_false ? 0 : 1, can_true ? 1 : 0);                 \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_unknown_bool(void) { return fj_iv_make(0, 1); }      \
    FJ_IV_FN fj_iv fj_iv_lt(fj_iv a, fj_iv b) {                               \
      return fj_iv_bool(a.lo < b.hi, a.hi >= b.lo);                           \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_le(fj_iv a, fj_iv b) {                               \
      return fj_iv_bool(a.lo <= b.hi, a.hi > b.lo);                           \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_gt(fj_iv a, fj_iv b) { return fj_iv_lt(b, a); }      \
    FJ_IV_FN fj_iv fj_iv_ge(fj_iv a, fj_iv b) { return fj_iv_le(b, a); }      \
    FJ_IV_FN fj_iv fj_iv_eq(fj_iv a, fj_iv b) {                               \
      int single = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;              \
      return fj_iv_bool(a.lo <= b.hi && b.lo <= a.hi, !single);               \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_not(fj_iv a) { return fj_iv_make(1 - a.hi, 1 - a.lo); } \
    FJ_IV_FN fj_iv fj_iv_ne(fj_iv a, fj_iv b) {                               \
      return fj_iv_not(fj_iv_eq(a, b));                                       \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_and(fj_iv a, fj_iv b) {                              \
      return fj_iv_make(fj_iv_min2(a.lo, b.lo), fj_iv_min2(a.hi, b.hi));      \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_or(fj_iv a, fj_iv b) {                               \
      return fj_iv_make(fj_iv_max2(a.lo, b.lo), fj_iv_max2(a.hi, b.hi));      \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_xor(fj_iv a, fj_iv b) {                              \
      int t = (a.hi == 1 && b.lo == 0) || (a.lo == 0 && b.hi == 1);           \
      int f = (a.hi == 1 && b.hi == 1) || (a.lo == 0 && b.lo == 0);           \
      return fj_iv_bool(t, f);                                                \
    }                                                                         \
    FJ_IV_FN fj_iv fj_iv_where(fj_iv c, fj_iv a, fj_iv b) {                   \
      if (c.lo == 1) return a;                                                \
      if (c.hi == 0) return b;                                                \
      return fj_iv_hull(a, b);                                                \
    }                                                                         \
    FJ_IV_FN int fj_iv_tile_class(fj_iv m) {                                  \
      if (m.hi == 0) return 0;                                                \
      if (m.lo == 1) return 2;                                                \
      return 1;                                                               \
    })

#define FJG_EXPAND(...) __VA_ARGS__
#define FJG_STRINGIFY(...) #__VA_ARGS__

#define FJ_IV_FN static inline
FJG_IV_RULES(FJG_EXPAND)

static const char rules_source[] = FJG_IV_RULES(FJG_STRINGIFY);

const char *fjg_interval_rules_source(void) { return rules_source; }

static fj_iv point(long long v) { return fj_iv_make(v, v); }

typedef struct tile {
  const fjg_env *env;
  int b, h, q0, q1, kv0, kv1;
} tile;

static fj_iv leaf_iv(const fjg_node *n, const tile *t) {
  const fjg_env *env = t->env;
  switch (n->op) {
  case FJG_OP_CONST: return n->type == FJG_F32 ? fj_iv_full() : point(n->imm.i);
  case FJG_OP_SIZE: return env ? point(env->sizes[n->arg]) : fj_iv_full();
  case FJG_OP_PARAM:
    if (n->type == FJG_I32 && env && env->param_i32)
      return point(env->param_i32[n->arg]);
    return fj_iv_full();
  case FJG_OP_INPUT:
    switch (n->arg) {
    case FJG_IN_B: return point(t->b);
    case FJG_IN_H: return point(t->h);
    case FJG_IN_Q: {
      const long long off = env ? env->q_off : 0;
      return fj_iv_make(t->q0 + off, t->q1 + off);
    }
    case FJG_IN_KV: {
      const long long off = env ? env->kv_off : 0;
      return fj_iv_make(t->kv0 + off, t->kv1 + off);
    }
    default: return fj_iv_full();
    }
  default: return fj_iv_full(); /* LOAD: a runtime value */
  }
}

static fj_iv i32_iv(fjg_op op, fj_iv a, fj_iv b) {
  switch (op) {
  case FJG_OP_NEG: return fj_iv_neg(a);
  case FJG_OP_ABS: return fj_iv_abs(a);
  case FJG_OP_FLOOR:
  case FJG_OP_CEIL: return a;
  case FJG_OP_ADD: return fj_iv_add(a, b);
  case FJG_OP_SUB: return fj_iv_sub(a, b);
  case FJG_OP_MUL: return fj_iv_mul(a, b);
  case FJG_OP_IDIV: return fj_iv_idiv(a, b);
  case FJG_OP_MOD: return fj_iv_mod(a, b);
  case FJG_OP_MIN: return fj_iv_min(a, b);
  case FJG_OP_MAX: return fj_iv_max(a, b);
  default: return fj_iv_full();
  }
}

static fj_iv bool_iv(fjg_op op, fj_iv a, fj_iv b) {
  switch (op) {
  case FJG_OP_LT: return fj_iv_lt(a, b);
  case FJG_OP_LE: return fj_iv_le(a, b);
  case FJG_OP_GT: return fj_iv_gt(a, b);
  case FJG_OP_GE: return fj_iv_ge(a, b);
  case FJG_OP_EQ: return fj_iv_eq(a, b);
  case FJG_OP_NE: return fj_iv_ne(a, b);
  case FJG_OP_NOT: return fj_iv_not(a);
  case FJG_OP_AND: return fj_iv_and(a, b);
  case FJG_OP_OR: return fj_iv_or(a, b);
  case FJG_OP_XOR: return fj_iv_xor(a, b);
  default: return fj_iv_unknown_bool();
  }
}

/* The interval of one node from its operands' (iv is indexed by node id).
 * f32 nodes get the full range, which no rule reads: comparisons of f32
 * operands are unknown booleans. The emitter follows the same cases. */
static fj_iv node_iv(const fjg_node *nodes, const fjg_node *n, const fj_iv *iv,
                     const tile *t) {
  if (n->op <= FJG_OP_LOAD) return leaf_iv(n, t);
  if (n->op == FJG_OP_WHERE)
    return n->type == FJG_F32 ? fj_iv_full()
                              : fj_iv_where(iv[n->a], iv[n->b], iv[n->c]);
  int arity = fjg_op_arity((fjg_op)n->op);
  fj_iv a = iv[n->a];
  fj_iv b = arity >= 2 ? iv[n->b] : a;
  if (n->type == FJG_I32) return i32_iv((fjg_op)n->op, a, b);
  if (n->type == FJG_F32) return fj_iv_full();
  if (nodes[n->a].type == FJG_F32) return fj_iv_unknown_bool();
  return bool_iv((fjg_op)n->op, a, b);
}

void fjg_iv_apply(fjg_op op, fjg_type operand_type, const int64_t a[2],
                  const int64_t b[2], const int64_t c[2], int64_t out[2]) {
  fj_iv x = fj_iv_make(a[0], a[1]), y = fj_iv_make(b[0], b[1]), r;
  if (op == FJG_OP_WHERE)
    r = fj_iv_where(x, y, fj_iv_make(c[0], c[1]));
  else if (op >= FJG_OP_LT || op == FJG_OP_NOT)
    r = bool_iv(op, x, y);
  else if (operand_type == FJG_I32)
    r = i32_iv(op, x, y);
  else
    r = fj_iv_full();
  out[0] = r.lo;
  out[1] = r.hi;
}

int fjg_tile_class_cpu(const fjg_graph *g, const fjg_env *env, int b, int h,
                       int q0, int q1, int kv0, int kv1) {
  int root = fjg_mask_root(g);
  if (root < 0) return FJG_TILE_FULL;
  int count;
  const int32_t *list = fjg_reachable(g, 0, &count);
  fj_iv small[128];
  fj_iv *iv = root < 128 ? small : malloc((size_t)(root + 1) * sizeof *iv);
  if (!iv) return FJG_TILE_PARTIAL;
  tile t = {env, b, h, q0, q1, kv0, kv1};
  const fjg_node *nodes = fjg_node_at(g, 0);
  for (int k = 0; k < count; k++)
    iv[list[k]] = node_iv(nodes, &nodes[list[k]], iv, &t);
  int cls = fj_iv_tile_class(iv[root]);
  if (iv != small) free(iv);
  return cls;
}

int fjg_mask_is_index_only(const fjg_graph *g) {
  int count;
  const int32_t *list = fjg_reachable(g, 0, &count);
  for (int k = 0; k < count; k++)
    if (fjg_node_at(g, list[k])->op == FJG_OP_LOAD) return 0;
  return 1;
}
