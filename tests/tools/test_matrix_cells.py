#!/usr/bin/env python3
"""kvf matrix's cells say why and what they cost, and leave no folder behind (issue 46 item 2).

1. The Nemotron-Nano-9B-v2 config (no weights: transfer checks only) at 4p2d, 1p1d and 3p1d
   with the default block sizes (derived) and a fixed 80:80: the derived cells pass (1312
   tokens, the size the daemons pick), 80:80 is refused with the first error line that names
   the cause (the smallest block size that fits), 3p1d is refused naming the head count it
   does not divide; no cell is a fail; every passing cell has bytes, descriptors, reads, the
   measured and the estimated transfer time, and a refused 4p2d cell kvf plan's bytes.
2. The trained tiny hybrid through a real 1p1d pool (derived block sizes, --base-port given),
   a dtype pair the handshake refuses and fp8 (moved byte-exact, refused by the engine): pass
   with the pool's accuracy, refused naming prefill's and decode's dtypes, refused naming fp8.
3. --kv-layouts (docs/ARCHITECTURE.md §7): the tiny hybrid's 1p1d pool at head-major and
   with a head-major prefill and a layer-major decode answers as colocated (layer-major);
   the 9B config at 4p2d passes at both layouts with no more descriptors at head-major; an
   unknown layout is refused by name (exit 2).
Every run gets a private TMPDIR, which must be empty afterwards (run dirs, keys, prompts).

Rerun: KVF_BIN=build/bin KVF_SOURCE_DIR=. python3 tests/tools/test_matrix_cells.py
"""

import json
import os
import socket
import subprocess
import tempfile


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError("%s\n%s" % (what, detail))
    print("ok: " + what)


def matrix(kvf, tmp, args):
    env = dict(os.environ, TMPDIR=tmp)
    p = subprocess.run([kvf, "matrix"] + args, capture_output=True, text=True, timeout=240,
                       env=env)
    print(p.stdout)
    left = os.listdir(tmp)
    check(not left, "no temporary folder left behind", str(left))
    return p


def free_base():
    """A base port whose three ports (1p1d: 2 prefill, 1 decode) bind now."""
    for base in range(31000, 40000, 100):
        socks = []
        try:
            for port in range(base, base + 3):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range")


def cell(cells, layout, bs, dts=("bf16", "bf16"), kls=("layer-major", "layer-major")):
    got = [c for c in cells if c["layout"] == layout and c["block_sizes"] == list(bs) and
           c["kv_dtypes"] == list(dts) and c["kv_layouts"] == list(kls)]
    check(len(got) == 1, "one cell %s %s %s %s" % (layout, bs, dts, kls))
    return got[0]


def main():
    kvf = os.path.join(os.environ["KVF_BIN"], "kvf")
    src = os.environ["KVF_SOURCE_DIR"]
    cfg9b = os.path.join(src, "tests", "data", "models", "nemotron-nano-9b-v2.config.json")
    with tempfile.TemporaryDirectory(prefix="kvf-matrix-test.") as top:
        tmp = os.path.join(top, "tmp")
        os.mkdir(tmp)
        # 1. the 9B config, default block sizes and a fixed size too small
        p = matrix(kvf, tmp, ["--model", cfg9b, "--layouts", "4p2d,1p1d,3p1d", "--dtypes",
                              "bf16:bf16", "--json"])
        check(p.returncode == 0, "refused cells are not failures: exit 0", p.stderr[-2000:])
        cells = json.loads(p.stdout)["cells"]
        for lay in ("4p2d", "1p1d"):
            c = cell(cells, lay, (0, 0))
            check(c["verdict"] == "pass" and c["derived_block_sizes"] == [1312, 1312],
                  "%s with derived block sizes passes at 1312:1312" % lay, c)
            # equal TP (1p1d) also reads each Mamba page's padding with its last run (one
            # descriptor per layer slot, docs/ARCHITECTURE.md): 1,146,880 bytes more
            want = {"4p2d": 146825216, "1p1d": 147972096}[lay]
            check(c["bytes"] == want and c["descriptors"] > 0 and c["xfer_ms"] > 0 and
                  c["est_ms"] > 0, "%s: bytes, descriptors, measured and estimated time" % lay,
                  c)
        check(cell(cells, "4p2d", (0, 0))["reads"] == 4, "4p2d: 4 reads (rank pairs)")
        c = cell(cells, "3p1d", (0, 0))
        check(c["verdict"] == "refused" and
              c["why"] == "tp_size 3 does not divide num_attention_heads 40",
              "3p1d refused naming the heads it does not divide", c)
        p = matrix(kvf, tmp, ["--model", cfg9b, "--layouts", "4p2d", "--block-sizes", "80:80",
                              "--dtypes", "bf16:bf16"])
        check(p.returncode == 0, "80:80 is refused, not failed: exit 0", p.stderr[-2000:])
        row = [l for l in p.stdout.splitlines() if l.startswith("| 4p2d")]
        check(len(row) == 1 and "| refused | block_size 80 is too small for rank 0 of TP 4" in
              row[0] and "smallest block size that fits is 1298 (1312 as a multiple of 16)" in
              row[0], "80:80 refused with the first error line naming the cause", row)
        check("| 146825216 (plan) |" in row[0] and "| 4 (plan) |" in row[0],
              "the refused cell shows kvf plan's cost", row)
        check("0 pass, 1 refused (the layout cannot work, reason given), 0 fail" in p.stdout,
              "refused and fail counted apart")

        # 2. the trained model through a pool on given ports
        model = os.path.join(src, "models-trained", "tiny-hybrid")
        base = free_base()
        p = matrix(kvf, tmp, ["--model", model, "--layouts", "1p1d", "--dtypes",
                              "bf16:bf16,bf16:fp32,fp8:fp8", "--limit", "4", "--base-port",
                              str(base), "--json"])
        check(p.returncode == 0, "tiny-hybrid matrix exit 0", p.stderr[-3000:])
        cells = json.loads(p.stdout)["cells"]
        c = cell(cells, "1p1d", (0, 0))
        check(c["verdict"] == "pass" and c["questions"] >= 3 and c["correct"] ==
              c["colocated_correct"] and c["same"] == c["questions"],
              "the pool on --base-port %d answers as colocated" % base, c)
        c = cell(cells, "1p1d", (0, 0), ("bf16", "fp32"))
        check(c["verdict"] == "refused" and c["why"].startswith(
            "handshake refused: kv_dtype prefill=bf16 decode=fp32: KV cache dtypes differ"),
              "bf16:fp32 refused naming prefill's and decode's dtype (not local/remote)", c)
        c = cell(cells, "1p1d", (0, 0), ("fp8", "fp8"))
        check(c["verdict"] == "refused" and "bad value 'fp8' for --kv-dtype" in c["why"] and
              c["bytes"] > 0, "fp8:fp8 moves byte-exact but is refused for serving, by name", c)

        # 3. the attention block layouts
        hm, mixed = ("head-major", "head-major"), ("head-major", "layer-major")
        p = matrix(kvf, tmp, ["--model", model, "--layouts", "1p1d", "--dtypes", "bf16:bf16",
                              "--kv-layouts", "head-major:head-major,head-major:layer-major",
                              "--limit", "3", "--base-port", str(base), "--json"])
        check(p.returncode == 0, "tiny-hybrid --kv-layouts exit 0", p.stderr[-3000:])
        cells = json.loads(p.stdout)["cells"]
        for kls in (hm, mixed):
            c = cell(cells, "1p1d", (0, 0), kls=kls)
            check(c["verdict"] == "pass" and c["same"] == c["questions"] >= 3,
                  "the 1p1d pool at kv layouts %s:%s answers as colocated" % kls, c)
        p = matrix(kvf, tmp, ["--model", cfg9b, "--layouts", "4p2d", "--dtypes", "bf16:bf16",
                              "--kv-layouts", "layer-major:layer-major,head-major:head-major",
                              "--json"])
        check(p.returncode == 0, "9B --kv-layouts exit 0", p.stderr[-2000:])
        cells = json.loads(p.stdout)["cells"]
        lm, h = cell(cells, "4p2d", (0, 0)), cell(cells, "4p2d", (0, 0), kls=hm)
        check(lm["verdict"] == h["verdict"] == "pass" and lm["bytes"] == h["bytes"] and
              h["descriptors"] <= lm["descriptors"],
              "9B 4p2d at head-major: the same bytes, %d descriptors (layer-major %d)" % (
                  h["descriptors"], lm["descriptors"]), (lm, h))
        p = matrix(kvf, tmp, ["--model", cfg9b, "--kv-layouts", "layer-major:diagonal"])
        check(p.returncode == 2 and "bad value 'diagonal' for --kv-layouts" in p.stderr,
              "an unknown layout is refused by name", p.stderr[-500:])
    print("PASS test_matrix_cells")


if __name__ == "__main__":
    main()
