/*
 * cli/bench.c: timing by triton.testing.do_bench's rules (cli/bench.h has
 * them in order), written for the CUDA driver API.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/bench.h"
#include "cli/cli.h"

int cli_bench_count(double budget_ms, double estimate_ms) {
  double n = budget_ms / estimate_ms;
  if (!(estimate_ms > 0) || !(n < CLI_BENCH_MAX_COUNT))
    return CLI_BENCH_MAX_COUNT;
  n = floor(n);
  return n >= 1 ? (int)n : 1;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

double cli_bench_median(float *ms, int n) {
  qsort(ms, (size_t)n, sizeof(float), cmp_float);
  return n % 2 ? ms[n / 2] : 0.5 * ((double)ms[n / 2 - 1] + ms[n / 2]);
}

static int cu_ok(const fjr_driver *d, const char *cmd, CUresult r,
                 const char *what) {
  char text[256];
  if (r == CUDA_SUCCESS) return 1;
  fjr_driver_error_text(d, r, text, sizeof text);
  cli_error(cmd, "bench: %s failed: %s", what, text);
  return 0;
}

/* Zeroes the flush buffer on the null stream (do_bench: cache.zero_()). */
static int flush(const fjr_driver *d, const char *cmd, CUdeviceptr buf) {
  return cu_ok(d, cmd,
               d->cuMemsetD32Async(buf, 0, CLI_BENCH_FLUSH_BYTES / 4, NULL),
               "cuMemsetD32Async (L2 flush)");
}

/* n events in a new array *ev; *made counts those created, which
 * free_events releases whatever happened. */
static int make_events(const fjr_driver *d, const char *cmd, int n,
                       CUevent **ev, int *made) {
  *made = 0;
  if (!(*ev = calloc((size_t)n, sizeof **ev))) {
    cli_error(cmd, "bench: out of host memory for %d events", n);
    return 0;
  }
  for (; *made < n; (*made)++)
    if (!cu_ok(d, cmd, d->cuEventCreate(&(*ev)[*made], CU_EVENT_DEFAULT),
               "cuEventCreate"))
      return 0;
  return 1;
}

static void free_events(const fjr_driver *d, CUevent *ev, int made) {
  for (int i = 0; i < made; i++) d->cuEventDestroy(ev[i]);
  free(ev);
}

/* Rule 3: five flushed calls between two events, per call. */
static int estimate(const fjr_driver *d, const char *cmd, cli_bench_fn fn,
                    void *arg, CUdeviceptr buf, double *est_ms) {
  CUevent *ev = NULL;
  float ms = 0;
  int made = 0, ok = 0;
  if (!make_events(d, cmd, 2, &ev, &made) ||
      !cu_ok(d, cmd, d->cuEventRecord(ev[0], NULL), "cuEventRecord"))
    goto fail;
  for (int i = 0; i < CLI_BENCH_ESTIMATE_CALLS; i++)
    if (!flush(d, cmd, buf) || !fn(arg)) goto fail;
  if (!cu_ok(d, cmd, d->cuEventRecord(ev[1], NULL), "cuEventRecord") ||
      !cu_ok(d, cmd, d->cuCtxSynchronize(), "cuCtxSynchronize") ||
      !cu_ok(d, cmd, d->cuEventElapsedTime(&ms, ev[0], ev[1]),
             "cuEventElapsedTime"))
    goto fail;
  *est_ms = (double)ms / CLI_BENCH_ESTIMATE_CALLS;
  ok = 1;
fail:
  free_events(d, ev, made);
  return ok;
}

int cli_bench_run(const fjr_driver *d, const char *cmd, cli_bench_fn fn,
                  void *arg, const cli_bench_options *o, cli_bench_result *r) {
  CUdeviceptr buf = 0;
  CUevent *ev = NULL; /* start and end of timed call i: [2i], [2i + 1] */
  float *ms = NULL;
  int made = 0, ok = 0;

  if (!fn(arg) || !cu_ok(d, cmd, d->cuCtxSynchronize(), "cuCtxSynchronize") ||
      !cu_ok(d, cmd, d->cuMemAlloc(&buf, CLI_BENCH_FLUSH_BYTES),
             "cuMemAlloc (256 MiB L2 flush buffer)") ||
      !estimate(d, cmd, fn, arg, buf, &r->estimate_ms))
    goto fail;
  r->n_warmup = o->warmup >= 0 ? o->warmup
                               : cli_bench_count(o->warmup_ms, r->estimate_ms);
  r->n_repeat = o->iters > 0 ? o->iters
                             : cli_bench_count(o->rep_ms, r->estimate_ms);
  if (!(ms = malloc(sizeof(float) * (size_t)r->n_repeat))) {
    cli_error(cmd, "bench: out of host memory for %d times", r->n_repeat);
    goto fail;
  }
  if (!make_events(d, cmd, 2 * r->n_repeat, &ev, &made)) goto fail;

  for (int i = 0; i < r->n_warmup; i++)
    if (!fn(arg)) goto fail;
  for (int i = 0; i < r->n_repeat; i++)
    if (!flush(d, cmd, buf) ||
        !cu_ok(d, cmd, d->cuEventRecord(ev[2 * i], NULL), "cuEventRecord") ||
        !fn(arg) ||
        !cu_ok(d, cmd, d->cuEventRecord(ev[2 * i + 1], NULL), "cuEventRecord"))
      goto fail;
  if (!cu_ok(d, cmd, d->cuCtxSynchronize(), "cuCtxSynchronize")) goto fail;
  for (int i = 0; i < r->n_repeat; i++)
    if (!cu_ok(d, cmd, d->cuEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]),
               "cuEventElapsedTime"))
      goto fail;
  r->median_ms = cli_bench_median(ms, r->n_repeat);
  r->min_ms = ms[0];
  r->max_ms = ms[r->n_repeat - 1];
  ok = 1;
fail:
  free_events(d, ev, made);
  free(ms);
  if (buf) d->cuMemFree(buf);
  return ok;
}

void cli_bench_describe(const cli_bench_options *o, const cli_bench_result *r,
                        char *buf, size_t len) {
  char warm[64], rep[64];
  if (o->warmup >= 0)
    snprintf(warm, sizeof warm, "%d warm-up (--warmup)", r->n_warmup);
  else
    snprintf(warm, sizeof warm, "%d warm-up (%g ms)", r->n_warmup,
             o->warmup_ms);
  if (o->iters > 0)
    snprintf(rep, sizeof rep, "%d timed (--iters)", r->n_repeat);
  else
    snprintf(rep, sizeof rep, "%d timed (%g ms)", r->n_repeat, o->rep_ms);
  snprintf(buf, len,
           "triton do_bench rules: estimate %.4f ms per call (5 flushed "
           "calls), %s, %s, L2 flushed (256 MiB) before each timed call, "
           "one synchronization at the end",
           r->estimate_ms, warm, rep);
}
