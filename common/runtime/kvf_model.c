/*
 * Forward pass of one TP rank: NemotronH hybrids (Mamba2, attention, MLP and
 * MoE layers), dense Llama / Qwen3 / Mistral, and Bamba / Granite 4.0-H
 * (each Mamba2 or attention mixer followed by its FFN: a gated MLP, or
 * softmax-routed gated experts plus a shared MLP, with Granite's multipliers
 * applied by kvf_scale after each all-reduce).
 *
 * Design: a step is one flat batch of T tokens (the concatenated chunks of
 * every scheduled request, prefill chunks and single decode tokens alike),
 * so each projection is one GEMM over all T rows; only the cache-touching
 * parts (attention, conv1d, scan) loop over requests, because each request
 * has its own pages. Prefill and decode are the same code path: a decode
 * step is a chunk of one token with start > 0. This keeps "prefill N then
 * decode" and "prefill N+1 in one chunk" on the same kernels, and the
 * kernels' per-row arithmetic does not depend on the rows beside it, so the
 * two agree bit for bit (tests/common/runtime/test_model_consistency.c;
 * common/engine/README.md, "Batch invariance").
 *
 * Weights are loaded per rank as contiguous shards (rows of column-parallel
 * matrices, columns of row-parallel ones), so the forward never strides
 * over another rank's data. Matrices stay in the checkpoint's dtype (a bf16
 * checkpoint is resident at its file size, not twice it); a GEMM over a
 * bf16 matrix computes in fp32 (on the CPU the GEMM widens bf16 in its
 * registers; an fp16 matrix is widened a tile of rows at a time into the
 * rank's scratch). Small vectors (norms, biases, A_log, ...) are fp32.
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
#include "kvf_model_int.h"
#include "kvf_attention_math.h"   /* KVF_ATTN_SPLITS_MAX: the workspace formula */
#include "kvf_ssd.h"                /* the chunked scan's scratch: the workspace formula */

/* Parts: kvf_model_fwd.c (workspace and forward); this file: loading the weights. */

/* ---- loading ------------------------------------------------------------- */

/* nemotron_h: backbone.layers.N.<suffix>; dense: model.layers.N.<suffix> (a multimodal
 * wrapper's text: model.language_model.layers.N.<suffix>). */
const char *kvf_lname(kvf_loader_t *ld, int layer, const char *suffix)
{
    if (layer < 0) {
        snprintf(ld->name, sizeof(ld->name), "%s", suffix);
    } else {
        snprintf(ld->name, sizeof(ld->name), "%s.layers.%d.%s", ld->prefix, layer, suffix);
    }
    return ld->name;
}

/* The Mamba2 mixer's tensor @a what of layer @a layer (ld->mamba's module). */
static const char *kvf_mname(kvf_loader_t *ld, int layer, const char *what)
{
    char suffix[96];
    snprintf(suffix, sizeof(suffix), "%s.%s", ld->mamba, what);
    return kvf_lname(ld, layer, suffix);
}

void *kvf_alloc(size_t bytes)
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
kvf_status_t kvf_load_part(kvf_loader_t *ld, const char *name, int ndim,
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
kvf_status_t kvf_load_vec(kvf_loader_t *ld, const char *name, int ndim,
                          const int64_t *shape, float **out_p)
{
    const int64_t r[1][2] = {{0, shape[0]}};
    return kvf_load_part(ld, name, ndim, shape, r, 1, 0, -1, false, (void **)out_p, NULL);
}

/* An RMSNorm's weight (fp32) plus the model's norm offset: gemma3_text's (1 + weight), added
 * in fp32 as transformers does, so the forward keeps one RMSNorm. */
kvf_status_t kvf_load_norm(kvf_loader_t *ld, const char *name, int64_t n, float **out_p)
{
    const int64_t shape[1] = {n};
    kvf_status_t status = kvf_load_vec(ld, name, 1, shape, out_p);

    for (int64_t i = 0; (status == KVF_OK) && (ld->norm_offset != 0.0f) && (i < n); ++i) {
        (*out_p)[i] += ld->norm_offset;
    }
    return status;
}

/* Row ranges of a 1-D fp32 tensor (column-parallel vector slices). */
kvf_status_t kvf_load_vec_rows(kvf_loader_t *ld, const char *name, int64_t n,
                               const int64_t (*ranges)[2], int nr, float **out_p)
{
    const int64_t shape[1] = {n};
    return kvf_load_part(ld, name, 1, shape, ranges, nr, 0, -1, false, (void **)out_p, NULL);
}

/* Column-parallel matrix: row ranges of a [N][K] tensor, kept in its dtype. */
kvf_status_t kvf_load_mat_rows(kvf_loader_t *ld, const char *name, int64_t N, int64_t K,
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
kvf_status_t kvf_load_mat_cols(kvf_loader_t *ld, const char *name, int64_t N, int64_t K,
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
        KVF_LOAD(kvf_load_mat_rows(ld, kvf_mname(ld, l, "in_proj.weight"),
                                   inner + conv_dim + nh, H, r, 5, &w->in_proj));
        if (cfg->mamba_proj_bias) {
            KVF_LOAD(kvf_load_vec_rows(ld, kvf_mname(ld, l, "in_proj.bias"),
                                       inner + conv_dim + nh, r, 5, &w->in_bias));
        }
        w->in_rows = (int)(2 * xn + 2 * bn + s->mamba_heads);
    }
    {
        const int64_t r[3][2] = {{x0, xn}, {inner + b0, bn}, {inner + G * N + b0, bn}};
        const int64_t wshape[3] = {conv_dim, 1, K};
        KVF_LOAD(kvf_load_part(ld, kvf_mname(ld, l, "conv1d.weight"), 3, wshape, r, 3, 0,
                               -1, false, (void **)&w->conv_w, NULL));
        if (cfg->use_conv_bias) {
            KVF_LOAD(kvf_load_vec_rows(ld, kvf_mname(ld, l, "conv1d.bias"), conv_dim, r, 3,
                                       &w->conv_b));
        }
    }
    {
        const int64_t hr[1][2] = {{s->mamba_head_start, s->mamba_heads}};
        const int64_t ir[1][2] = {{x0, xn}};
        KVF_LOAD(kvf_load_vec_rows(ld, kvf_mname(ld, l, "dt_bias"), nh, hr, 1, &w->dt_bias));
        KVF_LOAD(kvf_load_vec_rows(ld, kvf_mname(ld, l, "A_log"), nh, hr, 1, &w->A_log));
        KVF_LOAD(kvf_load_vec_rows(ld, kvf_mname(ld, l, "D"), nh, hr, 1, &w->D));
        KVF_LOAD(kvf_load_vec_rows(ld, kvf_mname(ld, l, "norm.weight"), inner, ir, 1,
                                   &w->gnorm_w));
    }
    KVF_LOAD(kvf_load_mat_cols(ld, kvf_mname(ld, l, "out_proj.weight"), H, inner, x0, xn,
                               &w->out_proj));
    if (cfg->mamba_proj_bias && (s->tp_rank == 0)) {
        const int64_t hshape[1] = {H};
        KVF_LOAD(kvf_load_vec(ld, kvf_mname(ld, l, "out_proj.bias"), 1, hshape,
                              &w->out_bias));
    }
    return KVF_OK;
}

kvf_status_t kvf_mat_concat(const kvf_mat_t *parts, int n, const char *what, kvf_mat_t *out)
{
    size_t esz = kvf_dtype_size(parts[0].dtype), off = 0;
    int rows = 0;

    for (int i = 0; i < n; ++i) {
        if ((parts[i].dtype != parts[0].dtype) || (parts[i].cols != parts[0].cols)) {
            kvf_error("%s: the projections fused at load are stored in different dtypes or"
                      " widths (%s, %s)", what, kvf_dtype_name(parts[0].dtype),
                      kvf_dtype_name(parts[i].dtype));
            return KVF_ERR_UNSUPPORTED;
        }
        rows += parts[i].rows;
    }
    out->data = kvf_alloc((size_t)rows * (size_t)parts[0].cols * esz);
    if (out->data == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int i = 0; i < n; ++i) {
        size_t bytes = (size_t)parts[i].rows * (size_t)parts[i].cols * esz;
        memcpy((char *)out->data + off, parts[i].data, bytes);
        off += bytes;
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
        status = kvf_mat_concat(parts, 3, "q, k and v", &w->qkv);
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
        KVF_LOAD(kvf_load_norm(ld, kvf_lname(ld, l, "self_attn.q_norm.weight"), hd, &w->q_norm));
        KVF_LOAD(kvf_load_norm(ld, kvf_lname(ld, l, "self_attn.k_norm.weight"), hd, &w->k_norm));
    }
    return KVF_OK;
}

/*
 * An MLP's column slice [c0, c0 + C) of intermediate I: prefix "mixer" (up,
 * down) or "mlp" (gate, up, down: gate rows first, then up rows, fused).
 */
kvf_status_t kvf_load_mlp_part(kvf_loader_t *ld, const kvf_model_config_t *cfg, int rank, int l,
                               const char *pfx, bool gated, int64_t I, int64_t c0, int64_t C,
                               kvf_mat_t *up, float **up_b, kvf_mat_t *down, float **down_b)
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

/* The arrays of this rank's experts' matrices. */
kvf_status_t kvf_alloc_experts(const kvf_shard_t *s, kvf_layer_w_t *w)
{
    w->exp_up = calloc((size_t)(s->moe_experts ? s->moe_experts : 1), sizeof(kvf_mat_t));
    w->exp_down = calloc((size_t)(s->moe_experts ? s->moe_experts : 1), sizeof(kvf_mat_t));
    return ((w->exp_up == NULL) || (w->exp_down == NULL)) ? KVF_ERR_NO_MEMORY : KVF_OK;
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
    KVF_LOAD(kvf_alloc_experts(s, w));
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

/* granitemoehybrid's fused MLP: input_linear [2I][H] (gate rows, then up rows) as the
 * gated layout's rows {c0, C} and {I + c0, C}; output_linear [H][I] columns [c0, c0 + C). */
static kvf_status_t kvf_load_fused_mlp(kvf_loader_t *ld, const kvf_model_config_t *cfg, int l,
                                       int64_t I, int64_t c0, int64_t C, kvf_mat_t *up,
                                       kvf_mat_t *down)
{
    const int64_t H = cfg->hidden_size;
    const int64_t r[2][2] = {{c0, C}, {I + c0, C}};
    kvf_status_t status;

    KVF_LOAD(kvf_load_mat_rows(ld, kvf_lname(ld, l, "shared_mlp.input_linear.weight"), 2 * I, H,
                               r, 2, up));
    return kvf_load_mat_cols(ld, kvf_lname(ld, l, "shared_mlp.output_linear.weight"), H, I, c0,
                             C, down);
}

/*
 * granitemoehybrid's FFN: the shared MLP's column slice; with experts, also the router
 * (replicated) and this rank's whole experts, rows of the 3-D tensors [E][2I][H] (gate|up)
 * and [E][H][I].
 */
static kvf_status_t kvf_load_granite_ffn(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                         const kvf_shard_t *s, int l, kvf_layer_w_t *w)
{
    const int64_t H = cfg->hidden_size, E = cfg->moe_num_experts, I = cfg->moe_intermediate_size;
    const int64_t rshape[2] = {E, H}, ushape[3] = {E, 2 * I, H}, dshape[3] = {E, H, I};
    kvf_status_t status;

    if (!cfg->moe_in_layer) {
        return kvf_load_fused_mlp(ld, cfg, l, cfg->intermediate_size, s->mlp_col_start,
                                  s->mlp_cols, &w->up, &w->down);
    }
    KVF_LOAD(kvf_load_fused_mlp(ld, cfg, l, cfg->moe_shared_intermediate_size,
                                s->moe_shared_col_start, s->moe_shared_cols, &w->sh_up,
                                &w->sh_down));
    KVF_LOAD(kvf_load_vec(ld, kvf_lname(ld, l, "block_sparse_moe.router.layer.weight"), 2,
                          rshape, &w->router_w));
    w->router_b = calloc((size_t)E, sizeof(float));   /* no score correction: zero */
    if (w->router_b == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    KVF_LOAD(kvf_alloc_experts(s, w));
    for (int e = 0; e < s->moe_experts; ++e) {
        const int64_t r[1][2] = {{s->moe_expert_start + e, 1}};
        KVF_LOAD(kvf_load_part(ld, kvf_lname(ld, l, "block_sparse_moe.input_linear.weight"), 3,
                               ushape, r, 1, 0, -1, true, &w->exp_up[e].data,
                               &w->exp_up[e].dtype));
        w->exp_up[e].rows = (int)(2 * I);
        w->exp_up[e].cols = (int)H;
        KVF_LOAD(kvf_load_part(ld, kvf_lname(ld, l, "block_sparse_moe.output_linear.weight"), 3,
                               dshape, r, 1, 0, -1, true, &w->exp_down[e].data,
                               &w->exp_down[e].dtype));
        w->exp_down[e].rows = (int)H;
        w->exp_down[e].cols = (int)I;
    }
    return KVF_OK;
}

/* The FFN after a layer's mixer (cfg->dense_mlp_in_layer): dense archs' "mlp", bamba's
 * "feed_forward" (gated MLPs, column slices), granitemoehybrid's shared MLP and experts. */
static kvf_status_t kvf_load_ffn(kvf_loader_t *ld, const kvf_model_config_t *cfg,
                                 const kvf_shard_t *s, int l, kvf_layer_w_t *w)
{
    if (cfg->arch == KVF_ARCH_GRANITE_MOE_HYBRID) {
        return kvf_load_granite_ffn(ld, cfg, s, l, w);
    }
    if (cfg->arch == KVF_ARCH_GPT_OSS) {   /* and its attention sinks */
        return kvf_model_load_gpt_oss(ld->ck, cfg, s, l, w, &ld->bytes);
    }
    if (cfg->layer_sparse[l]) {
        return kvf_load_qn_moe(ld, cfg, s, l, w);   /* qwen3_next's experts */
    }
    return kvf_load_mlp_part(ld, cfg, s->tp_rank, l,
                             (cfg->arch == KVF_ARCH_BAMBA) ? "feed_forward" : "mlp",
                             cfg->mlp_gated, cfg->intermediate_size, s->mlp_col_start,
                             s->mlp_cols, &w->up, &w->up_bias, &w->down, &w->down_bias);
}

static void kvf_layer_w_free(kvf_model_h m, kvf_layer_w_t *w, int experts)
{
    void *ptrs[] = {
        w->in_proj.data, w->in_bias, w->conv_w, w->conv_b, w->dt_bias, w->A_log, w->D,
        w->gnorm_w, w->out_proj.data, w->out_bias, w->qkv.data, w->qkv_bias, w->o_proj.data,
        w->o_bias, w->q_norm, w->k_norm, w->up.data, w->up_bias, w->down.data, w->down_bias,
        w->router_w, w->router_b, w->sh_up.data, w->sh_down.data, w->sh_up_b, w->sh_down_b,
        w->sinks, w->router_lin_b, w->exp_up_b, w->exp_down_b, w->sh_gate,
    };
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); ++i) {
        kvf_model_wfree(m, ptrs[i]);
    }
    for (int e = 0; (w->exp_up != NULL) && (e < experts); ++e) {
        kvf_model_wfree(m, w->exp_up[e].data);
        kvf_model_wfree(m, w->exp_down[e].data);
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
            kvf_layer_w_free(model, &model->ranks[r].layers[l],
                             model->ranks[r].shard.moe_experts);
        }
        free(model->ranks[r].layers);
        if (model->ranks[r].rep != NULL) {
            kvf_model_rep_free(model, model->ranks[r].rep);
            free(model->ranks[r].rep);
        }
    }
    kvf_model_rep_free(model, &model->rep);
    free(model->ranks);
    free(model->gpu_devs);
    free(model);
}

/* YaRN's frequency @a i of base frequency @a f (transformers' _compute_yarn_parameters, fp32):
 * a linear ramp over the pair index between the correction dims of beta_fast and beta_slow
 * blends 1 / (factor p) (interpolation) into 1 / p (extrapolation), p = theta^(2i / dim). */
static float kvf_rope_yarn_freq(const kvf_rope_t *r, int i)
{
    const float p = powf((float)r->theta, (float)(2 * i) / (float)r->rotary_dim);
    const double dim = r->rotary_dim, lb = 2.0 * log(r->theta);
    double lo = dim * log(r->original_max_pos / (r->beta_fast * 2.0 * M_PI)) / lb;
    double hi = dim * log(r->original_max_pos / (r->beta_slow * 2.0 * M_PI)) / lb;
    float ramp, ext;

    if (r->truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    lo = (lo > 0.0) ? lo : 0.0;
    hi = (hi < dim - 1.0) ? hi : dim - 1.0;
    if (lo == hi) {
        hi += 0.001;   /* transformers' guard against a zero-width ramp */
    }
    ramp = ((float)i - (float)lo) / ((float)hi - (float)lo);
    ramp = (ramp < 0.0f) ? 0.0f : (ramp > 1.0f) ? 1.0f : ramp;
    ext = 1.0f - ramp;
    return (1.0f / ((float)r->factor * p)) * (1.0f - ext) + (1.0f / p) * ext;
}

/* RoPE inverse frequencies as transformers computes them (fp32). */
static float *kvf_rope_inv_freq(const kvf_rope_t *r)
{
    const int half = r->rotary_dim / 2;
    float *inv = kvf_alloc((size_t)half * sizeof(float));

    if (inv == NULL) {
        return NULL;
    }
    for (int i = 0; i < half; ++i) {
        float f = 1.0f / powf((float)r->theta, (float)(2 * i) / (float)r->rotary_dim);
        if (r->type == KVF_ROPE_YARN) {
            f = kvf_rope_yarn_freq(r, i);
        } else if (r->type == KVF_ROPE_LINEAR) {
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
    if (cfg->dense_mlp_in_layer) {   /* the layer's FFN: gated (2C rows of proj, C of g) */
        const bool moe = kvf_model_layer_has_moe(cfg, l);
        int c = moe ? s->moe_shared_cols : s->mlp_cols;
        c = (moe && (cfg->moe_intermediate_size > c)) ? cfg->moe_intermediate_size : c;
        rows = (2 * c > rows) ? 2 * c : rows;
        inner = (c > inner) ? c : inner;
    }
    *inner_p = inner;
    return rows;
}

static kvf_status_t kvf_load_embeddings(kvf_loader_t *ld, kvf_model_h m)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const int64_t V = cfg->vocab_size, H = cfg->hidden_size;
    const int64_t all[1][2] = {{0, V}};
    kvf_status_t status;
    char name[160];

    snprintf(name, sizeof(name), "%s.embed_tokens.weight", ld->prefix);
    KVF_LOAD(kvf_load_mat_rows(ld, ld->dense ? name : "backbone.embeddings.weight", V, H, all,
                               1, &m->rep.embed));
    snprintf(name, sizeof(name), "%s.%s.weight", ld->prefix,
             (cfg->arch == KVF_ARCH_BAMBA) ? "final_layernorm" : "norm");
    KVF_LOAD(kvf_load_norm(ld, ld->dense ? name : "backbone.norm_f.weight", H,
                           &m->rep.norm_f));
    /* tied: lm_head = embeddings, unless the file stores an lm_head.weight
     * (transformers 5 then keeps the stored head) */
    if (cfg->lm_head_tied && (kvf_ckpt_find(ld->ck, "lm_head.weight") != NULL)) {
        m->cfg.lm_head_tied = false;
    }
    if (m->cfg.lm_head_tied) {
        m->rep.lm_head = m->rep.embed;
        return KVF_OK;
    }
    return kvf_load_mat_rows(ld, "lm_head.weight", V, H, all, 1, &m->rep.lm_head);
}

/* Layer @a l's replicated norms: its pre-norm, a dense layer's FFN pre-norm, and
 * gemma3_text's attention-output and MLP-output norms. */
static kvf_status_t kvf_load_layer_norms(kvf_loader_t *ld, kvf_model_h m, int l)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const int H = cfg->hidden_size;
    kvf_status_t status;

    status = kvf_load_norm(ld, kvf_lname(ld, l, ld->dense ? "input_layernorm.weight" :
                                         "norm.weight"), H, &m->rep.norm_w[l]);
    if ((status == KVF_OK) && ld->dense) {
        /* the FFN's pre-norm: gemma3_text's post_attention_layernorm is the attention
         * output's norm (kvf_rep_w_t.post_w) */
        status = kvf_load_norm(ld, kvf_lname(ld, l, (cfg->arch == KVF_ARCH_BAMBA) ?
                                             "pre_ff_layernorm.weight" : cfg->post_norms ?
                                             "pre_feedforward_layernorm.weight" :
                                             "post_attention_layernorm.weight"), H,
                               &m->rep.norm2_w[l]);
    }
    if ((status == KVF_OK) && cfg->post_norms) {
        status = kvf_load_norm(ld, kvf_lname(ld, l, "post_attention_layernorm.weight"), H,
                               &m->rep.post_w[2 * l]);
    }
    if ((status == KVF_OK) && cfg->post_norms) {
        status = kvf_load_norm(ld, kvf_lname(ld, l, "post_feedforward_layernorm.weight"), H,
                               &m->rep.post_w[2 * l + 1]);
    }
    return status;
}

kvf_status_t kvf_model_load(const char *dir, int tp_size, kvf_model_h *model_p)
{
    return kvf_model_load_device(dir, tp_size, NULL, model_p);
}

kvf_status_t kvf_model_load_device(const char *dir, int tp_size, const kvf_device_t *dev,
                                   kvf_model_h *model_p)
{
    const bool gpu = (dev != NULL) && (dev->kind != KVF_DEVICE_CPU);
    kvf_loader_t ld = {0};
    kvf_model_h m;
    kvf_model_config_t *cfg;
    kvf_status_t status;

    m = calloc(1, sizeof(*m));
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
    if (gpu) {
        status = kvf_model_gpu_open(m, dev);   /* every rank's GPU, before reading weights */
        if (status != KVF_OK) {
            goto err;
        }
    }
    ld.dense = (cfg->arch != KVF_ARCH_NEMOTRON_H);
    ld.prefix = !ld.dense ? "backbone" : cfg->mm_text ? "model.language_model" : "model";
    if (cfg->mm_text) {   /* the explicit rule: model.visual.* is never read */
        kvf_warn("%s: model_type '%s': vision tower not loaded: text-only serving (the"
                 " model.language_model. weights and lm_head)", dir, cfg->model_type);
    }
    ld.mamba = ld.dense ? "mamba" : "mixer";
    ld.norm_offset = (float)cfg->norm_offset;
    status = kvf_ckpt_open(dir, &ld.ck);
    if (status != KVF_OK) {
        goto err;
    }
    m->file_bytes = kvf_ckpt_bytes(ld.ck);
    m->num_files = kvf_ckpt_num_files(ld.ck);
    status = kvf_load_embeddings(&ld, m);
    m->rep.norm_w = calloc((size_t)cfg->num_layers, sizeof(*m->rep.norm_w));
    m->rep.norm2_w = calloc((size_t)cfg->num_layers, sizeof(*m->rep.norm2_w));
    m->rep.post_w = calloc((size_t)cfg->num_layers * 2, sizeof(*m->rep.post_w));
    m->ranks = calloc((size_t)tp_size, sizeof(*m->ranks));   /* .dev zero: the CPU */
    if ((status == KVF_OK) && ((m->rep.norm_w == NULL) || (m->rep.norm2_w == NULL) ||
                               (m->rep.post_w == NULL) || (m->ranks == NULL))) {
        status = KVF_ERR_NO_MEMORY;
    }
    if ((status == KVF_OK) && (cfg->rope.type != KVF_ROPE_NONE)) {
        m->rep.inv_freq = kvf_rope_inv_freq(&cfg->rope);
        status = (m->rep.inv_freq != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
    }
    if ((status == KVF_OK) && (cfg->rope_local.type != KVF_ROPE_NONE)) {
        m->rep.inv_freq_local = kvf_rope_inv_freq(&cfg->rope_local);
        status = (m->rep.inv_freq_local != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
    }
    for (int l = 0; (status == KVF_OK) && (l < cfg->num_layers); ++l) {
        status = kvf_load_layer_norms(&ld, m, l);
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
                status = (cfg->state_kind == KVF_STATE_GDN) ? kvf_load_gdn(&ld, cfg, s, l, w) :
                         kvf_load_mamba(&ld, cfg, s, l, w);
                break;
            case KVF_LAYER_ATTENTION:
                status = cfg->attn_output_gate ? kvf_load_gated_attention(&ld, cfg, s, l, w) :
                         kvf_load_attention(&ld, cfg, s, l, w);
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
            if ((status == KVF_OK) && cfg->dense_mlp_in_layer) {
                status = kvf_load_ffn(&ld, cfg, s, l, w);
            }
            rows = kvf_layer_rows(cfg, rw, w, l, &inner);
            rw->max_rows = (rows > rw->max_rows) ? rows : rw->max_rows;
            rw->max_inner = (inner > rw->max_inner) ? inner : rw->max_inner;
        }
    }
    m->weight_bytes = ld.bytes;
    kvf_ckpt_close(ld.ck);
    if ((status == KVF_OK) && gpu) {
        status = kvf_model_upload(m);
    }
    if (status != KVF_OK) {
        goto err;
    }
    *model_p = m;
    return KVF_OK;

err:
    kvf_model_destroy(m);
    return status;
}

const kvf_device_t *kvf_model_device(kvf_model_h model)
{
    return &model->dev;
}

const kvf_device_t *kvf_model_rank_device(kvf_model_h model, int rank)
{
    return &model->ranks[rank].dev;
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

/* ---- the device workspace's size ------------------------------------------ */

static size_t kvf_ws_a(size_t bytes)   /* an arena piece: 256-byte aligned */
{
    return (bytes + 255u) / 256u * 256u;
}

static size_t kvf_ws_s(size_t bytes)   /* a staging piece: 64-byte aligned */
{
    return (bytes + 63u) / 64u * 64u;
}

static size_t kvf_ws_max(size_t a, size_t b)
{
    return (a > b) ? a : b;
}

/*
 * The formula (docs: kernels/README.md, "Workspaces"). Arena: the largest
 * scratch ONE launcher holds at once (they free in LIFO order before
 * returning, so calls never add up), each piece rounded to 256 bytes:
 *   attention (kvf_attn_write_paged_seqs): (2T + S*B) int32 of rows,
 *     positions and block tables + T*q_heads*splits*(hd+2) fp32 split-K
 *     partials when splits > 1, splits = kvf_attn_split_count() of the
 *     longest context C (a request cannot outgrow the model's positions or
 *     the pool: min of the two);
 *   MoE routing: T*2E floats + T*2E bools;
 *   Mamba2 scan: mamba_heads*head_dim*state floats; the chunked (SSD) prompt scan
 *     when it is on (kvf_model_set_state_grid): kvf_ssd_scratch_bytes() of T tokens at
 *     any position on the model's grid (KVF_SSD_MAX_GRID before it is set), a Gated
 *     DeltaNet model's kvf_gdn_scratch_bytes() alike;
 *   batched Mamba decode: S*(two pointers, an int, a float);
 *   gated norm: T*n_groups floats; gathers, RoPE: T int32; scatter: T*8;
 *   block zeroing: F int64 page ids;
 * plus one piece of slack. Staging: every host input ONE step uploads
 * (each rounded to 64 bytes), held twice (two halves, see kvf_ws_alloc.h):
 *   embedding ids T*4; per attention layer (2T + S*B)*4 + 2 RoPE position
 *   copies T*4; per Mamba layer S*24; per MoE layer 3*T*top_k*4 + 3*E*64
 *   (each expert's rows and weights); the head's rows S*4; the zeroed page
 *   ids F*8; 4 KiB for the TP collectives' one-float flags.
 * T = max tokens, S = max seqs, B = blocks of one request's table, F = pages
 * zeroed in one step, E = routed experts, hd = head_dim; heads are the
 * rank's shard. The attention term follows kvf_attention_cuda.cu's launcher
 * and changes with it (a request beyond the arena still runs: counted).
 */
void kvf_model_ws_device_bytes(kvf_model_h m, int rank, const kvf_step_limits_t *lim,
                               size_t *device_p, size_t *staging_p)
{
    const kvf_model_config_t *cfg = &m->cfg;
    const kvf_shard_t *s = &m->ranks[rank].shard;
    const size_t T = (size_t)((lim->max_tokens > 0) ? lim->max_tokens : 1);
    const size_t S = (size_t)((lim->max_seqs > 0) ? lim->max_seqs : 1);
    const size_t B = (size_t)((lim->max_blocks > 0) ? lim->max_blocks : 1);
    const size_t F = (size_t)((lim->max_fresh_pages > 0) ? lim->max_fresh_pages : 1);
    const size_t E = (size_t)cfg->moe_num_experts, k = (size_t)cfg->moe_top_k;
    const size_t hd = (size_t)cfg->head_dim;
    size_t n_attn = 0, n_mamba = 0, n_moe = 0, arena = 0, step;

    for (int l = 0; l < cfg->num_layers; ++l) {
        n_attn += (cfg->layer_kinds[l] == KVF_LAYER_ATTENTION) ? 1u : 0u;
        n_mamba += (cfg->layer_kinds[l] == KVF_LAYER_MAMBA) ? 1u : 0u;
        n_moe += kvf_model_layer_has_moe(cfg, l) ? 1u : 0u;
    }
    if (n_attn > 0) {
        const int kbs = (lim->kernel_block_size > 0) ? lim->kernel_block_size : 1;
        const int ctx = (lim->max_context > 0) ? lim->max_context : KVF_ATTN_SPLITS_MAX *
                                                                    KVF_ATTN_SPLIT_TOKENS;
        const size_t splits = (size_t)kvf_attn_split_count(ctx / kbs + 1, kbs);
        arena = kvf_ws_a((2 * T + S * B) * 4) +
                ((splits > 1) ? kvf_ws_a(T * (size_t)s->attn_heads * splits * (hd + 2) * 4) : 0);
    }
    if (n_moe > 0) {
        arena = kvf_ws_max(arena, kvf_ws_a(T * 2 * E * (sizeof(float) + 1)));
    }
    if (n_mamba > 0) {
        arena = kvf_ws_max(arena, kvf_ws_a((size_t)s->mamba_heads *
                                           (size_t)cfg->mamba_head_dim *
                                           (size_t)cfg->ssm_state_size * 4));
        arena = kvf_ws_max(arena, kvf_ws_a(S * (2 * sizeof(void *) + 8)));
        arena = kvf_ws_max(arena, kvf_ws_a(T * (size_t)cfg->n_groups * 4));
        if (kvf_model_scan_chunked(m) == 1) {   /* before the grid is set: the largest */
            const kvf_mamba2_params_t mp = {.heads = s->mamba_heads, .groups = s->groups,
                                            .head_dim = cfg->mamba_head_dim,
                                            .state_size = cfg->ssm_state_size};
            const kvf_gdn_params_t gp = {.heads = s->mamba_heads, .groups = s->groups,
                                         .head_dim = cfg->mamba_head_dim,
                                         .key_dim = cfg->ssm_state_size};
            const int grid = (m->scan_grid > 0) ? m->scan_grid : KVF_SSD_MAX_GRID;
            arena = kvf_ws_max(arena, kvf_ws_a((cfg->state_kind == KVF_STATE_GDN) ?
                                               kvf_gdn_scratch_bytes(&gp, (int)T, grid) :
                                               kvf_ssd_scratch_bytes(&mp, (int)T, -1, grid)));
        }
    }
    arena = kvf_ws_max(arena, 2 * kvf_ws_a(T * 4));
    arena = kvf_ws_max(arena, kvf_ws_a(F * 8));
    *device_p = arena + 256;

    step = kvf_ws_s(T * 4) + kvf_ws_s(S * 4) + kvf_ws_s(F * 8) + 4096;
    step += n_attn * (kvf_ws_s((2 * T + S * B) * 4) + 2 * kvf_ws_s(T * 4));
    step += n_mamba * kvf_ws_s(S * (2 * sizeof(void *) + 8));
    step += n_moe * (3 * T * k * 4 + 3 * E * 64);
    *staging_p = 2 * step;
}
