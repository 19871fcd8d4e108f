#!/usr/bin/env python3
"""KVF_FAULT at daemon start-up (base/kvf_fault.h), in every build:
a malformed spec is refused by name (exit 2, one line naming the entry and
what is wrong) by both kvf-prefill and kvf-decode; a well-formed one is
armed in a -DKVF_FAULT_INJECTION=ON build and refused, saying so, in a
build without fault points (never silently ignored)."""

import os
import subprocess
import sys
import tempfile

from kvf_e2e import find_bin, keygen

CASES = [
    ("ucx.pots@3=kill", "entry 'ucx.pots@3=kill': unknown fault point 'ucx.pots' (points: "
     "ucx.post, ucx.half, ucx.notify, side.reply, side.rkey, lease.claim, lease.send, "
     "lease.release, decode.step, ucx.data, tp.barrier)"),
    ("side.rkey=drop", "entry 'side.rkey=drop': fault point side.rkey does not take action "
     "drop (it takes: corrupt)"),
    ("ucx.post=stall", "entry 'ucx.post=stall': stall needs a duration, stall:<ms> with ms in"
     " 1..60000"),
    ("ucx.half@0=kill", "entry 'ucx.half@0=kill': pass '0' is not n or n+ with n in"
     " 1..1000000000"),
    ("ucx.post", "entry 'ucx.post' has no '=action'"),
]


KEYS = None


def run(exe, spec):
    global KEYS
    KEYS = KEYS or keygen(os.path.join(tempfile.mkdtemp(prefix="kvf-fault-env."), "keys"))
    env = dict(os.environ, KVF_FAULT=spec)
    role = "decode" if exe.endswith("decode") else "prefill"
    p = subprocess.run([exe, "--model", "/nonexistent-model", "--keys", KEYS, "--key-id",
                        role + "-0"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    return p.returncode, p.stdout


def main():
    bindir = find_bin()
    for daemon in ("kvf-prefill", "kvf-decode"):
        exe = os.path.join(bindir, daemon)
        for spec, want in CASES:
            rc, out = run(exe, spec)
            assert rc == 2 and ("KVF_FAULT: " + want) in out, (daemon, spec, rc, out)
        rc, out = run(exe, "ucx.half=stall:100")
        if "no fault points" in out:
            assert rc == 2 and "KVF_FAULT is set ('ucx.half=stall:100') but this build has no " \
                "fault points (configure with -DKVF_FAULT_INJECTION=ON)" in out, (rc, out)
            built = "without"
        else:
            assert rc != 2 and "fault point ucx.half armed: fires on pass 1 (stall)" in out, \
                (rc, out)
            built = "with"
    print("KVF_FAULT: %d malformed specs refused by name by both daemons; a valid one %s"
          % (len(CASES), "armed (fault build)" if built == "with" else
             "refused (build without fault points)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
