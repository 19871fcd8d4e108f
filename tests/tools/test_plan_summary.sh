#!/usr/bin/env bash
# kvf plan ends with one side-by-side table (issue 46 item 3): on the Nemotron-Nano-9B-v2
# config with --hardware h100, one row per layout (memory per rank, prefill time, decode step,
# transfer time, requests/s per GPU, verdict), a refused layout with its reason, a
# recommendation with its margin over the next layout, and the terms explained once. Each
# row's figures are checked against `kvf plan --json`'s estimate of the same layout, and the
# rate against min(prefill, decode, link) / GPUs recomputed here. Without --hardware the
# table still comes, on h100 and saying so.
set -euo pipefail
KVF="${KVF_BIN:?}/kvf"
CFG="${KVF_SOURCE_DIR:?}/tests/data/models/nemotron-nano-9b-v2.config.json"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

L=1p1d,2p2d,4p2d,1p4d,4p1d,3p1d
"$KVF" plan --model "$CFG" --layouts "$L" --hardware h100 --output-tokens 256 \
    > "$tmp/text" 2>/dev/null && fail "a refused layout (3p1d) must exit 1"
"$KVF" plan --model "$CFG" --layouts "${L%,3p1d}" --hardware h100 --json > "$tmp/json"
python3 - "$tmp/text" "$tmp/json" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
est = {p["layout"]: p["estimate"] for p in json.load(open(sys.argv[2]))}
summary = text[text.index("\nsummary: "):]
head = "layout   memory/rank GB (P | D)  prefill ms  decode step ms transfer ms req/s per GPU  verdict"
assert head in summary, summary
rows = {}
for line in summary.splitlines():
    m = re.match(r"(\dp\dd) +([0-9.]+) \| ([0-9.]+) +([0-9.]+) +([0-9.]+) +([0-9.]+) +([0-9.]+)  (.*)$", line)
    if m:
        rows[m.group(1)] = m
assert sorted(rows) == sorted(est), (sorted(rows), summary)
rates = {}
for lay, m in rows.items():
    e = est[lay]
    pre, dec = 1000 / e["prefill_ms"], 64 * 1000 / (e["decode_step_ms"] * 256)
    link = 1000 / e["transfer_ms"]
    gpus = int(lay[0]) + int(lay[2])
    want = min(pre, dec, link) / gpus
    bound = {pre: "prefill-bound", dec: "decode-bound", link: "link-bound"}[min(pre, dec, link)]
    assert abs(float(m.group(4)) - e["prefill_ms"]) < 0.01, (lay, m.group(0), e)
    assert abs(float(m.group(5)) - e["decode_step_ms"]) < 0.01, (lay, m.group(0), e)
    assert abs(float(m.group(6)) - e["transfer_ms"]) < 0.001, (lay, m.group(0), e)
    assert abs(float(m.group(7)) - want) < 0.001, (lay, m.group(0), want)
    assert m.group(8) == "compatible, " + bound, (lay, m.group(0), bound)
    w = e["prefill"]["weights_bytes_per_rank"] / 1e9
    assert float(m.group(2)) >= w and float(m.group(3)) >= e["decode"]["weights_bytes_per_rank"] / 1e9
    rates[lay] = want
assert re.search(r"\n3p1d +- +- +- +- +-  refused: the model cannot be sharded 3 ways", summary), summary
best, second = sorted(rates, key=rates.get, reverse=True)[:2]
want = "recommended: %s, %.3f req/s per GPU, %.0f %% ahead of %s (%.3f)" % (
    best, rates[best], 100 * (rates[best] / rates[second] - 1), second, rates[second])
assert want in summary, (want, summary)
assert text.count("terms:") == 1 and "tp_ratio: Y/X" in text and "ppl: kernel blocks" in text \
    and "A1: attention KV bytes" in text, text[-1500:]
print("ok: the summary's rows match plan --json's estimates; %s recommended (%.3f req/s per GPU)"
      % (best, rates[best]))
PY
"$KVF" plan --model "$CFG" --layouts 4p2d > "$tmp/plain"
grep -q "estimates on h100 (the default; --hardware to choose)" "$tmp/plain" ||
    fail "no summary without --hardware"
grep -qE "^4p2d +[0-9.]+ \| [0-9.]+ " "$tmp/plain" || fail "no 4p2d row without --hardware"
echo "ok: without --hardware the summary estimates on h100 and says so"
echo "PASS test_plan_summary"
