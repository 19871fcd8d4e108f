"""The proxy discovers a pool from endpoint files, past the 255-character option
(issue 32 item 4; the Helm chart's endpoints ConfigMap).

1. deploy/helm/kvferry rendered with 8 prefill and 12 decode replicas
   (Helm's engine, tests/deploy/helm_chart.py): its endpoints ConfigMap lists 8 + 12 stable
   names, one per line, which as one --prefill/--decode option would pass 255
   characters.
2. 8 prefill and 12 decode fake daemons on this machine; the ConfigMap's files
   written with each pod's DNS name replaced by the fake's address (what the
   cluster DNS would answer), in the same layout (plus a comment line). A
   kvf-proxy started with --prefill-file/--decode-file reports all 20 healthy in
   /health and serves a completion.
3. --prefill with --prefill-file, and an unreadable --decode-file, are refused
   naming the flags and the path.

Rerun:
  python3 tests/deploy/test_proxy_endpoint_files.py --fakebin build/tests/fakebin \
      --testbin build/tests/bin
"""

import os
import re
import subprocess

import proxy_testlib as T
from helm_chart import render_chart
from kvf_e2e import free_port_range, wait_for

CHART = os.path.join(os.environ.get("KVF_SOURCE_DIR") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "deploy", "helm", "kvferry")
NP, ND = 8, 12


def run(a, procs, tmp):
    docs = render_chart(CHART, {"prefill": {"replicas": NP, "maxReplicas": NP},
                                "decode": {"replicas": ND, "maxReplicas": ND}})
    (cm,) = [d for _, d in docs if d["kind"] == "ConfigMap"]
    names = {r: cm["data"][r].split() for r in ("prefill", "decode")}
    T.check(len(names["prefill"]) == NP and len(names["decode"]) == ND and
            len(",".join(names["decode"])) > 255,
            "the chart lists %d + %d stable names (the decode list alone is %d characters)" %
            (NP, ND, len(",".join(names["decode"]))))

    base = free_port_range(NP + ND)
    files, addr = {}, {}
    for role, n, off in (("prefill", NP, 0), ("decode", ND, NP)):
        lines = ["# %s endpoints, as the chart's ConfigMap lists them" % role]
        for i, name in enumerate(names[role]):
            host = re.match(r"tcp://([^:]+):\d+$", name).group(1)
            port = base + off + i
            addr[host] = "tcp://127.0.0.1:%d" % port   # the DNS record, faked
            T.start_fake(procs, a.testbin, role, host.split(".")[0], port)
            lines.append(addr[host])
        files[role] = os.path.join(tmp, role)
        with open(files[role], "w") as f:
            f.write("\n".join(lines) + "\n")
    _, px = T.start_proxy(procs, a.fakebin, "", "",
                          ["--prefill-file", files["prefill"], "--decode-file", files["decode"],
                           "--model-name", "m", "--health-interval", "100ms"])
    wait_for(lambda: px.health()[0] == 200 and
             sum(i["healthy"] for r in ("prefill", "decode") for i in px.health()[1][r]) ==
             NP + ND, 30, "all %d instances healthy" % (NP + ND))
    h = px.health()[1]
    T.check([i["url"] for i in h["prefill"]] == [addr[re.match(r"tcp://([^:]+)", n).group(1)]
                                                 for n in names["prefill"]] and
            len(h["decode"]) == ND,
            "the proxy discovered all %d prefill and %d decode instances from the files, in "
            "the ConfigMap's order" % (NP, ND))
    r = px.complete("hello", max_tokens=3)
    T.check(r["choices"][0]["finish_reason"] in ("length", "stop"), "a completion is served")

    exe = os.path.join(a.fakebin, "kvf-proxy")
    p = subprocess.run([exe, "--port", "0", "--insecure", "--prefill", addr[list(addr)[0]],
                        "--prefill-file", files["prefill"], "--decode-file", files["decode"]],
                       capture_output=True, text=True, timeout=30)
    T.check(p.returncode != 0 and "--prefill and --prefill-file" in p.stderr,
            "--prefill with --prefill-file is refused by name", p.stderr[-300:])
    p = subprocess.run([exe, "--port", "0", "--insecure", "--prefill-file", files["prefill"],
                        "--decode-file", os.path.join(tmp, "nope")],
                       capture_output=True, text=True, timeout=30)
    T.check(p.returncode != 0 and "--decode-file" in p.stderr and "nope" in p.stderr,
            "an unreadable --decode-file is named with its path", p.stderr[-300:])


def main():
    T.run_with_procs(run)


if __name__ == "__main__":
    main()
