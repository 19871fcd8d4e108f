#!/usr/bin/env python3
"""deploy/examples/slurm/kvferry.sbatch on a real Slurm cluster of test hosts.

slurmctld and munged on h0, one slurmd on each of h1 and h2 (Debian's
packages, mh_slurm.SlurmCluster). The unchanged example script is submitted
with sbatch on these CPU nodes (no GPUs requested: PREFILL_GPUS/DECODE_GPUS
unset); it must

 1. bring up the TP4 prefill on one node and both TP2 decode instances on the
    other (checked by each process's network namespace), the proxy on the
    batch node;
 2. serve prompts through the proxy with the colocated run's tokens (KV over
    UCX TCP between the nodes: UCX_TLS=tcp,self, exported by sbatch);
 3. clean up when the job ends (here: its proxy exits, so the batch script
    returns) and when it is cancelled (scancel): no daemon left on any node.
"""

import os
import signal
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

from mh_net import TestNet, wait_for  # noqa: E402
from mh_slurm import SlurmCluster  # noqa: E402
from test_mh_pool import PROMPTS, NsProxy, check_answer, long_reference  # noqa: E402
from kvf_e2e import find_bin, repo_root  # noqa: E402

SBATCH = os.path.join(repo_root(), "deploy", "examples", "slurm", "kvferry.sbatch")
# every daemon gone this long after the job ends or is cancelled (KillWait=5)
CLEANUP_BOUND_S = 15


def daemons(net, hosts):
    """{host: [(pid, program)]} of the kvf-* processes in those hosts."""
    out = {}
    inodes = {os.stat("/run/netns/" + net.ns[h]).st_ino: h for h in hosts}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ino = os.stat("/proc/%s/ns/net" % d).st_ino
            if ino not in inodes:
                continue
            exe = os.path.basename(os.readlink("/proc/%s/exe" % d))
        except OSError:
            continue
        if exe.startswith("kvf-"):
            out.setdefault(inodes[ino], []).append((int(d), exe))
    return out


def submit(cluster, net, model, job_tag, base):
    run = os.path.join(net.tmp, "run-" + job_tag)
    out = os.path.join(net.tmp, "job-%s.out" % job_tag)
    env = {"KVF_HOME": repo_root(), "BIN_DIR": find_bin(), "MODEL": model, "RUN": run,
           "PORT": "8000", "BASE": str(base), "UCX_TLS": "tcp,self", "HOME": net.tmp}
    job = cluster.sbatch(["--output", out, "--chdir", net.tmp, SBATCH], env)
    t0 = time.monotonic()

    def ready():
        st = cluster.state(job)
        if st not in ("PENDING", "RUNNING", "CONFIGURING"):
            raise AssertionError("job %s is %s before the pool came up:\n%s\n%s" % (
                job, st, open(out).read() if os.path.exists(out) else "", cluster.logs()))
        return os.path.exists(out) and "kvferry ready:" in open(out).read()
    wait_for(ready, 90, "job %s to print 'kvferry ready'" % job, interval=0.2)
    line = [ln for ln in open(out).read().splitlines() if ln.startswith("kvferry ready:")][0]
    print("job %s: %s after %.1f s" % (job, line, time.monotonic() - t0), flush=True)
    return job, line, run


def check_pool(cluster, net, job, line, refs):
    nodes = cluster.job_nodes(job)
    assert nodes == ["h1", "h2"], nodes
    # the batch script runs on the first node: the proxy and prefill there
    assert line.endswith("http://h1:8000"), line
    d = daemons(net, [1, 2])
    progs = {h: sorted(p for _, p in d.get(h, [])) for h in (1, 2)}
    assert progs == {1: ["kvf-prefill", "kvf-proxy"], 2: ["kvf-decode", "kvf-decode"]}, progs
    proxy = NsProxy(net, 0, net.addr(1), 8000)
    proxy.model_name = proxy.models()["data"][0]["id"]
    served = set()
    for k, prompt in enumerate(PROMPTS):
        for _ in range(2):
            check_answer(proxy, refs, prompt, "slurm job %s prompt %d" % (job, k))
    for _ in range(2):
        served.add(proxy.complete(PROMPTS[0], max_tokens=2, temperature=0)["decode_instance"])
    assert len(served) == 2, served          # round robin over both decode instances
    return d


def wait_clean(net, what):
    t0 = time.monotonic()
    wait_for(lambda: not daemons(net, [1, 2]), CLEANUP_BOUND_S,
             "no kvf daemon left on the nodes after %s (left: %s)" % (
                 what, daemons(net, [1, 2])), interval=0.1)
    return time.monotonic() - t0


def main():
    host = socket.gethostname().split(".")[0]
    with TestNet(3, names=["h0 " + host, "h1", "h2"]) as net:
        from e2e_models import model_dir
        model = model_dir("tiny-hybrid")
        refs = {p: long_reference(net, model, p) for p in PROMPTS}
        cluster = SlurmCluster(net, 0, [1, 2]).start()
        try:
            # 1. a job that ends: its proxy exits, the batch script returns
            job, line, run = submit(cluster, net, model, "end", 20000)
            d = check_pool(cluster, net, job, line, refs)
            proxy_pid = [pid for pid, p in d[1] if p == "kvf-proxy"][0]
            os.kill(proxy_pid, signal.SIGTERM)
            state = cluster.wait_state(job, ("COMPLETED", "FAILED"), 30)
            end_s = wait_clean(net, "the job ended")
            print("job %s ended (%s): every daemon gone %.2f s later" % (job, state, end_s),
                  flush=True)
            # 2. a job that is cancelled
            job, line, run = submit(cluster, net, model, "cancel", 20100)
            check_pool(cluster, net, job, line, refs)
            t0 = time.monotonic()
            cluster.scancel(job)
            cluster.wait_state(job, "CANCELLED", 30)
            cancel_s = wait_clean(net, "scancel")
            print("job %s cancelled: every daemon gone %.2f s after scancel (%.2f s after "
                  "Slurm reported CANCELLED)" % (job, time.monotonic() - t0, cancel_s),
                  flush=True)
        except BaseException:
            print(cluster.logs())
            raise
    print("test_mh_slurm passed")


if __name__ == "__main__":
    main()
