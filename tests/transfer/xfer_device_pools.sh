#!/bin/sh
# kvf xfer-test / kvf bench --device cuda[:N]: both sides' pools in GPU memory.
# Without a GPU (this project's CI and dev machines) both fail fast, before the
# prefill child is forked or UCX touched, naming the device and why; a malformed
# --device is bad usage (exit 2) naming the value. On a machine with a GPU the
# 1p1d pull runs and must pass, or be refused by a UCX built without CUDA by name
# (tests/gpu/run.sh is the GPU machine's full check).
kvf="$KVF_BIN/kvf"
model="$KVF_SOURCE_DIR/tests/data/models/tiny-hybrid.config.json"
fail() { echo "FAIL: $*"; exit 1; }

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    out=$("$kvf" xfer-test --model "$model" --layout 1p1d --device cuda 2>&1)
    rc=$?
    echo "$out"
    if [ $rc -ne 0 ]; then
        echo "$out" | grep -q 'this UCX cannot register it\|cannot reach cuda memory' ||
            fail "xfer-test --device cuda on a GPU machine exited $rc"
        echo "a GPU, and a UCX without CUDA: refused by name"
        exit 0
    fi
    echo "$out" | grep -q '^verify: ok' || fail "no verify line"
    exit 0
fi

for cmd in "xfer-test --layout 4p2d --device cuda" "bench --layout 2p1d --tokens 256 --iters 1 --device cuda:1"; do
    start=$(date +%s)
    # shellcheck disable=SC2086
    out=$("$kvf" $cmd --model "$model" 2>&1)
    rc=$?
    took=$(($(date +%s) - start))
    echo "kvf $cmd: exit $rc in ${took}s"
    echo "$out"
    [ $rc -eq 1 ] || fail "kvf $cmd exited $rc, not 1"
    echo "$out" | grep -q -- "--device cuda[:1]*: no usable CUDA device here: " ||
        fail "kvf $cmd did not say why"
    # with CUDA built in, the CUDA call and its error string are on that line
    if echo "$out" | grep -q "CUDA found no such device"; then
        echo "$out" | grep -q "no such device (no GPU, no driver, or ordinal past the last one) (cuda[A-Za-z]*[(:]" ||
            fail "kvf $cmd did not name the CUDA error"
    fi
    # refused before the prefill child or any transfer existed
    echo "$out" | grep -q 'rdma operations posted\|handshake' && fail "kvf $cmd went on"
    [ $took -le 15 ] || fail "kvf $cmd took ${took}s to refuse"
done

for bad in cuda:x cuda: gpu cuda:1024; do
    out=$("$kvf" xfer-test --model "$model" --device "$bad" 2>&1)
    rc=$?
    [ $rc -eq 2 ] || fail "--device $bad exited $rc, not 2 (bad usage)"
    echo "$out" | grep -q "not '$bad'" || fail "--device $bad: the value is not named: $out"
done
echo "PASS: without a GPU --device cuda fails fast, bad values are bad usage"
