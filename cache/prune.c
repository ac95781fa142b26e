/*
 * cache/prune.c: LRU eviction under a size limit (see prune.h).
 */
#include "cache/prune.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cache/inspect.h"
#include "util/errmsg.h"

/* What prune keeps of an entry while it decides. */
typedef struct candidate {
  char *path; /* the .cubin: breaks ties between equal ages */
  fjc_key key;
  char libver[32], arch[32];
  struct timespec mtime;
  uint64_t bytes;
} candidate;

typedef struct candidates {
  candidate *v;
  int n, cap;
  uint64_t total;
  int failed; /* out of memory */
} candidates;

static int collect(void *user, const fjc_entry_info *e) {
  candidates *c = user;
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 64;
    candidate *grown = realloc(c->v, (size_t)cap * sizeof *grown);
    if (!grown) {
      c->failed = 1;
      return 1;
    }
    c->v = grown;
    c->cap = cap;
  }
  candidate *x = &c->v[c->n];
  if (!(x->path = strdup(e->path))) {
    c->failed = 1;
    return 1;
  }
  x->key = e->key;
  memcpy(x->libver, e->libver, sizeof x->libver);
  memcpy(x->arch, e->arch, sizeof x->arch);
  x->mtime = e->mtime;
  x->bytes = e->cubin_bytes + e->meta_bytes;
  c->total += x->bytes;
  c->n++;
  return 0;
}

/* Oldest first; the path breaks ties so the order is deterministic. */
static int by_age(const void *pa, const void *pb) {
  const candidate *a = pa, *b = pb;
  if (a->mtime.tv_sec != b->mtime.tv_sec)
    return a->mtime.tv_sec < b->mtime.tv_sec ? -1 : 1;
  if (a->mtime.tv_nsec != b->mtime.tv_nsec)
    return a->mtime.tv_nsec < b->mtime.tv_nsec ? -1 : 1;
  return strcmp(a->path, b->path);
}

static int is_in_use(const char *hex, const char *const *keys, int n) {
  for (int i = 0; i < n; i++)
    if (keys[i] && strcasecmp(keys[i], hex) == 0)
      return 1;
  return 0;
}

static void free_candidates(candidates *c) {
  for (int i = 0; i < c->n; i++)
    free(c->v[i].path);
  free(c->v);
}

fj_status fjc_store_prune(fjc_store *store, uint64_t max_bytes,
                          const char *const *in_use_keys, int n_in_use,
                          fjc_prune_report *report, char *err, size_t errlen) {
  fjc_prune_report scratch, *rep = report ? report : &scratch;
  candidates c = {0};
  char first_failure[1200] = "";
  int failures = 0;
  fj_status st;
  memset(rep, 0, sizeof *rep);
  if (!store || n_in_use < 0 || (n_in_use > 0 && !in_use_keys)) {
    fju_errmsg(err, errlen, "fjc_store_prune: invalid argument");
    return FJ_EINVAL;
  }
  st = fjc_store_list(store, collect, &c, err, errlen);
  if (st != FJ_OK)
    goto done;
  if (c.failed) {
    fju_errmsg(err, errlen, "out of memory listing the kernel cache %s",
               fjc_store_root(store));
    st = FJ_ENOMEM;
    goto done;
  }
  rep->entries = c.n;
  rep->bytes_before = rep->bytes_after = c.total;
  if (c.n > 1)
    qsort(c.v, (size_t)c.n, sizeof *c.v, by_age);
  for (int i = 0; i < c.n && rep->bytes_after > max_bytes; i++) {
    const candidate *x = &c.v[i];
    if (is_in_use(x->key.hex, in_use_keys, n_in_use)) {
      rep->kept_in_use++;
      continue;
    }
    /* Only the first failure's message is kept. */
    int gone =
        fjc_entry_evict(store, x->libver, x->arch, &x->key,
                        failures ? NULL : first_failure, sizeof first_failure);
    failures += gone < 0;
    if (gone <= 0)
      continue;
    rep->removed++;
    rep->bytes_removed += x->bytes;
    rep->bytes_after -= x->bytes;
  }
  if (rep->removed)
    st = fjc_store_remove_dangling_aliases(store, &rep->aliases_removed, err,
                                           errlen);
  if (failures) {
    fju_errmsg(err, errlen, "%s%s", first_failure,
               failures > 1 ? " (and more entries could not be removed)" : "");
    st = FJ_EIO;
  }
done:
  free_candidates(&c);
  return st;
}

void fjc_store_prune_to_limit(fjc_store *store) {
  fjc_prune_report rep;
  uint64_t max = fjc_store_max_bytes(store);
  char why[1300] = "";
  int n = 0;
  if (!max || !fjc_store_enabled(store))
    return;
  const char *const *keys = fjc_store_in_use(store, &n);
  if (fjc_store_prune(store, max, keys, n, &rep, why, sizeof why) != FJ_OK)
    fjc_store_log(store, FJ_LOG_WARN,
                  "kernel cache: cannot keep %s under %llu bytes: %s",
                  fjc_store_root(store), (unsigned long long)max, why);
  if (rep.removed)
    fjc_store_log(store, FJ_LOG_INFO,
                  "kernel cache: evicted %d least recently used entries "
                  "(%llu bytes) to stay under %llu bytes",
                  rep.removed, (unsigned long long)rep.bytes_removed,
                  (unsigned long long)max);
}

/* The multiplier of a size suffix, 0 when it is not one. */
static uint64_t suffix_scale(const char *s) {
  static const char units[] = "KMGT";
  char u = (char)toupper((unsigned char)s[0]);
  const char *hit;
  uint64_t scale = 1;
  if (!s[0] || ((s[0] == 'b' || s[0] == 'B') && !s[1]))
    return 1;
  if (!(hit = strchr(units, u)) || !u)
    return 0;
  for (const char *p = units; p <= hit; p++)
    scale *= 1024;
  s++;
  /* "K", "KB", "KiB" (any case) */
  if (*s == 'i' || *s == 'I')
    s++;
  if (*s == 'b' || *s == 'B')
    s++;
  return *s ? 0 : scale;
}

int fjc_parse_size(const char *text, uint64_t *out) {
  char *end;
  unsigned long long v;
  uint64_t scale;
  if (!text || !isdigit((unsigned char)text[0]))
    return -1;
  errno = 0;
  v = strtoull(text, &end, 10);
  if (errno)
    return -1;
  scale = suffix_scale(end);
  if (!scale || v > UINT64_MAX / scale)
    return -1;
  *out = (uint64_t)v * scale;
  return 0;
}
