/*
 * config.json of the Mamba2 + attention hybrids whose every layer is one
 * mixer (Mamba2 or attention) followed by its FFN: transformers' "bamba"
 * (BambaConfig: the FFN is a gated MLP) and "granitemoehybrid" (IBM Granite
 * 4.0-H, GraniteMoeHybridConfig: the FFN is routed experts plus a shared
 * gated MLP, and the Granite multipliers). Their Mamba2 fields share one
 * spelling (mamba_n_heads, mamba_d_head, ...) and one reader here.
 *
 * Design: the layer letters stay 'M' and '*' (what the cache planner reads);
 * the per-layer FFN is cfg->dense_mlp_in_layer, as for the dense decoders,
 * and granite's routed experts cfg->moe_in_layer. Defaults are the
 * transformers classes' (mamba_n_heads 128, mamba_d_state 256, ...; bamba's
 * partial_rotary_factor 0.5). Every field is honoured or refused by name
 * (common/model/README.md has the table).
 * Rejected: new layer letters for "mixer + FFN" layers (the planner, the
 * handshake and the fingerprint read the letters: every consumer would learn
 * them for no change in cache state); folding Granite's multipliers into the
 * weights at load (a bf16 checkpoint would round differently from
 * transformers: the forward scales activations instead, kvf_scale).
 */
#include "kvf_model_config_int.h"

#include <math.h>
#include <string.h>

#define KVF_IB (1u << KVF_ARCH_BAMBA)
#define KVF_IG (1u << KVF_ARCH_GRANITE_MOE_HYBRID)
#define KVF_IBG (KVF_IB | KVF_IG)

/* Every top-level field of their files; NOTE: keep common/model/README.md in step. */
static const struct {
    const char *name;
    unsigned    archs;
} kvf_ibm_fields[] = {
    /* read, with an effect */
    {"model_type", KVF_IBG}, {"vocab_size", KVF_IBG}, {"hidden_size", KVF_IBG},
    {"intermediate_size", KVF_IBG}, {"num_hidden_layers", KVF_IBG},
    {"num_attention_heads", KVF_IBG}, {"num_key_value_heads", KVF_IBG}, {"head_dim", KVF_IBG},
    {"hidden_act", KVF_IBG}, {"rms_norm_eps", KVF_IBG}, {"bos_token_id", KVF_IBG},
    {"eos_token_id", KVF_IBG}, {"tie_word_embeddings", KVF_IBG}, {"dtype", KVF_IBG},
    {"torch_dtype", KVF_IBG}, {"quantization_config", KVF_IBG}, {"rope_parameters", KVF_IBG},
    {"rope_scaling", KVF_IBG}, {"rope_theta", KVF_IBG}, {"partial_rotary_factor", KVF_IBG},
    {"attention_bias", KVF_IBG}, {"mamba_n_heads", KVF_IBG}, {"mamba_d_head", KVF_IBG},
    {"mamba_n_groups", KVF_IBG}, {"mamba_d_state", KVF_IBG}, {"mamba_d_conv", KVF_IBG},
    {"mamba_expand", KVF_IBG}, {"mamba_chunk_size", KVF_IBG}, {"mamba_conv_bias", KVF_IBG},
    {"mamba_proj_bias", KVF_IBG}, {"time_step_limit", KVF_IBG},
    {"attn_layer_indices", KVF_IB}, {"mlp_bias", KVF_IB},
    {"layer_types", KVF_IG}, {"layers_block_type", KVF_IG}, {"embedding_multiplier", KVF_IG},
    {"residual_multiplier", KVF_IG}, {"logits_scaling", KVF_IG},
    {"attention_multiplier", KVF_IG}, {"num_local_experts", KVF_IG},
    {"num_experts_per_tok", KVF_IG}, {"shared_intermediate_size", KVF_IG},
    {"position_embedding_type", KVF_IG}, {"normalization_function", KVF_IG},
    /* known to leave inference unchanged */
    {"architectures", KVF_IBG}, {"auto_map", KVF_IBG}, {"transformers_version", KVF_IBG},
    {"_name_or_path", KVF_IBG}, {"use_cache", KVF_IBG}, {"pad_token_id", KVF_IBG},
    {"initializer_range", KVF_IBG}, {"max_position_embeddings", KVF_IBG},
    {"attention_dropout", KVF_IBG}, {"output_attentions", KVF_IBG},
    {"output_hidden_states", KVF_IBG}, {"return_dict", KVF_IBG},
    {"num_logits_to_keep", KVF_IB}, {"z_loss_coefficient", KVF_IB},
    {"output_router_logits", KVF_IG}, {"router_aux_loss_coef", KVF_IG}, {"init_method", KVF_IG},
};

bool kvf_cfg_ibm_known(const char *name, kvf_arch_t arch)
{
    for (size_t i = 0; i < sizeof(kvf_ibm_fields) / sizeof(kvf_ibm_fields[0]); ++i) {
        if ((strcmp(name, kvf_ibm_fields[i].name) == 0) &&
            (kvf_ibm_fields[i].archs & (1u << arch))) {
            return true;
        }
    }
    return false;
}

/* Optional positive integer with the class default (0 refused by name). */
static kvf_status_t kvf_ibm_pos(const kvf_cfg_reader_t *rd, const char *name, int dflt, int *out)
{
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, name, dflt, out));
    if (*out < 1) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s' = %d must be a positive integer", name,
                     *out);
    }
    return KVF_OK;
}

/* The Mamba2 mixer: mamba_* fields (transformers' class defaults), activation hidden_act. */
static kvf_status_t kvf_ibm_mamba(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    const cJSON *dh = cJSON_GetObjectItemCaseSensitive(rd->root, "mamba_d_head");
    int expand, inner;

    KVF_CFG_TRY(kvf_ibm_pos(rd, "mamba_n_heads", 128, &cfg->mamba_num_heads));
    KVF_CFG_TRY(kvf_ibm_pos(rd, "mamba_expand", 2, &expand));
    inner = expand * cfg->hidden_size;
    if (cJSON_IsString(dh) && (strcmp(dh->valuestring, "auto") == 0)) {
        cfg->mamba_head_dim = inner / cfg->mamba_num_heads;   /* transformers' "auto" */
    } else if (cJSON_IsString(dh)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'mamba_d_head' = '%s' must be an integer or"
                     " \"auto\"", dh->valuestring);
    } else {
        KVF_CFG_TRY(kvf_ibm_pos(rd, "mamba_d_head", inner / cfg->mamba_num_heads,
                                &cfg->mamba_head_dim));
    }
    if ((inner % cfg->mamba_num_heads != 0) ||
        (cfg->mamba_head_dim * cfg->mamba_num_heads != inner)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'mamba_d_head' = %d times mamba_n_heads = %d"
                     " must equal mamba_expand * hidden_size = %d", cfg->mamba_head_dim,
                     cfg->mamba_num_heads, inner);
    }
    KVF_CFG_TRY(kvf_ibm_pos(rd, "mamba_n_groups", 1, &cfg->n_groups));
    KVF_CFG_TRY(kvf_cfg_divides(rd->origin, "mamba_n_groups", cfg->n_groups, "mamba_n_heads",
                                cfg->mamba_num_heads));
    KVF_CFG_TRY(kvf_ibm_pos(rd, "mamba_d_state", 256, &cfg->ssm_state_size));
    KVF_CFG_TRY(kvf_ibm_pos(rd, "mamba_d_conv", 4, &cfg->conv_kernel));
    if (cfg->conv_kernel < 2) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'mamba_d_conv' = %d must be at least 2",
                     cfg->conv_kernel);
    }
    KVF_CFG_TRY(kvf_ibm_pos(rd, "mamba_chunk_size", 256, &cfg->chunk_size));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "mamba_conv_bias", true, &cfg->use_conv_bias));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "mamba_proj_bias", false, &cfg->mamba_proj_bias));
    cfg->mamba_act = cfg->mlp_act;   /* the mixer's conv activation is hidden_act */
    cfg->ssm_cache_dtype = KVF_DTYPE_FP32;
    return kvf_cfg_dt_limit(rd, cfg);   /* time_step_limit */
}

/* The fields both families read the same way, before their layer pattern. */
static kvf_status_t kvf_ibm_common(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg,
                                   double eps_default)
{
    KVF_CFG_TRY(kvf_cfg_num_layers(rd, cfg));
    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, "rms_norm_eps", eps_default, &cfg->norm_eps));
    if (!(cfg->norm_eps > 0)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'rms_norm_eps' = %g must be positive",
                     cfg->norm_eps);
    }
    KVF_CFG_TRY(kvf_cfg_act(rd, "hidden_act", KVF_ACT_SILU, &cfg->mlp_act));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "attention_bias", false, &cfg->attn_bias));
    cfg->mlp_gated = true;
    cfg->dense_mlp_in_layer = true;   /* each layer: mixer, then its FFN */
    cfg->lm_head_tied = cfg->tie_word_embeddings;
    return KVF_OK;
}

/* Counts of the layer letters once the pattern is set. */
static void kvf_ibm_count(kvf_model_config_t *cfg)
{
    cfg->layer_kinds[cfg->num_layers] = '\0';
    for (int i = 0; i < cfg->num_layers; ++i) {
        cfg->num_mamba_layers += (cfg->layer_kinds[i] == KVF_LAYER_MAMBA);
        cfg->num_attention_layers += (cfg->layer_kinds[i] == KVF_LAYER_ATTENTION);
    }
}

/*
 * bamba's rotary width: the rope object's (rope_scaling when set, else rope_parameters)
 * partial_rotary_factor, else 0.5 (BambaConfig overrides a top-level field: refused).
 */
static kvf_status_t kvf_bamba_rotary(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    const char *field = kvf_cfg_present(rd, "rope_scaling") ? "rope_scaling" : "rope_parameters";
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(rd->root, field);
    double partial = 0.5;

    if (cJSON_GetObjectItemCaseSensitive(rd->root, "partial_rotary_factor") != NULL) {
        KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field 'partial_rotary_factor' at the top level is"
                     " overridden by transformers' BambaConfig (0.5): refused (write it in"
                     " rope_parameters)");
    }
    if (cJSON_IsObject(rp)) {
        KVF_CFG_TRY(kvf_cfg_num(rd, rp, "partial_rotary_factor", 0.5, &partial));
    }
    cfg->rope.rotary_dim = (int)(cfg->head_dim * partial);   /* int(), as transformers */
    if (!(partial > 0.0) || !(partial <= 1.0) || (cfg->rope.rotary_dim % 2 != 0) ||
        (cfg->rope.rotary_dim < 2)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s.partial_rotary_factor' = %g must be in"
                     " (0, 1] and leave an even rotary width of at least 2 (head_dim %d: %d)",
                     field, partial, cfg->head_dim, cfg->rope.rotary_dim);
    }
    return KVF_OK;
}

/*
 * bamba: attn_layer_indices are attention layers, the rest Mamba2; every layer then a
 * gated MLP (feed_forward); RoPE on the leading partial_rotary_factor of each head.
 */
kvf_status_t kvf_cfg_parse_bamba(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(rd->root, "attn_layer_indices");
    const cJSON *it;

    KVF_CFG_TRY(kvf_ibm_common(rd, cfg, 1e-5));
    KVF_CFG_TRY(kvf_cfg_int(rd, "intermediate_size", &cfg->intermediate_size));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "mlp_bias", false, &cfg->mlp_bias));
    memset(cfg->layer_kinds, KVF_LAYER_MAMBA, (size_t)cfg->num_layers);
    if ((idx != NULL) && !cJSON_IsNull(idx) && !cJSON_IsArray(idx)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'attn_layer_indices' must be a list");
    }
    cJSON_ArrayForEach(it, idx) {
        if (!cJSON_IsNumber(it) || (it->valuedouble != floor(it->valuedouble)) ||
            (it->valuedouble < 0) || (it->valuedouble >= cfg->num_layers)) {
            KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'attn_layer_indices' entry %g must be a"
                         " layer index in [0, num_hidden_layers = %d)",
                         cJSON_IsNumber(it) ? it->valuedouble : -1.0, cfg->num_layers);
        }
        cfg->layer_kinds[(int)it->valuedouble] = KVF_LAYER_ATTENTION;
    }
    kvf_ibm_count(cfg);
    KVF_CFG_TRY(kvf_cfg_rope(rd, cfg));
    KVF_CFG_TRY(kvf_bamba_rotary(rd, cfg));
    return kvf_ibm_mamba(rd, cfg);
}

/* granitemoehybrid's layer_types (or layers_block_type): Mamba2 or attention per layer,
 * default all Mamba2. */
static kvf_status_t kvf_granite_layers(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    const char *name = kvf_cfg_alias(rd, "layer_types", "layers_block_type");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(rd->root, name);
    const cJSON *it;
    int n = 0;

    memset(cfg->layer_kinds, KVF_LAYER_MAMBA, (size_t)cfg->num_layers);
    if ((list == NULL) || cJSON_IsNull(list)) {
        return KVF_OK;
    }
    if (!cJSON_IsArray(list)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s' must be a list", name);
    }
    cJSON_ArrayForEach(it, list) {
        const char *v = cJSON_IsString(it) ? it->valuestring : "?";
        bool m = (strcmp(v, "mamba") == 0) || (strcmp(v, "linear_attention") == 0);
        bool a = (strcmp(v, "attention") == 0) || (strcmp(v, "full_attention") == 0);
        if (!m && !a) {
            KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field '%s' entry %d = '%s' is not implemented"
                         " (mamba, linear_attention, attention, full_attention): refused", name,
                         n, v);
        }
        if (n < cfg->num_layers) {
            cfg->layer_kinds[n] = m ? KVF_LAYER_MAMBA : KVF_LAYER_ATTENTION;
        }
        ++n;
    }
    if (n != cfg->num_layers) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s' has %d entries but num_hidden_layers ="
                     " %d", name, n, cfg->num_layers);
    }
    return KVF_OK;
}

/* granitemoehybrid's FFN: routed experts (intermediate_size each, softmax over the top-k
 * router logits, gated) plus the shared gated MLP; num_local_experts 0: the shared MLP alone. */
static kvf_status_t kvf_granite_ffn(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    int experts, width, shared;

    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "num_local_experts", 8, &experts));
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "intermediate_size", 11008, &width));
    KVF_CFG_TRY(kvf_ibm_pos(rd, "shared_intermediate_size", 1024, &shared));
    cfg->intermediate_size = shared;   /* the shared MLP, without experts */
    if (experts == 0) {
        return KVF_OK;
    }
    KVF_CFG_TRY(kvf_ibm_pos(rd, "num_experts_per_tok", 2, &cfg->moe_top_k));
    if (width < 1) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'intermediate_size' = %d must be a positive"
                     " integer", width);
    }
    if (experts > 1024) {
        KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field 'num_local_experts' = %d exceeds 1024",
                     experts);
    }
    if (cfg->moe_top_k > experts) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'num_experts_per_tok' = %d exceeds"
                     " num_local_experts = %d", cfg->moe_top_k, experts);
    }
    cfg->moe_num_experts = experts;
    cfg->moe_intermediate_size = width;
    cfg->moe_shared_intermediate_size = shared;
    cfg->intermediate_size = 0;       /* the shared MLP rides with the experts */
    cfg->moe_n_group = cfg->moe_topk_group = 1;
    cfg->moe_norm_topk_prob = false;
    cfg->moe_routed_scaling = 1.0;
    cfg->moe_softmax_topk = true;
    cfg->moe_gated = true;
    cfg->moe_in_layer = true;
    cfg->num_moe_layers = cfg->num_layers;
    return KVF_OK;
}

/* granitemoehybrid's multipliers: finite, logits_scaling and attention_multiplier positive. */
static kvf_status_t kvf_granite_multipliers(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, "embedding_multiplier", 1.0,
                            &cfg->embedding_multiplier));
    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, "residual_multiplier", 1.0,
                            &cfg->residual_multiplier));
    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, "logits_scaling", 1.0, &cfg->logits_scaling));
    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, "attention_multiplier", 1.0,
                            &cfg->attention_multiplier));
    if (!(cfg->logits_scaling > 0.0)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'logits_scaling' = %g must be positive",
                     cfg->logits_scaling);
    }
    if (!(cfg->attention_multiplier > 0.0)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'attention_multiplier' = %g must be positive",
                     cfg->attention_multiplier);
    }
    return KVF_OK;
}

/*
 * granitemoehybrid: layer_types, each layer's FFN, the multipliers, and RoPE only with
 * position_embedding_type "rope" (null / absent / "nope": no positional encoding).
 */
kvf_status_t kvf_cfg_parse_granite(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    const cJSON *pe = cJSON_GetObjectItemCaseSensitive(rd->root, "position_embedding_type");
    const cJSON *nf = cJSON_GetObjectItemCaseSensitive(rd->root, "normalization_function");

    KVF_CFG_TRY(kvf_ibm_common(rd, cfg, 1e-6));
    KVF_CFG_TRY(kvf_granite_layers(rd, cfg));
    kvf_ibm_count(cfg);
    KVF_CFG_TRY(kvf_granite_ffn(rd, cfg));
    KVF_CFG_TRY(kvf_granite_multipliers(rd, cfg));
    if ((nf != NULL) && !cJSON_IsNull(nf) &&
        (!cJSON_IsString(nf) || (strcmp(nf->valuestring, "rmsnorm") != 0))) {
        char val[64];
        kvf_cfg_value_str(nf, val, sizeof(val));
        KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field 'normalization_function' = %s is not"
                     " implemented (only \"rmsnorm\", what transformers computes): refused", val);
    }
    if ((pe == NULL) || cJSON_IsNull(pe) ||
        (cJSON_IsString(pe) && (strcmp(pe->valuestring, "nope") == 0))) {
        cfg->rope.type = KVF_ROPE_NONE;
    } else if (cJSON_IsString(pe) && (strcmp(pe->valuestring, "rope") == 0)) {
        KVF_CFG_TRY(kvf_cfg_rope(rd, cfg));
    } else {
        char val[64];
        kvf_cfg_value_str(pe, val, sizeof(val));
        KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field 'position_embedding_type' = %s is not"
                     " implemented (null, \"nope\", \"rope\"): refused", val);
    }
    return kvf_ibm_mamba(rd, cfg);
}
