"""The reference renderer of chat templates, shared by test_chat_template.py and
test_chat_template_real.py: Python's jinja2 set up as transformers'
apply_chat_template sets it up (what vLLM renders with): a sandboxed environment with
trim_blocks, lstrip_blocks and the loopcontrols extension, tojson without ASCII escapes
(indent, separators, sort_keys), raise_exception(), strftime_now() and dict(). The
{% generation %} tag (transformers' assistant-token tracker) renders its body.
strftime_now reads the clock at NOW (a fixed epoch) so that a date-dependent template
renders the same text on both sides. Importing it without jinja2 exits 77 (skipped).
"""

import datetime
import json
import sys

try:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: jinja2 is not installed")
    sys.exit(77)

# 2024-07-26 12:00:00 UTC: the date the C side is given too (kvf_jinja_render --now)
NOW = 1721995200


class TemplateError(Exception):
    """raise_exception() from a template (its message is compared)."""


class _Generation(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def environment(now=NOW):
    def raise_exception(msg):
        raise TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(now).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = dict
    return env


_ENV = None
_COMPILED = {}


def render(template, variables):
    """The text; raises TemplateError (raise_exception) or another jinja2/Python error."""
    global _ENV
    if _ENV is None:
        _ENV = environment()
    if template not in _COMPILED:
        _COMPILED[template] = _ENV.from_string(template)
    return _COMPILED[template].render(**variables)
