/*
 * Internal to common/model's config parser: the field readers of
 * kvf_model_config.c shared with the per-family parsers of other files
 * (kvf_model_config_ibm.c: bamba, granitemoehybrid). Every reader logs one
 * line naming the field (and its value) when it fails; "absent or null"
 * gives the default.
 */
#ifndef KVF_MODEL_CONFIG_INT_H
#define KVF_MODEL_CONFIG_INT_H

#include "kvf_model_config.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>

typedef struct {
    const cJSON *root;
    const char  *origin;
} kvf_cfg_reader_t;

/* Required positive integer. */
kvf_status_t kvf_cfg_int(const kvf_cfg_reader_t *rd, const char *name, int *out);
/* Optional integer in [0, 1e9] (the first entry of a list). */
kvf_status_t kvf_cfg_int_opt(const kvf_cfg_reader_t *rd, const char *name, int dflt, int *out);
kvf_status_t kvf_cfg_bool(const kvf_cfg_reader_t *rd, const char *name, bool dflt, bool *out);
/* Optional finite number of object @a obj (rd->root or a nested object). */
kvf_status_t kvf_cfg_num(const kvf_cfg_reader_t *rd, const cJSON *obj, const char *name,
                         double dflt, double *out);
kvf_status_t kvf_cfg_act(const kvf_cfg_reader_t *rd, const char *name, kvf_act_t dflt,
                         kvf_act_t *out);
kvf_status_t kvf_cfg_dtype_opt(const kvf_cfg_reader_t *rd, const char *name, kvf_dtype_t dflt,
                               kvf_dtype_t *out);
/* @a a divides @a b (and is positive), else the error names both. */
kvf_status_t kvf_cfg_divides(const char *origin, const char *a_name, int a, const char *b_name,
                             int b);
/* @a a when the file has it, else @a b when the file has that, else @a a. */
const char *kvf_cfg_alias(const kvf_cfg_reader_t *rd, const char *a, const char *b);
/* Present and not null. */
bool kvf_cfg_present(const kvf_cfg_reader_t *rd, const char *name);
/* Short text of a JSON value for a refusal message. */
void kvf_cfg_value_str(const cJSON *item, char *buf, size_t len);
/* RoPE: rope_parameters / rope_scaling + rope_theta into cfg->rope (rotary_dim too;
 * partial_rotary_factor other than 1 refused except for bamba). */
kvf_status_t kvf_cfg_rope(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);
/* time_step_limit / mamba_dt_limit: a pair [low, high], 0 <= low <= high, into
 * cfg->dt_limit_low / dt_limit_high (default [0, inf]); null refused. */
kvf_status_t kvf_cfg_dt_limit(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);

/* kvf_model_config_ibm.c: whether @a name is a field of @a arch's files there (bamba,
 * granitemoehybrid), and the two parsers (after kvf_cfg_common()). */
bool kvf_cfg_ibm_known(const char *name, kvf_arch_t arch);
kvf_status_t kvf_cfg_parse_bamba(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);
kvf_status_t kvf_cfg_parse_granite(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);

/* sliding_window -> cfg->sliding_window (kvf_model_config.c): @a absent when missing, 0 when
 * null, when not @a apply, or when it cannot bind (>= max_position_embeddings). */
kvf_status_t kvf_cfg_window(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg, int absent,
                            bool apply);

/* kvf_model_config_gemma.c: whether @a name is a field of gemma3_text (gemma2) files, and
 * their parsers
 * (after kvf_cfg_common()). */
bool kvf_cfg_gemma_known(const char *name, kvf_arch_t arch);
kvf_status_t kvf_cfg_parse_gemma3(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);
kvf_status_t kvf_cfg_parse_gemma2(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);

/* kvf_model_config_gpt_oss.c: whether @a name is a field of gpt_oss files, and its parser
 * (after kvf_cfg_common()). */
bool kvf_cfg_gpt_oss_known(const char *name);
kvf_status_t kvf_cfg_parse_gpt_oss(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);
/* kvf_model_config_qwen3_next.c: whether @a name is a field of @a model_type's files
 * (qwen3_next, qwen3_5_text, qwen3_5_moe_text), and their parsers (after kvf_cfg_common()). */
bool kvf_cfg_qwen3_next_known(const char *name, const char *model_type);
kvf_status_t kvf_cfg_parse_qwen3_next(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);
kvf_status_t kvf_cfg_parse_qwen3_5_text(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);
kvf_status_t kvf_cfg_parse_qwen3_5_moe_text(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);

/* kvf_model_config_mm.c: a multimodal wrapper's config.json (model_type qwen3_5,
 * qwen3_5_moe): its own fields checked, its text_config parsed as the text model it nests
 * (@a parse: kvf_model_config_from_json) into *cfg with cfg->mm_text set. KVF_ERR_NOT_FOUND
 * when @a root is not such a wrapper; else the parse's status (a field refused by name). */
kvf_status_t kvf_cfg_multimodal(const cJSON *root, const char *origin,
                                kvf_status_t (*parse)(const cJSON *, const char *,
                                                      kvf_model_config_t *),
                                kvf_model_config_t *cfg);

/* Every key of object @a obj (field @a field; NULL: none) is one of @a allowed[n]; else
 * KVF_ERR_UNSUPPORTED, logged as "field 'field.key' = value is not implemented@a for:
 * refused". */
kvf_status_t kvf_cfg_keys_known(const kvf_cfg_reader_t *rd, const cJSON *obj, const char *field,
                                const char *const *allowed, size_t n, const char *for_what);

/* num_hidden_layers, required and at most KVF_MAX_LAYERS, into cfg->num_layers. */
kvf_status_t kvf_cfg_num_layers(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg);

/* A model whose every layer is attention followed by its FFN (the dense decoders, gemma3_text,
 * gpt_oss): cfg->layer_kinds, the layer counts, no Mamba state, lm_head tied as the file says. */
void kvf_cfg_all_attention(kvf_model_config_t *cfg);

/* layer_types: a list of num_hidden_layers names, each @a a or @a b, into @a is_a[l] (true:
 * @a a). KVF_ERR_NOT_FOUND when absent or null (the family's default applies); a list of
 * another length (KVF_ERR_INVALID_PARAM) or another name (KVF_ERR_UNSUPPORTED) is refused
 * naming the field and the entry. */
kvf_status_t kvf_cfg_layer_types(const kvf_cfg_reader_t *rd, const kvf_model_config_t *cfg,
                                 const char *a, const char *b, bool *is_a);

/* In the per-architecture parsers: return the first error, naming the origin. */
#define KVF_CFG_TRY(_expr)                                  \
    do {                                                    \
        kvf_status_t kvf_cfg_st_ = (_expr);                 \
        if (kvf_cfg_st_ != KVF_OK) {                        \
            return kvf_cfg_st_;                             \
        }                                                   \
    } while (0)

#define KVF_CFG_FAIL(_status, _fmt, ...)                    \
    do {                                                    \
        kvf_error("%s: " _fmt, rd->origin, ##__VA_ARGS__);  \
        return (_status);                                   \
    } while (0)

#endif
