#!/usr/bin/env python3
"""kvf-prefill / kvf-decode --device, on a machine without a GPU.

1. Refusals, by the shipped binaries: a malformed --device is refused naming
   the value; --device cuda:7 (no such GPU here) exits 1 within seconds naming
   the device and the CUDA error (or that CUDA is not built in), before any
   port is bound; kvf-up refuses a bad --device / --prefill-device /
   --decode-device as bad usage (exit 2) naming the value.
2. A 1p1d pool on one simulated GPU (tests/bin/kvf-*-devsim: the device layer,
   the kernels, the NCCL world and UCX's memory types wrapped at link time,
   tests/daemon/devsim/kvf_devsim.c), both daemons on cuda:0, driven by
   tests/gpu/pool_gpu.sh exactly as on a GPU: every answer's tokens equal the
   colocated `kvf generate --device cuda:0`, /health names cuda:0 for both,
   and each daemon's device counters (printed at exit) show the device paths
   ran: pools mapped with UCX as CUDA memory, fresh blocks zeroed on the
   device and synced before the pull, tails zeroed on the device, the KV
   digest's device-to-host copies on both sides, no host pointer given to a
   device kernel or copy.
3. Fault builds: decode flips a landed byte (ucx.data=corrupt); prefill's
   digest of its GPU pool finds the difference, decode recomputes, and the
   answer still equals the colocated one.
4. kvf-up --device cuda:auto places instances on GPUs of their own;
   --prefill-device / --decode-device split the roles (a GPU prefill pool
   feeding a CPU decode pool answers like colocated).
5. Sampling on the simulated GPU through the pool (temperature, top-p, min-p, a seed,
   logprobs): the tokens equal the colocated run's.
6. CUDA builds: TP 2 decode over two simulated GPUs (rank r on cuda:r,
   /health "cuda:0,cuda:1"), answers equal colocated; TP 2 with one GPU
   refused naming rank 1's device.

usage: test_daemon_device.py TESTS_BIN_DIR FAULT_BUILD(ON/OFF) CUDA_BUILD(ON/OFF)
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.environ["KVF_SOURCE_DIR"], "tests", "e2e"))
from kvf_e2e import Pool, wait_for  # noqa: E402

SRC = os.environ["KVF_SOURCE_DIR"]
BIN = os.environ["KVF_BIN"]
TBIN = sys.argv[1]
FAULTS = sys.argv[2].upper() in ("ON", "1", "TRUE", "YES")
CUDA = sys.argv[3].upper() in ("ON", "1", "TRUE", "YES")
MODEL = os.path.join(SRC, "models-trained", "tiny-hybrid")
POOL_GPU = os.path.join(SRC, "tests", "gpu", "pool_gpu.sh")


def run(cmd, timeout=30, env=None):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def devsim_bin_dir():
    """The shipped bin dir with the daemons and kvf swapped for their devsim builds."""
    d = tempfile.mkdtemp(prefix="kvf-devsim-bin-")
    for name in os.listdir(BIN):
        os.symlink(os.path.join(BIN, name), os.path.join(d, name))
    for name, sim in (("kvf-prefill", "kvf-prefill-devsim"), ("kvf-decode", "kvf-decode-devsim"),
                      ("kvf", "kvf-devsim")):
        os.unlink(os.path.join(d, name))
        os.symlink(os.path.join(TBIN, sim), os.path.join(d, name))
    return d


def check_refusals(devbin):
    for exe in ("kvf-prefill", "kvf-decode"):
        for bad in ("gpu", "cuda:x", "cuda:", "cuda:-1", "cuda:1024", "CUDA", "cuda0"):
            rc, out, _ = run([os.path.join(BIN, exe), "--model", MODEL, "--insecure",
                              "--device", bad])
            assert rc == 1 and ("bad value '%s' for --device" % bad) in out, (exe, bad, rc, out)
        rc, out, took = run([os.path.join(BIN, exe), "--model", MODEL, "--insecure",
                             "--device", "cuda:7"])
        assert rc == 1, (exe, rc, out)
        assert took < 15, "%s --device cuda:7 took %.1f s to refuse" % (exe, took)
        if CUDA:   # the CUDA call and its error string, e.g. (cudaGetDeviceCount: ...)
            assert re.search(r"--device cuda:7: no CUDA device \((cuda\w+: .+|.*index 7.*)\)",
                             out), out
        else:
            assert "--device cuda:7: CUDA is not built in" in out, out
        assert "ready:" not in out and "page pools" not in out, out
    # the simulated GPU count is enforced the same way (devsim: one GPU)
    rc, out, _ = run([os.path.join(devbin, "kvf-decode"), "--model", MODEL, "--insecure",
                      "--device", "cuda:1"])
    assert rc == 1 and "--device cuda:1: no CUDA device (devsim: 1 simulated GPU)" in out, out
    up = os.path.join(BIN, "kvf-up")
    for flag in ("--device", "--prefill-device", "--decode-device"):
        for bad in ("gpu", "cuda:x", "cuda:1024"):
            rc, out, _ = run([up, "--layout", "1p1d", "--model", MODEL, flag, bad])
            assert rc == 2 and ("bad value '%s' for %s" % (bad, flag)) in out, (flag, bad, out)
    return "refusals: bad values named, cuda:7 refused by name with the CUDA error in < 15 s"


def devsim_counts(log):
    m = re.findall(r"^devsim: (.*)$", log, re.M)
    assert m, "no devsim line (the daemon did not exit normally):\n" + log[-1500:]
    words = m[-1].split()
    c = {}
    for i, w in enumerate(words[:-1]):
        if re.fullmatch(r"\d+", words[i + 1]) and not re.fullmatch(r"\d+", w):
            c.setdefault(w, int(words[i + 1]))
    # "blocks_zero C calls P pages": the second number
    c["blocks_zero_pages"] = int(re.search(r"blocks_zero \d+ calls (\d+) pages", m[-1]).group(1))
    c["zero_range_bytes"] = int(re.search(r"zero_ranges \d+ calls (\d+) bytes", m[-1]).group(1))
    c["d2h_bytes"] = int(re.search(r"d2h \d+ calls (\d+) bytes", m[-1]).group(1))
    return c


def check_pool(devbin, questions=6):
    run_dir = tempfile.mkdtemp(prefix="kvf-devsim-pool-")
    rc, out, took = run(["bash", POOL_GPU, "--device", "cuda:0", "--questions", str(questions),
                         "--keep-run-dir", run_dir], timeout=240,
                        env={"KVF_BIN_DIR": devbin, "KVF_POOL_GPU_TIMEOUT": "200"})
    line = [l for l in out.splitlines() if l.startswith("pool-gpu:")]
    assert rc == 0 and line, (rc, out[-3000:])
    assert line[-1].startswith("pool-gpu: %d/%d answers equal colocated" % (questions, questions))
    assert "devices prefill cuda:0 decode cuda:0 (/health)" in line[-1], line[-1]
    logs = {}
    for name in ("prefill-0", "decode-0"):
        with open(os.path.join(run_dir, name + ".log"), errors="replace") as f:
            logs[name] = f.read()
    p, d = devsim_counts(logs["prefill-0"]), devsim_counts(logs["decode-0"])
    for name, c in (("prefill", p), ("decode", d)):
        assert c["host_ptr_errors"] == 0 and c["wrong_device"] == 0, (name, c)
        assert c["ucx_maps"] == 1, (name, c)       # the one pool, mapped as CUDA memory
        assert c["opened"] >= 1 and c["kernels"] > 0, (name, c)
    for name in logs:
        assert re.search(r"ready: .*, device cuda:0$", logs[name], re.M), logs[name][-1500:]
    # decode: each import zeroed its fresh blocks on the device and waited for it before the
    # GETs; partial last blocks' tails zeroed on the device; the digest copied the landed
    # bytes to the host (at least one pull's worth, beyond the logits)
    # (each pull's tail zeroing syncs once too: zero_ranges calls)
    assert d["blocks_zero"] >= questions and d["syncs"] - d["zero_ranges"] >= questions, d
    assert d["zero_ranges"] >= 1 and d["zero_range_bytes"] > 0, d
    assert d["d2h_bytes"] > 0 and p["d2h_bytes"] > 0, (p, d)
    # each daemon's rank sized its workspace at start; decode's greedy decode steps allocated
    # nothing and copied back one thing each (the sampled ids)
    assert p["ws_reserves"] == 1 and d["ws_reserves"] == 1, (p, d)
    assert d["decode_steps"] > 0 and d["decode_allocs"] == 0, d
    assert d["decode_d2h"] == d["decode_steps"] and d["decode_syncs"] == 0, d
    os.system("rm -rf '%s'" % run_dir)
    return ("1p1d on one simulated GPU: %d/%d answers equal colocated; decode %d blocks_zero, "
            "%d tail zeroings, %d bytes device->host, prefill %d bytes device->host" % (
                questions, questions, d["blocks_zero"], d["zero_ranges"], d["d2h_bytes"],
                p["d2h_bytes"]))


def colocated_tokens(devbin, prompt, max_tokens, device="cuda:0", env=None):
    rc, out, _ = run([os.path.join(devbin, "kvf"), "generate", "--model", MODEL, "--device",
                      device, "--prompt", prompt, "--max-tokens", str(max_tokens)],
                     timeout=120, env=env)
    assert rc == 0, out
    return [int(t) for t in re.search(r"^tokens:(.*)$", out, re.M).group(1).split()]


def heldout(n):
    with open(os.path.join(MODEL, "heldout.jsonl")) as f:
        return [json.loads(l)["prompt"] for l in f if l.strip()][:n]


def check_sampled(devbin):
    """Sampling on the (simulated) GPU through a pool: prefill samples the first token,
    decode the rest, each on its device (kernels/kvf_sample.h); with a seed the tokens equal
    the colocated `kvf generate --device cuda:0` run's, top-p and min-p included, and the
    logprobs the pool returns are those of the tokens it chose."""
    prompt, n, seed = heldout(1)[0], 12, 11
    rc, out, _ = run([os.path.join(devbin, "kvf"), "generate", "--model", MODEL, "--device",
                      "cuda:0", "--prompt", prompt, "--max-tokens", str(n), "--temperature",
                      "0.8", "--top-p", "0.9", "--min-p", "0.05", "--seed", str(seed),
                      "--ignore-eos", "yes"], timeout=120)
    assert rc == 0, out
    want = [int(t) for t in re.search(r"^tokens:(.*)$", out, re.M).group(1).split()]
    # the pool's decode steps as CUDA graphs (KVF_GPU_GRAPHS=decode), the colocated run eager
    os.environ["KVF_GPU_GRAPHS"] = "decode"
    try:
        with Pool(layout="1p1d", model=MODEL, bin_dir=devbin, keep_run_dir=True,
                  extra_args=["--device", "cuda:0"]) as pool:
            got = [pool.complete(prompt, max_tokens=n, temperature=0.8, top_p=0.9,
                                 min_p=0.05, seed=seed, ignore_eos=True,
                                 return_token_ids=True, logprobs=2, timeout=60)
                   for _ in range(2)]
    finally:
        del os.environ["KVF_GPU_GRAPHS"]
    dlog = pool.log("decode-0")   # the devsim line is printed at exit
    os.system("rm -rf '%s'" % pool.run_dir)
    ids = [g["choices"][0]["token_ids"] for g in got]
    assert ids[0] == want and ids[1] == want, (ids, want)
    lp = got[0]["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == n and all(v <= 0.0 for v in lp["token_logprobs"]), lp
    assert all(len(t) >= 1 for t in lp["top_logprobs"]), lp
    d = devsim_counts(dlog)
    assert d["host_ptr_errors"] == 0, d
    # decode's steps were replayed recordings, each call the recorded one, inputs published
    assert d["graph_captures"] >= 1 and d["graph_replays"] >= n - 3, d
    assert d["graph_mismatches"] == 0 and d["graph_host_inputs"] == 0, d
    return "1p1d on one simulated GPU, sampled (T 0.8, top-p 0.9, min-p 0.05, seed %d), " \
           "decode steps as CUDA graphs (%d recorded, %d replays): tokens equal colocated " \
           "twice, %d logprobs" % (seed, d["graph_captures"], d["graph_replays"], n)


def check_corrupt(devbin):
    prompt = heldout(1)[0]
    want = colocated_tokens(devbin, prompt, 8)
    os.environ["KVF_FAULT"] = "ucx.data@1=corrupt"
    try:
        with Pool(layout="1p1d", model=MODEL, bin_dir=devbin, extra_args=["--device", "cuda:0"],
                  decode_args=["--load-failure", "recompute"]) as pool:
            r = pool.complete(prompt, max_tokens=8, temperature=0, return_token_ids=True,
                              timeout=60)
            plog, dlog = pool.log("prefill-0"), pool.log("decode-0")
            wait_for(lambda: "differs from what was sent" in pool.log("prefill-0"), 10,
                     "prefill's digest of its GPU pool to differ")
    finally:
        del os.environ["KVF_FAULT"]
    assert r["kv_transfer"]["recomputed"] is True, r["kv_transfer"]
    assert r["choices"][0]["token_ids"] == want, (r["choices"][0]["token_ids"], want)
    assert "KV digest mismatch" in dlog, dlog[-2000:]
    return "corrupted pull on the GPU pools: prefill's device digest differed, recomputed, " \
           "tokens equal colocated"


class DevicePool(Pool):
    """A Pool whose kvf-up gets --device / --prefill-device / --decode-device flags."""

    def __init__(self, up_flags, **kw):
        super().__init__(**kw)
        self.up_flags = list(up_flags)

    def _up_cmd(self, base_port):
        cmd = super()._up_cmd(base_port)
        return cmd[:1] + self.up_flags + cmd[1:]


def check_auto(devbin):
    """kvf-up --device cuda:auto: each instance on a host gets GPUs of its own, prefill first."""
    os.environ["DEVSIM_GPUS"] = "3"
    try:
        with DevicePool(["--device", "cuda:auto"], layout="1p1d", model=MODEL, bin_dir=devbin,
                        prefill_instances=2) as pool:
            devs = {i["engine_id"]: i.get("device") for r in ("prefill", "decode")
                    for i in pool.health()[1][r]}
            status, _, raw = pool.request("GET", "/metrics", timeout=10)
            info = dict(re.findall(r'^kvf_instance_device_info\{[^}]*engine_id="([^"]+)",'
                                   r'device="([^"]+)"\} 1$', raw.decode(), re.M))
        # the CPU's bits on the GPU prefill (KVF_GPU_WEIGHTS=exact): the default tensor-core
        # GEMM rounds activations to 16 bits, so its tokens need not be a CPU run's
        os.environ["KVF_GPU_WEIGHTS"] = "exact"
        with DevicePool(["--prefill-device", "cuda:2", "--decode-device", "cpu"], layout="1p1d",
                        model=MODEL, bin_dir=devbin) as pool:
            split = {i["engine_id"]: i.get("device") for r in ("prefill", "decode")
                     for i in pool.health()[1][r]}
            r = pool.complete(heldout(1)[0], max_tokens=8, temperature=0, return_token_ids=True,
                              timeout=60)
    finally:
        del os.environ["DEVSIM_GPUS"]
        os.environ.pop("KVF_GPU_WEIGHTS", None)
    assert devs == {"prefill-0": "cuda:0", "prefill-1": "cuda:1", "decode-0": "cuda:2"}, devs
    assert status == 200 and info == devs, (status, info)   # the metrics label, the same
    assert split == {"prefill-0": "cuda:2", "decode-0": "cpu"}, split
    want = colocated_tokens(devbin, heldout(1)[0], 8, device="cpu")
    assert r["choices"][0]["token_ids"] == want, (r["choices"][0]["token_ids"], want)
    return ("kvf-up --device cuda:auto: prefill-0 cuda:0, prefill-1 cuda:1, decode-0 cuda:2; "
            "a GPU prefill (cuda:2) with a CPU decode answers like colocated")


def check_tp2(devbin):
    env = {"DEVSIM_GPUS": "2"}
    rc, out, _ = run([os.path.join(devbin, "kvf-decode"), "--model", MODEL, "--insecure",
                      "--tp", "2", "--device", "cuda:1"], env=env)
    assert rc == 1 and "rank 1 (one GPU per rank): cuda:2: no CUDA device" in out, out
    prompts = heldout(2)
    want = [colocated_tokens(devbin, p, 8, env=env) for p in prompts]
    os.environ.update(env)
    try:
        with Pool(layout="1p2d", model=MODEL, bin_dir=devbin, keep_run_dir=True,
                  extra_args=["--device", "cuda:0"]) as pool:
            devs = {i["engine_id"]: i.get("device") for r in ("prefill", "decode")
                    for i in pool.health()[1][r]}
            got = [pool.complete(p, max_tokens=8, temperature=0, return_token_ids=True,
                                 timeout=60)["choices"][0]["token_ids"] for p in prompts]
    finally:
        del os.environ["DEVSIM_GPUS"]
    d = devsim_counts(pool.log("decode-0"))   # printed at exit
    os.system("rm -rf '%s'" % pool.run_dir)
    assert devs == {"prefill-0": "cuda:0", "decode-0": "cuda:0,cuda:1"}, devs
    assert got == want, (got, want)
    # every launch and zeroing of rank 1's memory went to cuda:1 (no peer access assumed)
    assert d["wrong_device"] == 0 and d["host_ptr_errors"] == 0, d
    return "1p2d, decode TP 2 on cuda:0,cuda:1: answers equal colocated"


def main():
    devbin = devsim_bin_dir()
    try:
        print(check_refusals(devbin), flush=True)
        print(check_pool(devbin), flush=True)
        print(check_auto(devbin), flush=True)
        print(check_sampled(devbin), flush=True)
        if FAULTS:
            print(check_corrupt(devbin), flush=True)
        else:
            print("corruption check: not run (a build without fault injection)")
        if CUDA:
            print(check_tp2(devbin), flush=True)
        else:
            print("TP 2 over simulated GPUs: not run (CUDA not built in: a second rank's GPU "
                  "cannot be opened)")
    finally:
        os.system("rm -rf '%s'" % devbin)
    print("PASS")


if __name__ == "__main__":
    main()
