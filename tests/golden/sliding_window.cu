// ---- generated prologue (gen/emit_cuda.c) ----
struct fj_user_params {
  long long fj_reserved_;
  int a_window;
};

__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,
    int b, int h, int q, int kv) {
  const int t0 = (int)((unsigned)(q + z.q_off) - (unsigned)(kv + z.kv_off));
  const bool t1 = t0 < u.a_window;
  const bool t2 = (q + z.q_off) >= (kv + z.kv_off);
  const bool t3 = t2 && t1;
  return t3;
}

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
  const fj_iv v0 = fj_iv_make(u.a_window, u.a_window);
  const fj_iv v1 = fj_iv_make(kv0 + (long long)z.kv_off, kv1 + (long long)z.kv_off);
  const fj_iv v2 = fj_iv_make(q0 + (long long)z.q_off, q1 + (long long)z.q_off);
  const fj_iv v3 = fj_iv_sub(v2, v1);
  const fj_iv v4 = fj_iv_lt(v3, v0);
  const fj_iv v5 = fj_iv_ge(v2, v1);
  const fj_iv v6 = fj_iv_and(v5, v4);
  return fj_iv_tile_class(v6);
}
// ---- end of generated prologue ----
