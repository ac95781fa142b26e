/*
 * tests/unit/other_user.h: running part of a test as another user. Root
 * ignores permission bits, so a test of a read-only cache (a 0555 folder)
 * that runs as root must do its reads and removals as someone else: user
 * nobody (65534). As any other user the permission bits hold already.
 * Include after <cmocka.h>.
 */
#ifndef FJ_TESTS_OTHER_USER_H
#define FJ_TESTS_OTHER_USER_H

#include <grp.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* In a child process: becomes user nobody when root; 0, or -1. */
static inline int fjt_drop_root(void) {
  if (geteuid() != 0)
    return 0;
  return setgroups(0, NULL) == 0 && setgid(65534) == 0 && setuid(65534) == 0
             ? 0
             : -1;
}

/* Runs fn(arg) in a child process as another user (see above) and returns
 * its exit status (99 when the user could not be changed). */
static inline int fjt_as_other_user(int (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    _exit(fjt_drop_root() == 0 ? fn(arg) : 99);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

#endif /* FJ_TESTS_OTHER_USER_H */
