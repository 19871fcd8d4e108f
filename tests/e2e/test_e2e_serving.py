#!/usr/bin/env python3
"""The serving plane against real pools.

- Startup compatibility check: a proxy in front of a compatible and an
  incompatible prefill instance (another KV dtype) runs the handshake of
  every pairing at start; /health lists the refused pairing with the
  refusal text, stays 200, and no request is ever routed to it.
- No head-of-line stall: a long prompt and short prompts arrive together;
  each short one's time to first token stays within two engine steps (the
  scheduler shares each step's token budget), not the long prefill, and
  /health stays 200 throughout, answered even mid-step (it reports the age
  of the step in progress). A prompt longer than max_position_embeddings
  is refused at once, naming the limit.
- Sampling as OpenAI does: without `seed` every request draws a fresh seed
  (two calls differ); with a seed the tokens equal a colocated run's with
  the same seed, through 1p1d and 2p1d.
"""

import os
import subprocess
import sys
import time

from e2e_models import model_dir
from kvf_e2e import HttpError, Pool, Proxy, find_bin, free_port_range, wait_for

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


def long_and_short(model):
    import threading
    long_prompt = "".join(chr(97 + (i * 7) % 26) for i in range(3000))
    with Pool(layout="1p1d", model=model, timeout=60) as pool:
        pool.complete(PROMPT, max_tokens=2, temperature=0)            # warm-up
        stop, health, busy_seen = threading.Event(), [], [0.0]

        def watch():
            while not stop.is_set():
                t0 = time.monotonic()
                st, h = pool.health(timeout=10)
                health.append((st, time.monotonic() - t0))
                p = h["prefill"][0]
                busy_seen[0] = max(busy_seen[0], p.get("step_running_ms", 0), p.get("step_ms", 0))
                time.sleep(0.05)
        w = threading.Thread(target=watch)
        w.start()
        out = {}

        def run_long():
            out["long"] = pool.complete(long_prompt, max_tokens=2, temperature=0, timeout=120)
        t_long = threading.Thread(target=run_long)
        try:
            t_long.start()
            wait_for(lambda: pool.health()[1]["prefill"][0]["running"] >= 1, 30,
                     "the long prompt is being prefilled")
            shorts, t_short = [], []
            for i in range(3):
                shorts.append(pool.complete("short %d" % i, max_tokens=2, temperature=0,
                                            timeout=120))
                t_short.append(time.monotonic())
            t_long.join(timeout=180)
            t_long_done = time.monotonic()
        finally:
            stop.set()
            w.join(timeout=30)
        long_r = out["long"]
        ttfts = [r["ttft_ms"] for r in shorts]
        step = busy_seen[0]
        print("long prompt (%d tokens): prefill %.0f ms; short TTFTs %s ms; longest engine step"
              " %.0f ms; /health polled %d times, all 200, slowest answer %.0f ms"
              % (long_r["usage"]["prompt_tokens"], long_r["prefill_ms"],
                 [round(t) for t in ttfts], step, len(health), 1000 * max(d for _, d in health)))
        assert all(st == 200 for st, _ in health), [st for st, _ in health]
        assert max(d for _, d in health) < 2.0, "a /health answer took %.2f s" % max(
            d for _, d in health)
        # the probe was answered while a step ran (it reported the step's age)
        assert step > 0, busy_seen
        # A short prompt waits at most for the step in progress, then is prefilled in
        # the next one beside the long prompt's chunk: two steps, not the long prefill.
        assert all(t < 2 * step + 2000 for t in ttfts), (ttfts, step)
        assert t_short[0] < t_long_done, "the first short prompt waited for the long one"
        try:
            pool.complete("x" * 5000, max_tokens=2, temperature=0)
            raise AssertionError("a prompt over max_position_embeddings was served")
        except HttpError as e:
            msg = e.body["error"]["message"]
            assert e.status == 400 and "max_position_embeddings (4096)" in msg, (e.status, msg)
        print("over-long prompt refused at once: %s" % msg)


def compat_check(model):
    bindir = find_bin()
    procs = []
    with Pool(layout="1p1d", model=model, timeout=60) as pool:
        st, h = pool.health()
        assert st == 200, h
        good, dec = h["prefill"][0]["url"], h["decode"][0]["url"]
        keys = os.path.join(pool.run_dir, "keys")   # kvf-up's key set: a second prefill-0 key user
        assert [p["state"] for p in h["pairs"]] == ["compatible"], h["pairs"]
        base = free_port_range(2)
        bad = "tcp://127.0.0.1:%d" % base
        try:
            procs.append(subprocess.Popen(
                [os.path.join(bindir, "kvf-prefill"), "--model", model, "--tp", "1",
                 "--listen", bad, "--side-port", str(base + 1), "--engine-id", "prefill-bad",
                 "--kv-dtype", "fp32", "--keys", keys, "--key-id", "prefill-0"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            px = subprocess.Popen(
                [os.path.join(bindir, "kvf-proxy"), "--prefill", "%s,%s" % (good, bad),
                 "--decode", dec, "--model", model, "--model-name", "tiny", "--port", "0",
                 "--keys", keys],
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
            assert "handshake refused: kv_dtype prefill=fp32 decode=bf16" in v[bad]["error"], v
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
    long_and_short(model)
    compat_check(model)
    sampling(model)
    print("test_e2e_serving passed")


if __name__ == "__main__":
    sys.exit(main())
