#!/bin/bash
# Descriptors per pull and host plan+post time for every layout of the matrix (issue 41
# item 4), on whatever device the pools are given (default: host memory, UCX over shared
# memory): one `kvf bench` per cell, every byte verified, and the same request with
# coalescing off (one descriptor per run: blocks x layer slots x K/V x heads) beside it.
#
#   tests/bench/descs_per_pull.sh [--kvf build-dev/bin/kvf] [--model CONFIG] [--tokens 8192]
#                                 [--iters 5] [--device cpu|cuda:N] [--path auto|ucx|ipc]
#                                 [--kv-layout layer-major|head-major]
# (--kv-layout: both sides' attention block layout, docs/ARCHITECTURE.md §7)
#
# Prints one markdown row per cell:
#   layout | blocks P:D | descs per rank (coalesced) | per pull (total) | uncoalesced total |
#   plan us (per rank, median) | plan+post ms | post cpu us/desc | verify
# Exit 1 when a cell fails its verify (a cell the layout cannot take prints "refused").
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
kvf=$root/build-dev/bin/kvf
model=$root/tests/data/models/nemotron-nano-9b-v2.config.json
tokens=8192 iters=5 device=cpu path=auto kvl=layer-major
while [ $# -gt 0 ]; do
    case $1 in
        --kvf) kvf=$2 ;; --model) model=$2 ;; --tokens) tokens=$2 ;; --iters) iters=$2 ;;
        --device) device=$2 ;; --path) path=$2 ;; --kv-layout) kvl=$2 ;;
        *) echo "descs_per_pull.sh: unknown flag '$1'" >&2; exit 2 ;;
    esac
    shift 2
done
[ -x "$kvf" ] || { echo "descs_per_pull.sh: no kvf at $kvf (--kvf)" >&2; exit 2; }
out=$(mktemp -d) || exit 2
trap 'rm -rf "$out"' EXIT
alloc=(--kv-layout "$kvl")
[ "$device" = cpu ] && alloc+=(--pool-alloc heap)

# one cell: layout, prefill block, decode block (0: derived), extra flags
cell() {
    local lay=$1 pb=$2 db=$3 f="$out/c.txt" g="$out/nc.txt" rc per tot nc plan pp cpu blk
    shift 3
    "$kvf" bench --model "$model" --layout "$lay" --tokens "$tokens" --iters "$iters" \
        --prefill-block-size "$pb" --decode-block-size "$db" --device "$device" \
        --path "$path" "${alloc[@]}" --copy-limit no --verify yes "$@" >"$f" 2>&1
    rc=$?
    "$kvf" bench --model "$model" --layout "$lay" --tokens "$tokens" --iters 1 \
        --prefill-block-size "$pb" --decode-block-size "$db" --device "$device" \
        --path "$path" "${alloc[@]}" --copy-limit no --no-coalesce yes "$@" >"$g" 2>&1
    blk=$(sed -n 's/^  prefill: block \([0-9]*\) kernel \([0-9]*\).*/\1 (k\2)/p' "$f"):$(sed -n \
        's/^  decode:  block \([0-9]*\) kernel \([0-9]*\).*/\1 (k\2)/p' "$f")
    if [ "$rc" -ne 0 ] || ! grep -q '^verify: ok' "$f"; then
        if grep -qi 'refus\|smallest block size' "$f"; then
            echo "| $lay | $pb:$db | refused | - | - | - | - | - | $(grep -i 'refus\|smallest' \
                "$f" | head -1 | cut -c1-80) |"
            return 0
        fi
        echo "| $lay | $blk | - | - | - | - | - | - | FAIL (exit $rc) |"
        grep -i 'error\|fail' "$f" | head -3 >&2
        return 1
    fi
    per=$(sed -n 's/^post: \([0-9]*\) descriptors.*/\1/p' "$f")
    tot=$(sed -n 's/^transfer: [0-9]* bytes, \([0-9]*\) descriptors.*/\1/p' "$f")
    nc=$(sed -n 's/^transfer: [0-9]* bytes, \([0-9]*\) descriptors.*/\1/p' "$g")
    plan=$(sed -n 's/^plan: \([0-9.]*\) us.*/\1/p' "$f")
    pp=$(sed -n 's/^plan+post time: \([0-9.]*\) ms.*/\1/p' "$f")
    cpu=$(sed -n 's/^post cpu: [0-9.]* us, \([0-9.]*\) us\/desc.*/\1/p' "$f")
    echo "| $lay | $blk | $per | $tot | ${nc:--} | $plan | $pp | $cpu | ok |"
}

echo "# kvf bench, $(basename "$model"), $tokens tokens, kv layout $kvl, device $device," \
     "path $path," \
     "$iters pulls (medians), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
echo "| layout | blocks P:D | descs per rank | per pull | uncoalesced per pull |" \
     "plan us | plan+post ms | post cpu us/desc | verify |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
fail=0
for lay in 1p1d 1p2d 2p1d 2p2d 4p2d 2p4d 1p4d 4p1d 4p4d; do
    cell "$lay" 0 0 || fail=1
done
# prefill and decode block sizes differ (either way), at equal and unequal TP
for lay in 1p1d 4p2d 1p4d 4p1d; do
    cell "$lay" 2624 1312 || fail=1
    cell "$lay" 1312 2624 || fail=1
    # the same with one kernel block size on both sides (a decode page is whole remote kernel
    # blocks: no per-head runs)
    cell "$lay" 2624 1312 --prefill-kernel-sizes 1312 --decode-kernel-sizes 1312 || fail=1
done
exit $fail
