/*
 * cache/fileio.h: the file operations the cache/ modules share: whole reads
 * and writes that retry short counts and EINTR, and syncing a directory
 * after a rename into it. The bottom layer of cache/: it uses no other
 * cache/ module.
 */
#ifndef FJC_FILEIO_H
#define FJC_FILEIO_H

#include <stddef.h>
#include <stdint.h>

/* Writes all len bytes at the descriptor's position. 0, or -1 with errno
 * set (ENOSPC when the device takes no more). */
int fjc_write_all(int fd, const void *buf, size_t len);

/* Reads exactly len bytes at offset. 0; FJC_SHORT_READ when the file ends
 * first (it is shorter than expected: truncated); -1 with errno set. */
#define FJC_SHORT_READ 1
int fjc_pread_all(int fd, void *buf, size_t len, uint64_t offset);

/* fsyncs a directory so a rename into it is durable; best effort (a crash
 * only costs a recompile). */
void fjc_sync_dir(const char *dir);

#endif /* FJC_FILEIO_H */
