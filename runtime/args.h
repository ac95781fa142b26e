/*
 * runtime/args.h: a launch's runtime values, the spec's params and buffers
 * (fj_arg), for every kernel kind: checked and packed into the kernel's
 * fj_user_params, and read on the host (the params' values, the host
 * evaluators' view of a launch). A missing or unknown value fails with
 * FJ_EINVAL, a bad buffer with FJ_ETENSOR (runtime/tensor.h's checks), each
 * message naming the spec and the value.
 */
#ifndef FJR_ARGS_H
#define FJR_ARGS_H

#include <stdint.h>

#include "flexjit.h"
#include "gen/graph.h"
#include "runtime/launch_params.h"

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

#endif /* FJR_ARGS_H */
