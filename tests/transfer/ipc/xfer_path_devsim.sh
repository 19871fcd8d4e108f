#!/bin/sh
# The same-node path on simulated GPUs (kvf-devsim, DEVSIM_IPC=1: shareable device memory,
# IPC handles, gathers run as a stream would): kvf bench --device cuda:0 with --path auto
# takes CUDA IPC on one node, at equal (1p1d) and unequal TP (2p1d, 1p2d; 4p2d on the 9B
# geometry) and with
# P != D block sizes, every byte verified, no GET posted for the pull, no host pointer given
# to a device op; --path ucx on the same pools stays UCX; a handle that does not open (the
# gathers' IPC off) falls back to UCX under auto and is refused by name under --path ipc.
#   xfer_path_devsim.sh <dir of kvf-devsim>
bin=$1
kvf="$bin/kvf-devsim"
nano="$KVF_SOURCE_DIR/tests/data/models/nemotron-nano-9b-v2.config.json"
tiny="$KVF_SOURCE_DIR/tests/data/models/tiny-hybrid.config.json"
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$kvf" ] || fail "no $kvf"
# decode (kvf bench's parent process) opens its prefill child's memfd through /proc, which a
# ptrace scope of 2 or more forbids even to a parent
scope=$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo 0)
[ "$scope" -lt 2 ] || { echo "skipped: kernel.yama.ptrace_scope $scope forbids /proc/PID/fd"; exit 77; }

# one bench: model, layout, path, extra flags; prints its output, exit code of kvf
bench() {
    m=$1 lay=$2 p=$3
    shift 3
    DEVSIM_IPC=${DEVSIM_IPC-1} DEVSIM_GPUS=4 "$kvf" bench --model "$m" --layout "$lay" \
        --tokens 2048 --iters 2 --device cuda:0 --path "$p" --copy-limit no --verify yes "$@" 2>&1
}

for spec in "$tiny 1p1d" "$tiny 2p1d" "$tiny 1p2d" "$nano 4p2d"; do
    set -- $spec
    out=$(bench "$1" "$2" auto) || fail "$2 --path auto exited $?: $out"
    echo "$out" | grep -q '^path: cuda-ipc (same node, one gather of [0-9]* ranges)$' ||
        fail "$2 --path auto did not take cuda-ipc: $(echo "$out" | grep '^path\|error')"
    echo "$out" | grep -q '^verify: ok' || fail "$2 not verified: $out"
    echo "$out" | grep -q 'host_ptr_errors 0 ' || fail "$2: a host pointer reached a device op"
    # the raw contiguous GETs of kvf bench (1 per prefill rank read and pull) are its own
    echo "$out" | grep '^post: [0-9]* descriptors, [0-9.]* us, [0-9.]* us/desc' >/dev/null ||
        fail "$2: no post line"
    echo "ok $2 auto: $(echo "$out" | grep '^gather:')"
done

out=$(bench "$tiny" 2p1d auto --prefill-block-size 160 --decode-block-size 80) ||
    fail "2p1d 160:80 exited $?: $out"
echo "$out" | grep -q '^path: cuda-ipc' || fail "2p1d 160:80 not cuda-ipc: $out"
echo "$out" | grep -q '^verify: ok' || fail "2p1d 160:80 not verified: $out"

out=$(bench "$tiny" 2p1d ucx) || fail "2p1d --path ucx exited $?: $out"
echo "$out" | grep -q '^path: ucx (.*path ucx chosen by configuration)$' ||
    fail "--path ucx on CUDA pools did not stay ucx: $(echo "$out" | grep '^path')"
echo "$out" | grep -q '^verify: ok' || fail "--path ucx not verified: $out"

# DEVSIM_IPC unset: the device layer shares nothing (as a CUDA without IPC): auto falls back
out=$(DEVSIM_IPC= bench "$tiny" 1p1d auto) || fail "auto without IPC exited $?: $out"
echo "$out" | grep -q '^path: ucx' || fail "auto without IPC: $(echo "$out" | grep '^path')"
echo "$out" | grep -q '^verify: ok' || fail "auto without IPC not verified: $out"
out=$(DEVSIM_IPC= bench "$tiny" 1p1d ipc)
[ $? -ne 0 ] || fail "--path ipc without IPC succeeded: $out"
echo "$out" | grep -q 'path cuda-ipc is not possible' ||
    fail "--path ipc without IPC not refused by name: $(echo "$out" | grep -i error | head -3)"
echo "PASS: --path auto takes cuda-ipc on one node (1p1d, 2p1d, 1p2d, 4p2d, 160:80), bytes verified"
