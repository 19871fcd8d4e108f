#!/usr/bin/env python3
"""kvf tune on the tiny hybrid: a small sweep (1p1d and 2p2d run; 3p1d is refused
by the planner, 4p2d is over a 4-rank budget), two rates, six requests each.

Checked: the ranked table, tune.json (every point of the candidates that ran
completed all its requests; ranks ordered by goodput; the refused and
over-budget candidates say why and were never started), tune.csv, tune.png
(a PNG from gnuplot; skipped, exit 77, where gnuplot is not installed), and
that kvf-down stopped every process of every pool.
"""

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

from e2e_models import model_dir
from kvf_e2e import find_bin

N = 6


def main():
    model = model_dir("tiny-hybrid")
    kvf = os.path.join(find_bin(), "kvf")
    out = tempfile.mkdtemp(prefix="kvf-tune-")
    try:
        p = subprocess.run([kvf, "tune", "--model", model, "--layouts", "1p1d,2p2d,3p1d,4p2d",
                            "--budget", "4", "--rates", "4,8", "--num-requests", str(N), "--duration", "0",
                            "--input-len", "32", "--output-len", "8", "--slo-ttft-ms", "2000",
                            "--slo-tpot-ms", "200", "--out-dir", out],
                           capture_output=True, text=True, timeout=300)
        print(p.stdout)
        assert p.returncode == 0, p.stdout + p.stderr[-3000:]
        lines = p.stdout.splitlines()
        assert any(l.startswith("1    ") for l in lines), p.stdout
        assert any(l.startswith("2    ") for l in lines), p.stdout
        js = json.load(open(os.path.join(out, "tune.json")))
        c = {k["name"]: k for k in js["candidates"]}
        ran = [k for k in js["candidates"] if k["ran"]]
        assert sorted(k["name"] for k in ran) == ["1p1d", "2p2d"], c
        for k in ran:
            assert len(k["points"]) == 2 and [pt["rate"] for pt in k["points"]] == [4, 8], k
            for pt in k["points"]:
                assert pt["completed"] == N and pt["failed"] == 0, (k["name"], pt)
                assert pt["ttft_p50_ms"] > 0 and pt["tpot_p50_ms"] > 0, pt
                assert 0 < pt["transfer_share"] < 1, pt
        assert [k["rank"] for k in ran] == [1, 2] and \
            ran[0]["max_rate_per_rank"] >= ran[1]["max_rate_per_rank"], ran
        assert ran[0]["max_rate_meeting_slo"] == 0 or \
            any(l.startswith("recommended: %s, " % ran[0]["name"]) for l in lines), p.stdout
        assert "cannot be sharded 3 ways" in c["3p1d"]["why"] and \
            c["3p1d"]["verdict"] == "refused", c["3p1d"]
        assert "6 ranks > --budget 4" in c["4p2d"]["why"], c["4p2d"]
        assert not os.path.exists(os.path.join(out, "run-3p1d-1x1")) and \
            not os.path.exists(os.path.join(out, "run-4p2d-1x1")), os.listdir(out)
        rows = list(csv.DictReader(open(os.path.join(out, "tune.csv"))))
        assert len(rows) == 4 and {r["candidate"] for r in rows} == {"1p1d", "2p2d"}, rows
        for run in ("run-1p1d-1x1", "run-2p2d-1x1"):
            for fn in os.listdir(os.path.join(out, run)):
                if fn.endswith(".pid"):
                    pid = int(open(os.path.join(out, run, fn)).read().split()[0])
                    assert not os.path.exists("/proc/%d" % pid), (run, fn, "still running")
        print("ok: ranked table, tune.json, tune.csv; refused and over-budget candidates "
              "not started; every pool stopped")
        png = os.path.join(out, "tune.png")
        if shutil.which("gnuplot") is None:
            print("skipped: tune.png (gnuplot is not installed)")
            return 77
        assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "tune.png is not a PNG"
        assert os.path.getsize(png) > 2000, os.path.getsize(png)
        print("ok: tune.png (%d bytes)" % os.path.getsize(png))
        return 0
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
