#!/usr/bin/env python3
"""Prompt-length sweep of the KV pull through the connector (kvf bench).

For each model geometry, layout and prompt length it runs kvf bench once and
prints time, GB/s, descriptors and plan+post time per request, plus the
plan+post share of the time (posting must stay a small share: descriptors
grow with blocks, not with tokens). --png FILE plots GB/s and descriptors
against tokens (gnuplot, from deploy/install-deps.sh --tests); --md FILE writes
the table as Markdown; --json prints the rows as JSON. Defaults are the full
sweep (1k..128k tokens, Nemotron-Nano-9B-v2 and Nemotron-3-Nano-30B-A3B, 4p2d
2p4d 8p1d 1p8d); it
needs memory for both sides' pools (a 128k-token 9B-v2 request is ~4.4 GB per
side), so trim --tokens on small machines.

usage: sweep.py [--models a,b] [--layouts 4p2d,...] [--tokens 1024,8192,...]
                [--iters 3] [--pool-alloc ucx|heap] [--png FILE] [--md FILE] [--json]

The committed results (tests/bench/results/sweep.md, sweep.png) come from
  python3 tests/bench/sweep.py --md tests/bench/results/sweep.md \\
      --png tests/bench/results/sweep.png
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


def bench(model, layout, tokens, iters, pool_alloc="ucx"):
    cfg = os.path.join(SRC, "tests", "data", "models", MODELS[model] + ".config.json")
    env = dict(os.environ)
    env.setdefault("KVF_LOG_LEVEL", "error")
    r = subprocess.run([KVF, "bench", "--model", cfg, "--layout", layout, "--tokens",
                        str(tokens), "--iters", str(iters), "--copy-limit", "no",
                        "--pool-alloc", pool_alloc,
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


def write_md(path, rows):
    """The sweep as a Markdown table (the committed tests/bench/results/sweep.md)."""
    with open(path, "w") as f:
        f.write("| model | layout | tokens | bytes | descriptors | time ms | GB/s | "
                "plan+post ms | post share |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
        for r in rows:
            if "error" in r:
                f.write("| %s | %s | %d | failed: %s | | | | | |\n" % (
                    r["model"], r["layout"], r["tokens"], " ".join(r["error"])))
                continue
            f.write("| %s | %s | %d | %d | %d | %.2f | %.2f | %.3f | %.2f %% |\n" % (
                r["model"], r["layout"], r["tokens"], r["bytes"], r["descriptors"], r["ms"],
                r["gbs"], r["post_ms"], 100.0 * r["post_share"]))


def plot(path, rows, models, layouts):
    """GB/s and descriptors against tokens, one line per model and layout (gnuplot)."""
    import shutil
    import tempfile
    if shutil.which("gnuplot") is None:
        raise SystemExit("sweep: --png needs gnuplot (deploy/install-deps.sh --tests)")
    series = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            for layout in layouts:
                pts = [r for r in rows if r["model"] == model and r["layout"] == layout and
                       "error" not in r]
                if not pts:
                    continue
                dat = os.path.join(tmp, "%s-%s.dat" % (model, layout))
                with open(dat, "w") as f:
                    for p in pts:
                        f.write("%d %.4f %d\n" % (p["tokens"], p["gbs"], p["descriptors"]))
                series.append((dat, "%s %s" % (model, layout)))
        if not series:
            raise SystemExit("sweep: nothing to plot (every cell failed)")
        gp = ["set terminal png size 1200,480", "set output '%s'" % path,
              "set multiplot layout 1,2 title 'kvf bench: KV pull through the connector'",
              "set logscale x 2", "set xlabel 'prompt tokens'", "set grid",
              "set key top left font ',8'", "set ylabel 'GB/s'",
              "plot " + ", ".join("'%s' using 1:2 with linespoints title '%s'" % s_
                                  for s_ in series),
              "set ylabel 'descriptors per request'", "set logscale y 2",
              "plot " + ", ".join("'%s' using 1:3 with linespoints title '%s'" % s_
                                  for s_ in series),
              "unset multiplot"]
        r = subprocess.run(["gnuplot"], input="\n".join(gp) + "\n", text=True,
                           capture_output=True, timeout=60)
        if r.returncode != 0:
            raise SystemExit("sweep: gnuplot failed: %s" % r.stderr.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="9b-v2,30b-a3b")
    ap.add_argument("--layouts", default="4p2d,2p4d,8p1d,1p8d")
    ap.add_argument("--tokens", default="1024,2048,4096,8192,16384,32768,65536,131072")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--png", help="write a plot of GB/s and descriptors against tokens (gnuplot)")
    ap.add_argument("--md", help="write the table as Markdown")
    ap.add_argument("--pool-alloc", default="ucx", choices=("ucx", "heap"),
                    help="kvf bench --pool-alloc (ucx: the daemons' default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    if not args.json:
        print("%-8s %-6s %7s %12s %6s %10s %7s %9s %7s" % ("model", "layout", "tokens", "bytes",
              "descs", "time ms", "GB/s", "post ms", "post %"))
    for model in args.models.split(","):
        for layout in args.layouts.split(","):
            for tokens in [int(t) for t in args.tokens.split(",")]:
                row = bench(model, layout, tokens, args.iters, args.pool_alloc)
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
    if args.md:
        write_md(args.md, rows)
        print("table: %s" % args.md)
    if args.png:
        plot(args.png, rows, args.models.split(","), args.layouts.split(","))
        print("plot: %s" % args.png)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
