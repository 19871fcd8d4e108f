#!/usr/bin/env python3
"""kvf bench-serve's prefix_repetition workload (vLLM's: prefix 2048, suffix 128, 10 prefixes,
output 32) or its multi_turn one (10 conversations of 10 turns: a 256-token first question,
then a 32-token answer and a 64-token question per turn) against a pool of the trained tiny
hybrid, with --prefix-caching on and then off: TTFT and the hit rate the proxy counted
(vllm:prefix_cache_hits_total / queries_total).

    KVF_BIN=build/bin python3 tests/bench/prefix_cache_serve.py [LAYOUT] [NUM_BLOCKS] [DATASET]

Defaults 1p1d and 400 blocks per rank (the 10 prefixes' 270 blocks fit; at the daemons'
default 256 the pool evicts and the hit rate falls below the workload's maximum).
One request at a time (--max-concurrency 1), so TTFT is compute, not queueing.
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from kvf_e2e import Pool, find_bin, repo_root  # noqa: E402


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
    model = os.path.join(repo_root(), "models-trained", "tiny-hybrid")
    kvf = os.path.join(find_bin(), "kvf")
    for caching in ("on", "off"):
        with Pool(layout=layout, model=model, timeout=120,
                  extra_args=["--prefix-caching", caching, "--num-blocks", blocks]) as pool:
            m0 = pool.metrics()
            p = subprocess.run([kvf, "bench-serve", "--base-url", pool.url] + args +
                               ["--max-concurrency", "1", "--metric-percentiles", "50,99",
                                "--token-hi", "400"], capture_output=True, text=True,
                               timeout=1200)
            m1 = pool.metrics()
        if p.returncode != 0:
            sys.exit("kvf bench-serve failed:\n" + p.stderr[-2000:])
        h = m1.sum("vllm:prefix_cache_hits_total") - m0.sum("vllm:prefix_cache_hits_total")
        q = m1.sum("vllm:prefix_cache_queries_total") - m0.sum("vllm:prefix_cache_queries_total")
        print("%s %s, %s blocks, --prefix-caching %s: hits %d of %d prompt tokens (%.3f)" %
              (dataset, layout, blocks, caching, h, q, h / q if q else 0.0))
        for line in p.stdout.splitlines():
            if "TTFT" in line or "Successful" in line:
                print("  " + line.strip())


if __name__ == "__main__":
    main()
