/*
 * runtime/tensor.h: the checks every tensor passes before a launch, in one
 * place for every kernel kind (a launch's runtime values: runtime/args.h).
 *
 * Tensors are DLPack DLTensors on the context's CUDA device. Each check
 * fails with FJ_ETENSOR and a message that names the tensor (`what`) and
 * the rule it breaks.
 */
#ifndef FJR_TENSOR_H
#define FJR_TENSOR_H

#include <stdint.h>

#include "flexjit.h"
#include "gen/graph.h"
#include "runtime/launch_params.h"

/* The data address: data + byte_offset. */
uint64_t fjr_tensor_ptr(const DLTensor *t);

/* 1 when t's dtype is (code, bits) with one lane. */
int fjr_tensor_is(const DLTensor *t, uint8_t code, uint8_t bits);

/* "bfloat16", "float32", "int32", ... into buf. */
const char *fjr_dtype_text(DLDataType t, char *buf, size_t n);

/* Checks rank, device (the context's), dtype, a non-NULL data pointer,
 * sizes >= 1, non-negative strides and a contiguous last dimension, and
 * returns the element strides (computed when t->strides is NULL). */
fj_status fjr_tensor_check(fj_context *ctx, const char *what, const DLTensor *t,
                           int ndim, DLDataType dtype, int64_t *strides);

/* An attention launch's q: an ndim-D tensor (4: [B, Hq, Lq, D]; 3: packed
 * [total_q, Hq, D]) of bfloat16 or float16, whose element type goes to
 * *dtype and *dl (what k, v, o, ... must match); FJ_ETENSOR naming what is
 * wrong otherwise. */
fj_status fjr_tensor_query(fj_context *ctx, const DLTensor *q, int ndim, fj_dtype *dtype,
                           DLDataType *dl);

/* Checks that t's shape is `want` (t->ndim entries). */
fj_status fjr_tensor_check_shape(fj_context *ctx, const char *what,
                                 const DLTensor *t, const int64_t *want);

/* What 16-byte vector loads and TMA need: a 16-byte aligned address and
 * strides (of dimensions larger than 1, but the last) in multiples of 8
 * elements. */
fj_status fjr_tensor_check_aligned16(fj_context *ctx, const char *what,
                                     const DLTensor *t, const int64_t *strides);

#endif /* FJR_TENSOR_H */
