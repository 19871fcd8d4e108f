#!/usr/bin/env python3
"""Daemons drain on SIGTERM (docs/ARCHITECTURE.md §9, deploy/README.md "Stopping").

1. Prefill gets SIGTERM while decode holds one of its leases and is about to
   pull (decode's hidden --test-pull-delay keeps the pull in progress): its
   health says draining, the proxy routes nothing new to it (a new request
   gets a 503 that says so), the request in flight still gets its colocated
   tokens, and prefill exits as soon as the lease is released, well within
   the bound (--drain-timeout).
2. The bound is the lease: prefill with a 2 s lease and a pull that starts
   after it ends. The request fails with a clear error and prefill exits
   once the lease expired, within 2 s plus slack, not --drain-timeout.
3. Decode gets SIGTERM while a streamed request is being pulled: the stream
   ends normally with all its tokens and [DONE], a new request gets a 503,
   decode exits.
4. A daemon started by hand exits 0 after SIGTERM (the exit code), and a
   second SIGTERM ends a drain at once.
"""

import os
import signal
import subprocess
import threading
import time
import tempfile

from e2e_models import check_tokens, model_dir, reference
from kvf_e2e import (HttpError, Pool, find_bin, free_port_range, keygen,
                     skip_without_test_switches, wait_for)

PROMPT = "a request that is pulled while its prefill instance stops"
MAX_TOKENS = 8


def gone(pid):
    """The process has exited (a zombie not yet reaped counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def send_async(pool, out, key, **kw):
    def run():
        try:
            out[key] = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                     return_token_ids=True, timeout=60, **kw)
        except HttpError as e:
            out[key] = e
    t = threading.Thread(target=run)
    t.start()
    return t


def error_message(e):
    return e.body["error"]["message"] if isinstance(e.body, dict) else str(e.body)


def expect_draining_503(pool, who):
    try:
        pool.complete("a new request", max_tokens=2, timeout=30)
    except HttpError as e:
        msg = error_message(e)
        assert e.status == 503 and "draining" in msg, (e.status, msg)
        return msg
    raise AssertionError("a new request was served although the %s drains" % who)


def prefill_drain(model, ref):
    with Pool(layout="1p1d", model=model, timeout=60,
              decode_args=["--test-pull-delay", "2s"]) as pool:
        pid = pool.pids()["prefill-0"]
        out = {}
        t = send_async(pool, out, "a")
        wait_for(lambda: pool.health()[1]["prefill"][0]["leases"] == 1, 20, "the lease",
                 interval=0.02)
        t_term = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: pool.health()[1]["prefill"][0]["draining"], 5,
                 "/health to say prefill drains", interval=0.02)
        msg = expect_draining_503(pool, "prefill")
        t.join(timeout=60)
        r = out.get("a")
        assert isinstance(r, dict), "the request in flight failed: %s" % (r,)
        check_tokens(r["choices"][0]["token_ids"], ref[0], ref[1], True, "drained prefill")
        wait_for(lambda: gone(pid), 10, "prefill to exit after the release")
        took = time.monotonic() - t_term
        log = pool.log("prefill-0")
        assert "draining (SIGTERM)" in log and "drained in" in log, log[-2000:]
        print("prefill drain: request in flight answered 200; new request: 503 %r; prefill"
              " exited %.2f s after SIGTERM (bound: --drain-timeout 30 s)" % (msg, took))


def prefill_drain_lease_bound(model):
    lease_s = 2.0
    with Pool(layout="1p1d", model=model, timeout=60,
              prefill_args=["--lease-timeout", "2s", "--xfer-timeout", "1s"],
              decode_args=["--test-pull-delay", "4s", "--xfer-timeout", "1s"],
              proxy_args=["--token-timeout", "20s"]) as pool:
        pid = pool.pids()["prefill-0"]
        out = {}
        t = send_async(pool, out, "a")
        wait_for(lambda: pool.health()[1]["prefill"][0]["leases"] == 1, 20, "the lease",
                 interval=0.02)
        t_term = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: gone(pid), lease_s + 3, "prefill to exit once the lease expired")
        took = time.monotonic() - t_term
        t.join(timeout=60)
        r = out.get("a")
        assert isinstance(r, HttpError) and r.status >= 500, r
        msg = error_message(r)
        assert "lease" in msg or "prefill" in msg, msg
        print("prefill drain bounded by the lease (%.0f s): exited %.2f s after SIGTERM; the"
              " late pull failed clearly: %d %r" % (lease_s, took, r.status, msg))


def decode_drain(model, ref):
    # decode logs the start of its (test) pull delay at level info; the
    # daemons kvf-up starts inherit the variable
    os.environ["KVF_LOG_LEVEL"] = "info"
    try:
        pool = Pool(layout="1p1d", model=model, timeout=60,
                    decode_args=["--test-pull-delay", "2s"])
        pool.__enter__()
    finally:
        del os.environ["KVF_LOG_LEVEL"]
    try:
        pid = pool.pids()["decode-0"]
        out = {}

        def run():
            body = pool.completion_body(PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                        stream=True, return_token_ids=True)
            out["a"] = pool.stream(body, timeout=60)
        t = threading.Thread(target=run)
        t.start()
        # decode logs the start of its (test) pull delay at level info
        wait_for(lambda: "test pull delay" in pool.log("decode-0"), 20,
                 "decode to take the request", interval=0.02)
        t_term = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: pool.health()[1]["decode"][0]["draining"], 5,
                 "/health to say decode drains", interval=0.02)
        msg = expect_draining_503(pool, "decode")
        t.join(timeout=60)
        s = out.get("a")
        assert s is not None and s.done and not s.errors, (
            (s.events[-3:] if s else None), pool.log("decode-0")[-1500:], pool.log("proxy")[-1500:])
        check_tokens(s.token_ids, ref[0], ref[1], True, "drained decode")
        wait_for(lambda: gone(pid), 10, "decode to exit")
        took = time.monotonic() - t_term
        assert "drained in" in pool.log("decode-0"), pool.log("decode-0")[-2000:]
        print("decode drain: stream in flight ended normally (%d tokens, [DONE]); new request:"
              " 503 %r; decode exited %.2f s after SIGTERM" % (len(s.token_ids), msg, took))
    finally:
        pool.__exit__(None, None, None)


def exit_codes(model):
    bindir = find_bin()
    for second_term in (False, True):
        port = free_port_range(2)
        keys = keygen(os.path.join(tempfile.mkdtemp(prefix="kvf-drain."), "keys"))
        cmd = [os.path.join(bindir, "kvf-prefill"), "--model", model,
               "--listen", "tcp://127.0.0.1:%d" % port, "--side-port", str(port + 1),
               "--keys", keys, "--key-id", "prefill-0"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            lines = []
            for line in p.stdout:          # until the ready line
                lines.append(line)
                if "ready:" in line:
                    break
            assert any("ready:" in x for x in lines), "".join(lines)
            p.send_signal(signal.SIGTERM)
            if second_term:
                p.send_signal(signal.SIGTERM)
            rc = p.wait(timeout=10)
            rest = p.stdout.read()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert rc == 0, (rc, rest)
        if not second_term:
            assert "drained in" in rest, rest
    print("kvf-prefill exits 0 after SIGTERM, and after two")


def main():
    skip_without_test_switches()   # --test-pull-delay
    t0 = time.monotonic()
    model = model_dir("tiny-dense")
    ref = reference(model, PROMPT, MAX_TOKENS)
    exit_codes(model)
    prefill_drain(model, ref)
    prefill_drain_lease_bound(model)
    decode_drain(model, ref)
    print("test_e2e_drain passed in %.1f s" % (time.monotonic() - t0))


if __name__ == "__main__":
    main()
