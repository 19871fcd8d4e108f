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
 * inactivity timeout: a client sending one byte per second keeps its
 * connection forever) and its per-address limit alone (it closes the socket
 * without an answer, and counts a load balancer as one client).
 *
 * Cost: opening a connection counts its client's connections (one pass over
 * the table) only when the per-client cap is on; the watchdog passes over
 * the table every 100 ms (thousands of slots: microseconds).
 */
#define _GNU_SOURCE   /* POLLRDHUP */
#include "kvf_proxy_conns.h"
#include "kvf_proxy_memtrim.h"
#include "kvf_time.h"
#include "kvf_log.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>

#define KVF_PROXY_WATCHDOG_MS 100
#define KVF_PROXY_TRUSTED_MAX 32
#define KVF_PROXY_ADDR_STR    64

struct kvf_proxy_conn_slot {
    kvf_proxy_conn_slot_t *prev, *next;
    int                    fd;
    char                   addr_str[KVF_PROXY_ADDR_STR];    /* the peer */
    char                   client[KVF_PROXY_ADDR_STR];      /* attributed to; "" when not counted */
    bool                   trusted_peer;  /* a --trusted-proxy: X-Forwarded-For names clients */
    bool                   over_total;    /* not admitted (decided at open) */
    bool                   over_client;   /* its client had max_per_client already */
    kvf_proxy_phase_t      phase;
    bool                   served;        /* answered at least one request */
    bool                   fired;         /* the watchdog shut it */
    int64_t                deadline_ms;   /* 0: none */
    uint32_t               gen;           /* phase changes so far */
    uint32_t               hup_gen;       /* gen + 1 when the last tick saw the peer gone */
};

struct kvf_proxy_conns {
    kvf_proxy_conns_params_t params;
    char                     trusted[KVF_PROXY_TRUSTED_MAX][KVF_PROXY_ADDR_STR];
    int                      num_trusted;
    pthread_mutex_t          lock;
    pthread_cond_t           cond;
    kvf_proxy_conn_slot_t   *head;
    unsigned                 count;
    unsigned                 admitted;
    uint64_t                 timeouts;
    bool                     stop;
    pthread_t                thread;
    struct pollfd           *pfd;         /* watchdog: hang-up check scratch */
    kvf_proxy_conn_slot_t  **pfd_slot;
    size_t                   pfd_cap;
    kvf_proxy_memtrim_t      trim;        /* watchdog: the peak since the last heap trim */
};

/* @a text (length @a len) as a numeric address in canonical form into @a out; false if not one. */
static bool kvf_proxy_addr_canon(const char *text, size_t len, char *out, size_t cap)
{
    struct addrinfo hints = {0}, *ai = NULL;
    char buf[KVF_PROXY_ADDR_STR];
    bool ok;

    while ((len > 0) && ((*text == ' ') || (*text == '\t'))) {
        text++;
        len--;
    }
    while ((len > 0) && ((text[len - 1] == ' ') || (text[len - 1] == '\t'))) {
        len--;
    }
    if ((len == 0) || (len >= sizeof(buf))) {
        return false;
    }
    memcpy(buf, text, len);
    buf[len] = '\0';
    hints.ai_flags = AI_NUMERICHOST;
    hints.ai_family = AF_UNSPEC;
    if (getaddrinfo(buf, NULL, &hints, &ai) != 0) {
        return false;
    }
    ok = (getnameinfo(ai->ai_addr, ai->ai_addrlen, out, (socklen_t)cap, NULL, 0,
                      NI_NUMERICHOST) == 0);
    freeaddrinfo(ai);
    return ok;
}

static bool kvf_proxy_is_trusted(const struct kvf_proxy_conns *c, const char *addr)
{
    for (int i = 0; i < c->num_trusted; ++i) {
        if (strcmp(c->trusted[i], addr) == 0) {
            return true;
        }
    }
    return false;
}

static kvf_status_t kvf_proxy_parse_trusted(struct kvf_proxy_conns *c, const char *list)
{
    const char *p = list;

    while ((p != NULL) && (*p != '\0')) {
        const char *comma = strchr(p, ',');
        size_t len = (comma != NULL) ? (size_t)(comma - p) : strlen(p);

        if (c->num_trusted == KVF_PROXY_TRUSTED_MAX) {
            kvf_error("--trusted-proxy: more than %d addresses", KVF_PROXY_TRUSTED_MAX);
            return KVF_ERR_INVALID_PARAM;
        }
        if (!kvf_proxy_addr_canon(p, len, c->trusted[c->num_trusted], KVF_PROXY_ADDR_STR)) {
            kvf_error("--trusted-proxy: '%.*s' is not a numeric IPv4 or IPv6 address "
                      "(list '%s')", (int)len, p, list);
            return KVF_ERR_INVALID_PARAM;
        }
        c->num_trusted++;
        p = (comma != NULL) ? comma + 1 : NULL;
    }
    return KVF_OK;
}

/*
 * Shut the connections whose client has closed its side (hang-up, nothing
 * left unread) while they wait for a request or its body: nothing more can
 * come. The library's edge-triggered epoll does not see a FIN that came
 * with the data it already read, so such a connection would wait out its
 * deadline. Acted on when two ticks in a row see it in the same phase (a
 * request the library has just read is handed over well within a tick); a
 * connection being answered (BUSY) is left alone: its client may still read.
 * Lock held.
 */
static void kvf_proxy_watchdog_hangups(struct kvf_proxy_conns *c)
{
    size_t n = 0;

    if (c->count > c->pfd_cap) {
        size_t cap = (size_t)c->count * 2;
        struct pollfd *p = realloc(c->pfd, cap * sizeof(*p));
        kvf_proxy_conn_slot_t **ps = (p != NULL) ? realloc(c->pfd_slot, cap * sizeof(*ps)) :
                                     NULL;

        if (p != NULL) {
            c->pfd = p;
        }
        if (ps == NULL) {
            return;   /* next tick */
        }
        c->pfd_slot = ps;
        c->pfd_cap = cap;
    }
    for (kvf_proxy_conn_slot_t *s = c->head; (s != NULL) && (n < c->pfd_cap); s = s->next) {
        if (!s->fired && (s->phase != KVF_PROXY_PHASE_BUSY)) {
            c->pfd[n].fd = s->fd;
            c->pfd[n].events = POLLRDHUP;
            c->pfd[n].revents = 0;
            c->pfd_slot[n++] = s;
        }
    }
    if ((n == 0) || (poll(c->pfd, (nfds_t)n, 0) <= 0)) {
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        kvf_proxy_conn_slot_t *s = c->pfd_slot[i];
        int unread = 0;

        if (!(c->pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) ||
            (ioctl(s->fd, FIONREAD, &unread) != 0) || (unread > 0)) {
            continue;
        }
        if (s->hup_gen != s->gen + 1) {
            s->hup_gen = s->gen + 1;   /* seen once; act if still so next tick */
            continue;
        }
        s->fired = true;
        kvf_debug("closing the connection from %s: the client closed it", s->addr_str);
        (void)shutdown(s->fd, SHUT_RDWR);
    }
}

static void *kvf_proxy_watchdog(void *arg)
{
    struct kvf_proxy_conns *c = arg;
    struct timespec ts;

    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        int64_t now = (int64_t)kvf_time_now_ms();

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
        kvf_proxy_watchdog_hangups(c);
        if (kvf_proxy_memtrim_due(&c->trim, c->count, now)) {
            unsigned open = c->count;

            pthread_mutex_unlock(&c->lock);   /* a trim takes the arenas' locks: not under ours */
            if (kvf_proxy_memtrim_run()) {
                kvf_debug("heap trimmed: a burst of connections is over (%u open now)", open);
            }
            pthread_mutex_lock(&c->lock);
        }
        ts = kvf_time_deadline_ts(CLOCK_MONOTONIC, KVF_PROXY_WATCHDOG_MS);   /* the cond's clock */
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

    if ((params->max_total == 0) || (params->header_timeout_ms <= 0) || (params->body_timeout_ms <= 0) ||
        (params->idle_timeout_ms <= 0)) {
        kvf_error("connection caps and client timeouts must be positive");
        return KVF_ERR_INVALID_PARAM;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    c->params = *params;
    c->params.trusted_proxies = NULL;   /* parsed here; the caller's string is not kept */
    if ((params->trusted_proxies != NULL) &&
        (kvf_proxy_parse_trusted(c, params->trusted_proxies) != KVF_OK)) {
        free(c);
        return KVF_ERR_INVALID_PARAM;
    }
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
    free(c->pfd);
    free(c->pfd_slot);
    free(c);
}

/* Attribute @a s to @a client under the per-client cap (lock held). */
static void kvf_proxy_attribute_locked(struct kvf_proxy_conns *c, kvf_proxy_conn_slot_t *s,
                                       const char *client)
{
    unsigned same = 0;

    s->client[0] = '\0';
    s->over_client = false;
    if ((c->params.max_per_client == 0) || s->over_total) {
        return;
    }
    for (kvf_proxy_conn_slot_t *o = c->head; o != NULL; o = o->next) {
        same += (o != s) && (strcmp(o->client, client) == 0);
    }
    s->over_client = (same >= c->params.max_per_client);
    if (!s->over_client) {
        snprintf(s->client, sizeof(s->client), "%s", client);
    }
}

kvf_proxy_conn_slot_t *kvf_proxy_conns_open(kvf_proxy_conns_h c, int fd,
                                            const struct sockaddr *addr)
{
    kvf_proxy_conn_slot_t *s = calloc(1, sizeof(*s));

    if (s == NULL) {
        return NULL;
    }
    s->fd = fd;
    if ((addr != NULL) && ((addr->sa_family == AF_INET) || (addr->sa_family == AF_INET6)) &&
        (getnameinfo(addr, (addr->sa_family == AF_INET6) ? sizeof(struct sockaddr_in6) :
                     sizeof(struct sockaddr_in), s->addr_str, sizeof(s->addr_str), NULL, 0,
                     NI_NUMERICHOST) != 0)) {
        s->addr_str[0] = '\0';
    }
    if (s->addr_str[0] == '\0') {
        snprintf(s->addr_str, sizeof(s->addr_str), "a local client");
    }
    s->trusted_peer = kvf_proxy_is_trusted(c, s->addr_str);
    pthread_mutex_lock(&c->lock);
    s->over_total = (c->admitted >= c->params.max_total);
    c->admitted += !s->over_total;
    if (!s->trusted_peer) {   /* a trusted proxy's connections count for their clients */
        kvf_proxy_attribute_locked(c, s, s->addr_str);
    }
    s->phase = KVF_PROXY_PHASE_HEADERS;
    s->deadline_ms = (int64_t)kvf_time_now_ms() + c->params.header_timeout_ms;
    s->next = c->head;
    if (c->head != NULL) {
        c->head->prev = s;
    }
    c->head = s;
    c->count++;
    pthread_mutex_unlock(&c->lock);
    return s;
}

kvf_proxy_admit_t kvf_proxy_conns_attribute(kvf_proxy_conns_h c, kvf_proxy_conn_slot_t *s,
                                            const char *forwarded_for)
{
    char client[KVF_PROXY_ADDR_STR] = "";

    if (s->trusted_peer && (c->params.max_per_client != 0)) {
        /* rightmost first: the entries left of a trusted hop are the client's word */
        const char *end = (forwarded_for != NULL) ? forwarded_for + strlen(forwarded_for) : NULL;

        while ((end != NULL) && (end > forwarded_for)) {
            const char *p = end;
            char addr[KVF_PROXY_ADDR_STR];

            while ((p > forwarded_for) && (p[-1] != ',')) {
                p--;
            }
            if (!kvf_proxy_addr_canon(p, (size_t)(end - p), addr, sizeof(addr))) {
                break;   /* not an address: trust nothing left of it */
            }
            snprintf(client, sizeof(client), "%s", addr);
            if (!kvf_proxy_is_trusted(c, addr)) {
                break;
            }
            end = (p > forwarded_for) ? p - 1 : p;
        }
        if (client[0] == '\0') {   /* no forwarded client named: the peer itself */
            snprintf(client, sizeof(client), "%s", s->addr_str);
        }
        pthread_mutex_lock(&c->lock);
        if ((strcmp(client, s->client) != 0) || s->over_client) {
            kvf_proxy_attribute_locked(c, s, client);
        }
        pthread_mutex_unlock(&c->lock);
    }
    return kvf_proxy_conns_admission(c, s);
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
    c->admitted -= !s->over_total;
    pthread_mutex_unlock(&c->lock);
    free(s);
}

int kvf_proxy_conns_sole_reading_fd(kvf_proxy_conns_h c)
{
    int fd = -1, n = 0;

    pthread_mutex_lock(&c->lock);
    for (kvf_proxy_conn_slot_t *o = c->head; (o != NULL) && (n < 2); o = o->next) {
        if (o->phase != KVF_PROXY_PHASE_BUSY) {
            fd = o->fd;
            n++;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return (n == 1) ? fd : -1;
}

kvf_proxy_admit_t kvf_proxy_conns_admission(kvf_proxy_conns_h c, const kvf_proxy_conn_slot_t *s)
{
    kvf_proxy_admit_t a;

    pthread_mutex_lock(&c->lock);
    a = s->over_total ? KVF_PROXY_ADMIT_OVER_TOTAL :
        s->over_client ? KVF_PROXY_ADMIT_OVER_CLIENT : KVF_PROXY_ADMIT_OK;
    pthread_mutex_unlock(&c->lock);
    return a;
}

void kvf_proxy_conns_phase(kvf_proxy_conns_h c, kvf_proxy_conn_slot_t *s,
                           kvf_proxy_phase_t phase)
{
    int64_t now = (int64_t)kvf_time_now_ms();

    pthread_mutex_lock(&c->lock);
    if ((phase == KVF_PROXY_PHASE_HEADERS) && (s->phase == KVF_PROXY_PHASE_BUSY)) {
        s->served = true;   /* an answer went out: keep-alive idle from here */
    }
    s->phase = phase;
    s->gen++;
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
