/*
 * config.json of "gpt_oss" (transformers' GptOssConfig, GptOssForCausalLM: OpenAI's
 * gpt-oss): every layer is an attention layer (sliding_attention or full_attention from
 * layer_types, else alternating from a sliding layer 0) with q/k/v/o biases and a learned
 * sink logit per query head, followed by routed experts (num_local_experts, top
 * num_experts_per_tok by the router's biased logits, weights the softmax of those k
 * logits) whose gate_up projection is interleaved (gate columns even, up columns odd) and
 * biased, with the clamped SwiGLU (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g),
 * g = min(gate, limit). RoPE is YaRN by default (the class's factor 32, beta 32 / 1,
 * truncate false, original 4096, theta 150000).
 *
 * Design: YaRN's attention_factor multiplies cos and sin of q and k alike, so it is folded
 * into the score scale (attention_multiplier = attention_factor^2 / sqrt(head_dim)) and the
 * RoPE kernel stays the one every family runs (equal to transformers' order up to fp32
 * rounding). Rejected: a scaled RoPE kernel (a new argument on every RoPE call, CPU and
 * CUDA, for one family).
 * Refused by name: quantization_config (the MXFP4 checkpoints: kvf_cfg_refusals), a
 * rope_type other than yarn / default, layer_types entries other than the two kinds.
 * Accepted without effect, as transformers 5.25 reads them: hidden_act (the experts use
 * their own SwiGLU), experts_per_token and initial_context_length (OpenAI's names, which
 * transformers never reads), router_aux_loss_coef, output_router_logits.
 */
#include "kvf_model_config_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Every top-level field of its files; NOTE: keep common/model/README.md in step. */
static const char *const kvf_gpt_oss_fields[] = {
    /* read, with an effect */
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "bos_token_id",
    "eos_token_id", "tie_word_embeddings", "dtype", "torch_dtype", "quantization_config",
    "rope_parameters", "rope_scaling", "rope_theta", "attention_bias", "sliding_window",
    "layer_types", "num_local_experts", "num_experts_per_tok", "swiglu_alpha",
    "swiglu_limit", "max_position_embeddings",
    /* known to leave inference unchanged (transformers 5.25 never reads them in the forward) */
    "architectures", "transformers_version", "_name_or_path", "use_cache", "pad_token_id",
    "initializer_range", "attention_dropout", "output_attentions", "output_hidden_states",
    "return_dict", "router_aux_loss_coef", "output_router_logits", "hidden_act",
    "experts_per_token", "initial_context_length",
};

bool kvf_cfg_gpt_oss_known(const char *name)
{
    for (size_t i = 0; i < sizeof(kvf_gpt_oss_fields) / sizeof(kvf_gpt_oss_fields[0]); ++i) {
        if (strcmp(name, kvf_gpt_oss_fields[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* The RoPE object (rope_scaling when set, as transformers 5 standardises it, else
 * rope_parameters), NULL when neither: then the class default (yarn). */
static const cJSON *kvf_gpt_oss_rope_obj(const kvf_cfg_reader_t *rd, const char **field_p)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(rd->root, "rope_scaling");

    *field_p = "rope_scaling";
    if ((rp == NULL) || cJSON_IsNull(rp)) {
        *field_p = "rope_parameters";
        rp = cJSON_GetObjectItemCaseSensitive(rd->root, "rope_parameters");
    }
    return ((rp == NULL) || cJSON_IsNull(rp)) ? NULL : rp;
}

/* YaRN's parameters from @a rp (NULL: the class defaults), as _compute_yarn_parameters. */
static kvf_status_t kvf_gpt_oss_yarn(const kvf_cfg_reader_t *rd, const cJSON *rp,
                                     const char *field, kvf_model_config_t *cfg)
{
    kvf_rope_t *r = &cfg->rope;
    double af, ms, msa, max_pos = (double)cfg->max_position_embeddings;
    const cJSON *tr = (rp != NULL) ? cJSON_GetObjectItemCaseSensitive(rp, "truncate") : NULL;

    r->type = KVF_ROPE_YARN;
    KVF_CFG_TRY(kvf_cfg_num(rd, rp, "factor", 32.0, &r->factor));
    KVF_CFG_TRY(kvf_cfg_num(rd, rp, "beta_fast", 32.0, &r->beta_fast));
    KVF_CFG_TRY(kvf_cfg_num(rd, rp, "beta_slow", 1.0, &r->beta_slow));
    KVF_CFG_TRY(kvf_cfg_num(rd, rp, "original_max_position_embeddings",
                            (rp == NULL) ? 4096.0 : max_pos, &r->original_max_pos));
    KVF_CFG_TRY(kvf_cfg_num(rd, rp, "attention_factor", 0.0, &af));
    KVF_CFG_TRY(kvf_cfg_num(rd, rp, "mscale", 0.0, &ms));
    KVF_CFG_TRY(kvf_cfg_num(rd, rp, "mscale_all_dim", 0.0, &msa));
    /* transformers: "beta or default", so 0 takes the default too */
    r->beta_fast = (r->beta_fast != 0.0) ? r->beta_fast : 32.0;
    r->beta_slow = (r->beta_slow != 0.0) ? r->beta_slow : 1.0;
    r->truncate = (rp == NULL) ? false : true;   /* the class default dict says false */
    if ((tr != NULL) && !cJSON_IsNull(tr)) {
        if (!cJSON_IsBool(tr)) {
            KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s.truncate' must be true or false",
                         field);
        }
        r->truncate = cJSON_IsTrue(tr);
    }
    if (!(r->factor >= 1.0) || !(r->original_max_pos > 0.0)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s' (yarn) needs factor >= 1 and"
                     " original_max_position_embeddings > 0 (got %g, %g)", field, r->factor,
                     r->original_max_pos);
    }
    if (af <= 0.0) {   /* yarn_get_mscale: 0.1 * m * ln(factor) + 1 (1 for factor <= 1) */
        const double lf = (r->factor <= 1.0) ? 0.0 : log(r->factor);
        af = ((ms != 0.0) && (msa != 0.0)) ? (0.1 * ms * lf + 1.0) / (0.1 * msa * lf + 1.0) :
             0.1 * lf + 1.0;
    }
    r->attention_factor = af;
    return KVF_OK;
}

/* RoPE: yarn (the default) or default, theta from the object or rope_theta (150000). */
static kvf_status_t kvf_gpt_oss_rope(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    static const char *const allowed[] = {
        "rope_type", "type", "rope_theta", "factor", "beta_fast", "beta_slow", "truncate",
        "original_max_position_embeddings", "attention_factor", "mscale", "mscale_all_dim",
    };
    const char *field;
    const cJSON *rp = kvf_gpt_oss_rope_obj(rd, &field);
    const cJSON *type = NULL;
    double top_theta;

    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, "rope_theta", 150000.0, &top_theta));
    if ((rp != NULL) && !cJSON_IsObject(rp)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s' must be an object", field);
    }
    KVF_CFG_TRY(kvf_cfg_keys_known(rd, rp, field, allowed,
                                   sizeof(allowed) / sizeof(allowed[0]), " for gpt_oss"));
    if (rp != NULL) {
        type = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
        type = (type != NULL) ? type : cJSON_GetObjectItemCaseSensitive(rp, "type");
    }
    if ((type != NULL) && !cJSON_IsString(type)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s.rope_type' must be a string", field);
    }
    cfg->rope.attention_factor = 1.0;
    cfg->rope.factor = 1.0;
    if ((rp == NULL) || ((type != NULL) && (strcmp(type->valuestring, "yarn") == 0))) {
        KVF_CFG_TRY(kvf_gpt_oss_yarn(rd, rp, field, cfg));
    } else if ((type == NULL) || (strcmp(type->valuestring, "default") == 0)) {
        cfg->rope.type = KVF_ROPE_DEFAULT;
    } else {
        KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field '%s.rope_type' = '%s' is not implemented for"
                     " gpt_oss (yarn, default): refused", field, type->valuestring);
    }
    KVF_CFG_TRY(kvf_cfg_num(rd, rp, "rope_theta", top_theta, &cfg->rope.theta));
    if (!(cfg->rope.theta > 0.0) || (cfg->head_dim % 2 != 0)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "RoPE needs rope_theta = %g > 0 and an even"
                     " head_dim = %d", cfg->rope.theta, cfg->head_dim);
    }
    cfg->rope.rotary_dim = cfg->head_dim;
    return KVF_OK;
}

/* layer_types (default: sliding, full, sliding, ... from layer 0) into @a sliding. */
static kvf_status_t kvf_gpt_oss_layer_types(const kvf_cfg_reader_t *rd,
                                            const kvf_model_config_t *cfg, bool *sliding)
{
    kvf_status_t status = kvf_cfg_layer_types(rd, cfg, "sliding_attention", "full_attention",
                                              sliding);

    if (status == KVF_ERR_NOT_FOUND) {
        for (int l = 0; l < cfg->num_layers; ++l) {
            sliding[l] = ((l + 1) % 2) != 0;   /* GptOssConfig's default layer_types */
        }
        return KVF_OK;
    }
    return status;
}

/* The experts: num_local_experts (128), num_experts_per_tok (4), intermediate_size, the
 * SwiGLU's alpha and limit. */
static kvf_status_t kvf_gpt_oss_experts(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "num_local_experts", 128, &cfg->moe_num_experts));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "num_experts_per_tok", 4, &cfg->moe_top_k));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "intermediate_size", 2880, &cfg->moe_intermediate_size));
    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, "swiglu_alpha", 1.702, &cfg->swiglu_alpha));
    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, "swiglu_limit", 7.0, &cfg->swiglu_limit));
    if ((cfg->moe_num_experts < 1) || (cfg->moe_num_experts > 1024)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'num_local_experts' = %d must be in"
                     " [1, 1024]", cfg->moe_num_experts);
    }
    if ((cfg->moe_top_k < 1) || (cfg->moe_top_k > cfg->moe_num_experts)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'num_experts_per_tok' = %d must be in"
                     " [1, num_local_experts = %d]", cfg->moe_top_k, cfg->moe_num_experts);
    }
    if (cfg->moe_intermediate_size < 1) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'intermediate_size' = %d must be"
                     " positive", cfg->moe_intermediate_size);
    }
    if (!(cfg->swiglu_limit > 0.0)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'swiglu_limit' = %g must be positive",
                     cfg->swiglu_limit);
    }
    cfg->intermediate_size = 0;           /* no dense MLP: the FFN is the experts */
    cfg->moe_shared_intermediate_size = 0;
    cfg->moe_n_group = cfg->moe_topk_group = 1;
    cfg->moe_routed_scaling = 1.0;
    cfg->moe_softmax_topk = true;
    cfg->moe_gated = true;
    cfg->moe_swiglu_clamp = true;
    cfg->router_bias = true;
    cfg->moe_in_layer = true;
    cfg->num_moe_layers = cfg->num_layers;
    return KVF_OK;
}

kvf_status_t kvf_cfg_parse_gpt_oss(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    bool sliding[KVF_MAX_LAYERS] = {false};
    bool any_sliding = false;
    double af;

    KVF_CFG_TRY(kvf_cfg_num_layers(rd, cfg));
    if (!kvf_cfg_present(rd, "head_dim")) {
        cfg->head_dim = 64;   /* the class default, not hidden / heads */
    }
    if (!kvf_cfg_present(rd, "rms_norm_eps")) {
        cfg->norm_eps = 1e-5;
    }
    if (!kvf_cfg_present(rd, "max_position_embeddings")) {
        cfg->max_position_embeddings = 131072;
    }
    KVF_CFG_TRY(kvf_cfg_bool(rd, "attention_bias", true, &cfg->attn_bias));
    KVF_CFG_TRY(kvf_gpt_oss_experts(rd, cfg));
    KVF_CFG_TRY(kvf_gpt_oss_layer_types(rd, cfg, sliding));
    for (int l = 0; l < cfg->num_layers; ++l) {
        any_sliding = any_sliding || sliding[l];
    }
    KVF_CFG_TRY(kvf_cfg_window(rd, cfg, 128, any_sliding));
    for (int l = 0; l < cfg->num_layers; ++l) {
        cfg->layer_window[l] = sliding[l] ? cfg->sliding_window : 0;
    }
    KVF_CFG_TRY(kvf_gpt_oss_rope(rd, cfg));
    af = cfg->rope.attention_factor;
    cfg->attention_multiplier = af * af / sqrt((double)cfg->head_dim);
    cfg->attn_sinks = true;
    kvf_cfg_all_attention(cfg);
    return KVF_OK;
}
