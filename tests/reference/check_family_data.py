#!/usr/bin/env python3
"""Compare kvf with the stored transformers reference of tests/data/families (no torch).

make_family_data.py wrote each folder's checkpoint (saved by transformers) and
ref.json (transformers' greedy tokens and every step's logits). Here `kvf
generate` runs each stored prompt at every TP degree asked for (fp32 KV /
conv / SSM state, 48-token prefill chunks as the reference was made for) and
must give the same greedy tokens with max |logit diff| within --tol (or, where ref.json
stores hf_fp32_err -- transformers' own fp32 error against its float64 reference on that
prompt -- within hf_compare.OWN_FACTOR times it). With
--devsim (tests/bin/kvf-devsim: kvf on the simulated CUDA device of
tests/daemon/devsim) each prompt runs there too at TP 1, decode steps as CUDA
graphs (KVF_GPU_GRAPHS=decode; granite's and qwen3-next's MoE layers run eagerly),
prompt scans in the GPU's chunked form on the default state grid of 64 (Mamba2's SSD,
Gated DeltaNet's WY / UT transform), within --devsim-tol: another fp32 summation order
than transformers' (qwen3.5's 107-token prompt: 3.1e-4 chunked on 64-token chunks,
9.9e-5 on 16, 9.6e-5 token by token; every other case below 1e-4).

Usage:
  python3 tests/reference/check_family_data.py --kvf build/bin/kvf [--tp 1,2,4]
      [--data tests/data/families] [--case bamba ...] [--tol 1e-4] [--devsim BIN]
      [--devsim-tol 5e-4]
Exit status: 0 when every prompt agrees at every TP degree, 1 otherwise.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_compare as H  # noqa: E402  (its kvf runner; torch only inside its reference)
from make_family_data import prompt_bytes  # noqa: E402


def run_devsim(devsim, model_dir, body, max_tokens, tmp, chunk):
    """hf_compare.run_kvf's run on the simulated GPU (TP 1, decode steps graphed)."""
    path = os.path.join(tmp, "prompt.txt")
    with open(path, "wb") as f:
        f.write(body)
    p = subprocess.run(
        [devsim, "generate", "--model", model_dir, "--device", "cuda:0", "--prompt-file", path,
         "--max-tokens", str(max_tokens), "--kv-dtype", "fp32", "--ssm-dtype", "fp32",
         "--conv-dtype", "fp32", "--ignore-eos", "yes", "--print-logits", "yes",
         "--max-batch-tokens", str(chunk), "--num-blocks", str(max(64, 3 * len(body)))],
        capture_output=True, env=dict(os.environ, KVF_GPU_GRAPHS="decode"), timeout=120)
    if p.returncode != 0:
        sys.exit("kvf-devsim generate failed: %s" % p.stderr.decode(errors="replace"))
    tokens, logits = [], []
    for line in p.stdout.decode("latin-1").splitlines():
        if line.startswith("tokens:"):
            tokens = [int(t) for t in line.split()[1:]]
        elif line.startswith("logits "):
            logits.append([float(v) for v in line.split()[3:]])
    return tokens, logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvf", required=True)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", "data", "families"))
    ap.add_argument("--tp", default="1,2,4")
    ap.add_argument("--case", action="append")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--devsim", help="kvf-devsim binary: also run on the simulated GPU")
    ap.add_argument("--devsim-tol", type=float, default=5e-4,
                    help="max |logit diff| of the simulated GPU's runs (chunked scans)")
    args = ap.parse_args()
    where = [("tp %d" % int(t), int(t)) for t in args.tp.split(",")]
    if args.devsim:
        where.append(("devsim", 0))
    names = args.case or sorted(os.listdir(args.data))
    ok, runs = True, 0
    with tempfile.TemporaryDirectory(prefix="kvf-fam-") as tmp:
        for name in names:
            d = os.path.join(args.data, name)
            with open(os.path.join(d, "ref.json")) as f:
                ref = json.load(f)
            print("== %s (%s; reference by transformers %s)" % (name, ref["model_type"],
                                                               ref["transformers"]))
            for p in ref["prompts"]:
                n = p["tokens_in"]
                for what, tp in where:
                    if tp == 0:
                        toks, logits = run_devsim(args.devsim, d, prompt_bytes(n),
                                                  len(p["tokens"]), tmp, ref["chunk"])
                    else:
                        toks, logits = H.run_kvf(args.kvf, d, prompt_bytes(n), len(p["tokens"]),
                                                 tp, tmp, ref["chunk"])
                    diff = max((max(abs(a - b) for a, b in zip(x, y))
                                for x, y in zip(p["logits"], logits)), default=float("inf"))
                    same = (toks == p["tokens"]) and (len(logits) == len(p["logits"]))
                    # float64 references of ill-conditioned checkpoints: also within
                    # hf_compare's OWN_FACTOR times transformers' own fp32 error there
                    tol = max(args.devsim_tol if tp == 0 else args.tol,
                              H.OWN_FACTOR * p.get("hf_fp32_err", 0.0),
                              ref.get("tol", 0.0))   # a case's own bound (make_family_data)
                    good = same and diff <= tol
                    ok = ok and good
                    runs += 1
                    print("  %4d tokens %-6s: greedy %s, max |logit diff| %.2e %s" % (
                        n, what, "equal" if same else "DIFFER", diff, "ok" if good else "FAIL"))
                    if not same:
                        print("    kvf %s\n    ref %s" % (toks, p["tokens"]))
    print("%s (%d kvf runs)" % ("PASS" if ok else "FAIL", runs))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
