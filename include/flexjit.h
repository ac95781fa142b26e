/*
 * flexjit: JIT-compiled FlashAttention kernels for attention variants written
 * as small Lua functions (FlexAttention-style mask_mod and score_mod).
 *
 * This is the one public header. Conventions:
 *  - Every function that can fail returns fj_status: 0 on success, negative on
 *    failure. The detailed message (spec file and line, NVRTC log, CUresult
 *    name) is kept in the context and read with fj_context_last_error().
 *  - For contributors: internally, a function that can fail returns fj_status
 *    (one that returns a number, such as an id, returns -1) and writes its
 *    message into the caller's buffer (char *err, size_t errlen: err may be
 *    NULL; on failure it gets the message, truncated, naming the path or the
 *    input and the reason). Only the public API keeps a message, in the
 *    context: runtime/ code copies the buffer there, or writes there directly
 *    (fjr_fail). The one exception is the traced graph, whose builders keep
 *    theirs in the graph (fjg_graph_error). Warnings that are not failures go
 *    to the log.
 *  - Handles are opaque. fj_X_destroy(NULL) is a no-op. Specs must be destroyed
 *    before the context that loaded them.
 *  - A context is not thread-safe: use one per thread, or serialize calls.
 *  - The library never prints; it reports through the log callback, if any.
 */
#ifndef FLEXJIT_H
#define FLEXJIT_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FJ_VERSION_MAJOR 0
#define FJ_VERSION_MINOR 1
#define FJ_VERSION_PATCH 0
#define FJ_VERSION_STRING "0.1.0"
#define FJ_VERSION_NUMBER \
  (FJ_VERSION_MAJOR * 10000 + FJ_VERSION_MINOR * 100 + FJ_VERSION_PATCH)

/* Runtime version, FJ_VERSION_NUMBER of the library actually linked. */
unsigned fj_version_number(void);
const char *fj_version_string(void);

/* Status codes: name, value, default message. */
#define FJ_STATUS_MAP(X)                                                      \
  X(OK, 0, "success")                                                         \
  X(EINVAL, -1, "invalid argument")                                           \
  X(ENOMEM, -2, "out of memory")                                              \
  X(ELUA, -3, "error in Lua spec")                                            \
  X(ESPEC, -4, "invalid attention spec")                                      \
  X(EUNSUPPORTED, -5, "unsupported configuration")                            \
  X(ETENSOR, -6, "tensor shape, stride, dtype or device mismatch")            \
  X(ENODRIVER, -7, "CUDA driver not available")                               \
  X(ECUDA, -8, "CUDA driver call failed")                                     \
  X(ENONVRTC, -9, "NVRTC not available")                                      \
  X(ECOMPILE, -10, "kernel compilation failed")                               \
  X(EIO, -11, "file I/O error")                                               \
  X(ECACHE, -12, "kernel cache error")                                        \
  X(ENOTFOUND, -13, "not found")

typedef enum {
#define FJ_STATUS_ENUM_(name, value, msg) FJ_##name = value,
  FJ_STATUS_MAP(FJ_STATUS_ENUM_)
#undef FJ_STATUS_ENUM_
} fj_status;

/* "FJ_EINVAL" and its default message; "FJ_UNKNOWN"/"unknown status" for
 * values outside the table. Static strings. */
const char *fj_status_name(fj_status status);
const char *fj_strerror(fj_status status);

typedef struct fj_context fj_context;
typedef struct fj_spec fj_spec;

typedef enum {
  FJ_LOG_DEBUG = 0,
  FJ_LOG_INFO = 1,
  FJ_LOG_WARN = 2,
  FJ_LOG_ERROR = 3,
} fj_log_level;

/* Called synchronously from the thread that made the library call. `msg` is
 * valid only during the call. */
typedef void (*fj_log_fn)(void *user, fj_log_level level, const char *msg);

typedef enum {
  FJ_DTYPE_BF16 = 0,
  FJ_DTYPE_F16 = 1,
} fj_dtype;

typedef struct fj_context_options {
  /* Kernel cache root. NULL: $FLEXJIT_CACHE_DIR, else $XDG_CACHE_HOME/flexjit,
   * else ~/.cache/flexjit. "" (empty): no disk cache, in-memory only. */
  const char *cache_dir;
  /* CUDA device ordinal used for launches. Default 0. */
  int device;
  /* Compile target override ("sm_80", "sm_90a", ...). NULL: the device's
   * (sm_90a on Hopper). A cubin runs only on GPUs of its target's major
   * architecture, so set this only to compile for another machine. */
  const char *arch;
  /* Largest size of the disk cache in bytes; least recently used entries are
   * evicted after each store, never one this process uses. 0: no limit
   * beyond $FLEXJIT_CACHE_MAX_BYTES, if set. */
  uint64_t cache_max_bytes;
  /* Kernel template: "sm80" (mma.sync + cp.async, any target from sm_80) or
   * "sm90" (wgmma + TMA, warp-specialized; target sm_90a only). NULL:
   * $FLEXJIT_TEMPLATE if set, else sm90 for sm_90a and sm80 otherwise. Both
   * read block masks; a launch whose block mask's blocks are not whole sm90
   * tiles (128 x 128, e.g. block_kv 64) gets sm80 unless a template is set. */
  const char *kernel_template;
  fj_log_fn log;
  void *log_user;
} fj_context_options;

/* Fills defaults. */
void fj_context_options_init(fj_context_options *opts);

/* Creates a context. Does not touch the GPU: the driver is loaded on first
 * launch, NVRTC on first compile. `opts` may be NULL. */
fj_status fj_context_create(const fj_context_options *opts, fj_context **out);
void fj_context_destroy(fj_context *ctx);

/* Mounts a kernel pack (a .fjpack file written by `flexjit precompile`)
 * read-only. Packs are searched, in mount order, before the disk cache. When
 * NVRTC is unavailable a kernel is matched by everything but the compiler
 * version; a kernel in no pack and no cache then fails with an error naming
 * its readable name and key. The file stays open (not mapped) until the
 * context is destroyed: one changed in place or truncated meanwhile gives
 * misses with a warning, never a crash; replace packs by rename. */
fj_status fj_context_mount_pack(fj_context *ctx, const char *path);

/* Message of the last failure on this context (borrowed; valid until the next
 * call on ctx). "" when the last call succeeded. */
const char *fj_context_last_error(const fj_context *ctx);

/* Loads a spec: runs the Lua chunk once in a sandbox and traces its mask_mod
 * and score_mod into an immutable graph. Errors name `chunkname:line:`.
 * The spec borrows nothing from the caller. */
fj_status fj_spec_load_file(fj_context *ctx, const char *path, fj_spec **out);
fj_status fj_spec_load_string(fj_context *ctx, const char *source, size_t len,
                              const char *chunkname, fj_spec **out);
void fj_spec_destroy(fj_spec *spec);

/* The spec's `name` field, or the chunk name (borrowed, lives with spec). */
const char *fj_spec_name(const fj_spec *spec);

typedef enum {
  FJ_ARG_I32 = 0,    /* param(name, "i32") */
  FJ_ARG_F32 = 1,    /* param(name, "f32") */
  FJ_ARG_BUFFER = 2, /* buffer(name, dtype): a 1-D device array */
} fj_arg_kind;

/* Runtime values the spec declared with param() and buffer(), in declaration
 * order. `name` is borrowed from the spec; either out pointer may be NULL. */
int fj_spec_num_args(const fj_spec *spec);
fj_status fj_spec_arg_info(const fj_spec *spec, int index, const char **name,
                           fj_arg_kind *kind);
/* The scalar type of a param, or the element type of a buffer: int32 or
 * float32, as a DLPack dtype (what a buffer's DLTensor must carry). */
fj_status fj_spec_arg_dtype(const fj_spec *spec, int index, DLDataType *dtype);
/* *trainable = 1 for a buffer the spec marks trainable (buffer(name, "f32",
 * {grad = true})), whose fj_arg needs `grad` in fj_attention_backward; 0
 * for every other argument. */
fj_status fj_spec_arg_trainable(const fj_spec *spec, int index, int *trainable);

/* What the spec's mask_mod reads, as fj_mask_dep flags (0 for no mask_mod
 * or a NULL spec). A mask that reads a buffer (a document mask) cannot have
 * its tiles classified from indices alone: a block mask (fj_block_mask_build)
 * is what lets launches skip them, built per batch entry or per head
 * (fj_block_mask_options.B, H) where the mask reads b or h. */
typedef enum fj_mask_dep {
  FJ_MASK_READS_BUFFER = 1,
  FJ_MASK_READS_B = 2,
  FJ_MASK_READS_H = 4,
} fj_mask_dep;
unsigned fj_spec_mask_deps(const fj_spec *spec);

/* A runtime value supplied at launch, matched by name. */
typedef struct fj_arg {
  const char *name;
  int32_t i32;            /* for FJ_ARG_I32 */
  float f32;              /* for FJ_ARG_F32 */
  const DLTensor *buffer; /* for FJ_ARG_BUFFER: 1-D, contiguous, on the GPU */
  /* For a buffer the spec marks trainable (buffer(name, "f32", {grad =
   * true})), in fj_attention_backward: an fp32 tensor of the buffer's shape
   * that the buffer's gradient is added to (the caller zeroes it first).
   * Ignored by the forward; NULL elsewhere. */
  const DLTensor *grad;
} fj_arg;

/* A block of (query, key) pairs for fj_spec_block_class: query rows q0..q1
 * and key rows kv0..kv1 (inclusive, rows of the tensors, 0 <= q0 <= q1 < Lq
 * and 0 <= kv0 <= kv1 < Lk), for every batch index below B and query head
 * below Hq, in a launch of these sizes and offsets (as fj_forward_args':
 * mask_mod sees q + q_offset and kv + kv_offset). */
typedef struct fj_block_query {
  int64_t B, Hq, Hkv, Lq, Lk;
  int64_t q_offset, kv_offset;
  int64_t q0, q1, kv0, kv1;
} fj_block_query;

enum { FJ_BLOCK_EMPTY = 0, FJ_BLOCK_PARTIAL = 1, FJ_BLOCK_FULL = 2 };

/* Classifies spec's mask_mod on a block, on the host, by the interval
 * analysis the kernels skip tiles with: *out_class = FJ_BLOCK_EMPTY when it
 * is false for every pair (every b and h), FJ_BLOCK_FULL when true for every
 * pair (also without a mask_mod), else FJ_BLOCK_PARTIAL. Sound, not exact: a
 * block it cannot decide is PARTIAL, and buffer values are not read (a mask
 * that reads a buffer is decided by its index arithmetic alone, as a document
 * mask's causal part). args gives the spec's params by name (buffers may be
 * among them and are ignored). Offsets follow the launches' rules: with
 * either nonzero, a spec that reads Lq or Lk is refused (FJ_EUNSUPPORTED).
 * For a caller that would launch attention on a block the mask leaves empty,
 * such as the pairs of a context parallel ring. Pure host work, microseconds
 * a (b, h). */
fj_status fj_spec_block_class(const fj_spec *spec, const fj_arg *args, int num_args,
                              const fj_block_query *query, int *out_class);

/* What a compiled kernel is specialized on. */
typedef struct fj_kernel_options {
  int head_dim;     /* 64 or 128; 256 with the sm90 template (sm_90a) */
  fj_dtype dtype;   /* of q, k, v and o */
  const char *arch; /* NULL: the context's arch */
  /* "sm80" or "sm90"; NULL: the context's choice (see fj_context_options). */
  const char *kernel_template;
  /* 0: launched without a block mask; else the block_q of the block masks
   * the kernel is launched with, whose blocks must be whole tiles: at head
   * dim 64 the sm90 forward's tile has 192 query rows, and block masks of
   * 128-row blocks (FlexAttention's default) take its 128-row variant; the
   * sm90 backward's has 128 there, and blocks of 64 rows take its 64-row
   * variant. */
  int block_mask_block_q;
  /* fj_compile_backward only: 1 compiles the deterministic variant, the
   * kernel fj_backward_args.deterministic launches (a kernel of its own,
   * with its own key). The forward ignores it. */
  int deterministic;
  /* 1 compiles the variant for the serving layouts (its own kernel and
   * key): for fj_compile_forward, the kernel a forward with seqlens_k,
   * block_table or cu_seqlens launches (launches of up to FJ_DECODE_MAX_Q
   * query tokens run the decode kernel instead: fj_compile_decode); for
   * fj_compile_backward, the kernel a backward with cu_seqlens launches
   * (combines with deterministic). The kernels without them keep the
   * launch's sizes as constants. */
  int varlen;
  /* fj_compile_forward only: 1 compiles the Skip Softmax variant, the
   * kernel a forward with skip_softmax_threshold > 0 and more than
   * FJ_DECODE_MAX_Q query tokens launches (combines with varlen). */
  int skip_softmax;
  /* fj_compile_forward only: 1 compiles the long-row variant, the kernel a
   * forward launches where the query rows are long (their allowed keys
   * FJ_LONG_ROW_KEYS or more on average, estimated from the mask's interval
   * analysis): at head dim 128 on the sm90 template, for specs without a
   * score_mod, kv tiles of 176 rows; not with block_mask_block_q, varlen or
   * skip_softmax. Where it does not apply, the same kernel as without. */
  int long_rows;
} fj_kernel_options;

typedef struct fj_kernel_info {
  char key[33];           /* XXH3-128 key, lowercase hex */
  /* The key without the NVRTC version: what a pack is searched by when
   * NVRTC is unavailable. */
  char source_key[33];
  char name[96];          /* readable kernel name */
  char cubin_path[1024];  /* "" when not stored on disk */
  char arch[16];          /* target it was compiled for */
  char kernel_template[16]; /* "sm80" or "sm90" */
  int from_cache;         /* 1: found in memory or on disk, NVRTC not called */
  double compile_ms;      /* NVRTC time, 0 when from cache */
  size_t cubin_size;
} fj_kernel_info;

/* Compiles (or finds in the cache) the forward kernel for spec and options.
 * Needs NVRTC on a cache miss, never a GPU. `info` may be NULL. */
fj_status fj_compile_forward(fj_context *ctx, const fj_spec *spec,
                             const fj_kernel_options *opts,
                             fj_kernel_info *info);

/* Writes the CUDA source that fj_compile_forward compiles to `path`. */
fj_status fj_emit_forward_source(fj_context *ctx, const fj_spec *spec,
                                 const fj_kernel_options *opts,
                                 const char *path);

/*
 * Forward attention. Tensors are DLTensors on the context's CUDA device in the
 * logical order [B, H, S, D]: q [B, Hq, Lq, D], k and v [B, Hkv, Lk, D],
 * o [B, Hq, Lq, D], all of one dtype (bf16 or fp16); the last dimension must
 * be contiguous (stride 1), other strides are free, so BHSD and BSHD (a
 * transposed view) both work. lse, if not NULL, is float32 [B, Hq, Lq] with a
 * contiguous last dimension; it receives the natural-log sum of exponentials
 * (-inf for a fully masked row, whose output is 0). Hq must be a multiple of
 * Hkv (GQA, MQA). scale: 0 means 1/sqrt(D).
 * The launch is asynchronous on `stream` (a CUstream; NULL is the legacy
 * default stream). The first launch of a (spec, options) pair may compile.
 */
typedef struct fj_forward_args {
  const DLTensor *q, *k, *v;
  const DLTensor *o;
  const DLTensor *lse;
  float scale;
  const fj_arg *args;
  int num_args;
  void *stream;
  /* Optional (NULL: none). The kernel then visits only the kv blocks the
   * mask lists for each query block, evaluating mask_mod only on its
   * partial blocks, instead of classifying tiles itself. Borrowed for the
   * call; it must describe this launch (see fj_block_mask_build). */
  const struct fj_block_mask *block_mask;
  /* Optional scratch (NULL: none): device memory, 256-byte aligned, of at
   * least fj_forward_workspace_size bytes, for callers whose allocator must
   * own every allocation (a CUDA graph captured under PyTorch). The
   * persistent sm90 kernel keeps its work counter there; without it the
   * counter comes from the context's memory pool in stream order. */
  void *workspace;
  size_t workspace_bytes;

  /* ---- Serving (docs/serving.md). Every field below is optional: zero or
   * NULL leaves the launch as described above. ---- */
  /* Per-sequence key/value lengths: int32 [B] on the GPU, each in [0, Lk].
   * Sequence b attends to kv positions [0, seqlens_k[b]), and mask_mod and
   * score_mod see Lk = seqlens_k[b] (so bottom-right alignment, as in
   * causal{align = "bottom_right"}, follows each sequence's own length). */
  const DLTensor *seqlens_k;
  /* Paged KV (vLLM's and FlashAttention's layout): k and v are page pools
   * [num_pages, page_size, Hkv, D] (head dim contiguous, other strides
   * free) and block_table is int32 [B, max_pages] with a contiguous last
   * dimension: kv positions [j * page_size, (j + 1) * page_size) of
   * sequence b lie in page block_table[b][j]. Lk is max_pages * page_size
   * (seqlens_k gives the lengths in use); page_size is a multiple of 16, at
   * most 256. Entries past a sequence's length are never read. */
  const DLTensor *block_table;
  /* Packed variable-length batches (FlashAttention's varlen): q and o are
   * [total_q, Hq, D] and k and v [total_k, Hkv, D] (3-D; or page pools with
   * block_table), lse is [Hq, total_q]; cu_seqlens_q and cu_seqlens_k are
   * int32 [B + 1] on the GPU, nondecreasing from 0: sequence b's queries
   * are rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1, its keys and
   * values likewise. Each sequence is masked as its own (mask_mod sees b,
   * positions from 0, and its own Lq and Lk), so a packed batch needs no
   * document mask. max_seqlen_q and max_seqlen_k: at least the longest
   * sequence (they size the grid). With block_table, cu_seqlens_k is NULL
   * and seqlens_k gives the kv lengths. */
  const DLTensor *cu_seqlens_q, *cu_seqlens_k;
  int max_seqlen_q, max_seqlen_k;
  /* Skip Softmax (docs/serving.md), 0: off (exact attention). A value
   * lambda in (0, 1) skips the softmax update of a kv tile (and in the
   * decode kernel its V load and P V) when exp(tile max - running max) <
   * lambda for every query row of the tile (per warp: 16 or 32 rows): each
   * skipped probability is below lambda times the row's largest so far.
   * Approximate; launches with it run kernel variants of their own. */
  float skip_softmax_threshold;
  /* Context parallel shards (docs/context_parallel.md): the positions of
   * q's and k's first rows in the whole sequence. mask_mod and score_mod
   * see q + q_offset and kv + kv_offset, so a shard of a causal, sliding-
   * window or document mask is masked as in the whole; buffers they index
   * by position cover the whole sequence. Both >= 0, and offset + length
   * below 2^31. Not with a block mask, packed batches (cu_seqlens) or a
   * spec that reads the lengths Lq, Lk (bottom-right alignment): those are
   * refused. 0 (the default): positions from 0. */
  int64_t q_offset, kv_offset;
} fj_forward_args;

fj_status fj_attention_forward(fj_context *ctx, const fj_spec *spec,
                               const fj_forward_args *args);

/* Bytes of scratch a forward over B x Hq x Lq rows of head dim D may use
 * (fj_forward_args.workspace): the persistent kernel's work counter, and
 * for decode launches (Lq <= FJ_DECODE_MAX_Q) the split-KV partial results. */
size_t fj_forward_workspace_size(int64_t B, int64_t Hq, int64_t Lq, int64_t D);

/* Compiles (or finds in the cache) what a decode launch (below) runs for
 * spec and opts: the decode kernel in its two row blocks (16 and 32 packed
 * query rows a KV group), each of 4 warps and, where it fits the target,
 * of 8 (docs/serving.md), and the serving utility kernels (the LSE merge,
 * the CSR conversion). As fj_compile_forward: needs NVRTC on a miss, never
 * a GPU; `info` (may be NULL) describes the 32-row 4-warp kernel. For deployments
 * that precompile (`flexjit precompile`'s "decode" pass). */
fj_status fj_compile_decode(fj_context *ctx, const fj_spec *spec,
                            const fj_kernel_options *opts, fj_kernel_info *info);

/* Query lengths up to this run the decode kernel (docs/serving.md): the
 * query heads of a KV group packed into one tile's rows, the KV sequence
 * split across CTAs when B x Hkv is small and the parts merged by their
 * LSE. Longer ones run the forward kernel. The choice is the runtime's;
 * results agree within the usual tolerance. */
#define FJ_DECODE_MAX_Q 16

/* Launches whose query rows see this many keys or more on average run the
 * forward's long-row variant (fj_kernel_options.long_rows) where it exists;
 * the runtime estimates the average from the mask's interval analysis on
 * the host, at a few query blocks of batch 0, head 0 (docs/architecture.md,
 * "The long-row variant"). The choice is the runtime's; results agree
 * within the usual tolerance. */
#define FJ_LONG_ROW_KEYS 8192

/*
 * Merges attention over N key/value segments into attention over their
 * union (the LSE-weighted combination that split-KV decoding and cascade /
 * shared-prefix attention use): o = sum_i exp(lse_i - lse) o_i with
 * lse = log sum_i exp(lse_i). o_parts is [N, B, H, L, D] in bf16, fp16 or
 * float32; lse_parts float32 [N, B, H, L] (natural log; -inf marks an empty
 * segment, which adds nothing); o is [B, H, L, D] in bf16 or fp16 and lse,
 * optional, float32 [B, H, L]. A row whose segments are all empty gets
 * o = 0 and lse = -inf. Head dim any multiple of 8 up to 256; last
 * dimensions contiguous, other strides free. Asynchronous on `stream`; the
 * first call compiles (or finds in the cache) a small kernel.
 */
typedef struct fj_merge_args {
  const DLTensor *o_parts, *lse_parts;
  const DLTensor *o, *lse;
  void *stream;
} fj_merge_args;

fj_status fj_merge_states(fj_context *ctx, const fj_merge_args *args);

/*
 * FlashInfer's CSR page layout to the block table fj_forward_args takes,
 * on the GPU: kv_indptr int32 [B + 1], kv_indices int32 [kv_indptr[B]]
 * (sequence b's pages are kv_indices[kv_indptr[b] .. kv_indptr[b+1] - 1])
 * and kv_last_page_len int32 [B] (tokens in its last page, 1 to page_size)
 * become block_table int32 [B, max_pages] (entries past a sequence's pages
 * set to 0) and seqlens_k int32 [B]. A sequence with more than max_pages
 * pages is cut to max_pages (its seqlens_k then counts those). Asynchronous
 * on `stream`.
 */
typedef struct fj_paged_csr_args {
  const DLTensor *kv_indptr, *kv_indices, *kv_last_page_len;
  int page_size;
  const DLTensor *block_table, *seqlens_k;
  void *stream;
} fj_paged_csr_args;

fj_status fj_paged_from_csr(fj_context *ctx, const fj_paged_csr_args *args);

/*
 * Backward attention: the gradients of fj_attention_forward's O (and,
 * optionally, of its LSE) with respect to q, k, v and the spec's trainable
 * buffers (docs/backward.md). q, k, v, o, lse: as the forward took and
 * wrote them (lse is required); dout: dO, shaped and typed like o; dlse:
 * optional (NULL: 0), float32 like lse, for callers that merge attention
 * over several segments. dq, dk, dv: outputs shaped like q, k, v, in their
 * dtype; for GQA dk and dv sum over the query heads of a group. A fully
 * masked row's dq is 0. args: the forward's runtime values, with `grad`
 * set for each trainable buffer (fp32, added to). block_mask: the forward's,
 * if any (its transposed lists are read). Scratch: `workspace` (device
 * memory, 256-byte aligned) of at least fj_backward_workspace_size bytes,
 * or NULL: taken from the context's memory pool in stream order.
 * deterministic: 1 adds the parts of dq to each query tile in a fixed
 * order (descending key tiles; docs/backward.md), so that dq, dk and dv are
 * bitwise equal from run to run of one kernel (same spec, shapes, dtype,
 * target and GPU model); dk and dv are in any mode. It runs a kernel of its
 * own, whose CTAs wait for each other's turns: slower, the more so the more
 * key tiles add to each query tile. A spec with trainable buffers is
 * refused (FJ_EUNSUPPORTED): their gradients are added in no fixed order.
 * 0 (the default): dq is added with atomics in arrival order.
 * Asynchronous on `stream`.
 */
typedef struct fj_backward_args {
  const DLTensor *q, *k, *v, *o, *lse;
  const DLTensor *dout;
  const DLTensor *dlse;
  const DLTensor *dq, *dk, *dv;
  float scale; /* 0: 1/sqrt(D), as in the forward */
  const fj_arg *args;
  int num_args;
  const struct fj_block_mask *block_mask;
  void *workspace;
  size_t workspace_bytes;
  int deterministic;
  void *stream;
  /* Packed variable-length batches, as the forward took them
   * (fj_forward_args.cu_seqlens_q ...; docs/backward.md): q, o, dout and dq
   * [total_q, Hq, D], k, v, dk and dv [total_k, Hkv, D] with cu_seqlens_k
   * (else [B, Hkv, Lk, D]), lse and dlse [Hq, total_q]. Each sequence's
   * gradients are its own (masked as its own, positions from 0); rows of
   * dq, dk, dv that belong to no sequence are not written. Not with a
   * block mask. NULL: off. */
  const DLTensor *cu_seqlens_q, *cu_seqlens_k;
  int max_seqlen_q, max_seqlen_k;
  /* The positions of q's and k's first rows in the whole sequence, as the
   * forward took them (fj_forward_args.q_offset). With a shard's partial
   * forward, o and lse may be the whole attention's (merged over every kv
   * shard): the gradients are then this (q, kv) pair's part of the whole. */
  int64_t q_offset, kv_offset;
} fj_backward_args;

fj_status fj_attention_backward(fj_context *ctx, const fj_spec *spec,
                                const fj_backward_args *args);

/* Bytes of scratch a backward over B x Hq x Lq rows of head dim D needs
 * (fp32 delta and dq accumulator, each head's rows rounded up to 64, the
 * persistent sm90 kernel's int32 tile counter and the query tiles' int32
 * semaphores, one per 16 query rows, and 32768 * D bytes for the persistent
 * kernel's split last round, docs/backward.md; a workspace without them
 * runs unsplit), for callers that pass their own. 0 when a size is below
 * 1. A packed batch of B sequences needs at most
 * fj_backward_workspace_size(B, Hq, max_seqlen_q + 64, D) when q holds only
 * its sequences' rows (total_q <= B * max_seqlen_q). */
size_t fj_backward_workspace_size(int64_t B, int64_t Hq, int64_t Lq, int64_t D);

/* Compiles (or finds in the cache) the backward kernels of spec for opts
 * (as fj_compile_forward). Needs NVRTC on a miss, never a GPU. */
fj_status fj_compile_backward(fj_context *ctx, const fj_spec *spec,
                              const fj_kernel_options *opts, fj_kernel_info *info);

/*
 * Block masks (FlexAttention's BlockMask layout) for masks that read
 * buffers, such as document ids, where the kernel cannot classify tiles from
 * indices alone. Index-only masks (causal, sliding window, prefix-LM, ...)
 * need none: the kernel classifies their tiles by interval analysis.
 *
 * A block mask splits the (q, kv) plane of each (batch, head) into blocks of
 * block_q x block_kv and classifies every block exactly as EMPTY (mask_mod
 * false for every in-range pair), FULL (true for every one) or PARTIAL.
 * It is built on the GPU by a kernel generated from the spec's graph,
 * without materializing the Lq x Lk mask, into device arrays of int32:
 *   kv_num_blocks      [B][H][nq]       PARTIAL kv blocks per query block
 *   kv_indices         [B][H][nq][nkv]  their indices, ascending, then 0s
 *   full_kv_num_blocks [B][H][nq]       FULL kv blocks per query block
 *   full_kv_indices    [B][H][nq][nkv]
 *   q_num_blocks, q_indices, full_q_num_blocks, full_q_indices: the same
 *   per kv block ([B][H][nkv] and [B][H][nkv][nq]), for the backward pass,
 * with nq = ceil(q_len / block_q) and nkv = ceil(kv_len / block_kv).
 */
typedef struct fj_block_mask fj_block_mask;

typedef struct fj_block_mask_options {
  /* 1 broadcasts over the batch (the mask is evaluated at b = 0), else the
   * launch's batch size. Default 1. */
  int B;
  /* 1 broadcasts over heads (evaluated at h = 0), else the launch's query
   * head count. Default 1. The size symbols B and Hq (and Hkv) read these. */
  int H;
  int q_len, kv_len; /* required, >= 1 */
  /* Block sizes; 0: 128. The forward kernel needs block_q to be a multiple
   * of its query tile (128 rows on sm_80+ at D=64 and D=128, 64 on parts
   * with ~100 KiB of shared memory) and block_kv a multiple of its kv tile
   * (64 or 128); 128 x 128 fits every configuration. */
  int block_q, block_kv;
  const fj_arg *args; /* params and buffers, as in fj_forward_args */
  int num_args;
  void *stream; /* CUstream the build kernels run on; NULL: legacy default */
  /* Optional (NULL: the mask allocates its memory with cuMemAlloc and owns
   * it): the device addresses of the eight arrays to build into, in
   * fj_block_mask_array order (contiguous int32, the shapes above), and
   * `scratch`, B x H x nq x nkv bytes for the block classes. The mask then
   * borrows them: they must outlive it, and its destruction frees nothing
   * (no synchronization). For callers whose allocator must own every
   * allocation. */
  const uint64_t *arrays;
  uint64_t scratch;
  /* Context parallel shards (docs/context_parallel.md): the positions of the
   * mask's first query row and first kv column in the whole sequence (>= 0;
   * default 0). mask_mod sees q + q_offset and kv + kv_offset, as in a
   * launch with these offsets, which is the only launch that takes the mask. */
  int q_offset, kv_offset;
} fj_block_mask_options;

/* Fills defaults (B = H = 1, block sizes 0, everything else 0/NULL). */
void fj_block_mask_options_init(fj_block_mask_options *opts);

/*
 * Builds the block mask of spec's mask_mod. The first build of a spec (per
 * context arch) compiles the builder kernel with NVRTC or finds it in the
 * kernel cache; the arrays are allocated with cuMemAlloc and owned by the
 * mask, unless opts->arrays names the caller's. The build kernels are launched asynchronously on opts->stream: work
 * queued after them on that stream sees the finished arrays. The mask
 * borrows ctx and spec: destroy it before either. Not thread-safe with
 * respect to its context.
 */
fj_status fj_block_mask_build(fj_context *ctx, const fj_spec *spec,
                              const fj_block_mask_options *opts,
                              fj_block_mask **out);

/* Compiles (or finds in the cache) the builder kernels that
 * fj_block_mask_build launches for spec, for target arch (NULL: the
 * context's). For deployments that precompile (`flexjit precompile`'s
 * "blockmask" pass): a machine without NVRTC builds block masks only with
 * this kernel in a mounted pack or its cache. Needs NVRTC on a miss, never
 * a GPU. `info` may be NULL. */
fj_status fj_compile_block_mask(fj_context *ctx, const fj_spec *spec, const char *arch,
                                fj_kernel_info *info);

/* Recomputes the mask in place with new runtime values (new document ids:
 * once per batch in training), reusing its kernel and memory: only two
 * kernel launches on `stream`. Sizes and block sizes stay as built. */
fj_status fj_block_mask_update(fj_block_mask *mask, const fj_arg *args,
                               int num_args, void *stream);

/* Frees the device arrays the mask owns (cuMemFree, which waits for work
 * using them); a mask that borrows its arrays frees only itself. NULL is a
 * no-op. */
void fj_block_mask_destroy(fj_block_mask *mask);

typedef enum {
  FJ_BM_KV_NUM_BLOCKS = 0,
  FJ_BM_KV_INDICES = 1,
  FJ_BM_FULL_KV_NUM_BLOCKS = 2,
  FJ_BM_FULL_KV_INDICES = 3,
  FJ_BM_Q_NUM_BLOCKS = 4,
  FJ_BM_Q_INDICES = 5,
  FJ_BM_FULL_Q_NUM_BLOCKS = 6,
  FJ_BM_FULL_Q_INDICES = 7,
  FJ_BM_NUM_ARRAYS = 8
} fj_block_mask_array;

typedef struct fj_block_mask_info {
  int B, H, q_len, kv_len, block_q, block_kv;
  int num_q_blocks, num_kv_blocks; /* nq, nkv */
  int q_offset, kv_offset;         /* the positions it was built for */
} fj_block_mask_info;

fj_status fj_block_mask_get_info(const fj_block_mask *mask,
                                 fj_block_mask_info *info);

/*
 * A block mask over arrays made elsewhere (FlexAttention's BlockMask
 * tensors, a mask built into caller memory), for launches to take. `arrays`
 * holds their device addresses in fj_block_mask_array order, each a
 * contiguous int32 array of the layout above with info->num_q_blocks (nq)
 * and info->num_kv_blocks (nkv) as the lengths of its rows, at least
 * ceil(q_len / block_q) and ceil(kv_len / block_kv); info's other fields
 * are fj_block_mask_options's (B and H 1 to broadcast). The q_* arrays may
 * be 0 in a mask only forward launches take. The mask borrows the arrays
 * (they must outlive it and its launches) and the context; making it
 * touches neither the GPU nor the arrays. fj_block_mask_update refuses it.
 */
fj_status fj_block_mask_wrap(fj_context *ctx, const fj_block_mask_info *info,
                             const uint64_t arrays[FJ_BM_NUM_ARRAYS],
                             fj_block_mask **out);

/* Device address (a CUdeviceptr; owned by the mask unless it borrows its
 * arrays) and element count of
 * one int32 array, for a caller's own kernels (e.g. a backward pass). */
fj_status fj_block_mask_array_device(const fj_block_mask *mask,
                                     fj_block_mask_array which,
                                     uint64_t *dptr, size_t *count);

/* Copies one array to the host: waits for the build stream, then copies
 * `count` elements (must equal the array's count) into `host`. */
fj_status fj_block_mask_download(fj_block_mask *mask,
                                 fj_block_mask_array which, int32_t *host,
                                 size_t count);

#ifdef __cplusplus
}
#endif

#endif /* FLEXJIT_H */
