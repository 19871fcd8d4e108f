#!/usr/bin/env python3
"""Checks every quoted #include in the tree against the layer order of
docs/ARCHITECTURE.md §4 (the same order the CMake targets link in).

Each source folder is a layer; a file may include headers of its own layer
and of the layers below it, never above or sideways. Headers are found by
basename (the build exposes each layer's folder as its include directory, so
includes are bare names). Exit 0 when clean; 1 with one line per violation,
`path:line: includes NAME from LAYER; LAYER may use ...`.

NOTE: when a folder is added, add it to LAYERS here and give it a CMake
target linking the same layers (CMakeLists.txt, kvf_layer()).
"""
import argparse
import os
import re
import sys

# layer -> the layers it links directly; the check uses the transitive closure.
LAYERS = {
    "base": [],                 # the ground floor, a top-level folder
    "kernels": ["base"],
    "common/tokenizer": ["base"],  # tokenizer, its config fields, block hash: kvf-proxy links it
    "common/model": ["kernels"],
    "common/geometry": ["common/model"],
    "common/cache": ["common/geometry", "common/tokenizer"],
    "common/runtime": ["common/cache"],
    "common/engine": ["common/runtime"],
    "proto": [],
    "transfer/zmq": ["base"],         # sockets, CURVE, protobuf checks: kvf-proxy links it
    "transfer/wire": ["common/engine", "proto", "transfer/zmq"],
    "transfer/plan": ["common/engine"],
    "transfer/channel": ["transfer/wire", "transfer/zmq", "proto"],
    "transfer/ucx": ["transfer/channel", "transfer/plan", "transfer/wire"],
    "daemon": ["transfer/ucx"],
    "prefill": ["daemon"],
    "decode": ["daemon"],
    "tools": ["daemon"],
    "deploy/proxy": ["common/tokenizer", "transfer/zmq", "proto"],   # never the engine
}
SOURCE_EXT = (".c", ".h", ".cu")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def closure(layer):
    seen, todo = set(), list(LAYERS[layer])
    while todo:
        dep = todo.pop()
        if dep not in seen:
            seen.add(dep)
            todo.extend(LAYERS[dep])
    return seen


def layer_of(rel):
    """The layer a tree path belongs to, or None (tests/, build outputs)."""
    folder = os.path.dirname(rel)
    return folder if folder in LAYERS else None


def scan(root):
    headers, sources, errors = {}, [], []
    for layer in LAYERS:
        d = os.path.join(root, layer)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if not name.endswith(SOURCE_EXT):
                continue
            rel = f"{layer}/{name}"
            sources.append(rel)
            if name.endswith(".h"):
                if name in headers:
                    errors.append(f"{rel}: header name {name} also in {headers[name]}"
                                  " (includes are bare names, so names must be unique)")
                headers[name] = layer
        if layer == "proto":
            for name in sorted(os.listdir(d)):
                if name.endswith(".proto"):
                    headers[name[:-len(".proto")] + ".pb-c.h"] = "proto"
    return headers, sources, errors


def check(root):
    headers, sources, errors = scan(root)
    for rel in sources:
        layer = layer_of(rel)
        allowed = closure(layer) | {layer}
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if "/" in inc:
                    errors.append(f"{rel}:{lineno}: includes \"{inc}\" by path; "
                                  "include headers by bare name")
                    continue
                target = headers.get(inc)
                if target is None:
                    continue          # not ours: a system or third-party header
                if target not in allowed:
                    may = ", ".join(sorted(closure(layer))) or "nothing of the tree"
                    errors.append(f"{rel}:{lineno}: includes {inc} from {target}; "
                                  f"{layer} may use {may}")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."),
                    help="repository root to check (default: this checkout)")
    args = ap.parse_args()
    errors = check(os.path.abspath(args.root))
    for e in errors:
        print(e)
    if errors:
        print(f"layering: {len(errors)} violation(s)", file=sys.stderr)
        return 1
    print("layering: every #include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
