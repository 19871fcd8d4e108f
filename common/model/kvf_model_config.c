/*
 * config.json -> kvf_model_config_t with cJSON (field readers: kvf_model_config_read.c).
 *
 * Design: every field is read through one of three helpers that log the
 * field name on failure, so an operator sees which field is missing or bad.
 * Consistency checks (divisibility, pattern length) run after all fields are
 * read. Hugging Face defaults are applied where the HF class has one (e.g.
 * use_conv_bias = true, mamba_ssm_cache_dtype = float32).
 */
#include "kvf_model_config.h"
#include "kvf_model_config_int.h"
#include "kvf_json.h"
#include "kvf_log.h"
#include "kvf_act_math.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Layer pattern: hybrid_override_pattern string or layers_block_type list. */
static kvf_status_t kvf_cfg_pattern(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(rd->root, "hybrid_override_pattern");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(rd->root, "layers_block_type");
    int n = 0;

    if (cJSON_IsString(pat)) {
        const char *s = pat->valuestring;
        for (; s[n] != '\0'; ++n) {
            if (n >= KVF_MAX_LAYERS) {
                kvf_error("%s: field 'hybrid_override_pattern' has more than %d layers",
                          rd->origin, KVF_MAX_LAYERS);
                return KVF_ERR_INVALID_PARAM;
            }
            if (strchr("M*-E", s[n]) == NULL) {
                kvf_error("%s: field 'hybrid_override_pattern' has unknown letter '%c' at %d"
                          " (expected M, *, - or E)", rd->origin, s[n], n);
                return KVF_ERR_INVALID_PARAM;
            }
            cfg->layer_kinds[n] = s[n];
        }
    } else if (cJSON_IsArray(list)) {
        /* transformers 5 writes linear_attention / full_attention; older files
         * (and NVIDIA's remote code) mamba / attention */
        static const struct { const char *name; char letter; } kinds[] = {
            {"mamba", 'M'}, {"linear_attention", 'M'}, {"attention", '*'},
            {"full_attention", '*'}, {"mlp", '-'}, {"moe", 'E'},
        };
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            char letter = 0;
            if (n >= KVF_MAX_LAYERS) {
                kvf_error("%s: field 'layers_block_type' has more than %d layers",
                          rd->origin, KVF_MAX_LAYERS);
                return KVF_ERR_INVALID_PARAM;
            }
            for (size_t k = 0; cJSON_IsString(it) && (k < sizeof(kinds) / sizeof(kinds[0])); ++k) {
                if (strcmp(it->valuestring, kinds[k].name) == 0) {
                    letter = kinds[k].letter;
                }
            }
            if (letter == 0) {
                kvf_error("%s: field 'layers_block_type' entry %d = '%s' is not one of"
                          " linear_attention, full_attention, mamba, attention, mlp, moe",
                          rd->origin, n, cJSON_IsString(it) ? it->valuestring : "?");
                return KVF_ERR_INVALID_PARAM;
            }
            cfg->layer_kinds[n++] = letter;
        }
    } else {
        kvf_error("%s: missing field 'hybrid_override_pattern' (or 'layers_block_type')",
                  rd->origin);
        return KVF_ERR_INVALID_PARAM;
    }
    if (n == 0) {
        kvf_error("%s: field 'hybrid_override_pattern' is empty", rd->origin);
        return KVF_ERR_INVALID_PARAM;
    }
    cfg->layer_kinds[n] = '\0';
    cfg->num_layers = n;
    return KVF_OK;
}

#define KVF_TRY(_expr)                 \
    do {                               \
        status = (_expr);              \
        if (status != KVF_OK) {        \
            goto out;                  \
        }                              \
    } while (0)

#define KVF_FAIL(_status, _fmt, ...)                        \
    do {                                                    \
        kvf_error("%s: " _fmt, rd.origin, ##__VA_ARGS__);   \
        status = (_status);                                 \
        goto out;                                           \
    } while (0)

/* ---- the fields kvferry knows ------------------------------------------------ */

#define KVF_A_NH  (1u << KVF_ARCH_NEMOTRON_H)
#define KVF_A_LL  (1u << KVF_ARCH_LLAMA)
#define KVF_A_QW  (1u << KVF_ARCH_QWEN3)
#define KVF_A_MI  (1u << KVF_ARCH_MISTRAL)
#define KVF_A_DENSE (KVF_A_LL | KVF_A_QW | KVF_A_MI)
#define KVF_A_ALL (KVF_A_NH | KVF_A_DENSE)

/*
 * Every top-level config.json field kvferry accepts, per model_type. A field
 * outside this list is refused: kvferry cannot know that it leaves the math
 * alone. Fields read with an effect are parsed below; the rest are listed
 * here because they provably do not change inference (training, init,
 * bookkeeping or generation defaults; see common/model/README.md).
 * NOTE: keep common/model/README.md's table in step with this list.
 */
static const struct {
    const char *name;
    unsigned    archs;
} kvf_known_fields[] = {
    /* read, with an effect */
    {"model_type", KVF_A_ALL}, {"hidden_size", KVF_A_ALL}, {"vocab_size", KVF_A_ALL},
    {"num_attention_heads", KVF_A_ALL}, {"num_key_value_heads", KVF_A_ALL},
    {"head_dim", KVF_A_ALL}, {"intermediate_size", KVF_A_ALL},
    {"num_hidden_layers", KVF_A_ALL}, {"bos_token_id", KVF_A_ALL}, {"eos_token_id", KVF_A_ALL},
    {"tie_word_embeddings", KVF_A_ALL}, {"dtype", KVF_A_ALL}, {"torch_dtype", KVF_A_ALL},
    {"layer_norm_epsilon", KVF_A_NH}, {"rms_norm_eps", KVF_A_ALL},
    {"sliding_window", KVF_A_NH | KVF_A_QW | KVF_A_MI}, {"quantization_config", KVF_A_ALL},
    {"hybrid_override_pattern", KVF_A_NH}, {"layers_block_type", KVF_A_NH},
    {"mamba_num_heads", KVF_A_NH}, {"mamba_head_dim", KVF_A_NH}, {"ssm_state_size", KVF_A_NH},
    {"n_groups", KVF_A_NH}, {"mamba_n_groups", KVF_A_NH}, {"conv_kernel", KVF_A_NH},
    {"mamba_d_conv", KVF_A_NH}, {"chunk_size", KVF_A_NH}, {"mamba_chunk_size", KVF_A_NH},
    {"use_conv_bias", KVF_A_NH}, {"mamba_conv_bias", KVF_A_NH}, {"use_bias", KVF_A_NH},
    {"mamba_hidden_act", KVF_A_NH}, {"mlp_hidden_act", KVF_A_NH},
    {"mlp_bias", KVF_A_NH | KVF_A_LL}, {"time_step_min", KVF_A_NH}, {"mamba_dt_min", KVF_A_NH},
    {"mamba_ssm_cache_dtype", KVF_A_NH}, {"n_routed_experts", KVF_A_NH},
    {"num_local_experts", KVF_A_NH},
    {"num_experts_per_tok", KVF_A_NH}, {"moe_intermediate_size", KVF_A_NH},
    {"moe_shared_expert_intermediate_size", KVF_A_NH}, {"moe_latent_size", KVF_A_NH},
    {"n_group", KVF_A_NH}, {"topk_group", KVF_A_NH}, {"norm_topk_prob", KVF_A_NH},
    {"routed_scaling_factor", KVF_A_NH}, {"hidden_act", KVF_A_DENSE},
    {"attention_bias", KVF_A_NH | KVF_A_LL | KVF_A_QW}, {"rope_parameters", KVF_A_DENSE},
    {"rope_scaling", KVF_A_DENSE}, {"rope_theta", KVF_A_ALL},
    {"partial_rotary_factor", KVF_A_ALL}, {"layer_types", KVF_A_QW},
    {"use_sliding_window", KVF_A_QW}, {"max_window_layers", KVF_A_QW},
    /* known to leave inference unchanged */
    {"architectures", KVF_A_ALL}, {"auto_map", KVF_A_ALL}, {"transformers_version", KVF_A_ALL},
    {"_name_or_path", KVF_A_ALL}, {"use_cache", KVF_A_ALL}, {"pad_token_id", KVF_A_ALL},
    {"initializer_range", KVF_A_ALL}, {"max_position_embeddings", KVF_A_ALL},
    {"attention_dropout", KVF_A_ALL}, {"hidden_dropout", KVF_A_NH},
    {"output_attentions", KVF_A_ALL}, {"output_hidden_states", KVF_A_ALL},
    {"return_dict", KVF_A_ALL}, {"num_logits_to_keep", KVF_A_NH},
    {"residual_in_fp32", KVF_A_NH}, {"rescale_prenorm_residual", KVF_A_NH},
    {"time_step_max", KVF_A_NH}, {"time_step_floor", KVF_A_NH}, {"time_step_limit", KVF_A_NH},
    {"mamba_dt_max", KVF_A_NH}, {"mamba_dt_init_floor", KVF_A_NH}, {"mamba_dt_limit", KVF_A_NH},
    {"use_mamba_kernels", KVF_A_NH}, {"expand", KVF_A_NH}, {"mamba_expand", KVF_A_NH},
    {"mamba_proj_bias", KVF_A_NH}, {"n_shared_experts", KVF_A_NH},
    {"moe_shared_expert_overlap", KVF_A_NH}, {"output_router_logits", KVF_A_NH},
    {"router_aux_loss_coef", KVF_A_NH},
    {"num_nextn_predict_layers", KVF_A_NH}, {"mtp_layers_block_type", KVF_A_NH},
    {"mtp_hybrid_override_pattern", KVF_A_NH}, {"pretraining_tp", KVF_A_LL},
    /* nemotron_h: written by NVIDIA's checkpoints, unused by its attention (no RoPE)
     * and its norms (layer_norm_epsilon) */
    {"norm_eps", KVF_A_NH},
};

static kvf_status_t kvf_cfg_known(const kvf_cfg_reader_t *rd, kvf_arch_t arch,
                                  const char *model_type)
{
    const cJSON *it;

    cJSON_ArrayForEach(it, rd->root) {
        bool known = false;
        bool ibm = (arch == KVF_ARCH_BAMBA) || (arch == KVF_ARCH_GRANITE_MOE_HYBRID);
        /* own tables: _ibm.c, _gemma.c, _gpt_oss.c, _qwen3_next.c */
        bool gem = (arch == KVF_ARCH_GEMMA3_TEXT) || (arch == KVF_ARCH_GEMMA2);
        bool oss = (arch == KVF_ARCH_GPT_OSS);
        bool qn = (arch == KVF_ARCH_QWEN3_NEXT) || (arch == KVF_ARCH_QWEN3_5_TEXT);
        known = oss ? kvf_cfg_gpt_oss_known(it->string) :
                qn ? kvf_cfg_qwen3_next_known(it->string, model_type) :
                gem ? kvf_cfg_gemma_known(it->string, arch) :
                (ibm && kvf_cfg_ibm_known(it->string, arch));
        ibm = ibm || qn || oss;
        for (size_t i = 0; !ibm && !gem && (i < sizeof(kvf_known_fields) / sizeof(kvf_known_fields[0]));
             ++i) {
            if ((strcmp(it->string, kvf_known_fields[i].name) == 0) &&
                (kvf_known_fields[i].archs & (1u << arch))) {
                known = true;
                break;
            }
        }
        if (!known) {
            kvf_error("%s: field '%s' is not known to kvferry for model_type '%s' and may change"
                      " the model: refused (see common/model/README.md)", rd->origin, it->string,
                      model_type);
            return KVF_ERR_UNSUPPORTED;
        }
    }
    return KVF_OK;
}

/* RoPE: rope_parameters (transformers 5) or rope_scaling + rope_theta (older files). */
kvf_status_t kvf_cfg_rope(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    static const char *const allowed[] = {
        "rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
        "original_max_position_embeddings", "partial_rotary_factor",
    };
    /* transformers 5 takes rope_scaling over rope_parameters when a file has both */
    const char *field = "rope_scaling";
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(rd->root, field);
    const cJSON *type;
    kvf_rope_t *r = &cfg->rope;
    double top_theta, partial, top_partial, max_pos;
    kvf_status_t status;

    if ((rp == NULL) || cJSON_IsNull(rp)) {
        field = "rope_parameters";
        rp = cJSON_GetObjectItemCaseSensitive(rd->root, field);
    }
    status = kvf_cfg_num(rd, rd->root, "rope_theta", 10000.0, &top_theta);
    if (status == KVF_OK) {
        status = kvf_cfg_num(rd, rd->root, "partial_rotary_factor", 1.0, &top_partial);
    }
    if (status == KVF_OK) {
        status = kvf_cfg_num(rd, rd->root, "max_position_embeddings", 0.0, &max_pos);
    }
    if (status != KVF_OK) {
        return status;
    }
    r->type = KVF_ROPE_DEFAULT;
    r->theta = top_theta;
    r->factor = 1.0;
    partial = top_partial;
    if ((rp != NULL) && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp)) {
            kvf_error("%s: field '%s' must be an object", rd->origin, field);
            return KVF_ERR_INVALID_PARAM;
        }
        KVF_CFG_TRY(kvf_cfg_keys_known(rd, rp, field, allowed,
                                       sizeof(allowed) / sizeof(allowed[0]), ""));
        type = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
        if (type == NULL) {
            type = cJSON_GetObjectItemCaseSensitive(rp, "type");
        }
        if ((type != NULL) && !cJSON_IsString(type)) {
            kvf_error("%s: field '%s.rope_type' must be a string", rd->origin, field);
            return KVF_ERR_INVALID_PARAM;
        }
        if ((type == NULL) || (strcmp(type->valuestring, "default") == 0)) {
            r->type = KVF_ROPE_DEFAULT;
        } else if (strcmp(type->valuestring, "linear") == 0) {
            r->type = KVF_ROPE_LINEAR;
        } else if (strcmp(type->valuestring, "llama3") == 0) {
            r->type = KVF_ROPE_LLAMA3;
        } else {
            kvf_error("%s: field '%s.rope_type' = '%s' is not implemented (default, linear,"
                      " llama3): refused", rd->origin, field, type->valuestring);
            return KVF_ERR_UNSUPPORTED;
        }
        if ((status = kvf_cfg_num(rd, rp, "rope_theta", top_theta, &r->theta)) != KVF_OK ||
            (status = kvf_cfg_num(rd, rp, "partial_rotary_factor", top_partial, &partial)) != KVF_OK ||
            (status = kvf_cfg_num(rd, rp, "factor", 0.0, &r->factor)) != KVF_OK ||
            (status = kvf_cfg_num(rd, rp, "low_freq_factor", 0.0, &r->low_freq_factor)) != KVF_OK ||
            (status = kvf_cfg_num(rd, rp, "high_freq_factor", 0.0, &r->high_freq_factor)) != KVF_OK ||
            (status = kvf_cfg_num(rd, rp, "original_max_position_embeddings", max_pos,
                                  &r->original_max_pos)) != KVF_OK) {
            return status;
        }
        if ((r->type != KVF_ROPE_DEFAULT) && !(r->factor > 0.0)) {
            kvf_error("%s: field '%s.factor' = %g must be positive for rope_type '%s'",
                      rd->origin, field, r->factor, type->valuestring);
            return KVF_ERR_INVALID_PARAM;
        }
        if ((r->type == KVF_ROPE_LLAMA3) &&
            (!(r->low_freq_factor > 0.0) || !(r->high_freq_factor > r->low_freq_factor) ||
             !(r->original_max_pos > 0.0))) {
            kvf_error("%s: field '%s' (llama3) needs low_freq_factor > 0, high_freq_factor >"
                      " low_freq_factor and original_max_position_embeddings > 0 (got %g, %g,"
                      " %g)", rd->origin, field, r->low_freq_factor, r->high_freq_factor,
                      r->original_max_pos);
            return KVF_ERR_INVALID_PARAM;
        }
        if (r->type == KVF_ROPE_DEFAULT) {
            r->factor = 1.0;
        }
    }
    if ((partial != 1.0) && (cfg->arch != KVF_ARCH_BAMBA) &&   /* their parsers' */
        (cfg->arch != KVF_ARCH_QWEN3_NEXT) && (cfg->arch != KVF_ARCH_QWEN3_5_TEXT)) {
        kvf_error("%s: field 'partial_rotary_factor' = %g is not implemented (only 1): refused",
                  rd->origin, partial);
        return KVF_ERR_UNSUPPORTED;
    }
    r->rotary_dim = cfg->head_dim;
    if (!(r->theta > 0.0)) {
        kvf_error("%s: field 'rope_theta' = %g must be positive", rd->origin, r->theta);
        return KVF_ERR_INVALID_PARAM;
    }
    if (cfg->head_dim % 2 != 0) {
        kvf_error("%s: field 'head_dim' = %d must be even for RoPE", rd->origin, cfg->head_dim);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* Mixture-of-experts fields ('E' layers). */
static kvf_status_t kvf_cfg_moe(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    kvf_status_t status;
    double scale;

    if ((status = kvf_cfg_int(rd, kvf_cfg_alias(rd, "n_routed_experts", "num_local_experts"),
                              &cfg->moe_num_experts)) != KVF_OK ||
        (status = kvf_cfg_int(rd, "num_experts_per_tok", &cfg->moe_top_k)) != KVF_OK ||
        (status = kvf_cfg_int(rd, "moe_intermediate_size", &cfg->moe_intermediate_size)) != KVF_OK ||
        (status = kvf_cfg_int(rd, "moe_shared_expert_intermediate_size",
                              &cfg->moe_shared_intermediate_size)) != KVF_OK ||
        (status = kvf_cfg_int_opt(rd, "n_group", 1, &cfg->moe_n_group)) != KVF_OK ||
        (status = kvf_cfg_int_opt(rd, "topk_group", 1, &cfg->moe_topk_group)) != KVF_OK ||
        (status = kvf_cfg_bool(rd, "norm_topk_prob", true, &cfg->moe_norm_topk_prob)) != KVF_OK ||
        (status = kvf_cfg_num(rd, rd->root, "routed_scaling_factor", 1.0, &scale)) != KVF_OK) {
        return status;
    }
    cfg->moe_routed_scaling = scale;
    if (kvf_cfg_present(rd, "moe_latent_size")) {
        kvf_error("%s: field 'moe_latent_size' = %g is not implemented (only null): refused",
                  rd->origin, cJSON_GetObjectItemCaseSensitive(rd->root, "moe_latent_size")->valuedouble);
        return KVF_ERR_UNSUPPORTED;
    }
    if (cfg->moe_num_experts > 1024) {
        kvf_error("%s: field 'n_routed_experts' = %d exceeds 1024", rd->origin,
                  cfg->moe_num_experts);
        return KVF_ERR_UNSUPPORTED;
    }
    if (cfg->moe_top_k > cfg->moe_num_experts) {
        kvf_error("%s: field 'num_experts_per_tok' = %d exceeds n_routed_experts = %d",
                  rd->origin, cfg->moe_top_k, cfg->moe_num_experts);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((cfg->moe_n_group < 1) || (cfg->moe_num_experts % cfg->moe_n_group != 0) ||
        (cfg->moe_num_experts / cfg->moe_n_group < 2)) {
        kvf_error("%s: field 'n_group' = %d must divide n_routed_experts = %d into groups of at"
                  " least 2", rd->origin, cfg->moe_n_group, cfg->moe_num_experts);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((cfg->moe_topk_group < 1) || (cfg->moe_topk_group > cfg->moe_n_group) ||
        (cfg->moe_topk_group * (cfg->moe_num_experts / cfg->moe_n_group) <
         cfg->moe_top_k)) {
        kvf_error("%s: field 'topk_group' = %d must be in [1, n_group = %d] and leave at least"
                  " num_experts_per_tok = %d experts", rd->origin, cfg->moe_topk_group,
                  cfg->moe_n_group, cfg->moe_top_k);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* Fields refused whatever the model: kvferry computes neither. */
static kvf_status_t kvf_cfg_refusals(const kvf_cfg_reader_t *rd, const kvf_model_config_t *cfg)
{
    const cJSON *item;
    char val[128];

    item = cJSON_GetObjectItemCaseSensitive(rd->root, "quantization_config");
    if ((item != NULL) && !cJSON_IsNull(item)) {
        kvf_cfg_value_str(item, val, sizeof(val));
        KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field 'quantization_config' = %s is not implemented"
                     " (unquantized checkpoints only): refused", val);
    }
    (void)cfg;
    return KVF_OK;
}

/*
 * sliding_window -> cfg->sliding_window: @a absent when the field is missing
 * (transformers' class default), 0 when null or when it does not @a apply
 * (qwen3 without use_sliding_window or without a sliding layer), and 0 too
 * when it cannot bind: at least max_position_embeddings. A window that binds
 * is kept; the caller marks the layers it applies to (cfg->layer_window).
 */
kvf_status_t kvf_cfg_window(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg, int absent,
                            bool apply)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, "sliding_window");
    int w = absent;

    if ((item != NULL) && !cJSON_IsNull(item)) {
        KVF_CFG_TRY(kvf_cfg_int(rd, "sliding_window", &w));
    } else if (item != NULL) {
        w = 0;
    }
    if (!apply || ((cfg->max_position_embeddings > 0) && (w >= cfg->max_position_embeddings))) {
        w = 0;
    }
    if (w < 0) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'sliding_window' = %d must be positive or"
                     " null", w);
    }
    cfg->sliding_window = w;
    return KVF_OK;
}

/* eos_token_id: one id or a list (transformers stops on any): every id in range. */
static kvf_status_t kvf_cfg_eos_list(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, "eos_token_id");
    const cJSON *it;

    cfg->num_eos = 0;
    if ((item == NULL) || cJSON_IsNull(item)) {
        return KVF_OK;
    }
    if (!cJSON_IsArray(item)) {
        cfg->eos_token_ids[cfg->num_eos++] = cfg->eos_token_id;
        return KVF_OK;
    }
    if (cJSON_GetArraySize(item) > KVF_MAX_EOS) {
        KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field 'eos_token_id' lists %d ids, more than %d",
                     cJSON_GetArraySize(item), KVF_MAX_EOS);
    }
    cJSON_ArrayForEach(it, item) {
        if (!cJSON_IsNumber(it) || (it->valuedouble < 0) ||
            (it->valuedouble != (double)(int)it->valuedouble)) {
            KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'eos_token_id' entry %d must be a"
                         " non-negative integer", cfg->num_eos);
        }
        if ((int)it->valuedouble >= cfg->vocab_size) {
            KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'eos_token_id' entry %d = %d is outside"
                         " the vocabulary [0, %d) (vocab_size)", cfg->num_eos,
                         (int)it->valuedouble, cfg->vocab_size);
        }
        cfg->eos_token_ids[cfg->num_eos++] = (int)it->valuedouble;
    }
    return KVF_OK;
}

/* The fields every architecture has: sizes, heads, token ids, dtype, norm epsilon. */
static kvf_status_t kvf_cfg_common(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_cfg_int(rd, "hidden_size", &cfg->hidden_size));
    KVF_CFG_TRY(kvf_cfg_int(rd, "vocab_size", &cfg->vocab_size));
    KVF_CFG_TRY(kvf_cfg_int(rd, "num_attention_heads", &cfg->num_attention_heads));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "num_key_value_heads", cfg->num_attention_heads,
                                &cfg->num_key_value_heads));
    if (cfg->num_key_value_heads == 0) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'num_key_value_heads' = 0 must be a positive"
                     " integer");
    }
    KVF_CFG_TRY(kvf_cfg_divides(rd->origin, "num_key_value_heads", cfg->num_key_value_heads,
                                "num_attention_heads", cfg->num_attention_heads));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "head_dim", 0, &cfg->head_dim));
    if (cfg->head_dim == 0) {
        if (cfg->hidden_size % cfg->num_attention_heads != 0) {
            KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "missing field 'head_dim' and hidden_size = %d"
                         " is not a multiple of num_attention_heads = %d", cfg->hidden_size,
                         cfg->num_attention_heads);
        }
        cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    }
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "intermediate_size", 0, &cfg->intermediate_size));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "n_routed_experts", 0, &cfg->moe_num_experts));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "num_experts_per_tok", 0, &cfg->moe_top_k));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "moe_intermediate_size", 0, &cfg->moe_intermediate_size));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "moe_shared_expert_intermediate_size", 0,
                                &cfg->moe_shared_intermediate_size));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "bos_token_id", 0, &cfg->bos_token_id));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "eos_token_id", 0, &cfg->eos_token_id));
    if (!kvf_cfg_present(rd, "bos_token_id")) {
        cfg->bos_token_id = -1;
    }
    if (!kvf_cfg_present(rd, "eos_token_id")) {
        cfg->eos_token_id = -1;
    }
    KVF_CFG_TRY(kvf_cfg_eos_list(rd, cfg));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "tie_word_embeddings", false, &cfg->tie_word_embeddings));
    /* transformers 5 writes "dtype"; older files "torch_dtype" */
    KVF_CFG_TRY(kvf_cfg_dtype_opt(rd, kvf_cfg_alias(rd, "dtype", "torch_dtype"), KVF_DTYPE_BF16,
                                  &cfg->torch_dtype));
    /* an id outside the vocabulary would make every request fail: refuse at start */
    if ((cfg->bos_token_id >= cfg->vocab_size) || (cfg->eos_token_id >= cfg->vocab_size)) {
        bool bos = (cfg->bos_token_id >= cfg->vocab_size);
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s' = %d is outside the vocabulary [0, %d)"
                     " (vocab_size)", bos ? "bos_token_id" : "eos_token_id",
                     bos ? cfg->bos_token_id : cfg->eos_token_id, cfg->vocab_size);
    }
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "max_position_embeddings", 0,
                                &cfg->max_position_embeddings));
    {
        /* transformers' NemotronH reads layer_norm_epsilon only (an rms_norm_eps
         * in its file is ignored); the dense archs read rms_norm_eps */
        const char *name = (cfg->arch == KVF_ARCH_NEMOTRON_H) ? "layer_norm_epsilon" :
                           "rms_norm_eps";
        KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, name,
                                (cfg->arch == KVF_ARCH_NEMOTRON_H) ? 1e-5 : 1e-6,
                                &cfg->norm_eps));
        if (!(cfg->norm_eps > 0)) {
            KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s' = %g must be positive", name,
                         cfg->norm_eps);
        }
    }
    return KVF_OK;
}

/* time_step_limit = [low, high] (nemotron_h also mamba_dt_limit): transformers 5.25's
 * Mamba2 mixers (NemotronH, Bamba, GraniteMoeHybrid alike) clamp dt to it in the chunked
 * scan of a prompt and not in the one-token recurrent update; absent: the class default
 * (0, inf). NVIDIA's configs write [0.0, Infinity] (Python's literal, kvf_json.h).
 * Design: 5.24's NemotronH clamped at time_step_min instead and ignored this field;
 * kvferry follows the version tests/run.sh installs (5.25). */
kvf_status_t kvf_cfg_dt_limit(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    const char *name = kvf_cfg_alias(rd, "time_step_limit", "mamba_dt_limit");
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, name);
    const cJSON *lo, *hi;

    cfg->dt_limit_low = 0.0;
    cfg->dt_limit_high = INFINITY;
    if (item == NULL) {
        return KVF_OK;
    }
    if (cJSON_IsNull(item)) {
        kvf_error("%s: field '%s' = null is not implemented (transformers' scan needs a pair"
                  " [low, high]): refused", rd->origin, name);
        return KVF_ERR_UNSUPPORTED;
    }
    lo = cJSON_GetArrayItem(item, 0);
    hi = cJSON_GetArrayItem(item, 1);
    if (!cJSON_IsArray(item) || (cJSON_GetArraySize(item) != 2) || !cJSON_IsNumber(lo) ||
        !cJSON_IsNumber(hi)) {
        kvf_error("%s: field '%s' must be a pair of numbers [low, high]", rd->origin, name);
        return KVF_ERR_INVALID_PARAM;
    }
    if (!isfinite(lo->valuedouble) || !(lo->valuedouble >= 0.0) ||
        !(hi->valuedouble >= lo->valuedouble)) {
        kvf_error("%s: field '%s' = [%g, %g] must have 0 <= low <= high (high may be"
                  " Infinity)", rd->origin, name, lo->valuedouble, hi->valuedouble);
        return KVF_ERR_INVALID_PARAM;
    }
    cfg->dt_limit_low = lo->valuedouble;
    cfg->dt_limit_high = hi->valuedouble;
    return KVF_OK;
}

/* nemotron_h: the Mamba2 mixer's fields (its layers exist in the pattern). */
static kvf_status_t kvf_cfg_mamba(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_cfg_int(rd, "mamba_num_heads", &cfg->mamba_num_heads));
    KVF_CFG_TRY(kvf_cfg_int(rd, "mamba_head_dim", &cfg->mamba_head_dim));
    KVF_CFG_TRY(kvf_cfg_int(rd, "ssm_state_size", &cfg->ssm_state_size));
    KVF_CFG_TRY(kvf_cfg_int(rd, kvf_cfg_alias(rd, "n_groups", "mamba_n_groups"),
                            &cfg->n_groups));
    KVF_CFG_TRY(kvf_cfg_int(rd, kvf_cfg_alias(rd, "conv_kernel", "mamba_d_conv"),
                            &cfg->conv_kernel));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, kvf_cfg_alias(rd, "chunk_size", "mamba_chunk_size"), 128,
                                &cfg->chunk_size));
    KVF_CFG_TRY(kvf_cfg_divides(rd->origin, "n_groups", cfg->n_groups, "mamba_num_heads",
                                cfg->mamba_num_heads));
    if (cfg->conv_kernel < 2) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'conv_kernel' = %d must be at least 2",
                     cfg->conv_kernel);
    }
    KVF_CFG_TRY(kvf_cfg_bool(rd, kvf_cfg_alias(rd, "use_conv_bias", "mamba_conv_bias"), true,
                             &cfg->use_conv_bias));
    /* transformers' mixer takes its in/out projection bias from use_bias;
     * mamba_proj_bias is a config field its modeling code never reads */
    KVF_CFG_TRY(kvf_cfg_bool(rd, "use_bias", false, &cfg->mamba_proj_bias));
    KVF_CFG_TRY(kvf_cfg_act(rd, "mamba_hidden_act", KVF_ACT_SILU, &cfg->mamba_act));
    /* time_step_min / mamba_dt_min: dt_bias's initialisation only since transformers 5.25
     * (accepted without effect, as time_step_max) */
    KVF_CFG_TRY(kvf_cfg_dt_limit(rd, cfg));
    KVF_CFG_TRY(kvf_cfg_dtype_opt(rd, "mamba_ssm_cache_dtype", KVF_DTYPE_FP32,
                                  &cfg->ssm_cache_dtype));
    return KVF_OK;
}

/* nemotron_h: the hybrid pattern (Mamba2, attention, MLP, MoE layers) and its mixers. */
static kvf_status_t kvf_cfg_parse_nemotron_h(const kvf_cfg_reader_t *rd,
                                             kvf_model_config_t *cfg)
{
    int num_hidden_layers = 0;

    KVF_CFG_TRY(kvf_cfg_pattern(rd, cfg));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "num_hidden_layers", cfg->num_layers, &num_hidden_layers));
    if (num_hidden_layers != cfg->num_layers) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'num_hidden_layers' = %d but the layer"
                     " pattern has %d layers", num_hidden_layers, cfg->num_layers);
    }
    for (int i = 0; i < cfg->num_layers; ++i) {
        cfg->num_mamba_layers     += (cfg->layer_kinds[i] == KVF_LAYER_MAMBA);
        cfg->num_attention_layers += (cfg->layer_kinds[i] == KVF_LAYER_ATTENTION);
        cfg->num_moe_layers       += (cfg->layer_kinds[i] == KVF_LAYER_MOE);
    }
    KVF_CFG_TRY(kvf_cfg_act(rd, "mlp_hidden_act", KVF_ACT_RELU2, &cfg->mlp_act));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "mlp_bias", false, &cfg->mlp_bias));
    if (cfg->num_mamba_layers > 0) {
        KVF_CFG_TRY(kvf_cfg_mamba(rd, cfg));
    }
    if (cfg->num_moe_layers > 0) {
        KVF_CFG_TRY(kvf_cfg_moe(rd, cfg));
    }
    if ((strchr(cfg->layer_kinds, KVF_LAYER_MLP) != NULL) && (cfg->intermediate_size == 0)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "missing field 'intermediate_size' (the pattern has"
                     " MLP layers)");
    }
    KVF_CFG_TRY(kvf_cfg_window(rd, cfg, 0, true));
    if (cfg->sliding_window > 0) {
        KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field 'sliding_window' = %d is not implemented for"
                     " nemotron_h (only null, or at least max_position_embeddings = %d):"
                     " refused", cfg->sliding_window, cfg->max_position_embeddings);
    }
    cfg->rope.type = KVF_ROPE_NONE;
    cfg->lm_head_tied = false;   /* transformers' NemotronH keeps lm_head.weight */
    return KVF_OK;
}

/* Dense decoders (llama, qwen3, mistral), before the architecture's own fields. */
static kvf_status_t kvf_cfg_dense_layers(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_cfg_num_layers(rd, cfg));
    KVF_CFG_TRY(kvf_cfg_int(rd, "intermediate_size", &cfg->intermediate_size));
    KVF_CFG_TRY(kvf_cfg_act(rd, "hidden_act", KVF_ACT_SILU, &cfg->mlp_act));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "mlp_bias", false, &cfg->mlp_bias));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "attention_bias", false, &cfg->attn_bias));
    cfg->mlp_gated = true;
    cfg->qk_norm = (cfg->arch == KVF_ARCH_QWEN3);
    return KVF_OK;
}

/* Dense decoders, after the architecture's own fields: RoPE and the all-attention pattern. */
static kvf_status_t kvf_cfg_dense_finish(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_cfg_rope(rd, cfg));
    kvf_cfg_all_attention(cfg);
    return KVF_OK;
}

void kvf_cfg_all_attention(kvf_model_config_t *cfg)
{
    memset(cfg->layer_kinds, KVF_LAYER_ATTENTION, (size_t)cfg->num_layers);
    cfg->layer_kinds[cfg->num_layers] = '\0';
    cfg->num_attention_layers = cfg->num_layers;
    cfg->dense_mlp_in_layer = true;
    cfg->ssm_cache_dtype = KVF_DTYPE_FP32;
    cfg->lm_head_tied = cfg->tie_word_embeddings;
}

/* llama: a dense decoder with nothing of its own. */
static kvf_status_t kvf_cfg_parse_llama(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_cfg_dense_layers(rd, cfg));
    return kvf_cfg_dense_finish(rd, cfg);
}

/* mistral: llama's layers with a sliding window on every layer (transformers'
 * MistralConfig default 4096 when the field is absent; null: none). */
static kvf_status_t kvf_cfg_parse_mistral(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_cfg_dense_layers(rd, cfg));
    KVF_CFG_TRY(kvf_cfg_window(rd, cfg, 4096, true));
    for (int l = 0; l < cfg->num_layers; ++l) {
        cfg->layer_window[l] = cfg->sliding_window;   /* MistralModel: every layer */
    }
    return kvf_cfg_dense_finish(rd, cfg);
}

/*
 * qwen3: a dense decoder with QK norm. Sliding window as transformers'
 * Qwen3Config: only with use_sliding_window, on the layers layer_types marks
 * sliding_attention (default: layers from max_window_layers, 28, on).
 */
static kvf_status_t kvf_cfg_parse_qwen3(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    kvf_status_t status;
    bool use_sliding, any_sliding = false;
    bool sliding[KVF_MAX_LAYERS] = {false};
    int max_window_layers;

    KVF_CFG_TRY(kvf_cfg_dense_layers(rd, cfg));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "use_sliding_window", false, &use_sliding));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "max_window_layers", 28, &max_window_layers));
    status = kvf_cfg_layer_types(rd, cfg, "sliding_attention", "full_attention", sliding);
    if ((status != KVF_OK) && (status != KVF_ERR_NOT_FOUND)) {
        return status;
    }
    if (status == KVF_OK) {
        for (int l = 0; l < cfg->num_layers; ++l) {
            any_sliding = any_sliding || sliding[l];
        }
    } else {
        any_sliding = (max_window_layers < cfg->num_layers);
        for (int l = 0; l < cfg->num_layers; ++l) {
            sliding[l] = (l >= max_window_layers);   /* Qwen3Config's default layer_types */
        }
    }
    KVF_CFG_TRY(kvf_cfg_window(rd, cfg, 4096, use_sliding && any_sliding));
    for (int l = 0; l < cfg->num_layers; ++l) {
        cfg->layer_window[l] = sliding[l] ? cfg->sliding_window : 0;
    }
    return kvf_cfg_dense_finish(rd, cfg);
}

/* The architectures kvferry runs: model_type -> arch and its parser. */
static const struct {
    const char *model_type;
    kvf_arch_t  arch;
    kvf_status_t (*parse)(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);
} kvf_cfg_archs[] = {
    {"nemotron_h", KVF_ARCH_NEMOTRON_H, kvf_cfg_parse_nemotron_h},
    {"llama",      KVF_ARCH_LLAMA,      kvf_cfg_parse_llama},
    {"qwen3",      KVF_ARCH_QWEN3,      kvf_cfg_parse_qwen3},
    {"mistral",    KVF_ARCH_MISTRAL,    kvf_cfg_parse_mistral},
    {"bamba",      KVF_ARCH_BAMBA,      kvf_cfg_parse_bamba},
    {"granitemoehybrid", KVF_ARCH_GRANITE_MOE_HYBRID, kvf_cfg_parse_granite},
    {"gemma3_text", KVF_ARCH_GEMMA3_TEXT, kvf_cfg_parse_gemma3},
    {"gemma2",     KVF_ARCH_GEMMA2,     kvf_cfg_parse_gemma2},
    {"gpt_oss",    KVF_ARCH_GPT_OSS,    kvf_cfg_parse_gpt_oss},
    {"qwen3_next", KVF_ARCH_QWEN3_NEXT, kvf_cfg_parse_qwen3_next},
    {"qwen3_5_text", KVF_ARCH_QWEN3_5_TEXT, kvf_cfg_parse_qwen3_5_text},
    {"qwen3_5_moe_text", KVF_ARCH_QWEN3_5_TEXT, kvf_cfg_parse_qwen3_5_moe_text},
};

kvf_status_t kvf_model_config_from_json(const cJSON *root, const char *origin,
                                        kvf_model_config_t *cfg_p)
{
    kvf_model_config_t cfg;
    kvf_cfg_reader_t rd;
    const cJSON *mt;
    kvf_status_t status = KVF_OK;
    int a = 0;
    const int narch = (int)(sizeof(kvf_cfg_archs) / sizeof(kvf_cfg_archs[0]));

    status = kvf_cfg_multimodal(root, origin, kvf_model_config_from_json, cfg_p);
    if (status != KVF_ERR_NOT_FOUND) {
        return status;
    }
    status = KVF_OK;
    memset(&cfg, 0, sizeof(cfg));
    cfg.embedding_multiplier = cfg.residual_multiplier = cfg.logits_scaling = 1.0;
    rd.origin = (origin != NULL) ? origin : "config.json";
    rd.root = root;
    if (!cJSON_IsObject(rd.root)) {
        kvf_error("%s: the document is not a JSON object", rd.origin);
        return KVF_ERR_PARSE;
    }

    mt = cJSON_GetObjectItemCaseSensitive(rd.root, "model_type");
    if (!cJSON_IsString(mt)) {
        KVF_FAIL(KVF_ERR_INVALID_PARAM, "missing field 'model_type'");
    }
    snprintf(cfg.model_type, sizeof(cfg.model_type), "%s", mt->valuestring);
    while ((a < narch) && (strcmp(mt->valuestring, kvf_cfg_archs[a].model_type) != 0)) {
        ++a;
    }
    if (a == narch) {
        KVF_FAIL(KVF_ERR_UNSUPPORTED, "field 'model_type' = '%s' is not supported (nemotron_h,"
                 " llama, qwen3, mistral, bamba, granitemoehybrid, gemma3_text, gemma2, gpt_oss,"
                 " qwen3_next, qwen3_5_text, qwen3_5_moe_text; the multimodal qwen3_5 and"
                 " qwen3_5_moe for their text)",
                 mt->valuestring);
    }
    cfg.arch = kvf_cfg_archs[a].arch;
    KVF_TRY(kvf_cfg_known(&rd, cfg.arch, cfg.model_type));
    KVF_TRY(kvf_cfg_refusals(&rd, &cfg));
    KVF_TRY(kvf_cfg_common(&rd, &cfg));
    KVF_TRY(kvf_cfg_archs[a].parse(&rd, &cfg));
    if (cfg.num_attention_layers == 0) {
        KVF_FAIL(KVF_ERR_INVALID_PARAM, "the layer pattern has no attention layer");
    }
    *cfg_p = cfg;

out:
    return status;
}
