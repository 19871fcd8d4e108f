/*
 * kvf-decode: request handling around the engine and the KV connector.
 *
 * Design: the pull of a request runs to completion on the leader thread
 * between engine steps: start_pull on every rank (planning and posting
 * never block), then poll every rank until each reports a final status
 * (bounded by the connector timeout), then finish_pull on every rank and release the lease, so
 * prefill frees its blocks only after ALL decode ranks are done reading.
 * Running requests pause for the transfer time; that keeps the engine
 * single-threaded, as its contract requires. Rejected alternative: pulling
 * on rank threads concurrently with steps, which would need the engine to
 * hand out pools during steps.
 *
 * Leases (docs/ARCHITECTURE.md §9): before any GET decode claims the lease on
 * prefill's side channel (binding it to this engine, extending it, and
 * learning how long it has left); it does not start a pull with less time
 * left than its transfer timeout. After the GETs, every rank releases it,
 * and only if prefill answers "valid" for all of them does decode use the
 * bytes: otherwise the pages may already hold another prompt's KV, and the
 * request fails (or is recomputed, per --load-failure). Requests waiting in
 * line for blocks heartbeat their lease (a claim every third of its time
 * left), so it does not run out while they wait.
 *
 * The first token was sampled by prefill and already reported to the
 * client by the proxy, so decode replies carry only the tokens after it.
 *
 * Drain (first SIGTERM): new decode requests are refused (KVF_ERR_BUSY,
 * health says draining); running and waiting ones are served to their end.
 * Whatever is left at --drain-timeout gets an error reply (a stream's error
 * event), then the loop returns.
 */
#include "kvf_decode_server.h"

#include "kvf_decode_check.h"

#include "kvf_engine.h"
#include "kvf_fault.h"
#include "kvf_handshake.h"
#include "kvf_log.h"
#include "kvf_time.h"
#include "kvf_role.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KVF_DC_MAX_EVENTS 512
#define KVF_DC_MAX_TP     KVF_ROLE_MAX_TP

const kvf_config_field_t kvf_decode_config_table[] = {
    KVF_ROLE_CONFIG_FIELDS(kvf_decode_config_t, "tcp://127.0.0.1:5567", "decode-0"),
    {"LOAD_FAILURE", "fail", "when a pull fails: fail the request, or recompute the prompt",
     offsetof(kvf_decode_config_t, load_failure), KVF_CONFIG_TYPE_STRING, 0},
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
    uint64_t         arrival_ns;   /* DecodeRequest received */
    uint64_t         landed_ns;    /* latest rank's last GET landed */
    uint64_t         committed_ns; /* import committed: decoding may start */
} kvf_dc_req_t;

/* A decode request waiting for free blocks (the pool is busy, not too small). */
typedef struct {
    Kvf__ServeRequest *req;          /* owned */
    kvf_xfer_params_msg_t params;    /* req's transfer params, decoded once on arrival; owned */
    kvf_serve_peer_t   peer;
    uint64_t           deadline_ns;  /* give up one transfer timeout before the lease ends */
    uint64_t           beat_ns;      /* next heartbeat (lease claim) */
    uint64_t           arrival_ns;   /* when it was received */
} kvf_dc_waiting_t;

struct kvf_decode_server {
    kvf_decode_config_t        cfg;
    bool                       recompute;
    kvf_engine_h               engine;
    const kvf_connector_ops_t *xops;
    kvf_connector_h            conn;
    kvf_serve_server_h         serve;
    kvf_dc_req_t              *reqs;
    int                        num_reqs;
    int                        cap_reqs;
    kvf_dc_waiting_t          *waiting;     /* FIFO */
    int                        num_waiting;
    int                        cap_waiting;
    uint64_t                   refusals;
    uint64_t                   peer_errors;
    uint64_t                   reads_prevented;   /* lease not valid: KV not used / not read */
    uint64_t                   drain_start_ns;    /* 0 until SIGTERM */
    uint64_t                   drained_ns;        /* 0 until no request is left */
#if KVF_FAULT_ENABLED
    char                       fault_last_rid[KVF_ENGINE_ID_MAX];   /* lease.claim=replay */
    uint64_t                   fault_last_nonce;
    bool                       fault_replayed;    /* this pull's claim was the replay */
#endif
};

static kvf_status_t kvf_dc_setup(kvf_decode_server_h srv)
{
    kvf_status_t status = kvf_role_start(&srv->cfg.role, KVF_CONNECTOR_ROLE_DECODE, NULL, 0,
                                         &srv->engine, &srv->xops, &srv->conn);
    if (status != KVF_OK) {
        return status;
    }
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
                 " failure policy %s", cfg->role.engine_id, cfg->role.tp,
             kvf_block_manager_block_size(kvf_engine_block_manager(srv->engine)),
             cfg->role.num_blocks, cfg->role.listen, cfg->load_failure);
    *srv_p = srv;
    return KVF_OK;
}

void kvf_decode_server_destroy(kvf_decode_server_h srv)
{
    if (srv == NULL) {
        return;
    }
    kvf_serve_server_destroy(srv->serve);
    if (srv->conn != NULL) {
        srv->xops->destroy(srv->conn);
    }
    kvf_engine_destroy(srv->engine);
    for (int i = 0; i < srv->num_reqs; ++i) {
        free(srv->reqs[i].tokens);
    }
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
        if (srv->reqs[i].engine_req == engine_req) {
            return i;
        }
    }
    return -1;
}

static void kvf_dc_remove(kvf_decode_server_h srv, int i)
{
    free(srv->reqs[i].tokens);
    srv->reqs[i] = srv->reqs[--srv->num_reqs];
}

static kvf_dc_req_t *kvf_dc_track(kvf_decode_server_h srv)
{
    if (srv->num_reqs == srv->cap_reqs) {
        int cap = srv->cap_reqs ? 2 * srv->cap_reqs : 64;
        kvf_dc_req_t *n = realloc(srv->reqs, (size_t)cap * sizeof(*n));
        if (n == NULL) {
            return NULL;
        }
        srv->reqs = n;
        srv->cap_reqs = cap;
    }
    kvf_dc_req_t *q = &srv->reqs[srv->num_reqs++];
    memset(q, 0, sizeof(*q));
    kvf__transfer_stats__init(&q->stats);
    q->stats.has_bytes = q->stats.has_descriptors = q->stats.has_reads = 1;
    q->stats.has_handshake_ms = q->stats.has_transfer_ms = q->stats.has_recomputed = 1;
    kvf__serve_timing__init(&q->timing);
    return q;
}

/* ---- the pull ----------------------------------------------------------- */

/* One lease operation with the prefill engine named in @a xp (leader thread). */
static kvf_status_t kvf_dc_lease(kvf_decode_server_h srv, const kvf_xfer_params_msg_t *xp,
                                 const char *request_id, kvf_lease_op_t op, int rank,
                                 kvf_status_t pull_status, kvf_lease_answer_t *answer)
{
    kvf_lease_msg_t m;

    memset(&m, 0, sizeof(m));
    m.op = op;
    snprintf(m.request_id, sizeof(m.request_id), "%s", request_id);
    m.nonce = xp->nonce;
    m.decode_rank = rank;
    m.decode_tp = srv->cfg.role.tp;
    m.status = pull_status;
#if KVF_FAULT_ENABLED
    if ((op == KVF_LEASE_OP_CLAIM) && (KVF_FAULT(LEASE_CLAIM) == KVF_FAULT_REPLAY)) {
        if (srv->fault_last_rid[0] != '\0') {
            /* stale transfer params: a lease this decode already released */
            kvf_warn("fault lease.claim: request %s claims with the transfer params of request"
                     " %s (released); GETs posted so far: %" PRIu64, request_id,
                     srv->fault_last_rid, kvf_fault_passes(KVF_FAULT_POINT_UCX_POST));
            snprintf(m.request_id, sizeof(m.request_id), "%s", srv->fault_last_rid);
            m.nonce = srv->fault_last_nonce;
            srv->fault_replayed = true;
        } else {
            kvf_warn("fault lease.claim: no released lease to replay yet");
        }
    }
#endif
    return srv->xops->lease(srv->conn, xp->engine_id, xp->host, xp->port, &m, answer);
}

/* Pull the request's state into @a blocks on every rank; fills q->stats. */
static kvf_status_t kvf_dc_pull(kvf_decode_server_h srv, const kvf_xfer_params_msg_t *xp,
                                const kvf_req_blocks_t *blocks, kvf_dc_req_t *q, char *err,
                                size_t err_len)
{
    kvf_lease_answer_t answer;
    kvf_connector_pull_t pull;
    kvf_connector_req_h reqs[KVF_DC_MAX_TP] = {NULL};
    kvf_status_t final[KVF_DC_MAX_TP];
    kvf_status_t status = KVF_OK;
    uint64_t t0 = kvf_time_now_ns();
    int ntp = srv->cfg.role.tp;
    bool pending;

    if (xp->has_incarnation) {
        uint64_t cached;
        if ((srv->xops->remote_incarnation(srv->conn, xp->engine_id, &cached) == KVF_OK) &&
            (cached != xp->incarnation)) {
            /* same engine id, another process: its keys and endpoints are new */
            kvf_info("prefill engine %s restarted (incarnation %016" PRIx64 " -> %016" PRIx64
                     "): handshaking again", xp->engine_id, cached, xp->incarnation);
            srv->xops->forget_engine(srv->conn, xp->engine_id);
        }
    }
    status = srv->xops->handshake(srv->conn, xp->engine_id, xp->host, xp->port, err,
                                  err_len);
    q->stats.handshake_ms = (double)(kvf_time_now_ns() - t0) / 1e6;
    if (status != KVF_OK) {
        if (status == KVF_ERR_REFUSED) {
            srv->refusals++;
        } else if (KVF_IS_PEER_ERROR(status)) {
            srv->peer_errors++;
        }
        return status;
    }
    if (xp->num_groups != blocks->num_groups) {
        snprintf(err, err_len, "transfer params carry %d KV cache groups, this model has %d",
                 xp->num_groups, blocks->num_groups);
        return KVF_ERR_INVALID_PARAM;
    }
    /* claim the lease before any GET: stale or replayed params stop here */
    status = kvf_dc_lease(srv, xp, q->request_id, KVF_LEASE_OP_CLAIM, 0, KVF_OK, &answer);
    if (status != KVF_OK) {
        snprintf(err, err_len, "claiming the KV lease of request %s at prefill %s failed: %s",
                 q->request_id, xp->engine_id, kvf_status_str(status));
        return status;
    }
    if (answer.verdict != KVF_LEASE_VALID) {
        srv->reads_prevented++;
#if KVF_FAULT_ENABLED
        if (srv->fault_replayed) {
            srv->fault_replayed = false;
            kvf_warn("fault lease.claim: replayed claim of request %s answered %s; GETs posted"
                     " so far: %" PRIu64, q->request_id,
                     (answer.verdict == KVF_LEASE_EXPIRED) ? "expired" : "refused",
                     kvf_fault_passes(KVF_FAULT_POINT_UCX_POST));
        }
#endif
        snprintf(err, err_len, "the KV lease %s before the read could start (prefill %s: %s);"
                 " nothing was read", (answer.verdict == KVF_LEASE_EXPIRED) ? "expired" :
                 "was refused", xp->engine_id, answer.why);
        return KVF_ERR_LEASE_EXPIRED;
    }
    if (answer.ms_left < (uint64_t)srv->cfg.role.xfer_timeout_ms) {
        srv->reads_prevented++;
        snprintf(err, err_len, "the KV lease of request %s has %llu ms left, less than the"
                 " transfer timeout (--xfer-timeout %lld ms): not starting the pull",
                 q->request_id, (unsigned long long)answer.ms_left,
                 (long long)srv->cfg.role.xfer_timeout_ms);
        return KVF_ERR_LEASE_EXPIRED;
    }
    if (srv->cfg.test_pull_delay_ms > 0) {   /* fault tests kill prefill in this window */
        struct timespec d = {.tv_sec = srv->cfg.test_pull_delay_ms / 1000,
                             .tv_nsec = (srv->cfg.test_pull_delay_ms % 1000) * 1000000};
        kvf_info("request %s: test pull delay %" PRId64 " ms", q->request_id,
                 srv->cfg.test_pull_delay_ms);
        while ((nanosleep(&d, &d) != 0) && (errno == EINTR)) {   /* SIGTERM: drain test */
        }
    }
    memset(&pull, 0, sizeof(pull));
    pull.engine_id = xp->engine_id;
    pull.request_id = q->request_id;
    pull.num_tokens = xp->num_tokens;
    pull.num_groups = blocks->num_groups;
    for (int g = 0; g < blocks->num_groups; ++g) {
        pull.remote_ids[g] = xp->ids[g];
        pull.num_remote_ids[g] = xp->num_ids[g];
        pull.local_ids[g] = blocks->blocks[g];
        pull.num_local_ids[g] = blocks->num_blocks[g];
    }

    t0 = kvf_time_now_ns();
    q->timing.has_handshake_ms = 1;
    q->timing.handshake_ms = q->stats.handshake_ms;
    for (int r = 0; r < ntp; ++r) {
        final[r] = srv->xops->start_pull(srv->conn, r, &pull, &reqs[r]);
        if (final[r] == KVF_OK) {
            final[r] = KVF_INPROGRESS;
        } else {
            reqs[r] = NULL;
        }
    }
    do {   /* each poll is bounded by the connector's timeout */
        pending = false;
        for (int r = 0; r < ntp; ++r) {
            if (final[r] == KVF_INPROGRESS) {
                final[r] = srv->xops->poll(srv->conn, r, reqs[r]);
                pending |= (final[r] == KVF_INPROGRESS);
            }
        }
    } while (pending);
    q->stats.transfer_ms = (double)(kvf_time_now_ns() - t0) / 1e6;

    {
        /* Phase boundaries are the latest rank's, so the phases add up (proto: ServeTiming). */
        uint64_t posted = t0, landed = 0;
        for (int r = 0; r < ntp; ++r) {
            kvf_connector_stats_t st;
            if (reqs[r] == NULL) {
                continue;
            }
            if (srv->xops->req_stats(srv->conn, r, reqs[r], &st) == KVF_OK) {
                q->stats.bytes += st.bytes;
                q->stats.descriptors += st.descriptors;
                q->stats.reads += (uint32_t)st.remote_ranks;
                posted = (st.posted_ns > posted) ? st.posted_ns : posted;
                landed = (st.landed_ns > landed) ? st.landed_ns : landed;
            }
        }
        if (landed > 0) {
            q->timing.has_posting_ms = q->timing.has_wire_ms = 1;
            q->timing.posting_ms = (double)(posted - t0) / 1e6;
            q->timing.wire_ms = (landed > posted) ? (double)(landed - posted) / 1e6 : 0.0;
            q->landed_ns = (landed > posted) ? landed : posted;
        }
    }
    for (int r = 0; r < ntp; ++r) {   /* drained (or endpoints closed): nothing lands later */
        if (reqs[r] != NULL) {
            srv->xops->finish_pull(srv->conn, r, reqs[r]);
        }
        if ((status == KVF_OK) && (final[r] != KVF_OK)) {
            status = final[r];
        }
    }
    if (status == KVF_OK) {
        /* the bytes count only if the lease held throughout: ask, per rank */
        kvf_lease_verdict_t worst = KVF_LEASE_VALID;
        char why[sizeof(answer.why)] = "";
        for (int r = 0; r < ntp; ++r) {
            kvf_status_t s = kvf_dc_lease(srv, xp, q->request_id, KVF_LEASE_OP_RELEASE, r, KVF_OK,
                                          &answer);
            if (s != KVF_OK) {
                if (status == KVF_OK) {
                    status = s;
                    snprintf(err, err_len, "releasing the KV lease of request %s at prefill %s"
                             " failed: %s; the KV read is not trusted", q->request_id,
                             xp->engine_id, kvf_status_str(s));
                }
            } else if (answer.verdict > worst) {
                worst = answer.verdict;
                snprintf(why, sizeof(why), "%s", answer.why);
            }
        }
#if KVF_FAULT_ENABLED
        if ((status == KVF_OK) && (worst == KVF_LEASE_VALID)) {
            snprintf(srv->fault_last_rid, sizeof(srv->fault_last_rid), "%s", q->request_id);
            srv->fault_last_nonce = xp->nonce;
        }
#endif
        if ((status == KVF_OK) && (worst != KVF_LEASE_VALID)) {
            srv->reads_prevented++;
            snprintf(err, err_len, "the KV lease expired before the read finished (prefill %s:"
                     " %s); the pulled KV was not used", xp->engine_id, why);
            return KVF_ERR_LEASE_EXPIRED;
        }
        if (status != KVF_OK) {
            return status;
        }
    }
    if (status != KVF_OK) {
        if (KVF_IS_PEER_ERROR(status) && (status != KVF_ERR_LEASE_EXPIRED)) {
            /* the prefill process may have restarted under the same engine id
             * (new keys, new endpoints): handshake afresh next time */
            srv->peer_errors++;
            srv->xops->forget_engine(srv->conn, xp->engine_id);
        }
        if (status == KVF_ERR_PEER_TIMEOUT) {
            snprintf(err, err_len, "kv pull from %s failed: no completion within --xfer-timeout"
                     " %lld ms", xp->engine_id, (long long)srv->cfg.role.xfer_timeout_ms);
        } else {
            snprintf(err, err_len, "kv pull from %s failed: %s", xp->engine_id,
                     kvf_status_str(status));
        }
    }
    return status;
}

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
    status = kvf_engine_add_request(srv->engine, &p, &q->engine_req);
    free(prompt);
    q->stats.recomputed = 1;
    return status;
}

typedef enum {
    KVF_DC_DONE = 0,   /* answered, started, or failed: the request message may go */
    KVF_DC_WAIT = 1,   /* no free blocks now: keep the message and retry later */
} kvf_dc_outcome_t;

/* @a xp is what kvf_decode_request_check() decoded from @a dr when it arrived; retries reuse it. */
static kvf_dc_outcome_t kvf_dc_decode(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
                                      const Kvf__DecodeRequest *dr, uint64_t arrival_ns,
                                      const kvf_xfer_params_msg_t *xp)
{
    kvf_block_manager_h bm = kvf_engine_block_manager(srv->engine);
    kvf_req_blocks_t none;
    const char *rid = (dr->request_id != NULL) ? dr->request_id : "";
    const kvf_req_blocks_t *blocks;
    kvf_req_params_t rp;
    kvf_req_info_t info;
    kvf_dc_req_t *q;
    char err[512] = "";
    uint64_t id, t_alloc;
    kvf_status_t status;

    memset(&rp, 0, sizeof(rp));
    rp.prompt = dr->prompt_tokens;
    rp.prompt_len = (int)dr->n_prompt_tokens;
    rp.sampling.max_tokens = 16;
    rp.rng_skip = 1;   /* prefill sampled the first token from this seed */
    if (dr->sampling != NULL) {
        rp.sampling.temperature = dr->sampling->temperature;
        rp.sampling.seed = dr->sampling->seed;
        rp.sampling.ignore_eos = dr->sampling->ignore_eos;
        if (dr->sampling->has_max_tokens) {
            rp.sampling.max_tokens = (int)dr->sampling->max_tokens;
        }
    }
    if (rp.sampling.max_tokens < 1) {
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_INVALID_PARAM,
                                     "max_tokens must be at least 1");
        return KVF_DC_DONE;
    }
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
    q = kvf_dc_track(srv);
    if (q == NULL) {
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_NO_MEMORY, "out of memory");
        return KVF_DC_DONE;
    }
    snprintf(q->request_id, sizeof(q->request_id), "%s", rid);
    q->peer = *peer;
    q->stream = dr->has_stream && dr->stream;
    q->arrival_ns = arrival_ns;

    t_alloc = kvf_time_now_ns();
    status = kvf_engine_import_begin(srv->engine, &rp, &id, &blocks);
    if (status != KVF_OK) {
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
    status = kvf_dc_pull(srv, xp, blocks, q, err, sizeof(err));
    if (status == KVF_OK) {
        status = kvf_engine_import_commit(srv->engine, id, xp->first_token);
        if (status != KVF_OK) {
            snprintf(err, sizeof(err), "first token %d rejected", xp->first_token);
        }
    }
    q->committed_ns = kvf_time_now_ns();
    if (q->landed_ns > 0) {
        q->timing.has_post_ops_ms = 1;
        q->timing.post_ops_ms = (double)(q->committed_ns - q->landed_ns) / 1e6;
    }
    if (status != KVF_OK) {
        kvf_engine_abort(srv->engine, id);
        kvf_engine_release(srv->engine, id);
        kvf_warn("request %s: %s", rid, err);
        if (srv->recompute && (rp.sampling.max_tokens > 1) && (status != KVF_ERR_REFUSED) &&
            (kvf_dc_recompute(srv, dr, xp->first_token, &rp, q) == KVF_OK)) {
            return KVF_DC_DONE;   /* decoding continues from the local prefill */
        }
        kvf_serve_server_reply_error(srv->serve, peer, rid, status, err);
        kvf_dc_remove(srv, srv->num_reqs - 1);
        return KVF_DC_DONE;
    }
    /* EOS as first token, or max_tokens 1: finished at commit */
    if ((kvf_engine_request_info(srv->engine, id, &info) == KVF_OK) &&
        (info.state == KVF_REQ_FINISHED)) {
        kvf_dc_reply_tokens(srv, q, NULL, 0, true, kvf_dc_finish_str(info.finish));
        kvf_engine_release(srv->engine, id);
        kvf_dc_remove(srv, srv->num_reqs - 1);
    }
    return KVF_DC_DONE;
}

/*
 * Keep @a req (and its decoded params @a xp, moved in) until blocks free up,
 * at most until shortly before prefill's lease ends.
 */
static bool kvf_dc_wait(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
                        Kvf__ServeRequest *req, uint64_t arrival_ns,
                        kvf_xfer_params_msg_t *xp)
{
    /* at most the lease time left on arrival less one transfer timeout (deploy/README.md,
     * "Timeouts"); the heartbeat keeps the lease itself alive meanwhile */
    uint64_t t_ms = (uint64_t)srv->cfg.role.xfer_timeout_ms;
    uint64_t left_ms = (xp->lease_ms_left > t_ms) ? xp->lease_ms_left - t_ms : 0;
    uint64_t beat_ms = xp->lease_ms_left / 3;
    uint64_t now = kvf_time_now_ns();

    if (srv->num_waiting == srv->cap_waiting) {
        int cap = srv->cap_waiting ? 2 * srv->cap_waiting : 64;
        kvf_dc_waiting_t *n = realloc(srv->waiting, (size_t)cap * sizeof(*n));
        if (n == NULL) {
            return false;
        }
        srv->waiting = n;
        srv->cap_waiting = cap;
    }
    srv->waiting[srv->num_waiting].req = req;
    srv->waiting[srv->num_waiting].params = *xp;
    memset(xp, 0, sizeof(*xp));                 /* moved */
    srv->waiting[srv->num_waiting].peer = *peer;
    srv->waiting[srv->num_waiting].deadline_ns = now + left_ms * 1000000ull;
    srv->waiting[srv->num_waiting].beat_ns = now + beat_ms * 1000000ull;
    srv->waiting[srv->num_waiting].arrival_ns = arrival_ns;
    srv->num_waiting++;
    kvf_log(KVF_LOG_DEBUG, KVF_SUB_SCHED, "request %s waits for decode blocks (%d waiting)",
            req->decode->request_id, srv->num_waiting);
    return true;
}

static void kvf_dc_unwait(kvf_decode_server_h srv, int i)
{
    kvf__serve_request__free_unpacked(srv->waiting[i].req, NULL);
    kvf_xfer_params_msg_cleanup(&srv->waiting[i].params);
    memmove(&srv->waiting[i], &srv->waiting[i + 1],
            (size_t)(srv->num_waiting - i - 1) * sizeof(srv->waiting[0]));
    srv->num_waiting--;
}

/* Heartbeat: claim (extend) the leases of waiting requests due for it; drop lost ones. */
static void kvf_dc_heartbeat(kvf_decode_server_h srv)
{
    uint64_t now = kvf_time_now_ns();

    for (int i = 0; i < srv->num_waiting; ++i) {
        kvf_dc_waiting_t *w = &srv->waiting[i];
        const char *rid = w->req->decode->request_id;
        kvf_lease_answer_t answer;
        kvf_status_t status;
        char err[384];

        if (now < w->beat_ns) {
            continue;
        }
        status = kvf_dc_lease(srv, &w->params, rid, KVF_LEASE_OP_CLAIM, 0, KVF_OK, &answer);
        if ((status == KVF_OK) && (answer.verdict == KVF_LEASE_VALID)) {
            w->beat_ns = now + answer.ms_left * 1000000ull / 3;
            kvf_log(KVF_LOG_DEBUG, KVF_SUB_SCHED, "request %s waits: lease extended, %llu ms"
                    " left", rid, (unsigned long long)answer.ms_left);
            continue;
        }
        if (status == KVF_OK) {
            srv->reads_prevented++;
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
        if (kvf_dc_decode(srv, &w->peer, w->req->decode, w->arrival_ns, &w->params) ==
            KVF_DC_DONE) {
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
        if (strcmp(srv->reqs[i].request_id, rid) == 0) {
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
    h->handshake_refusals = srv->refusals;
    h->peer_errors = srv->peer_errors;
    h->has_expired_reads_prevented = 1;
    h->expired_reads_prevented = srv->reads_prevented;
    h->has_incarnation = 1;
    h->incarnation = srv->xops->incarnation(srv->conn);
    h->has_draining = 1;
    h->draining = (srv->drain_start_ns != 0);
    h->has_max_queue = 1;
    h->max_queue = (uint32_t)srv->cfg.max_queue;
}

/* Health probes are answered by the control channel's thread from this. */
static void kvf_dc_publish_health(kvf_decode_server_h srv)
{
    Kvf__HealthReply h;

    kvf_dc_health_fill(srv, &h);
    (void)kvf_serve_server_set_health(srv->serve, &h);
}

static void kvf_dc_health(kvf_decode_server_h srv, const kvf_serve_peer_t *peer)
{
    Kvf__HealthReply h;

    kvf_dc_health_fill(srv, &h);
    kvf_role_reply_health(srv->serve, peer, &h);
}

/*
 * The proxy asks, at pool start and whenever a prefill restarts, whether
 * this instance can pull from a prefill engine: the same handshake a
 * request runs (cached afterwards), answered with its status and refusal.
 */
static void kvf_dc_check_peer(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
                              const Kvf__CheckPeerRequest *cr)
{
    const char *rid = (cr->request_id != NULL) ? cr->request_id : "";
    char err[512] = "";
    uint64_t cached;
    kvf_status_t status;

    if (kvf_decode_check_peer_check(cr, err, sizeof(err)) != KVF_OK) {
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_INVALID_PARAM, err);
        return;
    }
    if (cr->has_incarnation && (cr->incarnation != 0) &&
        (srv->xops->remote_incarnation(srv->conn, cr->engine_id, &cached) == KVF_OK) &&
        (cached != cr->incarnation)) {
        srv->xops->forget_engine(srv->conn, cr->engine_id);
    }
    status = srv->xops->handshake(srv->conn, cr->engine_id, cr->host, (int)cr->port, err,
                                  sizeof(err));
    if (status == KVF_ERR_REFUSED) {
        srv->refusals++;
        kvf_error("prefill engine %s at %s:%u cannot feed this instance: %s", cr->engine_id,
                  cr->host, cr->port, err);
    }
    if (status != KVF_OK) {
        if (err[0] == '\0') {
            snprintf(err, sizeof(err), "handshake with %s at %s:%u failed: %s", cr->engine_id,
                     cr->host, cr->port, kvf_status_str(status));
        }
        kvf_serve_server_reply_error(srv->serve, peer, rid, status, err);
        return;
    }
    kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_OK, NULL);
}

/* @return true when @a req was kept (queued); the caller frees it otherwise. */
static bool kvf_dc_handle(kvf_decode_server_h srv, const kvf_serve_peer_t *peer,
                          Kvf__ServeRequest *req)
{
    kvf_xfer_params_msg_t xp;
    char err[KVF_CONFIG_STR_MAX + 96];
    uint64_t arrival_ns = kvf_time_now_ns();
    bool kept;

    switch (req->body_case) {
    case KVF__SERVE_REQUEST__BODY_DECODE:
        if (srv->drain_start_ns != 0) {
            snprintf(err, sizeof(err), "decode instance %s is draining (stopping after"
                     " SIGTERM): it takes no new requests", srv->cfg.role.engine_id);
            kvf_serve_server_reply_error(srv->serve, peer, req->decode->request_id,
                                         KVF_ERR_BUSY, err);
            return false;
        }
        if (kvf_decode_request_check(req->decode, &xp, err, sizeof(err)) != KVF_OK) {
            kvf_serve_server_reply_error(srv->serve, peer, req->decode->request_id,
                                         KVF_ERR_INVALID_PARAM, err);
            return false;
        }
        /* behind others already waiting, or when the pool is full: wait in line */
        if ((srv->num_waiting == 0) &&
            (kvf_dc_decode(srv, peer, req->decode, arrival_ns, &xp) == KVF_DC_DONE)) {
            kvf_xfer_params_msg_cleanup(&xp);
            return false;
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
        kvf_dc_check_peer(srv, peer, req->check_peer);
        return false;
    default:
        kvf_serve_server_reply_error(srv->serve, peer, "", KVF_ERR_UNSUPPORTED,
                                     "a decode instance does not prefill");
        return false;
    }
}

static int kvf_dc_append(kvf_dc_req_t *q, int32_t token)
{
    if (q->num_tokens == q->cap_tokens) {
        int cap = q->cap_tokens ? 2 * q->cap_tokens : 64;
        int32_t *n = realloc(q->tokens, (size_t)cap * sizeof(*n));
        if (n == NULL) {
            return -1;
        }
        q->tokens = n;
        q->cap_tokens = cap;
    }
    q->tokens[q->num_tokens++] = token;
    return 0;
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
            if (q->stream) {
                kvf_dc_reply_tokens(srv, q, &ev[i].token, 1, false, NULL);
            } else if (kvf_dc_append(q, ev[i].token) != 0) {
                kvf_engine_abort(srv->engine, q->engine_req);
            }
        }
        if ((ev[i].kind == KVF_EVENT_FINISHED) && (ev[i].reason == KVF_FINISH_ERROR)) {
            char msg[256];
            snprintf(msg, sizeof(msg), "decode failed after %d generated tokens: the request"
                     " outgrew this instance's KV cache (%d blocks of %d tokens; raise"
                     " --num-blocks) or a forward step failed (see the decode log)",
                     q->generated + 1,
                     kvf_block_manager_num_blocks(kvf_engine_block_manager(srv->engine)),
                     kvf_block_manager_block_size(kvf_engine_block_manager(srv->engine)));
            kvf_serve_server_reply_error(srv->serve, &q->peer, q->request_id,
                                         KVF_ERR_NO_RESOURCE, msg);
            kvf_engine_release(srv->engine, q->engine_req);
            kvf_dc_remove(srv, k);
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

/*
 * Drain (*stop == KVF_ROLE_STOP_DRAIN): start it on the first call, then
 * @return true once no request is running or waiting (or the deadline
 * passed: those left get an error reply).
 */
static bool kvf_dc_drained(kvf_decode_server_h srv)
{
    uint64_t now = kvf_time_now_ns();
    uint64_t limit_ns = (uint64_t)srv->cfg.role.drain_timeout_ms * 1000000ull;
    char msg[KVF_CONFIG_STR_MAX + 128];

    if (srv->drain_start_ns == 0) {
        srv->drain_start_ns = now;
        kvf_dc_publish_health(srv);   /* the proxy stops routing here at its next probe */
        kvf_notice("draining (SIGTERM): no new requests; %d running and %d waiting are served"
                   " until done, at most --drain-timeout %lld ms", srv->num_reqs,
                   srv->num_waiting, (long long)srv->cfg.role.drain_timeout_ms);
    }
    if ((srv->num_reqs == 0) && (srv->num_waiting == 0)) {
        if (srv->drained_ns == 0) {
            srv->drained_ns = now;
            kvf_notice("drained in %llu ms: every request finished; exiting",
                       (unsigned long long)((now - srv->drain_start_ns) / 1000000ull));
        }
        /* the last replies flush (KVF_ROLE_DRAIN_FLUSH_MS) */
        return now - srv->drained_ns >= (uint64_t)KVF_ROLE_DRAIN_FLUSH_MS * 1000000ull;
    }
    if (now - srv->drain_start_ns < limit_ns) {
        return false;
    }
    kvf_warn("--drain-timeout %lld ms reached with %d request(s) running and %d waiting;"
             " ending them with an error and exiting", (long long)srv->cfg.role.drain_timeout_ms,
             srv->num_reqs, srv->num_waiting);
    snprintf(msg, sizeof(msg), "decode instance %s stopped (SIGTERM, --drain-timeout %lld ms)"
             " before the request finished", srv->cfg.role.engine_id,
             (long long)srv->cfg.role.drain_timeout_ms);
    while (srv->num_reqs > 0) {
        kvf_dc_req_t *q = &srv->reqs[0];
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
    return true;
}

kvf_status_t kvf_decode_server_run(kvf_decode_server_h srv, volatile sig_atomic_t *stop)
{
    kvf_serve_server_watch_stop(srv->serve, stop);
    while (*stop < KVF_ROLE_STOP_NOW) {
        if ((*stop == KVF_ROLE_STOP_DRAIN) && kvf_dc_drained(srv)) {
            break;
        }
        bool busy = kvf_engine_has_work(srv->engine);
        kvf_serve_peer_t peer;
        Kvf__ServeRequest *req = NULL;
        kvf_status_t status;

        for (int i = 0; i < 64; ++i) {
            status = kvf_serve_server_recv(srv->serve, (busy || i > 0) ? 0 : 10, &peer, &req);
            if (status == KVF_OK) {
                if (!kvf_dc_handle(srv, &peer, req)) {
                    kvf__serve_request__free_unpacked(req, NULL);
                }
                continue;
            }
            if (status == KVF_ERR_ZMQ) {
                return status;
            }
            break;
        }
        kvf_dc_admit_waiting(srv);
        kvf_dc_publish_health(srv);
        if (kvf_engine_has_work(srv->engine)) {
            kvf_serve_server_step_begin(srv->serve);
            status = kvf_dc_step(srv);
            kvf_serve_server_step_end(srv->serve);
            if (status != KVF_OK) {
                kvf_error("engine step failed: %s", kvf_status_str(status));
            }
        }
    }
    return KVF_OK;
}
