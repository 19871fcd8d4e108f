"""Model checkpoints and colocated reference runs for the end-to-end tests.

Checkpoints are written once per build by `kvf mkmodel` (seeded, so every
run of every test sees the same weights) under <build>/e2e-models/. The
reference is `kvf generate` in one process: its greedy tokens and the logits
of every generated token, which tell how close the top two candidates were.
"""

import os
import shutil
import subprocess
import tempfile

from kvf_e2e import find_bin, repo_root

# fp32 reduction-order differences between TP layouts stay far below this;
# a greedy token may legitimately flip only where the top-2 margin is smaller.
LOGIT_TOL = 1e-3


def model_dir(name, seed=1, shards=1, dtype="fp32"):
    """Folder with config.json + weights for tests/data/models/<name>.config.json
    (model.safetensors, or `shards` files with model.safetensors.index.json)."""
    bindir = find_bin()
    tag = "%s-seed%d" % (name, seed) + ("-%dshards" % shards if shards > 1 else "") + \
        ("-%s" % dtype if dtype != "fp32" else "")
    out = os.path.join(os.path.dirname(bindir), "e2e-models", tag)
    done = "model.safetensors.index.json" if shards > 1 else "model.safetensors"
    if not (os.path.exists(os.path.join(out, done)) and
            os.path.exists(os.path.join(out, "tokenizer.json"))):
        # write aside and rename: tests running in parallel may race for it
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".", dir=os.path.dirname(out))
        cfg = os.path.join(repo_root(), "tests", "data", "models", name + ".config.json")
        subprocess.run([os.path.join(bindir, "kvf"), "mkmodel", "--config", cfg, "--out", tmp,
                        "--seed", str(seed), "--shards", str(shards), "--dtype", dtype],
                       check=True, stdout=subprocess.DEVNULL)
        try:
            os.rename(tmp, out)
        except OSError:          # another test won the race; theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def reference(model, prompt, max_tokens, tp=1, kv_dtype="bf16"):
    """Greedy tokens and per-token logits of a colocated run: (tokens, [logits...]).
    The prompt goes through a file (kvf generate --prompt-file), so any length works."""
    r = reference_logprobs(model, prompt, max_tokens, None, tp, kv_dtype)
    return r[0], r[1]


def reference_logprobs(model, prompt, max_tokens, logprobs, tp=1, kv_dtype="bf16"):
    """(tokens, [logits...], [(logprob, [(id, logprob)...]) per token]) of a colocated
    greedy run with `kvf generate --logprobs N` (None: no logprobs, empty list). Every
    number is printed with 9 significant digits, so each float's bits survive."""
    bindir = find_bin()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    try:
        p = subprocess.run([os.path.join(bindir, "kvf"), "generate", "--model", model, "--tp",
                            str(tp), "--prompt-file", f.name, "--max-tokens", str(max_tokens),
                            "--kv-dtype", kv_dtype, "--print-logits",
                            "--logprobs", str(-1 if logprobs is None else logprobs)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True,
                           timeout=120)
    finally:
        os.unlink(f.name)
    tokens, logits, lps = None, [], []
    for line in p.stdout.decode("latin-1").splitlines():
        if line.startswith("tokens:"):
            tokens = [int(t) for t in line.split()[1:]]
        elif line.startswith("logits "):
            logits.append([float(x) for x in line.split()[3:]])
        elif line.startswith("logprobs "):
            w = line.split()
            top = [(int(a), float(b)) for a, b in (t.split(":") for t in w[4:])]
            lps.append((float(w[3]), top))
    assert tokens is not None, p.stdout
    return tokens, logits, lps


def top2_margin(logits):
    a, b = sorted(logits, reverse=True)[:2]
    return a - b


def check_tokens(got, ref_tokens, ref_logits, exact, what):
    """Token-for-token equality; with exact=False a divergence is allowed only at a
    position whose reference top-2 margin is within LOGIT_TOL (then the rest may differ)."""
    assert len(got) == len(ref_tokens), "%s: %d tokens, reference %d (%s vs %s)" % (
        what, len(got), len(ref_tokens), got, ref_tokens)
    for i, (g, r) in enumerate(zip(got, ref_tokens)):
        if g == r:
            continue
        margin = top2_margin(ref_logits[i])
        assert not exact and margin <= LOGIT_TOL, (
            "%s: token %d is %d, reference %d (top-2 margin %.3g); got %s, reference %s" % (
                what, i, g, r, margin, got, ref_tokens))
        return i   # diverged on a near-tie: later tokens are conditioned differently
    return len(got)
