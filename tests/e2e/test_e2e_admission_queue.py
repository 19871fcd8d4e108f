#!/usr/bin/env python3
"""A burst the pool can serve in time is served, not refused (issue 32 item 3;
deploy/proxy/kvf_proxy_admit.h).

An idle 1p1d pool of the tiny model behind kvf-proxy with its default
--max-outstanding 128 per instance. One client opens 200 concurrent streams
(max_tokens 32; every connection opened first, then the 200 requests written
back to back by one thread, tests/e2e/kvf_burst.py): the ones past the bound
wait in the proxy's admission queue instead of getting a 503. Must hold:
every one of the 200 answers 200 with 32 tokens, the proxy counts no rejection
(kvf_proxy_rejected_total is 0 for every reason),
vllm:num_requests_waiting{engine="proxy"} is back to 0, the most outstanding at
prefill seen never passed 128, and when it reached 128,
kvf_proxy_admission_queued_total shows requests did wait (a host that finishes
the first streams before the last arrive may never reach the bound).

Then the same burst with --admission-queue-bytes 0 (no queue) and --max-outstanding 2, a
bound the burst passes however fast the host serves (at 16 a run here served all 200
without ever having 16 in flight): some are refused at once with a 503 naming
--max-outstanding and carrying Retry-After.

Rerun: python3 tests/e2e/test_e2e_admission_queue.py
"""

import time

from e2e_models import model_dir
from kvf_e2e import Pool
import kvf_burst

N = 200
MAX_TOKENS = 32


def burst(pool):
    """The answers, and the most outstanding requests seen at prefill and at decode."""
    peak = [0, 0]

    def poll():
        st, h = pool.health()
        if st == 200:
            peak[0] = max(peak[0], h["prefill"][0]["outstanding"])
            peak[1] = max(peak[1], h["decode"][0]["outstanding"])

    return kvf_burst.burst(pool, N, MAX_TOKENS, on_poll=poll), peak


def main():
    model = model_dir("tiny-llama")
    # pages for 200 requests of a few prompt tokens + 32 at once on both sides
    extra = ["--num-blocks", "1024"]
    with Pool(layout="1p1d", model=model, extra_args=extra, timeout=120) as pool:
        t0 = time.monotonic()
        out, peak = burst(pool)
        took = time.monotonic() - t0
        bad = [o for o in out if o["status"] != 200 or o["tokens"] != MAX_TOKENS]
        m = pool.metrics()
        rejected = {r: m.value("kvf_proxy_rejected_total", reason=r) for r in
                    ("predicted_wait", "queue_full", "no_instance", "instance_busy")}
        waiting = [v for (n, ls), v in m.samples.items()
                   if n == "vllm:num_requests_waiting" and ("engine", "proxy") in ls]
        queued = m.value("kvf_proxy_admission_queued_total")
        print("admission queue: %d concurrent %d-token streams, %d served in %.1f s, %d of them "
              "waited in the proxy's queue, most outstanding at prefill, decode seen %s, "
              "rejected %s" % (
                  N, MAX_TOKENS, N - len(bad), took, queued, peak, rejected))
        assert not bad, bad[:3]
        assert all(v == 0 for v in rejected.values()), rejected
        assert waiting == [0], waiting
        assert peak[0] <= 128, peak
        # a host that serves the first streams before the last arrive may never reach the
        # bound (a peak of 67 at prefill seen here); when prefill reached it, the queue held
        # the rest (test_e2e_admission_burst's 1000 always reach it). Decode's count is not
        # asserted: it is taken when prefill answers, after the pick (peaks of 148-196 here)
        assert queued > 0 or peak[0] < 128, (queued, peak)
        assert m.value("kvf_proxy_admission_queue_requests") == 0

    with Pool(layout="1p1d", model=model, extra_args=extra, timeout=120,
              proxy_args=["--admission-queue-bytes", "0", "--max-outstanding", "2"]) as pool:
        out, _ = burst(pool)
        refused = [o for o in out if o["status"] == 503]
        served = [o for o in out if o["status"] == 200 and o["tokens"] == MAX_TOKENS]
        print("without the queue: %d served, %d refused with 503" % (len(served), len(refused)))
        assert len(served) + len(refused) == N, [o for o in out if o not in served + refused][:3]
        assert refused and all(o["retry_after"] and "--max-outstanding" in o["body"]
                               for o in refused), refused[:2]


if __name__ == "__main__":
    main()
