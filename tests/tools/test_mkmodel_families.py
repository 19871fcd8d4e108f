#!/usr/bin/env python3
"""kvf mkmodel for the families transformers saved under tests/data/families (gemma3_text,
gemma2, gpt_oss, qwen3_next, qwen3_5_text, qwen3_5_moe_text): from each stored config.json it
writes a checkpoint whose tensor names, shapes and order of dims are exactly those of the
transformers-saved model.safetensors beside it (read from the safetensors headers, no torch),
and that checkpoint loads and generates the same greedy tokens at TP 1, 2 and 4 and on a
second run. The families it refuses (bamba, granitemoehybrid, the multimodal wrappers) are
refused by name.

Usage: test_mkmodel_families.py --kvf build/bin/kvf
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "families")
MADE = ["gemma3-swa", "gemma3-softcap", "gemma2", "gpt-oss", "qwen3-next", "qwen3-next-nonorm",
        "qwen3.5", "qwen3.5-moe"]
REFUSED = {"bamba": "bamba", "granite-moe": "granitemoehybrid", "qwen3.5-mm": "qwen3_5"}


def shapes(folder):
    """name -> shape of every tensor of the folder's safetensors files."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with open(os.path.join(folder, f), "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                hdr = json.loads(fh.read(n))
            out.update({k: v["shape"] for k, v in hdr.items() if k != "__metadata__"})
    return out


def generate(kvf, model, tp):
    p = subprocess.run([kvf, "generate", "--model", model, "--tp", str(tp), "--prompt",
                        "hello kvferry, a longer prompt", "--max-tokens", "8", "--ignore-eos",
                        "yes"], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit("FAIL: generate %s tp %d: %s" % (model, tp, p.stderr))
    return [ln for ln in p.stdout.splitlines() if ln.startswith("tokens:")][0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvf", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvf-mkfam-") as tmp:
        for case in MADE:
            src, out = os.path.join(DATA, case), os.path.join(tmp, case)
            subprocess.run([args.kvf, "mkmodel", "--config", os.path.join(src, "config.json"),
                            "--out", out, "--seed", "7"], check=True, capture_output=True,
                           timeout=120)
            want, got = shapes(src), shapes(out)
            if want != got:
                miss = sorted(set(want) - set(got))[:5]
                extra = sorted(set(got) - set(want))[:5]
                bad = sorted(k for k in set(want) & set(got) if want[k] != got[k])[:5]
                sys.exit("FAIL: %s: tensors differ from transformers': missing %s, extra %s,"
                         " shapes %s" % (case, miss, extra,
                                         [(k, want[k], got[k]) for k in bad]))
            toks = {tp: generate(args.kvf, out, tp) for tp in (1, 2, 4)}
            again = generate(args.kvf, out, 1)
            if len(set(toks.values())) != 1 or again != toks[1]:
                sys.exit("FAIL: %s: tokens differ: %s, again %s" % (case, toks, again))
            print("%-18s %3d tensors as transformers', %s at TP 1/2/4 and again" %
                  (case, len(got), toks[1]))
        for case, mt in REFUSED.items():
            p = subprocess.run([args.kvf, "mkmodel", "--config",
                                os.path.join(DATA, case, "config.json"), "--out",
                                os.path.join(tmp, "r-" + case)], capture_output=True, text=True,
                               timeout=60)
            if p.returncode == 0 or ("model_type '%s' is not implemented by kvf mkmodel" % mt)\
                    not in p.stderr:
                sys.exit("FAIL: %s: not refused by name: %s" % (case, p.stderr))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
