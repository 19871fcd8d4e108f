#!/usr/bin/env python3
"""Size limits of docs/CODE_RULES.md: no tracked .c/.h/.cu/.cuh file over 1,000 lines and no
function over 120 lines.

How a file is measured: its number of lines (newline characters, plus one for an unterminated
last line), as `wc -l` counts them.

How a function is measured: from its signature line to its closing brace, both included. The
source is scanned with comments, string and character literals and preprocessor lines (with
their backslash continuations) blanked out; a brace block opened at file level (or inside an
`extern "C" {`) is a function body when the text before it, back to the previous `;`, `}` or
`{` at that level, holds a `(` and no `=` and does not start with struct/union/enum/typedef.
The signature line is the first non-blank line of that text, so a return type on its own line
above the name counts. Macros that expand to functions are not seen (none are used for that).

Files listed in EXEMPT are skipped, each with the reason; the list must only shrink: an
exempt file that is back within the limits is reported, so its entry gets removed.

Usage: check_sizes.py [--root DIR] [--max-lines N] [--max-func N]
Exit status 0 when every file holds, 1 otherwise (one line per breach: path:line, what, size).
"""
import argparse
import os
import re
import subprocess
import sys

MAX_FILE_LINES = 1000
MAX_FUNC_LINES = 120
EXTS = (".c", ".h", ".cu", ".cuh")

# path -> why it is over now; the list only shrinks (an exempt file within the limits fails
# the check until its entry goes).
EXEMPT = {
}


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True,
                             check=True, timeout=60).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, _, names in os.walk(root):
            if "/." in d or "/build" in d:
                continue
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(f for f in files if f.endswith(EXTS) and os.path.isfile(os.path.join(root, f)))


def blank_code(text):
    """Return @text with comments, literals and preprocessor lines replaced by spaces
    (newlines kept, so offsets and line numbers stay the same)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":  # preprocessor line, with continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        line_start = False
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


AGGREGATE = re.compile(r"^\s*(typedef|struct|union|enum)\b")
EXTERN_C = re.compile(r"extern\s*$")


def func_name(head):
    """The identifier before the last top-level parenthesised group (the parameters), so that
    attributes such as __launch_bounds__(256) before the name are passed over."""
    level, close = 0, None
    for k in range(len(head) - 1, -1, -1):
        if head[k] == ")":
            level += 1
        elif head[k] == "(":
            level -= 1
            if level == 0:
                close = k
                break
    m = re.search(r"(\w+)\s*$", head[:close]) if close is not None else None
    return m.group(1) if m else "?"


def functions(text):
    """Yield (name, first_line, last_line) of each function definition in @text (1-based)."""
    code = blank_code(text)
    line_of = [0] * (len(code) + 1)
    ln = 1
    for k, ch in enumerate(code):
        line_of[k] = ln
        if ch == "\n":
            ln += 1
    depth = 0           # brace depth, not counting transparent extern "C" blocks
    transparent = []    # depths at which an extern "C" block opened
    head_start = 0      # offset where the text before the next block begins
    func = None         # (name, first_line, depth at open)
    for k, ch in enumerate(code):
        if ch == "{":
            if func is None and depth == (transparent[-1] if transparent else 0):
                head = code[head_start:k]
                if EXTERN_C.search(head.strip()) or head.strip().endswith('extern'):
                    transparent.append(depth + 1)
                elif "(" in head and "=" not in head and not AGGREGATE.match(head):
                    first = head_start + (len(head) - len(head.lstrip()))
                    func = (func_name(head), line_of[first], depth + 1)
            depth += 1
            head_start = k + 1
        elif ch == "}":
            if transparent and transparent[-1] == depth:
                transparent.pop()
            elif func is not None and func[2] == depth:
                yield func[0], func[1], line_of[k]
                func = None
            depth = max(depth - 1, 0)
            head_start = k + 1
        elif ch == ";":
            head_start = k + 1


def check(root, max_lines, max_func):
    """Return (breaches, stale exemptions) as lists of strings."""
    breaches, stale = [], []
    for rel in tracked_files(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        nlines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
        found = []
        if nlines > max_lines:
            found.append(f"{rel}:1: file has {nlines} lines (limit {max_lines})")
        for name, first, last in functions(text):
            if last - first + 1 > max_func:
                found.append(f"{rel}:{first}: function {name} has {last - first + 1} lines "
                             f"(limit {max_func})")
        if rel in EXEMPT:
            if not found:
                stale.append(f"{rel}: exempt ({EXEMPT[rel]}) but within the limits now: "
                             "remove it from EXEMPT")
            continue
        breaches += found
    return breaches, stale


def selftest():
    """The measurement itself: a 120-line function passes, 121 fails, whatever its layout."""
    def body(n):  # a definition spanning n lines, signature to closing brace
        return "static int\nf(int a,\n  int b)\n{\n" + "  a++; /* { */\n" * (n - 5) + "}\n"
    assert [(n, e - s + 1) for n, s, e in functions(body(120))] == [("f", 120)]
    assert [(n, e - s + 1) for n, s, e in functions(body(121))] == [("f", 121)]
    skip = ('#define M(x) { \\\n x; }\nstruct s { int a; };\n'
            'static const int t[] = {\n1,\n};\nconst char *q = "{";\n'
            'extern "C" {\n__global__ void __launch_bounds__(256) k(int a) {\n}\n}\n')
    assert list(functions(skip)) == [("k", 9, 10)], list(functions(skip))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--root", default=os.path.abspath(os.path.join(here, "..", "..")))
    ap.add_argument("--max-lines", type=int, default=MAX_FILE_LINES)
    ap.add_argument("--max-func", type=int, default=MAX_FUNC_LINES)
    ap.add_argument("--list", action="store_true",
                    help="print every function over --max-func, exempt files included")
    a = ap.parse_args()
    selftest()
    if a.list:
        for rel in tracked_files(a.root):
            with open(os.path.join(a.root, rel), encoding="utf-8", errors="replace") as f:
                for name, first, last in functions(f.read()):
                    if last - first + 1 > a.max_func:
                        print(f"{rel}:{first}: {name} {last - first + 1}")
        return 0
    breaches, stale = check(a.root, a.max_lines, a.max_func)
    for b in breaches + stale:
        print(b)
    if breaches or stale:
        print(f"check_sizes: {len(breaches)} over the limits, {len(stale)} stale exemptions")
        return 1
    print("check_sizes: every tracked source file within the limits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
