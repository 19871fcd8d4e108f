/*
 * kvf-prefill: request handling around the engine.
 *
 * Design: one leader loop multiplexes four sources with short waits so none
 * starves: control requests (ZeroMQ), engine steps (continuous batching, so
 * concurrent prompts share forward passes), release notifications from
 * decode (UCX active messages, per rank), and lease expiry. A prompt's
 * reply is sent when its PREFILLED event arrives; from then on its blocks
 * are leased. Rejected alternative: the blocking kvf_engine_prefill() per
 * request, which would serialise prompts and stall releases during long
 * prefills.
 *
 * Leases (docs/ARCHITECTURE.md §9, prefill/kvf_lease.h): decode claims a lease before
 * its GETs and releases it once per decode rank after them, over the side
 * channel; the side-channel thread answers from the lease table (valid,
 * expired or refused) without waiting for this loop, so a long engine step
 * never delays an answer. This loop frees what the table hands back:
 * fully released leases at once, expired and aborted ones after their
 * quarantine (the largest transfer timeout any decode announced, at least
 * our own, at most --max-quarantine), because a GET may still be reading
 * them.
 *
 * Drain (first SIGTERM, daemon/kvf_drain.h): new prompts are refused (KVF_ERR_BUSY, health says
 * draining, so the proxy routes elsewhere); prompts already admitted are
 * prefilled and leased; the loop keeps serving claims, releases and GETs
 * until no prompt is pending and no lease is held (released or expired),
 * then returns. Leases handed out or extended while draining end by the
 * drain deadline (--drain-timeout after the signal), which bounds the drain.
 */
#include "kvf_health_pub.h"
#include "kvf_prefill_server.h"
#include "kvf_lease.h"
#include "kvf_prefill_check.h"

#include "kvf_drain.h"
#include "kvf_engine.h"
#include "kvf_sampling_msg.h"
#include "kvf_fault.h"
#include "kvf_log.h"
#include "kvf_random.h"
#include "kvf_array.h"
#include "kvf_time.h"
#include "kvf_role.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KVF_PF_MAX_EVENTS 512

const kvf_config_field_t kvf_prefill_config_table[] = {
    KVF_ROLE_CONFIG_FIELDS(kvf_prefill_config_t, "tcp://127.0.0.1:5557", "prefill-0"),
    {"HOST", "127.0.0.1", "address of this host for the side channel (bind and advertise)",
     offsetof(kvf_prefill_config_t, host), KVF_CONFIG_TYPE_STRING, 0},
    {"SIDE_PORT", "0", "side-channel (handshake) port; 0 picks a free one",
     offsetof(kvf_prefill_config_t, side_port), KVF_CONFIG_TYPE_INT, 0},
    {"LEASE_TIMEOUT", "30s", "how long a finished prompt's blocks wait for decode",
     offsetof(kvf_prefill_config_t, lease_timeout_ms), KVF_CONFIG_TYPE_TIME, 0},
    {"MAX_QUARANTINE", "20s", "longest quarantine of an expired or aborted lease's blocks: a"
     " decode's announced transfer timeout raises the quarantine up to this bound, not past"
     " it", offsetof(kvf_prefill_config_t, max_quarantine_ms), KVF_CONFIG_TYPE_TIME, 0},
    {"MAX_QUEUE", "256", "prompts admitted and not yet prefilled; more are refused (busy)",
     offsetof(kvf_prefill_config_t, max_queue), KVF_CONFIG_TYPE_INT, 0},
    {"TEST_NO_RELEASE", "no", "test only: answer releases valid but keep the blocks",
     offsetof(kvf_prefill_config_t, test_no_release), KVF_CONFIG_TYPE_BOOL,
     KVF_CONFIG_FLAG_HIDDEN},
    {NULL, NULL, NULL, 0, 0, 0},
};

/* A prompt being prefilled: who to answer. */
typedef struct {
    uint64_t         engine_req;
    char             request_id[KVF_LEASE_ID_MAX];
    kvf_serve_peer_t peer;
    uint64_t         start_ns;          /* received (and admitted) */
    uint64_t         compute_ns;        /* the first engine step that computed its tokens */
    bool             want_logprobs;     /* SamplingParams.logprobs present */
    int              logprobs;          /* top logprobs to send with the first token */
} kvf_pf_pending_t;

struct kvf_prefill_server {
    kvf_prefill_config_t       cfg;
    kvf_engine_h               engine;
    const kvf_connector_ops_t *xops;
    kvf_connector_h            conn;
    int                        side_port;
    kvf_serve_server_h         serve;
    kvf_lease_table_h          leases;
    kvf_pf_pending_t          *pending;
    int                        num_pending;
    int                        cap_pending;
    _Atomic uint64_t           quarantine_ms;      /* written by the side-channel thread */
    uint64_t                   clamped_ms;         /* side channel: largest peer timeout clamped */
    kvf_drain_t                drain;
    _Atomic uint64_t           drain_deadline_ms;  /* 0 until SIGTERM; read by the side channel */
    uint64_t                   broken_ms;          /* TP world broke then (kvf_role_broken_exit) */
};

/* A lease handed out or extended at @a now_ms lasts this long (ms): the
 * lease time, cut to the drain deadline once draining. */
static uint64_t kvf_pf_lease_ttl(kvf_prefill_server_h srv, uint64_t now)
{
    uint64_t ttl = (uint64_t)srv->cfg.lease_timeout_ms;
    uint64_t deadline = atomic_load(&srv->drain_deadline_ms);

    if (deadline != 0) {
        uint64_t left = (deadline > now) ? deadline - now : 0;
        ttl = (left < ttl) ? left : ttl;
    }
    return ttl;
}

/*
 * Side-channel thread: the quarantine follows the largest transfer timeout
 * a decode announced (a read may run that long), at least our own, and
 * never past --max-quarantine: a peer cannot pin our blocks longer than the
 * operator allows (said once per larger value).
 */
static void kvf_pf_quarantine(kvf_prefill_server_h srv, const char *requester,
                              uint32_t peer_timeout_ms)
{
    uint64_t bound = (uint64_t)srv->cfg.max_quarantine_ms;
    uint64_t q = atomic_load(&srv->quarantine_ms);
    uint64_t want = peer_timeout_ms;

    if (want > bound) {
        if (want > srv->clamped_ms) {
            srv->clamped_ms = want;
            kvf_warn("decode %s announces a transfer timeout of %llu ms: quarantine clamped to"
                     " --max-quarantine %llu ms", requester, (unsigned long long)want,
                     (unsigned long long)bound);
        }
        want = bound;
    }
    if (want > q) {   /* only this thread writes it */
        atomic_store(&srv->quarantine_ms, want);
        kvf_lease_table_set_quarantine(srv->leases, want);
    }
}

/* Side-channel thread: one lease operation from decode @a requester (the authenticated peer). */
static void kvf_pf_lease_op(void *arg, const char *requester, const kvf_lease_msg_t *msg,
                            uint32_t peer_timeout_ms, kvf_lease_answer_t *answer)
{
    kvf_prefill_server_h srv = arg;
    uint64_t now = kvf_time_now_ms();

    kvf_pf_quarantine(srv, requester, peer_timeout_ms);
    if (msg->op == KVF_LEASE_OP_RELEASE) {
        (void)KVF_FAULT(LEASE_RELEASE);   /* tests: die, stop or stall on a release */
    }
    if ((msg->op == KVF_LEASE_OP_RELEASE) && srv->cfg.test_no_release) {
        memset(answer, 0, sizeof(*answer));
        answer->verdict = KVF_LEASE_VALID;
    } else {
        kvf_lease_table_answer(srv->leases, requester, msg, now, kvf_pf_lease_ttl(srv, now),
                               answer);
    }
    if (answer->verdict != KVF_LEASE_VALID) {
        kvf_warn("lease %s of request %s from decode %s: %s: %s",
                 (msg->op == KVF_LEASE_OP_CLAIM) ? "claim" : "release", msg->request_id,
                 requester, (answer->verdict == KVF_LEASE_EXPIRED) ? "expired" : "refused",
                 answer->why);
    }
}

static kvf_status_t kvf_pf_setup(kvf_prefill_server_h srv)
{
    kvf_status_t status = kvf_role_start(&srv->cfg.role, KVF_CONNECTOR_ROLE_PREFILL,
                                         srv->cfg.host, srv->cfg.side_port, &srv->engine,
                                         &srv->xops, &srv->conn);
    if (status != KVF_OK) {
        return status;
    }
    kvf_drain_init(&srv->drain, (uint64_t)srv->cfg.role.drain_timeout_ms);
    atomic_store(&srv->quarantine_ms, (uint64_t)srv->cfg.role.xfer_timeout_ms);
    kvf_lease_table_set_quarantine(srv->leases, (uint64_t)srv->cfg.role.xfer_timeout_ms);
    status = srv->xops->set_lease_handler(srv->conn, kvf_pf_lease_op, srv);
    if (status != KVF_OK) {
        return status;
    }
    return srv->xops->serve(srv->conn, &srv->side_port);
}

kvf_status_t kvf_prefill_server_create(const kvf_prefill_config_t *cfg,
                                       kvf_prefill_server_h *srv_p)
{
    struct kvf_prefill_server *srv;
    kvf_status_t status;

    if (kvf_role_check_flags(&cfg->role) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (cfg->lease_timeout_ms <= 0) {
        kvf_error("--lease-timeout must be positive");
        return KVF_ERR_INVALID_PARAM;
    }
    if ((kvf_role_check_not_shorter("--lease-timeout", cfg->lease_timeout_ms, "--xfer-timeout",
                                    cfg->role.xfer_timeout_ms,
                                    "a lease would expire during a transfer") != KVF_OK) ||
        (kvf_role_check_not_shorter("--max-quarantine", cfg->max_quarantine_ms,
                                    "--xfer-timeout", cfg->role.xfer_timeout_ms,
                                    "a read still in flight could land in reused blocks") !=
         KVF_OK)) {
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
    status = kvf_lease_table_create(&srv->leases);
    if (status != KVF_OK) {
        goto err;
    }
    status = kvf_pf_setup(srv);
    if (status != KVF_OK) {
        goto err;
    }
    status = kvf_serve_server_create(cfg->role.listen, &srv->serve);
    if (status != KVF_OK) {
        goto err;
    }
    /* the one ready line, whatever the log level */
    kvf_log_emit(__FILE__, __LINE__, __func__, KVF_LOG_INFO, KVF_SUB_ALL,
                 "ready: prefill %s, tp %d, block size %d, %d blocks per rank, control %s, side"
                 " channel %s:%d, device %s", cfg->role.engine_id, cfg->role.tp,
                 kvf_block_manager_block_size(kvf_engine_block_manager(srv->engine)),
                 cfg->role.num_blocks, cfg->role.listen, cfg->host, srv->side_port,
                 kvf_role_device_names_get());
    *srv_p = srv;
    return KVF_OK;

err:
    kvf_prefill_server_destroy(srv);
    return status;
}

void kvf_prefill_server_destroy(kvf_prefill_server_h srv)
{
    if (srv == NULL) {
        return;
    }
    kvf_serve_server_destroy(srv->serve);
    if (srv->conn != NULL) {
        srv->xops->destroy(srv->conn);
    }
    kvf_engine_destroy(srv->engine);   /* frees every block, leased or not */
    kvf_role_events_stop();            /* after the engine: its AllBlocksCleared goes out */
    kvf_lease_table_destroy(srv->leases);
    free(srv->pending);
    free(srv);
}

/* ---- requests ---------------------------------------------------------- */

static int kvf_pf_find_pending(kvf_prefill_server_h srv, uint64_t engine_req)
{
    for (int i = 0; i < srv->num_pending; ++i) {
        if (srv->pending[i].engine_req == engine_req) {
            return i;
        }
    }
    return -1;
}

/* kvf_health_fill_fn of the prefill server */
static void kvf_pf_health_fill(void *arg, Kvf__HealthReply *h)
{
    kvf_prefill_server_h srv = arg;
    kvf_lease_stats_t ls;
    kvf_health_loop_t loop = {
        .running = (uint32_t)(srv->num_pending + (int)kvf_lease_table_pinned(srv->leases)),
        .queue_depth = (uint32_t)srv->num_pending,
        .max_queue = (uint32_t)srv->cfg.max_queue,
        .incarnation = srv->xops->incarnation(srv->conn),
        .draining = kvf_drain_active(&srv->drain),
    };

    kvf_role_health_fill(srv->engine, "prefill", &srv->cfg.role, h);
    kvf_health_fill_loop(h, &loop);
    kvf_lease_table_stats(srv->leases, &ls);
    h->has_releases_refused = h->has_expired_reads_prevented = h->has_quarantined_blocks = 1;
    h->releases_refused = ls.refused;
    h->expired_reads_prevented = ls.expired_answers;
    h->quarantined_blocks = ls.quarantined_blocks;
    h->has_quarantine_cut_blocks = 1;
    h->quarantine_cut_blocks = ls.quarantine_cut_blocks;
    h->has_leases = h->has_lease_timeout_ms = 1;
    h->leases = kvf_lease_table_count(srv->leases);
    h->lease_timeout_ms = (uint64_t)srv->cfg.lease_timeout_ms;
    h->side_host = srv->cfg.host;
    h->has_side_port = 1;
    h->side_port = (uint32_t)srv->side_port;
    {
        kvf_engine_stats_t st;
        uint64_t queued = 0;

        for (int i = 0; i < srv->num_pending; ++i) {
            kvf_req_info_t info;
            if ((kvf_engine_request_info(srv->engine, srv->pending[i].engine_req, &info) ==
                 KVF_OK) && (info.prompt_len > info.num_computed)) {
                queued += (uint64_t)(info.prompt_len - info.num_computed);
            }
        }
        kvf_engine_get_stats(srv->engine, &st);
        h->has_queued_prompt_tokens = h->has_prefill_tokens_total = 1;
        h->has_prefill_seconds_total = 1;
        h->queued_prompt_tokens = queued;
        h->prefill_tokens_total = st.prefill_tokens;
        h->prefill_seconds_total = st.prefill_seconds;
    }
}

/* Health probes are answered by the control channel's thread from this. */
static void kvf_pf_publish_health(kvf_prefill_server_h srv)
{
    kvf_health_publish(srv->serve, kvf_pf_health_fill, srv);
}

static void kvf_pf_prefill(kvf_prefill_server_h srv, const kvf_serve_peer_t *peer,
                           const Kvf__PrefillRequest *req)
{
    const char *rid = (req->request_id != NULL) ? req->request_id : "";
    kvf_req_params_t rp;
    uint64_t id;
    kvf_status_t status;
    char err[128];

    if (kvf_prefill_request_check(req, err, sizeof(err)) != KVF_OK) {
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_INVALID_PARAM, err);
        return;
    }
    if ((req->n_prompt_tokens > (size_t)kvf_role_max_prompt_tokens(srv->engine))) {
        snprintf(err, sizeof(err), "prompt of %zu tokens is longer than the %d this prefill"
                 " instance holds", req->n_prompt_tokens,
                 kvf_role_max_prompt_tokens(srv->engine));
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_OUT_OF_RANGE, err);
        return;
    }
    if (kvf_role_cannot_serve(srv->engine) != NULL) {
        char msg[KVF_CONFIG_STR_MAX + 320];
        snprintf(msg, sizeof(msg), "prefill instance %s cannot serve: %s",
                 srv->cfg.role.engine_id, kvf_role_cannot_serve(srv->engine));
        kvf_warn("prompt %s refused: this instance cannot serve (broken TP world)", rid);
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_BUSY, msg);
        return;
    }
    if (kvf_drain_active(&srv->drain)) {
        char msg[KVF_CONFIG_STR_MAX + 96];
        snprintf(msg, sizeof(msg), "prefill instance %s is draining (stopping after SIGTERM):"
                 " it takes no new prompts", srv->cfg.role.engine_id);
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_BUSY, msg);
        return;
    }
    if (srv->num_pending >= srv->cfg.max_queue) {
        char msg[KVF_CONFIG_STR_MAX + 128];
        snprintf(msg, sizeof(msg), "prefill instance %s's queue is full: %d prompts wait to be"
                 " prefilled (--max-queue %d)", srv->cfg.role.engine_id, srv->num_pending,
                 srv->cfg.max_queue);
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_BUSY, msg);
        return;
    }
    memset(&rp, 0, sizeof(rp));
    rp.prompt = req->prompt_tokens;
    rp.prompt_len = (int)req->n_prompt_tokens;
    rp.prefill_only = true;
    if (req->has_cache_salt) {   /* length checked with the request (kvf_prefill_check.c) */
        rp.cache_salt = req->cache_salt.data;
        rp.cache_salt_len = req->cache_salt.len;
    }
    {
        char msg[256];
        /* the whole request's max_tokens for the checks (min_tokens), then this one token */
        status = kvf_sampling_from_msg(req->sampling, 1,
                                       kvf_engine_model_config(srv->engine)->vocab_size,
                                       &rp.sampling, msg, sizeof(msg));
        if (status != KVF_OK) {
            char full[320];
            snprintf(full, sizeof(full), "sampling parameters: %s", msg);
            kvf_serve_server_reply_error(srv->serve, peer, rid, status, full);
            return;
        }
        rp.sampling.max_tokens = 1;
    }
    status = kvf_engine_add_request(srv->engine, &rp, &id);
    if (status != KVF_OK) {
        kvf_serve_server_reply_error(srv->serve, peer, rid, status,
                                     "prompt rejected (token outside the vocabulary?)");
        return;
    }
    if (KVF_ARRAY_GROW(srv->pending, srv->cap_pending, srv->num_pending + 1, 64) != KVF_OK) {
        kvf_engine_release(srv->engine, id);
        kvf_serve_server_reply_error(srv->serve, peer, rid, KVF_ERR_NO_MEMORY, "out of memory");
        return;
    }
    kvf_pf_pending_t *p = &srv->pending[srv->num_pending++];
    p->engine_req = id;
    snprintf(p->request_id, sizeof(p->request_id), "%s", rid);
    p->peer = *peer;
    p->start_ns = kvf_time_now_ns();
    p->compute_ns = 0;
    p->want_logprobs = rp.sampling.want_logprobs;
    p->logprobs = rp.sampling.logprobs;
}

/* Blocks of a prefilled request -> TransferParams, lease it, answer. */
static void kvf_pf_prefilled(kvf_prefill_server_h srv, kvf_pf_pending_t *p,
                             const kvf_engine_event_t *ev)
{
    int32_t first = ev->token;
    kvf_logprob_buf_t lp = {0};
    Kvf__ServeReply reply = KVF__SERVE_REPLY__INIT;
    Kvf__TransferParams tp = KVF__TRANSFER_PARAMS__INIT;
    Kvf__ServeTiming timing = KVF__SERVE_TIMING__INIT;
    Kvf__BlockIdList lists[KVF_MAX_KV_GROUPS];
    Kvf__BlockIdList *plists[KVF_MAX_KV_GROUPS];
    kvf_req_info_t info;
    uint64_t nonce = 0;
    uint64_t ttl = kvf_pf_lease_ttl(srv, kvf_time_now_ms());
    kvf_status_t status;

    /* random, non-zero: what a decode must echo to claim or release the lease */
    status = kvf_random_nonzero_u64("lease nonce", &nonce);
    if (status == KVF_OK) {
        status = kvf_engine_request_info(srv->engine, p->engine_req, &info);
    }
    if (status == KVF_OK) {
        int nblocks = 0;
        for (int g = 0; g < info.blocks->num_groups; ++g) {
            nblocks += info.blocks->num_blocks[g];
        }
        status = kvf_lease_table_add(srv->leases, p->request_id, nonce, kvf_time_now_ms(),
                                     ttl, nblocks,
                                     (void *)(uintptr_t)(p->engine_req + 1));
    }
    if (status == KVF_OK) {
        /* the nonce binds the block lists: a claim for other blocks is refused */
        status = kvf_lease_table_bind_ids(srv->leases, p->request_id,
                                          kvf_xfer_ids_digest(info.blocks->blocks,
                                                              info.blocks->num_blocks,
                                                              info.blocks->num_groups));
    }
    if (status != KVF_OK) {
        kvf_engine_release(srv->engine, p->engine_req);
        kvf_serve_server_reply_error(srv->serve, &p->peer, p->request_id, status,
                                     "cannot lease the request's blocks (duplicate id, or no "
                                     "lease nonce: see prefill's log)");
        return;
    }
    for (int g = 0; g < info.blocks->num_groups; ++g) {
        kvf__block_id_list__init(&lists[g]);
        lists[g].n_ids = (size_t)info.blocks->num_blocks[g];
        lists[g].ids = info.blocks->blocks[g];
        plists[g] = &lists[g];
    }
    tp.engine_id = srv->cfg.role.engine_id;
    tp.host = srv->cfg.host;
    tp.has_port = tp.has_num_tokens = tp.has_lease_ms_left = tp.has_first_token = 1;
    tp.has_nonce = 1;
    tp.nonce = nonce;
    tp.port = (uint32_t)srv->side_port;
    tp.n_groups = (size_t)info.blocks->num_groups;
    tp.groups = plists;
    tp.num_tokens = (uint64_t)info.prompt_len;
    tp.lease_ms_left = ttl;
    tp.first_token = first;
    tp.request_id = p->request_id;
    tp.has_incarnation = 1;
    tp.incarnation = srv->xops->incarnation(srv->conn);
    tp.has_prefix_source = 1;   /* decode's prefix cache keeps this KV under it */
    tp.prefix_source = kvf_engine_numerics_class(srv->engine);
    reply.request_id = p->request_id;
    reply.has_status = 1;
    reply.status = KVF_OK;
    reply.params = &tp;
    reply.has_prefill_ms = 1;
    reply.prefill_ms = (double)(kvf_time_now_ns() - p->start_ns) / 1e6;
    reply.n_tokens = 1;
    reply.tokens = &first;
    reply.has_done = 1;
    reply.done = 1;
    {
        uint64_t now = kvf_time_now_ns();
        uint64_t c = (p->compute_ns > 0) ? p->compute_ns : p->start_ns;
        timing.has_total_ms = timing.has_queue_ms = timing.has_compute_ms = 1;
        timing.total_ms = (double)(now - p->start_ns) / 1e6;
        timing.queue_ms = (double)(c - p->start_ns) / 1e6;
        timing.compute_ms = (double)(now - c) / 1e6;
        timing.has_cached_tokens = 1;
        timing.cached_tokens = (uint32_t)kvf_engine_request_prefix_hit(srv->engine,
                                                                       p->engine_req);
        reply.timing = &timing;
    }
    if (info.prompt_logprobs->n > 0) {   /* sampling.want_prompt_logprobs */
        const kvf_prompt_logprobs_t *pl = info.prompt_logprobs;
        reply.n_prompt_token_logprobs = reply.n_prompt_ranks = (size_t)pl->n;
        reply.prompt_token_logprobs = pl->logprob;
        reply.prompt_ranks = (int32_t *)pl->rank;
        reply.has_prompt_top_per_token = 1;
        reply.prompt_top_per_token = (uint32_t)pl->per;
        reply.n_prompt_top_ids = reply.n_prompt_top_logprobs = (size_t)pl->n * (size_t)pl->per;
        reply.prompt_top_ids = (int32_t *)pl->top_ids;
        reply.prompt_top_logprobs = pl->top_logprobs;
    }
    if (p->want_logprobs && (kvf_logprob_buf_push(&lp, p->logprobs, ev) == KVF_OK)) {
        kvf_logprob_buf_attach(&lp, &reply);
    }
    kvf_serve_server_reply(srv->serve, &p->peer, &reply);
    kvf_logprob_buf_free(&lp);
    kvf_log(KVF_LOG_DEBUG, KVF_SUB_SCHED, "request %s prefilled: %d tokens, first token %d,"
            " leased", p->request_id, info.prompt_len, first);
}

static void kvf_pf_remove_pending(kvf_prefill_server_h srv, int i)
{
    srv->pending[i] = srv->pending[--srv->num_pending];
}

static void kvf_pf_abort(kvf_prefill_server_h srv, const Kvf__AbortRequest *req)
{
    const char *rid = (req->request_id != NULL) ? req->request_id : "";

    /* leased: a decode may be mid-pull (it handles its own abort only after the
     * pull), so the blocks wait out the quarantine instead of being freed at
     * once, and its release will be answered "expired" (§9) */
    if (kvf_lease_table_abort(srv->leases, rid, kvf_time_now_ms())) {
        kvf_log(KVF_LOG_INFO, KVF_SUB_SCHED, "request %s aborted while leased: its blocks wait"
                " in quarantine unless its decode says it stopped reading", rid);
        return;
    }
    for (int i = 0; i < srv->num_pending; ++i) {
        if (strcmp(srv->pending[i].request_id, rid) == 0) {
            kvf_engine_release(srv->engine, srv->pending[i].engine_req);
            kvf_serve_server_reply_error(srv->serve, &srv->pending[i].peer, rid,
                                         KVF_ERR_CANCELED, "aborted");
            kvf_pf_remove_pending(srv, i);
            return;
        }
    }
}

static void kvf_pf_handle(kvf_prefill_server_h srv, const kvf_serve_peer_t *peer,
                          const Kvf__ServeRequest *req)
{
    switch (req->body_case) {
    case KVF__SERVE_REQUEST__BODY_PREFILL:
        kvf_pf_prefill(srv, peer, req->prefill);
        break;
    case KVF__SERVE_REQUEST__BODY_ABORT:
        kvf_pf_abort(srv, req->abort);
        break;
    case KVF__SERVE_REQUEST__BODY_HEALTH:
        kvf_health_answer(srv->serve, peer, kvf_pf_health_fill, srv);
        break;
    default:
        kvf_serve_server_reply_error(srv->serve, peer, "", KVF_ERR_UNSUPPORTED,
                                     "a prefill instance does not decode");
        break;
    }
}

static kvf_status_t kvf_pf_step(kvf_prefill_server_h srv)
{
    kvf_engine_event_t ev[KVF_PF_MAX_EVENTS];
    int n = 0;
    uint64_t t_step = kvf_time_now_ns();
    kvf_status_t status = kvf_engine_step(srv->engine, ev, KVF_PF_MAX_EVENTS, &n);

    /* Queue time ends at the first step that computed some of a request's
     * tokens (ServeTiming.queue_ms); the rest of its wait is compute. */
    for (int k = 0; k < srv->num_pending; ++k) {
        kvf_req_info_t info;
        if ((srv->pending[k].compute_ns == 0) &&
            (kvf_engine_request_info(srv->engine, srv->pending[k].engine_req, &info) == KVF_OK) &&
            (info.num_computed > 0)) {
            srv->pending[k].compute_ns = t_step;
        }
    }
    for (int i = 0; i < n; ++i) {
        int k = kvf_pf_find_pending(srv, ev[i].id);
        if (k < 0) {
            continue;
        }
        if (ev[i].kind == KVF_EVENT_PREFILLED) {
            if (srv->pending[k].compute_ns == 0) {
                srv->pending[k].compute_ns = t_step;
            }
            kvf_pf_prefilled(srv, &srv->pending[k], &ev[i]);
            kvf_pf_remove_pending(srv, k);
        } else if (ev[i].kind == KVF_EVENT_FINISHED) {
            const char *broken = kvf_role_cannot_serve(srv->engine);
            kvf_serve_server_reply_error(srv->serve, &srv->pending[k].peer,
                                         srv->pending[k].request_id, (broken != NULL) ?
                                         KVF_ERR_TIMED_OUT : KVF_ERR_NO_RESOURCE,
                                         (broken != NULL) ? broken :
                                         "prefill failed (the pool cannot hold the prompt?)");
            kvf_engine_release(srv->engine, ev[i].id);
            kvf_pf_remove_pending(srv, k);
        }
    }
    return status;
}

/* Free what the lease table hands back: released leases, and quarantines that ended. */
static void kvf_pf_collect(kvf_prefill_server_h srv)
{
    void *owners[64];
    size_t n, expired;

    do {
        n = kvf_lease_table_collect(srv->leases, kvf_time_now_ms(), owners, 64, &expired);
        for (size_t i = 0; i < n; ++i) {
            kvf_engine_release(srv->engine, (uint64_t)(uintptr_t)owners[i] - 1);
        }
        if (expired > 0) {
            kvf_warn("%zu lease(s) expired without every release from decode; blocks"
                     " quarantined for %" PRIu64 " ms, then freed", expired,
                     (uint64_t)atomic_load(&srv->quarantine_ms));
        }
    } while (n == 64);
}

/*
 * Idle: sleep until a control request or 10 ms (lease expiry and the blocks
 * of released leases are checked after every wait). Transfers need nothing
 * from this thread: the connector's progress threads serve the GETs and the
 * side-channel thread answers the lease operations.
 */
static void kvf_pf_idle_wait(kvf_prefill_server_h srv)
{
    (void)kvf_serve_server_wait(srv->serve, 10, NULL, 0);
}

/* ---- drain (daemon/kvf_drain.h) -------------------------------------------- */

static void kvf_pf_drain_begin(void *arg, uint64_t deadline_ms)
{
    kvf_prefill_server_h srv = arg;

    /* leases handed out or extended from now on end by the drain deadline */
    atomic_store(&srv->drain_deadline_ms, deadline_ms);
    kvf_pf_publish_health(srv);   /* the proxy stops routing here at its next probe */
    kvf_notice("draining (SIGTERM): no new prompts; %d prompt(s) in prefill and %zu lease(s)"
               " held are served until done, at most --drain-timeout %lld ms",
               srv->num_pending, kvf_lease_table_count(srv->leases),
               (long long)srv->cfg.role.drain_timeout_ms);
}

static bool kvf_pf_drain_idle(void *arg)
{
    kvf_prefill_server_h srv = arg;

    return (srv->num_pending == 0) && (kvf_lease_table_count(srv->leases) == 0);
}

static void kvf_pf_drain_give_up(void *arg)
{
    kvf_prefill_server_h srv = arg;

    kvf_warn("%d prompt(s) in prefill and %zu lease(s) held at the drain deadline",
             srv->num_pending, kvf_lease_table_count(srv->leases));
    while (srv->num_pending > 0) {
        kvf_pf_pending_t *p = &srv->pending[0];
        kvf_engine_release(srv->engine, p->engine_req);
        kvf_serve_server_reply_error(srv->serve, &p->peer, p->request_id, KVF_ERR_CANCELED,
                                     "prefill instance stopped (SIGTERM, --drain-timeout)"
                                     " before the prompt was prefilled");
        kvf_pf_remove_pending(srv, 0);
    }
}

static const kvf_drain_ops_t kvf_pf_drain_ops = {
    .begin = kvf_pf_drain_begin,
    .idle = kvf_pf_drain_idle,
    .give_up = kvf_pf_drain_give_up,
};

kvf_status_t kvf_prefill_server_run(kvf_prefill_server_h srv, volatile sig_atomic_t *stop)
{
    kvf_serve_server_watch_stop(srv->serve, stop);
    while (*stop < KVF_ROLE_STOP_NOW) {
        if ((*stop == KVF_ROLE_STOP_DRAIN) &&
            kvf_drain_step(&srv->drain, &kvf_pf_drain_ops, srv)) {
            break;
        }
        bool busy = kvf_engine_has_work(srv->engine);

        if (!busy) {
            kvf_pf_idle_wait(srv);
        }
        kvf_serve_peer_t peer;
        Kvf__ServeRequest *req = NULL;
        kvf_status_t status;

        /* drain the control socket without waiting while the engine has work */
        for (int i = 0; i < 64; ++i) {
            status = kvf_serve_server_recv(srv->serve, 0, &peer, &req);
            if (status == KVF_OK) {
                kvf_pf_handle(srv, &peer, req);
                kvf__serve_request__free_unpacked(req, NULL);
                continue;
            }
            if (status == KVF_ERR_ZMQ) {
                return status;
            }
            break;
        }
        kvf_pf_publish_health(srv);
        if (kvf_engine_has_work(srv->engine)) {
            kvf_serve_server_step_begin(srv->serve);
            status = kvf_pf_step(srv);
            kvf_serve_server_step_end(srv->serve);
            if (status != KVF_OK) {
                kvf_error("engine step failed: %s", kvf_status_str(status));
            }
        }
        kvf_pf_collect(srv);
        if (kvf_role_broken_exit(srv->engine, &srv->broken_ms)) {
            return KVF_ERR_TIMED_OUT;   /* exit 1: a supervisor restarts it */
        }
    }
    return KVF_OK;
}
