#!/usr/bin/env python3
"""Peer benchmark: one KV pull's descriptor lists, executed by each contender in one run.

kvf bench pulls a request through the KV connector the daemons use and writes
the request's exact descriptor lists (offsets, lengths, rank pairs) to a file;
the same bytes are then moved by the other contenders, over shared memory
(UCX's default transports) and over TCP loopback (UCX_TLS=tcp,self):

  kvferry      kvf bench: the connector's start_pull/poll, one thread per decode rank,
               pools the connector allocates as the daemons do (--pool-alloc ucx:
               UCX-mapped shared memory, read by a plain copy)
  kvferry heap-pool  the same with malloc'd pools registered with UCX (the daemons'
               --pool-alloc heap; --heap-pool no skips it)
  copy limit   memcpy of the same descriptor lists, one thread per decode rank
  ucx_perftest raw ucp_get of the same bytes per rank pair as one message (ucx-utils)
  nixl         NIXL (nixl-cu12) UCX backend, as vLLM's NixlConnector runs it: one
               initiator agent per decode rank, prepped descriptor lists, READ
               (peer_nixl.py; pip install --no-deps nixl-cu12 numpy)
  mooncake     Mooncake Transfer Engine's batch transfer API (peer_mooncake.py;
               pip install mooncake-transfer-engine-non-cuda)

A peer that is not installed or cannot run here gets a row with the reason,
never a figure. Every contender runs once per round, rounds interleave
(--rounds, default 3) and the table shows medians (each contender's own figure
is the median of its --iters timed pulls after a warm-up pull). Peer runners
verify the bytes they moved (CRC-32 of source against destination ranges).

One table: GB/s, ratio to the copy limit, kvferry's ratio to each contender,
descriptors, plan+post time, completion time and handshake; --json prints it.

usage: peer_bench.py [--model CFG] [--layout 4p2d] [--tokens 8192] [--iters 5]
                     [--rounds 3] [--transports shm,tcp] [--peers nixl,mooncake]
                     [--json] [--quick]
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


def run_kvf(args, transport, descs_file, pool_alloc="ucx"):
    cmd = [KVF, "bench", "--model", args.model, "--layout", args.layout, "--tokens",
           str(args.tokens), "--iters", str(args.iters), "--pool-alloc", pool_alloc]
    cmd += ["--descs-out", descs_file] if descs_file else ["--copy-limit", "no"]
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


def run_peer(script, transport, dfile, iters):
    """A peer runner (peer_nixl.py, peer_mooncake.py) on the descriptor file: its JSON answer."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
    try:
        r = subprocess.run([sys.executable, path, dfile, "--iters", str(iters), "--transport",
                            transport], env=env_for(TLS[transport]), capture_output=True,
                           text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": "%s did not finish within 900 s" % script}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": "%s exited %d without an answer: %s" % (
            script, r.returncode, (r.stdout + r.stderr).strip()[-300:])}
    return json.loads(lines[-1])


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def one_round(args, transport, dfile):
    """Every contender once on @transport, interleaved: (descriptor lists, {contender: measures
    or a reason})."""
    out = {}
    k = run_kvf(args, transport, dfile)   # writes dfile: the lists everyone else executes
    with open(dfile) as f:
        descs = json.load(f)
    nbytes = sum(r["bytes"] for r in descs["reads"])
    ndescs = sum(len(r["descs"]) for r in descs["reads"])
    if nbytes != k["bytes"] or ndescs != k["descriptors"]:
        raise RuntimeError("descriptor file disagrees with kvf bench: %d/%d bytes, %d/%d descs"
                           % (nbytes, k["bytes"], ndescs, k["descriptors"]))
    out["kvferry"] = {"ms": k["kv_ms"], "post_ms": k["post_ms"],
                      "handshake_ms": k["handshake_ms"], "ucx": k["transports"]}
    out["copy limit"] = {"ms": k["copy_ms"]}
    if args.heap_pool:
        u = run_kvf(args, transport, None, "heap")
        out["kvferry heap-pool"] = {"ms": u["kv_ms"], "post_ms": u["post_ms"],
                                   "handshake_ms": u["handshake_ms"], "ucx": u["transports"]}
    per_read = max(r["bytes"] for r in descs["reads"])
    ms, why = run_perftest(transport, per_read, max(args.iters, 3))
    # the same bytes per rank pair as one message, rank pairs one after another
    out["ucx_perftest"] = {"ms": ms * len(descs["reads"])} if ms is not None else {"reason": why}
    for name, script in PEERS:
        if name not in args.peers:
            continue
        r = run_peer(script, transport, dfile, args.iters)
        if "skipped" in r or "error" in r:
            out[name] = {"reason": ("skipped: " + r["skipped"]) if "skipped" in r else
                         ("failed: " + r["error"])}
        else:
            out[name] = {"ms": median(r["ms"]), "post_ms": median(r["post_ms"]),
                         "handshake_ms": r.get("handshake_ms"), "ucx": r.get("note")}
    return descs, out


PEERS = (("nixl", "peer_nixl.py"), ("mooncake", "peer_mooncake.py"))
ORDER = ("kvferry", "kvferry heap-pool", "copy limit", "ucx_perftest", "nixl", "mooncake")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(SRC, "tests", "data", "models",
                                                    "nemotron-nano-9b-v2.config.json"))
    ap.add_argument("--layout", default="4p2d")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds of every contender; medians are reported")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--peers", default="nixl,mooncake")
    ap.add_argument("--heap-pool", default="yes", choices=("yes", "no"),
                    help="also run kvferry with malloc'd pools (kvf bench --pool-alloc heap, "
                         "the daemons' --pool-alloc heap)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (test suite): tiny-hybrid 2p1d, 1024 tokens, one round")
    args = ap.parse_args()
    if args.quick:
        args.model = os.path.join(SRC, "tests", "data", "models", "tiny-hybrid.config.json")
        args.layout, args.tokens, args.iters, args.rounds = "2p1d", 1024, 2, 1
    args.heap_pool = args.heap_pool == "yes"
    for t in args.transports.split(","):
        if t not in TLS:
            ap.error("--transports: unknown transport %r (shm, tcp)" % t)
    args.peers = [p for p in args.peers.split(",") if p]
    for p in args.peers:
        if p not in dict(PEERS):
            ap.error("--peers: unknown peer %r (nixl, mooncake)" % p)

    rows = []
    nbytes = None
    with tempfile.TemporaryDirectory() as tmp:
        for transport in args.transports.split(","):
            dfile = os.path.join(tmp, "descs-%s.json" % transport)
            rounds = []
            for _ in range(args.rounds):
                descs, out = one_round(args, transport, dfile)
                rounds.append(out)
            nbytes = sum(r["bytes"] for r in descs["reads"])
            ndescs = sum(len(r["descs"]) for r in descs["reads"])
            nreads = len(descs["reads"])
            gbs = lambda ms: nbytes / (ms * 1e6) if ms else None   # noqa: E731
            med = {}
            for name in ORDER:
                got = [r[name] for r in rounds if name in r]
                if not got:
                    continue
                timed = [g for g in got if "ms" in g and g["ms"]]
                if not timed:
                    med[name] = {"reason": got[0].get("reason", "no figure")}
                    continue
                med[name] = {f: median([g.get(f) for g in timed])
                             for f in ("ms", "post_ms", "handshake_ms")}
                med[name]["runs"] = [g["ms"] for g in timed]
                med[name]["ucx"] = timed[0].get("ucx")
            kv = gbs(med["kvferry"]["ms"])
            copy_gbs = gbs(med["copy limit"]["ms"]) if "ms" in med["copy limit"] else None
            for name in ORDER:
                if name not in med:
                    continue
                m = med[name]
                row = {"run": transport, "contender": name,
                       "transport": "memcpy" if name == "copy limit" else transport,
                       "descriptors": nreads if name == "ucx_perftest" else ndescs}
                if "reason" in m:
                    row["reason"] = m["reason"]
                else:
                    g = gbs(m["ms"])
                    row.update({"gbs": g, "complete_ms": m["ms"], "post_ms": m["post_ms"],
                                "handshake_ms": m["handshake_ms"], "ucx": m["ucx"],
                                "runs_ms": m["runs"],
                                "ratio_copy": (g / copy_gbs) if copy_gbs else None,
                                "kvferry_ratio": (kv / g) if kv else None})
                rows.append(row)

    result = {"model": os.path.basename(args.model), "layout": args.layout,
              "tokens": args.tokens, "bytes": nbytes, "rounds": args.rounds,
              "iters": args.iters, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print("peer benchmark: %s %s, %d tokens, %d bytes per request; medians of %d "
              "interleaved rounds x %d iterations" % (result["model"], args.layout, args.tokens,
                                                      nbytes, args.rounds, args.iters))
        print("%-4s %-16s %-9s %7s %8s %9s %6s %8s %11s %9s" % (
            "run", "contender", "transport", "GB/s", "vs copy", "kvf/this", "descs", "post ms",
            "complete ms", "hshake ms"))
        f = lambda v, fmt: (fmt % v) if v is not None else "-"   # noqa: E731
        for r in rows:
            if "reason" in r:
                print("%-4s %-16s %-9s %s" % (r["run"], r["contender"], r["transport"],
                                              r["reason"]))
                continue
            print("%-4s %-16s %-9s %7s %8s %9s %6d %8s %11s %9s" % (
                r["run"], r["contender"], r["transport"], f(r["gbs"], "%.2f"),
                f(r.get("ratio_copy"), "%.3f"), f(r.get("kvferry_ratio"), "%.3f"),
                r["descriptors"], f(r["post_ms"], "%.3f"), f(r["complete_ms"], "%.2f"),
                f(r["handshake_ms"], "%.2f")))
        for r in rows:
            if r["contender"].startswith("kvferry") and "reason" not in r:
                print("%s/%s: %s; per-round ms %s" % (
                    r["contender"], r["run"], r["ucx"],
                    ", ".join("%.1f" % x for x in r["runs_ms"])))
    ok = all(r.get("gbs") for r in rows if r["contender"].startswith("kvferry")) and \
        not any(r.get("reason", "").startswith("failed") for r in rows
                if r["contender"] in dict(PEERS))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
