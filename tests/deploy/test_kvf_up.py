"""kvf-up / kvf-down with fake daemons (through tests/e2e/kvf_e2e.py):
a 2p1d pool with 1 prefill and 2 decode instances comes up healthy, serves,
and goes down leaving no process and no pid file; a pool that cannot become
healthy makes kvf-up fail within its timeout and clean up; bad usage exits 2;
a second kvf-up on a live run dir is refused."""

import json
import os
import re
import signal
import subprocess
import tempfile
import time

import proxy_testlib as T
from kvf_e2e import Pool


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of ours would still answer kill 0; check its state.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def main():
    a = T.args()
    cfg = os.path.join(os.environ.get("KVF_SOURCE_DIR", "."), "tests", "data", "models",
                       "tiny-hybrid.config.json")
    with open(cfg) as f:
        bos = json.load(f)["bos_token_id"]
    # The proxy needs the model's tokenizer.json: a folder as kvf mkmodel writes it.
    model = os.path.join(tempfile.mkdtemp(prefix="kvf-up-test."), "tiny-hybrid")
    subprocess.run([os.path.join(os.environ.get("KVF_BIN", "build/bin"), "kvf"), "mkmodel",
                    "--config", cfg, "--out", model], check=True, stdout=subprocess.DEVNULL)
    up = os.path.join(a.fakebin, "kvf-up")

    pool = Pool(layout="2p1d", model=model, prefill_instances=1, decode_instances=2,
                bin_dir=a.fakebin, timeout=20)
    with pool:
        pids = pool.pids()
        T.check(sorted(pids) == ["decode-0", "decode-1", "prefill-0", "proxy"],
                "pid files for every process")
        st, h = pool.health()
        T.check(st == 200 and [p["tp_size"] for p in h["prefill"]] == [2] and
                [d["tp_size"] for d in h["decode"]] == [1, 1] and
                [d["engine_id"] for d in h["decode"]] == ["decode-0", "decode-1"],
                "layout 2p1d: prefill TP2, two decode instances TP1")
        T.check(pool.model_name == "tiny-hybrid", "model name defaults to the model's file name")
        # The proxy got --model: string prompts start with BOS (256, not shown as text).
        r = pool.complete("hi!", max_tokens=6, return_token_ids=True)
        T.check(r["choices"][0]["token_ids"] == [bos, 104, 105, 33, bos, 104] and
                r["choices"][0]["text"] == "hi!h", "completion through the pool")
        s = pool.complete("hi!", max_tokens=6, stream=True)
        T.check(s.done and s.text == "hi!h", "streamed completion through the pool")
        with open(os.path.join(pool.run_dir, "pool.env")) as f:
            env = dict(line.strip().split("=", 1) for line in f if "=" in line)
        T.check(env["PROXY_URL"] == pool.url and env["LAYOUT"] == "2p1d",
                "pool.env records the proxy URL and layout")

        # A second kvf-up on the same run dir is refused while the pool runs.
        p = subprocess.run([up, "--layout", "1p1d", "--model", model, "--run-dir", pool.run_dir,
                            "--bin", a.fakebin, "--port", "0"],
                           capture_output=True, text=True, timeout=30)
        T.check(p.returncode == 1 and "already running" in p.stderr,
                "kvf-up refuses a run dir with a live pool")

        # A second pool asking for the same proxy port: its own proxy cannot
        # listen, but the port answers (the first pool's proxy, with as many
        # healthy instances). kvf-up must not take that for its own pool. The
        # stand-in proxy keeps its pid alive after the real one failed, so the
        # check cannot rely on the proxy exiting first.
        port = int(pool.url.rsplit(":", 1)[1])
        with tempfile.TemporaryDirectory() as rb, tempfile.TemporaryDirectory() as bb:
            for exe in ("kvf-prefill", "kvf-decode", "kvf"):   # kvf: kvf-up's `kvf keygen`
                os.symlink(os.path.join(a.fakebin, exe), os.path.join(bb, exe))
            with open(os.path.join(bb, "kvf-proxy"), "w") as f:
                f.write('#!/bin/sh\n"%s" "$@"\nexec sleep 60\n' % os.path.join(a.fakebin, "kvf-proxy"))
            os.chmod(os.path.join(bb, "kvf-proxy"), 0o755)
            p = subprocess.run([up, "--layout", "2p1d", "--decode-instances", "2", "--model", model,
                                "--run-dir", rb, "--bin", bb, "--port", str(port),
                                "--base-port", str(__import__("kvf_e2e").free_port_range(4)),
                                "--timeout", "10"],
                               capture_output=True, text=True, timeout=30)
            m = re.search(r"started proxy on \S+ \(pid (\d+)\)", p.stderr)
            if m and pid_alive(int(m.group(1))):
                os.kill(int(m.group(1)), signal.SIGKILL)
            # kvf pool-check finds the port taken before anything starts (the health
            # check's "is not this pool's" still guards a port taken after the check)
            T.check(p.returncode == 1 and p.stdout == "" and
                    ("port %d on 127.0.0.1 (proxy.port) is not free" % port) in p.stderr and
                    "started " not in p.stderr.replace("nothing started", ""),
                    "kvf-up fails before start-up when another pool's proxy holds its port",
                    p.stderr)
            T.check(not [f for f in os.listdir(rb) if f.endswith(".pid")],
                    "the failed kvf-up stopped what it started")
        T.check(pool.health()[0] == 200 and all(pid_alive(pid) for pid in pids.values()),
                "the first pool is untouched")
        run_dir = pool.run_dir
        pool.keep_run_dir = True
    T.check(not any(pid_alive(pid) for pid in pids.values()), "kvf-down stopped every process")
    T.check(not [f for f in os.listdir(run_dir) if f.endswith(".pid")] and
            not os.path.exists(os.path.join(run_dir, "pool.env")),
            "kvf-down removed the pid files and pool.env; logs stay")
    T.check(os.path.exists(os.path.join(run_dir, "proxy.log")), "logs kept")
    p = subprocess.run([os.path.join(a.fakebin, "kvf-down"), "--run-dir", run_dir],
                       capture_output=True, text=True, timeout=30)
    T.check(p.returncode == 0 and p.stderr.strip() == "kvf-down: nothing running in %s" % run_dir,
            "kvf-down a second time says nothing is running", p.stderr)

    # Supervision: a crashed instance comes back with the same engine id and
    # ports, counted; one instance restarted by hand; kvf-down stops it all.
    sup = Pool(layout="1p1d", model=model, bin_dir=a.fakebin, timeout=20)
    sup._up_cmd_orig = sup._up_cmd
    sup._up_cmd = lambda base: sup._up_cmd_orig(base) + ["--supervise"]
    with sup:
        pids = sup.pids()
        T.check("supervisor" in pids and pid_alive(pids["supervisor"]), "--supervise runs a supervisor")
        url = sup.health()[1]["decode"][0]["url"]
        os.kill(pids["decode-0"], signal.SIGKILL)

        def back():
            p = sup.pids().get("decode-0")
            d = sup.health()[1]["decode"][0]
            return p not in (None, pids["decode-0"]) and pid_alive(p) and d["healthy"]
        t0 = time.monotonic()
        __import__("kvf_e2e").wait_for(back, 15, "decode-0 restarted and healthy")
        d = sup.health()[1]["decode"][0]
        T.check(d["url"] == url and d["engine_id"] == "decode-0",
                "crashed decode-0 restarted with the same engine id and port (%.1f s)"
                % (time.monotonic() - t0))
        __import__("kvf_e2e").wait_for(
            lambda: sup.metrics().sum("kvf_instance_restarts_total", engine_id="decode-0") == 1,
            5, "the proxy counts the restart")
        with open(os.path.join(sup.run_dir, "decode-0.restarts")) as f:
            T.check(f.read().strip() == "1", "restart counted (decode-0.restarts, "
                    "kvf_instance_restarts_total)")
        T.check("restarted decode-0" in sup.log("supervisor"), "the supervisor logs the restart")
        T.check(sup.complete("hi!", max_tokens=3)["choices"][0]["text"], "serving again")
        old = sup.pids()["prefill-0"]
        p = subprocess.run([up, "--restart", "prefill-0", "--run-dir", sup.run_dir],
                           capture_output=True, text=True, timeout=60)
        new = sup.pids().get("prefill-0")
        T.check(p.returncode == 0 and new != old and pid_alive(new) and not pid_alive(old),
                "kvf-up --restart prefill-0: a new process", p.stderr)
        __import__("kvf_e2e").wait_for(
            lambda: sup.metrics().sum("kvf_instance_restarts_total", engine_id="prefill-0") == 1
            and sup.health()[0] == 200, 10, "restarted prefill-0 healthy and counted")
        T.check(True, "restarted prefill-0 healthy and counted")
        all_pids = sup.pids()
    T.check(not any(pid_alive(p) for p in all_pids.values()),
            "kvf-down stopped the supervisor and every instance, restarted or not",
            {n: p for n, p in all_pids.items() if pid_alive(p)})

    # An unusable run dir: one clear line, exit 1 (not mkdir's own message).
    with tempfile.TemporaryDirectory() as td:
        afile = os.path.join(td, "file")
        open(afile, "w").close()
        p = subprocess.run([up, "--layout", "1p1d", "--model", model, "--bin", a.fakebin,
                            "--run-dir", os.path.join(afile, "run"), "--port", "0"],
                           capture_output=True, text=True, timeout=30)
        lines = p.stderr.strip().splitlines()
        T.check(p.returncode == 1 and len(lines) == 1 and
                lines[0].startswith("kvf-up: cannot create the run dir"),
                "unusable --run-dir -> one kvf-up line, exit 1", p.stderr)

    # A decode that never answers health: kvf-up fails within its timeout and cleans up.
    with tempfile.TemporaryDirectory() as rd:
        t0 = time.monotonic()
        p = subprocess.run([up, "--layout", "1p1d", "--model", model, "--run-dir", rd,
                            "--bin", a.fakebin, "--port", "0", "--timeout", "2",
                            "--base-port", str(__import__("kvf_e2e").free_port_range(3)),
                            "--decode-arg", "--fake-mode", "--decode-arg", "no-health"],
                           capture_output=True, text=True, timeout=30)
        dt = time.monotonic() - t0
        T.check(p.returncode == 1 and "did not become healthy" in p.stderr and 1.9 < dt < 10,
                "unhealthy pool: kvf-up exits 1 after its 2 s timeout (%.1fs)" % dt, p.stderr)
        T.check(not [f for f in os.listdir(rd) if f.endswith(".pid")],
                "failed kvf-up removed its pid files")
        T.check(p.stdout == "", "failed kvf-up prints no URL")

        # A decode that refuses the prefill engine in the start-up compatibility
        # check: kvf-up fails at once with the refusal text (not at its timeout).
        t0 = time.monotonic()
        p = subprocess.run([up, "--layout", "1p1d", "--model", model, "--run-dir", rd,
                            "--bin", a.fakebin, "--port", "0", "--timeout", "20",
                            "--base-port", str(__import__("kvf_e2e").free_port_range(3)),
                            "--decode-arg", "--fake-mode", "--decode-arg", "refuse-check"],
                           capture_output=True, text=True, timeout=40)
        dt = time.monotonic() - t0
        T.check(p.returncode == 1 and
                "incompatible pairing prefill-0 -> decode-0: handshake refused: kv_dtype "
                "prefill=fp32 decode=bf16" in p.stderr and dt < 15,
                "refused pairing: kvf-up exits 1 with the refusal (%.1fs)" % dt, p.stderr)
        T.check(not [f for f in os.listdir(rd) if f.endswith(".pid")],
                "kvf-up stopped the refused pool")

        # A daemon that exits at once (bind on a bad endpoint) is reported with its log.
        p = subprocess.run([up, "--layout", "1p1d", "--model", model, "--run-dir", rd,
                            "--bin", a.fakebin, "--port", "0", "--timeout", "10",
                            "--base-port", "1", "--", "--listen", "tcp://256.0.0.1:1"],
                           capture_output=True, text=True, timeout=30)
        T.check(p.returncode == 1 and "exited during start-up" in p.stderr,
                "a daemon dying at start-up fails kvf-up with its log tail", p.stderr)

    # --hosts with a non-local host goes through ssh: a stand-in ssh that runs the
    # command here shows the remote path (launch, pid files, kvf-down over ssh).
    # 127.0.0.2 is loopback on Linux but not "local" to kvf-up.
    with tempfile.TemporaryDirectory() as td:
        fake_ssh = os.path.join(td, "ssh")
        calls = os.path.join(td, "calls")
        with open(fake_ssh, "w") as f:
            f.write("#!/usr/bin/env bash\n"
                    "while [[ $1 == -* ]]; do [[ $1 == -o ]] && shift; shift; done\n"
                    "echo \"$1\" >> %s; shift\n"
                    "exec bash -c \"$*\"\n" % calls)
        os.chmod(fake_ssh, 0o755)
        hosts = os.path.join(td, "hosts")
        with open(hosts, "w") as f:
            f.write("# one remote host\n127.0.0.2\n")
        env = dict(os.environ, PATH=td + os.pathsep + os.environ["PATH"])
        old_path = os.environ["PATH"]
        os.environ["PATH"] = env["PATH"]
        try:
            with Pool(layout="1p1d", model=model, bin_dir=a.fakebin, timeout=20,
                      hosts_file=hosts) as rp:
                st, h = rp.health()
                T.check(st == 200 and h["prefill"][0]["url"].startswith("tcp://127.0.0.2:") and
                        h["decode"][0]["url"].startswith("tcp://127.0.0.2:"),
                        "--hosts: instances on the listed host, reached at its address")
                T.check(rp.complete("ab", max_tokens=2)["choices"][0]["text"] == "a",
                        "--hosts pool serves")
                rpids = rp.pids()
            with open(calls) as f:
                used = f.read().split()
            T.check(used and set(used) == {"127.0.0.2"}, "remote instances used ssh 127.0.0.2")
            T.check(not any(pid_alive(rpids[n]) for n in ("prefill-0", "decode-0")),
                    "kvf-down stopped the remote instances through ssh")
        finally:
            os.environ["PATH"] = old_path

    # An unreachable host in --hosts: ssh fails (exit 255); kvf-up says which
    # instance and host in one line, exits 1 and leaves nothing running.
    with tempfile.TemporaryDirectory() as td:
        with open(os.path.join(td, "ssh"), "w") as f:
            f.write("#!/bin/sh\necho 'ssh: connect to host 192.0.2.1 port 22: "
                    "No route to host' >&2\nexit 255\n")
        os.chmod(os.path.join(td, "ssh"), 0o755)
        hosts = os.path.join(td, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1\n192.0.2.1\n")
        rd = os.path.join(td, "run")
        p = subprocess.run([up, "--layout", "1p1d", "--model", model, "--bin", a.fakebin,
                            "--run-dir", rd, "--port", "0", "--hosts", hosts,
                            "--base-port", str(__import__("kvf_e2e").free_port_range(3))],
                           capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, PATH=td + os.pathsep + os.environ["PATH"]))
        T.check(p.returncode == 1 and
                "kvf-up: cannot start decode-0 on 192.0.2.1 over ssh (exit 255): ssh: connect "
                "to host 192.0.2.1 port 22: No route to host" in p.stderr,
                "unreachable --hosts entry -> a kvf-up line with ssh's message, exit 1", p.stderr)
        T.check(not [f for f in os.listdir(rd) if f.endswith(".pid")],
                "the local prefill started before was stopped")

    for argv, what in ((["--layout", "4x2"], "bad layout"),
                       (["--layout", "1p1d"], "missing --model"),
                       (["--layout", "1p1d", "--model", model, "--port", "70000"], "bad port"),
                       (["--bogus"], "unknown flag")):
        p = subprocess.run([up] + argv, capture_output=True, text=True, timeout=10)
        T.check(p.returncode == 2, "kvf-up usage error exits 2: %s" % what)
    p = subprocess.run([up, "--layout", "1p1d", "--model", model, "--env", "1BAD"],
                       capture_output=True, text=True, timeout=10)
    T.check(p.returncode == 2 and "--env must look like NAME=VALUE (got '1BAD')" in p.stderr,
            "kvf-up --env without NAME=VALUE: usage error naming the flag", p.stderr)


if __name__ == "__main__":
    main()
