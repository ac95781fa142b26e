/*
 * cache/inspect.h: walking a store's files: list, verify, clear, and the
 * single-entry removals that pruning uses. Works on a store (cache/store.h)
 * and is used by cache/prune.h.
 *
 * These work on every release directory under the root
 * (<root>/<libver>/<arch>/<aa>/), not only the running library's, because
 * old releases take disk space too. They only ever touch files the store
 * itself creates (<32 hex>.cubin, .json, .lock and .src aliases, and .tmp.*
 * temp files) and the directories holding them, so pointing them at a wrong
 * directory deletes nothing else. Below the root they follow no symbolic
 * link: a linked directory is not entered and a linked file is neither read
 * nor removed, so nothing outside the root is ever touched.
 *
 * A directory below the root that cannot be read, or a file that cannot be
 * removed, makes a call return FJ_EIO after it has done what it could, with
 * err (the caller's buffer of errlen bytes; may be NULL) naming the first
 * such path and the reason. err is written only on failure.
 *
 * Not thread-safe with respect to the store; safe against other processes
 * using the same root (they see entries vanish as misses).
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
 * FJ_EIO when the root or a directory below it cannot be read. */
fj_status fjc_store_list(fjc_store *store, fjc_entry_fn fn, void *user,
                         char *err, size_t errlen);

/* A source-key alias (see cache/store.h). */
typedef struct fjc_alias_info {
  fjc_key source_key; /* from the file name */
  fjc_key key;        /* the entry it names (unless corrupt) */
  char libver[32];
  char arch[32];
  const char *path;   /* borrowed, valid during the callback */
  int corrupt;        /* not an alias the store writes */
  int dangling;       /* names an entry that is not there */
} fjc_alias_info;

typedef int (*fjc_alias_fn)(void *user, const fjc_alias_info *alias);

/* Calls fn for every alias under the root, as fjc_store_list does for
 * entries. */
fj_status fjc_store_list_aliases(fjc_store *store, fjc_alias_fn fn, void *user,
                                 char *err, size_t errlen);

typedef struct fjc_verify_report {
  int checked;         /* entries read */
  int bad;             /* corrupt entries found */
  int removed;         /* bad entries deleted (with remove_bad) */
  int foreign;         /* entries of another entry format, left alone */
  int stale_temps;     /* leftover temp files of crashed writers removed */
  int aliases;         /* source-key aliases read */
  int bad_aliases;     /* corrupt or dangling ones */
  int removed_aliases; /* of those, deleted (with remove_bad) */
} fjc_verify_report;

/* Called for each bad entry or alias, with the reason; may be NULL. */
typedef void (*fjc_bad_entry_fn)(void *user, const char *path,
                                 const char *why);

/* Re-reads every entry and checks magic, format, length, key (against the
 * file name) and checksum, then every alias (well formed, its entry there).
 * With remove_bad, deletes bad entries (.cubin, .json, .lock), temp files
 * older than ten minutes (younger ones may belong to a writer still at
 * work) and bad aliases (after the entries, so an alias of an entry just
 * deleted goes too). FJ_OK even when bad entries were found: the report
 * says how many; FJ_EIO as at the top of this file. */
fj_status fjc_store_verify(fjc_store *store, int remove_bad,
                           fjc_bad_entry_fn on_bad, void *user,
                           fjc_verify_report *report, char *err, size_t errlen);

/* Deletes every entry, alias, lock and temp file under the root, then the
 * directories that became empty. *removed (may be NULL) receives the number
 * of entries deleted, *bytes (may be NULL) their .cubin + .json bytes. */
fj_status fjc_store_clear(fjc_store *store, int *removed, uint64_t *bytes,
                          char *err, size_t errlen);

/* Deletes one entry's .cubin, .json and .lock (release libver, target
 * arch) unless another process holds its compile lock (tried without
 * waiting). Returns 1 when deleted, 0 when kept because it is being
 * compiled or already gone, -1 when it could not be deleted (err names the
 * path and the reason) or the arguments are bad. */
int fjc_entry_evict(fjc_store *store, const char *libver, const char *arch,
                    const fjc_key *key, char *err, size_t errlen);

/* Deletes every dangling alias (its entry gone). *removed (may be NULL)
 * receives how many. FJ_OK, or FJ_EIO as at the top of this file. */
fj_status fjc_store_remove_dangling_aliases(fjc_store *store, int *removed,
                                            char *err, size_t errlen);

#endif /* FJC_INSPECT_H */
