// templates/common/fj_bwd.cuh: the backward kernels' parameter, which all
// three entry points of a backward translation unit take, and the check that
// the generator defined the configuration macros. Needs fj_sizes
// (fj_common.cuh) and the generated fj_user_params and fj_user_grads.
//
// The host mirror is runtime/launch_params.h (struct fjr_bwd_params_fixed):
// every field up to `user` must match it member for member (asserted here
// through the struct's size, there field by field). The generated
// fj_user_params follows at the next 8-byte boundary, fj_user_grads at the
// next 8-byte boundary after it. The kernels (docs/backward.md):
//   extern "C" __global__ void fj_attention_bwd_pre(const __grid_constant__ fj_bwd_params p)
//   extern "C" __global__ void fj_attention_bwd(const __grid_constant__ fj_bwd_params p)
//   extern "C" __global__ void fj_attention_bwd_post(const __grid_constant__ fj_bwd_params p)
// pre and post (common/bwd_rows.cuh) on grid (ceil(Lq / FJB_ROW_BLOCK), Hq,
// B) with FJB_ROW_THREADS threads and no dynamic shared memory; the main
// kernel as its template's config part says.
//
// FJ_DETERMINISTIC (0 unless the generator defines it 1; part of the
// kernel's source and key): the deterministic variant, which adds each kv
// tile's dQ part to a query tile in a fixed order (common/bwd_order.cuh).
#pragma once

#ifndef FJ_DETERMINISTIC
#define FJ_DETERMINISTIC 0
#endif
// FJ_VARLEN (0 unless the generator defines it 1; part of the key): the
// packed-batch variant, launched with cu_seqlens_q, which finds each
// sequence's sizes and rows at run time (fjb_seq_of); without it they are
// the launch's, constants of the parameter.
#ifndef FJ_VARLEN
#define FJ_VARLEN 0
#endif
// FJ_PERSISTENT (0 unless the generator defines it 1; part of the key):
// the sm90 template's persistent main kernel (sm90/bwd_config.cuh), whose
// tile counter is dq_sem[0].
#ifndef FJ_PERSISTENT
#define FJ_PERSISTENT 0
#endif
// FJ_SCORE_GRAD_ONE 1: the score_mod is additive (ALiBi, a relative bias,
// frozen or trainable): its derivative with respect to the score is the
// constant 1, and each trainable read's the constant 0 or 1 at an index that
// does not read the score. So dS = P (dP - delta) needs no score, and the
// buffers' gradients need dS' and the indices alone (fj_grad_bufs): a kernel
// may apply the score_mod where it computes P (gen/emit_cuda.c defines it).
#ifndef FJ_SCORE_GRAD_ONE
#define FJ_SCORE_GRAD_ONE 0
#endif
// FJ_GRAD_DIAGONAL 1: every trainable read's index reads q (a relative
// position, a per-query element; gen/emit_cuda.c defines it), so a thread
// visits its dS^T elements by diagonal when adding their gradients
// (sm90/bwd_mainloop.cuh, fjhb_grad_bufs).
#ifndef FJ_GRAD_DIAGONAL
#define FJ_GRAD_DIAGONAL 0
#endif
// FJ_MASK_LOADS 1: the mask_mod reads a buffer (document ids; the host
// API's FJ_MASK_READS_BUFFER; gen/emit_cuda.c defines it), so evaluating it
// costs loads and registers (sm90/bwd_mainloop.cuh, FJHB_MASK_SELECT).
#ifndef FJ_MASK_LOADS
#define FJ_MASK_LOADS 0
#endif

#if !defined(FJ_HEAD_DIM) || !defined(FJ_BLOCK_M) || !defined(FJ_BLOCK_N) || \
    !defined(FJ_NUM_WARPS) || !defined(FJ_NUM_STAGES) ||                      \
    !defined(FJ_HAS_MASK) || !defined(FJ_HAS_SCORE_MOD)
#error "backward kernel: a configuration macro from the generator is missing"
#endif
#if defined(FJ_DTYPE_BF16) == defined(FJ_DTYPE_F16)
#error "backward kernel: define exactly one of FJ_DTYPE_BF16, FJ_DTYPE_F16"
#endif

struct fj_bwd_params {
  // Tensors [B, H, S, D] of the element type, as the forward took and wrote
  // them (q [B, Hq, Lq, D], k and v [B, Hkv, Lk, D], o and dout like q), and
  // the gradients, shaped like q, k and v; or packed (cu_seqlens_q/k below).
  const void *q;
  const void *k;
  const void *v;
  const void *o;
  const void *dout;
  const float *lse;   // [B, Hq, Lq] ([Hq, total_q] packed), natural log, -inf
                      // for a fully masked row
  const float *dlse;  // like lse, or null: 0
  // Scratch (fp32, contiguous, laid out by the kernels alone), in rows of
  // one query each (fjb_acc_row):
  //   delta    [B * Hq][acc_sh]      dO . O - dLSE (0 where LSE = -inf), by pre
  //   dq_accum [B * Hq][acc_sh][D]   zeroed by pre, += scale * dS K by the
  //                                  main kernel, converted to dq by post;
  //                                  row-major, or tiled (FJB_DQ_TILED, below)
  // and dq_sem below.
  float *delta;
  float *dq_accum;
  void *dq;
  void *dk;
  void *dv;
  // Strides in elements for batch, head and sequence; the head dim is contiguous.
  long long q_sb, q_sh, q_ss;
  long long k_sb, k_sh, k_ss;
  long long v_sb, v_sh, v_ss;
  long long o_sb, o_sh, o_ss;
  long long do_sb, do_sh, do_ss;
  long long dq_sb, dq_sh, dq_ss;
  long long dk_sb, dk_sh, dk_ss;
  long long dv_sb, dv_sh, dv_ss;
  long long lse_sb, lse_sh;    // lse's sequence stride is 1
  long long dlse_sb, dlse_sh;  // dlse's sequence stride is 1
  fj_sizes sz;
  int kv_group;      // Hq / Hkv
  float scale;       // multiplies q.k
  float scale_log2;  // scale * log2(e)
  // Block mask (runtime/blockmask.c), its transposed lists, or
  // bm_q_num == nullptr: none, and tiles are classified by fj_tile_class.
  // Count arrays (q_num_blocks, full_q_num_blocks) are indexed by
  // b * bm_b_stride + h * bm_h_stride + n_block / bm_kv_ratio (h the query
  // head, n_block the CTA's kv tile; strides 0 broadcast); index arrays
  // (q_indices, full_q_indices) hold bm_nq entries per count, ascending. A
  // listed block covers bm_q_ratio query tiles of FJ_BLOCK_M rows.
  const int *bm_q_num;       // PARTIAL query blocks per kv block
  const int *bm_q_idx;
  const int *bm_full_q_num;  // FULL query blocks per kv block
  const int *bm_full_q_idx;
  int bm_b_stride, bm_h_stride;
  int bm_nq;        // the mask's query blocks, ceil(Lq / block_q)
  int bm_q_ratio;   // block_q / FJ_BLOCK_M
  int bm_kv_ratio;  // block_kv / FJ_BLOCK_N
  //   dq_sem   int32: [0] the persistent kernel's tile counter (fjb_tile_counter)
  //            (FJ_PERSISTENT), then [B][Hq][ceil(Lq / FJ_BLOCK_M)] a
  //            semaphore a query tile (FJB_DQ_FIRST_STORE: the order of its
  //            dQ additions, common/bwd_order.cuh); zeroed by pre (scratch
  //            sized for 16-row tiles: FJB_SEM_ROWS)
  // The deterministic mode's (FJ_DETERMINISTIC; unused otherwise): the
  // block mask's lists per query block (null without a block mask), from
  // which a kv tile counts the kv tiles that add to a query tile before
  // it: count arrays (kv_num_blocks, full_kv_num_blocks) indexed by b *
  // bm_qb_stride + h * bm_qh_stride + query block (strides 0 broadcast),
  // index arrays holding bm_nkv entries per count, ascending. They are the
  // transposes of the lists above (fj_block_mask_build compacts both from
  // one classification).
  int *dq_sem;
  const int *bm_kv_num;       // PARTIAL kv blocks per query block
  const int *bm_kv_idx;
  const int *bm_full_kv_num;  // FULL kv blocks per query block
  const int *bm_full_kv_idx;
  int bm_qb_stride, bm_qh_stride;
  int bm_nkv;  // the mask's kv blocks, ceil(Lk / block_kv)
  // FJ_PERSISTENT: the kv tiles' order takes the kv heads (of every batch)
  // in groups of this many (runtime/backward.c; at least 1), kv tile
  // slowest within a group (common/bwd_walk.cuh's fjb_tile_order).
  int kv_head_group;
  // Packed variable-length batches (docs/serving.md), or null: off.
  // cu_seqlens_q [B + 1]: sequence b's rows of q, o, dout and dq start at
  // row cu_seqlens_q[b] (their batch strides are 0), its Lq is the
  // difference (sz.Lq is max_seqlen_q), lse and dlse are [Hq][total_q]
  // (lse_sb, dlse_sb 0), and its scratch rows start at the padded row
  // fjb_seq_of gives. cu_seqlens_k [B + 1]: the same for k, v, dk and dv
  // (sz.Lk is max_seqlen_k); null with cu_seqlens_q: k [B, Hkv, Lk, D].
  const int *cu_seqlens_q;
  const int *cu_seqlens_k;
  // Scratch rows of one query head: Lq rounded up to FJB_SEQ_PAD
  // (fjb_acc_rows), or with cu_seqlens_q total_q + FJB_SEQ_PAD * B (each
  // sequence's rows start at a multiple of FJB_SEQ_PAD, and a whole tile of
  // FJB_SEQ_PAD rows fits before the next): a query tile's TMA boxes and
  // reduce-adds, and the pre kernel's zeroing, stay in the sequence's own
  // rows.
  long long acc_sh;
  // FJ_PERSISTENT: the kernel's takes and its last round split
  // (runtime/backward.c, fjr_bwd_tail_split; docs/backward.md): the CTAs
  // take `takes` times from the order (fjb_tile_order) of the kv tiles;
  // takes tail_first, ... are the last tail_tiles tiles, each taken as
  // tail_pieces pieces, equal shares of the tile's items, which add their
  // dK and dV (fp32, dK times scale) into dkv_accum for post to convert.
  // Without a split, takes is the tile count and tail_first too, and
  // tail_tiles and tail_pieces are 0. (The host gives takes and tail_first,
  // which the producer warp compares with at every take: derived in the
  // kernel, they took registers it does not have.)
  //   dkv_accum [tail_tiles][dK, dV][consumer][64 x FJ_HEAD_DIM], each 64-row
  //             block in a wgmma accumulator's register order
  //             (fjb_dq_tiled_f4 over a width of FJ_HEAD_DIM); zeroed by pre
  float *dkv_accum;
  int takes, tail_first, tail_tiles, tail_pieces;
  fj_user_params user;
  fj_user_grads grads;
};

// NVRTC has no offsetof: the size pins the fixed part at 520 bytes (`user`,
// whose first member is a long long, follows without padding), the offset
// runtime/launch_params.h asserts with offsetof for the host mirror, field
// by field.
static_assert(sizeof(fj_bwd_params) ==
                  520 + sizeof(fj_user_params) + (sizeof(fj_user_grads) + 7) / 8 * 8,
              "fj_bwd_params: the fixed part is 520 bytes, as fjr_bwd_params_fixed");

// A head's and a packed sequence's scratch rows start at a multiple of this
// many rows: a head's rows are Lq rounded up to it, and a packed sequence
// has a tile of it free before the next sequence's (gen/config.h's
// FJG_BWD_SEQ_PAD names the same number for the host). The query tile of
// every packed-batch kernel (FJ_BLOCK_M) divides it (the sm90 kernel's
// 128-row tiles are not taken there: gen/config.c,
// fjg_config_backward_variant).
constexpr int FJB_SEQ_PAD = 64;
static_assert(!FJ_VARLEN || FJB_SEQ_PAD % FJ_BLOCK_M == 0,
              "backward: query tiles divide FJB_SEQ_PAD");

// A query head's scratch rows without cu_seqlens_q (p.acc_sh: the host
// computes the same), as an int: the narrower multiply keeps the masked
// D=128 sm80 kernel from spilling.
__device__ __forceinline__ int fjb_acc_rows(int Lq) {
  return (Lq + FJB_SEQ_PAD - 1) & -FJB_SEQ_PAD;
}

// dq_accum's tiled form, which the sm90 kernel writes (FJB_DQ_TILED and
// the tiles' width FJB_DQ_TILE_COLS, W: its configuration defines them;
// otherwise dq_accum is row-major): each FJB_SEQ_PAD-row block of a head's
// rows (64 x D floats) is D / W tiles of 64 x W, one after the other, each
// in the register order of a 128-thread wgmma accumulator (m64nW, fp32):
// floats 4 (128 k + t) .. + 3 are thread t's registers 4 k .. 4 k + 3, rows
// r and r + 8, columns c and c + 1 of the tile, in the order (r, c), (r, c
// + 1), (r + 8, c), (r + 8, c + 1), for r = 16 (t / 32) + (t / 4) % 8 and c
// = 8 k + 2 (t % 4). So a warpgroup stores its dQ part with 16-byte stores
// no two lanes of which share a bank, and it is added to dq_accum as one
// bulk copy. The float4 of row pair (r, r + 8) and column pair (c, c + 1)
// in a tile:
__device__ __forceinline__ int fjb_dq_tiled_f4(int r, int c) {
  const int t = 32 * (r / 16) + 4 * (r % 8) + (c % 8) / 2;
  return 128 * (c / 8) + t;
}
static_assert(FJB_SEQ_PAD == 64, "backward: tiled dq_accum blocks are 64 rows");

// Sequence b of a backward launch: p.sz with Lq and Lk set to the
// sequence's own (what fj_mask, fj_score_mod, fj_score_grad and
// fj_tile_class see, and the bounds of its rows), its first rows in packed
// q / o / dout / dq / lse and k / v / dk / dv (0 unless packed), and where
// its scratch rows lie: query row q of head h is scratch row
// fjb_acc_row(p, s, h) + q. Values read from cu_seqlens are clamped, as
// the forward's fj_seq_of clamps them: Lq to [0, max_seqlen_q], Lk to
// [0, max_seqlen_k]. Without FJ_VARLEN this is p.sz and the launch's rows,
// constants; in the FJ_VARLEN unit cu_seqlens_k may be null (k [B, Hkv,
// Lk, D]: Lk and k's rows are the launch's). A packed sequence's scratch
// rows start at floor((cu_seqlens_q[b] + FJB_SEQ_PAD b) / FJB_SEQ_PAD)
// FJB_SEQ_PAD: at most cu_seqlens_q[b] + FJB_SEQ_PAD b, and the next
// sequence's start lies at least its length rounded up to FJB_SEQ_PAD
// further, so that whole tiles of FJB_SEQ_PAD rows never overlap.
struct fjb_seq {
  fj_sizes sz;
  int q_row0, k_row0;
  int acc_h0;  // scratch head block of query head 0: b * Hq, or 0 packed
  int acc_q0;  // scratch row of query 0 within a head's rows
};
__device__ __forceinline__ fjb_seq fjb_seq_of(const fj_bwd_params &p, int b) {
  fjb_seq s{p.sz, 0, 0, b * p.sz.Hq, 0};
  if (FJ_VARLEN && p.cu_seqlens_q != nullptr) {
    const int a = __ldg(p.cu_seqlens_q + b), e = __ldg(p.cu_seqlens_q + b + 1);
    s.q_row0 = a;
    s.sz.Lq = max(0, min(e - a, p.sz.Lq));
    s.acc_h0 = 0;
    s.acc_q0 = (int)(((long long)a + (long long)b * FJB_SEQ_PAD) / FJB_SEQ_PAD * FJB_SEQ_PAD);
  }
  if (FJ_VARLEN && p.cu_seqlens_k != nullptr) {
    const int a = __ldg(p.cu_seqlens_k + b), e = __ldg(p.cu_seqlens_k + b + 1);
    s.k_row0 = a;
    s.sz.Lk = max(0, min(e - a, p.sz.Lk));
  }
  return s;
}

// A sequence's record in shared memory (FJB_SEQ_WORDS words at s, a
// shared-memory address), for kernels that read it where they use it
// rather than hold it in registers across their item loops: fjb_seq_sts
// writes it (every thread of a CTA may write the same record: each reads
// back its own writes), fjb_seq_lds reads it back, p.sz's B and heads from
// the parameter. s must be 8-byte aligned. Without FJ_VARLEN nothing is
// stored and the reads are fjb_seq_of's constants (b: the batch index).
enum { FJB_SEQ_WORDS = 6 };
__device__ __forceinline__ void fjb_seq_sts(unsigned s, const fjb_seq &q) {
#if !FJ_VARLEN
  (void)s, (void)q;
#else
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(s), "r"(q.sz.Lq), "r"(q.sz.Lk)
               : "memory");
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(s + 8), "r"(q.q_row0), "r"(q.k_row0)
               : "memory");
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(s + 16), "r"(q.acc_h0),
               "r"(q.acc_q0)
               : "memory");
#endif
}
__device__ __forceinline__ fj_sizes fjb_seq_lds_sizes(const fj_bwd_params &p, unsigned s) {
  fj_sizes z = p.sz;
#if !FJ_VARLEN
  (void)s;
#else
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(z.Lq), "=r"(z.Lk) : "r"(s));
#endif
  return z;
}
__device__ __forceinline__ fjb_seq fjb_seq_lds(const fj_bwd_params &p, unsigned s, int b) {
#if !FJ_VARLEN
  (void)s;
  return fjb_seq_of(p, b);
#else
  (void)b;
  fjb_seq q;
  q.sz = fjb_seq_lds_sizes(p, s);
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(q.q_row0), "=r"(q.k_row0)
               : "r"(s + 8));
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(q.acc_h0), "=r"(q.acc_q0)
               : "r"(s + 16));
  return q;
#endif
}

// The scratch row (of delta; times FJ_HEAD_DIM, of dq_accum) of query 0 of
// query head h of sequence s.
__device__ __forceinline__ long long fjb_acc_row(const fj_bwd_params &p, const fjb_seq &s,
                                                 int h) {
#if FJ_VARLEN
  return (long long)(s.acc_h0 + h) * p.acc_sh + s.acc_q0;
#else
  return ((long long)s.acc_h0 + h) * fjb_acc_rows(p.sz.Lq) + s.acc_q0;
#endif
}
