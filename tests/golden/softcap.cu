// ---- generated prologue (gen/emit_cuda.c) ----
struct fj_user_params {
  long long fj_reserved_;
  float a_cap;
  const float *a_rel_bias;
  long long n_rel_bias;
};

__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,
    int b, int h, int q, int kv) {
  return true;
}

__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,
    const fj_sizes &z, float score, int b, int h, int q, int kv) {
  const float t0 = score / u.a_cap;
  const float t1 = fj_tanh_f32(t0);
  const int t2 = (int)((unsigned)(q + z.q_off) - (unsigned)(kv + z.kv_off));
  const int t3 = t2 < 0 ? (int)(0u - (unsigned)t2) : t2;
  const int t4 = fj_mod_i32(t3, 32);
  const float t5 = fj_load_f32(u.a_rel_bias, u.n_rel_bias, t4);
  const float t6 = t5 * 0x1.555556p-2f /* 0.333333343 */;
  const float t7 = u.a_cap * t1;
  const float t8 = t7 + t6;
  return t8;
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
  return FJ_TILE_FULL;
}
// ---- end of generated prologue ----
