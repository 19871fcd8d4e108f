/*
 * Decode requests waiting for free blocks (kvf_decode_server_int.h): the FIFO, the lease
 * heartbeats that keep prefill's pages for them, admission in arrival order.
 */
#include "kvf_decode_server_int.h"

#include "kvf_fault.h"
#include "kvf_log.h"
#include "kvf_array.h"
#include "kvf_time.h"
#include "kvf_role.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Keep @a req (and its decoded params @a xp, moved in) until blocks free up,
 * at most until shortly before prefill's lease ends.
 */
bool kvf_dc_wait(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
                 Kvf__ServeRequest *req, uint64_t arrival_ns,
                 kvf_xfer_params_msg_t *xp)
{
    /* at most the lease time left on arrival less one transfer timeout (deploy/README.md,
     * "Timeouts"); the heartbeat keeps the lease itself alive meanwhile. lease_ms_left was
     * range-checked on arrival (kvf_decode_request_check), so these products cannot wrap. */
    uint64_t t_ms = (uint64_t)srv->cfg.role.xfer_timeout_ms;
    uint64_t left_ms = (xp->lease_ms_left > t_ms) ? xp->lease_ms_left - t_ms : 0;
    uint64_t beat_ms = xp->lease_ms_left / 3;
    uint64_t now = kvf_time_now_ns();
    kvf_dc_waiting_t *w;

    if (KVF_ARRAY_GROW(srv->waiting, srv->cap_waiting, srv->num_waiting + 1, 64) != KVF_OK) {
        return false;
    }
    w = &srv->waiting[srv->num_waiting++];
    memset(w, 0, sizeof(*w));
    w->req = req;
    w->params = *xp;
    memset(xp, 0, sizeof(*xp));                 /* moved */
    w->peer = *peer;
    w->deadline_ns = now + left_ms * 1000000ull;
    w->beat_ns = now + beat_ms * 1000000ull;
    w->arrival_ns = arrival_ns;
    kvf_log(KVF_LOG_DEBUG, KVF_SUB_SCHED, "request %s waits for decode blocks (%d waiting)",
            req->decode->request_id, srv->num_waiting);
    return true;
}

/* Drop waiting[@a i]; its message and params are freed unless moved out (NULL / empty). */
void kvf_dc_unwait(kvf_decode_server_h srv, int i)
{
    if (srv->waiting[i].beat_ticket != 0) {
        srv->xops->cancel(srv->conn, srv->waiting[i].beat_ticket);
    }
    if (srv->waiting[i].req != NULL) {
        kvf__serve_request__free_unpacked(srv->waiting[i].req, NULL);
    }
    kvf_xfer_params_msg_cleanup(&srv->waiting[i].params);
    memmove(&srv->waiting[i], &srv->waiting[i + 1],
            (size_t)(srv->num_waiting - i - 1) * sizeof(srv->waiting[0]));
    srv->num_waiting--;
}

/*
 * Heartbeat: claim (extend) the leases of waiting requests due for it, and
 * read the answers that came; a lost lease ends its request. Never waits.
 */
static void kvf_dc_heartbeat(kvf_decode_server_h srv)
{
    uint64_t now = kvf_time_now_ns();

    for (int i = 0; i < srv->num_waiting; ++i) {
        kvf_dc_waiting_t *w = &srv->waiting[i];
        const char *rid = w->req->decode->request_id;
        kvf_lease_answer_t answer;
        kvf_status_t status;
        char err[384];

        if (w->beat_ticket == 0) {
            if ((now >= w->beat_ns) &&
                (kvf_dc_pull_heartbeat(&srv->px, &w->params, rid, &w->beat_ticket) != KVF_OK)) {
                w->beat_ticket = 0;
                w->beat_ns = now + 100000000ull;   /* could not send: try again in 100 ms */
            }
            continue;
        }
        status = srv->xops->lease_poll(srv->conn, w->beat_ticket, &answer);
        if (status == KVF_INPROGRESS) {
            continue;
        }
        w->beat_ticket = 0;
        if ((status == KVF_OK) && (answer.verdict == KVF_LEASE_VALID)) {
            uint64_t ms = (answer.ms_left < KVF_DC_MAX_LEASE_MS) ? answer.ms_left :
                          KVF_DC_MAX_LEASE_MS;
            w->beat_ns = now + ms * 1000000ull / 3;
            kvf_log(KVF_LOG_DEBUG, KVF_SUB_SCHED, "request %s waits: lease extended, %llu ms"
                    " left", rid, (unsigned long long)answer.ms_left);
            continue;
        }
        if (status == KVF_OK) {
            srv->px.reads_prevented++;
            snprintf(err, sizeof(err), "the KV lease %s while the request waited for decode"
                     " blocks (prefill %s: %s)", (answer.verdict == KVF_LEASE_EXPIRED) ?
                     "expired" : "was refused", w->params.engine_id, answer.why);
            status = KVF_ERR_LEASE_EXPIRED;
        } else {
            snprintf(err, sizeof(err), "extending the KV lease at prefill %s failed: %s",
                     w->params.engine_id, kvf_status_str(status));
        }
        kvf_warn("request %s: %s", rid, err);
        kvf_serve_server_reply_error(srv->serve, &w->peer, rid, status, err);
        kvf_dc_unwait(srv, i);
        --i;
    }
}

/* Start waiting requests in arrival order while blocks allow; expire the late ones. */
void kvf_dc_admit_waiting(kvf_decode_server_h srv)
{
    kvf_dc_heartbeat(srv);
    while (srv->num_waiting > 0) {
        kvf_dc_waiting_t *w = &srv->waiting[0];
        kvf_dc_outcome_t o = kvf_dc_decode(srv, &w->peer, w->req, w->arrival_ns, &w->params);
        if (o != KVF_DC_WAIT) {
            if (o == KVF_DC_STARTED) {
                w->req = NULL;   /* moved into the pull, with the params */
            }
            kvf_dc_unwait(srv, 0);
            continue;
        }
        if (kvf_time_now_ns() < w->deadline_ns) {
            return;   /* FIFO: later requests wait behind the head */
        }
        kvf_serve_server_reply_error(srv->serve, &w->peer, w->req->decode->request_id,
                                     KVF_ERR_NO_RESOURCE,
                                     "no decode blocks became free before the prefill lease"
                                     " would expire; the decode instance is overloaded");
        kvf_dc_unwait(srv, 0);
    }
}
