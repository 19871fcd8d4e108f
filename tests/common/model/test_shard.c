/* TP sharding math and prefill-rank selection for hetero-TP reads. */
#include "kvf_shard.h"
#include "kvf_tp_map.h"
#include "kvf_log.h"
#include "kvf_test_util.h"

static void test_tiny_tp4_replication(void **state)
{
    kvf_model_config_t cfg;
    kvf_shard_t s;
    (void)state;

    kvf_test_load_model("tiny-hybrid", &cfg);   /* 8 q heads, 2 kv, 8 mamba heads, 2 groups */
    for (int r = 0; r < 4; ++r) {
        assert_int_equal(kvf_shard_compute(&cfg, 4, r, &s), KVF_OK);
        assert_int_equal(s.attn_heads, 2);
        assert_int_equal(s.attn_head_start, 2 * r);
        assert_int_equal(s.kv_heads, 1);
        assert_int_equal(s.kv_head_start, r / 2);   /* ranks 0,1 share head 0 */
        assert_int_equal(s.kv_replication, 2);
        assert_int_equal(s.mamba_heads, 2);
        assert_int_equal(s.groups, 1);
        assert_int_equal(s.group_start, r / 2);
        assert_int_equal(s.conv_x_start, 2 * r * 32);
        assert_int_equal(s.conv_bc_channels, 16);
        assert_int_equal(s.conv_dim, 64 + 32);
        assert_int_equal(s.mlp_cols, 128);
        /* conv channel lookup: B channel 16*group_start is local channel 64 (after x) */
        assert_int_equal(kvf_shard_conv_channel(&cfg, &s, 1, 16 * (r / 2)), 64);
        assert_int_equal(kvf_shard_conv_channel(&cfg, &s, 2, 16 * (r / 2) + 3), 64 + 16 + 3);
        assert_int_equal(kvf_shard_conv_channel(&cfg, &s, 0, 64 * r + 5), 5);
        assert_int_equal(kvf_shard_conv_channel(&cfg, &s, 0, (64 * r + 64) % 256), -1);
    }
    assert_int_equal(kvf_shard_compute(&cfg, 2, 1, &s), KVF_OK);
    assert_int_equal(s.kv_head_start, 1);
    assert_int_equal(s.kv_replication, 1);
    assert_int_equal(s.group_start, 1);
}

static void test_refusals(void **state)
{
    kvf_model_config_t cfg;
    kvf_shard_t s;
    (void)state;

    kvf_test_load_model("nemotron-3-nano-30b-a3b", &cfg);
    assert_int_equal(kvf_shard_check(&cfg, 3), KVF_ERR_INVALID_PARAM);   /* 32 heads */
    assert_int_equal(kvf_shard_check(&cfg, 0), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_shard_compute(&cfg, 2, 2, &s), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_shard_check(&cfg, 16), KVF_OK);   /* groups 8 replicate */
    assert_false(kvf_shard_probe(&cfg, 6));
    assert_true(kvf_shard_probe(&cfg, 32));
}

static void test_source_ranks(void **state)
{
    kvf_model_config_t cfg;
    int ranks[16], n = 0;
    (void)state;

    kvf_test_load_model("tiny-hybrid", &cfg);
    assert_int_equal(kvf_tp_ratio(4, 2), -2);
    assert_int_equal(kvf_tp_ratio(1, 4), 4);
    assert_int_equal(kvf_tp_ratio(3, 2), 0);
    /* 4p2d: decode rank 1 holds kv head 1, mamba heads 4-7, group 1: prefill ranks 2,3 */
    assert_int_equal(kvf_tp_source_ranks(&cfg, 4, 2, 1, ranks, &n), KVF_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ranks[0], 2);
    assert_int_equal(ranks[1], 3);
    /* kv head 1 is held by prefill ranks 2 and 3; read once, from rank 2 */
    assert_int_equal(kvf_tp_kv_head_source(&cfg, 4, 2, 1, 1), 2);
    /* 1p4d: everything from prefill rank 0 */
    assert_int_equal(kvf_tp_source_ranks(&cfg, 1, 4, 3, ranks, &n), KVF_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ranks[0], 0);
    /* 2p4d: decode rank 3 -> prefill rank 1 */
    assert_int_equal(kvf_tp_source_ranks(&cfg, 2, 4, 3, ranks, &n), KVF_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ranks[0], 1);
    /* 4p4d with replication on both sides: decode rank 1 reads its own twin, rank 1 */
    assert_int_equal(kvf_tp_kv_head_source(&cfg, 4, 4, 1, 0), 1);
    assert_int_equal(kvf_tp_group_source(&cfg, 4, 4, 1, 0), 1);
    /* 4p1d: all four prefill ranks, kv heads from ranks 0 and 2 */
    assert_int_equal(kvf_tp_source_ranks(&cfg, 4, 1, 0, ranks, &n), KVF_OK);
    assert_int_equal(n, 4);
    assert_int_equal(kvf_tp_kv_head_source(&cfg, 4, 1, 0, 1), 2);
    assert_int_equal(kvf_tp_source_ranks(&cfg, 3, 2, 0, ranks, &n), KVF_ERR_INVALID_PARAM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_tp4_replication),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_source_ranks),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
