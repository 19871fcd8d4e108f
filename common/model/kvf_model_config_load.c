/*
 * config.json from text, a file or a model folder (through kvf_json, which reads
 * Python's Infinity/NaN), and the config fingerprint (the field parser is
 * kvf_model_config.c).
 */
#include "kvf_model_config.h"
#include "kvf_hash.h"
#include "kvf_json.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a config.json is kilobytes; a larger file is not one */
#define KVF_MODEL_CONFIG_MAX_BYTES ((size_t)16 << 20)

kvf_status_t kvf_model_config_parse(const char *json, const char *origin,
                                    kvf_model_config_t *cfg_p)
{
    cJSON *root;
    kvf_status_t status;

    origin = (origin != NULL) ? origin : "config.json";
    status = kvf_json_parse(json, strlen(json), origin, &root);
    if (status == KVF_OK) {
        status = kvf_model_config_from_json(root, origin, cfg_p);
        cJSON_Delete(root);
    }
    return status;
}

kvf_status_t kvf_model_config_load(const char *path, kvf_model_config_t *cfg_p)
{
    char file[4096];
    cJSON *root;
    kvf_status_t status;

    status = kvf_json_load_config(path, KVF_MODEL_CONFIG_MAX_BYTES, file, sizeof(file), &root);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_model_config_from_json(root, file, cfg_p);
    cJSON_Delete(root);
    return status;
}

uint64_t kvf_model_config_fingerprint(const kvf_model_config_t *cfg)
{
    const int fields[] = {
        (int)cfg->arch, cfg->hidden_size, cfg->num_layers, cfg->vocab_size,
        cfg->num_attention_heads, cfg->num_key_value_heads, cfg->head_dim,
        cfg->intermediate_size, cfg->mamba_num_heads, cfg->mamba_head_dim,
        cfg->ssm_state_size, cfg->n_groups, cfg->conv_kernel,
        /* the forward's math: two instances must compute the same model */
        (int)cfg->mlp_act, (int)cfg->mamba_act, cfg->mlp_bias, cfg->attn_bias,
        cfg->mamba_proj_bias, cfg->use_conv_bias, cfg->qk_norm, cfg->lm_head_tied,
        (int)cfg->rope.type, cfg->moe_num_experts, cfg->moe_top_k,
        cfg->moe_intermediate_size, cfg->moe_shared_intermediate_size, cfg->moe_n_group,
        cfg->moe_topk_group, cfg->moe_norm_topk_prob,
    };
    const double reals[] = {
        cfg->norm_eps, cfg->dt_limit_low, cfg->moe_routed_scaling, cfg->rope.theta,
        cfg->rope.factor, cfg->rope.low_freq_factor, cfg->rope.high_freq_factor,
        cfg->rope.original_max_pos, cfg->dt_limit_high,
    };
    uint64_t h = 0;

    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); ++i) {
        int32_t v = fields[i];   /* fixed width: the fingerprint crosses hosts */
        h = kvf_hash64(&v, sizeof(v), h);
    }
    for (size_t i = 0; i < sizeof(reals) / sizeof(reals[0]); ++i) {
        uint64_t bits;           /* IEEE-754 bits, little-endian hosts */
        memcpy(&bits, &reals[i], sizeof(bits));
        h = kvf_hash64(&bits, sizeof(bits), h);
    }
    if ((cfg->arch == KVF_ARCH_BAMBA) || (cfg->arch == KVF_ARCH_GRANITE_MOE_HYBRID)) {
        /* only these families': the fingerprints of the others stay what they were */
        const int32_t more[] = {cfg->rope.rotary_dim, cfg->moe_in_layer, cfg->moe_softmax_topk,
                                cfg->moe_gated, cfg->dense_mlp_in_layer};
        const double mreals[] = {cfg->embedding_multiplier, cfg->residual_multiplier,
                                 cfg->logits_scaling, cfg->attention_multiplier};
        h = kvf_hash64(more, sizeof(more), h);
        for (size_t i = 0; i < sizeof(mreals) / sizeof(mreals[0]); ++i) {
            uint64_t bits;
            memcpy(&bits, &mreals[i], sizeof(bits));
            h = kvf_hash64(&bits, sizeof(bits), h);
        }
    }
    if ((cfg->attn_softcap > 0.0) || (cfg->final_softcap > 0.0)) {
        /* only when set: the fingerprints of the files without them stay what they were */
        const double c[] = {cfg->attn_softcap, cfg->final_softcap};
        h = kvf_hash64(c, sizeof(c), h);
    }
    if ((cfg->arch == KVF_ARCH_GEMMA3_TEXT) || (cfg->arch == KVF_ARCH_GEMMA2)) {
        const double g[] = {cfg->embedding_multiplier, cfg->attention_multiplier,
                            cfg->norm_offset, cfg->post_norms, (double)cfg->rope_local.type,
                            cfg->rope_local.theta, cfg->rope_local.factor,
                            cfg->rope_local.low_freq_factor, cfg->rope_local.high_freq_factor,
                            cfg->rope_local.original_max_pos};
        for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); ++i) {
            uint64_t bits;
            memcpy(&bits, &g[i], sizeof(bits));
            h = kvf_hash64(&bits, sizeof(bits), h);
        }
        for (int l = 0; l < cfg->num_layers; ++l) {
            int32_t w = cfg->layer_window[l] * 2 + cfg->layer_local_rope[l];
            h = kvf_hash64(&w, sizeof(w), h);
        }
    }
    if (cfg->arch == KVF_ARCH_GPT_OSS) {
        const double g[] = {cfg->attention_multiplier, cfg->rope.beta_fast, cfg->rope.beta_slow,
                            cfg->rope.truncate, cfg->rope.attention_factor, cfg->swiglu_alpha,
                            cfg->swiglu_limit, cfg->attn_sinks, cfg->router_bias,
                            cfg->moe_swiglu_clamp, cfg->moe_softmax_topk};
        for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); ++i) {
            uint64_t bits;
            memcpy(&bits, &g[i], sizeof(bits));
            h = kvf_hash64(&bits, sizeof(bits), h);
        }
        for (int l = 0; l < cfg->num_layers; ++l) {
            int32_t w = cfg->layer_window[l];
            h = kvf_hash64(&w, sizeof(w), h);
        }
    }
    if ((cfg->arch == KVF_ARCH_QWEN3_NEXT) || (cfg->arch == KVF_ARCH_QWEN3_5_TEXT)) {
        const int32_t q[] = {(int32_t)cfg->state_kind, cfg->attn_output_gate,
                             cfg->rope.rotary_dim, cfg->dense_mlp_in_layer,
                             (int32_t)cfg->norm_offset, cfg->moe_softmax_topk, cfg->moe_gated};
        h = kvf_hash64(q, sizeof(q), h);
        for (int l = 0; l < cfg->num_layers; ++l) {
            int32_t sp = cfg->layer_sparse[l];
            h = kvf_hash64(&sp, sizeof(sp), h);
        }
    }
    return kvf_hash64(cfg->layer_kinds, (size_t)cfg->num_layers, h);
}
