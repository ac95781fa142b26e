/*
 * cli/run_args.c: `flexjit run SPEC.lua [options]`: the command line, turned
 * into a run_config for cli_run (cli/run.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char run_usage[] =
    "usage: flexjit run SPEC.lua --heads H --q-len Lq [options]\n"
    "\n"
    "Runs the forward kernel of SPEC.lua on the GPU. q, k and v are random\n"
    "normal values (or read from --inputs); o and lse are poisoned with NaN\n"
    "before the launch that --check and --dump read.\n"
    "\n"
    "sizes:\n"
    "  --batch B           batch size (default 1)\n"
    "  --heads H           query heads\n"
    "  --kv-heads Hkv      key/value heads, dividing H (default H; GQA/MQA)\n"
    "  --q-len Lq          query length\n"
    "  --kv-len Lk         key/value length (default Lq)\n"
    "  --head-dim D        64, 128, or 256 (sm_90a only; default 128)\n"
    "  --dtype T           bf16 or fp16 (default bf16)\n"
    "  --layout L          bhsd (default) or bshd (a strided [B, S, H, D] view)\n"
    "  --scale S           softmax scale (default 1/sqrt(D))\n"
    "runtime values the spec declares:\n"
    "  --param NAME=VALUE  a param(NAME, \"i32\"|\"f32\") value\n"
    "  --buffer NAME=FILE.npy\n"
    "                      a buffer(NAME, dtype): 1-D int32 or float32 .npy;\n"
    "                      one not given is generated (max(Lq, Lk) values:\n"
    "                      i32 as document ids, f32 standard normal)\n"
    "tensors:\n"
    "  --inputs DIR        read DIR/q.npy, k.npy, v.npy (float32, [B, H, L, D])\n"
    "  --dump DIR          write q, k, v, o, lse to DIR as float32 .npy\n"
    "  --seed N            random seed (default 0) of what is generated: q, k, v\n"
    "                      and dO standard normal, the same for a seed on any\n"
    "                      machine\n"
    "serving layouts (docs/serving.md; --check compares each sequence with\n"
    "its own float64 reference, at its own lengths):\n"
    "  --q-len 1..16       (no option) runs the decode kernel; with --kv-len\n"
    "                      longer, the spec aligns the queries (e.g.\n"
    "                      causal{align = \"bottom_right\"})\n"
    "  --page-size N       K and V in page pools [num_pages, N, Hkv, D]\n"
    "                      (N 16..256, a multiple of 16) read through a block\n"
    "                      table of shuffled pages (--seed); each sequence's\n"
    "                      kv length is passed as seqlens_k\n"
    "  --seqlens-k L       per-sequence kv lengths: 'random' (each drawn in\n"
    "                      [1, Lk], --seed) or one length L <= Lk (default:\n"
    "                      Lk); contiguous K/V, or paged with --page-size\n"
    "  --varlen N|FILE.npy a packed batch (cu_seqlens): N sequences of random\n"
    "                      lengths (--seed; each >= 1, not all equal) or the\n"
    "                      lengths in a 1-D int32 .npy, summing to B*Lq query\n"
    "                      tokens; each sequence's kv length is its query\n"
    "                      length + (Lk - Lq), so its queries are its last\n"
    "                      keys (Lk >= Lq). q and o are [B*Lq, Hq, D], k and v\n"
    "                      [total_k, Hkv, D] (or pools with --page-size), lse\n"
    "                      [Hq, B*Lq]; --inputs and --dump use these shapes\n"
    "  --q-offset N, --kv-offset N\n"
    "                      positions of q's and k's first rows in a whole\n"
    "                      sequence (a context parallel shard): the spec\n"
    "                      sees q + N and kv + N (docs/context_parallel.md),\n"
    "                      and so does the block mask; not with --varlen or\n"
    "                      a spec that reads Lq or Lk\n"
    "  --skip-softmax T    Skip Softmax threshold, 0 <= T < 1 (0: exact).\n"
    "                      --check then reports the error against exact\n"
    "                      attention (float64) and fails only on NaN/Inf or\n"
    "                      a wrong fully masked row\n"
    "what to do:\n"
    "  --check             compare with a float64 CPU reference; the kernel\n"
    "                      passes when its error is at most 2x that of the\n"
    "                      same computation in the input dtype, plus a floor\n"
    "                      (exit status 1 on FAIL). The reference runs on\n"
    "                      the CPU (all cores): keep B*H*Lq*Lk moderate\n"
    "  --bench             time launches by triton.testing.do_bench's rules,\n"
    "                      as bench/compare.py times PyTorch\n"
    "                      (docs/benchmarking.md): a launch and a sync;\n"
    "                      estimate = the time of 5 launches, each after\n"
    "                      zeroing a 256 MiB buffer (an L2 flush), / 5; then\n"
    "                      max(1, floor(WARMUP_MS / estimate)) warm-up\n"
    "                      launches and max(1, floor(REP_MS / estimate))\n"
    "                      timed ones, each after an L2 flush and between\n"
    "                      its own two CUDA events, no sync until the last;\n"
    "                      prints their median (min, max). Outputs are not\n"
    "                      poisoned while timing. TFLOP/s counts\n"
    "                      4*D*(allowed (b, h, q, kv) pairs); at --q-len <=\n"
    "                      16 also TB/s of K and V read: each sequence's kv\n"
    "                      positions that some query of it attends, x Hkv x\n"
    "                      D x 2 (K and V) x 2 bytes\n"
    "  --backward          also run the backward pass on a random dO: with\n"
    "                      --check its dq, dk, dv and trainable buffers'\n"
    "                      gradients against the float64 reference (3x the\n"
    "                      input dtype's error, plus a floor); with --bench\n"
    "                      the backward and forward + backward times, by the\n"
    "                      same rules (TFLOP/s: 2.5x and 3.5x the forward's).\n"
    "                      With --varlen the backward gets the packed batch\n"
    "                      (dO and dq packed as q, dk and dv as k) and\n"
    "                      cu_seqlens; --check compares each sequence with\n"
    "                      its own reference (buffer gradients summed over\n"
    "                      the sequences), --bench counts each sequence's\n"
    "                      pairs. --page-size, --seqlens-k and --skip-softmax\n"
    "                      are inference-only: refused with --backward\n"
    "  --deterministic     with --backward: its deterministic mode (dq added\n"
    "                      in a fixed order); with --check it also runs the\n"
    "                      backward a second time and requires dq, dk and dv\n"
    "                      bitwise equal to the first run's\n"
    "  --block-mask M      auto (default), on or off: build a block mask on\n"
    "                      the GPU and launch with it; auto does when the\n"
    "                      mask reads buffers (document ids). --bench also\n"
    "                      times rebuilding it, by the same rules\n"
    "  --warmup-ms MS      WARMUP_MS (default 25, do_bench's warmup)\n"
    "  --rep-ms MS         REP_MS (default 100, do_bench's rep)\n"
    "  --warmup N          exactly N warm-up launches (0 allowed), instead\n"
    "                      of the count WARMUP_MS gives\n"
    "  --iters N           exactly N timed launches, instead of the count\n"
    "                      REP_MS gives\n"
    "other:\n"
    "  --arch ARCH         compile for ARCH instead of the GPU's own target\n"
    "  --cache-dir DIR     kernel cache root\n"
    "  --pack FILE         mount a .fjpack (flexjit precompile); searched\n"
    "                      before the cache, in the order given (repeatable)\n"
    "  --help              this text\n"
    "\n"
    "Every option and input file is checked before the GPU is looked for.\n"
    "Exit status: 0 ok, 1 failure or --check FAIL, 2 usage error or no GPU.\n";

void cli_values_free(cli_value *v, int n) {
  for (int i = 0; i < n; i++) npy_free(&v[i].buffer);
}

/* --param NAME=VALUE or --buffer NAME=FILE.npy (read now). */
static int add_value(run_config *c, const char *text, int is_buffer) {
  const char *opt = is_buffer ? "--buffer" : "--param", *val;
  char err[512];
  if (c->num_values == CLI_MAX_VALUES) {
    cli_error("run", "too many --param/--buffer values (at most %d)",
              CLI_MAX_VALUES);
    return CLI_USAGE;
  }
  cli_value *v = &c->values[c->num_values];
  memset(v, 0, sizeof *v);
  if (cli_split_assign(text, v->name, sizeof v->name, &val) != 0) {
    cli_error("run", "%s '%s': expected NAME=%s", opt, text,
              is_buffer ? "FILE.npy" : "VALUE");
    return CLI_USAGE;
  }
  for (int i = 0; i < c->num_values; i++)
    if (!strcmp(c->values[i].name, v->name)) {
      cli_error("run", "'%s' given twice", v->name);
      return CLI_USAGE;
    }
  v->text = val;
  v->is_buffer = is_buffer;
  if (is_buffer && npy_read(val, &v->buffer, err, sizeof err) != 0) {
    cli_error("run", "--buffer %s: %s", v->name, err);
    return CLI_FAIL;
  }
  c->num_values++;
  return -1;
}

static int int_opt(const char *name, const char *v, long lo, long hi,
                   int *out) {
  long x;
  if (cli_parse_int(v, lo, hi, &x) != 0) {
    cli_error("run", "%s: '%s' is not an integer in [%ld, %ld]", name, v, lo,
              hi);
    return CLI_USAGE;
  }
  *out = (int)x;
  return -1;
}

/* A time budget of --bench: positive and finite, at most a minute. */
static int ms_opt(const char *name, const char *v, double *out) {
  if (cli_parse_float(v, out) == 0 && *out > 0 && *out <= 60000) return -1;
  cli_error("run", "%s: '%s' is not a time in milliseconds in (0, 60000]",
            name, v);
  return CLI_USAGE;
}

/* --varlen N (a count of random lengths) or --varlen FILE.npy (the
 * lengths: 1-D int32, each >= 1), read now. */
static int varlen_opt(run_config *c, const char *v) {
  char err[512];
  long n;
  c->varlen_text = v;
  npy_free(&c->varlen_lens);
  c->varlen_n = 0;
  if (cli_parse_int(v, 1, 65535, &n) == 0) {
    c->varlen_n = (int)n;
    return -1;
  }
  if (v[0] >= '0' && v[0] <= '9' && cli_parse_int(v, 0, 1L << 62, &n) == 0) {
    cli_error("run", "--varlen: %s sequences: give 1 to 65535", v);
    return CLI_USAGE;
  }
  if (npy_read(v, &c->varlen_lens, err, sizeof err) != 0) {
    cli_error("run", "--varlen: '%s' is not a count of sequences (1 to 65535) "
              "and not a readable .npy: %s", v, err);
    return CLI_USAGE;
  }
  const npy_array *a = &c->varlen_lens;
  if (a->dtype != NPY_I32 || a->ndim != 1 || a->count < 1 || a->count > 65535) {
    cli_error("run", "--varlen %s: the lengths must be a 1-D int32 .npy of 1 to "
              "65535 values (it holds '%s', %d dimensions, %zu values)",
              v, npy_dtype_descr(a->dtype), a->ndim, a->count);
    return CLI_USAGE;
  }
  const int32_t *len = a->data;
  for (size_t i = 0; i < a->count; i++)
    if (len[i] < 1) {
      cli_error("run", "--varlen %s: sequence %zu has length %d (each must be "
                ">= 1)", v, i, (int)len[i]);
      return CLI_USAGE;
    }
  c->varlen_n = (int)a->count;
  return -1;
}

/* One option that takes a value; -1 to go on, else an exit status. */
static int value_opt(run_config *c, const char *name, const char *v) {
  const long big = 1L << 30;
  if (!strcmp(name, "--batch")) return int_opt(name, v, 1, 65535, &c->B);
  if (!strcmp(name, "--heads")) return int_opt(name, v, 1, 65535, &c->Hq);
  if (!strcmp(name, "--kv-heads")) return int_opt(name, v, 1, 65535, &c->Hkv);
  if (!strcmp(name, "--q-len")) return int_opt(name, v, 1, big, &c->Lq);
  if (!strcmp(name, "--kv-len")) return int_opt(name, v, 1, big, &c->Lk);
  if (!strcmp(name, "--head-dim")) return int_opt(name, v, 1, 4096, &c->D);
  if (!strcmp(name, "--iters")) return int_opt(name, v, 1, 100000, &c->iters);
  if (!strcmp(name, "--warmup"))
    return int_opt(name, v, 0, 100000, &c->warmup);
  if (!strcmp(name, "--warmup-ms")) return ms_opt(name, v, &c->warmup_ms);
  if (!strcmp(name, "--rep-ms")) return ms_opt(name, v, &c->rep_ms);
  if (!strcmp(name, "--seed")) {
    int s = 0;
    int rc = int_opt(name, v, 0, 0x7fffffff, &s);
    c->seed = (uint64_t)s;
    return rc;
  }
  if (!strcmp(name, "--scale")) {
    if (cli_parse_float(v, &c->scale) == 0 && c->scale > 0) return -1;
    cli_error("run", "--scale: '%s' is not a positive number", v);
    return CLI_USAGE;
  }
  if (!strcmp(name, "--dtype")) {
    if (cli_parse_dtype(v, &c->dtype) == 0) return -1;
    cli_error("run", "--dtype: '%s' is not bf16 or fp16", v);
    return CLI_USAGE;
  }
  if (!strcmp(name, "--layout")) {
    if (!strcmp(v, "bhsd") || !strcmp(v, "bshd")) {
      c->bshd = !strcmp(v, "bshd");
      return -1;
    }
    cli_error("run", "--layout: '%s' is not bhsd or bshd", v);
    return CLI_USAGE;
  }
  if (!strcmp(name, "--block-mask")) {
    if (!strcmp(v, "auto") || !strcmp(v, "on") || !strcmp(v, "off")) {
      c->block_mask = !strcmp(v, "on")    ? CLI_BM_ON
                      : !strcmp(v, "off") ? CLI_BM_OFF
                                          : CLI_BM_AUTO;
      return -1;
    }
    cli_error("run", "--block-mask: '%s' is not auto, on or off", v);
    return CLI_USAGE;
  }
  if (!strcmp(name, "--page-size"))
    return int_opt(name, v, 16, 256, &c->page_size);
  if (!strcmp(name, "--seqlens-k")) {
    if (!strcmp(v, "random")) return c->seqlens_k = CLI_SEQLENS_RANDOM, -1;
    long x;
    if (cli_parse_int(v, 1, 1L << 30, &x) == 0) return c->seqlens_k = (int)x, -1;
    cli_error("run", "--seqlens-k: '%s' is not 'random' or a length in [1, 2^30]", v);
    return CLI_USAGE;
  }
  if (!strcmp(name, "--varlen")) return varlen_opt(c, v);
  if (!strcmp(name, "--q-offset")) return int_opt(name, v, 0, 1L << 30, &c->q_offset);
  if (!strcmp(name, "--kv-offset")) return int_opt(name, v, 0, 1L << 30, &c->kv_offset);
  if (!strcmp(name, "--skip-softmax")) {
    if (cli_parse_float(v, &c->skip_softmax) == 0 && c->skip_softmax >= 0 &&
        c->skip_softmax < 1)
      return -1;
    cli_error("run", "--skip-softmax: '%s' is not a threshold in [0, 1)", v);
    return CLI_USAGE;
  }
  if (!strcmp(name, "--param")) return add_value(c, v, 0);
  if (!strcmp(name, "--buffer")) return add_value(c, v, 1);
  if (!strcmp(name, "--inputs")) c->inputs_dir = v;
  if (!strcmp(name, "--dump")) c->dump_dir = v;
  if (!strcmp(name, "--arch")) c->arch = v;
  if (!strcmp(name, "--cache-dir")) c->cache_dir = v;
  if (!strcmp(name, "--pack")) {
    if (c->num_packs == CLI_MAX_PACKS) {
      cli_error("run", "at most %d --pack files", CLI_MAX_PACKS);
      return CLI_USAGE;
    }
    c->packs[c->num_packs++] = v;
  }
  return -1;
}

static const char *const value_opts[] = {
    "--batch", "--heads",  "--kv-heads", "--q-len",  "--kv-len",
    "--head-dim", "--dtype", "--layout", "--scale",  "--param",
    "--buffer", "--inputs", "--dump",     "--iters",  "--warmup",
    "--warmup-ms", "--rep-ms", "--seed",  "--arch",   "--cache-dir",
    "--block-mask", "--pack", "--page-size", "--seqlens-k", "--varlen",
    "--skip-softmax", "--q-offset", "--kv-offset", NULL};

/* -1 to go on, else an exit status. */
static int parse_one(int argc, char **argv, int *i, run_config *c) {
  const char *a = argv[*i], *v;
  if (cli_is_help(a)) {
    fputs(run_usage, stdout);
    return CLI_OK;
  }
  if (!strcmp(a, "--check")) return c->check = 1, -1;
  if (!strcmp(a, "--bench")) return c->bench = 1, -1;
  if (!strcmp(a, "--backward")) return c->backward = 1, -1;
  if (!strcmp(a, "--deterministic")) return c->deterministic = 1, -1;
  for (int k = 0; value_opts[k]; k++) {
    int m = cli_opt_value(argc, argv, i, value_opts[k], &v);
    if (m < 0) {
      cli_error("run", "%s needs a value", a);
      return CLI_USAGE;
    }
    if (m > 0) return value_opt(c, value_opts[k], v);
  }
  if (a[0] == '-' && a[1]) {
    cli_error("run", "unknown option '%s' (see --help)", a);
    return CLI_USAGE;
  }
  if (c->spec_path) {
    cli_error("run", "more than one spec given ('%s', '%s')", c->spec_path, a);
    return CLI_USAGE;
  }
  c->spec_path = a;
  return -1;
}

/* The serving options against each other and the sizes. */
static int check_serving(run_config *c) {
  const int serving = c->page_size || c->seqlens_k || c->varlen_n;
  if (c->page_size % 16 != 0) {
    cli_error("run", "--page-size %d is not a multiple of 16", c->page_size);
    return CLI_USAGE;
  }
  if (c->seqlens_k > c->Lk) {
    cli_error("run", "--seqlens-k %d is longer than --kv-len %d", c->seqlens_k,
              c->Lk);
    return CLI_USAGE;
  }
  /* The backward takes packed batches (--varlen); the rest is inference. */
  if (c->backward && (c->page_size || c->seqlens_k || c->skip_softmax > 0)) {
    cli_error("run", "--backward with %s: %s is inference-only (the backward "
              "takes the contiguous layout or --varlen)",
              c->page_size ? "--page-size" : c->seqlens_k ? "--seqlens-k" : "--skip-softmax",
              c->page_size ? "paged KV" : c->seqlens_k ? "seqlens_k" : "Skip Softmax");
    return CLI_USAGE;
  }
  if ((c->q_offset || c->kv_offset) && c->varlen_n) {
    cli_error("run", "--q-offset/--kv-offset with --varlen: offsets apply to [B, H, L, D] "
              "shards (docs/context_parallel.md)");
    return CLI_USAGE;
  }
  if (serving && c->block_mask == CLI_BM_ON) {
    cli_error("run", "--block-mask on: a block mask covers one Lq x Lk grid; "
              "with --page-size, --seqlens-k or --varlen the kernel classifies "
              "tiles itself (use --block-mask auto or off)");
    return CLI_USAGE;
  }
  if (!c->varlen_n) return -1;
  if (c->seqlens_k) {
    cli_error("run", "--seqlens-k with --varlen: the kv lengths of a packed "
              "batch follow its query lengths (see --help)");
    return CLI_USAGE;
  }
  if (c->bshd) {
    cli_error("run", "--layout bshd with --varlen: a packed batch is [total, H, "
              "D] (--layout applies to the [B, H, L, D] tensors)");
    return CLI_USAGE;
  }
  if (c->Lk < c->Lq) {
    cli_error("run", "--varlen with --kv-len %d < --q-len %d: each sequence's "
              "kv length is its query length + (Lk - Lq), which must not be "
              "negative", c->Lk, c->Lq);
    return CLI_USAGE;
  }
  const int64_t total_q = (int64_t)c->B * c->Lq;
  const int64_t total_k = total_q + (int64_t)c->varlen_n * (c->Lk - c->Lq);
  if (total_k > INT32_MAX) {
    cli_error("run", "--varlen: %lld kv tokens in all do not fit cu_seqlens' "
              "int32", (long long)total_k);
    return CLI_USAGE;
  }
  if (c->varlen_lens.data) {
    const int32_t *len = c->varlen_lens.data;
    int64_t sum = 0;
    for (int i = 0; i < c->varlen_n; i++) sum += len[i];
    if (sum != total_q) {
      cli_error("run", "--varlen %s: the lengths sum to %lld, not --batch x "
                "--q-len = %lld", c->varlen_text, (long long)sum,
                (long long)total_q);
      return CLI_USAGE;
    }
  } else if (c->varlen_n > total_q) {
    cli_error("run", "--varlen %d: more sequences than the %lld query tokens "
              "(--batch x --q-len) to share", c->varlen_n, (long long)total_q);
    return CLI_USAGE;
  }
  return -1;
}

static int check_config(run_config *c) {
  if (!c->spec_path) {
    cli_error("run", "no spec given (usage: flexjit run SPEC.lua ...)");
    return CLI_USAGE;
  }
  if (!c->Hq || !c->Lq) {
    cli_error("run", "--heads and --q-len are required (see --help)");
    return CLI_USAGE;
  }
  if (c->deterministic && !c->backward) {
    cli_error("run", "--deterministic is a mode of the backward pass: add --backward");
    return CLI_USAGE;
  }
  if (!c->Hkv) c->Hkv = c->Hq;
  if (!c->Lk) c->Lk = c->Lq;
  if (c->Hq % c->Hkv != 0) {
    cli_error("run", "--heads %d is not a multiple of --kv-heads %d", c->Hq,
              c->Hkv);
    return CLI_USAGE;
  }
  return check_serving(c);
}

void cli_run_config_init(run_config *c) {
  memset(c, 0, sizeof *c);
  c->B = 1;
  c->D = 128;
  c->dtype = FJ_DTYPE_BF16;
  c->warmup_ms = 25;
  c->rep_ms = 100;
  c->warmup = -1; /* counts from the budgets */
  c->iters = 0;
}

int cmd_run(int argc, char **argv) {
  run_config c;
  int rc = -1;
  cli_run_config_init(&c);
  for (int i = 1; i < argc && rc < 0; i++) rc = parse_one(argc, argv, &i, &c);
  if (rc < 0) rc = check_config(&c);
  if (rc < 0) rc = cli_run(&c);
  cli_values_free(c.values, c.num_values);
  npy_free(&c.varlen_lens);
  return rc;
}
