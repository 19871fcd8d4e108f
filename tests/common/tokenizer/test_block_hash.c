/* The prefix cache's hash chain (kvf_block_hash.h): the vectors below were
 * printed by tests/common/tokenizer/block_hash_ref.py, an implementation of
 * docs/PREFIX_CACHE.md §2 in Python on the xxhash package, so the C code
 * and the spec agree byte for byte (and a key does not depend on the
 * process, the host's byte order or the build). Salt and digest separate
 * chains; every token and the unit length enter each unit's hash. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "kvf_block_hash.h"

#include <string.h>

static void assert_hash(kvf_block_hash_t h, uint64_t lo, uint64_t hi)
{
    assert_true(h.lo == lo);
    assert_true(h.hi == hi);
}

static void test_reference_vectors(void **state)
{
    uint8_t digest[16];
    int32_t toks[16], odd[4] = {-1, 0, 2147483647, 7}, big[200];
    kvf_block_hash_t r0, r1, h1, h2, out[2];
    (void)state;

    for (int i = 0; i < 16; ++i) {
        digest[i] = (uint8_t)i;
        toks[i] = 100 + i;
    }
    for (int i = 0; i < 200; ++i) {
        big[i] = (int32_t)((i * 7919) % 150000);
    }
    assert_int_equal(kvf_block_hash_root(digest, NULL, 0, &r0), KVF_OK);
    assert_hash(r0, 0x12df4351f673b706ull, 0x1172d941b05bcac2ull);
    assert_int_equal(kvf_block_hash_root(digest, (const uint8_t *)"tenant-a", 8, &r1), KVF_OK);
    assert_hash(r1, 0x6d22e121f6d556a7ull, 0x5e96b07898689c35ull);
    h1 = kvf_block_hash_next(r0, toks, 16);
    assert_hash(h1, 0x91f409e097d9c305ull, 0x5b93308dbc7d84e4ull);
    h2 = kvf_block_hash_next(h1, odd, 4);
    assert_hash(h2, 0xb8cad2cd1b31abdaull, 0xcacfe05ea88d4fe7ull);
    assert_hash(kvf_block_hash_next(r1, big, 200), 0x71bb316272659c82ull, 0x188601b2e6ab6487ull);

    /* the chain is the repeated step */
    kvf_block_hash_chain(r0, toks, 8, 2, out);
    assert_true(memcmp(&out[1], &(kvf_block_hash_t){0}, sizeof(out[1])) != 0);
    assert_true(kvf_block_hash_next(kvf_block_hash_next(r0, toks, 8), toks + 8, 8).lo == out[1].lo);
}

static void test_separation(void **state)
{
    uint8_t d1[16] = {0}, d2[16] = {0};
    int32_t toks[16] = {0};
    kvf_block_hash_t a, b, c;
    (void)state;

    d2[15] = 1;
    assert_int_equal(kvf_block_hash_root(d1, (const uint8_t *)"x", 1, &a), KVF_OK);
    assert_int_equal(kvf_block_hash_root(d1, (const uint8_t *)"y", 1, &b), KVF_OK);
    assert_int_equal(kvf_block_hash_root(d2, (const uint8_t *)"x", 1, &c), KVF_OK);
    assert_true((a.lo != b.lo) && (a.lo != c.lo));
    /* one token changed, or one token more, changes the unit's hash */
    b = kvf_block_hash_next(a, toks, 16);
    toks[15] = 1;
    c = kvf_block_hash_next(a, toks, 16);
    assert_true(b.lo != c.lo);
    assert_true(kvf_block_hash_next(a, toks, 15).lo != c.lo);
}

static void test_bad_arguments(void **state)
{
    uint8_t d[16] = {0}, salt[KVF_CACHE_SALT_MAX + 1] = {0};
    kvf_block_hash_t r;
    (void)state;

    assert_int_equal(kvf_block_hash_root(NULL, NULL, 0, &r), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_block_hash_root(d, NULL, 3, &r), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_block_hash_root(d, salt, sizeof(salt), &r), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_block_hash_root(d, salt, KVF_CACHE_SALT_MAX, &r), KVF_OK);
    assert_int_equal(kvf_block_hash_digest_from_hex("000102030405060708090a0b0c0d0E0F", d),
                     KVF_OK);
    assert_int_equal(d[14], 14);
    assert_int_equal(d[15], 15);
    assert_int_equal(kvf_block_hash_digest_from_hex("00", d), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_block_hash_digest_from_hex("000102030405060708090a0b0c0d0e0g", d),
                     KVF_ERR_INVALID_PARAM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_vectors),
        cmocka_unit_test(test_separation),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
