/*
 * config.json -> kvf_tok_config_t: the four fields a front end needs
 * (kvf_tok_config.h says why this is not the engine's reader).
 */
#include "kvf_tok_config.h"
#include "kvf_json.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define KVF_TOK_CONFIG_MAX_BYTES ((size_t)16 << 20)   /* a config.json is kilobytes */

/* Integer field @a name: @a dflt when absent or null (@a required: an error),
 * a list's first entry; an integer in [@a lo, 1e9] else KVF_ERR_INVALID_PARAM. */
static kvf_status_t kvf_tok_cfg_int(const char *file, const cJSON *root, const char *name,
                                    bool required, int lo, int dflt, int *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, name);

    if ((item == NULL) || cJSON_IsNull(item)) {
        if (required) {
            kvf_error("%s: missing field '%s'", file, name);
            return KVF_ERR_INVALID_PARAM;
        }
        *out = dflt;
        return KVF_OK;
    }
    if (!required && cJSON_IsArray(item) && (cJSON_GetArraySize(item) > 0)) {
        item = cJSON_GetArrayItem(item, 0);   /* eos_token_id may be a list */
    }
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble) ||
        (item->valuedouble != floor(item->valuedouble))) {
        kvf_error("%s: field '%s' must be an integer", file, name);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((item->valuedouble < lo) || (item->valuedouble > 1e9)) {
        kvf_error("%s: field '%s' = %g must be an integer from %d to 1e9", file, name,
                  item->valuedouble, lo);
        return KVF_ERR_INVALID_PARAM;
    }
    *out = (int)item->valuedouble;
    return KVF_OK;
}

static kvf_status_t kvf_tok_cfg_fields(const char *file, const cJSON *root, kvf_tok_config_t *c)
{
    kvf_status_t status;

    if (!cJSON_IsObject(root)) {
        kvf_error("%s: must be a JSON object", file);
        return KVF_ERR_INVALID_PARAM;
    }
    /* a multimodal wrapper (qwen3_5, qwen3_5_moe): its text model's fields, as the engine
     * reads them (common/model/kvf_model_config_mm.c) */
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "text_config"))) {
        root = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    }
    status = kvf_tok_cfg_int(file, root, "vocab_size", true, 1, 0, &c->vocab_size);
    if (status == KVF_OK) {
        status = kvf_tok_cfg_int(file, root, "bos_token_id", false, 0, -1, &c->bos_token_id);
    }
    if (status == KVF_OK) {
        status = kvf_tok_cfg_int(file, root, "eos_token_id", false, 0, -1, &c->eos_token_id);
    }
    if (status == KVF_OK) {
        status = kvf_tok_cfg_int(file, root, "max_position_embeddings", false, 0, 0,
                                 &c->max_position_embeddings);
    }
    if (status != KVF_OK) {
        return status;
    }
    /* an id outside the vocabulary would make every request fail: refuse at start */
    if ((c->bos_token_id >= c->vocab_size) || (c->eos_token_id >= c->vocab_size)) {
        bool bos = (c->bos_token_id >= c->vocab_size);
        kvf_error("%s: field '%s' = %d is outside the vocabulary [0, %d) (vocab_size)", file,
                  bos ? "bos_token_id" : "eos_token_id",
                  bos ? c->bos_token_id : c->eos_token_id, c->vocab_size);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

kvf_status_t kvf_tok_config_load(const char *path, kvf_tok_config_t *out)
{
    char file[4096];
    cJSON *root;
    kvf_tok_config_t c;
    kvf_status_t status;

    status = kvf_json_load_config(path, KVF_TOK_CONFIG_MAX_BYTES, file, sizeof(file), &root);
    if (status != KVF_OK) {
        return status;
    }
    memset(&c, 0, sizeof(c));
    status = kvf_tok_cfg_fields(file, root, &c);
    cJSON_Delete(root);
    if (status == KVF_OK) {
        *out = c;
    }
    return status;
}
