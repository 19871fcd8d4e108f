#!/usr/bin/env python3
"""kvf bench-serve as `vllm bench serve` is run, against a real 4p2d pool of the tiny hybrid
(kvf-up makes the pool's keys itself).

  kvf bench-serve --num-prompts 40 --random-input-len 64 --random-output-len 16
                  --max-concurrency 8 --save-result --result-dir DIR

with KVF_MODEL exported (a daemon's variable: it must not become the model name; the name
comes from the proxy's GET /v1/models). Checked: the result JSON in DIR has vLLM's field
names with sane values (the vLLM result block on stdout once; completed 40, token totals, throughputs, mean/median/std/p99 of
TTFT, TPOT and ITL, median <= p99, TPOT ~ mean ITL), the PNG is a PNG; a second run at two
request rates with --goodput and --metric-percentiles writes one JSON per rate with those
percentiles and request_goodput, and one PNG; unknown flags and datasets are refused by name.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from e2e_models import model_dir  # noqa: E402
from kvf_e2e import Pool, find_bin  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError("%s\n%s" % (what, detail))
    print("ok: " + what)


def bench(kvf, url, args, env=None, expect=0):
    p = subprocess.run([kvf, "bench-serve", "--base-url", url, "--progress", "no"] + args,
                       capture_output=True, text=True, timeout=120, env=env)
    if p.returncode != expect:
        raise AssertionError("bench-serve %s: rc %d (want %d)\nstdout %s\nstderr %s" %
                             (args, p.returncode, expect, p.stdout[-3000:], p.stderr[-3000:]))
    return p


def one(pattern):
    files = glob.glob(pattern)
    check(len(files) == 1, "one file %s" % os.path.basename(pattern), files)
    return files[0]


def main():
    model = model_dir("tiny-hybrid")
    kvf = os.path.join(find_bin(), "kvf")
    out = tempfile.mkdtemp(prefix="kvf-bench-serve-")
    try:
        # Refusals need no pool.
        for args, word in ((["--no-such-flag", "1"], "--no-such-flag"),
                           (["--dataset-name", "sharegpt"], "sharegpt"),
                           (["--goodput", "ttft:10", "foo:3"], "foo"),
                           (["--percentile-metrics", "ttft,xyz"], "xyz"),
                           (["--endpoint", "/v1/chat/completions"], "/v1/chat/completions")):
            p = bench(kvf, "http://127.0.0.1:1", args, expect=2)
            check(word in p.stderr, "refused by name: %s" % " ".join(args), p.stderr)
        with Pool(layout="4p2d", model=model) as pool:
            env = dict(os.environ, KVF_MODEL=model)   # as exported for the daemons
            d1 = os.path.join(out, "r1")
            p = bench(kvf, pool.url, ["--num-prompts", "40", "--random-input-len", "64",
                                      "--random-output-len", "16", "--max-concurrency", "8",
                                      "--save-result", "--result-dir", d1], env=env)
            print(p.stdout)
            check(p.stdout.count("Serving Benchmark Result") == 1 and
                  "Successful requests:                     40" in p.stdout,
                  "vLLM's result block printed once, 40 successful requests")
            js = json.load(open(one(os.path.join(d1, "*.json"))))
            png = one(os.path.join(d1, "*.png"))
            for k in ("date", "backend", "model_id", "num_prompts", "request_rate",
                      "burstiness", "max_concurrency", "duration", "completed",
                      "total_input_tokens", "total_output_tokens", "request_throughput",
                      "request_goodput", "output_throughput", "total_token_throughput",
                      "max_concurrent_requests", "max_output_tokens_per_s"):
                check(k in js, "field %s" % k, sorted(js))
            check(js["model_id"] == pool.model_name, "model_id %r is the proxy's (%r), not "
                  "KVF_MODEL" % (js["model_id"], pool.model_name))
            check(js["completed"] == 40 and js["failed"] == 0, "completed == 40", js)
            check(js["total_input_tokens"] == 40 * 64 and js["total_output_tokens"] == 40 * 16,
                  "total_input_tokens 2560, total_output_tokens 640", js)
            check(js["num_prompts"] == 40 and js["max_concurrency"] == 8 and
                  js["request_rate"] == "inf" and js["request_goodput"] is None,
                  "num_prompts, max_concurrency 8, request_rate inf, no goodput without SLO")
            check(1 <= js["max_concurrent_requests"] <= 8, "at most 8 in flight (%d)" %
                  js["max_concurrent_requests"])
            d = js["duration"]
            check(d > 0 and abs(js["request_throughput"] - 40 / d) < 1e-6 and
                  abs(js["output_throughput"] - 640 / d) < 1e-6 and
                  abs(js["total_token_throughput"] - (2560 + 640) / d) < 1e-6,
                  "throughputs are totals over duration %.2f s" % d)
            for m in ("ttft", "tpot", "itl"):
                keys = ["mean_%s_ms" % m, "median_%s_ms" % m, "std_%s_ms" % m, "p99_%s_ms" % m]
                check(all(k in js for k in keys), "mean/median/std/p99 of %s" % m)
                check(0 < js["median_%s_ms" % m] <= js["p99_%s_ms" % m] and
                      js["std_%s_ms" % m] >= 0 and js["mean_%s_ms" % m] > 0,
                      "%s: 0 < median %.2f <= p99 %.2f ms" %
                      (m, js["median_%s_ms" % m], js["p99_%s_ms" % m]))
                check(js["median_%s_ms" % m] < d * 1000, "%s median below the duration" % m)
            check("mean_e2el_ms" not in js, "e2el not reported unless asked (vLLM's default)")
            check(abs(js["mean_tpot_ms"] - js["mean_itl_ms"]) < 0.25 * js["mean_itl_ms"] + 1,
                  "mean TPOT %.2f ~ mean ITL %.2f" % (js["mean_tpot_ms"], js["mean_itl_ms"]))
            check(open(png, "rb").read(8) == PNG_MAGIC and os.path.getsize(png) > 2000,
                  "%s is a PNG (%d bytes)" % (os.path.basename(png), os.path.getsize(png)))

            d2 = os.path.join(out, "r2")
            bench(kvf, pool.url, ["--num-prompts", "12", "--random-input-len", "32",
                                  "--random-output-len", "8", "--request-rate", "20,40",
                                  "--goodput", "ttft:100000", "tpot:100000",
                                  "--percentile-metrics", "ttft,itl,e2el",
                                  "--metric-percentiles", "50,90,99.9", "--save-result",
                                  "--result-dir", d2, "--result-filename", "two.json",
                                  "--seed", "3", "--num-warmups", "1"])
            for rate in ("20", "40"):
                r = json.load(open(os.path.join(d2, "two-%sqps.json" % rate)))
                check(r["completed"] == 12 and r["request_rate"] == float(rate) and
                      abs(r["request_goodput"] - r["request_throughput"]) < 1e-9,
                      "rate %s: 12 completed, every request within the loose SLO" % rate)
                check(all(k in r for k in ("p50_ttft_ms", "p90_itl_ms", "p99.9_e2el_ms")) and
                      "p99_ttft_ms" not in r and "mean_tpot_ms" not in r,
                      "rate %s: the asked percentiles of the asked metrics only" % rate)
            check(open(os.path.join(d2, "two.png"), "rb").read(8) == PNG_MAGIC,
                  "two.png: TTFT and ITL percentiles against the two rates")
    finally:
        if os.environ.get("KVF_E2E_KEEP") == "1":
            print("kept " + out)
        else:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
