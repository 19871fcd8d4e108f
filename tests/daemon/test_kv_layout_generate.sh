#!/usr/bin/env bash
# The head-major attention block layout (--kv-layout, kernels/kvf_kv_layout.h) is the same
# math at other addresses: `kvf generate` on the CPU and `kvf-devsim generate --device
# cuda:0` (the simulated GPU's kernel entry points) print the same tokens and logprobs at
# head-major as at layer-major, for the trained hybrid and dense models, and so does
# KVF_GPU_ATTN=flashinfer on the simulated GPU (its paging by the head-major strides,
# kvf_fi_geometry_kv: every plan argument checked by kvf-devsim, fi_plan_errors 0); an unknown
# layout is refused naming the flag and the value.
# Usage: test_kv_layout_generate.sh BIN TESTBIN
set -euo pipefail
KVF="${1:?usage: test_kv_layout_generate.sh BIN TESTBIN}/kvf"
DEVSIM="${2:?usage: test_kv_layout_generate.sh BIN TESTBIN}/kvf-devsim"
MODELS="${KVF_SOURCE_DIR:?}/models-trained"
T="$(mktemp -d /tmp/kvf-kv-layout-XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for m in tiny-hybrid tiny-dense; do
    for dev in cpu cuda:0; do
        bin="$KVF"
        [ "$dev" = cpu ] || bin="$DEVSIM"
        for kl in layer-major head-major; do
            "$bin" generate --model "$MODELS/$m" --device "$dev" --kv-layout "$kl" \
                --prompt "add 12 30 then add 7 5" --max-tokens 12 --ignore-eos yes \
                --logprobs 2 >"$T/raw" 2>"$T/err" || fail "$m $dev $kl: $(tail -3 "$T/err")"
            # the timing lines differ from run to run; everything else must not
            grep -v -e '^prefill:' -e '^decode:' "$T/raw" >"$T/$kl"
            grep -q '^tokens:' "$T/$kl" || fail "$m $dev $kl: no tokens line"
        done
        cmp -s "$T/layer-major" "$T/head-major" ||
            fail "$m $dev: head-major differs from layer-major: $(diff "$T/layer-major" \
                 "$T/head-major" | head -5)"
        echo "$m $dev: head-major = layer-major ($(grep -c '^logprobs' "$T/head-major")" \
             "logprob lines)"
    done
done
for m in tiny-hybrid tiny-dense; do
    for kl in layer-major head-major; do
        KVF_GPU_ATTN=flashinfer "$DEVSIM" generate --model "$MODELS/$m" --device cuda:0 \
            --kv-layout "$kl" --prompt "add 12 30 then add 7 5 and add 3 4" --max-tokens 12 \
            --ignore-eos yes --print-logits yes >"$T/raw" 2>"$T/err" ||
            fail "$m flashinfer $kl: $(tail -3 "$T/err")"
        grep -v -e '^prefill:' -e '^decode:' "$T/raw" >"$T/fi-$kl"
        grep -q ' fi_decode_calls [1-9][0-9]* fi_prefill_calls [1-9][0-9]* fi_plan_errors 0 ' \
            "$T/err" || fail "$m flashinfer $kl: $(grep -o 'fi_decode.*plan_errors [0-9]*' \
            "$T/err")"
    done
    cmp -s "$T/fi-layer-major" "$T/fi-head-major" ||
        fail "$m flashinfer: head-major logits differ from layer-major"
    echo "$m flashinfer (devsim): head-major = layer-major ($(grep -c '^logits' \
         "$T/fi-head-major") logits lines), plan arguments checked"
done
if "$KVF" generate --model "$MODELS/tiny-hybrid" --kv-layout diagonal --prompt x \
    >"$T/out" 2>"$T/err"; then
    fail "--kv-layout diagonal was accepted"
fi
grep -q "\-\-kv-layout 'diagonal' is not a KV cache layout" "$T/err" ||
    fail "refusal does not name the flag and value: $(cat "$T/err")"
echo "test_kv_layout_generate passed"
