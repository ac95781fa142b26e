// templates/sm90/fwd.cuh: the forward kernel's entry point (contract:
// config.cuh). The kernel body is written against the scheduler interface
// (scheduler.cuh); FJ_PERSISTENT picks the scheduler.
#pragma once

// One producer warpgroup with few registers, FJH_NC consumer warpgroups
// with many (setmaxnreg moves them within the CTA's pool).
template <class Sched>
__device__ __forceinline__ void fjh_forward(const fj_fwd_params &p, const fj_tma_maps &maps,
                                            unsigned char *smem) {
  typename Sched::cta x = Sched::start(p, maps, smem);
  if (Sched::idle(x)) return;
  // The role must be warp-uniform for setmaxnreg (.aligned): take lane 0's.
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
  if (wg == 0) {
    fjh_setmaxnreg_dec<FJ_PRODUCER_REGS>();
    Sched::produce(p, maps, smem, x);
  } else {
    fjh_setmaxnreg_inc<FJ_CONSUMER_REGS>();
    Sched::consume(p, maps, smem, x, wg - 1);
  }
}

using fjh_scheduler =
    fjh_type_if<FJ_PERSISTENT, fjh_sched_persistent, fjh_sched_one_tile>::type;

extern "C" __global__ void __launch_bounds__(FJH_THREADS, 1)
fj_attention_fwd(const __grid_constant__ fj_fwd_params p,
                 const __grid_constant__ fj_tma_maps maps) {
  extern __shared__ __align__(1024) unsigned char fjh_smem[];
  fjh_forward<fjh_scheduler>(p, maps, fjh_smem);
}
