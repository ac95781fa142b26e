/*
 * runtime/tma.h: TMA tensor maps for the sm90 templates (forward and
 * backward).
 *
 * The sm90 template loads Q, K and V (templates/sm90/producer.cuh, pipeline.cuh)
 * with the bulk tensor copy engine,
 * which reads a CUtensorMap per tensor from a kernel parameter. The kernel
 * takes two parameters, the usual fj_fwd_params and then fj_tma_maps; this
 * file builds the host mirror of the second from the first (pointers,
 * strides and sizes are already packed there), so forward.c can launch
 *
 *   void *params[] = {pbuf, &maps};
 *   cuLaunchKernel(fn, ceil(Lq / cfg.block_m), Hq, B, cfg.threads, 1, 1,
 *                  cfg.smem_bytes, stream, params, NULL);
 *
 * (kernelParams, not CU_LAUNCH_PARAM_BUFFER_POINTER: each parameter is
 * copied with its own size and alignment).
 */
#ifndef FJR_TMA_H
#define FJR_TMA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "flexjit.h"
#include "gen/config.h"
#include "runtime/driver.h"
#include "runtime/launch_params.h"

/* Host mirror of the template's struct fj_tma_maps (640 bytes, 128-byte
 * aligned): four 128-byte CUtensorMaps, q, k, v, o, in that order (offsets
 * 0, 128, 256, 384), then the persistent kernel's work counter (a device
 * address, or 0; offset 512; fjr_tma_maps_build leaves it 0), then o_ok
 * (offset 520): 1 when o holds O's map for the epilogue's TMA store, 0 when
 * O breaks TMA's rules (the kernel then stores O without it). */
typedef struct fjr_tma_maps {
  _Alignas(128) CUtensorMap q;
  CUtensorMap k, v, o;
  uint64_t sched;
  int32_t o_ok;
} fjr_tma_maps;

/* Dimension 0 of the serving layouts' tensors (docs/serving.md), which the
 * packed parameters do not hold: q_rows, packed q's total_q (with
 * cu_seqlens_q); kv_rows, packed k's total_k (with cu_seqlens_k) or the
 * page pools' num_pages (with block_table). Unused otherwise. */
typedef struct fjr_tma_rows {
  int64_t q_rows, kv_rows;
} fjr_tma_rows;

/*
 * Encodes the maps for one launch from the packed parameters `p` (q, k, v
 * pointers, their batch/head/sequence strides in elements, B, Hq, Hkv, Lq,
 * Lk, the serving fields) and the kernel's configuration (dtype, head_dim,
 * block_m, block_n); `rows` (may be NULL without packed or paged tensors)
 * gives the serving layouts' dimension 0. Each tensor is described as 4-D
 * (D, L, H, B), innermost first, with 128-byte swizzle, boxes of
 * 64 x block_m (q), 64 x block_n (k, v) or 64 x 64 (o: one consumer's rows)
 * and zero fill outside the tensor, which is what bounds ragged tiles (a
 * store skips rows outside it). Packed q, k and v are one batch of all
 * rows, (D, total, H, 1); page pools are (D, page_size, Hkv, num_pages)
 * with boxes of the largest power of two that divides page_size, at most
 * block_n rows (a box never crosses a page). O's map is optional: when O's
 * address or strides break TMA's rules, o_ok is 0 and the call still
 * succeeds; for a kernel that never stores through it (the persistent
 * kernel with one Q buffer) and for packed O (a box would write into the
 * next sequence) it is not encoded and o_ok is 0.
 * Pure host work (no context, no device memory); cheap enough per launch.
 * Fails with FJ_EINVAL when cfg->uses_tma is 0, when a packed or paged
 * tensor comes without its rows, or the strides or addresses break TMA's
 * rules (16-byte aligned base and strides, strides < 2^40), or with the
 * driver's error text (FJ_ECUDA) when encoding fails; err gets why.
 */
fj_status fjr_tma_maps_build(const fjr_driver *drv, const fjg_config *cfg,
                             const fjr_fwd_params_fixed *p, const fjr_tma_rows *rows,
                             fjr_tma_maps *out, char *err, size_t errlen);

/* Host mirror of the sm90 backward's struct fj_bwd_maps (templates/sm90/
 * bwd_config.cuh; 768 bytes, 128-byte aligned): q, k, v, dout, dk, dv over
 * the 4-D tensors (D, L, H, B) of the element type (packed ones as (D,
 * total, H, 1)), 128-byte swizzle, boxes of 64 x block_m (q, dout), 64 x
 * block_n (k, v) and 64 x 64 (dk, dv: one consumer's rows, stored). The
 * kernel adds to the fp32 scratch dq_accum by bulk copies, with no map. */
typedef struct fjr_tma_bwd_maps {
  _Alignas(128) CUtensorMap q;
  CUtensorMap k, v, dout, dk, dv;
} fjr_tma_bwd_maps;

/*
 * Encodes the backward's maps from its packed parameters (pointers,
 * strides and sizes, dq_accum already placed in the scratch) and its
 * configuration; `rows` as fjr_tma_maps_build's (the packed q-side and
 * k-side tensors' rows; may be NULL without packed tensors). Fails as
 * fjr_tma_maps_build does; err gets why.
 */
fj_status fjr_tma_bwd_maps_build(const fjr_driver *drv, const fjg_config *cfg,
                                 const fjr_bwd_params_fixed *p, const fjr_tma_rows *rows,
                                 fjr_tma_bwd_maps *out, char *err, size_t errlen);

#endif /* FJR_TMA_H */
