/*
 * config.json of "gemma3_text" (transformers' Gemma3TextConfig, the text
 * decoder of Gemma 3, Gemma3ForCausalLM): a dense decoder whose layers are
 * sliding-window or full attention (layer_types, else every
 * sliding_window_pattern-th layer full), each with its own RoPE
 * (rope_parameters.sliding_attention / .full_attention, or the older
 * rope_local_base_freq / rope_theta + rope_scaling), q/k RMSNorms, RMSNorms
 * that scale by (1 + weight), a norm on the attention output and on the MLP
 * output, a GELU-tanh gated MLP, embeddings * sqrt(hidden_size) and scores *
 * query_pre_attn_scalar^-0.5. Defaults are the class's (head_dim 256,
 * sliding_window 4096, tied embeddings, thetas 1e6 / 1e4).
 *
 * Design: the (1 + weight) of the norms is added to the weights at load
 * (transformers computes 1 + weight in fp32 too: the same floats), so the
 * forward keeps one RMSNorm kernel. The sliding layers' RoPE is a second
 * kvf_rope_t read by the shared kvf_cfg_rope() from a per-type view of the
 * file. Rejected: a gemma-specific norm kernel (one definition per idea).
 * final_logit_softcapping (default null; positive: the final logits become c tanh(x / c),
 * cfg->final_softcap); attn_logit_softcapping is checked (null or positive) and has no
 * effect, as in transformers 5.25's Gemma3Attention, which never applies it.
 * "gemma2" (Gemma2Config, Gemma2ForCausalLM) is the same decoder without q/k norms, with one
 * RoPE for both layer types (rope_parameters, theta 1e4), layers alternating sliding / full
 * (sliding first) and both softcaps on by default (50, 30): kvf_cfg_parse_gemma2.
 * Refused by name: a softcap that is not a positive number or null,
 * use_bidirectional_attention true (the embedding variants), and a multimodal
 * "gemma3" file (its model_type is not this one).
 */
#include "kvf_model_config_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Every top-level field of its files; NOTE: keep common/model/README.md in step. */
static const char *const kvf_gemma_fields[] = {
    /* read, with an effect */
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_activation",
    "rms_norm_eps", "bos_token_id", "eos_token_id", "tie_word_embeddings", "dtype",
    "torch_dtype", "quantization_config", "rope_parameters", "rope_scaling", "rope_theta",
    "rope_local_base_freq", "attention_bias", "query_pre_attn_scalar", "sliding_window",
    "sliding_window_pattern", "layer_types", "final_logit_softcapping",
    "attn_logit_softcapping", "use_bidirectional_attention", "max_position_embeddings",
    /* known to leave inference unchanged */
    "architectures", "transformers_version", "_name_or_path", "use_cache", "pad_token_id",
    "initializer_range", "attention_dropout", "output_attentions", "output_hidden_states",
    "return_dict", "cache_implementation",
    "_sliding_window_pattern",   /* transformers rewrites it from sliding_window_pattern */
};

bool kvf_cfg_gemma_known(const char *name, kvf_arch_t arch)
{
    /* gemma2 files have one RoPE and their layer_types; the gemma3_text-only fields would
     * be ignored there: refused */
    if ((arch == KVF_ARCH_GEMMA2) && ((strcmp(name, "rope_local_base_freq") == 0) ||
                                      (strcmp(name, "sliding_window_pattern") == 0) ||
                                      (strcmp(name, "_sliding_window_pattern") == 0))) {
        return false;
    }
    for (size_t i = 0; i < sizeof(kvf_gemma_fields) / sizeof(kvf_gemma_fields[0]); ++i) {
        if (strcmp(name, kvf_gemma_fields[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* A field that changes the math when set (not null, not false): refused by name. */
static kvf_status_t kvf_gemma_refuse_set(const kvf_cfg_reader_t *rd, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(rd->root, name);
    char val[64];

    if ((it != NULL) && !cJSON_IsNull(it) && !cJSON_IsFalse(it)) {
        kvf_cfg_value_str(it, val, sizeof(val));
        KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field '%s' = %s is not implemented for gemma3_text"
                     " and gemma2 (only null): refused", name, val);
    }
    return KVF_OK;
}

/*
 * One layer type's RoPE into @a out: kvf_cfg_rope() on a view of the file
 * holding that type's rope_parameters (new files) or rope_theta + rope_scaling /
 * rope_local_base_freq (older ones).
 */
static kvf_status_t kvf_gemma_rope(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg,
                                   bool local, kvf_rope_t *out)
{
    const char *type = local ? "sliding_attention" : "full_attention";
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(rd->root, "rope_parameters");
    const cJSON *sub = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, type) : NULL;
    cJSON *view = cJSON_CreateObject();
    char origin[160];
    double theta, max_pos;
    kvf_status_t status;
    kvf_cfg_reader_t vr;

    if (view == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_cfg_num(rd, rd->root, local ? "rope_local_base_freq" : "rope_theta",
                         local ? 10000.0 : 1000000.0, &theta);
    if (status == KVF_OK) {
        status = kvf_cfg_num(rd, rd->root, "max_position_embeddings", 0.0, &max_pos);
    }
    if ((status == KVF_OK) && cJSON_IsObject(rp) && (sub == NULL) &&
        ((cJSON_GetObjectItemCaseSensitive(rp, "full_attention") != NULL) ||
         (cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention") != NULL))) {
        sub = NULL;   /* the other type only: this one takes the class default */
    } else if ((status == KVF_OK) && cJSON_IsObject(rp) && (sub == NULL)) {
        kvf_error("%s: field 'rope_parameters' must map 'full_attention' and"
                  " 'sliding_attention' to their RoPE for gemma3_text", rd->origin);
        status = KVF_ERR_INVALID_PARAM;
    }
    if (status == KVF_OK) {
        const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(rd->root, "rope_scaling");
        const bool ok = (cJSON_AddNumberToObject(view, "rope_theta", theta) != NULL) &&
            ((max_pos == 0.0) ||
             (cJSON_AddNumberToObject(view, "max_position_embeddings", max_pos) != NULL)) &&
            ((sub == NULL) ||
             cJSON_AddItemReferenceToObject(view, "rope_parameters", (cJSON *)sub)) &&
            (local || (sub != NULL) || (scaling == NULL) ||   /* old files: the full layers' */
             cJSON_AddItemReferenceToObject(view, "rope_scaling", (cJSON *)scaling));
        status = ok ? KVF_OK : KVF_ERR_NO_MEMORY;
    }
    if (status == KVF_OK) {
        snprintf(origin, sizeof(origin), "%s (%s RoPE)", rd->origin, type);
        vr.root = view;
        vr.origin = origin;
        status = kvf_cfg_rope(&vr, cfg);
        *out = cfg->rope;
    }
    cJSON_Delete(view);   /* references: the file's objects stay */
    return status;
}

/* layer_types (or every sliding_window_pattern-th layer full) into @a sliding. */
static kvf_status_t kvf_gemma_layer_types(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg,
                                          bool *sliding)
{
    kvf_status_t status = kvf_cfg_layer_types(rd, cfg, "sliding_attention", "full_attention",
                                              sliding);
    int pattern;

    if (status != KVF_ERR_NOT_FOUND) {
        return status;
    }
    KVF_CFG_TRY(kvf_cfg_int_opt(rd, "sliding_window_pattern", 6, &pattern));
    if (pattern < 1) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'sliding_window_pattern' = %d must be"
                     " positive", pattern);
    }
    for (int l = 0; l < cfg->num_layers; ++l) {
        sliding[l] = ((l + 1) % pattern) != 0;   /* Gemma3TextConfig's default layer_types */
    }
    return KVF_OK;
}

/* A softcap field: null (or absent with @a dflt 0) is none, else a positive number. */
static kvf_status_t kvf_gemma_softcap(const kvf_cfg_reader_t *rd, const char *name, double dflt,
                                      double *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(rd->root, name);

    if (it == NULL) {
        *out = dflt;
        return KVF_OK;
    }
    if (cJSON_IsNull(it)) {
        *out = 0.0;
        return KVF_OK;
    }
    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, name, dflt, out));
    if (!(*out > 0.0)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field '%s' = %g must be a positive number or"
                     " null", name, *out);
    }
    return KVF_OK;
}

/* What gemma3_text and gemma2 read alike: layers, sizes, activation, score scale,
 * embedding scale, norms, softcaps (defaults @a attn_cap, @a final_cap). */
static kvf_status_t kvf_gemma_common(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg,
                                     double attn_cap, double final_cap)
{
    double qpas;
    float escale;

    KVF_CFG_TRY(kvf_gemma_refuse_set(rd, "use_bidirectional_attention"));
    KVF_CFG_TRY(kvf_gemma_softcap(rd, "attn_logit_softcapping", attn_cap, &cfg->attn_softcap));
    KVF_CFG_TRY(kvf_gemma_softcap(rd, "final_logit_softcapping", final_cap,
                                  &cfg->final_softcap));
    KVF_CFG_TRY(kvf_cfg_num_layers(rd, cfg));
    KVF_CFG_TRY(kvf_cfg_int(rd, "intermediate_size", &cfg->intermediate_size));
    if (!kvf_cfg_present(rd, "head_dim")) {
        cfg->head_dim = 256;   /* the class default, not hidden / heads */
    }
    if (!kvf_cfg_present(rd, "tie_word_embeddings")) {
        cfg->tie_word_embeddings = true;
    }
    KVF_CFG_TRY(kvf_cfg_act(rd, "hidden_activation", KVF_ACT_GELU_TANH, &cfg->mlp_act));
    KVF_CFG_TRY(kvf_cfg_bool(rd, "attention_bias", false, &cfg->attn_bias));
    KVF_CFG_TRY(kvf_cfg_num(rd, rd->root, "query_pre_attn_scalar", 256.0, &qpas));
    if (!(qpas > 0.0)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'query_pre_attn_scalar' = %g must be"
                     " positive", qpas);
    }
    cfg->attention_multiplier = 1.0 / sqrt(qpas);
    /* transformers: embeddings * sqrt(hidden) as a scalar of the embedding dtype (the
     * product rounds there too; kvferry keeps it in fp32, as every activation) */
    escale = (float)sqrt((double)cfg->hidden_size);
    if (cfg->torch_dtype == KVF_DTYPE_BF16) {
        escale = kvf_bf16_to_fp32(kvf_fp32_to_bf16(escale));
    } else if (cfg->torch_dtype == KVF_DTYPE_FP16) {
        escale = kvf_fp16_to_fp32(kvf_fp32_to_fp16(escale));
    }
    cfg->embedding_multiplier = escale;
    cfg->mlp_gated = true;
    cfg->norm_offset = 1.0;
    cfg->post_norms = true;
    return KVF_OK;
}

/* Each layer's window from @a sliding (sliding_window, default 4096, when any slides). */
static kvf_status_t kvf_gemma_windows(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg,
                                      const bool *sliding, bool local_rope)
{
    bool any_sliding = false;

    for (int l = 0; l < cfg->num_layers; ++l) {
        any_sliding = any_sliding || sliding[l];
    }
    KVF_CFG_TRY(kvf_cfg_window(rd, cfg, 4096, any_sliding));
    for (int l = 0; l < cfg->num_layers; ++l) {
        cfg->layer_window[l] = sliding[l] ? cfg->sliding_window : 0;
        cfg->layer_local_rope[l] = local_rope && sliding[l];
    }
    return KVF_OK;
}

kvf_status_t kvf_cfg_parse_gemma3(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    bool sliding[KVF_MAX_LAYERS] = {false};

    KVF_CFG_TRY(kvf_gemma_common(rd, cfg, 0.0, 0.0));   /* Gemma3TextConfig: no softcaps */
    /* transformers 5.25's Gemma3Attention stores attn_logit_softcapping and never passes it
     * to its attention (eager or sdpa): checked, without effect; final_logit_softcapping
     * caps the logits (Gemma3ForCausalLM) */
    cfg->attn_softcap = 0.0;
    cfg->qk_norm = true;
    KVF_CFG_TRY(kvf_gemma_layer_types(rd, cfg, sliding));
    KVF_CFG_TRY(kvf_gemma_windows(rd, cfg, sliding, true));
    KVF_CFG_TRY(kvf_gemma_rope(rd, cfg, true, &cfg->rope_local));
    KVF_CFG_TRY(kvf_gemma_rope(rd, cfg, false, &cfg->rope));
    kvf_cfg_all_attention(cfg);
    return KVF_OK;
}

/* gemma2: Gemma2Config's defaults (softcaps 50 and 30, layer_types sliding on even layers,
 * one RoPE: rope_parameters / rope_theta, default theta 1e4), no q/k norms. */
kvf_status_t kvf_cfg_parse_gemma2(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    bool sliding[KVF_MAX_LAYERS] = {false};
    kvf_status_t status;

    KVF_CFG_TRY(kvf_gemma_common(rd, cfg, 50.0, 30.0));
    cfg->qk_norm = false;
    status = kvf_cfg_layer_types(rd, cfg, "sliding_attention", "full_attention", sliding);
    if (status == KVF_ERR_NOT_FOUND) {
        for (int l = 0; l < cfg->num_layers; ++l) {
            sliding[l] = ((l + 1) % 2) != 0;   /* Gemma2Config's default layer_types */
        }
    } else if (status != KVF_OK) {
        return status;
    }
    KVF_CFG_TRY(kvf_gemma_windows(rd, cfg, sliding, false));
    KVF_CFG_TRY(kvf_cfg_rope(rd, cfg));
    kvf_cfg_all_attention(cfg);
    return KVF_OK;
}
