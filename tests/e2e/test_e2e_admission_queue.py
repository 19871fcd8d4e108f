#!/usr/bin/env python3
"""A burst the pool can serve in time is served, not refused (issue 32 item 3;
deploy/proxy/kvf_proxy_admit.h).

An idle 1p1d pool of the tiny model behind kvf-proxy with its default
--max-outstanding 128 per instance. One client opens 200 concurrent streams
(max_tokens 32; every connection opened first, then the 200 requests sent
together): the ones past the bound wait in the proxy's admission queue
instead of getting a 503. Must hold: every one of the 200 answers 200 with 32
tokens, the proxy counts no rejection (kvf_proxy_rejected_total is 0 for
every reason), vllm:num_requests_waiting{engine="proxy"} is back to 0, and
kvf_proxy_admission_queued_total shows requests did wait (the queue was used; the
most outstanding at prefill seen never passed 128 while 200 were in flight).

Then the same burst with --admission-queue-bytes 0 (no queue) and --max-outstanding 16, a
bound the burst passes however its requests spread in time (at 128 a fast host can finish
the first streams before the last arrive): some are refused at once with a 503 naming
--max-outstanding and carrying Retry-After.

Rerun: python3 tests/e2e/test_e2e_admission_queue.py
"""

import http.client
import json
import threading
import time

from e2e_models import model_dir
from kvf_e2e import Pool

N = 200
MAX_TOKENS = 32


def stream(pool, i, out, start):
    body = {"prompt": "burst %d" % i, "max_tokens": MAX_TOKENS, "stream": True,
            "ignore_eos": True, "return_token_ids": True, "temperature": 0.0}
    conn = http.client.HTTPConnection(pool.host, pool.port, timeout=120)
    try:
        conn.connect()
        start.wait(timeout=60)   # every connection open first: the requests go out together
        t0 = time.monotonic()
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read().decode("utf-8", "replace")
        ids = []
        if r.status == 200:
            for ln in raw.split("\n"):
                if ln.startswith("data:") and ln[5:].strip() != "[DONE]":
                    ev = json.loads(ln[5:])
                    ids += ev.get("choices", [{}])[0].get("token_ids", [])
        out[i] = {"status": r.status, "tokens": len(ids), "retry_after":
                  r.getheader("Retry-After"), "body": raw[:300],
                  "s": time.monotonic() - t0}
    except (OSError, threading.BrokenBarrierError) as e:
        out[i] = {"status": "exception", "body": repr(e), "tokens": 0}
    finally:
        conn.close()


def burst(pool):
    out = [None] * N
    start = threading.Barrier(N)
    threads = [threading.Thread(target=stream, args=(pool, i, out, start)) for i in range(N)]
    peak = [0]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        st, h = pool.health()
        if st == 200:
            peak[0] = max(peak[0], h["prefill"][0]["outstanding"])
        time.sleep(0.05)
    return out, peak[0]


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
              "waited in the proxy's queue, most outstanding at prefill seen %d, rejected %s" % (
                  N, MAX_TOKENS, N - len(bad), took, queued, peak, rejected))
        assert not bad, bad[:3]
        assert all(v == 0 for v in rejected.values()), rejected
        assert waiting == [0], waiting
        assert peak <= 128, peak
        assert queued > 0, queued   # the burst went past the bound: the queue held the rest
        assert m.value("kvf_proxy_admission_queue_requests") == 0

    with Pool(layout="1p1d", model=model, extra_args=extra, timeout=120,
              proxy_args=["--admission-queue-bytes", "0", "--max-outstanding", "16"]) as pool:
        out, _ = burst(pool)
        refused = [o for o in out if o["status"] == 503]
        served = [o for o in out if o["status"] == 200 and o["tokens"] == MAX_TOKENS]
        print("without the queue: %d served, %d refused with 503" % (len(served), len(refused)))
        assert len(served) + len(refused) == N, [o for o in out if o not in served + refused][:3]
        assert refused and all(o["retry_after"] and "--max-outstanding" in o["body"]
                               for o in refused), refused[:2]


if __name__ == "__main__":
    main()
