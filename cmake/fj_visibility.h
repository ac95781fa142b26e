/*
 * cmake/fj_visibility.h: included ahead of every library source
 * (-include). The library is compiled with -fvisibility=hidden; declaring the
 * public header under `visibility push(default)` first gives the fj_
 * functions default visibility, so libflexjit.so exports them and nothing
 * else, while the fjl_/fjg_/fjr_/fjc_ internals stay hidden (and are called
 * directly, not through the PLT).
 */
#pragma GCC visibility push(default)
#include "flexjit.h"
#pragma GCC visibility pop
