#!/usr/bin/env python3
"""The per-request TTFT breakdown with the real daemons (tiny hybrid, 4p2d).

Every answer's ttft_breakdown splits the time to the first decoded token
into phases measured by three processes (proxy, prefill, decode; decode's
transfer phases are max over its TP ranks). Checked, per request:

- the timed phases alone (everything but "unaccounted") add up to the
  measured time to the first decoded token within TOL_MS + TOL_FRAC of it:
  the untimed gaps (validation, protobuf packing, lease bookkeeping) are small;
- the prefill-side phases add up to the client-visible ttft_ms the same way;
- no phase the daemons time is negative; the wire phase is positive when bytes
  moved (the proxy handshakes every pairing at start, so handshake_ms is the
  cache lookup here);
- /metrics has kvf_proxy_ttft_phase_seconds{phase=...} for every phase with
  one observation per request, and the time-to-first-decode-token histogram.
"""

from e2e_models import model_dir
from kvf_e2e import Pool

TOL_MS = 3.0
TOL_FRAC = 0.10
PHASES = ["proxy_queue", "prefill_queue", "prefill_compute", "prefill_relay", "proxy_dispatch",
          "decode_queue", "block_alloc", "handshake", "descriptor_posting", "wire", "post_ops",
          "first_decode_step", "decode_relay"]
PREFILL_SIDE = PHASES[:4]


def check_one(i, bd, kv):
    total = bd["time_to_first_decode_token_ms"]
    timed = sum(bd[p + "_ms"] for p in PHASES)
    assert abs(bd["unaccounted_ms"] - (total - timed)) < 1e-6, bd
    assert abs(total - timed) <= TOL_MS + TOL_FRAC * total, \
        "request %d: phases add up to %.3f ms, measured %.3f ms: %s" % (i, timed, total, bd)
    pre = sum(bd[p + "_ms"] for p in PREFILL_SIDE)
    assert abs(bd["ttft_ms"] - pre) <= TOL_MS + TOL_FRAC * bd["ttft_ms"], \
        "request %d: prefill phases %.3f ms, ttft %.3f ms: %s" % (i, pre, bd["ttft_ms"], bd)
    for p in PHASES:
        if p.endswith("relay"):
            continue     # a difference of two clocks' readings; may be slightly negative
        assert bd[p + "_ms"] >= 0, (i, p, bd)
    assert bd["tp_ranks"] == "max", bd
    assert bd["wire_ms"] > 0 and kv["bytes"] > 0, (bd, kv)
    assert total >= bd["ttft_ms"], bd
    return total, timed


def main():
    model = model_dir("tiny-hybrid")
    prompts = ["The ferry left at dawn", "x" * 79, "Prefill computes, decode pulls. " * 4]
    with Pool(layout="4p2d", model=model, timeout=60) as pool:
        rows = []
        for i in range(6):
            stream = (i % 2 == 1)
            r = pool.complete(prompts[i % 3], max_tokens=4, temperature=0, stream=stream,
                              return_token_ids=True)
            final = r.final if stream else r
            bd, kv = final["ttft_breakdown"], final["kv_transfer"]
            rows.append((i, stream) + check_one(i, bd, kv) + (bd,))
        print("%-3s %-6s %10s %10s %8s" % ("req", "stream", "measured", "phases", "error"))
        for i, stream, total, timed, bd in rows:
            print("%-3d %-6s %10.3f %10.3f %+7.1f%%" % (i, stream, total, timed,
                                                      100 * (timed - total) / total))
        print("last request's phases (ms):",
              ", ".join("%s %.3f" % (p, rows[-1][4][p + "_ms"]) for p in PHASES))
        m = pool.metrics()
        for p in PHASES + ["unaccounted"]:
            n = m.value("kvf_proxy_ttft_phase_seconds_count", phase=p)
            assert n == 6, (p, n)
        assert m.value("kvf_proxy_time_to_first_decode_token_seconds_count") == 6
        print("ok: %d requests' phases add up within %.0f ms + %.0f%%; /metrics has every "
              "phase" % (len(rows), TOL_MS, 100 * TOL_FRAC))


if __name__ == "__main__":
    main()
