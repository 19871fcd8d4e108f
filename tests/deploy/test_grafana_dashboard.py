"""deploy/grafana/kvferry.json charts only series kvferry exports.

A prefill and a decode fake daemon behind the real kvf-proxy (--model-name
tiny) serve one completion; the proxy's /metrics is parsed into the set of
sample names it exports (histograms with _bucket, _sum, _count). Then:

1. The dashboard is valid JSON with unique panel ids, every panel's
   datasource the $datasource variable, and at least one query per panel.
2. Every query (panel targets and template variables) names kvf_ or vllm:
   series only, and every name in it is one /metrics exports; a planted
   misspelt name is caught by the same check. Every panel query, evaluated
   by a real Prometheus (tests/deploy/prom_server.py) that scraped the proxy
   before and after the completion, answers with at least one series, and
   Prometheus accepts every query (the template variables included).
3. The vLLM-equivalent series (kvf_num_requests_running/_waiting,
   kvf_kv_cache_usage_perc, kvf_kv_failed_transfers_total,
   kvf_kv_transfer_bytes) are exported with model_name="tiny" and real
   values (one transfer of 5 prompt tokens x 1000 bytes from the fake), and
   the dashboard charts vLLM's names (vllm:time_to_first_token_seconds, ...),
   each filtered by $model_name.

Rerun:
  python3 tests/deploy/test_grafana_dashboard.py --fakebin build/tests/fakebin \
      --testbin build/tests/bin
"""

import json
import os
import re
import tempfile
import urllib.request

import proxy_testlib as T
from kvf_e2e import Metrics, free_port_range, repo_root, wait_for
from prom_server import PromServer, expand

DASH = os.path.join(repo_root(), "deploy", "grafana", "kvferry.json")
VLLM_CHARTED = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                "vllm:e2e_request_latency_seconds", "vllm:prompt_tokens_total",
                "vllm:generation_tokens_total", "vllm:request_success_total",
                "vllm:num_requests_running", "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc", "vllm:nixl_bytes_transferred",
                "vllm:nixl_xfer_time_seconds", "vllm:nixl_num_failed_transfers_total"]


def exported(text):
    """Sample names in a Prometheus text exposition."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def queries(dash):
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append(("variable " + v["name"], q))
    return out


def series_in(expr):
    """(kvf_ and vllm: metric names, other names with a colon) a PromQL expression reads
    (label values in quotes and label names in braces ignored)."""
    bare = re.sub(r'\{[^}]*\}', '', re.sub(r'"[^"]*"', '""', expr))
    bare = re.sub(r'(label_values\([^,()]*),[^)]*\)', r'\1)', bare)   # its label name
    ours = set(re.findall(r"(?<![a-zA-Z0-9_:])((?:kvf_|vllm:)[a-zA-Z0-9_:]+)", bare))
    foreign = set(re.findall(r"(?<![a-zA-Z0-9_:])([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+)",
                             bare)) - ours
    return ours, foreign


def check_queries(dash, names):
    bad = []
    for where, expr in queries(dash):
        kvf, foreign = series_in(expr)
        if not kvf:
            bad.append("%s: %r reads no kvf_ or vllm: series" % (where, expr))
        if foreign:
            bad.append("%s: %r reads series kvferry does not export: %s" % (where, expr,
                                                                            sorted(foreign)))
        for n in sorted(kvf - names):
            bad.append("%s: %r reads %s, which /metrics does not export" % (where, expr, n))
    return bad


def main():
    a = T.args()
    with open(DASH) as f:
        dash = json.load(f)
    ids = [p["id"] for p in dash["panels"]]
    T.check(len(ids) == len(set(ids)) and len(ids) >= 10, "%d panels, unique ids" % len(ids))
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        T.check(p["datasource"]["uid"] == "${datasource}" and p.get("targets"),
                "panel %r: $datasource, %d queries" % (p["title"], len(p.get("targets", []))))

    procs = T.Procs(tempfile.mkdtemp(prefix="kvf-grafana."))
    try:
        base = free_port_range(3)
        T.start_fake(procs, a.testbin, "prefill", "prefill-0", base)
        T.start_fake(procs, a.testbin, "decode", "decode-0", base + 2)
        _, px = T.start_proxy(procs, a.fakebin, "tcp://127.0.0.1:%d" % base,
                              "tcp://127.0.0.1:%d" % (base + 2), extra=["--model-name", "tiny"])
        wait_for(lambda: px.health()[0] == 200, 15, "proxy healthy")
        with PromServer([px.url.split("//", 1)[1]], labels={"namespace": "default"}) as prom:
            prom.wait_scrapes(2)
            r = px.complete("hello", max_tokens=3)
            T.check(r["kv_transfer"]["bytes"] == 5000, "one completion, 5000 KV bytes")
            text = urllib.request.urlopen(px.url + "/metrics", timeout=10).read().decode()
            prom.wait_scrapes(2)
            variables = {"model_name": ".*", "kvf_instance": ".*", "datasource": "prometheus"}
            empty, answered = [], 0
            for w, e in queries(dash):
                try:
                    res = prom.grafana_query(expand(e, variables))
                except ValueError as err:
                    empty.append("%s: %r: Prometheus refused it: %s" % (w, e, err))
                    continue
                if not res:
                    empty.append("%s: %r answers nothing" % (w, e))
                answered += bool(res)
            misspelt = prom.query('sum(vllm:num_request_waiting{model_name=~".*"})')
    finally:
        procs.stop_all()
    names = exported(text)
    m = Metrics(text)

    # 3. the vLLM-equivalent series, with model_name and real values
    T.check(m.value("kvf_kv_transfers_total", model_name="tiny") == 1 and
            m.value("kvf_kv_failed_transfers_total", model_name="tiny") == 0 and
            m.value("kvf_kv_transfer_bytes_count", model_name="tiny") == 1 and
            m.value("kvf_kv_transfer_bytes_sum", model_name="tiny") == 5000 and
            m.value("kvf_kv_transfer_bytes_bucket", model_name="tiny", le="65536") == 1,
            "kvf_kv_transfer_bytes{model_name=\"tiny\"}: one transfer of 5000 bytes, "
            "none failed")
    for role, eid in (("prefill", "prefill-0"), ("decode", "decode-0")):
        for s in ("kvf_num_requests_running", "kvf_num_requests_waiting",
                  "kvf_kv_cache_usage_perc"):
            vs = [v for (n, ls), v in m.samples.items() if n == s and
                  {("model_name", "tiny"), ("role", role), ("engine_id", eid)} <= set(ls)]
            v = vs[0] if len(vs) == 1 else None
            T.check(v is not None and 0 <= v <= (1 if "perc" in s else 1e9),
                    "%s{model_name=\"tiny\",role=\"%s\"} = %s" % (s, role, v))
    charted = {n for _, e in queries(dash) for n in series_in(e)[0]}
    for s in VLLM_CHARTED:
        hits = [e for _, e in queries(dash) if re.search(r"%s(_bucket|_sum|_count)?\{" % s, e)]
        T.check(hits and all('model_name=~"$model_name"' in e for e in hits),
                "%s is charted, filtered by $model_name" % s)
    T.check(not empty, "every panel query answers with at least one series in a real "
            "Prometheus (%d of %d queries answered)" % (answered, len(queries(dash))),
            "\n".join(empty))
    T.check(misspelt == [], "a misspelt series answers nothing in Prometheus (the check can "
            "fail)", misspelt)

    # 2. every query reads exported series only; a planted typo is caught
    bad = check_queries(dash, names)
    T.check(not bad, "every one of the %d queries reads series /metrics exports (%d distinct)"
            % (len(queries(dash)), len(charted)), "\n".join(bad))
    planted = json.loads(json.dumps(dash))
    planted["panels"][1]["targets"][0]["expr"] = "rate(kvf_proxy_request_total[5m])"
    T.check(check_queries(planted, names), "a misspelt series in a query is reported")
    planted["panels"][1]["targets"][0]["expr"] = "vllm:num_request_waiting"
    T.check(check_queries(planted, names), "a misspelt vLLM series name in a query is reported")
    planted["panels"][1]["targets"][0]["expr"] = "sglang:num_queue_reqs"
    T.check(check_queries(planted, names), "another server's series in a query is reported")
    print("grafana: %d panels, %d queries over %d distinct series, all exported by /metrics "
          "(%d sample names)" % (len(ids), len(queries(dash)), len(charted), len(names)))


if __name__ == "__main__":
    main()
