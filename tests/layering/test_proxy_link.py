#!/usr/bin/env python3
"""kvf-proxy links the tokenizer, not the engine.

The proxy's link closure must be what its include closure allows
(check_includes.LAYERS: deploy/proxy -> common/tokenizer, transfer/zmq, proto,
base): no archive of another layer on its link command (the one CMake
generated: link.txt for Makefiles, build.ninja for Ninja), none of their
symbols in the binary (nm), and neither OpenBLAS, CUDA, NCCL nor UCX among
its link inputs or its NEEDED libraries (readelf). The same check run on
kvf-decode, which links the engine, must report it: the check can fail.

usage: test_proxy_link.py --build BUILD_DIR --proxy BIN --engine-bin BIN
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_includes as ci  # noqa: E402

# shared libraries an engine-free front end has no use for
FORBIDDEN_EXT = re.compile(r"(openblas|blas|cudart|cublas|cuda|nccl|libucp|libuct|libucs|libucm)")


def layer_archives(build):
    """{layer: archive path} for each layer library the build made."""
    out = {}
    for layer in ci.LAYERS:
        for a in glob.glob(os.path.join(build, layer, "lib*.a")):
            out.setdefault(layer, []).append(a)
    return out


def link_inputs(build, target):
    """The words of @target's link command as CMake generated it."""
    mk = glob.glob(os.path.join(build, "**", "CMakeFiles", f"{target}.dir", "link.txt"),
                   recursive=True)
    if mk:
        with open(mk[0]) as f:
            words = shlex.split(f.read())
        # CUDA builds pass objects and libraries in response files (@CMakeFiles/T.dir/x.rsp),
        # relative to the folder the link runs in (the one holding CMakeFiles/)
        run_dir = os.path.dirname(os.path.dirname(os.path.dirname(mk[0])))
        out = []
        for w in words:
            if w.startswith("@") and os.path.exists(os.path.join(run_dir, w[1:])):
                with open(os.path.join(run_dir, w[1:])) as f:
                    out.extend(shlex.split(f.read()))
            else:
                out.append(w)
        return out
    ninja = os.path.join(build, "build.ninja")
    if os.path.exists(ninja):
        with open(ninja) as f:
            text = f.read()
        m = re.search(r"^build \S*\b" + re.escape(target) + r": C\S*LINKER[^\n]*\n((?:  [^\n]*\n)*)",
                      text, re.M)
        if m:
            for line in m.group(1).splitlines():
                k, _, v = line.strip().partition(" = ")
                if k == "LINK_LIBRARIES":
                    return shlex.split(v)
    raise SystemExit(f"no link command for {target} under {build} (Makefiles or Ninja)")


def defined_symbols(path):
    p = subprocess.run(["nm", "--defined-only", path], capture_output=True, text=True, check=True)
    return {f[2] for f in (l.split() for l in p.stdout.splitlines())
            if len(f) == 3 and f[1] in "TDBR"}


def needed(path):
    p = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", p.stdout)


def violations(build, target, binary, layer="deploy/proxy"):
    allowed = ci.closure(layer) | {layer}
    words = link_inputs(build, target)
    names = {os.path.basename(w) for w in words}
    in_binary = defined_symbols(binary)
    errors = []
    for other, archives in sorted(layer_archives(build).items()):
        if other in allowed:
            continue
        for a in archives:
            if os.path.basename(a) in names:
                errors.append(f"{target} links {os.path.relpath(a, build)} ({other}); "
                              f"{layer} may link {', '.join(sorted(allowed - {layer}))}")
            common = in_binary & defined_symbols(a)
            if common:
                errors.append(f"{target} holds {len(common)} symbols of {other} "
                              f"(e.g. {sorted(common)[0]})")
    for w in words:
        if w.endswith((".so", ".a")) or w.startswith("-l"):
            if FORBIDDEN_EXT.search(os.path.basename(w)):
                errors.append(f"{target} links {w}")
    for lib in needed(binary):
        if FORBIDDEN_EXT.search(lib):
            errors.append(f"{target} needs {lib} at run time")
    return words, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--proxy", required=True, help="the kvf-proxy binary")
    ap.add_argument("--engine-bin", required=True, help="a binary that links the engine (kvf-decode)")
    a = ap.parse_args()

    words, errors = violations(a.build, "kvf-proxy", a.proxy)
    for e in errors:
        print(e)
    assert not errors, f"kvf-proxy's link closure reaches the engine: {len(errors)} finding(s)"
    libs = [os.path.basename(w) for w in words if w.endswith(".a")]
    print(f"ok: kvf-proxy links {' '.join(libs)}; needs {' '.join(needed(a.proxy))}")

    # the check can fail: kvf-decode, held to the proxy's closure, is reported
    _, caught = violations(a.build, os.path.basename(a.engine_bin), a.engine_bin)
    assert any("libkvf_engine.a" in e for e in caught), f"engine link not caught: {caught}"
    assert any("symbols of kernels" in e for e in caught), f"kernel symbols not caught: {caught}"
    print(f"ok: the same check on {os.path.basename(a.engine_bin)} reports {len(caught)} findings")


if __name__ == "__main__":
    main()
