#!/bin/sh
# kvf xfer-test / kvf bench --path on host pools (this CI has no GPU): the path line names
# UCX and why (host memory, or the flag), every byte still verified; --path ipc without
# --device cuda and an unknown --path are bad usage (exit 2) naming the value. On a GPU the
# same-node rows are in tests/gpu (kvf bench --device cuda:0 --path ipc).
kvf="$KVF_BIN/kvf"
model="$KVF_SOURCE_DIR/tests/data/models/tiny-hybrid.config.json"
fail() { echo "FAIL: $*"; exit 1; }

out=$("$kvf" xfer-test --model "$model" --layout 2p1d 2>&1) || fail "xfer-test exited $?: $out"
echo "$out" | grep -q '^path: ucx (the decode pool is cpu memory (CUDA IPC maps device memory only))$' ||
    fail "no ucx path line naming host memory: $out"
echo "$out" | grep -q '^verify: ok' || fail "not verified: $out"
echo "$out" | grep -q '^rdma operations posted: [1-9]' || fail "no GET posted: $out"

out=$("$kvf" bench --model "$model" --layout 1p2d --tokens 256 --iters 1 --verify yes \
      --path ucx 2>&1) || fail "bench --path ucx exited $?: $out"
echo "$out" | grep -q '^path: ucx (UCX_TLS=.*; path ucx chosen by configuration)$' ||
    fail "no ucx path line naming the flag: $out"
echo "$out" | grep -q '^verify: ok' || fail "bench not verified: $out"

out=$("$kvf" xfer-test --model "$model" --path ipc 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "--path ipc on host pools exited $rc, not 2: $out"
echo "$out" | grep -q -- "--path ipc needs --device cuda\[:N\], not 'cpu'" ||
    fail "--path ipc refusal does not say why: $out"
echo "$out" | grep -q 'handshake\|rdma operations' && fail "--path ipc went on: $out"

out=$("$kvf" bench --model "$model" --path rdma 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "--path rdma exited $rc, not 2: $out"
echo "$out" | grep -q -- "--path must be auto, ucx or ipc, not 'rdma'" ||
    fail "--path rdma not named: $out"
echo "PASS: path lines name UCX and why; --path ipc on host pools and --path rdma refused"
