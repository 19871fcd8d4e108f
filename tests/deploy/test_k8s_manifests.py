#!/usr/bin/env python3
"""The Kubernetes examples and the Dockerfile, checked without a cluster.

1. Every manifest in deploy/examples/kubernetes validates, strictly (no
   unknown fields), against the Kubernetes API schema of the oldest and the
   newest version the PyPI package kubernetes-validate ships (tests/run.sh
   installs it); a planted error is refused, so the check can fail.
2. The commands the pods run exist with those flags: each `--flag` is one
   the built program lists in its --help.
3. The pieces agree: the proxy's --prefill/--decode endpoints name the
   StatefulSets' pods (one per replica) through their headless Services on
   the ports the daemons listen on; --tp equals the pod's GPU limit.
4. Every daemon has startup, readiness and liveness probes and a grace
   period above its drain; every claim a pod mounts is defined.
5. deploy/Dockerfile builds the proxy's (CPU) image and deploy/Dockerfile.cuda
   the image of every pod that asks for GPUs; the CPU runtime stage installs
   the Debian package of every shared library the built programs load
   (dpkg -S over ldd), and the build stage copies every program the
   manifests run.

Not run here: a cluster (no kubelet) and docker (no image build). Without
kubernetes-validate the test reports skipped (77).
"""

import copy
import os
import re
import shlex
import subprocess
import sys

ROOT = os.environ.get("KVF_SOURCE_DIR") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("KVF_BIN") or os.path.join(ROOT, "build", "bin")
K8S = os.path.join(ROOT, "deploy", "examples", "kubernetes")
DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")

try:
    import yaml
    import kubernetes_validate as kv
    from kubernetes_validate import utils as kvu
except ImportError as e:
    print("SKIP: the PyPI package kubernetes-validate is not installed (%s); "
          "tests/run.sh installs it" % e)
    sys.exit(77)


def docs():
    out = []
    for fn in sorted(os.listdir(K8S)):
        if fn.endswith(".yaml"):
            with open(os.path.join(K8S, fn)) as f:
                out += [(fn, d) for d in yaml.safe_load_all(f) if d]
    assert len(out) >= 6, out
    return out


def check_schema(all_docs):
    versions = sorted(kvu.all_versions(), key=lambda v: tuple(int(x) for x in v.split(".")))
    picked = [versions[0], versions[-1]]
    for fn, d in all_docs:
        for v in picked:
            kv.validate(d, v, strict=True)
    # a planted error must be refused
    fn, sts = [(f, d) for f, d in all_docs if d["kind"] == "StatefulSet"][0]
    bad = copy.deepcopy(sts)
    bad["spec"]["replicas"] = "two"
    for b in (bad,):
        try:
            kv.validate(b, picked[-1], strict=True)
            raise AssertionError("a StatefulSet with replicas: 'two' passed validation")
        except kv.ValidationError:
            pass
    bad = copy.deepcopy(sts)
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    try:
        kv.validate(bad, picked[-1], strict=True)
        raise AssertionError("a misspelt container field passed strict validation")
    except kv.ValidationError:
        pass
    print("schema: %d resources valid (strict) against Kubernetes %s and %s; planted errors "
          "refused" % (len(all_docs), picked[0], picked[-1]))


def container_argv(c):
    """The program argv a container runs (sh -c 'exec ...' unwrapped)."""
    argv = list(c.get("command", [])) + list(c.get("args", []))
    if argv[:2] == ["/bin/sh", "-c"]:
        argv = shlex.split(argv[2])
        if argv and argv[0] == "exec":
            argv = argv[1:]
    return argv


def workloads(all_docs):
    return {d["metadata"]["name"]: d for _, d in all_docs
            if d["kind"] in ("StatefulSet", "Deployment")}


def flag_values(argv):
    out = {}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
            else:
                k, v = a[2:], argv[i + 1] if i + 1 < len(argv) else ""
                i += 1
            out[k] = v
        i += 1
    return out


def check_flags(all_docs):
    n = 0
    for name, w in workloads(all_docs).items():
        for c in w["spec"]["template"]["spec"]["containers"]:
            argv = container_argv(c)
            prog = argv[0]
            assert prog in ("kvf-prefill", "kvf-decode", "kvf-proxy"), (name, argv)
            helptext = subprocess.run([os.path.join(BIN, prog), "--help"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, timeout=30).stdout
            known = set(re.findall(r"^\s+--([a-z0-9-]+)", helptext, re.M))
            assert known, helptext
            for flag in flag_values(argv):
                assert flag in known, "%s: %s has no flag --%s (known: %s)" % (
                    name, prog, flag, sorted(known))
                n += 1
    print("flags: the %d flags the pods pass are flags of the built programs" % n)


def check_wiring(all_docs):
    w = workloads(all_docs)
    svcs = {d["metadata"]["name"]: d for _, d in all_docs if d["kind"] == "Service"}
    proxy = flag_values(container_argv(w["kvf-proxy"]["spec"]["template"]["spec"]
                                       ["containers"][0]))
    for role in ("prefill", "decode"):
        sts = w["kvf-" + role]
        c = sts["spec"]["template"]["spec"]["containers"][0]
        f = flag_values(container_argv(c))
        listen_port = int(f["listen"].rsplit(":", 1)[1])
        svc = svcs[sts["spec"]["serviceName"]]
        assert svc["spec"].get("clusterIP") == "None", "%s: not headless" % svc["metadata"]
        assert listen_port in [p["port"] for p in svc["spec"]["ports"]], (role, svc)
        assert listen_port in [p["containerPort"] for p in c["ports"]], (role, c["ports"])
        want = ["tcp://%s-%d.%s:%d" % (sts["metadata"]["name"], k, svc["metadata"]["name"],
                                        listen_port) for k in range(sts["spec"]["replicas"])]
        assert proxy[role].split(",") == want, (role, proxy[role], want)
        gpus = int(c["resources"]["limits"]["nvidia.com/gpu"])
        assert int(f["tp"]) == gpus, (role, f["tp"], gpus)
        if role == "prefill":
            side = int(f["side-port"])
            assert side in [p["port"] for p in svc["spec"]["ports"]], svc
    print("wiring: the proxy lists every prefill and decode pod by its stable name on its "
          "control port; TP equals the GPU limit")


def check_pods(all_docs):
    """Probes on every daemon, grace above the drain, the model claim defined."""
    claims = {d["metadata"]["name"] for _, d in all_docs if d["kind"] == "PersistentVolumeClaim"}
    for name, w in workloads(all_docs).items():
        spec = w["spec"]["template"]["spec"]
        for v in spec.get("volumes", []):
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, \
                    "%s mounts claim %s, which no manifest defines" % (
                        name, v["persistentVolumeClaim"]["claimName"])
        for c in spec["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in c or c["name"] == "proxy" and probe == "startupProbe", \
                    "%s: container %s has no %s" % (name, c["name"], probe)
            drain = int(flag_values(container_argv(c)).get("drain-timeout", "30s").rstrip("s"))
            if c["name"] != "proxy":
                assert spec.get("terminationGracePeriodSeconds", 30) > drain, \
                    "%s: grace period not above the %d s drain" % (name, drain)
    print("pods: probes on every daemon, grace periods above the drain, claims %s defined"
          % sorted(claims))


def check_dockerfile(all_docs):
    with open(DOCKERFILE) as f:
        text = f.read()
    with open(DOCKERFILE + ".cuda") as f:
        cuda_text = f.read()
    images = {c["image"] for w in workloads(all_docs).values()
              for c in w["spec"]["template"]["spec"]["containers"]
              if c["name"] == "proxy"}
    assert len(images) == 1, images
    image = images.pop()
    assert "-t %s " % image in text, "the Dockerfile does not build %s" % image
    gpu_images = {c["image"] for w in workloads(all_docs).values()
                  for c in w["spec"]["template"]["spec"]["containers"]
                  if "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})}
    for gi in gpu_images:
        assert "-t %s " % gi in cuda_text, "a pod asks for GPUs but its image %s is not the " \
            "one deploy/Dockerfile.cuda builds" % gi
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) == 2, "expected a build and a runtime stage"
    runtime = stages[-1]
    installed = set()
    for cmd in re.findall(r"apt-get install([^&]*)", runtime.replace("\\\n", " ")):
        installed |= {t for t in cmd.split() if not t.startswith("-")}
    progs = {container_argv(c)[0] for w in workloads(all_docs).values()
             for c in w["spec"]["template"]["spec"]["containers"]}
    for p in progs:
        assert re.search(r"/build/bin/%s\b" % re.escape(p), stages[0]), \
            "the build stage does not copy %s" % p
    # every shared library's package (base image packages aside)
    base = {"libc6", "libgcc-s1", "libstdc++6", "libzstd1", "liblzma5", "zlib1g"}
    libs = set()
    for p in ("kvf", "kvf-prefill", "kvf-decode", "kvf-proxy"):
        out = subprocess.run(["ldd", os.path.join(BIN, p)], stdout=subprocess.PIPE,
                             text=True).stdout
        libs |= {os.path.realpath(m) for m in re.findall(r"=> (/\S+)", out)}
    pkgs = {}
    for lib in sorted(libs):
        for path in (lib, "/usr" + lib if not lib.startswith("/usr") else lib[4:]):
            p = subprocess.run(["dpkg", "-S", path], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
            if p.returncode == 0:
                pkgs[lib] = p.stdout.split(":")[0]
                break
    direct = set()
    for p in ("kvf", "kvf-prefill", "kvf-decode", "kvf-proxy"):
        out = subprocess.run(["readelf", "-d", os.path.join(BIN, p)], stdout=subprocess.PIPE,
                             text=True).stdout
        direct |= set(re.findall(r"Shared library: \[([^\]]+)\]", out))
    missing = []
    for lib, pkg in pkgs.items():
        if os.path.basename(lib) in direct or any(os.path.basename(lib).startswith(d)
                                                  for d in direct):
            if pkg not in installed and pkg not in base:
                missing.append("%s (%s)" % (lib, pkg))
    assert not missing, "the runtime stage does not install: %s" % ", ".join(missing)
    print("Dockerfile: builds %s; its runtime stage installs the package of each of the %d "
          "libraries the programs link directly (%s)" % (
              image, len(direct), ", ".join(sorted(installed & set(pkgs.values())))))


def main():
    all_docs = docs()
    check_schema(all_docs)
    check_flags(all_docs)
    check_wiring(all_docs)
    check_pods(all_docs)
    check_dockerfile(all_docs)
    print("test_k8s_manifests passed")


if __name__ == "__main__":
    main()
