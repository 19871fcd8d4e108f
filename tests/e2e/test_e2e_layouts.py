#!/usr/bin/env python3
"""Disaggregated generation through the proxy matches a colocated run.

For each layout, a pool (kvf-up) serves the tiny hybrid model (the dense
variant for 4p2d too); prompts that end mid-block and on a block boundary
(the tiny model's block is 80 tokens, BOS included) go through the proxy
streamed and not streamed, and their greedy tokens must equal the colocated
`kvf generate` run: token for token at 1p1d, and elsewhere up to a position
where the reference's top-2 logit margin is within fp32 tolerance.

Both page-pool placements: the default (--pool-alloc ucx: each rank's pool is
the UCX connector's shared memory, which the daemons' logs say) for every
layout, and malloc'd pools registered with UCX (--pool-alloc heap) at 2p4d.

`--kv-layout L [--prefill-kv-layout P] LAYOUT...`: both daemons at attention block
layout L (prefill at P when given) against the colocated run at the default
layer-major (docs/ARCHITECTURE.md §7): the same tokens, exactly at 1p1d.
"""

import os
import sys

from e2e_models import check_tokens, model_dir, reference
from kvf_e2e import Pool

PROMPTS = [
    "The ferry left at dawn",            # 23 tokens: mid-block
    "x" * 79,                            # 80 tokens: exactly one block
    "Prefill computes, decode pulls. " * 4,   # 129 tokens: second block, mid-block
]
MAX_TOKENS = 12


def run_layout(layout, model, refs, exact, pool_alloc=None, kv_layout=None, prefill_kv=None):
    extra = ["--pool-alloc", pool_alloc] if pool_alloc else []
    decode_args = ["--kv-layout", kv_layout] if kv_layout else []
    prefill_args = ["--kv-layout", prefill_kv or kv_layout] if kv_layout else []
    with Pool(layout=layout, model=model, timeout=60, extra_args=extra,
              prefill_args=prefill_args, decode_args=decode_args) as pool:
        for i, prompt in enumerate(PROMPTS):
            ref_tokens, ref_logits = refs[prompt]
            r = pool.complete(prompt, max_tokens=MAX_TOKENS, temperature=0,
                              return_token_ids=True)
            got = r["choices"][0]["token_ids"]
            check_tokens(got, ref_tokens, ref_logits, exact, "%s prompt %d" % (layout, i))
            kv = r["kv_transfer"]
            assert kv["bytes"] > 0 and kv["descriptors"] > 0 and kv["reads"] >= 1, kv
            assert r["usage"]["completion_tokens"] == MAX_TOKENS, r["usage"]
            s = pool.complete(prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                              return_token_ids=True)
            assert s.done and not s.errors, s.events[-3:]
            assert s.token_ids == got, (layout, i, s.token_ids, got)
            assert len(s.chunks) >= 2, "stream sent everything in one chunk"
        code, h = pool.health()
        assert code == 200, h
        for inst in h["prefill"] + h["decode"]:
            assert inst["healthy"], inst
        want = "page pools: heap, registered with UCX" if pool_alloc == "heap" else \
            "page pools: allocated by UCX"
        for name in ("prefill-0", "decode-0"):
            assert want in pool.log(name), "%s: no '%s' in its log" % (name, want)
        if kv_layout:
            for name, kl in (("prefill-0", prefill_kv or kv_layout), ("decode-0", kv_layout)):
                w = "kv layout %s (attention blocks)" % kl
                assert w in pool.log(name), "%s: no '%s' in its log" % (name, w)
    print("%s%s%s: %d prompts match the colocated run" % (
        layout, " (heap pools)" if pool_alloc == "heap" else "",
        " (kv layout prefill %s, decode %s)" % (prefill_kv or kv_layout, kv_layout)
        if kv_layout else "", len(PROMPTS)))


def main():
    os.environ["KVF_LOG_LEVEL"] = "info"   # the daemons log where their pools live
    hybrid = model_dir("tiny-hybrid")
    dense = model_dir("tiny-dense")
    href = {p: reference(hybrid, p, MAX_TOKENS) for p in PROMPTS}
    dref = {p: reference(dense, p, MAX_TOKENS) for p in PROMPTS}
    args = sys.argv[1:]
    kv_layout = prefill_kv = None
    while args and args[0] in ("--kv-layout", "--prefill-kv-layout"):
        if args[0] == "--kv-layout":
            kv_layout = args[1]
        else:
            prefill_kv = args[1]
        args = args[2:]
    layouts = args or ["1p1d", "2p2d", "4p2d", "1p4d", "4p1d", "2p4d"]
    for layout in layouts:
        run_layout(layout, hybrid, href, exact=(layout == "1p1d"), kv_layout=kv_layout,
                   prefill_kv=prefill_kv)
    if not sys.argv[1:]:
        run_layout("4p2d", dense, dref, exact=False)
        run_layout("2p4d", hybrid, href, exact=False, pool_alloc="heap")
    print("test_e2e_layouts passed")


if __name__ == "__main__":
    main()
