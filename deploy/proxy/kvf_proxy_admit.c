/*
 * kvf-proxy's admission queue (see kvf_proxy_admit.h): a doubly linked list
 * of the flows' own entries under one mutex, with the queued token count.
 * Design: head-only tries, each admission waking the next, so the order is
 * first come first served (within a priority) and an idle queue costs nothing.
 * An entry is inserted by a walk back from the tail past the higher priorities:
 * O(1) when every request has the same priority (the default). Rejected: every
 * waiting request polling the pool (hundreds of wake-ups per freed slot and
 * no order).
 */
#include "kvf_proxy_admit.h"

#include <pthread.h>
#include <stdlib.h>

struct kvf_proxy_admit {
    pthread_mutex_t          lock;
    kvf_proxy_admit_entry_t *head, *tail;
    uint64_t                 tokens;
    uint32_t                 count;
    uint64_t                 total;
    uint64_t                 max_bytes;
};

kvf_status_t kvf_proxy_admit_create(uint64_t max_bytes, kvf_proxy_admit_h *queue_p)
{
    struct kvf_proxy_admit *q = calloc(1, sizeof(*q));

    if (q == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&q->lock, NULL);
    q->max_bytes = max_bytes;
    *queue_p = q;
    return KVF_OK;
}

void kvf_proxy_admit_destroy(kvf_proxy_admit_h q)
{
    if (q != NULL) {
        pthread_mutex_destroy(&q->lock);
        free(q);
    }
}

/* Wake the head (q->lock held). */
static void kvf_proxy_admit_wake_locked(kvf_proxy_admit_h q)
{
    if ((q->head != NULL) && (q->head->notify != NULL)) {
        q->head->notify(q->head->notify_arg);
    }
}

/* Link @a e after @a prev (NULL: at the head); q->lock held. */
static void kvf_proxy_admit_link(kvf_proxy_admit_h q, kvf_proxy_admit_entry_t *prev,
                                 kvf_proxy_admit_entry_t *e)
{
    e->prev = prev;
    e->next = (prev != NULL) ? prev->next : q->head;
    if (e->next != NULL) {
        e->next->prev = e;
    } else {
        q->tail = e;
    }
    if (prev != NULL) {
        prev->next = e;
    } else {
        q->head = e;
    }
}

bool kvf_proxy_admit_enqueue(kvf_proxy_admit_h q, kvf_proxy_admit_entry_t *e, uint64_t tokens,
                             int64_t priority, kvf_proxy_call_notify_t notify, void *arg)
{
    kvf_proxy_admit_entry_t *prev;
    bool ok;

    pthread_mutex_lock(&q->lock);
    ok = (q->tokens + tokens) * KVF_PROXY_ADMIT_BYTES_PER_TOKEN <= q->max_bytes;
    if (ok) {
        e->notify = notify;
        e->notify_arg = arg;
        e->tokens = tokens;
        e->priority = priority;
        e->queued = true;
        prev = q->tail;   /* a burst of one priority appends: the walk stops at once */
        while ((prev != NULL) && (prev->priority > priority)) {
            prev = prev->prev;
        }
        kvf_proxy_admit_link(q, prev, e);
        q->tokens += tokens;
        q->count++;
        q->total++;
        if ((prev == NULL) && (e->next != NULL)) {
            kvf_proxy_admit_wake_locked(q);   /* the new head tries; the old one waits */
        }
    }
    pthread_mutex_unlock(&q->lock);
    return ok;
}

bool kvf_proxy_admit_is_head(kvf_proxy_admit_h q, const kvf_proxy_admit_entry_t *e)
{
    bool head;

    pthread_mutex_lock(&q->lock);
    head = (q->head == e);
    pthread_mutex_unlock(&q->lock);
    return head;
}

void kvf_proxy_admit_remove(kvf_proxy_admit_h q, kvf_proxy_admit_entry_t *e)
{
    pthread_mutex_lock(&q->lock);
    if (e->queued) {
        if (e->prev != NULL) {
            e->prev->next = e->next;
        } else {
            q->head = e->next;
        }
        if (e->next != NULL) {
            e->next->prev = e->prev;
        } else {
            q->tail = e->prev;
        }
        e->prev = e->next = NULL;
        e->queued = false;
        q->tokens -= e->tokens;
        q->count--;
        kvf_proxy_admit_wake_locked(q);
    }
    pthread_mutex_unlock(&q->lock);
}

void kvf_proxy_admit_kick(kvf_proxy_admit_h q)
{
    if (q == NULL) {
        return;
    }
    pthread_mutex_lock(&q->lock);
    kvf_proxy_admit_wake_locked(q);
    pthread_mutex_unlock(&q->lock);
}

kvf_proxy_admit_stats_t kvf_proxy_admit_stats(kvf_proxy_admit_h q)
{
    kvf_proxy_admit_stats_t st;

    pthread_mutex_lock(&q->lock);
    st = (kvf_proxy_admit_stats_t){.count = q->count, .tokens = q->tokens, .total = q->total};
    pthread_mutex_unlock(&q->lock);
    return st;
}

uint64_t kvf_proxy_admit_max_bytes(kvf_proxy_admit_h q)
{
    return q->max_bytes;
}
