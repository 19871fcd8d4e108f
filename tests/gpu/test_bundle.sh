#!/usr/bin/env bash
# test_bundle: deploy/gpu-bundle.sh on this build (no rebuild) writes a tarball that a bare GPU
# machine can run. Checks, without a GPU:
#   - the tarball is under 60 MiB;
#   - every program and UCX module in it resolves every library it needs inside the bundle,
#     except glibc's, the NVIDIA driver's and cuBLAS/NCCL (the MANIFEST names those);
#   - bin/kvf (the wrapper) runs from a folder of its own and generates the same tokens on the
#     CPU as this build's kvf, on the bundled trained model;
#   - tests/gpu/run.sh --bundle on a machine without a GPU says skipped and exits 77.
# Exit 77 (skipped) on a build without CUDA: the bundle is for GPU machines.
# usage: test_bundle.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
if ! ldd "$build/bin/kvf" | grep 'libcudart' >/dev/null; then
    echo "skipped: not a CUDA build"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
KVF_BUNDLE_XZ_LEVEL=1 bash "$root/deploy/gpu-bundle.sh" --no-build --build-dir "$build" \
    --out "$tmp/b.tar.xz" >"$tmp/log" 2>&1 ||
    { cat "$tmp/log"; echo "FAIL: gpu-bundle.sh failed"; exit 1; }
size=$(stat -c %s "$tmp/b.tar.xz")
[ "$size" -lt $((60 * 1024 * 1024)) ] || { echo "FAIL: bundle is $size bytes, over 60 MiB"; exit 1; }
mkdir "$tmp/u"
tar -xJf "$tmp/b.tar.xz" -C "$tmp/u"
b="$tmp/u/kvferry-gpu"
allowed='^(linux-vdso|(/lib64/)?ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so'
allowed+='|libresolv|libutil|libcuda\.so|libnvidia-|libcublas\.so|libcublasLt\.so|libnccl\.so)'
bad=0 n=0
for f in "$b"/libexec/* "$b"/lib/ucx/*.so.0; do
    n=$((n + 1))
    while read -r name _ path _; do
        [ -n "$name" ] || continue
        [[ $name =~ $allowed ]] && continue
        case $path in
        "$b"/lib/*) ;;
        *) echo "FAIL: $(basename "$f") needs $name, resolved outside the bundle: ${path:-?}"; bad=1 ;;
        esac
    done < <(LD_LIBRARY_PATH="$b/lib" ldd "$f" | sed 's/(0x[0-9a-f]*)//; /statically linked/d')
done
[ "$bad" = 0 ] || exit 1
echo "bundle: $((size / 1024 / 1024)) MiB, $n programs and UCX modules resolve inside it"
grep -q '^not inside .*libcublas' "$b/MANIFEST" || { echo "FAIL: MANIFEST does not name cuBLAS"; exit 1; }

# the wrapper, run from elsewhere, on the bundled model; cuBLAS/NCCL from this machine's CUDA
cuda_libs=$(dirname "$(ldd "$build/bin/kvf" | awk '$1 ~ /^libcublas\.so/ { print $3 }')")
args=(generate --model models-trained/tiny-hybrid --prompt "12+34=" --max-tokens 12
      --ignore-eos yes --device cpu)
want=$(cd "$root" && "$build/bin/kvf" "${args[@]}" 2>/dev/null | grep '^tokens:')
got=$(cd "$b/src" && KVF_CUDA_LIBS="$cuda_libs" "$b/bin/kvf" "${args[@]}" 2>"$tmp/err" |
      grep '^tokens:') ||
    { cat "$tmp/err"; echo "FAIL: the bundle's kvf did not run"; exit 1; }
[ -n "$want" ] && [ "$want" = "$got" ] ||
    { echo "FAIL: bundle tokens '$got' != build tokens '$want'"; exit 1; }
echo "bundle kvf generate: $got (same as the build's)"

# run.sh --bundle without a GPU: skipped, exit 77, never passed
rc=0
out=$(PATH="$tmp/nopath:/usr/bin:/bin" KVF_GPU_SKIP_EXIT=77 bash "$root/tests/gpu/run.sh" \
      --bundle "$tmp/b.tar.xz" 2>&1) || rc=$?
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then
    echo "a GPU is present: run.sh --bundle ran (exit $rc)"
elif [ "$rc" -ne 77 ] || ! grep -q '^skipped: no GPU' <<<"$out"; then
    echo "$out"
    echo "FAIL: run.sh --bundle without a GPU exited $rc instead of 77 (skipped)"
    exit 1
fi
echo "run.sh --bundle without a GPU: skipped (77)"
echo "PASS"
