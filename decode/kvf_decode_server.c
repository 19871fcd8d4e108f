/*
 * kvf-decode: request handling around the engine and the KV connector.
 *
 * Design: one leader loop advances four things with short waits so none
 * starves: control requests, the pulls in flight (decode/kvf_decode_pull.h:
 * handshake, claim, GETs, one release; none waits on the network), the
 * requests waiting for blocks (their lease heartbeats go out and are polled
 * the same way), and engine steps. A request's pull advances between steps
 * while running requests keep decoding; only when it ends "valid" is the
 * import committed and the request joins the batch. So a stalled or dead
 * prefill delays only the requests whose KV it holds, each by at most the
 * transfer timeout per phase. The engine stays single-threaded, as its
 * contract requires: the GETs land in blocks allocated for the import,
 * which no running request touches.
 *
 * Leases (docs/LEASE.md): before any GET decode claims the lease on
 * prefill's side channel (binding it to this decode, extending it, and
 * learning how long it has left); it does not start a pull with less time
 * left than its transfer timeout. After the GETs one release covers every
 * rank, and only if prefill answers "valid" does decode use the bytes:
 * otherwise the pages may already hold another prompt's KV, and the request
 * fails (or is recomputed, per --load-failure). A pull that fails after its
 * claim tells prefill at once (an abandoning release), so the pages are
 * back there without waiting out the lease. Requests waiting in line for
 * blocks heartbeat their lease (a claim every third of its time left).
 *
 * The first token was sampled by prefill and already reported to the
 * client by the proxy, so decode replies carry only the tokens after it.
 *
 * Drain (first SIGTERM, daemon/kvf_drain.h): new decode requests are
 * refused (KVF_ERR_BUSY, health says draining); running, pulling and
 * waiting ones are served to their end. Whatever is left at --drain-timeout
 * gets an error reply (a stream's error event), then the loop returns.
 */
#include "kvf_decode_server_int.h"

#include "kvf_health_pub.h"
#include "kvf_fault.h"
#include "kvf_log.h"
#include "kvf_array.h"
#include "kvf_time.h"
#include "kvf_role.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_DC_MAX_EVENTS 512

const kvf_config_field_t kvf_decode_config_table[] = {
    KVF_ROLE_CONFIG_FIELDS(kvf_decode_config_t, "tcp://127.0.0.1:5567", "decode-0"),
    {"LOAD_FAILURE", "fail", "when a pull fails: fail the request, or recompute the prompt",
     offsetof(kvf_decode_config_t, load_failure), KVF_CONFIG_TYPE_STRING, 0},
    {"KV_DIGEST", "on", "KV integrity: on (prefill checks a digest of every pull's bytes"
     " before decode uses them; a mismatch fails or recomputes per --load-failure) or off",
     offsetof(kvf_decode_config_t, kv_digest), KVF_CONFIG_TYPE_STRING, 0},
    {"MAX_QUEUE", "256", "requests waiting for free blocks; more are refused (busy)",
     offsetof(kvf_decode_config_t, max_queue), KVF_CONFIG_TYPE_INT, 0},
    {"TEST_PULL_DELAY", "0", "test only: wait this long between handshake and the GETs",
     offsetof(kvf_decode_config_t, test_pull_delay_ms), KVF_CONFIG_TYPE_TIME,
     KVF_CONFIG_FLAG_HIDDEN},
    {NULL, NULL, NULL, 0, 0, 0},
};


static kvf_status_t kvf_dc_setup(kvf_decode_server_h srv)
{
    kvf_status_t status = kvf_role_start(&srv->cfg.role, KVF_CONNECTOR_ROLE_DECODE, NULL, 0,
                                         &srv->engine, &srv->xops, &srv->conn);
    if (status != KVF_OK) {
        return status;
    }
    srv->px.xops = srv->xops;
    srv->px.conn = srv->conn;
    srv->px.tp = srv->cfg.role.tp;
    srv->px.xfer_timeout_ms = srv->cfg.role.xfer_timeout_ms;
    srv->px.test_pull_delay_ms = srv->cfg.test_pull_delay_ms;
    srv->px.kv_digest = (strcmp(srv->cfg.kv_digest, "on") == 0);
    srv->px.window_pull = true;   /* acts only for a model with a sliding layer */
    kvf_drain_init(&srv->drain, (uint64_t)srv->cfg.role.drain_timeout_ms);
    return kvf_serve_server_create(srv->cfg.role.listen, &srv->serve);
}

kvf_status_t kvf_decode_server_create(const kvf_decode_config_t *cfg,
                                      kvf_decode_server_h *srv_p)
{
    struct kvf_decode_server *srv;
    kvf_status_t status;

    if (kvf_role_check_flags(&cfg->role) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    if ((strcmp(cfg->load_failure, "fail") != 0) &&
        (strcmp(cfg->load_failure, "recompute") != 0)) {
        kvf_error("bad value '%s' for --load-failure (fail or recompute)", cfg->load_failure);
        return KVF_ERR_INVALID_PARAM;
    }
    if (cfg->max_queue <= 0) {
        kvf_error("--max-queue must be positive (got %d)", cfg->max_queue);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((strcmp(cfg->kv_digest, "on") != 0) && (strcmp(cfg->kv_digest, "off") != 0)) {
        kvf_error("bad value '%s' for --kv-digest (on or off)", cfg->kv_digest);
        return KVF_ERR_INVALID_PARAM;
    }
    if (cfg->role.tp > KVF_DC_PULL_MAX_TP) {
        kvf_error("--tp %d: a decode instance pulls with at most %d ranks", cfg->role.tp,
                  KVF_DC_PULL_MAX_TP);
        return KVF_ERR_INVALID_PARAM;
    }
    srv = calloc(1, sizeof(*srv));
    if (srv == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    srv->cfg = *cfg;
    srv->recompute = (strcmp(cfg->load_failure, "recompute") == 0);
    status = kvf_dc_setup(srv);
    if (status != KVF_OK) {
        kvf_decode_server_destroy(srv);
        return status;
    }
    /* the one ready line, whatever the log level */
    kvf_log_emit(__FILE__, __LINE__, __func__, KVF_LOG_INFO, KVF_SUB_ALL,
                 "ready: decode %s, tp %d, block size %d, %d blocks per rank, control %s, load"
                 " failure policy %s, kv digest %s, device %s", cfg->role.engine_id,
                 cfg->role.tp, kvf_block_manager_block_size(kvf_engine_block_manager(srv->engine)),
                 cfg->role.num_blocks, cfg->role.listen, cfg->load_failure, cfg->kv_digest,
                 kvf_role_device_names_get());
    *srv_p = srv;
    return KVF_OK;
}

void kvf_decode_server_destroy(kvf_decode_server_h srv)
{
    if (srv == NULL) {
        return;
    }
    for (int i = 0; (srv->conn != NULL) && (i < srv->num_reqs); ++i) {
        kvf_dc_req_cleanup(srv, &srv->reqs[i]);   /* pulls first: they use the connector */
    }
    kvf_serve_server_destroy(srv->serve);
    if (srv->conn != NULL) {
        srv->xops->destroy(srv->conn);
    }
    kvf_engine_destroy(srv->engine);
    kvf_role_events_stop();   /* after the engine: its AllBlocksCleared goes out */
    for (int i = 0; i < srv->num_waiting; ++i) {
        kvf__serve_request__free_unpacked(srv->waiting[i].req, NULL);
        kvf_xfer_params_msg_cleanup(&srv->waiting[i].params);
    }
    free(srv->waiting);
    free(srv->reqs);
    free(srv);
}

static void kvf_dc_abort(kvf_decode_server_h srv, const Kvf__AbortRequest *ar)
{
    const char *rid = (ar->request_id != NULL) ? ar->request_id : "";
    for (int i = 0; i < srv->num_reqs; ++i) {
        if (!srv->reqs[i].aborted && (strcmp(srv->reqs[i].request_id, rid) == 0)) {
            if ((srv->reqs[i].imp != NULL) && kvf_dc_pull_on_wire(&srv->reqs[i].imp->pull)) {
                /* GETs in flight: answered now, abandoned once they landed (cancelling them
                 * would wait on the network or force-close endpoints other pulls share) */
                srv->reqs[i].aborted = true;
                kvf_dc_reply_tokens(srv, &srv->reqs[i], NULL, 0, true, "abort");
                return;
            }
            kvf_dc_import_free(srv, &srv->reqs[i]);   /* a pull in flight is abandoned */
            kvf_engine_abort(srv->engine, srv->reqs[i].engine_req);
            kvf_engine_release(srv->engine, srv->reqs[i].engine_req);
            kvf_dc_reply_tokens(srv, &srv->reqs[i], NULL, 0, true, "abort");
            kvf_dc_remove(srv, i);
            return;
        }
    }
    for (int i = 0; i < srv->num_waiting; ++i) {
        if (strcmp(srv->waiting[i].req->decode->request_id, rid) == 0) {
            kvf_serve_server_reply_error(srv->serve, &srv->waiting[i].peer, rid,
                                         KVF_ERR_CANCELED, "aborted");
            kvf_dc_unwait(srv, i);
            return;
        }
    }
}

/* kvf_health_fill_fn of the decode server */
static void kvf_dc_health_fill(void *arg, Kvf__HealthReply *h)
{
    kvf_decode_server_h srv = arg;
    kvf_health_loop_t loop = {
        .running = (uint32_t)(srv->num_reqs + srv->num_waiting),
        .queue_depth = (uint32_t)srv->num_waiting,
        .max_queue = (uint32_t)srv->cfg.max_queue,
        .incarnation = srv->xops->incarnation(srv->conn),
        .draining = kvf_drain_active(&srv->drain),
    };

    kvf_role_health_fill(srv->engine, "decode", &srv->cfg.role, h);
    kvf_health_fill_loop(h, &loop);
    h->has_handshake_refusals = h->has_peer_errors = 1;
    h->handshake_refusals = srv->px.refusals;
    h->peer_errors = srv->px.peer_errors;
    h->has_expired_reads_prevented = 1;
    h->expired_reads_prevented = srv->px.reads_prevented;
    h->has_kv_digest_mismatches = 1;
    h->kv_digest_mismatches = srv->px.digest_mismatches;
    h->has_kv_pulls_total = h->has_kv_pulled_bytes_total = 1;
    h->kv_pulls_total = srv->px.pulls_valid;
    h->kv_pulled_bytes_total = srv->px.bytes_valid;
}

/* Health probes are answered by the control channel's thread from this. */
static void kvf_dc_publish_health(kvf_decode_server_h srv)
{
    kvf_health_publish(srv->serve, kvf_dc_health_fill, srv);
}

/* ---- control requests ------------------------------------------------------ */

/* @return true when @a req was kept (pulling or queued); the caller frees it otherwise. */
static bool kvf_dc_handle(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
                          Kvf__ServeRequest *req)
{
    kvf_xfer_params_msg_t xp;
    char err[KVF_CONFIG_STR_MAX + 320];
    uint64_t arrival_ns = kvf_time_now_ns();
    kvf_dc_outcome_t o = KVF_DC_WAIT;
    bool kept;

    switch (req->body_case) {
    case KVF__SERVE_REQUEST__BODY_DECODE:
        if (kvf_role_cannot_serve(srv->engine) != NULL) {
            snprintf(err, sizeof(err), "decode instance %.63s cannot serve: %.200s",
                     srv->cfg.role.engine_id, kvf_role_cannot_serve(srv->engine));
            kvf_serve_server_reply_error(srv->serve, peer, req->decode->request_id,
                                         KVF_ERR_BUSY, err);
            return false;
        }
        if (kvf_drain_active(&srv->drain)) {
            snprintf(err, sizeof(err), "decode instance %s is draining (stopping after"
                     " SIGTERM): it takes no new requests", srv->cfg.role.engine_id);
            kvf_serve_server_reply_error(srv->serve, peer, req->decode->request_id,
                                         KVF_ERR_BUSY, err);
            return false;
        }
        if (kvf_dc_sampling_check(srv, req->decode, err, sizeof(err)) != KVF_OK) {
            kvf_serve_server_reply_error(srv->serve, peer, req->decode->request_id,
                                         KVF_ERR_INVALID_PARAM, err);
            return false;
        }
        if (kvf_decode_request_check(req->decode, &xp, err, sizeof(err)) != KVF_OK) {
            kvf_serve_server_reply_error(srv->serve, peer, req->decode->request_id,
                                         KVF_ERR_INVALID_PARAM, err);
            return false;
        }
        /* behind others already waiting, or when the pool is full: wait in line */
        if (srv->num_waiting == 0) {
            o = kvf_dc_decode(srv, peer, req, arrival_ns, &xp);
        }
        if (o != KVF_DC_WAIT) {
            kvf_xfer_params_msg_cleanup(&xp);   /* empty when moved into the pull */
            return o == KVF_DC_STARTED;
        }
        if (srv->num_waiting >= srv->cfg.max_queue) {
            snprintf(err, sizeof(err), "decode instance %s's queue is full: %d requests wait"
                     " for blocks (--max-queue %d)", srv->cfg.role.engine_id, srv->num_waiting,
                     srv->cfg.max_queue);
            kvf_serve_server_reply_error(srv->serve, peer, req->decode->request_id,
                                         KVF_ERR_BUSY, err);
            kvf_xfer_params_msg_cleanup(&xp);
            return false;
        }
        kept = kvf_dc_wait(srv, peer, req, arrival_ns, &xp);
        if (!kept) {
            kvf_serve_server_reply_error(srv->serve, peer, req->decode->request_id,
                                         KVF_ERR_NO_MEMORY, "out of memory queueing the request");
        }
        kvf_xfer_params_msg_cleanup(&xp);   /* empty when moved into the line */
        return kept;
    case KVF__SERVE_REQUEST__BODY_ABORT:
        kvf_dc_abort(srv, req->abort);
        return false;
    case KVF__SERVE_REQUEST__BODY_HEALTH:
        kvf_health_answer(srv->serve, peer, kvf_dc_health_fill, srv);
        return false;
    case KVF__SERVE_REQUEST__BODY_CHECK_PEER:
        kvf_dc_checks_add(&srv->px, &srv->checks, srv->serve, peer, req->check_peer);
        return false;
    default:
        kvf_serve_server_reply_error(srv->serve, peer, "", KVF_ERR_UNSUPPORTED,
                                     "a decode instance does not prefill");
        return false;
    }
}

/* ---- engine steps ---------------------------------------------------------- */

static int kvf_dc_append(kvf_dc_req_t *q, int32_t token)
{
    if (KVF_ARRAY_GROW(q->tokens, q->cap_tokens, q->num_tokens + 1, 64) != KVF_OK) {
        return -1;
    }
    q->tokens[q->num_tokens++] = token;
    return 0;
}

/* A request the engine finished with an error (outgrew the pool or a failed step). */
static void kvf_dc_step_failed(kvf_decode_server_h srv, int k)
{
    kvf_dc_req_t *q = &srv->reqs[k];
    char msg[256];

    snprintf(msg, sizeof(msg), "decode failed after %d generated tokens: the request"
             " outgrew this instance's KV cache (%d blocks of %d tokens; raise"
             " --num-blocks) or a forward step failed (see the decode log)",
             q->generated + 1,
             kvf_block_manager_num_blocks(kvf_engine_block_manager(srv->engine)),
             kvf_block_manager_block_size(kvf_engine_block_manager(srv->engine)));
    kvf_serve_server_reply_error(srv->serve, &q->peer, q->request_id, KVF_ERR_NO_RESOURCE, msg);
    kvf_engine_release(srv->engine, q->engine_req);
    kvf_dc_remove(srv, k);
}

static kvf_status_t kvf_dc_step(kvf_decode_server_h srv)
{
    kvf_engine_event_t ev[KVF_DC_MAX_EVENTS];
    int n = 0;
    kvf_status_t status;

    (void)KVF_FAULT(DECODE_STEP);   /* tests: a slow (stalled) or dying decode step */
    status = kvf_engine_step(srv->engine, ev, KVF_DC_MAX_EVENTS, &n);

    for (int i = 0; i < n; ++i) {
        int k = kvf_dc_find(srv, ev[i].id);
        kvf_dc_req_t *q;
        if (k < 0) {
            continue;
        }
        q = &srv->reqs[k];
        if ((ev[i].kind == KVF_EVENT_TOKEN) && (ev[i].token >= 0)) {   /* FINISHED repeats it */
            q->generated++;
            if (q->want_logprobs && (kvf_logprob_buf_push(&q->lp, q->logprobs, &ev[i]) !=
                                     KVF_OK)) {
                kvf_engine_abort(srv->engine, q->engine_req);
            }
            if (q->stream) {
                kvf_dc_reply_tokens(srv, q, &ev[i].token, 1, false, NULL);
            } else if (kvf_dc_append(q, ev[i].token) != 0) {
                kvf_engine_abort(srv->engine, q->engine_req);
            }
        }
        if ((ev[i].kind == KVF_EVENT_FINISHED) && (ev[i].reason == KVF_FINISH_ERROR)) {
            kvf_dc_step_failed(srv, k);
        } else if (ev[i].kind == KVF_EVENT_FINISHED) {
            kvf_dc_reply_tokens(srv, q, q->stream ? NULL : q->tokens,
                                q->stream ? 0 : q->num_tokens, true,
                                kvf_dc_finish_str(ev[i].reason));
            kvf_engine_release(srv->engine, q->engine_req);
            kvf_dc_remove(srv, k);
        }
    }
    return status;
}

/* ---- drain (daemon/kvf_drain.h) -------------------------------------------- */

static void kvf_dc_drain_begin(void *arg, uint64_t deadline_ms)
{
    kvf_decode_server_h srv = arg;

    (void)deadline_ms;
    kvf_dc_publish_health(srv);   /* the proxy stops routing here at its next probe */
    kvf_notice("draining (SIGTERM): no new requests; %d running (%d of them pulling) and %d"
               " waiting are served until done, at most --drain-timeout %lld ms",
               srv->num_reqs, srv->num_pulling, srv->num_waiting,
               (long long)srv->cfg.role.drain_timeout_ms);
}

static bool kvf_dc_drain_idle(void *arg)
{
    kvf_decode_server_h srv = arg;

    return (srv->num_reqs == 0) && (srv->num_waiting == 0);
}

static void kvf_dc_drain_give_up(void *arg)
{
    kvf_decode_server_h srv = arg;
    char msg[KVF_CONFIG_STR_MAX + 128];

    kvf_warn("%d request(s) running and %d waiting at the drain deadline", srv->num_reqs,
             srv->num_waiting);
    snprintf(msg, sizeof(msg), "decode instance %s stopped (SIGTERM, --drain-timeout %lld ms)"
             " before the request finished", srv->cfg.role.engine_id,
             (long long)srv->cfg.role.drain_timeout_ms);
    while (srv->num_reqs > 0) {
        kvf_dc_req_t *q = &srv->reqs[0];
        kvf_dc_import_free(srv, q);
        kvf_engine_abort(srv->engine, q->engine_req);
        kvf_engine_release(srv->engine, q->engine_req);
        kvf_serve_server_reply_error(srv->serve, &q->peer, q->request_id, KVF_ERR_CANCELED, msg);
        kvf_dc_remove(srv, 0);
    }
    while (srv->num_waiting > 0) {
        kvf_serve_server_reply_error(srv->serve, &srv->waiting[0].peer,
                                     srv->waiting[0].req->decode->request_id, KVF_ERR_CANCELED,
                                     msg);
        kvf_dc_unwait(srv, 0);
    }
}

static const kvf_drain_ops_t kvf_dc_drain_ops = {
    .begin = kvf_dc_drain_begin,
    .idle = kvf_dc_drain_idle,
    .give_up = kvf_dc_drain_give_up,
};

/* ---- the loop -------------------------------------------------------------- */

/* Control requests waiting now (at most 64), or after @a timeout_ms. */
static kvf_status_t kvf_dc_recv(kvf_decode_server_h srv, int timeout_ms)
{
    for (int i = 0; i < 64; ++i) {
        kvf_serve_peer_t peer;
        Kvf__ServeRequest *req = NULL;
        kvf_status_t status = kvf_serve_server_recv(srv->serve, (i > 0) ? 0 : timeout_ms, &peer,
                                                    &req);
        if (status == KVF_OK) {
            if (!kvf_dc_handle(srv, &peer, req)) {
                kvf__serve_request__free_unpacked(req, NULL);
            }
            continue;
        }
        return (status == KVF_ERR_ZMQ) ? status : KVF_OK;
    }
    return KVF_OK;
}

kvf_status_t kvf_decode_server_run(kvf_decode_server_h srv, volatile sig_atomic_t *stop)
{
    int on_wire = 0;

    kvf_serve_server_watch_stop(srv->serve, stop);
    while (*stop < KVF_ROLE_STOP_NOW) {
        bool busy = kvf_engine_has_work(srv->engine) || (on_wire > 0);
        bool side = (srv->num_pulling > 0) || (srv->checks.num > 0) || (srv->num_waiting > 0);
        kvf_status_t status;

        if ((*stop == KVF_ROLE_STOP_DRAIN) &&
            kvf_drain_step(&srv->drain, &kvf_dc_drain_ops, srv)) {
            break;
        }
        if (!busy && side) {
            /* answers from prefill are due: sleep on the side channel, not the control
             * socket, so a release is acted on within microseconds (1 ms for new work) */
            (void)srv->xops->side_wait(srv->conn, 1);
        }
        status = kvf_dc_recv(srv, (busy || side) ? 0 : 10);
        if (status != KVF_OK) {
            return status;
        }
        kvf_dc_checks_poll(&srv->px, &srv->checks, srv->serve);
        kvf_dc_admit_waiting(srv);
        on_wire = kvf_dc_advance_pulls(srv);
        kvf_dc_publish_health(srv);
        if (kvf_engine_has_work(srv->engine)) {
            kvf_serve_server_step_begin(srv->serve);
            status = kvf_dc_step(srv);
            kvf_serve_server_step_end(srv->serve);
            if (status != KVF_OK) {
                kvf_error("engine step failed: %s", kvf_status_str(status));
            }
        }
        if (kvf_role_broken_exit(srv->engine, &srv->broken_ms)) {
            return KVF_ERR_TIMED_OUT;   /* exit 1: a supervisor restarts it */
        }
    }
    return KVF_OK;
}
