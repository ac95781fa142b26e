// templates/common/fj_grad.cuh: how a backward kernel adds the gradients of
// trainable buffers, for the generated fj_score_grad and fj_grad_flush
// (gen/emit_cuda.c), which follow it. Backward units only.
#pragma once

// A trainable buffer's gradient through a one-entry write-combining cache a
// thread (the generated fj_grad_cache holds one per trainable read): adds to
// the element the slot holds are summed in a register, and one atomic add
// reaches global memory when the element changes or at fj_grad_flush. A
// clamped or per-head index sends nearly all of a thread's adds to one
// element, where an atomic add each serialized on a single address.
// A tile's trainable read whose index is not one value over the tile (the
// generated fj_grad_tile decides, by interval analysis): its elements add
// through the slot one by one. Where the index is one value, the tile's adds
// are summed in a register and reach the slot once (fj_grad_tile_end).
#define FJ_GRAD_VARIES (-2)

struct fj_grad_slot {
  int idx = -1;  // the element summed in acc, -1: none
  float acc = 0.0f;
};
// Adds v to element idx of g through slot s where live (an add that is not
// live changes nothing: v may be NaN there). Selects, not branches, but for
// the atomic: the elementwise loop that calls it for every element keeps
// one small branch an element.
__device__ __forceinline__ void fj_grad_add(fj_grad_slot &s, float *g, bool live, int idx,
                                            float v) {
  const bool change = live && idx != s.idx;
  if (change && s.idx >= 0) atomicAdd(g + s.idx, s.acc);
  s.idx = change ? idx : s.idx;
  s.acc = (change ? 0.0f : s.acc) + (live ? v : 0.0f);
}
__device__ __forceinline__ void fj_grad_slot_flush(fj_grad_slot &s, float *g) {
  if (s.idx >= 0) atomicAdd(g + s.idx, s.acc);
  s.idx = -1;
  s.acc = 0.0f;
}
