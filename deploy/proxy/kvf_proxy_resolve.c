/*
 * kvf-proxy name resolution: the endpoints named by host (a StatefulSet pod's
 * stable DNS name, as the Helm chart's endpoints ConfigMap lists them) are
 * resolved by this file's thread at every health round, and the I/O thread
 * connects each instance to the address its name has now.
 *
 * Design: the resolver thread calls the system resolver (getaddrinfo(3): so
 * /etc/resolv.conf, its search domains and ndots, and nsswitch apply, as in
 * any other program of the pod) for each name in turn, A records only (the
 * DEALERs are IPv4, as ZeroMQ's own resolution without ZMQ_IPV6 was), and
 * publishes the answers with a generation number. The I/O thread, which alone
 * touches sockets, compares them with what each instance is connected to on
 * every pass: a new address closes the instance's sockets and opens new ones
 * on it (the calls in flight fail as on a lost connection, after the same
 * grace), so a pod that came back elsewhere, or one whose name resolves for
 * the first time (the StatefulSet grew), is followed without a restart. A
 * name that stops resolving keeps its last address (a DNS outage must not cut
 * working connections); its error shows in /health all the same. A name with
 * several records keeps its address while it is among them, else takes the
 * first.
 * Rejected: leaving names to ZeroMQ (it resolves again only when it
 * reconnects, so a pod whose old address still answers is never followed,
 * and a name that does not resolve is only a silent reconnect loop, with no
 * reason in /health); resolving in the I/O thread (a DNS server that does not
 * answer would stall every request for glibc's timeout x attempts per name);
 * a thread per name (hundreds of threads; names resolve in microseconds when
 * the cluster DNS works, and when it does not, the addresses already known
 * stay connected while the round is slow). The resolver's state is its own,
 * with a reference count, so stopping the pool never waits on a slow
 * getaddrinfo(): the thread frees it when that call returns.
 */
#define _GNU_SOURCE
#include "kvf_proxy_pool_int.h"
#include "kvf_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

typedef struct kvf_proxy_dns_name {
    kvf_proxy_role_t role;
    int              idx;
    char             url[KVF_PROXY_URL_MAX];    /* as listed, for logs */
    char             host[KVF_PROXY_URL_MAX];
    char             port[8];
    /* under r->lock */
    char             addr[KVF_PROXY_URL_MAX];   /* "tcp://a.b.c.d:port"; "" none yet */
    char             error[KVF_PROXY_DNS_ERROR_MAX]; /* last failure; "" when it resolved */
} kvf_proxy_dns_name_t;

struct kvf_proxy_resolver {
    pthread_mutex_t       lock;
    pthread_cond_t        cond;
    bool                  stop;
    int                   refs;          /* the pool's and the thread's */
    int64_t               interval_ms;
    unsigned              gen;           /* bumped whenever an answer changes */
    int                   n;
    kvf_proxy_dns_name_t *names;
};

kvf_status_t kvf_proxy_endpoint_split(const char *url, char *host, size_t host_cap,
                                      char *port, size_t port_cap)
{
    const char *h, *colon;
    size_t n;
    struct in_addr a4;
    long p;
    char *end;

    host[0] = '\0';
    port[0] = '\0';
    if (strncmp(url, "tcp://", 6) != 0) {
        return KVF_OK;                    /* ipc://, inproc://: no name to resolve */
    }
    h = url + 6;
    colon = strrchr(h, ':');
    if ((h[0] == '[') || (strchr(h, ';') != NULL)) {
        return KVF_OK;                    /* an IPv6 address, or ZeroMQ's source;host form */
    }
    if ((colon == NULL) || (colon == h)) {
        kvf_error("bad endpoint '%s': expected tcp://HOST:PORT", url);
        return KVF_ERR_INVALID_PARAM;
    }
    n = (size_t)(colon - h);
    p = strtol(colon + 1, &end, 10);
    if ((colon[1] == '\0') || (*end != '\0') || (p <= 0) || (p > 65535)) {
        kvf_error("bad endpoint '%s': port '%s' is not in [1, 65535]", url, colon + 1);
        return KVF_ERR_INVALID_PARAM;
    }
    if (n >= host_cap) {
        kvf_error("bad endpoint '%s': host name over %zu characters", url, host_cap - 1);
        return KVF_ERR_INVALID_PARAM;
    }
    for (size_t i = 0; i < n; ++i) {
        char c = h[i];
        if (!(((c >= 'a') && (c <= 'z')) || ((c >= 'A') && (c <= 'Z')) ||
              ((c >= '0') && (c <= '9')) || (c == '-') || (c == '.') || (c == '_'))) {
            kvf_error("bad endpoint '%s': '%c' in host name '%.*s'", url, c, (int)n, h);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    memcpy(host, h, n);
    host[n] = '\0';
    if (inet_pton(AF_INET, host, &a4) == 1) {
        host[0] = '\0';                   /* already an address */
        return KVF_OK;
    }
    snprintf(port, port_cap, "%ld", p);
    return KVF_OK;
}

/* Resolve one name; its answer and error under r->lock. True when either changed. */
static bool kvf_proxy_dns_one(struct kvf_proxy_resolver *r, kvf_proxy_dns_name_t *nm)
{
    struct addrinfo hints, *res = NULL;
    char addr[KVF_PROXY_URL_MAX] = "", err[KVF_PROXY_DNS_ERROR_MAX] = "";
    char cur[KVF_PROXY_URL_MAX];
    bool changed, logged_err;
    int rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    pthread_mutex_lock(&r->lock);
    memcpy(cur, nm->addr, sizeof(cur));
    pthread_mutex_unlock(&r->lock);
    rc = getaddrinfo(nm->host, nm->port, &hints, &res);
    if (rc == 0) {
        for (const struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
            char ip[INET_ADDRSTRLEN], ep[KVF_PROXY_URL_MAX];
            const struct sockaddr_in *sin = (const struct sockaddr_in *)ai->ai_addr;

            if ((ai->ai_family != AF_INET) ||
                (inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip)) == NULL)) {
                continue;
            }
            snprintf(ep, sizeof(ep), "tcp://%s:%s", ip, nm->port);
            if ((addr[0] == '\0') || (strcmp(ep, cur) == 0)) {
                memcpy(addr, ep, sizeof(addr));   /* the first, or the one in use */
            }
        }
        freeaddrinfo(res);
        if (addr[0] == '\0') {
            snprintf(err, sizeof(err), "%s has no IPv4 address", nm->host);
        }
    } else if (rc == EAI_SYSTEM) {
        snprintf(err, sizeof(err), "%s does not resolve: %s", nm->host, strerror(errno));
    } else {
        snprintf(err, sizeof(err), "%s does not resolve: %s", nm->host, gai_strerror(rc));
    }
    pthread_mutex_lock(&r->lock);
    logged_err = (strcmp(err, nm->error) == 0);
    changed = !logged_err || ((addr[0] != '\0') && (strcmp(addr, nm->addr) != 0));
    if (addr[0] != '\0') {
        memcpy(nm->addr, addr, sizeof(nm->addr));   /* a failure keeps the last address */
    }
    memcpy(nm->error, err, sizeof(nm->error));
    if (changed) {
        r->gen++;
    }
    pthread_mutex_unlock(&r->lock);
    if (!logged_err && (err[0] != '\0')) {   /* once per distinct error, not every round */
        kvf_warn("%s endpoint %s: %s%s", kvf_proxy_role_name(nm->role), nm->url, err,
                 (cur[0] != '\0') ? " (its last address is kept)" : "");
    }
    return changed;
}

static void kvf_proxy_resolver_unref(struct kvf_proxy_resolver *r)
{
    bool last;

    pthread_mutex_lock(&r->lock);
    last = (--r->refs == 0);
    pthread_mutex_unlock(&r->lock);
    if (last) {
        pthread_cond_destroy(&r->cond);
        pthread_mutex_destroy(&r->lock);
        free(r->names);
        free(r);
    }
}

static void *kvf_proxy_resolver_main(void *arg)
{
    struct kvf_proxy_resolver *r = arg;

    for (;;) {
        struct timespec until;
        bool stop;

        for (int i = 0; i < r->n; ++i) {
            pthread_mutex_lock(&r->lock);
            stop = r->stop;
            pthread_mutex_unlock(&r->lock);
            if (stop) {
                goto out;
            }
            kvf_proxy_dns_one(r, &r->names[i]);
        }
        /* the next round one health interval on (CLOCK_REALTIME: the cond's clock) */
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += r->interval_ms / 1000;
        until.tv_nsec += (r->interval_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&r->lock);
        while (!r->stop && (pthread_cond_timedwait(&r->cond, &r->lock, &until) == 0)) {
        }
        stop = r->stop;
        pthread_mutex_unlock(&r->lock);
        if (stop) {
            break;
        }
    }
out:
    kvf_proxy_resolver_unref(r);
    return NULL;
}

kvf_status_t kvf_proxy_resolver_start(struct kvf_proxy_pool *pool)
{
    struct kvf_proxy_resolver *r;
    pthread_attr_t attr;
    pthread_t tid;
    int n = 0, rc;

    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            n += (pool->inst[role][i].host[0] != '\0');
        }
    }
    if (n == 0) {
        return KVF_OK;                       /* addresses only: nothing to resolve */
    }
    r = calloc(1, sizeof(*r));
    if ((r == NULL) || ((r->names = calloc((size_t)n, sizeof(*r->names))) == NULL)) {
        free(r);
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cond, NULL);
    r->refs = 2;
    r->interval_ms = pool->interval_ms;
    r->gen = 0;
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            const kvf_proxy_instance_t *inst = &pool->inst[role][i];
            kvf_proxy_dns_name_t *nm;

            if (inst->host[0] == '\0') {
                continue;
            }
            nm = &r->names[r->n++];
            nm->role = (kvf_proxy_role_t)role;
            nm->idx = i;
            memcpy(nm->url, inst->url, sizeof(nm->url));
            memcpy(nm->host, inst->host, sizeof(nm->host));
            memcpy(nm->port, inst->port, sizeof(nm->port));
        }
    }
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&tid, &attr, kvf_proxy_resolver_main, r);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        kvf_error("failed to start the proxy's resolver thread: %s", strerror(rc));
        r->refs = 1;
        kvf_proxy_resolver_unref(r);
        return KVF_ERR_NO_RESOURCE;
    }
    pool->resolver = r;
    pool->dns_gen = 0;     /* r->gen starts at 0 too: nothing to apply before an answer */
    return KVF_OK;
}

void kvf_proxy_resolver_stop(struct kvf_proxy_pool *pool)
{
    struct kvf_proxy_resolver *r = pool->resolver;

    if (r == NULL) {
        return;
    }
    pool->resolver = NULL;
    pthread_mutex_lock(&r->lock);
    r->stop = true;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    kvf_proxy_resolver_unref(r);    /* freed here, or by the thread once its call returns */
}

/* Connect @a inst to @a addr instead of what it was connected to (I/O thread). */
static void kvf_proxy_dns_move(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                               const char *addr)
{
    char old[KVF_PROXY_URL_MAX], why[KVF_PROXY_URL_MAX * 2 + 64];
    kvf_status_t status;

    memcpy(old, inst->addr, sizeof(old));
    kvf_proxy_inst_close(inst);
    inst->sock_gen++;
    status = kvf_proxy_inst_open(pool, inst, addr);
    if (status != KVF_OK) {
        kvf_proxy_inst_close(inst);    /* not polled (sock NULL) until the name moves again */
    }
    pthread_mutex_lock(&pool->lock);
    if (old[0] != '\0') {
        /* as a lost connection: calls sent on the old one fail after the grace */
        inst->epoch++;
        inst->lost_ms = (int64_t)kvf_time_now_ms();
        inst->info.connected = false;
        inst->probe_sent_ms = 0;
        snprintf(why, sizeof(why), "%s moved: now %s (was %s)", inst->host, addr, old);
        kvf_proxy_inst_unhealthy_locked(inst, why);
    }
    if (status == KVF_OK) {
        memcpy(inst->addr, addr, sizeof(inst->addr));
    } else {
        inst->addr[0] = '\0';
        snprintf(why, sizeof(why), "cannot connect to %s (resolved from %s)", addr, inst->host);
        kvf_proxy_inst_unhealthy_locked(inst, why);
    }
    memcpy(inst->info.address, inst->addr, sizeof(inst->info.address));
    pthread_mutex_unlock(&pool->lock);
    kvf_info("%s instance %s: %s resolves to %s%s%s", kvf_proxy_role_name(inst->role), inst->url,
             inst->host, addr, (old[0] != '\0') ? ", was " : "", old);
}

bool kvf_proxy_io_apply_dns(struct kvf_proxy_pool *pool)
{
    struct kvf_proxy_resolver *r = pool->resolver;
    bool moved = false;

    if (r == NULL) {
        return false;
    }
    pthread_mutex_lock(&r->lock);
    if (r->gen == pool->dns_gen) {
        pthread_mutex_unlock(&r->lock);
        return false;
    }
    pool->dns_gen = r->gen;
    for (int i = 0; i < r->n; ++i) {
        const kvf_proxy_dns_name_t *nm = &r->names[i];
        kvf_proxy_instance_t *inst = &pool->inst[nm->role][nm->idx];

        memcpy(inst->want, nm->addr, sizeof(inst->want));
        pthread_mutex_lock(&pool->lock);
        memcpy(inst->info.resolve_error, nm->error, sizeof(inst->info.resolve_error));
        pthread_mutex_unlock(&pool->lock);
    }
    pthread_mutex_unlock(&r->lock);
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_instance_t *inst = &pool->inst[role][i];

            if ((inst->host[0] != '\0') && (inst->want[0] != '\0') &&
                (strcmp(inst->want, inst->addr) != 0)) {
                kvf_proxy_dns_move(pool, inst, inst->want);
                moved = true;
            }
        }
    }
    return moved;
}
