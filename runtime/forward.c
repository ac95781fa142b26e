/*
 * runtime/forward.c: the forward pass: find or compile the kernel of a
 * (spec, head dim, dtype, arch), check the caller's tensors, pack the
 * parameters and launch on the caller's stream.
 *
 * Launch path after the first call: a walk of the spec's short kernel list,
 * tensor checks, one memcpy-sized pack and cuLaunchKernel. No Lua, no file
 * I/O, no hashing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cache/prune.h"
#include "gen/emit_cuda.h"
#include "gen/templates.h"
#include "runtime/blockmask.h"
#include "runtime/context_impl.h"
#include "runtime/forward.h"
#include "runtime/launch_params.h"
#include "runtime/nvrtc.h"
#include "runtime/tma.h"

#define FJR_MAX_PARAM_BYTES 4096

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const char *dtype_name(fj_dtype d) {
  return d == FJ_DTYPE_BF16 ? "bf16" : "fp16";
}

/* Readable kernel name: fj_fwd_<spec>_d<D>_<dtype>_<template>[p][_m<rows>]_<arch>, the
 * spec name reduced to [A-Za-z0-9_]. */
static void kernel_name(const fj_spec *spec, const fjg_config *cfg, char *buf,
                        size_t n) {
  char clean[48];
  size_t j = 0;
  for (const char *s = spec->name; *s && j + 1 < sizeof(clean); s++) {
    char c = *s;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
             (c >= '0' && c <= '9') || c == '_';
    clean[j++] = ok ? c : '_';
  }
  clean[j] = '\0';
  /* An sm90 tile of other than the default rows (D=64's 128-row kernel for
   * block masks) says so: _m128. */
  int bm = 0, bn = 0;
  char rows[16] = "";
  if (cfg->uses_tma && fjg_sm90_tile(cfg->head_dim, &bm, &bn) == 0 && bm != cfg->block_m)
    snprintf(rows, sizeof rows, "_m%d", cfg->block_m);
  snprintf(buf, n, "fj_fwd_%s_d%d_%s_%s%s%s_%s", clean, cfg->head_dim,
           dtype_name(cfg->dtype), cfg->template_name,
           cfg->persistent ? "p" : "", rows, cfg->arch);
}

/* NVRTC options of a kernel: the fixed ones, then one -DNAME=VALUE for each
 * entry of $FLEXJIT_KERNEL_DEFINES ("NAME=VALUE ..."), which sets optional
 * template macros for experiments such as ablations (FJ_PINGPONG=0). They are
 * part of the key. Returns the count, or -1 with the context's error set. */
enum { FJR_MAX_OPTIONS = 24, FJR_DEFINES_BYTES = 1024 };

/* FLEXJIT_FAST_COMPILE=1 (ctx->fast_compile): NVRTC's --Ofast-compile=max,
 * for iterating on a spec. About three times faster to compile (an sm90
 * kernel in about half a second on the 2-core CI machine) and hundreds of
 * times slower to run: no inlining, serialized wgmma, setmaxnreg ignored.
 * The option is in the key, so these kernels never stand in for optimized
 * ones. */
#define FJR_FAST_COMPILE_OPTION "--Ofast-compile=max"

static int compile_options(fj_context *ctx, const char **opts,
                           char storage[FJR_DEFINES_BYTES]) {
  int n = 0;
  const char *const *base = fjr_nvrtc_base_options(&n);
  for (int i = 0; i < n; i++) opts[i] = base[i];
  /* ptxas's resource report (log only; the cubin is the same): the sm90
   * compile reads its spill counts (compile_sm90). */
  opts[n++] = "--ptxas-options=-v";
  if (ctx->fast_compile) opts[n++] = FJR_FAST_COMPILE_OPTION;
  const char *env = ctx->kernel_defines; /* $FLEXJIT_KERNEL_DEFINES */
  if (!env) return n;
  size_t used = 0;
  for (const char *p = env; *p;) {
    while (*p == ' ') p++;
    if (!*p) break;
    size_t len = strcspn(p, " ");
    size_t name_len = strcspn(p, "= ");
    int ok = name_len > 0 && (p[0] < '0' || p[0] > '9');
    for (size_t i = 0; ok && i < len; i++) {
      char c = p[i];
      ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '_' ||
           (i > name_len && (c == '.' || c == '-' || c == '+')) ||
           (i == name_len && c == '=');
    }
    if (!ok || n == FJR_MAX_OPTIONS || used + len + 3 > FJR_DEFINES_BYTES) {
      fjr_fail(ctx, FJ_EINVAL,
               "FLEXJIT_KERNEL_DEFINES: '%.*s' is not NAME or NAME=VALUE "
               "(letters, digits, _ . + -), or there are too many",
               (int)len, p);
      return -1;
    }
    char *d = storage + used;
    memcpy(d, "-D", 2);
    memcpy(d + 2, p, len);
    d[len + 2] = '\0';
    opts[n++] = d;
    used += len + 3;
    p += len;
  }
  return n;
}

/* The cache keys. The source key covers every ingredient that shapes the
 * cubin except the compiler: key schema, library version, canonical graph,
 * template bytes, configuration, target and compile options. The full key
 * adds the NVRTC version; a deployment without NVRTC looks kernels up in a
 * pack by source key. */
static fj_status forward_keys(fj_context *ctx, const fj_spec *spec,
                              const fjg_config *cfg,
                              const char *nvrtc_version, fjc_key *source_key,
                              fjc_key *key) {
  fjg_buf graph;
  fjg_buf_init(&graph);
  fj_status st = fjg_serialize(spec->graph, &graph);
  if (st != FJ_OK || graph.failed) {
    fjg_buf_free(&graph);
    return fjr_fail(ctx, FJ_ENOMEM, "serializing the spec graph failed");
  }
  fjg_buf templates;
  fjg_buf_init(&templates);
  fjg_templates_append_all(&templates);
  if (templates.failed) {
    fjg_buf_free(&graph);
    fjg_buf_free(&templates);
    return fjr_fail(ctx, FJ_ENOMEM, "out of memory hashing templates");
  }
  fjc_key_builder b;
  fjc_key_begin(&b);
  fjc_key_add_str(&b, "libver", FJ_VERSION_STRING);
  fjc_key_add_str(&b, "pass", "forward");
  fjc_key_add(&b, "graph", graph.data, graph.len);
  fjc_key_add(&b, "templates", templates.data, templates.len);
  fjc_key_add_str(&b, "template", cfg->template_name);
  fjc_key_add_int(&b, "head_dim", cfg->head_dim);
  fjc_key_add_int(&b, "dtype", cfg->dtype);
  fjc_key_add_int(&b, "block_m", cfg->block_m);
  fjc_key_add_int(&b, "block_n", cfg->block_n);
  fjc_key_add_int(&b, "num_warps", cfg->num_warps);
  fjc_key_add_int(&b, "num_stages", cfg->num_stages);
  fjc_key_add_int(&b, "threads", cfg->threads);
  fjc_key_add_int(&b, "smem_bytes", cfg->smem_bytes);
  fjc_key_add_str(&b, "arch", cfg->arch);
  fjc_key_add_int(&b, "persistent", cfg->persistent);
  const char *opts[FJR_MAX_OPTIONS];
  char defines[FJR_DEFINES_BYTES];
  int nopt = compile_options(ctx, opts, defines);
  if (nopt < 0) {
    fjg_buf_free(&graph);
    fjg_buf_free(&templates);
    return FJ_EINVAL;
  }
  for (int i = 0; i < nopt; i++) fjc_key_add_str(&b, "option", opts[i]);
  fjc_key_finish(&b, source_key);
  fjc_key_begin(&b);
  fjc_key_add(&b, "source_key", source_key->bytes, sizeof(source_key->bytes));
  fjc_key_add_str(&b, "nvrtc", nvrtc_version);
  fjc_key_finish(&b, key);
  fjg_buf_free(&graph);
  fjg_buf_free(&templates);
  return FJ_OK;
}

static fj_status emit_source(fj_context *ctx, const fj_spec *spec,
                             const fjg_config *cfg, const fjc_key *key,
                             fjg_buf *src) {
  fjg_buf_init(src);
  fj_status st = fjg_emit_forward_tu(spec->graph, cfg, key->hex, src);
  if (st != FJ_OK || src->failed) {
    fjg_buf_free(src);
    return fjr_fail(ctx, st != FJ_OK ? st : FJ_ENOMEM,
                    "emitting CUDA for spec '%s' failed", spec->name);
  }
  fjg_buf_append(src, "", 1); /* NUL-terminate */
  return FJ_OK;
}

/* FLEXJIT_DUMP_DIR: keep a copy of what was compiled. */
static void dump_source(fj_context *ctx, const char *name, const fjc_key *key,
                        const fjg_buf *src) {
  const char *dir = getenv("FLEXJIT_DUMP_DIR");
  if (!dir || !*dir) return;
  mkdir(dir, 0755);
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s-%s.cu", dir, name, key->hex);
  FILE *f = fopen(path, "wb");
  if (!f) {
    fjr_log(ctx, FJ_LOG_WARN, "FLEXJIT_DUMP_DIR: cannot write %s", path);
    return;
  }
  fwrite(src->data, 1, src->len - 1, f);
  fclose(f);
}

/* When ptxas reports spills and the configuration names an option that
 * keeps fewer registers live (fjg_config.spill_fallback: for sm90, no
 * intra-warpgroup overlap), compiles again with it, unless the caller's
 * options already set that macro, and keeps the cubin that spills less.
 * Deterministic for a given source and NVRTC, so the key (taken before
 * compiling) still names one cubin. */
static void refit_spilling(fj_context *ctx, const char *name, const fjg_buf *src,
                           fjr_kernel *k, const char **opts, int nopt, char **log) {
  const char *fallback = k->cfg.spill_fallback;
  long spilled = fjr_nvrtc_log_spill_bytes(*log);
  /* A fast compile spills by design; a second compile would only cost time. */
  if (!fallback || spilled <= 0 || nopt >= FJR_MAX_OPTIONS || ctx->fast_compile) return;
  size_t macro = strcspn(fallback, "=");
  for (int i = 0; i < nopt; i++)
    if (strncmp(opts[i], fallback, macro) == 0) return;
  const char *opts2[FJR_MAX_OPTIONS + 1];
  for (int i = 0; i < nopt; i++) opts2[i] = opts[i];
  opts2[nopt] = fallback;
  void *cubin = NULL;
  size_t size = 0;
  char *log2 = NULL;
  if (fjr_nvrtc_compile(src->data, name, k->cfg.arch, opts2, nopt + 1, &cubin,
                        &size, &log2, NULL, 0) != FJ_OK) {
    free(log2); /* keep the first cubin; it compiled */
    return;
  }
  long spilled2 = fjr_nvrtc_log_spill_bytes(log2);
  if (spilled2 >= 0 && spilled2 < spilled) {
    fjr_log(ctx, FJ_LOG_INFO,
            "%s: %ld bytes of spills, %ld with %s: compiled with it", name,
            spilled, spilled2, fallback);
    free(k->cubin);
    k->cubin = cubin;
    k->cubin_size = size;
    free(*log);
    *log = log2;
  } else {
    free(cubin);
    free(log2);
  }
}

static fj_status meta_json(const fj_spec *spec, const char *name,
                           const fjr_kernel *k, const char *nvrtc_version,
                           double ms, fjg_buf *out) {
  const fjg_config *cfg = &k->cfg;
  fjg_buf_init(out);
  fjg_buf_printf(out, "{\"key\": \"%s\", \"source_key\": \"%s\", "
                 "\"nvrtc\": \"%s\", ", k->key.hex, k->source_key.hex,
                 nvrtc_version);
  fjg_buf_printf(out,
                 "\"name\": \"%s\", \"spec\": \"%s\", \"head_dim\": %d, "
                 "\"dtype\": \"%s\", \"arch\": \"%s\", \"block_m\": %d, "
                 "\"block_n\": %d, \"num_warps\": %d, \"compile_ms\": %.1f, "
                 "\"source\": \"",
                 name, spec->chunkname, cfg->head_dim, dtype_name(cfg->dtype),
                 cfg->arch, cfg->block_m, cfg->block_n, cfg->num_warps, ms);
  for (size_t i = 0; i < spec->source_len; i++) {
    unsigned char c = (unsigned char)spec->source[i];
    if (c == '"' || c == '\\')
      fjg_buf_printf(out, "\\%c", c);
    else if (c == '\n')
      fjg_buf_append(out, "\\n", 2);
    else if (c < 0x20)
      fjg_buf_printf(out, "\\u%04x", c);
    else
      fjg_buf_append(out, &c, 1);
  }
  fjg_buf_append(out, "\"}\n", 4);
  return out->failed ? FJ_ENOMEM : FJ_OK;
}

/* Looks the kernel up in the mounted packs: by full key, or by source key
 * when NVRTC is unavailable (any compiler's build of the same source). The
 * cubin is copied so that kernels own their bytes whatever their origin. */
static fj_status find_in_packs(fj_context *ctx, fjr_kernel *k, int nvrtc_ok,
                               char *path, size_t path_len) {
  for (int i = 0; i < ctx->num_packs; i++) {
    void *data = NULL;
    size_t size = 0;
    if (fjc_pack_find(ctx->packs[i], k->cfg.arch, nvrtc_ok ? &k->key : NULL,
                      &k->source_key, &data, &size, NULL) != FJ_OK)
      continue;
    k->cubin = data;
    k->cubin_size = size;
    snprintf(path, path_len, "%s", fjc_pack_path(ctx->packs[i]));
    return FJ_OK;
  }
  return FJ_ENOTFOUND;
}

/* The template a kernel uses: the caller's, else the context's, else the
 * best for the target: sm90 (wgmma + TMA) on sm_90a, sm80 elsewhere. Both
 * read block masks (see block_mask_template for masks sm90's tiles do not
 * fit). */
static const char *choose_template(const fj_context *ctx,
                                   const fj_kernel_options *opts,
                                   const char *arch) {
  if (opts->kernel_template) return opts->kernel_template;
  if (ctx->template_opt) return ctx->template_opt;
  if (strcmp(arch, "sm_90a") == 0) return "sm90";
  return "sm80";
}

/* The context's overrides of the configuration, read from the environment
 * when it was created: the K/V pipeline depth ($FLEXJIT_STAGES) and
 * persistence ($FLEXJIT_PERSISTENT), each when set. */
static fj_status apply_context_overrides(fj_context *ctx, fjg_config *cfg) {
  if (ctx->stages_opt && cfg->uses_tma && fjg_config_set_stages(cfg, ctx->stages_opt) != 0)
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "FLEXJIT_STAGES=%d does not fit: the %s kernel at head dim %d "
                    "would need more shared memory than %s allows",
                    ctx->stages_opt, cfg->template_name, cfg->head_dim, cfg->arch);
  if (ctx->persistent_opt >= 0) fjg_config_set_persistent(cfg, ctx->persistent_opt);
  return FJ_OK;
}

/* The query rows of an sm90 kernel's tile (64 a consumer warpgroup): the
 * default (192 at head dim 64, 128 otherwise), else $FLEXJIT_CONSUMERS's;
 * 128 for the persistent kernel, and for block masks whose block_q is a
 * multiple of 128 but not of the tile. The table lookup and a new kernel's
 * configuration both take it from here. */
static int sm90_block_m(const fj_context *ctx, const fj_kernel_options *opts) {
  int bm = 0, bn = 0;
  if (fjg_sm90_tile(opts->head_dim, &bm, &bn) != 0) return 0;
  if (ctx->consumers_opt) bm = 64 * ctx->consumers_opt; /* -64: refused below */
  if (ctx->persistent_opt == 1) {
    /* The persistent kernel's tile, unless FLEXJIT_CONSUMERS asked for
     * another: refused below (a conflict, not a silent choice). */
    if (ctx->consumers_opt && bm != FJG_SM90_PERSISTENT_BLOCK_M) return -1;
    bm = FJG_SM90_PERSISTENT_BLOCK_M;
  }
  if (bm <= 0) return bm;
  /* A mask no sm90 tile fits keeps bm: its bind says why. One that another
   * tile fits takes it, unless FLEXJIT_CONSUMERS chose this one. */
  const int fit = fjg_sm90_block_m_for(bm, opts->block_mask_block_q);
  if (fit && fit != bm && ctx->consumers_opt) return -1;
  return fit ? fit : bm;
}

/* "sm80" when the default choice must avoid sm90 for this block mask: its
 * blocks are not whole sm90 tiles (128 x 128, 128 x 64 at D=256, 192 or
 * 128 x 128 at D=64; e.g. block_kv 64), which sm80's smaller tiles still
 * fit. NULL otherwise, and
 * always when the context names a template (its choice stands; the bind
 * then says why it does not fit). Runs on every launch with a mask: the
 * usual answer takes two integer checks, no configuration. */
static const char *block_mask_template(const fj_context *ctx,
                                       const fj_block_mask_info *mi, int head_dim,
                                       fj_dtype dtype) {
  int bm90 = 0, bn90 = 0;
  if (!mi || ctx->template_opt || fjg_sm90_tile(head_dim, &bm90, &bn90) != 0) return NULL;
  if (fjg_sm90_block_m_for(bm90, mi->block_q) && mi->block_kv % bn90 == 0) return NULL;
  /* Only if sm80 has this head dim (not 256): else sm90's bind says why. */
  fjg_config c;
  if (fjg_config_choose_template(head_dim, dtype, "sm_90a", "sm80", &c, NULL, 0) != FJ_OK)
    return NULL;
  return "sm80";
}

/* Finds the kernel in the spec's table, else in the disk cache, else
 * compiles it (once per key across processes) and stores it. */
static fj_status get_kernel(fj_context *ctx, const fj_spec *spec_c,
                            const fj_kernel_options *opts, fjr_kernel **out,
                            fj_kernel_info *info) {
  fj_spec *spec = (fj_spec *)spec_c;
  fj_status st;
  const char *arch = opts->arch;
  if (!arch) {
    st = fjr_context_arch(ctx, &arch);
    if (st != FJ_OK) return st;
  }
  const char *tmpl = choose_template(ctx, opts, arch);
  const int block_m90 = sm90_block_m(ctx, opts);
  for (fjr_kernel *k = spec->kernels; k; k = k->next) {
    if (k->head_dim == opts->head_dim && k->dtype == opts->dtype &&
        strcmp(k->cfg.arch, arch) == 0 &&
        strcmp(k->cfg.template_name, tmpl) == 0 &&
        (ctx->persistent_opt < 0 || !k->cfg.uses_tma ||
         k->cfg.persistent == ctx->persistent_opt) &&
        (!ctx->stages_opt || !k->cfg.uses_tma || k->cfg.num_stages == ctx->stages_opt) &&
        (!k->cfg.uses_tma || k->cfg.block_m == block_m90)) {
      *out = k;
      if (info) {
        memset(info, 0, sizeof(*info));
        snprintf(info->key, sizeof(info->key), "%s", k->key.hex);
        snprintf(info->source_key, sizeof(info->source_key), "%s",
                 k->source_key.hex);
        kernel_name(spec, &k->cfg, info->name, sizeof(info->name));
        snprintf(info->arch, sizeof(info->arch), "%s", k->cfg.arch);
        snprintf(info->kernel_template, sizeof(info->kernel_template), "%s",
                 k->cfg.template_name);
        info->from_cache = 1;
        info->cubin_size = k->cubin_size;
      }
      return FJ_OK;
    }
  }

  fjr_kernel *k = calloc(1, sizeof(*k));
  if (!k) return fjr_fail(ctx, FJ_ENOMEM, "out of memory");
  char err[1024] = "";
  st = fjg_config_choose_template(opts->head_dim, opts->dtype, arch, tmpl,
                                  &k->cfg, err, sizeof(err));
  if (st != FJ_OK) {
    free(k);
    return fjr_fail(ctx, st, "%s", err);
  }
  st = apply_context_overrides(ctx, &k->cfg);
  if (st == FJ_OK && k->cfg.uses_tma && k->cfg.block_m != block_m90 &&
      (block_m90 <= 0 || fjg_config_set_consumers(&k->cfg, block_m90 / 64) != 0))
    st = fjr_fail(ctx, FJ_EUNSUPPORTED,
                  "FLEXJIT_CONSUMERS=%s: the sm90 kernel takes 2 consumer warpgroups, "
                  "or 3 at head dim 64, but not in the persistent kernel "
                  "(FLEXJIT_PERSISTENT=1) nor with a block mask of 128-row blocks; "
                  "head dim %d here",
                  ctx->consumers_env,
                  k->cfg.head_dim);
  if (st != FJ_OK) {
    free(k);
    return st;
  }
  k->head_dim = opts->head_dim;
  k->dtype = opts->dtype;

  /* NVRTC's version is part of the key; without NVRTC only kernels cached
   * by an unknown compiler could match, so a miss is reported below. */
  char nvrtc_version[32] = "unavailable";
  int nv_major = 0, nv_minor = 0;
  char nverr[512] = "";
  fj_status nvst = fjr_nvrtc_version(&nv_major, &nv_minor, nverr,
                                     sizeof(nverr));
  if (nvst == FJ_OK)
    snprintf(nvrtc_version, sizeof(nvrtc_version), "%d.%d", nv_major,
             nv_minor);

  st = forward_keys(ctx, spec, &k->cfg, nvrtc_version, &k->source_key,
                    &k->key);
  if (st != FJ_OK) {
    free(k);
    return st;
  }
  char name[96];
  kernel_name(spec, &k->cfg, name, sizeof(name));

  fjc_store *store = NULL;
  fjr_context_store(ctx, &store);
  char path[1024] = "";
  double compile_ms = 0;
  int from_cache = 0;
  int lock_fd = -1;
  fjg_buf src = {0};
  fjg_buf meta = {0};
  char *log = NULL;

  if (find_in_packs(ctx, k, nvst == FJ_OK, path, sizeof(path)) == FJ_OK) {
    from_cache = 1;
    goto done;
  }
  if (store &&
      (fjc_store_get(store, k->cfg.arch, &k->key, &k->cubin, &k->cubin_size,
                     path, sizeof(path)) == FJ_OK ||
       (nvst != FJ_OK && /* no NVRTC: the full key is unknown */
        fjc_store_get_by_source(store, k->cfg.arch, &k->source_key, &k->key,
                                &k->cubin, &k->cubin_size, path,
                                sizeof(path)) == FJ_OK))) {
    from_cache = 1;
    goto done;
  }
  if (nvst != FJ_OK) {
    st = fjr_fail(ctx, FJ_ENONVRTC,
                  "kernel %s (key %s, source key %s) is in no mounted pack "
                  "or cache and NVRTC is not available: %s",
                  name, k->key.hex, k->source_key.hex, nverr);
    goto fail;
  }
  if (store) {
    fjc_store_lock(store, k->cfg.arch, &k->key, &lock_fd);
    /* Another process may have compiled it while we waited. */
    if (fjc_store_get(store, k->cfg.arch, &k->key, &k->cubin,
                      &k->cubin_size, path, sizeof(path)) == FJ_OK) {
      from_cache = 1;
      goto done;
    }
  }
  st = emit_source(ctx, spec, &k->cfg, &k->key, &src);
  if (st != FJ_OK) goto fail;
  dump_source(ctx, name, &k->key, &src);
  const char *nvrtc_opts[FJR_MAX_OPTIONS];
  char defines[FJR_DEFINES_BYTES];
  int nopt = compile_options(ctx, nvrtc_opts, defines); /* checked by the key */
  double t0 = now_ms();
  st = fjr_nvrtc_compile(src.data, name, k->cfg.arch, nvrtc_opts, nopt,
                         &k->cubin, &k->cubin_size, &log, err, sizeof(err));
  if (st == FJ_OK) refit_spilling(ctx, name, &src, k, nvrtc_opts, nopt, &log);
  compile_ms = now_ms() - t0;
  if (st != FJ_OK) {
    st = fjr_fail(ctx, st, "compiling %s (key %s) failed: %s%s%s", name,
                  k->key.hex, err, log ? "\nNVRTC log:\n" : "",
                  log ? log : "");
    goto fail;
  }
  fjr_log(ctx, FJ_LOG_INFO, "compiled %s in %.1f ms", name, compile_ms);
  path[0] = '\0';
  if (store && meta_json(spec, name, k, nvrtc_version, compile_ms, &meta) == FJ_OK) {
    if (fjc_store_put(store, k->cfg.arch, &k->key, &k->source_key, k->cubin,
                      k->cubin_size, meta.data, path, sizeof(path)) != FJ_OK)
      path[0] = '\0'; /* in memory only; the store warned */
    else
      fjc_store_prune_to_limit(store);
  }

done:
  if (lock_fd >= 0) fjc_store_unlock(lock_fd);
  fjg_buf_free(&src);
  fjg_buf_free(&meta);
  free(log);
  k->next = spec->kernels;
  spec->kernels = k;
  *out = k;
  if (info) {
    memset(info, 0, sizeof(*info));
    snprintf(info->key, sizeof(info->key), "%s", k->key.hex);
    snprintf(info->source_key, sizeof(info->source_key), "%s",
             k->source_key.hex);
    snprintf(info->name, sizeof(info->name), "%s", name);
    snprintf(info->cubin_path, sizeof(info->cubin_path), "%s", path);
    snprintf(info->arch, sizeof(info->arch), "%s", k->cfg.arch);
    snprintf(info->kernel_template, sizeof(info->kernel_template), "%s",
             k->cfg.template_name);
    info->from_cache = from_cache;
    info->compile_ms = compile_ms;
    info->cubin_size = k->cubin_size;
  }
  return FJ_OK;

fail:
  if (lock_fd >= 0) fjc_store_unlock(lock_fd);
  fjg_buf_free(&src);
  fjg_buf_free(&meta);
  free(log);
  free(k->cubin);
  free(k);
  return st;
}

static fj_status check_kernel_options(fj_context *ctx,
                                      const fj_kernel_options *opts) {
  if (!opts) return fjr_fail(ctx, FJ_EINVAL, "kernel options are NULL");
  if (opts->dtype != FJ_DTYPE_BF16 && opts->dtype != FJ_DTYPE_F16)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "unsupported dtype %d",
                    (int)opts->dtype);
  return FJ_OK;
}

/* fj_compile_forward's work, handing back the kernel. */
static fj_status compile_forward(fj_context *ctx, const fj_spec *spec,
                                 const fj_kernel_options *opts, fjr_kernel **k,
                                 fj_kernel_info *info) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!spec) return fjr_fail(ctx, FJ_EINVAL, "spec is NULL");
  fj_status st = check_kernel_options(ctx, opts);
  if (st != FJ_OK) return st;
  return get_kernel(ctx, spec, opts, k, info);
}

fj_status fj_compile_forward(fj_context *ctx, const fj_spec *spec,
                             const fj_kernel_options *opts,
                             fj_kernel_info *info) {
  fjr_kernel *k = NULL;
  return compile_forward(ctx, spec, opts, &k, info);
}

fj_status fjr_forward_cubin(fj_context *ctx, const fj_spec *spec,
                            const fj_kernel_options *opts, const void **data,
                            size_t *size) {
  fjr_kernel *k = NULL;
  fj_status st = compile_forward(ctx, spec, opts, &k, NULL);
  if (st != FJ_OK) return st;
  if (!k->cubin)
    return fjr_fail(ctx, FJ_EINVAL, "the kernel is loaded already: its cubin was handed "
                    "to the driver");
  *data = k->cubin;
  *size = k->cubin_size;
  return FJ_OK;
}

fj_status fj_emit_forward_source(fj_context *ctx, const fj_spec *spec,
                                 const fj_kernel_options *opts,
                                 const char *path) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!spec || !path)
    return fjr_fail(ctx, FJ_EINVAL, "fj_emit_forward_source: NULL argument");
  fj_status st = check_kernel_options(ctx, opts);
  if (st != FJ_OK) return st;
  const char *arch = opts->arch;
  if (!arch) {
    st = fjr_context_arch(ctx, &arch);
    if (st != FJ_OK) return st;
  }
  fjg_config cfg;
  char err[1024];
  st = fjg_config_choose_template(opts->head_dim, opts->dtype, arch,
                                  choose_template(ctx, opts, arch), &cfg,
                                  err, sizeof(err));
  if (st != FJ_OK) return fjr_fail(ctx, st, "%s", err);
  st = apply_context_overrides(ctx, &cfg);
  if (st != FJ_OK) return st;
  char nvrtc_version[32] = "unavailable";
  int major = 0, minor = 0;
  if (fjr_nvrtc_version(&major, &minor, err, sizeof(err)) == FJ_OK)
    snprintf(nvrtc_version, sizeof(nvrtc_version), "%d.%d", major, minor);
  fjc_key source_key, key;
  st = forward_keys(ctx, spec, &cfg, nvrtc_version, &source_key, &key);
  if (st != FJ_OK) return st;
  fjg_buf src;
  st = emit_source(ctx, spec, &cfg, &key, &src);
  if (st != FJ_OK) return st;
  FILE *f = fopen(path, "wb");
  if (!f) {
    fjg_buf_free(&src);
    return fjr_fail(ctx, FJ_EIO, "cannot write %s", path);
  }
  size_t n = fwrite(src.data, 1, src.len - 1, f);
  int bad = n != src.len - 1;
  if (fclose(f) != 0) bad = 1;
  fjg_buf_free(&src);
  if (bad) return fjr_fail(ctx, FJ_EIO, "writing %s failed", path);
  return FJ_OK;
}

/* ---- tensors ---- */

static int is_dtype(DLDataType t, uint8_t code, uint8_t bits) {
  return t.code == code && t.bits == bits && t.lanes == 1;
}

static const char *dl_dtype_text(DLDataType t, char *buf, size_t n) {
  const char *k = t.code == kDLFloat    ? "float"
                  : t.code == kDLBfloat ? "bfloat"
                  : t.code == kDLInt    ? "int"
                  : t.code == kDLUInt   ? "uint"
                                        : "code?";
  snprintf(buf, n, "%s%u%s", k, t.bits, t.lanes == 1 ? "" : "xN");
  return buf;
}

/* Checks a tensor's rank, device, dtype and contiguous last dimension, and
 * returns its element strides (computed when strides is NULL). */
static fj_status check_tensor(fj_context *ctx, const char *what,
                              const DLTensor *t, int ndim, DLDataType dtype,
                              int64_t *strides) {
  char a[32], b[32];
  if (!t) return fjr_fail(ctx, FJ_ETENSOR, "%s: tensor is NULL", what);
  if (t->ndim != ndim)
    return fjr_fail(ctx, FJ_ETENSOR, "%s: expected %d dimensions, got %d",
                    what, ndim, t->ndim);
  if (t->device.device_type != kDLCUDA &&
      t->device.device_type != kDLCUDAManaged)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "%s: tensor is not on a CUDA device (device_type %d)",
                    what, (int)t->device.device_type);
  if (t->device.device_id != ctx->opts.device)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "%s: tensor is on CUDA device %d, the context uses %d",
                    what, t->device.device_id, ctx->opts.device);
  if (!is_dtype(t->dtype, dtype.code, dtype.bits))
    return fjr_fail(ctx, FJ_ETENSOR, "%s: dtype %s, expected %s", what,
                    dl_dtype_text(t->dtype, a, sizeof(a)),
                    dl_dtype_text(dtype, b, sizeof(b)));
  if (!t->data)
    return fjr_fail(ctx, FJ_ETENSOR, "%s: data pointer is NULL", what);
  int64_t expect = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    if (t->shape[i] <= 0)
      return fjr_fail(ctx, FJ_ETENSOR, "%s: dimension %d has size %lld", what,
                      i, (long long)t->shape[i]);
    strides[i] = t->strides ? t->strides[i] : expect;
    expect *= t->shape[i];
  }
  if (strides[ndim - 1] != 1 && t->shape[ndim - 1] > 1)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "%s: the last dimension must be contiguous (stride %lld)",
                    what, (long long)strides[ndim - 1]);
  for (int i = 0; i < ndim; i++)
    if (strides[i] < 0)
      return fjr_fail(ctx, FJ_ETENSOR, "%s: negative stride in dimension %d",
                      what, i);
  return FJ_OK;
}

static uint64_t tensor_ptr(const DLTensor *t) {
  return (uint64_t)(uintptr_t)t->data + t->byte_offset;
}

/* q, k, v, o are read and written 16 bytes at a time. */
static fj_status check_alignment(fj_context *ctx, const char *what,
                                 const DLTensor *t, const int64_t *s) {
  if (tensor_ptr(t) % 16 != 0)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "%s: data must be 16-byte aligned (address %% 16 = %llu)",
                    what, (unsigned long long)(tensor_ptr(t) % 16));
  for (int i = 0; i < 3; i++)
    if (s[i] % 8 != 0 && t->shape[i] > 1)
      return fjr_fail(ctx, FJ_ETENSOR,
                      "%s: stride of dimension %d (%lld elements) must be a "
                      "multiple of 8",
                      what, i, (long long)s[i]);
  return FJ_OK;
}

static fj_status check_shape(fj_context *ctx, const char *what,
                             const DLTensor *t, const int64_t *want) {
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] != want[i])
      return fjr_fail(ctx, FJ_ETENSOR,
                      "%s: shape [%lld, %lld, %lld%s%lld] does not match the "
                      "expected [%lld, %lld, %lld%s%lld]",
                      what, (long long)t->shape[0], (long long)t->shape[1],
                      (long long)t->shape[2], t->ndim == 4 ? ", " : "",
                      t->ndim == 4 ? (long long)t->shape[3] : 0LL,
                      (long long)want[0], (long long)want[1],
                      (long long)want[2], t->ndim == 4 ? ", " : "",
                      t->ndim == 4 ? (long long)want[3] : 0LL);
  return FJ_OK;
}

/* Matches the caller's runtime values with the spec's declarations. */
static fj_status bind_args(fj_context *ctx, const fj_spec *spec,
                           const fj_forward_args *args, int32_t *i32s,
                           float *f32s, uint64_t *ptrs, int64_t *lens) {
  int n = fjg_num_args(spec->graph);
  for (int i = 0; i < args->num_args; i++) {
    const char *name = args->args[i].name;
    if (!name || fjg_find_arg(spec->graph, name) < 0)
      return fjr_fail(ctx, FJ_EINVAL,
                      "spec '%s' declares no param or buffer named '%s'",
                      spec->name, name ? name : "(null)");
  }
  for (int a = 0; a < n; a++) {
    const fjg_arg *decl = fjg_arg_at(spec->graph, a);
    const fj_arg *given = NULL;
    for (int i = 0; i < args->num_args; i++)
      if (strcmp(args->args[i].name, decl->name) == 0) given = &args->args[i];
    if (!given)
      return fjr_fail(ctx, FJ_EINVAL,
                      "spec '%s' needs %s '%s' but no value was given",
                      spec->name,
                      decl->kind == FJ_ARG_BUFFER ? "buffer" : "param",
                      decl->name);
    i32s[a] = 0;
    f32s[a] = 0;
    ptrs[a] = 0;
    lens[a] = 0;
    if (decl->kind == FJ_ARG_I32) {
      i32s[a] = given->i32;
    } else if (decl->kind == FJ_ARG_F32) {
      f32s[a] = given->f32;
    } else {
      const DLTensor *t = given->buffer;
      char what[96];
      snprintf(what, sizeof(what), "buffer '%s'", decl->name);
      DLDataType want = {decl->type == FJG_I32 ? kDLInt : kDLFloat, 32, 1};
      int64_t s[1];
      fj_status st = check_tensor(ctx, what, t, 1, want, s);
      if (st != FJ_OK) return st;
      if (s[0] != 1 && t->shape[0] > 1)
        return fjr_fail(ctx, FJ_ETENSOR, "%s: must be contiguous", what);
      if (tensor_ptr(t) % 4 != 0)
        return fjr_fail(ctx, FJ_ETENSOR, "%s: data must be 4-byte aligned",
                        what);
      ptrs[a] = tensor_ptr(t);
      lens[a] = t->shape[0];
    }
  }
  return FJ_OK;
}

static fj_status load_module(fj_context *ctx, fjr_kernel *k) {
  const fjr_driver *d = ctx->drv;
  CUresult r = d->cuModuleLoadData(&k->module, k->cubin);
  if (r != CUDA_SUCCESS) {
    k->module = NULL;
    return fjr_cu_fail(ctx, "cuModuleLoadData", r);
  }
  r = d->cuModuleGetFunction(&k->fn, k->module, "fj_attention_fwd");
  if (r != CUDA_SUCCESS) goto fail;
  /* Dynamic plus the kernel's static shared memory (sm90's block-mask row
   * copy) must fit the block's opt-in limit. */
  int static_smem = 0;
  if (d->cuFuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, k->fn) !=
      CUDA_SUCCESS)
    static_smem = 0;
  if (k->cfg.smem_bytes + static_smem > ctx->max_smem_optin) {
    fj_status st = fjr_fail(ctx, FJ_EUNSUPPORTED,
                            "kernel needs %d bytes of shared memory (%d dynamic, %d "
                            "static), the device allows %d",
                            k->cfg.smem_bytes + static_smem, k->cfg.smem_bytes,
                            static_smem, ctx->max_smem_optin);
    d->cuModuleUnload(k->module);
    k->module = NULL;
    return st;
  }
  r = d->cuFuncSetAttribute(k->fn,
                            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            k->cfg.smem_bytes);
  if (r != CUDA_SUCCESS) goto fail;
  free(k->cubin); /* the driver keeps its own copy */
  k->cubin = NULL;
  return FJ_OK;
fail:;
  fj_status st = fjr_cu_fail(ctx, "loading fj_attention_fwd", r);
  d->cuModuleUnload(k->module);
  k->module = NULL;
  return st;
}

int64_t fjr_forward_grid(const fjg_config *cfg, int num_sms, int64_t B, int64_t Hq,
                         int64_t Lq, unsigned grid[3]) {
  const int64_t m = (Lq + cfg->block_m - 1) / cfg->block_m;
  const int64_t items = m * Hq * B;
  if (cfg->persistent) { /* one CTA per SM, each looping over work items */
    grid[0] = (unsigned)(items < num_sms ? items : num_sms);
    grid[1] = grid[2] = 1;
  } else {
    grid[0] = (unsigned)m, grid[1] = (unsigned)Hq, grid[2] = (unsigned)B;
  }
  return items;
}

/* The context's pool for work counters: one that keeps its memory when the
 * caller synchronizes. The device's default pool releases its unused memory
 * at every synchronization (release threshold 0); taking the counters from
 * it made the sliding window's launches 0.513-0.72 ms instead of a steady
 * 0.513-0.54 (bench/RESULTS.md, session 11, run 1). NULL when it cannot be
 * made. */
static CUmemoryPool counter_pool(fj_context *ctx) {
  if (ctx->counter_pool_state == 0) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = (int)ctx->cudev;
    cuuint64_t keep = UINT64_MAX; /* never hand memory back */
    ctx->counter_pool_state = -1;
    if (ctx->drv->cuMemPoolCreate(&ctx->counter_pool, &props) == CUDA_SUCCESS) {
      ctx->counter_pool_state = 1;
      if (ctx->drv->cuMemPoolSetAttribute(ctx->counter_pool,
                                          CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                          &keep) != CUDA_SUCCESS)
        fjr_log(ctx, FJ_LOG_WARN, "work counters: the pool keeps no memory");
    }
  }
  return ctx->counter_pool_state == 1 ? ctx->counter_pool : NULL;
}

/* The persistent kernel's work counter: a zeroed int of its own, allocated
 * in stream order (the caller frees it after the launch, the same way), so
 * that launches in flight on other streams never share it (about 2.5 us of
 * host time a launch, bench/RESULTS.md, session 9, run 6); only where CTAs
 * have more than one item to deal out. *out = 0 without memory pools (the
 * allocation refused): the kernel then takes its items statically. */
static fj_status work_counter(fj_context *ctx, CUstream stream, CUdeviceptr *out) {
  CUdeviceptr c = 0;
  *out = 0;
  CUmemoryPool pool = counter_pool(ctx);
  CUresult ra = pool ? ctx->drv->cuMemAllocFromPoolAsync(&c, sizeof(int32_t), pool, stream)
                     : ctx->drv->cuMemAllocAsync(&c, sizeof(int32_t), stream);
  if (ra != CUDA_SUCCESS) return FJ_OK;
  CUresult r = ctx->drv->cuMemsetD32Async(c, 0, 1, stream);
  if (r != CUDA_SUCCESS) {
    ctx->drv->cuMemFreeAsync(c, stream);
    return fjr_cu_fail(ctx, "cuMemsetD32Async", r);
  }
  *out = c;
  return FJ_OK;
}

fj_status fj_attention_forward(fj_context *ctx, const fj_spec *spec,
                               const fj_forward_args *args) {
  if (!ctx) return FJ_EINVAL;
  fjr_clear_error(ctx);
  if (!spec || !args)
    return fjr_fail(ctx, FJ_EINVAL, "fj_attention_forward: NULL argument");
  if (args->num_args < 0 || (args->num_args > 0 && !args->args))
    return fjr_fail(ctx, FJ_EINVAL, "fj_attention_forward: bad args array");

  const DLTensor *q = args->q;
  if (!q || q->ndim != 4)
    return fjr_fail(ctx, FJ_ETENSOR, "q: expected a 4-D tensor [B, Hq, Lq, D]");
  fj_dtype dtype;
  DLDataType dl;
  if (is_dtype(q->dtype, kDLBfloat, 16)) {
    dtype = FJ_DTYPE_BF16;
    dl = (DLDataType){kDLBfloat, 16, 1};
  } else if (is_dtype(q->dtype, kDLFloat, 16)) {
    dtype = FJ_DTYPE_F16;
    dl = (DLDataType){kDLFloat, 16, 1};
  } else {
    char t[32];
    return fjr_fail(ctx, FJ_ETENSOR,
                    "q: dtype %s is not supported (bfloat16 or float16)",
                    dl_dtype_text(q->dtype, t, sizeof(t)));
  }
  int64_t qs[4], ks[4], vs[4], os[4], ls[3] = {0, 0, 1};
  fj_status st;
  if ((st = check_tensor(ctx, "q", q, 4, dl, qs)) != FJ_OK) return st;
  if ((st = check_tensor(ctx, "k", args->k, 4, dl, ks)) != FJ_OK) return st;
  if ((st = check_tensor(ctx, "v", args->v, 4, dl, vs)) != FJ_OK) return st;
  if ((st = check_tensor(ctx, "o", args->o, 4, dl, os)) != FJ_OK) return st;
  const int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2],
                D = q->shape[3];
  const int64_t Hkv = args->k->shape[1], Lk = args->k->shape[2];
  if (D != 64 && D != 128 && D != 256)
    return fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "head dim %lld is not supported (64, 128, or 256 on sm_90a)",
                    (long long)D);
  int64_t kshape[4] = {B, Hkv, Lk, D};
  if ((st = check_shape(ctx, "k", args->k, kshape)) != FJ_OK) return st;
  if ((st = check_shape(ctx, "v", args->v, kshape)) != FJ_OK) return st;
  if ((st = check_shape(ctx, "o", args->o, q->shape)) != FJ_OK) return st;
  if (Hq % Hkv != 0)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "query heads (%lld) must be a multiple of key/value heads "
                    "(%lld)",
                    (long long)Hq, (long long)Hkv);
  if (Lq > INT32_MAX || Lk > INT32_MAX || B > 65535 || Hq > 65535)
    return fjr_fail(ctx, FJ_ETENSOR,
                    "sizes too large: B <= 65535, H <= 65535, L < 2^31");
  if ((st = check_alignment(ctx, "q", q, qs)) != FJ_OK) return st;
  if ((st = check_alignment(ctx, "k", args->k, ks)) != FJ_OK) return st;
  if ((st = check_alignment(ctx, "v", args->v, vs)) != FJ_OK) return st;
  if ((st = check_alignment(ctx, "o", args->o, os)) != FJ_OK) return st;
  if (args->lse) {
    DLDataType f32 = {kDLFloat, 32, 1};
    if ((st = check_tensor(ctx, "lse", args->lse, 3, f32, ls)) != FJ_OK)
      return st;
    int64_t lshape[3] = {B, Hq, Lq};
    if ((st = check_shape(ctx, "lse", args->lse, lshape)) != FJ_OK) return st;
  }
  float scale = args->scale;
  if (scale == 0.0f) scale = 1.0f / sqrtf((float)D);
  if (!isfinite(scale))
    return fjr_fail(ctx, FJ_EINVAL, "scale must be finite");

  int nargs = fjg_num_args(spec->graph);
  int32_t i32s[64];
  float f32s[64];
  uint64_t ptrs[64];
  int64_t lens[64];
  if (nargs > 64)
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "more than 64 params and buffers");
  if ((st = bind_args(ctx, spec, args, i32s, f32s, ptrs, lens)) != FJ_OK)
    return st;

  if ((st = fjr_context_device(ctx, NULL)) != FJ_OK) return st;
  fj_block_mask_info bmi;
  const fj_block_mask_info *mi =
      args->block_mask && fj_block_mask_get_info(args->block_mask, &bmi) == FJ_OK ? &bmi
                                                                                  : NULL;
  fj_kernel_options kopts = {.head_dim = (int)D, .dtype = dtype,
                             .kernel_template = block_mask_template(ctx, mi, (int)D, dtype),
                             .block_mask_block_q = mi ? mi->block_q : 0};
  fjr_kernel *k = NULL;
  if ((st = get_kernel(ctx, spec, &kopts, &k, NULL)) != FJ_OK) return st;
  if (!k->module && (st = load_module(ctx, k)) != FJ_OK) return st;

  /* Pack the one kernel parameter. */
  _Alignas(16) unsigned char pbuf[FJR_MAX_PARAM_BYTES];
  size_t user_size = fjg_user_params_size(spec->graph);
  size_t total = FJR_FWD_USER_OFFSET + user_size;
  if (total > sizeof(pbuf))
    return fjr_fail(ctx, FJ_EUNSUPPORTED, "kernel parameters too large");
  memset(pbuf, 0, total);
  fjr_fwd_params_fixed *p = (fjr_fwd_params_fixed *)pbuf;
  p->q = tensor_ptr(q);
  p->k = tensor_ptr(args->k);
  p->v = tensor_ptr(args->v);
  p->o = tensor_ptr(args->o);
  p->lse = args->lse ? tensor_ptr(args->lse) : 0;
  p->q_sb = qs[0], p->q_sh = qs[1], p->q_ss = qs[2];
  p->k_sb = ks[0], p->k_sh = ks[1], p->k_ss = ks[2];
  p->v_sb = vs[0], p->v_sh = vs[1], p->v_ss = vs[2];
  p->o_sb = os[0], p->o_sh = os[1], p->o_ss = os[2];
  p->lse_sb = ls[0], p->lse_sh = ls[1];
  p->sz = (fjr_sizes){(int32_t)B, (int32_t)Hq, (int32_t)Hkv, (int32_t)Lq,
                      (int32_t)Lk};
  p->kv_group = (int32_t)(Hq / Hkv);
  p->scale = scale;
  p->scale_log2 = scale * 1.4426950408889634f;
  fjg_user_params_pack(spec->graph, i32s, f32s, ptrs, lens,
                       pbuf + FJR_FWD_USER_OFFSET);
  /* The block mask, if any: validated against this launch (blockmask.c). */
  st = fjr_block_mask_bind(ctx, args->block_mask, (int)B, (int)Hq, (int)Lq,
                           (int)Lk, k->cfg.block_m, k->cfg.block_n, p);
  if (st != FJ_OK) return st;

  unsigned grid[3];
  const int64_t items = fjr_forward_grid(&k->cfg, ctx->num_sms, B, Hq, Lq, grid);
  CUstream stream = (CUstream)args->stream;
  CUresult r;
  if (k->cfg.uses_tma) {
    /* TMA descriptors are a second __grid_constant__ parameter. */
    _Alignas(128) fjr_tma_maps maps;
    char err[512];
    st = fjr_tma_maps_build(ctx->drv, &k->cfg, p, &maps, err, sizeof(err));
    if (st != FJ_OK) return fjr_fail(ctx, st, "%s", err);
    CUdeviceptr sched = 0;
    if (k->cfg.persistent && items > (int64_t)grid[0] &&
        (st = work_counter(ctx, stream, &sched)) != FJ_OK)
      return st;
    maps.sched = (uint64_t)sched;
    void *kp[] = {pbuf, &maps};
    r = ctx->drv->cuLaunchKernel(k->fn, grid[0], grid[1], grid[2],
                                 (unsigned)k->cfg.threads, 1, 1,
                                 (unsigned)k->cfg.smem_bytes, stream, kp, NULL);
    if (sched) {
      CUresult rf = ctx->drv->cuMemFreeAsync(sched, stream);
      if (r == CUDA_SUCCESS && rf != CUDA_SUCCESS)
        return fjr_cu_fail(ctx, "cuMemFreeAsync", rf);
    }
  } else {
    size_t psize = total;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, pbuf,
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &psize, CU_LAUNCH_PARAM_END};
    r = ctx->drv->cuLaunchKernel(k->fn, grid[0], grid[1], grid[2],
                                 (unsigned)k->cfg.threads, 1, 1,
                                 (unsigned)k->cfg.smem_bytes, stream, NULL, extra);
  }
  if (r != CUDA_SUCCESS) return fjr_cu_fail(ctx, "cuLaunchKernel", r);
  return FJ_OK;
}

/* ---- teardown ---- */

void fjr_spec_kernels_release(fj_spec *spec) {
  fjr_kernel *k = spec->kernels;
  while (k) {
    fjr_kernel *next = k->next;
    if (k->module && spec->ctx->drv) spec->ctx->drv->cuModuleUnload(k->module);
    free(k->cubin);
    free(k);
    k = next;
  }
  spec->kernels = NULL;
}
