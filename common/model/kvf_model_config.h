/*
 * Model configuration: the fields of a Hugging Face config.json that define
 * cache geometry and the forward pass. Supported model_type values:
 * "nemotron_h" (hybrid: Mamba2 'M', attention '*', MLP '-', MoE 'E', from
 * hybrid_override_pattern or the newer layers_block_type list) and the dense
 * "llama", "qwen3", "mistral" (every layer attention + MLP).
 */
#ifndef KVF_MODEL_CONFIG_H
#define KVF_MODEL_CONFIG_H

#include "kvf_status.h"
#include "kvf_dtype.h"

#include <stdbool.h>
#include <stddef.h>

#define KVF_MAX_LAYERS 512

typedef enum {
    KVF_LAYER_MAMBA     = 'M',
    KVF_LAYER_ATTENTION = '*',
    KVF_LAYER_MLP       = '-',
    KVF_LAYER_MOE       = 'E',
} kvf_layer_kind_t;

typedef enum {
    KVF_ARCH_NEMOTRON_H = 0,
    KVF_ARCH_LLAMA,
    KVF_ARCH_QWEN3,
    KVF_ARCH_MISTRAL,
} kvf_arch_t;

typedef struct kvf_model_config {
    kvf_arch_t  arch;
    char        model_type[32];
    int         hidden_size;
    int         num_layers;           /* entries in layer_kinds */
    char        layer_kinds[KVF_MAX_LAYERS + 1]; /* one kvf_layer_kind_t letter each; dense: "*" per layer */
    bool        dense_mlp_in_layer;   /* dense archs: each '*' layer also has an MLP */
    int         vocab_size;

    /* attention */
    int         num_attention_heads;
    int         num_key_value_heads;
    int         head_dim;
    int         num_attention_layers;

    /* MLP ('-' layers, or the dense layers' MLP) */
    int         intermediate_size;    /* 0 when the model has no dense MLP */

    /* MoE ('E' layers): read when present, used by cost estimates only (kvf plan
     * --hardware); 0 when absent. The engine does not run MoE layers. */
    int         moe_num_experts;              /* n_routed_experts */
    int         moe_top_k;                    /* num_experts_per_tok */
    int         moe_intermediate_size;        /* one routed expert's MLP width */
    int         moe_shared_intermediate_size; /* the shared expert's width (0: none) */

    /* Mamba2 ('M' layers); all 0 for dense models */
    int         mamba_num_heads;
    int         mamba_head_dim;
    int         ssm_state_size;
    int         n_groups;
    int         conv_kernel;
    int         chunk_size;
    int         num_mamba_layers;
    bool        use_conv_bias;        /* default true */
    bool        mamba_proj_bias;      /* in_proj/out_proj bias; default false */
    kvf_dtype_t ssm_cache_dtype;      /* mamba_ssm_cache_dtype; default fp32 */

    double      norm_eps;             /* layer_norm_epsilon / rms_norm_eps */
    kvf_dtype_t torch_dtype;          /* weights as stored; default bf16 */
    int         bos_token_id;         /* -1 when absent */
    int         eos_token_id;         /* -1 when absent */
    bool        tie_word_embeddings;
} kvf_model_config_t;

/** Mamba intermediate size: mamba_num_heads * mamba_head_dim (0 for dense). */
static inline int kvf_model_mamba_inner(const kvf_model_config_t *cfg)
{
    return cfg->mamba_num_heads * cfg->mamba_head_dim;
}

/** True when the model has at least one Mamba layer. */
static inline bool kvf_model_is_hybrid(const kvf_model_config_t *cfg)
{
    return cfg->num_mamba_layers > 0;
}

/**
 * Parse a config.json text into @a cfg_p.
 *
 * @param [in]  json     NUL-terminated JSON text; not retained.
 * @param [in]  origin   Name used in error messages (a path), may be NULL.
 * @param [out] cfg_p    Filled only on success.
 *
 * @return KVF_OK; KVF_ERR_PARSE for invalid JSON; KVF_ERR_UNSUPPORTED for an
 *         unknown model_type; KVF_ERR_INVALID_PARAM for a missing, mistyped,
 *         non-positive or inconsistent field. Every error is logged once,
 *         naming the field, e.g. "config.json: field 'n_groups' = 3 must
 *         divide mamba_num_heads = 64".
 */
kvf_status_t kvf_model_config_parse(const char *json, const char *origin,
                                    kvf_model_config_t *cfg_p);

/**
 * Read and parse a config.json. @a path may be the file or a model folder
 * holding config.json. Errors as kvf_model_config_parse(), plus KVF_ERR_IO
 * when the file cannot be read (logged with %m).
 */
kvf_status_t kvf_model_config_load(const char *path, kvf_model_config_t *cfg_p);

/**
 * 64-bit FNV-1a fingerprint of the fields that define cache geometry and the
 * forward pass (not of dtypes chosen at deploy time). Two instances may only
 * exchange KV when their fingerprints are equal.
 */
uint64_t kvf_model_config_fingerprint(const kvf_model_config_t *cfg);

#endif
