#!/usr/bin/env python3
"""kvf tune's search for the highest request rate that meets the SLO, on a 1p1d pool of the
tiny hybrid (the fixed --rates list is tests/e2e/test_e2e_tune.py).

(--duration 0: exactly --num-requests 12 per rate; tests/tools/test_tune_rank.py runs the default
rate x 2 s past saturation.)
1. A loose SLO: the rate doubles from --rate-start 8 while the SLO holds, up to --rate-max 64;
   every point's meets_slo is good >= --slo-percent of sent; max_rate_meeting_slo is the
   highest rate that met it; tune.csv has the meets_slo column; tune.png is a PNG.
2. An SLO no request can meet (TTFT <= 0.01 ms): 8 misses, the bisection tries 4 (below the
   first miss), max_rate_meeting_slo is 0 and the table says no tried rate met the SLO.
"""

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from e2e_models import model_dir  # noqa: E402
from kvf_e2e import find_bin  # noqa: E402


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError("%s\n%s" % (what, detail))
    print("ok: " + what)


def tune(kvf, model, out, args):
    p = subprocess.run([kvf, "tune", "--model", model, "--layouts", "1p1d", "--budget", "2",
                        "--num-requests", "12", "--duration", "0", "--input-len", "32",
                        "--output-len", "8",
                        "--out-dir", out] + args, capture_output=True, text=True, timeout=240)
    print(p.stdout)
    if p.returncode != 0:
        raise AssertionError("kvf tune rc %d\n%s" % (p.returncode, p.stderr[-3000:]))
    return p.stdout, json.load(open(os.path.join(out, "tune.json")))


def main():
    model = model_dir("tiny-hybrid")
    kvf = os.path.join(find_bin(), "kvf")
    out = tempfile.mkdtemp(prefix="kvf-tune-search-")
    try:
        d1 = os.path.join(out, "loose")
        text, js = tune(kvf, model, d1, ["--rate-start", "8", "--rate-max", "64",
                                          "--slo-ttft-ms", "5000", "--slo-tpot-ms", "1000"])
        k = js["candidates"][0]
        rates = [pt["rate"] for pt in k["points"]]
        check(js["searched"] and k["ran"] and rates == sorted(rates) and rates[0] == 8,
              "search from 8 req/s, points in rate order: %s" % rates)
        for pt in k["points"]:
            check(pt["meets_slo"] == (pt["good"] >= 0.9 * 12) and pt["completed"] == 12,
                  "%g req/s: meets_slo %s with %d of 12 within the SLO" %
                  (pt["rate"], pt["meets_slo"], pt["good"]))
        met = [pt["rate"] for pt in k["points"] if pt["meets_slo"]]
        check(k["max_rate_meeting_slo"] == max(met), "max_rate_meeting_slo %g" %
              k["max_rate_meeting_slo"])
        if all(pt["meets_slo"] for pt in k["points"]):
            check(rates == [8, 16, 32, 64], "the SLO held: doubled up to --rate-max 64")
        check("recommended: 1p1d, %g req/s meeting the SLO" % k["max_rate_meeting_slo"] in text,
              "the table recommends it")
        rows = list(csv.DictReader(open(os.path.join(d1, "tune.csv"))))
        check([r["meets_slo"] for r in rows] == [str(int(pt["meets_slo"])) for pt in k["points"]],
              "tune.csv: one row per point with meets_slo")
        png = os.path.join(d1, "tune.png")
        if shutil.which("gnuplot") is not None:
            check(open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 2000,
                  "tune.png: goodput and SLO attainment against rate, with the SLO lines")

        d2 = os.path.join(out, "strict")
        text, js = tune(kvf, model, d2, ["--rate-start", "8", "--rate-max", "64",
                                          "--search-steps", "1", "--slo-ttft-ms", "0.01"])
        k = js["candidates"][0]
        check([pt["rate"] for pt in k["points"]] == [4, 8] and
              not any(pt["meets_slo"] for pt in k["points"]) and
              k["max_rate_meeting_slo"] == 0,
              "an SLO nothing meets: 8 missed, then 4 (one bisection step), max rate 0")
        check("no tried rate met the SLO" in text, "the table says so")
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
