/*
 * Connection guard of kvf-proxy (see the header for the policy).
 *
 * Design: a doubly linked list of slots under one mutex, and one watchdog
 * thread that wakes every 100 ms and shuts the socket of every slot past
 * its deadline (shutdown(), not close(): the HTTP library still owns the
 * descriptor and closes it when its connection thread sees the EOF). The
 * slot is unregistered in the library's "closed" notification, which comes
 * before it closes the descriptor, and shutdown() runs under the lock, so
 * the watchdog never touches a descriptor number that was reused.
 * Rejected: the library's own connection timeout alone (it is an
 * inactivity timeout: a client sending one byte per second keeps a thread
 * forever) and its per-address limit alone (it closes the socket without an
 * answer).
 */
#include "kvf_proxy_conns.h"
#include "kvf_time.h"
#include "kvf_log.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KVF_PROXY_WATCHDOG_MS 100

struct kvf_proxy_conn_slot {
    kvf_proxy_conn_slot_t *prev, *next;
    int                    fd;
    struct sockaddr_storage addr;
    socklen_t              addr_len;      /* bytes of the address part compared */
    char                   addr_str[64];
    kvf_proxy_admit_t      admit;
    kvf_proxy_phase_t      phase;
    bool                   served;        /* answered at least one request */
    bool                   fired;         /* the watchdog shut it */
    bool                   claimed;       /* its connection thread named it (request line) */
    int64_t                deadline_ms;   /* 0: none */
};

struct kvf_proxy_conns {
    kvf_proxy_conns_params_t params;
    pthread_mutex_t          lock;
    pthread_cond_t           cond;
    kvf_proxy_conn_slot_t   *head;
    unsigned                 count;
    unsigned                 admitted;
    uint64_t                 timeouts;
    bool                     stop;
    pthread_t                thread;
};

static int64_t kvf_proxy_conns_now_ms(void)
{
    return (int64_t)(kvf_time_now_ns() / 1000000u);
}

static bool kvf_proxy_same_client(const kvf_proxy_conn_slot_t *a, const kvf_proxy_conn_slot_t *b)
{
    if (a->addr.ss_family != b->addr.ss_family) {
        return false;
    }
    if (a->addr.ss_family == AF_INET) {
        return ((const struct sockaddr_in *)&a->addr)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)&b->addr)->sin_addr.s_addr;
    }
    if (a->addr.ss_family == AF_INET6) {
        return memcmp(&((const struct sockaddr_in6 *)&a->addr)->sin6_addr,
                      &((const struct sockaddr_in6 *)&b->addr)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    }
    return true;   /* unix sockets and the like: one client */
}

static void *kvf_proxy_watchdog(void *arg)
{
    struct kvf_proxy_conns *c = arg;
    struct timespec ts;

    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        int64_t now = kvf_proxy_conns_now_ms();

        for (kvf_proxy_conn_slot_t *s = c->head; s != NULL; s = s->next) {
            const char *what, *flag;
            int64_t ms;

            if (s->fired || (s->deadline_ms == 0) || (now < s->deadline_ms)) {
                continue;
            }
            s->fired = true;
            c->timeouts++;
            if (s->phase == KVF_PROXY_PHASE_BODY) {
                what = "the request body";
                flag = "--body-timeout";
                ms = c->params.body_timeout_ms;
            } else if (s->served) {
                what = "next request";
                flag = "--idle-timeout";
                ms = c->params.idle_timeout_ms;
            } else {
                what = "complete request headers";
                flag = "--header-timeout";
                ms = c->params.header_timeout_ms;
            }
            kvf_info("closing the connection from %s: no %s within %s %lld ms", s->addr_str,
                     what, flag, (long long)ms);
            (void)shutdown(s->fd, SHUT_RDWR);
        }
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += KVF_PROXY_WATCHDOG_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->cond, &c->lock, &ts);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

kvf_status_t kvf_proxy_conns_create(const kvf_proxy_conns_params_t *params,
                                    kvf_proxy_conns_h *conns_p)
{
    struct kvf_proxy_conns *c;
    pthread_condattr_t attr;

    if ((params->max_total == 0) || (params->max_per_client == 0) ||
        (params->header_timeout_ms <= 0) || (params->body_timeout_ms <= 0) ||
        (params->idle_timeout_ms <= 0)) {
        kvf_error("connection caps and client timeouts must be positive");
        return KVF_ERR_INVALID_PARAM;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    c->params = *params;
    pthread_mutex_init(&c->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cond, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&c->thread, NULL, kvf_proxy_watchdog, c) != 0) {
        kvf_error("cannot start the connection watchdog thread");
        pthread_cond_destroy(&c->cond);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return KVF_ERR_NO_RESOURCE;
    }
    *conns_p = c;
    return KVF_OK;
}

void kvf_proxy_conns_destroy(kvf_proxy_conns_h c)
{
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL);
    while (c->head != NULL) {   /* the library closed every connection before */
        kvf_proxy_conn_slot_t *s = c->head;
        c->head = s->next;
        free(s);
    }
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

kvf_proxy_conn_slot_t *kvf_proxy_conns_open(kvf_proxy_conns_h c, int fd,
                                            const struct sockaddr *addr)
{
    kvf_proxy_conn_slot_t *s = calloc(1, sizeof(*s));
    unsigned same = 0;

    if (s == NULL) {
        return NULL;
    }
    s->fd = fd;
    if (addr != NULL) {
        size_t n = (addr->sa_family == AF_INET6) ? sizeof(struct sockaddr_in6) :
                   (addr->sa_family == AF_INET) ? sizeof(struct sockaddr_in) :
                                                  sizeof(struct sockaddr);
        memcpy(&s->addr, addr, n);
        s->addr_len = (socklen_t)n;
        if (addr->sa_family == AF_INET) {
            inet_ntop(AF_INET, &((const struct sockaddr_in *)addr)->sin_addr, s->addr_str,
                      sizeof(s->addr_str));
        } else if (addr->sa_family == AF_INET6) {
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)addr)->sin6_addr, s->addr_str,
                      sizeof(s->addr_str));
        }
    }
    if (s->addr_str[0] == '\0') {
        snprintf(s->addr_str, sizeof(s->addr_str), "a local client");
    }
    pthread_mutex_lock(&c->lock);
    for (kvf_proxy_conn_slot_t *o = c->head; o != NULL; o = o->next) {
        same += (o->admit == KVF_PROXY_ADMIT_OK) && kvf_proxy_same_client(o, s);
    }
    s->admit = (c->admitted >= c->params.max_total) ? KVF_PROXY_ADMIT_OVER_TOTAL :
               (same >= c->params.max_per_client) ? KVF_PROXY_ADMIT_OVER_CLIENT :
                                                    KVF_PROXY_ADMIT_OK;
    c->admitted += (s->admit == KVF_PROXY_ADMIT_OK);
    s->phase = KVF_PROXY_PHASE_HEADERS;
    s->deadline_ms = kvf_proxy_conns_now_ms() + c->params.header_timeout_ms;
    s->next = c->head;
    if (c->head != NULL) {
        c->head->prev = s;
    }
    c->head = s;
    c->count++;
    pthread_mutex_unlock(&c->lock);
    return s;
}

void kvf_proxy_conns_close(kvf_proxy_conns_h c, kvf_proxy_conn_slot_t *s)
{
    if (s == NULL) {
        return;
    }
    pthread_mutex_lock(&c->lock);
    if (s->prev != NULL) {
        s->prev->next = s->next;
    } else {
        c->head = s->next;
    }
    if (s->next != NULL) {
        s->next->prev = s->prev;
    }
    c->count--;
    c->admitted -= (s->admit == KVF_PROXY_ADMIT_OK);
    pthread_mutex_unlock(&c->lock);
    free(s);
}

int kvf_proxy_conns_claim(kvf_proxy_conns_h c, kvf_proxy_conn_slot_t *s)
{
    pthread_mutex_lock(&c->lock);
    s->claimed = true;
    pthread_mutex_unlock(&c->lock);
    return s->fd;
}

int kvf_proxy_conns_sole_unclaimed_fd(kvf_proxy_conns_h c)
{
    int fd = -1, n = 0;

    pthread_mutex_lock(&c->lock);
    for (kvf_proxy_conn_slot_t *o = c->head; (o != NULL) && (n < 2); o = o->next) {
        if (!o->claimed) {
            fd = o->fd;
            n++;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return (n == 1) ? fd : -1;
}

kvf_proxy_admit_t kvf_proxy_conns_admission(const kvf_proxy_conn_slot_t *s)
{
    return s->admit;
}

void kvf_proxy_conns_phase(kvf_proxy_conns_h c, kvf_proxy_conn_slot_t *s,
                           kvf_proxy_phase_t phase)
{
    int64_t now = kvf_proxy_conns_now_ms();

    pthread_mutex_lock(&c->lock);
    if ((phase == KVF_PROXY_PHASE_HEADERS) && (s->phase == KVF_PROXY_PHASE_BUSY)) {
        s->served = true;   /* an answer went out: keep-alive idle from here */
    }
    s->phase = phase;
    switch (phase) {
    case KVF_PROXY_PHASE_HEADERS:
        s->deadline_ms = now + (s->served ? c->params.idle_timeout_ms :
                                            c->params.header_timeout_ms);
        break;
    case KVF_PROXY_PHASE_BODY:
        s->deadline_ms = now + c->params.body_timeout_ms;
        break;
    default:
        s->deadline_ms = 0;
        break;
    }
    pthread_mutex_unlock(&c->lock);
}

uint64_t kvf_proxy_conns_timeouts(kvf_proxy_conns_h c)
{
    uint64_t n;

    pthread_mutex_lock(&c->lock);
    n = c->timeouts;
    pthread_mutex_unlock(&c->lock);
    return n;
}

unsigned kvf_proxy_conns_count(kvf_proxy_conns_h c)
{
    unsigned n;

    pthread_mutex_lock(&c->lock);
    n = c->count;
    pthread_mutex_unlock(&c->lock);
    return n;
}
