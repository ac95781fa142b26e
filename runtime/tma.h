/*
 * runtime/tma.h: TMA tensor maps for the sm90 forward template.
 *
 * templates/sm90/fwd.cuh loads Q, K and V with the bulk tensor copy engine,
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

#include <cuda.h>

#include "flexjit.h"
#include "gen/config.h"
#include "runtime/driver.h"
#include "runtime/launch_params.h"

/* Host mirror of the template's struct fj_tma_maps: three 128-byte
 * CUtensorMaps, q, k, v, in that order (offsets 0, 128, 256), then the
 * persistent kernel's work counter (a device address, or 0; offset 384;
 * fjr_tma_maps_build leaves it 0). */
typedef struct fjr_tma_maps {
  CUtensorMap q, k, v;
  uint64_t sched;
} fjr_tma_maps;

/*
 * Encodes the maps for one launch from the packed parameters `p` (q, k, v
 * pointers, their batch/head/sequence strides in elements, B, Hq, Hkv, Lq,
 * Lk) and the kernel's configuration (dtype, head_dim, block_m, block_n).
 * Each tensor is described as 4-D (D, L, H, B), innermost first, with
 * 128-byte swizzle, boxes of 64 x block_m (q) or 64 x block_n (k, v) and
 * zero fill outside the tensor, which is what bounds ragged tiles.
 * Pure host work (no context, no device memory); cheap enough per launch.
 * Fails with FJ_EINVAL when cfg->uses_tma is 0 or the strides or addresses
 * break TMA's rules (16-byte aligned base and strides, strides < 2^40), or
 * with the driver's error text (FJ_ECUDA) when encoding fails; err gets why.
 */
fj_status fjr_tma_maps_build(const fjr_driver *drv, const fjg_config *cfg,
                             const fjr_fwd_params_fixed *p, fjr_tma_maps *out,
                             char *err, size_t errlen);

#endif /* FJR_TMA_H */
