/* The prefix cache's index (kvf_prefix_cache.h) over the block manager's
 * refcounts and LRU (tiny-hybrid layout: one attention group, block 80):
 * - hits are whole cached blocks from the start, or the longest state
 *   checkpoint whose blocks below it are cached, never past max_tokens;
 * - a forged key with the same 128-bit unit hashes but other tokens (a
 *   collision) misses, and so does another salt;
 * - shared blocks are refcounted; a free cached block counts as free, waits
 *   in the LRU (a prefix's tail first) and its entry goes when it is reused;
 * - state slots are reused least recently used first;
 * - a block is served only to a key of the source that computed it, and a
 *   blocks-only lookup (decode's, docs/PREFIX_CACHE.md §6) takes the longest
 *   run of cached blocks, walking the hash units inside each block;
 * - a sliding group needs only the blocks the hit's window attends. */
#include "kvf_pool_test.h"
#include "kvf_prefix_cache.h"

#include <stdlib.h>

typedef struct {
    int32_t          toks[400];
    kvf_block_hash_t uh[400];
    kvf_prefix_key_t key;
} kvf_key_buf_t;

static void kvf_mkkey(kvf_key_buf_t *k, const char *salt, int n, int unit, int32_t base)
{
    uint8_t digest[16] = {1};
    for (int i = 0; i < n; ++i) {
        k->toks[i] = base + i;
    }
    assert_int_equal(kvf_block_hash_root(digest, (const uint8_t *)salt, salt ? strlen(salt) : 0,
                                         &k->key.root), KVF_OK);
    kvf_block_hash_chain(k->key.root, k->toks, unit, n / unit, k->uh);
    k->key.salt = (const uint8_t *)salt;
    k->key.salt_len = salt ? strlen(salt) : 0;
    k->key.tokens = k->toks;
    k->key.unit_hash = k->uh;
    k->key.n_units = n / unit;
}

static void test_blocks_refcount_lru(void **state)
{
    kvf_pool_test_env_t e;
    kvf_block_manager_h bm;
    kvf_prefix_cache_h pc;
    kvf_prefix_cache_params_t pp = {.unit = 16, .block_size = 80, .n_attn_groups = 1,
                                    .state_grid = 16, .state_slots = 2};
    kvf_req_blocks_t r = {0}, r2 = {0};
    kvf_prefix_hit_t hit;
    static kvf_key_buf_t k, forged, salted;
    (void)state;

    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 0);
    bm = kvf_pool_test_bm(&e, 8);
    pp.bm = bm;
    assert_int_equal(kvf_prefix_cache_create(&pp, &pc), KVF_OK);
    kvf_mkkey(&k, NULL, 400, 16, 1000);
    kvf_mkkey(&salted, "s", 400, 16, 1000);
    forged = k;                      /* the same hashes, other tokens: a collision */
    forged.toks[3] = 7;
    forged.key.tokens = forged.toks;
    forged.key.unit_hash = k.uh;

    /* a request of 200 tokens: 3 attention blocks + 2 Mamba blocks */
    assert_int_equal(kvf_block_manager_allocate(bm, &r, 200), KVF_OK);
    assert_int_equal(kvf_block_manager_num_free(bm), 3);
    assert_int_equal(kvf_prefix_cache_add_block(pc, &k.key, 0, &r.blocks[0][0]), KVF_OK);
    assert_int_equal(kvf_prefix_cache_add_block(pc, &k.key, 1, &r.blocks[0][1]), KVF_OK);
    assert_int_equal(kvf_prefix_cache_add_state(pc, &k.key, 176), 0);
    assert_int_equal(kvf_prefix_cache_add_state(pc, &k.key, 176), -1);   /* held already */

    kvf_prefix_cache_lookup(pc, &k.key, 400, &hit);
    assert_int_equal(hit.tokens, 176);           /* the checkpoint, blocks 0-1 below it */
    assert_int_equal(hit.n_blocks, 2);
    assert_int_equal(hit.ids[0], r.blocks[0][0]);
    assert_int_equal(hit.ids[1], r.blocks[0][1]);
    assert_int_equal(hit.state_slot, 0);
    kvf_prefix_cache_lookup(pc, &k.key, 175, &hit);
    assert_int_equal(hit.tokens, 0);             /* no checkpoint at or below 175 */
    kvf_prefix_cache_lookup(pc, &forged.key, 400, &hit);
    assert_int_equal(hit.tokens, 0);
    kvf_prefix_cache_lookup(pc, &salted.key, 400, &hit);
    assert_int_equal(hit.tokens, 0);

    /* share blocks 0-1 into a second request; freeing the first keeps them held */
    kvf_prefix_cache_lookup(pc, &k.key, 400, &hit);
    assert_int_equal(kvf_block_manager_share(bm, &r2, hit.ids, 2), KVF_OK);
    assert_int_equal(kvf_block_manager_allocate(bm, &r2, 176), KVF_OK);   /* + tail + Mamba */
    assert_int_equal(kvf_block_manager_num_free(bm), 0);
    assert_int_equal(kvf_block_manager_free(bm, &r), KVF_OK);
    assert_int_equal(kvf_block_manager_num_free(bm), 3);         /* block 2 and the Mamba */
    assert_int_equal(kvf_block_manager_num_cached_free(bm), 0);  /* 0-1 still held by r2 */
    assert_int_equal(kvf_block_manager_free(bm, &r2), KVF_OK);
    assert_int_equal(kvf_block_manager_num_free(bm), 8);
    assert_int_equal(kvf_block_manager_num_cached_free(bm), 2);

    /* reuse: the plain free blocks first, then the cached ones, the prefix's tail first */
    assert_int_equal(kvf_block_manager_allocate(bm, &r, 6 * 80), KVF_OK);  /* 6 + 2 Mamba */
    kvf_prefix_cache_lookup(pc, &k.key, 400, &hit);
    assert_int_equal(hit.tokens, 0);             /* both cached blocks went */
    {
        kvf_prefix_cache_stats_t st;
        kvf_prefix_cache_get_stats(pc, &st);
        assert_int_equal(st.cached_blocks, 0);
        assert_int_equal((int)st.blocks_evicted, 2);
        assert_int_equal(st.states, 1);          /* the state stays: its own budget */
    }
    assert_int_equal(kvf_block_manager_free(bm, &r), KVF_OK);
    kvf_prefix_cache_destroy(pc);
    kvf_block_manager_destroy(bm);
}

static void test_state_slots_lru(void **state)
{
    kvf_pool_test_env_t e;
    kvf_block_manager_h bm;
    kvf_prefix_cache_h pc;
    kvf_prefix_cache_params_t pp = {.unit = 16, .block_size = 80, .n_attn_groups = 1,
                                    .state_grid = 16, .state_slots = 2};
    kvf_prefix_hit_t hit;
    static kvf_key_buf_t a, b, c;
    (void)state;

    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 0);
    bm = kvf_pool_test_bm(&e, 8);
    pp.bm = bm;
    assert_int_equal(kvf_prefix_cache_create(&pp, &pc), KVF_OK);
    kvf_mkkey(&a, NULL, 64, 16, 10);
    kvf_mkkey(&b, NULL, 64, 16, 20);
    kvf_mkkey(&c, NULL, 64, 16, 30);
    assert_int_equal(kvf_prefix_cache_add_state(pc, &a.key, 48), 0);
    assert_int_equal(kvf_prefix_cache_add_state(pc, &b.key, 32), 1);
    kvf_prefix_cache_lookup(pc, &a.key, 63, &hit);     /* a used: b is the LRU one */
    assert_int_equal(hit.tokens, 48);
    assert_int_equal(kvf_prefix_cache_add_state(pc, &c.key, 16), 1);
    kvf_prefix_cache_lookup(pc, &b.key, 63, &hit);
    assert_int_equal(hit.tokens, 0);
    assert_true(kvf_prefix_cache_has_state(pc, &c.key, 16));
    assert_false(kvf_prefix_cache_has_state(pc, &c.key, 32));
    /* a checkpoint under another one's entry: the LRU one (a at 48) goes, the new one at 16
     * of the same chain keeps the entries it needs */
    kvf_prefix_cache_lookup(pc, &c.key, 63, &hit);
    assert_int_equal(kvf_prefix_cache_add_state(pc, &a.key, 16), 0);
    assert_true(kvf_prefix_cache_has_state(pc, &a.key, 16));
    assert_false(kvf_prefix_cache_has_state(pc, &a.key, 48));
    pp.state_slots = 0;
    assert_int_equal(kvf_prefix_cache_create(&pp, &pc), KVF_ERR_INVALID_PARAM);
    kvf_prefix_cache_destroy(pc);
    kvf_block_manager_destroy(bm);
}

static void test_sources_blocks_only(void **state)
{
    kvf_pool_test_env_t e;
    kvf_block_manager_h bm;
    kvf_prefix_cache_h pc;
    kvf_prefix_cache_params_t pp = {.unit = 16, .block_size = 80, .n_attn_groups = 1,
                                    .state_grid = 16, .state_slots = 2};
    kvf_req_blocks_t r = {0};
    kvf_prefix_hit_t hit;
    static kvf_key_buf_t a, b;
    (void)state;

    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 0);
    bm = kvf_pool_test_bm(&e, 8);
    pp.bm = bm;
    assert_int_equal(kvf_prefix_cache_create(&pp, &pc), KVF_OK);
    kvf_mkkey(&a, NULL, 400, 16, 1000);
    kvf_mkkey(&b, NULL, 400, 16, 1000);   /* the same tokens, KV of another numerics class */
    a.key.source = 0xA;
    b.key.source = 0xB;
    assert_int_equal(kvf_block_manager_allocate(bm, &r, 200), KVF_OK);
    assert_int_equal(kvf_prefix_cache_add_block(pc, &a.key, 0, &r.blocks[0][0]), KVF_OK);
    assert_int_equal(kvf_prefix_cache_add_block(pc, &a.key, 1, &r.blocks[0][1]), KVF_OK);
    /* the same prefix from the other source: the first copy stays */
    assert_int_equal(kvf_prefix_cache_add_block(pc, &b.key, 0, &r.blocks[0][2]), KVF_OK);

    a.key.blocks_only = b.key.blocks_only = true;
    kvf_prefix_cache_lookup(pc, &a.key, 400, &hit);
    assert_int_equal(hit.tokens, 160);            /* no checkpoint needed: two blocks */
    assert_int_equal(hit.n_blocks, 2);
    assert_int_equal(hit.ids[1], r.blocks[0][1]);
    assert_int_equal(hit.state_slot, -1);
    kvf_prefix_cache_lookup(pc, &a.key, 159, &hit);
    assert_int_equal(hit.tokens, 80);             /* never past max_tokens */
    kvf_prefix_cache_lookup(pc, &b.key, 400, &hit);
    assert_int_equal(hit.tokens, 0);              /* another source's blocks: a miss */

    a.key.blocks_only = b.key.blocks_only = false;
    kvf_prefix_cache_lookup(pc, &a.key, 400, &hit);
    assert_int_equal(hit.tokens, 0);              /* with states: a checkpoint is needed */
    assert_int_equal(kvf_prefix_cache_add_state(pc, &a.key, 176), 0);
    kvf_prefix_cache_lookup(pc, &a.key, 400, &hit);
    assert_int_equal(hit.tokens, 176);
    kvf_prefix_cache_lookup(pc, &b.key, 400, &hit);
    assert_int_equal(hit.tokens, 0);              /* its blocks below 176 are not b's */
    assert_int_equal(kvf_block_manager_free(bm, &r), KVF_OK);
    kvf_prefix_cache_destroy(pc);
    kvf_block_manager_destroy(bm);
}

/*
 * vLLM's sliding-window hit rule: a layout of one full group and one sliding group (window
 * 40, block 16). A prefix indexed with its sliding blocks before the window as -1 (given back)
 * is served at t = 160 (the sliding blocks [7, 10) a query at 160 attends are there), the
 * missing ones as -1, which share() fills with fresh blocks; a shorter prefix whose window
 * reaches a -1 block is a miss; -1 in the full group is refused; a layout without a full group
 * indexes nothing with a -1.
 */
static void test_sliding_hit_rule(void **state)
{
    static kvf_cache_layout_t lay;
    static kvf_key_buf_t k;
    const int windows[2] = {0, 40};
    kvf_prefix_cache_params_t pp = {.unit = 16, .block_size = 16, .n_attn_groups = 2,
                                    .windows = windows};
    kvf_block_manager_params_t bp = {
        .field_mask = KVF_BLOCK_MANAGER_PARAM_FIELD_NUM_BLOCKS |
                      KVF_BLOCK_MANAGER_PARAM_FIELD_BLOCK_SIZE |
                      KVF_BLOCK_MANAGER_PARAM_FIELD_LAYOUT,
        .num_blocks = 40, .block_size = 16, .layout = &lay,
    };
    kvf_block_manager_h bm = NULL;
    kvf_prefix_cache_h pc;
    kvf_req_blocks_t r = {0}, r2 = {0};
    kvf_prefix_hit_t hit;
    int32_t ids[2];
    (void)state;

    memset(&lay, 0, sizeof(lay));
    lay.slots = 1;
    lay.num_groups = 2;
    lay.groups[0] = (kvf_kv_group_t){.kind = KVF_GROUP_ATTENTION, .num_layers = 1};
    lay.groups[1] = (kvf_kv_group_t){.kind = KVF_GROUP_SLIDING, .num_layers = 1, .window = 40};
    lay.groups[1].layers[0] = 1;
    assert_int_equal(kvf_block_manager_create(&bp, &bm), KVF_OK);
    pp.bm = bm;
    assert_int_equal(kvf_prefix_cache_create(&pp, &pc), KVF_OK);
    kvf_mkkey(&k, NULL, 160, 16, 500);
    assert_int_equal(kvf_block_manager_allocate(bm, &r, 160), KVF_OK);   /* 10 + 10 blocks */
    for (int j = 0; j < 10; ++j) {
        ids[0] = r.blocks[0][j];
        ids[1] = (j < 6) ? -1 : r.blocks[1][j];   /* blocks 0-5 left the window */
        assert_int_equal(kvf_prefix_cache_add_block(pc, &k.key, j, ids), KVF_OK);
    }
    ids[0] = -1;
    assert_int_equal(kvf_prefix_cache_add_block(pc, &k.key, 3, ids), KVF_ERR_INVALID_PARAM);

    kvf_prefix_cache_lookup(pc, &k.key, 160, &hit);
    assert_int_equal(hit.tokens, 160);
    assert_int_equal(hit.n_blocks, 10);
    for (int j = 0; j < 10; ++j) {
        assert_int_equal(hit.ids[j * 2], r.blocks[0][j]);
        assert_int_equal(hit.ids[j * 2 + 1], (j < 6) ? -1 : r.blocks[1][j]);
    }
    assert_int_equal(kvf_block_manager_share(bm, &r2, hit.ids, hit.n_blocks), KVF_OK);
    assert_int_equal(kvf_block_manager_num_free(bm), 40 - 20 - 6);   /* 6 fresh blocks */
    for (int j = 0; j < 10; ++j) {
        assert_int_equal(r2.blocks[0][j], r.blocks[0][j]);
        if (j < 6) {
            for (int i = 0; i < 10; ++i) {
                assert_int_not_equal(r2.blocks[1][j], r.blocks[1][i]);
            }
        } else {
            assert_int_equal(r2.blocks[1][j], r.blocks[1][j]);
        }
    }
    assert_int_equal(kvf_block_manager_free(bm, &r2), KVF_OK);
    /* t = 144 needs sliding blocks [6, 9): there; 128 needs [5, 8): block 5 is gone, and so
     * is every shorter prefix's window */
    kvf_prefix_cache_lookup(pc, &k.key, 150, &hit);
    assert_int_equal(hit.tokens, 144);
    kvf_prefix_cache_lookup(pc, &k.key, 140, &hit);
    assert_int_equal(hit.tokens, 0);
    ids[0] = r.blocks[0][0];
    ids[1] = -1;
    {   /* -1 only in a sliding group: the full group's -1 in share is refused */
        kvf_req_blocks_t r3 = {0};
        assert_int_equal(kvf_block_manager_share(bm, &r3, (int32_t[]){-1, ids[0]}, 1),
                         KVF_ERR_INVALID_PARAM);
    }
    assert_int_equal(kvf_block_manager_free(bm, &r), KVF_OK);
    kvf_prefix_cache_destroy(pc);

    /* every group slides: an entry must hold a block of each, so a -1 indexes nothing */
    const int only[1] = {40};
    lay.num_groups = 1;
    lay.groups[0] = lay.groups[1];
    pp.n_attn_groups = 1;
    pp.windows = only;
    kvf_block_manager_destroy(bm);
    assert_int_equal(kvf_block_manager_create(&bp, &bm), KVF_OK);
    pp.bm = bm;
    assert_int_equal(kvf_prefix_cache_create(&pp, &pc), KVF_OK);
    ids[0] = -1;
    assert_int_equal(kvf_prefix_cache_add_block(pc, &k.key, 0, ids), KVF_OK);
    {
        kvf_prefix_cache_stats_t st;
        kvf_prefix_cache_get_stats(pc, &st);
        assert_int_equal(st.cached_blocks, 0);
    }
    kvf_prefix_cache_destroy(pc);
    kvf_block_manager_destroy(bm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_refcount_lru),
        cmocka_unit_test(test_state_slots_lru),
        cmocka_unit_test(test_sources_blocks_only),
        cmocka_unit_test(test_sliding_hit_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
