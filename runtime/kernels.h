/*
 * runtime/kernels.h: the one path from a kernel's configuration to a loaded
 * kernel, shared by every kernel kind (the forward, the block-mask builder,
 * and the kinds to come).
 *
 * A kind says how its translation unit is emitted and which entry points it
 * has; the caller decides the configuration (gen/config.h) once, and this
 * module does the rest, in this order:
 *   1. the spec's in-process table, by (kind, configuration): a hit costs a
 *      short list walk and a few compares, no hashing, no I/O;
 *   2. the translation unit: the kind's emitter writes the body from the
 *      graph and the configuration; the source key is XXH3-128 over the
 *      library version, the kind, the target, every NVRTC option and every
 *      byte of the body, and the full key adds the NVRTC version. The body
 *      is compiled behind a two-line banner naming the source key, which is
 *      a function of the body, so the key covers every byte NVRTC reads.
 *      Only the graph reaches the body: no text of the spec does;
 *   3. the mounted packs (by full key, or by source key without NVRTC);
 *   4. the disk store (the same; by source key through the store's alias),
 *      then, with NVRTC, under the store's
 *      per-key lock: the store again, NVRTC (a second compile with the
 *      configuration's spill fallback when ptxas reports spills; the cubin
 *      that spills less is kept), the store's put, and pruning when the
 *      context has a size limit.
 * Loading the module (fjr_kernel_load) is separate: compiling needs no GPU.
 */
#ifndef FJR_KERNELS_H
#define FJR_KERNELS_H

#include <cuda.h>

#include "cache/key.h"
#include "flexjit.h"
#include "gen/config.h"
#include "gen/graph.h"

enum { FJR_MAX_ENTRIES = 4 };

typedef struct fjr_kernel_kind {
  const char *pass; /* "forward", "blockmask": in the key, banner and name */
  /* Writes the translation unit's body (no banner) for g and cfg. */
  fj_status (*emit)(const fjg_graph *g, const fjg_config *cfg, fjg_buf *out);
  /* The readable kernel name from the spec's name (already reduced to
   * [A-Za-z0-9_], at most 47 bytes) and the configuration. */
  void (*name)(const char *spec, const fjg_config *cfg, char *buf, size_t n);
  const char *entries[FJR_MAX_ENTRIES]; /* entry points; the first is the main one */
  int num_entries;
  /* 1: compiled with the context's template options ($FLEXJIT_KERNEL_DEFINES,
   * fast compile) and ptxas's resource report; 0: the base options only. */
  int tuned;
} fjr_kernel_kind;

/* A kernel resident in this process, bound to a spec. */
typedef struct fjr_kernel {
  const fjr_kernel_kind *kind;
  fjg_config cfg;
  fjc_key source_key; /* everything but the NVRTC version */
  fjc_key key;        /* source key + NVRTC version */
  char name[96];
  char path[1024];    /* the cache file or pack it came from; "" otherwise */
  int from_cache;     /* 1: NVRTC was not called */
  double compile_ms;
  void *cubin;        /* owned until loaded */
  size_t cubin_size;
  CUmodule module;    /* NULL until loaded */
  CUfunction fn[FJR_MAX_ENTRIES];
  /* CTAs of fn[0] one multiprocessor holds (the decode launch's split
   * choice), 0 until asked (fjr_kernel_occupancy). */
  int occupancy;
  struct fjr_kernel *next;
} fjr_kernel;

/* The kernel of (kind, cfg) for spec: from its table, else made as above
 * and added to it. The returned kernel lives with the spec. *resident (may
 * be NULL) is 1 when it was in the table already. */
fj_status fjr_kernel_get(fj_context *ctx, fj_spec *spec,
                         const fjr_kernel_kind *kind, const fjg_config *cfg,
                         fjr_kernel **out, int *resident);

/* The translation unit that fjr_kernel_get compiles for (kind, cfg),
 * banner included, NUL-terminated (out->len counts the NUL), and its
 * source key. */
fj_status fjr_kernel_source(fj_context *ctx, const fj_spec *spec,
                            const fjr_kernel_kind *kind, const fjg_config *cfg,
                            fjg_buf *out, fjc_key *source_key);

/* Loads k's module on the context's device (once), resolves its entry
 * points and opts its main entry in to cfg.smem_bytes of dynamic shared
 * memory, refusing a kernel whose dynamic plus static shared memory the
 * device cannot give. The cubin is freed afterwards (the driver keeps a
 * copy). */
fj_status fjr_kernel_load(fj_context *ctx, fjr_kernel *k);
/* CTAs of the loaded k's main entry that one multiprocessor holds at its
 * launch shape (threads, dynamic shared memory), asked once; 1 when the
 * driver cannot say. */
int fjr_kernel_occupancy(fj_context *ctx, fjr_kernel *k);

/* Fills info from k; a resident kernel (found in the table) counts as
 * from the cache, with no compile time. */
void fjr_kernel_info(const fjr_kernel *k, int resident, fj_kernel_info *info);

/* The grid of a kernel whose work items are (tile, head, batch) triples:
 * (tiles, heads, B), one CTA an item, or for a persistent kernel
 * (cfg->persistent: each CTA loops over items) (min(num_sms, items), 1, 1).
 * The forward's tiles are query blocks of its heads, the backward's kv
 * blocks of its kv heads. Returns the number of items. */
int64_t fjr_kernel_grid(const fjg_config *cfg, int num_sms, int64_t tiles, int64_t heads,
                        int64_t B, unsigned grid[3]);

/* Launches entry `entry` of the loaded kernel k on grid x threads with smem
 * bytes of dynamic shared memory on stream, its parameters as
 * cuLaunchKernel's kernel_params or extra take them. after_kernel: the
 * launch follows another kernel of ours on the stream, whose writes the
 * entry waits for where it needs them (fj_grid_dep_wait,
 * templates/common/ptx.cuh); on sm_90 and newer, where kernels have that
 * wait, it is then a programmatic dependent launch, which may start while
 * that kernel ends. A failure is recorded in ctx with `what`. */
fj_status fjr_launch(fj_context *ctx, const fjr_kernel *k, int entry, const unsigned grid[3],
                     unsigned threads, unsigned smem, CUstream stream, void **kernel_params,
                     void **extra, int after_kernel, const char *what);

/* Unloads and frees a spec's table. */
void fjr_kernels_release(fj_context *ctx, fjr_kernel *list);

#endif /* FJR_KERNELS_H */
