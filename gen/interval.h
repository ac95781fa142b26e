/*
 * gen/interval.h: tile classification by interval analysis, and the scalar
 * semantics it shares with the CPU evaluator and constant folding.
 *
 * A tile is the set of pairs (q, kv) with q in [q0, q1] and kv in [kv0, kv1]
 * (inclusive) for one batch index b and query head h. Every i32 node gets a
 * range [lo, hi] that contains each value the node takes on the tile; a
 * result that could leave the int32 range (where the arithmetic wraps) is
 * widened to the full range. A bool node is a range inside [0, 1]: lo == 0
 * means "can be false", hi == 1 means "can be true". f32 values and buffer
 * loads are unknown. The analysis is sound: EMPTY and FULL are only claimed
 * when they hold for every pair of the tile.
 *
 * The per-op rules are written once (FJG_IV_RULES below) in the common subset
 * of C and CUDA C++: interval.c compiles them as static C functions and the
 * CUDA emitter pastes their text into the prologue, so the CPU classifier and
 * the kernel's fj_tile_class cannot disagree.
 */
#ifndef FJG_INTERVAL_H
#define FJG_INTERVAL_H

#include "gen/graph.h"

enum { FJG_TILE_EMPTY = 0, FJG_TILE_PARTIAL = 1, FJG_TILE_FULL = 2 };

/* Classifies the mask on a tile: FJG_TILE_EMPTY (never true), FJG_TILE_FULL
 * (never false) or FJG_TILE_PARTIAL. No mask root -> FULL. Never fails: when
 * it cannot allocate it answers PARTIAL, which is always sound. */
int fjg_tile_class_cpu(const fjg_graph *g, const fjg_env *env, int b, int h,
                       int q0, int q1, int kv0, int kv1);

/* 1 when the mask reads no buffer (LOAD), so tiles can be classified from
 * indices, sizes and params alone (inside the kernel). 1 when no mask. */
int fjg_mask_is_index_only(const fjg_graph *g);

/* The interval rules as CUDA source (static text; the same code interval.c
 * compiles), for the emitter to paste into the prologue. */
const char *fjg_interval_rules_source(void);

/* ---- internals shared inside gen/ ---- */

/* A value of the evaluator: bools and i32 in `i`, f32 in `f`. */
typedef union fjg_value {
  int32_t i;
  float f;
} fjg_value;

/* Applies a non-leaf, non-LOAD op with the evaluator's semantics. `type` is
 * the node's result type and `operand_type` the (common, promoted) type of
 * its numeric operands (the branch type for WHERE). Defined in eval.c; used
 * by the evaluator and by constant folding in graph.c. */
fjg_value fjg_apply_op(fjg_op op, fjg_type type, fjg_type operand_type,
                       fjg_value a, fjg_value b, fjg_value c);

/* The evaluators' inputs of one element: score, b, h, and q and kv as the
 * spec sees them, positions in the whole sequence (row + env's offset).
 * Defined in eval.c; used by the evaluator and the reference's gradients. */
void fjg_set_inputs(const fjg_env *env, fjg_value in[FJG_NUM_INPUTS], float score, int b,
                    int h, int q, int kv);

/* A LOAD of argument `arg` (a buffer of `type`'s elements) at `index`: 0
 * when env has no such buffer or the index is outside [0, len). Defined in
 * eval.c; used by the evaluator and the reference's gradients. */
fjg_value fjg_load_value(const fjg_env *env, int arg, fjg_type type, int32_t index);

/* The interval of op (any non-leaf op on i32 or bool operands; for WHERE
 * a is the condition) from its operands' intervals [x[0], x[1]], by the
 * rules fjg_tile_class_cpu uses; `operand_type` is the type of a. The
 * evaluator's bounded mode uses it where an i32 or bool value is not known
 * exactly. */
void fjg_iv_apply(fjg_op op, fjg_type operand_type, const int64_t a[2],
                  const int64_t b[2], const int64_t c[2], int64_t out[2]);

/* Ids of the nodes reachable from the mask root (which == 0), the score
 * root (which == 1) or the derivative's nodes (which == 2: dscore and every
 * buffer gradient's index and grad, fjg_set_derivative), ascending (so
 * operands come first). *count is 0 when the root is absent. Borrowed;
 * valid until the root is set again. Defined in graph.c. */
const int32_t *fjg_reachable(const fjg_graph *g, int which, int *count);

#endif /* FJG_INTERVAL_H */
