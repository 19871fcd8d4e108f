#!/usr/bin/env bash
# The fuzz targets' seed corpus (tests/fuzz/corpus/<target>/) from the real
# encoders (make_seeds.c).
#   make_corpus.sh FUZZ_MAKE_SEEDS          write the seeds into the corpus
#   make_corpus.sh --check FUZZ_MAKE_SEEDS  fail when a committed seed differs
#                                           from what the encoders write now
# Regression inputs (crash-*, timeout-*, oom-*) found by fuzzing are kept as they are.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
gen=${1:?usage: make_corpus.sh [--check] FUZZ_MAKE_SEEDS}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$gen" "$tmp"
bad=0
for f in "$tmp"/*/*; do
    rel=${f#"$tmp"/}
    if [ "$check" = 1 ]; then
        if ! cmp -s "$f" "$here/corpus/$rel"; then
            echo "seed $rel is missing or stale in tests/fuzz/corpus (rerun tests/fuzz/make_corpus.sh)"
            bad=1
        fi
    else
        mkdir -p "$here/corpus/$(dirname "$rel")"
        cp "$f" "$here/corpus/$rel"
    fi
done
if [ "$check" = 1 ] && [ "$bad" = 0 ]; then
    echo "all $(find "$tmp" -type f | wc -l) seeds current"
fi
exit "$bad"
