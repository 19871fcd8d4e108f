"""Process harness shared by the peer runners (peer_nixl.py, peer_mooncake.py).

One target process per prefill rank and one initiator process per decode rank,
as the daemons run (one process per TP rank on each side). The descriptor file
is kvf bench --descs-out's: pools per rank and, per (decode, prefill) rank pair,
the triples [decode (local) offset, prefill (remote) offset, length].

A backend is a module with four functions, called inside those processes:
  serve(rank, pool)                  -> (state, pub)   register @pool, pub: picklable
                                                        facts an initiator needs
  unserve(state)                                        deregister, stop
  connect(rank, pool, reads, pubs)   -> (state, handshake_ms)
                                                        pubs: {prefill rank: pub}
  post(state)                        -> handles         start every read of the request
  wait(state, handles, deadline)                        return once all are done, raise
                                                        on an error or past deadline
Pools are numpy uint8 arrays: prefill's filled with seeded random bytes, decode's
with 0xff (touched, like kvferry's poisoned pool). A warm-up round precedes the
timed ones; each round starts on a barrier of all initiators and the request's
time is the last initiator's end minus the first one's start (CLOCK_MONOTONIC,
shared across processes). After the last round each initiator's destination
ranges must have the CRC-32 of the source ranges its prefill ranks computed.
"""
import importlib
import json
import multiprocessing as mp
import sys
import time
import zlib

LOC, REM, LEN = 0, 1, 2


def _crc(buf, descs, which):
    crc = 0
    for d in descs:
        crc = zlib.crc32(buf[d[which]:d[which] + d[LEN]], crc)
    return crc


def _target(backend, rank, size, reads, conn):
    try:
        import numpy as np
        be = importlib.import_module(backend)
        pool = np.random.default_rng(1000 + rank).integers(0, 256, size, dtype=np.uint8)
        state, pub = be.serve(rank, pool)
        mv = memoryview(pool)
        conn.send({"pub": pub, "crcs": {i: _crc(mv, r["descs"], REM) for i, r in reads}})
        conn.recv()                      # stop (the parent's wait is bounded)
        be.unserve(state)
        conn.send({"ok": True})
    except Exception as e:               # reported to the parent, never swallowed
        conn.send({"error": "prefill rank %d: %r" % (rank, e)})


def _initiator(backend, rank, size, reads, conn, barrier, iters, timeout):
    try:
        import numpy as np
        be = importlib.import_module(backend)
        pool = np.full(size, 0xff, dtype=np.uint8)
        pubs = conn.recv()
        state, handshake_ms = be.connect(rank, pool, [r for _, r in reads], pubs)
        rounds = []
        for it in range(iters + 1):
            barrier.wait(timeout)
            start = time.monotonic_ns()
            handles = be.post(state)
            posted = time.monotonic_ns()
            be.wait(state, handles, time.monotonic() + timeout)
            done = time.monotonic_ns()
            if it > 0:                   # round 0 warms up (connections, first use)
                rounds.append((start, posted, done))
        mv = memoryview(pool)
        conn.send({"rounds": rounds, "handshake_ms": handshake_ms,
                   "crcs": {i: _crc(mv, r["descs"], LOC) for i, r in reads}})
    except Exception as e:
        conn.send({"error": "decode rank %d: %r" % (rank, e)})


def _recv(conn, proc, timeout, what):
    if not conn.poll(timeout):
        raise TimeoutError("no answer from %s within %.0f s (exit code %s)" % (
            what, timeout, proc.exitcode))
    msg = conn.recv()
    if "error" in msg:
        raise RuntimeError(msg["error"])
    return msg


def run(backend, descs, iters, timeout):
    """Move @descs' reads @iters times (after a warm-up) through @backend (a module name)."""
    ctx = mp.get_context("spawn")        # no UCX/engine state inherited through fork
    reads = list(enumerate(descs["reads"]))
    nd, npf = len(descs["decode_pool_bytes"]), len(descs["prefill_pool_bytes"])
    barrier = ctx.Barrier(nd)
    procs, tconns, iconns = [], {}, {}
    try:
        for p in range(npf):
            a, b = ctx.Pipe()
            mine = [(i, r) for i, r in reads if r["prefill_rank"] == p]
            pr = ctx.Process(target=_target,
                             args=(backend, p, descs["prefill_pool_bytes"][p], mine, b))
            pr.start()
            procs.append(pr)
            tconns[p] = (a, pr)
        for d in range(nd):
            a, b = ctx.Pipe()
            mine = [(i, r) for i, r in reads if r["decode_rank"] == d]
            pr = ctx.Process(target=_initiator, args=(backend, d, descs["decode_pool_bytes"][d],
                                                      mine, b, barrier, iters, timeout))
            pr.start()
            procs.append(pr)
            iconns[d] = (a, pr, mine)
        pub = {p: _recv(c, pr, timeout, "prefill rank %d" % p) for p, (c, pr) in tconns.items()}
        for d, (c, pr, mine) in iconns.items():
            c.send({p: pub[p]["pub"] for p in sorted({r["prefill_rank"] for _, r in mine})})
        res = {d: _recv(c, pr, timeout * (iters + 2), "decode rank %d" % d)
               for d, (c, pr, _) in iconns.items()}
        for p, (c, pr) in tconns.items():
            c.send("stop")
            _recv(c, pr, timeout, "prefill rank %d" % p)
        want = {}
        for p in pub.values():
            want.update(p["crcs"])
        for d, r in res.items():
            for i, crc in r["crcs"].items():
                if crc != want[i]:
                    return {"error": "read %d (decode rank %d): destination bytes differ from "
                            "the source (CRC-32 %08x, source %08x)" % (i, d, crc, want[i])}
        ms, post = [], []
        for k in range(iters):
            start = min(r["rounds"][k][0] for r in res.values())
            ms.append((max(r["rounds"][k][2] for r in res.values()) - start) / 1e6)
            post.append(max(r["rounds"][k][1] - r["rounds"][k][0] for r in res.values()) / 1e6)
        return {"ms": ms, "post_ms": post, "verified": True,
                "handshake_ms": max(r["handshake_ms"] for r in res.values()),
                "descriptors": sum(len(r["descs"]) for _, r in reads),
                "bytes": sum(r["bytes"] for _, r in reads)}
    finally:
        for pr in procs:
            pr.join(timeout=5)
            if pr.is_alive():
                pr.kill()
                pr.join()


def main(backend, doc, missing, extra=None):
    """Command line of a runner: DESCS.json [--iters N] [--timeout S] [--transport shm|tcp].

    @missing() returns None when the backend can run, else the reason (printed as "skipped");
    @extra(transport) may return a reason the transport cannot run (printed as "skipped")."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("descs")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--transport", default="shm", choices=("shm", "tcp"))
    args = ap.parse_args()
    why = missing() or (extra(args.transport) if extra else None)
    if why:
        print(json.dumps({"skipped": why}))
        return 0
    with open(args.descs) as f:
        descs = json.load(f)
    try:
        out = run(backend, descs, args.iters, args.timeout)
    except Exception as e:
        out = {"error": repr(e)}
    print(json.dumps(out))
    sys.stdout.flush()
    return 0 if "error" not in out else 1
