#!/usr/bin/env bash
# kvf generate / bench-model --device: "cpu" is the default, byte for byte (tokens and every
# logit); "cuda[:N]" without a usable GPU fails at once, before the model is read, naming the
# value and the CUDA error (or saying CUDA is not built in), exit 1 (also with --tp 2); bad
# values are refused by name, exit 2; kvf-prefill / kvf-decode fail the same way without a
# GPU. On a machine with a GPU the refusal cases
# are skipped (tests/gpu/run.sh compares the GPU run with the CPU's there).
set -euo pipefail
KVF="${KVF_BIN:?}/kvf"
SRC="${KVF_SOURCE_DIR:?}"
T="$(mktemp -d /tmp/kvf-dev-XXXXXX)"
trap 'rm -rf "$T"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

"$KVF" generate --help 2>&1 | grep -- '--device' >/dev/null || fail "generate --help lists no --device"

# --device cpu is the default, byte for byte, on a hybrid (Mamba2 + attention + MLP), a MoE
# and a dense RoPE model
for m in tiny-hybrid tiny-moe tiny-qwen3; do
    "$KVF" mkmodel --config "$SRC/tests/data/models/$m.config.json" --out "$T/$m" --seed 3 \
        >/dev/null
    args=(generate --model "$T/$m" --prompt "hello kvferry" --max-tokens 6 --ignore-eos yes
          --print-logits yes)
    a="$("$KVF" "${args[@]}" | grep -v '^prefill\|^decode')"
    b="$("$KVF" "${args[@]}" --device cpu | grep -v '^prefill\|^decode')"
    [ "$(grep -c '^logits ' <<<"$a")" -eq 6 ] || fail "$m: expected 6 logits lines"
    [ "$a" = "$b" ] || fail "$m: --device cpu differs from the default"
done

# refusals by value (exit 2)
for v in gpu cuda: cuda:x cuda:-1 CUDA; do
    rc=0
    "$KVF" generate --model "$T/tiny-hybrid" --device "$v" --max-tokens 1 >/dev/null \
        2>"$T/err" || rc=$?
    [ "$rc" -eq 2 ] || fail "--device $v: exit $rc, expected 2"
    grep -q "bad value '$v' for --device: cpu, cuda or cuda:N" "$T/err" \
        || fail "--device $v message: $(cat "$T/err")"
done

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then
    echo "a GPU is present: the no-GPU refusals are not checked here (tests/gpu/run.sh)"
    exit 0
fi

# no usable GPU: fail fast with the device and the CUDA error, before the model is read (the
# model folder does not exist), exit 1; same for bench-model and for TP 2 (ranks on cuda:0, 1)
for v in cuda cuda:0 cuda:3 "cuda --tp 2"; do
    want="${v%% *}"
    [ "$want" = cuda ] && want=cuda:0
    for cmd in generate bench-model; do
        rc=0
        # shellcheck disable=SC2086  # $v may carry --tp 2
        "$KVF" $cmd --model "$T/no-such-model" --device $v >"$T/out" 2>"$T/err" || rc=$?
        [ "$rc" -eq 1 ] || fail "$cmd --device $v without a GPU: exit $rc, expected 1"
        if grep -q -- "--device $want: CUDA is not built in" "$T/err"; then
            continue
        fi
        grep -Eq -- "--device $want: no CUDA device \(cuda[A-Za-z]+: .+\)" "$T/err" \
            || fail "$cmd --device $v message: $(cat "$T/err")"
        ! grep -q "no-such-model" "$T/err" || fail "$cmd --device $v read the model first"
    done
done
# the daemons take --device cuda too (tests/daemon/test_daemon_device.py runs them on a
# simulated GPU); without one they fail the same way, before binding anything
for d in kvf-prefill kvf-decode; do
    rc=0
    timeout 30 "${KVF_BIN}/$d" --model "$T/tiny-hybrid" --insecure --device cuda:0 \
        >/dev/null 2>"$T/err" || rc=$?
    [ "$rc" -eq 1 ] || fail "$d --device cuda:0 without a GPU: exit $rc, expected 1"
    grep -Eq -- "--device cuda:0: (CUDA is not built in|no CUDA device \(cuda[A-Za-z]+: .+\))" \
        "$T/err" || fail "$d --device cuda:0 message: $(cat "$T/err")"
done
echo "test_generate_device: PASS"
