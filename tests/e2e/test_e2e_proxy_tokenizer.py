#!/usr/bin/env python3
"""The proxy's tokenizer is the daemons' (issue 26 item 2).

Real daemons (a 1p1d pool of the trained tiny-dense model, kvf-up), and
beside kvf-up's proxy (--model = the daemons' folder) two more kvf-proxy
processes against the same daemons:

1. --model models-trained/tiny-hybrid, whose tokenizer differs from
   tiny-dense's: every instance is marked unhealthy, its /health entry says
   "incompatible: its tokenizer X (model DIR) is not this proxy's Y", the log
   says so, and a completion is refused (503), never answered.
2. no --model: the proxy takes the tokenizer of the daemons' model folder
   (HealthReply.model_path, read here: same machine), /health's "tokenizer"
   names it as the source, and a text prompt gets the very text and token
   ids that kvf-up's proxy (with --model) answers. Never byte ids: before
   (this test cannot time that window) or without a readable folder it
   answers 503.

Rerun:
  KVF_BIN=build/bin python3 tests/e2e/test_e2e_proxy_tokenizer.py
"""

import os
import select
import signal
import subprocess
import sys
import time

from kvf_e2e import HttpError, Pool, Proxy, repo_root, wait_for

PROMPTS = ["3 u9", "The ferry left at dawn"]
MAX_TOKENS = 8
NAME = "tiny-dense"


def start_proxy(pool, extra, log):
    insts = pool.health()[1]
    cmd = [os.path.join(pool.bin_dir, "kvf-proxy"), "--port", "0",
           "--prefill", ",".join(i["url"] for i in insts["prefill"]),
           "--decode", ",".join(i["url"] for i in insts["decode"]),
           "--keys", os.path.join(pool.run_dir, "keys"), "--key-id", "proxy",
           "--model-name", NAME] + extra
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "w"))
    deadline = time.monotonic() + 30
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0 and p.poll() is None, open(log).read()
        r, _, _ = select.select([p.stdout], [], [], left)
        if r:
            ch = os.read(p.stdout.fileno(), 1)
            assert ch, open(log).read()
            line += ch
    return p, Proxy("127.0.0.1", int(line.decode().rsplit(":", 1)[1]), model_name=NAME)


def answer(px, prompt):
    r = px.complete(prompt, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True,
                    timeout=60)
    return r["choices"][0]["text"], r["choices"][0]["token_ids"]


def main():
    root = repo_root()
    dense = os.path.join(root, "models-trained", "tiny-dense")
    hybrid = os.path.join(root, "models-trained", "tiny-hybrid")
    procs = []
    with Pool(layout="1p1d", model=dense, model_name=NAME, timeout=120) as pool:
        try:
            want = {p: answer(pool, p) for p in PROMPTS}
            print("kvf-up's proxy (--model %s): %s" % (dense, want))

            # 1. another model's tokenizer: refused
            log1 = os.path.join(pool.run_dir, "proxy-hybrid.log")
            p1, px1 = start_proxy(pool, ["--model", hybrid], log1)
            procs.append(p1)

            def refused():
                h = px1.health()[1]
                insts = h["prefill"] + h["decode"]
                return all((not i["healthy"]) and "incompatible: its tokenizer" in
                           i.get("error", "") for i in insts) and h
            h1 = wait_for(refused, 20, "every instance incompatible for the tiny-hybrid proxy")
            err = h1["prefill"][0]["error"]
            assert h1["tokenizer"]["digest"] and h1["tokenizer"]["digest"] in err, (h1, err)
            assert os.path.realpath(dense) in err, err
            try:
                r = px1.complete(PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0, timeout=30)
                raise AssertionError("answered with another model's tokenizer: %r" % r)
            except HttpError as e:
                assert e.status == 503, (e.status, e.body)
                status1 = e.status
            print("proxy with --model %s: %d/%d instances refused (%r), completion %d" % (
                hybrid, len(h1["prefill"] + h1["decode"]), len(h1["prefill"] + h1["decode"]),
                err, status1))

            # 2. no --model: the daemons' model, same answers
            log2 = os.path.join(pool.run_dir, "proxy-nomodel.log")
            p2, px2 = start_proxy(pool, [], log2)
            procs.append(p2)
            h2 = wait_for(lambda: (px2.health()[0] == 200 and px2.health()[1]["tokenizer"]
                                   ["digest"]) and px2.health()[1], 20,
                          "the model-less proxy adopted the daemons' tokenizer")
            assert os.path.realpath(dense) in h2["tokenizer"]["source"], h2["tokenizer"]
            got = {p: answer(px2, p) for p in PROMPTS}
            assert got == want, (got, want)
            assert "serving text with the tokenizer of the daemons' model" in open(log2).read()
            print("proxy without --model: tokenizer %s from %r; answers %s, the same as with "
                  "--model" % (h2["tokenizer"]["digest"], h2["tokenizer"]["source"], got))
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
    print("test_e2e_proxy_tokenizer passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
