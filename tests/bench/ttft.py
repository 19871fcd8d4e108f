#!/usr/bin/env python3
"""TTFT benchmark (figures, not a test): what disaggregation adds to the time to first token.

For one long prompt (default 8192 tokens) on a random-weight model of the tiny-hybrid
geometry (max_position_embeddings raised to fit the prompt; kvf mkmodel writes it), it
measures:

  colocated   `kvf generate` with prefill's TP: prefill time (its TTFT) and prefill plus
              the first decode step (its time to the second token), --runs times
  pool        a kvf-up pool of that layout (default 4p2d), --requests requests one at a
              time after a warm-up: the client-visible TTFT (the first token, computed by
              prefill), the time to the first token decoded on decode, and from each
              answer's ttft_breakdown the part the transfer adds (handshake + descriptor
              posting + wire + post_ops) and the rest of the hand-over

and prints medians, the transfer's share of the time to the first decoded token, and
whether the transfer is on the critical path (its share above 5 %), which would call for
overlapping it with prefill compute (pulling layer groups as prefill finishes them).

    KVF_BIN=build/bin python3 tests/bench/ttft.py [--tokens 8192] [--layout 4p2d]
        [--requests 5] [--runs 3] [--json]
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from kvf_e2e import Pool, find_bin  # noqa: E402

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TRANSFER = ("handshake", "descriptor_posting", "wire", "post_ops")
HANDOVER = ("proxy_dispatch", "decode_queue", "block_alloc")


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def make_model(tmp, tokens, config):
    with open(config) as f:
        cfg = json.load(f)
    cfg["max_position_embeddings"] = max(cfg.get("max_position_embeddings", 0), tokens + 64)
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    out = os.path.join(tmp, "model")
    subprocess.run([os.path.join(find_bin(), "kvf"), "mkmodel", "--config", path, "--out", out,
                    "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
    return out


def colocated(model, prompt_file, tp, runs, num_blocks):
    """(prefill ms, prefill + first decode step ms) per run of kvf generate."""
    out = []
    for _ in range(runs):
        r = subprocess.run([os.path.join(find_bin(), "kvf"), "generate", "--model", model,
                            "--tp", str(tp), "--prompt-file", prompt_file, "--max-tokens", "2",
                            "--ignore-eos", "--num-blocks", str(num_blocks)],
                           capture_output=True, text=True, timeout=600, check=True)
        pre = re.search(r"prefill: (\d+) tokens in ([0-9.]+) ms", r.stdout)
        dec = re.search(r"decode: (\d+) tokens in ([0-9.]+) ms", r.stdout)
        if pre is None or dec is None:
            raise RuntimeError("kvf generate printed no timing:\n" + r.stdout + r.stderr)
        step = float(dec.group(2)) / max(1, int(dec.group(1)))
        out.append((float(pre.group(2)), float(pre.group(2)) + step, int(pre.group(1))))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--layout", default="4p2d")
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3, help="colocated runs")
    ap.add_argument("--config", default=os.path.join(SRC, "tests", "data", "models",
                                                     "tiny-hybrid.config.json"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ptp = int(re.match(r"(\d+)p(\d+)d$", args.layout).group(1))
    # byte tokenizer: one token per byte, plus BOS; letters and spaces, fixed seed
    rng = random.Random(7)
    prompt = "".join(rng.choice("abcdefghij klmnop") for _ in range(args.tokens - 1))
    num_blocks = 1024
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(tmp, args.tokens, args.config)
        pf = os.path.join(tmp, "prompt.txt")
        with open(pf, "w") as f:
            f.write(prompt)
        colo = colocated(model, pf, ptp, args.runs, num_blocks)
        rows = []
        extra = ["--num-blocks", str(num_blocks)]
        with Pool(layout=args.layout, model=model, timeout=600, extra_args=extra) as pool:
            pool.complete(prompt, max_tokens=2, temperature=0, timeout=600)      # warm-up
            for _ in range(args.requests):
                r = pool.complete(prompt, max_tokens=2, temperature=0, timeout=600)
                bd = r["ttft_breakdown"]
                rows.append({
                    "ttft": bd["ttft_ms"],
                    "first_decode_token": bd["time_to_first_decode_token_ms"],
                    "prefill_compute": bd["prefill_compute_ms"],
                    "transfer": sum(bd[p + "_ms"] for p in TRANSFER),
                    "handover": sum(bd[p + "_ms"] for p in HANDOVER),
                    "first_decode_step": bd["first_decode_step_ms"],
                    "bytes": r["kv_transfer"]["bytes"],
                    "prompt_tokens": r["usage"]["prompt_tokens"],
                })
    res = {
        "tokens": colo[0][2], "layout": args.layout,
        "colocated_ttft_ms": median([c[0] for c in colo]),
        "colocated_second_token_ms": median([c[1] for c in colo]),
    }
    for k in ("ttft", "first_decode_token", "prefill_compute", "transfer", "handover",
              "first_decode_step"):
        res["pool_%s_ms" % k] = median([r[k] for r in rows])
    res["kv_bytes"] = rows[0]["bytes"]
    res["transfer_share"] = res["pool_transfer_ms"] / res["pool_first_decode_token_ms"]
    res["transfer_on_critical_path"] = res["transfer_share"] > 0.05
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print("TTFT, %d-token prompt, tiny-hybrid geometry (random weights), %s pool vs colocated "
          "TP %d; medians of %d requests / %d runs (ms)" % (
              res["tokens"], args.layout, ptp, len(rows), len(colo)))
    print("%-44s %10s %10s" % ("", "colocated", args.layout))
    print("%-44s %10.1f %10.1f" % ("first token (TTFT)", res["colocated_ttft_ms"],
                                    res["pool_ttft_ms"]))
    print("%-44s %10.1f %10.1f" % ("second token (first decoded on decode)",
                                    res["colocated_second_token_ms"],
                                    res["pool_first_decode_token_ms"]))
    print("%-44s %10s %10.1f" % ("  of which prefill compute", "", res["pool_prefill_compute_ms"]))
    print("%-44s %10s %10.2f" % ("  of which the transfer (%s)" % "+".join(
        p.replace("descriptor_", "") for p in TRANSFER), "", res["pool_transfer_ms"]))
    print("%-44s %10s %10.2f" % ("  of which hand-over (dispatch, queue, blocks)", "",
                                  res["pool_handover_ms"]))
    print("%-44s %10s %10.2f" % ("  of which the first decode step", "",
                                  res["pool_first_decode_step_ms"]))
    print("KV moved per request: %d bytes; the transfer is %.2f %% of the time to the first "
          "decoded token: %s" % (res["kv_bytes"], 100 * res["transfer_share"],
                                 "on the critical path, overlap it with prefill"
                                 if res["transfer_on_critical_path"] else
                                 "off the critical path (overlap would save at most that)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
