"""A real pool through kvf-up: kvf-prefill TP2 and two kvf-decode TP1
instances (layout 2p1d) serving a synthetic tiny hybrid checkpoint, behind
kvf-proxy. The disaggregated greedy output must equal, token for token, a
colocated run of the same checkpoint (kvf generate, TP1); streaming must
give the same tokens; a client that leaves mid-stream must leave every
page free again on both sides; /metrics must add up the transfers."""

import os
import re
import signal
import socket
import subprocess
import tempfile
import time

import proxy_testlib as T
from kvf_e2e import HttpError, Pool, wait_for


def main():
    a = T.args()
    bindir = os.environ.get("KVF_BIN") or os.path.join(os.path.dirname(a.fakebin), "..", "bin")
    kvf = os.path.join(bindir, "kvf")
    cfg = os.path.join(os.environ["KVF_SOURCE_DIR"], "tests", "data", "models",
                       "tiny-hybrid.config.json")
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny-hybrid")
        subprocess.run([kvf, "mkmodel", "--config", cfg, "--out", model, "--seed", "3"],
                       check=True, capture_output=True, timeout=60)
        prompt = "The ferry crosses at dawn"
        gen = subprocess.run([kvf, "generate", "--model", model, "--prompt", prompt,
                              "--max-tokens", "10", "--ignore-eos"],
                             check=True, capture_output=True, timeout=60)
        out = gen.stdout.decode("utf-8", "replace")   # the generated text is arbitrary bytes
        ref = [int(t) for t in re.search(r"^tokens: (.*)$", out, re.M).group(1).split()]
        T.check(len(ref) == 10, "colocated reference: %s" % ref)

        # A short transfer timeout: an aborted lease is quarantined for one
        # transfer timeout before its pages come back (checked below).
        with Pool(layout="2p1d", model=model, prefill_instances=1, decode_instances=2,
                  bin_dir=bindir, timeout=60, extra_args=["--xfer-timeout", "2s"]) as pool:
            st, h = pool.health()
            T.check(st == 200 and [i["tp_size"] for i in h["prefill"] + h["decode"]] == [2, 1, 1],
                    "pool 2p1d healthy: prefill TP2, two decode TP1")
            seen = set()
            for _ in range(2):
                r = pool.complete(prompt, max_tokens=10, temperature=0, ignore_eos=True,
                                  return_token_ids=True)
                ids = r["choices"][0]["token_ids"]
                T.check(ids == ref, "disaggregated greedy tokens == colocated (%s)" %
                        r["decode_instance"])
                kv = r["kv_transfer"]
                T.check(kv["bytes"] > 0 and kv["descriptors"] > 0 and kv["reads"] == 2 and
                        not kv["recomputed"], "decode TP1 read both prefill ranks: %s" % kv)
                seen.add(r["decode_instance"])
            T.check(len(seen) == 2, "both decode instances served")
            s = pool.complete(prompt, max_tokens=10, temperature=0, ignore_eos=True, stream=True,
                              return_token_ids=True)
            T.check(s.done and s.token_ids == ref and s.finish_reason == "length",
                    "streamed tokens == colocated")

            # A client that leaves mid-stream: every page comes back on every instance.
            def leave(ev, conn):
                conn.sock.shutdown(socket.SHUT_RDWR)
                return False

            # max_tokens far beyond the bound below: the tiny model decodes about 5,000
            # tokens/s here, so the bound leaves the abort about 200 ms to reach decode
            pool.stream(pool.completion_body(prompt * 4, max_tokens=2000, temperature=0,
                                             stream=True, ignore_eos=True), on_event=leave)

            wait_for(lambda: pool.metrics().value("kvf_proxy_requests_in_flight") == 0, 10,
                     "the proxy to finish the abandoned request")
            m = pool.metrics()
            T.check(m.value("kvf_proxy_requests_total", code="499") == 1 and
                    m.value("kvf_proxy_client_aborts_total") == 1,
                    "the departed client is counted (499, client_aborts_total)")
            T.check(m.value("kvf_proxy_generation_tokens_total") < 3 * 10 + 1000,
                    "the abandoned request stopped early (%d tokens in all)"
                    % m.value("kvf_proxy_generation_tokens_total"))

            def all_free():
                # Only health replies newer than the abort count.
                h = pool.health()[1]
                return all(i["free_pages"] == i["total_pages"] and i["running"] == 0 and
                           0 <= i["last_ok_age_ms"] < 1000 * (time.monotonic() - t_done)
                           for i in h["prefill"] + h["decode"])
            t_done = time.monotonic()
            wait_for(all_free, 10, "every page free after the client left")
            T.check(True, "client left mid-stream: all pages free again on prefill and decode")

            m = pool.metrics()
            T.check(m.value("kvf_proxy_requests_total", code="200") == 3 and
                    m.value("kvf_proxy_kv_transfer_bytes_total") >= 3 * kv["bytes"],
                    "metrics: 3 x 200, transfer bytes summed",
                    [(n, m.value(n, **l)) for n, l in (
                        ("kvf_proxy_requests_total", {"code": "200"}),
                        ("kvf_proxy_requests_total", {"code": "499"}),
                        ("kvf_proxy_kv_transfer_bytes_total", {}),
                        ("kvf_proxy_client_aborts_total", {}))])

            # The decode instance serving a stream dies (SIGKILL): the client gets an
            # error event within about a second, the pool stays up on the other
            # decode instance, and the prefill instance gets its pages back.
            pids = pool.pids()
            with open(os.path.join(pool.run_dir, "pool.env")) as f:
                env = dict(line.strip().split("=", 1) for line in f if "=" in line)
            by_url = dict(zip(env["DECODE"].split(","), ("decode-0", "decode-1")))
            killed = {}

            def kill_decode(ev, conn):
                if "url" not in killed:
                    killed["url"] = ev["decode_instance"]
                    os.kill(pids[by_url[ev["decode_instance"]]], signal.SIGKILL)
                    killed["t"] = time.monotonic()
                return True

            s = pool.stream(pool.completion_body(prompt * 4, max_tokens=2000, temperature=0,
                                                 stream=True, ignore_eos=True),
                            on_event=kill_decode)
            dt = time.monotonic() - killed["t"]
            T.check(s.errors and killed["url"] in s.errors[0]["message"] and dt < 2.0,
                    "decode killed mid-stream -> error event after %.2f s: %s"
                    % (dt, s.errors[0]["message"] if s.errors else s.events[-2:]))
            wait_for(lambda: pool.health()[0] == 200 and
                     sum(i["healthy"] for i in pool.health()[1]["decode"]) == 1, 5,
                     "the dead decode instance marked unhealthy, the pool still up")
            r = pool.complete(prompt, max_tokens=10, temperature=0, ignore_eos=True,
                              return_token_ids=True)
            T.check(r["choices"][0]["token_ids"] == ref and r["decode_instance"] != killed["url"],
                    "the surviving decode instance serves the next request correctly")
            t_done = time.monotonic()

            def prefill_free():
                p = pool.health()[1]["prefill"][0]
                return (p["free_pages"] == p["total_pages"] and
                        0 <= p["last_ok_age_ms"] < 1000 * (time.monotonic() - t_done))
            wait_for(prefill_free, 10, "prefill pages back after the decode death")
            T.check(True, "prefill has every page back after the decode death")

        # A pool whose two sides disagree on the KV dtype: kvf-up runs the
        # handshake of every pairing at start (through the proxy), so the pool
        # never comes up; kvf-up fails with the refusal naming the field and
        # both values, and stops what it started.
        bad = Pool(layout="1p1d", model=model, bin_dir=bindir, timeout=60,
                   prefill_args=["--kv-dtype", "fp32"], decode_args=["--kv-dtype", "bf16"])
        try:
            bad.start(attempts=1)
            T.check(False, "a dtype mismatch must not come up")
        except RuntimeError as e:
            msg = str(e)
            # refused by kvf-up's pool-check before start-up (the handshake's own refusal of
            # the pair: tests/e2e/test_e2e_serving.py)
            T.check("kv_dtype prefill=fp32 decode=bf16: KV cache dtypes differ" in msg,
                    "kvf-up fails on a kv dtype mismatch, naming both values")
            T.check(not any(f.endswith(".pid") for f in os.listdir(bad.run_dir)),
                    "kvf-up stopped what it started")
        finally:
            bad.stop()

if __name__ == "__main__":
    main()
