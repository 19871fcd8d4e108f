"""kvf-up fails fast, and says why, when hosts are named or remote daemons die
(fake daemons; a stand-in ssh that runs the remote command here):

1. A --hosts entry that does not resolve: exit 1 within seconds naming the
   host, before anything is started.
2. A --hosts entry given by name (this machine's host name, reached over the
   stand-in ssh): the name is resolved here to its IPv4 address, the daemons
   bind that address and the pool is healthy (ZeroMQ read the name as a
   network interface before: "cannot listen on tcp://h2:21002: No such
   device").
3. A remote daemon that exits at start-up: kvf-up (--timeout 120) reports it
   within a few seconds with the host and the log's tail, exit 1, nothing
   left running (it waited out the whole --timeout before).

Rerun:
  python3 tests/deploy/test_kvf_up_failfast.py --fakebin build/tests/fakebin \
      --testbin build/tests/bin
"""

import os
import socket
import subprocess
import tempfile
import time

import proxy_testlib as T
from kvf_e2e import Pool, find_bin, free_port_range


def pid_files(d):
    return [f for f in os.listdir(d) if f.endswith(".pid")] if os.path.isdir(d) else []


def main():
    a = T.args()
    cfg = os.path.join(os.environ.get("KVF_SOURCE_DIR", "."), "tests", "data", "models",
                       "tiny-hybrid.config.json")
    td = tempfile.mkdtemp(prefix="kvf-up-ff.")
    model = os.path.join(td, "tiny-hybrid")
    subprocess.run([os.path.join(find_bin(), "kvf"), "mkmodel", "--config", cfg, "--out", model],
                   check=True, stdout=subprocess.DEVNULL)
    up = os.path.join(a.fakebin, "kvf-up")
    fake_ssh = os.path.join(td, "ssh")
    calls = os.path.join(td, "calls")
    with open(fake_ssh, "w") as f:
        f.write("#!/usr/bin/env bash\n"
                "while [[ $1 == -* ]]; do [[ $1 == -o ]] && shift; shift; done\n"
                "echo \"$1\" >> %s; shift\n"
                "exec bash -c \"$*\"\n" % calls)
    os.chmod(fake_ssh, 0o755)
    env = dict(os.environ, PATH=td + os.pathsep + os.environ["PATH"])

    # 1. a name that does not resolve
    hosts = os.path.join(td, "hosts-bad")
    with open(hosts, "w") as f:
        f.write("127.0.0.1\nno-such-host.invalid  # typo\n")
    rd = os.path.join(td, "run-bad")
    t0 = time.monotonic()
    p = subprocess.run([up, "--layout", "1p1d", "--model", model, "--bin", a.fakebin,
                        "--run-dir", rd, "--port", "0", "--hosts", hosts, "--timeout", "120",
                        "--base-port", str(free_port_range(3))],
                       capture_output=True, text=True, timeout=60, env=env)
    dt = time.monotonic() - t0
    T.check(p.returncode == 1 and "--hosts: cannot resolve 'no-such-host.invalid'" in p.stderr
            and dt < 15 and not pid_files(rd) and "started" not in p.stderr,
            "unresolvable --hosts entry: exit 1 in %.1f s naming it, nothing started" % dt,
            p.stderr)
    dt_resolve = dt

    # 2. a host given by name
    name = socket.gethostname()
    try:
        addr = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError:
        addr = None
    if addr is None or name in ("localhost",):
        print("SKIP part 2: this machine's host name %r does not resolve to IPv4" % name)
    else:
        hosts = os.path.join(td, "hosts-name")
        with open(hosts, "w") as f:
            f.write("%s\n" % name)
        old_path = os.environ["PATH"]
        os.environ["PATH"] = env["PATH"]
        try:
            with Pool(layout="1p1d", model=model, bin_dir=a.fakebin, timeout=30,
                      hosts_file=hosts) as rp:
                st, h = rp.health()
                urls = [i["url"] for i in h["prefill"] + h["decode"]]
                T.check(st == 200 and all(u.startswith("tcp://%s:" % addr) for u in urls),
                        "--hosts %s: daemons bind and are reached at its address %s (%s)"
                        % (name, addr, ", ".join(urls)))
                T.check(rp.complete("ab", max_tokens=2)["choices"][0]["text"] == "a",
                        "the pool on a named host serves")
        finally:
            os.environ["PATH"] = old_path
        with open(calls) as f:
            T.check(set(f.read().split()) == {name}, "ssh was given the host's name")

    # 3. a remote daemon that dies at start-up (its bind endpoint is invalid)
    hosts = os.path.join(td, "hosts-remote")
    with open(hosts, "w") as f:
        f.write("127.0.0.2\n")
    rd = os.path.join(td, "run-dies")
    t0 = time.monotonic()
    p = subprocess.run([up, "--layout", "1p1d", "--model", model, "--bin", a.fakebin,
                        "--run-dir", rd, "--port", "0", "--hosts", hosts, "--timeout", "120",
                        "--base-port", str(free_port_range(3)),
                        "--decode-arg", "--listen", "--decode-arg", "tcp://256.0.0.1:1"],
                       capture_output=True, text=True, timeout=150, env=env)
    dt = time.monotonic() - t0
    T.check(p.returncode == 1 and "decode-0 on 127.0.0.2 exited during start-up" in p.stderr
            and "fake: bind tcp://256.0.0.1:1" in p.stderr and dt < 15,
            "a remote daemon that exits: kvf-up reports it with its log tail in %.1f s "
            "(--timeout 120)" % dt, p.stderr)
    T.check(not pid_files(rd), "kvf-up stopped the rest of that pool")
    print("fail-fast: unresolvable host refused in %.1f s; remote daemon exit reported in "
          "%.1f s" % (dt_resolve, dt))


if __name__ == "__main__":
    main()
