// ---- generated prologue (gen/emit_cuda.c) ----
/* Spec source:
-- packed sequences; a comment that tries to end the C comment: *\/
local doc = buffer("doc_id", "i32")
return { mask_mod = and_masks(causal(), document(doc)) }
*/

struct fj_user_params {
  long long fj_reserved_;
  const int *a_doc_id;
  long long n_doc_id;
};

__device__ __forceinline__ bool fj_mask(const fj_user_params &u, const fj_sizes &z,
    int b, int h, int q, int kv) {
  const int t0 = fj_load_i32(u.a_doc_id, u.n_doc_id, kv);
  const int t1 = fj_load_i32(u.a_doc_id, u.n_doc_id, q);
  const bool t2 = t1 == t0;
  const bool t3 = q >= kv;
  const bool t4 = t2 && t3;
  return t4;
}

__device__ __forceinline__ float fj_score_mod(const fj_user_params &u,
    const fj_sizes &z, float score, int b, int h, int q, int kv) {
  return score;
}

// Interval rules shared with gen/interval.c (fj_tile_class below).
#define FJ_IV_FN static __device__ __forceinline__
struct fj_iv {
  long long lo;
  long long hi;
};
typedef struct fj_iv fj_iv;
FJ_IV_FN fj_iv fj_iv_make(long long lo, long long hi) {
  fj_iv r;
  r.lo = lo;
  r.hi = hi;
  if (lo < -2147483648LL || hi > 2147483647LL) r.lo = -2147483648LL;
  if (lo < -2147483648LL || hi > 2147483647LL) r.hi = 2147483647LL;
  return r;
}
FJ_IV_FN fj_iv fj_iv_full(void) {
  return fj_iv_make(-2147483648LL, 2147483647LL);
}
FJ_IV_FN long long fj_iv_min2(long long a, long long b) {
  return a < b ? a : b;
}
FJ_IV_FN long long fj_iv_max2(long long a, long long b) {
  return a > b ? a : b;
}
FJ_IV_FN fj_iv fj_iv_hull(fj_iv a, fj_iv b) {
  return fj_iv_make(fj_iv_min2(a.lo, b.lo), fj_iv_max2(a.hi, b.hi));
}
FJ_IV_FN fj_iv fj_iv_add(fj_iv a, fj_iv b) {
  return fj_iv_make(a.lo + b.lo, a.hi + b.hi);
}
FJ_IV_FN fj_iv fj_iv_sub(fj_iv a, fj_iv b) {
  return fj_iv_make(a.lo - b.hi, a.hi - b.lo);
}
FJ_IV_FN fj_iv fj_iv_mul(fj_iv a, fj_iv b) {
  long long p0 = a.lo * b.lo;
  long long p1 = a.lo * b.hi;
  long long p2 = a.hi * b.lo;
  long long p3 = a.hi * b.hi;
  return fj_iv_make(fj_iv_min2(fj_iv_min2(p0, p1), fj_iv_min2(p2, p3)), fj_iv_max2(fj_iv_max2(p0, p1), fj_iv_max2(p2, p3)));
}
FJ_IV_FN fj_iv fj_iv_neg(fj_iv a) {
  return fj_iv_make(-a.hi, -a.lo);
}
FJ_IV_FN fj_iv fj_iv_min(fj_iv a, fj_iv b) {
  return fj_iv_make(fj_iv_min2(a.lo, b.lo), fj_iv_min2(a.hi, b.hi));
}
FJ_IV_FN fj_iv fj_iv_max(fj_iv a, fj_iv b) {
  return fj_iv_make(fj_iv_max2(a.lo, b.lo), fj_iv_max2(a.hi, b.hi));
}
FJ_IV_FN fj_iv fj_iv_abs(fj_iv a) {
  if (a.lo >= 0) return a;
  if (a.hi <= 0) return fj_iv_neg(a);
  return fj_iv_make(0, fj_iv_max2(-a.lo, a.hi));
}
FJ_IV_FN long long fj_iv_fdiv(long long a, long long b) {
  long long q = a / b;
  if (q * b != a && ((a < 0) != (b < 0))) q = q - 1;
  return q;
}
FJ_IV_FN long long fj_iv_fmod(long long a, long long b) {
  return a - fj_iv_fdiv(a, b) * b;
}
FJ_IV_FN fj_iv fj_iv_idiv_nz(fj_iv a, fj_iv b) {
  long long d0 = fj_iv_fdiv(a.lo, b.lo);
  long long d1 = fj_iv_fdiv(a.lo, b.hi);
  long long d2 = fj_iv_fdiv(a.hi, b.lo);
  long long d3 = fj_iv_fdiv(a.hi, b.hi);
  return fj_iv_make(fj_iv_min2(fj_iv_min2(d0, d1), fj_iv_min2(d2, d3)), fj_iv_max2(fj_iv_max2(d0, d1), fj_iv_max2(d2, d3)));
}
FJ_IV_FN fj_iv fj_iv_idiv(fj_iv a, fj_iv b) {
  fj_iv r = fj_iv_make(0, 0);
  if (b.lo > 0 || b.hi < 0) return fj_iv_idiv_nz(a, b);
  if (b.lo < 0) r = fj_iv_hull(r, fj_iv_idiv_nz(a, fj_iv_make(b.lo, -1)));
  if (b.hi > 0) r = fj_iv_hull(r, fj_iv_idiv_nz(a, fj_iv_make(1, b.hi)));
  return r;
}
FJ_IV_FN fj_iv fj_iv_mod_nz(fj_iv a, fj_iv b) {
  long long d = b.lo;
  if (b.lo == b.hi && fj_iv_fdiv(a.lo, d) == fj_iv_fdiv(a.hi, d)) return fj_iv_make(fj_iv_fmod(a.lo, d), fj_iv_fmod(a.hi, d));
  if (b.lo > 0 && a.lo >= 0 && a.hi < b.lo) return a;
  if (b.lo > 0) return fj_iv_make(0, b.hi - 1);
  if (a.hi <= 0 && a.lo > b.hi) return a;
  return fj_iv_make(b.lo + 1, 0);
}
FJ_IV_FN fj_iv fj_iv_mod(fj_iv a, fj_iv b) {
  fj_iv r = fj_iv_make(0, 0);
  if (b.lo > 0 || b.hi < 0) return fj_iv_mod_nz(a, b);
  if (b.lo < 0) r = fj_iv_hull(r, fj_iv_mod_nz(a, fj_iv_make(b.lo, -1)));
  if (b.hi > 0) r = fj_iv_hull(r, fj_iv_mod_nz(a, fj_iv_make(1, b.hi)));
  return r;
}
FJ_IV_FN fj_iv fj_iv_bool(int can_true, int can_false) {
  return fj_iv_make(can_false ? 0 : 1, can_true ? 1 : 0);
}
FJ_IV_FN fj_iv fj_iv_unknown_bool(void) {
  return fj_iv_make(0, 1);
}
FJ_IV_FN fj_iv fj_iv_lt(fj_iv a, fj_iv b) {
  return fj_iv_bool(a.lo < b.hi, a.hi >= b.lo);
}
FJ_IV_FN fj_iv fj_iv_le(fj_iv a, fj_iv b) {
  return fj_iv_bool(a.lo <= b.hi, a.hi > b.lo);
}
FJ_IV_FN fj_iv fj_iv_gt(fj_iv a, fj_iv b) {
  return fj_iv_lt(b, a);
}
FJ_IV_FN fj_iv fj_iv_ge(fj_iv a, fj_iv b) {
  return fj_iv_le(b, a);
}
FJ_IV_FN fj_iv fj_iv_eq(fj_iv a, fj_iv b) {
  int single = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  return fj_iv_bool(a.lo <= b.hi && b.lo <= a.hi, !single);
}
FJ_IV_FN fj_iv fj_iv_not(fj_iv a) {
  return fj_iv_make(1 - a.hi, 1 - a.lo);
}
FJ_IV_FN fj_iv fj_iv_ne(fj_iv a, fj_iv b) {
  return fj_iv_not(fj_iv_eq(a, b));
}
FJ_IV_FN fj_iv fj_iv_and(fj_iv a, fj_iv b) {
  return fj_iv_make(fj_iv_min2(a.lo, b.lo), fj_iv_min2(a.hi, b.hi));
}
FJ_IV_FN fj_iv fj_iv_or(fj_iv a, fj_iv b) {
  return fj_iv_make(fj_iv_max2(a.lo, b.lo), fj_iv_max2(a.hi, b.hi));
}
FJ_IV_FN fj_iv fj_iv_xor(fj_iv a, fj_iv b) {
  int t = (a.hi == 1 && b.lo == 0) || (a.lo == 0 && b.hi == 1);
  int f = (a.hi == 1 && b.hi == 1) || (a.lo == 0 && b.lo == 0);
  return fj_iv_bool(t, f);
}
FJ_IV_FN fj_iv fj_iv_where(fj_iv c, fj_iv a, fj_iv b) {
  if (c.lo == 1) return a;
  if (c.hi == 0) return b;
  return fj_iv_hull(a, b);
}
FJ_IV_FN int fj_iv_tile_class(fj_iv m) {
  if (m.hi == 0) return 0;
  if (m.lo == 1) return 2;
  return 1;
}

__device__ __forceinline__ int fj_tile_class(const fj_user_params &u,
    const fj_sizes &z, int b, int h, int q0, int q1, int kv0, int kv1) {
  const fj_iv v0 = fj_iv_make(kv0, kv1);
  const fj_iv v1 = fj_iv_full();
  const fj_iv v2 = fj_iv_make(q0, q1);
  const fj_iv v3 = fj_iv_full();
  const fj_iv v4 = fj_iv_eq(v3, v1);
  const fj_iv v5 = fj_iv_ge(v2, v0);
  const fj_iv v6 = fj_iv_and(v4, v5);
  return fj_iv_tile_class(v6);
}
// ---- end of generated prologue ----
