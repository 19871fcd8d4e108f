/* config.json parsing: real models, both pattern spellings, and bad input. */
#include "kvf_model_config.h"
#include "kvf_log.h"
#include "kvf_test_util.h"

#include <string.h>

static void test_real_models(void **state)
{
    kvf_model_config_t cfg;
    (void)state;

    kvf_test_load_model("nemotron-3-nano-30b-a3b", &cfg);
    assert_int_equal(cfg.arch, KVF_ARCH_NEMOTRON_H);
    assert_int_equal(cfg.num_layers, 52);
    assert_int_equal(cfg.num_attention_layers, 6);
    assert_int_equal(cfg.num_mamba_layers, 23);
    assert_int_equal(cfg.layer_kinds[1], KVF_LAYER_MOE);
    assert_int_equal(cfg.ssm_cache_dtype, KVF_DTYPE_FP32);
    assert_int_equal(cfg.n_groups, 8);

    kvf_test_load_model("nemotron-nano-9b-v2", &cfg);
    assert_int_equal(cfg.num_layers, 56);
    assert_int_equal(cfg.num_mamba_layers, 27);
    assert_int_equal(cfg.num_attention_layers, 4);
    assert_int_equal(cfg.intermediate_size, 15680);

    kvf_test_load_model("llama-3.1-8b", &cfg);
    assert_int_equal(cfg.arch, KVF_ARCH_LLAMA);
    assert_int_equal(cfg.num_attention_layers, 32);
    assert_int_equal(cfg.num_mamba_layers, 0);
    assert_true(cfg.dense_mlp_in_layer);
    assert_int_equal(cfg.head_dim, 128);

    kvf_test_load_model("qwen3-0.6b", &cfg);
    assert_int_equal(cfg.arch, KVF_ARCH_QWEN3);
    assert_int_equal(cfg.num_key_value_heads, 8);
    assert_true(cfg.norm_eps < 2e-6);
}

static const char *const kvf_good_hybrid =
    "{\"model_type\":\"nemotron_h\",\"hidden_size\":64,\"vocab_size\":100,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
    "\"intermediate_size\":128,\"mamba_num_heads\":4,\"mamba_head_dim\":16,"
    "\"ssm_state_size\":8,\"n_groups\":2,\"conv_kernel\":4,%s}";

static kvf_status_t parse_with(const char *extra, kvf_model_config_t *cfg)
{
    char buf[2048];
    snprintf(buf, sizeof(buf), kvf_good_hybrid, extra);
    return kvf_model_config_parse(buf, "test", cfg);
}

static void test_layers_block_type(void **state)
{
    kvf_model_config_t a, b;
    (void)state;

    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*-E\"", &a), KVF_OK);
    assert_int_equal(parse_with("\"layers_block_type\":[\"mamba\",\"attention\",\"mlp\",\"moe\"]",
                                &b), KVF_OK);
    assert_string_equal(a.layer_kinds, "M*-E");
    assert_string_equal(b.layer_kinds, "M*-E");
    assert_true(kvf_model_config_fingerprint(&a) == kvf_model_config_fingerprint(&b));
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*-M\"", &b), KVF_OK);
    assert_true(kvf_model_config_fingerprint(&a) != kvf_model_config_fingerprint(&b));
}

static void test_bad_input(void **state)
{
    kvf_model_config_t cfg;
    (void)state;

    assert_int_equal(kvf_model_config_parse("{not json", "t", &cfg), KVF_ERR_PARSE);
    assert_int_equal(kvf_model_config_parse("{\"model_type\":\"gpt2\"}", "t", &cfg),
                     KVF_ERR_UNSUPPORTED);
    assert_int_equal(kvf_model_config_parse("{\"hidden_size\":4}", "t", &cfg),
                     KVF_ERR_INVALID_PARAM);   /* no model_type */
    /* missing pattern */
    assert_int_equal(parse_with("\"x\":1", &cfg), KVF_ERR_INVALID_PARAM);
    /* bad letter */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*X\"", &cfg),
                     KVF_ERR_INVALID_PARAM);
    /* num_hidden_layers disagrees with the pattern */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"num_hidden_layers\":3",
                                &cfg), KVF_ERR_INVALID_PARAM);
    /* negative size */
    assert_int_equal(kvf_model_config_parse(
        "{\"model_type\":\"llama\",\"hidden_size\":-64,\"vocab_size\":10,"
        "\"num_attention_heads\":4,\"num_hidden_layers\":2,\"intermediate_size\":8}", "t", &cfg),
        KVF_ERR_INVALID_PARAM);
    /* groups must divide heads */
    assert_int_equal(kvf_model_config_parse(
        "{\"model_type\":\"nemotron_h\",\"hidden_size\":64,\"vocab_size\":100,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
        "\"mamba_num_heads\":4,\"mamba_head_dim\":16,\"ssm_state_size\":8,\"n_groups\":3,"
        "\"conv_kernel\":4,\"hybrid_override_pattern\":\"M*\"}", "t", &cfg),
        KVF_ERR_INVALID_PARAM);
    /* kv heads must divide attention heads */
    assert_int_equal(kvf_model_config_parse(
        "{\"model_type\":\"llama\",\"hidden_size\":64,\"vocab_size\":10,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":3,\"num_hidden_layers\":2,\"intermediate_size\":8}", "t", &cfg),
        KVF_ERR_INVALID_PARAM);
    /* mistyped field */
    assert_int_equal(kvf_model_config_parse(
        "{\"model_type\":\"llama\",\"hidden_size\":\"64\",\"vocab_size\":10,"
        "\"num_attention_heads\":4,\"num_hidden_layers\":2,\"intermediate_size\":8}", "t", &cfg),
        KVF_ERR_INVALID_PARAM);
    /* pattern with MLP layers needs intermediate_size */
    assert_int_equal(kvf_model_config_parse(
        "{\"model_type\":\"nemotron_h\",\"hidden_size\":64,\"vocab_size\":100,"
        "\"num_attention_heads\":4,\"hybrid_override_pattern\":\"*-\"}", "t", &cfg),
        KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_model_config_load("/nonexistent/config.json", &cfg), KVF_ERR_IO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_models),
        cmocka_unit_test(test_layers_block_type),
        cmocka_unit_test(test_bad_input),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
