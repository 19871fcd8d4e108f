/*
 * The config.json field readers every family's parser uses (kvf_model_config_int.h), and the
 * activation names. Each reader logs the field's name and the value found on failure, so an
 * operator sees which field is missing or bad.
 */
#include "kvf_model_config.h"
#include "kvf_model_config_int.h"
#include "kvf_log.h"
#include "kvf_act_math.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* Required positive integer field. */
kvf_status_t kvf_cfg_int(const kvf_cfg_reader_t *rd, const char *name, int *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, name);

    if (item == NULL) {
        kvf_error("%s: missing field '%s'", rd->origin, name);
        return KVF_ERR_INVALID_PARAM;
    }
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble) ||
        (item->valuedouble != floor(item->valuedouble))) {
        kvf_error("%s: field '%s' must be an integer", rd->origin, name);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((item->valuedouble <= 0) || (item->valuedouble > 1e9)) {
        kvf_error("%s: field '%s' = %g must be a positive integer", rd->origin, name,
                  item->valuedouble);
        return KVF_ERR_INVALID_PARAM;
    }
    *out = (int)item->valuedouble;
    return KVF_OK;
}

/* Optional integer: *out = dflt when absent or null; error when mistyped. */
kvf_status_t kvf_cfg_int_opt(const kvf_cfg_reader_t *rd, const char *name, int dflt,
                                    int *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, name);

    if ((item == NULL) || cJSON_IsNull(item)) {
        *out = dflt;
        return KVF_OK;
    }
    if (cJSON_IsArray(item) && (cJSON_GetArraySize(item) > 0)) {
        item = cJSON_GetArrayItem(item, 0);   /* eos_token_id may be a list */
    }
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble)) {
        kvf_error("%s: field '%s' must be an integer", rd->origin, name);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((item->valuedouble < 0) || (item->valuedouble > 1e9)) {
        kvf_error("%s: field '%s' = %g must be an integer from 0 to 1e9", rd->origin, name,
                  item->valuedouble);
        return KVF_ERR_INVALID_PARAM;
    }
    *out = (int)item->valuedouble;
    return KVF_OK;
}

/* Optional boolean: dflt when absent or null; error when mistyped. */
kvf_status_t kvf_cfg_bool(const kvf_cfg_reader_t *rd, const char *name, bool dflt,
                                 bool *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, name);

    if ((item == NULL) || cJSON_IsNull(item)) {
        *out = dflt;
        return KVF_OK;
    }
    if (!cJSON_IsBool(item)) {
        kvf_error("%s: field '%s' must be true or false", rd->origin, name);
        return KVF_ERR_INVALID_PARAM;
    }
    *out = cJSON_IsTrue(item);
    return KVF_OK;
}

/* Optional number: dflt when absent or null. */
kvf_status_t kvf_cfg_num(const kvf_cfg_reader_t *rd, const cJSON *obj, const char *name,
                                double dflt, double *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, name);

    if ((item == NULL) || cJSON_IsNull(item)) {
        *out = dflt;
        return KVF_OK;
    }
    if (!cJSON_IsNumber(item)) {
        kvf_error("%s: field '%s' must be a number", rd->origin, name);
        return KVF_ERR_INVALID_PARAM;
    }
    /* Python's json writes Infinity and NaN (kvf_json.h); no field read here means them */
    if (!isfinite(item->valuedouble)) {
        kvf_error("%s: field '%s' = %g must be a finite number", rd->origin, name,
                  item->valuedouble);
        return KVF_ERR_INVALID_PARAM;
    }
    *out = item->valuedouble;
    return KVF_OK;
}

/* Optional activation name. */
kvf_status_t kvf_cfg_act(const kvf_cfg_reader_t *rd, const char *name, kvf_act_t dflt,
                                kvf_act_t *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, name);

    if ((item == NULL) || cJSON_IsNull(item)) {
        *out = dflt;
        return KVF_OK;
    }
    if (!cJSON_IsString(item)) {
        kvf_error("%s: field '%s' must be an activation name", rd->origin, name);
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_act_parse(item->valuestring, out) != 0) {
        kvf_error("%s: field '%s' = '%s' is not implemented (silu, swish, relu, relu2, gelu,"
                  " gelu_new, gelu_fast, gelu_pytorch_tanh, quick_gelu, sigmoid, tanh)",
                  rd->origin, name, item->valuestring);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

kvf_status_t kvf_cfg_dtype_opt(const kvf_cfg_reader_t *rd, const char *name,
                                      kvf_dtype_t dflt, kvf_dtype_t *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, name);

    if ((item == NULL) || cJSON_IsNull(item)) {
        *out = dflt;
        return KVF_OK;
    }
    if (!cJSON_IsString(item) || (kvf_dtype_parse(item->valuestring, out) != 0)) {
        kvf_error("%s: field '%s' is not a known dtype (float32, bfloat16, float16)",
                  rd->origin, name);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

kvf_status_t kvf_cfg_divides(const char *origin, const char *a_name, int a,
                                    const char *b_name, int b)
{
    if ((a <= 0) || (b % a) != 0) {
        kvf_error("%s: field '%s' = %d must divide %s = %d", origin, a_name, a, b_name, b);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* ---- activations ------------------------------------------------------------ */

static const struct {
    const char *name;
    kvf_act_t   act;
} kvf_act_names[] = {
    {"silu", KVF_ACT_SILU},           {"swish", KVF_ACT_SILU},
    {"relu2", KVF_ACT_RELU2},         {"relu", KVF_ACT_RELU},
    {"gelu", KVF_ACT_GELU},           {"gelu_python", KVF_ACT_GELU},
    {"gelu_new", KVF_ACT_GELU_TANH},  {"gelu_fast", KVF_ACT_GELU_TANH},
    {"gelu_pytorch_tanh", KVF_ACT_GELU_TANH}, {"gelu_python_tanh", KVF_ACT_GELU_TANH},
    {"quick_gelu", KVF_ACT_QUICK_GELU}, {"sigmoid", KVF_ACT_SIGMOID},
    {"tanh", KVF_ACT_TANH},
};

int kvf_act_parse(const char *name, kvf_act_t *act_p)
{
    for (size_t i = 0; i < sizeof(kvf_act_names) / sizeof(kvf_act_names[0]); ++i) {
        if (strcmp(name, kvf_act_names[i].name) == 0) {
            *act_p = kvf_act_names[i].act;
            return 0;
        }
    }
    return -1;
}

const char *kvf_act_name(kvf_act_t act)
{
    static const char *const names[KVF_ACT_COUNT] = {
        "silu", "relu2", "relu", "gelu", "gelu_tanh", "quick_gelu", "sigmoid", "tanh",
    };
    return ((unsigned)act < KVF_ACT_COUNT) ? names[act] : "invalid";
}

/* the kernels' shared activation bodies (kernels/kvf_act_math.h) use kvf_act_t's values */
_Static_assert((KVF_ACT_SILU == KVF_KACT_SILU) && (KVF_ACT_RELU2 == KVF_KACT_RELU2) &&
               (KVF_ACT_RELU == KVF_KACT_RELU) && (KVF_ACT_GELU == KVF_KACT_GELU) &&
               (KVF_ACT_GELU_TANH == KVF_KACT_GELU_TANH) &&
               (KVF_ACT_QUICK_GELU == KVF_KACT_QUICK_GELU) &&
               (KVF_ACT_SIGMOID == KVF_KACT_SIGMOID) && (KVF_ACT_TANH == KVF_KACT_TANH) &&
               (KVF_ACT_COUNT == KVF_KACT_COUNT), "kvf_act_t and KVF_KACT_* differ");

void kvf_act_apply(kvf_act_t act, float *x, size_t n)
{
    if ((unsigned)act >= KVF_ACT_COUNT) {
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        x[i] = kvf_act_hd((int)act, x[i]);   /* the body a CUDA thread runs (kvf_act_math.h) */
    }
}

/* First present name of @a names (aliases, newest first), or NULL. */
const char *kvf_cfg_alias(const kvf_cfg_reader_t *rd, const char *a, const char *b)
{
    return (cJSON_GetObjectItemCaseSensitive(rd->root, a) != NULL) ? a :
           (cJSON_GetObjectItemCaseSensitive(rd->root, b) != NULL) ? b : a;
}

bool kvf_cfg_present(const kvf_cfg_reader_t *rd, const char *name)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, name);
    return (item != NULL) && !cJSON_IsNull(item);
}

/* Short text of a JSON value for a refusal message. */
void kvf_cfg_value_str(const cJSON *item, char *buf, size_t len)
{
    char *p = cJSON_PrintUnformatted(item);
    snprintf(buf, len, "%s", (p != NULL) ? p : "?");
    if (strlen(buf) + 1 >= len) {
        snprintf(buf + len - 4, 4, "...");
    }
    free(p);
}

kvf_status_t kvf_cfg_layer_types(const kvf_cfg_reader_t *rd, const kvf_model_config_t *cfg,
                                 const char *a, const char *b, bool *is_a)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(rd->root, "layer_types");

    if ((lt == NULL) || cJSON_IsNull(lt)) {
        return KVF_ERR_NOT_FOUND;
    }
    if (!cJSON_IsArray(lt) || (cJSON_GetArraySize(lt) != cfg->num_layers)) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'layer_types' must be a list of"
                     " num_hidden_layers = %d entries", cfg->num_layers);
    }
    for (int l = 0; l < cfg->num_layers; ++l) {
        const cJSON *e = cJSON_GetArrayItem(lt, l);
        const char *v = cJSON_IsString(e) ? e->valuestring : "?";
        if ((strcmp(v, a) != 0) && (strcmp(v, b) != 0)) {
            KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field 'layer_types[%d]' = '%s' is not"
                         " implemented (%s, %s): refused", l, v, a, b);
        }
        is_a[l] = (strcmp(v, a) == 0);
    }
    return KVF_OK;
}

kvf_status_t kvf_cfg_num_layers(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    KVF_CFG_TRY(kvf_cfg_int(rd, "num_hidden_layers", &cfg->num_layers));
    if (cfg->num_layers > KVF_MAX_LAYERS) {
        KVF_CFG_FAIL(KVF_ERR_INVALID_PARAM, "field 'num_hidden_layers' = %d exceeds %d",
                     cfg->num_layers, KVF_MAX_LAYERS);
    }
    return KVF_OK;
}

kvf_status_t kvf_cfg_keys_known(const kvf_cfg_reader_t *rd, const cJSON *obj, const char *field,
                                const char *const *allowed, size_t n, const char *for_what)
{
    const cJSON *it;
    char val[128];

    cJSON_ArrayForEach(it, obj) {
        bool ok = false;
        for (size_t i = 0; i < n; ++i) {
            ok = ok || (strcmp(it->string, allowed[i]) == 0);
        }
        if (!ok) {
            kvf_cfg_value_str(it, val, sizeof(val));
            KVF_CFG_FAIL(KVF_ERR_UNSUPPORTED, "field '%s.%s' = %s is not implemented%s: refused",
                         field, it->string, val, for_what);
        }
    }
    return KVF_OK;
}
