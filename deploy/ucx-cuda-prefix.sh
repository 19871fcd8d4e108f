#!/usr/bin/env bash
# Prints the install prefix of a UCX that reaches CUDA memory (the folder holding lib/ and
# include/ of the libucx-cu13 wheel), or exits 1 when there is none. Order: $KVF_UCX_CUDA_PREFIX,
# then deploy/install-deps.sh's folder, then the libucx package of this Python.
set -euo pipefail
if [ -n "${KVF_UCX_CUDA_PREFIX:-}" ] && [ -f "$KVF_UCX_CUDA_PREFIX/lib/pkgconfig/ucx.pc" ]; then
    echo "$KVF_UCX_CUDA_PREFIX"
    exit 0
fi
# deploy/install-deps.sh's pip --target folder (CMakeLists.txt's KVF_UCX_WHEEL_DIR)
d="${KVF_UCX_WHEEL_DIR:-/opt/kvferry/ucx-cu13}/libucx"
if [ -f "$d/lib/pkgconfig/ucx.pc" ]; then
    echo "$d"
    exit 0
fi
d=$(python3 -c 'import os, libucx; print(os.path.dirname(libucx.__file__))' 2>/dev/null) || exit 1
[ -f "$d/lib/pkgconfig/ucx.pc" ] || exit 1
echo "$d"
