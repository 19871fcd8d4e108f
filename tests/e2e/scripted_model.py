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
import os
import shutil
import struct

import numpy as np

from kvf_e2e import repo_root

BASE = os.path.join(repo_root(), "models-trained", "tiny-dense")
H, HEADS, KV, HD, INTER = 256, 2, 1, 32, 64
ALPHA = 40.0


def _safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
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
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((vocab, H)).astype(np.float32)
    emb /= np.sqrt((emb ** 2).mean(axis=1, keepdims=True))   # rms 1: the final norm keeps it
    head = np.zeros((vocab, H), np.float32)
    for frm, to, w in rules:
        head[ids[to]] += (ALPHA * w / H) * emb[ids[frm]]
    t = {"model.embed_tokens.weight": emb, "model.norm.weight": np.ones(H),
         "lm_head.weight": head}
    p = "model.layers.0."
    t[p + "input_layernorm.weight"] = np.ones(H)
    t[p + "post_attention_layernorm.weight"] = np.ones(H)
    t[p + "self_attn.q_proj.weight"] = rng.standard_normal((HEADS * HD, H)) * 0.02
    t[p + "self_attn.k_proj.weight"] = rng.standard_normal((KV * HD, H)) * 0.02
    t[p + "self_attn.v_proj.weight"] = rng.standard_normal((KV * HD, H)) * 0.02
    t[p + "self_attn.o_proj.weight"] = np.zeros((H, HEADS * HD))
    t[p + "mlp.gate_proj.weight"] = rng.standard_normal((INTER, H)) * 0.02
    t[p + "mlp.up_proj.weight"] = rng.standard_normal((INTER, H)) * 0.02
    t[p + "mlp.down_proj.weight"] = np.zeros((H, INTER))
    _safetensors(os.path.join(out_dir, "model.safetensors"), t)
    return ids


def remove(out_dir):
    shutil.rmtree(out_dir, ignore_errors=True)
