/*
 * UCX connector: what a decode rank does with its pool around the GETs:
 * the pool's device (memory type, zeroing stream), a pull's plan params
 * (and the plan of a same-node template pull, built only when asked for),
 * the zero post-ops once the last GET landed, and the KV digests of what
 * landed.
 *
 * Design. A pool on the CPU is zeroed exactly as before device pools
 * existed: one kvf_zero_ranges() over the plan's ranges. A pool in CUDA
 * memory gets a stream of its own at registration
 * (kvf_device_stream_create()); after the last GET completed, the plan's
 * ranges, whole pages and partial tails alike, are zeroed by ONE kernel
 * launch that takes the range list (kvf_zero_ranges_batch()) on that
 * stream, and the poll that saw the GETs land waits for the stream
 * (kvf_device_sync()) before it reports the request done: when poll says
 * KVF_OK the bytes are final for any stream of the engine. Rejected: an
 * event the engine's stream waits on (needs the engine's stream here, and
 * the kernels layer has no event API); a host-side memset (the pool is not
 * host memory); a page kernel for whole pages plus one cudaMemsetAsync per
 * partial tail (what this did before: 16-64 API calls per pull at 8k
 * tokens, each microseconds of host time).
 */
#include "kvf_connector_ucx_int.h"

#include "kvf_device.h"
#include "kvf_fault.h"
#include "kvf_kern_status.h"
#include "kvf_kv_digest_dev.h"
#include "kvf_log.h"
#include "kvf_zero_batch.h"

#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_conn_pool_device(kvf_connector_h conn, const kvf_connector_pool_t *pool,
                                  kvf_xfer_mem_type_t *type_p)
{
    switch (pool->device.kind) {
    case KVF_DEVICE_CPU:
        *type_p = KVF_XFER_MEM_HOST;
        return KVF_OK;
    case KVF_DEVICE_CUDA:
        *type_p = KVF_XFER_MEM_CUDA;
        return KVF_OK;
    }
    kvf_error("ucx connector %s: rank %d pool device kind %d is not one of cpu (0), cuda (1)",
              conn->engine_id, pool->tp_rank, (int)pool->device.kind);
    return KVF_ERR_INVALID_PARAM;
}

kvf_status_t kvf_conn_pool_stream(kvf_connector_h conn, kvf_conn_rank_t *rk,
                                  const kvf_connector_pool_t *pool)
{
    int err;

    if (pool->device.kind == KVF_DEVICE_CPU) {
        rk->device = pool->device;
        return KVF_OK;
    }
    err = kvf_device_stream_create(&pool->device, &rk->device);
    if (err != KVF_KERN_OK) {
        kvf_error("ucx connector %s: rank %d: no zeroing stream on %s:%d: %s", conn->engine_id,
                  pool->tp_rank, kvf_device_kind_name(pool->device.kind),
                  pool->device.ordinal, kvf_kern_strerror(err));
        return kvf_status_from_kern(err);
    }
    return KVF_OK;
}

void kvf_conn_pool_stream_destroy(kvf_conn_rank_t *rk)
{
    kvf_device_stream_destroy(&rk->device);   /* CPU, or no stream: nothing */
}

kvf_status_t kvf_conn_zero_tails(kvf_connector_h conn, kvf_connector_req_h req)
{
    kvf_conn_rank_t *rk = &conn->ranks[req->rank];
    int err;

    if (rk->device.kind == KVF_DEVICE_CPU) {
        err = kvf_zero_ranges(&rk->device, rk->base, req->zero_off, req->zero_len,
                              req->plan->num_zero);
    } else {
        /* whole pages and tails alike, one launch on the pool's stream; done means final */
        err = kvf_zero_ranges_batch(&rk->device, rk->base, req->zero_off, req->zero_len,
                                    req->plan->num_zero);
        if (err == KVF_KERN_OK) {
            err = kvf_device_sync(&rk->device);
        }
    }
    if (err != KVF_KERN_OK) {
        kvf_error("ucx connector: zeroing %zu tail range(s) of request %s on rank %d "
                  "(%s) failed: %s", req->plan->num_zero, req->request_id, req->rank,
                  kvf_device_kind_name(rk->device.kind), kvf_kern_strerror(err));
        return kvf_status_from_kern(err);
    }
    return KVF_OK;
}

/* Rank @a tp_rank's plan params of @a pull from engine @a e (@a groups: their storage),
 * with the pair's pieces. */
void kvf_conn_plan_params(kvf_connector_h conn, int tp_rank, const kvf_conn_engine_t *e,
                          const kvf_connector_pull_t *pull, kvf_xfer_plan_params_t *pp,
                          kvf_xfer_group_blocks_t *groups)
{
    const kvf_conn_rank_t *rk = &conn->ranks[tp_rank];

    memset(pp, 0, sizeof(*pp));
    pp->flags = conn->plan_flags | pull->plan_flags;
    pp->field_mask = (pp->flags != 0) ? KVF_XFER_PLAN_PARAM_FIELD_FLAGS : 0;
    pp->cfg = &conn->cfg;
    pp->layout = conn->layout;
    pp->local_tp = conn->tp;
    pp->local_rank = tp_rank;
    pp->local_geom = &rk->geom;
    pp->local_num_blocks = rk->num_blocks;
    pp->remote_tp = e->tp;
    pp->remote_geoms = e->geoms;
    pp->remote_num_blocks = e->num_blocks;
    pp->num_groups = pull->num_groups;
    for (int g = 0; g < pull->num_groups; ++g) {
        groups[g].local_ids = pull->local_ids[g];
        groups[g].num_local = pull->num_local_ids[g];
        groups[g].remote_ids = pull->remote_ids[g];
        groups[g].num_remote = pull->num_remote_ids[g];
    }
    pp->groups = groups;
    pp->num_tokens = pull->num_tokens;
    if (pull->skip_tokens != 0) {
        pp->field_mask |= KVF_XFER_PLAN_PARAM_FIELD_SKIP;
        pp->skip_tokens = pull->skip_tokens;
    }
    kvf_conn_use_pieces(e, tp_rank, pp);
}

/* The plan of a request that took the template path, built from its kept ids when first
 * asked for (digests, stats): its descriptors are the bytes the gather copied. */
kvf_status_t kvf_conn_req_plan(kvf_connector_h conn, kvf_connector_req_h req)
{
    kvf_xfer_group_blocks_t groups[KVF_MAX_KV_GROUPS];
    kvf_xfer_plan_params_t pp;

    if (req->plan != NULL) {
        return KVF_OK;
    }
    if (req->pull_copy == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    kvf_conn_plan_params(conn, req->rank, &conn->engines[req->engine], req->pull_copy, &pp,
                         groups);
    return kvf_xfer_plan_create(&pp, &req->plan);
}

/* Digest what rank @a tp_rank received from prefill rank plan @a i (fault ucx.data first). */
static kvf_status_t kvf_conn_digest_one(kvf_connector_h conn, kvf_connector_req_h req, int i)
{
    const kvf_xfer_rank_plan_t *rp = &req->plan->ranks[i];
    kvf_conn_rank_t *rk = &conn->ranks[req->rank];
    kvf_kv_digest_t *d = &req->digests[i];
    uint64_t *local;
    kvf_status_t status;

    d->decode_rank = req->rank;
    d->prefill_rank = rp->remote_rank;
    d->num_ranges = rp->num_descs;
    d->ranges = malloc(2 * rp->num_descs * sizeof(*d->ranges) + 1);
    local = malloc(2 * rp->num_descs * sizeof(*local) + 1);
    if ((d->ranges == NULL) || (local == NULL)) {
        free(local);
        return KVF_ERR_NO_MEMORY;   /* d->ranges freed with the request */
    }
#if KVF_FAULT_ENABLED
    if ((rp->num_descs > 0) && (KVF_FAULT(UCX_DATA) == KVF_FAULT_CORRUPT)) {
        /* through the device layer: the pool may be GPU memory */
        uint8_t *at = rk->base + rp->descs[0].local_off + rp->descs[0].len / 2, b = 0;
        (void)kvf_device_memcpy(&rk->device, &b, at, 1, KVF_COPY_D2H);
        kvf_warn("fault ucx.data: request %s: one byte from prefill rank %d flipped (0x%02x)",
                 req->request_id, rp->remote_rank, b);
        b ^= 0xff;
        (void)kvf_device_memcpy(&rk->device, at, &b, 1, KVF_COPY_H2D);
    }
#endif
    for (size_t k = 0; k < rp->num_descs; ++k) {
        d->ranges[2 * k] = rp->descs[k].remote_off;
        d->ranges[2 * k + 1] = rp->descs[k].len;
        local[2 * k] = rp->descs[k].local_off;
        local[2 * k + 1] = rp->descs[k].len;
    }
    /* a GPU pool: the landed bytes are copied to the host once and hashed there */
    status = kvf_kv_digest_ranges_dev(&rk->device, rk->base, local, rp->num_descs, &d->digest);
    free(local);
    return status;
}

kvf_status_t kvf_conn_req_digests(kvf_connector_h conn, int tp_rank, kvf_connector_req_h req,
                                  const kvf_kv_digest_t **digests_p, int *n_p)
{
    if ((req == NULL) || (req->rank != tp_rank) || (req->status != KVF_OK) ||
        (digests_p == NULL) || (n_p == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    KVF_CONN_CHECK_RANK(conn, tp_rank, "req_digests");
    if ((req->digests == NULL) && (kvf_conn_req_plan(conn, req) != KVF_OK)) {
        return KVF_ERR_NO_MEMORY;   /* the plan of the pull that ran: logged */
    }
    if (req->digests == NULL) {
        req->digests = calloc((size_t)req->plan->num_ranks + 1, sizeof(*req->digests));
        if (req->digests == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        for (int i = 0; i < req->plan->num_ranks; ++i) {
            kvf_status_t status = kvf_conn_digest_one(conn, req, i);
            if (status != KVF_OK) {
                return status;   /* freed with the request */
            }
        }
    }
    *digests_p = req->digests;
    *n_p = req->plan->num_ranks;
    return KVF_OK;
}
