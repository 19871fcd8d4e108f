/*
 * Block hash chain (kvf_block_hash.h). Design: the bytes hashed are built in
 * a small buffer with explicit little-endian stores, never by hashing a C
 * struct or an int array in host order, so the keys are the same on any
 * host (docs/PREFIX_CACHE.md §2). XXH3-128 from libxxhash (already the KV
 * and model digests' hash).
 */
#include "kvf_block_hash.h"
#include "kvf_log.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY   /* XXH3_state_t on the stack: no allocation per unit */
#include <xxhash.h>

static void kvf_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; ++i) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void kvf_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; ++i) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static kvf_block_hash_t kvf_from_xxh(XXH128_hash_t h)
{
    return (kvf_block_hash_t){.lo = h.low64, .hi = h.high64};
}

kvf_status_t kvf_block_hash_root(const uint8_t digest[16], const uint8_t *salt, size_t salt_len,
                                 kvf_block_hash_t *root_p)
{
    uint8_t buf[sizeof(KVF_BLOCK_HASH_DOMAIN) - 1 + 16 + 4 + KVF_CACHE_SALT_MAX];
    size_t n = sizeof(KVF_BLOCK_HASH_DOMAIN) - 1;

    if ((digest == NULL) || (root_p == NULL) || (salt_len > KVF_CACHE_SALT_MAX) ||
        ((salt == NULL) && (salt_len > 0))) {
        kvf_error("block hash: bad root arguments (salt of %zu bytes, at most %d)", salt_len,
                  KVF_CACHE_SALT_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    memcpy(buf, KVF_BLOCK_HASH_DOMAIN, n);
    memcpy(buf + n, digest, 16);
    n += 16;
    kvf_put_u32(buf + n, (uint32_t)salt_len);
    n += 4;
    if (salt_len > 0) {
        memcpy(buf + n, salt, salt_len);
        n += salt_len;
    }
    *root_p = kvf_from_xxh(XXH3_128bits(buf, n));
    return KVF_OK;
}

kvf_block_hash_t kvf_block_hash_next(kvf_block_hash_t parent, const int32_t *tokens, int unit)
{
    XXH3_state_t st;
    uint8_t head[20], buf[256];
    int i = 0;

    /* streaming: a unit of any size hashes without a buffer of its size */
    (void)XXH3_128bits_reset(&st);
    kvf_put_u64(head, parent.lo);
    kvf_put_u64(head + 8, parent.hi);
    kvf_put_u32(head + 16, (uint32_t)unit);
    (void)XXH3_128bits_update(&st, head, sizeof(head));
    while (i < unit) {
        int n = 0;
        for (; (i < unit) && (n + 4 <= (int)sizeof(buf)); ++i, n += 4) {
            kvf_put_u32(buf + n, (uint32_t)tokens[i]);
        }
        (void)XXH3_128bits_update(&st, buf, (size_t)n);
    }
    return kvf_from_xxh(XXH3_128bits_digest(&st));
}

void kvf_block_hash_chain(kvf_block_hash_t root, const int32_t *tokens, int unit, int n_units,
                          kvf_block_hash_t *out)
{
    kvf_block_hash_t h = root;

    for (int k = 0; k < n_units; ++k) {
        h = kvf_block_hash_next(h, tokens + (size_t)k * (size_t)unit, unit);
        out[k] = h;
    }
}

static int kvf_hexval(char c)
{
    if ((c >= '0') && (c <= '9')) {
        return c - '0';
    }
    if ((c >= 'a') && (c <= 'f')) {
        return c - 'a' + 10;
    }
    if ((c >= 'A') && (c <= 'F')) {
        return c - 'A' + 10;
    }
    return -1;
}

kvf_status_t kvf_block_hash_digest_from_hex(const char *hex, uint8_t digest[16])
{
    if ((hex == NULL) || (strlen(hex) != 32)) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (int i = 0; i < 16; ++i) {
        int a = kvf_hexval(hex[2 * i]), b = kvf_hexval(hex[2 * i + 1]);
        if ((a < 0) || (b < 0)) {
            return KVF_ERR_INVALID_PARAM;
        }
        digest[i] = (uint8_t)(a * 16 + b);
    }
    return KVF_OK;
}
