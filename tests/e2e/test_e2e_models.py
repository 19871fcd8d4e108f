#!/usr/bin/env python3
"""Every model family the runner loads answers through a real pool with the
colocated run's tokens: a transformers-5 spelled hybrid with Mamba/MLP biases
and a gelu conv activation (three safetensors shards), a Nemotron-H MoE hybrid,
a dense Llama with Llama-3 rope scaling and a dense Qwen3 (q/k norm, biases;
bf16 weights), and the Bamba and Granite 4.0-H checkpoints transformers saved
under tests/data/families, each at 4p2d and 1p4d (TP4 replicates their 2 KV
heads; the MoE's 8 experts split 2 per rank at TP4, Granite's 4 one per rank), and
the sliding-window mistral and gpt_oss ones (attention sinks, YaRN, clamped-SwiGLU
experts), and the Qwen3-Next and Qwen3.5 checkpoints (Gated DeltaNet state translated between TP 4 and 2 / 1
and 4).
"""

import os
import sys

from e2e_models import check_tokens, model_dir, reference, repo_root
from kvf_e2e import Pool

MODELS = [
    ("tiny-hybrid-bias", dict(shards=3)),
    ("tiny-moe", {}),
    ("tiny-llama", {}),
    ("tiny-qwen3", dict(dtype="bf16")),
    ("families/bamba", None),         # stored folders (not kvf mkmodel's)
    ("families/granite-moe", None),
    ("families/mistral-swa", None),   # a sliding window (40) shorter than the long prompt
    ("families/gpt-oss", None),       # sinks, YaRN, 4 experts one per rank at TP4
    ("families/qwen3-next", None),    # Gated DeltaNet state: TP4 replicates its 2 key heads
    ("families/qwen3.5", None),       # the same state, Qwen3.5's separate projections
]
PROMPTS = [
    "The ferry left at dawn",                   # mid-block
    "Prefill computes, decode pulls. " * 3,     # several blocks of the dense models
]
MAX_TOKENS = 8


def main():
    layouts = sys.argv[1:] or ["4p2d", "1p4d"]
    for name, kw in MODELS:
        model = model_dir(name, **kw) if kw is not None else \
            os.path.join(repo_root(), "tests", "data", name)
        refs = {p: reference(model, p, MAX_TOKENS) for p in PROMPTS}
        for layout in layouts:
            matched = []
            with Pool(layout=layout, model=model, timeout=90) as pool:
                for i, prompt in enumerate(PROMPTS):
                    ref_tokens, ref_logits = refs[prompt]
                    r = pool.complete(prompt, max_tokens=MAX_TOKENS, temperature=0,
                                      return_token_ids=True, timeout=120)
                    got = r["choices"][0]["token_ids"]
                    matched.append(check_tokens(got, ref_tokens, ref_logits, False,
                                                "%s %s prompt %d" % (name, layout, i)))
                    assert r["kv_transfer"]["bytes"] > 0, r["kv_transfer"]
            print("%s %s: %d prompts match the colocated run (%s of %d tokens equal)" % (
                name, layout, len(PROMPTS), "/".join(map(str, matched)), MAX_TOKENS))
    print("test_e2e_models passed")


if __name__ == "__main__":
    main()
