/* The decode server's table of tracked requests and their token replies (kvf_decode_server_int.h). */
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

/* Abandon and free the pull of @a q, if any (nothing lands afterwards). */
void kvf_dc_import_free(kvf_decode_server_h srv, kvf_dc_req_t *q)
{
    kvf_dc_import_t *imp = q->imp;

    if (imp == NULL) {
        return;
    }
    kvf_dc_pull_abandon(&srv->px, &imp->pull);
    kvf__serve_request__free_unpacked(imp->msg, NULL);
    kvf_xfer_params_msg_cleanup(&imp->xp);
    free(imp);
    q->imp = NULL;
    srv->num_pulling--;
}

void kvf_dc_req_cleanup(kvf_decode_server_h srv, kvf_dc_req_t *q)
{
    kvf_dc_import_free(srv, q);
    free(q->tokens);
    q->tokens = NULL;
    kvf_logprob_buf_free(&q->lp);
}

void kvf_dc_reply_tokens(kvf_decode_server_h srv, kvf_dc_req_t *q, const int32_t *tokens,
                         int n, bool done, const char *finish)
{
    Kvf__ServeReply reply = KVF__SERVE_REPLY__INIT;

    reply.request_id = q->request_id;
    reply.has_status = 1;
    reply.status = KVF_OK;
    reply.n_tokens = (size_t)n;
    reply.tokens = (int32_t *)tokens;
    reply.has_done = 1;
    reply.done = done;
    if (q->want_logprobs) {
        kvf_logprob_buf_attach(&q->lp, &reply);
    }
    if (done) {
        reply.finish_reason = (char *)finish;
        reply.stats = &q->stats;
    }
    if (!q->timing_sent) {
        uint64_t now = kvf_time_now_ns();
        q->timing.has_total_ms = q->timing.has_first_step_ms = 1;
        q->timing.total_ms = (double)(now - q->arrival_ns) / 1e6;
        q->timing.first_step_ms = (q->committed_ns > 0) ?
                                  (double)(now - q->committed_ns) / 1e6 : 0.0;
        reply.timing = &q->timing;
        q->timing_sent = true;
    }
    kvf_serve_server_reply(srv->serve, &q->peer, &reply);
    kvf_logprob_buf_clear(&q->lp);
}

const char *kvf_dc_finish_str(kvf_finish_reason_t r)
{
    switch (r) {
    case KVF_FINISH_LENGTH: return "length";
    case KVF_FINISH_EOS:    return "stop";
    case KVF_FINISH_ABORT:  return "abort";
    default:                return "error";
    }
}

int kvf_dc_find(kvf_decode_server_h srv, uint64_t engine_req)
{
    for (int i = 0; i < srv->num_reqs; ++i) {
        if ((srv->reqs[i].imp == NULL) && (srv->reqs[i].engine_req == engine_req)) {
            return i;
        }
    }
    return -1;
}

void kvf_dc_remove(kvf_decode_server_h srv, int i)
{
    kvf_dc_req_cleanup(srv, &srv->reqs[i]);
    srv->reqs[i] = srv->reqs[--srv->num_reqs];
}

kvf_dc_req_t *kvf_dc_track(kvf_decode_server_h srv)
{
    kvf_dc_req_t *q;

    if (KVF_ARRAY_GROW(srv->reqs, srv->cap_reqs, srv->num_reqs + 1, 64) != KVF_OK) {
        return NULL;
    }
    q = &srv->reqs[srv->num_reqs++];
    memset(q, 0, sizeof(*q));
    kvf__transfer_stats__init(&q->stats);
    q->stats.has_bytes = q->stats.has_descriptors = q->stats.has_reads = 1;
    q->stats.has_handshake_ms = q->stats.has_transfer_ms = q->stats.has_recomputed = 1;
    kvf__serve_timing__init(&q->timing);
    return q;
}
