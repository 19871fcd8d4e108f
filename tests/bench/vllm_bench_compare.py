#!/usr/bin/env python3
"""`vllm bench serve` and `kvf bench-serve` with the same command line against the
same pool, their results side by side (not run in CI: it needs vllm from PyPI).

    python3 tests/bench/vllm_bench_compare.py --base-url http://127.0.0.1:8000 \\
        -- --model tiny --dataset-name random --random-input-len 128 \\
           --random-output-len 32 --num-prompts 200 --request-rate 8 --temperature 0

Everything after `--` is passed unchanged to both tools (plus --save-result
--result-dir into a temporary folder, so each writes its JSON); the script then
prints every key both results have, the two values and their ratio, and the keys
only one of them wrote. `vllm bench serve` is run as `vllm bench serve` when the
`vllm` command exists, else as `python3 -m vllm.entrypoints.cli.main bench serve`;
without either the script says so and exits 77.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile


def vllm_command():
    if shutil.which("vllm"):
        return ["vllm", "bench", "serve"]
    try:
        import vllm  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve"]


def run(cmd, outdir):
    os.makedirs(outdir, exist_ok=True)
    p = subprocess.run(cmd + ["--save-result", "--result-dir", outdir], capture_output=True,
                       text=True)
    if p.returncode != 0:
        sys.stderr.write("%s failed (%d):\n%s\n" % (" ".join(cmd[:3]), p.returncode,
                                                    p.stderr[-2000:]))
        return None
    files = sorted(glob.glob(os.path.join(outdir, "*.json")))
    with open(files[-1]) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--kvf", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "..", "build", "bin", "kvf"))
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    common = ["--base-url", a.base_url] + [x for x in a.args if x != "--"]
    vcmd = vllm_command()
    if vcmd is None:
        print("SKIP: vllm is not installed (pip install vllm); nothing compared")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        kres = run([a.kvf, "bench-serve"] + common, os.path.join(tmp, "kvf"))
        vres = run(vcmd + common, os.path.join(tmp, "vllm"))
    if kres is None or vres is None:
        return 1
    print("%-36s %16s %16s %8s" % ("key", "vllm bench serve", "kvf bench-serve", "kvf/vllm"))
    for k in sorted(set(vres) & set(kres)):
        v, w = vres[k], kres[k]
        if isinstance(v, (int, float)) and isinstance(w, (int, float)) and \
                not isinstance(v, bool):
            ratio = ("%8.3f" % (w / v)) if v else "       -"
            print("%-36s %16.4g %16.4g %s" % (k, v, w, ratio))
        elif not isinstance(v, list):
            print("%-36s %16s %16s" % (k, str(v)[:16], str(w)[:16]))
    only_v = sorted(set(vres) - set(kres))
    print("keys only vllm wrote: %s" % (", ".join(only_v) or "none"))
    print("keys only kvf wrote: %s" % ", ".join(sorted(set(kres) - set(vres))))
    return 0 if not only_v else 1


if __name__ == "__main__":
    sys.exit(main())
