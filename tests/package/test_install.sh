#!/usr/bin/env bash
# tests/package/test_install.sh BUILD_DIR SOURCE_DIR: the shared library and
# the install rules, as a user of an installed flexjit sees them.
#  1. libflexjit.so exports the public API and nothing else: every defined
#     dynamic symbol starts with fj_, and every function the header declares
#     is among them.
#  2. `cmake --install` into a fresh prefix; a consumer project finds it with
#     find_package(flexjit) (flexjit::flexjit, the shared library) and, a
#     second time, with pkg-config; both programs load a spec and print its
#     name.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
so="$build/libflexjit.so"

exported=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort)
stray=$(echo "$exported" | grep -v '^fj_' || true)
if [ -n "$stray" ]; then
  echo "FAIL: libflexjit.so exports symbols outside the fj_ API:"
  echo "$stray" | head -20
  exit 1
fi
declared=$(grep -oE '^[a-z_ ]*[ *](fj_[a-z0-9_]+)\(' "$src/include/flexjit.h" |
           grep -oE 'fj_[a-z0-9_]+\($' | tr -d '(' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$missing" ]; then
  echo "FAIL: declared in flexjit.h but not exported: $missing"
  exit 1
fi
echo "exports: $(echo "$exported" | wc -l) fj_ symbols, nothing else"

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/main.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <flexjit.h>
int main(void) {
  fj_context *ctx;
  fj_spec *spec;
  const char src[] = "return { name = 'installed', mask_mod = causal() }";
  if (fj_context_create(NULL, &ctx) != FJ_OK) return 1;
  if (fj_spec_load_string(ctx, src, strlen(src), "c.lua", &spec) != FJ_OK) {
    fprintf(stderr, "%s\n", fj_context_last_error(ctx));
    return 1;
  }
  printf("%s %s\n", fj_version_string(), fj_spec_name(spec));
  fj_spec_destroy(spec);
  fj_context_destroy(ctx);
  return 0;
}
C
cat >"$tmp/consumer/CMakeLists.txt" <<'C'
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(flexjit 0.1 REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE flexjit::flexjit)
C
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer/build" >/dev/null
out=$(FLEXJIT_CACHE_DIR="$tmp/cache" "$tmp/consumer/build/consumer")
echo "find_package: $out"
[ "$out" = "0.1.0 installed" ] || { echo "FAIL: unexpected output"; exit 1; }
# ldd's output first: `ldd | grep -q` under pipefail fails at random when
# grep exits at its first match and ldd then dies of SIGPIPE.
deps=$(ldd "$tmp/consumer/build/consumer")
if ! grep -q "libflexjit.so" <<<"$deps"; then
  echo "FAIL: flexjit::flexjit did not link the shared library"; exit 1
fi

pc="$tmp/prefix/lib/pkgconfig"
[ -d "$pc" ] || pc=$(dirname "$(find "$tmp/prefix" -name flexjit.pc | head -1)")
flags=$(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs flexjit)
# shellcheck disable=SC2086
gcc "$tmp/consumer/main.c" -o "$tmp/consumer/pc" $flags
libdir=$(PKG_CONFIG_PATH="$pc" pkg-config --variable=libdir flexjit)
out=$(LD_LIBRARY_PATH="$libdir" FLEXJIT_CACHE_DIR="$tmp/cache" "$tmp/consumer/pc")
echo "pkg-config: $out"
[ "$out" = "0.1.0 installed" ] || { echo "FAIL: unexpected output"; exit 1; }
