#!/usr/bin/env python3
"""Published checkpoints' config.json in Python's JSON dialect load and generate.

NVIDIA's Nemotron-H configs carry "time_step_limit": [0.0, Infinity]: Python's json
writes a non-finite float as a bare literal (allow_nan=True is its default, and
transformers 4.x wrote config.json with json.dumps(indent=2, sort_keys=True)).
transformers 5 writes {"__float__": "Infinity"} instead. The trained hybrid with
each form must give the tokens and logits (printed to float32's 9 digits, so equal
text is equal bits) of its 1e+30 twin through kvf generate; kvf mkmodel must keep
Infinity (cJSON alone would write null); a truncated config.json is refused with
its file, line and column. With transformers installed, a config written by
transformers itself (save_pretrained) is one more twin; without it that case says
skipped.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

KVF = os.path.join(os.environ["KVF_BIN"], "kvf")
SRC = os.environ["KVF_SOURCE_DIR"]
MODEL = os.path.join(SRC, "models-trained", "tiny-hybrid")
PROMPT = "reverse: published"


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def twin(root, name, config_text):
    """A model folder: the trained weights and tokenizer, and this config.json text."""
    d = os.path.join(root, name)
    os.makedirs(d)
    for f in os.listdir(MODEL):
        if f != "config.json":
            os.symlink(os.path.join(MODEL, f), os.path.join(d, f))
    with open(os.path.join(d, "config.json"), "w") as fh:
        fh.write(config_text)
    return d


def generate(model):
    """tokens: and logits lines of a greedy run (timings left out)."""
    p = subprocess.run([KVF, "generate", "--model", model, "--prompt", PROMPT,
                        "--max-tokens", "8", "--ignore-eos", "yes", "--print-logits", "yes"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"kvf generate --model {model}: exit {p.returncode}: {p.stderr.strip()}")
    lines = [l for l in p.stdout.splitlines() if l.startswith(("tokens:", "logits "))]
    if len(lines) != 9:
        fail(f"{model}: expected a tokens line and 8 logits lines: {p.stdout}")
    return lines


def main():
    base = json.load(open(os.path.join(MODEL, "config.json")))
    root = tempfile.mkdtemp(prefix="kvf-pubcfg-")
    try:
        finite = dict(base, time_step_limit=[0.0, 1e30])
        inf = dict(base, time_step_limit=[0.0, float("inf")], router_aux_loss_coef=float("nan"))
        # transformers 4.x's writer: json.dumps(indent=2, sort_keys=True) + "\n"
        bare = json.dumps(inf, indent=2, sort_keys=True) + "\n"
        if "Infinity" not in bare or "NaN" not in bare:
            fail("python did not write bare Infinity/NaN: " + bare)
        t5 = json.dumps(dict(base, time_step_limit=[0.0, {"__float__": "Infinity"}]), indent=2)
        want = generate(twin(root, "finite", json.dumps(finite, indent=2)))
        for name, text in (("bare-infinity", bare), ("float-object", t5)):
            got = generate(twin(root, name, text))
            if got != want:
                fail(f"{name}: tokens/logits differ from the 1e+30 twin:\n{got[0]}\n{want[0]}")
            print(f"{name}: same tokens and logits as the 1e+30 twin ({want[0]})")

        try:
            from transformers import AutoConfig
        except ImportError:
            print("transformers-written config: skipped (transformers not installed)")
        else:
            cfg = AutoConfig.from_pretrained(twin(root, "hf-src", json.dumps(finite)))
            cfg.time_step_limit = (0.0, float("inf"))
            out = os.path.join(root, "hf-out")
            cfg.save_pretrained(out)
            got = generate(twin(root, "hf", open(os.path.join(out, "config.json")).read()))
            if got != want:
                fail("the config transformers wrote gives other tokens/logits")
            print("transformers-written config: same tokens and logits")

        # kvf mkmodel rewrites the config: Infinity stays Infinity
        src = os.path.join(root, "bare-infinity", "config.json")
        mk = os.path.join(root, "mk")
        p = subprocess.run([KVF, "mkmodel", "--config", src, "--out", mk, "--seed", "1"],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            fail(f"kvf mkmodel on a bare-Infinity config: {p.stderr.strip()}")
        written = json.load(open(os.path.join(mk, "config.json")))   # python reads Infinity
        if written["time_step_limit"][1] != float("inf"):
            fail(f"kvf mkmodel wrote time_step_limit {written['time_step_limit']}")
        shutil.copy(os.path.join(MODEL, "tokenizer.json"), mk)
        generate(mk)
        print("kvf mkmodel: time_step_limit [0.0, Infinity] kept and the model generates")

        # a truncated file: its name, line and column, for mkmodel and generate alike
        cut = twin(root, "truncated", bare[:bare.index("Infinity") + len("Infinity")])
        line = bare[:bare.index("Infinity")].count("\n") + 1
        for argv in ([KVF, "generate", "--model", cut, "--prompt", "x", "--max-tokens", "1"],
                     [KVF, "mkmodel", "--config", os.path.join(cut, "config.json"), "--out",
                      os.path.join(root, "mk2")]):
            p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            where = f"{cut}/config.json:{line}:"
            if p.returncode == 0 or where not in p.stderr or "end of file" not in p.stderr:
                fail(f"{argv[1]} on a truncated config: exit {p.returncode}, wanted '{where}"
                     f"... end of file': {p.stderr.strip()}")
        print(f"truncated config.json: refused at line {line} (end of file)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
