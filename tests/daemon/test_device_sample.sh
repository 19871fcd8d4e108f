#!/usr/bin/env bash
# Sampling on a simulated GPU (kvf-devsim: the device layer and every kernel entry point
# wrapped; kvf_sample_rows runs its CPU twin on "device" memory and the copies are counted):
# - `kvf generate --device cuda:0` with temperature, top-p, top-k, min-p, logit_bias,
#   allowed_token_ids, a seed and logprobs gives the CPU run's tokens and logprobs lines exactly (the device sampler's twin equals
#   the host sampler bit for bit: test_sample_twin);
# - no [vocab]-sized copy to the host per step: one download per step, under a quarter of a
#   logits row per generated token; with --print-logits the rows do come back (the control,
#   so the counter is seen to count them).
# The GEMMs run in their exact mode (KVF_GPU_WEIGHTS=exact: the CPU's bits), so the tokens
# can be compared bit for bit; the default's tensor cores round activations to 16 bits.
# Usage: test_device_sample.sh TESTBIN (the folder holding kvf-devsim)
set -euo pipefail
DEVSIM="${1:?usage: test_device_sample.sh TESTBIN}/kvf-devsim"
KVF="${KVF_BIN:?}/kvf"
export KVF_GPU_WEIGHTS=exact
MODEL="${KVF_SOURCE_DIR:?}/models-trained/tiny-hybrid"
T="$(mktemp -d /tmp/kvf-dsample-XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
N=12
VOCAB=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" \
        "$MODEL/config.json")

gen() {   # gen BINARY OUT [ARGS...]: tokens and logprobs lines to OUT, stderr to OUT.err
    local bin="$1" out="$2"; shift 2
    "$bin" generate --model "$MODEL" --prompt "add 12 30" --max-tokens "$N" --ignore-eos yes \
        "$@" 2>"$out.err" | grep '^tokens:\|^logprobs \|^logits ' >"$out" || true
}
d2h() {   # d2h() ERRFILE: "CALLS BYTES" of the devsim report
    sed -n 's/.* d2h \([0-9]*\) calls \([0-9]*\) bytes .*/\1 \2/p' "$1"
}

i=0
for args in "--temperature 0.9 --top-p 0.9 --top-k 40 --seed 7 --logprobs 3" \
            "--temperature 1.5 --seed 11 --logprobs 20" \
            "--temperature 0.7 --top-k 5 --min-p 0.05 --seed 3 --logprobs 0" \
            "--temperature 1.2 --top-p 0.5 --seed 5" \
            "--temperature 0 --logprobs 2" \
            "--temperature 0.8 --seed 9 --logit-bias 7:5,12:-100,30:2.5 --logprobs 2" \
            "--temperature 1.1 --seed 4 --allowed-token-ids 3,7,12,40,41 --logit-bias 40:1" \
            "--temperature 0 --logit-bias 33:100"; do
    i=$((i + 1))
    # shellcheck disable=SC2086  # $args is a flag list
    gen "$KVF" "$T/cpu$i" $args
    # shellcheck disable=SC2086
    gen "$DEVSIM" "$T/dev$i" $args --device cuda:0
    grep -q '^tokens:' "$T/cpu$i" || fail "case $i ($args): no tokens from the CPU run"
    cmp -s "$T/cpu$i" "$T/dev$i" || fail "case $i ($args): the simulated GPU's tokens or" \
        "logprobs differ from the CPU's: $(diff "$T/cpu$i" "$T/dev$i" | head -4)"
    read -r calls bytes <<<"$(d2h "$T/dev$i.err")"
    [ -n "$calls" ] || fail "case $i: no devsim report: $(tail -2 "$T/dev$i.err")"
    grep -q 'host_ptr_errors 0 wrong_device 0' "$T/dev$i.err" ||
        fail "case $i: host pointers on the device path: $(tail -1 "$T/dev$i.err")"
    [ "$calls" -eq "$N" ] || fail "case $i ($args): $calls copies to the host for $N tokens"
    [ $((bytes * 4)) -lt $((N * VOCAB * 4)) ] ||
        fail "case $i ($args): $bytes bytes to the host for $N tokens of a $VOCAB-id vocabulary"
    echo "case $i ($args): same tokens and logprobs as the CPU; $calls copies, $bytes bytes" \
         "to the host (a logits row is $((VOCAB * 4)) bytes)"
done
# the lists did act on the device path: +100 forces its token, the allowed set holds
[ "$(sed -n 's/^tokens: //p' "$T/dev8")" = "$(printf '33 %.0s' $(seq "$N") | sed 's/ $//')" ] ||
    fail "--logit-bias 33:100 did not force token 33: $(cat "$T/dev8")"
for t in $(sed -n 's/^tokens: //p' "$T/dev7"); do
    case " 3 7 12 40 41 " in *" $t "*) ;; *) fail "--allowed-token-ids: token $t drawn";; esac
done
echo "logit_bias +100 forced its token and allowed_token_ids held on the simulated GPU"
# the control: recorded logits come back, a row per token, with the same sample
gen "$KVF" "$T/cpul" --temperature 0.9 --top-p 0.9 --seed 7 --print-logits yes
gen "$DEVSIM" "$T/devl" --temperature 0.9 --top-p 0.9 --seed 7 --print-logits yes --device cuda:0
[ "$(grep -c '^logits ' "$T/cpul")" -eq "$N" ] || fail "--print-logits: no logits lines"
cmp -s "$T/cpul" "$T/devl" || fail "--print-logits: the simulated GPU's tokens or logits differ"
read -r calls bytes <<<"$(d2h "$T/devl.err")"
[ "$bytes" -ge $((N * VOCAB * 4)) ] ||
    fail "--print-logits: only $bytes bytes to the host: the counter misses the rows"
echo "--print-logits: same tokens and logits; $bytes bytes to the host (the rows, as asked)"
echo "test_device_sample: PASS"
