#!/usr/bin/env python3
"""kvferry's CPU engine against transformers on the same checkpoints.

Builds two bf16 checkpoints with transformers (config + random init +
save_pretrained): a dense Llama of about 63M parameters and a Nemotron-H
hybrid of about 32M, then prints, in one table, prefill and decode tokens/s
of `kvf bench-model` (TP 1 and 2, and TP 1 with 2 BLAS threads) and of
transformers (fp32, torch.set_num_threads 1 and 2), best of --repeat runs
each (the runs interleaved round by round, so a shared machine's load hits
both sides alike), and the ratios kvferry / transformers. Also the peak RSS /
file size that `kvf bench-model` prints after loading.

Usage:
  python3 tests/bench/engine_vs_hf.py --kvf build/bin/kvf [--prompt-len 1000]
      [--decode-tokens 32] [--repeat 3] [--keep DIR] [--models dense,hybrid]
      [--kvf-base OLD/bin/kvf]   (before/after in the same run)
Exit status 0; 77 when torch or transformers is missing (skipped).
Speed targets live here as printed figures, never as asserts.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

DENSE = dict(vocab_size=32000, hidden_size=512, intermediate_size=1920, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64,
             max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1,
             eos_token_id=2)
HYBRID = dict(vocab_size=16384, hidden_size=512, hybrid_override_pattern="M*M-M*M-",
              num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
              intermediate_size=2048, mamba_num_heads=16, mamba_head_dim=32,
              ssm_state_size=64, n_groups=2, conv_kernel=4, chunk_size=128,
              max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
              layer_norm_epsilon=1e-5)


def build(kind, out_dir):
    import torch
    import transformers

    if os.path.exists(os.path.join(out_dir, "config.json")):
        return
    if kind == "dense":
        cfg = transformers.LlamaConfig(**DENSE)
    else:
        kw = dict(HYBRID)
        pat = kw.pop("hybrid_override_pattern")
        names = {"M": "mamba", "*": "attention", "-": "mlp"}
        kw["layers_block_type"] = [names[c] for c in pat]
        cfg = transformers.AutoConfig.for_model("nemotron_h", **kw)
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(out_dir)
    n = sum(p.numel() for p in model.parameters())
    print("built %s: %.1fM parameters, bf16 in %s" % (kind, n / 1e6, out_dir))


def kvf_bench(kvf, d, tp, blas, prompt_len, decode):
    """One `kvf bench-model` run: (prefill tok/s, decode tok/s, peak RSS / file or None)."""
    env = dict(os.environ, KVF_BLAS_THREADS=str(blas))
    p = subprocess.run([kvf, "bench-model", "--model", d, "--tp", str(tp), "--prompt-len",
                        str(prompt_len), "--decode-tokens", str(decode),
                        "--max-batch-tokens", str(max(512, prompt_len))],
                       capture_output=True, text=True, env=env, timeout=1200)
    if p.returncode != 0:
        sys.exit("kvf bench-model failed: %s" % p.stderr[-2000:])
    m = re.search(r"prefill \d+ tokens ([\d.]+) tok/s, decode \d+ tokens ([\d.]+) tok/s",
                  p.stdout)
    r = re.search(r"= ([\d.]+) x the checkpoint", p.stdout)
    return float(m.group(1)), float(m.group(2)), (float(r.group(1)) if r else None)


def hf_load(d, threads):
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.eval()
    with torch.no_grad():   # warm-up: first-call set-up is not counted
        model(input_ids=torch.tensor([[(i * 131 + 7) % 256 for i in range(16)]]), use_cache=True)
    return model


def hf_bench(model, prompt_len, decode):
    """One transformers run: prompt forward, then greedy steps from its cache (tok/s)."""
    import torch

    ids = torch.tensor([[(i * 131 + 7) % 256 for i in range(prompt_len)]])
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True)
        t1 = time.perf_counter()
        past = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        t2 = time.perf_counter()
        for _ in range(decode):
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
        t3 = time.perf_counter()
    return prompt_len / (t1 - t0), decode / (t3 - t2)


def bench_threads(args, d, threads):
    """Rows for one model and thread count. Each round runs transformers once and every
    kvferry variant once, back to back, and each keeps its best round: on a shared
    machine the load then changes for all of them alike, so the ratios stay fair."""
    variants = [("tp %d" % threads, threads, 1)]
    if threads == 2:
        variants.append(("tp 1, 2 BLAS threads", 1, 2))
    variants = [(label, args.kvf, tp, blas) for label, tp, blas in variants] + \
               [(label + " (base)", args.kvf_base, tp, blas)
                for label, tp, blas in (variants if args.kvf_base else [])]
    model = hf_load(d, threads)
    hp = hd = 0.0
    best = [[0.0, 0.0, None] for _ in variants]
    for _ in range(args.repeat):
        p, dd = hf_bench(model, args.prompt_len, args.decode_tokens)
        hp, hd = max(hp, p), max(hd, dd)
        for v, (label, kvf, tp, blas) in enumerate(variants):
            kp, kd, rss = kvf_bench(kvf, d, tp, blas, args.prompt_len, args.decode_tokens)
            best[v] = [max(best[v][0], kp), max(best[v][1], kd), rss]
    del model
    return [(v[0], b[0], b[1], hp, hd, b[2]) for v, b in zip(variants, best)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvf", required=True)
    ap.add_argument("--kvf-base", help="a second kvf binary (e.g. an older build) run in the "
                    "same rounds; its rows say (base)")
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="dense,hybrid")
    ap.add_argument("--keep", help="build the checkpoints here and keep them")
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print("skipped: %s (pip install torch transformers)" % e)
        return 77
    import warnings
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    root = args.keep or tempfile.mkdtemp(prefix="kvf-bench-hf-")
    print("transformers %s, torch %s; prompt %d tokens, %d decode tokens, best of %d" % (
        transformers.__version__, torch.__version__, args.prompt_len, args.decode_tokens,
        args.repeat))
    rows = []
    for kind in args.models.split(","):
        d = os.path.join(root, kind)
        os.makedirs(d, exist_ok=True)
        build(kind, d)
        for threads in (1, 2):
            for label, kp, kd, hp, hd, rss in bench_threads(args, d, threads):
                rows.append((kind, threads, label, kp, kd, hp, hd, rss))
    print("%-7s %-7s %-28s %10s %10s %10s %10s %7s %7s %6s" % (
        "model", "threads", "kvferry", "kvf pre", "kvf dec", "hf pre", "hf dec", "pre x",
        "dec x", "rss/f"))
    for kind, th, label, kp, kd, hp, hd, rss in rows:
        print("%-7s %-7d %-28s %10.1f %10.1f %10.1f %10.1f %7.2f %7.2f %6s" % (
            kind, th, label, kp, kd, hp, hd, kp / hp, kd / hd,
            "%.2f" % rss if rss is not None else "-"))
    print("(tokens/s; x = kvferry / transformers fp32 at the same thread count;"
          " rss/f = kvf bench-model's peak RSS after loading / checkpoint size)")
    if not args.keep:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
