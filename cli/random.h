/*
 * cli/random.h: `flexjit run`'s random inputs: the generator (splitmix64)
 * and standard normal tensors, filled by several threads.
 */
#ifndef FJ_CLI_RANDOM_H
#define FJ_CLI_RANDOM_H

#include <stddef.h>
#include <stdint.h>

#include "flexjit.h"

/* The next value of the generator whose state is *state (splitmix64). */
uint64_t cli_splitmix64(uint64_t *state);

/* Values a block of cli_fill_normal: each block has a stream of its own. */
#define CLI_NORMAL_BLOCK 65536

/* n standard normal values (Box-Muller), each rounded to dtype, into x.
 * Block i (CLI_NORMAL_BLOCK values) draws from a generator seeded by seed
 * and i, so the values depend on seed alone, whatever the number of
 * threads: up to `threads` of them (0: one a processor, at most 16) share
 * the blocks. A large input (268 million values for q, k, v and dO at
 * 2 x 16 x 16384 x 128) took seconds on one thread. */
void cli_fill_normal(float *x, size_t n, uint64_t seed, fj_dtype dtype, int threads);

#endif /* FJ_CLI_RANDOM_H */
