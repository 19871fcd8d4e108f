#!/usr/bin/env python3
"""Independent implementation of the prefix cache's hash chain (docs/PREFIX_CACHE.md §2),
from the spec alone, with the `xxhash` package (pip install xxhash). It printed the vectors
that test_block_hash.c asserts; rerun it to check them:

    python3 tests/common/tokenizer/block_hash_ref.py
"""
import struct
import xxhash

DOMAIN = b"kvferry-prefix-v1"


def h128(data):
    v = xxhash.xxh3_128_intdigest(data)
    return v & (2**64 - 1), v >> 64          # (low64, high64)


def root(digest, salt):
    return h128(DOMAIN + digest + struct.pack("<I", len(salt)) + salt)


def nxt(parent, tokens):
    lo, hi = parent
    head = struct.pack("<QQI", lo, hi, len(tokens))
    return h128(head + struct.pack("<%di" % len(tokens), *tokens))


def show(name, h):
    print("%-28s lo=0x%016xull hi=0x%016xull" % (name, h[0], h[1]))


digest = bytes(range(16))
r0 = root(digest, b"")
show("root(digest 00..0f, '')", r0)
r1 = root(digest, b"tenant-a")
show("root(digest, 'tenant-a')", r1)
toks = list(range(100, 116))
h1 = nxt(r0, toks)
show("h1 = next(r0, 100..115)", h1)
h2 = nxt(h1, [-1, 0, 2**31 - 1, 7])
show("h2 = next(h1, -1 0 max 7)", h2)
big = [(i * 7919) % 150000 for i in range(200)]
show("next(r1, 200 tokens)", nxt(r1, big))
