/*
 * Synthetic NemotronH checkpoints.
 *
 * Design: each tensor draws from its own PRNG stream seeded by
 * (seed, FNV-1a of the tensor name), so a tensor's values do not depend on
 * which other tensors exist or in which order they are written, and a test
 * can regenerate any single tensor by name. Values are uniform with the
 * requested standard deviation (uniform avoids a normal sampler and has no
 * outliers, which keeps bf16 checkpoints well-behaved). Names and shapes are
 * those of Hugging Face's modeling_nemotron_h.py (backbone.* prefix, as in
 * NVIDIA's published checkpoints).
 */
#include "kvf_mkmodel.h"
#include "kvf_log.h"
#include "kvf_safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    uint64_t s;
} kvf_rng_t;

static uint64_t kvf_rng_next(kvf_rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);   /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double kvf_rng_unit(kvf_rng_t *r)
{
    return (double)(kvf_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static kvf_rng_t kvf_rng_for(uint64_t seed, const char *name)
{
    kvf_rng_t r;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p != '\0'; ++p) {
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    }
    r.s = seed * 0x9e3779b97f4a7c15ull ^ h;
    (void)kvf_rng_next(&r);
    return r;
}

typedef enum {
    KVF_INIT_UNIFORM,     /* mean + U(-a, a) with std `std` */
    KVF_INIT_A_LOG,       /* log(1..n) */
    KVF_INIT_DT_BIAS,     /* inverse softplus of log-uniform dt in [0.01, 0.2] */
} kvf_init_kind_t;

typedef struct {
    kvf_st_writer_h writer;
    uint64_t        seed;
    kvf_dtype_t     dtype;
} kvf_mk_ctx_t;

static kvf_status_t kvf_mk_tensor(kvf_mk_ctx_t *ctx, const char *name, int ndim,
                                  const int64_t *shape, kvf_init_kind_t kind, double mean,
                                  double std)
{
    kvf_rng_t rng = kvf_rng_for(ctx->seed, name);
    size_t n = 1;
    float *v;
    kvf_status_t status;

    for (int i = 0; i < ndim; ++i) {
        n *= (size_t)shape[i];
    }
    v = malloc(n * sizeof(float));
    if (v == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; ++i) {
        double u = kvf_rng_unit(&rng);
        switch (kind) {
        case KVF_INIT_A_LOG:
            v[i] = (float)log((double)(i + 1));
            break;
        case KVF_INIT_DT_BIAS: {
            double dt = exp(log(0.01) + u * (log(0.2) - log(0.01)));
            v[i] = (float)(dt + log(-expm1(-dt)));
            break;
        }
        default:
            v[i] = (float)(mean + (2.0 * u - 1.0) * std * sqrt(3.0));
            break;
        }
    }
    status = kvf_st_writer_add(ctx->writer, name, ndim, shape, v, ctx->dtype);
    free(v);
    return status;
}

#define KVF_MK(_name, _kind, _mean, _std, ...)                                             \
    do {                                                                                 \
        const int64_t _shape[] = {__VA_ARGS__};                                          \
        status = kvf_mk_tensor(&ctx, (_name), (int)(sizeof(_shape) / sizeof(_shape[0])), \
                               _shape, (_kind), (_mean), (_std));                        \
        if (status != KVF_OK) {                                                          \
            goto out;                                                                    \
        }                                                                                \
    } while (0)

static kvf_status_t kvf_mk_config(const char *config_path, const char *out_dir,
                                  kvf_dtype_t dtype)
{
    FILE *f = fopen(config_path, "rb");
    char path[4096];
    char *text = NULL, *out = NULL;
    cJSON *root = NULL;
    long len;
    kvf_status_t status = KVF_ERR_IO;

    if (f == NULL) {
        kvf_error("cannot open %s: %m", config_path);
        return KVF_ERR_IO;
    }
    if ((fseek(f, 0, SEEK_END) != 0) || ((len = ftell(f)) < 0) || (fseek(f, 0, SEEK_SET) != 0)) {
        goto out;
    }
    text = calloc(1, (size_t)len + 1);
    if ((text == NULL) || (fread(text, 1, (size_t)len, f) != (size_t)len)) {
        goto out;
    }
    root = cJSON_Parse(text);
    if (root == NULL) {
        kvf_error("%s: not valid JSON", config_path);
        status = KVF_ERR_PARSE;
        goto out;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(root, "torch_dtype");
    cJSON_AddStringToObject(root, "torch_dtype",
                            (dtype == KVF_DTYPE_BF16) ? "bfloat16" : "float32");
    out = cJSON_Print(root);
    fclose(f);
    snprintf(path, sizeof(path), "%s/config.json", out_dir);
    f = fopen(path, "wb");
    if ((f == NULL) || (out == NULL) || (fputs(out, f) == EOF) || (fputc('\n', f) == EOF)) {
        kvf_error("cannot write %s: %m", path);
        goto out;
    }
    status = KVF_OK;
out:
    if ((f != NULL) && (fclose(f) != 0)) {
        status = KVF_ERR_IO;
    }
    free(out);
    free(text);
    cJSON_Delete(root);
    return status;
}

/* mkdir -p: operators name output folders that do not exist yet (models/tiny). */
static int kvf_mk_mkdirs(const char *dir)
{
    char path[4096];
    size_t len = strlen(dir);

    if ((len == 0) || (len >= sizeof(path))) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(path, dir, len + 1);
    for (char *p = path + 1; *p != '\0'; ++p) {
        if (*p == '/') {
            *p = '\0';
            if ((mkdir(path, 0755) != 0) && (errno != EEXIST)) {
                return -1;
            }
            *p = '/';
        }
    }
    return ((mkdir(path, 0755) == 0) || (errno == EEXIST)) ? 0 : -1;
}

kvf_status_t kvf_mkmodel_write(const char *config_path, const char *out_dir, uint64_t seed,
                               kvf_dtype_t dtype)
{
    kvf_model_config_t cfg;
    kvf_mk_ctx_t ctx = {.seed = seed, .dtype = dtype};
    char name[256], path[4096];
    kvf_status_t status;
    struct stat st;

    if ((dtype != KVF_DTYPE_FP32) && (dtype != KVF_DTYPE_BF16)) {
        kvf_error("mkmodel dtype must be fp32 or bf16, not %s", kvf_dtype_name(dtype));
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_model_config_load(config_path, &cfg);
    if (status != KVF_OK) {
        return status;
    }
    if ((cfg.arch != KVF_ARCH_NEMOTRON_H) || (strchr(cfg.layer_kinds, KVF_LAYER_MOE) != NULL)) {
        kvf_error("%s: mkmodel supports nemotron_h models without MoE layers", config_path);
        return KVF_ERR_UNSUPPORTED;
    }
    if ((stat(out_dir, &st) != 0) && (kvf_mk_mkdirs(out_dir) != 0)) {
        kvf_error("cannot create %s: %m", out_dir);
        return KVF_ERR_IO;
    }
    status = kvf_mk_config(config_path, out_dir, dtype);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_st_writer_create(&ctx.writer);
    if (status != KVF_OK) {
        return status;
    }

    const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
    const int64_t inner = kvf_model_mamba_inner(&cfg);
    const int64_t conv_dim = inner + 2 * (int64_t)cfg.n_groups * cfg.ssm_state_size;
    const int64_t nh = cfg.mamba_num_heads;
    const double out_scale = 1.0 / sqrt((double)cfg.num_layers);

    KVF_MK("backbone.embeddings.weight", KVF_INIT_UNIFORM, 0.0, 1.0, V, H);
    for (int l = 0; l < cfg.num_layers; ++l) {
#define LNAME(_suffix) (snprintf(name, sizeof(name), "backbone.layers.%d.%s", l, (_suffix)), name)
        KVF_MK(LNAME("norm.weight"), KVF_INIT_UNIFORM, 1.0, 0.1, H);
        switch (cfg.layer_kinds[l]) {
        case KVF_LAYER_MAMBA:
            /* in_proj rows: z (inner) | xBC (conv_dim) | dt (nh); the dt rows are drawn
             * small so dt stays near its bias and above time_step_min */
            {
                const int64_t rows = inner + conv_dim + nh;
                const int64_t shape[2] = {rows, H};
                kvf_rng_t rng = kvf_rng_for(seed, LNAME("mixer.in_proj.weight"));
                float *w = malloc((size_t)(rows * H) * sizeof(float));
                double std = 1.0 / sqrt((double)H);
                if (w == NULL) {
                    status = KVF_ERR_NO_MEMORY;
                    goto out;
                }
                for (int64_t i = 0; i < rows * H; ++i) {
                    double s = (i / H >= inner + conv_dim) ? 0.1 * std : std;
                    w[i] = (float)((2.0 * kvf_rng_unit(&rng) - 1.0) * s * sqrt(3.0));
                }
                status = kvf_st_writer_add(ctx.writer, name, 2, shape, w, dtype);
                free(w);
                if (status != KVF_OK) {
                    goto out;
                }
            }
            KVF_MK(LNAME("mixer.conv1d.weight"), KVF_INIT_UNIFORM, 0.0,
                   1.0 / sqrt((double)cfg.conv_kernel), conv_dim, 1, cfg.conv_kernel);
            if (cfg.use_conv_bias) {
                KVF_MK(LNAME("mixer.conv1d.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, conv_dim);
            }
            KVF_MK(LNAME("mixer.dt_bias"), KVF_INIT_DT_BIAS, 0.0, 0.0, nh);
            KVF_MK(LNAME("mixer.A_log"), KVF_INIT_A_LOG, 0.0, 0.0, nh);
            KVF_MK(LNAME("mixer.D"), KVF_INIT_UNIFORM, 1.0, 0.1, nh);
            KVF_MK(LNAME("mixer.norm.weight"), KVF_INIT_UNIFORM, 1.0, 0.1, inner);
            KVF_MK(LNAME("mixer.out_proj.weight"), KVF_INIT_UNIFORM, 0.0,
                   out_scale / sqrt((double)inner), H, inner);
            break;
        case KVF_LAYER_ATTENTION: {
            const int64_t q = (int64_t)cfg.num_attention_heads * cfg.head_dim;
            const int64_t kv = (int64_t)cfg.num_key_value_heads * cfg.head_dim;
            KVF_MK(LNAME("mixer.q_proj.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), q, H);
            KVF_MK(LNAME("mixer.k_proj.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), kv, H);
            KVF_MK(LNAME("mixer.v_proj.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), kv, H);
            KVF_MK(LNAME("mixer.o_proj.weight"), KVF_INIT_UNIFORM, 0.0,
                   out_scale / sqrt((double)q), H, q);
            break;
        }
        case KVF_LAYER_MLP: {
            const int64_t I = cfg.intermediate_size;
            KVF_MK(LNAME("mixer.up_proj.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), I, H);
            KVF_MK(LNAME("mixer.down_proj.weight"), KVF_INIT_UNIFORM, 0.0,
                   out_scale / sqrt((double)I), H, I);
            break;
        }
        default:
            break;
        }
#undef LNAME
    }
    KVF_MK("backbone.norm_f.weight", KVF_INIT_UNIFORM, 1.0, 0.1, H);
    KVF_MK("lm_head.weight", KVF_INIT_UNIFORM, 0.0, 3.0 / sqrt((double)H), V, H);

    snprintf(path, sizeof(path), "%s/model.safetensors", out_dir);
    status = kvf_st_writer_finish(ctx.writer, path);
    ctx.writer = NULL;
out:
    kvf_st_writer_destroy(ctx.writer);
    return status;
}
