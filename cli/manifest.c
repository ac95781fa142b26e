/*
 * cli/manifest.c: loading the precompile manifest (see manifest.h).
 *
 * The table is read by a C function run under lua_pcall, so every Lua error
 * (a memory limit included) becomes a message, never a panic; raw accesses
 * keep a manifest's metatables from running code while it is read.
 */
#include "cli/manifest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "cache/store.h"
#include "lua/state.h"

/* Manifests are a few lines; anything bigger is a mistake. */
#define MANIFEST_MAX_BYTES (1 << 20)
#define LIST_MAX 4096

static const char *const known_fields[] = {"specs", "head_dims", "dtypes",
                                           "archs", "passes", NULL};

typedef struct reader {
  cli_manifest *m;
  const char *dir; /* the manifest's directory, "" for the current one */
} reader;

/* ---- reading the table --------------------------------------------------- */

int cli_manifest_dtype(const char *name, fj_dtype *out) {
  if (!strcmp(name, "bf16") || !strcmp(name, "bfloat16")) {
    *out = FJ_DTYPE_BF16;
    return 0;
  }
  if (!strcmp(name, "fp16") || !strcmp(name, "f16") ||
      !strcmp(name, "float16")) {
    *out = FJ_DTYPE_F16;
    return 0;
  }
  return -1;
}

const char *cli_manifest_dtype_name(fj_dtype d) {
  return d == FJ_DTYPE_BF16 ? "bf16" : "fp16";
}

/* Pushes t[field] (raw) and returns the length of the list there, raising an
 * error unless it is a non-empty sequence; 0 (nothing pushed) when it is
 * absent and optional. */
static int open_list(lua_State *L, const char *field, int required) {
  lua_pushstring(L, field);
  lua_rawget(L, 1);
  if (lua_isnil(L, -1) && !required) {
    lua_pop(L, 1);
    return 0;
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "manifest field '%s' must be a list, got %s", field,
               luaL_typename(L, -1));
  lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
  if (n == 0)
    luaL_error(L, "manifest field '%s' is empty", field);
  if (n > LIST_MAX)
    luaL_error(L, "manifest field '%s' has more than %d items", field,
               LIST_MAX);
  return (int)n;
}

/* The i-th string of the list on top; raises on anything else. */
static const char *list_string(lua_State *L, const char *field, int i) {
  lua_rawgeti(L, -1, i);
  if (lua_type(L, -1) != LUA_TSTRING)
    luaL_error(L, "manifest field '%s': item %d must be a string, got %s",
               field, i, luaL_typename(L, -1));
  const char *s = lua_tostring(L, -1);
  lua_pop(L, 1); /* still referenced by the list, so s stays valid */
  return s;
}

static void *checked_calloc(lua_State *L, int n, size_t size) {
  void *p = calloc((size_t)n, size);
  if (!p)
    luaL_error(L, "out of memory reading the manifest");
  return p;
}

static char *checked_strdup(lua_State *L, const char *s) {
  char *p = strdup(s);
  if (!p)
    luaL_error(L, "out of memory reading the manifest");
  return p;
}

/* A spec path as written, resolved against the manifest's directory. */
static char *resolve(lua_State *L, const char *dir, const char *spec) {
  if (spec[0] == '/' || !dir[0])
    return checked_strdup(L, spec);
  size_t n = strlen(dir) + strlen(spec) + 2;
  char *p = malloc(n);
  if (!p)
    luaL_error(L, "out of memory reading the manifest");
  snprintf(p, n, "%s/%s", dir, spec);
  return p;
}

static void read_specs(lua_State *L, reader *r) {
  int n = open_list(L, "specs", 1);
  r->m->specs = checked_calloc(L, n, sizeof(char *));
  for (int i = 1; i <= n; i++) {
    const char *s = list_string(L, "specs", i);
    r->m->specs[r->m->n_specs++] = resolve(L, r->dir, s);
  }
  lua_pop(L, 1);
}

static void read_head_dims(lua_State *L, cli_manifest *m) {
  int n = open_list(L, "head_dims", 1);
  m->head_dims = checked_calloc(L, n, sizeof(int));
  for (int i = 1; i <= n; i++) {
    int ok = 0;
    lua_rawgeti(L, -1, i);
    lua_Integer d = lua_tointegerx(L, -1, &ok);
    if (!ok || lua_type(L, -1) != LUA_TNUMBER || d <= 0 || d > 1024)
      luaL_error(L, "manifest field 'head_dims': item %d must be a positive "
                    "integer such as 64 or 128",
                 i);
    lua_pop(L, 1);
    m->head_dims[m->n_head_dims++] = (int)d;
  }
  lua_pop(L, 1);
}

static void read_dtypes(lua_State *L, cli_manifest *m) {
  int n = open_list(L, "dtypes", 1);
  m->dtypes = checked_calloc(L, n, sizeof(fj_dtype));
  for (int i = 1; i <= n; i++) {
    const char *s = list_string(L, "dtypes", i);
    if (cli_manifest_dtype(s, &m->dtypes[m->n_dtypes]))
      luaL_error(L, "manifest field 'dtypes': unknown dtype '%s' (bf16 or "
                    "fp16)",
                 s);
    m->n_dtypes++;
  }
  lua_pop(L, 1);
}

static void read_archs(lua_State *L, cli_manifest *m) {
  int n = open_list(L, "archs", 1);
  m->archs = checked_calloc(L, n, sizeof(char *));
  for (int i = 1; i <= n; i++) {
    const char *s = list_string(L, "archs", i);
    if (!fjc_arch_is_valid(s) || strncmp(s, "sm_", 3) != 0)
      luaL_error(L, "manifest field 'archs': '%s' is not a real target such "
                    "as sm_80 or sm_90a",
                 s);
    m->archs[m->n_archs++] = checked_strdup(L, s);
  }
  lua_pop(L, 1);
}

static void read_passes(lua_State *L, cli_manifest *m) {
  int n = open_list(L, "passes", 0);
  int given = n > 0;
  m->passes = checked_calloc(L, given ? n : 1, sizeof(char *));
  if (!given) {
    m->passes[m->n_passes++] = checked_strdup(L, "forward");
    return;
  }
  for (int i = 1; i <= n; i++)
    m->passes[m->n_passes++] =
        checked_strdup(L, list_string(L, "passes", i));
  lua_pop(L, 1);
}

static void reject_unknown_fields(lua_State *L) {
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    int known = 0;
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING)
      for (int i = 0; known_fields[i]; i++)
        known |= strcmp(lua_tostring(L, -1), known_fields[i]) == 0;
    if (!known) {
      const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                     : luaL_typename(L, -1);
      luaL_error(L, "manifest has an unknown field '%s' (expected specs, "
                    "head_dims, dtypes, archs, passes)",
                 k);
    }
  }
}

/* lua_CFunction: reads the table at index 1 into the reader (upvalue). */
static int read_table(lua_State *L) {
  reader *r = lua_touserdata(L, lua_upvalueindex(1));
  if (!lua_istable(L, 1))
    return luaL_error(L, "manifest must return a table, got %s",
                      luaL_typename(L, 1));
  reject_unknown_fields(L);
  read_specs(L, r);
  read_head_dims(L, r->m);
  read_dtypes(L, r->m);
  read_archs(L, r->m);
  read_passes(L, r->m);
  return 0;
}

static char *read_file(const char *path, size_t *len, char *err,
                       size_t errlen) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  if (!f) {
    snprintf(err, errlen, "cannot open manifest %s", path);
    return NULL;
  }
  buf = malloc(MANIFEST_MAX_BYTES + 1);
  if (!buf) {
    snprintf(err, errlen, "out of memory reading %s", path);
    goto done;
  }
  *len = fread(buf, 1, MANIFEST_MAX_BYTES + 1, f);
  if (ferror(f) || *len > MANIFEST_MAX_BYTES) {
    snprintf(err, errlen, "%s: %s", path,
             ferror(f) ? "read error" : "manifest larger than 1 MiB");
    free(buf);
    buf = NULL;
  }
done:
  fclose(f);
  return buf;
}

/* The directory part of path ("" for a bare file name). */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  size_t n = slash ? (size_t)(slash - path) : 0;
  char *d = malloc(n + 2);
  if (!d)
    return NULL;
  if (slash && n == 0) /* "/manifest.lua" */
    n = 1;
  memcpy(d, path, n);
  d[n] = '\0';
  return d;
}

/* Runs the chunk in the spec sandbox (lua/state.h: base, string, table and
 * math only, text only, bounded memory and instructions) and reads the table
 * it returns. */
static int run_manifest(fjl_sandbox *sb, const char *path, const char *src,
                        size_t len, reader *r, char *err, size_t errlen) {
  char chunk[512];
  fjl_chunkname(path, chunk, sizeof chunk);
  if (fjl_sandbox_load(sb, src, len, chunk, err, errlen) != FJ_OK ||
      fjl_sandbox_pcall(sb, 0, 1, err, errlen) != FJ_OK)
    return -1;
  lua_pushlightuserdata(sb->L, r);
  lua_pushcclosure(sb->L, read_table, 1);
  lua_insert(sb->L, -2);
  char msg[1024];
  if (fjl_sandbox_pcall(sb, 1, 0, msg, sizeof msg) != FJ_OK) {
    /* These messages come from C, without a position: name the file. */
    snprintf(err, errlen, "%s: %s", path, msg);
    return -1;
  }
  return 0;
}

int cli_manifest_load(const char *path, cli_manifest *m, char *err,
                      size_t errlen) {
  fjl_sandbox sb = {0};
  char *src = NULL, *dir = NULL;
  size_t len = 0;
  reader r = {m, ""};
  int rc = -1;

  memset(m, 0, sizeof *m);
  if (!(src = read_file(path, &len, err, errlen)))
    goto fail;
  if (!(dir = dir_of(path))) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  r.dir = dir;
  if (fjl_sandbox_open(&sb, NULL, err, errlen) != FJ_OK)
    goto fail;
  rc = run_manifest(&sb, path, src, len, &r, err, errlen);
fail:
  fjl_sandbox_close(&sb);
  free(src);
  free(dir);
  if (rc != 0)
    cli_manifest_free(m);
  return rc;
}

static void free_strings(char **v, int n) {
  for (int i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

void cli_manifest_free(cli_manifest *m) {
  if (!m)
    return;
  free_strings(m->specs, m->n_specs);
  free_strings(m->archs, m->n_archs);
  free_strings(m->passes, m->n_passes);
  free(m->head_dims);
  free(m->dtypes);
  memset(m, 0, sizeof *m);
}
