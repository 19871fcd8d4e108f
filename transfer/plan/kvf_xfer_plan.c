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
 * the general walk); blocks are walked in ascending local id (a few ids
 * sorted, kvf_xfer_plan_blocks), so every rank's list comes out in local order
 * and the final sort is a check; the lists start at 256 entries, so a
 * typical pull never regrows them. The checks live in kvf_xfer_check.c, the
 * list sorts in kvf_xfer_sort.c. The output is unchanged, descriptor for
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
 * KV layouts: every attention address is each side's own, kvf_attn_slot_off() of (block,
 * slot) plus kvf_attn_offset() inside it (kernels/kvf_kv_layout.h), so the walk above is the
 * same at --kv-layout head-major (where it is no longer local memory order) and between
 * sides of different layouts; the per-rank sort then joins a head's layer slots and a
 * source rank's heads into one descriptor per block (docs/ARCHITECTURE.md §7). Zero ranges
 * of a head-major slot are one per head (kvf_xfer_attn_zero_slot()).
 *
 * Rejected alternatives: copying whole remote blocks into a staging buffer and
 * permuting (one more pass over the data and a buffer per request), and
 * reading only the matching block size (breaks 4p2d-style layouts where block
 * sizes differ).
 */
#include "kvf_xfer_plan.h"
#include "kvf_xfer_plan_int.h"
#include "kvf_xfer_check.h"
#include "kvf_xfer_sort.h"
#include "kvf_xfer_window.h"

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
    uint64_t                      pad_bytes;       /* Mamba page padding read (see below) */
    struct kvf_xfer_piece        *mamba;           /* the Mamba page's pieces, built once */
    size_t                        num_mamba;
    struct kvf_xfer_piece        *attn;            /* a whole attention block's, built once */
    size_t                        num_attn;
    int                           attn_src[KVF_MAX_KV_HEADS];      /* source prefill rank and */
    int                           attn_src_head[KVF_MAX_KV_HEADS]; /* its head, per local KV head */
    bool                          attn_mapped;     /* attn_src* filled */
    int                           attn_whole;      /* 1: attn holds them; -1: block sizes
                                                    * differ (no such list); 0: not built */
} kvf_xfer_planner_t;


static int64_t kvf_xfer_ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
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

/* Zero layer slot @a j's share of local attention block @a id: its page at layer-major, each
 * head's run of slot j at head-major (kvf_kv_layout.h). */
static kvf_status_t kvf_xfer_attn_zero_slot(kvf_xfer_planner_t *pl, int32_t id, int j)
{
    const kvf_rank_geometry_t *lg = pl->lg;
    uint64_t slot = kvf_attn_slot_off(lg, id, j);

    if (lg->kv_layout != KVF_KV_HEAD_MAJOR) {
        return kvf_xfer_push_zero(pl, slot, lg->page_size);
    }
    for (int h = 0; h < lg->shard.kv_heads; ++h) {
        kvf_status_t status = kvf_xfer_push_zero(pl, slot + (uint64_t)h * lg->attn.head,
                                                 lg->attn.slot);
        if (status != KVF_OK) {
            return status;
        }
    }
    return KVF_OK;
}

/* Zero the token tails the transfer leaves in the request's last, partial attention block. */
static kvf_status_t kvf_xfer_attn_zero_tail(kvf_xfer_planner_t *pl, const kvf_kv_group_t *grp,
                                            int32_t id, int tail)
{
    const kvf_rank_geometry_t *lg = pl->lg;
    int kl = lg->kernel_block_size;
    size_t row = (size_t)pl->cfg->head_dim * kvf_dtype_size(lg->kv_dtype);
    kvf_status_t status;

    for (int j = 0; j < grp->num_layers; ++j) {
        uint64_t page = kvf_attn_slot_off(lg, id, j);
        for (int kb = 0; kb < lg->ppl; ++kb) {
            int k0 = kb * kl;
            if (k0 + kl <= tail) {
                continue;                       /* fully transferred */
            }
            for (int kv = 0; kv < 2; ++kv) {    /* each head's token tail (a whole kernel */
                for (int h = 0; h < lg->shard.kv_heads; ++h) {   /* block: merged runs) */
                    int t0 = (k0 >= tail) ? k0 : tail;
                    uint64_t off = page + kvf_attn_offset(lg, pl->cfg, t0, kv, h, 0);
                    status = kvf_xfer_push_zero(pl, off, (size_t)(k0 + kl - t0) * row);
                    if (status != KVF_OK) {
                        return status;
                    }
                }
            }
        }
    }
    return KVF_OK;
}

/* Zero every page of a local attention block past the transferred coverage. */
static kvf_status_t kvf_xfer_attn_zero_block(kvf_xfer_planner_t *pl, const kvf_kv_group_t *grp,
                                             int32_t id)
{
    for (int j = 0; j < grp->num_layers; ++j) {
        kvf_status_t status = kvf_xfer_attn_zero_slot(pl, id, j);
        if (status != KVF_OK) {
            return status;
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

/*
 * Emit @a v[n] for the local page at @a lpage and remote block id @a rid, layer slot @a j;
 * @a with_pad: a piece's page padding too (a page the next layer slot's page follows);
 * @a attn: attention pieces (the remote slot by the source's strides, kvf_attn_slot_off(),
 * counted in attn_bytes), else a Mamba page's (page (rid x slots + j), in mamba_bytes).
 */
static kvf_status_t kvf_xfer_pieces_emit(kvf_xfer_planner_t *pl, const kvf_xfer_piece_t *v,
                                         size_t n, uint64_t lpage, int32_t rid, int j,
                                         bool with_pad, bool attn)
{
    uint64_t *bytes_p = attn ? &pl->attn_bytes : &pl->mamba_bytes;
    for (size_t i = 0; i < n; ++i) {
        const kvf_rank_geometry_t *rg = &pl->p->remote_geoms[v[i].rank];
        uint64_t rpage = attn ? kvf_attn_slot_off(rg, rid, j) :
                                kvf_xfer_page_off(rid, pl->slots, j, rg->page_size);
        uint64_t pad = with_pad ? v[i].pad : 0;
        kvf_status_t status = kvf_xfer_push_desc(pl, v[i].rank, lpage + v[i].loff,
                                                 rpage + v[i].roff, v[i].len - v[i].pad + pad);
        if (status != KVF_OK) {
            return status;
        }
        *bytes_p += v[i].len - v[i].pad;
        pl->pad_bytes += pad;
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

/* Which prefill rank (and which of its heads) each local KV head is read from; once per plan. */
static kvf_status_t kvf_xfer_attn_map(kvf_xfer_planner_t *pl)
{
    const kvf_xfer_plan_params_t *p = pl->p;
    const kvf_rank_geometry_t *lg = pl->lg;

    if (lg->shard.kv_heads > KVF_MAX_KV_HEADS) {
        kvf_error("xfer plan: %d kv heads per rank exceed %d", lg->shard.kv_heads,
                  KVF_MAX_KV_HEADS);
        return KVF_ERR_UNSUPPORTED;
    }
    for (int h = 0; h < lg->shard.kv_heads; ++h) {
        int global = lg->shard.kv_head_start + h;
        int r = kvf_tp_kv_head_source(pl->cfg, p->remote_tp, p->local_tp, p->local_rank, global);
        const kvf_shard_t *rs = &p->remote_geoms[r].shard;
        pl->attn_src[h] = r;
        pl->attn_src_head[h] = global - rs->kv_head_start;
        if ((pl->attn_src_head[h] < 0) || (pl->attn_src_head[h] >= rs->kv_heads)) {
            kvf_error("xfer plan: prefill rank %d does not hold kv head %d", r, global);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    pl->attn_mapped = true;
    return (pl->attn_whole == 0) ? kvf_xfer_attn_pieces(pl, pl->attn_src, pl->attn_src_head) :
                                   KVF_OK;
}

/* The runs of one page of a block whose sizes differ from the source's (or a partial block):
 * each local kernel block's token interval cut at every remote kernel block boundary. */
static kvf_status_t kvf_xfer_attn_walk(kvf_xfer_planner_t *pl, const kvf_xfer_group_blocks_t *gb,
                                       int64_t lb, int j, uint64_t lpage)
{
    const kvf_xfer_plan_params_t *p = pl->p;
    const kvf_model_config_t *cfg = pl->cfg;
    const kvf_rank_geometry_t *lg = pl->lg;
    int64_t n = p->num_tokens;
    int kl = lg->kernel_block_size;
    size_t row = (size_t)cfg->head_dim * kvf_dtype_size(lg->kv_dtype);
    kvf_status_t status;

    for (int kb = 0; kb < lg->ppl; ++kb) {
        int64_t t0 = lb * lg->block_size + (int64_t)kb * kl;
        int64_t t1 = (t0 + kl < n) ? t0 + kl : n;
        if (t0 >= n) {
            break;
        }
        for (int kv = 0; kv < 2; ++kv) {
            for (int h = 0; h < lg->shard.kv_heads; ++h) {
                const kvf_rank_geometry_t *rg = &p->remote_geoms[pl->attn_src[h]];
                int64_t kr = rg->kernel_block_size, br = rg->block_size;
                for (int64_t t = t0, e; t < t1; t = e) {
                    int64_t rb = t / br;
                    e = (t / kr + 1) * kr;
                    e = (e < t1) ? e : t1;
                    uint64_t roff = kvf_attn_slot_off(rg, gb->remote_ids[rb], j) +
                                    kvf_attn_offset(rg, cfg, (int)(t - rb * br), kv,
                                                    pl->attn_src_head[h], 0);
                    uint64_t loff = lpage + kvf_attn_offset(lg, cfg,
                                                            (int)(t - lb * lg->block_size),
                                                            kv, h, 0);
                    status = kvf_xfer_push_desc(pl, pl->attn_src[h], loff, roff,
                                                (uint64_t)(e - t) * row);
                    if (status != KVF_OK) {
                        return status;
                    }
                    pl->attn_bytes += (uint64_t)(e - t) * row;
                }
            }
        }
    }
    return KVF_OK;
}

/*
 * Logical block @a lb of an attention group: its pages' runs when it holds request tokens
 * (and the zeroed tails when it is the last, partial one), else zero ranges for its pages.
 * @a before_window (KVF_XFER_PLAN_FLAG_WINDOW, a block wholly before the window): the pages
 * of the sliding layers are zeroed, not read; the full-attention layers' pages are read.
 */
static kvf_status_t kvf_xfer_attn_block(kvf_xfer_planner_t *pl, const kvf_kv_group_t *grp,
                                        const kvf_xfer_group_blocks_t *gb, int64_t lb,
                                        bool before_window)
{
    const kvf_rank_geometry_t *lg = pl->lg;
    int64_t n = pl->p->num_tokens;
    int64_t used = kvf_xfer_ceil_div(n, lg->block_size);
    int32_t lid = gb->local_ids[lb];
    bool whole = (pl->attn_whole > 0) && ((lb + 1) * lg->block_size <= n);
    kvf_status_t status;

    if (lb >= used) {   /* past the coverage */
        return kvf_xfer_attn_zero_block(pl, grp, lid);
    }
    for (int j = 0; j < grp->num_layers; ++j) {
        uint64_t lpage = kvf_attn_slot_off(lg, lid, j);
        if (before_window && kvf_xfer_slot_slides(pl->cfg, grp, j)) {
            status = kvf_xfer_attn_zero_slot(pl, lid, j);
        } else {
            status = whole ? kvf_xfer_pieces_emit(pl, pl->attn, pl->num_attn, lpage,
                                                  gb->remote_ids[lb], j, false, true) :
                             kvf_xfer_attn_walk(pl, gb, lb, j, lpage);
        }
        if (status != KVF_OK) {
            return status;
        }
    }
    if ((lb == used - 1) && (n - lb * lg->block_size < lg->block_size)) {
        return kvf_xfer_attn_zero_tail(pl, grp, lid, (int)(n - lb * lg->block_size));
    }
    return KVF_OK;
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

/*
 * Mamba page padding: a Mamba page is [conv | SSM | pad] on both sides, and a group's layer
 * slots are adjacent pages of one block. When the page's last piece ends at both sides' data
 * ends, its first piece starts both pages from the same prefill rank, and both pads are
 * equally long, the last piece takes the pad too: the next slot's page then continues it on
 * both sides and the coalescing joins the slots, so at TP ratio 1 a Mamba block is one
 * descriptor instead of one per layer (27 -> 7 for the 9B model; each GET of UCX's cuda_ipc
 * costs a copy launch and an event). The pad is dead on both sides (no kernel reads it, no
 * zero range covers it); the cost is its bytes (1.07 % of the 9B's page), never read after
 * a group's last slot. Rejected: bridging the token tails of a partial attention block the
 * same way (they are zero ranges, which the IPC gather kernel runs beside the copies).
 */
static void kvf_xfer_mamba_pad(kvf_xfer_planner_t *pl)
{
    const kvf_rank_geometry_t *lg = pl->lg, *rg;
    kvf_xfer_piece_t *first, *last;
    uint64_t pad = lg->page_size - lg->mamba_bytes;

    if (!pl->coalesce || (pl->num_mamba == 0) || (pad == 0)) {
        return;
    }
    first = &pl->mamba[0];
    last = &pl->mamba[pl->num_mamba - 1];
    rg = &pl->p->remote_geoms[last->rank];
    if ((first->rank != last->rank) || (first->loff != 0) || (first->roff != 0) ||
        (last->loff + last->len != lg->mamba_bytes) ||
        (last->roff + last->len != rg->mamba_bytes) || (rg->page_size - rg->mamba_bytes != pad)) {
        return;
    }
    last->len += pad;
    last->pad = pad;
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
    kvf_xfer_mamba_pad(pl);
    return KVF_OK;
}

/* A Mamba group's state: the pages of the last id of its block list. */
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
                                      j, j + 1 < grp->num_layers, false);
        if (status != KVF_OK) {
            return status;
        }
    }
    return KVF_OK;
}

/* One block of the request: group @a group's logical block @a lb (a Mamba group: its last). */
typedef struct kvf_xfer_block_ref {
    int32_t lid;
    int32_t group;
    int64_t lb;
} kvf_xfer_block_ref_t;

static int kvf_xfer_cmp_ref(const void *a, const void *b)
{
    int32_t x = ((const kvf_xfer_block_ref_t *)a)->lid;
    int32_t y = ((const kvf_xfer_block_ref_t *)b)->lid;
    return (x > y) - (x < y);
}

/*
 * Every block of the request, in ascending local id: pages are then emitted in local order,
 * so each rank's descriptors and the zero ranges come out sorted, the coalescing on the fly
 * takes every merge, and the final sort is only a check. Sorting the descriptors instead
 * (merges of the runs each page emitted) took a quarter of a 9B 4p2d plan; this sorts a few
 * block ids (14 there), or none when the ids already ascend.
 */
static int64_t kvf_xfer_window_first(const kvf_xfer_plan_params_t *p, const kvf_kv_group_t *grp,
                                     int block_size)
{
    if (!(p->field_mask & KVF_XFER_PLAN_PARAM_FIELD_FLAGS) ||
        !(p->flags & KVF_XFER_PLAN_FLAG_WINDOW)) {
        return 0;
    }
    return kvf_xfer_group_window_first(p->cfg, grp, p->num_tokens, block_size);
}

static kvf_status_t kvf_xfer_plan_blocks(kvf_xfer_planner_t *pl)
{
    const kvf_xfer_plan_params_t *p = pl->p;
    int64_t first[KVF_MAX_KV_GROUPS];
    /* a decode prefix hit: its blocks are there already (and may be shared) */
    const int64_t skip = (p->field_mask & KVF_XFER_PLAN_PARAM_FIELD_SKIP) ?
                         p->skip_tokens / pl->lg->block_size : 0;
    kvf_xfer_block_ref_t *refs;
    size_t n = 0, k = 0;
    bool sorted = true;
    kvf_status_t status = KVF_OK;

    for (int g = 0; g < p->num_groups; ++g) {
        bool attn = kvf_group_is_attention(p->layout->groups[g].kind);
        first[g] = kvf_xfer_window_first(p, &p->layout->groups[g], pl->lg->block_size);
        n += !attn ? 1 : (p->groups[g].num_local > skip) ?
                         (size_t)(p->groups[g].num_local - skip) : 0;
    }
    refs = malloc(n * sizeof(*refs) + 1);
    if (refs == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int g = 0; g < p->num_groups; ++g) {
        const kvf_xfer_group_blocks_t *gb = &p->groups[g];
        bool attn = kvf_group_is_attention(p->layout->groups[g].kind);
        for (int64_t lb = attn ? skip : gb->num_local - 1; lb < gb->num_local; ++lb) {
            refs[k++] = (kvf_xfer_block_ref_t){.lid = gb->local_ids[lb], .group = g, .lb = lb};
            sorted = sorted && ((k < 2) || (refs[k - 2].lid < refs[k - 1].lid));
        }
    }
    if (!sorted) {
        qsort(refs, n, sizeof(*refs), kvf_xfer_cmp_ref);
    }
    for (size_t i = 0; (i < n) && (status == KVF_OK); ++i) {
        const kvf_kv_group_t *grp = &p->layout->groups[refs[i].group];
        const kvf_xfer_group_blocks_t *gb = &p->groups[refs[i].group];
        if (!kvf_group_is_attention(grp->kind)) {
            status = kvf_xfer_plan_mamba_group(pl, grp, gb);
            continue;
        }
        if (!pl->attn_mapped) {
            status = kvf_xfer_attn_map(pl);
        }
        if (status == KVF_OK) {
            status = kvf_xfer_attn_block(pl, grp, gb, refs[i].lb,
                                         refs[i].lb < first[refs[i].group]);
        }
    }
    free(refs);
    return status;
}

/* ------------------------------------------- pieces of an (engine, rank) pair -- */


static bool kvf_xfer_coalescing(const kvf_xfer_plan_params_t *p)
{
    return !((p->field_mask & KVF_XFER_PLAN_PARAM_FIELD_FLAGS) &&
             (p->flags & KVF_XFER_PLAN_FLAG_NO_COALESCE));
}

static void kvf_xfer_planner_init(kvf_xfer_planner_t *pl, const kvf_xfer_plan_params_t *params)
{
    memset(pl, 0, sizeof(*pl));
    pl->p = params;
    pl->cfg = params->cfg;
    pl->lg = params->local_geom;
    pl->slots = params->layout->slots;
    pl->coalesce = kvf_xfer_coalescing(params);
}

kvf_status_t kvf_xfer_pieces_create(const kvf_xfer_plan_params_t *params,
                                    kvf_xfer_pieces_t **pieces_p)
{
    kvf_xfer_planner_t pl;
    kvf_xfer_pieces_t *pc;
    kvf_status_t status = KVF_OK;

    if ((params == NULL) || (pieces_p == NULL) ||
        (params->field_mask & ~KVF_XFER_PLAN_PARAM_FIELDS_KNOWN) || (params->cfg == NULL) ||
        (params->layout == NULL) || (params->local_geom == NULL) ||
        (params->remote_geoms == NULL) ||
        (kvf_tp_ratio(params->remote_tp, params->local_tp) == 0) || (params->local_rank < 0) ||
        (params->local_rank >= params->local_tp)) {
        kvf_error("xfer pieces: params, pieces_p, cfg, layout and both geometries must be set,"
                  " with known field_mask bits and TPs that divide each other");
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_xfer_geoms_check(params);
    if (status != KVF_OK) {
        return status;
    }
    pc = calloc(1, sizeof(*pc));
    if ((pc == NULL) ||
        ((pc->remote_geoms = malloc((size_t)params->remote_tp * sizeof(*pc->remote_geoms))) ==
         NULL)) {
        free(pc);
        return KVF_ERR_NO_MEMORY;
    }
    kvf_xfer_planner_init(&pl, params);
    for (int g = 0; (g < params->layout->num_groups) && (status == KVF_OK); ++g) {
        if (kvf_group_is_attention(params->layout->groups[g].kind) && !pl.attn_mapped) {
            status = kvf_xfer_attn_map(&pl);
        } else if (!kvf_group_is_attention(params->layout->groups[g].kind) && (pl.mamba == NULL)) {
            status = kvf_xfer_mamba_pieces(&pl);
        }
    }
    if (status != KVF_OK) {
        free(pl.attn);
        free(pl.mamba);
        kvf_xfer_pieces_destroy(pc);
        return status;
    }
    pc->cfg = params->cfg;
    pc->layout = params->layout;
    pc->local_tp = params->local_tp;
    pc->local_rank = params->local_rank;
    pc->remote_tp = params->remote_tp;
    pc->coalesce = pl.coalesce;
    pc->local_geom = *params->local_geom;
    memcpy(pc->remote_geoms, params->remote_geoms,
           (size_t)params->remote_tp * sizeof(*pc->remote_geoms));
    memcpy(pc->attn_src, pl.attn_src, sizeof(pc->attn_src));
    memcpy(pc->attn_src_head, pl.attn_src_head, sizeof(pc->attn_src_head));
    pc->attn_mapped = pl.attn_mapped;
    pc->attn_whole = pl.attn_whole;
    pc->attn = pl.attn;
    pc->num_attn = pl.num_attn;
    pc->mamba = pl.mamba;
    pc->num_mamba = pl.num_mamba;
    *pieces_p = pc;
    return KVF_OK;
}

bool kvf_xfer_pieces_match(const kvf_xfer_pieces_t *pc, const kvf_xfer_plan_params_t *p)
{
    return (pc != NULL) && (p != NULL) && (p->local_geom != NULL) && (p->remote_geoms != NULL) &&
           (pc->cfg == p->cfg) && (pc->layout == p->layout) && (pc->local_tp == p->local_tp) &&
           (pc->local_rank == p->local_rank) && (pc->remote_tp == p->remote_tp) &&
           (pc->coalesce == kvf_xfer_coalescing(p)) &&
           (memcmp(&pc->local_geom, p->local_geom, sizeof(pc->local_geom)) == 0) &&
           (memcmp(pc->remote_geoms, p->remote_geoms,
                   (size_t)pc->remote_tp * sizeof(*pc->remote_geoms)) == 0);
}

void kvf_xfer_pieces_destroy(kvf_xfer_pieces_t *pc)
{
    if (pc == NULL) {
        return;
    }
    free(pc->remote_geoms);
    free(pc->attn);
    free(pc->mamba);
    free(pc);
}

/* Plan with @a pc's pieces instead of deriving them (they match the params: checked). */
static void kvf_xfer_planner_borrow(kvf_xfer_planner_t *pl, const kvf_xfer_pieces_t *pc)
{
    memcpy(pl->attn_src, pc->attn_src, sizeof(pl->attn_src));
    memcpy(pl->attn_src_head, pc->attn_src_head, sizeof(pl->attn_src_head));
    pl->attn_mapped = pc->attn_mapped;
    pl->attn_whole = pc->attn_whole;
    pl->attn = pc->attn;
    pl->num_attn = pc->num_attn;
    pl->mamba = pc->mamba;
    pl->num_mamba = pc->num_mamba;
}

/* ------------------------------------------------------------ public API -- */

kvf_status_t kvf_xfer_plan_create(const kvf_xfer_plan_params_t *params, kvf_xfer_plan_t **plan_p)
{
    kvf_xfer_planner_t pl;
    kvf_xfer_plan_t *plan = NULL;
    const kvf_xfer_pieces_t *pc = NULL;
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
    if (params->field_mask & KVF_XFER_PLAN_PARAM_FIELD_PIECES) {
        if (!kvf_xfer_pieces_match(params->pieces, params)) {
            kvf_error("xfer plan: the pieces given were built for another engine, rank or"
                      " geometry");
            return KVF_ERR_INVALID_PARAM;
        }
        pc = params->pieces;
    }
    P = params->remote_tp;
    kvf_xfer_planner_init(&pl, params);
    if (pc != NULL) {
        kvf_xfer_planner_borrow(&pl, pc);
    }
    pl.remote_region = calloc((size_t)P, sizeof(*pl.remote_region));
    pl.reads = calloc((size_t)P, sizeof(*pl.reads));
    pl.descs = calloc((size_t)P, sizeof(*pl.descs));
    if ((pl.remote_region == NULL) || (pl.reads == NULL) || (pl.descs == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto out_free_build;
    }

    status = kvf_xfer_plan_check(params, &pl.local_region, pl.remote_region, pl.reads,
                                 pc != NULL);
    if (status != KVF_OK) {
        goto out_free_build;
    }
    status = kvf_xfer_plan_blocks(&pl);
    if (status != KVF_OK) {
        goto out_free_build;
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
    plan->sources = calloc((size_t)P, sizeof(*plan->sources));
    if ((plan->ranks == NULL) || (plan->sources == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto out_free_plan;
    }
    for (int r = 0; r < P; ++r) {   /* kvf_xfer_plan_check() marked them */
        if (pl.reads[r]) {
            plan->sources[plan->num_sources++] = r;
        }
    }
    for (int r = 0; r < P; ++r) {
        kvf_xfer_desc_vec_t *vec = &pl.descs[r];
        kvf_xfer_rank_plan_t *rp;
        if (vec->n == 0) {
            continue;
        }
        vec->n = kvf_xfer_desc_sort_merge(vec->v, vec->n, pl.coalesce);
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
    pl.zero.n = kvf_xfer_range_sort_merge(pl.zero.v, pl.zero.n);
    plan->num_zero = pl.zero.n;
    plan->zero = pl.zero.v;
    pl.zero.v = NULL;
    for (size_t i = 0; i < plan->num_zero; ++i) {
        plan->zero_bytes += plan->zero[i].len;
    }
    plan->attn_bytes = pl.attn_bytes;
    plan->mamba_bytes = pl.mamba_bytes;
    plan->pad_bytes = pl.pad_bytes;
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
    if ((pc == NULL) || (pl.mamba != pc->mamba)) {
        free(pl.mamba);
    }
    if ((pc == NULL) || (pl.attn != pc->attn)) {
        free(pl.attn);
    }
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
    free(plan->sources);
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
