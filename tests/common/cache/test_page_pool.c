/* Page pool memory/zeroing and block manager bookkeeping: allocation per
 * group, growth, rollback on exhaustion, LIFO reuse across groups, fresh
 * block recording, idempotent free and double-free detection. */
#include "kvf_conv1d.h"
#include "kvf_mamba2.h"
#include "kvf_pool_test.h"

#include <math.h>

#include <stdlib.h>

static void test_geometry_assumptions(void **state)
{
    kvf_pool_test_env_t e;
    (void)state;

    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 0);
    assert_int_equal(e.layout.slots, 2);
    assert_int_equal(e.layout.num_groups, 3);
    assert_int_equal(e.layout.groups[0].kind, KVF_GROUP_ATTENTION);
    assert_int_equal(e.layout.groups[1].kind, KVF_GROUP_MAMBA);
    assert_int_equal(e.geom.block_size, 80);
    assert_int_equal(e.geom.page_size, 80 * (2 * 2 * 32 * 2));   /* 20480 */
}

static void test_pool_memory_and_zeroing(void **state)
{
    kvf_pool_test_env_t e;
    kvf_page_pool_params_t pp;
    kvf_page_pool_h pool;
    const int32_t ids[] = {1, 3};
    (void)state;

    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 16);
    kvf_page_pool_params_init(&e.geom, &e.layout, 5, &pp);
    pp.field_mask |= KVF_BIT(40);
    assert_int_equal(kvf_page_pool_create(&pp, &pool), KVF_ERR_INVALID_PARAM);
    pp.field_mask &= ~KVF_BIT(40);
    pp.field_mask &= ~(uint64_t)KVF_PAGE_POOL_PARAM_FIELD_SLOTS;
    assert_int_equal(kvf_page_pool_create(&pp, &pool), KVF_ERR_INVALID_PARAM);

    pool = kvf_pool_test_pool(&e, 5, false);
    size_t ps = e.geom.page_size;
    assert_true(kvf_page_pool_zeroing_enabled(pool));
    assert_int_equal(kvf_page_pool_bytes(pool), 5 * 2 * ps);
    assert_int_equal(kvf_page_pool_num_blocks(pool), 5);
    assert_int_equal(kvf_page_pool_slots(pool), 2);
    assert_int_equal(kvf_page_pool_device(pool)->kind, KVF_DEVICE_CPU);
    char *base = kvf_page_pool_base(pool);
    assert_ptr_equal(kvf_page_pool_page(pool, 3, 1), base + (3 * 2 + 1) * ps);
    assert_int_equal(kvf_page_pool_page_offset(pool, 4, 0), 8 * ps);
    assert_null(kvf_page_pool_page(pool, 5, 0));
    assert_null(kvf_page_pool_page(pool, 0, 2));

    memset(base, 0xaa, kvf_page_pool_bytes(pool));
    const int32_t bad[] = {1, 5};
    assert_int_equal(kvf_page_pool_zero_blocks(pool, bad, 2), KVF_ERR_OUT_OF_RANGE);
    assert_int_equal((unsigned char)base[2 * ps], 0xaa);   /* nothing zeroed */
    assert_int_equal(kvf_page_pool_zero_blocks(pool, ids, 2), KVF_OK);
    for (int b = 0; b < 5; ++b) {
        for (size_t i = 0; i < 2 * ps; ++i) {
            unsigned char want = (b == 1 || b == 3) ? 0 : 0xaa;
            if ((unsigned char)base[b * 2 * ps + i] != want) {
                fail_msg("block %d byte %zu", b, i);
            }
        }
    }
    kvf_page_pool_destroy(pool);

    /* test-only switch: the params flag; the environment is not read here (the
     * daemons parse KVF_TEST_NO_BLOCK_ZERO through their config table) */
    pool = kvf_pool_test_pool(&e, 2, true);
    assert_false(kvf_page_pool_zeroing_enabled(pool));
    base = kvf_page_pool_base(pool);
    memset(base, 0xaa, kvf_page_pool_bytes(pool));
    assert_int_equal(kvf_page_pool_zero_blocks(pool, ids, 1), KVF_OK);
    assert_int_equal((unsigned char)base[2 * ps], 0xaa);
    kvf_page_pool_destroy(pool);
    setenv("KVF_TEST_NO_BLOCK_ZERO", "1", 1);
    pool = kvf_pool_test_pool(&e, 2, false);
    assert_true(kvf_page_pool_zeroing_enabled(pool));
    kvf_page_pool_destroy(pool);
    unsetenv("KVF_TEST_NO_BLOCK_ZERO");
    assert_int_equal(kvf_page_pool_blocks_for_bytes(10 * 2 * ps + 5, 2, ps), 10);
    assert_int_equal(kvf_page_pool_blocks_for_bytes(100, 0, ps), 0);
}

static void test_allocate_grow_free(void **state)
{
    kvf_pool_test_env_t e;
    kvf_block_manager_h bm;
    kvf_req_blocks_t a = {0}, b = {0};
    (void)state;

    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 0);
    bm = kvf_pool_test_bm(&e, 8);
    assert_int_equal(kvf_block_manager_num_free(bm), 8);
    assert_int_equal(kvf_block_manager_blocks_needed(bm, &a, 100), 2 + 2);

    /* 100 tokens of block 80: 2 attention blocks + one per Mamba group */
    assert_int_equal(kvf_block_manager_allocate(bm, &a, 100), KVF_OK);
    assert_int_equal(a.num_groups, 3);
    assert_int_equal(a.num_blocks[0], 2);
    assert_int_equal(a.num_blocks[1], 1);
    assert_int_equal(a.num_blocks[2], 1);
    assert_int_equal(a.num_tokens, 100);
    assert_int_equal(kvf_block_manager_num_free(bm), 4);
    assert_int_equal(kvf_block_manager_num_free_pages(bm), 4 * 2);
    assert_int_equal(kvf_block_manager_num_fresh(bm), 2);   /* attention only */
    assert_int_equal(a.blocks[0][0], 0);                     /* fresh manager hands out 0, 1, ... */
    assert_int_equal(a.blocks[0][1], 1);

    /* decode growth: 160 fits in 2 blocks, 161 takes a third */
    for (int t = 101; t <= 160; ++t) {
        assert_int_equal(kvf_block_manager_append_token(bm, &a), KVF_OK);
    }
    assert_int_equal(a.num_blocks[0], 2);
    assert_int_equal(kvf_block_manager_append_token(bm, &a), KVF_OK);
    assert_int_equal(a.num_tokens, 161);
    assert_int_equal(a.num_blocks[0], 3);
    assert_int_equal(a.num_blocks[1], 1);                   /* Mamba never grows */
    assert_int_equal(kvf_block_manager_num_free(bm), 3);
    assert_int_equal(kvf_block_manager_allocate(bm, &a, 50), KVF_OK);   /* never shrinks */
    assert_int_equal(a.num_blocks[0], 3);

    /* exhaustion rolls back: b needs 2 + 2 = 4 > 3 free */
    assert_false(kvf_block_manager_can_allocate(bm, &b, 100));
    assert_int_equal(kvf_block_manager_allocate(bm, &b, 100), KVF_ERR_NO_RESOURCE);
    assert_int_equal(b.num_groups, 0);
    assert_null(b.blocks[0]);
    assert_int_equal(kvf_block_manager_num_free(bm), 3);
    /* growing a by 4 blocks (to 561 tokens) with 3 free fails, a unchanged */
    int32_t before[3] = {a.blocks[0][0], a.blocks[0][1], a.blocks[0][2]};
    assert_int_equal(kvf_block_manager_allocate(bm, &a, 561), KVF_ERR_NO_RESOURCE);
    assert_int_equal(a.num_blocks[0], 3);
    assert_int_equal(a.num_tokens, 161);
    assert_memory_equal(a.blocks[0], before, sizeof(before));
    assert_int_equal(kvf_block_manager_num_free(bm), 3);
    assert_int_equal(kvf_block_manager_allocate(bm, &a, 400), KVF_OK);   /* 5 blocks: +2 */
    assert_int_equal(kvf_block_manager_num_free(bm), 1);

    /* free: all back, request reset, idempotent */
    assert_int_equal(kvf_block_manager_free(bm, &a), KVF_OK);
    assert_int_equal(kvf_block_manager_num_free(bm), 8);
    assert_int_equal(kvf_block_manager_num_fresh(bm), 0);   /* never-zeroed fresh blocks dropped */
    assert_int_equal(a.num_groups, 0);
    assert_int_equal(kvf_block_manager_free(bm, &a), KVF_OK);
    assert_int_equal(kvf_block_manager_num_free(bm), 8);
    assert_int_equal(kvf_block_manager_free(bm, &b), KVF_OK);
    kvf_block_manager_destroy(bm);
}

/* LIFO across groups: a request's Mamba block is the next attention block */
static void test_lifo_reuse_and_fresh(void **state)
{
    kvf_pool_test_env_t e;
    kvf_block_manager_h bm;
    kvf_page_pool_h pool;
    kvf_req_blocks_t a = {0}, b = {0};
    int32_t ids[8];
    (void)state;

    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 0);
    bm = kvf_pool_test_bm(&e, 8);
    pool = kvf_pool_test_pool(&e, 8, false);
    assert_int_equal(kvf_block_manager_allocate(bm, &a, 10), KVF_OK);   /* attn 1, mamba 2 */
    int32_t mamba_last = a.blocks[2][0], mamba_first = a.blocks[1][0];
    assert_int_equal(kvf_block_manager_take_fresh(bm, ids, 8), 1);
    assert_int_equal(ids[0], a.blocks[0][0]);
    assert_int_equal(kvf_block_manager_num_fresh(bm), 0);
    assert_int_equal(kvf_block_manager_free(bm, &a), KVF_OK);

    assert_int_equal(kvf_block_manager_allocate(bm, &b, 100), KVF_OK);
    assert_int_equal(b.blocks[0][0], mamba_last);    /* last freed, first reused */
    assert_int_equal(b.blocks[0][1], mamba_first);
    assert_int_equal(kvf_block_manager_num_fresh(bm), 2);

    /* zero_fresh clears every page of exactly the fresh attention blocks */
    memset(kvf_page_pool_base(pool), 0x5c, kvf_page_pool_bytes(pool));
    assert_int_equal(kvf_block_manager_zero_fresh(bm, &pool, 1), KVF_OK);
    assert_int_equal(kvf_block_manager_num_fresh(bm), 0);
    for (int blk = 0; blk < 8; ++blk) {
        bool fresh = (blk == b.blocks[0][0]) || (blk == b.blocks[0][1]);
        for (int s = 0; s < 2; ++s) {
            const unsigned char *pg = kvf_page_pool_page(pool, blk, s);
            for (size_t i = 0; i < e.geom.page_size; i += 97) {
                assert_int_equal(pg[i], fresh ? 0 : 0x5c);
            }
        }
    }
    assert_int_equal(kvf_block_manager_free(bm, &b), KVF_OK);

    /* low level blocks, double free and bad ids */
    assert_int_equal(kvf_block_manager_alloc_blocks(bm, KVF_GROUP_MAMBA, 3, ids), KVF_OK);
    assert_int_equal(kvf_block_manager_num_fresh(bm), 0);
    assert_int_equal(kvf_block_manager_alloc_blocks(bm, KVF_GROUP_ATTENTION, 6, ids + 3),
                     KVF_ERR_NO_RESOURCE);
    assert_int_equal(kvf_block_manager_num_free(bm), 5);
    assert_int_equal(kvf_block_manager_free_blocks(bm, ids, 3), KVF_OK);
    assert_int_equal(kvf_block_manager_free_blocks(bm, ids, 1), KVF_ERR_INVALID_PARAM);
    const int32_t oob = 8;
    assert_int_equal(kvf_block_manager_free_blocks(bm, &oob, 1), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_block_manager_num_free(bm), 8);

    /* a request table with a block freed behind its back: free reports it */
    assert_int_equal(kvf_block_manager_allocate(bm, &a, 1), KVF_OK);
    assert_int_equal(kvf_block_manager_free_blocks(bm, &a.blocks[1][0], 1), KVF_OK);
    assert_int_equal(kvf_block_manager_free(bm, &a), KVF_ERR_INVALID_PARAM);
    assert_int_equal(a.num_groups, 0);
    assert_int_equal(kvf_block_manager_num_free(bm), 8);
    kvf_page_pool_destroy(pool);
    kvf_block_manager_destroy(bm);
}

static void test_manager_params(void **state)
{
    kvf_pool_test_env_t e;
    kvf_block_manager_params_t bp = {0};
    kvf_block_manager_h bm;
    (void)state;

    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 0);
    bp.field_mask = KVF_BLOCK_MANAGER_PARAM_FIELD_NUM_BLOCKS;
    bp.num_blocks = 4;
    assert_int_equal(kvf_block_manager_create(&bp, &bm), KVF_ERR_INVALID_PARAM);
    bp.field_mask = KVF_BLOCK_MANAGER_PARAM_FIELDS_KNOWN | KVF_BIT(20);
    bp.block_size = 80;
    bp.layout = &e.layout;
    assert_int_equal(kvf_block_manager_create(&bp, &bm), KVF_ERR_INVALID_PARAM);
    bp.field_mask = KVF_BLOCK_MANAGER_PARAM_FIELDS_KNOWN;
    bp.block_size = 0;
    assert_int_equal(kvf_block_manager_create(&bp, &bm), KVF_ERR_INVALID_PARAM);
    bp.block_size = 80;
    assert_int_equal(kvf_block_manager_create(&bp, &bm), KVF_OK);
    assert_int_equal(kvf_block_manager_block_size(bm), 80);
    assert_int_equal(kvf_block_manager_num_blocks(bm), 4);
    kvf_block_manager_destroy(bm);
    kvf_block_manager_destroy(NULL);
    kvf_page_pool_destroy(NULL);
}

/* Mamba kernels write through the pool's state views exactly where
 * common/geometry/kvf_geometry.h's offsets say, and never into the page padding. */
static void test_mamba_state_views(void **state)
{
    kvf_pool_test_env_t e;
    kvf_page_pool_h pool;
    (void)state;

    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 0);
    pool = kvf_pool_test_pool(&e, 3, false);
    const kvf_shard_t *sh = &e.geom.shard;
    const int cd = sh->conv_dim, K = e.cfg.conv_kernel, T = 5;
    const int H = sh->mamba_heads, P = e.cfg.mamba_head_dim, N = e.cfg.ssm_state_size;
    float *x = calloc((size_t)T * cd, sizeof(float)), *y = calloc((size_t)T * cd, sizeof(float));
    float *w = calloc((size_t)cd * K, sizeof(float)), *ym = calloc((size_t)T * H * P, sizeof(float));
    float dtb[64] = {0}, alog[64] = {0}, dt[5 * 64] = {0};
    char *page = kvf_page_pool_page(pool, 2, 1);

    assert_non_null(x);
    memset(page, 0x7f, e.geom.page_size);
    for (int i = 0; i < T * cd; ++i) {
        x[i] = (float)(i % 13) * 0.1f;
    }
    for (int i = 0; i < cd * K; ++i) {
        w[i] = 0.25f;
    }
    assert_ptr_equal(kvf_page_pool_conv_state(pool, 2, 1), page);
    assert_ptr_equal(kvf_page_pool_ssm_state(pool, &e.geom, 2, 1), page + e.geom.conv_bytes);
    assert_int_equal(kvf_conv1d_chunk(NULL, x, cd, T, cd, K, w, NULL, 1,
                                      kvf_page_pool_conv_state(pool, 2, 1), e.geom.conv_dtype, 0,
                                      y, cd),
                     KVF_KERN_OK);
    /* conv state tap j of channel c = input of token T - (K-1) + j */
    for (int c = 0; c < cd; c += 17) {
        for (int j = 0; j < K - 1; ++j) {
            float v;
            memcpy(&v, page + kvf_conv_offset(&e.geom, &e.cfg, c, j), sizeof(v));
            assert_true(v == x[(T - (K - 1) + j) * cd + c]);
        }
    }
    kvf_mamba2_params_t mp = {H, P, sh->groups, N, dtb, alog, NULL, 0.0f, INFINITY};
    assert_int_equal(kvf_mamba2_scan(NULL, &mp, T, y, cd, dt, H, y + H * P,
                                     y + H * P + sh->groups * N, cd,
                                     kvf_page_pool_ssm_state(pool, &e.geom, 2, 1),
                                     e.geom.ssm_dtype, 0, ym, H * P),
                     KVF_KERN_OK);
    /* every state byte written (no 0x7f7f7f7f left), padding untouched */
    for (size_t off = 0; off < e.geom.mamba_bytes; off += 4) {
        uint32_t u;
        memcpy(&u, page + off, 4);
        assert_true(u != 0x7f7f7f7fu);
    }
    for (size_t off = e.geom.mamba_bytes; off < e.geom.page_size; ++off) {
        assert_int_equal((unsigned char)page[off], 0x7f);
    }
    {
        float v;
        memcpy(&v, page + kvf_ssm_offset(&e.geom, &e.cfg, H - 1, P - 1, N - 1), sizeof(v));
        assert_false(isnan(v));
    }
    free(x);
    free(y);
    free(w);
    free(ym);
    kvf_page_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry_assumptions),
        cmocka_unit_test(test_pool_memory_and_zeroing),
        cmocka_unit_test(test_allocate_grow_free),
        cmocka_unit_test(test_lifo_reuse_and_fresh),
        cmocka_unit_test(test_manager_params),
        cmocka_unit_test(test_mamba_state_views),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
