/*
 * runtime/launch_params.h: host mirrors of the kernels' parameter structs.
 *
 * fjr_fwd_params_fixed must match templates/common/fj_fwd.cuh member for
 * member up to `user`; the generated fj_user_params (gen/emit_cuda.c, host
 * layout from fjg_user_params_pack) follows at the next 8-byte boundary.
 * fjr_bwd_params_fixed mirrors templates/common/fj_bwd.cuh the same way.
 */
#ifndef FJR_LAUNCH_PARAMS_H
#define FJR_LAUNCH_PARAMS_H

#include <stddef.h>
#include <stdint.h>

typedef struct fjr_sizes {
  int32_t B, Hq, Hkv, Lq, Lk;
  int32_t q_off, kv_off;
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
  /* Serving layouts (docs/serving.md); zero when off. */
  uint64_t seqlens_k, block_table, cu_seqlens_q, cu_seqlens_k;
  int64_t bt_stride;
  int32_t page_size;
  float skip_log2;
  /* The decode kernel's split-KV partials; zero when unsplit. */
  uint64_t part_o, part_lse;
  int32_t num_splits;
  /* The sm90 persistent scheduler's tail query blocks a head (forward.c). */
  int32_t tail_rows;
} fjr_fwd_params_fixed;

/* Offset of `user` in the device struct: its first member is a long long. */
#define FJR_FWD_USER_OFFSET \
  ((sizeof(fjr_fwd_params_fixed) + 7u) & ~(size_t)7u)
/* The layout templates/common/fj_fwd.cuh's fj_fwd_params has: the
 * block-mask fields right after scale_log2, tail_rows last. */
_Static_assert(offsetof(fjr_fwd_params_fixed, bm_kv_num) == 192,
               "fjr_fwd_params_fixed layout: block-mask fields moved");
_Static_assert(offsetof(fjr_fwd_params_fixed, tail_rows) == 316 &&
                   sizeof(fjr_fwd_params_fixed) == 320,
               "fjr_fwd_params_fixed layout: fixed part changed");

/* Host mirror of templates/common/fj_bwd.cuh's fj_bwd_params up to `user`
 * (docs/backward.md); the generated fj_user_params follows at the next
 * 8-byte boundary (FJR_BWD_USER_OFFSET), then fj_user_grads at the next
 * 8-byte boundary after it. */
typedef struct fjr_bwd_params_fixed {
  uint64_t q, k, v, o, dout;
  uint64_t lse, dlse; /* dlse 0: none */
  uint64_t delta;     /* scratch: fp32 [B * Hq][acc_sh] */
  uint64_t dq_accum;  /* scratch: fp32 [B * Hq][acc_sh][D], 16-byte aligned */
  uint64_t dq, dk, dv;
  int64_t q_sb, q_sh, q_ss;
  int64_t k_sb, k_sh, k_ss;
  int64_t v_sb, v_sh, v_ss;
  int64_t o_sb, o_sh, o_ss;
  int64_t do_sb, do_sh, do_ss;
  int64_t dq_sb, dq_sh, dq_ss;
  int64_t dk_sb, dk_sh, dk_ss;
  int64_t dv_sb, dv_sh, dv_ss;
  int64_t lse_sb, lse_sh;
  int64_t dlse_sb, dlse_sh;
  fjr_sizes sz;
  int32_t kv_group;
  float scale;
  float scale_log2;
  /* Block mask's transposed lists (q_num_blocks, q_indices,
   * full_q_num_blocks, full_q_indices); all zero when none. */
  uint64_t bm_q_num, bm_q_idx, bm_full_q_num, bm_full_q_idx;
  int32_t bm_b_stride, bm_h_stride;
  int32_t bm_nq;
  int32_t bm_q_ratio;  /* block_q / the config's block_m */
  int32_t bm_kv_ratio; /* block_kv / the config's block_n */
  /* The deterministic mode's semaphores (scratch: int32 [B][Hq][query
   * tiles]) and the block mask's lists per query block (kv_num_blocks,
   * kv_indices, full_kv_num_blocks, full_kv_indices; all zero when none). */
  uint64_t dq_sem;
  uint64_t bm_kv_num, bm_kv_idx, bm_full_kv_num, bm_full_kv_idx;
  int32_t bm_qb_stride, bm_qh_stride;
  int32_t bm_nkv;
  /* The persistent kernel's kv heads a group of its tile order
   * (fjr_bwd_kv_head_group). */
  int32_t kv_head_group;
  /* Packed batches (docs/serving.md): int32 [B + 1] device arrays, 0 when
   * off; the scratch's rows a query head (Lq, or total_q +
   * FJG_BWD_SEQ_PAD * B packed; B = 1 for delta and dq_accum then). */
  uint64_t cu_seqlens_q, cu_seqlens_k;
  int64_t acc_sh;
  /* The persistent kernel's takes and its last round split
   * (fjr_bwd_tail_split): scratch fp32 [tail_tiles][2][2][64][D] (0 when
   * off), the takes, the first take of a split tile, the split tiles and
   * pieces a tile (0 and 0 when off). */
  uint64_t dkv_accum;
  int32_t takes, tail_first, tail_tiles, tail_pieces;
} fjr_bwd_params_fixed;

/* The offsets templates/common/fj_bwd.cuh asserts for the device struct. */
_Static_assert(offsetof(fjr_bwd_params_fixed, lse) == 40, "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, q_sb) == 96, "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, dlse_sh) == 312, "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, sz) == 320, "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, scale_log2) == 356,
               "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, bm_q_num) == 360,
               "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, bm_kv_ratio) == 408,
               "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, dq_sem) == 416,
               "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, bm_qb_stride) == 456,
               "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, bm_nkv) == 464,
               "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, kv_head_group) == 468,
               "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, cu_seqlens_q) == 472,
               "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, acc_sh) == 488,
               "fjr_bwd_params_fixed layout");
_Static_assert(offsetof(fjr_bwd_params_fixed, tail_pieces) == 516,
               "fjr_bwd_params_fixed layout");

/* Offset of `user` in the device struct: its first member is a long long. */
#define FJR_BWD_USER_OFFSET \
  ((sizeof(fjr_bwd_params_fixed) + 7u) & ~(size_t)7u)
_Static_assert(FJR_BWD_USER_OFFSET == 520, "fjr_bwd_params_fixed layout");

#endif /* FJR_LAUNCH_PARAMS_H */
