/*
 * UCX agent: batched one-sided transfers.
 *
 * Design: one batch = N ucp_get_nbx/ucp_put_nbx without callbacks (their
 * requests are released at once; UCX keeps driving them) followed by one
 * ucp_ep_flush_nbx whose callback marks the batch done. One completion per
 * batch, no per-descriptor bookkeeping, and the flush fails if any
 * operation before it failed (peer error mode). Rejected: a callback and
 * counter per descriptor (NIXL does this) — 10^5 callbacks per request for
 * a KV pull of a long prompt, for no extra information.
 *
 * Host cost per descriptor is what bounds a pull from device memory (a GET
 * there is an asynchronous copy UCX enqueues; the bytes move at device
 * speed): every GET names the local region's memory handle
 * (UCP_OP_ATTR_FIELD_MEMH), so UCX neither looks the buffer up in its
 * registration cache nor detects its memory type per GET, and carries
 * UCP_OP_ATTR_FLAG_MULTI_SEND (many operations in a row: bandwidth over
 * latency). The post loop allocates, logs and locks nothing; the range check
 * runs over the list first, so nothing is posted for a list with a bad entry.
 * A GET from a host region of a peer that ucp_rkey_ptr() mapped here (shared
 * memory on this node) is a memcpy in the post itself and the batch is done at
 * once: what UCX 1.13 did inside ucp_get_nbx, and what UCX 1.22 no longer does
 * (it emulates such GETs through the peer's worker: kvf_ucx_peer.c).
 */
#include "kvf_ucx_agent_int.h"

#include "kvf_fault.h"
#include "kvf_log.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

static void kvf_ucx_flush_cb(void *request, ucs_status_t ucs, void *user_data)
{
    kvf_ucx_batch_h batch = user_data;
    kvf_status_t status = kvf_ucx_status(ucs);

    (void)request;
    if ((status != KVF_OK) && !KVF_IS_PEER_ERROR(status) && (batch->peer->status != KVF_OK)) {
        status = batch->peer->status;   /* report the peer failure, not "canceled" */
    }
    batch->status = status;
}

/*
 * GETs from a region of a peer on this node that is mapped here (ucp_rkey_ptr): one memcpy
 * each, now, as UCX 1.13's shared-memory GET did inside ucp_get_nbx. Ranges checked by the
 * caller. The fault points pass as for posted GETs.
 */
static void kvf_ucx_xfer_copy(kvf_ucx_agent_h agent, const kvf_ucx_region_t *lr,
                              const kvf_ucx_remote_region_t *rr, const kvf_xfer_desc_t *descs,
                              size_t num_descs)
{
    uint8_t *lbase = lr->addr;

    for (size_t i = 0; i < num_descs; ++i) {
        memcpy(lbase + descs[i].local_off, rr->ptr + descs[i].remote_off, descs[i].len);
        agent->ops_posted++;
        (void)KVF_FAULT(UCX_POST);             /* tests: kill/stop/stall after n posted */
        if (i + 1 == (num_descs + 1) / 2) {
            (void)KVF_FAULT(UCX_HALF);         /* tests: half of this batch is in flight */
        }
    }
}

kvf_status_t kvf_ucx_xfer_post(kvf_ucx_agent_h agent, kvf_ucx_peer_h peer, kvf_ucx_op_t op,
                               int local_region, int remote_region,
                               const kvf_xfer_desc_t *descs, size_t num_descs,
                               kvf_ucx_batch_h *batch_p)
{
    const kvf_ucx_region_t *lr;
    const kvf_ucx_remote_region_t *rr;
    ucp_request_param_t param;
    kvf_ucx_batch_h batch;
    void *req;

    if ((local_region < 0) || (local_region >= agent->num_regions) || (remote_region < 0) ||
        (remote_region >= peer->num_regions) || (op > KVF_UCX_OP_PUT) ||
        ((descs == NULL) && (num_descs > 0))) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (peer->status != KVF_OK) {
        return peer->status;
    }
    lr = &agent->regions[local_region];
    rr = &peer->regions[remote_region];
    for (size_t i = 0; i < num_descs; ++i) {
        const kvf_xfer_desc_t *d = &descs[i];
        if ((d->len == 0) || (d->local_off > lr->len) || (d->len > lr->len - d->local_off) ||
            (d->remote_off > rr->len) || (d->len > rr->len - d->remote_off)) {
            kvf_error("%s: descriptor %zu {local %llu, remote %llu, len %llu} leaves a region "
                      "(local %zu, remote %llu bytes)", agent->name, i,
                      (unsigned long long)d->local_off, (unsigned long long)d->remote_off,
                      (unsigned long long)d->len, lr->len, (unsigned long long)rr->len);
            return KVF_ERR_OUT_OF_RANGE;
        }
    }
    batch = calloc(1, sizeof(*batch));
    if (batch == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    batch->peer = peer;
    batch->status = KVF_INPROGRESS;
    if ((op == KVF_UCX_OP_GET) && (rr->ptr != NULL) && (lr->mem_type == KVF_XFER_MEM_HOST)) {
        kvf_ucx_xfer_copy(agent, lr, rr, descs, num_descs);
        batch->status = KVF_OK;   /* landed: nothing in flight, nothing to flush */
        *batch_p = batch;
        return KVF_OK;
    }

    memset(&param, 0, sizeof(param));
#if KVF_UCX_HAS_OP_MEMH
    /* the region's own registration: every descriptor lies inside it (checked above) */
    param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FLAG_MULTI_SEND;
    param.memh = lr->memh;
#endif
#if KVF_UCX_HAS_MEM_TYPE_PARAMS
    if (lr->mem_type != KVF_XFER_MEM_HOST) {   /* the local buffer of every GET/PUT */
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        param.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
#endif
    uint8_t *lbase = lr->addr;
    ucp_ep_h ep = peer->ep;
    ucp_rkey_h rkey = rr->rkey;
    for (size_t i = 0; i < num_descs; ++i) {
        const kvf_xfer_desc_t *d = &descs[i];

        req = (op == KVF_UCX_OP_GET) ?
              ucp_get_nbx(ep, lbase + d->local_off, d->len, rr->addr + d->remote_off, rkey,
                          &param) :
              ucp_put_nbx(ep, lbase + d->local_off, d->len, rr->addr + d->remote_off, rkey,
                          &param);
        agent->ops_posted++;
        if (UCS_PTR_IS_ERR(req)) {
            /* operations already posted drain inside UCX; the batch is failed */
            batch->status = kvf_ucx_status(UCS_PTR_STATUS(req));
            if (peer->status != KVF_OK) {
                batch->status = peer->status;
            }
            kvf_error("%s: posting descriptor %zu to rank %d failed: %s", agent->name, i,
                      peer->remote_rank, ucs_status_string(UCS_PTR_STATUS(req)));
            *batch_p = batch;
            return KVF_OK;
        }
        if (req != NULL) {
            ucp_request_free(req);   /* completes in the background; flush tracks it */
        }
        (void)KVF_FAULT(UCX_POST);             /* tests: kill/stop/stall after n posted */
        if (i + 1 == (num_descs + 1) / 2) {
            (void)KVF_FAULT(UCX_HALF);         /* tests: half of this batch is in flight */
        }
    }

    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = kvf_ucx_flush_cb;
    param.user_data = batch;
    req = ucp_ep_flush_nbx(peer->ep, &param);
    if (req == NULL) {
        batch->status = KVF_OK;
    } else if (UCS_PTR_IS_ERR(req)) {
        batch->status = (peer->status != KVF_OK) ? peer->status :
                        kvf_ucx_status(UCS_PTR_STATUS(req));
    } else {
        batch->flush_req = req;
    }
    *batch_p = batch;
    return KVF_OK;
}

kvf_status_t kvf_ucx_batch_test(kvf_ucx_batch_h batch)
{
    if ((batch->status == KVF_INPROGRESS) && (batch->peer->status != KVF_OK)) {
        return batch->peer->status;
    }
    return batch->status;
}

kvf_status_t kvf_ucx_batch_wait(kvf_ucx_batch_h batch, uint32_t timeout_ms)
{
    kvf_ucx_agent_h agent = batch->peer->agent;
    uint64_t deadline = kvf_time_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    kvf_status_t status;

    /* the deadline is checked on every round: a worker kept busy by other
     * traffic never returns 0 from progress, and must still time out */
    while ((status = kvf_ucx_batch_test(batch)) == KVF_INPROGRESS) {
        if (kvf_time_now_ns() >= deadline) {
            kvf_error("%s: transfer from rank %d did not complete in %u ms", agent->name,
                      batch->peer->remote_rank, timeout_ms);
            if (batch->peer->status == KVF_OK) {
                batch->peer->status = KVF_ERR_PEER_TIMEOUT;
            }
            return KVF_ERR_PEER_TIMEOUT;
        }
        if (ucp_worker_progress(agent->worker) == 0) {
            sched_yield();
        }
    }
    return status;
}

void kvf_ucx_batch_release(kvf_ucx_batch_h batch)
{
    if (batch == NULL) {
        return;
    }
    if (batch->flush_req != NULL) {
        /* after ucp_request_free UCX never calls the callback again */
        ucp_request_free(batch->flush_req);
    }
    free(batch);
}

