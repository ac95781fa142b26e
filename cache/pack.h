/*
 * cache/pack.h: .fjpack files, many cubins plus an index in one file, for
 * shipping precompiled kernels to machines without NVRTC.
 *
 * Layout (all integers little-endian):
 *
 *   header, 64 bytes
 *     0  magic "FJPACK01"            32  u64 index size (count * 256)
 *     8  u32 format version (1)      40  u64 XXH3-64 of the index
 *    12  u32 header size (64)        48  u64 file size
 *    16  u64 entry count             56  u64 XXH3-64 of bytes 0..55
 *    24  u64 index offset
 *   blobs: the cubins, each starting at a multiple of 64
 *   index: count records of 256 bytes, after the last blob
 *     0  source key (16): the key without the NVRTC version
 *    16  full key (16): the store's key, NVRTC version included
 *    32  arch (32, NUL-padded)       208  u64 blob offset
 *    64  nvrtc version (16)          216  u64 blob size
 *    80  readable name (128)         224  u64 XXH3-64 of the blob
 *                                    232  reserved (24, zero)
 *
 * Both keys are kept so that a context with NVRTC looks a kernel up exactly
 * (full key), while one without NVRTC, which cannot know which NVRTC built
 * the pack, matches by source key and arch: the cubin is valid whichever
 * NVRTC version produced it, as long as the source and target match.
 *
 * Integrity: the header and the index are read and checked when a pack is
 * opened (magic, version, checksums, every blob inside the blob area): a
 * pack that fails is an error at mount time. Blobs are read (pread, no
 * mapping) and checked on lookup: a corrupt blob is a miss with a warning,
 * never loaded. A file changed after it was opened (overwritten in place,
 * truncated) gives misses with a warning, never a signal; one replaced by
 * rename keeps serving the old file's contents.
 */
#ifndef FJC_PACK_H
#define FJC_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "cache/key.h"
#include "flexjit.h"

#define FJC_PACK_NAME_MAX 128
#define FJC_PACK_NVRTC_MAX 16
#define FJC_PACK_ARCH_MAX 32

/* One entry as written or listed. */
typedef struct fjc_pack_entry {
  fjc_key source_key;
  fjc_key full_key;
  char arch[FJC_PACK_ARCH_MAX];
  char nvrtc[FJC_PACK_NVRTC_MAX];
  char name[FJC_PACK_NAME_MAX];
  const void *data; /* the cubin (writing; NULL when listed) */
  size_t size;
  uint64_t offset; /* where the cubin starts in the file (listing only) */
} fjc_pack_entry;

/* ---- writing ---------------------------------------------------------- */

typedef struct fjc_pack_writer fjc_pack_writer;

/* Starts a pack that will be published at path by fjc_pack_writer_finish
 * (temp file in the same directory + fsync + rename, so a reader never sees
 * half a pack and a crash leaves at most a ".fjpack.tmp.*" file). FJ_EIO when
 * the temp file cannot be created (err says why), FJ_ENOMEM. */
fj_status fjc_pack_writer_open(const char *path, fjc_pack_writer **out,
                               char *err, size_t errlen);

/* Appends one entry (data is copied to the file at once). An entry whose
 * (full key, arch) is already in the pack is skipped. FJ_EINVAL for an empty
 * blob, a bad arch, or a name or NVRTC version too long for the index;
 * FJ_EIO for a write failure; the writer stays usable only after FJ_OK or
 * FJ_EINVAL. */
fj_status fjc_pack_writer_add(fjc_pack_writer *w, const fjc_pack_entry *entry,
                              char *err, size_t errlen);

/* Number of entries added so far. */
int fjc_pack_writer_count(const fjc_pack_writer *w);

/* Writes the index and header, syncs and publishes the pack, and frees the
 * writer on every path (on failure nothing is published and the temp file
 * is removed). */
fj_status fjc_pack_writer_finish(fjc_pack_writer *w, char *err,
                                 size_t errlen);

/* Discards an unfinished pack and frees the writer; NULL is a no-op. */
void fjc_pack_writer_abort(fjc_pack_writer *w);

/* ---- reading ---------------------------------------------------------- */

typedef struct fjc_pack fjc_pack;

/* Opens a pack read-only, reads and validates its header and index (kept
 * in memory; the file stays open for the blobs). FJ_EIO (cannot open),
 * FJ_ECACHE (not a pack, or a corrupt one: err names the file and the
 * problem), FJ_ENOMEM. The pack holds no mutable state after this: lookups
 * may run from several threads at once. */
fj_status fjc_pack_open(const char *path, fjc_pack **out, char *err,
                        size_t errlen);
/* Closes the file; names the pack handed out die. NULL is a no-op. */
void fjc_pack_close(fjc_pack *pack);

/* Where corrupt-blob warnings go (default: nowhere). */
void fjc_pack_set_log(fjc_pack *pack, fj_log_fn log, void *log_user);

/* The file it was opened from (borrowed, lives with the pack). */
const char *fjc_pack_path(const fjc_pack *pack);
int fjc_pack_count(const fjc_pack *pack);
/* Entry i (0 <= i < count) as the index describes it (data NULL; blob not
 * read). FJ_EINVAL for a bad index. */
fj_status fjc_pack_entry_at(const fjc_pack *pack, int i, fjc_pack_entry *out);
/* Reads and checks the blob of entry i. Returns NULL when sound, else why
 * not (a static string). */
const char *fjc_pack_check_blob(const fjc_pack *pack, int i);

/* Finds the cubin for arch: with full_key, the entry with exactly that key;
 * with full_key NULL (no NVRTC), any entry with source_key (the one built by
 * the highest NVRTC version when several are). The blob is read and
 * verified; a corrupt or unreadable one is logged and skipped. FJ_OK: *data
 * (malloc'd, the caller frees) and *size hold the cubin, *name (may be
 * NULL) the entry's readable name (borrowed; valid until fjc_pack_close).
 * FJ_ENOTFOUND otherwise. */
fj_status fjc_pack_find(const fjc_pack *pack, const char *arch,
                        const fjc_key *full_key, const fjc_key *source_key,
                        void **data, size_t *size, const char **name);

#endif /* FJC_PACK_H */
