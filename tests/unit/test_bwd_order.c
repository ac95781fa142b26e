/*
 * tests/unit/test_bwd_order.c: the deterministic backward's order
 * (templates/common/bwd_order.cuh) agrees with the walk
 * (templates/common/bwd_walk.cuh), run on the CPU.
 *
 * The two templates, with the emitted prologue of a spec, are compiled for
 * the HOST with g++ (CUDA qualifiers defined away; one thread a CTA, so
 * that __syncthreads_count is its own predicate and fjb_order_rank<1> runs
 * every round itself). For every kv tile n of every (batch, kv head) the
 * driver lists the work items of n's walk (fjb_find with a block mask; the
 * walk's classification, fjb_pair_class, without) and the rank of each.
 * Over the kv tiles that hold a (batch, query head, query tile), in
 * descending n, the ranks must be 0, 1, 2, ...: then each waits for exactly
 * the kv tiles before it, and none for a tile that will not come (which on
 * the GPU would hang). The pre kernel's zeroing (fjb_order_zero, CTA by
 * CTA) must cover every semaphore inside the scratch the host sizes.
 *
 * Specs: no mask, causal, a sliding window (GQA), document ids (with and
 * without a block mask, broadcast or per batch), a mask with holes (with
 * and without a block mask) and its transpose; shapes with Lq != Lk that
 * are no multiple of a tile; the sm_80 and sm_86 tiles (64 x 128, 32 x 64)
 * and block masks of 1 and 2 tiles a block. And packed batches (FJ_VARLEN,
 * cu_seqlens): each sequence walked and ranked at its own sizes
 * (fjb_seq_of, empty sequences among them) against semaphores laid out by
 * max_seqlen_q, and each sequence's scratch rows (whole 64-row tiles from
 * its first row) inside its query head's rows and apart from the others'.
 *
 * And the persistent kernel's order of kv tiles (fjb_tile_order, the same
 * host build): every (kv head, kv tile) exactly once, in groups of the
 * given size (the last taking the remainder), kv tile slowest in a group;
 * and its pieces of a split tile (fjb_piece, without a mask or block mask):
 * for every kv tile above and 1, 2, 3, 7 or 33 pieces, each piece's items
 * are its share, and the pieces in turn are the tile's walk.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gen/blockmask_cpu.h"
#include "gen/config.h"
#include "gen/emit_cuda.h"
#include "gen/graph.h"
#include "gen/templates.h"
#include "tests/unit/host_prelude.h"
#include "lua/spec.h"

static const char *const kSpecs[][2] = {
    {"full", "return { score_mod = noop_score() }"},
    {"causal", "return { mask_mod = causal() }"},
    {"sliding", "local window = param('window', 'i32')\n"
                "return { mask_mod = sliding_window(window) }"},
    {"document", "local doc = buffer('doc', 'i32')\n"
                 "return { mask_mod = and_masks(causal(), function(b, h, q, kv)\n"
                 "  return eq(doc[q], doc[kv]) end) }"},
    /* Query bands of 48 rows against kv bands of 80: holes in both
     * directions, and a head-dependent phase. */
    {"holes", "return { mask_mod = function(b, h, q, kv)\n"
              "  return eq((q // 48 + h) % 2, (kv // 80) % 2) end }"},
    {"anticausal", "return { mask_mod = function(b, h, q, kv) return ge(kv, q) end }"},
};
enum { NSPECS = sizeof kSpecs / sizeof kSpecs[0] };

static const char host_prelude[] =
    "#include <math.h>\n#include <stdio.h>\n#include <string.h>\n#include <algorithm>\n"
    "#include <vector>\n"
    "using std::min;\nusing std::max;\n"
    FJT_HOST_INTRINSICS FJT_HOST_ATOMIC
    /* One thread a CTA (and a warp): lane 0. */
    "static inline int fj_tid() { return 0; }\n"
    "static inline unsigned __ballot_sync(unsigned, bool x) { return x ? 1u : 0u; }\n"
    "static inline int __shfl_sync(unsigned, int v, int) { return v; }\n"
    "static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }\n"
    "static inline int __popc(unsigned x) { return __builtin_popcount(x); }\n"
    "static inline int __syncthreads_count(int x) { return x != 0; }\n"
    "static inline void __syncthreads() {}\n";

/* The driver: the walks, their ranks, the check; and the zeroing. */
static const char driver[] =
    "struct fjt_holder { int n, rank; };\n"
    "extern \"C\" int fjt_check(const int *sz, const void *user, int *const *bm, int bm_B,\n"
    "    int bm_H, int bm_nq, int bm_nkv, int block_q, int block_kv, const int *cu_q,\n"
    "    const int *cu_k, long *items, char *msg, int msglen) {\n"
    "  fj_bwd_params p;\n"
    "  memset(&p, 0, sizeof p);\n"
    "  p.sz.B = sz[0], p.sz.Hq = sz[1], p.sz.Hkv = sz[2], p.sz.Lq = sz[3], p.sz.Lk = sz[4];\n"
    /* A packed batch, as runtime/backward.c binds it: Lq and Lk the longest
     * sequence's, a query head's scratch rows total_q + 64 B. */
    "  p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k;\n"
    "  p.acc_sh = cu_q ? cu_q[p.sz.B] + FJB_SEQ_PAD * p.sz.B : p.sz.Lq;\n"
    "  if (cu_q)\n"
    "    for (int b = 0; b < p.sz.B; b++) {\n"
    "      const fjb_seq s = fjb_seq_of(p, b);\n"
    "      const long end = s.acc_q0 + (long)(s.sz.Lq + FJB_SEQ_PAD - 1) / FJB_SEQ_PAD * FJB_SEQ_PAD;\n"
    "      const long next = b + 1 < p.sz.B ? fjb_seq_of(p, b + 1).acc_q0 : p.acc_sh;\n"
    "      if (s.acc_h0 != 0 || s.acc_q0 % FJB_SEQ_PAD != 0 || s.q_row0 != cu_q[b] ||\n"
    "          s.sz.Lq != cu_q[b + 1] - cu_q[b] || s.sz.Lk != cu_k[b + 1] - cu_k[b] ||\n"
    "          s.k_row0 != cu_k[b] || end > next) {\n"
    "        snprintf(msg, msglen, \"sequence %d: scratch rows [%d, %ld) reach %ld, or its\"\n"
    "                 \" sizes or rows are not cu_seqlens'\", b, s.acc_q0, end, next);\n"
    "        return 1;\n"
    "      }\n"
    "    }\n"
    "  p.kv_group = p.sz.Hq / p.sz.Hkv;\n"
    "  memcpy(&p.user, user, sizeof p.user);\n"
    "  p.bm_q_ratio = p.bm_kv_ratio = 1;\n"
    /* As runtime/blockmask.c's fjr_block_mask_bind_bwd binds a mask. */
    "  if (bm) {\n"
    "    p.bm_kv_num = bm[0], p.bm_kv_idx = bm[1], p.bm_full_kv_num = bm[2];\n"
    "    p.bm_full_kv_idx = bm[3], p.bm_q_num = bm[4], p.bm_q_idx = bm[5];\n"
    "    p.bm_full_q_num = bm[6], p.bm_full_q_idx = bm[7];\n"
    "    p.bm_b_stride = bm_B == 1 ? 0 : bm_H * bm_nkv;\n"
    "    p.bm_h_stride = bm_H == 1 ? 0 : bm_nkv;\n"
    "    p.bm_nq = bm_nq, p.bm_nkv = bm_nkv;\n"
    "    p.bm_qb_stride = bm_B == 1 ? 0 : bm_H * bm_nq;\n"
    "    p.bm_qh_stride = bm_H == 1 ? 0 : bm_nq;\n"
    "    p.bm_q_ratio = block_q / FJ_BLOCK_M, p.bm_kv_ratio = block_kv / FJ_BLOCK_N;\n"
    "  }\n"
    "  const int B = p.sz.B, Hq = p.sz.Hq, G = p.kv_group;\n"
    "  const int nk = (p.sz.Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N;\n"
    "  const int nq = (p.sz.Lq + FJ_BLOCK_M - 1) / FJ_BLOCK_M;\n"
    /* The scratch's semaphores, as fj_backward_workspace_size sizes them,
     * poisoned, then zeroed by every pre CTA. */
    "  const long cap = (long)B * Hq * ((p.sz.Lq + FJB_SEM_ROWS - 1) / FJB_SEM_ROWS);\n"
    "  std::vector<int> sems(cap, -7);\n"
    "  p.dq_sem = sems.data();\n"
    "  for (int b = 0; b < B; b++)\n"
    "    for (int h = 0; h < Hq; h++)\n"
    "      for (int q0 = 0; q0 < fjb_seq_of(p, b).sz.Lq; q0 += 64)\n"
    "        fjb_order_zero(p, fjb_seq_of(p, b).sz.Lq, b, h, q0, 64, 0, 1);\n"
    "  std::vector<std::vector<fjt_holder>> hold((size_t)B * Hq * nq);\n"
    "  *items = 0;\n"
    /* Each sequence's kv tiles (the kernel's CTAs past its Lk return at
     * once) walk its query tiles at its sizes. */
    "  for (int b = 0; b < B; b++)\n"
    "    for (int hk = 0; hk < p.sz.Hkv; hk++)\n"
    "      for (int n = 0; n < nk; n++) {\n"
    "        const fj_sizes z = fjb_seq_of(p, b).sz;\n"
    "        if (n * FJ_BLOCK_N >= z.Lk) continue;\n"
    "        const int nqb = (z.Lq + FJ_BLOCK_M - 1) / FJ_BLOCK_M;\n"
    "        const int kv0 = n * FJ_BLOCK_N, kv1 = fjb_kv_last(z, n), h_end = (hk + 1) * G;\n"
    "        std::vector<std::pair<int, int>> walk;\n"
    "        if (bm) {\n"
    "          fjb_item it = fjb_find(p, z, b, n, hk * G, 0, h_end, kv0, kv1);\n"
    "          for (; it.h < h_end; it = fjb_find(p, z, b, n, it.h, it.t + 1, h_end, kv0, kv1))\n"
    "            walk.push_back({it.h, it.i});\n"
    "        } else {\n"
    "          for (int h = hk * G; h < h_end; h++)\n"
    "            for (int i = 0; i < nqb; i++) {\n"
    "#if FJ_HAS_MASK\n"
    "              if (fjb_pair_class(p, z, b, h, i, kv0, kv1) == FJ_TILE_EMPTY) continue;\n"
    "#endif\n"
    "              walk.push_back({h, i});\n"
    "            }\n"
    "        }\n"
    "        /* the persistent kernel's pieces of a walk without a mask or block\n"
    "         * mask (fjb_piece, stepped as fjb_walk steps): in order they are\n"
    "         * the walk, each its share */\n"
    "        for (int pieces : {1, 2, 3, 7, 33}) {\n"
    "          if (bm || FJ_HAS_MASK) break;\n"
    "          std::vector<std::pair<int, int>> joined;\n"
    "          for (int k = 0; k < pieces; k++) {\n"
    "            int pos[4];\n"
    "            fjb_piece(z, hk * G, h_end, k, pieces, pos);\n"
    "            const int before = (int)joined.size(), nw = (int)walk.size();\n"
    "            for (fjb_item it = fjb_find(p, z, b, n, pos[0], pos[1], h_end, kv0, kv1);\n"
    "                 fjb_before(it, pos[2], pos[3]);\n"
    "                 it = fjb_find(p, z, b, n, it.h, it.t + 1, h_end, kv0, kv1))\n"
    "              joined.push_back({it.h, it.i});\n"
    "            const int share = fjb_share(k + 1, nw, pieces) - fjb_share(k, nw, pieces);\n"
    "            if ((int)joined.size() - before != share) {\n"
    "              snprintf(msg, msglen, \"b %d hk %d kv tile %d: piece %d of %d holds %d items,\"\n"
    "                       \" its share of %d is %d\", b, hk, n, k, pieces,\n"
    "                       (int)joined.size() - before, nw, share);\n"
    "              return 1;\n"
    "            }\n"
    "          }\n"
    "          if (joined != walk) {\n"
    "            snprintf(msg, msglen, \"b %d hk %d kv tile %d: %d pieces are not the walk\", b, hk,\n"
    "                     n, pieces);\n"
    "            return 1;\n"
    "          }\n"
    "        }\n"
    "        for (auto &w : walk) {\n"
    "          const int r = fjb_order_rank<1>(p, z, b, n, w.first, w.second);\n"
    "          hold[((size_t)b * Hq + w.first) * nq + w.second].push_back({n, r});\n"
    "          const long at = fjb_order_sem(p, b, w.first, w.second) - sems.data();\n"
    "          if (at < 0 || at >= cap || sems[at] != 0) {\n"
    "            snprintf(msg, msglen, \"b %d h %d tile %d: semaphore %ld of %ld, value %d\",\n"
    "                     b, w.first, w.second, at, cap, at >= 0 && at < cap ? sems[at] : 0);\n"
    "            return 1;\n"
    "          }\n"
    "          ++*items;\n"
    "        }\n"
    "      }\n"
    "  int bad = 0;\n"
    "  for (size_t k = 0; k < hold.size(); k++) {\n"
    "    auto &v = hold[k];\n"
    "    std::sort(v.begin(), v.end(), [](const fjt_holder &x, const fjt_holder &y) {\n"
    "      return x.n > y.n; });\n"
    "    for (size_t j = 0; j < v.size(); j++)\n"
    "      if (v[j].rank != (int)j || (j && v[j].n == v[j - 1].n)) {\n"
    "        if (!bad)\n"
    "          snprintf(msg, msglen, \"b %d h %d tile %d: kv tile %d has rank %d, is number %d\"\n"
    "                   \" of %d holders in descending order\", (int)(k / nq / Hq),\n"
    "                   (int)(k / nq % Hq), (int)(k % nq), v[j].n, v[j].rank, (int)j,\n"
    "                   (int)v.size());\n"
    "        bad++;\n"
    "      }\n"
    "  }\n"
    "  return bad;\n"
    "}\n"
    "extern \"C\" void fjt_tile_order(int nkv, int heads, int group, int *hb, int *kv) {\n"
    "  for (int t = 0; t < nkv * heads; t++) kv[t] = fjb_tile_order(t, nkv, heads, group, &hb[t]);\n"
    "}\n";

typedef int (*check_fn)(const int *sz, const void *user, int *const *bm, int bm_B, int bm_H,
                        int bm_nq, int bm_nkv, int block_q, int block_kv, const int *cu_q,
                        const int *cu_k, long *items, char *msg, int msglen);

static fjg_graph *trace(const char *src) {
  fjg_graph *g = NULL;
  char err[1024] = "";
  if (fjl_trace_spec(src, strlen(src), "spec.lua", &g, NULL, err, sizeof err) != FJ_OK)
    fail_msg("trace failed: %s\n%s", err, src);
  return g;
}

static void put_part(fjg_buf *src, const char *name) {
  size_t len;
  const char *text = fjg_template_text(name, &len);
  if (!text) fail_msg("template %s is not embedded", name);
  fjg_buf_append(src, text, len);
  fjg_buf_printf(src, "\n");
}

/* The templates and the driver for graph g and configuration c, built
 * into a shared object in dir; its fjt_check. */
static check_fn build(const fjg_graph *g, const fjg_config *c, const char *dir, int k,
                      void **lib) {
  fjg_buf src;
  fjg_buf_init(&src);
  fjg_buf_printf(&src, "%s", host_prelude);
  fjg_buf_printf(&src,
                 "#define FJ_HEAD_DIM %d\n#define FJ_DTYPE_BF16 1\n#define FJ_BLOCK_M %d\n"
                 "#define FJ_BLOCK_N %d\n#define FJ_NUM_WARPS %d\n#define FJ_NUM_STAGES %d\n"
                 "#define FJ_HAS_MASK %d\n#define FJ_HAS_SCORE_MOD 0\n"
                 "#define FJ_DETERMINISTIC 1\n#define FJ_VARLEN 1\n",
                 c->head_dim, c->block_m, c->block_n, c->num_warps, c->num_stages,
                 fjg_has_mask(g));
  put_part(&src, "common/fj_common.cuh");
  put_part(&src, "common/fj_grad.cuh");
  assert_int_equal(fjg_emit_interval_rules(g, &src), FJ_OK);
  assert_int_equal(fjg_emit_prologue(g, &src), FJ_OK);
  assert_int_equal(fjg_emit_backward_hooks(g, &src), FJ_OK);
  put_part(&src, "common/fj_bwd.cuh");
  put_part(&src, "common/bwd_walk.cuh");
  put_part(&src, "common/bwd_order.cuh");
  fjg_buf_printf(&src, "%s", driver);
  assert_false(src.failed);
  char cpp[512], so[512], cmd[1600];
  snprintf(cpp, sizeof cpp, "%s/order_%d.cpp", dir, k);
  snprintf(so, sizeof so, "%s/order_%d.so", dir, k);
  FILE *f = fopen(cpp, "wb");
  assert_non_null(f);
  fwrite(src.data, 1, src.len, f);
  fclose(f);
  fjg_buf_free(&src);
  snprintf(cmd, sizeof cmd, "g++ -std=c++17 -O1 -fPIC -shared -w -o %s %s", so, cpp);
  if (system(cmd) != 0) fail_msg("host compile failed: %s", cmd);
  *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!*lib) fail_msg("dlopen: %s", dlerror());
  check_fn fn = (check_fn)dlsym(*lib, "fjt_check");
  assert_non_null(fn);
  return fn;
}

typedef struct shape {
  int B, Hq, Hkv, Lq, Lk;
  int window;        /* the sliding window's param */
  int bm;            /* 0: no block mask; else block_q and block_kv in tiles */
  int bm_B, bm_H;    /* the block mask's B and H (1: broadcast) */
} shape;

static const shape kShapes[] = {
    {1, 2, 2, 300, 517, 100, 0, 0, 0},   {2, 4, 2, 517, 300, 200, 0, 0, 0},
    {1, 4, 1, 1000, 1000, 64, 0, 0, 0},  {2, 2, 1, 77, 1200, 300, 0, 0, 0},
    {2, 4, 2, 640, 640, 150, 1, 1, 1},   {2, 2, 2, 700, 450, 150, 1, 2, 2},
    {1, 6, 3, 513, 1029, 90, 2, 1, 1},   {2, 4, 4, 1029, 513, 90, 2, 2, 4},
    {1, 1, 1, 40, 2000, 33, 2, 1, 1},
};
enum { NSHAPES = sizeof kShapes / sizeof kShapes[0] };

static uint64_t rng = 0x5eed0bd3c0ffee11ull;
static int rnd(int lo, int hi) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return lo + (int)((rng >> 16) % (uint64_t)(hi - lo + 1));
}

/* Packed batches: B sequences of lq[b] queries and lk[b] keys. */
typedef struct packed {
  int B, Hq, Hkv, window;
  int lq[6], lk[6];
} packed;

static const packed kPacked[] = {
    {5, 4, 2, 100, {300, 0, 517, 64, 1}, {300, 77, 517, 1, 0}},
    {3, 2, 1, 40, {129, 1000, 65}, {700, 999, 64}},
};
enum { NPACKED = sizeof kPacked / sizeof kPacked[0] };

/* One shape of one spec against one configuration's driver; cu_q and cu_k
 * (or NULL) make it a packed batch of s->B sequences, s->Lq and s->Lk the
 * longest. */
static long run_shape(check_fn check, const fjg_graph *g, const fjg_config *c, const char *name,
                      const shape *s, const int *cu_q, const int *cu_k) {
  const int len = s->Lq > s->Lk ? s->Lq : s->Lk;
  int32_t *doc = malloc(sizeof(int32_t) * (size_t)len);
  assert_non_null(doc);
  for (int i = 0, d = 0; i < len; i++) { /* documents of 1 to 300 tokens */
    if (i == 0 || rnd(0, 150) == 0) d++;
    doc[i] = d;
  }
  const int nargs = fjg_num_args(g);
  int32_t i32s[8] = {0};
  float f32s[8] = {0};
  const void *data[8] = {0};
  uint64_t ptrs[8] = {0};
  int64_t lens[8] = {0};
  assert_true(nargs <= 8);
  for (int a = 0; a < nargs; a++) {
    i32s[a] = s->window;
    data[a] = doc;
    ptrs[a] = (uint64_t)(uintptr_t)doc;
    lens[a] = len;
  }
  unsigned char user[256];
  assert_true(fjg_user_params_size(g) <= sizeof user);
  fjg_user_params_pack(g, i32s, f32s, ptrs, lens, user);
  fjg_block_mask_host m;
  int32_t *arrays[8] = {0};
  const int bq = s->bm * c->block_m, bk = s->bm * c->block_n;
  if (s->bm) {
    fjg_env env = {{0}, 0, 0, i32s, f32s, data, lens};
    assert_int_equal(
        fjg_block_mask_cpu_build(g, &env, s->bm_B, s->bm_H, s->Lq, s->Lk, bq, bk, &m),
        FJ_OK);
    fjg_block_mask_arrays(&m, arrays);
  }
  const int sz[5] = {s->B, s->Hq, s->Hkv, s->Lq, s->Lk};
  long items = 0;
  char msg[256] = "";
  int bad = check(sz, user, s->bm ? arrays : NULL, s->bm_B, s->bm_H, s->bm ? m.nq : 0,
                  s->bm ? m.nkv : 0, bq, bk, cu_q, cu_k, &items, msg, sizeof msg);
  if (bad)
    fail_msg("%s, %d x %d tiles, B %d H %d/%d %d x %d%s%s: %d bad ranks; %s", name, c->block_m,
             c->block_n, s->B, s->Hq, s->Hkv, s->Lq, s->Lk, s->bm ? " (block mask)" : "",
             cu_q ? " (packed)" : "", bad, msg);
  if (s->bm) fjg_block_mask_host_free(&m);
  free(doc);
  return items;
}

/* The tests build the templates for the host with g++ in a fresh folder
 * (dir, a mkdtemp template), which remove_dir deletes; without g++ they
 * skip. */
static void host_build_dir(char *dir) {
  if (system("g++ --version > /dev/null 2>&1") != 0) {
    print_message("g++ not found; skipping the host run of the templates\n");
    skip();
  }
  assert_non_null(mkdtemp(dir));
}

static void remove_dir(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_ranks_follow_the_walk(void **state) {
  (void)state;
  char dir[] = "/tmp/fj_bwd_order_XXXXXX";
  host_build_dir(dir);
  static const char *archs[] = {"sm_80", "sm_86"};
  int k = 0;
  for (int sp = 0; sp < NSPECS; sp++) {
    fjg_graph *g = trace(kSpecs[sp][1]);
    for (int a = 0; a < 2; a++) {
      fjg_config c;
      char err[256];
      if (fjg_config_choose_backward(128, FJ_DTYPE_BF16, archs[a], NULL, &c, err,
                                     sizeof err) != FJ_OK)
        fail_msg("%s", err);
      void *lib = NULL;
      check_fn check = build(g, &c, dir, k++, &lib);
      long items = 0;
      for (int s = 0; s < NSHAPES; s++) {
        /* Block masks need a mask_mod to build from. */
        if (kShapes[s].bm && !fjg_has_mask(g)) continue;
        items += run_shape(check, g, &c, kSpecs[sp][0], &kShapes[s], NULL, NULL);
      }
      for (int v = 0; v < NPACKED; v++) {
        const packed *pk = &kPacked[v];
        int cu_q[7] = {0}, cu_k[7] = {0};
        shape sh = {pk->B, pk->Hq, pk->Hkv, 0, 0, pk->window, 0, 0, 0};
        for (int b = 0; b < pk->B; b++) {
          cu_q[b + 1] = cu_q[b] + pk->lq[b], cu_k[b + 1] = cu_k[b] + pk->lk[b];
          sh.Lq = pk->lq[b] > sh.Lq ? pk->lq[b] : sh.Lq;
          sh.Lk = pk->lk[b] > sh.Lk ? pk->lk[b] : sh.Lk;
        }
        items += run_shape(check, g, &c, kSpecs[sp][0], &sh, cu_q, cu_k);
      }
      print_message("%-10s %3d x %-3d tiles: %ld work items ranked\n", kSpecs[sp][0],
                    c.block_m, c.block_n, items);
      assert_true(items > 0);
      dlclose(lib);
    }
    fjg_graph_destroy(g);
  }
  remove_dir(dir);
}

typedef void (*order_fn)(int nkv, int heads, int group, int *hb, int *kv);

static void test_tile_order(void **state) {
  (void)state;
  char dir[] = "/tmp/fj_bwd_tile_order_XXXXXX";
  host_build_dir(dir);
  fjg_graph *g = trace(kSpecs[0][1]);
  fjg_config c;
  char err[256];
  if (fjg_config_choose_backward(128, FJ_DTYPE_BF16, "sm_80", NULL, &c, err, sizeof err) !=
      FJ_OK)
    fail_msg("%s", err);
  void *lib = NULL;
  build(g, &c, dir, 0, &lib);
  order_fn order = (order_fn)dlsym(lib, "fjt_tile_order");
  assert_non_null(order);
  /* (kv tiles a head, kv heads, group): one group, exact groups, a
   * remainder smaller and larger than half a group, a group of one. */
  static const int cases[][3] = {{32, 128, 8}, {32, 128, 9}, {7, 23, 5}, {128, 32, 2},
                                 {3, 10, 4},   {5, 6, 6},    {1, 3, 2},  {9, 4, 1},
                                 {2, 276, 132}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int nkv = cases[ci][0], heads = cases[ci][1], group = cases[ci][2];
    const int n = nkv * heads, groups = heads / group > 1 ? heads / group : 1;
    int *hb = malloc(sizeof(int) * (size_t)n), *kv = malloc(sizeof(int) * (size_t)n);
    char *seen = calloc((size_t)n, 1);
    assert_true(hb && kv && seen);
    order(nkv, heads, group, hb, kv);
    for (int t = 0; t < n; t++) {
      if (hb[t] < 0 || hb[t] >= heads || kv[t] < 0 || kv[t] >= nkv)
        fail_msg("%d x %d, group %d: tile %d is (head %d, kv %d)", heads, nkv, group, t, hb[t],
                 kv[t]);
      if (seen[hb[t] * nkv + kv[t]]++)
        fail_msg("%d x %d, group %d: (head %d, kv %d) twice", heads, nkv, group, hb[t], kv[t]);
      /* Group g holds heads [g group, (g + 1) group), the last up to
       * heads, and their tiles [g group nkv, ...). */
      const int gi = hb[t] / group < groups ? hb[t] / group : groups - 1;
      const int lo = gi * group * nkv, hi = gi == groups - 1 ? n : lo + group * nkv;
      if (t < lo || t >= hi)
        fail_msg("%d x %d, group %d: tile %d (head %d) outside its group's [%d, %d)", heads,
                 nkv, group, t, hb[t], lo, hi);
      /* Within a group (kv tile, head) ascends. */
      if (t > lo && (kv[t] < kv[t - 1] || (kv[t] == kv[t - 1] && hb[t] <= hb[t - 1])))
        fail_msg("%d x %d, group %d: tile %d (kv %d, head %d) after (kv %d, head %d)", heads,
                 nkv, group, t, kv[t], hb[t], kv[t - 1], hb[t - 1]);
    }
    free(hb), free(kv), free(seen);
  }
  dlclose(lib);
  fjg_graph_destroy(g);
  remove_dir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ranks_follow_the_walk),
      cmocka_unit_test(test_tile_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
