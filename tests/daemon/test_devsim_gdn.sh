#!/usr/bin/env bash
# The chunked Gated DeltaNet prompt scan on a simulated GPU (kvf-devsim: every kernel entry
# point wrapped, the CPU kernels compute), on the qwen3-next and qwen3.5 random checkpoints
# (tests/data/families):
# - on a GPU the forward scans prompt tokens in chunks (kvf_gdn_scan_chunked) on the
#   engine's state grid, the --prefix-state-grid value, its scratch inside the arena
#   reserved at start (devsim's gdn_* counters); decode steps take the batched step
#   (kvf_gdn_decode_seqs), its CUDA body equal to the token kernel's (gdn_seqs_*);
# - greedy tokens equal to the CPU engine's (token by token), logits within 1 % of the
#   largest (the max abs difference printed);
# - a 65-token prompt prefilled whole or in chunks of <= 16 / 40 tokens (the scheduler cuts
#   on the grid), with a bf16 state: the same tokens and every logit bit;
# - batch invariance: test_batch_invariance runs each request alone, then in mixed prompt /
#   decode steps with chunked prompts (budgets 512, 128, 97, 40), every token's logits bit
#   for bit;
# - with the prefix cache on, a conversation's later turns hit (restored states) and give
#   the cache-off tokens and logprobs bit for bit;
# - KVF_MAMBA_SCAN=token is the token scan (other logits); KVF_MAMBA_SCAN=chunked on the CPU
#   gives the simulated GPU's bits under KVF_GPU_WEIGHTS=exact;
# - a grid above the chunked scan's largest is refused naming both.
# Usage: test_devsim_gdn.sh TESTBIN (the folder holding kvf-devsim)
set -euo pipefail
BIN="${1:?usage: test_devsim_gdn.sh TESTBIN}"
DEVSIM="$BIN/kvf-devsim"
KVF="${KVF_BIN:?}/kvf"
T="$(mktemp -d /tmp/kvf-gdn-XXXXXX)"
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
        --print-logits yes --prefix-state-grid 16 --prefix-caching off "$@" 2>"$err" |
        grep '^tokens:\|^logits '
}
for fam in qwen3-next qwen3.5; do
    MODEL="$KVF_SOURCE_DIR/tests/data/families/$fam"
    cpu="$(gen "$KVF" "$T/cpu.err")"
    gpu="$(gen "$DEVSIM" "$T/gpu.err" --device cuda:0)"
    [ "$(grep -c '^logits ' <<<"$gpu")" -eq 4 ] || fail "$fam: no logits from the simulated GPU"
    [ "$(field "$T/gpu.err" gdn_chunked_calls)" -gt 0 ] || fail "$fam: the chunked scan did not run"
    [ "$(field "$T/gpu.err" gdn_grid)" -eq 16 ] ||
        fail "$fam: the chunked scan ran on grid $(field "$T/gpu.err" gdn_grid), not 16"
    [ "$(field "$T/gpu.err" gdn_ws_errors)" -eq 0 ] ||
        fail "$fam: the chunked scan's scratch exceeds the arena reserved at start"
    [ "$(field "$T/gpu.err" gdn_seqs_checked)" -gt 0 ] && [ "$(field "$T/gpu.err" gdn_seqs_mismatches)" -eq 0 ] ||
        fail "$fam: decode steps: the batched step did not run or differs from the token kernel"
    [ "$(grep '^tokens:' <<<"$gpu")" = "$(grep '^tokens:' <<<"$cpu")" ] ||
        fail "$fam: chunked scan's tokens $(grep '^tokens:' <<<"$gpu") differ from the CPU's" \
             "$(grep '^tokens:' <<<"$cpu")"
    read -r diff top <<<"$(paste -d' ' <(grep '^logits ' <<<"$cpu") <(grep '^logits ' <<<"$gpu") |
        awk '{ n = NF / 2
               for (i = 3; i <= n; i++) { d = $i - $(i + n); if (d < 0) d = -d; if (d > m) m = d
                                          a = ($i < 0) ? -$i : $i; if (a > t) t = a } }
             END { printf "%.9g %.9g\n", m, t }')"
    awk -v d="$diff" -v t="$top" 'BEGIN { exit !(t > 0 && d < 0.01 * t) }' ||
        fail "$fam: logits differ from the CPU's by $diff (max $top): want < 1 %"
    echo "$fam: chunked scan on the simulated GPU, tokens = the CPU's token scan, max |logit diff| $diff (max $top)"

    whole="$(gen "$DEVSIM" "$T/whole.err" --device cuda:0 --ssm-dtype bf16)"
    for budget in 16 40; do
        cut="$(gen "$DEVSIM" "$T/cut.err" --device cuda:0 --ssm-dtype bf16 --max-batch-tokens "$budget")"
        [ "$cut" = "$whole" ] ||
            fail "$fam: prompt chunks of <= $budget tokens cut on the grid changed tokens or logits"
        [ "$(field "$T/cut.err" gdn_ws_errors)" -eq 0 ] || fail "$fam: scratch beyond the arena"
    done
    tok="$(KVF_MAMBA_SCAN=token gen "$DEVSIM" "$T/tok.err" --device cuda:0 --ssm-dtype bf16)"
    [ "$(field "$T/tok.err" gdn_chunked_calls)" -eq 0 ] && [ "$(field "$T/tok.err" gdn_token_calls)" -gt 0 ] ||
        fail "$fam: KVF_MAMBA_SCAN=token did not take the token scan"
    [ "$tok" != "$whole" ] || fail "$fam: the token scan gave the chunked scan's exact logits"
    echo "$fam: whole = chunks cut on the grid (16, 40 tokens a step), bf16 state; token scan differs"

    cpuc="$(KVF_MAMBA_SCAN=chunked gen "$KVF" "$T/cpuc.err")"
    sim="$(KVF_MAMBA_SCAN=chunked KVF_GPU_WEIGHTS=exact gen "$DEVSIM" "$T/sim.err" --device cuda:0)"
    [ "$cpuc" = "$sim" ] || fail "$fam: KVF_MAMBA_SCAN=chunked: the CPU and the simulated GPU differ"
    [ "$cpuc" != "$cpu" ] || fail "$fam: the CPU's default scan gave the chunked scan's logits"

    rc=0
    KVF_INVARIANCE_MODEL="$MODEL" KVF_INVARIANCE_DEVICE=cuda:0 KVF_INVARIANCE_STATE_GRID=16 \
        KVF_INVARIANCE_PICK=0,1,2,3 "$BIN/test_batch_invariance_devsim" >"$T/inv" 2>"$T/inv.err" ||
        rc=$?
    [ "$rc" -eq 0 ] && [ "$(grep -c ' 0 differ from their solo run' "$T/inv")" -eq 4 ] ||
        fail "$fam: a request's logits depend on its batch (exit $rc): $(grep differ "$T/inv" | tail -4)"
    [ "$(field "$T/inv.err" gdn_chunked_calls)" -gt 0 ] || fail "$fam: invariance ran no chunked scan"
    echo "$fam: batch invariance on the chunked scan, 4 compositions, 0 differ"
done

# a conversation: later turns hit the cache (attention blocks and Gated DeltaNet states)
MODEL="$KVF_SOURCE_DIR/tests/data/families/qwen3-next"
conv() {   # conv on|off: the turns' tokens and logprobs
    "$DEVSIM" generate --model "$MODEL" --device cuda:0 --ssm-dtype bf16 \
        --prompt "add 12 30 and then add 40 50 and then add 11 22 and more text" \
        --max-tokens 3 --logprobs 3 --turns 3 \
        --prefix-state-grid 16 --prefix-caching "$1" 2>"$T/conv-$1.err"
}
on="$(conv on)"
off="$(conv off)"
hits="$(sed -n 's/^turn [0-9]*: [0-9]* prompt tokens, \([0-9]*\) from the prefix cache.*/\1/p' \
        <<<"$on" | awk '{ s += $1 } END { print s + 0 }')"
[ "$hits" -gt 0 ] || fail "no prefix hit in the conversation: $(grep '^turn' <<<"$on")"
strip() { sed 's/, [0-9]* from the prefix cache//; s/, ttft [0-9.]* ms//'; }
[ "$(strip <<<"$on")" = "$(strip <<<"$off")" ] ||
    fail "prefix cache on and off differ on the simulated GPU"
[ "$(field "$T/conv-on.err" gdn_chunked_calls)" -gt 0 ] || fail "the conversation did not scan chunked"
echo "conversation: $hits prompt tokens from the prefix cache, tokens and logprobs as off"

rc=0
"$DEVSIM" generate --model "$MODEL" --device cuda:0 --max-tokens 1 --prompt-ids "$IDS" \
    --prefix-state-grid 512 >/dev/null 2>"$T/err" || rc=$?
[ "$rc" -ne 0 ] && grep -q "prefix-state-grid 512" "$T/err" && grep -q "Gated DeltaNet" "$T/err" &&
    grep -q "256" "$T/err" || fail "a grid above the chunked scan's largest was not refused (rc $rc)"
echo "PASS"
