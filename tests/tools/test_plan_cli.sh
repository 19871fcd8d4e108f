#!/usr/bin/env bash
# kvf plan as an operator runs it: the per-rank mismatch story on
# Nemotron-3-Nano, TP-stable agreement, and one-line errors for bad input.
set -euo pipefail
KVF="${KVF_BIN:?}/kvf"
M="${KVF_SOURCE_DIR:?}/tests/data/models"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

nano="$M/nemotron-3-nano-30b-a3b.config.json"
common=(--model "$nano" --kv-dtype fp8 --conv-dtype bf16 --ssm-dtype fp32 --block-size 32
        --kernel-block-sizes 'MultipleOf(16)' --layouts 1p2d,2p1d,4p2d,1p4d,4p1d,2p4d --json)

"$KVF" plan "${common[@]}" --align per-rank > "$tmp/per_rank.json" || true
"$KVF" plan "${common[@]}" --align tp-stable > "$tmp/stable.json"

python3 - "$tmp/per_rank.json" "$tmp/stable.json" <<'PY'
import json, sys
per_rank = {p["layout"]: p for p in json.load(open(sys.argv[1]))}
stable = {p["layout"]: p for p in json.load(open(sys.argv[2]))}
# by hand: TP1/TP2 need ceil(4168/32)*32 = 4192 tokens, TP4 needs ceil(2084/32)*32 = 2112
bs = {1: 4192, 2: 4192, 4: 2112}
for name in ("4p2d", "1p4d", "4p1d", "2p4d"):
    p = per_rank[name]
    P, D = p["prefill"]["tp_size"], p["decode"]["tp_size"]
    assert p["verdict"] != "compatible", (name, p)
    assert p["field"] == "kernel_block_size", p
    assert int(p["prefill_value"]) == bs[P] and int(p["decode_value"]) == bs[D], p
    assert "not an integer" in p["why"], p          # 4192/2112 is not an integer
for name in ("1p2d", "2p1d"):
    p = per_rank[name]
    assert p["verdict"] == "compatible", p
    assert p["prefill"]["kernel_block_size"] == p["decode"]["kernel_block_size"] == 4192
for name, p in stable.items():
    assert p["verdict"] == "compatible", p
    assert p["prefill"]["block_size"] == p["decode"]["block_size"] == 4192, p
# bytes a decode rank pulls at 8192 tokens, 2p4d: 6 layers x 8192 x 256 + 23 x M(TP4)
p = stable["2p4d"]
assert p["pull_bytes_per_decode_rank"] == 6 * 8192 * 256 + 23 * 533504, p
assert p["reads"] == 4 and p["max_reads_per_decode_rank"] == 1, p
assert stable["4p2d"]["reads"] == 4 and stable["4p2d"]["max_reads_per_decode_rank"] == 2
print("plan json checks passed")
PY

# the upstream view: without block translation the per-rank mismatch is refused
if "$KVF" plan "${common[@]}" --align per-rank --block-translation no > "$tmp/up.json"; then
    fail "per-rank 4p2d without translation should exit non-zero"
fi
grep -q '"verdict":	"refused"' "$tmp/up.json" || fail "no refused verdict"

# text table names both values
"$KVF" plan --model "$nano" --kv-dtype fp8 --block-size 32 --align per-rank --layouts 4p2d \
    > "$tmp/t.txt" || true
grep -q "kernel_block_size prefill=2112 decode=4192" "$tmp/t.txt" || fail "text verdict"

# bad input: each a one-line error and a non-zero exit
expect_error() {  # expect_error <pattern> <args...>
    local pat="$1"; shift
    if "$KVF" plan "$@" > /dev/null 2> "$tmp/err"; then fail "expected failure: $*"; fi
    [ "$(grep -c . "$tmp/err")" -eq 1 ] || { cat "$tmp/err"; fail "not one line: $*"; }
    grep -q -- "$pat" "$tmp/err" || { cat "$tmp/err"; fail "missing '$pat': $*"; }
}
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); del d['n_groups']; json.dump(d, open(sys.argv[2],'w'))" \
    "$nano" "$tmp/missing.json"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['ssm_state_size']=-128; json.dump(d, open(sys.argv[2],'w'))" \
    "$nano" "$tmp/negative.json"
expect_error "missing field 'n_groups'" --model "$tmp/missing.json"
expect_error "'ssm_state_size' = -128" --model "$tmp/negative.json"
expect_error "cannot be sharded 3 ways" --model "$nano" --layouts 3p2d
expect_error "block-size" --model "$nano" --block-size 0
expect_error "bad layout" --model "$nano" --layouts 4x2
expect_error "names no layout" --model "$nano" --layouts ,,
expect_error "too small" --model "$nano" --exact-block-size 64 --layouts 1p1d
expect_error "unknown flag" --model "$nano" --no-such-flag 1
expect_error "for --prompt-tokens: expected an integer" --model "$nano" --prompt-tokens abc
expect_error "for --align" --model "$nano" --align sideways
echo "test_plan_cli passed"
