"""deploy/examples/slurm/kvferry.sbatch fails the job as soon as a step exits
(without Slurm: stand-in srun and scontrol run each step here; fake daemons
and the real proxy). tests/multihost/test_mh_slurm.py runs the same script
on a real Slurm cluster when the machine allows it.

1. Every decode step exits 2 at start-up: the batch script exits 1 within
   seconds, naming the step, its status and its log's tail (it polled
   /health for 600 s before).
2. A decode step that exits while the pool serves: the script exits 1 within
   seconds (it only waited for the proxy before).
3. A proxy stopped with SIGTERM (drained): the script exits 0.

Rerun:
  python3 tests/deploy/test_sbatch_failfast.py --fakebin build/tests/fakebin \
      --testbin build/tests/bin
"""

import os
import signal
import socket
import subprocess
import tempfile
import time

import proxy_testlib as T
from kvf_e2e import find_bin, free_port_range, repo_root, wait_for

SBATCH = os.path.join(repo_root(), "deploy", "examples", "slurm", "kvferry.sbatch")

# srun: drop srun's own options, record the step's pid by engine id, become the step.
SRUN = """#!/usr/bin/env bash
while [[ $1 == -* ]]; do shift; done
id=step
for ((i = 1; i < $#; i++)); do [[ ${!i} == --engine-id ]] && { j=$((i + 1)); id=${!j}; }; done
echo $$ > "%(pids)s/$id"
exec "$@"
"""
SCONTROL = "#!/bin/sh\necho 127.0.0.1\necho 127.0.0.1\n"
# The programs of BIN_DIR: the fake daemons and the real proxy, with --insecure
# (where the programs know it) unless the script passes keys.
WRAP = """#!/bin/sh
case " $* " in *" --keys "*|*" --keys="*|*" --insecure "*) exec "%(exe)s" "$@" ;; esac
exec "%(exe)s" "$@" %(insecure)s
"""


def write(path, text, mode=0o755):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def job(td, fakebin, model, decode_exe, tag):
    stub = os.path.join(td, "stub-" + tag)
    bind = os.path.join(td, "bin-" + tag)
    pids = os.path.join(td, "pids-" + tag)
    for d in (stub, bind, pids):
        os.makedirs(d)
    write(os.path.join(stub, "srun"), SRUN % {"pids": pids})
    write(os.path.join(stub, "scontrol"), SCONTROL)
    for prog, exe in (("kvf-prefill", os.path.join(fakebin, "kvf-prefill")),
                      ("kvf-decode", decode_exe),
                      ("kvf-proxy", os.path.join(fakebin, "kvf-proxy"))):
        write(os.path.join(bind, prog), WRAP % {"exe": exe, "insecure": INSECURE[0]})
    os.symlink(os.path.join(find_bin(), "kvf"), os.path.join(bind, "kvf"))   # kvf keygen
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ, PATH=stub + os.pathsep + os.environ["PATH"], BIN_DIR=bind,
               MODEL=model, RUN=os.path.join(td, "run-" + tag), PORT=str(port),
               BASE=str(free_port_range(4)), PREFILL_TP="2", DECODE_TP="1",
               PROXY_HOST="127.0.0.1", SLURM_JOB_ID=tag, SLURM_JOB_NODELIST="n[1-2]",
               KVF_HOME=repo_root())
    out = open(os.path.join(td, "job-%s.out" % tag), "w+")
    p = subprocess.Popen(["bash", SBATCH], env=env, stdout=out, stderr=subprocess.STDOUT,
                         text=True)
    p.out = out
    return p, port, pids


def output(p):
    with open(p.out.name) as f:
        return f.read()


def finish(p, timeout):
    try:
        p.wait(timeout=timeout)
        return output(p)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return output(p) + "\n(killed after %d s)" % timeout


def stop_steps(pids):
    """What Slurm does at the end of a job: stop the steps still running."""
    for n in os.listdir(pids):
        try:
            with open(os.path.join(pids, n)) as f:
                os.kill(int(f.read()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


INSECURE = [""]


def main():
    a = T.args()
    helptext = subprocess.run([os.path.join(a.fakebin, "kvf-proxy"), "--help"],
                              capture_output=True, text=True).stdout
    INSECURE[0] = "--insecure" if "--insecure" in helptext else ""
    cfg = os.path.join(repo_root(), "tests", "data", "models", "tiny-hybrid.config.json")
    td = tempfile.mkdtemp(prefix="kvf-sbatch.")
    model = os.path.join(td, "tiny-hybrid")
    subprocess.run([os.path.join(find_bin(), "kvf"), "mkmodel", "--config", cfg, "--out", model],
                   check=True, stdout=subprocess.DEVNULL)

    # 1. every decode step exits at once
    bad = os.path.join(td, "bad-decode")
    write(bad, "#!/bin/sh\necho 'kvf-decode: --model: cannot open model.safetensors' >&2\n"
               "exit 2\n")
    t0 = time.monotonic()
    p, _, pids = job(td, a.fakebin, model, bad, "a")
    out = finish(p, 60)
    stop_steps(pids)
    dt1 = time.monotonic() - t0
    T.check(p.returncode == 1 and "exited (status 2)" in out and "decode-" in out and
            "cannot open model.safetensors" in out and "did not come up" in out and dt1 < 20,
            "steps that exit at start-up fail the job in %.1f s with their log tail" % dt1, out)

    # 2. a decode step exits while the pool serves
    p, port, pids = job(td, a.fakebin, model, os.path.join(a.fakebin, "kvf-decode"), "b")
    try:
        wait_for(lambda: "kvferry ready:" in output(p) or p.poll() is not None, 30,
                 "the job's pool ready")
        T.check(p.poll() is None, "the job's pool came up")
        with open(os.path.join(pids, "decode-1")) as f:
            victim = int(f.read())
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        out = finish(p, 30)
        dt2 = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
        stop_steps(pids)
    T.check(p.returncode == 1 and "kvferry ready:" in out and
            "decode-1 exited (status 137)" in out and dt2 < 10,
            "a step that exits while serving fails the job in %.1f s" % dt2, out)

    # 3. the proxy stopped on purpose ends the job as completed
    p, port, pids = job(td, a.fakebin, model, os.path.join(a.fakebin, "kvf-decode"), "c")
    try:
        wait_for(lambda: "kvferry ready:" in output(p) or p.poll() is not None, 30,
                 "the job's pool ready")
        T.check(p.poll() is None, "the third job's pool came up")
        # the proxy is the batch script's own child (not a step)
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                              text=True).stdout.split()
        proxy = [int(k) for k in kids
                 if "kvf-proxy" in open("/proc/%s/cmdline" % k).read()]
        T.check(len(proxy) == 1, "found the job's proxy", kids)
        os.kill(proxy[0], signal.SIGTERM)
        out = finish(p, 30)
    finally:
        if p.poll() is None:
            p.kill()
        stop_steps(pids)
    T.check(p.returncode == 0 and "proxy exited (status 0)" in out,
            "a proxy stopped with SIGTERM ends the job with status 0", out)
    print("sbatch: start-up failure ends the job in %.1f s, a step lost while serving in "
          "%.1f s" % (dt1, dt2))


if __name__ == "__main__":
    main()
