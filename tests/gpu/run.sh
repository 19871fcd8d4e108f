#!/usr/bin/env bash
# The GPU table in one short window (tests/gpu/README.md). On a machine with an NVIDIA GPU:
#   bash tests/gpu/run.sh [--bundle FILE [--nixl-wheel WHEEL]]
# First a preflight (seconds): the GPUs and driver, cuBLAS/cuBLASLt, NCCL, torch, a NIXL
# package or wheel, UCX's transports, and what each missing piece will skip. Then rows, in
# this order, each with its own cap (timeout), each printed and appended to
# $KVF_GPU_OUT/gpu-results.txt the moment it is measured, its log kept in
# $KVF_GPU_OUT/gpu-logs/ROW.log (KVF_GPU_OUT: default the current folder):
#   build (only without --bundle and $KVF_GPU_BUILD_DIR: build-gpu-run/, or gpu_vs_cpu alone
#     with nvcc when cmake cannot configure); every CUDA kernel against its CPU twin and the
#     tiled attention against the per-token one; `kvf generate --device cuda` against the CPU
#     on both trained models (TP 2 with two GPUs; one run sampled on the device); the GPU
#     engine's GEMM micro-benchmark (when built) and tests/bench/engine_gpu.py, the 9B
#     geometry first; the 9B 4p2d 8k pull on the IPC and UCX paths (`kvf bench --path`,
#     bytes verified, post time per descriptor) and NIXL on the same descriptor list
#     (--descs-out; tests/gpu/nixl_vram.py, with the GPU's own copy rate); the 1p1d pool on
#     cuda:0 against colocated answers; batch invariance on the GPU (default attention and
#     KVF_GPU_ATTN=flashinfer); CUDA graphs against eager (default and exact settings); then,
#     while time is left, the 80->96 xfer-test pull, the other bench layouts, step profiles
#     and graphs on/off decode speed.
# The whole script ends by itself within $KVF_GPU_BUDGET seconds (default 480) with a
# summary line per row: PASS, FAIL: why, skipped: why, or not reached (budget).
# KVF_GPU_ROWS="ROW,..." runs only those rows (build and kernels always: they find the GPU);
# KVF_GPU_CAPS="ROW=S,..." overrides rows' caps; KVF_GPU_PYTHON is the Python of the engine,
# NIXL and torch rows (default python3); KVF_GPU_GEMM_BENCH a command for the gemm row. With
# --bundle FILE (deploy/gpu-bundle.sh's tarball) it unpacks into $KVF_GPU_WORK (default
# /tmp/kvferry-gpu-run) and runs its programs; cuBLAS and NCCL, not in the bundle, come from
# $KVF_CUDA_LIBS, the Python's nvidia-* wheels, the CUDA toolkit or the library cache (the
# preflight says which).
#
# Without a GPU (no nvidia-smi, nvidia-smi lists no GPU, or cudaGetDeviceCount fails) it
# prints "skipped: no GPU" and exits $KVF_GPU_SKIP_EXIT: 0 by hand, 77 under ctest
# (SKIP_RETURN_CODE 77: the suite reports SKIPPED, never passed). Exit 1 when a row FAILs.
# tests/gpu/test_run_dry.sh runs this script on the CPU with stub programs (ctest).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/tests/gpu"
skip_exit=${KVF_GPU_SKIP_EXIT:-0}
budget=${KVF_GPU_BUDGET:-480}
out_dir=${KVF_GPU_OUT:-$PWD}
py=${KVF_GPU_PYTHON:-python3}
bundle="" nixl_wheel=""
while [ $# -gt 0 ]; do
    case $1 in
    --bundle) bundle=${2:-}; shift 2 || { echo "run.sh: --bundle needs a file"; exit 2; } ;;
    --nixl-wheel) nixl_wheel=${2:-}; shift 2 || { echo "run.sh: --nixl-wheel needs a file"; exit 2; } ;;
    -h|--help) sed -n '2,/^set -uo/{/^set -uo/d;p}' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)"; exit 2 ;;
    esac
done
[ -z "$bundle" ] || [ -f "$bundle" ] || { echo "run.sh: --bundle $bundle: no such file"; exit 2; }
[ -z "$nixl_wheel" ] || [ -f "$nixl_wheel" ] ||
    { echo "run.sh: --nixl-wheel $nixl_wheel: no such file"; exit 2; }
[[ $budget =~ ^[0-9]+$ ]] && [ "$budget" -ge 5 ] ||
    { echo "run.sh: KVF_GPU_BUDGET=$budget: whole seconds, at least 5"; exit 2; }
[ -n "$bundle" ] && bundle=$(cd "$(dirname "$bundle")" && pwd)/$(basename "$bundle")
[ -n "$nixl_wheel" ] && nixl_wheel=$(cd "$(dirname "$nixl_wheel")" && pwd)/$(basename "$nixl_wheel")

skip() {
    echo "skipped: no GPU ($1)"
    exit "$skip_exit"
}
command -v nvidia-smi >/dev/null 2>&1 || skip "nvidia-smi absent"
timeout 10 nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null || skip "nvidia-smi lists no GPU"

. "$here/rowrun.sh"
. "$here/preflight.sh"
. "$here/gpu_rows.sh"
. "$here/gpu_rows_gdn.sh"
mkdir -p "$out_dir" && out_dir=$(cd "$out_dir" && pwd) && rr_init "$out_dir" "$budget" ||
    { echo "FAIL: cannot write results under $out_dir (KVF_GPU_OUT)"; exit 1; }
rr_say "tests/gpu/run.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), budget $budget s, results $RR_RESULTS"

# Standalone build of gpu_vs_cpu alone (kernels/ + base's dtype and log + the test),
# for a GPU machine without kvferry's other build dependencies (UCX, ZeroMQ, ...): nvcc and
# the C compiler directly, OpenBLAS if present (else tests/gpu/shim's naive cblas_sgemm),
# NCCL if present. Prints the binary's path.
standalone() {
    local out=$1 nvcc cuda cc=${CC:-cc} objs=() defs=(-DKVF_HAVE_CUDA=1) libs=(-lcublas -lcublasLt) f
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    cuda=$(dirname "$(dirname "$nvcc")")
    local inc=(-I"$root/kernels" -I"$root/base" -I"$cuda/include")
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
    for f in "$root"/kernels/*.c "$root/base/kvf_dtype.c" "$root/base/kvf_log.c" \
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

# The build row (no --bundle, no $KVF_GPU_BUILD_DIR): kvferry with CUDA into $build; when
# cmake cannot configure there (a bare GPU machine), gpu_vs_cpu and attn_tiled_vs_pertoken
# alone into $build/standalone
row_build() {
    if ! timeout 120 cmake -S "$root" -B "$build" -DKVF_CUDA=ON -DKVF_WERROR=ON \
             -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/gpu-build.log" 2>&1; then
        echo "cmake could not configure (missing dependencies?); building gpu_vs_cpu standalone"
        grep -m3 -i "error\|not found" "$build/gpu-build.log" >&2
        standalone "$build/standalone" >>"$build/gpu-build.log" 2>&1 && return 0
        tail -30 "$build/gpu-build.log" >&2
        rr_verdict "FAIL: the standalone CUDA build did not finish ($build/gpu-build.log)"
        return 1
    fi
    local targets=(gpu_vs_cpu kvf attn_tiled_vs_pertoken test_batch_invariance) t
    for t in gemm_lt_bench gemm_lt_invariance ssd_vs_cpu fi_attention_check gdn_vs_cpu; do
        cmake --build "$build" --target help 2>/dev/null | grep -q "\.\.\. $t\$" && targets+=("$t")
    done
    cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >>"$build/gpu-build.log" 2>&1 &&
        return 0
    tail -30 "$build/gpu-build.log" >&2
    rr_verdict "FAIL: the CUDA build did not finish ($build/gpu-build.log)"
    return 1
}

data=$root            # models and configs: the repository, or the bundle's src/
build=${KVF_GPU_BUILD_DIR:-}
need_build=""
if [ -n "$bundle" ]; then
    work=${KVF_GPU_WORK:-/tmp/kvferry-gpu-run}
    rm -rf "$work" && mkdir -p "$work" || { echo "FAIL: cannot make $work"; exit 1; }
    timeout 120 tar -xJf "$bundle" -C "$work" || { echo "FAIL: cannot unpack $bundle"; exit 1; }
    B="$work/kvferry-gpu"
    data="$B/src"
    root="$B/src"     # the bundle's scripts (tests/gpu, tests/bench) replace the checkout's
    build="$B"
    kvf="$B/bin/kvf"
    tbin="$B/bin"
    rr_say "bundle: $bundle unpacked into $B in $(rr_elapsed_s) s"
else
    if [ -z "$build" ]; then
        build="$root/build-gpu-run"
        mkdir -p "$build"
        need_build=1
    fi
    kvf="$build/bin/kvf"
    tbin="$build/tests/bin"
fi
nano="$data/tests/data/models/nemotron-nano-9b-v2.config.json"
B=${B:-}
preflight
export root data build kvf tbin py ngpu nixl_wheel nano

# the table, in order of what a short window must bring back first
[ -n "$need_build" ] && rr_add build 420 row_build
rr_add kernels 90 row_kernels
rr_add attn-tiled 60 row_attn_tiled
rr_add gen-hybrid 60 row_generate tiny-hybrid 1
rr_add gen-dense 60 row_generate tiny-dense 1
rr_add gen-hybrid-tp2 60 row_generate tiny-hybrid 2
rr_add gen-sampled 45 row_generate_sampled
# the tensor-core engine (issue 40): its checks, then the engine against transformers
rr_add greedy-default 60 row_greedy_default
rr_add gemm-invariance 45 row_prog gemm_lt_invariance
rr_add gemm 45 row_gemm
rr_add ssd 45 row_prog ssd_vs_cpu
rr_add fi-attention 45 row_prog fi_attention_check
rr_add gen-fi-hybrid 60 row_generate_fi tiny-hybrid
rr_add gen-fi-dense 60 row_generate_fi tiny-dense
rr_add gen-fi-gqa5 60 row_generate_fi tiny-gqa5
rr_add engine 150 row_engine
rr_add engine-issue 240 row_engine_issue
rr_add engine-issue-fi 240 row_engine_issue flashinfer
rr_add pull-4p2d-ipc 60 row_bench 4p2d ipc
rr_add pull-4p2d-ucx 60 row_bench 4p2d ucx
rr_add nixl-4p2d 90 row_nixl
rr_add pool-1p1d 100 row_pool
rr_add batch-invariance 90 row_invariance
rr_add batch-invariance-fi 120 row_invariance flashinfer
rr_add batch-invariance-fi-gqa5 120 row_invariance flashinfer tiny-gqa5
# CUDA graphs of decode steps = eager (default and exact settings): graphs on by default waits
# on these two
rr_add graphs-hybrid 90 row_graphs_generate tiny-hybrid
rr_add graphs-dense 90 row_graphs_generate tiny-dense
# Gated DeltaNet (issue 44): the chunked prompt scan's kernel check and prompt throughput
# against the token kernel, greedy tokens against the CPU and batch invariance on the
# qwen3-next / qwen3.5 random checkpoints, decode graphs = eager on qwen3.5 (no MoE)
rr_add gdn 90 row_prog gdn_vs_cpu
rr_add gen-gdn-qwen3-next 60 row_gdn_generate qwen3-next
rr_add gen-gdn-qwen3-5 60 row_gdn_generate qwen3.5
rr_add batch-invariance-gdn-qwen3-next 90 row_gdn_invariance qwen3-next
rr_add batch-invariance-gdn-qwen3-5 90 row_gdn_invariance qwen3.5
rr_add graphs-gdn-qwen3-5 90 row_graphs_generate qwen3.5 "$data/tests/data/families/qwen3.5"
# everything else, while time is left
rr_add xfer-4p2d-80-96 60 row_xfer
for lay in 4p2d 1p4d 4p1d 2p2d 1p1d; do
    rr_add "pull-$lay-auto" 60 row_bench "$lay" auto
done
for b in 1 16 16s; do
    rr_add "profile-b$b" 60 row_profile "$b"
done
for m in tiny-hybrid tiny-dense; do
    for b in 1 16; do
        rr_add "graphs-speed-$m-b$b" 90 row_graphs_speed "$m" "$b"
    done
done

mapfile -t fns < <(declare -F | awk '{ print $3 }')
export -f "${fns[@]}"    # the rows run in `bash -c` children
first=0
if [ -n "$need_build" ]; then
    rr_run_range 0 1
    first=1
    # the standalone build has the kernel checks only (no kvf: those rows say not built)
    [ -x "$tbin/gpu_vs_cpu" ] || [ ! -x "$build/standalone/tests/bin/gpu_vs_cpu" ] ||
        { tbin="$build/standalone/tests/bin"; export tbin; }
fi
rr_run_range "$first" $((first + 1))   # the kernels: a device that is not there ends it here
if [ -f "$RR_DIR/no-gpu" ]; then
    skip "$(cat "$RR_DIR/no-gpu")"
fi
rr_run_range $((first + 1)) "${#RR_IDS[@]}"
rr_summary
fail=$?
echo "tests/gpu/run.sh: $(rr_elapsed_s) s, $([ $fail -eq 0 ] && echo PASS || echo FAIL)" |
    tee -a "$RR_RESULTS"
exit $fail
