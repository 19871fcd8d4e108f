#!/usr/bin/env bash
# kvf generate --prompt-ids: a checkpoint without tokenizer.json runs when given token ids,
# with the same tokens as the text prompt of those bytes on the same weights with their
# tokenizer; without ids it is refused naming --prompt-ids; ids outside the vocabulary
# are refused naming the id (in kvf tokenize --decode too). kvf generate --help and kvf matrix
# --help are complete.
set -euo pipefail
KVF="${KVF_BIN:?}/kvf"
SRC="${KVF_SOURCE_DIR:?}"
T="$(mktemp -d /tmp/kvf-ids-XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$KVF" mkmodel --config "$SRC/tests/data/models/tiny-hybrid.config.json" --out "$T/m" --seed 2 >/dev/null
cp -r "$T/m" "$T/bare" && rm "$T/bare/tokenizer.json"
text="$("$KVF" generate --model "$T/m" --prompt 'Hi!' --max-tokens 6 --ignore-eos yes | grep '^tokens:')"
ids="$("$KVF" generate --model "$T/bare" --prompt-ids 72,105,33 --max-tokens 6 --ignore-eos yes)"
[ "$ids" = "$text" ] || fail "ids without tokenizer.json: '$ids', text with it: '$text'"
echo "ok: no tokenizer.json, --prompt-ids 72,105,33: $ids (= the text prompt 'Hi!')"
if err="$("$KVF" generate --model "$T/bare" --prompt 'Hi!' 2>&1)"; then fail "ran without a tokenizer"; fi
grep -q -- '--prompt-ids' <<<"$err" || fail "refusal does not name --prompt-ids: $err"
echo "ok: a text prompt without tokenizer.json is refused, pointing at --prompt-ids"
if err="$("$KVF" generate --model "$T/bare" --prompt-ids 72,99999 2>&1)"; then fail "bad id ran"; fi
grep -q "'99999' is not a token id" <<<"$err" || fail "bad id not named: $err"
echo "ok: an id outside the vocabulary is refused by value"
# kvf tokenize --decode: ids back to text; a non-number or an id outside the vocabulary is
# refused by value (it once decoded up to the first bad id and exited 0)
enc="$("$KVF" tokenize --model "$T/m" --text 'Hi!')"
[ "$("$KVF" tokenize --model "$T/m" --decode "$enc")" = 'Hi!' ] || fail "decode of '$enc'"
for bad in "$enc abc" "$enc 99999" "-3"; do
    if err="$("$KVF" tokenize --model "$T/m" --decode "$bad" 2>&1)"; then
        fail "tokenize --decode '$bad' accepted: $err"
    fi
    grep -q -- "--decode: .* is not a token id" <<<"$err" || fail "'$bad' not named: $err"
done
echo "ok: kvf tokenize --decode round-trips 'Hi!' and refuses a bad id by value"
"$KVF" generate --help | grep 'byte tokenizer' >/dev/null && fail "kvf generate --help still says byte tokenizer"
echo "ok: kvf generate --help names the tokenizer.json"
help="$("$KVF" matrix --help)"
grep -q 'any fail or error, 2 on bad usage' <<<"$help" || fail "kvf matrix --help stops mid-description"
grep -q -- '--layouts 1p1d,4p2d \\$' <<<"$help" || fail "kvf matrix --help has no example"
for f in layouts block-sizes dtypes limit max-tokens tokens hardware base-port no-accuracy json bin; do
    grep -qE -- "^  --$f( [A-Z_]+)? +[a-zA-Z(]|^  --$f [A-Z_]+$" <<<"$help" || fail "--$f has no help"
done
echo "ok: kvf matrix --help: the whole description, the example, every flag explained"
