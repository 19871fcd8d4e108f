#!/usr/bin/env python3
"""The logit-editing sampling fields through the official `openai` client against a 2p2d pool
on the trained tiny model (common/engine/kvf_sampler.h step 0; the proxy's parsing is
deploy/proxy/kvf_proxy_sampling.c):

- logit_bias of +100 on a token the model would not pick forces it at every step, sampled
  and greedy, completions and chat; -100 on the greedy token removes it;
- allowed_token_ids restricts every draw at temperature 1.5 over several seeds;
- bad_words: the greedy output's first word never appears (its token, with and without a
  leading space), and the output changes;
- best_of 4 with n 2 returns the two of the four candidates (the same seeds as n 4) with
  the highest cumulative logprob, best first;
- a 300-token ignore_eos stream with logprobs 1 arrives as 300 chunks (one token each); with
  return_token_ids too, tokens whose text is held back (a possible stop string) included;
- prompt_logprobs equal the colocated `kvf generate --prompt-logprobs` numbers bit for bit
  (each prompt token's logprob, rank and top 3); chat carries them on the response;
- each invalid value is a 400 (openai.BadRequestError) naming the field.
Skipped (exit 77) without the openai package.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import urllib.request

from kvf_e2e import Pool, find_bin, repo_root

try:
    import openai
except ImportError:
    print("SKIP: the openai package is not installed (pip install openai)")
    sys.exit(77)

MODEL = os.path.join(repo_root(), "models-trained", "tiny-dense")
PROMPT = "The ferry crosses"
N = 10


def ok(cond, what, detail=None):
    if not cond:
        raise AssertionError(what if detail is None else "%s\n%s" % (what, detail))
    print("ok: " + what)


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def colocated_prompt_logprobs(prompt, n):
    """kvf generate --prompt-logprobs n at TP 2, as the pool's prefill instances run:
    [(token, logprob, rank, [(id, logprob)...])]."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    try:
        p = subprocess.run([os.path.join(find_bin(), "kvf"), "generate", "--model", MODEL,
                            "--prompt-file", f.name, "--max-tokens", "1",
                            "--prompt-logprobs", str(n), "--tp", "2"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, check=True, timeout=120)
    finally:
        os.unlink(f.name)
    out = []
    for line in p.stdout.decode("latin-1").splitlines():
        if line.startswith("prompt_logprobs "):
            w = line.split()
            out.append((int(w[2]), float(w[3]), int(w[4]),
                        [(int(x.split(":")[0]), float(x.split(":")[1])) for x in w[5:]]))
    return out


def run(pool):
    c = openai.OpenAI(base_url=pool.url + "/v1", api_key="none", max_retries=0)
    name = c.models.list().data[0].id

    def ids(**kw):
        kw.setdefault("model", name)
        kw.setdefault("prompt", PROMPT)
        kw.setdefault("max_tokens", N)
        extra = kw.pop("extra", {})
        extra.setdefault("return_token_ids", True)
        extra.setdefault("ignore_eos", True)
        r = c.completions.create(extra_body=extra, **kw)
        return r.choices[0].model_extra["token_ids"], r.choices[0].text

    greedy, gtext = ids(temperature=0)
    # -- logit_bias -----------------------------------------------------------------------
    forced = next(t for t in range(100, 200) if t not in greedy)
    for temp, seed in ((0, None), (1.0, 7), (1.5, 8)):
        got, _ = ids(temperature=temp, seed=seed, extra={"logit_bias": {str(forced): 100}})
        ok(got == [forced] * N, "logit_bias +100 on %d forces it (temperature %g)" % (forced, temp),
           got)
    ch = c.chat.completions.create(model=name, messages=[{"role": "user", "content": PROMPT}],
                                   max_tokens=4, temperature=0, logit_bias={str(forced): 100},
                                   extra_body={"ignore_eos": True, "return_token_ids": True})
    ok(ch.choices[0].model_extra["token_ids"] == [forced] * 4, "chat: logit_bias forces it too")
    got, _ = ids(temperature=0, max_tokens=1, extra={"logit_bias": {str(greedy[0]): -100}})
    ok(got[0] != greedy[0], "logit_bias -100 on the greedy token removes it", (got, greedy))
    # -- allowed_token_ids ----------------------------------------------------------------
    allowed = [11, 42, 77, 300]
    seen = set()
    for seed in range(5):
        got, _ = ids(temperature=1.5, seed=seed, extra={"allowed_token_ids": allowed})
        ok(set(got) <= set(allowed), "allowed_token_ids: seed %d draws only %s" % (seed, allowed),
           got)
        seen |= set(got)
    ok(len(seen) > 1, "allowed_token_ids: the draws vary over the allowed set", seen)
    got, _ = ids(temperature=0, extra={"allowed_token_ids": allowed})
    ok(set(got) <= set(allowed), "allowed_token_ids at temperature 0", got)
    # -- bad_words ------------------------------------------------------------------------
    word = gtext.split()[0]
    banned = set()
    for text in (word, " " + word):
        t = post(pool.url + "/tokenize", {"model": name, "prompt": text,
                                          "add_special_tokens": False})["tokens"]
        if len(t) == 1:
            banned.add(t[0])
    ok(banned, "the greedy output's first word %r is one token" % word, banned)
    for temp, seed in ((0, None), (1.0, 3)):
        got, text = ids(temperature=temp, seed=seed, extra={"bad_words": [word]})
        ok(not (set(got) & banned), "bad_words [%r]: never sampled (temperature %g)" %
           (word, temp), (got, banned))
    got, _ = ids(temperature=0, extra={"bad_words": [word]})
    ok(got != greedy, "bad_words changed the greedy output", (got, greedy))
    # -- best_of: the n of best_of candidates with the highest cumulative logprob ----------
    cands = c.completions.create(model=name, prompt=PROMPT, max_tokens=N, temperature=1.0,
                                 seed=11, n=4, logprobs=0,
                                 extra_body={"ignore_eos": True, "return_token_ids": True})
    cum = sorted(((sum(ch.logprobs.token_logprobs), ch.index,
                   ch.model_extra["token_ids"]) for ch in cands.choices),
                 key=lambda t: (-t[0], t[1]))
    best = c.completions.create(model=name, prompt=PROMPT, max_tokens=N, temperature=1.0,
                                seed=11, n=2, best_of=4,
                                extra_body={"ignore_eos": True, "return_token_ids": True})
    got = [ch.model_extra["token_ids"] for ch in best.choices]
    ok(len({tuple(t[2]) for t in cum}) > 1, "best_of: the 4 candidates differ", cum)
    ok(got == [cum[0][2], cum[1][2]] and [ch.index for ch in best.choices] == [0, 1] and
       best.choices[0].logprobs is None and best.usage.completion_tokens == 2 * N,
       "best_of 4, n 2: the two of the highest cumulative logprob, best first, no logprobs "
       "shown, usage of the two", (got, cum))
    # -- template arguments: continue_final_message continues the assistant's text ---------
    msgs = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "The ferry"}]
    cont = c.chat.completions.create(model=name, messages=msgs, max_tokens=4, temperature=0,
                                     extra_body={"ignore_eos": True, "return_token_ids": True,
                                                 "add_generation_prompt": False,
                                                 "continue_final_message": True,
                                                 "chat_template_kwargs": {"unused": 1},
                                                 "documents": [{"title": "t", "text": "d"}]})
    text = "<bos>user: %s\nassistant: The ferry" % PROMPT
    tok = post(pool.url + "/tokenize", {"model": name, "prompt": text,
                                        "add_special_tokens": False})
    same, _ = ids(prompt=tok["tokens"], temperature=0, max_tokens=4)
    ok(cont.usage.prompt_tokens == tok["count"] and
       cont.choices[0].model_extra["token_ids"] == same,
       "continue_final_message: the rendering cut after the assistant's text, continued",
       (cont.usage.prompt_tokens, tok["count"]))
    # -- streaming per token: with logprobs (or token ids) every token its own chunk -------
    chunks = [ch for ch in c.completions.create(model=name, prompt=PROMPT, max_tokens=300,
                                                temperature=0, logprobs=1, stream=True,
                                                extra_body={"ignore_eos": True})
              if ch.choices]
    ok(len(chunks) == 300 and all(len(ch.choices[0].logprobs.tokens) == 1 for ch in chunks)
       and chunks[-1].choices[0].finish_reason == "length" and
       all(ch.choices[0].finish_reason is None for ch in chunks[:-1]),
       "a 300-token ignore_eos stream with logprobs 1: 300 chunks of one token each",
       len(chunks))
    empty = [ch for ch in c.completions.create(
        model=name, prompt=PROMPT, max_tokens=N, temperature=0, stream=True,
        stop=[gtext[2:6]], extra_body={"ignore_eos": True, "return_token_ids": True})
        if ch.choices]
    ok(all(len(ch.choices[0].model_extra["token_ids"]) == 1 for ch in empty) and
       any(ch.choices[0].text == "" for ch in empty[:-1]),
       "return_token_ids: a chunk per token, held-back text as empty chunks",
       [(ch.choices[0].text, ch.choices[0].model_extra["token_ids"]) for ch in empty])
    # -- prompt_logprobs: equal to the colocated run's, bit for bit -----------------------
    r = c.completions.create(model=name, prompt=PROMPT, max_tokens=1, temperature=0,
                             extra_body={"prompt_logprobs": 3, "return_token_ids": True})
    got = r.choices[0].model_extra["prompt_logprobs"]
    pids = r.model_extra["prompt_token_ids"]
    ref = colocated_prompt_logprobs(PROMPT, 3)
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", float(x)))[0]
    same = (got[0] is None and len(got) == len(pids) == len(ref) + 1)
    for i, (tok, lp, rank, top) in enumerate(ref):
        pos = got[i + 1]
        same = same and tok == pids[i + 1] and f32(pos[str(tok)]["logprob"]) == f32(lp) and \
            pos[str(tok)]["rank"] == rank and \
            all(f32(pos[str(t)]["logprob"]) == f32(v) for t, v in top) and \
            [int(k) for k in pos if int(k) != tok] == [t for t, _ in top if t != tok]
    ok(same, "prompt_logprobs 3 equal the colocated kvf generate --prompt-logprobs 3 --tp 2 "
       "bit for bit (%d positions: logprob, rank, top 3)" % len(ref), (got[:3], ref[:2]))
    ch = c.chat.completions.create(model=name, messages=[{"role": "user", "content": PROMPT}],
                                   max_tokens=1, extra_body={"prompt_logprobs": 0})
    ok(len(ch.model_extra["prompt_logprobs"]) == ch.usage.prompt_tokens and
       all(len(p) == 1 for p in ch.model_extra["prompt_logprobs"][1:]),
       "chat: prompt_logprobs 0 on the response, the prompt token's alone")
    # -- invalid values: 400 naming the field ---------------------------------------------
    bad = [("logit_bias", {"x": 1}), ("logit_bias", {"10000000": 1}), ("logit_bias", [1]),
           ("logit_bias", {"5": "big"}), ("allowed_token_ids", []),
           ("allowed_token_ids", [-1]), ("allowed_token_ids", "5"),
           ("allowed_token_ids", [1.5]), ("bad_words", "word"), ("bad_words", [5]),
           ("bad_words", [""]), ("best_of", 0), ("best_of", 17), ("best_of", 1.5),
           ("prompt_logprobs", -1), ("prompt_logprobs", 21), ("prompt_logprobs", "2")]
    for field, value in bad:
        try:
            ids(temperature=0, extra={field: value})
            ok(False, "%s=%r is refused" % (field, value))
        except openai.BadRequestError as e:
            flat = e.response.json()
            if flat["param"] != field or flat["code"] != 400:
                raise AssertionError("%s=%r: %s" % (field, value, flat))
    ok(True, "%d invalid values: 400 naming the field" % len(bad))


def main():
    with Pool(layout="2p2d", model=MODEL, timeout=90) as pool:
        run(pool)
    print("test_openai_sampling passed")


if __name__ == "__main__":
    main()
