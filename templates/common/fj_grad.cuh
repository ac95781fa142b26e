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
struct fj_grad_slot {
  int idx = -1;  // the element summed in acc, -1: none
  float acc = 0.0f;
};
__device__ __forceinline__ void fj_grad_add(fj_grad_slot &s, float *g, int idx, float v) {
  if (idx != s.idx) {
    if (s.idx >= 0) atomicAdd(g + s.idx, s.acc);
    s.idx = idx;
    s.acc = 0.0f;
  }
  s.acc += v;
}
__device__ __forceinline__ void fj_grad_slot_flush(fj_grad_slot &s, float *g) {
  if (s.idx >= 0) atomicAdd(g + s.idx, s.acc);
  s.idx = -1;
  s.acc = 0.0f;
}
