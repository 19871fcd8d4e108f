"""The proxy follows DNS: the Helm chart's endpoint names go through the system
resolver (getaddrinfo: /etc/resolv.conf, search domains, ndots) to a DNS server
this test runs, as in a pod with cluster DNS (issue 32 item 4).

The test re-runs itself in a network and mount namespace of its own (unshare;
it ends with the test's processes): loopback up, /etc/resolv.conf,
/etc/nsswitch.conf and /etc/hosts bind-mounted to files naming the test's DNS
server (a UDP responder written here, on 127.0.0.53:53, authoritative for
default.svc.cluster.local, as a pod's resolv.conf has it: search domains,
ndots:5).

1. deploy/helm/kvferry rendered with 8 prefill (maxReplicas 9) and 12 decode
   replicas; its endpoints ConfigMap (9 + 12 pod names) given to kvf-proxy as
   they are (--prefill-file/--decode-file). 20 fake daemons, each on its own
   address (127.0.10.x, 127.0.20.x), with A records for their pod names.
   The proxy reports all 20 healthy, each at its record's address, having
   asked the DNS server for every name; the ninth prefill name, with no
   record (no pod), is unhealthy with the name and the resolver's reason, and
   a completion is served with the others.
2. The StatefulSet grows: prefill-8 gets a daemon and a record; the same
   proxy finds it healthy.
3. A pod moves: decode-5's record changes to another address, where another
   daemon listens, while the old one still answers; the proxy follows the
   record (its address and engine id in /health) and serves a completion.
4. A record disappears (DNS outage for decode-7): the last address is kept,
   the instance stays healthy, the resolver's error is shown.
Without root or unshare the test reports skipped (exit 77), never passed.

Rerun:
  python3 tests/deploy/test_proxy_dns.py --fakebin build/tests/fakebin \
      --testbin build/tests/bin
"""

import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
from collections import Counter

import proxy_testlib as T
from helm_chart import render_chart
from kvf_e2e import wait_for

SKIP = 77
CHART = os.path.join(os.environ.get("KVF_SOURCE_DIR") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "deploy", "helm", "kvferry")
NP, NP_MAX, ND = 8, 9, 12
DNS_ADDR = "127.0.0.53"
DOMAIN = "default.svc.cluster.local"
INSIDE = "PROXY_DNS_TEST_INSIDE"   # not KVF_*: the programs check those


def skip(why):
    print("SKIP: %s" % why, flush=True)
    sys.exit(SKIP)


class FakeDNS:
    """A UDP DNS responder for A records (RFC 1035 §4): NXDOMAIN for unknown names,
    an empty answer for other types of known names, TTL 0. Counts queries by name."""

    def __init__(self, addr):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((addr, 53))
        self.sock.settimeout(0.1)
        self.lock = threading.Lock()
        self.records = {}
        self.queries = Counter()
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def set(self, name, ip):
        with self.lock:
            if ip is None:
                self.records.pop(name.lower(), None)
            else:
                self.records[name.lower()] = ip

    def asked(self, name):
        with self.lock:
            return self.queries[name.lower()]

    def _answer(self, q):
        if len(q) < 12:
            return None
        qid, flags, qdcount = struct.unpack(">HHH", q[:6])
        i, labels = 12, []
        while i < len(q) and q[i] != 0 and not q[i] & 0xC0:
            labels.append(q[i + 1:i + 1 + q[i]].decode("ascii", "replace"))
            i += 1 + q[i]
        if qdcount != 1 or i + 5 > len(q) or q[i] != 0:
            return struct.pack(">HHHHHH", qid, 0x8001, 0, 0, 0, 0)     # FORMERR
        qtype, qclass = struct.unpack(">HH", q[i + 1:i + 5])
        name = ".".join(labels).lower()
        with self.lock:
            self.queries[name] += 1
            ip = self.records.get(name)
        answers = []
        if ip is not None and qtype == 1 and qclass == 1:
            answers.append(struct.pack(">HHHIH", 0xC00C, 1, 1, 0, 4) + socket.inet_aton(ip))
        rcode = 0 if ip is not None else 3
        # QR, the query's opcode and RD, AA, RA
        rflags = 0x8000 | (flags & 0x7900) | 0x0400 | 0x0080 | rcode
        return (struct.pack(">HHHHHH", qid, rflags, 1, len(answers), 0, 0) + q[12:i + 5] +
                b"".join(answers))

    def _serve(self):
        while not self.stopping:
            try:
                q, peer = self.sock.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            r = self._answer(q)
            if r is not None:
                self.sock.sendto(r, peer)

    def stop(self):
        self.stopping = True
        self.thread.join(5)
        self.sock.close()


def enter_namespace():
    """Re-run this script in a new network and mount namespace; exit with its status."""
    if os.geteuid() != 0:
        skip("the namespace needs root; running as uid %d" % os.geteuid())
    for tool in ("unshare", "mount", "ip"):
        if shutil.which(tool) is None:
            skip("no %s command here (util-linux / iproute2)" % tool)
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True,
                           text=True, timeout=30)
    if probe.returncode != 0:
        skip("cannot make a network and mount namespace here: %s" % probe.stderr.strip())
    env = dict(os.environ, **{INSIDE: "1"})
    rc = subprocess.call(["unshare", "--net", "--mount", "--propagation", "private", "--",
                          sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env)
    sys.exit(rc)


def setup_inside(tmp):
    """Loopback up; resolv.conf, nsswitch.conf and hosts of this namespace bind-mounted."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
    files = {
        "/etc/resolv.conf": "nameserver %s\nsearch %s svc.cluster.local cluster.local\n"
                            "options ndots:5 timeout:1 attempts:2\n" % (DNS_ADDR, DOMAIN),
        "/etc/nsswitch.conf": "hosts: files dns\n",
        "/etc/hosts": "127.0.0.1 localhost\n",
    }
    for target, text in files.items():
        src = os.path.join(tmp, os.path.basename(target))
        with open(src, "w") as f:
            f.write(text)
        if not os.path.exists(target):
            skip("%s does not exist to bind-mount over" % target)
        subprocess.run(["mount", "--bind", src, target], check=True, timeout=30)


def run(a, procs, tmp):
    setup_inside(tmp)
    dns = FakeDNS(DNS_ADDR)
    try:
        body(a, procs, tmp, dns)
    finally:
        procs.stop_all()
        dns.stop()


def body(a, procs, tmp, dns):
    docs = render_chart(CHART, {"prefill": {"replicas": NP, "maxReplicas": NP_MAX},
                                "decode": {"replicas": ND, "maxReplicas": ND}})
    (cm,) = [d for _, d in docs if d["kind"] == "ConfigMap"]
    urls = {r: cm["data"][r].split() for r in ("prefill", "decode")}
    T.check(len(urls["prefill"]) == NP_MAX and len(urls["decode"]) == ND,
            "the chart lists %d prefill and %d decode pod names" % (NP_MAX, ND))

    def host(url):
        return re.match(r"tcp://([^:]+):\d+$", url).group(1)

    def port(url):
        return int(url.rsplit(":", 1)[1])

    pods = {}   # url -> (role, ordinal, ip)
    for role, net in (("prefill", 10), ("decode", 20)):
        for i, url in enumerate(urls[role]):
            pods[url] = (role, i, "127.0.%d.%d" % (net, i + 1))

    def start_pod(url, ip, engine):
        role = pods[url][0]
        return procs.start(engine, [os.path.join(a.testbin, "kvf_fake_daemon"), "--role", role,
                                    "--listen", "tcp://%s:%d" % (ip, port(url)),
                                    "--engine-id", engine])

    old = {}
    for url, (role, i, ip) in pods.items():
        if role == "prefill" and i >= NP:
            continue                                 # maxReplicas: no pod yet, no record
        old[url] = start_pod(url, ip, host(url).split(".")[0])
        dns.set("%s.%s" % (host(url), DOMAIN), ip)
    # the test's own lookups go through the same resolver
    probe = urls["decode"][0]
    got = socket.getaddrinfo(host(probe), port(probe), socket.AF_INET, socket.SOCK_STREAM)
    T.check(got[0][4][0] == pods[probe][2] and dns.asked("%s.%s" % (host(probe), DOMAIN)) >= 1,
            "getaddrinfo(%s) in this namespace asks the test's DNS server: %s" %
            (host(probe), got[0][4][0]))

    files = {}
    for role in ("prefill", "decode"):
        files[role] = os.path.join(tmp, role)
        with open(files[role], "w") as f:
            f.write(cm["data"][role])           # the ConfigMap's file, names as they are
    _, px = T.start_proxy(procs, a.fakebin, "", "",
                          ["--prefill-file", files["prefill"], "--decode-file", files["decode"],
                           "--model-name", "m", "--health-interval", "100ms"])

    def insts():
        st, h = px.health()
        return st, {i["url"]: i for r in ("prefill", "decode") for i in h[r]}

    def healthy():
        return sum(i["healthy"] for i in insts()[1].values())

    wait_for(lambda: healthy() == NP + ND, 30, "%d instances healthy" % (NP + ND))
    st, by = insts()
    wrong = ["%s at %s" % (u, by[u]["address"]) for u in old
             if by[u]["address"] != "tcp://%s:%d" % (pods[u][2], port(u))]
    T.check(st == 200 and not wrong and
            all(dns.asked("%s.%s" % (host(u), DOMAIN)) >= 1 for u in urls["prefill"] +
                urls["decode"]),
            "all %d healthy, each at its A record's address, every name asked of the DNS "
            "server" % (NP + ND), wrong)
    missing = urls["prefill"][NP]
    m = by[missing]
    T.check(not m["healthy"] and m["address"] is None and
            host(missing) in m.get("resolve_error", "") and
            "does not resolve" in m.get("resolve_error", "") and
            host(missing) in m.get("error", ""),
            "the name with no record is unhealthy, /health names it and why: %s" %
            m.get("resolve_error"), m)
    r = px.complete("hello", max_tokens=3)
    T.check(r["choices"][0]["finish_reason"] in ("length", "stop"),
            "a completion is served with the others")

    # 2. the StatefulSet grows: prefill-8's pod and record appear
    ip8 = pods[missing][2]
    start_pod(missing, ip8, host(missing).split(".")[0])
    dns.set("%s.%s" % (host(missing), DOMAIN), ip8)
    wait_for(lambda: insts()[1][missing]["healthy"], 15, "the new prefill pod healthy")
    m = insts()[1][missing]
    T.check(m["address"] == "tcp://%s:%d" % (ip8, port(missing)) and "resolve_error" not in m,
            "the grown StatefulSet's pod is found by the running proxy at %s" % m["address"], m)

    # 3. a pod moves: decode-5 comes back at another address; the old one still answers
    moved = urls["decode"][5]
    new_ip = "127.0.21.6"
    start_pod(moved, new_ip, "kvferry-decode-5-moved")
    dns.set("%s.%s" % (host(moved), DOMAIN), new_ip)
    want = "tcp://%s:%d" % (new_ip, port(moved))
    wait_for(lambda: (lambda i: i["healthy"] and i["address"] == want and
                      i["engine_id"] == "kvferry-decode-5-moved")(insts()[1][moved]),
             15, "the proxy follows decode-5 to %s" % want)
    T.check(old[moved].poll() is None and healthy() == NP_MAX + ND,
            "decode-5 followed to %s while its old address still answers; all %d healthy" %
            (want, NP_MAX + ND))
    r = px.complete("hello again", max_tokens=3)
    T.check(r["choices"][0]["finish_reason"] in ("length", "stop"),
            "a completion is served after the move")

    # 4. a record disappears: the last address is kept, the error shown
    gone = urls["decode"][7]
    dns.set("%s.%s" % (host(gone), DOMAIN), None)
    wait_for(lambda: "resolve_error" in insts()[1][gone], 15, "decode-7's resolution error")
    g = insts()[1][gone]
    T.check(g["healthy"] and g["address"] == "tcp://%s:%d" % (pods[gone][2], port(gone)) and
            host(gone) in g["resolve_error"],
            "a name that stops resolving keeps its address and stays healthy; /health: %s" %
            g["resolve_error"], g)
    print("dns: %d instances discovered through the resolver, one grown, one moved" %
          (NP_MAX + ND))


def main():
    if os.environ.pop(INSIDE, None) != "1":
        enter_namespace()
    T.run_with_procs(run)


if __name__ == "__main__":
    main()
