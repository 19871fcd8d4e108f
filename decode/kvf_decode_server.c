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
#include "kvf_daemon_http.h"
#include "kvf_decode_server.h"

#include "kvf_decode_check.h"
#include "kvf_decode_peer_check.h"
#include "kvf_decode_pull.h"

#include "kvf_drain.h"
#include "kvf_engine.h"
#include "kvf_sampling_msg.h"
#include "kvf_fault.h"
#include "kvf_handshake.h"
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

typedef struct {
    uint64_t         engine_req;
    char             request_id[KVF_DC_ID_MAX];
    kvf_serve_peer_t peer;
    bool             stream;
    int32_t         *tokens;       /* generated after the first token (non-stream replies) */
    int              num_tokens;
    int              cap_tokens;
    int              generated;    /* tokens decoded here (streamed or kept) */
    Kvf__TransferStats stats;
    /* TTFT breakdown (ServeTiming), sent with the first reply */
    Kvf__ServeTiming timing;
    bool             timing_sent;
    bool             aborted;      /* answered "abort"; its GETs still land (then it goes) */
    uint64_t         arrival_ns;   /* DecodeRequest received */
    uint64_t         landed_ns;    /* latest rank's last GET landed */
    uint64_t         committed_ns; /* import committed: decoding may start */
    struct kvf_dc_import *imp;     /* owned while the KV is pulled; NULL once decoding */
    bool             want_logprobs; /* SamplingParams.logprobs present */
    int              logprobs;      /* top logprobs per token */
    kvf_logprob_buf_t lp;          /* logprobs of the tokens not yet replied */
} kvf_dc_req_t;


/* A request whose KV is being pulled: what the pull and the commit need (a fixed address). */
typedef struct kvf_dc_import {
    kvf_dc_pull_t         pull;
    Kvf__ServeRequest    *msg;      /* the DecodeRequest (its prompt for a recompute) */
    kvf_xfer_params_msg_t xp;       /* its decoded transfer params */
    kvf_req_params_t      rp;       /* prompt points into msg */
} kvf_dc_import_t;

/* A decode request waiting for free blocks (the pool is busy, not too small). */
typedef struct {
    Kvf__ServeRequest *req;          /* owned */
    kvf_xfer_params_msg_t params;    /* req's transfer params, decoded once on arrival; owned */
    kvf_serve_peer_t   peer;
    uint64_t           deadline_ns;  /* give up one transfer timeout before the lease ends */
    uint64_t           beat_ns;      /* next heartbeat (lease claim) */
    uint64_t           beat_ticket;  /* heartbeat in flight; 0: none */
    uint64_t           arrival_ns;   /* when it was received */
} kvf_dc_waiting_t;

struct kvf_decode_server {
    kvf_decode_config_t        cfg;
    bool                       recompute;
    kvf_engine_h               engine;
    const kvf_connector_ops_t *xops;
    kvf_connector_h            conn;
    kvf_serve_server_h         serve;
    kvf_dc_req_t              *reqs;        /* pulling (pull != NULL) and decoding */
    int                        num_reqs;
    int                        cap_reqs;
    int                        num_pulling;
    kvf_dc_waiting_t          *waiting;     /* FIFO */
    int                        num_waiting;
    int                        cap_waiting;
    kvf_dc_checks_t            checks;      /* check_peer handshakes in flight */
    kvf_dc_pull_ctx_t          px;          /* the pulls' connector and counters */
    kvf_drain_t                drain;
    uint64_t                   broken_ms;   /* TP world broke then (kvf_role_broken_exit) */
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

/* Abandon and free the pull of @a q, if any (nothing lands afterwards). */
static void kvf_dc_import_free(kvf_decode_server_h srv, kvf_dc_req_t *q)
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

static void kvf_dc_req_cleanup(kvf_decode_server_h srv, kvf_dc_req_t *q)
{
    kvf_dc_import_free(srv, q);
    free(q->tokens);
    q->tokens = NULL;
    kvf_logprob_buf_free(&q->lp);
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

/* ---- replies ------------------------------------------------------------ */

static void kvf_dc_reply_tokens(kvf_decode_server_h srv, kvf_dc_req_t *q, const int32_t *tokens,
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

static const char *kvf_dc_finish_str(kvf_finish_reason_t r)
{
    switch (r) {
    case KVF_FINISH_LENGTH: return "length";
    case KVF_FINISH_EOS:    return "stop";
    case KVF_FINISH_ABORT:  return "abort";
    default:                return "error";
    }
}

static int kvf_dc_find(kvf_decode_server_h srv, uint64_t engine_req)
{
    for (int i = 0; i < srv->num_reqs; ++i) {
        if ((srv->reqs[i].imp == NULL) && (srv->reqs[i].engine_req == engine_req)) {
            return i;
        }
    }
    return -1;
}

static void kvf_dc_remove(kvf_decode_server_h srv, int i)
{
    kvf_dc_req_cleanup(srv, &srv->reqs[i]);
    srv->reqs[i] = srv->reqs[--srv->num_reqs];
}

static kvf_dc_req_t *kvf_dc_track(kvf_decode_server_h srv)
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

/* ---- the pull ----------------------------------------------------------- */

/* Load failed: prefill the prompt and prefill's first token here instead. */
static kvf_status_t kvf_dc_recompute(kvf_decode_server_h srv, const Kvf__DecodeRequest *dr,
                                     int32_t first_token, const kvf_req_params_t *rp,
                                     kvf_dc_req_t *q)
{
    kvf_req_params_t p = *rp;
    int32_t *prompt = malloc((dr->n_prompt_tokens + 1) * sizeof(*prompt));
    kvf_status_t status;

    if (prompt == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    memcpy(prompt, dr->prompt_tokens, dr->n_prompt_tokens * sizeof(*prompt));
    prompt[dr->n_prompt_tokens] = first_token;
    p.prompt = prompt;
    p.prompt_len = (int)dr->n_prompt_tokens + 1;
    p.sampling.max_tokens = rp->sampling.max_tokens - 1;
    p.outputs_in_prompt = 1;   /* the first token is an output to penalties and min_tokens */
    status = kvf_engine_add_request(srv->engine, &p, &q->engine_req);
    free(prompt);
    q->stats.recomputed = 1;
    return status;
}

/* What the pull of request @a q measured, into its stats and timing; @a skip the tokens
 * decode's prefix cache held of the @a n prompt tokens. */
static void kvf_dc_pull_stats(kvf_dc_req_t *q, const kvf_dc_pull_stats_t *ps, int64_t skip,
                              int64_t n)
{
    q->stats.has_decode_cached_tokens = q->stats.has_pulled_tokens = 1;
    q->stats.decode_cached_tokens = (uint32_t)skip;
    q->stats.pulled_tokens = (uint32_t)(n - skip);
    q->stats.handshake_ms = ps->handshake_ms;
    q->stats.transfer_ms = ps->transfer_ms;
    q->stats.bytes = ps->bytes;
    q->stats.descriptors = ps->descriptors;
    q->stats.reads = ps->reads;
    q->timing.has_handshake_ms = 1;
    q->timing.handshake_ms = ps->handshake_ms;
    if (ps->landed_ns > 0) {
        q->timing.has_posting_ms = q->timing.has_wire_ms = 1;
        q->timing.posting_ms = ps->posting_ms;
        q->timing.wire_ms = ps->wire_ms;
        q->landed_ns = ps->landed_ns;
    }
}

/*
 * The pull of reqs[@a i] ended with @a status: commit the import (decoding
 * starts), recompute, or answer the error. May remove reqs[@a i].
 */
static void kvf_dc_pull_end(kvf_decode_server_h srv, int i, kvf_status_t status)
{
    kvf_dc_req_t *q = &srv->reqs[i];
    kvf_dc_import_t *imp = q->imp;
    const Kvf__DecodeRequest *dr = imp->msg->decode;
    const char *err = imp->pull.err;
    char msg[96];
    kvf_req_info_t info;

    kvf_dc_pull_stats(q, &imp->pull.stats, imp->pull.skip_tokens, (int64_t)imp->xp.num_tokens);
    if (status == KVF_OK) {
        status = kvf_engine_import_commit(srv->engine, q->engine_req, imp->xp.first_token);
        if (status != KVF_OK) {
            snprintf(msg, sizeof(msg), "first token %d rejected", imp->xp.first_token);
            err = msg;
        }
    }
    q->committed_ns = kvf_time_now_ns();
    if (q->landed_ns > 0) {
        q->timing.has_post_ops_ms = 1;
        q->timing.post_ops_ms = (double)(q->committed_ns - q->landed_ns) / 1e6;
    }
    if (status != KVF_OK) {
        kvf_engine_abort(srv->engine, q->engine_req);
        kvf_engine_release(srv->engine, q->engine_req);
        kvf_warn("request %s: %s", q->request_id, err);
        if (srv->recompute && (imp->rp.sampling.max_tokens > 1) &&
            (status != KVF_ERR_REFUSED) &&
            (kvf_dc_recompute(srv, dr, imp->xp.first_token, &imp->rp, q) == KVF_OK)) {
            kvf_dc_import_free(srv, q);
            return;   /* decoding continues from the local prefill */
        }
        kvf_serve_server_reply_error(srv->serve, &q->peer, q->request_id, status, err);
        kvf_dc_remove(srv, i);
        return;
    }
    kvf_dc_import_free(srv, q);
    /* EOS as first token, or max_tokens 1: finished at commit */
    if ((kvf_engine_request_info(srv->engine, q->engine_req, &info) == KVF_OK) &&
        (info.state == KVF_REQ_FINISHED)) {
        kvf_dc_reply_tokens(srv, q, NULL, 0, true, kvf_dc_finish_str(info.finish));
        kvf_engine_release(srv->engine, q->engine_req);
        kvf_dc_remove(srv, i);
    }
}

/* Advance every pull as far as it goes without waiting. @return pulls with reads on the wire. */
static int kvf_dc_advance_pulls(kvf_decode_server_h srv)
{
    int on_wire = 0;

    /* backwards: a removal swaps the last (already advanced) request into i */
    for (int i = srv->num_reqs - 1; i >= 0; --i) {
        kvf_dc_import_t *imp = srv->reqs[i].imp;
        kvf_status_t status;

        if (imp == NULL) {
            continue;
        }
        status = kvf_dc_pull_advance(&srv->px, &imp->pull);
        if (srv->reqs[i].aborted && ((status != KVF_INPROGRESS) ||
                                     !kvf_dc_pull_on_wire(&imp->pull))) {
            kvf_dc_import_free(srv, &srv->reqs[i]);   /* nothing lands any more: abandoned */
            kvf_engine_abort(srv->engine, srv->reqs[i].engine_req);
            kvf_engine_release(srv->engine, srv->reqs[i].engine_req);
            kvf_dc_remove(srv, i);
        } else if (status != KVF_INPROGRESS) {
            kvf_dc_pull_end(srv, i, status);
        } else {
            on_wire += kvf_dc_pull_on_wire(&imp->pull);
        }
    }
    return on_wire;
}

typedef enum {
    KVF_DC_DONE = 0,      /* answered (an error): the caller frees the request message */
    KVF_DC_WAIT = 1,      /* no free blocks now: keep the message and retry later */
    KVF_DC_STARTED = 2,   /* the pull started: the message and the params were moved in */
} kvf_dc_outcome_t;

/* The engine's parameters of @a dr (its prompt stays dr's). */
static void kvf_dc_req_params(kvf_decode_server_h srv, const Kvf__DecodeRequest *dr,
                              kvf_req_params_t *rp)
{
    char err[256];

    memset(rp, 0, sizeof(*rp));
    rp->prompt = dr->prompt_tokens;
    rp->prompt_len = (int)dr->n_prompt_tokens;
    rp->rng_skip = 1;   /* prefill sampled the first token from this seed */
    /* checked on arrival (kvf_dc_sampling_check) */
    (void)kvf_sampling_from_msg(dr->sampling, 16, kvf_engine_model_config(srv->engine)->vocab_size,
                                &rp->sampling, err, sizeof(err));
    rp->sampling.want_prompt_logprobs = false;   /* prefill reports them; a recompute here
                                                  * need not go one token per step */
    if (dr->has_cache_salt) {   /* length checked on arrival (kvf_decode_check.c) */
        rp->cache_salt = dr->cache_salt.data;
        rp->cache_salt_len = dr->cache_salt.len;
    }
}

/* The sampling parameters of a DecodeRequest, checked on arrival; KVF_OK or the refusal. */
static kvf_status_t kvf_dc_sampling_check(kvf_decode_server_h srv, const Kvf__DecodeRequest *dr,
                                          char *err, size_t cap)
{
    kvf_sampling_t s;
    char msg[256];

    if (kvf_sampling_from_msg(dr->sampling, 16, kvf_engine_model_config(srv->engine)->vocab_size,
                              &s, msg, sizeof(msg)) != KVF_OK) {
        snprintf(err, cap, "sampling parameters: %s", msg);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/*
 * Allocate blocks for @a req and start its pull. @a xp is what
 * kvf_decode_request_check() decoded from it on arrival; on KVF_DC_STARTED
 * both @a req and @a xp were moved into the tracked request.
 */
static kvf_dc_outcome_t kvf_dc_decode(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
                                      Kvf__ServeRequest *req, uint64_t arrival_ns,
                                      kvf_xfer_params_msg_t *xp)
{
    const Kvf__DecodeRequest *dr = req->decode;
    kvf_block_manager_h bm = kvf_engine_block_manager(srv->engine);
    const char *rid = (dr->request_id != NULL) ? dr->request_id : "";
    const kvf_req_blocks_t *blocks;
    kvf_req_blocks_t none;
    kvf_dc_import_t *imp;
    kvf_req_params_t rp;
    kvf_dc_req_t *q;
    char err[256];
    uint64_t id, t_alloc;
    kvf_status_t status;

    kvf_dc_req_params(srv, dr, &rp);
    rp.import_source = xp->prefix_source;   /* keys decode's own prefix cache */
    memset(&none, 0, sizeof(none));
    if (kvf_block_manager_blocks_needed(bm, &none, rp.prompt_len) >
        kvf_block_manager_num_blocks(bm)) {
        snprintf(err, sizeof(err), "prompt of %d tokens needs %d blocks, this decode instance"
                 " has %d (--num-blocks)", rp.prompt_len,
                 kvf_block_manager_blocks_needed(bm, &none, rp.prompt_len),
                 kvf_block_manager_num_blocks(bm));
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_OUT_OF_RANGE, err);
        return KVF_DC_DONE;
    }
    if (!kvf_block_manager_can_allocate(bm, &none, rp.prompt_len)) {
        return KVF_DC_WAIT;   /* running requests will free blocks */
    }
    imp = calloc(1, sizeof(*imp));
    q = (imp != NULL) ? kvf_dc_track(srv) : NULL;
    if (q == NULL) {
        free(imp);
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_NO_MEMORY, "out of memory");
        return KVF_DC_DONE;
    }
    snprintf(q->request_id, sizeof(q->request_id), "%s", rid);
    q->peer = *peer;
    q->stream = dr->has_stream && dr->stream;
    q->arrival_ns = arrival_ns;
    q->want_logprobs = rp.sampling.want_logprobs;
    q->logprobs = rp.sampling.logprobs;

    t_alloc = kvf_time_now_ns();
    status = kvf_engine_import_begin(srv->engine, &rp, &id, &blocks);
    if ((status == KVF_OK) && (kvf_role_pools_sync(srv->engine) != KVF_OK)) {
        /* a GPU pool: the fresh blocks' zeroing must be done before any GET can land */
        (void)kvf_engine_release(srv->engine, id);
        free(imp);
        kvf_dc_remove(srv, srv->num_reqs - 1);
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_CUDA,
                                     "zeroing the request's fresh blocks on the device failed");
        return KVF_DC_DONE;
    }
    if (status != KVF_OK) {
        free(imp);
        kvf_dc_remove(srv, srv->num_reqs - 1);
        if (status == KVF_ERR_NO_RESOURCE) {
            return KVF_DC_WAIT;
        }
        kvf_serve_server_reply_error(srv->serve, peer, rid, status,
                                     "prompt rejected (token outside the vocabulary?)");
        return KVF_DC_DONE;
    }
    q->engine_req = id;
    q->timing.has_queue_ms = q->timing.has_alloc_ms = 1;
    q->timing.queue_ms = (double)(t_alloc - arrival_ns) / 1e6;
    q->timing.alloc_ms = (double)(kvf_time_now_ns() - t_alloc) / 1e6;
    imp->msg = req;
    imp->xp = *xp;
    memset(xp, 0, sizeof(*xp));   /* moved */
    imp->rp = rp;
    kvf_dc_pull_begin(&srv->px, &imp->pull, &imp->xp, blocks, rid);
    kvf_dc_pull_prefix(&srv->px, &imp->pull, srv->engine, id);
    q->imp = imp;
    srv->num_pulling++;
    return KVF_DC_STARTED;
}

/* ---- requests waiting for blocks ---------------------------------------- */

/*
 * Keep @a req (and its decoded params @a xp, moved in) until blocks free up,
 * at most until shortly before prefill's lease ends.
 */
static bool kvf_dc_wait(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
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
static void kvf_dc_unwait(kvf_decode_server_h srv, int i)
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
static void kvf_dc_admit_waiting(kvf_decode_server_h srv)
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

static void kvf_dc_health_fill(kvf_decode_server_h srv, Kvf__HealthReply *h)
{
    kvf_role_health_fill(srv->engine, "decode", &srv->cfg.role, h);
    h->has_running = h->has_handshake_refusals = h->has_peer_errors = h->has_queue_depth = 1;
    h->running = (uint32_t)(srv->num_reqs + srv->num_waiting);
    h->queue_depth = (uint32_t)srv->num_waiting;
    h->handshake_refusals = srv->px.refusals;
    h->peer_errors = srv->px.peer_errors;
    h->has_expired_reads_prevented = 1;
    h->expired_reads_prevented = srv->px.reads_prevented;
    h->has_incarnation = 1;
    h->incarnation = srv->xops->incarnation(srv->conn);
    h->has_draining = 1;
    h->draining = kvf_drain_active(&srv->drain);
    h->has_kv_digest_mismatches = 1;
    h->kv_digest_mismatches = srv->px.digest_mismatches;
    h->has_max_queue = 1;
    h->max_queue = (uint32_t)srv->cfg.max_queue;
    h->has_kv_pulls_total = h->has_kv_pulled_bytes_total = 1;
    h->kv_pulls_total = srv->px.pulls_valid;
    h->kv_pulled_bytes_total = srv->px.bytes_valid;
}

/* Health probes are answered by the control channel's thread from this. */
static void kvf_dc_publish_health(kvf_decode_server_h srv)
{
    Kvf__HealthReply h;

    kvf_dc_health_fill(srv, &h);
    (void)kvf_serve_server_set_health(srv->serve, &h);
    kvf_daemon_http_publish(&h);   /* --metrics-port's /metrics and /health */
}

static void kvf_dc_health(kvf_decode_server_h srv, const kvf_serve_peer_t *peer)
{
    Kvf__HealthReply h;

    kvf_dc_health_fill(srv, &h);
    kvf_role_reply_health(srv->serve, peer, &h);
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
        kvf_dc_health(srv, peer);
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
