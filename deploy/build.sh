#!/usr/bin/env bash
# Configures and builds kvferry into ${BUILD_DIR:-build}/ (executables in bin/).
# Extra arguments go to cmake, e.g. deploy/build.sh -DKVF_CUDA=OFF -DKVF_ASAN=ON
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
