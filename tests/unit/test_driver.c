/*
 * tests/unit/test_driver.c: loading the CUDA driver (runtime/driver.c).
 *
 * The driver is loaded once per process, so every scenario runs in a forked
 * child with FLEXJIT_LIBCUDA pointing at the library under test: a missing
 * file, a library that is not the driver, or small fake drivers compiled
 * here with the system C compiler (those tests skip when there is none).
 * On a machine with a GPU, the real driver is loaded as well.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/driver.h"

/* A stand-in for libcuda: entry points are served only for ABI >= 12000, so
 * a request for an older ABI fails; cuMemAlloc is the _v2 variant (it writes
 * 0x1000 + size) so the test can tell which one the table holds. */
static const char fake_source[] =
    "#include <stddef.h>\n"
    "#include <string.h>\n"
    "typedef int CUresult;\n"
    "static CUresult f_init(unsigned f) { (void)f; return INIT_RESULT; }\n"
    "static CUresult f_version(int *v) { *v = 12080; return 0; }\n"
    "static CUresult f_name(CUresult r, const char **s) {\n"
    "  *s = r == 100 ? \"CUDA_ERROR_NO_DEVICE\" : \"CUDA_ERROR_UNKNOWN\";\n"
    "  return 0; }\n"
    "static CUresult f_string(CUresult r, const char **s) {\n"
    "  *s = r == 100 ? \"no CUDA-capable device is detected\" : \"unknown\";\n"
    "  return 0; }\n"
    "static CUresult f_alloc(unsigned long long *p, size_t n) {\n"
    "  *p = 0x1000 + n; return 0; }\n"
    "static CUresult f_ok1(void *a) { (void)a; return 0; }\n"
    "static CUresult f_ok2(void *a, int b) { (void)a, (void)b; return 0; }\n"
    "static CUresult f_other(void) { return 999; }\n"
    "static void *lookup(const char *s, int ver) {\n"
    "  if (ver < 12000) return 0;\n"
    "#ifdef MISSING\n"
    "  if (!strcmp(s, MISSING)) return 0;\n"
    "#endif\n"
    "  if (!strcmp(s, \"cuInit\")) return (void *)f_init;\n"
    "  if (!strcmp(s, \"cuDriverGetVersion\")) return (void *)f_version;\n"
    "  if (!strcmp(s, \"cuGetErrorName\")) return (void *)f_name;\n"
    "  if (!strcmp(s, \"cuGetErrorString\")) return (void *)f_string;\n"
    "  if (!strcmp(s, \"cuMemAlloc\")) return (void *)f_alloc;\n"
    "  if (!strcmp(s, \"cuDeviceGet\")) return (void *)f_ok2;\n"
    "  if (!strcmp(s, \"cuDevicePrimaryCtxRetain\")) return (void *)f_ok2;\n"
    "  if (!strcmp(s, \"cuCtxSetCurrent\")) return (void *)f_ok1;\n"
    "  if (!strcmp(s, \"cuMemFree\")) return (void *)f_ok1;\n"
    "  if (!strncmp(s, \"cu\", 2) && !strstr(s, \"_v\"))\n"
    "    return (void *)f_other;\n"
    "  return 0;\n"
    "}\n"
    "#ifdef V1_ONLY\n"
    "CUresult cuGetProcAddress(const char *s, void **p, int v,\n"
    "                          unsigned long long f) {\n"
    "  (void)f; *p = lookup(s, v); return *p ? 0 : 500; }\n"
    "#else\n"
    "CUresult cuGetProcAddress_v2(const char *s, void **p, int v,\n"
    "                             unsigned long long f, int *found) {\n"
    "  (void)f; *p = lookup(s, v); *found = *p ? 0 : 1; return 0; }\n"
    "#endif\n";

typedef struct fakes {
  char dir[64];
  int have_cc;
} fakes;

static int build_fake(const fakes *f, const char *name, const char *defines) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "cc -shared -fPIC -w %s -o %s/%s %s/fake.c >/dev/null 2>&1",
           defines, f->dir, name, f->dir);
  return system(cmd) == 0 ? 0 : -1;
}

static int setup_fakes(void **state) {
  fakes *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/fj-driver-XXXXXX");
  if (!mkdtemp(f->dir))
    return -1;
  char path[128];
  snprintf(path, sizeof path, "%s/fake.c", f->dir);
  FILE *fp = fopen(path, "w");
  if (!fp)
    return -1;
  fputs(fake_source, fp);
  fclose(fp);
  f->have_cc = build_fake(f, "nodevice.so", "-DINIT_RESULT=100") == 0 &&
               build_fake(f, "ok.so", "-DINIT_RESULT=0") == 0 &&
               build_fake(f, "v1.so", "-DINIT_RESULT=0 -DV1_ONLY") == 0 &&
               build_fake(f, "missing.so",
                          "-DINIT_RESULT=0 "
                          "-DMISSING='\"cuEventElapsedTime\"'") == 0;
  *state = f;
  return 0;
}

static int teardown_fakes(void **state) {
  fakes *f = *state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
  if (system(cmd) != 0)
    return -1;
  free(f);
  return 0;
}

/* What a child saw, sent back through a pipe. */
typedef struct load_result {
  fj_status status;
  int version;
  int all_fields_set;
  unsigned long long alloc_ptr;
  char err[512];
  char again_err[512];
} load_result;

static int all_fields_set(const fjr_driver *drv) {
  /* Every member from cuInit on is a function pointer. */
  size_t first = offsetof(fjr_driver, cuInit);
  const unsigned char *p = (const unsigned char *)drv + first;
  size_t n = (sizeof *drv - first) / sizeof(void (*)(void));
  for (size_t i = 0; i < n; i++) {
    void (*fn)(void);
    memcpy(&fn, p + i * sizeof fn, sizeof fn);
    if (!fn)
      return 0;
  }
  return 1;
}

static void child_load(load_result *r) {
  const fjr_driver *drv = (const fjr_driver *)1;
  r->status = fjr_driver_load(getenv("FLEXJIT_LIBCUDA"), &drv, r->err, sizeof r->err);
  if (r->status == FJ_OK) {
    CUdeviceptr p = 0;
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    r->version = drv->version;
    r->all_fields_set = all_fields_set(drv);
    /* Allocation needs a current context: device 0's primary one. */
    if (drv->cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
        drv->cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS &&
        drv->cuCtxSetCurrent(ctx) == CUDA_SUCCESS &&
        drv->cuMemAlloc(&p, 8) == CUDA_SUCCESS)
      r->alloc_ptr = (unsigned long long)p;
    if (r->alloc_ptr)
      drv->cuMemFree(p);
  } else if (drv != NULL) {
    r->status = FJ_EINVAL; /* the table must be NULL on failure */
  }
  /* The outcome is decided once per process. */
  const fjr_driver *again = NULL;
  if (fjr_driver_load(getenv("FLEXJIT_LIBCUDA"), &again, r->again_err, sizeof r->again_err) !=
      (r->status == FJ_EINVAL ? FJ_ENODRIVER : r->status))
    r->status = FJ_EINVAL;
}

/* Loads the driver in a child with FLEXJIT_LIBCUDA=lib (NULL: unset). */
static load_result load_in_child(const char *lib) {
  load_result r;
  int fds[2];
  memset(&r, 0, sizeof r);
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    if (lib)
      setenv("FLEXJIT_LIBCUDA", lib, 1);
    else
      unsetenv("FLEXJIT_LIBCUDA");
    child_load(&r);
    _exit(write(fds[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 1);
  }
  close(fds[1]);
  assert_int_equal(read(fds[0], &r, sizeof r), (ssize_t)sizeof r);
  close(fds[0]);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return r;
}

static void test_missing_library(void **state) {
  (void)state;
  load_result r = load_in_child("/nonexistent/libcuda.so.1");
  assert_int_equal(r.status, FJ_ENODRIVER);
  assert_non_null(strstr(r.err, "/nonexistent/libcuda.so.1 not found: "));
  assert_string_equal(r.again_err, r.err);
}

static void test_not_a_driver(void **state) {
  (void)state;
  load_result r = load_in_child("libm.so.6");
  assert_int_equal(r.status, FJ_ENODRIVER);
  assert_non_null(strstr(r.err, "has no cuGetProcAddress"));
}

static const fakes *need_fakes(void **state) {
  const fakes *f = *state;
  if (!f->have_cc) {
    print_message("no C compiler for the fake drivers, skipping\n");
    skip();
  }
  return f;
}

static load_result load_fake(const fakes *f, const char *name) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", f->dir, name);
  return load_in_child(path);
}

static void test_cuinit_failure(void **state) {
  load_result r = load_fake(need_fakes(state), "nodevice.so");
  assert_int_equal(r.status, FJ_ENODRIVER);
  assert_string_equal(
      r.err,
      "cuInit failed: CUDA_ERROR_NO_DEVICE: "
      "no CUDA-capable device is detected");
}

static void expect_fake_loaded(const load_result *r) {
  if (r->status != FJ_OK)
    print_message("load failed: %s\n", r->err);
  assert_int_equal(r->status, FJ_OK);
  assert_string_equal(r->err, "");
  assert_int_equal(r->version, 12080);
  assert_true(r->all_fields_set);
  /* The _v2 ABI of cuMemAlloc, asked for by its base name. */
  assert_int_equal(r->alloc_ptr, 0x1008);
}

static void test_fake_driver_loads(void **state) {
  load_result r = load_fake(need_fakes(state), "ok.so");
  expect_fake_loaded(&r);
}

static void test_fallback_to_v1_getproc(void **state) {
  load_result r = load_fake(need_fakes(state), "v1.so");
  expect_fake_loaded(&r);
}

static void test_missing_entry_point(void **state) {
  load_result r = load_fake(need_fakes(state), "missing.so");
  assert_int_equal(r.status, FJ_ENODRIVER);
  assert_non_null(strstr(r.err, "\"cuEventElapsedTime\""));
}

/* The real driver, if this machine has one: either it loads, or the reason
 * is one of the two documented ones. */
static void test_real_driver(void **state) {
  (void)state;
  load_result r = load_in_child(NULL);
  if (r.status != FJ_OK) {
    print_message("no usable driver here: %s\n", r.err);
    assert_int_equal(r.status, FJ_ENODRIVER);
    assert_true(strncmp(r.err, "libcuda.so.1 not found: ", 24) == 0 ||
                strncmp(r.err, "cuInit failed: ", 15) == 0);
    return;
  }
  assert_true(r.version >= 12000);
  assert_true(r.all_fields_set);
  assert_true(r.alloc_ptr != 0);
}

static void test_error_text_without_driver(void **state) {
  (void)state;
  char buf[64];
  fjr_driver_error_text(NULL, CUDA_ERROR_OUT_OF_MEMORY, buf, sizeof buf);
  assert_string_equal(buf, "CUresult 2");
  fjr_driver_error_text(NULL, CUDA_SUCCESS, buf, 4);
  assert_string_equal(buf, "CUr");
}

/* The library must reach the driver only through dlopen: no undefined cu*
 * or nvrtc* symbol in the static library. Skips outside a CMake build. */
static void test_no_link_time_driver_dependency(void **state) {
  (void)state;
  char cmd[1024], line[512];
  struct stat st;
  snprintf(cmd, sizeof cmd, "%s/libflexjit.a", FJ_BINARY_DIR);
  if (stat(cmd, &st) != 0) {
    print_message("%s not built, skipping\n", cmd);
    skip();
  }
  snprintf(cmd, sizeof cmd,
           "nm -u %s/libflexjit.a 2>/dev/null | grep -E ' U (cu[A-Z]|nvrtc)'",
           FJ_BINARY_DIR);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  int found = 0;
  while (fgets(line, sizeof line, p)) {
    print_message("link-time reference: %s", line);
    found++;
  }
  pclose(p);
  assert_int_equal(found, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_library),
      cmocka_unit_test(test_not_a_driver),
      cmocka_unit_test(test_cuinit_failure),
      cmocka_unit_test(test_fake_driver_loads),
      cmocka_unit_test(test_fallback_to_v1_getproc),
      cmocka_unit_test(test_missing_entry_point),
      cmocka_unit_test(test_real_driver),
      cmocka_unit_test(test_error_text_without_driver),
      cmocka_unit_test(test_no_link_time_driver_dependency),
  };
  return cmocka_run_group_tests(tests, setup_fakes, teardown_fakes);
}
