#!/usr/bin/env python3
"""Seeded synthetic tasks with exact answers, for the trained tiny models.

Three tasks, each chosen so that a wrong KV block or a wrong Mamba slice
changes the answer:

  add     multi-digit addition, "add 347+5821=" -> "6168"
  recall  key-value recall: 28-44 records "ab=47" (140-220 tokens: 2-3 blocks of 80),
          then "? ab=" -> "47"; in the held-out set the queried key sits in
          the first 10 records, so attention must reach back across blocks
          (sizes are PARAMS: train.py's --add-digits, --recall-records,
          --recall-early and --recall-keys change them; training prompts may
          ask several questions, see gen_recall)
  reverse reverse a word spelled with spaces, "rev c a t s =" -> " s t a c"
          (needs the order of the letters, carried by the recurrent state)

A sample is {"task", "prompt", "answer"}; the model sees BOS + prompt and
must produce answer + EOS. Held-out samples never occur in the training set
(checked by prompt). Everything depends only on --seed.

Usage: python3 train/tasks.py --seed 1 --train 60000 --heldout 100 --out DIR
writes DIR/train.jsonl and DIR/heldout.jsonl.
"""
import argparse
import json
import os
import random
import string

LETTERS = string.ascii_lowercase

# Task sizes (train.py sets them from its flags; the defaults are stage 1's).
PARAMS = {"add_digits": (2, 3), "recall_records": (28, 44), "recall_early": 10,
          "recall_keys": "pairs"}
KEY_LETTERS = string.ascii_lowercase + string.ascii_uppercase


def gen_add(rng):
    da, db = rng.randint(*PARAMS["add_digits"]), rng.randint(*PARAMS["add_digits"])
    a = rng.randint(10 ** (da - 1), 10 ** da - 1)
    b = rng.randint(10 ** (db - 1), 10 ** db - 1)
    return {"task": "add", "prompt": f"add {a}+{b}=", "answer": str(a + b)}


def gen_recall(rng, early, n_range=None, queries=1):
    """queries > 1 (training only): after the first answer, queries-1 more
    "? key=" questions on other records follow in "more" as (question, answer)
    pairs; only their answers are trained on, so one prompt gives queries
    answers' worth of signal (as in the multi-query associative recall of
    Arora et al. 2023, "Zoology")."""
    n = rng.randint(*(n_range or PARAMS["recall_records"]))
    keys = set()
    if PARAMS["recall_keys"] == "letters" and n > len(KEY_LETTERS):
        raise ValueError(f"{n} recall records need {n} distinct keys; one-letter keys "
                         f"have {len(KEY_LETTERS)}")
    while len(keys) < n:
        keys.add(rng.choice(KEY_LETTERS) if PARAMS["recall_keys"] == "letters"
                 else rng.choice(LETTERS) + rng.choice(LETTERS))
    keys = sorted(keys)   # a set's order follows the per-process string hash seed
    rng.shuffle(keys)
    vals = [f"{rng.randint(10, 99)}" for _ in keys]
    q = rng.randint(0, min(PARAMS["recall_early"] - 1, n - 1)) if early else rng.randint(0, n - 1)
    body = " ".join(f"{k}={v}" for k, v in zip(keys, vals))
    s = {"task": "recall", "prompt": f"kv {body} ? {keys[q]}=", "answer": vals[q]}
    if queries > 1:
        others = [i for i in range(n) if i != q]
        rng.shuffle(others)
        s["more"] = [(f" ? {keys[i]}=", vals[i]) for i in others[:queries - 1]]
    return s


def gen_reverse(rng):
    n = rng.randint(3, 6)
    w = [rng.choice(LETTERS) for _ in range(n)]
    return {"task": "reverse", "prompt": "rev " + " ".join(w) + " =",
            "answer": "".join(" " + c for c in reversed(w))}


def gen(rng, task, early=False):
    if task == "add":
        return gen_add(rng)
    if task == "recall":
        return gen_recall(rng, early)
    return gen_reverse(rng)


TASKS = ("add", "recall", "reverse")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train", type=int, default=60000, help="training samples per task")
    ap.add_argument("--heldout", type=int, default=100, help="held-out samples per task")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    held, seen = [], set()
    for task in TASKS:
        while sum(1 for s in held if s["task"] == task) < args.heldout:
            s = gen(rng, task, early=True)
            if s["prompt"] not in seen:
                seen.add(s["prompt"])
                held.append(s)
    train = []
    for task in TASKS:
        k = 0
        while k < args.train:
            s = gen(rng, task, early=(rng.random() < 0.5))
            if s["prompt"] in seen:
                continue
            train.append(s)
            k += 1
    for name, rows in (("heldout.jsonl", held), ("train.jsonl", train)):
        with open(os.path.join(args.out, name), "w") as f:
            for s in rows:
                f.write(json.dumps(s) + "\n")
    print(f"wrote {len(train)} training and {len(held)} held-out samples to {args.out}")


if __name__ == "__main__":
    main()
