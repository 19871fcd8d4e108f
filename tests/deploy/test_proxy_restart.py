"""kvf-proxy when a daemon is killed and started again on the same port at once
(a supervisor's restart, an operator's `kvf-up --restart`): requests sent on
the new connection must not be failed for the old connection's loss.

The proxy fails the calls of a lost connection a short grace after ZeroMQ
reports the loss (so the dead daemon's last replies are delivered first).
Calls sent after the loss went to the new daemon and must live. The fake
prefill holds each answer 400 ms, so a request sent right after the restart is
still waiting when the grace of the previous loss runs out: without the
per-connection accounting it gets 502 "closed the connection".

Last, a new proxy in front of the running daemons: requests sent before its
first health round wait for it instead of getting 503.
"""

import threading
import time

import proxy_testlib as T
from kvf_e2e import HttpError, free_port_range, wait_for

ROUNDS = 5


def main():
    T.run_with_procs(lambda a, procs, tmp: run(a, procs))


def prefill_serving(px, engine_id):
    """The proxy sees the restarted process (its engine id), healthy: not the dead one it has
    not yet noticed."""
    p = px.health()[1]["prefill"][0]
    return p["healthy"] and p.get("engine_id") == engine_id


def run(a, procs):
    base = free_port_range(2)
    pre = ["--fake-prefill-delay-ms", "400"]
    prefill = T.start_fake(procs, a.testbin, "prefill", "prefill-0", base, pre)
    T.start_fake(procs, a.testbin, "decode", "decode-0", base + 1)
    _, px = T.start_proxy(procs, a.fakebin, "tcp://127.0.0.1:%d" % base,
                          "tcp://127.0.0.1:%d" % (base + 1),
                          ["--model-name", "m", "--health-interval", "10ms"])
    px.wait_healthy(timeout=10)
    r = px.complete("hello", max_tokens=3)
    T.check(r["choices"][0]["text"] == "hel", "first answer before any restart")

    gaps = []
    for i in range(ROUNDS):
        prefill.kill()
        prefill.wait()
        t_kill = time.monotonic()
        name = "prefill-0.%d" % i
        prefill = T.start_fake(procs, a.testbin, "prefill", name, base, pre)
        wait_for(lambda: prefill_serving(px, name), 10, "the restarted prefill to be healthy",
                 interval=0.005)
        gaps.append(time.monotonic() - t_kill)
        try:
            r = px.complete("world", max_tokens=3, timeout=10)
        except HttpError as e:
            raise AssertionError("round %d: request on the new connection failed %.0f ms after "
                                 "the kill: %s" % (i, 1000 * gaps[-1], e))
        T.check(r["choices"][0]["text"] == "wor",
                "round %d: answered by the restarted prefill (healthy %.0f ms after the kill)"
                % (i, 1000 * gaps[-1]))
    inside = sum(1 for g in gaps if g < 0.2)
    print("%d of %d rounds sent their request inside the old connection's 200 ms grace"
          % (inside, ROUNDS))
    restarted_proxy(a, procs, base)


def restarted_proxy(a, procs, base):
    """A proxy (re)started in front of running daemons answers the requests it gets
    before its first health round when that round completes, not with 503s: with a
    1 s probe interval its first probe (sent before it is connected) fails, the
    second comes 1 s later, and requests sent at once wait for it."""
    _, px = T.start_proxy(procs, a.fakebin, "tcp://127.0.0.1:%d" % base,
                          "tcp://127.0.0.1:%d" % (base + 1),
                          ["--model-name", "m", "--health-interval", "1s"], name="proxy-new")
    results = []

    def one():
        t0 = time.monotonic()
        try:
            r = px.complete("again", max_tokens=2, timeout=20)
            results.append((r["choices"][0]["text"], time.monotonic() - t0))
        except HttpError as e:
            results.append((e, time.monotonic() - t0))
    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("requests sent as the proxy started waited %s s" %
          ", ".join("%.2f" % r[1] for r in results))
    T.check(all(r[0] == "ag" for r in results), "a restarted proxy answers the requests sent "
            "before its first probes (no 503)", results)


if __name__ == "__main__":
    main()
