/*
 * runtime/backward.h: the backward launch path's internals that tests
 * share with runtime/backward.c (not part of the public API).
 */
#ifndef FJR_BACKWARD_H
#define FJR_BACKWARD_H

#include "flexjit.h"
#include "runtime/launch_params.h"

/* The checks of a backward launch's tensors, scale and packed-batch fields
 * (docs/backward.md, docs/serving.md), each failure naming the tensor or
 * field and the rule: tensors [B, H, S, D], or packed [total, H, D] with
 * lse and dlse [Hq, total_q] (cu_seqlens_q: q, o, dout, dq; cu_seqlens_k:
 * k, v, dk, dv; the forward's rules for which fields go together,
 * runtime/serving.c); a block mask is refused with a packed batch. Fills
 * the fixed part of the parameter struct (pointers, strides, sizes, scale,
 * cu_seqlens, acc_sh; not the scratch nor the block mask) and *dtype, the
 * inputs' element type. With packed q, B = len(cu_seqlens_q) - 1 and Lq =
 * max_seqlen_q; with packed k and v, Lk = max_seqlen_k. Touches no
 * device. */
fj_status fjr_backward_check(fj_context *ctx, const fj_backward_args *args, fj_dtype *dtype,
                             fjr_bwd_params_fixed *p);

#endif /* FJR_BACKWARD_H */
