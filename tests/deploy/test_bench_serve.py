"""kvf bench-serve's accounting against fake daemons with known delays.

Two prefill instances answer after 20 ms and 300 ms (--fake-prefill-delay-ms),
decode sends one token every 10 ms. With one request in flight the proxy's
round robin alternates between the prefills, so exactly half the requests
meet a 250 ms TTFT SLO. Checked: counts, tokens, each request's TTFT and
TPOT against the delays, the identity E2E = TTFT + TPOT * (n - 1), the
summary's mean and percentiles against the per-request CSV, goodput,
failures by kind (an instance failing every prefill; a decode that never
answers), Poisson arrivals over a bounded duration, a JSONL dataset, bad
flags, a proxy with an API key (OPENAI_API_KEY sent as a bearer token, 401s
counted without it), and the daemons' KVF_* variables in the environment
ignored.
"""

import csv
import http.server
import json
import os
import re
import subprocess
import threading

import proxy_testlib as T
from kvf_e2e import free_port_range, wait_for

FAST_MS, SLOW_MS, TOKEN_MS = 20, 300, 10
SLO_MS = 250
# Upper bounds only catch gross mistakes: a 2-core machine shared by many
# jobs delays any process by 100 ms and more now and then. Lower bounds are
# the delays less the fake's 1 ms clock granularity; the goodput split needs
# the fast prefill within SLO_MS - FAST_MS of its delay.
SLACK_MS = 1000
GRAIN_MS = 1.5


def percentile(v, q):
    """numpy's default (linear) percentile."""
    v = sorted(v)
    pos = q / 100.0 * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def bench(kvf, url, args, tmp, name, expect_rc=0, env=None):
    out_csv = os.path.join(tmp, name + ".csv")
    cmd = [kvf, "bench-serve", "--url", url, "--json", "--csv", out_csv, "--progress", "no",
           "--input-len", "12", "--output-len", "6",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env=None if env is None else dict(os.environ, **env))
    errors = ""
    if p.returncode != expect_rc and os.path.exists(out_csv):
        with open(out_csv) as f:
            errors = sorted(set(r["error"] for r in csv.DictReader(f)))
    T.check(p.returncode == expect_rc, "%s: exit code %d" % (name, expect_rc),
            "rc %d\nstdout %s\nstderr %s\nerrors %s" % (p.returncode, p.stdout[-1500:], p.stderr,
                                                    errors))
    with open(out_csv) as f:
        rows = list(csv.DictReader(f))
    return json.loads(p.stdout), rows


# vLLM's result keys (vllm/benchmarks/serve.py: the run's result and main's additions;
# with --save-detailed the per-request lists too). kvf bench-serve's JSON must hold them all.
VLLM_KEYS = ["date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id",
             "num_prompts", "request_rate", "burstiness", "max_concurrency", "duration",
             "completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput", "latencies", "queue_times", "max_output_tokens_per_s",
             "max_concurrent_requests", "rtfx", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
             "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
             "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p99_itl_ms"]
VLLM_DETAILED = ["input_lens", "output_lens", "ttfts", "itls", "start_times",
                 "generated_texts", "errors"]


class Recorder(http.server.BaseHTTPRequestHandler):
    """An OpenAI server stand-in that records what kvf bench-serve sends: GET /v1/models
    lists "m"; POST /v1/completions streams 3 tokens ("a", "b", "c")."""
    seen = []

    def log_message(self, *_):
        pass

    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "m", "root": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Recorder.seen.append((dict(self.headers), req))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i, t in enumerate("abc"):
            chunk = {"choices": [{"index": 0, "text": t, "token_ids": [65 + i],
                                  "finish_reason": "length" if i == 2 else None}]}
            if i == 2:
                chunk["usage"] = {"prompt_tokens": len(req["prompt"]), "completion_tokens": 3}
            self.wfile.write(("data: %s\n\n" % json.dumps(chunk)).encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


def vllm_command_line(kvf, tmp):
    """A `vllm bench serve` command line (its flags, as its docs spell them) run unchanged:
    what goes on the wire and what the result JSON holds."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d" % srv.server_address[1]
    res = os.path.join(tmp, "vllm-res")
    try:
        args = ["--backend", "vllm", "--base-url", url, "--model", "m", "--dataset-name",
                "random", "--random-input-len", "12", "--random-output-len", "3",
                "--random-prefix-len", "4", "--num-prompts", "4", "--label", "mylabel",
                "--header", "x-a=1", "x-b=two", "--request-id-prefix", "t-",
                "--top-p", "0.9", "--top-k", "5", "--min-p", "0.1", "--frequency-penalty",
                "0.5", "--presence-penalty", "0.25", "--repetition-penalty", "1.1",
                "--extra-body", '{"top_k": 7, "user": "u"}', "--ramp-up-strategy", "linear",
                "--ramp-up-start-rps", "20", "--ramp-up-end-rps", "80", "--goodput", "ttft:0",
                "--ready-check-timeout-sec", "5", "--save-result", "--save-detailed",
                "--append-result", "--result-dir", res, "--result-filename", "r.json",
                "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "99",
                "--disable-tqdm", "--seed", "3"]
        for _ in range(2):
            p = subprocess.run([kvf, "bench-serve"] + args, capture_output=True, text=True,
                               timeout=60)
            T.check(p.returncode == 0, "vLLM's command line runs unchanged", p.stderr[-800:])
        seen = Recorder.seen
        T.check(len(seen) == 2 * (4 + 1), "4 requests and one ready-check request per run "
                "(%d)" % len(seen))
        hdrs, body = seen[-1]
        T.check(hdrs.get("x-a") == "1" and hdrs.get("x-b") == "two" and
                sorted(h["x-request-id"] for h, _ in seen[-4:]) == ["t-%d" % i for i in
                                                                    range(4)],
                "--header pairs and x-request-id = --request-id-prefix + index on the wire",
                hdrs)
        T.check(body["top_p"] == 0.9 and body["top_k"] == 7 and body["min_p"] == 0.1 and
                body["frequency_penalty"] == 0.5 and body["presence_penalty"] == 0.25 and
                body["repetition_penalty"] == 1.1 and body["user"] == "u" and
                "temperature" not in body and body["ignore_eos"] is True and
                body["model"] == "m" and len(body["prompt"]) == 16 and
                len({tuple(b["prompt"][:4]) for _, b in seen}) == 1,
                "sampling flags sent (--extra-body wins), no temperature unless asked, "
                "ignore_eos for random, 4 shared prefix tokens + 12", body)
        with open(os.path.join(res, "r.json")) as f:
            docs = [json.loads(line) for line in f if line.strip()]
        js = docs[-1]
        missing = [k for k in VLLM_KEYS + VLLM_DETAILED if k not in js]
        T.check(len(docs) == 2 and not missing, "--append-result: two documents, each with "
                "every key vLLM writes", missing)
        T.check(js["endpoint_type"] == "vllm" and js["label"] == "mylabel" and
                js["completed"] == 4 and js["request_goodput"] == 0 and
                js["generated_texts"] == ["abc"] * 4 and js["input_lens"] == [16] * 4 and
                len(js["latencies"]) == 4 and len(js["start_times"]) == 4 and
                js["ramp_up_strategy"] == "linear" and js["ramp_up_end_rps"] == 80,
                "the result: endpoint_type, label, generated texts, latencies, start "
                "times; --goodput ttft:0 is an SLO of 0 (goodput 0, not null)", js)
        n0 = len(Recorder.seen)
        p = subprocess.run([kvf, "bench-serve", "--base-url", url, "--dataset-name",
                            "prefix_repetition", "--prefix-repetition-prefix-len", "5",
                            "--prefix-repetition-suffix-len", "3",
                            "--prefix-repetition-num-prefixes", "2",
                            "--prefix-repetition-output-len", "3", "--num-prompts", "8",
                            "--seed", "1", "--disable-tqdm"], capture_output=True, text=True,
                           timeout=60)
        bodies = [b for _, b in Recorder.seen[n0:]]
        T.check(p.returncode == 0 and len(bodies) == 8 and
                all(len(b["prompt"]) == 8 and b["max_tokens"] == 3 and "ignore_eos" not in b
                    for b in bodies) and
                len({tuple(b["prompt"][:5]) for b in bodies}) == 2 and
                len({tuple(b["prompt"][5:]) for b in bodies}) == 8,
                "prefix_repetition: 8 prompts of 5 + 3 tokens over 2 shared prefixes, each "
                "suffix its own, max_tokens 3, no ignore_eos (vLLM forces it for random only)",
                (p.stderr[-300:], [b["prompt"] for b in bodies]))
        p = subprocess.run([kvf, "bench-serve", "--base-url", url, "--model", "wrong",
                            "--num-prompts", "2"], capture_output=True, text=True, timeout=30)
        T.check(p.returncode == 1 and "model 'wrong' is not served" in p.stderr and
                "'m'" in p.stderr and len(Recorder.seen) == 18,
                "a wrong --model: the ready check exits 1 naming the served models; nothing "
                "sent", p.stderr)
        n0 = len(Recorder.seen)
        p = subprocess.run([kvf, "bench-serve", "--base-url", url, "--dataset-name",
                            "multi_turn", "--multi-turn-conversations", "2",
                            "--multi-turn-turns", "3", "--multi-turn-first-len", "6",
                            "--multi-turn-question-len", "2", "--multi-turn-answer-len", "3",
                            "--num-prompts", "6", "--max-concurrency", "1", "--seed", "1",
                            "--disable-tqdm"], capture_output=True, text=True, timeout=60)
        bodies = [b for _, b in Recorder.seen[n0:]]
        conv = [[b["prompt"] for b in bodies[c::2]] for c in range(2)]
        T.check(p.returncode == 0 and len(bodies) == 6 and
                all(b["max_tokens"] == 3 for b in bodies) and
                all([len(x) for x in turns] == [6, 11, 16] and
                    turns[1][:6] == turns[0] and turns[2][:11] == turns[1] for turns in conv) and
                conv[0][0] != conv[1][0],
                "multi_turn: 2 conversations of 3 turns, each turn's prompt the previous one, a "
                "3-token answer and a 2-token question (6, 11, 16 tokens), max_tokens 3",
                (p.stderr[-300:], conv))
        p = subprocess.run([kvf, "bench-serve", "--base-url", url, "--dataset-name",
                            "multi_turn", "--multi-turn-turns", "0"], capture_output=True,
                           text=True, timeout=30)
        T.check(p.returncode == 2 and "--multi-turn-conversations" in p.stderr,
                "multi_turn with 0 turns refused naming the flags", p.stderr[-300:])
        for args_, flag in ((["--dataset-name", "sharegpt"], "dataset-name"),
                            (["--ramp-up-strategy", "cubic"], "ramp-up-strategy"),
                            (["--header", "nokey"], "header"),
                            (["--extra-body", "[1]"], "extra-body"),
                            (["--top-k", "1.5"], "top-k")):
            p = subprocess.run([kvf, "bench-serve", "--base-url", url] + args_,
                               capture_output=True, text=True, timeout=30)
            T.check(p.returncode == 2 and ("--" + flag) in p.stderr,
                    "%s refused by name" % " ".join(args_), p.stderr)
    finally:
        srv.shutdown()


def main():
    T.run_with_procs(lambda a, procs, tmp: run(a, procs, tmp))


def run(a, procs, tmp):
    kvf = os.path.join(os.path.dirname(os.path.realpath(os.path.join(a.fakebin, "kvf-proxy"))),
                       "kvf")
    vllm_command_line(kvf, tmp)
    base = free_port_range(6)
    P = lambda i: "tcp://127.0.0.1:%d" % (base + i)  # noqa: E731
    T.start_fake(procs, a.testbin, "prefill", "prefill-fast", base + 0,
                 ["--fake-prefill-delay-ms", str(FAST_MS)])
    T.start_fake(procs, a.testbin, "prefill", "prefill-slow", base + 1,
                 ["--fake-prefill-delay-ms", str(SLOW_MS)])
    T.start_fake(procs, a.testbin, "decode", "decode-0", base + 2,
                 ["--fake-token-delay-ms", str(TOKEN_MS)])
    T.start_fake(procs, a.testbin, "prefill", "prefill-fail", base + 3,
                 ["--fake-mode", "fail-prefill"])
    T.start_fake(procs, a.testbin, "decode", "decode-hang", base + 4,
                 ["--fake-mode", "hang-decode"])

    _, px = T.start_proxy(procs, a.fakebin, P(0) + "," + P(1), P(2),
                          ["--model-name", "m", "--health-interval", "100ms"], name="proxy")
    wait_for(lambda: all(i["healthy"] for r in ("prefill", "decode")
                         for i in px.health()[1][r]), 10, "every instance healthy")

    # 1. Accounting: 20 requests, one at a time, alternating fast and slow prefill.
    n = 20
    js, rows = bench(kvf, px.url, ["--num-requests", str(n), "--max-concurrency", "1",
                                   "--slo-ttft-ms", str(SLO_MS)], tmp, "acct")
    T.check(js["sent"] == n and js["completed"] == n and js["failed"] == 0 and
            js["failures"] == {}, "all %d requests completed" % n,
            (js, sorted(set(r["error"] for r in rows))))
    T.check(js["total_input_tokens"] == 12 * n and js["total_output_tokens"] == 6 * n,
            "token counts: 12 prompt and 6 output tokens per request", js)
    T.check(len(rows) == n and sorted(int(r["index"]) for r in rows) == list(range(n)),
            "one CSV row per request")
    slow = [r for r in rows if r["prefill_instance"].endswith(":%d" % (base + 1))]
    fast = [r for r in rows if r["prefill_instance"].endswith(":%d" % base)]
    T.check(len(slow) == n // 2 and len(fast) == n // 2, "round robin: half on each prefill")
    for r in rows:
        delay = SLOW_MS if r in slow else FAST_MS
        ttft, tpot, e2e = float(r["ttft_ms"]), float(r["tpot_ms"]), float(r["e2e_ms"])
        if not (delay - GRAIN_MS <= ttft < delay + SLACK_MS):
            raise AssertionError("request %s: ttft %.1f ms, prefill delay %d" %
                                 (r["index"], ttft, delay))
        if not (TOKEN_MS * 0.9 <= tpot < TOKEN_MS + SLACK_MS / 5):
            raise AssertionError("request %s: tpot %.2f ms, token delay %d" %
                                 (r["index"], tpot, TOKEN_MS))
        if abs(e2e - (ttft + tpot * 5)) > 1e-2:
            raise AssertionError("request %s: e2e %.3f != ttft + 5 tpot" % (r["index"], e2e))
        if float(r["proxy_ttft_ms"]) > ttft + 1e-3 or int(r["output_tokens"]) != 6:
            raise AssertionError("request %s: proxy ttft after client ttft, or short" % r)
    T.check(True, "each request: prefill delay <= TTFT < delay + %d ms, TPOT ~ %d ms, "
            "E2E = TTFT + 5 TPOT" % (SLACK_MS, TOKEN_MS))
    for key, col in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("e2el", "e2e_ms")):
        v = [float(r[col]) for r in rows]
        mean = sum(v) / len(v)
        want = {"mean": mean, "median": percentile(v, 50), "p50": percentile(v, 50),
                "p90": percentile(v, 90), "p99": percentile(v, 99),
                "std": (sum((x - mean) ** 2 for x in v) / len(v)) ** 0.5}
        got = {k: js["%s_%s_ms" % (k, key)] for k in want}
        if any(abs(got[k] - want[k]) > 2e-3 for k in want):
            raise AssertionError("%s summary %s != from rows %s" % (key, got, want))
    T.check(js["median_ttft_ms"] > FAST_MS + 10 and js["p90_ttft_ms"] >= SLOW_MS - GRAIN_MS and
            js["median_tpot_ms"] < TOKEN_MS + 40,
            "TTFT p50 falls between the two prefills, p90 on the slow one; TPOT p50 ~ %d ms" %
            TOKEN_MS, js)
    T.check(abs(js["mean_itl_ms"] - js["mean_tpot_ms"]) < 0.05,
            "ITL: mean equal to the mean TPOT", js)
    T.check(js["good"] == n // 2 and
            all((r["good"] == "1") == (r in fast) for r in rows),
            "goodput counts exactly the fast-prefill requests under ttft <= %d ms" % SLO_MS, js)
    span = max(float(r["end_ms"]) for r in rows) - min(float(r["start_ms"]) for r in rows)
    T.check(abs(js["duration"] * 1000 - span) < 1e-2 and
            span >= sum(float(r["e2e_ms"]) for r in rows) and
            abs(js["request_throughput"] - n / js["duration"]) < 1e-6 and
            abs(js["request_goodput"] - (n // 2) / js["duration"]) < 1e-6 and
            abs(js["output_throughput"] - 6 * n / js["duration"]) < 1e-3 and
            abs(js["total_token_throughput"] - 18 * n / js["duration"]) < 1e-3,
            "duration spans the requests (one at a time: at least the sum of E2E); "
            "throughputs are counts over it", js)

    # The proxy's TTFT breakdown from the fakes' ServeTiming (the real daemons'
    # is tests/e2e/test_e2e_ttft_breakdown.py): decode reports wire = first step =
    # half its 10 ms first-reply delay, so the transfer share is 5 ms over the total.
    for r in rows:
        share, first = float(r["transfer_share"]), float(r["first_decode_token_ms"])
        if not (first >= float(r["proxy_ttft_ms"]) and abs(share - 5.0 / first) < 1e-3):
            raise AssertionError("request %s: transfer share %s, first decode %s" %
                                 (r["index"], share, first))
    T.check(abs(js["transfer_share"] - sum(5.0 / float(r["first_decode_token_ms"])
                                           for r in rows) / n) < 1e-3,
            "bench-serve: transfer share = transfer phases / time to the first decoded token")
    c = px.complete([72, 105], max_tokens=3)
    bd = c["ttft_breakdown"]
    phases = [k for k in bd if k.endswith("_ms") and k not in
              ("ttft_ms", "time_to_first_decode_token_ms")]
    T.check(len(phases) == 14 and bd["wire_ms"] == 5.0 and bd["first_decode_step_ms"] == 5.0 and
            bd["prefill_compute_ms"] in (FAST_MS, SLOW_MS) and
            abs(sum(bd[k] for k in phases) - bd["time_to_first_decode_token_ms"]) < 1e-6 and
            bd["prefill_relay_ms"] > -1 and bd["tp_ranks"] == "max",
            "the answer's ttft_breakdown carries the daemons' phases and adds up", bd)
    m = px.metrics()
    T.check(m.value("kvf_proxy_ttft_phase_seconds_count", phase="wire") == n + 1 and
            abs(m.value("kvf_proxy_ttft_phase_seconds_sum", phase="wire") - 0.005 * (n + 1)) < 1e-6,
            "/metrics: kvf_proxy_ttft_phase_seconds{phase=\"wire\"} has every request")

    # 2. Failures by kind.
    _, px_fail = T.start_proxy(procs, a.fakebin, P(0) + "," + P(3), P(2),
                               ["--model-name", "m", "--health-interval", "100ms"],
                               name="proxy-fail")
    wait_for(lambda: all(i["healthy"] for i in px_fail.health()[1]["prefill"]), 10,
             "both prefills healthy")
    js, rows = bench(kvf, px_fail.url, ["--num-requests", "8", "--max-concurrency", "1"],
                     tmp, "fail")
    T.check(js["completed"] == 4 and js["failed"] == 4 and js["failures"] == {"http_502": 4} and
            all("fake prefill failure" in r["error"] for r in rows if r["ok"] == "0"),
            "a failing prefill: 4 of 8 counted as http_502 with the daemon's message", js)
    T.check("fake prefill failure" in js["failure_examples"]["http_502"],
            "the result names the first error text of each kind", js["failure_examples"])
    p = subprocess.run([kvf, "bench-serve", "--url", px_fail.url, "--num-prompts", "4",
                        "--max-concurrency", "1", "--input-len", "12", "--output-len", "6",
                        "--progress", "no"], capture_output=True, text=True, timeout=60)
    T.check(re.search(r"failed http_502:\s+2\s+first: .*fake prefill failure", p.stdout),
            "the table prints each failure kind's count and first error text", p.stdout)
    _, px_hang = T.start_proxy(procs, a.fakebin, P(0), P(4), ["--model-name", "m"],
                               name="proxy-hang")
    px_hang.wait_healthy(timeout=10)
    js, rows = bench(kvf, px_hang.url, ["--num-requests", "2", "--timeout", "0.4"],
                     tmp, "hang", expect_rc=1)
    T.check(js["failures"] == {"timeout": 2} and js["completed"] == 0 and
            all(r["output_tokens"] == "1" for r in rows),
            "a decode that never answers: timeouts after the first token; exit 1", js)

    # 3. Poisson arrivals bounded by a duration; warm-up not counted.
    js, rows = bench(kvf, px.url, ["--num-requests", "0", "--duration", "0.6",
                                   "--request-rate", "40", "--warmup", "2", "--seed", "7"],
                     tmp, "poisson")
    starts = sorted(float(r["start_ms"]) for r in rows)
    T.check(8 <= js["sent"] <= 60 and js["failed"] == 0 and starts[-1] < 600 + SLACK_MS / 5 and
            [int(r["index"]) for r in rows] == list(range(js["sent"])),
            "Poisson at 40 req/s for 0.6 s: %d requests, all started within the duration" %
            js["sent"], js)
    js2, _ = bench(kvf, px.url, ["--num-requests", "0", "--duration", "0.6",
                                 "--request-rate", "40", "--seed", "7"], tmp, "poisson2")
    T.check(js2["sent"] == js["sent"], "the same seed draws the same arrivals")

    # 4. A JSONL dataset: text and token-id prompts, per-line max_tokens.
    ds = os.path.join(tmp, "prompts.jsonl")
    with open(ds, "w") as f:
        f.write(json.dumps({"prompt": "hello world", "max_tokens": 3}) + "\n\n")
        f.write(json.dumps({"prompt": [72, 105, 33, 33]}) + "\n")
    js, rows = bench(kvf, px.url, ["--dataset", ds, "--num-requests", "4",
                                   "--max-concurrency", "2", "--output-len", "5"], tmp, "ds")
    got = sorted((int(r["prompt_tokens"]), int(r["output_tokens"])) for r in rows)
    T.check(got == [(4, 5), (4, 5), (11, 3), (11, 3)],
            "dataset lines cycle; prompt tokens as the proxy counted, per-line max_tokens", got)

    # 5. Bad flags are named.
    for args, flag in ((["--input-dist", "zipf"], "input-dist"),
                       (["--url", "https://x:1"], "base-url"),
                       (["--dataset-name", "sonnet"], "dataset-name"),
                       (["--goodput", "ttft:1", "ttlt:2"], "goodput"),
                       (["--duration", "1"], "duration"),
                       (["--burstiness", "0"], "burstiness")):
        p = subprocess.run([kvf, "bench-serve"] + args, capture_output=True, text=True,
                           timeout=30)
        T.check(p.returncode == 2 and ("--" + flag) in p.stderr,
                "bad %s refused, naming the flag" % flag, p.stderr)

    # 6. An API key: OPENAI_API_KEY goes out as "Authorization: Bearer" (as vLLM's client
    # sends it); without it every request is a counted 401. The daemons' KVF_* variables
    # (a shell that launched the pool) are not read: KVF_PORT / KVF_MODEL mean other things.
    with open(os.path.join(tmp, "key"), "w") as f:
        f.write("s3cret\n")
    _, kx = T.start_proxy(procs, a.fakebin, P(0), P(2),
                          ["--model-name", "m", "--health-interval", "100ms",
                           "--api-key-file", os.path.join(tmp, "key")], name="proxy-key")
    wait_for(lambda: all(i["healthy"] for r in ("prefill", "decode")
                         for i in kx.health()[1][r]), 10, "the keyed proxy's instances healthy")
    noise = {"KVF_PORT": "not-a-port", "KVF_MODEL": "/models/elsewhere", "KVF_NUM_PROMPTS": "x"}
    p = subprocess.run([kvf, "bench-serve", "--url", kx.url, "--num-prompts", "3", "--model",
                        "m", "--csv", os.path.join(tmp, "nokey.csv")], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, **dict(noise,
                                                                          OPENAI_API_KEY="")))
    T.check(p.returncode == 1 and "HTTP 401" in p.stderr and "ready check" in p.stderr and
            not os.path.exists(os.path.join(tmp, "nokey.csv")),
            "no key: the ready check stops before the run with the server's 401", p.stderr)
    js, _ = bench(kvf, kx.url, ["--num-requests", "3"], tmp, "key",
                  env=dict(noise, OPENAI_API_KEY="s3cret"))
    T.check(js["completed"] == 3 and js["failed"] == 0 and js["sent"] == 3,
            "OPENAI_API_KEY: 3 requests answered (model from GET /v1/models, which needs "
            "the key too); KVF_PORT, KVF_MODEL and KVF_NUM_PROMPTS ignored", js)
    p = subprocess.run([kvf, "bench-serve", "--help"], capture_output=True, text=True,
                       timeout=30)
    T.check(p.returncode == 0 and "--num-prompts" in p.stdout and "env KVF_" not in p.stdout,
            "--help lists no KVF_* variable (none is read)", p.stdout[:300])
    p = subprocess.run([kvf, "bench-serve", "--print-config", "--port", "9"],
                       capture_output=True, text=True, timeout=30)
    T.check(p.returncode == 0 and "--port=9" in p.stdout and "KVF_" not in p.stdout,
            "--print-config shows flags (--port=9), no KVF_* variable", p.stdout[:300])


if __name__ == "__main__":
    main()
