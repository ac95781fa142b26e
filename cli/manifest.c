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

/* The CLI target does not have Lua's include directory on its path; the
 * distribution's versioned directory is the fallback. */
#if __has_include(<lua.h>)
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#else
#include <lua5.4/lauxlib.h>
#include <lua5.4/lua.h>
#include <lua5.4/lualib.h>
#endif

#include "cache/store.h"

/* Manifests are a few lines; anything bigger is a mistake. */
#define MANIFEST_MAX_BYTES (1 << 20)
#define LIST_MAX 4096
/* Bounds of the sandbox, as for specs: a bad manifest is an error, never a
 * hang. */
#define SANDBOX_MEMORY_BYTES ((size_t)64 << 20)
#define SANDBOX_INSTRUCTIONS 50000000L
#define SANDBOX_HOOK_STEP 1000

static const char *const known_fields[] = {"specs", "head_dims", "dtypes",
                                           "archs", "passes", NULL};

typedef struct reader {
  cli_manifest *m;
  const char *dir; /* the manifest's directory, "" for the current one */
} reader;

/* ---- a minimal sandbox ---------------------------------------------------
 * The spec sandbox (lua/state.h) is not reachable from the CLI's include
 * path, so this is its small twin: base, string, table and math only, no
 * code loading, bounded memory and instructions. */

typedef struct sandbox {
  lua_State *L;
  size_t used;
  long instructions;
} sandbox;

static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  sandbox *sb = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    sb->used -= old;
    return NULL;
  }
  if (nsize > old && sb->used - old + nsize > SANDBOX_MEMORY_BYTES)
    return NULL;
  void *p = realloc(ptr, nsize);
  if (p)
    sb->used = sb->used - old + nsize;
  return p;
}

static void count_hook(lua_State *L, lua_Debug *ar) {
  void *ud = NULL;
  lua_getallocf(L, &ud);
  sandbox *sb = ud;
  sb->instructions += SANDBOX_HOOK_STEP;
  if (sb->instructions <= SANDBOX_INSTRUCTIONS)
    return;
  /* Inside a hook, luaL_where has no Lua frame to name: do it here. */
  lua_getinfo(L, "Sl", ar);
  lua_pushfstring(L, "%s:%d: instruction limit exceeded: does the manifest "
                     "loop forever?",
                  ar->short_src, ar->currentline);
  lua_error(L);
}

static int open_libraries(lua_State *L) {
  static const char *const removed[] = {
      "dofile", "loadfile", "load", "require", "collectgarbage", "print",
      "pcall", "xpcall", "warn", NULL};
  luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
  luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
  luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
  luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
  lua_settop(L, 0);
  lua_pushglobaltable(L);
  for (int i = 0; removed[i]; i++) {
    lua_pushnil(L);
    lua_setfield(L, 1, removed[i]);
  }
  lua_getfield(L, 1, LUA_STRLIBNAME);
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  return 0;
}

/* Copies the error at the top of the stack into err. */
static void error_text(lua_State *L, const char *path, int status, char *err,
                       size_t errlen) {
  const char *msg = lua_tostring(L, -1);
  if (status == LUA_ERRMEM)
    snprintf(err, errlen, "%s: memory limit exceeded", path);
  else
    snprintf(err, errlen, "%s", msg ? msg : "error object is not a string");
}

static int sandbox_open(sandbox *sb, char *err, size_t errlen) {
  memset(sb, 0, sizeof *sb);
  sb->L = lua_newstate(sandbox_alloc, sb);
  if (!sb->L) {
    snprintf(err, errlen, "cannot create a Lua state (out of memory)");
    return -1;
  }
  lua_sethook(sb->L, count_hook, LUA_MASKCOUNT, SANDBOX_HOOK_STEP);
  lua_pushcfunction(sb->L, open_libraries);
  if (lua_pcall(sb->L, 0, 0, 0) != LUA_OK) {
    snprintf(err, errlen, "cannot open the Lua libraries");
    return -1;
  }
  return 0;
}

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

/* Runs the chunk (source text only) and reads the table it returns. */
static int run_manifest(sandbox *sb, const char *path, const char *src,
                        size_t len, reader *r, char *err, size_t errlen) {
  char chunk[512];
  int status;
  snprintf(chunk, sizeof chunk, "@%s", path);
  status = luaL_loadbufferx(sb->L, src, len, chunk, "t");
  if (status == LUA_OK)
    status = lua_pcall(sb->L, 0, 1, 0);
  if (status != LUA_OK) {
    error_text(sb->L, path, status, err, errlen);
    return -1;
  }
  lua_pushlightuserdata(sb->L, r);
  lua_pushcclosure(sb->L, read_table, 1);
  lua_insert(sb->L, -2);
  status = lua_pcall(sb->L, 1, 0, 0);
  if (status != LUA_OK) {
    /* These messages come from C, without a position: name the file. */
    char msg[1024];
    error_text(sb->L, path, status, msg, sizeof msg);
    snprintf(err, errlen, "%s: %s", path, msg);
    return -1;
  }
  return 0;
}

int cli_manifest_load(const char *path, cli_manifest *m, char *err,
                      size_t errlen) {
  sandbox sb = {0};
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
  if (sandbox_open(&sb, err, errlen) != 0)
    goto fail;
  rc = run_manifest(&sb, path, src, len, &r, err, errlen);
fail:
  if (sb.L)
    lua_close(sb.L);
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
