#!/usr/bin/env python3
"""Build the CPU image (deploy/Dockerfile) the Helm chart's image.cpu names,
and run its programs, when a container runtime works here.

`docker info` (or podman) must succeed; otherwise the test reports skipped
(77) with the reason: this machine has the docker client but no daemon.
With one: `docker build -f deploy/Dockerfile` from the repository root, then
in the image each of kvf-prefill, kvf-decode, kvf-proxy and kvf answers
--help (every shared library it links is installed) as the image's user.
The CUDA image (deploy/Dockerfile.cuda) needs NVIDIA's base images and is
not built here.
"""

import os
import shutil
import subprocess
import sys
import time

ROOT = os.environ.get("KVF_SOURCE_DIR") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))
TAG = "kvferry-test-image:%d" % os.getpid()


def runtime():
    for exe in ("docker", "podman"):
        if shutil.which(exe) is None:
            continue
        p = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=60)
        if p.returncode == 0:
            return exe, None
        why = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        return None, "%s info failed: %s" % (exe, why)
    return None, "no docker or podman"


def main():
    exe, why = runtime()
    if exe is None:
        print("SKIP: no container runtime (%s); the image is not built" % why)
        sys.exit(77)
    t0 = time.monotonic()
    p = subprocess.run([exe, "build", "-f", os.path.join(ROOT, "deploy", "Dockerfile"),
                        "-t", TAG, ROOT], capture_output=True, text=True, timeout=3000)
    assert p.returncode == 0, "docker build failed:\n%s" % (p.stdout[-4000:] + p.stderr[-4000:])
    try:
        for prog in ("kvf-prefill", "kvf-decode", "kvf-proxy", "kvf"):
            r = subprocess.run([exe, "run", "--rm", TAG, prog, "--help"], capture_output=True,
                               text=True, timeout=120)
            out = r.stdout + r.stderr
            assert "usage" in out.lower() or "--" in out, (prog, out[-2000:])
            assert "error while loading shared libraries" not in out, (prog, out[-2000:])
        print("image: built %s in %.0f s; its programs start (--help)" % (TAG, time.monotonic() - t0))
    finally:
        subprocess.run([exe, "rmi", "-f", TAG], capture_output=True, timeout=120)
    print("test_k8s_image passed")


if __name__ == "__main__":
    main()
