/*
 * Per-rank cache geometry and block-size alignment on real models' geometry.
 * Every expected number is computed here by hand from the config fields
 * (the arithmetic is spelled out), never copied from program output.
 */
#include "kvf_geometry.h"
#include "kvf_log.h"
#include "kvf_test_util.h"

#include <string.h>

/* Nemotron-3-Nano-30B-A3B, fp8 (1-byte) KV, bf16 conv, fp32 SSM, user block 32. */
static void nano30_params(const kvf_model_config_t *cfg, kvf_cache_params_t *p,
                          kvf_align_mode_t align)
{
    kvf_cache_params_default(cfg, p);
    p->kv_dtype = KVF_DTYPE_FP8;
    p->conv_dtype = KVF_DTYPE_BF16;
    p->ssm_dtype = KVF_DTYPE_FP32;
    p->user_block_size = 32;
    p->align = align;
}

static void test_nano30_sizes_per_rank(void **state)
{
    kvf_model_config_t cfg;
    kvf_cache_params_t p;
    kvf_rank_geometry_t g;
    (void)state;

    kvf_test_load_model("nemotron-3-nano-30b-a3b", &cfg);
    nano30_params(&cfg, &p, KVF_ALIGN_PER_RANK);
    /* heads 64 x dim 64, state 128, groups 8, conv kernel 4 */
    const size_t tp[3] = {1, 2, 4};
    for (int i = 0; i < 3; ++i) {
        size_t t = tp[i];
        size_t conv_dim = 64 * 64 / t + 2 * (8 / t) * 128;
        size_t conv = conv_dim * 3 * 2;                  /* bf16 */
        size_t ssm = (64 / t) * 64 * 128 * 4;            /* fp32 */
        size_t kv_heads = (t <= 2) ? 2 / t : 1;          /* 2 KV heads; TP4 replicates */
        size_t a1 = 2 * kv_heads * 128 * 1;              /* fp8 */
        assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, (int)t, 0, &g), KVF_OK);
        assert_int_equal(g.mamba_bytes, conv + ssm);
        assert_int_equal(g.attn_bytes_per_token, a1);
        assert_int_equal(g.page_size, (size_t)g.block_size * a1);
        assert_true(g.page_size >= g.mamba_bytes);
    }
    /* docs/ARCHITECTURE.md §1 and §6 worked numbers */
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 1, 0, &g), KVF_OK);
    assert_int_equal(g.mamba_bytes, 2134016);
    assert_int_equal(g.attn_bytes_per_token, 512);
    assert_int_equal(g.block_size, 4192);       /* ceil(2134016/512 = 4168, 32) */
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 2, 1, &g), KVF_OK);
    assert_int_equal(g.mamba_bytes, 1067008);
    assert_int_equal(g.attn_bytes_per_token, 256);
    assert_int_equal(g.block_size, 4192);
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 4, 3, &g), KVF_OK);
    assert_int_equal(g.mamba_bytes, 533504);
    assert_int_equal(g.attn_bytes_per_token, 256);
    assert_int_equal(g.block_size, 2112);       /* ceil(533504/256 = 2084, 32) */
    assert_int_equal(g.shard.kv_replication, 2);
}

static void test_nano30_tp_stable(void **state)
{
    kvf_model_config_t cfg;
    kvf_cache_params_t p;
    kvf_rank_geometry_t g;
    (void)state;

    kvf_test_load_model("nemotron-3-nano-30b-a3b", &cfg);
    nano30_params(&cfg, &p, KVF_ALIGN_TP_STABLE);
    const int tps[4] = {1, 2, 4, 8};
    for (int i = 0; i < 4; ++i) {
        for (int r = 0; r < tps[i]; ++r) {
            assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, tps[i], r, &g), KVF_OK);
            assert_int_equal(g.block_size, 4192);   /* the TP1/TP2 bound dominates */
            assert_int_equal(g.page_size, 4192u * g.attn_bytes_per_token);
            assert_true(g.page_size >= g.mamba_bytes);
        }
    }
    /* TP8 padding: page 4192*256 = 1073152; M = (512+2*128)*3*2 + 8*64*128*4 = 266752 */
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 8, 0, &g), KVF_OK);
    assert_int_equal(g.mamba_bytes, 266752);
    assert_true(g.mamba_padding_pct > 75.1 && g.mamba_padding_pct < 75.2);
}

static void test_tiny_hybrid_rule_vs_shortcut(void **state)
{
    kvf_model_config_t cfg;
    kvf_cache_params_t p;
    kvf_rank_geometry_t g;
    (void)state;

    kvf_test_load_model("tiny-hybrid", &cfg);
    kvf_cache_params_default(&cfg, &p);
    p.kv_dtype = KVF_DTYPE_BF16;
    p.conv_dtype = KVF_DTYPE_FP32;
    p.ssm_dtype = KVF_DTYPE_FP32;
    /* TP1: conv (256 + 2*2*16) * 3 * 4 = 3840, ssm 8*32*16*4 = 16384, A1 = 2*2*32*2 = 256:
     * 20224 / 256 -> 79 -> 80. TP4: conv (64 + 2*1*16)*3*4 = 1152, ssm 4096, A1 = 128
     * (replicated head): 5248/128 = 41 -> 48. The shortcut M_rank*TP = 20992 -> 96. */
    for (int t = 1; t <= 8; t *= 2) {
        assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, t, t - 1, &g), KVF_OK);
        assert_int_equal(g.block_size, 80);
    }
    p.align = KVF_ALIGN_PER_RANK;
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 4, 0, &g), KVF_OK);
    assert_int_equal(g.mamba_bytes, 1152 + 4096);
    assert_int_equal(g.block_size, 48);
    assert_int_equal(g.shard.group_replication, 2);
    assert_int_equal(g.shard.conv_dim, 64 + 2 * 16);
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 1, 0, &g), KVF_OK);
    assert_int_equal(g.block_size, 80);
}

static void test_nano9b_constant_ratio(void **state)
{
    kvf_model_config_t cfg;
    kvf_cache_params_t p;
    kvf_rank_geometry_t g;
    (void)state;

    kvf_test_load_model("nemotron-nano-9b-v2", &cfg);
    kvf_cache_params_default(&cfg, &p);   /* bf16 KV, bf16 conv, fp32 SSM (default) */
    /* TP1: conv (128*80 + 2*8*128)*3*2 = (10240+2048)*6 = 73728;
     * ssm 128*80*128*4 = 5242880; M = 5316608; A1 = 2*8*128*2 = 4096;
     * M/A1 = 1297.99 -> 1298 -> 1312 (multiple of 16). TP2/4/8 halve both. */
    p.align = KVF_ALIGN_PER_RANK;
    for (int t = 1; t <= 8; t *= 2) {
        assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, t, 0, &g), KVF_OK);
        assert_int_equal(g.mamba_bytes, 5316608u / (unsigned)t);
        assert_int_equal(g.attn_bytes_per_token, 4096u / (unsigned)t);
        assert_int_equal(g.block_size, 1312);
    }
}

static void test_dense_block_size_is_users(void **state)
{
    kvf_model_config_t cfg;
    kvf_cache_params_t p;
    kvf_rank_geometry_t g;
    (void)state;

    kvf_test_load_model("llama-3.1-8b", &cfg);
    kvf_cache_params_default(&cfg, &p);
    p.user_block_size = 32;
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 8, 7, &g), KVF_OK);
    assert_int_equal(g.block_size, 32);
    assert_int_equal(g.mamba_bytes, 0);
    /* 32 layers x 2 x 8 heads x 128 x bf16 = 128 KiB per token at TP1 */
    assert_int_equal(kvf_attn_bytes_per_token(&cfg, 8, KVF_DTYPE_BF16) * 32, 131072);
    assert_int_equal(g.attn_bytes_per_token, 2 * 1 * 128 * 2);
    kvf_test_load_model("qwen3-0.6b", &cfg);
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 16, 0, &g), KVF_OK);
    assert_int_equal(g.shard.kv_replication, 2);   /* 8 KV heads over 16 ranks */
    assert_int_equal(g.shard.kv_head_start, 0);
}

static void test_explicit_block_too_small(void **state)
{
    kvf_model_config_t cfg;
    kvf_cache_params_t p;
    kvf_rank_geometry_t g;
    (void)state;

    kvf_test_load_model("tiny-hybrid", &cfg);
    kvf_cache_params_default(&cfg, &p);
    p.conv_dtype = p.ssm_dtype = KVF_DTYPE_FP32;
    p.block_size = 64;    /* needs 79 at TP1 */
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 1, 0, &g), KVF_ERR_INVALID_PARAM);
    p.block_size = 79;
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 1, 0, &g), KVF_ERR_UNSUPPORTED);
    p.kernel_sizes.num_exact = 1;   /* 79 is prime: only a kernel accepting 79 (or 1) fits */
    p.kernel_sizes.exact[0] = 79;
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 1, 0, &g), KVF_OK);
    p.block_size = 48;    /* enough at TP4 (41), not at TP2 (79) */
    memset(&p.kernel_sizes, 0, sizeof(p.kernel_sizes));
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 4, 0, &g), KVF_OK);
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 2, 0, &g), KVF_ERR_INVALID_PARAM);
    p.block_size = -1;
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &p, 1, 0, &g), KVF_ERR_INVALID_PARAM);
}

static void test_kernel_block_select(void **state)
{
    kvf_kernel_sizes_t s;
    int k = 0;
    (void)state;

    assert_int_equal(kvf_kernel_sizes_parse("16,32,64", &s), KVF_OK);
    assert_int_equal(kvf_kernel_block_select(&s, 64, &k), KVF_OK);
    assert_int_equal(k, 64);
    assert_int_equal(kvf_kernel_block_select(&s, 96, &k), KVF_OK);   /* 32 | 96, 64 does not */
    assert_int_equal(k, 32);
    assert_int_equal(kvf_kernel_block_select(&s, 80, &k), KVF_OK);
    assert_int_equal(k, 16);
    assert_int_equal(kvf_kernel_block_select(&s, 8, &k), KVF_ERR_UNSUPPORTED);
    assert_int_equal(kvf_kernel_sizes_parse("MultipleOf(16)", &s), KVF_OK);
    assert_int_equal(kvf_kernel_block_select(&s, 4192, &k), KVF_OK);
    assert_int_equal(k, 4192);
    assert_int_equal(kvf_kernel_sizes_parse("32,MultipleOf(64)", &s), KVF_OK);
    assert_int_equal(s.num_exact, 1);
    assert_int_equal(s.multiple_of, 64);
    assert_int_equal(kvf_kernel_block_select(&s, 96, &k), KVF_OK);
    assert_int_equal(k, 32);
    assert_int_equal(kvf_kernel_sizes_parse("16,abc", &s), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_kernel_sizes_parse("MultipleOf(0)", &s), KVF_ERR_INVALID_PARAM);
}

static void test_cache_layout_groups(void **state)
{
    kvf_model_config_t cfg;
    kvf_cache_layout_t l;
    (void)state;

    kvf_test_load_model("tiny-hybrid", &cfg);   /* M*M-M*M-: 2 attention, 4 mamba */
    assert_int_equal(kvf_cache_layout_build(&cfg, &l), KVF_OK);
    assert_int_equal(l.slots, 2);
    assert_int_equal(l.num_groups, 3);
    assert_int_equal(l.groups[0].kind, KVF_GROUP_ATTENTION);
    assert_int_equal(l.groups[0].layers[0], 1);
    assert_int_equal(l.groups[0].layers[1], 5);
    assert_int_equal(l.groups[1].kind, KVF_GROUP_MAMBA);
    assert_int_equal(l.groups[1].layers[0], 0);
    assert_int_equal(l.groups[1].layers[1], 2);
    assert_int_equal(l.groups[2].layers[0], 4);
    assert_int_equal(l.groups[2].layers[1], 6);
    assert_int_equal(l.layer_group[3], -1);     /* MLP layers hold no cache */
    assert_int_equal(l.layer_slot[6], 1);

    kvf_test_load_model("nemotron-nano-9b-v2", &cfg);   /* 4 attention, 27 mamba */
    assert_int_equal(kvf_cache_layout_build(&cfg, &l), KVF_OK);
    assert_int_equal(l.slots, 4);
    assert_int_equal(l.num_groups, 1 + 7);      /* ceil(27/4) mamba groups */
    assert_int_equal(l.groups[7].num_layers, 3);

    /* gpt-oss-20b: 12 sliding (window 128) and 12 full layers alternating, [S, F, S, F ...]:
     * a group of each kind, 12 slots (vLLM's hybrid allocator) */
    kvf_test_load_model("gpt-oss-20b", &cfg);
    assert_int_equal(kvf_cache_layout_build(&cfg, &l), KVF_OK);
    assert_int_equal(l.slots, 12);
    assert_int_equal(l.num_groups, 2);
    assert_int_equal(l.groups[0].kind, KVF_GROUP_ATTENTION);
    assert_int_equal(l.groups[0].window, 0);
    assert_int_equal(l.groups[0].layers[0], 1);
    assert_int_equal(l.groups[0].layers[11], 23);
    assert_int_equal(l.groups[1].kind, KVF_GROUP_SLIDING);
    assert_int_equal(l.groups[1].window, 128);
    assert_int_equal(l.groups[1].layers[0], 0);
    assert_int_equal(l.groups[1].layers[11], 22);
    assert_int_equal(l.layer_group[2], 1);
    assert_int_equal(l.layer_slot[2], 1);
    assert_true(kvf_group_is_attention(l.groups[1].kind));
    assert_false(kvf_group_is_attention(KVF_GROUP_MAMBA));
}

/* gemma3_text's five sliding layers to one full: slots = the full layers' count, the sliding
 * layers in groups of their own (the last one partly filled). */
static void test_cache_layout_sliding_groups(void **state)
{
    static const char json[] = "{\"model_type\":\"gemma3_text\",\"vocab_size\":260,"
        "\"hidden_size\":64,\"num_hidden_layers\":8,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":1,\"head_dim\":16,\"intermediate_size\":128,"
        "\"sliding_window\":32,\"layer_types\":[\"sliding_attention\",\"sliding_attention\","
        "\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\","
        "\"sliding_attention\",\"full_attention\"]}";
    kvf_model_config_t cfg;
    kvf_cache_layout_t l;
    (void)state;

    assert_int_equal(kvf_model_config_parse(json, "test", &cfg), KVF_OK);
    assert_int_equal(kvf_cache_layout_build(&cfg, &l), KVF_OK);
    assert_int_equal(l.slots, 2);                /* 2 full, 6 sliding */
    assert_int_equal(l.num_groups, 1 + 3);
    assert_int_equal(l.groups[0].kind, KVF_GROUP_ATTENTION);
    assert_int_equal(l.groups[0].layers[0], 5);
    assert_int_equal(l.groups[0].layers[1], 7);
    for (int g = 1; g < 4; ++g) {
        assert_int_equal(l.groups[g].kind, KVF_GROUP_SLIDING);
        assert_int_equal(l.groups[g].window, 32);
        assert_int_equal(l.groups[g].num_layers, 2);
    }
    assert_int_equal(l.groups[3].layers[1], 6);
    assert_int_equal(l.layer_group[6], 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nano30_sizes_per_rank),
        cmocka_unit_test(test_nano30_tp_stable),
        cmocka_unit_test(test_tiny_hybrid_rule_vs_shortcut),
        cmocka_unit_test(test_nano9b_constant_ratio),
        cmocka_unit_test(test_dense_block_size_is_users),
        cmocka_unit_test(test_explicit_block_too_small),
        cmocka_unit_test(test_kernel_block_select),
        cmocka_unit_test(test_cache_layout_groups),
        cmocka_unit_test(test_cache_layout_sliding_groups),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
