/*
 * Model configuration: the fields of a Hugging Face config.json that define
 * cache geometry and the forward pass. Supported model_type values:
 * "nemotron_h" (hybrid: Mamba2 'M', attention '*', MLP '-', MoE 'E', from
 * hybrid_override_pattern or the newer layers_block_type list), the dense
 * "llama", "qwen3", "mistral" (every layer attention + MLP), and the Mamba2 +
 * attention hybrids whose every layer is a mixer ('M' or '*') followed by its
 * FFN: "bamba" (gated MLP) and "granitemoehybrid" (IBM Granite 4.0-H: shared
 * gated MLP plus routed experts, and the Granite multipliers), and
 * "gemma3_text" (Gemma 3's text decoder: sliding and full attention layers with
 * their own RoPE, RMSNorms scaling by (1 + weight), norms after attention and
 * after the MLP, embeddings scaled by sqrt(hidden_size)), "gpt_oss"
 * (OpenAI's gpt-oss: sliding / full attention layers with attention sinks and
 * biases, YaRN RoPE, routed experts with a clamped SwiGLU in every layer), "qwen3_next"
 * (Qwen3-Next: Gated DeltaNet layers 'M' with state_kind KVF_STATE_GDN and gated
 * attention layers '*', each followed by routed experts or its gated MLP), and
 * "qwen3_5_text" (Qwen3.5's text model: the same layers with separate Gated DeltaNet
 * projections, each followed by its gated MLP).
 */
#ifndef KVF_MODEL_CONFIG_H
#define KVF_MODEL_CONFIG_H

#include "kvf_status.h"
#include "kvf_dtype.h"

#include <stdbool.h>
#include <stddef.h>

#define KVF_MAX_LAYERS   512   /* decoder layers per model */
#define KVF_MAX_KV_HEADS 512   /* KV heads one rank holds (planner scratch bound) */
#define KVF_MAX_EOS      8     /* stop tokens of an eos_token_id list */

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
    KVF_ARCH_BAMBA,              /* Mamba2 / attention layers, each with a gated MLP */
    KVF_ARCH_GRANITE_MOE_HYBRID, /* Mamba2 / attention layers, each with shared MLP + MoE */
    KVF_ARCH_GEMMA3_TEXT,        /* dense, sliding / full layers, (1 + w) norms, post norms */
    KVF_ARCH_GPT_OSS,            /* sliding / full layers with sinks, experts in every layer */
    KVF_ARCH_QWEN3_NEXT,         /* Gated DeltaNet / gated attention layers, each with its FFN */
    KVF_ARCH_QWEN3_5_TEXT,       /* Qwen3.5's text model: qwen3_next's layers, a dense MLP each */
    KVF_ARCH_GEMMA2,             /* gemma3_text's layers without q/k norms, one RoPE, softcaps */
} kvf_arch_t;

/** What a state layer ('M') computes; its state's shape is the same for every kind
 * (kvf_model_config_t's Mamba fields: conv channels x | B | C, state [heads][head_dim]
 * [state_size]), so the planner, the handshake and the transfer move any kind alike. */
typedef enum {
    KVF_STATE_MAMBA2 = 0,   /* Mamba2 SSD (nemotron_h, bamba, granitemoehybrid) */
    KVF_STATE_GDN,          /* Gated DeltaNet (qwen3_next): x = v, B = k, C = q, heads = value
                               heads, groups = key heads, state [v heads][v dim][k dim] */
} kvf_state_kind_t;

/** Activation functions (transformers' ACT2FN names in kvf_act_parse()). */
typedef enum {
    KVF_ACT_SILU = 0,     /* "silu", "swish": x * sigmoid(x) */
    KVF_ACT_RELU2,        /* "relu2": relu(x)^2 */
    KVF_ACT_RELU,         /* "relu" */
    KVF_ACT_GELU,         /* "gelu", "gelu_python": exact, erf */
    KVF_ACT_GELU_TANH,    /* "gelu_new", "gelu_fast", "gelu_pytorch_tanh": tanh approximation */
    KVF_ACT_QUICK_GELU,   /* "quick_gelu": x * sigmoid(1.702 x) */
    KVF_ACT_SIGMOID,      /* "sigmoid" */
    KVF_ACT_TANH,         /* "tanh" */
    KVF_ACT_COUNT
} kvf_act_t;

/** RoPE frequency rules (rope_parameters / rope_scaling "rope_type"). */
typedef enum {
    KVF_ROPE_NONE = 0,    /* nemotron_h attention: no positional encoding */
    KVF_ROPE_DEFAULT,     /* inv_freq[i] = theta^(-2i/head_dim) */
    KVF_ROPE_LINEAR,      /* default / factor */
    KVF_ROPE_LLAMA3,      /* Llama 3.1 wavelength-banded scaling */
    KVF_ROPE_YARN,        /* YaRN (gpt_oss): interpolation / extrapolation ramp, cos and sin
                             scaled by attention_factor */
} kvf_rope_type_t;

typedef struct kvf_rope {
    kvf_rope_type_t type;
    double          theta;            /* rope_theta; default 10000 */
    double          factor;           /* linear, llama3 */
    double          low_freq_factor;  /* llama3 */
    double          high_freq_factor; /* llama3 */
    double          original_max_pos; /* llama3: original_max_position_embeddings */
    double          beta_fast;        /* yarn: the ramp's bounds (rotations), default 32 */
    double          beta_slow;        /* yarn: default 1 */
    bool            truncate;         /* yarn: floor / ceil the ramp's bounds, default true */
    double          attention_factor; /* yarn: cos and sin scale (0.1 ln(factor) + 1 unless
                                         given); 1 elsewhere */
    int             rotary_dim;       /* leading dims of each head rotated (inv_freq over
                                         this width): head_dim * partial_rotary_factor,
                                         truncated as transformers; head_dim unless bamba */
} kvf_rope_t;

typedef struct kvf_model_config {
    kvf_arch_t  arch;
    char        model_type[32];
    bool        mm_text;              /* a multimodal wrapper's text (model_type qwen3_5,
                                         qwen3_5_moe): text_config read, weights under
                                         model.language_model., the vision tower not
                                         loaded (kvf_model_config_mm.c) */
    int         hidden_size;
    int         num_layers;           /* entries in layer_kinds */
    char        layer_kinds[KVF_MAX_LAYERS + 1]; /* one kvf_layer_kind_t letter each; dense: "*" per layer */
    bool        dense_mlp_in_layer;   /* dense archs: each '*' layer also has an MLP;
                                         bamba / granitemoehybrid: each layer ('M' or '*')
                                         is followed by its FFN (norm2 then the MLP) */
    bool        moe_in_layer;         /* granitemoehybrid with experts: that FFN is routed
                                         experts plus the shared MLP (sh_up / sh_down) */
    int         vocab_size;

    /* attention */
    int         num_attention_heads;
    int         num_key_value_heads;
    int         head_dim;
    int         num_attention_layers;

    /* MLP ('-' layers, or the dense layers' MLP) */
    int         intermediate_size;    /* 0 when the model has no dense MLP */

    /* MoE ('E' layers, nemotron_h): read when present (0 when absent), required
     * and checked when the pattern has MoE layers; the runner computes them and
     * kvf plan --hardware estimates their cost. */
    int         moe_num_experts;              /* n_routed_experts */
    int         moe_top_k;                    /* num_experts_per_tok */
    int         moe_intermediate_size;        /* one routed expert's MLP width */
    int         moe_shared_intermediate_size; /* moe_shared_expert_intermediate_size */

    /* Mamba2 ('M' layers); all 0 for dense models */
    int         mamba_num_heads;
    int         mamba_head_dim;
    int         ssm_state_size;
    int         n_groups;
    int         conv_kernel;
    int         chunk_size;
    int         num_mamba_layers;
    bool        use_conv_bias;        /* default true */
    bool        mamba_proj_bias;      /* in_proj/out_proj bias: use_bias (default false) */
    kvf_act_t   mamba_act;            /* mamba_hidden_act after the conv; default silu */
    double      dt_limit_low;         /* time_step_limit [low, high]: prompt tokens' dt is */
    double      dt_limit_high;        /* clamped to it, decode steps' is not (transformers
                                         5.25); default [0, inf] */
    kvf_dtype_t ssm_cache_dtype;      /* mamba_ssm_cache_dtype; default fp32 */
    kvf_state_kind_t state_kind;      /* what the 'M' layers compute (Mamba2 unless qwen3_next) */

    /* MLP / experts */
    kvf_act_t   mlp_act;              /* mlp_hidden_act (nemotron_h, default relu2) or
                                         hidden_act (dense, default silu, SwiGLU) */
    bool        mlp_bias;             /* mlp_bias: up/down (and gate) biases */
    bool        mlp_gated;            /* dense archs: down(act(gate(x)) * up(x)) */

    /* MoE routing ('E' layers); defaults when the pattern has none */
    int         moe_n_group;                   /* n_group */
    int         moe_topk_group;                /* topk_group */
    bool        moe_norm_topk_prob;            /* norm_topk_prob, default true */
    double      moe_routed_scaling;            /* routed_scaling_factor, default 1 */
    bool        moe_softmax_topk;              /* granitemoehybrid: top-k of the router
                                                  logits, weights softmax(top-k logits) */
    bool        moe_softmax_full;              /* with moe_softmax_topk (qwen3_next,
                                                  norm_topk_prob false): the weights are the
                                                  top-k entries of the softmax over all
                                                  experts, not renormalised */
    bool        moe_gated;                     /* experts and shared MLP gated: fused
                                                  gate|up rows, down(act(gate) * up) */
    int         num_moe_layers;
    bool        layer_sparse[KVF_MAX_LAYERS]; /* qwen3_next: the layer's FFN is routed experts
                                         plus a shared expert scaled by sigmoid(gate x)
                                         (sh_gate); false: its dense MLP. false elsewhere */

    /* attention extras (dense archs) */
    bool        attn_bias;            /* attention_bias: q/k/v/o biases */
    bool        qk_norm;              /* qwen3: per-head RMSNorm of q and k before RoPE */
    kvf_rope_t  rope;                 /* every attention layer's; gemma3_text: the full ones' */
    kvf_rope_t  rope_local;           /* gemma3_text: the sliding layers' RoPE
                                         (rope_parameters.sliding_attention); type NONE
                                         elsewhere: every layer uses rope */
    double      norm_offset;          /* gemma3_text 1: each RMSNorm scales by (1 + weight);
                                         0 elsewhere */
    bool        post_norms;           /* gemma3_text: a norm on the attention output and on
                                         the MLP output before each residual add */
    bool        attn_sinks;           /* gpt_oss: a learned logit per query head joins each
                                         softmax's denominator (self_attn.sinks) */
    bool        router_bias;          /* gpt_oss: the router's linear bias (mlp.router.bias) */
    bool        moe_swiglu_clamp;     /* gpt_oss: experts' interleaved gate_up with biases and
                                         (clamp(up) + 1) * g * sigmoid(alpha g), g = min(gate,
                                         limit) */
    double      swiglu_alpha;         /* gpt_oss: swiglu_alpha, default 1.702 */
    double      swiglu_limit;         /* gpt_oss: swiglu_limit, default 7 */
    bool        attn_output_gate;     /* qwen3_next: q_proj also yields a gate per head;
                                         attention output * sigmoid(gate) before o_proj */

    double      norm_eps;             /* layer_norm_epsilon / rms_norm_eps */
    /* granitemoehybrid's multipliers (1, 1, 1 and 0 elsewhere) */
    double      embedding_multiplier; /* embeddings * this */
    double      residual_multiplier;  /* h += mixer / FFN output * this */
    double      logits_scaling;       /* logits / this */
    double      attention_multiplier; /* attention score scale; 0: 1/sqrt(head_dim) */
    double      attn_softcap;         /* gemma2 / gemma3_text attn_logit_softcapping: scaled
                                         scores -> c tanh(s / c) before the softmax; 0: none */
    double      final_softcap;        /* final_logit_softcapping: logits -> c tanh(x / c)
                                         after the head; 0: none */
    kvf_dtype_t torch_dtype;          /* dtype (or legacy torch_dtype); default bf16 */
    int         bos_token_id;         /* -1 when absent */
    int         eos_token_id;         /* -1 when absent; the first of a list */
    int         num_eos;              /* entries in eos_token_ids (0 when absent) */
    int         eos_token_ids[KVF_MAX_EOS]; /* every stop token (eos_token_id may be a list:
                                         transformers stops on any of them) */
    int         sliding_window;       /* tokens a query attends back, itself included
                                         (mistral: 4096 when the field is absent, as
                                         transformers); 0: none (or cannot bind) */
    int         layer_window[KVF_MAX_LAYERS]; /* per layer: sliding_window on a sliding
                                         layer (mistral: every layer; qwen3: the layers
                                         layer_types marks sliding_attention, or from
                                         max_window_layers on), 0 on a full-attention one */
    bool        layer_local_rope[KVF_MAX_LAYERS]; /* gemma3_text: the layer is a
                                         sliding_attention one and uses rope_local (whether
                                         or not its window binds); false elsewhere */
    int         max_position_embeddings; /* longest sequence (prompt + output); 0: absent */
    bool        tie_word_embeddings;  /* as written in the file */
    bool        lm_head_tied;         /* lm_head = embeddings: dense archs with
                                         tie_word_embeddings; never nemotron_h
                                         (transformers' NemotronH does not tie) */
} kvf_model_config_t;

/** True when @a tok is one of the model's stop tokens (eos_token_id or any of its list). */
static inline bool kvf_model_is_eos(const kvf_model_config_t *cfg, int tok)
{
    for (int i = 0; i < cfg->num_eos; ++i) {
        if (cfg->eos_token_ids[i] == tok) {
            return true;
        }
    }
    return false;
}

/**
 * transformers' activation name -> kvf_act_t. @return 0, or -1 for a name
 * kvferry does not implement.
 */
int kvf_act_parse(const char *name, kvf_act_t *act_p);

/** Canonical name of @a act ("silu", "relu2", ...). */
const char *kvf_act_name(kvf_act_t act);

/** Apply @a act in place to n floats. */
void kvf_act_apply(kvf_act_t act, float *x, size_t n);

/** Mamba intermediate size: mamba_num_heads * mamba_head_dim (0 for dense). */
static inline int kvf_model_mamba_inner(const kvf_model_config_t *cfg)
{
    return cfg->mamba_num_heads * cfg->mamba_head_dim;
}

/** True when layer @a l runs routed experts (an 'E' layer, any layer of a
 * granitemoehybrid model with experts, a qwen3_next sparse layer). */
static inline bool kvf_model_layer_has_moe(const kvf_model_config_t *cfg, int l)
{
    return (cfg->layer_kinds[l] == KVF_LAYER_MOE) || cfg->moe_in_layer || cfg->layer_sparse[l];
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
 * Every field is honoured or refused (common/model/README.md has the table):
 * a field kvferry does not implement with a value that changes the math
 * (sliding_window of nemotron_h, a rope_type other than default/linear/llama3, an
 * activation it lacks, quantization_config, moe_latent_size, ...) and any
 * field it does not know at all are refused, naming field and value.
 *
 * @return KVF_OK; KVF_ERR_PARSE for invalid JSON; KVF_ERR_UNSUPPORTED for an
 *         unknown model_type, an unknown field or a value not implemented;
 *         KVF_ERR_INVALID_PARAM for a missing, mistyped, non-positive or
 *         inconsistent field. Every error is logged once, on one line,
 *         naming the field and value, e.g. "config.json: field 'n_groups' =
 *         3 must divide mamba_num_heads = 64".
 */
kvf_status_t kvf_model_config_parse(const char *json, const char *origin,
                                    kvf_model_config_t *cfg_p);

struct cJSON;

/**
 * kvf_model_config_parse() on a tree already parsed (by kvf_json_parse() or
 * kvf_json_load(), which read Python's Infinity/NaN literals); @a root stays
 * the caller's. Errors as kvf_model_config_parse(); KVF_ERR_PARSE when
 * @a root is not an object.
 */
kvf_status_t kvf_model_config_from_json(const struct cJSON *root, const char *origin,
                                        kvf_model_config_t *cfg_p);

/**
 * Read and parse a config.json. @a path may be the file or a model folder
 * holding config.json. Errors as kvf_model_config_parse(), plus KVF_ERR_IO
 * when the file cannot be read (logged with the path and %m); a file that does
 * not parse is logged with its line and column (kvf_json_parse()).
 */
kvf_status_t kvf_model_config_load(const char *path, kvf_model_config_t *cfg_p);

/**
 * 64-bit fingerprint (XXH3: kvf_hash64() chained field by field, fixed-width
 * little-endian fields) of the fields that define cache geometry and the forward
 * pass (not of dtypes chosen at deploy time). Two instances may only exchange KV
 * when their fingerprints are equal (protocol version 3 on: FNV-1a before).
 */
uint64_t kvf_model_config_fingerprint(const kvf_model_config_t *cfg);

#endif
