"""kvf plan --hardware: estimates on H200-class figures for Nemotron-Nano-9B-v2 and
Nemotron-3-Nano-30B-A3B, recomputed from the plan's own geometry; overrides;
bad input; and the transfer estimate against what kvf bench measures here.

Parameter counts are checked against the published sizes (9B-v2: 8.89 B;
30B-A3B: 31.6 B total, 3.2 B active). The transfer check runs kvf bench on the
9B-v2 4p2d geometry, plugs the raw contiguous GET bandwidth it measured into
--link-gbs (one shared link: both processes are on this host) and compares:
the bytes must be equal, the time error is printed (a benchmark figure, not
asserted beyond a factor of 10, which catches unit mistakes).
"""

import json
import os
import re
import subprocess
import sys

KVF = os.path.join(os.environ["KVF_BIN"], "kvf")
M = os.path.join(os.environ["KVF_SOURCE_DIR"], "tests", "data", "models")
NANO9 = os.path.join(M, "nemotron-nano-9b-v2.config.json")
NANO30 = os.path.join(M, "nemotron-3-nano-30b-a3b.config.json")


def check(cond, what, detail=None):
    if not cond:
        raise AssertionError(what if detail is None else "%s\n%s" % (what, detail))
    print("ok:", what)


def plan(model, *args, rc=0):
    p = subprocess.run([KVF, "plan", "--model", model, "--json"] + list(args),
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == rc, "kvf plan %s exits %d" % (" ".join(args), rc), p.stderr)
    return {x["layout"]: x for x in json.loads(p.stdout)} if rc == 0 else p


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def recheck(name, p, cfg):
    """Recompute capacity and transfer from the plan's geometry."""
    e = p["estimate"]
    hw = e["hardware"]
    n_attn = cfg["hybrid_override_pattern"].count("*")
    n_mamba = cfg["hybrid_override_pattern"].count("M")
    for side in ("prefill", "decode"):
        g, s = p[side], e[side]
        cache = hw["hbm_bytes"] * 0.9 - 4e9 - s["weights_bytes_per_rank"]
        check(close(s["cache_bytes_per_rank"], cache) and s["fits"],
              "%s %s: cache = 0.9 HBM - 4 GB - weights/TP" % (name, side))
        per_tok = g["kv_bytes_per_token_rank"]
        mamba_seq = g["page_size"] * n_mamba
        bs = g["block_size"]
        want = int((cache - e["batch"] * mamba_seq) / per_tok / bs) * bs
        check(s["capacity_tokens"] == want,
              "%s %s: capacity %d tokens = (cache - %d Mamba pages sets) / %d B/token" %
              (name, side, want, e["batch"], per_tok))
        blocks = -(-e["prompt_tokens"] // bs) * bs
        check(s["max_seqs"] == int(cache / (blocks * per_tok + mamba_seq)),
              "%s %s: %d sequences of %d tokens" % (name, side, s["max_seqs"],
                                                     e["prompt_tokens"]))
        check(g["attn_bytes_per_token"] * n_attn == per_tok, "%s: KV bytes/token" % name)
    D, P = p["decode"]["tp_size"], p["prefill"]["tp_size"]
    total = p["pull_bytes_per_decode_rank"] * D
    link = max(p["pull_bytes_per_decode_rank"], total / P)
    check(e["transfer_bytes"] == total and close(e["transfer_link_bytes"], link) and
          close(e["transfer_ms"], 1000 * link / hw["link_bytes_per_s"]),
          "%s: transfer = planner bytes on the busiest link / link bandwidth" % name)
    check(0 < e["decode_step_ms"] < e["prefill_ms"] < 10000,
          "%s: prefill %.1f ms, decode step %.2f ms" % (name, e["prefill_ms"],
                                                         e["decode_step_ms"]))


def main():
    layouts = "1p1d,2p2d,4p2d,2p4d,4p4d"
    for model, total, active in ((NANO9, 8.89e9, None), (NANO30, 31.6e9, 3.2e9)):
        cfg = json.load(open(model))
        name = os.path.basename(model).split(".")[0]
        pl = plan(model, "--hardware", "h200", "--layouts", layouts)
        e = pl["4p2d"]["estimate"]
        check(e["hardware"]["name"] == "h200" and e["hardware"]["hbm_bytes"] == 141e9 and
              e["hardware"]["link_bytes_per_s"] == 50e9, "%s: h200 figures" % name)
        check(abs(e["total_params"] / total - 1) < 0.01,
              "%s: %.2f B parameters (published %.2f B)" % (name, e["total_params"] / 1e9,
                                                          total / 1e9))
        if active:
            check(abs(e["active_params"] / active - 1) < 0.03,
                  "%s: %.2f B active (published %.1f B)" % (name, e["active_params"] / 1e9,
                                                           active / 1e9))
        for lay in layouts.split(","):
            recheck("%s %s" % (name, lay), pl[lay], cfg)
        # More TP on prefill: a faster prefill; more decode TP: a faster step.
        check(pl["4p2d"]["estimate"]["prefill_ms"] < pl["2p2d"]["estimate"]["prefill_ms"] and
              pl["2p4d"]["estimate"]["decode_step_ms"] <
              pl["2p2d"]["estimate"]["decode_step_ms"],
              "%s: TP shortens prefill and decode steps" % name)
        txt = subprocess.run([KVF, "plan", "--model", model, "--hardware", "h200", "--layouts",
                              "4p2d"], capture_output=True, text=True, timeout=60).stdout
        print(txt)
        check("estimates on h200" in txt and "KV transfer" in txt, "%s: text output" % name)

    # Overrides, does-not-fit, bad input.
    a = plan(NANO9, "--hardware", "h200", "--layouts", "4p2d")["4p2d"]["estimate"]
    b = plan(NANO9, "--hardware", "h200", "--layouts", "4p2d", "--link-gbs", "100",
             "--link-shared", "yes")["4p2d"]["estimate"]
    check(close(b["transfer_ms"], a["transfer_bytes"] / 100e9 * 1000) and
          b["hardware"]["link_shared"], "--link-gbs 100 --link-shared yes: all bytes at 100 GB/s")
    c = plan(NANO30, "--hardware", "h100", "--hbm-gb", "24", "--layouts", "1p1d")["1p1d"]
    check(not c["estimate"]["prefill"]["fits"] and c["estimate"]["prefill"]["capacity_tokens"] == 0,
          "30B-A3B in 24 GB at TP1: weights do not fit")
    for args, flag in ((["--hardware", "a100"], "--hardware"),
                       (["--hardware", "custom", "--hbm-gb", "80"], "--hbm-gbs"),
                       (["--hardware", "h200", "--mfu", "1.5"], "--mfu")):
        p = plan(NANO9, *args, rc=2)
        check(flag in p.stderr, "bad %s refused, naming it" % " ".join(args), p.stderr)

    # The transfer estimate against kvf bench on this machine.
    tokens = 4096
    p = subprocess.run([KVF, "bench", "--model", NANO9, "--layout", "4p2d", "--tokens",
                        str(tokens), "--iters", "3"], capture_output=True, text=True,
                       timeout=300)
    check(p.returncode == 0, "kvf bench ran", p.stdout + p.stderr)
    out = p.stdout
    measured_bytes = int(re.search(r"^transfer: (\d+) bytes", out, re.M).group(1))
    measured_ms = float(re.search(r"^transfer time: ([\d.]+) ms", out, re.M).group(1))
    raw_gbs = float(re.search(r"^raw contiguous GET: .* ([\d.]+) GB/s", out, re.M).group(1))
    est = plan(NANO9, "--hardware", "h200", "--layouts", "4p2d", "--prompt-tokens", str(tokens),
               "--link-gbs", str(raw_gbs), "--link-shared", "yes")["4p2d"]["estimate"]
    check(est["transfer_bytes"] == measured_bytes,
          "the estimate's bytes are what kvf bench moved: %d" % measured_bytes)
    err = (est["transfer_ms"] - measured_ms) / measured_ms
    print("transfer estimate: %.2f ms at the measured raw GET bandwidth %.2f GB/s; "
          "kvf bench measured %.2f ms; error %+.1f%%" %
          (est["transfer_ms"], raw_gbs, measured_ms, 100 * err))
    check(0.1 < est["transfer_ms"] / measured_ms < 10, "the estimate is within a factor of 10")


if __name__ == "__main__":
    sys.exit(main())
