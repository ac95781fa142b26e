/*
 * tests/unit/test_bench.c: `flexjit run --bench`'s timer (cli/bench.c)
 * against a fake driver that logs what is queued and keeps a simulated GPU
 * clock: each flush and each call advance it, an event records it. The log
 * shows the order of do_bench's rules (cli/bench.h): where the flushes, the
 * events and the synchronizations fall; the clock gives known times.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cli/bench.c"

/* ---- cli_error, captured ---- */

static char said[1024];

void cli_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  int n = snprintf(said, sizeof said, "%s: ", cmd);
  va_start(ap, fmt);
  vsnprintf(said + n, sizeof said - (size_t)n, fmt, ap);
  va_end(ap);
}

/* ---- the fake driver ---- */

#define MAX_EVENTS 4096
#define FLUSH_MS 0.25

static struct {
  char log[16384]; /* C call, F flush, E event, S sync */
  size_t len;
  double clock;                /* simulated GPU time, ms */
  double stamp[MAX_EVENTS + 1]; /* per event (1-based handles) */
  int events, live;            /* created, not yet destroyed */
  CUdeviceptr buf;             /* the flush buffer, while allocated */
  int bad_flush;               /* a memset of another size or pointer */
  const double *call_ms;       /* duration of call i */
  int calls, num_call_ms, fail_call; /* fail_call: 1-based, 0 never */
  CUresult alloc_result;
} fk;

static void logc(char c) {
  if (fk.len + 1 < sizeof fk.log) fk.log[fk.len++] = c;
}

static CUresult f_sync(void) {
  logc('S');
  return CUDA_SUCCESS;
}

static CUresult f_alloc(CUdeviceptr *p, size_t n) {
  if (fk.alloc_result != CUDA_SUCCESS) return fk.alloc_result;
  assert_int_equal(n, (size_t)256 << 20);
  *p = fk.buf = 0x10000;
  return CUDA_SUCCESS;
}

static CUresult f_free(CUdeviceptr p) {
  assert_true(p == fk.buf);
  fk.buf = 0;
  return CUDA_SUCCESS;
}

static CUresult f_memset(CUdeviceptr p, unsigned v, size_t n, CUstream s) {
  if (p != fk.buf || !fk.buf || v != 0 || n != ((size_t)64 << 20) || s)
    fk.bad_flush = 1;
  logc('F');
  fk.clock += FLUSH_MS;
  return CUDA_SUCCESS;
}

static CUresult f_ev_create(CUevent *e, unsigned flags) {
  assert_int_equal(flags, CU_EVENT_DEFAULT);
  if (fk.events == MAX_EVENTS) return CUDA_ERROR_OUT_OF_MEMORY;
  *e = (CUevent)(uintptr_t)++fk.events;
  fk.live++;
  return CUDA_SUCCESS;
}

static CUresult f_ev_destroy(CUevent e) {
  assert_non_null(e);
  fk.live--;
  return CUDA_SUCCESS;
}

static CUresult f_ev_record(CUevent e, CUstream s) {
  assert_null(s);
  logc('E');
  fk.stamp[(uintptr_t)e] = fk.clock;
  return CUDA_SUCCESS;
}

static CUresult f_ev_elapsed(float *ms, CUevent a, CUevent b) {
  *ms = (float)(fk.stamp[(uintptr_t)b] - fk.stamp[(uintptr_t)a]);
  return CUDA_SUCCESS;
}

static int call(void *arg) {
  (void)arg;
  fk.calls++;
  if (fk.calls == fk.fail_call) {
    cli_error("run", "launch %d failed", fk.calls);
    return 0;
  }
  logc('C');
  fk.clock += fk.call_ms[(fk.calls - 1) % fk.num_call_ms];
  return 1;
}

static fjr_driver fake_driver(const double *call_ms, int n) {
  fjr_driver d;
  memset(&d, 0, sizeof d);
  memset(&fk, 0, sizeof fk);
  fk.call_ms = call_ms, fk.num_call_ms = n;
  d.cuCtxSynchronize = f_sync;
  d.cuMemAlloc = f_alloc;
  d.cuMemFree = f_free;
  d.cuMemsetD32Async = f_memset;
  d.cuEventCreate = f_ev_create;
  d.cuEventDestroy = f_ev_destroy;
  d.cuEventRecord = f_ev_record;
  d.cuEventElapsedTime = f_ev_elapsed;
  return d;
}

/* The log do_bench's rules give for w warm-up and n timed calls. */
static const char *expected_log(int w, int n) {
  static char s[16384];
  size_t k = 0;
  k += (size_t)snprintf(s + k, sizeof s - k, "CSE");
  for (int i = 0; i < 5; i++) k += (size_t)snprintf(s + k, sizeof s - k, "FC");
  k += (size_t)snprintf(s + k, sizeof s - k, "ES");
  for (int i = 0; i < w; i++) s[k++] = 'C';
  for (int i = 0; i < n; i++) k += (size_t)snprintf(s + k, sizeof s - k, "FECE");
  s[k++] = 'S';
  s[k] = '\0';
  return s;
}

/* ---- tests ---- */

/* A call of 0.75 ms with a 0.25 ms flush: the estimate is 1 ms a call, so
 * 25 warm-up and 100 timed calls; each timed call is flushed before its
 * first event, nothing waits for the GPU until the end, and the flush is
 * outside the timed interval. */
static void test_follows_do_bench(void **state) {
  (void)state;
  static const double ms[] = {0.75};
  fjr_driver d = fake_driver(ms, 1);
  cli_bench_options o = {25, 100, -1, 0};
  cli_bench_result r;
  assert_int_equal(cli_bench_run(&d, "run", call, NULL, &o, &r), 1);
  assert_string_equal(fk.log, expected_log(25, 100));
  assert_false(fk.bad_flush);
  assert_true(fabs(r.estimate_ms - 1.0) < 1e-6);
  assert_int_equal(r.n_warmup, 25);
  assert_int_equal(r.n_repeat, 100);
  assert_true(fabs(r.median_ms - 0.75) < 1e-6);
  assert_int_equal(fk.live, 0);
  assert_true(fk.buf == 0);
}

/* floor(): 1.65 ms + a 0.25 ms flush = 1.9 ms a call gives floor(25 / 1.9) = 13 and floor(100 / 1.9) =
 * 52; a call longer than the budget still runs once. */
static void test_counts_from_budgets(void **state) {
  (void)state;
  static const double ms[] = {1.65};
  fjr_driver d = fake_driver(ms, 1);
  cli_bench_options o = {25, 100, -1, 0};
  cli_bench_result r;
  assert_int_equal(cli_bench_run(&d, "run", call, NULL, &o, &r), 1);
  assert_int_equal(r.n_warmup, 13);
  assert_int_equal(r.n_repeat, 52);
  assert_string_equal(fk.log, expected_log(13, 52));
  o.warmup_ms = 1, o.rep_ms = 1;
  d = fake_driver(ms, 1);
  assert_int_equal(cli_bench_run(&d, "run", call, NULL, &o, &r), 1);
  assert_int_equal(r.n_warmup, 1);
  assert_int_equal(r.n_repeat, 1);
  assert_int_equal(cli_bench_count(25, 0), CLI_BENCH_MAX_COUNT);
  assert_int_equal(cli_bench_count(25, NAN), CLI_BENCH_MAX_COUNT);
  assert_int_equal(cli_bench_count(1e12, 1e-9), CLI_BENCH_MAX_COUNT);
  assert_int_equal(cli_bench_count(100, 0.3), 333);
}

/* --warmup and --iters give the counts; the median of an even count is the
 * mean of the two middle times, as statistics.median. */
static void test_explicit_counts_and_median(void **state) {
  (void)state;
  /* the first call, 5 estimate calls, 2 warm-up calls, then 4 timed */
  static const double ms[] = {1, 1, 1, 1, 1, 1, 9, 9, 4, 1, 3, 2};
  fjr_driver d = fake_driver(ms, 12);
  cli_bench_options o = {25, 100, 2, 4};
  cli_bench_result r;
  assert_int_equal(cli_bench_run(&d, "run", call, NULL, &o, &r), 1);
  assert_string_equal(fk.log, expected_log(2, 4));
  assert_true(fabs(r.median_ms - 2.5) < 1e-6);
  assert_true(fabs(r.min_ms - 1) < 1e-6);
  assert_true(fabs(r.max_ms - 4) < 1e-6);
  d = fake_driver(ms, 12);
  o.warmup = 0, o.iters = 3;
  assert_int_equal(cli_bench_run(&d, "run", call, NULL, &o, &r), 1);
  assert_string_equal(fk.log, expected_log(0, 3));
  assert_true(fabs(r.median_ms - 9) < 1e-6); /* calls 7-9: 9, 9, 4 */
  float odd[] = {3, 1, 2};
  assert_true(cli_bench_median(odd, 3) == 2);
}

/* A failing call or a failing allocation is said, and every event and the
 * flush buffer are released. */
static void test_failures_release_everything(void **state) {
  (void)state;
  static const double ms[] = {0.75};
  cli_bench_options o = {25, 100, -1, 0};
  cli_bench_result r;
  int fails[] = {1, 4, 20, 60};
  for (size_t i = 0; i < sizeof fails / sizeof fails[0]; i++) {
    fjr_driver d = fake_driver(ms, 1);
    fk.fail_call = fails[i];
    said[0] = '\0';
    assert_int_equal(cli_bench_run(&d, "run", call, NULL, &o, &r), 0);
    assert_non_null(strstr(said, "failed"));
    assert_int_equal(fk.live, 0);
    assert_true(fk.buf == 0);
  }
  fjr_driver d = fake_driver(ms, 1);
  fk.alloc_result = CUDA_ERROR_OUT_OF_MEMORY;
  assert_int_equal(cli_bench_run(&d, "run", call, NULL, &o, &r), 0);
  assert_non_null(strstr(said, "256 MiB"));
  assert_int_equal(fk.live, 0);
}

/* The method line names the rules and the counts' origin. */
static void test_describe(void **state) {
  (void)state;
  char line[512];
  cli_bench_options o = {25, 100, -1, 0};
  cli_bench_result r = {1.5, 16, 66, 1.2, 1.1, 1.4};
  cli_bench_describe(&o, &r, line, sizeof line);
  assert_non_null(strstr(line, "do_bench"));
  assert_non_null(strstr(line, "16 warm-up (25 ms)"));
  assert_non_null(strstr(line, "66 timed (100 ms)"));
  assert_non_null(strstr(line, "L2 flushed (256 MiB)"));
  o.warmup = 3, o.iters = 7;
  r.n_warmup = 3, r.n_repeat = 7;
  cli_bench_describe(&o, &r, line, sizeof line);
  assert_non_null(strstr(line, "3 warm-up (--warmup)"));
  assert_non_null(strstr(line, "7 timed (--iters)"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_follows_do_bench),
      cmocka_unit_test(test_counts_from_budgets),
      cmocka_unit_test(test_explicit_counts_and_median),
      cmocka_unit_test(test_failures_release_everything),
      cmocka_unit_test(test_describe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
