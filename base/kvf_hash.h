/*
 * One non-cryptographic hash for the tree: XXH3 (libxxhash, Debian's libxxhash-dev), for
 * the model-config fingerprint, hash tables and seeds. Stable across hosts and versions
 * of the library (XXH3's output is frozen since xxhash 0.8.0), so a value that crosses the
 * wire (the handshake's model_fingerprint) may be computed here.
 * Rejected: hand-written FNV-1a (four copies of it stood in the tree, with xxhash linked
 * already for the KV digests).
 */
#ifndef KVF_HASH_H
#define KVF_HASH_H

#include <stddef.h>
#include <stdint.h>

#include <xxhash.h>

/**
 * XXH3-64 of @a len bytes at @a data with @a seed. Chain values by passing one hash as
 * the next call's seed: kvf_hash64(b, nb, kvf_hash64(a, na, 0)).
 *
 * @param [in] data  The bytes (may be NULL when @a len is 0); not kept.
 * @return The 64-bit hash; no errors.
 */
static inline uint64_t kvf_hash64(const void *data, size_t len, uint64_t seed)
{
    return (uint64_t)XXH3_64bits_withSeed(data, len, (XXH64_hash_t)seed);
}

#endif /* KVF_HASH_H */
