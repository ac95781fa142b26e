/*
 * cli/run.c: executes a run_config on the GPU: binds the spec's runtime
 * values, makes inputs, launches fj_attention_forward on NaN-poisoned
 * outputs (and, with --backward, fj_attention_backward on a random dO),
 * and optionally checks against the CPU reference, dumps tensors and
 * benchmarks by triton.testing.do_bench's rules (cli/bench.c).
 *
 * Device memory, copies and events go through the driver table of
 * runtime/driver.h (fjr_context_device), so the command has no link-time
 * dependency on libcuda either.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "cli/random.h"
#include "cli/run_serving.h"
#include "gen/config.h"
#include "gen/interval.h"
#include "gen/reference.h"
#include "runtime/context.h"
#include "runtime/decode.h"
#include "runtime/forward.h"

/* Absolute error floors of the check (see fjg_ref_check): small against
 * the low-precision error of O (~1e-3..1e-2), and a few float32 ulps of a
 * typical LSE (~10) times the accumulation length. */
#define CHECK_FLOOR_O 1e-3
#define CHECK_FLOOR_LSE 1e-3
/* The gradients' floor (gpu/test_backward's). */
#define CHECK_FLOOR_GRAD 1e-3

typedef struct dev_tensor {
  CUdeviceptr ptr;
  size_t bytes;
  int64_t shape[4], strides[4];
  DLTensor t;
} dev_tensor;

typedef struct run_state {
  const run_config *c;
  fj_context *ctx;
  fj_spec *spec;
  const fjg_graph *g;
  const fjr_driver *drv;
  /* Runtime values, indexed by the spec's argument index. */
  int nargs;
  fj_arg args[CLI_MAX_VALUES];
  int32_t pi[CLI_MAX_VALUES];
  float pf[CLI_MAX_VALUES];
  const void *bdata[CLI_MAX_VALUES];
  int64_t blen[CLI_MAX_VALUES];
  /* float64 buffers converted, or buffers generated (owned) */
  float *bconv[CLI_MAX_VALUES];
  dev_tensor bufs[CLI_MAX_VALUES];
  fjg_env env;
  /* Host tensors in BHSD order, holding the values the kernel sees. */
  float *q, *k, *v, *o, *lse;
  size_t nq, nk, nl;
  dev_tensor dq, dk, dv, dout, dlse;
  float scale;
  fj_block_mask *bm; /* NULL: the kernel classifies tiles itself */
  /* --backward: dO (host BHSD and device), the gradients (device, and
   * host BHSD once downloaded), the trainable buffers' gradients. */
  float *g_out, *g_q, *g_k, *g_v;
  dev_tensor d_gout, d_gq, d_gk, d_gv;
  dev_tensor d_grads[CLI_MAX_VALUES];
  float *grads[CLI_MAX_VALUES];
  /* Each sequence's lengths and the serving layouts (cli/run_serving.h);
   * serving: a layout with per-sequence lengths is in use. The device's
   * seqlens_k, block table and cu_seqlens (unallocated when not used). */
  cli_seqs L;
  int serving;
  dev_tensor d_seqlens_k, d_block_table, d_cu_q, d_cu_k;
} run_state;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cu_ok(run_state *s, CUresult r, const char *what) {
  char text[256];
  if (r == CUDA_SUCCESS) return 1;
  fjr_driver_error_text(s->drv, r, text, sizeof text);
  cli_error("run", "%s failed: %s", what, text);
  return 0;
}

/* ---- runtime values ---- */

static const cli_value *find_value(const run_config *c, const char *name) {
  for (int i = 0; i < c->num_values; i++)
    if (!strcmp(c->values[i].name, name)) return &c->values[i];
  return NULL;
}

static int bind_param(run_state *s, int a, const fjg_arg *decl,
                      const cli_value *v) {
  long i;
  double f;
  if (v->is_buffer) {
    cli_error("run", "'%s' is a param of the spec: pass --param %s=VALUE",
              decl->name, decl->name);
    return CLI_USAGE;
  }
  if (decl->kind == FJ_ARG_I32) {
    if (cli_parse_int(v->text, INT32_MIN, INT32_MAX, &i) != 0) {
      cli_error("run", "--param %s: '%s' is not an i32", decl->name, v->text);
      return CLI_USAGE;
    }
    s->pi[a] = (int32_t)i;
    s->args[a].i32 = (int32_t)i;
  } else {
    if (cli_parse_float(v->text, &f) != 0) {
      cli_error("run", "--param %s: '%s' is not an f32", decl->name, v->text);
      return CLI_USAGE;
    }
    s->pf[a] = (float)f;
    s->args[a].f32 = (float)f;
  }
  return -1;
}

static int bind_buffer(run_state *s, int a, const fjg_arg *decl,
                       const cli_value *v) {
  const npy_array *b = &v->buffer;
  if (!v->is_buffer) {
    cli_error("run", "'%s' is a buffer of the spec: pass --buffer %s=FILE.npy",
              decl->name, decl->name);
    return CLI_USAGE;
  }
  if (b->ndim != 1) {
    cli_error("run", "--buffer %s: %s must be 1-D (it has %d dimensions)",
              decl->name, v->text, b->ndim);
    return CLI_USAGE;
  }
  s->bdata[a] = b->data;
  if (decl->type == FJG_I32 && b->dtype != NPY_I32) {
    cli_error("run", "--buffer %s: the spec declares i32 but %s holds '%s'",
              decl->name, v->text, npy_dtype_descr(b->dtype));
    return CLI_USAGE;
  }
  if (decl->type == FJG_F32 && b->dtype == NPY_I32) {
    cli_error("run", "--buffer %s: the spec declares f32 but %s holds '<i4'",
              decl->name, v->text);
    return CLI_USAGE;
  }
  if (decl->type == FJG_F32 && b->dtype == NPY_F64) {
    if (!(s->bconv[a] = npy_to_f32(b))) return CLI_FAIL;
    s->bdata[a] = s->bconv[a];
  }
  s->blen[a] = (int64_t)b->count;
  return -1;
}

/* Standard normal values rounded to dt, from the next seed of *st. */
static void fill_normal(float *x, size_t n, uint64_t *st, fj_dtype dt) {
  cli_fill_normal(x, n, cli_splitmix64(st), dt, 0);
}

/* A buffer the command line does not give is generated, so that every
 * example runs as it is: max(Lq + q offset, Lk + kv offset) values (one a
 * position of the whole sequence), i32 ones as document ids (runs
 * of Lmax/16 .. Lmax/2 positions, as in the benchmarks), f32 ones standard
 * normal. It says so unless --quiet. */
static int generate_buffer(run_state *s, int a, const fjg_arg *decl) {
  const run_config *c = s->c;
  const size_t nq = (size_t)c->Lq + (size_t)c->q_offset, nk = (size_t)c->Lk + (size_t)c->kv_offset;
  size_t n = nq > nk ? nq : nk;
  float *data = malloc(n * sizeof(float)); /* 4 bytes: int32 or float */
  if (!data) {
    cli_error("run", "out of host memory for buffer '%s'", decl->name);
    return CLI_FAIL;
  }
  uint64_t st = c->seed * 0x9e3779b97f4a7c15ull + 7 + (uint64_t)a;
  if (decl->type == FJG_I32) {
    int32_t *ids = (int32_t *)data, doc = 0;
    size_t lo = n / 16 > 0 ? n / 16 : 1, span = n / 2 > lo ? n / 2 - lo : 1;
    for (size_t i = 0; i < n;) {
      size_t len = lo + cli_splitmix64(&st) % span;
      for (size_t j = 0; j < len && i < n; j++) ids[i++] = doc;
      doc++;
    }
    if (!c->quiet)
      printf("buffer  %s: generated document ids (%d documents over %zu "
             "positions); --buffer %s=FILE.npy to choose\n",
             decl->name, (int)doc, n, decl->name);
  } else {
    fill_normal(data, n, &st, FJ_DTYPE_BF16);
    if (!c->quiet)
      printf("buffer  %s: generated %zu standard normal values; --buffer "
             "%s=FILE.npy to choose\n",
             decl->name, n, decl->name);
  }
  s->bconv[a] = data;
  s->bdata[a] = data;
  s->blen[a] = (int64_t)n;
  return -1;
}

/* Matches --param/--buffer values with what the spec declares; every
 * declared param must be given (buffers are generated when not) and every
 * given value declared. */
static int bind_values(run_state *s) {
  const run_config *c = s->c;
  s->nargs = fj_spec_num_args(s->spec);
  if (s->nargs > CLI_MAX_VALUES) {
    cli_error("run", "spec declares more than %d values", CLI_MAX_VALUES);
    return CLI_FAIL;
  }
  for (int a = 0; a < s->nargs; a++) {
    const fjg_arg *decl = fjg_arg_at(s->g, a);
    const cli_value *v = find_value(c, decl->name);
    int buf = decl->kind == FJ_ARG_BUFFER, rc;
    if (!v && buf) {
      s->args[a].name = decl->name;
      if ((rc = generate_buffer(s, a, decl)) >= 0) return rc;
      continue;
    }
    if (!v) {
      cli_error("run",
                "spec '%s' declares %s '%s' (%s): pass %s %s=%s",
                fj_spec_name(s->spec), buf ? "buffer" : "param", decl->name,
                fjg_type_name(decl->type), buf ? "--buffer" : "--param",
                decl->name, buf ? "FILE.npy" : "VALUE");
      return CLI_USAGE;
    }
    s->args[a].name = decl->name;
    rc = buf ? bind_buffer(s, a, decl, v) : bind_param(s, a, decl, v);
    if (rc >= 0) return rc;
  }
  for (int i = 0; i < c->num_values; i++)
    if (fjg_find_arg(s->g, c->values[i].name) < 0) {
      cli_error("run", "spec '%s' declares no param or buffer named '%s'",
                fj_spec_name(s->spec), c->values[i].name);
      return CLI_USAGE;
    }
  s->env.param_i32 = s->pi;
  s->env.param_f32 = s->pf;
  s->env.buffer_data = s->bdata;
  s->env.buffer_len = s->blen;
  s->env.q_off = c->q_offset, s->env.kv_off = c->kv_offset; /* the reference's too */
  return -1;
}

/* ---- host inputs ---- */

/* The shape of the host q (is_q) or k and v: [B, H, L, D], or with
 * --varlen the packed [total, H, D]. Returns the dimension count. */
static int host_shape(const run_state *s, int is_q, int64_t *shape) {
  const run_config *c = s->c;
  const int H = is_q ? c->Hq : c->Hkv;
  if (s->L.varlen) {
    shape[0] = is_q ? s->L.total_q : s->L.total_k, shape[1] = H, shape[2] = c->D;
    return 3;
  }
  shape[0] = c->B, shape[1] = H, shape[2] = is_q ? c->Lq : c->Lk;
  shape[3] = c->D;
  return 4;
}

static int read_input(run_state *s, const char *name, int is_q, float **out) {
  const run_config *c = s->c;
  char path[4096], err[512], want_text[128];
  npy_array a;
  int64_t want[4];
  int nd = host_shape(s, is_q, want);
  snprintf(path, sizeof path, "%s/%s.npy", c->inputs_dir, name);
  if (npy_read(path, &a, err, sizeof err) != 0) {
    cli_error("run", "--inputs: %s", err);
    return CLI_FAIL;
  }
  int ok = a.ndim == nd;
  for (int i = 0; ok && i < nd; i++) ok = a.shape[i] == want[i];
  if (!ok) {
    int at = snprintf(want_text, sizeof want_text, "[");
    for (int i = 0; i < nd; i++)
      at += snprintf(want_text + at, sizeof want_text - (size_t)at, "%s%lld",
                     i ? ", " : "", (long long)want[i]);
    snprintf(want_text + at, sizeof want_text - (size_t)at, "]");
    cli_error("run", "--inputs: %s must have shape %s%s", path, want_text,
              s->L.varlen ? " (--varlen packs the sequences' tokens)" : "");
    npy_free(&a);
    return CLI_USAGE;
  }
  size_t n = a.count;
  *out = npy_to_f32(&a);
  npy_free(&a);
  if (!*out) return CLI_FAIL;
  for (size_t i = 0; i < n; i++)
    (*out)[i] = fjg_round_to_dtype((*out)[i], c->dtype);
  return -1;
}

static int make_inputs(run_state *s) {
  const run_config *c = s->c;
  s->nq = cli_seqs_nq(&s->L, c);
  s->nk = cli_seqs_nk(&s->L, c);
  s->nl = cli_seqs_nl(&s->L, c);
  if (c->inputs_dir) {
    int rc;
    if ((rc = read_input(s, "q", 1, &s->q)) >= 0 ||
        (rc = read_input(s, "k", 0, &s->k)) >= 0 ||
        (rc = read_input(s, "v", 0, &s->v)) >= 0)
      return rc;
    return -1;
  }
  uint64_t st = c->seed * 0x2545f4914f6cdd1dull + 1;
  s->q = malloc(sizeof(float) * s->nq);
  s->k = malloc(sizeof(float) * s->nk);
  s->v = malloc(sizeof(float) * s->nk);
  if (!s->q || !s->k || !s->v) {
    cli_error("run", "out of host memory for the inputs");
    return CLI_FAIL;
  }
  fill_normal(s->q, s->nq, &st, c->dtype);
  fill_normal(s->k, s->nk, &st, c->dtype);
  fill_normal(s->v, s->nk, &st, c->dtype);
  return -1;
}

/* ---- device tensors ---- */

/* Element offset of row (b, h, i) in the device layout. */
static size_t dev_row(int bshd, int H, int L, int D, int b, int h, int i) {
  return bshd ? (((size_t)b * L + i) * H + h) * D
              : (((size_t)b * H + h) * L + i) * D;
}

static void describe(dev_tensor *t, int ndim, DLDataType dt, int device) {
  t->t.data = (void *)(uintptr_t)t->ptr;
  t->t.device.device_type = kDLCUDA;
  t->t.device.device_id = device;
  t->t.ndim = ndim;
  t->t.dtype = dt;
  t->t.shape = t->shape;
  t->t.strides = t->strides;
  t->t.byte_offset = 0;
}

static int dev_alloc(run_state *s, dev_tensor *t, size_t bytes) {
  t->bytes = (bytes + 3) & ~(size_t)3; /* whole words, for cuMemsetD32 */
  return cu_ok(s, s->drv->cuMemAlloc(&t->ptr, t->bytes ? t->bytes : 4),
               "cuMemAlloc");
}

/* A [B, H, L, D] 16-bit tensor in the configured layout. */
static int dev_qkvo(run_state *s, dev_tensor *t, int H, int L) {
  const run_config *c = s->c;
  int64_t B = c->B, D = c->D;
  int64_t shape[4] = {B, H, L, D};
  int64_t bhsd[4] = {H * L * D, L * D, D, 1};
  int64_t bshd[4] = {L * H * D, D, H * D, 1};
  DLDataType dt = {c->dtype == FJ_DTYPE_F16 ? kDLFloat : kDLBfloat, 16, 1};
  memcpy(t->shape, shape, sizeof shape);
  memcpy(t->strides, c->bshd ? bshd : bhsd, sizeof bhsd);
  if (!dev_alloc(s, t, (size_t)(B * H * L * D) * 2)) return 0;
  describe(t, 4, dt, 0);
  return 1;
}

static uint16_t to_bits(float x, fj_dtype dt) {
  return dt == FJ_DTYPE_F16 ? fjg_f32_to_f16(x) : fjg_f32_to_bf16(x);
}

static float from_bits(uint16_t x, fj_dtype dt) {
  return dt == FJ_DTYPE_F16 ? fjg_f16_to_f32(x) : fjg_bf16_to_f32(x);
}

static int upload(run_state *s, dev_tensor *t, const float *x, int H, int L) {
  const run_config *c = s->c;
  uint16_t *h = malloc(t->bytes);
  if (!h) return 0;
  for (int b = 0; b < c->B; b++)
    for (int hh = 0; hh < H; hh++)
      for (int i = 0; i < L; i++) {
        const float *src = x + dev_row(0, H, L, c->D, b, hh, i);
        uint16_t *dst = h + dev_row(c->bshd, H, L, c->D, b, hh, i);
        for (int d = 0; d < c->D; d++) dst[d] = to_bits(src[d], c->dtype);
      }
  int ok = cu_ok(s, s->drv->cuMemcpyHtoD(t->ptr, h, t->bytes), "cuMemcpyHtoD");
  free(h);
  return ok;
}

static int upload_buffers(run_state *s) {
  for (int a = 0; a < s->nargs; a++) {
    const fjg_arg *decl = fjg_arg_at(s->g, a);
    dev_tensor *t = &s->bufs[a];
    if (decl->kind != FJ_ARG_BUFFER) continue;
    DLDataType dt = {decl->type == FJG_I32 ? kDLInt : kDLFloat, 32, 1};
    t->shape[0] = s->blen[a] > 0 ? s->blen[a] : 1;
    t->strides[0] = 1;
    if (!dev_alloc(s, t, (size_t)t->shape[0] * 4)) return 0;
    if (s->blen[a] > 0 &&
        !cu_ok(s, s->drv->cuMemcpyHtoD(t->ptr, s->bdata[a], s->blen[a] * 4),
               "cuMemcpyHtoD"))
      return 0;
    describe(t, 1, dt, 0);
    s->args[a].buffer = &t->t;
  }
  return 1;
}

/* A contiguous tensor of `shape` (at most 4 dimensions) and dtype dt,
 * holding x (host values in that order; NULL: left unset): 16-bit floats
 * converted from float x, or int32 and float32 copied as they are. */
static int dev_dense(run_state *s, dev_tensor *t, int ndim,
                     const int64_t *shape, DLDataType dt, const void *x) {
  size_t n = 1, esz = dt.bits / 8;
  for (int i = ndim - 1; i >= 0; i--) {
    t->shape[i] = shape[i];
    t->strides[i] = (int64_t)n;
    n *= (size_t)shape[i];
  }
  if (!dev_alloc(s, t, n * esz)) return 0;
  describe(t, ndim, dt, 0);
  if (!x || !n) return 1;
  if (esz != 2)
    return cu_ok(s, s->drv->cuMemcpyHtoD(t->ptr, x, n * esz), "cuMemcpyHtoD");
  uint16_t *h = malloc(n * 2);
  if (!h) {
    cli_error("run", "out of host memory for an upload");
    return 0;
  }
  for (size_t i = 0; i < n; i++) h[i] = to_bits(((const float *)x)[i], s->c->dtype);
  int ok = cu_ok(s, s->drv->cuMemcpyHtoD(t->ptr, h, n * 2), "cuMemcpyHtoD");
  free(h);
  return ok;
}

/* K or V as page pools [num_pages, page_size, Hkv, D] (cli/run_serving.h). */
static int dev_pool(run_state *s, dev_tensor *t, const float *x, DLDataType dt) {
  const run_config *c = s->c;
  size_t n = cli_seqs_pool_elems(&s->L, c);
  float *pool = malloc(sizeof(float) * (n ? n : 1));
  if (!pool) {
    cli_error("run", "out of host memory for the page pools");
    return 0;
  }
  cli_seqs_fill_pool(&s->L, c, x, pool);
  int64_t shape[4] = {s->L.num_pages, s->L.page_size, c->Hkv, c->D};
  int ok = dev_dense(s, t, 4, shape, dt, pool);
  free(pool);
  return ok;
}

/* The serving layouts' extra tensors: seqlens_k, the block table and
 * cu_seqlens, where the run uses them. */
static int setup_serving(run_state *s) {
  const cli_seqs *L = &s->L;
  const DLDataType i32 = {kDLInt, 32, 1};
  int64_t n = L->n, n1 = L->n + 1, bt[2] = {L->n, L->max_pages};
  if (L->per_seq_k && !dev_dense(s, &s->d_seqlens_k, 1, &n, i32, L->lk)) return 0;
  if (L->page_size && !dev_dense(s, &s->d_block_table, 2, bt, i32, L->block_table))
    return 0;
  if (L->varlen && !dev_dense(s, &s->d_cu_q, 1, &n1, i32, L->cu_q)) return 0;
  if (L->varlen && !L->page_size && !dev_dense(s, &s->d_cu_k, 1, &n1, i32, L->cu_k))
    return 0;
  return 1;
}

static int setup_device(run_state *s) {
  const run_config *c = s->c;
  const DLDataType dt = {c->dtype == FJ_DTYPE_F16 ? kDLFloat : kDLBfloat, 16, 1};
  const DLDataType f32 = {kDLFloat, 32, 1};
  if (s->L.varlen) {
    int64_t qs[3] = {s->L.total_q, c->Hq, c->D}, ks[3] = {s->L.total_k, c->Hkv, c->D};
    int64_t ls[2] = {c->Hq, s->L.total_q};
    if (!dev_dense(s, &s->dq, 3, qs, dt, s->q) || !dev_dense(s, &s->dout, 3, qs, dt, NULL) ||
        !dev_dense(s, &s->dlse, 2, ls, f32, NULL))
      return 0;
    if (!s->L.page_size &&
        (!dev_dense(s, &s->dk, 3, ks, dt, s->k) || !dev_dense(s, &s->dv, 3, ks, dt, s->v)))
      return 0;
  } else {
    if (!dev_qkvo(s, &s->dq, c->Hq, c->Lq) || !dev_qkvo(s, &s->dout, c->Hq, c->Lq) ||
        !upload(s, &s->dq, s->q, c->Hq, c->Lq))
      return 0;
    int64_t ls[3] = {c->B, c->Hq, c->Lq};
    if (!dev_dense(s, &s->dlse, 3, ls, f32, NULL)) return 0;
    if (!s->L.page_size &&
        (!dev_qkvo(s, &s->dk, c->Hkv, c->Lk) || !dev_qkvo(s, &s->dv, c->Hkv, c->Lk) ||
         !upload(s, &s->dk, s->k, c->Hkv, c->Lk) || !upload(s, &s->dv, s->v, c->Hkv, c->Lk)))
      return 0;
  }
  if (s->L.page_size && (!dev_pool(s, &s->dk, s->k, dt) || !dev_pool(s, &s->dv, s->v, dt)))
    return 0;
  return setup_serving(s) && upload_buffers(s);
}

static void free_device(run_state *s) {
  dev_tensor *all[] = {&s->dq,   &s->dk,   &s->dv,   &s->dout, &s->dlse,
                       &s->d_gout, &s->d_gq, &s->d_gk, &s->d_gv,
                       &s->d_seqlens_k, &s->d_block_table, &s->d_cu_q, &s->d_cu_k};
  if (!s->drv) return;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]->ptr) s->drv->cuMemFree(all[i]->ptr);
  for (int a = 0; a < CLI_MAX_VALUES; a++) {
    if (s->bufs[a].ptr) s->drv->cuMemFree(s->bufs[a].ptr);
    if (s->d_grads[a].ptr) s->drv->cuMemFree(s->d_grads[a].ptr);
  }
}

/* ---- launching ---- */

/* NaN in every output element, so an element the kernel never writes
 * cannot pass the check. */
static int poison(run_state *s) {
  unsigned nan16 = s->c->dtype == FJ_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
  return cu_ok(s, s->drv->cuMemsetD32(s->dout.ptr, nan16 | nan16 << 16,
                                      s->dout.bytes / 4),
               "cuMemsetD32") &&
         cu_ok(s, s->drv->cuMemsetD32(s->dlse.ptr, 0x7fc00000u,
                                      s->dlse.bytes / 4),
               "cuMemsetD32");
}

/* The forward's arguments for this run's device tensors and options. */
static fj_forward_args forward_args(const run_state *s) {
  fj_forward_args a;
  memset(&a, 0, sizeof a);
  a.q = &s->dq.t, a.k = &s->dk.t, a.v = &s->dv.t;
  a.o = &s->dout.t, a.lse = &s->dlse.t;
  a.scale = (float)s->c->scale;
  a.args = s->args, a.num_args = s->nargs;
  a.stream = NULL;
  a.block_mask = s->bm;
  a.seqlens_k = s->d_seqlens_k.ptr ? &s->d_seqlens_k.t : NULL;
  a.block_table = s->d_block_table.ptr ? &s->d_block_table.t : NULL;
  a.cu_seqlens_q = s->d_cu_q.ptr ? &s->d_cu_q.t : NULL;
  a.cu_seqlens_k = s->d_cu_k.ptr ? &s->d_cu_k.t : NULL;
  if (s->L.varlen) a.max_seqlen_q = s->L.max_q, a.max_seqlen_k = s->L.max_k;
  a.skip_softmax_threshold = (float)s->c->skip_softmax;
  a.q_offset = s->c->q_offset, a.kv_offset = s->c->kv_offset;
  return a;
}

static int launch(run_state *s) {
  const fj_forward_args a = forward_args(s);
  if (fj_attention_forward(s->ctx, s->spec, &a) != FJ_OK) {
    cli_error("run", "%s", fj_context_last_error(s->ctx));
    return 0;
  }
  return 1;
}

/* A [B, H, L, D] 16-bit device tensor into BHSD floats (malloc'd). */
static float *download_bhld(run_state *s, const dev_tensor *t, int H, int L) {
  const run_config *c = s->c;
  uint16_t *h = malloc(t->bytes);
  float *x = malloc(sizeof(float) * (size_t)c->B * H * L * c->D + 1);
  int ok = h && x && cu_ok(s, s->drv->cuMemcpyDtoH(h, t->ptr, t->bytes), "cuMemcpyDtoH");
  for (int b = 0; ok && b < c->B; b++)
    for (int hh = 0; hh < H; hh++)
      for (int i = 0; i < L; i++) {
        const uint16_t *src = h + dev_row(c->bshd, H, L, c->D, b, hh, i);
        float *dst = x + dev_row(0, H, L, c->D, b, hh, i);
        for (int d = 0; d < c->D; d++) dst[d] = from_bits(src[d], c->dtype);
      }
  free(h);
  if (!ok) free(x);
  return ok ? x : NULL;
}

/* A packed 16-bit tensor of n elements into floats, in its own order. */
static float *download_packed(run_state *s, const dev_tensor *t, size_t n) {
  uint16_t *h = malloc(2 * n + 2);
  float *x = malloc(sizeof(float) * n + 4);
  int ok = h && x && cu_ok(s, s->drv->cuMemcpyDtoH(h, t->ptr, 2 * n), "cuMemcpyDtoH");
  for (size_t i = 0; ok && i < n; i++) x[i] = from_bits(h[i], s->c->dtype);
  free(h);
  if (!ok) free(x);
  return ok ? x : NULL;
}

static int download(run_state *s) {
  s->o = s->L.varlen ? download_packed(s, &s->dout, s->nq)
                     : download_bhld(s, &s->dout, s->c->Hq, s->c->Lq);
  s->lse = malloc(sizeof(float) * (s->nl ? s->nl : 1));
  return s->o && s->lse &&
         cu_ok(s, s->drv->cuMemcpyDtoH(s->lse, s->dlse.ptr, s->nl * 4), "cuMemcpyDtoH");
}

/* Compiles up front so the output says whether NVRTC ran. */
static int report_kernel(run_state *s) {
  fj_kernel_options ko = {.head_dim = s->c->D, .dtype = s->c->dtype};
  fj_block_mask_info bmi; /* the launch picks the kernel its blocks fit */
  if (s->bm && fj_block_mask_get_info(s->bm, &bmi) == FJ_OK)
    ko.block_mask_block_q = bmi.block_q;
  /* What the launch runs: the decode kernel (runtime/decode.c's rule), else
   * the forward's variant for its layouts and Skip Softmax. */
  const fj_forward_args a = forward_args(s);
  ko.varlen = a.seqlens_k || a.block_table || a.cu_seqlens_q;
  ko.skip_softmax = a.skip_softmax_threshold > 0.0f;
  ko.long_rows = fjr_forward_long_rows(s->ctx, s->spec, &a);
  fj_kernel_info info;
  if ((fjr_decode_applies(&a) ? fj_compile_decode : fj_compile_forward)(s->ctx, s->spec, &ko,
                                                                        &info) != FJ_OK) {
    cli_error("run", "%s", fj_context_last_error(s->ctx));
    return 0;
  }
  if (s->c->quiet) return 1;
  printf("kernel  %s [%s] %s\n", info.name, info.key,
         info.from_cache ? "from cache" : "compiled");
  if (!info.from_cache) printf("        NVRTC %.1f ms\n", info.compile_ms);
  return 1;
}

/* ---- block mask ---- */

/* Builds the block mask when --block-mask says so (auto: the mask reads
 * buffers, so the kernel cannot classify tiles from indices). It is
 * broadcast over batch and heads unless the mask reads b or h. */
static int build_block_mask(run_state *s) {
  const run_config *c = s->c;
  const unsigned deps = fj_spec_mask_deps(s->spec);
  if (c->block_mask == CLI_BM_OFF || fjg_mask_root(s->g) < 0 || s->serving ||
      (c->block_mask == CLI_BM_AUTO && !(deps & FJ_MASK_READS_BUFFER)))
    return 1;
  fj_block_mask_options o;
  fj_block_mask_options_init(&o);
  o.B = deps & FJ_MASK_READS_B ? c->B : 1;
  o.H = deps & FJ_MASK_READS_H ? c->Hq : 1;
  o.q_len = c->Lq, o.kv_len = c->Lk;
  o.q_offset = c->q_offset, o.kv_offset = c->kv_offset;
  o.args = s->args, o.num_args = s->nargs;
  if (fj_block_mask_build(s->ctx, s->spec, &o, &s->bm) != FJ_OK) {
    cli_error("run", "block mask: %s", fj_context_last_error(s->ctx));
    return 0;
  }
  if (!c->quiet) {
    fj_block_mask_info i;
    fj_block_mask_get_info(s->bm, &i);
    printf("blockmask B=%d H=%d, %d x %d blocks of %d x %d\n", i.B, i.H,
           i.num_q_blocks, i.num_kv_blocks, i.block_q, i.block_kv);
  }
  return 1;
}

/* ---- check, dump, bench ---- */

static fjg_ref_problem ref_problem(const run_state *s) {
  const run_config *c = s->c;
  fjg_ref_problem p = {c->B,  c->Hq, c->Hkv, c->Lq,    c->Lk,
                       c->D,  s->scale, s->g, &s->env, 0, 0};
  return p;
}

static double *to_double(const float *x, size_t n) {
  double *d = malloc(sizeof(double) * (n ? n : 1));
  if (d)
    for (size_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

static void print_check(const run_state *s, const char *what,
                        const fjg_check_report *r, const double *ref,
                        const float *out) {
  const char *dt = s->c->dtype == FJ_DTYPE_F16 ? "fp16" : "bf16";
  printf("check %-4s max err %.3e (%s emulation %.3e, tolerance %.3e)  "
         "rel L2 %.3e (emulation %.3e)  %s\n",
         what, r->max_err, dt, r->max_err_lowp, r->tolerance, r->rel_l2,
         r->rel_l2_lowp, r->pass ? "PASS" : "FAIL");
  if (r->pass) return;
  if (r->nonfinite)
    printf("      %zu NaN/Inf values where the reference is finite\n",
           r->nonfinite);
  if (r->inf_mismatch)
    printf("      %zu rows not -inf where the reference is -inf\n",
           r->inf_mismatch);
  if (r->zero_mismatch)
    printf("      %zu values of fully masked rows are not 0\n",
           r->zero_mismatch);
  if (r->max_err > r->tolerance)
    printf("      worst at flat index %zu: got %.6g, reference %.6g\n",
           r->worst, out[r->worst], ref[r->worst]);
}

/* --skip-softmax: the error against exact attention, reported; only what
 * no threshold excuses fails (NaN or Inf where the reference is finite, a
 * fully masked row's LSE not -inf or its output not 0). */
static int print_skip_check(const run_state *s, const char *what,
                            const fjg_check_report *r) {
  int pass = !r->nonfinite && !r->inf_mismatch && !r->zero_mismatch;
  printf("check %-4s skip softmax %g: max err %.3e, rel L2 %.3e against exact "
         "attention (float64); exact kernels' tolerance %.3e: %s  %s\n",
         what, s->c->skip_softmax, r->max_err, r->rel_l2, r->tolerance,
         r->max_err <= r->tolerance ? "within" : "beyond",
         pass ? "PASS" : "FAIL");
  if (r->nonfinite)
    printf("      %zu NaN/Inf values where the reference is finite\n", r->nonfinite);
  if (r->inf_mismatch)
    printf("      %zu rows not -inf where the reference is -inf\n", r->inf_mismatch);
  if (r->zero_mismatch)
    printf("      %zu values of fully masked rows are not 0\n", r->zero_mismatch);
  return pass;
}

/* The float64 reference of the whole problem, or of each sequence at its
 * own lengths (serving layouts); skip_o and skip_l: the rows the CPU cannot
 * decide, per row of o and per LSE value. 0 on failure (said). */
static int reference(run_state *s, const double *q, const double *k,
                     const double *v, double *ro, double *rl, float *lo,
                     float *ll, uint8_t *skip_o, uint8_t *skip_l) {
  char err[256];
  if (s->serving) {
    if (cli_seqs_reference(&s->L, s->c, s->g, &s->env, s->scale, s->q, s->k,
                           s->v, ro, lo, rl, ll, skip_o, skip_l, err,
                           sizeof err) == 0)
      return 1;
    cli_error("run", "%s", err);
    return 0;
  }
  fjg_ref_problem p = ref_problem(s);
  int64_t uncertain = fjg_reference_uncertain_rows(&p, skip_o);
  if (fjg_reference_dense(&p, q, k, v, ro, rl) != FJ_OK ||
      fjg_reference_lowp(&p, s->c->dtype, q, k, v, lo, ll) != FJ_OK ||
      uncertain < 0) {
    cli_error("run", "the CPU reference failed (out of memory?)");
    return 0;
  }
  memcpy(skip_l, skip_o, s->nl); /* the same rows, the same order */
  return 1;
}

static int check(run_state *s, int *pass) {
  /* The serving reference reads the float inputs itself. */
  double *q = s->serving ? NULL : to_double(s->q, s->nq);
  double *k = s->serving ? NULL : to_double(s->k, s->nk);
  double *v = s->serving ? NULL : to_double(s->v, s->nk);
  double *ro = malloc(sizeof(double) * (s->nq ? s->nq : 1));
  double *rl = malloc(sizeof(double) * (s->nl ? s->nl : 1));
  float *lo = malloc(sizeof(float) * (s->nq ? s->nq : 1));
  float *ll = malloc(sizeof(float) * (s->nl ? s->nl : 1));
  uint8_t *skip_o = calloc(s->nl ? s->nl : 1, 1);
  uint8_t *skip_l = calloc(s->nl ? s->nl : 1, 1);
  int ok = 0;
  double t0 = now_s();
  fjg_check_report ro_rep, rl_rep;
  if ((!s->serving && (!q || !k || !v)) || !ro || !rl || !lo || !ll || !skip_o ||
      !skip_l) {
    cli_error("run", "out of host memory for the reference");
    goto fail;
  }
  if (!reference(s, q, k, v, ro, rl, lo, ll, skip_o, skip_l)) goto fail;
  size_t uncertain = 0;
  for (size_t r = 0; r < s->nl; r++) uncertain += skip_o[r];
  /* Rows where the kernel's float32 exp/log/tanh may decide the mask either
   * way are not compared (docs/precision.md). */
  if (uncertain)
    printf("check: %zu of %zu rows not compared: their mask or score_mod has "
           "elements the CPU cannot decide the kernel's way\n",
           uncertain, s->nl);
  int po = fjg_ref_check_rows(ro, lo, s->o, s->nq, (size_t)s->c->D, skip_o,
                              CHECK_FLOOR_O, &ro_rep);
  int pl = fjg_ref_check_rows(rl, ll, s->lse, s->nl, 1, skip_l, CHECK_FLOOR_LSE,
                              &rl_rep);
  if (s->c->skip_softmax > 0) {
    po = print_skip_check(s, "o", &ro_rep);
    pl = print_skip_check(s, "lse", &rl_rep);
  } else {
    print_check(s, "o", &ro_rep, ro, s->o);
    print_check(s, "lse", &rl_rep, rl, s->lse);
  }
  *pass = po && pl;
  printf("check: %s (reference %.1f s on the CPU%s)\n", *pass ? "PASS" : "FAIL",
         now_s() - t0, s->serving ? ", each sequence at its own lengths" : "");
  ok = 1;
fail:
  free(q), free(k), free(v), free(ro), free(rl), free(lo), free(ll);
  free(skip_o), free(skip_l);
  return ok;
}

static int dump_one(const char *dir, const char *name, const float *x,
                    int ndim, const int64_t *shape) {
  char path[4096], err[512];
  snprintf(path, sizeof path, "%s/%s.npy", dir, name);
  if (npy_write(path, NPY_F32, x, ndim, shape, err, sizeof err) == 0) return 1;
  cli_error("run", "--dump: %s", err);
  return 0;
}

static int dump(run_state *s) {
  const run_config *c = s->c;
  const char *dir = c->dump_dir;
  /* The host layouts: [B, H, L, D] and lse [B, Hq, Lq], or packed [total,
   * H, D] and lse [Hq, total_q] (--varlen). K and V are the logical ones,
   * never the page pools. */
  int64_t qs[4], ks[4], ls[3];
  int qd = host_shape(s, 1, qs), kd = host_shape(s, 0, ks), ld = 3;
  if (s->L.varlen)
    ls[0] = c->Hq, ls[1] = s->L.total_q, ld = 2;
  else
    ls[0] = c->B, ls[1] = c->Hq, ls[2] = c->Lq;
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    cli_error("run", "--dump: cannot create %s: %s", dir, strerror(errno));
    return 0;
  }
  return dump_one(dir, "q", s->q, qd, qs) && dump_one(dir, "k", s->k, kd, ks) &&
         dump_one(dir, "v", s->v, kd, ks) && dump_one(dir, "o", s->o, qd, qs) &&
         dump_one(dir, "lse", s->lse, ld, ls);
}

static int launch_call(void *s) { return launch(s); }

/* Rebuilding the block mask (both builder kernels): what a trainer pays per
 * batch of new document ids. */
static int rebuild_block_mask(void *arg) {
  run_state *s = arg;
  if (fj_block_mask_update(s->bm, s->args, s->nargs, NULL) == FJ_OK) return 1;
  cli_error("run", "block mask: %s", fj_context_last_error(s->ctx));
  return 0;
}

/* Launches and block-mask rebuilds are timed by triton.testing.do_bench's
 * rules (cli/bench.h), as bench/compare.py times PyTorch: the outputs are
 * not poisoned here (the launch --check read was). FLOPs = 4 * D *
 * (allowed (b, h, q, kv) quadruples); tiles that interval analysis proves
 * full or empty are counted without evaluating the mask. */
static int bench(run_state *s) {
  const run_config *c = s->c;
  cli_bench_options o = {c->warmup_ms, c->rep_ms, c->warmup, c->iters};
  cli_bench_result r;
  char method[512];
  if (!cli_bench_run(s->drv, "run", launch_call, s, &o, &r)) return 0;
  fjg_ref_problem p = ref_problem(s);
  /* Serving layouts: each sequence's pairs at its own lengths, out of its
   * own lq x lk. */
  int64_t pairs = s->serving ? cli_seqs_pairs(&s->L, c, s->g, &s->env)
                             : fjg_reference_count_allowed(&p);
  double all = 0;
  for (int b = 0; b < s->L.n; b++) all += (double)c->Hq * s->L.lq[b] * s->L.lk[b];
  if (pairs < 0) {
    cli_error("run", "counting the allowed pairs failed (out of memory?)");
    return 0;
  }
  double tflops = 4.0 * c->D * (double)pairs / (r.median_ms * 1e-3) / 1e12;
  cli_bench_describe(&o, &r, method, sizeof method);
  printf("bench   %s\n", method);
  printf("bench: %.4f ms median of %d launches (min %.4f ms, max %.4f ms), "
         "%.1f TFLOP/s, %.2f%% of pairs allowed\n",
         r.median_ms, r.n_repeat, r.min_ms, r.max_ms, tflops,
         all > 0 ? 100.0 * (double)pairs / all : 0.0);
  if (s->L.max_q <= FJ_DECODE_MAX_Q) {
    /* Decode is bound by reading K and V: each sequence's attended kv
     * positions, once per KV head, K and V, 2-byte elements. */
    int64_t rows = cli_seqs_kv_read(&s->L, c, s->g, &s->env);
    if (rows < 0) {
      cli_error("run", "counting the kv positions read failed (out of memory?)");
      return 0;
    }
    double bytes = (double)rows * c->Hkv * c->D * 2.0 * 2.0;
    printf("bench kv: %.0f bytes of K and V (%lld kv positions x Hkv %d x D %d "
           "x 2 x 2 bytes), %.3f TB/s\n",
           bytes, (long long)rows, c->Hkv, c->D,
           bytes / (r.median_ms * 1e-3) / 1e12);
  }
  if (!s->bm) return 1;
  if (!cli_bench_run(s->drv, "run", rebuild_block_mask, s, &o, &r)) return 0;
  cli_bench_describe(&o, &r, method, sizeof method);
  printf("block-mask build: %.4f ms median of %d (min %.4f ms, max %.4f ms); "
         "%s\n",
         r.median_ms, r.n_repeat, r.min_ms, r.max_ms, method);
  return 1;
}

/* ---- the backward pass (--backward) ---- */

/* dO (random normal, rounded to the dtype), the gradients' outputs and a
 * zeroed fp32 gradient for every trainable buffer. */
static int bwd_setup(run_state *s) {
  const run_config *c = s->c;
  uint64_t st = c->seed * 0x2545f4914f6cdd1dull + 0x9e3779b97f4a7c15ull;
  s->g_out = malloc(sizeof(float) * (s->nq ? s->nq : 1));
  if (!s->g_out) return 0;
  fill_normal(s->g_out, s->nq, &st, c->dtype);
  if (s->L.varlen) {
    /* Packed as q and k: dO and dq [total_q, Hq, D], dk and dv [total_k,
     * Hkv, D] (the host dO is already in that order). */
    const DLDataType dt = {c->dtype == FJ_DTYPE_F16 ? kDLFloat : kDLBfloat, 16, 1};
    int64_t qs[3] = {s->L.total_q, c->Hq, c->D}, ks[3] = {s->L.total_k, c->Hkv, c->D};
    if (!dev_dense(s, &s->d_gout, 3, qs, dt, s->g_out) ||
        !dev_dense(s, &s->d_gq, 3, qs, dt, NULL) || !dev_dense(s, &s->d_gk, 3, ks, dt, NULL) ||
        !dev_dense(s, &s->d_gv, 3, ks, dt, NULL))
      return 0;
  } else if (!dev_qkvo(s, &s->d_gout, c->Hq, c->Lq) ||
             !upload(s, &s->d_gout, s->g_out, c->Hq, c->Lq) ||
             !dev_qkvo(s, &s->d_gq, c->Hq, c->Lq) || !dev_qkvo(s, &s->d_gk, c->Hkv, c->Lk) ||
             !dev_qkvo(s, &s->d_gv, c->Hkv, c->Lk)) {
    return 0;
  }
  for (int a = 0; a < s->nargs; a++) {
    if (!fjg_arg_at(s->g, a)->trainable) continue;
    dev_tensor *t = &s->d_grads[a];
    t->shape[0] = s->blen[a] > 0 ? s->blen[a] : 1;
    t->strides[0] = 1;
    if (!dev_alloc(s, t, (size_t)t->shape[0] * 4) ||
        !cu_ok(s, s->drv->cuMemsetD32(t->ptr, 0, (size_t)t->shape[0]), "cuMemsetD32"))
      return 0;
    describe(t, 1, (DLDataType){kDLFloat, 32, 1}, 0);
    s->args[a].grad = &t->t;
  }
  return 1;
}

static int bwd_launch(run_state *s) {
  fj_backward_args a;
  memset(&a, 0, sizeof a);
  a.q = &s->dq.t, a.k = &s->dk.t, a.v = &s->dv.t;
  a.o = &s->dout.t, a.lse = &s->dlse.t, a.dout = &s->d_gout.t;
  a.dq = &s->d_gq.t, a.dk = &s->d_gk.t, a.dv = &s->d_gv.t;
  a.scale = (float)s->c->scale;
  a.args = s->args, a.num_args = s->nargs;
  a.block_mask = s->bm;
  a.deterministic = s->c->deterministic;
  a.cu_seqlens_q = s->d_cu_q.ptr ? &s->d_cu_q.t : NULL;
  a.cu_seqlens_k = s->d_cu_k.ptr ? &s->d_cu_k.t : NULL;
  if (s->L.varlen) a.max_seqlen_q = s->L.max_q, a.max_seqlen_k = s->L.max_k;
  a.q_offset = s->c->q_offset, a.kv_offset = s->c->kv_offset;
  if (fj_attention_backward(s->ctx, s->spec, &a) != FJ_OK) {
    cli_error("run", "backward: %s", fj_context_last_error(s->ctx));
    return 0;
  }
  return 1;
}

static int bwd_call(void *s) { return bwd_launch(s); }
static int fwd_bwd_call(void *s) { return launch(s) && bwd_launch(s); }

/* dq, dk and dv poisoned with NaN, then the backward, to completion. */
static int bwd_poisoned(run_state *s) {
  unsigned nan16 = s->c->dtype == FJ_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
  const dev_tensor *out[] = {&s->d_gq, &s->d_gk, &s->d_gv};
  for (int i = 0; i < 3; i++)
    if (!cu_ok(s, s->drv->cuMemsetD32(out[i]->ptr, nan16 | nan16 << 16, out[i]->bytes / 4),
               "cuMemsetD32"))
      return 0;
  return bwd_launch(s) && cu_ok(s, s->drv->cuCtxSynchronize(), "the backward");
}

/* A gradient of q (is_q) or of k and v, downloaded into the host layout. */
static float *download_grad(run_state *s, const dev_tensor *t, int is_q) {
  const run_config *c = s->c;
  if (s->L.varlen) return download_packed(s, t, is_q ? s->nq : s->nk);
  return download_bhld(s, t, is_q ? c->Hq : c->Hkv, is_q ? c->Lq : c->Lk);
}

/* The gradients on NaN-poisoned outputs, downloaded. */
static int bwd_run(run_state *s) {
  const run_config *c = s->c;
  if (!bwd_poisoned(s)) return 0;
  if (!c->check) return 1;
  s->g_q = download_grad(s, &s->d_gq, 1);
  s->g_k = download_grad(s, &s->d_gk, 0);
  s->g_v = download_grad(s, &s->d_gv, 0);
  if (!s->g_q || !s->g_k || !s->g_v) return 0;
  for (int a = 0; a < s->nargs; a++) {
    if (!s->d_grads[a].ptr) continue;
    size_t n = (size_t)s->d_grads[a].shape[0];
    s->grads[a] = malloc(4 * n);
    if (!s->grads[a] ||
        !cu_ok(s, s->drv->cuMemcpyDtoH(s->grads[a], s->d_grads[a].ptr, 4 * n), "cuMemcpyDtoH"))
      return 0;
  }
  if (!c->quiet) printf("backward ok%s\n", c->deterministic ? " (deterministic)" : "");
  return 1;
}

/* --deterministic --check: a second backward on poisoned outputs must give
 * dq, dk and dv bitwise equal to the first (downloaded in s->g_*). */
static int bwd_repeat_check(run_state *s, int *pass) {
  if (!bwd_poisoned(s)) return 0;
  float *again[3] = {download_grad(s, &s->d_gq, 1), download_grad(s, &s->d_gk, 0),
                     download_grad(s, &s->d_gv, 0)};
  const float *first[3] = {s->g_q, s->g_k, s->g_v};
  const size_t n[3] = {s->nq, s->nk, s->nk};
  static const char *const names[3] = {"dq", "dk", "dv"};
  int ok = again[0] && again[1] && again[2];
  *pass = 1;
  for (int t = 0; ok && t < 3; t++) {
    size_t differ = 0;
    for (size_t i = 0; i < n[t]; i++)
      differ += memcmp(&again[t][i], &first[t][i], sizeof(float)) != 0;
    if (differ) {
      printf("check deterministic: %s differs from the first run in %zu of %zu elements\n",
             names[t], differ, n[t]);
      *pass = 0;
    }
  }
  if (ok)
    printf("check deterministic: %s (dq, dk, dv of two runs bitwise %s)\n",
           *pass ? "PASS" : "FAIL", *pass ? "equal" : "different");
  for (int t = 0; t < 3; t++) free(again[t]);
  return ok;
}

/* The gradients' references: of the whole problem, or of each sequence at
 * its own lengths (--varlen: cli_seqs_backward_reference). 0 on failure
 * (said). */
static int bwd_reference(run_state *s, const cli_bwd_ref *r) {
  char err[256];
  if (s->serving) {
    if (cli_seqs_backward_reference(&s->L, s->c, s->g, &s->env, s->scale, s->q, s->k, s->v,
                                    s->g_out, r, err, sizeof err) == 0)
      return 1;
    cli_error("run", "%s", err);
    return 0;
  }
  fjg_ref_problem p = ref_problem(s);
  double *q = to_double(s->q, s->nq), *k = to_double(s->k, s->nk);
  double *v = to_double(s->v, s->nk), *dout = to_double(s->g_out, s->nq);
  int ok = q && k && v && dout;
  if (!ok)
    cli_error("run", "out of host memory for the backward's reference");
  else if (fjg_reference_backward(&p, q, k, v, dout, NULL, NULL, NULL, r->rq, r->rk, r->rv,
                                  r->rg) != FJ_OK ||
           fjg_reference_backward_lowp(&p, s->c->dtype, q, k, v, dout, NULL, r->lq, r->lk,
                                       r->lv, r->lg) != FJ_OK ||
           fjg_reference_zero_grad_rows(&p, r->zq, r->zk) != 0) {
    cli_error("run", "the backward's CPU reference failed");
    ok = 0;
  }
  free(q), free(k), free(v), free(dout);
  return ok;
}

/* The gradients against the float64 reference (fjg_reference_backward) by
 * the rule for gradients: 3x the input dtype's error, plus a floor; exactly
 * 0 where the mask allows nothing. */
static int bwd_check(run_state *s, int *pass) {
  const run_config *c = s->c;
  double *rq = malloc(8 * s->nq + 8), *rk = malloc(8 * s->nk + 8), *rv = malloc(8 * s->nk + 8);
  float *lq = malloc(4 * s->nq + 4), *lk = malloc(4 * s->nk + 4), *lv = malloc(4 * s->nk + 4);
  uint8_t *qz = malloc(s->nl + 1), *kz = malloc(s->nk / c->D + 1);
  double *rg[CLI_MAX_VALUES] = {0};
  float *lg[CLI_MAX_VALUES] = {0};
  int ok = 0;
  double t0 = now_s();
  if (!rq || !rk || !rv || !lq || !lk || !lv || !qz || !kz) {
    cli_error("run", "out of host memory for the backward's reference");
    goto fail;
  }
  for (int a = 0; a < s->nargs; a++)
    if (s->grads[a]) {
      size_t n = (size_t)s->d_grads[a].shape[0];
      if (!(rg[a] = calloc(n, 8)) || !(lg[a] = calloc(n, 4))) {
        cli_error("run", "out of host memory for the backward's reference");
        goto fail;
      }
    }
  const cli_bwd_ref ref = {rq, rk, rv, lq, lk, lv, qz, kz, rg, lg};
  if (!bwd_reference(s, &ref)) goto fail;
  fjg_check_report r;
  const size_t D = (size_t)c->D;
  *pass = fjg_ref_check_grad(rq, lq, s->g_q, s->nq, D, NULL, qz, CHECK_FLOOR_GRAD, &r);
  print_check(s, "dq", &r, rq, s->g_q);
  *pass &= fjg_ref_check_grad(rk, lk, s->g_k, s->nk, D, NULL, kz, CHECK_FLOOR_GRAD, &r);
  print_check(s, "dk", &r, rk, s->g_k);
  *pass &= fjg_ref_check_grad(rv, lv, s->g_v, s->nk, D, NULL, kz, CHECK_FLOOR_GRAD, &r);
  print_check(s, "dv", &r, rv, s->g_v);
  for (int a = 0; a < s->nargs; a++)
    if (s->grads[a]) {
      size_t n = (size_t)s->d_grads[a].shape[0];
      *pass &= fjg_ref_check_grad(rg[a], lg[a], s->grads[a], n, n, NULL, NULL,
                                  CHECK_FLOOR_GRAD, &r);
      print_check(s, fjg_arg_at(s->g, a)->name, &r, rg[a], s->grads[a]);
    }
  printf("check backward: %s (reference %.1f s on the CPU%s)\n", *pass ? "PASS" : "FAIL",
         now_s() - t0, s->serving ? ", each sequence at its own lengths" : "");
  ok = 1;
fail:
  free(rq), free(rk), free(rv), free(lq), free(lk), free(lv), free(qz), free(kz);
  for (int a = 0; a < CLI_MAX_VALUES; a++) free(rg[a]), free(lg[a]);
  return ok;
}

/* The backward, and forward + backward, by do_bench's rules. FLOPs: the
 * forward's 4 * D * (allowed pairs; --varlen: each sequence's at its own
 * lengths, as bench counts them), 2.5x that for the backward. */
static int bwd_bench(run_state *s) {
  const run_config *c = s->c;
  cli_bench_options o = {c->warmup_ms, c->rep_ms, c->warmup, c->iters};
  cli_bench_result r;
  fjg_ref_problem p = ref_problem(s);
  int64_t pairs = s->serving ? cli_seqs_pairs(&s->L, c, s->g, &s->env)
                             : fjg_reference_count_allowed(&p);
  if (pairs < 0) {
    cli_error("run", "counting the allowed pairs failed (out of memory?)");
    return 0;
  }
  const double fwd_flops = 4.0 * c->D * (double)pairs;
  if (!cli_bench_run(s->drv, "run", bwd_call, s, &o, &r)) return 0;
  printf("bench backward: %.4f ms median of %d launches (min %.4f ms, max %.4f ms), "
         "%.1f TFLOP/s\n",
         r.median_ms, r.n_repeat, r.min_ms, r.max_ms,
         2.5 * fwd_flops / (r.median_ms * 1e-3) / 1e12);
  if (!cli_bench_run(s->drv, "run", fwd_bwd_call, s, &o, &r)) return 0;
  printf("bench forward+backward: %.4f ms median of %d (min %.4f ms, max %.4f ms), "
         "%.1f TFLOP/s\n",
         r.median_ms, r.n_repeat, r.min_ms, r.max_ms,
         3.5 * fwd_flops / (r.median_ms * 1e-3) / 1e12);
  return 1;
}

/* ---- the run ---- */

static int open_spec(run_state *s) {
  const run_config *c = s->c;
  fj_context_options o;
  int rc;
  fj_context_options_init(&o);
  o.cache_dir = c->cache_dir;
  o.arch = c->arch;
  o.log = cli_log;
  o.log_user = (void *)"run";
  if (fj_context_create(&o, &s->ctx) != FJ_OK) {
    cli_error("run", "cannot create a context");
    return CLI_FAIL;
  }
  if ((rc = cli_mount_packs(s->ctx, "run", c->packs, c->num_packs)) >= 0)
    return rc;
  if (fj_spec_load_file(s->ctx, c->spec_path, &s->spec) != FJ_OK) {
    cli_error("run", "%s", fj_context_last_error(s->ctx));
    return CLI_FAIL;
  }
  s->g = fjr_spec_graph(s->spec);
  return -1;
}

static void print_header(const run_state *s) {
  const run_config *c = s->c;
  if (c->quiet) return;
  printf("run     %s (%s): B=%d Hq=%d Hkv=%d Lq=%d Lk=%d D=%d %s %s\n",
         fj_spec_name(s->spec), c->spec_path, c->B, c->Hq, c->Hkv, c->Lq,
         c->Lk, c->D, c->dtype == FJ_DTYPE_F16 ? "fp16" : "bf16",
         s->L.varlen ? "packed" : c->bshd ? "bshd" : "bhsd");
  if (s->L.varlen)
    printf("varlen  %d sequences, %lld query and %lld kv tokens, longest %d "
           "and %d (cu_seqlens)\n",
           s->L.n, (long long)s->L.total_q, (long long)s->L.total_k,
           s->L.max_q, s->L.max_k);
  if (s->L.page_size)
    printf("paged   %d pages of %d tokens, block table [%d, %d], pages "
           "shuffled (seed %llu)\n",
           s->L.num_pages, s->L.page_size, s->L.n, s->L.max_pages,
           (unsigned long long)c->seed);
  if (s->L.per_seq_k && !s->L.varlen) {
    int lo = s->L.lk[0], hi = s->L.lk[0];
    for (int b = 1; b < s->L.n; b++)
      lo = s->L.lk[b] < lo ? s->L.lk[b] : lo, hi = s->L.lk[b] > hi ? s->L.lk[b] : hi;
    printf("seqlens_k %d to %d\n", lo, hi);
  }
  if (c->skip_softmax > 0) printf("skip softmax threshold %g\n", c->skip_softmax);
  if (c->q_offset || c->kv_offset)
    printf("offsets q %d, kv %d (the spec sees positions of the whole sequence)\n",
           c->q_offset, c->kv_offset);
}

static int run_on_device(run_state *s) {
  const run_config *c = s->c;
  int pass = 1;
  if (!setup_device(s) || !build_block_mask(s) || !report_kernel(s) ||
      !poison(s) || !launch(s) ||
      !cu_ok(s, s->drv->cuCtxSynchronize(), "the kernel"))
    return CLI_FAIL;
  if (c->check || c->dump_dir) {
    if (!download(s)) return CLI_FAIL;
    if (!c->quiet) printf("launch  ok\n");
  }
  if (c->check && !check(s, &pass)) return CLI_FAIL;
  if (c->dump_dir && !dump(s)) return CLI_FAIL;
  int bpass = 1, dpass = 1;
  if (c->backward && (!bwd_setup(s) || !bwd_run(s) || (c->check && !bwd_check(s, &bpass))))
    return CLI_FAIL;
  if (c->backward && c->check && c->deterministic && !bwd_repeat_check(s, &dpass))
    return CLI_FAIL;
  if (c->bench && !bench(s)) return CLI_FAIL;
  if (c->bench && c->backward && !bwd_bench(s)) return CLI_FAIL;
  return pass && bpass && dpass ? CLI_OK : CLI_FAIL;
}

/* What can be checked without a GPU: a head dim and dtype some kernel
 * has (which kernel depends on the target: that is checked at compile
 * time), and a --dump folder that can be written. */
static int check_options(const run_state *s) {
  const run_config *c = s->c;
  fjg_config cfg;
  char err[512];
  if (fjg_config_choose_template(c->D, c->dtype, "sm_90a", "sm90", &cfg, err,
                                 sizeof err) != FJ_OK) {
    cli_error("run", "--head-dim %d: %s", c->D, err);
    return CLI_USAGE;
  }
  if (c->backward && fjg_config_choose_backward(c->D, c->dtype, "sm_80", NULL, &cfg, err,
                                                sizeof err) != FJ_OK) {
    cli_error("run", "--backward at --head-dim %d: %s", c->D, err);
    return CLI_USAGE;
  }
  if (c->dump_dir && cli_check_output_dir(c->dump_dir, 0, err, sizeof err)) {
    cli_error("run", "--dump: %s", err);
    return CLI_USAGE;
  }
  return -1;
}

/* Each sequence's lengths (and the block table); a spec that reads b is
 * refused in the serving layouts, whose reference and counts take one
 * sequence at a time. */
static int make_layout(run_state *s) {
  const run_config *c = s->c;
  char err[256];
  s->serving = cli_seqs_wanted(c);
  if (s->serving && cli_graph_reads_batch(s->g)) {
    cli_error("run", "spec '%s' reads b (or the batch size): --page-size, "
              "--seqlens-k and --varlen check and count each sequence alone, "
              "which such a spec cannot be", fj_spec_name(s->spec));
    return CLI_USAGE;
  }
  if (cli_seqs_build(&s->L, c, err, sizeof err) != 0) {
    cli_error("run", "%s", err);
    return CLI_FAIL;
  }
  return -1;
}

int cli_run(const run_config *c) {
  run_state s;
  int rc;
  memset(&s, 0, sizeof s);
  s.c = c;
  s.scale = c->scale != 0 ? (float)c->scale : 1.0f / sqrtf((float)c->D);
  /* Everything the command line names is checked before the GPU, so a
   * machine without one still reports a bad option or input file. */
  if ((rc = check_options(&s)) >= 0 || (rc = open_spec(&s)) >= 0 ||
      (rc = bind_values(&s)) >= 0 || (rc = make_layout(&s)) >= 0 ||
      (rc = make_inputs(&s)) >= 0)
    goto done;
  if (fjr_context_device(s.ctx, &s.drv) != FJ_OK) {
    cli_error("run", "no GPU: %s", fj_context_last_error(s.ctx));
    s.drv = NULL;
    rc = CLI_USAGE;
    goto done;
  }
  print_header(&s);
  rc = run_on_device(&s);
done:
  fj_block_mask_destroy(s.bm);
  free_device(&s);
  cli_seqs_free(&s.L);
  for (int a = 0; a < CLI_MAX_VALUES; a++) free(s.bconv[a]), free(s.grads[a]);
  free(s.q), free(s.k), free(s.v), free(s.o), free(s.lse);
  free(s.g_out), free(s.g_q), free(s.g_k), free(s.g_v);
  fj_spec_destroy(s.spec);
  fj_context_destroy(s.ctx);
  return rc;
}
