#!/usr/bin/env python3
"""Transfers progress while prefill computes (docs/ARCHITECTURE.md §9).

32 concurrent clients send prompts of several hundred tokens to a 4p2d pool
(one prefill instance with TP 4, two decode instances with TP 2) on default
settings, so prefill is busy computing while decode instances pull earlier
prompts' KV from it. Expected: 0 failed requests, 0 transfer timeouts (no
peer error on any instance, none in the decode logs), every answer equal to
the colocated run (within fp32 tolerance for 4p2d), and every page back
afterwards. Prints p50/p99 transfer time under this load; the benchmark
tests/e2e/bench_transfer_load.py prints it beside an idle pool's.
"""

import os
import sys
import threading
import time

from e2e_models import check_tokens, model_dir, reference
from kvf_e2e import Pool, wait_for

N_CLIENTS = 32
MAX_TOKENS = 8
# byte-level tokenizer: about one token per character, so ~330-420 tokens each
PROMPTS = ["client group %d: " % i + "the ferry carries KV blocks across the water, "
           * (7 + i % 3) for i in range(8)]


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def run_load(pool, n_clients, refs=None):
    """n_clients concurrent requests; returns (transfer_ms list, wall seconds)."""
    results, errors = [None] * n_clients, []

    def worker(i):
        prompt = PROMPTS[i % len(PROMPTS)]
        try:
            r = pool.complete(prompt, max_tokens=MAX_TOKENS, temperature=0,
                              return_token_ids=True, timeout=120)
            results[i] = (prompt, r)
        except Exception as e:          # reported below with the request index
            errors.append((i, repr(e)))

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    wall = time.monotonic() - t0
    assert not errors, "%d of %d requests failed: %s" % (len(errors), n_clients, errors[:3])
    assert all(r is not None for r in results), "a request never finished"
    xfer = []
    for i, (prompt, r) in enumerate(results):
        kv = r["kv_transfer"]
        assert not kv["recomputed"], "request %d was recomputed: %s" % (i, kv)
        assert kv["bytes"] > 0, kv
        xfer.append(kv["transfer_ms"])
        if refs is not None:
            ref_tokens, ref_logits = refs[prompt]
            check_tokens(r["choices"][0]["token_ids"], ref_tokens, ref_logits, False,
                         "request %d" % i)
    return xfer, wall


def pages(pool):
    h = pool.health()[1]
    return {i["url"]: (i["free_pages"], i["total_pages"]) for i in h["prefill"] + h["decode"]}


def main():
    model = model_dir("tiny-hybrid")
    refs = {p: reference(model, p, MAX_TOKENS) for p in PROMPTS}
    with Pool(layout="4p2d", model=model, decode_instances=2, timeout=90) as pool:
        start = pages(pool)
        xfer, wall = run_load(pool, N_CLIENTS, refs)
        h = pool.health()[1]
        for inst in h["prefill"] + h["decode"]:
            assert inst["healthy"], inst
            assert inst["peer_errors"] == 0, inst
        for name in ("decode-0", "decode-1"):
            log = pool.log(name)
            assert "timed out" not in log and "did not answer in time" not in log, log[-2000:]
        wait_for(lambda: pages(pool) == start, 15, "every page back after the load")
    print("%d concurrent clients, 4p2d: 0 failed, 0 transfer timeouts, answers match;"
          " transfer p50 %.2f ms p99 %.2f ms; %.1f s" % (
              N_CLIENTS, percentile(xfer, 50), percentile(xfer, 99), wall))
    print("test_e2e_load passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
