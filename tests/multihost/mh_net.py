"""Test hosts on one machine: Linux network namespaces joined by veth pairs to a bridge.

    from mh_net import TestNet, skip
    with TestNet(3) as net:                 # hosts 0..2: 10.213.0.10, .11, .12
        net.spawn(1, ["kvf-prefill", ...])  # a daemon inside host 1
        net.run(0, ["ss", "-ltn"])               # a command inside host 0
        net.shape(2, rate_mbit=200, loss_pct=1)  # tbf cap + random loss
        net.link(2, up=False)               # cut host 2 off the bridge
        net.call(0, fn, *args)              # run fn with host 0's network (sockets made in fn)

Every run gets its own names, derived from the test process id: namespaces
`kvfmh<pid>-h<i>` and a switch namespace `kvfmh<pid>-sw` that holds the bridge.
The bridge and every veth live inside these namespaces, so the machine's own
network namespace never sees the test subnet and two runs in parallel cannot
collide, even with the same addresses. Host i's interface is `eth0` (inside its
namespace), its switch port `p<i>` (inside the switch namespace).

Teardown (close(), also on an exception, SIGTERM or SIGINT) kills every process
inside the namespaces, deletes them and removes the per-host /etc/netns files,
then checks that nothing is left: no namespace of this run, no process whose
network namespace is one of this run's (by inode), no link named after this
run in the machine's namespace. A reaper process, started with the hosts and
watching a pipe from the test, does the same teardown if the test process is
killed outright (SIGKILL by a ctest timeout).

Where namespaces cannot be made (not root, no CAP_SYS_ADMIN, no `ip`), the test
says why and exits 77, which ctest reports as skipped (SKIP_RETURN_CODE).
"""

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
SUBNET = "10.213.0"
CLONE_NEWNET = 0x40000000


def skip(why):
    """Report a skipped test (ctest SKIP_RETURN_CODE 77) with the reason."""
    print("SKIP: %s" % why, flush=True)
    sys.exit(SKIP)


def wait_for(cond, timeout, what="condition", interval=0.05):
    """Poll cond() until truthy (returned) or raise TimeoutError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def _ip(*args, check=True, ns=None):
    cmd = ["ip"] + (["-n", ns] if ns else []) + list(args)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), p.stderr.strip()))
    return p


def _netns_list():
    p = _ip("netns", "list", check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _ns_pids(ns):
    p = _ip("netns", "pids", ns, check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def _procs_in_netns(inodes):
    """Pids (other than ours) whose network namespace inode is in inodes."""
    out = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            if os.stat("/proc/%s/ns/net" % d).st_ino in inodes:
                out.append(int(d))
        except OSError:
            continue
    return out


def _kill_all(pids, grace=3.0):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            if not pids:
                return
            time.sleep(0.02)


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def teardown_tag(tag, inodes=()):
    """Kill every process in the namespaces named tag-*, delete them and their
    /etc/netns dirs. Returns a list of what is still left (empty when clean)."""
    names = [n for n in _netns_list() if n.startswith(tag + "-")]
    inodes = set(inodes)
    for n in names:
        try:
            inodes.add(os.stat("/run/netns/" + n).st_ino)
        except OSError:
            pass
    # Processes first (a namespace with a process in it outlives `ip netns del`).
    for _ in range(3):
        pids = sorted(set(_procs_in_netns(inodes)) | {p for n in names for p in _ns_pids(n)})
        pids = [p for p in pids if p != os.getpid()]
        if not pids:
            break
        _kill_all(pids)
    for n in names:
        _ip("netns", "del", n, check=False)
        shutil.rmtree("/etc/netns/" + n, ignore_errors=True)
    left = []
    left += ["namespace %s" % n for n in _netns_list() if n.startswith(tag + "-")]
    left += ["process %d in a test namespace" % p for p in _procs_in_netns(inodes)
             if _alive(p)]
    p = _ip("-o", "link", "show", check=False)
    left += ["link %s" % line.split(":")[1].strip() for line in p.stdout.splitlines()
             if tag in line]
    left += ["dir /etc/netns/%s" % d for d in (os.listdir("/etc/netns")
                                                if os.path.isdir("/etc/netns") else [])
             if d.startswith(tag + "-")]
    return left


class TestNet:
    """N test hosts (see the module docstring). Use as a context manager."""

    def __init__(self, n, names=None):
        self.n = n
        self.tag = "kvfmh%d" % os.getpid()
        self.sw = self.tag + "-sw"
        self.ns = ["%s-h%d" % (self.tag, i) for i in range(n)]
        self.names = names or ["h%d" % i for i in range(n)]   # host names (/etc/hosts)
        self.tmp = tempfile.mkdtemp(prefix=self.tag + ".")
        self.inodes = set()
        self.procs = []
        self._reaper = None
        self.closed = False

    # -- life cycle ---------------------------------------------------------
    def addr(self, i):
        return "%s.%d" % (SUBNET, 10 + i)

    def open(self):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if os.geteuid() != 0:
            skip("test hosts need root (network namespaces); running as uid %d" % os.geteuid())
        if shutil.which("ip") is None:
            skip("test hosts need the ip command (Debian package iproute2)")
        try:
            _ip("netns", "add", self.sw)
        except (RuntimeError, OSError) as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            skip("cannot create a network namespace here: %s" % e)
        self.inodes.add(os.stat("/run/netns/" + self.sw).st_ino)
        self._start_reaper()
        try:
            _ip("link", "add", "br0", "type", "bridge", ns=self.sw)
            _ip("link", "set", "br0", "up", ns=self.sw)
            _ip("link", "set", "lo", "up", ns=self.sw)
            hosts = "127.0.0.1 localhost\n" + "".join(
                "%s %s\n" % (self.addr(i), self.names[i]) for i in range(self.n))
            for i, ns in enumerate(self.ns):
                _ip("netns", "add", ns)
                self.inodes.add(os.stat("/run/netns/" + ns).st_ino)
                _ip("link", "add", "name", "eth0", "netns", ns, "type", "veth",
                    "peer", "name", "p%d" % i, "netns", self.sw)
                _ip("link", "set", "p%d" % i, "master", "br0", ns=self.sw)
                _ip("link", "set", "p%d" % i, "up", ns=self.sw)
                _ip("addr", "add", self.addr(i) + "/24", "dev", "eth0", ns=ns)
                _ip("link", "set", "eth0", "up", ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
                # `ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts:
                # every host resolves the others' names.
                os.makedirs("/etc/netns/" + ns, exist_ok=True)
                with open("/etc/netns/%s/hosts" % ns, "w") as f:
                    f.write(hosts)
        except BaseException:
            self.close(check=False)
            raise
        return self

    def _start_reaper(self):
        # Tears everything down when our end of the pipe closes (we died).
        r, w = os.pipe()
        self._reaper = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--reap", self.tag, self.tmp],
            stdin=r, start_new_session=True)
        os.close(r)
        self._reaper_w = w

    def close(self, check=True):
        """Tear down; with check, raise if anything is left behind."""
        if self.closed:
            return []
        self.closed = True
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        left = teardown_tag(self.tag, self.inodes)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                left.append("process %d (%s) did not exit" % (p.pid, p.args[:4]))
        if self._reaper is not None:
            os.close(self._reaper_w)       # the reaper finds nothing left and exits
            try:
                self._reaper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)
        if left:
            msg = "teardown left: " + "; ".join(left)
            print("mh_net: " + msg, flush=True)
            if check:
                raise AssertionError(msg)
        else:
            print("mh_net: teardown clean (no namespace, link or process left)", flush=True)
        return left

    def __enter__(self):
        self._old = {}
        for s in (signal.SIGTERM, signal.SIGINT):
            self._old[s] = signal.signal(s, self._on_signal)
        return self.open()

    def _on_signal(self, signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)

    def __exit__(self, et, ev, tb):
        try:
            self.close(check=et is None)
        finally:
            for s, h in self._old.items():
                signal.signal(s, h)
        return False

    # -- running things in hosts --------------------------------------------
    def cmd(self, i, argv, keep_sys=False):
        """argv run inside host i: `ip netns exec` (a /sys of the host's own, its
        /etc/hosts); keep_sys: the machine's /sys (cgroups) and the host's
        /etc/hosts, in a mount namespace of its own (nsenter --net)."""
        if not keep_sys:
            return ["ip", "netns", "exec", self.ns[i]] + list(argv)
        script = ('mount --bind /etc/netns/%s/hosts /etc/hosts && exec nsenter --net=/run/netns/%s '
                  '"$@"' % (self.ns[i], self.ns[i]))
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                "sh"] + list(argv)

    def run(self, i, argv, check=True, timeout=60, **kw):
        """Run argv inside host i and wait; returns CompletedProcess (text)."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        p = subprocess.run(self.cmd(i, argv), text=True, timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise RuntimeError("host %d: %s exited %d:\n%s%s" % (
                i, " ".join(argv), p.returncode, p.stdout, p.stderr))
        return p

    def spawn(self, i, argv, log=None, env=None, keep_sys=False):
        """Start a daemon inside host i (killed at teardown); log: file path."""
        out = open(log, "ab") if log else subprocess.DEVNULL
        p = subprocess.Popen(self.cmd(i, argv, keep_sys), stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        if log:
            out.close()
        self.procs.append(p)
        return p

    def call(self, i, fn, *args, **kw):
        """fn(*args, **kw) in a thread that joined host i's network namespace: the
        sockets fn makes live in host i. Returns fn's result or raises its exception."""
        res = {}

        def body():
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open("/run/netns/" + self.ns[i], os.O_RDONLY)
                try:
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns to %s" % self.ns[i])
                finally:
                    os.close(fd)
                res["v"] = fn(*args, **kw)
            except BaseException as e:     # re-raised in the caller
                res["e"] = e
        t = threading.Thread(target=body, daemon=True)
        t.start()
        t.join()
        if "e" in res:
            raise res["e"]
        return res.get("v")

    # -- ssh into the hosts -------------------------------------------------
    def start_sshd(self, hosts):
        """Run an OpenSSH server (port 22, the host's address only) in each of
        hosts, accepting a throw-away key made here. Returns the ssh command
        (a string, for KVF_SSH) that logs into them non-interactively."""
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        if not os.path.exists(sshd) or shutil.which("ssh-keygen") is None:
            skip("ssh deploy needs OpenSSH (Debian packages openssh-server, openssh-client)")
        key, hostkey = os.path.join(self.tmp, "id_ed25519"), os.path.join(self.tmp, "host_key")
        for k in (key, hostkey):
            if not os.path.exists(k):
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", k],
                               check=True, stdout=subprocess.DEVNULL)
        os.makedirs("/run/sshd", exist_ok=True)     # sshd's privilege separation dir
        for i in hosts:
            cfg = os.path.join(self.tmp, "sshd_config.%d" % i)
            with open(cfg, "w") as f:
                f.write("ListenAddress %s\nPort 22\nHostKey %s\nAuthorizedKeysFile %s.pub\n"
                        "PidFile none\nUsePAM no\nStrictModes no\n"
                        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                        "KbdInteractiveAuthentication no\nMaxStartups 100\nMaxSessions 100\n"
                        "LogLevel ERROR\n" % (self.addr(i), hostkey, key))
            self.spawn(i, [sshd, "-D", "-e", "-f", cfg],
                       log=os.path.join(self.tmp, "sshd.%d.log" % i))
        for i in hosts:
            wait_for(lambda: any(p == 22 for _, p, _ in self.listeners(i)), 10,
                     "sshd listening in host %d" % i)
        self.ssh = ("ssh -F /dev/null -i %s -o IdentitiesOnly=yes -o StrictHostKeyChecking=no "
                    "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR" % key)
        return self.ssh

    # -- network conditions -------------------------------------------------
    def link(self, i, up):
        """Connect (up) or cut (down) host i's switch port: the host keeps its address."""
        _ip("link", "set", "p%d" % i, "up" if up else "down", ns=self.sw)

    def has_netem(self):
        """Whether this kernel has the netem qdisc (delay); some do not (no sch_netem)."""
        if not hasattr(self, "_netem"):
            p = subprocess.run(["tc", "-n", self.sw, "qdisc", "add", "dev", "lo", "root",
                                "netem", "delay", "1ms"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
            self._netem = p.returncode == 0
            subprocess.run(["tc", "-n", self.sw, "qdisc", "del", "dev", "lo", "root"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self._netem

    def shape(self, i, rate_mbit=None, loss_pct=None, delay_ms=None):
        """Condition host i's link both ways; all None clears it.

        rate_mbit: a token-bucket cap (tc tbf) on host i's eth0 and on its switch
        port, so traffic to and from host i is capped. loss_pct: that share of
        the frames to and from host i dropped at random (nftables numgen in the
        switch's bridge; 100 drops everything while the link stays up).
        delay_ms: one-way delay each direction: tc netem on both ends, or, on a
        kernel without netem, iptables NFQUEUE rules on host i's eth0 (in and
        out) and mh_delay.py accepting each packet delay_ms later.
        """
        self._nfq_delay(i, None)
        netem = delay_ms is not None and self.has_netem()
        if delay_ms is not None and not netem:
            self._nfq_delay(i, delay_ms)
        for ns, dev in ((self.ns[i], "eth0"), (self.sw, "p%d" % i)):
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if netem:
                args = ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem",
                        "delay", "%gms" % delay_ms, "limit", "100000"]
                if rate_mbit is not None:
                    args += ["rate", "%gmbit" % rate_mbit]
            elif rate_mbit is not None:
                # burst: 32 KiB or 1 ms at the rate (tbf splits larger GSO frames);
                # latency: a long queue, so the cap delays rather than drops
                burst = max(32 * 1024, int(rate_mbit * 1e6 / 8 / 1000))
                args = ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                        "rate", "%gmbit" % rate_mbit, "burst", str(burst), "latency", "2s"]
            else:
                continue
            p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if p.returncode != 0:
                raise RuntimeError("%s: %s" % (" ".join(args), p.stderr.strip()))
        self._nft_loss(i, loss_pct)

    def _nfq_delay(self, i, delay_ms):
        procs = getattr(self, "_delayers", {})
        self._delayers = procs
        if i in procs:
            self.run(i, ["iptables", "-F"], check=False)
            if shutil.which("ip6tables"):
                self.run(i, ["ip6tables", "-F"], check=False)
            procs[i].terminate()
            procs[i].wait(timeout=10)
            del procs[i]
        if delay_ms is None:
            return
        if shutil.which("iptables") is None:
            raise RuntimeError("delay without netem needs iptables (Debian package iptables)")
        log = os.path.join(self.tmp, "delay.%d.log" % i)
        p = self.spawn(i, [sys.executable, os.path.join(os.path.dirname(
            os.path.abspath(__file__)), "mh_delay.py"), "0", "%g" % delay_ms], log=log)
        procs[i] = p
        wait_for(lambda: p.poll() is not None or "ready" in open(log).read(), 10,
                 "the delay queue in host %d" % i)
        if p.poll() is not None:
            raise RuntimeError("mh_delay.py failed: %s" % open(log).read())
        # IPv6 too: eth0 has a link-local address, and traffic over it (UCX's
        # TCP transport may pick it) would bypass IPv4-only rules undelayed
        tables = ["iptables"] + (["ip6tables"] if shutil.which("ip6tables") else [])
        for table in tables:
            for chain, io in (("OUTPUT", "-o"), ("INPUT", "-i")):
                self.run(i, [table, "-A", chain, io, "eth0", "-j", "NFQUEUE", "--queue-num",
                             "0", "--queue-bypass"])

    def delayed(self, i):
        """Packets sent through host i's delay queue so far (NFQUEUE rule counters;
        None with netem)."""
        if self.has_netem():
            return None
        out = self.run(i, ["iptables", "-L", "-v", "-n", "-x"], check=False).stdout
        if shutil.which("ip6tables"):
            out += self.run(i, ["ip6tables", "-L", "-v", "-n", "-x"], check=False).stdout
        return sum(int(line.split()[0]) for line in out.splitlines()
                   if "NFQUEUE" in line and line.split()[0].isdigit())

    def _nft_loss(self, i, loss_pct):
        table = "kvfmh_p%d" % i
        self.run_sw(["nft", "delete", "table", "bridge", table], check=False)
        if not loss_pct:
            for ns, dev in ((self.ns[i], "eth0"), (self.sw, "p%d" % i)):
                _ip("link", "set", "dev", dev, "gso_max_segs", "65535", ns=ns)
            return
        if shutil.which("nft") is None:
            raise RuntimeError("packet loss needs the nft command (Debian package nftables)")
        per_mille = int(round(loss_pct * 10))
        # one frame = one MTU-sized packet (no 64 KiB GSO frames), so the
        # share applies to packets as TCP sees them
        for ns, dev in ((self.ns[i], "eth0"), (self.sw, "p%d" % i)):
            _ip("link", "set", "dev", dev, "gso_max_segs", "1", ns=ns)
        rules = ("table bridge %s {\n chain shape {\n"
                 "  type filter hook forward priority 0; policy accept;\n"
                 "  oifname \"p%d\" numgen random mod 1000 < %d counter drop\n"
                 "  iifname \"p%d\" numgen random mod 1000 < %d counter drop\n"
                 " }\n}\n" % (table, i, per_mille, i, per_mille))
        p = subprocess.run(["ip", "netns", "exec", self.sw, "nft", "-f", "-"], input=rules,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise RuntimeError("nft loss rule for host %d: %s" % (i, p.stderr.strip()))

    def dropped(self, i):
        """Frames dropped so far by host i's loss rule (nft counters)."""
        p = self.run_sw(["nft", "list", "table", "bridge", "kvfmh_p%d" % i], check=False)
        return sum(int(x) for x in
                   re.findall(r"counter packets (\d+)", p.stdout))

    def run_sw(self, argv, check=True):
        p = subprocess.run(["ip", "netns", "exec", self.sw] + list(argv), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=30)
        if check and p.returncode != 0:
            raise RuntimeError("switch: %s: %s" % (" ".join(argv), p.stderr.strip()))
        return p

    def listeners(self, i):
        """(address, port, process name) of every listening TCP socket in host i."""
        p = self.run(i, ["ss", "-Hltnp"], check=False)
        out = []
        for line in p.stdout.splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue
            local = parts[3]
            addr, _, port = local.rpartition(":")
            proc = ""
            if "users:((" in line:
                proc = line.split('users:(("', 1)[1].split('"', 1)[0]
            out.append((addr.strip("[]"), int(port), proc))
        return out


def _reap_main(tag, tmp):
    # Block until the test's end of the pipe closes, then clean up after it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        sys.stdin.buffer.read()
    except OSError:
        pass
    left = teardown_tag(tag)
    shutil.rmtree(tmp, ignore_errors=True)
    if left:
        print("mh_net reaper: left behind: %s" % "; ".join(left), file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--reap":
        _reap_main(sys.argv[2], sys.argv[3])
    else:
        print("usage: mh_net.py --reap TAG TMPDIR (internal)", file=sys.stderr)
        sys.exit(2)
