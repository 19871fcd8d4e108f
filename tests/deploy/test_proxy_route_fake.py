"""kvf-proxy routes around an instance that answers its health probes but says it
cannot serve (HealthReply.cannot_serve, e.g. a TP world broken by a barrier timeout):
/health shows it unhealthy with the instance's own error, and every request goes to
the other prefill instance (fake daemons behind it)."""

import proxy_testlib as T
from kvf_e2e import free_port_range, wait_for


def main():
    T.run_with_procs(lambda a, procs, tmp: run(a, procs))


def run(a, procs):
    base = free_port_range(3)
    urls = ["tcp://127.0.0.1:%d" % (base + i) for i in range(3)]
    T.start_fake(procs, a.testbin, "prefill", "prefill-0", base, ["--fake-mode", "cannot-serve"])
    T.start_fake(procs, a.testbin, "prefill", "prefill-1", base + 1)
    T.start_fake(procs, a.testbin, "decode", "decode-0", base + 2)
    _, px = T.start_proxy(procs, a.fakebin, ",".join(urls[:2]), urls[2], ["--model-name", "m"])
    px.wait_healthy(timeout=10)

    def broken():
        p0 = px.health()[1]["prefill"][0]
        return (not p0["healthy"]) and "cannot serve" in p0.get("error", "") and p0
    p0 = wait_for(broken, 10, "prefill-0 reported unhealthy with its error")
    T.check("TP barrier 'fake step' timed out" in p0["error"],
            "/health shows the instance's own error: %s" % p0["error"])
    used = set()
    for i in range(6):
        r = px.complete("abc%d" % i, max_tokens=2, model="m", timeout=10)
        used.add(r.get("prefill_instance"))
    T.check(used == {urls[1]}, "6 requests all went to the prefill that can serve", used)


if __name__ == "__main__":
    main()
