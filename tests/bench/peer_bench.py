#!/usr/bin/env python3
"""Peer benchmark: one KV pull's descriptor lists, executed by each contender in one run.

kvf bench pulls a request through the KV connector the daemons use and writes
the request's exact descriptor lists (offsets, lengths, rank pairs) to a file;
the same bytes are then moved by the other contenders, over shared memory
(UCX's default transports) and over TCP loopback (UCX_TLS=tcp,self):

  kvferry      kvf bench: the connector's start_pull/poll, one thread per decode rank
  copy limit   memcpy of the same descriptor lists, one thread per decode rank
  ucx_perftest raw ucp_get of the same bytes per rank pair as one message (ucx-utils)
  nixl         NIXL (nixl-cu12): reported as skipped when not installed; the
               prepped-READ runner is not written yet, so when installed it says so
  mooncake     Mooncake Transfer Engine: likewise

One table: GB/s, ratio to the copy limit, kvferry's ratio to each contender,
descriptors, plan+post time and completion time; --json prints it as JSON.

usage: peer_bench.py [--model CFG] [--layout 4p2d] [--tokens 8192] [--iters 5]
                     [--transports shm,tcp] [--json] [--quick]
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SRC = os.environ.get("KVF_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
KVF = os.path.join(os.environ.get("KVF_BIN", os.path.join(SRC, "build", "bin")), "kvf")
TLS = {"shm": None, "tcp": "tcp,self"}


def env_for(tls):
    env = dict(os.environ)
    env.setdefault("KVF_LOG_LEVEL", "error")
    if tls is not None:
        env["UCX_TLS"] = tls
    return env


def grab(pattern, text, conv=float):
    m = re.search(pattern, text, re.M)
    return conv(m.group(1)) if m else None


def run_kvf(args, transport, descs_file):
    cmd = [KVF, "bench", "--model", args.model, "--layout", args.layout, "--tokens",
           str(args.tokens), "--iters", str(args.iters), "--descs-out", descs_file]
    r = subprocess.run(cmd, env=env_for(TLS[transport]), capture_output=True, text=True,
                       timeout=600)
    out = r.stdout
    if r.returncode != 0:
        raise RuntimeError("kvf bench failed (%s):\n%s\n%s" % (transport, out, r.stderr))
    return {
        "bytes": grab(r"^transfer: (\d+) bytes", out, int),
        "descriptors": grab(r"^transfer: \d+ bytes, (\d+) descriptors", out, int),
        "kv_ms": grab(r"^transfer time: ([\d.]+) ms", out),
        "post_ms": grab(r"^plan\+post time: ([\d.]+) ms", out),
        "handshake_ms": grab(r"^handshake: ([\d.]+) ms", out),
        "raw_ms": grab(r"^raw contiguous GET: \d+ bytes in ([\d.]+) ms", out),
        "copy_ms": grab(r"^copy limit .*?: ([\d.]+) ms", out),
        "transports": grab(r"^transports: (.*)$", out, str),
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """True once something listens on TCP @port (read from /proc, no connection made)."""
    want = ":%04X" % port
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                for line in f.readlines()[1:]:
                    cols = line.split()
                    if cols[1].endswith(want) and cols[3] == "0A":
                        return True
        except OSError:
            pass
    return False


def run_perftest(transport, msg_bytes, iters):
    """One ucp_get stream of msg_bytes messages between two ucx_perftest processes."""
    exe = shutil.which("ucx_perftest")
    if exe is None:
        return None, "skipped: ucx_perftest not installed (apt-get install ucx-utils)"
    port = free_port()
    env = env_for(TLS[transport])
    server = subprocess.Popen([exe, "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not listening(port) and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.02)   # bounded: the server binds its port once UCX is up
        r = subprocess.run([exe, "127.0.0.1", "-p", str(port), "-t", "ucp_get", "-s",
                            str(msg_bytes), "-n", str(iters)], env=env, capture_output=True,
                           text=True, timeout=300)
        m = re.search(r"^Final:(.*)$", r.stdout, re.M)
        if not m:
            return None, "failed: %s" % (r.stdout + r.stderr)[-300:]
        cols = m.group(1).split()   # iters, latency 50%/avg/overall, bandwidth avg/overall, ...
        mbs = float(cols[5])                         # bandwidth overall, MiB/s
        if mbs <= 0:
            return None, "failed: no bandwidth in %s" % m.group(0)
        return msg_bytes / (mbs * 1048576.0) * 1000.0, None   # ms per message
    finally:
        server.kill()
        server.wait()


def peer_status(module):
    try:
        __import__(module)
    except Exception:
        return "skipped: not installed"
    return "installed, but this benchmark has no runner for it yet"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(SRC, "tests", "data", "models",
                                                    "nemotron-nano-9b-v2.config.json"))
    ap.add_argument("--layout", default="4p2d")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="small smoke run (test suite)")
    args = ap.parse_args()
    if args.quick:
        args.layout, args.tokens, args.iters = "2p1d", 1024, 2

    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for transport in args.transports.split(","):
            dfile = os.path.join(tmp, "descs-%s.json" % transport)
            k = run_kvf(args, transport, dfile)
            with open(dfile) as f:
                descs = json.load(f)
            nbytes = sum(r["bytes"] for r in descs["reads"])
            ndescs = sum(len(r["descs"]) for r in descs["reads"])
            assert nbytes == k["bytes"] and ndescs == k["descriptors"], \
                "descriptor file disagrees with kvf bench: %d/%d bytes, %d/%d descs" % (
                    nbytes, k["bytes"], ndescs, k["descriptors"])
            gbs = lambda ms: nbytes / (ms * 1e6) if ms else None   # noqa: E731
            copy_gbs = gbs(k["copy_ms"])
            run = []
            run.append({"contender": "kvferry", "transport": transport, "gbs": gbs(k["kv_ms"]),
                        "descriptors": ndescs, "post_ms": k["post_ms"],
                        "complete_ms": k["kv_ms"], "handshake_ms": k["handshake_ms"],
                        "ucx": k["transports"]})
            run.append({"contender": "copy limit", "transport": "memcpy", "gbs": copy_gbs,
                        "descriptors": ndescs, "post_ms": None, "complete_ms": k["copy_ms"]})
            # the same bytes per rank pair as one message, rank pairs one after another
            per_read = max(r["bytes"] for r in descs["reads"])
            ms, why = run_perftest(transport, per_read, max(args.iters, 3))
            if ms is None:
                notes.append("ucx_perftest/%s: %s" % (transport, why))
            else:
                total = ms * len(descs["reads"])
                run.append({"contender": "ucx_perftest", "transport": transport,
                            "gbs": gbs(total), "descriptors": len(descs["reads"]),
                            "post_ms": None, "complete_ms": total})
            for name, module in (("nixl", "nixl"), ("mooncake", "mooncake")):
                notes.append("%s/%s: %s" % (name, transport, peer_status(module)))
            kv = run[0]["gbs"]
            for r in run:
                r["run"] = transport
                r["ratio_copy"] = (r["gbs"] / copy_gbs) if (r["gbs"] and copy_gbs) else None
                r["kvferry_ratio"] = (kv / r["gbs"]) if (kv and r["gbs"]) else None
            rows += run

    result = {"model": os.path.basename(args.model), "layout": args.layout,
              "tokens": args.tokens, "bytes": nbytes, "rows": rows, "notes": notes}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print("peer benchmark: %s %s, %d tokens, %d bytes per request" %
              (result["model"], args.layout, args.tokens, nbytes))
        print("%-5s %-13s %-9s %8s %9s %10s %6s %9s %11s" % ("run", "contender", "transport", "GB/s",
              "vs copy", "kvf/this", "descs", "post ms", "complete ms"))
        f = lambda v, fmt: (fmt % v) if v is not None else "-"   # noqa: E731
        for r in rows:
            print("%-5s %-13s %-9s %8s %9s %10s %6d %9s %11s" % (
                r["run"], r["contender"], r["transport"], f(r["gbs"], "%.2f"),
                f(r.get("ratio_copy"), "%.3f"), f(r.get("kvferry_ratio"), "%.3f"),
                r["descriptors"], f(r["post_ms"], "%.3f"), f(r["complete_ms"], "%.2f")))
        for r in rows:
            if r["contender"] == "kvferry":
                print("kvferry/%s: handshake %.2f ms; %s" % (r["transport"], r["handshake_ms"],
                                                            r["ucx"]))
        for n in notes:
            print(n)
    ok = all(r["gbs"] and r["gbs"] > 0 for r in rows if r["contender"] == "kvferry")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
