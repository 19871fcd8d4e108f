#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: installs what is
# missing, builds from scratch with -Werror, runs every ctest case, then
# rebuilds with ASan+UBSan and reruns the unit tests under them.
# KVF_TEST_SANITIZERS=0 skips the sanitizer pass.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash deploy/install-deps.sh
python3 -m pip --version >/dev/null 2>&1 || true

build=build-test
rm -rf "$build"
BUILD_DIR="$root/$build" bash deploy/build.sh -DKVF_WERROR=ON
ctest --test-dir "$build" --output-on-failure --timeout 600 -j2 --no-tests=error

if [ "${KVF_TEST_SANITIZERS:-1}" != "0" ]; then
    san=build-asan
    rm -rf "$san"
    BUILD_DIR="$root/$san" CMAKE_BUILD_TYPE=Debug bash deploy/build.sh -DKVF_CUDA=OFF \
        -DKVF_ASAN=ON -DKVF_UBSAN=ON -DKVF_TEST_TIMEOUT_MULTIPLIER=4
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ctest --test-dir "$san" --output-on-failure -j2 -L unit --no-tests=error
fi
