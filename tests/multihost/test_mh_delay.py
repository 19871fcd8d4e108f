#!/usr/bin/env python3
"""One-way delay (tc netem, 0.2 to 5 ms) on the decode host's link: answers
still equal the colocated run; prints transfer time per delay.

Needs the kernel's netem qdisc (sch_netem). A kernel built without it cannot
delay packets: the test then says so and exits 77 (skipped), never passes.
Hosts and pool as in test_mh_pool.py: proxy on h0, a TP4 prefill on h1, two
TP2 decode instances on h2, deployed with kvf-up over ssh.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

from mh_net import TestNet, skip  # noqa: E402
from test_mh_pool import (BENCH_PROMPT, PROMPTS, MhPool, check_answer,  # noqa: E402
                          long_reference)


def main():
    with TestNet(3) as net:
        if not net.has_netem():
            net.close()
            skip("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): tc cannot delay "
                 "packets here; bandwidth caps and loss are tested in test_mh_pool")
        from e2e_models import model_dir
        model = model_dir("tiny-hybrid")
        refs = {p: long_reference(net, model, p) for p in PROMPTS + [BENCH_PROMPT]}
        net.start_sshd([1, 2])
        pool = MhPool(net, [1, 2, 2], "4p2d", 1, 2, model, "delay").start()
        rows = []
        try:
            for delay in (0.2, 1, 5):
                net.shape(2, delay_ms=delay)
                try:
                    for prompt in (PROMPTS[0], BENCH_PROMPT):
                        kv = check_answer(pool.proxy, refs, prompt, "delay %g ms" % delay)
                        rows.append((delay, kv["bytes"], kv["transfer_ms"]))
                finally:
                    net.shape(2)
        finally:
            pool.down()
        print("delay_ms    bytes  transfer_ms")
        for d, b, ms in rows:
            print("%8g %8d %12.2f" % (d, b, ms))
        # a pull needs at least one round trip (2 x the one-way delay each way)
        assert all(ms >= 2 * d for d, _, ms in rows if d >= 1), rows
    print("test_mh_delay passed")


if __name__ == "__main__":
    main()
