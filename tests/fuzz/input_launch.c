/*
 * tests/fuzz/input_launch.c: the launch checks of fj_attention_forward,
 * fj_attention_backward, fj_merge_states and fj_paged_from_csr (shapes,
 * strides, dtypes, devices, alignment, the serving layouts, offsets, block
 * masks made by fj_block_mask_wrap, runtime values), fed arguments decoded
 * from bytes, for libFuzzer; an input fuzzer like input_spec.c.
 *
 * The tensors are DLTensors on a CUDA device at addresses that are never
 * dereferenced, and the context loads no driver (FLEXJIT_LIBCUDA names a
 * file that does not exist), so a launch the checks pass fails there:
 * nothing reaches a GPU, whatever the machine. A byte stream of zeros
 * decodes to a sound launch of a causal mask; each byte after the first
 * few perturbs one field (a shape, a stride, a dtype, a pointer, an
 * optional tensor ...) to a value from a list of likely troublemakers:
 * 0, -1, 2^31, 2^62 and their like.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flexjit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static unsigned next_byte(reader *r) {
  if (r->n == 0) return 0;
  r->n--;
  return *r->p++;
}

static const int64_t kSizes[] = {
    1, 2, 3, 7, 16, 33, 64, 127, 128, 129, 256, 1000, 4096, 65535, 65536, 0, -1,
    INT32_MAX, (int64_t)INT32_MAX + 1, (int64_t)1 << 32, (int64_t)1 << 40, (int64_t)1 << 62,
    INT64_MAX, INT64_MIN};
enum { N_SIZES = sizeof kSizes / sizeof kSizes[0] };

static int64_t any_size(reader *r) { return kSizes[next_byte(r) % N_SIZES]; }

static const DLDataType kTypes[] = {
    {kDLBfloat, 16, 1}, {kDLFloat, 16, 1}, {kDLFloat, 32, 1}, {kDLInt, 32, 1},
    {kDLInt, 64, 1},    {kDLBfloat, 16, 2}, {kDLUInt, 8, 1},  {kDLFloat, 64, 1}};

/* One tensor: shape (ndim entries of its own storage), strides, the
 * DLTensor itself. */
typedef struct tensor {
  int64_t shape[6], strides[6];
  DLTensor t;
  int present;
} tensor;

/* A dense tensor of `shape` (n dims) and type dt at a 256-byte aligned
 * fake address (slot k). */
static void dense(tensor *x, const int64_t *shape, int n, DLDataType dt, int k) {
  memset(x, 0, sizeof *x);
  memcpy(x->shape, shape, (size_t)n * sizeof *shape);
  x->t.data = (void *)(uintptr_t)(0x100000u * (unsigned)(k + 1));
  x->t.device = (DLDevice){kDLCUDA, 0};
  x->t.ndim = n;
  x->t.dtype = dt;
  x->t.shape = x->shape;
  x->present = 1;
}

/* One perturbation of tensor x, chosen by the stream. */
static void perturb(tensor *x, reader *r) {
  const unsigned what = next_byte(r) % 11, i = next_byte(r) % 6;
  const int d = x->t.ndim > 0 ? (int)(i % (unsigned)x->t.ndim) : 0;
  switch (what) {
  case 0: x->shape[d] = any_size(r); break;
  case 1: /* explicit strides, compact but for dimension d */
    for (int64_t j = x->t.ndim - 1, s = 1; j >= 0; j--) {
      x->strides[j] = s;
      s *= x->shape[j] > 0 && x->shape[j] < 1024 ? x->shape[j] : 1;
    }
    x->strides[d] = any_size(r);
    x->t.strides = x->strides;
    break;
  case 2: x->t.dtype = kTypes[next_byte(r) % (sizeof kTypes / sizeof kTypes[0])]; break;
  case 3: x->t.ndim = (int)(next_byte(r) % 7); break; /* 0 .. 6: shape holds 6 */
  case 4: x->t.data = (void *)((uintptr_t)x->t.data + 1 + next_byte(r) % 64); break;
  case 5: x->t.data = NULL; break;
  case 6: x->t.byte_offset = (uint64_t)any_size(r); break;
  case 7: x->t.device = (DLDevice){next_byte(r) % 2 ? kDLCPU : kDLCUDA, (int)(next_byte(r) % 3)}; break;
  case 8: x->t.shape = next_byte(r) % 2 ? NULL : x->shape; break;
  case 9: x->present = !x->present; break;
  default: x->t.data = (void *)(uintptr_t)(0x100000u * (1 + next_byte(r) % 4)); break; /* alias */
  }
}

static const DLTensor *opt(const tensor *x) { return x->present ? &x->t : NULL; }

static const char *const kSpecs[] = {
    "return { mask_mod = causal() }",
    "local doc = buffer('doc', 'i32')\nreturn { mask_mod = document(doc) }",
    "local w = param('w', 'i32')\nreturn { mask_mod = sliding_window(w) }",
    "local t = buffer('t', 'f32', {grad = true})\n"
    "return { mask_mod = causal(), score_mod = function(s, b, h, q, kv)\n"
    "  return s + t[min(max(q - kv, 0), 63)] end }",
    "return { mask_mod = causal{align = 'bottom_right'} }",
};
enum { N_SPECS = sizeof kSpecs / sizeof kSpecs[0] };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static fj_context *ctx;
  static fj_spec *specs[N_SPECS];
  if (!ctx) {
    setenv("FLEXJIT_LIBCUDA", "/nonexistent/flexjit-fuzzing/libcuda.so.1", 1);
    fj_context_options o;
    fj_context_options_init(&o);
    o.cache_dir = "";
    if (fj_context_create(&o, &ctx) != FJ_OK) abort();
    for (int i = 0; i < N_SPECS; i++)
      if (fj_spec_load_string(ctx, kSpecs[i], strlen(kSpecs[i]), "launch", &specs[i]) != FJ_OK)
        abort();
  }
  reader r = {data, size};
  /* What is launched: the forward, the backward, a merge, a CSR conversion. */
  const unsigned spec_i = next_byte(&r) % N_SPECS, entry = next_byte(&r) % 4;
  const int64_t B = 1 + next_byte(&r) % 3, Hkv = 1 + next_byte(&r) % 2,
                Hq = Hkv * (1 + next_byte(&r) % 3), Lq = 1 + next_byte(&r) * 3,
                Lk = 1 + next_byte(&r) * 5, D = next_byte(&r) % 2 ? 64 : 128;
  const DLDataType bf16 = {kDLBfloat, 16, 1}, f32 = {kDLFloat, 32, 1}, i32 = {kDLInt, 32, 1};
  const int64_t qs[4] = {B, Hq, Lq, D}, ks[4] = {B, Hkv, Lk, D}, ls[3] = {B, Hq, Lq},
                one[1] = {B}, cu[1] = {B + 1}, table[2] = {B, 4}, doc[1] = {Lk},
                bias[1] = {64}, parts[5] = {3, B, Hq, Lq, D}, part_lse[4] = {3, B, Hq, Lq},
                indices[1] = {12};
  /* q k v o lse dout dlse dq dk dv | seqlens_k block_table cu_q cu_k |
   * buffer, its gradient | the merge's parts | the CSR layout's page
   * indices and the kv lengths it writes. */
  enum { Q, K, V, O, LSE, DOUT, DLSE, DQ, DK, DV, SEQK, TABLE, CUQ, CUK, BUF, GRAD,
         PARTS, PART_LSE, INDICES, SEQK_OUT, N };
  tensor x[N];
  dense(&x[Q], qs, 4, bf16, Q);
  dense(&x[K], ks, 4, bf16, K);
  dense(&x[V], ks, 4, bf16, V);
  dense(&x[O], qs, 4, bf16, O);
  dense(&x[LSE], ls, 3, f32, LSE);
  dense(&x[DOUT], qs, 4, bf16, DOUT);
  dense(&x[DLSE], ls, 3, f32, DLSE);
  dense(&x[DQ], qs, 4, bf16, DQ);
  dense(&x[DK], ks, 4, bf16, DK);
  dense(&x[DV], ks, 4, bf16, DV);
  dense(&x[SEQK], one, 1, i32, SEQK);
  dense(&x[TABLE], table, 2, i32, TABLE);
  dense(&x[CUQ], cu, 1, i32, CUQ);
  dense(&x[CUK], cu, 1, i32, CUK);
  dense(&x[BUF], spec_i == 1 ? doc : bias, 1, spec_i == 1 ? i32 : f32, BUF);
  dense(&x[GRAD], bias, 1, f32, GRAD);
  dense(&x[PARTS], parts, 5, bf16, PARTS);
  dense(&x[PART_LSE], part_lse, 4, f32, PART_LSE);
  dense(&x[INDICES], indices, 1, i32, INDICES);
  dense(&x[SEQK_OUT], one, 1, i32, SEQK_OUT);
  x[DLSE].present = x[SEQK].present = x[TABLE].present = 0;
  x[CUQ].present = x[CUK].present = 0;
  if (entry == 3) x[CUQ].present = x[SEQK].present = x[TABLE].present = 1;

  /* A block mask over arrays at fake addresses, as a caller wraps
   * FlexAttention's (its info perturbed by the stream; off at first). */
  fj_block_mask_info bm = {.B = (int)B, .H = (int)Hq, .q_len = (int)Lq, .kv_len = (int)Lk,
                           .block_q = 128, .block_kv = 128,
                           .num_q_blocks = (int)(Lq + 127) / 128,
                           .num_kv_blocks = (int)(Lk + 127) / 128};
  int with_mask = 0;
  int page_size = 16;

  /* The spec's one runtime value, and a second that names it again. */
  fj_arg args[2] = {{.name = spec_i == 1 ? "doc" : spec_i == 2 ? "w" : "t", .i32 = 256,
                     .buffer = &x[BUF].t, .grad = spec_i == 3 ? &x[GRAD].t : NULL}};
  fj_arg *const arg = &args[0];
  args[1] = args[0];
  int num_args = spec_i >= 1 && spec_i <= 3;
  float scale = 0.f, skip = 0.f;
  int64_t q_offset = 0, kv_offset = 0;
  int max_q = 0, max_k = 0, deterministic = 0;
  size_t workspace_bytes = 0;
  void *workspace = NULL;

  /* The rest of the stream: perturbations, a byte saying which field. */
  while (r.n > 0) {
    const unsigned f = next_byte(&r) % (N + 13);
    static const float kFloats[] = {0.f, -1.f, 0.5f, 1e30f, INFINITY, NAN, 2.f};
    if (f < N) {
      perturb(&x[f], &r);
      continue;
    }
    switch (f - N) {
    case 0: scale = kFloats[next_byte(&r) % 7]; break;
    case 1: skip = kFloats[next_byte(&r) % 7]; break;
    case 2: q_offset = any_size(&r); break;
    case 3: kv_offset = any_size(&r); break;
    case 4: max_q = (int)any_size(&r); max_k = (int)any_size(&r); break;
    case 5: deterministic = !deterministic; break;
    case 6: num_args = (int)(next_byte(&r) % 3); break;
    case 7: arg->name = next_byte(&r) % 2 ? "nope" : NULL; break;
    case 8: workspace = (void *)(uintptr_t)(0x8000000u + next_byte(&r) % 2 * 17);
            workspace_bytes = (size_t)any_size(&r); break;
    case 9: arg->buffer = next_byte(&r) % 2 ? NULL : &x[Q].t; break;
    case 10: {
      with_mask = 1;
      int *const fields[] = {&bm.B, &bm.H, &bm.q_len, &bm.kv_len, &bm.block_q, &bm.block_kv,
                             &bm.num_q_blocks, &bm.num_kv_blocks, &bm.q_offset, &bm.kv_offset};
      const unsigned i = next_byte(&r) % 11;
      if (i < 10) *fields[i] = (int)any_size(&r);
      break;
    }
    case 11: page_size = (int)any_size(&r); break;
    default: arg->grad = arg->grad ? NULL : &x[GRAD].t; break;
    }
  }

  fj_block_mask *mask = NULL;
  if (with_mask) {
    uint64_t arrays[FJ_BM_NUM_ARRAYS];
    for (int i = 0; i < FJ_BM_NUM_ARRAYS; i++) arrays[i] = 0x4000000u + 0x100000u * (unsigned)i;
    if (fj_block_mask_wrap(ctx, &bm, arrays, &mask) != FJ_OK) mask = NULL;
  }
  fj_spec *spec = specs[spec_i];
  if (entry == 0) {
    fj_forward_args a = {.q = opt(&x[Q]), .k = opt(&x[K]), .v = opt(&x[V]), .o = opt(&x[O]),
                         .lse = opt(&x[LSE]), .scale = scale, .args = args,
                         .num_args = num_args, .workspace = workspace,
                         .workspace_bytes = workspace_bytes, .seqlens_k = opt(&x[SEQK]),
                         .block_table = opt(&x[TABLE]), .cu_seqlens_q = opt(&x[CUQ]),
                         .cu_seqlens_k = opt(&x[CUK]), .max_seqlen_q = max_q,
                         .max_seqlen_k = max_k, .skip_softmax_threshold = skip,
                         .q_offset = q_offset, .kv_offset = kv_offset, .block_mask = mask};
    (void)fj_attention_forward(ctx, spec, &a);
  } else if (entry == 1) {
    fj_backward_args a = {.q = opt(&x[Q]), .k = opt(&x[K]), .v = opt(&x[V]), .o = opt(&x[O]),
                          .lse = opt(&x[LSE]), .dout = opt(&x[DOUT]), .dlse = opt(&x[DLSE]),
                          .dq = opt(&x[DQ]), .dk = opt(&x[DK]), .dv = opt(&x[DV]),
                          .scale = scale, .args = args, .num_args = num_args,
                          .workspace = workspace, .workspace_bytes = workspace_bytes,
                          .deterministic = deterministic, .cu_seqlens_q = opt(&x[CUQ]),
                          .cu_seqlens_k = opt(&x[CUK]), .max_seqlen_q = max_q,
                          .max_seqlen_k = max_k, .q_offset = q_offset, .kv_offset = kv_offset,
                          .block_mask = mask};
    (void)fj_attention_backward(ctx, spec, &a);
  } else if (entry == 2) {
    fj_merge_args a = {.o_parts = opt(&x[PARTS]), .lse_parts = opt(&x[PART_LSE]),
                       .o = opt(&x[O]), .lse = opt(&x[LSE])};
    (void)fj_merge_states(ctx, &a);
  } else {
    fj_paged_csr_args a = {.kv_indptr = opt(&x[CUQ]), .kv_indices = opt(&x[INDICES]),
                           .kv_last_page_len = opt(&x[SEQK]), .page_size = page_size,
                           .block_table = opt(&x[TABLE]), .seqlens_k = opt(&x[SEQK_OUT])};
    (void)fj_paged_from_csr(ctx, &a);
  }
  fj_block_mask_destroy(mask);
  return 0;
}
