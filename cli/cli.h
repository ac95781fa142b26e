/*
 * cli/cli.h: what the files of the `flexjit` command share.
 *
 * Exit statuses: 0 success; 1 failure (a spec or runtime error, or --check
 * FAIL); 2 usage error or no GPU where one is needed.
 */
#ifndef FJ_CLI_H
#define FJ_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "cli/npy.h"
#include "flexjit.h"
#include "gen/graph.h"

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

#define CLI_MAX_VALUES FJG_MAX_ARGS /* --param and --buffer: a spec's most */
#define CLI_MAX_PACKS 16 /* what a context mounts at most */

/* Prints "flexjit: <msg>" (or "flexjit CMD: <msg>") to stderr. */
void cli_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A log callback (fj_log_fn) for the library's contexts and stores: prints
 * warnings and errors as "flexjit CMD: warning: ..." on stderr; cmd (a
 * string, or NULL) names the subcommand. */
void cli_log(void *cmd, fj_log_level level, const char *msg);

/* Checks, before any work, that dir can receive output: it is a writable
 * folder, or it does not exist and the nearest existing folder above it is
 * writable (with parents; without, only dir itself may be missing). 0, or -1
 * with a message naming the path and the reason in err. */
int cli_check_output_dir(const char *dir, int parents, char *err,
                         size_t errlen);

/* Strict number parsing: the whole string must be a number in range. */
int cli_parse_int(const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *s, double *out);

/* Option matching: "--name VALUE" or "--name=VALUE". Returns 1 and sets
 * *value (advancing *i past a separate value) when argv[*i] is --name; -1
 * when it is --name without a value; 0 otherwise. */
int cli_opt_value(int argc, char **argv, int *i, const char *name,
                  const char **value);
int cli_is_help(const char *arg);
/* "bf16" / "fp16" (also "bfloat16", "f16", "float16"). */
int cli_parse_dtype(const char *s, fj_dtype *out);

/* Splits "NAME=VALUE" into name (copied, at most namelen) and value. */
int cli_split_assign(const char *s, char *name, size_t namelen,
                     const char **value);

/* A runtime value for a spec, before it is checked against the spec. */
typedef struct cli_value {
  char name[64];
  const char *text;  /* --param: the value as typed */
  npy_array buffer;  /* --buffer: host data (owned) */
  int is_buffer;
} cli_value;

/* What `run` does; filled from argv or by `demo`. */
typedef struct run_config {
  const char *spec_path;
  const char *cache_dir; /* NULL: default */
  const char *arch;      /* NULL: the device's */
  int B, Hq, Hkv, Lq, Lk, D;
  fj_dtype dtype;
  int bshd; /* layout: 0 BHSD, 1 BSHD */
  double scale; /* 0: 1/sqrt(D) */
  cli_value values[CLI_MAX_VALUES];
  int num_values;
  const char *inputs_dir, *dump_dir;
  const char *packs[CLI_MAX_PACKS]; /* --pack FILE, mounted in order */
  int num_packs;
  int check, bench;
  int backward; /* --backward: also the gradients (fj_attention_backward) */
  int deterministic; /* --deterministic: the backward's deterministic mode */
  /* --bench by triton.testing.do_bench's rules (cli/bench.h): warm-up and
   * timed calls from time budgets, unless --warmup (>= 0) or --iters (> 0)
   * give the counts. */
  double warmup_ms, rep_ms;
  int warmup, iters;
  uint64_t seed;
  int quiet; /* demo: fewer lines */
  /* --block-mask: build a block mask and launch with it. Auto (0, the
   * default): when the mask reads buffers (not index-only). */
  enum { CLI_BM_AUTO = 0, CLI_BM_ON = 1, CLI_BM_OFF = 2 } block_mask;
  /* Serving layouts (cli/run_serving.h builds them; docs/serving.md):
   * --page-size: K/V in page pools with a shuffled block table (0: off);
   * --seqlens-k: per-sequence kv lengths, CLI_SEQLENS_RANDOM or a length
   * (0: none; with --page-size every sequence is kv-len long); --varlen:
   * a packed batch of varlen_n sequences of random lengths, or of the
   * lengths read from a .npy (varlen_lens, owned; varlen_n its count). */
  int page_size;
  int seqlens_k;
  int varlen_n;
  npy_array varlen_lens;
  const char *varlen_text; /* --varlen as typed, for messages */
  /* --skip-softmax: fj_forward_args.skip_softmax_threshold (0: exact). */
  double skip_softmax;
  /* --q-offset, --kv-offset: fj_forward_args.q_offset, kv_offset. */
  int q_offset, kv_offset;
} run_config;

/* run_config.seqlens_k: each sequence's kv length drawn in [1, Lk]. */
#define CLI_SEQLENS_RANDOM (-1)

/* Defaults: B 1, D 128, bf16, BHSD; --bench with do_bench's budgets, 25 ms
 * of warm-up and 100 ms of timed calls. */
void cli_run_config_init(run_config *c);

/* Executes a run. Returns an exit status. */
int cli_run(const run_config *cfg);
void cli_values_free(cli_value *v, int n);

int cmd_compile(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_demo(int argc, char **argv);

/* Mounts --pack files on ctx; an exit status, or -1 when all mounted. */
int cli_mount_packs(fj_context *ctx, const char *cmd, const char *const *packs,
                    int n);

/* Compiles (or finds cached) the forward kernel of one spec for one target
 * and prints a summary; used by `compile` and `demo`. Returns an exit
 * status; *from_cache and *ms say what happened. */
int cli_compile_one(fj_context *ctx, const fj_spec *spec, const char *path,
                    const fj_kernel_options *opts, int verbose,
                    int *from_cache, double *ms);

#endif /* FJ_CLI_H */
