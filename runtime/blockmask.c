/*
 * runtime/blockmask.c: block masks on the GPU (the fj_block_mask_* API of
 * include/flexjit.h) and their binding to a forward launch.
 *
 * A block mask owns one cuMemAlloc'd region holding the eight int32 arrays
 * and the nq x nkv class matrix they are compacted from, or borrows the
 * caller's (fj_block_mask_options.arrays; fj_block_mask_wrap, which has no
 * builder and makes a mask of arrays built elsewhere). Its builder
 * kernels (gen/emit_blockmask.c) are a kernel kind of runtime/kernels.c:
 * compiled or fetched like a forward kernel and loaded once per spec.
 * Building is asynchronous on the caller's stream; nothing here
 * synchronizes except fj_block_mask_download.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/blockmask_cpu.h"
#include "gen/emit_blockmask.h"
#include "gen/emit_cuda.h"
#include "runtime/args.h"
#include "runtime/blockmask.h"
#include "runtime/context_impl.h"
#include "runtime/kernels.h"
#include "runtime/serving.h"

#define FJR_BM_DEFAULT_BLOCK 128
#define FJR_BM_MAX_PARAM_BYTES 4096
#define FJR_BM_ALIGN 256

/* Host mirror of struct fj_bm_params (gen/emit_blockmask.c) up to `user`,
 * which follows at the next 8-byte boundary. */
typedef struct bm_params_fixed {
  uint64_t cls;
  uint64_t arrays[8]; /* fj_block_mask_array order */
  fjr_sizes sz;
  int32_t H, block_q, block_kv, nq, nkv;
} bm_params_fixed;

#define BM_USER_OFFSET ((sizeof(bm_params_fixed) + 7u) & ~(size_t)7u)

struct fj_block_mask {
  fj_context *ctx;     /* borrowed */
  const fj_spec *spec; /* borrowed: its graph packs the runtime values */
  int device;
  int B, H, q_len, kv_len, block_q, block_kv, nq, nkv;
  int q_off, kv_off; /* the whole sequence's positions of its first row, column */
  fjr_kernel *builder;  /* borrowed from the spec's kernel table; NULL wrapped */
  CUdeviceptr mem;      /* owned: the arrays and cls in one allocation; else 0 */
  CUdeviceptr arrays[FJ_BM_NUM_ARRAYS], cls;
  size_t counts[FJ_BM_NUM_ARRAYS];
  CUstream stream; /* of the last build, which download waits for */
};

void fj_block_mask_options_init(fj_block_mask_options *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->B = 1;
  opts->H = 1;
}

/* ---- the builder kernels ---- */

static fj_status emit_builder(const fjg_graph *g, const fjg_config *cfg, fjg_buf *out) {
  (void)cfg; /* the builder has one configuration per target */
  return fjg_emit_blockmask_tu(g, out);
}

/* fj_blockmask_<spec>_<arch>. */
static void builder_name(const char *spec, const fjg_config *cfg, char *buf, size_t n) {
  snprintf(buf, n, "fj_blockmask_%s_%s", spec, cfg->arch);
}

static const fjr_kernel_kind builder_kind = {
    .pass = "blockmask",
    .emit = emit_builder,
    .name = builder_name,
    .entries = {"fj_blockmask_classify", "fj_blockmask_compact"},
    .num_entries = 2,
    .tuned = 0,
};

enum { BUILDER_CLASSIFY = 0, BUILDER_COMPACT = 1 };

/* The spec's builder for arch (NULL: the context's target): one
 * configuration per target. */
static fj_status find_builder(fj_context *ctx, fj_spec *spec, const char *arch,
                              fjr_kernel **out, int *resident) {
  fj_status st;
  if (ctx->opts.bad[0]) return fjr_fail(ctx, FJ_EINVAL, "%s", ctx->opts.bad);
  if (!arch && (st = fjr_context_arch(ctx, &arch)) != FJ_OK) return st;
  fjg_config cfg;
  memset(&cfg, 0, sizeof cfg);
  char err[512];
  if ((st = fjg_arch_check(arch, &cfg.sm, err, sizeof err)) != FJ_OK)
    return fjr_fail(ctx, st, "%s", err);
  memcpy(cfg.arch, arch, strlen(arch) + 1);
  return fjr_kernel_get(ctx, spec, &builder_kind, &cfg, out, resident);
}

fj_status fj_compile_block_mask(fj_context *ctx, const fj_spec *spec, const char *arch,
                                fj_kernel_info *info) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!spec) return fjr_fail(ctx, FJ_EINVAL, "fj_compile_block_mask: spec is NULL");
  fjr_kernel *k = NULL;
  int resident = 0;
  fj_status st = find_builder(ctx, (fj_spec *)spec, arch, &k, &resident);
  if (st == FJ_OK && info) fjr_kernel_info(k, resident, info);
  return st;
}

/* ---- options, memory ---- */

static fj_status check_options(fj_context *ctx, const fj_block_mask_options *o,
                               int *block_q, int *block_kv) {
  if (o->B < 1 || o->H < 1)
    return fjr_fail(ctx, FJ_EINVAL,
                    "block mask: B (%d) and H (%d) must be >= 1 (1 "
                    "broadcasts)", o->B, o->H);
  if (o->q_len < 1 || o->kv_len < 1)
    return fjr_fail(ctx, FJ_EINVAL,
                    "block mask: q_len (%d) and kv_len (%d) must be >= 1",
                    o->q_len, o->kv_len);
  *block_q = o->block_q ? o->block_q : FJR_BM_DEFAULT_BLOCK;
  *block_kv = o->block_kv ? o->block_kv : FJR_BM_DEFAULT_BLOCK;
  if (*block_q < 1 || *block_kv < 1 || *block_q > (1 << 20) ||
      *block_kv > (1 << 20))
    return fjr_fail(ctx, FJ_EINVAL,
                    "block mask: block sizes %d x %d must be in [1, 2^20] "
                    "(0 means 128)", o->block_q, o->block_kv);
  if (o->num_args < 0 || (o->num_args > 0 && !o->args))
    return fjr_fail(ctx, FJ_EINVAL, "block mask: bad args array");
  if (o->arrays) {
    for (int i = 0; i < FJ_BM_NUM_ARRAYS; i++)
      if (!o->arrays[i] || o->arrays[i] % 4 != 0)
        return fjr_fail(ctx, FJ_EINVAL,
                        "block mask: array %d of opts->arrays is 0 or not 4-byte "
                        "aligned", i);
    if (!o->scratch)
      return fjr_fail(ctx, FJ_EINVAL,
                      "block mask: opts->arrays needs opts->scratch (B x H x nq x nkv "
                      "bytes)");
  }
  long long nq = (o->q_len + (long long)*block_q - 1) / *block_q;
  if (nq > 65535 || (long long)o->B * o->H > 65535)
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "block mask: at most 65535 query blocks (%lld) and "
                    "65535 batch x heads (%lld)",
                    nq, (long long)o->B * o->H);
  return FJ_OK;
}

/* The arrays and the class matrix (B x H x nq x nkv bytes): the caller's,
 * or one allocation of them all. */
static fj_status place_arrays(fj_block_mask *m, const fj_block_mask_options *o) {
  fjg_block_mask_counts(m->B, m->H, m->nq, m->nkv, m->counts);
  if (o->arrays) {
    for (int i = 0; i < FJ_BM_NUM_ARRAYS; i++) m->arrays[i] = o->arrays[i];
    m->cls = o->scratch;
    return FJ_OK;
  }
  size_t offsets[FJ_BM_NUM_ARRAYS + 1], at = 0;
  for (int i = 0; i <= FJ_BM_NUM_ARRAYS; i++) {
    offsets[i] = at;
    size_t bytes = i < FJ_BM_NUM_ARRAYS ? m->counts[i] * 4 : m->counts[1];
    at += (bytes + FJR_BM_ALIGN - 1) / FJR_BM_ALIGN * FJR_BM_ALIGN;
  }
  CUresult r = m->ctx->drv->cuMemAlloc(&m->mem, at);
  if (r != CUDA_SUCCESS) {
    m->mem = 0;
    return fjr_cu_fail(m->ctx, "cuMemAlloc (block mask)", r);
  }
  for (int i = 0; i < FJ_BM_NUM_ARRAYS; i++) m->arrays[i] = m->mem + offsets[i];
  m->cls = m->mem + offsets[FJ_BM_NUM_ARRAYS];
  return FJ_OK;
}

/* ---- runtime values and launches ---- */

static fj_status launch_builder(fj_block_mask *m, const fj_arg *args,
                                int num_args, void *stream) {
  fj_context *ctx = m->ctx;
  _Alignas(16) unsigned char pbuf[FJR_BM_MAX_PARAM_BYTES];
  size_t total = BM_USER_OFFSET + fjg_user_params_size(m->spec->graph);
  if (total > sizeof pbuf)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "block mask: parameters too large");
  memset(pbuf, 0, total);
  fj_status st = fjr_bind_args(ctx, m->spec->name, m->spec->graph, args, num_args,
                               pbuf + BM_USER_OFFSET);
  if (st != FJ_OK) return st;
  bm_params_fixed *p = (bm_params_fixed *)pbuf;
  p->cls = m->cls;
  for (int i = 0; i < FJ_BM_NUM_ARRAYS; i++) p->arrays[i] = m->arrays[i];
  p->sz = (fjr_sizes){m->B, m->H, m->H, m->q_len, m->kv_len, m->q_off, m->kv_off};
  p->H = m->H, p->block_q = m->block_q, p->block_kv = m->block_kv;
  p->nq = m->nq, p->nkv = m->nkv;

  const unsigned w = FJG_BLOCKMASK_WARPS, bh = (unsigned)(m->B * m->H);
  size_t psize = total;
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, pbuf,
                   CU_LAUNCH_PARAM_BUFFER_SIZE, &psize, CU_LAUNCH_PARAM_END};
  const fjr_driver *d = ctx->drv;
  CUresult r = d->cuLaunchKernel(m->builder->fn[BUILDER_CLASSIFY], ((unsigned)m->nkv + w - 1) / w,
                                 (unsigned)m->nq, bh, w * 32, 1, 1, 0,
                                 (CUstream)stream, NULL, extra);
  if (r != CUDA_SUCCESS)
    return fjr_cu_fail(ctx, "cuLaunchKernel (fj_blockmask_classify)", r);
  unsigned lines = (unsigned)(m->nq + m->nkv);
  r = d->cuLaunchKernel(m->builder->fn[BUILDER_COMPACT], (lines + w - 1) / w, bh, 1, w * 32, 1, 1,
                        0, (CUstream)stream, NULL, extra);
  if (r != CUDA_SUCCESS)
    return fjr_cu_fail(ctx, "cuLaunchKernel (fj_blockmask_compact)", r);
  m->stream = (CUstream)stream;
  return FJ_OK;
}

/* Broadcasting a mask that reads b or h evaluates it at 0 only: allowed
 * (FlexAttention does the same) but rarely meant. */
static void warn_broadcast(fj_context *ctx, const fj_spec *spec, int B,
                           int H) {
  int root = fjg_mask_root(spec->graph);
  unsigned deps = root >= 0 ? fjg_input_deps(spec->graph, root) : 0;
  if (B == 1 && (deps & (1u << FJG_IN_B)))
    fjr_log(ctx, FJ_LOG_WARN,
            "block mask of '%s' broadcast over the batch, but its mask reads "
            "b: every batch entry uses b = 0", spec->name);
  if (H == 1 && (deps & (1u << FJG_IN_H)))
    fjr_log(ctx, FJ_LOG_WARN,
            "block mask of '%s' broadcast over heads, but its mask reads h: "
            "every head uses h = 0", spec->name);
}

/* ---- public API ---- */

fj_status fj_block_mask_build(fj_context *ctx, const fj_spec *spec,
                              const fj_block_mask_options *opts,
                              fj_block_mask **out) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!spec || !opts || !out)
    return fjr_fail(ctx, FJ_EINVAL, "fj_block_mask_build: NULL argument");
  *out = NULL;
  int block_q = 0, block_kv = 0;
  fj_status st = check_options(ctx, opts, &block_q, &block_kv);
  if (st != FJ_OK) return st;
  /* The offsets by the launches' rules (a spec that reads Lq or Lk would see
   * the mask's lengths, not the whole sequence's). */
  fjr_sizes at = {opts->B, opts->H, opts->H, opts->q_len, opts->kv_len, 0, 0};
  if ((st = fjr_offsets_bind(ctx, spec->graph, opts->q_offset, opts->kv_offset, 0, &at)) !=
      FJ_OK)
    return st;
  if ((st = fjr_context_device(ctx, NULL)) != FJ_OK) return st;
  fj_block_mask *m = calloc(1, sizeof *m);
  if (!m) return fjr_fail(ctx, FJ_ENOMEM, "out of memory");
  m->ctx = ctx;
  m->spec = spec;
  m->device = ctx->opts.device;
  m->B = opts->B, m->H = opts->H;
  m->q_len = opts->q_len, m->kv_len = opts->kv_len;
  m->q_off = at.q_off, m->kv_off = at.kv_off;
  m->block_q = block_q, m->block_kv = block_kv;
  m->nq = (int)((opts->q_len + (long long)block_q - 1) / block_q);
  m->nkv = (int)((opts->kv_len + (long long)block_kv - 1) / block_kv);
  warn_broadcast(ctx, spec, m->B, m->H);
  if ((st = find_builder(ctx, (fj_spec *)spec, NULL, &m->builder, NULL)) != FJ_OK ||
      (st = fjr_kernel_load(ctx, m->builder)) != FJ_OK ||
      (st = place_arrays(m, opts)) != FJ_OK ||
      (st = launch_builder(m, opts->args, opts->num_args, opts->stream)) !=
          FJ_OK)
    goto fail;
  *out = m;
  return FJ_OK;
fail:
  fj_block_mask_destroy(m);
  return st;
}

fj_status fj_block_mask_update(fj_block_mask *mask, const fj_arg *args,
                               int num_args, void *stream) {
  if (!mask) return FJ_EINVAL;
  fjr_clear_error(mask->ctx);
  if (num_args < 0 || (num_args > 0 && !args))
    return fjr_fail(mask->ctx, FJ_EINVAL, "block mask: bad args array");
  if (!mask->builder)
    return fjr_fail(mask->ctx, FJ_EINVAL,
                    "block mask: a mask of arrays made elsewhere (fj_block_mask_wrap) "
                    "cannot be rebuilt");
  fj_status st = fjr_context_device(mask->ctx, NULL);
  if (st != FJ_OK) return st;
  return launch_builder(mask, args, num_args, stream);
}

fj_status fj_block_mask_wrap(fj_context *ctx, const fj_block_mask_info *info,
                             const uint64_t arrays[FJ_BM_NUM_ARRAYS],
                             fj_block_mask **out) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!info || !arrays || !out)
    return fjr_fail(ctx, FJ_EINVAL, "fj_block_mask_wrap: NULL argument");
  *out = NULL;
  const fj_block_mask_info *i = info;
  if (i->B < 1 || i->H < 1 || i->q_len < 1 || i->kv_len < 1 || i->block_q < 1 ||
      i->block_kv < 1 || i->block_q > (1 << 20) || i->block_kv > (1 << 20))
    return fjr_fail(ctx, FJ_EINVAL,
                    "fj_block_mask_wrap: B %d, H %d, q_len %d, kv_len %d must be >= 1 "
                    "and block sizes %d x %d in [1, 2^20]",
                    i->B, i->H, i->q_len, i->kv_len, i->block_q, i->block_kv);
  if (i->q_offset < 0 || i->kv_offset < 0)
    return fjr_fail(ctx, FJ_EINVAL, "fj_block_mask_wrap: q_offset (%d) and kv_offset (%d) "
                    "must be >= 0", i->q_offset, i->kv_offset);
  const long long nq = (i->q_len + (long long)i->block_q - 1) / i->block_q;
  const long long nkv = (i->kv_len + (long long)i->block_kv - 1) / i->block_kv;
  if (i->num_q_blocks < nq || i->num_kv_blocks < nkv)
    return fjr_fail(ctx, FJ_EINVAL,
                    "fj_block_mask_wrap: rows of %d query and %d kv blocks, but %d x %d "
                    "over %d x %d blocks needs at least %lld and %lld",
                    i->num_q_blocks, i->num_kv_blocks, i->q_len, i->kv_len, i->block_q,
                    i->block_kv, nq, nkv);
  for (int a = 0; a < FJ_BM_NUM_ARRAYS; a++) {
    const int forward = a < FJ_BM_Q_NUM_BLOCKS;
    if ((forward && !arrays[a]) || arrays[a] % 4 != 0)
      return fjr_fail(ctx, FJ_EINVAL,
                      "fj_block_mask_wrap: array %d is %s", a,
                      arrays[a] ? "not 4-byte aligned" : "0 (kv_* arrays are required)");
  }
  fj_block_mask *m = calloc(1, sizeof *m);
  if (!m) return fjr_fail(ctx, FJ_ENOMEM, "out of memory");
  m->ctx = ctx;
  m->device = ctx->opts.device;
  m->B = i->B, m->H = i->H, m->q_len = i->q_len, m->kv_len = i->kv_len;
  m->q_off = i->q_offset, m->kv_off = i->kv_offset;
  m->block_q = i->block_q, m->block_kv = i->block_kv;
  m->nq = i->num_q_blocks, m->nkv = i->num_kv_blocks;
  fjg_block_mask_counts(m->B, m->H, m->nq, m->nkv, m->counts);
  for (int a = 0; a < FJ_BM_NUM_ARRAYS; a++) m->arrays[a] = arrays[a];
  *out = m;
  return FJ_OK;
}

void fj_block_mask_destroy(fj_block_mask *mask) {
  if (!mask) return;
  const fjr_driver *d = mask->ctx->drv;
  /* cuMemFree waits for work still using the memory. */
  if (d && mask->mem) d->cuMemFree(mask->mem);
  free(mask);
}

fj_status fj_block_mask_get_info(const fj_block_mask *m,
                                 fj_block_mask_info *info) {
  if (!m || !info) return FJ_EINVAL;
  *info = (fj_block_mask_info){m->B,        m->H,        m->q_len,
                               m->kv_len,   m->block_q,  m->block_kv,
                               m->nq,       m->nkv,      m->q_off,
                               m->kv_off};
  return FJ_OK;
}

fj_status fj_block_mask_array_device(const fj_block_mask *m,
                                     fj_block_mask_array which,
                                     uint64_t *dptr, size_t *count) {
  if (!m || (int)which < 0 || which >= FJ_BM_NUM_ARRAYS) return FJ_EINVAL;
  if (dptr) *dptr = m->arrays[which];
  if (count) *count = m->counts[which];
  return FJ_OK;
}

fj_status fj_block_mask_download(fj_block_mask *m, fj_block_mask_array which,
                                 int32_t *host, size_t count) {
  if (!m) return FJ_EINVAL;
  fj_context *ctx = m->ctx;
  fjr_clear_error(ctx);
  if ((int)which < 0 || which >= FJ_BM_NUM_ARRAYS || !host)
    return fjr_fail(ctx, FJ_EINVAL, "fj_block_mask_download: bad argument");
  if (count != m->counts[which])
    return fjr_fail(ctx, FJ_EINVAL,
                    "fj_block_mask_download: array %d has %zu elements, not "
                    "%zu", (int)which, m->counts[which], count);
  if (!m->arrays[which])
    return fjr_fail(ctx, FJ_EINVAL, "fj_block_mask_download: array %d was not given",
                    (int)which);
  fj_status st = fjr_context_device(ctx, NULL);
  if (st != FJ_OK) return st;
  const fjr_driver *d = ctx->drv;
  CUresult r = d->cuStreamSynchronize(m->stream);
  if (r != CUDA_SUCCESS)
    return fjr_cu_fail(ctx, "cuStreamSynchronize (block mask)", r);
  r = d->cuMemcpyDtoH(host, m->arrays[which], count * 4);
  if (r != CUDA_SUCCESS)
    return fjr_cu_fail(ctx, "cuMemcpyDtoH (block mask)", r);
  return FJ_OK;
}

/* ---- binding to a forward launch ---- */

/* Whether mask m describes a launch of sizes sz (B x Hq heads over Lq x Lk
 * at offsets q_off, kv_off) with block_m x block_n tiles; FJ_EINVAL naming
 * both values when not. */
static fj_status check_fit(fj_context *ctx, const fj_block_mask *m, const fjr_sizes *sz,
                           int block_m, int block_n) {
  const int B = sz->B, Hq = sz->Hq, Lq = sz->Lq, Lk = sz->Lk;
  if (m->device != ctx->opts.device)
    return fjr_fail(ctx, FJ_EINVAL,
                    "block mask was built on CUDA device %d, the launch uses "
                    "%d", m->device, ctx->opts.device);
  if (m->q_len != Lq || m->kv_len != Lk)
    return fjr_fail(ctx, FJ_EINVAL,
                    "block mask is for q_len %d x kv_len %d, the launch has "
                    "Lq %d x Lk %d", m->q_len, m->kv_len, Lq, Lk);
  if (m->q_off != sz->q_off || m->kv_off != sz->kv_off)
    return fjr_fail(ctx, FJ_EINVAL,
                    "block mask is for q_offset %d, kv_offset %d; the launch has q_offset "
                    "%d, kv_offset %d (build the mask at the launch's offsets)",
                    m->q_off, m->kv_off, sz->q_off, sz->kv_off);
  if ((m->B != 1 && m->B != B) || (m->H != 1 && m->H != Hq))
    return fjr_fail(ctx, FJ_EINVAL,
                    "block mask has B %d, H %d; the launch has B %d, Hq %d "
                    "(a block mask's B and H must be 1 or match)",
                    m->B, m->H, B, Hq);
  if (m->block_q % block_m != 0 || m->block_kv % block_n != 0)
    return fjr_fail(ctx, FJ_EINVAL,
                    "block mask blocks %d x %d do not fit the kernel's %d x "
                    "%d tiles: block_q must be a multiple of %d and block_kv "
                    "a multiple of %d", m->block_q, m->block_kv, block_m,
                    block_n, block_m, block_n);
  return FJ_OK;
}

fj_status fjr_block_mask_bind(fj_context *ctx, const fj_block_mask *m,
                              const fjr_sizes *sz, int block_m, int block_n,
                              fjr_fwd_params_fixed *p) {
  p->bm_kv_num = p->bm_kv_idx = p->bm_full_num = p->bm_full_idx = 0;
  p->bm_b_stride = p->bm_h_stride = p->bm_nkv = 0;
  p->bm_q_ratio = p->bm_kv_ratio = 1;
  if (!m) return FJ_OK;
  fj_status st = check_fit(ctx, m, sz, block_m, block_n);
  if (st != FJ_OK) return st;
  p->bm_kv_num = m->arrays[FJ_BM_KV_NUM_BLOCKS];
  p->bm_kv_idx = m->arrays[FJ_BM_KV_INDICES];
  p->bm_full_num = m->arrays[FJ_BM_FULL_KV_NUM_BLOCKS];
  p->bm_full_idx = m->arrays[FJ_BM_FULL_KV_INDICES];
  p->bm_b_stride = m->B == 1 ? 0 : m->H * m->nq;
  p->bm_h_stride = m->H == 1 ? 0 : m->nq;
  p->bm_nkv = m->nkv;
  p->bm_q_ratio = m->block_q / block_m;
  p->bm_kv_ratio = m->block_kv / block_n;
  return FJ_OK;
}

fj_status fjr_block_mask_bind_bwd(fj_context *ctx, const fj_block_mask *m,
                                  const fjr_sizes *sz, int block_m, int block_n,
                                  fjr_bwd_params_fixed *p) {
  p->bm_q_num = p->bm_q_idx = p->bm_full_q_num = p->bm_full_q_idx = 0;
  p->bm_kv_num = p->bm_kv_idx = p->bm_full_kv_num = p->bm_full_kv_idx = 0;
  p->bm_b_stride = p->bm_h_stride = p->bm_nq = 0;
  p->bm_qb_stride = p->bm_qh_stride = p->bm_nkv = 0;
  p->bm_q_ratio = p->bm_kv_ratio = 1;
  if (!m) return FJ_OK;
  fj_status st = check_fit(ctx, m, sz, block_m, block_n);
  if (st != FJ_OK) return st;
  for (int a = FJ_BM_Q_NUM_BLOCKS; a < FJ_BM_NUM_ARRAYS; a++)
    if (!m->arrays[a])
      return fjr_fail(ctx, FJ_EINVAL,
                      "block mask has no transposed lists (q_num_blocks, q_indices, "
                      "full_q_*), which the backward pass reads");
  p->bm_q_num = m->arrays[FJ_BM_Q_NUM_BLOCKS];
  p->bm_q_idx = m->arrays[FJ_BM_Q_INDICES];
  p->bm_full_q_num = m->arrays[FJ_BM_FULL_Q_NUM_BLOCKS];
  p->bm_full_q_idx = m->arrays[FJ_BM_FULL_Q_INDICES];
  p->bm_b_stride = m->B == 1 ? 0 : m->H * m->nkv;
  p->bm_h_stride = m->H == 1 ? 0 : m->nkv;
  p->bm_nq = m->nq;
  p->bm_q_ratio = m->block_q / block_m;
  p->bm_kv_ratio = m->block_kv / block_n;
  /* The lists per query block: the deterministic mode's order reads them. */
  p->bm_kv_num = m->arrays[FJ_BM_KV_NUM_BLOCKS];
  p->bm_kv_idx = m->arrays[FJ_BM_KV_INDICES];
  p->bm_full_kv_num = m->arrays[FJ_BM_FULL_KV_NUM_BLOCKS];
  p->bm_full_kv_idx = m->arrays[FJ_BM_FULL_KV_INDICES];
  p->bm_qb_stride = m->B == 1 ? 0 : m->H * m->nq;
  p->bm_qh_stride = m->H == 1 ? 0 : m->nq;
  p->bm_nkv = m->nkv;
  return FJ_OK;
}
