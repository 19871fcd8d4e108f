#!/usr/bin/env python3
"""kvf-up checks before it starts anything (issue 46 item 4), with the real daemons.

1. Each pool that cannot come up fails in under 5 s, exit 1, naming the field, and no process
   was started (no "started" line, no pid file): --kv-dtype fp8 (the daemons refuse it), a
   decode --kv-dtype other than prefill's, layout 1p3d (the tiny hybrid's heads do not split
   3 ways), the proxy's tokenizer not the daemons' (this once waited the whole --timeout),
   decode on another model folder (tokenizer), a config without weights, a --base-port range
   whose side-channel port is taken.
2. A 1p1d pool on 127.0.0.1 with --metrics-base-port: each daemon serves /metrics on its own
   port (listed in pool.env), and `ss` shows every other listening socket of the pool's
   processes on 127.0.0.1 (UCX's included: UCX_NET_DEVICES=lo), none on another address.

Rerun: KVF_BIN=build/bin KVF_SOURCE_DIR=. python3 tests/deploy/test_kvf_up_precheck.py
"""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError("%s\n%s" % (what, detail))
    print("ok: " + what)


def free_range(n, start=32000):
    for base in range(start, 60000, 100):
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("0.0.0.0", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range")


def up(bindir, run_dir, args, timeout=60):
    cmd = [os.path.join(bindir, "kvf-up"), "--run-dir", run_dir, "--port", "0", "--bin",
           bindir, "--timeout", "30"] + args
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


def refused(bindir, run_dir, args, want, what):
    p, dt = up(bindir, run_dir, args)
    pids = [f for f in os.listdir(run_dir) if f.endswith(".pid")] if os.path.isdir(run_dir) \
        else []
    check(p.returncode == 1 and dt < 5.0 and re.search(want, p.stderr) and
          not re.search(r"started \S+ on ", p.stderr) and not pids,
          "%s: refused in %.2f s before any start, naming /%s/" % (what, dt, want), p.stderr)


def main():
    bindir = os.environ["KVF_BIN"]
    src = os.environ["KVF_SOURCE_DIR"]
    hybrid = os.path.join(src, "models-trained", "tiny-hybrid")
    dense = os.path.join(src, "models-trained", "tiny-dense")
    cfg9b = os.path.join(src, "tests", "data", "models", "nemotron-nano-9b-v2.config.json")
    with tempfile.TemporaryDirectory(prefix="kvf-precheck.") as tmp:
        run = os.path.join(tmp, "run")
        base = ["--layout", "1p1d", "--model", hybrid]
        refused(bindir, run, base + ["--kv-dtype", "fp8"],
                r"kv_dtype: the prefill daemons refuse --kv-dtype fp8", "--kv-dtype fp8")
        refused(bindir, run, base + ["--decode-arg", "--kv-dtype=fp32"],
                r"kv_dtype prefill=bf16 decode=fp32", "decode's dtype not prefill's")
        refused(bindir, run, ["--layout", "1p3d", "--model", hybrid],
                r"layout 1p3d: the model cannot be sharded 3 ways", "layout 1p3d")
        refused(bindir, run, base + ["--proxy-arg", "--model=" + dense],
                r"tokenizer: proxy=[0-9a-f]+ \(.*tiny-dense\) prefill=[0-9a-f]+ \(.*tiny-hybrid\)",
                "the proxy's tokenizer")
        refused(bindir, run, base + ["--decode-arg", "--model=" + dense],
                r"tokenizer: decode=[0-9a-f]+ .* prefill=", "decode on another model folder")
        refused(bindir, run, ["--layout", "4p2d", "--model", cfg9b],
                r"weights: no \*\.safetensors in .*tests/data/models", "a config without weights")
        pb = free_range(3)
        hold = socket.socket()
        hold.bind(("127.0.0.1", pb + 1))
        hold.listen()
        try:
            refused(bindir, run, base + ["--base-port", str(pb)],
                    r"port %d on 127\.0\.0\.1 \(prefill-0\.side-channel\) is not free" % (pb + 1),
                    "a taken side-channel port")
        finally:
            hold.close()

        # 2. a pool on 127.0.0.1: UCX only there, and one metrics port per daemon
        mb = free_range(2, 41000)
        p, dt = up(bindir, run, base + ["--metrics-base-port", str(mb)], timeout=120)
        try:
            check(p.returncode == 0, "the 1p1d pool comes up (%.1f s)" % dt, p.stderr[-3000:])
            env = dict(l.split("=", 1) for l in open(os.path.join(run, "pool.env")).read()
                       .splitlines() if "=" in l)
            urls = env.get("METRICS", "").split(",")
            check(urls == ["http://127.0.0.1:%d/metrics" % mb,
                           "http://127.0.0.1:%d/metrics" % (mb + 1)],
                  "pool.env lists one metrics port per daemon", env)
            for u, eid in zip(urls, ("prefill-0", "decode-0")):
                body = urllib.request.urlopen(u, timeout=10).read().decode()
                check('engine="%s"' % eid in body or eid in body,
                      "%s serves its own /metrics on %s" % (eid, u))
            pids = []
            for n in ("prefill-0", "decode-0", "proxy"):
                pids.append(int(open(os.path.join(run, n + ".pid")).read().split()[0]))
            ss = subprocess.run(["ss", "-H", "-lntup"], capture_output=True, text=True,
                                timeout=10).stdout
            mine = [l for l in ss.splitlines() if any("pid=%d," % x in l for x in pids)]
            local = [l.split()[4] for l in mine]
            other = [a for a in local if not a.startswith("127.0.0.1:") and
                     a.rsplit(":", 1)[1] not in (str(mb), str(mb + 1))]
            check(len(local) >= 6 and not other,
                  "every socket of the pool but the metrics ports is on 127.0.0.1 (%d sockets)"
                  % len(local), "\n".join(mine))
        finally:
            subprocess.run([os.path.join(bindir, "kvf-down"), "--run-dir", run],
                           capture_output=True, timeout=60)
            shutil.rmtree(run, ignore_errors=True)
    print("PASS test_kvf_up_precheck")


if __name__ == "__main__":
    main()
