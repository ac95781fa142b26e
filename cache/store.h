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
 * Source-key aliases: the key holds the NVRTC version, which a process
 * without NVRTC cannot know. So a put also publishes (atomically, like the
 * entry) <root>/<libver>/<arch>/<sa>/<source keyhex>.src, sa being the
 * source key's first two hex digits: 40 bytes, "FJSRC1 " + the entry's key
 * in hex + "\n". fjc_store_get_by_source follows it; the latest put of a
 * source key wins. An alias whose entry is gone (dangling) or whose bytes
 * are not that (corrupt) is a miss, never an error.
 *
 * Failures to write (read-only or full disk, permissions) return FJ_ECACHE,
 * which callers treat as "keep the kernel in memory only"; the first one per
 * store is logged as a warning, later ones at debug level.
 *
 * A store is not thread-safe (it belongs to one context). Locks are taken
 * with flock, so they work between processes and between threads that use
 * separate stores.
 *
 * The store reads no environment variable and never evicts: the caller
 * gives the root and the size limit (fjc_store_default_root resolves the
 * usual defaults from values the caller read), and whoever puts decides
 * when to prune (cache/prune.h, fjc_store_prune_to_limit). Every hit
 * touches the entry's mtime, its LRU age, and marks the key in use (this
 * process holds it: prune keeps it).
 *
 * Test builds only (cache/store.c compiled with FJC_FAULT_INJECTION):
 * FLEXJIT_CACHE_FAULT, read when the store is opened, injects write
 * failures: "enospc" (the temp file is partly written, then ENOSPC),
 * "eacces" or "erofs" (creating files fails with that errno; locks are then
 * unavailable too), "crash" (the process exits halfway through writing the
 * temp file, as a crash would). The shipped library has no such hook.
 */
#ifndef FJC_STORE_H
#define FJC_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "cache/key.h"
#include "flexjit.h"

typedef struct fjc_store fjc_store;

/* The usual root, resolved from values the caller read (each may be NULL
 * for unset): cache_dir_env ($FLEXJIT_CACHE_DIR) if set, "" included (a
 * disabled store); else <xdg_cache_home>/flexjit when that is absolute;
 * else <home>/.cache/flexjit; else "" with *why (may be NULL) saying that
 * none is set. Returns cache_dir_env or buf (n bytes); *why is NULL unless
 * the root is "" for want of a home. */
const char *fjc_store_default_root(const char *cache_dir_env,
                                   const char *xdg_cache_home,
                                   const char *home, char *buf, size_t n,
                                   const char **why);

/* Opens a store; touches no file (directories are created on first put).
 * root: a directory, or "" for a disabled store (gets miss, puts and locks
 * do nothing); NULL is FJ_EINVAL. max_bytes: the size limit that
 * fjc_store_prune_to_limit keeps (0: none). log may be NULL. Fails only with
 * FJ_ENOMEM or FJ_EINVAL. */
fj_status fjc_store_open(const char *root, uint64_t max_bytes, fj_log_fn log,
                         void *log_user, fjc_store **out, char *err,
                         size_t errlen);
/* NULL is a no-op. */
void fjc_store_close(fjc_store *store);

/* 1 when entries are read from and written to disk. */
int fjc_store_enabled(const fjc_store *store);
/* The root directory ("" when disabled); borrowed, lives with the store. */
const char *fjc_store_root(const fjc_store *store);

/* 1 when arch is a plain target name, [A-Za-z0-9_]{1,31}, safe as a path
 * component. */
int fjc_arch_is_valid(const char *arch);

/* The size limit given at open, in bytes (0: none). */
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

/* Checks one open entry file completely, reading it from offset 0: header,
 * length, key and checksum. key may be NULL to accept the key the header
 * names (its bytes then land in *key_out if not NULL). Returns NULL when
 * sound, else a static string saying why not. *foreign is set to 1 when the
 * file is sound as far as it can tell but written in another entry format
 * version (another flexjit release): not corrupt, just not ours to judge. */
const char *fjc_entry_check_fd(int fd, const fjc_key *key, uint8_t key_out[16],
                               int *foreign);

/* Reads one open entry file from offset 0 with the checks of
 * fjc_entry_check_fd. NULL when sound, with *data (malloc'd, the caller
 * frees) and *size the cubin; else why not, *data NULL. */
const char *fjc_entry_read_fd(int fd, const fjc_key *key, void **data, size_t *size,
                              int *foreign);

/* Reads an open source-key alias file: 0 with *key the entry it names, or
 * -1 when it is not an alias the store writes. */
int fjc_alias_read_fd(int fd, fjc_key *key);

/* Looks up the entry of (arch, key). FJ_OK: *data (malloc'd, the caller
 * frees) and *size hold the cubin, path_out (if not NULL) the file. Otherwise
 * FJ_ENOTFOUND (missing, unreadable or corrupt: never an error), *data NULL,
 * path_out "", err why it missed (the path and the reason). FJ_EINVAL for an
 * arch that is not [A-Za-z0-9_]{1,31}. A hit sets the entry's mtime to now
 * (its LRU age) and marks the key in use; a read-only cache that cannot be
 * touched still hits. */
fj_status fjc_store_get(fjc_store *store, const char *arch, const fjc_key *key,
                        void **data, size_t *size, char *path_out,
                        size_t path_len, char *err, size_t errlen);

/* Looks up the entry that the source key's alias names (see the top of
 * this file): what a process without NVRTC finds by the key of everything
 * but the compiler version. FJ_OK as fjc_store_get, and *key_out (may be
 * NULL; written only on a hit) the entry's full key. FJ_ENOTFOUND for no
 * alias, a corrupt one (logged as a warning), a dangling one, and a bad
 * entry (logged by its own check), err saying which. FJ_EINVAL as
 * fjc_store_get. */
fj_status fjc_store_get_by_source(fjc_store *store, const char *arch,
                                  const fjc_key *source_key, fjc_key *key_out,
                                  void **data, size_t *size, char *path_out,
                                  size_t path_len, char *err, size_t errlen);

/* Publishes the cubin of (arch, key), replacing any entry, then, when
 * meta_json is not NULL, the <keyhex>.json sidecar and, when source_key is
 * not NULL (and not key itself), the source key's alias naming key. FJ_OK:
 * path_out holds the .cubin path ("" for a disabled store). FJ_ECACHE:
 * nothing was published, no temp file is left, err names the path and the
 * reason (also logged, see the top of this file). A sidecar or alias that
 * cannot be written is only logged: the cubin is what matters. Never
 * prunes. */
fj_status fjc_store_put(fjc_store *store, const char *arch, const fjc_key *key,
                        const fjc_key *source_key, const void *data,
                        size_t size, const char *meta_json, char *path_out,
                        size_t path_len, char *err, size_t errlen);

/* Takes the exclusive per-key lock, blocking until it is free, so concurrent
 * compilers of one key compile once: lock, get again, compile and put on a
 * miss, unlock. FJ_OK with *lock_fd = -1 when locking is unavailable
 * (disabled store, read-only root): proceed without it. FJ_EINVAL (err says
 * so) only for a NULL argument or a bad arch. */
fj_status fjc_store_lock(fjc_store *store, const char *arch, const fjc_key *key,
                         int *lock_fd, char *err, size_t errlen);
/* Releases a lock from fjc_store_lock; -1 is a no-op. */
void fjc_store_unlock(int lock_fd);

#endif /* FJC_STORE_H */
