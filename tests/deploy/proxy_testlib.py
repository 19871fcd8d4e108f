"""Shared bits of the tests/deploy scripts: argument parsing, starting
kvf-proxy and the fake daemons as child processes, and tidy shutdown."""

import argparse
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.environ.get("KVF_SOURCE_DIR") or
                                os.path.dirname(os.path.dirname(os.path.dirname(
                                    os.path.abspath(__file__)))), "tests", "e2e"))
import kvf_e2e  # noqa: E402


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--fakebin", required=True, help="folder with fake daemons and the real proxy")
    p.add_argument("--testbin", required=True)
    return p.parse_args()


class Procs:
    """Child processes, stopped (SIGTERM, then SIGKILL) in reverse start order."""

    def __init__(self, logdir):
        self.procs = []
        self.logdir = logdir

    def keys(self):
        """The test's key set (kvf keygen, once per Procs): every process started here
        authenticates with it, as a kvf-up pool's members do (docs/SECURITY.md)."""
        d = os.path.join(self.logdir, "keys")
        if not os.path.exists(os.path.join(d, "pool.pub")):
            # KVF_KEYGEN_BIN: a kvf of another build (tests/run.sh's TSan pass: kvf links UCX,
            # whose memory hooks crash under TSan; the keys are not what that pass tests)
            kvf = os.environ.get("KVF_KEYGEN_BIN") or os.path.join(kvf_e2e.find_bin(), "kvf")
            subprocess.run([kvf, "keygen", "--out", d, "--members", "prefill-0,decode-0,proxy"],
                           check=True, stdout=subprocess.DEVNULL)
        return d

    def with_keys(self, cmd):
        """cmd plus --keys (and a member --key-id for a fake daemon) unless it says
        --keys or --insecure itself."""
        prog = os.path.basename(cmd[0])
        if prog not in ("kvf-proxy", "kvf_fake_daemon", "kvf-prefill", "kvf-decode") or \
                "--keys" in cmd or "--insecure" in cmd:
            return cmd
        cmd = list(cmd) + ["--keys", self.keys()]
        if prog != "kvf-proxy":
            role = cmd[cmd.index("--role") + 1] if "--role" in cmd else \
                ("decode" if "decode" in prog else "prefill")
            cmd += ["--key-id", "%s-0" % role]
        return cmd

    def start(self, name, cmd, capture_stdout=False):
        cmd = self.with_keys(cmd)
        err = open(os.path.join(self.logdir, name + ".log"), "w")
        env = dict(os.environ, KVF_LOG_LEVEL=os.environ.get("KVF_LOG_LEVEL", "info"))
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE if capture_stdout else err,
                             stderr=err, stdin=subprocess.DEVNULL, env=env)
        p.name, p.errfile = name, err
        self.procs.append(p)
        return p

    def log(self, name):
        with open(os.path.join(self.logdir, name + ".log"), errors="replace") as f:
            return f.read()

    def stop(self, p, timeout=5):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        p.errfile.close()
        return p.returncode

    def stop_all(self):
        for p in reversed(self.procs):
            self.stop(p)


def start_proxy(procs, fakebin, prefill, decode, extra=(), timeout=10, name="proxy"):
    """Start kvf-proxy on a free port (--port 0); return (Popen, kvf_e2e.Proxy)."""
    cmd = [os.path.join(fakebin, "kvf-proxy"), "--port", "0", "--prefill", prefill,
           "--decode", decode] + list(extra)
    p = procs.start(name, cmd, capture_stdout=True)
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or p.poll() is not None:
            raise RuntimeError("kvf-proxy did not start: %s" % procs.log(name))
        r, _, _ = select.select([p.stdout], [], [], left)
        if r:
            ch = os.read(p.stdout.fileno(), 1)
            if not ch:
                raise RuntimeError("kvf-proxy exited: %s" % procs.log(name))
            line += ch
    port = int(line.decode().rsplit(":", 1)[1])
    return p, kvf_e2e.Proxy("127.0.0.1", port)


def start_fake(procs, testbin, role, name, port, extra=()):
    # The fake under its own name, so nothing that looks for kvf-prefill or
    # kvf-decode processes by name mistakes it for a real daemon.
    exe = os.path.join(testbin, "kvf_fake_daemon")
    return procs.start(name, [exe, "--role", role, "--listen", "tcp://127.0.0.1:%d" % port,
                              "--engine-id", name] + list(extra))


def check(cond, what, detail=None):
    if not cond:
        raise AssertionError(what if detail is None else "%s\n%s" % (what, detail))
    print("ok:", what)


def run_with_procs(run):
    """Parse the test's arguments and call run(a, procs, tmp), its child processes
    logging into a fresh temporary folder; on failure print the tail of every log,
    and always stop the children."""
    a = args()
    with tempfile.TemporaryDirectory() as tmp:
        procs = Procs(tmp)
        try:
            run(a, procs, tmp)
        except BaseException:
            for fn in sorted(os.listdir(tmp)):
                if fn.endswith(".log"):
                    print("---- %s ----\n%s" % (fn, procs.log(fn[:-4])[-3000:]))
            raise
        finally:
            procs.stop_all()
