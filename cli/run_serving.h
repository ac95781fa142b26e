/*
 * cli/run_serving.h: the host side of `flexjit run`'s serving layouts
 * (--page-size, --seqlens-k, --varlen; docs/serving.md): each sequence's
 * lengths, where its rows lie in the host tensors, the page pools and the
 * block table, and the float64 references (the forward's, and the
 * backward's for --backward --varlen) computed one sequence at a time at
 * its own lengths.
 *
 * Host tensors (floats holding the values the kernel sees):
 *  - contiguous and paged runs keep q, o [B, Hq, Lq, D], k, v [B, Hkv, Lk,
 *    D] and lse [B, Hq, Lq] (BHSD), as a run without serving options; a
 *    sequence uses kv positions [0, lk[b]);
 *  - --varlen packs q and o [total_q, Hq, D], k and v [total_k, Hkv, D]
 *    and lse [Hq, total_q], the layout the kernel reads (sequence b's rows
 *    from cu_q[b] and cu_k[b]).
 * Paged runs copy the logical K and V into pools [num_pages, page_size,
 * Hkv, D]: sequence b's j-th page is block_table[b * max_pages + j], the
 * pages of all sequences a seeded shuffle of [0, num_pages).
 *
 * A spec that reads b (or the batch size) is refused in these layouts: the
 * reference and the counts evaluate each sequence alone.
 */
#ifndef FJ_CLI_RUN_SERVING_H
#define FJ_CLI_RUN_SERVING_H

#include <stddef.h>
#include <stdint.h>

#include "cli/cli.h"
#include "gen/graph.h"

typedef struct cli_seqs {
  int n;           /* sequences: --batch, or --varlen's count */
  int varlen;      /* packed layout, cu_seqlens */
  int per_seq_k;   /* seqlens_k is passed (paged or --seqlens-k) */
  int32_t *lq, *lk;     /* [n] each sequence's query and kv lengths */
  int32_t *cu_q, *cu_k; /* [n + 1] row offsets (varlen; else b * Lq, b * Lk) */
  int64_t total_q, total_k; /* rows of the host q and k per head */
  int max_q, max_k;
  /* Paged: 0 when not. */
  int page_size, max_pages, num_pages;
  int32_t *block_table; /* [n * max_pages], unused entries 0 */
} cli_seqs;

/* 1 when a run uses a serving layout (per-sequence lengths). */
int cli_seqs_wanted(const run_config *c);

/* The lengths and, for --page-size, the block table, from c (its seed).
 * 0, or -1 with a message in err. */
int cli_seqs_build(cli_seqs *L, const run_config *c, char *err, size_t errlen);
void cli_seqs_free(cli_seqs *L);

/* 1 when the spec's mask_mod or score_mod reads b or the batch size (a
 * node they reach does; the tracer makes nodes for every argument). */
int cli_graph_reads_batch(const fjg_graph *g);

/* Float offsets of query row (b, h, i) in the host q and o, of kv row (b,
 * hk, j) in the host k and v, and the index of (b, h, i) in the host lse. */
size_t cli_seqs_q_at(const cli_seqs *L, const run_config *c, int b, int h, int i);
size_t cli_seqs_k_at(const cli_seqs *L, const run_config *c, int b, int hk, int j);
size_t cli_seqs_lse_at(const cli_seqs *L, const run_config *c, int b, int h, int i);

/* Elements of the host q (and o), k (and v), lse. */
size_t cli_seqs_nq(const cli_seqs *L, const run_config *c);
size_t cli_seqs_nk(const cli_seqs *L, const run_config *c);
size_t cli_seqs_nl(const cli_seqs *L, const run_config *c);

/* Elements of one page pool (num_pages * page_size * Hkv * D). */
size_t cli_seqs_pool_elems(const cli_seqs *L, const run_config *c);

/* The pool [num_pages, page_size, Hkv, D] of the logical host tensor x (k
 * or v): position j < lk[b] of sequence b at row j % page_size of page
 * block_table[b][j / page_size]; every other row 0. */
void cli_seqs_fill_pool(const cli_seqs *L, const run_config *c, const float *x,
                        float *pool);

/* The float64 reference (ro, rl), the computation in the input dtype (lo,
 * ll) and the rows whose mask the CPU cannot decide the kernel's way
 * (skip_o per row of o: index cli_seqs_q_at / D; skip_l per lse index),
 * each sequence computed alone at its lengths (fjg_reference_dense, _lowp,
 * _uncertain_rows), in the host layouts above. Query rows of a sequence
 * past lq[b] (none in these layouts) are not written. 0, or -1 with a
 * message in err. */
int cli_seqs_reference(const cli_seqs *L, const run_config *c,
                       const fjg_graph *g, const fjg_env *env, double scale,
                       const float *q, const float *k, const float *v,
                       double *ro, float *lo, double *rl, float *ll,
                       uint8_t *skip_o, uint8_t *skip_l, char *err,
                       size_t errlen);

/* The backward's references (--backward --check), in the host layouts
 * above: dq, dk, dv in float64 (rq, rk, rv) and computed in the input dtype
 * (lq, lk, lv), from the float host q, k, v and dout, each sequence alone
 * at its lengths (fjg_reference_backward, _lowp; dlse 0); zq and zk mark
 * the rows whose gradient must be exactly 0 (fjg_reference_zero_grad_rows:
 * zq per row of q, index cli_seqs_q_at / D; zk per row of k, index
 * cli_seqs_k_at / D). Each trainable buffer a with rg[a] (and lg[a]) not
 * NULL gets its gradient summed over the sequences, as the kernel sums it
 * (env->buffer_len[a] values). rg and lg may be NULL. */
typedef struct cli_bwd_ref {
  double *rq, *rk, *rv;
  float *lq, *lk, *lv;
  uint8_t *zq, *zk;
  double *const *rg;
  float *const *lg;
} cli_bwd_ref;

/* 0, or -1 with a message in err. */
int cli_seqs_backward_reference(const cli_seqs *L, const run_config *c,
                                const fjg_graph *g, const fjg_env *env,
                                double scale, const float *q, const float *k,
                                const float *v, const float *dout,
                                const cli_bwd_ref *out, char *err, size_t errlen);

/* Allowed (h, q, kv) triples summed over the sequences, each at its own
 * lengths (fjg_reference_count_allowed). -1 on failure. */
int64_t cli_seqs_pairs(const cli_seqs *L, const run_config *c,
                       const fjg_graph *g, const fjg_env *env);

/* KV positions read: over the sequences, the positions j < lk[b] that some
 * query row of the sequence, in some head, is allowed to attend (every
 * position without a mask). The K and V bytes of a decode step are this
 * times Hkv * D * 2 (K and V) * the element size. Evaluates the mask per
 * (head, query, kv) at most: meant for short query lengths. -1 on
 * failure. */
int64_t cli_seqs_kv_read(const cli_seqs *L, const run_config *c,
                         const fjg_graph *g, const fjg_env *env);

#endif /* FJ_CLI_RUN_SERVING_H */
