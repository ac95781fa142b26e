// templates/sm90/ptx.cuh: PTX wrappers of the sm_90a features the kernels
// use: mbarriers, TMA loads and stores, setmaxnreg, named barriers, proxy
// fences and wgmma with its shared-memory descriptors. They know nothing of
// attention; only the element type (FJ_DTYPE_BF16 or FJ_DTYPE_F16) picks
// the wgmma operand type.
#pragma once

#if defined(FJ_DTYPE_BF16)
#define FJH_AB ".bf16.bf16"
#else
#define FJH_AB ".f16.f16"
#endif

// An opaque 128-byte CUtensorMap image (cuda.h is not included).
struct __align__(64) fjh_tensor_map {
  unsigned long long opaque[16];
};

__device__ __forceinline__ void fjh_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count)
               : "memory");
}
// Makes the initialized barriers visible to the async proxy (TMA).
__device__ __forceinline__ void fjh_fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void fjh_mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fjh_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Blocks until the phase of parity `parity` has completed. FJ_DEBUG_WAIT_LIMIT
// (optional, test harnesses only) traps after that many polls, so that a
// pipeline bug fails the launch instead of hanging the GPU.
__device__ __forceinline__ void fjh_mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
#ifdef FJ_DEBUG_WAIT_LIMIT
  unsigned polls = 0;
#endif
  do {
#ifdef FJ_DEBUG_WAIT_LIMIT
    if (++polls > (unsigned)(FJ_DEBUG_WAIT_LIMIT)) asm volatile("trap;");
#endif
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
// The same for a whole consumer warp: lanes may leave the spin loop at
// different trips, and the wgmma and bar instructions that follow need the
// warp converged. (The producer thread runs alone in its warp, whose other
// lanes have exited, so it must not use this one.)
__device__ __forceinline__ void fjh_mbar_wait_warp(unsigned bar, unsigned parity) {
  fjh_mbar_wait(bar, parity);
  __syncwarp();
}

// TMA: a (64 x rows) box of the 4-D tensor at (c0, c1, c2, c3) into shared
// memory, completing `bar`'s transaction count.
__device__ __forceinline__ void fjh_tma_load_4d(unsigned dst, const fjh_tensor_map *map,
                                                int c0, int c1, int c2, int c3,
                                                unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// Shared to global (the box at coordinates c0..c3; rows outside the
// tensor are not written), in the calling thread's bulk group.
__device__ __forceinline__ void fjh_tma_store_4d(const fjh_tensor_map *map, unsigned src,
                                                 int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
      :: "l"(map), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void fjh_bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// The thread's bulk stores have read their shared memory.
__device__ __forceinline__ void fjh_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// The thread's bulk groups are complete: their writes to global memory
// are done.
__device__ __forceinline__ void fjh_bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Global += shared, `bytes` (a multiple of 16) of fp32 from src to dst
// (both 16-byte aligned), in the calling thread's bulk group.
__device__ __forceinline__ void fjh_bulk_reduce_add_f32(float *dst, unsigned src, unsigned bytes) {
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %0;\n"
      " cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [g], [%1], %2;\n}\n"
      :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
// Global = shared, `bytes` (a multiple of 16) from src to dst (both 16-byte
// aligned), in the calling thread's bulk group.
__device__ __forceinline__ void fjh_bulk_copy_out(void *dst, unsigned src, unsigned bytes) {
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %0;\n"
      " cp.async.bulk.global.shared::cta.bulk_group [g], [%1], %2;\n}\n"
      :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
// Four 8 x 8 matrices of 16-bit elements into shared memory: lanes 8 m ..
// 8 m + 7 give the addresses of matrix m's rows (16 bytes each); register m
// holds, in every lane l, row l / 4's elements 2 (l % 4) and 2 (l % 4) + 1
// of matrix m (the mma fragment layout).
__device__ __forceinline__ void fjh_stmatrix_x4(unsigned addr, unsigned r0, unsigned r1,
                                                unsigned r2, unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
__device__ __forceinline__ void fjh_cp_async4(unsigned dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void fjh_cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}
__device__ __forceinline__ void fjh_tma_prefetch_desc(const fjh_tensor_map *map) {
  asm volatile("prefetch.tensormap [%0];\n" :: "l"(map) : "memory");
}

template <int N>
__device__ __forceinline__ void fjh_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N>
__device__ __forceinline__ void fjh_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}

__device__ __forceinline__ void fjh_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void fjh_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// Generic-proxy shared-memory accesses before async-proxy ones (and back).
__device__ __forceinline__ void fjh_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The same between the thread's generic and async proxy accesses to global
// memory (a semaphore's acquire and release around bulk reduce-adds).
__device__ __forceinline__ void fjh_fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

__device__ __forceinline__ void fjh_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void fjh_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void fjh_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

// Registers read or written by an in-flight wgmma must stay where they are
// until its wait: these empty asm statements make the compiler treat them
// as used and redefined at this point, so it neither moves them nor reuses
// them for other values in between.
template <int N>
__device__ __forceinline__ void fjh_fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}
template <int N>
__device__ __forceinline__ void fjh_fence_regs(unsigned (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e]) :: "memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle. For K-major operands
// (Q, K) lbo is unused and sbo = 1024 (8 rows of 128 bytes); for the
// MN-major V, lbo is the distance between 64-column blocks and sbo = 1024
// (8 kv rows). Tile bases are 1024-byte aligned, so the base offset is 0.
// A descriptor is built from its low word (address >> 4 in bits 0-13, lbo
// in 16-29) and a constant high word: fjh_desc_lo once for a tile, then
// fjh_desc adds each k step's byte offset to the low word. That is exact
// because shared memory ends below 256 KiB (no carry out of bits 0-13), and
// costs one add a wgmma instead of rebuilding all fields (the D=64 kernel
// is issue-bound).
__device__ __forceinline__ unsigned fjh_desc_lo(unsigned addr, unsigned lbo) {
  return ((addr & 0x3FFFFu) >> 4) | (((lbo >> 4) & 0x3FFFu) << 16);
}
__device__ __forceinline__ unsigned long long fjh_desc(unsigned lo, unsigned byte_off) {
  constexpr unsigned hi = ((1024u >> 4) & 0x3FFFu) | (1u << 30);  // sbo, swizzle 128B
  return ((unsigned long long)hi << 32) | (lo + (byte_off >> 4));
}

// The accumulator operands of a wgmma m64nN (N / 2 floats a thread): the
// register list in the instruction text, and the asm operands that bind it
// to d[0..], with constraint C ("+f": read and written, "=f": written).
#define FJH_D32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
  "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FJH_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
  "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
  "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63}"
#define FJH_D88 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
  "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
  "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, " \
  "%77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}"
#define FJH_D16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FJH_F8(C, d, i) \
  C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), \
      C(d[i + 6]), C(d[i + 7])
#define FJH_F16(C, d) FJH_F8(C, d, 0), FJH_F8(C, d, 8)
#define FJH_F32(C, d) FJH_F8(C, d, 0), FJH_F8(C, d, 8), FJH_F8(C, d, 16), FJH_F8(C, d, 24)
#define FJH_F64(C, d) \
  FJH_F32(C, d), FJH_F8(C, d, 32), FJH_F8(C, d, 40), FJH_F8(C, d, 48), FJH_F8(C, d, 56)
#define FJH_F88(C, d) \
  FJH_F64(C, d), FJH_F8(C, d, 64), FJH_F8(C, d, 72), FJH_F8(C, d, 80)
#define FJH_RW(x) "+f"(x)
#define FJH_WO(x) "=f"(x)

// d = A * B (FIRST: d is written, not read, the first k step of a product,
// so no instruction but this one defines a new accumulator) or d += A * B,
// with A and B in shared memory: m64n32k16 / m64n64k16 / m64n128k16 /
// m64n176k16 by the accumulator's size. TRANS 0: both operands K-major (S =
// Q K^T); 1: both MN-major (imm-trans-a = imm-trans-b = 1; the backward's
// dQ = dS K, A = dS read from dS^T stored [kv][query], B = K stored
// [kv][d]). One definition a shape: the accumulator's registers are the
// asm's first operands, then the descriptors, the scale-d flag and TRANS
// (operands A, B, S and T).
#define FJH_DEF_WGMMA_SS(NREG, SHAPE, DREGS, FOPS, A, B, S, T)                        \
  template <bool FIRST, int TRANS = 0>                                                 \
  __device__ __forceinline__ void fjh_wgmma_ss(float (&d)[NREG], unsigned long long da, \
                                               unsigned long long db) {                 \
    if constexpr (FIRST)                                                               \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" S ", 0;\n"                     \
                   "wgmma.mma_async.sync.aligned." SHAPE ".f32" FJH_AB " " DREGS       \
                   ", %" A ", %" B ", p, 1, 1, %" T ", %" T ";\n}\n"                    \
                   : FOPS(FJH_WO, d) : "l"(da), "l"(db), "r"(0), "n"(TRANS));          \
    else                                                                               \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" S ", 0;\n"                     \
                   "wgmma.mma_async.sync.aligned." SHAPE ".f32" FJH_AB " " DREGS       \
                   ", %" A ", %" B ", p, 1, 1, %" T ", %" T ";\n}\n"                    \
                   : FOPS(FJH_RW, d) : "l"(da), "l"(db), "r"(1), "n"(TRANS));          \
  }
FJH_DEF_WGMMA_SS(16, "m64n32k16", FJH_D16, FJH_F16, "16", "17", "18", "19")
FJH_DEF_WGMMA_SS(32, "m64n64k16", FJH_D32, FJH_F32, "32", "33", "34", "35")
FJH_DEF_WGMMA_SS(64, "m64n128k16", FJH_D64, FJH_F64, "64", "65", "66", "67")
FJH_DEF_WGMMA_SS(88, "m64n176k16", FJH_D88, FJH_F88, "88", "89", "90", "91")
#undef FJH_DEF_WGMMA_SS

// d += A * B with A (P) in registers and B (V) in shared memory, MN-major
// (imm-trans-b = 1): m64n64k16 / m64n128k16.
__device__ __forceinline__ void fjh_wgmma_rs(float (&d)[32], const unsigned (&a)[4],
                                             unsigned long long db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32" FJH_AB " " FJH_D32
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
               : FJH_F32(FJH_RW, d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void fjh_wgmma_rs(float (&d)[64], const unsigned (&a)[4],
                                             unsigned long long db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32" FJH_AB " " FJH_D64
               ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
               : FJH_F64(FJH_RW, d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

