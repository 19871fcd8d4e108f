#!/usr/bin/env python3
"""Trains a tiny Nemotron-H model (transformers' NemotronHForCausalLM) on the
synthetic tasks of train/tasks.py, CPU only, deterministic for a given seed,
thread count and library versions.

  python3 train/train.py --config tests/data/models/tiny-hybrid.config.json \
      --out /tmp/tiny-hybrid --seed 1 --steps 2400 --recall-warmup 500 --recall-every 3 \
      --batch-recall 12 --batch-short 16 --batch-add 64 --recall-queries 8 --add-digits 3-3

(the committed checkpoints' command; each folder's TRAINING.md has it exactly)

The geometry (layers, heads, Mamba sizes) comes from --config; vocab_size and
the special token ids are replaced by those of the tokenizer trained here.
Loss is cross-entropy on the answer tokens and EOS only. What makes recall
learnable in minutes on a CPU (measured on the hybrid; before, 4000 steps left
it at chance):
  - lr 1e-3: at 3e-3 the lookup never formed, even on 4-8 records;
  - several questions per training recall prompt (--recall-queries), each
    answer a target, so one prompt carries several lookups' worth of signal;
  - --recall-warmup steps of recall alone on 4-8 records first, where the
    lookup forms (about 300 steps), then all three tasks with recall prompts
    growing from 6-12 to 28-44 records over half the remaining steps (a
    curriculum: the mechanism is the same, short prompts are cheaper).
Writes config.json,
model.safetensors (bf16), tokenizer.json, tokenizer_config.json,
generation_config.json, heldout.jsonl and TRAINING.md (command, versions,
seed, held-out accuracy per task measured on the saved bf16 weights).
"""
import argparse
import json
import math
import os
import random
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402
import tokenizer as tokmod  # noqa: E402


def log(msg):
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def encode_sample(tok, s, bos, eos):
    """(ids, trained) for BOS + prompt + answer [+ further questions and
    answers] + EOS; trained[i] says whether ids[i] is a target (answers, EOS)."""
    ids = [bos] + tok.encode(s["prompt"]).ids
    trained = [False] * len(ids)
    for q, a in [(None, s["answer"])] + list(s.get("more", [])):
        if q is not None:
            qi = tok.encode(q).ids
            ids += qi
            trained += [False] * len(qi)
        ai = tok.encode(a).ids
        ids += ai
        trained += [True] * len(ai)
    return ids + [eos], trained + [True]


def make_batch(tok, samples, bos, eos, pad):
    seqs = [encode_sample(tok, s, bos, eos) for s in samples]
    T = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    labels = torch.full((len(seqs), T), -100, dtype=torch.long)
    for i, (full, trained) in enumerate(seqs):
        ids[i, : len(full)] = torch.tensor(full)
        # the model shifts labels itself
        labels[i, : len(full)] = torch.tensor([t if m else -100 for t, m in zip(full, trained)])
    return ids, labels


@torch.no_grad()
def greedy(model, prompt_ids, eos, max_new):
    ids = list(prompt_ids)
    out = []
    for _ in range(max_new):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        t = int(torch.argmax(logits))
        if t == eos:
            break
        out.append(t)
        ids.append(t)
    return out


def evaluate(model, tok, held, bos, eos, per_task):
    model.eval()
    acc = {}
    for task in tasks.TASKS:
        rows = [s for s in held if s["task"] == task][:per_task]
        ok = 0
        for s in rows:
            p = [bos] + tok.encode(s["prompt"]).ids
            got = tok.decode(greedy(model, p, eos, 12))
            ok += got == s["answer"]
        acc[task] = ok / max(1, len(rows))
    model.train()
    return acc


def recall_records(step, steps):
    """Curriculum: 6..12 records at step 0, the full 28..44 from mid-training."""
    f = min(1.0, step / max(1, steps // 2))
    lo = int(round(6 + f * (28 - 6)))
    hi = int(round(12 + f * (44 - 12)))
    return lo, hi


def save(model, cfg_json, tok, held, out, meta):
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    # Hugging Face NemotronH checkpoints name the trunk "backbone." (newer transformers call
    # it "model." in memory and accept both when loading)
    sd = {("backbone." + k[len("model."):] if k.startswith("model.") else k):
          v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2)
        f.write("\n")
    tokmod.write_config(tok, out)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg_json["bos_token_id"], "eos_token_id": cfg_json["eos_token_id"],
                   "pad_token_id": cfg_json["pad_token_id"], "do_sample": False,
                   "max_new_tokens": 16}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "heldout.jsonl"), "w") as f:
        for s in held:
            f.write(json.dumps(s) + "\n")
    with open(os.path.join(out, "TRAINING.md"), "w") as f:
        f.write(meta)


def parse_args():
    """Command line, checked; sets tasks.PARAMS. Returns (args, fixed_records)."""
    ap = argparse.ArgumentParser(description="train a tiny Nemotron-H on the synthetic tasks")
    ap.add_argument("--config", required=True, help="config.json giving the geometry")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-recall", type=int, default=12)
    ap.add_argument("--batch-short", type=int, default=32, help="batch of add and of reverse")
    ap.add_argument("--batch-add", type=int, default=0,
                    help="batch of add when it differs from --batch-short (its prompts are "
                         "short, so a big one costs little, and addition learns slowest)")
    ap.add_argument("--vocab", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--heldout", type=int, default=100, help="held-out samples per task")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--init", help="start from this checkpoint folder (its weights and its "
                    "tokenizer.json) instead of random weights: a second training stage")
    ap.add_argument("--add-digits", default="2-3", help="operand digits of add, LO-HI")
    ap.add_argument("--recall-records", default=None,
                    help="records per recall prompt, LO-HI, fixed (default: a curriculum "
                         "from 6-12 to 28-44 over the first half)")
    ap.add_argument("--recall-early", type=int, default=10,
                    help="held-out recall queries a key among the first this many records")
    ap.add_argument("--recall-keys", choices=("pairs", "letters"), default="pairs",
                    help="recall keys: two lower-case letters, or one letter a-z/A-Z")
    ap.add_argument("--recall-warmup", type=int, default=0,
                    help="first this many steps train recall alone on 4-8 records (the "
                         "lookup forms there much sooner than among the other tasks); the "
                         "curriculum starts after them")
    ap.add_argument("--recall-lr", type=float, default=0,
                    help="learning rate of the recall warm-up (default --lr): the lookup "
                         "forms at 1e-3, not at 3e-3, while addition wants the higher rate")
    ap.add_argument("--recall-every", type=int, default=1,
                    help="after the warm-up, train recall on every this many steps only")
    ap.add_argument("--recall-queries", type=int, default=1,
                    help="questions per training recall prompt (held-out prompts ask one)")
    ap.add_argument("--train-chunk-size", type=int, default=32,
                    help="Mamba scan chunk while training (the stored config keeps its own; "
                         "the chunked scan is exact for any chunk, short prompts just pad less)")
    args = ap.parse_args()
    for name, v in (("--recall-every", args.recall_every), ("--recall-queries", args.recall_queries)):
        if v < 1:
            ap.error(f"{name} {v}: need >= 1")
    if not 0 <= args.recall_warmup < args.steps:
        ap.error(f"--recall-warmup {args.recall_warmup}: need 0 <= it < --steps {args.steps}")

    def span(v, name):
        try:
            lo, hi = (int(x) for x in v.split("-"))
        except ValueError:
            ap.error(f"{name} {v!r}: expected LO-HI")
        if not 1 <= lo <= hi:
            ap.error(f"{name} {v!r}: need 1 <= LO <= HI")
        return lo, hi

    tasks.PARAMS["add_digits"] = span(args.add_digits, "--add-digits")
    fixed_records = span(args.recall_records, "--recall-records") if args.recall_records else None
    if fixed_records:
        tasks.PARAMS["recall_records"] = fixed_records
    tasks.PARAMS["recall_early"] = args.recall_early
    tasks.PARAMS["recall_keys"] = args.recall_keys
    most = (fixed_records or (28, 44))[1]
    if args.recall_keys == "letters" and most > len(tasks.KEY_LETTERS):
        ap.error(f"--recall-keys letters has {len(tasks.KEY_LETTERS)} distinct keys, fewer than "
                 f"the {most} records a prompt may hold (--recall-records)")

    return args, fixed_records


def setup(args):
    """Seeds torch, draws the held-out set, builds (or loads) the tokenizer and the model.
    Returns a namespace: rng (to go on drawing from), held, seen, tok, bos, eos, pad,
    cfg_json, model, nparams."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    from transformers import NemotronHConfig, NemotronHForCausalLM
    import tokenizers

    rng = random.Random(args.seed)
    held, seen = [], set()
    for task in tasks.TASKS:
        while sum(1 for s in held if s["task"] == task) < args.heldout:
            s = tasks.gen(rng, task, early=True)
            if s["prompt"] not in seen:
                seen.add(s["prompt"])
                held.append(s)
    if args.init:
        tok = tokenizers.Tokenizer.from_file(os.path.join(args.init, "tokenizer.json"))
    else:
        corpus = [tasks.gen(rng, t, early=False) for t in tasks.TASKS for _ in range(3000)]
        tok = tokmod.build([s["prompt"] + s["answer"] for s in corpus], args.vocab)
    bos, eos, pad = (tok.token_to_id(t) for t in tokmod.SPECIALS)

    with open(args.config) as f:
        cfg_json = json.load(f)
    cfg_json.update(vocab_size=tok.get_vocab_size(), bos_token_id=bos, eos_token_id=eos,
                    pad_token_id=pad, torch_dtype="bfloat16")
    model = NemotronHForCausalLM(NemotronHConfig(**dict(cfg_json, chunk_size=args.train_chunk_size)))
    if args.init:
        from safetensors.torch import load_file
        sd = load_file(os.path.join(args.init, "model.safetensors"))
        sd = {("model." + k[len("backbone."):] if k.startswith("backbone.") else k): v.float()
              for k, v in sd.items()}
        missing, unexpected = model.load_state_dict(sd, strict=False)
        if missing or unexpected:
            sys.exit(f"--init {args.init}: weights do not fit --config "
                     f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        log(f"initialised from {args.init}")
    nparams = sum(p.numel() for p in model.parameters())
    log(f"model {nparams} parameters, vocab {tok.get_vocab_size()}")

    return types.SimpleNamespace(rng=rng, held=held, seen=seen, tok=tok, bos=bos, eos=eos,
                                 pad=pad, cfg_json=cfg_json, model=model, nparams=nparams)


def lr_schedule(args):
    """The learning rate of each step: (lr_at(step), the recall warm-up's rate)."""
    warm = 20

    recall_lr = args.recall_lr or args.lr

    def lr_at(step):
        if step < warm:
            return recall_lr * (step + 1) / warm
        if step < args.recall_warmup:
            return recall_lr
        # all tasks: a 50-step ramp from the warm-up's rate to --lr, then cosine to a tenth
        start = max(warm, args.recall_warmup)
        if args.recall_warmup and step < start + 50:
            return recall_lr + (args.lr - recall_lr) * (step - start + 1) / 50
        p = (step - start) / max(1, args.steps - start)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    return lr_at, recall_lr


def train_loop(args, st, fixed_records, lr_at):
    """Trains st.model for --steps, logging losses and saving a partial checkpoint every
    --eval-every steps. Returns the start time."""
    model, tok, held, seen, rng = st.model, st.tok, st.held, st.seen, st.rng
    bos, eos, pad, cfg_json = st.bos, st.eos, st.pad, st.cfg_json
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)

    def fresh(task, **kw):
        while True:
            s = (tasks.gen_recall(rng, rng.random() < 0.5, queries=args.recall_queries, **kw)
                 if task == "recall"
                 else tasks.gen(rng, task))
            if s["prompt"] not in seen:
                return s

    t0 = time.time()
    model.train()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        warming = step < args.recall_warmup
        lo, hi = ((4, 8) if warming else
                  fixed_records or recall_records(step - args.recall_warmup,
                                                  args.steps - args.recall_warmup))
        short = 0 if warming else args.batch_short
        add = 0 if warming else (args.batch_add or args.batch_short)
        # after the warm-up, recall (long prompts, most of a step's time) trains every
        # --recall-every steps: it is learnt by then, addition is not
        recall = args.batch_recall if warming or step % args.recall_every == 0 else 0
        losses = []
        for task, bsz in (("recall", recall), ("add", add), ("reverse", short)):
            if bsz == 0:
                losses.append(float("nan"))
                continue
            kw = {"n_range": (lo, hi)} if task == "recall" else {}
            ids, labels = make_batch(tok, [fresh(task, **kw) for _ in range(bsz)], bos, eos, pad)
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 20 == 0:
            log(f"step {step} lr {lr_at(step):.2e} recall {losses[0]:.3f} add {losses[1]:.3f} "
                f"reverse {losses[2]:.3f} records {lo}-{hi} {time.time() - t0:.0f}s")
        if (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            log(f"eval step {step + 1}: {evaluate(model, tok, held, bos, eos, 20)}")
            save(model, cfg_json, tok, held, args.out, f"(partial, step {step + 1})\n")

    return t0


def finish(args, st, recall_lr, t0):
    """Rounds the weights to bf16, measures held-out accuracy on them, saves with TRAINING.md."""
    import tokenizers
    import transformers

    model, tok, held, bos, eos = st.model, st.tok, st.held, st.bos, st.eos
    cfg_json, nparams = st.cfg_json, st.nparams

    # Measure what is shipped: the bf16-rounded weights.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    acc = evaluate(model, tok, held, bos, eos, args.heldout)
    log(f"final held-out accuracy (bf16 weights): {acc}")
    minutes = (time.time() - t0) / 60
    cmd = " ".join(["python3"] + [a if " " not in a else repr(a) for a in sys.argv])
    meta = (f"# How this checkpoint was made\n\n"
            f"```\n{cmd}\n```\n\n"
            f"- seed {args.seed}, {args.steps} steps, lr {args.lr} (recall warm-up "
            f"{recall_lr}), recall batch "
            f"{args.batch_recall}, add batch {args.batch_add or args.batch_short}, reverse batch "
            f"{args.batch_short}, {args.threads} thread(s), "
            f"Mamba chunk {args.train_chunk_size} while training, add digits {args.add_digits}, "
            f"recall records {args.recall_records or 'curriculum 6-12 to 28-44'}, "
            f"{args.recall_queries} question(s) per training recall prompt, keys "
            f"{args.recall_keys}, first {args.recall_warmup} steps recall alone on 4-8 records, "
            f"then recall on every {args.recall_every} step(s)"
            f"{', from ' + args.init if args.init else ''}\n"
            f"- python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
            f"{transformers.__version__}, tokenizers {tokenizers.__version__}\n"
            f"- {nparams} parameters, vocab {tok.get_vocab_size()}, weights stored as bf16\n"
            f"- training took {minutes:.1f} minutes on this machine's CPU\n"
            f"- held-out accuracy, greedy, bf16 weights in transformers ({args.heldout} per task):"
            + "".join(f" {t} {100 * a:.0f}%" for t, a in acc.items()) + "\n")
    save(model, cfg_json, tok, held, args.out, meta)
    log("saved " + args.out)


def main():
    args, fixed_records = parse_args()
    st = setup(args)
    lr_at, recall_lr = lr_schedule(args)
    t0 = train_loop(args, st, fixed_records, lr_at)
    finish(args, st, recall_lr, t0)


if __name__ == "__main__":
    main()
