/*
 * gen/config.h: kernel configuration, the decisions C makes for a template.
 *
 * A configuration is chosen from the head dim, the dtype and the target
 * architecture only (never from the spec), so every kernel of one
 * (head_dim, dtype, arch) shares it. The emitter writes it as the FJ_* macros
 * that templates/<template_name>/config.cuh lists at its top; the runtime
 * launches with grid (ceil(Lq / block_m), Hq, B), `threads` threads and
 * `smem_bytes` of dynamic shared memory. The backward pass has its own
 * configuration and launches (fjg_config_choose_backward, below).
 */
#ifndef FJG_CONFIG_H
#define FJG_CONFIG_H

#include <stddef.h>

#include "flexjit.h"

typedef struct fjg_config {
  int head_dim;   /* FJ_HEAD_DIM: 64, 128, or 256 (sm90 only) */
  fj_dtype dtype; /* FJ_DTYPE_BF16 or FJ_DTYPE_F16 */
  char arch[16];  /* target as given, e.g. "sm_90a" (NVRTC --gpu-architecture) */
  int sm;         /* its number: 80, 86, 89, 90, 100, 120 ... */
  int block_m;    /* FJ_BLOCK_M: query rows per CTA (grid.x = ceil(Lq / block_m)) */
  int block_n;    /* FJ_BLOCK_N: kv rows per shared-memory tile */
  int num_warps;  /* FJ_NUM_WARPS */
  int num_stages; /* FJ_NUM_STAGES: K/V tiles in shared memory (>= 2) */
  int threads;    /* num_warps * 32: the launch's block size */
  /* Dynamic shared memory of one CTA, exactly what the template uses:
   * (block_m + 2 * num_stages * block_n) * head_dim * 2 bytes. Above 48 KiB
   * the launcher must raise CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES. */
  int smem_bytes;
  /* Template folder under templates/ ("sm80" or "sm90"); a static string. */
  const char *template_name;
  /* 1 when the kernel takes a second parameter, the TMA tensor maps
   * (runtime/tma.h's fjr_tma_maps, built per launch with
   * fjr_tma_maps_build) and must be launched with kernelParams
   * {&params, &maps}; 0 for the single-parameter sm80 template. */
  int uses_tma;
  /* 1: the sm90 kernel is persistent (FJ_PERSISTENT): launched on grid
   * (min(SMs, ceil(Lq / block_m) * Hq * B), 1, 1), each CTA looping over
   * work items (the default at head dim 128; FLEXJIT_PERSISTENT=1 / =0
   * asks for / against it, see runtime/forward.c). 0: one CTA per query
   * block, grid as above. The sm90 backward: launched on grid (min(SMs,
   * ceil(Lk / block_n) * Hkv * B), 1, 1), each CTA looping over kv tiles
   * (the default but for packed batches; runtime/backward.c). */
  int persistent;
  /* sm90's Q tiles in shared memory (FJ_Q_BUFS), derived from persistent
   * and num_stages by the setters: 2 for the persistent kernel where they
   * fit (the next item's Q loads while the current one is read), else 1 (0
   * for the sm80 template). Counted in smem_bytes; not a key ingredient of
   * its own (persistent and num_stages are). */
  int q_bufs;
  /* An NVRTC option (a -D of the template, a static string) that makes the
   * kernel keep fewer registers live, or NULL: when ptxas reports spills the
   * runtime compiles again with it and keeps the cubin that spills less
   * (runtime/forward.c). sm90: "-DFJ_INTRA_WG_OVERLAP=0", persistent or
   * not. */
  const char *spill_fallback;
  /* Backward only: 1 is the deterministic variant (FJ_DETERMINISTIC, a
   * macro of the unit and so of its key: docs/backward.md), which adds dQ
   * in a fixed order; 0 otherwise and for every other kind. Set by
   * fjg_config_backward_variant. */
  int deterministic;
  /* 1 is the serving layouts' variant (FJ_VARLEN, a macro of the unit and
   * of its key: docs/serving.md, docs/backward.md): the forward's reads
   * seqlens_k, block_table and cu_seqlens, the backward's cu_seqlens; 0
   * otherwise, where the kernels keep the launch's sizes as constants.
   * Set by the runtime (the backward's by fjg_config_backward_variant). */
  int varlen;
  /* Forward only: 1 is the Skip Softmax variant (FJ_SKIP: docs/serving.md),
   * which a forward with skip_softmax_threshold > 0 launches; 0 otherwise.
   * Set by the runtime. */
  int skip;
} fjg_config;

/* Asks for (on = 1) or against the persistent kernel; only the sm90
 * template has one (others are left as they are). It has two consumer
 * warpgroups: FJG_SM90_PERSISTENT_BLOCK_M query rows, whatever the head dim
 * (the launch path needs the rows before a configuration exists). */
#define FJG_SM90_PERSISTENT_BLOCK_M 128
void fjg_config_set_persistent(fjg_config *c, int on);
/* The sm90 kernel's query x kv tile for a head dim (what choose_sm90 sets):
 * 0, or -1 for a head dim it does not have. Cheap: the launch path asks it
 * whether a block mask's blocks are whole tiles. */
int fjg_sm90_tile(int head_dim, int *block_m, int *block_n);
/* The query rows of an sm90 tile that a block mask of block_q-row blocks
 * fits: block_m when block_q is a multiple of it (or 0: no mask), else 128
 * (the two-consumer tile, which every head dim has) when that fits, else 0. */
int fjg_sm90_block_m_for(int block_m, int block_q);
/* sm90 only: num_stages K/V stages (>= 2) when they fit the target's shared
 * memory; returns 0 when it set them, -1 (and changes nothing) otherwise. */
int fjg_config_set_stages(fjg_config *c, int num_stages);
/* sm90 only: n consumer warpgroups of 64 query rows each: 2 (block_m 128,
 * 12 warps) or, at head dim 64 and not persistent, 3 (block_m 192, 16
 * warps), when the stages still fit ($FLEXJIT_CONSUMERS). 0, else -1 with
 * c unchanged. */
int fjg_config_set_consumers(fjg_config *c, int n);
/* sm90 forward at head dim 128 only: the long-row variant (kv tiles of
 * FJG_SM90_LONG_ROW_BLOCK_N rows, one CTA an item), which the runtime takes
 * for launches whose rows are long (fj_kernel_options.long_rows). 0, else
 * -1 with c unchanged. */
#define FJG_SM90_LONG_ROW_BLOCK_N 176
int fjg_config_set_long_rows(fjg_config *c);

/* Checks a target name: "sm_", two or three digits >= 80, then "a" (from
 * sm_90) or "f" (from sm_100) or nothing. FJ_EINVAL for a malformed name,
 * FJ_EUNSUPPORTED below sm_80, with a message in err; *sm (may be NULL)
 * receives the number. Whether NVRTC compiles for it is the runtime's
 * question. */
fj_status fjg_arch_check(const char *arch, int *sm, char *err, size_t errlen);

/*
 * Chooses the configuration for head_dim (64, 128; 256 on sm90), dtype and arch
 * ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", ...: "sm_", a
 * number >= 80 and an optional one-letter suffix): the sm80 template here;
 * the runtime asks for sm90 on sm_90a (runtime/forward.c). On failure
 * returns FJ_EINVAL (bad argument) or FJ_EUNSUPPORTED (valid but not
 * supported) and writes a message to err (may be NULL; truncated to
 * errlen). Thread-safe; no allocation.
 */
fj_status fjg_config_choose(int head_dim, fj_dtype dtype, const char *arch,
                            fjg_config *out, char *err, size_t errlen);

/*
 * As fjg_config_choose, with the template named: NULL picks the default
 * (what fjg_config_choose returns: "sm80" on every arch; the runtime
 * names "sm90" itself on sm_90a), "sm80"
 * forces the mma.sync template (any arch >= sm_80), "sm90" the wgmma + TMA
 * template, which needs an sm_90a target (wgmma and setmaxnreg exist only
 * there; plain sm_90 and other archs are refused with FJ_EUNSUPPORTED and a
 * message saying so). sm90 shapes: 128 query rows per CTA (two consumer
 * warpgroups of 64), 128-row kv tiles, 12 warps (384 threads), 2 K/V stages
 * at D=128; at D=64 192 query rows (three consumers, 16 warps, 512 threads)
 * and 3 K/V stages, uses_tma = 1, smem_bytes as the template's
 * FJH_SMEM_BYTES. An unknown name is FJ_EINVAL. Thread-safe; no allocation.
 */
fj_status fjg_config_choose_template(int head_dim, fj_dtype dtype,
                                     const char *arch,
                                     const char *template_name,
                                     fjg_config *out, char *err,
                                     size_t errlen);

/*
 * The backward pass's configuration (docs/backward.md) for head_dim (64,
 * 128), dtype and arch, as fjg_config_choose_template checks them.
 * template_name NULL or "sm80": the mma.sync backward, on every arch from
 * sm_80; "sm90": the wgmma + TMA backward, target sm_90a only (else
 * FJ_EUNSUPPORTED); another name FJ_EINVAL, head dim 256 FJ_EUNSUPPORTED.
 * Both take 128 kv rows a CTA; query tiles of 64 rows (32 on sm80's parts
 * with about 100 KiB), and 128 in the sm90 kernel at head dim 64
 * (fjg_sm90_bwd_block_m; fjg_config_backward_variant says where it gives
 * way). The fields mean, for the backward unit's macros
 * (templates/sm80/bwd_config.cuh, templates/sm90/bwd_config.cuh):
 *   block_m     FJ_BLOCK_M: query rows of a streamed Q / dO tile
 *   block_n     FJ_BLOCK_N: kv rows a CTA owns, 16 * num_warps
 *   num_warps   FJ_NUM_WARPS; threads = 32 * num_warps
 *   num_stages  FJ_NUM_STAGES: Q / dO stages (2)
 *   smem_bytes  the main kernel's dynamic shared memory (raise the
 *               function's limit above 48 KiB), no static
 * Launches: fj_attention_bwd_pre and fj_attention_bwd_post on grid
 * (ceil(Lq / FJG_BWD_ROW_BLOCK), Hq, B) with FJG_BWD_ROW_THREADS threads and
 * no dynamic shared memory; fj_attention_bwd between them on grid
 * (ceil(Lk / block_n), Hkv, B) with `threads` threads and smem_bytes; for
 * sm90 (uses_tma 1) with kernelParams {&params, &maps} (runtime/tma.h's
 * fjr_tma_bwd_maps). sm90: persistent 1 (then fj_attention_bwd's grid is
 * (min(SMs, its CTAs above), 1, 1)); q_bufs 0; spill_fallback NULL.
 * Thread-safe; no allocation.
 */
fj_status fjg_config_choose_backward(int head_dim, fj_dtype dtype, const char *arch,
                                     const char *template_name, fjg_config *out,
                                     char *err, size_t errlen);
/* The sm90 backward's query rows of a work item at head_dim (64 or 128):
 * 128 at 64, else 64. */
int fjg_sm90_bwd_block_m(int head_dim);
/* The variant of a backward configuration that a compile or launch takes:
 * sets deterministic and varlen (0 or 1), and lowers the sm90 kernel's
 * 128-row query tiles to 64 (smem_bytes with them) for a packed batch
 * (varlen: a sequence's scratch rows are whole tiles of FJG_BWD_SEQ_PAD)
 * and for a block mask of block_q-row blocks (0: none) that 128 does not
 * divide. Other configurations keep their tiles (the launch refuses a block
 * mask they do not fit). c NULL: a no-op. */
void fjg_config_backward_variant(fjg_config *c, int deterministic, int varlen, int block_q);
/*
 * The decode kernel's configuration (templates/sm80/decode_config.cuh:
 * docs/serving.md) for head_dim (64, 128), dtype and arch: block_m query
 * rows a CTA (16, or 32 when `rows`, the packed rows of a KV group, is
 * larger), block_n = 16 * num_warps kv rows a tile (`warps`, 4 or 8, or 0:
 * 4; a 16-row slice each), num_stages slices in flight a warp (`stages`,
 * or 0: with 4 warps 3 at D=128 and 4 at D=64 on sm_90, with 8 warps 2),
 * smem_bytes its dynamic shared memory. The 4-warp kernel runs two CTAs a
 * multiprocessor, the 8-warp one a CTA (runtime/decode.c's
 * fjr_decode_warps chooses). The mma.sync kernel runs on every target from
 * sm_80; template_name "sm80". Launch: runtime/decode.c. Thread-safe; no
 * allocation.
 */
fj_status fjg_config_choose_decode(int head_dim, fj_dtype dtype, const char *arch, int rows,
                                   int warps, int stages, fjg_config *out, char *err,
                                   size_t errlen);
/* The spec-independent serving kernels (templates/common/merge.cuh: the
 * LSE merge and the CSR conversion) for arch: template "common", 128
 * threads, no dynamic shared memory. */
fj_status fjg_config_choose_util(fj_dtype dtype, const char *arch, fjg_config *out, char *err,
                                 size_t errlen);

/* The backward's row kernels (templates/common/bwd_rows.cuh: FJB_ROW_BLOCK,
 * FJB_ROW_THREADS). */
#define FJG_BWD_ROW_BLOCK 64
#define FJG_BWD_ROW_THREADS 128
/* The deterministic backward's semaphores (templates/common/bwd_order.cuh:
 * FJB_SEM_ROWS): the scratch holds one per this many query rows, enough
 * for every query tile of a multiple of it. */
#define FJG_BWD_SEM_ROWS 16
/* The backward's scratch rows of a query head, and of a packed sequence,
 * start at a multiple of this many rows, with that many free before the
 * next's (templates/common/fj_bwd.cuh: FJB_SEQ_PAD): a query head holds Lq
 * rounded up to it, or total_q + FJG_BWD_SEQ_PAD * B rows packed. */
#define FJG_BWD_SEQ_PAD 64

#endif /* FJG_CONFIG_H */
