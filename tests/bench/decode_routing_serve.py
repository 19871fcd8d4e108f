#!/usr/bin/env python3
"""kvf-proxy routing decode by its own prefix cache (docs/PREFIX_CACHE.md section 7, "Decode by
its own cache"): kvf bench-serve's multi_turn workload (11 conversations of 10 turns: a 256-token
first question, then a 32-token answer and a 64-token question per turn; 11, not issue 39's 10:
bench-serve sends turn t of every conversation before turn t + 1, so with an even count round
robin over two decode instances would send each conversation to one instance by coincidence) through one prefill
and two decode instances publishing KV events, trained tiny hybrid, 400 blocks per rank, with
--routing prefix at each weight given and --routing load. Prints per run decode's hit rate
(the two decode instances' own counters, from the proxy's /health), the requests the proxy
routed to a decode by prefix, the KV bytes pulled per request and TTFT.

    KVF_BIN=build/bin python3 tests/bench/decode_routing_serve.py [CONCURRENCY] [WEIGHTS] [MODEL]

WEIGHTS: comma list of --decode-prefix-routing-weight values (default 1,4).
"""

import csv
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from kvf_e2e import Pool, find_bin, repo_root, wait_for  # noqa: E402

EVENTS = ["--kv-events-endpoint=tcp://127.0.0.1:*",
          "--kv-events-replay-endpoint=tcp://127.0.0.1:*"]


def decode_counts(pool):
    d = pool.health()[1]["decode"]
    return (sum(x["prefix_cache_hits"] for x in d), sum(x["prefix_cache_queries"] for x in d),
            sum(x["prefix_routed"] for x in d))


def main():
    conc = sys.argv[1] if len(sys.argv) > 1 else "2"
    weights = (sys.argv[2] if len(sys.argv) > 2 else "1,4").split(",")
    model = (sys.argv[3] if len(sys.argv) > 3 else
             os.path.join(repo_root(), "models-trained", "tiny-hybrid"))
    args = ["--dataset-name", "multi_turn", "--multi-turn-conversations", "11",
            "--multi-turn-turns", "10", "--multi-turn-first-len", "256",
            "--multi-turn-question-len", "64", "--multi-turn-answer-len", "32",
            "--num-prompts", "110", "--max-concurrency", conc, "--metric-percentiles", "50,99",
            "--token-hi", "256"]
    kvf = os.path.join(find_bin(), "kvf")
    for routing, weight in [("prefix", w) for w in weights] + [("load", "1")]:
        out = tempfile.NamedTemporaryFile(suffix=".csv", delete=False).name
        with Pool(layout="1p1d", model=model, prefill_instances=1, decode_instances=2,
                  timeout=120, decode_args=EVENTS,
                  proxy_args=["--routing=" + routing, "--decode-prefix-routing-weight=" + weight],
                  extra_args=["--num-blocks", "400"]) as pool:
            if routing == "prefix":
                wait_for(lambda: all(d.get("kv_events", {}).get("subscribed")
                                     for d in pool.health()[1]["decode"]), 20,
                         "the proxy subscribed to both decode instances")
            c0 = decode_counts(pool)
            p = subprocess.run([kvf, "bench-serve", "--base-url", pool.url] + args +
                               ["--csv", out], capture_output=True, text=True, timeout=1200)
            if p.returncode != 0:
                sys.exit("kvf bench-serve failed:\n" + p.stderr[-2000:])
            with open(out) as f:
                rows = [r for r in csv.DictReader(f) if r["ok"] == "1"]
            os.unlink(out)
            n = sum(int(r["prompt_tokens"]) for r in rows)
            got = {}

            def probed():   # the health probes carry decode's counters: wait for every pull
                got["c"] = decode_counts(pool)
                return got["c"][1] - c0[1] >= n
            wait_for(probed, 20, "decode's counters in the proxy's /health")
            c1 = got["c"]
        h, q, routed = (c1[i] - c0[i] for i in range(3))
        print("1 prefill + 2 decode, concurrency %s, --routing %s%s: decode hits %d of %d prompt"
              " tokens (%.3f), %d requests routed to a decode by prefix, KV pulled %.0f bytes"
              " per request" % (conc, routing, " (weight %s)" % weight if routing == "prefix"
                                else "", h, q, h / q if q else 0.0, routed,
                                statistics.mean(float(r["kv_bytes"]) for r in rows)))
        for line in p.stdout.splitlines():
            if "TTFT" in line or "Successful" in line:
                print("  " + line.strip())


if __name__ == "__main__":
    main()
