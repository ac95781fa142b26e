/*
 * runtime/decode.h: the decode kernel's launch, which fj_attention_forward
 * hands short query lengths to (docs/serving.md), and its scratch.
 */
#ifndef FJR_DECODE_H
#define FJR_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "flexjit.h"
#include "runtime/kernels.h"

/* 1 when a forward launch with these arguments runs the decode kernel:
 * 4-D q (not varlen) of 1 to FJ_DECODE_MAX_Q tokens, head dim 64 or 128. */
int fjr_decode_applies(const fj_forward_args *a);

/* Bytes of scratch the decode launch may use for its split-KV partials (0
 * for shapes it does not take). */
size_t fjr_decode_workspace_size(int64_t B, int64_t Hq, int64_t Lq, int64_t D);

/* The decode kernel's warps, 4 or 8, for a decode over B x Hq query heads
 * (Hkv KV heads) of Lq tokens in row blocks of block_m, from a cache of
 * pages of page_rows rows (0: contiguous), on `sms` multiprocessors: 8
 * where its CTAs fill one wave of one a multiprocessor (90% to all) from a
 * contiguous cache or pages of fewer than 64 rows (the launch takes 4
 * where 8 do not fit the target). */
int fjr_decode_warps(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int block_m, int page_rows,
                     int sms);

/* The launch plan of a decode over B x Hq query heads (Hkv KV heads) of
 * Lq tokens against Lk keys, for a kernel of block_m rows and block_n-row
 * tiles on a GPU of `sms` multiprocessors that each run `per_sm` of its
 * CTAs at once: row blocks a KV group, and splits of the kv tiles (each
 * CTA a run of them, merged by LSE): none when the CTAs cover nearly every
 * multiprocessor already, else chosen to fill whole waves; at most the
 * splits whose partials fj_forward_workspace_size counts. */
void fjr_decode_plan(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int block_m,
                     int block_n, int sms, int per_sm, int64_t *row_blocks, int *splits);

/* The decode launch: pbuf holds the forward's parameter struct as
 * fj_attention_forward checked and filled it (psize bytes, the user
 * params included); the plan (row blocks, splits) is made here, the
 * partials taken from a->workspace (checked by the caller) or the
 * context's pool, and merged by the util kernel when split. */
fj_status fjr_decode_launch(fj_context *ctx, fj_spec *spec, const fj_forward_args *a,
                            fj_dtype dtype, void *pbuf, size_t psize);

/* fj_compile_decode's kernels, each described, *count of them: the
 * 16-row decode kernel, the util kernels, the 32-row decode kernel, then
 * the 16- and 32-row 8-warp kernels where they fit the target
 * (precompile packs them all). */
enum { FJR_DECODE_KERNELS = 5 };
fj_status fjr_compile_decode_all(fj_context *ctx, const fj_spec *spec,
                                 const fj_kernel_options *o,
                                 fj_kernel_info info[FJR_DECODE_KERNELS], int *count);

#endif /* FJR_DECODE_H */
