#!/usr/bin/env python3
"""Prefix caching through a pool (docs/PREFIX_CACHE.md): bit for bit the same answers.

The trained tiny hybrid (and the dense checkpoint at 1p1d) serve a three-turn conversation
(each turn's prompt: the last prompt, its answer, a new question, as token ids), a prompt
shorter than one 80-token attention block asked twice, and one prompt under two salts. A
pool with the prefix cache on (the default) and one with --prefix-caching off must return
the same token ids and logprobs (the sampled tokens' and the top 5, as JSON numbers printed
with 9 significant digits, i.e. a float's bits) for every request, while the proxy's
vllm:prefix_cache_hits_total shows the cache served the later turns, the short prompt on
the state grid (64 tokens) and the second request of a salt, never the other salt's.

    python3 tests/e2e/test_e2e_prefix_cache.py [LAYOUT...]   (default 1p1d 2p4d)
"""

import os
import random
import sys

from kvf_e2e import Pool, repo_root

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
    with Pool(layout=layout, model=model, timeout=60,
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
    return out, trace


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


def main():
    layouts = sys.argv[1:] or ["1p1d", "2p4d"]
    root = repo_root()
    hybrid = os.path.join(root, "models-trained", "tiny-hybrid")
    dense = os.path.join(root, "models-trained", "tiny-dense")
    for layout in layouts:
        check(layout, hybrid, 300, True)
    if not sys.argv[1:]:
        check("1p1d", dense, 300, False)
    print("test_e2e_prefix_cache passed")


if __name__ == "__main__":
    main()
