/*
 * Forward pass of one TP rank: NemotronH hybrids (Mamba2, attention, MLP and
 * MoE layers) and dense Llama / Qwen3 / Mistral.
 *
 * Design: a step is one flat batch of T tokens (the concatenated chunks of
 * every scheduled request, prefill chunks and single decode tokens alike),
 * so each projection is one GEMM over all T rows; only the cache-touching
 * parts (attention, conv1d, scan) loop over requests, because each request
 * has its own pages. Prefill and decode are the same code path: a decode
 * step is a chunk of one token with start > 0. This keeps "prefill N then
 * decode" and "prefill N+1 in one chunk" on the same kernels, so the two
 * agree to fp32 rounding (tests/common/runtime/test_model_consistency.c).
 *
 * Weights are loaded per rank as contiguous shards (rows of column-parallel
 * matrices, columns of row-parallel ones), so the forward never strides
 * over another rank's data. Matrices stay in the checkpoint's dtype (a bf16
 * checkpoint is resident at its file size, not twice it); a GEMM over a
 * bf16 matrix widens a tile of rows at a time into the rank's scratch and
 * computes in fp32. Small vectors (norms, biases, A_log, ...) are fp32.
 * Replicated tensors (embeddings, norms, lm_head) exist once and are shared
 * read-only by every rank thread. A row-parallel layer's bias is added by
 * rank 0 only, so the all-reduce sums it once.
 *
 * MoE layers are expert parallel: the router runs on every rank (same
 * input, same choice), each rank computes the routed experts it holds for
 * the tokens routed to them, plus its column slice of the shared expert;
 * one all-reduce sums both, as a row-parallel MLP would.
 *
 * Collectives: every rank calls the same sequence of all-reduces for a
 * batch, also after an error, so a failing rank never leaves its peers
 * waiting at a barrier; the first error is returned.
 */
#include "kvf_model.h"
#include "kvf_checkpoint.h"
#include "kvf_kern_status.h"
#include "kvf_log.h"
#include "kvf_safetensors.h"
#include "kvf_attention.h"
#include "kvf_conv1d.h"
#include "kvf_gemm.h"
#include "kvf_mamba2.h"
#include "kvf_norm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A weight matrix [rows][cols] in its checkpoint dtype (fp32, bf16 or fp16). */
typedef struct {
    void       *data;
    kvf_dtype_t dtype;
    int         rows, cols;
} kvf_mat_t;

typedef struct {
    /* Mamba */
    kvf_mat_t in_proj;   /* [in_rows][H]: z | x | B | C | dt of this rank */
    float    *in_bias;   /* [in_rows] or NULL */
    int       in_rows;
    float    *conv_w;    /* [conv_dim][K] */
    float    *conv_b;    /* [conv_dim] or NULL */
    float    *dt_bias, *A_log, *D;   /* [heads] */
    float    *gnorm_w;   /* [heads * head_dim] */
    kvf_mat_t out_proj;  /* [H][heads * head_dim] */
    float    *out_bias;  /* [H], rank 0 only */
    /* attention */
    kvf_mat_t qkv;       /* [(q_heads + 2 kv_heads) * head_dim][H] */
    float    *qkv_bias;  /* [qkv_rows] or NULL */
    int       qkv_rows;
    kvf_mat_t o_proj;    /* [H][q_heads * head_dim] */
    float    *o_bias;    /* [H], rank 0 only */
    float    *q_norm, *k_norm;   /* [head_dim] (qwen3) */
    /* MLP: nemotron_h up/down; dense archs fused gate|up rows, then down */
    kvf_mat_t up;        /* [cols or 2 cols][H] */
    float    *up_bias;
    kvf_mat_t down;      /* [H][cols] */
    float    *down_bias; /* rank 0 only */
    /* MoE */
    float    *router_w;  /* [E][H] fp32 (replicated per rank: small) */
    float    *router_b;  /* e_score_correction_bias [E] */
    kvf_mat_t *exp_up;   /* [experts on this rank]: [moe_I][H] */
    kvf_mat_t *exp_down; /* [H][moe_I] */
    kvf_mat_t sh_up, sh_down;    /* shared expert slice */
    float    *sh_up_b, *sh_down_b;
} kvf_layer_w_t;

typedef struct {
    kvf_shard_t    shard;
    kvf_layer_w_t *layers;
    int            max_rows;   /* widest column-parallel output of any layer */
    int            max_inner;  /* widest per-token intermediate (g buffer) */
} kvf_rank_w_t;

struct kvf_model {
    kvf_model_config_t cfg;
    int                tp;
    kvf_mat_t          embed;     /* [V][H] */
    float             *norm_f;    /* [H] */
    kvf_mat_t          lm_head;   /* [V][H]; aliases embed when tied */
    float            **norm_w;    /* [L][H] pre-norm of each layer (dense: input_layernorm) */
    float            **norm2_w;   /* [L][H] dense: post_attention_layernorm */
    float             *inv_freq;  /* [head_dim / 2] RoPE, or NULL */
    kvf_rank_w_t      *ranks;
    size_t             weight_bytes;
    size_t             file_bytes;
    int                num_files;
};

struct kvf_model_ws {
    size_t cap_tokens, cap_seqs, cap_tile;
    float *h, *xn, *out;        /* [T][H] */
    float *proj, *ybuf;         /* [T][max_rows] */
    float *xbc;                 /* [T][conv_dim] */
    float *g;                   /* [T][max_inner] */
    float *sumsq;               /* [T][groups] */
    int32_t *pos;               /* [T] */
    float *xg, *yg;             /* [T][H] MoE gather / expert output */
    float *scores;              /* [T][E] router */
    int32_t *route_idx;         /* [T][top_k] */
    float *route_w;             /* [T][top_k] */
    int32_t *rows;              /* [T] tokens of one expert */
    float *rw;                  /* [T] their weights */
    float *tile;                /* widened weight rows */
    float *last;                /* [S][H] */
    float *logits;              /* [S][V] */
};

/* ---- loading ------------------------------------------------------------- */

typedef struct {
    kvf_ckpt_h  ck;
    bool        dense;
    char        name[256];
    size_t      bytes;   /* weights loaded so far */
} kvf_loader_t;

/* nemotron_h: backbone.layers.N.<suffix>; dense: model.layers.N.<suffix>. */
static const char *kvf_lname(kvf_loader_t *ld, int layer, const char *suffix)
{
    if (layer < 0) {
        snprintf(ld->name, sizeof(ld->name), "%s", suffix);
    } else {
        snprintf(ld->name, sizeof(ld->name), "%s.layers.%d.%s", ld->dense ? "model" : "backbone",
                 layer, suffix);
    }
    return ld->name;
}

static void *kvf_alloc(size_t bytes)
{
    return malloc(bytes ? bytes : 1);
}

static size_t kvf_numel(int ndim, const int64_t *shape)
{
    size_t n = 1;
    for (int i = 0; i < ndim; ++i) {
        n *= (size_t)shape[i];
    }
    return n;
}

/* Rows {start, count} ranges, and of each row columns [c0, c0 + cols) (cols < 0:
 * whole rows), concatenated into *out_p as @a dtype (fp32, or the tensor's own). */
static kvf_status_t kvf_load_part(kvf_loader_t *ld, const char *name, int ndim,
                                  const int64_t *shape, const int64_t (*ranges)[2], int nr,
                                  int64_t c0, int64_t cols, bool keep_dtype, void **out_p,
                                  kvf_dtype_t *dtype_p)
{
    kvf_st_file_h f = kvf_ckpt_need(ld->ck, name);
    int64_t row_len = (int64_t)kvf_numel(ndim - 1, shape + 1), rows = 0;
    kvf_dtype_t dt = KVF_DTYPE_FP32;
    size_t off = 0, esz;
    void *buf;
    kvf_status_t status;

    if (f == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    if (keep_dtype) {
        status = kvf_st_tensor_dtype(f, name, &dt);
        if (status != KVF_OK) {
            return status;
        }
    }
    if (cols < 0) {
        c0 = 0;
        cols = row_len;
    }
    for (int i = 0; i < nr; ++i) {
        rows += ranges[i][1];
    }
    esz = kvf_dtype_size(dt);
    buf = kvf_alloc((size_t)(rows * cols) * esz);
    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int i = 0; i < nr; ++i) {
        status = kvf_st_load_block(f, name, ndim, shape, ranges[i][0], ranges[i][1], c0, cols, dt,
                                   (char *)buf + off);
        if (status != KVF_OK) {
            free(buf);
            return status;
        }
        off += (size_t)(ranges[i][1] * cols) * esz;
    }
    ld->bytes += (size_t)(rows * cols) * esz;
    *out_p = buf;
    if (dtype_p != NULL) {
        *dtype_p = dt;
    }
    return KVF_OK;
}

/* Whole fp32 vector / tensor. */
static kvf_status_t kvf_load_vec(kvf_loader_t *ld, const char *name, int ndim,
                                 const int64_t *shape, float **out_p)
{
    const int64_t r[1][2] = {{0, shape[0]}};
    return kvf_load_part(ld, name, ndim, shape, r, 1, 0, -1, false, (void **)out_p, NULL);
}

/* Row ranges of a 1-D fp32 tensor (column-parallel vector slices). */
static kvf_status_t kvf_load_vec_rows(kvf_loader_t *ld, const char *name, int64_t n,
                                      const int64_t (*ranges)[2], int nr, float **out_p)
{
    const int64_t shape[1] = {n};
    return kvf_load_part(ld, name, 1, shape, ranges, nr, 0, -1, false, (void **)out_p, NULL);
}

/* Column-parallel matrix: row ranges of a [N][K] tensor, kept in its dtype. */
static kvf_status_t kvf_load_mat_rows(kvf_loader_t *ld, const char *name, int64_t N, int64_t K,
                                      const int64_t (*ranges)[2], int nr, kvf_mat_t *m)
{
    const int64_t shape[2] = {N, K};
    int64_t rows = 0;
    for (int i = 0; i < nr; ++i) {
        rows += ranges[i][1];
    }
    m->rows = (int)rows;
    m->cols = (int)K;
    return kvf_load_part(ld, name, 2, shape, ranges, nr, 0, -1, true, &m->data, &m->dtype);
}

/* Row-parallel matrix: columns [c0, c0 + cols) of a [N][K] tensor. */
static kvf_status_t kvf_load_mat_cols(kvf_loader_t *ld, const char *name, int64_t N, int64_t K,
                                      int64_t c0, int64_t cols, kvf_mat_t *m)
{
    const int64_t shape[2] = {N, K};
    const int64_t r[1][2] = {{0, N}};
    m->rows = (int)N;
    m->cols = (int)cols;
    return kvf_load_part(ld, name, 2, shape, r, 1, c0, cols, true, &m->data, &m->dtype);
}

#define KVF_LOAD(_expr)             \
    do {                            \
        status = (_expr);           \
        if (status != KVF_OK) {     \
            return status;          \
        }                           \
    } while (0)

static kvf_status_t kvf_load_mamba(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                   const kvf_shard_t *s, int l, kvf_layer_w_t *w)
{
    const int64_t H = cfg->hidden_size, hd = cfg->mamba_head_dim, N = cfg->ssm_state_size;
    const int64_t G = cfg->n_groups, nh = cfg->mamba_num_heads, K = cfg->conv_kernel;
    const int64_t inner = nh * hd, conv_dim = inner + 2 * G * N;
    const int64_t x0 = s->mamba_head_start * hd, xn = s->mamba_heads * hd;
    const int64_t b0 = s->group_start * N, bn = s->groups * N;
    kvf_status_t status;

    {
        const int64_t r[5][2] = {
            {x0, xn},                                   /* z */
            {inner + x0, xn},                           /* x */
            {2 * inner + b0, bn},                       /* B */
            {2 * inner + G * N + b0, bn},               /* C */
            {2 * inner + 2 * G * N + s->mamba_head_start, s->mamba_heads},   /* dt */
        };
        KVF_LOAD(kvf_load_mat_rows(ld, kvf_lname(ld, l, "mixer.in_proj.weight"),
                                   inner + conv_dim + nh, H, r, 5, &w->in_proj));
        if (cfg->mamba_proj_bias) {
            KVF_LOAD(kvf_load_vec_rows(ld, kvf_lname(ld, l, "mixer.in_proj.bias"),
                                       inner + conv_dim + nh, r, 5, &w->in_bias));
        }
        w->in_rows = (int)(2 * xn + 2 * bn + s->mamba_heads);
    }
    {
        const int64_t r[3][2] = {{x0, xn}, {inner + b0, bn}, {inner + G * N + b0, bn}};
        const int64_t wshape[3] = {conv_dim, 1, K};
        KVF_LOAD(kvf_load_part(ld, kvf_lname(ld, l, "mixer.conv1d.weight"), 3, wshape, r, 3, 0,
                               -1, false, (void **)&w->conv_w, NULL));
        if (cfg->use_conv_bias) {
            KVF_LOAD(kvf_load_vec_rows(ld, kvf_lname(ld, l, "mixer.conv1d.bias"), conv_dim, r, 3,
                                       &w->conv_b));
        }
    }
    {
        const int64_t hr[1][2] = {{s->mamba_head_start, s->mamba_heads}};
        const int64_t ir[1][2] = {{x0, xn}};
        KVF_LOAD(kvf_load_vec_rows(ld, kvf_lname(ld, l, "mixer.dt_bias"), nh, hr, 1, &w->dt_bias));
        KVF_LOAD(kvf_load_vec_rows(ld, kvf_lname(ld, l, "mixer.A_log"), nh, hr, 1, &w->A_log));
        KVF_LOAD(kvf_load_vec_rows(ld, kvf_lname(ld, l, "mixer.D"), nh, hr, 1, &w->D));
        KVF_LOAD(kvf_load_vec_rows(ld, kvf_lname(ld, l, "mixer.norm.weight"), inner, ir, 1,
                                   &w->gnorm_w));
    }
    KVF_LOAD(kvf_load_mat_cols(ld, kvf_lname(ld, l, "mixer.out_proj.weight"), H, inner, x0, xn,
                               &w->out_proj));
    if (cfg->mamba_proj_bias && (s->tp_rank == 0)) {
        const int64_t hshape[1] = {H};
        KVF_LOAD(kvf_load_vec(ld, kvf_lname(ld, l, "mixer.out_proj.bias"), 1, hshape,
                              &w->out_bias));
    }
    return KVF_OK;
}

/* Concatenate the rows of three matrices of one dtype (q | k | v). */
static kvf_status_t kvf_mat_concat3(kvf_mat_t parts[3], kvf_mat_t *out)
{
    size_t esz = kvf_dtype_size(parts[0].dtype), off = 0;
    int rows = parts[0].rows + parts[1].rows + parts[2].rows;

    if ((parts[1].dtype != parts[0].dtype) || (parts[2].dtype != parts[0].dtype)) {
        kvf_error("q, k and v projections are stored in different dtypes (%s, %s, %s)",
                  kvf_dtype_name(parts[0].dtype), kvf_dtype_name(parts[1].dtype),
                  kvf_dtype_name(parts[2].dtype));
        return KVF_ERR_UNSUPPORTED;
    }
    out->data = kvf_alloc((size_t)rows * (size_t)parts[0].cols * esz);
    if (out->data == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int i = 0; i < 3; ++i) {
        size_t n = (size_t)parts[i].rows * (size_t)parts[i].cols * esz;
        memcpy((char *)out->data + off, parts[i].data, n);
        off += n;
    }
    out->dtype = parts[0].dtype;
    out->rows = rows;
    out->cols = parts[0].cols;
    return KVF_OK;
}

static kvf_status_t kvf_load_attention(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                       const kvf_shard_t *s, int l, kvf_layer_w_t *w)
{
    const int64_t H = cfg->hidden_size, hd = cfg->head_dim;
    const int64_t q = (int64_t)cfg->num_attention_heads * hd;
    const int64_t kv = (int64_t)cfg->num_key_value_heads * hd;
    const int64_t q0 = s->attn_head_start * hd, qn = s->attn_heads * hd;
    const int64_t k0 = s->kv_head_start * hd, kn = s->kv_heads * hd;
    const int64_t qr[1][2] = {{q0, qn}}, kr[1][2] = {{k0, kn}};
    const char *pfx = ld->dense ? "self_attn" : "mixer";
    static const char *const proj[3] = {"q_proj", "k_proj", "v_proj"};
    kvf_mat_t parts[3] = {{0}};
    float *bparts[3] = {NULL, NULL, NULL};
    char suffix[64];
    kvf_status_t status = KVF_OK;

    for (int i = 0; (status == KVF_OK) && (i < 3); ++i) {
        snprintf(suffix, sizeof(suffix), "%s.%s.weight", pfx, proj[i]);
        status = kvf_load_mat_rows(ld, kvf_lname(ld, l, suffix), i ? kv : q, H, i ? kr : qr, 1,
                                   &parts[i]);
        if ((status == KVF_OK) && cfg->attn_bias) {
            snprintf(suffix, sizeof(suffix), "%s.%s.bias", pfx, proj[i]);
            status = kvf_load_vec_rows(ld, kvf_lname(ld, l, suffix), i ? kv : q, i ? kr : qr, 1,
                                       &bparts[i]);
        }
    }
    if (status == KVF_OK) {
        status = kvf_mat_concat3(parts, &w->qkv);
        w->qkv_rows = (int)(qn + 2 * kn);
    }
    if ((status == KVF_OK) && cfg->attn_bias) {
        w->qkv_bias = kvf_alloc((size_t)w->qkv_rows * sizeof(float));
        if (w->qkv_bias == NULL) {
            status = KVF_ERR_NO_MEMORY;
        } else {
            memcpy(w->qkv_bias, bparts[0], (size_t)qn * sizeof(float));
            memcpy(w->qkv_bias + qn, bparts[1], (size_t)kn * sizeof(float));
            memcpy(w->qkv_bias + qn + kn, bparts[2], (size_t)kn * sizeof(float));
        }
    }
    for (int i = 0; i < 3; ++i) {
        free(parts[i].data);
        free(bparts[i]);
    }
    if (status != KVF_OK) {
        return status;
    }
    snprintf(suffix, sizeof(suffix), "%s.o_proj.weight", pfx);
    KVF_LOAD(kvf_load_mat_cols(ld, kvf_lname(ld, l, suffix), H, q, q0, qn, &w->o_proj));
    if (cfg->attn_bias && (s->tp_rank == 0)) {
        const int64_t hshape[1] = {H};
        snprintf(suffix, sizeof(suffix), "%s.o_proj.bias", pfx);
        KVF_LOAD(kvf_load_vec(ld, kvf_lname(ld, l, suffix), 1, hshape, &w->o_bias));
    }
    if (cfg->qk_norm) {
        const int64_t dshape[1] = {hd};
        KVF_LOAD(kvf_load_vec(ld, kvf_lname(ld, l, "self_attn.q_norm.weight"), 1, dshape,
                              &w->q_norm));
        KVF_LOAD(kvf_load_vec(ld, kvf_lname(ld, l, "self_attn.k_norm.weight"), 1, dshape,
                              &w->k_norm));
    }
    return KVF_OK;
}

/*
 * An MLP's column slice [c0, c0 + C) of intermediate I: prefix "mixer" (up,
 * down) or "mlp" (gate, up, down: gate rows first, then up rows, fused).
 */
static kvf_status_t kvf_load_mlp_part(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                      int rank, int l, const char *pfx, bool gated, int64_t I,
                                      int64_t c0, int64_t C, kvf_mat_t *up, float **up_b,
                                      kvf_mat_t *down, float **down_b)
{
    const int64_t H = cfg->hidden_size;
    const int64_t r[1][2] = {{c0, C}};
    char suffix[96];
    kvf_status_t status;

    if (gated) {
        kvf_mat_t parts[2] = {{0}};
        float *bparts[2] = {NULL, NULL};
        static const char *const names[2] = {"gate_proj", "up_proj"};
        status = KVF_OK;
        for (int i = 0; (status == KVF_OK) && (i < 2); ++i) {
            snprintf(suffix, sizeof(suffix), "%s.%s.weight", pfx, names[i]);
            status = kvf_load_mat_rows(ld, kvf_lname(ld, l, suffix), I, H, r, 1, &parts[i]);
            if ((status == KVF_OK) && cfg->mlp_bias) {
                snprintf(suffix, sizeof(suffix), "%s.%s.bias", pfx, names[i]);
                status = kvf_load_vec_rows(ld, kvf_lname(ld, l, suffix), I, r, 1, &bparts[i]);
            }
        }
        if ((status == KVF_OK) && (parts[0].dtype != parts[1].dtype)) {
            kvf_error("gate_proj and up_proj of layer %d are stored in different dtypes", l);
            status = KVF_ERR_UNSUPPORTED;
        }
        if (status == KVF_OK) {
            size_t n = (size_t)(C * H) * kvf_dtype_size(parts[0].dtype);
            up->data = kvf_alloc(2 * n);
            up->dtype = parts[0].dtype;
            up->rows = (int)(2 * C);
            up->cols = (int)H;
            if (up->data == NULL) {
                status = KVF_ERR_NO_MEMORY;
            } else {
                memcpy(up->data, parts[0].data, n);
                memcpy((char *)up->data + n, parts[1].data, n);
            }
        }
        if ((status == KVF_OK) && cfg->mlp_bias) {
            *up_b = kvf_alloc(2 * (size_t)C * sizeof(float));
            if (*up_b == NULL) {
                status = KVF_ERR_NO_MEMORY;
            } else {
                memcpy(*up_b, bparts[0], (size_t)C * sizeof(float));
                memcpy(*up_b + C, bparts[1], (size_t)C * sizeof(float));
            }
        }
        for (int i = 0; i < 2; ++i) {
            free(parts[i].data);
            free(bparts[i]);
        }
        if (status != KVF_OK) {
            return status;
        }
    } else {
        snprintf(suffix, sizeof(suffix), "%s.up_proj.weight", pfx);
        KVF_LOAD(kvf_load_mat_rows(ld, kvf_lname(ld, l, suffix), I, H, r, 1, up));
        if (cfg->mlp_bias) {
            snprintf(suffix, sizeof(suffix), "%s.up_proj.bias", pfx);
            KVF_LOAD(kvf_load_vec_rows(ld, kvf_lname(ld, l, suffix), I, r, 1, up_b));
        }
    }
    snprintf(suffix, sizeof(suffix), "%s.down_proj.weight", pfx);
    KVF_LOAD(kvf_load_mat_cols(ld, kvf_lname(ld, l, suffix), H, I, c0, C, down));
    if (cfg->mlp_bias && (rank == 0)) {
        const int64_t hshape[1] = {H};
        snprintf(suffix, sizeof(suffix), "%s.down_proj.bias", pfx);
        KVF_LOAD(kvf_load_vec(ld, kvf_lname(ld, l, suffix), 1, hshape, down_b));
    }
    return KVF_OK;
}

static kvf_status_t kvf_load_moe(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                 const kvf_shard_t *s, int l, kvf_layer_w_t *w)
{
    const int64_t H = cfg->hidden_size, E = cfg->moe_num_experts, I = cfg->moe_intermediate_size;
    const int64_t rshape[2] = {E, H}, bshape[1] = {E};
    char suffix[96];
    kvf_status_t status;

    KVF_LOAD(kvf_load_vec(ld, kvf_lname(ld, l, "mixer.gate.weight"), 2, rshape, &w->router_w));
    if (kvf_ckpt_find(ld->ck, kvf_lname(ld, l, "mixer.gate.e_score_correction_bias")) != NULL) {
        KVF_LOAD(kvf_load_vec(ld, ld->name, 1, bshape, &w->router_b));
    } else {
        w->router_b = calloc((size_t)E, sizeof(float));   /* transformers' buffer starts at 0 */
        if (w->router_b == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
    }
    w->exp_up = calloc((size_t)(s->moe_experts ? s->moe_experts : 1), sizeof(kvf_mat_t));
    w->exp_down = calloc((size_t)(s->moe_experts ? s->moe_experts : 1), sizeof(kvf_mat_t));
    if ((w->exp_up == NULL) || (w->exp_down == NULL)) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int e = 0; e < s->moe_experts; ++e) {
        const int64_t all[1][2] = {{0, I}};
        int ge = s->moe_expert_start + e;
        snprintf(suffix, sizeof(suffix), "mixer.experts.%d.up_proj.weight", ge);
        KVF_LOAD(kvf_load_mat_rows(ld, kvf_lname(ld, l, suffix), I, H, all, 1, &w->exp_up[e]));
        snprintf(suffix, sizeof(suffix), "mixer.experts.%d.down_proj.weight", ge);
        KVF_LOAD(kvf_load_mat_cols(ld, kvf_lname(ld, l, suffix), H, I, 0, I, &w->exp_down[e]));
    }
    return kvf_load_mlp_part(ld, cfg, s->tp_rank, l, "mixer.shared_experts", false,
                             cfg->moe_shared_intermediate_size, s->moe_shared_col_start,
                             s->moe_shared_cols, &w->sh_up, &w->sh_up_b, &w->sh_down,
                             &w->sh_down_b);
}

static void kvf_layer_w_free(kvf_layer_w_t *w, int experts)
{
    void *ptrs[] = {
        w->in_proj.data, w->in_bias, w->conv_w, w->conv_b, w->dt_bias, w->A_log, w->D,
        w->gnorm_w, w->out_proj.data, w->out_bias, w->qkv.data, w->qkv_bias, w->o_proj.data,
        w->o_bias, w->q_norm, w->k_norm, w->up.data, w->up_bias, w->down.data, w->down_bias,
        w->router_w, w->router_b, w->sh_up.data, w->sh_down.data, w->sh_up_b, w->sh_down_b,
    };
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); ++i) {
        free(ptrs[i]);
    }
    for (int e = 0; (w->exp_up != NULL) && (e < experts); ++e) {
        free(w->exp_up[e].data);
        free(w->exp_down[e].data);
    }
    free(w->exp_up);
    free(w->exp_down);
}

void kvf_model_destroy(kvf_model_h model)
{
    if (model == NULL) {
        return;
    }
    for (int r = 0; (model->ranks != NULL) && (r < model->tp); ++r) {
        for (int l = 0; (model->ranks[r].layers != NULL) && (l < model->cfg.num_layers); ++l) {
            kvf_layer_w_free(&model->ranks[r].layers[l], model->ranks[r].shard.moe_experts);
        }
        free(model->ranks[r].layers);
    }
    for (int l = 0; (model->norm_w != NULL) && (l < model->cfg.num_layers); ++l) {
        free(model->norm_w[l]);
    }
    for (int l = 0; (model->norm2_w != NULL) && (l < model->cfg.num_layers); ++l) {
        free(model->norm2_w[l]);
    }
    free(model->norm_w);
    free(model->norm2_w);
    free(model->ranks);
    if (model->lm_head.data != model->embed.data) {
        free(model->lm_head.data);
    }
    free(model->embed.data);
    free(model->norm_f);
    free(model->inv_freq);
    free(model);
}

/* RoPE inverse frequencies as transformers computes them (fp32). */
static float *kvf_rope_inv_freq(const kvf_model_config_t *cfg)
{
    const kvf_rope_t *r = &cfg->rope;
    const int half = cfg->head_dim / 2;
    float *inv = kvf_alloc((size_t)half * sizeof(float));

    if (inv == NULL) {
        return NULL;
    }
    for (int i = 0; i < half; ++i) {
        float f = 1.0f / powf((float)r->theta, (float)(2 * i) / (float)cfg->head_dim);
        if (r->type == KVF_ROPE_LINEAR) {
            f = (float)(f / r->factor);
        } else if (r->type == KVF_ROPE_LLAMA3) {
            double low_wl = r->original_max_pos / r->low_freq_factor;
            double high_wl = r->original_max_pos / r->high_freq_factor;
            double wl = 2.0 * M_PI / (double)f;
            if (wl > low_wl) {
                f = (float)(f / r->factor);
            } else if (!(wl < high_wl)) {
                double smooth = (r->original_max_pos / wl - r->low_freq_factor) /
                                (r->high_freq_factor - r->low_freq_factor);
                f = (float)((1.0 - smooth) * f / r->factor + smooth * f);
            }
        }
        inv[i] = f;
    }
    return inv;
}

static int kvf_layer_rows(const kvf_model_config_t *cfg, const kvf_rank_w_t *rw,
                          const kvf_layer_w_t *w, int l, int *inner_p)
{
    const kvf_shard_t *s = &rw->shard;
    int rows = 0, inner = 0;

    switch (cfg->layer_kinds[l]) {
    case KVF_LAYER_MAMBA:
        rows = w->in_rows;
        inner = s->mamba_heads * cfg->mamba_head_dim;
        break;
    case KVF_LAYER_ATTENTION:
        rows = w->qkv_rows;
        inner = s->attn_heads * cfg->head_dim;
        if (cfg->dense_mlp_in_layer) {
            rows = (2 * s->mlp_cols > rows) ? 2 * s->mlp_cols : rows;
            inner = (s->mlp_cols > inner) ? s->mlp_cols : inner;
        }
        break;
    case KVF_LAYER_MLP:
        rows = inner = s->mlp_cols;
        break;
    case KVF_LAYER_MOE:
        rows = (s->moe_shared_cols > cfg->moe_intermediate_size) ? s->moe_shared_cols :
               cfg->moe_intermediate_size;
        inner = rows;
        break;
    default:
        break;
    }
    *inner_p = inner;
    return rows;
}

static kvf_status_t kvf_load_embeddings(kvf_loader_t *ld, kvf_model_h m)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const int64_t V = cfg->vocab_size, H = cfg->hidden_size;
    const int64_t all[1][2] = {{0, V}};
    const int64_t hshape[1] = {H};
    kvf_status_t status;

    KVF_LOAD(kvf_load_mat_rows(ld, ld->dense ? "model.embed_tokens.weight" :
                               "backbone.embeddings.weight", V, H, all, 1, &m->embed));
    KVF_LOAD(kvf_load_vec(ld, ld->dense ? "model.norm.weight" : "backbone.norm_f.weight", 1,
                          hshape, &m->norm_f));
    if (cfg->lm_head_tied) {
        m->lm_head = m->embed;
        return KVF_OK;
    }
    return kvf_load_mat_rows(ld, "lm_head.weight", V, H, all, 1, &m->lm_head);
}

kvf_status_t kvf_model_load(const char *dir, int tp_size, kvf_model_h *model_p)
{
    kvf_loader_t ld = {0};
    kvf_model_h m = calloc(1, sizeof(*m));
    kvf_model_config_t *cfg;
    kvf_status_t status;

    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    cfg = &m->cfg;
    status = kvf_model_config_load(dir, cfg);
    if (status != KVF_OK) {
        goto err;
    }
    status = kvf_shard_check(cfg, tp_size);
    if (status != KVF_OK) {
        goto err;
    }
    m->tp = tp_size;
    ld.dense = (cfg->arch != KVF_ARCH_NEMOTRON_H);
    status = kvf_ckpt_open(dir, &ld.ck);
    if (status != KVF_OK) {
        goto err;
    }
    m->file_bytes = kvf_ckpt_bytes(ld.ck);
    m->num_files = kvf_ckpt_num_files(ld.ck);
    status = kvf_load_embeddings(&ld, m);
    m->norm_w = calloc((size_t)cfg->num_layers, sizeof(*m->norm_w));
    m->norm2_w = calloc((size_t)cfg->num_layers, sizeof(*m->norm2_w));
    m->ranks = calloc((size_t)tp_size, sizeof(*m->ranks));
    if ((status == KVF_OK) && ((m->norm_w == NULL) || (m->norm2_w == NULL) || (m->ranks == NULL))) {
        status = KVF_ERR_NO_MEMORY;
    }
    if ((status == KVF_OK) && (cfg->rope.type != KVF_ROPE_NONE)) {
        m->inv_freq = kvf_rope_inv_freq(cfg);
        status = (m->inv_freq != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
    }
    for (int l = 0; (status == KVF_OK) && (l < cfg->num_layers); ++l) {
        const int64_t hshape[1] = {cfg->hidden_size};
        status = kvf_load_vec(&ld, kvf_lname(&ld, l, ld.dense ? "input_layernorm.weight" :
                                             "norm.weight"), 1, hshape, &m->norm_w[l]);
        if ((status == KVF_OK) && ld.dense) {
            status = kvf_load_vec(&ld, kvf_lname(&ld, l, "post_attention_layernorm.weight"), 1,
                                  hshape, &m->norm2_w[l]);
        }
    }
    for (int r = 0; (status == KVF_OK) && (r < tp_size); ++r) {
        kvf_rank_w_t *rw = &m->ranks[r];
        status = kvf_shard_compute(cfg, tp_size, r, &rw->shard);
        rw->layers = calloc((size_t)cfg->num_layers, sizeof(*rw->layers));
        if ((status == KVF_OK) && (rw->layers == NULL)) {
            status = KVF_ERR_NO_MEMORY;
        }
        for (int l = 0; (status == KVF_OK) && (l < cfg->num_layers); ++l) {
            kvf_layer_w_t *w = &rw->layers[l];
            const kvf_shard_t *s = &rw->shard;
            int rows, inner;
            switch (cfg->layer_kinds[l]) {
            case KVF_LAYER_MAMBA:
                status = kvf_load_mamba(&ld, cfg, s, l, w);
                break;
            case KVF_LAYER_ATTENTION:
                status = kvf_load_attention(&ld, cfg, s, l, w);
                if ((status == KVF_OK) && cfg->dense_mlp_in_layer) {
                    status = kvf_load_mlp_part(&ld, cfg, r, l, "mlp", cfg->mlp_gated,
                                               cfg->intermediate_size, s->mlp_col_start,
                                               s->mlp_cols, &w->up, &w->up_bias, &w->down,
                                               &w->down_bias);
                }
                break;
            case KVF_LAYER_MLP:
                status = kvf_load_mlp_part(&ld, cfg, r, l, "mixer", false, cfg->intermediate_size,
                                           s->mlp_col_start, s->mlp_cols, &w->up, &w->up_bias,
                                           &w->down, &w->down_bias);
                break;
            case KVF_LAYER_MOE:
                status = kvf_load_moe(&ld, cfg, s, l, w);
                break;
            default:
                status = KVF_ERR_UNSUPPORTED;
                break;
            }
            rows = kvf_layer_rows(cfg, rw, w, l, &inner);
            rw->max_rows = (rows > rw->max_rows) ? rows : rw->max_rows;
            rw->max_inner = (inner > rw->max_inner) ? inner : rw->max_inner;
        }
    }
    m->weight_bytes = ld.bytes;
    kvf_ckpt_close(ld.ck);
    if (status != KVF_OK) {
        goto err;
    }
    *model_p = m;
    return KVF_OK;

err:
    kvf_model_destroy(m);
    return status;
}

const kvf_model_config_t *kvf_model_get_config(kvf_model_h model)
{
    return &model->cfg;
}

int kvf_model_tp_size(kvf_model_h model)
{
    return model->tp;
}

size_t kvf_model_weight_bytes(kvf_model_h model)
{
    return model->weight_bytes;
}

size_t kvf_model_file_bytes(kvf_model_h model)
{
    return model->file_bytes;
}

int kvf_model_num_files(kvf_model_h model)
{
    return model->num_files;
}

/* ---- workspace ------------------------------------------------------------ */

kvf_status_t kvf_model_ws_create(struct kvf_model_ws **ws_p)
{
    struct kvf_model_ws *ws = calloc(1, sizeof(*ws));
    if (ws == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    *ws_p = ws;
    return KVF_OK;
}

void kvf_model_ws_destroy(struct kvf_model_ws *ws)
{
    if (ws == NULL) {
        return;
    }
    void *ptrs[] = {
        ws->h, ws->xn, ws->out, ws->proj, ws->ybuf, ws->xbc, ws->g, ws->sumsq, ws->pos, ws->xg,
        ws->yg, ws->scores, ws->route_idx, ws->route_w, ws->rows, ws->rw, ws->tile, ws->last,
        ws->logits,
    };
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); ++i) {
        free(ptrs[i]);
    }
    free(ws);
}

static int kvf_grow(void **p, size_t bytes)
{
    void *n = realloc(*p, bytes ? bytes : 1);
    if (n == NULL) {
        return -1;
    }
    *p = n;
    return 0;
}

/* Rows of a widened weight tile: about 1 MiB of fp32 per GEMM call. */
static size_t kvf_tile_rows(int K)
{
    size_t rows = ((size_t)1 << 18) / (size_t)(K > 0 ? K : 1);
    return rows ? rows : 1;
}

static kvf_status_t kvf_ws_reserve(struct kvf_model_ws *ws, const kvf_model_h m,
                                   const kvf_rank_w_t *rw, size_t T, size_t S)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_shard_t *s = &rw->shard;
    size_t H = (size_t)cfg->hidden_size;
    size_t wide = (size_t)rw->max_rows;
    size_t gdim = (size_t)rw->max_inner;
    size_t groups = (s->groups > 0) ? (size_t)s->groups : 1;
    size_t E = (size_t)(cfg->moe_num_experts ? cfg->moe_num_experts : 1);
    size_t k = (size_t)(cfg->moe_top_k ? cfg->moe_top_k : 1);
    int bad = 0;

    if (ws->cap_tile == 0) {
        /* widest K of any matrix: H (column-parallel) or an inner width (row-parallel) */
        size_t K = (H > gdim) ? H : gdim;
        size_t tile = kvf_tile_rows((int)K) * K;
        if (kvf_grow((void **)&ws->tile, tile * sizeof(float)) != 0) {
            return KVF_ERR_NO_MEMORY;
        }
        ws->cap_tile = tile;
    }
    if (T > ws->cap_tokens) {
        bad |= kvf_grow((void **)&ws->h, T * H * sizeof(float));
        bad |= kvf_grow((void **)&ws->xn, T * H * sizeof(float));
        bad |= kvf_grow((void **)&ws->out, T * H * sizeof(float));
        bad |= kvf_grow((void **)&ws->proj, T * wide * sizeof(float));
        bad |= kvf_grow((void **)&ws->ybuf, T * wide * sizeof(float));
        bad |= kvf_grow((void **)&ws->xbc, T * (size_t)(s->conv_dim ? s->conv_dim : 1) * sizeof(float));
        bad |= kvf_grow((void **)&ws->g, T * gdim * sizeof(float));
        bad |= kvf_grow((void **)&ws->sumsq, T * groups * sizeof(float));
        bad |= kvf_grow((void **)&ws->pos, T * sizeof(int32_t));
        bad |= kvf_grow((void **)&ws->xg, T * H * sizeof(float));
        bad |= kvf_grow((void **)&ws->yg, T * H * sizeof(float));
        bad |= kvf_grow((void **)&ws->scores, T * E * sizeof(float));
        bad |= kvf_grow((void **)&ws->route_idx, T * k * sizeof(int32_t));
        bad |= kvf_grow((void **)&ws->route_w, T * k * sizeof(float));
        bad |= kvf_grow((void **)&ws->rows, T * sizeof(int32_t));
        bad |= kvf_grow((void **)&ws->rw, T * sizeof(float));
        if (bad) {
            /* realloc keeps what it could not grow: the old capacity stays valid, so
             * every rank keeps the same capacity history (see the forward) */
            return KVF_ERR_NO_MEMORY;
        }
        ws->cap_tokens = T;
    }
    if (S > ws->cap_seqs) {
        bad |= kvf_grow((void **)&ws->last, S * H * sizeof(float));
        bad |= kvf_grow((void **)&ws->logits, S * (size_t)cfg->vocab_size * sizeof(float));
        if (bad) {
            return KVF_ERR_NO_MEMORY;
        }
        ws->cap_seqs = S;
    }
    return KVF_OK;
}

/* ---- forward -------------------------------------------------------------- */

/* Same checks on every rank (same batch), so either all ranks run or none. */
static kvf_status_t kvf_batch_check(const kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                    const kvf_fwd_batch_t *batch)
{
    const kvf_cache_layout_t *lay = ctx->layout;
    int nblocks = kvf_page_pool_num_blocks(ctx->pool);

    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        if ((sq->num_tokens < 1) || (sq->start < 0)) {
            kvf_error("seq %d: %d tokens at start %d", i, sq->num_tokens, sq->start);
            return KVF_ERR_INVALID_PARAM;
        }
        for (int t = 0; t < sq->num_tokens; ++t) {
            if ((sq->tokens[t] < 0) || (sq->tokens[t] >= m->cfg.vocab_size)) {
                kvf_error("seq %d: token id %d outside the vocabulary [0, %d)", i, sq->tokens[t],
                          m->cfg.vocab_size);
                return KVF_ERR_INVALID_PARAM;
            }
        }
        for (int g = 0; g < lay->num_groups; ++g) {
            int need = (lay->groups[g].kind == KVF_GROUP_MAMBA) ? 1 :
                       (sq->start + sq->num_tokens + ctx->geom->block_size - 1) /
                           ctx->geom->block_size;
            if (sq->group_num_blocks[g] < need) {
                kvf_error("seq %d: cache group %d has %d blocks, needs %d for %d tokens", i, g,
                          sq->group_num_blocks[g], need, sq->start + sq->num_tokens);
                return KVF_ERR_INVALID_PARAM;
            }
            for (int b = 0; b < need; ++b) {
                if ((sq->group_blocks[g][b] < 0) || (sq->group_blocks[g][b] >= nblocks)) {
                    kvf_error("seq %d: block id %d outside the pool [0, %d)", i,
                              sq->group_blocks[g][b], nblocks);
                    return KVF_ERR_INVALID_PARAM;
                }
            }
        }
    }
    return KVF_OK;
}

#define KVF_KCALL(_call)                                  \
    do {                                                  \
        if (status == KVF_OK) {                           \
            int _e = (_call);                             \
            if (_e != KVF_KERN_OK) {                      \
                kvf_error("%s failed: %s", #_call, kvf_kern_strerror(_e)); \
                status = kvf_status_from_kern(_e);          \
            }                                             \
        }                                                 \
    } while (0)

/* out (T x H partial sums) -> all-reduce -> h += out. */
static kvf_status_t kvf_reduce_residual(const kvf_rank_ctx_t *ctx, struct kvf_model_ws *ws,
                                        size_t T, size_t H, kvf_status_t status)
{
    kvf_status_t s2 = kvf_comm_all_reduce(ctx->comm, ws->out, T * H);
    if (status == KVF_OK) {
        status = s2;
    }
    for (size_t i = 0; i < T * H; ++i) {
        ws->h[i] += ws->out[i];
    }
    return status;
}

/*
 * y[M][w->rows] (row stride ldy) = x[M][w->cols] (stride ldx) * W^T + bias.
 * fp32 matrices go straight to the BLAS; bf16/fp16 ones are widened a tile
 * of rows at a time into ws->tile (fp32 compute, narrow storage).
 */
static int kvf_mat_gemm(const kvf_device_t *dev, struct kvf_model_ws *ws, int M, const float *x,
                        int ldx, const kvf_mat_t *w, const float *bias, float *y, int ldy)
{
    const int K = w->cols;
    int tile, e = KVF_KERN_OK;

    if (w->dtype == KVF_DTYPE_FP32) {
        return kvf_gemm_ex(dev, M, w->rows, K, x, ldx, (const float *)w->data, K, bias, 0.0f, y,
                           ldy);
    }
    if (M == 0) {
        return KVF_KERN_OK;
    }
    tile = (int)(ws->cap_tile / (size_t)K);
    if (tile < 1) {
        return KVF_KERN_EINVAL;
    }
    for (int r0 = 0; (e == KVF_KERN_OK) && (r0 < w->rows); r0 += tile) {
        int n = (w->rows - r0 < tile) ? (w->rows - r0) : tile;
        size_t first = (size_t)r0 * (size_t)K, cnt = (size_t)n * (size_t)K;
        if (w->dtype == KVF_DTYPE_BF16) {
            const uint16_t *src = (const uint16_t *)w->data + first;
            for (size_t i = 0; i < cnt; ++i) {
                ws->tile[i] = kvf_bf16_to_fp32(src[i]);
            }
        } else {
            for (size_t i = 0; i < cnt; ++i) {
                ws->tile[i] = kvf_dtype_load(w->data, w->dtype, first + i);
            }
        }
        e = kvf_gemm_ex(dev, M, n, K, x, ldx, ws->tile, K, (bias != NULL) ? bias + r0 : NULL,
                        0.0f, y + r0, ldy);
    }
    return e;
}

/* One row of a matrix as fp32 (embedding lookup). */
static void kvf_mat_row(const kvf_mat_t *w, int row, float *out)
{
    size_t first = (size_t)row * (size_t)w->cols;
    if (w->dtype == KVF_DTYPE_FP32) {
        memcpy(out, (const float *)w->data + first, (size_t)w->cols * sizeof(float));
        return;
    }
    for (int i = 0; i < w->cols; ++i) {
        out[i] = kvf_dtype_load(w->data, w->dtype, first + (size_t)i);
    }
}

static kvf_status_t kvf_fwd_mamba(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                  const kvf_fwd_batch_t *batch, int l, int T,
                                  kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_rank_w_t *rw = &m->ranks[ctx->rank];
    const kvf_shard_t *s = &rw->shard;
    const kvf_layer_w_t *w = &rw->layers[l];
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size, R = w->in_rows;
    const int dim = s->mamba_heads * cfg->mamba_head_dim, cd = s->conv_dim;
    const int N = cfg->ssm_state_size, K = cfg->conv_kernel;
    const int g = ctx->layout->layer_group[l], slot = ctx->layout->layer_slot[l];
    const int full_group = kvf_model_mamba_inner(cfg) / cfg->n_groups;
    const int silu = (cfg->mamba_act == KVF_ACT_SILU);
    /* transformers: the multi-token (chunked) scan clamps dt to [time_step_min, inf);
     * the one-token recurrent update does not clamp */
    const kvf_mamba2_params_t mp_scan = {
        .heads = s->mamba_heads, .head_dim = cfg->mamba_head_dim, .groups = s->groups,
        .state_size = N, .dt_bias = w->dt_bias, .A_log = w->A_log, .D = w->D,
        .dt_min = (float)cfg->time_step_min, .dt_max = INFINITY,
    };
    kvf_mamba2_params_t mp_step = mp_scan;
    int gsz, ngl, o = 0;

    mp_step.dt_min = 0.0f;
    KVF_KCALL(kvf_mat_gemm(dev, ws, T, ws->xn, H, &w->in_proj, w->in_bias, ws->proj, R));
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        const int n = sq->num_tokens, has = (sq->start > 0);
        void *conv_state = kvf_page_pool_conv_state(ctx->pool, sq->group_blocks[g][0], slot);
        void *ssm_state = kvf_page_pool_ssm_state(ctx->pool, ctx->geom, sq->group_blocks[g][0],
                                                  slot);
        const float *xbc_in = ws->proj + (size_t)o * R + dim;
        float *xbc = ws->xbc + (size_t)o * cd;

        if ((n == 1) && has) {
            KVF_KCALL(kvf_conv1d_step(dev, xbc_in, cd, K, w->conv_w, w->conv_b, silu, conv_state,
                                      ctx->geom->conv_dtype, xbc));
            if (!silu) {
                kvf_act_apply(cfg->mamba_act, xbc, (size_t)cd);
            }
            KVF_KCALL(kvf_mamba2_step(dev, &mp_step, xbc, ws->proj + (size_t)o * R + dim + cd,
                                      xbc + dim, xbc + dim + s->groups * N,
                                      ssm_state, ctx->geom->ssm_dtype, ws->ybuf + (size_t)o * R));
        } else {
            KVF_KCALL(kvf_conv1d_chunk(dev, xbc_in, R, n, cd, K, w->conv_w, w->conv_b, silu,
                                       conv_state, ctx->geom->conv_dtype, has, xbc, cd));
            if (!silu) {
                kvf_act_apply(cfg->mamba_act, xbc, (size_t)n * (size_t)cd);
            }
            KVF_KCALL(kvf_mamba2_scan(dev, &mp_scan, n, xbc, cd,
                                      ws->proj + (size_t)o * R + dim + cd, R, xbc + dim,
                                      xbc + dim + s->groups * N, cd, ssm_state,
                                      ctx->geom->ssm_dtype, has, ws->ybuf + (size_t)o * R, R));
        }
        o += n;
    }
    /* gated norm: y (ybuf, ld R) gated by z (proj cols [0, dim), ld R) */
    if (s->group_replication > 1) {
        gsz = dim;                 /* this rank holds a slice of one group */
    } else {
        gsz = full_group;          /* whole groups */
    }
    ngl = dim / gsz;
    KVF_KCALL(kvf_gated_rmsnorm_sumsq(dev, ws->ybuf, ws->proj, R, T, dim, gsz, ws->g, ws->sumsq));
    if (s->group_replication > 1) {
        kvf_status_t s2 = kvf_comm_all_reduce_span(ctx->comm, ws->sumsq, (size_t)T * (size_t)ngl,
                                                   s->group_replication);
        if (status == KVF_OK) {
            status = s2;
        }
    }
    KVF_KCALL(kvf_gated_rmsnorm_apply(dev, ws->g, ws->sumsq, w->gnorm_w, T, dim, gsz, full_group,
                                      (float)cfg->norm_eps, ws->g));
    KVF_KCALL(kvf_mat_gemm(dev, ws, T, ws->g, dim, &w->out_proj, w->out_bias, ws->out, H));
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H, status);
}

/* Rotate head vectors of one token in place (transformers' rotate_half form). */
static void kvf_rope_apply(const float *inv_freq, int pos, float *x, int heads, int hd)
{
    const int half = hd / 2;
    for (int i = 0; i < half; ++i) {
        float f = (float)pos * inv_freq[i];
        float c = cosf(f), sn = sinf(f);
        for (int h = 0; h < heads; ++h) {
            float *v = x + (size_t)h * (size_t)hd;
            float a = v[i], b = v[i + half];
            v[i] = a * c - b * sn;
            v[i + half] = b * c + a * sn;
        }
    }
}

static kvf_status_t kvf_fwd_attention(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                      const kvf_fwd_batch_t *batch, int l, int T,
                                      kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_rank_w_t *rw = &m->ranks[ctx->rank];
    const kvf_shard_t *s = &rw->shard;
    const kvf_layer_w_t *w = &rw->layers[l];
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    const kvf_rank_geometry_t *geo = ctx->geom;
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size, R = w->qkv_rows, hd = cfg->head_dim;
    const int qd = s->attn_heads * hd, kd = s->kv_heads * hd;
    const int g = ctx->layout->layer_group[l], slot = ctx->layout->layer_slot[l];
    int o = 0;

    KVF_KCALL(kvf_mat_gemm(dev, ws, T, ws->xn, H, &w->qkv, w->qkv_bias, ws->proj, R));
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        const int n = sq->num_tokens;
        float *row = ws->proj + (size_t)o * R;
        kvf_paged_kv_t kv;

        for (int t = 0; t < n; ++t) {
            float *q = row + (size_t)t * R, *k = q + qd;
            ws->pos[o + t] = sq->start + t;
            if (cfg->qk_norm) {
                KVF_KCALL(kvf_rmsnorm(dev, q, w->q_norm, q, s->attn_heads, hd, (float)cfg->norm_eps));
                KVF_KCALL(kvf_rmsnorm(dev, k, w->k_norm, k, s->kv_heads, hd, (float)cfg->norm_eps));
            }
            if (m->inv_freq != NULL) {
                kvf_rope_apply(m->inv_freq, sq->start + t, q, s->attn_heads, hd);
                kvf_rope_apply(m->inv_freq, sq->start + t, k, s->kv_heads, hd);
            }
        }
        kvf_page_pool_attn_view(ctx->pool, geo, hd, slot, sq->group_blocks[g],
                                sq->group_num_blocks[g], &kv);
        KVF_KCALL(kvf_attn_cache_write(dev, &kv, row + qd, row + qd + kd, R, ws->pos + o, n));
        KVF_KCALL(kvf_attn_paged(dev, &kv, row, R, ws->pos + o, n, s->attn_heads, 0.0f,
                                 ws->g + (size_t)o * qd));
        o += n;
    }
    KVF_KCALL(kvf_mat_gemm(dev, ws, T, ws->g, qd, &w->o_proj, w->o_bias, ws->out, H));
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H, status);
}

/*
 * An MLP slice over rows of @a x: out (ldo H) = down(act(up x)) or, gated,
 * down(act(gate x) * up x), without the all-reduce. up rows: C (or 2C: gate
 * rows first). Uses ws->proj [M][2C] and ws->g [M][C].
 */
static int kvf_mlp_rows(const kvf_device_t *dev, struct kvf_model_ws *ws, kvf_act_t act,
                        bool gated, int M, const float *x, int H, const kvf_mat_t *up,
                        const float *up_b, const kvf_mat_t *down, const float *down_b, float *out)
{
    const int C = down->cols;
    int e = kvf_mat_gemm(dev, ws, M, x, H, up, up_b, ws->proj, up->rows);

    if (e != KVF_KERN_OK) {
        return e;
    }
    if (gated) {
        for (int t = 0; t < M; ++t) {
            float *gate = ws->proj + (size_t)t * (size_t)(2 * C);
            float *dst = ws->g + (size_t)t * (size_t)C;
            kvf_act_apply(act, gate, (size_t)C);
            for (int i = 0; i < C; ++i) {
                dst[i] = gate[i] * gate[C + i];
            }
        }
        return kvf_mat_gemm(dev, ws, M, ws->g, C, down, down_b, out, H);
    }
    kvf_act_apply(act, ws->proj, (size_t)M * (size_t)C);
    return kvf_mat_gemm(dev, ws, M, ws->proj, C, down, down_b, out, H);
}

static kvf_status_t kvf_fwd_mlp(kvf_model_h m, const kvf_rank_ctx_t *ctx, int l, int T,
                                kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_layer_w_t *w = &m->ranks[ctx->rank].layers[l];
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size;

    KVF_KCALL(kvf_mlp_rows(dev, ws, cfg->mlp_act, cfg->mlp_gated, T, ws->xn, H, &w->up,
                           w->up_bias, &w->down, w->down_bias, ws->out));
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H, status);
}

/*
 * transformers' NemotronH top-k router for T rows of ws->xn: sigmoid scores;
 * choice scores = scores + e_score_correction_bias; the topk_group groups
 * with the largest sum of their two best choice scores stay; the top_k
 * experts by choice score among them are taken, weighted by their (plain)
 * scores, normalised to sum 1 when norm_topk_prob, times
 * routed_scaling_factor. Ties go to the lower index.
 */
static void kvf_moe_route(const kvf_model_config_t *cfg, const kvf_layer_w_t *w,
                          struct kvf_model_ws *ws, int T)
{
    const int E = cfg->moe_num_experts, k = cfg->moe_top_k;
    const int ng = cfg->moe_n_group, per = E / ng;
    float choice[1024], gsum[1024];
    bool gkeep[1024], taken[1024];

    for (int t = 0; t < T; ++t) {
        const float *sc = ws->scores + (size_t)t * (size_t)E;
        int32_t *idx = ws->route_idx + (size_t)t * (size_t)k;
        float *wt = ws->route_w + (size_t)t * (size_t)k;
        double sum = 0.0;

        for (int e = 0; e < E; ++e) {
            choice[e] = sc[e] + w->router_b[e];
            taken[e] = false;
        }
        for (int gi = 0; gi < ng; ++gi) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = gi * per; e < (gi + 1) * per; ++e) {
                if (choice[e] > b1) {
                    b2 = b1;
                    b1 = choice[e];
                } else if (choice[e] > b2) {
                    b2 = choice[e];
                }
            }
            gsum[gi] = b1 + b2;
            gkeep[gi] = false;
        }
        for (int r = 0; r < cfg->moe_topk_group; ++r) {
            int best = -1;
            for (int gi = 0; gi < ng; ++gi) {
                if (!gkeep[gi] && ((best < 0) || (gsum[gi] > gsum[best]))) {
                    best = gi;
                }
            }
            gkeep[best] = true;
        }
        for (int r = 0; r < k; ++r) {
            int best = -1;
            for (int e = 0; e < E; ++e) {
                if (!taken[e] && gkeep[e / per] && ((best < 0) || (choice[e] > choice[best]))) {
                    best = e;
                }
            }
            taken[best] = true;
            idx[r] = best;
            wt[r] = sc[best];
            sum += sc[best];
        }
        for (int r = 0; r < k; ++r) {
            if (cfg->moe_norm_topk_prob) {
                wt[r] = wt[r] / (float)(sum + 1e-20);
            }
            wt[r] = wt[r] * (float)cfg->moe_routed_scaling;
        }
    }
}

static kvf_status_t kvf_fwd_moe(kvf_model_h m, const kvf_rank_ctx_t *ctx, int l, int T,
                                kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_rank_w_t *rw = &m->ranks[ctx->rank];
    const kvf_shard_t *s = &rw->shard;
    const kvf_layer_w_t *w = &rw->layers[l];
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size, E = cfg->moe_num_experts, k = cfg->moe_top_k;

    /* router (fp32, replicated: every rank routes alike) */
    KVF_KCALL(kvf_gemm(dev, T, E, H, ws->xn, w->router_w, NULL, ws->scores));
    for (size_t i = 0; i < (size_t)T * (size_t)E; ++i) {
        ws->scores[i] = 1.0f / (1.0f + expf(-ws->scores[i]));
    }
    if (status == KVF_OK) {
        kvf_moe_route(cfg, w, ws, T);
    }
    /* shared expert slice first: it writes ws->out */
    KVF_KCALL(kvf_mlp_rows(dev, ws, cfg->mlp_act, false, T, ws->xn, H, &w->sh_up, w->sh_up_b,
                           &w->sh_down, w->sh_down_b, ws->out));
    for (int e = 0; (status == KVF_OK) && (e < s->moe_experts); ++e) {
        const int ge = s->moe_expert_start + e;
        int n = 0;
        for (int t = 0; t < T; ++t) {
            for (int r = 0; r < k; ++r) {
                if (ws->route_idx[(size_t)t * (size_t)k + (size_t)r] == ge) {
                    ws->rows[n] = t;
                    ws->rw[n] = ws->route_w[(size_t)t * (size_t)k + (size_t)r];
                    memcpy(ws->xg + (size_t)n * (size_t)H, ws->xn + (size_t)t * (size_t)H,
                           (size_t)H * sizeof(float));
                    ++n;
                }
            }
        }
        if (n == 0) {
            continue;
        }
        KVF_KCALL(kvf_mlp_rows(dev, ws, cfg->mlp_act, false, n, ws->xg, H, &w->exp_up[e], NULL,
                               &w->exp_down[e], NULL, ws->yg));
        for (int j = 0; (status == KVF_OK) && (j < n); ++j) {
            float *dst = ws->out + (size_t)ws->rows[j] * (size_t)H;
            const float *src = ws->yg + (size_t)j * (size_t)H;
            for (int c = 0; c < H; ++c) {
                dst[c] += src[c] * ws->rw[j];
            }
        }
    }
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H, status);
}

kvf_status_t kvf_model_forward_rank(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                    const kvf_fwd_batch_t *batch)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size;
    kvf_status_t status;
    int T = 0, o = 0;
    bool grow;

    for (int i = 0; i < batch->num_seqs; ++i) {
        T += batch->seqs[i].num_tokens;
    }
    if (batch->num_seqs == 0) {
        return KVF_OK;
    }
    status = kvf_batch_check(m, ctx, batch);
    if (status != KVF_OK) {
        return status;   /* identical on every rank: nobody enters a collective */
    }
    /* Every rank sees the same batches, so every rank grows its workspace in the
     * same steps; only then can one rank fail where another succeeds. */
    grow = ((size_t)T > ws->cap_tokens) || ((size_t)batch->num_seqs > ws->cap_seqs) ||
           (ws->cap_tile == 0);
    status = kvf_ws_reserve(ws, m, &m->ranks[ctx->rank], (size_t)T, (size_t)batch->num_seqs);
    if ((ctx->comm->size > 1) && grow) {
        /* agree on "can run" so a rank that cannot allocate does not strand its peers */
        float failed = (status != KVF_OK) ? 1.0f : 0.0f;
        kvf_status_t agreed = kvf_comm_all_reduce(ctx->comm, &failed, 1);
        if (agreed != KVF_OK) {
            return agreed;      /* the world broke (a barrier timed out): logged there */
        }
        if ((failed > 0.0f) && (status == KVF_OK)) {
            status = KVF_ERR_NO_MEMORY;
        }
    }
    if (status != KVF_OK) {
        kvf_error("rank %d: cannot allocate the workspace for %d tokens", ctx->rank, T);
        return status;
    }

    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        for (int t = 0; t < sq->num_tokens; ++t, ++o) {
            kvf_mat_row(&m->embed, sq->tokens[t], ws->h + (size_t)o * H);
        }
    }
    for (int l = 0; l < cfg->num_layers; ++l) {
        KVF_KCALL(kvf_rmsnorm(dev, ws->h, m->norm_w[l], ws->xn, T, H, (float)cfg->norm_eps));
        switch (cfg->layer_kinds[l]) {
        case KVF_LAYER_MAMBA:
            status = kvf_fwd_mamba(m, ctx, batch, l, T, status);
            break;
        case KVF_LAYER_ATTENTION:
            status = kvf_fwd_attention(m, ctx, batch, l, T, status);
            if (cfg->dense_mlp_in_layer) {
                KVF_KCALL(kvf_rmsnorm(dev, ws->h, m->norm2_w[l], ws->xn, T, H,
                                      (float)cfg->norm_eps));
                status = kvf_fwd_mlp(m, ctx, l, T, status);
            }
            break;
        case KVF_LAYER_MOE:
            status = kvf_fwd_moe(m, ctx, l, T, status);
            break;
        default:
            status = kvf_fwd_mlp(m, ctx, l, T, status);
            break;
        }
    }

    if (ctx->rank == 0) {
        int ns = 0;
        o = 0;
        for (int i = 0; i < batch->num_seqs; ++i) {
            o += batch->seqs[i].num_tokens;
            if (batch->seqs[i].logits != NULL) {
                memcpy(ws->last + (size_t)ns * H, ws->h + (size_t)(o - 1) * H,
                       (size_t)H * sizeof(float));
                ++ns;
            }
        }
        KVF_KCALL(kvf_rmsnorm(dev, ws->last, m->norm_f, ws->last, ns, H, (float)cfg->norm_eps));
        KVF_KCALL(kvf_mat_gemm(dev, ws, ns, ws->last, H, &m->lm_head, NULL, ws->logits,
                               cfg->vocab_size));
        ns = 0;
        for (int i = 0; (status == KVF_OK) && (i < batch->num_seqs); ++i) {
            if (batch->seqs[i].logits != NULL) {
                memcpy(batch->seqs[i].logits, ws->logits + (size_t)ns * cfg->vocab_size,
                       (size_t)cfg->vocab_size * sizeof(float));
                ++ns;
            }
        }
    }
    return status;
}
