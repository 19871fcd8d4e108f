#!/usr/bin/env bash
# The Mamba2 prompt scan on a simulated GPU (kvf-devsim: every kernel entry point wrapped,
# the CPU kernels compute), with a bf16 SSM state (rounded where the scan says):
# - on a GPU the forward scans prompt tokens in SSD chunks (kvf_mamba2_scan_chunked) on the
#   engine's state grid, the --prefix-state-grid value, with its scratch inside the arena
#   reserved at start (devsim's ssd_* counters); KVF_MAMBA_SCAN=token is the token scan;
# - a prompt of 4 x 16 + 1 tokens prefilled whole, or in chunks cut by the scheduler on the
#   grid of 16 (the last one a lone prompt token), gives the same tokens and every logit bit;
# - with the prefix cache on, a conversation's later turns hit (restored Mamba states) and
#   give the same tokens and logprobs, bit for bit, as with the cache off;
# - KVF_MAMBA_SCAN=chunked on the CPU gives the simulated GPU's bits under
#   KVF_GPU_WEIGHTS=exact (one dispatch, one chunked reference);
# - the batched decode step's CUDA body (every SSM state dtype, kvf_ssm_seqs_cuda.cu) gives
#   the per-request path's y and states bit for bit on the engine's own calls (fp32, bf16,
#   fp16 states, a batch of 3);
# - a grid the chunked scan cannot take and a bad KVF_MAMBA_SCAN are refused by name.
# Usage: test_devsim_ssd.sh TESTBIN (the folder holding kvf-devsim)
set -euo pipefail
DEVSIM="${1:?usage: test_devsim_ssd.sh TESTBIN}/kvf-devsim"
KVF="${KVF_BIN:?}/kvf"
MODEL="${KVF_SOURCE_DIR:?}/models-trained/tiny-hybrid"
T="$(mktemp -d /tmp/kvf-ssd-XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
field() {   # the value after NAME on the devsim line of file $1
    sed -n 's/^devsim: .* '"$2"' \([0-9][0-9]*\).*/\1/p' "$1" | tail -1
}
IDS="$(seq -s, 40 104)"   # 65 prompt token ids
# tokens and logits lines: gen BINARY ERRFILE [ARGS...]
gen() {
    local bin="$1" err="$2"; shift 2
    "$bin" generate --model "$MODEL" --prompt-ids "$IDS" --add-bos no --max-tokens 4 \
        --print-logits yes --ssm-dtype bf16 --prefix-state-grid 16 "$@" 2>"$err" |
        grep '^tokens:\|^logits '
}

whole="$(gen "$DEVSIM" "$T/whole.err" --device cuda:0 --prefix-caching off)"
[ "$(grep -c '^logits ' <<<"$whole")" -ge 1 ] || fail "no logits from the simulated GPU"
[ "$(field "$T/whole.err" ssd_calls)" -gt 0 ] || fail "the chunked scan did not run"
[ "$(field "$T/whole.err" ssd_grid)" -eq 16 ] ||
    fail "the chunked scan ran on grid $(field "$T/whole.err" ssd_grid), not the state grid 16"
[ "$(field "$T/whole.err" ssd_ws_errors)" -eq 0 ] ||
    fail "the chunked scan's scratch exceeds the arena reserved at start"
for budget in 16 40; do
    cut="$(gen "$DEVSIM" "$T/cut.err" --device cuda:0 --prefix-caching off \
           --max-batch-tokens "$budget")"
    [ "$cut" = "$whole" ] ||
        fail "prompt chunks of <= $budget tokens cut on the grid changed tokens or logits"
    [ "$(field "$T/cut.err" ssd_ws_errors)" -eq 0 ] || fail "scratch beyond the arena"
done
tok="$(KVF_MAMBA_SCAN=token gen "$DEVSIM" "$T/tok.err" --device cuda:0 --prefix-caching off)"
[ "$(field "$T/tok.err" ssd_calls)" -eq 0 ] && [ "$(field "$T/tok.err" token_scan_calls)" -gt 0 ] ||
    fail "KVF_MAMBA_SCAN=token did not take the token scan"
[ "$tok" != "$whole" ] ||
    fail "the token scan gave the chunked scan's exact logits: the chunked path is not in use"
echo "whole = chunks cut on the grid (16, 40 tokens a step); token scan differs"

# a conversation: later turns hit the cache (attention blocks and Mamba states)
conv() {   # conv on|off: the turns' tokens and logprobs
    "$DEVSIM" generate --model "$MODEL" --device cuda:0 --ssm-dtype bf16 \
        --prompt "add 12 30 and then add 40 50 and then add 11 22 and more text" \
        --max-tokens 3 --logprobs 3 --turns 3 --prefix-state-grid 16 --prefix-caching "$1" \
        2>"$T/conv-$1.err"
}
on="$(conv on)"
off="$(conv off)"
hits="$(sed -n 's/^turn [0-9]*: [0-9]* prompt tokens, \([0-9]*\) from the prefix cache.*/\1/p' \
        <<<"$on" | awk '{ s += $1 } END { print s + 0 }')"
[ "$hits" -gt 0 ] || fail "no prefix hit in the conversation: $(grep '^turn' <<<"$on")"
strip() { sed 's/, [0-9]* from the prefix cache//; s/, ttft [0-9.]* ms//'; }
[ "$(strip <<<"$on")" = "$(strip <<<"$off")" ] ||
    fail "prefix cache on and off differ on the simulated GPU"
[ "$(field "$T/conv-on.err" ssd_calls)" -gt 0 ] || fail "the conversation did not scan chunked"
echo "conversation: $hits prompt tokens from the prefix cache, tokens and logprobs as off"

# the CPU's chunked reference is the simulated GPU's chunked dispatch
cpu="$(KVF_MAMBA_SCAN=chunked gen "$KVF" "$T/cpu.err" --prefix-caching off)"
sim="$(KVF_MAMBA_SCAN=chunked KVF_GPU_WEIGHTS=exact gen "$DEVSIM" "$T/sim.err" --device cuda:0 \
       --prefix-caching off)"
[ "$cpu" = "$sim" ] || fail "KVF_MAMBA_SCAN=chunked: the CPU and the simulated GPU differ"
[ "$(field "$T/sim.err" ssd_calls)" -gt 0 ] || fail "exact + chunked did not scan chunked"
cpu_tok="$(gen "$KVF" "$T/cput.err" --prefix-caching off)"
[ "$cpu_tok" != "$cpu" ] || fail "the CPU's default scan gave the chunked scan's logits"

# the batched decode step (one launch for the batch, every SSM state dtype): the CUDA kernel's
# rows against the per-request path on every call's own data (devsim/kvf_devsim_ssm.c), a
# batch of 3 decoding
for d in fp32 bf16 fp16; do
    "$DEVSIM" bench-model --model "$MODEL" --device cuda:0 --prompt-len 40 --decode-tokens 6 \
        --batch 3 --ssm-dtype "$d" >/dev/null 2>"$T/err" ||
        fail "bench-model --ssm-dtype $d: $(tail -2 "$T/err")"
    n=$(sed -n 's/^devsim: .* ssm_seqs_checked \([0-9]*\) ssm_seqs_narrow \([0-9]*\) ssm_seqs_mismatches \([0-9]*\).*/\1 \2 \3/p' "$T/err")
    read -r chk nar mis <<<"$n"
    want_nar=$([ "$d" = fp32 ] && echo 0 || echo "$chk")
    [ -n "$chk" ] && [ "$chk" -gt 0 ] && [ "$nar" -eq "$want_nar" ] && [ "$mis" -eq 0 ] ||
        fail "$d state: batched decode body against the per-request path: ${n:-no counts}"
    echo "$d state: $chk batched decode calls, each = the per-request path, bit for bit"
done

# refusals, by name
rc=0
KVF_MAMBA_SCAN=sideways "$DEVSIM" generate --model "$MODEL" --device cuda:0 --max-tokens 1 \
    >/dev/null 2>"$T/err" || rc=$?
[ "$rc" -ne 0 ] && grep -q "KVF_MAMBA_SCAN" "$T/err" && grep -q "sideways" "$T/err" ||
    fail "a bad KVF_MAMBA_SCAN was not refused by name (rc $rc)"
rc=0
"$DEVSIM" generate --model "$MODEL" --device cuda:0 --max-tokens 1 --prefix-state-grid 512 \
    >/dev/null 2>"$T/err" || rc=$?
[ "$rc" -ne 0 ] && grep -q "prefix-state-grid 512" "$T/err" && grep -q "256" "$T/err" ||
    fail "a grid above the chunked scan's largest was not refused naming both (rc $rc)"
KVF_MAMBA_SCAN=token "$DEVSIM" generate --model "$MODEL" --device cuda:0 --max-tokens 1 \
    --prefix-state-grid 512 >/dev/null 2>"$T/err" ||
    fail "KVF_MAMBA_SCAN=token with grid 512 was refused: $(cat "$T/err")"
echo "PASS"
