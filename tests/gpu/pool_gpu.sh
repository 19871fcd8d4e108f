#!/usr/bin/env bash
# A 1p1d P/D pool with both daemons on one GPU: kvf-up starts kvf-prefill and
# kvf-decode with --device DEV (default cuda:0, both on the same GPU) and the
# proxy, serving the trained tiny hybrid (models-trained/tiny-hybrid); the
# first --questions held-out questions (default 12, spread over the tasks) go
# through the proxy greedily and each answer's tokens are compared with the
# colocated run, `kvf generate --device DEV` (one process, TP 1) on the same
# device (kvf-pool-answers). Prints one summary line
#
#   pool-gpu: N/M answers equal colocated, pool accuracy A/M, colocated C/M,
#             devices prefill D1 decode D2 (/health), T s
#
# (on one line) and exits 0 only when all M are equal and /health names DEV
# for both daemons; 1 otherwise (the failing step and the logs' tails on
# stderr); 2 for bad usage.
#
#   KVF_BIN_DIR=DIR tests/gpu/pool_gpu.sh [--device cuda:0|cpu] [--questions 12]
#                                          [--model DIR] [--keep-run-dir DIR]
#
# KVF_BIN_DIR: the binaries and kvf-up/kvf-down/kvf-pool-answers (default $KVF_BIN, else
# build/bin of this tree). Every process started is stopped on exit (trap),
# readiness is polled (kvf-up), and the whole run is bounded by
# KVF_POOL_GPU_TIMEOUT seconds (default 90). --device cpu runs the same check
# without a GPU (ctest: test_pool_gpu_cpu; test_daemon_device runs it on a
# simulated GPU).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${KVF_BIN_DIR:-${KVF_BIN:-$root/build/bin}}
model=$root/models-trained/tiny-hybrid
device=cuda:0 questions=12 keep=""
budget=${KVF_POOL_GPU_TIMEOUT:-90}
# read here only: the daemons would warn about KVF_ variables nobody of theirs reads
unset KVF_BIN_DIR KVF_POOL_GPU_TIMEOUT

usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
die_usage() { echo "pool_gpu.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) [[ $# -ge 2 ]] || die_usage "--device needs a value"; device=$2; shift 2 ;;
        --questions) [[ $# -ge 2 ]] || die_usage "--questions needs a value"; questions=$2
                     shift 2 ;;
        --model) [[ $# -ge 2 ]] || die_usage "--model needs a value"; model=$2; shift 2 ;;
        --keep-run-dir) [[ $# -ge 2 ]] || die_usage "--keep-run-dir needs a value"; keep=$2
                        shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die_usage "unknown argument '$1'" ;;
    esac
done
[[ "$questions" =~ ^[1-9][0-9]*$ ]] || die_usage "bad value '$questions' for --questions"
[[ "$budget" =~ ^[1-9][0-9]*$ ]] || die_usage "bad value '$budget' for KVF_POOL_GPU_TIMEOUT"
for x in kvf kvf-prefill kvf-decode kvf-proxy kvf-up kvf-down kvf-pool-answers; do
    [[ -x "$bin/$x" ]] || { echo "pool-gpu: FAIL: $bin/$x missing (KVF_BIN_DIR)"; exit 1; }
done
[[ -r "$model/heldout.jsonl" ]] || { echo "pool-gpu: FAIL: no $model/heldout.jsonl"; exit 1; }

start_s=$SECONDS
if [[ -n "$keep" ]]; then
    run_dir=$keep
    mkdir -p "$run_dir" || exit 1
else
    run_dir=$(mktemp -d "${TMPDIR:-/tmp}/kvf-pool-gpu.XXXXXX") || exit 1
fi
cleanup() {
    "$bin/kvf-down" --run-dir "$run_dir" --timeout 10 >/dev/null 2>&1 || true
    [[ -n "$keep" ]] || rm -rf "$run_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
left() { echo $(( budget - (SECONDS - start_s) )); }
fail() {
    echo "pool-gpu: 0/$questions answers equal colocated: FAIL: $*"
    for f in "$run_dir"/*.log; do
        [[ -e "$f" ]] || continue
        echo "--- last lines of $(basename "$f")" >&2
        tail -n 6 "$f" >&2
    done
    exit 1
}

# the pool (kvf-up polls /health until both daemons answer and the pairing is handshaken)
url=$(timeout "$(left)" "$bin/kvf-up" --layout 1p1d --model "$model" --run-dir "$run_dir" \
      --port 0 --bin "$bin" --device "$device" --timeout "$(( $(left) - 5 ))" \
      2>"$run_dir/kvf-up.err" | tail -n 1)
[[ "$url" == http* ]] ||
    { tail -n 12 "$run_dir/kvf-up.err" >&2; fail "kvf-up did not start the pool"; }

# where /health says each daemon runs
devices=$(timeout 10 python3 - "$url" <<'PY'
import json, sys, urllib.request
h = json.load(urllib.request.urlopen(sys.argv[1] + "/health", timeout=5))
print(" ".join(i.get("device", "none") for r in ("prefill", "decode") for i in h.get(r, [])))
PY
) || fail "no /health from $url"
read -r dev_p dev_d <<< "$devices"
want=$device
[[ "$want" == cuda ]] && want=cuda:0

out=$(timeout "$(left)" "$bin/kvf-pool-answers" --url "$url" --model "$model" --bin "$bin" \
      --device "$device" --limit "$questions" --require-equal --timeout 30 2>&1)
rc=$?
echo "$out" | grep -v '^accuracy over' >&2
line=$(echo "$out" | grep '^accuracy over' | tail -n 1)
if [[ -z "$line" ]]; then
    [[ $rc -eq 124 ]] && fail "no answers within KVF_POOL_GPU_TIMEOUT ${budget} s"
    fail "kvf-pool-answers exited $rc: $(echo "$out" | grep '^kvf-pool-answers:' | tail -n 1)"
fi
# "accuracy over M held-out questions: pool A/M, colocated C/M; identical tokens N/M (T s)"
re='^accuracy over ([0-9]+) .*pool ([0-9]+)/.*colocated ([0-9]+)/.*tokens ([0-9]+)/'
[[ "$line" =~ $re ]] || fail "cannot read '$line'"
m=${BASH_REMATCH[1]} pool=${BASH_REMATCH[2]} col=${BASH_REMATCH[3]} same=${BASH_REMATCH[4]}
verdict=PASS
[[ $rc -eq 0 && "$same" == "$m" && "$m" == "$questions" ]] || verdict=FAIL
[[ "$dev_p" == "$want" && "$dev_d" == "$want" ]] || verdict=FAIL
echo "pool-gpu: $same/$m answers equal colocated, pool accuracy $pool/$m, colocated $col/$m," \
     "devices prefill $dev_p decode $dev_d (/health), $((SECONDS - start_s)) s: $verdict"
[[ $verdict == PASS ]]
