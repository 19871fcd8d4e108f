#!/usr/bin/env python3
"""NIXL on the same descriptors as kvf bench, GPU memory to GPU memory (the GPU table's NIXL row).

usage: nixl_vram.py DESCS.json [--device 0] [--iters 5] [--timeout 60]

DESCS.json is `kvf bench --descs-out`'s file: the pools of every prefill and decode rank and,
per (decode rank, prefill rank) read, the triples [decode offset, prefill offset, length].
Every rank's pool is one torch allocation on cuda:DEVICE (as `kvf bench --device cuda:N` puts
every rank of both sides on one GPU); prefill pools hold seeded random bytes, decode pools
0xff. One NIXL agent per rank (UCX backend, progress thread: vLLM's NixlConnector
configuration), pools registered as VRAM, metadata handed over in process; each read's two
sides prepared once (prep_xfer_dlist), and per request make_prepped_xfer("READ") +
transfer() for every read of every decode rank (the post time), then check_xfer_state until
all are DONE. A warm-up request precedes the timed ones; the median is reported. After the
last request every destination range must equal its source range (checked on the GPU).
UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y is set unless the environment sets it: kvferry sets the same
for its own UCX, so both run with cuda_ipc GET zero-copy.

Prints `copy: ...`, the GPU's own contiguous copy rate on as many bytes (torch, CUDA events),
then `nixl: ...` with GB/s; exit 0 when verified, 1 on any failure, 77 when torch
or a nixl package (nixl_cu13, nixl_cu12 or nixl) cannot be imported or no GPU is visible.
"""
import argparse
import importlib
import json
import os
import statistics
import sys
import time


def load_nixl():
    for name in ("nixl_cu13", "nixl_cu12", "nixl"):
        try:
            return name, importlib.import_module(name)
        except ImportError:
            continue
    return None, None


def copy_rate(torch, dev, nbytes, iters):
    """The GPU's own copy rate on the request's bytes: one contiguous device-to-device copy
    (bytes counted once), median of @iters after a warm-up; prints the `copy:` line."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ms = []
    for it in range(iters + 1):
        ev[0].record()
        dst.copy_(src)
        ev[1].record()
        ev[1].synchronize()
        if it > 0:
            ms.append(ev[0].elapsed_time(ev[1]))
    med = statistics.median(ms)
    print("copy: device-to-device %d bytes, median %.3f ms, %.1f GB/s (bytes counted once)"
          % (nbytes, med, nbytes / med / 1e6))
    del src, dst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("descs")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()
    if a.iters < 1 or a.iters > 100:
        ap.error("--iters must be 1..100, not %d" % a.iters)
    os.environ.setdefault("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "y")
    try:
        import torch
    except ImportError as e:
        print("nixl: skipped (torch: %s)" % e)
        return 77
    if not torch.cuda.is_available():
        print("nixl: skipped (no GPU visible to torch)")
        return 77
    with open(a.descs) as f:
        d = json.load(f)
    dev = torch.device("cuda", a.device)
    copy_rate(torch, dev, sum(r["bytes"] for r in d["reads"]), a.iters)
    name, nixl = load_nixl()
    if nixl is None:
        print("nixl: skipped (no nixl_cu13, nixl_cu12 or nixl package)")
        return 77
    gen = torch.Generator(device=dev)
    pre, dec = [], []
    for r, n in enumerate(d["prefill_pool_bytes"]):
        gen.manual_seed(1000 + r)
        pre.append(torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev, generator=gen))
    for n in d["decode_pool_bytes"]:
        dec.append(torch.full((n,), 0xff, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize(dev)

    cfg = nixl.nixl_agent_config(backends=["UCX"])
    pagents, pmeta = [], []
    for r, t in enumerate(pre):
        ag = nixl.nixl_agent("prefill%d" % r, cfg)
        ag.register_memory([(t.data_ptr(), t.numel(), a.device, "")], "VRAM")
        pagents.append(ag)
        pmeta.append(ag.get_agent_metadata())
    dagents, preps = [], []
    for r, t in enumerate(dec):
        ag = nixl.nixl_agent("decode%d" % r, cfg)
        ag.register_memory([(t.data_ptr(), t.numel(), a.device, "")], "VRAM")
        names = [ag.add_remote_agent(m) for m in pmeta]
        dagents.append((ag, names))
    nbytes = ndescs = 0
    for rd in d["reads"]:
        ag, names = dagents[rd["decode_rank"]]
        p = rd["prefill_rank"]
        lb, rb = dec[rd["decode_rank"]].data_ptr(), pre[p].data_ptr()
        loc = ag.prep_xfer_dlist("NIXL_INIT_AGENT",
                                 [(lb + x[0], x[2], a.device) for x in rd["descs"]], "VRAM")
        rem = ag.prep_xfer_dlist(names[p], [(rb + x[1], x[2], a.device) for x in rd["descs"]],
                                 "VRAM")
        idx = list(range(len(rd["descs"])))
        preps.append((ag, loc, rem, idx))
        nbytes += rd["bytes"]
        ndescs += len(rd["descs"])

    times, posts = [], []
    for it in range(a.iters + 1):
        t0 = time.perf_counter()
        hs = []
        for ag, loc, rem, idx in preps:
            h = ag.make_prepped_xfer("READ", loc, idx, rem, idx)
            st = ag.transfer(h)
            if st == "ERR":
                print("nixl: FAIL: transfer() returned ERR")
                return 1
            hs.append((ag, h))
        t1 = time.perf_counter()
        deadline = time.monotonic() + a.timeout
        pending = list(hs)
        while pending:
            rest = []
            for ag, h in pending:
                st = ag.check_xfer_state(h)
                if st == "ERR":
                    print("nixl: FAIL: check_xfer_state() returned ERR")
                    return 1
                if st != "DONE":
                    rest.append((ag, h))
            pending = rest
            if pending and time.monotonic() > deadline:
                print("nixl: FAIL: reads not done within %.0f s" % a.timeout)
                return 1
        t2 = time.perf_counter()
        for ag, h in hs:
            ag.release_xfer_handle(h)
        if it > 0:
            times.append(t2 - t0)
            posts.append(t1 - t0)

    bad = 0
    for rd in d["reads"]:
        dst, src = dec[rd["decode_rank"]], pre[rd["prefill_rank"]]
        for x in rd["descs"]:
            if not torch.equal(dst[x[0]:x[0] + x[2]], src[x[1]:x[1] + x[2]]):
                bad += 1
    torch.cuda.synchronize(dev)
    med = statistics.median(times)
    print("nixl: %s %s READ VRAM->VRAM %s, %d reads, %d descriptors, %d bytes, median %.3f ms,"
          " %.1f GB/s, post %.2f us/desc, UCX_CUDA_IPC_ENABLE_GET_ZCOPY=%s, verify %s"
          % (name, getattr(nixl, "__version__", ""), d.get("layout", "?"), len(preps), ndescs,
             nbytes, med * 1e3, nbytes / med / 1e9, statistics.median(posts) * 1e6 / ndescs,
             os.environ["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"],
             "ok" if bad == 0 else "FAILED (%d ranges differ)" % bad))
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
