#!/usr/bin/env bash
# Builds flexjit and runs every test (GPU tests skip without a driver); installs
# the Python package with pip into a virtual environment (${PY_VENV:-build-py/venv})
# and runs its tests (those needing PyTorch or a GPU skip without them); then
# builds the library again with AddressSanitizer and UBSan
# (${SANITIZE_BUILD_DIR:-build-asan}) and runs the suite a second time there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
venv=${PY_VENV:-build-py/venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q . pytest
"$venv/bin/python" -m pytest -q python/tests
asan=${SANITIZE_BUILD_DIR:-build-asan}
cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLEXJIT_SANITIZE=ON >/dev/null
cmake --build "$asan" -j "$(nproc)"
ctest --test-dir "$asan" --output-on-failure -j "$(nproc)"
