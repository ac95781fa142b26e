/*
 * runtime/backward.c: the backward pass (docs/backward.md): its kernel
 * configuration, decided here once for compiling and launching, and the
 * launch: tensor and value checks, the scratch memory, the parameter
 * struct, the block mask's transposed lists, and the three kernels on the
 * caller's stream.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/emit_cuda.h"
#include "gen/interval.h"
#include "runtime/args.h"
#include "runtime/backward.h"
#include "runtime/blockmask.h"
#include "runtime/context_impl.h"
#include "runtime/kernels.h"
#include "runtime/launch_params.h"
#include "runtime/serving.h"
#include "runtime/tensor.h"
#include "runtime/tma.h"

#define FJR_BWD_MAX_PARAM_BYTES 4096
#define FJR_SCRATCH_ALIGN 256

/* ---- the kernel kind ---- */

static fj_status emit_backward(const fjg_graph *g, const fjg_config *cfg, fjg_buf *out) {
  return fjg_emit_backward_tu(g, cfg, out);
}

/* fj_bwd_<spec>_d<D>_<dtype>_<template>_<arch>, then _m<rows> for an sm90
 * kernel whose query tiles are not its head dim's default, _1t for the sm90
 * kernel of one CTA a kv tile (not persistent) where the variant does not
 * say so (unpacked, not deterministic), _det for the deterministic variant
 * and _varlen for the packed-batch one. */
static void backward_name(const char *spec, const fjg_config *cfg, char *buf, size_t n) {
  char rows[16] = "";
  if (cfg->uses_tma && cfg->block_m != fjg_sm90_bwd_block_m(cfg->head_dim))
    snprintf(rows, sizeof rows, "_m%d", cfg->block_m);
  snprintf(buf, n, "fj_bwd_%s_d%d_%s_%s_%s%s%s%s%s", spec, cfg->head_dim,
           cfg->dtype == FJ_DTYPE_BF16 ? "bf16" : "fp16", cfg->template_name, cfg->arch, rows,
           cfg->uses_tma && !cfg->varlen && !cfg->deterministic && !cfg->persistent ? "_1t" : "",
           cfg->deterministic ? "_det" : "", cfg->varlen ? "_varlen" : "");
}

/* The main kernel first: it is the one given cfg.smem_bytes. */
enum { BWD_MAIN = 0, BWD_PRE = 1, BWD_POST = 2 };

static const fjr_kernel_kind backward_kind = {
    .pass = "backward",
    .emit = emit_backward,
    .name = backward_name,
    .entries = {"fj_attention_bwd", "fj_attention_bwd_pre", "fj_attention_bwd_post"},
    .num_entries = 3,
    .tuned = 1,
};

/* ---- the configuration ---- */

/* The one place a backward kernel's configuration is decided: the
 * caller's template, else the context's (FLEXJIT_TEMPLATE, as for the
 * forward), else sm90 (wgmma + TMA) on sm_90a and sm80 (mma.sync) on every
 * other target. The deterministic variant (FJ_DETERMINISTIC) and the
 * packed-batch one (FJ_VARLEN) when asked for, which both have. Both
 * templates take 64 x 128 tiles, or 128 x 128 in the sm90 kernel at head
 * dim 64, which takes 64-row tiles for a packed batch and for a block mask (o's
 * block_mask_block_q) whose blocks 128 does not divide
 * (fjg_config_backward_variant), so that a block mask that fits one
 * template fits the other. The sm90 kernel is persistent but for packed
 * batches and the deterministic mode; FLEXJIT_PERSISTENT=0 asks for its
 * one-CTA-a-tile form, as for the forward. */
static fj_status backward_config(fj_context *ctx, const fj_kernel_options *o,
                                 fjg_config *cfg) {
  if (ctx->opts.bad[0]) return fjr_fail(ctx, FJ_EINVAL, "%s", ctx->opts.bad);
  if (o->block_mask_block_q < 0)
    return fjr_fail(ctx, FJ_EINVAL, "block_mask_block_q %d is negative",
                    o->block_mask_block_q);
  const char *arch = o->arch;
  fj_status st;
  if (!arch && (st = fjr_context_arch(ctx, &arch)) != FJ_OK) return st;
  const char *tmpl = o->kernel_template ? o->kernel_template : ctx->opts.kernel_template;
  if (!tmpl) tmpl = strcmp(arch, "sm_90a") == 0 ? "sm90" : "sm80";
  char err[1024];
  st = fjg_config_choose_backward(o->head_dim, o->dtype, arch, tmpl, cfg, err, sizeof err);
  if (st != FJ_OK) return fjr_fail(ctx, st, "%s", err);
  fjg_config_backward_variant(cfg, o->deterministic, o->varlen, o->block_mask_block_q);
  if (ctx->opts.persistent == 0) cfg->persistent = 0;
  return FJ_OK;
}

fj_status fj_compile_backward(fj_context *ctx, const fj_spec *spec,
                              const fj_kernel_options *opts, fj_kernel_info *info) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!spec || !opts) return fjr_fail(ctx, FJ_EINVAL, "fj_compile_backward: NULL argument");
  if (opts->dtype != FJ_DTYPE_BF16 && opts->dtype != FJ_DTYPE_F16)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "unsupported dtype %d", (int)opts->dtype);
  fjg_config cfg;
  fjr_kernel *k = NULL;
  int resident = 0;
  fj_status st = backward_config(ctx, opts, &cfg);
  if (st == FJ_OK)
    st = fjr_kernel_get(ctx, (fj_spec *)spec, &backward_kind, &cfg, &k, &resident);
  if (st == FJ_OK && info) fjr_kernel_info(k, resident, info);
  return st;
}

/* ---- scratch ---- */

static size_t align_up(size_t n) {
  return (n + FJR_SCRATCH_ALIGN - 1) / FJR_SCRATCH_ALIGN * FJR_SCRATCH_ALIGN;
}

/* A query head's scratch rows without cu_seqlens_q: Lq rounded up to
 * FJG_BWD_SEQ_PAD, so that every head's rows are whole blocks of dq_accum's
 * tiled form (templates/common/fj_bwd.cuh: fjb_acc_rows). */
static int64_t acc_rows(int64_t Lq) {
  return (Lq + FJG_BWD_SEQ_PAD - 1) / FJG_BWD_SEQ_PAD * FJG_BWD_SEQ_PAD;
}
/* The pre kernel zeroes such blocks, one a CTA. */
_Static_assert(FJG_BWD_ROW_BLOCK == FJG_BWD_SEQ_PAD,
               "the pre kernel zeroes whole blocks of a head's scratch rows");

/* The bytes of dkv_accum for `tiles` split tiles: fp32 dK and dV blocks
 * of 64 x D for each of a tile's two consumers (fj_bwd_params.dkv_accum). */
static size_t tail_bytes(int64_t tiles, int64_t D) {
  return align_up((size_t)tiles * 4 * 64 * (size_t)D * 4);
}

/* The scratch's layout, the one place it is decided: delta (fp32, one
 * float a row) at 0, dq_accum (fp32, D floats a row) at at[0], the
 * persistent kernel's tile counter, the query tiles' semaphores and the
 * main kernel's conversion counters (int32, zeroed by the pre kernel;
 * fj_bwd_params.dq_sem; common/bwd_order.cuh) at at[1], then, at
 * at[2], the persistent kernel's dkv_accum for the tiles it splits
 * (tail_bytes), each at a 256-byte boundary. `rows`: B * Hq *
 * acc_rows(Lq), or for a packed batch Hq * (total_q + FJG_BWD_SEQ_PAD * B)
 * (fj_bwd_params.acc_sh rows a query head); the semaphores: an int32 per
 * FJG_BWD_SEM_ROWS query rows of every (batch, query head), Lq being
 * max_seqlen_q for a packed batch. */
static void scratch_layout(int64_t rows, int64_t B, int64_t Hq, int64_t Lq, int64_t D,
                           size_t at[3]) {
  const size_t tiles = (size_t)((Lq + FJG_BWD_SEM_ROWS - 1) / FJG_BWD_SEM_ROWS);
  at[0] = align_up((size_t)rows * 4);
  at[1] = at[0] + align_up((size_t)rows * (size_t)D * 4);
  at[2] = at[1] + align_up((2 + (size_t)B * (size_t)Hq * (tiles + 1)) * 4);
}

size_t fj_backward_workspace_size(int64_t B, int64_t Hq, int64_t Lq, int64_t D) {
  if (B < 1 || Hq < 1 || Lq < 1 || D < 1) return 0;
  size_t at[3];
  scratch_layout(B * Hq * acc_rows(Lq), B, Hq, Lq, D, at);
  return at[2] + tail_bytes(FJR_BWD_TAIL_TILES, D);
}

/* ---- checks ---- */

/* The forward's tensors and the gradients' outputs (backward.h). */
fj_status fjr_backward_check(fj_context *ctx, const fj_backward_args *a, fj_dtype *dtype,
                             fjr_bwd_params_fixed *p) {
  /* Which packed-batch fields go together: the forward's rules. */
  const fj_forward_args fa = {.cu_seqlens_q = a->cu_seqlens_q,
                              .cu_seqlens_k = a->cu_seqlens_k,
                              .max_seqlen_q = a->max_seqlen_q,
                              .max_seqlen_k = a->max_seqlen_k};
  fjr_layout l;
  fj_status st = fjr_serving_layout(ctx, &fa, &l);
  if (st != FJ_OK) return st;
  if (l.q_packed && a->block_mask)
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "a block mask cannot be combined with a packed batch (cu_seqlens_q): "
                    "each sequence is masked as its own, so a packed batch needs no "
                    "document mask");
  const int qnd = l.q_packed ? 3 : 4, knd = l.kv_packed ? 3 : 4;
  const DLTensor *q = a->q;
  DLDataType dl;
  if ((st = fjr_tensor_query(ctx, q, qnd, dtype, &dl)) != FJ_OK) return st;
  const struct {
    const char *name;
    const DLTensor *t;
    uint64_t *ptr;
    int64_t *sb, *sh, *ss; /* batch, head and sequence strides */
    int kv;                /* shaped like k (1) or like q (0) */
  } four[] = {
      {"q", q, &p->q, &p->q_sb, &p->q_sh, &p->q_ss, 0},
      {"k", a->k, &p->k, &p->k_sb, &p->k_sh, &p->k_ss, 1},
      {"v", a->v, &p->v, &p->v_sb, &p->v_sh, &p->v_ss, 1},
      {"o", a->o, &p->o, &p->o_sb, &p->o_sh, &p->o_ss, 0},
      {"dout", a->dout, &p->dout, &p->do_sb, &p->do_sh, &p->do_ss, 0},
      {"dq", a->dq, &p->dq, &p->dq_sb, &p->dq_sh, &p->dq_ss, 0},
      {"dk", a->dk, &p->dk, &p->dk_sb, &p->dk_sh, &p->dk_ss, 1},
      {"dv", a->dv, &p->dv, &p->dv_sb, &p->dv_sh, &p->dv_ss, 1},
  };
  int64_t s[4];
  if ((st = fjr_tensor_check(ctx, "q", q, qnd, dl, s)) != FJ_OK ||
      (st = fjr_tensor_check(ctx, "k", a->k, knd, dl, s)) != FJ_OK)
    return st;
  const int64_t Hq = q->shape[1], D = q->shape[qnd - 1], Hkv = a->k->shape[1];
  int64_t B = q->shape[0], Lq = l.q_packed ? a->max_seqlen_q : q->shape[2];
  const int64_t Lk = l.kv_packed ? a->max_seqlen_k : a->k->shape[2];
  if (D != 64 && D != 128)
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "head dim %lld is not supported by the backward (64 or 128)",
                    (long long)D);
  if (Hq % Hkv != 0)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "query heads (%lld) must be a multiple of key/value heads (%lld)",
                    (long long)Hq, (long long)Hkv);
  if (l.q_packed &&
      (st = fjr_varlen_bind(ctx, a->cu_seqlens_q, a->cu_seqlens_k, a->max_seqlen_q,
                            a->max_seqlen_k, &B, &p->cu_seqlens_q, &p->cu_seqlens_k)) != FJ_OK)
    return st;
  /* Packed rows: their scratch rows too (total_q + FJG_BWD_SEQ_PAD * B a
   * query head) are indexed by int. */
  const int64_t tq = l.q_packed ? q->shape[0] : 0, tk = l.kv_packed ? a->k->shape[0] : 0;
  if (Lq > INT32_MAX || Lk > INT32_MAX || B > 65535 || Hq > 65535 ||
      tq + FJG_BWD_SEQ_PAD * B > INT32_MAX || tk > INT32_MAX)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "sizes too large: B <= 65535, H <= 65535, L and packed rows < 2^31");
  const int64_t qshape[4] = {B, Hq, Lq, D}, kshape[4] = {B, Hkv, Lk, D};
  const int64_t qpacked[3] = {tq, Hq, D}, kpacked[3] = {tk, Hkv, D};
  for (size_t i = 0; i < sizeof four / sizeof four[0]; i++) {
    const int packed = four[i].kv ? l.kv_packed : l.q_packed;
    const int64_t *shape = four[i].kv ? (packed ? kpacked : kshape) : (packed ? qpacked : qshape);
    if ((st = fjr_tensor_check(ctx, four[i].name, four[i].t, packed ? 3 : 4, dl, s)) != FJ_OK ||
        (st = fjr_tensor_check_shape(ctx, four[i].name, four[i].t, shape)) != FJ_OK ||
        (st = fjr_tensor_check_aligned16(ctx, four[i].name, four[i].t, s)) != FJ_OK)
      return st;
    *four[i].ptr = fjr_tensor_ptr(four[i].t);
    /* Packed: rows are dimension 0, a sequence's first row comes from
     * cu_seqlens (batch stride 0). */
    if (packed)
      *four[i].sb = 0, *four[i].sh = s[1], *four[i].ss = s[0];
    else
      *four[i].sb = s[0], *four[i].sh = s[1], *four[i].ss = s[2];
  }
  /* lse and dlse: [B, Hq, Lq], or [Hq, total_q] packed; last dimension
   * contiguous. */
  const DLDataType f32 = {kDLFloat, 32, 1};
  const int64_t lshape[3] = {l.q_packed ? Hq : B, l.q_packed ? tq : Hq, Lq};
  const int lnd = l.q_packed ? 2 : 3;
  int64_t ls[3];
  if (!a->lse) return fjr_fail(ctx, FJ_ETENSOR, "lse: the forward's LSE is required");
  if ((st = fjr_tensor_check(ctx, "lse", a->lse, lnd, f32, ls)) != FJ_OK ||
      (st = fjr_tensor_check_shape(ctx, "lse", a->lse, lshape)) != FJ_OK)
    return st;
  p->lse = fjr_tensor_ptr(a->lse);
  p->lse_sb = l.q_packed ? 0 : ls[0], p->lse_sh = l.q_packed ? ls[0] : ls[1];
  if (a->dlse) {
    if ((st = fjr_tensor_check(ctx, "dlse", a->dlse, lnd, f32, ls)) != FJ_OK ||
        (st = fjr_tensor_check_shape(ctx, "dlse", a->dlse, lshape)) != FJ_OK)
      return st;
    p->dlse = fjr_tensor_ptr(a->dlse);
    p->dlse_sb = l.q_packed ? 0 : ls[0], p->dlse_sh = l.q_packed ? ls[0] : ls[1];
  }
  float scale = a->scale;
  if (scale == 0.0f) scale = 1.0f / sqrtf((float)D);
  if (!isfinite(scale)) return fjr_fail(ctx, FJ_EINVAL, "scale must be finite");
  p->sz = (fjr_sizes){(int32_t)B, (int32_t)Hq, (int32_t)Hkv, (int32_t)Lq, (int32_t)Lk, 0, 0};
  p->kv_group = (int32_t)(Hq / Hkv);
  p->scale = scale;
  p->scale_log2 = scale * 1.4426950408889634f;
  p->acc_sh = l.q_packed ? tq + FJG_BWD_SEQ_PAD * B : acc_rows(Lq);
  return FJ_OK;
}

/* Each trainable buffer's gradient: an fp32 tensor shaped like the buffer,
 * packed as the generated fj_user_grads into dst; a gradient for any other
 * value is refused. */
static fj_status bind_grads(fj_context *ctx, const fj_spec *spec, const fj_arg *args,
                            int num_args, void *dst) {
  const fjg_graph *g = spec->graph;
  uint64_t ptrs[FJG_MAX_ARGS];
  const int n = fjg_num_args(g);
  for (int i = 0; i < num_args; i++) {
    int a = fjg_find_arg(g, args[i].name);
    if (args[i].grad && (a < 0 || !fjg_arg_at(g, a)->trainable))
      return fjr_fail(ctx, FJ_EINVAL,
                      "'%s' has a gradient tensor but spec '%s' does not mark it "
                      "trainable (buffer(name, \"f32\", {grad = true}))",
                      args[i].name, spec->name);
  }
  for (int a = 0; a < n; a++) {
    const fjg_arg *decl = fjg_arg_at(g, a);
    ptrs[a] = 0;
    if (!decl->trainable) continue;
    const fj_arg *given = fjr_arg_given(args, num_args, decl->name);
    if (!given || !given->grad)
      return fjr_fail(ctx, FJ_EINVAL,
                      "spec '%s' trains buffer '%s': its fj_arg needs a `grad` tensor",
                      spec->name, decl->name);
    char what[96];
    snprintf(what, sizeof what, "gradient of '%s'", decl->name);
    int64_t s[1];
    const DLDataType f32 = {kDLFloat, 32, 1};
    fj_status st = fjr_tensor_check(ctx, what, given->grad, 1, f32, s);
    if (st != FJ_OK) return st;
    if (given->buffer && given->grad->shape[0] != given->buffer->shape[0])
      return fjr_fail(ctx, FJ_ETENSOR, "%s: %lld elements, the buffer has %lld", what,
                      (long long)given->grad->shape[0],
                      (long long)given->buffer->shape[0]);
    if (s[0] != 1 && given->grad->shape[0] > 1)
      return fjr_fail(ctx, FJ_ETENSOR, "%s: must be contiguous", what);
    if (fjr_tensor_ptr(given->grad) % 4 != 0)
      return fjr_fail(ctx, FJ_ETENSOR, "%s: data must be 4-byte aligned", what);
    ptrs[a] = fjr_tensor_ptr(given->grad);
  }
  fjg_user_grads_pack(g, ptrs, dst);
  return FJ_OK;
}

/* ---- the launch ---- */

int fjr_bwd_kv_head_group(int64_t grid, int64_t kv_tiles, int64_t kv_heads,
                          int64_t bytes_per_kv_head, int64_t l2_bytes) {
  if (l2_bytes <= 0 || kv_tiles < 1 || kv_heads < 1 || bytes_per_kv_head < 1) return 1;
  int64_t g = (2 * grid + kv_tiles - 1) / kv_tiles;
  const int64_t fit = 2 * l2_bytes / 3 / bytes_per_kv_head;
  if (g > fit) g = fit;
  if (g > kv_heads) g = kv_heads;
  return g < 1 ? 1 : (int)g;
}

int fjr_bwd_walks_shrink(const fjg_graph *g, const fjg_env *env, int block_m, int block_n) {
  const int Lq = env->sizes[FJG_SZ_LQ], Lk = env->sizes[FJG_SZ_LK];
  if (Lq < 1 || Lk < 1) return 0;
  const int qn = (Lq - 1) / block_m * block_m, kn = (Lk - 1) / block_n * block_n;
  const int q0_end = block_m < Lq ? block_m - 1 : Lq - 1;
  const int kv0_end = block_n < Lk ? block_n - 1 : Lk - 1;
  return fjg_tile_class_cpu(g, env, 0, 0, 0, q0_end, kn, Lk - 1) == FJG_TILE_EMPTY &&
         fjg_tile_class_cpu(g, env, 0, 0, qn, Lq - 1, 0, kv0_end) != FJG_TILE_EMPTY;
}

void fjr_bwd_tail_split(int64_t grid, int64_t tiles, int64_t items, int tail[2]) {
  tail[0] = tail[1] = 0;
  if (grid < 2 || tiles <= grid) return;
  const int64_t last = tiles % grid;
  if (last == 0 || last > FJR_BWD_TAIL_TILES || 2 * last > grid) return;
  const int64_t pieces = grid / last < items ? grid / last : items;
  if (pieces < 2 || tiles + last * (pieces - 1) > INT32_MAX) return;
  tail[0] = (int)last;
  tail[1] = (int)pieces;
}

/* The persistent kernel's kv heads a group of its tile order for launch p
 * (its sizes, offsets, kv_group and acc_sh bound; args' params) on a grid
 * of `grid` CTAs, nkv kv tiles a head: grouped where the walks shrink, else
 * 1. */
static int tile_group(const fj_context *ctx, const fj_spec *spec, const fj_backward_args *args,
                      const fjg_config *cfg, const fjr_bwd_params_fixed *p, unsigned grid,
                      int64_t nkv, int64_t D) {
  int32_t i32s[FJG_MAX_ARGS];
  float f32s[FJG_MAX_ARGS];
  (void)fjr_param_values(spec->graph, args->args, args->num_args, i32s, f32s);
  const fjg_env env = fjr_launch_env(&p->sz, i32s, f32s);
  if (!fjr_bwd_walks_shrink(spec->graph, &env, cfg->block_m, cfg->block_n)) return 1;
  /* A kv head's Q and dO (2 bytes an element) and dq_accum rows (4). */
  return fjr_bwd_kv_head_group(grid, nkv, (int64_t)p->sz.B * p->sz.Hkv,
                               (int64_t)p->kv_group * p->acc_sh * D * 8, ctx->l2_bytes);
}

/* The persistent kernel's takes and its last round split (fjr_bwd_tail_split)
 * for launch p on a grid of `grid` CTAs, nkv kv tiles a head: a split only
 * without a mask or block
 * mask, where every kv tile's walk is as long, so that the last round's tiles
 * are as long as any (under a sliding window the last tiles of a sequence are
 * shorter, and split, its backward ran slower: docs/backward.md), and where
 * the scratch has `room` for its dkv_accum (a workspace sized before may
 * not). Sets p's takes, tail_first, tail_tiles and tail_pieces; returns the
 * bytes of dkv_accum (0: no split). */
static size_t tail_split(const fj_spec *spec, const fj_backward_args *args,
                         const fjg_config *cfg, fjr_bwd_params_fixed *p, unsigned grid,
                         int64_t nkv, int64_t D, size_t room) {
  const int64_t tiles = nkv * p->sz.Hkv * p->sz.B;
  int tail[2] = {0, 0};
  if (!fjg_has_mask(spec->graph) && !args->block_mask)
    fjr_bwd_tail_split(grid, tiles, p->kv_group * ((p->sz.Lq + cfg->block_m - 1) / cfg->block_m),
                       tail);
  if (tail[0] && room < tail_bytes(tail[0], D)) tail[0] = tail[1] = 0;
  p->tail_first = (int32_t)(tiles - tail[0]);
  p->takes = (int32_t)(tiles - tail[0] + (int64_t)tail[0] * tail[1]);
  p->tail_tiles = tail[0];
  p->tail_pieces = tail[1];
  return tail[0] ? tail_bytes(tail[0], D) : 0;
}

/* Whether the post kernel has work: the persistent kernel (sm90's) converts
 * dq itself where it splits no tile (templates/sm90/bwd.cuh,
 * fjhb_convert_dq); the split tiles' dk and dv, and every other kernel's
 * dq, are the post kernel's. */
static int post_needed(const fjg_config *cfg, const fjr_bwd_params_fixed *p) {
  return !cfg->persistent || p->tail_tiles > 0;
}

/* Entry `entry` of k, whose one parameter is the packed struct (pbuf, psize
 * bytes), or, with maps, the sm90 main kernel's two: the struct and the
 * tensor maps; a plain launch (fjr_launch). */
static fj_status launch(fj_context *ctx, const fjr_kernel *k, int entry, const unsigned grid[3],
                        unsigned threads, unsigned smem, CUstream stream, void *pbuf,
                        size_t psize, const fjr_tma_bwd_maps *maps, const char *what) {
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, pbuf, CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &psize, CU_LAUNCH_PARAM_END};
  void *params[] = {pbuf, (void *)maps};
  return fjr_launch(ctx, k, entry, grid, threads, smem, stream, maps ? params : NULL,
                    maps ? NULL : extra, 0, what);
}

fj_status fj_attention_backward(fj_context *ctx, const fj_spec *spec,
                                const fj_backward_args *args) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!spec || !args) return fjr_fail(ctx, FJ_EINVAL, "fj_attention_backward: NULL argument");
  if (args->deterministic) {
    /* Buffers' gradients are added with atomics in no fixed order. */
    const fjg_graph *g = spec->graph;
    for (int a = 0; a < fjg_num_args(g); a++)
      if (fjg_arg_at(g, a)->trainable)
        return fjr_fail(ctx, FJ_EUNSUPPORTED,
                        "the deterministic backward does not cover trainable buffers: "
                        "spec '%s' trains '%s', whose gradient is added in no fixed order",
                        spec->name, fjg_arg_at(g, a)->name);
  }

  _Alignas(16) unsigned char pbuf[FJR_BWD_MAX_PARAM_BYTES];
  const size_t user_size = fjg_user_params_size(spec->graph);
  const size_t grads_at = (FJR_BWD_USER_OFFSET + user_size + 7u) & ~(size_t)7u;
  const size_t total = grads_at + fjg_user_grads_size(spec->graph);
  if (total > sizeof pbuf)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "kernel parameters too large");
  memset(pbuf, 0, total);
  fjr_bwd_params_fixed *p = (fjr_bwd_params_fixed *)pbuf;
  fj_dtype dtype = FJ_DTYPE_BF16;
  fj_status st = fjr_backward_check(ctx, args, &dtype, p);
  if (st != FJ_OK) return st;
  const int packed = p->cu_seqlens_q != 0;
  if ((st = fjr_offsets_bind(ctx, spec->graph, args->q_offset, args->kv_offset, packed,
                             &p->sz)) != FJ_OK)
    return st;
  if ((st = fjr_bind_args(ctx, spec->name, spec->graph, args->args, args->num_args,
                          pbuf + FJR_BWD_USER_OFFSET)) != FJ_OK ||
      (st = bind_grads(ctx, spec, args->args, args->num_args, pbuf + grads_at)) != FJ_OK)
    return st;
  const int64_t B = p->sz.B, Hq = p->sz.Hq, Lq = p->sz.Lq;
  const int64_t D = args->q->shape[args->q->ndim - 1];
  size_t at[3];
  scratch_layout((packed ? 1 : B) * Hq * p->acc_sh, B, Hq, Lq, D, at);
  const size_t need = at[2];
  if (args->workspace && ((uintptr_t)args->workspace % FJR_SCRATCH_ALIGN != 0 ||
                          args->workspace_bytes < need))
    return fjr_fail(ctx, FJ_EINVAL,
                    "workspace: %zu bytes at an address %% 256 = %zu; the backward needs %zu "
                    "bytes, 256-byte aligned (fj_backward_workspace_size%s)",
                    args->workspace_bytes, (size_t)((uintptr_t)args->workspace % 256), need,
                    packed ? "; for a packed batch, of B, Hq, max_seqlen_q + 64 and D" : "");
  if ((st = fjr_context_device(ctx, NULL)) != FJ_OK) return st;

  /* The kernel's query tiles depend on the block mask's block_q. */
  fj_block_mask_info mi = {0};
  if (args->block_mask && fj_block_mask_get_info(args->block_mask, &mi) != FJ_OK)
    return fjr_fail(ctx, FJ_EINVAL, "fj_attention_backward: bad block mask");
  const fj_kernel_options ko = {.head_dim = (int)D, .dtype = dtype,
                                .block_mask_block_q = mi.block_q,
                                .deterministic = args->deterministic ? 1 : 0,
                                .varlen = packed};
  fjg_config cfg;
  fjr_kernel *k = NULL;
  if ((st = backward_config(ctx, &ko, &cfg)) != FJ_OK ||
      (st = fjr_kernel_get(ctx, (fj_spec *)spec, &backward_kind, &cfg, &k, NULL)) != FJ_OK ||
      (st = fjr_kernel_load(ctx, k)) != FJ_OK)
    return st;
  st = fjr_block_mask_bind_bwd(ctx, args->block_mask, &p->sz, k->cfg.block_m, k->cfg.block_n,
                               p);
  if (st != FJ_OK) return st;

  const int64_t nkv = (p->sz.Lk + k->cfg.block_n - 1) / k->cfg.block_n;
  unsigned cols[3];
  fjr_kernel_grid(&k->cfg, ctx->num_sms, nkv, p->sz.Hkv, B, cols);
  /* The persistent kernel's tile order and takes (the one-tile kernel reads
   * neither). */
  size_t take = need;
  p->kv_head_group = 1;
  if (k->cfg.persistent) {
    p->kv_head_group = tile_group(ctx, spec, args, &k->cfg, p, cols[0], nkv, D);
    take += tail_split(spec, args, &k->cfg, p, cols[0], nkv, D,
                       args->workspace ? args->workspace_bytes - need : SIZE_MAX);
  }

  CUstream stream = (CUstream)args->stream;
  CUdeviceptr scratch = (CUdeviceptr)(uintptr_t)args->workspace;
  if (!scratch) {
    CUmemoryPool pool = fjr_context_pool(ctx);
    CUresult r = pool ? ctx->drv->cuMemAllocFromPoolAsync(&scratch, take, pool, stream)
                      : ctx->drv->cuMemAllocAsync(&scratch, take, stream);
    if (r != CUDA_SUCCESS) return fjr_cu_fail(ctx, "allocating the backward's scratch", r);
  }
  p->delta = scratch;
  p->dq_accum = scratch + at[0];
  p->dq_sem = scratch + at[1];
  p->dkv_accum = p->tail_tiles ? scratch + at[2] : 0;
  _Alignas(128) fjr_tma_bwd_maps maps;
  if (k->cfg.uses_tma) {
    char err[512];
    /* Packed q and k: their dimension 0. */
    const fjr_tma_rows rows = {args->cu_seqlens_q ? args->q->shape[0] : 0,
                               args->cu_seqlens_k ? args->k->shape[0] : 0};
    st = fjr_tma_bwd_maps_build(ctx->drv, &k->cfg, p, &rows, &maps, err, sizeof err);
    if (st != FJ_OK) {
      if (!args->workspace) ctx->drv->cuMemFreeAsync(scratch, stream);
      return fjr_fail(ctx, st, "%s", err);
    }
  }

  const unsigned rows[3] = {(unsigned)((Lq + FJG_BWD_ROW_BLOCK - 1) / FJG_BWD_ROW_BLOCK),
                            (unsigned)Hq, (unsigned)B};
  if ((st = launch(ctx, k, BWD_PRE, rows, FJG_BWD_ROW_THREADS, 0, stream, pbuf, total, NULL,
                   "cuLaunchKernelEx (fj_attention_bwd_pre)")) == FJ_OK &&
      (st = launch(ctx, k, BWD_MAIN, cols, (unsigned)k->cfg.threads,
                   (unsigned)k->cfg.smem_bytes, stream, pbuf, total,
                   k->cfg.uses_tma ? &maps : NULL, "cuLaunchKernelEx (fj_attention_bwd)")) ==
          FJ_OK &&
      post_needed(&k->cfg, p))
    st = launch(ctx, k, BWD_POST, rows, FJG_BWD_ROW_THREADS, 0, stream, pbuf, total, NULL,
                "cuLaunchKernelEx (fj_attention_bwd_post)");
  if (!args->workspace) {
    CUresult rf = ctx->drv->cuMemFreeAsync(scratch, stream);
    if (st == FJ_OK && rf != CUDA_SUCCESS) st = fjr_cu_fail(ctx, "cuMemFreeAsync", rf);
  }
  return st;
}
