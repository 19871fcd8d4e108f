"""kvf-proxy against fake prefill/decode daemons (tests/deploy/fake_daemon.c):
request flow, streaming, round robin, metrics, daemon errors, timeouts,
client disconnects (abort reaches both instances) and instance death.

The fake's output rule: completion token i is prompt[i % n], prefill sends
the first, decode the rest; decode reports bytes = 1000 * n, descriptors =
n, reads = its --tp. The proxy runs without --model, so prompts are plain
bytes (no BOS) and the expected texts follow by hand.
"""

import json
import socket
import threading
import time

import proxy_testlib as T
from kvf_e2e import HttpError, free_port_range, wait_for


def main():
    T.run_with_procs(lambda a, procs, tmp: run(a, procs))


def run(a, procs):
    base = free_port_range(8)
    P = lambda i: "tcp://127.0.0.1:%d" % (base + i)  # noqa: E731
    T.start_fake(procs, a.testbin, "prefill", "prefill-0", base + 0, ["--tp", "2"])
    T.start_fake(procs, a.testbin, "decode", "decode-0", base + 1, ["--tp", "1"])
    dec1 = T.start_fake(procs, a.testbin, "decode", "decode-1", base + 2,
                        ["--tp", "4", "--fake-token-delay-ms", "20"])
    T.start_fake(procs, a.testbin, "decode", "decode-hang", base + 3,
                 ["--fake-mode", "hang-decode"])
    T.start_fake(procs, a.testbin, "prefill", "prefill-fail", base + 4,
                 ["--fake-mode", "fail-prefill"])
    T.start_fake(procs, a.testbin, "decode", "decode-refuse", base + 5,
                 ["--fake-mode", "fail-decode"])

    # Proxy 1: one prefill, two decodes (round robin between them).
    _, px = T.start_proxy(procs, a.fakebin, P(0), P(1) + "," + P(2),
                          ["--model-name", "m", "--health-interval", "100ms"])
    px.wait_healthy(timeout=10)
    # 200 needs one healthy decode; wait for the second one too.
    wait_for(lambda: all(i["healthy"] for i in px.health()[1]["decode"]), 10,
             "both decode instances healthy")
    # The proxy prefers decode instances whose pair with the prefill is checked compatible
    # (an unchecked pair only when none is), so round robin over both needs both verdicts;
    # under TSan the second check can land after the first request.
    wait_for(lambda: [q["state"] for q in px.health()[1]["pairs"]] == ["compatible"] * 2, 10,
             "both prefill-decode pairs checked compatible")
    st, h = px.health()
    T.check(st == 200 and [d["engine_id"] for d in h["decode"]] == ["decode-0", "decode-1"] and
            h["prefill"][0]["tp_size"] == 2 and h["decode"][1]["tp_size"] == 4,
            "/health 200 with each instance's engine id and TP")

    r = px.complete("hello world", max_tokens=5, return_token_ids=True)
    c = r["choices"][0]
    T.check(c["text"] == "hello" and c["finish_reason"] == "length" and
            c["token_ids"] == [104, 101, 108, 108, 111], "completion text 'hello' (5 tokens)")
    T.check(r["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
            "usage counts prompt and completion tokens")
    T.check(r["object"] == "text_completion" and r["model"] == "m" and r["id"].startswith("cmpl-"),
            "OpenAI text_completion shape")
    first_decode = r["decode_instance"]
    kv = r["kv_transfer"]
    T.check(kv["bytes"] == 11000 and kv["descriptors"] == 11 and kv["recomputed"] is False and
            kv["reads"] == (1 if first_decode == P(1) else 4), "kv_transfer stats relayed")
    T.check("decode_cached_tokens" not in kv and "pulled_tokens" not in kv,
            "a decode that reports no cache hit (TransferStats 7, 8): none in kv_transfer")
    T.check(r["prefill_instance"] == P(0) and r["ttft_ms"] > 0, "instances and ttft reported")

    r2 = px.complete("abc", max_tokens=7)
    T.check(r2["choices"][0]["text"] == "abcabca", "tokens after the prompt wrap around")
    T.check({first_decode, r2["decode_instance"]} == {P(1), P(2)},
            "round robin: consecutive requests use both decode instances")

    # Streaming: the first chunk carries prefill's token; the joined text equals the
    # non-streamed text; the final chunk has finish_reason and usage; then [DONE].
    s = px.complete("stream me", max_tokens=9, stream=True, return_token_ids=True,
                    stream_options={"include_usage": True})
    T.check(s.done and s.text == "stream me" and s.finish_reason == "length",
            "stream joins to 'stream me' and ends with [DONE]")
    T.check(s.chunks[0]["choices"][0]["text"] == "s" and
            s.chunks[0]["choices"][0]["finish_reason"] is None, "first chunk = first token")
    T.check(len(s.chunks) == 9 and s.token_ids == list(b"stream me"),
            "one chunk per token (decode streams one per reply)")
    T.check(s.usage["completion_tokens"] == 9 and s.final["kv_transfer"]["bytes"] == 9000,
            "final chunk has kv_transfer, the usage chunk (no choices) the usage")
    # Decode sends 8 tokens at least 5 ms apart after the first: if the proxy relays them
    # as they come (not buffered to the end), [DONE] arrives >= 40 ms after the first chunk.
    T.check(s.times[-1] - s.times[0] >= 0.035,
            "chunks arrive as tokens are produced (%.0f ms from first to last)"
            % (1000 * (s.times[-1] - s.times[0])))

    # UTF-8: 'é' is two byte tokens; the stream holds a split character back.
    s = px.complete("\u00e9", max_tokens=3, stream=True)
    r = px.complete("\u00e9", max_tokens=3)
    T.check(s.text == "\u00e9\ufffd" and r["choices"][0]["text"] == "\u00e9\ufffd",
            "split UTF-8 is rebuilt; a dangling lead byte becomes U+FFFD (stream == non-stream)")

    m = px.metrics()
    ok = m.value("kvf_proxy_requests_total", code="200")
    T.check(ok == 5, "requests_total{code=200} == 5")

    # 12 concurrent requests, half streamed: replies of different requests interleave on
    # the same instance sockets and must each reach their own client.
    results = {}

    def one(k):
        prompt = "%c%02d" % (chr(ord("A") + k), k)
        try:
            if k % 2:
                results[k] = (prompt, px.complete(prompt, max_tokens=6, stream=True).text)
            else:
                results[k] = (prompt, px.complete(prompt, max_tokens=6)["choices"][0]["text"])
        except Exception as e:  # noqa: BLE001 (reported below)
            results[k] = (prompt, repr(e))
    threads = [threading.Thread(target=one, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    T.check(all(results[k][1] == (results[k][0] * 2) for k in range(12)),
            "12 concurrent requests each get their own tokens")
    T.check(m.value("kvf_proxy_kv_transfer_bytes_total") == 1000 * (11 + 3 + 9 + 2 + 2) and
            m.value("kvf_proxy_kv_transfer_descriptors_total") == 11 + 3 + 9 + 2 + 2,
            "KV bytes and descriptors summed over requests")
    T.check(m.value("kvf_proxy_generation_tokens_total") == 5 + 7 + 9 + 3 + 3 and
            m.value("kvf_proxy_prompt_tokens_total") == 11 + 3 + 9 + 2 + 2, "token counters")
    T.check(m.value("kvf_proxy_time_to_first_token_seconds_count") == 5 and
            m.value("kvf_proxy_inter_token_latency_seconds_count") == 4 + 6 + 8 + 2 + 2,
            "TTFT per request, ITL per decode token")
    T.check(m.value("kvf_instance_free_pages", kvf_instance=P(1), role="decode",
                    engine_id="decode-0") is not None, "free pages gauge per instance")

    # Client goes away mid-stream on a slow decode: the proxy aborts on both instances.
    got = {}

    def stop_after_first(ev, conn):
        got.setdefault("id", ev["id"])
        conn.sock.shutdown(socket.SHUT_RDWR)
        return False

    px.stream(px.completion_body("x" * 50, max_tokens=50, stream=True), on_event=stop_after_first)
    # decode-1 (20 ms per token) may or may not be the one; wait for the abort line anywhere.
    rid = got["id"]
    wait_for(lambda: any("abort " + rid in procs.log(n) for n in ("decode-0", "decode-1")), 5,
             "abort of %s on the decode instance" % rid)
    wait_for(lambda: "abort " + rid in procs.log("prefill-0"), 5, "abort on the prefill instance")
    T.check(True, "client disconnect mid-stream -> AbortRequest to decode and prefill")
    wait_for(lambda: px.metrics().value("kvf_proxy_client_aborts_total") == 1, 5,
             "client_aborts_total == 1")

    # Decode instance death mid-request fails the request fast, and /health follows.
    t0 = time.monotonic()
    errs = []

    def kill_decode1(ev, conn):
        if "decode" not in got:
            got["decode"] = True
            procs.stop(dec1)
        return True

    # Round robin alternates: once a request went to decode-0 (P(1)), the next goes to decode-1.
    while True:
        r = px.complete("z", max_tokens=2)
        if r["decode_instance"] == P(1):
            break
    try:
        s = px.stream(px.completion_body("y" * 40, max_tokens=40, stream=True),
                      on_event=kill_decode1)
        errs = s.errors
    except HttpError as e:
        errs = [e.body]
    # the proxy learns of the death from the socket closing, or (when the next frame is
    # already due) from the send failing: both are a dead-instance error
    T.check(errs and any(m in errs[0]["message"] for m in ("closed the connection",
                                                         "is not connected"))
            and time.monotonic() - t0 < 3,
            "decode death mid-stream -> error event within 3 s (%s)" % (errs[0]["message"] if errs else None))
    wait_for(lambda: not px.health()[1]["decode"][1]["healthy"], 3, "decode-1 marked unhealthy")
    T.check(px.health()[0] == 200, "/health stays 200 while decode-0 is healthy")
    # The dead instance's last free_pages/running are not reported as current.
    st, h = px.health()
    dead, live = h["decode"][1], h["decode"][0]
    T.check(dead["free_pages"] is None and dead["running"] is None and dead["leases"] is None and
            dead["error"] and dead["total_pages"] > 0,
            "/health: a dead instance's free_pages/running/leases are null, its error kept", dead)
    T.check(isinstance(live["free_pages"], int) and isinstance(live["running"], int),
            "/health: the live instance's gauges are numbers")
    m = px.metrics()
    T.check(m.value("kvf_instance_healthy", kvf_instance=P(2), role="decode",
                    engine_id="decode-1") == 0 and
            m.value("kvf_instance_free_pages", kvf_instance=P(2), role="decode",
                    engine_id="decode-1") is None and
            m.value("kvf_instance_running_requests", kvf_instance=P(2), role="decode",
                    engine_id="decode-1") is None and
            m.value("kvf_instance_free_pages", kvf_instance=P(1), role="decode",
                    engine_id="decode-0") is not None,
            "/metrics: a dead instance's live gauges are left out, healthy = 0 stays")
    for _ in range(3):
        T.check(px.complete("ok", max_tokens=2)["decode_instance"] == P(1),
                "requests avoid the dead instance")

    # Proxy 2: failing prefill -> 502 with the daemon's message.
    procs2 = T.Procs(procs.logdir)
    try:
        _, px2 = T.start_proxy(procs2, a.fakebin, P(4), P(1), name="proxy2")
        px2.wait_healthy(timeout=10)
        try:
            px2.complete("x", max_tokens=2)
            T.check(False, "failing prefill must fail")
        except HttpError as e:
            T.check(e.status == 502 and "fake prefill failure" in e.body["error"]["message"],
                    "prefill error -> 502 with the daemon's message")
        procs2.stop_all()

        # Proxy 3: a refusing decode -> 502, counted as a handshake refusal.
        procs2 = T.Procs(procs.logdir)
        _, px3 = T.start_proxy(procs2, a.fakebin, P(0), P(5), name="proxy3")
        px3.wait_healthy(timeout=10)
        try:
            px3.complete("x", max_tokens=2)
            T.check(False, "refusing decode must fail")
        except HttpError as e:
            T.check(e.status == 502 and "handshake refused" in e.body["error"]["message"],
                    "decode refusal -> 502 with the refusal text")
        T.check(px3.metrics().value("kvf_proxy_handshake_refusals_total") == 1,
                "handshake_refusals_total == 1")
        procs2.stop_all()

        # Proxy 4: a decode that never answers -> 504 after --token-timeout, then abort.
        procs2 = T.Procs(procs.logdir)
        _, px4 = T.start_proxy(procs2, a.fakebin, P(0), P(3), ["--token-timeout", "400ms"],
                               name="proxy4")
        px4.wait_healthy(timeout=10)
        t0 = time.monotonic()
        try:
            px4.complete("x", max_tokens=3)
            T.check(False, "hanging decode must time out")
        except HttpError as e:
            dt = time.monotonic() - t0
            T.check(e.status == 504 and 0.35 < dt < 3, "hanging decode -> 504 after %.2fs" % dt)
        wait_for(lambda: procs.log("decode-hang").count("abort ") == 1, 5,
                 "timed-out request aborted on decode")
        T.check(px4.metrics().value("kvf_proxy_timeouts_total") == 1, "timeouts_total == 1")
    finally:
        procs2.stop_all()


if __name__ == "__main__":
    main()
