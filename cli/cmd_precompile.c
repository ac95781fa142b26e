/*
 * cli/cmd_precompile.c: `flexjit precompile MANIFEST.lua --out DIR|FILE.fjpack
 * [-j N]`: compiles every kernel a manifest lists, in parallel, into a cache
 * directory (to ship as FLEXJIT_CACHE_DIR) or a single .fjpack file.
 *
 * Each worker thread owns one fj_context (contexts are not thread-safe) and
 * pulls jobs from a shared counter; NVRTC compiles of distinct programs run
 * concurrently. Everything goes through the public API, so a precompiled
 * kernel is exactly what a host program would have compiled itself.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/inspect.h"
#include "cache/key.h"
#include "cache/meta.h"
#include "cache/pack.h"
#include "cache/store.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/manifest.h"
#include "flexjit.h"
#include "runtime/decode.h"

enum { PC_OK = 0, PC_FAIL = 1, PC_USAGE = 2 };

#define PC_MAX_JOBS_FLAG 256
#define PC_BAR_WIDTH 28

static const char precompile_usage[] =
    "usage: flexjit precompile MANIFEST.lua --out DIR|FILE.fjpack [-j N]\n"
    "\n"
    "Compiles every kernel MANIFEST.lua lists (specs x head_dims x dtypes x\n"
    "archs x passes) with NVRTC, N at a time, for deployment:\n"
    "  --out DIR            a kernel cache directory; ship it and point\n"
    "                       FLEXJIT_CACHE_DIR at it on the target machine\n"
    "  --out FILE.fjpack    one pack file holding every cubin and an index,\n"
    "                       which a context mounts read-only (no NVRTC\n"
    "                       needed on the target machine)\n"
    "\n"
    "The manifest is Lua returning a table, for example:\n"
    "  return { specs = {\"causal.lua\"}, head_dims = {64, 128},\n"
    "           dtypes = {\"bf16\", \"fp16\"}, archs = {\"sm_80\", "
    "\"sm_90a\"},\n"
    "           passes = {\"forward\"} }\n"
    "Spec paths are relative to the manifest's directory. Passes: forward,\n"
    "forward_blockmask (the forward kernel a launch with a block mask of\n"
    "128 x 128 blocks takes; at head dim 64 on sm_90a not the plain one),\n"
    "forward_varlen (the forward's variant for the serving layouts:\n"
    "seqlens_k, paged KV, packed batches), forward_long (its variant for\n"
    "rows of 8192 keys and more on average; at head dim 128 on sm_90a for\n"
    "specs without a score_mod, else the plain one), blockmask (the\n"
    "kernels that build a spec's block masks, as flexjit run does for masks\n"
    "that read buffers; one per spec and target), backward (the backward\n"
    "pass's kernels), backward_deterministic (its deterministic variant;\n"
    "refused for specs with trainable buffers), backward_varlen (its\n"
    "variant for packed batches, cu_seqlens) and decode (what launches of 1\n"
    "to 16 query tokens run: the decode kernel and the LSE merge; head dims\n"
    "64 and 128).\n"
    "Needs no GPU.\n"
    "\n"
    "options:\n"
    "  --out PATH, -o PATH  where to write (required)\n"
    "  -j N, --jobs N       parallel compiles (default: the number of CPUs)\n"
    "  -v, --verbose        one line per kernel: name, key, time, path\n"
    "  --help, -h           this text\n"
    "\n"
    "On a terminal a progress bar is shown; otherwise one summary line.\n";

typedef struct pc_opts {
  const char *manifest, *out;
  int jobs, verbose, pack;
} pc_opts;

typedef struct job_result {
  fj_status status;
  /* The job's kernels, a cubin each: one, or the decode pass's (its decode
   * kernels and the util kernels: runtime/decode.h). The first names the
   * job. */
  fj_kernel_info kernels[FJR_DECODE_KERNELS];
  int n_kernels;
  char *error; /* malloc'd, when status != FJ_OK */
} job_result;

/* State shared by the workers; mu guards next, done and the terminal. */
typedef struct run_state {
  const cli_manifest *m;
  const char *cache_dir;
  int n_jobs;
  job_result *results;
  pthread_mutex_t mu;
  int next, done, failed;
  int tty;
} run_state;

/* A job index decoded into its manifest coordinates, spec outermost. */
typedef struct job {
  const char *spec, *arch, *pass;
  int head_dim;
  fj_dtype dtype;
} job;

static void pc_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void pc_error(const char *fmt, ...) {
  va_list ap;
  fputs("flexjit precompile: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int parse_jobs(const char *text, int *out) {
  char *end;
  long v;
  errno = 0;
  v = strtol(text, &end, 10);
  if (!*text || *end || errno || v < 1 || v > PC_MAX_JOBS_FLAG)
    return -1;
  *out = (int)v;
  return 0;
}

static int default_jobs(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > PC_MAX_JOBS_FLAG ? PC_MAX_JOBS_FLAG : (int)n;
}

/* Returns -1 to go on, else an exit status. */
static int parse_args(int argc, char **argv, pc_opts *o) {
  memset(o, 0, sizeof *o);
  o->jobs = default_jobs();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    int m;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(precompile_usage, stdout);
      return PC_OK;
    }
    if ((m = cli_opt_value(argc, argv, &i, "--out", &v)) ||
        (m = cli_opt_value(argc, argv, &i, "-o", &v))) {
      if (m < 0)
        goto missing;
      o->out = v;
    } else if ((m = cli_opt_value(argc, argv, &i, "--jobs", &v)) ||
               (m = cli_opt_value(argc, argv, &i, "-j", &v)) ||
               (!strncmp(a, "-j", 2) && a[2] && (v = a + 2, m = 1))) {
      if (m < 0)
        goto missing;
      if (parse_jobs(v, &o->jobs)) {
        pc_error("-j wants a number from 1 to %d, got '%s'",
                 PC_MAX_JOBS_FLAG, v);
        return PC_USAGE;
      }
    } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
      o->verbose = 1;
    } else if (a[0] == '-' && a[1]) {
      pc_error("unknown option '%s' (see --help)", a);
      return PC_USAGE;
    } else if (!o->manifest) {
      o->manifest = a;
    } else {
      pc_error("one manifest only ('%s' and '%s')", o->manifest, a);
      return PC_USAGE;
    }
    continue;
  missing:
    pc_error("%s needs a value", a);
    return PC_USAGE;
  }
  if (!o->manifest || !o->out) {
    pc_error("%s (see --help)", !o->manifest ? "no MANIFEST.lua given"
                                             : "--out DIR|FILE.fjpack is "
                                               "required");
    return PC_USAGE;
  }
  o->pack = ends_with(o->out, ".fjpack");
  return -1;
}

/* ---- jobs --------------------------------------------------------------- */

static job decode_job(const cli_manifest *m, int index) {
  job j;
  j.pass = m->passes[index % m->n_passes];
  index /= m->n_passes;
  j.arch = m->archs[index % m->n_archs];
  index /= m->n_archs;
  j.dtype = m->dtypes[index % m->n_dtypes];
  index /= m->n_dtypes;
  j.head_dim = m->head_dims[index % m->n_head_dims];
  index /= m->n_head_dims;
  j.spec = m->specs[index];
  return j;
}

static char *job_error(const job *j, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static char *job_error(const job *j, const char *fmt, ...) {
  char msg[8192], *out = NULL;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (asprintf(&out, "%s (d%d %s %s %s): %s", j->spec, j->head_dim,
               cli_manifest_dtype_name(j->dtype), j->arch, j->pass, msg) < 0)
    out = NULL;
  return out;
}

/* The first kernel of the job whose cubin is not on disk, or NULL. */
static const fj_kernel_info *first_unstored(const job_result *r) {
  for (int i = 0; i < r->n_kernels; i++)
    if (!r->kernels[i].cubin_path[0]) return &r->kernels[i];
  return NULL;
}

static void run_job(fj_context *ctx, const cli_manifest *m, int index,
                    job_result *r) {
  job j = decode_job(m, index);
  fj_spec *spec = NULL;
  fj_kernel_options ko = {.head_dim = j.head_dim, .dtype = j.dtype, .arch = j.arch};
  /* forward_blockmask: the kernel launches with FlexAttention's default
   * block masks (128 x 128) take; where it is the plain forward kernel the
   * pack holds it once. */
  const int builder = strcmp(j.pass, "blockmask") == 0;
  const int backward = strncmp(j.pass, "backward", 8) == 0;
  const int decode = strcmp(j.pass, "decode") == 0;
  if (strcmp(j.pass, "forward_blockmask") == 0) {
    ko.block_mask_block_q = 128;
  } else if (strcmp(j.pass, "backward_deterministic") == 0) {
    ko.deterministic = 1;
  } else if (strcmp(j.pass, "backward_varlen") == 0 || strcmp(j.pass, "forward_varlen") == 0) {
    ko.varlen = 1;
  } else if (strcmp(j.pass, "forward_long") == 0) {
    ko.long_rows = 1;
  } else if (strcmp(j.pass, "forward") != 0 && strcmp(j.pass, "backward") != 0 && !builder &&
             !decode) {
    r->status = FJ_EUNSUPPORTED;
    r->error = job_error(&j, "pass '%s' is not supported (forward, forward_blockmask, "
                         "forward_varlen, forward_long, blockmask, backward, "
                         "backward_deterministic, backward_varlen, decode)", j.pass);
    return;
  }
  r->status = FJ_ENOMEM;
  if (!ctx) {
    r->error = job_error(&j, "cannot create a flexjit context");
    return;
  }
  r->status = fj_spec_load_file(ctx, j.spec, &spec);
  r->n_kernels = 1;
  /* The builder does not depend on the head dim or dtype: every job of
   * one (spec, arch) but the first finds it in the cache. */
  if (r->status == FJ_OK)
    r->status = builder    ? fj_compile_block_mask(ctx, spec, j.arch, &r->kernels[0])
                : backward ? fj_compile_backward(ctx, spec, &ko, &r->kernels[0])
                : decode   ? fjr_compile_decode_all(ctx, spec, &ko, r->kernels, &r->n_kernels)
                           : fj_compile_forward(ctx, spec, &ko, &r->kernels[0]);
  const fj_kernel_info *unstored = r->status == FJ_OK ? first_unstored(r) : NULL;
  if (r->status != FJ_OK)
    r->error = job_error(&j, "%s", fj_context_last_error(ctx));
  else if (unstored) {
    /* Kept in memory only: the cache directory could not be written (the
     * store's warning was printed). */
    r->status = FJ_ECACHE;
    r->error = job_error(&j, "%s was compiled but could not be stored", unstored->name);
  }
  fj_spec_destroy(spec);
}

/* ---- progress ------------------------------------------------------------ */

static void draw_bar(const run_state *rs, const char *name) {
  char bar[PC_BAR_WIDTH + 1];
  int filled = rs->n_jobs ? rs->done * PC_BAR_WIDTH / rs->n_jobs : 0;
  for (int i = 0; i < PC_BAR_WIDTH; i++)
    bar[i] = i < filled ? '#' : '.';
  bar[PC_BAR_WIDTH] = '\0';
  fprintf(stderr, "\r\033[K[%s] %d/%d%s%s", bar, rs->done, rs->n_jobs,
          name ? "  " : "", name ? name : "");
  fflush(stderr);
}

/* Library warnings (corrupt entries, unwritable cache), printed above the
 * progress bar. */
static void worker_log(void *user, fj_log_level level, const char *msg) {
  run_state *rs = user;
  if (level < FJ_LOG_WARN)
    return;
  pthread_mutex_lock(&rs->mu);
  if (rs->tty)
    fputs("\r\033[K", stderr);
  fprintf(stderr, "flexjit precompile: %s: %s\n",
          level >= FJ_LOG_ERROR ? "error" : "warning", msg);
  if (rs->tty)
    draw_bar(rs, NULL);
  pthread_mutex_unlock(&rs->mu);
}

static int take_job(run_state *rs) {
  pthread_mutex_lock(&rs->mu);
  int j = rs->next < rs->n_jobs ? rs->next++ : -1;
  pthread_mutex_unlock(&rs->mu);
  return j;
}

static void finish_job(run_state *rs, int index) {
  job_result *r = &rs->results[index];
  pthread_mutex_lock(&rs->mu);
  rs->done++;
  if (r->status != FJ_OK) {
    rs->failed++;
    if (rs->tty)
      fputs("\r\033[K", stderr);
    pc_error("%s", r->error ? r->error : "out of memory");
  }
  if (rs->tty)
    draw_bar(rs, r->status == FJ_OK ? r->kernels[0].name : NULL);
  pthread_mutex_unlock(&rs->mu);
}

static void *worker(void *arg) {
  run_state *rs = arg;
  fj_context_options o;
  fj_context *ctx = NULL;
  int j;
  fj_context_options_init(&o);
  o.cache_dir = rs->cache_dir;
  o.log = worker_log;
  o.log_user = rs;
  if (fj_context_create(&o, &ctx) != FJ_OK)
    ctx = NULL;
  while ((j = take_job(rs)) >= 0) {
    run_job(ctx, rs->m, j, &rs->results[j]);
    finish_job(rs, j);
  }
  fj_context_destroy(ctx);
  return NULL;
}

/* Runs every job on `threads` workers (the calling thread included). */
static void run_all(run_state *rs, int threads) {
  pthread_t *tids = calloc((size_t)threads, sizeof *tids);
  int started = 0;
  if (rs->tty)
    draw_bar(rs, NULL);
  for (int i = 1; tids && i < threads; i++)
    if (pthread_create(&tids[i], NULL, worker, rs) == 0)
      started = i;
    else
      break;
  worker(rs);
  for (int i = 1; i <= started; i++)
    pthread_join(tids[i], NULL);
  free(tids);
  if (rs->tty) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
  }
}

/* ---- output ------------------------------------------------------------- */

static void print_kernel_lines(const run_state *rs) {
  for (int i = 0; i < rs->n_jobs; i++) {
    const job_result *r = &rs->results[i];
    if (r->status != FJ_OK)
      continue;
    for (int j = 0; j < r->n_kernels; j++) {
      const fj_kernel_info *k = &r->kernels[j];
      char when[32];
      if (k->from_cache)
        snprintf(when, sizeof when, "cached");
      else
        snprintf(when, sizeof when, "%.0f ms", k->compile_ms);
      printf("%-44s %s %8s  %s\n", k->name, k->key, when, k->cubin_path);
    }
  }
}

static void print_summary(const run_state *rs, double seconds, int jobs) {
  int cached = 0, compiled = 0;
  double total_ms = 0, slowest = 0;
  const char *slowest_name = "";
  for (int i = 0; i < rs->n_jobs; i++) {
    const job_result *r = &rs->results[i];
    if (r->status != FJ_OK)
      continue;
    for (int j = 0; j < r->n_kernels; j++) {
      const fj_kernel_info *k = &r->kernels[j];
      if (k->from_cache) {
        cached++;
        continue;
      }
      compiled++;
      total_ms += k->compile_ms;
      if (k->compile_ms > slowest) {
        slowest = k->compile_ms;
        slowest_name = k->name;
      }
    }
  }
  printf("compiled %d kernel%s (%d from cache) in %.1f s, -j %d", compiled + cached,
         compiled + cached == 1 ? "" : "s", cached, seconds, jobs);
  if (rs->failed)
    printf(", %d FAILED", rs->failed);
  if (compiled)
    printf("; NVRTC %.0f ms per kernel on average, slowest %.0f ms (%s)",
           total_ms / compiled, slowest, slowest_name);
  printf("\n");
}

/* Adds one kernel of a result, read back from the temp store, to the
 * pack. The source key comes from the entry's sidecar. */
static int add_to_pack(fjc_pack_writer *w, fjc_store *store,
                       const fj_kernel_info *r, int *warned_source_key) {
  fjc_pack_entry e;
  char meta[1100], hex[64] = "", err[1024];
  void *data = NULL;
  size_t size = 0;
  int rc = -1;
  memset(&e, 0, sizeof e);
  if (fjc_key_from_hex(r->key, &e.full_key) != 0 ||
      fjc_store_get(store, r->arch, &e.full_key, &data, &size, NULL, 0,
                    NULL, 0) != FJ_OK) {
    pc_error("cannot read back %s (key %s) from %s", r->name,
             r->key, fjc_store_root(store));
    return -1;
  }
  snprintf(meta, sizeof meta, "%.*s.json",
           (int)strlen(r->cubin_path) - 6, r->cubin_path);
  if (fjc_meta_file_string(meta, 65536, "source_key", hex, sizeof hex) != 0 ||
      fjc_key_from_hex(hex, &e.source_key) != 0) {
    if (!(*warned_source_key)++)
      pc_error("warning: %s has no \"source_key\"; such pack entries can "
               "only be found where NVRTC is available",
               meta);
    e.source_key = e.full_key;
  }
  fjc_meta_file_string(meta, 65536, "nvrtc", e.nvrtc, sizeof e.nvrtc);
  snprintf(e.arch, sizeof e.arch, "%s", r->arch);
  snprintf(e.name, sizeof e.name, "%s", r->name);
  e.data = data;
  e.size = size;
  if (fjc_pack_writer_add(w, &e, err, sizeof err) != FJ_OK)
    pc_error("%s", err);
  else
    rc = 0;
  free(data);
  return rc;
}

/* Fills the pack writer opened before the build (which made sure the pack
 * can be written) and publishes it; the writer is gone afterwards. */
static int write_pack(const run_state *rs, fjc_pack_writer *w,
                      const char *out) {
  fjc_store *store = NULL;
  char err[1024];
  int warned = 0;
  if (fjc_store_open(rs->cache_dir, 0, cli_log, (void *)"precompile", &store,
                     err, sizeof err) != FJ_OK) {
    pc_error("%s", err);
    fjc_pack_writer_abort(w);
    return PC_FAIL;
  }
  for (int i = 0; i < rs->n_jobs; i++) {
    const job_result *r = &rs->results[i];
    int bad = 0;
    for (int j = 0; j < r->n_kernels && !bad; j++)
      bad = add_to_pack(w, store, &r->kernels[j], &warned) != 0;
    if (bad) {
      fjc_pack_writer_abort(w);
      fjc_store_close(store);
      return PC_FAIL;
    }
  }
  int count = fjc_pack_writer_count(w);
  fjc_store_close(store);
  if (fjc_pack_writer_finish(w, err, sizeof err) != FJ_OK) {
    pc_error("%s", err);
    return PC_FAIL;
  }
  struct stat st;
  printf("wrote %s: %d kernels, %lld bytes\n", out, count,
         stat(out, &st) == 0 ? (long long)st.st_size : 0LL);
  return PC_OK;
}

/* A private cache for a pack build, removed afterwards. */
static char *make_temp_cache(void) {
  const char *tmp = getenv("TMPDIR");
  char *dir = NULL;
  if (asprintf(&dir, "%s/flexjit-precompile-XXXXXX",
               tmp && tmp[0] ? tmp : "/tmp") < 0)
    return NULL;
  if (!mkdtemp(dir)) {
    pc_error("cannot create a temporary directory %s: %s", dir,
             strerror(errno));
    free(dir);
    return NULL;
  }
  return dir;
}

static void remove_temp_cache(const char *dir) {
  fjc_store *store = NULL;
  char err[256];
  if (fjc_store_open(dir, 0, NULL, NULL, &store, err, sizeof err) == FJ_OK)
    fjc_store_clear(store, NULL, NULL, NULL, 0);
  fjc_store_close(store);
  rmdir(dir);
}

static void free_results(job_result *r, int n) {
  for (int i = 0; r && i < n; i++)
    free(r[i].error);
  free(r);
}

int fj_cli_precompile(int argc, char **argv) {
  pc_opts o;
  cli_manifest m;
  run_state rs;
  char err[2048];
  char *temp = NULL;
  fjc_pack_writer *w = NULL;
  int rc = parse_args(argc, argv, &o);
  if (rc >= 0)
    return rc;
  /* Every kernel built must stay: a size limit meant for a runtime cache
   * would evict earlier kernels of this very run. Threads start later. */
  if (getenv("FLEXJIT_CACHE_MAX_BYTES")) {
    unsetenv("FLEXJIT_CACHE_MAX_BYTES");
    if (o.verbose)
      pc_error("note: FLEXJIT_CACHE_MAX_BYTES is ignored while precompiling");
  }
  if (cli_manifest_load(o.manifest, &m, err, sizeof err) != 0) {
    pc_error("%s", err);
    return PC_FAIL;
  }
  memset(&rs, 0, sizeof rs);
  rc = PC_FAIL;
  rs.m = &m;
  rs.n_jobs = m.n_specs * m.n_head_dims * m.n_dtypes * m.n_archs * m.n_passes;
  rs.tty = isatty(2);
  pthread_mutex_init(&rs.mu, NULL);
  if (!(rs.results = calloc((size_t)rs.n_jobs, sizeof *rs.results))) {
    pc_error("out of memory");
    goto done;
  }
  /* The output is checked before anything is compiled: a pack's temp file
   * is made now (next to it, so the rename can publish it), a directory's
   * nearest existing folder must be writable. */
  if (o.pack ? fjc_pack_writer_open(o.out, &w, err, sizeof err) != FJ_OK
             : cli_check_output_dir(o.out, 1, err, sizeof err) != 0) {
    pc_error("--out: %s", err);
    goto done;
  }
  if (o.pack && !(temp = make_temp_cache()))
    goto done;
  rs.cache_dir = o.pack ? temp : o.out;
  int threads = o.jobs < rs.n_jobs ? o.jobs : rs.n_jobs;
  double t0 = now_s();
  run_all(&rs, threads);
  if (o.verbose)
    print_kernel_lines(&rs);
  print_summary(&rs, now_s() - t0, o.jobs);
  if (rs.failed) {
    if (o.pack)
      pc_error("%d of %d kernels failed; %s was not written", rs.failed,
               rs.n_jobs, o.out);
    goto done;
  }
  rc = o.pack ? write_pack(&rs, w, o.out) : PC_OK;
  w = NULL; /* write_pack finished or discarded it */
done:
  fjc_pack_writer_abort(w);
  if (temp)
    remove_temp_cache(temp);
  free(temp);
  free_results(rs.results, rs.n_jobs);
  pthread_mutex_destroy(&rs.mu);
  cli_manifest_free(&m);
  return rc;
}
