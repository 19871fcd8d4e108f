#!/usr/bin/env bash
# kvf mkmodel / generate / bench-model end to end: same greedy tokens at
# TP1, TP2 and TP4 (and TP1 on two kernel threads, a bad KVF_BLAS_THREADS refused);
# throughput lines printed; missing and mis-shaped tensors
# are refused with the tensor name and both shapes; the daemons refuse a bad --pool-alloc.
set -euo pipefail
KVF="${KVF_BIN:?}/kvf"
SRC="${KVF_SOURCE_DIR:?}"
T="$(mktemp -d /tmp/kvf-cli-XXXXXX)"
trap 'rm -rf "$T"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

"$KVF" mkmodel --config "$SRC/tests/data/models/tiny-hybrid.config.json" --out "$T/h" --seed 3 >/dev/null
[ -s "$T/h/model.safetensors" ] || fail "no checkpoint written"

declare -A toks
for tp in 1 2 4; do
    out="$("$KVF" generate --model "$T/h" --tp $tp --prompt "hello kvferry" --max-tokens 12 \
           --ignore-eos yes)"
    toks[$tp]="$(grep '^tokens:' <<<"$out")"
    [ "$(wc -w <<<"${toks[$tp]}")" -eq 13 ] || fail "tp $tp: expected 12 tokens: ${toks[$tp]}"
    grep -q '^prefill: 14 tokens' <<<"$out" || fail "tp $tp: no prefill line: $out"
    grep -qE '^decode: 11 tokens .* tok/s' <<<"$out" || fail "tp $tp: no decode line: $out"
done
# TP 1 on two kernel threads: the same tokens; a bad thread count is refused by name
two="$(KVF_BLAS_THREADS=2 "$KVF" generate --model "$T/h" --tp 1 --prompt "hello kvferry" \
       --max-tokens 12 --ignore-eos yes 2>&1 | grep '^tokens:')"
[ "$two" = "${toks[1]}" ] || fail "KVF_BLAS_THREADS=2 changed the tokens: $two / ${toks[1]}"
if err="$(KVF_BLAS_THREADS=lots "$KVF" generate --model "$T/h" --prompt x --max-tokens 2 2>&1)"; then
    fail "KVF_BLAS_THREADS=lots accepted"
fi
grep -q "bad value 'lots' for KVF_BLAS_THREADS" <<<"$err" || fail "no KVF_BLAS_THREADS error: $err"
for bad in "--tp 0" "--max-tokens -5"; do   # named by flag and value, exit 2
    set +e; err="$("$KVF" generate --model "$T/h" --prompt x $bad 2>&1)"; rc=$?; set -e
    [ "$rc" -eq 2 ] || fail "generate $bad: exit $rc: $err"
    grep -q -- "bad value ${bad#* } for ${bad%% *}" <<<"$err" || fail "generate $bad not named: $err"
done
[ "${toks[1]}" = "${toks[2]}" ] || fail "tp1 and tp2 differ: ${toks[1]} / ${toks[2]}"
[ "${toks[1]}" = "${toks[4]}" ] || fail "tp1 and tp4 differ: ${toks[1]} / ${toks[4]}"

# a bf16 checkpoint loads (converted to fp32) and is half the size
"$KVF" mkmodel --config "$SRC/tests/data/models/tiny-dense.config.json" --out "$T/d16" --seed 3 \
    --dtype bf16 >/dev/null
grep -Eq '"torch_dtype":[[:space:]]*"bfloat16"' "$T/d16/config.json" || fail "bf16 config dtype"
a="$("$KVF" generate --model "$T/d16" --tp 1 --prompt "bf16" --max-tokens 6 --ignore-eos yes | grep '^tokens:')"
b="$("$KVF" generate --model "$T/d16" --tp 2 --prompt "bf16" --max-tokens 6 --ignore-eos yes | grep '^tokens:')"
[ "$a" = "$b" ] || fail "bf16 checkpoint tp1/tp2 differ: $a / $b"

# logits lines: one per generated token, vocab values each
out="$("$KVF" generate --model "$T/h" --prompt "x" --max-tokens 3 --ignore-eos yes --print-logits yes)"
[ "$(grep -c '^logits ' <<<"$out")" -eq 3 ] || fail "expected 3 logits lines"
[ "$(grep '^logits 0 ' <<<"$out" | wc -w)" -eq $((3 + 260)) ] || fail "logits line width"

# seeded sampling is reproducible
a="$("$KVF" generate --model "$T/h" --prompt "s" --max-tokens 8 --temperature 0.8 --seed 5 | grep '^tokens:')"
b="$("$KVF" generate --model "$T/h" --prompt "s" --max-tokens 8 --temperature 0.8 --seed 5 | grep '^tokens:')"
[ "$a" = "$b" ] || fail "seeded sampling differs: $a / $b"

out="$("$KVF" bench-model --model "$T/h" --tp 2 --prompt-len 64 --decode-tokens 8 --batch 2)"
grep -qE 'prefill 128 tokens [0-9.]+ tok/s, decode 14 tokens [0-9.]+ tok/s' <<<"$out" \
    || fail "bench-model output: $out"
# --warmup: an untimed round first (2 decode tokens each), the timed counts unchanged
out="$("$KVF" bench-model --model "$T/h" --prompt-len 64 --decode-tokens 8 --batch 2 --warmup yes)"
grep -qE '^warm-up: prefill 128 tokens in [0-9.]+ ms, decode 2 tokens' <<<"$out" \
    || fail "bench-model --warmup line: $out"
grep -qE 'prefill 128 tokens [0-9.]+ tok/s, decode 14 tokens [0-9.]+ tok/s' <<<"$out" \
    || fail "bench-model --warmup timed counts: $out"
# --profile: the timed figures first, then a profiled round's table per phase, rank 0 only
# (TP 2): each Mamba layer's in_proj GEMM and each attention layer's cache write + attention
# once per step; the shares of a phase add up to its step time
out="$("$KVF" bench-model --model "$T/h" --tp 2 --prompt-len 64 --decode-tokens 8 --batch 2 \
       --profile yes)"
grep -qE 'prefill 128 tokens [0-9.]+ tok/s, decode 14 tokens [0-9.]+ tok/s' <<<"$out" \
    || fail "bench-model --profile timed line: $out"
printf '%s\n' "$out" >"$T/profile.txt"
python3 - "$SRC/tests/data/models/tiny-hybrid.config.json" "$T/profile.txt" <<'PY' \
    || fail "bench-model --profile table: $out"
import json, re, sys
pattern = json.load(open(sys.argv[1]))["hybrid_override_pattern"]
text = open(sys.argv[2]).read()
phases = re.split(r"^profile (prefill|decode): (\d+) steps", text, flags=re.M)[1:]
assert [phases[0], phases[3]] == ["prefill", "decode"], phases[::3]
for name, steps, body in zip(phases[0::3], phases[1::3], phases[2::3]):
    steps, calls, share = int(steps), {}, 0.0
    for m in re.finditer(r"^\s+([0-9.-]+)% +[0-9.-]+ +(\d+|-) +\S+ +(\S+) (\w+)\(", body, re.M):
        share += float(m.group(1))
        calls[m.group(4)] = calls.get(m.group(4), 0) + int(m.group(2))
    out = re.search(r"^\s+([0-9.-]+)% .*\(outside the calls above", body, re.M)
    share += float(out.group(1))
    assert 99.0 <= share <= 101.0, (name, share)
    assert steps >= 1 and (name == "prefill" or steps == 7), (name, steps)
    assert calls["kvf_attn_write_paged_seqs"] == steps * pattern.count("*"), (name, calls)
    # in_proj and out_proj of each Mamba layer, q/k/v and o of each attention layer, lm_head
    assert calls["kvf_mat_gemm"] == steps * (2 * pattern.count("M") + 2 * pattern.count("*") + 1), \
        (name, calls)
    assert calls["kvf_comm_all_reduce"] == steps * len(pattern), (name, calls)
print("profile ok")
PY

# sampled requests: the same counts; a bad sampling flag refused by name (exit 2)
out="$("$KVF" bench-model --model "$T/h" --prompt-len 64 --decode-tokens 8 --batch 2 \
       --temperature 0.8 --top-p 0.9)"
grep -qE 'prefill 128 tokens [0-9.]+ tok/s, decode 14 tokens [0-9.]+ tok/s' <<<"$out" \
    || fail "bench-model --temperature: $out"
rc=0; "$KVF" bench-model --model "$T/h" --prompt-len 8 --decode-tokens 2 --top-p 1.5 \
    >/dev/null 2>"$T/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "top_p 1.5" "$T/err" || fail "bench-model --top-p 1.5: rc $rc $(cat "$T/err")"

# refusals name the tensor (and both shapes)
if "$KVF" generate --model "$T/h" --tp 3 --max-tokens 1 2>"$T/err"; then fail "tp 3 accepted"; fi
grep -q "tp_size 3 does not divide" "$T/err" || fail "tp 3 message: $(cat "$T/err")"

mkdir "$T/bad"
cp "$T/h/model.safetensors" "$T/bad/"
python3 - "$T/h/config.json" "$T/bad/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["intermediate_size"] = 1024
json.dump(c, open(sys.argv[2], "w"))
PY
if "$KVF" generate --model "$T/bad" --max-tokens 1 2>"$T/err"; then fail "mis-shaped accepted"; fi
grep -q "tensor 'backbone.layers.3.mixer.up_proj.weight' has shape \[512, 256\] in .*, expected \[1024, 256\]" "$T/err" \
    || fail "shape message: $(cat "$T/err")"

python3 - "$T/h/config.json" "$T/bad/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["hybrid_override_pattern"] = "*M*-M*M-"
json.dump(c, open(sys.argv[2], "w"))
PY
if "$KVF" generate --model "$T/bad" --max-tokens 1 2>"$T/err"; then fail "missing tensor accepted"; fi
grep -q "tensor 'backbone.layers.0.mixer.q_proj.weight' not found" "$T/err" \
    || fail "missing message: $(cat "$T/err")"

# the daemons refuse a page-pool placement they do not have, naming the flag and the value
for d in kvf-prefill kvf-decode; do
    if "${KVF_BIN}/$d" --model "$T/h" --pool-alloc bogus --insecure 2>"$T/err"; then
        fail "$d accepted --pool-alloc bogus"
    fi
    grep -q "\-\-pool-alloc must be ucx or heap, not 'bogus'" "$T/err" \
        || fail "$d --pool-alloc message: $(cat "$T/err")"
done
echo PASS
