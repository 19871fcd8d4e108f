#!/usr/bin/env bash
# KVF_GPU_WEIGHTS on a simulated GPU (kvf-devsim: the device layer and every kernel entry
# point wrapped, so pointers are checked to be device memory while the CPU kernels compute):
# - the default (unset, empty or "native") keeps the trained bf16 model's matrices bf16 on
#   the GPU (the weights held are the checkpoint's size, not twice it) and multiplies them
#   on the tensor-core path (kvf_gemm_narrow: cuBLASLt on a GPU, activations rounded to 16
#   bits): other logits than the CPU's, every weight matrix one algorithm key whatever the
#   batch (devsim's gemm_lt_* counters);
# - "exact" (the debugging mode) holds the checkpoint's size too, "fp32" widens at load
#   (about twice the checkpoint); both give the CPU's tokens and every logit bit for bit
#   (the fixed-order GEMM widens bf16 in its registers exactly as a widened copy is read)
#   and never take the tensor-core path;
# - "native" is the default's twin; a value none of these is refused by name before
#   anything loads.
# Usage: test_gpu_weights.sh TESTBIN (the folder holding kvf-devsim)
set -euo pipefail
DEVSIM="${1:?usage: test_gpu_weights.sh TESTBIN}/kvf-devsim"
KVF="${KVF_BIN:?}/kvf"
MODEL="${KVF_SOURCE_DIR:?}/models-trained/tiny-hybrid"
T="$(mktemp -d /tmp/kvf-gpuw-XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
field() {   # the value after NAME on the devsim line of file $1
    sed -n 's/^devsim: .* '"$2"' \([0-9][0-9]*\).*/\1/p' "$1" | tail -1
}

# weights held in MiB (x100, integer) by `bench-model` under a KVF_GPU_WEIGHTS value; the
# devsim line goes to $T/held-MODE.err
held() {
    env KVF_GPU_WEIGHTS="$1" "$DEVSIM" bench-model --model "$MODEL" --device cuda:0 \
        --prompt-len 16 --decode-tokens 2 --batch 2 2>"$T/held-$1.err" |
        sed -n 's/^weights: \([0-9.]*\) MiB held.*checkpoint \([0-9.]*\) MiB.*/\1 \2/p'
}
gen() {   # tokens and logits lines of a colocated run: gen MODE BINARY [ARGS...]
    local mode="$1" bin="$2"; shift 2
    env KVF_GPU_WEIGHTS="$mode" "$bin" generate --model "$MODEL" --prompt "add 12 30" \
        --max-tokens 4 --print-logits yes "$@" 2>/dev/null | grep '^tokens:\|^logits '
}

read -r h_def ck <<<"$(held "")"
read -r h_exact _ <<<"$(held exact)"
read -r h_fp32 _ <<<"$(held fp32)"
read -r h_nat _ <<<"$(held native)"
echo "weights held (MiB): default $h_def, exact $h_exact, fp32 $h_fp32, native $h_nat;" \
     "checkpoint $ck"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%d", 100 * a / b }'; }
r_def=$(ratio "$h_def" "$ck"); r_exact=$(ratio "$h_exact" "$ck"); r_fp32=$(ratio "$h_fp32" "$ck")
[ "$r_def" -le 110 ] || fail "default holds $h_def MiB for a $ck MiB bf16 checkpoint"
[ "$h_nat" = "$h_def" ] || fail "native ($h_nat MiB) differs from the default ($h_def)"
[ "$r_exact" -le 110 ] || fail "exact holds $h_exact MiB for a $ck MiB bf16 checkpoint"
[ "$r_fp32" -ge 180 ] || fail "fp32 holds only $h_fp32 MiB for a $ck MiB bf16 checkpoint"

# the tensor-core path: taken by default and by native, with one key per weight matrix
# through prefill (M = 32) and decode (M = 2); never by exact or fp32
for mode in "" native; do
    e="$T/held-$mode.err"
    [ "$(field "$e" gemm_lt_calls)" -gt 0 ] && [ "$(field "$e" gemm_lt_weights)" -gt 0 ] &&
        [ "$(field "$e" gemm_lt_key_errors)" -eq 0 ] ||
        fail "KVF_GPU_WEIGHTS='$mode': $(grep -o 'gemm_lt_.*' "$e" | tail -1)"
done
for mode in exact fp32; do
    [ "$(field "$T/held-$mode.err" gemm_lt_calls)" -eq 0 ] ||
        fail "KVF_GPU_WEIGHTS=$mode took the tensor-core path"
done

cpu="$(gen "" "$KVF")"
[ "$(grep -c '^logits ' <<<"$cpu")" -ge 1 ] || fail "no logits from the CPU run"
for mode in exact fp32; do
    [ "$(gen "$mode" "$DEVSIM" --device cuda:0)" = "$cpu" ] ||
        fail "KVF_GPU_WEIGHTS='$mode': tokens or logits differ from the CPU's"
done
for mode in "" native; do
    [ "$(gen "$mode" "$DEVSIM" --device cuda:0)" != "$cpu" ] ||
        fail "KVF_GPU_WEIGHTS='$mode' gave the CPU's exact logits: its 16-bit activations" \
             "are not in use"
done

rc=0
KVF_GPU_WEIGHTS=bf16 "$DEVSIM" generate --model "$MODEL" --device cuda:0 --max-tokens 1 \
    >/dev/null 2>"$T/err" || rc=$?
[ "$rc" -ne 0 ] || fail "KVF_GPU_WEIGHTS=bf16 was accepted"
grep -q "bad value 'bf16' for KVF_GPU_WEIGHTS: native (the default" "$T/err" ||
    fail "message: $(cat "$T/err")"
echo "test_gpu_weights: PASS"
