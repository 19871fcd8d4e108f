"""A small Slurm cluster on test hosts (mh_net.TestNet), from Debian's packages.

    cluster = SlurmCluster(net, ctl=0, nodes=[1, 2]).start()
    job = cluster.sbatch(script, env)        # job id
    cluster.wait_state(job, "RUNNING")
    cluster.scancel(job)

One munged (its own key and socket in the test's temp dir; the socket is a
file, so every test host reaches it), slurmctld in host `ctl`, one slurmd per
node host (node names h1, h2, ... with the hosts' addresses). Everything runs
as root with its own slurm.conf (SLURM_CONF); nothing of the machine's own
Slurm or munge configuration is read or changed. No cgroups, no accounting:
proctrack/linuxproc, task/none. The daemons die with the test hosts.
"""

import os
import shutil
import socket
import subprocess

from mh_net import skip, wait_for


class SlurmCluster:
    def __init__(self, net, ctl, nodes, cpus=2):
        self.net, self.ctl, self.nodes, self.cpus = net, ctl, nodes, cpus
        self.dir = os.path.join(net.tmp, "slurm")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.sock = os.path.join(self.dir, "munge.socket")

    def node_name(self, i):
        return self.net.names[i]

    def env(self, extra=None):
        e = dict(os.environ, SLURM_CONF=self.conf)
        e.update(extra or {})
        return e

    def start(self):
        for exe in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol"):
            if shutil.which(exe) is None and not os.path.exists("/usr/sbin/" + exe):
                skip("a Slurm cluster needs %s (Debian packages slurmctld, slurmd, "
                     "slurm-client, munge)" % exe)
        os.makedirs(os.path.join(self.dir, "state"), exist_ok=True)
        for i in self.nodes:
            os.makedirs(os.path.join(self.dir, "spool-" + self.node_name(i)), exist_ok=True)
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        os.chmod(self.dir, 0o755)
        self.net.spawn(self.ctl, ["/usr/sbin/munged", "-F", "--force", "--socket", self.sock,
                                  "--key-file", key, "--pid-file",
                                  os.path.join(self.dir, "munged.pid"),
                                  "--log-file", os.path.join(self.dir, "munged.log"),
                                  "--seed-file", os.path.join(self.dir, "munged.seed")],
                       log=os.path.join(self.dir, "munged.out"))
        wait_for(lambda: os.path.exists(self.sock), 10, "munged's socket")
        host = socket.gethostname().split(".")[0]
        d = self.dir
        lines = [
            "ClusterName=kvfmh",
            "SlurmctldHost=%s(%s)" % (host, self.net.addr(self.ctl)),
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            "AuthInfo=socket=%s" % self.sock,
            "StateSaveLocation=%s/state" % d,
            "SlurmdSpoolDir=%s/spool-%%n" % d,
            "SlurmctldPidFile=%s/slurmctld.pid" % d,
            "SlurmdPidFile=%s/slurmd-%%n.pid" % d,
            "SlurmctldLogFile=%s/slurmctld.log" % d,
            "SlurmdLogFile=%s/slurmd-%%n.log" % d,
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
            "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5",
            "MinJobAge=300", "SlurmctldDebug=info", "SlurmdDebug=info",
        ]
        for i in self.nodes:
            lines.append("NodeName=%s NodeAddr=%s CPUs=%d RealMemory=1000 State=UNKNOWN"
                         % (self.node_name(i), self.net.addr(i), self.cpus))
        lines.append("PartitionName=test Nodes=%s Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=FORCE:4" % ",".join(self.node_name(i) for i in self.nodes))
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        env = self.env()
        self.net.spawn(self.ctl, ["/usr/sbin/slurmctld", "-D", "-i", "-f", self.conf],
                       log=os.path.join(d, "slurmctld.out"), env=env)
        slurmds = []
        for i in self.nodes:
            # keep_sys: `ip netns exec` would mount a fresh /sys without the
            # cgroup tree, which slurmd's cgroup plugin needs even here
            slurmds.append(self.net.spawn(i, [
                "/usr/sbin/slurmd", "-D", "-N", self.node_name(i), "-f", self.conf],
                keep_sys=True,
                log=os.path.join(d, "slurmd-%d.out" % i), env=env))

        def idle():
            for p in slurmds:
                if p.poll() is not None:
                    raise RuntimeError("slurmd exited (%s):\n%s" % (p.returncode, self.logs()))
            p = self.net.run(self.ctl, ["sinfo", "-h", "-N", "-o", "%N %T"], check=False,
                             env=env, timeout=20)
            states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
            return (len(states) == len(self.nodes) and
                    all(s.rstrip("*") == "idle" for s in states.values()))
        try:
            wait_for(idle, 40, "every slurmd registered and idle", interval=0.3)
        except TimeoutError:
            print(self.logs())
            raise
        return self

    def logs(self):
        out = []
        for fn in sorted(os.listdir(self.dir)):
            if fn.endswith(".log") or fn.endswith(".out"):
                with open(os.path.join(self.dir, fn), errors="replace") as f:
                    out.append("--- %s\n%s" % (fn, f.read()[-2000:]))
        return "\n".join(out)

    def cmd(self, argv, env=None, check=True):
        return self.net.run(self.ctl, argv, check=check, env=self.env(env), timeout=30)

    def sbatch(self, argv, env=None):
        p = self.cmd(["sbatch", "--parsable"] + list(argv), env)
        return p.stdout.strip().split(";")[0]

    def state(self, job):
        p = self.cmd(["scontrol", "-o", "show", "job", job], check=False)
        for tok in p.stdout.split():
            if tok.startswith("JobState="):
                return tok.split("=", 1)[1]
        return None

    def job_nodes(self, job):
        p = self.cmd(["scontrol", "-o", "show", "job", job])
        for tok in p.stdout.split():
            if tok.startswith("NodeList="):
                nl = tok.split("=", 1)[1]
                return self.cmd(["scontrol", "show", "hostnames", nl]).stdout.split()
        return []

    def wait_state(self, job, states, timeout):
        states = (states,) if isinstance(states, str) else tuple(states)
        return wait_for(lambda: self.state(job) in states and self.state(job), timeout,
                        "job %s in state %s" % (job, "/".join(states)), interval=0.2)

    def scancel(self, job):
        self.cmd(["scancel", job])
