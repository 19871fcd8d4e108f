"""The outsider test (docs/SECURITY.md): a real 1p1d pool started by kvf-up (CURVE keys in
its run dir) on the tiny hybrid model; then, on every ZeroMQ channel, an outsider without a
key, with a self-made key, and pool members whose role may not use the channel, send the
messages that made the pool lie or stall before keys existed (CheckPeerRequest cache
poisoning, DecodeRequest with a silent side channel, AbortRequest, unclaimed
PrefillRequest, handshake and lease claim on the side channel). Each gets no reply within a
bounded poll; the daemons' health replies count the refusals per channel (auth_refusals_serve
/ auth_refusals_side, what the proxy's /metrics shows too); and meanwhile requests through
the proxy still return the colocated tokens.

Attack cases are the CASES list: (name, channel, key, key_id, msg, claim). Add rows for new
attacks; `expect` is what a row must see ("no-reply"). The helper kvf_outsider
(tests/security/outsider.c) sends one message and prints what came back.
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from e2e_models import model_dir, reference  # noqa: E402
from kvf_e2e import Pool, find_bin, wait_for  # noqa: E402

PROMPT = "The ferry left at dawn"
MAX_TOKENS = 8
WAIT_MS = 1500   # an authenticated member is answered in milliseconds on loopback

SERVE_MSGS = ["health", "check_peer", "decode", "abort", "prefill"]
SIDE_MSGS = ["handshake", "lease"]

# (name, target, key, key_id, msgs, claim); target: prefill-ctl, decode-ctl, prefill-side
CASES = (
    [("no key", t, "none", None, SERVE_MSGS, "decode-0") for t in ("prefill-ctl", "decode-ctl")] +
    [("self-made key", t, "self", None, SERVE_MSGS, "decode-0")
     for t in ("prefill-ctl", "decode-ctl")] +
    [("prefill-0's key on decode's control port (role prefill)", "decode-ctl", "member",
      "prefill-0", SERVE_MSGS, "decode-0"),
     ("decode-0's key on prefill's control port (role decode)", "prefill-ctl", "member",
      "decode-0", SERVE_MSGS, "decode-0"),
     ("no key", "prefill-side", "none", None, SIDE_MSGS, "decode-0"),
     ("self-made key", "prefill-side", "self", None, SIDE_MSGS, "decode-0"),
     ("proxy's key claiming decode-0", "prefill-side", "member", "proxy", SIDE_MSGS,
      "decode-0"),
     ("prefill-0's key claiming decode-0", "prefill-side", "member", "prefill-0", SIDE_MSGS,
      "decode-0")])


def outsider(bindir, endpoint, key, keys, key_id, msg, claim, wait_ms=WAIT_MS):
    cmd = [os.path.join(bindir, "kvf_outsider"), "--endpoint", endpoint, "--key", key,
           "--msg", msg, "--claim", claim, "--wait-ms", str(wait_ms), "--server-keys", keys]
    if key == "member":
        cmd += ["--keys", keys, "--key-id", key_id]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=30)
    assert p.returncode == 0, (cmd, p.stdout, p.stderr)
    return p.stdout.strip()


def health_fields(line):
    return dict(kv.split("=", 1) for kv in line.split()[2:] if "=" in kv)


def refusals(bindir, keys, endpoint):
    """(serve, side) refusal counts from a daemon's health reply, asked with the proxy's key."""
    line = outsider(bindir, endpoint, "member", keys, "proxy", "health", "proxy", 5000)
    assert line.startswith("reply serve"), line
    f = health_fields(line)
    return int(f["auth_refusals_serve"]), int(f["auth_refusals_side"])


def main():
    bindir = find_bin()
    # tests/bin holds the helper in a build tree
    helper_dir = os.path.join(os.path.dirname(bindir), "tests", "bin")
    if os.path.exists(os.path.join(helper_dir, "kvf_outsider")):
        hbin = helper_dir
    else:
        hbin = bindir
    model = model_dir("tiny-hybrid")
    ref, _ = reference(model, PROMPT, MAX_TOKENS)
    t0 = time.monotonic()
    with Pool(layout="1p1d", model=model, timeout=90) as pool:
        keys = os.path.join(pool.run_dir, "keys")
        st = os.stat(keys)
        assert st.st_mode & 0o777 == 0o700, oct(st.st_mode)
        for fn in os.listdir(keys):
            assert os.stat(os.path.join(keys, fn)).st_mode & 0o777 == 0o600, fn
        _, h = pool.health()
        pctl, dctl = h["prefill"][0]["url"], h["decode"][0]["url"]
        side = "tcp://127.0.0.1:%d" % (int(pctl.rsplit(":", 1)[1]) + 1)   # kvf-up: base+2i+1
        targets = {"prefill-ctl": pctl, "decode-ctl": dctl, "prefill-side": side}

        def tokens():
            r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                              return_token_ids=True)
            return r["choices"][0]["token_ids"]
        assert tokens() == ref, (tokens(), ref)
        # a member is answered: the helper itself works
        line = outsider(hbin, dctl, "member", keys, "proxy", "health", "proxy")
        assert "engine_id=decode-0" in line, line
        p0, d0 = refusals(hbin, keys, pctl), refusals(hbin, keys, dctl)

        sent = 0
        for name, target, key, key_id, msgs, claim in CASES:
            for msg in msgs:
                line = outsider(hbin, targets[target], key, keys, key_id, msg, claim)
                assert line.startswith("no-reply"), (name, target, msg, line)
                sent += 1
            # between attack rows the pool keeps answering with the colocated tokens
            got = tokens()
            assert got == ref, (name, got, ref)
            print("refused: %-58s on %-12s (%s)" % (name, target, ", ".join(msgs)))

        # refusals counted per channel: keyed attempts by the key check, connections
        # without CURVE by the bound socket's monitor (they fail the mechanism handshake
        # before the key check is asked); at least one per message
        def keyed(target):   # one connection per message
            return sum(len(c[4]) for c in CASES if c[1] == target)
        keyed_serve_p, keyed_serve_d = keyed("prefill-ctl"), keyed("decode-ctl")
        keyed_side = keyed("prefill-side")

        def counted():
            p1, d1 = refusals(hbin, keys, pctl), refusals(hbin, keys, dctl)
            return ((p1[0] - p0[0] >= keyed_serve_p) and (d1[0] - d0[0] >= keyed_serve_d) and
                    (p1[1] - p0[1] >= keyed_side)) and (p1, d1)
        p1, d1 = wait_for(counted, 10, "refusals counted in the health replies")
        print("refusals counted: prefill control +%d (attempts %d), side +%d (%d); "
              "decode control +%d (%d)" % (p1[0] - p0[0], keyed_serve_p, p1[1] - p0[1],
                                           keyed_side, d1[0] - d0[0], keyed_serve_d))
        # the proxy's /metrics shows them per instance (the last health probe's values)
        def exported():
            m = pool.metrics()
            return (m.sum("kvf_instance_auth_refusals_serve_total"),
                    m.sum("kvf_instance_auth_refusals_side_total"))
        wait_for(lambda: exported()[0] >= keyed_serve_p + keyed_serve_d and
                 exported()[1] >= keyed_side, 10, "refusals in the proxy's /metrics")
        print("proxy /metrics: kvf_instance_auth_refusals_serve_total %d, _side_total %d"
              % exported())
        # a refused peer is logged once, not once per attempt
        log = pool.log("prefill-0")
        assert "refused" in log and "logged once" in log, log[-2000:]
        assert tokens() == ref
        print("%d outsider messages, none answered; colocated tokens %s throughout (%.1fs)"
              % (sent, ref, time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
