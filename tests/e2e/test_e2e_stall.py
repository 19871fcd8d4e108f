#!/usr/bin/env python3
"""A stalled prefill delays only its own requests (issue 23, docs/FAILURES.md).

Pool of 2 prefill and 1 decode instance (tiny hybrid). Decode pulls with a
2.5 s --test-pull-delay between its lease claim and the GETs, so a request's
lease is held (visible in its prefill's health) while its pull is in flight.
The test sends a probe request, finds the prefill holding its lease and
SIGSTOPs that one mid-pull (before the probe's release) while three long
streams decode and new requests arrive.
Decode's transfer path does not wait on the network, so:

- the long streams (their KV already pulled) keep their inter-token gaps:
  their p99 while the prefill is stopped stays under 2x the p99 of an
  unstalled run (50 ms of slack on a loaded host), and no gap reaches 1 s
  (before the state machine, every stream froze for the whole transfer
  timeout, 3 s here);
- new requests whose first token came from the healthy prefill complete,
  zero failures;
- the stalled prefill's own requests end with an error event and [DONE]
  (the probe: its release is never answered within --xfer-timeout, and it
  ends before SIGCONT: decode did not wait for the peer) or complete after
  SIGCONT.

Figures are printed (gaps, counts). Under ~90 s.
"""

import os
import signal
import threading
import time

from e2e_models import model_dir
from kvf_e2e import HttpError, Pool, skip_without_test_switches, wait_for

XFER_TIMEOUT_S = 3
PULL_DELAY_S = 2.5
STOP_S = 8


def gaps(times):
    """Inter-token gaps from the second token on (the first gap holds the pull)."""
    return [b - a for a, b in zip(times[1:], times[2:])]


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else 0.0


class Stream(threading.Thread):
    """One streamed completion, its event times in monotonic seconds."""

    def __init__(self, pool, prompt, max_tokens, timeout=60):
        super().__init__(daemon=True)
        self.pool, self.prompt, self.max_tokens, self.timeout = pool, prompt, max_tokens, timeout
        self.stamps, self.events, self.result, self.error = [], [], None, None
        self.first = threading.Event()

    def on_event(self, ev, conn):
        self.stamps.append(time.monotonic())
        self.events.append(ev)
        self.first.set()

    def run(self):
        body = self.pool.completion_body(self.prompt, self.max_tokens, stream=True,
                                         ignore_eos=True)
        try:
            self.result = self.pool.stream(body, timeout=self.timeout, on_event=self.on_event)
        except (HttpError, OSError) as e:
            self.error = e
        self.first.set()

    def ok(self):
        r = self.result
        return (self.error is None) and (r is not None) and r.done and not r.errors

    def ended_cleanly(self):
        """Completed, or ended with an error event followed by [DONE], or refused with an
        HTTP 5xx error body before any token was sent (the proxy drops a prefill that misses
        its ZeroMQ heartbeats for 3 s and fails that prefill's requests at once)."""
        r = self.result
        if isinstance(self.error, HttpError):
            return self.error.status >= 500 and not self.stamps and "error" in str(self.error)
        return (self.error is None) and (r is not None) and r.done


def run_streams(pool, n, max_tokens, tag):
    ts = [Stream(pool, "%s stream %d: tell me a long story" % (tag, i), max_tokens)
          for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=90)
    return ts


def prefills(pool):
    return pool.health()[1]["prefill"]


def main():
    skip_without_test_switches()
    model = model_dir("tiny-hybrid")
    with Pool(layout="2p1d", model=model, prefill_instances=2, timeout=90,
              decode_args=["--test-pull-delay", "%dms" % int(1000 * PULL_DELAY_S),
                           "--xfer-timeout", "%ds" % XFER_TIMEOUT_S,
                           "--load-failure", "fail"],
              proxy_args=["--token-timeout", "30s"]) as pool:
        # warm up: both prefills handshaken
        run_streams(pool, 2, 4, "warm")
        base = run_streams(pool, 3, 48, "base")
        assert all(t.ok() for t in base), [(t.error, t.result and t.result.errors) for t in base]
        base_gaps = [g for t in base for g in gaps(t.stamps)]
        base_p99 = p99(base_gaps)
        # the stalled run's p99 must stay under 2x this one's (50 ms of slack for a loaded
        # host), and no single gap may come near the transfer timeout the old leader froze for
        bound_p99 = max(2 * base_p99, base_p99 + 0.05)
        bound_max = 1.0
        print("unstalled: %d gaps, p99 %.1f ms, max %.1f ms; bounds while stalled: p99 < %.0f ms,"
              " max < %.0f ms" % (len(base_gaps), 1e3 * base_p99, 1e3 * max(base_gaps),
                                  1e3 * bound_p99, 1e3 * bound_max))

        longs = [Stream(pool, "long stream %d: tell me a long story" % i, 700, timeout=120)
                 for i in range(3)]
        for t in longs:
            t.start()
        wait_for(lambda: all(len(t.stamps) >= 4 for t in longs), 30, "the long streams decode")

        probe = Stream(pool, "the probe whose prefill stops", 24, timeout=60)
        probe.start()
        assert probe.first.wait(30), "probe got no first token"
        t_first = time.monotonic()
        # the probe's prefill, as its first chunk names it (its lease is held there for
        # PULL_DELAY_S: decode claimed it and waits before its GETs)
        url = wait_for(lambda: probe.events and probe.events[0].get("prefill_instance"), 2,
                       "the probe's first chunk")
        stalled = [p for p in prefills(pool) if p["url"] == url][0]["engine_id"]
        pid = pool.pids()[stalled]
        assert time.monotonic() - t_first < PULL_DELAY_S - 0.5, "found the prefill too late"
        os.kill(pid, signal.SIGSTOP)
        t_stop = time.monotonic()
        print("SIGSTOP %s (pid %d): the probe's prefill, its lease held there" % (stalled, pid))
        news = []
        try:
            for i in range(4):
                t = Stream(pool, "new request %d while %s is stopped" % (i, stalled), 24,
                           timeout=60)
                t.start()
                news.append(t)
                time.sleep(0.3)   # spread over the stall (pacing, not a wait for an outcome)
            wait_for(lambda: not probe.is_alive(), PULL_DELAY_S + XFER_TIMEOUT_S + 3,
                     "the probe to end while %s is stopped" % stalled)
            t_probe = time.monotonic()
            while time.monotonic() < t_stop + STOP_S:
                time.sleep(0.05)  # the stall lasts STOP_S (bounded)
        finally:
            os.kill(pid, signal.SIGCONT)
        t_cont = time.monotonic()
        for t in longs + news:
            t.join(timeout=90)

        # the long streams: no failure, no gap at the stall
        assert all(t.ok() for t in longs), [(t.error, t.result and t.result.errors) for t in longs]
        in_stall = [b - a for t in longs for a, b in zip(t.stamps[2:], t.stamps[3:])
                    if b >= t_stop and a <= t_cont]
        worst = max(in_stall) if in_stall else 0.0
        print("long streams while %s was stopped (%.1f s): %d gaps, p99 %.1f ms, max %.1f ms"
              % (stalled, t_cont - t_stop, len(in_stall), 1e3 * p99(in_stall), 1e3 * worst))
        assert in_stall, "no token of the long streams during the stall"
        assert p99(in_stall) < bound_p99, "p99 gap %.0f ms while stalled (bound %.0f ms)" % (
            1e3 * p99(in_stall), 1e3 * bound_p99)
        assert worst < bound_max, "a long stream stalled %.0f ms" % (1e3 * worst)
        # the probe: its release went to the stopped prefill: an error event and [DONE]
        # after --xfer-timeout, before SIGCONT (decode never waited for the peer)
        assert probe.ended_cleanly() and probe.result.errors, (
            probe.error, probe.result and probe.result.events[-3:])
        assert t_probe < t_cont, "the probe ended only after SIGCONT"
        print("probe: error event + [DONE] %.1f s after SIGSTOP: %s"
              % (t_probe - t_stop, probe.result.errors[0]))
        # new requests: those served by the healthy prefill (first token before SIGCONT) all OK
        healthy = [t for t in news if t.stamps and t.stamps[0] < t_cont]
        others = [t for t in news if t not in healthy]
        failed = [t for t in healthy if not t.ok()]
        print("new requests: %d via the healthy prefill (%d failed), %d via %s (%d completed"
              " after SIGCONT, %d error+[DONE])"
              % (len(healthy), len(failed), len(others), stalled,
                 sum(t.ok() for t in others), sum(t.ended_cleanly() and not t.ok()
                                                  for t in others)))
        assert not failed, [(t.error, t.result and t.result.errors) for t in failed]
        assert all(t.ended_cleanly() for t in others), [(t.error, t.result and t.result.events[-2:])
                                                        for t in others]
    print("PASS test_e2e_stall")


if __name__ == "__main__":
    main()
