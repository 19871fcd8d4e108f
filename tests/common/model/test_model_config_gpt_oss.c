/* config.json of gpt_oss: GptOssConfig's defaults, YaRN (both spellings, attention_factor
 * rules), layer types and windows, the experts' fields, refusals by name, the fingerprint. */
#include "kvf_model_config.h"
#include "kvf_log.h"
#include "kvf_test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static kvf_status_t parse_oss(const char *extra, kvf_model_config_t *cfg)
{
    char buf[2048];
    snprintf(buf, sizeof(buf), "{\"model_type\":\"gpt_oss\",\"hidden_size\":48,"
             "\"vocab_size\":10,\"num_attention_heads\":4,\"num_key_value_heads\":1,"
             "\"num_hidden_layers\":5,\"num_local_experts\":8%s}", extra);
    return kvf_model_config_parse(buf, "t", cfg);
}

static void test_defaults(void **state)
{
    kvf_model_config_t c;
    (void)state;

    /* GptOssConfig: head_dim 64, window 128 on the even layers, attention biases and sinks,
     * top 4 of the experts, intermediate 2880, alpha 1.702, limit 7, rms eps 1e-5, YaRN
     * factor 32 over 4096 original positions, beta 32 / 1, truncate false, theta 150000:
     * attention_factor 0.1 ln 32 + 1, folded squared into the score scale */
    assert_int_equal(parse_oss("", &c), KVF_OK);
    assert_int_equal(c.arch, KVF_ARCH_GPT_OSS);
    assert_int_equal(c.head_dim, 64);
    for (int l = 0; l < 5; ++l) {
        assert_int_equal(c.layer_window[l], (l % 2 == 0) ? 128 : 0);
        assert_int_equal(c.layer_kinds[l], KVF_LAYER_ATTENTION);
    }
    assert_true(c.attn_bias && c.attn_sinks && c.router_bias && c.moe_swiglu_clamp);
    assert_true(c.moe_in_layer && c.moe_softmax_topk && c.moe_gated && c.dense_mlp_in_layer);
    assert_int_equal(c.num_moe_layers, 5);
    assert_int_equal(c.moe_num_experts, 8);
    assert_int_equal(c.moe_top_k, 4);
    assert_int_equal(c.moe_intermediate_size, 2880);
    assert_int_equal(c.intermediate_size, 0);
    assert_int_equal(c.moe_shared_intermediate_size, 0);
    assert_true((c.swiglu_alpha == 1.702) && (c.swiglu_limit == 7.0));
    assert_true(c.norm_eps == 1e-5);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_true(!c.lm_head_tied);
    assert_int_equal(c.rope.type, KVF_ROPE_YARN);
    assert_true((c.rope.factor == 32.0) && (c.rope.original_max_pos == 4096.0));
    assert_true((c.rope.beta_fast == 32.0) && (c.rope.beta_slow == 1.0) && !c.rope.truncate);
    assert_true(c.rope.theta == 150000.0);
    assert_int_equal(c.rope.rotary_dim, 64);
    {
        const double af = 0.1 * log(32.0) + 1.0;
        assert_true(fabs(c.rope.attention_factor - af) < 1e-15);
        assert_true(fabs(c.attention_multiplier - af * af / 8.0) < 1e-15);
    }
}

static void test_rope_and_layers(void **state)
{
    kvf_model_config_t c, d;
    (void)state;

    /* the released files' spelling: rope_scaling + rope_theta; truncate given */
    assert_int_equal(parse_oss(",\"rope_theta\":50000.0,\"rope_scaling\":{\"rope_type\":\"yarn\","
                               "\"factor\":4.0,\"beta_fast\":16.0,\"beta_slow\":2.0,"
                               "\"original_max_position_embeddings\":256,\"truncate\":true}",
                               &c), KVF_OK);
    assert_true((c.rope.theta == 50000.0) && (c.rope.factor == 4.0) && c.rope.truncate);
    assert_true((c.rope.beta_fast == 16.0) && (c.rope.beta_slow == 2.0));
    assert_true(c.rope.original_max_pos == 256.0);
    /* a yarn object without truncate: transformers' true; without the original length:
     * max_position_embeddings; attention_factor given wins; mscale / mscale_all_dim */
    assert_int_equal(parse_oss(",\"max_position_embeddings\":1024,\"rope_parameters\":{"
                               "\"rope_type\":\"yarn\",\"factor\":8.0,\"attention_factor\":1.5}",
                               &c), KVF_OK);
    assert_true(c.rope.truncate && (c.rope.original_max_pos == 1024.0));
    assert_true(c.rope.attention_factor == 1.5);
    assert_int_equal(parse_oss(",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":8.0,"
                               "\"original_max_position_embeddings\":64,\"mscale\":2.0,"
                               "\"mscale_all_dim\":1.0}", &c), KVF_OK);
    assert_true(fabs(c.rope.attention_factor -
                     (0.2 * log(8.0) + 1.0) / (0.1 * log(8.0) + 1.0)) < 1e-15);
    /* default RoPE: no factor, the plain scale */
    assert_int_equal(parse_oss(",\"rope_parameters\":{\"rope_type\":\"default\"}", &c), KVF_OK);
    assert_int_equal(c.rope.type, KVF_ROPE_DEFAULT);
    assert_true(c.rope.theta == 150000.0);
    assert_true(c.attention_multiplier == 0.125);
    /* layer_types given; a null window: every layer full; a window past the positions too */
    assert_int_equal(parse_oss(",\"layer_types\":[\"full_attention\",\"sliding_attention\","
                               "\"full_attention\",\"full_attention\",\"sliding_attention\"],"
                               "\"sliding_window\":40", &c), KVF_OK);
    assert_true((c.layer_window[0] == 0) && (c.layer_window[1] == 40) &&
                (c.layer_window[4] == 40) && (c.layer_window[3] == 0));
    assert_int_equal(parse_oss(",\"sliding_window\":null", &c), KVF_OK);
    assert_int_equal(c.layer_window[0], 0);
    /* the fingerprint follows the window, the SwiGLU, the sinks' model */
    assert_int_equal(parse_oss(",\"sliding_window\":40", &c), KVF_OK);
    assert_int_equal(parse_oss(",\"sliding_window\":41", &d), KVF_OK);
    assert_true(kvf_model_config_fingerprint(&c) != kvf_model_config_fingerprint(&d));
    assert_int_equal(parse_oss(",\"sliding_window\":40,\"swiglu_limit\":6.0", &d), KVF_OK);
    assert_true(kvf_model_config_fingerprint(&c) != kvf_model_config_fingerprint(&d));
    assert_int_equal(parse_oss(",\"sliding_window\":40,\"hidden_act\":\"gelu\","
                               "\"experts_per_token\":2,\"initial_context_length\":4096", &d),
                     KVF_OK);   /* fields transformers never reads */
    assert_true(kvf_model_config_fingerprint(&c) == kvf_model_config_fingerprint(&d));
}

static void test_refusals(void **state)
{
    static const char *const unsupported[] = {
        ",\"quantization_config\":{\"quant_method\":\"mxfp4\"}",
        ",\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8.0}",
        ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":8.0,\"short_factor\":1}",
        ",\"layer_types\":[\"chunked_attention\",\"full_attention\",\"full_attention\","
        "\"full_attention\",\"full_attention\"]",
        ",\"partial_rotary_factor\":0.5",
        ",\"mystery_field\":1",
    };
    static const char *const invalid[] = {
        ",\"num_experts_per_tok\":9",
        ",\"swiglu_limit\":0.0",
        ",\"intermediate_size\":0",
        ",\"layer_types\":[\"full_attention\"]",
        ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":0.5}",
        ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"truncate\":1}",
        ",\"head_dim\":15",
    };
    kvf_model_config_t c;
    (void)state;

    for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); ++i) {
        assert_int_equal(parse_oss(unsupported[i], &c), KVF_ERR_UNSUPPORTED);
    }
    for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); ++i) {
        assert_int_equal(parse_oss(invalid[i], &c), KVF_ERR_INVALID_PARAM);
    }
}

/* gpt-oss-20b's shape (tests/data/models: the released config.json's fields without its MXFP4
 * quantization_config, as a dequantized bf16 checkpoint ships) */
static void test_real_shape(void **state)
{
    kvf_model_config_t c;
    const double af = 0.1 * log(32.0) + 1.0;
    (void)state;

    kvf_test_load_model("gpt-oss-20b", &c);
    assert_int_equal(c.arch, KVF_ARCH_GPT_OSS);
    assert_int_equal(c.num_layers, 24);
    assert_int_equal(c.num_attention_layers, 24);
    for (int l = 0; l < 24; ++l) {
        assert_int_equal(c.layer_window[l], (l % 2 == 0) ? 128 : 0);
    }
    assert_int_equal(c.num_attention_heads, 64);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.moe_num_experts, 32);
    assert_int_equal(c.moe_top_k, 4);
    assert_int_equal(c.moe_intermediate_size, 2880);
    assert_int_equal(c.torch_dtype, KVF_DTYPE_BF16);
    assert_int_equal(c.rope.type, KVF_ROPE_YARN);
    assert_true((c.rope.factor == 32.0) && !c.rope.truncate && (c.rope.theta == 150000.0));
    assert_true(c.rope.original_max_pos == 4096.0);
    assert_true(fabs(c.attention_multiplier - af * af / 8.0) < 1e-15);
    assert_true(!c.lm_head_tied && c.attn_sinks);
    assert_int_equal(c.eos_token_id, 200002);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_rope_and_layers),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_real_shape),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
