#!/usr/bin/env python3
"""KV events and routing by cached prefix (docs/PREFIX_CACHE.md section 7).

A pool of two prefill instances and one decode instance of the trained tiny hybrid, each
prefill publishing vLLM's KV events (--kv-events-endpoint, --kv-events-replay-endpoint on
free ports):

1. A subscriber written as vLLM's consumers are (pyzmq SUB, a replay request, msgpack)
   reads one instance's stream: batches [ts, events, 0] numbered from 0 (the first
   AllBlocksCleared), BlockStored events by field name with vLLM's types, their block
   hashes the chain of tests/common/tokenizer/block_hash_ref.py over the prompt's tokens (when
   the xxhash package is there), and a replay from 0 that gives the same batches as live.
2. --routing prefix (the default): requests that share a 200-token prefix after the first
   all go to the instance that cached it (kvf_instance_prefix_routed_total counts them,
   its prefill's prefix cache hits count the tokens), the other instance gets none.
3. --routing load: the same requests, two at a time under --max-outstanding 1, go to
   both instances, each computing the prefix itself (the prefix counts for nothing).
4. Decode routed by its own cache (section 6): one prefill and two decode instances, both
   decode instances publishing events. Under --routing prefix each conversation's second
   turn goes to the decode instance that pulled its first (the proxy's kv_events index of
   decode), which serves the first turn's full prompt blocks from its own cache: the
   response's kv_transfer.decode_cached_tokens, that decode's own /metrics
   (vllm:prefix_cache_hits_total, kvf_daemon_prefix_pulled_tokens_total, its KV bytes per
   pull) say so. Under --routing load the turns spread round robin over both decode
   instances, the second turns land on the other one and pull the whole prompt again.

    python3 tests/e2e/test_e2e_kv_events.py
"""

import os
import random
import sys
import threading
import time

import urllib.request

from kvf_e2e import Metrics, Pool, free_port_range, repo_root, wait_for

try:
    import msgpack
    import zmq
except ImportError:
    print("SKIP: needs the Python packages pyzmq and msgpack (deploy/install-deps.sh --tests)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common",
                                "tokenizer"))
try:
    import contextlib
    import io
    import xxhash  # noqa: F401  (block_hash_ref needs it)
    with contextlib.redirect_stdout(io.StringIO()):   # it prints its vectors on import
        import block_hash_ref
except ImportError:
    block_hash_ref = None

EVENTS = ["--kv-events-endpoint=tcp://127.0.0.1:*",
          "--kv-events-replay-endpoint=tcp://127.0.0.1:*"]
N_REQ = 5


def prompts(vocab=300):
    rnd = random.Random(3939)
    prefix = [rnd.randrange(3, vocab) for _ in range(200)]
    return [prefix + [rnd.randrange(3, vocab) for _ in range(30)] for _ in range(N_REQ)]


def prefill_health(pool):
    return pool.health()[1]["prefill"]


def events_ready(pool):
    """Both prefill instances' kv_events in the proxy's /health, subscribed."""
    pf = prefill_health(pool)
    if len(pf) == 2 and all(p.get("kv_events", {}).get("subscribed") for p in pf):
        return pf
    return None


class Subscriber:
    """vLLM's consumer pattern: SUB on the PUB endpoint, a replay request on a gap."""

    def __init__(self, ctx, pub, replay):
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(pub)
        self.replay_ep, self.ctx = replay, ctx
        self.live = {}

    def poll(self, timeout_ms=100):
        while self.sub.poll(timeout_ms):
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == b"" and len(seq) == 8, (topic, seq)
            self.live[int.from_bytes(seq, "big")] = payload
            timeout_ms = 0

    def replay(self, start):
        """Every kept batch from @start: a DEALER (a REQ socket takes one reply per request,
        and the replay answers with one message per batch) sends [empty, 8-byte seq]."""
        req = self.ctx.socket(zmq.DEALER)
        req.connect(self.replay_ep)
        req.send_multipart([b"", start.to_bytes(8, "big")])
        got = {}
        while True:
            assert req.poll(5000), "replay did not answer"
            frames = req.recv_multipart()
            assert len(frames) == 3 and frames[0] == b"", frames
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == -1:
                assert frames[2] == b""
                break
            got[seq] = frames[2]
        req.close(0)
        return got


def check_batch(payload, prompt_tokens, digest, unit):
    """vLLM's layout and types; returns the block hashes stored."""
    batch = msgpack.unpackb(payload, raw=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, dp_rank = batch
    assert isinstance(ts, float) and abs(ts - time.time()) < 600 and dp_rank == 0, batch
    stored = []
    for ev in events:
        assert isinstance(ev, dict) and ev["type"] in ("BlockStored", "BlockRemoved",
                                                       "AllBlocksCleared"), ev
        if ev["type"] != "BlockStored":
            continue
        assert list(ev) == ["type", "block_hashes", "parent_block_hash", "token_ids",
                            "block_size", "lora_id", "medium", "lora_name"], list(ev)
        bs, hs = ev["block_size"], ev["block_hashes"]
        assert all(isinstance(h, bytes) and len(h) == 16 for h in hs), hs
        assert ev["parent_block_hash"] is None or len(ev["parent_block_hash"]) == 16
        assert ev["lora_id"] is None and ev["lora_name"] is None and ev["medium"] == "CPU", ev
        assert len(ev["token_ids"]) == bs * len(hs), (len(ev["token_ids"]), bs, len(hs))
        stored.append(ev)
    return events, stored


def check_stream(pool, pf, prompt):
    """Read instance pf's stream while it prefills @prompt; check it against the spec."""
    ev = pf["kv_events"]
    ctx = zmq.Context()
    sub = Subscriber(ctx, ev["endpoint"], ev["replay_endpoint"])
    time.sleep(0.3)   # a SUB joins late (ZeroMQ's slow joiner): what it misses, replay has
    pool.complete(prompt, max_tokens=4, temperature=0, ignore_eos=True)
    wait_for(lambda: (sub.poll(), any(b"BlockStored" in p for p in sub.live.values()))[1],
             10, "a BlockStored batch on the PUB socket")
    replayed = sub.replay(0)
    assert 0 in replayed, sorted(replayed)
    first = msgpack.unpackb(replayed[0], raw=False)[1]
    assert first == [{"type": "AllBlocksCleared"}], first
    for seq, payload in sub.live.items():
        assert replayed.get(seq) == payload, "replay of batch %d differs from live" % seq
    digest = bytes.fromhex(ev["model_digest"])
    unit, bs = ev["hash_unit"], ev["block_size"]
    stored = []
    for seq in sorted(replayed):
        stored += check_batch(replayed[seq], prompt, digest, unit)[1]
    toks = [t for e in stored for t in e["token_ids"]]
    nb = len(toks) // bs
    assert nb >= 1 and toks == prompt[:nb * bs], (nb, bs)   # the prompt's full blocks
    hashes = [h for e in stored for h in e["block_hashes"]]
    if block_hash_ref is not None:   # the spec's chain, computed apart
        h = block_hash_ref.root(digest, b"")
        for j in range(nb):
            for k in range(bs // unit):
                h = block_hash_ref.nxt(h, prompt[j * bs + k * unit:j * bs + (k + 1) * unit])
            want = h[0].to_bytes(8, "little") + h[1].to_bytes(8, "little")
            assert hashes[j] == want, "block %d: hash %s, spec %s" % (j, hashes[j].hex(),
                                                                      want.hex())
        print("block hashes = docs/PREFIX_CACHE.md section 2's chain (block_hash_ref.py)")
    for j in range(1, len(stored)):
        assert stored[j]["parent_block_hash"] == stored[j - 1]["block_hashes"][-1]
    ctx.destroy(0)
    print("PUB stream: %d batches live, the same on replay from 0, %d blocks stored, "
          "block size %d, hash unit %d" % (len(sub.live), nb, bs, unit))


def counts(pool):
    pf = prefill_health(pool)
    return [(p["prefix_cache_queries"], p["prefix_cache_hits"], p["prefix_routed"],
             p["prefix_routed_tokens"]) for p in pf]


def settled(pool, sent):
    """The counters once the instances' health replies show every request sent."""
    n_tokens = sum(len(r) for r in sent)
    return wait_for(lambda: (lambda c: c if sum(q for q, _, _, _ in c) == n_tokens
                             else None)(counts(pool)), 10,
                    "both instances' counters to show every request")


def ask(pool, r):
    pool.complete(r, max_tokens=4, temperature=0, ignore_eos=True)


def run(routing, hybrid, reqs):
    """Per prefill instance (queries, hits, routed by prefix, their expected tokens)."""
    proxy_args = ["--routing=%s" % routing]
    if routing == "load":
        proxy_args.append("--max-outstanding=1")
    sent = []
    with Pool(layout="1p1d", model=hybrid, prefill_instances=2, decode_instances=2,
              timeout=60, prefill_args=EVENTS, proxy_args=proxy_args,
              extra_args=["--prefix-state-grid", "64"]) as pool:
        assert pool.health()[1]["routing"] == routing
        if routing == "prefix":
            pf = wait_for(lambda: events_ready(pool), 20, "the proxy subscribed to both streams")
            check_stream(pool, pf[0], reqs[0])   # also caches reqs[0] on one instance
            sent.append(reqs[0])
            wait_for(lambda: sum(p["kv_events"]["blocks"] for p in prefill_health(pool)) > 0,
                     10, "the proxy's index to hold the stored blocks")
            for r in reqs[1:]:
                ask(pool, r)
                sent.append(r)
        else:   # no subscription, nothing in /health about events
            assert all("kv_events" not in p for p in prefill_health(pool))
            # two at a time with one outstanding request per instance: the second goes to
            # the other instance while the first is in prefill; until both served some
            for i in range(0, 20, 2):
                pair = [reqs[i % N_REQ], reqs[(i + 1) % N_REQ]]
                ts = [threading.Thread(target=ask, args=(pool, r)) for r in pair]
                [t.start() for t in ts]
                [t.join() for t in ts]
                sent += pair
                if i + 2 >= N_REQ and all(q > 0 for q, _, _, _ in settled(pool, sent)):
                    break
        return settled(pool, sent)


class MetricsPool(Pool):
    """A pool whose daemons each serve /metrics (kvf-up --metrics-base-port: prefill i at
    base + i, decode j at base + P + j)."""

    def __init__(self, metrics_base, **kw):
        super().__init__(**kw)
        self.metrics_base = metrics_base

    def _up_cmd(self, base_port):
        cmd = super()._up_cmd(base_port)
        cut = cmd.index("--") if "--" in cmd else len(cmd)
        return cmd[:cut] + ["--metrics-base-port", str(self.metrics_base)] + cmd[cut:]

    def decode_metrics(self, j):
        url = "http://127.0.0.1:%d/metrics" % (self.metrics_base + self.n_prefill + j)
        m = Metrics(urllib.request.urlopen(url, timeout=10).read().decode())
        return (int(m.sum("vllm:prefix_cache_hits_total")),
                int(m.sum("kvf_daemon_prefix_pulled_tokens_total")),
                int(m.sum("kvf_daemon_kv_pulls_total")),
                int(m.sum("kvf_daemon_kv_pulled_bytes_total")))


def conversations(vocab=300, n=3):
    rnd = random.Random(3940)
    return [([rnd.randrange(3, vocab) for _ in range(200)],
             [rnd.randrange(3, vocab) for _ in range(30)]) for _ in range(n)]


def run_decode(routing, hybrid, convs):
    """Each conversation's two turns in order: per turn (conversation, turn, decode index,
    kv_transfer, that decode's /metrics deltas (hits, pulled tokens, pulls, bytes))."""
    out = []
    with MetricsPool(metrics_base=free_port_range(3), layout="1p1d", model=hybrid,
                     prefill_instances=1, decode_instances=2, timeout=60,
                     decode_args=EVENTS, proxy_args=["--routing=%s" % routing],
                     extra_args=["--prefix-state-grid", "64"]) as pool:
        urls = [d["url"] for d in pool.health()[1]["decode"]]
        if routing == "prefix":
            wait_for(lambda: all(d.get("kv_events", {}).get("subscribed")
                                 for d in pool.health()[1]["decode"]), 20,
                     "the proxy subscribed to both decode instances' streams")
        else:
            assert all("kv_events" not in d for d in pool.health()[1]["decode"])
        for c, (first, more) in enumerate(convs):
            prompt = list(first)
            for turn in range(2):
                before = [pool.decode_metrics(j) for j in range(2)]
                blocks = [d.get("kv_events", {}).get("blocks", 0)
                          for d in pool.health()[1]["decode"]]
                r = pool.complete(prompt, max_tokens=4, temperature=0, ignore_eos=True,
                                  return_token_ids=True)
                j = urls.index(r["decode_instance"])
                after = wait_for(lambda: (lambda m: m if m[2] == before[j][2] + 1 else None)(
                    pool.decode_metrics(j)), 10, "decode %d's /metrics to count the pull" % j)
                out.append((c, turn, j, r["kv_transfer"],
                            tuple(a - b for a, b in zip(after, before[j]))))
                if routing == "prefix" and turn == 0:   # the index holds what it stored
                    wait_for(lambda: pool.health()[1]["decode"][j]["kv_events"]["blocks"] >
                             blocks[j], 10, "decode %d's stored blocks in the proxy's index" % j)
                prompt += r["choices"][0]["token_ids"] + more
        health = pool.health()[1]["decode"]
    return out, [(d["prefix_routed"], d["prefix_routed_tokens"]) for d in health]


def check_decode_routing(hybrid):
    convs = conversations()
    out, routed = run_decode("prefix", hybrid, convs)
    for t in out:
        print("--routing prefix: conversation %d turn %d -> decode %d, kv_transfer %s, "
              "its /metrics (hits, pulled tokens, pulls, bytes) +%s" % t)
    full = {}
    for c, turn, j, kv, d in out:
        assert kv["decode_cached_tokens"] + kv["pulled_tokens"] == len(convs[c][0]) + \
            (0 if turn == 0 else 4 + len(convs[c][1])), (c, turn, kv)
        assert (d[0], d[1], d[3]) == (kv["decode_cached_tokens"], kv["pulled_tokens"],
                                      kv["bytes"]), (c, turn, kv, d)   # decode's own count
        if turn == 0:
            assert kv["decode_cached_tokens"] == 0, (c, kv)   # a new conversation
            full[c] = (j, kv["bytes"])
        else:   # the decode that pulled turn 1, serving its full prompt blocks (200 -> 160)
            assert j == full[c][0], "conversation %d: turn 2 went to decode %d, not %d" % (
                c, j, full[c][0])
            assert kv["decode_cached_tokens"] == 160, (c, kv)
            assert kv["bytes"] < full[c][1], (c, kv, full[c])   # 74 tokens + the state
    assert sum(n for n, _ in routed) == len(convs), routed   # each second turn, by prefix
    assert sum(t for _, t in routed) == 160 * len(convs), routed
    out, routed = run_decode("load", hybrid, convs)
    for t in out:
        print("--routing load: conversation %d turn %d -> decode %d, kv_transfer %s, "
              "its /metrics +%s" % t)
    assert {j for _, _, j, _, _ in out} == {0, 1}, out              # spread over both
    moved = [(c, kv) for c, turn, j, kv, _ in out
             if turn == 1 and j != [jj for cc, tt, jj, _, _ in out if cc == c and tt == 0][0]]
    assert moved, out                                                # second turns elsewhere
    assert all(kv["decode_cached_tokens"] == 0 for _, kv in moved), moved
    assert routed == [(0, 0), (0, 0)], routed


def main():
    hybrid = os.path.join(repo_root(), "models-trained", "tiny-hybrid")
    if len(sys.argv) > 1 and sys.argv[1] == "decode":   # part 4 alone
        check_decode_routing(hybrid)
        print("test_e2e_kv_events decode passed")
        return
    reqs = prompts()
    c = run("prefix", hybrid, reqs)
    print("--routing prefix: per instance (queries, hits, routed, routed tokens) %s" % c)
    home = max(range(2), key=lambda i: c[i][0])
    other = 1 - home
    assert c[other][0] == 0, c                       # every request went to one instance
    assert c[home][2] == N_REQ - 1, c                # all but the first routed by prefix
    assert c[home][3] >= (N_REQ - 1) * 160, c        # two 80-token blocks each
    assert c[home][1] >= (N_REQ - 1) * 192, c        # its cache served them (state grid 192)
    c = run("load", hybrid, reqs)
    print("--routing load: per instance (queries, hits, routed, routed tokens) %s" % c)
    assert c[0][0] > 0 and c[1][0] > 0, c            # spread over both
    assert c[0][2] == 0 and c[1][2] == 0, c          # nothing routed by prefix
    assert c[0][1] < c[0][0] - 200 and c[1][1] < c[1][0] - 200, c   # each computed it
    check_decode_routing(hybrid)
    print("test_e2e_kv_events passed")


if __name__ == "__main__":
    main()
