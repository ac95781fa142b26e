/*
 * tests/unit/host_prelude.h: the C++ that lets emitted device code and
 * template parts compile and run on the host (g++), for the tests that
 * check them against the CPU evaluator: the CUDA qualifiers as nothing,
 * and the intrinsics the generator emits as their plain float meaning.
 * FJT_HOST_PRELUDE is what every such test needs; FJT_HOST_ATOMIC adds
 * atomicAdd (one thread: a plain add) for the backward hooks.
 */
#ifndef FJT_HOST_PRELUDE_H
#define FJT_HOST_PRELUDE_H

#define FJT_HOST_INTRINSICS                                                              \
  "#define __device__\n#define __forceinline__ inline\n"                               \
  "static inline int __ldg(const int *p) { return *p; }\n"                               \
  "static inline float __ldg(const float *p) { return *p; }\n"                           \
  "static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }\n" \
  "static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }\n" \
  "static inline unsigned __float_as_uint(float f) { unsigned x; memcpy(&x, &f, 4); return x; }\n" \
  "static inline float __fdividef(float a, float b) { return a / b; }\n"                 \
  "static inline float __fadd_rn(float a, float b) { return a + b; }\n"                  \
  "static inline float __fsub_rn(float a, float b) { return a - b; }\n"                  \
  "static inline float __fmul_rn(float a, float b) { return a * b; }\n"                  \
  "static inline float __fdiv_rn(float a, float b) { return a / b; }\n"                  \
  "static inline float __fsqrt_rn(float a) { return sqrtf(a); }\n"

#define FJT_HOST_PRELUDE "#include <math.h>\n#include <string.h>\n" FJT_HOST_INTRINSICS

#define FJT_HOST_ATOMIC \
  "static inline float atomicAdd(float *p, float v) { float o = *p; *p = o + v; return o; }\n"

#endif /* FJT_HOST_PRELUDE_H */
