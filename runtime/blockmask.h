/*
 * runtime/blockmask.h: what the forward launch needs from a block mask
 * (runtime/blockmask.c implements the public fj_block_mask_* API).
 */
#ifndef FJR_BLOCKMASK_H
#define FJR_BLOCKMASK_H

#include "flexjit.h"
#include "runtime/launch_params.h"

/*
 * Checks that `mask` fits a forward launch of B x Hq heads over Lq x Lk on
 * ctx's device with a kernel of block_m x block_n tiles, and writes its
 * fields of p (bm_*). mask NULL clears them (no block mask). The rules, each
 * failing with FJ_EINVAL and a message naming both values:
 *  - the mask was built on the context's device;
 *  - q_len == Lq and kv_len == Lk, and the offsets it was built for are the
 *    launch's (sz->q_off, sz->kv_off);
 *  - B is 1 or the launch's batch, H is 1 or the launch's query heads;
 *  - block_q is a multiple of block_m (a kernel query tile lies inside one
 *    mask block) and block_kv a multiple of block_n (a mask block is a whole
 *    number of kernel kv tiles).
 */
fj_status fjr_block_mask_bind(fj_context *ctx, const fj_block_mask *mask,
                              const fjr_sizes *sz, int block_m, int block_n,
                              fjr_fwd_params_fixed *p);

/* The same rules for a backward launch, writing the transposed lists (per
 * kv block: q_num_blocks, q_indices, full_q_*) and the lists per query
 * block (kv_num_blocks, ...: the deterministic mode's order) into p's bm_*
 * fields. */
fj_status fjr_block_mask_bind_bwd(fj_context *ctx, const fj_block_mask *mask,
                                  const fjr_sizes *sz, int block_m, int block_n,
                                  fjr_bwd_params_fixed *p);

#endif /* FJR_BLOCKMASK_H */
