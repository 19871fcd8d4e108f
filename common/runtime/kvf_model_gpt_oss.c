/*
 * gpt_oss's own tensors (kvf_model_int.h: kvf_model_load_gpt_oss): attention sinks, the
 * biased router and the experts, whose files store x @ W layouts with gate and up
 * interleaved.
 *
 * Design: the experts are turned at load into the layout every gated expert of kvferry
 * uses ([2I][H], gate rows then up rows; down [H][I]), so the forward runs them through the
 * same GEMMs as granitemoehybrid's experts and only the activation differs
 * (kvf_swiglu_clamp). The transposition copies elements in the file's dtype (bf16 stays
 * bf16). Experts are whole on one rank (expert parallel, kvf_shard.h), so each rank adds
 * its experts' down biases, weighted as transformers weighs the expert's whole output.
 * Rejected: a transposed-GEMM path for these matrices (a second GEMM layout in the CPU
 * and CUDA kernels for one family).
 */
#include "kvf_model_int.h"

/* Rows [r0, r0 + n) of tensor @a name of @a shape (seen as [shape[0]][rest]) into a new
 * buffer in the file's dtype (fp32 when @a f32), *dtype_p set. */
static kvf_status_t kvf_oss_rows(kvf_ckpt_h ck, const char *name, int ndim,
                                 const int64_t *shape, int64_t r0, int64_t n, bool f32,
                                 void **out_p, kvf_dtype_t *dtype_p, size_t *bytes_p)
{
    kvf_st_file_h f = kvf_ckpt_need(ck, name);
    kvf_dtype_t dt = KVF_DTYPE_FP32;
    int64_t rest = 1;
    kvf_status_t status;
    void *buf;

    if (f == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    if (!f32) {
        status = kvf_st_tensor_dtype(f, name, &dt);
        if (status != KVF_OK) {
            return status;
        }
    }
    for (int i = 1; i < ndim; ++i) {
        rest *= shape[i];
    }
    buf = malloc((size_t)(n * rest) * kvf_dtype_size(dt) + 1);
    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_st_load_block(f, name, ndim, shape, r0, n, 0, rest, dt, buf);
    if (status != KVF_OK) {
        free(buf);
        return status;
    }
    *bytes_p += (size_t)(n * rest) * kvf_dtype_size(dt);
    *out_p = buf;
    if (dtype_p != NULL) {
        *dtype_p = dt;
    }
    return KVF_OK;
}

/* dst[j][c] = src[c][col(j)] for j < rows, c < cols (src [cols][src_cols], elements of
 * @a esz bytes): col(j) = 2j for j < rows / 2, 2(j - rows / 2) + 1 after (de-interleave), or
 * j (@a plain). */
static void kvf_oss_transpose(void *dst, const void *src, int rows, int cols, int src_cols,
                              size_t esz, bool plain)
{
    const int half = rows / 2;

    for (int j = 0; j < rows; ++j) {
        const int col = plain ? j : (j < half) ? 2 * j : 2 * (j - half) + 1;
        for (int c = 0; c < cols; ++c) {
            memcpy((char *)dst + ((size_t)j * (size_t)cols + (size_t)c) * esz,
                   (const char *)src + ((size_t)c * (size_t)src_cols + (size_t)col) * esz, esz);
        }
    }
}

/* Expert @a ge's matrices into up / down (this rank's slot @a e) and its biases. */
static kvf_status_t kvf_oss_expert(kvf_ckpt_h ck, const kvf_model_config_t *cfg, int l, int ge,
                                   int e, kvf_layer_w_t *w, size_t *bytes_p)
{
    const int64_t H = cfg->hidden_size, I = cfg->moe_intermediate_size;
    const int64_t E = cfg->moe_num_experts;
    const int64_t ushape[3] = {E, H, 2 * I}, dshape[3] = {E, I, H};
    const int64_t ubshape[2] = {E, 2 * I}, dbshape[2] = {E, H};
    char name[160];
    void *raw = NULL;
    float *b = NULL;
    kvf_dtype_t dt;
    kvf_status_t status;

    snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.gate_up_proj", l);
    status = kvf_oss_rows(ck, name, 3, ushape, ge, 1, false, &raw, &dt, bytes_p);
    if (status == KVF_OK) {
        w->exp_up[e].data = malloc((size_t)(2 * I * H) * kvf_dtype_size(dt));
        status = (w->exp_up[e].data != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
    }
    if (status == KVF_OK) {
        kvf_oss_transpose(w->exp_up[e].data, raw, (int)(2 * I), (int)H, (int)(2 * I),
                          kvf_dtype_size(dt), false);
        w->exp_up[e] = (kvf_mat_t){.data = w->exp_up[e].data, .dtype = dt,
                                   .rows = (int)(2 * I), .cols = (int)H};
    }
    free(raw);
    raw = NULL;
    snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.down_proj", l);
    if (status == KVF_OK) {
        status = kvf_oss_rows(ck, name, 3, dshape, ge, 1, false, &raw, &dt, bytes_p);
    }
    if (status == KVF_OK) {
        w->exp_down[e].data = malloc((size_t)(I * H) * kvf_dtype_size(dt));
        status = (w->exp_down[e].data != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
    }
    if (status == KVF_OK) {
        kvf_oss_transpose(w->exp_down[e].data, raw, (int)H, (int)I, (int)H, kvf_dtype_size(dt),
                          true);
        w->exp_down[e] = (kvf_mat_t){.data = w->exp_down[e].data, .dtype = dt,
                                     .rows = (int)H, .cols = (int)I};
    }
    free(raw);
    snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
    if (status == KVF_OK) {
        status = kvf_oss_rows(ck, name, 2, ubshape, ge, 1, true, (void **)&b, NULL, bytes_p);
    }
    if (status == KVF_OK) {   /* de-interleaved as the rows: gate | up */
        kvf_oss_transpose(w->exp_up_b + (size_t)e * (size_t)(2 * I), b, (int)(2 * I), 1,
                          (int)(2 * I), sizeof(float), false);
    }
    free(b);
    b = NULL;
    snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.down_proj_bias", l);
    if (status == KVF_OK) {
        status = kvf_oss_rows(ck, name, 2, dbshape, ge, 1, true, (void **)&b, NULL, bytes_p);
    }
    if (status == KVF_OK) {
        memcpy(w->exp_down_b + (size_t)e * (size_t)H, b, (size_t)H * sizeof(float));
    }
    free(b);
    return status;
}

kvf_status_t kvf_model_load_gpt_oss(kvf_ckpt_h ck, const kvf_model_config_t *cfg,
                                    const kvf_shard_t *s, int l, kvf_layer_w_t *w,
                                    size_t *bytes_p)
{
    const int64_t H = cfg->hidden_size, E = cfg->moe_num_experts;
    const int64_t I = cfg->moe_intermediate_size, nq = cfg->num_attention_heads;
    const int64_t rshape[2] = {E, H}, bshape[1] = {E}, sshape[1] = {nq};
    const int n = (s->moe_experts > 0) ? s->moe_experts : 1;
    char name[160];
    kvf_status_t status;

    snprintf(name, sizeof(name), "model.layers.%d.self_attn.sinks", l);
    status = kvf_oss_rows(ck, name, 1, sshape, s->attn_head_start, s->attn_heads, true,
                          (void **)&w->sinks, NULL, bytes_p);
    snprintf(name, sizeof(name), "model.layers.%d.mlp.router.weight", l);
    if (status == KVF_OK) {
        status = kvf_oss_rows(ck, name, 2, rshape, 0, E, true, (void **)&w->router_w, NULL,
                              bytes_p);
    }
    snprintf(name, sizeof(name), "model.layers.%d.mlp.router.bias", l);
    if (status == KVF_OK) {
        status = kvf_oss_rows(ck, name, 1, bshape, 0, E, true, (void **)&w->router_lin_b,
                              NULL, bytes_p);
    }
    if (status != KVF_OK) {
        return status;
    }
    /* the routing's choice bias (NemotronH's score correction) is zero here */
    w->router_b = calloc((size_t)E, sizeof(float));
    w->exp_up = calloc((size_t)n, sizeof(kvf_mat_t));
    w->exp_down = calloc((size_t)n, sizeof(kvf_mat_t));
    w->exp_up_b = malloc((size_t)n * (size_t)(2 * I) * sizeof(float));
    w->exp_down_b = malloc((size_t)n * (size_t)H * sizeof(float));
    if ((w->router_b == NULL) || (w->exp_up == NULL) || (w->exp_down == NULL) ||
        (w->exp_up_b == NULL) || (w->exp_down_b == NULL)) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int e = 0; (status == KVF_OK) && (e < s->moe_experts); ++e) {
        status = kvf_oss_expert(ck, cfg, l, s->moe_expert_start + e, e, w, bytes_p);
    }
    return status;
}

int kvf_fwd_oss_expert(const kvf_device_t *dev, struct kvf_model_ws *ws,
                       const kvf_model_config_t *cfg, const kvf_layer_w_t *w, int e, int n)
{
    const int H = cfg->hidden_size, C = cfg->moe_intermediate_size;
    int rc = kvf_mat_gemm(dev, ws, n, ws->xg, H, &w->exp_up[e],
                          w->exp_up_b + (size_t)e * (size_t)(2 * C), ws->proj, 2 * C);

    if (rc == KVF_KERN_OK) {
        rc = kvf_swiglu_clamp(dev, (float)cfg->swiglu_alpha, (float)cfg->swiglu_limit, ws->proj,
                              n, C, ws->g);
    }
    return (rc != KVF_KERN_OK) ? rc :
           kvf_mat_gemm(dev, ws, n, ws->g, C, &w->exp_down[e],
                        w->exp_down_b + (size_t)e * (size_t)H, ws->yg, H);
}
