#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install what is missing,
# build, then show the layout plan for the bundled models.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash deploy/install-deps.sh
bash deploy/build.sh
bin="$root/build/bin"
models="$root/tests/data/models"

echo "== tiny hybrid (bundled), TP-stable alignment =="
"$bin/kvf" plan --model "$models/tiny-hybrid.config.json" --layouts 1p1d,4p2d,1p4d,4p1d,2p4d \
    --prompt-tokens 256
echo "== Nemotron-3-Nano-30B-A3B, fp8 KV, per-rank alignment (what upstream does) =="
"$bin/kvf" plan --model "$models/nemotron-3-nano-30b-a3b.config.json" --kv-dtype fp8 \
    --block-size 32 --align per-rank --layouts 1p2d,4p2d || true
