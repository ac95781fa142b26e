#!/usr/bin/env bash
# Installs the Debian packages flexjit builds with, if any is missing (and
# python3-venv where python3 cannot make a virtual environment).
# The CUDA toolkit (cuda.h, nvrtc.h, libnvrtc) is expected under
# /usr/local/cuda or $CUDA_HOME.
set -euo pipefail
pkgs=(cmake gcc g++ make pkg-config liblua5.4-dev libxxhash-dev libcmocka-dev libdlpack-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The Python package is installed into a virtual environment (scripts/test.sh).
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/nvrtc.h" ] || [ ! -f "$cuda/include/cuda.h" ]; then
  echo "error: the CUDA toolkit was not found under $cuda (set CUDA_HOME)" >&2
  exit 1
fi
