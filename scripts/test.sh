#!/usr/bin/env bash
# Builds flexjit and runs every test (GPU tests skip without a driver), then
# builds it again with AddressSanitizer and UBSan (${SANITIZE_BUILD_DIR:-build-asan})
# and runs the suite a second time there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
asan=${SANITIZE_BUILD_DIR:-build-asan}
cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLEXJIT_SANITIZE=ON >/dev/null
cmake --build "$asan" -j "$(nproc)"
ctest --test-dir "$asan" --output-on-failure -j "$(nproc)"
