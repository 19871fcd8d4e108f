#!/usr/bin/env python3
"""kvf-up refuses timeouts that contradict each other before it starts anything
(issue 23 item 6): a prefill lease shorter than a transfer timeout (prefill's
own or decode's), a quarantine bound below one, a proxy --token-timeout below
decode's transfer timeout. Each refusal exits 2 within seconds naming both
values in ms; no program is run (not even `kvf keygen`) and no run dir is made.
Values are read the way the daemons read them: --prefill-arg/--decode-arg,
the args after "--" (both daemons), --env KVF_* and kvf-up's own environment.
A consistent set passes the check (kvf-up goes on and runs `kvf keygen`).

The programs are stand-ins that only record that they ran; the daemons' own
refusals are tested in tests/daemon/test_role_config.c.

Rerun:
  python3 tests/deploy/test_kvf_up_config.py
"""

import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KVF_UP = os.path.join(HERE, "..", "..", "deploy", "pool", "kvf-up")
MODEL = os.path.join(HERE, "..", "..", "models-trained", "tiny-dense")

CASES = [
    (["--prefill-arg", "--lease-timeout", "--prefill-arg", "5s"], {},
     "--lease-timeout 5000 ms is shorter than --xfer-timeout 10000 ms: a lease would expire "
     "during a transfer"),
    (["--prefill-arg", "--lease-timeout=5s", "--prefill-arg", "--xfer-timeout=2s"], {},
     "prefill's --lease-timeout 5000 ms is shorter than decode's --xfer-timeout 10000 ms: a "
     "lease would expire during a transfer"),
    (["--", "--xfer-timeout", "40s"], {},
     "--lease-timeout 30000 ms is shorter than --xfer-timeout 40000 ms"),
    (["--env", "KVF_LEASE_TIMEOUT=4s"], {},
     "--lease-timeout 4000 ms is shorter than --xfer-timeout 10000 ms"),
    ([], {"KVF_XFER_TIMEOUT": "45s"},
     "--lease-timeout 30000 ms is shorter than --xfer-timeout 45000 ms"),
    (["--prefill-arg", "--max-quarantine", "--prefill-arg", "1500ms"], {},
     "--max-quarantine 1500 ms is shorter than --xfer-timeout 10000 ms: a read still in flight "
     "could land in reused blocks"),
    (["--prefill-arg", "--xfer-timeout=1s", "--prefill-arg", "--max-quarantine=3s",
      "--decode-arg", "--xfer-timeout=5s"], {},
     "prefill's --max-quarantine 3000 ms is shorter than decode's --xfer-timeout 5000 ms"),
    (["--proxy-arg", "--token-timeout", "--proxy-arg", "2s"], {},
     "the proxy's --token-timeout 2000 ms is shorter than decode's --xfer-timeout 10000 ms"),
    (["--prefill-arg", "--lease-timeout", "--prefill-arg", "soon"], {},
     "--lease-timeout 'soon' is not a duration"),
]

# consistent: the timeout model's shape (lease 3T, quarantine 2T, token 3T) at T = 1 s
GOOD = ["--prefill-arg", "--lease-timeout=3s", "--prefill-arg", "--max-quarantine=2s",
        "--proxy-arg", "--token-timeout=3s", "--", "--xfer-timeout", "1s"]


def fake_bin(d):
    ran = os.path.join(d, "ran")
    b = os.path.join(d, "bin")
    os.makedirs(b)
    for exe in ("kvf-prefill", "kvf-decode", "kvf-proxy", "kvf"):
        with open(os.path.join(b, exe), "w") as f:
            f.write("#!/bin/sh\necho %s >> %s\nexit 3\n" % (exe, ran))
        os.chmod(os.path.join(b, exe), 0o755)
    return b, ran


def up(b, rd, args, env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVF_")}
    env.update(env_extra)
    t0 = time.monotonic()
    p = subprocess.run(["bash", KVF_UP, "--layout", "1p1d", "--model", MODEL, "--bin", b,
                        "--run-dir", rd, "--port", "0", "--timeout", "10"] + args,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       timeout=60)
    return p, time.monotonic() - t0


def main():
    td = tempfile.mkdtemp(prefix="kvf-up-cfg.")
    b, ran = fake_bin(td)
    worst = 0.0
    for i, (args, env, want) in enumerate(CASES):
        rd = os.path.join(td, "run-%d" % i)
        p, took = up(b, rd, args, env)
        worst = max(worst, took)
        assert p.returncode == 2, (args, env, p.returncode, p.stderr)
        assert want in p.stderr, (args, env, want, p.stderr)
        assert not os.path.exists(ran), ("something was started", args, open(ran).read())
        assert not os.path.exists(rd), ("run dir made", args)
        print("refused in %.2f s: kvf-up %s%s -> %s" % (
            took, " ".join(args), (" (env %s)" % env) if env else "",
            p.stderr.strip().splitlines()[0]))
    rd = os.path.join(td, "run-good")
    p, took = up(b, rd, GOOD, {})
    assert "is shorter than" not in p.stderr, p.stderr
    assert os.path.exists(ran) and "kvf" in open(ran).read().split(), (p.returncode, p.stderr)
    print("consistent timeouts pass the check (kvf-up went on to run kvf keygen, rc %d)"
          % p.returncode)
    print("kvf-up config checks: %d contradictions refused before anything started, "
          "slowest %.2f s" % (len(CASES), worst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
