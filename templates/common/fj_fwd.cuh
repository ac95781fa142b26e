// templates/common/fj_fwd.cuh: the forward kernel's parameter, which both
// forward templates (sm80, sm90) take first, and the check that the
// generator defined the configuration macros both need. Needs fj_sizes
// (fj_common.cuh) and the generated fj_user_params.
//
// The host mirror is runtime/launch_params.h (struct fjr_fwd_params_fixed):
// every field up to `user` must match it member for member. The kernel is
//   extern "C" __global__ void fj_attention_fwd(const __grid_constant__ fj_fwd_params p)
// (sm90 adds a second parameter) launched on grid (ceil(Lq / FJ_BLOCK_M), Hq,
// B) with FJ_NUM_WARPS * 32 threads and the dynamic shared memory gen/config.c
// computes.
#pragma once

#if !defined(FJ_HEAD_DIM) || !defined(FJ_BLOCK_M) || !defined(FJ_BLOCK_N) || \
    !defined(FJ_NUM_WARPS) || !defined(FJ_NUM_STAGES) ||                      \
    !defined(FJ_HAS_MASK) || !defined(FJ_HAS_SCORE_MOD)
#error "forward kernel: a configuration macro from the generator is missing"
#endif
#if defined(FJ_DTYPE_BF16) == defined(FJ_DTYPE_F16)
#error "forward kernel: define exactly one of FJ_DTYPE_BF16, FJ_DTYPE_F16"
#endif

struct fj_fwd_params {
  const void *q;
  const void *k;
  const void *v;
  void *o;
  float *lse;  // may be null
  // Strides in elements for batch, head and sequence; the head dim is contiguous.
  long long q_sb, q_sh, q_ss;
  long long k_sb, k_sh, k_ss;
  long long v_sb, v_sh, v_ss;
  long long o_sb, o_sh, o_ss;
  long long lse_sb, lse_sh;  // lse's sequence stride is 1
  fj_sizes sz;
  int kv_group;      // Hq / Hkv
  float scale;       // multiplies q.k
  float scale_log2;  // scale * log2(e)
  // Block mask (runtime/blockmask.c), or bm_kv_num == nullptr: none, and
  // tiles are classified by fj_tile_class. Count arrays are indexed by
  // b * bm_b_stride + h * bm_h_stride + m_block / bm_q_ratio (strides 0
  // broadcast); index arrays hold bm_nkv entries per count. A listed block
  // covers bm_kv_ratio kv tiles of FJ_BLOCK_N.
  const int *bm_kv_num;    // PARTIAL kv blocks per query block
  const int *bm_kv_idx;
  const int *bm_full_num;  // FULL kv blocks per query block
  const int *bm_full_idx;
  int bm_b_stride, bm_h_stride;
  int bm_nkv;
  int bm_q_ratio;   // block_q / FJ_BLOCK_M
  int bm_kv_ratio;  // block_kv / FJ_BLOCK_N
  // Serving layouts (docs/serving.md); each null or 0 when off.
  const int *seqlens_k;     // [B]: sequence b's kv length (else sz.Lk)
  const int *block_table;   // [B][bt_stride]: kv rows [j * page_size, (j + 1) *
                            // page_size) of sequence b are pool page
                            // block_table[b * bt_stride + j] (k_sb, v_sb: the
                            // page stride; k_ss, v_ss: the row stride)
  const int *cu_seqlens_q;  // [B + 1]: sequence b's q / o rows start at row
                            // cu_seqlens_q[b] (q_sb, o_sb unused); its Lq is
                            // the difference; lse is [Hq][total_q]
  const int *cu_seqlens_k;  // [B + 1]: the same for k and v
  long long bt_stride;
  int page_size;
  // Skip Softmax: log2 of the threshold lambda (< 0), or 0: off. A tile is
  // skipped when every row's tile max (scaled, log2 units) lies more than
  // -skip_log2 below its running max.
  float skip_log2;
  // The decode kernel's split-KV partial results (runtime/decode.c), null
  // when it writes o and lse itself: fp32 [num_splits][B][Hq][Lq][D] and
  // [num_splits][B][Hq][Lq].
  float *part_o;
  float *part_lse;
  int num_splits;
  // The persistent scheduler's tail: the first tail_rows query blocks of
  // every head come last in a masked kernel's order (sm90/scheduler.cuh;
  // the host's rule, runtime/forward.c's tail_rows).
  int tail_rows;
  fj_user_params user;
};
// The host fills the fixed part through its mirror, fjr_fwd_params_fixed
// (runtime/launch_params.h: 320 bytes, tail_rows last, asserted there).

// FJ_VARLEN (0 unless the generator defines it 1; part of the key): the
// variant of the forward kernels for the serving layouts (seqlens_k, packed
// batches, paged KV: runtime/forward.c launches it when one is used). The
// kernels read those arrays through these accessors, null in the other
// units, so that every branch on them folds away and the kernels without
// serving layouts are what they are without this code.
#ifndef FJ_VARLEN
#define FJ_VARLEN 0
#endif
// FJ_SKIP (0 unless the generator defines it 1; part of the key): the Skip
// Softmax variant (docs/serving.md), launched when skip_softmax_threshold is
// set; it reads p.skip_log2.
#ifndef FJ_SKIP
#define FJ_SKIP 0
#endif
__device__ __forceinline__ const int *fj_seqlens_k(const fj_fwd_params &p) {
  return FJ_VARLEN ? p.seqlens_k : nullptr;
}
__device__ __forceinline__ const int *fj_block_table(const fj_fwd_params &p) {
  return FJ_VARLEN ? p.block_table : nullptr;
}
__device__ __forceinline__ const int *fj_cu_seqlens_q(const fj_fwd_params &p) {
  return FJ_VARLEN ? p.cu_seqlens_q : nullptr;
}
__device__ __forceinline__ const int *fj_cu_seqlens_k(const fj_fwd_params &p) {
  return FJ_VARLEN ? p.cu_seqlens_k : nullptr;
}

// Sequence b of a launch under the serving layouts: p.sz with Lq and Lk set
// to the sequence's own (what fj_mask, fj_score_mod and fj_tile_class see,
// and the bounds of its rows), and its first rows in packed q / o / lse and
// k / v (0 unless packed). Values read from the device arrays are clamped:
// Lq to [0, p.sz.Lq] (max_seqlen_q), Lk to [0, p.sz.Lk]; so no query row
// past max_seqlen_q is computed and no kv position at or past Lk is read.
// Without FJ_VARLEN this is p.sz, constants.
struct fj_seq {
  fj_sizes sz;
  int q_row0, k_row0;
};
__device__ __forceinline__ fj_seq fj_seq_of(const fj_fwd_params &p, int b) {
  fj_seq s{p.sz, 0, 0};
  if (fj_cu_seqlens_q(p) != nullptr) {
    const int a = __ldg(p.cu_seqlens_q + b), e = __ldg(p.cu_seqlens_q + b + 1);
    s.q_row0 = a;
    s.sz.Lq = max(0, min(e - a, p.sz.Lq));
  }
  if (fj_cu_seqlens_k(p) != nullptr) {
    const int a = __ldg(p.cu_seqlens_k + b), e = __ldg(p.cu_seqlens_k + b + 1);
    s.k_row0 = a;
    s.sz.Lk = max(0, min(e - a, p.sz.Lk));
  } else if (fj_seqlens_k(p) != nullptr) {
    s.sz.Lk = max(0, min(__ldg(p.seqlens_k + b), p.sz.Lk));
  }
  return s;
}
