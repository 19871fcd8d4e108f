"""kvf-proxy drains on SIGTERM (fake daemons behind it): it stops accepting
at once, a short request in flight finishes normally, a long stream that
outlives --drain-timeout ends with an error event and [DONE] (and its
decode work is aborted), and the proxy exits 0 soon after."""

import json
import signal
import socket
import threading
import time

import proxy_testlib as T
from kvf_e2e import free_port_range, wait_for


def main():
    T.run_with_procs(lambda a, procs, tmp: run(a, procs))


def run(a, procs):
    base = free_port_range(2)
    T.start_fake(procs, a.testbin, "prefill", "prefill-0", base)
    T.start_fake(procs, a.testbin, "decode", "decode-0", base + 1,
                 ["--fake-token-delay-ms", "100"])
    p, px = T.start_proxy(procs, a.fakebin, "tcp://127.0.0.1:%d" % base,
                          "tcp://127.0.0.1:%d" % (base + 1),
                          ["--model-name", "m", "--drain-timeout", "1500ms"])
    px.wait_healthy(timeout=10)
    out = {}

    def long_stream():
        body = px.completion_body("abcdefgh", max_tokens=200, stream=True, model="m")
        out["long"] = px.stream(body, timeout=30)

    def short_one():
        out["short"] = px.complete("abc", max_tokens=6, model="m", timeout=30)

    t1 = threading.Thread(target=long_stream)
    t1.start()
    wait_for(lambda: px.metrics().value("kvf_proxy_requests_in_flight") == 1, 5,
             "the long stream is in flight")
    t2 = threading.Thread(target=short_one)
    t2.start()
    wait_for(lambda: px.metrics().value("kvf_proxy_requests_in_flight") == 2, 5,
             "the short request is in flight")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)

    def refused():
        try:
            socket.create_connection(("127.0.0.1", px.port), timeout=1).close()
            return False
        except OSError:
            return True
    wait_for(refused, 1.0, "new connections refused after SIGTERM")
    T.check(True, "SIGTERM: new connections refused at once (%.2f s)" % (time.monotonic() - t0))
    t2.join(timeout=10)
    T.check(out.get("short", {}).get("choices", [{}])[0].get("finish_reason") == "length",
            "a short request in flight finishes normally during the drain", out.get("short"))
    t1.join(timeout=15)
    s = out["long"]
    errs = [e for e in s.events if isinstance(e, dict) and "error" in e]
    T.check(s.events and s.events[-1] == "[DONE]" and len(errs) == 1 and
            "shutting down" in errs[0]["error"]["message"] and
            "--drain-timeout 1500 ms" in errs[0]["error"]["message"],
            "the long stream ends with an error event and [DONE]: %s"
            % (errs[0]["error"]["message"] if errs else s.events[-3:]))
    p.wait(timeout=10)
    dt = time.monotonic() - t0
    T.check(p.returncode == 0 and 1.4 < dt < 6, "proxy exited 0 after the drain (%.1f s)" % dt)
    wait_for(lambda: "fake: abort" in procs.log("decode-0"), 5, "decode got the abort")
    T.check(True, "the ended stream's decode work was aborted")


if __name__ == "__main__":
    main()
