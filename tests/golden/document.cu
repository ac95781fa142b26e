// ---- generated prologue (gen/emit_cuda.c) ----
struct fj_user_params {
  long long fj_reserved_;
  const int *a_doc_id;
  long long n_doc_id;
};

__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,
    int b, int h, int q, int kv) {
  const int t0 = fj_load_i32(u.a_doc_id, u.n_doc_id, (kv + z.kv_off));
  const int t1 = fj_load_i32(u.a_doc_id, u.n_doc_id, (q + z.q_off));
  const bool t2 = t1 == t0;
  const bool t3 = (q + z.q_off) >= (kv + z.kv_off);
  const bool t4 = t2 && t3;
  return t4;
}

#ifdef FJ_MASK_ROWS
__device__ __forceinline__ void fj_mask_rows(const fj_user_params &u, const fj_sizes &z,
    int b, int h, int q, unsigned (&v)[1]) {
  const int t0 = fj_load_i32(u.a_doc_id, u.n_doc_id, (q + z.q_off));
  v[0] = (unsigned)t0;
}

__device__ __forceinline__ bool fj_mask_from_rows(const fj_user_params &u, const fj_sizes &z,
    int b, int h, int q, int kv, const unsigned (&v)[1]) {
  const int t0 = fj_load_i32(u.a_doc_id, u.n_doc_id, (kv + z.kv_off));
  const int t1 = (int)v[0];
  const bool t2 = t1 == t0;
  const bool t3 = (q + z.q_off) >= (kv + z.kv_off);
  const bool t4 = t2 && t3;
  return t4;
}
#endif

#ifdef FJ_MASK_COLS
__device__ __forceinline__ void fj_mask_cols(const fj_user_params &u, const fj_sizes &z,
    int b, int h, int kv, unsigned (&v)[1]) {
  const int t0 = fj_load_i32(u.a_doc_id, u.n_doc_id, (kv + z.kv_off));
  v[0] = (unsigned)t0;
}

__device__ __forceinline__ bool fj_mask_from_cols(const fj_user_params &u, const fj_sizes &z,
    int b, int h, int q, int kv, const unsigned (&v)[1]) {
  const int t0 = (int)v[0];
  const int t1 = fj_load_i32(u.a_doc_id, u.n_doc_id, (q + z.q_off));
  const bool t2 = t1 == t0;
  const bool t3 = (q + z.q_off) >= (kv + z.kv_off);
  const bool t4 = t2 && t3;
  return t4;
}
#endif

__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,
    const fj_sizes &z, float score, int b, int h, int q, int kv) {
  return score;
}

__device__ __forceinline__ float fj_score_log2(const fj_user_params &u,
    const fj_sizes &z, float qk, float scale, int b, int h, int qb, int dq, int kvb,
    int dk) {
  const int q = (int)((unsigned)qb + (unsigned)dq);
  const int kv = (int)((unsigned)kvb + (unsigned)dk);
  return fj_score_mod(u, z, qk * scale, b, h, q, kv) * 0x1.715476p+0f /* 1.44269502 */;
}

__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,
    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1) {
  const fj_iv v0 = fj_iv_make(kv0 + (long long)z.kv_off, kv1 + (long long)z.kv_off);
  const fj_iv v1 = fj_iv_full();
  const fj_iv v2 = fj_iv_make(q0 + (long long)z.q_off, q1 + (long long)z.q_off);
  const fj_iv v3 = fj_iv_full();
  const fj_iv v4 = fj_iv_eq(v3, v1);
  const fj_iv v5 = fj_iv_ge(v2, v0);
  const fj_iv v6 = fj_iv_and(v4, v5);
  return fj_iv_tile_class(v6);
}
// ---- end of generated prologue ----
