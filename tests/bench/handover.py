#!/usr/bin/env python3
"""Decode handover benchmark (figures, not a test): real daemons, tiny-hybrid 4p2d.

Decode handover is the time from a request's arrival at decode to its first
decode step, less the pull itself: decode_queue + block_alloc + handshake +
post_ops from each answer's ttft_breakdown (decode's phases, max over its TP
ranks; posting and wire are the pull). first_decode_step (committed -> first
token ready, the step's own compute included) is printed beside it. Requests
go one at a time after one warm-up request; medians and p90 are printed.

    KVF_BIN=build/bin python3 tests/bench/handover.py [--requests 20] [--layout 4p2d]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from e2e_models import model_dir  # noqa: E402
from kvf_e2e import Pool  # noqa: E402

HANDOVER = ("decode_queue", "block_alloc", "handshake", "post_ops")
SHOWN = HANDOVER + ("descriptor_posting", "wire", "first_decode_step")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--layout", default="4p2d")
    args = ap.parse_args()
    prompt = "Prefill computes, decode pulls. " * 6
    rows = []
    with Pool(layout=args.layout, model=model_dir("tiny-hybrid"), timeout=90) as pool:
        pool.complete(prompt, max_tokens=2, temperature=0)          # warm-up
        for _ in range(args.requests):
            r = pool.complete(prompt, max_tokens=2, temperature=0)
            bd = r["ttft_breakdown"]
            row = {p: bd[p + "_ms"] for p in SHOWN}
            row["handover"] = sum(bd[p + "_ms"] for p in HANDOVER)
            rows.append(row)
    print("decode handover, tiny-hybrid %s, %d requests one at a time (ms)" % (
        args.layout, len(rows)))
    print("%-20s %9s %9s" % ("phase", "median", "p90"))
    for p in ("handover",) + SHOWN:
        print("%-20s %9.3f %9.3f" % (p, pct([r[p] for r in rows], 0.5),
                                     pct([r[p] for r in rows], 0.9)))
    print("handover: %s" % " + ".join(HANDOVER))
    return 0


if __name__ == "__main__":
    sys.exit(main())
