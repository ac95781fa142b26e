/*
 * runtime/options.c: a context's settings from its options and the
 * environment (see options.h).
 */
#include "runtime/options.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/prune.h"
#include "cache/store.h"

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

static void set_bad(fjr_options *o, const char *fmt, ...) {
  if (o->bad[0]) return; /* the first one is reported */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->bad, sizeof o->bad, fmt, ap);
  va_end(ap);
}

static int small_int(const char *s, int lo, int hi) {
  char *end = NULL;
  long v = strtol(s, &end, 10);
  return *end || end == s || v < lo || v > hi ? -1 : (int)v;
}

static fj_status split_packs(fjr_options *o, const char *list) {
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ":");
    if (len > 0) {
      if (o->num_packs == FJR_MAX_PACKS) {
        set_bad(o, "FLEXJIT_PACKS: more than %d packs", FJR_MAX_PACKS);
        return FJ_OK;
      }
      char *path = strndup(p, len);
      if (!path) return FJ_ENOMEM;
      o->packs[o->num_packs++] = path;
    }
    p += len;
    if (*p == ':') p++;
  }
  return FJ_OK;
}

fj_status fjr_options_init(const fj_context_options *opts, fjr_options *o) {
  memset(o, 0, sizeof *o);
  fj_context_options def;
  fj_context_options_init(&def);
  if (!opts) opts = &def;
  if (opts->device < 0) return FJ_EINVAL;
  o->device = opts->device;
  o->log = opts->log;
  o->log_user = opts->log_user;
  o->persistent = -1;

  const char *tmpl = opts->kernel_template && *opts->kernel_template
                         ? opts->kernel_template
                         : env("FLEXJIT_TEMPLATE");
  /* The cache root: the option ("" disables), else $FLEXJIT_CACHE_DIR
   * ("" too), else $XDG_CACHE_HOME/flexjit when absolute, else
   * $HOME/.cache/flexjit. */
  char root[4096];
  const char *why = NULL;
  o->cache_dir = strdup(opts->cache_dir ? opts->cache_dir
                                        : fjc_store_default_root(getenv("FLEXJIT_CACHE_DIR"),
                                                                 getenv("XDG_CACHE_HOME"),
                                                                 getenv("HOME"), root,
                                                                 sizeof root, &why));
  if (why) snprintf(o->cache_note, sizeof o->cache_note, "%s", why);
  o->arch = dup_or_null(opts->arch);
  o->kernel_template = dup_or_null(tmpl);
  o->nvrtc_path = dup_or_null(env("FLEXJIT_NVRTC"));
  o->libcuda_path = dup_or_null(env("FLEXJIT_LIBCUDA"));
  o->kernel_defines = dup_or_null(env("FLEXJIT_KERNEL_DEFINES"));
  o->dump_dir = dup_or_null(env("FLEXJIT_DUMP_DIR"));
  if (!o->cache_dir || (opts->arch && !o->arch) || (tmpl && !o->kernel_template) ||
      (env("FLEXJIT_NVRTC") && !o->nvrtc_path) ||
      (env("FLEXJIT_LIBCUDA") && !o->libcuda_path) ||
      (env("FLEXJIT_KERNEL_DEFINES") && !o->kernel_defines) ||
      (env("FLEXJIT_DUMP_DIR") && !o->dump_dir))
    goto nomem;
  if (env("FLEXJIT_PACKS") && split_packs(o, env("FLEXJIT_PACKS")) != FJ_OK)
    goto nomem;

  o->cache_max_bytes = opts->cache_max_bytes;
  const char *v = env("FLEXJIT_CACHE_MAX_BYTES");
  if (!o->cache_max_bytes && v && fjc_parse_size(v, &o->cache_max_bytes) != 0)
    set_bad(o, "FLEXJIT_CACHE_MAX_BYTES=%s: not a size (\"500M\", \"2G\" or bytes)",
            v);
  if (o->kernel_template && strcmp(o->kernel_template, "sm80") != 0 &&
      strcmp(o->kernel_template, "sm90") != 0)
    set_bad(o, "kernel template '%s' does not exist (sm80 or sm90)",
            o->kernel_template);
  if ((v = env("FLEXJIT_PERSISTENT")) && (o->persistent = small_int(v, 0, 1)) < 0)
    set_bad(o, "FLEXJIT_PERSISTENT=%s: 1 or 0", v);
  if ((v = env("FLEXJIT_STAGES")) && (o->stages = small_int(v, 2, 9)) < 0)
    set_bad(o, "FLEXJIT_STAGES=%s: a depth from 2 to 9", v);
  if ((v = env("FLEXJIT_CONSUMERS")) && (o->consumers = small_int(v, 2, 3)) < 0)
    set_bad(o, "FLEXJIT_CONSUMERS=%s: 2 or 3 consumer warpgroups", v);
  if ((v = env("FLEXJIT_FAST_COMPILE")) && (o->fast_compile = small_int(v, 0, 1)) < 0)
    set_bad(o, "FLEXJIT_FAST_COMPILE=%s: 1 or 0", v);
  if (o->persistent < 0) o->persistent = -1;
  if (o->stages < 0) o->stages = 0;
  if (o->consumers < 0) o->consumers = 0;
  if (o->fast_compile < 0) o->fast_compile = 0;
  return FJ_OK;
nomem:
  fjr_options_free(o);
  return FJ_ENOMEM;
}

void fjr_options_free(fjr_options *o) {
  free(o->cache_dir);
  free(o->arch);
  free(o->kernel_template);
  free(o->nvrtc_path);
  free(o->libcuda_path);
  free(o->kernel_defines);
  free(o->dump_dir);
  for (int i = 0; i < o->num_packs; i++) free(o->packs[i]);
  memset(o, 0, sizeof *o);
}
