// templates/sm90/trace.cuh: FJ_TRACE, SM clock stamps of the kernel's
// phases for bench/trace.py (timing only). Raw %clock values (one SM's
// counter, so comparable between the CTAs of one SM) are written into the
// LSE of the CTA's (or persistent work item's) rows q0 + slot, whose LSE is
// then not computed: consumer c at slots 32 c + 0.., the producer at 64..
// (bench/trace.py reads them back, at rows m * FJ_BLOCK_M: its shapes are
// whole numbers of query tiles, where no tile overlaps another,
// fjh_tile_q0). Without FJ_TRACE every type here is empty and every call
// does nothing.
#pragma once

#ifdef FJ_TRACE
#define FJH_TRACING 1

__device__ __forceinline__ unsigned fjh_clock() {
  unsigned c;
  asm volatile("mov.u32 %0, %%clock;\n" : "=r"(c) :: "memory");
  return c;
}
__device__ __forceinline__ unsigned fjh_smid() {
  unsigned c;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(c));
  return c;
}
// A role's trace slots: the LSE of rows q0 + first .. (nullptr without an
// LSE). Consumer c's start at 32 c, the producer's at 64.
__device__ __forceinline__ float *fjh_trace_slots(const fj_fwd_params &p, int b, int h,
                                                  int q0, int first) {
  return p.lse != nullptr ? p.lse + b * p.lse_sb + h * p.lse_sh + q0 + first : nullptr;
}

// Stamps kept in registers until the role writes them out.
struct fjh_stamps {
  unsigned v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  __device__ __forceinline__ void at(int k) { v[k] = fjh_clock(); }
};

// The producer's stamps of a work item (entry, start of its loads, last
// load issued), its SM, the global timer (ns, to convert clock cycles) and
// its tile count, at slots 64.. of the item's rows.
__device__ __forceinline__ void fjh_trace_producer(const fj_fwd_params &p, int b, int h,
                                                   int q0, const fjh_stamps &tr,
                                                   int ntiles) {
  float *gl = fjh_trace_slots(p, b, h, q0, 64);
  if (gl == nullptr) return;
  for (int k = 0; k < 3; ++k) gl[k] = __uint_as_float(tr.v[k]);
  gl[3] = __uint_as_float(fjh_smid());
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(ns));
  gl[4] = __uint_as_float((unsigned)ns);
  gl[5] = __uint_as_float((unsigned)(ns >> 32));
  gl[6] = __uint_as_float((unsigned)ntiles);
}

// The producer's load stamps of an item, written as they are taken: K of
// tile i + 1 at slot 64 + 8 + 2 i, V of tile i at 64 + 9 + 2 i, up to slot
// 64 + 55.
struct fjh_trace_loads {
  float *slots;
  int nk = 0, nv = 0;  // K and V tiles issued so far
  __device__ __forceinline__ fjh_trace_loads(const fj_fwd_params &p, int b, int h, int q0)
      : slots(fjh_trace_slots(p, b, h, q0, 64)) {}
  __device__ __forceinline__ void at(int s) {
    if (s >= 8 && s < 56 && slots != nullptr) slots[s] = __uint_as_float(fjh_clock());
  }
  __device__ __forceinline__ void k_issued() { at(6 + 2 * nk++); }
  __device__ __forceinline__ void v_issued() { at(9 + 2 * nv++); }
};

// A consumer's stamps of an item: phases 0-6 in registers, written with its
// tile count at slots 32 c + 0..7 by finish(); nine stamps of loop
// iterations 1 and 2 each (slots 32 c + 8.. and 32 c + 17..), written as
// they are taken. Thread 0 of the consumer writes.
struct fjh_trace_consumer {
  fjh_stamps tr;
  float *slots;
  int ntiles = 0;
  int k = -1;  // first slot of this loop iteration's stamps, -1: none
  __device__ __forceinline__ fjh_trace_consumer(const fj_fwd_params &p, int b, int h, int q0,
                                                int c)
      : slots((threadIdx.x & 127) == 0 ? fjh_trace_slots(p, b, h, q0, 32 * c) : nullptr) {
    tr.at(0);
  }
  __device__ __forceinline__ void at(int phase) { tr.at(phase); }
  __device__ __forceinline__ void iteration(int it) {
    k = it == 1 || it == 2 ? 8 + 9 * (it - 1) : -1;
  }
  __device__ __forceinline__ void loop(int x) {
    if (k >= 0 && slots != nullptr) slots[k + x] = __uint_as_float(fjh_clock());
  }
  __device__ __forceinline__ void tiles(int n) { ntiles = n; }
  __device__ __forceinline__ void finish() {
    tr.at(6);
    if (slots != nullptr) {
      for (int i = 0; i < 7; ++i) slots[i] = __uint_as_float(tr.v[i]);
      slots[7] = __uint_as_float((unsigned)ntiles);
    }
  }
};
#else
#define FJH_TRACING 0

struct fjh_stamps {
  __device__ __forceinline__ void at(int) {}
};
__device__ __forceinline__ void fjh_trace_producer(const fj_fwd_params &, int, int, int,
                                                   const fjh_stamps &, int) {}
struct fjh_trace_loads {
  __device__ __forceinline__ fjh_trace_loads(const fj_fwd_params &, int, int, int) {}
  __device__ __forceinline__ void k_issued() {}
  __device__ __forceinline__ void v_issued() {}
};
struct fjh_trace_consumer {
  __device__ __forceinline__ fjh_trace_consumer(const fj_fwd_params &, int, int, int, int) {}
  __device__ __forceinline__ void at(int) {}
  __device__ __forceinline__ void iteration(int) {}
  __device__ __forceinline__ void loop(int) {}
  __device__ __forceinline__ void tiles(int) {}
  __device__ __forceinline__ void finish() {}
};
#endif
