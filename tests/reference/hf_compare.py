#!/usr/bin/env python3
"""Compare kvferry's NemotronH forward with Hugging Face transformers.

Optional check, not part of ctest/CI: it needs torch and transformers
(`pip install torch transformers safetensors`). It writes a synthetic
checkpoint with `kvf mkmodel`, runs `kvf generate --print-logits` (greedy,
fp32 KV and state), then runs transformers' NemotronHForCausalLM on the same
checkpoint, feeding kvf's tokens (teacher forcing) so the logits of every
step are compared even if a near-tie flips a greedy choice. Prints the
greedy tokens of both and the max |logit difference| per prompt.

Usage:
  python3 tests/reference/hf_compare.py --kvf build/bin/kvf [--tp 2] \
      [--config tests/data/models/tiny-hybrid.config.json] [--max-tokens 16]
Exit status: 0 when every prompt's greedy tokens agree and the max logit
difference is below --tol (default 1e-3), 1 otherwise.
"""
import argparse
import os
import subprocess
import sys
import tempfile

PROMPTS = ["The quick brown fox", "a", "Disaggregated prefill and decode!"]


def run_kvf(kvf, model_dir, prompt, max_tokens, tp):
    out = subprocess.run(
        [kvf, "generate", "--model", model_dir, "--tp", str(tp), "--prompt", prompt,
         "--max-tokens", str(max_tokens), "--kv-dtype", "fp32", "--ssm-dtype", "fp32",
         "--conv-dtype", "fp32", "--ignore-eos", "yes", "--print-logits", "yes"],
        check=True, capture_output=True, text=True, errors="replace").stdout
    tokens, logits = [], []
    for line in out.splitlines():
        if line.startswith("tokens:"):
            tokens = [int(t) for t in line.split()[1:]]
        elif line.startswith("logits "):
            parts = line.split()
            logits.append([float(v) for v in parts[3:]])
    return tokens, logits


def load_hf(model_dir):
    import torch
    from safetensors.torch import load_file
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    config.use_mamba_kernels = False
    try:
        model = transformers.NemotronHForCausalLM(config)
    except AttributeError:
        model = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    sd = load_file(os.path.join(model_dir, "model.safetensors"))
    want = set(model.state_dict().keys())
    if not any(k.startswith("backbone.") for k in want):
        # newer transformers names the backbone "model"
        sd = {("model." + k[len("backbone."):] if k.startswith("backbone.") else k): v
              for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "e_score_correction_bias" not in k]
    if missing or unexpected:
        sys.exit(f"checkpoint does not fit transformers' NemotronH: missing {missing[:5]}, "
                 f"unexpected {unexpected[:5]}")
    model = model.float().eval()
    try:
        model.config._attn_implementation = "eager"
    except Exception:  # pragma: no cover - older/newer attribute handling
        pass
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvf", required=True, help="path to the kvf binary")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--config", default=os.path.join(here, "..", "data", "models",
                                                      "tiny-hybrid.config.json"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()

    import torch
    torch.manual_seed(0)
    ok = True
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([args.kvf, "mkmodel", "--config", args.config, "--out", d,
                        "--seed", str(args.seed)], check=True, capture_output=True)
        model = load_hf(d)
        bos = model.config.bos_token_id
        for prompt in PROMPTS:
            k_tokens, k_logits = run_kvf(args.kvf, d, prompt, args.max_tokens, args.tp)
            ids = [bos] + list(prompt.encode("utf-8"))
            h_tokens, maxdiff = [], 0.0
            with torch.no_grad():
                for step in range(len(k_tokens)):
                    inp = torch.tensor([ids + k_tokens[:step]], dtype=torch.long)
                    out = model(input_ids=inp, use_cache=False)
                    logits = out.logits[0, -1].double()
                    h_tokens.append(int(torch.argmax(logits)))
                    ref = torch.tensor(k_logits[step], dtype=torch.float64)
                    maxdiff = max(maxdiff, float((logits - ref).abs().max()))
            same = h_tokens == k_tokens
            ok = ok and same and maxdiff < args.tol
            print(f"prompt {prompt!r}: kvf tokens {k_tokens}")
            print(f"{'':>{len(repr(prompt)) + 9}}hf  tokens {h_tokens}")
            print(f"  greedy tokens {'equal' if same else 'DIFFER'}, "
                  f"max |logit diff| {maxdiff:.3g} over {len(k_tokens)} steps")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
