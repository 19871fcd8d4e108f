#!/usr/bin/env python3
"""The fault matrix (issue 9): faults injected INSIDE the transfer by named
fault points (base/kvf_fault.h, armed through KVF_FAULT, built only
with -DKVF_FAULT_INJECTION=ON, which tests/run.sh's test build enables), on
real kvf-prefill / kvf-decode / kvf-proxy processes over loopback, for the
dense and the hybrid test model. Every row prints its verdict (passed,
FAILED or skipped) and time; a build without fault points skips them all
(exit 77).

Rows and how each is driven:
  prefill-killed-half-gets   decode ucx.half=stall; the leaseholder prefill is
                             SIGKILLed while half the GETs are in flight
  decode-killed-mid-pull     decode ucx.post@6=kill (6 of the batch's GETs posted)
  decode-stopped-past-lease  decode ucx.half=stop; the lease expires, another
                             prompt is prefilled into the same blocks, SIGCONT
  release-forged-replayed    decode lease.send@1=corrupt (wrong nonce, another
                             engine, then the real release), lease.send@2=replay
  stale-params-replayed      decode lease.claim@3=replay (the claim names the
                             previous, released lease): refused, no GET posted
  garbage-metadata           prefill side.reply@1=corrupt (handshake bytes)
  rkey-trailing-bytes        prefill side.rkey@1+=corrupt (every reply's remote keys
                             carry 5 more bytes, as a newer UCX may append):
                             accepted, never parsed; the pull reads correct KV
  side-channel-silent        prefill side.reply=drop (accepts, never answers)
  abort-queued/pulling/decoding  the client leaves at each stage
  kv-corrupt                 decode ucx.data@1+=corrupt (a landed byte flipped in
                             every pull): prefill's digest check answers corrupt,
                             decode recomputes; N of N caught, colocated tokens

Usage: test_e2e_fault_matrix.py [ROW ...]   (default: every row)
"""

import http.client
import json
import os
import re
import signal
import sys
import threading
import time
import traceback

from e2e_models import check_tokens, model_dir, reference
from kvf_e2e import HttpError, Pool, find_bin, wait_for

PROMPT = "a prompt whose transfer meets a fault"
PROMPT_B = "another prompt that reuses those very blocks!"
MAX_TOKENS = 8
MODELS = tuple(os.environ.get("FAULT_MATRIX_MODELS", "tiny-dense,tiny-hybrid").split(","))


def fault_build():
    """True when the binaries have fault points: they accept a valid KVF_FAULT."""
    import subprocess
    env = dict(os.environ, KVF_FAULT="ucx.post@1000000=stall:1")
    p = subprocess.run([os.path.join(find_bin(), "kvf-decode"), "--model", "/nonexistent"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=30)
    return "this build has no fault points" not in p.stdout


class Skip(Exception):
    """A row that cannot run here: reported skipped, never passed."""


def message(e):
    if isinstance(e, HttpError):
        m = e.body["error"]["message"] if isinstance(e.body, dict) else str(e.body)
        return re.sub(r"^decode instance tcp://\S+ failed: ", "", m)
    return str(e)


def health(pool):
    return pool.health()[1]


def all_free(pool):
    h = health(pool)
    return all(i["healthy"] and i["free_pages"] == i["total_pages"]
               for i in h["prefill"] + h["decode"])


def fired(pool, name, point):
    return re.search(r"fault %s fired on pass \d+" % re.escape(point), pool.log(name))


def fired_at(pool, name, point):
    """Wall-clock time (s since the epoch) of the log line saying the point fired."""
    m = re.search(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z .*fault %s fired" %
                  re.escape(point), pool.log(name), re.M)
    import calendar
    t = time.strptime(m.group(1)[:19], "%Y-%m-%dT%H:%M:%S")
    return calendar.timegm(t) + int(m.group(1)[20:]) / 1000.0


def tail_logs(pool, lines=25):
    if pool is None or not os.path.isdir(pool.run_dir):
        return
    for fn in sorted(os.listdir(pool.run_dir)):
        if fn.endswith(".log"):
            with open(os.path.join(pool.run_dir, fn), errors="replace") as f:
                body = f.read().splitlines()[-lines:]
            print("---- last lines of %s ----" % fn)
            print("\n".join(body))


class Faulted:
    """A Pool whose daemons start with KVF_FAULT=spec (only the role with the point acts)."""

    current = None

    def __init__(self, spec, **kw):
        self.spec, self.kw = spec, kw
        self.pool = None

    def __enter__(self):
        os.environ["KVF_FAULT"] = self.spec
        try:
            self.pool = Pool(timeout=self.kw.pop("timeout", 60), **self.kw)
            Faulted.current = self.pool
            self.pool.start()
        except BaseException:
            tail_logs(self.pool)
            self.pool.stop()
            raise
        finally:
            del os.environ["KVF_FAULT"]
        return self.pool

    def __exit__(self, *exc):
        if exc[0] is not None:
            tail_logs(self.pool)
        self.pool.stop()
        Faulted.current = None
        return False


def async_complete(pool, prompt, out, key, max_tokens=MAX_TOKENS, **kw):
    def run():
        try:
            out[key] = pool.complete(prompt, max_tokens=max_tokens, temperature=0,
                                     return_token_ids=True, timeout=40, **kw)
        except (HttpError, OSError) as e:
            out[key] = e
        out[key + "_t"] = time.monotonic()
        out[key + "_wall"] = time.time()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def leaseholder(pool):
    """Name of the prefill instance holding a lease (the proxy's health view, 500 ms fresh)."""
    for i, inst in enumerate(health(pool)["prefill"]):
        if inst.get("leases", 0) > 0:
            return "prefill-%d" % i
    return None


def check_answer(r, refs, prompt, what):
    ref_tokens, ref_logits = refs[prompt]
    check_tokens(r["choices"][0]["token_ids"], ref_tokens, ref_logits, True, what)


# ---- rows -----------------------------------------------------------------


def prefill_killed_half_gets(model, refs, policy="fail"):
    # the stall is shorter than decode's transfer timeout: alone it would not fail the pull
    stall = 1.2
    with Faulted("ucx.half=stall:%d" % int(stall * 1000), layout="1p1d", model=model,
                 prefill_instances=2,
                 decode_args=["--xfer-timeout", "2500ms", "--load-failure", policy]) as pool:
        out = {}
        th = async_complete(pool, PROMPT, out, "a")
        wait_for(lambda: fired(pool, "decode-0", "ucx.half"), 15, "half the GETs posted",
                 interval=0.01)
        victim = wait_for(lambda: leaseholder(pool), stall, "the leaseholder in /health",
                          interval=0.01)
        os.kill(pool.pids()[victim], signal.SIGKILL)
        t_kill = time.time()
        th.join(timeout=30)
        assert "a_t" in out, "the request never ended"
        r = out["a"]
        # from when decode went on posting GETs to the dead peer
        resumed = max(t_kill, fired_at(pool, "decode-0", "ucx.half") + stall)
        after = out["a_wall"] - resumed
        if policy == "fail":
            assert isinstance(r, HttpError) and r.status >= 500, r
        else:
            assert not isinstance(r, Exception), message(r)
            assert r["kv_transfer"]["recomputed"] is True, r["kv_transfer"]
            check_answer(r, refs, PROMPT, "recomputed answer")
        assert after < 2.0, "ended %.2f s after decode went on past the kill" % after
        wait_for(lambda: all(i["healthy"] and i["free_pages"] == i["total_pages"]
                             for i in health(pool)["decode"]), 10, "decode healthy, its pages free")
        r2 = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True,
                           timeout=30)
        check_answer(r2, refs, PROMPT, "next request, through the surviving prefill")
        return "%s %.2f s after decode went on past the kill ('%s'); decode healthy, pages free, next request ok" % (
            "failed" if policy == "fail" else "recomputed", after,
            message(r)[:100] if policy == "fail" else "tokens equal the colocated run")


def decode_killed_mid_pull(model, refs):
    with Faulted("ucx.post@6=kill", layout="1p1d", model=model,
                 prefill_args=["--lease-timeout", "2s", "--xfer-timeout", "1s"],
                 decode_args=["--xfer-timeout", "1s"],
                 proxy_args=["--token-timeout", "3s"]) as pool:
        p0 = health(pool)["prefill"][0]
        assert p0["free_pages"] == p0["total_pages"], p0
        q0 = pool.metrics().sum("kvf_instance_quarantined_blocks_total")
        out = {}
        th = async_complete(pool, PROMPT, out, "a")
        wait_for(lambda: fired(pool, "decode-0", "ucx.post"), 15, "decode to die mid-pull",
                 interval=0.01)
        t_kill = time.monotonic()
        th.join(timeout=30)
        assert isinstance(out.get("a"), HttpError) and out["a"].status >= 500, out.get("a")
        wait_for(lambda: pool.metrics().sum("kvf_instance_quarantined_blocks_total") > q0, 15,
                 "prefill to quarantine the request's blocks")
        wait_for(lambda: health(pool)["prefill"][0]["free_pages"] == p0["total_pages"] and
                 health(pool)["prefill"][0]["leases"] == 0, 15,
                 "prefill's pages back after the lease ended and its quarantine")
        t_free = time.monotonic() - t_kill
        q = pool.metrics().sum("kvf_instance_quarantined_blocks_total") - q0
        assert q >= 1, "prefill freed the blocks without quarantining them"
        assert t_free >= 1.0, "freed %.2f s after the kill: sooner than the 1 s quarantine" % t_free
        return "client got %d; prefill's %d pages back %.2f s after the kill, %d blocks" \
            " quarantined first" % (out["a"].status, p0["total_pages"], t_free, q)


def decode_stopped_past_lease(model, refs, point="ucx.half"):
    """point ucx.half: decode stops with half its GETs posted; lease.send: it stops after
    every GET landed, before its release (so only the lease's verdict can tell)."""
    with Faulted("%s=stop" % point, layout="1p1d", model=model,
                 prefill_args=["--lease-timeout", "1s", "--num-blocks", "3",
                               "--xfer-timeout", "1s"],
                 decode_args=["--xfer-timeout", "1s", "--load-failure", "fail"],
                 proxy_args=["--token-timeout", "30s", "--health-timeout", "60s"]) as pool:
        out = {}
        dpid = pool.pids()["decode-0"]
        total = health(pool)["prefill"][0]["total_pages"]
        ta = async_complete(pool, PROMPT, out, "a")
        tb = None
        try:
            wait_for(lambda: fired(pool, "decode-0", point), 15,
                     "decode to stop at %s" % point, interval=0.01)
            # A's lease expires, its quarantine ends, and B is prefilled into the same blocks
            wait_for(lambda: "expired without every release" in pool.log("prefill-0"), 10,
                     "A's lease to expire", interval=0.02)
            wait_for(lambda: health(pool)["prefill"][0]["free_pages"] == total, 10,
                     "A's blocks freed after the quarantine")
            tb = async_complete(pool, PROMPT_B, out, "b")
            wait_for(lambda: health(pool)["prefill"][0]["free_pages"] < total, 10,
                     "B prefilled into the reused blocks", interval=0.02)
        finally:
            os.kill(dpid, signal.SIGCONT)
        ta.join(timeout=40)
        tb.join(timeout=40)
        ra, rb = out.get("a"), out.get("b")
        assert ra is not None and rb is not None, out
        if isinstance(ra, HttpError):
            assert ra.status >= 500, ra
            if point == "lease.send":
                assert "KV lease expired before the read finished" in message(ra), message(ra)
        else:
            check_answer(ra, refs, PROMPT, "request A answered 200")
        if not isinstance(rb, HttpError):
            check_answer(rb, refs, PROMPT_B, "request B")
        wait_for(lambda: all_free(pool), 15, "pages back on both sides")
        def prevented():
            return pool.metrics().sum("kvf_instance_expired_lease_reads_prevented_total",
                                      role="decode")
        if point == "lease.send":   # the proxy's view of decode's count: 500 ms fresh
            wait_for(lambda: prevented() >= 1, 5, "decode to count the prevented read")
        return "A: %s; B: %s" % (
            ("%d '%s'" % (ra.status, message(ra)[:90])) if isinstance(ra, HttpError) else
            "200 correct", ("%d (clean error)" % rb.status) if isinstance(rb, HttpError) else
            "200 correct")


def release_forged_and_stale(model, refs):
    """Rows release-forged-replayed and stale-params-replayed, in one pool."""
    spec = "lease.send@1=corrupt,lease.send@2=replay,lease.claim@3=replay"
    with Faulted(spec, layout="1p1d", model=model, prefill_args=["--xfer-timeout", "1s"],
                 decode_args=["--load-failure", "fail", "--xfer-timeout", "1s"]) as pool:
        m0 = pool.metrics()
        ref0 = m0.sum("kvf_instance_releases_refused_total", role="prefill")
        results = {}
        r1 = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True)
        check_answer(r1, refs, PROMPT, "request 1 (forged releases first)")
        r2 = pool.complete(PROMPT_B, max_tokens=MAX_TOKENS, temperature=0,
                           return_token_ids=True)
        check_answer(r2, refs, PROMPT_B, "request 2 (its release replayed)")
        dlog = pool.log("decode-0")
        forged = re.findall(r"fault lease\.send: release of \S+ (with a wrong nonce|naming "
                            r"another engine|replayed) answered (\w+)", dlog)
        assert sorted(forged) == sorted([("with a wrong nonce", "refused"),
                                         ("naming another engine", "refused"),
                                         ("replayed", "refused")]), forged
        # wrong nonce and replay are refused by the lease table (counted there); the copy
        # naming another engine by the lease table too in an insecure pool, by the side
        # channel (its engine id is not the authenticated peer) in a secure one
        wait_for(lambda: health(pool)["prefill"][0]["releases_refused"] - ref0 >= 2, 5,
                 "the refusals counted")
        refused = pool.metrics().sum("kvf_instance_releases_refused_total", role="prefill") - ref0
        assert refused in (2, 3), "prefill counted %d refused releases, expected 2 or 3" % refused
        p = health(pool)["prefill"][0]
        assert p["quarantined_blocks"] == 0, "the real releases did not free the blocks: %s" % p
        results["release-forged-replayed"] = (
            "wrong nonce, other engine, replay: all refused, %d counted in /metrics; the real"
            " releases freed the blocks (0 quarantined) and both answers are correct" % refused)
        # request 3: its claim replays request 2's (released) lease
        try:
            r3 = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                               return_token_ids=True)
            raise AssertionError("stale params were served: %s" % r3)
        except HttpError as e:
            msg, status = message(e), e.status
            assert e.status >= 500, e
            assert "before the read could start" in msg and "nothing was read" in msg, msg
        dlog = pool.log("decode-0")
        m = re.search(r"claims with the transfer params of request \S+ \(released\); GETs posted"
                      r" so far: (\d+)", dlog)
        m2 = re.search(r"replayed claim of request \S+ answered refused; GETs posted so far:"
                       r" (\d+)", dlog)
        assert m and m2, dlog[-2000:]
        assert m.group(1) == m2.group(1), "GETs were posted for replayed params: %s -> %s" % (
            m.group(1), m2.group(1))
        r4 = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True)
        check_answer(r4, refs, PROMPT, "request 4 after the stale one")
        wait_for(lambda: all_free(pool), 10, "pages back on both sides")
        results["stale-params-replayed"] = (
            "claim refused, 0 GETs posted (%s before and after), client got %d '%s'; next"
            " request correct" % (m.group(1), status, msg[:90]))
        return results


def release_unanswered(model, refs):
    """prefill lease.release=stall past decode's side-channel timeout: the release is
    not answered in time, so decode cannot know the lease held: it must not decode."""
    with Faulted("lease.release=stall:2500", layout="1p1d", model=model,
                 prefill_args=["--xfer-timeout", "1s"],
                 decode_args=["--xfer-timeout", "1s", "--load-failure", "fail"]) as pool:
        try:
            r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                              return_token_ids=True, timeout=30)
            raise AssertionError("answered 200 although the release was never answered: %s"
                                 % r)
        except HttpError as e:
            msg, status = message(e), e.status
            assert e.status >= 500, e
            assert "releasing the KV lease" in msg and "the KV read is not trusted" in msg, msg
        assert fired(pool, "prefill-0", "lease.release")
        wait_for(lambda: all_free(pool), 10, "pages back on both sides")
        r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True)
        check_answer(r, refs, PROMPT, "next request")
        return "client got %d '%s'; pages back, next request correct" % (status, msg[:100])


def garbage_metadata(model, refs, point):
    with Faulted("%s@1=corrupt" % point, layout="1p1d", model=model,
                 decode_args=["--xfer-timeout", "1s"]) as pool:
        # the first handshake (kvf-up's pairing check) got the garbage; the pool came up
        # on a later, clean one, so the decode instance kept serving
        assert fired(pool, "prefill-0", point), pool.log("prefill-0")[-1500:]
        dlog = pool.log("decode-0")
        refusal = re.search(r"(malformed handshake reply[^\n]*)", dlog)
        assert refusal, dlog[-2000:]
        r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True)
        check_answer(r, refs, PROMPT, "request after the garbage handshake")
        d = health(pool)["decode"][0]
        assert d["healthy"], d
        return "refused ('%s'); decode kept serving, next answer correct" % \
            refusal.group(1).strip()[-110:]


def rkey_trailing_bytes(model, refs):
    """Keys are UCX's private format, never parsed: a key longer than this UCX writes
    (a newer UCX appends bytes) goes to ucp_ep_rkey_unpack as it came and reads the KV."""
    # --load-failure fail: a pull that failed would fail the request, not recompute it
    with Faulted("side.rkey@1+=corrupt", layout="1p1d", model=model,
                 decode_args=["--xfer-timeout", "1s", "--load-failure", "fail"]) as pool:
        assert fired(pool, "prefill-0", "side.rkey"), pool.log("prefill-0")[-1500:]
        r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True)
        check_answer(r, refs, PROMPT, "pull with 5 trailing bytes on every remote key")
        dlog = pool.log("decode-0")
        assert "remote key" not in dlog or "refused" not in dlog, dlog[-2000:]
        d = health(pool)["decode"][0]
        assert d["healthy"], d
        return "keys with 5 trailing bytes accepted; the pulled KV gave the colocated tokens"


def side_channel_silent(model, refs):
    pool = None
    os.environ["KVF_FAULT"] = "side.reply=drop"
    t0 = time.monotonic()
    try:
        pool = Pool(layout="1p1d", model=model, timeout=4, decode_args=["--xfer-timeout", "1s"])
        try:
            pool.start(attempts=1)
            raise AssertionError("a pool whose prefill side channel never answers came up")
        except RuntimeError as e:
            text = str(e)
        took = time.monotonic() - t0
        dlog = pool.log("decode-0")
        m = re.search(r"handshake with prefill-0 at 127\.0\.0\.1:\d+ failed: peer did not answer"
                      r" in time", dlog + text)
        assert m, text[-1500:] + dlog[-1500:]
        assert "handshake with prefill-0 at 127.0.0.1:" in text, text[-1500:]
        assert fired(pool, "prefill-0", "side.reply")
        first = re.search(r"^(\S+) .*handshake with prefill-0 at", dlog, re.M)
        return "kvf-up refused after %.1f s: '%s'" % (took, m.group(0))
    except BaseException:
        tail_logs(pool)
        raise
    finally:
        del os.environ["KVF_FAULT"]
        if pool is not None:
            pool.stop()


def open_stream(pool, prompt, max_tokens):
    body = pool.completion_body(prompt, max_tokens=max_tokens, temperature=0, stream=True,
                                ignore_eos=True)
    c = http.client.HTTPConnection(pool.host, pool.port, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    return c


def abort_pulling(model, refs):
    stall = 1.5
    with Faulted("ucx.half=stall:%d" % int(stall * 1000), layout="1p1d", model=model,
                 prefill_args=["--xfer-timeout", "2s"], decode_args=["--xfer-timeout", "2s"],
                 proxy_args=["--health-interval", "100ms"]) as pool:
        c = open_stream(pool, PROMPT, 4000)
        wait_for(lambda: fired(pool, "decode-0", "ucx.half"), 15, "the pull", interval=0.01)
        # (decode's own /health numbers are refreshed between engine steps: stale mid-pull)
        wait_for(lambda: health(pool)["prefill"][0]["leases"] == 1, stall,
                 "/health to show the pull's lease held", interval=0.01)
        t = time.monotonic()
        c.close()                  # the client leaves while the GETs are in flight
        # prefill's aborted lease waits out its quarantine (2 s, the transfer timeout)
        wait_for(lambda: all_free(pool), stall + 2 + 3, "pages back after an abort while pulling")
        took = time.monotonic() - t
        assert pool.metrics().sum("kvf_instance_quarantined_blocks_total", role="prefill") >= 1
        r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True)
        check_answer(r, refs, PROMPT, "next request")
        return "pages back on both sides %.2f s after the client left (decode stalled %.1f s" \
            " mid-pull; prefill quarantined the aborted lease 2 s)" % (took, stall)


def abort_queued_decoding(model, refs):
    """Rows abort-queued and abort-decoding. Every decode step is slowed down
    (decode.step@1+=stall), so A (38-token prompt, 60 tokens) decodes for seconds;
    decode's pool holds A but not also B (a 100-token prompt), so B waits in
    decode's queue. B's client leaves (queued), then A's (decoding)."""
    # hybrid: 2 Mamba blocks + 80-token attention blocks; dense: 16-token blocks
    num_blocks = {"tiny-hybrid": 5, "tiny-dense": 7}[os.path.basename(model).split("-seed")[0]]
    with Faulted("decode.step@1+=stall:50", layout="1p1d", model=model,
                 prefill_args=["--xfer-timeout", "1s"],
                 decode_args=["--num-blocks", str(num_blocks), "--xfer-timeout", "1s"],
                 proxy_args=["--health-interval", "100ms"]) as pool:
        a = open_stream(pool, PROMPT, 60)
        ra = a.getresponse()
        assert ra.status == 200, ra.status
        ra.readline()                              # A is decoding
        b = open_stream(pool, "y" * 99, MAX_TOKENS)
        wait_for(lambda: health(pool)["decode"][0]["queue_depth"] >= 1, 10, "B queued at decode",
                 interval=0.02)
        p = health(pool)["prefill"][0]
        assert p["leases"] == 1, "B's prefill lease is not held while B waits: %s" % p
        t = time.monotonic()
        b.close()
        wait_for(lambda: health(pool)["decode"][0]["queue_depth"] == 0, 5,
                 "B dropped from decode's queue", interval=0.02)
        # its prefill lease was aborted: the blocks wait out the quarantine (1 s) first
        wait_for(lambda: health(pool)["prefill"][0]["leases"] == 0 and
                 health(pool)["prefill"][0]["free_pages"] == health(pool)["prefill"][0][
                     "total_pages"], 5, "B's prefill blocks freed", interval=0.02)
        tq = time.monotonic() - t
        d = health(pool)["decode"][0]
        assert d["running"] == 1 and d["free_pages"] < d["total_pages"], \
            "A stopped decoding before its client left: %s" % d
        t = time.monotonic()
        a.close()
        wait_for(lambda: all_free(pool), 5, "pages back after an abort while decoding",
                 interval=0.02)
        td = time.monotonic() - t
        assert health(pool)["decode"][0]["running"] == 0
        return {"abort-queued": "queued request dropped, its prefill lease and pages back %.2f s"
                                " after the client left" % tq,
                "abort-decoding": "pages back on both sides %.2f s after the client left "
                                  "(mid-answer)" % td}


# ---- runner -----------------------------------------------------------------

def kv_corrupt(model, refs, trials=4):
    """decode ucx.data@1+=corrupt: one byte of every pull's landed KV flipped, as if garbled
    on the wire. With --kv-digest on (the default) prefill finds the digest of what decode
    received differs from what it sent and answers the release corrupt: every trial is
    caught, recomputed, and the client gets the colocated tokens."""
    with Faulted("ucx.data@1+=corrupt", layout="1p1d", model=model,
                 decode_args=["--load-failure", "recompute", "--xfer-timeout", "2s"]) as pool:
        for i in range(trials):
            prompt = PROMPT if i % 2 == 0 else PROMPT_B
            r = pool.complete(prompt, max_tokens=MAX_TOKENS, temperature=0,
                              return_token_ids=True, timeout=30)
            assert r["kv_transfer"]["recomputed"] is True, r["kv_transfer"]
            check_answer(r, refs, prompt, "trial %d (recomputed after the corruption)" % i)
        dlog, plog = pool.log("decode-0"), pool.log("prefill-0")
        flipped = len(re.findall(r"fault ucx\.data: request \S+: one byte", dlog))
        caught = len(re.findall(r"KV digest mismatch", dlog))
        answered = len(re.findall(r"differs from what was sent", plog))
        assert flipped == trials and caught == trials and answered == trials, (
            flipped, caught, answered, dlog[-2000:])
        wait_for(lambda: all_free(pool), 10, "pages back on both sides")
        return ("%d of %d corruptions caught (prefill answered corrupt, decode recomputed);"
                " every answer equals the colocated tokens" % (caught, trials))


ROWS = [
    # (row id, matrix wording, driver, returns a dict of several rows?)
    ("prefill-killed-half-gets", "prefill killed after half of the GETs were posted",
     lambda m, r: prefill_killed_half_gets(m, r, "fail")),
    ("prefill-killed-half-gets-recompute", "same, decode --load-failure recompute",
     lambda m, r: prefill_killed_half_gets(m, r, "recompute")),
    ("decode-killed-mid-pull", "decode killed mid-pull", decode_killed_mid_pull),
    ("decode-stopped-past-lease", "decode stopped past the lease while another prompt reuses "
     "prefill's blocks (stopped mid-pull)", decode_stopped_past_lease),
    ("decode-stopped-before-release", "same, stopped after its GETs, before its release",
     lambda m, r: decode_stopped_past_lease(m, r, "lease.send")),
    ("release-forged-replayed+stale-params-replayed", None, release_forged_and_stale),
    ("release-unanswered", "prefill stalls answering the release (not in the issue's table)",
     release_unanswered),
    ("garbage-metadata", "garbage metadata from a peer",
     lambda m, r: garbage_metadata(m, r, "side.reply")),
    ("rkey-trailing-bytes", "remote keys with bytes a newer UCX may append",
     rkey_trailing_bytes),
    ("side-channel-silent", "side channel that accepts and never answers", side_channel_silent),
    ("abort-pulling", "client abort while pulling", abort_pulling),
    ("abort-queued+abort-decoding", None, abort_queued_decoding),
    ("kv-corrupt", "KV bytes corrupted in flight (ucx.data=corrupt, --kv-digest on)", kv_corrupt),
]


def main(argv):
    want = set(argv[1:])
    if not fault_build():
        print("skipped: this build has no fault points (configure with -DKVF_FAULT_INJECTION=ON;"
              " tests/run.sh does)")
        return 77
    t_all = time.monotonic()
    table, failed = [], 0
    for name in MODELS:
        model = model_dir(name)
        refs = {p: reference(model, p, MAX_TOKENS) for p in (PROMPT, PROMPT_B)}
        for row, _, fn in ROWS:
            if want and not (want & set(row.split("+"))) and row not in want:
                continue
            t0 = time.monotonic()
            try:
                got = fn(model, refs)
                got = got if isinstance(got, dict) else {row: got}
                for k, detail in got.items():
                    table.append((name, k, "passed", time.monotonic() - t0, detail))
            except Skip as e:
                for k in row.split("+"):
                    table.append((name, k, "skipped", time.monotonic() - t0, str(e)))
            except Exception as e:  # noqa: BLE001 - report every row, fail at the end
                failed += 1
                traceback.print_exc()
                for k in row.split("+"):
                    table.append((name, k, "FAILED", time.monotonic() - t0,
                                  "%s: %s" % (type(e).__name__, str(e)[:300])))
            print("%-12s %-34s %-7s %5.1f s  %s" % table[-1], flush=True)
    print("\nfault matrix (%.1f s):" % (time.monotonic() - t_all))
    for t in table:
        print("  %-12s %-34s %-7s %5.1f s  %s" % t)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
