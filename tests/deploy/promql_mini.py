"""A small PromQL evaluator over two scrapes, for dashboard tests.

Enough of PromQL to run the queries Grafana dashboards for vLLM use:
numbers; selectors with label matchers (=, !=, =~, !~) and an optional range
([5m], [$__rate_interval]); rate(), increase(), irate(); sum/avg/max/min/count
with `by (...)` before or after the argument; histogram_quantile(); clamp_min(),
clamp_max(); binary + - * / between vectors (one-to-one on equal label sets)
or a vector and a number. Unsupported syntax raises ValueError naming it.

A range selector reads both scrapes: the earlier one is the start of the
range, the later its end (rate = difference / seconds between them); an
instant selector reads the later scrape. Template variables ($name) are
replaced from `variables` before parsing; $__rate_interval and
$__interval are durations.
"""

import math
import re

TOKEN = re.compile(r'\s*(?:(?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?)(?![a-zA-Z_:])|'
                   r'(?P<str>"(?:[^"\\]|\\.)*")|(?P<dur>\[[^\]]*\])|'
                   r'(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)|(?P<op>=~|!~|!=|[-+*/(){},=]))')
AGG = {"sum", "avg", "max", "min", "count"}
FUNCS = {"rate", "increase", "irate", "histogram_quantile", "clamp_min", "clamp_max"}


def parse_exposition(text, extra_labels=None):
    """Prometheus text -> {(name, frozenset(labels)): value}; extra_labels are added to
    every sample (what a scrape's target adds: job, instance, endpoint ...)."""
    out = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        if not m:
            raise ValueError("unparsable exposition line: %r" % line)
        labels = dict(label_re.findall(m.group(3) or ""))
        if extra_labels:
            for k, v in extra_labels.items():
                if k in labels:   # Prometheus would rename it exported_<k>
                    labels["exported_" + k] = labels[k]
                labels[k] = v
        v = m.group(4)
        out[(m.group(1), frozenset(labels.items()))] = float(
            {"+Inf": "inf", "-Inf": "-inf", "NaN": "nan"}.get(v, v))
    return out


class Evaluator:
    def __init__(self, before, after, seconds, variables=None):
        """before/after: parse_exposition() results; seconds between them."""
        self.before, self.after, self.seconds = before, after, float(seconds)
        self.variables = dict(variables or {})

    def eval(self, expr):
        """-> a list of (labels dict, value) or a float."""
        for k in sorted(self.variables, key=len, reverse=True):
            expr = expr.replace("$" + k, self.variables[k])
        expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
        if "$" in expr:
            raise ValueError("unknown template variable in %r" % expr)
        self.toks = [(k, v) for m in TOKEN.finditer(expr) for k, v in m.groupdict().items()
                     if v is not None]
        rest = TOKEN.sub("", expr).strip()
        if rest:
            raise ValueError("unsupported syntax %r in %r" % (rest, expr))
        self.i = 0
        v = self._binary()
        if self.i != len(self.toks):
            raise ValueError("unsupported syntax at %r in %r" % (self.toks[self.i:], expr))
        return v

    # -- parser ------------------------------------------------------------------
    def _peek(self, k=0):
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else (None, None)

    def _take(self, want=None):
        t = self._peek()
        if want is not None and t[1] != want:
            raise ValueError("expected %r, found %r" % (want, t[1]))
        self.i += 1
        return t

    def _binary(self):
        left = self._term()
        while self._peek()[1] in ("+", "-", "*", "/"):
            op = self._take()[1]
            left = self._apply(op, left, self._term())
        return left

    def _labels_list(self):
        self._take("(")
        names = []
        while self._peek()[1] != ")":
            names.append(self._take()[1])
            if self._peek()[1] == ",":
                self._take(",")
        self._take(")")
        return names

    def _term(self):
        kind, val = self._peek()
        if kind == "num":
            self._take()
            return float(val)
        if val == "(":
            self._take("(")
            v = self._binary()
            self._take(")")
            return v
        if kind == "name" and val in AGG and self._peek(1)[1] in ("(", "by", "without"):
            self._take()
            by = None
            if self._peek()[1] == "by":
                self._take()
                by = self._labels_list()
            elif self._peek()[1] == "without":
                raise ValueError("'without' is not supported")
            self._take("(")
            arg = self._binary()
            self._take(")")
            if self._peek()[1] == "by":
                self._take()
                by = self._labels_list()
            return self._aggregate(val, by or [], arg)
        if kind == "name" and val in FUNCS and self._peek(1)[1] == "(":
            self._take()
            self._take("(")
            args = [self._binary()]
            while self._peek()[1] == ",":
                self._take(",")
                args.append(self._binary())
            self._take(")")
            return self._call(val, args)
        if kind == "name":
            return self._selector()
        raise ValueError("unsupported token %r" % (val,))

    def _selector(self):
        name = self._take()[1]
        matchers = []
        if self._peek()[1] == "{":
            self._take("{")
            while self._peek()[1] != "}":
                label = self._take()[1]
                op = self._take()[1]
                value = self._take()[1]
                matchers.append((label, op, bytes(value[1:-1], "utf-8").decode(
                    "unicode_escape")))
                if self._peek()[1] == ",":
                    self._take(",")
            self._take("}")
        ranged = self._peek()[0] == "dur"
        if ranged:
            self._take()
        pick = lambda scrape: {ls: v for (n, ls), v in scrape.items()
                               if n == name and all(self._match(dict(ls), m) for m in matchers)}
        now = pick(self.after)
        if not ranged:
            return [(dict(ls), v) for ls, v in now.items()]
        then = pick(self.before)
        return ("range", [(dict(ls), then.get(ls, 0.0), v) for ls, v in now.items()])

    @staticmethod
    def _match(labels, m):
        label, op, want = m
        have = labels.get(label, "")
        if op == "=":
            return have == want
        if op == "!=":
            return have != want
        ok = re.fullmatch(want, have) is not None
        return ok if op == "=~" else not ok

    # -- evaluation --------------------------------------------------------------
    def _call(self, fn, args):
        if fn in ("rate", "increase", "irate"):
            if not (isinstance(args[0], tuple) and args[0][0] == "range"):
                raise ValueError("%s() needs a range selector" % fn)
            out = []
            for ls, v0, v1 in args[0][1]:
                d = v1 - v0 if v1 >= v0 else v1   # a counter reset
                out.append((self._drop_name(ls), d if fn == "increase" else d / self.seconds))
            return out
        if fn == "histogram_quantile":
            return self._quantile(args[0], args[1])
        bound = args[1]
        f = max if fn == "clamp_min" else min
        return [(ls, f(v, bound)) for ls, v in self._vector(args[0])]

    @staticmethod
    def _drop_name(ls):
        return {k: v for k, v in ls.items() if k != "__name__"}

    def _vector(self, v):
        if isinstance(v, tuple):
            raise ValueError("a range vector must be inside rate() or increase()")
        return v

    def _aggregate(self, op, by, arg):
        groups = {}
        for ls, v in self._vector(arg):
            key = tuple(sorted((k, ls[k]) for k in by if k in ls))
            groups.setdefault(key, []).append(v)
        fn = {"sum": sum, "avg": lambda xs: sum(xs) / len(xs), "max": max, "min": min,
              "count": len}[op]
        return [(dict(k), float(fn(vs))) for k, vs in groups.items()]

    def _apply(self, op, a, b):
        f = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
             "/": lambda x, y: x / y if y != 0 else (math.nan if x == 0 else
                                                        math.copysign(math.inf, x))}[op]
        if isinstance(a, float) and isinstance(b, float):
            return f(a, b)
        if isinstance(b, float):
            return [(ls, f(v, b)) for ls, v in self._vector(a)]
        if isinstance(a, float):
            return [(ls, f(a, v)) for ls, v in self._vector(b)]
        right = {frozenset(self._drop_name(ls).items()): v for ls, v in self._vector(b)}
        out = []
        for ls, v in self._vector(a):
            key = frozenset(self._drop_name(ls).items())
            if key in right:
                out.append((self._drop_name(ls), f(v, right[key])))
        return out

    def _quantile(self, q, vec):
        groups = {}
        for ls, v in self._vector(vec):
            if "le" not in ls:
                continue
            key = frozenset((k, x) for k, x in ls.items() if k not in ("le", "__name__"))
            groups.setdefault(key, []).append((float(ls["le"]), v))
        out = []
        for key, buckets in groups.items():
            buckets.sort()
            total = buckets[-1][1] if buckets and math.isinf(buckets[-1][0]) else math.nan
            if not total or math.isnan(total):
                out.append((dict(key), math.nan))
                continue
            rank, prev_le, prev_c = q * total, 0.0, 0.0
            value = math.nan
            for le, c in buckets:
                if c >= rank:
                    if math.isinf(le):
                        value = prev_le
                    else:
                        value = prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c)
                                                            if c > prev_c else 1.0)
                    break
                prev_le, prev_c = le, c
            out.append((dict(key), value))
        return out
