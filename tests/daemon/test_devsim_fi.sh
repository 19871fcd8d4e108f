#!/usr/bin/env bash
# KVF_GPU_ATTN=flashinfer on a simulated GPU (kvf-devsim; its kvf_fi_built says what a
# -DKVF_FLASHINFER=ON build says, its kvf_fi_decode and kvf_fi_prefill check the plan
# arguments and compute the attention on the CPU the way they say, devsim/kvf_devsim_fi.c):
# - prompt tokens go to FlashInfer's prefill and outputs to its decode, with every plan
#   argument right (page counts and fill, the fixed split-KV plan of each request's own
#   length, the fixed query tiles, the chunk size, page indices inside the pool):
#   fi_prefill_calls > 0, fi_decode_calls > 0, fi_plan_errors 0, over a prompt of more than
#   one split-KV chunk (about 2400 tokens, chunks of 2048) and a batch of 3;
# - its logits are the default attention's within bf16 rounding (q and the output are
#   16-bit on FlashInfer's path), and not bit-equal (the path is in use); its greedy tokens
#   are the CPU engine's, on both trained models (the hybrid's attention layers too), with
#   the logits within 1 % of the largest;
# - one plan per step: the layer calls are the steps' plans times the attention layers;
# - refused at start by name: an fp32 KV cache (FlashInfer reads 16-bit ones), CUDA graphs
#   (KVF_GPU_GRAPHS=decode: a graphed step would take kvferry's kernel) and a build without
#   FlashInfer (DEVSIM_FI=0: this build's own answer), naming the value and the fix.
# Batch invariance (a request alone and inside batches, mixed steps, preemption) is
# test_devsim_fi_invariance.
# Usage: test_devsim_fi.sh TESTBIN [KVF_FLASHINFER (ON: the build has it, nothing to refuse)]
set -euo pipefail
DEVSIM="${1:?usage: test_devsim_fi.sh TESTBIN}/kvf-devsim"
MODEL="${KVF_SOURCE_DIR:?}/models-trained/tiny-dense"
T="$(mktemp -d /tmp/kvf-fi-XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
field() {   # the value after NAME on the devsim line of file $1
    sed -n 's/^devsim: .* '"$2"' \([0-9][0-9]*\).*/\1/p' "$1" | tail -1
}
awk 'BEGIN { for (i = 0; i < 260; ++i) printf "add %d %d ", i, i + 7; print "" }' >"$T/long.txt"
logits() {   # logits lines of 4 generated tokens: logits ATTN ERRFILE
    env KVF_GPU_ATTN="$1" "$DEVSIM" generate --model "$MODEL" --prompt-file "$T/long.txt" \
        --max-tokens 4 --ignore-eos yes --device cuda:0 --max-batch-tokens 4096 \
        --num-blocks 512 --print-logits yes 2>"$2" | grep '^logits '
}
logits "" "$T/def.err" >"$T/def.txt"
logits flashinfer "$T/fi.err" >"$T/fi.txt"
[ "$(wc -l <"$T/fi.txt")" -eq 4 ] && [ "$(wc -l <"$T/def.txt")" -eq 4 ] ||
    fail "no logits from one of the runs"
grep -q "FlashInfer (KVF_GPU_ATTN=flashinfer): prompt tokens on its prefill" "$T/fi.err" ||
    fail "KVF_GPU_ATTN=flashinfer was not said at start"
[ "$(field "$T/fi.err" fi_prefill_calls)" -gt 0 ] || fail "FlashInfer's prefill did not run"
[ "$(field "$T/fi.err" fi_decode_calls)" -gt 0 ] || fail "FlashInfer's decode did not run"
[ "$(field "$T/fi.err" fi_plan_errors)" -eq 0 ] || fail "bad FlashInfer plan arguments"
[ "$(field "$T/def.err" fi_decode_calls)" -eq 0 ] || fail "the default took FlashInfer's path"
[ "$(field "$T/fi.err" host_ptr_errors)" -eq 0 ] || fail "a host pointer on the device path"
read -r diff top <<<"$(paste -d' ' "$T/def.txt" "$T/fi.txt" | awk '{
    n = NF / 2
    for (i = 3; i <= n; i++) { d = $i - $(i + n); if (d < 0) d = -d; if (d > m) m = d
                               a = ($i < 0) ? -$i : $i; if (a > t) t = a } }
    END { printf "%.9g %.9g\n", m, t }')"
echo "logits: FlashInfer against the default attention, max |diff| $diff (max |logit| $top)"
awk -v d="$diff" -v t="$top" 'BEGIN { exit !(d > 0 && d < 0.01 * t) }' ||
    fail "FlashInfer's logits differ by $diff from the default's (max $top): want (0, 1%)"

# greedy tokens against the CPU engine's; logits within 1 % of the largest; one plan a step
maxdiff() {   # max |diff| and max |logit| of two logits files
    paste -d' ' "$1" "$2" | awk '{
        n = NF / 2
        for (i = 3; i <= n; i++) { d = $i - $(i + n); if (d < 0) d = -d; if (d > m) m = d
                                   a = ($i < 0) ? -$i : $i; if (a > t) t = a } }
        END { printf "%.9g %.9g\n", m, t }'
}
run_gen() {   # run_gen DEVICE MODEL PROMPTFILE OUT ERR [ATTN]
    env KVF_GPU_ATTN="${6:-}" "$DEVSIM" generate --model "$2" --prompt-file "$3" --max-tokens 6 \
        --ignore-eos yes --device "$1" --max-batch-tokens 128 --print-logits yes >"$4" 2>"$5" ||
        fail "generate on $1 ($2): $(tail -2 "$5")"
}
printf 'add 12 30 ' >"$T/short.txt"
awk 'BEGIN { for (i = 0; i < 40; ++i) printf "add %d %d ", i, i + 3; print "" }' >"$T/mid.txt"
for m in tiny-dense tiny-hybrid; do
    md="${KVF_SOURCE_DIR}/models-trained/$m"
    nattn=$(grep -o '"hybrid_override_pattern": *"[^"]*"' "$md/config.json" | sed 's/.*: *"//' |
            tr -cd '*' | wc -c)
    for p in short mid; do
        run_gen cpu "$md" "$T/$p.txt" "$T/c.out" "$T/c.err"
        run_gen cuda:0 "$md" "$T/$p.txt" "$T/g.out" "$T/g.err" flashinfer
        [ "$(grep '^tokens:' "$T/g.out")" = "$(grep '^tokens:' "$T/c.out")" ] ||
            fail "$m $p: FlashInfer's greedy tokens $(grep '^tokens:' "$T/g.out") differ" \
                 "from the CPU's $(grep '^tokens:' "$T/c.out")"
        grep '^logits ' "$T/c.out" >"$T/c.lg"
        grep '^logits ' "$T/g.out" >"$T/g.lg"
        read -r diff top <<<"$(maxdiff "$T/c.lg" "$T/g.lg")"
        awk -v d="$diff" -v t="$top" 'BEGIN { exit !(t > 0 && d < 0.01 * t) }' ||
            fail "$m $p: logits differ from the CPU's by $diff (max $top): want < 1 %"
        [ "$(field "$T/g.err" fi_plan_errors)" -eq 0 ] &&
            [ "$(field "$T/g.err" fi_prefill_calls)" -gt 0 ] &&
            [ "$(field "$T/g.err" fi_decode_calls)" -gt 0 ] ||
            fail "$m $p: $(grep -o 'fi_decode_calls.*' "$T/g.err")"
        read -r calls plans <<<"$(sed -n 's/.*FlashInfer ran \([0-9]*\) layer calls on \([0-9]*\) step plans.*/\1 \2/p' "$T/g.err")"
        [ -n "$calls" ] && [ "$plans" -gt 0 ] && [ "$calls" -eq $((plans * nattn)) ] ||
            fail "$m $p: ${calls:-no} layer calls on ${plans:-no} step plans, want plans x $nattn"
        echo "$m $p: tokens equal to the CPU's, max |logit diff| $diff (max $top), $calls" \
             "layer calls on $plans step plans"
    done
done

# a batch of 3 decoding together (bench-model): every step's plan checked
KVF_GPU_ATTN=flashinfer "$DEVSIM" bench-model --model "$MODEL" --device cuda:0 \
    --prompt-len 40 --decode-tokens 6 --batch 3 >/dev/null 2>"$T/b3.err" ||
    fail "bench-model --batch 3 under flashinfer failed: $(tail -2 "$T/b3.err")"
[ "$(field "$T/b3.err" fi_decode_calls)" -gt 0 ] &&
    [ "$(field "$T/b3.err" fi_plan_errors)" -eq 0 ] ||
    fail "batch 3: $(grep -o 'fi_decode_calls.*' "$T/b3.err")"

# refusals at start, by name
rc=0
KVF_GPU_ATTN=flashinfer "$DEVSIM" generate --model "$MODEL" --device cuda:0 --kv-dtype fp32 \
    --max-tokens 1 >/dev/null 2>"$T/err" || rc=$?
[ "$rc" -ne 0 ] && grep -q "KVF_GPU_ATTN=flashinfer" "$T/err" && grep -q "fp32" "$T/err" ||
    fail "an fp32 KV cache under flashinfer was not refused by name (rc $rc)"
rc=0
KVF_GPU_GRAPHS=decode KVF_GPU_ATTN=flashinfer "$DEVSIM" generate --model "$MODEL" \
    --device cuda:0 --max-tokens 1 >/dev/null 2>"$T/err" || rc=$?
[ "$rc" -ne 0 ] && grep -q "KVF_GPU_ATTN=flashinfer with KVF_GPU_GRAPHS=decode" "$T/err" ||
    fail "KVF_GPU_ATTN=flashinfer with CUDA graphs was not refused by name (rc $rc)"
[ "${2:-OFF}" = ON ] && { echo "PASS (a -DKVF_FLASHINFER=ON build: no refusal to check)"; exit 0; }
rc=0
DEVSIM_FI=0 KVF_GPU_ATTN=flashinfer "$DEVSIM" generate --model "$MODEL" --device cuda:0 \
    --max-tokens 1 >/dev/null 2>"$T/err" || rc=$?
[ "$rc" -ne 0 ] && grep -q "KVF_FLASHINFER=ON" "$T/err" ||
    fail "a build without FlashInfer did not refuse KVF_GPU_ATTN=flashinfer by name (rc $rc)"
echo "PASS"
