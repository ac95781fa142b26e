/*
 * runtime/forward.c: the forward pass: its kernel configuration (decided
 * here, once, for compiling, emitting and launching alike), and the launch:
 * tensor checks, the one parameter struct, the block mask, the TMA maps and
 * cuLaunchKernel on the caller's stream.
 *
 * Launch path after the first call: the configuration (a few integer
 * decisions), a walk of the spec's short kernel table, tensor checks, one
 * memcpy-sized pack and cuLaunchKernel. No Lua, no file I/O, no hashing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/emit_cuda.h"
#include "gen/interval.h"
#include "runtime/args.h"
#include "runtime/blockmask.h"
#include "runtime/context_impl.h"
#include "runtime/decode.h"
#include "runtime/forward.h"
#include "runtime/kernels.h"
#include "runtime/launch_params.h"
#include "runtime/serving.h"
#include "runtime/tensor.h"
#include "runtime/tma.h"

#define FJR_MAX_PARAM_BYTES 4096

/* ---- the kernel kind ---- */

static fj_status emit_forward(const fjg_graph *g, const fjg_config *cfg, fjg_buf *out) {
  return fjg_emit_forward_tu(g, cfg, out);
}

/* fj_fwd_<spec>_d<D>_<dtype>_<template>[p][_m<rows>][_n<kv rows>]_<arch>: an
 * sm90 tile of other than the default rows (D=64's 128-row kernel for block
 * masks) says so with _m<rows>, and of other than the default kv rows (the
 * long-row variant) with _n<kv rows>. */
static void forward_name(const char *spec, const fjg_config *cfg, char *buf, size_t n) {
  int bm = 0, bn = 0;
  char rows[16] = "", kv_rows[16] = "";
  if (cfg->uses_tma && fjg_sm90_tile(cfg->head_dim, &bm, &bn) == 0) {
    if (bm != cfg->block_m) snprintf(rows, sizeof rows, "_m%d", cfg->block_m);
    if (bn != cfg->block_n) snprintf(kv_rows, sizeof kv_rows, "_n%d", cfg->block_n);
  }
  snprintf(buf, n, "fj_fwd_%s_d%d_%s_%s%s%s%s%s%s_%s", spec, cfg->head_dim,
           cfg->dtype == FJ_DTYPE_BF16 ? "bf16" : "fp16", cfg->template_name,
           cfg->persistent ? "p" : "", rows, kv_rows, cfg->varlen ? "_varlen" : "",
           cfg->skip ? "_skip" : "", cfg->arch);
}

static const fjr_kernel_kind forward_kind = {
    .pass = "forward",
    .emit = emit_forward,
    .name = forward_name,
    .entries = {"fj_attention_fwd"},
    .num_entries = 1,
    .tuned = 1,
};

/* ---- the configuration ---- */

/* Whether the sm90 tiles fit a block mask of block_q x block_kv blocks
 * (block_q 0: no mask); when not, the sm80 template's smaller tiles are
 * the default choice for it, if it has the head dim (not 256). */
static int sm90_fits_mask(int head_dim, fj_dtype dtype, int block_q, int block_kv) {
  int bm = 0, bn = 0;
  if (!block_q || fjg_sm90_tile(head_dim, &bm, &bn) != 0) return 1;
  if (fjg_sm90_block_m_for(bm, block_q) && block_kv % bn == 0) return 1;
  fjg_config c;
  return fjg_config_choose_template(head_dim, dtype, "sm_90a", "sm80", &c, NULL, 0) != FJ_OK;
}

/* The template: the caller's, else the context's, else sm90 (wgmma + TMA)
 * on sm_90a unless a block mask's blocks are not whole sm90 tiles, else
 * sm80. Both take the serving layouts (docs/serving.md). */
static const char *choose_template(const fj_context *ctx, const fj_kernel_options *o,
                                   const char *arch, int mask_block_kv) {
  if (o->kernel_template) return o->kernel_template;
  if (ctx->opts.kernel_template) return ctx->opts.kernel_template;
  if (strcmp(arch, "sm_90a") != 0) return "sm80";
  return sm90_fits_mask(o->head_dim, o->dtype, o->block_mask_block_q, mask_block_kv)
             ? "sm90"
             : "sm80";
}

/* The sm90 kernel's query rows (64 a consumer warpgroup): the default (192
 * at head dim 64, 128 otherwise), else $FLEXJIT_CONSUMERS's; 128 for the
 * persistent kernel, and for block masks whose block_q is a multiple of 128
 * but not of the tile. 0 when FLEXJIT_CONSUMERS asked for a tile those
 * rules exclude. */
static int sm90_block_m(const fj_context *ctx, const fjg_config *cfg, int block_q) {
  int bm = cfg->block_m;
  if (ctx->opts.consumers) bm = 64 * ctx->opts.consumers;
  if (cfg->persistent) {
    if (ctx->opts.consumers && bm != FJG_SM90_PERSISTENT_BLOCK_M) return 0;
    bm = FJG_SM90_PERSISTENT_BLOCK_M;
  }
  /* A mask no sm90 tile fits keeps bm: the bind says why. One that another
   * tile fits takes it, unless FLEXJIT_CONSUMERS chose this one. */
  const int fit = fjg_sm90_block_m_for(bm, block_q);
  if (fit && fit != bm && ctx->opts.consumers) return 0;
  return fit ? fit : bm;
}

/* Whether the long-row variant may serve launches of g with these
 * options: a spec without a score_mod, whose registers beside the wider S
 * tile spill (unit/test_sm90_compile), a launch without a block mask (whose
 * 128-key blocks are not whole tiles), the serving layouts or Skip Softmax,
 * and no persistence, stages or consumers set by the environment (which it
 * keeps). Where the variant exists (head dim 128 on sm90) is the
 * configuration's (fjg_config_set_long_rows). */
static int long_rows_may_apply(const fj_context *ctx, const fjg_graph *g, int block_q,
                               int serving, int skip) {
  return !fjg_has_score_mod(g) && !block_q && !serving && !skip && ctx->opts.persistent < 0 &&
         !ctx->opts.stages && !ctx->opts.consumers;
}

/* The one place a forward kernel's configuration is decided: from the
 * options, the context's settings and, for a launch with a block mask, its
 * block_kv (0 when not known: compile and emit). o->varlen: the variant
 * for the serving layouts (runtime/serving.c; FJ_VARLEN), which a launch
 * with seqlens_k, block_table or cu_seqlens takes, so that the kernels
 * without them keep their sizes as constants; o->skip_softmax: the Skip
 * Softmax variant (FJ_SKIP); o->long_rows: the long-row variant where it
 * exists and may apply (long_rows_may_apply). */
static fj_status forward_config(fj_context *ctx, const fjg_graph *g,
                                const fj_kernel_options *o, int mask_block_kv,
                                fjg_config *cfg) {
  if (ctx->opts.bad[0]) return fjr_fail(ctx, FJ_EINVAL, "%s", ctx->opts.bad);
  const char *arch = o->arch;
  fj_status st;
  if (!arch && (st = fjr_context_arch(ctx, &arch)) != FJ_OK) return st;
  char err[1024];
  st = fjg_config_choose_template(o->head_dim, o->dtype, arch,
                                  choose_template(ctx, o, arch, mask_block_kv), cfg, err,
                                  sizeof err);
  if (st != FJ_OK) return fjr_fail(ctx, st, "%s", err);
  cfg->varlen = o->varlen ? 1 : 0;
  cfg->skip = o->skip_softmax ? 1 : 0;
  if (!cfg->uses_tma) return FJ_OK;
  if (ctx->opts.stages && fjg_config_set_stages(cfg, ctx->opts.stages) != 0)
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "FLEXJIT_STAGES=%d does not fit: the %s kernel at head dim %d "
                    "would need more shared memory than %s allows",
                    ctx->opts.stages, cfg->template_name, cfg->head_dim, cfg->arch);
  if (ctx->opts.persistent >= 0)
    fjg_config_set_persistent(cfg, ctx->opts.persistent);
  else if (cfg->skip)
    /* Skip Softmax's persistent kernel spills with the intra-warpgroup
     * overlap (its fallback drops the overlap); the one-tile kernel keeps
     * it without spilling (unit/test_sm90_compile). */
    fjg_config_set_persistent(cfg, 0);
  if (o->long_rows && long_rows_may_apply(ctx, g, o->block_mask_block_q, cfg->varlen, cfg->skip))
    (void)fjg_config_set_long_rows(cfg); /* -1: no such variant, the default stays */
  const int bm = sm90_block_m(ctx, cfg, o->block_mask_block_q);
  if (bm != cfg->block_m && (bm <= 0 || fjg_config_set_consumers(cfg, bm / 64) != 0))
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "FLEXJIT_CONSUMERS=%d: the sm90 kernel takes 2 consumer warpgroups, "
                    "or 3 at head dim 64, but not in the persistent kernel "
                    "(FLEXJIT_PERSISTENT=1) nor with a block mask of 128-row blocks; "
                    "head dim %d here",
                    ctx->opts.consumers, cfg->head_dim);
  return FJ_OK;
}

static fj_status check_kernel_options(fj_context *ctx, const fj_spec *spec,
                                      const fj_kernel_options *o) {
  if (!spec) return fjr_fail(ctx, FJ_EINVAL, "spec is NULL");
  if (!o) return fjr_fail(ctx, FJ_EINVAL, "kernel options are NULL");
  if (o->dtype != FJ_DTYPE_BF16 && o->dtype != FJ_DTYPE_F16)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "unsupported dtype %d", (int)o->dtype);
  if (o->block_mask_block_q < 0)
    return fjr_fail(ctx, FJ_EINVAL, "block_mask_block_q %d is negative",
                    o->block_mask_block_q);
  return FJ_OK;
}

/* fj_compile_forward's work, handing back the kernel. */
static fj_status compile_forward(fj_context *ctx, const fj_spec *spec,
                                 const fj_kernel_options *o, fjr_kernel **k,
                                 fj_kernel_info *info) {
  fjg_config cfg;
  int resident = 0;
  fj_status st = check_kernel_options(ctx, spec, o);
  if (st == FJ_OK) st = forward_config(ctx, spec->graph, o, 0, &cfg);
  if (st == FJ_OK) st = fjr_kernel_get(ctx, (fj_spec *)spec, &forward_kind, &cfg, k, &resident);
  if (st == FJ_OK && info) fjr_kernel_info(*k, resident, info);
  return st;
}

fj_status fj_compile_forward(fj_context *ctx, const fj_spec *spec,
                             const fj_kernel_options *opts, fj_kernel_info *info) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  fjr_kernel *k = NULL;
  return compile_forward(ctx, spec, opts, &k, info);
}

fj_status fjr_forward_cubin(fj_context *ctx, const fj_spec *spec,
                            const fj_kernel_options *opts, const void **data,
                            size_t *size) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  fjr_kernel *k = NULL;
  fj_status st = compile_forward(ctx, spec, opts, &k, NULL);
  if (st != FJ_OK) return st;
  if (!k->cubin)
    return fjr_fail(ctx, FJ_EINVAL,
                    "the kernel is loaded already: its cubin was handed to the driver");
  *data = k->cubin;
  *size = k->cubin_size;
  return FJ_OK;
}

fj_status fj_emit_forward_source(fj_context *ctx, const fj_spec *spec,
                                 const fj_kernel_options *opts, const char *path) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!path) return fjr_fail(ctx, FJ_EINVAL, "fj_emit_forward_source: path is NULL");
  fjg_config cfg;
  fj_status st = check_kernel_options(ctx, spec, opts);
  if (st == FJ_OK) st = forward_config(ctx, spec->graph, opts, 0, &cfg);
  if (st != FJ_OK) return st;
  fjg_buf src;
  fjc_key source_key;
  st = fjr_kernel_source(ctx, spec, &forward_kind, &cfg, &src, &source_key);
  if (st != FJ_OK) return st;
  FILE *f = fopen(path, "wb");
  if (!f) {
    fjg_buf_free(&src);
    return fjr_fail(ctx, FJ_EIO, "cannot write %s", path);
  }
  int bad = fwrite(src.data, 1, src.len - 1, f) != src.len - 1;
  if (fclose(f) != 0) bad = 1;
  fjg_buf_free(&src);
  if (bad) return fjr_fail(ctx, FJ_EIO, "writing %s failed", path);
  return FJ_OK;
}

/* ---- the launch ---- */

/* The sm90 persistent scheduler's tail (templates/sm90/scheduler.cuh): the
 * first 8 query blocks of every head (or all of them, if fewer) are dealt
 * out last, the shortest rows under causal, sliding-window and document
 * masks, so that a run of short items evens out the CTAs' finish. None
 * where Lk >= 2 Lq: a chunk of new tokens over a cache, whose bottom-right
 * rows are all about Lk long; with few query blocks a head every item would
 * be a tail item, all heads' KV groups streaming at once, where head by head
 * a group's items share K and V. The kernel reads it only when masked. */
static int32_t tail_rows(const fjg_config *cfg, int64_t Lq, int64_t Lk) {
  const int64_t m = (Lq + cfg->block_m - 1) / cfg->block_m;
  return Lk >= 2 * Lq ? 0 : (int32_t)(m < 8 ? m : 8);
}

/* The persistent kernel's work counter, zeroed in stream order, where CTAs
 * have more than one item to deal out: in the caller's workspace, else a
 * zeroed int of its own allocated here in stream order (*owned = 1: freed
 * after the launch the same way), so that launches in flight on other
 * streams never share it (about 2.5 us of host time a launch). *out = 0
 * without memory pools (the allocation refused): the kernel then takes its
 * items statically. */
static fj_status work_counter(fj_context *ctx, const fj_forward_args *a, CUstream stream,
                              CUdeviceptr *out, int *owned) {
  CUdeviceptr c = 0;
  *out = 0;
  *owned = 0;
  if (a->workspace) {
    c = (CUdeviceptr)(uintptr_t)a->workspace;
    CUresult r = ctx->drv->cuMemsetD32Async(c, 0, 1, stream);
    if (r != CUDA_SUCCESS) return fjr_cu_fail(ctx, "cuMemsetD32Async", r);
    *out = c;
    return FJ_OK;
  }
  CUmemoryPool pool = fjr_context_pool(ctx);
  CUresult ra = pool ? ctx->drv->cuMemAllocFromPoolAsync(&c, sizeof(int32_t), pool, stream)
                     : ctx->drv->cuMemAllocAsync(&c, sizeof(int32_t), stream);
  if (ra != CUDA_SUCCESS) return FJ_OK;
  CUresult r = ctx->drv->cuMemsetD32Async(c, 0, 1, stream);
  if (r != CUDA_SUCCESS) {
    ctx->drv->cuMemFreeAsync(c, stream);
    return fjr_cu_fail(ctx, "cuMemsetD32Async", r);
  }
  *out = c;
  *owned = 1;
  return FJ_OK;
}

/* The persistent kernel's counter, or the decode kernel's partials: a
 * launch uses one or the other. */
size_t fj_forward_workspace_size(int64_t B, int64_t Hq, int64_t Lq, int64_t D) {
  const size_t decode = fjr_decode_workspace_size(B, Hq, Lq, D);
  return decode > sizeof(int32_t) ? decode : sizeof(int32_t);
}

fj_status fjr_forward_check(fj_context *ctx, const fj_forward_args *a, fj_dtype *dtype,
                            fjr_fwd_params_fixed *p) {
  fjr_layout l;
  fj_status st = fjr_serving_layout(ctx, a, &l);
  if (st != FJ_OK) return st;
  const DLTensor *q = a->q, *k = a->k, *v = a->v, *o = a->o;
  /* q and o: [B, Hq, Lq, D], or packed [total_q, Hq, D]; k and v: [B, Hkv,
   * Lk, D], packed [total_k, Hkv, D] or page pools [num_pages, page_size,
   * Hkv, D]. */
  const int qnd = l.q_packed ? 3 : 4, knd = l.kv_packed ? 3 : 4;
  DLDataType dl;
  if ((st = fjr_tensor_query(ctx, q, qnd, dtype, &dl)) != FJ_OK) return st;
  int64_t qs[4], ks[4], vs[4], os[4], ls[3] = {0, 0, 1};
  if ((st = fjr_tensor_check(ctx, "q", q, qnd, dl, qs)) != FJ_OK ||
      (st = fjr_tensor_check(ctx, "k", k, knd, dl, ks)) != FJ_OK ||
      (st = fjr_tensor_check(ctx, "v", v, knd, dl, vs)) != FJ_OK ||
      (st = fjr_tensor_check(ctx, "o", o, qnd, dl, os)) != FJ_OK)
    return st;
  const int64_t Hq = q->shape[1], D = q->shape[qnd - 1];
  const int64_t Hkv = k->shape[l.kv_paged ? 2 : 1];
  if (D != 64 && D != 128 && D != 256)
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "head dim %lld is not supported (64, 128, or 256 on sm_90a)",
                    (long long)D);
  int64_t B = q->shape[0], Lq = l.q_packed ? a->max_seqlen_q : q->shape[2];
  int64_t Lk = l.kv_packed ? a->max_seqlen_k : k->shape[2];
  if (l.q_packed &&
      (st = fjr_varlen_bind(ctx, a->cu_seqlens_q, a->cu_seqlens_k, a->max_seqlen_q,
                            a->max_seqlen_k, &B, &p->cu_seqlens_q, &p->cu_seqlens_k)) !=
          FJ_OK)
    return st;
  int64_t kshape[4] = {B, Hkv, Lk, D};
  if (l.kv_packed) /* [total_k, Hkv, D] */
    kshape[0] = k->shape[0], kshape[1] = Hkv, kshape[2] = D;
  else if (l.kv_paged) /* [num_pages, page_size, Hkv, D] */
    kshape[0] = k->shape[0], kshape[1] = k->shape[1], kshape[2] = Hkv;
  if ((st = fjr_tensor_check_shape(ctx, "k", k, kshape)) != FJ_OK ||
      (st = fjr_tensor_check_shape(ctx, "v", v, kshape)) != FJ_OK ||
      (st = fjr_tensor_check_shape(ctx, "o", o, q->shape)) != FJ_OK)
    return st;
  if ((st = fjr_serving_bind(ctx, a, &l, B, &Lk, p)) != FJ_OK) return st;
  if (Hq % Hkv != 0)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "query heads (%lld) must be a multiple of key/value heads (%lld)",
                    (long long)Hq, (long long)Hkv);
  if (Lq > INT32_MAX || Lk > INT32_MAX || q->shape[0] > INT32_MAX ||
      k->shape[0] > INT32_MAX || B > 65535 || Hq > 65535)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "sizes too large: B <= 65535, H <= 65535, L and packed rows < 2^31");
  if ((st = fjr_tensor_check_aligned16(ctx, "q", q, qs)) != FJ_OK ||
      (st = fjr_tensor_check_aligned16(ctx, "k", k, ks)) != FJ_OK ||
      (st = fjr_tensor_check_aligned16(ctx, "v", v, vs)) != FJ_OK ||
      (st = fjr_tensor_check_aligned16(ctx, "o", o, os)) != FJ_OK)
    return st;
  if (a->lse) {
    /* [B, Hq, Lq], or [Hq, total_q] packed: its last dimension contiguous. */
    const DLDataType f32 = {kDLFloat, 32, 1};
    const int64_t lshape[3] = {l.q_packed ? Hq : B, l.q_packed ? q->shape[0] : Hq, Lq};
    if ((st = fjr_tensor_check(ctx, "lse", a->lse, l.q_packed ? 2 : 3, f32, ls)) != FJ_OK ||
        (st = fjr_tensor_check_shape(ctx, "lse", a->lse, lshape)) != FJ_OK)
      return st;
    if (l.q_packed) ls[1] = ls[0], ls[0] = 0;
  }
  float scale = a->scale;
  if (scale == 0.0f) scale = 1.0f / sqrtf((float)D);
  /* The kernels take each row's running max on q.k before scaling it
   * (when there is no score_mod): a negative scale would turn it into the
   * minimum. */
  if (!isfinite(scale) || scale < 0.0f)
    return fjr_fail(ctx, FJ_EINVAL, "scale %g must be positive and finite (0: 1/sqrt(D))",
                    (double)a->scale);

  p->q = fjr_tensor_ptr(q);
  p->k = fjr_tensor_ptr(k);
  p->v = fjr_tensor_ptr(v);
  p->o = fjr_tensor_ptr(o);
  p->lse = a->lse ? fjr_tensor_ptr(a->lse) : 0;
  /* Packed: rows are dimension 0 and a sequence's first row comes from
   * cu_seqlens (batch stride 0); paged: dimension 0 is the page. */
  if (l.q_packed) {
    p->q_sb = 0, p->q_sh = qs[1], p->q_ss = qs[0];
    p->o_sb = 0, p->o_sh = os[1], p->o_ss = os[0];
  } else {
    p->q_sb = qs[0], p->q_sh = qs[1], p->q_ss = qs[2];
    p->o_sb = os[0], p->o_sh = os[1], p->o_ss = os[2];
  }
  if (l.kv_packed) {
    p->k_sb = 0, p->k_sh = ks[1], p->k_ss = ks[0];
    p->v_sb = 0, p->v_sh = vs[1], p->v_ss = vs[0];
  } else if (l.kv_paged) {
    p->k_sb = ks[0], p->k_sh = ks[2], p->k_ss = ks[1];
    p->v_sb = vs[0], p->v_sh = vs[2], p->v_ss = vs[1];
  } else {
    p->k_sb = ks[0], p->k_sh = ks[1], p->k_ss = ks[2];
    p->v_sb = vs[0], p->v_sh = vs[1], p->v_ss = vs[2];
  }
  p->lse_sb = ls[0], p->lse_sh = ls[1];
  p->sz = (fjr_sizes){(int32_t)B, (int32_t)Hq, (int32_t)Hkv, (int32_t)Lq, (int32_t)Lk, 0, 0};
  p->kv_group = (int32_t)(Hq / Hkv);
  p->scale = scale;
  p->scale_log2 = scale * 1.4426950408889634f;
  return FJ_OK;
}

/* The keys a query row is allowed on average, estimated by the mask's
 * interval analysis at batch 0, head 0 (env: the launch's sizes, offsets
 * and params): for the query blocks of the sm90 tile at D=128 (128 rows)
 * at the middles of the four quarters of Lq, the keys of the kv chunks (about
 * Lk / 32 keys each, a multiple of 128) that are not EMPTY. An upper bound
 * of each block's rows by less than a chunk; of a mask that reads a buffer
 * only the index part counts (intervals cannot see the buffer's values). */
int64_t fjr_mean_row_keys(const fjg_graph *g, const fjg_env *env, int32_t Lq, int32_t Lk) {
  int rows = 0, kv_rows = 0;
  (void)fjg_sm90_tile(128, &rows, &kv_rows);
  const int32_t chunk = (Lk / 32 + 127) / 128 * 128 > rows ? (Lk / 32 + 127) / 128 * 128 : rows;
  int64_t keys = 0;
  for (int s = 0; s < 4; s++) {
    const int32_t q0 = (int32_t)((2 * s + 1) * (int64_t)Lq / 8) / rows * rows;
    const int32_t q1 = q0 + rows < Lq ? q0 + rows - 1 : Lq - 1;
    for (int32_t kv0 = 0; kv0 < Lk; kv0 += chunk) {
      const int32_t kv1 = Lk - kv0 > chunk ? kv0 + chunk - 1 : Lk - 1;
      if (fjg_tile_class_cpu(g, env, 0, 0, q0, q1, kv0, kv1) != FJG_TILE_EMPTY)
        keys += kv1 - kv0 + 1;
    }
  }
  return keys / 4;
}

/* A launch's fj_kernel_options.long_rows: whether the variant may serve it
 * (long_rows_may_apply; a launch it may not never asks, so its kernel has
 * one entry in the spec's launch memo) and its rows are long,
 * FJ_LONG_ROW_KEYS keys on average (p: its checked parameter block; block_q:
 * its block mask's, 0 for none). The estimate classifies up to 132 tiles on
 * the host; the spec keeps its last answer, which a launch of the same
 * sizes, offsets and param values takes. */
static int launch_long_rows(const fj_context *ctx, fj_spec *spec, const fj_forward_args *a,
                            const fjr_fwd_params_fixed *p, int block_q) {
  const int serving = p->seqlens_k || p->block_table || p->cu_seqlens_q;
  if (!long_rows_may_apply(ctx, spec->graph, block_q, serving,
                           a->skip_softmax_threshold > 0.0f))
    return 0;
  const fjr_sizes *sz = &p->sz;
  struct fjr_long_rows_memo now = {.valid = 1, .Lq = sz->Lq, .Lk = sz->Lk,
                                   .q_off = sz->q_off, .kv_off = sz->kv_off};
  (void)fjr_param_values(spec->graph, a->args, a->num_args, now.i32s, now.f32s);
  struct fjr_long_rows_memo *m = &spec->long_rows_memo;
  now.long_rows = m->long_rows;
  if (memcmp(m, &now, sizeof now) == 0) return m->long_rows;
  const fjg_env env = fjr_launch_env(sz, now.i32s, now.f32s);
  now.long_rows = fjr_mean_row_keys(spec->graph, &env, sz->Lq, sz->Lk) >= FJ_LONG_ROW_KEYS;
  *m = now;
  return now.long_rows;
}

/* A forward launch's parameter block in pbuf (FJR_MAX_PARAM_BYTES): its
 * tensors and serving fields checked, offsets and params bound; *dtype, and
 * *total, the block's bytes. */
static fj_status forward_params(fj_context *ctx, const fj_spec *spec, const fj_forward_args *a,
                                unsigned char *pbuf, fj_dtype *dtype, size_t *total) {
  *total = FJR_FWD_USER_OFFSET + fjg_user_params_size(spec->graph);
  if (*total > FJR_MAX_PARAM_BYTES)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "kernel parameters too large");
  memset(pbuf, 0, *total);
  fjr_fwd_params_fixed *p = (fjr_fwd_params_fixed *)pbuf;
  fj_status st = fjr_forward_check(ctx, a, dtype, p);
  if (st == FJ_OK)
    st = fjr_offsets_bind(ctx, spec->graph, a->q_offset, a->kv_offset, p->cu_seqlens_q != 0,
                          &p->sz);
  if (st == FJ_OK)
    st = fjr_bind_args(ctx, spec->name, spec->graph, a->args, a->num_args,
                       pbuf + FJR_FWD_USER_OFFSET);
  return st;
}

int fjr_forward_long_rows(fj_context *ctx, const fj_spec *spec, const fj_forward_args *a) {
  _Alignas(16) unsigned char pbuf[FJR_MAX_PARAM_BYTES];
  fj_dtype dtype;
  size_t total = 0;
  if (!ctx || !spec || !a || forward_params(ctx, spec, a, pbuf, &dtype, &total) != FJ_OK)
    return 0;
  fj_block_mask_info mi = {0};
  if (a->block_mask && fj_block_mask_get_info(a->block_mask, &mi) != FJ_OK) return 0;
  return launch_long_rows(ctx, (fj_spec *)spec, a, (const fjr_fwd_params_fixed *)pbuf,
                          mi.block_q);
}

/* The loaded kernel of a launch: from the spec's launch memo, else decided
 * (forward_config), made or found (runtime/kernels.c) and remembered. */
static fj_status launch_kernel(fj_context *ctx, fj_spec *spec, int head_dim, fj_dtype dtype,
                               int block_q, int block_kv, int serving, int skip,
                               int long_rows, fjr_kernel **out) {
  for (int i = 0; i < spec->num_launches; i++) {
    const struct fjr_launch_memo *m = &spec->launches[i];
    if (m->head_dim == head_dim && m->dtype == (int)dtype && m->block_q == block_q &&
        m->block_kv == block_kv && m->varlen == serving && m->skip == skip &&
        m->long_rows == long_rows) {
      *out = m->kernel;
      return FJ_OK;
    }
  }
  const fj_kernel_options ko = {.head_dim = head_dim, .dtype = dtype,
                                .block_mask_block_q = block_q, .varlen = serving,
                                .skip_softmax = skip, .long_rows = long_rows};
  fjg_config cfg;
  fj_status st;
  if ((st = forward_config(ctx, spec->graph, &ko, block_kv, &cfg)) != FJ_OK ||
      (st = fjr_kernel_get(ctx, spec, &forward_kind, &cfg, out, NULL)) != FJ_OK ||
      (st = fjr_kernel_load(ctx, *out)) != FJ_OK)
    return st;
  const int n = sizeof spec->launches / sizeof spec->launches[0];
  const int slot = spec->num_launches < n ? spec->num_launches++ : n - 1;
  spec->launches[slot] = (struct fjr_launch_memo){
      head_dim, (int)dtype, block_q, block_kv, serving, skip, long_rows, *out};
  return FJ_OK;
}

fj_status fj_attention_forward(fj_context *ctx, const fj_spec *spec,
                               const fj_forward_args *args) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!spec || !args) return fjr_fail(ctx, FJ_EINVAL, "fj_attention_forward: NULL argument");

  _Alignas(16) unsigned char pbuf[FJR_MAX_PARAM_BYTES];
  fjr_fwd_params_fixed *p = (fjr_fwd_params_fixed *)pbuf;
  fj_dtype dtype = FJ_DTYPE_BF16;
  size_t total = 0;
  fj_status st = forward_params(ctx, spec, args, pbuf, &dtype, &total);
  if (st != FJ_OK) return st;
  const size_t need = fj_forward_workspace_size(p->sz.B, p->sz.Hq, p->sz.Lq,
                                                args->q->shape[args->q->ndim - 1]);
  if (args->workspace && ((uintptr_t)args->workspace % 256 != 0 ||
                          args->workspace_bytes < need))
    return fjr_fail(ctx, FJ_EINVAL,
                    "workspace: %zu bytes at an address %% 256 = %zu; the forward needs %zu "
                    "bytes, 256-byte aligned (fj_forward_workspace_size)",
                    args->workspace_bytes, (size_t)((uintptr_t)args->workspace % 256), need);
  const int serving = p->seqlens_k || p->block_table || p->cu_seqlens_q;
  if (serving && args->block_mask)
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "a block mask with seqlens_k, block_table or cu_seqlens is not "
                    "supported (the mask_mod sees each sequence's own lengths instead)");
  /* Short queries go to the decode kernel, which classifies its own tiles
   * (a block mask, if any, is not needed there). */
  const int decode = fjr_decode_applies(args);
  const int skip = args->skip_softmax_threshold > 0.0f;
  if ((st = fjr_context_device(ctx, NULL)) != FJ_OK) return st;
  if (decode) return fjr_decode_launch(ctx, (fj_spec *)spec, args, dtype, pbuf, total);

  fj_block_mask_info mi = {0};
  if (args->block_mask && fj_block_mask_get_info(args->block_mask, &mi) != FJ_OK)
    return fjr_fail(ctx, FJ_EINVAL, "fj_attention_forward: bad block mask");
  fjr_kernel *k = NULL;
  const int long_rows = launch_long_rows(ctx, (fj_spec *)spec, args, p, mi.block_q);
  if ((st = launch_kernel(ctx, (fj_spec *)spec, (int)args->q->shape[args->q->ndim - 1], dtype,
                          mi.block_q, mi.block_kv, serving, skip, long_rows, &k)) != FJ_OK)
    return st;
  /* The block mask, if any: validated against this launch (blockmask.c). */
  st = fjr_block_mask_bind(ctx, args->block_mask, &p->sz, k->cfg.block_m, k->cfg.block_n, p);
  if (st != FJ_OK) return st;

  unsigned grid[3];
  const int64_t items =
      fjr_kernel_grid(&k->cfg, ctx->num_sms, (p->sz.Lq + k->cfg.block_m - 1) / k->cfg.block_m,
                      p->sz.Hq, p->sz.B, grid);
  p->tail_rows = tail_rows(&k->cfg, p->sz.Lq, p->sz.Lk);
  CUstream stream = (CUstream)args->stream;
  CUresult r;
  if (k->cfg.uses_tma) {
    /* TMA descriptors are a second __grid_constant__ parameter. */
    _Alignas(128) fjr_tma_maps maps;
    char err[512];
    /* Packed q, k, v and page pools: their dimension 0. */
    const fjr_tma_rows rows = {args->cu_seqlens_q ? args->q->shape[0] : 0,
                               args->cu_seqlens_k || args->block_table ? args->k->shape[0]
                                                                       : 0};
    st = fjr_tma_maps_build(ctx->drv, &k->cfg, p, &rows, &maps, err, sizeof err);
    if (st != FJ_OK) return fjr_fail(ctx, st, "%s", err);
    CUdeviceptr sched = 0;
    int owned = 0;
    if (k->cfg.persistent && items > (int64_t)grid[0] &&
        (st = work_counter(ctx, args, stream, &sched, &owned)) != FJ_OK)
      return st;
    maps.sched = (uint64_t)sched;
    void *kp[] = {pbuf, &maps};
    r = ctx->drv->cuLaunchKernel(k->fn[0], grid[0], grid[1], grid[2],
                                 (unsigned)k->cfg.threads, 1, 1,
                                 (unsigned)k->cfg.smem_bytes, stream, kp, NULL);
    if (owned) {
      CUresult rf = ctx->drv->cuMemFreeAsync(sched, stream);
      if (r == CUDA_SUCCESS && rf != CUDA_SUCCESS)
        return fjr_cu_fail(ctx, "cuMemFreeAsync", rf);
    }
  } else {
    size_t psize = total;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, pbuf, CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &psize, CU_LAUNCH_PARAM_END};
    r = ctx->drv->cuLaunchKernel(k->fn[0], grid[0], grid[1], grid[2],
                                 (unsigned)k->cfg.threads, 1, 1,
                                 (unsigned)k->cfg.smem_bytes, stream, NULL, extra);
  }
  if (r != CUDA_SUCCESS) return fjr_cu_fail(ctx, "cuLaunchKernel", r);
  return FJ_OK;
}
