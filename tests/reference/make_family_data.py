#!/usr/bin/env python3
"""Write the stored transformers reference of the bamba, granitemoehybrid, sliding-window (mistral, qwen3, gemma3_text, gemma2 and gemma3_text with softcaps, gpt_oss) and Gated DeltaNet (qwen3_next with norm_topk_prob true and false, qwen3_5_text, qwen3_5_moe_text, the multimodal qwen3_5 and qwen3_5_moe) families.

Command (run from the repository root; needs torch and transformers, the ctest
that reads the result does not):
  python3 tests/reference/make_family_data.py --kvf build-dev/bin/kvf [--case NAME ...]

For each family, transformers builds a small random checkpoint: the
hf_compare.py case of that name cut to two layers (same seed, same random
biases and norms), saves it with save_pretrained into tests/data/families/<case>/
(config.json, model.safetensors; kvf mkmodel adds the byte tokenizer.json),
and writes ref.json: for prompts spanning one block, several prefill chunks
and several blocks, transformers' greedy tokens and the logits of every step
(the prompt in one forward, then one token at a time from its cache with
generate()'s positions). check_family_data.py runs kvf on the folder at TP
1, 2 and 4 and compares (greedy tokens equal, max |logit diff| <= 1e-4).
"""
import argparse
import copy
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_compare as H  # noqa: E402

CASES = ["bamba", "granite-moe", "mistral-swa", "qwen3-swa", "gemma3-swa", "gemma2", "gemma3-softcap",
         "gpt-oss", "qwen3-next",
         "qwen3-next-nonorm", "qwen3.5", "qwen3.5-mm", "qwen3.5-moe", "qwen3.5-moe-mm"]
# two layers (one Mamba2, one attention) keep the files a few hundred KB
SMALLER = {
    "bamba": dict(num_hidden_layers=2, attn_layer_indices=[1]),
    "granite-moe": dict(num_hidden_layers=2, layer_types=["mamba", "attention"],
                        tie_word_embeddings=True),
    # sliding windows of 40 and 33 tokens: the 107- and 295-token prompts outrun them
    "mistral-swa": dict(),
    "qwen3-swa": dict(),
    "gemma3-swa": dict(),
    "gemma2": dict(),           # both softcaps binding (1.5 on scores, 4 on logits)
    "gemma3-softcap": dict(),   # the logits capped, attn_logit_softcapping without effect
    "gpt-oss": dict(),
    # one Gated DeltaNet layer, one gated attention layer
    "qwen3-next": dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"]),
    "qwen3-next-nonorm": dict(),   # two layers already, both sparse
    "qwen3.5": dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"]),
    # Qwen3.5 as published (multimodal: the text_config cut to two layers, the vision tower's
    # weights in the file and not loaded) and its MoE text model, bare and wrapped
    "qwen3.5-mm": dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"]),
    "qwen3.5-moe": dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"]),
    "qwen3.5-moe-mm": dict(num_hidden_layers=2,
                           layer_types=["linear_attention", "full_attention"]),
}
# References computed in float64 on the saved fp32 weights (exact math on the same weights):
# a Gated DeltaNet output can be tiny where q and k are nearly orthogonal under a strong
# decay, and the gated RMSNorm then rescales it, so fp32 rounding (transformers' or
# kvferry's) shows there; float64 keeps the reference itself off that error. (With the
# hf_compare initializer_range 0.1 such a position put transformers' own fp32 forward
# 2.4e-4 off the float64 answer; the case uses 0.2.)
FLOAT64 = {"qwen3-next", "qwen3-next-nonorm", "qwen3.5", "qwen3.5-mm", "qwen3.5-moe",
           "qwen3.5-moe-mm"}
# Per-case bounds above check_family_data's 1e-4 (stored as ref.json "tol"): the 2-layer
# qwen3_5_moe_text checkpoint is ill-conditioned at the 107-token prompt: kvferry's fp32 is
# 7.2e-4 off the float64 logits there (greedy equal at every TP and on devsim; the same bits
# with 7-, 48- and 512-token prefill chunks; no router near-tie: the 2nd and 3rd expert
# logits >= 1e-2 apart), transformers' own fp32 8.8e-5 with its chunked scan; the 4-layer
# hf_compare case shows the same on one of six prompts, where transformers' fp32 with its
# recurrent scan (kvferry's order) is as far off as kvferry and kvferry 2.8e-5 from it: fp32
# rounding of the recurrent order, not the formula. A wrong formula is off by more than 1e-1
# (norm_topk_prob wrong: 2 to 6).
TOL = {"qwen3.5-moe": 1e-3}
LENGTHS = [5, 107, 295]    # BOS + bytes: 5 tokens; > 2 chunks of 48; > 3 blocks of 96
MAX_TOKENS = 6


def prompt_bytes(n):
    return bytes((7 * i + 33) % 95 + 32 for i in range(n - 1))


def reference(model, ids, k):
    """transformers' greedy tokens and each step's logits (hf_compare.hf_logits' steps)."""
    import torch
    tokens = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        steps = [out.logits[0, -1].double()]
        for i in range(k):
            tokens.append(int(torch.argmax(steps[-1])))
            if i == k - 1:
                break
            out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values,
                        use_cache=True, position_ids=torch.tensor([[len(ids) + i]]))
            steps.append(out.logits[0, -1].double())
    return tokens, [[float("%.9g" % v) for v in s.tolist()] for s in steps]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvf", required=True, help="path to the kvf binary (tokenizer.json)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "data", "families"))
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--case", action="append", choices=CASES,
                    help="write only this case (repeatable; default: all)")
    args = ap.parse_args()
    import torch
    import transformers
    torch.set_num_threads(1)
    for name in args.case or CASES:
        model_type, kwargs, _ = H.cases()[name]
        if "text_config" in kwargs:   # a multimodal wrapper: cut its text model
            kwargs = dict(kwargs, text_config=dict(kwargs["text_config"], **SMALLER[name]))
        else:
            kwargs = dict(kwargs, **SMALLER[name])
        d = os.path.join(args.out, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        model = H.build_model(model_type, kwargs, d, None, args.seed)
        H.add_byte_tokenizer(args.kvf, d)
        model32 = None
        if name in FLOAT64:
            model32 = model
            model = copy.deepcopy(model).double()   # after save_pretrained: files stay fp32
            model.set_experts_implementation("eager")   # the grouped GEMM takes no float64
        prompts = []
        for n in LENGTHS:
            ids = [H.BOS] + list(prompt_bytes(n))
            tokens, logits = reference(model, ids, MAX_TOKENS)
            prompts.append({"tokens_in": n, "tokens": tokens, "logits": logits})
            if model32 is not None:
                # transformers' own fp32 error on this prompt (hf_compare's OWN_FACTOR rule)
                own = H.hf_logits(model32, ids, tokens)
                prompts[-1]["hf_fp32_err"] = float("%.3g" % max(
                    max(abs(a - float(b)) for a, b in zip(x, y)) for x, y in zip(logits, own)))
        ref = {"case": name, "model_type": model_type, "chunk": H.CHUNK,
               "transformers": transformers.__version__, "torch": torch.__version__,
               "seed": args.seed, "prompts": prompts,
               "ref_dtype": "float64" if name in FLOAT64 else "float32"}
        if name in TOL:
            ref["tol"] = TOL[name]
        with open(os.path.join(d, "ref.json"), "w") as f:
            json.dump(ref, f, separators=(",", ":"))
        print("wrote %s (%d prompts)" % (d, len(prompts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
