#!/usr/bin/env bash
# The operator-facing wording of issue 46 item 6: kvf bench runs from any directory (its
# default model found beside the build), its "rdma operations posted" line says what it
# counts and its post line's split is a line of its own; a --prompt over 255 bytes points at
# --prompt-file; --block-size says what it means: the alignment unit, in the daemons and in
# kvf generate alike (--exact-block-size gives the size; tests/tools/test_engine_opts.sh).
# Handshake refusals naming prefill= and decode=: tests/tools/test_matrix_cells.py and
# tests/transfer/wire/test_xfer_handshake.c.
set -euo pipefail
KVF="${KVF_BIN:?}/kvf"
SRC="${KVF_SOURCE_DIR:?}"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$(cd / && env -u KVF_SHARED_MODELS "$KVF" bench --tokens 256 --layout 2p1d 2>&1) ||
    fail "kvf bench from / failed: $out"
grep -q '^bench: PASS' <<<"$out" || fail "kvf bench from /: $out"
echo "ok: kvf bench runs from / with its default model"
grep -qE '^rdma operations posted: [0-9]+ \(every GET of this run: each pull.s descriptors, warm-up and timed pulls, and the raw contiguous GETs; the transfer line counts one pull\)$' <<<"$out" ||
    fail "rdma operations line unexplained: $(grep rdma <<<"$out")"
grep -qE "^post split: the post line's [0-9.]+ us = [0-9.]+ us planning \+ [0-9.]+ us posting" <<<"$out" ||
    fail "no post split line"
grep -qE '^plan: [0-9.]+ us per decode rank \([^)]*\)$' <<<"$out" || fail "plan line carries two times"
echo "ok: the rdma operations and plan/post lines say what they count"

long=$(printf 'x%.0s' $(seq 300))
if err=$("$KVF" generate --model "$SRC/models-trained/tiny-hybrid" --prompt "$long" 2>&1); then
    fail "a 300-byte --prompt was accepted"
fi
grep -q -- "expected at most 255 bytes; --prompt-file takes a longer value from a file" <<<"$err" ||
    fail "no --prompt-file hint: $err"
echo "ok: a long --prompt points at --prompt-file"

# (the help captured first: grep -q stops reading at its match, and under pipefail the
# writer's SIGPIPE would fail the pipeline when the help is long)
help=$("$KVF_BIN/kvf-prefill" --help)
grep -q -- "--block-size .*user block size N, tokens: the alignment unit" <<<"$help" ||
    fail "the daemon's --block-size help"
help=$("$KVF" generate --help)
grep -q -- "--block-size .*user block size N, tokens: the alignment unit" <<<"$help" ||
    fail "kvf generate's --block-size help"
grep -q -- "--exact-block-size .*this logical block size, tokens" <<<"$help" ||
    fail "kvf generate's --exact-block-size help"
echo "ok: --block-size is the alignment unit (daemons and kvf generate), --exact-block-size the size"
echo "PASS test_small_fixes"
