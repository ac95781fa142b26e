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
  const int t0 = (int)((unsigned)h * (unsigned)(-8));
  const int t1 = (int)((unsigned)t0 - (unsigned)8);
  const float t2 = (float)t1;
  const float t3 = (float)z.Hq;
  const float t4 = t2 / t3;
  const float t5 = exp2f(t4);
  const int t6 = (int)((unsigned)(q + z.q_off) - (unsigned)(kv + z.kv_off));
  const float t7 = (float)t6;
  const float t8 = t5 * t7;
  const float t9 = score - t8;
  return t9;
}

__device__ __forceinline__ float fj_score_log2(const fj_user_params &u,
    const fj_sizes &z, float qk, float scale, int b, int h, int qb, int dq, int kvb,
    int dk) {
  const int q = (int)((unsigned)qb + (unsigned)dq);
  const int kv = (int)((unsigned)kvb + (unsigned)dk);
  const float score = qk * scale;
  const int t0 = (int)((unsigned)h * (unsigned)(-8));
  const int t1 = (int)((unsigned)t0 - (unsigned)8);
  const float t2 = (float)t1;
  const float t3 = (float)z.Hq;
  const float t4 = t2 / t3;
  const float t5 = exp2f(t4);
  const int t6 = (int)((unsigned)(q + z.q_off) - (unsigned)(kv + z.kv_off));
  const float t7 = (float)t6;
  const float t8 = t5 * t7;
  const float t9 = score - t8;
  const float k0 = 0x1.715476p+0f /* 1.44269502 */;
  const float k1 = k0 * t5;
  return (qk * (k0 * scale) - (k1 * (float)(int)((unsigned)(qb + z.q_off) - (unsigned)(kvb + z.kv_off)) + k1 * (float)(int)((unsigned)dq * (unsigned)(1) + (unsigned)dk * (unsigned)(-1))));
}

__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,
    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1) {
  const fj_iv v0 = fj_iv_make(kv0 + (long long)z.kv_off, kv1 + (long long)z.kv_off);
  const fj_iv v1 = fj_iv_make(q0 + (long long)z.q_off, q1 + (long long)z.q_off);
  const fj_iv v2 = fj_iv_ge(v1, v0);
  return fj_iv_tile_class(v2);
}
// ---- end of generated prologue ----
