/*
 * The FFN forward of one TP rank (split out of kvf_model_fwd.c, behaviour unchanged): the
 * dense MLP slice and the routed experts (router, shared expert, expert gather / scatter),
 * each followed by its all-reduce and residual scale.
 */
#include "kvf_model_int.h"

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
    int e;

    if (!gated && kvf_mat_direct(up)) {
        /* up and its activation in one call (on a device one launch; the same bits) */
        e = kvf_gemm_w_act(dev, M, up->rows, up->cols, x, H, up->data, up->dtype, up->cols, up_b,
                           (int)act, ws->proj, up->rows);
        return (e != KVF_KERN_OK) ? e :
               kvf_mat_gemm(dev, ws, M, ws->proj, C, down, down_b, out, H);
    }
    e = kvf_mat_gemm(dev, ws, M, x, H, up, up_b, ws->proj, up->rows);
    if (e != KVF_KERN_OK) {
        return e;
    }
    if (gated) {
        e = kvf_act_mul(dev, (int)act, ws->proj, M, C, ws->g);   /* act(gate) * up */
        return (e != KVF_KERN_OK) ? e : kvf_mat_gemm(dev, ws, M, ws->g, C, down, down_b, out, H);
    }
    e = kvf_act(dev, (int)act, ws->proj, (size_t)M * (size_t)C);
    return (e != KVF_KERN_OK) ? e : kvf_mat_gemm(dev, ws, M, ws->proj, C, down, down_b, out, H);
}

kvf_status_t kvf_fwd_mlp(kvf_model_h m, const kvf_rank_ctx_t *ctx, int l, int T,
                         kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_layer_w_t *w = &m->ranks[ctx->rank].layers[l];
    const kvf_device_t *dev = kvf_fwd_dev(ctx);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size;

    KVF_KCALL(kvf_mlp_rows(dev, ws, cfg->mlp_act, cfg->mlp_gated, T, ws->xn, H, &w->up,
                           w->up_bias, &w->down, w->down_bias, ws->out));
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H,
                               (float)cfg->residual_multiplier, status);
}

/*
 * transformers' NemotronH top-k router for the T rows of router logits in
 * ws->scores (kvf_moe_route, kernels/kvf_moe_math.h): sigmoid scores;
 * choice scores = scores + e_score_correction_bias; the topk_group groups
 * with the largest sum of their two best choice scores stay; the top_k
 * experts by choice score among them are taken, weighted by their (plain)
 * scores, normalised to sum 1 when norm_topk_prob, times
 * routed_scaling_factor. Ties go to the lower index. The choice is returned
 * in host memory (*idx_p, *wt_p: [T][top_k]) for the expert gather: on a
 * device, a copy of the routing arrays.
 */
static int kvf_fwd_route(const kvf_device_t *dev, const kvf_model_config_t *cfg,
                         const kvf_layer_w_t *w, struct kvf_model_ws *ws, int T,
                         const int32_t **idx_p, const float **wt_p)
{
    const size_t n = (size_t)T * (size_t)cfg->moe_top_k;
    const kvf_moe_route_params_t p = {
        .experts = cfg->moe_num_experts, .top_k = cfg->moe_top_k, .n_group = cfg->moe_n_group,
        .topk_group = cfg->moe_topk_group, .norm_topk_prob = cfg->moe_norm_topk_prob,
        .routed_scaling = (float)cfg->moe_routed_scaling, .bias = w->router_b,
        .softmax_topk = cfg->moe_softmax_topk,
        .softmax_full = cfg->moe_softmax_full,
    };
    /* ids [n] then weights [n], adjacent: one device->host copy brings both */
    float *wt = (float *)(void *)(ws->route_idx + n);
    int e = kvf_moe_route(dev, &p, ws->scores, T, ws->scores, ws->route_idx, wt);

    *idx_p = ws->route_idx;
    *wt_p = wt;
    if ((e != KVF_KERN_OK) || !kvf_ws_on_device(ws)) {
        return e;
    }
    e = kvf_device_memcpy(dev, ws->h_route_idx, ws->route_idx, 2 * n * sizeof(int32_t),
                          KVF_COPY_D2H);
    *idx_p = ws->h_route_idx;
    *wt_p = (const float *)(const void *)(ws->h_route_idx + n);
    return e;
}

kvf_status_t kvf_fwd_moe(kvf_model_h m, const kvf_rank_ctx_t *ctx, int l, int T,
                         kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_rank_w_t *rw = &m->ranks[ctx->rank];
    const kvf_shard_t *s = &rw->shard;
    const kvf_layer_w_t *w = &rw->layers[l];
    const kvf_device_t *dev = kvf_fwd_dev(ctx);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size, E = cfg->moe_num_experts, k = cfg->moe_top_k;
    const int32_t *route_idx = NULL;
    const float *route_w = NULL;

    /* router (fp32, replicated: every rank routes alike) */
    KVF_KCALL(kvf_gemm(dev, T, E, H, ws->xn, w->router_w, w->router_lin_b, ws->scores));
    if ((ctx->comm->size > 1) && (status == KVF_OK)) {
        /* the routing comes to the host next: the all-reduces enqueued before it are waited
         * for first, with the world's deadline (a copy would wait on a hung one forever) */
        status = kvf_comm_settle(ctx->comm);
    }
    KVF_KCALL(kvf_fwd_route(dev, cfg, w, ws, T, &route_idx, &route_w));
    /* shared expert slice first: it writes ws->out (none: gpt_oss, zeros) */
    KVF_KCALL((w->sh_up.data == NULL) ?
              kvf_device_memset(dev, ws->out, 0, (size_t)T * (size_t)H * sizeof(float)) :
              kvf_mlp_rows(dev, ws, cfg->mlp_act, cfg->moe_gated, T, ws->xn, H, &w->sh_up,
                           w->sh_up_b, &w->sh_down, w->sh_down_b, ws->out));
    status = kvf_fwd_shared_gate(dev, ws, w, T, H, status);   /* qwen3_next */
    for (int e = 0; (status == KVF_OK) && (e < s->moe_experts); ++e) {
        const int ge = s->moe_expert_start + e;
        int n = 0;
        for (int t = 0; t < T; ++t) {
            for (int r = 0; r < k; ++r) {
                if (route_idx[(size_t)t * (size_t)k + (size_t)r] == ge) {
                    ws->rows[n] = t;
                    ws->rw[n] = route_w[(size_t)t * (size_t)k + (size_t)r];
                    ++n;
                }
            }
        }
        if (n == 0) {
            continue;
        }
        /* gather the expert's tokens, run it, add its weighted outputs to their rows
         * (a token picks an expert at most once: the rows are distinct) */
        KVF_KCALL(kvf_gather_rows(dev, ws->xn, KVF_DTYPE_FP32, H, ws->rows, n, ws->xg));
        KVF_KCALL(cfg->moe_swiglu_clamp ? kvf_fwd_oss_expert(dev, ws, cfg, w, e, n) :
                  kvf_mlp_rows(dev, ws, cfg->mlp_act, cfg->moe_gated, n, ws->xg, H,
                               &w->exp_up[e], NULL, &w->exp_down[e], NULL, ws->yg));
        KVF_KCALL(kvf_scatter_add_rows(dev, ws->out, H, ws->rows, ws->rw, n, ws->yg, H));
    }
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H,
                               (float)cfg->residual_multiplier, status);
}
