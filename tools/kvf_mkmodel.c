/*
 * Synthetic checkpoints: nemotron_h, the dense decoders (llama, qwen3, mistral), gemma3_text,
 * gemma2, gpt_oss, qwen3_next, qwen3_5_text and qwen3_5_moe_text, with transformers' tensor
 * names and shapes.
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
#include "kvf_hash.h"
#include "kvf_mkmodel.h"
#include "kvf_json.h"
#include "kvf_log.h"
#include "kvf_safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    const uint64_t h = kvf_hash64(name, strlen(name), 0);

    r.s = seed * 0x9e3779b97f4a7c15ull ^ h;
    (void)kvf_rng_next(&r);
    return r;
}

typedef enum {
    KVF_INIT_UNIFORM,     /* mean + U(-a, a) with std `std` */
    KVF_INIT_A_LOG,       /* log(1..n) */
    KVF_INIT_DT_BIAS,     /* inverse softplus of log-uniform dt in [0.01, 0.2] */
} kvf_init_kind_t;

#define KVF_MK_MAX_SHARDS 64

typedef struct {
    kvf_st_writer_h writers[KVF_MK_MAX_SHARDS];
    int             shards;
    int             count;      /* tensors written so far (round robin over shards) */
    cJSON          *weight_map; /* name -> shard file, for the index */
    uint64_t        seed;
    kvf_dtype_t     dtype;
} kvf_mk_ctx_t;

static void kvf_mk_shard_name(const kvf_mk_ctx_t *ctx, int i, char *buf, size_t len)
{
    if (ctx->shards == 1) {
        snprintf(buf, len, "model.safetensors");
    } else {
        snprintf(buf, len, "model-%05d-of-%05d.safetensors", i + 1, ctx->shards);
    }
}

/* Add one tensor to the next shard. */
static kvf_status_t kvf_mk_add(kvf_mk_ctx_t *ctx, const char *name, int ndim,
                               const int64_t *shape, const float *v)
{
    int i = ctx->count++ % ctx->shards;
    char file[64];

    kvf_mk_shard_name(ctx, i, file, sizeof(file));
    if ((ctx->weight_map != NULL) && (cJSON_AddStringToObject(ctx->weight_map, name, file) == NULL)) {
        return KVF_ERR_NO_MEMORY;
    }
    return kvf_st_writer_add(ctx->writers[i], name, ndim, shape, v, ctx->dtype);
}

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
    status = kvf_mk_add(ctx, name, ndim, shape, v);
    free(v);
    return status;
}

static kvf_status_t kvf_mk_config(const char *config_path, const char *out_dir,
                                  kvf_dtype_t dtype)
{
    FILE *f = NULL;
    char path[4096];
    char *out = NULL;
    cJSON *root = NULL;
    kvf_status_t status = kvf_json_load(config_path, 0, &root);

    if (status != KVF_OK) {
        return status;
    }
    status = KVF_ERR_IO;
    /* keep the file's spelling: transformers 5 writes dtype, older files torch_dtype */
    {
        const char *key = (cJSON_GetObjectItemCaseSensitive(root, "dtype") != NULL) ? "dtype" :
                          "torch_dtype";
        cJSON_DeleteItemFromObjectCaseSensitive(root, key);
        cJSON_AddStringToObject(root, key, (dtype == KVF_DTYPE_BF16) ? "bfloat16" : "float32");
    }
    out = kvf_json_print(root);   /* Infinity stays Infinity, not null */
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

/* A MIXER-style or dense MLP: up (or gate + up) and down, with optional biases. */
static kvf_status_t kvf_mk_mlp(kvf_mk_ctx_t *ctx, const char *pfx, int64_t H, int64_t I,
                               bool gated, bool bias, double out_scale)
{
    char name[320];
    kvf_status_t status = KVF_OK;
    kvf_mk_ctx_t *c = ctx;

#define PNAME(_s) (snprintf(name, sizeof(name), "%s.%s", pfx, (_s)), name)
#define KVF_MKC(_name, _kind, _mean, _std, ...)                                             \
    do {                                                                                  \
        const int64_t _shape[] = {__VA_ARGS__};                                           \
        status = kvf_mk_tensor(c, (_name), (int)(sizeof(_shape) / sizeof(_shape[0])),     \
                               _shape, (_kind), (_mean), (_std));                         \
        if (status != KVF_OK) {                                                           \
            return status;                                                                \
        }                                                                                 \
    } while (0)
    if (gated) {
        KVF_MKC(PNAME("gate_proj.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), I, H);
        if (bias) {
            KVF_MKC(PNAME("gate_proj.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, I);
        }
    }
    KVF_MKC(PNAME("up_proj.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), I, H);
    if (bias) {
        KVF_MKC(PNAME("up_proj.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, I);
    }
    KVF_MKC(PNAME("down_proj.weight"), KVF_INIT_UNIFORM, 0.0, out_scale / sqrt((double)I), H, I);
    if (bias) {
        KVF_MKC(PNAME("down_proj.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, H);
    }
#undef PNAME
    return KVF_OK;
}

/* q/k/v/o of one attention layer under prefix @a pfx. */
static kvf_status_t kvf_mk_attention(kvf_mk_ctx_t *c, const kvf_model_config_t *cfg,
                                     const char *pfx, double out_scale)
{
    const int64_t H = cfg->hidden_size;
    const int64_t q = (int64_t)cfg->num_attention_heads * cfg->head_dim;
    const int64_t kv = (int64_t)cfg->num_key_value_heads * cfg->head_dim;
    const int64_t qrows = cfg->attn_output_gate ? 2 * q : q;   /* qwen3_next: q | gate */
    const double nmean = (cfg->norm_offset == 1.0) ? 0.0 : 1.0;   /* (1 + w) norms */
    char name[320];
    kvf_status_t status;

#define PNAME(_s) (snprintf(name, sizeof(name), "%s.%s", pfx, (_s)), name)
    KVF_MKC(PNAME("q_proj.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), qrows, H);
    KVF_MKC(PNAME("k_proj.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), kv, H);
    KVF_MKC(PNAME("v_proj.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), kv, H);
    KVF_MKC(PNAME("o_proj.weight"), KVF_INIT_UNIFORM, 0.0, out_scale / sqrt((double)q), H, q);
    if (cfg->attn_bias) {
        KVF_MKC(PNAME("q_proj.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, qrows);
        KVF_MKC(PNAME("k_proj.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, kv);
        KVF_MKC(PNAME("v_proj.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, kv);
        KVF_MKC(PNAME("o_proj.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, H);
    }
    if (cfg->qk_norm) {
        KVF_MKC(PNAME("q_norm.weight"), KVF_INIT_UNIFORM, nmean, 0.1, cfg->head_dim);
        KVF_MKC(PNAME("k_norm.weight"), KVF_INIT_UNIFORM, nmean, 0.1, cfg->head_dim);
    }
    if (cfg->attn_sinks) {   /* gpt_oss */
        KVF_MKC(PNAME("sinks"), KVF_INIT_UNIFORM, 0.0, 1.0, cfg->num_attention_heads);
    }
#undef PNAME
    return KVF_OK;
}

static kvf_status_t kvf_mk_mamba(kvf_mk_ctx_t *c, const kvf_model_config_t *cfg,
                                 const char *pfx, double out_scale)
{
    const int64_t H = cfg->hidden_size;
    const int64_t inner = kvf_model_mamba_inner(cfg);
    const int64_t conv_dim = inner + 2 * (int64_t)cfg->n_groups * cfg->ssm_state_size;
    const int64_t nh = cfg->mamba_num_heads;
    char name[320];
    kvf_status_t status;

#define PNAME(_s) (snprintf(name, sizeof(name), "%s.%s", pfx, (_s)), name)
    /* in_proj rows: z (inner) | xBC (conv_dim) | dt (nh); the dt rows are drawn
     * small so dt stays near its bias (log-uniform in [0.01, 0.2]) */
    {
        const int64_t rows = inner + conv_dim + nh;
        const int64_t shape[2] = {rows, H};
        kvf_rng_t rng = kvf_rng_for(c->seed, PNAME("mixer.in_proj.weight"));
        float *w = malloc((size_t)(rows * H) * sizeof(float));
        double std = 1.0 / sqrt((double)H);
        if (w == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        for (int64_t i = 0; i < rows * H; ++i) {
            double s = (i / H >= inner + conv_dim) ? 0.1 * std : std;
            w[i] = (float)((2.0 * kvf_rng_unit(&rng) - 1.0) * s * sqrt(3.0));
        }
        status = kvf_mk_add(c, name, 2, shape, w);
        free(w);
        if (status != KVF_OK) {
            return status;
        }
    }
    if (cfg->mamba_proj_bias) {
        KVF_MKC(PNAME("mixer.in_proj.bias"), KVF_INIT_UNIFORM, 0.0, 0.05, inner + conv_dim + nh);
        KVF_MKC(PNAME("mixer.out_proj.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, H);
    }
    KVF_MKC(PNAME("mixer.conv1d.weight"), KVF_INIT_UNIFORM, 0.0,
            1.0 / sqrt((double)cfg->conv_kernel), conv_dim, 1, cfg->conv_kernel);
    if (cfg->use_conv_bias) {
        KVF_MKC(PNAME("mixer.conv1d.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, conv_dim);
    }
    KVF_MKC(PNAME("mixer.dt_bias"), KVF_INIT_DT_BIAS, 0.0, 0.0, nh);
    KVF_MKC(PNAME("mixer.A_log"), KVF_INIT_A_LOG, 0.0, 0.0, nh);
    KVF_MKC(PNAME("mixer.D"), KVF_INIT_UNIFORM, 1.0, 0.1, nh);
    KVF_MKC(PNAME("mixer.norm.weight"), KVF_INIT_UNIFORM, 1.0, 0.1, inner);
    KVF_MKC(PNAME("mixer.out_proj.weight"), KVF_INIT_UNIFORM, 0.0,
            out_scale / sqrt((double)inner), H, inner);
#undef PNAME
    return KVF_OK;
}

static kvf_status_t kvf_mk_moe(kvf_mk_ctx_t *c, const kvf_model_config_t *cfg,
                               const char *pfx, double out_scale)
{
    const int64_t H = cfg->hidden_size, E = cfg->moe_num_experts, I = cfg->moe_intermediate_size;
    char name[320], sub[320];
    kvf_status_t status;

#define PNAME(_s) (snprintf(name, sizeof(name), "%s.%s", pfx, (_s)), name)
    KVF_MKC(PNAME("mixer.gate.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), E, H);
    KVF_MKC(PNAME("mixer.gate.e_score_correction_bias"), KVF_INIT_UNIFORM, 0.0, 0.1, E);
    for (int64_t e = 0; e < E; ++e) {
        snprintf(sub, sizeof(sub), "%s.mixer.experts.%lld", pfx, (long long)e);
        status = kvf_mk_mlp(c, sub, H, I, false, false, out_scale);
        if (status != KVF_OK) {
            return status;
        }
    }
    snprintf(sub, sizeof(sub), "%s.mixer.shared_experts", pfx);
#undef PNAME
    return kvf_mk_mlp(c, sub, H, cfg->moe_shared_intermediate_size, false, cfg->mlp_bias,
                      out_scale);
}

/*
 * A Gated DeltaNet layer's tensors under @a pfx (".linear_attn"): qwen3_next's fused
 * in_proj_qkvz / in_proj_ba (per key head: q, k, then its value heads' v and z; b then a),
 * qwen3_5_text's separate in_proj_qkv / z / b / a; conv over q | k | v channels, dt_bias,
 * A_log, the gated norm's [value_head_dim] weight (a (1 + w) norm: drawn near 0), out_proj.
 */
static kvf_status_t kvf_mk_gdn(kvf_mk_ctx_t *c, const kvf_model_config_t *cfg, const char *pfx,
                               double out_scale)
{
    const int64_t H = cfg->hidden_size, Hv = cfg->mamba_num_heads, Hk = cfg->n_groups;
    const int64_t dv = cfg->mamba_head_dim, dk = cfg->ssm_state_size;
    const int64_t kd = Hk * dk, vd = Hv * dv;
    const double std = 1.0 / sqrt((double)H);
    char name[320];
    kvf_status_t status;

#define PNAME(_s) (snprintf(name, sizeof(name), "%s.%s", pfx, (_s)), name)
    if (cfg->arch == KVF_ARCH_QWEN3_NEXT) {
        KVF_MKC(PNAME("in_proj_qkvz.weight"), KVF_INIT_UNIFORM, 0.0, std, 2 * kd + 2 * vd, H);
        KVF_MKC(PNAME("in_proj_ba.weight"), KVF_INIT_UNIFORM, 0.0, std, 2 * Hv, H);
    } else {
        KVF_MKC(PNAME("in_proj_qkv.weight"), KVF_INIT_UNIFORM, 0.0, std, 2 * kd + vd, H);
        KVF_MKC(PNAME("in_proj_z.weight"), KVF_INIT_UNIFORM, 0.0, std, vd, H);
        KVF_MKC(PNAME("in_proj_b.weight"), KVF_INIT_UNIFORM, 0.0, std, Hv, H);
        KVF_MKC(PNAME("in_proj_a.weight"), KVF_INIT_UNIFORM, 0.0, std, Hv, H);
    }
    KVF_MKC(PNAME("conv1d.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)cfg->conv_kernel),
            2 * kd + vd, 1, cfg->conv_kernel);
    KVF_MKC(PNAME("dt_bias"), KVF_INIT_DT_BIAS, 0.0, 0.0, Hv);
    KVF_MKC(PNAME("A_log"), KVF_INIT_A_LOG, 0.0, 0.0, Hv);
    KVF_MKC(PNAME("norm.weight"), KVF_INIT_UNIFORM, 1.0, 0.1, dv);   /* plain w: not offset */
    KVF_MKC(PNAME("out_proj.weight"), KVF_INIT_UNIFORM, 0.0, out_scale / sqrt((double)vd), H,
            vd);
#undef PNAME
    return KVF_OK;
}

/* qwen3_next's sparse FFN under @a pfx (".mlp"): router, gated experts, gated shared expert
 * and its sigmoid gate. */
static kvf_status_t kvf_mk_qn_moe(kvf_mk_ctx_t *c, const kvf_model_config_t *cfg,
                                  const char *pfx, double out_scale)
{
    const int64_t H = cfg->hidden_size, E = cfg->moe_num_experts;
    char name[320], sub[320];
    kvf_status_t status;

#define PNAME(_s) (snprintf(name, sizeof(name), "%s.%s", pfx, (_s)), name)
    KVF_MKC(PNAME("gate.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), E, H);
    KVF_MKC(PNAME("shared_expert_gate.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H),
            1, H);
#undef PNAME
    for (int64_t e = 0; e < E; ++e) {
        snprintf(sub, sizeof(sub), "%s.experts.%lld", pfx, (long long)e);
        status = kvf_mk_mlp(c, sub, H, cfg->moe_intermediate_size, true, false, out_scale);
        if (status != KVF_OK) {
            return status;
        }
    }
    snprintf(sub, sizeof(sub), "%s.shared_expert", pfx);
    return kvf_mk_mlp(c, sub, H, cfg->moe_shared_intermediate_size, true, false, out_scale);
}

/* gpt_oss's FFN under @a pfx (".mlp"): the biased router and the experts as its files store
 * them (x @ W layouts, gate and up interleaved: gate_up_proj [E][H][2I], down_proj [E][I][H],
 * their biases). */
static kvf_status_t kvf_mk_oss_moe(kvf_mk_ctx_t *c, const kvf_model_config_t *cfg,
                                   const char *pfx, double out_scale)
{
    const int64_t H = cfg->hidden_size, E = cfg->moe_num_experts, I = cfg->moe_intermediate_size;
    char name[320];
    kvf_status_t status;

#define PNAME(_s) (snprintf(name, sizeof(name), "%s.%s", pfx, (_s)), name)
    KVF_MKC(PNAME("router.weight"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), E, H);
    KVF_MKC(PNAME("router.bias"), KVF_INIT_UNIFORM, 0.0, 0.1, E);
    KVF_MKC(PNAME("experts.gate_up_proj"), KVF_INIT_UNIFORM, 0.0, 1.0 / sqrt((double)H), E, H,
            2 * I);
    KVF_MKC(PNAME("experts.gate_up_proj_bias"), KVF_INIT_UNIFORM, 0.0, 0.1, E, 2 * I);
    KVF_MKC(PNAME("experts.down_proj"), KVF_INIT_UNIFORM, 0.0, out_scale / sqrt((double)I), E,
            I, H);
    KVF_MKC(PNAME("experts.down_proj_bias"), KVF_INIT_UNIFORM, 0.0, 0.1, E, H);
#undef PNAME
    return KVF_OK;
}

/*
 * A layer of the decoders whose every layer is a mixer (attention or Gated DeltaNet) plus its
 * FFN, under "model.layers.l": gemma3_text / gemma2 (four norms), gpt_oss (sinks, biased
 * router and interleaved experts), qwen3_next / qwen3_5_text (Gated DeltaNet or gated
 * attention, routed experts or a gated MLP). (1 + w) norms are drawn near 0.
 */
static kvf_status_t kvf_mk_family_layer(kvf_mk_ctx_t *c, const kvf_model_config_t *cfg,
                                        const char *pfx, int l, double out_scale)
{
    const int64_t H = cfg->hidden_size;
    const double nmean = (cfg->norm_offset == 1.0) ? 0.0 : 1.0;
    char name[256], sub[160];
    kvf_status_t status;

#define LNAME(_suffix) (snprintf(name, sizeof(name), "%s.%s", pfx, (_suffix)), name)
    KVF_MKC(LNAME("input_layernorm.weight"), KVF_INIT_UNIFORM, nmean, 0.1, H);
    KVF_MKC(LNAME("post_attention_layernorm.weight"), KVF_INIT_UNIFORM, nmean, 0.1, H);
    if (cfg->post_norms) {
        KVF_MKC(LNAME("pre_feedforward_layernorm.weight"), KVF_INIT_UNIFORM, nmean, 0.1, H);
        KVF_MKC(LNAME("post_feedforward_layernorm.weight"), KVF_INIT_UNIFORM, nmean, 0.1, H);
    }
#undef LNAME
    if (cfg->layer_kinds[l] == KVF_LAYER_MAMBA) {
        snprintf(sub, sizeof(sub), "%s.linear_attn", pfx);
        status = kvf_mk_gdn(c, cfg, sub, out_scale);
    } else {
        snprintf(sub, sizeof(sub), "%s.self_attn", pfx);
        status = kvf_mk_attention(c, cfg, sub, out_scale);
    }
    snprintf(sub, sizeof(sub), "%s.mlp", pfx);
    if (status != KVF_OK) {
        return status;
    }
    if (cfg->arch == KVF_ARCH_GPT_OSS) {
        return kvf_mk_oss_moe(c, cfg, sub, out_scale);
    }
    if (cfg->layer_sparse[l]) {
        return kvf_mk_qn_moe(c, cfg, sub, out_scale);
    }
    return kvf_mk_mlp(c, sub, H, cfg->intermediate_size, true, cfg->mlp_bias, out_scale);
}

/* model.safetensors.index.json naming every tensor's shard. */
static kvf_status_t kvf_mk_index(kvf_mk_ctx_t *ctx, const char *out_dir)
{
    cJSON *root = cJSON_CreateObject();
    char path[4096], *text = NULL;
    kvf_status_t status = KVF_ERR_NO_MEMORY;
    FILE *f;

    if ((root == NULL) || (cJSON_AddObjectToObject(root, "metadata") == NULL)) {
        goto out;
    }
    cJSON_AddItemToObject(root, "weight_map", ctx->weight_map);
    ctx->weight_map = NULL;
    text = cJSON_Print(root);
    if (text == NULL) {
        goto out;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", out_dir);
    f = fopen(path, "wb");
    if ((f == NULL) || (fputs(text, f) == EOF) || (fclose(f) != 0)) {
        kvf_error("cannot write %s: %m", path);
        status = KVF_ERR_IO;
        goto out;
    }
    status = KVF_OK;
out:
    free(text);
    cJSON_Delete(root);
    return status;
}

/*
 * The byte tokenizer, declared in the tokenizers library's own format: a BPE
 * with no merges over the 256 ByteLevel stand-ins, id = byte value, and the
 * config's BOS/EOS ids as special added tokens. The library reads it as
 * it is, so tests compare against it like any other tokenizer.json.
 */
static kvf_status_t kvf_mk_byte_tokenizer(const kvf_model_config_t *cfg, const char *out_dir)
{
    static const char *const names[2] = {"<|bos|>", "<|eos|>"};
    const int ids[2] = {cfg->bos_token_id, cfg->eos_token_id};
    cJSON *root = cJSON_CreateObject(), *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *pre, *model, *vocab, *dec;
    char path[4096], *text;
    uint32_t n = 0, cp[256];
    kvf_status_t status = KVF_OK;
    FILE *f;

    cJSON_AddStringToObject(root, "version", "1.0");
    for (int i = 0; i < 2; ++i) {
        cJSON *t;
        bool dup = false;
        for (int k = 0; k < i; ++k) {
            dup = dup || (ids[k] == ids[i]);
        }
        if ((ids[i] < 256) || (ids[i] >= cfg->vocab_size) || dup) {
            continue;
        }
        t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", ids[i]);
        cJSON_AddStringToObject(t, "content", names[i]);
        cJSON_AddFalseToObject(t, "single_word");
        cJSON_AddFalseToObject(t, "lstrip");
        cJSON_AddFalseToObject(t, "rstrip");
        cJSON_AddFalseToObject(t, "normalized");
        cJSON_AddTrueToObject(t, "special");
        cJSON_AddItemToArray(added, t);
    }
    cJSON_AddNullToObject(root, "normalizer");
    pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddFalseToObject(pre, "add_prefix_space");
    cJSON_AddFalseToObject(pre, "trim_offsets");
    cJSON_AddFalseToObject(pre, "use_regex");
    cJSON_AddNullToObject(root, "post_processor");
    dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddFalseToObject(dec, "add_prefix_space");
    cJSON_AddFalseToObject(dec, "trim_offsets");
    cJSON_AddFalseToObject(dec, "use_regex");
    model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddFalseToObject(model, "byte_fallback");
    vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int b = 0; b < 256; ++b) {      /* GPT-2 bytes_to_unicode */
        bool printable = ((b >= '!') && (b <= '~')) || ((b >= 0xa1) && (b <= 0xac)) ||
                         (b >= 0xae);
        cp[b] = printable ? (uint32_t)b : 256 + n++;
    }
    for (int b = 0; b < 256; ++b) {
        char s[4] = {0};
        if (cp[b] < 0x80) {
            s[0] = (char)cp[b];
        } else {
            s[0] = (char)(0xc0 | (cp[b] >> 6));
            s[1] = (char)(0x80 | (cp[b] & 0x3f));
        }
        cJSON_AddNumberToObject(vocab, s, b);
    }
    cJSON_AddArrayToObject(model, "merges");
    text = cJSON_Print(root);
    cJSON_Delete(root);
    if (text == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", out_dir);
    f = fopen(path, "w");
    if ((f == NULL) || (fputs(text, f) < 0) || (fclose(f) != 0)) {
        kvf_error("cannot write %s: %m", path);
        status = KVF_ERR_IO;
    }
    free(text);
    return status;
}

/* The tensors of layer @a l under @a root ("model" for dense decoders, "backbone" for NemotronH). */
static kvf_status_t kvf_mk_layer(kvf_mk_ctx_t *c, const kvf_model_config_t *cfg,
                                 const char *root, int l, double out_scale)
{
    const int64_t H = cfg->hidden_size;
    kvf_status_t status = KVF_OK;
    char pfx[128], name[256], sub[160];

    snprintf(pfx, sizeof(pfx), "%s.layers.%d", root, l);
    if ((cfg->arch == KVF_ARCH_GEMMA3_TEXT) || (cfg->arch == KVF_ARCH_GEMMA2) ||
        (cfg->arch == KVF_ARCH_GPT_OSS) || (cfg->arch == KVF_ARCH_QWEN3_NEXT) ||
        (cfg->arch == KVF_ARCH_QWEN3_5_TEXT)) {
        return kvf_mk_family_layer(c, cfg, pfx, l, out_scale);
    }
#define LNAME(_suffix) (snprintf(name, sizeof(name), "%s.%s", pfx, (_suffix)), name)
    if (cfg->arch != KVF_ARCH_NEMOTRON_H) {
        KVF_MKC(LNAME("input_layernorm.weight"), KVF_INIT_UNIFORM, 1.0, 0.1, H);
        KVF_MKC(LNAME("post_attention_layernorm.weight"), KVF_INIT_UNIFORM, 1.0, 0.1, H);
        snprintf(sub, sizeof(sub), "%s.self_attn", pfx);
        status = kvf_mk_attention(c, cfg, sub, out_scale);
        if (status == KVF_OK) {
            snprintf(sub, sizeof(sub), "%s.mlp", pfx);
            status = kvf_mk_mlp(c, sub, H, cfg->intermediate_size, true, cfg->mlp_bias,
                                out_scale);
        }
        return status;
    }
    KVF_MKC(LNAME("norm.weight"), KVF_INIT_UNIFORM, 1.0, 0.1, H);
#undef LNAME
    snprintf(sub, sizeof(sub), "%s.mixer", pfx);
    switch (cfg->layer_kinds[l]) {
    case KVF_LAYER_MAMBA:
        return kvf_mk_mamba(c, cfg, pfx, out_scale);
    case KVF_LAYER_ATTENTION:
        return kvf_mk_attention(c, cfg, sub, out_scale);
    case KVF_LAYER_MLP:
        return kvf_mk_mlp(c, sub, H, cfg->intermediate_size, false, cfg->mlp_bias, out_scale);
    case KVF_LAYER_MOE:
        return kvf_mk_moe(c, cfg, pfx, out_scale);
    default:
        return KVF_OK;
    }
}

/* Every tensor of the model, in checkpoint order: embeddings, layers, final norm, lm_head. */
static kvf_status_t kvf_mk_tensors(kvf_mk_ctx_t *c, const kvf_model_config_t *cfg)
{
    const bool is_dense = (cfg->arch != KVF_ARCH_NEMOTRON_H);
    const char *root = is_dense ? "model" : "backbone";
    const int64_t H = cfg->hidden_size, V = cfg->vocab_size;
    const double out_scale = 1.0 / sqrt((double)cfg->num_layers);
    kvf_status_t status;
    char name[256];

    snprintf(name, sizeof(name), "%s.%s", root, is_dense ? "embed_tokens.weight" :
             "embeddings.weight");
    /* gemma scales the embeddings by sqrt(hidden): drawn that much smaller, the first
     * hidden states keep unit scale (and the tied head does not echo the input token) */
    KVF_MKC(name, KVF_INIT_UNIFORM, 0.0,
            (cfg->embedding_multiplier > 1.0) ? 1.0 / cfg->embedding_multiplier : 1.0, V, H);
    for (int l = 0; l < cfg->num_layers; ++l) {
        status = kvf_mk_layer(c, cfg, root, l, out_scale);
        if (status != KVF_OK) {
            return status;
        }
    }
    snprintf(name, sizeof(name), "%s.%s", root, is_dense ? "norm.weight" : "norm_f.weight");
    status = kvf_mk_tensor(c, name, 1, &H, KVF_INIT_UNIFORM,
                           (cfg->norm_offset == 1.0) ? 0.0 : 1.0, 0.1);
    if ((status == KVF_OK) && !cfg->lm_head_tied) {
        const int64_t vh[2] = {V, H};
        status = kvf_mk_tensor(c, "lm_head.weight", 2, vh, KVF_INIT_UNIFORM, 0.0,
                               3.0 / sqrt((double)H));
    }
    return status;
}

kvf_status_t kvf_mkmodel_write_sharded(const char *config_path, const char *out_dir,
                                       uint64_t seed, kvf_dtype_t dtype, int shards)
{
    kvf_model_config_t cfg;
    kvf_mk_ctx_t ctx = {.seed = seed, .dtype = dtype, .shards = shards};
    char path[4096], file[64];
    kvf_status_t status;
    struct stat st;

    if ((dtype != KVF_DTYPE_FP32) && (dtype != KVF_DTYPE_BF16)) {
        kvf_error("mkmodel dtype must be fp32 or bf16, not %s", kvf_dtype_name(dtype));
        return KVF_ERR_INVALID_PARAM;
    }
    if ((shards < 1) || (shards > KVF_MK_MAX_SHARDS)) {
        kvf_error("mkmodel shards %d must be in [1, %d]", shards, KVF_MK_MAX_SHARDS);
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_model_config_load(config_path, &cfg);
    if (status != KVF_OK) {
        return status;
    }
    if ((cfg.arch == KVF_ARCH_BAMBA) || (cfg.arch == KVF_ARCH_GRANITE_MOE_HYBRID) ||
        cfg.mm_text) {
        /* their tensor names are not written here: transformers makes them
         * (tests/reference/make_family_data.py) */
        kvf_error("%s: model_type '%s' is not implemented by kvf mkmodel (nemotron_h, llama,"
                  " qwen3, mistral, gemma3_text, gemma2, gpt_oss, qwen3_next, qwen3_5_text,"
                  " qwen3_5_moe_text): refused", config_path, cfg.model_type);
        return KVF_ERR_UNSUPPORTED;
    }
    if ((stat(out_dir, &st) != 0) && (kvf_mk_mkdirs(out_dir) != 0)) {
        kvf_error("cannot create %s: %m", out_dir);
        return KVF_ERR_IO;
    }
    status = kvf_mk_config(config_path, out_dir, dtype);
    if ((status == KVF_OK) && (cfg.vocab_size >= 256)) {
        status = kvf_mk_byte_tokenizer(&cfg, out_dir);
    }
    if (status != KVF_OK) {
        return status;
    }
    /* a stale file of the other layout would shadow (or confuse) this one */
    snprintf(path, sizeof(path), "%s/%s", out_dir,
             (shards > 1) ? "model.safetensors" : "model.safetensors.index.json");
    (void)unlink(path);
    if (shards > 1) {
        ctx.weight_map = cJSON_CreateObject();
        if (ctx.weight_map == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
    }
    for (int i = 0; i < shards; ++i) {
        status = kvf_st_writer_create(&ctx.writers[i]);
        if (status != KVF_OK) {
            goto out;
        }
    }
    status = kvf_mk_tensors(&ctx, &cfg);
    if (status != KVF_OK) {
        goto out;
    }
    for (int i = 0; i < shards; ++i) {
        kvf_mk_shard_name(&ctx, i, file, sizeof(file));
        snprintf(path, sizeof(path), "%s/%s", out_dir, file);
        status = kvf_st_writer_finish(ctx.writers[i], path);
        ctx.writers[i] = NULL;
        if (status != KVF_OK) {
            goto out;
        }
    }
    if (shards > 1) {
        status = kvf_mk_index(&ctx, out_dir);
    }
out:
    for (int i = 0; i < shards; ++i) {
        kvf_st_writer_destroy(ctx.writers[i]);
    }
    cJSON_Delete(ctx.weight_map);
    return status;
}
#undef KVF_MKC

kvf_status_t kvf_mkmodel_write(const char *config_path, const char *out_dir, uint64_t seed,
                               kvf_dtype_t dtype)
{
    return kvf_mkmodel_write_sharded(config_path, out_dir, seed, dtype, 1);
}
