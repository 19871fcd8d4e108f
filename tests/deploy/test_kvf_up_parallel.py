"""Three `kvf-up --base-port auto` started at the same moment all come up
healthy, 10 rounds in a row, on three different port ranges (fake daemons;
the real proxy, kvf-up and kvf-down).

Before the ports were reserved under a lock, the three picked the same first
free range (each checked it free before any daemon had bound it) and two of
them failed "Address already in use". Now each pick happens under an
exclusive lock in $KVF_PORT_DIR and is recorded there while the pool lives;
this test also checks that a reservation outlives kvf-up (the pool's pids
hold it) and is dropped once the pool is down.

Prints the time each round took; rerun:
  python3 tests/deploy/test_kvf_up_parallel.py --fakebin build/tests/fakebin \
      --testbin build/tests/bin
"""

import json
import os
import subprocess
import tempfile
import time

import proxy_testlib as T
from kvf_e2e import find_bin

ROUNDS = 10
POOLS = 3


def health(url):
    import http.client
    host, port = url[len("http://"):].rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=5)
    c.request("GET", "/health")
    r = c.getresponse()
    return r.status, json.loads(r.read())


def pool_env(run_dir):
    with open(os.path.join(run_dir, "pool.env")) as f:
        return dict(line.strip().split("=", 1) for line in f if "=" in line)


def main():
    a = T.args()
    binp = find_bin()
    cfg = os.path.join(os.environ.get("KVF_SOURCE_DIR", "."), "tests", "data", "models",
                       "tiny-hybrid.config.json")
    top = tempfile.mkdtemp(prefix="kvf-up-par.")
    model = os.path.join(top, "tiny-hybrid")
    subprocess.run([os.path.join(binp, "kvf"), "mkmodel", "--config", cfg, "--out", model],
                   check=True, stdout=subprocess.DEVNULL)
    up = os.path.join(a.fakebin, "kvf-up")
    down = os.path.join(a.fakebin, "kvf-down")
    port_dir = os.environ.get("KVF_PORT_DIR", "/tmp/kvf-ports")
    times = []
    for rnd in range(ROUNDS):
        dirs = [os.path.join(top, "r%d-%d" % (rnd, k)) for k in range(POOLS)]
        t0 = time.monotonic()
        procs = [subprocess.Popen([up, "--layout", "1p1d", "--model", model, "--run-dir", d,
                                   "--bin", a.fakebin, "--port", "0", "--timeout", "30"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for d in dirs]
        outs = [p.communicate(timeout=60) for p in procs]
        dt = time.monotonic() - t0
        try:
            for k, (p, (out, err)) in enumerate(zip(procs, outs)):
                T.check(p.returncode == 0 and out.strip().startswith("http://"),
                        "round %d: kvf-up %d of %d started at once is healthy" % (rnd, k, POOLS),
                        err)
            envs = [pool_env(d) for d in dirs]
            for e in envs:
                st, h = health(e["PROXY_URL"])
                T.check(st == 200 and all(i["healthy"] for i in h["prefill"] + h["decode"]),
                        "round %d: %s answers /health 200" % (rnd, e["PROXY_URL"]))
            bases = sorted(int(e["PREFILL"].rsplit(":", 1)[1]) for e in envs)
            T.check(len(set(bases)) == POOLS and all(b % 100 == 0 for b in bases),
                    "round %d: three distinct reserved ranges %s" % (rnd, bases))
            if rnd == 0:
                # kvf-up exited; its reservations stay while the pools' pids live.
                held = sorted(int(n.split(".")[0]) for n in os.listdir(port_dir)
                              if n.endswith(".json") and int(n.split(".")[0]) in bases)
                T.check(held == bases, "reservations held by the running pools: %s" % held)
        finally:
            for d in dirs:
                subprocess.run([down, "--run-dir", d, "--timeout", "5"], capture_output=True,
                               timeout=30)
        times.append(dt)
        print("round %d: %d pools healthy in %.2f s (ports %s)" % (rnd, POOLS, dt, bases))
    # Once the pools are down, the next pick drops their reservations as stale.
    d = os.path.join(top, "after")
    p = subprocess.run([up, "--layout", "1p1d", "--model", model, "--run-dir", d,
                        "--bin", a.fakebin, "--port", "0", "--timeout", "30"],
                       capture_output=True, text=True, timeout=60)
    try:
        T.check(p.returncode == 0, "a pool after the rounds comes up", p.stderr)
        live = []
        for n in os.listdir(port_dir):
            if n.endswith(".json"):
                try:
                    with open(os.path.join(port_dir, n)) as f:
                        live.append(json.load(f)["run_dir"])
                except (OSError, ValueError):
                    pass
        T.check(not [r for r in live if r.startswith(top + os.sep + "r")],
                "stale reservations of the stopped pools were dropped", live)
    finally:
        subprocess.run([down, "--run-dir", d, "--timeout", "5"], capture_output=True, timeout=30)
    print("%d rounds of %d parallel kvf-up: all healthy; per round min %.2f s, max %.2f s"
          % (ROUNDS, POOLS, min(times), max(times)))


if __name__ == "__main__":
    main()
