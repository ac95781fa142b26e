/*
 * runtime/dl.c: the process-wide registry of run-time loaded libraries
 * (see dl.h).
 */
#include "runtime/dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* More than a process ever names: each context names one libcuda and one
 * NVRTC, almost always the defaults. */
enum { FJR_DL_SLOTS = 16, FJR_DL_NAME = 512 };

typedef struct loaded {
  char kind[16];
  char name[FJR_DL_NAME]; /* the first candidate */
  fj_status status;
  void *table; /* NULL when the load failed */
  char err[768];
} loaded;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static loaded registry[FJR_DL_SLOTS];
static int registry_used;

int fjr_dl_sym(void *handle, const char *lib, const char *name, void *slot,
               char *err, size_t errlen) {
  void *sym = dlsym(handle, name);
  if (!sym) {
    snprintf(err, errlen, "%s lacks %s: the library is not the one expected, "
             "or too old", lib, name);
    return -1;
  }
  /* Function pointers are copied bytewise from dlsym's void *. */
  memcpy(slot, &sym, sizeof sym);
  return 0;
}

/* dlopens the candidates in order; *lib names the one that loaded. */
static void *open_first(const char *kind, const char *const *candidates, int n,
                        const char **lib, char *err, size_t errlen) {
  char first_error[384] = "", tried[384] = "";
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    void *h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
    *lib = candidates[i];
    if (h) return h;
    const char *why = dlerror();
    if (!first_error[0])
      snprintf(first_error, sizeof first_error, "%s", why ? why : "dlopen failed");
    int k = snprintf(tried + used, sizeof tried - used, "%s%s", i ? ", " : "",
                     candidates[i]);
    if (k > 0 && (size_t)k < sizeof tried - used) used += (size_t)k;
  }
  if (n == 1)
    snprintf(err, errlen, "%s not found: %s", candidates[0], first_error);
  else
    snprintf(err, errlen, "%s not found (tried %s): %s", kind, tried, first_error);
  return NULL;
}

static void load(loaded *slot, const char *kind, const char *const *candidates,
                 int n, fjr_dl_init_fn init, size_t table_size,
                 fj_status fail_status) {
  const char *lib = NULL;
  slot->status = fail_status;
  void *h = open_first(kind, candidates, n, &lib, slot->err, sizeof slot->err);
  if (!h) return;
  void *table = calloc(1, table_size);
  if (!table) {
    snprintf(slot->err, sizeof slot->err, "out of memory loading %s", lib);
    slot->status = FJ_ENOMEM;
    dlclose(h);
    return;
  }
  if (init(h, lib, table, slot->err, sizeof slot->err) != 0) {
    free(table);
    dlclose(h);
    return;
  }
  /* The handle stays open for the life of the process: the table points
   * into it. */
  slot->table = table;
  slot->status = FJ_OK;
}

fj_status fjr_dl_load(const char *kind, const char *const *candidates, int n,
                      fjr_dl_init_fn init, size_t table_size,
                      fj_status fail_status, const void **table, char *err,
                      size_t errlen) {
  *table = NULL;
  if (n < 1 || strlen(candidates[0]) >= FJR_DL_NAME) {
    snprintf(err, errlen, "%s: no library, or a path of more than %d bytes", kind,
             FJR_DL_NAME - 1);
    return fail_status;
  }
  pthread_mutex_lock(&registry_lock);
  loaded *slot = NULL;
  for (int i = 0; i < registry_used && !slot; i++)
    if (!strcmp(registry[i].kind, kind) && !strcmp(registry[i].name, candidates[0]))
      slot = &registry[i];
  if (!slot && registry_used < FJR_DL_SLOTS) {
    slot = &registry[registry_used++];
    snprintf(slot->kind, sizeof slot->kind, "%s", kind);
    snprintf(slot->name, sizeof slot->name, "%s", candidates[0]);
    load(slot, kind, candidates, n, init, table_size, fail_status);
  }
  fj_status st = slot ? slot->status : FJ_ENOMEM;
  if (!slot)
    snprintf(err, errlen, "%s: more than %d libraries loaded", kind, FJR_DL_SLOTS);
  else if (st != FJ_OK)
    snprintf(err, errlen, "%s", slot->err);
  else
    *table = slot->table;
  pthread_mutex_unlock(&registry_lock);
  return st;
}
