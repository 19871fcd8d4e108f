/*
 * UCX connector, remote engines: the table of handshaken prefill engines,
 * the handshake (synchronous and asynchronous) and lease operations over
 * the side channel (transfer/ucx/kvf_connector.h).
 *
 * Design: the table is keyed by engine id, side-channel address and
 * incarnation (kvf_connector_peer_t), so transfer params that name the
 * same engine id at another address (a fake side channel) or a restarted
 * process never reuse another entry's keys and addresses; the synchronous
 * handshake (tools, tests) looks an engine up by its id alone. No lock is
 * held across the network: metadata is fetched and checked first (the
 * side-channel client is the leader's alone), then the lock is taken only
 * to publish the entry, so a rank thread's pull of another engine proceeds
 * while a peer stalls a handshake. The asynchronous calls only send and
 * poll; handshakes in flight are remembered per key, so a second request
 * for the same prefill waits for the first one's answer instead of sending
 * its own.
 */
#include "kvf_connector_ucx_int.h"

#include "kvf_compat.h"
#include "kvf_kv_digest_dev.h"
#include "kvf_log.h"

#include <stdint.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvf_conn_check_every_rank(kvf_connector_h conn, const char *op)
{
#if KVF_CONTRACTS
    for (int r = 0; r < conn->tp; ++r) {
        if (conn->ranks[r].registered) {
            kvf_thread_owner_check(&conn->ranks[r].owner, op, __FILE__, __LINE__);
        }
    }
#else
    (void)conn;
    (void)op;
#endif
}

static bool kvf_conn_engine_matches(const kvf_conn_engine_t *e, const char *engine_id,
                                    const char *host, int port, uint64_t incarnation)
{
    if (e->forgotten || (strcmp(e->engine_id, engine_id) != 0)) {
        return false;
    }
    if (host == NULL) {
        return true;
    }
    return (e->port == port) && (strcmp(e->host, host) == 0) &&
           ((incarnation == 0) || (e->incarnation == incarnation));
}

int kvf_conn_find_engine_locked(kvf_connector_h conn, const char *engine_id, const char *host,
                                int port, uint64_t incarnation)
{
    int best = -1;

    for (int e = 0; e < conn->num_engines; ++e) {
        if (kvf_conn_engine_matches(&conn->engines[e], engine_id, host, port, incarnation) &&
            ((best < 0) || (conn->engines[e].last_used > conn->engines[best].last_used))) {
            best = e;   /* by id alone: the most recently used one */
        }
    }
    return best;
}

static int kvf_conn_find_engine(kvf_connector_h conn, const char *engine_id)
{
    int found;
    pthread_mutex_lock(&conn->lock);
    found = kvf_conn_find_engine_locked(conn, engine_id, NULL, 0, 0);
    pthread_mutex_unlock(&conn->lock);
    return found;
}

void kvf_conn_engine_pieces_free(kvf_connector_h conn, kvf_conn_engine_t *eng)
{
    for (int r = 0; (eng->pieces != NULL) && (r < conn->tp); ++r) {
        kvf_xfer_pieces_destroy(eng->pieces[r]);
    }
    free(eng->pieces);
    eng->pieces = NULL;
}

/*
 * Design: a plan's pieces (which prefill rank and head each local head is read from, a whole
 * attention block's and a Mamba page's runs) depend on the pair's geometries alone, so they
 * are derived once per (engine, decode rank) and every later pull only walks its blocks
 * (kvf_xfer_plan.h, kvf_xfer_pieces_create). Built at the handshake for every registered
 * rank (kvf_conn_build_pieces, before the entry is published); here by the rank's own thread
 * only for a rank registered later or one that re-registered (no lock: the entry is held,
 * inflight, while this runs, so the leader cannot free it meanwhile).
 */
void kvf_conn_use_pieces(const kvf_conn_engine_t *e, int tp_rank, kvf_xfer_plan_params_t *pp)
{
    kvf_xfer_pieces_t **pc = (e->pieces != NULL) ? &e->pieces[tp_rank] : NULL;

    if (pc == NULL) {
        return;
    }
    if ((*pc != NULL) && !kvf_xfer_pieces_match(*pc, pp)) {   /* the rank re-registered */
        kvf_xfer_pieces_destroy(*pc);
        *pc = NULL;
    }
    if ((*pc == NULL) && (kvf_xfer_pieces_create(pp, pc) != KVF_OK)) {
        *pc = NULL;
        return;
    }
    pp->field_mask |= KVF_XFER_PLAN_PARAM_FIELD_PIECES;
    pp->pieces = *pc;
}

/*
 * At the handshake, before @a fresh is published: every registered decode rank's pieces from
 * this engine, so no pull (the first included) derives them. A rank not registered yet, or
 * one whose pieces cannot be built here, builds them at its first pull (kvf_conn_use_pieces,
 * which also rebuilds them if the rank re-registered with another geometry).
 */
static void kvf_conn_build_pieces(kvf_connector_h conn, kvf_conn_engine_t *fresh)
{
    for (int r = 0; r < conn->tp; ++r) {
        const kvf_conn_rank_t *rk = &conn->ranks[r];
        kvf_xfer_plan_params_t pp;
        bool registered;

        pthread_mutex_lock(&conn->lock);
        registered = rk->registered;   /* its geometry was set before, under the lock */
        pthread_mutex_unlock(&conn->lock);
        if (!registered) {
            continue;
        }
        memset(&pp, 0, sizeof(pp));
        pp.flags = conn->plan_flags;
        pp.field_mask = (pp.flags != 0) ? KVF_XFER_PLAN_PARAM_FIELD_FLAGS : 0;
        pp.cfg = &conn->cfg;
        pp.layout = conn->layout;
        pp.local_tp = conn->tp;
        pp.local_rank = r;
        pp.local_geom = &rk->geom;
        pp.remote_tp = fresh->tp;
        pp.remote_geoms = fresh->geoms;
        if (kvf_xfer_pieces_create(&pp, &fresh->pieces[r]) != KVF_OK) {
            fresh->pieces[r] = NULL;   /* logged; the first pull tries again */
        }
    }
}

/* Drop slot @a e's cached data (lock held; the leader's). Endpoints stay with the ranks. */
static void kvf_conn_engine_clear_locked(kvf_connector_h conn, int e)
{
    kvf_conn_engine_t *eng = &conn->engines[e];
    uint64_t gen = eng->gen;

    kvf_conn_engine_pieces_free(conn, eng);
    free(eng->ranks);
    free(eng->geoms);
    free(eng->num_blocks);
    memset(eng, 0, sizeof(*eng));
    eng->gen = gen;
    eng->forgotten = true;
}

/*
 * A slot for a new engine (lock held): a free one, the next unused one, or
 * the least recently used entry with no pull in flight, evicted. -1 when
 * every entry has a pull in flight.
 */
static int kvf_conn_take_slot_locked(kvf_connector_h conn, char *evicted, size_t evicted_len)
{
    int lru = -1;

    evicted[0] = '\0';
    for (int i = 0; i < conn->num_engines; ++i) {
        if (conn->engines[i].forgotten) {
            return i;
        }
    }
    if (conn->num_engines < KVF_CONN_MAX_ENGINES) {
        return conn->num_engines;
    }
    for (int i = 0; i < conn->num_engines; ++i) {
        if ((conn->engines[i].inflight == 0) &&
            ((lru < 0) || (conn->engines[i].last_used < conn->engines[lru].last_used))) {
            lru = i;
        }
    }
    if (lru >= 0) {
        snprintf(evicted, evicted_len, "%s", conn->engines[lru].engine_id);
        kvf_side_channel_forget(conn->client, evicted);   /* memory only */
        kvf_conn_engine_clear_locked(conn, lru);
    }
    return lru;
}

/* Entries of the same engine at the same address from an older process: idle ones go. */
static void kvf_conn_drop_older_locked(kvf_connector_h conn, const kvf_conn_engine_t *fresh)
{
    for (int i = 0; i < conn->num_engines; ++i) {
        kvf_conn_engine_t *e = &conn->engines[i];
        if (!e->forgotten && (e->inflight == 0) && (e->incarnation != fresh->incarnation) &&
            (strcmp(e->engine_id, fresh->engine_id) == 0) && (e->port == fresh->port) &&
            (strcmp(e->host, fresh->host) == 0)) {
            kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "ucx connector %s: engine %s restarted"
                    " (incarnation %016" PRIx64 " -> %016" PRIx64 "): old entry dropped",
                    conn->engine_id, e->engine_id, e->incarnation, fresh->incarnation);
            kvf_conn_engine_clear_locked(conn, i);
        }
    }
}

/* Every region key of @a reply is within 1..KVF_RKEY_MAX bytes (never parsed: UCX's format). */
static kvf_status_t kvf_conn_check_rkeys(const kvf_handshake_reply_t *reply,
                                         const char *engine_id, const char *host, int port,
                                         char *why, size_t why_len)
{
    for (int r = 0; r < reply->num_ranks; ++r) {
        for (int j = 0; j < reply->ranks[r].num_regions; ++j) {
            char bad[128];
            if (kvf_ucx_rkey_check(reply->ranks[r].regions[j].rkey,
                                   reply->ranks[r].regions[j].rkey_len, bad,
                                   sizeof(bad)) != KVF_OK) {
                snprintf(why, why_len, "malformed handshake reply from %s at %s:%d: remote key"
                         " of region %d of rank %d refused: %s", engine_id, host, port, j, r,
                         bad);
                kvf_error("%s", why);
                return KVF_ERR_PARSE;
            }
        }
    }
    return KVF_OK;
}

/*
 * Every remote region is memory this side's UCX reaches: a prefill pool in
 * CUDA memory read by a decode whose UCX has no CUDA is refused here, by
 * name with both sides' values, before any endpoint or key exists.
 */
static kvf_status_t kvf_conn_check_mem_types(kvf_connector_h conn,
                                             const kvf_handshake_reply_t *reply, char *why,
                                             size_t why_len)
{
    const kvf_conn_rank_t *rk = &conn->ranks[0];   /* every rank's agent: the same UCX */

    for (int r = 0; r < reply->num_ranks; ++r) {
        for (int j = 0; j < reply->ranks[r].num_regions; ++j) {
            kvf_xfer_mem_type_t t = reply->ranks[r].regions[j].mem_type;
            kvf_refusal_t ref;
            char what[200];

            if (kvf_ucx_agent_mem_reach(rk->agent, t, what, sizeof(what)) == KVF_OK) {
                continue;
            }
            memset(&ref, 0, sizeof(ref));
            snprintf(ref.field, sizeof(ref.field), "regions[%d].memory_type", j);
            snprintf(ref.local, sizeof(ref.local), "%s pool (%s)",
                     kvf_xfer_mem_type_name(rk->meta->regions[0].mem_type), what);
            snprintf(ref.remote, sizeof(ref.remote), "%s (rank %d)",
                     kvf_xfer_mem_type_name(t), r);
            snprintf(ref.why, sizeof(ref.why), "decode's UCX cannot reach %s memory: pools"
                     " in device memory need a UCX built with CUDA on both sides",
                     kvf_xfer_mem_type_name(t));
            kvf_refusal_format(&ref, false, why, why_len);   /* decode found it */
            kvf_error("%s", why);
            return KVF_ERR_REFUSED;
        }
    }
    return KVF_OK;
}

/*
 * Check an accepted @a reply of @a engine_id at @a host:@a port and
 * publish it as a new entry (the lock only around the publishing).
 */
static kvf_status_t kvf_conn_install(kvf_connector_h conn, const char *engine_id,
                                     const char *host, int port,
                                     const kvf_handshake_reply_t *reply, char *why,
                                     size_t why_len)
{
    kvf_refusal_t refusals[KVF_MAX_REFUSALS];
    kvf_conn_engine_t fresh;
    char evicted[KVF_ENGINE_ID_MAX];
    int nref = 0, slot;
    kvf_status_t status;

    memset(&fresh, 0, sizeof(fresh));
    fresh.geoms = calloc((size_t)reply->num_ranks, sizeof(*fresh.geoms));
    fresh.num_blocks = calloc((size_t)reply->num_ranks, sizeof(*fresh.num_blocks));
    fresh.ranks = malloc((size_t)reply->num_ranks * sizeof(*fresh.ranks));
    fresh.pieces = calloc((size_t)conn->tp, sizeof(*fresh.pieces));
    if ((fresh.geoms == NULL) || (fresh.num_blocks == NULL) || (fresh.ranks == NULL) ||
        (fresh.pieces == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free;
    }
    status = kvf_compat_check(&conn->cfg, conn->ranks[0].meta, reply->ranks, reply->num_ranks,
                              fresh.geoms, refusals, KVF_MAX_REFUSALS, &nref);
    if (status != KVF_OK) {
        if (nref > 0) {
            kvf_refusal_format(&refusals[0], false, why, why_len);
        }
        goto err_free;
    }
    status = kvf_conn_check_mem_types(conn, reply, why, why_len);
    if (status == KVF_OK) {
        status = kvf_conn_check_rkeys(reply, engine_id, host, port, why, why_len);
    }
    if (status != KVF_OK) {
        goto err_free;
    }
    snprintf(fresh.engine_id, sizeof(fresh.engine_id), "%s", engine_id);
    snprintf(fresh.host, sizeof(fresh.host), "%s", host);
    fresh.port = port;
    fresh.incarnation = reply->ranks[0].incarnation;
    memcpy(fresh.ranks, reply->ranks, (size_t)reply->num_ranks * sizeof(*fresh.ranks));
    fresh.tp = reply->num_ranks;
    for (int r = 0; r < fresh.tp; ++r) {
        /* from what the peer registered, not what it claims (the compat check
         * made them agree; this keeps the planner's bound the registered one) */
        fresh.num_blocks[r] = (int64_t)(reply->ranks[r].regions[0].length /
                                        ((uint64_t)reply->ranks[r].slots *
                                         reply->ranks[r].page_size));
    }

    kvf_conn_build_pieces(conn, &fresh);   /* before it is published: no lock needed */
    pthread_mutex_lock(&conn->lock);
    kvf_conn_drop_older_locked(conn, &fresh);
    slot = kvf_conn_take_slot_locked(conn, evicted, sizeof(evicted));
    if (slot < 0) {
        pthread_mutex_unlock(&conn->lock);
        snprintf(why, why_len, "handshake with %s: all %d prefill engines this instance knows "
                 "have transfers in flight", engine_id, KVF_CONN_MAX_ENGINES);
        status = KVF_ERR_NO_RESOURCE;
        goto err_free;
    }
    fresh.gen = ++conn->engine_gen;
    fresh.last_used = ++conn->use_seq;
    conn->engines[slot] = fresh;
    if (slot == conn->num_engines) {
        conn->num_engines++;    /* publish */
    }
    pthread_mutex_unlock(&conn->lock);
    if (evicted[0] != '\0') {
        kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "ucx connector %s: table of %d engines full: "
                "evicted idle engine %s (least recently used) for %s", conn->engine_id,
                KVF_CONN_MAX_ENGINES, evicted, engine_id);
    }
    kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "ucx connector %s: engine %s (TP %d) at %s:%d is"
            " compatible", conn->engine_id, engine_id, fresh.tp, host, port);
    return KVF_OK;

err_free:
    kvf_conn_engine_pieces_free(conn, &fresh);
    free(fresh.ranks);
    free(fresh.geoms);
    free(fresh.num_blocks);
    return status;
}

/* A cache hit marks the entry used. @return true when cached. */
static bool kvf_conn_cached(kvf_connector_h conn, const char *engine_id, const char *host,
                            int port, uint64_t incarnation)
{
    int slot;

    pthread_mutex_lock(&conn->lock);
    slot = kvf_conn_find_engine_locked(conn, engine_id, host, port, incarnation);
    if (slot >= 0) {
        conn->engines[slot].last_used = ++conn->use_seq;
    }
    pthread_mutex_unlock(&conn->lock);
    return slot >= 0;
}

kvf_status_t kvf_conn_handshake(kvf_connector_h conn, const char *engine_id, const char *host,
                                int port, char *why, size_t why_len)
{
    const kvf_handshake_reply_t *reply;
    kvf_status_t status;

    KVF_CONN_CHECK_LEADER(conn, "handshake");
    if (why_len > 0) {
        why[0] = '\0';
    }
    if ((conn->role != KVF_CONNECTOR_ROLE_DECODE) || (engine_id == NULL) || (host == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_conn_cached(conn, engine_id, NULL, 0, 0)) {
        return KVF_OK;
    }
    if (!kvf_conn_all_registered(conn)) {
        return KVF_ERR_BUSY;
    }
    status = kvf_side_channel_fetch(conn->client, engine_id, host, port, &reply);
    if (status == KVF_ERR_REFUSED) {
        if (reply->num_refusals > 0) {
            kvf_refusal_format(&reply->refusals[0], true, why, why_len);   /* prefill's */
        } else {
            snprintf(why, why_len, "handshake refused: %s", reply->error);
        }
        return status;
    }
    if (status != KVF_OK) {
        snprintf(why, why_len, "handshake with %s at %s:%d failed: %s", engine_id, host, port,
                 kvf_status_str(status));
        return status;
    }
    status = kvf_conn_install(conn, engine_id, host, port, reply, why, why_len);
    if (status != KVF_OK) {
        kvf_side_channel_forget(conn->client, engine_id);
    }
    return status;
}

kvf_status_t kvf_conn_handshake_start(kvf_connector_h conn, const kvf_connector_peer_t *peer,
                                      uint64_t *ticket_p)
{
    kvf_conn_hs_t *hs;
    kvf_status_t status;

    KVF_CONN_CHECK_LEADER(conn, "handshake_start");
    *ticket_p = 0;
    if ((conn->role != KVF_CONNECTOR_ROLE_DECODE) || (peer == NULL) ||
        (peer->engine_id == NULL) || (strlen(peer->engine_id) >= KVF_ENGINE_ID_MAX) ||
        (peer->host == NULL) || (strlen(peer->host) >= sizeof(hs->host)) ||
        (peer->incarnation == 0)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_conn_cached(conn, peer->engine_id, peer->host, peer->port, peer->incarnation)) {
        return KVF_OK;
    }
    if (!kvf_conn_all_registered(conn)) {
        return KVF_ERR_BUSY;
    }
    for (int i = 0; i < conn->num_hs; ++i) {
        hs = &conn->hs[i];
        if ((hs->port == peer->port) && (hs->incarnation == peer->incarnation) &&
            (strcmp(hs->engine_id, peer->engine_id) == 0) && (strcmp(hs->host, peer->host) == 0)) {
            return KVF_INPROGRESS;   /* someone else's handshake: ask again later */
        }
    }
    if (conn->num_hs == KVF_CONN_MAX_HS) {
        return KVF_ERR_NO_RESOURCE;
    }
    hs = &conn->hs[conn->num_hs];
    status = kvf_side_channel_fetch_start(conn->client, peer->engine_id, peer->host, peer->port,
                                          &hs->ticket);
    if (status != KVF_OK) {
        return status;
    }
    snprintf(hs->engine_id, sizeof(hs->engine_id), "%s", peer->engine_id);
    snprintf(hs->host, sizeof(hs->host), "%s", peer->host);
    hs->port = peer->port;
    hs->incarnation = peer->incarnation;
    conn->num_hs++;
    *ticket_p = hs->ticket;
    return KVF_INPROGRESS;
}

static int kvf_conn_hs_find(kvf_connector_h conn, uint64_t ticket)
{
    for (int i = 0; i < conn->num_hs; ++i) {
        if (conn->hs[i].ticket == ticket) {
            return i;
        }
    }
    return -1;
}

kvf_status_t kvf_conn_handshake_poll(kvf_connector_h conn, uint64_t ticket, char *why,
                                     size_t why_len)
{
    kvf_handshake_reply_t reply;
    kvf_conn_hs_t hs;
    kvf_status_t status;
    int i;

    KVF_CONN_CHECK_LEADER(conn, "handshake_poll");
    if (why_len > 0) {
        why[0] = '\0';
    }
    i = kvf_conn_hs_find(conn, ticket);
    if (i < 0) {
        return KVF_ERR_NOT_FOUND;
    }
    status = kvf_side_channel_fetch_poll(conn->client, ticket, &reply);
    if (status == KVF_INPROGRESS) {
        return status;
    }
    hs = conn->hs[i];
    conn->hs[i] = conn->hs[--conn->num_hs];
    if (status == KVF_ERR_REFUSED) {
        if (reply.num_refusals > 0) {
            kvf_refusal_format(&reply.refusals[0], true, why, why_len);   /* prefill's */
        } else {
            snprintf(why, why_len, "handshake refused: %s", reply.error);
        }
        kvf_handshake_reply_cleanup(&reply);
        return status;
    }
    if (status != KVF_OK) {
        snprintf(why, why_len, "handshake with %s at %s:%d failed: %s", hs.engine_id, hs.host,
                 hs.port, kvf_status_str(status));
        return status;
    }
    if (reply.ranks[0].incarnation != hs.incarnation) {
        snprintf(why, why_len, "handshake with %s at %s:%d: incarnation %016" PRIx64 " answered,"
                 " the transfer params name %016" PRIx64 " (that process is gone)", hs.engine_id,
                 hs.host, hs.port, reply.ranks[0].incarnation, hs.incarnation);
        kvf_handshake_reply_cleanup(&reply);
        return KVF_ERR_PEER_RESET;
    }
    status = kvf_conn_install(conn, hs.engine_id, hs.host, hs.port, &reply, why, why_len);
    kvf_handshake_reply_cleanup(&reply);
    return status;
}

/*
 * The KV digests of release @a msg against this instance's pools (read
 * while the lease still holds). @return true when one differs (@a why says
 * which); malformed ranges count as a difference.
 */
static bool kvf_conn_digests_differ(kvf_connector_h conn, const kvf_lease_msg_t *msg,
                                    char *why, size_t why_len)
{
    for (int i = 0; i < msg->num_digests; ++i) {
        const kvf_kv_digest_t *d = &msg->digests[i];
        const kvf_conn_rank_t *rk;
        uint64_t total = 0, mine = 0;

        if ((d->prefill_rank < 0) || (d->prefill_rank >= conn->tp) ||
            !conn->ranks[d->prefill_rank].registered) {
            snprintf(why, why_len, "KV digest names prefill rank %d of %d", d->prefill_rank,
                     conn->tp);
            return true;
        }
        rk = &conn->ranks[d->prefill_rank];
        for (size_t k = 0; k < d->num_ranges; ++k) {
            uint64_t off = d->ranges[2 * k], len = d->ranges[2 * k + 1];
            if ((off > rk->len) || (len > rk->len - off) || (len > UINT64_MAX - total) ||
                ((total += len) > 4 * (uint64_t)rk->len)) {
                snprintf(why, why_len, "KV digest range %zu (%llu+%llu) of prefill rank %d is"
                         " outside its pool of %zu bytes", k, (unsigned long long)off,
                         (unsigned long long)len, d->prefill_rank, rk->len);
                return true;
            }
        }
        /* a GPU pool: the ranges are copied to the host once (kvf_kv_digest_dev.h) */
        if (kvf_kv_digest_ranges_dev(&rk->device, rk->base, d->ranges, d->num_ranges,
                                     &mine) != KVF_OK) {
            snprintf(why, why_len, "the KV digest of prefill rank %d's %zu ranges could not be"
                     " computed on %s:%d", d->prefill_rank, d->num_ranges,
                     kvf_device_kind_name(rk->device.kind), rk->device.ordinal);
            return true;
        }
        if (mine != d->digest) {
            snprintf(why, why_len, "the KV decode rank %d received from prefill rank %d differs"
                     " from what was sent (digest over %zu ranges)", d->decode_rank,
                     d->prefill_rank, d->num_ranges);
            return true;
        }
    }
    return false;
}

void kvf_conn_lease_verify(void *arg, const char *requester, const kvf_lease_msg_t *msg,
                           uint32_t peer_timeout_ms, kvf_lease_answer_t *answer)
{
    kvf_connector_h conn = arg;
    char why[sizeof(answer->why)];
    bool corrupt = false;

    if ((msg->op == KVF_LEASE_OP_RELEASE) && (msg->status == KVF_OK) &&
        (msg->num_digests > 0)) {
        corrupt = kvf_conn_digests_differ(conn, msg, why, sizeof(why));   /* before it frees */
    }
    conn->lease_func(conn->lease_arg, requester, msg, peer_timeout_ms, answer);
    if (corrupt && (answer->verdict == KVF_LEASE_VALID)) {
        kvf_warn("ucx connector %s: release of request %s from %s: %s", conn->engine_id,
                 msg->request_id, requester, why);
        answer->verdict = KVF_LEASE_CORRUPT;
        snprintf(answer->why, sizeof(answer->why), "%s", why);
    }
}

kvf_status_t kvf_conn_set_lease_handler(kvf_connector_h conn, kvf_connector_lease_func_t func,
                                        void *arg)
{
    if (conn->role != KVF_CONNECTOR_ROLE_PREFILL) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (conn->server != NULL) {
        return KVF_ERR_BUSY;
    }
    conn->lease_func = func;
    conn->lease_arg = arg;
    return KVF_OK;
}

/* Leader thread only, like handshake; the client is not shared with rank threads. */
kvf_status_t kvf_conn_lease(kvf_connector_h conn, const char *engine_id, const char *host,
                            int port, const kvf_lease_msg_t *msg, kvf_lease_answer_t *answer_p)
{
    if ((conn->role != KVF_CONNECTOR_ROLE_DECODE) || (engine_id == NULL) || (host == NULL) ||
        (msg == NULL) || (answer_p == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    KVF_CONN_CHECK_LEADER(conn, "lease");
    return kvf_side_channel_lease(conn->client, engine_id, host, port, msg, answer_p);
}

kvf_status_t kvf_conn_lease_start(kvf_connector_h conn, const kvf_connector_peer_t *peer,
                                  const kvf_lease_msg_t *msg, uint64_t *ticket_p)
{
    if ((conn->role != KVF_CONNECTOR_ROLE_DECODE) || (peer == NULL) ||
        (peer->engine_id == NULL) || (peer->host == NULL) || (msg == NULL) ||
        (ticket_p == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    KVF_CONN_CHECK_LEADER(conn, "lease_start");
    return kvf_side_channel_lease_start(conn->client, peer->engine_id, peer->host, peer->port,
                                        msg, ticket_p);
}

kvf_status_t kvf_conn_lease_poll(kvf_connector_h conn, uint64_t ticket,
                                 kvf_lease_answer_t *answer_p)
{
    KVF_CONN_CHECK_LEADER(conn, "lease_poll");
    if (conn->client == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_side_channel_lease_poll(conn->client, ticket, answer_p);
}

void kvf_conn_cancel(kvf_connector_h conn, uint64_t ticket)
{
    int i;

    KVF_CONN_CHECK_LEADER(conn, "cancel");
    if (conn->client == NULL) {
        return;
    }
    i = kvf_conn_hs_find(conn, ticket);
    if (i >= 0) {
        conn->hs[i] = conn->hs[--conn->num_hs];
    }
    kvf_side_channel_cancel(conn->client, ticket);
}

bool kvf_conn_side_wait(kvf_connector_h conn, int timeout_ms)
{
    KVF_CONN_CHECK_LEADER(conn, "side_wait");
    return (conn->client != NULL) && kvf_side_channel_wait(conn->client, timeout_ms);
}

kvf_status_t kvf_conn_forget_engine(kvf_connector_h conn, const char *engine_id)
{
    int e;
    int forgotten = 0;

    KVF_CONN_CHECK_LEADER(conn, "forget_engine");
    kvf_conn_check_every_rank(conn, "connector forget_engine (closes every rank's endpoints: "
                              "the leader must drive every rank)");
    while ((e = (engine_id != NULL) ? kvf_conn_find_engine(conn, engine_id) : -1) >= 0) {
        for (int r = 0; r < conn->tp; ++r) {
            kvf_conn_rank_t *rk = &conn->ranks[r];
            for (int p = 0; (rk->peers[e] != NULL) && (p < rk->peers_tp[e]); ++p) {
                kvf_ucx_peer_destroy(rk->peers[e][p]);   /* bounded by the agent timeout */
            }
            free(rk->peers[e]);
            rk->peers[e] = NULL;
        }
        pthread_mutex_lock(&conn->lock);
        kvf_side_channel_forget(conn->client, engine_id);
        kvf_conn_engine_clear_locked(conn, e);
        pthread_mutex_unlock(&conn->lock);
        ++forgotten;
    }
    if (forgotten == 0) {
        return KVF_ERR_NOT_FOUND;
    }
    kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "ucx connector %s: forgot engine %s; the next request"
            " handshakes again", conn->engine_id, engine_id);
    return KVF_OK;
}

kvf_status_t kvf_conn_remote_incarnation(kvf_connector_h conn, const char *engine_id,
                                         uint64_t *incarnation_p)
{
    int e;

    KVF_CONN_CHECK_LEADER(conn, "remote_incarnation");
    e = (engine_id != NULL) ? kvf_conn_find_engine(conn, engine_id) : -1;
    if (e < 0) {
        return KVF_ERR_NOT_FOUND;
    }
    *incarnation_p = conn->engines[e].ranks[0].incarnation;
    return KVF_OK;
}
