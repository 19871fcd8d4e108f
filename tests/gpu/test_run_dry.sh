#!/usr/bin/env bash
# tests/gpu/run.sh on the CPU, with a fake GPU layer: a stub nvidia-smi and ucx_info on PATH, a
# fake build folder (KVF_GPU_BUILD_DIR) whose kvf, gpu_vs_cpu, attn_tiled_vs_pertoken and
# test_batch_invariance print what the real ones print on a GPU, and a stub Python
# (KVF_GPU_PYTHON) for the torch/NIXL probes, engine_gpu.py and nixl_vram.py. A stub hangs
# (sleeps until killed) when its arguments contain $FAKE_HANG, after touching $FAKE_DIR/hanging.
# Proves, so the script cannot break in a short GPU window:
#   1. the preflight comes first and names what is missing; rows run in the issue's order;
#   2. each row's lines and verdict are in gpu-results.txt while later rows still run
#      (checked while a later row hangs), each row's log is kept in gpu-logs/;
#   3. a hanging row reports its cap and the next row runs (and PASSes);
#   4. the budget ends the script in time: the row running is cut, the rest "not reached";
#   5. the summary has one line per row (PASS / FAIL / skipped: why / not reached);
#   6. no GPU (nvidia-smi lists none, or gpu_vs_cpu says so): "skipped: no GPU", exit 77;
#   7. KVF_GPU_ROWS runs the kernels row and the rows it names, in the table's order.
# Every wait polls (50 ms steps) with a deadline; nothing sleeps a fixed time; each run of
# run.sh is bounded by `timeout 60` (a runner that stopped capping rows fails, never hangs).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { # description, then a command that must succeed
    local what=$1
    shift
    if "$@"; then
        echo "ok: $what"
    else
        echo "FAIL: $what"
        fails=$((fails + 1))
    fi
}

# ---- the fake GPU layer --------------------------------------------------------------------
mkdir -p "$tmp/path" "$tmp/build/bin" "$tmp/build/tests/bin"
hang_prelude='for a in "$@"; do :; done
if [ -n "${FAKE_HANG:-}" ] && [[ "$0 $*" == *"$FAKE_HANG"* ]]; then
    touch "$FAKE_DIR/hanging"; exec sleep 300
fi'
cat >"$tmp/path/nvidia-smi" <<EOF
#!/usr/bin/env bash
$hang_prelude
[ -n "\${FAKE_NO_GPU_LISTED:-}" ] && exit 9
case "\$*" in
-L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-fake)" ;;
*--query-gpu*) echo "0, NVIDIA H100 80GB HBM3, 570.00, 81559 MiB" ;;
*) echo "| NVIDIA-SMI 570.00   Driver Version: 570.00   CUDA Version: 13.0 |" ;;
esac
EOF
cat >"$tmp/path/ucx_info" <<'EOF'
#!/usr/bin/env bash
printf '#      Transport: %s\n' posix sysv cuda_copy cuda_ipc
EOF
cat >"$tmp/build/tests/bin/gpu_vs_cpu" <<EOF
#!/usr/bin/env bash
$hang_prelude
[ -n "\${FAKE_NO_DEVICE:-}" ] && { echo "skipped: no GPU (cudaGetDeviceCount failed)"; exit 77; }
echo "| matmul fp32 | 0 | 0 | PASS |"
echo "gpu_vs_cpu: all PASS"
EOF
cat >"$tmp/build/tests/bin/attn_tiled_vs_pertoken" <<EOF
#!/usr/bin/env bash
$hang_prelude
echo "| prefill 512 | bits equal | 1.9x | PASS |"
EOF
cat >"$tmp/build/tests/bin/test_batch_invariance" <<EOF
#!/usr/bin/env bash
$hang_prelude
[ -n "\${KVF_GPU_ATTN:-}" ] && echo "attention: FlashInfer (KVF_GPU_ATTN=\$KVF_GPU_ATTN)"
for i in 1 2 3 4 5 6 7 8; do echo "composition \$i: 0 differ from their solo run"; done
echo "[  PASSED  ] 8 test(s)."
EOF
cat >"$tmp/build/bin/kvf" <<EOF
#!/usr/bin/env bash
$hang_prelude
sub=\$1
shift
case " \$* " in *" --help "*) echo "--device --path --descs-out"; exit 0 ;; esac
case \$sub in
generate)
    echo "tokens: 5 6 7"
    case " \$* " in *" --print-logits yes "*)
        echo "logits step 0: 0.5 -1.25"; echo "logits step 1: 0.25 2.0" ;; esac
    case " \$* " in *" --logprobs "*) echo "logprobs step 0: 5:-0.1 7:-2.3" ;; esac
    [ "\${KVF_GPU_GRAPHS:-}" = decode ] &&
        echo "CUDA graphs of decode steps: 1 recorded, 13 replays, 0 failed captures" >&2
    [ "\${KVF_GPU_ATTN:-}" = flashinfer ] &&
        echo "attention: FlashInfer (KVF_GPU_ATTN=flashinfer): prompt tokens on its prefill" >&2
    exit 0 ;;
bench|xfer-test)
    while [ \$# -gt 0 ]; do
        [ "\$1" = --descs-out ] && echo '{"layout": "4p2d", "reads": []}' >"\$2"
        shift
    done
    echo "transfer: 277766144 bytes, 688 descriptors (GET operations)"
    case " \$* " in
    *" --path ucx "*) echo "path: ucx (fake)" ;;
    *) echo "path: cuda-ipc (same node, one gather of 688 ranges)"
       echo "raw contiguous GET: 277766144 bytes in 0.600 ms, 462.9 GB/s (median)"
       echo "copy limit (one device-to-device copy of the same bytes on cuda:0): 0.300 ms, 925.9 GB/s (median); kv/copy 0.600" ;;
    esac
    echo "transfer time: 0.500 ms, 555.5 GB/s (median)"
    echo "post: 344 descriptors, 100.0 us, 0.290 us/desc"
    echo "verify: ok"
    exit 0 ;;
mkmodel)
    while [ \$# -gt 0 ]; do [ "\$1" = --out ] && mkdir -p "\$2"; shift; done
    exit 0 ;;
bench-model)
    echo "prefill 1000 tokens 9000.0 tok/s, decode 32 tokens 300.0 tok/s"
    [ "\${KVF_GPU_GRAPHS:-}" = decode ] &&
        echo "CUDA graphs of decode steps: 1 recorded, 30 replays, 0 failed captures" >&2
    exit 0 ;;
esac
echo "kvf (stub): unknown command \$sub" >&2
exit 2
EOF
cat >"$tmp/python" <<EOF
#!/usr/bin/env bash
$hang_prelude
case "\${1:-}" in
-c) case "\$2" in
    *"import torch"*) echo "2.9.0 cuda True" ;;
    *nixl*) echo "nixl_cu13" ;;
    esac
    exit 0 ;;
-) cat >/dev/null; exit 1 ;;
*engine_gpu.py) echo "| geom bf16 b1 | 1000 tok/s | 900 tok/s | 1.11 |"; exit 0 ;;
*nixl_vram.py)
    echo "copy: device-to-device 277766144 bytes, median 0.1 ms, 2500.0 GB/s (bytes counted once)"
    echo "nixl: nixl_cu13 0.7 READ VRAM->VRAM 4p2d, 8 reads, 688 descriptors, 277766144 bytes, median 0.300 ms, 925.9 GB/s, post 1.10 us/desc, UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y, verify ok"
    exit 0 ;;
esac
exit 3
EOF
chmod +x "$tmp"/path/* "$tmp"/build/bin/* "$tmp"/build/tests/bin/* "$tmp/python"

export PATH="$tmp/path:$PATH" KVF_GPU_BUILD_DIR="$tmp/build" KVF_GPU_PYTHON="$tmp/python"
export KVF_GPU_SKIP_EXIT=77 FAKE_DIR="$tmp"
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
wait_for() { # deadline_ms, command: polls every 50 ms until it succeeds or the deadline passes
    local end=$(($(now_ms) + $1))
    shift
    until "$@"; do
        [ "$(now_ms)" -ge "$end" ] && return 1
        sleep 0.05
    done
}

# the rows, in the order the issue asks for (the table in run.sh)
order="kernels attn-tiled gen-hybrid gen-dense gen-hybrid-tp2 gen-sampled greedy-default
gemm-invariance gemm ssd fi-attention gen-fi-hybrid gen-fi-dense gen-fi-gqa5 engine engine-issue
engine-issue-fi pull-4p2d-ipc pull-4p2d-ucx nixl-4p2d pool-1p1d batch-invariance batch-invariance-fi
batch-invariance-fi-gqa5 graphs-hybrid graphs-dense gdn gen-gdn-qwen3-next gen-gdn-qwen3-5
batch-invariance-gdn-qwen3-next batch-invariance-gdn-qwen3-5 graphs-gdn-qwen3-5 xfer-4p2d-80-96
pull-4p2d-auto pull-1p4d-auto pull-4p1d-auto pull-2p2d-auto pull-1p1d-auto profile-b1 profile-b16 profile-b16s graphs-speed-tiny-hybrid-b1
graphs-speed-tiny-hybrid-b16 graphs-speed-tiny-dense-b1 graphs-speed-tiny-dense-b16"
order=$(echo $order)

# ---- run A: the whole table, the IPC pull hangs (cap 1 s by KVF_GPU_CAPS) ------------------
a="$tmp/a"
mkdir -p "$a"
t0=$(now_ms)
(cd "$a" && FAKE_HANG="--path ipc" KVF_GPU_CAPS="kernels=0,pull-4p2d-ipc=1" \
    timeout 60 bash "$root/tests/gpu/run.sh" >"$a/stdout" 2>&1; echo $? >"$a/rc") &
pid=$!
res="$a/gpu-results.txt"
check "the IPC pull row hangs (its stub started)" wait_for 20000 test -e "$tmp/hanging"
# streaming: while the hanging row runs, the rows before it are already in the results file
check "rows before the hang are in gpu-results.txt while it hangs" \
    grep -q '^row engine: PASS' "$res"
check "the hanging row's verdict is not written before its cap" \
    bash -c "! grep -q '^row pull-4p2d-ipc' '$res'"
check "the script still runs while the row hangs" kill -0 "$pid"
check "run A ends" wait_for 30000 test -s "$a/rc"
wait "$pid"
ta=$(( $(now_ms) - t0 ))
echo "run A: $ta ms, exit $(cat "$a/rc")"
check "run A exits 1 (the hang and the pool row FAIL)" test "$(cat "$a/rc")" = 1
check "the preflight comes before the first row" \
    bash -c "[ \$(grep -n '^preflight: done' '$res' | cut -d: -f1) -lt \$(grep -n '^row ' '$res' | head -1 | cut -d: -f1) ]"
check "the preflight names the GPU and the CUDA libraries" \
    bash -c "grep -q '^preflight: GPU: 0, NVIDIA H100' '$res' && grep -q '^preflight: libcublas.so.13: ' '$res' && grep -q 'one GPU: the TP 2 rows are skipped' '$res'"
check "the preflight lists UCX's transports" grep -q '^preflight: UCX transports (ucx_info -d): .*cuda_ipc' "$res"
got=$(sed -n 's/^row \([^:]*\): .*/\1/p' "$res" | tr '\n' ' ' | sed 's/ $//')
check "rows ran in the issue's order" test "$got" = "$order"
[ "$got" = "$order" ] || { echo "  want: $order"; echo "  got:  $got"; }
check "the hanging row reports its cap" grep -q '^row pull-4p2d-ipc: FAIL: cap 1 s reached' "$res"
check "a cap of 0 (no timeout to timeout(1)) is refused, the row keeps its own" \
    bash -c "grep -q 'KVF_GPU_CAPS kernels=0: not seconds > 0, row kernels keeps its cap 90 s' '$a/stdout' &&
             grep -q '^\[ *[0-9.]*s\] kernels: running (cap 90 s' '$a/stdout'"
check "the row after the hang runs and passes" grep -q '^row pull-4p2d-ucx: PASS (bytes verified' "$res"
check "the pull rows print descriptors per pull and per rank and post time per descriptor" \
    grep -q '^row pull-4p2d-ucx: PASS (bytes verified; 555.5 GB/s, 688 descs/pull (344/rank), post 0.290 us/desc, path ' "$res"
check "a same-node pull row prints its host work, its fraction of the copy rate and, under 0.8, where the time goes" \
    grep -q '^row pull-4p2d-auto: PASS (bytes verified; 555.5 GB/s, 688 descs/pull (344/rank), post 0.290 us/desc, path cuda-ipc (same node, one gather of 688 ranges); host 100.0 us/pull, 0.60 of the copy rate (555.5 of 925.9 GB/s); below 0.8: host 20.0% of the 0.500 ms pull, the gather kernel the rest (0.400 ms vs 0.300 ms for one copy))' "$res"
check "the nixl row reads the descriptors the UCX row wrote" \
    bash -c "test -s '$a/gpu-logs/descs-4p2d.json' && grep -q '^row nixl-4p2d: PASS (bytes verified; 925.9 GB/s, 688 descs/pull, post 1.10 us/desc; copy 2500.0 GB/s)' '$res'"
check "a row needing two GPUs says why it is skipped" \
    grep -q '^row gen-hybrid-tp2: skipped: TP 2 needs 2 GPUs, this machine has 1' "$res"
check "an absent GEMM micro-benchmark is a skip with its reason" \
    grep -q '^row gemm: skipped: no GEMM micro-benchmark' "$res"
check "the pool row FAILs (no daemons in the fake build) and says so" \
    grep -q '^row pool-1p1d: FAIL' "$res"
check "generate rows compare and pass" grep -q '^| generate cuda: tiny-hybrid .*PASS (same tokens)' "$res"
check "graphs rows compare graphs with their own eager runs (default and exact)" \
    grep -q '^| generate cuda graphs: tiny-dense .*PASS (= eager, bits, default and exact)' "$res"
check "the chunked GDN generate rows compare with the CPU and pass" \
    grep -q '^| generate cuda gdn chunked: qwen3.5 .*PASS (same tokens)' "$res"
check "the GDN batch-invariance rows pass" \
    grep -q '^| batch invariance, cuda:0, gdn qwen3-next .*PASS' "$res"
check "the GDN graphs row compares with its own eager runs" \
    grep -q '^| generate cuda graphs: qwen3.5 .*PASS (= eager, bits, default and exact)' "$res"
check "the FlashInfer generate rows compare with the CPU and pass" \
    grep -q '^| generate flashinfer: tiny-hybrid .*PASS (same tokens)' "$res"
check "the FlashInfer batch-invariance row runs under KVF_GPU_ATTN=flashinfer and passes" \
    grep -q '^| batch invariance, cuda:0, flashinfer .*PASS' "$res"
n_sum=$(sed -n '/^summary (/,$p' "$res" | grep -c '^  [a-z]')
check "the summary has one line per row ($n_sum)" test "$n_sum" = "$(echo "$order" | wc -w)"
check "every summary line is PASS, FAIL, skipped or not reached" \
    bash -c "! sed -n '/^summary (/,\$p' '$res' | grep '^  [a-z]' | grep -Ev '^  [a-z0-9-]+ +(PASS|FAIL|skipped: |not reached)'"
check "every row that ran kept its log in gpu-logs/" \
    bash -c "for r in $order; do [ -e '$a/gpu-logs/'\$r.log ] || exit 1; done"
check "the terminal got what the results file got" \
    bash -c "grep -q '^row pull-4p2d-ucx: PASS' '$a/stdout' && grep -q '^  batch-invariance  *PASS' '$a/stdout'"
check "run A took under 20 s" test "$ta" -lt 20000

# ---- run B: a budget of 6 s, the engine row hangs with its own cap of 150 s -----------------
b="$tmp/b"
mkdir -p "$b"
rm -f "$tmp/hanging"
t0=$(now_ms)
# (KVF_GPU_ROWS: the engine row is reached within a second even on a loaded host)
(cd "$b" && FAKE_HANG="engine_gpu.py" KVF_GPU_BUDGET=6 \
    KVF_GPU_ROWS="gen-dense,engine,engine-issue,pull-4p2d-ipc,graphs-speed-tiny-dense-b16" \
    timeout 60 bash "$root/tests/gpu/run.sh" >"$b/stdout" 2>&1; echo $? >"$b/rc") &
pid=$!
check "run B ends" wait_for 20000 test -s "$b/rc"
wait "$pid"
tb=$(( $(now_ms) - t0 ))
echo "run B: $tb ms, exit $(cat "$b/rc")"
res="$b/gpu-results.txt"
check "run B ends within its 6 s budget" test "$tb" -lt 6500
check "the engine row is cut by the budget, not its 150 s cap" \
    grep -q '^row engine: FAIL: cap [0-9.]* s reached (budget)' "$res"
check "the rows after it are 'not reached (budget)' in the summary" \
    bash -c "sed -n '/^summary (/,\$p' '$res' | grep -q '^  pull-4p2d-ipc  *not reached (budget)' &&
             sed -n '/^summary (/,\$p' '$res' | grep -q '^  graphs-speed-tiny-dense-b16  *not reached (budget)'"
check "rows not reached did not run" bash -c "! grep -q '^row pull-4p2d-ipc' '$res'"

# ---- KVF_GPU_ROWS: only the rows named (and kernels) --------------------------------------
mkdir -p "$tmp/r"
(cd "$tmp/r" && KVF_GPU_ROWS="gen-fi-dense,batch-invariance-fi,graphs-dense" timeout 60 \
    bash "$root/tests/gpu/run.sh" >"$tmp/r/stdout" 2>&1)
got=$(sed -n 's/^row \([^:]*\): .*/\1/p' "$tmp/r/gpu-results.txt" | tr '\n' ' ' | sed 's/ $//')
check "KVF_GPU_ROWS runs the kernels row and the rows named, in the table's order" \
    test "$got" = "kernels gen-fi-dense batch-invariance-fi graphs-dense"

# ---- no GPU: nvidia-smi lists none; gpu_vs_cpu says none ------------------------------------
(cd "$tmp" && FAKE_NO_GPU_LISTED=1 bash "$root/tests/gpu/run.sh" >"$tmp/nogpu.txt" 2>&1)
rc=$?
check "nvidia-smi lists no GPU: skipped, exit 77" \
    bash -c "[ $rc = 77 ] && grep -q '^skipped: no GPU (nvidia-smi lists no GPU)' '$tmp/nogpu.txt'"
mkdir -p "$tmp/c"
(cd "$tmp/c" && FAKE_NO_DEVICE=1 bash "$root/tests/gpu/run.sh" >"$tmp/c/stdout" 2>&1)
rc=$?
check "gpu_vs_cpu finds no device: skipped after the kernels row, exit 77" \
    bash -c "[ $rc = 77 ] && grep -q '^skipped: no GPU (cudaGetDeviceCount failed)' '$tmp/c/stdout' &&
             ! grep -q '^row attn-tiled' '$tmp/c/gpu-results.txt'"

if [ "$fails" -ne 0 ]; then
    echo "--- run A results"; cat "$a/gpu-results.txt"
    echo "test_run_dry: $fails check(s) FAILED"
    exit 1
fi
echo "test_run_dry: PASS"
