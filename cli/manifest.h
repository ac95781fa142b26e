/*
 * cli/manifest.h: the precompile manifest, a Lua file returning a table:
 *
 *   return {
 *     specs = {"causal.lua", "document.lua"},  -- relative to this file
 *     head_dims = {64, 128},
 *     dtypes = {"bf16", "fp16"},
 *     archs = {"sm_80", "sm_90a"},
 *     passes = {"forward"},                    -- optional, the default
 *   }
 *
 * It runs in a sandbox like the one specs run in (base, string, table and
 * math only, bounded memory and instructions), so a manifest may compute
 * its lists but cannot touch the file system. Unknown fields are an error
 * (a typo such as "head_dim" must not silently compile nothing).
 */
#ifndef CLI_MANIFEST_H
#define CLI_MANIFEST_H

#include <stddef.h>

#include "flexjit.h"

typedef struct cli_manifest {
  char **specs; /* paths resolved against the manifest's directory */
  int n_specs;
  int *head_dims;
  int n_head_dims;
  fj_dtype *dtypes;
  int n_dtypes;
  char **archs;
  int n_archs;
  char **passes;
  int n_passes;
} cli_manifest;

/* Loads and checks the manifest at path into *m (zeroed first). Returns 0,
 * or -1 with a message naming the file (and line, for Lua errors) in err;
 * *m is then empty. Free with cli_manifest_free either way. */
int cli_manifest_load(const char *path, cli_manifest *m, char *err,
                      size_t errlen);
void cli_manifest_free(cli_manifest *m);

/* "bf16" / "fp16" (and "bfloat16", "f16", "float16"); -1 otherwise. */
int cli_manifest_dtype(const char *name, fj_dtype *out);
const char *cli_manifest_dtype_name(fj_dtype d);

#endif /* CLI_MANIFEST_H */
