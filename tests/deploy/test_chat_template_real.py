#!/usr/bin/env python3
"""kvf-proxy's chat template renderer (deploy/proxy/kvf_proxy_jinja*.c) on the real chat
templates of the model families operators serve: the 70 Hugging Face templates that PyPI's
llama-cpp-python 0.3.36 sdist carries (tests/deploy/fetch_chat_templates.sh puts them in a
cache folder at test time; none is committed), against the reference vLLM renders with
(transformers' setup of jinja2, chat_template_ref.py).

Each template renders the message lists of test_chat_template.py plus fixed cases: system
prompt, multi-turn, tool calls (arguments as an object, as vLLM hands them, or as JSON text;
parallel calls) and tool results, tools given, content as text parts, reasoning content,
documents, add_generation_prompt on and off, enable_thinking. Per case, kvferry's text must be byte-equal to the reference's, or
both must fail (raise_exception with the same message), or kvferry refuses the template
with a message naming the construct it lacks ("filter 'x' is not supported"). A crash, a
hang, a syntax error jinja2 does not see or any other difference fails the test, and so
does a family of REQUIRED that does not render equal on every case. Prints the counts
(equal, refused and why). Skipped (exit 77) without jinja2 or without the templates.
"""

import argparse
import glob
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_template_ref as ref  # noqa: E402 (exits 77 without jinja2)
from test_chat_template import variables as random_variables  # noqa: E402

# One template per family named by the issue (all of them must render equal on every case).
REQUIRED = [
    "meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct", "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B",
    "Qwen3.5-4B", "mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506",
    "google-gemma-2-2b-it", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "deepseek-ai-DeepSeek-V3.1", "ibm-granite-granite-3.3-2B-Instruct",
    "ibm-granite-granite-4.0", "NVIDIA-Nemotron-Nano-v2", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "openai-gpt-oss-120b",
]
VERSION = "0.3.36"

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "the city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "book_ferry", "description": "Book seats on a crossing.",
        "parameters": {"type": "object", "properties": {
            "seats": {"type": "integer", "description": "how many", "minimum": 1},
            "names": {"type": "array", "items": {"type": "string"}},
            "options": {"type": "object", "properties": {"cabin": {"type": "boolean"}}}},
            "required": ["seats", "names"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}


def fixed_cases():
    sys_m = {"role": "system", "content": "You are a ferry pilot."}
    u1 = {"role": "user", "content": "When does the ferry leave?"}
    a1 = {"role": "assistant", "content": "At dawn."}
    u2 = {"role": "user", "content": "And the weather in Paris?"}
    call = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    result = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
              "content": "{\"temperature\": 21}"}
    a2 = {"role": "assistant", "content": "21 degrees and clear."}
    lists = [
        ([u1], {}),
        ([sys_m, u1], {}),
        ([sys_m, u1, a1, u2], {}),
        ([u1, a1, u2, a1], {}),
        ([sys_m, u1, a1], {"enable_thinking": False}),
        ([u2], {"tools": TOOLS}),
        ([sys_m, u2], {"tools": TOOLS}),
        ([sys_m, u2, call, result], {"tools": TOOLS}),
        ([sys_m, u2, call, result, a2, u1], {"tools": TOOLS}),
        ([u2, call, result], {}),
        # content as text parts, reasoning, documents, JSON-text arguments, parallel calls
        ([sys_m, {"role": "user", "content": [{"type": "text", "text": "When"},
                                               {"type": "text", "text": "does it leave?"}]}],
         {}),
        ([u1, {"role": "assistant", "content": "At dawn.", "reasoning_content": "It is early."},
          u2], {}),
        ([u1], {"documents": [{"title": "Timetable", "text": "Ferries leave at dawn."}]}),
        ([sys_m, u2, {"role": "assistant", "content": None, "tool_calls": [
            dict(CALL, function={"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}),
            dict(CALL, id="call_2")]},
          result, dict(result, tool_call_id="call_2")], {"tools": TOOLS}),
    ]
    out = []
    for msgs, extra in lists:
        for agp in (True, False):
            v = {"messages": json.loads(json.dumps(msgs)), "add_generation_prompt": agp}
            v.update(extra)
            out.append(v)
    return out


def cases(n_random):
    rng = random.Random(42)
    out = fixed_cases() + [random_variables(rng) for _ in range(n_random)]
    for v in out:   # what transformers always passes
        v.setdefault("tools", None)
        v.setdefault("documents", None)
        v.setdefault("bos_token", "<s>")
        v.setdefault("eos_token", "</s>")
    return out


def reference(template, v):
    try:
        return ref.render(template, v), None
    except ref.TemplateError as e:
        return None, "raise: " + str(e)
    except Exception as e:   # any other failure of jinja2: ours must fail too
        return None, "error: %s: %s" % (type(e).__name__, e)


def ours(binary, path, vs):
    p = subprocess.run([binary, "--batch", "--now", str(ref.NOW), path],
                       input=json.dumps(vs).encode(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    if p.returncode != 0:
        raise RuntimeError("kvf_jinja_render exited %d: %s" % (p.returncode, p.stderr.decode()))
    return json.loads(p.stdout)


COUNTS = {"text": 0, "failed": 0}


def check(binary, path, vs):
    """('equal', None) | ('refused', reason) | ('differ', description); COUNTS: the cases
    that rendered the same text, and those that failed in both."""
    with open(path, encoding="utf-8") as f:
        template = f.read()
    try:
        got = ours(binary, path, vs)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return "differ", str(e)
    refused = None
    for i, (v, g) in enumerate(zip(vs, got)):
        want, want_err = reference(template, v)
        if g.get("status") == "unsupported":
            if "not supported" not in g["error"]:
                return "differ", "case %d: refused without naming what: %r" % (i, g["error"])
            refused = refused or g["error"]
            continue
        if want_err is None and g.get("text") == want:
            COUNTS["text"] += 1
            continue
        if want_err is not None and "error" in g and g["status"] == "invalid":
            if not want_err.startswith("raise: ") or want_err[len("raise: "):] == g["error"]:
                COUNTS["failed"] += 1
                continue
        return "differ", ("case %d\nvars: %s\njinja2: %r / %r\nkvf:    %r"
                          % (i, json.dumps(v), want, want_err, g))
    return ("refused", refused) if refused else ("equal", None)


def template_dir():
    base = os.environ.get("KVF_CHAT_TEMPLATES_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "kvferry", "chat-templates")
    return os.path.join(base, "llama-cpp-python-" + VERSION, "templates")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--testbin", required=True)
    ap.add_argument("--random", type=int, default=40, help="generated message lists")
    ap.add_argument("--only", help="a substring of the template names to run")
    a = ap.parse_args()
    paths = sorted(glob.glob(os.path.join(template_dir(), "*.jinja")))
    if not paths:
        print("SKIP: no templates in %s (tests/deploy/fetch_chat_templates.sh fetches them)"
              % template_dir())
        sys.exit(77)
    binary = os.path.join(a.testbin, "kvf_jinja_render")
    vs = cases(a.random)
    equal, refused, differ = [], {}, {}
    for path in paths:
        name = os.path.basename(path)[:-len(".jinja")]
        if a.only and a.only not in name:
            continue
        kind, why = check(binary, path, vs)
        if kind == "equal":
            equal.append(name)
        elif kind == "refused":
            refused[name] = why
        else:
            differ[name] = why
    for name in sorted(refused):
        print("refused: %s: %s" % (name, refused[name]))
    for name in sorted(differ):
        print("DIFFER: %s: %s" % (name, differ[name]))
    print("ok: %d of %d templates render byte-equal to jinja2 on %d cases each: %s"
          % (len(equal), len(equal) + len(refused) + len(differ), len(vs), " ".join(equal)))
    print("%d refused by name, %d differ; %d renders byte-equal, %d failed in both (jinja2's "
          "raise_exception with the same message, or another jinja2 error)"
          % (len(refused), len(differ), COUNTS["text"], COUNTS["failed"]))
    missing = [r for r in REQUIRED if r not in equal and (not a.only or a.only in r)]
    if missing:
        print("FAIL: these families do not render equal: %s" % " ".join(missing))
    sys.exit(1 if differ or missing else 0)


if __name__ == "__main__":
    main()
