"""The discovery the Helm chart relies on, against the real kvf-proxy and fake
daemons: the proxy is given one endpoint per possible instance by DNS name
(as the chart lists every StatefulSet ordinal up to maxReplicas), most of
which have no daemon yet, and scaling up and down needs no change to it.

1. --decode lists three names: localhost:D0 (a daemon), localhost:D1 (none
   yet) and a name that does not resolve (a pod that does not exist). The
   proxy is healthy (200) with the one instance, routes every request to it,
   and reports the other two unhealthy.
2. Scale up: a daemon starts on D1. The same proxy process (no restart, no
   new arguments) finds it healthy within seconds and routes to both.
3. Scale down: that daemon stops; the proxy marks it unhealthy and keeps
   serving from the first.
4. The name that never resolves costs no more than a bounded reconnect
   (ZeroMQ's reconnect interval, 1 s at most) and never becomes healthy.

Rerun:
  python3 tests/deploy/test_k8s_slots.py --fakebin build/tests/fakebin --testbin build/tests/bin
"""

import tempfile
import time

import proxy_testlib as T
from kvf_e2e import free_port_range, wait_for


def main():
    a = T.args()
    procs = T.Procs(tempfile.mkdtemp(prefix="kvf-slots."))
    try:
        base = free_port_range(4)
        pre, d0, d1 = base, base + 2, base + 3
        T.start_fake(procs, a.testbin, "prefill", "prefill-0", pre)
        T.start_fake(procs, a.testbin, "decode", "decode-0", d0)
        slots = ["tcp://localhost:%d" % d0, "tcp://localhost:%d" % d1,
                 "tcp://kvf-decode-2.kvf-decode.invalid:%d" % d1]
        proxy, px = T.start_proxy(procs, a.fakebin, "tcp://127.0.0.1:%d" % pre, ",".join(slots))

        def decode_health():
            st, h = px.health()
            return st, {d["url"]: d["healthy"] for d in h["decode"]}

        wait_for(lambda: decode_health()[0] == 200, 15, "proxy healthy with one decode")
        st, hd = decode_health()
        T.check(st == 200 and hd == {slots[0]: True, slots[1]: False, slots[2]: False},
                "three decode slots, one daemon: 200, slots 2 and 3 unhealthy", hd)
        used = {px.complete("hi!", max_tokens=2)["decode_instance"] for _ in range(4)}
        T.check(used == {slots[0]}, "requests go to the one live decode", used)

        t0 = time.monotonic()
        late = T.start_fake(procs, a.testbin, "decode", "decode-1", d1)
        wait_for(lambda: decode_health()[1][slots[1]], 15, "scaled-up decode healthy")
        dt = time.monotonic() - t0
        T.check(proxy.poll() is None, "same proxy process after the scale-up")
        used = set()
        wait_for(lambda: used.add(px.complete("hi!", max_tokens=2)["decode_instance"]) or
                 used == {slots[0], slots[1]}, 15, "requests reach both decodes")
        T.check(True, "scale up without touching the proxy: decode-1 healthy in %.1f s and "
                "routed to" % dt)

        procs.stop(late)
        wait_for(lambda: not decode_health()[1][slots[1]], 15, "stopped decode unhealthy")
        used = {px.complete("hi!", max_tokens=2)["decode_instance"] for _ in range(3)}
        T.check(used == {slots[0]} and decode_health()[0] == 200,
                "scale down: the stopped slot is unhealthy, requests still served")
        T.check(not decode_health()[1][slots[2]], "the unresolvable name never became healthy")
    finally:
        procs.stop_all()
    log = procs.log("proxy")
    noisy = [l for l in log.splitlines() if "kvf-decode-2.kvf-decode.invalid" in l]
    T.check(len(noisy) <= 10, "the missing slot is logged a bounded number of times (%d lines)"
            % len(noisy), "\n".join(noisy[:20]))
    print("slots: scale-up found in %.1f s by the running proxy; missing slots unhealthy, "
          "not routed" % dt)


if __name__ == "__main__":
    main()
