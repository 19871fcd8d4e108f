#!/usr/bin/env python3
"""kvf-up --hosts with host names, over real ssh between test hosts (fake
daemons: the launch is under test, not the model).

Three test hosts h0, h1, h2 (network namespaces; each resolves the others'
names through its /etc/hosts), sshd in h1 and h2; kvf-up runs in h0.

1. A hosts file of names (h1, h2): kvf-up resolves them before it starts
   anything, the daemons bind the hosts' addresses, the pool is healthy and
   the proxy lists tcp://<address>:port (a name in a bind endpoint failed
   with "cannot listen on tcp://h2:21002: No such device").
2. A name that does not resolve (h9): exit 1 at once naming it, nothing
   started on any host.
3. The decode daemon on h2 exits at start-up: kvf-up (--timeout 300) says
   which instance on which host, with its log's tail, seconds after it
   started it (one ssh kill -0 per host and second).
"""

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

from mh_net import TestNet  # noqa: E402
from kvf_e2e import find_bin, repo_root  # noqa: E402

BASE_PORT, HTTP_PORT = 21000, 8000


def main():
    bindir = find_bin()
    fakebin = os.path.join(os.path.dirname(bindir), "tests", "fakebin")
    assert os.path.exists(os.path.join(fakebin, "kvf-up")), "no %s (build first)" % fakebin
    with TestNet(3) as net:
        ssh = net.start_sshd([1, 2])
        cfg = os.path.join(repo_root(), "tests", "data", "models", "tiny-hybrid.config.json")
        model = os.path.join(net.tmp, "tiny-hybrid")
        subprocess.run([os.path.join(bindir, "kvf"), "mkmodel", "--config", cfg, "--out", model],
                       check=True, stdout=subprocess.DEVNULL)
        env = dict(os.environ, KVF_SSH=ssh)

        def up(tag, hosts, extra=(), timeout="60"):
            hf = os.path.join(net.tmp, "hosts-" + tag)
            with open(hf, "w") as f:
                f.write("# by name\n" + "".join(h + "\n" for h in hosts))
            run_dir = os.path.join(net.tmp, "run-" + tag)
            cmd = [os.path.join(fakebin, "kvf-up"), "--layout", "1p1d", "--hosts", hf,
                   "--bin", fakebin, "--base-port", str(BASE_PORT), "--host", net.addr(0),
                   "--port", str(HTTP_PORT), "--model", model, "--run-dir", run_dir,
                   "--timeout", timeout] + list(extra)
            t0 = time.monotonic()
            p = net.run(0, cmd, check=False, env=env, timeout=180)
            return p, time.monotonic() - t0, run_dir

        def down(run_dir):
            net.run(0, [os.path.join(fakebin, "kvf-down"), "--run-dir", run_dir], check=False,
                    env=env, timeout=60)

        # 1. names
        p, dt, rd = up("names", ["h1", "h2"])
        try:
            assert p.returncode == 0, "kvf-up with host names failed:\n%s" % p.stderr
            hp = net.run(0, ["curl", "-fsS", "http://%s:%d/health" % (net.addr(0), HTTP_PORT)],
                         check=True).stdout
            want_p = "tcp://%s:%d" % (net.addr(1), BASE_PORT)
            want_d = "tcp://%s:%d" % (net.addr(2), BASE_PORT + 2)
            assert want_p in hp and want_d in hp, hp
            print("names: kvf-up --hosts h1,h2 healthy in %.1f s; prefill at %s, decode at %s"
                  % (dt, want_p, want_d), flush=True)
        finally:
            down(rd)

        # 2. a name that does not resolve
        p, dt, rd = up("bad", ["h1", "h9"])
        assert p.returncode == 1 and "--hosts: cannot resolve 'h9'" in p.stderr and dt < 10 \
            and "started" not in p.stderr, (dt, p.stderr)
        print("unresolvable: exit 1 in %.1f s before starting anything" % dt, flush=True)

        # 3. the remote decode dies at start-up: time from kvf-up's "started decode-0"
        # line to its report, read as kvf-up writes them
        hf = os.path.join(net.tmp, "hosts-dies")
        with open(hf, "w") as f:
            f.write("h1\nh2\n")
        rd = os.path.join(net.tmp, "run-dies")
        cmd = [os.path.join(fakebin, "kvf-up"), "--layout", "1p1d", "--hosts", hf,
               "--bin", fakebin, "--base-port", str(BASE_PORT), "--host", net.addr(0),
               "--port", str(HTTP_PORT), "--model", model, "--run-dir", rd, "--timeout", "300",
               "--decode-arg", "--listen", "--decode-arg", "tcp://256.0.0.1:1"]
        proc = subprocess.Popen(net.cmd(0, cmd), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        lines, t_start, t_report = [], None, None
        try:
            for line in proc.stderr:
                lines.append(line)
                if t_start is None and line.startswith("kvf-up: started decode-0 on h2"):
                    t_start = time.monotonic()
                if t_report is None and "decode-0 on h2 exited during start-up" in line:
                    t_report = time.monotonic()
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
            down(rd)
        err = "".join(lines)
        assert proc.returncode == 1 and t_start and t_report and \
            "fake: bind tcp://256.0.0.1:1" in err and t_report - t_start < 15, err
        print("remote exit: reported %.1f s after the decode was started (--timeout 300), "
              "with its log tail" % (t_report - t_start), flush=True)
    print("test_mh_names passed")


if __name__ == "__main__":
    main()
