/*
 * qwen3_next's layers (transformers' Qwen3NextGatedDeltaNet and Qwen3NextAttention; qwen3_5_text's
 * alike, with separate Gated DeltaNet projections):
 * loading a rank's shard of a Gated DeltaNet layer and of a gated attention layer, and
 * the Gated DeltaNet forward (the gated attention's forward is the attention layer's
 * plus kvf_sigmoid_gate before o_proj, kvf_model_fwd.c).
 *
 * Design: the Gated DeltaNet rows are reordered at load into the Mamba2 mixer's order,
 * z | x | B | C | dt  ->  z | v | k | q | b | a (this rank's value heads, then its key
 * heads), so the conv state's channels are v | k | q, the x | B | C layout that
 * kvf_shard_conv_channel(), the planner and the transfer already translate between TP
 * degrees (key heads replicate like B/C groups where TP exceeds them). The checkpoint
 * interleaves per key head [q | k | v (r heads) | z (r heads)] and [b (r) | a (r)]
 * (r = value heads per key head); the loader picks each head's rows. The gated
 * attention's q_proj interleaves per head [q | gate]; the loader puts the gates after
 * v: qkv = q | k | v | gate, so the attention kernels read q, k, v as for every model.
 * Rejected: keeping the checkpoint's order and teaching the planner a second conv
 * layout (every consumer of the state would need it; the reorder is free at load).
 */
#include "kvf_model_int.h"
#include "kvf_gdn.h"
#include "kvf_ssm_seqs.h"

/* in_proj_qkvz and in_proj_ba rows of this rank as z | v | k | q | b | a (w->in_proj). */
static kvf_status_t kvf_gdn_load_in_proj(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                         const kvf_shard_t *s, int l, kvf_layer_w_t *w)
{
    const int64_t H = cfg->hidden_size, dv = cfg->mamba_head_dim, dk = cfg->ssm_state_size;
    const int64_t Hv = cfg->mamba_num_heads, Hk = cfg->n_groups, r = Hv / Hk;
    const int64_t W = 2 * dk + 2 * r * dv;   /* qkvz rows per key head */
    const int nh = s->mamba_heads, ng = s->groups;
    int64_t (*rq)[2] = calloc((size_t)(2 * nh + 2 * ng), sizeof(*rq));
    int64_t (*rb)[2] = calloc((size_t)(2 * nh), sizeof(*rb));
    kvf_mat_t parts[2] = {{0}};
    kvf_status_t status = ((rq == NULL) || (rb == NULL)) ? KVF_ERR_NO_MEMORY : KVF_OK;
    int n = 0;

    for (int i = 0; (status == KVF_OK) && (i < nh); ++i) {
        const int64_t h = s->mamba_head_start + i, base = (h / r) * W + 2 * dk + (h % r) * dv;
        rq[i][0] = base + r * dv;            /* z */
        rq[i][1] = dv;
        rq[nh + i][0] = base;                /* v */
        rq[nh + i][1] = dv;
        rb[i][0] = (h / r) * 2 * r + h % r;  /* b */
        rb[i][1] = 1;
        rb[nh + i][0] = rb[i][0] + r;        /* a */
        rb[nh + i][1] = 1;
    }
    n = 2 * nh;
    for (int j = 0; (status == KVF_OK) && (j < ng); ++j) {
        const int64_t g = s->group_start + j;
        rq[n + j][0] = g * W + dk;           /* k */
        rq[n + j][1] = dk;
        rq[n + ng + j][0] = g * W;           /* q */
        rq[n + ng + j][1] = dk;
    }
    if (status == KVF_OK) {
        status = kvf_load_mat_rows(ld, kvf_lname(ld, l, "linear_attn.in_proj_qkvz.weight"),
                                   Hk * W, H, (const int64_t (*)[2])rq, 2 * nh + 2 * ng,
                                   &parts[0]);
    }
    if (status == KVF_OK) {
        status = kvf_load_mat_rows(ld, kvf_lname(ld, l, "linear_attn.in_proj_ba.weight"),
                                   2 * Hv, H, (const int64_t (*)[2])rb, 2 * nh, &parts[1]);
    }
    if (status == KVF_OK) {
        status = kvf_mat_concat(parts, 2, "qwen3_next in_proj", &w->in_proj);
        w->in_rows = (int)(2 * nh * dv + 2 * ng * dk + 2 * nh);
    }
    free(parts[0].data);
    free(parts[1].data);
    free(rq);
    free(rb);
    return status;
}

/* qwen3_5_text: in_proj_qkv (q | k | v, not interleaved), in_proj_z, in_proj_b, in_proj_a
 * rows of this rank, concatenated as z | v | k | q | b | a (w->in_proj). */
static kvf_status_t kvf_gdn_load_in_proj_split(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                               const kvf_shard_t *s, int l, kvf_layer_w_t *w)
{
    const int64_t H = cfg->hidden_size, dv = cfg->mamba_head_dim, dk = cfg->ssm_state_size;
    const int64_t Hv = cfg->mamba_num_heads, kd = cfg->n_groups * dk, vd = Hv * dv;
    const int64_t h0 = s->mamba_head_start, nh = s->mamba_heads;
    const int64_t g0 = s->group_start, ng = s->groups;
    const int64_t zr[1][2] = {{h0 * dv, nh * dv}}, hr[1][2] = {{h0, nh}};
    const int64_t qr[3][2] = {{2 * kd + h0 * dv, nh * dv}, {kd + g0 * dk, ng * dk},
                              {g0 * dk, ng * dk}};   /* v | k | q */
    kvf_mat_t parts[4] = {{0}};
    kvf_status_t status;

    status = kvf_load_mat_rows(ld, kvf_lname(ld, l, "linear_attn.in_proj_z.weight"), vd, H, zr,
                               1, &parts[0]);
    if (status == KVF_OK) {
        status = kvf_load_mat_rows(ld, kvf_lname(ld, l, "linear_attn.in_proj_qkv.weight"),
                                   2 * kd + vd, H, qr, 3, &parts[1]);
    }
    if (status == KVF_OK) {
        status = kvf_load_mat_rows(ld, kvf_lname(ld, l, "linear_attn.in_proj_b.weight"), Hv, H,
                                   hr, 1, &parts[2]);
    }
    if (status == KVF_OK) {
        status = kvf_load_mat_rows(ld, kvf_lname(ld, l, "linear_attn.in_proj_a.weight"), Hv, H,
                                   hr, 1, &parts[3]);
    }
    if (status == KVF_OK) {
        status = kvf_mat_concat(parts, 4, "qwen3_next in_proj", &w->in_proj);
        w->in_rows = (int)(2 * nh * dv + 2 * ng * dk + 2 * nh);
    }
    for (int i = 0; i < 4; ++i) {
        free(parts[i].data);
    }
    return status;
}

kvf_status_t kvf_load_gdn(kvf_loader_t *ld, const kvf_model_config_t *cfg, const kvf_shard_t *s,
                          int l, kvf_layer_w_t *w)
{
    const int64_t H = cfg->hidden_size, dv = cfg->mamba_head_dim, dk = cfg->ssm_state_size;
    const int64_t kd = cfg->n_groups * dk, vd = cfg->mamba_num_heads * dv;
    const int64_t h0 = s->mamba_head_start, nh = s->mamba_heads;
    const int64_t g0 = s->group_start, ng = s->groups;
    const int64_t cr[3][2] = {{2 * kd + h0 * dv, nh * dv}, {kd + g0 * dk, ng * dk},
                              {g0 * dk, ng * dk}};   /* conv channels v | k | q */
    const int64_t wshape[3] = {2 * kd + vd, 1, cfg->conv_kernel};
    const int64_t hr[1][2] = {{h0, nh}}, nshape[1] = {dv};
    kvf_status_t status = (cfg->arch == KVF_ARCH_QWEN3_5_TEXT) ?
                          kvf_gdn_load_in_proj_split(ld, cfg, s, l, w) :
                          kvf_gdn_load_in_proj(ld, cfg, s, l, w);

    if (status == KVF_OK) {
        status = kvf_load_part(ld, kvf_lname(ld, l, "linear_attn.conv1d.weight"), 3, wshape, cr,
                               3, 0, -1, false, (void **)&w->conv_w, NULL);
    }
    if (status == KVF_OK) {
        status = kvf_load_vec_rows(ld, kvf_lname(ld, l, "linear_attn.dt_bias"),
                                   cfg->mamba_num_heads, hr, 1, &w->dt_bias);
    }
    if (status == KVF_OK) {
        status = kvf_load_vec_rows(ld, kvf_lname(ld, l, "linear_attn.A_log"),
                                   cfg->mamba_num_heads, hr, 1, &w->A_log);
    }
    if (status == KVF_OK) {   /* the gated norm's plain weight [dv], shared by the heads */
        status = kvf_load_vec(ld, kvf_lname(ld, l, "linear_attn.norm.weight"), 1, nshape,
                              &w->gnorm_w);
    }
    if (status == KVF_OK) {
        status = kvf_load_mat_cols(ld, kvf_lname(ld, l, "linear_attn.out_proj.weight"), H, vd,
                                   h0 * dv, nh * dv, &w->out_proj);
    }
    return status;
}

/* q_proj's rows (and bias) of this rank's heads: @a gate 0 the queries, 1 the gates. */
static kvf_status_t kvf_gated_q(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                const kvf_shard_t *s, int l, int gate, kvf_mat_t *m, float **b)
{
    const int64_t H = cfg->hidden_size, hd = cfg->head_dim;
    const int64_t rows = 2 * (int64_t)cfg->num_attention_heads * hd;
    int64_t (*r)[2] = calloc((size_t)s->attn_heads, sizeof(*r));
    kvf_status_t status = (r == NULL) ? KVF_ERR_NO_MEMORY : KVF_OK;

    for (int i = 0; (status == KVF_OK) && (i < s->attn_heads); ++i) {
        r[i][0] = (int64_t)(s->attn_head_start + i) * 2 * hd + gate * hd;
        r[i][1] = hd;
    }
    if (status == KVF_OK) {
        status = kvf_load_mat_rows(ld, kvf_lname(ld, l, "self_attn.q_proj.weight"), rows, H,
                                   (const int64_t (*)[2])r, s->attn_heads, m);
    }
    if ((status == KVF_OK) && cfg->attn_bias) {
        status = kvf_load_vec_rows(ld, kvf_lname(ld, l, "self_attn.q_proj.bias"), rows,
                                   (const int64_t (*)[2])r, s->attn_heads, b);
    }
    free(r);
    return status;
}

kvf_status_t kvf_load_gated_attention(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                      const kvf_shard_t *s, int l, kvf_layer_w_t *w)
{
    const int64_t H = cfg->hidden_size, hd = cfg->head_dim;
    const int64_t q = (int64_t)cfg->num_attention_heads * hd;
    const int64_t kv = (int64_t)cfg->num_key_value_heads * hd;
    const int64_t kr[1][2] = {{s->kv_head_start * hd, s->kv_heads * hd}};
    const int64_t qn = s->attn_heads * hd, kn = s->kv_heads * hd;
    kvf_mat_t parts[4] = {{0}};   /* q | k | v | gate */
    float *bp[4] = {NULL, NULL, NULL, NULL};
    kvf_status_t status = kvf_gated_q(ld, cfg, s, l, 0, &parts[0], &bp[0]);

    if (status == KVF_OK) {
        status = kvf_gated_q(ld, cfg, s, l, 1, &parts[3], &bp[3]);
    }
    for (int i = 1; (status == KVF_OK) && (i < 3); ++i) {
        char name[64];
        snprintf(name, sizeof(name), "self_attn.%s.weight", (i == 1) ? "k_proj" : "v_proj");
        status = kvf_load_mat_rows(ld, kvf_lname(ld, l, name), kv, H, kr, 1, &parts[i]);
        if ((status == KVF_OK) && cfg->attn_bias) {
            snprintf(name, sizeof(name), "self_attn.%s.bias", (i == 1) ? "k_proj" : "v_proj");
            status = kvf_load_vec_rows(ld, kvf_lname(ld, l, name), kv, kr, 1, &bp[i]);
        }
    }
    if (status == KVF_OK) {
        status = kvf_mat_concat(parts, 4, "qwen3_next q, k, v and gate", &w->qkv);
        w->qkv_rows = (int)(2 * qn + 2 * kn);
    }
    if ((status == KVF_OK) && cfg->attn_bias) {
        const int64_t len[4] = {qn, kn, kn, qn};
        w->qkv_bias = kvf_alloc((size_t)w->qkv_rows * sizeof(float));
        status = (w->qkv_bias == NULL) ? KVF_ERR_NO_MEMORY : KVF_OK;
        for (int i = 0, off = 0; (status == KVF_OK) && (i < 4); off += (int)len[i], ++i) {
            memcpy(w->qkv_bias + off, bp[i], (size_t)len[i] * sizeof(float));
        }
    }
    for (int i = 0; i < 4; ++i) {
        free(parts[i].data);
        free(bp[i]);
    }
    if (status == KVF_OK) {
        status = kvf_load_mat_cols(ld, kvf_lname(ld, l, "self_attn.o_proj.weight"), H, q,
                                   s->attn_head_start * hd, qn, &w->o_proj);
    }
    if ((status == KVF_OK) && cfg->attn_bias && (s->tp_rank == 0)) {
        const int64_t hshape[1] = {H};
        status = kvf_load_vec(ld, kvf_lname(ld, l, "self_attn.o_proj.bias"), 1, hshape,
                              &w->o_bias);
    }
    if (status == KVF_OK) {
        status = kvf_load_norm(ld, kvf_lname(ld, l, "self_attn.q_norm.weight"), hd, &w->q_norm);
    }
    if (status == KVF_OK) {
        status = kvf_load_norm(ld, kvf_lname(ld, l, "self_attn.k_norm.weight"), hd, &w->k_norm);
    }
    return status;
}

/* qwen3_next's sparse layer: router [E][H] and shared_expert_gate [1][H] (fp32, replicated),
 * this rank's whole experts (gate|up fused, down), the shared expert's column slice. */
kvf_status_t kvf_load_qn_moe(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                             const kvf_shard_t *s, int l, kvf_layer_w_t *w)
{
    const int64_t H = cfg->hidden_size, E = cfg->moe_num_experts, I = cfg->moe_intermediate_size;
    const int64_t rshape[2] = {E, H}, gshape[2] = {1, H};
    float *nob = NULL;   /* no biases (mlp_bias is not a qwen3_next field) */
    kvf_status_t status;

    status = kvf_load_vec(ld, kvf_lname(ld, l, "mlp.gate.weight"), 2, rshape, &w->router_w);
    if (status == KVF_OK) {
        status = kvf_load_vec(ld, kvf_lname(ld, l, "mlp.shared_expert_gate.weight"), 2, gshape,
                              &w->sh_gate);
    }
    if (status == KVF_OK) {
        w->router_b = calloc((size_t)E, sizeof(float));   /* no score correction: zero */
        status = (w->router_b == NULL) ? KVF_ERR_NO_MEMORY : kvf_alloc_experts(s, w);
    }
    for (int e = 0; (status == KVF_OK) && (e < s->moe_experts); ++e) {
        char pfx[48];
        snprintf(pfx, sizeof(pfx), "mlp.experts.%d", s->moe_expert_start + e);
        status = kvf_load_mlp_part(ld, cfg, s->tp_rank, l, pfx, true, I, 0, I, &w->exp_up[e],
                                   &nob, &w->exp_down[e], &nob);
    }
    if (status == KVF_OK) {
        status = kvf_load_mlp_part(ld, cfg, s->tp_rank, l, "mlp.shared_expert", true,
                                   cfg->moe_shared_intermediate_size, s->moe_shared_col_start,
                                   s->moe_shared_cols, &w->sh_up, &w->sh_up_b, &w->sh_down,
                                   &w->sh_down_b);
    }
    return status;
}

kvf_status_t kvf_fwd_shared_gate(const kvf_device_t *dev, struct kvf_model_ws *ws,
                                 const kvf_layer_w_t *w, int T, int H, kvf_status_t status)
{
    if (w->sh_gate == NULL) {
        return status;
    }
    /* the routing is on the host already: ws->scores is free scratch for T gate logits */
    KVF_KCALL(kvf_gemm(dev, T, 1, H, ws->xn, w->sh_gate, NULL, ws->scores));
    KVF_KCALL(kvf_sigmoid_row_scale(dev, ws->out, H, ws->scores, T, H));
    return status;
}

/* The Gated DeltaNet scan of seq @a sq's n tokens (rows from @a o): as the Mamba2 scan
 * (kvf_fwd_scan_seq), its prompt tokens chunked on the model's state grid from the request's
 * position when the grid is set (the bits of one call whatever the cuts on the grid), then
 * its outputs (a recompute) token by token, as decode steps computed them. */
static kvf_status_t kvf_fwd_gdn_scan_seq(kvf_model_h m, const kvf_rank_ctx_t *ctx,
                                         const kvf_device_t *dev, const kvf_gdn_params_t *gp,
                                         const kvf_fwd_seq_t *sq, int o, int R, int cd,
                                         const float *ba, void *ssm_state, kvf_status_t status)
{
    struct kvf_model_ws *ws = ctx->ws;
    const int n = sq->num_tokens, pl = sq->prompt_len - sq->start;
    const int np = (m->scan_grid == 0) ? 0 :
                   (sq->prompt_len > 0) ? ((pl < 0) ? 0 : (pl > n) ? n : pl) :
                   (sq->prompt ? n : 0);
    const kvf_dtype_t sdt = ctx->geom->ssm_dtype;
    const float *xbc = ws->xbc + (size_t)o * (size_t)cd;
    float *y = ws->ybuf + (size_t)o * (size_t)R;

    if (np > 0) {
        KVF_KCALL(kvf_gdn_scan_chunked(dev, gp, np, (long long)sq->start, m->scan_grid, xbc,
                                       cd, ba, R, ssm_state, sdt, sq->start > 0, y, R));
    }
    if (n > np) {
        KVF_KCALL(kvf_gdn_scan(dev, gp, n - np, xbc + (size_t)np * (size_t)cd, cd,
                               ba + (size_t)np * (size_t)R, R, ssm_state, sdt,
                               (sq->start > 0) || (np > 0), y + (size_t)np * (size_t)R, R));
    }
    return status;
}

kvf_status_t kvf_fwd_gdn(kvf_model_h m, const kvf_rank_ctx_t *ctx, const kvf_fwd_batch_t *batch,
                         int l, int T, kvf_status_t status)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_rank_w_t *rw = &m->ranks[ctx->rank];
    const kvf_shard_t *s = &rw->shard;
    const kvf_layer_w_t *w = &rw->layers[l];
    const kvf_device_t *dev = kvf_fwd_dev(ctx);
    struct kvf_model_ws *ws = ctx->ws;
    const int H = cfg->hidden_size, R = w->in_rows, K = cfg->conv_kernel;
    const int dim = s->mamba_heads * cfg->mamba_head_dim, cd = s->conv_dim;
    const int g = ctx->layout->layer_group[l], slot = ctx->layout->layer_slot[l];
    const int silu = (cfg->mamba_act == KVF_ACT_SILU);
    const kvf_gdn_params_t gp = {
        .heads = s->mamba_heads, .head_dim = cfg->mamba_head_dim, .groups = s->groups,
        .key_dim = cfg->ssm_state_size, .dt_bias = w->dt_bias, .A_log = w->A_log,
    };
    int o = 0, nd = 0;

    KVF_KCALL(kvf_mat_gemm(dev, ws, T, ws->xn, H, &w->in_proj, NULL, ws->proj, R));
    for (int i = 0; i < batch->num_seqs; ++i) {
        const kvf_fwd_seq_t *sq = &batch->seqs[i];
        const int n = sq->num_tokens, has = (sq->start > 0);
        void *conv_state = kvf_page_pool_conv_state(ctx->pool, sq->group_blocks[g][0], slot);
        void *ssm_state = kvf_page_pool_ssm_state(ctx->pool, ctx->geom, sq->group_blocks[g][0],
                                                  slot);
        const float *in = ws->proj + (size_t)o * R;
        float *xbc = ws->xbc + (size_t)o * cd;
        /* one token on a state that is not a prompt token the chunked scan takes (a lone
         * prompt token there is a chunk: the recompute's bits) */
        const bool lone = (n == 1) && has &&
                          ((m->scan_grid == 0) || !kvf_fwd_step_is_prompt(sq));

        if (lone && silu) {
            /* the batched decode step after the loop: fixed launches for a CUDA graph */
            ws->dec_rows[nd] = o;
            ws->dec_conv[nd] = conv_state;
            ws->dec_ssm[nd] = ssm_state;
            ws->dec_dtmin[nd] = kvf_fwd_step_dt_min(cfg, sq);   /* not read: the graph's */
            ws->dec_dtmax[nd] = kvf_fwd_step_dt_max(cfg, sq);   /* packed block holds them */
            ++nd;
            o += n;
            continue;
        }
        if (lone) {
            KVF_KCALL(kvf_conv1d_step(dev, in + dim, cd, K, w->conv_w, NULL, silu, conv_state,
                                      ctx->geom->conv_dtype, xbc));
        } else {
            KVF_KCALL(kvf_conv1d_chunk(dev, in + dim, R, n, cd, K, w->conv_w, NULL, silu,
                                       conv_state, ctx->geom->conv_dtype, has, xbc, cd));
        }
        if (!silu) {
            KVF_KCALL(kvf_act(dev, (int)cfg->mamba_act, xbc, (size_t)n * (size_t)cd));
        }
        status = kvf_fwd_gdn_scan_seq(m, ctx, dev, &gp, sq, o, R, cd, in + dim + cd, ssm_state,
                                      status);
        o += n;
    }
    if (nd > 0) {
        const kvf_ssm_seqs_t dec = {
            .num_seqs = nd, .rows = ws->dec_rows, .conv_states = ws->dec_conv,
            .ssm_states = ws->dec_ssm, .dt_min = ws->dec_dtmin, .dt_max = ws->dec_dtmax,
            .packed = (ws->in != NULL) ? ws->in->mamba[l] : NULL,   /* a graphed step's */
        };
        KVF_KCALL(kvf_gdn_decode_seqs(dev, &dec, ws->proj + dim, R, cd, K, w->conv_w,
                                      ctx->geom->conv_dtype, ws->xbc, cd, &gp,
                                      ws->proj + dim + cd, R, ctx->geom->ssm_dtype, ws->ybuf,
                                      R));
    }
    /* Qwen3NextRMSNormGated per head: y (ybuf) normed, * w, * silu(z) (proj cols [0, dim)) */
    KVF_KCALL(kvf_gdn_gated_norm(dev, ws->ybuf, R, ws->proj, R, w->gnorm_w, T, s->mamba_heads,
                                 cfg->mamba_head_dim, (float)cfg->norm_eps, ws->g, dim));
    KVF_KCALL(kvf_mat_gemm(dev, ws, T, ws->g, dim, &w->out_proj, NULL, ws->out, H));
    return kvf_reduce_residual(ctx, ws, (size_t)T, (size_t)H,
                               (float)cfg->residual_multiplier, status);
}
