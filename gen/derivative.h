/*
 * gen/derivative.h: the derivative of a graph's score_mod, built into the
 * same graph by reverse-mode differentiation of its nodes.
 *
 * For s' = score_mod(score, b, h, q, kv) the backward pass needs ds'/dscore
 * (it multiplies dS) and, for every element of a trainable f32 buffer that
 * score_mod reads, ds'/d(buffer[index]) (the bias gradient is the sum over
 * (q, kv) of dS times it). Both are graph nodes: shared subexpressions are
 * reused through hash-consing and constants fold as in any graph.
 *
 * Conventions where the derivative is undefined, PyTorch's:
 *   abs      the sign, 0 at 0 (torch.abs: grad * sgn)
 *   min/max  a tie splits the gradient evenly between the two operands
 *            (torch.minimum / torch.maximum)
 *   where    the gradient flows to the branch taken
 *   %        1 for the dividend, -floor(a / b) for the divisor
 *            (torch.remainder)
 *   floor, ceil, //, comparisons, integer values: 0
 *   sqrt, log at 0 and exp overflow: what the formula gives (inf, nan)
 * i32 nodes and index arithmetic carry no gradient; a mask_mod never has
 * one.
 */
#ifndef FJG_DERIVATIVE_H
#define FJG_DERIVATIVE_H

#include <stdint.h>

#include "gen/graph.h"

/* A score_mod reading one trainable buffer at one index expression. */
typedef struct fjg_buffer_grad {
  int buffer; /* argument index of the buffer */
  int index;  /* node: the i32 index read */
  int grad;   /* node: d score_mod / d buffer[index], f32 */
} fjg_buffer_grad;

enum { FJG_MAX_BUFFER_GRADS = 16 };

typedef struct fjg_derivative {
  int dscore; /* node: d score_mod / d score, f32 (the constant 1 without a
               * score_mod) */
  int num_buffer_grads;
  fjg_buffer_grad buffer_grads[FJG_MAX_BUFFER_GRADS];
} fjg_derivative;

/*
 * Differentiates g's score_mod with respect to the score and to every read
 * of the f32 buffers whose argument index is set in `trainable` (bit i:
 * argument i). Adds nodes to g. FJ_EINVAL (with err) when a trainable
 * argument is not an f32 buffer, FJ_EUNSUPPORTED when score_mod reads
 * trainable buffers at more than FJG_MAX_BUFFER_GRADS places, FJ_ESPEC when
 * the graph refuses a node (its size limit), FJ_ENOMEM.
 */
fj_status fjg_derive_score(fjg_graph *g, uint64_t trainable, fjg_derivative *out,
                           char *err, size_t errlen);

#endif /* FJG_DERIVATIVE_H */
