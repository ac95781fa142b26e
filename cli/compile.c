/*
 * cli/compile.c: `flexjit compile SPEC.lua`: compile (or find in the cache)
 * the forward kernel of a spec, optionally writing its CUDA source. Works
 * without a GPU when --arch is given.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "runtime/context.h"
#include "runtime/forward.h"

static const char compile_usage[] =
    "usage: flexjit compile SPEC.lua [options]\n"
    "\n"
    "Compiles the forward kernel of SPEC.lua with NVRTC, or finds it in the\n"
    "kernel cache, and prints its key, readable name and cubin path. Needs no\n"
    "GPU when --arch is given.\n"
    "\n"
    "options:\n"
    "  --arch ARCH         target, e.g. sm_80, sm_90a (default: the GPU's)\n"
    "  --head-dim D        64, 128, or 256 (sm_90a only; default 128)\n"
    "  --dtype T           bf16 or fp16 (default bf16)\n"
    "  --emit-cuda FILE    also write the generated CUDA source to FILE\n"
    "  --emit-cubin FILE   also write the kernel's cubin to FILE (for\n"
    "                      cuobjdump -sass; bench/sass_check.py)\n"
    "  --cache-dir DIR     kernel cache root (default $FLEXJIT_CACHE_DIR, else\n"
    "                      $XDG_CACHE_HOME/flexjit, else ~/.cache/flexjit)\n"
    "  --pack FILE         mount a .fjpack (flexjit precompile); searched\n"
    "                      before the cache, in the order given (repeatable)\n"
    "  --help              this text\n"
    "\n"
    "Without NVRTC (FLEXJIT_NVRTC naming a library that does not load) only\n"
    "kernels in a pack or the cache are found. Warnings (an unwritable\n"
    "cache, a corrupt entry) go to stderr.\n";

typedef struct compile_opts {
  const char *spec, *arch, *emit, *emit_cubin, *cache_dir;
  const char *packs[CLI_MAX_PACKS];
  int num_packs;
  fj_kernel_options k;
} compile_opts;

int cli_parse_dtype(const char *s, fj_dtype *out) {
  if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) {
    *out = FJ_DTYPE_BF16;
    return 0;
  }
  if (!strcmp(s, "fp16") || !strcmp(s, "f16") || !strcmp(s, "float16")) {
    *out = FJ_DTYPE_F16;
    return 0;
  }
  return -1;
}

/* Returns -1 to go on, else an exit status. */
static int parse_compile(int argc, char **argv, compile_opts *o) {
  memset(o, 0, sizeof *o);
  o->k.head_dim = 128;
  o->k.dtype = FJ_DTYPE_BF16;
  for (int i = 1; i < argc; i++) {
    const char *v = NULL, *a = argv[i];
    int m;
    long d;
    if (cli_is_help(a)) {
      fputs(compile_usage, stdout);
      return CLI_OK;
    }
    if ((m = cli_opt_value(argc, argv, &i, "--arch", &v)) > 0) {
      o->arch = v;
    } else if (m == 0 &&
               (m = cli_opt_value(argc, argv, &i, "--head-dim", &v)) > 0) {
      if (cli_parse_int(v, 1, 1 << 16, &d) != 0) {
        cli_error("compile", "--head-dim: '%s' is not a number", v);
        return CLI_USAGE;
      }
      o->k.head_dim = (int)d;
    } else if (m == 0 &&
               (m = cli_opt_value(argc, argv, &i, "--dtype", &v)) > 0) {
      if (cli_parse_dtype(v, &o->k.dtype) != 0) {
        cli_error("compile", "--dtype: '%s' is not bf16 or fp16", v);
        return CLI_USAGE;
      }
    } else if (m == 0 &&
               (m = cli_opt_value(argc, argv, &i, "--emit-cuda", &v)) > 0) {
      o->emit = v;
    } else if (m == 0 &&
               (m = cli_opt_value(argc, argv, &i, "--emit-cubin", &v)) > 0) {
      o->emit_cubin = v;
    } else if (m == 0 &&
               (m = cli_opt_value(argc, argv, &i, "--cache-dir", &v)) > 0) {
      o->cache_dir = v;
    } else if (m == 0 &&
               (m = cli_opt_value(argc, argv, &i, "--pack", &v)) > 0) {
      if (o->num_packs == CLI_MAX_PACKS) {
        cli_error("compile", "at most %d --pack files", CLI_MAX_PACKS);
        return CLI_USAGE;
      }
      o->packs[o->num_packs++] = v;
    } else if (m < 0) {
      cli_error("compile", "%s needs a value", a);
      return CLI_USAGE;
    } else if (a[0] == '-' && a[1]) {
      cli_error("compile", "unknown option '%s' (see --help)", a);
      return CLI_USAGE;
    } else if (o->spec) {
      cli_error("compile", "more than one spec given ('%s', '%s')", o->spec,
                a);
      return CLI_USAGE;
    } else {
      o->spec = a;
    }
  }
  if (!o->spec) {
    cli_error("compile", "no spec given (usage: flexjit compile SPEC.lua)");
    return CLI_USAGE;
  }
  return -1;
}

int cli_mount_packs(fj_context *ctx, const char *cmd, const char *const *packs,
                    int n) {
  for (int i = 0; i < n; i++)
    if (fj_context_mount_pack(ctx, packs[i]) != FJ_OK) {
      cli_error(cmd, "--pack %s: %s", packs[i], fj_context_last_error(ctx));
      return CLI_FAIL;
    }
  return -1;
}

int cli_compile_one(fj_context *ctx, const fj_spec *spec, const char *path,
                    const fj_kernel_options *opts, int verbose,
                    int *from_cache, double *ms) {
  fj_kernel_info info;
  memset(&info, 0, sizeof info);
  fj_status st = fj_compile_forward(ctx, spec, opts, &info);
  if (st != FJ_OK) {
    cli_error("compile", "%s (%s): %s", path, opts->arch ? opts->arch : "",
              fj_context_last_error(ctx));
    return CLI_FAIL;
  }
  if (from_cache) *from_cache = info.from_cache;
  if (ms) *ms = info.compile_ms;
  if (!verbose) {
    printf("  %-46s %-8s %s  %s\n", info.name,
           info.from_cache ? "cached" : "compiled", info.key,
           info.cubin_path[0] ? "" : "(memory only)");
    return CLI_OK;
  }
  printf("spec    %s (%s)\n", fj_spec_name(spec), path);
  printf("kernel  %s\n", info.name);
  printf("key     %s\n", info.key);
  printf("arch    %s (template %s)\n", info.arch, info.kernel_template);
  printf("cubin   %s (%zu bytes)\n",
         info.cubin_path[0] ? info.cubin_path : "(memory only)",
         info.cubin_size);
  if (info.from_cache)
    printf("from cache (NVRTC not called)\n");
  else
    printf("compiled in %.1f ms\n", info.compile_ms);
  return CLI_OK;
}

/* --emit-cubin: the kernel's cubin, as NVRTC made it, to path. */
static int write_cubin(fj_context *ctx, const fj_spec *spec, const fj_kernel_options *k,
                       const char *path) {
  const void *data;
  size_t size;
  if (fjr_forward_cubin(ctx, spec, k, &data, &size) != FJ_OK) {
    cli_error("compile", "--emit-cubin %s: %s", path, fj_context_last_error(ctx));
    return CLI_FAIL;
  }
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(data, 1, size, f) == size;
  int err = errno;
  if (f && fclose(f) != 0 && ok) {
    ok = 0;
    err = errno;
  }
  if (!ok) {
    cli_error("compile", "--emit-cubin %s: %s", path, strerror(err));
    return CLI_FAIL;
  }
  printf("cubin   written to %s\n", path);
  return CLI_OK;
}

int cmd_compile(int argc, char **argv) {
  compile_opts o;
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  fj_context_options copts;
  int rc = parse_compile(argc, argv, &o);
  if (rc >= 0) return rc;
  rc = CLI_FAIL;
  fj_context_options_init(&copts);
  copts.cache_dir = o.cache_dir;
  copts.arch = o.arch;
  copts.log = cli_log;
  copts.log_user = (void *)"compile";
  if (fj_context_create(&copts, &ctx) != FJ_OK) {
    cli_error("compile", "cannot create a context");
    goto fail;
  }
  if ((rc = cli_mount_packs(ctx, "compile", o.packs, o.num_packs)) >= 0)
    goto fail;
  rc = CLI_FAIL;
  if (!o.arch && fjr_context_arch(ctx, &o.arch) != FJ_OK) {
    cli_error("compile", "no GPU found: pass --arch (e.g. --arch sm_90a) [%s]",
              fj_context_last_error(ctx));
    rc = CLI_USAGE;
    goto fail;
  }
  o.k.arch = o.arch;
  if (fj_spec_load_file(ctx, o.spec, &spec) != FJ_OK) {
    cli_error("compile", "%s", fj_context_last_error(ctx));
    goto fail;
  }
  if (o.emit && fj_emit_forward_source(ctx, spec, &o.k, o.emit) != FJ_OK) {
    cli_error("compile", "--emit-cuda %s: %s", o.emit,
              fj_context_last_error(ctx));
    goto fail;
  }
  rc = cli_compile_one(ctx, spec, o.spec, &o.k, 1, NULL, NULL);
  if (rc == CLI_OK && o.emit) printf("source  %s\n", o.emit);
  if (rc == CLI_OK && o.emit_cubin) rc = write_cubin(ctx, spec, &o.k, o.emit_cubin);
fail:
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  return rc;
}
