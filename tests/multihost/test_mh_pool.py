#!/usr/bin/env python3
"""A pool on several test hosts, deployed over ssh, under network conditions and faults.

Hosts (network namespaces on one bridge, mh_net.TestNet): h0 runs kvf-up and
the proxy, h1 the prefill instance, h2 the decode instances, h3 a second
prefill host for the routing case. Each of h1..h3 runs an OpenSSH server
with a throw-away key; kvf-up reaches them with `ssh` (KVF_SSH) and starts
the daemons there with UCX_TLS=tcp,self, so KV and Mamba state cross the veth
links over UCX's TCP transport (shared memory would bypass the network).

Cases, each asserted:
 1. deploy: kvf-up --hosts places a TP4 prefill (h1) and two TP2 decode
    instances (h2), the proxy on h0; each process runs in its host (its
    network namespace); no daemon listens on a wildcard address; prompts
    through the proxy give the colocated `kvf generate` tokens; the bytes
    decode pulled arrived over h2's link (its interface counters).
 2. bandwidth cap (tc tbf) on h2's link: answers equal; the benchmark line
    prints transfer time against bytes / cap (the figure in the README).
    Delay 0.2, 1 and 5 ms each way (tc netem, or NFQUEUE and mh_delay.py where
    the kernel has no netem): answers equal.
 3. 1 % packet loss on h2's link: answers equal, no request fails.
 4. h2's link cut in the middle of a transfer: the request fails within
    CUT_BOUND_S; prefill's lease is freed; when the link returns the same
    pool (same pids) serves again.
 5. kvf-down from h0 stops every daemon on every host.
 6. a second pool, prefill on h1 and h3: h1 cut off -> the proxy marks it
    unhealthy and routes to h3; h3 cut too -> 503 with a message.
 7. h2 cut while a stream produces tokens: the stream ends with an error event
    and [DONE] within CUT_BOUND_S.
 8. h2 cut off for 8 s and for 30 s: every instance healthy again within
    HEALTH_BACK_S of the link's return; the first request to each decode
    instance after it answers 200 with the colocated tokens.
"""

import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

from mh_net import TestNet, skip, wait_for  # noqa: E402
from kvf_e2e import HttpError, Proxy, find_bin  # noqa: E402
from e2e_models import reference  # noqa: E402

PROMPTS = ["The ferry left at dawn",                 # 23 tokens: mid-block
           "Prefill computes, decode pulls. " * 4]   # 129 tokens: second block
# about 1500 tokens: 19 blocks of 80, about 1 MB of KV and Mamba state pulled
BENCH_PROMPT = "The ferry carries the cache across the strait; " * 31
MAX_TOKENS = 8
BASE_PORT = 20000
HTTP_PORT = 8000
# Link cut mid-transfer: the proxy's --token-timeout (the decode host no longer
# answers) plus slack; the README states this bound.
TOKEN_TIMEOUT_S = 3
CUT_BOUND_S = TOKEN_TIMEOUT_S + 2
# ... and prefill frees the lease one transfer timeout (--xfer-timeout, 5 s by
# default; 2 s here) after the proxy's abort, or when it expires
XFER_TIMEOUT_S = 2
LEASE_FREE_BOUND_S = CUT_BOUND_S + XFER_TIMEOUT_S + 3
# Outages with every connection idle across them (issue 26): health back within
# HEALTH_BACK_S of the link, the first request after it answered
OUTAGES_S = (8, 30)
HEALTH_BACK_S = 2.0


class NsProxy(Proxy):
    """kvf_e2e.Proxy whose sockets live in test host `host` (network namespace)."""

    def __init__(self, net, host, addr, port, model_name=None):
        super().__init__(addr, port, model_name)
        self.net, self.host_i = net, host

    def request(self, *a, **kw):
        return self.net.call(self.host_i, Proxy.request, self, *a, **kw)

    def stream(self, *a, **kw):
        return self.net.call(self.host_i, Proxy.stream, self, *a, **kw)


class MhPool:
    """kvf-up run inside host 0 with a hosts file; kvf-down likewise."""

    def __init__(self, net, hosts, layout, n_prefill, n_decode, model, tag, proxy_args=()):
        self.net, self.bin = net, find_bin()
        self.run_dir = os.path.join(net.tmp, "run-" + tag)
        self.hosts_file = os.path.join(net.tmp, "hosts-" + tag)
        with open(self.hosts_file, "w") as f:
            f.write("# test hosts\n" + "".join(net.addr(h) + "\n" for h in hosts))
        self.env = dict(os.environ, KVF_SSH=net.ssh)
        self.cmd = [os.path.join(self.bin, "kvf-up"), "--layout", layout,
                    "--prefill-instances", str(n_prefill), "--decode-instances", str(n_decode),
                    "--hosts", self.hosts_file, "--base-port", str(BASE_PORT),
                    "--host", net.addr(0), "--port", str(HTTP_PORT), "--model", model,
                    "--run-dir", self.run_dir, "--timeout", "60", "--env", "UCX_TLS=tcp,self",
                    "--env", "KVF_XFER_TIMEOUT=%ds" % XFER_TIMEOUT_S]
        for a in proxy_args:
            self.cmd += ["--proxy-arg", a]
        self.up = False

    def start(self):
        t0 = time.monotonic()
        p = self.net.run(0, self.cmd, check=False, env=self.env, timeout=90)
        if p.returncode != 0:
            raise AssertionError("kvf-up failed (%d):\n%s%s" % (p.returncode, p.stdout, p.stderr))
        self.up = True
        url = p.stdout.strip().splitlines()[-1]
        assert url == "http://%s:%d" % (self.net.addr(0), HTTP_PORT), url
        self.proxy = NsProxy(self.net, 0, self.net.addr(0), HTTP_PORT)
        self.proxy.model_name = self.proxy.models()["data"][0]["id"]
        print("kvf-up over ssh: ready in %.1f s" % (time.monotonic() - t0), flush=True)
        return self

    def pids(self):
        out = {}
        for fn in sorted(os.listdir(self.run_dir)):
            if fn.endswith(".pid"):
                with open(os.path.join(self.run_dir, fn)) as f:
                    pid, host, _ = f.read().split(None, 2)
                out[fn[:-4]] = (int(pid), host)
        return out

    def log(self, name):
        try:
            with open(os.path.join(self.run_dir, name + ".log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def down(self):
        p = self.net.run(0, [os.path.join(self.bin, "kvf-down"), "--run-dir", self.run_dir],
                         check=False, env=self.env, timeout=60)
        self.up = False
        return p


def netns_host(net, pid):
    ino = os.stat("/proc/%d/ns/net" % pid).st_ino
    for i, ns in enumerate(net.ns):
        if os.stat("/run/netns/" + ns).st_ino == ino:
            return i
    return None


def rx_bytes(net, i):
    out = net.run(i, ["cat", "/sys/class/net/eth0/statistics/rx_bytes"]).stdout
    return int(out)


def ask(proxy, prompt, stream=False, timeout=60):
    # a salt of its own per request: the cases measure whole pulls, so neither prefill's nor
    # decode's prefix cache (docs/PREFIX_CACHE.md) may serve a prompt asked before
    ask.n = getattr(ask, "n", 0) + 1
    r = proxy.complete(prompt, max_tokens=MAX_TOKENS, temperature=0, stream=stream,
                       return_token_ids=True, timeout=timeout,
                       cache_salt="mh-pool-%d-%d" % (os.getpid(), ask.n))
    if stream:
        assert r.done and not r.errors, r.events[-3:]
        return r.token_ids, r.final["kv_transfer"]
    return r["choices"][0]["token_ids"], r["kv_transfer"]


def check_answer(proxy, refs, prompt, what, stream=False):
    from e2e_models import check_tokens
    got, kv = ask(proxy, prompt, stream=stream)
    ref_tokens, ref_logits = refs[prompt]
    check_tokens(got, ref_tokens, ref_logits, False, what)
    assert kv and kv["bytes"] > 0 and kv["reads"] >= 1, kv
    return kv


def case_deploy(net, pool, refs):
    # every process in its host
    where = {name: netns_host(net, pid) for name, (pid, _) in pool.pids().items()}
    assert where == {"proxy": 0, "prefill-0": 1, "decode-0": 2, "decode-1": 2}, where
    # bound to the host's address (or loopback), never a wildcard
    for i in (0, 1, 2):
        for addr, port, proc in net.listeners(i):
            if not proc.startswith("kvf-"):
                continue
            assert addr in (net.addr(i), "127.0.0.1"), (i, addr, port, proc)
    ls1 = net.listeners(1)
    assert (net.addr(1), BASE_PORT, "kvf-prefill") in ls1, ls1
    assert (net.addr(1), BASE_PORT + 1, "kvf-prefill") in ls1, ls1
    before = rx_bytes(net, 2)
    pulled, served = 0, set()
    for k, prompt in enumerate(PROMPTS):
        for stream in (False, True):
            kv = check_answer(pool.proxy, refs, prompt, "deploy prompt %d" % k, stream)
            pulled += kv["bytes"]
    after = rx_bytes(net, 2)
    # round robin: both decode instances served
    m = pool.proxy.metrics()
    for lab in m.labels("kvf_instance_healthy"):
        assert m.value("kvf_instance_healthy", **lab) == 1, lab
    served = {r["decode_instance"] for r in
              (pool.proxy.complete(PROMPTS[0], max_tokens=2, temperature=0) for _ in range(2))}
    assert len(served) == 2, served
    assert after - before >= pulled, (before, after, pulled)
    print("deploy: proxy on h0, TP4 prefill on h1, two TP2 decode on h2; %d answers equal "
          "the colocated run; %d KV bytes pulled, h2 received %d bytes on its link"
          % (2 * len(PROMPTS), pulled, after - before), flush=True)


def case_rate_cap(net, pool, refs):
    rows = []
    for mbit in (25, 100, 400):
        net.shape(2, rate_mbit=mbit)
        try:
            for k, prompt in enumerate([PROMPTS[1], BENCH_PROMPT]):
                kv = check_answer(pool.proxy, refs, prompt, "cap %d prompt %d" % (mbit, k))
                ideal_ms = kv["bytes"] * 8 / (mbit * 1e6) * 1e3
                rows.append((mbit, kv["bytes"], kv["transfer_ms"], ideal_ms))
        finally:
            net.shape(2)
    for k, prompt in enumerate([PROMPTS[1], BENCH_PROMPT]):
        kv = check_answer(pool.proxy, refs, prompt, "no cap prompt %d" % k)
        rows.append((0, kv["bytes"], kv["transfer_ms"], 0))
    print("benchmark: KV pull (UCX TCP, 4p2d, two decode ranks pulling) under a tc tbf cap "
          "on the decode host's link", flush=True)
    print("  cap_mbit    bytes  transfer_ms  bytes/cap_ms  time/ideal", flush=True)
    for mbit, b, ms, ideal in rows:
        print("  %8s %8d %12.2f %13s %11s" % (mbit or "none", b, ms,
                                              "%.2f" % ideal if ideal else "-",
                                              "%.2f" % (ms / ideal) if ideal else "-"), flush=True)
    # the cap is real: the long prompt's pull takes at least 80 % of bytes / cap
    # at 25 Mbit/s, and far longer than without a cap
    long25 = [r for r in rows if r[0] == 25 and r[1] == max(x[1] for x in rows)]
    uncapped = [r for r in rows if r[0] == 0 and r[1] == long25[0][1]]
    assert long25 and all(ms >= 0.8 * ideal for _, _, ms, ideal in long25), rows
    assert long25[0][2] > 3 * uncapped[0][2], rows


def case_delay(net, pool, refs):
    mech = "tc netem" if net.has_netem() else "NFQUEUE (this kernel has no netem)"
    rows = []
    for delay in (0.2, 1, 5):
        net.shape(2, delay_ms=delay)
        try:
            for prompt in (PROMPTS[0], BENCH_PROMPT):
                t0 = time.monotonic()
                kv = check_answer(pool.proxy, refs, prompt, "delay %g ms" % delay)
                rows.append((delay, kv["bytes"], kv["transfer_ms"],
                             (time.monotonic() - t0) * 1e3))
            queued = net.delayed(2)
            assert queued is None or queued > 0, "no packet went through the delay queue"
        finally:
            net.shape(2)
    print("delay (%s, each way on the decode host's link): answers equal" % mech, flush=True)
    print("  delay_ms    bytes  transfer_ms  request_ms", flush=True)
    for d, b, ms, req in rows:
        print("  %8g %8d %12.2f %11.2f" % (d, b, ms, req), flush=True)
    # the whole request crosses h2's link several times (proxy to decode and
    # back, the pull, the release): at least 2 round trips of 2 x the delay;
    # the long prompt's pull at least one round trip (a transfer faster than
    # that crossed a path the delay missed, as IPv6 did before mh_net delayed it)
    assert all(req >= 4 * d for d, _, _, req in rows), rows
    assert all(ms >= 2 * d for d, b, ms, _ in rows if b == max(r[1] for r in rows)), (
        "a KV transfer faster than one round trip of the delay", rows)


def case_loss(net, pool, refs):
    net.shape(2, loss_pct=1)
    try:
        n = 0
        for rep in range(3):
            for k, prompt in enumerate(PROMPTS):
                check_answer(pool.proxy, refs, prompt, "1%% loss prompt %d rep %d" % (k, rep))
                n += 1
        dropped = net.dropped(2)
    finally:
        net.shape(2)
    assert dropped > 0, "the loss rule dropped nothing"
    m = pool.proxy.metrics()
    bad = sum(v for (name, labels), v in m.samples.items()
              if name == "kvf_proxy_requests_total" and dict(labels).get("code") != "200")
    assert bad == 0, m.text
    print("loss: %d answers equal at 1%% loss on the decode host's link (%d frames dropped), "
          "no request failed" % (n, dropped), flush=True)


def prefill_leases(pool):
    code, h = pool.proxy.health(timeout=5)
    return h["prefill"][0].get("leases")


def case_link_cut(net, pool, refs):
    pids_before = pool.pids()
    # slow the link so the pull of the long prompt takes a while, then cut it
    # once prefill holds the lease (prefill answered, decode is pulling)
    net.shape(2, rate_mbit=1)
    result = {}

    def client():
        t0 = time.monotonic()
        try:
            result["r"] = ask(pool.proxy, PROMPTS[1], timeout=30)
        except (HttpError, OSError) as e:
            result["e"] = e
        result["s"] = time.monotonic() - t0
    t = threading.Thread(target=client)
    t.start()
    try:
        wait_for(lambda: (prefill_leases(pool) or 0) > 0, 20, "prefill to hold a lease")
        net.link(2, up=False)
        t_cut = time.monotonic()
        t.join(timeout=CUT_BOUND_S + 10)
        assert not t.is_alive(), "the request is still running %.1fs after the cut" % (
            time.monotonic() - t_cut)
        failed_after = time.monotonic() - t_cut
        assert "e" in result, "the request succeeded across a cut link: %s" % (result,)
        assert failed_after <= CUT_BOUND_S, failed_after
        e = result["e"]
        wait_for(lambda: prefill_leases(pool) == 0, LEASE_FREE_BOUND_S,
                 "prefill's lease to be freed after the cut")
        lease_free_s = time.monotonic() - t_cut
    finally:
        net.link(2, up=True)
        net.shape(2)
    # the same pool serves again: same processes, both decode instances healthy
    def healthy():
        code, h = pool.proxy.health(timeout=5)
        return code == 200 and all(i["healthy"] for i in h["prefill"] + h["decode"])
    wait_for(healthy, 20, "every instance healthy after the link returns")
    # Connections that crossed the cut (UCX TCP endpoints, the proxy's ZeroMQ
    # sockets) resume at TCP's next retransmission, which backs off while the
    # link is down: a request may still fail (never answer wrongly) for a few
    # seconds. Wait until both decode instances answer once, then assert.
    def serves_again():
        try:
            for _ in range(2):
                check_answer(pool.proxy, refs, PROMPTS[0], "first answers after the cut")
            return True
        except (HttpError, OSError) as err:
            print("link cut: not serving yet (%s)" % (getattr(err, "status", err),), flush=True)
            return False
    wait_for(serves_again, 30, "both decode instances to answer after the link returns",
             interval=0.5)
    t_back = time.monotonic()
    for k, prompt in enumerate(PROMPTS):
        for _ in range(2):                  # both decode instances (round robin)
            check_answer(pool.proxy, refs, prompt, "after the cut prompt %d" % k)
    assert pool.pids() == pids_before, (pool.pids(), pids_before)
    for name, (pid, _) in pids_before.items():
        assert os.path.exists("/proc/%d" % pid), "%s (pid %d) is gone" % (name, pid)
    print("link cut: the request failed %.2f s after the decode host's link went down "
          "(%s); prefill's lease freed %.2f s after the cut; after the link returned the "
          "same pool answered %d prompts (no restart) within %.2f s"
          % (failed_after, getattr(e, "status", e), lease_free_s, 2 * len(PROMPTS),
             time.monotonic() - t_back), flush=True)


def all_healthy(pool):
    try:
        code, h = pool.proxy.health(timeout=1)
    except OSError:
        return False
    return code == 200 and all(i["healthy"] for i in h["prefill"] + h["decode"])


def case_outage(net, pool, refs, cut_s):
    """h2 (both decode instances) cut off for cut_s with every connection idle
    across it (UCX endpoints, ZeroMQ sockets: TCP's retransmission back-off grows
    with the outage). When the link returns: health back within HEALTH_BACK_S,
    and the first request to each decode instance answers 200 with the
    colocated tokens, no retry."""
    def serves():   # the previous case's cut may still be settling: not what is tested
        try:
            check_answer(pool.proxy, refs, PROMPTS[0], "before the %g s outage" % cut_s)
            return True
        except (HttpError, OSError):
            return False
    wait_for(serves, 20, "an answer before the %g s outage" % cut_s, interval=0.5)
    net.link(2, up=False)
    try:
        wait_for(lambda: not all_healthy(pool), 10, "the proxy to see h2 gone")
        # the rest of the outage: something crosses every connection meanwhile
        time.sleep(cut_s)   # the outage itself (its length is the case)
    finally:
        net.link(2, up=True)
    t_up = time.monotonic()
    wait_for(lambda: all_healthy(pool), 10, "every instance healthy after the %g s outage"
             % cut_s, interval=0.05)
    health_s = time.monotonic() - t_up
    firsts = []
    for k in range(2):                      # both decode instances (round robin)
        t0 = time.monotonic()
        got, kv = ask(pool.proxy, PROMPTS[k % len(PROMPTS)], timeout=30)
        ref_tokens, ref_logits = refs[PROMPTS[k % len(PROMPTS)]]
        from e2e_models import check_tokens
        check_tokens(got, ref_tokens, ref_logits, False, "first answers after the %g s outage"
                     % cut_s)
        firsts.append((time.monotonic() - t0) * 1e3)
    print("outage %g s: health back %.2f s after the link returned; the first requests "
          "after it answered 200 with the colocated tokens in %s ms"
          % (cut_s, health_s, ", ".join("%.0f" % f for f in firsts)), flush=True)
    assert health_s < HEALTH_BACK_S, health_s
    return health_s


def case_stream_cut(net, pool, refs):
    """h2 cut while a stream is producing tokens: the stream ends with an error
    event and [DONE] within the proxy's --token-timeout (plus slack)."""
    state = {}

    def on_event(ev, conn):
        if isinstance(ev, dict) and "choices" in ev and "cut" not in state:
            net.link(2, up=False)
            state["cut"] = time.monotonic()
        return True
    body = pool.proxy.completion_body(PROMPTS[0], 4000, 0.0, None, True)
    body["ignore_eos"] = True
    try:
        r = pool.proxy.stream(body, timeout=CUT_BOUND_S + 30, on_event=on_event)
        ended_s = time.monotonic() - state["cut"]
    finally:
        net.link(2, up=True)
    assert "cut" in state, r.events[-3:]
    assert r.errors, ("a stream cut by a link failure ended without an error event",
                      r.events[-3:])
    assert r.done, ("a stream cut by a link failure ended without [DONE]", r.events[-3:])
    assert ended_s <= CUT_BOUND_S, ended_s
    wait_for(lambda: all_healthy(pool), 15, "every instance healthy after the stream cut")
    print("stream cut: %d tokens, then h2's link cut; the stream ended %.2f s later with an "
          "error event (%s) and [DONE]" % (len(r.token_ids), ended_s,
                                            r.errors[0].get("message", "")[:80]), flush=True)


def case_down(net, pool):
    pids = pool.pids()
    p = pool.down()
    assert p.returncode == 0, p.stderr
    for name, (pid, _) in pids.items():
        wait_for(lambda: not os.path.exists("/proc/%d" % pid) or
                 open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] == "Z",
                 5, "%s to stop" % name)
    for i in (1, 2):
        left = [proc for _, _, proc in net.listeners(i) if proc.startswith("kvf-")]
        assert not left, (i, left)
    print("kvf-down: stopped %s on hosts h0, h1, h2" % ", ".join(sorted(pids)), flush=True)


def case_prefill_cut(net, model):
    # prefill-0 on h1, prefill-1 on h3, decode-0 on h2
    pool = MhPool(net, [1, 3, 2], "2p2d", 2, 1, model, "p2",
                  proxy_args=["--health-interval=200ms", "--health-timeout=1s",
                              "--prefill-timeout=3s"])
    pool.start()
    try:
        net.link(1, up=False)

        def marked():
            code, h = pool.proxy.health(timeout=5)
            return not h["prefill"][0]["healthy"] and h["prefill"][1]["healthy"]
        t0 = time.monotonic()
        wait_for(marked, 10, "the proxy to mark the cut-off prefill host unhealthy")
        marked_s = time.monotonic() - t0
        used = set()
        for _ in range(4):
            r = pool.proxy.complete(PROMPTS[0], max_tokens=4, temperature=0)
            used.add(r["prefill_instance"])
        assert used == {"tcp://%s:%d" % (net.addr(3), BASE_PORT + 2)}, used
        net.link(3, up=False)
        wait_for(lambda: pool.proxy.health(timeout=5)[0] == 503, 10,
                 "/health 503 with both prefill hosts cut off")
        try:
            pool.proxy.complete(PROMPTS[0], max_tokens=4, temperature=0)
            raise AssertionError("a request succeeded with no prefill host reachable")
        except HttpError as e:
            assert e.status == 503, e
            msg = e.body["error"]["message"]
            assert "prefill" in msg, msg
        net.link(1, up=True)
        net.link(3, up=True)
        wait_for(lambda: pool.proxy.health(timeout=5)[0] == 200, 15, "prefill hosts back")
        pool.proxy.complete(PROMPTS[0], max_tokens=4, temperature=0)
    finally:
        net.link(1, up=True)
        net.link(3, up=True)
        pool.down()
    print("prefill cut: h1 cut off -> marked unhealthy in %.2f s, 4 requests routed to h3; "
          "h3 cut too -> 503 (%s); both back -> serving again" % (marked_s, msg), flush=True)


def long_reference(net, model, prompt):
    """The colocated reference of @prompt (e2e_models.reference, any length)."""
    return reference(model, prompt, MAX_TOKENS)


def main():
    with TestNet(4) as net:
        from e2e_models import model_dir
        model = model_dir("tiny-hybrid")
        refs = {p: long_reference(net, model, p) for p in PROMPTS + [BENCH_PROMPT]}
        net.start_sshd([1, 2, 3])
        pool = MhPool(net, [1, 2, 2], "4p2d", 1, 2, model, "p1",
                      proxy_args=["--token-timeout=%ds" % TOKEN_TIMEOUT_S])
        pool.start()
        try:
            case_deploy(net, pool, refs)
            case_rate_cap(net, pool, refs)
            case_delay(net, pool, refs)
            case_loss(net, pool, refs)
            case_link_cut(net, pool, refs)
            case_stream_cut(net, pool, refs)
            for cut_s in OUTAGES_S:
                case_outage(net, pool, refs, cut_s)
        except BaseException:
            for name in ("proxy", "prefill-0", "decode-0", "decode-1"):
                print("--- %s.log (tail)\n%s" % (name, pool.log(name)[-1500:]))
            raise
        finally:
            if pool.up:
                case_down(net, pool)
        case_prefill_cut(net, model)
    print("test_mh_pool passed")


if __name__ == "__main__":
    main()
