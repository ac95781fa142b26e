#!/usr/bin/env bash
# Quick start: install what is missing, build, and run the demo: with a GPU it
# runs the example specs, checks them against the float64 reference and times
# them; without one it compiles and caches their kernels and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec "${BUILD_DIR:-build}/flexjit" demo
