#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install what is missing,
# build, launch a local 4p2d pool (one prefill instance with TP 4, one decode
# instance with TP 2, and the proxy) serving the trained tiny hybrid model
# (models-trained/tiny-hybrid) after a one-line plan summary per layout (the whole plan in
# build/quickstart-plan.txt), ask it held-out task questions, print each
# answer with the expected one, a check mark, its time to first token and KV
# transfer stats, then the accuracy of a few dozen questions through the pool
# beside the colocated (one process, TP 1) accuracy, and stop the pool.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# set-up and build noise goes to a log; the job's own output stays short
mkdir -p "$root/build"
log="$root/build/quickstart-setup.log"
echo "== installing what is missing and building (log: $log) =="
if ! { bash deploy/install-deps.sh && bash deploy/build.sh; } >"$log" 2>&1; then
    echo "set-up failed; the end of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
fi
bin="$root/build/bin"
model="$root/models-trained/tiny-hybrid"
layout="${1:-4p2d}"   # first argument: another layout, e.g. 2p4d

# the whole plan (per-rank heads, block and page sizes, estimates, terms) goes to a file;
# the job shows each layout's verdict and pull in one line
plan="$root/build/quickstart-plan.txt"
plan_rc=0
"$bin/kvf" plan --model "$model" --layouts "$layout" --prompt-tokens 256 >"$plan" 2>&1 ||
    plan_rc=$?
echo "== layout plan for the trained tiny hybrid model (the whole plan: $plan) =="
awk '/^layout [0-9]/{ if (line != "") print line; line = $0 }
     /^  pull per decode rank|^  reads |^  error|^  refused/{ sub(/^ +/, ""); line = line "; " $0 }
     /^recommended: /{ rec = $0 }
     END { if (line != "") print line; if (rec != "") print rec }' "$plan" | tr -s ' '
if [ "$plan_rc" -ne 0 ]; then
    echo "kvf plan refused layout $layout (exit $plan_rc); the whole plan: $plan" >&2
    exit 1
fi

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/kvferry-run.XXXXXX")
trap '"$bin/kvf-down" --run-dir "$run_dir" >/dev/null 2>&1 || true; rm -rf "$run_dir"' EXIT
url=$("$bin/kvf-up" --layout "$layout" --prefill-instances 1 --decode-instances 1 \
      --model "$model" --run-dir "$run_dir" --port 0 2>"$run_dir/kvf-up.err" | tail -n 1) || {
    cat "$run_dir/kvf-up.err" >&2; exit 1; }
echo "== pool $layout is up at $url =="

echo "== held-out questions through the pool (answers checked against the expected ones) =="
# twelve per task, two of each shown; the colocated run is one process (TP 1)
"$bin/kvf-pool-answers" --url "$url" --model "$model" --bin "$bin" --per-task 12 \
    --show-per-task 2
"$bin/kvf-down" --run-dir "$run_dir" >>"$log" 2>&1   # "stopped ..." lines: the log
echo "== pool stopped =="
