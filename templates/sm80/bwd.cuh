// templates/sm80/bwd.cuh: the backward's main kernel (contract and scheme:
// sm80/bwd_config.cuh): K and V of the CTA's kv tile, the walk over its
// work items with the next item's Q, dO, LSE and delta loading while one is
// computed, then dK and dV to global memory (only the sequence's own rows:
// in a packed batch the rows past its Lk are the next sequence's).
// FJ_DETERMINISTIC: kv tiles in descending blockIdx.x order, dQ added in
// turn (common/bwd_order.cuh).
#pragma once

extern "C" __global__ void __launch_bounds__(FJK_THREADS, 1)
fj_attention_bwd(const __grid_constant__ fj_bwd_params p) {
  extern __shared__ __align__(128) unsigned char fjb_smem[];

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int n_block = fjb_cta_kv_tile(p, (int)blockIdx.x);
  const int hk = blockIdx.y, b = blockIdx.z;
  // The sequence's sizes and first rows (fjb_seq_of: p.sz unless packed)
  // are asked for where they are used, and so are the bounds that depend
  // on them (the last kv rows of the tile and of the warp): the compiler
  // may then read cu_seqlens again rather than hold them across the item
  // loop, where they made the packed variant's D=128 kernels spill. A kv
  // tile past a shorter sequence's end has nothing to do (without FJ_VARLEN
  // the grid holds none: no test, which cost the deterministic D=128 kernel
  // a spill).
  const int kv0 = n_block * FJ_BLOCK_N;
#if FJ_VARLEN
  if (kv0 >= fjb_seq_of(p, b).sz.Lk) return;
#endif
  const int wkv0 = kv0 + warp * 16;  // this warp's first kv row

  const unsigned s_base = fj_smem_u32(fjb_smem);
  const unsigned s_k = s_base + FJB_OFF_K, s_v = s_base + FJB_OFF_V;
  const unsigned s_ds = s_base + FJB_OFF_DS;

  // cp.async groups, in commit order: K, V and the first item, then one
  // group per item (empty when there is no next item).
  const int h_end = (hk + 1) * p.kv_group;
  fjb_item cur;
  {
    const fjb_seq sq = fjb_seq_of(p, b);
    const int kr0 = sq.k_row0 + kv0;  // the tile's first row in k and v
    const fj_u16 *gk = (const fj_u16 *)p.k + b * p.k_sb + hk * p.k_sh + kr0 * p.k_ss;
    const fj_u16 *gv = (const fj_u16 *)p.v + b * p.v_sb + hk * p.v_sh + kr0 * p.v_ss;
    fjk_load_tile<FJ_BLOCK_N>(s_k, gk, p.k_ss, sq.sz.Lk - kv0);
    fjk_load_tile<FJ_BLOCK_N>(s_v, gv, p.v_ss, sq.sz.Lk - kv0);
    cur = fjb_find(p, sq.sz, b, n_block, hk * p.kv_group, 0, h_end, kv0,
                   fjb_kv_last(sq.sz, n_block));
    if (cur.h < h_end)
      fjb_load_item(p, sq, b, cur, s_base + FJB_OFF_Q, s_base + FJB_OFF_DO,
                    s_base + FJB_OFF_LSE, s_base + FJB_OFF_DELTA);
  }
  fjk_cp_async_commit();

  float dk[FJB_DT][4], dv[FJB_DT][4];
#pragma unroll
  for (int dt = 0; dt < FJB_DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;

  fj_grad_cache gc;  // trainable buffers' gradients, flushed at the end
  int stage = 0;
  while (cur.h < h_end) {
    // The next item is found before the wait: it needs nothing loaded.
    const fj_sizes zn = fjb_seq_of(p, b).sz;
    const fjb_item nxt = fjb_find(p, zn, b, n_block, cur.h, cur.t + 1, h_end, kv0,
                                  fjb_kv_last(zn, n_block));
    // The current item has landed, and after the barrier every warp is done
    // with the stage the next item goes to (read by the previous item's
    // fjb_step) and with dS^T (read by its fjb_dq_step).
    fjk_cp_async_wait<0>();
    __syncthreads();
    const int nst = stage ^ 1;
    if (nxt.h < h_end)
      fjb_load_item(p, fjb_seq_of(p, b), b, nxt, s_base + FJB_OFF_Q + nst * FJB_QTILE_BYTES,
                    s_base + FJB_OFF_DO + nst * FJB_QTILE_BYTES,
                    s_base + FJB_OFF_LSE + nst * FJ_BLOCK_M * 4,
                    s_base + FJB_OFF_DELTA + nst * FJ_BLOCK_M * 4);
    fjk_cp_async_commit();

    const int q0 = cur.i * FJ_BLOCK_M;
    const unsigned s_q = s_base + FJB_OFF_Q + stage * FJB_QTILE_BYTES;
    const unsigned s_do = s_base + FJB_OFF_DO + stage * FJB_QTILE_BYTES;
    const unsigned s_lse = s_base + FJB_OFF_LSE + stage * FJ_BLOCK_M * 4;
    const unsigned s_delta = s_base + FJB_OFF_DELTA + stage * FJ_BLOCK_M * 4;
    // Not unrolled: one copy of the body; a pass only moves the bases.
#pragma unroll 1
    for (int sub = 0; sub < FJ_BLOCK_M / FJB_SUB_M; ++sub) {
      const int sq0 = q0 + sub * FJB_SUB_M;
      const fj_sizes z = fjb_seq_of(p, b).sz;
      // The warp's kv rows and the pass's queries (common/bwd_walk.cuh,
      // fjb_classify): the warp may skip a PARTIAL pair (EMPTY) or its mask
      // (FULL), and skips a pass wholly past Lq. The edge is asked apart
      // (fjb_edge), where it is used: held as a bit beside the others, the
      // deterministic D=128 kernel spills.
      const unsigned how =
          sq0 < z.Lq ? fjb_classify(p, z, b, cur.h, cur.cls, sq0, FJB_SUB_M, wkv0, 16) : 0u;
      fjb_step(p, z, b, cur.h, sq0, wkv0, how & FJB_RUN, how & FJB_NEED_MASK,
               fjb_edge(z, sq0, FJB_SUB_M, wkv0, 16), s_k, s_v,
               s_q + sub * FJB_SUB_M * FJK_ROW_BYTES, s_do + sub * FJB_SUB_M * FJK_ROW_BYTES,
               s_lse + sub * FJB_SUB_M * 4, s_delta + sub * FJB_SUB_M * 4,
               s_ds + sub * FJB_SUB_M * 2, dk, dv, gc);
    }
#if FJ_DETERMINISTIC
    // The rank's count is also the barrier after which dS^T is complete;
    // dQ is added in the kv tiles' order.
    const int rank = fjb_order_rank<FJK_THREADS>(p, fjb_seq_of(p, b).sz, b, n_block, cur.h, cur.i);
    int *sem = fjb_order_sem(p, b, cur.h, cur.i);
    fjb_dq_step(p, fjb_seq_of(p, b), cur.h, q0, s_k, s_ds, sem, rank);
    fjb_order_release(sem, rank);
#else
    __syncthreads();  // dS^T complete
    fjb_dq_step(p, fjb_seq_of(p, b), cur.h, q0, s_k, s_ds);
#endif
    cur = nxt;
    stage = nst;
  }
  fj_grad_flush(p.grads, gc);
  fjk_cp_async_wait<0>();
  __syncthreads();  // every warp is done with K and V (fjb_dq_step reads all of K)

  // ---- epilogue: dK (times scale) and dV through the warp's own rows of the
  // K and V tiles, swizzled as tile_load writes them; then 16-byte stores.
  // Element pair (dt, 2 hh) of the C layout is row 16 warp + g + 8 hh,
  // columns 8 dt + 2 t4, +1: chunk dt, bytes 4 t4 of it, and (row & 7) == g.
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = warp * 16 + g + hh * 8;
    const unsigned k_row = s_k + r * FJK_ROW_BYTES + t4 * 4;
    const unsigned v_row = s_v + r * FJK_ROW_BYTES + t4 * 4;
#pragma unroll
    for (int dt = 0; dt < FJB_DT; ++dt) {
      fjb_st_shared_u32(k_row + ((dt ^ g) << 4),
                        fj_pack2(dk[dt][2 * hh] * p.scale, dk[dt][2 * hh + 1] * p.scale));
      fjb_st_shared_u32(v_row + ((dt ^ g) << 4), fj_pack2(dv[dt][2 * hh], dv[dt][2 * hh + 1]));
    }
  }
  __syncwarp();
  const fjb_seq sq = fjb_seq_of(p, b);
  const int Lk = sq.sz.Lk;
  fj_u16 *gdk = (fj_u16 *)p.dk + b * p.dk_sb + hk * p.dk_sh + (long long)sq.k_row0 * p.dk_ss;
  fj_u16 *gdv = (fj_u16 *)p.dv + b * p.dv_sb + hk * p.dv_sh + (long long)sq.k_row0 * p.dv_ss;
#pragma unroll
  for (int i = 0; i < 16 * FJK_CHUNKS / 32; ++i) {
    const int idx = i * 32 + lane;
    const int r = warp * 16 + idx / FJK_CHUNKS, c = idx % FJK_CHUNKS;
    if (kv0 + r < Lk) {
      const unsigned off = r * FJK_ROW_BYTES + ((c ^ (r & 7)) << 4);
      unsigned v0, v1, v2, v3;
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(s_k + off));
      fj_st_global_v4(gdk + (kv0 + r) * p.dk_ss + c * 8, v0, v1, v2, v3);
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(s_v + off));
      fj_st_global_v4(gdv + (kv0 + r) * p.dv_ss + c * 8, v0, v1, v2, v3);
    }
  }
}
