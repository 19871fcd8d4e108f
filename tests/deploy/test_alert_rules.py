#!/usr/bin/env python3
"""kvferry's alert rules (deploy/helm/kvferry/files/kvferry-alerts.yaml) checked by
Prometheus's own tools and evaluated by a real Prometheus scraping a live proxy.

1. `promtool check rules` accepts the file; `promtool test rules`
   (tests/deploy/kvferry-alerts.test.yaml) shows each alert firing on its
   condition, with its labels and annotations, and not before its `for`.
2. A prefill and a decode fake daemon behind the real kvf-proxy, scraped every
   second by Prometheus with the rules loaded: every rule evaluates without error
   and none is active while the pool is healthy; when the decode daemon is
   stopped, KvferryInstanceUnhealthy goes pending for role="decode" (the rule
   reads series the proxy really exports, with the labels it really gives them).

Rerun:
  python3 tests/deploy/test_alert_rules.py --fakebin build/tests/fakebin \
      --testbin build/tests/bin
"""
import os
import tempfile

import proxy_testlib as T
from kvf_e2e import free_port_range, repo_root, wait_for
from prom_server import PromServer, promtool

RULES = os.path.join(repo_root(), "deploy", "helm", "kvferry", "files", "kvferry-alerts.yaml")
RULE_TESTS = os.path.join(repo_root(), "tests", "deploy", "kvferry-alerts.test.yaml")


def main():
    a = T.args()
    rc, out = promtool("check", "rules", RULES)
    T.check(rc == 0 and "SUCCESS" in out, "promtool check rules: %s" % out.strip().splitlines()[-1],
            out)
    rc, out = promtool("test", "rules", RULE_TESTS)
    T.check(rc == 0 and "SUCCESS" in out, "promtool test rules: every alert fires on its "
            "condition and not before", out)

    procs = T.Procs(tempfile.mkdtemp(prefix="kvf-alerts."))
    try:
        base = free_port_range(3)
        T.start_fake(procs, a.testbin, "prefill", "prefill-0", base)
        dec = T.start_fake(procs, a.testbin, "decode", "decode-0", base + 2)
        _, px = T.start_proxy(procs, a.fakebin, "tcp://127.0.0.1:%d" % base,
                              "tcp://127.0.0.1:%d" % (base + 2), extra=["--model-name", "tiny"])
        wait_for(lambda: px.health()[0] == 200, 15, "proxy healthy")
        with PromServer([px.url.split("//", 1)[1]], rule_files=[RULES]) as prom:
            px.complete("hello", max_tokens=3)
            prom.wait_scrapes(3)
            wait_for(lambda: all(r.get("lastEvaluation", "").startswith("20") and
                                 r["evaluationTime"] > 0 for _, r in prom.rules()), 20,
                     "every rule evaluated", interval=0.2)
            rules = prom.rules()
            names = sorted(r["name"] for _, r in rules)
            T.check(len(rules) == 5 and all(r["health"] == "ok" for _, r in rules),
                    "Prometheus evaluates all %d rules without error: %s" % (len(rules), names),
                    [(r["name"], r["health"], r.get("lastError")) for _, r in rules])
            T.check(all(r["state"] == "inactive" for _, r in rules),
                    "no alert is pending or firing on a healthy pool",
                    [(r["name"], r["state"]) for _, r in rules])
            procs.stop(dec)

            def unhealthy_decode():
                for _, r in prom.rules():
                    if r["name"] == "KvferryInstanceUnhealthy":
                        return [x for x in r["alerts"] if x["labels"].get("role") == "decode"]
                return []
            alerts = wait_for(unhealthy_decode, 30, "KvferryInstanceUnhealthy for the decode",
                              interval=0.25)
            T.check(alerts[0]["state"] in ("pending", "firing") and
                    alerts[0]["labels"]["engine_id"] == "decode-0",
                    "decode stopped: KvferryInstanceUnhealthy %s for %s" %
                    (alerts[0]["state"], alerts[0]["labels"]["kvf_instance"]))
    finally:
        procs.stop_all()
    print("alert rules: promtool check and unit tests pass; a live Prometheus evaluates all "
          "rules and raises the unhealthy-instance alert when a daemon stops")


if __name__ == "__main__":
    main()
