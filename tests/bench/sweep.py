#!/usr/bin/env python3
"""Prompt-length sweep of the KV pull through the connector (kvf bench).

For each model geometry, layout and prompt length it runs kvf bench once and
prints time, GB/s, descriptors and plan+post time per request, plus the
plan+post share of the time (posting must stay a small share: descriptors
grow with blocks, not with tokens). --png FILE plots GB/s and descriptors
against tokens (needs matplotlib; pip install matplotlib). --json prints the
rows as JSON. Defaults are the full sweep of issue 14 (1k..128k tokens,
Nemotron-Nano-9B-v2 and Nemotron-3-Nano-30B-A3B, 4p2d 2p4d 8p1d 1p8d); it
needs memory for both sides' pools (a 128k-token 9B-v2 request is ~4.4 GB per
side), so trim --tokens on small machines.

usage: sweep.py [--models a,b] [--layouts 4p2d,...] [--tokens 1024,8192,...]
                [--iters 3] [--png FILE] [--json]
"""
import argparse
import json
import os
import re
import subprocess
import sys

SRC = os.environ.get("KVF_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
KVF = os.path.join(os.environ.get("KVF_BIN", os.path.join(SRC, "build", "bin")), "kvf")
MODELS = {"9b-v2": "nemotron-nano-9b-v2", "30b-a3b": "nemotron-3-nano-30b-a3b"}


def bench(model, layout, tokens, iters):
    cfg = os.path.join(SRC, "tests", "data", "models", MODELS[model] + ".config.json")
    env = dict(os.environ)
    env.setdefault("KVF_LOG_LEVEL", "error")
    r = subprocess.run([KVF, "bench", "--model", cfg, "--layout", layout, "--tokens",
                        str(tokens), "--iters", str(iters), "--copy-limit", "no",
                        "--timeout", "60s"], env=env, capture_output=True, text=True,
                       timeout=1800)
    out = r.stdout
    if r.returncode != 0:
        return {"model": model, "layout": layout, "tokens": tokens,
                "error": (out + r.stderr).strip().splitlines()[-1:]}
    g = lambda p, c=float: c(re.search(p, out, re.M).group(1))   # noqa: E731
    ms = g(r"^transfer time: ([\d.]+) ms")
    post = g(r"^plan\+post time: ([\d.]+) ms")
    return {"model": model, "layout": layout, "tokens": tokens,
            "bytes": g(r"^transfer: (\d+) bytes", int),
            "descriptors": g(r"^transfer: \d+ bytes, (\d+) descriptors", int),
            "ms": ms, "gbs": g(r"^transfer time: [\d.]+ ms, ([\d.]+) GB/s"),
            "post_ms": post, "post_share": post / ms if ms > 0 else None,
            "handshake_ms": g(r"^handshake: ([\d.]+) ms")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="9b-v2,30b-a3b")
    ap.add_argument("--layouts", default="4p2d,2p4d,8p1d,1p8d")
    ap.add_argument("--tokens", default="1024,2048,4096,8192,16384,32768,65536,131072")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--png")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    if not args.json:
        print("%-8s %-6s %7s %12s %6s %10s %7s %9s %7s" % ("model", "layout", "tokens", "bytes",
              "descs", "time ms", "GB/s", "post ms", "post %"))
    for model in args.models.split(","):
        for layout in args.layouts.split(","):
            for tokens in [int(t) for t in args.tokens.split(",")]:
                row = bench(model, layout, tokens, args.iters)
                rows.append(row)
                if args.json:
                    continue
                if "error" in row:
                    print("%-8s %-6s %7d failed: %s" % (model, layout, tokens, row["error"]))
                else:
                    print("%-8s %-6s %7d %12d %6d %10.2f %7.2f %9.3f %6.2f%%" % (
                        model, layout, tokens, row["bytes"], row["descriptors"], row["ms"],
                        row["gbs"], row["post_ms"], 100.0 * row["post_share"]), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        for model in args.models.split(","):
            for layout in args.layouts.split(","):
                pts = [r for r in rows if r["model"] == model and r["layout"] == layout and
                       "error" not in r]
                if not pts:
                    continue
                lab = "%s %s" % (model, layout)
                a1.plot([p["tokens"] for p in pts], [p["gbs"] for p in pts], "o-", label=lab)
                a2.plot([p["tokens"] for p in pts], [p["descriptors"] for p in pts], "o-",
                        label=lab)
        for a, y in ((a1, "GB/s"), (a2, "descriptors per request")):
            a.set_xscale("log", base=2)
            a.set_xlabel("prompt tokens")
            a.set_ylabel(y)
            a.grid(True, alpha=0.3)
        a1.legend(fontsize=7)
        fig.suptitle("kvf bench: KV pull through the connector")
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print("plot: %s" % args.png)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
