#!/usr/bin/env python3
"""Overload benchmark (figures, not a test): a 2p1d pool of the tiny model under about
3x the load it can serve (issue 23: overload answered at once, not with 30 s timeouts).

  1. capacity: --clients closed-loop clients for --capacity-seconds; requests/s answered
     200 is the measured capacity
  2. overload: open-loop Poisson arrivals at --factor x capacity for --seconds

and prints: served (200 and token for token equal to the colocated `kvf generate`),
503s (and whether each carried Retry-After), 504s (target 0), wrong answers (target 0),
rejection latency p50/p99/max (target max < 100 ms), and goodput (served per second from
the first arrival to the last answer) as a share of capacity (target >= 90 %), plus the
proxy's kvf_proxy_rejected_total by reason.

Prompts are 40-560 tokens, not capped to the prefill rate. --prefill-timeout is the
proxy's (the deadline admission holds the predicted wait to).

    KVF_BIN=build/bin python3 tests/bench/overload.py [--factor 3] [--seconds 30]
        [--capacity-seconds 20] [--clients 16] [--prefill-timeout 10s] [--json]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))

from e2e_models import model_dir  # noqa: E402
from kvf_e2e import Pool  # noqa: E402
import kvf_overload as ov  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--capacity-seconds", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--prefill-timeout", default="10s")
    ap.add_argument("--model", default="tiny-hybrid")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    model = model_dir(a.model)
    refs = ov.references(model)
    with Pool(layout="1p1d", model=model, prefill_instances=2, decode_instances=1,
              proxy_args=["--prefill-timeout", a.prefill_timeout], timeout=120) as pool:
        for p in ov.PROMPTS[:2]:            # warm-up: first requests, rates measured
            ov.post(pool, p)
        cap, cap_res = ov.capacity(pool, a.clients, a.capacity_seconds)
        cap_c = ov.classify(cap_res, refs)
        rate = a.factor * cap
        res, first, last = ov.open_loop(pool, rate, a.seconds)
        c = ov.classify(res, refs)
        text, goodput = ov.report("2p1d %s overload" % a.model, c, cap, first, last, rate)
        m = pool.metrics()
        reasons = {lab["reason"]: int(m.value("kvf_proxy_rejected_total", 0, **lab))
                   for lab in m.labels("kvf_proxy_rejected_total")}
    print("capacity phase: %d clients, %d served, %d wrong, %d 503, %d 504" % (
        a.clients, cap_c["served"], cap_c["wrong"], cap_c["503"], cap_c["504"]))
    print(text)
    print("  proxy kvf_proxy_rejected_total: %s" % ", ".join(
        "%s=%d" % (k, v) for k, v in sorted(reasons.items())))
    if a.json:
        print(json.dumps({"capacity_rps": cap, "offered_rps": rate, "served": c["served"],
                          "503": c["503"], "504": c["504"], "wrong": c["wrong"],
                          "other": c["other"],
                          "reject_ms_max": 1000 * max(c["reject_s"] or [0]),
                          "reject_ms_p99": 1000 * ov.pct(c["reject_s"], 99),
                          "goodput_rps": goodput,
                          "goodput_share": goodput / cap if cap else 0,
                          "rejected_by_reason": reasons}))
    if c["others"]:
        print("  first failures: %s" % c["others"][:3])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
