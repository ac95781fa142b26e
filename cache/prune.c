/*
 * cache/prune.c: LRU eviction under a size limit (see prune.h).
 */
#include "cache/prune.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <unistd.h>

#include "cache/inspect.h"

/* What prune keeps of an entry while it decides. */
typedef struct candidate {
  char *path; /* the .cubin */
  char hex[33];
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
  memcpy(x->hex, e->key.hex, sizeof x->hex);
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

/* Takes the entry's compile lock without waiting. Returns the descriptor
 * (-1 when there is no lock file: nobody is compiling it), or -2 when
 * another process holds it. */
static int try_entry_lock(const char *cubin_path) {
  char path[4096];
  size_t n = strlen(cubin_path);
  if (n < 6 || n >= sizeof path)
    return -1;
  memcpy(path, cubin_path, n - 6);
  strcpy(path + n - 6, ".lock");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return -2;
  }
  return fd;
}

/* Evicts one entry unless someone is compiling it. Returns 1 if evicted. */
static int evict(const candidate *x) {
  int fd = try_entry_lock(x->path);
  int gone;
  if (fd == -2)
    return 0;
  gone = fjc_entry_remove(x->path) == 0;
  if (fd >= 0) {
    flock(fd, LOCK_UN);
    close(fd);
  }
  return gone;
}

static void free_candidates(candidates *c) {
  for (int i = 0; i < c->n; i++)
    free(c->v[i].path);
  free(c->v);
}

fj_status fjc_store_prune(fjc_store *store, uint64_t max_bytes,
                          const char *const *in_use_keys, int n_in_use,
                          fjc_prune_report *report) {
  fjc_prune_report scratch, *rep = report ? report : &scratch;
  candidates c = {0};
  fj_status st;
  memset(rep, 0, sizeof *rep);
  if (!store || n_in_use < 0 || (n_in_use > 0 && !in_use_keys))
    return FJ_EINVAL;
  st = fjc_store_list(store, collect, &c);
  if (st != FJ_OK)
    goto done;
  if (c.failed) {
    fjc_store_set_error(store, "out of memory listing the kernel cache");
    st = FJ_ENOMEM;
    goto done;
  }
  rep->entries = c.n;
  rep->bytes_before = rep->bytes_after = c.total;
  if (c.n > 1)
    qsort(c.v, (size_t)c.n, sizeof *c.v, by_age);
  for (int i = 0; i < c.n && rep->bytes_after > max_bytes; i++) {
    if (is_in_use(c.v[i].hex, in_use_keys, n_in_use)) {
      rep->kept_in_use++;
      continue;
    }
    if (!evict(&c.v[i]))
      continue;
    rep->removed++;
    rep->bytes_removed += c.v[i].bytes;
    rep->bytes_after -= c.v[i].bytes;
  }
done:
  free_candidates(&c);
  return st;
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
