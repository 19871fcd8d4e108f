"""The model digest at the handshake (issue 22 item 4), with real daemons:

1. `kvf mkmodel --seed 1` and `--seed 2` of the same config (the same
   geometry, so the config fingerprint matches) served as prefill and decode
   through kvf-up: kvf-up refuses the pool before it starts any process
   (kvf pool-check, issue 46), exit 1, and its output names both digests and
   both model folders ("model_digest prefill=<d> (<path>) decode=<d>
   (<path>): weights or tokenizer differ"); the handshake's own refusal of
   such a pair is tests/transfer's.
2. The same checkpoint on both sides (a copy of the seed-1 folder, so the
   paths differ but the digests do not): the pool comes up and answers.

The digests are recomputed here with `kvf_model_digest` semantics (the
daemons log theirs: "model digest <d> (<path>)"), and each daemon's second
start reads its digest from <model>/.kvf-fingerprint.

Rerun: python3 tests/e2e/test_e2e_model_digest.py   (KVF_BIN=build/bin)
"""

import json
import os
import re
import shutil
import subprocess
import tempfile

from kvf_e2e import Pool, find_bin

DIGEST_RE = r"model digest ([0-9a-f]{32}) \(([^)]*)\)"


class T:
    @staticmethod
    def check(cond, what, detail=None):
        if not cond:
            raise AssertionError(what if detail is None else "%s\n%s" % (what, detail))
        print("ok:", what)


def logged_digest(pool, name):
    m = re.search(DIGEST_RE, pool.log(name))
    T.check(m is not None, "%s logs its model digest" % name)
    return m.group(1), m.group(2)


def main():
    src = os.environ.get("KVF_SOURCE_DIR",
                         os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    cfg = os.path.join(src, "tests", "data", "models", "tiny-hybrid.config.json")
    kvf = os.path.join(find_bin(), "kvf")
    os.environ["KVF_LOG_LEVEL"] = "info"   # the daemons' "model digest ..." line (kvf-up passes it)
    with tempfile.TemporaryDirectory(prefix="kvf-digest-") as tmp:
        seed1, seed2 = os.path.join(tmp, "seed1"), os.path.join(tmp, "seed2")
        for seed, out in (("1", seed1), ("2", seed2)):
            subprocess.run([kvf, "mkmodel", "--config", cfg, "--out", out, "--seed", seed],
                           check=True, capture_output=True, timeout=60)

        # 1. other weights, same config: refused by kvf-up before it starts anything, naming
        #    both digests (those the handshake compares: each folder's .kvf-fingerprint)
        pool = Pool(layout="1p1d", model=seed1, decode_args=["--model", seed2], timeout=60,
                    keep_run_dir=True)
        try:
            try:
                pool.start(attempts=1)
                T.check(False, "kvf-up must refuse a prefill/decode pair with other weights")
            except RuntimeError:
                pass
            out = pool.up_output
            d1, d2 = (json.load(open(os.path.join(d, ".kvf-fingerprint")))["digest"]
                      for d in (seed1, seed2))
            T.check(re.fullmatch("[0-9a-f]{32}", d1) and d1 != d2,
                    "seed 1 and seed 2 have different digests (%s, %s)" % (d1, d2))
            want = ("model_digest prefill=%s (%s) decode=%s (%s): weights or tokenizer differ" %
                    (d1, os.path.realpath(seed1), d2, os.path.realpath(seed2)))
            T.check(want in out, "kvf-up names both digests and both folders", out[-1500:])
            T.check(not re.search(r"started \S+ on ", out),
                    "nothing was started for the refused pair", out[-1500:])
        finally:
            pool.stop()
            shutil.rmtree(pool.run_dir, ignore_errors=True)

        # 2. the same weights in another folder: one digest, a healthy pool
        same = os.path.join(tmp, "seed1-copy")
        shutil.copytree(seed1, same, ignore=shutil.ignore_patterns(".kvf-fingerprint"))
        with Pool(layout="1p1d", model=seed1, decode_args=["--model", same],
                  timeout=60) as pool:
            st, h = pool.health()
            T.check(st == 200 and all(p.get("state") == "compatible" for p in h["pairs"]),
                    "same weights in two folders: the pair is compatible")
            r = pool.complete("The ferry crosses at dawn", max_tokens=4, temperature=0,
                              ignore_eos=True, return_token_ids=True)
            T.check(len(r["choices"][0]["token_ids"]) == 4, "and the pool answers")
            T.check(logged_digest(pool, "prefill-0")[0] == logged_digest(pool, "decode-0")[0],
                    "one digest on both sides")
            T.check("from .kvf-fingerprint" in pool.log("prefill-0"),
                    "prefill's second start read its digest from the cache file")
    print("PASS test_e2e_model_digest")


if __name__ == "__main__":
    main()
