/*
 * gen/derivative.c: reverse-mode differentiation of score_mod (see
 * derivative.h).
 *
 * Node ids are a topological order (operands before users), so walking
 * them downwards from the root visits every node after all of its users:
 * its adjoint (a node: d root / d this node) is complete when it is reached,
 * and it passes its share on to its operands by the chain rule.
 */
#include "gen/derivative.h"

#include <stdlib.h>
#include <string.h>

#include "util/errmsg.h"

typedef struct deriv {
  fjg_graph *g;
  int32_t *adj; /* per node: its adjoint's node, -1 for zero */
  int failed;
} deriv;

static int ok(deriv *d, int id) {
  if (id < 0) d->failed = 1;
  return id;
}

static int cst(deriv *d, float v) { return ok(d, fjg_const_f32(d->g, v)); }
static int un(deriv *d, fjg_op op, int a) {
  return d->failed ? -1 : ok(d, fjg_unary(d->g, op, a));
}

/* The f32 constant of node id, when it is 1 or -1 (else 0). */
static int unit_const(const deriv *d, int id) {
  const fjg_node *n = fjg_node_at(d->g, id);
  if (n->op != FJG_OP_CONST || n->type != FJG_F32) return 0;
  return n->imm.f == 1.0f ? 1 : n->imm.f == -1.0f ? -1 : 0;
}

/* A product by 1 or -1 is the other operand or its negation, exactly (the
 * graph folds no float identity, so that forward graphs stay as traced):
 * the chain rule makes many. */
static int bin(deriv *d, fjg_op op, int a, int b) {
  if (d->failed) return -1;
  if (op == FJG_OP_MUL && fjg_node_at(d->g, a)->type == FJG_F32 &&
      fjg_node_at(d->g, b)->type == FJG_F32) {
    const int ua = unit_const(d, a), ub = unit_const(d, b);
    if (ub) return ub > 0 ? a : un(d, FJG_OP_NEG, a);
    if (ua) return ua > 0 ? b : un(d, FJG_OP_NEG, b);
  }
  return ok(d, fjg_binary(d->g, op, a, b));
}
static int sel(deriv *d, int c, int a, int b) {
  return d->failed ? -1 : ok(d, fjg_where(d->g, c, a, b));
}

/* adj[to] += v, for f32 operands only: integers and booleans carry none. */
static void add_to(deriv *d, int to, int v) {
  if (d->failed || fjg_node_at(d->g, to)->type != FJG_F32) return;
  d->adj[to] = d->adj[to] < 0 ? v : bin(d, FJG_OP_ADD, d->adj[to], v);
}

/* The weight of operand `self` of min (is_min) or max: 1 where it is the
 * result alone, 1/2 on a tie, else 0. */
static int minmax_weight(deriv *d, int is_min, int self, int other) {
  int wins = bin(d, is_min ? FJG_OP_LT : FJG_OP_GT, self, other);
  int tie = bin(d, FJG_OP_EQ, self, other);
  return sel(d, wins, cst(d, 1.0f), sel(d, tie, cst(d, 0.5f), cst(d, 0.0f)));
}

/* Passes node id's adjoint g to its operands. */
static void chain(deriv *d, int id, int g) {
  /* A copy: building nodes below may move the graph's node array. */
  const fjg_node n = *fjg_node_at(d->g, id);
  const int a = n.a, b = n.b;
  const float ln2 = 0.693147180559945309f;
  switch ((fjg_op)n.op) {
  case FJG_OP_ADD: add_to(d, a, g); add_to(d, b, g); break;
  case FJG_OP_SUB: add_to(d, a, g); add_to(d, b, un(d, FJG_OP_NEG, g)); break;
  case FJG_OP_MUL:
    add_to(d, a, bin(d, FJG_OP_MUL, g, b));
    add_to(d, b, bin(d, FJG_OP_MUL, g, a));
    break;
  case FJG_OP_DIV: /* d(a / b) = da / b - (a / b) db / b */
    add_to(d, a, bin(d, FJG_OP_DIV, g, b));
    add_to(d, b, un(d, FJG_OP_NEG, bin(d, FJG_OP_DIV, bin(d, FJG_OP_MUL, g, id), b)));
    break;
  case FJG_OP_MOD: /* a % b = a - floor(a / b) * b */
    add_to(d, a, g);
    add_to(d, b, un(d, FJG_OP_NEG, bin(d, FJG_OP_MUL, g, bin(d, FJG_OP_IDIV, a, b))));
    break;
  case FJG_OP_NEG: add_to(d, a, un(d, FJG_OP_NEG, g)); break;
  case FJG_OP_EXP: add_to(d, a, bin(d, FJG_OP_MUL, g, id)); break;
  case FJG_OP_EXP2:
    add_to(d, a, bin(d, FJG_OP_MUL, g, bin(d, FJG_OP_MUL, id, cst(d, ln2))));
    break;
  case FJG_OP_LOG: add_to(d, a, bin(d, FJG_OP_DIV, g, a)); break;
  case FJG_OP_LOG2:
    add_to(d, a, bin(d, FJG_OP_DIV, g, bin(d, FJG_OP_MUL, a, cst(d, ln2))));
    break;
  case FJG_OP_SQRT: /* 1 / (2 sqrt(a)) */
    add_to(d, a, bin(d, FJG_OP_DIV, bin(d, FJG_OP_MUL, g, cst(d, 0.5f)), id));
    break;
  case FJG_OP_TANH: /* 1 - tanh^2 */
    add_to(d, a, bin(d, FJG_OP_MUL, g,
                     bin(d, FJG_OP_SUB, cst(d, 1.0f), bin(d, FJG_OP_MUL, id, id))));
    break;
  case FJG_OP_ABS: {
    int zero = cst(d, 0.0f);
    int sign = sel(d, bin(d, FJG_OP_GT, a, zero), cst(d, 1.0f),
                   sel(d, bin(d, FJG_OP_LT, a, zero), cst(d, -1.0f), zero));
    add_to(d, a, bin(d, FJG_OP_MUL, g, sign));
    break;
  }
  case FJG_OP_MIN:
  case FJG_OP_MAX: {
    const int is_min = n.op == FJG_OP_MIN;
    add_to(d, a, bin(d, FJG_OP_MUL, g, minmax_weight(d, is_min, a, b)));
    add_to(d, b, bin(d, FJG_OP_MUL, g, minmax_weight(d, is_min, b, a)));
    break;
  }
  case FJG_OP_WHERE: {
    int zero = cst(d, 0.0f);
    add_to(d, b, sel(d, a, g, zero));
    add_to(d, n.c, sel(d, a, zero, g));
    break;
  }
  default: /* floor, ceil, //, conversions, leaves: no gradient passes */
    break;
  }
}

fj_status fjg_derive_score(fjg_graph *g, uint64_t trainable, fjg_derivative *out,
                           char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < fjg_num_args(g) && i < 64; i++) {
    const fjg_arg *arg = fjg_arg_at(g, i);
    if ((trainable >> i & 1) && (arg->kind != FJ_ARG_BUFFER || arg->type != FJG_F32))
      return fju_fail(err, errlen, FJ_EINVAL,
                      "'%s' is trainable but not an f32 buffer: only f32 buffers have "
                      "gradients", arg->name);
  }
  const int root = fjg_score_root(g);
  if (root < 0) {
    out->dscore = fjg_const_f32(g, 1.0f);
    return out->dscore < 0 ? fju_fail(err, errlen, FJ_ESPEC, "%s", fjg_graph_error(g))
                           : FJ_OK;
  }
  deriv d = {g, malloc(sizeof(int32_t) * (size_t)(root + 1)), 0};
  if (!d.adj) return fju_fail(err, errlen, FJ_ENOMEM, "out of memory");
  for (int i = 0; i <= root; i++) d.adj[i] = -1;
  d.adj[root] = cst(&d, 1.0f);
  out->dscore = -1;
  fj_status st = FJ_OK;
  for (int id = root; id >= 0 && !d.failed; id--) {
    const int adj = d.adj[id];
    if (adj < 0) continue;
    const fjg_node *n = fjg_node_at(g, id);
    if (n->op == FJG_OP_INPUT && n->arg == FJG_IN_SCORE) {
      out->dscore = adj;
    } else if (n->op == FJG_OP_LOAD && (trainable >> n->arg & 1)) {
      if (out->num_buffer_grads == FJG_MAX_BUFFER_GRADS) {
        st = fju_fail(err, errlen, FJ_EUNSUPPORTED,
                      "score_mod reads trainable buffers at more than %d places",
                      FJG_MAX_BUFFER_GRADS);
        break;
      }
      out->buffer_grads[out->num_buffer_grads++] = (fjg_buffer_grad){n->arg, n->a, adj};
    } else {
      chain(&d, id, adj);
    }
  }
  if (st == FJ_OK && !d.failed && out->dscore < 0) out->dscore = cst(&d, 0.0f);
  if (st == FJ_OK && d.failed)
    st = fju_fail(err, errlen, FJ_ESPEC, "%s", fjg_graph_error(g));
  free(d.adj);
  return st;
}
