/*
 * NemotronH forward pass of one TP rank.
 *
 * Design: a step is one flat batch of T tokens (the concatenated chunks of
 * every scheduled request, prefill chunks and single decode tokens alike),
 * so each projection is one GEMM over all T rows; only the cache-touching
 * parts (attention, conv1d, scan) loop over requests, because each request
 * has its own pages. Prefill and decode are the same code path: a decode
 * step is a chunk of one token with start > 0. This keeps "prefill N then
 * decode" and "prefill N+1 in one chunk" on the same kernels, so the two
 * agree to fp32 rounding (tests/model/test_model_consistency.c).
 *
 * Weights are loaded per rank as contiguous shards (rows of column-parallel
 * matrices, columns of row-parallel ones), so the forward never strides
 * over another rank's data. Replicated tensors (embeddings, norms, lm_head)
 * exist once and are shared read-only by every rank thread.
 *
 * Collectives: every rank calls the same sequence of all-reduces for a
 * batch, also after an error, so a failing rank never leaves its peers
 * waiting at a barrier; the first error is returned.
 */
#include "kvf_model.h"
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

typedef struct {
    /* Mamba */
    float *in_proj;      /* [in_rows][H]: z | x | B | C | dt of this rank */
    int    in_rows;
    float *conv_w;       /* [conv_dim][K] */
    float *conv_b;       /* [conv_dim] or NULL */
    float *dt_bias, *A_log, *D;   /* [heads] */
    float *gnorm_w;      /* [heads * head_dim] */
    float *out_proj;     /* [H][heads * head_dim] */
    /* attention */
    float *qkv;          /* [(q_heads + 2 kv_heads) * head_dim][H] */
    int    qkv_rows;
    float *o_proj;       /* [H][q_heads * head_dim] */
    /* MLP */
    float *up;           /* [cols][H] */
    float *down;         /* [H][cols] */
} kvf_layer_w_t;

typedef struct {
    kvf_shard_t    shard;
    kvf_layer_w_t *layers;
    int            max_rows;   /* widest column-parallel output of any layer */
} kvf_rank_w_t;

struct kvf_model {
    kvf_model_config_t cfg;
    int                tp;
    float             *embed;     /* [V][H] */
    float             *norm_f;    /* [H] */
    float             *lm_head;   /* [V][H] */
    float            **norm_w;    /* [L][H] pre-norm of each layer */
    kvf_rank_w_t      *ranks;
};

struct kvf_model_ws {
    size_t cap_tokens, cap_seqs;
    float *h, *xn, *out;        /* [T][H] */
    float *proj, *ybuf;         /* [T][max_rows] */
    float *xbc;                 /* [T][conv_dim] */
    float *g;                   /* [T][max(dim, q_heads*head_dim)] */
    float *sumsq;               /* [T][groups] */
    int32_t *pos;               /* [T] */
    float *last;                /* [S][H] */
    float *logits;              /* [S][V] */
};

/* ---- loading ------------------------------------------------------------- */

typedef struct {
    kvf_st_file_h st;
    char          name[256];
} kvf_loader_t;

static const char *kvf_lname(kvf_loader_t *ld, int layer, const char *suffix)
{
    if (layer < 0) {
        snprintf(ld->name, sizeof(ld->name), "%s", suffix);
    } else {
        snprintf(ld->name, sizeof(ld->name), "backbone.layers.%d.%s", layer, suffix);
    }
    return ld->name;
}

static float *kvf_falloc(size_t n)
{
    return malloc((n ? n : 1) * sizeof(float));
}

/* Whole tensor. */
static kvf_status_t kvf_load_full(kvf_loader_t *ld, const char *name, int ndim,
                                  const int64_t *shape, float **out_p)
{
    size_t n = 1;
    float *buf;
    kvf_status_t status;

    for (int i = 0; i < ndim; ++i) {
        n *= (size_t)shape[i];
    }
    buf = kvf_falloc(n);
    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_st_load_f32(ld->st, name, ndim, shape, buf);
    if (status != KVF_OK) {
        free(buf);
        return status;
    }
    *out_p = buf;
    return KVF_OK;
}

/* Concatenation of row ranges {start, count} of a tensor (column-parallel shards). */
static kvf_status_t kvf_load_rows(kvf_loader_t *ld, const char *name, int ndim,
                                  const int64_t *shape, const int64_t (*ranges)[2], int nr,
                                  float **out_p)
{
    size_t row_len = 1, rows = 0, off = 0;
    float *buf;
    kvf_status_t status;

    for (int i = 1; i < ndim; ++i) {
        row_len *= (size_t)shape[i];
    }
    for (int i = 0; i < nr; ++i) {
        rows += (size_t)ranges[i][1];
    }
    buf = kvf_falloc(rows * row_len);
    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int i = 0; i < nr; ++i) {
        status = kvf_st_load_rows_f32(ld->st, name, ndim, shape, ranges[i][0], ranges[i][1],
                                      buf + off);
        if (status != KVF_OK) {
            free(buf);
            return status;
        }
        off += (size_t)ranges[i][1] * row_len;
    }
    *out_p = buf;
    return KVF_OK;
}

/* Columns [c0, c0 + cols) of a [N][K] tensor (row-parallel shards). */
static kvf_status_t kvf_load_cols(kvf_loader_t *ld, const char *name, int64_t N, int64_t K,
                                  int64_t c0, int64_t cols, float **out_p)
{
    const int64_t shape[2] = {N, K};
    float *full = NULL, *buf;
    kvf_status_t status = kvf_load_full(ld, name, 2, shape, &full);

    if (status != KVF_OK) {
        return status;
    }
    buf = kvf_falloc((size_t)(N * cols));
    if (buf == NULL) {
        free(full);
        return KVF_ERR_NO_MEMORY;
    }
    for (int64_t r = 0; r < N; ++r) {
        memcpy(buf + r * cols, full + r * K + c0, (size_t)cols * sizeof(float));
    }
    free(full);
    *out_p = buf;
    return KVF_OK;
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
        const int64_t shape[2] = {inner + conv_dim + nh, H};
        const int64_t r[5][2] = {
            {x0, xn},                                   /* z */
            {inner + x0, xn},                           /* x */
            {2 * inner + b0, bn},                       /* B */
            {2 * inner + G * N + b0, bn},               /* C */
            {2 * inner + 2 * G * N + s->mamba_head_start, s->mamba_heads},   /* dt */
        };
        KVF_LOAD(kvf_load_rows(ld, kvf_lname(ld, l, "mixer.in_proj.weight"), 2, shape, r, 5,
                               &w->in_proj));
        w->in_rows = (int)(2 * xn + 2 * bn + s->mamba_heads);
    }
    {
        const int64_t r[3][2] = {{x0, xn}, {inner + b0, bn}, {inner + G * N + b0, bn}};
        const int64_t wshape[3] = {conv_dim, 1, K};
        const int64_t bshape[1] = {conv_dim};
        KVF_LOAD(kvf_load_rows(ld, kvf_lname(ld, l, "mixer.conv1d.weight"), 3, wshape, r, 3,
                               &w->conv_w));
        if (cfg->use_conv_bias) {
            KVF_LOAD(kvf_load_rows(ld, kvf_lname(ld, l, "mixer.conv1d.bias"), 1, bshape, r, 3,
                                   &w->conv_b));
        }
    }
    {
        const int64_t hshape[1] = {nh};
        const int64_t hr[1][2] = {{s->mamba_head_start, s->mamba_heads}};
        const int64_t ishape[1] = {inner};
        const int64_t ir[1][2] = {{x0, xn}};
        KVF_LOAD(kvf_load_rows(ld, kvf_lname(ld, l, "mixer.dt_bias"), 1, hshape, hr, 1, &w->dt_bias));
        KVF_LOAD(kvf_load_rows(ld, kvf_lname(ld, l, "mixer.A_log"), 1, hshape, hr, 1, &w->A_log));
        KVF_LOAD(kvf_load_rows(ld, kvf_lname(ld, l, "mixer.D"), 1, hshape, hr, 1, &w->D));
        KVF_LOAD(kvf_load_rows(ld, kvf_lname(ld, l, "mixer.norm.weight"), 1, ishape, ir, 1,
                               &w->gnorm_w));
    }
    KVF_LOAD(kvf_load_cols(ld, kvf_lname(ld, l, "mixer.out_proj.weight"), H, inner, x0, xn,
                           &w->out_proj));
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
    float *parts[3] = {NULL, NULL, NULL};
    kvf_status_t status;

    {
        const int64_t qshape[2] = {q, H}, kshape[2] = {kv, H};
        const int64_t qr[1][2] = {{q0, qn}}, kr[1][2] = {{k0, kn}};
        status = kvf_load_rows(ld, kvf_lname(ld, l, "mixer.q_proj.weight"), 2, qshape, qr, 1, &parts[0]);
        if (status == KVF_OK) {
            status = kvf_load_rows(ld, kvf_lname(ld, l, "mixer.k_proj.weight"), 2, kshape, kr, 1,
                                   &parts[1]);
        }
        if (status == KVF_OK) {
            status = kvf_load_rows(ld, kvf_lname(ld, l, "mixer.v_proj.weight"), 2, kshape, kr, 1,
                                   &parts[2]);
        }
    }
    if (status == KVF_OK) {
        w->qkv_rows = (int)(qn + 2 * kn);
        w->qkv = kvf_falloc((size_t)(w->qkv_rows * H));
        if (w->qkv == NULL) {
            status = KVF_ERR_NO_MEMORY;
        } else {
            memcpy(w->qkv, parts[0], (size_t)(qn * H) * sizeof(float));
            memcpy(w->qkv + qn * H, parts[1], (size_t)(kn * H) * sizeof(float));
            memcpy(w->qkv + (qn + kn) * H, parts[2], (size_t)(kn * H) * sizeof(float));
        }
    }
    for (int i = 0; i < 3; ++i) {
        free(parts[i]);
    }
    if (status != KVF_OK) {
        return status;
    }
    KVF_LOAD(kvf_load_cols(ld, kvf_lname(ld, l, "mixer.o_proj.weight"), H, q, q0, qn, &w->o_proj));
    return KVF_OK;
}

static kvf_status_t kvf_load_mlp(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                 const kvf_shard_t *s, int l, kvf_layer_w_t *w)
{
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t shape[2] = {I, H};
    const int64_t r[1][2] = {{s->mlp_col_start, s->mlp_cols}};
    kvf_status_t status;

    KVF_LOAD(kvf_load_rows(ld, kvf_lname(ld, l, "mixer.up_proj.weight"), 2, shape, r, 1, &w->up));
    KVF_LOAD(kvf_load_cols(ld, kvf_lname(ld, l, "mixer.down_proj.weight"), H, I, s->mlp_col_start,
                           s->mlp_cols, &w->down));
    return KVF_OK;
}

static void kvf_layer_w_free(kvf_layer_w_t *w)
{
    free(w->in_proj);
    free(w->conv_w);
    free(w->conv_b);
    free(w->dt_bias);
    free(w->A_log);
    free(w->D);
    free(w->gnorm_w);
    free(w->out_proj);
    free(w->qkv);
    free(w->o_proj);
    free(w->up);
    free(w->down);
}

void kvf_model_destroy(kvf_model_h model)
{
    if (model == NULL) {
        return;
    }
    for (int r = 0; (model->ranks != NULL) && (r < model->tp); ++r) {
        for (int l = 0; (model->ranks[r].layers != NULL) && (l < model->cfg.num_layers); ++l) {
            kvf_layer_w_free(&model->ranks[r].layers[l]);
        }
        free(model->ranks[r].layers);
    }
    for (int l = 0; (model->norm_w != NULL) && (l < model->cfg.num_layers); ++l) {
        free(model->norm_w[l]);
    }
    free(model->norm_w);
    free(model->ranks);
    free(model->embed);
    free(model->norm_f);
    free(model->lm_head);
    free(model);
}

kvf_status_t kvf_model_load(const char *dir, int tp_size, kvf_model_h *model_p)
{
    kvf_loader_t ld = {0};
    kvf_model_h m = calloc(1, sizeof(*m));
    char path[4096];
    kvf_status_t status;

    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_model_config_load(dir, &m->cfg);
    if (status != KVF_OK) {
        goto err;
    }
    if ((m->cfg.arch != KVF_ARCH_NEMOTRON_H) || (strchr(m->cfg.layer_kinds, KVF_LAYER_MOE) != NULL)) {
        kvf_error("%s: the model runner supports nemotron_h without MoE layers (model_type '%s')",
                  dir, m->cfg.model_type);
        status = KVF_ERR_UNSUPPORTED;
        goto err;
    }
    status = kvf_shard_check(&m->cfg, tp_size);
    if (status != KVF_OK) {
        goto err;
    }
    m->tp = tp_size;
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    status = kvf_st_open(path, &ld.st);
    if (status != KVF_OK) {
        goto err;
    }

    {
        const kvf_model_config_t *cfg = &m->cfg;
        const int64_t vh[2] = {cfg->vocab_size, cfg->hidden_size};
        const int64_t hshape[1] = {cfg->hidden_size};

        status = kvf_load_full(&ld, "backbone.embeddings.weight", 2, vh, &m->embed);
        if (status == KVF_OK) {
            status = kvf_load_full(&ld, "backbone.norm_f.weight", 1, hshape, &m->norm_f);
        }
        if (status == KVF_OK) {
            status = kvf_load_full(&ld, cfg->tie_word_embeddings ? "backbone.embeddings.weight" :
                                   "lm_head.weight", 2, vh, &m->lm_head);
        }
        m->norm_w = calloc((size_t)cfg->num_layers, sizeof(*m->norm_w));
        m->ranks = calloc((size_t)tp_size, sizeof(*m->ranks));
        if ((status == KVF_OK) && ((m->norm_w == NULL) || (m->ranks == NULL))) {
            status = KVF_ERR_NO_MEMORY;
        }
        for (int l = 0; (status == KVF_OK) && (l < cfg->num_layers); ++l) {
            status = kvf_load_full(&ld, kvf_lname(&ld, l, "norm.weight"), 1, hshape, &m->norm_w[l]);
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
                int rows = 0;
                switch (cfg->layer_kinds[l]) {
                case KVF_LAYER_MAMBA:
                    status = kvf_load_mamba(&ld, cfg, &rw->shard, l, w);
                    rows = w->in_rows;
                    break;
                case KVF_LAYER_ATTENTION:
                    status = kvf_load_attention(&ld, cfg, &rw->shard, l, w);
                    rows = w->qkv_rows;
                    break;
                case KVF_LAYER_MLP:
                    status = kvf_load_mlp(&ld, cfg, &rw->shard, l, w);
                    rows = rw->shard.mlp_cols;
                    break;
                default:
                    status = KVF_ERR_UNSUPPORTED;
                    break;
                }
                if (rows > rw->max_rows) {
                    rw->max_rows = rows;
                }
            }
        }
    }
    kvf_st_close(ld.st);
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
    free(ws->h);
    free(ws->xn);
    free(ws->out);
    free(ws->proj);
    free(ws->ybuf);
    free(ws->xbc);
    free(ws->g);
    free(ws->sumsq);
    free(ws->pos);
    free(ws->last);
    free(ws->logits);
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

static kvf_status_t kvf_ws_reserve(struct kvf_model_ws *ws, const kvf_model_config_t *cfg,
                                   const kvf_rank_w_t *rw, size_t T, size_t S)
{
    const kvf_shard_t *s = &rw->shard;
    size_t H = (size_t)cfg->hidden_size;
    size_t wide = (size_t)rw->max_rows;
    size_t gdim = (size_t)s->attn_heads * (size_t)cfg->head_dim;
    size_t mdim = (size_t)s->mamba_heads * (size_t)cfg->mamba_head_dim;
    size_t groups = (s->groups > 0) ? (size_t)s->groups : 1;
    int bad = 0;

    if (mdim > gdim) {
        gdim = mdim;
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
    const kvf_mamba2_params_t mp = {
        .heads = s->mamba_heads, .head_dim = cfg->mamba_head_dim, .groups = s->groups,
        .state_size = N, .dt_bias = w->dt_bias, .A_log = w->A_log, .D = w->D,
        .dt_min = 0.0f, .dt_max = INFINITY,
    };
    int gsz, ngl, o = 0;

    KVF_KCALL(kvf_gemm(dev, T, R, H, ws->xn, w->in_proj, NULL, ws->proj));
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        const int n = sq->num_tokens, has = (sq->start > 0);
        void *conv_state = kvf_page_pool_conv_state(ctx->pool, sq->group_blocks[g][0], slot);
        void *ssm_state = kvf_page_pool_ssm_state(ctx->pool, ctx->geom, sq->group_blocks[g][0],
                                                  slot);
        const float *xbc_in = ws->proj + (size_t)o * R + dim;
        float *xbc = ws->xbc + (size_t)o * cd;

        if ((n == 1) && has) {
            KVF_KCALL(kvf_conv1d_step(dev, xbc_in, cd, K, w->conv_w, w->conv_b, 1, conv_state,
                                      ctx->geom->conv_dtype, xbc));
            KVF_KCALL(kvf_mamba2_step(dev, &mp, xbc, ws->proj + (size_t)o * R + dim + cd,
                                      xbc + dim, xbc + dim + s->groups * N,
                                      ssm_state, ctx->geom->ssm_dtype, ws->ybuf + (size_t)o * R));
        } else {
            KVF_KCALL(kvf_conv1d_chunk(dev, xbc_in, R, n, cd, K, w->conv_w, w->conv_b, 1,
                                       conv_state, ctx->geom->conv_dtype, has, xbc, cd));
            KVF_KCALL(kvf_mamba2_scan(dev, &mp, n, xbc, cd, ws->proj + (size_t)o * R + dim + cd,
                                      R, xbc + dim, xbc + dim + s->groups * N, cd,
                                      ssm_state, ctx->geom->ssm_dtype, has,
                                      ws->ybuf + (size_t)o * R, R));
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
    KVF_KCALL(kvf_gemm(dev, T, H, dim, ws->g, w->out_proj, NULL, ws->out));
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H, status);
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

    KVF_KCALL(kvf_gemm(dev, T, R, H, ws->xn, w->qkv, NULL, ws->proj));
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        const int n = sq->num_tokens;
        const float *row = ws->proj + (size_t)o * R;
        kvf_paged_kv_t kv;

        kvf_page_pool_attn_view(ctx->pool, geo, hd, slot, sq->group_blocks[g],
                                sq->group_num_blocks[g], &kv);
        for (int t = 0; t < n; ++t) {
            ws->pos[o + t] = sq->start + t;
        }
        KVF_KCALL(kvf_attn_cache_write(dev, &kv, row + qd, row + qd + kd, R, ws->pos + o, n));
        KVF_KCALL(kvf_attn_paged(dev, &kv, row, R, ws->pos + o, n, s->attn_heads, 0.0f,
                                 ws->g + (size_t)o * qd));
        o += n;
    }
    KVF_KCALL(kvf_gemm(dev, T, H, qd, ws->g, w->o_proj, NULL, ws->out));
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H, status);
}

static kvf_status_t kvf_fwd_mlp(kvf_model_h m, const kvf_rank_ctx_t *ctx, int l, int T,
                                kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_rank_w_t *rw = &m->ranks[ctx->rank];
    const kvf_layer_w_t *w = &rw->layers[l];
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size, C = rw->shard.mlp_cols;

    KVF_KCALL(kvf_gemm(dev, T, C, H, ws->xn, w->up, NULL, ws->proj));
    for (size_t i = 0; i < (size_t)T * (size_t)C; ++i) {
        float v = ws->proj[i] > 0.0f ? ws->proj[i] : 0.0f;   /* relu2 */
        ws->proj[i] = v * v;
    }
    KVF_KCALL(kvf_gemm(dev, T, H, C, ws->proj, w->down, NULL, ws->out));
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
    grow = ((size_t)T > ws->cap_tokens) || ((size_t)batch->num_seqs > ws->cap_seqs);
    status = kvf_ws_reserve(ws, cfg, &m->ranks[ctx->rank], (size_t)T, (size_t)batch->num_seqs);
    if ((ctx->comm->size > 1) && grow) {
        /* agree on "can run" so a rank that cannot allocate does not strand its peers */
        float failed = (status != KVF_OK) ? 1.0f : 0.0f;
        (void)kvf_comm_all_reduce(ctx->comm, &failed, 1);
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
            memcpy(ws->h + (size_t)o * H, m->embed + (size_t)sq->tokens[t] * H,
                   (size_t)H * sizeof(float));
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
        KVF_KCALL(kvf_gemm(dev, ns, cfg->vocab_size, H, ws->last, m->lm_head, NULL, ws->logits));
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
