/*
 * runtime/nvrtc.c: NVRTC loaded lazily with dlopen (see nvrtc.h).
 *
 * nvrtc.h is included for its types only; every call goes through the table,
 * so the library has no link-time dependency on libnvrtc.
 */
#include "runtime/nvrtc.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

#include "runtime/dl.h"

struct fjr_nvrtc {
  const char *(*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int *, int *);
  nvrtcResult (*GetNumSupportedArchs)(int *);
  nvrtcResult (*GetSupportedArchs)(int *);
  nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *,
                               int, const char *const *,
                               const char *const *);
  nvrtcResult (*DestroyProgram)(nvrtcProgram *);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
  int major, minor;
  int num_archs;
  int archs[64]; /* the sm numbers this NVRTC compiles for */
};

static const char *const default_candidates[] = {
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so",
    "/usr/local/cuda/lib64/libnvrtc.so.13",
};

/* Minimal on purpose: every option here changes the cubin, and all of them
 * go into the cache key. */
static const char *const base_options[] = {
    "-std=c++17",
    "-default-device",
};

const char *const *fjr_nvrtc_base_options(int *n) {
  if (n)
    *n = (int)(sizeof base_options / sizeof base_options[0]);
  return base_options;
}

#define FJR_NVRTC_SYM(field)                                                  \
  do {                                                                        \
    if (fjr_dl_sym(h, lib, "nvrtc" #field, &fn->field, err, errlen))          \
      return -1;                                                              \
  } while (0)

static int init_nvrtc(void *h, const char *lib, void *table, char *err,
                      size_t errlen) {
  fjr_nvrtc *fn = table;
  FJR_NVRTC_SYM(GetErrorString);
  FJR_NVRTC_SYM(Version);
  FJR_NVRTC_SYM(GetNumSupportedArchs);
  FJR_NVRTC_SYM(GetSupportedArchs);
  FJR_NVRTC_SYM(CreateProgram);
  FJR_NVRTC_SYM(DestroyProgram);
  FJR_NVRTC_SYM(CompileProgram);
  FJR_NVRTC_SYM(GetProgramLogSize);
  FJR_NVRTC_SYM(GetProgramLog);
  FJR_NVRTC_SYM(GetCUBINSize);
  FJR_NVRTC_SYM(GetCUBIN);
  nvrtcResult r = fn->Version(&fn->major, &fn->minor);
  if (r == NVRTC_SUCCESS) r = fn->GetNumSupportedArchs(&fn->num_archs);
  if (r == NVRTC_SUCCESS && (fn->num_archs < 1 || fn->num_archs > 64)) {
    snprintf(err, errlen, "%s: nvrtcGetNumSupportedArchs says %d", lib, fn->num_archs);
    return -1;
  }
  if (r == NVRTC_SUCCESS) r = fn->GetSupportedArchs(fn->archs);
  if (r != NVRTC_SUCCESS) {
    snprintf(err, errlen, "%s: nvrtcVersion or nvrtcGetSupportedArchs failed: %s",
             lib, fn->GetErrorString(r));
    return -1;
  }
  return 0;
}

#undef FJR_NVRTC_SYM

fj_status fjr_nvrtc_load(const char *path, const fjr_nvrtc **out, char *err,
                         size_t errlen) {
  const char *const given[] = {path};
  const int n = (int)(sizeof default_candidates / sizeof default_candidates[0]);
  const void *table = NULL;
  char why[768] = "";
  fj_status st = fjr_dl_load("NVRTC", path ? given : default_candidates,
                             path ? 1 : n, init_nvrtc, sizeof(fjr_nvrtc),
                             FJ_ENONVRTC, &table, why, sizeof why);
  *out = table;
  if (st != FJ_OK && err && errlen)
    snprintf(err, errlen, "%s%s", why,
             path ? " (FLEXJIT_NVRTC names it)" : "; set FLEXJIT_NVRTC to its path");
  else if (err && errlen)
    err[0] = '\0';
  return st;
}

void fjr_nvrtc_version(const fjr_nvrtc *fn, int *major, int *minor) {
  if (major) *major = fn->major;
  if (minor) *minor = fn->minor;
}

int fjr_nvrtc_supports(const fjr_nvrtc *fn, int sm) {
  for (int i = 0; i < fn->num_archs; i++)
    if (fn->archs[i] == sm) return 1;
  return 0;
}

/* "sm_80", "sm_90a", "sm_100f": a real target, so NVRTC emits a cubin. */
static int is_real_arch(const char *arch) {
  if (strncmp(arch, "sm_", 3) != 0 || !isdigit((unsigned char)arch[3]))
    return 0;
  const char *p = arch + 3;
  while (isdigit((unsigned char)*p))
    p++;
  while (isalpha((unsigned char)*p))
    p++;
  return *p == '\0' && (size_t)(p - arch) < 16;
}

/* Copies NVRTC's log into a malloc'd string; NULL when empty or on OOM. */
static char *fetch_log(const fjr_nvrtc *fn, nvrtcProgram prog) {
  size_t size = 0;
  if (fn->GetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size <= 1)
    return NULL;
  char *text = malloc(size);
  if (!text)
    return NULL;
  if (fn->GetProgramLog(prog, text) != NVRTC_SUCCESS) {
    free(text);
    return NULL;
  }
  text[size - 1] = '\0';
  return text;
}

/* The first log line that mentions "error", for a one-line summary. */
static void first_error_line(const char *log, char *out, size_t n) {
  out[0] = '\0';
  if (!log)
    return;
  const char *hit = strstr(log, "error");
  if (!hit)
    return;
  const char *start = hit;
  while (start > log && start[-1] != '\n')
    start--;
  size_t len = strcspn(start, "\n");
  snprintf(out, n, "%.*s", (int)len, start);
}

static fj_status compile_failure(const char *name, const char *arch,
                                 nvrtcResult r, const fjr_nvrtc *fn,
                                 const char *log, char *err, size_t errlen) {
  char line[256];
  first_error_line(log, line, sizeof line);
  snprintf(err, errlen, "NVRTC failed to compile %s for %s: %s%s%s", name,
           arch, fn->GetErrorString(r), line[0] ? ": " : "", line);
  return FJ_ECOMPILE;
}

/* Reads the cubin out of a compiled program. */
static fj_status take_cubin(const fjr_nvrtc *fn, nvrtcProgram prog,
                            const char *name, const char *arch, void **cubin,
                            size_t *cubin_size, char *err, size_t errlen) {
  size_t size = 0;
  nvrtcResult r = fn->GetCUBINSize(prog, &size);
  if (r != NVRTC_SUCCESS || size == 0) {
    snprintf(err, errlen,
             "NVRTC produced no cubin for %s (%s): only PTX was generated; "
             "the target must be a real sm_XX architecture",
             name, arch);
    return FJ_ECOMPILE;
  }
  char *bytes = malloc(size);
  if (!bytes) {
    snprintf(err, errlen, "out of memory for a %zu-byte cubin", size);
    return FJ_ENOMEM;
  }
  r = fn->GetCUBIN(prog, bytes);
  if (r != NVRTC_SUCCESS) {
    free(bytes);
    snprintf(err, errlen, "nvrtcGetCUBIN failed for %s: %s", name,
             fn->GetErrorString(r));
    return FJ_ECOMPILE;
  }
  *cubin = bytes;
  *cubin_size = size;
  return FJ_OK;
}

/* "--gpu-architecture=<arch>" followed by the caller's options. */
static const char **build_options(const char *arch_opt,
                                  const char *const *extra, int n_extra) {
  const char **opts = malloc(sizeof *opts * (size_t)(n_extra + 1));
  if (!opts)
    return NULL;
  opts[0] = arch_opt;
  for (int i = 0; i < n_extra; i++)
    opts[i + 1] = extra[i];
  return opts;
}

static fj_status check_compile_args(const char *source, const char *arch,
                                    const char *const *extra_opts, int n_extra,
                                    void **cubin, size_t *cubin_size,
                                    char *err, size_t errlen) {
  if (!source || !arch || !cubin || !cubin_size || n_extra < 0 ||
      (n_extra > 0 && !extra_opts)) {
    snprintf(err, errlen, "fjr_nvrtc_compile: invalid argument");
    return FJ_EINVAL;
  }
  if (!is_real_arch(arch)) {
    snprintf(err, errlen,
             "'%s' is not a real GPU architecture: NVRTC only emits a cubin "
             "for sm_XX targets (\"sm_80\", \"sm_90a\")",
             arch);
    return FJ_EINVAL;
  }
  return FJ_OK;
}

fj_status fjr_nvrtc_compile(const fjr_nvrtc *fn, const char *source,
                            const char *name,
                            const char *arch, const char *const *extra_opts,
                            int n_extra, void **cubin, size_t *cubin_size,
                            char **log, char *err, size_t errlen) {
  char scratch[8];
  nvrtcProgram prog = NULL;
  const char **opts = NULL;
  char *log_text = NULL;
  char arch_opt[48];
  nvrtcResult r;
  fj_status st;

  if (!err || !errlen) {
    err = scratch;
    errlen = sizeof scratch;
  }
  err[0] = '\0';
  if (log)
    *log = NULL;
  if (!name)
    name = "kernel.cu";
  st = check_compile_args(source, arch, extra_opts, n_extra, cubin, cubin_size,
                          err, errlen);
  if (st != FJ_OK)
    goto fail;
  if (!fn) {
    snprintf(err, errlen, "NVRTC is not loaded");
    st = FJ_ENONVRTC;
    goto fail;
  }
  *cubin = NULL;
  *cubin_size = 0;
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
  opts = build_options(arch_opt, extra_opts, n_extra);
  if (!opts) {
    st = FJ_ENOMEM;
    snprintf(err, errlen, "out of memory building NVRTC options");
    goto fail;
  }
  r = fn->CreateProgram(&prog, source, name, 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    prog = NULL;
    st = r == NVRTC_ERROR_OUT_OF_MEMORY ? FJ_ENOMEM : FJ_ECOMPILE;
    snprintf(err, errlen, "nvrtcCreateProgram failed for %s: %s", name,
             fn->GetErrorString(r));
    goto fail;
  }
  r = fn->CompileProgram(prog, n_extra + 1, opts);
  log_text = fetch_log(fn, prog);
  if (r != NVRTC_SUCCESS) {
    st = compile_failure(name, arch, r, fn, log_text, err, errlen);
    goto fail;
  }
  st = take_cubin(fn, prog, name, arch, cubin, cubin_size, err, errlen);
fail:
  if (prog)
    fn->DestroyProgram(&prog);
  free(opts);
  if (log)
    *log = log_text;
  else
    free(log_text);
  return st;
}

long fjr_nvrtc_log_spill_bytes(const char *log) {
  if (!log)
    return 0;
  long total = 0;
  const char *key = "bytes spill stores";
  for (const char *p = strstr(log, key); p; p = strstr(p + 1, key)) {
    /* "... N bytes stack frame, S bytes spill stores, L bytes spill loads" */
    const char *start = p;
    while (start > log && start[-1] != ',' && start[-1] != '\n')
      start--;
    unsigned long st, ld;
    if (sscanf(start, " %lu bytes spill stores, %lu bytes spill loads", &st,
               &ld) != 2)
      return -1;
    total += (long)(st + ld);
  }
  return total;
}
