/*
 * Transfer planner: descriptors per prefill rank plus tail-zeroing post-ops.
 *
 * Design. The planner walks the decode rank's own cache in memory order
 * (group, block, layer slot, kernel block, K/V, head for attention; x, B, C
 * channel runs then SSM heads for Mamba) and, for every piece the rank needs,
 * asks common/model/kvf_tp_map.h which prefill rank to read and common/model/kvf_shard.h
 * where that piece sits in the prefill rank's page. For attention the local
 * kernel block's token interval is cut at every remote kernel block boundary,
 * so each cut is one contiguous run of one head on both sides and lands in
 * its final place: any pair of logical/kernel block sizes works, in either
 * direction, with no staging buffer and no permutation pass. Runs are
 * coalesced on the fly (with the previous run of the same rank) and again
 * after a per-rank sort by local offset, which makes the result minimal: a
 * descriptor is a local interval whose remote bytes follow one another, and
 * the sorted sweep takes every maximal such interval.
 *
 * Host cost (a plan is built per pull, before the first GET or the gather
 * kernel): a Mamba page's pieces are the same in every layer slot, so they are
 * derived once per plan and only shifted per slot (3672 derivations -> 136 for
 * a 9B decode rank), and so are a whole attention block's when both sides'
 * block and kernel block sizes match (partial blocks and differing sizes take
 * the general walk); the per-rank sort merges the ascending runs the walk
 * already emits instead of calling qsort; the lists start at 256 entries, so a
 * typical pull never regrows them. The output is unchanged, descriptor for
 * descriptor. 4p2d, 8k tokens of the 9B model, decode rank 0, warm (kvf bench
 * --plan-reps): 38.7 -> 6-7 us on the 2-core CPU host; 4p1d 32k: 113 -> 18-28
 * us (tests/bench/results/host_cost_cpu.md).
 *
 * Safety: ids are checked against each side's block count, every geometry is
 * re-derived from the model config and compared field by field (so a
 * handshake cannot smuggle in a page size or head count that does not follow
 * from the model), and every descriptor and zero range is checked against
 * both region sizes as it is emitted. The plan can therefore never address
 * bytes outside a registered region, whatever the peer sent.
 *
 * Rejected alternatives: copying whole remote blocks into a staging buffer and
 * permuting (one more pass over the data and a buffer per request), and
 * reading only the matching block size (breaks 4p2d-style layouts where block
 * sizes differ).
 */
#include "kvf_xfer_plan.h"

#include "kvf_log.h"
#include "kvf_array.h"
#include "kvf_tp_map.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct kvf_xfer_desc_vec {
    kvf_xfer_desc_t *v;
    size_t           n;
    size_t           cap;
} kvf_xfer_desc_vec_t;

typedef struct kvf_xfer_range_vec {
    kvf_xfer_range_t *v;
    size_t            n;
    size_t            cap;
} kvf_xfer_range_vec_t;

/* Build state; lives for one kvf_xfer_plan_create() call. */
typedef struct kvf_xfer_planner {
    const kvf_xfer_plan_params_t *p;
    const kvf_model_config_t     *cfg;
    const kvf_rank_geometry_t    *lg;
    int                           slots;
    bool                          coalesce;
    uint64_t                      local_region;
    uint64_t                     *remote_region;   /* [remote_tp] */
    bool                         *reads;           /* [remote_tp] source ranks */
    kvf_xfer_desc_vec_t          *descs;           /* [remote_tp] */
    kvf_xfer_range_vec_t          zero;
    uint64_t                      attn_bytes;
    uint64_t                      mamba_bytes;
    struct kvf_xfer_piece        *mamba;           /* the Mamba page's pieces, built once */
    size_t                        num_mamba;
    struct kvf_xfer_piece        *attn;            /* a whole attention block's, built once */
    size_t                        num_attn;
    int                           attn_whole;      /* 1: attn holds them; -1: block sizes
                                                    * differ (no such list); 0: not built */
} kvf_xfer_planner_t;

/*
 * One piece of a page to read: bytes from the local page start, from the
 * remote page start of prefill rank @a rank. Every layer slot of every Mamba
 * group reads the same pieces (only the two page offsets move), and so does
 * every whole attention block when both sides' block and kernel block sizes
 * are equal, so they are derived once per plan and emitted per page: 27
 * layers x 136 Mamba pieces of the 9B model's decode rank cost 136
 * derivations, not 3672.
 */
typedef struct kvf_xfer_piece {
    int      rank;
    uint64_t loff;
    uint64_t roff;
    uint64_t len;
} kvf_xfer_piece_t;

static int64_t kvf_xfer_ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* ---------------------------------------------------------------- checks -- */

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

static kvf_status_t kvf_xfer_params_check(const kvf_xfer_plan_params_t *p)
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

/* -------------------------------------------------------------- emitting -- */

static kvf_status_t kvf_xfer_push_desc(kvf_xfer_planner_t *pl, int rank, uint64_t loff,
                                       uint64_t roff, uint64_t len)
{
    kvf_xfer_desc_vec_t *vec = &pl->descs[rank];

    if (!pl->reads[rank]) {   /* kvf_tp_source_ranks() and the per-piece choice disagree */
        kvf_error("xfer plan: internal error: prefill rank %d is not a source rank", rank);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((loff > pl->local_region) || (len > pl->local_region - loff) ||
        (roff > pl->remote_region[rank]) || (len > pl->remote_region[rank] - roff)) {
        kvf_error("xfer plan: descriptor local [%" PRIu64 ", +%" PRIu64 ") of region %" PRIu64
                  " / remote rank %d [%" PRIu64 ", +%" PRIu64 ") of region %" PRIu64
                  " leaves a region", loff, len, pl->local_region, rank, roff, len,
                  pl->remote_region[rank]);
        return KVF_ERR_OUT_OF_RANGE;
    }
    if (pl->coalesce && (vec->n > 0)) {
        kvf_xfer_desc_t *last = &vec->v[vec->n - 1];
        if ((last->local_off + last->len == loff) && (last->remote_off + last->len == roff)) {
            last->len += len;
            return KVF_OK;
        }
    }
    /* 256 (6 KiB): a rank's list of an 8k-token pull of the 9B model (~220 before the
     * merge) without a regrowth; every realloc copied the list in the pull's host time */
    if (KVF_ARRAY_GROW(vec->v, vec->cap, vec->n + 1, 256) != KVF_OK) {
        kvf_error("xfer plan: out of memory for %zu descriptors", vec->n + 1);
        return KVF_ERR_NO_MEMORY;
    }
    vec->v[vec->n++] = (kvf_xfer_desc_t){.local_off = loff, .remote_off = roff, .len = len};
    return KVF_OK;
}

static kvf_status_t kvf_xfer_push_zero(kvf_xfer_planner_t *pl, uint64_t off, uint64_t len)
{
    kvf_xfer_range_vec_t *vec = &pl->zero;

    if ((off > pl->local_region) || (len > pl->local_region - off)) {
        kvf_error("xfer plan: zero range [%" PRIu64 ", +%" PRIu64 ") leaves the local region"
                  " of %" PRIu64 " bytes", off, len, pl->local_region);
        return KVF_ERR_OUT_OF_RANGE;
    }
    if ((vec->n > 0) && (vec->v[vec->n - 1].off + vec->v[vec->n - 1].len == off)) {
        vec->v[vec->n - 1].len += len;
        return KVF_OK;
    }
    if (KVF_ARRAY_GROW(vec->v, vec->cap, vec->n + 1, 64) != KVF_OK) {
        kvf_error("xfer plan: out of memory for %zu zero ranges", vec->n + 1);
        return KVF_ERR_NO_MEMORY;
    }
    vec->v[vec->n++] = (kvf_xfer_range_t){.off = off, .len = len};
    return KVF_OK;
}

static uint64_t kvf_xfer_page_off(int32_t block, int slots, int slot, size_t page_size)
{
    return ((uint64_t)block * (uint64_t)slots + (uint64_t)slot) * (uint64_t)page_size;
}

/* Zero what the transfer leaves untouched in the local attention blocks of one group. */
static kvf_status_t kvf_xfer_plan_attn_zero(kvf_xfer_planner_t *pl, const kvf_kv_group_t *grp,
                                            const kvf_xfer_group_blocks_t *gb, int64_t used)
{
    const kvf_rank_geometry_t *lg = pl->lg;
    int64_t n = pl->p->num_tokens;
    int kl = lg->kernel_block_size;
    int tail = (int)(n - (used - 1) * lg->block_size);   /* tokens in the last block, 1..B */
    size_t row = (size_t)pl->cfg->head_dim * kvf_dtype_size(lg->kv_dtype);
    kvf_status_t status;

    if (tail < lg->block_size) {
        int32_t id = gb->local_ids[used - 1];
        for (int j = 0; j < grp->num_layers; ++j) {
            uint64_t page = kvf_xfer_page_off(id, pl->slots, j, lg->page_size);
            for (int kb = 0; kb < lg->ppl; ++kb) {
                int k0 = kb * kl;
                if (k0 + kl <= tail) {
                    continue;                       /* fully transferred */
                }
                if (k0 >= tail) {                   /* nothing transferred: whole kernel block */
                    status = kvf_xfer_push_zero(pl, page + (uint64_t)kb * lg->kernel_block_bytes,
                                                lg->kernel_block_bytes);
                    if (status != KVF_OK) {
                        return status;
                    }
                    continue;
                }
                for (int kv = 0; kv < 2; ++kv) {    /* partial: each head's token tail */
                    for (int h = 0; h < lg->shard.kv_heads; ++h) {
                        uint64_t off = page + kvf_attn_offset(lg, pl->cfg, tail, kv, h, 0);
                        status = kvf_xfer_push_zero(pl, off, (size_t)(k0 + kl - tail) * row);
                        if (status != KVF_OK) {
                            return status;
                        }
                    }
                }
            }
        }
    }
    for (int64_t b = used; b < gb->num_local; ++b) {     /* blocks past the coverage */
        for (int j = 0; j < grp->num_layers; ++j) {
            status = kvf_xfer_push_zero(pl, kvf_xfer_page_off(gb->local_ids[b], pl->slots, j,
                                                              lg->page_size),
                                        lg->page_size);
            if (status != KVF_OK) {
                return status;
            }
        }
    }
    return KVF_OK;
}

/* Append one piece to @a v[*n_p], merged with the previous one when both sides continue it
 * (coalescing on); @a v has room. */
static void kvf_xfer_piece_add(const kvf_xfer_planner_t *pl, kvf_xfer_piece_t *v, size_t *n_p,
                               int r, uint64_t loff, uint64_t roff, uint64_t len)
{
    kvf_xfer_piece_t *last = (*n_p > 0) ? &v[*n_p - 1] : NULL;

    if (pl->coalesce && (last != NULL) && (last->rank == r) && (last->loff + last->len == loff) &&
        (last->roff + last->len == roff)) {
        last->len += len;
        return;
    }
    v[(*n_p)++] = (kvf_xfer_piece_t){.rank = r, .loff = loff, .roff = roff, .len = len};
}

/* Emit @a v[n] for the local page at @a lpage and remote block id @a rid, layer slot @a j. */
static kvf_status_t kvf_xfer_pieces_emit(kvf_xfer_planner_t *pl, const kvf_xfer_piece_t *v,
                                         size_t n, uint64_t lpage, int32_t rid, int j,
                                         uint64_t *bytes_p)
{
    for (size_t i = 0; i < n; ++i) {
        uint64_t rpage = kvf_xfer_page_off(rid, pl->slots, j,
                                           pl->p->remote_geoms[v[i].rank].page_size);
        kvf_status_t status = kvf_xfer_push_desc(pl, v[i].rank, lpage + v[i].loff,
                                                 rpage + v[i].roff, v[i].len);
        if (status != KVF_OK) {
            return status;
        }
        *bytes_p += v[i].len;
    }
    return KVF_OK;
}

/*
 * The pieces of one whole attention block (every kernel block, K then V, head by head) when
 * every source prefill rank has the decode rank's block and kernel block sizes: then local
 * block b is remote block b, and each (kernel block, K/V, head) is one run of kl tokens on
 * both sides. Sets pl->attn_whole to 1 (built) or -1 (sizes differ: the general walk).
 */
static kvf_status_t kvf_xfer_attn_pieces(kvf_xfer_planner_t *pl, const int *src,
                                         const int *src_head)
{
    const kvf_rank_geometry_t *lg = pl->lg;
    int kl = lg->kernel_block_size;
    uint64_t run = (uint64_t)kl * (uint64_t)pl->cfg->head_dim * kvf_dtype_size(lg->kv_dtype);

    pl->attn_whole = 1;
    for (int h = 0; h < lg->shard.kv_heads; ++h) {
        const kvf_rank_geometry_t *rg = &pl->p->remote_geoms[src[h]];
        if ((rg->block_size != lg->block_size) || (rg->kernel_block_size != kl)) {
            pl->attn_whole = -1;
            return KVF_OK;
        }
    }
    pl->attn = malloc(((size_t)lg->ppl * 2 * (size_t)lg->shard.kv_heads + 1) *
                      sizeof(*pl->attn));
    if (pl->attn == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pl->num_attn = 0;
    for (int kb = 0; kb < lg->ppl; ++kb) {
        for (int kv = 0; kv < 2; ++kv) {
            for (int h = 0; h < lg->shard.kv_heads; ++h) {
                const kvf_rank_geometry_t *rg = &pl->p->remote_geoms[src[h]];
                kvf_xfer_piece_add(pl, pl->attn, &pl->num_attn, src[h],
                                   kvf_attn_offset(lg, pl->cfg, kb * kl, kv, h, 0),
                                   kvf_attn_offset(rg, pl->cfg, kb * kl, kv, src_head[h], 0),
                                   run);
            }
        }
    }
    return KVF_OK;
}

static kvf_status_t kvf_xfer_plan_attn_group(kvf_xfer_planner_t *pl, const kvf_kv_group_t *grp,
                                             const kvf_xfer_group_blocks_t *gb)
{
    const kvf_xfer_plan_params_t *p = pl->p;
    const kvf_model_config_t *cfg = pl->cfg;
    const kvf_rank_geometry_t *lg = pl->lg;
    int64_t n = p->num_tokens;
    int64_t used = kvf_xfer_ceil_div(n, lg->block_size);
    int kl = lg->kernel_block_size;
    size_t row = (size_t)cfg->head_dim * kvf_dtype_size(lg->kv_dtype);
    int src[KVF_MAX_KV_HEADS];   /* source prefill rank per local KV head */
    int src_head[KVF_MAX_KV_HEADS];
    kvf_status_t status;

    if (lg->shard.kv_heads > KVF_MAX_KV_HEADS) {
        kvf_error("xfer plan: %d kv heads per rank exceed %d", lg->shard.kv_heads,
                  KVF_MAX_KV_HEADS);
        return KVF_ERR_UNSUPPORTED;
    }
    for (int h = 0; h < lg->shard.kv_heads; ++h) {
        int global = lg->shard.kv_head_start + h;
        int r = kvf_tp_kv_head_source(cfg, p->remote_tp, p->local_tp, p->local_rank, global);
        const kvf_shard_t *rs = &p->remote_geoms[r].shard;
        src[h] = r;
        src_head[h] = global - rs->kv_head_start;
        if ((src_head[h] < 0) || (src_head[h] >= rs->kv_heads)) {
            kvf_error("xfer plan: prefill rank %d does not hold kv head %d", r, global);
            return KVF_ERR_INVALID_PARAM;
        }
    }

    if (pl->attn_whole == 0) {
        status = kvf_xfer_attn_pieces(pl, src, src_head);
        if (status != KVF_OK) {
            return status;
        }
    }
    for (int64_t lb = 0; lb < used; ++lb) {
        int32_t lid = gb->local_ids[lb];
        bool whole = (pl->attn_whole > 0) && ((lb + 1) * lg->block_size <= n);
        for (int j = 0; j < grp->num_layers; ++j) {
            uint64_t lpage = kvf_xfer_page_off(lid, pl->slots, j, lg->page_size);
            if (whole) {   /* the block's pieces, derived once */
                status = kvf_xfer_pieces_emit(pl, pl->attn, pl->num_attn, lpage,
                                              gb->remote_ids[lb], j, &pl->attn_bytes);
                if (status != KVF_OK) {
                    return status;
                }
                continue;
            }
            for (int kb = 0; kb < lg->ppl; ++kb) {
                int64_t t0 = lb * lg->block_size + (int64_t)kb * kl;
                int64_t t1 = (t0 + kl < n) ? t0 + kl : n;
                if (t0 >= n) {
                    break;
                }
                for (int kv = 0; kv < 2; ++kv) {
                    for (int h = 0; h < lg->shard.kv_heads; ++h) {
                        const kvf_rank_geometry_t *rg = &p->remote_geoms[src[h]];
                        int64_t kr = rg->kernel_block_size, br = rg->block_size;
                        for (int64_t t = t0, e; t < t1; t = e) {
                            int64_t rb = t / br;
                            e = (t / kr + 1) * kr;
                            e = (e < t1) ? e : t1;
                            uint64_t roff = kvf_xfer_page_off(gb->remote_ids[rb], pl->slots, j,
                                                              rg->page_size) +
                                            kvf_attn_offset(rg, cfg, (int)(t - rb * br), kv,
                                                            src_head[h], 0);
                            uint64_t loff = lpage + kvf_attn_offset(lg, cfg,
                                                                    (int)(t - lb * lg->block_size),
                                                                    kv, h, 0);
                            status = kvf_xfer_push_desc(pl, src[h], loff, roff,
                                                        (uint64_t)(e - t) * row);
                            if (status != KVF_OK) {
                                return status;
                            }
                            pl->attn_bytes += (uint64_t)(e - t) * row;
                        }
                    }
                }
            }
        }
    }
    return kvf_xfer_plan_attn_zero(pl, grp, gb, used);
}

/* One run of conv channels [global, global + count) of @a part, read from prefill rank @a r. */
static kvf_status_t kvf_xfer_conv_run(kvf_xfer_planner_t *pl, int r, int part, int global,
                                      int count)
{
    const kvf_rank_geometry_t *rg = &pl->p->remote_geoms[r];
    int lc = kvf_shard_conv_channel(pl->cfg, &pl->lg->shard, part, global);
    int rc = kvf_shard_conv_channel(pl->cfg, &rg->shard, part, global);
    uint64_t len = (uint64_t)count * (uint64_t)(pl->cfg->conv_kernel - 1) *
                   kvf_dtype_size(pl->lg->conv_dtype);

    if ((lc < 0) || (rc < 0)) {
        kvf_error("xfer plan: conv part %d channel %d is not held by decode rank %d or"
                  " prefill rank %d", part, global, pl->p->local_rank, r);
        return KVF_ERR_INVALID_PARAM;
    }
    kvf_xfer_piece_add(pl, pl->mamba, &pl->num_mamba, r,
                       kvf_conv_offset(pl->lg, pl->cfg, lc, 0),
                       kvf_conv_offset(rg, pl->cfg, rc, 0), len);
    return KVF_OK;
}

/* The pieces of one Mamba page (kvf_xfer_piece_t), in local order within each part. */
static kvf_status_t kvf_xfer_mamba_pieces(kvf_xfer_planner_t *pl)
{
    const kvf_xfer_plan_params_t *p = pl->p;
    const kvf_model_config_t *cfg = pl->cfg;
    const kvf_rank_geometry_t *lg = pl->lg;
    const kvf_shard_t *ls = &lg->shard;
    int hd = cfg->mamba_head_dim, st = cfg->ssm_state_size;
    uint64_t ssm_head = (uint64_t)hd * (uint64_t)st * kvf_dtype_size(lg->ssm_dtype);
    kvf_status_t status;

    /* at most: x per head, B and C per group, SSM per head */
    pl->mamba = malloc(((size_t)ls->mamba_heads * 2 + (size_t)ls->groups * 2 + 1) *
                       sizeof(*pl->mamba));
    if (pl->mamba == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pl->num_mamba = 0;
    /* x channels, head by head (a head's channels are contiguous on both sides) */
    for (int h = ls->mamba_head_start; h < ls->mamba_head_start + ls->mamba_heads; ++h) {
        int r = kvf_tp_mamba_head_source(cfg, p->remote_tp, h);
        status = kvf_xfer_conv_run(pl, r, 0, h * hd, hd);
        if (status != KVF_OK) {
            return status;
        }
    }
    /* B then C, group by group; replicated groups are read once, from kvf_tp_group_source */
    for (int part = 1; part <= 2; ++part) {
        for (int g = ls->group_start; g < ls->group_start + ls->groups; ++g) {
            int r = kvf_tp_group_source(cfg, p->remote_tp, p->local_tp, p->local_rank, g);
            status = kvf_xfer_conv_run(pl, r, part, g * st, st);
            if (status != KVF_OK) {
                return status;
            }
        }
    }
    /* SSM state, head by head */
    for (int h = ls->mamba_head_start; h < ls->mamba_head_start + ls->mamba_heads; ++h) {
        int r = kvf_tp_mamba_head_source(cfg, p->remote_tp, h);
        const kvf_rank_geometry_t *rg = &p->remote_geoms[r];
        int rh = h - rg->shard.mamba_head_start;
        if ((rh < 0) || (rh >= rg->shard.mamba_heads)) {
            kvf_error("xfer plan: prefill rank %d does not hold Mamba head %d", r, h);
            return KVF_ERR_INVALID_PARAM;
        }
        kvf_xfer_piece_add(pl, pl->mamba, &pl->num_mamba, r,
                           kvf_ssm_offset(lg, cfg, h - ls->mamba_head_start, 0, 0),
                           kvf_ssm_offset(rg, cfg, rh, 0, 0), ssm_head);
    }
    return KVF_OK;
}

static kvf_status_t kvf_xfer_plan_mamba_group(kvf_xfer_planner_t *pl, const kvf_kv_group_t *grp,
                                              const kvf_xfer_group_blocks_t *gb)
{
    const kvf_rank_geometry_t *lg = pl->lg;
    int32_t lid = gb->local_ids[gb->num_local - 1];
    int32_t rid = gb->remote_ids[gb->num_remote - 1];
    kvf_status_t status;

    if (pl->mamba == NULL) {
        status = kvf_xfer_mamba_pieces(pl);
        if (status != KVF_OK) {
            return status;
        }
    }
    for (int j = 0; j < grp->num_layers; ++j) {
        status = kvf_xfer_pieces_emit(pl, pl->mamba, pl->num_mamba,
                                      kvf_xfer_page_off(lid, pl->slots, j, lg->page_size), rid,
                                      j, &pl->mamba_bytes);
        if (status != KVF_OK) {
            return status;
        }
    }
    return KVF_OK;
}

static int kvf_xfer_cmp_desc(const void *a, const void *b)
{
    uint64_t x = ((const kvf_xfer_desc_t *)a)->local_off;
    uint64_t y = ((const kvf_xfer_desc_t *)b)->local_off;
    return (x > y) - (x < y);
}

static int kvf_xfer_cmp_range(const void *a, const void *b)
{
    uint64_t x = ((const kvf_xfer_range_t *)a)->off;
    uint64_t y = ((const kvf_xfer_range_t *)b)->off;
    return (x > y) - (x < y);
}

/* First index past the ascending run of @a v that starts at @a i. */
static size_t kvf_xfer_run_end(const kvf_xfer_desc_t *v, size_t i, size_t n)
{
    for (++i; (i < n) && (v[i - 1].local_off < v[i].local_off); ++i) {
    }
    return i;
}

/*
 * Sort @a v[n] by local_off: bottom-up merges of the ascending runs it already holds. Every
 * page is emitted in memory order, so a rank's list is a few dozen sorted runs (one per page
 * at most) whose order only the block ids decide; qsort's callback per comparison and its
 * own merge buffer took 60 % of a plan. Local offsets are distinct (no two descriptors
 * overlap), so stability does not matter. Falls back to qsort without scratch memory.
 */
static void kvf_xfer_desc_sort(kvf_xfer_desc_t *v, size_t n)
{
    kvf_xfer_desc_t *tmp = malloc(n * sizeof(*tmp));
    kvf_xfer_desc_t *src = v, *dst = tmp, *t;
    size_t runs;

    if (tmp == NULL) {
        qsort(v, n, sizeof(*v), kvf_xfer_cmp_desc);
        return;
    }
    do {
        size_t i = 0, out = 0;
        runs = 0;
        while (i < n) {
            size_t a = i, a_end = kvf_xfer_run_end(src, i, n);
            size_t b = a_end, b_end = (a_end < n) ? kvf_xfer_run_end(src, a_end, n) : n;
            while ((a < a_end) && (b < b_end)) {
                dst[out++] = (src[a].local_off < src[b].local_off) ? src[a++] : src[b++];
            }
            while (a < a_end) {
                dst[out++] = src[a++];
            }
            while (b < b_end) {
                dst[out++] = src[b++];
            }
            i = b_end;
            runs++;
        }
        t = src;
        src = dst;
        dst = t;
    } while (runs > 1);
    if (src != v) {
        memcpy(v, src, n * sizeof(*v));
    }
    free(tmp);
}

/* Sort by local offset and merge runs contiguous on both sides. */
static void kvf_xfer_desc_sort_merge(kvf_xfer_desc_vec_t *vec, bool merge)
{
    size_t out = 0;
    if (vec->n < 2) {
        return;
    }
    if (kvf_xfer_run_end(vec->v, 0, vec->n) < vec->n) {   /* ascending ids: already in order */
        kvf_xfer_desc_sort(vec->v, vec->n);
    }
    if (!merge) {
        return;
    }
    for (size_t i = 0; i < vec->n; ++i) {
        kvf_xfer_desc_t *last = (out > 0) ? &vec->v[out - 1] : NULL;
        if ((last != NULL) && (last->local_off + last->len == vec->v[i].local_off) &&
            (last->remote_off + last->len == vec->v[i].remote_off)) {
            last->len += vec->v[i].len;
        } else {
            vec->v[out++] = vec->v[i];
        }
    }
    vec->n = out;
}

/* Sort and merge touching or overlapping zero ranges (always: the result must be disjoint). */
static void kvf_xfer_range_sort_merge(kvf_xfer_range_vec_t *vec)
{
    size_t out = 0;
    if (vec->n < 2) {
        return;
    }
    qsort(vec->v, vec->n, sizeof(*vec->v), kvf_xfer_cmp_range);
    for (size_t i = 0; i < vec->n; ++i) {
        kvf_xfer_range_t *last = (out > 0) ? &vec->v[out - 1] : NULL;
        if ((last != NULL) && (last->off + last->len >= vec->v[i].off)) {
            uint64_t end = vec->v[i].off + vec->v[i].len;
            if (end > last->off + last->len) {
                last->len = end - last->off;
            }
        } else {
            vec->v[out++] = vec->v[i];
        }
    }
    vec->n = out;
}

/* ------------------------------------------------------------ public API -- */

static kvf_status_t kvf_xfer_plan_validate(kvf_xfer_planner_t *pl)
{
    const kvf_xfer_plan_params_t *p = pl->p;
    const kvf_model_config_t *cfg = p->cfg;
    int ranks[1024];
    int num_ranks = 0, rblock = 0;
    int64_t rmin_blocks = INT64_MAX;
    kvf_status_t status;

    status = kvf_xfer_geom_check(cfg, p->local_geom, "decode", p->local_tp, p->local_rank);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_xfer_region_bytes(p->local_num_blocks, pl->slots, p->local_geom->page_size,
                                   "decode", p->local_rank, &pl->local_region);
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
        pl->reads[r] = true;
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
        if ((i > 0) && (rg->block_size != rblock)) {
            kvf_error("xfer plan: prefill ranks disagree on block_size (%d and %d)", rblock,
                      rg->block_size);
            return KVF_ERR_INVALID_PARAM;
        }
        rblock = rg->block_size;
        status = kvf_xfer_region_bytes(p->remote_num_blocks[r], pl->slots, rg->page_size,
                                       "prefill", r, &pl->remote_region[r]);
        if (status != KVF_OK) {
            return status;
        }
        if (p->remote_num_blocks[r] < rmin_blocks) {
            rmin_blocks = p->remote_num_blocks[r];
        }
    }
    for (int g = 0; g < p->num_groups; ++g) {
        const kvf_xfer_group_blocks_t *gb = &p->groups[g];
        bool attn = (p->layout->groups[g].kind == KVF_GROUP_ATTENTION);
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

kvf_status_t kvf_xfer_plan_create(const kvf_xfer_plan_params_t *params, kvf_xfer_plan_t **plan_p)
{
    kvf_xfer_planner_t pl = {0};
    kvf_xfer_plan_t *plan = NULL;
    kvf_status_t status;
    int P;

    if (plan_p == NULL) {
        kvf_error("xfer plan: plan_p is NULL");
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_xfer_params_check(params);
    if (status != KVF_OK) {
        return status;
    }
    P = params->remote_tp;
    pl.p = params;
    pl.cfg = params->cfg;
    pl.lg = params->local_geom;
    pl.slots = params->layout->slots;
    pl.coalesce = !((params->field_mask & KVF_XFER_PLAN_PARAM_FIELD_FLAGS) &&
                    (params->flags & KVF_XFER_PLAN_FLAG_NO_COALESCE));
    pl.remote_region = calloc((size_t)P, sizeof(*pl.remote_region));
    pl.reads = calloc((size_t)P, sizeof(*pl.reads));
    pl.descs = calloc((size_t)P, sizeof(*pl.descs));
    if ((pl.remote_region == NULL) || (pl.reads == NULL) || (pl.descs == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto out_free_build;
    }

    status = kvf_xfer_plan_validate(&pl);
    if (status != KVF_OK) {
        goto out_free_build;
    }
    for (int g = 0; g < params->num_groups; ++g) {
        const kvf_kv_group_t *grp = &params->layout->groups[g];
        status = (grp->kind == KVF_GROUP_ATTENTION) ?
                 kvf_xfer_plan_attn_group(&pl, grp, &params->groups[g]) :
                 kvf_xfer_plan_mamba_group(&pl, grp, &params->groups[g]);
        if (status != KVF_OK) {
            goto out_free_build;
        }
    }

    plan = calloc(1, sizeof(*plan));
    if (plan == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto out_free_build;
    }
    plan->remote_tp = P;
    plan->remote_region_bytes = pl.remote_region;
    pl.remote_region = NULL;
    plan->local_region_bytes = pl.local_region;
    plan->ranks = calloc((size_t)P, sizeof(*plan->ranks));
    if (plan->ranks == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto out_free_plan;
    }
    for (int r = 0; r < P; ++r) {
        kvf_xfer_desc_vec_t *vec = &pl.descs[r];
        kvf_xfer_rank_plan_t *rp;
        if (vec->n == 0) {
            continue;
        }
        kvf_xfer_desc_sort_merge(vec, pl.coalesce);
        rp = &plan->ranks[plan->num_ranks++];
        rp->remote_rank = r;
        rp->num_descs = vec->n;
        rp->descs = vec->v;
        vec->v = NULL;
        for (size_t i = 0; i < rp->num_descs; ++i) {
            rp->bytes += rp->descs[i].len;
        }
        plan->total_bytes += rp->bytes;
        plan->total_descs += rp->num_descs;
    }
    kvf_xfer_range_sort_merge(&pl.zero);
    plan->num_zero = pl.zero.n;
    plan->zero = pl.zero.v;
    pl.zero.v = NULL;
    for (size_t i = 0; i < plan->num_zero; ++i) {
        plan->zero_bytes += plan->zero[i].len;
    }
    plan->attn_bytes = pl.attn_bytes;
    plan->mamba_bytes = pl.mamba_bytes;
    *plan_p = plan;
    status = KVF_OK;
    plan = NULL;

out_free_plan:
    kvf_xfer_plan_destroy(plan);
out_free_build:
    for (int r = 0; (pl.descs != NULL) && (r < P); ++r) {
        free(pl.descs[r].v);
    }
    free(pl.descs);
    free(pl.reads);
    free(pl.remote_region);
    free(pl.zero.v);
    free(pl.mamba);
    free(pl.attn);
    return status;
}

void kvf_xfer_plan_destroy(kvf_xfer_plan_t *plan)
{
    if (plan == NULL) {
        return;
    }
    for (int i = 0; (plan->ranks != NULL) && (i < plan->num_ranks); ++i) {
        free(plan->ranks[i].descs);
    }
    free(plan->ranks);
    free(plan->zero);
    free(plan->remote_region_bytes);
    free(plan);
}

kvf_status_t kvf_xfer_plan_apply_local(const kvf_xfer_plan_t *plan, void *local_base,
                                       size_t local_len, const void *const *remote_bases,
                                       const size_t *remote_lens)
{
    if ((plan == NULL) || (local_base == NULL) || (remote_bases == NULL) ||
        (remote_lens == NULL)) {
        kvf_error("xfer apply: plan, local_base, remote_bases and remote_lens must be set");
        return KVF_ERR_INVALID_PARAM;
    }
    /* check everything first, so an error leaves the local region untouched */
    for (int i = 0; i < plan->num_ranks; ++i) {
        const kvf_xfer_rank_plan_t *rp = &plan->ranks[i];
        int r = rp->remote_rank;
        if ((r < 0) || (r >= plan->remote_tp) || (remote_bases[r] == NULL)) {
            kvf_error("xfer apply: no region for prefill rank %d", r);
            return KVF_ERR_INVALID_PARAM;
        }
        for (size_t k = 0; k < rp->num_descs; ++k) {
            const kvf_xfer_desc_t *d = &rp->descs[k];
            if ((d->local_off > local_len) || (d->len > local_len - d->local_off) ||
                (d->remote_off > remote_lens[r]) || (d->len > remote_lens[r] - d->remote_off)) {
                kvf_error("xfer apply: descriptor %zu of prefill rank %d (local %" PRIu64
                          " remote %" PRIu64 " len %" PRIu64 ") exceeds regions of %zu / %zu"
                          " bytes", k, r, d->local_off, d->remote_off, d->len, local_len,
                          remote_lens[r]);
                return KVF_ERR_OUT_OF_RANGE;
            }
        }
    }
    for (size_t k = 0; k < plan->num_zero; ++k) {
        if ((plan->zero[k].off > local_len) || (plan->zero[k].len > local_len - plan->zero[k].off)) {
            kvf_error("xfer apply: zero range %zu (%" PRIu64 " +%" PRIu64 ") exceeds the local"
                      " region of %zu bytes", k, plan->zero[k].off, plan->zero[k].len, local_len);
            return KVF_ERR_OUT_OF_RANGE;
        }
    }
    for (int i = 0; i < plan->num_ranks; ++i) {
        const kvf_xfer_rank_plan_t *rp = &plan->ranks[i];
        const char *src = remote_bases[rp->remote_rank];
        for (size_t k = 0; k < rp->num_descs; ++k) {
            memcpy((char *)local_base + rp->descs[k].local_off, src + rp->descs[k].remote_off,
                   rp->descs[k].len);
        }
    }
    for (size_t k = 0; k < plan->num_zero; ++k) {
        memset((char *)local_base + plan->zero[k].off, 0, plan->zero[k].len);
    }
    return KVF_OK;
}
