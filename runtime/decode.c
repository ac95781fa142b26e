/*
 * runtime/decode.c: the serving kernels' launches (docs/serving.md): the
 * decode kernel with its split-KV plan and the LSE merge of its parts,
 * fj_merge_states and fj_paged_from_csr. The plan (row blocks, splits,
 * scratch) is a function of the batch shape alone, decided on the host per
 * launch in a few integer operations; every launch is stream-ordered
 * (scratch from the context's pool, or the caller's workspace), so the
 * whole sequence can be captured in a CUDA graph.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gen/emit_cuda.h"
#include "runtime/context_impl.h"
#include "runtime/decode.h"
#include "runtime/kernels.h"
#include "runtime/launch_params.h"
#include "runtime/tensor.h"

/* ---- kernel kinds ---- */

static fj_status emit_decode(const fjg_graph *g, const fjg_config *cfg, fjg_buf *out) {
  return fjg_emit_kernel_tu(g, cfg, "decode", out);
}

/* fj_dec_<spec>_d<D>_<dtype>_m<rows>_w<warps>_s<stages>_<arch> */
static void decode_name(const char *spec, const fjg_config *cfg, char *buf, size_t n) {
  snprintf(buf, n, "fj_dec_%s_d%d_%s_m%d_w%d_s%d_%s", spec, cfg->head_dim,
           cfg->dtype == FJ_DTYPE_BF16 ? "bf16" : "fp16", cfg->block_m, cfg->num_warps,
           cfg->num_stages, cfg->arch);
}

static const fjr_kernel_kind decode_kind = {
    .pass = "decode",
    .emit = emit_decode,
    .name = decode_name,
    .entries = {"fj_attention_decode"},
    .num_entries = 1,
    .tuned = 1,
};

static fj_status emit_util(const fjg_graph *g, const fjg_config *cfg, fjg_buf *out) {
  return fjg_emit_kernel_tu(g, cfg, "util", out);
}

static void util_name(const char *spec, const fjg_config *cfg, char *buf, size_t n) {
  (void)spec;
  snprintf(buf, n, "fj_util_%s", cfg->arch);
}

static const fjr_kernel_kind util_kind = {
    .pass = "util",
    .emit = emit_util,
    .name = util_name,
    .entries = {"fj_merge_states_kernel", "fj_paged_from_csr_kernel"},
    .num_entries = 2,
    .tuned = 0,
};

/* Host mirrors of templates/common/merge.cuh's parameter structs. */
typedef struct merge_params {
  uint64_t o_parts, lse_parts, o, lse;
  int64_t op_sn, op_sb, op_sh, op_sl;
  int64_t lp_sn, lp_sb, lp_sh, lp_sl;
  int64_t o_sb, o_sh, o_sl;
  int64_t l_sb, l_sh, l_sl;
  int32_t N, B, H, L, D;
  int32_t in_dtype, out_dtype;
  int32_t wpr;
} merge_params;

typedef struct csr_params {
  uint64_t indptr, indices, last_len, block_table, seqlens;
  int64_t bt_stride;
  int32_t B, max_pages, page_size;
} csr_params;

enum { MERGE_F32 = 0, MERGE_BF16 = 1, MERGE_F16 = 2 };

/* The merge kernel's warps a row for n segments: a warp loads 16 segments
 * at once (merge.cuh's FJM_UNROLL), so up to 64 arrive in one memory
 * latency; fewer warps where fewer suffice. */
static int merge_warps_per_row(int64_t n) { return n <= 16 ? 1 : n <= 32 ? 2 : 4; }

/* The merge kernel's grid: 4 warps a CTA. */
static unsigned merge_grid(int64_t rows, int wpr) { return (unsigned)((rows * wpr + 3) / 4); }

/* The util kernels for arch (NULL: the context's), compiled once per
 * target into the context's builtin spec, not loaded. */
static fj_status util_kernel_get(fj_context *ctx, const char *arch, fjr_kernel **out,
                                 int *resident) {
  fj_status st;
  if (!ctx->builtin) {
    static const char src[] = "return { name = \"builtin\", mask_mod = noop_mask() }";
    if ((st = fj_spec_load_string(ctx, src, sizeof src - 1, "builtin", &ctx->builtin)) != FJ_OK)
      return st;
  }
  if (!arch && (st = fjr_context_arch(ctx, &arch)) != FJ_OK) return st;
  fjg_config cfg;
  char err[512];
  if ((st = fjg_config_choose_util(FJ_DTYPE_BF16, arch, &cfg, err, sizeof err)) != FJ_OK)
    return fjr_fail(ctx, st, "%s", err);
  return fjr_kernel_get(ctx, ctx->builtin, &util_kind, &cfg, out, resident);
}

/* The util kernels, loaded. */
static fj_status util_kernel(fj_context *ctx, fjr_kernel **out) {
  fj_status st = util_kernel_get(ctx, NULL, out, NULL);
  return st == FJ_OK ? fjr_kernel_load(ctx, *out) : st;
}

/* The decode kernel's configuration for o, a group of `rows` packed rows
 * and `warps` (4 or 8); quiet: FJ_EUNSUPPORTED where it does not fit the
 * target (8 warps at D=128 on parts of 100 KiB a multiprocessor), err
 * saying why. */
static fj_status decode_config(fj_context *ctx, const fj_kernel_options *o, int rows, int warps,
                               fjg_config *cfg, char *err, size_t errlen) {
  const char *arch = o->arch;
  fj_status st;
  if (!arch && (st = fjr_context_arch(ctx, &arch)) != FJ_OK) {
    snprintf(err, errlen, "%s", fj_context_last_error(ctx));
    return st;
  }
  return fjg_config_choose_decode(o->head_dim, o->dtype, arch, rows, warps, 0, cfg, err, errlen);
}

/* after_kernel: the launch follows a kernel of ours on the stream (the
 * decode's merge), and on sm_90 and newer is a programmatic dependent
 * launch: it may start while that kernel finishes (the decode kernel
 * allows it after its main loop), and waits for its results at
 * fj_grid_dep_wait (merge.cuh). The public fj_merge_states follows the
 * caller's work, so it is launched plainly. */
static fj_status launch_util(fj_context *ctx, fjr_kernel *k, int entry, const void *params,
                             size_t size, unsigned gx, unsigned gy, CUstream stream,
                             int after_kernel) {
  size_t psize = size;
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, (void *)params, CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &psize, CU_LAUNCH_PARAM_END};
  const unsigned grid[3] = {gx, gy, 1};
  return fjr_launch(ctx, k, entry, grid, 128, 0, stream, NULL, extra, after_kernel,
                    "cuLaunchKernelEx");
}

/* ---- the decode plan ---- */

int fjr_decode_applies(const fj_forward_args *a) {
  return a->q && a->q->ndim == 4 && !a->cu_seqlens_q && a->q->shape[2] >= 1 &&
         a->q->shape[2] <= FJ_DECODE_MAX_Q && (a->q->shape[3] == 64 || a->q->shape[3] == 128);
}

/* The most splits a launch takes: 64, and no more than keep the partials
 * within 2^16 rows (33 MiB at D=128), which batches large enough to reach
 * that fill the GPU unsplit anyway. */
static int64_t max_splits(int64_t B, int64_t Hq, int64_t Lq) {
  const int64_t rows = B * Hq * Lq;
  int64_t s = rows > 0 ? 65536 / rows : 1;
  return s < 1 ? 1 : s > 64 ? 64 : s;
}

/* Partial O, then partial LSE at the next 256 bytes. */
static size_t parts_bytes(int64_t splits, int64_t B, int64_t Hq, int64_t Lq, int64_t D,
                          size_t *lse_offset) {
  const size_t rows = (size_t)(splits * B * Hq * Lq);
  const size_t o = (rows * (size_t)D * 4 + 255) & ~(size_t)255;
  if (lse_offset) *lse_offset = o;
  return o + rows * 4;
}

size_t fjr_decode_workspace_size(int64_t B, int64_t Hq, int64_t Lq, int64_t D) {
  if (Lq < 1 || Lq > FJ_DECODE_MAX_Q || B < 1 || Hq < 1 || D < 1) return 0;
  return parts_bytes(max_splits(B, Hq, Lq), B, Hq, Lq, D, NULL);
}

/* CTAs enough for one on at least 90% of the multiprocessors. */
static int covers_gpu(int64_t ctas, int sms) { return ctas * 10 >= (int64_t)sms * 9; }

/* Splits of each CTA's kv run. CTAs that already cover nearly every
 * multiprocessor (90%) are not split: a split adds the partials and the
 * merge, and one CTA a multiprocessor streams as fast as two (docs/serving.md,
 * "Split-KV"; the 8-warp kernel takes most of these launches,
 * fjr_decode_warps). Fewer CTAs take the count that minimizes waves x
 * tiles per CTA over the `slots` that run at once, a split costing about
 * one tile more (its partials and the merge), at most `cap` and the tile
 * count; fewer splits unless more save 5%. */
static int choose_splits(int64_t ctas, int sms, int slots, int64_t tiles, int64_t cap) {
  if (covers_gpu(ctas, sms)) return 1;
  int best = 1;
  double best_cost = 0;
  for (int s = 1; s <= cap && s <= tiles; s++) {
    const int64_t waves = (ctas * s + slots - 1) / slots;
    const double cost = (double)waves * (double)((tiles + s - 1) / s) + (s > 1 ? 1.0 : 0.0);
    if (s == 1 || cost < best_cost * 0.95) best = s, best_cost = cost;
  }
  return best;
}

static int64_t row_blocks_of(int64_t Hq, int64_t Hkv, int64_t Lq, int block_m) {
  return (Hq / Hkv * Lq + block_m - 1) / block_m;
}

/* Eight warps (two slices in flight each, one CTA a multiprocessor) where
 * the unsplit CTAs fill one wave of one CTA a multiprocessor (90% to all),
 * from a contiguous cache or pages of 16 or 32 rows: there they stream
 * faster than 4 warps, unsplit or split; from pages of 64 rows and more
 * they do not (docs/serving.md, "Eight warps where one wave fills the
 * GPU"). */
int fjr_decode_warps(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int block_m, int page_rows,
                     int sms) {
  const int64_t ctas = B * Hkv * row_blocks_of(Hq, Hkv, Lq, block_m);
  const int layout_pays = page_rows < 64; /* contiguous (0), or pages below 64 rows */
  return layout_pays && covers_gpu(ctas, sms) && ctas <= sms ? 8 : 4;
}

void fjr_decode_plan(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int block_m,
                     int block_n, int sms, int per_sm, int64_t *row_blocks, int *splits) {
  *row_blocks = row_blocks_of(Hq, Hkv, Lq, block_m);
  const int64_t tiles = (Lk + block_n - 1) / block_n;
  int64_t cap = max_splits(B, Hq, Lq);
  if (*row_blocks * cap > 65535) cap = 65535 / *row_blocks;
  sms = sms > 0 ? sms : 1;
  per_sm = per_sm > 0 ? per_sm : 1;
  *splits = Lk > 0 ? choose_splits(*row_blocks * Hkv * B, sms, sms * per_sm, tiles, cap) : 1;
}

fj_status fjr_decode_launch(fj_context *ctx, fj_spec *spec, const fj_forward_args *a,
                            fj_dtype dtype, void *pbuf, size_t psize) {
  fjr_fwd_params_fixed *p = (fjr_fwd_params_fixed *)pbuf;
  const int64_t B = p->sz.B, Hq = p->sz.Hq, Hkv = p->sz.Hkv, Lq = p->sz.Lq, Lk = p->sz.Lk;
  const int D = (int)a->q->shape[3];
  const int64_t rows = (int64_t)p->kv_group * Lq;
  /* The kernel's kv indices are 32-bit, and run a tile past Lk. */
  if (Lk > INT32_MAX - 128)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "kv length %lld: the decode kernel takes below 2^31 - 128",
                    (long long)Lk);
  const fj_kernel_options ko = {.head_dim = D, .dtype = dtype};
  const int group_rows = (int)(rows < 32 ? rows : 32);
  const int page_rows = a->block_table ? (int)a->k->shape[1] : 0;
  /* The 4-warp configuration, or the 8-warp one where fjr_decode_warps
   * asks for it and it fits the target. */
  fjg_config cfg, wide;
  char err[512];
  fj_status st = decode_config(ctx, &ko, group_rows, 4, &cfg, err, sizeof err);
  if (st != FJ_OK) return fjr_fail(ctx, st, "%s", err);
  if (fjr_decode_warps(B, Hq, Hkv, Lq, cfg.block_m, page_rows, ctx->num_sms) == 8 &&
      decode_config(ctx, &ko, group_rows, 8, &wide, err, sizeof err) == FJ_OK)
    cfg = wide;
  fjr_kernel *k = NULL;
  if ((st = fjr_kernel_get(ctx, spec, &decode_kind, &cfg, &k, NULL)) != FJ_OK ||
      (st = fjr_kernel_load(ctx, k)) != FJ_OK)
    return st;

  int64_t row_blocks = 1;
  int splits = 1;
  fjr_decode_plan(B, Hq, Hkv, Lq, Lk, cfg.block_m, cfg.block_n, ctx->num_sms,
                  fjr_kernel_occupancy(ctx, k), &row_blocks, &splits);
  CUstream stream = (CUstream)a->stream;

  /* The merge is ready before anything is launched: a launch that cannot
   * finish does not start. */
  fjr_kernel *u = NULL;
  if (splits > 1 && (st = util_kernel(ctx, &u)) != FJ_OK) return st;
  CUdeviceptr parts = 0;
  int owned = 0;
  size_t lse_off = 0;
  if (splits > 1) {
    const size_t need = parts_bytes(splits, B, Hq, Lq, D, &lse_off);
    if (a->workspace) {
      parts = (CUdeviceptr)(uintptr_t)a->workspace; /* its size is checked by the caller */
    } else {
      CUmemoryPool pool = fjr_context_pool(ctx);
      CUresult r = pool ? ctx->drv->cuMemAllocFromPoolAsync(&parts, need, pool, stream)
                        : ctx->drv->cuMemAllocAsync(&parts, need, stream);
      if (r != CUDA_SUCCESS) return fjr_cu_fail(ctx, "cuMemAllocAsync (decode partials)", r);
      owned = 1;
    }
    p->part_o = (uint64_t)parts;
    p->part_lse = (uint64_t)parts + lse_off;
  }
  p->num_splits = splits;

  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, pbuf, CU_LAUNCH_PARAM_BUFFER_SIZE, &psize,
                   CU_LAUNCH_PARAM_END};
  CUresult r = ctx->drv->cuLaunchKernel(k->fn[0], (unsigned)(row_blocks * splits), (unsigned)Hkv,
                                        (unsigned)B, (unsigned)cfg.threads, 1, 1,
                                        (unsigned)cfg.smem_bytes, stream, NULL, extra);
  if (r != CUDA_SUCCESS) st = fjr_cu_fail(ctx, "cuLaunchKernel", r);
  if (st == FJ_OK && splits > 1) {
    const int64_t rs = Lq, hs = Lq * Hq, bs = Lq * Hq * B;
    const merge_params m = {
        .o_parts = p->part_o, .lse_parts = p->part_lse, .o = p->o, .lse = p->lse,
        .op_sn = bs * D, .op_sb = hs * D, .op_sh = rs * D, .op_sl = D,
        .lp_sn = bs, .lp_sb = hs, .lp_sh = rs, .lp_sl = 1,
        .o_sb = p->o_sb, .o_sh = p->o_sh, .o_sl = p->o_ss,
        .l_sb = p->lse_sb, .l_sh = p->lse_sh, .l_sl = 1,
        .N = splits, .B = (int32_t)B, .H = (int32_t)Hq, .L = (int32_t)Lq, .D = D,
        .in_dtype = MERGE_F32, .out_dtype = dtype == FJ_DTYPE_BF16 ? MERGE_BF16 : MERGE_F16,
        .wpr = merge_warps_per_row(splits)};
    st = launch_util(ctx, u, 0, &m, sizeof m, merge_grid(B * Hq * Lq, m.wpr), 1, stream, 1);
  }

  if (owned) {
    CUresult rf = ctx->drv->cuMemFreeAsync(parts, stream);
    if (st == FJ_OK && rf != CUDA_SUCCESS) st = fjr_cu_fail(ctx, "cuMemFreeAsync", rf);
  }
  return st;
}

fj_status fjr_compile_decode_all(fj_context *ctx, const fj_spec *spec,
                                 const fj_kernel_options *o,
                                 fj_kernel_info info[FJR_DECODE_KERNELS], int *count) {
  fjr_kernel *k = NULL;
  int resident = 0;
  fj_status st = FJ_OK;
  /* In decode.h's order; rows 0: the util kernels. */
  static const struct {
    int rows, warps;
  } kernels[FJR_DECODE_KERNELS] = {{16, 4}, {0, 0}, {32, 4}, {16, 8}, {32, 8}};
  *count = 0;
  for (int i = 0; i < FJR_DECODE_KERNELS && st == FJ_OK; i++) {
    if (kernels[i].rows == 0) {
      st = util_kernel_get(ctx, o->arch, &k, &resident);
    } else {
      fjg_config c;
      char err[512];
      const fj_status cs =
          decode_config(ctx, o, kernels[i].rows, kernels[i].warps, &c, err, sizeof err);
      if (cs != FJ_OK && kernels[i].warps == 8)
        continue; /* the launch does not take it on this target either */
      st = cs != FJ_OK ? fjr_fail(ctx, cs, "%s", err)
                       : fjr_kernel_get(ctx, (fj_spec *)spec, &decode_kind, &c, &k, &resident);
    }
    if (st == FJ_OK) fjr_kernel_info(k, resident, &info[(*count)++]);
  }
  return st;
}

fj_status fj_compile_decode(fj_context *ctx, const fj_spec *spec, const fj_kernel_options *o,
                            fj_kernel_info *info) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!spec || !o) return fjr_fail(ctx, FJ_EINVAL, "fj_compile_decode: NULL argument");
  fj_kernel_info all[FJR_DECODE_KERNELS];
  int n = 0;
  fj_status st = fjr_compile_decode_all(ctx, spec, o, all, &n);
  if (st == FJ_OK && info) *info = all[2];
  return st;
}

/* ---- fj_merge_states ---- */

static int merge_dtype(const DLTensor *t) {
  if (fjr_tensor_is(t, kDLFloat, 32)) return MERGE_F32;
  if (fjr_tensor_is(t, kDLBfloat, 16)) return MERGE_BF16;
  if (fjr_tensor_is(t, kDLFloat, 16)) return MERGE_F16;
  return -1;
}

fj_status fj_merge_states(fj_context *ctx, const fj_merge_args *a) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!a || !a->o_parts || !a->lse_parts || !a->o)
    return fjr_fail(ctx, FJ_EINVAL, "fj_merge_states: o_parts, lse_parts and o are required");
  const DLTensor *op = a->o_parts, *lp = a->lse_parts, *o = a->o;
  const int in = op->ndim == 5 ? merge_dtype(op) : -1;
  const int out = o->ndim == 4 ? merge_dtype(o) : -1;
  if (in < 0)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "o_parts must be a 5-D [N, B, H, L, D] tensor of float32, bfloat16 or "
                    "float16");
  if (out != MERGE_BF16 && out != MERGE_F16)
    return fjr_fail(ctx, FJ_ETENSOR, "o must be a 4-D [B, H, L, D] tensor of bfloat16 or float16");
  int64_t ops[5], lps[4], os[4], ls[3] = {0, 0, 1};
  const DLDataType f32 = {kDLFloat, 32, 1};
  fj_status st;
  if ((st = fjr_tensor_check(ctx, "o_parts", op, 5, op->dtype, ops)) != FJ_OK ||
      (st = fjr_tensor_check(ctx, "lse_parts", lp, 4, f32, lps)) != FJ_OK ||
      (st = fjr_tensor_check(ctx, "o", o, 4, o->dtype, os)) != FJ_OK)
    return st;
  const int64_t N = op->shape[0], B = op->shape[1], H = op->shape[2], L = op->shape[3],
                D = op->shape[4];
  const int64_t lshape[4] = {N, B, H, L}, oshape[4] = {B, H, L, D}, l3[3] = {B, H, L};
  if ((st = fjr_tensor_check_shape(ctx, "lse_parts", lp, lshape)) != FJ_OK ||
      (st = fjr_tensor_check_shape(ctx, "o", o, oshape)) != FJ_OK)
    return st;
  if (a->lse && ((st = fjr_tensor_check(ctx, "lse", a->lse, 3, f32, ls)) != FJ_OK ||
                 (st = fjr_tensor_check_shape(ctx, "lse", a->lse, l3)) != FJ_OK))
    return st;
  const int esz = in == MERGE_F32 ? 4 : 2;
  if (fjr_tensor_ptr(op) % (uint64_t)esz || fjr_tensor_ptr(lp) % 4 || fjr_tensor_ptr(o) % 2 ||
      (a->lse && fjr_tensor_ptr(a->lse) % 4))
    return fjr_fail(ctx, FJ_ETENSOR, "fj_merge_states: a tensor's address is not a multiple of "
                    "its element size");
  if (D % 8 != 0 || D > 256)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "head dim %lld: fj_merge_states takes multiples of 8 "
                    "up to 256", (long long)D);
  const int wpr = merge_warps_per_row(N);
  if (N > 65535 || B * H * L * wpr > (int64_t)4 * 2147483647LL || B > INT32_MAX ||
      H > INT32_MAX || L > INT32_MAX)
    return fjr_fail(ctx, FJ_ETENSOR, "fj_merge_states: sizes too large");
  if ((st = fjr_context_device(ctx, NULL)) != FJ_OK) return st;
  fjr_kernel *u = NULL;
  if ((st = util_kernel(ctx, &u)) != FJ_OK) return st;
  const merge_params m = {
      .o_parts = fjr_tensor_ptr(op), .lse_parts = fjr_tensor_ptr(lp), .o = fjr_tensor_ptr(o),
      .lse = a->lse ? fjr_tensor_ptr(a->lse) : 0,
      .op_sn = ops[0], .op_sb = ops[1], .op_sh = ops[2], .op_sl = ops[3],
      .lp_sn = lps[0], .lp_sb = lps[1], .lp_sh = lps[2], .lp_sl = lps[3],
      .o_sb = os[0], .o_sh = os[1], .o_sl = os[2],
      .l_sb = ls[0], .l_sh = ls[1], .l_sl = ls[2],
      .N = (int32_t)N, .B = (int32_t)B, .H = (int32_t)H, .L = (int32_t)L, .D = (int32_t)D,
      .in_dtype = in, .out_dtype = out, .wpr = wpr};
  return launch_util(ctx, u, 0, &m, sizeof m, merge_grid(B * H * L, wpr), 1,
                     (CUstream)a->stream, 0);
}

/* ---- fj_paged_from_csr ---- */

fj_status fj_paged_from_csr(fj_context *ctx, const fj_paged_csr_args *a) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!a || !a->kv_indptr || !a->kv_indices || !a->kv_last_page_len || !a->block_table ||
      !a->seqlens_k)
    return fjr_fail(ctx, FJ_EINVAL,
                    "fj_paged_from_csr: kv_indptr, kv_indices, kv_last_page_len, block_table "
                    "and seqlens_k are required");
  const DLDataType i32 = {kDLInt, 32, 1};
  int64_t s1[1], s2[2];
  fj_status st;
  if ((st = fjr_tensor_check(ctx, "kv_indptr", a->kv_indptr, 1, i32, s1)) != FJ_OK ||
      (st = fjr_tensor_check(ctx, "kv_indices", a->kv_indices, 1, i32, s1)) != FJ_OK ||
      (st = fjr_tensor_check(ctx, "kv_last_page_len", a->kv_last_page_len, 1, i32, s1)) !=
          FJ_OK ||
      (st = fjr_tensor_check(ctx, "seqlens_k", a->seqlens_k, 1, i32, s1)) != FJ_OK ||
      (st = fjr_tensor_check(ctx, "block_table", a->block_table, 2, i32, s2)) != FJ_OK)
    return st;
  const int64_t B = a->block_table->shape[0], max_pages = a->block_table->shape[1];
  if (a->page_size < 16 || a->page_size > 256 || a->page_size % 16 != 0 ||
      max_pages > INT32_MAX / a->page_size || B > 65535)
    return fjr_fail(ctx, FJ_EINVAL,
                    "fj_paged_from_csr: page_size %d must be a multiple of 16 up to 256 (what "
                    "the kernels take), max_pages x page_size below 2^31 and B at most 65535",
                    a->page_size);
  const int64_t ip[1] = {B + 1}, b1[1] = {B};
  if ((st = fjr_tensor_check_shape(ctx, "kv_indptr", a->kv_indptr, ip)) != FJ_OK ||
      (st = fjr_tensor_check_shape(ctx, "kv_last_page_len", a->kv_last_page_len, b1)) != FJ_OK ||
      (st = fjr_tensor_check_shape(ctx, "seqlens_k", a->seqlens_k, b1)) != FJ_OK)
    return st;
  if ((st = fjr_context_device(ctx, NULL)) != FJ_OK) return st;
  fjr_kernel *u = NULL;
  if ((st = util_kernel(ctx, &u)) != FJ_OK) return st;
  const csr_params c = {.indptr = fjr_tensor_ptr(a->kv_indptr),
                        .indices = fjr_tensor_ptr(a->kv_indices),
                        .last_len = fjr_tensor_ptr(a->kv_last_page_len),
                        .block_table = fjr_tensor_ptr(a->block_table),
                        .seqlens = fjr_tensor_ptr(a->seqlens_k),
                        .bt_stride = s2[0],
                        .B = (int32_t)B,
                        .max_pages = (int32_t)max_pages,
                        .page_size = a->page_size};
  return launch_util(ctx, u, 1, &c, sizeof c, (unsigned)((max_pages + 127) / 128), (unsigned)B,
                     (CUstream)a->stream, 0);
}
