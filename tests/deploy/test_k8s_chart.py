#!/usr/bin/env python3
"""deploy/helm/kvferry rendered for several sets of values and every manifest
checked, without Helm or a cluster.

The chart is rendered and linted by Helm's own engine (PyPI helm-python-sdk,
tests/deploy/helm_chart.py): `helm lint --strict` finds no error or warning
for any set of values, and every manifest is what `helm template` renders.

For each of four sets of values (the defaults: CUDA image, GPUs, keys, a
PVC made by the chart; a CPU lab pool: no GPUs, --insecure, an existing
claim, resources; RDMA: the RDMA resource, IPC_LOCK, UCX_NET_DEVICES/TLS,
another release name and namespace):

1. every manifest validates strictly against the Kubernetes API schema of
   the oldest and newest version PyPI kubernetes-validate ships;
2. prefill, decode and proxy are separate workloads (two StatefulSets behind
   headless Services, a Deployment behind a Service); every container has
   startup, readiness and liveness probes on ports it declares; every pod's
   grace period is above its --drain-timeout; every pod mounts the model
   volume, whose claim the chart defines (or is the existing one named);
3. GPUs (one per TP rank), --device gpu.device and the CUDA image exactly when
   gpu.enabled; the RDMA resource, IPC_LOCK and UCX_NET_DEVICES exactly when rdma.enabled;
   keys from the Secret (mounted, --keys) unless keys.insecure;
4. discovery: the proxy reads every ordinal up to maxReplicas by its stable
   name pod.service on the daemons' control port from a ConfigMap file (no
   255-character option: 8 prefill and 12 decode pods render), the Services
   publish not ready pods, and scaling either StatefulSet (replicas within
   maxReplicas) renders the proxy's Deployment byte for byte the same;
   every daemon serves --metrics-port, its probes GET /health there (or the
   probes the values give), the proxy Service's port is service-port;
   podAnnotations, runtimeClassName, priorityClassName, nodeSelector,
   tolerations and affinity reach every workload; the API key comes from a
   Secret (KVF_API_KEY), TLS from a Secret (--tls-cert, HTTPS probes); PDBs,
   the Ingress and Gateway HTTPRoute, ServiceMonitors (honorLabels) and the
   HPAs or KEDA ScaledObjects on vllm:num_requests_waiting when enabled;
5. every flag a pod passes is one the built program lists in --help.

Also: values the chart refuses (a list too long for the proxy's option, no
claim) fail rendering with the reason, and deploy/Dockerfile.cuda has a CUDA
build and runtime stage and copies every program the chart runs.
Without kubernetes-validate the test reports skipped (77).
"""

import copy
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_k8s_manifests as M  # noqa: E402  (exits 77 without kubernetes-validate)
from helm_chart import TemplateError, lint_chart, merged_values, render_chart  # noqa: E402

CHART = os.path.join(M.ROOT, "deploy", "helm", "kvferry")
DOCKERFILE_CUDA = os.path.join(M.ROOT, "deploy", "Dockerfile.cuda")

VALUE_SETS = {
    "defaults": ({}, "kvferry", "default"),
    "cpu-lab": ({
        "gpu": {"enabled": False},
        "keys": {"insecure": True},
        "model": {"name": "tiny", "path": "/models/tiny",
                  "volume": {"create": False, "existingClaim": "models-ro"}},
        "prefill": {"replicas": 2, "maxReplicas": 2, "tp": 1,
                    "resources": {"requests": {"cpu": "2", "memory": "4Gi"},
                                  "limits": {"memory": "8Gi"}},
                    "nodeSelector": {"kvferry/pool": "lab"}},
        "decode": {"replicas": 1, "maxReplicas": 3, "tp": 1, "drainTimeoutSeconds": 60},
        "proxy": {"resources": {"requests": {"cpu": "1"}}, "extraArgs": ["--max-prompt-tokens=4096"]},
        "env": [{"name": "UCX_TLS", "value": "tcp,self"}],
    }, "lab", "kvf-lab"),
    "rdma": ({
        "rdma": {"enabled": True, "ucxTls": "rc,cuda_copy,cuda_ipc",
                 "ucxNetDevices": "mlx5_1:1", "resource": "rdma/hca", "count": 2},
        "prefill": {"maxReplicas": 5, "tp": 8,
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}]},
        "decode": {"replicas": 4, "maxReplicas": 5, "extraArgs": ["--max-batch-tokens=1024"]},
        "image": {"pullSecrets": [{"name": "regcred"}]},
        "model": {"volume": {"storageClassName": "fast-rwx", "size": "500Gi"}},
        "proxy": {"service": {"type": "LoadBalancer"}, "replicas": 2},
    }, "kv", "serving"),
    # 8 prefill and 12 decode pods, every operating value on
    "scale-out": ({
        "prefill": {"replicas": 8, "maxReplicas": 8,
                    "probes": {"liveness": {"httpGet": {"path": "/health", "port": "metrics"},
                                            "periodSeconds": 30, "failureThreshold": 4}}},
        "decode": {"replicas": 12, "maxReplicas": 12},
        "proxy": {"apiKey": {"secretName": "llm-api-key"}, "tls": {"secretName": "llm-tls"},
                  "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                      {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                        "labelSelector": {"matchLabels": {
                                                            "app.kubernetes.io/component": "proxy"}}}}]}}},
        "podAnnotations": {"example.com/team": "llm"},
        "runtimeClassName": "nvidia",
        "priorityClassName": "serving-high",
        "ingress": {"enabled": True, "className": "nginx", "host": "llm.example.com",
                    "tls": [{"hosts": ["llm.example.com"], "secretName": "llm-tls"}]},
        "gateway": {"enabled": True, "parentRefs": [{"name": "public", "namespace": "gw"}],
                    "hostnames": ["llm.example.com"]},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"},
                                       "scrapeDaemons": True},
                    "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}}},
        "autoscaling": {"hpa": {"enabled": True}},
    }, "big", "serving"),
}

# Kinds of custom resources (their CRDs are not in the Kubernetes schema): checked by
# structure below instead of by kubernetes-validate.
CRDS = {"ServiceMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1",
        "HTTPRoute": "gateway.networking.k8s.io/v1",
        "ScaledObject": "keda.sh/v1alpha1"}


# ---------------------------------------------------------------- the renderer itself

# ---------------------------------------------------------------- the chart

def by_kind(docs, kind):
    return {d["metadata"]["name"]: d for _, d in docs if d["kind"] == kind}


def pod_containers(w):
    return w["spec"]["template"]["spec"]["containers"]


def merged(overrides):
    return merged_values(CHART, overrides)


def arg_flags(c):
    return M.flag_values(M.container_argv(c))


def seconds(v):
    m = re.fullmatch(r"(\d+)s", v)
    assert m, "a --drain-timeout in seconds, got %r" % v
    return int(m.group(1))


def check_set(label, overrides, release, ns, schema_versions):
    import kubernetes_validate as kv
    findings = lint_chart(CHART, overrides)
    assert not findings, "%s: helm lint --strict: %s" % (label, findings)
    docs = render_chart(CHART, overrides, release=release, namespace=ns)
    v = merged(overrides)
    for fn, d in docs:
        if d["kind"] in CRDS:
            assert d["apiVersion"] == CRDS[d["kind"]], (label, fn, d["apiVersion"])
            continue
        for ver in schema_versions:
            try:
                kv.validate(d, ver, strict=True)
            except kv.ValidationError as e:
                raise AssertionError("%s: %s %s (%s) invalid for Kubernetes %s: %s" % (
                    label, fn, d["kind"], d["metadata"]["name"], ver, e))
    sts, deps = by_kind(docs, "StatefulSet"), by_kind(docs, "Deployment")
    for w in list(sts.values())[:1]:   # the check can fail: planted errors are refused
        for path, bad in ((("spec", "replicas"), "two"),
                          (("spec", "template", "spec", "terminationGracePeriodSecond"), 1)):
            planted = copy.deepcopy(w)
            node = planted
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = bad
            try:
                kv.validate(planted, schema_versions[-1], strict=True)
            except kv.ValidationError:
                continue
            raise AssertionError("%s: a planted %s=%r passed validation" % (label, path, bad))
    svcs, pvcs = by_kind(docs, "Service"), by_kind(docs, "PersistentVolumeClaim")
    names = {"prefill": release + "-prefill", "decode": release + "-decode",
             "proxy": release + "-proxy"}
    assert sorted(sts) == sorted([names["prefill"], names["decode"]]) and \
        list(deps) == [names["proxy"]], (label, list(sts), list(deps))
    workloads = {"prefill": sts[names["prefill"]], "decode": sts[names["decode"]],
                 "proxy": deps[names["proxy"]]}
    claim = "%s-models" % release if v["model"]["volume"]["create"] else \
        v["model"]["volume"]["existingClaim"]
    assert (claim in pvcs) == v["model"]["volume"]["create"], (label, list(pvcs))
    n_flags = 0
    for role, w in workloads.items():
        spec = w["spec"]["template"]["spec"]
        (c,) = pod_containers(w)
        ports = {p["name"] for p in c["ports"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = c.get(probe)
            assert p, "%s: %s has no %s" % (label, role, probe)
            port = (p.get("tcpSocket") or p.get("httpGet"))["port"]
            assert port in ports, (label, role, probe, port, ports)
        f = arg_flags(c)
        drain = seconds(f["drain-timeout"])
        assert spec["terminationGracePeriodSeconds"] > drain, \
            "%s: %s grace %d not above its drain %d s" % (label, role,
                                                          spec["terminationGracePeriodSeconds"], drain)
        vols = {x["name"]: x for x in spec["volumes"]}
        assert vols["models"]["persistentVolumeClaim"]["claimName"] == claim, (label, role)
        assert any(m["name"] == "models" and m["readOnly"] for m in c["volumeMounts"])
        limits = c.get("resources", {}).get("limits", {})
        secctx = c.get("securityContext", {})
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if role != "proxy":
            vr = v[role]
            assert int(f["tp"]) == vr["tp"], (label, role)
            assert w["spec"]["replicas"] == vr["replicas"] <= vr["maxReplicas"]
            img = v["image"]["cuda" if v["gpu"]["enabled"] else "cpu"]
            assert c["image"] == "%s:%s" % (img["repository"], img["tag"]), (label, role, c["image"])
            if v["gpu"]["enabled"]:
                assert limits.get(v["gpu"]["resource"]) == vr["tp"], (label, role, limits)
                assert f.get("device") == v["gpu"]["device"], (label, role, f)
            else:
                assert not any("gpu" in k for k in limits), (label, role, limits)
                assert "device" not in f, (label, role, f)
            rd = v["rdma"]
            if rd["enabled"]:
                assert limits.get(rd["resource"]) == rd["count"], (label, role, limits)
                assert "IPC_LOCK" in secctx.get("capabilities", {}).get("add", []), (label, role)
                assert env.get("UCX_NET_DEVICES") == rd["ucxNetDevices"], (label, role, env)
            else:
                assert not any(k.startswith("rdma/") for k in limits) and \
                    "capabilities" not in secctx and "UCX_NET_DEVICES" not in env, (label, role)
            if rd["ucxTls"]:
                assert env.get("UCX_TLS") == rd["ucxTls"], (label, role, env)
            for e in v["env"]:
                assert env.get(e["name"]) == e["value"], (label, role, e)
            assert vols["shm"]["emptyDir"]["medium"] == "Memory"
            svc = svcs[w["spec"]["serviceName"]]
            assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
            listen = int(f["listen"].rsplit(":", 1)[1])
            assert listen == vr["controlPort"] and listen in [p["port"] for p in svc["spec"]["ports"]]
            assert f["engine-id"] == "$POD_NAME", (label, role, f)
            assert int(f["metrics-port"]) == v["metrics"]["daemonPort"] and \
                f["served-model-name"] == v["model"]["name"], (label, role, f)
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                want = (vr["probes"] or {}).get(probe[:-5])
                got = c[probe]
                assert got == want if want else got["httpGet"] == {"path": "/health",
                                                                    "port": "metrics"}, \
                    (label, role, probe, got)
        else:
            assert c["image"] == "%s:%s" % (v["image"]["cpu"]["repository"],
                                            v["image"]["cpu"]["tag"]), (label, c["image"])
            assert not limits or not any("gpu" in k or "rdma" in k for k in limits)
            assert svcs[names["proxy"]]["spec"]["type"] == v["proxy"]["service"]["type"]
            cm = by_kind(docs, "ConfigMap")[names["proxy"] + "-endpoints"]
            assert any(x["name"] == "endpoints" and x["configMap"]["name"] == cm["metadata"]["name"]
                       for x in spec["volumes"]), (label, spec["volumes"])
            for role2 in ("prefill", "decode"):
                vr = v[role2]
                want = ["tcp://%s-%d.%s:%d" % (names[role2], k, names[role2], vr["controlPort"])
                        for k in range(vr["maxReplicas"])]
                got = cm["data"][role2].split()
                assert got == want, (label, role2, got, want)
                assert f[role2 + "-file"] == "/etc/kvferry/endpoints/" + role2, (label, f)
            env_from = {e["name"]: e.get("valueFrom") for e in c.get("env", [])}
            if v["proxy"]["apiKey"]["secretName"]:
                assert env_from["KVF_API_KEY"]["secretKeyRef"] == {
                    "name": v["proxy"]["apiKey"]["secretName"],
                    "key": v["proxy"]["apiKey"]["secretKey"]}, (label, env_from)
            if v["proxy"]["tls"]["secretName"]:
                assert f["tls-cert"] == "/etc/kvferry/tls/tls.crt" and \
                    vols["tls"]["secret"]["secretName"] == v["proxy"]["tls"]["secretName"] and \
                    c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS", (label, f)
            svc_ports = [p["name"] for p in svcs[names["proxy"]]["spec"]["ports"]]
            assert svc_ports == ["service-port"], (label, svc_ports)
        if v["keys"]["insecure"]:
            assert "insecure" in f and "keys" not in f and "keys" not in vols, (label, role)
        else:
            assert f.get("keys") == "/etc/kvferry/keys", (label, role, f)
            assert vols["keys"]["secret"]["secretName"] == v["keys"]["secretName"]
            assert any(m["name"] == "keys" and m["mountPath"] == "/etc/kvferry/keys"
                       for m in c["volumeMounts"])
        n_flags += check_flags(role, c)
        annotations = w["spec"]["template"]["metadata"].get("annotations", {})
        for k, val in v["podAnnotations"].items():
            assert annotations.get(k) == val, (label, role, annotations)
        assert spec.get("runtimeClassName", "") == v["runtimeClassName"] and \
            spec.get("priorityClassName", "") == v["priorityClassName"], (label, role)
        wants = {"nodeSelector": v[role]["nodeSelector"], "tolerations": v[role]["tolerations"],
                 "affinity": v[role]["affinity"]}
        for k, want in wants.items():
            assert spec.get(k, type(want)()) == want, (label, role, k)
        assert c.get("resources") == (v[role]["resources"] if role == "proxy" else
                                      c.get("resources")), (label, role)
    check_extras(label, docs, v, names)
    # scaling within maxReplicas: the proxy's Deployment does not change
    scaled = copy.deepcopy(overrides)
    for role in ("prefill", "decode"):
        scaled.setdefault(role, {})["replicas"] = v[role]["maxReplicas"]
    docs2 = render_chart(CHART, scaled, release=release, namespace=ns)
    assert json.dumps(by_kind(docs2, "Deployment"), sort_keys=True) == \
        json.dumps(deps, sort_keys=True), "%s: scaling changed the proxy" % label
    assert by_kind(docs2, "StatefulSet")[names["decode"]]["spec"]["replicas"] == \
        v["decode"]["maxReplicas"]
    print("%s: %d manifests (%s) valid (strict) for Kubernetes %s; probes, grace > drain, "
          "model claim %s, GPUs %s, RDMA %s, keys %s; proxy lists %d+%d stable names and is "
          "unchanged when both StatefulSets scale to their maximum; %d flags exist" % (
              label, len(docs), ", ".join(sorted({d["kind"] for _, d in docs})),
              " and ".join(schema_versions), claim, "on" if v["gpu"]["enabled"] else "off",
              "on" if v["rdma"]["enabled"] else "off",
              "insecure" if v["keys"]["insecure"] else "from Secret " + v["keys"]["secretName"],
              v["prefill"]["maxReplicas"], v["decode"]["maxReplicas"], n_flags))
    return docs


def check_extras(label, docs, v, names):
    """The operating objects: PDBs, the route, the ServiceMonitors, the autoscalers."""
    pdbs = by_kind(docs, "PodDisruptionBudget")
    if v["podDisruptionBudget"]["enabled"]:
        assert sorted(pdbs) == sorted(names.values()), (label, list(pdbs))
        for role, n in names.items():
            sel = pdbs[n]["spec"]["selector"]["matchLabels"]
            assert sel["app.kubernetes.io/component"] == role and \
                pdbs[n]["spec"]["maxUnavailable"] == v["podDisruptionBudget"]["maxUnavailable"]
    ing, routes = by_kind(docs, "Ingress"), by_kind(docs, "HTTPRoute")
    assert bool(ing) == v["ingress"]["enabled"] and bool(routes) == v["gateway"]["enabled"]
    for d in ing.values():
        (rule,) = d["spec"]["rules"]
        back = rule["http"]["paths"][0]["backend"]["service"]
        assert back == {"name": names["proxy"], "port": {"name": "service-port"}} and \
            rule.get("host", "") == v["ingress"]["host"], (label, rule)
    for d in routes.values():
        assert d["spec"]["parentRefs"] == v["gateway"]["parentRefs"] and \
            d["spec"]["rules"][0]["backendRefs"] == [{"name": names["proxy"],
                                                     "port": v["proxy"]["port"]}], (label, d)
    sm, sm_v = by_kind(docs, "ServiceMonitor"), v["metrics"]["serviceMonitor"]
    want_sm = ([names["proxy"]] + ([names["prefill"], names["decode"]]
                                   if sm_v["scrapeDaemons"] else [])) if sm_v["enabled"] else []
    assert sorted(sm) == sorted(want_sm), (label, list(sm))
    for n, d in sm.items():
        (ep,) = d["spec"]["endpoints"]
        assert ep["honorLabels"] is True and ep["port"] == ("service-port" if n == names["proxy"]
                                                            else "metrics"), (label, ep)
        for k, val in sm_v["labels"].items():
            assert d["metadata"]["labels"][k] == val
    # the PrometheusRule carries files/kvferry-alerts.yaml's groups as they are
    rules, pr_v = by_kind(docs, "PrometheusRule"), v["metrics"]["prometheusRule"]
    assert bool(rules) == pr_v["enabled"], (label, list(rules))
    for d in rules.values():
        import yaml
        with open(os.path.join(CHART, "files", "kvferry-alerts.yaml")) as f:
            assert d["spec"] == yaml.safe_load(f), (label, d["spec"])
        for k, val in pr_v["labels"].items():
            assert d["metadata"]["labels"][k] == val
    hpas, keda = by_kind(docs, "HorizontalPodAutoscaler"), by_kind(docs, "ScaledObject")
    a = v["autoscaling"]
    assert bool(hpas) == a["hpa"]["enabled"] and bool(keda) == a["keda"]["enabled"]
    for role in ("prefill", "decode"):
        for d in list(hpas.values()) + list(keda.values()):
            if d["metadata"]["name"] != names[role]:
                continue
            spec = d["spec"]
            assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                              "name": names[role]}, (label, spec)
            lo, hi = (spec["minReplicas"], spec["maxReplicas"]) if d["kind"] != "ScaledObject" \
                else (spec["minReplicaCount"], spec["maxReplicaCount"])
            assert (lo, hi) == (v[role]["replicas"], v[role]["maxReplicas"]), (label, lo, hi)
            if d["kind"] == "HorizontalPodAutoscaler":
                assert spec["metrics"][0]["pods"]["metric"]["name"] == \
                    "vllm:num_requests_waiting", (label, spec)
            else:
                q = spec["triggers"][0]["metadata"]["query"]
                assert "vllm:num_requests_waiting" in q and v["model"]["name"] in q, q


_HELP = {}


def check_flags(role, c):
    argv = M.container_argv(c)
    prog = argv[0]
    assert prog == "kvf-" + role, (role, argv)
    if prog not in _HELP:
        import subprocess
        _HELP[prog] = subprocess.run([os.path.join(M.BIN, prog), "--help"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, timeout=30).stdout
    known = set(re.findall(r"^\s+--([a-z0-9-]+)", _HELP[prog], re.M))
    assert known, _HELP[prog]
    flags = M.flag_values(argv)
    for flag in flags:
        assert flag in known, "%s: %s has no flag --%s" % (role, prog, flag)
    return len(flags)


def check_refused():
    for over, why in (({"decode": {"maxReplicas": 65}}, "at most 64"),
                      ({"autoscaling": {"hpa": {"enabled": True}, "keda": {"enabled": True}}},
                       "not both"),
                      ({"gateway": {"enabled": True}}, "gateway.parentRefs"),
                      ({"model": {"volume": {"create": False}}}, "existingClaim is needed")):
        try:
            render_chart(CHART, over)
        except TemplateError as e:
            assert why in str(e), (over, str(e))
            continue
        raise AssertionError("the chart rendered %r" % (over,))
    print("refused: more than 64 instances of a role, HPA and KEDA at once, a Gateway route "
          "without a parent, a missing model claim")


def check_dockerfile_cuda(docs):
    with open(DOCKERFILE_CUDA) as f:
        text = f.read()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) == 2, "expected a build and a runtime stage"
    assert re.match(r"nvidia/cuda:[\d.]+-devel-", stages[0]), stages[0].splitlines()[0]
    assert re.match(r"nvidia/cuda:[\d.]+-runtime-", stages[1]), stages[1].splitlines()[0]
    assert "-DKVF_CUDA=ON" in stages[0], "the build stage must require CUDA"
    assert "--with-cuda" in stages[0], "UCX must be built with CUDA support"
    progs = {M.container_argv(c)[0] for _, d in docs if d["kind"] in ("StatefulSet", "Deployment")
             for c in pod_containers(d)}
    for p in progs:
        assert re.search(r"/build/bin/%s\b" % re.escape(p), stages[0]), \
            "Dockerfile.cuda does not copy %s" % p
    v = merged({})
    assert "-t %s:" % v["image"]["cuda"]["repository"] in text, \
        "Dockerfile.cuda does not say how to build %s" % v["image"]["cuda"]["repository"]
    print("Dockerfile.cuda: CUDA devel build stage (UCX with CUDA, -DKVF_CUDA=ON), CUDA runtime "
          "stage, copies %s" % ", ".join(sorted(progs)))


def main():
    from kubernetes_validate import utils as kvu
    versions = sorted(kvu.all_versions(), key=lambda x: tuple(int(p) for p in x.split(".")))
    picked = [versions[0], versions[-1]]
    docs = None
    for label, (over, release, ns) in VALUE_SETS.items():
        d = check_set(label, over, release, ns, picked)
        docs = docs or d
    check_refused()
    check_dockerfile_cuda(docs)
    print("test_k8s_chart passed")


if __name__ == "__main__":
    main()
