#!/usr/bin/env bash
# What a decode step does on a (simulated) GPU: kvf-devsim (the device layer and every kernel
# entry point wrapped, tests/daemon/devsim/kvf_devsim.c) counts, inside each decode step
# (every request one token on its cache), what rank 0's thread did. For greedy requests,
# and for one sampled on the device (temperature, top-p, logprobs):
# - no device allocation (each rank's workspace was sized at start for the step limits:
#   one kvf_device_workspace_reserve per rank, non-zero arena and staging);
# - exactly one device->host copy per step (the sampled ids), and no other stream sync;
# for the hybrid and the dense trained models, one request and a batch of four, and (CUDA
# builds: a second rank's GPU can only be opened there) TP 2 over two simulated GPUs.
# Timings are not asserted.
# Usage: test_devsim_step.sh TESTBIN CUDA_BUILD(ON/OFF)
set -euo pipefail
DEVSIM="${1:?usage: test_devsim_step.sh TESTBIN CUDA_BUILD}/kvf-devsim"
CUDA="${2:-OFF}"
MODELS="${KVF_SOURCE_DIR:?}/models-trained"
T="$(mktemp -d /tmp/kvf-devsim-step-XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# the value after NAME on the devsim line of file $1
field() {
    sed -n 's/^devsim: .* '"$2"' \([0-9][0-9]*\).*/\1/p' "$1" | tail -1
}

# check NAME RANKS STEPS FILE: the devsim line of a run with RANKS ranks and STEPS decode steps
check() {
    local name="$1" ranks="$2" steps="$3" f="$4"
    grep -q '^devsim: ' "$f" || fail "$name: no devsim line: $(tail -5 "$f")"
    local res=$(field "$f" ws_reserves) dev=$(field "$f" ws_device_bytes)
    local stg=$(field "$f" ws_staging_bytes) n=$(field "$f" decode_steps)
    local al=$(field "$f" decode_allocs) d2h=$(field "$f" decode_d2h)
    local sy=$(field "$f" decode_syncs) mx=$(field "$f" decode_d2h_max)
    [ "$res" -eq "$ranks" ] || fail "$name: $res workspace reservations, expected $ranks"
    [ "$dev" -gt 0 ] && [ "$stg" -gt 0 ] || fail "$name: workspace of $dev / $stg bytes"
    [ "$n" -eq "$steps" ] || fail "$name: $n decode steps, expected $steps"
    [ "$al" -eq 0 ] || fail "$name: $al device allocations inside $n decode steps"
    [ "$d2h" -eq "$n" ] && [ "$mx" -eq 1 ] ||
        fail "$name: $d2h device->host copies in $n decode steps (at most $mx in one)"
    [ "$sy" -eq 0 ] || fail "$name: $sy stream syncs inside $n decode steps"
    [ "$(field "$f" host_ptr_errors)" -eq 0 ] && [ "$(field "$f" wrong_device)" -eq 0 ] ||
        fail "$name: host or wrong-GPU pointers given to the device: $(grep '^devsim' "$f")"
    echo "$name: $n decode steps, 0 allocations, 1 device->host copy each, workspace" \
         "$dev device + $stg staging bytes x $ranks rank(s)"
}

for m in tiny-hybrid tiny-dense; do
    "$DEVSIM" generate --model "$MODELS/$m" --device cuda:0 --prompt "add 12 30" \
        --max-tokens 8 --ignore-eos yes >"$T/out" 2>"$T/err" || fail "$m: $(tail -5 "$T/err")"
    grep -q '^tokens:' "$T/out" || fail "$m: no tokens line"
    check "$m generate" 1 7 "$T/err"
done
# sampled on the device (temperature, top-p, logprobs): the sampler's buffers were sized
# at start too, and its one download is the step's one device->host copy
"$DEVSIM" generate --model "$MODELS/tiny-hybrid" --device cuda:0 --prompt "add 12 30" \
    --max-tokens 8 --ignore-eos yes --temperature 0.8 --top-p 0.9 --seed 7 --logprobs 2 \
    >"$T/out" 2>"$T/err" || fail "sampled: $(tail -5 "$T/err")"
grep -q '^tokens:' "$T/out" || fail "sampled: no tokens line"
check "tiny-hybrid sampled" 1 7 "$T/err"
# four requests at once: 4 prompts' prefill, then 5 steps of four decode tokens each
"$DEVSIM" bench-model --model "$MODELS/tiny-hybrid" --device cuda:0 --prompt-len 16 \
    --decode-tokens 6 --batch 4 >"$T/out" 2>"$T/err" || fail "batch 4: $(tail -5 "$T/err")"
check "tiny-hybrid batch 4" 1 5 "$T/err"
# the default GEMM of its bf16 matrices is the tensor-core one (kvf_gemm_narrow, cuBLASLt on a
# GPU): each weight matrix kept one algorithm key through the prompts' prefill (M = 64) and
# the decode steps (M = 4), so its rows' bits do not change with the batch
[ "$(field "$T/err" gemm_lt_calls)" -gt 0 ] && [ "$(field "$T/err" gemm_lt_weights)" -gt 0 ] &&
    [ "$(field "$T/err" gemm_lt_key_errors)" -eq 0 ] ||
    fail "batch 4: tensor-core GEMM keys: $(grep -o 'gemm_lt_.*' "$T/err" | tail -1)"
# a MoE model (4 MoE layers): the router's choice comes to the host for the expert loop,
# ids and weights in one copy per MoE layer, so 1 + 4 device->host copies a step; the
# tokens and logits are the CPU's in the GEMM's exact mode (KVF_GPU_WEIGHTS=exact; the
# default's tensor cores round activations to 16 bits)
"$DEVSIM" mkmodel --config "$KVF_SOURCE_DIR/tests/data/models/tiny-moe.config.json" \
    --out "$T/moe" --seed 3 >/dev/null
moe=(generate --model "$T/moe" --prompt "hello kvferry" --max-tokens 6 --ignore-eos yes)
"$DEVSIM" "${moe[@]}" --device cpu --print-logits yes >"$T/moe-cpu" 2>/dev/null ||
    fail "moe on the CPU"
KVF_GPU_WEIGHTS=exact "$DEVSIM" "${moe[@]}" --device cuda:0 --print-logits yes \
    >"$T/moe-gpu" 2>/dev/null ||
    fail "moe on the simulated GPU"
[ "$(grep -v 'tok/s' "$T/moe-cpu")" = "$(grep -v 'tok/s' "$T/moe-gpu")" ] ||
    fail "moe: the simulated GPU's tokens or logits differ from the CPU's"
"$DEVSIM" "${moe[@]}" --device cuda:0 >"$T/out" 2>"$T/err" || fail "moe: $(tail -5 "$T/err")"
n=$(field "$T/err" decode_steps)
[ "$n" -eq 5 ] && [ "$(field "$T/err" decode_allocs)" -eq 0 ] &&
    [ "$(field "$T/err" decode_d2h)" -eq $((5 * n)) ] ||
    fail "moe: $(field "$T/err" decode_d2h) device->host copies in $n decode steps, expected 5 each"
echo "tiny-moe: $n decode steps, 5 device->host copies each (ids, one per MoE layer)"
if [ "$CUDA" = ON ]; then
    DEVSIM_GPUS=2 "$DEVSIM" generate --model "$MODELS/tiny-hybrid" --device cuda:0 --tp 2 \
        --prompt "add 12 30" --max-tokens 8 --ignore-eos yes >"$T/out" 2>"$T/err" ||
        fail "tp 2: $(tail -5 "$T/err")"
    check "tiny-hybrid TP 2 (rank 0)" 2 7 "$T/err"
else
    echo "TP 2 over simulated GPUs: not run (CUDA not built in)"
fi
echo PASS
