/*
 * cache/fileio.c: whole reads and writes, directory sync (see fileio.h).
 */
#include "cache/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int fjc_write_all(int fd, const void *buf, size_t len) {
  const unsigned char *p = buf;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return -1;
    if (w == 0) {
      errno = ENOSPC;
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

int fjc_pread_all(int fd, void *buf, size_t len, uint64_t offset) {
  unsigned char *p = buf;
  while (len > 0) {
    ssize_t r = pread(fd, p, len, (off_t)offset);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return -1;
    if (r == 0)
      return FJC_SHORT_READ;
    p += r;
    len -= (size_t)r;
    offset += (uint64_t)r;
  }
  return 0;
}

void fjc_sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}
