#!/usr/bin/env bash
# KVF_GPU_ATTN=flashinfer with a GQA group FlashInfer's decode does not dispatch (the
# Nemotron-Nano-9B-v2 geometry's 40 / 8 = 5), on the simulated GPU: a random hybrid checkpoint
# of tiny-hybrid's shape with 10 query heads over 2 KV heads (tests/data/models/
# tiny-gqa5.config.json, kvf mkmodel; tiny-hybrid's tokenizer so the prompts are the trained
# model's):
# - said at start (outputs on FlashInfer's prefill, one query token each), FlashInfer's
#   decode never called, its prefill's plan arguments right (fi_plan_errors 0);
# - greedy tokens equal to the CPU engine's, logits within 1 % of the largest, for a short,
#   a 200-token and a 2400-token prompt;
# - batch invariance GPU against GPU: test_batch_invariance (KVF_INVARIANCE_MODEL) runs each
#   request alone, then in mixed prompt / decode steps with chunked prompts and in a pool
#   small enough to preempt (the recompute), every token's logits bit for bit;
# - head_dim 64 and 256 (gpt_oss; gemma3, qwen3_next) served too, tokens equal to the CPU's.
# Usage: test_devsim_fi_gqa.sh TESTBIN
set -euo pipefail
BIN="${1:?usage: test_devsim_fi_gqa.sh TESTBIN}"
DEVSIM="$BIN/kvf-devsim"
T="$(mktemp -d /tmp/kvf-fi-gqa-XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
field() {
    sed -n 's/^devsim: .* '"$2"' \([0-9][0-9]*\).*/\1/p' "$1" | tail -1
}
"$DEVSIM" mkmodel --config "$KVF_SOURCE_DIR/tests/data/models/tiny-gqa5.config.json" \
    --out "$T/m" --seed 5 >/dev/null || fail "kvf mkmodel"
cp "$KVF_SOURCE_DIR"/models-trained/tiny-hybrid/tokenizer*.json "$T/m/"

printf 'add 12 30 ' >"$T/short.txt"
awk 'BEGIN { for (i = 0; i < 40; ++i) printf "add %d %d ", i, i + 3; print "" }' >"$T/mid.txt"
awk 'BEGIN { for (i = 0; i < 260; ++i) printf "add %d %d ", i, i + 7; print "" }' >"$T/long.txt"
run_gen() {   # run_gen DEVICE PROMPTFILE OUT ERR [ATTN]
    env KVF_GPU_ATTN="${5:-}" "$DEVSIM" generate --model "$T/m" --prompt-file "$2" \
        --max-tokens 6 --ignore-eos yes --device "$1" --max-batch-tokens 512 \
        --num-blocks 256 --print-logits yes >"$3" 2>"$4" || fail "generate on $1: $(tail -2 "$4")"
}
for p in short mid long; do
    run_gen cpu "$T/$p.txt" "$T/c.out" "$T/c.err"
    run_gen cuda:0 "$T/$p.txt" "$T/g.out" "$T/g.err" flashinfer
    grep -q "outputs on its prefill too, one query token each (GQA group 5" "$T/g.err" ||
        fail "$p: the group of 5 on FlashInfer's prefill was not said at start"
    [ "$(grep '^tokens:' "$T/g.out")" = "$(grep '^tokens:' "$T/c.out")" ] ||
        fail "$p: FlashInfer's greedy tokens $(grep '^tokens:' "$T/g.out") differ from the" \
             "CPU's $(grep '^tokens:' "$T/c.out")"
    read -r diff top <<<"$(paste -d' ' <(grep '^logits ' "$T/c.out") \
        <(grep '^logits ' "$T/g.out") | awk '{
        n = NF / 2
        for (i = 3; i <= n; i++) { d = $i - $(i + n); if (d < 0) d = -d; if (d > m) m = d
                                   a = ($i < 0) ? -$i : $i; if (a > t) t = a } }
        END { printf "%.9g %.9g\n", m, t }')"
    awk -v d="$diff" -v t="$top" 'BEGIN { exit !(t > 0 && d > 0 && d < 0.01 * t) }' ||
        fail "$p: logits differ from the CPU's by $diff (max $top): want (0, 1 %)"
    [ "$(field "$T/g.err" fi_decode_calls)" -eq 0 ] && [ "$(field "$T/g.err" fi_prefill_calls)" -gt 0 ] &&
        [ "$(field "$T/g.err" fi_plan_errors)" -eq 0 ] ||
        fail "$p: $(grep -o 'fi_decode_calls.*fi_plan_errors [0-9]*' "$T/g.err")"
    echo "gqa5 $p: tokens equal to the CPU's, max |logit diff| $diff (max $top)," \
         "$(grep -o 'fi_decode_calls.*fi_plan_errors [0-9]*' "$T/g.err")"
done

# head_dim 64 (gpt_oss) and 256 (gemma3, qwen3_next): instantiated in -DKVF_FLASHINFER=ON
# builds, so served (tiny-hybrid's shape with that head_dim, a group of 4: its decode)
for hd in 64 256; do
    sed 's/"head_dim": 32/"head_dim": '"$hd"'/' \
        "$KVF_SOURCE_DIR/models-trained/tiny-hybrid/config.json" >"$T/hd$hd.json"
    "$DEVSIM" mkmodel --config "$T/hd$hd.json" --out "$T/hd$hd" --seed 7 >/dev/null ||
        fail "kvf mkmodel head_dim $hd"
    cp "$KVF_SOURCE_DIR"/models-trained/tiny-hybrid/tokenizer*.json "$T/hd$hd/"
    for d in cpu cuda:0; do
        KVF_GPU_ATTN=flashinfer "$DEVSIM" generate --model "$T/hd$hd" --prompt-file "$T/mid.txt" \
            --max-tokens 6 --ignore-eos yes --device "$d" >"$T/hd.$d" 2>"$T/hd.$d.err" ||
            fail "head_dim $hd on $d: $(tail -2 "$T/hd.$d.err")"
    done
    [ "$(grep '^tokens:' "$T/hd.cuda:0")" = "$(grep '^tokens:' "$T/hd.cpu")" ] ||
        fail "head_dim $hd: FlashInfer's tokens $(grep '^tokens:' "$T/hd.cuda:0") differ from" \
             "the CPU's $(grep '^tokens:' "$T/hd.cpu")"
    [ "$(field "$T/hd.cuda:0.err" fi_decode_calls)" -gt 0 ] &&
        [ "$(field "$T/hd.cuda:0.err" fi_prefill_calls)" -gt 0 ] &&
        [ "$(field "$T/hd.cuda:0.err" fi_plan_errors)" -eq 0 ] ||
        fail "head_dim $hd: $(grep -o 'fi_decode_calls.*fi_plan_errors [0-9]*' "$T/hd.cuda:0.err")"
    echo "head_dim $hd: tokens equal to the CPU's on FlashInfer's prefill and decode"
done

rc=0
KVF_INVARIANCE_MODEL="$T/m" KVF_INVARIANCE_DEVICE=cuda:0 KVF_GPU_ATTN=flashinfer \
    KVF_INVARIANCE_PICK=1,4 "$BIN/test_batch_invariance_devsim" >"$T/out" 2>"$T/err" || rc=$?
grep 'differ from their solo run' "$T/out" || true
[ "$rc" -eq 0 ] && [ "$(grep -c ' 0 differ from their solo run' "$T/out")" -eq 2 ] ||
    fail "a request's logits depend on its batch (exit $rc): $(tail -5 "$T/out")"
grep -q "GQA group 5" "$T/err" && [ "$(field "$T/err" fi_decode_calls)" -eq 0 ] &&
    [ "$(field "$T/err" fi_prefill_calls)" -gt 0 ] && [ "$(field "$T/err" fi_plan_errors)" -eq 0 ] ||
    fail "invariance: FlashInfer's paths: $(grep -o 'fi_decode_calls.*fi_plan_errors [0-9]*' "$T/err")"
echo "PASS ($(grep -o 'fi_decode_calls.*fi_plan_errors [0-9]*' "$T/err"))"
