/*
 * gen/config.c: tile sizes per architecture and head dim.
 *
 * Measured on an H200 (sm_90) against PyTorch SDPA's flash backend (FA2,
 * mma.sync as well): 4 warps of 32 query rows each, with K/V double
 * buffered, is the fastest spill-free shape; 8 warps of 16 rows re-read each
 * K/V fragment from shared memory twice as often, and 3 stages cost the
 * second CTA per SM. D=128 uses 64-row kv tiles (the template computes them as
 * two 32-column softmax steps to stay under 255 registers); D=64 can afford
 * 128-row tiles. Consumer parts (sm_86, sm_89, sm_120) have about 100 KiB of
 * shared memory per SM, so they get shapes that fit two CTAs (untuned).
 * The backward pass's shapes: choose_sm80_backward.
 */
#include "gen/config.h"

#include <string.h>

#include "util/errmsg.h"

/* "sm_" two or three digits, then "a" (architecture-specific features,
 * sm_90 and newer) or "f" (family, sm_100 and newer) or nothing; returns the
 * number or -1. */
static int parse_arch(const char *arch) {
  if (strncmp(arch, "sm_", 3) != 0) return -1;
  const char *p = arch + 3;
  int n = 0, digits = 0;
  while (*p >= '0' && *p <= '9') {
    n = n * 10 + (*p++ - '0');
    if (++digits > 3) return -1;
  }
  if (digits < 2) return -1;
  if ((*p == 'a' && n >= 90) || (*p == 'f' && n >= 100)) p++;
  return *p ? -1 : n;
}

fj_status fjg_arch_check(const char *arch, int *sm_out, char *err, size_t errlen) {
  if (!arch) return fju_fail(err, errlen, FJ_EINVAL, "no target architecture given");
  int sm = parse_arch(arch);
  if (sm < 0 || strlen(arch) >= sizeof(((fjg_config *)0)->arch))
    return fju_fail(err, errlen, FJ_EINVAL,
                    "invalid architecture '%s' (expected sm_XY, e.g. sm_80 or sm_90a; "
                    "the suffix a from sm_90, f from sm_100)",
                    arch);
  if (sm < 80)
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "architecture %s is not supported: flexjit needs sm_80 or newer "
                    "(bf16 mma.sync, cp.async)", arch);
  if (sm_out) *sm_out = sm;
  return FJ_OK;
}

/* Largest dynamic shared memory one block may opt in to, by architecture. */
static int max_smem_per_block(int sm) {
  switch (sm) {
  case 80:
  case 87:
    return 163 * 1024;
  case 86:
  case 89:
  case 120:
  case 121:
    return 99 * 1024;
  default:
    return 227 * 1024; /* sm_90, sm_100, sm_103, sm_110 ... */
  }
}

static int small_smem(int sm) { return max_smem_per_block(sm) < 128 * 1024; }

/* Shared memory of one multiprocessor, by architecture (what several CTAs
 * share). */
static int smem_per_sm(int sm) {
  switch (sm) {
  case 80:
  case 87:
    return 164 * 1024;
  case 86:
  case 89:
  case 120:
  case 121:
    return 100 * 1024;
  default:
    return 228 * 1024;
  }
}

/* The sm80 shapes (see the comment at the top). */
static fj_status choose_sm80(fjg_config *out, char *err, size_t errlen) {
  const int sm = out->sm, head_dim = out->head_dim;
  if (head_dim == 256)
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "head dim 256 needs the sm90 template (target sm_90a); the sm80 "
                    "template (%s) has 64 and 128", out->arch);
  out->template_name = "sm80";
  out->num_warps = 4;
  out->num_stages = 2;
  if (head_dim == 128) {
    out->block_m = small_smem(sm) ? 64 : 128;
    out->block_n = small_smem(sm) ? 32 : 64;
  } else {
    out->block_m = 128;
    out->block_n = small_smem(sm) ? 64 : 128;
  }
  out->threads = out->num_warps * 32;
  /* Q tile plus num_stages K and V tiles, 2-byte elements. */
  out->smem_bytes =
      (out->block_m + 2 * out->num_stages * out->block_n) * head_dim * 2;
  if (out->smem_bytes > max_smem_per_block(sm))
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "configuration needs %d bytes of shared memory, more than %s allows",
                    out->smem_bytes, out->arch);
  return FJ_OK;
}

/* The sm90 kernel's static shared memory next to the dynamic: its
 * block-mask row copy (FJ_BM_CACHE) as ptxas reports it, 5120 bytes; the
 * persistent kernel keeps two (its item ring's) and the ring, 9216. */
#define SM90_STATIC_SMEM_ONE 5120
#define SM90_STATIC_SMEM_PERSISTENT 9216
#define SM90_STATIC_SMEM(c) \
  ((c)->persistent ? SM90_STATIC_SMEM_PERSISTENT : SM90_STATIC_SMEM_ONE)

/* Must equal FJH_SMEM_BYTES: 1024 bytes to align the tiles to the swizzle
 * atom, the Q buffers, the K and V stages, and 1 + 4 * stages mbarriers. */
static int sm90_smem_bytes(const fjg_config *c, int q_bufs, int stages) {
  return 1024 + (q_bufs * c->block_m + 2 * stages * c->block_n) * c->head_dim * 2 +
         8 * (1 + 4 * stages);
}

static int sm90_fits(const fjg_config *c, int q_bufs, int stages) {
  return sm90_smem_bytes(c, q_bufs, stages) + SM90_STATIC_SMEM(c) <= max_smem_per_block(c->sm);
}

/* q_bufs and smem_bytes from persistent and num_stages: the persistent
 * kernel takes a second Q buffer where it fits beside the K/V stages (D=64
 * and 128; not D=256, whose Q and two stages take 192 KiB). */
static void sm90_layout(fjg_config *c) {
  c->q_bufs = c->persistent && sm90_fits(c, 2, c->num_stages) ? 2 : 1;
  c->smem_bytes = sm90_smem_bytes(c, c->q_bufs, c->num_stages);
}

int fjg_sm90_tile(int head_dim, int *block_m, int *block_n) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return -1;
  *block_m = head_dim == 64 ? 192 : 128;
  *block_n = head_dim == 256 ? 64 : 128;
  return 0;
}

int fjg_sm90_block_m_for(int block_m, int block_q) {
  if (block_q <= 0 || block_q % block_m == 0) return block_m;
  return block_q % 128 == 0 ? 128 : 0;
}

/* The sm90 template (templates/sm90/): one producer and two consumer
 * warpgroups, 128 x 128 tiles as FlashAttention-3 uses at D=128 causal;
 * at D=64 three consumers and 192 x 128 tiles, FlashAttention-3's small-head
 * tile (+7% over two at causal 8 x 4096, H=32), two K/V stages at D=128 and
 * three at D=64 (64-row kv tiles and twice the stages measured slower
 * everywhere).
 * D=256 takes 128 x 64 tiles and two stages: 64 + 128 KiB of Q and K/V, and
 * a consumer thread holds 128 O accumulators next to 32 of S. */
static fj_status choose_sm90(fjg_config *out, char *err, size_t errlen) {
  const char *a = out->arch;
  if (out->sm != 90 || a[strlen(a) - 1] != 'a')
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "template sm90 needs target sm_90a (wgmma, setmaxnreg), not %s", a);
  out->template_name = "sm90";
  out->uses_tma = 1;
  fjg_sm90_tile(out->head_dim, &out->block_m, &out->block_n);
  out->num_warps = 4 * (1 + out->block_m / 64); /* a producer, 64 rows a consumer */
  out->threads = 32 * out->num_warps;
  out->num_stages = out->head_dim == 64 ? 3 : 2;
  out->spill_fallback = "-DFJ_INTRA_WG_OVERLAP=0";
  sm90_layout(out);
  /* D=128: the persistent kernel (its dynamic item order measured equal on
   * full, causal and sliding-window attention and 4% faster on the
   * document mask). D=64 keeps three
   * consumers (the persistent kernel has two: 11% slower), D=256 the
   * one-CTA-an-item kernel (the persistent one has a single Q buffer
   * there, not measured faster). */
  if (out->head_dim == 128) fjg_config_set_persistent(out, 1);
  if (out->smem_bytes + SM90_STATIC_SMEM(out) > max_smem_per_block(out->sm))
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "configuration needs %d bytes of shared memory, more than %s allows",
                    out->smem_bytes, a);
  return FJ_OK;
}

int fjg_config_set_consumers(fjg_config *c, int n) {
  if (!c || !c->uses_tma || (n != 2 && n != 3) ||
      (n == 3 && (c->head_dim != 64 || c->persistent)))
    return -1;
  const fjg_config old = *c;
  c->block_m = 64 * n;
  c->num_warps = 4 * (n + 1);
  c->threads = 32 * c->num_warps;
  if (!sm90_fits(c, 1, c->num_stages)) {
    *c = old;
    return -1;
  }
  sm90_layout(c);
  return 0;
}

void fjg_config_set_persistent(fjg_config *c, int on) {
  if (!c || !c->uses_tma) return;
  if (on) fjg_config_set_consumers(c, FJG_SM90_PERSISTENT_BLOCK_M / 64);
  c->persistent = on ? 1 : 0;
  c->spill_fallback = "-DFJ_INTRA_WG_OVERLAP=0";
  sm90_layout(c);
}

/* The long-row variant: kv tiles of 176 rows (FlashAttention-3's non-causal
 * tile at D=128) in the one-CTA-an-item kernel, whose consumers have the 240
 * registers that the larger S tile needs beside the intra-warpgroup overlap
 * (the persistent kernel's 224 spill) and whose two K/V stages of 176 rows
 * leave room for one Q buffer only. It beats the persistent 128 x 128
 * kernel only where rows are long and loses where they are short, so the
 * runtime takes it only for long rows, and only for specs without a
 * score_mod, whose registers spill beside the wider tile (runtime/forward.c;
 * docs/architecture.md, "The long-row variant"). */
int fjg_config_set_long_rows(fjg_config *c) {
  if (!c || !c->uses_tma || c->head_dim != 128 || c->block_m != 128) return -1;
  const fjg_config old = *c;
  c->persistent = 0;
  c->block_n = FJG_SM90_LONG_ROW_BLOCK_N;
  if (!sm90_fits(c, 1, c->num_stages)) {
    *c = old;
    return -1;
  }
  sm90_layout(c);
  return 0;
}

/* The persistent kernel's second Q buffer gives way to the stages. */
int fjg_config_set_stages(fjg_config *c, int num_stages) {
  if (!c || !c->uses_tma || num_stages < 2 || !sm90_fits(c, 1, num_stages)) return -1;
  c->num_stages = num_stages;
  sm90_layout(c);
  return 0;
}

fj_status fjg_config_choose(int head_dim, fj_dtype dtype, const char *arch,
                            fjg_config *out, char *err, size_t errlen) {
  return fjg_config_choose_template(head_dim, dtype, arch, NULL, out, err,
                                    errlen);
}

/* The checks and fields every configuration starts from: head_dim, dtype,
 * arch and sm; the rest zero. */
static fj_status config_start(int head_dim, fj_dtype dtype, const char *arch,
                              fjg_config *out, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!out) return fju_fail(err, errlen, FJ_EINVAL, "no output configuration");
  memset(out, 0, sizeof *out);
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "head dim %d is not supported (supported: 64, 128, and 256 on sm_90a)",
                    head_dim);
  if (dtype != FJ_DTYPE_BF16 && dtype != FJ_DTYPE_F16)
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "dtype %d is not supported (supported: bf16, f16)", (int)dtype);
  int sm = 0;
  fj_status ast = fjg_arch_check(arch, &sm, err, errlen);
  if (ast != FJ_OK) return ast;

  out->head_dim = head_dim;
  out->dtype = dtype;
  memcpy(out->arch, arch, strlen(arch) + 1); /* fjg_arch_check bounded it */
  out->sm = sm;
  return FJ_OK;
}

fj_status fjg_config_choose_template(int head_dim, fj_dtype dtype,
                                     const char *arch,
                                     const char *template_name,
                                     fjg_config *out, char *err,
                                     size_t errlen) {
  fj_status st = config_start(head_dim, dtype, arch, out, err, errlen);
  if (st != FJ_OK) return st;
  if (!template_name || strcmp(template_name, "sm80") == 0)
    return choose_sm80(out, err, errlen);
  if (strcmp(template_name, "sm90") == 0) return choose_sm90(out, err, errlen);
  return fju_fail(err, errlen, FJ_EINVAL,
                  "unknown template '%s' (known: sm80, sm90)", template_name);
}

/* Must equal templates/sm80/bwd_config.cuh's FJB_SMEM_BYTES: K and V, two
 * stages of Q and dO (2-byte elements) and of LSE and delta (fp32), and dS^T
 * with rows padded by 16 bytes. */
static int sm80_bwd_smem_bytes(const fjg_config *c) {
  return (2 * c->block_n + 2 * c->num_stages * c->block_m) * c->head_dim * 2 +
         2 * c->num_stages * c->block_m * 4 + c->block_n * (c->block_m * 2 + 16);
}

/* The sm80 backward (templates/sm80/bwd_*.cuh), FlashAttention-2's shape at
 * D=128: a CTA owns 128 kv rows (16 a warp, 8 warps), whose dK and dV stay in
 * registers (128 a thread at D=128), and streams query tiles of 64 rows
 * through two stages: 147 KiB at D=128 (sm_80's 163 and sm_90's 227 KiB
 * hold it), 83 KiB at D=64. Parts with about 100 KiB (sm_86, sm_89, sm_120)
 * take 64 kv rows (4 warps) and 32-row query tiles at D=128 (70 KiB).
 * Untuned. */
static fj_status choose_sm80_backward(fjg_config *out, char *err, size_t errlen) {
  if (out->head_dim == 256)
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "the backward pass has head dims 64 and 128, not 256 (%s)", out->arch);
  out->template_name = "sm80";
  out->num_stages = 2;
  const int small = small_smem(out->sm) && out->head_dim == 128;
  out->num_warps = small ? 4 : 8;
  out->block_n = 16 * out->num_warps;
  out->block_m = small ? 32 : 64;
  out->threads = out->num_warps * 32;
  out->smem_bytes = sm80_bwd_smem_bytes(out);
  if (out->smem_bytes > max_smem_per_block(out->sm))
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "backward configuration needs %d bytes of shared memory, more than %s "
                    "allows", out->smem_bytes, out->arch);
  return FJ_OK;
}

/* Must equal templates/sm90/bwd_config.cuh's FJHB_SMEM_BYTES: 1024 to align
 * the base; K and V; two stages of Q and dO; two dS^T buffers (block_n x
 * block_m); each consumer's fp32 dQ buffers, two of 64 x head_dim / 2 at
 * block_m 64, one of 64 x head_dim at 128 (dQ split by columns or by rows);
 * two stages of LSE and delta; each stage's next item (four int32);
 * 1 + 3 * stages + 4 * (dQ buffers a consumer)
 * + 6 mbarriers (6: the persistent kernel's); the sequence's record (6
 * int32: its sizes and rows in a packed batch); the persistent kernel's
 * ring of two slots of two int32 (a tile and its piece); two stages of the
 * mask's row values (FJHB_ROWV: one int32 a row), whether the spec has them
 * or not. */
static int sm90_bwd_smem_bytes(const fjg_config *c) {
  const int by_rows = c->block_m == 128;
  const int dq_bufs = by_rows ? 1 : 2, dq_cols = by_rows ? c->head_dim : c->head_dim / 2;
  return 1024 + (2 * c->block_n + 2 * c->num_stages * c->block_m) * c->head_dim * 2 +
         2 * c->block_n * c->block_m * 2 + 2 * dq_bufs * 64 * dq_cols * 4 +
         2 * c->num_stages * c->block_m * 4 + 16 * c->num_stages +
         8 * (1 + 3 * c->num_stages + 4 * dq_bufs + 6) +
         4 * 6 + 8 * 2 + c->num_stages * c->block_m * 4;
}

int fjg_sm90_bwd_block_m(int head_dim) { return head_dim == 64 ? 128 : 64; }

/* The sm90 backward (templates/sm90/bwd_*.cuh), FlashAttention-3's shape: a
 * CTA owns 128 kv rows, 64 for each of two consumer warpgroups (their dK
 * and dV in registers), and streams query tiles through two TMA stages; a
 * producer warpgroup loads and adds dQ. Query tiles of 64 rows at D=128
 * (226 KiB; no shared memory or registers are left for more), 128 at D=64
 * (195 KiB; with 64-row tiles its n64 products left it at 0.86x cuDNN),
 * which fjg_config_backward_variant lowers to 64 where 128 does not fit. */
static fj_status choose_sm90_backward(fjg_config *out, char *err, size_t errlen) {
  const char *a = out->arch;
  if (out->sm != 90 || a[strlen(a) - 1] != 'a')
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "template sm90 needs target sm_90a (wgmma, setmaxnreg), not %s", a);
  if (out->head_dim == 256)
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "the backward pass has head dims 64 and 128, not 256 (%s)", out->arch);
  out->template_name = "sm90";
  out->uses_tma = 1;
  out->num_stages = 2;
  out->num_warps = 12;
  out->threads = 384;
  out->block_m = fjg_sm90_bwd_block_m(out->head_dim);
  out->block_n = 128;
  out->persistent = 1;
  out->smem_bytes = sm90_bwd_smem_bytes(out);
  if (out->smem_bytes > max_smem_per_block(out->sm))
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "backward configuration needs %d bytes of shared memory, more than %s "
                    "allows", out->smem_bytes, out->arch);
  return FJ_OK;
}

void fjg_config_backward_variant(fjg_config *c, int deterministic, int varlen, int block_q) {
  if (!c) return;
  c->deterministic = deterministic ? 1 : 0;
  c->varlen = varlen ? 1 : 0;
  /* The persistent sm90 kernel takes whole sequences of the launch's sizes,
   * and its CTAs take kv tiles in an order the deterministic one cannot
   * wait in (templates/common/bwd_order.cuh). */
  if (c->varlen || c->deterministic) c->persistent = 0;
  /* The sm90 kernel's 128-row tiles give way to 64-row ones where a
   * tile must lie inside 64 rows: a packed sequence's scratch rows are
   * whole tiles of FJG_BWD_SEQ_PAD (64) rows, and a block mask's blocks are
   * whole tiles. */
  if (c->uses_tma && c->block_m != 64 &&
      (c->varlen || (block_q > 0 && block_q % c->block_m != 0))) {
    c->block_m = 64;
    c->smem_bytes = sm90_bwd_smem_bytes(c);
  }
}

fj_status fjg_config_choose_backward(int head_dim, fj_dtype dtype, const char *arch,
                                     const char *template_name, fjg_config *out,
                                     char *err, size_t errlen) {
  fj_status st = config_start(head_dim, dtype, arch, out, err, errlen);
  if (st != FJ_OK) return st;
  if (!template_name || strcmp(template_name, "sm80") == 0)
    return choose_sm80_backward(out, err, errlen);
  if (strcmp(template_name, "sm90") == 0) return choose_sm90_backward(out, err, errlen);
  return fju_fail(err, errlen, FJ_EINVAL,
                  "unknown template '%s' (known: sm80, sm90)", template_name);
}

/* Must equal templates/sm80/decode_config.cuh's FJD_SMEM_BYTES: the Q rows
 * and each warp's ring of K and V slices of 16 rows. */
static int decode_smem_bytes(const fjg_config *c) {
  return (c->block_m + c->num_warps * c->num_stages * 2 * 16) * c->head_dim * 2;
}

fj_status fjg_config_choose_decode(int head_dim, fj_dtype dtype, const char *arch, int rows,
                                   int warps, int stages, fjg_config *out, char *err,
                                   size_t errlen) {
  fj_status st = config_start(head_dim, dtype, arch, out, err, errlen);
  if (st != FJ_OK) return st;
  if (head_dim == 256)
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "the decode kernel has head dims 64 and 128, not 256 (%s)", out->arch);
  if (warps != 0 && warps != 4 && warps != 8)
    return fju_fail(err, errlen, FJ_EUNSUPPORTED, "the decode kernel has 4 or 8 warps, not %d",
                    warps);
  out->template_name = "sm80";
  out->num_warps = warps ? warps : 4;
  out->block_n = 16 * out->num_warps;
  out->block_m = rows > 16 ? 32 : 16;
  /* Slices in flight. 4 warps: as many as keep two CTAs on a
   * multiprocessor (8 warps streaming), 2 to 4: 3 at D=128 and 4 at D=64
   * on sm_90 (228 KiB a multiprocessor), 2 and 4 on sm_80 (164 KiB), 2 on
   * parts with 100 KiB. 8 warps (one CTA a multiprocessor): 2, 16 slices
   * a CTA (16 x 8192 from pages of 16 rows on the H200: 3.79 TB/s, 3.72
   * with 3 stages). */
  if (stages > 0) {
    out->num_stages = stages;
  } else if (out->num_warps == 8) {
    out->num_stages = 2;
  } else {
    const int per_stage = out->num_warps * 2 * 16 * head_dim * 2;
    const int fit = (smem_per_sm(out->sm) / 2 - 1024 - out->block_m * head_dim * 2) / per_stage;
    out->num_stages = fit < 2 ? 2 : fit > 4 ? 4 : fit;
  }
  if (out->num_stages < 2)
    return fju_fail(err, errlen, FJ_EUNSUPPORTED, "the decode kernel needs 2 or more stages");
  out->threads = out->num_warps * 32;
  out->smem_bytes = decode_smem_bytes(out);
  if (out->smem_bytes > max_smem_per_block(out->sm))
    return fju_fail(err, errlen, FJ_EUNSUPPORTED,
                    "decode configuration needs %d bytes of shared memory, more than %s "
                    "allows", out->smem_bytes, out->arch);
  return FJ_OK;
}

fj_status fjg_config_choose_util(fj_dtype dtype, const char *arch, fjg_config *out, char *err,
                                 size_t errlen) {
  fj_status st = config_start(64, dtype, arch, out, err, errlen);
  if (st != FJ_OK) return st;
  out->template_name = "common";
  out->num_warps = 4;
  out->threads = 128;
  return FJ_OK;
}
