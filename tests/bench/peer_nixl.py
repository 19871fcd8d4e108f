#!/usr/bin/env python3
"""NIXL runner of the peer benchmark: a request's descriptor lists moved by NIXL's UCX backend.

As vLLM's NixlConnector runs it: one agent per TP rank (default config: UCX
backend, progress thread), pools registered as DRAM, metadata exchanged out of
band (here through the harness) and add_remote_agent + make_connection (the
handshake time); each read's two sides prepared once as prepped descriptor
lists (prep_xfer_dlist, local side NIXL_INIT_AGENT); per request and read,
make_prepped_xfer("READ", ...) + transfer() (post time), then check_xfer_state
until DONE (completion). UCX_TLS from the environment picks the transports.
Prints one JSON line (peer_harness.main). Install: pip install --no-deps nixl-cu12 numpy.

usage: peer_nixl.py DESCS.json [--iters 5] [--timeout 60] [--transport shm|tcp]
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_harness  # noqa: E402

LOC, REM, LEN = peer_harness.LOC, peer_harness.REM, peer_harness.LEN


def _agent(name):
    from nixl_cu12 import nixl_agent, nixl_agent_config
    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def serve(rank, pool):
    agent = _agent("prefill%d" % rank)
    reg = agent.register_memory([(pool.ctypes.data, pool.nbytes, 0, "")], "DRAM")
    return (agent, reg), {"meta": agent.get_agent_metadata(), "base": pool.ctypes.data}


def unserve(state):
    agent, reg = state
    agent.deregister_memory(reg)


def connect(rank, pool, reads, pubs):
    agent = _agent("decode%d" % rank)
    agent.register_memory([(pool.ctypes.data, pool.nbytes, 0, "")], "DRAM")
    t0 = time.monotonic()
    names = {}
    for p, pub in pubs.items():
        names[p] = agent.add_remote_agent(pub["meta"])
        agent.make_connection(names[p])
    handshake_ms = (time.monotonic() - t0) * 1e3
    base = pool.ctypes.data
    prepped = []
    for r in reads:
        p = r["prefill_rank"]
        local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [
            (base + d[LOC], d[LEN], 0) for d in r["descs"]], "DRAM")
        remote = agent.prep_xfer_dlist(names[p], [
            (pubs[p]["base"] + d[REM], d[LEN], 0) for d in r["descs"]], "DRAM")
        prepped.append((local, remote, list(range(len(r["descs"])))))
    return (agent, prepped), handshake_ms


def post(state):
    agent, prepped = state
    handles = []
    for local, remote, idx in prepped:
        h = agent.make_prepped_xfer("READ", local, idx, remote, idx)
        if agent.transfer(h) == "ERR":
            raise RuntimeError("NIXL transfer() returned ERR")
        handles.append(h)
    return handles


def wait(state, handles, deadline):
    agent, _ = state
    pending = list(handles)
    while pending:
        st = agent.check_xfer_state(pending[-1])
        if st == "DONE":
            pending.pop()
        elif st == "ERR":
            raise RuntimeError("NIXL check_xfer_state returned ERR")
        elif time.monotonic() > deadline:
            raise TimeoutError("NIXL READs not done by the deadline")
    for h in handles:
        agent.release_xfer_handle(h)


def missing():
    try:
        import nixl_cu12  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        return "not installed (%s; pip install --no-deps nixl-cu12 numpy)" % e
    return None


if __name__ == "__main__":
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    sys.exit(peer_harness.main("peer_nixl", __doc__, missing))
