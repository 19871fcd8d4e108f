/*
 * config.json of "qwen3_next" (transformers' Qwen3NextConfig, Qwen3NextForCausalLM):
 * layers of Gated DeltaNet linear attention ("linear_attention") and gated full
 * attention ("full_attention": q_proj doubled into queries and an output gate,
 * sigmoid(gate) times the attention output before o_proj, q/k RMSNorms, RoPE on the
 * leading partial_rotary_factor (default 0.25) of each head), every layer followed by
 * its FFN; RMSNorms scale by (1 + weight). layer_types, else every
 * full_attention_interval-th layer (default 4) full. Defaults are the class's.
 *
 * Design: a Gated DeltaNet layer is a state layer ('M') whose state has the Mamba2
 * state's shape, so the cache planner, the handshake, the transfer and the prefix
 * cache's state checkpoints move it unchanged (one state-group interface for both
 * kinds): heads = linear_num_value_heads, head_dim = linear_value_head_dim, groups =
 * linear_num_key_heads, state_size = linear_key_head_dim, conv channels v | k | q
 * (x | B | C); TP shards value heads, and key heads like B/C groups (replicated where
 * TP exceeds them). cfg->state_kind says which recurrence the forward runs.
 * Rejected: a new layer letter for Gated DeltaNet (every consumer of the letters would
 * learn it for a state of the same shape; the fingerprint hashes the arch).
 * Sparse layers (num_experts > 0, decoder_sparse_step, mlp_only_layers) run the routed
 * experts as granitemoehybrid's (softmax of the top-k logits = softmax, top k,
 * renormalised) plus the shared expert times sigmoid(shared_expert_gate x)
 * (cfg->layer_sparse); the others a gated MLP.
 * "qwen3_5_text" (Qwen3_5TextConfig, Qwen3_5ForCausalLM) is the same machinery: separate
 * in_proj_qkv / in_proj_z / in_proj_b / in_proj_a (the loader reads them), a gated MLP on
 * every layer, multimodal RoPE that is plain RoPE for text (kvf_cfg_parse_qwen3_5_text).
 * norm_topk_prob false: the chosen experts' entries of that softmax, not renormalised.
 * Refused by name: an activation other than
 * transformers' names, a layer type other than linear_attention / full_attention.
 */
#include "kvf_model_config_int.h"

#include <math.h>
#include <string.h>

/* Every top-level field of its files; NOTE: keep common/model/README.md in step. */
static const char *const kvf_qn_fields[] = {
    /* read, with an effect */
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
    "bos_token_id", "eos_token_id", "tie_word_embeddings", "dtype", "torch_dtype",
    "quantization_config", "rope_parameters", "rope_scaling", "rope_theta",
    "partial_rotary_factor", "attention_bias", "linear_conv_kernel_dim",
    "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
    "linear_num_value_heads", "layer_types", "full_attention_interval",
    "decoder_sparse_step", "num_experts", "mlp_only_layers", "moe_intermediate_size",
    "shared_expert_intermediate_size", "num_experts_per_tok", "norm_topk_prob",
    "max_position_embeddings",
    /* known to leave inference unchanged */
    "architectures", "transformers_version", "_name_or_path", "use_cache", "pad_token_id",
    "initializer_range", "attention_dropout", "output_router_logits", "router_aux_loss_coef",
    "output_attentions", "output_hidden_states", "return_dict",
};

/* qwen3_5_text (Qwen3_5TextConfig): the same fields less the experts', plus none. */
static bool kvf_qn_moe_field(const char *name)
{
    static const char *const moe[] = {
        "decoder_sparse_step", "num_experts", "mlp_only_layers", "moe_intermediate_size",
        "shared_expert_intermediate_size", "num_experts_per_tok", "norm_topk_prob",
        "output_router_logits", "router_aux_loss_coef",
    };
    for (size_t i = 0; i < sizeof(moe) / sizeof(moe[0]); ++i) {
        if (strcmp(name, moe[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* qwen3_5_moe_text (Qwen3_5MoeTextConfig): qwen3_5_text's fields plus the experts' (every
 * layer sparse, always renormalised: no decoder_sparse_step, mlp_only_layers, norm_topk_prob),
 * without intermediate_size. */
static bool kvf_q35_moe_known(const char *name)
{
    static const char *const not_here[] = {
        "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "intermediate_size",
    };
    for (size_t i = 0; i < sizeof(not_here) / sizeof(not_here[0]); ++i) {
        if (strcmp(name, not_here[i]) == 0) {
            return false;
        }
    }
    return true;
}

bool kvf_cfg_qwen3_next_known(const char *name, const char *model_type)
{
    if ((strcmp(model_type, "qwen3_5_text") == 0) && kvf_qn_moe_field(name)) {
        return false;
    }
    if ((strcmp(model_type, "qwen3_5_moe_text") == 0) && !kvf_q35_moe_known(name)) {
        return false;
    }
    for (size_t i = 0; i < sizeof(kvf_qn_fields) / sizeof(kvf_qn_fields[0]); ++i) {
        if (strcmp(name, kvf_qn_fields[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* Optional positive integer with the class default. */
static kvf_status_t kvf_qn_pos(const kvf_cfg_reader_t *rd, const char *name, int dflt, int *out)
{
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, name, dflt, out));
    if (*out < 1) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s' = %d must be a positive integer", name,
                     *out);
    }
    return KVF_OK;
}

/* layer_types (or every full_attention_interval-th layer full) into cfg->layer_kinds. */
static kvf_status_t kvf_qn_layers(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    bool lin[KVF_MAX_LAYERS];
    kvf_status_t status = kvf_cfg_layer_types(rd, cfg, "linear_attention", "full_attention",
                                              lin);
    int interval;

    if ((status != KVF_OK) && (status != KVF_ERR_NOT_FOUND)) {
        return status;
    }
    if (status == KVF_OK) {
        for (int l = 0; l < cfg->num_layers; ++l) {
            cfg->layer_kinds[l] = lin[l] ? KVF_LAYER_MAMBA : KVF_LAYER_ATTENTION;
        }
    } else {
        KVF_CFG_TRY(kvf_qn_pos(rd, "full_attention_interval", 4, &interval));
        for (int l = 0; l < cfg->num_layers; ++l) {   /* Qwen3NextConfig's default */
            cfg->layer_kinds[l] = ((l + 1) % interval) ? KVF_LAYER_MAMBA : KVF_LAYER_ATTENTION;
        }
    }
    cfg->layer_kinds[cfg->num_layers] = '\0';
    for (int l = 0; l < cfg->num_layers; ++l) {
        cfg->num_mamba_layers += (cfg->layer_kinds[l] == KVF_LAYER_MAMBA);
        cfg->num_attention_layers += (cfg->layer_kinds[l] == KVF_LAYER_ATTENTION);
    }
    return KVF_OK;
}

/* The FFN: routed experts (num_experts > 0, every decoder_sparse_step-th layer not in
 * mlp_only_layers: softmax router, top num_experts_per_tok renormalised (norm_topk_prob,
 * default true; false: not), gated experts of
 * moe_intermediate_size, a gated shared expert of shared_expert_intermediate_size scaled by
 * sigmoid(shared_expert_gate x)), else a gated MLP of intermediate_size. */
static kvf_status_t kvf_qn_ffn(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg,
                               int experts_dflt, int topk_dflt)
{
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(rd->root, "mlp_only_layers");
    const cJSON *it;
    bool dense[KVF_MAX_LAYERS] = {false};
    int experts, step, n_dense = 0;

    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "num_experts", experts_dflt, &experts));
    KVF_CFG_TRY(kvf_qn_pos(rd, "decoder_sparse_step", 1, &step));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "norm_topk_prob", true, &cfg->moe_norm_topk_prob));
    if ((only != NULL) && !cJSON_IsNull(only) && !cJSON_IsArray(only)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'mlp_only_layers' must be a list");
    }
    cJSON_ArrayForEach(it, only) {
        if (!cJSON_IsNumber(it) || (it->valuedouble != floor(it->valuedouble)) ||
            (it->valuedouble < 0) || (it->valuedouble >= cfg->num_layers)) {
            KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'mlp_only_layers' entry %g must be a"
                         " layer index in [0, num_hidden_layers = %d)",
                         cJSON_IsNumber(it) ? it->valuedouble : -1.0, cfg->num_layers);
        }
        dense[(int)it->valuedouble] = true;
    }
    for (int l = 0; l < cfg->num_layers; ++l) {
        cfg->layer_sparse[l] = !dense[l] && (experts > 0) && ((l + 1) % step == 0);
        cfg->num_moe_layers += cfg->layer_sparse[l];
        n_dense += !cfg->layer_sparse[l];
    }
    cfg->mlp_gated = true;
    cfg->dense_mlp_in_layer = true;
    cfg->moe_top_k = cfg->moe_intermediate_size = 0;
    if (n_dense > 0) {
        KVF_CFG_TRY(kvf_qn_pos(rd, "intermediate_size", 5632, &cfg->intermediate_size));
    }
    if (cfg->num_moe_layers == 0) {
        return KVF_OK;
    }
    if (experts > 1024) {
        KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field 'num_experts' = %d exceeds 1024", experts);
    }
    KVF_CFG_TRY(kvf_qn_pos(rd, "num_experts_per_tok", topk_dflt, &cfg->moe_top_k));
    KVF_CFG_TRY(kvf_qn_pos(rd, "moe_intermediate_size", 512, &cfg->moe_intermediate_size));
    KVF_CFG_TRY(kvf_qn_pos(rd, "shared_expert_intermediate_size", 512,
                           &cfg->moe_shared_intermediate_size));
    if (cfg->moe_top_k > experts) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'num_experts_per_tok' = %d exceeds"
                     " num_experts = %d", cfg->moe_top_k, experts);
    }
    cfg->moe_num_experts = experts;
    cfg->moe_n_group = cfg->moe_topk_group = 1;
    cfg->moe_routed_scaling = 1.0;
    /* softmax over all experts, top k, renormalised = softmax over the top-k logits;
     * norm_topk_prob false keeps the full softmax's entries (the fingerprint hashes it) */
    cfg->moe_softmax_topk = true;
    cfg->moe_softmax_full = !cfg->moe_norm_topk_prob;
    cfg->moe_gated = true;
    return KVF_OK;
}

/* The Gated DeltaNet fields as the state layer's geometry (the file's opening comment). */
static kvf_status_t kvf_qn_gdn(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_qn_pos(rd, "linear_num_value_heads", 32, &cfg->mamba_num_heads));
    KVF_CFG_TRY(kvf_qn_pos(rd, "linear_value_head_dim", 128, &cfg->mamba_head_dim));
    KVF_CFG_TRY(kvf_qn_pos(rd, "linear_num_key_heads", 16, &cfg->n_groups));
    KVF_CFG_TRY(kvf_qn_pos(rd, "linear_key_head_dim", 128, &cfg->ssm_state_size));
    KVF_CFG_TRY(kvf_qn_pos(rd, "linear_conv_kernel_dim", 4, &cfg->conv_kernel));
    KVF_CFG_TRY(kvf_cfg_divides(rd->origin, "linear_num_key_heads", cfg->n_groups,
                                "linear_num_value_heads", cfg->mamba_num_heads));
    if (cfg->conv_kernel < 2) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'linear_conv_kernel_dim' = %d must be at"
                     " least 2", cfg->conv_kernel);
    }
    cfg->state_kind = KVF_STATE_GDN;
    cfg->chunk_size = 64;           /* unused by the recurrence; the planner's Mamba field */
    cfg->use_conv_bias = false;     /* conv1d(bias=False) */
    cfg->mamba_proj_bias = false;
    cfg->mamba_act = cfg->mlp_act;  /* the conv's activation is hidden_act */
    cfg->ssm_cache_dtype = KVF_DTYPE_FP32;
    cfg->dt_limit_low = 0.0;
    cfg->dt_limit_high = INFINITY;
    return KVF_OK;
}

/* partial_rotary_factor: the rope object's, else the top level's, else 0.25. */
static kvf_status_t kvf_qn_rotary(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    const char *field = kvf_cfg_present(rd, "rope_scaling") ? "rope_scaling" : "rope_parameters";
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(rd->root, field);
    double partial;

    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, "partial_rotary_factor", 0.25, &partial));
    if (cJSON_IsObject(rp)) {
        KVF_CFG_TRY(kvf_cfg_num(rd, rp, "partial_rotary_factor", partial, &partial));
    }
    cfg->rope.rotary_dim = (int)(cfg->head_dim * partial);   /* int(), as transformers */
    if (!(partial > 0.0) || !(partial <= 1.0) || (cfg->rope.rotary_dim % 2 != 0) ||
        (cfg->rope.rotary_dim < 2)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'partial_rotary_factor' = %g must be in"
                     " (0, 1] and leave an even rotary width of at least 2 (head_dim %d: %d)",
                     partial, cfg->head_dim, cfg->rope.rotary_dim);
    }
    return KVF_OK;
}

/* The fields both parse alike: layers, attention, RoPE, the Gated DeltaNet geometry; the
 * FFN is the caller's. @a rope_rd: the reader kvf_cfg_rope() sees. */
static kvf_status_t kvf_qn_common(const kvf_cfg_reader_t *rd, const kvf_cfg_reader_t *rope_rd,
                                  kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_cfg_num_layers(rd, cfg));
    if (!kvf_cfg_present(rd, "head_dim")) {
        cfg->head_dim = 256;   /* the class default, not hidden / heads */
    }
    KVF_CFG_TRY(kvf_cfg_act(rd, "hidden_act", KVF_ACT_SILU, &cfg->mlp_act));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "attention_bias", false, &cfg->attn_bias));
    KVF_CFG_TRY(kvf_qn_layers(rd, cfg));
    KVF_CFG_TRY(kvf_cfg_rope(rope_rd, cfg));
    KVF_CFG_TRY(kvf_qn_rotary(rope_rd, cfg));
    if (cfg->num_mamba_layers > 0) {
        KVF_CFG_TRY(kvf_qn_gdn(rd, cfg));
    }
    cfg->qk_norm = true;
    cfg->norm_offset = 1.0;          /* Qwen3NextRMSNorm: x * (1 + weight) */
    cfg->attn_output_gate = true;
    cfg->ssm_cache_dtype = KVF_DTYPE_FP32;
    cfg->lm_head_tied = cfg->tie_word_embeddings;
    return KVF_OK;
}

kvf_status_t kvf_cfg_parse_qwen3_next(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_qn_common(rd, rd, cfg));
    return kvf_qn_ffn(rd, cfg, 512, 10);   /* Qwen3NextConfig's defaults */
}

/*
 * qwen3_5_text: qwen3_next's layers with a gated MLP each (intermediate_size, default 12288).
 * Its RoPE is multimodal (rope_parameters.mrope_section, mrope_interleaved pick which of the
 * three position axes each frequency reads); a text-only model passes one position on all
 * three axes, so every frequency reads the token's position: plain RoPE. kvf_cfg_rope() then
 * sees a view of the file without those two keys.
 */
static kvf_status_t kvf_q35_common(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    static const char *const keep[] = {
        "rope_theta", "partial_rotary_factor", "max_position_embeddings",
    };
    static const char *const objs[] = {"rope_parameters", "rope_scaling"};
    cJSON *view = cJSON_CreateObject();
    kvf_cfg_reader_t vr = {.root = view, .origin = rd->origin};
    kvf_status_t status = (view == NULL) ? KVF_ERR_NO_MEMORY : KVF_OK;

    for (size_t i = 0; (status == KVF_OK) && (i < sizeof(keep) / sizeof(keep[0])); ++i) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(rd->root, keep[i]);
        if ((it != NULL) && !cJSON_AddItemReferenceToObject(view, keep[i], (cJSON *)it)) {
            status = KVF_ERR_NO_MEMORY;
        }
    }
    for (size_t i = 0; (status == KVF_OK) && (i < sizeof(objs) / sizeof(objs[0])); ++i) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(rd->root, objs[i]);
        cJSON *dup = (it != NULL) ? cJSON_Duplicate(it, 1) : NULL;
        if ((it != NULL) && (dup == NULL)) {
            status = KVF_ERR_NO_MEMORY;
        } else if (dup != NULL) {
            if (cJSON_IsObject(dup)) {
                cJSON_DeleteItemFromObjectCaseSensitive(dup, "mrope_section");
                cJSON_DeleteItemFromObjectCaseSensitive(dup, "mrope_interleaved");
            }
            cJSON_AddItemToObject(view, objs[i], dup);
        }
    }
    if (status == KVF_OK) {
        status = kvf_qn_common(rd, &vr, cfg);
    }
    cJSON_Delete(view);
    return status;
}

kvf_status_t kvf_cfg_parse_qwen3_5_text(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_q35_common(rd, cfg));
    KVF_CFG_TRY(kvf_qn_pos(rd, "intermediate_size", 12288, &cfg->intermediate_size));
    cfg->mlp_gated = true;
    cfg->dense_mlp_in_layer = true;
    cfg->moe_top_k = cfg->moe_intermediate_size = cfg->moe_shared_intermediate_size = 0;
    return KVF_OK;
}

/*
 * qwen3_5_moe_text (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM): qwen3_5_text's layers with
 * routed experts on every layer (the class's defaults: 256 experts, top 8) plus the gated
 * shared expert, the top-k always renormalised (its router divides by the sum). The arch is
 * qwen3_5_text's (the same tensors and forward; layer_sparse marks the experts).
 */
kvf_status_t kvf_cfg_parse_qwen3_5_moe_text(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_q35_common(rd, cfg));
    return kvf_qn_ffn(rd, cfg, 256, 8);
}
