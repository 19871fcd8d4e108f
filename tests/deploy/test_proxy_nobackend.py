"""kvf-proxy with no healthy backend: the HTTP surface still answers
correctly (503 for work it cannot do, 400 for bad requests, 200 for
/v1/models and /metrics), and it stops cleanly on SIGTERM."""

import json
import socket
import tempfile
import time

import proxy_testlib as T
from kvf_e2e import Metrics, free_port_range


def main():
    a = T.args()
    with tempfile.TemporaryDirectory() as tmp:
        procs = T.Procs(tmp)
        try:
            base = free_port_range(2)   # nothing listens there
            p, px = T.start_proxy(procs, a.fakebin, "tcp://127.0.0.1:%d" % base,
                                  "tcp://127.0.0.1:%d" % (base + 1), ["--model-name", "tiny"])
            status, h = px.health()
            T.check(status == 503, "GET /health without healthy instances -> 503")
            T.check(h["status"] == "unavailable" and len(h["prefill"]) == 1 and
                    len(h["decode"]) == 1 and not h["prefill"][0]["healthy"] and
                    h["prefill"][0]["url"] == "tcp://127.0.0.1:%d" % base,
                    "/health lists both instances as unhealthy")

            def post(body):
                st, hdrs, raw = px.request("POST", "/v1/completions", body)
                return st, json.loads(raw)

            st, body = post({"model": "tiny", "prompt": "hello", "max_tokens": 4})
            T.check(st == 503 and "no healthy" in body["error"]["message"],
                    "valid completion without instances -> 503 (%s)" % body["error"]["message"])
            bad = [
                ('{"prompt": "hello"', "bad JSON"),
                ({"max_tokens": 4}, "missing prompt"),
                ({"prompt": "hello", "max_tokens": -1}, "negative max_tokens"),
                ({"prompt": "hello", "temperature": -1}, "temperature < 0"),
                ({"prompt": "hello", "max_tokens": "4"}, "max_tokens of the wrong type"),
                ({"prompt": 17}, "prompt of the wrong type"),
                ({"prompt": "hello", "stream": 1}, "stream of the wrong type"),
            ]
            for body_in, what in bad:
                st, body = post(body_in)
                T.check(st == 400 and body["error"]["type"] == "invalid_request_error" and
                        body["error"]["message"], "%s -> 400 (%s)" % (what, body["error"]["message"]))
            # OpenAI's error shape: param names the field, code is a string.
            for body_in, param in (({"prompt": "hello", "max_tokens": 0}, "max_tokens"),
                                   ({"prompt": "hello", "temperature": -1}, "temperature"),
                                   ({"prompt": 17}, "prompt"),
                                   ('{"prompt": "hello"', None)):
                st, body = post(body_in)
                T.check(st == 400 and body["error"]["param"] == param and
                        body["error"]["code"] == 400 and body["code"] == 400,
                        "error param %r and code '400' (%s)" % (param, body["error"]))
                bad.append((body_in, "param " + str(param)))
            # A NUL in a string prompt would be cut short by the JSON parser: refused.
            for raw_body in ('{"prompt": "a\\u0000bcd", "max_tokens": 2}',
                             '{"prompt": "a\\u0000", "max_tokens": 2}'):
                st, body = post(raw_body)
                T.check(st == 400 and "NUL character" in body["error"]["message"],
                        "prompt with \\u0000 -> 400 (%s)" % body["error"]["message"])
                bad.append((raw_body, "NUL"))
            st, body = post({"model": "other", "prompt": "x"})
            T.check(st == 404, "unknown model -> 404")
            # A declared body over --max-body is refused before it is sent (and
            # the connection closed), so the client must read the answer first.
            with socket.create_connection(("127.0.0.1", px.port), timeout=10) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: %d\r\n\r\n" % (5 << 20))
                answer = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            head, _, raw = answer.partition(b"\r\n\r\n")
            T.check(head.startswith(b"HTTP/1.1 413") and
                    json.loads(raw)["error"]["code"] == 413,
                    "a body over --max-body (4 MiB) -> 413 (JSON) before the body is sent")

            st, _, raw = px.request("GET", "/v1/models")
            models = json.loads(raw)
            T.check(st == 200 and models["object"] == "list" and
                    models["data"][0]["id"] == "tiny", "GET /v1/models -> 200 with the model")
            st, _, _ = px.request("GET", "/nope")
            T.check(st == 404, "unknown path -> 404")
            st, _, _ = px.request("GET", "/v1/completions")
            T.check(st == 405, "GET /v1/completions -> 405")

            st, hdrs, raw = px.request("GET", "/metrics")
            text = raw.decode()
            T.check(st == 200 and hdrs.get("Content-Type", "").startswith("text/plain"),
                    "GET /metrics -> 200 text/plain")
            m = Metrics(text)  # raises on any line that is not Prometheus text
            T.check(m.value("kvf_proxy_requests_total", code="400") == len(bad),
                    "requests_total{code=400} counts the %d bad requests" % len(bad))
            T.check(m.value("kvf_proxy_requests_total", code="503") == 1 and
                    m.value("kvf_proxy_requests_total", code="404") == 1 and
                    m.value("kvf_proxy_requests_total", code="413") == 1,
                    "requests_total counts the 503, the 404 and the 413")
            T.check(m.types.get("kvf_proxy_time_to_first_token_seconds") == "histogram" and
                    m.value("kvf_proxy_time_to_first_token_seconds_count") == 0,
                    "TTFT histogram present and empty")
            T.check(m.value("kvf_instance_healthy", kvf_instance="tcp://127.0.0.1:%d" % base,
                            role="prefill", engine_id="") == 0,
                    "per-instance health gauge is 0")
            for name in ("kvf_proxy_kv_transfer_bytes_total",
                         "kvf_proxy_kv_transfer_descriptors_total",
                         "kvf_proxy_handshake_refusals_total", "kvf_proxy_peer_errors_total",
                         "kvf_proxy_inter_token_latency_seconds_count",
                         "kvf_proxy_kv_transfer_seconds_count"):
                T.check(m.value(name) == 0, "%s present and 0" % name)
            T.check(len(m.labels("kvf_instance_total_pages")) == 2 and
                    m.labels("kvf_instance_free_pages") == [] and
                    m.labels("kvf_instance_running_requests") == [] and
                    m.labels("kvf_instance_leases") == [],
                    "live per-instance gauges are left out while no instance answers")
            T.check(all(i["free_pages"] is None and i["running"] is None and i["leases"] is None
                        for i in h["prefill"] + h["decode"]),
                    "/health: free_pages, running, leases are null for unhealthy instances")

            t0 = time.monotonic()
            rc = procs.stop(p, timeout=5)
            T.check(rc == 0 and time.monotonic() - t0 < 5, "SIGTERM stops kvf-proxy with 0")

            # Neither --prefill nor --decode: one warning line for each role.
            p0, _ = T.start_proxy(procs, a.fakebin, "", "", name="proxy-empty")
            procs.stop(p0, timeout=5)
            log = procs.log("proxy-empty")
            T.check("no prefill instances configured" in log and
                    "no decode instances configured" in log,
                    "a proxy without --prefill and --decode warns about both", log)
        finally:
            procs.stop_all()


if __name__ == "__main__":
    main()
