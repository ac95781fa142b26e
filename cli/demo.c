/*
 * cli/demo.c: `flexjit demo`, the README's quick start. One command that
 * does something useful on any machine: with a GPU it runs the causal and
 * document examples with --check --bench; without one it compiles and
 * caches the forward kernel of every example spec for sm_80 and sm_90a
 * (NVRTC needs no GPU; one compile per CPU at a time), so a later run on a
 * GPU machine sharing the cache finds them.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "runtime/context.h"

static const char demo_usage[] =
    "usage: flexjit demo [--examples DIR] [--cache-dir DIR]\n"
    "\n"
    "With a GPU: runs examples/causal.lua and examples/document.lua\n"
    "(B=2, H=8, L=2048, D=128, bf16) with --check --bench.\n"
    "Without one: compiles and caches the forward kernel (D=128, bf16) of\n"
    "every examples/*.lua for sm_80 and sm_90a.\n"
    "\n"
    "options:\n"
    "  --examples DIR   where the example specs are (default: $FLEXJIT_EXAMPLES,\n"
    "                   else ./examples, else ../examples next to the binary)\n"
    "  --cache-dir DIR  kernel cache root\n"
    "  --help           this text\n";

#define DEMO_MAX_SPECS 64
#define DEMO_MAX_THREADS 64

static int is_dir(const char *p) {
  struct stat st;
  return p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The examples folder: option, environment, working directory, or next to
 * the binary (build/flexjit -> build/../examples). */
static int find_examples(const char *opt, char *out, size_t len) {
  char exe[1024];
  if (opt) return snprintf(out, len, "%s", opt), is_dir(out);
  if (is_dir(getenv("FLEXJIT_EXAMPLES")))
    return snprintf(out, len, "%s", getenv("FLEXJIT_EXAMPLES")), 1;
  if (is_dir("examples")) return snprintf(out, len, "examples"), 1;
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return 0;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (slash) *slash = '\0';
  snprintf(out, len, "%s/../examples", exe);
  if (is_dir(out)) return 1;
  snprintf(out, len, "%s/examples", exe);
  return is_dir(out);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of DIR's spec files (owned by the caller). */
static int list_specs(const char *dir, char **names, int max) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  if (!d) return 0;
  while ((e = readdir(d)) && n < max) {
    size_t len = strlen(e->d_name);
    /* manifest.lua lists kernels for `precompile`; it is not a spec. */
    if (len > 4 && !strcmp(e->d_name + len - 4, ".lua") &&
        strncmp(e->d_name, "manifest", 8) != 0)
      if ((names[n] = strdup(e->d_name))) n++;
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  return n;
}

/* The no-GPU demo's kernels, compiled by one worker per CPU, each with its
 * own context (the disk cache's lock keeps two processes or threads from
 * compiling one key twice). Job j is spec j / 2 for arch j % 2. */
typedef struct demo_jobs {
  const char *dir, *cache_dir;
  char **names;
  int n_jobs, next;
  int done, cached, failed;
  double ms_total;
  pthread_mutex_t mu;
} demo_jobs;

static const char *const demo_archs[] = {"sm_80", "sm_90a"};

static void *demo_worker(void *arg) {
  demo_jobs *J = arg;
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = J->cache_dir;
  o.log = cli_log;
  o.log_user = (void *)"demo";
  fj_context *ctx = NULL;
  int ok = fj_context_create(&o, &ctx) == FJ_OK;
  char path[4096];
  for (;;) {
    pthread_mutex_lock(&J->mu);
    int j = J->next < J->n_jobs ? J->next++ : -1;
    pthread_mutex_unlock(&J->mu);
    if (j < 0) break;
    int from_cache = 0, failed = 0;
    double ms = 0;
    fj_spec *spec = NULL;
    snprintf(path, sizeof path, "%s/%s", J->dir, J->names[j / 2]);
    if (!ok) {
      cli_error("demo", "cannot create a context");
      failed = 1;
    } else if (fj_spec_load_file(ctx, path, &spec) != FJ_OK) {
      if (j % 2 == 0) cli_error("demo", "%s", fj_context_last_error(ctx));
      failed = 1;
    } else {
      fj_kernel_options ko = {.head_dim = 128, .dtype = FJ_DTYPE_BF16,
                              .arch = demo_archs[j % 2]};
      failed = cli_compile_one(ctx, spec, path, &ko, 0, &from_cache, &ms) != 0;
      fj_spec_destroy(spec);
    }
    pthread_mutex_lock(&J->mu);
    if (failed) {
      J->failed++;
    } else {
      J->done++;
      J->cached += from_cache;
      J->ms_total += ms;
    }
    pthread_mutex_unlock(&J->mu);
  }
  fj_context_destroy(ctx);
  return NULL;
}

static int compile_all(const char *dir, const char *cache_dir) {
  char *names[DEMO_MAX_SPECS];
  int n = list_specs(dir, names, DEMO_MAX_SPECS);
  if (n == 0) {
    cli_error("demo", "no *.lua specs in %s", dir);
    return CLI_FAIL;
  }
  demo_jobs J;
  memset(&J, 0, sizeof J);
  J.dir = dir, J.cache_dir = cache_dir, J.names = names, J.n_jobs = 2 * n;
  pthread_mutex_init(&J.mu, NULL);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = cpus < 1 ? 1 : cpus > J.n_jobs ? J.n_jobs : (int)cpus;
  pthread_t tids[DEMO_MAX_THREADS];
  if (threads > DEMO_MAX_THREADS) threads = DEMO_MAX_THREADS;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int started = 0;
  for (int i = 1; i < threads; i++)
    if (pthread_create(&tids[i], NULL, demo_worker, &J) == 0)
      started = i;
    else
      break;
  demo_worker(&J);
  for (int i = 1; i <= started; i++) pthread_join(tids[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double wall = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  pthread_mutex_destroy(&J.mu);
  printf("no GPU: compiled and cached %d kernels (%d specs x sm_80, sm_90a; "
         "%d compiled, %.1f s of NVRTC on %d thread%s, %.1f s wall; %d already "
         "cached)%s\n",
         J.done, n, J.done - J.cached, J.ms_total / 1e3, started + 1,
         started ? "s" : "", wall, J.cached,
         J.failed ? "; some failed, see above" : "");
  for (int i = 0; i < n; i++) free(names[i]);
  return J.failed ? CLI_FAIL : CLI_OK;
}

/* Document ids for a packed sequence of length L: documents of 96..1119
 * tokens from a fixed generator, so runs are repeatable. */
static int doc_buffer(cli_value *v, int L) {
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)L);
  uint32_t x = 12345;
  if (!ids) return 0;
  for (int i = 0, id = 0; i < L; id++) {
    x = x * 1664525u + 1013904223u;
    int len = 96 + (int)((x >> 8) % 1024);
    for (int j = 0; j < len && i < L; j++) ids[i++] = id;
  }
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "doc");
  v->is_buffer = 1;
  v->text = "(generated document ids)";
  v->buffer.dtype = NPY_I32;
  v->buffer.ndim = 1;
  v->buffer.shape[0] = L;
  v->buffer.count = (size_t)L;
  v->buffer.data = ids;
  return 1;
}

static int run_examples(const char *dir, const char *cache_dir) {
  static const char *const specs[] = {"causal.lua", "document.lua"};
  char path[4096];
  int worst = CLI_OK;
  for (int i = 0; i < 2; i++) {
    run_config c;
    cli_run_config_init(&c);
    snprintf(path, sizeof path, "%s/%s", dir, specs[i]);
    c.spec_path = path;
    c.cache_dir = cache_dir;
    c.B = 2, c.Hq = c.Hkv = 8, c.Lq = c.Lk = 2048, c.D = 128;
    c.check = c.bench = 1;
    if (i == 1 && !doc_buffer(&c.values[c.num_values++], c.Lq)) {
      cli_error("demo", "out of memory");
      return CLI_FAIL;
    }
    printf("== %s\n", path);
    fflush(stdout);
    int rc = cli_run(&c);
    cli_values_free(c.values, c.num_values);
    if (rc > worst) worst = rc;
  }
  return worst;
}

int cmd_demo(int argc, char **argv) {
  const char *examples = NULL, *cache_dir = NULL, *v;
  char dir[2048];
  int rc = CLI_OK;
  for (int i = 1; i < argc; i++) {
    int m;
    if (cli_is_help(argv[i])) {
      fputs(demo_usage, stdout);
      return CLI_OK;
    }
    if ((m = cli_opt_value(argc, argv, &i, "--examples", &v)) > 0) {
      examples = v;
    } else if (m == 0 &&
               (m = cli_opt_value(argc, argv, &i, "--cache-dir", &v)) > 0) {
      cache_dir = v;
    } else {
      cli_error("demo", m < 0 ? "%s needs a value" : "unknown argument '%s'",
                argv[i]);
      return CLI_USAGE;
    }
  }
  if (!find_examples(examples, dir, sizeof dir)) {
    cli_error("demo", "cannot find the examples folder: pass --examples DIR");
    return CLI_USAGE;
  }
  fj_context *probe = NULL;
  if (fj_context_create(NULL, &probe) != FJ_OK) return CLI_FAIL;
  int have_gpu = fjr_context_device(probe, NULL) == FJ_OK;
  fj_context_destroy(probe);
  if (have_gpu)
    rc = run_examples(dir, cache_dir);
  else
    rc = compile_all(dir, cache_dir);
  return rc;
}
