/*
 * runtime/forward.h: the forward launch path's internals that the CLI and the
 * benchmarks share with runtime/forward.c (not part of the public API).
 */
#ifndef FJR_FORWARD_H
#define FJR_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "flexjit.h"
#include "gen/config.h"
#include "gen/graph.h"
#include "runtime/launch_params.h"

/* The cubin of a spec's forward kernel (compiled, or found in the cache, as
 * fj_compile_forward does), borrowed from the spec until the kernel is
 * loaded; FJ_EINVAL once it is (the driver holds it then). For `flexjit
 * compile --emit-cubin`. */
fj_status fjr_forward_cubin(fj_context *ctx, const fj_spec *spec,
                            const fj_kernel_options *opts, const void **data,
                            size_t *size);

/* The checks of a forward launch's tensors and serving fields (every
 * layout: BHSD/BSHD, packed varlen, paged KV; runtime/serving.c), each
 * failure naming the tensor and the rule; fills the fixed part of the
 * parameter struct (pointers, strides, sizes, scale, serving fields; not
 * the block mask) and *dtype, the inputs' element type. With packed q,
 * B = len(cu_seqlens_q) - 1 and Lq = max_seqlen_q; with packed k and v,
 * Lk = max_seqlen_k; with paged KV, Lk = max_pages * page_size. Touches no
 * device. The forward kernel's and the decode kernel's launches share it. */
fj_status fjr_forward_check(fj_context *ctx, const fj_forward_args *args, fj_dtype *dtype,
                            fjr_fwd_params_fixed *p);

/* The fj_kernel_options.long_rows that fj_attention_forward(ctx, spec, a)
 * takes its kernel with: whether the long-row variant may serve the launch
 * (not with a score_mod, a block mask, the serving layouts, Skip Softmax or
 * the environment's kernel settings) and its rows are long
 * (FJ_LONG_ROW_KEYS keys on average), for `flexjit run` to compile and
 * report the kernel the launch runs; 0 for input the launch would refuse
 * (the error is then in ctx). */
int fjr_forward_long_rows(fj_context *ctx, const fj_spec *spec, const fj_forward_args *a);

/* The keys a query row of g's mask is allowed on average, as a launch of
 * Lq x Lk under env estimates it to choose the long-row variant
 * (FJ_LONG_ROW_KEYS): an upper bound from the interval analysis of a few
 * query blocks of batch 0, head 0 against kv chunks of about Lk / 32 keys.
 * Host only. */
int64_t fjr_mean_row_keys(const fjg_graph *g, const fjg_env *env, int32_t Lq, int32_t Lk);

#endif /* FJR_FORWARD_H */
