/*
 * runtime/tensor.h: the checks every tensor and runtime value passes before
 * a launch, in one place for every kernel kind.
 *
 * Tensors are DLPack DLTensors on the context's CUDA device. Each check
 * fails with FJ_ETENSOR (FJ_EINVAL for a missing or unknown runtime value)
 * and a message that names the tensor (`what`) and the rule it breaks.
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

/* The runtime values of a launch: args matched by name with the graph's
 * param() and buffer() declarations (every declaration needs a value, every
 * value a declaration; buffers are non-empty, contiguous, 4-byte aligned
 * 1-D tensors of the declared element type), packed as the generated
 * struct fj_user_params into dst (fjg_user_params_size(g) bytes). `who`
 * names the spec in messages. */
fj_status fjr_bind_args(fj_context *ctx, const char *who, const fjg_graph *g,
                        const fj_arg *args, int num_args, void *dst);

/* What fjr_bind_args and the other readers of a launch's args share: the
 * args array itself is sound and every value names a declaration (else the
 * error, naming spec `who`). */
fj_status fjr_args_declared(fj_context *ctx, const char *who, const fjg_graph *g,
                            const fj_arg *args, int num_args);
/* The value args gives for `name` (the last of that name), or NULL. */
const fj_arg *fjr_arg_given(const fj_arg *args, int num_args, const char *name);
/* The values args gives the spec's params, by argument index, into i32s and
 * f32s (fjg_num_args(g) entries each; 0 for buffers and for the other
 * type): what the host's evaluators take (fjg_env). Returns the index of
 * the first param without a value, or -1 when every one has one. */
int fjr_param_values(const fjg_graph *g, const fj_arg *args, int num_args, int32_t *i32s,
                     float *f32s);
/* The host evaluators' view of a launch (fjg_env): its sizes and offsets
 * from sz, its params' values (i32s, f32s: fjr_param_values's); no
 * buffers. */
fjg_env fjr_launch_env(const fjr_sizes *sz, const int32_t *i32s, const float *f32s);

#endif /* FJR_TENSOR_H */
