/*
 * tests/unit/store_count.h: how many entries the cache store at a directory
 * holds, for the tests of what `flexjit precompile` writes
 * (test_cache_precompile, test_deploy). Include after <cmocka.h>.
 */
#ifndef FJ_TESTS_STORE_COUNT_H
#define FJ_TESTS_STORE_COUNT_H

#include "cache/inspect.h"
#include "cache/store.h"

static int fjt_count_entry(void *user, const fjc_entry_info *e) {
  (void)e;
  ++*(int *)user;
  return 0;
}

/* The entries of the store at dir, through the store's own listing. */
static inline int fjt_store_count(const char *dir) {
  fjc_store *s = NULL;
  char err[256];
  int n = 0;
  if (fjc_store_open(dir, 0, NULL, NULL, &s, err, sizeof err) != FJ_OK)
    fail_msg("opening the store at %s: %s", dir, err);
  assert_int_equal(fjc_store_list(s, fjt_count_entry, &n, NULL, 0), FJ_OK);
  fjc_store_close(s);
  return n;
}

#endif /* FJ_TESTS_STORE_COUNT_H */
