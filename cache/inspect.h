/*
 * cache/inspect.h: walking a store's entries: list, verify, clear.
 *
 * These work on every release directory under the root
 * (<root>/<libver>/<arch>/<aa>/), not only the running library's, because
 * old releases take disk space too. They only ever touch files the store
 * itself creates (<32 hex>.cubin, .json, .lock and .tmp.* temp files) and the
 * directories holding them, so pointing them at a wrong directory deletes
 * nothing else. Not thread-safe with respect to the store; safe against
 * other processes using the same root (they see entries vanish as misses).
 */
#ifndef FJC_INSPECT_H
#define FJC_INSPECT_H

#include <stdint.h>
#include <time.h>

#include "cache/key.h"
#include "cache/store.h"

typedef struct fjc_entry_info {
  fjc_key key;           /* from the file name */
  char libver[32];       /* the release directory */
  char arch[32];
  char name[128];        /* the sidecar's "name", "" if none (list only) */
  const char *path;      /* the .cubin; borrowed, valid during the callback */
  uint64_t cubin_bytes;  /* size of the .cubin file, header included */
  uint64_t meta_bytes;   /* size of the .json sidecar, 0 if none */
  struct timespec mtime; /* of the .cubin: the last hit or put (LRU age) */
} fjc_entry_info;

/* Called once per entry; a non-zero return stops the walk (and becomes the
 * walk's FJ_OK result: stopping is not an error). */
typedef int (*fjc_entry_fn)(void *user, const fjc_entry_info *entry);

/* Calls fn for every .cubin entry under the root, in no particular order.
 * FJ_OK also for a missing root or a disabled store (no entries).
 * FJ_EIO when the root exists but cannot be read. */
fj_status fjc_store_list(fjc_store *store, fjc_entry_fn fn, void *user);

typedef struct fjc_verify_report {
  int checked;     /* entries read */
  int bad;         /* corrupt entries found */
  int removed;     /* bad entries deleted (with remove_bad) */
  int foreign;     /* entries of another entry format, left alone */
  int stale_temps; /* leftover temp files of crashed writers removed */
} fjc_verify_report;

/* Called for each bad entry, with the reason; may be NULL. */
typedef void (*fjc_bad_entry_fn)(void *user, const char *path,
                                 const char *why);

/* Re-reads every entry and checks magic, format, length, key (against the
 * file name) and checksum. With remove_bad, deletes bad entries (.cubin,
 * .json, .lock) and temp files older than ten minutes (younger ones may
 * belong to a writer still at work). FJ_OK even when bad entries were found:
 * the report says how many. */
fj_status fjc_store_verify(fjc_store *store, int remove_bad,
                           fjc_bad_entry_fn on_bad, void *user,
                           fjc_verify_report *report);

/* Deletes every entry (and lock and temp file) under the root, then the
 * directories that became empty. *removed (may be NULL) receives the number
 * of entries deleted, *bytes (may be NULL) their .cubin + .json bytes. */
fj_status fjc_store_clear(fjc_store *store, int *removed, uint64_t *bytes);

/* Deletes one entry's .cubin, .json and .lock (the .cubin path). Returns 0
 * when the .cubin is gone afterwards. */
int fjc_entry_remove(const char *cubin_path);

#endif /* FJC_INSPECT_H */
