/* kvf-decode's check_peer handshakes (kvf_decode_peer_check.h). */
#include "kvf_decode_peer_check.h"

#include "kvf_log.h"
#include "kvf_time.h"

#include <stdio.h>
#include <string.h>

/* Answer check @a c with @a status (KVF_OK: compatible). */
static void kvf_dc_check_answer(kvf_dc_pull_ctx_t *ctx, kvf_serve_server_h serve, const kvf_dc_check_t *c,
                                kvf_status_t status, const char *why)
{
    char err[512];

    if (status == KVF_OK) {
        kvf_serve_server_reply_error(serve, &c->peer, c->request_id, KVF_OK, NULL);
        return;
    }
    if (status == KVF_ERR_REFUSED) {
        ctx->refusals++;
        kvf_error("prefill engine %s at %s:%d cannot feed this instance: %s", c->engine_id,
                  c->host, c->port, (why != NULL) ? why : kvf_status_str(status));
    }
    if ((why == NULL) || (why[0] == '\0')) {
        snprintf(err, sizeof(err), "handshake with %s at %s:%d failed: %s", c->engine_id,
                 c->host, c->port, kvf_status_str(status));
        why = err;
    }
    kvf_serve_server_reply_error(serve, &c->peer, c->request_id, status, why);
}

/* Start (or restart, when someone else's handshake of the key ended) check @a c. */
static kvf_status_t kvf_dc_check_start(kvf_dc_pull_ctx_t *ctx, kvf_dc_check_t *c)
{
    kvf_connector_peer_t key = {c->engine_id, c->host, c->port, c->incarnation};

    return ctx->xops->handshake_start(ctx->conn, &key, &c->ticket);
}

void kvf_dc_checks_add(kvf_dc_pull_ctx_t *ctx, kvf_dc_checks_t *checks, kvf_serve_server_h serve,
                       const kvf_serve_peer_t *peer, const Kvf__CheckPeerRequest *cr)
{
    const char *rid = (cr->request_id != NULL) ? cr->request_id : "";
    kvf_dc_check_t c;
    char err[512] = "";
    kvf_status_t status;

    if (kvf_decode_check_peer_check(cr, err, sizeof(err)) != KVF_OK) {
        kvf_serve_server_reply_error(serve, peer, rid, KVF_ERR_INVALID_PARAM, err);
        return;
    }
    memset(&c, 0, sizeof(c));
    c.peer = *peer;
    snprintf(c.request_id, sizeof(c.request_id), "%s", rid);
    snprintf(c.engine_id, sizeof(c.engine_id), "%s", cr->engine_id);
    snprintf(c.host, sizeof(c.host), "%s", cr->host);
    c.port = (int)cr->port;
    c.incarnation = cr->incarnation;
    c.deadline_ns = kvf_time_now_ns() + (uint64_t)ctx->xfer_timeout_ms * 1000000ull;
    if (checks->num == KVF_DC_MAX_CHECKS) {
        kvf_dc_check_answer(ctx, serve, &c, KVF_ERR_BUSY, "too many peer checks in flight");
        return;
    }
    status = kvf_dc_check_start(ctx, &c);
    if (status == KVF_INPROGRESS) {
        checks->checks[checks->num++] = c;
        return;
    }
    kvf_dc_check_answer(ctx, serve, &c, status, NULL);
}

void kvf_dc_checks_poll(kvf_dc_pull_ctx_t *ctx, kvf_dc_checks_t *checks,
                        kvf_serve_server_h serve)
{
    for (int i = 0; i < checks->num; ++i) {
        kvf_dc_check_t *c = &checks->checks[i];
        char why[512] = "";
        kvf_status_t status;

        if (c->ticket == 0) {
            status = kvf_dc_check_start(ctx, c);
            if ((status == KVF_INPROGRESS) && (c->ticket == 0) &&
                (kvf_time_now_ns() > c->deadline_ns)) {
                status = KVF_ERR_PEER_TIMEOUT;
            }
        } else {
            status = ctx->xops->handshake_poll(ctx->conn, c->ticket, why, sizeof(why));
            if (status != KVF_INPROGRESS) {
                c->ticket = 0;
            }
        }
        if (status == KVF_INPROGRESS) {
            continue;
        }
        kvf_dc_check_answer(ctx, serve, c, status, why);
        checks->checks[i--] = checks->checks[--checks->num];
    }
}
