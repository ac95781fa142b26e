// ---- generated prologue (gen/emit_cuda.c) ----
struct fj_user_params {
  long long fj_reserved_;
};

__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,
    int b, int h, int q, int kv) {
  const bool t0 = (q + z.q_off) >= (kv + z.kv_off);
  return t0;
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
  const fj_iv v0 = fj_iv_make(kv0 + (long long)z.kv_off, kv1 + (long long)z.kv_off);
  const fj_iv v1 = fj_iv_make(q0 + (long long)z.q_off, q1 + (long long)z.q_off);
  const fj_iv v2 = fj_iv_ge(v1, v0);
  return fj_iv_tile_class(v2);
}
// ---- end of generated prologue ----
