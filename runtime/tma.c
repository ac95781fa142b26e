/*
 * runtime/tma.c: CUtensorMaps for the sm90 templates (see tma.h).
 */
#include "runtime/tma.h"

#include <stdint.h>
#include <string.h>

#include "util/errmsg.h"

/* One tensor as the template sees it: (D, L, H, B) innermost first. */
typedef struct tma_tensor {
  const char *what;
  uint64_t ptr;
  int64_t dims[4];    /* elements */
  int64_t strides[3]; /* elements, for dims 1..3 */
  uint32_t box_rows;
} tma_tensor;

/* A dimension of extent 1 is only ever read at coordinate 0, so its stride
 * is free; callers (DLPack) may give 0 or anything there. TMA still wants a
 * multiple of 16 bytes, so such strides become the extent of the dims below. */
static void normalize_unit_strides(tma_tensor *t) {
  int64_t below = t->dims[0];
  for (int i = 1; i < 4; i++) {
    if (t->dims[i] == 1) t->strides[i - 1] = below;
    below = t->strides[i - 1] * t->dims[i];
  }
}

static fj_status encode_one(const fjr_driver *drv, const fjg_config *cfg,
                            tma_tensor *t, CUtensorMap *out, char *err,
                            size_t errlen) {
  const int64_t esize = 2; /* bf16 and fp16 */
  if (t->ptr % 16 != 0)
    return fju_fail(err, errlen, FJ_EINVAL,
                    "%s: TMA needs a 16-byte aligned address", t->what);
  normalize_unit_strides(t);
  cuuint64_t dims[4], strides[3];
  for (int i = 0; i < 4; i++) {
    if (t->dims[i] <= 0 || t->dims[i] > ((int64_t)1 << 32))
      return fju_fail(err, errlen, FJ_EINVAL,
                      "%s: dimension %d has extent %lld, TMA allows 1 to 2^32",
                      t->what, i, (long long)t->dims[i]);
    dims[i] = (cuuint64_t)t->dims[i];
  }
  for (int i = 0; i < 3; i++) {
    int64_t bytes = t->strides[i] * esize;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= ((int64_t)1 << 40))
      return fju_fail(err, errlen, FJ_EINVAL,
                      "%s: stride %lld elements of dimension %d: TMA needs a "
                      "positive multiple of 16 bytes below 2^40",
                      t->what, (long long)t->strides[i], i + 1);
    strides[i] = (cuuint64_t)bytes;
  }
  /* 64 elements = 128 bytes: the widest box the 128-byte swizzle allows;
   * D = 128 is loaded as two boxes. */
  cuuint32_t box[4] = {64, t->box_rows, 1, 1};
  cuuint32_t estride[4] = {1, 1, 1, 1};
  CUtensorMapDataType dt = cfg->dtype == FJ_DTYPE_F16
                               ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                               : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUresult r = drv->cuTensorMapEncodeTiled(
      out, dt, 4, (void *)(uintptr_t)t->ptr, dims, strides, box, estride,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    char text[256];
    fjr_driver_error_text(drv, r, text, sizeof text);
    return fju_fail(err, errlen, FJ_ECUDA,
                    "%s: cuTensorMapEncodeTiled(dims %llu x %llu x %llu x %llu, "
                    "strides %llu, %llu, %llu bytes) failed: %s",
                    t->what, (unsigned long long)dims[0],
                    (unsigned long long)dims[1], (unsigned long long)dims[2],
                    (unsigned long long)dims[3], (unsigned long long)strides[0],
                    (unsigned long long)strides[1],
                    (unsigned long long)strides[2], text);
  }
  return FJ_OK;
}

/* What every map build checks first: its arguments (args_ok), a template
 * that takes maps, a driver that encodes them; clears err. */
static fj_status maps_start(const fjr_driver *drv, const fjg_config *cfg, int args_ok,
                            const char *who, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!drv || !cfg || !args_ok) return fju_fail(err, errlen, FJ_EINVAL, "%s: NULL argument", who);
  if (!cfg->uses_tma)
    return fju_fail(err, errlen, FJ_EINVAL, "template %s takes no tensor maps",
                    cfg->template_name);
  if (!drv->cuTensorMapEncodeTiled)
    return fju_fail(err, errlen, FJ_EUNSUPPORTED, "the driver has no cuTensorMapEncodeTiled");
  return FJ_OK;
}

fj_status fjr_tma_bwd_maps_build(const fjr_driver *drv, const fjg_config *cfg,
                                 const fjr_bwd_params_fixed *p, const fjr_tma_rows *rows,
                                 fjr_tma_bwd_maps *out, char *err, size_t errlen) {
  fj_status st = maps_start(drv, cfg, p && out, "fjr_tma_bwd_maps_build", err, errlen);
  if (st != FJ_OK) return st;
  const fjr_tma_rows none = {0, 0};
  if (!rows) rows = &none;
  if ((p->cu_seqlens_q && rows->q_rows <= 0) || (p->cu_seqlens_k && rows->kv_rows <= 0))
    return fju_fail(err, errlen, FJ_EINVAL,
                    "fjr_tma_bwd_maps_build: a packed tensor without its rows");
  memset(out, 0, sizeof *out);
  const int64_t D = cfg->head_dim;
  const uint32_t bm = (uint32_t)cfg->block_m, bn = (uint32_t)cfg->block_n;
  /* Packed tensors are (D, total, H, 1): a sequence's rows are found from
   * cu_seqlens by the kernel (batch stride 0, normalized for the extent of
   * 1). */
  const int64_t lq = p->cu_seqlens_q ? rows->q_rows : p->sz.Lq;
  const int64_t lk = p->cu_seqlens_k ? rows->kv_rows : p->sz.Lk;
  const int64_t bq = p->cu_seqlens_q ? 1 : p->sz.B, bk = p->cu_seqlens_k ? 1 : p->sz.B;
  tma_tensor t[] = {
      {"q", p->q, {D, lq, p->sz.Hq, bq}, {p->q_ss, p->q_sh, p->q_sb}, bm},
      {"k", p->k, {D, lk, p->sz.Hkv, bk}, {p->k_ss, p->k_sh, p->k_sb}, bn},
      {"v", p->v, {D, lk, p->sz.Hkv, bk}, {p->v_ss, p->v_sh, p->v_sb}, bn},
      {"dout", p->dout, {D, lq, p->sz.Hq, bq}, {p->do_ss, p->do_sh, p->do_sb}, bm},
      {"dk", p->dk, {D, lk, p->sz.Hkv, bk}, {p->dk_ss, p->dk_sh, p->dk_sb}, 64},
      {"dv", p->dv, {D, lk, p->sz.Hkv, bk}, {p->dv_ss, p->dv_sh, p->dv_sb}, 64},
  };
  CUtensorMap *maps[] = {&out->q, &out->k, &out->v, &out->dout, &out->dk, &out->dv};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if ((st = encode_one(drv, cfg, &t[i], maps[i], err, errlen)) != FJ_OK) return st;
  return FJ_OK;
}

/* Rows of a paged box: the largest power of two that divides the page size,
 * at most a tile's rows, so that a box never crosses a page
 * (templates/sm90/pipeline.cuh, fjh_load_kv_paged, computes the same). */
static uint32_t page_box_rows(int64_t page_size, int block_n) {
  int64_t r = page_size & -page_size;
  return (uint32_t)(r < block_n ? r : block_n);
}

fj_status fjr_tma_maps_build(const fjr_driver *drv, const fjg_config *cfg,
                             const fjr_fwd_params_fixed *p, const fjr_tma_rows *rows,
                             fjr_tma_maps *out, char *err, size_t errlen) {
  fj_status st = maps_start(drv, cfg, p && out, "fjr_tma_maps_build", err, errlen);
  if (st != FJ_OK) return st;
  memset(out, 0, sizeof *out);
  const int64_t D = cfg->head_dim;
  const fjr_tma_rows none = {0, 0};
  if (!rows) rows = &none;
  const int q_packed = p->cu_seqlens_q != 0;
  const int kv_packed = p->cu_seqlens_k != 0, kv_paged = p->block_table != 0;
  if ((q_packed && rows->q_rows <= 0) || ((kv_packed || kv_paged) && rows->kv_rows <= 0))
    return fju_fail(err, errlen, FJ_EINVAL,
                    "fjr_tma_maps_build: a packed or paged tensor without its rows");
  /* Packed q, k, v: one batch of total rows (a sequence's rows start at its
   * cu_seqlens offset: the kernel's coordinate). */
  tma_tensor q = {"q", p->q, {D, p->sz.Lq, p->sz.Hq, p->sz.B},
                  {p->q_ss, p->q_sh, p->q_sb}, (uint32_t)cfg->block_m};
  if (q_packed) q.dims[1] = rows->q_rows, q.dims[3] = 1;
  tma_tensor k = {"k", p->k, {D, p->sz.Lk, p->sz.Hkv, p->sz.B},
                  {p->k_ss, p->k_sh, p->k_sb}, (uint32_t)cfg->block_n};
  if (kv_packed) {
    k.dims[1] = rows->kv_rows, k.dims[3] = 1;
  } else if (kv_paged) {
    /* The pool [num_pages, page_size, Hkv, D] as (D, page_size, Hkv,
     * num_pages): the kernel loads a tile page by page. */
    k.dims[1] = p->page_size, k.dims[3] = rows->kv_rows;
    k.box_rows = page_box_rows(p->page_size, cfg->block_n);
  }
  tma_tensor v = k;
  v.what = "v";
  v.ptr = p->v;
  v.strides[0] = p->v_ss, v.strides[1] = p->v_sh, v.strides[2] = p->v_sb;
  st = encode_one(drv, cfg, &q, &out->q, err, errlen);
  if (st == FJ_OK) st = encode_one(drv, cfg, &k, &out->k, err, errlen);
  if (st == FJ_OK) st = encode_one(drv, cfg, &v, &out->v, err, errlen);
  if (st != FJ_OK) return st;
  /* O is stored through TMA where it can be; otherwise the kernel's
   * threads store it (o_ok 0), so O's layout adds no requirement. The
   * persistent kernel with one Q buffer (D=256) writes O from registers and
   * never reads the map: none is encoded for it. Packed O gets none either:
   * a box of 64 rows would write past a sequence's end into the next one's
   * rows, which the threads' stores do not. */
  if ((cfg->persistent && cfg->q_bufs < 2) || q_packed) return FJ_OK;
  tma_tensor o = {"o", p->o, {D, p->sz.Lq, p->sz.Hq, p->sz.B},
                  {p->o_ss, p->o_sh, p->o_sb}, 64};
  out->o_ok = encode_one(drv, cfg, &o, &out->o, NULL, 0) == FJ_OK;
  return FJ_OK;
}
