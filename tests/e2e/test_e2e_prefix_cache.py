#!/usr/bin/env python3
"""Prefix caching through a pool (docs/PREFIX_CACHE.md): bit for bit the same answers.

The trained tiny hybrid (1p1d, 4p2d, 1p4d, 2p4d; the dense checkpoint at 1p1d) serve a
three-turn conversation (each turn's prompt: the last prompt, its answer, a new question, as
token ids), a prompt
shorter than one 80-token attention block asked twice, and one prompt under two salts (and the stored Qwen3-Next
checkpoint at 4p2d: Gated DeltaNet states on the same grid). A
pool with the prefix cache on (the default) and one with --prefix-caching off must return
the same token ids and logprobs (the sampled tokens' and the top 5, as JSON numbers printed
with 9 significant digits, i.e. a float's bits) for every request, while the proxy's
vllm:prefix_cache_hits_total shows the cache served the later turns, the short prompt on
the state grid (64 tokens) and the second request of a salt, never the other salt's.

Decode's own cache (docs/PREFIX_CACHE.md §6), from decode's /metrics after each request: it
serves exactly the full decode blocks of the longest common prefix with what it pulled before
under the same salt (a dense model at 1p1d: also its answers' blocks), pulls the rest, and the
KV bytes it pulls are the cache-off pool's less exactly the served tokens' bytes (so a later
turn pulls bytes in proportion to its new tokens); a 240-token prompt asked twice is a full
attention hit (the dense model then reads nothing, the lease still settled). Also with
decode blocks other than prefill's: dense 16 / 48, hybrid 80 / 96.

    python3 tests/e2e/test_e2e_prefix_cache.py [LAYOUT...]   (default 1p1d 4p2d 1p4d 2p4d)
"""

import os
import random
import re
import subprocess
import sys

import json
import urllib.request

from kvf_e2e import Metrics, Pool, find_bin, free_port_range, repo_root, wait_for

MAX_TOKENS = 8


def hits(pool):
    m = pool.metrics()
    return (m.sum("vllm:prefix_cache_hits_total"), m.sum("vllm:prefix_cache_queries_total"))


def ask(pool, ids, **extra):
    r = pool.complete(ids, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True,
                      logprobs=5, ignore_eos=True, **extra)
    ch = r["choices"][0]
    return ch["token_ids"], ch["logprobs"]


def script(vocab):
    """(name, prompt builder) steps; a builder gets the answers so far."""
    rnd = random.Random(39)
    q = [[rnd.randrange(3, vocab) for _ in range(n)] for n in (150, 41, 37)]
    short = [rnd.randrange(3, vocab) for _ in range(70)]
    salted = [rnd.randrange(3, vocab) for _ in range(130)]
    # 240 tokens: whole blocks of 16, 48 and 80 tokens, so its second ask is a full attention
    # hit on decode (a model without Mamba layers then reads nothing, yet settles the lease)
    whole = [rnd.randrange(3, vocab) for _ in range(240)]
    return q, short, salted, whole


def run(layout, model, caching, vocab, decode_args=()):
    """Every answer of the script, the hit counter after each step, and what decode pulled
    for each step: (prompt, salt, answer, prompt tokens served by decode's own cache,
    prompt tokens pulled, KV bytes pulled) and its block size."""
    q, short, salted, whole = script(vocab)
    out, trace, pulls = [], [], []
    mp = free_port_range(2)
    dp = mp + 1
    with Pool(layout=layout, model=model, timeout=60, prefill_args=["--metrics-port=%d" % mp],
              decode_args=["--metrics-port=%d" % dp] + list(decode_args),
              extra_args=["--prefix-caching", caching, "--prefix-state-grid", "64"]) as pool:
        dec = DecodeSeries(dp)

        def step(name, ids, salt=None):
            r = ask(pool, ids, **({"cache_salt": salt} if salt else {}))
            out.append(r)
            trace.append((name, hits(pool)))
            pulls.append((list(ids), salt, r[0]) + dec.after(len(out)))
            return r

        conv = list(q[0])
        for turn in range(3):
            ids, _ = step("turn %d (%d tokens)" % (turn + 1, len(conv)), conv)
            conv += ids + (q[turn + 1] if turn < 2 else [])
        for i in range(2):
            step("short %d" % i, short + ([5] * i))      # 70 then 71 tokens, under a block
        for salt in ("tenant-a", "tenant-b", "tenant-a"):
            step("salt %s" % salt, salted, salt)
        for i in range(2):
            step("whole blocks %d" % i, whole)
        daemon_series(mp, caching, hits(pool), pool)
        block = dec.block_size()
    return out, trace, (pulls, block)


class DecodeSeries:
    """Decode's /metrics (docs/PREFIX_CACHE.md §6): per request, the prompt tokens its own
    cache served (vLLM's hits counter), those it pulled, and the KV bytes pulled."""

    def __init__(self, port):
        self.url = "http://127.0.0.1:%d" % port
        self.last = (0, 0, 0)

    def scrape(self):
        return Metrics(urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode())

    def after(self, n):
        """The deltas of request n (the daemon publishes every 100 ms: wait for its pull)."""
        got = {}

        def published():
            m = self.scrape()
            got["m"] = m
            return m.sum("kvf_daemon_kv_pulls_total") == n
        wait_for(published, 10, "decode's /metrics to count pull %d" % n)
        m = got["m"]
        now = (m.sum("vllm:prefix_cache_hits_total"),
               m.sum("kvf_daemon_prefix_pulled_tokens_total"),
               m.sum("kvf_daemon_kv_pulled_bytes_total"))
        delta = tuple(int(a - b) for a, b in zip(now, self.last))
        self.last = now
        assert m.sum("kvf_daemon_prefix_unknown_source_total") == 0, "prefill sent no class"
        return delta

    def block_size(self):
        return json.loads(urllib.request.urlopen(self.url + "/health", timeout=10).read()
                          .decode())["block_size"]


def expected_decode_hits(pulls, block, outputs_kept):
    """What decode's cache must serve each request: the full blocks of the longest common
    prefix with a sequence it computed or pulled before under the same salt (the prompt; with
    outputs_kept also the answer's tokens whose KV decode computed, all but the last)."""
    seen, want = [], []
    for prompt, salt, answer, _, _, _ in pulls:
        best = 0
        for s_salt, seq in seen:
            if s_salt != salt:
                continue
            lcp = 0
            while lcp < min(len(seq), len(prompt)) and seq[lcp] == prompt[lcp]:
                lcp += 1
            best = max(best, lcp // block * block)
        want.append(best)
        seen.append((salt, prompt + (answer[:-1] if outputs_kept else [])))
    return want


def check_decode(name, on, off, outputs_kept):
    """Decode's side: with the cache on, each request pulls only the prompt tokens its own
    cache lacks, and the KV bytes it pulls are the cache-off bytes less exactly the served
    tokens' bytes (so bytes per turn are proportional to the new tokens)."""
    (pon, block), (poff, block_off) = on, off
    assert block == block_off, (block, block_off)
    want = expected_decode_hits(pon, block, outputs_kept)
    got = [h for _, _, _, h, _, _ in pon]
    assert got == want, "%s: decode hits per request %s, expected %s" % (name, got, want)
    assert got[1] > 0 and got[2] > got[1], got     # later turns hit decode's cache
    if len(pon[-1][0]) % block == 0:
        assert got[-1] == len(pon[-1][0]), got     # the whole prompt from decode's cache
    if outputs_kept:   # a model without Mamba layers: nothing read, the lease still settled
        assert pon[-1][5] == 0, pon[-1][3:]
    per_token = None
    for i, (a, b) in enumerate(zip(pon, poff)):
        n = len(a[0])
        assert b[3] == 0 and b[4] == 0, (i, b[3:])     # off: decode looks nothing up
        assert a[3] + a[4] == n and a[3] % block == 0, (i, a[3:], block)
        if a[3] > 0:
            saved = b[5] - a[5]
            assert saved > 0 and saved % a[3] == 0, (i, b[5], a[5], a[3])
            per_token = per_token or saved // a[3]
            assert saved == per_token * a[3], (i, saved, per_token, a[3])
        else:
            assert a[5] == b[5], (i, a[5], b[5])
    for i in range(1, len(poff)):   # off: bytes are affine in the prompt length
        assert poff[i][5] - poff[0][5] == per_token * (len(poff[i][0]) - len(poff[0][0])), \
            (i, poff[i][5], poff[0][5], per_token)
    print("%s: decode block %d, served by decode's cache %s, pulled tokens %s, KV bytes "
          "pulled on %s off %s (%d bytes per token)" %
          (name, block, got, [a[4] for a in pon], [a[5] for a in pon], [b[5] for b in poff],
           per_token))


def daemon_series(port, caching, proxy_counts, proxy=None):
    """The prefill daemon's own /metrics and /health say what the proxy counted."""
    url = "http://127.0.0.1:%d" % port
    scrape = {}

    def current():   # the daemon publishes its numbers every 100 ms while its loop turns
        scrape["m"] = Metrics(urllib.request.urlopen(url + "/metrics", timeout=10).read()
                              .decode())
        scrape["h"] = json.loads(urllib.request.urlopen(url + "/health", timeout=10).read()
                                 .decode())
        m = scrape["m"]
        # with the cache off the engine looks nothing up: its queries stay 0 (the proxy's
        # count every prompt token)
        return (m.sum("vllm:prefix_cache_hits_total"),
                m.sum("vllm:prefix_cache_queries_total")) == \
            ((proxy_counts[0], proxy_counts[1]) if caching == "on" else (0, 0))
    wait_for(current, 10, "prefill's /metrics to count what the proxy counted %s" %
             (proxy_counts,))
    m, h = scrape["m"], scrape["h"]
    q, hit = m.sum("vllm:prefix_cache_queries_total"), m.sum("vllm:prefix_cache_hits_total")
    attn = m.sum("kvf_daemon_prefix_hit_tokens_total", kind="attention", source="local")
    state = m.sum("kvf_daemon_prefix_hit_tokens_total", kind="state", source="local")
    assert h["prefix_caching"] == (caching == "on"), h
    assert abs(h["prefix_cache_hit_rate"] - (hit / q if q else 0.0)) < 1e-5, (h, hit, q)
    assert m.sum("kvf_daemon_prefix_caching") == (1 if caching == "on" else 0)
    if proxy is not None:   # the proxy's /health shows each prefill instance's hit rate
        def proxy_rate():
            inst = proxy.health()[1]["prefill"][0]
            return (inst["prefix_caching"] == (caching == "on") and
                    abs(inst["prefix_cache_hit_rate"] - h["prefix_cache_hit_rate"]) < 1e-5)
        wait_for(proxy_rate, 10, "the proxy's /health to show prefill's hit rate")
    if caching == "on":
        assert hit > 0 and attn > 0 and attn <= hit and state <= hit, (hit, attn, state)
    print("prefill /metrics: queries %d hits %d (attention %d, state %d), /health hit rate %s"
          % (q, hit, attn, state, h["prefix_cache_hit_rate"]))


def check(layout, model, vocab, hybrid, decode_args=()):
    on, t_on, d_on = run(layout, model, "on", vocab, decode_args)
    off, t_off, d_off = run(layout, model, "off", vocab, decode_args)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a == b, "%s: step %d differs with the cache on:\n%s\n%s" % (layout, i, a, b)
    # decode keeps its outputs' blocks only where its numerics are prefill's (one TP) and the
    # model has no Mamba layers (docs/PREFIX_CACHE.md §3, §6)
    check_decode("%s %s%s" % (layout, os.path.basename(model), " ".join([""] + list(decode_args))),
                 d_on, d_off, not hybrid and layout == "1p1d")
    assert all(h == 0 for _, (h, _) in t_off), t_off
    gain = [t_on[0][1][0]] + [t_on[i][1][0] - t_on[i - 1][1][0] for i in range(1, len(t_on))]
    names = [n for n, _ in t_on]
    print("%s %s: hits per step %s" % (layout, os.path.basename(model),
                                       list(zip(names, gain))))
    assert gain[0] == 0 and gain[1] > 0 and gain[2] > gain[1], gain      # later turns hit
    if hybrid:
        # turn 1's prompt of 150 tokens is checkpointed at 128, turn 2's (199) at 192
        assert gain[1] == 128 and gain[2] == 192, gain
        assert gain[3] == 0 and gain[4] == 64, gain     # a 71-token prompt hits on the grid
    else:
        assert gain[4] > 0, gain
    assert gain[5] == 0 and gain[6] == 0 and gain[7] > 0, gain   # salts never share


def refused_budget(hybrid):
    """A state budget that holds no checkpoint: kvf generate and kvf-prefill refuse to
    start, naming the budget and the size of one checkpoint."""
    bins = find_bin()
    for cmd in ([os.path.join(bins, "kvf"), "generate", "--model", hybrid, "--prompt", "hi",
                 "--prefix-state-bytes", "1k"],
                [os.path.join(bins, "kvf-prefill"), "--model", hybrid, "--insecure", "yes",
                 "--listen", "tcp://127.0.0.1:1", "--prefix-state-bytes", "1k"]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        m = re.search(r"--prefix-state-bytes 1024 holds no Mamba state checkpoint of (\d+) "
                      r"bytes per rank \(state grid 64 tokens\)", p.stderr)
        assert p.returncode != 0 and m and int(m.group(1)) > 1024, (cmd, p.returncode,
                                                                    p.stderr[-2000:])
    print("a state budget under one checkpoint is refused at start, naming both sizes")


def main():
    layouts = sys.argv[1:] or ["1p1d", "4p2d", "1p4d", "2p4d"]
    root = repo_root()
    hybrid = os.path.join(root, "models-trained", "tiny-hybrid")
    dense = os.path.join(root, "models-trained", "tiny-dense")
    refused_budget(hybrid)
    for layout in layouts:
        check(layout, hybrid, 300, True)
    if not sys.argv[1:]:
        check("1p1d", dense, 300, False)
        # prefill and decode blocks of different sizes (16 and 48 tokens): the hit is on
        # decode's blocks, the pull reads prefill's pages from the hit's token on
        check("1p1d", dense, 300, False, decode_args=["--block-size=48"])
        check("1p1d", hybrid, 300, True, decode_args=["--block-size=96"])   # 80 and 96
        # Gated DeltaNet state (qwen3_next) checkpointed on the same grid, across TP 4 -> 2
        check("4p2d", os.path.join(root, "tests", "data", "families", "qwen3-next"), 256, True)
    print("test_e2e_prefix_cache passed")


if __name__ == "__main__":
    main()
