#!/usr/bin/env python3
"""kvf-proxy's chat template renderer (deploy/proxy/kvf_proxy_jinja*.c) against
Python's jinja2 set up as transformers' apply_chat_template sets it up
(chat_template_ref.py, shared with test_chat_template_real.py):
every template in tests/data/chat_templates (written in the styles of the Llama 3,
Qwen3 and Nemotron-H templates, with their constructs: namespaces, reversed
slices, string methods, tests, filters, whitespace control) and the trained
models' templates, on many generated message lists. Each output must be
byte-equal; a template that raises must fail in both, with the same message.
Skipped (exit 77) without jinja2.
"""

import argparse
import glob
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_template_ref import TemplateError, render as reference  # noqa: E402 (exits 77 without jinja2)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


WORDS = ["hello", "the ferry", "crosses", "at dawn", "\u00e9t\u00e9", "  spaced  ", "x\ny",
         "/think", "/no_think", "<think>plan</think>answer", "<tool_response>r</tool_response>",
         "a 'quote'", 'and "double"', "{{ not code }}", "", "line\n\n"]


def messages(rng):
    out = []
    if rng.random() < 0.5:
        out.append({"role": "system", "content": rng.choice(WORDS) + " " + rng.choice(WORDS)})
    for i in range(rng.randint(1, 5)):
        out.append({"role": "user", "content": " ".join(rng.choice(WORDS)
                                                        for _ in range(rng.randint(1, 3)))})
        if rng.random() < 0.3:
            out.append({"role": "tool", "content": rng.choice(WORDS)})
        if rng.random() < 0.8 or i == 0:
            out.append({"role": "assistant", "content": rng.choice(WORDS)})
    if rng.random() < 0.5 and out[-1]["role"] == "assistant":
        out.pop()
    return out


def variables(rng):
    v = {"messages": messages(rng), "add_generation_prompt": rng.random() < 0.7,
         "bos_token": "<s>", "eos_token": "</s>"}
    if rng.random() < 0.3:
        v["enable_thinking"] = rng.random() < 0.5
    if rng.random() < 0.2:
        v["date_string"] = "26 Jul 2024"
    if rng.random() < 0.1:
        v["messages"][0]["role"] = "narrator"   # raises in the Llama-style template
    return v


def ours(binary, path, variables):
    p = subprocess.run([binary, path], input=json.dumps(variables).encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    if p.returncode == 2:
        raise TemplateError(p.stderr.decode().strip()[len("error: "):])
    if p.returncode != 0:
        raise RuntimeError(p.stderr.decode())
    return p.stdout.decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--testbin", required=True)
    ap.add_argument("--cases", type=int, default=150)
    a = ap.parse_args()
    binary = os.path.join(a.testbin, "kvf_jinja_render")
    paths = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "chat_templates", "*.jinja")))
    for cfg in sorted(glob.glob(os.path.join(ROOT, "models-trained", "*",
                                             "tokenizer_config.json"))):
        with open(cfg) as f:
            t = json.load(f).get("chat_template")
        if t:
            out = os.path.join(a.testbin, os.path.basename(os.path.dirname(cfg)) + ".jinja")
            with open(out, "w") as f:
                f.write(t)
            paths.append(out)
    assert len(paths) >= 4, paths
    rng = random.Random(31)
    total = raised = 0
    for path in paths:
        with open(path) as f:
            template = f.read()
        for case in range(a.cases):
            v = variables(rng)
            try:
                want, want_err = reference(template, v), None
            except TemplateError as e:
                want, want_err = None, str(e)
            try:
                got, got_err = ours(binary, path, v), None
            except TemplateError as e:
                got, got_err = None, str(e)
            if (want, want_err) != (got, got_err):
                print("FAIL %s case %d\nvars: %s\njinja2: %r / %r\nkvf:    %r / %r"
                      % (os.path.basename(path), case, json.dumps(v), want, want_err, got,
                         got_err))
                sys.exit(1)
            total += 1
            raised += want_err is not None
        print("ok: %s: %d message lists byte-equal to jinja2" % (os.path.basename(path),
                                                                  a.cases))
    print("ok: %d renders equal (%d raised in both with the same message)" % (total, raised))
    unclosed_blocks(binary)


def unclosed_blocks(binary):
    """A block statement without its end tag fails to parse, naming both tags."""
    import tempfile
    for tag, text in (("set", "{% set x %}a"), ("macro", "{% macro m() %}a"),
                      ("filter", "{% filter upper %}a")):
        with tempfile.NamedTemporaryFile("w", suffix=".jinja") as f:
            f.write(text)
            f.flush()
            try:
                got = ours(binary, f.name, {"messages": []})
            except TemplateError as e:
                got = str(e)
        want = "'%s' without 'end%s'" % (tag, tag)
        if want not in got:
            print("FAIL %r: %r, expected an error naming %s" % (text, got, want))
            sys.exit(1)
    print("ok: set, macro and filter blocks without their end tag are refused by name")


if __name__ == "__main__":
    main()
