#!/usr/bin/env python3
"""kvf-proxy's chat template renderer against jinja2 (set up as transformers sets it up for
vLLM, chat_template_ref.py) on randomly composed expressions and statements: literals of
every type (Unicode, quotes, floats, tuples, dicts), variables, filters with arguments,
string/dict methods, operators, is-tests, slices, conditionals, for/else and set, nested a
few levels. Where the real templates (test_chat_template_real.py) show what operators
serve, this shows the pieces behave as Python's anywhere they combine.

Per template: kvferry's text is byte-equal to jinja2's, or both fail, or kvferry refuses
with a message naming what it lacks. Any other outcome, a crash or a hang fails the test.
The composition avoids two things jinja2 does at compile time rather than as Python would:
folding a constant whose slicing fails into undefined, and printing a generator (its
address). Fixed seed: the same templates on every run. Skipped (exit 77) without jinja2.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_template_ref as ref  # noqa: E402 (exits 77 without jinja2)

ATOMS = ["'abc'", "'\u00c9t\u00e9 x'", "' pad '", "\"it's\"", "'a,b,,c'", "''", "0", "1", "-3",
         "2.5", "10", "none", "true", "false", "undefined_name", "[1, 2, 3]",
         "['b', 'a', 'B']", "[]", "{'k': 1, 'a': 'v'}", "{}", "msgs", "msgs[0]", "d", "d.x",
         "d['y']", "(1, 'a')", "s", "n", "f", "4 / 2", "7 // 2", "2 ** 3"]
SLICEABLE = ["msgs", "s", "'abc'", "'\u00c9t\u00e9 x'", "[1, 2, 3]", "d['y']", "(1, 'a')"]
FILTERS = ["trim", "length", "string", "list", "int", "upper", "lower", "title", "capitalize",
           "default('D')", "default('D', true)", "first", "last", "join(',')", "join",
           "tojson", "tojson(indent=2)", "tojson(sort_keys=true)", "replace('a', 'X')", "sort",
           "min", "max", "indent(2)", "dictsort", "select", "reject", "map('upper')",
           "map(attribute='role')", "selectattr('role', 'equalto', 'user')", "count", "e",
           "sort(reverse=true)", "unique | list", "reverse | list", "items | list"]
METHODS = ["strip()", "strip('a')", "split(',')", "split()", "startswith('a')",
           "endswith('c')", "replace('b', 'Q')", "upper()", "lower()", "title()", "get('k')",
           "get('z', 5)", "items()", "keys()", "values()", "format(1, 2)", "lstrip()",
           "rstrip(' ')", "capitalize()"]
OPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or"]
TESTS = ["defined", "undefined", "none", "string", "number", "mapping", "sequence",
         "iterable", "integer", "float", "boolean", "true", "false", "odd", "even",
         "equalto 1"]
VARS = {"msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
        "d": {"x": 1, "y": [1, 2]}, "s": "ab c", "n": 7, "f": 1.5}


def expr(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.25:
        return rng.choice(ATOMS)
    if r < 0.45:
        return "(%s | %s)" % (expr(rng, depth + 1), rng.choice(FILTERS))
    if r < 0.55:
        return "(%s).%s" % (expr(rng, depth + 1), rng.choice(METHODS))
    if r < 0.75:
        return "(%s %s %s)" % (expr(rng, depth + 1), rng.choice(OPS), expr(rng, depth + 1))
    if r < 0.82:
        return "(%s is %s%s)" % (expr(rng, depth + 1), rng.choice(["", "not "]),
                                 rng.choice(TESTS))
    if r < 0.88:
        return "%s[%s]" % (rng.choice(SLICEABLE),
                           rng.choice(["0", "-1", "1:", ":2", "::-1", "1:-1", "5"]))
    if r < 0.94:
        return "(not %s)" % expr(rng, depth + 1)
    return "(%s if %s else %s)" % (expr(rng, depth + 1), expr(rng, depth + 1),
                                   expr(rng, depth + 1))


def template(rng):
    kind = rng.random()
    if kind < 0.7:
        return "{{ %s }}" % expr(rng)
    if kind < 0.85:
        return ("{%% for x in %s %%}[{{ x }}|{{ loop.index }}]{%% else %%}E{%% endfor %%}"
                % expr(rng))
    return "{%% set y = %s %%}{%% if y %%}T{{ y }}{%% else %%}F{%% endif %%}" % expr(rng)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--testbin", required=True)
    ap.add_argument("--count", type=int, default=600)
    ap.add_argument("--seed", type=int, default=20261206)
    a = ap.parse_args()
    binary = os.path.join(a.testbin, "kvf_jinja_render")
    rng = random.Random(a.seed)
    equal = failed = refused = 0
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.jinja")
        for _ in range(a.count):
            t = template(rng)
            with open(path, "w", encoding="utf-8") as f:
                f.write(t)
            try:
                want, want_err = ref.render(t, VARS), None
            except Exception as e:   # jinja2 failed: kvferry must fail too
                want, want_err = None, "%s: %s" % (type(e).__name__, e)
            p = subprocess.run([binary, "--batch", path], input=json.dumps([VARS]).encode(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
            if p.returncode != 0:
                bad.append("%s\n   kvf_jinja_render exited %d: %s"
                           % (t, p.returncode, p.stderr.decode()[-300:]))
                continue
            got = json.loads(p.stdout)[0]
            if got.get("status") == "unsupported":
                assert "not supported" in got["error"], got
                refused += 1
            elif want_err is None and got.get("text") == want:
                equal += 1
            elif want_err is not None and got.get("status") == "invalid":
                failed += 1
            else:
                bad.append("%s\n   jinja2: %r %s\n   kvf:    %r" % (t, want, want_err or "", got))
    for b in bad:
        print("DIFFER:", b)
    print("%d templates: %d byte-equal, %d failed in both, %d refused by name, %d differ"
          % (a.count, equal, failed, refused, len(bad)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
