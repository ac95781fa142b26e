/*
 * cli/npy.h: reading and writing NumPy .npy files, for the CLI's --buffer,
 * --inputs and --dump.
 *
 * Reads format versions 1.0, 2.0 and 3.0 with little-endian float32 ('<f4'),
 * int32 ('<i4') or float64 ('<f8') data in C order; Fortran order and other
 * dtypes are rejected with a message that says what was found. Writes
 * version 1.0 files of float32 or int32 in C order.
 */
#ifndef FJ_CLI_NPY_H
#define FJ_CLI_NPY_H

#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_DIMS 8

typedef enum { NPY_F32 = 0, NPY_I32 = 1, NPY_F64 = 2 } npy_dtype;

typedef struct npy_array {
  npy_dtype dtype;
  int ndim;
  int64_t shape[NPY_MAX_DIMS];
  size_t count; /* product of shape (1 for a 0-d array) */
  void *data;   /* owned: count elements of dtype; free with npy_free */
} npy_array;

/* "<f4", "<i4", "<f8". */
const char *npy_dtype_descr(npy_dtype dtype);
size_t npy_dtype_size(npy_dtype dtype);

/* Reads path into *out. Returns 0, or -1 with a message ("FILE: ...") in
 * err. */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);

/* Writes `data` (count = product of shape elements of dtype NPY_F32 or
 * NPY_I32) to path. Returns 0, or -1 with a message in err. */
int npy_write(const char *path, npy_dtype dtype, const void *data, int ndim,
              const int64_t *shape, char *err, size_t errlen);

/* A newly allocated float32 copy of the array's data (converting int32 and
 * float64), or NULL when out of memory. */
float *npy_to_f32(const npy_array *a);

void npy_free(npy_array *a);

#endif /* FJ_CLI_NPY_H */
