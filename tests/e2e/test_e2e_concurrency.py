#!/usr/bin/env python3
"""A few dozen concurrent requests across two decode instances (2p1d x 2):
every one completes with the colocated run's greedy tokens, both decode
instances serve some, and afterwards every instance's free-page count is
back to where it started (no leaked blocks, no leaked leases).

Then the same against a decode instance whose pool holds only four requests
at a time: the others wait in line for blocks instead of failing."""

import threading

from e2e_models import check_tokens, model_dir, reference
from kvf_e2e import Pool, wait_for

N_REQUESTS = 36
PROMPTS = ["request %d: the quick brown fox" % i for i in range(6)]
MAX_TOKENS = 8


def free_pages(pool):
    code, h = pool.health()
    assert code == 200, h
    return {i["url"]: (i["free_pages"], i["total_pages"]) for i in h["prefill"] + h["decode"]}


def main():
    model = model_dir("tiny-hybrid")
    refs = {p: reference(model, p, MAX_TOKENS) for p in PROMPTS}
    with Pool(layout="2p1d", model=model, decode_instances=2, timeout=60) as pool:
        start = free_pages(pool)
        assert all(f == t and t > 0 for f, t in start.values()), start
        results, errors = [None] * N_REQUESTS, []

        def worker(i):
            try:
                prompt = PROMPTS[i % len(PROMPTS)]
                stream = (i % 2 == 1)
                r = pool.complete(prompt, max_tokens=MAX_TOKENS, temperature=0, stream=stream,
                                  return_token_ids=True, timeout=120)
                if stream:
                    assert r.done and not r.errors, r.events[-2:]
                    results[i] = (prompt, r.token_ids, r.final.get("decode_instance"))
                else:
                    results[i] = (prompt, r["choices"][0]["token_ids"], r["decode_instance"])
            except Exception as e:          # reported below with the request index
                errors.append((i, repr(e)))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(N_REQUESTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        assert not errors, errors
        assert all(r is not None for r in results), "a request never finished"
        used = set()
        for i, (prompt, got, decode) in enumerate(results):
            ref_tokens, ref_logits = refs[prompt]
            check_tokens(got, ref_tokens, ref_logits, False, "request %d" % i)
            assert decode, "request %d: no decode_instance in the answer" % i
            used.add(decode)
        assert len(used) == 2, "round robin used decode instances %s" % used

        # releases and frees are asynchronous to the answers: poll, bounded
        wait_for(lambda: free_pages(pool) == start, 15, "free pages back to the start")
    print("%d requests over 2 decode instances" % N_REQUESTS)

    # 12 blocks: a short request holds 1 attention + 2 Mamba blocks, so 4 fit at once
    with Pool(layout="1p1d", model=model, timeout=60,
              decode_args=["--num-blocks", "12"]) as pool:
        start = free_pages(pool)
        results, errors = [None] * 20, []

        def small(i):
            try:
                prompt = PROMPTS[i % len(PROMPTS)]
                r = pool.complete(prompt, max_tokens=MAX_TOKENS, temperature=0,
                                  return_token_ids=True, timeout=120)
                results[i] = (prompt, r["choices"][0]["token_ids"])
            except Exception as e:
                errors.append((i, repr(e)))

        threads = [threading.Thread(target=small, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        assert not errors, errors
        for i, (prompt, got) in enumerate(results):
            check_tokens(got, refs[prompt][0], refs[prompt][1], False, "queued request %d" % i)
        wait_for(lambda: free_pages(pool) == start, 15, "free pages back to the start")
    print("20 requests through a decode pool that holds 4 at a time: all served")
    print("test_e2e_concurrency passed")


if __name__ == "__main__":
    main()
