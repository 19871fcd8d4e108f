/*
 * Per-rank cache geometry and block-size alignment.
 *
 * Design: sizes are computed from the shard (kvf_shard.c), never by scaling
 * the TP1 size by 1/tp: when tp > n_groups the B/C groups are replicated, so
 * "M_rank * tp" over-counts and is not TP-stable (the tiny hybrid gets 96 at
 * TP4 from it instead of 80). TP-stable alignment instead evaluates the
 * Mamba/attention ratio at every TP degree the model can be sharded to and
 * takes the largest, so the result depends on the model and dtypes alone.
 * Rejected alternative: negotiating the block size at handshake, which
 * would make a running pool's block size depend on which peer came first.
 */
#include "kvf_geometry.h"
#include "kvf_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void kvf_cache_params_default(const kvf_model_config_t *cfg, kvf_cache_params_t *params_p)
{
    memset(params_p, 0, sizeof(*params_p));
    params_p->kv_dtype = KVF_DTYPE_BF16;
    /* as vLLM: conv state in the model dtype, SSM state in mamba_ssm_cache_dtype */
    params_p->ssm_dtype = (cfg != NULL) ? cfg->ssm_cache_dtype : KVF_DTYPE_FP32;
    params_p->conv_dtype = (cfg != NULL) ? cfg->torch_dtype : KVF_DTYPE_BF16;
    params_p->user_block_size = KVF_MIN_ALIGN_TOKENS;
    params_p->align = KVF_ALIGN_TP_STABLE;
    params_p->kernel_sizes.multiple_of = 16;
}

kvf_status_t kvf_kv_layout_parse(const char *text, const char *what, kvf_kv_layout_t *layout_p)
{
    for (int i = 0; i < KVF_KV_LAYOUT_COUNT; ++i) {
        if ((text != NULL) && (strcmp(text, kvf_kv_layout_name(i)) == 0)) {
            *layout_p = (kvf_kv_layout_t)i;
            return KVF_OK;
        }
    }
    kvf_error("%s '%s' is not a KV cache layout (layer-major, head-major)", what,
              (text != NULL) ? text : "(null)");
    return KVF_ERR_INVALID_PARAM;
}

/* The group kind of layer @a i, or -1 for a layer without cache (MLP, MoE). */
static int kvf_layer_group_kind(const kvf_model_config_t *cfg, int i)
{
    if (cfg->layer_kinds[i] == KVF_LAYER_MAMBA) {
        return KVF_GROUP_MAMBA;
    }
    if (cfg->layer_kinds[i] != KVF_LAYER_ATTENTION) {
        return -1;
    }
    return (cfg->layer_window[i] > 0) ? KVF_GROUP_SLIDING : KVF_GROUP_ATTENTION;
}

int kvf_cache_slots(const kvf_model_config_t *cfg)
{
    int counts[3] = {0, 0, 0};   /* full attention, sliding attention, Mamba */
    int slots = 0;

    for (int i = 0; i < cfg->num_layers; ++i) {
        const int k = kvf_layer_group_kind(cfg, i);
        counts[0] += (k == KVF_GROUP_ATTENTION);
        counts[1] += (k == KVF_GROUP_SLIDING);
        counts[2] += (k == KVF_GROUP_MAMBA);
    }
    for (int k = 0; k < 3; ++k) {
        if ((counts[k] > 0) && ((slots == 0) || (counts[k] < slots))) {
            slots = counts[k];
        }
    }
    return slots;
}

kvf_status_t kvf_cache_layout_build(const kvf_model_config_t *cfg, kvf_cache_layout_t *layout_p)
{
    /* group index order: full attention, sliding attention, Mamba */
    static const kvf_group_kind_t kinds[3] = {KVF_GROUP_ATTENTION, KVF_GROUP_SLIDING,
                                              KVF_GROUP_MAMBA};
    kvf_cache_layout_t *l = calloc(1, sizeof(*l));

    if (l == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    l->slots = kvf_cache_slots(cfg);
    for (int i = 0; i < cfg->num_layers; ++i) {
        l->layer_group[i] = -1;
        l->layer_slot[i] = -1;
    }
    for (int k = 0; (k < 3) && (l->slots > 0); ++k) {
        int seen = 0;
        int first_group = l->num_groups;
        for (int i = 0; i < cfg->num_layers; ++i) {
            if (kvf_layer_group_kind(cfg, i) != (int)kinds[k]) {
                continue;
            }
            int g = first_group + seen / l->slots;
            if (g >= KVF_MAX_KV_GROUPS) {
                kvf_error("model needs more than %d kv cache groups", KVF_MAX_KV_GROUPS);
                free(l);
                return KVF_ERR_INVALID_PARAM;
            }
            kvf_kv_group_t *grp = &l->groups[g];
            grp->kind = kinds[k];
            grp->layers[grp->num_layers++] = i;
            if ((kinds[k] == KVF_GROUP_SLIDING) && (cfg->layer_window[i] > grp->window)) {
                grp->window = cfg->layer_window[i];
            }
            l->layer_group[i] = g;
            l->layer_slot[i] = seen % l->slots;
            ++seen;
        }
        l->num_groups = first_group + (seen + l->slots - 1) / l->slots;
    }
    *layout_p = *l;
    free(l);
    return KVF_OK;
}

size_t kvf_attn_bytes_per_token(const kvf_model_config_t *cfg, int kv_heads_rank,
                                kvf_dtype_t kv_dtype)
{
    return 2u * (size_t)kv_heads_rank * (size_t)cfg->head_dim * kvf_dtype_size(kv_dtype);
}

static size_t kvf_conv_bytes(const kvf_model_config_t *cfg, const kvf_shard_t *shard,
                             kvf_dtype_t conv_dtype)
{
    return (size_t)shard->conv_dim * (size_t)(cfg->conv_kernel - 1) * kvf_dtype_size(conv_dtype);
}

static size_t kvf_ssm_bytes(const kvf_model_config_t *cfg, const kvf_shard_t *shard,
                            kvf_dtype_t ssm_dtype)
{
    return (size_t)shard->mamba_heads * (size_t)cfg->mamba_head_dim *
           (size_t)cfg->ssm_state_size * kvf_dtype_size(ssm_dtype);
}

size_t kvf_mamba_bytes(const kvf_model_config_t *cfg, const kvf_shard_t *shard,
                       kvf_dtype_t conv_dtype, kvf_dtype_t ssm_dtype)
{
    if (cfg->num_mamba_layers == 0) {
        return 0;
    }
    return kvf_conv_bytes(cfg, shard, conv_dtype) + kvf_ssm_bytes(cfg, shard, ssm_dtype);
}

static int kvf_align_unit(const kvf_cache_params_t *params)
{
    return (params->user_block_size > KVF_MIN_ALIGN_TOKENS) ? params->user_block_size
                                                            : KVF_MIN_ALIGN_TOKENS;
}

static int kvf_round_up(size_t v, int unit)
{
    return (int)(((v + (size_t)unit - 1) / (size_t)unit) * (size_t)unit);
}

/* Tokens an attention page needs to cover one Mamba page at TP @a tp (rank 0). */
static kvf_status_t kvf_min_tokens_at(const kvf_model_config_t *cfg,
                                      const kvf_cache_params_t *params, int tp, int rank,
                                      size_t *tokens_p, size_t *m_p, size_t *a1_p)
{
    kvf_shard_t s;
    kvf_status_t status = kvf_shard_compute(cfg, tp, rank, &s);
    if (status != KVF_OK) {
        return status;
    }
    size_t a1 = kvf_attn_bytes_per_token(cfg, s.kv_heads, params->kv_dtype);
    size_t m = kvf_mamba_bytes(cfg, &s, params->conv_dtype, params->ssm_dtype);
    *tokens_p = (m + a1 - 1) / a1;
    if (m_p != NULL) {
        *m_p = m;
    }
    if (a1_p != NULL) {
        *a1_p = a1;
    }
    return KVF_OK;
}



static bool kvf_dtype_ok(kvf_dtype_t d)
{
    return (unsigned)d < KVF_DTYPE_COUNT;
}

kvf_status_t kvf_block_size_select(const kvf_model_config_t *cfg,
                                   const kvf_cache_params_t *params, int tp_size,
                                   int *block_size_p)
{
    int unit = kvf_align_unit(params);
    size_t need = 0, m = 0, a1 = 0;
    kvf_status_t status;

    if ((params->block_size < 0) || (params->user_block_size < 0)) {
        kvf_error("block_size %d must be positive",
                  (params->block_size < 0) ? params->block_size : params->user_block_size);
        return KVF_ERR_INVALID_PARAM;
    }
    if (!kvf_dtype_ok(params->kv_dtype) || !kvf_dtype_ok(params->conv_dtype) ||
        !kvf_dtype_ok(params->ssm_dtype)) {
        kvf_error("invalid cache dtype");
        return KVF_ERR_INVALID_PARAM;
    }
    if (!kvf_model_is_hybrid(cfg)) {
        *block_size_p = (params->block_size > 0) ? params->block_size :
                        (params->user_block_size > 0) ? params->user_block_size :
                        KVF_MIN_ALIGN_TOKENS;
        return KVF_OK;
    }

    if (params->block_size > 0) {
        /* explicit: must cover every rank's Mamba page at this TP */
        for (int r = 0; r < tp_size; ++r) {
            status = kvf_min_tokens_at(cfg, params, tp_size, r, &need, &m, &a1);
            if (status != KVF_OK) {
                return status;
            }
            if ((size_t)params->block_size < need) {
                kvf_error("block_size %d is too small for rank %d of TP %d: Mamba state needs"
                          " %zu bytes and %zu bytes per token hold %zu; smallest block size"
                          " that fits is %zu (%d as a multiple of %d)",
                          params->block_size, r, tp_size, m, a1,
                          (size_t)params->block_size * a1, need,
                          kvf_round_up(need, KVF_MIN_ALIGN_TOKENS), KVF_MIN_ALIGN_TOKENS);
                return KVF_ERR_INVALID_PARAM;
            }
        }
        *block_size_p = params->block_size;
        return KVF_OK;
    }

    if (params->align == KVF_ALIGN_PER_RANK) {
        status = kvf_min_tokens_at(cfg, params, tp_size, 0, &need, NULL, NULL);
        if (status != KVF_OK) {
            return status;
        }
    } else {
        int max_tp = cfg->num_attention_heads;
        for (int t = 1; t <= max_tp; ++t) {
            size_t n_t;
            if (!kvf_shard_probe(cfg, t)) {   /* heads, KV heads, groups, MLP all divide */
                continue;
            }
            status = kvf_min_tokens_at(cfg, params, t, 0, &n_t, NULL, NULL);
            if (status != KVF_OK) {
                return status;
            }
            if (n_t > need) {
                need = n_t;
            }
        }
        status = kvf_shard_check(cfg, tp_size);   /* the deployment itself must shard */
        if (status != KVF_OK) {
            return status;
        }
    }
    *block_size_p = kvf_round_up(need, unit);
    return KVF_OK;
}

static bool kvf_kernel_accepts(const kvf_kernel_sizes_t *sizes, int n)
{
    for (int i = 0; i < sizes->num_exact; ++i) {
        if (sizes->exact[i] == n) {
            return true;
        }
    }
    return (sizes->multiple_of > 0) && (n % sizes->multiple_of == 0);
}

kvf_status_t kvf_kernel_block_select(const kvf_kernel_sizes_t *sizes, int block_size,
                                     int *kernel_block_size_p)
{
    kvf_kernel_sizes_t dflt = {.multiple_of = 16};
    int best = 0;

    if ((sizes == NULL) || ((sizes->num_exact == 0) && (sizes->multiple_of == 0))) {
        sizes = &dflt;
    }
    if (block_size <= 0) {
        kvf_error("block_size %d must be positive", block_size);
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_kernel_accepts(sizes, block_size)) {
        *kernel_block_size_p = block_size;
        return KVF_OK;
    }
    for (int i = 0; i < sizes->num_exact; ++i) {
        if ((block_size % sizes->exact[i] == 0) && (sizes->exact[i] > best)) {
            best = sizes->exact[i];
        }
    }
    if (best == 0) {
        char buf[128];
        kvf_kernel_sizes_format(sizes, buf, sizeof(buf));
        kvf_error("no attention kernel block size divides block_size %d (kernel accepts %s)",
                  block_size, buf);
        return KVF_ERR_UNSUPPORTED;
    }
    *kernel_block_size_p = best;
    return KVF_OK;
}

kvf_status_t kvf_kernel_sizes_parse(const char *text, kvf_kernel_sizes_t *sizes_p)
{
    kvf_kernel_sizes_t s = {0};
    char buf[256];

    snprintf(buf, sizeof(buf), "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok != NULL;
         tok = strtok_r(NULL, ", ", &save)) {
        char *end;
        long v;
        if ((strncasecmp(tok, "MultipleOf(", 11) == 0) || (strncasecmp(tok, "multiple_of:", 12) == 0)) {
            const char *num = tok + ((tok[8] == '(' || tok[10] == '(') ? 11 : 12);
            v = strtol(num, &end, 10);
            if ((v <= 0) || ((*end != ')') && (*end != '\0'))) {
                kvf_error("bad kernel block size '%s' (expected N or MultipleOf(N))", tok);
                return KVF_ERR_INVALID_PARAM;
            }
            s.multiple_of = (int)v;
            continue;
        }
        v = strtol(tok, &end, 10);
        if ((v <= 0) || (*end != '\0') || (s.num_exact >= KVF_MAX_KERNEL_SIZES)) {
            kvf_error("bad kernel block size '%s' (expected N or MultipleOf(N), at most %d values)",
                      tok, KVF_MAX_KERNEL_SIZES);
            return KVF_ERR_INVALID_PARAM;
        }
        s.exact[s.num_exact++] = (int)v;
    }
    if ((s.num_exact == 0) && (s.multiple_of == 0)) {
        kvf_error("empty kernel block size list");
        return KVF_ERR_INVALID_PARAM;
    }
    *sizes_p = s;
    return KVF_OK;
}

void kvf_kernel_sizes_format(const kvf_kernel_sizes_t *sizes, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; (i < sizes->num_exact) && (n < len); ++i) {
        n += (size_t)snprintf(buf + n, len - n, "%s%d", n ? "," : "", sizes->exact[i]);
    }
    if ((sizes->multiple_of > 0) && (n < len)) {
        snprintf(buf + n, len - n, "%sMultipleOf(%d)", n ? "," : "", sizes->multiple_of);
    }
}

kvf_status_t kvf_rank_geometry_compute(const kvf_model_config_t *cfg,
                                       const kvf_cache_params_t *params,
                                       int tp_size, int tp_rank,
                                       kvf_rank_geometry_t *geom_p)
{
    kvf_rank_geometry_t g;
    kvf_status_t status;

    memset(&g, 0, sizeof(g));
    status = kvf_shard_compute(cfg, tp_size, tp_rank, &g.shard);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_block_size_select(cfg, params, tp_size, &g.block_size);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_kernel_block_select(&params->kernel_sizes, g.block_size, &g.kernel_block_size);
    if (status != KVF_OK) {
        return status;
    }
    g.kv_dtype = params->kv_dtype;
    g.conv_dtype = params->conv_dtype;
    g.ssm_dtype = params->ssm_dtype;
    g.ppl = g.block_size / g.kernel_block_size;
    g.attn_bytes_per_token = kvf_attn_bytes_per_token(cfg, g.shard.kv_heads, params->kv_dtype);
    if (kvf_model_is_hybrid(cfg)) {
        g.conv_bytes = kvf_conv_bytes(cfg, &g.shard, params->conv_dtype);
        g.ssm_bytes = kvf_ssm_bytes(cfg, &g.shard, params->ssm_dtype);
        g.mamba_bytes = g.conv_bytes + g.ssm_bytes;
    }
    g.page_size = (size_t)g.block_size * g.attn_bytes_per_token;
    g.kernel_block_bytes = g.page_size / (size_t)g.ppl;
    g.head_run_bytes = (size_t)g.kernel_block_size * (size_t)cfg->head_dim *
                       kvf_dtype_size(params->kv_dtype);
    if (((int)params->kv_layout < 0) || ((int)params->kv_layout >= KVF_KV_LAYOUT_COUNT)) {
        kvf_error("kv_layout %d is not a KV cache layout (layer-major, head-major)",
                  (int)params->kv_layout);
        return KVF_ERR_INVALID_PARAM;
    }
    g.kv_layout = params->kv_layout;
    g.slots = kvf_cache_slots(cfg);
    g.attn = kvf_kv_strides_make((int)g.kv_layout, g.slots, g.page_size, g.ppl,
                                 g.shard.kv_heads, g.kernel_block_size, cfg->head_dim,
                                 kvf_dtype_size(params->kv_dtype));
    if (g.mamba_bytes > g.page_size) {   /* explicit sizes are checked above; belt and braces */
        kvf_error("page_size %zu is smaller than the Mamba state %zu on rank %d of TP %d",
                  g.page_size, g.mamba_bytes, tp_rank, tp_size);
        return KVF_ERR_INVALID_PARAM;
    }
    if (g.mamba_bytes > 0) {
        g.mamba_padding_pct = 100.0 * (double)(g.page_size - g.mamba_bytes) / (double)g.page_size;
    }
    *geom_p = g;
    return KVF_OK;
}
