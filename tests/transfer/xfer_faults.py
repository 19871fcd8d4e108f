#!/usr/bin/env python3
"""Refusal and robustness cases of kvf xfer-test over loopback UCX.

Refusals: the decode side must print exactly
  handshake refused: <field> prefill=<v> decode=<v>: <why>
exit 1, and post no RDMA operation. Expected values are derived here by
hand from tiny-hybrid's config (see region_length below), not taken from
program output.

Robustness: the prefill is killed after the first batch; decode must report
a peer error within 2 s of the kill and exit 1 without hanging (UCX-mapped
pools over shared memory: the pull ends from decode's own mapping, and
xfer-test fails on the killed prefill, again without hanging; the same on
UCX 1.13 and 1.22: docs/FAILURES.md §10).

usage: xfer_faults.py [--tls TLS] [--ucx-version X.Y.Z]
"""
import argparse
import os
import re
import subprocess
import sys
import time

FAULT_FINGERPRINT_XOR = 0x5A5A5A5A00000001   # what --fault-fingerprint flips


def run(kvf, env, args, timeout=30):
    t0 = time.monotonic()
    r = subprocess.run([kvf, "xfer-test"] + args, env=env, capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout, r.stderr, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tls", default="default")
    ap.add_argument("--ucx-version", default="?",
                    help="the UCX the binary was built against (CMake passes UCX_VERSION)")
    args = ap.parse_args()
    src = os.environ.get("KVF_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    kvf = os.path.join(os.environ.get("KVF_BIN", os.path.join(src, "build", "bin")), "kvf")
    env = dict(os.environ)
    if args.tls != "default":
        env["UCX_TLS"] = args.tls
    env.setdefault("KVF_LOG_LEVEL", "error")
    model = os.path.join(src, "tests", "data", "models", "tiny-hybrid.config.json")
    base = ["--model", model, "--layout", "2p1d", "--tokens", "200", "--timeout", "5s"]

    # tiny-hybrid at prefill TP2: 1 KV head of head_dim 32 per rank, bf16:
    # A1 = 2 * 1 * 32 * 2 = 128 B/token; TP-stable block 80 -> page 10240 B.
    # Pattern "M*M-M*M-": 2 attention + 4 Mamba layers -> slots 2, one attention
    # group and two Mamba groups. Blocks: ceil(200/80) = 3 + 2 Mamba + 3 spare = 8.
    # Region = 8 * 2 * 10240 = 163840; the fault advertises one page more.
    page = 80 * 2 * 1 * 32 * 2
    region = 8 * 2 * page
    cases = [
        ("kv dtype", ["--prefill-kv-dtype", "fp16"],
         r"handshake refused: kv_dtype prefill=fp16 decode=bf16: \S"),
        ("ssm dtype", ["--prefill-ssm-dtype", "bf16"],
         r"handshake refused: ssm_dtype prefill=bf16 decode=fp32: \S"),
        ("conv dtype", ["--conv-dtype", "fp32", "--prefill-conv-dtype", "bf16"],
         r"handshake refused: conv_dtype prefill=bf16 decode=fp32: \S"),
        ("protocol version", ["--fault-version", "7"],
         r"handshake refused: protocol_version prefill=7 decode=\d+: protocol versions differ"),
        ("region length", ["--fault-region-len"],
         r"handshake refused: region_length prefill=%d decode=%d: \S" % (region + page, region)),
        ("fingerprint", ["--fault-fingerprint"],
         r"handshake refused: model_fingerprint prefill=([0-9a-f]{16}) decode=([0-9a-f]{16}): \S"),
        ("block id out of range", ["--fault-block-id"],
         r"xfer-test: transfer refused: block id 8 of group 0 is out of range \[0, 8\)"),
    ]
    failed = 0
    for name, extra, pattern in cases:
        rc, out, err, _ = run(kvf, env, base + extra)
        m = re.search(r"^" + pattern, out, re.M)
        ok = (rc == 1) and m is not None and ("rdma operations posted: 0" in out)
        if ok and name == "fingerprint":
            local, remote = int(m.group(1), 16), int(m.group(2), 16)
            ok = (local ^ FAULT_FINGERPRINT_XOR) == remote
        print("%-24s %s" % (name, "ok" if ok else "FAIL"))
        if not ok:
            print("rc=%d\n%s\n%s" % (rc, out, err))
            failed += 1

    # robustness: kill the prefill after the first batch of a many-batch pull. With heap
    # pools prefill's progress serves the GETs, so decode sees a peer error; with UCX-mapped
    # pools decode copies from its own mapping of the segment (the bytes outlive the
    # process), so the pull ends and the release to the dead prefill is what fails.
    for pool_alloc in ("heap", "ucx"):
        rc, out, err, wall = run(kvf, env, ["--model", model, "--layout", "2p2d", "--tokens",
                                            "400", "--no-coalesce", "--batch-descs", "4",
                                            "--pool-alloc", pool_alloc,
                                            "--fault-kill-prefill", "--timeout", "1s"],
                                 timeout=20)
        # TCP or heap pools: GETs need prefill's worker. UCX-mapped pools over shared memory
        # are mapped into decode (ucp_rkey_ptr) and read by copy, on every UCX version (1.22
        # itself would emulate those GETs through prefill's worker: a timeout instead)
        if (pool_alloc == "heap") or (args.tls != "default"):
            m = re.search(r"peer error on decode rank \d+ ([0-9.]+) ms after the prefill was "
                          r"killed", out)
            peer_line = re.search(r"FAILED: .*transfer failed: peer ", out) or \
                re.search(r"FAILED: .*release .* failed: peer ", out)
            ok = (rc == 1) and m is not None and float(m.group(1)) < 2000.0 and peer_line and \
                wall < 10
            what = "%s ms after the kill" % (m.group(1) if m else "?")
        else:
            # the pull may end from the mapping or, killed before a rank's endpoint
            # existed, be refused at start_pull: either way a failure, never a hang
            ok = (rc == 1) and re.search(r"^xfer-test: FAILED: (prefill exited with 137|"
                                         r"decode rank \d+: start_pull refused: peer )", out,
                                         re.M) is not None and wall < 10
            what = "failed, not hung"
        print("%-24s %s (%s, %.2f s in all; UCX %s)" %
              ("prefill killed (%s)" % pool_alloc, "ok" if ok else "FAIL", what, wall,
               args.ucx_version))
        if not ok:
            print("rc=%d\n%s\n%s" % (rc, out, err))
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
