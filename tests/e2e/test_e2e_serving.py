#!/usr/bin/env python3
"""The serving plane against real pools.

- Startup compatibility check: a proxy in front of a compatible and an
  incompatible prefill instance (another KV dtype) runs the handshake of
  every pairing at start; /health lists the refused pairing with the
  refusal text, stays 200, and no request is ever routed to it.
- Sampling as OpenAI does: without `seed` every request draws a fresh seed
  (two calls differ); with a seed the tokens equal a colocated run's with
  the same seed, through 1p1d and 2p1d.
"""

import os
import subprocess
import sys
import time

from e2e_models import model_dir
from kvf_e2e import Pool, Proxy, find_bin, free_port_range, wait_for

PROMPT = "The ferry crosses at dawn"


def colocated_sampled(model, prompt, max_tokens, seed, temperature=1.0):
    p = subprocess.run([os.path.join(find_bin(), "kvf"), "generate", "--model", model,
                        "--prompt", prompt, "--max-tokens", str(max_tokens), "--temperature",
                        str(temperature), "--seed", str(seed), "--ignore-eos", "yes"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True, timeout=120)
    for line in p.stdout.decode("latin-1").splitlines():
        if line.startswith("tokens:"):
            return [int(t) for t in line.split()[1:]]
    raise AssertionError("no tokens line: %r" % p.stdout[:500])


def sampling(model):
    ref = {s: colocated_sampled(model, PROMPT, 12, s) for s in (7, 8)}
    assert ref[7] != ref[8], ref
    for layout in ("1p1d", "2p1d"):
        with Pool(layout=layout, model=model, timeout=60) as pool:
            for s in (7, 8):
                for _ in range(2):
                    r = pool.complete(PROMPT, max_tokens=12, temperature=1.0, seed=s,
                                      ignore_eos=True, return_token_ids=True)
                    got = r["choices"][0]["token_ids"]
                    assert got == ref[s], "%s seed %d: %s, colocated %s" % (layout, s, got,
                                                                             ref[s])
            runs = [tuple(pool.complete(PROMPT, max_tokens=12, temperature=1.0, ignore_eos=True,
                                        return_token_ids=True)["choices"][0]["token_ids"])
                    for _ in range(3)]
            assert len(set(runs)) == 3, "no seed: calls should differ, got %s" % runs
            print("%s: seeded == colocated (seeds 7, 8); unseeded calls differ" % layout)


def compat_check(model):
    bindir = find_bin()
    procs = []
    with Pool(layout="1p1d", model=model, timeout=60) as pool:
        st, h = pool.health()
        assert st == 200, h
        good, dec = h["prefill"][0]["url"], h["decode"][0]["url"]
        assert [p["state"] for p in h["pairs"]] == ["compatible"], h["pairs"]
        base = free_port_range(2)
        bad = "tcp://127.0.0.1:%d" % base
        try:
            procs.append(subprocess.Popen(
                [os.path.join(bindir, "kvf-prefill"), "--model", model, "--tp", "1",
                 "--listen", bad, "--side-port", str(base + 1), "--engine-id", "prefill-bad",
                 "--kv-dtype", "fp32"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            px = subprocess.Popen(
                [os.path.join(bindir, "kvf-proxy"), "--prefill", "%s,%s" % (good, bad),
                 "--decode", dec, "--model", model, "--model-name", "tiny", "--port", "0"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(px)
            line = px.stdout.readline()
            assert "listening on" in line, line
            proxy = Proxy("127.0.0.1", int(line.strip().rsplit(":", 1)[1]), "tiny")

            def verdicts():
                pairs = proxy.health()[1]["pairs"]
                return {p["prefill"]: p for p in pairs}
            wait_for(lambda: all(p["state"] in ("compatible", "refused")
                                 for p in verdicts().values()) and len(verdicts()) == 2, 30,
                     "both pairings checked")
            v = verdicts()
            assert v[good]["state"] == "compatible", v
            assert v[bad]["state"] == "refused", v
            assert "handshake refused: kv_dtype local=bf16 remote=fp32" in v[bad]["error"], v
            st, h = proxy.health()
            assert st == 200, h
            for _ in range(4):
                r = proxy.complete(PROMPT, max_tokens=4, temperature=0)
                assert r["prefill_instance"] == good, r["prefill_instance"]
            m = proxy.metrics()
            assert m.value("kvf_proxy_handshake_refusals_total") == 0, m.text[:1500]
            assert m.value("kvf_proxy_requests_total", code="200") == 4, m.text[:1500]
            print("refused pairing reported by /health (%s) and never routed"
                  % v[bad]["error"][:60])
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def main():
    model = model_dir("tiny-hybrid")
    compat_check(model)
    sampling(model)
    print("test_e2e_serving passed")


if __name__ == "__main__":
    sys.exit(main())
