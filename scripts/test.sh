#!/usr/bin/env bash
# Builds flexjit and runs every test (GPU tests skip without a driver).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
