/*
 * tests/fuzz/replay.c: main() for an input fuzzer (input_*.c) built
 * without libFuzzer: runs LLVMFuzzerTestOneInput once on each file named,
 * or on each regular file of a directory named, so that every build runs
 * the fuzzers over their seeds (CTest's fuzz/input_*). Exit status 1 when
 * an argument cannot be read or no input was run.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return -1;
  }
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) {
      uint8_t *grown = realloc(buf, cap *= 2);
      if (!grown) free(buf);
      buf = grown;
    }
  }
  const int bad = !buf || ferror(f);
  fclose(f);
  if (bad) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    free(buf);
    return -1;
  }
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of dir, in name order; their count, or -1. */
static int run_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "replay: cannot open %s\n", dir);
    return -1;
  }
  char **names = NULL;
  int n = 0, runs = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    char **grown = realloc(names, (size_t)(n + 1) * sizeof *names);
    if (!grown || !(grown[n] = strdup(path))) abort();
    names = grown;
    n++;
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_names);
  for (int i = 0; i < n; i++) {
    if (runs >= 0) runs = run_file(names[i]) == 0 ? runs + 1 : -1;
    free(names[i]);
  }
  free(names);
  return runs;
}

int main(int argc, char **argv) {
  int runs = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: cannot read %s\n", argv[i]);
      return 1;
    }
    /* run_file and run_dir say what they could not read. */
    const int n = S_ISDIR(st.st_mode) ? run_dir(argv[i]) : run_file(argv[i]) == 0 ? 1 : -1;
    if (n < 0) return 1;
    runs += n;
  }
  printf("replay: %d inputs\n", runs);
  return runs > 0 ? 0 : 1;
}
