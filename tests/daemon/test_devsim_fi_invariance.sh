#!/usr/bin/env bash
# Batch invariance GPU against GPU under KVF_GPU_ATTN=flashinfer, on the simulated GPU:
# test_batch_invariance (tests/common/engine) linked with the device simulator runs each
# request alone on cuda:0, then inside batch compositions (reversed arrival with 8 requests
# a step and a 128-token budget: mixed prompt / decode steps and prompts chunked elsewhere;
# a pool small enough to preempt: a recompute), every generated token's logits bit for bit.
# The simulator's prefill sums its dot products in another order than its decode (as the
# two GPU kernels give other bits), so a token sent to the other kernel because of its batch
# fails here. Both FlashInfer kernels must have run with right plans (fi_plan_errors 0).
# The run builds engine after engine in one process (a solo run, then each composition): no
# tensor-core GEMM may be reported with another algorithm key (the simulator drops a freed
# matrix's key, so reused addresses are not a false conflict).
# Usage: test_devsim_fi_invariance.sh TESTBIN
set -euo pipefail
BIN="${1:?usage: test_devsim_fi_invariance.sh TESTBIN}/test_batch_invariance_devsim"
T="$(mktemp -d /tmp/kvf-fi-inv-XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
field() {
    sed -n 's/^devsim: .* '"$2"' \([0-9][0-9]*\).*/\1/p' "$1" | tail -1
}
rc=0
KVF_INVARIANCE_DEVICE=cuda:0 KVF_GPU_ATTN=flashinfer KVF_INVARIANCE_PICK=1,4 "$BIN" \
    >"$T/out" 2>"$T/err" || rc=$?
grep 'differ from their solo run' "$T/out" || true
[ "$rc" -eq 0 ] ||
    fail "a request's logits depend on its batch (exit $rc): $(tail -5 "$T/out")"
[ "$(grep -c ' 0 differ from their solo run' "$T/out")" -eq 2 ] ||
    fail "not the two compositions: $(cat "$T/out")"
[ "$(field "$T/err" fi_prefill_calls)" -gt 0 ] && [ "$(field "$T/err" fi_decode_calls)" -gt 0 ] &&
    [ "$(field "$T/err" fi_plan_errors)" -eq 0 ] ||
    fail "FlashInfer's paths: $(grep -o 'fi_decode_calls.*' "$T/err")"
# the preemption's recompute (its prompt and outputs in one chunk) took FlashInfer's own row
# order (outputs first, as decode entries; then the prompt span): the gathered path ran
grep -Eq 'with rows reordered\)' "$T/err" &&
    grep -E 'FlashInfer ran .*\(([1-9][0-9]*) with rows reordered\)' "$T/err" >/dev/null ||
    fail "no step with reordered rows (the recompute's chunk): $(grep 'FlashInfer ran' "$T/err")"
[ "$(field "$T/err" gemm_lt_calls)" -gt 0 ] && [ "$(field "$T/err" gemm_lt_key_errors)" -eq 0 ] &&
    ! grep -q 'another algorithm key' "$T/err" ||
    fail "tensor-core GEMM keys: $(grep -m3 -e 'gemm_lt' -e 'algorithm key' "$T/err")"
echo "PASS ($(grep -o 'fi_decode_calls.*' "$T/err"))"
