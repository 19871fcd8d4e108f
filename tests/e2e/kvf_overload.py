"""Overload driving for the tests and the benchmark (tests/e2e/test_e2e_overload.py,
tests/bench/overload.py): measure what a pool serves at saturation (closed loop), then
send open-loop Poisson arrivals at a multiple of it and classify every answer.

Each request is a greedy completion of one of PROMPTS (so an answer can be checked
token for token against the colocated `kvf generate` run); a 503 must come fast with
Retry-After (admission, deploy/proxy/kvf_proxy_route.h), a 504 must not come at all.
"""

import http.client
import json
import random
import threading
import time

from e2e_models import check_tokens, reference

MAX_TOKENS = 8
# byte-level tokenizer: about one token per character; 40-560 tokens, not capped to
# the prefill rate (admission, not the client, keeps the queue within the deadline)
PROMPTS = ["overload %d: " % i + "the ferry carries KV blocks across the water, " * (1 + 2 * i)
           for i in range(6)]


def references(model, prompts=PROMPTS, max_tokens=MAX_TOKENS):
    return [reference(model, p, max_tokens) for p in prompts]


def post(pool, prompt, max_tokens=MAX_TOKENS, timeout=120, stream=False):
    """One completion: dict(status, latency_s, ids, retry_after, error)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "return_token_ids": True, "stream": stream}
    if pool.model_name:
        body["model"] = pool.model_name
    out = {"status": None, "ids": None, "retry_after": None, "error": None}
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(pool.host, pool.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        out["status"] = r.status
        out["retry_after"] = r.getheader("Retry-After")
        if r.status == 200 and not stream:
            out["ids"] = json.loads(raw)["choices"][0]["token_ids"]
        elif r.status == 200:
            ids = []
            for ln in raw.decode("utf-8", "replace").split("\n"):
                if ln.startswith("data:") and ln[5:].strip() != "[DONE]":
                    ev = json.loads(ln[5:])
                    if "error" in ev:
                        out["status"], out["error"] = "stream-error", ev["error"]
                        break
                    ids += ev["choices"][0].get("token_ids", [])
            out["ids"] = ids if out["status"] == 200 else None
        else:
            out["error"] = raw[:300]
    except OSError as e:
        out["status"], out["error"] = "exception", repr(e)
    finally:
        conn.close()
    out["latency_s"] = time.monotonic() - t0
    return out


def closed_loop(pool, clients, seconds, seed=1):
    """clients back-to-back senders for seconds: (results, wall)."""
    results, lock = [], threading.Lock()
    deadline = time.monotonic() + seconds

    def client(k):
        rng = random.Random(seed + k)
        while time.monotonic() < deadline:
            i = rng.randrange(len(PROMPTS))
            r = post(pool, PROMPTS[i])
            r["prompt"] = i
            with lock:
                results.append(r)
            if r["status"] == 503:
                time.sleep(0.2)   # back off instead of spinning on refusals

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 180)
    return results, time.monotonic() - t0


def capacity(pool, clients=16, seconds=15.0):
    """Requests per second served at saturation (closed loop, answered 200)."""
    res, wall = closed_loop(pool, clients, seconds)
    ok = sum(1 for r in res if r["status"] == 200)
    return ok / wall, res


def open_loop(pool, rate, seconds, seed=2, stream_share=0.0):
    """Poisson arrivals at rate per second for seconds, a thread each:
    (results with 'arrival' and 'done' times, first arrival, last completion)."""
    rng = random.Random(seed)
    results, lock, threads = [], threading.Lock(), []
    t0 = time.monotonic()

    def one(i, stream):
        arrival = time.monotonic()
        r = post(pool, PROMPTS[i], stream=stream)
        r.update(prompt=i, arrival=arrival, done=time.monotonic())
        with lock:
            results.append(r)

    t = t0
    while t - t0 < seconds:
        t += rng.expovariate(rate)
        delay = t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=one, args=(rng.randrange(len(PROMPTS)),
                                                rng.random() < stream_share))
        th.start()
        threads.append(th)
    for th in threads:
        th.join(timeout=300)
    first = min(r["arrival"] for r in results)
    last = max(r["done"] for r in results)
    return results, first, last


def classify(results, refs):
    """Counts: served (200 and right), wrong, 503, 504, other; rejection latencies."""
    c = {"served": 0, "wrong": 0, "503": 0, "504": 0, "other": 0, "no_retry_after": 0,
         "reject_s": [], "served_s": [], "others": []}
    for r in results:
        if r["status"] == 200:
            toks, logits = refs[r["prompt"]]
            try:
                check_tokens(r["ids"], toks, logits, False, "prompt %d" % r["prompt"])
                c["served"] += 1
                c["served_s"].append(r["latency_s"])
            except AssertionError as e:
                c["wrong"] += 1
                c["others"].append(str(e)[:200])
        elif r["status"] == 503:
            c["503"] += 1
            c["reject_s"].append(r["latency_s"])
            if not r["retry_after"]:
                c["no_retry_after"] += 1
        elif r["status"] == 504:
            c["504"] += 1
            c["others"].append(str(r["error"])[:200])
        else:
            c["other"] += 1
            c["others"].append("%s: %s" % (r["status"], str(r["error"])[:200]))
    return c


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else 0.0


def report(label, c, cap, first, last, offered):
    wall = last - first
    goodput = c["served"] / wall if wall > 0 else 0.0
    lines = [
        "%s: offered %.1f req/s (%.1fx the measured capacity %.2f req/s) for %.0f s" % (
            label, offered, offered / cap if cap else 0, cap, wall),
        "  served %d, 503 %d (without Retry-After %d), 504 %d, wrong answers %d, other %d" % (
            c["served"], c["503"], c["no_retry_after"], c["504"], c["wrong"], c["other"]),
        "  rejection latency p50 %.1f ms p99 %.1f ms max %.1f ms; served latency p50 %.2f s"
        " p99 %.2f s" % (1000 * pct(c["reject_s"], 50), 1000 * pct(c["reject_s"], 99),
                         1000 * max(c["reject_s"] or [0]), pct(c["served_s"], 50),
                         pct(c["served_s"], 99)),
        "  goodput %.2f req/s over %.1f s = %.0f %% of capacity" % (
            goodput, wall, 100.0 * goodput / cap if cap else 0),
    ]
    return "\n".join(lines), goodput
