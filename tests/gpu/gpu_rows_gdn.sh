# shellcheck shell=bash disable=SC2154  # data, kvf, tbin: exported by run.sh
# The Gated DeltaNet rows of tests/gpu/run.sh (sourced, not run; the conventions of
# gpu_rows.sh: table lines on stdout, outputs in $RR_DIR, rr_verdict, exit 0 / 77 / 1), on the
# qwen3-next and qwen3.5 random checkpoints of tests/data/families (GDN + gated attention;
# qwen3-next's MLP is MoE).

# Greedy tokens of the chunked GDN prompt scan on the GPU against the CPU engine (the token
# scan): KVF_GPU_WEIGHTS=exact and fp32 KV, so the scan is the one difference, forced with
# KVF_MAMBA_SCAN=chunked on the engine's state grid (16, a 70-token prompt: 5 chunks);
# tokens equal, logits within 1e-3 relative (the max printed).
row_gdn_generate() { # family
    local m=$1 name="generate cuda gdn chunked: $1" c g rc_c rc_g diffs ma mr
    need_kvf
    local args=(generate --model "$data/tests/data/families/$m" --max-tokens 16 --ignore-eos yes
                --print-logits yes --kv-dtype fp32 --prefix-state-grid 16 --prefix-caching off
                --prompt-ids "$(seq -s, 40 109)" --add-bos no)
    c="$RR_DIR/gen-gdn-$m-cpu.txt" g="$RR_DIR/gen-gdn-$m-gpu.txt"
    "$kvf" "${args[@]}" --device cpu >"$c" 2>"$c.err"
    rc_c=$?
    KVF_GPU_WEIGHTS=exact KVF_MAMBA_SCAN=chunked KVF_LOG_LEVEL=info "$kvf" "${args[@]}" \
        --device cuda:0 >"$g" 2>"$g.err"
    rc_g=$?
    if [ "$rc_c" -ne 0 ] || [ "$rc_g" -ne 0 ]; then
        gen_row "$name" fp32 "-" "-" "-" "FAIL (exit cpu $rc_c, gpu $rc_g)"
        tail -5 "$g.err" >&2
        rr_verdict "FAIL: exit cpu $rc_c, gpu $rc_g"
        return 1
    fi
    if [ "$(grep '^tokens:' "$c")" != "$(grep '^tokens:' "$g")" ]; then
        gen_row "$name" fp32 "-" "-" "-" "FAIL: tokens differ"
        grep -h '^tokens:' "$c" "$g"
        rr_verdict "FAIL: tokens differ"
        return 1
    fi
    diffs=$(logit_diffs "$c" "$g")
    if [ "$diffs" = bad ]; then
        gen_row "$name" fp32 "-" "-" "-" "FAIL: logits lines differ in shape"
        rr_verdict "FAIL: logits lines differ in shape"
        return 1
    fi
    read -r ma mr <<<"$diffs"
    if awk -v r="$mr" 'BEGIN { exit !(r <= 1e-3) }'; then
        gen_row "$name" fp32 "$ma" "$mr" "1e-3" "PASS (same tokens)"
        rr_verdict "PASS (same tokens, max abs $ma, max rel $mr)"
        return 0
    fi
    gen_row "$name" fp32 "$ma" "$mr" "1e-3" "FAIL: logits beyond 1e-3"
    rr_verdict "FAIL: max rel $mr"
    return 1
}

# Batch invariance of the chunked GDN scan on the GPU: test_batch_invariance on the family
# checkpoint with the state grid 16 (the scheduler's cuts and the scan's chunks), each request
# alone, then all at once, reversed, staggered and a third (budgets 512, 128, 97, 40): every
# token's logits bit for bit.
row_gdn_invariance() { # family
    local inv="$tbin/test_batch_invariance" out="$RR_DIR/inv-gdn-$1.txt" irc n nd
    local name="batch invariance, cuda:0, gdn $1"
    [ -x "$inv" ] || { rr_verdict "skipped: test_batch_invariance not built"; return 77; }
    KVF_TEST_SOURCE_DIR="$data" KVF_INVARIANCE_DEVICE=cuda:0 KVF_MAMBA_SCAN=chunked \
        KVF_INVARIANCE_MODEL="$data/tests/data/families/$1" KVF_INVARIANCE_STATE_GRID=16 \
        KVF_INVARIANCE_PICK=0,1,2,3 "$inv" >"$out" 2>&1
    irc=$?
    n=$(grep -c 'differ from their solo run' "$out")
    nd=$(grep 'differ from their solo run' "$out" | grep -vc ' 0 differ from')
    if [ "$irc" -eq 0 ] && [ "$n" -gt 0 ] && [ "$nd" -eq 0 ] && grep -q 'PASSED' "$out"; then
        gen_row "$name" "-" "-" "$n compositions, 0 requests differ" bits PASS
        return 0
    fi
    gen_row "$name" "-" "-" "$nd of $n compositions differ" bits "FAIL (exit $irc)"
    grep 'differ from their solo run\|FAILED\|error' "$out" | tail -6
    rr_verdict "FAIL: $nd of $n compositions differ (exit $irc)"
    return 1
}
