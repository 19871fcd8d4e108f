#!/usr/bin/env python3
"""kvf-proxy's --routing prefix against --routing load (docs/PREFIX_CACHE.md section 7): vLLM's
prefix_repetition workload through kvf bench-serve (prefix 2048, suffix 128, 10 prefixes, output
32, 40 requests, two at a time) against a pool of N prefill instances publishing KV events and
one decode instance, trained tiny hybrid, 400 blocks per rank. Prints per routing mode the hit
rate the proxy counted, the requests routed by prefix and TTFT.

    KVF_BIN=build/bin python3 tests/bench/prefix_routing_serve.py [N_PREFILL] [CONCURRENCY] \
        [WEIGHTS]

WEIGHTS: comma list of --prefix-routing-weight values to run --routing prefix with (default 1).
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from kvf_e2e import Pool, find_bin, repo_root  # noqa: E402


def main():
    n_prefill = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    conc = sys.argv[2] if len(sys.argv) > 2 else "2"
    weights = (sys.argv[3] if len(sys.argv) > 3 else "1").split(",")
    args = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "2048",
            "--prefix-repetition-suffix-len", "128", "--prefix-repetition-num-prefixes", "10",
            "--prefix-repetition-output-len", "32", "--num-prompts", "40",
            "--max-concurrency", conc, "--metric-percentiles", "50,99", "--token-hi", "400"]
    model = os.path.join(repo_root(), "models-trained", "tiny-hybrid")
    kvf = os.path.join(find_bin(), "kvf")
    for routing, weight in [("prefix", w) for w in weights] + [("load", "1")]:
        with Pool(layout="1p1d", model=model, prefill_instances=n_prefill, timeout=120,
                  prefill_args=["--kv-events-endpoint=tcp://127.0.0.1:*",
                                "--kv-events-replay-endpoint=tcp://127.0.0.1:*"],
                  proxy_args=["--routing=" + routing, "--prefix-routing-weight=" + weight],
                  extra_args=["--num-blocks", "400"]) as pool:
            m0 = pool.metrics()
            p = subprocess.run([kvf, "bench-serve", "--base-url", pool.url] + args,
                               capture_output=True, text=True, timeout=1200)
            m1 = pool.metrics()
        if p.returncode != 0:
            sys.exit("kvf bench-serve failed:\n" + p.stderr[-2000:])
        d = {k: m1.sum(k) - m0.sum(k) for k in (
            "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
            "kvf_instance_prefix_routed_total")}
        h, q = d["vllm:prefix_cache_hits_total"], d["vllm:prefix_cache_queries_total"]
        print("%d prefill instances, concurrency %s, --routing %s%s: hits %d of %d prompt tokens "
              "(%.3f), %d requests routed by prefix" % (n_prefill, conc, routing,
                                                        " (weight %s)" % weight
                                                        if routing == "prefix" else "", h, q,
                                                        h / q if q else 0.0,
                                                        d["kvf_instance_prefix_routed_total"]))
        for line in p.stdout.splitlines():
            if "TTFT" in line or "Successful" in line or "throughput" in line.lower():
                print("  " + line.strip())


if __name__ == "__main__":
    main()
