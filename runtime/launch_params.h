/*
 * runtime/launch_params.h: host mirror of the kernel's parameter struct.
 *
 * Must match templates/common/fj_fwd.cuh member for member up to
 * `user`; the generated fj_user_params (gen/emit_cuda.c, host layout from
 * fjg_user_params_pack) follows at the next 8-byte boundary.
 */
#ifndef FJR_LAUNCH_PARAMS_H
#define FJR_LAUNCH_PARAMS_H

#include <stdint.h>

typedef struct fjr_sizes {
  int32_t B, Hq, Hkv, Lq, Lk;
} fjr_sizes;

typedef struct fjr_fwd_params_fixed {
  uint64_t q, k, v, o, lse;
  int64_t q_sb, q_sh, q_ss;
  int64_t k_sb, k_sh, k_ss;
  int64_t v_sb, v_sh, v_ss;
  int64_t o_sb, o_sh, o_ss;
  int64_t lse_sb, lse_sh;
  fjr_sizes sz;
  int32_t kv_group;
  float scale;
  float scale_log2;
  /* Block mask (runtime/blockmask.c); all zero when none. */
  uint64_t bm_kv_num, bm_kv_idx, bm_full_num, bm_full_idx;
  int32_t bm_b_stride, bm_h_stride;
  int32_t bm_nkv;
  int32_t bm_q_ratio;
  int32_t bm_kv_ratio;
} fjr_fwd_params_fixed;

/* Offset of `user` in the device struct: its first member is a long long. */
#define FJR_FWD_USER_OFFSET \
  ((sizeof(fjr_fwd_params_fixed) + 7u) & ~(size_t)7u)

#endif /* FJR_LAUNCH_PARAMS_H */
