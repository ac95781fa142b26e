/*
 * runtime/driver.c: loads libcuda.so.1 at run time (see driver.h).
 *
 * Only cuGetProcAddress is looked up with dlsym; every other entry point is
 * asked of the driver with an explicit ABI version, so we get the same
 * variant (cuMemAlloc_v2, ...) that cuda.h's macros name in our struct.
 */
#include "runtime/driver.h"

#include "runtime/dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ABI the entry points are requested with: the CUDA 12.0 variants. Every
 * field of fjr_driver has had its current signature since 12.0 at the latest,
 * and a 12.x or newer driver serves them. */
#define FJR_DRIVER_ABI 12000

typedef CUresult (*fjr_getproc_v2_fn)(const char *, void **, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult *);
typedef CUresult (*fjr_getproc_v1_fn)(const char *, void **, int, cuuint64_t);

/* How the driver is asked for an entry point: one of the two signatures. */
typedef struct fjr_getproc {
  fjr_getproc_v2_fn v2;
  fjr_getproc_v1_fn v1;
} fjr_getproc;

static CUresult getproc_call(const fjr_getproc *gp, const char *symbol,
                             void **pfn) {
  *pfn = NULL;
  if (gp->v2) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = gp->v2(symbol, pfn, FJR_DRIVER_ABI,
                        CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r == CUDA_SUCCESS && found != CU_GET_PROC_ADDRESS_SUCCESS)
      r = CUDA_ERROR_NOT_FOUND;
    return r;
  }
  return gp->v1(symbol, pfn, FJR_DRIVER_ABI, CU_GET_PROC_ADDRESS_DEFAULT);
}

/* Resolves one field; on failure writes which entry point was missing. */
static int resolve_one(const fjr_getproc *gp, const char *symbol, void **slot,
                       const char *lib, char *err, size_t errlen) {
  CUresult r = getproc_call(gp, symbol, slot);
  if (r == CUDA_SUCCESS && *slot)
    return 0;
  snprintf(err, errlen,
           "%s: cuGetProcAddress(\"%s\", %d) failed (CUresult %d); the "
           "driver is too old for flexjit (needs CUDA 12.0 or newer)",
           lib, symbol, FJR_DRIVER_ABI, (int)r);
  *slot = NULL;
  return -1;
}

/* The string is taken before macro expansion ("cuMemAlloc"), the field name
 * after it (cuMemAlloc_v2 via cuda.h), which is what the driver expects. */
#define FJR_RESOLVE(field)                                                    \
  do {                                                                        \
    if (resolve_one(gp, #field, (void **)&drv->field, lib, err, errlen))      \
      return -1;                                                              \
  } while (0)

static int resolve_all(const fjr_getproc *gp, fjr_driver *drv, const char *lib,
                       char *err, size_t errlen) {
  FJR_RESOLVE(cuInit);
  FJR_RESOLVE(cuDriverGetVersion);
  FJR_RESOLVE(cuGetErrorName);
  FJR_RESOLVE(cuGetErrorString);
  FJR_RESOLVE(cuDeviceGetCount);
  FJR_RESOLVE(cuDeviceGet);
  FJR_RESOLVE(cuDeviceGetName);
  FJR_RESOLVE(cuDeviceGetAttribute);
  FJR_RESOLVE(cuDevicePrimaryCtxRetain);
  FJR_RESOLVE(cuDevicePrimaryCtxRelease);
  FJR_RESOLVE(cuCtxGetCurrent);
  FJR_RESOLVE(cuCtxSetCurrent);
  FJR_RESOLVE(cuCtxSynchronize);
  FJR_RESOLVE(cuModuleLoadData);
  FJR_RESOLVE(cuModuleUnload);
  FJR_RESOLVE(cuModuleGetFunction);
  FJR_RESOLVE(cuFuncSetAttribute);
  FJR_RESOLVE(cuFuncGetAttribute);
  FJR_RESOLVE(cuOccupancyMaxActiveBlocksPerMultiprocessor);
  FJR_RESOLVE(cuLaunchKernel);
  FJR_RESOLVE(cuLaunchKernelEx);
  FJR_RESOLVE(cuMemAlloc);
  FJR_RESOLVE(cuMemFree);
  FJR_RESOLVE(cuMemcpyHtoD);
  FJR_RESOLVE(cuMemcpyDtoH);
  FJR_RESOLVE(cuMemsetD8);
  FJR_RESOLVE(cuMemsetD32);
  FJR_RESOLVE(cuMemAllocAsync);
  FJR_RESOLVE(cuMemFreeAsync);
  FJR_RESOLVE(cuMemsetD32Async);
  FJR_RESOLVE(cuMemPoolCreate);
  FJR_RESOLVE(cuMemPoolDestroy);
  FJR_RESOLVE(cuMemPoolSetAttribute);
  FJR_RESOLVE(cuMemAllocFromPoolAsync);
  FJR_RESOLVE(cuPointerGetAttribute);
  FJR_RESOLVE(cuStreamCreate);
  FJR_RESOLVE(cuStreamDestroy);
  FJR_RESOLVE(cuStreamSynchronize);
  FJR_RESOLVE(cuEventCreate);
  FJR_RESOLVE(cuEventDestroy);
  FJR_RESOLVE(cuEventRecord);
  FJR_RESOLVE(cuEventSynchronize);
  FJR_RESOLVE(cuEventElapsedTime);
  FJR_RESOLVE(cuTensorMapEncodeTiled);
  return 0;
}

#undef FJR_RESOLVE

static int find_getproc(void *handle, fjr_getproc *gp, const char *lib,
                        char *err, size_t errlen) {
  /* dlsym returns void*; going through memcpy keeps -Wpedantic quiet about
   * object-to-function pointer conversion. */
  void *sym = dlsym(handle, "cuGetProcAddress_v2");
  memset(gp, 0, sizeof *gp);
  if (sym) {
    memcpy(&gp->v2, &sym, sizeof sym);
    return 0;
  }
  sym = dlsym(handle, "cuGetProcAddress");
  if (sym) {
    memcpy(&gp->v1, &sym, sizeof sym);
    return 0;
  }
  snprintf(err, errlen,
           "%s has no cuGetProcAddress: the driver is too old for flexjit "
           "(needs CUDA 12.0 or newer)",
           lib);
  return -1;
}

static int init_driver(fjr_driver *drv, char *err, size_t errlen) {
  CUresult r = drv->cuInit(0);
  if (r == CUDA_SUCCESS)
    r = drv->cuDriverGetVersion(&drv->version);
  if (r == CUDA_SUCCESS)
    return 0;
  char text[256];
  fjr_driver_error_text(drv, r, text, sizeof text);
  snprintf(err, errlen, "cuInit failed: %s", text);
  return -1;
}

static int init_table(void *handle, const char *lib, void *table, char *err,
                      size_t errlen) {
  fjr_getproc gp;
  fjr_driver *drv = table;
  if (find_getproc(handle, &gp, lib, err, errlen) ||
      resolve_all(&gp, drv, lib, err, errlen) || init_driver(drv, err, errlen))
    return -1;
  return 0;
}

fj_status fjr_driver_load(const char *path, const fjr_driver **out, char *err,
                          size_t errlen) {
  const char *const lib[] = {path ? path : "libcuda.so.1"};
  const void *table = NULL;
  char why[768] = "";
  fj_status st = fjr_dl_load("libcuda", lib, 1, init_table, sizeof(fjr_driver),
                             FJ_ENODRIVER, &table, why, sizeof why);
  if (out) *out = table;
  if (err && errlen) snprintf(err, errlen, "%s", st == FJ_OK ? "" : why);
  return st;
}

void fjr_driver_error_text(const fjr_driver *drv, CUresult r, char *buf,
                           size_t len) {
  const char *name = NULL, *desc = NULL;
  if (!buf || !len)
    return;
  if (drv && drv->cuGetErrorName &&
      drv->cuGetErrorName(r, &name) != CUDA_SUCCESS)
    name = NULL;
  if (drv && drv->cuGetErrorString &&
      drv->cuGetErrorString(r, &desc) != CUDA_SUCCESS)
    desc = NULL;
  if (name && desc)
    snprintf(buf, len, "%s: %s", name, desc);
  else if (name)
    snprintf(buf, len, "%s (CUresult %d)", name, (int)r);
  else
    snprintf(buf, len, "CUresult %d", (int)r);
}
