"""kvf-proxy's event-driven HTTP edge under many connections (fake daemons behind it).

1. 2000 concurrent streaming clients from one address with --max-connections 1000:
   every client is either served (a complete stream ending with [DONE], the
   expected text) or refused with a JSON 503 naming --max-connections, and
   some of each; the refusals come at once (latency printed, bounded loosely).
   Before that, with 1000 idle connections holding every slot, 20 requests are
   refused with 503 (median and max latency printed).
2. The same 2000 under the default cap (4096): every one served.
3. 1000 idle connections (connected, sending nothing) beside a normal request:
   the request is answered in under 1 s.
Prints the proxy's RSS and CPU time after each part. The per-client cap is off
by default, so one address may hold all of them.

The test raises its own open-file limit (the children inherit it; the proxy
also raises its own to fit --max-connections)."""

import asyncio
import json
import os
import resource
import socket
import time

import proxy_testlib as T
from kvf_e2e import free_port_range

CLIENTS = 2000
IDLE = 1000
MAX_TOKENS = 4
PROMPT = "abcdefgh"


def raise_nofile(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def proc_figures(pid):
    """(RSS MiB, peak RSS MiB, CPU seconds) of process @pid."""
    rss = hwm = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, hwm, cpu


def dechunk(body):
    """The payload of a chunked HTTP body (an SSE event may span chunks)."""
    out, i = b"", 0
    while True:
        j = body.find(b"\r\n", i)
        if j < 0:
            return out
        n = int(body[i:j].split(b";")[0] or b"0", 16)
        if n == 0:
            return out
        out += body[j + 2:j + 2 + n]
        i = j + 2 + n + 2


async def one_stream(port, sem_start):
    """One streaming completion: ('ok', text, latency) / ('503', msg, latency) / ('bad', why, t)."""
    body = json.dumps({"model": "m", "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                       "stream": True}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    await sem_start.wait()
    t0 = time.monotonic()
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
    except (OSError, asyncio.TimeoutError) as e:
        return "bad", "connect: %r" % e, time.monotonic() - t0
    try:
        w.write(req)
        await w.drain()
        data = b""
        while True:
            chunk = await asyncio.wait_for(r.read(65536), 60)
            if not chunk:
                break
            data += chunk
            if b"data: [DONE]" in data:
                break
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep and not head.startswith(b"HTTP/1.1 200"):
                hdrs = head.decode("latin-1").lower()
                n = int(hdrs.split("content-length:")[1].split("\r\n")[0]) \
                    if "content-length:" in hdrs else None
                if n is not None and len(rest) >= n:
                    break
        dt = time.monotonic() - t0
    except (OSError, asyncio.TimeoutError) as e:
        return "bad", "read: %r" % e, time.monotonic() - t0
    finally:
        w.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    if head.startswith(b"HTTP/1.1 200"):
        text = ""
        rest = dechunk(rest) if b"transfer-encoding: chunked" in head.lower() else rest
        for line in rest.split(b"\n"):
            line = line.strip()
            if line.startswith(b"data: {"):
                ev = json.loads(line[6:])
                if "error" in ev:
                    return "bad", "error event: %s" % ev, dt
                text += ev["choices"][0]["text"]
        if b"data: [DONE]" in rest and text == PROMPT[:MAX_TOKENS]:
            return "ok", text, dt
        return "bad", "stream text %r, ending %r" % (text, rest[-60:]), dt
    if head.startswith(b"HTTP/1.1 503"):
        try:
            msg = json.loads(rest)["error"]["message"]
        except ValueError:
            return "bad", "503 without JSON %r" % rest[:200], dt
        return "503", msg, dt
    return "bad", "answer %r" % data[:200], dt


async def many_streams(port, n):
    go = asyncio.Event()
    tasks = [asyncio.ensure_future(one_stream(port, go)) for _ in range(n)]
    await asyncio.sleep(0)
    t0 = time.monotonic()
    go.set()
    res = await asyncio.gather(*tasks)
    return res, time.monotonic() - t0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] if xs else float("nan")


def part_streams(port, pid, cap):
    res, wall = asyncio.run(many_streams(port, CLIENTS))
    ok = [r for r in res if r[0] == "ok"]
    busy = [r for r in res if r[0] == "503"]
    bad = [r for r in res if r[0] == "bad"]
    rss, hwm, cpu = proc_figures(pid)
    print("%d clients, cap %s: %d served, %d x 503, %d other in %.1f s; served latency "
          "p50 %.2f s p99 %.2f s; 503 latency p50 %.3f s max %.3f s; proxy RSS %.1f MiB "
          "(peak %.1f), CPU %.2f s so far"
          % (CLIENTS, cap, len(ok), len(busy), len(bad), wall, pct([r[2] for r in ok], 50),
             pct([r[2] for r in ok], 99), pct([r[2] for r in busy], 50),
             max([r[2] for r in busy] or [0]), rss, hwm, cpu))
    T.check(not bad, "every client served or refused with 503 (cap %s)" % cap,
            "\n".join(r[1] for r in bad[:5]))
    return ok, busy


def idle_beside_request(port, pid):
    idle = []
    for _ in range(IDLE):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.connect(("127.0.0.1", port))
        idle.append(s)
    try:
        t0 = time.monotonic()
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        # one token: prefill's, then decode's final reply at once (no fake token delay)
        body = json.dumps({"model": "m", "prompt": PROMPT, "max_tokens": 1}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        dt = time.monotonic() - t0
        s.close()
        rss, hwm, cpu = proc_figures(pid)
        print("%d idle connections open: a request answered in %.3f s; proxy RSS %.1f MiB "
              "(peak %.1f), CPU %.2f s so far" % (IDLE, dt, rss, hwm, cpu))
        T.check(data.startswith(b"HTTP/1.1 200") and json.loads(data.partition(b"\r\n\r\n")[2])
                ["choices"][0]["text"] == PROMPT[:1], "the request beside them is served",
                data[:300])
        T.check(dt < 1.0, "answered in under 1 s beside %d idle connections (%.3f s)"
                % (IDLE, dt))
    finally:
        for s in idle:
            s.close()


def post_status(port, timeout=10):
    """Status of one non-streaming completion on a fresh connection."""
    body = json.dumps({"model": "m", "prompt": PROMPT, "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split()[1]) if data.startswith(b"HTTP/1.") else 0


def refusal_latency(port, cap):
    """With @cap idle connections holding every slot, a request is refused at once."""
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(cap)]
    try:
        lat, deadline = [], time.monotonic() + 10
        while len(lat) < 20 and time.monotonic() < deadline:
            t0 = time.monotonic()
            if post_status(port) == 503:   # the last idle ones may still be registering
                lat.append(time.monotonic() - t0)
        print("cap full (%d idle): 503 in %.1f ms median, %.1f ms max (%d requests)"
              % (cap, 1000 * pct(lat, 50), 1000 * max(lat or [0]), len(lat)))
        T.check(len(lat) == 20 and max(lat) < 1.0, "at the cap a request gets its 503 at once")
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while post_status(port) != 200 and time.monotonic() < deadline:
        time.sleep(0.05)


def run(a, procs):
    nofile = raise_nofile(3 * CLIENTS + 1000)
    print("open-file limit %d" % nofile)
    base = free_port_range(2)
    T.start_fake(procs, a.testbin, "prefill", "prefill-0", base)
    T.start_fake(procs, a.testbin, "decode", "decode-0", base + 1,
                 ["--fake-token-delay-ms", "500", "--fake-first-decode-delay-ms", "0"])
    pf, pd = "tcp://127.0.0.1:%d" % base, "tcp://127.0.0.1:%d" % (base + 1)
    # the instances' outstanding bound (load admission) above the client count: this test is
    # about the HTTP edge, whose caps are the connection caps
    common = ["--model-name", "m", "--header-timeout", "30s", "--request-timeout", "120s",
              "--max-outstanding", "4096"]

    p, px = T.start_proxy(procs, a.fakebin, pf, pd, common + ["--max-connections", "1000"],
                          name="proxy-cap")
    px.wait_healthy(timeout=10)
    refusal_latency(px.port, 1000)
    ok, busy = part_streams(px.port, p.pid, 1000)
    T.check(ok and busy and all("--max-connections" in r[1] for r in busy),
            "cap 1000: some served (%d), the rest a JSON 503 naming --max-connections (%d)"
            % (len(ok), len(busy)))
    T.check(max(r[2] for r in busy) < 10.0, "the 503s come at once (max %.2f s)"
            % max(r[2] for r in busy))
    procs.stop(p)

    p, px = T.start_proxy(procs, a.fakebin, pf, pd, common, name="proxy")
    px.wait_healthy(timeout=10)
    ok, busy = part_streams(px.port, p.pid, "default")
    T.check(len(ok) == CLIENTS, "default cap: all %d streams served" % CLIENTS)
    idle_beside_request(px.port, p.pid)


def main():
    T.run_with_procs(lambda a, procs, tmp: run(a, procs))


if __name__ == "__main__":
    main()
