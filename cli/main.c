/*
 * cli/main.c: the `flexjit` command: dispatch to subcommands, --help and
 * --version (parsing helpers: cli/args.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"

static const char top_usage[] =
    "usage: flexjit SUBCOMMAND [options]\n"
    "\n"
    "JIT-compiled FlashAttention kernels for attention variants written as\n"
    "small Lua functions (FlexAttention-style mask_mod and score_mod).\n"
    "\n"
    "subcommands:\n"
    "  compile SPEC.lua   compile (or find cached) the forward kernel of a spec\n"
    "  run SPEC.lua       run the forward kernel on random or given inputs,\n"
    "                     optionally --check it against a float64 reference\n"
    "                     and --bench it\n"
    "  demo               with a GPU: run the causal and document examples with\n"
    "                     --check --bench; without one: compile and cache every\n"
    "                     example spec for sm_80 and sm_90a\n"
    "  precompile MANIFEST.lua --out DIR|FILE.fjpack [-j N]\n"
    "                     compile every kernel a manifest lists, into a cache\n"
    "                     directory or one pack file for deployment\n"
    "  cache ls|stats|verify|prune|clear|export\n"
    "                     inspect and maintain the on-disk kernel cache\n"
    "  mask SPEC.lua --q-len N [--svg FILE]\n"
    "                     draw a mask (elements or blocks) and its density, on\n"
    "                     the CPU\n"
    "\n"
    "options:\n"
    "  --help, -h         this text (also after each subcommand)\n"
    "  --version          print the version\n"
    "\n"
    "environment: FLEXJIT_CACHE_DIR (kernel cache root), FLEXJIT_CACHE_MAX_BYTES\n"
    "(evict least recently used kernels above this size), FLEXJIT_NVRTC (NVRTC\n"
    "library to load), FLEXJIT_TEMPLATE (sm80 or sm90: force a kernel template),\n"
    "FLEXJIT_DUMP_DIR (write compiled CUDA source there), FLEXJIT_KERNEL_DEFINES\n"
    "(\"NAME=VALUE ...\": optional template macros, e.g. FJ_PINGPONG=0),\n"
    "FLEXJIT_PERSISTENT (1 / 0: for / against the persistent sm90 kernel, the\n"
    "forward's default at head dim 128, the backward's but for packed batches),\n"
    "FLEXJIT_STAGES (2..9: the sm90 kernel's K/V pipeline depth, when it fits),\n"
    "FLEXJIT_CONSUMERS (2 or 3: the sm90 kernel's consumer warpgroups; 3, the\n"
    "default at head dim 64, only there),\n"
    "FLEXJIT_FAST_COMPILE (1: NVRTC --Ofast-compile=max; compiles about 3x\n"
    "faster, runs hundreds of times slower: for checking a spec on small sizes).\n";

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(top_usage, stderr);
    return CLI_USAGE;
  }
  const char *cmd = argv[1];
  if (cli_is_help(cmd)) {
    fputs(top_usage, stdout);
    return CLI_OK;
  }
  if (!strcmp(cmd, "--version")) {
    printf("flexjit %s\n", fj_version_string());
    return CLI_OK;
  }
  if (!strcmp(cmd, "compile")) return cmd_compile(argc - 1, argv + 1);
  if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
  if (!strcmp(cmd, "demo")) return cmd_demo(argc - 1, argv + 1);
  if (!strcmp(cmd, "precompile")) return fj_cli_precompile(argc - 1, argv + 1);
  if (!strcmp(cmd, "cache")) return fj_cli_cache(argc - 1, argv + 1);
  if (!strcmp(cmd, "mask")) return fj_cli_mask(argc - 1, argv + 1);
  cli_error(NULL,
            "unknown subcommand '%s' (compile, run, demo, precompile, cache, "
            "mask; see --help)",
            cmd);
  return CLI_USAGE;
}
