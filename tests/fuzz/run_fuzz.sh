#!/usr/bin/env bash
# Build the libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined;
# build-fuzz/) and run each for a bounded time from its committed corpus.
# Run by tests/run.sh; alone:   bash tests/fuzz/run_fuzz.sh [TARGET...]
#   KVF_FUZZ_SECONDS  seconds per target (default 20)
#   KVF_FUZZ_BUILD    build folder (default build-fuzz)
# Exit 0: every target ran its time without a crash, leak, UB or timeout;
# 1: one failed (the input that did it is named; commit it to
# tests/fuzz/corpus/<target>/ as a regression seed once fixed); 77: skipped,
# clang or its libFuzzer runtime is missing (Debian: clang, libclang-rt-dev).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
secs=${KVF_FUZZ_SECONDS:-20}
build=${KVF_FUZZ_BUILD:-build-fuzz}
if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for d in tests/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi

probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
cat > "$probe/p.c" <<'C'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }
C
if ! command -v clang >/dev/null 2>&1 ||
   ! clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >"$probe/log" 2>&1; then
    echo "fuzzing skipped: clang with its libFuzzer runtime is missing (Debian: apt-get install clang libclang-rt-dev)"
    sed 's/^/  /' "$probe/log" 2>/dev/null | tail -3 || true
    exit 77
fi

cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DKVF_FUZZ=ON -DKVF_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"${KVF_BUILD_JOBS:-$(nproc)}" --target "${targets[@]}" >"$build/fuzz-build.log" 2>&1 || {
    tail -30 "$build/fuzz-build.log"; echo "fuzz build failed ($build/fuzz-build.log)"; exit 1; }

# One target's run; its verdict goes to $build/verdict-$t (first line "ok" or "failed").
fuzz_one() {
    local t=$1 work="$build/corpus/$1" art="$build/artifacts/$1/" log="$build/fuzz-$1.log"
    local tsecs=$secs rc runs rate cov
    mkdir -p "$work" "$art"     # new inputs land in $work, not in the committed corpus
    # the HTTP front end runs a TCP round trip per input (hundreds a second where the
    # decoders run thousands): three times the time, so its run still finds something
    [ "$t" = fuzz_proxy_http ] && tsecs=$((secs * 3))
    set +e
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
        "$build/tests/bin/$t" -max_total_time="$tsecs" -timeout=30 -rss_limit_mb=2048 \
        -max_len=65536 -error_exitcode=1 -print_final_stats=1 -artifact_prefix="$art" \
        "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    set -e
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(sed -n 's/.* cov: \([0-9]*\) .*/\1/p' "$log" | tail -1)
    if [ $rc -eq 0 ]; then
        { echo ok; printf '%-22s passed: %s runs in %s s (%s/s), %s coverage points, corpus %s inputs\n' \
            "$t" "${runs:-?}" "$tsecs" "${rate:-?}" "${cov:-?}" "$(ls "$work" | wc -l)"; } \
            >"$build/verdict-$t"
    else
        {
            echo failed
            echo "$t FAILED (exit $rc); its log: $log"
            grep -E 'ERROR|SUMMARY|invariant failed|runtime error|Test unit written' "$log" |
                head -8 | sed 's/^/  /'
            for a in "$art"*; do
                [ -f "$a" ] && echo "  input: $a  (fix the decoder, then commit it to tests/fuzz/corpus/$t/)"
            done
        } >"$build/verdict-$t"
    fi
}

# libFuzzer runs one thread per target: one target per core at a time (the suite's time)
jobs_max=${KVF_BUILD_JOBS:-$(nproc)}
for t in "${targets[@]}"; do
    rm -f "$build/verdict-$t"
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
    fuzz_one "$t" &
done
wait
failed=()
for t in "${targets[@]}"; do
    if [ "$(head -1 "$build/verdict-$t" 2>/dev/null)" = ok ]; then
        tail -n +2 "$build/verdict-$t"
    else
        tail -n +2 "$build/verdict-$t" 2>/dev/null || echo "$t: no verdict"
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzzing failed: ${failed[*]}"
    exit 1
fi
echo "fuzzing passed: ${#targets[@]} targets, ${secs} s each"
