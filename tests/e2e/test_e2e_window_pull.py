#!/usr/bin/env python3
"""The sliding-window pull through a pool (docs/ARCHITECTURE.md §7, issue 44 item 2).

The Mistral checkpoint transformers saved (tests/data/families/mistral-swa: both layers slide,
window W = 40) at 1p1d and 1p2d: prompts of increasing length (about 30, 60, 200 and 600
tokens, or as many as the model's positions allow) pull only the window's blocks. With per-token KV bytes measured on the prompt inside
the window (a whole pull), each longer prompt's kv_transfer.bytes must equal exactly the
tokens from the window's first decode block, (N - floor((N - W) / B) * B) tokens, and stay
within ceil(W / B) + 1 blocks however long N, while its greedy tokens equal the colocated
`kvf generate` run's. Decode's prefix cache (on) must never serve a block the window zeroed:
the same prompt asked again, and the long prompt's first half (its zeroed blocks' prefix)
asked after it, get no decode hit and the colocated tokens; the short prompt (nothing zeroed)
asked twice is served its full blocks from decode's cache with the same tokens, and so is
its 100-token extension, which then reads from the window's first block on (a hit below the
window start: the two compose) and zeroes the blocks between.

A model mixing full and sliding layers (--model gpt-oss: layers [sliding, full, sliding];
gemma3-swa alike) keeps them in KV cache groups of their own and reads its full groups' whole
prompt and its sliding groups from the window's first block on: per layer and token bytes t
measured on the short prompt, each prompt's bytes must equal exactly F (N - hit) t +
S (N - first) t for F full and S sliding layers, the sliding share within the window's bound.
Decode indexes such a prompt with its zeroed sliding blocks as "not cached"; by the sliding
hit rule a prefix of it is served only where its own window lies in blocks that were read,
which no block-aligned prefix of the prompt is: the repeats above stay misses.

    python3 tests/e2e/test_e2e_window_pull.py [--model NAME] [LAYOUT...]
        (default mistral-swa, 1p1d 1p2d; NAME a folder of tests/data/families)
"""

import json
import os
import random
import sys
import urllib.request

from e2e_models import reference
from kvf_e2e import Metrics, Pool, free_port_range, repo_root, wait_for

MAX_TOKENS = 8
WINDOW = 40
BLOCK = 16   # decode's logical block (--block-size, a dense model: exactly it)


def text(n, seed):
    """n bytes of lower-case words (a byte tokenizer: about one token each)."""
    rnd = random.Random(seed)
    out = ""
    while len(out) < n:
        out += "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz")
                       for _ in range(rnd.randint(2, 8))) + " "
    return out[:n]


class DecodeMetrics:
    def __init__(self, port):
        self.url = "http://127.0.0.1:%d/metrics" % port
        self.last_hits = 0

    def hit_after(self, n):
        """The prompt tokens decode's cache served to pull n (its /metrics every 100 ms)."""
        got = {}

        def published():
            got["m"] = Metrics(urllib.request.urlopen(self.url, timeout=10).read().decode())
            return got["m"].sum("kvf_daemon_kv_pulls_total") == n
        wait_for(published, 10, "decode's /metrics to count pull %d" % n)
        now = int(got["m"].sum("vllm:prefix_cache_hits_total"))
        delta, self.last_hits = now - self.last_hits, now
        return delta


def run(layout, model, prompts, refs):
    rows = []
    dp = free_port_range(1)
    with Pool(layout=layout, model=model, timeout=60,
              decode_args=["--metrics-port=%d" % dp],
              extra_args=["--block-size", str(BLOCK), "--prefix-caching", "on"]) as pool:
        dec = DecodeMetrics(dp)
        for i, (name, prompt) in enumerate(prompts):
            r = pool.complete(prompt, max_tokens=MAX_TOKENS, temperature=0,
                              return_token_ids=True, timeout=120)
            got = r["choices"][0]["token_ids"]
            n = r["usage"]["prompt_tokens"]
            assert got == refs[prompt], "%s %s: tokens %s, colocated %s" % (
                layout, name, got, refs[prompt])
            rows.append((name, n, r["kv_transfer"]["bytes"], dec.hit_after(i + 1)))
    return rows


def check(layout, rows, layers):
    """layers: (full, sliding) attention layer counts of the model."""
    full, sliding = layers
    by = {name: (n, b, hit) for name, n, b, hit in rows}
    n0, b0, hit0 = by["short"]
    nl = full + sliding
    assert n0 <= WINDOW and hit0 == 0 and b0 > 0 and b0 % (n0 * nl) == 0, by["short"]
    per_tok = b0 // n0                     # a whole pull: the KV bytes of one token
    per_layer = per_tok // nl              # of one layer
    bound = ((WINDOW + BLOCK - 1) // BLOCK + 1) * BLOCK * per_layer * sliding
    for name, n, b, hit in rows:
        # only the short prompt (nothing zeroed) is served: its full blocks to its repeat and to
        # its extension; a window pull's zeroed sliding blocks never are (indexed "not
        # cached", and every block-aligned prefix's window reaches one)
        want = n0 // BLOCK * BLOCK if name.startswith("short ") else 0
        assert hit == want, "%s %s: decode's cache served %d tokens, expected %d" % (
            layout, name, hit, want)
        # the partial pull and the window compose: a sliding layer reads tokens
        # [max(hit, window start), N), a full layer [hit, N)
        first = max(hit, max(0, n - WINDOW) // BLOCK * BLOCK)
        expect = (full * (n - hit) + sliding * (n - first)) * per_layer
        assert b == expect, "%s %s (N %d): %d bytes, expected %d" % (
            layout, name, n, b, expect)
        slid = b - full * (n - hit) * per_layer
        assert slid <= bound, "%s %s: sliding layers' %d bytes over the window's %d" % (
            layout, name, slid, bound)
    print("%s: KV bytes pulled per prompt (%d full + %d sliding layers, window %d, decode block"
          " %d, %d bytes a token and layer; sliding layers' bound %d)" % (
              layout, full, sliding, WINDOW, BLOCK, per_layer, bound))
    print("| prompt | tokens | bytes pulled | full layers | sliding layers | whole pull |"
          " decode hit |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, n, b, hit in rows:
        fb = full * (n - hit) * per_layer
        print("| %s | %d | %d | %d | %d | %d | %d |" % (name, n, b, fb, b - fb, n * per_tok,
                                                         hit))


def main():
    args = sys.argv[1:]
    name = "mistral-swa"
    if args[:1] == ["--model"]:
        name, args = args[1], args[2:]
    layouts = args or ["1p1d", "1p2d"]
    model = os.path.join(repo_root(), "tests", "data", "families", name)
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["sliding_window"] == WINDOW, cfg["sliding_window"]
    # mistral: every layer slides; gemma3_text / gpt_oss: layer_types
    types = cfg.get("layer_types") or ["sliding_attention"] * cfg["num_hidden_layers"]
    layers = (types.count("full_attention"), types.count("sliding_attention"))
    assert sum(layers) == cfg["num_hidden_layers"], types
    # about 600 tokens, within the model's positions (gpt-oss's reference checkpoint: 512)
    long = text(min(600, cfg["max_position_embeddings"] - MAX_TOKENS - 16), 44)
    prompts = [("short", text(30, 41)), ("60", text(60, 42)), ("200", text(200, 43)),
               ("long", long), ("long again", long), ("long's first half", long[:len(long) // 2]),
               ("short again", text(30, 41)), ("short extended", text(30, 41) + text(70, 45))]
    refs = {p: reference(model, p, MAX_TOKENS)[0] for _, p in prompts}
    for layout in layouts:
        check(layout, run(layout, model, prompts, refs), layers)
    print("test_e2e_window_pull %s passed" % name)


if __name__ == "__main__":
    main()
