#!/usr/bin/env python3
"""A failed pull gives prefill its pages back at once (issue 23, docs/LEASE.md).

Decode's first release is dropped (fault lease.send@1=drop: not sent, the
pull fails as unanswered), so decode cannot trust the read and fails the
request. It then sends an abandoning release (every rank, status not OK):
nothing reads those pages any more. Prefill must free them at once, not
after the lease (30 s) and its quarantine (if the proxy's abort of the
failed request reaches prefill first, the lease is quarantined and the
abandon cuts that short: quarantine_cut_blocks counts it). Measured from the client's error
to the moment the proxy's /health (probed every few hundred ms) shows every
prefill page free: under 1 s; the figure is printed. The next request is
answered with the colocated tokens.
"""

import os
import time

from e2e_models import check_tokens, model_dir, reference
from kvf_e2e import HttpError, Pool, skip_without_test_switches, wait_for

PROMPT = "the pull of this prompt fails after its reads"
MAX_TOKENS = 8


def prefill_sample(pool):
    """(when prefill answered the proxy's latest probe, monotonic s; its health)."""
    t = time.monotonic()
    p = pool.health()[1]["prefill"][0]
    return t - p["last_ok_age_ms"] / 1e3, p


def main():
    skip_without_test_switches()
    model = model_dir("tiny-hybrid")
    ref_tokens, ref_logits = reference(model, PROMPT, MAX_TOKENS)
    os.environ["KVF_FAULT"] = "lease.send@1=drop"
    try:
        pool = Pool(layout="1p1d", model=model, timeout=60,
                    decode_args=["--load-failure", "fail", "--xfer-timeout", "2s"])
        pool.start()
    finally:
        del os.environ["KVF_FAULT"]
    try:
        try:
            r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                              return_token_ids=True, timeout=30)
            raise AssertionError("answered 200 although the release was dropped: %s" % r)
        except HttpError as e:
            t_err = time.monotonic()
            msg = str(e.body)
            assert e.status >= 500, e
            assert "releasing the KV lease" in msg and "not trusted" in msg, msg
        assert "fault lease.send fired" in pool.log("decode-0"), pool.log("decode-0")[-2000:]
        # the first health answer given after the error (the proxy probes every few
        # hundred ms) already shows every page free, and it came within 1 s
        at, p = wait_for(lambda: (lambda s: s if s[0] > t_err else None)(prefill_sample(pool)),
                         2.0, "a health answer after the error", interval=0.01)
        back_ms = 1e3 * (at - t_err)
        print("failed pull: prefill's first health answer after the client's error (%.0f ms"
              " later) shows free %d of %d pages, quarantined %d (cut short by the abandon"
              " %d), leases %s"
              % (back_ms, p["free_pages"], p["total_pages"], p["quarantined_blocks"],
                 p["quarantine_cut_blocks"], p.get("leases")))
        assert p["free_pages"] == p["total_pages"], "pages still pinned: %s" % p
        assert back_ms < 1000, back_ms
        # The proxy aborts the failed request on prefill (control channel) while decode's
        # abandon goes over the side channel: when the abort lands first (seen under load)
        # the lease is quarantined and the abandon then cuts the quarantine short. What
        # matters: no block waited out a quarantine.
        assert p["quarantined_blocks"] == p["quarantine_cut_blocks"], \
            "blocks waited out a quarantine: %s" % p
        r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True)
        check_tokens(r["choices"][0]["token_ids"], ref_tokens, ref_logits, True,
                     "the request after the failed pull")
    finally:
        pool.stop()
    print("PASS test_e2e_failed_pull")


if __name__ == "__main__":
    main()
