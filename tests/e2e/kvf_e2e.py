"""Helpers for kvferry end-to-end tests (Python 3 standard library only).

Start a pool with kvf-up on free ports in a temporary run dir, wait for it
to be healthy, talk to the proxy (completions, streaming, /health,
/metrics), and always stop it with kvf-down::

    from kvf_e2e import Pool
    with Pool(layout="2p1d", model=MODEL_DIR, decode_instances=2) as pool:
        r = pool.complete("hello", max_tokens=8, temperature=0)
        s = pool.complete("hello", max_tokens=8, stream=True)
        assert s.text == r["choices"][0]["text"]
        m = pool.metrics()
        m.value("kvf_proxy_requests_total", code="200")

Binaries come from bin_dir, else $KVF_BIN, else <repo>/build/bin. Every
wait has a timeout; nothing sleeps for a fixed time except the short poll
interval between checks.
"""

import http.client
import json
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time

__all__ = ["Pool", "Proxy", "StreamResult", "Metrics", "HttpError", "free_port_range",
           "find_bin", "parse_sse", "parse_metrics", "wait_for", "repo_root", "keygen",
           "skip_without_test_switches"]


def repo_root():
    """The source tree: $KVF_SOURCE_DIR, else two levels above this file."""
    return os.environ.get("KVF_SOURCE_DIR") or os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_bin(bin_dir=None):
    """Directory holding kvf-up, kvf-down and the binaries."""
    for d in (bin_dir, os.environ.get("KVF_BIN"), os.path.join(repo_root(), "build", "bin")):
        if d and os.path.isdir(d):
            return os.path.abspath(d)
    raise FileNotFoundError("no bin dir: pass bin_dir or set KVF_BIN")


def keygen(out, members=("prefill-0", "decode-0", "proxy"), bin_dir=None):
    """A pool key set in folder out (`kvf keygen`, docs/SECURITY.md) for daemons started
    by hand: give them --keys out --key-id <member>. Returns out."""
    subprocess.run([os.path.join(find_bin(bin_dir), "kvf"), "keygen", "--out", out,
                    "--members", ",".join(members)], check=True, stdout=subprocess.DEVNULL)
    return out


def skip_without_test_switches(bin_dir=None):
    """Exit 77 (ctest: skipped) when the daemons refuse test-only switches (--test-*,
    KVF_TEST_*): a build without -DKVF_FAULT_INJECTION=ON (tests/run.sh builds with it)."""
    import sys
    p = subprocess.run([os.path.join(find_bin(bin_dir), "kvf-decode"), "--test-pull-delay", "0",
                        "--print-config"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, timeout=30)
    if "is a test-only switch" in p.stderr:
        print("skipped: this build refuses test-only switches (configure with "
              "-DKVF_FAULT_INJECTION=ON; tests/run.sh does)")
        sys.exit(77)


def wait_for(cond, timeout, what="condition", interval=0.05):
    """Poll cond() until it returns a truthy value (returned) or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            a, b = f.read().split()
            return int(a), int(b)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_range(n, lo=20000, hi=None, tries=200):
    """A base port such that [base, base + n) are all free on 127.0.0.1 right now.

    The range stays below the kernel's ephemeral ports (by default), so outgoing
    connections and transports that listen on ephemeral ports cannot take it
    between this check and the daemons' bind.
    """
    if hi is None:
        eph_lo, _ = _ephemeral_range()
        hi = eph_lo if eph_lo - lo > 4 * n else 60000
    rng = random.Random(os.getpid() ^ int(time.time() * 1000))
    for _ in range(tries):
        base = rng.randrange(lo, hi - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free range of %d ports" % n)


class HttpError(Exception):
    """Non-2xx answer; .status and .body (parsed JSON when possible)."""

    def __init__(self, status, body):
        super().__init__("HTTP %d: %s" % (status, body))
        self.status = status
        self.body = body


def parse_sse(lines):
    """Server-sent events from an iterable of text lines: list of data payloads.

    JSON payloads are decoded; "[DONE]" stays a string.
    """
    events, data = [], []
    for line in lines:
        line = line.rstrip("\r\n")
        if line == "":
            if data:
                payload = "\n".join(data)
                events.append(payload if payload == "[DONE]" else json.loads(payload))
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        payload = "\n".join(data)
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


_METRIC_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Metrics:
    """Parsed Prometheus text: samples[(name, frozenset(labels.items()))] = value."""

    def __init__(self, text):
        self.text = text
        self.samples = parse_metrics(text)
        self.types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))

    def value(self, name, default=None, **labels):
        """Value of the sample with exactly these labels."""
        return self.samples.get((name, frozenset(labels.items())), default)

    def sum(self, name, **labels):
        """Sum over samples of name whose labels include the given ones."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= set(ls))

    def labels(self, name):
        """Label dicts of every sample of name."""
        return [dict(ls) for (n, ls) in self.samples if n == name]


def parse_metrics(text):
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_RE.match(line)
        if not m:
            raise ValueError("bad metrics line: %r" % line)
        labels = frozenset(_LABEL_RE.findall(m.group(3) or ""))
        v = m.group(4)
        out[(m.group(1), labels)] = float("inf") if v == "+Inf" else float(v)
    return out


class StreamResult:
    """A streamed completion: events (decoded chunks, then "[DONE]"), arrival
    times (seconds since the request was sent), the joined text, token ids
    (when requested), the final chunk (finish_reason, kv_transfer) and the usage
    chunk's usage (stream_options.include_usage; None without it)."""

    def __init__(self, events, times):
        self.events = events
        self.times = times
        self.chunks = [e for e in events if isinstance(e, dict) and e.get("choices")]
        usage = [e["usage"] for e in events if isinstance(e, dict) and "choices" in e and
                 not e["choices"] and "usage" in e]
        self.usage = usage[-1] if usage else None
        self.errors = [e["error"] for e in events if isinstance(e, dict) and "error" in e]
        self.done = bool(events) and events[-1] == "[DONE]"
        self.text = "".join(c["choices"][0]["text"] for c in self.chunks)
        self.token_ids = [t for c in self.chunks for t in c["choices"][0].get("token_ids", [])]
        self.final = self.chunks[-1] if self.chunks else None
        self.finish_reason = self.final["choices"][0]["finish_reason"] if self.final else None
        self.first_token_s = self.times[0] if self.times else None


class Proxy:
    """HTTP client of one kvf-proxy."""

    def __init__(self, host, port, model_name=None):
        self.host, self.port, self.model_name = host, port, model_name

    @property
    def url(self):
        return "http://%s:%d" % (self.host, self.port)

    def request(self, method, path, body=None, timeout=60, headers=None):
        """(status, headers dict, raw body bytes). body: dict (sent as JSON), str or bytes."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            hdrs = dict(headers or {})
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
                hdrs.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=body, headers=hdrs)
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def get_json(self, path, timeout=10):
        status, _, raw = self.request("GET", path, timeout=timeout)
        return status, json.loads(raw)

    def health(self, timeout=10):
        """(status, health JSON)."""
        return self.get_json("/health", timeout)

    def models(self):
        return self.get_json("/v1/models")[1]

    def metrics(self, timeout=10):
        status, hdrs, raw = self.request("GET", "/metrics", timeout=timeout)
        if status != 200:
            raise HttpError(status, raw)
        return Metrics(raw.decode())

    def wait_healthy(self, timeout=60):
        def ok():
            try:
                return self.health(timeout=2)[0] == 200
            except OSError:
                return False
        wait_for(ok, timeout, "proxy %s /health == 200" % self.url)

    def completion_body(self, prompt, max_tokens=16, temperature=0.0, seed=None, stream=False,
                        **extra):
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                "stream": stream}
        if self.model_name:
            body["model"] = self.model_name
        if seed is not None:
            body["seed"] = seed
        body.update(extra)
        return body

    def complete(self, prompt, max_tokens=16, temperature=0.0, seed=None, stream=False,
                 timeout=60, **extra):
        """Non-streaming: the response dict. stream=True: a StreamResult.
        Raises HttpError for a non-200 answer."""
        body = self.completion_body(prompt, max_tokens, temperature, seed, stream, **extra)
        if stream:
            return self.stream(body, timeout=timeout)
        status, _, raw = self.request("POST", "/v1/completions", body, timeout=timeout)
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw
        if status != 200:
            raise HttpError(status, parsed)
        return parsed

    def stream(self, body, timeout=60, on_event=None):
        """POST a stream=true body; read SSE events as they come. on_event(event, conn)
        may return False to stop reading (the connection is then closed: a client
        that goes away)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        t0 = time.monotonic()
        events, times, data = [], [], []
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                raw = r.read()
                try:
                    raw = json.loads(raw)
                except ValueError:
                    pass
                raise HttpError(r.status, raw)
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.decode("utf-8").rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
                    continue
                if line != "" or not data:
                    continue
                payload = "\n".join(data)
                data = []
                ev = payload if payload == "[DONE]" else json.loads(payload)
                events.append(ev)
                times.append(time.monotonic() - t0)
                if on_event is not None and on_event(ev, conn) is False:
                    break
                if ev == "[DONE]":
                    break
        finally:
            conn.close()
        return StreamResult(events, times)


class Pool(Proxy):
    """A pool started with kvf-up (in a temporary run dir) and stopped with kvf-down.

    Use as a context manager, or call start() and stop() (stop() in a finally).
    Arguments map to kvf-up flags; extra_args go after "--" to both daemons.
    """

    def __init__(self, layout="1p1d", model=None, prefill_instances=1, decode_instances=1,
                 bin_dir=None, kv_dtype=None, model_name=None, extra_args=(),
                 prefill_args=(), decode_args=(), proxy_args=(), timeout=120,
                 run_dir=None, keep_run_dir=None, hosts_file=None):
        super().__init__("127.0.0.1", 0, model_name)
        self.layout, self.model = layout, model
        self.n_prefill, self.n_decode = prefill_instances, decode_instances
        self.bin_dir = find_bin(bin_dir)
        self.kv_dtype, self.extra_args = kv_dtype, list(extra_args)
        self.prefill_args, self.decode_args = list(prefill_args), list(decode_args)
        self.proxy_args, self.timeout = list(proxy_args), timeout
        self.hosts_file = hosts_file
        self._own_run_dir = run_dir is None
        self.run_dir = run_dir or tempfile.mkdtemp(prefix="kvf-pool-")
        # Keep logs of a failed run when KVF_E2E_KEEP=1.
        self.keep_run_dir = (os.environ.get("KVF_E2E_KEEP") == "1"
                             if keep_run_dir is None else keep_run_dir)
        self.up_output = ""
        self.started = False

    def _up_cmd(self, base_port):
        cmd = [os.path.join(self.bin_dir, "kvf-up"), "--layout", self.layout,
               "--prefill-instances", str(self.n_prefill),
               "--decode-instances", str(self.n_decode), "--model", self.model,
               "--run-dir", self.run_dir, "--port", "0", "--base-port", str(base_port),
               "--bin", self.bin_dir, "--timeout", str(int(self.timeout))]
        if self.kv_dtype:
            cmd += ["--kv-dtype", self.kv_dtype]
        if self.model_name:
            cmd += ["--model-name", self.model_name]
        if self.hosts_file:
            cmd += ["--hosts", self.hosts_file]
        for flag, args in (("--prefill-arg", self.prefill_args),
                           ("--decode-arg", self.decode_args),
                           ("--proxy-arg", self.proxy_args)):
            for a in args:
                cmd += [flag, a]
        if self.extra_args:
            cmd += ["--"] + self.extra_args
        return cmd

    def start(self, attempts=3):
        """Run kvf-up (retrying on another port range if it fails); returns self."""
        if self.model is None:
            raise ValueError("Pool needs model=")
        nports = 2 * self.n_prefill + self.n_decode
        last = None
        for _ in range(attempts):
            base = free_port_range(nports)
            p = subprocess.run(self._up_cmd(base), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, timeout=self.timeout + 30)
            self.up_output = p.stdout + p.stderr
            if p.returncode == 0:
                url = p.stdout.strip().splitlines()[-1]
                m = re.match(r"^http://([^:/]+):(\d+)$", url)
                if not m:
                    raise RuntimeError("kvf-up printed no URL: %r" % p.stdout)
                self.host, self.port = m.group(1), int(m.group(2))
                self.started = True
                if self.model_name is None:
                    self.model_name = self.models()["data"][0]["id"]
                return self
            last = p
            # A port taken between the probe and the bind shows up as a start-up failure (a
            # daemon's --metrics-port that the new base overlapped says "port in use?").
            if ("Address already in use" not in self.up_output and
                    "port in use?" not in self.up_output):
                break
        raise RuntimeError("kvf-up failed (rc %d):\n%s" % (last.returncode, self.up_output))

    def stop(self, timeout=30):
        """kvf-down; remove the run dir unless keep_run_dir. Safe to call twice."""
        down = os.path.join(self.bin_dir, "kvf-down")
        if os.path.isdir(self.run_dir):
            subprocess.run([down, "--run-dir", self.run_dir, "--timeout", "10"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        self.started = False
        if self._own_run_dir and not self.keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def log(self, name):
        """Text of run_dir/<name>.log ("proxy", "prefill-0", "decode-1", ...)."""
        try:
            with open(os.path.join(self.run_dir, name + ".log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def pids(self):
        """{name: pid} from the run dir's pid files."""
        out = {}
        for fn in os.listdir(self.run_dir):
            if fn.endswith(".pid"):
                with open(os.path.join(self.run_dir, fn)) as f:
                    out[fn[:-4]] = int(f.read().split()[0])
        return out

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        if exc[0] is not None and self._own_run_dir:
            self.keep_run_dir = self.keep_run_dir or os.environ.get("KVF_E2E_KEEP") == "1"
        self.stop()
        return False
