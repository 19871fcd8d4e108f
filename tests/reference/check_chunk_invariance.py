#!/usr/bin/env python3
"""A Gated DeltaNet family's tokens and logits do not depend on where its prompt is cut.

kvf generate runs each stored checkpoint named (tests/data/families) on a 107-token prompt
with prefill chunks of 7, 48 and 512 tokens (the last: one chunk) at TP 1 and 2, bf16 and
fp32 state; every run of one TP and dtype must print the same tokens and the same logits,
bit for bit (the recurrence is token by token, a narrow state rounded after every token, so
a chunk's end changes nothing: the scheduler cuts prompts by what other requests leave).

Usage: python3 tests/reference/check_chunk_invariance.py --kvf build/bin/kvf [--case NAME ...]
Exit status 0 when every group of runs agrees, 1 otherwise.
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_family_data import prompt_bytes  # noqa: E402

CHUNKS = [7, 48, 512]


def run(kvf, model, path, tp, chunk, dtype):
    p = subprocess.run([kvf, "generate", "--model", model, "--tp", str(tp), "--prompt-file", path,
                        "--max-tokens", "6", "--kv-dtype", dtype, "--ssm-dtype", dtype,
                        "--conv-dtype", dtype, "--ignore-eos", "yes", "--print-logits", "yes",
                        "--max-batch-tokens", str(chunk)], capture_output=True, timeout=120)
    if p.returncode != 0:
        sys.exit("kvf generate failed: %s" % p.stderr.decode(errors="replace"))
    return [l for l in p.stdout.decode("latin-1").splitlines()
            if l.startswith("tokens:") or l.startswith("logits ")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvf", required=True)
    ap.add_argument("--case", action="append")
    args = ap.parse_args()
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "families")
    ok = True
    with tempfile.TemporaryDirectory(prefix="kvf-chunks-") as tmp:
        path = os.path.join(tmp, "prompt.txt")
        with open(path, "wb") as f:
            f.write(prompt_bytes(107))
        for name in args.case or ["qwen3-next", "qwen3.5"]:
            for tp in (1, 2):
                for dtype in ("fp32", "bf16"):
                    outs = [run(args.kvf, os.path.join(data, name), path, tp, c, dtype)
                            for c in CHUNKS]
                    same = all(o == outs[0] for o in outs) and len(outs[0]) == 7
                    ok = ok and same
                    print("%s tp %d %s: chunks %s %s (%s)" % (
                        name, tp, dtype, CHUNKS, "identical" if same else "DIFFER",
                        outs[0][0] if outs[0] else "no output"))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
