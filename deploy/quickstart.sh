#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install what is missing,
# build, write the bundled tiny hybrid checkpoint if absent, launch a local
# 4p2d pool (one prefill instance with TP 4, one decode instance with TP 2,
# and the proxy), send a few prompts through the proxy, print each answer
# with its time to first token and KV transfer stats and whether its tokens equal
# a colocated one-process run, and stop the pool.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash deploy/install-deps.sh
bash deploy/build.sh
bin="$root/build/bin"
model="$root/models/tiny-hybrid"
layout="${1:-4p2d}"   # first argument: another layout, e.g. 2p4d

if [ ! -f "$model/model.safetensors" ]; then
    "$bin/kvf" mkmodel --config tests/data/models/tiny-hybrid.config.json --out "$model" --seed 1
fi

echo "== layout plan for the tiny hybrid model =="
"$bin/kvf" plan --model "$model" --layouts "$layout" --prompt-tokens 256

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/kvferry-run.XXXXXX")
trap '"$bin/kvf-down" --run-dir "$run_dir" >/dev/null 2>&1 || true; rm -rf "$run_dir"' EXIT
url=$("$bin/kvf-up" --layout "$layout" --prefill-instances 1 --decode-instances 1 \
      --model "$model" --run-dir "$run_dir" --port 0 2>"$run_dir/kvf-up.err" | tail -n 1) || {
    cat "$run_dir/kvf-up.err" >&2; exit 1; }
echo "== pool $layout is up at $url =="

python3 - "$url" "$bin/kvf" "$model" <<'PY'
import json, subprocess, sys, urllib.request
url, kvf, model = sys.argv[1:4]
prompts = ["The ferry crossed the bay at dawn", "Prefill computes; decode pulls.",
           "kvferry moves KV blocks and Mamba state between"]
for p in prompts:
    body = json.dumps({"prompt": p, "max_tokens": 24, "temperature": 0,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        d = json.load(r)
    kv = d["kv_transfer"]
    print("prompt: %r" % p)
    # the bundled model has random weights: its bytes are noise (invalid UTF-8
    # arrives as U+FFFD); what matters is that they equal a colocated run's
    print("answer: %r" % d["choices"][0]["text"])
    print("  ttft %.1f ms | prefill %.1f ms | %d tokens | kv pulled %d bytes in %d descriptors"
          " from %d reads, handshake %.2f ms, transfer %.2f ms%s" % (
              d["ttft_ms"], d.get("prefill_ms", 0), d["usage"]["completion_tokens"],
              kv["bytes"], kv["descriptors"], kv["reads"], kv["handshake_ms"],
              kv["transfer_ms"], " (recomputed)" if kv.get("recomputed") else ""))
    # the same prompt in one process, no transfer: the tokens must be the same
    out = subprocess.run([kvf, "generate", "--model", model, "--tp", "1", "--prompt", p,
                          "--max-tokens", "24"], capture_output=True, check=True).stdout
    line = [l for l in out.decode("latin-1").splitlines() if l.startswith("tokens:")][0]
    colocated = [int(t) for t in line.split()[1:]]
    same = colocated == d["choices"][0]["token_ids"]
    # (fp32 sums in another order may flip a near-tie: tests/e2e checks the margins)
    print("  same tokens as a colocated TP1 run: %s" % ("yes" if same else "no"))
PY
"$bin/kvf-down" --run-dir "$run_dir"
