#!/usr/bin/env python3
"""Trains the byte-level BPE tokenizer of the tiny task models.

The layout is that of Qwen2/Qwen3 and Llama-3 checkpoints: no normalizer, a
Split pre-tokenizer (the Qwen2 regex: letters, single digits, punctuation
runs, whitespace) followed by ByteLevel without its own regex, a BPE model
over the 256 byte symbols plus merges, a ByteLevel decoder, and three special
tokens <bos>, <eos>, <pad> with ids 0, 1, 2.
"""
import json

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<bos>", "<eos>", "<pad>"]


def build(texts, vocab_size):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def write_config(tok, out_dir):
    tok.save(f"{out_dir}/tokenizer.json")
    with open(f"{out_dir}/tokenizer_config.json", "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>",
                   "eos_token": "<eos>", "pad_token": "<pad>", "add_bos_token": True,
                   "model_max_length": 4096, "clean_up_tokenization_spaces": False},
                  f, indent=2)
        f.write("\n")
