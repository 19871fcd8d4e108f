"""A scripted checkpoint: a Llama whose next token is a fixed function of the current one.

Its one layer adds nothing (o_proj and down_proj are zero), so the last hidden state is the
current token's embedding; the LM head scores token s by the embeddings of the tokens whose
successor is s, so the successor wins by a wide margin (random unit embeddings in 256
dimensions are nearly orthogonal). The script is a list of (token, successor, weight) rules
over added tokens appended to the trained tiny tokenizer; a request's allowed_token_ids or
logit_bias picks among several successors of one token (each with its weight). Used where a
test must know the model's output exactly (tool calls, reasoning).

write(out_dir, tokens, rules, chat_template): tokens are (content, special) added after the
base vocabulary, in order; rules are (from_content, to_content, weight) with "<eos>" usable
as a target. Added contents must be printable ASCII without spaces (the ByteLevel decoder
passes them unchanged).
"""

import json
import math
import os
import random
import shutil
import struct

from kvf_e2e import repo_root

BASE = os.path.join(repo_root(), "models-trained", "tiny-dense")
H, HEADS, KV, HD, INTER = 256, 2, 1, 32, 64
ALPHA = 40.0


def _safetensors(path, tensors):
    """tensors: name -> (shape, flat list of floats), written as F32."""
    header, blobs, off = {}, [], 0
    for name, (shape, flat) in tensors.items():
        data = struct.pack("<%df" % len(flat), *flat)
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    head = json.dumps(header).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def _gauss(rng, rows, cols, scale):
    return [rng.gauss(0.0, 1.0) * scale for _ in range(rows * cols)]


def write(out_dir, tokens, rules, chat_template, seed=5):
    os.makedirs(out_dir, exist_ok=True)
    tok = json.load(open(os.path.join(BASE, "tokenizer.json")))
    base_v = len(tok["model"]["vocab"])
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    for i, (content, special) in enumerate(tokens):
        tok["added_tokens"].append({"id": base_v + i, "content": content, "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False,
                                    "special": special})
        ids[content] = base_v + i
    vocab = base_v + len(tokens)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    cfg = json.load(open(os.path.join(BASE, "tokenizer_config.json")))
    cfg["chat_template"] = chat_template
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    config = json.load(open(os.path.join(repo_root(), "tests", "data", "models",
                                         "tiny-llama.config.json")))
    config.update({"vocab_size": vocab, "hidden_size": H, "intermediate_size": INTER,
                   "num_hidden_layers": 1, "num_attention_heads": HEADS,
                   "num_key_value_heads": KV, "head_dim": HD, "bos_token_id": ids["<bos>"],
                   "eos_token_id": ids["<eos>"], "pad_token_id": ids["<pad>"]})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    rng = random.Random(seed)
    emb = []
    for _ in range(vocab):   # rms 1: the final norm keeps it
        row = [rng.gauss(0.0, 1.0) for _ in range(H)]
        rms = math.sqrt(sum(x * x for x in row) / H)
        emb.append([x / rms for x in row])
    head = [[0.0] * H for _ in range(vocab)]
    for frm, to, w in rules:
        e = emb[ids[frm]]
        for j in range(H):
            head[ids[to]][j] += (ALPHA * w / H) * e[j]
    flat = lambda m: [x for row in m for x in row]
    p = "model.layers.0."
    t = {"model.embed_tokens.weight": ((vocab, H), flat(emb)),
         "model.norm.weight": ((H,), [1.0] * H),
         "lm_head.weight": ((vocab, H), flat(head)),
         p + "input_layernorm.weight": ((H,), [1.0] * H),
         p + "post_attention_layernorm.weight": ((H,), [1.0] * H),
         p + "self_attn.q_proj.weight": ((HEADS * HD, H), _gauss(rng, HEADS * HD, H, 0.02)),
         p + "self_attn.k_proj.weight": ((KV * HD, H), _gauss(rng, KV * HD, H, 0.02)),
         p + "self_attn.v_proj.weight": ((KV * HD, H), _gauss(rng, KV * HD, H, 0.02)),
         p + "self_attn.o_proj.weight": ((H, HEADS * HD), [0.0] * (H * HEADS * HD)),
         p + "mlp.gate_proj.weight": ((INTER, H), _gauss(rng, INTER, H, 0.02)),
         p + "mlp.up_proj.weight": ((INTER, H), _gauss(rng, INTER, H, 0.02)),
         p + "mlp.down_proj.weight": ((H, INTER), [0.0] * (H * INTER))}
    _safetensors(os.path.join(out_dir, "model.safetensors"), t)
    return ids


def remove(out_dir):
    shutil.rmtree(out_dir, ignore_errors=True)
