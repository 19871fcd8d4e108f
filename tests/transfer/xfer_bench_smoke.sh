#!/bin/sh
# kvf bench smoke: the KV-shaped pull (verified), the raw GET and their ratio, the host cost
# of starting a pull split into planning and posting.
out=$("$KVF_BIN/kvf" bench --model "$KVF_SOURCE_DIR/tests/data/models/nemotron-nano-9b-v2.config.json" \
      --layout 2p1d --tokens 2048 --iters 2 --verify yes --plan-reps 50 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || exit 1
echo "$out" | grep -q '^ratio kv/raw: [0-9]' || exit 1
echo "$out" | grep -q '^verify: ok' || exit 1
echo "$out" | grep -q '^transports: UCX_TLS=' || exit 1
# the host cost split: planning (a part of the post line's start_pull) and the CPU time of it
post=$(echo "$out" | sed -n 's/^post: [0-9]* descriptors, \([0-9.]*\) us, [0-9.]* us\/desc.*/\1/p')
plan=$(echo "$out" | sed -n "s/^post split: the post line's [0-9.]* us = \([0-9.]*\) us planning + \([0-9.]*\) us posting.*/\1 \2/p")
[ -n "$post" ] && [ -n "$plan" ] || { echo "FAIL: no post or plan line"; exit 1; }
echo "$out" | grep -q '^post cpu: [0-9.]* us, [0-9.]* us/desc' || { echo "FAIL: no post cpu line"; exit 1; }
# planning + posting of the post line's pull add up to its start_pull (0.1 us of rounding),
# and planning took time
echo "$post $plan" | awk '{ d = $2 + $3 - $1; exit !((d < 0.15) && (d > -0.15) && ($2 > 0)) }' ||
    { echo "FAIL: plan ($plan) does not split the post line's ${post} us"; exit 1; }
# --plan-reps: the planner alone, timed; out of range is bad usage naming the flag
echo "$out" | grep -q '^plan alone: [0-9.]* us per plan (decode rank 0, [1-9][0-9]* descriptors, 50 plans' ||
    { echo "FAIL: no plan alone line"; exit 1; }
bad=$("$KVF_BIN/kvf" bench --plan-reps -1 2>&1)
[ $? -eq 2 ] || { echo "FAIL: --plan-reps -1 did not exit 2: $bad"; exit 1; }
echo "$bad" | grep -q -- '--plan-reps -1 is outside 0..1000000' ||
    { echo "FAIL: --plan-reps -1 refusal does not name it: $bad"; exit 1; }
