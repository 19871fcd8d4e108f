/* tokenizer_config.json: chat template, BOS/EOS text, the model's folder (kvf_proxy_tokcfg.h). */
#include "kvf_proxy_tokcfg.h"
#include "kvf_json.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* templates are kilobytes; a file past this is not a tokenizer_config.json */
#define KVF_TOKCFG_MAX_BYTES ((size_t)64 << 20)

/* The folder of @a model_path (itself, or the folder of a config.json). */
static void kvf_tokcfg_folder(const char *model_path, char *dir, size_t cap)
{
    struct stat st;

    snprintf(dir, cap, "%s", model_path);
    if ((stat(model_path, &st) == 0) && !S_ISDIR(st.st_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash != NULL) {
            *slash = '\0';
        } else {
            snprintf(dir, cap, ".");
        }
    }
}

/* A token's text: "..." or {"content": "..."}. */
static char *kvf_tokcfg_token(const cJSON *root, const char *name)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, name);

    if (cJSON_IsObject(t)) {
        t = cJSON_GetObjectItemCaseSensitive(t, "content");
    }
    return cJSON_IsString(t) ? strdup(t->valuestring) : NULL;
}

kvf_status_t kvf_proxy_tokcfg_load(const char *model_path, kvf_proxy_tokcfg_t *out)
{
    char dir[PATH_MAX], path[PATH_MAX + 32], real[PATH_MAX];
    const cJSON *t;
    cJSON *root;
    kvf_status_t status;
    struct stat st;

    memset(out, 0, sizeof(*out));
    kvf_tokcfg_folder(model_path, dir, sizeof(dir));
    if (realpath(dir, real) != NULL) {
        out->root = strdup(real);
    }
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    /* no tokenizer_config.json: no template, no special tokens (a bare checkpoint) */
    if ((stat(path, &st) != 0) && (errno == ENOENT)) {
        return KVF_OK;
    }
    status = kvf_json_load(path, KVF_TOKCFG_MAX_BYTES, &root);
    if (status != KVF_OK) {
        return status;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        kvf_error("%s: the document is not a JSON object", path);
        return KVF_ERR_PARSE;
    }
    t = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (cJSON_IsArray(t)) {
        const cJSON *e, *found = NULL;
        cJSON_ArrayForEach(e, t) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && (strcmp(name->valuestring, "default") == 0)) {
                found = cJSON_GetObjectItemCaseSensitive(e, "template");
            }
        }
        t = found;
    }
    if (cJSON_IsString(t)) {
        out->chat_template = strdup(t->valuestring);
    }
    out->bos_token = kvf_tokcfg_token(root, "bos_token");
    out->eos_token = kvf_tokcfg_token(root, "eos_token");
    cJSON_Delete(root);
    return KVF_OK;
}

void kvf_proxy_tokcfg_cleanup(kvf_proxy_tokcfg_t *cfg)
{
    free(cfg->chat_template);
    free(cfg->bos_token);
    free(cfg->eos_token);
    free(cfg->root);
    memset(cfg, 0, sizeof(*cfg));
}
