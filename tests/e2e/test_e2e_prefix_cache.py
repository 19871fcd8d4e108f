#!/usr/bin/env python3
"""Prefix caching through a pool (docs/PREFIX_CACHE.md): bit for bit the same answers.

The trained tiny hybrid (1p1d, 4p2d, 1p4d, 2p4d; the dense checkpoint at 1p1d) serve a
three-turn conversation (each turn's prompt: the last prompt, its answer, a new question, as
token ids), a prompt
shorter than one 80-token attention block asked twice, and one prompt under two salts. A
pool with the prefix cache on (the default) and one with --prefix-caching off must return
the same token ids and logprobs (the sampled tokens' and the top 5, as JSON numbers printed
with 9 significant digits, i.e. a float's bits) for every request, while the proxy's
vllm:prefix_cache_hits_total shows the cache served the later turns, the short prompt on
the state grid (64 tokens) and the second request of a salt, never the other salt's.

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
    return q, short, salted


def run(layout, model, caching, vocab):
    """Every answer of the script, and the hit counter after each step."""
    q, short, salted = script(vocab)
    out, trace = [], []
    mp = free_port_range(1)
    with Pool(layout=layout, model=model, timeout=60, prefill_args=["--metrics-port=%d" % mp],
              extra_args=["--prefix-caching", caching, "--prefix-state-grid", "64"]) as pool:
        conv = list(q[0])
        for turn in range(3):
            ids, lp = ask(pool, conv)
            out.append((ids, lp))
            trace.append(("turn %d (%d tokens)" % (turn + 1, len(conv)), hits(pool)))
            conv += ids + (q[turn + 1] if turn < 2 else [])
        for i in range(2):
            out.append(ask(pool, short + ([5] * i)))      # 70 then 71 tokens, under a block
            trace.append(("short %d" % i, hits(pool)))
        for salt in ("tenant-a", "tenant-b", "tenant-a"):
            out.append(ask(pool, salted, cache_salt=salt))
            trace.append(("salt %s" % salt, hits(pool)))
        daemon_series(mp, caching, hits(pool), pool)
    return out, trace


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


def check(layout, model, vocab, hybrid):
    on, t_on = run(layout, model, "on", vocab)
    off, t_off = run(layout, model, "off", vocab)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a == b, "%s: step %d differs with the cache on:\n%s\n%s" % (layout, i, a, b)
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
    print("test_e2e_prefix_cache passed")


if __name__ == "__main__":
    main()
