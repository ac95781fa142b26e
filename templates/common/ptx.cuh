// templates/common/ptx.cuh: small PTX helpers every kernel uses (the
// translation unit includes no CUDA header). Needs FJ_DTYPE_BF16 or
// FJ_DTYPE_F16 (fj_pack2).
#pragma once

__device__ __forceinline__ unsigned fj_smem_u32(const void *ptr) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
      : "=r"(r) : "l"(ptr));
  return r;
}

// Two floats to a packed pair of the element type, `lo` at the lower address.
__device__ __forceinline__ unsigned fj_pack2(float lo, float hi) {
  unsigned r;
#if defined(FJ_DTYPE_BF16)
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

// 2^x on the special-function unit; 2^-inf = 0, which the masking relies on.
__device__ __forceinline__ float fj_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// One 16-byte store to global memory (the runtime checks that O and its
// strides are 16-byte aligned). Through PTX: a store of a 16-byte struct
// came out of NVVM as four 4-byte stores (SASS STG.E x 4).
__device__ __forceinline__ void fj_st_global_v4(void *dst, unsigned a, unsigned b,
                                                unsigned c, unsigned d) {
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %0;\n"
      " st.global.v4.b32 [g], {%1, %2, %3, %4};\n}\n"
      :: "l"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// threadIdx.x through a volatile read: values derived from it are recomputed
// where they are used (a few integer ops per tile) instead of being kept in
// registers for the whole kv loop, where every register is taken by S, P and O.
__device__ __forceinline__ int fj_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

__device__ __forceinline__ float fj_neg_inf() { return __int_as_float(0xff800000); }

// Programmatic dependent launch (sm_90 and newer; nothing below). A kernel
// the runtime launches as a programmatic dependent of the kernel before it
// on the stream (runtime/decode.c: the decode's merge) may start while that
// kernel finishes: each of its threads calls fj_grid_dep_wait before it
// touches what that kernel writes (a plain launch passes at once).
// fj_grid_dep_launch lets this kernel's own dependent start early.
__device__ __forceinline__ void fj_grid_dep_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void fj_grid_dep_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
