/* The prefix cache's event hook (kvf_prefix_cache_set_event_fn), what the daemons
 * publish as vLLM's KV events: a block indexed is STORED once with its key (the chain's
 * hash at the block's end), its parent's key (none for the first) and its tokens; a
 * prefix indexed twice is not stored again; a block the pool reuses is REMOVED under
 * the same key; destroying the index is CLEARED. (tiny-hybrid layout: block 80, unit 16) */
#include "kvf_pool_test.h"
#include "kvf_prefix_cache.h"

#include <stdlib.h>

typedef struct {
    kvf_prefix_event_kind_t kind[16];
    kvf_block_hash_t        hash[16], parent[16];
    bool                    has_parent[16];
    int32_t                 tok0[16];
    int                     n;
} kvf_ev_log_t;

static void kvf_ev_record(void *ctx, const kvf_prefix_event_t *ev)
{
    kvf_ev_log_t *l = ctx;

    assert_true(l->n < 16);
    l->kind[l->n] = ev->kind;
    l->hash[l->n] = ev->hash;
    l->parent[l->n] = ev->parent;
    l->has_parent[l->n] = ev->has_parent;
    l->tok0[l->n] = (ev->kind == KVF_PREFIX_EV_STORED) ? ev->tokens[0] : -1;
    if (ev->kind == KVF_PREFIX_EV_STORED) {
        assert_int_equal(ev->block_size, 80);
        assert_int_equal(ev->tokens[79], ev->tokens[0] + 79);
    }
    l->n++;
}

static bool kvf_same(kvf_block_hash_t a, kvf_block_hash_t b)
{
    return (a.lo == b.lo) && (a.hi == b.hi);
}

static void test_events(void **state)
{
    kvf_pool_test_env_t e;
    kvf_block_manager_h bm;
    kvf_prefix_cache_h pc;
    kvf_prefix_cache_params_t pp = {.unit = 16, .block_size = 80, .n_attn_groups = 1,
                                    .state_grid = 16, .state_slots = 2};
    kvf_req_blocks_t r = {0};
    static int32_t toks[240];
    static kvf_block_hash_t uh[15];
    kvf_prefix_key_t key = {0};
    uint8_t digest[16] = {1};
    static kvf_ev_log_t log;
    (void)state;

    for (int i = 0; i < 240; ++i) {
        toks[i] = 1000 + i;
    }
    assert_int_equal(kvf_block_hash_root(digest, NULL, 0, &key.root), KVF_OK);
    kvf_block_hash_chain(key.root, toks, 16, 15, uh);
    key.tokens = toks;
    key.unit_hash = uh;
    key.n_units = 15;
    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 0);
    bm = kvf_pool_test_bm(&e, 8);
    pp.bm = bm;
    assert_int_equal(kvf_prefix_cache_create(&pp, &pc), KVF_OK);
    kvf_prefix_cache_set_event_fn(pc, kvf_ev_record, &log);

    assert_int_equal(kvf_block_manager_allocate(bm, &r, 240), KVF_OK);
    for (int j = 0; j < 3; ++j) {
        assert_int_equal(kvf_prefix_cache_add_block(pc, &key, j, &r.blocks[0][j]), KVF_OK);
    }
    assert_int_equal(kvf_prefix_cache_add_block(pc, &key, 1, &r.blocks[0][1]), KVF_OK);
    assert_int_equal(log.n, 3);                  /* indexed twice: stored once */
    for (int j = 0; j < 3; ++j) {
        assert_int_equal(log.kind[j], KVF_PREFIX_EV_STORED);
        assert_true(kvf_same(log.hash[j], uh[(j + 1) * 5 - 1]));   /* h_{(j+1)B/u} */
        assert_int_equal(log.has_parent[j], j > 0);
        if (j > 0) {
            assert_true(kvf_same(log.parent[j], log.hash[j - 1]));
        }
        assert_int_equal(log.tok0[j], 1000 + 80 * j);
    }
    /* freed: cached free blocks; a request taking the whole pool reuses them */
    assert_int_equal(kvf_block_manager_free(bm, &r), KVF_OK);
    assert_int_equal(kvf_block_manager_allocate(bm, &r, 6 * 80), KVF_OK);
    assert_int_equal(log.n, 6);
    for (int j = 3; j < 6; ++j) {
        bool known = false;
        assert_int_equal(log.kind[j], KVF_PREFIX_EV_REMOVED);
        for (int k = 0; k < 3; ++k) {
            known = known || kvf_same(log.hash[j], log.hash[k]);
        }
        assert_true(known);
    }
    assert_false(kvf_same(log.hash[3], log.hash[4]) || kvf_same(log.hash[4], log.hash[5]));
    assert_int_equal(kvf_block_manager_free(bm, &r), KVF_OK);
    kvf_prefix_cache_destroy(pc);
    assert_int_equal(log.n, 7);
    assert_int_equal(log.kind[6], KVF_PREFIX_EV_CLEARED);
    kvf_block_manager_destroy(bm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
