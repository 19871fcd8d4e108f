/*
 * kvf_xfer_tmpl.h: the gather's templates of an (engine, rank) pair and a request's jobs.
 *
 * Design: the jobs follow kvf_xfer_plan_blocks() block for block (skip, window, coverage,
 * partial last block, a Mamba group's last id) and run the plan's own input checks
 * (kvf_xfer_params_check(), kvf_xfer_plan_check() with the pair's checked geometries), so
 * a request the plan refuses is refused here with the same error; what is left out is the
 * walk over pages and runs, which the kernel does from the templates. Rejected: templates
 * for unequal block sizes (a local block's runs then depend on its position modulo the
 * sizes' least common multiple and read several source blocks: one job would need a list
 * of source ids; those pairs keep the op list), and for a head-major KV layout on either
 * side (a job's op addresses page (id * slots + j), which a head-major layer slot is not:
 * such pairs keep the plan and its op list).
 */
#include "kvf_xfer_tmpl.h"
#include "kvf_xfer_check.h"
#include "kvf_xfer_plan_int.h"
#include "kvf_xfer_window.h"

#include "kvf_log.h"
#include "kvf_tp_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void kvf_xfer_tmpl_add(kvf_xfer_tmpls_t *t, uint32_t src, uint64_t loff, uint64_t roff,
                              uint64_t len, uint32_t row, uint32_t tok0, uint64_t pad)
{
    t->pieces[t->num_pieces++] = (kvf_gather_piece_t){
        .src = src, .row = row, .tok0 = tok0, .pad = (uint32_t)pad, .loff = loff,
        .roff = roff, .len = len};
}

/* Begin template @a k at the next piece. */
static void kvf_xfer_tmpl_begin(kvf_xfer_tmpls_t *t, int k)
{
    t->tmpls[k].first = (uint32_t)t->num_pieces;
}

static void kvf_xfer_tmpl_end(kvf_xfer_tmpls_t *t, int k)
{
    t->tmpls[k].count = (uint32_t)t->num_pieces - t->tmpls[k].first;
    if (t->tmpls[k].count == 0) {
        t->tmpls[k] = t->tmpls[KVF_XFER_TMPL_ZERO];   /* absent: never named by a job */
    }
}

/* The partial block's runs: every (kernel block, K/V, head), kl rows each, clip-able. */
static void kvf_xfer_tmpl_part(const kvf_xfer_pieces_t *pc, kvf_xfer_tmpls_t *t)
{
    const kvf_rank_geometry_t *lg = &pc->local_geom;
    int kl = lg->kernel_block_size;
    uint32_t row = (uint32_t)((size_t)pc->cfg->head_dim * kvf_dtype_size(lg->kv_dtype));

    for (int kb = 0; kb < lg->ppl; ++kb) {
        for (int kv = 0; kv < 2; ++kv) {
            for (int h = 0; h < lg->shard.kv_heads; ++h) {
                const kvf_rank_geometry_t *rg = &pc->remote_geoms[pc->attn_src[h]];
                kvf_xfer_tmpl_add(t, (uint32_t)pc->attn_src[h],
                                  kvf_attn_offset(lg, pc->cfg, kb * kl, kv, h, 0),
                                  kvf_attn_offset(rg, pc->cfg, kb * kl, kv, pc->attn_src_head[h],
                                                  0),
                                  (uint64_t)kl * row, row, (uint32_t)(kb * kl), 0);
            }
        }
    }
}

/* Whether every side is layer-major: a job's ops address page (id * slots + j), which a
 * head-major layer slot is not (such pairs keep the plan and its op list); @a why says which
 * side is not (may be NULL). */
static bool kvf_xfer_tmpl_layer_major(const kvf_xfer_pieces_t *pc, char *why, size_t why_len)
{
    for (int r = -1; r < pc->remote_tp; ++r) {
        const kvf_rank_geometry_t *g = (r < 0) ? &pc->local_geom : &pc->remote_geoms[r];
        if (g->kv_layout != KVF_KV_LAYER_MAJOR) {
            if (why != NULL) {
                snprintf(why, why_len, "%s rank %d has the %s KV layout (templates address "
                         "layer-major pages)", (r < 0) ? "decode" : "prefill",
                         (r < 0) ? pc->local_rank : r, kvf_kv_layout_name((int)g->kv_layout));
            }
            return false;
        }
    }
    return true;
}

kvf_status_t kvf_xfer_tmpls_build(const kvf_xfer_pieces_t *pc, kvf_xfer_tmpls_t *out,
                                  char *why, size_t why_len)
{
    const kvf_rank_geometry_t *lg = &pc->local_geom;
    size_t cap;

    memset(out, 0, sizeof(*out));
    if (!kvf_xfer_tmpl_layer_major(pc, why, why_len)) {
        return KVF_ERR_UNSUPPORTED;
    }
    if (pc->attn_mapped && (pc->attn_whole <= 0)) {
        snprintf(why, why_len, "block or kernel block sizes differ between the sides (a "
                 "local block spans several source blocks)");
        return KVF_ERR_UNSUPPORTED;
    }
    if (pc->remote_tp > KVF_GATHER_TMPL_MAX_SRC) {
        snprintf(why, why_len, "%d prefill ranks (templates hold %d)", pc->remote_tp,
                 KVF_GATHER_TMPL_MAX_SRC);
        return KVF_ERR_UNSUPPORTED;
    }
    if (kvf_tp_source_ranks(pc->cfg, pc->remote_tp, pc->local_tp, pc->local_rank,
                            out->sources, &out->num_sources) != KVF_OK) {
        snprintf(why, why_len, "no source ranks for this pair");
        return KVF_ERR_UNSUPPORTED;
    }
    cap = 1 + pc->num_mamba + pc->num_attn + (size_t)lg->ppl * 2 * (size_t)lg->shard.kv_heads;
    out->pieces = malloc(cap * sizeof(*out->pieces));
    if (out->pieces == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_xfer_tmpl_begin(out, KVF_XFER_TMPL_ZERO);
    kvf_xfer_tmpl_add(out, KVF_GATHER_TMPL_ZERO, 0, 0, lg->page_size, 0, 0, 0);
    kvf_xfer_tmpl_end(out, KVF_XFER_TMPL_ZERO);
    kvf_xfer_tmpl_begin(out, KVF_XFER_TMPL_MAMBA);
    for (size_t i = 0; i < pc->num_mamba; ++i) {
        const kvf_xfer_piece_t *m = &pc->mamba[i];
        kvf_xfer_tmpl_add(out, (uint32_t)m->rank, m->loff, m->roff, m->len, 0, 0, m->pad);
    }
    kvf_xfer_tmpl_end(out, KVF_XFER_TMPL_MAMBA);
    kvf_xfer_tmpl_begin(out, KVF_XFER_TMPL_WHOLE);
    for (size_t i = 0; i < pc->num_attn; ++i) {
        const kvf_xfer_piece_t *a = &pc->attn[i];
        kvf_xfer_tmpl_add(out, (uint32_t)a->rank, a->loff, a->roff, a->len, 0, 0, 0);
    }
    kvf_xfer_tmpl_end(out, KVF_XFER_TMPL_WHOLE);
    kvf_xfer_tmpl_begin(out, KVF_XFER_TMPL_PART);
    if (pc->attn_mapped) {
        kvf_xfer_tmpl_part(pc, out);
    }
    kvf_xfer_tmpl_end(out, KVF_XFER_TMPL_PART);
    return KVF_OK;
}

void kvf_xfer_tmpls_free(kvf_xfer_tmpls_t *t)
{
    free(t->pieces);
    memset(t, 0, sizeof(*t));
}

size_t kvf_xfer_tmpl_jobs_max(const kvf_xfer_plan_params_t *p)
{
    size_t n = 0;

    for (int g = 0; g < p->num_groups; ++g) {
        n += (p->groups[g].num_local > 0) ? (size_t)p->groups[g].num_local : 1;
    }
    return n;
}

/* Bytes job @a jb copies (returned) and zeroes (@a zero_p), as the plan counts them. */
static uint64_t kvf_xfer_job_bytes(const kvf_xfer_pieces_t *pc, const kvf_gather_job_t *jb,
                                   uint64_t *zero_p)
{
    const kvf_rank_geometry_t *lg = &pc->local_geom;
    uint64_t copy = 0;

    switch (jb->tmpl) {
    case KVF_XFER_TMPL_ZERO:
        *zero_p += (uint64_t)jb->nslots * lg->page_size;
        return 0;
    case KVF_XFER_TMPL_MAMBA:
        for (size_t i = 0; i < pc->num_mamba; ++i) {
            copy += (uint64_t)jb->nslots * pc->mamba[i].len - pc->mamba[i].pad;
        }
        return copy;
    case KVF_XFER_TMPL_WHOLE:
        for (size_t i = 0; i < pc->num_attn; ++i) {
            copy += (uint64_t)jb->nslots * pc->attn[i].len;
        }
        return copy;
    default: {   /* partial: tokens rows of every (K/V, head), the rest of the blocks zeroed */
        uint64_t row = (uint64_t)pc->cfg->head_dim * kvf_dtype_size(lg->kv_dtype);
        uint64_t all = (uint64_t)lg->ppl * (uint64_t)lg->kernel_block_size;
        uint64_t per = 2u * (uint64_t)lg->shard.kv_heads * row * jb->nslots;
        *zero_p += (all - jb->tokens) * per;
        return (uint64_t)jb->tokens * per;
    }
    }
}

/* One job; @a jobs has room. */
static void kvf_xfer_job_put(kvf_gather_job_t *jobs, size_t *n, uint32_t tmpl, int nslots,
                             int32_t lid, int32_t rid, uint32_t tokens)
{
    jobs[(*n)++] = (kvf_gather_job_t){.tmpl = tmpl, .nslots = (uint32_t)nslots, .lid = lid,
                                      .rid = rid, .tokens = tokens};
}

/* Group @a g's jobs (an attention group's blocks from skip on, a Mamba group's last id). */
static void kvf_xfer_group_jobs(const kvf_xfer_plan_params_t *p, int g, int64_t skip,
                                kvf_gather_job_t *jobs, size_t *n)
{
    const kvf_kv_group_t *grp = &p->layout->groups[g];
    const kvf_xfer_group_blocks_t *gb = &p->groups[g];
    const int bl = p->local_geom->block_size;
    const int64_t N = p->num_tokens, used = (N + bl - 1) / bl;
    int64_t first;

    if (!kvf_group_is_attention(grp->kind)) {
        kvf_xfer_job_put(jobs, n, KVF_XFER_TMPL_MAMBA, grp->num_layers,
                         gb->local_ids[gb->num_local - 1], gb->remote_ids[gb->num_remote - 1],
                         KVF_GATHER_TMPL_WHOLE);
        return;
    }
    first = ((p->field_mask & KVF_XFER_PLAN_PARAM_FIELD_FLAGS) &&
             (p->flags & KVF_XFER_PLAN_FLAG_WINDOW)) ?
            kvf_xfer_group_window_first(p->cfg, grp, N, bl) : 0;
    for (int64_t lb = skip; lb < gb->num_local; ++lb) {
        if ((lb < first) || (lb >= used)) {
            kvf_xfer_job_put(jobs, n, KVF_XFER_TMPL_ZERO, grp->num_layers, gb->local_ids[lb], 0,
                             KVF_GATHER_TMPL_WHOLE);
        } else if ((lb + 1) * bl <= N) {
            kvf_xfer_job_put(jobs, n, KVF_XFER_TMPL_WHOLE, grp->num_layers, gb->local_ids[lb],
                             gb->remote_ids[lb], KVF_GATHER_TMPL_WHOLE);
        } else {
            kvf_xfer_job_put(jobs, n, KVF_XFER_TMPL_PART, grp->num_layers, gb->local_ids[lb],
                             gb->remote_ids[lb], (uint32_t)(N - lb * bl));
        }
    }
}

/* A windowed pull whose attention group mixes full and sliding layers before the window: a
 * block there is read in its full layers' slots only (kvf_xfer_window.h), which no template
 * says (a template reads or zeroes a block's every slot), so such a pull takes the op list. */
static bool kvf_xfer_tmpl_mixed_window(const kvf_xfer_plan_params_t *p)
{
    const int bl = p->local_geom->block_size;

    if (!(p->field_mask & KVF_XFER_PLAN_PARAM_FIELD_FLAGS) ||
        !(p->flags & KVF_XFER_PLAN_FLAG_WINDOW)) {
        return false;
    }
    for (int g = 0; g < p->num_groups; ++g) {
        const kvf_kv_group_t *grp = &p->layout->groups[g];
        if (!kvf_group_is_attention(grp->kind) ||
            (kvf_xfer_group_window_first(p->cfg, grp, p->num_tokens, bl) <= 0)) {
            continue;
        }
        for (int j = 0; j < grp->num_layers; ++j) {
            if (!kvf_xfer_slot_slides(p->cfg, grp, j)) {
                return true;
            }
        }
    }
    return false;
}

kvf_status_t kvf_xfer_tmpl_jobs(const kvf_xfer_plan_params_t *p, kvf_gather_job_t *jobs,
                                size_t *n_p, uint64_t *bytes_p, uint64_t *zero_p)
{
    const kvf_xfer_pieces_t *pc;
    uint64_t local_region, remote_region[KVF_GATHER_TMPL_MAX_SRC] = {0};
    bool reads[KVF_GATHER_TMPL_MAX_SRC] = {false};
    kvf_status_t status = kvf_xfer_params_check(p);
    int64_t skip;
    size_t n = 0;

    if (status != KVF_OK) {
        return status;
    }
    pc = (p->field_mask & KVF_XFER_PLAN_PARAM_FIELD_PIECES) ? p->pieces : NULL;
    if ((pc == NULL) || !kvf_xfer_pieces_match(pc, p) || (p->remote_tp > KVF_GATHER_TMPL_MAX_SRC) ||
        (pc->attn_mapped && (pc->attn_whole <= 0)) || !kvf_xfer_tmpl_layer_major(pc, NULL, 0)) {
        return KVF_ERR_UNSUPPORTED;
    }
    status = kvf_xfer_plan_check(p, &local_region, remote_region, reads, true);
    if (status != KVF_OK) {
        return status;
    }
    if (kvf_xfer_tmpl_mixed_window(p)) {
        return KVF_ERR_UNSUPPORTED;   /* the op list reads the full layers' slots alone */
    }
    skip = (p->field_mask & KVF_XFER_PLAN_PARAM_FIELD_SKIP) ?
           p->skip_tokens / p->local_geom->block_size : 0;
    for (int g = 0; g < p->num_groups; ++g) {
        kvf_xfer_group_jobs(p, g, skip, jobs, &n);
    }
    *bytes_p = 0;
    *zero_p = 0;
    for (size_t i = 0; i < n; ++i) {
        *bytes_p += kvf_xfer_job_bytes(pc, &jobs[i], zero_p);
    }
    *n_p = n;
    return KVF_OK;
}
