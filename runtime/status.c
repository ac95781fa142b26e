/* runtime/status.c: status names and messages, from the one X-macro table. */
#include "flexjit.h"

const char *fj_status_name(fj_status status) {
  switch (status) {
#define FJ_STATUS_NAME_(name, value, msg) \
  case FJ_##name:                         \
    return "FJ_" #name;
    FJ_STATUS_MAP(FJ_STATUS_NAME_)
#undef FJ_STATUS_NAME_
  }
  return "FJ_UNKNOWN";
}

const char *fj_strerror(fj_status status) {
  switch (status) {
#define FJ_STATUS_MSG_(name, value, msg) \
  case FJ_##name:                        \
    return msg;
    FJ_STATUS_MAP(FJ_STATUS_MSG_)
#undef FJ_STATUS_MSG_
  }
  return "unknown status";
}

unsigned fj_version_number(void) { return FJ_VERSION_NUMBER; }

const char *fj_version_string(void) { return FJ_VERSION_STRING; }
