/*
 * The multimodal wrappers whose text kvferry serves: config.json of model_type "qwen3_5"
 * (Qwen3_5ForConditionalGeneration) and "qwen3_5_moe" (Qwen3_5MoeForConditionalGeneration),
 * as Qwen publishes Qwen3.5: a nested text_config (model_type qwen3_5_text /
 * qwen3_5_moe_text) and a vision_config; weights under model.language_model. (the text
 * model), model.visual. (the vision tower) and lm_head.
 *
 * Design: the text_config is parsed as the text model it is (every field honoured or
 * refused by name, as a text-only file), with the wrapper's own fields laid over it where
 * transformers reads the wrapper's (tie_word_embeddings; dtype, torch_dtype and
 * quantization_config when the text_config has none); cfg->mm_text makes the loader read
 * the text weights under model.language_model. and leave model.visual. alone (logged once
 * at load: "vision tower not loaded: text-only serving"), as vLLM serves such a model to
 * text-only requests; the proxy refuses image / video content parts by name.
 * Rejected: loading and running the vision tower (no image input path in the proxy, the
 * engine or the KV transfer).
 */
#include "kvf_model_config_int.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *model_type, *text_type;
} kvf_mm_wrappers[] = {
    {"qwen3_5", "qwen3_5_text"},
    {"qwen3_5_moe", "qwen3_5_moe_text"},
};

/* The wrapper's top-level fields (Qwen3_5Config, Qwen3_5MoeConfig). NOTE: keep
 * common/model/README.md in step. */
static const char *const kvf_mm_fields[] = {
    /* read, with an effect */
    "model_type", "text_config", "tie_word_embeddings", "dtype", "torch_dtype",
    "quantization_config",
    /* the vision tower's, not loaded (text-only serving) */
    "vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
    "vision_end_token_id",
    /* known to leave inference unchanged */
    "architectures", "transformers_version", "_name_or_path", "use_cache",
    "output_attentions", "output_hidden_states", "return_dict",
};

/* The wrapper's field @a name laid over the text view: always (@a always), else only where
 * the text_config lacks it. */
static kvf_status_t kvf_mm_over(cJSON *view, const cJSON *root, const char *name, bool always)
{
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(root, name);
    cJSON *dup;

    if ((top == NULL) || (!always && (cJSON_GetObjectItemCaseSensitive(view, name) != NULL))) {
        return KVF_OK;
    }
    dup = cJSON_Duplicate(top, 1);
    if (dup == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(view, name);
    cJSON_AddItemToObject(view, name, dup);
    return KVF_OK;
}

kvf_status_t kvf_cfg_multimodal(const cJSON *root, const char *origin,
                                kvf_status_t (*parse)(const cJSON *, const char *,
                                                      kvf_model_config_t *),
                                kvf_model_config_t *cfg)
{
    const kvf_cfg_reader_t r = {.root = root, .origin = (origin != NULL) ? origin :
                                "config.json"};
    const kvf_cfg_reader_t *rd = &r;
    const cJSON *mt = cJSON_IsObject(root) ?
                      cJSON_GetObjectItemCaseSensitive(root, "model_type") : NULL;
    const cJSON *tc, *it, *tmt;
    char text_origin[512];
    cJSON *view;
    kvf_status_t status;
    size_t w = 0;
    const size_t nw = sizeof(kvf_mm_wrappers) / sizeof(kvf_mm_wrappers[0]);

    while (cJSON_IsString(mt) && (w < nw) &&
           (strcmp(mt->valuestring, kvf_mm_wrappers[w].model_type) != 0)) {
        ++w;
    }
    if (!cJSON_IsString(mt) || (w == nw)) {
        return KVF_ERR_NOT_FOUND;
    }
    cJSON_ArrayForEach(it, root) {
        bool known = false;
        for (size_t i = 0; !known && (i < sizeof(kvf_mm_fields) / sizeof(kvf_mm_fields[0]));
             ++i) {
            known = (strcmp(it->string, kvf_mm_fields[i]) == 0);
        }
        if (!known) {
            KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field '%s' is not known to kvferry for"
                         " model_type '%s' and may change the model: refused (see"
                         " common/model/README.md)", it->string, mt->valuestring);
        }
    }
    tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(tc)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'text_config' of model_type '%s' must be"
                     " an object (the text model's fields)", mt->valuestring);
    }
    tmt = cJSON_GetObjectItemCaseSensitive(tc, "model_type");
    if ((tmt != NULL) && (!cJSON_IsString(tmt) ||
                          (strcmp(tmt->valuestring, kvf_mm_wrappers[w].text_type) != 0))) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'text_config.model_type' = '%s' does not"
                     " match model_type '%s' (its text model is '%s')",
                     cJSON_IsString(tmt) ? tmt->valuestring : "(not a string)",
                     mt->valuestring, kvf_mm_wrappers[w].text_type);
    }
    view = cJSON_Duplicate(tc, 1);
    status = (view == NULL) ? KVF_ERR_NO_MEMORY : KVF_OK;
    if ((status == KVF_OK) && (tmt == NULL) &&
        (cJSON_AddStringToObject(view, "model_type", kvf_mm_wrappers[w].text_type) == NULL)) {
        status = KVF_ERR_NO_MEMORY;
    }
    if (status == KVF_OK) {
        /* transformers ties the wrapper's lm_head by the wrapper's flag (default false) */
        cJSON_DeleteItemFromObjectCaseSensitive(view, "tie_word_embeddings");
        status = kvf_mm_over(view, root, "tie_word_embeddings", true);
    }
    for (size_t i = 0; (status == KVF_OK) && (i < 3); ++i) {
        static const char *const under[] = {"dtype", "torch_dtype", "quantization_config"};
        status = kvf_mm_over(view, root, under[i], false);
    }
    snprintf(text_origin, sizeof(text_origin), "%s (text_config)", rd->origin);
    if (status == KVF_OK) {
        status = parse(view, text_origin, cfg);
    }
    cJSON_Delete(view);
    if (status == KVF_OK) {
        cfg->mm_text = true;
        snprintf(cfg->model_type, sizeof(cfg->model_type), "%s", mt->valuestring);
    }
    return status;
}
