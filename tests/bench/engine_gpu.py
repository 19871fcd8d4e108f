#!/usr/bin/env python3
"""kvferry's forward on a GPU against transformers on the same GPU.

For each model, dtype and batch size: `kvf bench-model --device cuda:0 --warmup yes`
(prefill and decode tokens/s, the weights it holds, and its peak device memory, polled
from nvidia-smi for its process) and transformers in this process (a warm-up call, then
one prompt forward and greedy decode steps from its cache; peak device memory from
torch.cuda.max_memory_allocated), printed as one Markdown table with the ratios
kvferry / transformers. Models: the trained models-trained/tiny-hybrid and tiny-dense,
and a random-weight model of Nemotron-Nano-9B-v2 geometry (hidden 4480, 128 Mamba heads,
40 query / 8 KV heads, MLP 15680, vocabulary 131072) written by `kvf mkmodel` into a
temporary folder, with --geom-pattern's layers instead of all 56 (default "M-M*": two
Mamba2, one MLP, one attention layer; every layer has the 9B's shapes, so per-layer speed
is the 9B's, while the file stays about 3.3 GB and the run within the time budget).

dtypes: bf16 = the bf16 checkpoint with KVF_GPU_WEIGHTS=native (the default: 16-bit
weights on tensor cores through cuBLASLt, one pinned algorithm per weight shape) and a bf16 KV cache, against transformers in torch.bfloat16; fp32 = the same
checkpoint widened (KVF_GPU_WEIGHTS=fp32, the CPU-exact path) and an fp32 KV cache,
against transformers in torch.float32; fp32-cublas = the fp32 run with KVF_GPU_GEMM=cublas
(cublasSgemm instead of the fixed-order GEMM kernel: faster or not, not batch invariant),
so the table shows what batch invariance costs (its transformers cells are the fp32 run's);
bf16-exact = the bf16 checkpoint in the debugging mode KVF_GPU_WEIGHTS=exact (bf16
matrices kept, the fixed-order GEMM widening them in registers, the CPU's bits) with a bf16
KV cache, against the bf16 transformers run; bf16-graphs = the bf16 run with
KVF_GPU_GRAPHS=decode (decode steps recorded as CUDA graphs per batch size, then replayed;
its transformers cells are the bf16 run's).

--rows issue40: the GPU engine issue's rows instead: per model, prefill of --prefill-len
(8192) tokens at batch 1 and decode at --batches (1, 16, 64) with --context-len (2048)
tokens of context, bf16 weights on tensor cores (KVF_GPU_WEIGHTS=native) and a bf16 KV
cache against transformers bf16 with attn_implementation="sdpa", on the 9B-geometry model
and a Llama-3-8B-geometry dense model (tests/data/models/llama-3.1-8b.config.json with
--llama-layers of its 32 layers, random bf16 weights by `kvf mkmodel`, written next to the
9B one: --keep DIR puts it in DIR-llama); kvferry's and transformers' peak device memory;
each row printed on stdout as soon as it is measured, then the table and the targets
(prefill >= 1x transformers, decode at batch 16 >= 2x).
  python3 tests/bench/engine_gpu.py --kvf BIN/kvf --rows issue40 [--llama-layers 4]
      [--prefill-len 8192] [--context-len 2048] [--batches 1,16,64] [--keep DIR]
      [--attn flashinfer]

Usage (a GPU machine; the kvf binary of a CUDA build):
  python3 tests/bench/engine_gpu.py --kvf BIN/kvf [--prompt-len 1000] [--decode-tokens 32]
      [--batches 1,16] [--dtypes bf16,bf16-graphs,bf16-exact,fp32,fp32-cublas]
      [--models tiny-hybrid,tiny-dense,geom]
      [--geom-pattern M-M*] [--budget 170] [--keep DIR] [--md FILE]
  python3 tests/bench/engine_gpu.py --kvf BIN/kvf --device cpu --prompt-len 32 ...
      (a dry run on the CPU: the same runs, parsing and table, no GPU needed)

Exit status: 0 when every kvferry run gave figures; 1 when one failed (its cell says
why); 2 for bad arguments; 77 ("skipped: no GPU") on a machine without a GPU. A
transformers failure (missing torch, out of memory) fills its cells, never the exit
status. Speed targets are printed as figures (and a summary line), never asserted.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEOM_CONFIG = os.path.join(ROOT, "tests", "data", "models", "nemotron-nano-9b-v2.config.json")
LLAMA_CONFIG = os.path.join(ROOT, "tests", "data", "models", "llama-3.1-8b.config.json")
MODELS = ("tiny-hybrid", "tiny-dense", "geom", "llama-geom")
DTYPES = ("bf16", "bf16-graphs", "bf16-exact", "fp32", "fp32-cublas")
# rows that reuse another row's transformers figures (same checkpoint dtype on its side)
HF_SHARED = {"bf16-exact": "bf16", "bf16-graphs": "bf16", "fp32-cublas": "fp32"}
START = time.monotonic()


def elapsed():
    return time.monotonic() - START


def log(msg):
    print("[%6.1fs] %s" % (elapsed(), msg), file=sys.stderr, flush=True)


# ---- arguments ------------------------------------------------------------------------

def csv_list(value, allowed, flag):
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if not items or bad:
        raise argparse.ArgumentTypeError("bad value '%s' for %s: a comma list of %s" %
                                         (value, flag, ", ".join(allowed)))
    return items


def int_list(value, flag):
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        items = []
    if not items or min(items) < 1:
        raise argparse.ArgumentTypeError("bad value '%s' for %s: a comma list of positive "
                                         "integers" % (value, flag))
    return items


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvf", required=True, help="the kvf binary of a CUDA build")
    ap.add_argument("--device", default="cuda:0",
                    help="cuda:N (default cuda:0), or cpu for a dry run without a GPU")
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--batches", default="1,16",
                    type=lambda v: int_list(v, "--batches"))
    ap.add_argument("--dtypes", default="bf16,bf16-graphs,bf16-exact,fp32,fp32-cublas",
                    type=lambda v: csv_list(v, DTYPES, "--dtypes"))
    ap.add_argument("--models", default="tiny-hybrid,tiny-dense,geom",
                    type=lambda v: csv_list(v, MODELS, "--models"))
    ap.add_argument("--geom-pattern", default="M-M*",
                    help="layer pattern of the 9B-geometry model (M Mamba2, * attention, "
                         "- MLP; the 9B has 56 layers)")
    ap.add_argument("--llama-layers", type=int, default=4,
                    help="layers of the Llama-3-8B-geometry model (random bf16 weights; the "
                         "8B has 32)")
    ap.add_argument("--rows", choices=("grid", "issue40"), default="grid",
                    help="grid: every model x dtype x batch at one prompt length (above); "
                         "issue40: the GPU engine issue's rows (bf16, HF sdpa): prefill of "
                         "--prefill-len tokens at batch 1, decode at each batch with "
                         "--context-len tokens of context (default models geom,llama-geom, "
                         "batches 1,16,64)")
    ap.add_argument("--attn", choices=("kvferry", "flashinfer"), default="kvferry",
                    help="kvferry's attention kernel (default), or FlashInfer's prefill and "
                         "decode (KVF_GPU_ATTN=flashinfer; a -DKVF_FLASHINFER=ON build such as "
                         "the GPU bundle; a GQA group its decode does not dispatch, the 9B's "
                         "5, sends output tokens to its prefill kernel, one query token each)")
    ap.add_argument("--prefill-len", type=int, default=8192)
    ap.add_argument("--context-len", type=int, default=2048)
    ap.add_argument("--budget", type=float, default=170.0,
                    help="seconds; runs not started by then are left out (cells say so)")
    ap.add_argument("--keep", help="folder for the 9B-geometry checkpoint, kept and reused")
    ap.add_argument("--md", help="also write the table to this file")
    args = ap.parse_args(argv)
    if args.rows == "issue40":
        given = set(a.split("=")[0] for a in argv)
        if "--models" not in given:
            args.models = ["geom", "llama-geom"]
        if "--batches" not in given:
            args.batches = [1, 16, 64]
        args.dtypes = ["bf16"]
    if min(args.prefill_len, args.context_len, args.llama_layers) < 1:
        ap.error("--prefill-len, --context-len and --llama-layers must be >= 1")
    if args.prompt_len < 1 or args.decode_tokens < 2:
        ap.error("--prompt-len must be >= 1 and --decode-tokens >= 2 (got %d, %d)" %
                 (args.prompt_len, args.decode_tokens))
    if not re.fullmatch(r"[M*\-]+", args.geom_pattern or ""):
        ap.error("bad value '%s' for --geom-pattern: letters M, * and - only" %
                 args.geom_pattern)
    if not (args.device == "cpu" or re.fullmatch(r"cuda(:\d+)?", args.device)):
        ap.error("bad value '%s' for --device: cpu, cuda or cuda:N" % args.device)
    if args.budget <= 0:
        ap.error("bad value %g for --budget: seconds > 0" % args.budget)
    return args


# ---- the machine ----------------------------------------------------------------------

def gpu_present():
    """(True, '') when nvidia-smi lists a GPU; else (False, why)."""
    if shutil.which("nvidia-smi") is None:
        return False, "nvidia-smi absent"
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return False, "nvidia-smi failed: %s" % e
    if not re.search(r"^GPU \d+", out, re.M):
        return False, "nvidia-smi lists no GPU"
    return True, ""


def library_env(kvf):
    """The environment for kvf: when ldd says a shared library is missing (cuBLAS is 540 MB
    and may not travel with the binaries), the lib folders of the nvidia-* Python wheels
    holding it (PyTorch's cuBLAS, cudart, NCCL) are put on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    try:
        out = subprocess.run(["ldd", kvf], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return env, []
    missing = re.findall(r"^\s*(\S+) => not found", out, re.M)
    if not missing:
        return env, []
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    dirs = []
    for name in missing:
        for root in roots:
            hits = glob.glob(os.path.join(root, "nvidia", "**", name), recursive=True)
            if hits:
                d = os.path.dirname(hits[0])
                if d not in dirs:
                    dirs.append(d)
                break
    if dirs:
        env["LD_LIBRARY_PATH"] = ":".join(dirs + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    found = set()
    for d in dirs:
        found.update(os.listdir(d))
    still = [n for n in missing if n not in found]
    return env, still


def gpu_used_mib(index):
    """Device memory in use on GPU @a index (all processes), MiB, or None."""
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10).stdout.strip().splitlines()
        return int(out[0].strip()) if out and out[0].strip().isdigit() else None
    except (OSError, subprocess.SubprocessError):
        return None


class DevMemPoll(threading.Thread):
    """Peak device memory (MiB) of one process, from nvidia-smi every 0.1 s: its own
    figure (which includes its CUDA context) when nvidia-smi lists the process; in a
    container whose PID namespace hides it, the GPU's memory in use above @a base (taken
    just before the process started; this script's own transformers memory is idle then),
    marked with '~'. None when nvidia-smi cannot say."""

    def __init__(self, pid, index, base):
        super().__init__(daemon=True)
        self.pid, self.index, self.base = pid, index, base
        self.own, self.total, self.stop = None, None, threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                      "--format=csv,noheader,nounits"], capture_output=True,
                                     text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                return
            for line in out.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 2 and parts[0] == str(self.pid) and parts[1].isdigit():
                    self.own = max(self.own or 0, int(parts[1]))
            used = gpu_used_mib(self.index)
            if used is not None:
                self.total = max(self.total or 0, used)
            self.stop.wait(0.1)

    def peak(self):
        if self.own is not None:
            return self.own
        if self.total is not None and self.base is not None:
            return "~%d" % max(0, self.total - self.base)
        return None


# ---- models ---------------------------------------------------------------------------

def geom_config(pattern):
    with open(GEOM_CONFIG) as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = len(pattern)
    cfg["hybrid_override_pattern"] = pattern
    cfg["use_mamba_kernels"] = False   # transformers: its PyTorch path (no mamba_ssm here)
    return cfg


def llama_config(layers):
    with open(LLAMA_CONFIG) as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = layers
    return cfg


def build_geom(kvf, env, pattern, folder, timeout):
    """The 9B-geometry checkpoint (bf16) in folder (build_random)."""
    return build_random(kvf, env, geom_config(pattern), folder, timeout,
                        "9B-geometry model (%d layers '%s')" % (len(pattern), pattern))


def build_random(kvf, env, cfg, folder, timeout, what):
    """A random-weight bf16 checkpoint of config cfg in folder (kvf mkmodel), reused when
    the config it was written from matches; None, or why it could not be written."""
    done = os.path.join(folder, "model.safetensors")
    try:
        with open(os.path.join(folder, "source.config.json")) as f:
            have = json.load(f)
        if os.path.exists(done) and have == cfg:
            log("%s reused from %s" % (what, folder))
            return None
    except (OSError, ValueError):
        pass
    os.makedirs(folder, exist_ok=True)
    src = os.path.join(folder, "source.config.json")
    with open(src, "w") as f:
        json.dump(cfg, f, indent=1)
    t0 = time.monotonic()
    try:
        p = subprocess.run([kvf, "mkmodel", "--config", src, "--out", folder, "--dtype",
                            "bf16"], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "kvf mkmodel did not finish within %d s (disk too slow?)" % timeout
    if p.returncode != 0:
        return "kvf mkmodel failed (exit %d): %s" % (p.returncode, p.stderr.strip()[-300:])
    # kvf mkmodel writes the fields kvferry reads; transformers must also be told not to
    # ask for mamba_ssm's kernels (absent here), as the trained models' configs say
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            written = json.load(f)
        if "use_mamba_kernels" in cfg:
            written["use_mamba_kernels"] = False
        with open(path, "w") as f:
            json.dump(written, f, indent=1)
    except (OSError, ValueError) as e:
        return "cannot update %s: %s" % (path, e)
    log("%s (%.2f GB) written in %.1f s" %
        (what, os.path.getsize(done) / 1e9, time.monotonic() - t0))
    return None


def model_dir(name, geom_dir):
    """geom_dir: the 9B-geometry folder; the Llama-geometry one is geom_dir + '-llama'."""
    if name == "llama-geom":
        return geom_dir.rstrip("/") + "-llama"
    return geom_dir if name == "geom" else os.path.join(ROOT, "models-trained", name)


def model_label(name, pattern, llama_layers=32):
    if name == "geom":
        return "9B geometry, %d of 56 layers" % len(pattern)
    if name == "llama-geom":
        return "Llama-3-8B geometry, %d of 32 layers" % llama_layers
    return name


def build_model(args, env, name, d):
    """Writes a random-geometry model when its turn comes; None or why not."""
    left = max(60, int(args.budget - elapsed()) + 60)
    if name == "geom":
        return build_geom(args.kvf, env, args.geom_pattern, d, left)
    if name == "llama-geom":
        return build_random(args.kvf, env, llama_config(args.llama_layers), d, left,
                            "Llama-3-8B-geometry model (%d layers)" % args.llama_layers)
    return None


# ---- kvferry --------------------------------------------------------------------------

def block_size(kvf, env, d, kv_dtype):
    """The engine's logical block size for model d at TP 1 (`kvf plan --json`: the same
    rule), or 16 (the smallest) when kvf plan cannot say."""
    try:
        p = subprocess.run([kvf, "plan", "--model", d, "--layouts", "1p1d", "--kv-dtype",
                            kv_dtype, "--json"], capture_output=True, text=True, env=env,
                           timeout=60)
        return max(1, int(json.loads(p.stdout)[0]["prefill"]["block_size"]))
    except (OSError, subprocess.SubprocessError, ValueError, LookupError, TypeError):
        return 16


def num_blocks(batch, prompt, decode, bs):
    """Page-pool blocks for the batch (the warm-up round's requests are finished and their
    blocks freed before the timed ones start): every request's tokens, plus slack. A pool
    sized to the run keeps the device memory column about weights, not an idle pool."""
    per = (prompt + decode + 1 + bs - 1) // bs
    return batch * per + 4


def gpu_index(device):
    """cuda:N -> N (cuda -> 0), for nvidia-smi -i."""
    return int(device.split(":")[1]) if ":" in device else 0


def max_batch_tokens(prompt, batch):
    """Tokens per engine step: the whole prompt at batch 1, at most 4096 (four 1000-token
    prompts) at larger batches: GEMMs of 4096 rows already fill the GPU, and the workspace,
    which the peak device memory includes, stays under 2 GB at the 9B geometry."""
    return max(prompt, min(prompt * batch, 4096))


def run_kvf(args, env, d, dtype, batch, timeout, prompt=None, decode=None):
    """One `kvf bench-model` run (prompt / decode tokens: args' unless given):
    dict(prefill, decode, held, peak) or dict(err)."""
    prompt = args.prompt_len if prompt is None else prompt
    decode = args.decode_tokens if decode is None else decode
    cmd = [args.kvf, "bench-model", "--model", d, "--device", args.device, "--prompt-len",
           str(prompt), "--decode-tokens", str(decode), "--batch",
           str(batch), "--kv-dtype", "bf16" if dtype.startswith("bf16") else "fp32",
           "--warmup", "yes",
           "--max-batch-tokens", str(max_batch_tokens(prompt, batch)),
           "--num-blocks", str(num_blocks(batch, prompt, decode,
                                          block_size(args.kvf, env, d,
                                                     "bf16" if dtype.startswith("bf16")
                                                     else "fp32")))]
    env = dict(env, KVF_GPU_WEIGHTS={"bf16": "native", "bf16-graphs": "native",
                                     "bf16-exact": "exact"}.get(dtype, "fp32"),
               KVF_GPU_GEMM="cublas" if dtype == "fp32-cublas" else "fixed",
               KVF_GPU_GRAPHS="decode" if dtype == "bf16-graphs" else "off",
               KVF_GPU_ATTN="flashinfer" if args.attn == "flashinfer" else "")
    base = gpu_used_mib(gpu_index(args.device)) if args.device != "cpu" else None
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    except OSError as e:
        return {"err": "cannot run kvf: %s" % e}
    poll = DevMemPoll(p.pid, gpu_index(args.device), base) if args.device != "cpu" else None
    if poll:
        poll.start()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return {"err": "timed out after %d s" % timeout}
    finally:
        if poll:
            poll.stop.set()
            poll.join(timeout=5)
    if p.returncode != 0:
        lines = [l for l in err.strip().splitlines() if l.strip()] or ["(no message)"]
        return {"err": "exit %d: %s" % (p.returncode, lines[-1][-200:])}
    return parse_kvf(out, poll.peak() if poll else None)


def parse_kvf(out, peak):
    m = re.search(r"prefill (\d+) tokens ([\d.]+) tok/s, decode (\d+) tokens ([\d.]+) tok/s",
                  out)
    w = re.search(r"weights: ([\d.]+) MiB held", out)
    if not m:
        return {"err": "no figures in the output: %s" % out.strip()[-200:]}
    return {"prefill": float(m.group(2)), "decode": float(m.group(4)),
            "held": float(w.group(1)) if w else None, "peak": peak}


# ---- transformers ---------------------------------------------------------------------

def hf_available():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


def hf_short_error(e):
    name = type(e).__name__
    if "OutOfMemory" in name or "out of memory" in str(e):
        return "out of memory"
    return "%s: %s" % (name, str(e).splitlines()[0][:120] if str(e) else "")


def hf_load(d, dtype, device, attn=None):
    """The model in transformers (attn: attn_implementation, e.g. "sdpa"; None: its
    default)."""
    import torch
    import transformers

    td = torch.bfloat16 if dtype.startswith("bf16") else torch.float32
    kw = {"attn_implementation": attn} if attn else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=td, **kw)
    model.to(device)
    model.eval()
    return model


def hf_ids(batch, prompt, vocab, device):
    import torch

    v = min(vocab, 256)
    rows = [[(i * 131 + b * 17 + 7) % v for i in range(prompt)] for b in range(batch)]
    return torch.tensor(rows, dtype=torch.long, device=device)


def hf_forward(model, ids, past=None, pos=0):
    """One forward with the cache: transformers 5's past_key_values; a model that names it
    cache_params (NemotronH in transformers 4) gets that and the cache position. Only the
    last row's logits when the model takes logits_to_keep (kvferry computes no others)."""
    import torch

    kws = [dict(input_ids=ids, use_cache=True)]
    if past is not None:
        kws = [dict(input_ids=ids, use_cache=True, past_key_values=past),
               dict(input_ids=ids, use_cache=True, cache_params=past,
                    cache_position=torch.tensor([pos], device=ids.device))]
    err = None
    for kw in kws:
        for keep in (True, False):
            try:
                return model(logits_to_keep=1, **kw) if keep else model(**kw)
            except TypeError as e:   # an argument this model does not take
                err = e
    raise err


def hf_cache(out):
    past = getattr(out, "past_key_values", None)
    return past if past is not None else getattr(out, "cache_params", None)


def hf_run(model, batch, prompt, decode, device):
    """(prefill tok/s, decode tok/s): the prompt forward, then decode - 1 greedy steps from
    its cache (kvferry's first token also comes from the prompt forward)."""
    import torch

    cuda = device != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    vocab = model.config.vocab_size
    ids = hf_ids(batch, prompt, vocab, device)
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        out = hf_forward(model, ids)
        tok = out.logits[:, -1:].argmax(-1)
        sync()
        t1 = time.perf_counter()
        past = hf_cache(out)
        for step in range(decode - 1):
            out = hf_forward(model, tok, past, prompt + step)
            past = hf_cache(out)
            tok = out.logits[:, -1:].argmax(-1)
        sync()
        t2 = time.perf_counter()
    return batch * prompt / (t1 - t0), batch * (decode - 1) / max(t2 - t1, 1e-9)


def hf_bench(model, batch, args, prompt=None, decode=None):
    """dict(prefill, decode, peak) or dict(err); a short warm-up run first (prompt / decode
    tokens: args' unless given)."""
    import torch

    cuda = args.device != "cpu"
    prompt = args.prompt_len if prompt is None else prompt
    decode = args.decode_tokens if decode is None else decode
    try:
        hf_run(model, min(batch, 2), min(prompt, 16), 2, args.device)   # warm-up
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        p, d = hf_run(model, batch, prompt, decode, args.device)
        peak = torch.cuda.max_memory_allocated() / 1048576.0 if cuda else None
        if cuda:
            torch.cuda.empty_cache()   # the next kvf run sees this process's weights only
        return {"prefill": p, "decode": d, "peak": peak}
    except Exception as e:   # OOM or an API difference: the cell says which
        if cuda:
            torch.cuda.empty_cache()
        return {"err": hf_short_error(e)}


# ---- the table ------------------------------------------------------------------------

HEAD = ("| model | dtype | batch | kvf prefill tok/s | HF prefill tok/s | prefill ratio "
        "| kvf decode tok/s | HF decode tok/s | decode ratio | kvf weights MiB "
        "| kvf peak dev MiB | kvf peak / weights | HF peak dev MiB |")
RULE = "|" + "---|" * 13


def fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return "{:,.{}f}".format(v, digits)


def ratio(a, b):
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or b <= 0:
        return "-"
    return "%.2fx" % (a / b)


def table_row(label, dtype, batch, k, h):
    """One Markdown row from a kvf result and a transformers result (dicts)."""
    kerr, herr = k.get("err"), h.get("err")
    kp = k.get("prefill") if not kerr else "kvf: " + kerr
    kd = k.get("decode") if not kerr else "-"
    hp = h.get("prefill") if not herr else "HF: " + herr
    hd = h.get("decode") if not herr else "-"
    held, peak = k.get("held"), k.get("peak")
    pv = float(peak.lstrip("~")) if isinstance(peak, str) else peak
    over = ratio(pv, held) if (held and pv) else "-"
    cells = [label, dtype, str(batch), fmt(kp), fmt(hp), ratio(kp, hp), fmt(kd), fmt(hd),
             ratio(kd, hd), fmt(held), fmt(peak, 0), over, fmt(h.get("peak"), 0)]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def targets(results):
    """The issue's speed targets as figures: bf16 prefill >= 1x transformers bf16, decode
    >= 2x, per model and batch (yes / no / - when a side has no figure)."""
    out = []
    for (label, dtype, batch), (k, h) in results.items():
        if not dtype.startswith("bf16"):
            continue
        def ok(key, factor):
            a, b = k.get(key), h.get(key)
            if not isinstance(a, float) or not isinstance(b, float) or b <= 0:
                return "-"
            return "yes" if a >= factor * b else "no"
        out.append("%s %s b%d: prefill>=1x %s, decode>=2x %s" %
                   (label, dtype, batch, ok("prefill", 1.0), ok("decode", 2.0)))
    return out


# ---- the GPU engine issue's rows (--rows issue40) ----------------------------------------

ISSUE_HEAD = ("| model | row | batch | tokens each | kvf tok/s | HF sdpa tok/s | kvf / HF "
              "| kvf weights MiB | kvf peak dev MiB | HF peak dev MiB |")


def issue_row(label, what, batch, tokens, key, k, h):
    """One row of the issue's table: @a key ("prefill" or "decode") of kvf result k and
    transformers result h (dicts)."""
    kv = k.get(key) if "err" not in k else "kvf: " + k["err"]
    hv = h.get(key) if "err" not in h else "HF: " + h["err"]
    cells = [label, what, str(batch), str(tokens), fmt(kv), fmt(hv), ratio(kv, hv),
             fmt(k.get("held")), fmt(k.get("peak"), 0), fmt(h.get("peak"), 0)]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def issue40(args, env, hf_missing, geom_dir):
    """Per model: prefill of --prefill-len tokens at batch 1, then decode at each batch
    with --context-len tokens of context (--decode-tokens generated), bf16 weights on tensor
    cores and a bf16 KV cache against transformers bf16 with sdpa attention; each row
    printed (stdout) as soon as it is measured, then the table and the targets."""
    rows, kvf_failed, verdicts = [], 0, []
    runs = [("prefill", 1, args.prefill_len, 2)] + [("decode", b, args.context_len,
                                                     args.decode_tokens) for b in args.batches]
    for name in args.models:
        label = model_label(name, args.geom_pattern, args.llama_layers)
        d = model_dir(name, geom_dir)
        err = build_model(args, env, name, d) if elapsed() <= args.budget else None
        model, load_err = None, hf_missing if not err else "no model"
        for key, batch, prompt, decode in runs:
            what = ("prefill %d" % prompt) if key == "prefill" else ("decode @%d" % prompt)
            if err:
                k, h = {"err": "no model (%s)" % err[:80]}, {"err": "no model"}
            elif elapsed() > args.budget:
                k, h = {"err": "not run (time budget)"}, {"err": "not run"}
            else:
                log("kvf %s %s batch %d" % (label, what, batch))
                k = run_kvf(args, env, d, "bf16", batch,
                            min(max(30, int(args.budget - elapsed()) + 60), 600), prompt, decode)
                kvf_failed += 1 if "err" in k else 0
                if model is None and load_err is None:
                    log("transformers load %s (bf16, sdpa)" % label)
                    try:
                        model = hf_load(d, "bf16", args.device, attn="sdpa")
                    except Exception as e:
                        load_err = hf_short_error(e)
                h = {"err": load_err} if load_err else hf_bench(model, batch, args, prompt,
                                                                 decode)
            rows.append(issue_row(label, what, batch, prompt if key == "prefill" else decode,
                                  key, k, h))
            print(rows[-1], flush=True)   # as measured
            a, b = k.get(key), h.get(key)
            if isinstance(a, float) and isinstance(b, float) and b > 0 and \
                    (key == "prefill" or batch == 16):
                factor = 1.0 if key == "prefill" else 2.0
                verdicts.append("%s %s b%d >= %gx: %s" % (label, key, batch, factor,
                                                         "yes" if a >= factor * b else "no"))
        if model is not None:
            del model
            if args.device != "cpu":
                import torch
                torch.cuda.empty_cache()
    title = ("kvferry (`kvf bench-model --device %s --warmup yes`, bf16 weights on tensor "
             "cores, bf16 KV, %s attention) vs transformers bf16 (sdpa) on the same device; "
             "tok/s: prompt tokens per second for prefill rows, generated tokens per second "
             "(all requests) for decode rows" %
             (args.device, "FlashInfer's" if args.attn == "flashinfer" else "kvferry's"))
    text = "\n".join(["", title, "", ISSUE_HEAD, "|" + "---|" * 10] + rows + [""] +
                     ["targets (prefill >= 1x, decode at batch 16 >= 2x): " +
                      ("; ".join(verdicts) or "no pair of figures")])
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    print("engine_gpu: %d kvf run(s) failed, %.0f s" % (kvf_failed, elapsed()))
    return 1 if kvf_failed else 0


# ---- main -----------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.device != "cpu":
        ok, why = gpu_present()
        if not ok:
            print("skipped: no GPU (%s)" % why)
            return 77
    if not (os.path.isfile(args.kvf) and os.access(args.kvf, os.X_OK)):
        print("engine_gpu: --kvf %s is not an executable file" % args.kvf, file=sys.stderr)
        return 2
    env, still_missing = library_env(args.kvf)
    if still_missing:
        log("warning: kvf's libraries not found anywhere: %s" % ", ".join(still_missing))
    if env.get("LD_LIBRARY_PATH") != os.environ.get("LD_LIBRARY_PATH"):
        log("LD_LIBRARY_PATH for kvf: %s" % env["LD_LIBRARY_PATH"])
    hf_missing = hf_available()
    if hf_missing:
        log("transformers side skipped: %s" % hf_missing)
    if args.device != "cpu" and not hf_missing:
        import torch
        if not torch.cuda.is_available():
            hf_missing = "torch sees no CUDA device"
    tmp = None
    geom_dir = args.keep
    if set(args.models) & {"geom", "llama-geom"} and not geom_dir:
        tmp = tempfile.mkdtemp(prefix="kvf-engine-gpu-")
        geom_dir = os.path.join(tmp, "geom")
    if args.rows == "issue40":
        try:
            return issue40(args, env, hf_missing, geom_dir)
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    rows, results, kvf_failed = [], {}, 0
    try:
        for name in args.models:
            geom_err = None
            label = model_label(name, args.geom_pattern, args.llama_layers)
            d = model_dir(name, geom_dir)
            if name in ("geom", "llama-geom") and elapsed() <= args.budget:
                # written when its turn comes: a slow disk costs the geometry rows only
                geom_err = build_model(args, env, name, d)
                if geom_err:
                    log(geom_err)
            for dtype in args.dtypes:
                model, load_err = None, hf_missing
                for batch in args.batches:
                    if name in ("geom", "llama-geom") and geom_err:
                        k, h = {"err": "no model (mkmodel failed)"}, {"err": "no model"}
                    elif elapsed() > args.budget:
                        k, h = {"err": "not run (time budget)"}, {"err": "not run"}
                    else:
                        left = max(30, int(args.budget - elapsed()) + 60)
                        log("kvf %s %s batch %d" % (label, dtype, batch))
                        k = run_kvf(args, env, d, dtype, batch, min(left, 600))
                        kvf_failed += 1 if "err" in k and "time budget" not in k["err"] else 0
                        shared = (label, HF_SHARED.get(dtype), batch)
                        if shared in results:
                            h = results[shared][1]   # the same transformers run
                        elif model is None and load_err is None:
                            log("transformers load %s %s" % (label, dtype))
                            try:
                                model = hf_load(d, dtype, args.device)
                            except Exception as e:
                                load_err = hf_short_error(e)
                        if shared in results:
                            pass
                        elif load_err is not None:
                            h = {"err": load_err}
                        else:
                            log("transformers %s %s batch %d" % (label, dtype, batch))
                            h = hf_bench(model, batch, args)
                    results[(label, dtype, batch)] = (k, h)
                    rows.append(table_row(label, dtype, batch, k, h))
                    print(rows[-1], file=sys.stderr, flush=True)
                if model is not None:
                    del model
                    if args.device != "cpu":
                        import torch
                        torch.cuda.empty_cache()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    title = ("kvferry (`kvf bench-model --device %s --warmup yes`) vs transformers on the same "
             "device: prompt %d tokens, %d tokens generated per request, greedy" %
             (args.device, args.prompt_len, args.decode_tokens))
    text = "\n".join([title, "", HEAD, RULE] + rows + [""] +
                     ["targets (issue 30, bf16): " + ("; ".join(targets(results)) or
                                                       "no bf16 rows")])
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    print("engine_gpu: %d kvf run(s) failed, %.0f s" % (kvf_failed, elapsed()))
    return 1 if kvf_failed else 0


if __name__ == "__main__":
    sys.exit(main())
