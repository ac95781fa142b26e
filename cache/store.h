/*
 * cache/store.h: the on-disk cubin store.
 *
 * Layout: <root>/<libver>/<arch>/<aa>/<keyhex>.cubin, where libver is
 * FJ_VERSION_STRING and aa the key's first two hex digits, next to
 * <keyhex>.json (metadata written by the caller, for people) and
 * <keyhex>.lock (the per-key compile lock).
 *
 * An entry file is a 48-byte header followed by the cubin:
 *   0  magic "FJCUBIN1"          16 u64 payload length
 *   8  u32 format version (1)     24 u64 XXH3-64 of the payload
 *  12  u32 header size (48)       32 16-byte key
 * all little-endian. Entries are published by temp file + fsync + rename, so
 * readers never see a partial entry; a bad entry (truncated, wrong magic,
 * version, length, key or checksum) is reported through the log and treated
 * as a miss, never loaded.
 *
 * Failures to write (read-only or full disk, permissions) return FJ_ECACHE,
 * which callers treat as "keep the kernel in memory only"; the first one per
 * store is logged as a warning, later ones at debug level.
 *
 * A store is not thread-safe (it belongs to one context). Locks are taken
 * with flock, so they work between processes and between threads that use
 * separate stores.
 *
 * Size limit: FLEXJIT_CACHE_MAX_BYTES (read at open; "500M", "2G", plain
 * bytes) or fjc_store_set_max_bytes (which wins). With a limit set, every
 * successful put prunes the store back under it (cache/prune.h), evicting
 * the least recently used entries first and never a key this store has
 * served (got or put) during its lifetime: those are the kernels this
 * process holds. Every hit touches the entry's mtime, which is its LRU age.
 *
 * Testing hook: FLEXJIT_CACHE_FAULT, read when the store is opened, injects
 * write failures: "enospc" (the temp file is partly written, then ENOSPC),
 * "eacces" or "erofs" (creating files fails with that errno; locks are then
 * unavailable too), "crash" (the process exits halfway through writing the
 * temp file, as a crash would).
 */
#ifndef FJC_STORE_H
#define FJC_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "cache/key.h"
#include "flexjit.h"

typedef struct fjc_store fjc_store;

/* Opens a store; touches no file (directories are created on first put).
 * root: a directory; NULL picks $FLEXJIT_CACHE_DIR, else
 * $XDG_CACHE_HOME/flexjit (if absolute), else $HOME/.cache/flexjit; "" (also
 * FLEXJIT_CACHE_DIR="") gives a disabled store: gets miss, puts and locks do
 * nothing. log may be NULL. Fails only with FJ_ENOMEM or FJ_EINVAL. */
fj_status fjc_store_open(const char *root, fj_log_fn log, void *log_user,
                         fjc_store **out, char *err, size_t errlen);
/* NULL is a no-op. */
void fjc_store_close(fjc_store *store);

/* 1 when entries are read from and written to disk. */
int fjc_store_enabled(const fjc_store *store);
/* The root directory ("" when disabled); borrowed, lives with the store. */
const char *fjc_store_root(const fjc_store *store);
/* Why the last failing call failed ("" if none); borrowed, valid until the
 * next call on store. */
const char *fjc_store_last_error(const fjc_store *store);

/* 1 when arch is a plain target name, [A-Za-z0-9_]{1,31}, safe as a path
 * component. */
int fjc_arch_is_valid(const char *arch);

/* The size limit in bytes (0: none); see the top of this file. */
void fjc_store_set_max_bytes(fjc_store *store, uint64_t max_bytes);
uint64_t fjc_store_max_bytes(const fjc_store *store);

/* Keys this store has served (got or put), lowercase hex: what prune must
 * keep. Borrowed; valid until the next get or put on store. */
const char *const *fjc_store_in_use(const fjc_store *store, int *n);
/* Adds a key to that set (e.g. one the caller loaded by other means). */
fj_status fjc_store_mark_in_use(fjc_store *store, const fjc_key *key);

/* Logs through the store's log callback (used by the cache/ modules that
 * work on a store). */
void fjc_store_log(const fjc_store *store, fj_log_level level, const char *fmt,
                   ...) __attribute__((format(printf, 3, 4)));

/* Sets the message fjc_store_last_error returns (for the cache/ modules that
 * work on a store). */
void fjc_store_set_error(fjc_store *store, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Checks one entry file completely: header, length, key and checksum. key
 * may be NULL to accept the key the header names (its bytes then land in
 * *key_out if not NULL). Returns NULL when sound, else a static string
 * saying why not. *foreign is set to 1 when the file is sound as far as it
 * can tell but written in another entry format version (another flexjit
 * release): not corrupt, just not ours to judge. */
const char *fjc_entry_check_file(const char *path, const fjc_key *key,
                                 uint8_t key_out[16], int *foreign);

/* Looks up the entry of (arch, key). FJ_OK: *data (malloc'd, the caller
 * frees) and *size hold the cubin, path_out (if not NULL) the file. Otherwise
 * FJ_ENOTFOUND (missing, unreadable or corrupt: never an error), *data NULL,
 * path_out "". FJ_EINVAL for an arch that is not [A-Za-z0-9_]{1,31}.
 * A hit sets the entry's mtime to now (its LRU age) and marks the key in
 * use; a read-only cache that cannot be touched still hits. */
fj_status fjc_store_get(fjc_store *store, const char *arch, const fjc_key *key,
                        void **data, size_t *size, char *path_out,
                        size_t path_len);

/* Publishes the cubin of (arch, key), replacing any entry, and, when
 * meta_json is not NULL, the <keyhex>.json sidecar. FJ_OK: path_out holds
 * the .cubin path ("" for a disabled store). FJ_ECACHE: nothing was
 * published, no temp file is left, fjc_store_last_error says why. A sidecar
 * that cannot be written is only logged: the cubin is what matters. With a
 * size limit set, a successful put then prunes (failures there are only
 * logged). */
fj_status fjc_store_put(fjc_store *store, const char *arch, const fjc_key *key,
                        const void *data, size_t size, const char *meta_json,
                        char *path_out, size_t path_len);

/* Takes the exclusive per-key lock, blocking until it is free, so concurrent
 * compilers of one key compile once: lock, get again, compile and put on a
 * miss, unlock. FJ_OK with *lock_fd = -1 when locking is unavailable
 * (disabled store, read-only root): proceed without it. */
fj_status fjc_store_lock(fjc_store *store, const char *arch,
                         const fjc_key *key, int *lock_fd);
/* Releases a lock from fjc_store_lock; -1 is a no-op. */
void fjc_store_unlock(int lock_fd);

#endif /* FJC_STORE_H */
