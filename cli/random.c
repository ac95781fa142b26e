/*
 * cli/random.c: `flexjit run`'s random inputs (see cli/random.h).
 */
#include "cli/random.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "gen/reference.h"

#define MAX_THREADS 16

uint64_t cli_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

typedef struct {
  float *x;
  size_t n, blocks; /* values, and blocks of CLI_NORMAL_BLOCK of them */
  uint64_t seed;
  fj_dtype dtype;
  atomic_size_t next; /* the next block to fill */
} fill_job;

/* Block i: its own stream, seeded by the job's seed and i. */
static void fill_block(const fill_job *j, size_t i) {
  uint64_t st = j->seed ^ (i * 0xd1b54a32d192ed03ull);
  const size_t lo = i * CLI_NORMAL_BLOCK;
  const size_t hi = lo + CLI_NORMAL_BLOCK < j->n ? lo + CLI_NORMAL_BLOCK : j->n;
  for (size_t k = lo; k < hi; k += 2) {
    const double u = ((cli_splitmix64(&st) >> 11) + 0.5) * 0x1p-53;
    const double v = ((cli_splitmix64(&st) >> 11) + 0.5) * 0x1p-53;
    const double r = sqrt(-2.0 * log(u));
    j->x[k] = fjg_round_to_dtype((float)(r * cos(6.283185307179586 * v)), j->dtype);
    if (k + 1 < hi)
      j->x[k + 1] = fjg_round_to_dtype((float)(r * sin(6.283185307179586 * v)), j->dtype);
  }
}

static void *fill_worker(void *arg) {
  fill_job *j = arg;
  for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->blocks;) fill_block(j, i);
  return NULL;
}

void cli_fill_normal(float *x, size_t n, uint64_t seed, fj_dtype dtype, int threads) {
  fill_job j = {.x = x,
                .n = n,
                .blocks = (n + CLI_NORMAL_BLOCK - 1) / CLI_NORMAL_BLOCK,
                .seed = seed,
                .dtype = dtype};
  atomic_init(&j.next, 0);
  long want = threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN);
  if (want > MAX_THREADS) want = MAX_THREADS;
  if ((size_t)want > j.blocks) want = (long)j.blocks;
  /* The calling thread fills blocks too, so a failed pthread_create only
   * costs time. */
  pthread_t tid[MAX_THREADS];
  int started = 0;
  for (long t = 1; t < want; t++) {
    if (pthread_create(&tid[started], NULL, fill_worker, &j) != 0) break;
    started++;
  }
  fill_worker(&j);
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
}
