/*
 * Lease table as a flat array with swap-remove under one mutex. Leases live
 * for one transfer (milliseconds to seconds) and a prefill instance holds at
 * most as many as it has running requests (plus bounded tombstones), so a
 * linear scan beats a hash map in both code and time at these sizes.
 *
 * States: HELD -> DONE (every decode rank released in time; collect frees)
 *         HELD -> QUARANTINED (expired or aborted; collect frees when the
 *                 quarantine ends) -> GONE (a tombstone: no owner, answers
 *                 late releases, dropped after KVF_LEASE_TOMBSTONE_MS).
 * The mutex is taken for microseconds (no I/O under it), so the side
 * channel thread never waits behind an engine step.
 */
#include "kvf_lease.h"
#include "kvf_log.h"
#include "kvf_array.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_LEASE_MAX_TOMBSTONES 4096
#define KVF_LEASE_RANK_WORDS     ((KVF_XFER_MAX_TP + 63) / 64)

typedef enum {
    KVF_LEASE_HELD = 0,
    KVF_LEASE_DONE,
    KVF_LEASE_QUARANTINED,
    KVF_LEASE_GONE,
} kvf_lease_state_t;

typedef struct {
    char              id[KVF_LEASE_ID_MAX];
    char              engine[KVF_ENGINE_ID_MAX];   /* "" until claimed */
    uint64_t          nonce;
    kvf_lease_state_t state;
    bool              ended_invalid;   /* expired or aborted: reads do not count */
    uint64_t          expiry_ms;       /* HELD */
    uint64_t          until_ms;        /* QUARANTINED: end; GONE: forget time */
    int               decode_tp;       /* 0 until the first release */
    int               num_released;
    uint64_t          ranks[KVF_LEASE_RANK_WORDS];
    int               num_blocks;
    void             *owner;
    bool              ids_bound;       /* claims and releases must carry ids_digest */
    uint64_t          ids_digest;      /* kvf_xfer_ids_digest() of the leased lists */
} kvf_lease_t;

struct kvf_lease_table {
    pthread_mutex_t   lock;
    kvf_lease_t      *leases;
    size_t            count;
    size_t            capacity;
    size_t            tombstones;
    uint64_t          quarantine_ms;
    kvf_lease_stats_t stats;
};

kvf_status_t kvf_lease_table_create(kvf_lease_table_h *table_p)
{
    struct kvf_lease_table *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&t->lock, NULL);
    *table_p = t;
    return KVF_OK;
}

void kvf_lease_table_destroy(kvf_lease_table_h table)
{
    if (table != NULL) {
        pthread_mutex_destroy(&table->lock);
        free(table->leases);
        free(table);
    }
}

static kvf_lease_t *kvf_lease_find(kvf_lease_table_h t, const char *id)
{
    for (size_t i = 0; (id != NULL) && (i < t->count); ++i) {
        if (strcmp(t->leases[i].id, id) == 0) {
            return &t->leases[i];
        }
    }
    return NULL;
}

static void kvf_lease_remove_at(kvf_lease_table_h t, size_t i)
{
    if (t->leases[i].state == KVF_LEASE_GONE) {
        t->tombstones--;
    }
    t->leases[i] = t->leases[--t->count];
}

kvf_status_t kvf_lease_table_add(kvf_lease_table_h table, const char *request_id,
                                 uint64_t nonce, uint64_t now_ms, uint64_t ttl_ms,
                                 int num_blocks, void *owner)
{
    size_t len = (request_id != NULL) ? strlen(request_id) : 0;
    kvf_status_t status = KVF_OK;
    kvf_lease_t *l;

    if ((len == 0) || (len >= KVF_LEASE_ID_MAX) || (owner == NULL)) {
        kvf_error("lease: request id must be 1..%d bytes", KVF_LEASE_ID_MAX - 1);
        return KVF_ERR_INVALID_PARAM;
    }
    pthread_mutex_lock(&table->lock);
    l = kvf_lease_find(table, request_id);
    if ((l != NULL) && (l->state != KVF_LEASE_GONE)) {
        kvf_error("lease: request %s is already held", request_id);
        status = KVF_ERR_INVALID_PARAM;
        goto out;
    }
    if (l == NULL) {
        if (KVF_ARRAY_GROW(table->leases, table->capacity, table->count + 1, 64) != KVF_OK) {
            status = KVF_ERR_NO_MEMORY;
            goto out;
        }
        l = &table->leases[table->count++];
    } else {
        table->tombstones--;   /* the tombstone becomes the new lease */
    }
    memset(l, 0, sizeof(*l));
    memcpy(l->id, request_id, len + 1);
    l->nonce = nonce;
    l->state = KVF_LEASE_HELD;
    l->expiry_ms = now_ms + ttl_ms;
    l->num_blocks = num_blocks;
    l->owner = owner;
out:
    pthread_mutex_unlock(&table->lock);
    return status;
}

kvf_status_t kvf_lease_table_bind_ids(kvf_lease_table_h table, const char *request_id,
                                      uint64_t ids_digest)
{
    kvf_status_t status = KVF_ERR_NOT_FOUND;
    kvf_lease_t *l;

    pthread_mutex_lock(&table->lock);
    l = kvf_lease_find(table, request_id);
    if ((l != NULL) && (l->state == KVF_LEASE_HELD)) {
        l->ids_bound = true;
        l->ids_digest = ids_digest;
        status = KVF_OK;
    }
    pthread_mutex_unlock(&table->lock);
    return status;
}

void kvf_lease_table_set_quarantine(kvf_lease_table_h table, uint64_t quarantine_ms)
{
    pthread_mutex_lock(&table->lock);
    table->quarantine_ms = quarantine_ms;
    pthread_mutex_unlock(&table->lock);
}

/* Into quarantine (expired or aborted) from @a now_ms; the caller holds the lock. */
static void kvf_lease_quarantine(kvf_lease_table_h t, kvf_lease_t *l, uint64_t now_ms)
{
    l->state = KVF_LEASE_QUARANTINED;
    l->ended_invalid = true;
    l->until_ms = now_ms + t->quarantine_ms;
    t->stats.quarantined_blocks += (uint64_t)l->num_blocks;
    t->stats.quarantined_now += (uint64_t)l->num_blocks;
}

static void kvf_lease_answer(kvf_lease_answer_t *a, kvf_lease_verdict_t v, uint64_t ms_left,
                             const char *fmt, const char *id, const char *extra)
{
    memset(a, 0, sizeof(*a));
    a->verdict = v;
    a->ms_left = ms_left;
    if (fmt != NULL) {
        snprintf(a->why, sizeof(a->why), fmt, id, extra);
    }
}

/*
 * Common checks of a claim or release: the lease exists, the nonce matches,
 * the engine is the one that claimed it, the block lists are the leased
 * ones. Every failure gets the same answer, so a probe cannot tell an
 * unknown request from a wrong nonce (no existence oracle); the log says
 * which. @return the lease, or NULL with @a a filled (refused, counted).
 */
static kvf_lease_t *kvf_lease_check(kvf_lease_table_h t, const char *id, uint64_t nonce,
                                    const char *engine, const uint64_t *ids_digest,
                                    kvf_lease_answer_t *a)
{
    kvf_lease_t *l = kvf_lease_find(t, id);
    const char *why = NULL;

    if (l == NULL) {
        why = "no such lease";
    } else if (l->nonce != nonce) {
        why = "wrong nonce (stale or forged transfer params)";
    } else if ((l->engine[0] != '\0') && (strcmp(l->engine, engine) != 0)) {
        why = "another decode engine holds it";
    } else if (l->ids_bound && ((ids_digest == NULL) || (*ids_digest != l->ids_digest))) {
        why = "the block ids differ from the leased ones";
    }
    if (why != NULL) {
        kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "lease operation on request %s by %s refused: %s",
                id, engine, why);
        kvf_lease_answer(a, KVF_LEASE_REFUSED, 0, "no lease matches request %s%s", id,
                         " (unknown, or another nonce, owner or block list)");
        t->stats.refused++;
        return NULL;
    }
    return l;
}

static void kvf_lease_claim_locked(kvf_lease_table_h table, const char *request_id,
                                   uint64_t nonce, const uint64_t *ids_digest,
                                   const char *engine, uint64_t now_ms, uint64_t ttl_ms,
                                   kvf_lease_answer_t *answer)
{
    kvf_lease_t *l = kvf_lease_check(table, request_id, nonce, engine, ids_digest, answer);

    if (l == NULL) {
        return;
    }
    if ((l->state == KVF_LEASE_HELD) && (now_ms >= l->expiry_ms)) {
        kvf_lease_quarantine(table, l, now_ms);   /* collect() had not run yet */
        table->stats.expired++;
    }
    if ((l->state == KVF_LEASE_QUARANTINED) || (l->ended_invalid)) {
        kvf_lease_answer(answer, KVF_LEASE_EXPIRED, 0,
                         "the KV lease of request %s has expired%s", request_id, "");
        table->stats.expired_answers++;
        return;
    }
    if ((l->state != KVF_LEASE_HELD) || (l->num_released > 0)) {
        kvf_lease_answer(answer, KVF_LEASE_REFUSED, 0,
                         "the lease of request %s was already released%s", request_id,
                         " (replayed transfer params)");
        table->stats.refused++;
        return;
    }
    snprintf(l->engine, sizeof(l->engine), "%s", engine);
    if ((ttl_ms <= UINT64_MAX - now_ms) && (now_ms + ttl_ms > l->expiry_ms)) {
        l->expiry_ms = now_ms + ttl_ms;
    }
    kvf_lease_answer(answer, KVF_LEASE_VALID, l->expiry_ms - now_ms, NULL, NULL, NULL);
}

void kvf_lease_table_claim(kvf_lease_table_h table, const char *request_id, uint64_t nonce,
                           const char *engine, uint64_t now_ms, uint64_t ttl_ms,
                           kvf_lease_answer_t *answer)
{
    pthread_mutex_lock(&table->lock);
    kvf_lease_claim_locked(table, request_id, nonce, NULL, engine, now_ms, ttl_ms, answer);
    pthread_mutex_unlock(&table->lock);
}

/* A release as it came off the wire; see kvf_lease_table_answer(). Lock held. */
typedef struct {
    const char     *id;
    uint64_t        nonce;
    const uint64_t *ids_digest;   /* NULL: none carried */
    const char     *engine;
    int             rank, tp;
    bool            all_ranks;
    kvf_status_t    status;       /* not OK: the pull failed or was abandoned */
} kvf_lease_rel_t;

/* Mark the released ranks; @return false (answer filled) for a replay or a tp change. */
static bool kvf_lease_mark_ranks(kvf_lease_table_h table, kvf_lease_t *l,
                                 const kvf_lease_rel_t *r, kvf_lease_answer_t *answer)
{
    uint64_t bit = 1ull << (r->rank % 64);

    if ((r->tp < 1) || (r->tp > KVF_XFER_MAX_TP) || (r->rank < 0) || (r->rank >= r->tp) ||
        ((l->decode_tp != 0) && (l->decode_tp != r->tp))) {
        kvf_lease_answer(answer, KVF_LEASE_REFUSED, 0,
                         "release of request %s names decode rank/tp %s", r->id,
                         "that differ from its first release");
        table->stats.refused++;
        return false;
    }
    if ((l->state == KVF_LEASE_DONE) || ((l->state == KVF_LEASE_GONE) && !l->ended_invalid) ||
        (r->all_ranks && (l->num_released > 0)) ||
        (!r->all_ranks && ((l->ranks[r->rank / 64] & bit) != 0))) {
        kvf_lease_answer(answer, KVF_LEASE_REFUSED, 0,
                         "request %s: this decode rank already released the lease%s", r->id,
                         " (a replay)");
        table->stats.refused++;
        return false;
    }
    l->decode_tp = r->tp;
    if (r->all_ranks) {
        for (int k = 0; k < r->tp; ++k) {
            l->ranks[k / 64] |= 1ull << (k % 64);
        }
        l->num_released = r->tp;
    } else {
        l->ranks[r->rank / 64] |= bit;
        l->num_released++;
    }
    return true;
}

static void kvf_lease_release_locked(kvf_lease_table_h table, const kvf_lease_rel_t *r,
                                     uint64_t now_ms, kvf_lease_answer_t *answer)
{
    kvf_lease_t *l = kvf_lease_check(table, r->id, r->nonce, r->engine, r->ids_digest, answer);

    if ((l == NULL) || !kvf_lease_mark_ranks(table, l, r, answer)) {
        return;
    }
    if (l->engine[0] == '\0') {
        snprintf(l->engine, sizeof(l->engine), "%s", r->engine);
    }
    if ((r->status != KVF_OK) && (l->num_released == l->decode_tp)) {
        /* the reader failed or gave up and force-closed its reads: nothing reads the
         * pages any more, so they go back now instead of after the lease (+ quarantine) */
        if (l->state == KVF_LEASE_HELD) {
            l->state = KVF_LEASE_DONE;
        } else if (l->state == KVF_LEASE_QUARANTINED) {
            /* an abort (the proxy's, racing this release over another channel) or
             * the expiry came first: the reader says it is done, the wait is cut */
            l->until_ms = now_ms;
            table->stats.quarantine_cut_blocks += (uint64_t)l->num_blocks;
        }
        table->stats.abandoned++;
        kvf_lease_answer(answer, KVF_LEASE_EXPIRED, 0, "the pull of request %s was abandoned%s",
                         r->id, ": its pages are freed");
        return;
    }
    if ((l->state == KVF_LEASE_HELD) && (now_ms >= l->expiry_ms)) {
        kvf_lease_quarantine(table, l, now_ms);
        table->stats.expired++;
    }
    if (l->state != KVF_LEASE_HELD) {
        kvf_lease_answer(answer, KVF_LEASE_EXPIRED, 0,
                         "the KV lease of request %s expired before the read finished%s",
                         r->id, "");
        table->stats.expired_answers++;
        return;
    }
    if (l->num_released == l->decode_tp) {
        l->state = KVF_LEASE_DONE;
        table->stats.released++;
    }
    kvf_lease_answer(answer, KVF_LEASE_VALID, l->expiry_ms - now_ms, NULL, NULL, NULL);
}

void kvf_lease_table_release(kvf_lease_table_h table, const char *request_id, uint64_t nonce,
                             const char *engine, int decode_rank, int decode_tp,
                             uint64_t now_ms, kvf_lease_answer_t *answer)
{
    kvf_lease_rel_t r = {request_id, nonce, NULL, engine, decode_rank, decode_tp, false, KVF_OK};

    pthread_mutex_lock(&table->lock);
    kvf_lease_release_locked(table, &r, now_ms, answer);
    pthread_mutex_unlock(&table->lock);
}

void kvf_lease_table_answer(kvf_lease_table_h table, const char *requester,
                            const kvf_lease_msg_t *msg, uint64_t now_ms, uint64_t ttl_ms,
                            kvf_lease_answer_t *answer)
{
    const uint64_t *ids = msg->has_ids_digest ? &msg->ids_digest : NULL;

    pthread_mutex_lock(&table->lock);
    if (msg->op == KVF_LEASE_OP_CLAIM) {
        kvf_lease_claim_locked(table, msg->request_id, msg->nonce, ids, requester, now_ms,
                               ttl_ms, answer);
    } else {
        kvf_lease_rel_t r = {msg->request_id, msg->nonce, ids, requester, msg->decode_rank,
                             msg->decode_tp, msg->all_ranks, msg->status};
        kvf_lease_release_locked(table, &r, now_ms, answer);
    }
    pthread_mutex_unlock(&table->lock);
}

bool kvf_lease_table_abort(kvf_lease_table_h table, const char *request_id, uint64_t now_ms)
{
    kvf_lease_t *l;
    bool found = false;

    pthread_mutex_lock(&table->lock);
    l = kvf_lease_find(table, request_id);
    if ((l != NULL) && (l->state == KVF_LEASE_HELD)) {
        kvf_lease_quarantine(table, l, now_ms);
        table->stats.aborted++;
        found = true;
    }
    pthread_mutex_unlock(&table->lock);
    return found;
}

size_t kvf_lease_table_collect(kvf_lease_table_h table, uint64_t now_ms, void **owners,
                               size_t cap, size_t *expired_p)
{
    size_t n = 0, expired = 0;
    size_t i = 0;

    pthread_mutex_lock(&table->lock);
    while ((i < table->count) && (n < cap)) {
        kvf_lease_t *l = &table->leases[i];
        if ((l->state == KVF_LEASE_HELD) && (now_ms >= l->expiry_ms)) {
            kvf_lease_quarantine(table, l, now_ms);
            table->stats.expired++;
            expired++;
        }
        if ((l->state == KVF_LEASE_DONE) ||
            ((l->state == KVF_LEASE_QUARANTINED) && (now_ms >= l->until_ms))) {
            if (l->state == KVF_LEASE_QUARANTINED) {
                table->stats.quarantined_now -= (uint64_t)l->num_blocks;
            }
            owners[n++] = l->owner;
            l->owner = NULL;
            l->state = KVF_LEASE_GONE;
            l->until_ms = now_ms + KVF_LEASE_TOMBSTONE_MS;
            table->tombstones++;
        }
        if ((l->state == KVF_LEASE_GONE) &&
            ((now_ms >= l->until_ms) || (table->tombstones > KVF_LEASE_MAX_TOMBSTONES))) {
            kvf_lease_remove_at(table, i);   /* i now holds the swapped-in lease */
            continue;
        }
        ++i;
    }
    pthread_mutex_unlock(&table->lock);
    if (expired_p != NULL) {
        *expired_p = expired;
    }
    return n;
}

size_t kvf_lease_table_count(kvf_lease_table_h table)
{
    size_t n = 0;
    pthread_mutex_lock(&table->lock);
    for (size_t i = 0; i < table->count; ++i) {
        n += (table->leases[i].state == KVF_LEASE_HELD);
    }
    pthread_mutex_unlock(&table->lock);
    return n;
}

size_t kvf_lease_table_pinned(kvf_lease_table_h table)
{
    size_t n = 0;
    pthread_mutex_lock(&table->lock);
    for (size_t i = 0; i < table->count; ++i) {
        n += (table->leases[i].state != KVF_LEASE_GONE);
    }
    pthread_mutex_unlock(&table->lock);
    return n;
}

uint64_t kvf_lease_table_next_event(kvf_lease_table_h table)
{
    uint64_t next = UINT64_MAX;
    pthread_mutex_lock(&table->lock);
    for (size_t i = 0; i < table->count; ++i) {
        const kvf_lease_t *l = &table->leases[i];
        uint64_t t = (l->state == KVF_LEASE_HELD) ? l->expiry_ms :
                     (l->state == KVF_LEASE_QUARANTINED) ? l->until_ms :
                     (l->state == KVF_LEASE_DONE) ? 0 : UINT64_MAX;
        if (t < next) {
            next = t;
        }
    }
    pthread_mutex_unlock(&table->lock);
    return next;
}

void kvf_lease_table_stats(kvf_lease_table_h table, kvf_lease_stats_t *stats_p)
{
    pthread_mutex_lock(&table->lock);
    *stats_p = table->stats;
    pthread_mutex_unlock(&table->lock);
}
