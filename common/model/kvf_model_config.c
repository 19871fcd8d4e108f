/*
 * config.json -> kvf_model_config_t with cJSON.
 *
 * Design: every field is read through one of three helpers that log the
 * field name on failure, so an operator sees which field is missing or bad.
 * Consistency checks (divisibility, pattern length) run after all fields are
 * read. Hugging Face defaults are applied where the HF class has one (e.g.
 * use_conv_bias = true, mamba_ssm_cache_dtype = float32).
 */
#include "kvf_model_config.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const cJSON *root;
    const char  *origin;
} kvf_cfg_reader_t;

/* Required positive integer field. */
static kvf_status_t kvf_cfg_int(const kvf_cfg_reader_t *rd, const char *name, int *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, name);

    if (item == NULL) {
        kvf_error("%s: missing field '%s'", rd->origin, name);
        return KVF_ERR_INVALID_PARAM;
    }
    if (!cJSON_IsNumber(item) || (item->valuedouble != (double)(long long)item->valuedouble)) {
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
static kvf_status_t kvf_cfg_int_opt(const kvf_cfg_reader_t *rd, const char *name, int dflt,
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
    if (!cJSON_IsNumber(item)) {
        kvf_error("%s: field '%s' must be an integer", rd->origin, name);
        return KVF_ERR_INVALID_PARAM;
    }
    if (item->valuedouble < 0) {
        kvf_error("%s: field '%s' = %g must not be negative", rd->origin, name,
                  item->valuedouble);
        return KVF_ERR_INVALID_PARAM;
    }
    *out = (int)item->valuedouble;
    return KVF_OK;
}

static bool kvf_cfg_bool_opt(const kvf_cfg_reader_t *rd, const char *name, bool dflt)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(rd->root, name);
    return cJSON_IsBool(item) ? cJSON_IsTrue(item) : dflt;
}

static kvf_status_t kvf_cfg_dtype_opt(const kvf_cfg_reader_t *rd, const char *name,
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

static kvf_status_t kvf_cfg_divides(const char *origin, const char *a_name, int a,
                                    const char *b_name, int b)
{
    if ((a <= 0) || (b % a) != 0) {
        kvf_error("%s: field '%s' = %d must divide %s = %d", origin, a_name, a, b_name, b);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* Layer pattern: hybrid_override_pattern string or layers_block_type list. */
static kvf_status_t kvf_cfg_pattern(const kvf_cfg_reader_t *rd, kvf_model_config_t *cfg)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(rd->root, "hybrid_override_pattern");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(rd->root, "layers_block_type");
    int n = 0;

    if (cJSON_IsString(pat)) {
        const char *s = pat->valuestring;
        for (; s[n] != '\0'; ++n) {
            if (n >= KVF_MAX_LAYERS) {
                kvf_error("%s: field 'hybrid_override_pattern' has more than %d layers",
                          rd->origin, KVF_MAX_LAYERS);
                return KVF_ERR_INVALID_PARAM;
            }
            if (strchr("M*-E", s[n]) == NULL) {
                kvf_error("%s: field 'hybrid_override_pattern' has unknown letter '%c' at %d"
                          " (expected M, *, - or E)", rd->origin, s[n], n);
                return KVF_ERR_INVALID_PARAM;
            }
            cfg->layer_kinds[n] = s[n];
        }
    } else if (cJSON_IsArray(list)) {
        static const struct { const char *name; char letter; } kinds[] = {
            {"mamba", 'M'}, {"attention", '*'}, {"mlp", '-'}, {"moe", 'E'},
        };
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            char letter = 0;
            if (n >= KVF_MAX_LAYERS) {
                kvf_error("%s: field 'layers_block_type' has more than %d layers",
                          rd->origin, KVF_MAX_LAYERS);
                return KVF_ERR_INVALID_PARAM;
            }
            for (size_t k = 0; cJSON_IsString(it) && (k < sizeof(kinds) / sizeof(kinds[0])); ++k) {
                if (strcmp(it->valuestring, kinds[k].name) == 0) {
                    letter = kinds[k].letter;
                }
            }
            if (letter == 0) {
                kvf_error("%s: field 'layers_block_type' entry %d is not one of mamba,"
                          " attention, mlp, moe", rd->origin, n);
                return KVF_ERR_INVALID_PARAM;
            }
            cfg->layer_kinds[n++] = letter;
        }
    } else {
        kvf_error("%s: missing field 'hybrid_override_pattern' (or 'layers_block_type')",
                  rd->origin);
        return KVF_ERR_INVALID_PARAM;
    }
    if (n == 0) {
        kvf_error("%s: field 'hybrid_override_pattern' is empty", rd->origin);
        return KVF_ERR_INVALID_PARAM;
    }
    cfg->layer_kinds[n] = '\0';
    cfg->num_layers = n;
    return KVF_OK;
}

#define KVF_TRY(_expr)                 \
    do {                               \
        status = (_expr);              \
        if (status != KVF_OK) {        \
            goto out;                  \
        }                              \
    } while (0)

kvf_status_t kvf_model_config_parse(const char *json, const char *origin,
                                    kvf_model_config_t *cfg_p)
{
    kvf_model_config_t cfg;
    kvf_cfg_reader_t rd;
    const cJSON *mt;
    kvf_status_t status = KVF_OK;
    int num_hidden_layers = 0;

    memset(&cfg, 0, sizeof(cfg));
    rd.origin = (origin != NULL) ? origin : "config.json";
    rd.root = cJSON_Parse(json);
    if ((rd.root == NULL) || !cJSON_IsObject(rd.root)) {
        kvf_error("%s: not a JSON object", rd.origin);
        cJSON_Delete((cJSON *)rd.root);
        return KVF_ERR_PARSE;
    }

    mt = cJSON_GetObjectItemCaseSensitive(rd.root, "model_type");
    if (!cJSON_IsString(mt)) {
        kvf_error("%s: missing field 'model_type'", rd.origin);
        status = KVF_ERR_INVALID_PARAM;
        goto out;
    }
    snprintf(cfg.model_type, sizeof(cfg.model_type), "%s", mt->valuestring);
    if (strcmp(mt->valuestring, "nemotron_h") == 0) {
        cfg.arch = KVF_ARCH_NEMOTRON_H;
    } else if (strcmp(mt->valuestring, "llama") == 0) {
        cfg.arch = KVF_ARCH_LLAMA;
    } else if (strcmp(mt->valuestring, "qwen3") == 0) {
        cfg.arch = KVF_ARCH_QWEN3;
    } else if (strcmp(mt->valuestring, "mistral") == 0) {
        cfg.arch = KVF_ARCH_MISTRAL;
    } else {
        kvf_error("%s: field 'model_type' = '%s' is not supported (nemotron_h, llama, qwen3,"
                  " mistral)", rd.origin, mt->valuestring);
        status = KVF_ERR_UNSUPPORTED;
        goto out;
    }

    KVF_TRY(kvf_cfg_int(&rd, "hidden_size", &cfg.hidden_size));
    KVF_TRY(kvf_cfg_int(&rd, "vocab_size", &cfg.vocab_size));
    KVF_TRY(kvf_cfg_int(&rd, "num_attention_heads", &cfg.num_attention_heads));
    KVF_TRY(kvf_cfg_int_opt(&rd, "num_key_value_heads", cfg.num_attention_heads,
                            &cfg.num_key_value_heads));
    if (cfg.num_key_value_heads == 0) {
        kvf_error("%s: field 'num_key_value_heads' = 0 must be a positive integer", rd.origin);
        status = KVF_ERR_INVALID_PARAM;
        goto out;
    }
    KVF_TRY(kvf_cfg_divides(rd.origin, "num_key_value_heads", cfg.num_key_value_heads,
                            "num_attention_heads", cfg.num_attention_heads));
    KVF_TRY(kvf_cfg_int_opt(&rd, "head_dim", 0, &cfg.head_dim));
    if (cfg.head_dim == 0) {
        if (cfg.hidden_size % cfg.num_attention_heads != 0) {
            kvf_error("%s: missing field 'head_dim' and hidden_size = %d is not a multiple of"
                      " num_attention_heads = %d", rd.origin, cfg.hidden_size,
                      cfg.num_attention_heads);
            status = KVF_ERR_INVALID_PARAM;
            goto out;
        }
        cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
    }
    KVF_TRY(kvf_cfg_int_opt(&rd, "intermediate_size", 0, &cfg.intermediate_size));
    KVF_TRY(kvf_cfg_int_opt(&rd, "n_routed_experts", 0, &cfg.moe_num_experts));
    KVF_TRY(kvf_cfg_int_opt(&rd, "num_experts_per_tok", 0, &cfg.moe_top_k));
    KVF_TRY(kvf_cfg_int_opt(&rd, "moe_intermediate_size", 0, &cfg.moe_intermediate_size));
    KVF_TRY(kvf_cfg_int_opt(&rd, "moe_shared_expert_intermediate_size", 0,
                            &cfg.moe_shared_intermediate_size));
    KVF_TRY(kvf_cfg_int_opt(&rd, "bos_token_id", 0, &cfg.bos_token_id));
    KVF_TRY(kvf_cfg_int_opt(&rd, "eos_token_id", 0, &cfg.eos_token_id));
    if (cJSON_GetObjectItemCaseSensitive(rd.root, "bos_token_id") == NULL) {
        cfg.bos_token_id = -1;
    }
    if (cJSON_GetObjectItemCaseSensitive(rd.root, "eos_token_id") == NULL) {
        cfg.eos_token_id = -1;
    }
    cfg.tie_word_embeddings = kvf_cfg_bool_opt(&rd, "tie_word_embeddings", false);
    KVF_TRY(kvf_cfg_dtype_opt(&rd, "torch_dtype", KVF_DTYPE_BF16, &cfg.torch_dtype));
    {
        const cJSON *eps = cJSON_GetObjectItemCaseSensitive(rd.root, "layer_norm_epsilon");
        if (eps == NULL) {
            eps = cJSON_GetObjectItemCaseSensitive(rd.root, "rms_norm_eps");
        }
        cfg.norm_eps = cJSON_IsNumber(eps) ? eps->valuedouble : 1e-5;
        if (cfg.norm_eps <= 0) {
            kvf_error("%s: field 'layer_norm_epsilon' must be positive", rd.origin);
            status = KVF_ERR_INVALID_PARAM;
            goto out;
        }
    }

    if (cfg.arch == KVF_ARCH_NEMOTRON_H) {
        KVF_TRY(kvf_cfg_pattern(&rd, &cfg));
        KVF_TRY(kvf_cfg_int_opt(&rd, "num_hidden_layers", cfg.num_layers, &num_hidden_layers));
        if (num_hidden_layers != cfg.num_layers) {
            kvf_error("%s: field 'num_hidden_layers' = %d but the layer pattern has %d layers",
                      rd.origin, num_hidden_layers, cfg.num_layers);
            status = KVF_ERR_INVALID_PARAM;
            goto out;
        }
        for (int i = 0; i < cfg.num_layers; ++i) {
            cfg.num_mamba_layers     += (cfg.layer_kinds[i] == KVF_LAYER_MAMBA);
            cfg.num_attention_layers += (cfg.layer_kinds[i] == KVF_LAYER_ATTENTION);
        }
        if (cfg.num_mamba_layers > 0) {
            KVF_TRY(kvf_cfg_int(&rd, "mamba_num_heads", &cfg.mamba_num_heads));
            KVF_TRY(kvf_cfg_int(&rd, "mamba_head_dim", &cfg.mamba_head_dim));
            KVF_TRY(kvf_cfg_int(&rd, "ssm_state_size", &cfg.ssm_state_size));
            KVF_TRY(kvf_cfg_int(&rd, "n_groups", &cfg.n_groups));
            KVF_TRY(kvf_cfg_int(&rd, "conv_kernel", &cfg.conv_kernel));
            KVF_TRY(kvf_cfg_int_opt(&rd, "chunk_size", 128, &cfg.chunk_size));
            KVF_TRY(kvf_cfg_divides(rd.origin, "n_groups", cfg.n_groups, "mamba_num_heads",
                                    cfg.mamba_num_heads));
            if (cfg.conv_kernel < 2) {
                kvf_error("%s: field 'conv_kernel' = %d must be at least 2", rd.origin,
                          cfg.conv_kernel);
                status = KVF_ERR_INVALID_PARAM;
                goto out;
            }
            cfg.use_conv_bias = kvf_cfg_bool_opt(&rd, "use_conv_bias", true);
            cfg.mamba_proj_bias = kvf_cfg_bool_opt(&rd, "mamba_proj_bias",
                                                   kvf_cfg_bool_opt(&rd, "use_bias", false));
            KVF_TRY(kvf_cfg_dtype_opt(&rd, "mamba_ssm_cache_dtype", KVF_DTYPE_FP32,
                                      &cfg.ssm_cache_dtype));
        }
        if ((strchr(cfg.layer_kinds, KVF_LAYER_MLP) != NULL) && (cfg.intermediate_size == 0)) {
            kvf_error("%s: missing field 'intermediate_size' (the pattern has MLP layers)",
                      rd.origin);
            status = KVF_ERR_INVALID_PARAM;
            goto out;
        }
    } else {
        KVF_TRY(kvf_cfg_int(&rd, "num_hidden_layers", &cfg.num_layers));
        KVF_TRY(kvf_cfg_int(&rd, "intermediate_size", &cfg.intermediate_size));
        if (cfg.num_layers > KVF_MAX_LAYERS) {
            kvf_error("%s: field 'num_hidden_layers' = %d exceeds %d", rd.origin,
                      cfg.num_layers, KVF_MAX_LAYERS);
            status = KVF_ERR_INVALID_PARAM;
            goto out;
        }
        memset(cfg.layer_kinds, KVF_LAYER_ATTENTION, (size_t)cfg.num_layers);
        cfg.layer_kinds[cfg.num_layers] = '\0';
        cfg.num_attention_layers = cfg.num_layers;
        cfg.dense_mlp_in_layer = true;
        cfg.ssm_cache_dtype = KVF_DTYPE_FP32;
    }
    if (cfg.num_attention_layers == 0) {
        kvf_error("%s: the layer pattern has no attention layer", rd.origin);
        status = KVF_ERR_INVALID_PARAM;
        goto out;
    }
    *cfg_p = cfg;

out:
    cJSON_Delete((cJSON *)rd.root);
    return status;
}

kvf_status_t kvf_model_config_load(const char *path, kvf_model_config_t *cfg_p)
{
    char file[4096];
    struct stat st;
    FILE *f;
    char *text;
    long len;
    kvf_status_t status;

    if ((stat(path, &st) == 0) && S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof(file), "%s/config.json", path);
    } else {
        snprintf(file, sizeof(file), "%s", path);
    }
    f = fopen(file, "rb");
    if (f == NULL) {
        kvf_error("cannot open model config %s: %m", file);
        return KVF_ERR_IO;
    }
    if ((fseek(f, 0, SEEK_END) != 0) || ((len = ftell(f)) < 0) || (fseek(f, 0, SEEK_SET) != 0)) {
        kvf_error("cannot size model config %s: %m", file);
        fclose(f);
        return KVF_ERR_IO;
    }
    text = malloc((size_t)len + 1);
    if (text == NULL) {
        fclose(f);
        return KVF_ERR_NO_MEMORY;
    }
    if (fread(text, 1, (size_t)len, f) != (size_t)len) {
        kvf_error("cannot read model config %s: %m", file);
        free(text);
        fclose(f);
        return KVF_ERR_IO;
    }
    text[len] = '\0';
    fclose(f);
    status = kvf_model_config_parse(text, file, cfg_p);
    free(text);
    return status;
}

static uint64_t kvf_fnv1a(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t kvf_model_config_fingerprint(const kvf_model_config_t *cfg)
{
    const int fields[] = {
        (int)cfg->arch, cfg->hidden_size, cfg->num_layers, cfg->vocab_size,
        cfg->num_attention_heads, cfg->num_key_value_heads, cfg->head_dim,
        cfg->intermediate_size, cfg->mamba_num_heads, cfg->mamba_head_dim,
        cfg->ssm_state_size, cfg->n_groups, cfg->conv_kernel,
    };
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); ++i) {
        int32_t v = fields[i];   /* fixed width: the fingerprint crosses hosts */
        h = kvf_fnv1a(h, &v, sizeof(v));
    }
    return kvf_fnv1a(h, cfg->layer_kinds, (size_t)cfg->num_layers);
}
