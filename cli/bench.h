/*
 * cli/bench.h: timing a GPU call by the rules of triton.testing.do_bench,
 * so that `flexjit run --bench` and the PyTorch baselines of
 * bench/compare.py are measured with the same timer and the same L2 policy
 * (docs/benchmarking.md):
 *
 *   1. one call, then a device synchronization;
 *   2. a 256 MiB flush buffer is allocated;
 *   3. estimate: an event, 5 x (zero the flush buffer, call), an event, a
 *      synchronization; estimate_ms = elapsed / 5 (flushes included);
 *   4. n_warmup = max(1, floor(warmup_ms / estimate_ms)),
 *      n_repeat = max(1, floor(rep_ms / estimate_ms));
 *   5. n_warmup calls, no flush, no timing;
 *   6. n_repeat x (zero the flush buffer, event, call, event), all queued
 *      without a synchronization between them;
 *   7. one synchronization; the result is the median of the n_repeat
 *      elapsed times (of an even count, the mean of the two middle ones).
 *
 * Everything goes to the null stream. Zeroing the buffer writes 256 MiB
 * through the L2 (an H200 has 50 MB), so every timed call starts with
 * none of its inputs or outputs in L2.
 */
#ifndef FJ_CLI_BENCH_H
#define FJ_CLI_BENCH_H

#include "runtime/driver.h"

#define CLI_BENCH_FLUSH_BYTES ((size_t)256 << 20)
#define CLI_BENCH_ESTIMATE_CALLS 5
/* A bound on either count, against a zero or absurdly small estimate; a
 * 256 MiB flush alone takes tens of microseconds, so the counts the
 * budgets give stay far below it. */
#define CLI_BENCH_MAX_COUNT 100000

typedef struct cli_bench_options {
  double warmup_ms; /* do_bench's warmup (25) */
  double rep_ms;    /* do_bench's rep (100) */
  int warmup;       /* >= 0: exactly this many warm-up calls (--warmup) */
  int iters;        /* > 0: exactly this many timed calls (--iters) */
} cli_bench_options;

typedef struct cli_bench_result {
  double estimate_ms; /* per call, flush included */
  int n_warmup, n_repeat;
  double median_ms, min_ms, max_ms;
} cli_bench_result;

/* Queues one call on the null stream; 1 on success, 0 after saying why
 * (through cli_error). */
typedef int (*cli_bench_fn)(void *arg);

/* max(1, floor(budget_ms / estimate_ms)), at most CLI_BENCH_MAX_COUNT
 * (also for a zero or non-finite estimate). */
int cli_bench_count(double budget_ms, double estimate_ms);

/* Sorts ms[0..n) and returns its median (n odd: the middle value; n even:
 * the mean of the two middle ones, as Python's statistics.median). n > 0. */
double cli_bench_median(float *ms, int n);

/* Times fn(arg) by the rules above with the driver d. Returns 1 and fills
 * *r, or 0 after an error was printed (cmd names the subcommand). Every
 * event and the flush buffer are released on every path. */
int cli_bench_run(const fjr_driver *d, const char *cmd, cli_bench_fn fn,
                  void *arg, const cli_bench_options *o, cli_bench_result *r);

/* "do_bench rules: L2 flushed (256 MiB) before each of N timed calls, ..."
 * (one line, no newline) for the output of `run --bench`. */
void cli_bench_describe(const cli_bench_options *o, const cli_bench_result *r,
                        char *buf, size_t len);

#endif /* FJ_CLI_BENCH_H */
