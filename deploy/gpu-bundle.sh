#!/usr/bin/env bash
# gpu-bundle.sh: one tarball that runs kvferry on a bare GPU machine (no UCX, ZeroMQ,
# protobuf-c, OpenBLAS, no network; a CUDA 13 driver), as air-gapped GPU clusters install
# software. Run on a build machine (Debian 12 with nvcc, after deploy/install-deps.sh):
#
#   bash deploy/gpu-bundle.sh [--out FILE] [--build-dir DIR] [--ucx-prefix DIR] [--no-build]
#
# It builds kvferry with CUDA against the UCX that reaches CUDA memory (the libucx-cu13 wheel's,
# found by deploy/ucx-cuda-prefix.sh unless --ucx-prefix names one) into build-gpu-bundle/,
# then writes FILE (default build-gpu-bundle/kvferry-gpu.tar.xz):
#   kvferry-gpu/libexec/   the programs (kvf, kvf-prefill, kvf-decode, kvf-proxy, gpu_vs_cpu)
#   kvferry-gpu/bin/       one wrapper per program: sets LD_LIBRARY_PATH to lib/ for that
#                          program only (so Python beside it keeps the system's libraries),
#                          plus the shell/Python programs (kvf-up, kvf-down, kvf-matrix, ...)
#   kvferry-gpu/lib/       every shared library the programs load that is not glibc, the NVIDIA
#                          driver (libcuda, libnvidia-*) or one of the CUDA toolkit's large
#                          redistributables (below); UCX's modules in lib/ucx/ (UCX looks for
#                          them beside libucs), with the wheel's own CUDA runtime they need
#   kvferry-gpu/src/       the scripts and data the GPU table uses (tests/gpu, tests/bench,
#                          model configs, the trained models, deploy/pool)
#   kvferry-gpu/MANIFEST   commit, UCX version, every file's origin
# Not inside: cuBLAS/cuBLASLt (about 570 MB) and NCCL (about 210 MB), which alone are ten times
# the bundle. Every CUDA machine that runs PyTorch has them (the nvidia-cublas and
# nvidia-nccl-cu13 wheels) or has the CUDA toolkit; tests/gpu/run.sh --bundle finds them there
# (or in $KVF_CUDA_LIBS) and names where in its table. Rejected: static cuBLAS (the same size);
# shipping them compressed (about 300 MB, against a 60 MiB budget for the bundle).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="" build="$root/build-gpu-bundle" ucx="" do_build=1
while [ $# -gt 0 ]; do
    case $1 in
    --out) out=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --ucx-prefix) ucx=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "gpu-bundle.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$out" ] || out="$build/kvferry-gpu.tar.xz"
if [ -z "$ucx" ] && [ "$do_build" = 0 ] && [ -f "$build/CMakeCache.txt" ]; then
    # an existing build: the UCX it was configured with (empty: the system's, whose
    # libraries ldd finds below and whose modules lie in its libdir's ucx/)
    ucx=$(sed -n 's/^KVF_UCX_PREFIX:PATH=//p' "$build/CMakeCache.txt")
    [ -n "$ucx" ] || ucx=system
fi
if [ -z "$ucx" ]; then
    ucx=$(bash "$root/deploy/ucx-cuda-prefix.sh") || {
        echo "gpu-bundle.sh: no UCX with CUDA found (bash deploy/install-deps.sh," \
             "or --ucx-prefix DIR)" >&2
        exit 1
    }
fi
if [ "$ucx" = system ]; then
    ucx_libdir=$(pkg-config --variable=libdir ucx)
    ucx_version=$(pkg-config --modversion ucx)
else
    [ -f "$ucx/lib/pkgconfig/ucx.pc" ] ||
        { echo "gpu-bundle.sh: $ucx/lib/pkgconfig/ucx.pc missing" >&2; exit 1; }
    ucx_libdir="$ucx/lib"
    ucx_version=$(sed -n 's/^Version: //p' "$ucx/lib/pkgconfig/ucx.pc")
fi
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] ||
    { echo "gpu-bundle.sh: nvcc not found: the bundle needs the CUDA build" >&2; exit 1; }

progs=(kvf kvf-prefill kvf-decode kvf-proxy)
tests=(gpu_vs_cpu attn_tiled_vs_pertoken gemm_lt_invariance gemm_lt_bench ssd_vs_cpu
       fi_attention_check gdn_vs_cpu)
if [ "$do_build" = 1 ]; then
    echo "building into $build (log: $build/bundle-build.log) ..."
    mkdir -p "$build"
    launcher=()
    command -v ccache >/dev/null 2>&1 &&
        launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    # FlashInfer's paged prefill and decode (kernels/kvf_fi_prefill.h, kvf_fi_decode.h) are ON
    # in the bundle: headers of the flashinfer-python wheel from $KVF_FLASHINFER_DIR (its
    # flashinfer/data), else the pinned wheel downloaded into the build folder (pinned: kvferry
    # fills FlashInfer's parameter blocks itself, member by member, so a release that renames
    # one breaks the build; 0.7.4 is the one compiled with -Werror); without them the bundle
    # builds without it and says so
    fi_dir=${KVF_FLASHINFER_DIR:-$build/flashinfer-wheel/flashinfer/data}
    if [ -z "${KVF_FLASHINFER_DIR:-}" ] && [ ! -f "$fi_dir/include/flashinfer/attention/decode.cuh" ]; then
        rm -rf "$build/flashinfer-wheel" && mkdir -p "$build/flashinfer-wheel"
        python3 -m pip download --no-deps "flashinfer-python==${KVF_FLASHINFER_VERSION:-0.7.4}" \
            -d "$build/flashinfer-wheel" \
            >>"$build/bundle-build.log" 2>&1 &&
            python3 -m zipfile -e "$build"/flashinfer-wheel/flashinfer_python-*.whl \
                "$build/flashinfer-wheel" >>"$build/bundle-build.log" 2>&1 || true
    fi
    fi_args=(-DKVF_FLASHINFER=OFF)
    if [ -f "$fi_dir/include/flashinfer/attention/decode.cuh" ]; then
        fi_args=(-DKVF_FLASHINFER=ON -DKVF_FLASHINFER_DIR="$fi_dir")
    else
        echo "FlashInfer headers not found (KVF_FLASHINFER_DIR, pip download flashinfer-python):" \
             "building without FlashInfer's attention"
    fi
    cmake -S "$root" -B "$build" -DKVF_CUDA=ON -DKVF_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
        -DKVF_UCX_PREFIX="$ucx" "${fi_args[@]}" "${launcher[@]}" >>"$build/bundle-build.log" 2>&1 ||
        { tail -20 "$build/bundle-build.log"; exit 1; }
    # every program in bin/, and the test programs the GPU table runs
    targets=$(cmake --build "$build" --target help | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p')
    want=("${progs[@]}" "${tests[@]}")
    for t in test_batch_invariance; do
        grep -qx "$t" <<<"$targets" && want+=("$t")
    done
    cmake --build "$build" -j"$(nproc)" --target "${want[@]}" >>"$build/bundle-build.log" 2>&1 ||
        { tail -30 "$build/bundle-build.log"; exit 1; }
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b="$stage/kvferry-gpu"
mkdir -p "$b/bin" "$b/libexec" "$b/lib/ucx" "$b/src"
manifest="$b/MANIFEST"
{
    echo "kvferry GPU bundle"
    echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(
        git -C "$root" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release; echo "$PRETTY_NAME")"
    echo "nvcc: $("$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version | tail -2 | head -1)"
    echo "UCX: $ucx_version from $ucx_libdir"
    echo "FlashInfer attention: $(sed -n 's/^KVF_FLASHINFER:BOOL=//p' "$build/CMakeCache.txt" 2>/dev/null || echo unknown)"
    echo "not inside (taken from the GPU machine): libcublas.so.13 libcublasLt.so.13 libnccl.so.2"
} >"$manifest"

wrapper() { # name: bin/NAME runs libexec/NAME with lib/ first on the library path
    cat >"$b/bin/$1" <<'EOF'
#!/usr/bin/env bash
# kvferry GPU bundle: run the program of this name with the bundle's libraries
d=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
export LD_LIBRARY_PATH="$d/lib${KVF_CUDA_LIBS:+:$KVF_CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$d/libexec/$(basename "$0")" "$@"
EOF
    chmod +x "$b/bin/$1"
}
for f in "$build"/bin/*; do
    n=$(basename "$f")
    if [ "$(head -c4 "$f" | tail -c3)" = ELF ]; then
        cp "$f" "$b/libexec/$n"
        wrapper "$n"
    else
        cp "$f" "$b/bin/$n"   # kvf-up, kvf-down, kvf-matrix, kvf-supervise: scripts
    fi
done
for t in "${tests[@]}" test_batch_invariance; do
    [ -x "$build/tests/bin/$t" ] || continue
    cp "$build/tests/bin/$t" "$b/libexec/$t"
    wrapper "$t"
done
for f in "$b"/libexec/*; do strip --strip-debug "$f" 2>/dev/null || true; done

# UCX: the wheel's libraries and its modules (dlopen'ed, so ldd never lists them) and the
# CUDA runtime the modules were linked with (the wheel keeps it in libucx_cu13.libs/)
for l in ucp uct ucs ucm ucs_signal; do   # the soname only: a wheel holds no symlinks
    [ -f "$ucx_libdir/lib$l.so.0" ] && cp -L "$ucx_libdir/lib$l.so.0" "$b/lib/"
done
for m in "$ucx_libdir"/ucx/*.so.0; do
    case $(basename "$m") in libucx_perftest*) continue ;; esac
    cp -L "$m" "$b/lib/ucx/"
done
for x in "$ucx_libdir"/../../libucx_cu13.libs/*.so*; do [ -f "$x" ] && cp "$x" "$b/lib/"; done
echo "UCX modules: $(cd "$b/lib/ucx" && echo *)" >>"$manifest"

# every other library ldd resolves for the programs and the UCX modules, except glibc's,
# the NVIDIA driver's and the large CUDA redistributables named in the MANIFEST
skip='^(linux-vdso|(/lib64/)?ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv'
skip+='|libutil|libcuda\.so|libnvidia-|libcublas|libcublasLt|libnccl)'
missing=0
for f in "$b"/libexec/* "$b"/lib/ucx/*.so.0; do
    while read -r name _ path _; do
        [[ $name =~ $skip ]] && continue
        if [ "$path" = "not" ]; then
            # UCX's modules need the wheel's CUDA runtime: resolved from lib/ at run time
            [ -e "$b/lib/$name" ] && continue
            echo "gpu-bundle.sh: $f needs $name, which is not found here" >&2
            missing=1
            continue
        fi
        [ -n "$path" ] && [ -e "$path" ] || continue
        [ -e "$b/lib/$name" ] || { cp -L "$path" "$b/lib/$name"; echo "lib: $name <- $path" >>"$manifest"; }
    done < <(LD_LIBRARY_PATH="$b/lib:$ucx_libdir" ldd "$f" 2>/dev/null | sed 's/(0x[0-9a-f]*)//')
done
[ "$missing" = 0 ] || exit 1
for f in "$b"/lib/*.so* "$b"/lib/ucx/*.so*; do
    [ -L "$f" ] || strip --strip-unneeded "$f" 2>/dev/null || true
done

# what the GPU table runs, relative to src/ as in the repository
( cd "$root" && tar cf - tests/gpu tests/bench/engine_gpu.py tests/bench/peer_harness.py \
      tests/data/models tests/data/families/qwen3-next tests/data/families/qwen3.5 \
      models-trained deploy/pool deploy/quickstart.sh tools/*.py 2>/dev/null ) |
    tar xf - -C "$b/src" 2>/dev/null || true
rm -rf "$b/src/tests/gpu/__pycache__"
echo "files: $(cd "$b" && find . -type f | wc -l)" >>"$manifest"

mkdir -p "$(dirname "$out")"
tar -C "$stage" -cf - kvferry-gpu | xz -T0 "-${KVF_BUNDLE_XZ_LEVEL:-6}" >"$out"
size=$(stat -c %s "$out")
echo "wrote $out: $((size / 1024 / 1024)) MiB ($size bytes), $(grep -c '^lib: ' "$manifest") libraries"
if [ "$size" -ge $((60 * 1024 * 1024)) ]; then
    echo "gpu-bundle.sh: the bundle is over 60 MiB" >&2
    exit 1
fi
