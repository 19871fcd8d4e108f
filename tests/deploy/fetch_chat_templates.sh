#!/usr/bin/env bash
# The real chat templates test_chat_template_real.py renders, fetched at test time (no template
# text is committed): PyPI's llama-cpp-python 0.3.36 sdist (MIT) carries 70 Hugging Face chat
# templates in vendor/llama.cpp/models/templates/*.jinja. The sdist is downloaded once with pip
# (pip's own PIP_INDEX_URL / PIP_FIND_LINKS apply; KVF_CHAT_TEMPLATES_SDIST names a local copy
# instead), checked against its sha256, and only the templates folder and the licence files
# are kept, in
#   ${KVF_CHAT_TEMPLATES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvferry/chat-templates}/llama-cpp-python-0.3.36
# (templates/, LICENSE*, and a stamp with the sdist's sha256). Safe to rerun: does nothing when
# the stamp matches. Exit 1 (said why) when the sdist cannot be had or does not match.
set -euo pipefail
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
dir="${KVF_CHAT_TEMPLATES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvferry/chat-templates}"
dest="$dir/llama-cpp-python-$version"
if [ "$(cat "$dest/sha256" 2>/dev/null)" = "$sha256" ]; then
    exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
sdist="${KVF_CHAT_TEMPLATES_SDIST:-}"
if [ -z "$sdist" ]; then
    # --no-binary: the sdist (the wheels carry no templates); --no-deps: nothing else
    python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" \
        "llama-cpp-python==$version" >/dev/null 2>&1 || {
        echo "kvferry: could not download llama-cpp-python==$version (offline?)" >&2
        exit 1
    }
    sdist="$tmp/llama_cpp_python-$version.tar.gz"
fi
got=$(sha256sum "$sdist" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
    echo "kvferry: $sdist has sha256 $got, expected $sha256" >&2
    exit 1
fi
top="llama_cpp_python-$version"
tar -xzf "$sdist" -C "$tmp" "$top/LICENSE.md" "$top/vendor/llama.cpp/LICENSE" \
    "$top/vendor/llama.cpp/models/templates"
rm -rf "$dest.new"
mkdir -p "$dest.new"
mv "$tmp/$top/vendor/llama.cpp/models/templates" "$dest.new/templates"
mv "$tmp/$top/LICENSE.md" "$dest.new/LICENSE-llama-cpp-python.md"
mv "$tmp/$top/vendor/llama.cpp/LICENSE" "$dest.new/LICENSE-llama.cpp"
echo "$sha256" >"$dest.new/sha256"
rm -rf "$dest"
mv "$dest.new" "$dest"
echo "kvferry: $(ls "$dest/templates"/*.jinja | wc -l) chat templates in $dest"
