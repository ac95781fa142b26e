/*
 * tests/unit/test_cache_layers.c: the files of cache/ stand in layers. A
 * module (X.c with X.h) may use the modules below it and never one that
 * uses it back, directly or around a loop: the store does not prune, and
 * pruning and inspection work on the store. Read from the sources'
 * #include "cache/..." lines, the only way one cache/ file reaches
 * another's functions.
 *
 * Also: cache/ reads no environment variable (the caller resolves the root
 * and the size limit), except the fault injection of test builds, which
 * sits under #ifdef FJC_FAULT_INJECTION.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MODULES 32

typedef struct graph {
  char names[MAX_MODULES][32];
  int n;
  int uses[MAX_MODULES][MAX_MODULES];
} graph;

static int module_index(graph *g, const char *name) {
  for (int i = 0; i < g->n; i++)
    if (strcmp(g->names[i], name) == 0)
      return i;
  assert_true(g->n < MAX_MODULES);
  snprintf(g->names[g->n], sizeof g->names[0], "%s", name);
  return g->n++;
}

/* "store.c" -> "store"; 0, or -1 for a file that is not .c or .h. */
static int module_of(const char *file, char *out, size_t n) {
  size_t len = strlen(file);
  if (len < 3 || file[len - 2] != '.' ||
      (file[len - 1] != 'c' && file[len - 1] != 'h'))
    return -1;
  snprintf(out, n, "%.*s", (int)(len - 2), file);
  return 0;
}

static void read_edges(graph *g, const char *dir, const char *file) {
  char path[1024], line[1024], from[32], to[32];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  module_of(file, from, sizeof from);
  int a = module_index(g, from);
  while (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "#include \"cache/");
    if (p != line)
      continue;
    p += strlen("#include \"cache/");
    const char *q = strchr(p, '"');
    if (!q)
      continue;
    char inc[64];
    snprintf(inc, sizeof inc, "%.*s", (int)(q - p), p);
    if (module_of(inc, to, sizeof to) != 0)
      continue;
    int b = module_index(g, to);
    if (a != b)
      g->uses[a][b] = 1;
  }
  fclose(f);
}

/* Depth-first search for a cycle; fills path with it. */
static int find_cycle(const graph *g, int at, int *state, int *stack,
                      int depth, char *path, size_t n) {
  state[at] = 1;
  stack[depth] = at;
  for (int b = 0; b < g->n; b++) {
    if (!g->uses[at][b])
      continue;
    if (state[b] == 1) {
      size_t len = 0;
      int start = 0;
      while (stack[start] != b)
        start++;
      for (int i = start; i <= depth; i++)
        len += (size_t)snprintf(path + len, n - len, "%s -> ",
                                g->names[stack[i]]);
      snprintf(path + len, n - len, "%s", g->names[b]);
      return 1;
    }
    if (state[b] == 0 &&
        find_cycle(g, b, state, stack, depth + 1, path, n))
      return 1;
  }
  state[at] = 2;
  return 0;
}

static void test_modules_form_layers(void **state) {
  (void)state;
  graph g;
  char dir[512], cycle[1024] = "";
  int st[MAX_MODULES] = {0}, stack[MAX_MODULES];
  memset(&g, 0, sizeof g);
  snprintf(dir, sizeof dir, "%s/cache", FJ_SOURCE_DIR);
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  char name[32];
  while ((e = readdir(d)))
    if (module_of(e->d_name, name, sizeof name) == 0)
      read_edges(&g, dir, e->d_name);
  closedir(d);
  assert_true(g.n >= 6);
  for (int i = 0; i < g.n; i++)
    if (st[i] == 0 && find_cycle(&g, i, st, stack, 0, cycle, sizeof cycle))
      fail_msg("cache/ modules use each other in a loop: %s", cycle);
}

static void test_no_environment_reads(void **state) {
  (void)state;
  char dir[512], path[1024], line[1024];
  snprintf(dir, sizeof dir, "%s/cache", FJ_SOURCE_DIR);
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    char name[32];
    if (module_of(e->d_name, name, sizeof name) != 0)
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int in_faults = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
      lineno++;
      if (strncmp(line, "#ifdef FJC_FAULT_INJECTION", 26) == 0)
        in_faults = 1;
      else if (in_faults && strncmp(line, "#endif", 6) == 0)
        in_faults = 0;
      else if (!in_faults && strstr(line, "getenv("))
        fail_msg("%s:%d reads the environment: %s", path, lineno, line);
    }
    fclose(f);
  }
  closedir(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_modules_form_layers),
      cmocka_unit_test(test_no_environment_reads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
