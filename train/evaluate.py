#!/usr/bin/env python3
"""Held-out accuracy of a trained tiny model in transformers (greedy, the
stored bf16 weights run in fp32), per task, on any heldout.jsonl:

  python3 train/evaluate.py --model models-trained/tiny-hybrid \
      [--heldout models-trained/tiny-hybrid/heldout.jsonl] [--per-task 100]

This is the reference accuracy kvferry's colocated and disaggregated runs
are compared with (kvf matrix, deploy/quickstart.sh).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402
from train import evaluate  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint folder")
    ap.add_argument("--heldout", help="questions (default: the model's heldout.jsonl)")
    ap.add_argument("--per-task", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import NemotronHForCausalLM
    import tokenizers

    model = NemotronHForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    tok = tokenizers.Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    with open(args.heldout or os.path.join(args.model, "heldout.jsonl")) as f:
        held = [json.loads(line) for line in f if line.strip()]
    acc = evaluate(model, tok, held, cfg["bos_token_id"], cfg["eos_token_id"], args.per_task)
    for t in tasks.TASKS:
        print(f"{t:8s} {100 * acc[t]:5.1f} %")


if __name__ == "__main__":
    main()
