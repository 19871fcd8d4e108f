#!/usr/bin/env python3
"""A trained checkpoint (models-trained/*) in kvferry against transformers.

Takes the first --questions held-out questions per task of DIR/heldout.jsonl,
tokenizes them with DIR/tokenizer.json (Hugging Face tokenizers), runs `kvf
generate` (fp32 KV and state, greedy, teacher-forced comparison as in
hf_compare.py) and transformers' NemotronHForCausalLM on the same bf16
weights; prints the greedy tokens of both and the max |logit diff|.

  python3 tests/reference/hf_compare_trained.py --kvf build/bin/kvf \
      --model models-trained/tiny-hybrid [--tp 1,2] [--questions 3]
Exit 0 when greedy tokens agree and the max |logit diff| is within --tol at
every TP degree, 1 otherwise, 77 when torch/transformers/tokenizers are missing.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_compare as H  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvf", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from tokenizers import Tokenizer
    except ImportError as e:
        print("skipped: %s" % e)
        return 77
    d = args.model
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    rows = [json.loads(l) for l in open(os.path.join(d, "heldout.jsonl"))]
    prompts = [r["prompt"] for t in sorted({r["task"] for r in rows})
               for r in [x for x in rows if x["task"] == t][:args.questions]]
    model = transformers.NemotronHForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    print("transformers %s, torch %s, %s" % (transformers.__version__, torch.__version__, d))
    ok, worst = True, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for p in prompts:
            ids = [cfg["bos_token_id"]] + tok.encode(p, add_special_tokens=False).ids
            ref = None
            for tp in [int(x) for x in args.tp.split(",")]:
                k_tokens, k_logits = H.run_kvf(args.kvf, d, p.encode(), args.max_tokens, tp, tmp)
                if ref is None:
                    ref = H.hf_logits(model, ids, k_tokens)
                h_tokens = [int(torch.argmax(x)) for x in ref]
                diff = max(float((x - torch.tensor(y, dtype=torch.float64)).abs().max())
                           for x, y in zip(ref, k_logits))
                same = h_tokens == k_tokens
                worst = max(worst, diff)
                ok = ok and same and diff <= args.tol
                print("  %-34s tp %d: greedy %s, max |logit diff| %.2e" % (
                    (p if len(p) < 34 else p[:14] + "..." + p[-17:]), tp,
                    "equal" if same else "DIFFER", diff))
    print("%d prompts: max |logit diff| %.2e (tolerance %g): %s" % (
        len(prompts), worst, args.tol, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
