/*
 * kvf-proxy edge wake-ups (see the header). One mutex guards the list of
 * suspended requests and the resume queue; an eventfd wakes the edge
 * thread for the queue, and a 10 ms tick checks wake times, the cancel
 * flag and (every 100 ms, one poll() over all their sockets) departures.
 *
 * Rejected: resuming from the notify callback itself (it runs under the
 * pool's lock, and the library's resume takes the library's own lock: one
 * lock order fewer to reason about), and a timer per request (the tick
 * costs one pass over the suspended list; deadlines are seconds).
 */
#define _GNU_SOURCE
#include "kvf_proxy_edge.h"
#include "kvf_proxy_flow.h"
#include "kvf_log.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define KVF_PROXY_EDGE_TICK_MS  10
#define KVF_PROXY_EDGE_GONE_MS  100
#define KVF_PROXY_EDGE_BATCH    256

struct kvf_proxy_edge {
    pthread_mutex_t    lock;
    kvf_proxy_wait_t  *head;          /* suspended */
    kvf_proxy_wait_t  *ready;         /* to resume (LIFO; order does not matter) */
    unsigned           count;
    bool               stopping;
    const atomic_bool *cancel;
    int                efd;
    pthread_t          thread;
    struct pollfd     *pfd;           /* edge thread: departure check scratch */
    kvf_proxy_wait_t **pfd_w;
    size_t             pfd_cap;
};

/* Take @a w off the suspended list (lock held); the caller resumes its connection. */
static struct MHD_Connection *kvf_proxy_edge_unlink(struct kvf_proxy_edge *e, kvf_proxy_wait_t *w)
{
    if (w->prev != NULL) {
        w->prev->next = w->next;
    } else {
        e->head = w->next;
    }
    if (w->next != NULL) {
        w->next->prev = w->prev;
    }
    w->prev = w->next = NULL;
    w->suspended = false;
    w->queued = false;
    e->count--;
    return w->conn;
}

/* Queue @a w for resumption (lock held). */
static void kvf_proxy_edge_queue(struct kvf_proxy_edge *e, kvf_proxy_wait_t *w)
{
    if (w->suspended && !w->queued) {
        w->queued = true;
        w->ready_next = e->ready;
        e->ready = w;
    }
}

/* Resume what is queued, in batches, the lock not held while resuming. */
static void kvf_proxy_edge_resume_queued(struct kvf_proxy_edge *e)
{
    struct MHD_Connection *batch[KVF_PROXY_EDGE_BATCH];

    for (;;) {
        size_t n = 0;

        pthread_mutex_lock(&e->lock);
        while ((e->ready != NULL) && (n < KVF_PROXY_EDGE_BATCH)) {
            kvf_proxy_wait_t *w = e->ready;
            e->ready = w->ready_next;
            w->ready_next = NULL;
            batch[n++] = kvf_proxy_edge_unlink(e, w);
        }
        pthread_mutex_unlock(&e->lock);
        if (n == 0) {
            return;
        }
        /* still suspended in the library until here, so neither is freed */
        for (size_t i = 0; i < n; ++i) {
            MHD_resume_connection(batch[i]);
        }
    }
}

/* Queue the requests whose client hung up (lock held). */
static void kvf_proxy_edge_check_gone(struct kvf_proxy_edge *e)
{
    size_t n = 0;

    if (e->count > e->pfd_cap) {
        size_t cap = (size_t)e->count * 2;
        struct pollfd *p = realloc(e->pfd, cap * sizeof(*p));
        kvf_proxy_wait_t **pw = (p != NULL) ? realloc(e->pfd_w, cap * sizeof(*pw)) : NULL;

        if (p != NULL) {
            e->pfd = p;
        }
        if (pw == NULL) {
            return;   /* next time */
        }
        e->pfd_w = pw;
        e->pfd_cap = cap;
    }
    for (kvf_proxy_wait_t *w = e->head; (w != NULL) && (n < e->pfd_cap); w = w->next) {
        if (w->fd >= 0) {
            e->pfd[n].fd = w->fd;
            e->pfd[n].events = POLLRDHUP;
            e->pfd[n].revents = 0;
            e->pfd_w[n++] = w;
        }
    }
    if ((n == 0) || (poll(e->pfd, (nfds_t)n, 0) <= 0)) {
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        if (e->pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
            kvf_proxy_edge_queue(e, e->pfd_w[i]);
        }
    }
}

/* The tick: queue what is due, cancelled, gone or (stopping) everything. */
static void kvf_proxy_edge_tick(struct kvf_proxy_edge *e, bool gone_check)
{
    int64_t now = kvf_proxy_now_us();
    bool all;

    pthread_mutex_lock(&e->lock);
    all = e->stopping || ((e->cancel != NULL) && atomic_load(e->cancel));
    for (kvf_proxy_wait_t *w = e->head; w != NULL; w = w->next) {
        if (all || (now >= w->wake_us)) {
            kvf_proxy_edge_queue(e, w);
        }
    }
    if (gone_check && !all) {
        kvf_proxy_edge_check_gone(e);
    }
    pthread_mutex_unlock(&e->lock);
}

static void *kvf_proxy_edge_main(void *arg)
{
    struct kvf_proxy_edge *e = arg;
    int64_t next_tick = 0, next_gone = 0;

    for (;;) {
        struct pollfd p = {.fd = e->efd, .events = POLLIN};
        int64_t now = kvf_proxy_now_us();
        bool stop;
        uint64_t v;

        if (now >= next_tick) {
            bool gone = (now >= next_gone);
            kvf_proxy_edge_tick(e, gone);
            next_tick = now + KVF_PROXY_EDGE_TICK_MS * 1000;
            next_gone = gone ? now + KVF_PROXY_EDGE_GONE_MS * 1000 : next_gone;
        }
        kvf_proxy_edge_resume_queued(e);
        pthread_mutex_lock(&e->lock);
        stop = e->stopping && (e->head == NULL);
        pthread_mutex_unlock(&e->lock);
        if (stop) {
            return NULL;
        }
        if ((poll(&p, 1, (int)((next_tick - now + 999) / 1000)) > 0) &&
            (read(e->efd, &v, sizeof(v)) < 0) && (errno != EAGAIN)) {
            kvf_debug("edge eventfd read failed: %m");
        }
    }
}

kvf_status_t kvf_proxy_edge_create(const atomic_bool *cancel, kvf_proxy_edge_h *edge_p)
{
    struct kvf_proxy_edge *e = calloc(1, sizeof(*e));

    if (e == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    e->cancel = cancel;
    e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->efd < 0) {
        kvf_error("cannot create the HTTP edge's eventfd: %m");
        free(e);
        return KVF_ERR_NO_RESOURCE;
    }
    pthread_mutex_init(&e->lock, NULL);
    if (pthread_create(&e->thread, NULL, kvf_proxy_edge_main, e) != 0) {
        kvf_error("cannot start the HTTP edge thread");
        pthread_mutex_destroy(&e->lock);
        close(e->efd);
        free(e);
        return KVF_ERR_NO_RESOURCE;
    }
    *edge_p = e;
    return KVF_OK;
}

static void kvf_proxy_edge_wake(struct kvf_proxy_edge *e)
{
    uint64_t one = 1;

    if (write(e->efd, &one, sizeof(one)) < 0) {
        kvf_debug("edge eventfd write failed: %m");   /* saturated: a wakeup is pending */
    }
}

void kvf_proxy_edge_stop(kvf_proxy_edge_h e)
{
    if (e == NULL) {
        return;
    }
    pthread_mutex_lock(&e->lock);
    e->stopping = true;
    for (kvf_proxy_wait_t *w = e->head; w != NULL; w = w->next) {
        kvf_proxy_edge_queue(e, w);
    }
    pthread_mutex_unlock(&e->lock);
    kvf_proxy_edge_wake(e);
    pthread_join(e->thread, NULL);
}

void kvf_proxy_edge_destroy(kvf_proxy_edge_h e)
{
    if (e == NULL) {
        return;
    }
    pthread_mutex_destroy(&e->lock);
    close(e->efd);
    free(e->pfd);
    free(e->pfd_w);
    free(e);
}

bool kvf_proxy_edge_suspend(kvf_proxy_edge_h e, kvf_proxy_wait_t *w, int64_t wake_us)
{
    pthread_mutex_lock(&e->lock);
    if (w->pending || e->stopping) {
        w->pending = false;
        pthread_mutex_unlock(&e->lock);
        return false;
    }
    w->suspended = true;
    w->wake_us = wake_us;
    w->prev = NULL;
    w->next = e->head;
    if (e->head != NULL) {
        e->head->prev = w;
    }
    e->head = w;
    e->count++;
    /* under the lock: no resume can come before the suspension */
    MHD_suspend_connection(w->conn);
    pthread_mutex_unlock(&e->lock);
    return true;
}

void kvf_proxy_edge_notify(void *arg)
{
    kvf_proxy_wait_t *w = arg;
    struct kvf_proxy_edge *e = w->edge;
    bool wake;

    pthread_mutex_lock(&e->lock);
    w->pending = true;
    wake = w->suspended && !w->queued;
    kvf_proxy_edge_queue(e, w);
    pthread_mutex_unlock(&e->lock);
    if (wake) {
        kvf_proxy_edge_wake(e);
    }
}

unsigned kvf_proxy_edge_suspended(kvf_proxy_edge_h e)
{
    unsigned n;

    pthread_mutex_lock(&e->lock);
    n = e->count;
    pthread_mutex_unlock(&e->lock);
    return n;
}
