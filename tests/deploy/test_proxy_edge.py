"""kvf-proxy's HTTP edge options (fake daemons behind it):

- TLS (--tls-cert/--tls-key, a self-signed certificate made here with openssl)
  with an API key from --api-key-file: curl over HTTPS without the key gets
  401 with the OpenAI error JSON, with it 200 and the expected text (plain and
  streamed, ending with [DONE]); a wrong key 401; /health and /metrics stay
  open; plain HTTP on the TLS port gets no answer; --tls-cert without
  --tls-key is refused by name. kvf-up passes the options through (its
  health check over HTTPS with the key) and prints the https URL.
- The key from KVF_API_KEY with --protect-metrics: /metrics and /health need it.
- --trusted-proxy: X-Forwarded-For from a trusted peer attributes connections to
  the client it names (per-client cap 2: a third connection for the same
  forwarded client gets 503, another forwarded client is served); from any
  other peer the header is ignored.
- A stream whose tokens come slower than every client timeout (and the HTTP
  library's inactivity backstop) is not cut: it ends with its text and [DONE]."""

import json
import os
import shutil
import socket
import subprocess
import time

import proxy_testlib as T
from kvf_e2e import free_port_range

KEY = "sk-test-0123456789abcdef"
BODY = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 3})
SBODY = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 3, "stream": True})


def curl(url, body=None, key=None, cacert=None, timeout=20):
    """(HTTP status, body text) of one curl request; status 0 when none came."""
    cmd = ["curl", "-sS", "-m", str(timeout), "-o", "-", "-w", "\n%{http_code}"]
    if cacert:
        cmd += ["--cacert", cacert]
    if key is not None:
        cmd += ["-H", "Authorization: Bearer " + key]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", body]
    p = subprocess.run(cmd + [url], capture_output=True, text=True)
    out, _, code = p.stdout.rpartition("\n")
    return int(code or 0), out


def error_shape(text, code):
    try:
        b = json.loads(text)
    except ValueError:
        return False
    keys = {"message", "type", "param", "code"}   # vLLM's flat error and OpenAI's nested one
    return (set(b) == keys | {"object", "error"} and b["code"] == code and
            set(b["error"]) == keys and b["error"]["code"] == code)


def stream_text(text):
    out = ""
    for line in text.splitlines():
        if line.startswith("data: {"):
            ev = json.loads(line[6:])
            if "error" in ev:
                return None
            out += ev["choices"][0]["text"]
    return out if "data: [DONE]" in text else None


def tls_part(procs, a, tmp, pf, pd):
    if shutil.which("openssl") is None:
        print("skipped: TLS (no openssl; deploy/install-deps.sh --tests installs it)")
        return
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    keyfile = os.path.join(tmp, "api.key")
    with open(keyfile, "w") as f:
        f.write(KEY + "\n")
    p, px = T.start_proxy(procs, a.fakebin, pf, pd,
                          ["--model-name", "m", "--tls-cert", cert, "--tls-key", key,
                           "--api-key-file", keyfile], name="proxy-tls")
    base = "https://127.0.0.1:%d" % px.port
    deadline = time.monotonic() + 10
    while curl(base + "/health", cacert=cert)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    st, out = curl(base + "/health", cacert=cert)
    T.check(st == 200, "TLS: /health is open (no key) and 200", out[:200])
    st, out = curl(base + "/v1/completions", BODY, cacert=cert)
    T.check(st == 401 and error_shape(out, 401) and "API key" in json.loads(out)["error"]
            ["message"], "TLS: a completion without the API key gets 401 JSON", out[:300])
    st, out = curl(base + "/v1/completions", BODY, key="wrong", cacert=cert)
    T.check(st == 401 and error_shape(out, 401), "TLS: a wrong key gets 401", out[:300])
    st, out = curl(base + "/v1/models", cacert=cert)
    T.check(st == 401, "TLS: /v1/models needs the key too", out[:300])
    st, out = curl(base + "/v1/completions", BODY, key=KEY, cacert=cert)
    T.check(st == 200 and json.loads(out)["choices"][0]["text"] == "hel",
            "TLS: with the key, 200 and the text", out[:300])
    st, out = curl(base + "/v1/completions", SBODY, key=KEY, cacert=cert)
    T.check(st == 200 and stream_text(out) == "hel", "TLS: a stream with the key ends with "
            "[DONE]", out[-300:])
    st, out = curl(base + "/metrics", cacert=cert)
    T.check(st == 200 and "kvf_proxy_requests_total" in out, "TLS: /metrics is open")
    st, out = curl("http://127.0.0.1:%d/health" % px.port, timeout=5)
    T.check(st != 200, "plain HTTP on the TLS port is not served (%d)" % st)
    procs.stop(p)

    kvf_up_part(a, tmp, cert, key, keyfile)

    bad = subprocess.run([os.path.join(a.fakebin, "kvf-proxy"), "--port", "0", "--insecure",
                          "--tls-cert", cert], capture_output=True, text=True, timeout=20)
    T.check(bad.returncode != 0 and "--tls-key" in bad.stderr,
            "--tls-cert without --tls-key is refused by name", bad.stderr[-300:])


def kvf_up_part(a, tmp, cert, key, keyfile):
    """kvf-up passes --tls-cert/--tls-key/--api-key-file/--protect-metrics to its proxy,
    checks its health over HTTPS with the key, and prints the https URL."""
    src = os.environ.get("KVF_SOURCE_DIR") or os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))))
    run_dir = os.path.join(tmp, "pool")
    up = subprocess.run([os.path.join(a.fakebin, "kvf-up"), "--layout", "1p1d", "--model",
                         os.path.join(src, "models-trained", "tiny-hybrid"), "--run-dir",
                         run_dir, "--bin", a.fakebin, "--port", "0", "--timeout", "30",
                         "--tls-cert", cert, "--tls-key", key, "--api-key-file", keyfile,
                         "--protect-metrics"], capture_output=True, text=True, timeout=90)
    try:
        url = (up.stdout.strip().splitlines() or [""])[-1]
        T.check(up.returncode == 0 and url.startswith("https://127.0.0.1:"),
                "kvf-up with TLS and an API key: healthy, prints the https URL (%s)" % url,
                up.stderr[-1500:])
        body = json.dumps({"model": "tiny-hybrid", "prompt": [1, 2, 3], "max_tokens": 2})
        st, out = curl(url + "/v1/completions", body, key=KEY, cacert=cert)
        T.check(st == 200 and json.loads(out)["choices"][0]["index"] == 0, "kvf-up's pool answers over HTTPS with the key", out[:300])
        st, _ = curl(url + "/health", cacert=cert)
        T.check(st == 401, "kvf-up passed --protect-metrics: /health needs the key")
    finally:
        subprocess.run([os.path.join(a.fakebin, "kvf-down"), "--run-dir", run_dir],
                       capture_output=True, timeout=60)


def env_key_part(procs, a, pf, pd):
    os.environ["KVF_API_KEY"] = KEY
    try:
        p, px = T.start_proxy(procs, a.fakebin, pf, pd, ["--model-name", "m",
                                                          "--protect-metrics", "yes"],
                              name="proxy-envkey")
    finally:
        del os.environ["KVF_API_KEY"]
    base = "http://127.0.0.1:%d" % px.port
    st, out = curl(base + "/metrics")
    T.check(st == 401 and error_shape(out, 401), "--protect-metrics: /metrics without the key "
            "(from KVF_API_KEY) gets 401", out[:200])
    st, _ = curl(base + "/health")
    T.check(st == 401, "--protect-metrics: /health without the key gets 401")
    st, out = curl(base + "/metrics", key=KEY)
    T.check(st == 200 and "kvf_proxy_connections" in out, "/metrics with the key: 200")
    deadline = time.monotonic() + 10
    while curl(base + "/health", key=KEY)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    st, out = curl(base + "/v1/completions", BODY, key=KEY)
    T.check(st == 200 and json.loads(out)["choices"][0]["text"] == "hel",
            "KVF_API_KEY: a completion with the key is served", out[:200])
    procs.stop(p)


def keepalive_request(src, port, xff):
    """A connection from @src that sends one completion with X-Forwarded-For @xff and stays
    open; (socket, status)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: %s\r\n"
               "Content-Length: %d\r\n\r\n%s" % (xff, len(BODY), BODY)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(rest) < n:
        rest += s.recv(65536)
    return s, int(head.split()[1])


def trusted_part(procs, a, pf, pd):
    p, px = T.start_proxy(procs, a.fakebin, pf, pd,
                          ["--model-name", "m", "--max-connections-per-client", "2",
                           "--trusted-proxy", "127.0.0.7,::1", "--idle-timeout", "60s"],
                          name="proxy-trusted")
    px.wait_healthy(timeout=10)
    held = []
    for _ in range(3):   # a balancer's connections that sent nothing yet count for no client
        c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        c.bind(("127.0.0.7", 0))
        c.connect(("127.0.0.1", px.port))
        held.append(c)
    s, st = keepalive_request("127.0.0.7", px.port, "10.0.0.3")
    held.append(s)
    T.check(st == 200, "trusted proxy: 3 idle connections of its own do not use a client's cap")
    for _ in range(2):
        s, st = keepalive_request("127.0.0.7", px.port, "10.0.0.1, 127.0.0.7")
        held.append(s)
        T.check(st == 200, "trusted proxy: a request for forwarded client 10.0.0.1 served")
    s, st = keepalive_request("127.0.0.7", px.port, "10.0.0.1")
    held.append(s)
    T.check(st == 503, "trusted proxy: a third connection for 10.0.0.1 meets its per-client "
            "cap (503)")
    s, st = keepalive_request("127.0.0.7", px.port, "10.0.0.2")
    held.append(s)
    T.check(st == 200, "trusted proxy: another forwarded client (10.0.0.2) is served")
    s, st = keepalive_request("127.0.0.8", px.port, "10.0.0.1")
    held.append(s)
    T.check(st == 200, "an untrusted peer's X-Forwarded-For is ignored (its own address counts)")
    for s in held:
        s.close()
    # a client that half-closes after its request (as the fuzzer does) is closed after the
    # answer, and one that half-closes mid-request at once, not at --idle-timeout (60 s here)
    # or --header-timeout (10 s): the epoll loop misses a FIN that comes with data it has
    # read (a race: ten of each)
    times = []
    for data in [b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /heal"] * 10:
        c = socket.create_connection(("127.0.0.1", px.port), timeout=30)
        t0 = time.monotonic()
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            got += chunk
        times.append(time.monotonic() - t0)
        c.close()
        T.check(got.startswith(b"HTTP/1.1 200") == data.endswith(b"\r\n\r\n"),
                "half-closed client: answered when its request was complete", got[:100])
    dt = max(times)
    T.check(dt < 2.0,
            "half-closed clients (20) get their answer and the close within %.2f s" % dt)
    procs.stop(p)


def quiet_stream_part(procs, a, base):
    # decode's tokens 2.5 s apart, every client timeout 1 s (so the library's own
    # inactivity backstop is 2 s): the stream must still finish
    T.start_fake(procs, a.testbin, "prefill", "prefill-q", base + 2)
    T.start_fake(procs, a.testbin, "decode", "decode-q", base + 3,
                 ["--fake-token-delay-ms", "2500"])
    p, px = T.start_proxy(procs, a.fakebin, "tcp://127.0.0.1:%d" % (base + 2),
                          "tcp://127.0.0.1:%d" % (base + 3),
                          ["--model-name", "m", "--idle-timeout", "1s", "--header-timeout", "1s",
                           "--body-timeout", "1s"],
                          name="proxy-quiet")
    px.wait_healthy(timeout=10)
    t0 = time.monotonic()
    st, out = curl("http://127.0.0.1:%d/v1/completions" % px.port, SBODY, timeout=30)
    dt = time.monotonic() - t0
    T.check(st == 200 and stream_text(out) == "hel" and dt > 4.5,
            "a stream quieter than --idle-timeout is not cut: its text and [DONE] after %.1f s"
            % dt, out[-300:])
    procs.stop(p)


def run(a, procs, tmp):
    base = free_port_range(4)
    T.start_fake(procs, a.testbin, "prefill", "prefill-0", base)
    T.start_fake(procs, a.testbin, "decode", "decode-0", base + 1)
    pf, pd = "tcp://127.0.0.1:%d" % base, "tcp://127.0.0.1:%d" % (base + 1)
    tls_part(procs, a, tmp, pf, pd)
    env_key_part(procs, a, pf, pd)
    trusted_part(procs, a, pf, pd)
    quiet_stream_part(procs, a, base)


def main():
    T.run_with_procs(run)


if __name__ == "__main__":
    main()
