/*
 * tests/gpu/gpu_util.h: helpers shared by the GPU tests (header-only; each
 * test is one executable).
 *
 *  - gpu_open: a context with the device ready, or exit(77) (CTest's "skipped")
 *    when there is no driver or no GPU;
 *  - random inputs rounded to the kernel dtype;
 *  - device tensors [B, H, L, D] in BHSD or BSHD (a strided view of a
 *    [B, S, H, D] buffer), NaN poisoning, upload and download;
 *  - runtime values (params, buffers) filled by name for a spec.
 * Uses only flexjit.h, runtime/context.h (for the driver table) and
 * gen/reference.h (for rounding).
 */
#ifndef FJ_TESTS_GPU_UTIL_H
#define FJ_TESTS_GPU_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flexjit.h"
#include "gen/reference.h"
#include "runtime/context.h"

#define GPU_SKIP 77

/* Creates a context and loads the device; exits 77 when there is none. */
static inline fj_context *gpu_open(const fjr_driver **drv) {
  fj_context *ctx = NULL;
  if (fj_context_create(NULL, &ctx) != FJ_OK) {
    fprintf(stderr, "cannot create a context\n");
    exit(1);
  }
  if (fjr_context_device(ctx, drv) != FJ_OK) {
    printf("skipped: no GPU (%s)\n", fj_context_last_error(ctx));
    fj_context_destroy(ctx);
    exit(GPU_SKIP);
  }
  return ctx;
}

static inline int gpu_cu_ok(const fjr_driver *drv, CUresult r,
                            const char *what) {
  char text[256];
  if (r == CUDA_SUCCESS) return 1;
  fjr_driver_error_text(drv, r, text, sizeof text);
  fprintf(stderr, "%s failed: %s\n", what, text);
  return 0;
}

/* ---- random inputs ---- */

static inline uint64_t gpu_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline double gpu_uniform(uint64_t *s) {
  return ((gpu_rand(s) >> 11) + 0.5) * 0x1p-53;
}

static inline double gpu_normal(uint64_t *s) {
  double u = gpu_uniform(s), v = gpu_uniform(s);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* n standard normal values rounded to dtype, as doubles (what the kernel
 * sees, for the reference). */
static inline double *gpu_random_inputs(size_t n, fj_dtype dt, uint64_t *s) {
  double *x = malloc(sizeof(double) * (n ? n : 1));
  if (!x) return NULL;
  for (size_t i = 0; i < n; i++)
    x[i] = fjg_round_to_dtype((float)gpu_normal(s), dt);
  return x;
}

/* ---- device tensors ---- */

typedef struct gpu_tensor {
  CUdeviceptr ptr;
  size_t bytes;
  int64_t shape[4], strides[4];
  DLTensor t;
} gpu_tensor;

static inline void gpu_describe(gpu_tensor *t, int ndim, DLDataType dt) {
  t->t.data = (void *)(uintptr_t)t->ptr;
  t->t.device.device_type = kDLCUDA;
  t->t.device.device_id = 0;
  t->t.ndim = ndim;
  t->t.dtype = dt;
  t->t.shape = t->shape;
  t->t.strides = t->strides;
  t->t.byte_offset = 0;
}

static inline int gpu_alloc(const fjr_driver *drv, gpu_tensor *t,
                            size_t bytes) {
  t->bytes = (bytes + 3) & ~(size_t)3; /* whole words for cuMemsetD32 */
  return gpu_cu_ok(drv, drv->cuMemAlloc(&t->ptr, t->bytes ? t->bytes : 4),
                   "cuMemAlloc");
}

static inline void gpu_free(const fjr_driver *drv, gpu_tensor *t) {
  if (t->ptr) drv->cuMemFree(t->ptr);
  t->ptr = 0;
}

/* Element offset of row (b, h, i) of a [B, H, L, D] tensor. */
static inline size_t gpu_row(int bshd, int H, int L, int D, int b, int h,
                             int i) {
  return bshd ? (((size_t)b * L + i) * H + h) * D
              : (((size_t)b * H + h) * L + i) * D;
}

/* A 16-bit [B, H, L, D] tensor; BSHD is the transposed view of [B, L, H, D]. */
static inline int gpu_alloc_bhld(const fjr_driver *drv, gpu_tensor *t,
                                 fj_dtype dt, int bshd, int B, int H, int L,
                                 int D) {
  int64_t shape[4] = {B, H, L, D};
  int64_t bhsd_s[4] = {(int64_t)H * L * D, (int64_t)L * D, D, 1};
  int64_t bshd_s[4] = {(int64_t)L * H * D, D, (int64_t)H * D, 1};
  DLDataType t16 = {dt == FJ_DTYPE_F16 ? kDLFloat : kDLBfloat, 16, 1};
  memcpy(t->shape, shape, sizeof shape);
  memcpy(t->strides, bshd ? bshd_s : bhsd_s, sizeof bhsd_s);
  if (!gpu_alloc(drv, t, (size_t)B * H * L * D * 2)) return 0;
  gpu_describe(t, 4, t16);
  return 1;
}

static inline int gpu_alloc_lse(const fjr_driver *drv, gpu_tensor *t, int B,
                                int H, int L) {
  int64_t shape[3] = {B, H, L}, strides[3] = {(int64_t)H * L, L, 1};
  memcpy(t->shape, shape, sizeof shape);
  memcpy(t->strides, strides, sizeof strides);
  if (!gpu_alloc(drv, t, (size_t)B * H * L * 4)) return 0;
  gpu_describe(t, 3, (DLDataType){kDLFloat, 32, 1});
  return 1;
}

/* Uploads BHSD doubles (already representable in dt) into the layout. */
static inline int gpu_upload_bhld(const fjr_driver *drv, gpu_tensor *t,
                                  const double *x, fj_dtype dt, int bshd,
                                  int B, int H, int L, int D) {
  uint16_t *h = malloc(t->bytes);
  if (!h) return 0;
  for (int b = 0; b < B; b++)
    for (int hh = 0; hh < H; hh++)
      for (int i = 0; i < L; i++) {
        const double *src = x + gpu_row(0, H, L, D, b, hh, i);
        uint16_t *dst = h + gpu_row(bshd, H, L, D, b, hh, i);
        for (int d = 0; d < D; d++)
          dst[d] = dt == FJ_DTYPE_F16 ? fjg_f32_to_f16((float)src[d])
                                      : fjg_f32_to_bf16((float)src[d]);
      }
  int ok = gpu_cu_ok(drv, drv->cuMemcpyHtoD(t->ptr, h, t->bytes),
                     "cuMemcpyHtoD");
  free(h);
  return ok;
}

/* Downloads into BHSD floats. */
static inline int gpu_download_bhld(const fjr_driver *drv,
                                    const gpu_tensor *t, float *x,
                                    fj_dtype dt, int bshd, int B, int H,
                                    int L, int D) {
  uint16_t *h = malloc(t->bytes);
  if (!h) return 0;
  int ok = gpu_cu_ok(drv, drv->cuMemcpyDtoH(h, t->ptr, t->bytes),
                     "cuMemcpyDtoH");
  for (int b = 0; ok && b < B; b++)
    for (int hh = 0; hh < H; hh++)
      for (int i = 0; i < L; i++) {
        const uint16_t *src = h + gpu_row(bshd, H, L, D, b, hh, i);
        float *dst = x + gpu_row(0, H, L, D, b, hh, i);
        for (int d = 0; d < D; d++)
          dst[d] = dt == FJ_DTYPE_F16 ? fjg_f16_to_f32(src[d])
                                      : fjg_bf16_to_f32(src[d]);
      }
  free(h);
  return ok;
}

/* NaN everywhere: an element the kernel does not write fails the check. */
static inline int gpu_poison(const fjr_driver *drv, gpu_tensor *o,
                             fj_dtype dt, gpu_tensor *lse) {
  unsigned nan16 = dt == FJ_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
  return gpu_cu_ok(drv,
                   drv->cuMemsetD32(o->ptr, nan16 | nan16 << 16, o->bytes / 4),
                   "cuMemsetD32") &&
         (!lse || gpu_cu_ok(drv,
                            drv->cuMemsetD32(lse->ptr, 0x7fc00000u,
                                             lse->bytes / 4),
                            "cuMemsetD32"));
}

/* ---- runtime values ---- */

#define GPU_MAX_ARGS 16

/* The values of one launch: host copies (for the reference) and device
 * buffers (for the kernel), indexed by the spec's argument index. */
typedef struct gpu_values {
  int n;
  fj_arg args[GPU_MAX_ARGS];
  int32_t i32[GPU_MAX_ARGS];
  float f32[GPU_MAX_ARGS];
  void *host[GPU_MAX_ARGS];
  int64_t len[GPU_MAX_ARGS];
  gpu_tensor dev[GPU_MAX_ARGS];
  fjg_env env;
} gpu_values;

/* Default values by name, sized for the problem:
 *  window (i32) 37, prefix (i32) 50, cap (f32) 2.0, any other i32 param 7,
 *  f32 param 0.5; buffers: doc (i32 document ids of random lengths 1..300
 *  over max(Lq, Lk) positions), slopes (f32, Hq of 2^-(h+1)), bias (f32,
 *  Lq + Lk - 1 normal values), any other buffer Lq + Lk random values. */
static inline int gpu_values_fill(const fjr_driver *drv, const fj_spec *spec,
                                  int Hq, int Lq, int Lk, uint64_t *s,
                                  gpu_values *v) {
  const fjg_graph *g = fjr_spec_graph(spec);
  memset(v, 0, sizeof *v);
  v->n = fj_spec_num_args(spec);
  if (v->n > GPU_MAX_ARGS) return 0;
  for (int a = 0; a < v->n; a++) {
    const fjg_arg *d = fjg_arg_at(g, a);
    v->args[a].name = d->name;
    if (d->kind == FJ_ARG_I32) {
      v->i32[a] = !strcmp(d->name, "window") ? 37
                  : !strcmp(d->name, "prefix") ? 50 : 7;
      v->args[a].i32 = v->i32[a];
      continue;
    }
    if (d->kind == FJ_ARG_F32) {
      v->f32[a] = !strcmp(d->name, "cap") ? 2.0f : 0.5f;
      v->args[a].f32 = v->f32[a];
      continue;
    }
    int L = Lq > Lk ? Lq : Lk;
    int64_t n = !strcmp(d->name, "doc") ? L
                : !strcmp(d->name, "slopes") ? Hq
                : !strcmp(d->name, "bias") ? Lq + Lk - 1 : Lq + Lk;
    v->len[a] = n;
    v->host[a] = malloc(4 * (size_t)n);
    if (!v->host[a]) return 0;
    if (d->type == FJG_I32) {
      int32_t *x = v->host[a];
      for (int64_t i = 0, id = 0; i < n; id++) {
        int64_t seg = 1 + (int64_t)(gpu_uniform(s) * 300);
        for (int64_t j = 0; j < seg && i < n; j++) x[i++] = (int32_t)id;
      }
    } else {
      float *x = v->host[a];
      for (int64_t i = 0; i < n; i++)
        x[i] = !strcmp(d->name, "slopes") ? exp2f(-(float)(i + 1))
                                          : (float)gpu_normal(s);
    }
    gpu_tensor *t = &v->dev[a];
    t->shape[0] = n;
    t->strides[0] = 1;
    if (!gpu_alloc(drv, t, 4 * (size_t)n) ||
        !gpu_cu_ok(drv, drv->cuMemcpyHtoD(t->ptr, v->host[a], 4 * (size_t)n),
                   "cuMemcpyHtoD"))
      return 0;
    gpu_describe(t, 1, (DLDataType){d->type == FJG_I32 ? kDLInt : kDLFloat,
                                    32, 1});
    v->args[a].buffer = &t->t;
  }
  v->env.param_i32 = v->i32;
  v->env.param_f32 = v->f32;
  v->env.buffer_data = (const void *const *)v->host;
  v->env.buffer_len = v->len;
  return 1;
}

static inline void gpu_values_free(const fjr_driver *drv, gpu_values *v) {
  for (int a = 0; a < GPU_MAX_ARGS; a++) {
    free(v->host[a]);
    gpu_free(drv, &v->dev[a]);
  }
  memset(v, 0, sizeof *v);
}

#endif /* FJ_TESTS_GPU_UTIL_H */
