#!/usr/bin/env python3
"""The test-host harness itself: hosts reach each other over the bridge and
only over it; netem and link cuts act; teardown leaves nothing behind, also
when the test fails (an exception) and when it is killed outright (SIGKILL:
the reaper cleans up)."""

import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mh_net import TestNet, teardown_tag, wait_for  # noqa: E402


def serve_once(addr, port, ready):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(1)
    ready.append(s)


def connect(addr, port, timeout=2.0):
    c = socket.create_connection((addr, port), timeout=timeout)
    t0 = time.monotonic()
    c.close()
    return t0


def rtt_ms(net, i, j, port):
    """Median TCP connect time from host i to a listener in host j, ms."""
    ls = []
    net.call(j, serve_once, net.addr(j), port, ls)
    times = []
    try:
        for _ in range(5):
            def one():
                t = time.monotonic()
                socket.create_connection((net.addr(j), port), timeout=3).close()
                return (time.monotonic() - t) * 1000
            times.append(net.call(i, one))
            conn, _ = ls[0].accept()
            conn.close()
    finally:
        ls[0].close()
    return sorted(times)[len(times) // 2]


def check_reachability(net):
    ls = []
    net.call(1, serve_once, net.addr(1), 7000, ls)
    try:
        net.call(0, connect, net.addr(1), 7000)
        # the test subnet exists only inside the namespaces: the machine's own
        # namespace has no address or route in it
        own = subprocess.run(["ip", "-o", "addr"], stdout=subprocess.PIPE, text=True).stdout
        own += subprocess.run(["ip", "route"], stdout=subprocess.PIPE, text=True).stdout
        assert "10.213.0." not in own, own
        # cut host 1 off: no connection; back up: connects again
        net.link(1, up=False)
        try:
            net.call(0, connect, net.addr(1), 7000, 0.5)
            raise AssertionError("connected through a cut link")
        except OSError:
            pass
        net.link(1, up=True)
        wait_for(lambda: _try(lambda: net.call(0, connect, net.addr(1), 7000, 1.0)), 10,
                 "host 1 reachable again")
    finally:
        ls[0].close()
    print("reachability: host 0 -> host 1 over the bridge; cut and restored")


def _try(fn):
    try:
        fn()
        return True
    except OSError:
        return False


def pull_mbit(net, i, j, port, nbytes):
    """Send nbytes from host j to host i over TCP; the receiver's rate in Mbit/s."""
    ls = []
    net.call(j, serve_once, net.addr(j), port, ls)
    import threading

    def sender():
        conn, _ = ls[0].accept()
        conn.sendall(b"x" * nbytes)
        conn.close()
    t = threading.Thread(target=sender)
    t.start()

    def recv():
        c = socket.create_connection((net.addr(j), port), timeout=10)
        got, t0 = 0, time.monotonic()
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            got += len(b)
        c.close()
        return got, time.monotonic() - t0
    try:
        got, secs = net.call(i, recv)
    finally:
        t.join(timeout=20)
        ls[0].close()
    assert got == nbytes, (got, nbytes)
    return nbytes * 8 / secs / 1e6


def check_shaping(net):
    plain = pull_mbit(net, 0, 2, 7001, 4 << 20)
    net.shape(2, rate_mbit=100)
    capped = pull_mbit(net, 0, 2, 7002, 4 << 20)
    net.shape(2, loss_pct=5)
    lossy = pull_mbit(net, 0, 2, 7003, 1 << 20)
    dropped = net.dropped(2)
    net.shape(2)
    base = rtt_ms(net, 0, 2, 7004)
    net.shape(2, delay_ms=5)
    slow = rtt_ms(net, 0, 2, 7005)
    net.shape(2)
    # 5 ms each way on host 2's link: a TCP connect (one round trip) >= 10 ms
    assert slow >= 9.5 and base < 5, (base, slow)
    print("delay (%s): connect %.2f ms plain, %.2f ms with 5 ms each way" % (
        "netem" if net.has_netem() else "NFQUEUE", base, slow))
    # a 100 Mbit/s cap: the 4 MiB pull runs at the cap (burst and timing slack)
    assert 70 <= capped <= 130, (plain, capped)
    assert plain > 2 * capped, (plain, capped)
    assert dropped > 0, dropped
    print("shaping: %.0f Mbit/s plain, %.1f Mbit/s under a 100 Mbit/s cap, %.1f Mbit/s "
          "at 5%% loss (%d frames dropped, every byte arrived)" % (plain, capped, lossy, dropped))


def child(mode):
    # a test process that starts hosts and a daemon, then fails or is killed
    net = TestNet(2)
    net.open()
    net.spawn(1, ["sleep", "300"])
    print("tag %s" % net.tag, flush=True)
    if mode == "raise":
        with net:
            pass   # (opened already; __exit__ with an error below)
    if mode == "exception":
        try:
            raise RuntimeError("planted failure")
        finally:
            net.close(check=False)
    time.sleep(300)   # killed here (mode kill)


def check_failure_cleanup():
    here = os.path.abspath(__file__)
    # 1. an exception in the test: close() in finally
    p = subprocess.run([sys.executable, here, "--child", "exception"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode != 0 and "planted failure" in p.stderr, p.stderr
    tag = p.stdout.split("tag ")[1].split()[0]
    assert "teardown clean" in p.stdout, p.stdout
    assert teardown_tag(tag) == [], tag
    # 2. killed outright: the reaper tears down
    c = subprocess.Popen([sys.executable, here, "--child", "kill"], stdout=subprocess.PIPE,
                         text=True)
    line = c.stdout.readline()
    tag = line.split()[1]
    assert any(n.startswith(tag) for n in os.listdir("/run/netns")), tag
    c.kill()
    c.wait(timeout=10)
    c.stdout.close()
    wait_for(lambda: not any(n.startswith(tag + "-") for n in os.listdir("/run/netns")), 30,
             "the reaper to delete %s's namespaces" % tag)
    left = wait_for(lambda: teardown_tag(tag) == [] and True, 10, "nothing left of " + tag)
    assert left
    print("failure cleanup: an exception and a SIGKILL both left nothing behind")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    with TestNet(3) as net:
        check_reachability(net)
        check_shaping(net)
        spawned = net.spawn(2, ["sleep", "300"])
    assert spawned.poll() is not None
    check_failure_cleanup()
    print("test_mh_harness passed")


if __name__ == "__main__":
    main()
