"""A burst of concurrent completion streams from one client whose requests really arrive
together (tests/e2e/test_e2e_admission_queue.py, test_e2e_admission_burst.py).

Every connection is opened first; then one thread writes every request, back to back
(a few ms for a thousand), and a thread per connection reads its answer. Sending from
a thread per connection let a loaded machine spread the arrivals over more than a
stream's service time, so a burst of 200 sometimes never had more than 128 in flight
and the admission queue was not exercised.
"""

import http.client
import json
import socket
import threading
import time


def _read(sock, i, out):
    resp = http.client.HTTPResponse(sock)
    try:
        resp.begin()
        raw = resp.read().decode("utf-8", "replace")
        ids = []
        if resp.status == 200:
            for ln in raw.split("\n"):
                if ln.startswith("data:") and ln[5:].strip() != "[DONE]":
                    ev = json.loads(ln[5:])
                    ids += ev.get("choices", [{}])[0].get("token_ids", [])
        out[i] = {"status": resp.status, "tokens": len(ids),
                  "retry_after": resp.getheader("Retry-After"), "body": raw[:300]}
    except (OSError, http.client.HTTPException, ValueError) as e:
        out[i] = {"status": "exception", "body": repr(e), "tokens": 0}
    finally:
        sock.close()


def burst(pool, n, max_tokens, on_poll=None, timeout=120):
    """n streams of max_tokens (ignore_eos) sent together; returns the answers
    [{status, tokens, retry_after, body}] in order. on_poll() is called every 50 ms
    while they run (sampling /health)."""
    socks = [socket.create_connection((pool.host, pool.port), timeout=timeout)
             for _ in range(n)]
    out = [None] * n
    reqs = []
    for i in range(n):
        body = json.dumps({"prompt": "burst %d" % i, "max_tokens": max_tokens, "stream": True,
                           "ignore_eos": True, "return_token_ids": True,
                           "temperature": 0.0}).encode()
        reqs.append(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                    b"Connection: close\r\n\r\n" % (pool.host.encode(), pool.port, len(body)) +
                    body)
    threads = [threading.Thread(target=_read, args=(socks[i], i, out)) for i in range(n)]
    for t in threads:
        t.start()       # each blocks in recv until its answer comes
    for s, r in zip(socks, reqs):
        s.sendall(r)
    deadline = time.monotonic() + timeout
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        if on_poll is not None:
            on_poll()
        time.sleep(0.05)
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return out
