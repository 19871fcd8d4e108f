"""A real Prometheus server (Debian's `prometheus` package) scraping a test's pool.

The dashboards' and alert rules' PromQL is evaluated by Prometheus itself, over
samples it scraped from the live /metrics endpoints: no PromQL of our own.
PromServer starts `prometheus` on a free loopback port with a one-second scrape
interval, the given targets (with the labels a Kubernetes ServiceMonitor would
add) and, optionally, rule files; query() asks its HTTP API. A test importing
this module without the package exits 77 (skipped, never passed); tests/run.sh
installs it (deploy/install-deps.sh --tests).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
if PROMETHEUS is None or PROMTOOL is None:
    print("skipped: Prometheus is not installed (Debian package prometheus)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "e2e"))
from kvf_e2e import free_port_range, wait_for  # noqa: E402

# Grafana's interval variables, as Grafana would expand them for a 1 s scrape interval
# over a short test run ($__rate_interval is at least four scrape intervals).
GRAFANA_INTERVALS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}


def expand(expr, variables):
    """@expr with Grafana's $name / ${name} variables replaced (longest names first)."""
    allv = dict(GRAFANA_INTERVALS, **variables)
    for name in sorted(allv, key=len, reverse=True):
        expr = expr.replace("${%s}" % name, allv[name]).replace("$" + name, allv[name])
    return expr


class PromServer:
    """prometheus scraping @targets ("host:port" of /metrics endpoints), each target with
    @labels added as a ServiceMonitor would; @rule_files are loaded and evaluated every
    second. Use as a context manager; the server and its data folder go at exit."""

    def __init__(self, targets, labels=None, rule_files=(), job="kvferry"):
        self.dir = tempfile.mkdtemp(prefix="kvf-prom.")
        self.port = free_port_range(1, lo=30000)
        self.url = "http://127.0.0.1:%d" % self.port
        cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [os.path.abspath(f) for f in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [
                {"targets": list(targets), "labels": dict(labels or {})}]}],
        }
        with open(os.path.join(self.dir, "prometheus.yml"), "w") as f:
            json.dump(cfg, f)   # YAML is a superset of JSON
        self.log = open(os.path.join(self.dir, "prometheus.log"), "w")
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + os.path.join(self.dir, "prometheus.yml"),
             "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
             "--web.listen-address=127.0.0.1:%d" % self.port, "--web.enable-lifecycle"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_for(self._ready, 30, "prometheus ready")
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _ready(self):
        if self.proc.poll() is not None:
            with open(os.path.join(self.dir, "prometheus.log")) as f:
                raise RuntimeError("prometheus exited %d: %s" % (self.proc.returncode,
                                                                 f.read()[-2000:]))
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def api(self, path, **params):
        url = "%s/api/v1/%s?%s" % (self.url, path, urllib.parse.urlencode(params))
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise ValueError("%s: %s" % (params, body.get("error", body)))
        return body["data"]

    def query(self, expr):
        """Prometheus's answer to an instant query now: [(labels dict, float value)] for a
        vector, [({}, value)] for a scalar. A query Prometheus refuses raises ValueError."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def grafana_query(self, expr):
        """A Grafana query as Grafana's Prometheus data source runs it: a template variable's
        label_values(series, label) through /api/v1/label/<label>/values (as
        [({label: value}, 1.0)]), anything else as an instant query."""
        m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*", expr)
        if m is None:
            return self.query(expr)
        values = self.api("label/%s/values" % m.group(2), **{"match[]": m.group(1)})
        return [({m.group(2): v}, 1.0) for v in values]

    def scrapes(self):
        """How many successful scrapes of every target Prometheus has stored (the fewest)."""
        r = self.query("count_over_time(up[10m]) and on() (min(up) == 1)")
        return int(min(v for _, v in r)) if r else 0

    def wait_scrapes(self, n, timeout=30):
        """Wait until every target has been scraped @n more times than now."""
        start = self.scrapes()
        wait_for(lambda: self.scrapes() >= start + n, timeout,
                 "%d more prometheus scrapes" % n, interval=0.2)

    def rules(self):
        """The loaded rule groups' rules: [(group, rule dict from /api/v1/rules)]."""
        return [(g["name"], r) for g in self.api("rules")["groups"] for r in g["rules"]]


def promtool(*args):
    """promtool's exit code and output."""
    p = subprocess.run([PROMTOOL] + list(args), capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr

