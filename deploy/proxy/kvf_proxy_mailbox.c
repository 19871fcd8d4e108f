/*
 * kvf-proxy calls and their mailboxes. A request thread serializes its
 * ServeRequest, appends it to the pool's send queue under pool->lock and
 * wakes the I/O thread through the eventfd; replies come back by
 * (instance, request_id) into the call's reply list, signalled by its
 * condition variable (see kvf_proxy_pool.h for the calls).
 */
#define _GNU_SOURCE
#include "kvf_hash.h"
#include "kvf_proxy_pool_int.h"
#include "kvf_log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- mailboxes (pool->lock held) ---------------------------------------- */

/* The bucket of (role, instance index, request id). */
static unsigned kvf_proxy_call_hash(kvf_proxy_role_t role, int idx, const char *request_id)
{
    const uint64_t seed = ((uint64_t)(uint32_t)role << 32) | (uint32_t)idx;

    return (unsigned)kvf_hash64(request_id, strlen(request_id), seed) &
           (KVF_PROXY_CALL_BUCKETS - 1u);
}

struct kvf_proxy_call *kvf_proxy_call_find(struct kvf_proxy_pool *pool, kvf_proxy_role_t role,
                                           int idx, const char *request_id)
{
    unsigned b = kvf_proxy_call_hash(role, idx, request_id);

    for (struct kvf_proxy_call *c = pool->buckets[b]; c != NULL; c = c->hnext) {
        if ((c->role == role) && (c->idx == idx) && (strcmp(c->request_id, request_id) == 0)) {
            return c;
        }
    }
    return NULL;
}

void kvf_proxy_call_unload_locked(struct kvf_proxy_call *c)
{
    kvf_proxy_instance_info_t *info = &c->pool->inst[c->role][c->idx].info;

    if (!c->load_open) {
        return;
    }
    c->load_open = false;
    info->outstanding -= (info->outstanding > 0) ? 1 : 0;
    info->outstanding_tokens -= (info->outstanding_tokens >= c->load_tokens) ? c->load_tokens :
                                info->outstanding_tokens;
}

void kvf_proxy_call_fail_locked(struct kvf_proxy_call *c, kvf_status_t status, const char *msg)
{
    kvf_proxy_call_unload_locked(c);
    if (c->failed == KVF_OK) {
        c->failed = status;
        snprintf(c->fail_msg, sizeof(c->fail_msg), "%s", msg);
    }
    pthread_cond_broadcast(&c->cond);
    if (c->notify != NULL) {
        c->notify(c->notify_arg);
    }
}

/*
 * Fail the calls of INST whose request was sent before the instance's
 * connection was last lost. A call sent since went to the new connection (a
 * restarted daemon) and is left to its reply or its own timeout.
 */
void kvf_proxy_inst_fail_calls_locked(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                      kvf_status_t status, const char *msg)
{
    for (struct kvf_proxy_call *c = pool->calls; c != NULL; c = c->next) {
        if ((c->role == inst->role) && (c->idx == inst->idx) && (c->sent_epoch >= 0) &&
            (c->sent_epoch < inst->epoch)) {
            kvf_proxy_call_fail_locked(c, status, msg);
        }
    }
}

bool kvf_proxy_call_deliver_locked(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                   Kvf__ServeReply *r)
{
    struct kvf_proxy_call *c = kvf_proxy_call_find(pool, inst->role, inst->idx,
                                                   r->request_id ? r->request_id : "");
    kvf_proxy_reply_node_t *n = (c != NULL) ? calloc(1, sizeof(*n)) : NULL;

    if (n == NULL) {
        return false;
    }
    n->reply = r;
    /* answered (prefill's one reply) or finished (decode's last, or an error): the
     * instance no longer works on it for this call */
    if ((r->has_done && r->done) || (r->has_status && (r->status != 0))) {
        if (c->load_open && (c->role == KVF_PROXY_ROLE_PREFILL) &&
            !(r->has_status && (r->status != 0))) {
            kvf_proxy_route_on_answer_locked(inst, c);
        }
        kvf_proxy_call_unload_locked(c);
    }
    if (c->tail != NULL) {
        c->tail->next = n;
    } else {
        c->head = n;
    }
    c->tail = n;
    pthread_cond_broadcast(&c->cond);
    if (c->notify != NULL) {
        c->notify(c->notify_arg);
    }
    return true;
}

void kvf_proxy_call_set_notify(kvf_proxy_call_h call, kvf_proxy_call_notify_t fn, void *arg)
{
    pthread_mutex_lock(&call->pool->lock);
    call->notify = fn;
    call->notify_arg = arg;
    if ((fn != NULL) && ((call->head != NULL) || (call->failed != KVF_OK))) {
        fn(arg);
    }
    pthread_mutex_unlock(&call->pool->lock);
}

static kvf_status_t kvf_proxy_enqueue(struct kvf_proxy_pool *pool, kvf_proxy_role_t role, int idx,
                                      const char *request_id, const Kvf__ServeRequest *req)
{
    size_t len = kvf__serve_request__get_packed_size(req);
    kvf_proxy_msg_t *m = malloc(sizeof(*m) + len);
    uint64_t one = 1;

    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->next = NULL;
    m->role = role;
    m->idx = idx;
    snprintf(m->request_id, sizeof(m->request_id), "%s", request_id);
    m->len = kvf__serve_request__pack(req, m->data);
    pthread_mutex_lock(&pool->lock);
    if (pool->sendq_tail != NULL) {
        pool->sendq_tail->next = m;
    } else {
        pool->sendq_head = m;
    }
    pool->sendq_tail = m;
    pthread_mutex_unlock(&pool->lock);
    if (write(pool->efd, &one, sizeof(one)) < 0) {
        kvf_debug("eventfd write failed: %m");   /* counter saturated: a wakeup is pending */
    }
    return KVF_OK;
}

kvf_status_t kvf_proxy_call_start(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx,
                                  const char *request_id, const Kvf__ServeRequest *req,
                                  kvf_proxy_call_h *call_p)
{
    struct kvf_proxy_call *c;
    pthread_condattr_t attr;
    kvf_status_t status;

    if ((idx < 0) || (idx >= pool->count[role]) || (strlen(request_id) >= sizeof(c->request_id))) {
        return KVF_ERR_INVALID_PARAM;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    c->pool = pool;
    c->role = role;
    c->idx = idx;
    c->sent_epoch = -1;
    snprintf(c->request_id, sizeof(c->request_id), "%s", request_id);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cond, &attr);
    pthread_condattr_destroy(&attr);

    /* Register before sending, so an instant reply finds its mailbox; prefill and
     * decode requests count in the instance's outstanding load until answered. */
    pthread_mutex_lock(&pool->lock);
    c->next = pool->calls;
    pool->calls = c;
    c->bucket = kvf_proxy_call_hash(role, idx, c->request_id);
    c->hnext = pool->buckets[c->bucket];
    pool->buckets[c->bucket] = c;
    if ((req->body_case == KVF__SERVE_REQUEST__BODY_PREFILL) ||
        (req->body_case == KVF__SERVE_REQUEST__BODY_DECODE)) {
        kvf_proxy_instance_info_t *info = &pool->inst[role][idx].info;

        c->load_open = true;
        c->load_tokens = (req->body_case == KVF__SERVE_REQUEST__BODY_PREFILL) ?
                         (uint32_t)req->prefill->n_prompt_tokens : 0;
        if (role == KVF_PROXY_ROLE_PREFILL) {
            kvf_proxy_route_on_send_locked(&pool->inst[role][idx], c);
        } else {
            /* every decode call is a flow's, which picked this instance with a reservation
             * (kvf_proxy_pool_pick_decode): the call's load replaces it */
            info->reserved -= (info->reserved > 0) ? 1 : 0;
        }
        info->outstanding++;
        info->outstanding_tokens += c->load_tokens;
    }
    pthread_mutex_unlock(&pool->lock);

    status = kvf_proxy_enqueue(pool, role, idx, request_id, req);
    if (status != KVF_OK) {
        kvf_proxy_call_end(c);
        return status;
    }
    *call_p = c;
    return KVF_OK;
}

kvf_status_t kvf_proxy_call_next(kvf_proxy_call_h call, int64_t timeout_ms,
                                 Kvf__ServeReply **reply_p, char *msg, size_t msg_cap)
{
    struct kvf_proxy_pool *pool = call->pool;
    kvf_status_t status = KVF_OK;
    struct timespec deadline;
    int rc = 0;

    deadline = kvf_time_deadline_ts(CLOCK_MONOTONIC, timeout_ms);   /* the cond's clock; < 0: now */
    pthread_mutex_lock(&pool->lock);
    while ((call->head == NULL) && (call->failed == KVF_OK) && (rc != ETIMEDOUT)) {
        rc = pthread_cond_timedwait(&call->cond, &pool->lock, &deadline);
    }
    if (call->head != NULL) {
        kvf_proxy_reply_node_t *n = call->head;
        call->head = n->next;
        if (call->head == NULL) {
            call->tail = NULL;
        }
        *reply_p = n->reply;
        free(n);
    } else if (call->failed != KVF_OK) {
        status = call->failed;
        if (msg != NULL) {
            snprintf(msg, msg_cap, "%s", call->fail_msg);
        }
    } else {
        status = KVF_ERR_PEER_TIMEOUT;
        if (msg != NULL) {
            snprintf(msg, msg_cap, "%s instance %s did not answer within %lld ms",
                     kvf_proxy_role_name(call->role), pool->inst[call->role][call->idx].url,
                     (long long)timeout_ms);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return status;
}

void kvf_proxy_call_end(kvf_proxy_call_h call)
{
    struct kvf_proxy_pool *pool;
    kvf_proxy_reply_node_t *n;

    if (call == NULL) {
        return;
    }
    pool = call->pool;
    pthread_mutex_lock(&pool->lock);
    kvf_proxy_call_unload_locked(call);
    for (struct kvf_proxy_call **pp = &pool->calls; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == call) {
            *pp = call->next;
            break;
        }
    }
    for (struct kvf_proxy_call **pp = &pool->buckets[call->bucket]; *pp != NULL;
         pp = &(*pp)->hnext) {
        if (*pp == call) {
            *pp = call->hnext;
            break;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    while ((n = call->head) != NULL) {
        call->head = n->next;
        kvf__serve_reply__free_unpacked(n->reply, NULL);
        free(n);
    }
    pthread_cond_destroy(&call->cond);
    free(call);
}

kvf_status_t kvf_proxy_pool_send(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx,
                                 const Kvf__ServeRequest *req)
{
    if ((idx < 0) || (idx >= pool->count[role])) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_proxy_enqueue(pool, role, idx, "", req);
}
