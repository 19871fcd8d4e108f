/*
 * kvf bench: descriptor-list export and the memcpy copy limit of the same
 * descriptors.
 */
#include "kvf_xt_int.h"

/* ---- copy limit and descriptor export (bench) --------------------------- */

/* The planner's params for decode rank @a d, from the geometry both sides were given. */
static void xt_plan_params(const xt_ctx_t *c, int d, kvf_xfer_group_blocks_t *groups,
                           int64_t *nb, kvf_xfer_plan_params_t *pp)
{
    for (int r = 0; r < c->pre.tp; ++r) {
        nb[r] = c->pre.num_blocks;
    }
    memset(pp, 0, sizeof(*pp));
    pp->field_mask = c->o.no_coalesce ? KVF_XFER_PLAN_PARAM_FIELD_FLAGS : 0;
    pp->flags = c->o.no_coalesce ? KVF_XFER_PLAN_FLAG_NO_COALESCE : 0;
    pp->cfg = &c->cfg;
    pp->layout = c->layout;
    pp->local_tp = c->dec.tp;
    pp->local_rank = d;
    pp->local_geom = &c->dec.geom[d];
    pp->local_num_blocks = c->dec.num_blocks;
    pp->remote_tp = c->pre.tp;
    pp->remote_geoms = c->pre.geom;
    pp->remote_num_blocks = nb;
    pp->num_groups = c->pm.num_groups;
    for (int gi = 0; gi < pp->num_groups; ++gi) {
        groups[gi].local_ids = c->dec.ids[gi];
        groups[gi].num_local = c->dec.num_ids[gi];
        groups[gi].remote_ids = c->pm.ids[gi];
        groups[gi].num_remote = c->pm.num_ids[gi];
    }
    pp->groups = groups;
    pp->num_tokens = c->o.tokens;
}

/*
 * The plan of decode rank @a d (the connector plans the same from the handshake; this copy
 * only feeds the descriptor file, the memcpy reference and --plan-reps, never a transfer);
 * with @a pieces (kvf_xt_pieces_rank) when not NULL, as a connector's later pulls plan.
 */
kvf_status_t kvf_xt_plan_rank_with(const xt_ctx_t *c, int d, const kvf_xfer_pieces_t *pieces,
                                   kvf_xfer_plan_t **plan_p)
{
    kvf_xfer_group_blocks_t groups[KVF_MAX_KV_GROUPS];
    int64_t nb[KVF_XFER_MAX_TP];
    kvf_xfer_plan_params_t pp;

    xt_plan_params(c, d, groups, nb, &pp);
    if (pieces != NULL) {
        pp.field_mask |= KVF_XFER_PLAN_PARAM_FIELD_PIECES;
        pp.pieces = pieces;
    }
    return kvf_xfer_plan_create(&pp, plan_p);
}

kvf_status_t kvf_xt_plan_rank(const xt_ctx_t *c, int d, kvf_xfer_plan_t **plan_p)
{
    return kvf_xt_plan_rank_with(c, d, NULL, plan_p);
}

kvf_status_t kvf_xt_pieces_rank(const xt_ctx_t *c, int d, kvf_xfer_pieces_t **pieces_p)
{
    kvf_xfer_group_blocks_t groups[KVF_MAX_KV_GROUPS];
    int64_t nb[KVF_XFER_MAX_TP];
    kvf_xfer_plan_params_t pp;

    xt_plan_params(c, d, groups, nb, &pp);
    return kvf_xfer_pieces_create(&pp, pieces_p);
}

static size_t xt_pool_bytes(const xt_ctx_t *c, const xt_side_t *side, int r)
{
    return (size_t)side->num_blocks * (size_t)c->layout->slots * side->geom[r].page_size;
}

int kvf_xt_write_descs(const xt_ctx_t *c, kvf_xfer_plan_t **plans)
{
    FILE *f = fopen(c->o.descs_out, "w");
    if (f == NULL) {
        kvf_error("cannot write --descs-out %s: %m", c->o.descs_out);
        return -1;
    }
    fprintf(f, "{\"model\": \"%s\", \"layout\": \"%dp%dd\", \"tokens\": %d,\n",
            c->o.model, c->pre.tp, c->dec.tp, c->o.tokens);
    fprintf(f, " \"prefill_pool_bytes\": [");
    for (int r = 0; r < c->pre.tp; ++r) {
        fprintf(f, "%s%zu", r ? ", " : "", xt_pool_bytes(c, &c->pre, r));
    }
    fprintf(f, "],\n \"decode_pool_bytes\": [");
    for (int r = 0; r < c->dec.tp; ++r) {
        fprintf(f, "%s%zu", r ? ", " : "", xt_pool_bytes(c, &c->dec, r));
    }
    fprintf(f, "],\n \"reads\": [");
    for (int d = 0, first = 1; d < c->dec.tp; ++d) {
        for (int i = 0; i < plans[d]->num_ranks; ++i, first = 0) {
            const kvf_xfer_rank_plan_t *rp = &plans[d]->ranks[i];
            fprintf(f, "%s\n  {\"decode_rank\": %d, \"prefill_rank\": %d, \"bytes\": %" PRIu64
                    ", \"descs\": [", first ? "" : ",", d, rp->remote_rank, rp->bytes);
            for (size_t k = 0; k < rp->num_descs; ++k) {
                fprintf(f, "%s[%" PRIu64 ", %" PRIu64 ", %" PRIu64 "]", k ? ", " : "",
                        rp->descs[k].local_off, rp->descs[k].remote_off, rp->descs[k].len);
            }
            fprintf(f, "]}");
        }
    }
    fprintf(f, "\n ]}\n");
    return (fclose(f) == 0) ? 0 : -1;
}

typedef struct {
    const xt_ctx_t        *c;
    const kvf_xfer_plan_t *plan;
    uint8_t              **src;      /* [P] prefill pools (copies) */
    uint8_t               *dst;      /* this decode rank's pool (a copy) */
    pthread_barrier_t     *barrier;
    uint64_t               t0[XT_MAX_ITERS], t1[XT_MAX_ITERS];
} xt_copy_t;

static void *xt_copy_thread(void *arg)
{
    xt_copy_t *x = arg;

    for (int it = -1; it < x->c->o.iters; ++it) {   /* -1: warm-up, like the pulls' */
        pthread_barrier_wait(x->barrier);
        uint64_t t0 = kvf_time_now_ns();
        for (int i = 0; i < x->plan->num_ranks; ++i) {
            const kvf_xfer_rank_plan_t *rp = &x->plan->ranks[i];
            for (size_t k = 0; k < rp->num_descs; ++k) {
                memcpy(x->dst + rp->descs[k].local_off,
                       x->src[rp->remote_rank] + rp->descs[k].remote_off, rp->descs[k].len);
            }
        }
        if (it >= 0) {
            x->t0[it] = t0;
            x->t1[it] = kvf_time_now_ns();
        }
    }
    return NULL;
}

/*
 * Device pools: one device-to-device copy (kvf_device_memcpy, then kvf_device_sync) of
 * @a bytes between two fresh buffers on --device, timed like the pulls (a
 * warm-up, then --iters). The rate a same-node pull is measured against.
 * Returns the median ns, 0 on failure (logged).
 */
uint64_t kvf_xt_device_copy_limit(const xt_ctx_t *c, uint64_t bytes)
{
    uint64_t t[XT_MAX_ITERS], med = 0;
    void *src = NULL, *dst = NULL;
    kvf_device_t dev;
    int err;

    err = kvf_device_init(c->o.dev_kind, c->o.dev_ordinal, &dev);
    if (err == KVF_KERN_OK) {
        err = kvf_device_alloc(&dev, (size_t)bytes, &src);
    }
    if (err == KVF_KERN_OK) {
        err = kvf_device_alloc(&dev, (size_t)bytes, &dst);
    }
    if (err == KVF_KERN_OK) {
        err = kvf_device_memset(&dev, src, 0x5a, (size_t)bytes);
    }
    for (int it = -1; (err == KVF_KERN_OK) && (it < c->o.iters); ++it) {
        uint64_t t0 = kvf_time_now_ns();
        err = kvf_device_memcpy(&dev, dst, src, (size_t)bytes, KVF_COPY_D2D);
        if (err == KVF_KERN_OK) {
            err = kvf_device_sync(&dev);   /* a device copy is only enqueued: time it done */
        }
        if (it >= 0) {
            t[it] = kvf_time_now_ns() - t0;
        }
    }
    if (err == KVF_KERN_OK) {
        qsort(t, (size_t)c->o.iters, sizeof(t[0]), xt_cmp_u64);
        med = t[c->o.iters / 2];
    } else {
        kvf_error("bench: device copy limit on %s: %s", c->o.device, kvf_kern_strerror(err));
    }
    kvf_device_free(&dev, src);
    kvf_device_free(&dev, dst);
    return med;
}

/*
 * memcpy of every descriptor list, one thread per decode rank, between
 * buffers of the pools' sizes in this process: the copy limit of the
 * machine for this request. Returns the median ns, 0 on failure.
 */
uint64_t kvf_xt_copy_limit(const xt_ctx_t *c, kvf_xfer_plan_t **plans)
{
    uint8_t *src[KVF_XFER_MAX_TP] = {NULL};
    xt_copy_t x[KVF_XFER_MAX_TP];
    pthread_t th[KVF_XFER_MAX_TP];
    pthread_barrier_t barrier;
    uint64_t t[XT_MAX_ITERS], med = 0;
    int ok = 1;

    memset(x, 0, sizeof(x));
    for (int r = 0; r < c->pre.tp; ++r) {
        src[r] = malloc(xt_pool_bytes(c, &c->pre, r));
        ok = ok && (src[r] != NULL);
        if (src[r] != NULL) {
            memset(src[r], 0x5a, xt_pool_bytes(c, &c->pre, r));   /* fault the pages in */
        }
    }
    for (int d = 0; d < c->dec.tp; ++d) {
        x[d].dst = malloc(xt_pool_bytes(c, &c->dec, d));
        ok = ok && (x[d].dst != NULL);
        if (x[d].dst != NULL) {
            /* not 0: malloc + memset(0) may become calloc, leaving the pages unfaulted */
            memset(x[d].dst, 0xa5, xt_pool_bytes(c, &c->dec, d));
        }
    }
    if (ok) {
        pthread_barrier_init(&barrier, NULL, (unsigned)c->dec.tp);
        for (int d = 0; d < c->dec.tp; ++d) {
            x[d].c = c;
            x[d].plan = plans[d];
            x[d].src = src;
            x[d].barrier = &barrier;
            pthread_create(&th[d], NULL, xt_copy_thread, &x[d]);
        }
        for (int d = 0; d < c->dec.tp; ++d) {
            pthread_join(th[d], NULL);
        }
        pthread_barrier_destroy(&barrier);
        for (int it = 0; it < c->o.iters; ++it) {
            uint64_t s = UINT64_MAX, e = 0;
            for (int d = 0; d < c->dec.tp; ++d) {
                s = (x[d].t0[it] < s) ? x[d].t0[it] : s;
                e = (x[d].t1[it] > e) ? x[d].t1[it] : e;
            }
            t[it] = (e > s) ? e - s : 1;
        }
        qsort(t, (size_t)c->o.iters, sizeof(t[0]), xt_cmp_u64);
        med = t[c->o.iters / 2];
    }
    for (int r = 0; r < c->pre.tp; ++r) {
        free(src[r]);
    }
    for (int d = 0; d < c->dec.tp; ++d) {
        free(x[d].dst);
    }
    return med;
}
