#!/usr/bin/env python3
"""Tool calling through the official `openai` client against 2p2d pools (issue 43;
deploy/proxy/kvf_proxy_tools.h), one pool per --tool-call-parser (hermes, llama3_json,
mistral) with --enable-auto-tool-choice, on a scripted checkpoint (scripted_model.py) whose
output is known token for token, so each parsed call is asserted exactly:

- round 1: tools reach the template (the prompt's token count is that of the rendering the
  test writes itself), the model's call comes back as message.tool_calls (name, arguments
  as Python's json.dumps writes them, a vLLM-shaped id), content the text before the call
  (hermes) or null, finish_reason "tool_calls"; streamed: the content deltas, then the call
  as tool-call deltas adding up to the same call, finish_reason "tool_calls";
- a call generated over several tokens streams as vLLM's does: its first delta (index, id,
  type, name, no arguments) once the name is whole, then argument pieces (more than one)
  adding up to the non-streamed arguments; two calls by index 0 then 1; its opening tag
  split over two tokens never shows as content; cut off by max_tokens or with arguments
  that are not JSON, the non-streamed answer's content and finish_reason ("length",
  "stop") streamed too;
- round 2: the assistant's call and the tool's result (role tool, tool_call_id) rendered by
  the template; the final answer is content with finish_reason "stop", streamed and not;
- malformed call text (a lone <tool_call>) comes back as content, never an error;
- tool_choice "required" and a named function are refused by name (no constrained
  decoding); tool_choice "none" renders the tools and parses nothing; parallel_tool_calls
  false keeps the first call.
The llama3_json and mistral outputs are picked with allowed_token_ids (the checkpoint's
assistant token has a successor per format); the final answer with allowed_token_ids too.
- --reasoning-parser qwen3 and deepseek_r1: <think> text as reasoning_content, apart from
  the content, streamed too; an unclosed block read as each parser reads it; reasoning then
  a tool call; include_reasoning false.
Skipped (exit 77) without the openai package.
"""

import json
import os
import sys
import tempfile
import urllib.request

from kvf_e2e import Pool
import scripted_model

try:
    import openai
except ImportError:
    print("SKIP: the openai package is not installed (pip install openai)")
    sys.exit(77)

CALL = '{"name":"get_weather","arguments":{"city":"Oslo"}}'
CALL2 = '{"name":"get_time","arguments":{"tz":"CET","exact":true}}'
TOKENS = [("<|assistant|>", True), ("<|end|>", True), ("Checking...", False),
          ("<tool_call>", False), (CALL, False), ("</tool_call>", False),
          ('{"name":"get_weather","parameters":{"city":"Oslo"}}', False),
          ("[TOOL_CALLS]", False), ("[" + CALL + "]", False), ("Sunny_in_Oslo.", False),
          ("<think>", False), ("Plan.", False), ("</think>", False),
          ("</tool_call><tool_call>", False), (CALL2, False)]
# the call again over several tokens (its name, then its arguments in pieces), its opening
# tag split in two, and a call whose arguments are not JSON
SPLIT = ['{"name":"get_weather",', '"arguments":{"city":', '"Os', 'lo"', '}}']
BADARGS = '"arguments":{"city":Oslo}}'
TOKENS += [(t, False) for t in SPLIT + ["<tool_", "call>", BADARGS]]
RULES = [("<|assistant|>", "Checking...", 1.0), ("Checking...", "<tool_call>", 1.0),
         ("<tool_call>", CALL, 1.0), ("<tool_call>", "<eos>", 0.5),
         ("<|assistant|>", "<tool_call>", 0.3), (CALL, "</tool_call>", 1.0), ("</tool_call>", "<eos>", 1.0),
         ("<|assistant|>", TOKENS[6][0], 0.9), (TOKENS[6][0], "<eos>", 1.0),
         ("<|assistant|>", "[TOOL_CALLS]", 0.8), ("[TOOL_CALLS]", TOKENS[8][0], 1.0),
         (TOKENS[8][0], "<eos>", 1.0),
         ("<|assistant|>", "Sunny_in_Oslo.", 0.6), ("Sunny_in_Oslo.", "<eos>", 1.0),
         ("<|assistant|>", "<think>", 0.7), ("<think>", "Plan.", 1.0),
         ("Plan.", "</think>", 1.0), ("Plan.", "<eos>", 0.5),
         ("</think>", "Sunny_in_Oslo.", 1.0), ("</think>", "<tool_call>", 0.8),
         (CALL, "</tool_call><tool_call>", 0.8), ("</tool_call><tool_call>", CALL2, 1.0),
         (CALL2, "</tool_call>", 1.0),
         ("Checking...", "<tool_", 0.6), ("<tool_", "call>", 1.0),
         ("call>", SPLIT[0], 1.0), (SPLIT[0], BADARGS, 0.4), (BADARGS, "</tool_call>", 1.0),
         (SPLIT[-1], "</tool_call><tool_call>", 1.0)] + [
    (a, b, 1.0) for a, b in zip(SPLIT, SPLIT[1:] + ["</tool_call>"])]
# the test's own template: tools as JSON lines, calls and results as tagged text
TEMPLATE = (
    "{% if tools %}<|system|>tools:{% for t in tools %};{{ t | tojson }}{% endfor %}<|end|>"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|assistant|>{{ m.content }}"
    "{% for c in m.tool_calls %}<call {{ c.id }}>{{ c.function.name }}"
    "({{ c.function.arguments | tojson }})</call>{% endfor %}<|end|>"
    "{% elif m.role == 'tool' %}<|tool|>{{ m.tool_call_id }}={{ m.content }}<|end|>"
    "{% else %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"type": "string"}}}}}
USER = {"role": "user", "content": "Weather in Oslo?"}


def ok(cond, what, detail=None):
    if not cond:
        raise AssertionError(what if detail is None else "%s\n%s" % (what, detail))
    print("ok: " + what)


def count(pool, text):
    req = urllib.request.Request(pool.url + "/tokenize", data=json.dumps(
        {"prompt": text, "add_special_tokens": False}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["count"]


def rendered(messages, tools):
    """TEMPLATE by hand (json.dumps is what tojson writes)."""
    out = ""
    if tools:
        out += "<|system|>tools:" + "".join(
            ";" + json.dumps({"type": "function", "function": {
                "name": t["function"]["name"], "description": t["function"]["description"],
                "parameters": t["function"]["parameters"]}}) for t in tools) + "<|end|>"
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            out += "<|assistant|>" + (m.get("content") or "") + "".join(
                "<call %s>%s(%s)</call>" % (c["id"], c["function"]["name"],
                                            json.dumps(json.loads(c["function"]["arguments"])))
                for c in m["tool_calls"]) + "<|end|>"
        elif m["role"] == "tool":
            out += "<|tool|>%s=%s<|end|>" % (m["tool_call_id"], m["content"])
        else:
            out += "<|%s|>%s<|end|>" % (m["role"], m["content"])
    return out + "<|assistant|>"


def stream(c, events=None, **kw):
    """A client's sum of the deltas; @a events (a list) gets each chunk's pieces in order:
    ("content", text), ("call", index, id, name, arguments or None), ("args", index, text)."""
    content, calls, finish = "", {}, None
    events = [] if events is None else events
    for ch in c.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        if d.content:
            events.append(("content", d.content))
        for tc in d.tool_calls or []:
            cur = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            cur["id"] = tc.id or cur["id"]
            if tc.id is not None:
                events.append(("call", tc.index, tc.id, tc.function.name, tc.function.arguments))
            elif tc.function is not None:
                events.append(("args", tc.index, tc.function.arguments))
            if tc.function is not None:
                cur["name"] += tc.function.name or ""
                cur["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def run(pool, parser, ids):
    c = openai.OpenAI(base_url=pool.url + "/v1", api_key="none", max_retries=0)
    name = c.models.list().data[0].id
    eos = ids["<eos>"]
    pick = {"hermes": None, "llama3_json": [ids[TOKENS[6][0]], eos],
            "mistral": [ids["[TOOL_CALLS]"], ids[TOKENS[8][0]], eos]}[parser]
    extra = {"allowed_token_ids": pick} if pick else {}
    want_content = "Checking..." if parser == "hermes" else None
    kw = dict(model=name, messages=[USER], tools=[TOOL], max_tokens=8, temperature=0,
              extra_body=extra)
    # -- round 1 -----------------------------------------------------------------------
    r = c.chat.completions.create(**kw)
    m = r.choices[0].message
    ok(r.usage.prompt_tokens == count(pool, rendered([USER], [TOOL])),
       "%s: the tools reach the template" % parser,
       (r.usage.prompt_tokens, count(pool, rendered([USER], [TOOL])), rendered([USER], [TOOL])))
    ok(r.choices[0].finish_reason == "tool_calls" and len(m.tool_calls) == 1 and
       m.tool_calls[0].type == "function" and m.tool_calls[0].function.name == "get_weather" and
       m.tool_calls[0].function.arguments == '{"city": "Oslo"}' and m.content == want_content,
       "%s: the call parsed exactly, content %r, finish_reason tool_calls" %
       (parser, want_content), r.model_dump())
    tid = m.tool_calls[0].id
    ok(tid.startswith("chatcmpl-tool-") and len(tid) == 46 if parser != "mistral" else
       len(tid) == 9 and tid.isalnum(), "%s: a vLLM-shaped call id (%s)" % (parser, tid))
    content, calls, finish = stream(c, **kw)
    ok(content == (want_content or "") and finish == "tool_calls" and len(calls) == 1 and
       calls[0]["name"] == "get_weather" and calls[0]["arguments"] == '{"city": "Oslo"}' and
       calls[0]["id"], "%s: streamed, the same call as a tool-call delta" % parser,
       (content, calls, finish))
    # -- round 2: the call and its result rendered, the final answer ----------------------
    msgs = [USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": tid, "type": "function", "function": {
            "name": "get_weather", "arguments": m.tool_calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": tid, "content": "sunny"}]
    kw2 = dict(model=name, messages=msgs, tools=[TOOL], max_tokens=8, temperature=0,
               extra_body={"allowed_token_ids": [ids["Sunny_in_Oslo."], eos]})
    r2 = c.chat.completions.create(**kw2)
    ok(r2.usage.prompt_tokens == count(pool, rendered(msgs, [TOOL])),
       "%s: the assistant's call and the tool result (tool_call_id) rendered" % parser,
       (r2.usage.prompt_tokens, rendered(msgs, [TOOL])))
    ok(r2.choices[0].message.content == "Sunny_in_Oslo." and not r2.choices[0].message.tool_calls
       and r2.choices[0].finish_reason == "stop", "%s: the final answer" % parser,
       r2.model_dump())
    content, calls, finish = stream(c, **kw2)
    ok(content == "Sunny_in_Oslo." and not calls and finish == "stop",
       "%s: the final answer streamed" % parser, (content, calls, finish))
    return c, name


def extras(c, name, ids):
    """On the hermes pool: malformed text, tool_choice values, parallel_tool_calls."""
    lone = {"allowed_token_ids": [ids["<tool_call>"], ids["<eos>"]]}
    kw = dict(model=name, messages=[USER], tools=[TOOL], max_tokens=4, temperature=0)
    r = c.chat.completions.create(extra_body=lone, **kw)
    ok(r.choices[0].message.content == "<tool_call>" and not r.choices[0].message.tool_calls
       and r.choices[0].finish_reason == "stop", "a malformed call is returned as content",
       r.model_dump())
    content, calls, finish = stream(c, extra_body=lone, **kw)
    ok(content == "<tool_call>" and not calls and finish == "stop",
       "a malformed call streamed as content")
    r = c.chat.completions.create(tool_choice="none", **kw)
    ok(r.choices[0].message.content == "Checking..." + "<tool_call>" + CALL + "</tool_call>"
       and not r.choices[0].message.tool_calls, "tool_choice none: nothing parsed",
       r.model_dump())
    two = {"logit_bias": {str(ids["</tool_call><tool_call>"]): 20}}   # a second call
    kw["max_tokens"] = 8
    r = c.chat.completions.create(extra_body=two, **kw)
    calls = r.choices[0].message.tool_calls
    ok([(t.function.name, t.function.arguments) for t in calls] ==
       [("get_weather", '{"city": "Oslo"}'), ("get_time", '{"tz": "CET", "exact": true}')] and
       calls[0].id != calls[1].id and r.choices[0].message.content == "Checking...",
       "two calls in one output: both parsed, in order", r.model_dump())
    content, scalls, finish = stream(c, extra_body=two, **kw)
    ok([(t["name"], t["arguments"]) for t in scalls] ==
       [(t.function.name, t.function.arguments) for t in calls] and finish == "tool_calls",
       "two calls streamed as deltas of index 0 and 1")
    r = c.chat.completions.create(parallel_tool_calls=False, extra_body=two, **kw)
    ok([t.function.name for t in r.choices[0].message.tool_calls] == ["get_weather"],
       "parallel_tool_calls false: the first call only")
    incremental(c, name, ids)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        try:
            c.chat.completions.create(tool_choice=choice, **kw)
            ok(False, "tool_choice %r refused" % (choice,))
        except openai.BadRequestError as e:
            flat = e.response.json()
            ok(flat["param"] == "tool_choice" and "constrained decoding" in flat["message"],
               "tool_choice %r: 400 naming it (no constrained decoding)" % (choice,))
    for field, value in (("tools", [{"type": "function"}]), ("tools", {}),
                         ("parallel_tool_calls", 1)):
        try:
            c.chat.completions.create(model=name, messages=[USER], max_tokens=2,
                                      extra_body={field: value})
            ok(False, "%s=%r refused" % (field, value))
        except openai.BadRequestError as e:
            ok(e.response.json()["param"] == field, "%s=%r: 400 naming it" % (field, value))


def incremental(c, name, ids):
    """A call generated over several tokens streams as it comes (vLLM's deltas): its first
    delta (index, id, type, name, no arguments) as soon as the name is whole, then its
    arguments in pieces that add up to the non-streamed ones; parallel calls by index; the
    opening tag split over two tokens never shows as content. Cut off by max_tokens, or with
    arguments that are not JSON: the content and finish_reason of the non-streamed answer
    (all text; "length" or "stop"), the name already sent standing."""
    path = ["Checking...", "<tool_", "call>"] + SPLIT + ["</tool_call>", "<eos>"]
    kw = dict(model=name, messages=[USER], tools=[TOOL], max_tokens=16, temperature=0,
              extra_body={"allowed_token_ids": [ids[t] for t in path]})
    r = c.chat.completions.create(**kw)
    m = r.choices[0].message
    ok(m.content == "Checking..." and r.choices[0].finish_reason == "tool_calls" and
       [(t.function.name, t.function.arguments) for t in m.tool_calls] ==
       [("get_weather", '{"city": "Oslo"}')], "a call over %d tokens parsed" % len(SPLIT),
       r.model_dump())
    # tokens that reach kvf-proxy together share a delta: a loaded machine may batch a few,
    # so the pieces are asked of one of three tries (each must add up exactly)
    for attempt in range(3):
        ev = []
        content, calls, finish = stream(c, events=ev, **kw)
        pieces = [e[2] for e in ev if e[0] == "args"]
        ok(content == "Checking..." and finish == "tool_calls" and
           [(t["name"], t["arguments"]) for t in calls] ==
           [(t.function.name, t.function.arguments) for t in m.tool_calls],
           "streamed: the same call, no markup in the content (its tag split over two tokens)",
           (content, calls, finish, ev))
        if ([e[0] for e in ev][:2] == ["content", "call"] and ev[1][1:2] == (0,) and
                ev[1][3] == "get_weather" and ev[1][4] is None and
                ev[1][2].startswith("chatcmpl-tool-") and len(pieces) > 1 and
                all(e[0] == "args" and e[1] == 0 for e in ev[2:])):
            break
    ok(len(pieces) > 1 and ev[1][0] == "call" and ev[1][4] is None,
       "the name first (index, id, type, no arguments), then %d argument deltas %r (try %d)" %
       (len(pieces), pieces, attempt + 1), ev)
    # with logprobs every token has its own chunk: the call's pieces go out between them,
    # as far as the tokens sent, whatever reached kvf-proxy together
    ev = []
    content, calls, finish = stream(c, events=ev, logprobs=True, **kw)
    ok(content == "Checking..." and finish == "tool_calls" and
       [(t["name"], t["arguments"]) for t in calls] == [("get_weather", '{"city": "Oslo"}')] and
       [e for e in ev if e[0] != "call"] == [("content", "Checking...")] + [
           ("args", 0, p) for p in ('{"city": ', '"Os', 'lo"', '}')] and
       [e[3:] for e in ev if e[0] == "call"] == [("get_weather", None)],
       "with logprobs (a chunk per token): the name, then a piece per token", ev)
    # two calls, the first over several tokens
    two = dict(kw, extra_body={"allowed_token_ids": [ids[t] for t in path + [
        "</tool_call><tool_call>", CALL2]], "logit_bias": {str(ids["</tool_call><tool_call>"]): 10}})
    r = c.chat.completions.create(**two)
    want = [(t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls]
    ev = []
    content, calls, finish = stream(c, events=ev, **two)
    heads = [e for e in ev if e[0] == "call"]
    ok(want == [("get_weather", '{"city": "Oslo"}'), ("get_time", '{"tz": "CET", "exact": true}')]
       and [(t["name"], t["arguments"]) for t in calls] == want and finish == "tool_calls" and
       [h[1] for h in heads] == [0, 1] and heads[0][2] != heads[1][2] and
       all(e[1] == 0 for e in ev[:ev.index(heads[1])] if e[0] == "args") and
       content == "Checking...", "parallel calls streamed with indexes 0 and 1, in order", ev)
    # cut off by max_tokens inside the call: as the non-streamed answer, all text, "length"
    for cut in (4, 6):
        short = dict(kw, max_tokens=cut)
        r = c.chat.completions.create(**short)
        content, calls, finish = stream(c, **short)
        ok(r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls and
           content == r.choices[0].message.content and finish == "length" and
           r.choices[0].message.content.startswith("Checking...<tool_call>{") and
           [t["name"] for t in calls] in ([], ["get_weather"]),
           "cut at %d tokens: content %r, finish_reason length, streamed and not (the name sent, "
           "arguments %r)" % (cut, content, calls[0]["arguments"]), (r.model_dump(), calls))
    # arguments that are not JSON: no call, all text as content, "stop" (streamed: what was
    # sent before the JSON went wrong stands)
    bad = dict(kw, extra_body={"allowed_token_ids": [ids[t] for t in (
        "Checking...", "<tool_", "call>", SPLIT[0], BADARGS, "</tool_call>", "<eos>")]})
    r = c.chat.completions.create(**bad)
    content, calls, finish = stream(c, **bad)
    ok(r.choices[0].message.content == "Checking...<tool_call>" + SPLIT[0] + BADARGS +
       "</tool_call>" and not r.choices[0].message.tool_calls and
       r.choices[0].finish_reason == "stop" and content == r.choices[0].message.content and
       finish == "stop" and [(t["name"], t["arguments"]) for t in calls] in
       ([], [("get_weather", '{"city": ')]),
       "arguments not JSON: all text as content, finish_reason stop, streamed and not",
       (r.model_dump(), content, calls, finish))


def reasoning(pool, parser, ids):
    """--reasoning-parser: <think> text apart as reasoning_content, streamed too."""
    c = openai.OpenAI(base_url=pool.url + "/v1", api_key="none", max_retries=0)
    name = c.models.list().data[0].id
    base = [ids[t] for t in ("<think>", "Plan.", "</think>", "<eos>")]
    kw = dict(model=name, messages=[USER], max_tokens=8, temperature=0)
    answer = dict(kw, extra_body={"allowed_token_ids": base + [ids["Sunny_in_Oslo."]]})
    r = c.chat.completions.create(**answer)
    m = r.choices[0].message
    ok(m.model_extra["reasoning_content"] == "Plan." and m.content == "Sunny_in_Oslo.",
       "%s: <think>Plan.</think>Sunny_in_Oslo.: reasoning_content and content apart" % parser,
       r.model_dump())
    parts = list(c.chat.completions.create(stream=True, **answer))
    thought = "".join((p.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                      for p in parts if p.choices)
    said = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    ok(thought == "Plan." and said == "Sunny_in_Oslo.", "%s: streamed apart too" % parser,
       (thought, said))
    r = c.chat.completions.create(model=name, messages=[USER], max_tokens=8, temperature=0,
                                  extra_body={"allowed_token_ids": base[:2] + [base[3]]})
    m = r.choices[0].message
    want = ("Plan.", None) if parser == "deepseek_r1" else (None, "<think>Plan.")
    ok((m.model_extra["reasoning_content"], m.content) == want,
       "%s: an unclosed <think>: %r" % (parser, want), r.model_dump())
    r = c.chat.completions.create(extra_body={"allowed_token_ids": base + [ids["Sunny_in_Oslo."]],
                                              "include_reasoning": False}, **kw)
    ok("reasoning_content" not in (r.choices[0].message.model_extra or {}) and
       r.choices[0].message.content == "Sunny_in_Oslo.", "include_reasoning false drops it")
    return c, name


def think_call(c, name, ids):
    """Reasoning, then a call: the call is read from the content only."""
    allowed = [ids[t] for t in ("<think>", "Plan.", "</think>", "<tool_call>", CALL,
                                "</tool_call>", "<eos>")]
    kw = dict(model=name, messages=[USER], tools=[TOOL], max_tokens=8, temperature=0,
              extra_body={"allowed_token_ids": allowed})
    r = c.chat.completions.create(**kw)
    m = r.choices[0].message
    ok(m.model_extra["reasoning_content"] == "Plan." and m.content is None and
       m.tool_calls[0].function.arguments == '{"city": "Oslo"}' and
       r.choices[0].finish_reason == "tool_calls", "reasoning then a tool call", r.model_dump())
    content, calls, finish = stream(c, **kw)
    ok(content == "" and calls[0]["name"] == "get_weather" and finish == "tool_calls",
       "reasoning then a tool call, streamed")


def main():
    d = tempfile.mkdtemp(prefix="kvf-tools-model-")
    try:
        ids = scripted_model.write(d, TOKENS, RULES, TEMPLATE)
        for parser in ("hermes", "llama3_json", "mistral"):
            more = ["--reasoning-parser", "qwen3"] if parser == "hermes" else []
            with Pool(layout="2p2d", model=d, timeout=90, proxy_args=[
                    "--enable-auto-tool-choice", "--tool-call-parser", parser] + more) as pool:
                c, name = run(pool, parser, ids)
                if parser == "hermes":
                    extras(c, name, ids)
                    reasoning(pool, "qwen3", ids)
                    think_call(c, name, ids)
        with Pool(layout="1p1d", model=d, timeout=90,
                  proxy_args=["--reasoning-parser", "deepseek_r1"]) as pool:
            reasoning(pool, "deepseek_r1", ids)
        with Pool(layout="1p1d", model=d, timeout=90) as pool:
            c = openai.OpenAI(base_url=pool.url + "/v1", api_key="none", max_retries=0)
            name = c.models.list().data[0].id
            try:
                c.chat.completions.create(model=name, messages=[USER], tools=[TOOL],
                                          max_tokens=2)
                ok(False, "auto tool choice without the flags is refused")
            except openai.BadRequestError as e:
                ok(e.response.json()["param"] == "tool_choice" and
                   "--enable-auto-tool-choice" in e.response.json()["message"],
                   "auto tool choice without --enable-auto-tool-choice: 400 naming the flags")
    finally:
        scripted_model.remove(d)
    print("test_openai_tools passed")


if __name__ == "__main__":
    main()
