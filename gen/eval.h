/*
 * gen/eval.h: the CPU evaluator of a graph, computing what the kernel
 * computes.
 *
 * f32 values are IEEE single precision, one rounding per node in graph
 * order (no contraction into FMA, no excess precision), which is what the
 * emitted CUDA computes for every f32 node whose value decides something
 * (fjg_decisive_nodes): the emitter writes those with the round-to-nearest
 * intrinsics NVRTC never contracts (__fadd_rn, __fmul_rn, __fdiv_rn, ...).
 * + - * /, sqrt, floor, ceil, abs, neg, comparisons, // and % then agree bit
 * for bit with the kernel. i32 arithmetic wraps; // and % are Lua's floor
 * division and floored modulo with x // 0 = x % 0 = 0 on integers; a buffer
 * index outside [0, len) reads 0.
 *
 * Some ops the CPU cannot reproduce exactly: exp, exp2, log and log2 (CUDA's
 * libdevice versions are within 2, 2, 1 and 1 ulp of the exact result, glibc's
 * differ from them), tanh (the hardware tanh.approx, relative error about
 * 2^-11) and fminf/fmaxf of two zeros of opposite sign (either may come
 * back). A root that reaches one of them is evaluated in bounded mode: each
 * value carries an interval that holds every value the kernel can compute
 * there (the documented error bounds, widened by two ulps), propagated
 * soundly through the later ops (round-to-nearest is monotone, so the
 * endpoints computed with the kernel's own rounding bound its result). A
 * comparison whose operands' intervals overlap is undecided, and a mask
 * element whose value depends on an undecided comparison is UNCERTAIN: the
 * kernel may allow or mask it. Everywhere else the answer is exact.
 *
 * An evaluator is not thread-safe (it holds the scratch values); use one per
 * thread. The graph and env must outlive it and must not change.
 */
#ifndef FJG_EVAL_H
#define FJG_EVAL_H

#include <stdint.h>

#include "gen/graph.h"

/* Outcome of one mask element. */
enum { FJG_MASKED = 0, FJG_ALLOWED = 1, FJG_UNCERTAIN = 2 };

/* A value in bounded mode. bool and i32: the kernel's value is in [lo, hi]
 * (a single value when lo == hi). f32: `exact` means the kernel computes
 * exactly v.f (NaN included); otherwise its value is in [flo, fhi] (either
 * zero sign when the interval holds 0), or NaN when `nan`. `jump` marks an
 * f32 value that depends on an undecided comparison or on a floor/ceil the
 * interval straddles (its error is not small). v is the CPU's own value
 * (glibc's expf, ...): the kernel's when exact, a best guess otherwise. */
typedef struct fjg_aval {
  union {
    int32_t i;
    float f;
  } v;
  int64_t lo, hi;
  float flo, fhi;
  uint8_t exact, nan, jump;
} fjg_aval;

typedef struct fjg_evaluator {
  const fjg_graph *g;
  fjg_env env;
  int bounded[2];   /* per root (0 mask, 1 score): needs bounded mode */
  void *prog[2];    /* per root: its nodes in order, leaves resolved */
  int prog_len[2];  /* 0 when the root is absent */
  void *vals;       /* scratch, one value per node up to the largest root */
  int own;          /* prog and vals are on the heap */
  fjg_aval result;  /* fjg_eval_root's answer in exact mode */
  uint64_t work;    /* node evaluations so far (bounded ones count 4, and
                       each call 3 more) */
} fjg_evaluator;

/* Prepares an evaluator of g with env (NULL: no arguments, sizes 0).
 * FJ_ENOMEM. On failure nothing needs freeing. */
fj_status fjg_evaluator_init(fjg_evaluator *e, const fjg_graph *g,
                             const fjg_env *env);
void fjg_evaluator_free(fjg_evaluator *e);

/* FJG_ALLOWED, FJG_MASKED or FJG_UNCERTAIN (FJG_ALLOWED without a mask). */
int fjg_eval_mask3(fjg_evaluator *e, int b, int h, int q, int kv);

/* The mask's value as the CPU computes it (for an uncertain element, its
 * best guess), and *uncertain (may be NULL) set when the kernel may differ. */
int fjg_eval_mask_guess(fjg_evaluator *e, int b, int h, int q, int kv,
                        int *uncertain);

/* The score_mod's value (score without a score_mod). *uncertain (may be
 * NULL) is set when it depends on a decision the CPU cannot make the
 * kernel's way (see `jump`); transcendental rounding alone does not set it.
 * f32 nodes the emitter lets NVRTC contract (those that decide nothing)
 * may differ from the kernel's by rounding. */
float fjg_eval_score_f32(fjg_evaluator *e, float score, int b, int h, int q,
                         int kv, int *uncertain);

/* The bounded value of a root (which 0: mask, 1: score) at one point; also
 * in exact mode (then exact). Borrowed scratch, valid until the next call.
 * NULL when the root is absent. */
const fjg_aval *fjg_eval_root(fjg_evaluator *e, int which, float score, int b,
                              int h, int q, int kv);

/* What one evaluation of a root adds to `work`. */
int fjg_eval_cost(const fjg_evaluator *e, int which);

/* ---- decisions shared with the emitter ---- */

/* Marks (mark[id] = 1, mark sized fjg_num_nodes) the f32 nodes reachable
 * from root `which` whose value reaches a comparison, a floor, a ceil, or an
 * f32 // or % through f32 arithmetic: a rounding difference there can change
 * a decision, so the kernel computes them exactly like the CPU. Every f32
 * node of a mask is decisive. Other nodes are left as they are. */
void fjg_decisive_nodes(const fjg_graph *g, int which, uint8_t *mark);

/* 1 and *recip when node `divisor` is an f32 constant whose reciprocal is a
 * normal float: a score_mod division by it that decides nothing is computed
 * as a multiplication by *recip (within 1.5 ulp of the division). */
int fjg_div_recip(const fjg_graph *g, int divisor, float *recip);

#endif /* FJG_EVAL_H */
