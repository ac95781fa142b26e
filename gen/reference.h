/*
 * gen/reference.h: CPU reference attention computed from a spec's graph.
 *
 * Three computations of the same forward attention, used by tests, the CLI's
 * `run --check` and the GPU tests:
 *  - fjg_reference_dense: float64, one row at a time (scores, mask,
 *    score_mod, max, exp, sum, PV). The ground truth.
 *  - fjg_reference_streaming: float64, the tiled online-softmax recurrence
 *    with the (m, l, u) state, for checking the recurrence itself.
 *  - fjg_reference_lowp: the same computation in the kernel's precision:
 *    inputs rounded to bf16/fp16, scores and softmax in float32, P rounded
 *    to the input dtype before PV (and, by default, before the row sum),
 *    float32 accumulation, O rounded to the input dtype (LSE stays float32).
 *    Its error against float64 sets the tolerance of fjg_ref_check.
 *
 * The backward pass (docs/backward.md) has the same two: the float64
 * reference (fjg_reference_backward) and the computation in the input
 * dtype (fjg_reference_backward_lowp), whose error sets the tolerance of
 * fjg_ref_check_grad.
 *
 * mask_mod and score_mod are evaluated as the kernel evaluates them
 * (gen/eval.h: float32, the kernel's order of operations); where the CPU
 * cannot decide an element the kernel's way it uses its own value, and
 * fjg_reference_uncertain_rows names the rows where that happened.
 *
 * Layouts are contiguous: q [B, Hq, Lq, D], k and v [B, Hkv, Lk, D],
 * o [B, Hq, Lq, D], lse [B, Hq, Lq]. Query head h reads KV head
 * h / (Hq / Hkv). A fully masked row (or one whose every score_mod value is
 * -inf) gives o = 0 and lse = -inf.
 *
 * All functions are thread-safe (the graph and env are only read) and spread
 * rows over several threads themselves.
 */
#ifndef FJG_REFERENCE_H
#define FJG_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "flexjit.h"
#include "gen/graph.h"

typedef struct fjg_ref_problem {
  int B, Hq, Hkv, Lq, Lk, D;
  double scale;       /* 0: 1/sqrt(D) */
  const fjg_graph *g; /* NULL: full attention, no score_mod */
  /* Runtime arguments (params, buffers on the host). NULL when the spec has
   * none. Its sizes[] are ignored: they are filled from the problem. */
  const fjg_env *env;
  int threads; /* 0: one per online CPU */
  /* fjg_reference_lowp only. 0 (default): the softmax row sum adds P in
   * float32 before it is rounded for PV, as the kernels do (so the LSE is
   * the log of the true sum). 1: it adds P as rounded for PV. */
  int lowp_rounded_rowsum;
} fjg_ref_problem;

/* Float64 reference. o and lse must not be NULL. FJ_EINVAL on bad sizes,
 * FJ_ENOMEM when scratch memory or threads cannot be had. */
fj_status fjg_reference_dense(const fjg_ref_problem *p, const double *q,
                              const double *k, const double *v, double *o,
                              double *lse);

/* Float64 tiled online softmax with block_m query rows and block_n keys per
 * tile; agrees with the dense reference to rounding (~1e-13). */
fj_status fjg_reference_streaming(const fjg_ref_problem *p, int block_m,
                                  int block_n, const double *q,
                                  const double *k, const double *v, double *o,
                                  double *lse);

/* The computation in the kernel's input dtype (see the top of this file). */
fj_status fjg_reference_lowp(const fjg_ref_problem *p, fj_dtype dtype,
                             const double *q, const double *k,
                             const double *v, float *o, float *lse);

/*
 * The backward pass in float64: from q, k, v and dout ([B, Hq, Lq, D], the
 * gradient of the loss with respect to O) and the optional dlse ([B, Hq,
 * Lq], with respect to the LSE; NULL: 0), the forward's o and lse (may be
 * NULL when not wanted), dq ([B, Hq, Lq, D]), dk and dv ([B, Hkv, Lk, D],
 * summed over the query heads of a KV head's group) and the gradient of
 * every trainable buffer: dbuf, indexed by argument index (NULL, or NULL
 * entries: not wanted; entries of other arguments are not read), gets
 * p->env->buffer_len[a] values for trainable buffer a (its read outside
 * the buffer has no gradient). The equations of docs/backward.md; a fully
 * masked row has o = 0, lse = -inf and zero gradients. score_mod and its
 * derivative (fjg_graph_derivative, which a graph with a score_mod must
 * have: FJ_EINVAL otherwise) are evaluated in float32 as the kernel
 * computes them (fj_score_mod, fj_score_grad), at the float32 score;
 * everything else in float64. An element with dS' = P (dP - delta) == 0
 * adds nothing, as in fj_score_grad. FJ_EINVAL on bad sizes or a NULL
 * input, FJ_ENOMEM.
 */
fj_status fjg_reference_backward(const fjg_ref_problem *p, const double *q,
                                 const double *k, const double *v,
                                 const double *dout, const double *dlse,
                                 double *o, double *lse, double *dq,
                                 double *dk, double *dv, double *const *dbuf);

/*
 * The same in the kernel's input dtype, as FlashAttention's backward
 * kernels compute it: q, k, v and dout rounded to dtype; O and LSE from
 * fjg_reference_lowp (O in the dtype, LSE float32), delta = dO . O - dLSE,
 * scores, P, dP and dS' in float32; P rounded to the dtype before
 * dv += P dO, dS rounded before dq += dS K and dk += dS Q; float32
 * accumulation, dq, dk, dv rounded to the dtype at the end; buffer
 * gradients added in float32 from the unrounded dS' (as fj_score_grad's
 * atomics). Its error against fjg_reference_backward sets the tolerance
 * of fjg_ref_check_grad. Arguments as above, outputs float.
 */
fj_status fjg_reference_backward_lowp(const fjg_ref_problem *p,
                                      fj_dtype dtype, const double *q,
                                      const double *k, const double *v,
                                      const double *dout, const double *dlse,
                                      float *dq, float *dk, float *dv,
                                      float *const *dbuf);

/* The rows of dk and dv (kv_rows[r] = 1, B * Hkv * Lk bytes, r = (b * Hkv
 * + hk) * Lk + kv) that an uncertain query row (q_rows, from
 * fjg_reference_uncertain_rows) reaches: a key its mask allows or may
 * allow. The kernel's dk and dv there cannot be predicted (nor dq in the
 * uncertain rows, nor any buffer gradient when some row is uncertain).
 * Returns how many, or -1 on failure. */
int64_t fjg_reference_uncertain_kv_rows(const fjg_ref_problem *p,
                                        const uint8_t *q_rows,
                                        uint8_t *kv_rows);

/* The gradient rows that must be exactly 0: q_rows[r] = 1 (B * Hq * Lq
 * bytes, r as below) for a query row the mask allows no key of (its dq),
 * kv_rows[r] = 1 (B * Hkv * Lk bytes, r = (b * Hkv + hk) * Lk + kv) for a
 * key no query of its group attends (its dk and dv); an element the mask
 * may allow (uncertain) counts as allowed. 0, or -1 on failure. */
int fjg_reference_zero_grad_rows(const fjg_ref_problem *p, uint8_t *q_rows,
                                 uint8_t *kv_rows);

/* Marks (rows[r] = 1, B * Hq * Lq bytes, r = (b * Hq + h) * Lq + q) the
 * rows with an uncertain element (gen/eval.h): a mask element the kernel's
 * float32 exp/log/tanh may decide either way, or an allowed element whose
 * score_mod depends on such a decision. The kernel's output there cannot be
 * predicted; fjg_ref_check_rows leaves those rows out. Returns how many
 * rows, or -1 on failure (FJ_ENOMEM). Costs nothing for graphs that reach
 * no such op; otherwise one evaluation of each pair. p->threads as above. */
int64_t fjg_reference_uncertain_rows(const fjg_ref_problem *p, uint8_t *rows);

/* Number of (b, h, q, kv) quadruples the mask allows (B*Hq*Lq*Lk when the
 * graph has no mask). Evaluates each (q, kv) pair once per (b, h) only when
 * the mask depends on b or h. -1 on failure. */
int64_t fjg_reference_count_allowed(const fjg_ref_problem *p);

/* Round-to-nearest-even conversions between float32 and the 16-bit formats
 * (NaN stays NaN, overflow gives inf, fp16 subnormals are kept). */
uint16_t fjg_f32_to_bf16(float x);
float fjg_bf16_to_f32(uint16_t h);
uint16_t fjg_f32_to_f16(float x);
float fjg_f16_to_f32(uint16_t h);
/* x rounded to the nearest value representable in dtype. */
float fjg_round_to_dtype(float x, fj_dtype dtype);

/* The comparison rule of DESIGN.md: a kernel's error against float64 at
 * most FACTOR times the error of the computation in its input dtype, plus
 * a floor; 2 for the forward's outputs, 3 for gradients (as
 * FlashAttention's tests take it). */
#define FJG_CHECK_FACTOR 2.0
#define FJG_CHECK_GRAD_FACTOR 3.0

typedef struct fjg_check_report {
  size_t n;
  double max_err;      /* max |out - ref| over finite reference values */
  double max_err_lowp; /* max |lowp - ref| over the same */
  double tolerance;    /* factor * max_err_lowp + floor */
  double rel_l2;       /* ||out - ref|| / ||ref|| */
  double rel_l2_lowp;  /* ||lowp - ref|| / ||ref|| */
  size_t worst;        /* index of max_err */
  size_t nonfinite;    /* out NaN/Inf where the reference is finite */
  size_t inf_mismatch; /* reference -inf but out is not exactly -inf */
  size_t zero_mismatch; /* reference and lowp exactly 0 (a fully masked
                           row's output) but out is not exactly 0 */
  size_t skipped;      /* values of skipped rows, not compared */
  int pass;
} fjg_check_report;

/* Passes (returns 1, else 0) when max|out - ref| <= FJG_CHECK_FACTOR *
 * max|lowp - ref| + floor and none of the exact conditions fail: NaN never passes, a -inf
 * reference must be matched by exactly -inf (LSE of a fully masked row), and
 * where ref and lowp are both exactly 0 (the output of a fully masked row;
 * random inputs never give an exact 0 otherwise) out must be exactly 0.
 * `rep` may be NULL. */
int fjg_ref_check(const double *ref, const float *lowp, const float *out,
                  size_t n, double floor, fjg_check_report *rep);

/* The same over rows of row_len values, leaving out the rows whose
 * skip_rows byte is set (fjg_reference_uncertain_rows; NULL: none): what
 * the kernel
 * computes there depends on a decision the CPU cannot make its way, so any
 * answer could be right. They are counted in rep->skipped, never a pass by
 * themselves: the rest of the output is checked as usual. */
int fjg_ref_check_rows(const double *ref, const float *lowp, const float *out,
                       size_t n, size_t row_len, const uint8_t *skip_rows,
                       double floor, fjg_check_report *rep);

/* fjg_ref_check_rows for gradients (dq, dk, dv, buffer gradients): the
 * factor is FJG_CHECK_GRAD_FACTOR, and out must be exactly 0 in the rows
 * zero_rows marks (NULL: none): a fully masked query row's dq, a key no
 * query attends (fjg_reference_zero_grad_rows). No other zero is a rule:
 * a gradient that cancels exactly in the reference (the dq of a row with
 * one allowed key, whose dS is 0) comes out of a kernel as rounding. */
int fjg_ref_check_grad(const double *ref, const float *lowp, const float *out,
                       size_t n, size_t row_len, const uint8_t *skip_rows,
                       const uint8_t *zero_rows, double floor, fjg_check_report *rep);

#endif /* FJG_REFERENCE_H */
