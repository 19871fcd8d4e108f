#!/usr/bin/env bash
# The GPU path in one run (tests/gpu/README.md). On a machine with an NVIDIA GPU:
#   bash tests/gpu/run.sh [--bundle FILE [--nixl-wheel WHEEL]]
#   1. without --bundle: builds kvferry with CUDA into its own build dir (build-gpu-run/, or
#      reuses $KVF_GPU_BUILD_DIR without rebuilding: that is how ctest runs it); when cmake
#      cannot configure there, it builds gpu_vs_cpu alone with nvcc and cc
#      (build-gpu-run/standalone; no kvf then);
#      with --bundle FILE (deploy/gpu-bundle.sh's tarball): unpacks it into $KVF_GPU_WORK
#      (default /tmp/kvferry-gpu-run) and runs its programs, on a machine with nothing
#      installed but the NVIDIA driver; cuBLAS and NCCL, which the bundle does not carry, are
#      taken from $KVF_CUDA_LIBS, the Python's nvidia-cublas / nvidia-nccl wheels, or the CUDA
#      toolkit, and the table's first lines say from where;
#   2. runs every CUDA kernel against its CPU twin (gpu_vs_cpu: max abs diff per op and
#      dtype, and the stale-fp32 Mamba NaN case with block zeroing off and on), and the
#      tiled attention kernel against the per-token one (attn_tiled_vs_pertoken: outputs
#      bit for bit, the time of each),
#   3. runs `kvf generate --device cuda` against the CPU's tokens and logits (TP 1, and
#      TP 2 over two GPUs when there are two; one run sampled on the device with top-p,
#      top-k, a seed and logprobs), a 4p2d GPU->GPU pull (kvf xfer-test
#      --device cuda:0, bytes verified), `kvf bench --device cuda:0` on the
#      Nemotron-Nano-9B-v2 geometry (8k tokens; layouts 4p2d, 1p4d, 4p1d, 2p2d, 1p1d; each
#      path kvf offers: GB/s, host post time per descriptor, the path that ran), the GPU's own
#      copy rate and NIXL on the same descriptors (tests/gpu/nixl_vram.py; NIXL only with
#      --nixl-wheel or an installed nixl package), the 1p1d pool with both daemons on cuda:0
#      against colocated answers (tests/gpu/pool_gpu.sh), batch invariance of the GPU
#      engine, decode steps as CUDA graphs (KVF_GPU_GRAPHS=decode: the eager tokens and
#      logits, then decode tok/s with and without), where a GPU step's time goes
#      (kvf bench-model --profile), and the engine
#      benchmark against transformers (tests/bench/engine_gpu.py) when time is left,
# and prints one table. Budget: $KVF_GPU_BUDGET seconds in all (default 540; each step has
# its own timeout from what is left).
#
# Without a GPU (no nvidia-smi, nvidia-smi lists no GPU, or cudaGetDeviceCount fails)
# it prints "skipped: no GPU" and exits $KVF_GPU_SKIP_EXIT: 0 by hand, 77 under ctest
# (tests/gpu/CMakeLists.txt sets it, with SKIP_RETURN_CODE 77), so the suite reports
# the case SKIPPED and never counts it as passed. Exit 1 when any row FAILs.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
skip_exit=${KVF_GPU_SKIP_EXIT:-0}
budget=${KVF_GPU_BUDGET:-540}
start=$(date +%s)
bundle="" nixl_wheel=""
while [ $# -gt 0 ]; do
    case $1 in
    --bundle) bundle=${2:-}; shift 2 || { echo "run.sh: --bundle needs a file"; exit 2; } ;;
    --nixl-wheel) nixl_wheel=${2:-}; shift 2 || { echo "run.sh: --nixl-wheel needs a file"; exit 2; } ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)"; exit 2 ;;
    esac
done
[ -z "$bundle" ] || [ -f "$bundle" ] || { echo "run.sh: --bundle $bundle: no such file"; exit 2; }
[ -z "$nixl_wheel" ] || [ -f "$nixl_wheel" ] ||
    { echo "run.sh: --nixl-wheel $nixl_wheel: no such file"; exit 2; }

skip() {
    echo "skipped: no GPU ($1)"
    exit "$skip_exit"
}
left() { # seconds left of the budget, at least 10
    local l=$((budget - ($(date +%s) - start)))
    [ "$l" -lt 10 ] && l=10
    echo "$l"
}

command -v nvidia-smi >/dev/null 2>&1 || skip "nvidia-smi absent"
nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null || skip "nvidia-smi lists no GPU"

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
# Standalone build of gpu_vs_cpu alone (kernels/ + common/base's dtype and log + the test),
# for a GPU machine without kvferry's other build dependencies (UCX, ZeroMQ, ...): nvcc and
# the C compiler directly, OpenBLAS if present (else tests/gpu/shim's naive cblas_sgemm),
# NCCL if present. Prints the binary's path.
standalone() {
    local out=$1 nvcc cuda cc=${CC:-cc} objs=() defs=(-DKVF_HAVE_CUDA=1) libs=(-lcublas) f
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    cuda=$(dirname "$(dirname "$nvcc")")
    local inc=(-I"$root/kernels" -I"$root/common/base" -I"$cuda/include")
    local cus=("$root"/kernels/*.cu)
    mkdir -p "$out/obj"
    if [ -f "$cuda/include/nccl.h" ] || [ -f /usr/include/nccl.h ]; then
        defs+=(-DKVF_HAVE_NCCL=1)
        libs+=(-lnccl)
    else
        cus=("${cus[@]/*kvf_nccl_cuda.cu/}")
    fi
    if echo '#include <cblas.h>' | "$cc" -E -I/usr/include/openblas - >/dev/null 2>&1; then
        inc+=(-I/usr/include/openblas)
        libs+=(-lopenblas)
    else
        inc+=(-I"$root/tests/gpu/shim")
        "$cc" -O2 -std=gnu11 -c "$root/tests/gpu/shim/cblas_shim.c" -o "$out/obj/cblas_shim.o" || return 1
        objs+=("$out/obj/cblas_shim.o")
    fi
    for f in "$root"/kernels/*.c "$root/common/base/kvf_dtype.c" "$root/common/base/kvf_log.c" \
             "$root/tests/gpu/gpu_vs_cpu.c"; do
        "$cc" -O2 -std=gnu11 "${defs[@]}" "${inc[@]}" -c "$f" -o "$out/obj/$(basename "$f").o" || return 1
        objs+=("$out/obj/$(basename "$f").o")
    done
    for f in "${cus[@]}"; do
        [ -n "$f" ] || continue
        "$nvcc" -O2 -std=c++17 "${defs[@]}" "${inc[@]}" -gencode arch=compute_80,code=sm_80 \
            -gencode arch=compute_90,code=[sm_90,compute_90] -c "$f" -o "$out/obj/$(basename "$f").o" || return 1
        objs+=("$out/obj/$(basename "$f").o")
    done
    mkdir -p "$out/tests/bin"
    "$nvcc" -o "$out/tests/bin/gpu_vs_cpu" "${objs[@]}" -L"$cuda/lib64" -L"$cuda/lib" "${libs[@]}" \
        -lm -lpthread || return 1
    # the tiled attention against the per-token one: the same objects but its own main
    local aobjs=() o
    for o in "${objs[@]}"; do
        [ "${o##*/}" = gpu_vs_cpu.c.o ] || aobjs+=("$o")
    done
    "$cc" -O2 -std=gnu11 "${defs[@]}" "${inc[@]}" -c "$root/tests/gpu/attn_tiled_vs_pertoken.c" \
        -o "$out/obj/attn_main.o" || return 1
    "$nvcc" -o "$out/tests/bin/attn_tiled_vs_pertoken" "$out/obj/attn_main.o" \
        "${aobjs[@]}" -L"$cuda/lib64" -L"$cuda/lib" "${libs[@]}" -lm -lpthread || return 1
}

build=${KVF_GPU_BUILD_DIR:-}
data=$root            # models and configs: the repository, or the bundle's src/
kvf=""
cuda_libs_row=""
if [ -n "$bundle" ]; then
    work=${KVF_GPU_WORK:-/tmp/kvferry-gpu-run}
    rm -rf "$work" && mkdir -p "$work" || { echo "FAIL: cannot make $work"; exit 1; }
    if ! tar -xJf "$bundle" -C "$work"; then
        echo "FAIL: cannot unpack $bundle"
        exit 1
    fi
    B="$work/kvferry-gpu"
    data="$B/src"
    root="$B/src"     # the bundle's scripts (tests/gpu, tests/bench) replace the checkout's
    # cuBLAS and NCCL (not in the bundle): $KVF_CUDA_LIBS, the Python's nvidia-* wheels, the
    # CUDA toolkit, the system's library cache; the first folder holding each wins
    find_lib() { # soname: prints the folder holding it
        local n=$1 d py
        local libs_env=${KVF_CUDA_LIBS:-}
        for d in ${libs_env//:/ }; do [ -e "$d/$n" ] && { echo "$d"; return 0; }; done
        py=$(python3 - "$n" 2>/dev/null <<'PY'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for f in glob.glob(os.path.join(r, "nvidia", "**", sys.argv[1]), recursive=True):
        print(os.path.dirname(f)); sys.exit(0)
PY
)
        [ -n "$py" ] && { echo "$py"; return 0; }
        for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
            [ -e "$d/$n" ] && { echo "$d"; return 0; }
        done
        d=$(ldconfig -p 2>/dev/null | awk -v n="$n" '$1 == n { print $NF; exit }')
        [ -n "$d" ] && { dirname "$d"; return 0; }
        return 1
    }
    libs=""
    for n in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
        if d=$(find_lib "$n"); then
            case ":$libs:" in *":$d:"*) ;; *) libs="${libs:+$libs:}$d" ;; esac
            cuda_libs_row="${cuda_libs_row:+$cuda_libs_row; }$n: $d"
        else
            cuda_libs_row="${cuda_libs_row:+$cuda_libs_row; }$n: NOT FOUND"
        fi
    done
    export KVF_CUDA_LIBS="$libs"
    build="$B"
    kvf="$B/bin/kvf"
fi
if [ -z "$build" ]; then
    build="$root/build-gpu-run"
    echo "building into $build (log: $build/gpu-build.log) ..."
    mkdir -p "$build"
    if ! timeout 120 cmake -S "$root" -B "$build" -DKVF_CUDA=ON -DKVF_WERROR=ON \
             -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/gpu-build.log" 2>&1; then
        echo "cmake could not configure (missing dependencies?); building gpu_vs_cpu standalone"
        grep -m3 -i "error\|not found" "$build/gpu-build.log"
        build="$build/standalone"
        if ! timeout "$(left)" bash -c "$(declare -f standalone); root='$root'; standalone '$build'" \
             >>"$build.log" 2>&1; then
            tail -30 "$build.log"
            echo "FAIL: the standalone CUDA build did not finish"
            exit 1
        fi
    elif ! timeout "$(left)" cmake --build "$build" -j"$(nproc)" --target gpu_vs_cpu kvf \
             attn_tiled_vs_pertoken \
             >>"$build/gpu-build.log" 2>&1; then
        tail -30 "$build/gpu-build.log"
        echo "FAIL: the CUDA build did not finish"
        exit 1
    fi
fi
bin="$build/tests/bin/gpu_vs_cpu"
[ -n "$bundle" ] && bin="$B/bin/gpu_vs_cpu"
[ -x "$bin" ] || { echo "FAIL: $bin missing (not built)"; exit 1; }

timeout "$(left)" "$bin" >"$log/kernels.txt" 2>&1
rc=$?
if [ "$rc" -eq 77 ]; then
    skip "$(sed -n 's/^skipped: no GPU (\(.*\))$/\1/p' "$log/kernels.txt")"
fi
fail=0
[ "$rc" -ne 0 ] && fail=1
# The tiled CUDA attention against the per-token one (KVF_GPU_ATTN=tiled; the default stays
# pertoken until its table is all PASS): every output bit equal, and each kernel's time
attn="$build/tests/bin/attn_tiled_vs_pertoken"
[ -n "$bundle" ] && attn="$B/bin/attn_tiled_vs_pertoken"
arc=0
if [ -x "$attn" ]; then
    timeout "$(left)" "$attn" >"$log/attn.txt" 2>&1
    arc=$?
fi

# kvf generate on the GPU against the CPU, greedy, on the committed trained hybrid
gen_row() { printf '| %-28s | %-5s | %-12s | %-12s | %-7s | %s |\n' "$@"; }
[ -n "$kvf" ] || kvf="$build/bin/kvf"
if [ ! -x "$kvf" ]; then
    gen=$(gen_row "kvf generate --device cuda" "-" "-" "-" "-" "not built")
elif ! "$kvf" generate --help 2>&1 | grep -- '--device' >/dev/null; then
    gen=$(gen_row "kvf generate --device cuda" "-" "-" "-" "-" "not yet (kvf has no --device)")
else
    # the trained hybrid (Mamba2 + attention + MLP) and the trained dense (RoPE, SwiGLU): 16
    # greedy tokens past EOS, tokens equal and every logit within tol of the CPU's
    # (columns: max |gpu - cpu|, max |gpu - cpu| / (1 + |cpu|), tol); with two GPUs also the
    # hybrid at TP 2 (ranks on cuda:0 and cuda:1, NCCL all-reduces) against the CPU's TP 2
    gen=""
    cases="tiny-hybrid:1 tiny-dense:1"
    [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -ge 2 ] && cases="$cases tiny-hybrid:2"
    for c in $cases; do
        m=${c%%:*}
        tp=${c##*:}
        args=(generate --model "$data/models-trained/$m" --prompt "12+34=" --max-tokens 16
              --ignore-eos yes --print-logits yes --kv-dtype fp32 --tp "$tp")
        name="generate cuda: $m"
        [ "$tp" -gt 1 ] && name="gen cuda tp$tp: $m"
        timeout "$(left)" "$kvf" "${args[@]}" --device cpu >"$log/gen-$c-cpu.txt" 2>"$log/gen-$c-cpu.err"
        rc_c=$?
        timeout "$(left)" "$kvf" "${args[@]}" --device cuda:0 >"$log/gen-$c-gpu.txt" 2>"$log/gen-$c-gpu.err"
        rc_g=$?
        if [ "$rc_c" -ne 0 ] || [ "$rc_g" -ne 0 ]; then
            row=$(gen_row "$name" "fp32" "-" "-" "-" "FAIL (exit cpu $rc_c, gpu $rc_g)")
            fail=1
            tail -5 "$log/gen-$c-gpu.err"
        elif [ "$(grep '^tokens:' "$log/gen-$c-cpu.txt")" != "$(grep '^tokens:' "$log/gen-$c-gpu.txt")" ]; then
            row=$(gen_row "$name" "fp32" "-" "-" "-" "FAIL: tokens differ")
            fail=1
            grep -h '^tokens:' "$log/gen-$c-cpu.txt" "$log/gen-$c-gpu.txt"
        else
            diffs=$(paste -d'\n' <(grep '^logits ' "$log/gen-$c-cpu.txt") \
                                 <(grep '^logits ' "$log/gen-$c-gpu.txt") | awk '
                NR % 2 == 1 { n = split($0, c, " "); next }
                { k = split($0, g, " "); if (k != n) { bad = 1 }
                  for (i = 4; i <= n; i++) { d = g[i] - c[i]; if (d < 0) d = -d
                      a = c[i] < 0 ? -c[i] : c[i]; if (d > ma) ma = d
                      if (d / (1 + a) > mr) mr = d / (1 + a) }
                  lines++ }
                END { if (bad || lines == 0) print "bad"; else printf "%.3g %.3g\n", ma, mr }')
            if [ "$diffs" = "bad" ]; then
                row=$(gen_row "$name" "fp32" "-" "-" "-" "FAIL: logits lines differ in shape")
                fail=1
            else
                read -r ma mr <<<"$diffs"
                if awk -v r="$mr" 'BEGIN { exit !(r <= 1e-3) }'; then
                    row=$(gen_row "$name" "fp32" "$ma" "$mr" "1e-3" "PASS (same tokens)")
                else
                    row=$(gen_row "$name" "fp32" "$ma" "$mr" "1e-3" "FAIL: logits differ")
                    fail=1
                fi
            fi
        fi
        gen="${gen:+$gen
}$row"
    done
    # sampled on the GPU (kvf_sample.h: the device sampler, only ids and logprob parts come
    # back) against the CPU's sampler: same tokens, logprobs within tol (the logits
    # themselves may differ in the last bits between the devices)
    args=(generate --model "$data/models-trained/tiny-hybrid" --prompt "12+34=" --max-tokens 16
          --ignore-eos yes --kv-dtype fp32 --temperature 0.9 --top-p 0.9 --top-k 40 --seed 7
          --logprobs 3)
    timeout "$(left)" "$kvf" "${args[@]}" --device cpu >"$log/gen-s-cpu.txt" 2>&1
    rc_c=$?
    timeout "$(left)" "$kvf" "${args[@]}" --device cuda:0 >"$log/gen-s-gpu.txt" 2>&1
    rc_g=$?
    name="generate cuda sampled: hybrid"
    if [ "$rc_c" -ne 0 ] || [ "$rc_g" -ne 0 ]; then
        row=$(gen_row "$name" "fp32" "-" "-" "-" "FAIL (exit cpu $rc_c, gpu $rc_g)")
        fail=1
    elif [ "$(grep '^tokens:' "$log/gen-s-cpu.txt")" != "$(grep '^tokens:' "$log/gen-s-gpu.txt")" ]; then
        row=$(gen_row "$name" "fp32" "-" "-" "-" "FAIL: tokens differ")
        fail=1
        grep -h '^tokens:' "$log/gen-s-cpu.txt" "$log/gen-s-gpu.txt"
    else
        ma=$(paste -d' ' <(grep '^logprobs ' "$log/gen-s-cpu.txt" | sed 's/[0-9]*://g') \
                         <(grep '^logprobs ' "$log/gen-s-gpu.txt" | sed 's/[0-9]*://g') | awk '
            { h = NF / 2; for (i = 4; i <= h; i++) { d = $i - $(i + h); if (d < 0) d = -d
                  if (d > m) m = d } n++ }
            END { if (n == 0) print "bad"; else printf "%.3g\n", m }')
        if [ "$ma" != "bad" ] && awk -v m="$ma" 'BEGIN { exit !(m <= 1e-3) }'; then
            row=$(gen_row "$name" "fp32" "$ma" "-" "1e-3" "PASS (same tokens)")
        else
            row=$(gen_row "$name" "fp32" "$ma" "-" "1e-3" "FAIL: logprobs differ")
            fail=1
        fi
    fi
    gen="$gen
$row"
    # decode steps as CUDA graphs (KVF_GPU_GRAPHS=decode: recorded per batch size, then
    # replayed) against the eager GPU run above: the same tokens and logits lines, and the
    # log's count of recordings and replays (a failed capture turns graphs off: FAIL)
    for m in tiny-hybrid tiny-dense; do
        args=(generate --model "$data/models-trained/$m" --prompt "12+34=" --max-tokens 16
              --ignore-eos yes --print-logits yes --kv-dtype fp32 --tp 1 --device cuda:0)
        KVF_GPU_GRAPHS=decode KVF_LOG_LEVEL=info timeout "$(left)" "$kvf" "${args[@]}" \
            >"$log/gen-graphs-$m.txt" 2>"$log/gen-graphs-$m.err"
        rc_g=$?
        name="generate cuda graphs: $m"
        counts=$(sed -n 's/.*CUDA graphs of decode steps: \([0-9]*\) recorded, \([0-9]*\) replays, \([0-9]*\) failed.*/\1 rec \2 replays \3 failed/p' \
                 "$log/gen-graphs-$m.err" | tail -1)
        if [ "$rc_g" -ne 0 ]; then
            row=$(gen_row "$name" "fp32" "-" "-" "-" "FAIL (exit $rc_g)")
            fail=1
            tail -5 "$log/gen-graphs-$m.err"
        elif ! cmp -s <(grep -E '^(tokens:|logits )' "$log/gen-$m:1-gpu.txt") \
                      <(grep -E '^(tokens:|logits )' "$log/gen-graphs-$m.txt"); then
            row=$(gen_row "$name" "fp32" "-" "${counts:--}" "-" "FAIL: not the eager output")
            fail=1
        elif [ -z "$counts" ] || [ "${counts#* rec }" = "$counts" ] ||
             ! echo "$counts" | grep -q '^1 rec 13 replays 0 failed$'; then
            row=$(gen_row "$name" "fp32" "-" "${counts:-no count}" "-" "FAIL: not replayed")
            fail=1
            grep -h 'graph' "$log/gen-graphs-$m.err" | head -3
        else
            row=$(gen_row "$name" "fp32" "-" "$counts" "-" "PASS (= eager, text)")
        fi
        gen="$gen
$row"
    done
fi

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 |
    sed 's/^/GPU: /'
if [ -n "$bundle" ]; then
    sed -n 's/^\(commit\|UCX\|built\): /bundle \1: /p' "$B/MANIFEST"
    echo "CUDA libraries not in the bundle: $cuda_libs_row"
fi
grep -v '^gpu_vs_cpu: ' "$log/kernels.txt"
echo "$gen"
# The transfer rows: both sides' pools in GPU memory (--device cuda: kvf_device_alloc,
# registered with UCX as UCS_MEMORY_TYPE_CUDA), a real prefill -> decode pull between two
# processes, every byte of the decode pool verified after a copy to the host. A UCX built
# without CUDA (Debian's) refuses a device pool by name: the row says so and FAILs, since
# the GPU->GPU pull did not happen (build against the libucx-cu13 wheel's UCX).
xfer_row() { # name, output file, exit code, dtype; prints the row, 1 when it is not a PASS
    local name=$1 out=$2 rc=$3 dt=$4 a b p
    if [ "$rc" -eq 0 ] && grep -q '^verify: ok' "$out"; then
        a=$(sed -n 's/^transfer: \([0-9]*\) bytes.*/\1 B/p' "$out" | head -1)
        b=$(sed -n 's/^transfer time: .* ms, \([0-9.]*\) GB\/s.*/\1 GB\/s/p' "$out" | head -1)
        p=$(sed -n 's/^post: .*, \([0-9.]*\) us\/desc.*/\1 us\/desc/p' "$out" | head -1)
        [ -n "$p" ] && b="$b, post $p"
        grep -q '^path: ' "$out" && b="$b, path $(sed -n 's/^path: //p' "$out" | head -1)"
        gen_row "$name" "$dt" "$a" "$b" "-" "PASS (bytes verified)"
        return 0
    elif grep -q 'this UCX cannot register it\|cannot reach cuda memory' "$out"; then
        gen_row "$name" "$dt" "-" "-" "-" "FAIL: not run, UCX without CUDA"
    else
        gen_row "$name" "$dt" "-" "-" "-" "FAIL (exit $rc)"
        grep -i 'error\|FAIL\|refused' "$out" | tail -3
    fi
    return 1
}
xfer_tmo() { local l; l=$(left); [ "$l" -gt 120 ] && l=120; echo "$l"; }
nano="$data/tests/data/models/nemotron-nano-9b-v2.config.json"
if [ ! -x "$kvf" ]; then
    gen_row "xfer GPU->GPU pull, 4p2d" "-" "-" "-" "-" "not built"
    gen_row "kvf bench device-to-device" "-" "-" "-" "-" "not built"
elif ! "$kvf" xfer-test --help 2>&1 | grep -- '--device' >/dev/null; then
    gen_row "xfer GPU->GPU pull, 4p2d" "-" "-" "-" "-" "FAIL: kvf xfer-test has no --device"
    fail=1
else
    timeout "$(xfer_tmo)" "$kvf" xfer-test --model "$data/tests/data/models/tiny-hybrid.config.json" \
        --layout 4p2d --prefill-block-size 80 --decode-block-size 96 --tokens 333 \
        --device cuda:0 >"$log/xfer.txt" 2>&1
    xfer_row "xfer GPU->GPU pull, 4p2d 80->96" "$log/xfer.txt" $? "bf16" || fail=1
    # kvf bench on the 9B geometry, 8k tokens: every layout; for 4p2d every path kvf has
    paths="auto"
    "$kvf" bench --help 2>&1 | grep -- '--path' >/dev/null && paths="auto ucx ipc"
    for lay in 4p2d 1p4d 4p1d 2p2d 1p1d; do
        ps="auto"
        [ "$lay" = 4p2d ] && ps=$paths
        for p in $ps; do
            extra=()
            [ "$p" != auto ] && extra=(--path "$p")
            [ "$lay$p" = 4p2dauto ] && extra+=(--descs-out "$log/descs-4p2d.json")
            timeout "$(xfer_tmo)" "$kvf" bench --model "$nano" --layout "$lay" --tokens 8192 \
                --iters 5 --verify yes --device cuda:0 "${extra[@]}" \
                >"$log/bench-$lay-$p.txt" 2>&1
            xfer_row "bench 9B $lay 8k, path $p" "$log/bench-$lay-$p.txt" $? "bf16" || fail=1
        done
    done
    # the same descriptors through NIXL (GPU memory on both sides) and the GPU's own copy rate
    # (the descriptors are the planner's, the same for any device: a CPU run writes them when
    # the GPU run above did not)
    [ -s "$log/descs-4p2d.json" ] || timeout "$(xfer_tmo)" "$kvf" bench --model "$nano" \
        --layout 4p2d --tokens 8192 --iters 1 --device cpu --copy-limit no \
        --descs-out "$log/descs-4p2d.json" >"$log/descs.txt" 2>&1
    if [ -s "$log/descs-4p2d.json" ]; then
        pypath=""
        if [ -n "$nixl_wheel" ]; then
            mkdir -p "$log/nixl"
            python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
                "$nixl_wheel" "$log/nixl" && pypath="$log/nixl"
        fi
        PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}" timeout "$(xfer_tmo)" python3 \
            "$root/tests/gpu/nixl_vram.py" "$log/descs-4p2d.json" >"$log/nixl.txt" 2>&1
        nrc=$?
        c=$(sed -n 's/^copy: .*, \([0-9.]*\) GB\/s.*/\1 GB\/s/p' "$log/nixl.txt")
        if [ -n "$c" ]; then
            gen_row "GPU copy, same bytes" "-" "contiguous" "$c" "-" "reference"
        fi
        # "nixl: ... N descriptors, B bytes, median T ms, R GB/s, post P us/desc, ..."
        n=$(awk '/^nixl: .* descriptors, / { for (i = 1; i <= NF; i++) {
                    if ($(i + 1) ~ /^bytes/) b = $i; if ($(i + 1) ~ /^GB/) r = $i
                    if ($i == "post") p = $(i + 1) }
                  printf "%s B|%s GB/s, post %s us/desc\n", b, r, p }' "$log/nixl.txt")
        if [ "$nrc" -eq 0 ] && [ -n "$n" ]; then
            gen_row "NIXL READ VRAM, 9B 4p2d 8k" "bf16" "${n%%|*}" "${n#*|}" "-" "PASS (bytes verified)"
        elif [ "$nrc" -eq 77 ]; then
            why=$(sed -n 's/^nixl: skipped //p' "$log/nixl.txt")
            gen_row "NIXL READ VRAM, 9B 4p2d 8k" "-" "-" "-" "-" "not run: $why"
        else
            gen_row "NIXL READ VRAM, 9B 4p2d 8k" "-" "-" "-" "-" "FAIL (exit $nrc)"
            tail -5 "$log/nixl.txt"
            fail=1
        fi
    else
        gen_row "NIXL READ VRAM, 9B 4p2d 8k" "-" "-" "-" "-" "FAIL: no descriptor file"
        tail -3 "$log/descs.txt"
        fail=1
    fi
fi
# The 1p1d pool with both daemons on cuda:0 against colocated answers (tests/gpu/pool_gpu.sh)
if [ -x "$kvf" ] && [ -f "$root/tests/gpu/pool_gpu.sh" ]; then
    KVF_BIN_DIR=$(dirname "$kvf") timeout "$(xfer_tmo)" bash "$root/tests/gpu/pool_gpu.sh" \
        --device cuda:0 --model "$data/models-trained/tiny-hybrid" >"$log/pool.txt" 2>&1
    prc=$?
    line=$(grep '^pool-gpu: ' "$log/pool.txt" | tail -1)
    if [ "$prc" -eq 0 ] && [ -n "$line" ]; then
        gen_row "1p1d pool on cuda:0" "bf16" "-" "${line#pool-gpu: }" "-" "PASS (= colocated)"
    else
        gen_row "1p1d pool on cuda:0" "bf16" "-" "${line#pool-gpu: }" "-" "FAIL (exit $prc)"
        tail -8 "$log/pool.txt"
        fail=1
    fi
fi
# Batch invariance of the GPU engine: test_batch_invariance on cuda:0, every request's logits
# alone and in 8 batch compositions compared bit for bit (TP 2 rows skip with one GPU)
inv="$build/tests/bin/test_batch_invariance"
[ -n "$bundle" ] && inv="$B/bin/test_batch_invariance"
if [ -x "$inv" ]; then
    KVF_TEST_SOURCE_DIR="$data" KVF_INVARIANCE_DEVICE=cuda:0 timeout "$(xfer_tmo)" "$inv" \
        >"$log/inv.txt" 2>&1
    irc=$?
    n=$(grep -c 'differ from their solo run' "$log/inv.txt")
    nd=$(grep 'differ from their solo run' "$log/inv.txt" | grep -vc ' 0 differ from')
    if [ "$irc" -eq 0 ] && grep -q 'PASSED' "$log/inv.txt"; then
        gen_row "batch invariance, cuda:0" "bf16" "-" "$n compositions, 0 requests differ" \
            "bits" "PASS"
    else
        gen_row "batch invariance, cuda:0" "bf16" "-" "$nd of $n compositions differ" "bits" \
            "FAIL (exit $irc)"
        grep 'differ from their solo run\|FAILED\|error' "$log/inv.txt" | tail -6
        fail=1
    fi
else
    gen_row "batch invariance, cuda:0" "-" "-" "-" "-" "not built (needs the cmake build)"
fi
# the tiled attention's table (run after gpu_vs_cpu above)
if [ -x "$attn" ]; then
    echo
    grep -v '^attn_tiled_vs_pertoken: ' "$log/attn.txt"
    [ "$arc" -ne 0 ] && { fail=1; echo "attn_tiled_vs_pertoken exited $arc"; }
else
    echo "attention tiled vs per-token: not built ($attn)"
fi
grep '^gpu_vs_cpu: ' "$log/kernels.txt"
[ "$rc" -ne 0 ] && [ "$rc" -ne 1 ] && echo "gpu_vs_cpu exited $rc (crash or timeout)"
# Where a GPU step's time goes (kvf bench-model --profile: every kernel call of rank 0 timed
# between device synchronisations), the trained hybrid, prompt 1000, batch 1 and 16, and
# batch 16 sampled on the device; the top rows of each phase, the whole tables in the logs
if [ -x "$kvf" ] && [ "$(left)" -gt 120 ]; then
    for b in 1 16 16s; do
        samp=""
        [ "$b" = 16s ] && samp="--temperature 0.8 --top-p 0.9"   # sampled on the device
        timeout 60 "$kvf" bench-model --device cuda:0 --model "$data/models-trained/tiny-hybrid" \
            --prompt-len 1000 --decode-tokens 32 --batch "${b%s}" --warmup yes --profile yes \
            $samp >"$log/profile-b$b.txt" 2>&1
        prc=$?
        echo
        echo "step profile, tiny-hybrid on cuda:0, batch ${b%s}${samp:+, $samp} (exit $prc):"
        awk '/ tok\/s/ {print} /^profile / {n = 0; print; next} /^  / && n++ < 9 {print}' \
            "$log/profile-b$b.txt"
    done
fi
# Decode with and without CUDA graphs (KVF_GPU_GRAPHS=decode), the trained hybrid and dense,
# batch 1 and 16: decode tok/s of each, side by side
if [ -x "$kvf" ] && [ "$(left)" -gt 100 ]; then
    echo
    echo "decode steps as CUDA graphs (kvf bench-model, prompt 128, 64 tokens; tok/s):"
    for m in tiny-hybrid tiny-dense; do
        for b in 1 16; do
            line="  $m batch $b:"
            for g in off decode; do
                KVF_LOG_LEVEL=info KVF_GPU_GRAPHS=$g timeout 60 "$kvf" bench-model \
                    --device cuda:0 --model "$data/models-trained/$m" --prompt-len 128 \
                    --decode-tokens 64 --batch "$b" --warmup yes \
                    >"$log/graphs-$m-b$b-$g.txt" 2>&1
                t=$(sed -n 's/.*decode [0-9]* tokens \([0-9.]*\) tok\/s.*/\1/p' \
                    "$log/graphs-$m-b$b-$g.txt" | tail -1)
                line="$line graphs $g ${t:-FAIL}"
            done
            # the recordings and replays the graphed run counted (0 replays: it ran eagerly)
            line="$line ($(sed -n 's/.*CUDA graphs of decode steps: \([0-9]*\) recorded, \([0-9]*\) replays, \([0-9]*\) failed.*/\1 recorded, \2 replays, \3 failed captures/p' \
                "$log/graphs-$m-b$b-decode.txt" | tail -1))"
            echo "$line"
        done
    done
fi
# The engine against transformers on this GPU, when torch is here and time is left
if [ -x "$kvf" ] && [ -f "$root/tests/bench/engine_gpu.py" ] && [ "$(left)" -gt 150 ]; then
    echo
    echo "engine benchmark (tests/bench/engine_gpu.py):"
    timeout "$(( $(left) - 20 ))" python3 "$root/tests/bench/engine_gpu.py" --kvf "$kvf" \
        --budget "$(( $(left) - 30 ))" 2>"$log/engine.err" | tee "$log/engine.txt"
    erc=${PIPESTATUS[0]}
    [ "$erc" -ne 0 ] && [ "$erc" -ne 77 ] && { echo "engine benchmark exited $erc"; tail -5 "$log/engine.err"; }
fi
[ -n "${KVF_GPU_KEEP_LOGS:-}" ] && cp -r "$log"/. "$KVF_GPU_KEEP_LOGS"/ 2>/dev/null
echo "tests/gpu/run.sh: $((($(date +%s) - start))) s, $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
