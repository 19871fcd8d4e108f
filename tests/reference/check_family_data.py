#!/usr/bin/env python3
"""Compare kvf with the stored transformers reference of tests/data/families (no torch).

make_family_data.py wrote each folder's checkpoint (saved by transformers) and
ref.json (transformers' greedy tokens and every step's logits). Here `kvf
generate` runs each stored prompt at every TP degree asked for (fp32 KV /
conv / SSM state, 48-token prefill chunks as the reference was made for) and
must give the same greedy tokens with max |logit diff| within --tol.

Usage:
  python3 tests/reference/check_family_data.py --kvf build/bin/kvf [--tp 1,2,4]
      [--data tests/data/families] [--case bamba ...] [--tol 1e-4]
Exit status: 0 when every prompt agrees at every TP degree, 1 otherwise.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_compare as H  # noqa: E402  (its kvf runner; torch only inside its reference)
from make_family_data import prompt_bytes  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvf", required=True)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", "data", "families"))
    ap.add_argument("--tp", default="1,2,4")
    ap.add_argument("--case", action="append")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
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
                for tp in (int(t) for t in args.tp.split(",")):
                    toks, logits = H.run_kvf(args.kvf, d, prompt_bytes(n), len(p["tokens"]), tp,
                                             tmp, ref["chunk"])
                    diff = max((max(abs(a - b) for a, b in zip(x, y))
                                for x, y in zip(p["logits"], logits)), default=float("inf"))
                    same = (toks == p["tokens"]) and (len(logits) == len(p["logits"]))
                    good = same and diff <= args.tol
                    ok = ok and good
                    runs += 1
                    print("  %4d tokens tp %d: greedy %s, max |logit diff| %.2e %s" % (
                        n, tp, "equal" if same else "DIFFER", diff, "ok" if good else "FAIL"))
                    if not same:
                        print("    kvf %s\n    ref %s" % (toks, p["tokens"]))
    print("%s (%d kvf runs)" % ("PASS" if ok else "FAIL", runs))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
