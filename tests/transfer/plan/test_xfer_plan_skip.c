/*
 * The planning of a partial pull (kvf_xfer_plan_params_t.skip_tokens, docs/PREFIX_CACHE.md
 * §6): decode's prefix cache holds the request's first blocks, so the plan reads only the
 * tokens after them (and the Mamba state), never writes or zeroes a held block, and any
 * prefill block size works because the runs are cut per token. Checked byte for byte by
 * xfer_plan_harness.c (held blocks stay poisoned, every other byte as a full pull leaves it)
 * on the tiny hybrid and a dense model, layouts 1p1d..4p4d, equal / decode larger / prefill
 * larger / not dividing block sizes, every hit from one block to the whole prompt; and a hit
 * that is no decode block boundary, or past the prompt, is refused naming both values.
 */
#include "xfer_plan_harness.h"

#include "kvf_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

static const int layouts[][2] = {{1, 1}, {4, 2}, {1, 4}, {2, 4}, {2, 1}, {4, 4}};

/* Every hit (a multiple of the decode block, up to N) of prompts ending mid-block and on a
 * boundary, for each layout and block config given. */
static void run(const char *json, const xp_block_cfg_t *cfgs, int n, const char *what)
{
    xp_totals_t t = {0};
    unsigned long hits = 0, whole = 0;

    for (int ci = 0; ci < n; ++ci) {
        for (size_t li = 0; li < sizeof(layouts) / sizeof(layouts[0]); ++li) {
            xp_case_t c = {.model_json = json, .P = layouts[li][0], .D = layouts[li][1],
                           .kv_dtype = (li % 2) ? KVF_DTYPE_FP32 : KVF_DTYPE_BF16,
                           .p_block = cfgs[ci].p_block, .p_kernel = cfgs[ci].p_kernel,
                           .d_block = cfgs[ci].d_block, .d_kernel = cfgs[ci].d_kernel};
            int bp, bd;
            xp_case_block_sizes(&c, &bp, &bd);
            const int64_t lens[2] = {3 * (int64_t)bd + bp / 2 + 1, 3 * (int64_t)bd};
            for (int k = 0; k < 2; ++k) {
                for (int64_t skip = bd; skip <= lens[k]; skip += bd) {
                    c.num_tokens = lens[k];
                    c.skip_tokens = skip;
                    c.seed = (uint64_t)(ci * 100 + (int)li * 10 + k) + (uint64_t)skip;
                    c.id_mode = (skip / bd % 2) ? XP_IDS_SHUFFLED : XP_IDS_CONSECUTIVE;
                    c.extra_local = (int)(skip / bd % 3);
                    c.no_coalesce = (skip / bd % 5) == 4;
                    xp_run_case(&c, &t);
                    ++hits;
                    whole += (skip == lens[k]);
                }
            }
        }
    }
    print_message("%s: %lu partial pulls (%lu whole-prompt hits), %lu rank plans, %lu"
                  " descriptors, %llu bytes, %llu elements checked\n", what, hits, whole,
                  t.rank_plans, t.descs, t.bytes, t.elements);
    assert_true((hits > 0) && (whole > 0));
}

static void test_skip_hybrid(void **state)
{
    static const xp_block_cfg_t cfgs[] = {
        {0, 0, 0, 0},        /* derived (the daemons' sizes) */
        {80, 16, 160, 32},   /* decode larger */
        {160, 32, 80, 16},   /* prefill larger */
        {96, 32, 80, 80},    /* not dividing */
    };
    (void)state;
    run(xp_tiny_hybrid_json, cfgs, 4, "hybrid");
}

static void test_skip_dense(void **state)
{
    static const xp_block_cfg_t cfgs[] = {
        {16, 16, 16, 16},    /* equal: whole-block pieces */
        {16, 16, 48, 16},    /* decode 3x (kvf-decode --block-size 48 beside 16) */
        {48, 16, 16, 16},    /* prefill 3x */
        {80, 16, 96, 32},    /* not dividing, both ppl > 1 */
    };
    (void)state;
    run(xp_dense_kv4_json, cfgs, 4, "dense kv4");
    run(xp_dense_kv2_json, cfgs + 1, 1, "dense kv2 (replicated heads)");
}

/* A hit the decode blocks cannot express, or past the prompt, is refused by name. */
static void test_skip_refused(void **state)
{
    static const int64_t bad[] = {8, 17, -16, 64};   /* block 16, prompt 40 tokens */
    kvf_model_config_t cfg;
    kvf_cache_layout_t layout;
    kvf_cache_params_t cp;
    kvf_rank_geometry_t g;
    int32_t lids[3] = {0, 1, 2}, rids[3] = {3, 4, 5};
    int64_t nb = 8;
    kvf_xfer_group_blocks_t gb = {.local_ids = lids, .num_local = 3, .remote_ids = rids,
                                  .num_remote = 3};
    kvf_xfer_group_blocks_t groups[KVF_MAX_KV_GROUPS];
    kvf_xfer_plan_t *plan = NULL;

    (void)state;
    assert_int_equal(kvf_model_config_parse(xp_dense_kv4_json, "test", &cfg), KVF_OK);
    assert_int_equal(kvf_cache_layout_build(&cfg, &layout), KVF_OK);
    kvf_cache_params_default(&cfg, &cp);
    cp.block_size = 16;
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &cp, 1, 0, &g), KVF_OK);
    assert_int_equal(g.block_size, 16);
    for (int i = 0; i < layout.num_groups; ++i) {
        groups[i] = gb;
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]) + 1; ++i) {
        kvf_xfer_plan_params_t p = {
            .field_mask = KVF_XFER_PLAN_PARAM_FIELD_SKIP, .cfg = &cfg, .layout = &layout,
            .local_tp = 1, .local_rank = 0, .local_geom = &g, .local_num_blocks = nb,
            .remote_tp = 1, .remote_geoms = &g, .remote_num_blocks = &nb,
            .num_groups = layout.num_groups, .groups = groups, .num_tokens = 40,
            .skip_tokens = (i < sizeof(bad) / sizeof(bad[0])) ? bad[i] : 32,
        };
        kvf_status_t want = (i < sizeof(bad) / sizeof(bad[0])) ? KVF_ERR_INVALID_PARAM : KVF_OK;
        assert_int_equal(kvf_xfer_plan_create(&p, &plan), want);
        if (want == KVF_OK) {   /* 32 of 40: the 8 tokens of the third block, its tail zeroed */
            assert_non_null(plan);
            assert_int_equal(plan->attn_bytes, 8 * layout.groups[0].num_layers *
                                               g.attn_bytes_per_token);
            kvf_xfer_plan_destroy(plan);
            plan = NULL;
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skip_hybrid),
        cmocka_unit_test(test_skip_dense),
        cmocka_unit_test(test_skip_refused),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
