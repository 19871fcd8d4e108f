"""kvf bench-serve's sharegpt, sonnet and burstgpt datasets (vLLM's rules, issue 32 item 2),
against an OpenAI server stand-in that records every request and counts tokens in POST
/tokenize with a tokenizer the test knows: one token per blank-separated word, plus a BOS
when add_special_tokens; its chat template for one user message is "<|user|> TEXT
<|assistant|>" (two more words). The fixtures are tests/data/bench/*.

1. sharegpt (sharegpt_small.json, 9 entries): entries with fewer than two turns and those
   vLLM's filter drops (prompt under 4 or over 1024 tokens, output under 4, both over
   2048) are not sent; the three kept ones go with max_tokens = their second turn's
   tokens, repeated to --num-prompts 6 (each twice). With --sharegpt-output-len 5 the
   output checks fall away except the total: five kept, max_tokens 5 each.
2. sonnet (sonnet_small.txt, 20 lines of 7 tokens): base prompt 13 tokens in the chat
   template; --sonnet-input-len 100 --sonnet-prefix-len 40: round(87 / 7) = 12 lines per
   prompt, the first round(27 / 7) = 4 of the file shared, 8 drawn from it; max_tokens
   --sonnet-output-len; the prompt is sent without the template. --sonnet-input-len 14 is
   refused naming the flag and the base prompt's 14 tokens.
3. burstgpt (burstgpt_small.csv): the GPT-4 rows with a response and request tokens:
   (12, 8), (7, 3), (20, 16); request i sends token ids 32 + (i + j) mod 95; --num-prompts 3
   samples each row once, 7 samples with replacement. A CSV without "Response tokens" is
   refused naming the column.
4. --dataset-name sharegpt without --dataset-path is refused by name.
5. The same three datasets through the real kvf-proxy (fake daemons; --model a tiny model
   folder with a chat template): its POST /tokenize answers what kvf bench-serve asks, and
   4 of 4 requests complete for each.

Rerun:
  python3 tests/deploy/test_bench_datasets.py --fakebin build/tests/fakebin \
      --testbin build/tests/bin
"""

import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections import Counter

import proxy_testlib as T
from e2e_models import model_dir
from kvf_e2e import free_port_range

DATA = os.path.join(os.environ.get("KVF_SOURCE_DIR") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "tests", "data", "bench")
BASE = "Pick as many lines as you can from these poem lines:\n"


def count(text, special):
    return len(text.split()) + (1 if special else 0)


class StandIn(http.server.BaseHTTPRequestHandler):
    """GET /v1/models lists "m"; POST /tokenize counts words (module docstring);
    POST /v1/completions records the body and streams max_tokens tokens."""
    lock = threading.Lock()
    seen = []
    tokenize_calls = 0

    def log_message(self, *_):
        pass

    def _json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._json(200, {"object": "list", "data": [{"id": "m", "root": "m"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            with StandIn.lock:
                StandIn.tokenize_calls += 1
            unknown = set(req) - {"model", "prompt", "messages", "add_special_tokens",
                                  "add_generation_prompt"}
            if unknown or req.get("model", "m") != "m" or req.get("add_special_tokens") is not True:
                self._json(400, {"error": {"message": "bad tokenize request %s" % req}})
                return
            if "messages" in req:
                (m,) = req["messages"]
                if m["role"] != "user" or req.get("add_generation_prompt") is not True:
                    self._json(400, {"error": {"message": "bad chat request"}})
                    return
                n = count("<|user|> %s <|assistant|>" % m["content"], True)
            else:
                n = count(req["prompt"], True)
            self._json(200, {"count": n, "max_model_len": 4096, "tokens": list(range(n))})
            return
        with StandIn.lock:
            StandIn.seen.append((dict(self.headers), req))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        n = req["max_tokens"]
        for i in range(n):
            chunk = {"choices": [{"index": 0, "text": "x", "token_ids": [65],
                                  "finish_reason": "length" if i == n - 1 else None}]}
            if i == n - 1:
                chunk["usage"] = {"prompt_tokens": 1, "completion_tokens": n}
            self.wfile.write(("data: %s\n\n" % json.dumps(chunk)).encode())
        self.wfile.write(b"data: [DONE]\n\n")


def run_bench(kvf, url, args, expect_ok=True):
    n0 = len(StandIn.seen)
    p = subprocess.run([kvf, "bench-serve", "--base-url", url, "--model", "m",
                        "--ready-check-timeout-sec", "0", "--disable-tqdm", "--seed", "7",
                        "--request-id-prefix", "r-"] + args,
                       capture_output=True, text=True, timeout=120)
    if expect_ok:
        T.check(p.returncode == 0, "kvf bench-serve %s runs" % " ".join(args[:2]),
                p.stderr[-1500:])
    with StandIn.lock:
        sent = StandIn.seen[n0:]
    return p, sorted(sent, key=lambda s: int(s[0]["x-request-id"][2:]))


def sharegpt(kvf, url):
    path = os.path.join(DATA, "sharegpt_small.json")
    with open(path) as f:
        data = json.load(f)
    turns = {e["id"]: [t["value"] for t in e["conversations"]] for e in data
             if len(e.get("conversations", [])) >= 2}

    def kept(fixed):
        out = {}
        for k, t in turns.items():
            plen = count(t[0], True)
            olen = fixed if fixed else count(t[1], True)
            if plen >= 4 and plen <= 1024 and plen + olen <= 2048 and (fixed or olen >= 4):
                out[t[0]] = olen
        return out

    want = kept(None)
    T.check(sorted(want.values()) == [6, 8, 11], "the fixture's three conversations that "
            "pass vLLM's filter, worked out here", want)
    _, sent = run_bench(kvf, url, ["--dataset-name", "sharegpt", "--dataset-path", path,
                                   "--num-prompts", "6"])
    got = Counter((b["prompt"], b["max_tokens"]) for _, b in sent)
    T.check(len(sent) == 6 and got == Counter({(p, m): 2 for p, m in want.items()}) and
            all("ignore_eos" not in b for _, b in sent),
            "sharegpt: the 3 kept prompts, each twice, max_tokens = the second turn's tokens "
            "(6, 8, 11); no ignore_eos", got)

    want5 = kept(5)
    _, sent = run_bench(kvf, url, ["--dataset-name", "sharegpt", "--dataset-path", path,
                                   "--num-prompts", "5", "--sharegpt-output-len", "5"])
    got = Counter((b["prompt"], b["max_tokens"]) for _, b in sent)
    T.check(len(want5) == 5 and got == Counter({(p, 5): 1 for p in want5}),
            "--sharegpt-output-len 5: the short answer and the long pair now pass; 5 prompts,"
            " max_tokens 5", got)


def sonnet(kvf, url):
    path = os.path.join(DATA, "sonnet_small.txt")
    with open(path) as f:
        lines = f.readlines()
    avg = sum(count(l, True) for l in lines) / len(lines)
    offset = count("<|user|> %s <|assistant|>" % BASE, True)
    n_in = round((100 - offset) / avg)
    n_pre = round((40 - offset) / avg)
    T.check((avg, offset, n_in, n_pre) == (7.0, 14, 12, 4),
            "sonnet arithmetic worked out here: 7 tokens a line, base 14, 12 lines, 4 shared")
    _, sent = run_bench(kvf, url, ["--dataset-name", "sonnet", "--dataset-path", path,
                                   "--num-prompts", "5", "--sonnet-input-len", "100",
                                   "--sonnet-prefix-len", "40", "--sonnet-output-len", "7"])
    ok = True
    drawn = set()
    for _, b in sent:
        body = b["prompt"]
        ls = body[len(BASE):].splitlines(keepends=True)
        ok &= (body.startswith(BASE) and len(ls) == n_in and ls[:n_pre] == lines[:n_pre] and
               all(l in lines for l in ls) and b["max_tokens"] == 7 and
               count("<|user|> %s <|assistant|>" % body, True) <= 100)
        drawn.add(tuple(ls[n_pre:]))
    T.check(len(sent) == 5 and ok and len(drawn) > 1,
            "sonnet: 5 prompts of the base + 12 file lines, the first 4 shared, 8 drawn "
            "(%d distinct draws), max_tokens 7, at most 100 tokens in the template" %
            len(drawn), [b["prompt"][:200] for _, b in sent[:2]])
    p, sent = run_bench(kvf, url, ["--dataset-name", "sonnet", "--dataset-path", path,
                                   "--num-prompts", "2", "--sonnet-input-len", "14"],
                        expect_ok=False)
    T.check(p.returncode != 0 and not sent and "--sonnet-input-len" in p.stderr and
            "14 tokens" in p.stderr,
            "--sonnet-input-len 14 (not above the base prompt) is refused by name",
            p.stderr[-500:])


def burstgpt(kvf, url, tmp):
    path = os.path.join(DATA, "burstgpt_small.csv")
    rows = [(12, 8), (7, 3), (20, 16)]
    _, sent = run_bench(kvf, url, ["--dataset-name", "burstgpt", "--dataset-path", path,
                                   "--num-prompts", "3"])
    shapes = sorted((len(b["prompt"]), b["max_tokens"]) for _, b in sent)
    ramp = all(b["prompt"] == [32 + (i + j) % 95 for j in range(len(b["prompt"]))]
               for i, (_, b) in enumerate(sent))
    T.check(shapes == sorted(rows) and ramp,
            "burstgpt: the 3 GPT-4 rows with a response, each once, prompt = its request "
            "tokens of ids 32 + (i + j) mod 95, max_tokens = its response tokens", shapes)
    _, sent = run_bench(kvf, url, ["--dataset-name", "burstgpt", "--dataset-path", path,
                                   "--num-prompts", "7"])
    shapes = [(len(b["prompt"]), b["max_tokens"]) for _, b in sent]
    T.check(len(shapes) == 7 and all(s in rows for s in shapes),
            "burstgpt: 7 samples of the 3 rows, with replacement", shapes)
    bad = os.path.join(tmp, "bad.csv")
    with open(bad, "w") as f:
        f.write("Timestamp,Model,Request tokens,Total tokens\n1,GPT-4,5,9\n")
    p, sent = run_bench(kvf, url, ["--dataset-name", "burstgpt", "--dataset-path", bad,
                                   "--num-prompts", "2"], expect_ok=False)
    T.check(p.returncode != 0 and not sent and '"Response tokens"' in p.stderr,
            "a CSV without the Response tokens column is refused naming it", p.stderr[-400:])


def real_proxy(a, procs, tmp, kvf):
    src = model_dir("tiny-llama")
    model = os.path.join(tmp, "model")
    os.makedirs(model)
    for fn in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(src, fn), model)
    with open(os.path.join(os.path.dirname(DATA), "chat_templates", "simple.jinja")) as f:
        tpl = f.read()
    with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": tpl}, f)
    base = free_port_range(2)
    T.start_fake(procs, a.testbin, "prefill", "prefill-0", base)
    T.start_fake(procs, a.testbin, "decode", "decode-0", base + 1)
    _, px = T.start_proxy(procs, a.fakebin, "tcp://127.0.0.1:%d" % base,
                          "tcp://127.0.0.1:%d" % (base + 1), ["--model", model,
                                                             "--model-name", "m"])
    url = "http://127.0.0.1:%d" % px.port
    for args in (["sharegpt", "sharegpt_small.json"],
                 ["sonnet", "sonnet_small.txt", "--sonnet-input-len", "200",
                  "--sonnet-prefix-len", "60", "--sonnet-output-len", "4"],
                 ["burstgpt", "burstgpt_small.csv"]):
        p = subprocess.run([kvf, "bench-serve", "--base-url", url, "--disable-tqdm",
                            "--num-prompts", "4", "--dataset-name", args[0], "--dataset-path",
                            os.path.join(DATA, args[1])] + args[2:],
                           capture_output=True, text=True, timeout=120)
        done = re.search(r"Successful requests:\s+(\d+)", p.stdout)
        T.check(p.returncode == 0 and done and int(done.group(1)) == 4,
                "%s through the real kvf-proxy's /tokenize: 4 of 4 completed" % args[0],
                p.stderr[-800:] + p.stdout[-400:])


def run(a, procs, tmp):
    kvf = os.path.join(a.fakebin, "kvf")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d" % srv.server_address[1]
    try:
        sharegpt(kvf, url)
        sonnet(kvf, url)
        burstgpt(kvf, url, tmp)
        p, sent = run_bench(kvf, url, ["--dataset-name", "sharegpt", "--num-prompts", "2"],
                            expect_ok=False)
        T.check(p.returncode != 0 and not sent and "--dataset-path" in p.stderr,
                "sharegpt without --dataset-path is refused by name", p.stderr[-300:])
    finally:
        srv.shutdown()
    real_proxy(a, procs, tmp, kvf)


def main():
    T.run_with_procs(run)


if __name__ == "__main__":
    main()
