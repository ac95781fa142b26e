/*
 * cache/inspect.c: walking a store's files for list, verify and clear, and
 * single-entry removals (see inspect.h).
 *
 * Every level below the root is opened relative to its parent's descriptor
 * with O_NOFOLLOW (openat), files are examined with fstatat and
 * AT_SYMLINK_NOFOLLOW and removed with unlinkat: a symbolic link anywhere
 * below the root is never followed, whatever it was replaced by meanwhile.
 */
#include "cache/inspect.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/meta.h"
#include "util/errmsg.h"

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
  FILE_ALIAS,
  FILE_TEMP,
} file_kind;

/* One file met by the walk, with where it lives. */
typedef struct walk_file {
  const char *libver, *arch;
  int arch_fd;      /* <root>/<libver>/<arch> */
  int dir_fd;       /* <root>/<libver>/<arch>/<aa> */
  const char *name; /* the file name in dir_fd */
  const char *path; /* the whole path, for reports */
  file_kind kind;
  fjc_key key;      /* entry files: the entry's; an alias: its source key */
  struct stat st;   /* a regular file, not a link */
} walk_file;

typedef struct walk walk;

/* Returns non-zero to stop the walk. */
typedef int (*walk_fn)(walk *w, const walk_file *f);
/* The same for an alias, read: see visit_alias. */
typedef int (*alias_visit_fn)(walk *w, const walk_file *f,
                              const fjc_alias_info *a);

struct walk {
  fjc_store *store;
  walk_fn fn;
  alias_visit_fn on_alias; /* for walks with fn visit_alias */
  void *user;
  int remove_empty; /* try to remove each directory after walking it */
  const char *libver, *arch; /* names of the directories being walked */
  int arch_fd;
  int failures;
  char first_failure[PATH_CAP + 256];
};

/* Records a failure; the walk goes on, and returns FJ_EIO in the end. */
static void walk_failed(walk *w, const char *what, const char *path, int err) {
  if (!w->failures++)
    snprintf(w->first_failure, sizeof w->first_failure, "cannot %s %s: %s",
             what, path, strerror(err));
}

static int is_hex2(const char *s) {
  return strlen(s) == 2 && strspn(s, "0123456789abcdef") == 2;
}

static int accept_any(const char *name) { return name[0] != '\0'; }

static int accept_arch(const char *name) { return fjc_arch_is_valid(name); }

/* Which subdirectories each level holds: releases, targets, <aa>. */
static int (*const accept_at[3])(const char *) = {accept_any, accept_arch,
                                                  is_hex2};

static file_kind classify(const char *name, fjc_key *key) {
  static const char *const ext[] = {".cubin", ".json", ".lock", ".src"};
  static const file_kind kind[] = {FILE_CUBIN, FILE_JSON, FILE_LOCK,
                                   FILE_ALIAS};
  char hex[33];
  if (strncmp(name, ".tmp.", 5) == 0)
    return FILE_TEMP;
  if (strlen(name) < 33 || name[32] != '.')
    return FILE_OTHER;
  memcpy(hex, name, 32);
  hex[32] = '\0';
  if (strspn(hex, "0123456789abcdef") != 32 || fjc_key_from_hex(hex, key))
    return FILE_OTHER;
  for (size_t i = 0; i < sizeof ext / sizeof *ext; i++)
    if (strcmp(name + 32, ext[i]) == 0)
      return kind[i];
  return FILE_OTHER;
}

static int join(char *out, const char *dir, const char *name) {
  int n = snprintf(out, PATH_CAP, "%s/%s", dir, name);
  return n < 0 || n >= PATH_CAP ? -1 : 0;
}

/* A subdirectory, never through a symbolic link: -1 with errno ELOOP (or
 * ENOTDIR) for a link or a file. */
static int open_subdir(int fd, const char *name) {
  return openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

static int open_file(int fd, const char *name) {
  return openat(fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
}

static int visit_file(walk *w, int dir_fd, const char *name,
                      const char *path) {
  walk_file f;
  memset(&f, 0, sizeof f);
  f.kind = classify(name, &f.key);
  if (f.kind == FILE_OTHER)
    return 0;
  if (fstatat(dir_fd, name, &f.st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT)
      walk_failed(w, "examine", path, errno);
    return 0;
  }
  if (!S_ISREG(f.st.st_mode))
    return 0;
  f.libver = w->libver;
  f.arch = w->arch;
  f.arch_fd = w->arch_fd;
  f.dir_fd = dir_fd;
  f.name = name;
  f.path = path;
  return w->fn(w, &f);
}

/* Walks the directory open at fd (taken over), at depth 0 (the root) to 3
 * (an <aa> directory, whose files are visited). */
static int walk_dir(walk *w, int fd, const char *path, int depth) {
  char child[PATH_CAP];
  struct dirent *d;
  int stop = 0;
  DIR *dp = fdopendir(fd);
  if (!dp) {
    walk_failed(w, "read", path, errno);
    close(fd);
    return 0;
  }
  while (!stop && (d = readdir(dp))) {
    const char *name = d->d_name;
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
        join(child, path, name))
      continue;
    if (depth == 3) {
      stop = visit_file(w, dirfd(dp), name, child);
      continue;
    }
    if (name[0] == '.' || !accept_at[depth](name))
      continue;
    int sub = open_subdir(dirfd(dp), name);
    if (sub < 0) {
      /* A file, a symbolic link (not followed) or a directory gone
       * meanwhile: nothing of the store's to walk. */
      if (errno != ENOTDIR && errno != ELOOP && errno != ENOENT)
        walk_failed(w, "read", child, errno);
      continue;
    }
    if (depth == 0)
      w->libver = name;
    else if (depth == 1)
      w->arch = name;
    else
      w->arch_fd = dirfd(dp);
    stop = walk_dir(w, sub, child, depth + 1);
    if (w->remove_empty)
      unlinkat(dirfd(dp), name, AT_REMOVEDIR); /* fails unless empty */
  }
  closedir(dp);
  return stop;
}

/* Walks <root>/<libver>/<arch>/<aa>/<file>: fn sees each file, or with fn
 * visit_alias, on_alias each alias. FJ_EIO with err naming the first path
 * that could not be read or removed; FJ_EINVAL for a NULL store (every
 * public walk checks its store here). */
static fj_status walk_store(fjc_store *store, walk_fn fn,
                            alias_visit_fn on_alias, void *user,
                            int remove_empty, char *err, size_t errlen) {
  walk w;
  const char *root = fjc_store_root(store);
  if (!store) {
    fju_errmsg(err, errlen, "no kernel cache store to walk (NULL)");
    return FJ_EINVAL;
  }
  memset(&w, 0, sizeof w);
  w.store = store;
  w.fn = fn;
  w.on_alias = on_alias;
  w.user = user;
  w.remove_empty = remove_empty;
  w.libver = w.arch = "";
  w.arch_fd = -1;
  if (!fjc_store_enabled(store))
    return FJ_OK;
  int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return FJ_OK;
    fju_errmsg(err, errlen, "cannot read cache directory %s: %s", root,
               strerror(errno));
    return FJ_EIO;
  }
  walk_dir(&w, fd, root, 0);
  if (!w.failures)
    return FJ_OK;
  if (w.failures > 1)
    fju_errmsg(err, errlen, "%s (and %d more failures)", w.first_failure,
               w.failures - 1);
  else
    fju_errmsg(err, errlen, "%s", w.first_failure);
  return FJ_EIO;
}

/* 1 when <arch_fd>/<aa>/<key>.cubin is a regular file, 0 when it is not
 * there, -1 when that cannot be told. */
static int entry_exists(int arch_fd, const fjc_key *key) {
  char aa[3] = {key->hex[0], key->hex[1], '\0'}, name[40];
  struct stat st;
  int fd = open_subdir(arch_fd, aa), found;
  if (fd < 0)
    return errno == ENOENT ? 0 : -1;
  snprintf(name, sizeof name, "%s.cubin", key->hex);
  found = fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ? S_ISREG(st.st_mode)
          : errno == ENOENT                                ? 0
                                                           : -1;
  close(fd);
  return found;
}

/* Reads each alias the walk meets and hands it to w->on_alias. */
static int visit_alias(walk *w, const walk_file *f) {
  fjc_alias_info a;
  if (f->kind != FILE_ALIAS)
    return 0;
  int fd = open_file(f->dir_fd, f->name);
  memset(&a, 0, sizeof a);
  a.source_key = f->key;
  snprintf(a.libver, sizeof a.libver, "%s", f->libver);
  snprintf(a.arch, sizeof a.arch, "%s", f->arch);
  a.path = f->path;
  a.corrupt = fd < 0 || fjc_alias_read_fd(fd, &a.key) != 0;
  a.dangling = !a.corrupt && entry_exists(f->arch_fd, &a.key) == 0;
  if (fd >= 0)
    close(fd);
  return w->on_alias(w, f, &a);
}

/* Removes a file of the walk; 0, or -1 (recorded) when it stays. */
static int remove_file(walk *w, const walk_file *f) {
  if (unlinkat(f->dir_fd, f->name, 0) == 0 || errno == ENOENT)
    return 0;
  walk_failed(w, "remove", f->path, errno);
  return -1;
}

/* Removes <hex>.cubin, then its .json and .lock, in dir_fd. The cubin goes
 * first: a sidecar without it is harmless, the reverse would leave an entry
 * that lists without a name. 0 when the cubin is gone, else -1 (errno). */
static int remove_entry_at(int dir_fd, const char *hex) {
  static const char *const ext[] = {".cubin", ".json", ".lock"};
  char name[48];
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "%s%s", hex, ext[i]);
    if (unlinkat(dir_fd, name, 0) != 0 && errno != ENOENT && i == 0)
      return -1;
  }
  return 0;
}

/* ---- list ----------------------------------------------------------- */

typedef struct list_state {
  fjc_entry_fn entry_fn;
  fjc_alias_fn alias_fn;
  void *user;
} list_state;

static void read_sidecar(const walk_file *f, fjc_entry_info *e) {
  char name[48];
  struct stat st;
  snprintf(name, sizeof name, "%s.json", f->key.hex);
  int fd = open_file(f->dir_fd, name);
  if (fd < 0)
    return;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    e->meta_bytes = (uint64_t)st.st_size;
    fjc_meta_fd_string(fd, META_READ_BYTES, "name", e->name, sizeof e->name);
  }
  close(fd);
}

static int list_one(walk *w, const walk_file *f) {
  list_state *ls = w->user;
  fjc_entry_info e;
  if (f->kind != FILE_CUBIN)
    return 0;
  memset(&e, 0, sizeof e);
  e.key = f->key;
  snprintf(e.libver, sizeof e.libver, "%s", f->libver);
  snprintf(e.arch, sizeof e.arch, "%s", f->arch);
  e.path = f->path;
  e.cubin_bytes = (uint64_t)f->st.st_size;
  e.mtime = f->st.st_mtim;
  read_sidecar(f, &e);
  return ls->entry_fn(ls->user, &e);
}

static int list_alias(walk *w, const walk_file *f, const fjc_alias_info *a) {
  list_state *ls = w->user;
  (void)f;
  return ls->alias_fn(ls->user, a);
}

/* The walk of fjc_store_list (ls->entry_fn) or fjc_store_list_aliases
 * (ls->alias_fn), who. */
static fj_status list_walk(fjc_store *store, list_state *ls, const char *who,
                           char *err, size_t errlen) {
  if (!ls->entry_fn && !ls->alias_fn) {
    fju_errmsg(err, errlen, "%s: NULL callback", who);
    return FJ_EINVAL;
  }
  if (ls->alias_fn)
    return walk_store(store, visit_alias, list_alias, ls, 0, err, errlen);
  return walk_store(store, list_one, NULL, ls, 0, err, errlen);
}

fj_status fjc_store_list(fjc_store *store, fjc_entry_fn fn, void *user,
                         char *err, size_t errlen) {
  list_state ls = {fn, NULL, user};
  return list_walk(store, &ls, "fjc_store_list", err, errlen);
}

fj_status fjc_store_list_aliases(fjc_store *store, fjc_alias_fn fn, void *user,
                                 char *err, size_t errlen) {
  list_state ls = {NULL, fn, user};
  return list_walk(store, &ls, "fjc_store_list_aliases", err, errlen);
}

/* ---- verify ----------------------------------------------------------- */

typedef struct verify_state {
  int remove_bad;
  fjc_bad_entry_fn on_bad;
  void *user;
  fjc_verify_report *rep;
  time_t now;
} verify_state;

static void verify_temp(walk *w, verify_state *vs, const walk_file *f) {
  if (!vs->remove_bad || vs->now - f->st.st_mtime < STALE_TEMP_SECONDS)
    return;
  if (remove_file(w, f) == 0)
    vs->rep->stale_temps++;
}

static void report_bad(verify_state *vs, const char *path, const char *why) {
  if (vs->on_bad)
    vs->on_bad(vs->user, path, why);
}

/* First pass: entries and temp files. */
static int verify_entry(walk *w, const walk_file *f) {
  verify_state *vs = w->user;
  int foreign = 0, fd;
  const char *why;
  if (f->kind == FILE_TEMP)
    verify_temp(w, vs, f);
  if (f->kind != FILE_CUBIN)
    return 0;
  vs->rep->checked++;
  fd = open_file(f->dir_fd, f->name);
  why = fd < 0 ? "cannot open" : fjc_entry_check_fd(fd, &f->key, NULL, &foreign);
  if (fd >= 0)
    close(fd);
  if (foreign) {
    vs->rep->foreign++;
    return 0;
  }
  if (!why)
    return 0;
  vs->rep->bad++;
  report_bad(vs, f->path, why);
  if (!vs->remove_bad)
    return 0;
  if (remove_entry_at(f->dir_fd, f->key.hex) == 0)
    vs->rep->removed++;
  else
    walk_failed(w, "remove", f->path, errno);
  return 0;
}

/* Second pass: aliases, once bad entries are gone. */
static int verify_alias(walk *w, const walk_file *f, const fjc_alias_info *a) {
  verify_state *vs = w->user;
  char why[96];
  vs->rep->aliases++;
  if (!a->corrupt && !a->dangling)
    return 0;
  vs->rep->bad_aliases++;
  if (a->corrupt)
    snprintf(why, sizeof why, "corrupt source-key alias");
  else
    snprintf(why, sizeof why, "dangling source-key alias: entry %s is gone",
             a->key.hex);
  report_bad(vs, f->path, why);
  if (vs->remove_bad && remove_file(w, f) == 0)
    vs->rep->removed_aliases++;
  return 0;
}

fj_status fjc_store_verify(fjc_store *store, int remove_bad,
                           fjc_bad_entry_fn on_bad, void *user,
                           fjc_verify_report *report, char *err,
                           size_t errlen) {
  fjc_verify_report scratch;
  verify_state vs = {remove_bad, on_bad, user, report ? report : &scratch,
                     time(NULL)};
  fj_status st;
  memset(vs.rep, 0, sizeof *vs.rep);
  st = walk_store(store, verify_entry, NULL, &vs, 0, err, errlen);
  if (st != FJ_OK)
    return st;
  return walk_store(store, visit_alias, verify_alias, &vs, 0, err, errlen);
}

/* ---- clear ------------------------------------------------------------ */

typedef struct clear_state {
  int removed;
  uint64_t bytes;
} clear_state;

static int clear_one(walk *w, const walk_file *f) {
  clear_state *cs = w->user;
  if (remove_file(w, f) != 0)
    return 0;
  if (f->kind == FILE_CUBIN || f->kind == FILE_JSON)
    cs->bytes += (uint64_t)f->st.st_size;
  if (f->kind == FILE_CUBIN)
    cs->removed++;
  return 0;
}

fj_status fjc_store_clear(fjc_store *store, int *removed, uint64_t *bytes,
                          char *err, size_t errlen) {
  clear_state cs = {0, 0};
  fj_status st = walk_store(store, clear_one, NULL, &cs, 1, err, errlen);
  if (removed)
    *removed = cs.removed;
  if (bytes)
    *bytes = cs.bytes;
  return st;
}

/* ---- single removals -------------------------------------------------- */

/* The directory <root>/<libver>/<arch>/<aa of key>, opened without following
 * any link below the root; -1 with errno otherwise. */
static int open_entry_dir(fjc_store *store, const char *libver,
                          const char *arch, const fjc_key *key) {
  char aa[3] = {key->hex[0], key->hex[1], '\0'};
  const char *names[3] = {libver, arch, aa};
  int fd = open(fjc_store_root(store), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  for (int i = 0; i < 3 && fd >= 0; i++) {
    int sub = open_subdir(fd, names[i]);
    int saved = errno;
    close(fd);
    errno = saved;
    fd = sub;
  }
  return fd;
}

int fjc_entry_evict(fjc_store *store, const char *libver, const char *arch,
                    const fjc_key *key, char *err, size_t errlen) {
  char name[48];
  int dir, lock, rc = 1;
  if (!store || !fjc_store_enabled(store) || !key || !libver || !arch ||
      strchr(libver, '/') || !fjc_arch_is_valid(arch)) {
    fju_errmsg(err, errlen,
               "fjc_entry_evict: invalid argument (release '%s', arch '%s')",
               libver ? libver : "(null)", arch ? arch : "(null)");
    return -1;
  }
  dir = open_entry_dir(store, libver, arch, key);
  if (dir < 0) {
    if (errno == ENOENT)
      return 0;
    fju_errmsg(err, errlen, "cannot open %s/%s/%s/%.2s: %s",
               fjc_store_root(store), libver, arch, key->hex, strerror(errno));
    return -1;
  }
  snprintf(name, sizeof name, "%s.lock", key->hex);
  lock = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) != 0) {
    rc = 0; /* another process is compiling it */
  } else if (remove_entry_at(dir, key->hex) != 0) {
    fju_errmsg(err, errlen, "cannot remove %s/%s/%s/%.2s/%s.cubin: %s",
               fjc_store_root(store), libver, arch, key->hex, key->hex,
               strerror(errno));
    rc = -1;
  }
  if (lock >= 0)
    close(lock); /* releases the lock */
  close(dir);
  return rc;
}

typedef struct dangling_state {
  int removed;
} dangling_state;

static int remove_dangling(walk *w, const walk_file *f,
                           const fjc_alias_info *a) {
  dangling_state *ds = w->user;
  if (!a->corrupt && a->dangling && remove_file(w, f) == 0)
    ds->removed++;
  return 0;
}

fj_status fjc_store_remove_dangling_aliases(fjc_store *store, int *removed,
                                            char *err, size_t errlen) {
  dangling_state ds = {0};
  fj_status st =
      walk_store(store, visit_alias, remove_dangling, &ds, 0, err, errlen);
  if (removed)
    *removed = ds.removed;
  return st;
}
