/*
 * What the transfer planner checks before it emits anything (kvf_xfer_check.h): the params,
 * every geometry re-derived from the model and compared field by field, dtypes, region sizes
 * and block ids. Split from kvf_xfer_plan.c: the checks are one concept, the walk another.
 */
#include "kvf_xfer_check.h"

#include "kvf_log.h"
#include "kvf_tp_map.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int64_t kvf_xfer_ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static kvf_status_t kvf_xfer_geom_check(const kvf_model_config_t *cfg,
                                        const kvf_rank_geometry_t *g, const char *side, int tp,
                                        int rank)
{
    kvf_shard_t s;
    size_t kv_elt = kvf_dtype_size(g->kv_dtype);
    size_t a1;
    kvf_status_t status;

    status = kvf_shard_compute(cfg, tp, rank, &s);
    if (status != KVF_OK) {
        return status;
    }
    if (memcmp(&s, &g->shard, sizeof(s)) != 0) {
        kvf_error("xfer plan: %s rank %d geometry shard (tp_size %d tp_rank %d kv_heads %d"
                  " kv_head_start %d mamba_heads %d groups %d) does not follow from the model"
                  " at tp_size %d (kv_heads %d kv_head_start %d mamba_heads %d groups %d)",
                  side, rank, g->shard.tp_size, g->shard.tp_rank, g->shard.kv_heads,
                  g->shard.kv_head_start, g->shard.mamba_heads, g->shard.groups, tp,
                  s.kv_heads, s.kv_head_start, s.mamba_heads, s.groups);
        return KVF_ERR_INVALID_PARAM;
    }
    if (kv_elt == 0) {
        kvf_error("xfer plan: %s rank %d kv_dtype %d is invalid", side, rank, (int)g->kv_dtype);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((g->block_size <= 0) || (g->kernel_block_size <= 0) || (g->ppl <= 0) ||
        ((int64_t)g->ppl * g->kernel_block_size != g->block_size)) {
        kvf_error("xfer plan: %s rank %d block_size %d kernel_block_size %d ppl %d are"
                  " inconsistent (need block_size = ppl * kernel_block_size > 0)",
                  side, rank, g->block_size, g->kernel_block_size, g->ppl);
        return KVF_ERR_INVALID_PARAM;
    }
    a1 = kvf_attn_bytes_per_token(cfg, s.kv_heads, g->kv_dtype);
    if (g->head_run_bytes != (size_t)g->kernel_block_size * (size_t)cfg->head_dim * kv_elt) {
        kvf_error("xfer plan: %s rank %d head_run_bytes %zu does not match head_dim %d x"
                  " kernel_block_size %d x %s (%zu)",
                  side, rank, g->head_run_bytes, cfg->head_dim, g->kernel_block_size,
                  kvf_dtype_name(g->kv_dtype),
                  (size_t)g->kernel_block_size * (size_t)cfg->head_dim * kv_elt);
        return KVF_ERR_INVALID_PARAM;
    }
    if (g->attn_bytes_per_token != a1) {
        kvf_error("xfer plan: %s rank %d attn_bytes_per_token %zu does not match the model"
                  " (%zu: 2 x %d kv heads x head_dim %d x %s)",
                  side, rank, g->attn_bytes_per_token, a1, s.kv_heads, cfg->head_dim,
                  kvf_dtype_name(g->kv_dtype));
        return KVF_ERR_INVALID_PARAM;
    }
    if ((g->page_size != (size_t)g->block_size * a1) ||
        (g->kernel_block_bytes * (size_t)g->ppl != g->page_size)) {
        kvf_error("xfer plan: %s rank %d page_size %zu kernel_block_bytes %zu do not match"
                  " block_size %d x %zu bytes per token",
                  side, rank, g->page_size, g->kernel_block_bytes, g->block_size, a1);
        return KVF_ERR_INVALID_PARAM;
    }
    if (((int)g->kv_layout < 0) || ((int)g->kv_layout >= KVF_KV_LAYOUT_COUNT)) {
        kvf_error("xfer plan: %s rank %d kv_layout %d is not a KV cache layout (layer-major,"
                  " head-major)", side, rank, (int)g->kv_layout);
        return KVF_ERR_INVALID_PARAM;
    }
    {
        int slots = kvf_cache_slots(cfg);
        kvf_kv_strides_t st = kvf_kv_strides_make((int)g->kv_layout, slots, g->page_size,
                                                  g->ppl, s.kv_heads, g->kernel_block_size,
                                                  cfg->head_dim, kv_elt);
        if ((g->slots != slots) || (memcmp(&st, &g->attn, sizeof(st)) != 0)) {
            kvf_error("xfer plan: %s rank %d %s strides (slots %d block %zu head %zu slot %zu"
                      " kblock %zu kv %zu) do not follow from the model (slots %d block %zu"
                      " head %zu slot %zu kblock %zu kv %zu)", side, rank,
                      kvf_kv_layout_name((int)g->kv_layout), g->slots, g->attn.block,
                      g->attn.head, g->attn.slot, g->attn.kblock, g->attn.kv, slots, st.block,
                      st.head, st.slot, st.kblock, st.kv);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    if (kvf_model_is_hybrid(cfg)) {
        size_t conv_elt = kvf_dtype_size(g->conv_dtype);
        size_t ssm_elt = kvf_dtype_size(g->ssm_dtype);
        size_t conv = (size_t)s.conv_dim * (size_t)(cfg->conv_kernel - 1) * conv_elt;
        size_t ssm = (size_t)s.mamba_heads * (size_t)cfg->mamba_head_dim *
                     (size_t)cfg->ssm_state_size * ssm_elt;
        if ((conv_elt == 0) || (ssm_elt == 0) || (g->conv_bytes != conv) ||
            (g->ssm_bytes != ssm) || (g->mamba_bytes != conv + ssm) ||
            (g->mamba_bytes > g->page_size)) {
            kvf_error("xfer plan: %s rank %d Mamba sizes conv %zu ssm %zu total %zu page %zu"
                      " do not match the model (conv %zu ssm %zu)",
                      side, rank, g->conv_bytes, g->ssm_bytes, g->mamba_bytes, g->page_size,
                      conv, ssm);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    return KVF_OK;
}

static kvf_status_t kvf_xfer_region_bytes(int64_t num_blocks, int slots, size_t page_size,
                                          const char *side, int rank, uint64_t *bytes_p)
{
    uint64_t pages;
    if ((num_blocks <= 0) || (slots <= 0) ||
        __builtin_mul_overflow((uint64_t)num_blocks, (uint64_t)slots, &pages) ||
        __builtin_mul_overflow(pages, (uint64_t)page_size, bytes_p)) {
        kvf_error("xfer plan: %s rank %d num_blocks %" PRId64 " x slots %d x page_size %zu"
                  " is not a valid region size", side, rank, num_blocks, slots, page_size);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

static kvf_status_t kvf_xfer_ids_check(const int32_t *ids, int num, int64_t need,
                                       int64_t num_blocks, const char *side, int group)
{
    if (num < need) {
        kvf_error("xfer plan: group %d has %d %s block ids, %" PRId64 " needed for the tokens",
                  group, num, side, need);
        return KVF_ERR_OUT_OF_RANGE;
    }
    if ((num > 0) && (ids == NULL)) {
        kvf_error("xfer plan: group %d %s block ids is NULL with %d ids", group, side, num);
        return KVF_ERR_INVALID_PARAM;
    }
    for (int i = 0; i < num; ++i) {
        if ((ids[i] < 0) || ((int64_t)ids[i] >= num_blocks)) {
            kvf_error("xfer plan: group %d %s block id %" PRId32 " (index %d) is outside"
                      " [0, %" PRId64 ")", group, side, ids[i], i, num_blocks);
            return KVF_ERR_OUT_OF_RANGE;
        }
    }
    return KVF_OK;
}

static int kvf_xfer_cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Two groups (or one group twice) writing one local block would overwrite each other. */
static kvf_status_t kvf_xfer_local_dups_check(const kvf_xfer_plan_params_t *p)
{
    size_t total = 0, n = 0;
    int32_t *all;
    kvf_status_t status = KVF_OK;

    for (int g = 0; g < p->num_groups; ++g) {
        total += (size_t)p->groups[g].num_local;
    }
    if (total < 2) {
        return KVF_OK;
    }
    all = malloc(total * sizeof(*all));
    if (all == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int g = 0; g < p->num_groups; ++g) {
        if (p->groups[g].num_local <= 0) {
            continue;
        }
        memcpy(all + n, p->groups[g].local_ids, (size_t)p->groups[g].num_local * sizeof(*all));
        n += (size_t)p->groups[g].num_local;
    }
    qsort(all, n, sizeof(*all), kvf_xfer_cmp_i32);
    for (size_t i = 1; i < n; ++i) {
        if (all[i] == all[i - 1]) {
            kvf_error("xfer plan: local block id %" PRId32 " appears twice in the request",
                      all[i]);
            status = KVF_ERR_INVALID_PARAM;
            break;
        }
    }
    free(all);
    return status;
}

kvf_status_t kvf_xfer_params_check(const kvf_xfer_plan_params_t *p)
{
    if (p == NULL) {
        kvf_error("xfer plan: params is NULL");
        return KVF_ERR_INVALID_PARAM;
    }
    if (p->field_mask & ~KVF_XFER_PLAN_PARAM_FIELDS_KNOWN) {
        kvf_error("xfer plan: unknown params field_mask bits 0x%" PRIx64,
                  p->field_mask & ~(uint64_t)KVF_XFER_PLAN_PARAM_FIELDS_KNOWN);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((p->cfg == NULL) || (p->layout == NULL) || (p->local_geom == NULL) ||
        (p->remote_geoms == NULL) || (p->remote_num_blocks == NULL) ||
        ((p->groups == NULL) && (p->num_groups > 0))) {
        kvf_error("xfer plan: cfg, layout, local_geom, remote_geoms, remote_num_blocks and"
                  " groups must be set");
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_tp_ratio(p->remote_tp, p->local_tp) == 0) {
        kvf_error("xfer plan: tp_size prefill %d decode %d: neither divides the other",
                  p->remote_tp, p->local_tp);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((p->local_rank < 0) || (p->local_rank >= p->local_tp)) {
        kvf_error("xfer plan: local_rank %d is outside [0, %d)", p->local_rank, p->local_tp);
        return KVF_ERR_INVALID_PARAM;
    }
    if (p->num_groups != p->layout->num_groups) {
        kvf_error("xfer plan: num_groups %d does not match the cache layout's %d groups",
                  p->num_groups, p->layout->num_groups);
        return KVF_ERR_INVALID_PARAM;
    }
    if (p->num_tokens < 1) {
        kvf_error("xfer plan: num_tokens %" PRId64 " must be at least 1", p->num_tokens);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((p->field_mask & KVF_XFER_PLAN_PARAM_FIELD_SKIP) &&
        ((p->skip_tokens < 0) || (p->skip_tokens > p->num_tokens) ||
         (p->skip_tokens % p->local_geom->block_size != 0))) {
        kvf_error("xfer plan: skip_tokens %" PRId64 " must be a multiple of the local"
                  " block_size %d within num_tokens %" PRId64, p->skip_tokens,
                  p->local_geom->block_size, p->num_tokens);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

static kvf_status_t kvf_xfer_dtype_match(const char *field, kvf_dtype_t local, kvf_dtype_t remote,
                                         int rank)
{
    if (local != remote) {
        kvf_error("xfer plan: %s prefill=%s decode=%s (prefill rank %d): no conversion on"
                  " transfer", field, kvf_dtype_name(remote), kvf_dtype_name(local), rank);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* Prefill rank @a r's geometry re-derived from the model, and its dtypes against ours. */
static kvf_status_t kvf_xfer_remote_geom_check(const kvf_xfer_plan_params_t *p, int r)
{
    const kvf_model_config_t *cfg = p->cfg;
    const kvf_rank_geometry_t *rg = &p->remote_geoms[r];
    kvf_status_t status;

    status = kvf_xfer_geom_check(cfg, rg, "prefill", p->remote_tp, r);
    if (status != KVF_OK) {
        return status;
    }
    if ((status = kvf_xfer_dtype_match("kv_dtype", p->local_geom->kv_dtype, rg->kv_dtype,
                                       r)) != KVF_OK) {
        return status;
    }
    if (kvf_model_is_hybrid(cfg) &&
        (((status = kvf_xfer_dtype_match("conv_dtype", p->local_geom->conv_dtype,
                                         rg->conv_dtype, r)) != KVF_OK) ||
         ((status = kvf_xfer_dtype_match("ssm_dtype", p->local_geom->ssm_dtype,
                                         rg->ssm_dtype, r)) != KVF_OK))) {
        return status;
    }
    return KVF_OK;
}

kvf_status_t kvf_xfer_geoms_check(const kvf_xfer_plan_params_t *p)
{
    int ranks[1024];
    int num_ranks = 0;
    kvf_status_t status;

    status = kvf_xfer_geom_check(p->cfg, p->local_geom, "decode", p->local_tp, p->local_rank);
    if (status != KVF_OK) {
        return status;
    }
    if (p->remote_tp > (int)(sizeof(ranks) / sizeof(ranks[0]))) {
        kvf_error("xfer plan: prefill tp_size %d exceeds %zu", p->remote_tp,
                  sizeof(ranks) / sizeof(ranks[0]));
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_tp_source_ranks(p->cfg, p->remote_tp, p->local_tp, p->local_rank, ranks,
                                 &num_ranks);
    for (int i = 0; (i < num_ranks) && (status == KVF_OK); ++i) {
        status = kvf_xfer_remote_geom_check(p, ranks[i]);
    }
    return status;
}

kvf_status_t kvf_xfer_plan_check(const kvf_xfer_plan_params_t *p, uint64_t *local_region_p,
                                 uint64_t *remote_region, bool *reads, bool geoms_checked)
{
    int slots = p->layout->slots;
    const kvf_model_config_t *cfg = p->cfg;
    int ranks[1024];
    int num_ranks = 0, rblock = 0;
    int64_t rmin_blocks = INT64_MAX;
    kvf_status_t status;

    if (!geoms_checked) {
        status = kvf_xfer_geom_check(cfg, p->local_geom, "decode", p->local_tp, p->local_rank);
        if (status != KVF_OK) {
            return status;
        }
    }
    status = kvf_xfer_region_bytes(p->local_num_blocks, slots, p->local_geom->page_size,
                                   "decode", p->local_rank, local_region_p);
    if (status != KVF_OK) {
        return status;
    }
    if (p->remote_tp > (int)(sizeof(ranks) / sizeof(ranks[0]))) {
        kvf_error("xfer plan: prefill tp_size %d exceeds %zu", p->remote_tp,
                  sizeof(ranks) / sizeof(ranks[0]));
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_tp_source_ranks(cfg, p->remote_tp, p->local_tp, p->local_rank, ranks,
                                 &num_ranks);
    if (status != KVF_OK) {
        return status;
    }
    for (int i = 0; i < num_ranks; ++i) {
        int r = ranks[i];
        const kvf_rank_geometry_t *rg = &p->remote_geoms[r];
        reads[r] = true;
        if (!geoms_checked && ((status = kvf_xfer_remote_geom_check(p, r)) != KVF_OK)) {
            return status;
        }
        if ((i > 0) && (rg->block_size != rblock)) {
            kvf_error("xfer plan: prefill ranks disagree on block_size (%d and %d)", rblock,
                      rg->block_size);
            return KVF_ERR_INVALID_PARAM;
        }
        rblock = rg->block_size;
        status = kvf_xfer_region_bytes(p->remote_num_blocks[r], slots, rg->page_size,
                                       "prefill", r, &remote_region[r]);
        if (status != KVF_OK) {
            return status;
        }
        if (p->remote_num_blocks[r] < rmin_blocks) {
            rmin_blocks = p->remote_num_blocks[r];
        }
    }
    for (int g = 0; g < p->num_groups; ++g) {
        const kvf_xfer_group_blocks_t *gb = &p->groups[g];
        bool attn = kvf_group_is_attention(p->layout->groups[g].kind);
        int64_t lneed = attn ? kvf_xfer_ceil_div(p->num_tokens, p->local_geom->block_size) : 1;
        int64_t rneed = attn ? kvf_xfer_ceil_div(p->num_tokens, rblock) : 1;
        status = kvf_xfer_ids_check(gb->local_ids, gb->num_local, lneed, p->local_num_blocks,
                                    "local", g);
        if (status != KVF_OK) {
            return status;
        }
        status = kvf_xfer_ids_check(gb->remote_ids, gb->num_remote, rneed, rmin_blocks,
                                    "remote", g);
        if (status != KVF_OK) {
            return status;
        }
    }
    return kvf_xfer_local_dups_check(p);
}
