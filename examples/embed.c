/*
 * examples/embed.c: embedding flexjit in a host program, using only the
 * public header (include/flexjit.h) and DLPack.
 *
 *   embed [--arch sm_90a]
 *
 * Creates a context, loads a sliding-window spec from a string (the window
 * is a runtime param, so changing it never recompiles), compiles its
 * forward kernel, and, when a GPU is present, runs it once on its own
 * stream. Without a GPU it compiles for --arch (default sm_80), prints the
 * result and exits 0.
 *
 * flexjit does not allocate tensors: they come from the host (PyTorch,
 * CuPy, ...). This program has none of those, so it borrows four entry
 * points of the CUDA driver with dlopen; a real host uses its own.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flexjit.h"

static const char spec_source[] =
    "local window = param(\"window\", \"i32\")\n"
    "return {\n"
    "  name = \"embed_sliding_window\",\n"
    "  mask_mod = function(b, h, q, kv)\n"
    "    return ge(q, kv) & lt(q - kv, window)\n"
    "  end,\n"
    "}\n";

enum { B = 1, H = 4, L = 256, D = 64, WINDOW = 64 };

/* ---- the few driver calls this example needs (CUDA driver API ABI) ---- */

typedef unsigned long long devptr;
typedef struct cuda_api {
  void *lib;
  int (*cuInit)(unsigned);
  int (*cuDeviceGet)(int *, int);
  int (*cuDevicePrimaryCtxRetain)(void **, int);
  int (*cuDevicePrimaryCtxRelease)(int);
  int (*cuCtxSetCurrent)(void *);
  int (*cuMemAlloc)(devptr *, size_t);
  int (*cuMemFree)(devptr);
  int (*cuMemcpyHtoD)(devptr, const void *, size_t);
  int (*cuMemcpyDtoH)(void *, devptr, size_t);
  int (*cuStreamCreate)(void **, unsigned);
  int (*cuStreamDestroy)(void *);
  int (*cuStreamSynchronize)(void *);
} cuda_api;

/* Loads libcuda and makes device 0's primary context current (the context
 * flexjit launches in). Returns 0 when there is no usable GPU. */
static int cuda_open(cuda_api *c, void **pctx) {
  memset(c, 0, sizeof *c);
  c->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!c->lib) return 0;
#define SYM(field, name) *(void **)&c->field = dlsym(c->lib, name)
  SYM(cuInit, "cuInit");
  SYM(cuDeviceGet, "cuDeviceGet");
  SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
  SYM(cuMemAlloc, "cuMemAlloc_v2");
  SYM(cuMemFree, "cuMemFree_v2");
  SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  SYM(cuStreamCreate, "cuStreamCreate");
  SYM(cuStreamDestroy, "cuStreamDestroy_v2");
  SYM(cuStreamSynchronize, "cuStreamSynchronize");
#undef SYM
  int dev = 0;
  if (!c->cuInit || !c->cuStreamSynchronize || !c->cuDevicePrimaryCtxRelease ||
      c->cuInit(0) != 0 || c->cuDeviceGet(&dev, 0) != 0 ||
      c->cuDevicePrimaryCtxRetain(pctx, dev) != 0) {
    dlclose(c->lib);
    c->lib = NULL;
    return 0;
  }
  return c->cuCtxSetCurrent(*pctx) == 0;
}

/* ---- tensors ---- */

typedef struct tensor {
  devptr ptr;
  int64_t shape[4];
  DLTensor t;
} tensor;

static int tensor_alloc(cuda_api *c, tensor *x, int ndim, const int64_t *shape,
                        DLDataType dt) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)(x->shape[i] = shape[i]);
  if (c->cuMemAlloc(&x->ptr, n * dt.bits / 8) != 0) return 0;
  x->t.data = (void *)(uintptr_t)x->ptr;
  x->t.device.device_type = kDLCUDA;
  x->t.device.device_id = 0;
  x->t.ndim = ndim;
  x->t.dtype = dt;
  x->t.shape = x->shape;
  x->t.strides = NULL; /* compact row-major: BHSD */
  x->t.byte_offset = 0;
  return 1;
}

static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float f32_of_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Runs the spec once on device 0, on a stream of our own. */
static int run_on_gpu(fj_context *ctx, fj_spec *spec, cuda_api *c) {
  const int64_t shape[4] = {B, H, L, D}, lshape[3] = {B, H, L};
  const DLDataType bf16 = {kDLBfloat, 16, 1}, f32 = {kDLFloat, 32, 1};
  const size_t n = (size_t)B * H * L * D;
  tensor q = {0}, k = {0}, v = {0}, o = {0}, lse = {0};
  void *stream = NULL;
  uint16_t *host = malloc(n * sizeof *host);
  float lse_host[4];
  int ok = 0;
  if (!host) return 0;
  if (!tensor_alloc(c, &q, 4, shape, bf16) ||
      !tensor_alloc(c, &k, 4, shape, bf16) ||
      !tensor_alloc(c, &v, 4, shape, bf16) ||
      !tensor_alloc(c, &o, 4, shape, bf16) ||
      !tensor_alloc(c, &lse, 3, lshape, f32) ||
      c->cuStreamCreate(&stream, 0) != 0) {
    fprintf(stderr, "embed: device allocation failed\n");
    goto fail;
  }
  for (size_t i = 0; i < n; i++) host[i] = bf16_of(sinf(0.37f * (float)i));
  c->cuMemcpyHtoD(q.ptr, host, n * 2);
  for (size_t i = 0; i < n; i++) host[i] = bf16_of(cosf(0.11f * (float)i));
  c->cuMemcpyHtoD(k.ptr, host, n * 2);
  for (size_t i = 0; i < n; i++) host[i] = bf16_of((float)(i % 7) - 3.0f);
  c->cuMemcpyHtoD(v.ptr, host, n * 2);

  fj_arg window = {.name = "window", .i32 = WINDOW};
  fj_forward_args args = {.q = &q.t, .k = &k.t, .v = &v.t, .o = &o.t,
                          .lse = &lse.t, .scale = 0.0f, /* 1/sqrt(D) */
                          .args = &window, .num_args = 1, .stream = stream};
  fj_status st = fj_attention_forward(ctx, spec, &args);
  if (st != FJ_OK) {
    fprintf(stderr, "embed: fj_attention_forward: %s: %s\n", fj_strerror(st),
            fj_context_last_error(ctx));
    goto fail;
  }
  /* The launch is asynchronous: wait for our stream before reading. */
  if (c->cuStreamSynchronize(stream) != 0 ||
      c->cuMemcpyDtoH(host, o.ptr, n * 2) != 0 ||
      c->cuMemcpyDtoH(lse_host, lse.ptr, sizeof lse_host) != 0) {
    fprintf(stderr, "embed: the kernel or a copy failed\n");
    goto fail;
  }
  printf("o[0, 0, 0, :4] = %.4f %.4f %.4f %.4f\n", f32_of_bf16(host[0]),
         f32_of_bf16(host[1]), f32_of_bf16(host[2]), f32_of_bf16(host[3]));
  printf("lse[0, 0, :4]  = %.4f %.4f %.4f %.4f\n", lse_host[0], lse_host[1],
         lse_host[2], lse_host[3]);
  ok = 1;
fail:
  if (stream) c->cuStreamDestroy(stream);
  tensor *all[] = {&q, &k, &v, &o, &lse};
  for (int i = 0; i < 5; i++)
    if (all[i]->ptr) c->cuMemFree(all[i]->ptr);
  free(host);
  return ok;
}

int main(int argc, char **argv) {
  const char *arch = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--arch") && i + 1 < argc) {
      arch = argv[++i];
    } else {
      fprintf(stderr, "usage: embed [--arch sm_80|sm_90a|...]\n");
      return 2;
    }
  }
  cuda_api cuda;
  void *pctx = NULL;
  int gpu = cuda_open(&cuda, &pctx);
  if (!gpu && !arch) arch = "sm_80"; /* nothing to ask: pick a target */

  fj_context_options opts;
  fj_context_options_init(&opts);
  opts.arch = arch; /* NULL: the GPU's own target */
  fj_context *ctx = NULL;
  fj_spec *spec = NULL;
  int rc = 1;
  fj_status st = fj_context_create(&opts, &ctx);
  if (st != FJ_OK) {
    fprintf(stderr, "embed: fj_context_create: %s\n", fj_strerror(st));
    goto done;
  }
  st = fj_spec_load_string(ctx, spec_source, strlen(spec_source),
                           "sliding_window", &spec);
  if (st != FJ_OK) {
    fprintf(stderr, "embed: %s\n", fj_context_last_error(ctx));
    goto done;
  }
  fj_kernel_options kopts = {.head_dim = D, .dtype = FJ_DTYPE_BF16,
                             .arch = NULL};
  fj_kernel_info info;
  st = fj_compile_forward(ctx, spec, &kopts, &info);
  if (st != FJ_OK) {
    fprintf(stderr, "embed: fj_compile_forward: %s\n",
            fj_context_last_error(ctx));
    goto done;
  }
  printf("spec %s: kernel %s for %s, key %s, %s\n", fj_spec_name(spec),
         info.name, info.arch, info.key,
         info.from_cache ? "from cache" : "compiled");
  if (!gpu) {
    printf("no GPU: compiled only\n");
    rc = 0;
    goto done;
  }
  rc = run_on_gpu(ctx, spec, &cuda) ? 0 : 1;
done:
  fj_spec_destroy(spec); /* specs before their context */
  fj_context_destroy(ctx);
  if (gpu) {
    cuda.cuDevicePrimaryCtxRelease(0);
    dlclose(cuda.lib);
  }
  return rc;
}
