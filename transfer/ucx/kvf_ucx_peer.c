/*
 * UCX agent: peers (an endpoint plus the remote rank's unpacked keys).
 *
 * Design:
 * - Dead peers: endpoints are created with UCP_ERR_HANDLING_MODE_PEER; the
 *   error callback records a KVF_ERR_PEER_* status on the peer and every
 *   wait loop checks it, so a reset surfaces on the next progress call. A
 *   peer that is simply silent is caught by the timeout of each wait; UCX's
 *   own keepalive (20 s) is far too slow for docs/ARCHITECTURE.md §9's
 *   "about a second".
 * - A close that times out parks the peer instead of freeing it: the
 *   endpoint's error callback (arg = the peer) and the close request may
 *   still fire. A parked peer is freed once its close request completed
 *   (checked by kvf_ucx_agent_progress() and each destroy), or after the
 *   worker itself is gone (agent destroy). Rejected: freeing at once (a
 *   use-after-free when the peer later resets) and waiting without bound
 *   (a stuck peer would wedge the caller).
 * - Shared memory of a peer on this node (a pool UCX allocated, --pool-alloc
 *   ucx): when ucp_rkey_ptr() maps the region here, GETs from it are memcpy
 *   from that mapping (kvf_ucx_xfer_post()). UCX 1.13 did the same copy
 *   inside ucp_get_nbx; UCX 1.22 has no one-sided read over sysv/posix and
 *   emulates each GET through the peer's worker, so a prefill killed
 *   mid-read became a timeout instead of a completed pull (docs/FAILURES.md
 *   §10). Host regions only; anything else (heap pools, TCP, CUDA memory)
 *   keeps ucp_get_nbx.
 */
#include "kvf_ucx_agent_int.h"

#include "kvf_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Free parked peers whose close request completed: no callback can reach them now. */
void kvf_ucx_reap_parked(kvf_ucx_agent_h agent)
{
    for (int i = 0; i < agent->num_parked;) {
        kvf_ucx_peer_h peer = agent->parked[i];
        if (ucp_request_check_status(peer->close_req) == UCS_INPROGRESS) {
            ++i;
            continue;
        }
        ucp_request_free(peer->close_req);
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_XFER, "%s: parked endpoint to rank %d closed",
                agent->name, peer->remote_rank);
        free(peer);
        agent->parked[i] = agent->parked[--agent->num_parked];
    }
}


static void kvf_ucx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t ucs)
{
    kvf_ucx_peer_h peer = arg;
    kvf_status_t status = kvf_ucx_status(ucs);

    (void)ep;
    if (!KVF_IS_PEER_ERROR(status)) {
        status = KVF_ERR_PEER_RESET;
    }
    if (peer->status == KVF_OK) {
        peer->status = status;
    }
    /* a peer that exits first makes our close fail; that is not news */
    kvf_log(peer->closing ? KVF_LOG_DEBUG : KVF_LOG_WARN, KVF_SUB_XFER,
            "%s: peer rank %d failed: %s (%s)", peer->agent->name, peer->remote_rank,
            ucs_status_string(ucs), kvf_status_str(status));
}

/*
 * Summarize ucp_ep_print_info(): keep the "tl" names of the lanes, e.g.
 * "#                lane[0]:  1:cma/memory.0 md[1]  ..." -> "cma/memory".
 */
static void kvf_ucx_record_lanes(kvf_ucx_agent_h agent, ucp_ep_h ep)
{
    char *text = NULL, *line, *save = NULL, lanes[400] = "";
    size_t text_len = 0, used = 0;
    FILE *f = open_memstream(&text, &text_len);

    if (f == NULL) {
        return;
    }
    ucp_ep_print_info(ep, f);
    fclose(f);
    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *lane = strstr(line, "lane[");
        char *colon, *end, tl[64];
        size_t n;

        if (lane == NULL) {
            continue;
        }
        colon = strchr(lane, ':');        /* after "lane[i]" */
        colon = (colon != NULL) ? strchr(colon + 1, ':') : NULL;  /* after rsc index */
        if (colon == NULL) {
            continue;
        }
        end = colon + 1 + strcspn(colon + 1, " .\t");
        n = (size_t)(end - (colon + 1));
        if ((n == 0) || (n >= sizeof(tl))) {
            continue;
        }
        memcpy(tl, colon + 1, n);
        tl[n] = '\0';
        if (strstr(lanes, tl) != NULL) {
            continue;   /* list each transport once */
        }
        used += (size_t)snprintf(lanes + used, sizeof(lanes) - used, "%s%s",
                                 (used > 0) ? "," : "", tl);
        if (used >= sizeof(lanes)) {
            break;
        }
    }
    free(text);
    snprintf(agent->transports, sizeof(agent->transports), "UCX_TLS=%s; ep lanes: %s",
             agent->tls_env, (lanes[0] != '\0') ? lanes : "unknown");
}

/*
 * Close @a peer's endpoint, progressing until done or the agent timeout.
 * @return true when the peer may be freed now; false when the close timed
 *         out and the peer was parked (kvf_ucx_reap_parked() frees it).
 */
static bool kvf_ucx_ep_close(kvf_ucx_agent_h agent, kvf_ucx_peer_h peer, bool force)
{
    ucp_request_param_t cp;
    uint64_t deadline;
    void *req;

    memset(&cp, 0, sizeof(cp));
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    req = ucp_ep_close_nbx(peer->ep, &cp);
    if ((req == NULL) || UCS_PTR_IS_ERR(req)) {
        return true;            /* closed at once (or failed: UCX released it) */
    }
    deadline = kvf_time_now_ns() + (uint64_t)agent->timeout_ms * 1000000ull;
    while ((ucp_request_check_status(req) == UCS_INPROGRESS) &&
           (kvf_time_now_ns() < deadline)) {
        ucp_worker_progress(agent->worker);
    }
    if (ucp_request_check_status(req) != UCS_INPROGRESS) {
        ucp_request_free(req);
        return true;
    }
    if (agent->num_parked == KVF_UCX_MAX_PEERS) {
        /* cannot track it: leak it rather than free memory a callback may use */
        kvf_error("%s: closing the endpoint to rank %d timed out after %u ms and %d endpoints "
                  "are parked already: leaking it", agent->name, peer->remote_rank,
                  agent->timeout_ms, KVF_UCX_MAX_PEERS);
        return false;
    }
    kvf_warn("%s: closing the endpoint to rank %d timed out after %u ms; parked until its "
             "callbacks can no longer fire", agent->name, peer->remote_rank, agent->timeout_ms);
    peer->close_req = req;
    agent->parked[agent->num_parked++] = peer;
    return false;
}

/* Region @a i of @a meta mapped into this process (ucp_rkey_ptr), or NULL: read it by GETs. */
static const uint8_t *kvf_ucx_region_ptr(kvf_ucx_agent_h agent, ucp_rkey_h rkey,
                                         const kvf_ucx_remote_region_t *rr,
                                         const kvf_rank_meta_t *meta, int i)
{
    void *p = NULL;

    if ((rr->mem_type != KVF_XFER_MEM_HOST) || (rr->len == 0) ||
        (ucp_rkey_ptr(rkey, rr->addr, &p) != UCS_OK) || (p == NULL)) {
        return NULL;
    }
    kvf_log(KVF_LOG_DEBUG, KVF_SUB_XFER, "%s: region %d of rank %d of %s is mapped here: "
            "read by copy", agent->name, i, meta->tp_rank, meta->engine_id);
    return p;
}

kvf_status_t kvf_ucx_peer_connect(kvf_ucx_agent_h agent, const kvf_rank_meta_t *meta,
                                  kvf_ucx_peer_h *peer_p)
{
    ucp_ep_params_t ep_params;
    kvf_ucx_peer_h peer;
    kvf_status_t status;

    if (agent->num_peers == KVF_UCX_MAX_PEERS) {
        return KVF_ERR_NO_RESOURCE;
    }
    if ((meta->worker_addr_len == 0) || (meta->num_regions < 0) ||
        (meta->num_regions > KVF_XFER_MAX_REGIONS)) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (int i = 0; i < meta->num_regions; ++i) {
        char what[256];
        if (kvf_ucx_agent_mem_reach(agent, meta->regions[i].mem_type, what, sizeof(what)) !=
            KVF_OK) {
            kvf_error("%s: region %d of rank %d of %s is %s memory, and this side cannot reach"
                      " it (%s)", agent->name, i, meta->tp_rank, meta->engine_id,
                      kvf_xfer_mem_type_name(meta->regions[i].mem_type), what);
            return KVF_ERR_UNSUPPORTED;
        }
    }
    for (int i = 0; i < meta->num_regions; ++i) {   /* before UCX sees any of it */
        char why[128];
        if (kvf_ucx_rkey_check(meta->regions[i].rkey, meta->regions[i].rkey_len, why,
                               sizeof(why)) != KVF_OK) {
            kvf_error("%s: remote key of region %d of rank %d of %s refused: %s", agent->name,
                      i, meta->tp_rank, meta->engine_id, why);
            return KVF_ERR_PARSE;
        }
    }
    peer = calloc(1, sizeof(*peer));
    if (peer == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    peer->agent = agent;
    peer->remote_rank = meta->tp_rank;
    peer->status = KVF_OK;

    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep_params.address = (const ucp_address_t *)meta->worker_addr;
    if (agent->peer_err_mode) {
        ep_params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep_params.err_handler.cb = kvf_ucx_ep_err_cb;
        ep_params.err_handler.arg = peer;
    }
    KVF_UCX_CHECK_GOTO(ucp_ep_create(agent->worker, &ep_params, &peer->ep), status,
                       err_free_peer);

    for (int i = 0; i < meta->num_regions; ++i) {
        ucs_status_t ucs = ucp_ep_rkey_unpack(peer->ep, meta->regions[i].rkey,
                                              &peer->regions[i].rkey);
        if (ucs != UCS_OK) {
            /* UCX's own checks said no: a refusal of that peer's key, not a local fault */
            kvf_error("%s: remote key of region %d of rank %d of %s (%zu bytes) refused by "
                      "ucp_ep_rkey_unpack: %s", agent->name, i, meta->tp_rank,
                      meta->engine_id, meta->regions[i].rkey_len, ucs_status_string(ucs));
            status = KVF_ERR_REFUSED;
            goto err_destroy_rkeys;
        }
        peer->regions[i].addr = meta->regions[i].addr;
        peer->regions[i].len = meta->regions[i].length;
        peer->regions[i].mem_type = meta->regions[i].mem_type;
        peer->regions[i].ptr = kvf_ucx_region_ptr(agent, peer->regions[i].rkey,
                                                  &peer->regions[i], meta, i);
        peer->num_regions = i + 1;
    }
    kvf_ucx_record_lanes(agent, peer->ep);
    kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "%s: connected to rank %d of %s: %s", agent->name,
            meta->tp_rank, meta->engine_id, agent->transports);
    agent->peers[agent->num_peers++] = peer;
    *peer_p = peer;
    return KVF_OK;

err_destroy_rkeys:
    for (int i = 0; i < peer->num_regions; ++i) {
        ucp_rkey_destroy(peer->regions[i].rkey);
    }
    peer->num_regions = 0;
    peer->closing = true;
    if (!kvf_ucx_ep_close(agent, peer, true)) {
        return status;          /* parked: freed once its close completes */
    }
err_free_peer:
    free(peer);
    return status;
}

void kvf_ucx_peer_abort(kvf_ucx_peer_h peer)
{
    if ((peer != NULL) && (peer->status == KVF_OK)) {
        peer->status = KVF_ERR_PEER_TIMEOUT;   /* makes the close forced */
    }
    kvf_ucx_peer_destroy(peer);
}

void kvf_ucx_peer_destroy(kvf_ucx_peer_h peer)
{
    kvf_ucx_agent_h agent;

    if (peer == NULL) {
        return;
    }
    agent = peer->agent;
    peer->closing = true;
    for (int i = 0; i < peer->num_regions; ++i) {
        ucp_rkey_destroy(peer->regions[i].rkey);
    }
    for (int i = 0; i < agent->num_peers; ++i) {
        if (agent->peers[i] == peer) {
            agent->peers[i] = agent->peers[--agent->num_peers];
            break;
        }
    }
    if (kvf_ucx_ep_close(agent, peer, peer->status != KVF_OK)) {
        free(peer);
    }
    if (agent->num_parked > 0) {
        kvf_ucx_reap_parked(agent);
    }
}

kvf_status_t kvf_ucx_peer_status(kvf_ucx_peer_h peer)
{
    return peer->status;
}

