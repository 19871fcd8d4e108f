#!/usr/bin/env python3
"""The official `openai` Python client against a 2p2d pool on the trained tiny model.

- completions and chat, streamed and not, equal to a colocated `kvf generate` at
  temperature 0 (token for token, up to a top-2 margin within LOGIT_TOL); a stream
  joins to the non-streamed text and ends with a usage chunk without choices;
- each sampling field changes what it should: top_k=1, top_p=0.01 and min_p=1 at
  temperature 2 equal greedy for 10 seeds; a seed reproduces its tokens and two
  seeds differ; n choices are seed + j; repetition, frequency and presence penalties
  change a repetitive greedy output; min_tokens holds back a stop token id;
  stop_token_ids end with "stop" and the id as stop_reason; stop strings cut the
  text (across token boundaries, never leaked in a stream); logprobs are of the
  sampled tokens; echo prefixes the prompt; a list of prompts gives a choice each;
- every refused field and every out-of-range value is a 400 (openai.BadRequestError)
  naming the field; an unknown key is a 400 naming the key;
- /v1/models (root, max_model_len, served names), /tokenize, /detokenize, /version,
  x-request-id echoed.
Skipped (exit 77) without the openai package.
"""

import json
import os
import sys
import urllib.request

from e2e_models import check_tokens
from kvf_e2e import Pool, find_bin, repo_root

try:
    import openai
except ImportError:
    print("SKIP: the openai package is not installed (pip install openai)")
    sys.exit(77)

import subprocess
import tempfile

MODEL = os.path.join(repo_root(), "models-trained", "tiny-dense")
PROMPT = "The ferry crosses"
N = 12


def ok(cond, what, detail=None):
    if not cond:
        raise AssertionError(what if detail is None else "%s\n%s" % (what, detail))
    print("ok: " + what)


def colocated(prompt, max_tokens):
    """Greedy tokens (EOS ignored) and logits of a colocated run of a text prompt."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    try:
        p = subprocess.run([os.path.join(find_bin(), "kvf"), "generate", "--model", MODEL,
                            "--prompt-file", f.name, "--max-tokens", str(max_tokens),
                            "--ignore-eos", "yes", "--print-logits"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, check=True, timeout=120)
    finally:
        os.unlink(f.name)
    toks, logits = None, []
    for line in p.stdout.decode("latin-1").splitlines():
        if line.startswith("tokens:"):
            toks = [int(t) for t in line.split()[1:]]
        elif line.startswith("logits "):
            logits.append([float(x) for x in line.split()[3:]])
    return toks, logits


def post(url, body, headers=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers=dict({"Content-Type": "application/json"},
                                              **(headers or {})))
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read()), dict(r.headers)


def ids_of(choice):
    return choice.model_extra["token_ids"]


def run(pool):
    c = openai.OpenAI(base_url=pool.url + "/v1", api_key="none", max_retries=0)
    models = c.models.list().data
    name = models[0].id
    ok(models[0].model_extra["root"] == os.path.realpath(MODEL) and
       models[0].model_extra["max_model_len"] == 4096 and [m.id for m in models] ==
       [name, "alias"], "/v1/models: every served name, root and max_model_len",
       [m.model_dump() for m in models])

    def cmpl(**kw):
        kw.setdefault("model", name)
        kw.setdefault("prompt", PROMPT)
        kw.setdefault("max_tokens", N)
        extra = kw.pop("extra", {})
        extra.setdefault("return_token_ids", True)
        return c.completions.create(extra_body=extra, **kw)

    # -- greedy equals colocated; stream equals non-stream; usage chunk last -------------
    g = cmpl(temperature=0, extra={"ignore_eos": True})
    greedy = ids_of(g.choices[0])
    prompt_ids = g.model_extra["prompt_token_ids"]
    ref, ref_logits = colocated(PROMPT, N)
    check_tokens(greedy, ref, ref_logits, exact=False, what="completion")
    ok(True, "completion at temperature 0 equals the colocated run (%d tokens)" % len(greedy))
    chunks = list(cmpl(temperature=0, stream=True, stream_options={"include_usage": True},
                       extra={"ignore_eos": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    ok(text == g.choices[0].text and not chunks[-1].choices and
       chunks[-1].usage.completion_tokens == N and
       chunks[-1].usage.prompt_tokens == len(prompt_ids) and
       all(ch.usage is None for ch in chunks[:-1]),
       "stream joins to the same text; usage alone in the last chunk", text)
    cont = list(cmpl(temperature=0, stream=True, max_tokens=4,
                     stream_options={"continuous_usage_stats": True}))
    ok([ch.usage.completion_tokens for ch in cont] == [1, 2, 3, 4, 4][:len(cont)],
       "continuous_usage_stats: usage in every chunk", [ch.usage for ch in cont])

    # -- chat equals the completion of its rendered prompt's ids (the same pool) ----------
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    tok, _ = post(pool.url + "/tokenize", {"model": name, "messages": msgs})
    ch = c.chat.completions.create(model=name, messages=msgs, max_tokens=N, temperature=0,
                                   extra_body={"ignore_eos": True, "return_token_ids": True})
    same = ids_of(cmpl(prompt=tok["tokens"], temperature=0,
                       extra={"ignore_eos": True}).choices[0])
    ok(ch.object == "chat.completion" and ch.choices[0].message.role == "assistant" and
       ch.usage.prompt_tokens == tok["count"] and ids_of(ch.choices[0]) == same,
       "chat equals the completion of its rendered template", (ids_of(ch.choices[0]), same))
    parts = list(c.chat.completions.create(model=name, messages=msgs, max_tokens=N,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True}))
    ok(parts[0].choices[0].delta.role == "assistant" and
       "".join(p.choices[0].delta.content or "" for p in parts if p.choices) ==
       ch.choices[0].message.content and parts[-1].usage.completion_tokens == N,
       "chat stream: role first, same content, usage chunk")
    try:
        c.chat.completions.create(model=name, messages=[{"role": "wizard", "content": "x"}])
        ok(False, "a bad role is refused")
    except openai.BadRequestError as e:
        ok("wizard" in str(e) and e.body["param"] == "messages", "a bad role: 400 on messages")

    # -- filters at temperature 2 that leave only the top token equal greedy --------------
    for field, value in (("top_k", 1), ("top_p", 0.01), ("min_p", 1.0)):
        outs = [ids_of(cmpl(temperature=2.0, seed=s, extra={field: value, "ignore_eos": True})
                       .choices[0]) for s in range(40, 50)]
        ok(all(o == greedy for o in outs), "%s=%s at temperature 2 equals greedy for 10 seeds"
           % (field, value), outs)
    plain = [ids_of(cmpl(temperature=2.0, seed=s, extra={"ignore_eos": True}).choices[0])
             for s in range(40, 43)]
    ok(len({tuple(p) for p in plain}) > 1, "without them, temperature 2 varies with the seed")

    # -- seeds ---------------------------------------------------------------------------
    a = ids_of(cmpl(temperature=1.0, seed=7).choices[0])
    b = ids_of(cmpl(temperature=1.0, seed=7).choices[0])
    d = ids_of(cmpl(temperature=1.0, seed=8).choices[0])
    ok(a == b and a != d, "a seed reproduces its tokens, another seed differs")
    many = cmpl(temperature=1.0, seed=7, n=3)
    ok([x.index for x in many.choices] == [0, 1, 2] and ids_of(many.choices[0]) == a and
       ids_of(many.choices[1]) == d, "n=3: choice j is seed + j")

    # -- penalties change a repetitive greedy output ---------------------------------------
    for field in ("repetition_penalty", "frequency_penalty", "presence_penalty"):
        pen = ids_of(cmpl(temperature=0, extra={field: 2.0, "ignore_eos": True}).choices[0])
        ok(pen != greedy, "%s=2 changes the greedy output" % field, (pen, greedy))

    # -- stop token ids and min_tokens ---------------------------------------------------
    stop_id = greedy[1]
    r = cmpl(temperature=0, extra={"stop_token_ids": [stop_id]})
    ok(r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] ==
       stop_id and ids_of(r.choices[0]) == greedy[:greedy.index(stop_id) + 1],
       "stop_token_ids: ends at the id, finish_reason stop, stop_reason the id",
       (r.choices[0], greedy))
    r = cmpl(temperature=0, extra={"stop_token_ids": [stop_id], "min_tokens": 6})
    got = ids_of(r.choices[0])
    ok(len(got) >= 6 and stop_id not in got[:5], "min_tokens=6 masks the stop id before", got)

    # -- stop strings across token boundaries ---------------------------------------------
    full = g.choices[0].text
    cut = max(2, len(full) // 2)
    stop = full[cut - 1:cut + 2]            # spans a token boundary for 1-3 byte tokens
    first = full.find(stop)
    r = cmpl(temperature=0, stop=[stop], extra={"ignore_eos": True})
    ok(r.choices[0].text == full[:first] and r.choices[0].finish_reason == "stop" and
       r.choices[0].model_extra["stop_reason"] == stop,
       "stop %r cuts the text before it" % stop, r.choices[0].text)
    pieces = [ch.choices[0].text for ch in cmpl(temperature=0, stop=[stop], stream=True,
                                                 extra={"ignore_eos": True}) if ch.choices]
    ok("".join(pieces) == full[:first] and all(stop not in p for p in pieces),
       "streamed, the stop string never leaks", pieces)
    r = cmpl(temperature=0, stop=[stop], extra={"ignore_eos": True,
                                                "include_stop_str_in_output": True})
    ok(r.choices[0].text == full[:first + len(stop)], "include_stop_str_in_output keeps it")

    # -- logprobs, echo, prompt lists ----------------------------------------------------
    r = cmpl(temperature=0, logprobs=3, extra={"ignore_eos": True})
    lp = r.choices[0].logprobs
    ok(len(lp.token_logprobs) == N and all(len(t) >= 1 for t in lp.top_logprobs) and
       all(abs(max(t.values()) - v) < 1e-6 for t, v in zip(lp.top_logprobs, lp.token_logprobs))
       and all(sum(2.718281828 ** x for x in t.values()) <= 1.0001 for t in lp.top_logprobs),
       "logprobs: the greedy token is the top one; top probabilities sum to <= 1")
    r = cmpl(temperature=0, echo=True, max_tokens=3)
    ok(r.choices[0].text.startswith(PROMPT), "echo prefixes the prompt", r.choices[0].text)
    r = cmpl(temperature=0, prompt=[PROMPT, prompt_ids], extra={"ignore_eos": True})
    ok([x.index for x in r.choices] == [0, 1] and ids_of(r.choices[0]) == greedy and
       ids_of(r.choices[1]) == greedy, "a list of prompts: a choice each")

    # -- refusals name the field -----------------------------------------------------------
    bad = [("top_p", 2), ("top_p", 0), ("top_k", -2), ("min_p", 1.5),
           ("repetition_penalty", 0), ("presence_penalty", 3), ("frequency_penalty", -3),
           ("min_tokens", N + 1), ("n", 0), ("n", 17), ("logprobs", 21), ("best_of", 0),
           ("use_beam_search", True), ("logit_bias", {"5": 101, "x": 1}), ("suffix", "x"),
           ("response_format", {"type": "json_object"}), ("guided_json", {}),
           ("prompt_logprobs", 21), ("allowed_token_ids", []), ("skip_special_tokens", False),
           ("priority", 1), ("cache_salt", ""), ("cache_salt", "s" * 257), ("cache_salt", 5),
           ("kv_transfer_params", {}),
           ("stop_token_ids", [10 ** 7]), ("temperature", -1), ("max_tokens", 0)]
    for field, value in bad:
        try:
            cmpl(extra={field: value})
            ok(False, "%s=%r is refused" % (field, value))
        except openai.BadRequestError as e:
            flat = e.response.json()   # vLLM's flat error; e.body is the nested one
            if (flat["param"] != field or flat["code"] != 400 or
                    flat["type"] != "BadRequestError" or e.body.get("param") != field):
                raise AssertionError("%s=%r: %s" % (field, value, flat))
    ok(True, "%d refused or out-of-range values: 400 naming the field" % len(bad))
    try:
        cmpl(extra={"top_q": 0.5})
        ok(False, "an unknown key is refused")
    except openai.BadRequestError as e:
        flat = e.response.json()
        ok("top_q" in flat["message"] and flat["type"] == "BadRequestError" and
           flat["code"] == 400 and flat["param"] == "top_q",
           "an unknown key: 400 naming it")

    # -- side endpoints ------------------------------------------------------------------
    t, _ = post(pool.url + "/tokenize", {"prompt": PROMPT})
    dt, _ = post(pool.url + "/detokenize", {"tokens": t["tokens"]})
    ok(t["tokens"] == prompt_ids and dt["prompt"] == PROMPT, "/tokenize and /detokenize")
    body, hdr = post(pool.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 2},
                     {"X-Request-Id": "req-42"})
    ok(hdr.get("X-Request-Id") == "req-42" and body["id"] == "cmpl-req-42",
       "x-request-id echoed and used as the id")
    with urllib.request.urlopen(pool.url + "/version", timeout=10) as v:
        ok("version" in json.loads(v.read()), "/version")


def main():
    name = os.path.basename(MODEL)
    with Pool(layout="2p2d", model=MODEL, timeout=90,
              proxy_args=["--served-model-name=%s,alias" % name]) as pool:
        run(pool)
    print("test_openai_client passed")


if __name__ == "__main__":
    main()
