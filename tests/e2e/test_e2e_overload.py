#!/usr/bin/env python3
"""Overload is answered at once, and no new work goes to a dead instance
(issue 23, deploy/proxy/kvf_proxy_route.h).

1. Overload: a 2p1d pool of the tiny model (--prefill-timeout 8s). Capacity is
   measured with closed-loop clients, then open-loop Poisson arrivals come at 3x
   it with prompts of 40-560 tokens (not capped to the prefill rate). Must hold:
   no 504 (admission refuses what would wait past the deadline), no wrong
   answer (token for token equal to the colocated `kvf generate`, within fp32
   tolerance), no other failure, every 503 with Retry-After and within
   REJECT_BOUND_S (generous; tests/bench/overload.py prints the real figure),
   and /metrics kvf_proxy_rejected_total equal to the 503s the clients saw.
2. Decode killed while its requests are in prefill: a 1p2d pool; a burst of long
   prompts queues at prefill, then decode-0 is SIGKILLed. Every request is
   served by decode-1 (re-routed after prefill), none fails, none is answered
   by the dead instance.
3. Bounded queues: prefill --max-queue 2 and the proxy's --max-outstanding 3 (no
   admission queue: --admission-queue-bytes 0);
   a burst of 10 long prompts: each is served or refused at once with a 503
   that names the bound, at most 2 wait at prefill at any time (/health).
"""

import os
import signal
import sys
import threading
import time

from e2e_models import model_dir
from kvf_e2e import Pool, wait_for
import kvf_overload as ov

REJECT_BOUND_S = 1.0
FACTOR = 3.0


def overload(model, refs):
    with Pool(layout="1p1d", model=model, prefill_instances=2, decode_instances=1,
              proxy_args=["--prefill-timeout", "8s"], timeout=120) as pool:
        for p in ov.PROMPTS[:2]:
            assert ov.post(pool, p)["status"] == 200
        cap, cap_res = ov.capacity(pool, clients=12, seconds=8.0)
        cc = ov.classify(cap_res, refs)
        assert cc["wrong"] == 0 and cc["504"] == 0 and cc["other"] == 0, cc["others"][:3]
        print("capacity: %.2f req/s (%d served, %d refused in the closed loop)" % (
            cap, cc["served"], cc["503"]))
        assert cap > 0, "nothing served in the capacity phase"
        res, first, last = ov.open_loop(pool, FACTOR * cap, 12.0)
        c = ov.classify(res, refs)
        text, goodput = ov.report("2p1d overload", c, cap, first, last, FACTOR * cap)
        print(text)
        m = pool.metrics()
        rejected = m.sum("kvf_proxy_rejected_total")
        assert c["504"] == 0, "504s under overload: %s" % c["others"][:3]
        assert c["wrong"] == 0, c["others"][:3]
        assert c["other"] == 0, c["others"][:3]
        assert c["served"] > 0 and c["503"] > 0, c
        assert c["no_retry_after"] == 0, "a 503 without Retry-After"
        assert max(c["reject_s"]) < REJECT_BOUND_S, "a 503 took %.2f s" % max(c["reject_s"])
        # the capacity phase may have met a few refusals too (closed loop, 12 clients)
        assert rejected == c["503"] + cc["503"], (
            "proxy counted %d rejections, clients saw %d + %d 503s" % (rejected, c["503"],
                                                                       cc["503"]))


def decode_killed_in_prefill(model, refs):
    with Pool(layout="1p1d", model=model, prefill_instances=1, decode_instances=2,
              timeout=120) as pool:
        _, h = pool.health()
        urls = [d["url"] for d in h["decode"]]
        assert ov.post(pool, ov.PROMPTS[0])["status"] == 200
        long_prompt = len(ov.PROMPTS) - 1
        results, lock = [], threading.Lock()

        def one():
            r = ov.post(pool, ov.PROMPTS[long_prompt], timeout=120)
            with lock:
                results.append(r)

        threads = [threading.Thread(target=one) for _ in range(12)]
        for t in threads:
            t.start()
        # the burst is queued at prefill (12 x 560 tokens): kill decode-0 now
        wait_for(lambda: pool.health()[1]["prefill"][0]["outstanding"] >= 6, 10,
                 "requests queued at prefill")
        t_kill = time.monotonic()
        os.kill(pool.pids()["decode-0"], signal.SIGKILL)
        for t in threads:
            t.join(timeout=180)
        statuses = [r["status"] for r in results]
        assert statuses == [200] * 12, statuses
        c = ov.classify([dict(r, prompt=long_prompt) for r in results], refs)
        assert c["served"] == 12, c["others"][:3]
        rerouted = int(pool.metrics().value("kvf_proxy_decode_reroutes_total", 0))
        print("decode-0 killed with %d requests in prefill (%.1f s after the burst began):"
              " %d served, %d re-routed to %s after prefill" % (
                  12, time.monotonic() - t_kill, c["served"], rerouted, urls[1]))
        assert rerouted > 0, "no request was re-routed (did any reach prefill before the kill?)"


def bounded_queues(model, refs):
    # no admission queue in the proxy: the bounds themselves answer (the queue is
    # tests/e2e/test_e2e_admission_queue.py)
    with Pool(layout="1p1d", model=model, prefill_args=["--max-queue", "2"],
              proxy_args=["--max-outstanding", "3", "--admission-queue-bytes", "0"],
              timeout=120) as pool:
        assert ov.post(pool, ov.PROMPTS[0])["status"] == 200
        p0 = pool.health()[1]["prefill"][0]
        assert p0["max_queue"] == 2, p0
        results, lock, peak = [], threading.Lock(), [0]
        long_prompt = len(ov.PROMPTS) - 1

        def one():
            r = ov.post(pool, ov.PROMPTS[long_prompt], timeout=120)
            with lock:
                results.append(dict(r, prompt=long_prompt))

        threads = [threading.Thread(target=one) for _ in range(10)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            peak[0] = max(peak[0], pool.health()[1]["prefill"][0]["outstanding"])
            time.sleep(0.05)
        c = ov.classify(results, refs)
        print("bounded queues: 10 long prompts at prefill --max-queue 2: %d served, %d refused"
              " with 503 (max %.0f ms), at most %d outstanding at prefill" % (
                  c["served"], c["503"], 1000 * max(c["reject_s"] or [0]), peak[0]))
        assert c["served"] + c["503"] == 10, c["others"][:3]
        assert c["served"] >= 2 and c["503"] >= 1, c
        assert peak[0] <= 2, "prefill held %d requests (--max-queue 2)" % peak[0]
        assert max(c["reject_s"]) < REJECT_BOUND_S, max(c["reject_s"])
        m = pool.metrics()
        assert m.value("kvf_proxy_rejected_total", reason="queue_full") >= 1, m.text[-2000:]


def main():
    parts = sys.argv[1:] or ["overload", "reroute", "bounds"]   # one part by name, for reruns
    model = model_dir("tiny-hybrid")
    refs = ov.references(model)
    if "overload" in parts:
        overload(model, refs)
    if "reroute" in parts:
        decode_killed_in_prefill(model, refs)
    if "bounds" in parts:
        bounded_queues(model, refs)
    print("test_e2e_overload passed")


if __name__ == "__main__":
    raise SystemExit(main())
