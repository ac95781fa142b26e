/*
 * cli/cmd_cache.c: `flexjit cache ls | stats | verify | prune | clear |
 * export`: inspecting and maintaining a kernel cache directory (and listing
 * or checking a .fjpack), and writing out one entry's cubin.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/inspect.h"
#include "cache/pack.h"
#include "cache/prune.h"
#include "cache/store.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "flexjit.h"

enum { CC_OK = 0, CC_FAIL = 1, CC_USAGE = 2 };

static const char cache_usage[] =
    "usage: flexjit cache ACTION [--dir DIR] [options]\n"
    "\n"
    "Inspects and maintains the kernel cache.\n"
    "\n"
    "actions:\n"
    "  ls                 list entries, most recently used first\n"
    "  stats              entry counts and sizes per release and target\n"
    "  verify [--remove]  re-check every entry (magic, length, key,\n"
    "                     checksum) and source-key alias; --remove deletes\n"
    "                     bad ones\n"
    "  prune --max-bytes N  evict least recently used entries until at most\n"
    "                     N bytes remain (N may end in K, M, G, T)\n"
    "  clear              delete every entry\n"
    "  export KEY --out FILE  write entry KEY's cubin (verified) to FILE,\n"
    "                     for cuobjdump or nvdisasm\n"
    "\n"
    "options:\n"
    "  --dir DIR          the cache root (default: $FLEXJIT_CACHE_DIR, else\n"
    "                     $XDG_CACHE_HOME/flexjit, else ~/.cache/flexjit)\n"
    "  --pack FILE        ls and verify: a .fjpack instead of a directory\n"
    "  --help, -h         this text (also after an action)\n"
    "\n"
    "Only files the cache creates are touched, and no symbolic link below the\n"
    "root is followed. Exit status 1 when an action could not do its job (an\n"
    "unreadable folder, a file that cannot be removed), with the path and the\n"
    "reason on stderr.\n";

static const char *const action_help[][2] = {
    {"ls", "usage: flexjit cache ls [--dir DIR | --pack FILE.fjpack]\n"
           "\n"
           "Lists entries, most recently used first: last use, target, size,\n"
           "release, key and readable kernel name; then the number of\n"
           "source-key aliases (how a process without NVRTC finds an entry)\n"
           "and each dangling or corrupt one.\n"},
    {"stats", "usage: flexjit cache stats [--dir DIR]\n"
              "\n"
              "Prints the number and size of entries per release and target,\n"
              "the oldest and newest use, the source-key aliases and the size\n"
              "limit in effect (FLEXJIT_CACHE_MAX_BYTES).\n"},
    {"verify",
     "usage: flexjit cache verify [--dir DIR | --pack FILE.fjpack] "
     "[--remove]\n"
     "\n"
     "Re-reads every entry and checks its magic, format, length, key and\n"
     "checksum, then every source-key alias (well formed, its entry there);\n"
     "prints each bad one. With --remove, deletes bad entries, bad aliases\n"
     "and temp files left by crashed writers. Exit status 1 when bad\n"
     "entries or aliases remain, or one could not be removed.\n"},
    {"prune", "usage: flexjit cache prune --max-bytes N [--dir DIR]\n"
              "\n"
              "Evicts least recently used entries until at most N bytes\n"
              "(.cubin + .json) remain. N is a byte count, optionally with a\n"
              "K, M, G or T suffix (powers of 1024). Entries another process\n"
              "is compiling right now are kept; source-key aliases left\n"
              "dangling go with their entries. Exit status 1 when an entry\n"
              "could not be removed.\n"},
    {"clear", "usage: flexjit cache clear [--dir DIR]\n"
              "\n"
              "Deletes every entry (and alias, lock and temp file) of every\n"
              "release under the cache root. Only files the cache created are\n"
              "touched. Exit status 1 when one could not be removed.\n"},
    {"export", "usage: flexjit cache export KEY --out FILE [--arch ARCH] [--dir DIR]\n"
               "\n"
               "Writes the cubin of the entry whose key is KEY (32 hex digits, as\n"
               "`flexjit cache ls` prints them), checked as verify checks it and\n"
               "without the entry's header, to FILE: an ELF file for\n"
               "`cuobjdump -sass` or `nvdisasm`. --arch picks among entries of\n"
               "one key for several targets. Exit status 1 when there is no such\n"
               "entry, it is corrupt, or FILE cannot be written.\n"},
};

typedef struct cc_opts {
  const char *action, *dir, *pack, *max_bytes, *key, *out, *arch;
  int remove;
} cc_opts;

static void cc_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void cc_error(const char *fmt, ...) {
  va_list ap;
  fputs("flexjit cache: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static int print_help(const char *action) {
  for (size_t i = 0; i < sizeof action_help / sizeof *action_help; i++)
    if (action && !strcmp(action, action_help[i][0])) {
      fputs(action_help[i][1], stdout);
      return CC_OK;
    }
  fputs(cache_usage, stdout);
  return CC_OK;
}

static int known_action(const char *a) {
  for (size_t i = 0; i < sizeof action_help / sizeof *action_help; i++)
    if (!strcmp(a, action_help[i][0]))
      return 1;
  return 0;
}

/* Returns -1 to go on, else an exit status. */
static int parse_args(int argc, char **argv, cc_opts *o) {
  memset(o, 0, sizeof *o);
  const struct {
    const char *name;
    const char **value;
  } valued[] = {{"--dir", &o->dir}, {"--pack", &o->pack}, {"--max-bytes", &o->max_bytes},
                {"--out", &o->out}, {"--arch", &o->arch}};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int m = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h"))
      return print_help(o->action);
    for (size_t k = 0; !m && k < sizeof valued / sizeof *valued; k++)
      m = cli_opt_value(argc, argv, &i, valued[k].name, valued[k].value);
    if (m < 0) {
      cc_error("%s needs a value", a);
      return CC_USAGE;
    }
    if (m > 0)
      continue;
    if (!strcmp(a, "--remove")) {
      o->remove = 1;
    } else if (a[0] == '-') {
      cc_error("unknown option '%s' (see --help)", a);
      return CC_USAGE;
    } else if (!o->action && known_action(a)) {
      o->action = a;
    } else if (o->action && !strcmp(o->action, "export") && !o->key) {
      o->key = a;
    } else {
      cc_error("unexpected '%s': the action is one of ls, stats, verify, "
               "prune, clear, export (see --help)",
               a);
      return CC_USAGE;
    }
  }
  if (!o->action) {
    fputs(cache_usage, stderr);
    return CC_USAGE;
  }
  return -1;
}

/* ---- helpers ------------------------------------------------------------ */

static const char *human_bytes(uint64_t n, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%llu B", (unsigned long long)n);
  else
    snprintf(buf, len, "%.1f %s", v, units[u]);
  return buf;
}

static const char *local_time(time_t t, char *buf, size_t len) {
  struct tm tm;
  if (!localtime_r(&t, &tm) || !strftime(buf, len, "%Y-%m-%d %H:%M", &tm))
    snprintf(buf, len, "?");
  return buf;
}

static fjc_store *open_store(const cc_opts *o) {
  fjc_store *s = NULL;
  char err[1024], buf[4096];
  const char *root =
      o->dir ? o->dir
             : fjc_store_default_root(getenv("FLEXJIT_CACHE_DIR"),
                                      getenv("XDG_CACHE_HOME"), getenv("HOME"),
                                      buf, sizeof buf, NULL);
  if (fjc_store_open(root, 0, cli_log, (void *)"cache", &s, err, sizeof err) !=
      FJ_OK) {
    cc_error("%s", err);
    return NULL;
  }
  if (!fjc_store_enabled(s)) {
    cc_error("the kernel cache is disabled (FLEXJIT_CACHE_DIR is empty, or "
             "no HOME); give --dir DIR");
    fjc_store_close(s);
    return NULL;
  }
  return s;
}

/* The source-key aliases of a store, counted; bad ones printed when asked. */
typedef struct alias_count {
  int all, dangling, corrupt, print;
} alias_count;

static int count_alias(void *user, const fjc_alias_info *a) {
  alias_count *ac = user;
  ac->all++;
  ac->dangling += a->dangling;
  ac->corrupt += a->corrupt;
  if (ac->print && a->corrupt)
    printf("corrupt source-key alias %s\n", a->path);
  else if (ac->print && a->dangling)
    printf("dangling source-key alias %s: entry %s is gone\n", a->path,
           a->key.hex);
  return 0;
}

static int count_aliases(fjc_store *s, alias_count *ac) {
  char err[1024];
  if (fjc_store_list_aliases(s, count_alias, ac, err, sizeof err) == FJ_OK)
    return 0;
  cc_error("%s", err);
  return -1;
}

/* Every entry of the store, collected for sorting. */
typedef struct entry_list {
  fjc_entry_info *v;
  char **paths;
  int n, cap, failed;
} entry_list;

static int collect(void *user, const fjc_entry_info *e) {
  entry_list *l = user;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    fjc_entry_info *v = realloc(l->v, (size_t)cap * sizeof *v);
    if (v)
      l->v = v;
    char **p = realloc(l->paths, (size_t)cap * sizeof *p);
    if (p)
      l->paths = p;
    if (!v || !p) {
      l->failed = 1;
      return 1;
    }
    l->cap = cap;
  }
  l->v[l->n] = *e;
  if (!(l->paths[l->n] = strdup(e->path))) {
    l->failed = 1;
    return 1;
  }
  l->v[l->n].path = l->paths[l->n];
  l->n++;
  return 0;
}

static void free_list(entry_list *l) {
  for (int i = 0; i < l->n; i++)
    free(l->paths[i]);
  free(l->paths);
  free(l->v);
}

static int newest_first(const void *pa, const void *pb) {
  const fjc_entry_info *a = pa, *b = pb;
  if (a->mtime.tv_sec != b->mtime.tv_sec)
    return a->mtime.tv_sec > b->mtime.tv_sec ? -1 : 1;
  if (a->mtime.tv_nsec != b->mtime.tv_nsec)
    return a->mtime.tv_nsec > b->mtime.tv_nsec ? -1 : 1;
  return strcmp(a->key.hex, b->key.hex);
}

static int load_list(fjc_store *s, entry_list *l) {
  char err[1024];
  memset(l, 0, sizeof *l);
  if (fjc_store_list(s, collect, l, err, sizeof err) != FJ_OK) {
    cc_error("%s", err);
    return -1;
  }
  if (l->failed) {
    cc_error("out of memory listing %s", fjc_store_root(s));
    return -1;
  }
  if (l->n > 1)
    qsort(l->v, (size_t)l->n, sizeof *l->v, newest_first);
  return 0;
}

/* ---- actions ------------------------------------------------------------ */

static int pack_ls(const char *path) {
  fjc_pack *p = NULL;
  fjc_pack_entry e;
  char err[1024], size[32];
  if (fjc_pack_open(path, &p, err, sizeof err) != FJ_OK) {
    cc_error("%s", err);
    return CC_FAIL;
  }
  for (int i = 0; i < fjc_pack_count(p); i++) {
    fjc_pack_entry_at(p, i, &e);
    printf("%-7s %10s  nvrtc %-5s %s  %s\n", e.arch,
           human_bytes(e.size, size, sizeof size), e.nvrtc, e.full_key.hex,
           e.name);
  }
  printf("%d entries in %s\n", fjc_pack_count(p), path);
  fjc_pack_close(p);
  return CC_OK;
}

static int cmd_ls(const cc_opts *o) {
  entry_list l;
  char when[32], size[32];
  if (o->pack)
    return pack_ls(o->pack);
  alias_count ac = {0, 0, 0, 1};
  fjc_store *s = open_store(o);
  if (!s)
    return CC_FAIL;
  int rc = load_list(s, &l) ? CC_FAIL : CC_OK;
  for (int i = 0; rc == CC_OK && i < l.n; i++) {
    const fjc_entry_info *e = &l.v[i];
    printf("%s  %-7s %10s  %-7s %s  %s\n",
           local_time(e->mtime.tv_sec, when, sizeof when), e->arch,
           human_bytes(e->cubin_bytes + e->meta_bytes, size, sizeof size),
           e->libver, e->key.hex, e->name[0] ? e->name : "(no metadata)");
  }
  if (rc == CC_OK && count_aliases(s, &ac) != 0)
    rc = CC_FAIL;
  if (rc == CC_OK && ac.all)
    printf("source-key aliases: %d (how a process without NVRTC finds an "
           "entry)\n", ac.all);
  free_list(&l);
  fjc_store_close(s);
  return rc;
}

/* One row of the stats table: a (release, arch) pair. */
typedef struct group {
  char libver[32], arch[32];
  int entries;
  uint64_t bytes;
} group;

static group *group_of(group *g, int *n, const fjc_entry_info *e) {
  for (int i = 0; i < *n; i++)
    if (!strcmp(g[i].libver, e->libver) && !strcmp(g[i].arch, e->arch))
      return &g[i];
  group *x = &g[(*n)++];
  memset(x, 0, sizeof *x);
  snprintf(x->libver, sizeof x->libver, "%s", e->libver);
  snprintf(x->arch, sizeof x->arch, "%s", e->arch);
  return x;
}

static void print_limit(void) {
  const char *env = getenv("FLEXJIT_CACHE_MAX_BYTES");
  uint64_t v;
  char size[32];
  if (env && env[0] && fjc_parse_size(env, &v) == 0)
    printf("size limit: %s (FLEXJIT_CACHE_MAX_BYTES)\n",
           human_bytes(v, size, sizeof size));
  else
    printf("size limit: none (set FLEXJIT_CACHE_MAX_BYTES or the context "
           "option)\n");
}

static int cmd_stats(const cc_opts *o) {
  entry_list l;
  char size[32], when[32];
  uint64_t total = 0;
  fjc_store *s = open_store(o);
  if (!s)
    return CC_FAIL;
  if (load_list(s, &l)) {
    free_list(&l);
    fjc_store_close(s);
    return CC_FAIL;
  }
  group *g = calloc((size_t)(l.n ? l.n : 1), sizeof *g);
  int ng = 0;
  for (int i = 0; g && i < l.n; i++) {
    group *x = group_of(g, &ng, &l.v[i]);
    x->entries++;
    x->bytes += l.v[i].cubin_bytes + l.v[i].meta_bytes;
    total += l.v[i].cubin_bytes + l.v[i].meta_bytes;
  }
  printf("cache: %s\n", fjc_store_root(s));
  printf("entries: %d, %s\n", l.n, human_bytes(total, size, sizeof size));
  for (int i = 0; i < ng; i++)
    printf("  release %-8s %-7s %5d entries  %10s%s\n", g[i].libver,
           g[i].arch, g[i].entries, human_bytes(g[i].bytes, size, sizeof size),
           strcmp(g[i].libver, FJ_VERSION_STRING) ? "  (other release)" : "");
  if (l.n) {
    printf("newest use: %s\n",
           local_time(l.v[0].mtime.tv_sec, when, sizeof when));
    printf("oldest use: %s\n",
           local_time(l.v[l.n - 1].mtime.tv_sec, when, sizeof when));
  }
  alias_count ac = {0, 0, 0, 0};
  int rc = count_aliases(s, &ac) ? CC_FAIL : CC_OK;
  printf("source-key aliases: %d", ac.all);
  if (ac.dangling || ac.corrupt)
    printf(" (%d dangling, %d corrupt: `flexjit cache verify --remove` "
           "deletes them)", ac.dangling, ac.corrupt);
  printf("\n");
  print_limit();
  free(g);
  free_list(&l);
  fjc_store_close(s);
  return rc;
}

static int pack_verify(const char *path) {
  fjc_pack *p = NULL;
  fjc_pack_entry e;
  char err[1024];
  int bad = 0;
  if (fjc_pack_open(path, &p, err, sizeof err) != FJ_OK) {
    cc_error("%s", err);
    return CC_FAIL;
  }
  for (int i = 0; i < fjc_pack_count(p); i++) {
    const char *why = fjc_pack_check_blob(p, i);
    if (!why)
      continue;
    fjc_pack_entry_at(p, i, &e);
    printf("bad: %s (%s, key %s): %s\n", e.name, e.arch, e.full_key.hex, why);
    bad++;
  }
  printf("checked %d entries of %s: %d bad\n", fjc_pack_count(p), path, bad);
  fjc_pack_close(p);
  return bad ? CC_FAIL : CC_OK;
}

static void print_bad(void *user, const char *path, const char *why) {
  (void)user;
  printf("bad: %s: %s\n", path, why);
}

static int cmd_verify(const cc_opts *o) {
  fjc_verify_report r;
  char err[1024];
  if (o->pack)
    return pack_verify(o->pack);
  fjc_store *s = open_store(o);
  if (!s)
    return CC_FAIL;
  if (fjc_store_verify(s, o->remove, print_bad, NULL, &r, err, sizeof err) !=
      FJ_OK) {
    cc_error("verify: %s", err);
    fjc_store_close(s);
    return CC_FAIL;
  }
  printf("checked %d entries in %s: %d bad", r.checked, fjc_store_root(s),
         r.bad);
  if (o->remove)
    printf(", %d removed, %d stale temp files removed", r.removed,
           r.stale_temps);
  if (r.foreign)
    printf(", %d of another entry format left alone", r.foreign);
  printf("; %d source-key aliases: %d bad", r.aliases, r.bad_aliases);
  if (o->remove)
    printf(", %d removed", r.removed_aliases);
  printf("\n");
  int left = r.bad - r.removed + r.bad_aliases - r.removed_aliases;
  if (left && !o->remove)
    printf("run `flexjit cache verify --remove` to delete them (they would "
           "be recompiled anyway)\n");
  fjc_store_close(s);
  return left ? CC_FAIL : CC_OK;
}

static int cmd_prune(const cc_opts *o) {
  fjc_prune_report r;
  uint64_t max;
  char a[32], b[32], c[32], err[1024];
  if (!o->max_bytes) {
    cc_error("prune needs --max-bytes N (see flexjit cache prune --help)");
    return CC_USAGE;
  }
  if (fjc_parse_size(o->max_bytes, &max) != 0) {
    cc_error("--max-bytes: '%s' is not a size (e.g. 500000000, 500M, 2G)",
             o->max_bytes);
    return CC_USAGE;
  }
  fjc_store *s = open_store(o);
  if (!s)
    return CC_FAIL;
  fj_status st = fjc_store_prune(s, max, NULL, 0, &r, err, sizeof err);
  printf("removed %d of %d entries (%s); %s remain (limit %s)", r.removed,
         r.entries, human_bytes(r.bytes_removed, a, sizeof a),
         human_bytes(r.bytes_after, b, sizeof b),
         human_bytes(max, c, sizeof c));
  if (r.aliases_removed)
    printf("; %d dangling source-key aliases removed", r.aliases_removed);
  printf("\n");
  if (st != FJ_OK)
    cc_error("prune: %s", err);
  fjc_store_close(s);
  return st == FJ_OK ? CC_OK : CC_FAIL;
}

static int cmd_clear(const cc_opts *o) {
  int removed = 0;
  uint64_t bytes = 0;
  char size[32], err[1024];
  fjc_store *s = open_store(o);
  if (!s)
    return CC_FAIL;
  fj_status st = fjc_store_clear(s, &removed, &bytes, err, sizeof err);
  printf("removed %d entries (%s) from %s\n", removed,
         human_bytes(bytes, size, sizeof size), fjc_store_root(s));
  if (st != FJ_OK)
    cc_error("clear: %s", err);
  fjc_store_close(s);
  return st == FJ_OK ? CC_OK : CC_FAIL;
}

/* The entries of one key (and target, when given). */
typedef struct key_match {
  fjc_key key;
  const char *arch;
  int n;
  char path[4096], arch_of[32], name[128];
} key_match;

static int match_key(void *user, const fjc_entry_info *e) {
  key_match *m = user;
  if (strcmp(e->key.hex, m->key.hex) || (m->arch && strcmp(e->arch, m->arch)))
    return 0;
  if (m->n++ == 0) {
    snprintf(m->path, sizeof m->path, "%s", e->path);
    snprintf(m->arch_of, sizeof m->arch_of, "%s", e->arch);
    snprintf(m->name, sizeof m->name, "%s", e->name);
  }
  return 0;
}

/* Writes size bytes to path: 0, or -1 with errno set and no partial file
 * left. */
static int write_file(const char *path, const void *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f)
    return -1;
  const int wrote = fwrite(data, 1, size, f) == size;
  const int e = errno;
  if (fclose(f) != 0 || !wrote) {
    if (!wrote)
      errno = e ? e : EIO;
    const int keep = errno;
    remove(path);
    errno = keep;
    return -1;
  }
  return 0;
}

static int cmd_export(const cc_opts *o) {
  key_match m;
  char err[1024];
  memset(&m, 0, sizeof m);
  if (!o->key || !o->out) {
    cc_error("export needs KEY and --out FILE (see flexjit cache export --help)");
    return CC_USAGE;
  }
  if (fjc_key_from_hex(o->key, &m.key) != 0) {
    cc_error("export: '%s' is not a key (32 hex digits, as flexjit cache ls prints)",
             o->key);
    return CC_USAGE;
  }
  m.arch = o->arch;
  fjc_store *s = open_store(o);
  if (!s)
    return CC_FAIL;
  int rc = CC_FAIL;
  void *data = NULL;
  size_t size = 0;
  if (fjc_store_list(s, match_key, &m, err, sizeof err) != FJ_OK) {
    cc_error("export: %s", err);
  } else if (m.n == 0) {
    cc_error("export: no entry with key %s%s%s under %s (flexjit cache ls lists them)",
             m.key.hex, o->arch ? " for " : "", o->arch ? o->arch : "", fjc_store_root(s));
  } else if (m.n > 1) {
    cc_error("export: %d entries have key %s (several releases or targets); give "
             "--arch, or clear the old releases",
             m.n, m.key.hex);
  } else {
    const int fd = open(m.path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    int foreign = 0;
    const char *why = fd < 0 ? strerror(errno)
                             : fjc_entry_read_fd(fd, &m.key, &data, &size, &foreign);
    if (fd >= 0)
      close(fd);
    if (why) {
      cc_error("export: %s: %s%s", m.path, why,
               foreign ? " (another flexjit release wrote it: export it with that one)"
                       : " (flexjit cache verify --remove deletes a corrupt entry)");
    } else if (write_file(o->out, data, size) != 0) {
      cc_error("export: cannot write %s: %s", o->out, strerror(errno));
    } else {
      printf("wrote %zu bytes of cubin (%s, %s) to %s\n", size, m.arch_of,
             m.name[0] ? m.name : "no metadata", o->out);
      rc = CC_OK;
    }
  }
  free(data);
  fjc_store_close(s);
  return rc;
}

int fj_cli_cache(int argc, char **argv) {
  cc_opts o;
  int rc = parse_args(argc, argv, &o);
  if (rc >= 0)
    return rc;
  if (o.pack && strcmp(o.action, "ls") && strcmp(o.action, "verify")) {
    cc_error("--pack works with ls and verify only");
    return CC_USAGE;
  }
  if (!strcmp(o.action, "ls"))
    return cmd_ls(&o);
  if (!strcmp(o.action, "stats"))
    return cmd_stats(&o);
  if (!strcmp(o.action, "verify"))
    return cmd_verify(&o);
  if (!strcmp(o.action, "prune"))
    return cmd_prune(&o);
  if (!strcmp(o.action, "export"))
    return cmd_export(&o);
  return cmd_clear(&o);
}
