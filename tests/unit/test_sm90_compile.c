/*
 * tests/unit/test_sm90_compile.c: the sm90 forward template (wgmma + TMA)
 * compiles with NVRTC for sm_90a (CPU only, no GPU needed) for both dtypes
 * and head dims 64 and 128, with a causal mask, a sliding window (param),
 * a softcap + buffer bias score_mod, and a document mask (buffer reads; the
 * usual user of block masks) alone, with its column values (FJ_MASK_COLS)
 * and with a softcap, in the
 * configurations gen/config.c ships; and:
 *   - the PTX holds wgmma.mma_async and cp.async.bulk.tensor, and the
 *     block-mask walk (ld.global.nc of the bm_* lists, compiled into every
 *     kernel: the choice is made at run time by p.bm_kv_num);
 *   - ptxas (--ptxas-options=-v) reports 0 bytes of spill stores and loads
 *     and does not serialize the wgmma pipeline (C7513), nor ignore
 *     setmaxnreg (C7508);
 *   - FJH_SMEM_BYTES equals the configuration's smem_bytes;
 * plus fjg_config_choose_template's choices and refusals, and the host
 * mirror of the tensor maps. Set FJ_TEST_NVRTC_DUMP=DIR to keep the
 * translation units, PTX and logs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <nvrtc.h>

#include "gen/config.h"
#include "runtime/nvrtc.h"
#include "runtime/tma.h"
#include "tests/unit/template_tu.h"

/* Sliding window with an i32 param: tile classes from interval analysis. */
static const char kSliding[] =
    "struct fj_user_params {\n  long long fj_reserved_;\n  int a_window;\n};\n"
    "__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,\n"
    "    int b, int h, int q, int kv) {\n  bool t0 = kv <= q;\n  int t1 = q - kv;\n"
    "  bool t2 = t1 < u.a_window;\n  return t0 && t2;\n}\n"
    "__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,\n"
    "    const fj_sizes &z, float score, int b, int h, int q, int kv) {\n"
    "  return score;\n}\n" FJT_SCORE_LOG2
    "__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,\n"
    "    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1) {\n"
    "  if (kv0 > q1 || q0 - kv1 >= u.a_window) return FJ_TILE_EMPTY;\n"
    "  if (kv1 <= q0 && q1 - kv0 < u.a_window) return FJ_TILE_FULL;\n"
    "  return FJ_TILE_PARTIAL;\n}\n";

/* Document mask (causal within a document) as gen/emit_cuda.c writes it,
 * with a classifier that only knows the causal part; optionally a softcap
 * score_mod, the case where mask, score_mod and the block-mask walk all
 * share the consumers' registers (D=128 runs the loop without overlap). */
#define DOC_PARAMS                                                            \
  "struct fj_user_params {\n  long long fj_reserved_;\n  const int *a_doc;\n" \
  "  long long n_doc;\n};\n"
#define DOC_MASK                                                              \
  "__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,\n" \
  "    int b, int h, int q, int kv) {\n"                                      \
  "  const int t0 = fj_load_i32(u.a_doc, u.n_doc, q);\n"                     \
  "  const int t1 = fj_load_i32(u.a_doc, u.n_doc, kv);\n"                    \
  "  return t0 == t1 && q >= kv;\n}\n"
#define DOC_CLASS                                                             \
  "__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,\n"  \
  "    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1) {\n" \
  "  if (kv0 > q1) return FJ_TILE_EMPTY;\n  return FJ_TILE_PARTIAL;\n}\n"
static const char kDocument[] =
    DOC_PARAMS DOC_MASK
    "__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,\n"
    "    const fj_sizes &z, float score, int b, int h, int q, int kv) {\n"
    "  return score;\n}\n" FJT_SCORE_LOG2 DOC_CLASS;
/* The same mask with its keys' ids as column values (FJ_MASK_COLS, as the
 * emitter writes a forward unit of it): the masked tiles read them once a
 * warp and shuffle them (sm90/softmax.cuh, fjh_mask_cols). */
static const char kDocumentCols[] =
    "#define FJ_MASK_COLS 1\n" DOC_PARAMS DOC_MASK
    "__device__ __forceinline__ void fj_mask_cols(const fj_user_params &u, const fj_sizes &z,\n"
    "    int b, int h, int kv, unsigned (&v)[1]) {\n"
    "  v[0] = (unsigned)fj_load_i32(u.a_doc, u.n_doc, kv);\n}\n"
    "__device__ __forceinline__ bool fj_mask_from_cols(const fj_user_params &u,\n"
    "    const fj_sizes &z, int b, int h, int q, int kv, const unsigned (&v)[1]) {\n"
    "  return fj_load_i32(u.a_doc, u.n_doc, q) == (int)v[0] && q >= kv;\n}\n"
    "__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,\n"
    "    const fj_sizes &z, float score, int b, int h, int q, int kv) {\n"
    "  return score;\n}\n" FJT_SCORE_LOG2 DOC_CLASS;
static const char kDocumentSoftcap[] =
    DOC_PARAMS DOC_MASK
    "__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,\n"
    "    const fj_sizes &z, float score, int b, int h, int q, int kv) {\n"
    "  const float t0 = score * 0.0333333351f;\n  const float t1 = fj_tanh_f32(t0);\n"
    "  return t1 * 30.0f;\n}\n" FJT_SCORE_LOG2 DOC_CLASS;

/* The translation unit, plus a check that the template's shared-memory size
 * is the configuration's. */
static char *build_tu(const fjg_config *c, int has_mask, int has_score_mod,
                      const char *prologue) {
  char tail[512];
  snprintf(tail, sizeof tail,
           "\nstatic_assert(FJH_SMEM_BYTES == %d, \"smem size differs from gen/config.c\");\n"
           "static_assert(sizeof(fj_tma_maps) == 640 && 4 * sizeof(fjh_tensor_map) == 512,\n"
           "              \"tensor map block\");\n",
           c->smem_bytes);
  return fjt_build_tu(c, has_mask, has_score_mod, prologue, tail);
}

/* overlap: 1 the default (intra-warpgroup overlap on), 0 compiled with
 * -DFJ_INTRA_WG_OVERLAP=0, which the runtime falls back to when the default
 * spills (runtime/forward.c, refit_spilling). persistent: 0 the one-tile
 * kernel, 1 the persistent one, 2 the long-row variant (one tile, kv tiles
 * of 176 rows; D=128). */
static void compile_one_as(int head_dim, fj_dtype dt, int has_mask, int has_score_mod,
                           const char *prologue, const char *what, int overlap,
                           int persistent) {
  fjg_config c;
  char err[256];
  if (fjg_config_choose_template(head_dim, dt, "sm_90a", "sm90", &c, err, sizeof err) !=
      FJ_OK)
    fail_msg("config: %s", err);
  /* FJ_PERSISTENT, FJ_Q_BUFS (D=128's default is persistent: say which). */
  fjg_config_set_persistent(&c, persistent == 1);
  if (persistent == 2) assert_int_equal(fjg_config_set_long_rows(&c), 0);
  char *tu = build_tu(&c, has_mask, has_score_mod, prologue);
  /* The dump files' name, and the unit's in a failure. */
  char stem[128];
  snprintf(stem, sizeof stem, "sm90_%s_d%d_%s%s", what, head_dim,
           dt == FJ_DTYPE_F16 ? "f16" : "bf16", persistent == 2 ? "_n176" : "");
  fjt_dump(stem, "cu", tu);
  const char *opts[6] = {"-std=c++17", "-default-device", "--gpu-architecture=sm_90a",
                         "--ptxas-options=-v"};
  int nopts = 4;
  if (!overlap) opts[nopts++] = "-DFJ_INTRA_WG_OVERLAP=0";
  double t0 = fjt_now_ms();
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, tu, "fj_fwd_sm90.cu", 0, NULL, NULL),
                   NVRTC_SUCCESS);
  nvrtcResult r = nvrtcCompileProgram(prog, nopts, opts);
  double ms = fjt_now_ms() - t0;
  char *log = fjt_program_log(prog);
  if (r == NVRTC_SUCCESS && overlap && has_score_mod &&
      fjr_nvrtc_log_spill_bytes(log) > 0) {
    /* What the runtime does with such a kernel: compile it without the
     * overlap, which must not spill. */
    printf("  %-12s D=%-3d%s spills with the overlap (%ld bytes): without it\n", what,
           head_dim, persistent == 1 ? " persistent" : persistent == 2 ? " long rows" : "", fjr_nvrtc_log_spill_bytes(log));
    free(log);
    nvrtcDestroyProgram(&prog);
    free(tu);
    compile_one_as(head_dim, dt, has_mask, has_score_mod, prologue, what, 0, persistent);
    return;
  }
  fjt_dump(stem, "log", log);
  fjt_require_compiled(r, log, stem);
  char *ptx = fjt_program_ptx(prog);
  fjt_dump(stem, "ptx", ptx);
  assert_non_null(strstr(ptx, "wgmma.mma_async"));
  assert_non_null(strstr(ptx, "cp.async.bulk.tensor"));
  assert_non_null(strstr(ptx, "setmaxnreg"));
  assert_non_null(strstr(ptx, "ld.global.nc"));
  size_t cubin_size = 0;
  assert_int_equal(nvrtcGetCUBINSize(prog, &cubin_size), NVRTC_SUCCESS);
  assert_true(cubin_size > 0);
  if (persistent == 1) {
    /* Its spills are reported, not refused (the runtime compiles it again
     * without the overlap, refit_spilling). */
    long spilled = fjr_nvrtc_log_spill_bytes(log);
    assert_true(spilled >= 0);
    if (spilled > 0) printf("  %-12s D=%-3d persistent: %ld bytes of spills\n", what, head_dim, spilled);
  } else {
    assert_true(fjt_check_no_spills(log, what) >= 1);
  }
  /* C7513, C7515: "wgmma.mma_async instructions are serialized" (every
   * wgmma waits for the previous one: the overlap is gone). */
  if (strstr(log, "serialized") || strstr(log, "C7513") || strstr(log, "C7515"))
    fail_msg("%s D=%d: ptxas serialized wgmma:\n%s", what, head_dim, log);
  if (strstr(log, "C7508")) fail_msg("%s D=%d: setmaxnreg ignored:\n%s", what, head_dim, log);
  /* gen/config.c reserves 5120 bytes of static shared memory next to the
   * dynamic, 9216 in the persistent kernel (SM90_STATIC_SMEM): ptxas's "N
   * bytes smem" must not exceed it. */
  assert_non_null(strstr(log, "bytes smem"));
  const int static_smem = fjt_max_static_smem(log);
  if (static_smem > (persistent == 1 ? 9216 : 5120))
    fail_msg("%s D=%d: %d bytes of static shared memory", what, head_dim, static_smem);
  printf("  %-12s D=%-3d %-4s sm_90a %d x %d, %d stages, smem %d%s%s: %6.0f ms, cubin %zu B\n",
         what, head_dim, dt == FJ_DTYPE_F16 ? "f16" : "bf16", c.block_m, c.block_n,
         c.num_stages, c.smem_bytes, overlap ? "" : ", no overlap",
         persistent == 1 ? ", persistent" : persistent == 2 ? ", long rows" : "", ms,
         cubin_size);
  free(ptx);
  free(log);
  nvrtcDestroyProgram(&prog);
  free(tu);
}

static void compile_one(int head_dim, fj_dtype dt, int has_mask, int has_score_mod,
                        const char *prologue, const char *what) {
  compile_one_as(head_dim, dt, has_mask, has_score_mod, prologue, what, 1, 0);
  /* The persistent kernel (FJ_PERSISTENT, fjg_config.persistent): one dtype,
   * which changes no code path, at D = 64 and 128. */
  if (dt == FJ_DTYPE_BF16 && head_dim != 256)
    compile_one_as(head_dim, dt, has_mask, has_score_mod, prologue, what, 1, 1);
  /* The long-row variant (fjg_config_set_long_rows): D=128, one dtype;
   * launches take it for specs without a score_mod only. */
  if (dt == FJ_DTYPE_BF16 && head_dim == 128 && !has_score_mod)
    compile_one_as(head_dim, dt, has_mask, has_score_mod, prologue, what, 1, 2);
}

static void run_matrix(int has_mask, int has_score_mod, const char *prologue,
                       const char *what) {
  static const int dims[] = {64, 128};
  static const fj_dtype dts[] = {FJ_DTYPE_BF16, FJ_DTYPE_F16};
  for (size_t d = 0; d < 2; d++)
    for (size_t t = 0; t < 2; t++)
      compile_one(dims[d], dts[t], has_mask, has_score_mod, prologue, what);
  /* D = 256 (128 O accumulators a consumer thread): one dtype, which
   * changes no code path; keeps the CI time down. */
  compile_one(256, FJ_DTYPE_BF16, has_mask, has_score_mod, prologue, what);
}

static void test_causal(void **state) {
  (void)state;
  run_matrix(1, 0, fjt_causal, "causal");
}

static void test_sliding(void **state) {
  (void)state;
  run_matrix(1, 0, kSliding, "sliding");
}

static void test_softcap_bias(void **state) {
  (void)state;
  run_matrix(0, 1, fjt_softcap_bias, "softcap+bias");
}

static void test_document(void **state) {
  (void)state;
  run_matrix(1, 0, kDocument, "document");
}

static void test_document_cols(void **state) {
  (void)state;
  run_matrix(1, 0, kDocumentCols, "doc cols");
}

/* One dtype: the dtype changes no code path, and these compile slowly. */
static void test_document_softcap(void **state) {
  (void)state;
  compile_one(64, FJ_DTYPE_BF16, 1, 1, kDocumentSoftcap, "doc+softcap");
  compile_one(128, FJ_DTYPE_BF16, 1, 1, kDocumentSoftcap, "doc+softcap");
}

/* A variant built from optional macros (defs: "-DNAME=VALUE" options) must
 * keep compiling: every tunable of sm90/config.cuh at a value other than
 * its default, and the FJ_TRACE builds (timing only, bench/trace.py; their
 * stamps read %clock), which must not spill on their register budgets
 * (check_spills: a spill would time another kernel); persistent: 1, the
 * configuration of the persistent kernel (FLEXJIT_PERSISTENT=1), with its Q
 * buffers; 2, two consumer warpgroups (D=64's kernel for block masks of
 * 128-row blocks, and its traced build: three consumers are not traced). */
static void compile_variant(const char *what, int head_dim, int has_mask,
                            const char *prologue, const char *const *defs, int ndefs,
                            int check_spills, int persistent) {
  fjg_config c;
  char err[256];
  if (fjg_config_choose_template(head_dim, FJ_DTYPE_BF16, "sm_90a", "sm90", &c, err,
                                 sizeof err) != FJ_OK)
    fail_msg("config: %s", err);
  fjg_config_set_persistent(&c, persistent == 1);  /* D=128's default is persistent */
  if (persistent == 2) {
    assert_int_equal(fjg_config_set_consumers(&c, 2), 0);
    assert_int_equal(c.num_warps, 12);
  } else if (persistent) {
    fjg_config_set_persistent(&c, 1);
    /* Two Q buffers beside the K/V stages where they fit: not at D=256. */
    assert_int_equal(c.q_bufs, head_dim == 256 ? 1 : 2);
    /* Static shared memory: two block-mask rows and the ring, about 8.3 KB. */
    assert_true(c.smem_bytes + 9216 <= 227 * 1024);
  }
  char *tu = build_tu(&c, has_mask, 0, prologue);
  const char *opts[10] = {"-std=c++17", "-default-device", "--gpu-architecture=sm_90a",
                          "--ptxas-options=-v"};
  int nopts = 4;
  for (int i = 0; i < ndefs && nopts < 10; i++) opts[nopts++] = defs[i];
  nvrtcProgram prog;
  assert_int_equal(nvrtcCreateProgram(&prog, tu, "fj_fwd_sm90_variant.cu", 0, NULL, NULL),
                   NVRTC_SUCCESS);
  nvrtcResult r = nvrtcCompileProgram(prog, nopts, opts);
  char *log = fjt_program_log(prog);
  fjt_require_compiled(r, log, what);
  if (check_spills) assert_true(fjt_check_no_spills(log, what) >= 1);
  /* Serialized wgmma (C7512-C7520) would time another kernel. Not checked
   * where spills are allowed (the mbarrier poll counter's registers
   * serialize them, C7512), nor in the traces: the traced persistent kernel
   * has them (C7520, a WG.AR in a divergent path around its stamps). */
  int traced = 0;
  for (int i = 0; i < ndefs; i++) traced |= !strcmp(defs[i], "-DFJ_TRACE=1");
  if (check_spills && !traced && (strstr(log, "serialized") || strstr(log, "C7513") ||
                                  strstr(log, "C7515") || strstr(log, "C7520")))
    fail_msg("%s D=%d: ptxas serialized wgmma:\n%s", what, head_dim, log);
  char *ptx = fjt_program_ptx(prog);
  /* The value took effect. FJ_VARLEN, FJ_SKIP: the unit without them (their
   * code folded away) is other code. */
  for (int i = 0; i < ndefs; i++)
    if (!strcmp(defs[i], "-DFJ_VARLEN=1") || !strcmp(defs[i], "-DFJ_SKIP=1")) {
      nvrtcProgram plain;
      assert_int_equal(nvrtcCreateProgram(&plain, tu, "fj_fwd_sm90_plain.cu", 0, NULL, NULL),
                       NVRTC_SUCCESS);
      assert_int_equal(nvrtcCompileProgram(plain, 3, opts), NVRTC_SUCCESS);
      char *other = fjt_program_ptx(plain);
      assert_true(strlen(other) < strlen(ptx) && strcmp(other, ptx) != 0);
      free(other);
      nvrtcDestroyProgram(&plain);
    }
  for (int i = 0; i < ndefs; i++) {
    if (!strcmp(defs[i], "-DFJ_TRACE=1")) assert_non_null(strstr(ptx, "%clock"));
    /* Only the ping-pong's turns use bar.arrive. */
    if (!strcmp(defs[i], "-DFJ_PINGPONG=0")) assert_null(strstr(ptx, "bar.arrive"));
    if (!strncmp(defs[i], "-DFJ_DEBUG_WAIT_LIMIT=", 22)) assert_non_null(strstr(ptx, "trap;"));
    if (!strcmp(defs[i], "-DFJ_CONSUMER_REGS=232"))
      assert_non_null(strstr(ptx, "setmaxnreg.inc.sync.aligned.u32 232"));
  }
  printf("  %-34s D=%-3d compiled%s\n", what, head_dim, check_spills ? ", no spills" : "");
  free(ptx);
  free(log);
  nvrtcDestroyProgram(&prog);
  free(tu);
}

static void test_variants_compile(void **state) {
  (void)state;
  static const char *const trace[] = {"-DFJ_TRACE=1"};
  static const char *const no_pingpong[] = {"-DFJ_PINGPONG=0"};
  static const char *const no_overlap[] = {"-DFJ_INTRA_WG_OVERLAP=0"};
  static const char *const regs[] = {"-DFJ_PRODUCER_REGS=40", "-DFJ_CONSUMER_REGS=232"};
  static const char *const emu[] = {"-DFJ_EXP2_EMU=1"};
  static const char *const bm_cache[] = {"-DFJ_BM_CACHE=2"};
  static const char *const wait_limit[] = {"-DFJ_DEBUG_WAIT_LIMIT=100000000"};
  /* The traces must not spill either: a spill would time another kernel. */
  compile_variant("causal, FJ_TRACE", 128, 1, fjt_causal, trace, 1, 1, 0);
  compile_variant("document, FJ_TRACE", 64, 1, kDocumentCols, trace, 1, 1, 2);
  /* D=64 with two consumers: the kernel block masks of 128-row blocks take. */
  compile_variant("document, two consumers", 64, 1, kDocumentCols, NULL, 0, 1, 2);
  compile_variant("causal, FJ_TRACE persistent", 128, 1, fjt_causal, trace, 1, 1, 1);
  /* The tunables: the ping-pong off; the spill fallback (no overlap); a
   * register split; every exponential on the FMA pipe; block-mask rows past
   * two blocks read from global memory (what tests set to reach that path);
   * the mbarrier poll limit (its counter may spill). */
  compile_variant("causal, FJ_PINGPONG=0 persistent", 128, 1, fjt_causal, no_pingpong, 1,
                  1, 1);
  compile_variant("document, FJ_INTRA_WG_OVERLAP=0", 128, 1, kDocumentCols, no_overlap, 1, 1,
                  1);
  compile_variant("causal, registers 40 / 232", 128, 1, fjt_causal, regs, 2, 1, 0);
  compile_variant("causal, FJ_EXP2_EMU=1", 64, 1, fjt_causal, emu, 1, 1, 0);
  compile_variant("document, FJ_BM_CACHE=2 persistent", 128, 1, kDocumentCols, bm_cache, 1, 1,
                  1);
  compile_variant("causal, FJ_DEBUG_WAIT_LIMIT", 128, 1, fjt_causal, wait_limit, 1, 0, 0);
  /* The persistent kernel at D=256, with one Q buffer (compile_one covers
   * D=64 and 128, with two). Not shipped: its producer threads spill a few
   * bytes at 40 registers (the consumers need 232), which is allowed. */
  compile_variant("causal, persistent", 256, 1, fjt_causal, NULL, 0, 0, 1);
  /* The serving layouts' variant (FJ_VARLEN: seqlens_k, packed batches,
   * paged KV), which launches with them take: without spills where they
   * run most (D=128, persistent or not); compiled at D=64 and 256. */
  static const char *const varlen[] = {"-DFJ_VARLEN=1"};
  compile_variant("causal, FJ_VARLEN persistent", 128, 1, fjt_causal, varlen, 1, 1, 1);
  compile_variant("document, FJ_VARLEN", 128, 1, kDocumentCols, varlen, 1, 1, 0);
  compile_variant("document, FJ_VARLEN", 64, 1, kDocumentCols, varlen, 1, 0, 0);
  compile_variant("causal, FJ_VARLEN", 256, 1, fjt_causal, varlen, 1, 0, 0);
  /* Skip Softmax's variant (FJ_SKIP), alone and with FJ_VARLEN. */
  static const char *const skip[] = {"-DFJ_SKIP=1"};
  static const char *const skip_varlen[] = {"-DFJ_SKIP=1", "-DFJ_VARLEN=1"};
  /* Without spills in the one-tile kernel at D=128, which the runtime gives
   * it (its persistent kernel spills with the overlap, and D=64's three
   * consumers spill: both then run the spill fallback). */
  compile_variant("causal, FJ_SKIP", 128, 1, fjt_causal, skip, 1, 1, 0);
  compile_variant("document, FJ_SKIP FJ_VARLEN", 128, 1, kDocumentCols, skip_varlen, 2, 1, 0);
  compile_variant("causal, FJ_SKIP persistent", 128, 1, fjt_causal, skip, 1, 0, 1);
  compile_variant("causal, FJ_SKIP", 64, 1, fjt_causal, skip, 1, 0, 0);
}

static void test_choose_template(void **state) {
  (void)state;
  fjg_config c;
  char err[256] = "untouched";
  /* NULL is fjg_config_choose's answer: sm80 everywhere for now. */
  assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, "sm_90a", NULL, &c,
                                              err, sizeof err), FJ_OK);
  assert_string_equal(c.template_name, "sm80");
  assert_int_equal(c.uses_tma, 0);
  assert_string_equal(err, "");
  fjg_config d;
  assert_int_equal(fjg_config_choose(128, FJ_DTYPE_BF16, "sm_90a", &d, NULL, 0), FJ_OK);
  assert_memory_equal(&c, &d, sizeof c);
  assert_int_equal(fjg_config_choose_template(64, FJ_DTYPE_F16, "sm_90a", "sm80", &c,
                                              err, sizeof err), FJ_OK);
  assert_string_equal(c.template_name, "sm80");

  assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, "sm_90a", "sm90", &c,
                                              err, sizeof err), FJ_OK);
  assert_string_equal(c.template_name, "sm90");
  assert_int_equal(c.uses_tma, 1);
  assert_int_equal(c.threads, 384);
  assert_int_equal(c.num_warps, 12);
  assert_int_equal(c.block_m, 128);
  /* Persistent at D=128: two Q buffers. */
  assert_int_equal(c.persistent, 1);
  assert_int_equal(c.smem_bytes, 1024 + (2 * 128 + 2 * 2 * 128) * 128 * 2 + 8 * 9);
  assert_true(c.smem_bytes <= 227 * 1024);
  assert_int_equal(fjg_config_choose_template(64, FJ_DTYPE_F16, "sm_90a", "sm90", &c,
                                              err, sizeof err), FJ_OK);
  assert_int_equal(c.num_stages, 3);

  static const char *no_wgmma[] = {"sm_90", "sm_80", "sm_89", "sm_100a", "sm_120a"};
  for (size_t i = 0; i < sizeof no_wgmma / sizeof no_wgmma[0]; i++) {
    err[0] = '\0';
    assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, no_wgmma[i], "sm90",
                                                &c, err, sizeof err), FJ_EUNSUPPORTED);
    assert_non_null(strstr(err, "sm_90a"));
    assert_non_null(strstr(err, no_wgmma[i]));
  }
  assert_int_equal(fjg_config_choose_template(128, FJ_DTYPE_BF16, "sm_90a", "sm70", &c,
                                              err, sizeof err), FJ_EINVAL);
  assert_non_null(strstr(err, "unknown template 'sm70'"));
  /* The usual argument checks come first. */
  assert_int_equal(fjg_config_choose_template(96, FJ_DTYPE_BF16, "sm_90a", "sm90", &c,
                                              err, sizeof err), FJ_EUNSUPPORTED);
}

static void test_tma_host_mirror(void **state) {
  (void)state;
  assert_int_equal(sizeof(fjr_tma_maps), 640);
  assert_int_equal(_Alignof(fjr_tma_maps), 128);
  assert_int_equal(offsetof(fjr_tma_maps, k), 128);
  assert_int_equal(offsetof(fjr_tma_maps, v), 256);
  assert_int_equal(offsetof(fjr_tma_maps, o), 384);
  assert_int_equal(offsetof(fjr_tma_maps, sched), 512);
  assert_int_equal(offsetof(fjr_tma_maps, o_ok), 520);
  fjg_config c;
  assert_int_equal(fjg_config_choose(128, FJ_DTYPE_BF16, "sm_80", &c, NULL, 0), FJ_OK);
  fjr_fwd_params_fixed p;
  memset(&p, 0, sizeof p);
  fjr_tma_maps maps;
  char err[256] = "";
  /* A fake driver table: only the argument checks run before encoding. */
  fjr_driver drv;
  memset(&drv, 0, sizeof drv);
  assert_int_equal(fjr_tma_maps_build(&drv, &c, &p, NULL, &maps, err, sizeof err), FJ_EINVAL);
  assert_non_null(strstr(err, "sm80"));
  assert_int_equal(fjr_tma_maps_build(NULL, &c, &p, NULL, &maps, err, sizeof err), FJ_EINVAL);
}

/* A stand-in for cuTensorMapEncodeTiled that counts its calls and succeeds. */
static int fake_encodes;
static CUresult fake_encode(CUtensorMap *m, CUtensorMapDataType dt, cuuint32_t rank,
                            void *addr, const cuuint64_t *dims, const cuuint64_t *strides,
                            const cuuint32_t *box, const cuuint32_t *estride,
                            CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                            CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  (void)dt; (void)rank; (void)addr; (void)dims; (void)strides; (void)box;
  (void)estride; (void)il; (void)sw; (void)l2; (void)oob;
  memset(m, 0, sizeof *m);
  fake_encodes++;
  return CUDA_SUCCESS;
}

/* O's map is encoded for the kernels that store O through it, and not for
 * the persistent kernel with one Q buffer (D=256), which never reads it. */
static void test_tma_o_map(void **state) {
  (void)state;
  fjr_driver drv;
  memset(&drv, 0, sizeof drv);
  drv.cuTensorMapEncodeTiled = fake_encode;
  static const int head_dims[] = {64, 128, 256};
  for (size_t i = 0; i < 3; i++) {
    for (int persistent = 0; persistent <= 1; persistent++) {
      const int D = head_dims[i];
      fjg_config c;
      assert_int_equal(fjg_config_choose_template(D, FJ_DTYPE_BF16, "sm_90a", "sm90", &c,
                                                  NULL, 0), FJ_OK);
      fjg_config_set_persistent(&c, persistent);
      fjr_fwd_params_fixed p;
      memset(&p, 0, sizeof p);
      p.q = p.k = p.v = p.o = 4096;
      p.sz.B = 1; p.sz.Hq = p.sz.Hkv = 2; p.sz.Lq = p.sz.Lk = 256;
      p.q_ss = p.k_ss = p.v_ss = p.o_ss = D;
      p.q_sh = p.k_sh = p.v_sh = p.o_sh = 256 * D;
      p.q_sb = p.k_sb = p.v_sb = p.o_sb = 512 * D;
      fjr_tma_maps maps;
      char err[256] = "";
      fake_encodes = 0;
      assert_int_equal(fjr_tma_maps_build(&drv, &c, &p, NULL, &maps, err, sizeof err), FJ_OK);
      const int o_used = !(c.persistent && c.q_bufs < 2);
      assert_int_equal(maps.o_ok, o_used);
      assert_int_equal(fake_encodes, 3 + o_used);
      if (D == 256 && persistent) assert_int_equal(o_used, 0);
      if (D == 128) assert_int_equal(o_used, 1);
    }
  }
}

int main(void) {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  printf("NVRTC %d.%d\n", major, minor);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_choose_template),
      cmocka_unit_test(test_tma_host_mirror),
      cmocka_unit_test(test_tma_o_map),
      cmocka_unit_test(test_variants_compile),
      cmocka_unit_test(test_causal),
      cmocka_unit_test(test_sliding),
      cmocka_unit_test(test_softcap_bias),
      cmocka_unit_test(test_document),
      cmocka_unit_test(test_document_cols),
      cmocka_unit_test(test_document_softcap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
