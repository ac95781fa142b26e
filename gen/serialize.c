/*
 * gen/serialize.c: canonical bytes of a graph, the part of the cache key that
 * says which function a kernel computes.
 *
 * Layout (all integers little-endian):
 *   "FJG\0" u32 version
 *   u32 num_args, then per argument: u32 name length, name bytes, u32 kind,
 *       u32 type                                     (declaration order)
 *   u32 num_nodes, then per node: u32 op, u32 type, i32 a, i32 b, i32 c,
 *       i32 arg, u32 imm bits                        (renumbered post-order)
 *   i32 mask root, i32 score root                   (renumbered, -1: none)
 *
 * Nodes are those reachable from the mask root (visited first) and then the
 * score root, numbered in depth-first post-order with operands visited in
 * order a, b, c; so the bytes do not depend on the order in which the spec
 * happened to build its nodes, nor on nodes it built but did not use.
 */
#include <stdlib.h>
#include <string.h>

#include "gen/graph.h"

enum { SERIAL_VERSION = 1 };

static void put_u32(fjg_buf *out, uint32_t v) {
  unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8),
                        (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
  fjg_buf_append(out, b, 4);
}

static void put_i32(fjg_buf *out, int32_t v) { put_u32(out, (uint32_t)v); }

static void put_args(const fjg_graph *g, fjg_buf *out) {
  put_u32(out, (uint32_t)fjg_num_args(g));
  for (int i = 0; i < fjg_num_args(g); i++) {
    const fjg_arg *arg = fjg_arg_at(g, i);
    size_t len = strlen(arg->name);
    put_u32(out, (uint32_t)len);
    fjg_buf_append(out, arg->name, len);
    put_u32(out, (uint32_t)arg->kind);
    put_u32(out, (uint32_t)arg->type);
  }
}

/* Operand `k` (0..2) of a node, or -1. */
static int operand(const fjg_node *n, int k) {
  if (k >= fjg_op_arity((fjg_op)n->op)) return -1;
  return k == 0 ? n->a : k == 1 ? n->b : n->c;
}

/* Numbers the nodes under root in post-order: order[] gets old ids, renum[]
 * maps old id -> new id. stack has room for every node. */
static void number_post_order(const fjg_graph *g, int root, int32_t *renum,
                              int32_t *order, int *count, int32_t *stack) {
  if (root < 0 || renum[root] >= 0) return;
  int depth = 0;
  stack[depth++] = root;
  while (depth > 0) {
    const fjg_node *n = fjg_node_at(g, stack[depth - 1]);
    int pending = -1;
    for (int k = 0; k < 3 && pending < 0; k++) {
      int x = operand(n, k);
      if (x >= 0 && renum[x] < 0) pending = x;
    }
    if (pending >= 0) {
      stack[depth++] = pending;
      continue;
    }
    int id = stack[--depth];
    renum[id] = *count;
    order[(*count)++] = id;
  }
}

static int32_t mapped(const int32_t *renum, int id) {
  return id < 0 ? -1 : renum[id];
}

static void put_node(fjg_buf *out, const fjg_node *n, const int32_t *renum) {
  uint32_t imm;
  memcpy(&imm, &n->imm, sizeof imm);
  put_u32(out, n->op);
  put_u32(out, n->type);
  put_i32(out, mapped(renum, operand(n, 0)));
  put_i32(out, mapped(renum, operand(n, 1)));
  put_i32(out, mapped(renum, operand(n, 2)));
  put_i32(out, n->arg);
  put_u32(out, n->op == FJG_OP_CONST ? imm : 0);
}

fj_status fjg_serialize(const fjg_graph *g, fjg_buf *out) {
  fj_status status = FJ_ENOMEM;
  size_t n = (size_t)fjg_num_nodes(g) + 1;
  int32_t *renum = malloc(n * sizeof *renum);
  int32_t *order = malloc(n * sizeof *order);
  int32_t *stack = malloc(n * sizeof *stack);
  if (!renum || !order || !stack) goto fail;
  for (size_t i = 0; i < n; i++) renum[i] = -1;

  int count = 0;
  number_post_order(g, fjg_mask_root(g), renum, order, &count, stack);
  number_post_order(g, fjg_score_root(g), renum, order, &count, stack);

  fjg_buf_append(out, "FJG", 4);
  put_u32(out, SERIAL_VERSION);
  put_args(g, out);
  put_u32(out, (uint32_t)count);
  for (int k = 0; k < count; k++)
    put_node(out, fjg_node_at(g, order[k]), renum);
  put_i32(out, mapped(renum, fjg_mask_root(g)));
  put_i32(out, mapped(renum, fjg_score_root(g)));
  status = out->failed ? FJ_ENOMEM : FJ_OK;
fail:
  free(renum);
  free(order);
  free(stack);
  return status;
}
