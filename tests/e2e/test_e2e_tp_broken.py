#!/usr/bin/env python3
"""A broken TP world makes its instance unhealthy, is routed around, and comes
back under kvf-up --supervise (issue 23 item 5).

Pool: 2 prefill instances of TP 2 and 1 decode, started with --supervise. The
fault point tp.barrier@1=drop (base/kvf_fault.h) is armed in prefill-1
only: the test writes it into prefill-1.cmd (the command kvf-supervise starts
it with) and restarts that instance with kvf-up --restart, wrapping the
daemon so that its exit status lands in a file. The first request prefill-1
computes loses a rank's arrival at a barrier: the barrier breaks as a timeout
would, and the world with it, for good. Expected:

1. The proxy's /health shows prefill-1 unhealthy, with the barrier's error
   text (HealthReply.cannot_serve), while the process still answers probes.
2. Every request sent from then on is answered 200 with the colocated
   reference tokens, and prefill-1's log shows that none of them reached it
   (a broken instance logs every prompt it refuses: there are none).
3. prefill-1 exits with status 1 after its grace (KVF_ROLE_BROKEN_EXIT_MS);
   kvf-supervise starts it again from the restored command: /health shows it
   healthy again as a new process (restarts counted), and requests succeed
   through both prefill instances again.

Rerun (a build with -DKVF_FAULT_INJECTION=ON; tests/run.sh builds one):
  python3 tests/e2e/test_e2e_tp_broken.py
"""

import os
import re
import shlex
import subprocess
import sys
import time

from e2e_models import check_tokens, model_dir, reference
from kvf_e2e import HttpError, Pool, wait_for

PROMPT = "the ferry crosses twice a day"
MAX_TOKENS = 6
FAULT = "tp.barrier@1=drop"


class SupervisedPool(Pool):
    def _up_cmd(self, base_port):
        return super()._up_cmd(base_port) + ["--supervise"]


def has_fault_points(bin_dir):
    p = subprocess.run([os.path.join(bin_dir, "kvf-prefill"), "--print-config"],
                       env=dict(os.environ, KVF_FAULT="tp.barrier@1000000000=stall:1"),
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return p.returncode == 0


def inst(pool, role, engine_id):
    for i in pool.health()[1][role]:
        if i["engine_id"] == engine_id or i["url"].endswith(engine_id):
            return i
    return None


def by_url(pool, url):
    return [i for i in pool.health()[1]["prefill"] if i["url"] == url][0]


def main():
    model = model_dir("tiny-dense")
    ref_tokens, ref_logits = reference(model, PROMPT, MAX_TOKENS)
    pool = SupervisedPool(layout="2p1d", model=model, prefill_instances=2, timeout=120)
    if not has_fault_points(pool.bin_dir):
        print("skipped: this build has no fault points (configure with "
              "-DKVF_FAULT_INJECTION=ON; tests/run.sh does)")
        return 77
    t_start = time.monotonic()
    with pool:
        rd = pool.run_dir
        urls = [i["url"] for i in pool.health()[1]["prefill"]]
        url1 = [i["url"] for i in pool.health()[1]["prefill"] if i["engine_id"] == "prefill-1"][0]
        cmdf = os.path.join(rd, "prefill-1.cmd")
        with open(cmdf) as f:
            clean = f.read().strip()
        exitf = os.path.join(rd, "prefill-1.exit")
        # env A=B ... exe args  ->  env KVF_FAULT=... A=B ... bash -c 'exe args; echo $? > exitf'
        words = shlex.split(clean)
        k = 1
        while k < len(words) and "=" in words[k]:
            k += 1
        armed = " ".join(["env", shlex.quote("KVF_FAULT=" + FAULT)] +
                         [shlex.quote(w) for w in words[1:k]] +
                         ["bash", "-c", shlex.quote("%s; echo $? > %s" % (
                             " ".join(shlex.quote(w) for w in words[k:]), shlex.quote(exitf)))])
        with open(cmdf, "w") as f:
            f.write(armed + "\n")
        restarts0 = by_url(pool, url1)["restarts"]
        subprocess.run([os.path.join(pool.bin_dir, "kvf-up"), "--run-dir", rd,
                        "--restart", "prefill-1"], check=True, timeout=60,
                       stdout=subprocess.DEVNULL)
        wait_for(lambda: (by_url(pool, url1)["restarts"] > restarts0 and
                          by_url(pool, url1)["healthy"]), 60, "prefill-1 back, with the fault")
        with open(cmdf, "w") as f:          # its next start (by the supervisor) is clean
            f.write(clean + "\n")

        # 1. send until prefill-1 computes one; it breaks
        t_break = None
        failed = 0
        for n in range(8):
            try:
                r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                  return_token_ids=True, timeout=60)
                check_tokens(r["choices"][0]["token_ids"], ref_tokens, ref_logits, False,
                             "request %d before the break" % n)
            except HttpError as e:
                failed += 1
                print("request %d, the one prefill-1 broke on: HTTP %d %s" % (
                    n, e.status, str(e.body)[:200]))
            if "fault tp.barrier fired" in pool.log("prefill-1"):
                t_break = time.monotonic()
                break
        assert t_break is not None, "prefill-1 never computed a request:\n" + \
            pool.log("prefill-1")[-3000:]
        assert failed <= 1, failed

        def shown():
            i = by_url(pool, url1)
            return (not i["healthy"]) and ("barrier" in i.get("error", "")) and i

        i1 = wait_for(shown, 10, "prefill-1 unhealthy with the barrier error in /health")
        seen_ms = (time.monotonic() - t_break) * 1000
        assert "timed out" in i1["error"], i1
        alive = os.path.exists("/proc/%d" % pool.pids()["prefill-1"]) and \
            not os.path.exists(exitf)
        print("/health within %.0f ms of the break (process %s): prefill-1 healthy=%s error=%r"
              % (seen_ms, "still answering" if alive else "gone", i1["healthy"], i1["error"]))
        status, h = pool.health()
        print("proxy /health status %d with one prefill broken" % status)

        # 2. routed around: every request succeeds through prefill-0
        log_before = pool.log("prefill-1")
        ok = 0
        t2 = time.monotonic()
        while ok < 6:
            r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                              return_token_ids=True, timeout=60)
            check_tokens(r["choices"][0]["token_ids"], ref_tokens, ref_logits, False,
                         "request %d while prefill-1 is broken" % ok)
            ok += 1
        refused_after = pool.log("prefill-1")[len(log_before):].count("refused: this instance "
                                                                      "cannot serve")
        assert refused_after == 0, pool.log("prefill-1")[len(log_before):]
        print("%d of %d requests answered 200 with the reference tokens while prefill-1 was "
              "broken or gone (%.1f s), %d of them reached it" % (
                  ok, ok, time.monotonic() - t2, refused_after))

        # 3. it exits 1 after its grace; the supervisor brings it back
        wait_for(lambda: os.path.exists(exitf) and open(exitf).read().strip() != "", 30,
                 "prefill-1 exited")
        with open(exitf) as f:
            code = int(f.read().strip())
        assert code == 1, code
        log1 = pool.log("prefill-1")
        m = re.search(r"exiting: the TP world broke (\d+) ms ago", log1)
        assert m, log1[-3000:]
        print("prefill-1 exited with status %d, %s ms after the break (grace)" % (code, m.group(1)))
        back = wait_for(lambda: (by_url(pool, url1)["healthy"] and
                                 by_url(pool, url1)["restarts"] >= restarts0 + 2) and
                        by_url(pool, url1), 60, "prefill-1 restarted by the supervisor")
        t_back = time.monotonic() - t_break
        with open(os.path.join(rd, "prefill-1.restarts")) as f:
            nrest = int(f.read().strip())
        for n in range(4):
            r = pool.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                              return_token_ids=True, timeout=60)
            check_tokens(r["choices"][0]["token_ids"], ref_tokens, ref_logits, False,
                         "request %d after the restart" % n)
        assert "fault tp.barrier" not in pool.log("prefill-1")[len(log1):]
        print("prefill-1 healthy again %.1f s after the break (supervisor restarts: %d; proxy "
              "saw %d restarts), 4 more requests through both prefill instances answered 200"
              % (t_back, nrest, back["restarts"]))
        assert len(urls) == 2
    print("test_e2e_tp_broken passed in %.1f s" % (time.monotonic() - t_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
