/*
 * The forward pass of one TP rank over one flat batch, and the workspace it
 * runs in (kvf_model.c's opening comment describes the design).
 */
#include "kvf_model_int.h"
#include "kvf_fwd_profile.h"

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
    kvf_fwd_graphs_destroy(ws);   /* before the buffers its recordings point into */
    kvf_fwd_fi_destroy(ws);
    if (ws->dev_ws) {
        kvf_device_workspace_release(&ws->dev);   /* waits for the stream, then frees */
    }
    void *dptrs[] = {
        ws->h, ws->xn, ws->out, ws->proj, ws->ybuf, ws->xbc, ws->g, ws->sumsq, ws->xg, ws->yg,
        ws->scores, ws->route_idx, ws->last, ws->logits, ws->xs, ws->d_tok,
    };
    void *hptrs[] = {
        ws->pos, ws->rows, ws->rw, ws->tile, ws->ids, ws->last_rows, ws->h_route_idx,
        ws->h_tok, ws->seq_n, ws->seq_nb, (void *)ws->seq_tab, ws->dec_rows,
        ws->dec_conv, ws->dec_ssm, ws->dec_dtmin, ws->dec_dtmax,
    };
    for (size_t i = 0; i < sizeof(dptrs) / sizeof(dptrs[0]); ++i) {
        if (kvf_ws_on_device(ws)) {
            kvf_device_free(&ws->dev, dptrs[i]);
        } else {
            free(dptrs[i]);
        }
    }
    for (size_t i = 0; i < sizeof(hptrs) / sizeof(hptrs[0]); ++i) {
        free(hptrs[i]);
    }
    kvf_sample_ws_destroy(ws->sample_ws);
    free(ws->srow);
    free(ws->sres);
    free(ws);
}

/* A host buffer grown to @a bytes (contents kept). 0, or -1 with *p unchanged. */
static int kvf_grow(void **p, size_t bytes)
{
    void *n = realloc(*p, bytes ? bytes : 1);
    if (n == NULL) {
        return -1;
    }
    *p = n;
    return 0;
}

/* A (dev) buffer grown to @a bytes: realloc on the CPU; on a device a fresh
 * allocation (scratch: contents not kept). 0, or -1 with *p unchanged. */
static int kvf_grow_dev(struct kvf_model_ws *ws, void **p, size_t bytes)
{
    void *n = NULL;

    if (!kvf_ws_on_device(ws)) {
        return kvf_grow(p, bytes);
    }
    if (kvf_device_alloc(&ws->dev, bytes ? bytes : 1, &n) != KVF_KERN_OK) {
        return -1;
    }
    kvf_device_free(&ws->dev, *p);
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
                                   const kvf_rank_w_t *rw, const kvf_device_t *dev, size_t T,
                                   size_t S)
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

    if (!ws->dev_set) {
        ws->dev = (dev != NULL) ? *dev : kvf_device_cpu();
        ws->dev_set = true;
    }
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
        bad |= kvf_grow_dev(ws, (void **)&ws->h, T * H * sizeof(float));
        bad |= kvf_grow_dev(ws, (void **)&ws->xn, T * H * sizeof(float));
        bad |= kvf_grow_dev(ws, (void **)&ws->out, T * H * sizeof(float));
        bad |= kvf_grow_dev(ws, (void **)&ws->proj, T * wide * sizeof(float));
        bad |= kvf_grow_dev(ws, (void **)&ws->ybuf, T * wide * sizeof(float));
        bad |= kvf_grow_dev(ws, (void **)&ws->xbc,
                            T * (size_t)(s->conv_dim ? s->conv_dim : 1) * sizeof(float));
        bad |= kvf_grow_dev(ws, (void **)&ws->g, T * gdim * sizeof(float));
        bad |= kvf_grow_dev(ws, (void **)&ws->sumsq, T * groups * sizeof(float));
        bad |= kvf_grow((void **)&ws->pos, T * sizeof(int32_t));
        bad |= kvf_grow_dev(ws, (void **)&ws->xg, T * H * sizeof(float));
        bad |= kvf_grow_dev(ws, (void **)&ws->yg, T * H * sizeof(float));
        bad |= kvf_grow_dev(ws, (void **)&ws->scores, T * E * sizeof(float));
        /* the router's choice: ids then weights in one buffer (one copy to the host) */
        bad |= kvf_grow_dev(ws, (void **)&ws->route_idx, 2 * T * k * sizeof(int32_t));
        bad |= kvf_grow((void **)&ws->rows, T * sizeof(int32_t));
        bad |= kvf_grow((void **)&ws->rw, T * sizeof(float));
        bad |= kvf_grow((void **)&ws->ids, T * sizeof(int32_t));
        bad |= kvf_grow((void **)&ws->h_route_idx, 2 * T * k * sizeof(int32_t));
        if (kvf_ws_on_device(ws)) {
            /* the widest K of any GEMM: H, an inner width (g) or a column-parallel output
             * (a non-gated MLP's down reads proj) */
            size_t K = (H > gdim) ? H : gdim;
            K = (K > wide) ? K : wide;
            bad |= kvf_grow_dev(ws, &ws->xs, T * K * sizeof(uint16_t));
        }
        if (bad) {
            /* realloc keeps what it could not grow: the old capacity stays valid, so
             * every rank keeps the same capacity history (see the forward) */
            return KVF_ERR_NO_MEMORY;
        }
        ws->cap_tokens = T;
        ws->gen++;   /* (dev) buffers moved: recorded graphs point at the old ones */
    }
    if (S > ws->cap_seqs) {
        bad |= kvf_grow_dev(ws, (void **)&ws->last, S * H * sizeof(float));
        bad |= kvf_grow_dev(ws, (void **)&ws->logits,
                            S * (size_t)cfg->vocab_size * sizeof(float));
        bad |= kvf_grow((void **)&ws->last_rows, S * sizeof(int32_t));
        bad |= kvf_grow_dev(ws, (void **)&ws->d_tok, S * sizeof(int32_t));
        bad |= kvf_grow((void **)&ws->h_tok, S * sizeof(int32_t));
        bad |= kvf_grow((void **)&ws->seq_n, S * sizeof(int));
        bad |= kvf_grow((void **)&ws->seq_nb, S * sizeof(int));
        bad |= kvf_grow((void **)&ws->seq_tab, S * sizeof(*ws->seq_tab));
        bad |= kvf_grow((void **)&ws->dec_rows, S * sizeof(int));
        bad |= kvf_grow((void **)&ws->dec_conv, S * sizeof(void *));
        bad |= kvf_grow((void **)&ws->dec_ssm, S * sizeof(void *));
        bad |= kvf_grow((void **)&ws->dec_dtmin, S * sizeof(float));
        bad |= kvf_grow((void **)&ws->dec_dtmax, S * sizeof(float));
        if (bad) {
            return KVF_ERR_NO_MEMORY;
        }
        ws->cap_seqs = S;
        ws->gen++;
    }
    return KVF_OK;
}

kvf_status_t kvf_model_ws_prepare(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                  const kvf_step_limits_t *lim)
{
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    struct kvf_model_ws *ws = ctx->ws;
    size_t dbytes = 0, sbytes = 0;
    kvf_status_t status;
    int e;

    if (dev->kind == KVF_DEVICE_CPU) {
        return KVF_OK;
    }
    e = kvf_device_bind(dev);
    status = (e == KVF_KERN_OK) ?
             kvf_ws_reserve(ws, m, &m->ranks[ctx->rank], dev, (size_t)lim->max_tokens,
                            (size_t)lim->max_seqs) : kvf_status_from_kern(e);
    if (status != KVF_OK) {
        kvf_error("rank %d: the workspace for %d tokens and %d requests per step cannot be "
                  "allocated on %s:%d: %s", ctx->rank, lim->max_tokens, lim->max_seqs,
                  kvf_device_kind_name(dev->kind), dev->ordinal, kvf_status_str(status));
        return status;
    }
    if (ctx->rank == 0) {
        /* the head's device sampler: a row per request, penalty entries for 64 tokens of
         * history each to start with (they double when a step needs more) */
        const int pen = lim->max_seqs * 64, V = m->cfg.vocab_size;
        e = kvf_sample_ws_reserve(dev, &ws->sample_ws, lim->max_seqs, V, pen);
        if (e != KVF_KERN_OK) {
            kvf_error("rank 0: the device sampler's buffers for %d requests of %d logits "
                      "(%zu bytes) cannot be allocated on %s:%d: %s", lim->max_seqs, V,
                      kvf_sample_ws_device_bytes(lim->max_seqs, V, pen),
                      kvf_device_kind_name(dev->kind), dev->ordinal, kvf_kern_strerror(e));
            return kvf_status_from_kern(e);
        }
    }
    kvf_model_ws_device_bytes(m, ctx->rank, lim, &dbytes, &sbytes);
    e = ws->dev_ws ? KVF_KERN_OK : kvf_device_workspace_reserve(&ws->dev, dbytes, sbytes);
    if (e != KVF_KERN_OK) {
        kvf_error("rank %d: the kernel workspace (%zu bytes of device scratch, %zu of pinned "
                  "staging) cannot be reserved on %s:%d: %s", ctx->rank, dbytes, sbytes,
                  kvf_device_kind_name(dev->kind), dev->ordinal, kvf_kern_strerror(e));
        return kvf_status_from_kern(e);
    }
    ws->dev_ws = true;
    status = kvf_fwd_fi_prepare(m, ctx, lim);
    return (status == KVF_OK) ? kvf_fwd_graphs_prepare(m, ctx, lim) : status;
}

/* ---- forward -------------------------------------------------------------- */

/* Where the forward launches: the rank's pool device, or a graph's capture stream. */
const kvf_device_t *kvf_fwd_dev(const kvf_rank_ctx_t *ctx)
{
    return (ctx->ws->run_dev != NULL) ? ctx->ws->run_dev : kvf_page_pool_device(ctx->pool);
}

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

/* out (T x H partial sums) -> all-reduce, then times the residual multiplier @a rm
 * (granitemoehybrid; 1 elsewhere: nothing). The residual add h += out is the caller's, fused
 * with the next layer's norm (kvf_fwd_norm: one launch on a device instead of two). */
kvf_status_t kvf_reduce_residual(const kvf_rank_ctx_t *ctx, struct kvf_model_ws *ws, size_t T,
                                 size_t H, float rm, kvf_status_t status)
{
    bool prof = kvf_fwd_profile_active();
    double t0 = prof ? kvf_fwd_profile_begin() : 0.0;
    kvf_status_t s2 = kvf_comm_all_reduce(ctx->comm, ws->out, T * H);
    if (prof) {
        kvf_fwd_profile_end(__func__, __LINE__, "kvf_comm_all_reduce(ctx->comm, ws->out, T * H)",
                            t0);
    }
    status = (status == KVF_OK) ? s2 : status;
    if (rm != 1.0f) {   /* after the sum, as transformers scales the layer's output */
        KVF_KCALL(kvf_scale(kvf_fwd_dev(ctx), ws->out, T * H, rm));
    }
    return status;
}

/* The norm in front of a layer: with @a pending, first the residual add of the previous
 * layer's output ws->out into ws->h, fused (kvf_add_rmsnorm: the same bits as the add and
 * the norm apart); xn = rmsnorm(h) * w. */
static kvf_status_t kvf_fwd_norm(const kvf_device_t *dev, struct kvf_model_ws *ws, bool pending,
                                 const float *w, int T, int H, float eps, kvf_status_t status)
{
    if (pending) {
        KVF_KCALL(kvf_add_rmsnorm(dev, ws->h, ws->out, w, ws->xn, T, H, eps));
    } else {
        KVF_KCALL(kvf_rmsnorm(dev, ws->h, w, ws->xn, T, H, eps));
    }
    return status;
}

/*
 * y[M][w->rows] (row stride ldy) = x[M][w->cols] (stride ldx) * W^T + bias.
 * fp32 matrices and bf16 ones (widened in the kernel's registers, CPU and
 * GPU alike) go straight to the GEMM; 16-bit ones marked tensor_cores
 * (a GPU by default, KVF_GPU_WEIGHTS=native) to kvf_gemm_narrow (cuBLASLt,
 * one pinned algorithm per weight shape: kernels/kvf_gemm_plan.h); fp16 ones on the
 * CPU are widened a tile of rows at a time into ws->tile (fp32 compute,
 * narrow storage). The GEMM's per-element order is fixed (kvf_gemm.h), so
 * tiling never changes a bit.
 */
int kvf_mat_gemm(const kvf_device_t *dev, struct kvf_model_ws *ws, int M, const float *x, int ldx,
                 const kvf_mat_t *w, const float *bias, float *y, int ldy)
{
    const int K = w->cols;
    int tile, e = KVF_KERN_OK;

    if (kvf_mat_direct(w)) {
        return kvf_gemm_w(dev, M, w->rows, K, x, ldx, w->data, w->dtype, K, bias, y, ldy);
    }
    if (M == 0) {
        return KVF_KERN_OK;
    }
    if ((dev != NULL) && (dev->kind != KVF_DEVICE_CPU)) {
        /* 16-bit weights kept on the GPU (KVF_GPU_WEIGHTS=native, the default): tensor cores */
        return kvf_gemm_narrow(dev, M, w->rows, K, x, ldx, w->data, w->dtype, K, bias, y, ldy,
                               ws->xs);
    }
    tile = (int)(ws->cap_tile / (size_t)K);
    if (tile < 1) {
        return KVF_KERN_EINVAL;
    }
    for (int r0 = 0; (e == KVF_KERN_OK) && (r0 < w->rows); r0 += tile) {
        int n = (w->rows - r0 < tile) ? (w->rows - r0) : tile;
        size_t first = (size_t)r0 * (size_t)K, cnt = (size_t)n * (size_t)K;
        for (size_t i = 0; i < cnt; ++i) {
            ws->tile[i] = kvf_dtype_load(w->data, w->dtype, first + i);
        }
        e = kvf_gemm_ex(dev, M, n, K, x, ldx, ws->tile, K, (bias != NULL) ? bias + r0 : NULL,
                        0.0f, y + r0, ldy);
    }
    return e;
}

/* The parameters of that step: the scan's for a prompt token, the step's for an output. */
static const kvf_mamba2_params_t *kvf_step_params(const kvf_fwd_seq_t *sq,
                                                  const kvf_mamba2_params_t *scan,
                                                  const kvf_mamba2_params_t *step)
{
    return kvf_fwd_step_is_prompt(sq) ? scan : step;
}

float kvf_fwd_step_dt_min(const kvf_model_config_t *cfg, const kvf_fwd_seq_t *sq)
{
    return kvf_fwd_step_is_prompt(sq) ? (float)cfg->dt_limit_low : 0.0f;
}

float kvf_fwd_step_dt_max(const kvf_model_config_t *cfg, const kvf_fwd_seq_t *sq)
{
    return kvf_fwd_step_is_prompt(sq) ? (float)cfg->dt_limit_high : INFINITY;
}

static kvf_status_t kvf_fwd_mamba(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                  const kvf_fwd_batch_t *batch, int l, int T,
                                  kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_rank_w_t *rw = &m->ranks[ctx->rank];
    const kvf_shard_t *s = &rw->shard;
    const kvf_layer_w_t *w = &rw->layers[l];
    const kvf_device_t *dev = kvf_fwd_dev(ctx);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size, R = w->in_rows;
    const int dim = s->mamba_heads * cfg->mamba_head_dim, cd = s->conv_dim;
    const int N = cfg->ssm_state_size, K = cfg->conv_kernel;
    const int g = ctx->layout->layer_group[l], slot = ctx->layout->layer_slot[l];
    const int full_group = kvf_model_mamba_inner(cfg) / cfg->n_groups;
    const int silu = (cfg->mamba_act == KVF_ACT_SILU);
    /* transformers 5.25: the multi-token (chunked) scan clamps dt to time_step_limit
     * [low, high]; the one-token recurrent update does not clamp */
    const kvf_mamba2_params_t mp_scan = {
        .heads = s->mamba_heads, .head_dim = cfg->mamba_head_dim, .groups = s->groups,
        .state_size = N, .dt_bias = w->dt_bias, .A_log = w->A_log, .D = w->D,
        .dt_min = (float)cfg->dt_limit_low, .dt_max = (float)cfg->dt_limit_high,
    };
    kvf_mamba2_params_t mp_step = mp_scan;
    int gsz, ngl, o = 0, nd = 0;

    mp_step.dt_min = 0.0f;
    mp_step.dt_max = INFINITY;
    KVF_KCALL(kvf_mat_gemm(dev, ws, T, ws->xn, H, &w->in_proj, w->in_bias, ws->proj, R));
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        const int n = sq->num_tokens, has = (sq->start > 0);
        void *conv_state = kvf_page_pool_conv_state(ctx->pool, sq->group_blocks[g][0], slot);
        void *ssm_state = kvf_page_pool_ssm_state(ctx->pool, ctx->geom, sq->group_blocks[g][0],
                                                  slot);
        const float *xbc_in = ws->proj + (size_t)o * R + dim;
        float *xbc = ws->xbc + (size_t)o * cd;
        /* tokens [0, np) are prompt tokens (dt clamped), [np, n) outputs */
        const int pl = sq->prompt_len - sq->start;
        const int np = (sq->prompt_len > 0) ? ((pl < 0) ? 0 : (pl > n) ? n : pl) :
                       (sq->prompt ? n : 0);

        /* chunked: a lone prompt token on a state is a chunk too (the recompute's bits) */
        const bool lone = (n == 1) && has && ((m->scan_grid == 0) || (np == 0));

        if (lone && silu) {
            /* one token on a state: the recurrent update, with the scan's dt clamp when
             * it is the last token of a prompt (k * chunk + 1 tokens), as transformers'
             * prompt forward computes it; every such seq in one call after the loop */
            ws->dec_rows[nd] = o;
            ws->dec_conv[nd] = conv_state;
            ws->dec_ssm[nd] = ssm_state;
            ws->dec_dtmin[nd] = kvf_step_params(sq, &mp_scan, &mp_step)->dt_min;
            ws->dec_dtmax[nd] = kvf_step_params(sq, &mp_scan, &mp_step)->dt_max;
            ++nd;
        } else if (lone) {
            KVF_KCALL(kvf_conv1d_step(dev, xbc_in, cd, K, w->conv_w, w->conv_b, silu, conv_state,
                                      ctx->geom->conv_dtype, xbc));
            if (!silu) {
                KVF_KCALL(kvf_act(dev, (int)cfg->mamba_act, xbc, (size_t)cd));
            }
            KVF_KCALL(kvf_mamba2_step(dev, kvf_step_params(sq, &mp_scan, &mp_step), xbc,
                                      ws->proj + (size_t)o * R + dim + cd,
                                      xbc + dim, xbc + dim + s->groups * N,
                                      ssm_state, ctx->geom->ssm_dtype, ws->ybuf + (size_t)o * R));
        } else {
            KVF_KCALL(kvf_conv1d_chunk(dev, xbc_in, R, n, cd, K, w->conv_w, w->conv_b, silu,
                                       conv_state, ctx->geom->conv_dtype, has, xbc, cd));
            if (!silu) {
                KVF_KCALL(kvf_act(dev, (int)cfg->mamba_act, xbc, (size_t)n * (size_t)cd));
            }
            status = kvf_fwd_scan_seq(m, ctx, dev, &mp_scan, &mp_step, sq, np, o, R,
                                      ssm_state, status);
        }
        o += n;
    }
    if (nd > 0) {
        const kvf_ssm_seqs_t dec = {
            .num_seqs = nd, .rows = ws->dec_rows, .conv_states = ws->dec_conv,
            .ssm_states = ws->dec_ssm, .dt_min = ws->dec_dtmin, .dt_max = ws->dec_dtmax,
            .packed = (ws->in != NULL) ? ws->in->mamba[l] : NULL,   /* a graphed step's */
        };
        KVF_KCALL(kvf_ssm_decode_seqs(dev, &dec, ws->proj + dim, R, cd, K, w->conv_w, w->conv_b,
                                      ctx->geom->conv_dtype, ws->xbc, cd, &mp_step,
                                      ws->proj + dim + cd, R, ctx->geom->ssm_dtype, ws->ybuf,
                                      R));
    }
    /* gated norm: y (ybuf, ld R) gated by z (proj cols [0, dim), ld R) */
    if (s->group_replication > 1) {
        gsz = dim;                 /* this rank holds a slice of one group */
    } else {
        gsz = full_group;          /* whole groups */
    }
    ngl = dim / gsz;
    if ((s->group_replication == 1) && (dev->kind != KVF_DEVICE_CPU)) {
        /* whole groups on this rank: both phases in one launch on a device (same bits) */
        KVF_KCALL(kvf_gated_rmsnorm(dev, ws->ybuf, ws->proj, R, w->gnorm_w, T, dim, gsz,
                                    (float)cfg->norm_eps, ws->g));
    } else {
        KVF_KCALL(kvf_gated_rmsnorm_sumsq(dev, ws->ybuf, ws->proj, R, T, dim, gsz, ws->g,
                                          ws->sumsq));
        if (s->group_replication > 1) {
            kvf_status_t s2 = kvf_comm_all_reduce_span(ctx->comm, ws->sumsq,
                                                       (size_t)T * (size_t)ngl,
                                                       s->group_replication);
            if (status == KVF_OK) {
                status = s2;
            }
        }
        KVF_KCALL(kvf_gated_rmsnorm_apply(dev, ws->g, ws->sumsq, w->gnorm_w, T, dim, gsz,
                                          full_group, (float)cfg->norm_eps, ws->g));
    }
    KVF_KCALL(kvf_mat_gemm(dev, ws, T, ws->g, dim, &w->out_proj, w->out_bias, ws->out, H));
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H,
                               (float)cfg->residual_multiplier, status);
}

static kvf_status_t kvf_fwd_attention(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                      const kvf_fwd_batch_t *batch, int l, int T,
                                      kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_rank_w_t *rw = &m->ranks[ctx->rank];
    const kvf_shard_t *s = &rw->shard;
    const kvf_layer_w_t *w = &rw->layers[l];
    const kvf_device_t *dev = kvf_fwd_dev(ctx);
    const kvf_rep_w_t *rep = kvf_model_rep(m, ctx->rank);
    const kvf_rank_geometry_t *geo = ctx->geom;
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size, R = w->qkv_rows, hd = cfg->head_dim;
    const int qd = s->attn_heads * hd, kd = s->kv_heads * hd;
    const int g = ctx->layout->layer_group[l], slot = ctx->layout->layer_slot[l];
    const float *inv = cfg->layer_local_rope[l] ? rep->inv_freq_local : rep->inv_freq;
    int o = 0;

    kvf_paged_kv_t kv;
    kvf_attn_seqs_t seqs = {
        .num_seqs = batch->num_seqs, .num_tokens = ws->seq_n, .block_tables = ws->seq_tab,
        .num_blocks = ws->seq_nb,
    };
    /* a graphed step reads its positions and tables from the published inputs */
    const int32_t *pos = (ws->in != NULL) ? ws->in->pos : ws->pos;

    if (ws->in != NULL) {
        seqs.packed = ws->in->attn[g];
        seqs.packed_maxb = ws->in->maxb;
        seqs.split_blocks = ws->in->split_blocks;
    }

    KVF_KCALL(kvf_mat_gemm(dev, ws, T, ws->xn, H, &w->qkv, w->qkv_bias, ws->proj, R));
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        const int n = sq->num_tokens;

        for (int t = 0; t < n; ++t) {
            ws->pos[o + t] = sq->start + t;
        }
        ws->seq_n[i] = n;
        ws->seq_tab[i] = sq->group_blocks[g];
        ws->seq_nb[i] = sq->group_num_blocks[g];
        o += n;
    }
    if (cfg->qk_norm) {
        /* Qwen3's per-head norms of q and k, every token's heads in one call each */
        KVF_KCALL(kvf_rmsnorm_heads(dev, ws->proj, R, T, s->attn_heads, hd, w->q_norm,
                                    (float)cfg->norm_eps));
        KVF_KCALL(kvf_rmsnorm_heads(dev, ws->proj + qd, R, T, s->kv_heads, hd, w->k_norm,
                                    (float)cfg->norm_eps));
    }
    if ((inv != NULL) && (cfg->rope.rotary_dim == hd)) {   /* gemma3_text: per layer type */
        /* transformers' rotate_half RoPE of q and k (kernels/kvf_ops_math.h), every row at
         * its own position: one call for the batch */
        KVF_KCALL(kvf_rope(dev, inv, hd, pos, T, ws->proj, R, s->attn_heads));
        KVF_KCALL(kvf_rope(dev, inv, hd, pos, T, ws->proj + qd, R, s->kv_heads));
    } else if (inv != NULL) {
        /* partial rotary (bamba): the leading rotary_dim of each head, a call per head */
        for (int h = 0; h < s->attn_heads + s->kv_heads; ++h) {
            KVF_KCALL(kvf_rope(dev, inv, cfg->rope.rotary_dim, pos, T,
                               ws->proj + (size_t)h * (size_t)hd, R, 1));
        }
    }
    /* every seq's K/V written, then every seq attends: one call for the batch (on a GPU two
     * launches, whatever the batch size; on the CPU the per-seq calls); or FlashInfer */
    if (!kvf_fwd_fi_try(m, ctx, dev, batch, l, pos, &status)) {   /* KVF_GPU_ATTN */
        kvf_page_pool_attn_view(ctx->pool, geo, hd, slot, batch->seqs[0].group_blocks[g],
                                batch->seqs[0].group_num_blocks[g], &kv);
        kv.window = cfg->layer_window[l];   /* 0: full attention */
        kv.sinks = w->sinks;                /* gpt_oss; NULL elsewhere */
        kv.softcap = (float)cfg->attn_softcap;   /* gemma2: attn_logit_softcapping; 0 */
        KVF_KCALL(kvf_attn_write_paged_seqs(dev, &kv, &seqs, ws->proj + qd,
                                            ws->proj + qd + kd, R, ws->proj, R, pos,
                                            s->attn_heads, (float)cfg->attention_multiplier,
                                            ws->g));
    }
    if (cfg->attn_output_gate) {   /* qwen3_next: * sigmoid(gate), the rows after v */
        KVF_KCALL(kvf_sigmoid_gate(dev, ws->g, qd, ws->proj + qd + 2 * kd, R, T, qd));
    }
    KVF_KCALL(kvf_mat_gemm(dev, ws, T, ws->g, qd, &w->o_proj, w->o_bias, ws->out, H));
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H,
                               (float)cfg->residual_multiplier, status);
}

/*
 * Device sampling of the head's rows (kernels/kvf_sample_batch.h): one upload of the rows'
 * parameters and penalty entries, one launch, one download of the small results; the rows
 * that only want their greedy id ride along as temperature-0 rows, so the step still has
 * one copy back. Rows are the head's @a ns rows of ws->logits, in seq order.
 */
static kvf_status_t kvf_fwd_head_sample(const kvf_device_t *dev, struct kvf_model_ws *ws,
                                        const kvf_fwd_batch_t *batch, int ns, int V)
{
    kvf_status_t status;
    int r = 0;

    if ((size_t)ns > ws->cap_srow) {
        kvf_sample_row_t *rows = realloc(ws->srow, (size_t)ns * sizeof(*rows));
        kvf_sample_res_t *res;
        if (rows == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        ws->srow = rows;
        res = realloc(ws->sres, (size_t)ns * sizeof(*res));
        if (res == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        ws->sres = res;
        ws->cap_srow = (size_t)ns;
    }
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        if ((sq->logits == NULL) && (sq->token == NULL) && (sq->sample == NULL)) {
            continue;
        }
        if (sq->sample != NULL) {
            ws->srow[r] = *sq->sample;
        } else {   /* greedy id alone: argmax, no draw, no entries */
            ws->srow[r] = (kvf_sample_row_t){.temperature = 0.0f, .rep = 1.0f};
        }
        ++r;
    }
    status = KVF_OK;   /* a call timed per site under --profile, as the forward's kernels */
    KVF_KCALL(kvf_sample_batch(dev, &ws->sample_ws, ws->logits, ns, V, V, ws->srow,
                               batch->sample_pen, batch->sample_num_pen, ws->sres));
    return status;
}

/*
 * Rank 0's head, first half: norm_f and lm_head on the last token of every sequence that
 * wants its logits, its greedy token or a device sample, into ws->logits (the rows in seq
 * order). Device work only: a graphed step records it.
 */
static kvf_status_t kvf_fwd_head_logits(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                        const kvf_fwd_batch_t *batch, kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_device_t *dev = kvf_fwd_dev(ctx);
    const kvf_rep_w_t *rep = kvf_model_rep(m, ctx->rank);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size, V = cfg->vocab_size;
    int ns = 0, o = 0;

    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        o += sq->num_tokens;
        if ((sq->logits != NULL) || (sq->token != NULL) || (sq->sample != NULL)) {
            ws->last_rows[ns++] = o - 1;   /* the last token of each seq wanting logits */
        }
    }
    KVF_KCALL(kvf_gather_rows(dev, ws->h, KVF_DTYPE_FP32, H,
                              (ws->in != NULL) ? ws->in->last_rows : ws->last_rows, ns,
                              ws->last));
    KVF_KCALL(kvf_rmsnorm(dev, ws->last, rep->norm_f, ws->last, ns, H, (float)cfg->norm_eps));
    KVF_KCALL(kvf_mat_gemm(dev, ws, ns, ws->last, H, &rep->lm_head, NULL, ws->logits, V));
    if (cfg->logits_scaling != 1.0) {   /* granitemoehybrid: logits / logits_scaling */
        KVF_KCALL(kvf_scale(dev, ws->logits, (size_t)ns * (size_t)V,
                            (float)(1.0 / cfg->logits_scaling)));
    }
    if (cfg->final_softcap > 0.0) {   /* gemma2: c tanh(logits / c) */
        const size_t n = (size_t)ns * (size_t)V;
        KVF_KCALL(kvf_scale(dev, ws->logits, n, (float)(1.0 / cfg->final_softcap)));
        KVF_KCALL(kvf_act(dev, (int)KVF_ACT_TANH, ws->logits, n));
        KVF_KCALL(kvf_scale(dev, ws->logits, n, (float)cfg->final_softcap));
    }
    return status;
}

/*
 * Rank 0's head, second half, on the rank's own stream: the greedy ids by an argmax on the
 * device, copied back in one call (the step's one synchronisation when nobody wants
 * logits), or, when some sequence samples on the device, every row through the device
 * sampler (one upload, one download); logits copied per sequence only for those that asked
 * (host sampling, --print-logits).
 */
kvf_status_t kvf_fwd_head_pick(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                               const kvf_fwd_batch_t *batch, kvf_status_t status)
{
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    struct kvf_model_ws *ws = ctx->ws;
    const int V = m->cfg.vocab_size;
    int ns = 0;
    bool tokens = false, sample = false;

    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        if ((sq->logits != NULL) || (sq->token != NULL) || (sq->sample != NULL)) {
            ++ns;
            tokens |= (sq->token != NULL);
            sample |= (sq->sample != NULL);
        }
    }
    if (sample && (status == KVF_OK)) {
        status = kvf_fwd_head_sample(dev, ws, batch, ns, V);
    } else if (tokens) {
        KVF_KCALL(kvf_argmax_rows(dev, ws->logits, ns, V, V, ws->d_tok));
        KVF_KCALL(kvf_device_memcpy(dev, ws->h_tok, ws->d_tok, (size_t)ns * sizeof(int32_t),
                                    KVF_COPY_D2H));
    }
    ns = 0;
    for (int i = 0; (status == KVF_OK) && (i < batch->num_seqs); ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        if ((sq->logits == NULL) && (sq->token == NULL) && (sq->sample == NULL)) {
            continue;
        }
        if (sq->token != NULL) {
            *sq->token = sample ? ws->sres[ns].token : ws->h_tok[ns];
        }
        if ((sq->sample != NULL) && (sq->sampled != NULL)) {
            *sq->sampled = ws->sres[ns];
        }
        if (sq->logits != NULL) {
            /* to the host (synchronous: the step's work is done after) */
            KVF_KCALL(kvf_device_memcpy(dev, sq->logits, ws->logits + (size_t)ns * (size_t)V,
                                        (size_t)V * sizeof(float), KVF_COPY_D2H));
        }
        ++ns;
    }
    return status;
}

/* gemma3_text: a norm of the layer's reduced output ws->out before the residual add
 * (post_attention_layernorm, post_feedforward_layernorm); no-op for a NULL weight. */
static kvf_status_t kvf_fwd_post_norm(kvf_model_h m, const kvf_rank_ctx_t *ctx, const float *w,
                                      int T, kvf_status_t status)
{
    if (w != NULL) {
        KVF_KCALL(kvf_rmsnorm(kvf_fwd_dev(ctx), ctx->ws->out, w, ctx->ws->out, T,
                              m->cfg.hidden_size, (float)m->cfg.norm_eps));
    }
    return status;
}

kvf_status_t kvf_fwd_body(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                          const kvf_fwd_batch_t *batch, int T)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_device_t *dev = kvf_fwd_dev(ctx);
    const kvf_rep_w_t *rep = kvf_model_rep(m, ctx->rank);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size;
    kvf_status_t status = KVF_OK;
    int o = 0;

    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        for (int t = 0; t < sq->num_tokens; ++t, ++o) {
            ws->ids[o] = sq->tokens[t];
        }
    }
    /* embedding lookup (ids checked against the vocabulary by kvf_batch_check) */
    KVF_KCALL(kvf_gather_rows(dev, rep->embed.data, rep->embed.dtype, H,
                              (ws->in != NULL) ? ws->in->ids : ws->ids, T, ws->h));
    if (cfg->embedding_multiplier != 1.0) {
        KVF_KCALL(kvf_scale(dev, ws->h, (size_t)T * (size_t)H, (float)cfg->embedding_multiplier));
    }
    kvf_fwd_fi_step(ctx, dev, batch);   /* KVF_GPU_ATTN=flashinfer: the step's one plan */
    for (int l = 0; l < cfg->num_layers; ++l) {
        /* h += the previous layer's output (none before layer 0), then this layer's norm */
        status = kvf_fwd_norm(dev, ws, l > 0, rep->norm_w[l], T, H, (float)cfg->norm_eps,
                              status);
        switch (cfg->layer_kinds[l]) {
        case KVF_LAYER_MAMBA:
            status = (cfg->state_kind == KVF_STATE_GDN) ?
                     kvf_fwd_gdn(m, ctx, batch, l, T, status) :
                     kvf_fwd_mamba(m, ctx, batch, l, T, status);
            break;
        case KVF_LAYER_ATTENTION:
            status = kvf_fwd_attention(m, ctx, batch, l, T, status);
            status = kvf_fwd_post_norm(m, ctx, rep->post_w[2 * l], T, status);
            break;
        case KVF_LAYER_MOE:
            status = kvf_fwd_moe(m, ctx, l, T, status);
            break;
        default:
            status = kvf_fwd_mlp(m, ctx, l, T, status);
            break;
        }
        if (cfg->dense_mlp_in_layer) {   /* the mixer's FFN: its norm, then MLP or experts */
            status = kvf_fwd_norm(dev, ws, true, rep->norm2_w[l], T, H, (float)cfg->norm_eps,
                                  status);
            status = kvf_model_layer_has_moe(cfg, l) ? kvf_fwd_moe(m, ctx, l, T, status) :
                     kvf_fwd_mlp(m, ctx, l, T, status);
            status = kvf_fwd_post_norm(m, ctx, rep->post_w[2 * l + 1], T, status);
        }
    }
    if (cfg->num_layers > 0) {
        KVF_KCALL(kvf_add(dev, ws->h, ws->out, (size_t)T * (size_t)H));   /* the last layer's */
    }
    if (ctx->rank == 0) {
        status = kvf_fwd_head_logits(m, ctx, batch, status);
    }
    return status;
}

kvf_status_t kvf_model_forward_rank(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                    const kvf_fwd_batch_t *batch)
{
    const kvf_device_t *dev = kvf_page_pool_device(ctx->pool);
    const kvf_device_t *wdev = &m->ranks[ctx->rank].dev;
    struct kvf_model_ws *ws = ctx->ws;
    kvf_status_t status;
    int T = 0;
    bool grow;

    for (int i = 0; i < batch->num_seqs; ++i) {
        T += batch->seqs[i].num_tokens;
    }
    if (batch->num_seqs == 0) {
        return KVF_OK;
    }
    if ((dev->kind != wdev->kind) ||
        ((dev->kind != KVF_DEVICE_CPU) && (dev->ordinal != wdev->ordinal))) {
        kvf_error("rank %d: the page pool is on %s:%d but the weights on %s:%d", ctx->rank,
                  kvf_device_kind_name(dev->kind), dev->ordinal,
                  kvf_device_kind_name(wdev->kind), wdev->ordinal);
        return KVF_ERR_INVALID_PARAM;   /* same on every rank (one model, pools alike) */
    }
    status = kvf_batch_check(m, ctx, batch);
    if (status != KVF_OK) {
        return status;   /* identical on every rank: nobody enters a collective */
    }
    /* Every rank sees the same batches, so every rank grows its workspace in the
     * same steps; only then can one rank fail where another succeeds. */
    grow = ((size_t)T > ws->cap_tokens) || ((size_t)batch->num_seqs > ws->cap_seqs) ||
           (ws->cap_tile == 0);
    status = kvf_ws_reserve(ws, m, &m->ranks[ctx->rank], dev, (size_t)T,
                            (size_t)batch->num_seqs);
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

    if (dev->kind != KVF_DEVICE_CPU) {
        KVF_KCALL(kvf_device_bind(dev));   /* this rank thread's current device */
    }
    (void)kvf_fwd_profile_thread(ctx->rank, dev);
    if ((status == KVF_OK) && kvf_fwd_graph_try(m, ctx, batch, T, &status)) {
        return status;   /* a decode step replayed (or recorded) as a CUDA graph */
    }
    if (status == KVF_OK) {
        status = kvf_fwd_body(m, ctx, batch, T);
    }
    if (ctx->comm->size > 1) {
        /* the NCCL world's all-reduces were only enqueued: wait for them here, once per
         * step and with the world's deadline, before any host read (the ids' copy back) */
        kvf_status_t s2 = kvf_comm_settle(ctx->comm);
        status = (status == KVF_OK) ? s2 : status;
    }
    if (ctx->rank == 0) {
        status = kvf_fwd_head_pick(m, ctx, batch, status);
    }
    return status;
}
