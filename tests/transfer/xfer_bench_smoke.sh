#!/bin/sh
# kvf bench smoke: the KV-shaped pull (verified), the raw GET and their ratio.
out=$("$KVF_BIN/kvf" bench --model "$KVF_SOURCE_DIR/tests/data/models/nemotron-nano-9b-v2.config.json" \
      --layout 2p1d --tokens 2048 --iters 2 --verify yes 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || exit 1
echo "$out" | grep -q '^ratio kv/raw: [0-9]' || exit 1
echo "$out" | grep -q '^verify: ok' || exit 1
echo "$out" | grep -q '^transports: UCX_TLS=' || exit 1
