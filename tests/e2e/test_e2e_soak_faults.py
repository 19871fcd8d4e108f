#!/usr/bin/env python3
"""Memory does not grow with failures (issue 10, item 7).

A 1p1d pool with two decode instances under steady load (8 clients, random
prompts, half streamed), while instances are killed (SIGKILL, often in the
middle of a pull) and started again by hand (kvf-up --restart):

A. decode instances, one after the other, KILL_CYCLES times: the prefill
   instance sees its GET sources vanish mid-read, leases never released
   (they expire into quarantine), endpoints to dead workers, a new decode
   incarnation per restart;
B. the prefill instance, KILL_CYCLES times: the decode instances see pulls
   fail (peer gone mid-GET, handshakes that time out), their cached
   metadata and endpoints of the dead engine, a new incarnation per restart;
C. the prefill instance stopped (SIGSTOP) for longer than the transfer
   timeout, then continued, KILL_CYCLES times: every process lives, and the
   pulls in flight fail by timeout (lease claims and releases "peer did not
   answer in time": the failure an overloaded pool showed), and prefill's
   leases expire into quarantine.

After the first cycle of each phase (warm-up) the RSS (less shared memory: the page
pools) of every surviving process is recorded; after the last it must be within RSS_SLACK_MB of that
value. Requests on the killed instance fail (counted, expected); the pool
must serve again after each restart, and every page comes back at the end.
Short timeouts (--xfer-timeout 1s, --lease-timeout 3s) only make the
expiries and quarantines of the failed requests end within the test.

The prefix cache is on (the default): prefill keeps freed blocks cached and
Mamba state checkpoints in a budget of their own, so its memory grows until the
page pool has been gone through once and the state budget is full, by design
(bounded by --num-blocks and --prefix-state-bytes). The load runs until
prefill has evicted both a cached block and a checkpoint (its /metrics) before
phase A (and again before phase C: phase B restarted it), with a 4 MiB state budget so that takes seconds; growth after that is
what the bound is about.
"""

import http.client
import json
import os
import random
import signal
import subprocess
import threading
import time

from e2e_models import model_dir
import urllib.request

from kvf_e2e import Pool, free_port_range, parse_metrics, wait_for

CLIENTS = 8
KILL_CYCLES = int(os.environ.get("SOAK_KILL_CYCLES", "6"))
RSS_SLACK_MB = 8.0


def rss_kb(pid):
    """Resident memory but shared memory (RssShmem): the page pools are UCX-mapped shared
    memory, whose pages are touched as the prefix cache keeps blocks across requests, up to
    the pool's fixed size; a leak is private memory."""
    fields = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(("VmRSS:", "RssShmem:")):
                    fields[line.split(":")[0]] = int(line.split()[1])
    except FileNotFoundError:
        pass
    return fields.get("VmRSS", 0) - fields.get("RssShmem", 0)


class Load:
    """CLIENTS closed-loop clients until stop(); counts outcomes."""

    def __init__(self, pool):
        self.pool, self.stop_flag = pool, False
        self.lock = threading.Lock()
        self.ok = self.failed = 0
        self.threads = [threading.Thread(target=self.client, args=(k,)) for k in range(CLIENTS)]

    def one(self, rng):
        n = rng.randint(1, 200)
        body = {"prompt": "".join(chr(rng.randint(32, 126)) for _ in range(n)),
                "max_tokens": rng.randint(1, 16), "temperature": rng.random(),
                "stream": rng.random() < 0.5, "model": self.pool.model_name}
        conn = http.client.HTTPConnection(self.pool.host, self.pool.port, timeout=60)
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            raw = r.read()
            ok = r.status == 200 and (not body["stream"] or (
                raw.rstrip().endswith(b"data: [DONE]") and b'"error"' not in raw))
        except OSError:
            ok = False
        finally:
            conn.close()
        with self.lock:
            if ok:
                self.ok += 1
            else:
                self.failed += 1

    def client(self, k):
        rng = random.Random(50 + k)
        while not self.stop_flag:
            self.one(rng)

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stop_flag = True
        for t in self.threads:
            t.join(timeout=90)
        assert not any(t.is_alive() for t in self.threads), "a client never finished"

    def counts(self):
        with self.lock:
            return self.ok, self.failed


def instance(pool, name):
    role, idx = name.split("-")
    return pool.health()[1][role][int(idx)]


def kill_and_restart(pool, load, name):
    """SIGKILL @name once requests flow, start it again, wait until it serves."""
    ok0 = load.counts()[0]
    wait_for(lambda: load.counts()[0] >= ok0 + 3, 60, "requests served before the kill")
    restarts = instance(pool, name)["restarts"]
    os.kill(pool.pids()[name], signal.SIGKILL)
    subprocess.run([os.path.join(pool.bin_dir, "kvf-up"), "--restart", name, "--run-dir",
                    pool.run_dir], check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   timeout=60)
    wait_for(lambda: (instance(pool, name)["restarts"] > restarts and
                      instance(pool, name)["healthy"]), 60, "%s back and healthy" % name)


def stop_and_continue(pool, load, name, seconds=3.0):
    """SIGSTOP @name once requests flow, SIGCONT it after @seconds, wait until it serves."""
    ok0 = load.counts()[0]
    wait_for(lambda: load.counts()[0] >= ok0 + 3, 60, "requests served before the stop")
    pid = pool.pids()[name]
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)      # the fault itself lasts this long (not a wait for an outcome)
    finally:
        os.kill(pid, signal.SIGCONT)
    ok1 = load.counts()[0]
    wait_for(lambda: load.counts()[0] >= ok1 + 3, 60, "requests served after SIGCONT")


def phase(pool, load, victims, survivors, what, fault=None):
    rss_warm = None
    fault = fault or kill_and_restart
    for cycle in range(KILL_CYCLES):
        fault(pool, load, victims[cycle % len(victims)])
        if cycle == 0:
            rss_warm = {n: rss_kb(pool.pids()[n]) for n in survivors}
    ok0 = load.counts()[0]
    wait_for(lambda: load.counts()[0] >= ok0 + 3, 60, "requests served after the last restart")
    rss_end = {n: rss_kb(pool.pids()[n]) for n in survivors}
    print("%s: %d cycles; RSS after the first cycle -> after the last:" % (what, KILL_CYCLES))
    for n in survivors:
        print("  %-10s %6.1f MB -> %6.1f MB (%+.1f MB; bound +%.0f MB)" % (
            n, rss_warm[n] / 1024, rss_end[n] / 1024, (rss_end[n] - rss_warm[n]) / 1024,
            RSS_SLACK_MB))
    return rss_warm, rss_end


def evicted(metrics_port):
    """prefill's prefix cache evictions so far: (blocks, state checkpoints)."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port,
                                    timeout=5) as r:
            m = parse_metrics(r.read().decode())
    except OSError:
        return 0, 0
    count = lambda name: sum(v for (n, _), v in m.items() if n == name)   # noqa: E731
    return (count("kvf_daemon_prefix_blocks_evicted_total"),
            count("kvf_daemon_prefix_states_evicted_total"))


def main():
    t0 = time.monotonic()
    model = model_dir("tiny-hybrid")
    mport = free_port_range(1, lo=31000)
    with Pool(layout="1p1d", model=model, prefill_instances=1, decode_instances=2, timeout=90,
              prefill_args=["--lease-timeout", "3s", "--xfer-timeout", "1s",
                            "--prefix-state-bytes", "4m", "--metrics-port", str(mport)],
              decode_args=["--xfer-timeout", "1s"]) as pool:
        st, h = pool.health()
        start_pages = {i["url"]: i["total_pages"] for i in h["prefill"] + h["decode"]}
        load = Load(pool).start()
        try:
            # the prefix cache full (pool pages and state budget gone through once)
            wait_for(lambda: all(v > 0 for v in evicted(mport)), 120,
                     "prefill's prefix cache evicting blocks and checkpoints", interval=0.5)
            a = phase(pool, load, ["decode-0", "decode-1"], ["prefill-0", "proxy"],
                      "A, decode instances killed")
            b = phase(pool, load, ["prefill-0"], ["decode-0", "decode-1", "proxy"],
                      "B, the prefill instance killed")
            # phase B's restarts left a prefill with an empty cache: full again first
            wait_for(lambda: all(v > 0 for v in evicted(mport)), 120,
                     "the restarted prefill's prefix cache evicting", interval=0.5)
            c = phase(pool, load, ["prefill-0"], ["prefill-0", "decode-0", "decode-1", "proxy"],
                      "C, the prefill instance stopped past the transfer timeout",
                      stop_and_continue)
        finally:
            load.stop()
        ok, failed = load.counts()
        m = pool.metrics()

        def pages_back():
            hh = pool.health()[1]
            return all(i["free_pages"] == start_pages[i["url"]]
                       for i in hh["prefill"] + hh["decode"])
        wait_for(pages_back, 30, "every page back")
        print("%d requests: %d ok, %d failed (on the killed instances); peer errors %s;"
              " %.0f s" % (ok + failed, ok, failed,
                           m.sum("kvf_instance_peer_errors_total"), time.monotonic() - t0))
        assert failed > 0 and ok > 0, (ok, failed)
        for warm, end in (a, b, c):
            for n in warm:
                assert end[n] - warm[n] <= RSS_SLACK_MB * 1024, (
                    "%s RSS grew from %d kB to %d kB over the failures" % (n, warm[n], end[n]))
    print("test_e2e_soak_faults passed")


if __name__ == "__main__":
    main()
