#!/usr/bin/env bash
# The one engine-option table (common/engine/kvf_engine_opts.h) as a user meets it: every
# command that takes an engine option prints the same --help line for it (help, default,
# KVF_ variable), --block-size means the alignment unit everywhere and --exact-block-size the
# size, fp8 KV is parsed by every command and refused by name by those that compute.
set -euo pipefail
B="${KVF_BIN:?}"
SRC="${KVF_SOURCE_DIR:?}"
tiny="$SRC/models-trained/tiny-hybrid"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# name -> the commands that take it (the rest must not list it)
declare -A takes=(
  [model]="prefill decode generate bench-model"
  [tp]="prefill decode generate bench-model"
  [kv-dtype]="prefill decode generate bench-model plan"
  [ssm-dtype]="generate bench-model plan"
  [conv-dtype]="generate bench-model plan"
  [block-size]="prefill decode generate bench-model plan xfer-test"
  [exact-block-size]="generate bench-model plan"
  [num-blocks]="prefill decode generate bench-model"
  [max-batch-tokens]="prefill decode generate bench-model"
  [device]="prefill decode generate bench-model"
  [prefix-caching]="prefill decode generate"
  [prefix-state-bytes]="prefill decode generate"
  [prefix-state-grid]="prefill decode generate"
)
# a flag of the same name with a meaning of its own there: kvf plan and kvf xfer-test read a
# config.json (a file or a folder), and xfer-test's dtypes and device are per side of its pair
declare -A own=([plan]="model" [xfer-test]="model kv-dtype ssm-dtype conv-dtype device")
run_help() {
  case $1 in
    prefill|decode) "$B/kvf-$1" --help ;;
    *) "$B/kvf" "$1" --help ;;
  esac
}
for c in prefill decode generate bench-model plan xfer-test; do
  run_help "$c" > "$tmp/$c.help" || fail "$c --help"
done
n=0
for opt in "${!takes[@]}"; do
  ref=""
  for c in ${takes[$opt]}; do
    line=$(grep -E -- "^  --$opt " "$tmp/$c.help") || fail "$c --help lacks --$opt"
    env=$(tr a-z- A-Z_ <<<"$opt")
    grep -q -- "; env KVF_$env)\$" <<<"$line" || fail "$c --$opt: no KVF_$env in: $line"
    if [[ -z "$ref" ]]; then ref=$line; refc=$c
    elif [[ "$line" != "$ref" ]]; then
      fail "--$opt differs: $refc: $ref / $c: $line"
    fi
    n=$((n + 1))
  done
  for c in prefill decode generate bench-model plan xfer-test; do
    [[ " ${takes[$opt]} " == *" $c "* ]] && continue
    [[ " ${own[$c]:-} " == *" $opt "* ]] && continue
    ! grep -qE -- "^  --$opt " "$tmp/$c.help" || fail "$c lists --$opt, not in the table's list"
  done
done
echo "ok: $n --help lines of ${#takes[@]} engine options, each the same in every command"

# the defaults the table gives, as the lines print them
for d in "tp 1" "kv-dtype bf16" "block-size 16" "exact-block-size 0" "num-blocks 256" \
         "max-batch-tokens 512" "device cpu" "prefix-state-grid 64"; do
  set -- $d
  grep -qE -- "^  --$1 .*\(default: $2; env " "$tmp/generate.help" || fail "--$1 default not $2"
done
grep -q -- "alignment unit" <<<"$(grep -E -- '^  --block-size ' "$tmp/generate.help")" ||
  fail "kvf generate's --block-size is not the alignment unit"
echo "ok: defaults tp 1, kv-dtype bf16, block-size 16 (alignment unit), num-blocks 256, ..."

# fp8 KV: planned by kvf plan, refused by name where the engine computes
"$B/kvf" plan --model "$tiny" --kv-dtype fp8 --layouts 1p1d --json > "$tmp/plan.json" ||
  fail "kvf plan --kv-dtype fp8"
python3 - "$tmp/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))[0]
assert p["verdict"] != "refused", p
assert p["prefill"]["attn_bytes_per_token"] > 0, p
PY
want="bad value 'fp8' for --kv-dtype: the engine does not compute in fp8"
for c in "$B/kvf-prefill --insecure" "$B/kvf-decode --insecure" "$B/kvf generate" \
         "$B/kvf bench-model"; do
  if out=$($c --model "$tiny" --kv-dtype fp8 2>&1); then fail "$c took --kv-dtype fp8"; fi
  grep -qF -- "$want" <<<"$out" || fail "$c --kv-dtype fp8: $out"
done
echo "ok: --kv-dtype fp8 planned by kvf plan, refused by name by the daemons and the engine tools"

# --block-size 0 refused by every command, naming the flag (before the engine is built)
for c in "$B/kvf-prefill --insecure" "$B/kvf generate" "$B/kvf plan"; do
  if out=$($c --model "$tiny" --block-size 0 2>&1); then fail "$c took --block-size 0"; fi
  grep -qF -- "bad value 0 for --block-size" <<<"$out" || fail "$c --block-size 0: $out"
done
# the same generation with the derived size given exactly, and a size too small refused
a=$("$B/kvf" generate --model "$tiny" --prompt-ids 5,6,7 --max-tokens 4 2>/dev/null)
bs=$("$B/kvf" plan --model "$tiny" --layouts 1p1d --json |
     python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["prefill"]["block_size"])')
b=$("$B/kvf" generate --model "$tiny" --prompt-ids 5,6,7 --max-tokens 4 \
     --exact-block-size "$bs" 2>/dev/null)
grep -q '^tokens' <<<"$a" || fail "kvf generate printed no tokens: $a"
[[ "$a" == "$b" ]] || fail "derived and --exact-block-size $bs differ: $a / $b"
if out=$("$B/kvf" generate --model "$tiny" --prompt-ids 5,6,7 --max-tokens 4 \
         --exact-block-size 1 2>&1); then fail "--exact-block-size 1 accepted"; fi
grep -q "block_size 1 is too small" <<<"$out" || fail "--exact-block-size 1: $out"
echo "ok: --block-size 0 refused everywhere; --exact-block-size $bs (the derived size) generates the same, 1 is refused"
echo "PASS test_engine_opts"
