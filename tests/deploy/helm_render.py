"""Render a Helm chart's templates without Helm: the subset of Go's
text/template and of Helm's functions that deploy/helm/kvferry uses, and
nothing else (anything outside it is an error, never silently empty).

Supported:
  actions      {{ pipeline }}, {{- trim left, trim right -}}, {{/* comments */}}
  control      if / else if / else / end, range [$i, $v :=] pipeline / else / end,
               with pipeline / else / end, define "name" / end, template "name" pipeline
  variables    $x := pipeline, $x = pipeline, $ (the root), $x.Field
  operands     .Field.Field, ., "string", `raw`, numbers, true, false, ( pipeline )
  pipelines    a | f b  ==  f b a
  functions    include quote default toYaml nindent indent printf add sub mul div int
               until eq ne lt le gt ge not and or required trunc trimSuffix join list
               dict index ternary fail empty len replace
  objects      .Values (values.yaml deep-merged with overrides; null deletes),
               .Release.Name/.Namespace/.Service/.IsInstall/.Revision,
               .Chart.Name/.Version/.AppVersion, .Template.Name

Go semantics kept: truthiness (false, 0, "", nil, empty list/map are false),
map keys in sorted order in range, `and`/`or` returning an operand, sprig's
default treating any empty value as unset, toYaml with sorted keys and no
trailing newline. Stricter than Helm: printing a missing value, reading a
field of a missing value, printing a list or map, and an unknown function
are errors naming the template and the action.

    from helm_render import render_chart
    docs = render_chart("deploy/helm/kvferry", {"prefill": {"replicas": 2}})
    # -> [(template file, parsed YAML document), ...]
"""

import json
import os
import re

import yaml


class TemplateError(Exception):
    pass


MISSING = None   # what .Values.nope evaluates to


# ---------------------------------------------------------------- parsing

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)


def _lex(src, name):
    """[("text", s) | ("act", body)] with the trim markers applied."""
    out, pos = [], 0
    for m in _ACTION.finditer(src):
        text = src[pos:m.start()]
        if m.group(1):
            text = text.rstrip(" \t\r\n")
        out.append(["text", text])
        body = m.group(2).strip()
        if not (body.startswith("/*") and body.endswith("*/")):
            out.append(["act", body])
        out.append(["trim_next", bool(m.group(3))])
        pos = m.end()
    out.append(["text", src[pos:]])
    if "{{" in src[pos:]:
        raise TemplateError("%s: unclosed action near %r" % (name, src[pos:][:40]))
    toks, trim = [], False
    for kind, v in out:
        if kind == "trim_next":
            trim = v
            continue
        if kind == "text":
            if trim:
                v = v.lstrip(" \t\r\n")
            trim = False
            if v:
                toks.append(("text", v))
        else:
            toks.append(("act", v))
    return toks


_TOKEN = re.compile(r"""\s*(?:
    (?P<str>"(?:[^"\\]|\\.)*") | (?P<raw>`[^`]*`) |
    (?P<num>-?\d+(?:\.\d+)?(?![\w.])) |
    (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*) |
    (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.) |
    (?P<id>[A-Za-z_][A-Za-z0-9_]*) |
    (?P<op>:=|=|\||\(|\)|,))""", re.X)


def _tokens(expr, where):
    out, pos = [], 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise TemplateError("%s: cannot parse %r at %r" % (where, expr, expr[pos:]))
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Node:
    def __init__(self, kind, **kw):
        self.kind = kind
        self.__dict__.update(kw)


def _parse(toks, name):
    """Nodes of one template file; defines collected separately."""
    defines = {}
    pos = [0]

    def block(stop):
        nodes = []
        while pos[0] < len(toks):
            kind, v = toks[pos[0]]
            if kind == "text":
                nodes.append(_Node("text", text=v))
                pos[0] += 1
                continue
            word = v.split(None, 1)[0] if v else ""
            rest = v[len(word):].strip()
            if word in stop or (word == "else" and "else" in stop):
                return nodes, word, rest
            pos[0] += 1
            where = "%s: {{ %s }}" % (name, v)
            if word == "if":
                nodes.append(if_node(rest, where))
            elif word in ("range", "with"):
                body, w, _ = block(("end", "else"))
                other = []
                if w == "else":
                    pos[0] += 1
                    other, w, _ = block(("end",))
                if w != "end":
                    raise TemplateError("%s: no {{ end }}" % where)
                pos[0] += 1
                vars_, expr = [], rest
                m = re.match(r"^(\$\w+)\s*(?:,\s*(\$\w+)\s*)?:=\s*(.*)$", rest, re.S)
                if m:
                    vars_ = [x for x in (m.group(1), m.group(2)) if x]
                    expr = m.group(3)
                nodes.append(_Node(word, vars=vars_, pipe=_tokens(expr, where), body=body,
                                   other=other, where=where))
            elif word == "define":
                m = re.match(r'^"([^"]+)"$', rest)
                if not m:
                    raise TemplateError("%s: define needs a quoted name" % where)
                body, w, _ = block(("end",))
                if w != "end":
                    raise TemplateError("%s: no {{ end }}" % where)
                pos[0] += 1
                defines[m.group(1)] = body
            elif word == "template":
                nodes.append(_Node("action", pipe=_tokens("include " + rest, where),
                                   where=where))
            elif word in ("end", "else"):
                raise TemplateError("%s: {{ %s }} without a block" % (where, word))
            else:
                nodes.append(_Node("action", pipe=_tokens(v, where), where=where))
        if stop:
            raise TemplateError("%s: a block has no {{ end }}" % name)
        return nodes, None, None

    def if_node(cond, where):
        branches = []
        while True:
            body, w, rest = block(("end", "else"))
            branches.append((_tokens(cond, where), body))
            if w == "end":
                pos[0] += 1
                return _Node("if", branches=branches, other=[], where=where)
            if w != "else":
                raise TemplateError("%s: no {{ end }}" % where)
            pos[0] += 1
            if rest.startswith("if "):
                cond = rest[3:]
                continue
            other, w, _ = block(("end",))
            if w != "end":
                raise TemplateError("%s: no {{ end }}" % where)
            pos[0] += 1
            return _Node("if", branches=branches, other=other, where=where)

    nodes, _, _ = block(())
    return nodes, defines


# ---------------------------------------------------------------- values

def truthy(v):
    if v is None or v is False:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, (str, list, dict, tuple)):
        return len(v) > 0
    return True


def _gostr(v, where):
    if v is None:
        raise TemplateError("%s: prints a missing value" % where)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return ("%d" % v) if v == int(v) and abs(v) < 1e21 else repr(v)
    if isinstance(v, (list, dict, tuple)):
        raise TemplateError("%s: prints a list or map (use toYaml)" % where)
    return str(v)


def _to_yaml(v):
    if v in ({}, []):
        return "{}" if v == {} else "[]"
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n")


def _indent(n, s):
    pad = " " * int(n)
    return pad + s.replace("\n", "\n" + pad)


def _printf(where, fmt, *args):
    args = list(args)
    out = []

    def sub(m):
        verb = m.group(0)
        if verb == "%%":
            return "%"
        if not args:
            raise TemplateError("%s: printf %r has too few arguments" % (where, fmt))
        a = args.pop(0)
        if verb == "%d":
            return str(int(a))
        if verb == "%q":
            return json.dumps(_gostr(a, where))
        return _gostr(a, where)
    out = re.sub(r"%[sdvq%]", sub, fmt)
    if args:
        raise TemplateError("%s: printf %r has extra arguments" % (where, fmt))
    return out


def _required(where, msg, v):
    if v is None or v == "":
        raise TemplateError("%s: required: %s" % (where, msg))
    return v


def _fail(where, msg):
    raise TemplateError("%s: fail: %s" % (where, msg))


def _index(where, m, keys):
    for k in keys:
        if isinstance(m, dict):
            m = m.get(k, MISSING)
        elif isinstance(m, list) and isinstance(k, int) and 0 <= k < len(m):
            m = m[k]
        else:
            raise TemplateError("%s: index %r of %r" % (where, k, type(m).__name__))
    return m


def _num(where, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TemplateError("%s: %r is not a number" % (where, v))
    return v


FUNCS = {
    "quote": lambda w, *a: " ".join(json.dumps(_gostr(x, w)) for x in a if x is not None),
    "default": lambda w, d, v=None: v if truthy(v) else d,
    "toYaml": lambda w, v: _to_yaml(v),
    "nindent": lambda w, n, s: "\n" + _indent(n, s),
    "indent": lambda w, n, s: _indent(n, s),
    "printf": _printf,
    "add": lambda w, *a: sum(_num(w, x) for x in a),
    "sub": lambda w, a, b: _num(w, a) - _num(w, b),
    "mul": lambda w, a, b: _num(w, a) * _num(w, b),
    "div": lambda w, a, b: int(_num(w, a)) // int(_num(w, b)),
    "dict": lambda w, *a: dict(zip(a[::2], a[1::2])),
    "ternary": lambda w, a, b, cond: a if truthy(cond) else b,
    "fail": lambda w, msg: _fail(w, msg),
    "index": lambda w, m, *keys: _index(w, m, keys),
    "int": lambda w, v: int(float(v)) if v not in (None, "") else 0,
    "until": lambda w, n: list(range(int(n))),
    "eq": lambda w, a, *b: any(a == x for x in b),
    "ne": lambda w, a, b: a != b,
    "lt": lambda w, a, b: _num(w, a) < _num(w, b),
    "le": lambda w, a, b: _num(w, a) <= _num(w, b),
    "gt": lambda w, a, b: _num(w, a) > _num(w, b),
    "ge": lambda w, a, b: _num(w, a) >= _num(w, b),
    "not": lambda w, v: not truthy(v),
    "required": _required,
    "trunc": lambda w, n, s: s[:int(n)] if int(n) >= 0 else s[int(n):],
    "trimSuffix": lambda w, suf, s: s[:-len(suf)] if suf and s.endswith(suf) else s,
    "join": lambda w, sep, l: sep.join(_gostr(x, w) for x in l),
    "list": lambda w, *a: list(a),
    "empty": lambda w, v: not truthy(v),
    "len": lambda w, v: len(v),
    "replace": lambda w, old, new, s: _gostr(s, w).replace(_gostr(old, w), _gostr(new, w)),
}


# ---------------------------------------------------------------- evaluation

class _Renderer:
    def __init__(self, defines):
        self.defines = defines

    def field(self, v, path, where):
        for part in path:
            if v is None:
                raise TemplateError("%s: reads .%s of a missing value" % (where, part))
            if isinstance(v, dict):
                v = v.get(part, MISSING)
            else:
                raise TemplateError("%s: .%s of a %s" % (where, part, type(v).__name__))
        return v

    def operand(self, toks, i, dot, scope, where):
        kind, v = toks[i]
        if kind == "str":
            return json.loads(v), i + 1
        if kind == "raw":
            return v[1:-1], i + 1
        if kind == "num":
            return (float(v) if "." in v else int(v)), i + 1
        if kind == "field":
            return (dot if v == "." else self.field(dot, v[1:].split("."), where)), i + 1
        if kind == "var":
            name, *path = v.split(".")
            for s in reversed(scope):
                if name in s:
                    return self.field(s[name], path, where), i + 1
            raise TemplateError("%s: undefined variable %s" % (where, name))
        if kind == "id" and v in ("true", "false"):
            return v == "true", i + 1
        if kind == "id" and v == "nil":
            return None, i + 1
        if kind == "op" and v == "(":
            depth, j = 1, i + 1
            while j < len(toks) and depth:
                depth += {"(": 1, ")": -1}.get(toks[j][1], 0) if toks[j][0] == "op" else 0
                j += 1
            if depth:
                raise TemplateError("%s: unbalanced (" % where)
            return self.pipeline(toks[i + 1:j - 1], dot, scope, where), j
        raise TemplateError("%s: unexpected %r" % (where, v))

    def command(self, toks, dot, scope, where, piped=()):
        if toks[0][0] == "id" and toks[0][1] not in ("true", "false", "nil"):
            fn = toks[0][1]
            args, i = [], 1
            while i < len(toks):
                a, i = self.operand(toks, i, dot, scope, where)
                args.append(a)
            args += list(piped)
            if fn in ("and", "or"):
                for a in args:
                    if truthy(a) != (fn == "and"):
                        return a
                return args[-1]
            if fn == "include":
                if len(args) != 2:
                    raise TemplateError("%s: include needs a name and a context" % where)
                if args[0] not in self.defines:
                    raise TemplateError("%s: no template %r" % (where, args[0]))
                # as in Go: $ inside the included template is the data passed to it
                return self.block(self.defines[args[0]], args[1], [{"$": args[1]}])
            if fn not in FUNCS:
                raise TemplateError("%s: function %r is not in the supported subset" % (where, fn))
            try:
                return FUNCS[fn](where, *args)
            except TypeError as e:
                raise TemplateError("%s: %s: %s" % (where, fn, e))
        if len(toks) != 1 or piped:
            v, i = self.operand(toks, 0, dot, scope, where)
            if i != len(toks) or piped:
                raise TemplateError("%s: %r is not a function" % (where, toks[0][1]))
            return v
        return self.operand(toks, 0, dot, scope, where)[0]

    def pipeline(self, toks, dot, scope, where):
        if len(toks) >= 2 and toks[0][0] == "var" and toks[1] in (("op", ":="), ("op", "=")):
            v = self.pipeline(toks[2:], dot, scope, where)
            name = toks[0][1]
            if toks[1][1] == ":=":
                scope[-1][name] = v
            else:
                for s in reversed(scope):
                    if name in s:
                        s[name] = v
                        break
                else:
                    raise TemplateError("%s: assignment to undefined %s" % (where, name))
            return ""
        cmds, cur = [], []
        depth = 0
        for t in toks:
            if t == ("op", "|") and depth == 0:
                cmds.append(cur)
                cur = []
                continue
            depth += {"(": 1, ")": -1}.get(t[1], 0) if t[0] == "op" else 0
            cur.append(t)
        cmds.append(cur)
        if any(not c for c in cmds):
            raise TemplateError("%s: empty command in a pipeline" % where)
        v = self.command(cmds[0], dot, scope, where)
        for c in cmds[1:]:
            v = self.command(c, dot, scope, where, piped=(v,))
        return v

    def block(self, nodes, dot, scope):
        out = []
        scope = scope + [{}]
        for n in nodes:
            if n.kind == "text":
                out.append(n.text)
            elif n.kind == "action":
                is_assign = len(n.pipe) >= 2 and n.pipe[1] in (("op", ":="), ("op", "="))
                v = self.pipeline(n.pipe, dot, scope, n.where)
                if not is_assign:
                    out.append(_gostr(v, n.where))
            elif n.kind == "if":
                for cond, body in n.branches:
                    if truthy(self.pipeline(cond, dot, scope, n.where)):
                        out.append(self.block(body, dot, scope))
                        break
                else:
                    out.append(self.block(n.other, dot, scope))
            elif n.kind == "with":
                v = self.pipeline(n.pipe, dot, scope, n.where)
                out.append(self.block(n.body, v, scope) if truthy(v) else
                           self.block(n.other, dot, scope))
            elif n.kind == "range":
                v = self.pipeline(n.pipe, dot, scope, n.where)
                if isinstance(v, dict):
                    items = [(k, v[k]) for k in sorted(v)]
                elif isinstance(v, (list, tuple)):
                    items = list(enumerate(v))
                elif v is None:
                    items = []
                else:
                    raise TemplateError("%s: range over a %s" % (n.where, type(v).__name__))
                if not items:
                    out.append(self.block(n.other, dot, scope))
                for k, e in items:
                    s = {}
                    if len(n.vars) == 1:
                        s[n.vars[0]] = e
                    elif len(n.vars) == 2:
                        s[n.vars[0]], s[n.vars[1]] = k, e
                    out.append(self.block(n.body, e, scope + [s]))
        return "".join(out)


def render_string(src, values=None, defines_src=(), name="template"):
    """Render one template source with .Values = values (for the renderer's own checks)."""
    defines = {}
    for i, d in enumerate(defines_src):
        defines.update(_parse(_lex(d, "defines%d" % i), "defines%d" % i)[1])
    nodes, own = _parse(_lex(src, name), name)
    defines.update(own)
    root = {"Values": values or {}, "Release": {"Name": "r", "Namespace": "default"},
            "Chart": {"Name": "c"}}
    return _Renderer(defines).block(nodes, root, [{"$": root}])


def merge(base, over):
    """Helm's values merge: maps merge recursively, anything else replaces; None deletes."""
    out = dict(base)
    for k, v in (over or {}).items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def render_chart(chart_dir, overrides=None, release="kvferry", namespace="default"):
    """[(file name, YAML document)] of every manifest the chart's templates render
    (files starting with _ hold defines only; NOTES.txt is rendered, not parsed)."""
    with open(os.path.join(chart_dir, "Chart.yaml")) as f:
        chart = yaml.safe_load(f)
    with open(os.path.join(chart_dir, "values.yaml")) as f:
        values = merge(yaml.safe_load(f) or {}, overrides)
    tdir = os.path.join(chart_dir, "templates")
    files = sorted(os.listdir(tdir))
    parsed, defines = {}, {}
    for fn in files:
        with open(os.path.join(tdir, fn)) as f:
            nodes, d = _parse(_lex(f.read(), fn), fn)
        for k in d:
            if k in defines:
                raise TemplateError("%s: template %r defined twice" % (fn, k))
        defines.update(d)
        parsed[fn] = nodes
    root = {"Values": values,
            "Release": {"Name": release, "Namespace": namespace, "Service": "Helm",
                        "IsInstall": True, "Revision": 1},
            "Chart": {"Name": chart["name"], "Version": chart["version"],
                      "AppVersion": chart.get("appVersion", "")}}
    r = _Renderer(defines)
    out = []
    for fn in files:
        if fn.startswith("_"):
            continue
        root["Template"] = {"Name": "%s/templates/%s" % (chart["name"], fn),
                            "BasePath": "%s/templates" % chart["name"]}
        text = r.block(parsed[fn], root, [{"$": root}])
        if fn == "NOTES.txt":
            continue
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as e:
            raise TemplateError("%s renders invalid YAML: %s\n%s" % (fn, e, text))
        out += [(fn, d) for d in docs if d]
    return out
