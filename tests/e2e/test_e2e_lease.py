#!/usr/bin/env python3
"""A read counts only if the lease held throughout (docs/ARCHITECTURE.md §9).

The late read: decode starts its GETs after prefill's lease on the request
expired, while another prompt has been prefilled into the same blocks. The
GETs themselves succeed (the remote key covers the whole pool), so only the
lease tells stale from good bytes. Expected: never an HTTP 200 with wrong
tokens. With --load-failure fail the client gets an error saying the KV
lease expired before the read finished; with recompute it gets the
colocated run's tokens, marked recomputed. /metrics counts the prevented
read. Both a hybrid (Mamba state in the reused pages) and a dense model.

The window is made with decode's hidden --test-pull-delay (between its
lease claim and the GETs) longer than prefill's --lease-timeout, and a
prefill pool that holds one prompt, so the second prompt must reuse the
first one's pages.
"""

import threading
import time

from e2e_models import check_tokens, model_dir, reference
from kvf_e2e import HttpError, Pool, skip_without_test_switches, wait_for

PROMPT_A = "the first prompt, whose decode comes too late"
PROMPT_B = "another prompt that reuses those very blocks!"
MAX_TOKENS = 8


def prefill(pool):
    return pool.health()[1]["prefill"][0]


def late_read(name, policy):
    model = model_dir(name)
    refs = {p: reference(model, p, MAX_TOKENS) for p in (PROMPT_A, PROMPT_B)}
    with Pool(layout="1p1d", model=model, timeout=60,
              prefill_args=["--lease-timeout", "1s", "--xfer-timeout", "1s", "--num-blocks", "3"],
              decode_args=["--test-pull-delay", "3s", "--xfer-timeout", "1s",
                           "--load-failure", policy],
              proxy_args=["--token-timeout", "20s"]) as pool:
        out = {}

        def send(key, prompt):
            try:
                out[key] = pool.complete(prompt, max_tokens=MAX_TOKENS, temperature=0,
                                         return_token_ids=True, timeout=40)
            except HttpError as e:
                out[key] = e

        ta = threading.Thread(target=send, args=("a", PROMPT_A))
        ta.start()
        # A's lease is held, then ends (expiry); only then may B reuse its pages
        wait_for(lambda: prefill(pool)["leases"] == 1, 5, "A's lease", interval=0.02)
        wait_for(lambda: prefill(pool)["leases"] == 0, 5, "A's lease to expire", interval=0.02)
        tb = threading.Thread(target=send, args=("b", PROMPT_B))
        tb.start()
        ta.join(timeout=60)
        tb.join(timeout=60)
        assert "a" in out and "b" in out, out
        for key, prompt in (("a", PROMPT_A), ("b", PROMPT_B)):
            r = out[key]
            if isinstance(r, HttpError):
                msg = r.body["error"]["message"] if isinstance(r.body, dict) else str(r.body)
                assert r.status >= 500, r
                if key == "a":
                    assert policy == "fail", "recompute policy failed request A: %s" % msg
                    assert "KV lease expired before the read finished" in msg, msg
                continue
            # a 200 must carry the right tokens, whatever happened to the lease
            ref_tokens, ref_logits = refs[prompt]
            check_tokens(r["choices"][0]["token_ids"], ref_tokens, ref_logits, True,
                         "%s request %s (%s)" % (name, key, policy))
            if key == "a":
                assert policy == "recompute", "request A answered 200 from expired pages"
                assert r["kv_transfer"]["recomputed"] is True, r["kv_transfer"]
        m = pool.metrics()
        prevented = m.sum("kvf_instance_expired_lease_reads_prevented_total")
        assert prevented >= 1, m.text[-3000:]
        wait_for(lambda: all(i["free_pages"] == i["total_pages"]
                             for i in pool.health()[1]["prefill"] + pool.health()[1]["decode"]),
                 15, "pages back on both sides")
        print("%s, policy %s: late read after lease expiry %s" % (
            name, policy, "failed clearly" if policy == "fail" else "recomputed"))


def main():
    skip_without_test_switches()   # --test-pull-delay
    t0 = time.monotonic()
    late_read("tiny-hybrid", "fail")
    late_read("tiny-dense", "fail")
    late_read("tiny-hybrid", "recompute")
    print("test_e2e_lease passed in %.1f s" % (time.monotonic() - t0))


if __name__ == "__main__":
    main()
