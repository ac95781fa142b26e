// templates/sm80/decode_config.cuh: the decode kernel's contract with the
// generator, its shapes and its shared-memory map (docs/serving.md).
//
// The decode kernel serves short query lengths (1 to FJ_DECODE_MAX_Q tokens
// a sequence) against a long KV sequence, contiguous or paged. It is
// memory-bound: what matters is that K and V stream from HBM once, with
// enough bytes in flight, and nothing else stalls them. So:
//  - GQA packing: the query rows of one CTA are the (query head, token)
//    pairs of one KV head's group, row r = g * Lq + t for group head g and
//    token t, so K and V are read once per KV head, not once per query head.
//    A group larger than FJ_BLOCK_M rows takes several row blocks.
//  - Each warp owns a 16-row slice of every FJ_BLOCK_N-row kv tile (warp w:
//    rows 16 w .. 16 w + 15) and streams its slices through its own cp.async
//    ring of FJ_NUM_STAGES stages, with its own online-softmax state: no
//    barrier between warps until the epilogue merges their states. A slice
//    lies inside one page of a paged cache (pages are multiples of 16 rows),
//    so it costs one block-table read.
//  - Split-KV: the span from the first to the last non-EMPTY kv tile of a
//    (sequence, KV head, row block) is dealt to p.num_splits CTAs in equal
//    runs; with more than one, each
//    writes its normalized partial O and its LSE (fp32, p.part_o and
//    p.part_lse) and the merge kernel (common/merge.cuh) combines them.
//
// Macros from the generator (gen/config.c's fjg_config_choose_decode):
//   FJ_HEAD_DIM        64 | 128
//   FJ_DTYPE_BF16 1  or  FJ_DTYPE_F16 1
//   FJ_BLOCK_M         query rows a CTA (16 or 32: the row block)
//   FJ_BLOCK_N         kv rows a CTA tile: 16 * FJ_NUM_WARPS
//   FJ_NUM_WARPS       warps a CTA: 4 (two CTAs a multiprocessor) or 8 (one)
//   FJ_NUM_STAGES      K/V slices in flight a warp (>= 2)
//   FJ_HAS_MASK, FJ_HAS_SCORE_MOD   as in the forward
// Launch: grid (row blocks * num_splits, Hkv, B), block x = split * row
//   blocks + row block, FJ_NUM_WARPS * 32 threads, FJD_SMEM_BYTES dynamic
//   shared memory; parameter fj_fwd_params (common/fj_fwd.cuh), of which it
//   reads q, k, v, o, lse and their strides, sz, kv_group, scale(_log2),
//   seqlens_k, block_table, bt_stride, page_size, skip_log2, part_o,
//   part_lse, num_splits (block masks are not read: mask_mod is evaluated
//   on every PARTIAL slice).
// Requirements the host checks: as the sm80 forward's (16-byte aligned rows,
//   strides multiples of 8 elements), Lq <= FJ_DECODE_MAX_Q.
#pragma once

constexpr int FJD_SLICE = 16;  // kv rows of a warp's slice
static_assert(FJ_BLOCK_N == FJD_SLICE * FJ_NUM_WARPS, "decode: a tile is one slice a warp");
static_assert(FJ_BLOCK_M == 16 || FJ_BLOCK_M == 32, "decode: 16 or 32 query rows a CTA");
static_assert(FJ_NUM_STAGES >= 2, "decode: at least two stages");
constexpr int FJD_THREADS = FJ_NUM_WARPS * 32;
// CTAs a multiprocessor (the launch bound): the 8-warp kernel runs one,
// with all of a thread's 255 registers.
constexpr int FJD_MIN_CTAS = FJ_NUM_WARPS > 4 ? 1 : 2;
constexpr int FJD_MT = FJ_BLOCK_M / 16;        // m16 row tiles (every warp has all rows)
constexpr int FJD_KT = FJ_HEAD_DIM / 16;       // k16 steps of Q K^T
constexpr int FJD_DT = FJ_HEAD_DIM / 8;        // n8 tiles of O
constexpr int FJD_CHUNKS = FJ_HEAD_DIM / 8;    // 16-byte chunks a row
constexpr int FJD_ROW_BYTES = FJ_HEAD_DIM * 2;
constexpr int FJD_SLICE_BYTES = FJD_SLICE * FJD_ROW_BYTES;
constexpr int FJD_STAGE_BYTES = 2 * FJD_SLICE_BYTES;  // K, then V
constexpr int FJD_WARP_BYTES = FJ_NUM_STAGES * FJD_STAGE_BYTES;
constexpr int FJD_Q_BYTES = FJ_BLOCK_M * FJD_ROW_BYTES;
constexpr int FJD_SMEM_BYTES = FJD_Q_BYTES + FJ_NUM_WARPS * FJD_WARP_BYTES;
// The epilogue's reduction (every warp's m and l a row, the rows' LSE, then
// the warps' O in fp32) reuses the stages. O's rows are padded by 8 floats,
// so that the m16n8 fragment's 8 rows (a lane's pair of columns each) fall in
// different banks. The warps' O go into FJD_RED_REGIONS regions in
// FJD_RED_ROUNDS rounds, as few as fit: one, every warp its own region,
// except with 32 rows and 2 stages.
constexpr int FJD_RED_STRIDE = FJ_HEAD_DIM + 8;
constexpr int FJD_RED_HEAD_BYTES = (2 * FJ_NUM_WARPS + 1) * FJ_BLOCK_M * 4;
constexpr int FJD_RED_REGION = FJ_BLOCK_M * FJD_RED_STRIDE;  // floats
constexpr int fjd_red_rounds() {
  int r = 1;
  while (r < FJ_NUM_WARPS &&
         FJD_RED_HEAD_BYTES + FJ_NUM_WARPS / r * FJD_RED_REGION * 4 > FJ_NUM_WARPS * FJD_WARP_BYTES)
    r *= 2;
  return r;
}
constexpr int FJD_RED_ROUNDS = fjd_red_rounds();
constexpr int FJD_RED_REGIONS = FJ_NUM_WARPS / FJD_RED_ROUNDS;
static_assert(FJD_RED_HEAD_BYTES + FJD_RED_REGIONS * FJD_RED_REGION * 4 <=
                  FJ_NUM_WARPS * FJD_WARP_BYTES,
              "decode: the epilogue's reduction must fit in the stages");
// Q stays in registers with one row tile; with two it is read from shared
// memory at each step, leaving the registers to O.
#define FJD_Q_IN_REGISTERS (FJD_MT == 1)
#define FJD_LOG2E 1.4426950408889634f
#define FJD_LN2 0.6931471805599453f
