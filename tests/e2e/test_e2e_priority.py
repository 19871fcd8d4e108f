#!/usr/bin/env python3
"""A queued burst is admitted by "priority" (lower first, arrival within one) with
--scheduling-policy priority (deploy/proxy/kvf_proxy_admit.h), as vLLM's priority scheduling
orders its waiting queue; under the default fcfs a non-zero priority is a 400 naming it.

A 1p1d pool of the trained tiny model, kvf-proxy at --max-outstanding 1: a long stream holds
the pool's one slot; six requests with priorities 3, 1, 2, 0, 1, -1 are sent one after the
other, each seen waiting in the proxy's queue (vllm:num_requests_waiting{engine="proxy"})
before the next; then the stream's client leaves (the slot frees). With --max-outstanding 1
they are admitted one at a time; each one's admission is its send time plus the time the
proxy says it waited in its queue (ttft_breakdown.proxy_queue_ms), and the admissions must
come in the order -1, 0, 1 (the first sent), 1, 2, 3. (The order the answers reach the
client threads is not used: on a loaded host two answers a few ms apart can swap.) Each
request decodes 400 tokens, so admissions are a whole request apart (a tenth of a second and
more): the send time stands in for the proxy's arrival, and under a -j3 suite a send reached
the proxy some tens of ms late, which swapped two 48-token requests' estimates.
Rerun: python3 tests/e2e/test_e2e_priority.py
"""

import http.client
import json
import os
import threading
import time

from kvf_e2e import Pool, repo_root

MODEL = os.path.join(repo_root(), "models-trained", "tiny-dense")
PRIORITIES = [3, 1, 2, 0, 1, -1]


def waiting(pool):
    m = pool.metrics()
    return sum(v for (n, ls), v in m.samples.items()
               if n == "vllm:num_requests_waiting" and ("engine", "proxy") in ls)


def post(pool, body):
    st, _, raw = pool.request("POST", "/v1/completions", body)
    return st, json.loads(raw)


def poll(cond, what, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


def main():
    with Pool(layout="1p1d", model=MODEL, timeout=90,
              proxy_args=["--scheduling-policy", "priority", "--max-outstanding", "1"]) as pool:
        blocker = http.client.HTTPConnection(pool.host, pool.port, timeout=60)
        blocker.request("POST", "/v1/completions", json.dumps(
            {"prompt": "The ferry", "max_tokens": 4000, "ignore_eos": True, "stream": True,
             "temperature": 0}), {"Content-Type": "application/json"})
        resp = blocker.getresponse()
        assert resp.status == 200, resp.status
        resp.readline()   # the first chunk: it holds the slot now
        admitted, lock = {}, threading.Lock()

        def one(i, prio):
            sent = time.monotonic()
            st, _, raw = pool.request("POST", "/v1/completions", {
                "prompt": "The ferry crosses", "max_tokens": 400, "ignore_eos": True,
                "temperature": 0, "priority": prio}, timeout=120)
            body = json.loads(raw) if st == 200 else {}
            with lock:   # admitted: sent + the time it waited in the proxy's queue
                admitted[i] = (sent * 1000.0 +
                               body.get("ttft_breakdown", {}).get("proxy_queue_ms", 1e9), st)

        threads = []
        for i, prio in enumerate(PRIORITIES):
            t = threading.Thread(target=one, args=(i, prio))
            t.start()
            threads.append(t)
            poll(lambda: waiting(pool) == i + 1, "request %d (priority %d) to queue" % (i, prio))
        print("ok: %d requests queued behind the stream" % len(PRIORITIES))
        blocker.close()   # the client leaves: its slot frees, the queue drains
        for t in threads:
            t.join(timeout=120)
        assert len(admitted) == len(PRIORITIES) and \
            all(st == 200 for _, st in admitted.values()), admitted
        seq = sorted(admitted, key=lambda i: admitted[i][0])
        print("admitted in the order (index, priority):", [(i, PRIORITIES[i]) for i in seq])
        assert [PRIORITIES[i] for i in seq] == sorted(PRIORITIES), seq
        assert [i for i in seq if PRIORITIES[i] == 1] == [1, 4], seq   # arrival within one
        print("ok: admitted by priority, arrival order within one")
        st, body = post(pool, {"prompt": "x", "max_tokens": 1, "priority": "high"})
        assert st == 400 and body["param"] == "priority", (st, body)
    with Pool(layout="1p1d", model=MODEL, timeout=90) as pool:
        st, body = post(pool, {"prompt": "x", "max_tokens": 1, "priority": 2})
        assert st == 400 and body["param"] == "priority" and \
            "--scheduling-policy priority" in body["message"], (st, body)
        st, _ = post(pool, {"prompt": "x", "max_tokens": 1, "priority": 0})
        assert st == 200, st
        print("ok: fcfs refuses a non-zero priority by name, takes 0")
    print("test_e2e_priority passed")


if __name__ == "__main__":
    main()
