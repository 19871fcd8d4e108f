"""kvf-proxy under abusive clients (fake daemons behind it): connection caps
per client and in total answer a JSON 503 naming the cap instead of
hanging; idle and slow clients are closed at their header/body deadlines;
a declared over-size Content-Length gets 413 at once (before any body);
trailing bytes after the JSON body are refused; what the HTTP library
refuses itself (a 64 KB header line, a malformed header, a bad
Content-Length or chunk, HTTP/9.9, a 64 KB URL) is answered in the same
JSON error shape, never the library's HTML page, and a malformed request
line is closed; and through all of it a normal client is still served."""

import json
import socket
import time

import proxy_testlib as T
from kvf_e2e import HttpError, free_port_range, wait_for


def main():
    T.run_with_procs(lambda a, procs, tmp: run(a, procs))


def connect(port, src="127.0.0.1"):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def read_response(s, timeout=10):
    """(status, JSON body or raw bytes) of one HTTP/1.1 answer on @s."""
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    n = int(hdrs.get("content-length", "0"))
    while len(rest) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    try:
        return status, json.loads(rest[:n])
    except ValueError:
        return status, rest[:n]


def post(port, body, src="127.0.0.1", extra_headers=""):
    s = connect(port, src)
    try:
        raw = body if isinstance(body, bytes) else body.encode()
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                   "\r\nContent-Length: %d\r\n%s\r\n" % (len(raw), extra_headers)).encode() + raw)
        return read_response(s)
    finally:
        s.close()


def closed_within(s, seconds):
    """True when the peer closes @s within @seconds (reads until EOF)."""
    t0 = time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - t0 < seconds:
        try:
            if s.recv(4096) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def error_shape(body, code):
    # vLLM's flat error (integer code) with OpenAI's nested one
    keys = {"message", "type", "param", "code"}
    return (isinstance(body, dict) and set(body) == keys | {"object", "error"} and
            body["object"] == "error" and body["code"] == code and
            set(body["error"]) == keys and body["error"]["code"] == code)


def raw_exchange(port, data, timeout=5):
    """Send @data on a new connection; every byte until the proxy closes it."""
    s = connect(port)
    out = b""
    try:
        try:
            s.sendall(data)
        except OSError:
            pass        # closed while we still sent: what came back is the answer
        s.settimeout(timeout)
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        s.close()
    return out


def parse_raw(out):
    head, _, body = out.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head.startswith(b"HTTP/1.") else None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def library_refusals(port, px):
    """What the HTTP library refuses before the handler runs is JSON too, never its HTML."""
    big = b"a" * 65536
    cases = [
        ("a 64 KB header line", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + big +
         b"\r\n\r\n", 431, "request headers too large"),
        ("a header line without a colon", b"GET /health HTTP/1.1\r\nHost: x\r\n"
         b"no colon here\r\n\r\n", 400, "malformed HTTP request"),
        ("a Content-Length that is not a number", b"POST /v1/completions HTTP/1.1\r\nHost: x"
         b"\r\nContent-Length: abc\r\n\r\n", 400, "Content-Length"),
        ("a malformed chunk", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
         b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "chunked"),
        ("HTTP/9.9", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", 505, "HTTP version"),
        ("a 64 KB URL", b"GET /" + big + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
         "request line (URL) too long"),
    ]
    for what, data, code, text in cases:
        # the URL case is answered before a request line names the connection:
        # the proxy finds it as the one unnamed connection, so wait for calm
        wait_for(lambda: px.metrics().value("kvf_proxy_connections") == 1, 5, "no other client")
        out = raw_exchange(port, data)
        st, b = parse_raw(out)
        T.check(b"<html" not in out.lower() and st == code and error_shape(b, code) and
                text in b["error"]["message"], "%s: JSON %d" % (what, code), out[:300])

    # on a keep-alive connection, after a normal answer
    ok = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    out = raw_exchange(port, ok + b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + big +
                       b"\r\n\r\n")
    second = out[out.find(b"HTTP/1.1", 10):]
    st, b = parse_raw(second)
    T.check(out.startswith(b"HTTP/1.1 200") and b"<html" not in out.lower() and st == 431 and
            error_shape(b, 431), "second request on a connection, 64 KB header: JSON 431",
            out[:300])

    # not HTTP at all: closed without an answer (no page), promptly
    t0 = time.monotonic()
    out = raw_exchange(port, b"GARBAGE\r\n\r\n")
    st, b = parse_raw(out)
    T.check(b"<html" not in out.lower() and (out == b"" or (st == 400 and error_shape(b, 400)))
            and time.monotonic() - t0 < 3, "a malformed request line: closed, no HTML page",
            out[:300])
    st, b = post(port, json.dumps({"prompt": "hi", "max_tokens": 2, "model": "m"}))
    T.check(st == 200, "a normal request is still served after them")


def print_config_hides_secrets(fakebin):
    """--print-config shows an API key as (set), never its value; paths as they are."""
    import os
    import subprocess
    env = dict(os.environ, KVF_API_KEY="s3cret-abuse-key", KVF_KEYS="/some/keys/dir")
    p = subprocess.run([os.path.join(fakebin, "kvf-proxy"), "--print-config"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=10)
    T.check(p.returncode == 0 and "KVF_API_KEY=(set)\n" in p.stdout and
            "s3cret-abuse-key" not in p.stdout + p.stderr and
            "KVF_KEYS=/some/keys/dir\n" in p.stdout,
            "--print-config prints the API key as (set), the keys folder as given",
            p.stdout[-600:] + p.stderr[-300:])


def run(a, procs):
    print_config_hides_secrets(a.fakebin)
    base = free_port_range(2)
    T.start_fake(procs, a.testbin, "prefill", "prefill-0", base)
    T.start_fake(procs, a.testbin, "decode", "decode-0", base + 1)
    _, px = T.start_proxy(procs, a.fakebin, "tcp://127.0.0.1:%d" % base,
                          "tcp://127.0.0.1:%d" % (base + 1),
                          ["--model-name", "m", "--max-connections", "6",
                           "--max-connections-per-client", "3", "--header-timeout", "1500ms",
                           "--body-timeout", "1500ms", "--idle-timeout", "1s",
                           "--max-body", "4k"])
    px.wait_healthy(timeout=10)
    port = px.port
    ok_body = json.dumps({"prompt": "hi", "max_tokens": 2, "model": "m"})
    st, b = post(port, ok_body)
    T.check(st == 200 and b["choices"][0]["text"], "a normal request is served")

    # Per client: 3 idle connections from 127.0.0.2 hold its share; a 4th
    # request from it gets a JSON 503 naming the cap; another address is served.
    def open_conns(n):
        # accept runs asynchronously: wait until the proxy counts them (the
        # /metrics request itself is one more). A connection the test just closed is
        # unregistered asynchronously too, so at n = 5 a /metrics request can itself
        # meet the total cap (503) for a moment: that is "not yet", not a failure.
        def counted():
            try:
                return px.metrics().value("kvf_proxy_connections") == n + 1
            except HttpError as err:
                if err.status != 503:
                    raise
                return False
        wait_for(counted, 5, "%d connections registered" % n)

    open_conns(0)
    idle = [connect(port, "127.0.0.2") for _ in range(3)]
    open_conns(3)
    st, b = post(port, ok_body, src="127.0.0.2")
    T.check(st == 503 and error_shape(b, 503) and
            "--max-connections-per-client" in b["error"]["message"],
            "per-client cap: JSON 503 naming the cap", b)
    st, b = post(port, ok_body, src="127.0.0.3")
    T.check(st == 200, "another client is still served", b)

    # In total: 3 more idle connections from 127.0.0.4/5 fill the 6 slots.
    open_conns(3)
    idle += [connect(port, "127.0.0.4"), connect(port, "127.0.0.4")]
    open_conns(5)
    idle.append(connect(port, "127.0.0.5"))
    # the 6th is registered asynchronously; until then a 7th is still served
    deadline = time.monotonic() + 5
    while True:
        st, b = post(port, ok_body, src="127.0.0.6")
        if st == 503 or time.monotonic() > deadline:
            break
    T.check(st == 503 and error_shape(b, 503) and
            "--max-connections)" in b["error"]["message"],
            "total cap: JSON 503 naming --max-connections", b)

    # Idle clients: closed at the header deadline (1.5 s), then the pool serves again.
    t0 = time.monotonic()
    T.check(all(closed_within(s, 5) for s in idle),
            "idle connections closed by the header deadline (%.1f s)" % (time.monotonic() - t0))
    for s in idle:
        s.close()
    wait_for(lambda: post(port, ok_body, src="127.0.0.2")[0] == 200, 5,
             "served again once the idle connections are gone")
    T.check(True, "served again once the idle connections are gone")
    # both cap refusals counted by reason (the per-client one and the total one;
    # /metrics requests that met the total cap count too)
    rej = px.metrics().value("kvf_proxy_rejected_total", reason="connections")
    T.check(rej is not None and rej >= 2,
            "connection-cap 503s counted in kvf_proxy_rejected_total{reason=\"connections\"}",
            rej)

    # Slow headers: one byte every 300 ms never completes within 1.5 s.
    s = connect(port)
    t0 = time.monotonic()
    closed = False
    for ch in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40:
        try:
            s.send(bytes([ch]))
        except OSError:
            closed = True
            break
        if closed_within(s, 0.3):
            closed = True
            break
    dt = time.monotonic() - t0
    s.close()
    T.check(closed and 1.2 < dt < 4.0, "slow headers: closed at the deadline (%.1f s)" % dt)

    # Slow body: headers at once, the body never completes.
    s = connect(port)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
    t0 = time.monotonic()
    T.check(closed_within(s, 5) and time.monotonic() - t0 < 4.0,
            "slow body: closed at the body deadline (%.1f s)" % (time.monotonic() - t0))
    s.close()

    # Keep-alive idle: after an answer, the connection may idle 1 s.
    s = connect(port)
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
               % (len(ok_body), ok_body)).encode())
    st, _ = read_response(s)
    t0 = time.monotonic()
    T.check(st == 200 and closed_within(s, 5) and time.monotonic() - t0 < 3.5,
            "idle keep-alive connection closed after --idle-timeout (%.1f s)"
            % (time.monotonic() - t0))
    s.close()

    # A declared over-size body: 413 at once, before a byte of it is sent.
    s = connect(port)
    t0 = time.monotonic()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
    st, b = read_response(s, timeout=5)
    s.close()
    T.check(st == 413 and error_shape(b, 413) and "--max-body" in b["error"]["message"] and
            time.monotonic() - t0 < 1.0,
            "declared over-size body: 413 at once (%.2f s)" % (time.monotonic() - t0), b)

    # Trailing garbage after the JSON object, and a second object.
    for body in (ok_body + " xyz", ok_body + ok_body):
        st, b = post(port, body)
        T.check(st == 400 and error_shape(b, 400) and "after its JSON value" in
                b["error"]["message"], "trailing bytes refused: %r" % body[-8:], b)
    st, b = post(port, ok_body + "\r\n  \n")
    T.check(st == 200, "trailing white space is fine")

    library_refusals(port, px)

    st, h = px.health()
    T.check(st == 200, "/health still 200 after the abuse")
    m = px.metrics()
    # (the slow-headers one at least: the library's inactivity timeout may close the others)
    T.check(m.value("kvf_proxy_connection_timeouts_total") >= 1,
            "the deadline closes are counted (%s)" % m.value("kvf_proxy_connection_timeouts_total"))


if __name__ == "__main__":
    main()
