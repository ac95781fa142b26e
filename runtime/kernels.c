/*
 * runtime/kernels.c: compile-or-fetch and module loading for every kernel
 * kind (see kernels.h).
 */
#include "runtime/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cache/prune.h"
#include "runtime/context_impl.h"
#include "runtime/nvrtc.h"

enum { FJR_MAX_OPTIONS = 24, FJR_DEFINES_BYTES = 1024 };

/* NVRTC's --Ofast-compile=max (FLEXJIT_FAST_COMPILE=1), for iterating on a
 * spec: about three times faster to compile and hundreds of times slower to
 * run (no inlining, serialized wgmma, setmaxnreg ignored). It is in the
 * key, so these kernels never stand in for optimized ones. */
#define FJR_FAST_COMPILE_OPTION "--Ofast-compile=max"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Every field that shapes a kernel: two configurations that agree here
 * emit the same translation unit. */
static int same_config(const fjg_config *a, const fjg_config *b) {
  const char *ta = a->template_name ? a->template_name : "";
  const char *tb = b->template_name ? b->template_name : "";
  return a->head_dim == b->head_dim && a->dtype == b->dtype &&
         !strcmp(a->arch, b->arch) && !strcmp(ta, tb) && a->block_m == b->block_m &&
         a->block_n == b->block_n && a->num_warps == b->num_warps &&
         a->num_stages == b->num_stages && a->persistent == b->persistent &&
         a->q_bufs == b->q_bufs && a->smem_bytes == b->smem_bytes &&
         a->deterministic == b->deterministic && a->varlen == b->varlen &&
         a->skip == b->skip;
}

/* NVRTC options of a kernel besides the target: the base ones, then for a
 * tuned kind ptxas's resource report (log only: the spill refit reads it),
 * fast compile, and one -DNAME=VALUE for each entry of
 * $FLEXJIT_KERNEL_DEFINES ("NAME=VALUE ..."), optional template macros.
 * Returns the count, or -1 with the context's error set. */
static int compile_options(fj_context *ctx, const fjr_kernel_kind *kind,
                           const char **opts, char storage[FJR_DEFINES_BYTES]) {
  int n = 0;
  const char *const *base = fjr_nvrtc_base_options(&n);
  for (int i = 0; i < n; i++) opts[i] = base[i];
  if (!kind->tuned) return n;
  opts[n++] = "--ptxas-options=-v";
  if (ctx->opts.fast_compile) opts[n++] = FJR_FAST_COMPILE_OPTION;
  const char *env = ctx->opts.kernel_defines;
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
      ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '_' || (i > name_len && (c == '.' || c == '-' || c == '+')) ||
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

/* The translation unit's body, its keys' common part and the banner. */
static fj_status make_source(fj_context *ctx, const fj_spec *spec,
                             const fjr_kernel_kind *kind, const fjg_config *cfg,
                             const char *const *opts, int nopt, fjg_buf *out,
                             fjc_key *source_key) {
  fjg_buf body;
  fjg_buf_init(&body);
  fjg_buf_init(out);
  fj_status st = kind->emit(spec->graph, cfg, &body);
  if (st != FJ_OK || body.failed) {
    fjg_buf_free(&body);
    return fjr_fail(ctx, st != FJ_OK ? st : FJ_ENOMEM,
                    "emitting the %s kernel of spec '%s' failed", kind->pass,
                    spec->name);
  }
  fjc_key_builder b;
  fjc_key_begin(&b);
  fjc_key_add_str(&b, "libver", FJ_VERSION_STRING);
  fjc_key_add_str(&b, "pass", kind->pass);
  fjc_key_add_str(&b, "arch", cfg->arch);
  for (int i = 0; i < nopt; i++) fjc_key_add_str(&b, "option", opts[i]);
  fjc_key_add(&b, "source", body.data, body.len);
  fjc_key_finish(&b, source_key);
  fjg_buf_printf(out, "// flexjit %s %s kernel, source key %s\n"
                      "// Generated; do not edit.\n",
                 FJ_VERSION_STRING, kind->pass, source_key->hex);
  fjg_buf_append(out, body.data, body.len);
  fjg_buf_append(out, "", 1); /* NUL-terminate */
  fjg_buf_free(&body);
  if (out->failed) {
    fjg_buf_free(out);
    return fjr_fail(ctx, FJ_ENOMEM, "out of memory emitting a kernel");
  }
  return FJ_OK;
}

fj_status fjr_kernel_source(fj_context *ctx, const fj_spec *spec,
                            const fjr_kernel_kind *kind, const fjg_config *cfg,
                            fjg_buf *out, fjc_key *source_key) {
  const char *opts[FJR_MAX_OPTIONS];
  char defines[FJR_DEFINES_BYTES];
  int nopt = compile_options(ctx, kind, opts, defines);
  if (nopt < 0) return FJ_EINVAL;
  return make_source(ctx, spec, kind, cfg, opts, nopt, out, source_key);
}

/* FLEXJIT_DUMP_DIR: a copy of what was compiled. */
static void dump_source(fj_context *ctx, const fjr_kernel *k, const fjg_buf *src) {
  const char *dir = ctx->opts.dump_dir;
  if (!dir) return;
  mkdir(dir, 0755);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s-%s.cu", dir, k->name, k->key.hex);
  FILE *f = fopen(path, "wb");
  int bad = !f || fwrite(src->data, 1, src->len - 1, f) != src->len - 1;
  if (f && fclose(f) != 0) bad = 1;
  if (bad) fjr_log(ctx, FJ_LOG_WARN, "FLEXJIT_DUMP_DIR: cannot write %s", path);
}

/* When ptxas reports spills and the configuration names an option that
 * keeps fewer registers live (fjg_config.spill_fallback), compiles again
 * with it, unless the options already set that macro, and keeps the cubin
 * that spills less. Deterministic for a given source and NVRTC, so the key
 * still names one cubin. */
static void refit_spilling(fj_context *ctx, const fjr_nvrtc *nv, const char *src,
                           fjr_kernel *k, const char **opts, int nopt, char **log) {
  const char *fallback = k->cfg.spill_fallback;
  long spilled = fjr_nvrtc_log_spill_bytes(*log);
  /* A fast compile spills by design; a second compile would only cost time. */
  if (!fallback || spilled <= 0 || nopt >= FJR_MAX_OPTIONS || ctx->opts.fast_compile)
    return;
  size_t macro = strcspn(fallback, "=");
  for (int i = 0; i < nopt; i++)
    if (strncmp(opts[i], fallback, macro) == 0) return;
  const char *opts2[FJR_MAX_OPTIONS + 1];
  for (int i = 0; i < nopt; i++) opts2[i] = opts[i];
  opts2[nopt] = fallback;
  void *cubin = NULL;
  size_t size = 0;
  char *log2 = NULL;
  if (fjr_nvrtc_compile(nv, src, k->name, k->cfg.arch, opts2, nopt + 1, &cubin, &size,
                        &log2, NULL, 0) != FJ_OK) {
    free(log2); /* keep the first cubin; it compiled */
    return;
  }
  long spilled2 = fjr_nvrtc_log_spill_bytes(log2);
  if (spilled2 >= 0 && spilled2 < spilled) {
    fjr_log(ctx, FJ_LOG_INFO, "%s: %ld bytes of spills, %ld with %s: compiled with it",
            k->name, spilled, spilled2, fallback);
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

/* Appends s as a JSON string: valid UTF-8 sequences as they are, control
 * characters, quotes and backslashes escaped, and every byte that is not
 * part of a valid UTF-8 sequence as U+FFFD, so the sidecar is always valid
 * JSON whatever bytes a spec holds. */
static void put_json_string(fjg_buf *out, const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  fjg_buf_append(out, "\"", 1);
  while (p < end) {
    unsigned c = *p;
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    int ok = len > 0 && p + len <= end;
    unsigned cp = len == 1 ? c : len ? c & (0x7f >> len) : 0;
    for (int i = 1; ok && i < len; i++) {
      ok = (p[i] & 0xc0) == 0x80;
      cp = cp << 6 | (p[i] & 0x3f);
    }
    /* Overlong forms, surrogates and values past U+10FFFF are not UTF-8. */
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
               (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
               (cp >= 0xd800 && cp <= 0xdfff)))
      ok = 0;
    if (!ok) {
      fjg_buf_append(out, "\\ufffd", 6);
      p++;
    } else if (c == '"' || c == '\\') {
      fjg_buf_printf(out, "\\%c", c);
      p++;
    } else if (c == '\n') {
      fjg_buf_append(out, "\\n", 2);
      p++;
    } else if (c < 0x20 || c == 0x7f) {
      fjg_buf_printf(out, "\\u%04x", c);
      p++;
    } else {
      fjg_buf_append(out, p, (size_t)len);
      p += len;
    }
  }
  fjg_buf_append(out, "\"", 1);
}

/* The .json sidecar beside a stored cubin, for people. */
static void sidecar(const fj_spec *spec, const fjr_kernel *k, const char *nvrtc_version,
                    fjg_buf *out) {
  const fjg_config *c = &k->cfg;
  fjg_buf_init(out);
  fjg_buf_printf(out, "{\"key\": \"%s\", \"source_key\": \"%s\", \"nvrtc\": \"%s\", "
                      "\"pass\": \"%s\", \"name\": \"%s\", \"arch\": \"%s\", ",
                 k->key.hex, k->source_key.hex, nvrtc_version, k->kind->pass, k->name,
                 c->arch);
  if (c->template_name)
    fjg_buf_printf(out, "\"template\": \"%s\", \"head_dim\": %d, \"dtype\": \"%s\", "
                        "\"block_m\": %d, \"block_n\": %d, \"num_warps\": %d, ",
                   c->template_name, c->head_dim,
                   c->dtype == FJ_DTYPE_BF16 ? "bf16" : "fp16", c->block_m, c->block_n,
                   c->num_warps);
  fjg_buf_printf(out, "\"compile_ms\": %.1f, \"spec\": ", k->compile_ms);
  put_json_string(out, spec->chunkname, strlen(spec->chunkname));
  fjg_buf_printf(out, ", \"source\": ");
  put_json_string(out, spec->source, spec->source_len);
  fjg_buf_append(out, "}\n", 3); /* with the NUL */
}

/* The mounted packs, by full key, or by source key when NVRTC is
 * unavailable (any compiler's build of the same source). */
static fj_status find_in_packs(fj_context *ctx, fjr_kernel *k, int nvrtc_ok) {
  for (int i = 0; i < ctx->num_packs; i++) {
    void *data = NULL;
    size_t size = 0;
    if (fjc_pack_find(ctx->packs[i], k->cfg.arch, nvrtc_ok ? &k->key : NULL,
                      &k->source_key, &data, &size, NULL) != FJ_OK)
      continue;
    k->cubin = data;
    k->cubin_size = size;
    snprintf(k->path, sizeof k->path, "%s", fjc_pack_path(ctx->packs[i]));
    return FJ_OK;
  }
  return FJ_ENOTFOUND;
}

/* Compiles k from src and publishes it; the caller holds the key's lock. */
static fj_status compile(fj_context *ctx, const fj_spec *spec, const fjr_nvrtc *nv,
                         const char *nvrtc_version, fjr_kernel *k, const fjg_buf *src,
                         const char **opts, int nopt, fjc_store *store) {
  char err[1024] = "";
  char *log = NULL;
  dump_source(ctx, k, src);
  double t0 = now_ms();
  fj_status st = fjr_nvrtc_compile(nv, src->data, k->name, k->cfg.arch, opts, nopt,
                                   &k->cubin, &k->cubin_size, &log, err, sizeof err);
  if (st == FJ_OK) refit_spilling(ctx, nv, src->data, k, opts, nopt, &log);
  k->compile_ms = now_ms() - t0;
  if (st != FJ_OK) {
    st = fjr_fail(ctx, st, "compiling %s (key %s) failed: %s%s%s", k->name, k->key.hex,
                  err, log ? "\nNVRTC log:\n" : "", log ? log : "");
    free(log);
    return st;
  }
  free(log);
  fjr_log(ctx, FJ_LOG_INFO, "compiled %s in %.1f ms", k->name, k->compile_ms);
  if (!store) return FJ_OK;
  fjg_buf meta;
  sidecar(spec, k, nvrtc_version, &meta);
  if (fjc_store_put(store, k->cfg.arch, &k->key, &k->source_key, k->cubin,
                    k->cubin_size, meta.failed ? NULL : meta.data, k->path,
                    sizeof k->path, NULL, 0) != FJ_OK)
    k->path[0] = '\0'; /* in memory only; the store warned */
  else
    fjc_store_prune_to_limit(store);
  fjg_buf_free(&meta);
  return FJ_OK;
}

/* Finds or compiles k's cubin (k->cfg, kind and name set). */
/* Looks k up by its full key (compiler known) or, when no compiler here
 * can make it, by source key: the build any compiler made of this source. */
static fj_status lookup(fj_context *ctx, fjc_store *store, fjr_kernel *k, int by_key) {
  if (find_in_packs(ctx, k, by_key) == FJ_OK) return FJ_OK;
  if (!store) return FJ_ENOTFOUND;
  return by_key ? fjc_store_get(store, k->cfg.arch, &k->key, &k->cubin, &k->cubin_size,
                                k->path, sizeof k->path, NULL, 0)
                : fjc_store_get_by_source(store, k->cfg.arch, &k->source_key, &k->key,
                                          &k->cubin, &k->cubin_size, k->path,
                                          sizeof k->path, NULL, 0);
}

/* Finds or compiles k's cubin (k->cfg, kind and name set). */
static fj_status fetch(fj_context *ctx, const fj_spec *spec, fjr_kernel *k) {
  const char *opts[FJR_MAX_OPTIONS];
  char defines[FJR_DEFINES_BYTES];
  int nopt = compile_options(ctx, k->kind, opts, defines);
  if (nopt < 0) return FJ_EINVAL;
  const fjr_nvrtc *nv = NULL;
  char why[768] = "", nvrtc_version[32] = "unavailable";
  /* Whether NVRTC is here and compiles for the target; why not, if not. */
  int can_compile = fjr_nvrtc_load(ctx->opts.nvrtc_path, &nv, why, sizeof why) == FJ_OK;
  if (can_compile) {
    int major = 0, minor = 0, sm = 0;
    fjr_nvrtc_version(nv, &major, &minor);
    snprintf(nvrtc_version, sizeof nvrtc_version, "%d.%d", major, minor);
    fjg_arch_check(k->cfg.arch, &sm, NULL, 0);
    if (!fjr_nvrtc_supports(nv, sm)) {
      snprintf(why, sizeof why, "NVRTC %s does not compile for %s", nvrtc_version,
               k->cfg.arch);
      can_compile = 0;
    }
  }
  fjg_buf src;
  fj_status st = make_source(ctx, spec, k->kind, &k->cfg, opts, nopt, &src, &k->source_key);
  if (st != FJ_OK) return st;
  fjc_key_with_nvrtc(&k->source_key, nvrtc_version, &k->key);

  fjc_store *store = NULL;
  fjr_context_store(ctx, &store);
  int lock_fd = -1;
  k->from_cache = 1;
  if (lookup(ctx, store, k, can_compile) == FJ_OK) goto done;
  if (!can_compile) {
    st = fjr_fail(ctx, nv ? FJ_EUNSUPPORTED : FJ_ENONVRTC,
                  "kernel %s (key %s, source key %s) is in no mounted pack or cache "
                  "and cannot be compiled here: %s",
                  k->name, k->key.hex, k->source_key.hex, why);
    goto done;
  }
  if (store) {
    fjc_store_lock(store, k->cfg.arch, &k->key, &lock_fd, NULL, 0);
    /* Another process may have compiled it while we waited. */
    if (fjc_store_get(store, k->cfg.arch, &k->key, &k->cubin, &k->cubin_size, k->path,
                      sizeof k->path, NULL, 0) == FJ_OK)
      goto done;
  }
  k->from_cache = 0;
  st = compile(ctx, spec, nv, nvrtc_version, k, &src, opts, nopt, store);
done:
  if (lock_fd >= 0) fjc_store_unlock(lock_fd);
  fjg_buf_free(&src);
  return st;
}

fj_status fjr_kernel_get(fj_context *ctx, fj_spec *spec, const fjr_kernel_kind *kind,
                         const fjg_config *cfg, fjr_kernel **out, int *resident) {
  for (fjr_kernel *k = spec->kernels; k; k = k->next)
    if (k->kind == kind && same_config(&k->cfg, cfg)) {
      *out = k;
      if (resident) *resident = 1;
      return FJ_OK;
    }
  if (resident) *resident = 0;
  if (ctx->opts.bad[0]) return fjr_fail(ctx, FJ_EINVAL, "%s", ctx->opts.bad);
  fjr_kernel *k = calloc(1, sizeof *k);
  if (!k) return fjr_fail(ctx, FJ_ENOMEM, "out of memory");
  k->kind = kind;
  k->cfg = *cfg;
  char clean[48];
  size_t j = 0;
  for (const char *s = spec->name; *s && j + 1 < sizeof clean; s++) {
    char c = *s;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '_';
    clean[j++] = ok ? c : '_';
  }
  clean[j] = '\0';
  kind->name(clean, cfg, k->name, sizeof k->name);
  fj_status st = fetch(ctx, spec, k);
  if (st != FJ_OK) {
    free(k->cubin);
    free(k);
    return st;
  }
  k->next = spec->kernels;
  spec->kernels = k;
  *out = k;
  return FJ_OK;
}

fj_status fjr_kernel_load(fj_context *ctx, fjr_kernel *k) {
  if (k->module) return FJ_OK;
  const fjr_driver *d = ctx->drv;
  const char *what = k->kind->entries[0];
  CUresult r = d->cuModuleLoadData(&k->module, k->cubin);
  if (r != CUDA_SUCCESS) {
    k->module = NULL;
    return fjr_cu_fail(ctx, "cuModuleLoadData", r);
  }
  for (int i = 0; i < k->kind->num_entries && r == CUDA_SUCCESS; i++) {
    what = k->kind->entries[i];
    r = d->cuModuleGetFunction(&k->fn[i], k->module, what);
  }
  fj_status st = FJ_OK;
  if (r != CUDA_SUCCESS) {
    st = fjr_cu_fail(ctx, "cuModuleGetFunction", r);
    goto fail;
  }
  if (k->cfg.smem_bytes > 0) {
    /* Dynamic plus static shared memory must fit the block's opt-in limit. */
    int static_smem = 0;
    if (d->cuFuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                              k->fn[0]) != CUDA_SUCCESS)
      static_smem = 0;
    if (k->cfg.smem_bytes + static_smem > ctx->max_smem_optin) {
      st = fjr_fail(ctx, FJ_EUNSUPPORTED,
                    "kernel %s needs %d bytes of shared memory (%d dynamic, %d "
                    "static), the device allows %d",
                    k->name, k->cfg.smem_bytes + static_smem, k->cfg.smem_bytes,
                    static_smem, ctx->max_smem_optin);
      goto fail;
    }
    r = d->cuFuncSetAttribute(k->fn[0], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                              k->cfg.smem_bytes);
    if (r != CUDA_SUCCESS) {
      st = fjr_cu_fail(ctx, "cuFuncSetAttribute", r);
      goto fail;
    }
  }
  free(k->cubin); /* the driver keeps its own copy */
  k->cubin = NULL;
  return FJ_OK;
fail:
  d->cuModuleUnload(k->module);
  k->module = NULL;
  return st;
}

void fjr_kernel_info(const fjr_kernel *k, int resident, fj_kernel_info *info) {
  memset(info, 0, sizeof *info);
  snprintf(info->key, sizeof info->key, "%s", k->key.hex);
  snprintf(info->source_key, sizeof info->source_key, "%s", k->source_key.hex);
  snprintf(info->name, sizeof info->name, "%s", k->name);
  snprintf(info->cubin_path, sizeof info->cubin_path, "%s", k->path);
  snprintf(info->arch, sizeof info->arch, "%s", k->cfg.arch);
  snprintf(info->kernel_template, sizeof info->kernel_template, "%s",
           k->cfg.template_name ? k->cfg.template_name : "");
  info->from_cache = resident || k->from_cache;
  info->compile_ms = resident ? 0 : k->compile_ms;
  info->cubin_size = k->cubin_size;
}

void fjr_kernels_release(fj_context *ctx, fjr_kernel *k) {
  while (k) {
    fjr_kernel *next = k->next;
    if (k->module && ctx->drv) ctx->drv->cuModuleUnload(k->module);
    free(k->cubin);
    free(k);
    k = next;
  }
}

int fjr_kernel_occupancy(fj_context *ctx, fjr_kernel *k) {
  if (k->occupancy > 0) return k->occupancy;
  int n = 0;
  if (ctx->drv->cuOccupancyMaxActiveBlocksPerMultiprocessor(
          &n, k->fn[0], k->cfg.threads, (size_t)k->cfg.smem_bytes) != CUDA_SUCCESS ||
      n < 1)
    n = 1;
  return k->occupancy = n;
}

int64_t fjr_kernel_grid(const fjg_config *cfg, int num_sms, int64_t tiles, int64_t heads,
                        int64_t B, unsigned grid[3]) {
  const int64_t items = tiles * heads * B;
  if (cfg->persistent) {
    grid[0] = (unsigned)(items < num_sms ? items : num_sms);
    grid[1] = grid[2] = 1;
  } else {
    grid[0] = (unsigned)tiles, grid[1] = (unsigned)heads, grid[2] = (unsigned)B;
  }
  return items;
}

fj_status fjr_launch(fj_context *ctx, const fjr_kernel *k, int entry, const unsigned grid[3],
                     unsigned threads, unsigned smem, CUstream stream, void **kernel_params,
                     void **extra, int after_kernel, const char *what) {
  CUlaunchAttribute attr;
  memset(&attr, 0, sizeof attr);
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig lc;
  memset(&lc, 0, sizeof lc);
  lc.gridDimX = grid[0], lc.gridDimY = grid[1], lc.gridDimZ = grid[2];
  lc.blockDimX = threads, lc.blockDimY = 1, lc.blockDimZ = 1;
  lc.sharedMemBytes = smem;
  lc.hStream = stream;
  lc.attrs = &attr;
  lc.numAttrs = after_kernel && k->cfg.sm >= 90 ? 1 : 0;
  CUresult r = ctx->drv->cuLaunchKernelEx(&lc, k->fn[entry], kernel_params, extra);
  return r == CUDA_SUCCESS ? FJ_OK : fjr_cu_fail(ctx, what, r);
}
