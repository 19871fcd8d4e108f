#!/usr/bin/env python3
"""Mooncake runner of the peer benchmark: a request's descriptor lists moved by Mooncake's
Transfer Engine batch transfer API.

As SGLang's and vLLM's Mooncake connectors run it: one TransferEngine per TP
rank, initialized peer to peer (metadata "P2PHANDSHAKE", no metadata server),
pools registered with register_memory; per request and read, one
batch_transfer_async_read(session, local addrs, remote addrs, lengths) (post
time), then get_batch_transfer_status over the batch ids (completion). The
handshake time is the first tiny read towards each prefill rank (the P2P
handshake happens on first use). Transport: "tcp". This wheel
(mooncake-transfer-engine-non-cuda) has no shared-memory transport: it holds TCP
and RDMA only, and any other protocol name falls back to TCP; so over "shm" the
runner reports skipped with that reason instead of a TCP figure under another name.
Prints one JSON line (peer_harness.main). Install: pip install
mooncake-transfer-engine-non-cuda numpy.

usage: peer_mooncake.py DESCS.json [--iters 5] [--timeout 60] [--transport shm|tcp]
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_harness  # noqa: E402

LOC, REM, LEN = peer_harness.LOC, peer_harness.REM, peer_harness.LEN
HOST = "127.0.0.1"


def _engine():
    from mooncake.engine import TransferEngine
    e = TransferEngine()
    rc = e.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError("TransferEngine.initialize returned %d" % rc)
    return e


def _register(e, pool):
    rc = e.register_memory(pool.ctypes.data, pool.nbytes)
    if rc != 0:
        raise RuntimeError("register_memory returned %d" % rc)


def serve(rank, pool):
    e = _engine()
    _register(e, pool)
    return (e, pool), {"session": "%s:%d" % (HOST, e.get_rpc_port()), "base": pool.ctypes.data}


def unserve(state):
    e, pool = state
    e.unregister_memory(pool.ctypes.data)


def connect(rank, pool, reads, pubs):
    e = _engine()
    _register(e, pool)
    base = pool.ctypes.data
    t0 = time.monotonic()
    for p, pub in pubs.items():      # the P2P handshake happens on a session's first transfer
        rc = e.transfer_sync_read(pub["session"], base, pub["base"], 64)
        if rc != 0:
            raise RuntimeError("first read towards prefill rank %d returned %d" % (p, rc))
    handshake_ms = (time.monotonic() - t0) * 1e3
    batches = []
    for r in reads:
        pub = pubs[r["prefill_rank"]]
        batches.append((pub["session"], [base + d[LOC] for d in r["descs"]],
                        [pub["base"] + d[REM] for d in r["descs"]], [d[LEN] for d in r["descs"]]))
    return (e, batches), handshake_ms


def post(state):
    e, batches = state
    ids = []
    for session, loc, rem, lens in batches:
        bid = e.batch_transfer_async_read(session, loc, rem, lens)
        if bid == 0:
            raise RuntimeError("batch_transfer_async_read failed towards %s" % session)
        ids.append(bid)
    return ids


def wait(state, handles, deadline):
    e, _ = state
    rc = e.get_batch_transfer_status(handles)    # blocks until the batches end
    if rc != 0:
        raise RuntimeError("get_batch_transfer_status returned %d" % rc)
    if time.monotonic() > deadline:
        raise TimeoutError("Mooncake batch reads finished past the deadline")


def missing():
    try:
        import mooncake.engine  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        return "not installed (%s; pip install mooncake-transfer-engine-non-cuda numpy)" % e
    return None


def no_shm(transport):
    if transport == "shm":
        return ("no shared-memory transport in this Mooncake wheel (TCP and RDMA only; "
                "other protocol names fall back to TCP, no RDMA device here): see its tcp row")
    return None


if __name__ == "__main__":
    os.environ.setdefault("GLOG_minloglevel", "2")   # the engine's info/warning lines
    sys.exit(peer_harness.main("peer_mooncake", __doc__, missing, no_shm))
