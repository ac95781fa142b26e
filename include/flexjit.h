/*
 * flexjit: JIT-compiled FlashAttention kernels for attention variants written
 * as small Lua functions (FlexAttention-style mask_mod and score_mod).
 *
 * This is the one public header. Conventions:
 *  - Every function that can fail returns fj_status: 0 on success, negative on
 *    failure. The detailed message (spec file and line, NVRTC log, CUresult
 *    name) is kept in the context and read with fj_context_last_error().
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
 * its readable name and key. The file stays mapped until the context is
 * destroyed. */
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
 * order. `name` is borrowed from the spec. `dtype` is the buffer's element
 * type ("i32" or "f32") for buffers, the scalar type otherwise. */
int fj_spec_num_args(const fj_spec *spec);
fj_status fj_spec_arg_info(const fj_spec *spec, int index, const char **name,
                           fj_arg_kind *kind);

/* A runtime value supplied at launch, matched by name. */
typedef struct fj_arg {
  const char *name;
  int32_t i32;            /* for FJ_ARG_I32 */
  float f32;              /* for FJ_ARG_F32 */
  const DLTensor *buffer; /* for FJ_ARG_BUFFER: 1-D, contiguous, on the GPU */
} fj_arg;

/* What a compiled kernel is specialized on. */
typedef struct fj_kernel_options {
  int head_dim;     /* 64 or 128 */
  fj_dtype dtype;   /* of q, k, v and o */
  const char *arch; /* NULL: the context's arch */
} fj_kernel_options;

typedef struct fj_kernel_info {
  char key[33];           /* XXH3-128 key, lowercase hex */
  char name[96];          /* readable kernel name */
  char cubin_path[1024];  /* "" when not stored on disk */
  char arch[16];          /* target it was compiled for */
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
} fj_forward_args;

fj_status fj_attention_forward(fj_context *ctx, const fj_spec *spec,
                               const fj_forward_args *args);

#ifdef __cplusplus
}
#endif

#endif /* FLEXJIT_H */
