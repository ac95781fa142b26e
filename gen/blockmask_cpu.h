/*
 * gen/blockmask_cpu.h: the block mask of a graph, built on the CPU.
 *
 * The same arrays, in the same layout and order, as the GPU builder
 * (gen/emit_blockmask.c, runtime/blockmask.c) writes; tests compare the two
 * exactly, and `flexjit mask` draws masks from it without a GPU. See
 * include/flexjit.h (fj_block_mask_build) for the layout:
 *   kv_num [B][H][nq], kv_idx [B][H][nq][nkv]        PARTIAL blocks per row
 *   full_kv_num, full_kv_idx                          FULL blocks per row
 *   q_num [B][H][nkv], q_idx [B][H][nkv][nq]          PARTIAL blocks per column
 *   full_q_num, full_q_idx                            FULL blocks per column
 *   cls [B][H][nq][nkv]                               FJG_TILE_* of each block
 * Index lists are ascending; entries past a list's count are 0.
 *
 * A block's class is exact: EMPTY when the mask is false on every in-range
 * pair (q < Lq, kv < Lk) of it, FULL when true on every one. The interval
 * classifier decides what it can; the other blocks are evaluated element by
 * element until both values have been seen. A pair the CPU cannot decide
 * the kernel's way (uncertain, gen/eval.h) makes its block PARTIAL, where
 * the kernel evaluates its own mask: the GPU builder may call such a block
 * FULL or EMPTY, the CPU builder never does.
 */
#ifndef FJG_BLOCKMASK_CPU_H
#define FJG_BLOCKMASK_CPU_H

#include <stdint.h>

#include "gen/graph.h"

typedef struct fjg_block_mask_host {
  int B, H, q_len, kv_len, block_q, block_kv;
  int nq, nkv;
  int32_t *kv_num, *kv_idx, *full_kv_num, *full_kv_idx;
  int32_t *q_num, *q_idx, *full_q_num, *full_q_idx;
  uint8_t *cls;
} fjg_block_mask_host;

/* Element counts of the eight arrays in fj_block_mask_array order
 * (kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num,
 * full_q_idx) for the given extents. */
void fjg_block_mask_counts(int B, int H, int nq, int nkv, size_t counts[8]);

/* The eight arrays of m in the same order (borrowed). */
void fjg_block_mask_arrays(const fjg_block_mask_host *m, int32_t *arrays[8]);

/*
 * Builds the block mask of g's mask_mod for B (1 = broadcast) batch entries
 * and H (1 = broadcast) heads over q_len x kv_len in blocks of block_q x
 * block_kv (each >= 1). env supplies params and buffers; its sizes are
 * ignored and set to (B, H, H, q_len, kv_len). The mask is evaluated at
 * b = 0 / h = 0 where broadcast. FJ_EINVAL on bad sizes, FJ_ENOMEM.
 * On failure *out holds nothing to free.
 */
fj_status fjg_block_mask_cpu_build(const fjg_graph *g, const fjg_env *env,
                                   int B, int H, int q_len, int kv_len,
                                   int block_q, int block_kv,
                                   fjg_block_mask_host *out);

/* Class of one block by evaluating every in-range element (no interval
 * analysis, no early exit): the brute force the tests compare with. A block
 * with an uncertain pair (gen/eval.h) is PARTIAL. */
int fjg_block_class_brute(const fjg_graph *g, const fjg_env *env, int b,
                          int h, int q0, int q1, int kv0, int kv1);

/* Flag on a census class: the block holds uncertain pairs (so PARTIAL). */
enum { FJG_BLOCK_UNCERTAIN = 4 };

typedef struct fjg_census {
  int64_t allowed;   /* pairs the kernel allows */
  int64_t uncertain; /* pairs it may allow or mask (gen/eval.h) */
  uint64_t work;     /* node evaluations spent (fjg_evaluator.work) */
} fjg_census;

/*
 * What `flexjit mask` prints, for one batch entry b and head h over
 * q_len x kv_len: the number of allowed and uncertain pairs, counted
 * exactly, and (cls not NULL: nq x nkv bytes) the class of each block_q x
 * block_kv block, FJG_TILE_* | FJG_BLOCK_UNCERTAIN. Tiles the interval
 * classifier decides are counted whole; the others are halved down to 64
 * pairs and evaluated. env's sizes are used as given. Stops with
 * FJ_EUNSUPPORTED when it would spend more than `budget` node evaluations
 * (*out then holds what was counted); FJ_EINVAL, FJ_ENOMEM.
 */
fj_status fjg_mask_census(const fjg_graph *g, const fjg_env *env, int b,
                          int h, int q_len, int kv_len, int block_q,
                          int block_kv, uint64_t budget, uint8_t *cls,
                          fjg_census *out);

/* Frees the arrays; a zeroed or freed struct is a no-op. */
void fjg_block_mask_host_free(fjg_block_mask_host *m);

#endif /* FJG_BLOCKMASK_CPU_H */
