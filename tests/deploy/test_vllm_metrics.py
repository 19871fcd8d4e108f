"""vLLM's series from a real 1p1d pool: names, labels, buckets, values, and the
queries of vLLM production-stack's dashboards evaluated against two scrapes.

A tiny model (kvf mkmodel) served by kvf-up 1p1d behind kvf-proxy
--model-name tiny; both daemons with --metrics-port and --served-model-name
tiny. Checks:

1. Each daemon's HTTP port: GET /health 200 {"status":"ok"}; GET /metrics
   has vllm:num_requests_running/_waiting and vllm:kv_cache_usage_perc with
   model_name="tiny" and engine=<its engine id>; a POST is refused (405).
2. The proxy's /metrics, scraped before and after 4 completions (one
   streamed), has every vLLM series listed below with labels model_name and
   engine, the bucket boundaries vLLM declares (vllm/v1/metrics/loggers.py
   and its NIXL connector metrics), and values that add up:
   request_success_total{finished_reason="length"} +4, prompt and generation
   token counters equal to the usage the proxy returned, TTFT and e2e counts
   +4, a KV transfer per request with its bytes. No exported label is named
   "instance" (neither the proxy's nor a daemon's).
3. Every query of production-stack's vLLM dashboards (written below as data)
   evaluated by a real Prometheus (tests/deploy/prom_server.py) that scraped
   the proxy during the run, with the target labels a ServiceMonitor adds,
   returns at least one series, every value finite; a misspelt series returns
   none (the check can fail).

Rerun:
  python3 tests/deploy/test_vllm_metrics.py --fakebin build/tests/fakebin \
      --testbin build/tests/bin
"""

import atexit
import json
import math
import os
import re
import subprocess
import tempfile
import urllib.error
import urllib.request

import proxy_testlib as T
from kvf_e2e import Pool, free_port_range, parse_metrics, wait_for
from prom_server import PromServer, expand

# vLLM's bucket boundaries (facts from vllm/v1/metrics/loggers.py and the NIXL
# connector's Prometheus metrics), by series.
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0]
REQ = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
       240.0, 480.0, 960.0, 1920.0, 7680.0]
XFER = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
BYTES = [2.0 ** (10 + i) for i in range(1, 25, 2)]
DESCS = [10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000]


def one_two_five(top):
    out, e = [], 0
    while True:
        for m in (1, 2, 5):
            if m * 10 ** e > top:
                return [float(x) for x in out]
            out.append(m * 10 ** e)
        e += 1


HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": TTFT,
    "vllm:inter_token_latency_seconds": TPOT,
    "vllm:time_per_output_token_seconds": TPOT,
    "vllm:request_time_per_output_token_seconds": TPOT,
    "vllm:e2e_request_latency_seconds": REQ,
    "vllm:request_queue_time_seconds": REQ,
    "vllm:request_inference_time_seconds": REQ,
    "vllm:request_prefill_time_seconds": REQ,
    "vllm:request_decode_time_seconds": REQ,
    "vllm:request_params_n": [1, 2, 5, 10, 20],
    "vllm:nixl_xfer_time_seconds": XFER,
    "vllm:nixl_post_time_seconds": [0.001] + XFER,
    "vllm:nixl_bytes_transferred": BYTES,
    "vllm:nixl_num_descriptors": DESCS,
    # 1-2-5 up to max_model_len: filled in once the model's length is known
    "vllm:request_prompt_tokens": None,
    "vllm:request_generation_tokens": None,
    "vllm:request_max_num_generation_tokens": None,
    "vllm:request_params_max_tokens": None,
}
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
          "vllm:gpu_cache_usage_perc", "vllm:num_requests_swapped"]
COUNTERS = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total",
            "vllm:request_success_total", "vllm:nixl_num_failed_transfers_total",
            "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
            "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"]

# The queries of vLLM production-stack's Grafana dashboards (helm/dashboards/
# vllm-dashboard.json, also in its earlier revision, and vllm-model-metrics-dashboard.json),
# written out here as data. $model_name is the dashboards' template variable.
PRODUCTION_STACK_QUERIES = [
    'sum(max by (server) (vllm:healthy_pods_total))',
    'avg(vllm:e2e_request_latency_seconds_sum) / avg(vllm:e2e_request_latency_seconds_count)',
    'sum by(le) (vllm:e2e_request_latency_seconds_bucket)',
    'vllm:current_qps',
    'avg(vllm:time_per_output_token_seconds_sum) / '
    'avg(vllm:time_per_output_token_seconds_count)',
    'avg(vllm:request_time_per_output_token_seconds_sum) / '
    'avg(vllm:request_time_per_output_token_seconds_count)',
    'sum by(le) (vllm:time_to_first_token_seconds_bucket)',
    'vllm:num_requests_running',
    'vllm:num_requests_waiting',
    'vllm:gpu_cache_usage_perc',
    'vllm:kv_cache_usage_perc',
    'vllm:gpu_prefix_cache_hits_total{endpoint="service-port"} / '
    'vllm:gpu_prefix_cache_queries_total',
    'vllm:num_requests_swapped',
    'router_cpu_usage_percent',
    'router_memory_usage_percent',
    'router_disk_usage_percent',
] + [
    'histogram_quantile(%s, sum by(le) (rate(vllm:%s_bucket{model_name="$model_name"}'
    '[$__rate_interval])))' % (q, s)
    for q in ("0.5", "0.9", "0.95", "0.99")
    for s in ("e2e_request_latency_seconds", "request_time_per_output_token_seconds",
              "time_to_first_token_seconds")
] + [
    'rate(vllm:%s_sum{model_name="$model_name"}[$__rate_interval])\n/\n'
    'rate(vllm:%s_count{model_name="$model_name"}[$__rate_interval])' % (s, s)
    for s in ("e2e_request_latency_seconds", "request_time_per_output_token_seconds",
              "time_to_first_token_seconds")
] + [
    'rate(vllm:generation_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:prompt_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:request_decode_time_seconds_sum{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:request_max_num_generation_tokens_sum{model_name="$model_name"}'
    '[$__rate_interval])',
    'rate(vllm:request_prefill_time_seconds_sum{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:request_queue_time_seconds_sum{model_name="$model_name"}[$__rate_interval])',
    'sum by(finished_reason) (increase(vllm:request_success_total{model_name="$model_name"}'
    '[$__rate_interval]))',
    'sum by(le) (increase(vllm:request_generation_tokens_bucket{model_name="$model_name"}'
    '[$__rate_interval]))',
    'sum by(le) (increase(vllm:request_prompt_tokens_bucket{model_name="$model_name"}'
    '[$__rate_interval]))',
    'vllm:kv_cache_usage_perc{model_name="$model_name"}',
    'vllm:num_requests_running{model_name="$model_name"}',
    'vllm:num_requests_waiting{model_name="$model_name"}',
]

# What a ServiceMonitor on the chart's proxy Service adds to every sample (the port's name
# is "service-port": deploy/helm/kvferry/templates, checked by test_k8s_manifests).
TARGET_LABELS = {"job": "kvferry-proxy", "namespace": "default", "endpoint": "service-port"}


def get(url, method="GET"):
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def labels_of(text):
    """Every label name in a Prometheus text exposition."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" in line:
            names |= set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', line.split("}")[0]))
    return names


def check_daemon(port, engine):
    st, body = get("http://127.0.0.1:%d/health" % port)
    T.check(st == 200 and json.loads(body)["status"] == "ok" and
            json.loads(body)["engine_id"] == engine, "%s /health: 200 ok" % engine, body)
    st, text = get("http://127.0.0.1:%d/metrics" % port)
    s = parse_metrics(text)
    for g in ("vllm:num_requests_running", "vllm:num_requests_waiting",
              "vllm:kv_cache_usage_perc"):
        v = s.get((g, frozenset({("model_name", "tiny"), ("engine", engine)})))
        T.check(st == 200 and v is not None and 0 <= v <= (1 if "perc" in g else 1e6),
                '%s /metrics: %s{model_name="tiny",engine="%s"} = %s' % (engine, g, engine, v))
    T.check("instance" not in labels_of(text), "%s /metrics: no label named instance" % engine)
    st, _ = get("http://127.0.0.1:%d/metrics" % port, method="POST")
    T.check(st == 405, "%s: POST /metrics refused with 405 (%d)" % (engine, st))


def check_buckets(after, max_model_len):
    for name, bounds in HISTOGRAMS.items():
        if bounds is None:
            bounds = one_two_five(max_model_len)
        les = sorted(float(dict(ls)["le"]) for (n, ls) in after
                     if n == name + "_bucket" and dict(ls).get("engine") == "pool")
        T.check(les == [float(b) for b in bounds] + [math.inf] and
                (name + "_sum", frozenset({("model_name", "tiny"), ("engine", "pool")}))
                in after, "%s: vLLM's %d buckets, labels model_name and engine" %
                (name, len(bounds)), "le=%s" % les)
    for name in GAUGES + COUNTERS:
        keys = [dict(ls) for (n, ls) in after if n == name]
        T.check(keys and all(k.get("model_name") == "tiny" and k.get("engine") for k in keys),
                "%s: exported with model_name and engine" % name)


def main():
    a = T.args()
    bindir = os.environ.get("KVF_BIN") or os.path.join(os.path.dirname(a.fakebin), "..", "bin")
    kvf = os.path.join(bindir, "kvf")
    cfg_path = os.path.join(os.environ.get("KVF_SOURCE_DIR", "."), "tests", "data", "models",
                            "tiny-llama.config.json")
    with open(cfg_path) as f:
        max_model_len = json.load(f)["max_position_embeddings"]
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny")
        subprocess.run([kvf, "mkmodel", "--config", cfg_path, "--out", model, "--seed", "3"],
                       check=True, capture_output=True, timeout=60)
        for bad in ("70000", "-1"):
            p = subprocess.run([os.path.join(bindir, "kvf-prefill"), "--model", model,
                                "--insecure", "--metrics-port", bad], capture_output=True,
                               text=True, timeout=30)
            T.check(p.returncode == 2 and "--metrics-port %s" % bad in p.stderr,
                    "kvf-prefill --metrics-port %s refused by name (exit 2)" % bad,
                    p.stderr[-300:])
        mp = free_port_range(2)
        with Pool(layout="1p1d", model=model, model_name="tiny", bin_dir=bindir, timeout=60,
                  prefill_args=["--metrics-port=%d" % mp, "--served-model-name=tiny"],
                  decode_args=["--metrics-port=%d" % (mp + 1),
                               "--served-model-name=tiny"]) as pool:
            wait_for(lambda: pool.health()[0] == 200, 30, "pool healthy")
            check_daemon(mp, "prefill-0")
            check_daemon(mp + 1, "decode-0")
            prom = PromServer([pool.url.split("//", 1)[1]], job=TARGET_LABELS["job"],
                              labels={k: v for k, v in TARGET_LABELS.items() if k != "job"})
            prom.__enter__()
            atexit.register(prom.__exit__, None, None, None)   # also when a check fails
            prom.wait_scrapes(2)
            before_text = get(pool.url + "/metrics")[1]
            prompt_tokens = gen_tokens = 0
            for i in range(3):
                r = pool.complete("The ferry crosses at dawn %d" % i, max_tokens=6,
                                  temperature=0, ignore_eos=True)
                prompt_tokens += r["usage"]["prompt_tokens"]
                gen_tokens += r["usage"]["completion_tokens"]
            s = pool.complete("A streamed one", max_tokens=6, temperature=0, ignore_eos=True,
                              stream=True, stream_options={"include_usage": True})
            T.check(s.done, "streamed completion done")
            usage = s.usage or {}
            T.check(usage.get("completion_tokens") == 6, "the stream's final usage: %s" % usage)
            prompt_tokens += usage.get("prompt_tokens", 0)
            gen_tokens += usage.get("completion_tokens", 0)
            after_text = get(pool.url + "/metrics")[1]
            try:
                # asked while the pool lives: a gone target's series turn stale at once
                prom.wait_scrapes(2)
                answers = {q: prom.query(expand(q, {"model_name": "tiny"}))
                           for q in PRODUCTION_STACK_QUERIES}
                misspelt = prom.query('sum by(le) (vllm:time_to_first_token_second_bucket)')
                p99 = prom.query('histogram_quantile(0.99, sum by(le) (rate('
                                 'vllm:time_to_first_token_seconds_bucket[5m])))')[0][1]
            finally:
                prom.__exit__(None, None, None)
        T.check("instance" not in labels_of(after_text), "proxy /metrics: no label named "
                "instance (kvf_instance instead)")
        before = parse_metrics(before_text)
        after = parse_metrics(after_text)
        check_buckets(after, max_model_len)

        def delta(name, **labels):
            key = (name, frozenset(dict(model_name="tiny", engine="pool", **labels).items()))
            return after.get(key, math.nan) - before.get(key, 0.0)

        T.check(delta("vllm:request_success_total", finished_reason="length") == 4 and
                delta("vllm:request_success_total", finished_reason="abort") == 0,
                "request_success_total{finished_reason=\"length\"} +4, abort +0")
        T.check(delta("vllm:time_to_first_token_seconds_count") == 4 and
                delta("vllm:e2e_request_latency_seconds_count") == 4 and
                delta("vllm:nixl_bytes_transferred_count") == 4 and
                delta("vllm:nixl_bytes_transferred_sum") > 0,
                "TTFT, e2e and KV transfer counts +4, bytes %s" %
                delta("vllm:nixl_bytes_transferred_sum"))
        T.check(delta("vllm:prompt_tokens_total") == prompt_tokens and
                    delta("vllm:generation_tokens_total") == gen_tokens,
            "prompt/generation tokens +%d/+%d as usage said" % (prompt_tokens, gen_tokens))
        T.check(delta("vllm:generation_tokens_total") == 24 and
                delta("vllm:inter_token_latency_seconds_count") == 20,
                "24 generation tokens, 20 gaps between them (%s, %s)" %
                (delta("vllm:generation_tokens_total"),
                 delta("vllm:inter_token_latency_seconds_count")))

        # 3. production-stack's queries, answered by Prometheus from what it scraped
        bad = []
        for q in PRODUCTION_STACK_QUERIES:
            vals = [v for _, v in answers[q]]
            if not vals or not all(math.isfinite(v) for v in vals):
                bad.append("%r -> %s" % (q, vals))
        T.check(not bad, "each of production-stack's %d dashboard queries answers with "
                "finite data in Prometheus" % len(PRODUCTION_STACK_QUERIES), "\n".join(bad))
        T.check(misspelt == [], "a misspelt series answers nothing (the check can fail)")
        print("vllm metrics: %d series checked, %d production-stack queries answered; "
              "TTFT p99 over the run %s s" % (len(HISTOGRAMS) + len(GAUGES) + len(COUNTERS),
                                              len(PRODUCTION_STACK_QUERIES), p99))


if __name__ == "__main__":
    main()
