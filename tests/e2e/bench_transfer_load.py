#!/usr/bin/env python3
"""Benchmark (not a test): KV transfer time of a 4p2d pool, idle vs loaded.

Idle: requests one at a time, so prefill is not computing while decode
pulls. Loaded: 32 concurrent clients with prompts of several hundred
tokens, so pulls overlap prefill's engine steps. Prints p50/p99 of the
per-request transfer time decode measured (kv_transfer.transfer_ms).

    KVF_BIN=build/bin python3 tests/e2e/bench_transfer_load.py [rounds]
"""

import sys

from e2e_models import model_dir
from kvf_e2e import Pool
from test_e2e_load import N_CLIENTS, PROMPTS, MAX_TOKENS, percentile, run_load


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    model = model_dir("tiny-hybrid")
    with Pool(layout="4p2d", model=model, decode_instances=2, timeout=90) as pool:
        idle = []
        for i in range(N_CLIENTS):
            r = pool.complete(PROMPTS[i % len(PROMPTS)], max_tokens=MAX_TOKENS, temperature=0)
            idle.append(r["kv_transfer"]["transfer_ms"])
        loaded, walls = [], []
        for _ in range(rounds):
            x, wall = run_load(pool, N_CLIENTS)
            loaded += x
            walls.append(wall)
    print("4p2d tiny-hybrid, prompts of %d-%d tokens" % (
        min(len(p) for p in PROMPTS) + 1, max(len(p) for p in PROMPTS) + 1))
    print("%-28s %6s %9s %9s" % ("", "n", "p50 ms", "p99 ms"))
    print("%-28s %6d %9.2f %9.2f" % ("idle (one at a time)", len(idle), percentile(idle, 50),
                                     percentile(idle, 99)))
    print("%-28s %6d %9.2f %9.2f" % ("%d concurrent clients" % N_CLIENTS, len(loaded),
                                     percentile(loaded, 50), percentile(loaded, 99)))
    print("loaded rounds took %s s" % ", ".join("%.1f" % w for w in walls))


if __name__ == "__main__":
    main()
