/*
 * cache/inspect.c: walking a store's entries for list, verify and clear (see
 * inspect.h).
 */
#include "cache/inspect.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/meta.h"

#define PATH_CAP 4096
/* A temp file this old belongs to a writer that died, not one at work. */
#define STALE_TEMP_SECONDS 600
/* The name is the sidecar's first field; no need to read the spec source. */
#define META_READ_BYTES 65536

typedef enum {
  FILE_OTHER = 0,
  FILE_CUBIN,
  FILE_JSON,
  FILE_LOCK,
  FILE_TEMP,
} file_kind;

/* One file met by the walk, with where it lives. */
typedef struct walk_file {
  const char *libver, *arch;
  const char *dir;  /* <root>/<libver>/<arch>/<aa> */
  const char *name; /* the file name in dir */
  const char *path; /* dir/name */
  file_kind kind;
  fjc_key key; /* for cubin, json and lock files */
} walk_file;

/* Returns non-zero to stop the walk. */
typedef int (*walk_fn)(void *user, const walk_file *f);

static int is_hex2(const char *s) {
  return strlen(s) == 2 && strspn(s, "0123456789abcdef") == 2;
}

static file_kind classify(const char *name, fjc_key *key) {
  char hex[33];
  if (strncmp(name, ".tmp.", 5) == 0)
    return FILE_TEMP;
  if (strlen(name) < 33 || name[32] != '.')
    return FILE_OTHER;
  memcpy(hex, name, 32);
  hex[32] = '\0';
  if (strspn(hex, "0123456789abcdef") != 32 || fjc_key_from_hex(hex, key))
    return FILE_OTHER;
  if (strcmp(name + 32, ".cubin") == 0)
    return FILE_CUBIN;
  if (strcmp(name + 32, ".json") == 0)
    return FILE_JSON;
  if (strcmp(name + 32, ".lock") == 0)
    return FILE_LOCK;
  return FILE_OTHER;
}

static int join(char *out, const char *dir, const char *name) {
  int n = snprintf(out, PATH_CAP, "%s/%s", dir, name);
  return n < 0 || n >= PATH_CAP ? -1 : 0;
}

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Level 3: the files of one <aa> directory. */
static int walk_aa(const char *dir, const char *libver, const char *arch,
                   walk_fn fn, void *user) {
  char path[PATH_CAP];
  struct dirent *d;
  int stop = 0;
  DIR *dp = opendir(dir);
  if (!dp)
    return 0;
  while (!stop && (d = readdir(dp))) {
    walk_file f = {libver, arch, dir, d->d_name, path, FILE_OTHER, {{0}, ""}};
    if (strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0)
      continue;
    if (join(path, dir, d->d_name))
      continue;
    f.kind = classify(d->d_name, &f.key);
    if (f.kind != FILE_OTHER)
      stop = fn(user, &f);
  }
  closedir(dp);
  return stop;
}

/* Calls `visit` for each subdirectory of dir accepted by `accept`; with
 * remove_empty, tries to remove each afterwards (fails harmlessly unless it
 * became empty). */
typedef int (*subdir_fn)(void *walk, const char *path, const char *name);

typedef struct walk_state {
  walk_fn fn;
  void *user;
  int remove_empty;
  const char *libver, *arch; /* names of the directories being walked */
} walk_state;

static int each_subdir(const char *dir, int (*accept)(const char *),
                       subdir_fn visit, walk_state *w) {
  char path[PATH_CAP];
  struct dirent *d;
  int stop = 0;
  DIR *dp = opendir(dir);
  if (!dp)
    return 0;
  while (!stop && (d = readdir(dp))) {
    if (d->d_name[0] == '.' || !accept(d->d_name) ||
        join(path, dir, d->d_name) || !is_dir(path))
      continue;
    stop = visit(w, path, d->d_name);
    if (w->remove_empty)
      rmdir(path);
  }
  closedir(dp);
  return stop;
}

static int accept_any(const char *name) { return name[0] != '\0'; }

static int accept_arch(const char *name) { return fjc_arch_is_valid(name); }

static int visit_aa(void *wp, const char *path, const char *name) {
  (void)name;
  walk_state *w = wp;
  return walk_aa(path, w->libver, w->arch, w->fn, w->user);
}

static int visit_arch(void *wp, const char *path, const char *name) {
  walk_state *w = wp;
  w->arch = name;
  return each_subdir(path, is_hex2, visit_aa, wp);
}

static int visit_libver(void *wp, const char *path, const char *name) {
  walk_state *w = wp;
  w->libver = name;
  return each_subdir(path, accept_arch, visit_arch, w);
}

/* Walks <root>/<libver>/<arch>/<aa>/<file>. */
static fj_status walk_store(fjc_store *store, walk_fn fn, void *user,
                            int remove_empty) {
  walk_state w = {fn, user, remove_empty, "", ""};
  const char *root = fjc_store_root(store);
  if (!fjc_store_enabled(store))
    return FJ_OK;
  DIR *dp = opendir(root);
  if (!dp) {
    if (errno == ENOENT)
      return FJ_OK;
    fjc_store_set_error(store, "cannot read cache directory %s: %s", root,
                        strerror(errno));
    return FJ_EIO;
  }
  closedir(dp);
  each_subdir(root, accept_any, visit_libver, &w);
  return FJ_OK;
}

/* ---- list ----------------------------------------------------------- */

typedef struct list_state {
  fjc_entry_fn fn;
  void *user;
} list_state;

static uint64_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static void sidecar_path(const walk_file *f, char *out) {
  char name[64];
  snprintf(name, sizeof name, "%s.json", f->key.hex);
  if (join(out, f->dir, name))
    out[0] = '\0';
}

static int list_one(void *user, const walk_file *f) {
  list_state *ls = user;
  fjc_entry_info e;
  char meta[PATH_CAP];
  struct stat st;
  if (f->kind != FILE_CUBIN || stat(f->path, &st) != 0)
    return 0;
  memset(&e, 0, sizeof e);
  e.key = f->key;
  snprintf(e.libver, sizeof e.libver, "%s", f->libver);
  snprintf(e.arch, sizeof e.arch, "%s", f->arch);
  e.path = f->path;
  e.cubin_bytes = (uint64_t)st.st_size;
  e.mtime = st.st_mtim;
  sidecar_path(f, meta);
  if (meta[0]) {
    e.meta_bytes = file_size(meta);
    if (e.meta_bytes)
      fjc_meta_file_string(meta, META_READ_BYTES, "name", e.name,
                           sizeof e.name);
  }
  return ls->fn(ls->user, &e);
}

fj_status fjc_store_list(fjc_store *store, fjc_entry_fn fn, void *user) {
  list_state ls = {fn, user};
  if (!store || !fn)
    return FJ_EINVAL;
  return walk_store(store, list_one, &ls, 0);
}

/* ---- remove / verify / clear ------------------------------------------ */

static void remove_sibling(const char *cubin_path, const char *ext) {
  char path[PATH_CAP];
  size_t n = strlen(cubin_path);
  if (n < 6 || n - 6 + strlen(ext) >= sizeof path)
    return;
  memcpy(path, cubin_path, n - 6);
  strcpy(path + n - 6, ext);
  unlink(path);
}

int fjc_entry_remove(const char *cubin_path) {
  size_t n = strlen(cubin_path);
  if (n < 6 || strcmp(cubin_path + n - 6, ".cubin") != 0)
    return -1;
  /* The cubin goes first: a sidecar without it is harmless, the reverse
   * would leave an entry that lists without a name. */
  if (unlink(cubin_path) != 0 && errno != ENOENT)
    return -1;
  remove_sibling(cubin_path, ".json");
  remove_sibling(cubin_path, ".lock");
  return 0;
}

typedef struct verify_state {
  int remove_bad;
  fjc_bad_entry_fn on_bad;
  void *user;
  fjc_verify_report *rep;
  time_t now;
} verify_state;

static void verify_temp(verify_state *vs, const walk_file *f) {
  struct stat st;
  if (!vs->remove_bad || stat(f->path, &st) != 0 ||
      vs->now - st.st_mtime < STALE_TEMP_SECONDS)
    return;
  if (unlink(f->path) == 0)
    vs->rep->stale_temps++;
}

static int verify_one(void *user, const walk_file *f) {
  verify_state *vs = user;
  int foreign = 0;
  const char *why;
  if (f->kind == FILE_TEMP)
    verify_temp(vs, f);
  if (f->kind != FILE_CUBIN)
    return 0;
  vs->rep->checked++;
  why = fjc_entry_check_file(f->path, &f->key, NULL, &foreign);
  if (foreign) {
    vs->rep->foreign++;
    return 0;
  }
  if (!why)
    return 0;
  vs->rep->bad++;
  if (vs->on_bad)
    vs->on_bad(vs->user, f->path, why);
  if (vs->remove_bad && fjc_entry_remove(f->path) == 0)
    vs->rep->removed++;
  return 0;
}

fj_status fjc_store_verify(fjc_store *store, int remove_bad,
                           fjc_bad_entry_fn on_bad, void *user,
                           fjc_verify_report *report) {
  fjc_verify_report scratch;
  verify_state vs = {remove_bad, on_bad, user, report ? report : &scratch,
                     time(NULL)};
  if (!store)
    return FJ_EINVAL;
  memset(vs.rep, 0, sizeof *vs.rep);
  return walk_store(store, verify_one, &vs, 0);
}

typedef struct clear_state {
  int removed;
  uint64_t bytes;
} clear_state;

static int clear_one(void *user, const walk_file *f) {
  clear_state *cs = user;
  uint64_t size = f->kind == FILE_CUBIN || f->kind == FILE_JSON
                      ? file_size(f->path)
                      : 0;
  if (unlink(f->path) != 0)
    return 0;
  cs->bytes += size;
  if (f->kind == FILE_CUBIN)
    cs->removed++;
  return 0;
}

fj_status fjc_store_clear(fjc_store *store, int *removed, uint64_t *bytes) {
  clear_state cs = {0, 0};
  fj_status st;
  if (!store)
    return FJ_EINVAL;
  st = walk_store(store, clear_one, &cs, 1);
  if (removed)
    *removed = cs.removed;
  if (bytes)
    *bytes = cs.bytes;
  return st;
}
