/*
 * runtime/driver.h: the CUDA driver API, loaded at run time.
 *
 * libcuda.so.1 (or the library the context's options name, $FLEXJIT_LIBCUDA)
 * is dlopened once per process and path (runtime/dl.h) and every entry
 * point is resolved through cuGetProcAddress; the table is immutable after
 * that, so it is safe to share between threads and contexts. There is no
 * link-time dependency on the driver: on a machine without one,
 * fjr_driver_load fails with FJ_ENODRIVER and a message, nothing crashes.
 * Field names are the driver's (cuda.h's macros map cuMemAlloc to
 * cuMemAlloc_v2 and so on consistently, so include cuda.h everywhere).
 */
#ifndef FJR_DRIVER_H
#define FJR_DRIVER_H

#include <stddef.h>

#include <cuda.h>

#include "flexjit.h"

typedef struct fjr_driver {
  int version; /* cuDriverGetVersion */
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuDriverGetVersion)(int *);
  CUresult (*cuGetErrorName)(CUresult, const char **);
  CUresult (*cuGetErrorString)(CUresult, const char **);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetName)(char *, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext *);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuModuleLoadData)(CUmodule *, const void *);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*cuFuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int *, CUfunction, int, size_t);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned,
                             unsigned, unsigned, unsigned, unsigned, CUstream,
                             void **, void **);
  /* With launch attributes: the decode's merge as a programmatic dependent
   * launch (runtime/decode.c). */
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
  CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*cuMemsetD32)(CUdeviceptr, unsigned int, size_t);
  /* Stream-ordered allocation (the persistent kernel's work counter; on a
   * device without memory pools that kernel deals its items out
   * statically instead). */
  CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
  CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
  /* The context's own pool for those counters (one that keeps its memory
   * across synchronizations: runtime/forward.c, work_counter). */
  CUresult (*cuMemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
  CUresult (*cuMemPoolDestroy)(CUmemoryPool);
  CUresult (*cuMemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
  CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
  CUresult (*cuPointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
  CUresult (*cuStreamCreate)(CUstream *, unsigned int);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent *, unsigned int);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
  /* TMA descriptors for the sm90 template (runtime/tma.c); host-only, needs
   * no device or context. */
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType,
                                     cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const cuuint32_t *,
                                     const cuuint32_t *, CUtensorMapInterleave,
                                     CUtensorMapSwizzle,
                                     CUtensorMapL2promotion,
                                     CUtensorMapFloatOOBfill);
} fjr_driver;

/* Loads the driver from path (NULL: libcuda.so.1), once per process and
 * path. On failure returns FJ_ENODRIVER (no such library, or cuInit failed:
 * no device) and writes why into err. */
fj_status fjr_driver_load(const char *path, const fjr_driver **out, char *err,
                          size_t errlen);

/* "CUDA_ERROR_OUT_OF_MEMORY: out of memory" for a CUresult (static or
 * driver-owned strings, never NULL). */
void fjr_driver_error_text(const fjr_driver *drv, CUresult r, char *buf,
                           size_t len);

#endif /* FJR_DRIVER_H */
