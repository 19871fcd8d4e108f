/*
 * kvf-decode's pull state machine (kvf_decode_pull.h).
 *
 * Design: each state either starts a side-channel operation (a ticket) or
 * polls one; the GETs are started on every rank at once and polled. A
 * phase that does not end within the transfer timeout fails the pull (the
 * side channel bounds its own operations the same way; the GETs are bounded
 * by the connector). Failure after the claim always goes the same way
 * (kvf_dc_pull_fail): finish_pull on every rank that started (force-closes
 * reads still in flight, so the local blocks may be reused), then one
 * abandoning release, sent and not waited for.
 * Rejected: pulling on rank threads concurrently with engine steps (the
 * engine hands out pools only between steps; the GETs here are posted and
 * polled between steps, into blocks no running request uses).
 */
#include "kvf_decode_pull.h"

#include "kvf_log.h"
#include "kvf_xfer_plan.h"
#include "kvf_time.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t kvf_dc_pull_phase_ns(const kvf_dc_pull_ctx_t *ctx)
{
    return (uint64_t)ctx->xfer_timeout_ms * 1000000ull;
}

void kvf_dc_pull_begin(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull,
                       const kvf_xfer_params_msg_t *xp, const kvf_req_blocks_t *blocks,
                       const char *request_id)
{
    memset(pull, 0, sizeof(*pull));
    pull->state = KVF_DC_PULL_HANDSHAKE;
    pull->xp = xp;
    pull->blocks = blocks;
    pull->peer.engine_id = xp->engine_id;
    pull->peer.host = xp->host;
    pull->peer.port = xp->port;
    pull->peer.incarnation = xp->incarnation;
    snprintf(pull->request_id, sizeof(pull->request_id), "%s", request_id);
    pull->start_ns = kvf_time_now_ns();
    pull->phase_deadline_ns = pull->start_ns + kvf_dc_pull_phase_ns(ctx);
}

bool kvf_dc_pull_on_wire(const kvf_dc_pull_t *pull)
{
    return (pull->state == KVF_DC_PULL_GETS) || (pull->state == KVF_DC_PULL_DIGEST);
}

/* A lease operation on the pull's lease; @a all_ranks releases for every decode rank. */
static void kvf_dc_pull_msg(const kvf_dc_pull_ctx_t *ctx, const kvf_xfer_params_msg_t *xp,
                            const char *request_id, kvf_lease_op_t op, kvf_status_t status,
                            kvf_lease_msg_t *m)
{
    memset(m, 0, sizeof(*m));
    m->op = op;
    snprintf(m->request_id, sizeof(m->request_id), "%s", request_id);
    m->nonce = xp->nonce;
    m->decode_rank = 0;
    m->decode_tp = ctx->tp;
    m->status = status;
    m->all_ranks = (op == KVF_LEASE_OP_RELEASE);
    m->has_ids_digest = true;
    m->ids_digest = kvf_xfer_ids_digest(xp->ids, xp->num_ids, xp->num_groups);
}

static void kvf_dc_pull_free_digests(kvf_dc_pull_t *pull)
{
    for (int i = 0; i < pull->num_digests; ++i) {
        free(pull->digests[i].ranges);
    }
    free(pull->digests);
    pull->digests = NULL;
    pull->num_digests = 0;
    pull->cap_digests = 0;
}

/*
 * --kv-digest on: what rank @a r received, per prefill rank read, copied out
 * of its connector request (finish_pull frees the connector's copy).
 */
static kvf_status_t kvf_dc_pull_digest_rank(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull, int r)
{
    uint64_t t0 = kvf_time_now_ns();
    const kvf_kv_digest_t *d;
    int n;
    kvf_status_t status;

    if (pull->reqs[r] == NULL) {
        return KVF_OK;   /* no_reads: nothing landed, nothing to digest */
    }
    status = ctx->xops->req_digests(ctx->conn, r, pull->reqs[r], &d, &n);
    if (status != KVF_OK) {
        return status;
    }
    if (pull->num_digests + n > pull->cap_digests) {
        int cap = (pull->num_digests + n) * 2;
        kvf_kv_digest_t *grown = realloc(pull->digests, (size_t)cap * sizeof(*grown));
        if (grown == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        pull->digests = grown;
        pull->cap_digests = cap;
    }
    for (int i = 0; i < n; ++i) {
        kvf_kv_digest_t *x = &pull->digests[pull->num_digests];
        *x = d[i];
        x->ranges = malloc(2 * d[i].num_ranges * sizeof(*x->ranges) + 1);
        if (x->ranges == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        memcpy(x->ranges, d[i].ranges, 2 * d[i].num_ranges * sizeof(*x->ranges));
        pull->num_digests++;
    }
    pull->stats.digest_ms += (double)(kvf_time_now_ns() - t0) / 1e6;
    return KVF_OK;
}

/* Every rank that started: nothing lands after this (force-closed when not done). */
static kvf_status_t kvf_dc_pull_finish_ranks(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    kvf_status_t status = KVF_OK;

    for (int r = 0; r < ctx->tp; ++r) {
        if (pull->reqs[r] != NULL) {
            kvf_status_t s = ctx->xops->finish_pull(ctx->conn, r, pull->reqs[r]);
            pull->reqs[r] = NULL;
            if ((status == KVF_OK) && (s != KVF_OK)) {
                status = s;
            }
        }
    }
    return status;
}

/* Tell prefill nothing reads the pages any more (not waited for). */
static void kvf_dc_pull_send_abandon(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull,
                                     kvf_status_t why)
{
    kvf_lease_msg_t m;
    uint64_t ticket = 0;

    kvf_dc_pull_msg(ctx, pull->xp, pull->request_id, KVF_LEASE_OP_RELEASE,
                    (why == KVF_OK) ? KVF_ERR_CANCELED : why, &m);
    if (ctx->xops->lease_start(ctx->conn, &pull->peer, &m, &ticket) == KVF_OK) {
        ctx->xops->cancel(ctx->conn, ticket);   /* its answer changes nothing */
        ctx->abandoned++;
    }
}

/* End @a pull with @a status; @return @a status. Formats pull->err. */
static kvf_status_t kvf_dc_pull_fail(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull,
                                     kvf_status_t status, const char *fmt, ...)
{
    va_list ap;

    if (fmt != NULL) {
        va_start(ap, fmt);
        vsnprintf(pull->err, sizeof(pull->err), fmt, ap);
        va_end(ap);
    }
    if (pull->ticket != 0) {
        ctx->xops->cancel(ctx->conn, pull->ticket);
        pull->ticket = 0;
    }
    (void)kvf_dc_pull_finish_ranks(ctx, pull);
    if (pull->claimed && (pull->state != KVF_DC_PULL_DONE)) {
        kvf_dc_pull_send_abandon(ctx, pull, status);
    }
    kvf_dc_pull_free_digests(pull);
    if (KVF_IS_PEER_ERROR(status)) {
        ctx->peer_errors++;
    }
    pull->state = KVF_DC_PULL_DONE;
    return status;
}

void kvf_dc_pull_abandon(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    if (pull->state != KVF_DC_PULL_DONE) {
        (void)kvf_dc_pull_fail(ctx, pull, KVF_ERR_CANCELED, "request %s abandoned",
                               pull->request_id);
    }
}

/* Send a claim on @a xp's lease (fault lease.claim may replay an old one). */
static kvf_status_t kvf_dc_pull_claim_send(kvf_dc_pull_ctx_t *ctx,
                                           const kvf_xfer_params_msg_t *xp,
                                           const char *request_id, bool *replayed_p,
                                           uint64_t *ticket_p)
{
    kvf_connector_peer_t peer = {xp->engine_id, xp->host, xp->port, xp->incarnation};
    kvf_lease_msg_t m;

    kvf_dc_pull_msg(ctx, xp, request_id, KVF_LEASE_OP_CLAIM, KVF_OK, &m);
    *replayed_p = false;
#if KVF_FAULT_ENABLED
    if (KVF_FAULT(LEASE_CLAIM) == KVF_FAULT_REPLAY) {
        if (ctx->fault_last_rid[0] != '\0') {
            /* stale transfer params: a lease this decode already released */
            kvf_warn("fault lease.claim: request %s claims with the transfer params of request"
                     " %s (released); GETs posted so far: %" PRIu64, request_id,
                     ctx->fault_last_rid, kvf_fault_passes(KVF_FAULT_POINT_UCX_POST));
            snprintf(m.request_id, sizeof(m.request_id), "%s", ctx->fault_last_rid);
            m.nonce = ctx->fault_last_nonce;
            *replayed_p = true;
        } else {
            kvf_warn("fault lease.claim: no released lease to replay yet");
        }
    }
#endif
    return ctx->xops->lease_start(ctx->conn, &peer, &m, ticket_p);
}

kvf_status_t kvf_dc_pull_heartbeat(kvf_dc_pull_ctx_t *ctx, const kvf_xfer_params_msg_t *xp,
                                   const char *request_id, uint64_t *ticket_p)
{
    bool replayed;

    return kvf_dc_pull_claim_send(ctx, xp, request_id, &replayed, ticket_p);
}

static kvf_status_t kvf_dc_pull_handshake(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    kvf_status_t status;
    char why[384];

    if (pull->ticket == 0) {
        status = ctx->xops->handshake_start(ctx->conn, &pull->peer, &pull->ticket);
        if ((status == KVF_INPROGRESS) && (pull->ticket == 0) &&
            (kvf_time_now_ns() > pull->phase_deadline_ns)) {
            status = KVF_ERR_PEER_TIMEOUT;   /* another request's handshake never ended */
        }
        if (status == KVF_INPROGRESS) {
            return status;
        }
        why[0] = '\0';
    } else {
        status = ctx->xops->handshake_poll(ctx->conn, pull->ticket, why, sizeof(why));
        if (status == KVF_INPROGRESS) {
            return status;
        }
        pull->ticket = 0;
    }
    if (status != KVF_OK) {
        if (status == KVF_ERR_REFUSED) {
            ctx->refusals++;
        }
        return kvf_dc_pull_fail(ctx, pull, status, "%s", (why[0] != '\0') ? why :
                                "handshake failed");
    }
    pull->stats.handshake_ms = (double)(kvf_time_now_ns() - pull->start_ns) / 1e6;
    if (pull->xp->num_groups != pull->blocks->num_groups) {
        return kvf_dc_pull_fail(ctx, pull, KVF_ERR_INVALID_PARAM, "transfer params carry %d KV"
                                " cache groups, this model has %d", pull->xp->num_groups,
                                pull->blocks->num_groups);
    }
    /* claim the lease before any GET: stale or replayed params stop here */
    status = kvf_dc_pull_claim_send(ctx, pull->xp, pull->request_id, &pull->replayed,
                                    &pull->ticket);
    if (status != KVF_OK) {
        return kvf_dc_pull_fail(ctx, pull, status, "claiming the KV lease of request %s at"
                                " prefill %s failed: %s", pull->request_id, pull->xp->engine_id,
                                kvf_status_str(status));
    }
    pull->claimed = true;
    pull->state = KVF_DC_PULL_CLAIM;
    pull->phase_deadline_ns = kvf_time_now_ns() + kvf_dc_pull_phase_ns(ctx);
    return KVF_INPROGRESS;
}

/* Plan and post every rank's GETs (never blocks). */
static kvf_status_t kvf_dc_pull_start_gets(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    const kvf_xfer_params_msg_t *xp = pull->xp;
    kvf_connector_pull_t p;

    memset(&p, 0, sizeof(p));
    p.engine_id = xp->engine_id;
    p.request_id = pull->request_id;
    p.num_tokens = xp->num_tokens;
    p.num_groups = pull->blocks->num_groups;
    p.peer = &pull->peer;
    p.skip_tokens = pull->skip_tokens;
    p.plan_flags = pull->plan_flags;
    for (int g = 0; g < pull->blocks->num_groups; ++g) {
        p.remote_ids[g] = xp->ids[g];
        p.num_remote_ids[g] = xp->num_ids[g];
        p.local_ids[g] = pull->blocks->blocks[g];
        p.num_local_ids[g] = pull->blocks->num_blocks[g];
    }
    pull->gets_ns = kvf_time_now_ns();
    for (int r = 0; r < ctx->tp; ++r) {
        if (pull->no_reads) {
            pull->final[r] = KVF_OK;   /* the lease is still claimed and released */
            pull->reqs[r] = NULL;
            continue;
        }
        pull->final[r] = ctx->xops->start_pull(ctx->conn, r, &p, &pull->reqs[r]);
        if (pull->final[r] == KVF_OK) {
            pull->final[r] = KVF_INPROGRESS;
        } else {
            pull->reqs[r] = NULL;
        }
    }
    pull->state = KVF_DC_PULL_GETS;
    return KVF_INPROGRESS;
}

/*
 * The answer to the lease operation in flight (@a what: "claiming" or "releasing"):
 * KVF_INPROGRESS while there is none; KVF_OK with *answer_p; else the pull has failed
 * with that status, its message ending in @a tail.
 */
static kvf_status_t kvf_dc_pull_lease_answer(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull,
                                             const char *what, const char *tail,
                                             kvf_lease_answer_t *answer_p)
{
    kvf_status_t status = ctx->xops->lease_poll(ctx->conn, pull->ticket, answer_p);

    if (status == KVF_INPROGRESS) {
        return status;
    }
    pull->ticket = 0;
    if (status != KVF_OK) {
        return kvf_dc_pull_fail(ctx, pull, status, "%s the KV lease of request %s at prefill %s"
                                " failed: %s%s", what, pull->request_id, pull->xp->engine_id,
                                kvf_status_str(status), tail);
    }
    return KVF_OK;
}

static kvf_status_t kvf_dc_pull_claimed(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    kvf_lease_answer_t answer;
    kvf_status_t status = kvf_dc_pull_lease_answer(ctx, pull, "claiming", "", &answer);

    if (status != KVF_OK) {
        return status;
    }
    if (answer.verdict != KVF_LEASE_VALID) {
        ctx->reads_prevented++;
#if KVF_FAULT_ENABLED
        if (pull->replayed) {
            kvf_warn("fault lease.claim: replayed claim of request %s answered %s; GETs posted"
                     " so far: %" PRIu64, pull->request_id,
                     (answer.verdict == KVF_LEASE_EXPIRED) ? "expired" : "refused",
                     kvf_fault_passes(KVF_FAULT_POINT_UCX_POST));
        }
#endif
        return kvf_dc_pull_fail(ctx, pull, KVF_ERR_LEASE_EXPIRED, "the KV lease %s before the"
                                " read could start (prefill %s: %s); nothing was read",
                                (answer.verdict == KVF_LEASE_EXPIRED) ? "expired" :
                                "was refused", pull->xp->engine_id, answer.why);
    }
    if (answer.ms_left < (uint64_t)ctx->xfer_timeout_ms) {
        ctx->reads_prevented++;
        return kvf_dc_pull_fail(ctx, pull, KVF_ERR_LEASE_EXPIRED, "the KV lease of request %s"
                                " has %llu ms left, less than the transfer timeout"
                                " (--xfer-timeout %lld ms): not starting the pull",
                                pull->request_id, (unsigned long long)answer.ms_left,
                                (long long)ctx->xfer_timeout_ms);
    }
    if (ctx->test_pull_delay_ms > 0) {   /* fault tests kill prefill in this window */
        kvf_info("request %s: test pull delay %" PRId64 " ms", pull->request_id,
                 ctx->test_pull_delay_ms);
        pull->state = KVF_DC_PULL_DELAY;
        pull->phase_deadline_ns = kvf_time_now_ns() +
                                  (uint64_t)ctx->test_pull_delay_ms * 1000000ull;
        return KVF_INPROGRESS;
    }
    return kvf_dc_pull_start_gets(ctx, pull);
}

/* Phase boundaries are the latest rank's, so the phases add up (proto: ServeTiming). */
static void kvf_dc_pull_gather_stats(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    uint64_t t0 = pull->gets_ns, posted = t0, landed = 0;

    pull->stats.transfer_ms = (double)(kvf_time_now_ns() - t0) / 1e6;
    for (int r = 0; r < ctx->tp; ++r) {
        kvf_connector_stats_t st;
        if ((pull->reqs[r] == NULL) ||
            (ctx->xops->req_stats(ctx->conn, r, pull->reqs[r], &st) != KVF_OK)) {
            continue;
        }
        pull->stats.bytes += st.bytes;
        pull->stats.descriptors += st.descriptors;
        pull->stats.reads += (uint32_t)st.remote_ranks;
        posted = (st.posted_ns > posted) ? st.posted_ns : posted;
        landed = (st.landed_ns > landed) ? st.landed_ns : landed;
    }
    if (landed > 0) {
        pull->stats.posting_ms = (double)(posted - t0) / 1e6;
        pull->stats.wire_ms = (landed > posted) ? (double)(landed - posted) / 1e6 : 0.0;
        pull->stats.landed_ns = (landed > posted) ? landed : posted;
    }
}

static kvf_status_t kvf_dc_pull_send_release(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull);

static kvf_status_t kvf_dc_pull_gets(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    kvf_status_t status = KVF_OK;
    bool pending = false;

    for (int r = 0; r < ctx->tp; ++r) {   /* each poll is bounded by the connector's timeout */
        if (pull->final[r] == KVF_INPROGRESS) {
            pull->final[r] = ctx->xops->poll(ctx->conn, r, pull->reqs[r]);
            pending |= (pull->final[r] == KVF_INPROGRESS);
        }
    }
    if (pending) {
        return KVF_INPROGRESS;
    }
    kvf_dc_pull_gather_stats(ctx, pull);
    for (int r = 0; r < ctx->tp; ++r) {
        if ((status == KVF_OK) && (pull->final[r] != KVF_OK)) {
            status = pull->final[r];
        }
    }
    if (status == KVF_ERR_PEER_TIMEOUT) {
        return kvf_dc_pull_fail(ctx, pull, status, "kv pull from %s failed: no completion"
                                " within --xfer-timeout %lld ms", pull->xp->engine_id,
                                (long long)ctx->xfer_timeout_ms);
    }
    if (status != KVF_OK) {
        return kvf_dc_pull_fail(ctx, pull, status, "kv pull from %s failed: %s",
                                pull->xp->engine_id, kvf_status_str(status));
    }
    if (ctx->kv_digest) {
        /* one rank's KV hashed per advance: engine steps run between (a rank of a long
         * prompt is tens of ms of hashing) */
        pull->state = KVF_DC_PULL_DIGEST;
        pull->digest_rank = 0;
        return KVF_INPROGRESS;
    }
    return kvf_dc_pull_send_release(ctx, pull);
}

/* Hash the next rank's landed KV; after the last one, the release goes out. */
static kvf_status_t kvf_dc_pull_digest(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    kvf_status_t status = kvf_dc_pull_digest_rank(ctx, pull, pull->digest_rank);

    if (status != KVF_OK) {
        return kvf_dc_pull_fail(ctx, pull, status, "digesting the KV of request %s failed: %s",
                                pull->request_id, kvf_status_str(status));
    }
    if (++pull->digest_rank < ctx->tp) {
        return KVF_INPROGRESS;
    }
    return kvf_dc_pull_send_release(ctx, pull);
}

/* Every rank landed (and was digested): free the requests, send the one release. */
static kvf_status_t kvf_dc_pull_send_release(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    kvf_lease_msg_t m;
    kvf_status_t status;

    (void)kvf_dc_pull_finish_ranks(ctx, pull);   /* every rank landed: frees the requests */
    /* the bytes count only if the lease held throughout (and, with digests, prefill
     * finds them equal to what it sent): one release for every rank */
    kvf_dc_pull_msg(ctx, pull->xp, pull->request_id, KVF_LEASE_OP_RELEASE, KVF_OK, &m);
    m.num_digests = pull->num_digests;
    m.digests = pull->digests;
    status = ctx->xops->lease_start(ctx->conn, &pull->peer, &m, &pull->ticket);
    if (status != KVF_OK) {
        return kvf_dc_pull_fail(ctx, pull, status, "releasing the KV lease of request %s at"
                                " prefill %s failed: %s; the KV read is not trusted",
                                pull->request_id, pull->xp->engine_id, kvf_status_str(status));
    }
    pull->state = KVF_DC_PULL_RELEASE;
    return KVF_INPROGRESS;
}

static kvf_status_t kvf_dc_pull_released(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    kvf_lease_answer_t answer;
    /* unanswered: prefill may never have seen it, so the abandon follows (a replay of an
     * answered release is refused there, harmlessly) */
    kvf_status_t status = kvf_dc_pull_lease_answer(ctx, pull, "releasing",
                                                   "; the KV read is not trusted", &answer);

    if (status != KVF_OK) {
        return status;
    }
    pull->claimed = false;   /* answered: prefill has it, no abandon after it */
    kvf_dc_pull_free_digests(pull);
    if (answer.verdict == KVF_LEASE_CORRUPT) {
        ctx->digest_mismatches++;
        return kvf_dc_pull_fail(ctx, pull, KVF_ERR_PARSE, "KV digest mismatch: the KV of request"
                                " %s differs from what prefill %s sent (%s); the pulled KV was"
                                " not used", pull->request_id, pull->xp->engine_id, answer.why);
    }
    if (answer.verdict != KVF_LEASE_VALID) {
        ctx->reads_prevented++;
        return kvf_dc_pull_fail(ctx, pull, KVF_ERR_LEASE_EXPIRED, "the KV lease expired before"
                                " the read finished (prefill %s: %s); the pulled KV was not"
                                " used", pull->xp->engine_id, answer.why);
    }
#if KVF_FAULT_ENABLED
    snprintf(ctx->fault_last_rid, sizeof(ctx->fault_last_rid), "%s", pull->request_id);
    ctx->fault_last_nonce = pull->xp->nonce;
#endif
    ctx->pulls_valid++;
    ctx->bytes_valid += pull->stats.bytes;
    pull->state = KVF_DC_PULL_DONE;
    return KVF_OK;
}

kvf_status_t kvf_dc_pull_advance(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull)
{
    for (;;) {
        kvf_dc_pull_state_t before = pull->state;
        kvf_status_t status;

        switch (pull->state) {
        case KVF_DC_PULL_HANDSHAKE:
            status = kvf_dc_pull_handshake(ctx, pull);
            break;
        case KVF_DC_PULL_CLAIM:
            status = kvf_dc_pull_claimed(ctx, pull);
            break;
        case KVF_DC_PULL_DELAY:
            status = (kvf_time_now_ns() < pull->phase_deadline_ns) ? KVF_INPROGRESS :
                     kvf_dc_pull_start_gets(ctx, pull);
            break;
        case KVF_DC_PULL_GETS:
            status = kvf_dc_pull_gets(ctx, pull);
            break;
        case KVF_DC_PULL_DIGEST:
            status = kvf_dc_pull_digest(ctx, pull);
            break;
        case KVF_DC_PULL_RELEASE:
            status = kvf_dc_pull_released(ctx, pull);
            break;
        default:
            return KVF_ERR_INVALID_PARAM;   /* advanced after its end */
        }
        if ((status != KVF_INPROGRESS) || (pull->state == before)) {
            return status;   /* ended, or waiting in this state */
        }
    }
}

/*
 * The sliding-window pull (docs/ARCHITECTURE.md §7): a model with a sliding layer reads its
 * sliding groups from the window's first block on; their blocks from the hit up to it are
 * zeroed (the plan's post-ops; a full group is read whole), and the engine must not serve
 * those blocks (it indexes them as "not cached"). Design: decided here, per pull,
 * from the model and the prompt alone, so prefill needs no change: the KV digests name the
 * ranges read, which prefill hashes as they are. Rejected: a connector-wide plan flag (the
 * engine would not learn which blocks hold no content).
 */
static void kvf_dc_pull_window(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull, kvf_engine_h engine,
                               uint64_t id)
{
    const kvf_cache_layout_t *lay = kvf_tp_runner_layout(kvf_engine_runner(engine));
    const int B = kvf_block_manager_block_size(kvf_engine_block_manager(engine));
    int64_t first;

    pull->plan_flags = 0;
    pull->zeroed_tokens = 0;
    if (!ctx->window_pull || pull->no_reads) {
        return;
    }
    first = kvf_xfer_window_first_block(kvf_engine_model_config(engine), lay,
                                        pull->xp->num_tokens, B) * B;
    if (first <= pull->skip_tokens) {
        return;   /* the window starts inside the hit (or at 0): a plain partial pull */
    }
    if (kvf_engine_import_zeroed(engine, id, first) != KVF_OK) {
        return;   /* logged; the whole pull stays correct */
    }
    pull->plan_flags = KVF_XFER_PLAN_FLAG_WINDOW;
    pull->zeroed_tokens = first;
    kvf_log(KVF_LOG_DEBUG, KVF_SUB_XFER, "request %s: the sliding window reads prompt tokens"
            " %lld..%lld, zeroes %lld..%lld", pull->request_id, (long long)first,
            (long long)pull->xp->num_tokens, (long long)pull->skip_tokens, (long long)first);
}

void kvf_dc_pull_prefix(kvf_dc_pull_ctx_t *ctx, kvf_dc_pull_t *pull, kvf_engine_h engine,
                        uint64_t id)
{
    const kvf_cache_layout_t *lay = kvf_tp_runner_layout(kvf_engine_runner(engine));
    int hit = kvf_engine_request_prefix_hit(engine, id);
    kvf_engine_prefix_stats_t ps;
    bool mamba = false;

    for (int g = 0; g < lay->num_groups; ++g) {
        mamba = mamba || (lay->groups[g].kind == KVF_GROUP_MAMBA);
    }
    pull->skip_tokens = (hit > 0) ? hit : 0;
    pull->no_reads = !mamba && (pull->skip_tokens == pull->xp->num_tokens);
    kvf_dc_pull_window(ctx, pull, engine, id);
    kvf_engine_get_prefix_stats(engine, &ps);   /* all 0 with decode's cache off */
    if ((pull->xp->prefix_source == 0) && (ps.imports > 0) && !ctx->warned_no_source) {
        ctx->warned_no_source = true;   /* the metric counts each one */
        kvf_warn("request %s: prefill %s sends no numerics class (TransferParams.prefix_source,"
                 " an older prefill): its KV is pulled whole and not kept in decode's prefix"
                 " cache", pull->request_id, pull->xp->engine_id);
    }
    if (hit > 0) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_XFER, "request %s: %d of %lld prompt tokens from decode's"
                " prefix cache, the rest%s pulled", pull->request_id, hit,
                (long long)pull->xp->num_tokens, mamba ? " and the Mamba state" : "");
    }
}
