#!/usr/bin/env python3
"""kvf bench-serve's prefix_repetition workload (vLLM's: prefix 2048, suffix 128, 10 prefixes,
output 32) or its multi_turn one (10 conversations of 10 turns: a 256-token first question,
then a 32-token answer and a 64-token question per turn) against a pool of the trained tiny
hybrid, with --prefix-caching on and then off: TTFT and the hit rate the proxy counted
(vllm:prefix_cache_hits_total / queries_total, prefill's cache), decode's own hit rate (its
/metrics: the prompt tokens whose KV it held, docs/PREFIX_CACHE.md §6) and the KV bytes
decode pulled per request; for multi_turn also per turn (bench-serve's --csv rows: request i
is turn i / 10 + 1): prompt tokens, KV bytes pulled and TTFT p50.

    KVF_BIN=build/bin python3 tests/bench/prefix_cache_serve.py [LAYOUT] [NUM_BLOCKS] [DATASET] \
        [MODEL]

MODEL is a checkpoint folder (default models-trained/tiny-hybrid), e.g. a random one of a
larger hybrid geometry made with `kvf mkmodel` (tests/bench/results/prefix_cache_cpu.md).

Defaults 1p1d and 400 blocks per rank (the 10 prefixes' 270 blocks fit; at the daemons'
default 256 the pool evicts and the hit rate falls below the workload's maximum).
One request at a time (--max-concurrency 1), so TTFT is compute, not queueing.
"""

import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from kvf_e2e import Metrics, Pool, find_bin, free_port_range, repo_root, wait_for  # noqa: E402,E501


def decode_metrics(port):
    return Metrics(urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10)
                   .read().decode())


def per_turn(rows, conversations):
    """multi_turn: per turn, mean prompt tokens and KV bytes pulled; p50 of TTFT, of the pull
    (transfer_ms) and of the first token decode computed (first_decode_token_ms), in ms."""
    turns = {}
    for r in rows:
        turns.setdefault(int(r["index"]) // conversations + 1, []).append(r)
    for t in sorted(turns):
        rs = turns[t]

        def p50(key):
            return statistics.median(float(r[key]) for r in rs)
        print("  turn %2d: prompt %6.0f tokens, KV pulled %9.0f bytes, TTFT p50 %6.1f ms, "
              "pull p50 %5.2f ms, first decode token p50 %6.1f ms" %
              (t, statistics.mean(float(r["prompt_tokens"]) for r in rs),
               statistics.mean(float(r["kv_bytes"]) for r in rs), p50("ttft_ms"),
               p50("transfer_ms"), p50("first_decode_token_ms")))


def main():
    layout = sys.argv[1] if len(sys.argv) > 1 else "1p1d"
    blocks = sys.argv[2] if len(sys.argv) > 2 else "400"
    dataset = sys.argv[3] if len(sys.argv) > 3 else "prefix_repetition"
    if dataset == "multi_turn":
        args = ["--dataset-name", "multi_turn", "--multi-turn-conversations", "10",
                "--multi-turn-turns", "10", "--multi-turn-first-len", "256",
                "--multi-turn-question-len", "64", "--multi-turn-answer-len", "32",
                "--num-prompts", "100"]
    else:
        args = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "2048",
                "--prefix-repetition-suffix-len", "128", "--prefix-repetition-num-prefixes",
                "10", "--prefix-repetition-output-len", "32", "--num-prompts", "40"]
    model = (sys.argv[4] if len(sys.argv) > 4 else
             os.path.join(repo_root(), "models-trained", "tiny-hybrid"))
    kvf = os.path.join(find_bin(), "kvf")
    # token ids drawn below 400, or below the tokenizer's size when smaller (kvf mkmodel's
    # byte-level tokenizer has 256: the proxy refuses an id past it)
    with open(os.path.join(model, "tokenizer.json")) as f:
        tok = json.load(f)
    token_hi = min(400, len(tok["model"].get("vocab", {})) + len(tok.get("added_tokens", [])))
    # (prefill's, decode's) --prefix-caching: both, prefill's cache alone, none
    for pc, dc in (("on", "on"), ("on", "off"), ("off", "off")):
        dport = free_port_range(1)
        out = tempfile.NamedTemporaryFile(suffix=".csv", delete=False).name
        with Pool(layout=layout, model=model, timeout=120,
                  prefill_args=["--prefix-caching=" + pc],
                  decode_args=["--prefix-caching=" + dc, "--metrics-port=%d" % dport],
                  extra_args=["--num-blocks", blocks]) as pool:
            m0, d0 = pool.metrics(), decode_metrics(dport)
            p = subprocess.run([kvf, "bench-serve", "--base-url", pool.url] + args +
                               ["--max-concurrency", "1", "--metric-percentiles", "50,99",
                                "--token-hi", str(token_hi), "--csv", out], capture_output=True,
                               text=True, timeout=1200)
            if p.returncode != 0:
                sys.exit("kvf bench-serve failed:\n" + p.stderr[-2000:])
            with open(out) as f:
                rows = [r for r in csv.DictReader(f) if r["ok"] == "1"]
            os.unlink(out)
            # decode publishes its numbers every 100 ms: wait until they hold every pull
            got = {}

            def published():
                got["d"] = decode_metrics(dport)
                return (got["d"].sum("kvf_daemon_kv_pulls_total") -
                        d0.sum("kvf_daemon_kv_pulls_total")) >= len(rows)
            wait_for(published, 10, "decode's /metrics to count every pull")
            m1, d1 = pool.metrics(), got["d"]

        def delta(a, b, name):
            return b.sum(name) - a.sum(name)
        h = delta(m0, m1, "vllm:prefix_cache_hits_total")
        q = delta(m0, m1, "vllm:prefix_cache_queries_total")
        dh = delta(d0, d1, "vllm:prefix_cache_hits_total")
        dq = delta(d0, d1, "vllm:prefix_cache_queries_total")
        print("%s %s, %s blocks, --prefix-caching prefill %s decode %s: prefill hits %d of %d"
              " prompt tokens (%.3f), decode hits %d of %d (%.3f), KV pulled %.0f bytes per"
              " request" % (dataset, layout, blocks, pc, dc, h, q, h / q if q else 0.0, dh, dq,
                            dh / dq if dq else 0.0,
                            statistics.mean(float(r["kv_bytes"]) for r in rows)))
        for line in p.stdout.splitlines():
            if "TTFT" in line or "Successful" in line:
                print("  " + line.strip())
        if dataset == "multi_turn":
            per_turn(rows, 10)


if __name__ == "__main__":
    main()
