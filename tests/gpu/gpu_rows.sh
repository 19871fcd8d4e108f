# shellcheck shell=bash disable=SC2154  # root, kvf, tbin, py, nano...: exported by run.sh
# The rows of tests/gpu/run.sh (sourced, not run): one function per kind of row, each run by
# rowrun.sh's rr_run_one in its own capped process. A row prints its table lines on stdout,
# sends the programs' outputs to files in $RR_DIR (gpu-logs/, kept), states its verdict with
# rr_verdict and exits 0 (PASS), 77 (skipped) or 1 (FAIL).
#
# Needs (exported by run.sh): $root (scripts), $data (models, configs), $kvf, $tbin (the test
# programs' folder), $py, $ngpu, $nixl_wheel, $nano (the 9B geometry's config), RR_DIR, RR_CAP_S.

gen_row() { printf '| %-28s | %-5s | %-12s | %-12s | %-7s | %s |\n' "$@"; }

need_kvf() { # a row that runs kvf: skipped when it is not built
    [ -x "$kvf" ] && return 0
    rr_verdict "skipped: kvf not built ($kvf)"
    exit 77
}

# gpu_vs_cpu: every CUDA kernel against its CPU twin; 77 (no GPU) stops the table
row_kernels() {
    local out="$RR_DIR/kernels.txt" rc
    [ -x "$tbin/gpu_vs_cpu" ] || { rr_verdict "FAIL: $tbin/gpu_vs_cpu not built"; return 1; }
    "$tbin/gpu_vs_cpu" >"$out" 2>&1
    rc=$?
    if [ "$rc" -eq 77 ]; then
        sed -n 's/^skipped: no GPU (\(.*\))$/\1/p' "$out" >"$RR_DIR/no-gpu"
        rr_verdict "skipped: no GPU ($(cat "$RR_DIR/no-gpu"))"
        return 77
    fi
    grep -v '^gpu_vs_cpu: ' "$out"
    grep '^gpu_vs_cpu: ' "$out"
    [ "$rc" -eq 0 ] && return 0
    [ "$rc" -eq 1 ] && { rr_verdict "FAIL: a kernel differs from its CPU twin"; return 1; }
    rr_verdict "FAIL: gpu_vs_cpu exited $rc (crash)"
    return 1
}

# the tiled CUDA attention against the per-token one, bit for bit, with each one's time
row_attn_tiled() {
    local out="$RR_DIR/attn.txt" rc
    [ -x "$tbin/attn_tiled_vs_pertoken" ] ||
        { rr_verdict "skipped: attn_tiled_vs_pertoken not built"; return 77; }
    "$tbin/attn_tiled_vs_pertoken" >"$out" 2>&1
    rc=$?
    grep -v '^attn_tiled_vs_pertoken: ' "$out"
    [ "$rc" -eq 0 ] || rr_verdict "FAIL: exit $rc"
    return "$rc"
}

# max |gpu - cpu| and max |gpu - cpu| / (1 + |cpu|) over the logits lines of two outputs
logit_diffs() {
    paste -d'\n' <(grep '^logits ' "$1") <(grep '^logits ' "$2") | awk '
        NR % 2 == 1 { n = split($0, c, " "); next }
        { k = split($0, g, " "); if (k != n) { bad = 1 }
          for (i = 4; i <= n; i++) { d = g[i] - c[i]; if (d < 0) d = -d
              a = c[i] < 0 ? -c[i] : c[i]; if (d > ma) ma = d
              if (d / (1 + a) > mr) mr = d / (1 + a) }
          lines++ }
        END { if (bad || lines == 0) print "bad"; else printf "%.3g %.3g\n", ma, mr }'
}

# kvf generate on the GPU against the CPU, greedy, 16 tokens past EOS: tokens equal and every
# logit within 1e-3 (relative to 1 + |cpu|); TP 2 puts ranks on cuda:0 and cuda:1 (NCCL).
# KVF_GPU_WEIGHTS=exact: the fixed-order GEMM that gives the CPU's bits (the default's
# tensor-core GEMM is checked by row_greedy_default, by tokens).
# The GPU output stays in $RR_DIR/gen-MODEL-tpN-gpu.txt for the graphs rows.
row_generate() { # model tp
    local m=$1 tp=$2 name="generate cuda: $1" c g rc_c rc_g diffs ma mr
    need_kvf
    [ "$tp" -gt 1 ] && name="gen cuda tp$tp: $m"
    if [ "$tp" -gt "${ngpu:-1}" ]; then
        rr_verdict "skipped: TP $tp needs $tp GPUs, this machine has ${ngpu:-1}"
        return 77
    fi
    "$kvf" generate --help 2>&1 | grep -q -- '--device' ||
        { rr_verdict "FAIL: kvf generate has no --device"; return 1; }
    local args=(generate --model "$data/models-trained/$m" --prompt "12+34=" --max-tokens 16
                --ignore-eos yes --print-logits yes --kv-dtype fp32 --tp "$tp")
    c="$RR_DIR/gen-$m-tp$tp-cpu.txt" g="$RR_DIR/gen-$m-tp$tp-gpu.txt"
    "$kvf" "${args[@]}" --device cpu >"$c" 2>"$c.err"
    rc_c=$?
    KVF_GPU_WEIGHTS=exact "$kvf" "${args[@]}" --device cuda:0 >"$g" 2>"$g.err"
    rc_g=$?
    if [ "$rc_c" -ne 0 ] || [ "$rc_g" -ne 0 ]; then
        gen_row "$name" "fp32" "-" "-" "-" "FAIL (exit cpu $rc_c, gpu $rc_g)"
        tail -5 "$g.err" >&2
        rr_verdict "FAIL: exit cpu $rc_c, gpu $rc_g"
        return 1
    fi
    if [ "$(grep '^tokens:' "$c")" != "$(grep '^tokens:' "$g")" ]; then
        gen_row "$name" "fp32" "-" "-" "-" "FAIL: tokens differ"
        grep -h '^tokens:' "$c" "$g"
        rr_verdict "FAIL: tokens differ"
        return 1
    fi
    diffs=$(logit_diffs "$c" "$g")
    if [ "$diffs" = bad ]; then
        gen_row "$name" "fp32" "-" "-" "-" "FAIL: logits lines differ in shape"
        rr_verdict "FAIL: logits lines differ in shape"
        return 1
    fi
    read -r ma mr <<<"$diffs"
    if awk -v r="$mr" 'BEGIN { exit !(r <= 1e-3) }'; then
        gen_row "$name" "fp32" "$ma" "$mr" "1e-3" "PASS (same tokens)"
        rr_verdict "PASS (same tokens, max rel $mr)"
        return 0
    fi
    gen_row "$name" "fp32" "$ma" "$mr" "1e-3" "FAIL: logits differ"
    rr_verdict "FAIL: logits differ (max rel $mr)"
    return 1
}

# sampled on the GPU (the device sampler) against the CPU's sampler: same tokens, logprobs
# within 1e-3
row_generate_sampled() {
    local c="$RR_DIR/gen-sampled-cpu.txt" g="$RR_DIR/gen-sampled-gpu.txt" rc_c rc_g ma
    local name="generate cuda sampled: hybrid"
    need_kvf
    local args=(generate --model "$data/models-trained/tiny-hybrid" --prompt "12+34="
                --max-tokens 16 --ignore-eos yes --kv-dtype fp32 --temperature 0.9 --top-p 0.9
                --top-k 40 --seed 7 --logprobs 3)
    "$kvf" "${args[@]}" --device cpu >"$c" 2>&1
    rc_c=$?
    "$kvf" "${args[@]}" --device cuda:0 >"$g" 2>&1
    rc_g=$?
    if [ "$rc_c" -ne 0 ] || [ "$rc_g" -ne 0 ]; then
        gen_row "$name" "fp32" "-" "-" "-" "FAIL (exit cpu $rc_c, gpu $rc_g)"
        rr_verdict "FAIL: exit cpu $rc_c, gpu $rc_g"
        return 1
    fi
    if [ "$(grep '^tokens:' "$c")" != "$(grep '^tokens:' "$g")" ]; then
        gen_row "$name" "fp32" "-" "-" "-" "FAIL: tokens differ"
        rr_verdict "FAIL: tokens differ"
        return 1
    fi
    ma=$(paste -d' ' <(grep '^logprobs ' "$c" | sed 's/[0-9]*://g') \
                     <(grep '^logprobs ' "$g" | sed 's/[0-9]*://g') | awk '
        { h = NF / 2; for (i = 4; i <= h; i++) { d = $i - $(i + h); if (d < 0) d = -d
              if (d > m) m = d } n++ }
        END { if (n == 0) print "bad"; else printf "%.3g\n", m }')
    if [ "$ma" != bad ] && awk -v m="$ma" 'BEGIN { exit !(m <= 1e-3) }'; then
        gen_row "$name" "fp32" "$ma" "-" "1e-3" "PASS (same tokens)"
        return 0
    fi
    gen_row "$name" "fp32" "$ma" "-" "1e-3" "FAIL: logprobs differ"
    rr_verdict "FAIL: logprobs differ ($ma)"
    return 1
}

# KVF_GPU_ATTN=flashinfer (prompt tokens on FlashInfer's prefill, outputs on its decode,
# common/runtime/kvf_model_fi.c) against the CPU: a 256-token prompt in 64-token chunks
# (several query tiles, prompt chunks over cached KV), 16 greedy tokens past EOS, bf16 KV on
# both, KVF_GPU_WEIGHTS=exact so the attention is the one difference; tokens equal, logits
# within 5e-2 relative to 1 + |cpu| (q, P and the output are bf16 inside FlashInfer; the
# simulated path measured 2.6e-2 on the hybrid); FlashInfer must say it is in use.
# the random hybrid with a GQA group of 5 (the 9B's; FlashInfer's decode does not dispatch it:
# outputs on its prefill), made once into $RR_DIR with tiny-hybrid's tokenizer; prints its folder
gqa5_model() {
    local d="$RR_DIR/tiny-gqa5"
    if [ ! -f "$d/tokenizer.json" ]; then
        "$kvf" mkmodel --config "$data/tests/data/models/tiny-gqa5.config.json" --out "$d" \
            --seed 5 >"$RR_DIR/tiny-gqa5.err" 2>&1 || return 1
        cp "$data"/models-trained/tiny-hybrid/tokenizer*.json "$d/" || return 1
    fi
    echo "$d"
}

row_generate_fi() { # model (of models-trained, or tiny-gqa5)
    local m=$1 name="generate flashinfer: $1" c g rc_c rc_g diffs ma mr md
    local pf="$RR_DIR/fi-prompt.txt"
    need_kvf
    md="$data/models-trained/$m"
    if [ "$m" = tiny-gqa5 ]; then
        md=$(gqa5_model) || { rr_verdict "FAIL: kvf mkmodel tiny-gqa5"; return 1; }
    fi
    awk 'BEGIN { for (i = 0; i < 30; ++i) printf "%d+%d=%d ", i, i + 7, 2 * i + 7; print "" }' >"$pf"
    local args=(generate --model "$md" --prompt-file "$pf" --max-tokens 16
                --ignore-eos yes --print-logits yes --kv-dtype bf16 --max-batch-tokens 64)
    c="$RR_DIR/gen-fi-$m-cpu.txt" g="$RR_DIR/gen-fi-$m-gpu.txt"
    "$kvf" "${args[@]}" --device cpu >"$c" 2>"$c.err"
    rc_c=$?
    KVF_GPU_ATTN=flashinfer KVF_GPU_WEIGHTS=exact KVF_LOG_LEVEL=info "$kvf" "${args[@]}" \
        --device cuda:0 >"$g" 2>"$g.err"
    rc_g=$?
    if [ "$rc_c" -ne 0 ] || [ "$rc_g" -ne 0 ]; then
        gen_row "$name" bf16 "-" "-" "-" "FAIL (exit cpu $rc_c, gpu $rc_g)"
        tail -5 "$g.err" >&2
        rr_verdict "FAIL: exit cpu $rc_c, gpu $rc_g"
        return 1
    fi
    if ! grep -q 'FlashInfer (KVF_GPU_ATTN=flashinfer)' "$g.err"; then
        gen_row "$name" bf16 "-" "-" "-" "FAIL: FlashInfer not in use"
        rr_verdict "FAIL: FlashInfer not in use (a build without -DKVF_FLASHINFER=ON?)"
        return 1
    fi
    if [ "$(grep '^tokens:' "$c")" != "$(grep '^tokens:' "$g")" ]; then
        gen_row "$name" bf16 "-" "-" "-" "FAIL: tokens differ"
        grep -h '^tokens:' "$c" "$g"
        rr_verdict "FAIL: tokens differ"
        return 1
    fi
    diffs=$(logit_diffs "$c" "$g")
    if [ "$diffs" = bad ]; then
        gen_row "$name" bf16 "-" "-" "-" "FAIL: logits lines differ in shape"
        rr_verdict "FAIL: logits lines differ in shape"
        return 1
    fi
    read -r ma mr <<<"$diffs"
    if awk -v r="$mr" 'BEGIN { exit !(r <= 5e-2) }'; then
        gen_row "$name" bf16 "$ma" "$mr" "5e-2" "PASS (same tokens)"
        rr_verdict "PASS (same tokens, max rel $mr)"
        return 0
    fi
    gen_row "$name" bf16 "$ma" "$mr" "5e-2" "FAIL: logits differ"
    rr_verdict "FAIL: logits differ (max rel $mr)"
    return 1
}

# Greedy tokens of the default GPU forward (cuBLASLt) = the CPU's on both trained models
row_greedy_default() {
    need_kvf
    bash "$root/tests/gpu/greedy_gpu_cpu.sh" "$kvf"
    local rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || rr_verdict "FAIL: exit $rc"
    return "$rc"
}

# A test program of the GPU engine that prints its own table row and exits 0 / 1 / 77
row_prog() { # program
    local p="$tbin/$1" rc
    [ -x "$p" ] || { rr_verdict "skipped: $1 is not in this build ($p)"; return 77; }
    "$p"
    rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || rr_verdict "FAIL: $1 exited $rc"
    return "$rc"
}

# The GEMM micro-benchmark of the GPU engine's work (gemm_lt_bench: cuBLASLt against the
# scalar kernel, or the command in $KVF_GPU_GEMM_BENCH): its own lines, its exit status
# (77: skipped)
row_gemm() {
    local p="$tbin/gemm_lt_bench" rc
    if [ -n "${KVF_GPU_GEMM_BENCH:-}" ]; then
        bash -c "$KVF_GPU_GEMM_BENCH" >"$RR_DIR/gemm.txt" 2>&1
        rc=$?
    elif [ ! -x "$p" ]; then
        rr_verdict "skipped: no GEMM micro-benchmark in this build ($p; KVF_GPU_GEMM_BENCH)"
        return 77
    else
        "$p" >"$RR_DIR/gemm.txt" 2>&1
        rc=$?
    fi
    cat "$RR_DIR/gemm.txt"
    [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || rr_verdict "FAIL: exit $rc"
    return "$rc"
}

# The engine against transformers (tests/bench/engine_gpu.py), the 9B geometry first; its
# own budget is this row's cap less 20 s (the 9B checkpoint stays in gpu-logs/engine-geom)
row_engine() {
    local rc b=$(( ${RR_CAP_S:-150} - 20 ))
    need_kvf
    [ -f "$root/tests/bench/engine_gpu.py" ] ||
        { rr_verdict "skipped: tests/bench/engine_gpu.py absent"; return 77; }
    [ "$b" -lt 10 ] && b=10
    "$py" "$root/tests/bench/engine_gpu.py" --kvf "$kvf" --models geom,tiny-hybrid,tiny-dense \
        --budget "$b" --keep "$RR_DIR/engine-geom" --md "$RR_DIR/engine.md" 2>"$RR_DIR/engine.err"
    rc=$?
    tail -3 "$RR_DIR/engine.err" >&2
    [ "$rc" -eq 77 ] && { rr_verdict "skipped: $(tail -1 "$RR_DIR/engine.err")"; return 77; }
    [ "$rc" -eq 0 ] || rr_verdict "FAIL: engine_gpu.py exited $rc (gpu-logs/engine.err)"
    return "$rc"
}

# The issue's engine rows (engine_gpu.py --rows issue40): the 9B geometry (its checkpoint
# shared with the engine row) and a Llama-3-8B geometry of 4 layers (gpu-logs/
# engine-geom-llama), prefill of 8192 tokens, decode at batch 1, 16, 64 on 2048 tokens of
# context, against transformers bf16 sdpa, peak memory; its budget is this row's cap less 20 s
row_engine_issue() { # [flashinfer: FlashInfer's attention, on both geometries (the 9B's GQA
                     # group of 5 takes its prefill kernel for output tokens too)]
    local rc b=$(( ${RR_CAP_S:-240} - 20 )) f="engine-issue${1:+-$1}"
    local extra=()
    [ "${1:-}" = flashinfer ] && extra=(--attn flashinfer)
    need_kvf
    [ -f "$root/tests/bench/engine_gpu.py" ] ||
        { rr_verdict "skipped: tests/bench/engine_gpu.py absent"; return 77; }
    [ "$b" -lt 10 ] && b=10
    "$py" "$root/tests/bench/engine_gpu.py" --kvf "$kvf" --rows issue40 --llama-layers 4 \
        --budget "$b" --keep "$RR_DIR/engine-geom" --md "$RR_DIR/$f.md" "${extra[@]}" \
        2>"$RR_DIR/$f.err"
    rc=$?
    tail -3 "$RR_DIR/$f.err" >&2
    [ "$rc" -eq 77 ] && { rr_verdict "skipped: $(tail -1 "$RR_DIR/$f.err")"; return 77; }
    [ "$rc" -eq 0 ] || rr_verdict "FAIL: engine_gpu.py --rows issue40 ${extra[*]} exited $rc" \
                                  "(gpu-logs/$f.err)"
    return "$rc"
}

# one transfer row from kvf xfer-test's or kvf bench's output: bytes, GB/s, descriptors per
# pull (and for the decode rank the post line names), host post time per descriptor and the
# path that ran; returns 1 when it is not a PASS
# A same-node pull's host work (start_pull, the slowest rank per descriptor: the post line)
# and its rate as a fraction of the device's copy rate: bench's copy limit (one
# device-to-device copy of the same bytes), else its raw contiguous GET (one cuMemcpyDtoD on
# one GPU); under 0.8, where the pull's time goes.
ipc_share() { # bench output
    local out=$1 h t rate raw
    h=$(sed -n 's/^post: [0-9]* descriptors, \([0-9.]*\) us,.*/\1/p' "$out" | head -1)
    t=$(sed -n 's/^transfer time: \([0-9.]*\) ms, \([0-9.]*\) GB\/s.*/\1 \2/p' "$out" | head -1)
    raw=$(sed -n 's/^copy limit (one device-to-device.*, \([0-9.]*\) GB\/s.*/\1/p' "$out" | head -1)
    [ -n "$raw" ] ||
        raw=$(sed -n 's/^raw contiguous GET: .* \([0-9.]*\) GB\/s.*/\1/p' "$out" | head -1)
    rate=${t#* }
    t=${t%% *}
    awk -v h="${h:-0}" -v t="${t:-0}" -v r="${rate:-0}" -v c="${raw:-0}" 'BEGIN {
        printf "host %.1f us/pull", h
        if (c <= 0) { printf ", no copy rate (no copy limit or raw GET line)"; exit }
        f = r / c
        printf ", %.2f of the copy rate (%.1f of %.1f GB/s)", f, r, c
        if (f < 0.8 && t > 0)
            printf "; below 0.8: host %.1f%% of the %.3f ms pull, the gather kernel the rest" \
                   " (%.3f ms vs %.3f ms for one copy)", 100 * h / (1000 * t), t, t - h / 1000,
                   t * f }'
}

xfer_row() { # name, output file, exit code, dtype
    local name=$1 out=$2 rc=$3 dt=$4 a b p d r
    if [ "$rc" -eq 0 ] && grep -q '^verify: ok' "$out"; then
        a=$(sed -n 's/^transfer: \([0-9]*\) bytes.*/\1 B/p' "$out" | head -1)
        b=$(sed -n 's/^transfer time: .* ms, \([0-9.]*\) GB\/s.*/\1 GB\/s/p' "$out" | head -1)
        d=$(sed -n 's/^transfer: [0-9]* bytes, \([0-9]*\) descriptors.*/\1/p' "$out" | head -1)
        r=$(sed -n 's/^post: \([0-9]*\) descriptors.*/\1/p' "$out" | head -1)
        p=$(sed -n 's/^post: .*, \([0-9.]*\) us\/desc.*/\1 us\/desc/p' "$out" | head -1)
        [ -n "$d" ] && b="$b, $d descs/pull${r:+ ($r/rank)}"
        [ -n "$p" ] && b="$b, post $p"
        grep -q '^path: ' "$out" && b="$b, path $(sed -n 's/^path: //p' "$out" | head -1)"
        grep -q '^path: cuda-ipc' "$out" && b="$b; $(ipc_share "$out")"
        gen_row "$name" "$dt" "$a" "$b" "-" "PASS (bytes verified)"
        rr_verdict "PASS (bytes verified; $b)"
        return 0
    elif grep -q 'this UCX cannot register it\|cannot reach cuda memory' "$out"; then
        gen_row "$name" "$dt" "-" "-" "-" "FAIL: not run, UCX without CUDA"
        rr_verdict "FAIL: not run, UCX without CUDA"
    else
        gen_row "$name" "$dt" "-" "-" "-" "FAIL (exit $rc)"
        grep -i 'error\|FAIL\|refused' "$out" | tail -3
        rr_verdict "FAIL (exit $rc)"
    fi
    return 1
}

# kvf bench on the 9B geometry, 8k tokens, GPU pools, bytes verified; PATH auto/ucx/ipc. The
# 4p2d rows write the descriptor list (--descs-out) the nixl row reads.
row_bench() { # layout path
    local lay=$1 p=$2 out="$RR_DIR/bench-$1-$2.txt" extra=()
    need_kvf
    if [ "$p" != auto ]; then
        "$kvf" bench --help 2>&1 | grep -q -- '--path' ||
            { rr_verdict "skipped: kvf bench has no --path"; return 77; }
        extra=(--path "$p")
    fi
    [ "$lay" = 4p2d ] && [ ! -s "$RR_DIR/descs-4p2d.json" ] &&
        extra+=(--descs-out "$RR_DIR/descs-4p2d.json")
    "$kvf" bench --model "$nano" --layout "$lay" --tokens 8192 --iters 5 --verify yes \
        --device cuda:0 "${extra[@]}" >"$out" 2>&1
    xfer_row "bench 9B $lay 8k, path $p" "$out" $? bf16
}

# NIXL on the same descriptors (GPU memory on both sides) and the GPU's own copy rate on as
# many bytes (tests/gpu/nixl_vram.py); the descriptors are the planner's, the same for any
# device, so a CPU run writes them when no 4p2d GPU row did
row_nixl() {
    local d="$RR_DIR/descs-4p2d.json" out="$RR_DIR/nixl.txt" pypath="" nrc c n why
    need_kvf
    [ -s "$d" ] || "$kvf" bench --model "$nano" --layout 4p2d --tokens 8192 --iters 1 \
        --device cpu --copy-limit no --descs-out "$d" >"$RR_DIR/descs.txt" 2>&1
    if [ ! -s "$d" ]; then
        gen_row "NIXL READ VRAM, 9B 4p2d 8k" "-" "-" "-" "-" "FAIL: no descriptor file"
        rr_verdict "FAIL: no descriptor file (gpu-logs/descs.txt)"
        return 1
    fi
    if [ -n "$nixl_wheel" ]; then
        mkdir -p "$RR_DIR/nixl"
        "$py" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
            "$nixl_wheel" "$RR_DIR/nixl" && pypath="$RR_DIR/nixl"
    fi
    PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}" "$py" "$root/tests/gpu/nixl_vram.py" "$d" \
        --timeout $(( ${RR_CAP_S:-90} * 2 / 3 )) >"$out" 2>&1
    nrc=$?
    c=$(sed -n 's/^copy: .*, \([0-9.]*\) GB\/s.*/\1 GB\/s/p' "$out")
    [ -n "$c" ] && gen_row "GPU copy, same bytes" "-" "contiguous" "$c" "-" "reference"
    # "nixl: ... N descriptors, B bytes, median T ms, R GB/s, post P us/desc, ..."
    n=$(awk '/^nixl: .* descriptors, / { for (i = 1; i <= NF; i++) {
                if ($(i + 1) ~ /^bytes/) b = $i; if ($(i + 1) ~ /^GB/) r = $i
                if ($(i + 1) ~ /^descriptors/) d = $i; if ($i == "post") p = $(i + 1) }
              printf "%s B|%s GB/s, %s descs/pull, post %s us/desc\n", b, r, d, p }' "$out")
    if [ "$nrc" -eq 0 ] && [ -n "$n" ]; then
        gen_row "NIXL READ VRAM, 9B 4p2d 8k" bf16 "${n%%|*}" "${n#*|}" "-" "PASS (bytes verified)"
        rr_verdict "PASS (bytes verified; ${n#*|}${c:+; copy $c})"
        return 0
    elif [ "$nrc" -eq 77 ]; then
        why=$(sed -n 's/^nixl: skipped //p' "$out")
        rr_verdict "skipped: ${why:-nixl_vram.py said skip}"
        return 77
    fi
    gen_row "NIXL READ VRAM, 9B 4p2d 8k" "-" "-" "-" "-" "FAIL (exit $nrc)"
    tail -5 "$out" >&2
    rr_verdict "FAIL: nixl_vram.py exited $nrc"
    return 1
}

# the 1p1d pool with both daemons on cuda:0 against colocated answers (tests/gpu/pool_gpu.sh)
row_pool() {
    local prc line
    need_kvf
    KVF_POOL_GPU_TIMEOUT=$(( ${RR_CAP_S:-100} - 10 )) KVF_BIN_DIR=$(dirname "$kvf") \
        bash "$root/tests/gpu/pool_gpu.sh" --device cuda:0 \
        --model "$data/models-trained/tiny-hybrid" >"$RR_DIR/pool.txt" 2>&1
    prc=$?
    line=$(grep '^pool-gpu: ' "$RR_DIR/pool.txt" | tail -1)
    if [ "$prc" -eq 0 ] && [ -n "$line" ]; then
        gen_row "1p1d pool on cuda:0" bf16 "-" "${line#pool-gpu: }" "-" "PASS (= colocated)"
        return 0
    fi
    gen_row "1p1d pool on cuda:0" bf16 "-" "${line#pool-gpu: }" "-" "FAIL (exit $prc)"
    tail -8 "$RR_DIR/pool.txt" >&2
    rr_verdict "FAIL: pool_gpu.sh exited $prc"
    return 1
}

# batch invariance of the GPU engine: every request alone and in 8 batch compositions, bits
# for bit; with an argument, KVF_GPU_ATTN=that (flashinfer: prompt tokens on FlashInfer's
# prefill, outputs on its decode, so mixed steps and a recompute go through both)
row_invariance() { # [attention [tiny-gqa5: that model, not tiny-hybrid]]
    local inv="$tbin/test_batch_invariance" out="$RR_DIR/inv${1:+-$1}${2:+-$2}.txt" irc n nd
    local name="batch invariance, cuda:0${1:+, $1}${2:+, $2}" md=""
    [ -x "$inv" ] || { rr_verdict "skipped: test_batch_invariance not built"; return 77; }
    if [ "${2:-}" = tiny-gqa5 ]; then
        need_kvf
        md=$(gqa5_model) || { rr_verdict "FAIL: kvf mkmodel tiny-gqa5"; return 1; }
    fi
    KVF_GPU_ATTN="${1:-}" KVF_TEST_SOURCE_DIR="$data" KVF_INVARIANCE_DEVICE=cuda:0 \
        KVF_INVARIANCE_MODEL="$md" "$inv" >"$out" 2>&1
    irc=$?
    n=$(grep -c 'differ from their solo run' "$out")
    nd=$(grep 'differ from their solo run' "$out" | grep -vc ' 0 differ from')
    if [ -n "${1:-}" ] && ! grep -q "KVF_GPU_ATTN=$1" "$out"; then
        gen_row "$name" bf16 "-" "KVF_GPU_ATTN=$1 not in use" bits "FAIL (exit $irc)"
        rr_verdict "FAIL: KVF_GPU_ATTN=$1 not in use (exit $irc)"
        return 1
    fi
    if [ "$irc" -eq 0 ] && grep -q 'PASSED' "$out"; then
        gen_row "$name" bf16 "-" "$n compositions, 0 requests differ" bits PASS
        return 0
    fi
    gen_row "$name" bf16 "-" "$nd of $n compositions differ" bits "FAIL (exit $irc)"
    grep 'differ from their solo run\|FAILED\|error' "$out" | tail -6
    rr_verdict "FAIL: $nd of $n compositions differ (exit $irc)"
    return 1
}

# a GPU->GPU pull between two processes, block sizes 80 -> 96, every byte verified
row_xfer() {
    need_kvf
    "$kvf" xfer-test --help 2>&1 | grep -q -- '--device' ||
        { rr_verdict "FAIL: kvf xfer-test has no --device"; return 1; }
    "$kvf" xfer-test --model "$data/tests/data/models/tiny-hybrid.config.json" --layout 4p2d \
        --prefill-block-size 80 --decode-block-size 96 --tokens 333 --device cuda:0 \
        >"$RR_DIR/xfer.txt" 2>&1
    xfer_row "xfer GPU->GPU pull, 4p2d 80->96" "$RR_DIR/xfer.txt" $? bf16
}

# CUDA graphs of decode steps against eager on the same build and settings, the default ones
# (16-bit weights on tensor cores, bf16 KV: what graphs by default would run) and the exact
# mode (KVF_GPU_WEIGHTS=exact, fp32 KV): tokens and every logit bit for bit, 13 replays of
# one recorded graph. Both PASS on a GPU is what KVF_GPU_GRAPHS=decode by default waits on.
row_graphs_generate() { # model [its folder; default: models-trained/MODEL]
    local m=$1 out="$RR_DIR/gen-graphs-$1" rc rc2 counts mode fails=0 cells=""
    local name="generate cuda graphs: $1" md=${2:-$data/models-trained/$1}
    need_kvf
    for mode in default exact; do
        local args=(generate --model "$md" --prompt "12+34=" --max-tokens 16
                    --ignore-eos yes --print-logits yes --tp 1 --device cuda:0)
        local env=(env -u KVF_GPU_WEIGHTS -u KVF_GPU_ATTN)
        [ "$mode" = exact ] && { args+=(--kv-dtype fp32); env+=(KVF_GPU_WEIGHTS=exact); }
        "${env[@]}" KVF_GPU_GRAPHS=off "$kvf" "${args[@]}" >"$out-$mode-eager.txt" 2>&1
        rc=$?
        "${env[@]}" KVF_GPU_GRAPHS=decode KVF_LOG_LEVEL=info "$kvf" "${args[@]}" \
            >"$out-$mode.txt" 2>"$out-$mode.err"
        rc2=$?
        counts=$(sed -n 's/.*CUDA graphs of decode steps: \([0-9]*\) recorded, \([0-9]*\) replays, \([0-9]*\) failed.*/\1 rec \2 replays \3 failed/p' \
                 "$out-$mode.err" | tail -1)
        if [ "$rc" -ne 0 ] || [ "$rc2" -ne 0 ]; then
            cells="$cells $mode: exit eager $rc graphs $rc2;"
            fails=$((fails + 1))
        elif ! cmp -s <(grep -E '^(tokens:|logits )' "$out-$mode-eager.txt") \
                      <(grep -E '^(tokens:|logits )' "$out-$mode.txt"); then
            cells="$cells $mode: not the eager output (${counts:-no count});"
            fails=$((fails + 1))
        elif [ "$counts" != "1 rec 13 replays 0 failed" ]; then
            cells="$cells $mode: not replayed (${counts:-no count});"
            fails=$((fails + 1))
        else
            cells="$cells $mode: = eager;"
        fi
    done
    if [ "$fails" -eq 0 ]; then
        gen_row "$name" "bf16/fp32" "-" "1 rec 13 replays" "-" "PASS (= eager, bits, default and exact)"
        return 0
    fi
    gen_row "$name" "bf16/fp32" "-" "-" "-" "FAIL:$cells"
    rr_verdict "FAIL:$cells"
    return 1
}

# where a GPU step's time goes (kvf bench-model --profile), the trained hybrid, prompt 1000;
# batch B ("16s": sampled on the device); the top rows of each phase (the whole table in the log)
row_profile() { # batch
    local b=$1 samp=() out="$RR_DIR/profile-b$1.txt" prc
    need_kvf
    [ "$b" = 16s ] && samp=(--temperature 0.8 --top-p 0.9)
    "$kvf" bench-model --device cuda:0 --model "$data/models-trained/tiny-hybrid" \
        --prompt-len 1000 --decode-tokens 32 --batch "${b%s}" --warmup yes --profile yes \
        "${samp[@]}" >"$out" 2>&1
    prc=$?
    echo "step profile, tiny-hybrid on cuda:0, batch ${b%s}${samp:+, ${samp[*]}} (exit $prc):"
    awk '/ tok\/s/ {print} /^profile / {n = 0; print; next} /^  / && n++ < 9 {print}' "$out"
    [ "$prc" -eq 0 ] || rr_verdict "FAIL: exit $prc"
    return "$prc"
}

# decode tok/s with CUDA graphs off and on (kvf bench-model, prompt 128, 64 tokens)
row_graphs_speed() { # model batch
    local m=$1 b=$2 g t line="graphs tok/s: $1 batch $2:" bad=0 o
    need_kvf
    for g in off decode; do
        o="$RR_DIR/graphs-$m-b$b-$g.txt"
        KVF_LOG_LEVEL=info KVF_GPU_GRAPHS=$g "$kvf" bench-model --device cuda:0 \
            --model "$data/models-trained/$m" --prompt-len 128 --decode-tokens 64 --batch "$b" \
            --warmup yes >"$o" 2>&1 || bad=1
        t=$(sed -n 's/.*decode [0-9]* tokens \([0-9.]*\) tok\/s.*/\1/p' "$o" | tail -1)
        [ -n "$t" ] || bad=1
        line="$line graphs $g ${t:-FAIL}"
    done
    # the recordings and replays the graphed run counted (0 replays: it ran eagerly)
    line="$line ($(sed -n 's/.*CUDA graphs of decode steps: \([0-9]*\) recorded, \([0-9]*\) replays, \([0-9]*\) failed.*/\1 recorded, \2 replays, \3 failed captures/p' \
        "$RR_DIR/graphs-$m-b$b-decode.txt" | tail -1))"
    echo "$line"
    [ "$bad" -eq 0 ] || rr_verdict "FAIL: a run gave no decode tok/s"
    return "$bad"
}
