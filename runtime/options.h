/*
 * runtime/options.h: a context's settings, merged once from the caller's
 * fj_context_options and the environment when the context is created. This
 * is the only place the library reads the environment; everything after
 * context creation reads these fields.
 *
 * Variables (each optional):
 *   FLEXJIT_CACHE_DIR        cache root ("" disables the disk cache)
 *   XDG_CACHE_HOME, HOME     the default root: $XDG_CACHE_HOME/flexjit when
 *                            absolute, else $HOME/.cache/flexjit
 *   FLEXJIT_CACHE_MAX_BYTES  size limit ("500M", "2G", plain bytes)
 *   FLEXJIT_PACKS            .fjpack files to mount, separated by ':'
 *   FLEXJIT_NVRTC            the NVRTC library to load (one that does not
 *                            load means NVRTC is unavailable)
 *   FLEXJIT_LIBCUDA          the driver library to load
 *   FLEXJIT_TEMPLATE         sm80 | sm90
 *   FLEXJIT_PERSISTENT       1 | 0: for or against the persistent sm90 kernels
 *                            (forward and backward)
 *   FLEXJIT_STAGES           N: the sm90 kernel's K/V pipeline depth
 *   FLEXJIT_CONSUMERS        2 | 3: the sm90 kernel's consumer warpgroups
 *   FLEXJIT_FAST_COMPILE     1: NVRTC's --Ofast-compile=max
 *   FLEXJIT_KERNEL_DEFINES   NAME=VALUE ...: -D options for the templates
 *   FLEXJIT_DUMP_DIR         write every compiled translation unit there
 *
 * A value that cannot be used (FLEXJIT_STAGES=x, a pack that does not
 * open, ...) does not fail context creation, which has no context to hold
 * a message: it is kept in `bad` and every later call that needs a kernel
 * fails with it.
 */
#ifndef FJR_OPTIONS_H
#define FJR_OPTIONS_H

#include <stdint.h>

#include "flexjit.h"

enum { FJR_MAX_PACKS = 16 };

typedef struct fjr_options {
  int device;
  char *cache_dir;          /* resolved root; "" when there is no disk cache */
  char cache_note[256];     /* why there is none, when no root could be found */
  uint64_t cache_max_bytes; /* 0: no limit */
  char *arch;               /* compile target override, or NULL */
  char *kernel_template;    /* "sm80", "sm90", or NULL (by target) */
  char *nvrtc_path;         /* NULL: the default candidates */
  char *libcuda_path;       /* NULL: libcuda.so.1 */
  char *packs[FJR_MAX_PACKS]; /* FLEXJIT_PACKS, in order */
  int num_packs;
  int persistent;           /* 1, 0, or -1: the configuration's default */
  int stages;               /* sm90 K/V stages; 0: the default */
  int consumers;            /* 2, 3; 0: the default */
  int fast_compile;
  char *kernel_defines;     /* checked when the compile options are built */
  char *dump_dir;
  fj_log_fn log;
  void *log_user;
  /* The first unusable value, "" when none: "FLEXJIT_STAGES=x: ...". */
  char bad[512];
} fjr_options;

/* Fills *out from opts (may be NULL) and the environment. FJ_ENOMEM, or
 * FJ_EINVAL for a bad argument in opts (a negative device); an unusable
 * environment value is recorded in out->bad instead. */
fj_status fjr_options_init(const fj_context_options *opts, fjr_options *out);
void fjr_options_free(fjr_options *o);

#endif /* FJR_OPTIONS_H */
