/* config.json parsing: real models, both pattern spellings, and bad input. */
#include "kvf_model_config.h"
#include "kvf_shard.h"
#include "kvf_log.h"
#include "kvf_test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

#define KVF_MOE_FIELDS_NOCOMMA                                                            \
    "\"n_routed_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,"         \
    "\"moe_shared_expert_intermediate_size\":48,\"hybrid_override_pattern\":\"M*E\""
#define KVF_MOE_FIELDS                                                                    \
    "\"n_routed_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,"         \
    "\"moe_shared_expert_intermediate_size\":48"

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

    assert_int_equal(parse_with(KVF_MOE_FIELDS ",\"hybrid_override_pattern\":\"M*-E\"", &a),
                     KVF_OK);
    assert_int_equal(parse_with(KVF_MOE_FIELDS ",\"layers_block_type\":[\"mamba\",\"attention\","
                                "\"mlp\",\"moe\"]", &b), KVF_OK);
    assert_string_equal(a.layer_kinds, "M*-E");
    assert_string_equal(b.layer_kinds, "M*-E");
    assert_true(kvf_model_config_fingerprint(&a) == kvf_model_config_fingerprint(&b));
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*-M\"", &b), KVF_OK);
    assert_true(kvf_model_config_fingerprint(&a) != kvf_model_config_fingerprint(&b));
    /* transformers 5 spelling: linear_attention / full_attention, dtype */
    assert_int_equal(parse_with(KVF_MOE_FIELDS ",\"layers_block_type\":[\"linear_attention\","
                                "\"full_attention\",\"mlp\",\"moe\"],\"dtype\":\"float32\"",
                                &b), KVF_OK);
    assert_string_equal(b.layer_kinds, "M*-E");
    assert_int_equal(b.torch_dtype, KVF_DTYPE_FP32);
    assert_true(kvf_model_config_fingerprint(&a) == kvf_model_config_fingerprint(&b));
    assert_int_equal(b.moe_num_experts, 4);
    assert_int_equal(b.moe_top_k, 2);
    assert_int_equal(b.num_moe_layers, 1);
    assert_true(b.moe_norm_topk_prob);
    /* legacy torch_dtype still read; dtype wins when both are present */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"torch_dtype\":\"float16\"",
                                &b), KVF_OK);
    assert_int_equal(b.torch_dtype, KVF_DTYPE_FP16);
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"torch_dtype\":\"float16\","
                                "\"dtype\":\"bfloat16\"", &b), KVF_OK);
    assert_int_equal(b.torch_dtype, KVF_DTYPE_BF16);
}

/* Fields honoured: values reach the config as transformers reads them. */
static void test_honoured_fields(void **state)
{
    kvf_model_config_t c;
    (void)state;

    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*-\",\"use_bias\":true,"
                                "\"mlp_bias\":true,\"mlp_hidden_act\":\"silu\","
                                "\"mamba_hidden_act\":\"gelu\",\"time_step_min\":0.01,"
                                "\"time_step_limit\":[0.02,50.0],\"tie_word_embeddings\":true",
                                &c), KVF_OK);
    assert_true(c.mamba_proj_bias);
    assert_true(c.mlp_bias);
    assert_int_equal(c.mlp_act, KVF_ACT_SILU);
    assert_int_equal(c.mamba_act, KVF_ACT_GELU);
    /* transformers 5.25 clamps a prompt's dt to time_step_limit; time_step_min only
     * initialises dt_bias (5.24 clamped at it: kvferry did until 5.25) */
    assert_true(c.dt_limit_low == 0.02 && c.dt_limit_high == 50.0);
    assert_true(c.tie_word_embeddings);
    assert_false(c.lm_head_tied);            /* transformers' NemotronH never ties */
    /* defaults */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*-\"", &c), KVF_OK);
    assert_false(c.mamba_proj_bias);
    assert_int_equal(c.mlp_act, KVF_ACT_RELU2);
    assert_int_equal(c.mamba_act, KVF_ACT_SILU);
    assert_true(c.dt_limit_low == 0.0 && isinf(c.dt_limit_high));   /* class default (0, inf) */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*-\",\"mamba_dt_limit\":[0.001,"
                                "Infinity]", &c), KVF_OK);
    assert_true(c.dt_limit_low == 0.001 && isinf(c.dt_limit_high));
    /* mamba_proj_bias is not read by transformers' mixer (use_bias is) */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*-\",\"mamba_proj_bias\":true",
                                &c), KVF_OK);
    assert_false(c.mamba_proj_bias);

    /* dense: llama3 rope, tied lm_head, biases */
    assert_int_equal(kvf_model_config_parse(
        "{\"model_type\":\"llama\",\"hidden_size\":64,\"vocab_size\":10,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_hidden_layers\":2,"
        "\"intermediate_size\":8,\"tie_word_embeddings\":true,\"attention_bias\":true,"
        "\"mlp_bias\":true,\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000.0,"
        "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
        "\"original_max_position_embeddings\":64}}", "t", &c), KVF_OK);
    assert_int_equal(c.rope.type, KVF_ROPE_LLAMA3);
    assert_true(c.rope.theta == 500000.0);
    assert_true(c.rope.factor == 8.0);
    assert_true(c.lm_head_tied);
    assert_true(c.attn_bias && c.mlp_bias && c.mlp_gated);
    assert_false(c.qk_norm);
    /* older spelling: rope_scaling + rope_theta */
    assert_int_equal(kvf_model_config_parse(
        "{\"model_type\":\"llama\",\"hidden_size\":64,\"vocab_size\":10,"
        "\"num_attention_heads\":4,\"num_hidden_layers\":2,\"intermediate_size\":8,"
        "\"rope_theta\":1000.0,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}", "t", &c),
        KVF_OK);
    assert_int_equal(c.rope.type, KVF_ROPE_LINEAR);
    assert_true(c.rope.theta == 1000.0);
    assert_int_equal(kvf_model_config_parse(
        "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"vocab_size\":10,"
        "\"num_attention_heads\":4,\"num_hidden_layers\":2,\"intermediate_size\":8,"
        "\"head_dim\":16,\"sliding_window\":4096,\"use_sliding_window\":false,"
        "\"layer_types\":[\"full_attention\",\"full_attention\"]}", "t", &c), KVF_OK);
    assert_true(c.qk_norm);
    assert_int_equal(c.rope.type, KVF_ROPE_DEFAULT);
    assert_true(c.rope.theta == 10000.0);
    assert_int_equal(c.sliding_window, 0);
}

static kvf_status_t parse_dense(const char *mt, const char *extra, kvf_model_config_t *cfg)
{
    char buf[2048];
    snprintf(buf, sizeof(buf), "{\"model_type\":\"%s\",\"hidden_size\":64,\"vocab_size\":10,"
             "\"num_attention_heads\":4,\"num_hidden_layers\":2,\"intermediate_size\":8%s%s}",
             mt, (extra[0] != '\0') ? "," : "", extra);
    return kvf_model_config_parse(buf, "t", cfg);
}

/* The departures from transformers 5 found side by side (issue 25), each as
 * transformers reads the same config.json. */
static void test_transformers_semantics(void **state)
{
    kvf_model_config_t c;
    (void)state;

    /* nemotron_h: layer_norm_epsilon (default 1e-5); rms_norm_eps is ignored */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"rms_norm_eps\":0.001",
                                &c), KVF_OK);
    assert_true(c.norm_eps == 1e-5);
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"rms_norm_eps\":0.001,"
                                "\"layer_norm_epsilon\":1e-6", &c), KVF_OK);
    assert_true(c.norm_eps == 1e-6);
    /* rope_scaling wins over rope_parameters when both are there */
    assert_int_equal(parse_dense("llama", "\"rope_parameters\":{\"rope_type\":\"default\","
                                 "\"rope_theta\":20000.0},\"rope_theta\":1000.0,"
                                 "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2.0}",
                                 &c), KVF_OK);
    assert_int_equal(c.rope.type, KVF_ROPE_LINEAR);
    assert_true(c.rope.factor == 2.0);
    assert_true(c.rope.theta == 1000.0);
    assert_int_equal(parse_dense("llama", "\"rope_parameters\":{\"rope_type\":\"default\","
                                 "\"rope_theta\":20000.0},\"rope_scaling\":null", &c), KVF_OK);
    assert_int_equal(c.rope.type, KVF_ROPE_DEFAULT);
    assert_true(c.rope.theta == 20000.0);
    /* eos_token_id as a list: every id stops */
    assert_int_equal(parse_dense("llama", "\"eos_token_id\":[7,9]", &c), KVF_OK);
    assert_int_equal(c.num_eos, 2);
    assert_int_equal(c.eos_token_id, 7);
    assert_true(kvf_model_is_eos(&c, 7) && kvf_model_is_eos(&c, 9));
    assert_false(kvf_model_is_eos(&c, 8));
    assert_int_equal(parse_dense("llama", "\"eos_token_id\":[7,10]", &c), KVF_ERR_INVALID_PARAM);
    assert_int_equal(parse_dense("llama", "\"eos_token_id\":3", &c), KVF_OK);
    assert_int_equal(c.num_eos, 1);
    assert_true(kvf_model_is_eos(&c, 3));
    assert_int_equal(parse_dense("llama", "", &c), KVF_OK);
    assert_int_equal(c.num_eos, 0);
    assert_false(kvf_model_is_eos(&c, -1));
    /* mistral: transformers' default window 4096 when the field is absent; a window at
     * least max_position_embeddings cannot bind (accepted, full attention) */
    assert_int_equal(parse_dense("mistral", "", &c), KVF_OK);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(parse_dense("mistral", "\"max_position_embeddings\":32768", &c), KVF_OK);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(parse_dense("mistral", "\"max_position_embeddings\":4096", &c), KVF_OK);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(parse_dense("mistral", "\"sliding_window\":null,"
                                 "\"max_position_embeddings\":32768", &c), KVF_OK);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(parse_dense("mistral", "\"sliding_window\":8192,"
                                 "\"max_position_embeddings\":8192", &c), KVF_OK);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(parse_dense("mistral", "\"sliding_window\":1024,"
                                 "\"max_position_embeddings\":8192", &c), KVF_OK);
    assert_int_equal(c.sliding_window, 1024);
    for (int l = 0; l < c.num_layers; ++l) {
        assert_int_equal(c.layer_window[l], 1024);   /* mistral: every layer slides */
    }
    /* qwen3: the window only with use_sliding_window and a sliding layer */
    assert_int_equal(parse_dense("qwen3", "\"head_dim\":16,\"use_sliding_window\":true,"
                                 "\"sliding_window\":512,\"max_position_embeddings\":40960,"
                                 "\"layer_types\":[\"full_attention\",\"sliding_attention\"]",
                                 &c), KVF_OK);
    assert_int_equal(c.sliding_window, 512);
    assert_int_equal(c.num_layers, 2);
    assert_int_equal(c.layer_window[0], 0);     /* full_attention */
    assert_int_equal(c.layer_window[1], 512);   /* sliding_attention */
    assert_int_equal(parse_dense("qwen3", "\"head_dim\":16,\"use_sliding_window\":true,"
                                 "\"sliding_window\":512,\"max_window_layers\":1", &c), KVF_OK);
    assert_int_equal(c.layer_window[0], 0);     /* below max_window_layers: full */
    assert_int_equal(c.layer_window[1], 512);
    assert_int_equal(parse_dense("qwen3", "\"head_dim\":16,\"use_sliding_window\":true,"
                                 "\"sliding_window\":512,\"max_window_layers\":2", &c), KVF_OK);
    assert_int_equal(c.sliding_window, 0);   /* no layer from max_window_layers = 2 on */
    assert_int_equal(parse_dense("qwen3", "\"head_dim\":16,\"use_sliding_window\":true,"
                                 "\"sliding_window\":4096,\"max_position_embeddings\":4096,"
                                 "\"max_window_layers\":0", &c), KVF_OK);
    assert_int_equal(c.sliding_window, 0);   /* window = context: cannot bind */
    assert_int_equal(parse_dense("qwen3", "\"head_dim\":16,\"sliding_window\":512,"
                                 "\"layer_types\":[\"sliding_attention\",\"sliding_attention\"]",
                                 &c), KVF_OK);
    assert_int_equal(c.sliding_window, 0);   /* use_sliding_window false */
    assert_int_equal(c.layer_window[0] + c.layer_window[1], 0);
    /* nemotron_h: a window is refused unless it cannot bind */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"sliding_window\":4096,"
                                "\"max_position_embeddings\":4096", &c), KVF_OK);
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"sliding_window\":1024,"
                                "\"max_position_embeddings\":4096", &c), KVF_ERR_UNSUPPORTED);
}

/* Parse @a json with stderr captured; returns the status, *line the log text. */
static kvf_status_t parse_captured(const char *json, char *line, size_t len)
{
    kvf_model_config_t cfg;
    char path[] = "/tmp/kvf-cfg-log-XXXXXX";
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    kvf_status_t status;
    ssize_t n;

    assert_true((fd >= 0) && (saved >= 0));
    unlink(path);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    status = kvf_model_config_parse(json, "cfg.json", &cfg);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    n = pread(fd, line, len - 1, 0);
    close(fd);
    line[(n > 0) ? n : 0] = '\0';
    return status;
}

/* Every refused field: a non-OK status and ONE log line naming field and value. */
static void test_refusals(void **state)
{
    static const struct {
        const char *extra;      /* added to the good hybrid (or a full llama config) */
        bool        llama;
        const char *field, *value;
    } cases[] = {
        {"\"sliding_window\":4096", false, "sliding_window", "4096"},
        {"\"mlp_hidden_act\":\"mish\"", false, "mlp_hidden_act", "mish"},
        {"\"mamba_hidden_act\":\"hardswish\"", false, "mamba_hidden_act", "hardswish"},
        {"\"quantization_config\":{\"quant_method\":\"fp8\"}", false, "quantization_config", "fp8"},
        {"\"moe_latent_size\":1024," KVF_MOE_FIELDS_NOCOMMA, false, "moe_latent_size", "1024"},
        {"\"frobnicate\":true", false, "frobnicate", "nemotron_h"},
        {"\"layers_block_type\":[\"linear_attention\",\"sliding_attention\"]", false,
         "layers_block_type", "sliding_attention"},
        {"\"sliding_window\":0", true, "sliding_window", "0"},
        {"\"hidden_act\":\"xielu\"", true, "hidden_act", "xielu"},
        {"\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4.0}", true, "rope_type", "yarn"},
        {"\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2.0}", true, "rope_type", "dynamic"},
        {"\"rope_parameters\":{\"rope_type\":\"default\",\"mrope_section\":[1,2]}", true,
         "mrope_section", "[1,2]"},
        {"\"partial_rotary_factor\":0.5", true, "partial_rotary_factor", "0.5"},
        {"\"layer_types\":[\"sliding_chunks\",\"full_attention\"]", true, "layer_types",
         "sliding_chunks"},
    };
    char json[2048], line[1024];
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        kvf_status_t st;
        if (cases[i].llama) {
            const char *mt = (strstr(cases[i].extra, "sliding") != NULL) ? "qwen3" : "llama";
            if (strstr(cases[i].extra, "\"sliding_window\"") != NULL) {
                mt = "mistral";
            }
            snprintf(json, sizeof(json),
                     "{\"model_type\":\"%s\",\"hidden_size\":64,\"vocab_size\":10,"
                     "\"num_attention_heads\":4,\"num_hidden_layers\":2,\"intermediate_size\":8,%s}",
                     mt, cases[i].extra);
        } else if ((strstr(cases[i].extra, "layers_block_type") != NULL) ||
                   (strstr(cases[i].extra, "hybrid_override_pattern") != NULL)) {
            snprintf(json, sizeof(json), kvf_good_hybrid, cases[i].extra);
        } else {
            char extra[1024];
            snprintf(extra, sizeof(extra), "\"hybrid_override_pattern\":\"M*-\",%s", cases[i].extra);
            snprintf(json, sizeof(json), kvf_good_hybrid, extra);
        }
        st = parse_captured(json, line, sizeof(line));
        if ((st == KVF_OK) || (strstr(line, cases[i].field) == NULL) ||
            (strstr(line, cases[i].value) == NULL) || (strchr(line, '\n') != line + strlen(line) - 1)) {
            fail_msg("case %zu (%s): status %d, log '%s'", i, cases[i].extra, (int)st, line);
        }
    }
}

/* bamba and granitemoehybrid: the minimal files below (class defaults elsewhere) */
#define KVF_BAMBA_JSON                                                                      \
    "{\"model_type\":\"bamba\",\"hidden_size\":64,\"vocab_size\":260,"                   \
    "\"num_attention_heads\":8,\"num_key_value_heads\":2,\"num_hidden_layers\":3,"         \
    "\"intermediate_size\":96,\"attn_layer_indices\":[1],\"mamba_n_heads\":8,"             \
    "\"mamba_d_state\":16,\"mamba_n_groups\":2%s}"
#define KVF_GRANITE_JSON                                                                    \
    "{\"model_type\":\"granitemoehybrid\",\"hidden_size\":64,\"vocab_size\":260,"        \
    "\"num_attention_heads\":8,\"num_hidden_layers\":2,\"intermediate_size\":32,"          \
    "\"layer_types\":[\"mamba\",\"attention\"],\"num_local_experts\":4,"                 \
    "\"shared_intermediate_size\":48,\"mamba_n_heads\":8,\"mamba_d_state\":16%s}"

static void test_ibm_families(void **state)
{
    static const struct {
        bool        granite;
        const char *extra, *field, *value;
    } refused[] = {
        {false, ",\"partial_rotary_factor\":1.0", "partial_rotary_factor", "top level"},
        {false, ",\"time_step_limit\":null", "time_step_limit", "null"},
        {false, ",\"layer_types\":[\"mamba\"]", "layer_types", "bamba"},
        {false, ",\"mamba_d_head\":24", "mamba_d_head", "24"},
        {false, ",\"rope_parameters\":{\"partial_rotary_factor\":0.1}", "partial_rotary_factor",
         "0.1"},
        {true, ",\"position_embedding_type\":\"alibi\"", "position_embedding_type", "alibi"},
        {true, ",\"normalization_function\":\"layernorm\"", "normalization_function",
         "layernorm"},
        {true, ",\"num_experts_per_tok\":5", "num_experts_per_tok", "5"},
        {true, ",\"attention_multiplier\":0", "attention_multiplier", "0"},
        {true, ",\"attn_layer_indices\":[1]", "attn_layer_indices", "granitemoehybrid"},
        {true, ",\"position_embedding_type\":\"rope\",\"partial_rotary_factor\":0.5",
         "partial_rotary_factor", "0.5"},
    };
    kvf_model_config_t cfg;
    char json[2048], line[1024];
    (void)state;

    /* bamba: pattern, partial RoPE (0.5 of head_dim 8), the Mamba2 defaults and spelling */
    snprintf(json, sizeof(json), KVF_BAMBA_JSON, "");
    assert_int_equal(kvf_model_config_parse(json, "t", &cfg), KVF_OK);
    assert_int_equal(cfg.arch, KVF_ARCH_BAMBA);
    assert_string_equal(cfg.layer_kinds, "M*M");
    assert_int_equal(cfg.rope.rotary_dim, 4);
    assert_int_equal(cfg.mamba_head_dim, 16);   /* "auto": 2 * 64 / 8 */
    assert_int_equal(cfg.conv_kernel, 4);
    assert_int_equal(cfg.chunk_size, 256);
    assert_true(cfg.dense_mlp_in_layer && cfg.mlp_gated && cfg.use_conv_bias);
    assert_true(cfg.norm_eps == 1e-5 && cfg.dt_limit_low == 0.0 && isinf(cfg.dt_limit_high));
    /* a finite upper dt clamp: the prompt scan applies it (transformers 5.25) */
    snprintf(json, sizeof(json), KVF_BAMBA_JSON, ",\"time_step_limit\":[0.01,100.0]");
    assert_int_equal(kvf_model_config_parse(json, "t", &cfg), KVF_OK);
    assert_true(cfg.dt_limit_low == 0.01 && cfg.dt_limit_high == 100.0);
    /* granitemoehybrid: experts + shared MLP, multipliers' defaults, no RoPE by default */
    snprintf(json, sizeof(json), KVF_GRANITE_JSON, ",\"logits_scaling\":8");
    assert_int_equal(kvf_model_config_parse(json, "t", &cfg), KVF_OK);
    assert_int_equal(cfg.arch, KVF_ARCH_GRANITE_MOE_HYBRID);
    assert_string_equal(cfg.layer_kinds, "M*");
    assert_true(cfg.moe_in_layer && cfg.moe_softmax_topk && cfg.moe_gated);
    assert_int_equal(cfg.moe_num_experts, 4);
    assert_int_equal(cfg.moe_top_k, 2);
    assert_int_equal(cfg.moe_intermediate_size, 32);
    assert_int_equal(cfg.moe_shared_intermediate_size, 48);
    assert_int_equal(cfg.intermediate_size, 0);
    assert_int_equal(cfg.rope.type, KVF_ROPE_NONE);
    assert_true(cfg.logits_scaling == 8.0 && cfg.embedding_multiplier == 1.0);
    assert_true(cfg.norm_eps == 1e-6);
    /* without experts: the shared MLP is the layer's dense MLP */
    snprintf(json, sizeof(json), KVF_GRANITE_JSON, "");
    memcpy(strstr(json, "\"num_local_experts\":4"), "\"num_local_experts\":0", 21);
    assert_int_equal(kvf_model_config_parse(json, "t", &cfg), KVF_OK);
    assert_false(cfg.moe_in_layer);
    assert_int_equal(cfg.intermediate_size, 48);
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); ++i) {
        kvf_status_t st;
        snprintf(json, sizeof(json), refused[i].granite ? KVF_GRANITE_JSON : KVF_BAMBA_JSON,
                 refused[i].extra);
        st = parse_captured(json, line, sizeof(line));
        if ((st == KVF_OK) || (strstr(line, refused[i].field) == NULL) ||
            (strstr(line, refused[i].value) == NULL)) {
            fail_msg("case %zu (%s): status %d, log '%s'", i, refused[i].extra, (int)st, line);
        }
    }
}

/* gemma3_text: Gemma3TextConfig's defaults and per-type RoPE, and its refusals by name. */
static kvf_status_t parse_gemma(const char *extra, kvf_model_config_t *cfg)
{
    char buf[2048];
    snprintf(buf, sizeof(buf), "{\"model_type\":\"gemma3_text\",\"hidden_size\":48,"
             "\"vocab_size\":10,\"num_attention_heads\":4,\"num_key_value_heads\":1,"
             "\"num_hidden_layers\":7,\"intermediate_size\":8,"
             "\"max_position_embeddings\":131072%s}", extra);
    return kvf_model_config_parse(buf, "t", cfg);
}

static void test_gemma3(void **state)
{
    static const char *const refused[] = {
        ",\"final_logit_softcapping\":0", ",\"attn_logit_softcapping\":-5.0",
        ",\"use_bidirectional_attention\":true", ",\"hidden_act\":\"gelu\"",
        ",\"layer_types\":[\"chunked_attention\",\"full_attention\",\"full_attention\","
        "\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\"]",
        ",\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"yarn\",\"factor\":2.0}}",
    };
    kvf_model_config_t c;
    (void)state;

    /* defaults: every 6th layer full (sliding_window_pattern 6), window 4096, thetas 1e4 local
     * and 1e6 global, head_dim 256, scores * 256^-0.5, tied, (1 + w) norms, post norms,
     * sqrt(48) = 6.9282 as bf16 (the default dtype) = 6.9375 */
    assert_int_equal(parse_gemma("", &c), KVF_OK);
    assert_int_equal(c.arch, KVF_ARCH_GEMMA3_TEXT);
    for (int l = 0; l < 7; ++l) {
        assert_int_equal(c.layer_window[l], (l == 5) ? 0 : 4096);
        assert_int_equal(c.layer_local_rope[l], l != 5);
    }
    assert_int_equal(c.head_dim, 256);
    assert_true(c.rope_local.theta == 10000.0);
    assert_true(c.rope.theta == 1000000.0);
    assert_true(c.attention_multiplier == 1.0 / 16.0);
    assert_true(c.embedding_multiplier == 6.9375);
    assert_true(c.lm_head_tied && c.qk_norm && c.post_norms && c.mlp_gated);
    assert_true(c.norm_offset == 1.0);
    assert_int_equal(c.mlp_act, KVF_ACT_GELU_TANH);
    assert_true((c.attn_softcap == 0.0) && (c.final_softcap == 0.0));   /* class: null */
    assert_int_equal(parse_gemma(",\"final_logit_softcapping\":30.0,"
                                 "\"attn_logit_softcapping\":50.0", &c), KVF_OK);
    /* transformers' Gemma3Attention never applies its attn_logit_softcapping */
    assert_true((c.attn_softcap == 0.0) && (c.final_softcap == 30.0));
    assert_int_equal(parse_gemma(",\"dtype\":\"float32\"", &c), KVF_OK);
    assert_true(c.embedding_multiplier == (double)sqrtf(48.0f));
    /* older files: rope_local_base_freq, rope_theta + rope_scaling (the full layers'), the
     * pattern; a window that cannot bind leaves the local RoPE on the sliding layers */
    assert_int_equal(parse_gemma(",\"rope_local_base_freq\":5000.0,\"rope_theta\":200000.0,"
                                 "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4.0},"
                                 "\"sliding_window_pattern\":2,\"sliding_window\":200000,"
                                 "\"query_pre_attn_scalar\":64", &c), KVF_OK);
    assert_true((c.rope_local.theta == 5000.0) && (c.rope_local.type == KVF_ROPE_DEFAULT));
    assert_true((c.rope.theta == 200000.0) && (c.rope.type == KVF_ROPE_LINEAR) &&
                (c.rope.factor == 4.0));
    assert_int_equal(c.layer_window[0], 0);
    assert_true(c.layer_local_rope[0] && !c.layer_local_rope[1] && c.layer_local_rope[2]);
    assert_true(c.attention_multiplier == 0.125);
    /* rope_parameters per layer type (transformers 5) */
    assert_int_equal(parse_gemma(",\"rope_parameters\":{\"full_attention\":{\"rope_type\":"
                                 "\"linear\",\"factor\":8.0,\"rope_theta\":1e6},"
                                 "\"sliding_attention\":{\"rope_type\":\"default\","
                                 "\"rope_theta\":1e4}}", &c), KVF_OK);
    assert_true((c.rope.factor == 8.0) && (c.rope_local.theta == 1e4));
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); ++i) {
        assert_int_not_equal(parse_gemma(refused[i], &c), KVF_OK);
    }
    /* the multimodal file is another model_type */
    assert_int_equal(parse_dense("gemma3", "", &c), KVF_ERR_UNSUPPORTED);
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
    assert_int_equal(parse_with("\"use_cache\":true", &cfg), KVF_ERR_INVALID_PARAM);
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
    /* a BOS or EOS id outside the vocabulary would fail every request: refused at load */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"bos_token_id\":100",
                                &cfg), KVF_ERR_INVALID_PARAM);
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"eos_token_id\":[7,300]",
                                &cfg), KVF_ERR_INVALID_PARAM);   /* every id of a list stops */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"eos_token_id\":[300]",
                                &cfg), KVF_ERR_INVALID_PARAM);
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*\",\"bos_token_id\":99,"
                                "\"max_position_embeddings\":2048", &cfg), KVF_OK);
    assert_int_equal(cfg.max_position_embeddings, 2048);
}

/* Published configs in Python's JSON dialect (NVIDIA's Nemotron-H: time_step_limit
 * [0.0, Infinity]) and transformers 5's {"__float__": ...}: what each value means. */
static void test_python_json(void **state)
{
    static const struct {
        const char  *extra;      /* added to the good hybrid after its pattern */
        kvf_status_t status;
        const char  *log;        /* a text the one log line holds, or NULL: no log */
    } cases[] = {
        {"\"time_step_limit\":[0.0, Infinity]", KVF_OK, NULL},
        {"\"time_step_limit\":[0.0,{\"__float__\":\"Infinity\"}]", KVF_OK, NULL},
        {"\"time_step_limit\":[0.0, 1e+30]", KVF_OK, NULL},
        {"\"mamba_dt_limit\":[0.001, Infinity]", KVF_OK, NULL},
        /* a field kvferry does not read may hold any number Python writes */
        {"\"router_aux_loss_coef\":NaN,\"time_step_max\":Infinity", KVF_OK, NULL},
        {"\"time_step_limit\":[0.0, NaN]", KVF_ERR_INVALID_PARAM, "'time_step_limit' = [0, nan]"},
        {"\"time_step_limit\":[0.1, 0.01]", KVF_ERR_INVALID_PARAM, "'time_step_limit'"},
        {"\"time_step_limit\":[Infinity, Infinity]", KVF_ERR_INVALID_PARAM, "'time_step_limit'"},
        {"\"time_step_limit\":[0.0]", KVF_ERR_INVALID_PARAM, "'time_step_limit' must be a pair"},
        /* time_step_min only initialises dt_bias (transformers 5.25): not read */
        {"\"time_step_min\":NaN", KVF_OK, NULL},
        {"\"time_step_limit\":null", KVF_ERR_UNSUPPORTED, "'time_step_limit' = null"},
        {"\"layer_norm_epsilon\":Infinity", KVF_ERR_INVALID_PARAM,
         "'layer_norm_epsilon' = inf must be a finite"},
        {"\"layer_norm_epsilon\":-Infinity", KVF_ERR_INVALID_PARAM,
         "'layer_norm_epsilon' = -inf must be a finite"},
        {"\"chunk_size\":Infinity", KVF_ERR_INVALID_PARAM, "'chunk_size' must be an integer"},
        {"\"eos_token_id\":NaN", KVF_ERR_INVALID_PARAM, "'eos_token_id' must be an integer"},
        {"\"time_step_limit\":[0.0, Infinit]", KVF_ERR_PARSE, "cfg.json:1:"},
    };
    char json[2048], extra[512], line[1024];
    kvf_model_config_t a, b;
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        kvf_status_t st;
        snprintf(extra, sizeof(extra), "\"hybrid_override_pattern\":\"M*-\",%s", cases[i].extra);
        snprintf(json, sizeof(json), kvf_good_hybrid, extra);
        st = parse_captured(json, line, sizeof(line));
        if ((st != cases[i].status) ||
            ((cases[i].log == NULL) ? (line[0] != '\0') : (strstr(line, cases[i].log) == NULL))) {
            fail_msg("case %zu (%s): status %d, log '%s'", i, cases[i].extra, (int)st, line);
        }
    }
    /* the three spellings of Infinity are one model; 1e+30 is an upper clamp since
     * transformers 5.25 (a prompt's dt never reaches it in practice, but it is another
     * model): another fingerprint */
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*-\","
                                "\"time_step_limit\":[0.0, Infinity]", &a), KVF_OK);
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*-\","
                                "\"time_step_limit\":[0.0,{\"__float__\":\"Infinity\"}]", &b),
                     KVF_OK);
    assert_true(kvf_model_config_fingerprint(&a) == kvf_model_config_fingerprint(&b));
    assert_true(isinf(b.dt_limit_high));
    assert_int_equal(parse_with("\"hybrid_override_pattern\":\"M*-\","
                                "\"time_step_limit\":[0.0, 1e+30]", &b), KVF_OK);
    assert_true(b.dt_limit_high == 1e30);
    assert_true(kvf_model_config_fingerprint(&a) != kvf_model_config_fingerprint(&b));
    /* a truncated file: its line and column, not "not a JSON object" */
    assert_int_equal(parse_captured("{\n  \"model_type\": \"nemotron_h\",\n  \"time_step_limit\""
                                    ": [0.0, Infinity", line, sizeof(line)), KVF_ERR_PARSE);
    if (strstr(line, "cfg.json:3:") == NULL || strstr(line, "end of file") == NULL) {
        fail_msg("truncated: log '%s'", line);
    }
}

/* qwen3_next: Qwen3NextConfig's defaults, the Gated DeltaNet fields as the state layer's
 * geometry (value heads = heads, key heads = groups), and its refusals by name. */
#define KVF_QN_JSON                                                                         \
    "{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"vocab_size\":260,"              \
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_hidden_layers\":8,"         \
    "\"intermediate_size\":96%s}"

static void test_qwen3_next(void **state)
{
    static const struct {
        const char *extra, *field, *value;
    } refused[] = {
        {",\"num_experts\":4,\"num_experts_per_tok\":5", "num_experts_per_tok", "5"},
        {",\"num_experts\":4,\"decoder_sparse_step\":0", "decoder_sparse_step", "0"},
        {",\"num_experts\":0,\"layer_types\":[\"linear_attention\",\"sliding_attention\","
         "\"linear_attention\",\"full_attention\",\"linear_attention\",\"linear_attention\","
         "\"linear_attention\",\"full_attention\"]", "layer_types[1]", "sliding_attention"},
        {",\"num_experts\":0,\"linear_num_key_heads\":3", "linear_num_key_heads", "3"},
        {",\"num_experts\":0,\"hidden_act\":\"swiglu\"", "hidden_act", "swiglu"},
        {",\"num_experts\":0,\"sliding_window\":64", "sliding_window", "qwen3_next"},
        {",\"num_experts\":0,\"partial_rotary_factor\":0.1", "partial_rotary_factor", "0.1"},
        {",\"num_experts\":0,\"mlp_only_layers\":[9]", "mlp_only_layers", "9"},
    };
    kvf_model_config_t c;
    char json[2048], line[1024];
    (void)state;

    /* every 4th layer full (full_attention_interval 4), the class's Gated DeltaNet sizes,
     * head_dim 256, partial rotary 0.25 (64 of 256), (1 + w) norms, q/k norms, output gate */
    snprintf(json, sizeof(json), KVF_QN_JSON, ",\"num_experts\":0");
    assert_int_equal(kvf_model_config_parse(json, "t", &c), KVF_OK);
    assert_int_equal(c.arch, KVF_ARCH_QWEN3_NEXT);
    assert_string_equal(c.layer_kinds, "MMM*MMM*");
    assert_int_equal(c.state_kind, KVF_STATE_GDN);
    assert_int_equal(c.num_mamba_layers, 6);
    assert_int_equal(c.num_moe_layers, 0);
    assert_int_equal(c.mamba_num_heads, 32);     /* linear_num_value_heads */
    assert_int_equal(c.mamba_head_dim, 128);     /* linear_value_head_dim */
    assert_int_equal(c.n_groups, 16);            /* linear_num_key_heads */
    assert_int_equal(c.ssm_state_size, 128);     /* linear_key_head_dim */
    assert_int_equal(c.conv_kernel, 4);
    assert_int_equal(c.head_dim, 256);
    assert_int_equal(c.rope.rotary_dim, 64);
    assert_true(c.rope.theta == 10000.0);
    assert_true(c.norm_offset == 1.0 && c.qk_norm && c.attn_output_gate);
    assert_true(c.dense_mlp_in_layer && c.mlp_gated && !c.use_conv_bias && !c.lm_head_tied);
    assert_true(c.norm_eps == 1e-6);
    /* the class's MoE defaults: every layer sparse (512 experts, top 10, widths 512) */
    snprintf(json, sizeof(json), KVF_QN_JSON, "");
    assert_int_equal(kvf_model_config_parse(json, "t", &c), KVF_OK);
    assert_int_equal(c.num_moe_layers, 8);
    assert_true(c.layer_sparse[0] && c.layer_sparse[7] && kvf_model_layer_has_moe(&c, 3));
    assert_true(c.moe_num_experts == 512 && c.moe_top_k == 10 && c.moe_softmax_topk);
    assert_true(c.moe_intermediate_size == 512 && c.moe_shared_intermediate_size == 512);
    assert_true(c.moe_norm_topk_prob && !c.moe_softmax_full);
    {   /* norm_topk_prob false: the full softmax's entries, and another fingerprint */
        const uint64_t fp = kvf_model_config_fingerprint(&c);
        snprintf(json, sizeof(json), KVF_QN_JSON, ",\"norm_topk_prob\":false");
        assert_int_equal(kvf_model_config_parse(json, "t", &c), KVF_OK);
        assert_true(!c.moe_norm_topk_prob && c.moe_softmax_full && c.moe_softmax_topk);
        assert_true(kvf_model_config_fingerprint(&c) != fp);
    }
    /* decoder_sparse_step 2 and mlp_only_layers [3]: layers 1, 5, 7 sparse */
    snprintf(json, sizeof(json), KVF_QN_JSON, ",\"num_experts\":4,\"decoder_sparse_step\":2,"
             "\"mlp_only_layers\":[3],\"moe_intermediate_size\":8,"
             "\"shared_expert_intermediate_size\":12,\"num_experts_per_tok\":2");
    assert_int_equal(kvf_model_config_parse(json, "t", &c), KVF_OK);
    for (int l = 0; l < 8; ++l) {
        assert_int_equal(c.layer_sparse[l], (l == 1) || (l == 5) || (l == 7));
    }
    assert_true(c.num_moe_layers == 3 && c.intermediate_size == 96 && c.moe_top_k == 2);
    /* layer_types wins; the rope object's partial factor; every layer in mlp_only_layers
     * keeps the dense MLP although num_experts > 0 */
    snprintf(json, sizeof(json), KVF_QN_JSON, ",\"num_experts\":4,\"mlp_only_layers\":"
             "[0,1,2,3,4,5,6,7],\"layer_types\":[\"full_attention\",\"linear_attention\","
             "\"full_attention\",\"linear_attention\",\"full_attention\",\"linear_attention\","
             "\"full_attention\",\"linear_attention\"],\"head_dim\":16,\"linear_num_value_heads\""
             ":4,\"linear_num_key_heads\":2,\"rope_parameters\":{\"rope_type\":\"default\","
             "\"rope_theta\":5000.0,\"partial_rotary_factor\":0.5}");
    assert_int_equal(kvf_model_config_parse(json, "t", &c), KVF_OK);
    assert_string_equal(c.layer_kinds, "*M*M*M*M");
    assert_int_equal(c.rope.rotary_dim, 8);
    assert_true(c.rope.theta == 5000.0);
    assert_int_equal(c.mamba_num_heads, 4);
    assert_int_equal(c.n_groups, 2);
    /* TP 4 of 2 key heads: replicated as B/C groups are; TP 8 of 4 value heads: refused */
    assert_true(kvf_shard_probe(&c, 4));
    assert_false(kvf_shard_probe(&c, 8));
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); ++i) {
        kvf_status_t st;
        snprintf(json, sizeof(json), KVF_QN_JSON, refused[i].extra);
        st = parse_captured(json, line, sizeof(line));
        if ((st == KVF_OK) || (strstr(line, refused[i].field) == NULL) ||
            (strstr(line, refused[i].value) == NULL)) {
            fail_msg("case %zu (%s): status %d, log '%s'", i, refused[i].extra, (int)st, line);
        }
    }
}

/* qwen3_5_text: qwen3_next's layers and geometry, a dense MLP each (no expert fields), the
 * multimodal RoPE keys accepted (plain RoPE for text positions). */
static void test_qwen3_5_text(void **state)
{
    static const char *const refused[] = {
        ",\"num_experts\":4", ",\"decoder_sparse_step\":1", ",\"sliding_window\":64",
    };
    kvf_model_config_t c;
    char json[2048], line[1024];
    const char *base = "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":64,"
                       "\"vocab_size\":260,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                       "\"num_hidden_layers\":4%s}";
    (void)state;

    snprintf(json, sizeof(json), base, ",\"rope_parameters\":{\"rope_type\":\"default\","
             "\"rope_theta\":1e7,\"partial_rotary_factor\":0.25,\"mrope_section\":[11,11,10],"
             "\"mrope_interleaved\":true}");
    assert_int_equal(kvf_model_config_parse(json, "t", &c), KVF_OK);
    assert_int_equal(c.arch, KVF_ARCH_QWEN3_5_TEXT);
    assert_string_equal(c.layer_kinds, "MMM*");
    assert_int_equal(c.state_kind, KVF_STATE_GDN);
    assert_true(c.mamba_num_heads == 32 && c.n_groups == 16 && c.ssm_state_size == 128);
    assert_int_equal(c.intermediate_size, 12288);   /* the class default */
    assert_int_equal(c.num_moe_layers, 0);
    assert_int_equal(c.rope.rotary_dim, 64);
    assert_true(c.rope.theta == 1e7);
    assert_true(c.attn_output_gate && c.qk_norm && (c.norm_offset == 1.0) && c.dense_mlp_in_layer);
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); ++i) {
        snprintf(json, sizeof(json), base, refused[i]);
        if ((parse_captured(json, line, sizeof(line)) == KVF_OK) ||
            (strstr(line, "qwen3_5_text") == NULL)) {
            fail_msg("case %zu (%s): log '%s'", i, refused[i], line);
        }
    }
}

/* The multimodal wrappers (qwen3_5, qwen3_5_moe): text_config parsed as the text model it
 * nests, the wrapper's tie_word_embeddings over the text's, the wrapper's own fields checked,
 * and qwen3_5_moe_text's experts on every layer. */
static void test_qwen3_5_multimodal(void **state)
{
    static const struct {
        const char *json, *field;
    } refused[] = {
        {"{\"model_type\":\"qwen3_5\",\"vision_config\":{}}", "text_config"},
        {"{\"model_type\":\"qwen3_5\",\"text_config\":{\"model_type\":\"qwen3_5_moe_text\"}}",
         "text_config.model_type"},
        {"{\"model_type\":\"qwen3_5\",\"audio_config\":{},\"text_config\":{}}",
         "audio_config"},
        {"{\"model_type\":\"qwen3_5\",\"text_config\":{\"hidden_size\":64,\"vocab_size\":260,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_hidden_layers\":4,"
         "\"num_experts\":4}}", "num_experts"},
        {"{\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":64,\"vocab_size\":260,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_hidden_layers\":4,"
         "\"norm_topk_prob\":false}", "norm_topk_prob"},
    };
    const char *text = "{\"hidden_size\":64,\"vocab_size\":260,\"num_attention_heads\":4,"
                       "\"num_key_value_heads\":2,\"num_hidden_layers\":4,\"eos_token_id\":7,"
                       "\"tie_word_embeddings\":false%s}";
    kvf_model_config_t c;
    char tc[1024], json[2048], line[1024];
    (void)state;

    snprintf(tc, sizeof(tc), text, ",\"intermediate_size\":96");
    snprintf(json, sizeof(json), "{\"model_type\":\"qwen3_5\",\"architectures\":"
             "[\"Qwen3_5ForConditionalGeneration\"],\"tie_word_embeddings\":true,"
             "\"image_token_id\":5,\"vision_config\":{\"depth\":1},\"text_config\":%s}", tc);
    assert_int_equal(kvf_model_config_parse(json, "t", &c), KVF_OK);
    assert_true(c.mm_text && (c.arch == KVF_ARCH_QWEN3_5_TEXT));
    assert_string_equal(c.model_type, "qwen3_5");
    assert_string_equal(c.layer_kinds, "MMM*");
    assert_true(c.intermediate_size == 96 && c.eos_token_id == 7 && c.num_moe_layers == 0);
    assert_true(c.lm_head_tied);   /* the wrapper's flag, not the text_config's */
    /* the MoE wrapper: every layer sparse, the class's defaults, renormalised */
    snprintf(tc, sizeof(tc), text, ",\"num_experts\":8,\"moe_intermediate_size\":16,"
             "\"shared_expert_intermediate_size\":24");
    snprintf(json, sizeof(json), "{\"model_type\":\"qwen3_5_moe\",\"text_config\":%s}", tc);
    assert_int_equal(kvf_model_config_parse(json, "t", &c), KVF_OK);
    assert_true(c.mm_text && !c.lm_head_tied && (c.num_moe_layers == 4));
    assert_true((c.moe_num_experts == 8) && (c.moe_top_k == 8) && c.moe_softmax_topk &&
                !c.moe_softmax_full && (c.moe_intermediate_size == 16));
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); ++i) {
        if ((parse_captured(refused[i].json, line, sizeof(line)) == KVF_OK) ||
            (strstr(line, refused[i].field) == NULL)) {
            fail_msg("case %zu: log '%s'", i, line);
        }
    }
}

/* gemma2: gemma3_text's decoder without q/k norms, one RoPE, alternating layers (sliding
 * first), both softcaps on by default; gemma3_text's own fields refused. */
static void test_gemma2(void **state)
{
    const char *base = "{\"model_type\":\"gemma2\",\"hidden_size\":48,\"vocab_size\":10,"
                       "\"num_attention_heads\":4,\"num_key_value_heads\":1,"
                       "\"num_hidden_layers\":5,\"intermediate_size\":8%s}";
    static const char *const refused[][2] = {
        {",\"rope_local_base_freq\":10000.0", "rope_local_base_freq"},
        {",\"sliding_window_pattern\":2", "sliding_window_pattern"},
        {",\"attn_logit_softcapping\":0", "attn_logit_softcapping"},
    };
    kvf_model_config_t c;
    char json[1024], line[1024];
    (void)state;

    snprintf(json, sizeof(json), base, "");
    assert_int_equal(kvf_model_config_parse(json, "t", &c), KVF_OK);
    assert_int_equal(c.arch, KVF_ARCH_GEMMA2);
    for (int l = 0; l < 5; ++l) {
        assert_int_equal(c.layer_window[l], (l % 2 == 0) ? 4096 : 0);
        assert_false(c.layer_local_rope[l]);
    }
    assert_true((c.attn_softcap == 50.0) && (c.final_softcap == 30.0));
    assert_true(!c.qk_norm && c.post_norms && c.lm_head_tied && (c.norm_offset == 1.0));
    assert_true((c.rope.theta == 10000.0) && (c.attention_multiplier == 1.0 / 16.0));
    assert_int_equal(c.head_dim, 256);
    snprintf(json, sizeof(json), base, ",\"attn_logit_softcapping\":null,"
             "\"final_logit_softcapping\":null,\"sliding_window\":64");
    assert_int_equal(kvf_model_config_parse(json, "t", &c), KVF_OK);
    assert_true((c.attn_softcap == 0.0) && (c.final_softcap == 0.0));
    assert_int_equal(c.layer_window[0], 64);
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); ++i) {
        snprintf(json, sizeof(json), base, refused[i][0]);
        if ((parse_captured(json, line, sizeof(line)) == KVF_OK) ||
            (strstr(line, refused[i][1]) == NULL)) {
            fail_msg("case %zu (%s): log '%s'", i, refused[i][0], line);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_models),
        cmocka_unit_test(test_layers_block_type),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_honoured_fields),
        cmocka_unit_test(test_transformers_semantics),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_ibm_families),
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_qwen3_next),
        cmocka_unit_test(test_qwen3_5_text),
        cmocka_unit_test(test_qwen3_5_multimodal),
        cmocka_unit_test(test_python_json),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
