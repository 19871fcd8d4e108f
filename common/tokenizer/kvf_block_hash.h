/*
 * Block hash chain of the prefix cache (docs/PREFIX_CACHE.md §2 specifies
 * the bytes, so another implementation can compute the same keys).
 *
 * A prompt is cut into hash units of `unit` tokens (the gcd of the
 * attention block size and the Mamba state grid); unit k's hash is
 *
 *     h_0     = XXH3-128("kvferry-prefix-v1" | weights digest (16 bytes) |
 *                        u32 salt length | salt bytes)
 *     h_k     = XXH3-128(h_{k-1} (16 bytes) | u32 unit | tokens of unit k as i32)
 *
 * every integer little-endian, a 128-bit hash written as its low 64 bits
 * then its high 64 bits, both little-endian (XXH128_hash_t's low64, high64).
 * The salt (the request's cache_salt, empty without one) and the weights
 * digest enter only h_0, so they separate whole chains: two salts or two
 * checkpoints never share a unit.
 *
 * Why 128 bits and still token ids: the hash is the lookup key only; the
 * prefix cache compares every unit's token ids and its parent entry before
 * using an entry (kvf_prefix_cache.h), so a collision costs a miss, never
 * another prompt's KV.
 *
 * Thread safety: pure functions.
 */
#ifndef KVF_BLOCK_HASH_H
#define KVF_BLOCK_HASH_H

#include "kvf_status.h"

#include <stddef.h>
#include <stdint.h>

#define KVF_BLOCK_HASH_DOMAIN   "kvferry-prefix-v1"
#define KVF_CACHE_SALT_MAX      256      /* bytes of a cache_salt */

typedef struct kvf_block_hash {
    uint64_t lo;   /* XXH128_hash_t.low64 */
    uint64_t hi;   /* XXH128_hash_t.high64 */
} kvf_block_hash_t;

/**
 * The chain's root h_0 for a model's weights digest and a request's salt.
 *
 * @param [in]  digest    16 bytes: the model digest (kvf_model_digest_t.hex
 *                        decoded, first hex pair = byte 0); all zero for an
 *                        engine without one (tests).
 * @param [in]  salt      @a salt_len bytes, any values; NULL when 0.
 * @param [out] root_p    h_0.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for a NULL digest, salt_len over
 *         KVF_CACHE_SALT_MAX, or a NULL salt with a length.
 */
kvf_status_t kvf_block_hash_root(const uint8_t digest[16], const uint8_t *salt, size_t salt_len,
                                 kvf_block_hash_t *root_p);

/**
 * h_k from h_{k-1} and unit k's @a unit token ids (int32[unit], any values).
 */
kvf_block_hash_t kvf_block_hash_next(kvf_block_hash_t parent, const int32_t *tokens, int unit);

/**
 * Hashes of the first @a n_units complete units of @a tokens (int32
 * [n_units * unit]) after @a root into @a out[n_units] (out[k-1] = h_k).
 */
void kvf_block_hash_chain(kvf_block_hash_t root, const int32_t *tokens, int unit, int n_units,
                          kvf_block_hash_t *out);

/** Decode 32 lowercase/uppercase hex digits into 16 bytes. KVF_ERR_INVALID_PARAM otherwise. */
kvf_status_t kvf_block_hash_digest_from_hex(const char *hex, uint8_t digest[16]);

#endif
