/*
 * cache/prune.h: keeping a store under a size limit by evicting the least
 * recently used entries. The top layer of cache/: it works on a store
 * through cache/inspect.h; the store itself never prunes. Whoever puts
 * entries decides when: the runtime calls fjc_store_prune_to_limit after
 * each put, `flexjit cache prune` calls fjc_store_prune.
 *
 * An entry's age is the mtime of its .cubin, which fjc_store_get sets on
 * every hit and fjc_store_put on publication. Its size is its .cubin plus
 * its .json. Eviction deletes .cubin, .json and .lock, oldest first, until
 * the total is at most the limit, and never:
 *  - a key in the caller's in-use list (kernels a process holds), nor
 *  - an entry whose compile lock another process holds right now (it is
 *    being rebuilt; the lock is tried without waiting).
 * So a prune may end above the limit; the report says so. After evicting,
 * the source-key aliases left dangling are deleted too.
 */
#ifndef FJC_PRUNE_H
#define FJC_PRUNE_H

#include <stdint.h>

#include "cache/store.h"

typedef struct fjc_prune_report {
  int entries;            /* entries before pruning */
  int removed;            /* entries evicted */
  int aliases_removed;    /* dangling source-key aliases deleted */
  int kept_in_use;        /* entries that would have gone but were in use */
  uint64_t bytes_before;  /* .cubin + .json bytes before */
  uint64_t bytes_removed;
  uint64_t bytes_after;   /* may exceed the limit when entries were in use */
} fjc_prune_report;

/* Evicts least recently used entries of every release under the store's
 * root until at most max_bytes remain (0 evicts every entry not in use).
 * in_use_keys: n_in_use lowercase or uppercase hex keys that must stay (may
 * be NULL when n_in_use is 0). report may be NULL. FJ_OK also when nothing
 * needed removing; FJ_ENOMEM; FJ_EIO when a directory could not be read or
 * an entry could not be deleted (err, the caller's buffer of errlen bytes,
 * names the first such path and the reason; the report counts what was
 * done). A disabled store prunes nothing. */
fj_status fjc_store_prune(fjc_store *store, uint64_t max_bytes,
                          const char *const *in_use_keys, int n_in_use,
                          fjc_prune_report *report, char *err, size_t errlen);

/* Prunes the store down to the limit it was opened with (none: nothing to
 * do), keeping the keys it has served (fjc_store_in_use). For whoever has
 * just put an entry; a failure is logged as a warning, never returned. */
void fjc_store_prune_to_limit(fjc_store *store);

/* Parses a byte count: digits with an optional K, M, G or T suffix (powers
 * of 1024; "KB", "MiB" and lowercase are accepted too). Returns 0, or -1 for
 * anything else (empty, negative, overflow, junk after the number). */
int fjc_parse_size(const char *text, uint64_t *out);

#endif /* FJC_PRUNE_H */
