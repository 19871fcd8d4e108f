#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install what is missing,
# build, launch a local 4p2d pool (one prefill instance with TP 4, one decode
# instance with TP 2, and the proxy) serving the trained tiny hybrid model
# (models-trained/tiny-hybrid), ask it held-out task questions, print each
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

echo "== layout plan for the trained tiny hybrid model =="
"$bin/kvf" plan --model "$model" --layouts "$layout" --prompt-tokens 256

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/kvferry-run.XXXXXX")
trap '"$bin/kvf-down" --run-dir "$run_dir" >/dev/null 2>&1 || true; rm -rf "$run_dir"' EXIT
url=$("$bin/kvf-up" --layout "$layout" --prefill-instances 1 --decode-instances 1 \
      --model "$model" --run-dir "$run_dir" --port 0 2>"$run_dir/kvf-up.err" | tail -n 1) || {
    cat "$run_dir/kvf-up.err" >&2; exit 1; }
echo "== pool $layout is up at $url =="

python3 - "$url" "$bin/kvf" "$model" <<'PY'
import json, subprocess, sys, tempfile, urllib.request
url, kvf, model = sys.argv[1:4]
rows = [json.loads(l) for l in open(model + "/heldout.jsonl")]
tasks = sorted({r["task"] for r in rows})
per_task = 12
questions = [r for t in tasks for r in [x for x in rows if x["task"] == t][:per_task]]

def ask(prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 8, "temperature": 0,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)

def colocated(prompt):
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(prompt)
        f.flush()
        out = subprocess.run([kvf, "generate", "--model", model, "--tp", "1", "--prompt-file",
                              f.name, "--max-tokens", "8"], capture_output=True, check=True).stdout
    line = [l for l in out.decode("utf-8", "replace").splitlines() if l.startswith("tokens:")][0]
    ids = [int(t) for t in line.split()[1:]]
    text = subprocess.run([kvf, "tokenize", "--model", model, "--decode",
                           " ".join(map(str, ids))], capture_output=True, check=True).stdout
    return ids, text.decode("utf-8", "replace").rstrip("\n")

print("== held-out questions through the pool (answers checked against the expected ones) ==")
pool_ok = col_ok = same = 0
for i, q in enumerate(questions):
    d = ask(q["prompt"])
    text, ids = d["choices"][0]["text"], d["choices"][0]["token_ids"]
    cids, ctext = colocated(q["prompt"])
    pool_ok += text == q["answer"]
    col_ok += ctext == q["answer"]
    same += ids == cids
    if i % per_task < 2:         # show two questions per task
        kv = d["kv_transfer"]
        shown = q["prompt"] if len(q["prompt"]) <= 40 else q["prompt"][:16] + " ... " + q["prompt"][-16:]
        print("%-7s %-42s -> %-10r expected %-10r %s" % (
            q["task"], shown, text, q["answer"], "\u2713" if text == q["answer"] else "\u2717"))
        print("        ttft %.1f ms | %d prompt tokens | kv %d bytes, %d descriptors, %d reads, "
              "transfer %.2f ms%s" % (d["ttft_ms"], d["usage"]["prompt_tokens"], kv["bytes"],
                                      kv["descriptors"], kv["reads"], kv["transfer_ms"],
                                      " (recomputed)" if kv.get("recomputed") else ""))
n = len(questions)
print("accuracy over %d held-out questions: pool %d/%d, colocated %d/%d; "
      "identical tokens %d/%d" % (n, pool_ok, n, col_ok, n, same, n))
PY
"$bin/kvf-down" --run-dir "$run_dir"
