#!/usr/bin/env python3
"""kvf bench-serve benchmarks chat as vLLM's benchmark does (issue 46 item 5), against a real
1p1d pool of the trained tiny hybrid.

1. --backend openai-chat --endpoint /v1/chat/completions --tokenizer DIR: every request
   succeeds with its 4 output tokens (--ignore-eos), the result JSON says backend and
   endpoint_type openai-chat, and the proxy counted more prompt tokens than the same run
   through /v1/completions (the chat template wraps each prompt: it went through chat).
2. The gnuplot found first on $PATH is used, and what it writes on stderr never reaches the
   tool's output (a stand-in gnuplot that warns and writes the PNG); when it fails, its
   message is in the one error line.
3. Refused by name before anything is sent: openai-chat with /v1/completions, openai with the
   chat endpoint, openai-chat on random token ids without --tokenizer.

Rerun: KVF_BIN=build/bin KVF_SOURCE_DIR=. python3 tests/tools/test_bench_serve_chat.py
"""

import glob
import json
import os
import re
import subprocess
import tempfile

FAKE = r"""#!/bin/sh
# stand-in gnuplot: a warning on stderr, the PNG named by 'set output', exit $FAKE_RC
echo "fake gnuplot warning: line 3: skipping data" >&2
touch "$FAKE_MARK"
out=$(sed -n "s/^set output '\(.*\)'$/\1/p" "$1" | head -n1)
[ -n "$out" ] && printf '\211PNG\r\n\032\n' > "$out"
exit ${FAKE_RC:-0}
"""


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError("%s\n%s" % (what, detail))
    print("ok: " + what)


def main():
    bindir = os.environ["KVF_BIN"]
    kvf = os.path.join(bindir, "kvf")
    model = os.path.join(os.environ["KVF_SOURCE_DIR"], "models-trained", "tiny-hybrid")
    with tempfile.TemporaryDirectory(prefix="kvf-bs-chat.") as tmp:
        fakebin = os.path.join(tmp, "fakebin")
        os.mkdir(fakebin)
        with open(os.path.join(fakebin, "gnuplot"), "w") as f:
            f.write(FAKE)
        os.chmod(os.path.join(fakebin, "gnuplot"), 0o755)
        mark = os.path.join(tmp, "gnuplot-ran")
        env = dict(os.environ, PATH=fakebin + ":" + os.environ["PATH"], FAKE_MARK=mark)
        run = os.path.join(tmp, "run")
        up = subprocess.run([os.path.join(bindir, "kvf-up"), "--layout", "1p1d", "--model", model,
                             "--run-dir", run, "--port", "0", "--bin", bindir],
                            capture_output=True, text=True, timeout=120)
        try:
            check(up.returncode == 0, "1p1d pool up", up.stderr[-2000:])
            url = up.stdout.strip().splitlines()[-1]
            common = ["--base-url", url, "--num-prompts", "6", "--random-input-len", "16",
                      "--random-output-len", "4", "--ignore-eos", "--request-rate", "inf",
                      "--save-result"]

            def bench(args, rdir, rc_env=None):
                e = dict(env, FAKE_RC=rc_env or "0")
                return subprocess.run([kvf, "bench-serve"] + common + ["--result-dir", rdir] +
                                      args, capture_output=True, text=True, timeout=120, env=e)

            # 1. chat through the chat endpoint, 2. with a warning gnuplot on $PATH
            p = bench(["--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
                       "--tokenizer", model], os.path.join(tmp, "chat"))
            check(p.returncode == 0, "openai-chat run: exit 0", p.stdout[-1500:] + p.stderr)
            res = json.load(open(glob.glob(os.path.join(tmp, "chat", "*.json"))[0]))
            check(res["completed"] == 6 and res["failed"] == 0 and
                  res["total_output_tokens"] == 24,
                  "6 chat requests, 4 tokens each", {k: res.get(k) for k in
                                                     ("completed", "failed",
                                                      "total_output_tokens")})
            check(res["backend"] == "openai-chat" and res["endpoint_type"] == "openai-chat",
                  "the result says openai-chat")
            check(os.path.exists(mark), "the gnuplot on $PATH was the one run")
            out = p.stdout + p.stderr
            check("fake gnuplot warning" not in out and
                  re.search(r"wrote \S+\.png", out) is not None,
                  "its warning stays out of the output; the PNG is reported", out[-800:])
            q = bench(["--backend", "openai", "--endpoint", "/v1/completions"],
                      os.path.join(tmp, "cmpl"))
            check(q.returncode == 0, "the same run through /v1/completions")
            cres = json.load(open(glob.glob(os.path.join(tmp, "cmpl", "*.json"))[0]))
            check(res["total_input_tokens"] > cres["total_input_tokens"] == 6 * 16,
                  "chat prompts carry the template: %d prompt tokens vs %d" %
                  (res["total_input_tokens"], cres["total_input_tokens"]))
            f = bench(["--backend", "openai"], os.path.join(tmp, "fail"), rc_env="1")
            check("gnuplot" in f.stderr and "fake gnuplot warning: line 3" in f.stderr,
                  "a failing gnuplot: its message in the error line", f.stderr[-800:])

            # 3. refusals before anything is sent
            for args, want in (
                    (["--backend", "openai-chat", "--tokenizer", model],
                     "bad value '/v1/completions' for --endpoint with --backend openai-chat"),
                    (["--backend", "openai", "--endpoint", "/v1/chat/completions"],
                     "bad value '/v1/chat/completions' for --endpoint with --backend openai"),
                    (["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"],
                     "--backend openai-chat sends each prompt as a text message: give "
                     "--tokenizer")):
                r = bench(args, os.path.join(tmp, "refused"))
                check(r.returncode == 2 and want in r.stderr, "refused: %s" % want,
                      r.stderr[-600:])
        finally:
            subprocess.run([os.path.join(bindir, "kvf-down"), "--run-dir", run],
                           capture_output=True, timeout=60)
    print("PASS test_bench_serve_chat")


if __name__ == "__main__":
    main()
