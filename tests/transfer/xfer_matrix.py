#!/usr/bin/env python3
"""Compatibility matrix of kvf xfer-test over loopback UCX.

Every cell starts a prefill process and a decode process, pulls one request
over UCX and verifies every byte of the decode pool (xfer-test exits 0 only
then). Cells: P/D layouts x models (tiny hybrid, tiny dense, a real dense GQA
config) x block-size pairs (equal, decode larger, prefill larger, neither
dividing the other, different kernel block sizes) x token counts ending
mid-block and on a block boundary. Stops at the first failing cell.

usage: xfer_matrix.py [--tls TLS] [--models a,b] [--quick]
  --tls    UCX_TLS for both processes ("default" leaves UCX to choose)
"""
import argparse
import os
import subprocess
import sys
import time

LAYOUTS = ["1p1d", "1p2d", "2p1d", "2p2d", "4p2d", "2p4d", "1p4d", "4p1d", "4p4d"]

# (prefill block, decode block, prefill kernel sizes, decode kernel sizes)
# Hybrid: 80 is the TP-stable block size of tiny-hybrid (bf16 KV, fp32 SSM);
# any multiple of 16 >= 80 fits the Mamba state at every TP.
HYBRID_BLOCKS = [
    ("equal", 80, 80, "MultipleOf(16)", "MultipleOf(16)"),
    ("decode-larger", 80, 160, "MultipleOf(16)", "MultipleOf(16)"),
    ("prefill-larger", 160, 80, "MultipleOf(16)", "MultipleOf(16)"),
    ("not-dividing", 80, 96, "MultipleOf(16)", "MultipleOf(16)"),
    ("kernel-split", 96, 80, "32", "16"),
]
DENSE_BLOCKS = [
    ("equal", 16, 16, "MultipleOf(16)", "MultipleOf(16)"),
    ("decode-larger", 16, 32, "MultipleOf(16)", "MultipleOf(16)"),
    ("prefill-larger", 32, 16, "MultipleOf(16)", "MultipleOf(16)"),
    ("not-dividing", 32, 48, "MultipleOf(16)", "MultipleOf(16)"),
    ("kernel-split", 48, 32, "16", "16"),
]
# token counts: mid-block for every block size above, and a common boundary
# (480 = lcm(80, 96, 160); 96 = lcm(16, 32, 48))
MODELS = {
    "tiny-hybrid": (HYBRID_BLOCKS, [200, 480]),
    "tiny-dense": (DENSE_BLOCKS, [50, 96]),
    # real dense GQA geometry (8 KV heads, 28 layers): the pairs the tiny configs do
    # not already cover in both directions, to keep the cell count down
    "qwen3-0.6b": ([DENSE_BLOCKS[0], DENSE_BLOCKS[3], DENSE_BLOCKS[4]], [50, 96]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tls", default="default")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--quick", action="store_true",
                    help="first block pair and mid-block N only, plus one full layout")
    args = ap.parse_args()

    src = os.environ.get("KVF_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    kvf = os.path.join(os.environ.get("KVF_BIN", os.path.join(src, "build", "bin")), "kvf")
    env = dict(os.environ)
    if args.tls != "default":
        env["UCX_TLS"] = args.tls
    env.setdefault("KVF_LOG_LEVEL", "error")

    cells = 0
    t0 = time.monotonic()
    for model in args.models.split(","):
        blocks, tokens = MODELS[model]
        cfg = os.path.join(src, "tests", "data", "models", model + ".config.json")
        for layout in args.layouts.split(","):
            for name, pb, db, pk, dk in blocks:
                for n in tokens:
                    cmd = [kvf, "xfer-test", "--model", cfg, "--layout", layout,
                           "--tokens", str(n), "--prefill-block-size", str(pb),
                           "--decode-block-size", str(db), "--prefill-kernel-sizes", pk,
                           "--decode-kernel-sizes", dk, "--timeout", "5s"]
                    try:
                        r = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                           timeout=30)
                        out, rc = r.stdout + r.stderr, r.returncode
                    except subprocess.TimeoutExpired as e:
                        out, rc = str(e.stdout) + str(e.stderr), "timeout"
                    cells += 1
                    if rc != 0 or "verify: ok" not in out:
                        print("FAIL cell: model=%s layout=%s blocks=%s (%d/%d, kernels %s/%s) "
                              "tokens=%d tls=%s rc=%s" % (model, layout, name, pb, db, pk, dk,
                                                          n, args.tls, rc))
                        print(" ".join(cmd))
                        print(out)
                        return 1
    print("xfer matrix: %d cells passed (UCX_TLS=%s) in %.1f s" %
          (cells, args.tls, time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
