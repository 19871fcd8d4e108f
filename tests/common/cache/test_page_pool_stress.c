/*
 * Block manager stress: many concurrent requests with random prefill sizes,
 * decode growth, finishes and aborts, plus raw block users. After every
 * operation the books must balance (free + held == total, no block held
 * twice); every scheduler step zeroes fresh blocks on two rank pools and the
 * test checks those blocks' pages read zero; at the end every block is free
 * again and double frees are refused. Run under ASan for leaks.
 */
#include "kvf_pool_test.h"

#include <stdlib.h>

enum { NBLOCKS = 96, NREQ = 40, STEPS = 20000 };

typedef struct {
    kvf_req_blocks_t blocks;
    bool             live;
} req_t;

static uint32_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static void check_books(kvf_block_manager_h bm, const req_t *reqs, const int32_t *raw, int nraw)
{
    static uint8_t seen[NBLOCKS];
    int held = 0;

    memset(seen, 0, sizeof(seen));
    for (int r = 0; r < NREQ; ++r) {
        const kvf_req_blocks_t *b = &reqs[r].blocks;
        if (!reqs[r].live) {
            assert_int_equal(b->num_groups, 0);
            continue;
        }
        for (int g = 0; g < b->num_groups; ++g) {
            for (int i = 0; i < b->num_blocks[g]; ++i) {
                int32_t id = b->blocks[g][i];
                assert_true(id >= 0 && id < NBLOCKS);
                assert_int_equal(seen[id], 0);   /* never handed out twice */
                seen[id] = 1;
                ++held;
            }
        }
    }
    for (int i = 0; i < nraw; ++i) {
        assert_int_equal(seen[raw[i]], 0);
        seen[raw[i]] = 1;
        ++held;
    }
    assert_int_equal(held + kvf_block_manager_num_free(bm), NBLOCKS);
}

static void test_stress(void **state)
{
    kvf_pool_test_env_t e;
    kvf_block_manager_h bm;
    kvf_page_pool_h pools[2];
    req_t *reqs = calloc(NREQ, sizeof(*reqs));
    int32_t raw[NBLOCKS], fresh[NBLOCKS];
    int nraw = 0, ok = 0, refused = 0;
    uint64_t seed = 0x1234;
    (void)state;

    assert_non_null(reqs);
    kvf_pool_test_env(&e, KVF_DTYPE_BF16, 16);
    bm = kvf_pool_test_bm(&e, NBLOCKS);
    pools[0] = kvf_pool_test_pool(&e, NBLOCKS, false);
    pools[1] = kvf_pool_test_pool(&e, NBLOCKS, false);
    const int slots = e.layout.slots;

    for (int step = 0; step < STEPS; ++step) {
        int r = (int)(rnd(&seed) % NREQ);
        uint32_t op = rnd(&seed) % 100;
        kvf_status_t st;

        if (!reqs[r].live && op < 60) {                     /* admit: prefill allocation */
            int n = 1 + (int)(rnd(&seed) % 400);
            bool can = kvf_block_manager_can_allocate(bm, &reqs[r].blocks, n);
            int before = kvf_block_manager_num_free(bm);
            st = kvf_block_manager_allocate(bm, &reqs[r].blocks, n);
            if (st == KVF_OK) {
                assert_true(can);
                reqs[r].live = true;
                ++ok;
            } else {
                assert_int_equal(st, KVF_ERR_NO_RESOURCE);
                assert_false(can);
                assert_int_equal(kvf_block_manager_num_free(bm), before);   /* rolled back */
                assert_int_equal(reqs[r].blocks.num_groups, 0);
                ++refused;
            }
        } else if (reqs[r].live && op < 70) {               /* decode a few tokens */
            int k = 1 + (int)(rnd(&seed) % 90);
            for (int i = 0; i < k; ++i) {
                int tokens = reqs[r].blocks.num_tokens;
                st = kvf_block_manager_append_token(bm, &reqs[r].blocks);
                if (st != KVF_OK) {
                    assert_int_equal(st, KVF_ERR_NO_RESOURCE);
                    assert_int_equal(reqs[r].blocks.num_tokens, tokens);
                    break;
                }
            }
        } else if (reqs[r].live) {                          /* finish or abort */
            assert_int_equal(kvf_block_manager_free(bm, &reqs[r].blocks), KVF_OK);
            reqs[r].live = false;
            if (op % 2) {   /* an abort path freeing twice must be harmless */
                assert_int_equal(kvf_block_manager_free(bm, &reqs[r].blocks), KVF_OK);
            }
        } else if (op < 80 && nraw < 8) {                   /* raw (transfer staging) */
            if (kvf_block_manager_alloc_blocks(bm, KVF_GROUP_MAMBA, 1, &raw[nraw]) == KVF_OK) {
                ++nraw;
            }
        } else if (nraw > 0) {
            assert_int_equal(kvf_block_manager_free_blocks(bm, &raw[--nraw], 1), KVF_OK);
            assert_int_equal(kvf_block_manager_free_blocks(bm, &raw[nraw], 1),
                             KVF_ERR_INVALID_PARAM);   /* double free refused */
        }

        if ((step % 7) == 0) {
            /* scheduler step boundary: zero fresh blocks on both rank pools */
            int nf = kvf_block_manager_num_fresh(bm);
            int got = 0;   /* blocks whose pages are checked below (take_fresh path) */
            if (step % 14 == 0) {
                got = kvf_block_manager_take_fresh(bm, fresh, NBLOCKS);
                assert_int_equal(got, nf);
                for (int p = 0; p < 2; ++p) {
                    assert_int_equal(kvf_page_pool_zero_blocks(pools[p], fresh, got), KVF_OK);
                }
            } else {
                assert_int_equal(kvf_block_manager_zero_fresh(bm, pools, 2), KVF_OK);
            }
            assert_int_equal(kvf_block_manager_num_fresh(bm), 0);
            for (int i = 0; i < got; ++i) {
                for (int p = 0; p < 2; ++p) {
                    for (int s = 0; s < slots; ++s) {
                        const unsigned char *pg = kvf_page_pool_page(pools[p], fresh[i], s);
                        assert_int_equal(pg[0], 0);
                        assert_int_equal(pg[e.geom.page_size - 1], 0);
                    }
                }
            }
            /* "use" every held attention page: write garbage, as kernels would */
            for (int q = 0; q < NREQ; ++q) {
                if (reqs[q].live) {
                    int32_t id = reqs[q].blocks.blocks[0][0];
                    for (int p = 0; p < 2; ++p) {
                        memset(kvf_page_pool_page(pools[p], id, 0), 0xee, 64);
                    }
                }
            }
        }
        check_books(bm, reqs, raw, nraw);
    }

    for (int r = 0; r < NREQ; ++r) {
        assert_int_equal(kvf_block_manager_free(bm, &reqs[r].blocks), KVF_OK);
        reqs[r].live = false;
    }
    assert_int_equal(kvf_block_manager_free_blocks(bm, raw, nraw), KVF_OK);
    assert_int_equal(kvf_block_manager_num_free(bm), NBLOCKS);
    assert_int_equal(kvf_block_manager_num_fresh(bm), 0);
    print_message("stress: %d admitted, %d refused for lack of blocks\n", ok, refused);
    assert_true(ok > 100);
    assert_true(refused > 0);   /* the pool really ran dry */
    kvf_page_pool_destroy(pools[1]);
    kvf_page_pool_destroy(pools[0]);
    kvf_block_manager_destroy(bm);
    free(reqs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
