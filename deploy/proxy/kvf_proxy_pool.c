/*
 * kvf-proxy instance pool and its ZeroMQ I/O thread.
 *
 * Design: ZeroMQ sockets are not thread-safe, and the HTTP front end runs a
 * thread per connection, so exactly one thread (the I/O thread) owns every
 * socket. Request threads serialize their ServeRequest, append it to a send
 * queue under the pool lock and wake the I/O thread through an eventfd that
 * zmq_poll() watches next to the sockets. Replies are routed back by
 * (instance, request_id) to a mailbox (a reply list and a condition
 * variable). Rejected: a DEALER per request (a TCP connection per request
 * and no single place to see an instance's health) and inproc socket pairs
 * per request thread (more sockets, same routing work).
 *
 * The DEALERs use ZMQ_IMMEDIATE, so a send to an instance that is not
 * connected fails at once instead of queueing stale requests that would be
 * delivered minutes later. A socket monitor per DEALER reports connect and
 * disconnect; a disconnect fails the calls in flight on that instance
 * without waiting for any timeout (docs/ARCHITECTURE.md §9).
 */
#define _GNU_SOURCE
#include "kvf_proxy_pool.h"
#include "kvf_time.h"
#include "kvf_log.h"
#include "kvf_pb_check.h"
#include "kvf_zmq.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define KVF_PROXY_HEALTH_ID "health"
#define KVF_PROXY_CHECK_PREFIX "check-peer:"   /* + prefill index ":" incarnation (hex) */
#define KVF_PROXY_CHECK_RETRY_MS 1000          /* after a check that neither passed nor refused */

typedef enum {
    KVF_PROXY_PAIR_UNCHECKED = 0,
    KVF_PROXY_PAIR_CHECKING,
    KVF_PROXY_PAIR_COMPATIBLE,
    KVF_PROXY_PAIR_REFUSED,
} kvf_proxy_pair_state_t;

/* One (prefill, decode) pairing, under pool->lock. */
typedef struct kvf_proxy_pair {
    kvf_proxy_pair_state_t state;
    uint64_t               prefill_incarnation;   /* what the verdict is about */
    uint64_t               decode_incarnation;
    int64_t                sent_ms;
    int64_t                retry_ms;              /* no new check before this */
    char                   error[320];
} kvf_proxy_pair_t;

typedef struct kvf_proxy_msg {
    struct kvf_proxy_msg *next;
    kvf_proxy_role_t      role;
    int                   idx;
    char                  request_id[128];   /* "" for fire-and-forget (abort) */
    size_t                len;
    uint8_t               data[];
} kvf_proxy_msg_t;

typedef struct kvf_proxy_reply_node {
    struct kvf_proxy_reply_node *next;
    Kvf__ServeReply             *reply;
} kvf_proxy_reply_node_t;

struct kvf_proxy_call {
    struct kvf_proxy_call  *next;
    struct kvf_proxy_pool  *pool;
    kvf_proxy_role_t        role;
    int                     idx;
    char                    request_id[128];
    kvf_proxy_reply_node_t *head;
    kvf_proxy_reply_node_t *tail;
    kvf_status_t            failed;
    char                    fail_msg[512];
    int64_t                 sent_epoch;   /* instance's epoch when its request left; -1: not yet */
    pthread_cond_t          cond;
};

typedef struct kvf_proxy_instance {
    kvf_proxy_role_t role;
    int              idx;
    char             url[KVF_PROXY_URL_MAX];
    void            *sock;              /* I/O thread only */
    void            *mon;               /* I/O thread only */
    /* under pool->lock */
    kvf_proxy_instance_info_t info;
    int64_t          probe_sent_ms;     /* 0: no probe outstanding */
    int64_t          last_ok_ms;        /* 0: never */
    int64_t          lost_ms;           /* connection lost then; its calls fail after the
                                         * grace below; 0: none pending */
    int64_t          epoch;             /* connections lost so far: a call sent in an older
                                         * epoch went to a connection that is gone */
} kvf_proxy_instance_t;

/*
 * ZeroMQ reports a disconnect (monitor event) before it has handed the
 * socket the last messages that arrived with the close, so calls of a lost
 * connection fail this long after the event, once those replies (a drained
 * daemon's last answers) were delivered.
 */
#define KVF_PROXY_LOST_GRACE_MS 200

struct kvf_proxy_pool {
    pthread_mutex_t      lock;
    kvf_proxy_instance_t inst[KVF_PROXY_ROLE_COUNT][KVF_PROXY_MAX_INSTANCES];
    int                  count[KVF_PROXY_ROLE_COUNT];
    unsigned             rr[KVF_PROXY_ROLE_COUNT];
    struct kvf_proxy_call *calls;
    kvf_proxy_msg_t     *sendq_head;
    kvf_proxy_msg_t     *sendq_tail;
    int                  efd;
    void                *zctx;
    pthread_t            thread;
    bool                 thread_started;
    atomic_bool          stop;
    int64_t              interval_ms;
    int64_t              timeout_ms;
    kvf_proxy_pair_t    *pairs;          /* [prefill][decode], count[0] x count[1] */
};

static kvf_proxy_pair_t *kvf_proxy_pair(struct kvf_proxy_pool *pool, int p, int d)
{
    return &pool->pairs[(size_t)p * (size_t)pool->count[KVF_PROXY_ROLE_DECODE] + (size_t)d];
}

static const char *kvf_proxy_pair_state_str(kvf_proxy_pair_state_t s)
{
    switch (s) {
    case KVF_PROXY_PAIR_CHECKING:   return "checking";
    case KVF_PROXY_PAIR_COMPATIBLE: return "compatible";
    case KVF_PROXY_PAIR_REFUSED:    return "refused";
    default:                        return "unchecked";
    }
}

static int64_t kvf_proxy_now_ms(void)
{
    return (int64_t)(kvf_time_now_ns() / 1000000u);
}

const char *kvf_proxy_role_name(kvf_proxy_role_t role)
{
    return (role == KVF_PROXY_ROLE_PREFILL) ? "prefill" : "decode";
}

/* ---- parsing and socket setup ------------------------------------------ */

static kvf_status_t kvf_proxy_pool_add_list(struct kvf_proxy_pool *pool, kvf_proxy_role_t role,
                                            const char *list)
{
    const char *p = (list != NULL) ? list : "";

    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t n = (end != NULL) ? (size_t)(end - p) : strlen(p);
        kvf_proxy_instance_t *inst;

        while ((n > 0) && (*p == ' ')) {
            p++;
            n--;
        }
        while ((n > 0) && (p[n - 1] == ' ')) {
            n--;
        }
        if ((n == 0) || (n >= KVF_PROXY_URL_MAX)) {
            kvf_error("bad %s endpoint list '%s': empty or over-long item",
                      kvf_proxy_role_name(role), list);
            return KVF_ERR_INVALID_PARAM;
        }
        if (pool->count[role] == KVF_PROXY_MAX_INSTANCES) {
            kvf_error("too many %s instances (at most %d)", kvf_proxy_role_name(role),
                      KVF_PROXY_MAX_INSTANCES);
            return KVF_ERR_INVALID_PARAM;
        }
        inst = &pool->inst[role][pool->count[role]];
        inst->role = role;
        inst->idx = pool->count[role]++;
        memcpy(inst->url, p, n);
        inst->url[n] = '\0';
        memcpy(inst->info.url, inst->url, n + 1);
        snprintf(inst->info.last_error, sizeof(inst->info.last_error), "no health reply yet");
        p += n;
        while ((*p == ' ') || (*p == ',')) {
            p++;
        }
    }
    return KVF_OK;
}

static kvf_status_t kvf_proxy_inst_open(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst)
{
    static const kvf_zmq_opt_t sock_opts[] = {
        {ZMQ_LINGER, 0},
        {ZMQ_IMMEDIATE, 1},
        {ZMQ_RECONNECT_IVL, 100},
        {ZMQ_RECONNECT_IVL_MAX, 1000},
    };
    static const kvf_zmq_opt_t mon_opts[] = {
        {ZMQ_LINGER, 0},
    };
    char mon_url[96];
    kvf_status_t status;

    status = kvf_zmq_socket_open(pool->zctx, ZMQ_DEALER, sock_opts,
                                 sizeof(sock_opts) / sizeof(sock_opts[0]), &inst->sock);
    if (status != KVF_OK) {
        return status;
    }

    snprintf(mon_url, sizeof(mon_url), "inproc://kvf-proxy-mon-%p-%d-%d", (void *)pool,
             (int)inst->role, inst->idx);
    if (zmq_socket_monitor(inst->sock, mon_url,
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
        kvf_error("zmq_socket_monitor failed: %s", zmq_strerror(zmq_errno()));
        return KVF_ERR_ZMQ;
    }
    status = kvf_zmq_socket_open(pool->zctx, ZMQ_PAIR, mon_opts,
                                 sizeof(mon_opts) / sizeof(mon_opts[0]), &inst->mon);
    if (status != KVF_OK) {
        return status;
    }
    if (zmq_connect(inst->mon, mon_url) != 0) {
        kvf_error("monitor socket for %s failed: %s", inst->url, zmq_strerror(zmq_errno()));
        return KVF_ERR_ZMQ;
    }
    if (zmq_connect(inst->sock, inst->url) != 0) {
        kvf_error("bad %s endpoint '%s': %s", kvf_proxy_role_name(inst->role), inst->url,
                  zmq_strerror(zmq_errno()));
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

static void kvf_proxy_inst_close(kvf_proxy_instance_t *inst)
{
    if (inst->sock != NULL) {
        KVF_ZMQ_CHECK_IGNORE(zmq_socket_monitor(inst->sock, NULL, 0));
        zmq_close(inst->sock);
        inst->sock = NULL;
    }
    if (inst->mon != NULL) {
        zmq_close(inst->mon);
        inst->mon = NULL;
    }
}

/* ---- mailboxes (pool->lock held) ---------------------------------------- */

static struct kvf_proxy_call *kvf_proxy_call_find(struct kvf_proxy_pool *pool,
                                                  kvf_proxy_role_t role, int idx,
                                                  const char *request_id)
{
    for (struct kvf_proxy_call *c = pool->calls; c != NULL; c = c->next) {
        if ((c->role == role) && (c->idx == idx) && (strcmp(c->request_id, request_id) == 0)) {
            return c;
        }
    }
    return NULL;
}

static void kvf_proxy_call_fail_locked(struct kvf_proxy_call *c, kvf_status_t status,
                                       const char *msg)
{
    if (c->failed == KVF_OK) {
        c->failed = status;
        snprintf(c->fail_msg, sizeof(c->fail_msg), "%s", msg);
    }
    pthread_cond_broadcast(&c->cond);
}

/*
 * Fail the calls of INST whose request was sent before the instance's
 * connection was last lost. A call sent since went to the new connection (a
 * restarted daemon) and is left to its reply or its own timeout.
 */
static void kvf_proxy_inst_fail_calls_locked(struct kvf_proxy_pool *pool,
                                             kvf_proxy_instance_t *inst, kvf_status_t status,
                                             const char *msg)
{
    for (struct kvf_proxy_call *c = pool->calls; c != NULL; c = c->next) {
        if ((c->role == inst->role) && (c->idx == inst->idx) && (c->sent_epoch >= 0) &&
            (c->sent_epoch < inst->epoch)) {
            kvf_proxy_call_fail_locked(c, status, msg);
        }
    }
}

static void kvf_proxy_inst_unhealthy_locked(kvf_proxy_instance_t *inst, const char *why)
{
    if (inst->info.healthy) {
        kvf_warn("%s instance %s is unhealthy: %s", kvf_proxy_role_name(inst->role), inst->url,
                 why);
    }
    inst->info.healthy = false;
    snprintf(inst->info.last_error, sizeof(inst->info.last_error), "%s", why);
}

/* ---- I/O thread ----------------------------------------------------------- */

static void kvf_proxy_io_send(struct kvf_proxy_pool *pool, kvf_proxy_msg_t *m)
{
    kvf_proxy_instance_t *inst = &pool->inst[m->role][m->idx];
    char why[384];

    if (zmq_send(inst->sock, m->data, m->len, ZMQ_DONTWAIT) >= 0) {
        if (m->request_id[0] != '\0') {
            pthread_mutex_lock(&pool->lock);
            struct kvf_proxy_call *c = kvf_proxy_call_find(pool, m->role, m->idx, m->request_id);
            if ((c != NULL) && (c->sent_epoch < 0)) {
                c->sent_epoch = inst->epoch;
            }
            pthread_mutex_unlock(&pool->lock);
        }
        return;
    }
    snprintf(why, sizeof(why), "%s instance %s is not connected (%s)",
             kvf_proxy_role_name(m->role), inst->url, zmq_strerror(zmq_errno()));
    pthread_mutex_lock(&pool->lock);
    {
        struct kvf_proxy_call *c = kvf_proxy_call_find(pool, m->role, m->idx, m->request_id);
        if (c != NULL) {
            kvf_proxy_call_fail_locked(c, KVF_ERR_PEER_UNREACHABLE, why);
        } else {
            kvf_debug("dropped message for %s: %s", inst->url, why);
        }
    }
    pthread_mutex_unlock(&pool->lock);
}

static void kvf_proxy_io_drain_sendq(struct kvf_proxy_pool *pool)
{
    kvf_proxy_msg_t *m;
    uint64_t v;

    if (read(pool->efd, &v, sizeof(v)) < 0) {
        (void)0; /* EAGAIN: nothing pending; the queue is checked anyway */
    }
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        m = pool->sendq_head;
        if (m != NULL) {
            pool->sendq_head = m->next;
            if (pool->sendq_head == NULL) {
                pool->sendq_tail = NULL;
            }
        }
        pthread_mutex_unlock(&pool->lock);
        if (m == NULL) {
            return;
        }
        kvf_proxy_io_send(pool, m);
        free(m);
    }
}

static void kvf_proxy_io_health_reply(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                      const Kvf__ServeReply *r)
{
    const Kvf__HealthReply *h = r->health;
    kvf_proxy_instance_info_t *info = &inst->info;
    const char *want = kvf_proxy_role_name(inst->role);
    char why[256];

    pthread_mutex_lock(&pool->lock);
    inst->probe_sent_ms = 0;
    if ((r->has_status && (r->status != 0)) || (h == NULL)) {
        snprintf(why, sizeof(why), "health check failed: %s",
                 (r->error != NULL) ? r->error : "reply without health");
        info->probes_failed++;
        kvf_proxy_inst_unhealthy_locked(inst, why);
        goto out;
    }
    info->answered = true;
    snprintf(info->engine_id, sizeof(info->engine_id), "%s", h->engine_id ? h->engine_id : "");
    snprintf(info->reported_role, sizeof(info->reported_role), "%s", h->role ? h->role : "");
    info->tp_size = h->tp_size;
    info->free_pages = h->free_pages;
    info->total_pages = h->total_pages;
    info->running = h->running;
    info->block_size = h->block_size;
    info->leases = h->leases;
    info->handshake_refusals = h->handshake_refusals;
    info->peer_errors = h->peer_errors;
    info->queue_depth = h->queue_depth;
    info->step_ms = h->step_ms;
    info->step_running_ms = h->step_running_ms;
    info->xfer_timeout_ms = h->xfer_timeout_ms;
    info->lease_timeout_ms = h->lease_timeout_ms;
    snprintf(info->side_host, sizeof(info->side_host), "%s", h->side_host ? h->side_host : "");
    info->side_port = h->side_port;
    if ((info->incarnation != 0) && (h->incarnation != 0) &&
        (h->incarnation != info->incarnation)) {
        info->restarts++;
        kvf_info("%s instance %s restarted (engine %s, restart %llu seen)", want, inst->url,
                 h->engine_id ? h->engine_id : "", (unsigned long long)info->restarts);
    }
    info->incarnation = h->incarnation;
    info->max_prompt_tokens = h->max_prompt_tokens;
    info->prefill_tokens_per_s = h->prefill_tokens_per_s;
    info->releases_refused = h->releases_refused;
    info->expired_reads_prevented = h->expired_reads_prevented;
    info->quarantined_blocks = h->quarantined_blocks;
    if (h->draining && !info->draining) {
        kvf_info("%s instance %s (engine %s) is draining: no new requests go to it", want,
                 inst->url, info->engine_id);
    }
    info->draining = h->draining;
    inst->last_ok_ms = kvf_proxy_now_ms();
    if (strcmp(info->reported_role, want) != 0) {
        snprintf(why, sizeof(why), "instance reports role '%s' but is listed as %s",
                 info->reported_role, want);
        kvf_proxy_inst_unhealthy_locked(inst, why);
        goto out;
    }
    if (!info->healthy) {
        kvf_info("%s instance %s (engine %s, tp %u) is healthy", want, inst->url, info->engine_id,
                 info->tp_size);
    }
    info->connected = true;   /* a reply proves it, even before the monitor event */
    info->healthy = true;
    info->last_error[0] = '\0';
out:
    pthread_mutex_unlock(&pool->lock);
}


/* ---- pair checks (I/O thread) --------------------------------------------- */

/* A decode instance's verdict on one prefill engine. */
static void kvf_proxy_io_check_reply(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                     const Kvf__ServeReply *r)
{
    const char *p_str = r->request_id + strlen(KVF_PROXY_CHECK_PREFIX);
    char *end = NULL;
    long p = strtol(p_str, &end, 10);
    uint64_t inc = (end != NULL && *end == ':') ? strtoull(end + 1, NULL, 16) : 0;
    kvf_status_t status = r->has_status ? (kvf_status_t)r->status : KVF_OK;
    const char *msg = ((r->error != NULL) && (r->error[0] != '\0')) ? r->error :
                      kvf_status_str(status);
    kvf_proxy_pair_t *pair;
    kvf_proxy_instance_t *pf;

    if ((inst->role != KVF_PROXY_ROLE_DECODE) || (p < 0) ||
        (p >= pool->count[KVF_PROXY_ROLE_PREFILL])) {
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pair = kvf_proxy_pair(pool, (int)p, inst->idx);
    pf = &pool->inst[KVF_PROXY_ROLE_PREFILL][p];
    if ((pair->state != KVF_PROXY_PAIR_CHECKING) || (pair->prefill_incarnation != inc)) {
        goto out;   /* a stale answer: the prefill restarted meanwhile */
    }
    if ((status == KVF_OK) || (status == KVF_ERR_UNSUPPORTED)) {
        /* UNSUPPORTED: a decode build without the check; its requests will tell */
        pair->state = KVF_PROXY_PAIR_COMPATIBLE;
        pair->error[0] = '\0';
        kvf_info("prefill %s -> decode %s: %s", pf->url, inst->url,
                 (status == KVF_OK) ? "handshake accepted" : "not checked (decode cannot)");
    } else if ((status == KVF_ERR_REFUSED) || (status == KVF_ERR_VERSION)) {
        pair->state = KVF_PROXY_PAIR_REFUSED;
        snprintf(pair->error, sizeof(pair->error), "%s", msg);
        kvf_error("prefill %s -> decode %s will not be routed: %s", pf->url, inst->url, msg);
    } else {
        pair->state = KVF_PROXY_PAIR_UNCHECKED;
        pair->retry_ms = kvf_proxy_now_ms() + KVF_PROXY_CHECK_RETRY_MS;
        snprintf(pair->error, sizeof(pair->error), "check failed: %s", msg);
        kvf_warn("prefill %s -> decode %s: compatibility check failed, retrying: %s", pf->url,
                 inst->url, msg);
    }
out:
    pthread_mutex_unlock(&pool->lock);
}

/* Start a check for every healthy pair without a current verdict. */
static void kvf_proxy_io_check_pairs(struct kvf_proxy_pool *pool, int64_t now)
{
    int np = pool->count[KVF_PROXY_ROLE_PREFILL], nd = pool->count[KVF_PROXY_ROLE_DECODE];

    for (int p = 0; p < np; ++p) {
        for (int d = 0; d < nd; ++d) {
            kvf_proxy_instance_t *pf = &pool->inst[KVF_PROXY_ROLE_PREFILL][p];
            kvf_proxy_instance_t *dc = &pool->inst[KVF_PROXY_ROLE_DECODE][d];
            Kvf__CheckPeerRequest cr = KVF__CHECK_PEER_REQUEST__INIT;
            Kvf__ServeRequest req = KVF__SERVE_REQUEST__INIT;
            kvf_proxy_pair_t *pair;
            char rid[64], engine[64], host[64];
            uint8_t *buf;
            size_t len;
            uint32_t port;
            uint64_t inc;

            pthread_mutex_lock(&pool->lock);
            pair = kvf_proxy_pair(pool, p, d);
            if (!pf->info.healthy || !dc->info.healthy || (pf->info.side_port == 0)) {
                pthread_mutex_unlock(&pool->lock);
                continue;
            }
            if ((pair->prefill_incarnation != pf->info.incarnation) ||
                (pair->decode_incarnation != dc->info.incarnation)) {
                pair->state = KVF_PROXY_PAIR_UNCHECKED;   /* one side restarted */
                pair->retry_ms = 0;
                pair->error[0] = '\0';
                pair->prefill_incarnation = pf->info.incarnation;
                pair->decode_incarnation = dc->info.incarnation;
            }
            if ((pair->state == KVF_PROXY_PAIR_CHECKING) &&
                (now - pair->sent_ms > 2 * pool->timeout_ms + (int64_t)dc->info.xfer_timeout_ms)) {
                pair->state = KVF_PROXY_PAIR_UNCHECKED;
                snprintf(pair->error, sizeof(pair->error),
                         "no answer to the compatibility check within %lld ms",
                         (long long)(now - pair->sent_ms));
            }
            if ((pair->state != KVF_PROXY_PAIR_UNCHECKED) || (now < pair->retry_ms)) {
                pthread_mutex_unlock(&pool->lock);
                continue;
            }
            pair->state = KVF_PROXY_PAIR_CHECKING;
            pair->sent_ms = now;
            inc = pf->info.incarnation;
            snprintf(engine, sizeof(engine), "%s", pf->info.engine_id);
            snprintf(host, sizeof(host), "%s", pf->info.side_host);
            port = pf->info.side_port;
            pthread_mutex_unlock(&pool->lock);

            snprintf(rid, sizeof(rid), KVF_PROXY_CHECK_PREFIX "%d:%llx", p,
                     (unsigned long long)inc);
            cr.request_id = rid;
            cr.engine_id = engine;
            cr.host = host;
            cr.has_port = cr.has_incarnation = 1;
            cr.port = port;
            cr.incarnation = inc;
            req.body_case = KVF__SERVE_REQUEST__BODY_CHECK_PEER;
            req.check_peer = &cr;
            len = kvf__serve_request__get_packed_size(&req);
            buf = malloc(len ? len : 1);
            if ((buf == NULL) ||
                (kvf__serve_request__pack(&req, buf), zmq_send(dc->sock, buf, len,
                                                               ZMQ_DONTWAIT) < 0)) {
                pthread_mutex_lock(&pool->lock);
                pair->state = KVF_PROXY_PAIR_UNCHECKED;
                pair->retry_ms = now + KVF_PROXY_CHECK_RETRY_MS;
                pthread_mutex_unlock(&pool->lock);
            } else {
                kvf_debug("asking decode %s whether it can pull from %s (%s:%u)", dc->url, engine,
                          host, port);
            }
            free(buf);
        }
    }
}

static void kvf_proxy_io_recv(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst)
{
    for (;;) {
        zmq_msg_t frame, last;
        Kvf__ServeReply *r;
        int more = 1, got = 0;

        zmq_msg_init(&last);
        /* DEALER side: one frame per reply; tolerate an empty delimiter before it. */
        while (more) {
            zmq_msg_init(&frame);
            if (zmq_msg_recv(&frame, inst->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&frame);
                break;
            }
            got = 1;
            more = zmq_msg_more(&frame);
            zmq_msg_close(&last);
            zmq_msg_init(&last);
            zmq_msg_move(&last, &frame);
            zmq_msg_close(&frame);
        }
        if (!got) {
            zmq_msg_close(&last);
            return;
        }
        KVF_PB_UNPACK_CHECK_IGNORE(kvf__serve_reply, r, zmq_msg_size(&last),
                                   zmq_msg_data(&last));
        zmq_msg_close(&last);
        if (r == NULL) {
            kvf_warn("malformed reply from %s instance %s dropped", kvf_proxy_role_name(inst->role),
                     inst->url);
            continue;
        }
        if ((r->request_id != NULL) && (strcmp(r->request_id, KVF_PROXY_HEALTH_ID) == 0)) {
            kvf_proxy_io_health_reply(pool, inst, r);
            kvf__serve_reply__free_unpacked(r, NULL);
            continue;
        }
        if ((r->request_id != NULL) &&
            (strncmp(r->request_id, KVF_PROXY_CHECK_PREFIX, strlen(KVF_PROXY_CHECK_PREFIX)) == 0)) {
            kvf_proxy_io_check_reply(pool, inst, r);
            kvf__serve_reply__free_unpacked(r, NULL);
            continue;
        }
        pthread_mutex_lock(&pool->lock);
        {
            struct kvf_proxy_call *c = kvf_proxy_call_find(pool, inst->role, inst->idx,
                                                           r->request_id ? r->request_id : "");
            kvf_proxy_reply_node_t *n = (c != NULL) ? calloc(1, sizeof(*n)) : NULL;
            if (n != NULL) {
                n->reply = r;
                if (c->tail != NULL) {
                    c->tail->next = n;
                } else {
                    c->head = n;
                }
                c->tail = n;
                pthread_cond_broadcast(&c->cond);
                r = NULL;
            }
        }
        pthread_mutex_unlock(&pool->lock);
        if (r != NULL) {
            kvf_debug("reply for unknown request '%s' from %s dropped",
                      r->request_id ? r->request_id : "", inst->url);
            kvf__serve_reply__free_unpacked(r, NULL);
        }
    }
}

static void kvf_proxy_io_monitor(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst)
{
    for (;;) {
        int event = kvf_zmq_monitor_event(inst->mon);

        if (event < 0) {
            return;
        }
        pthread_mutex_lock(&pool->lock);
        if (event == ZMQ_EVENT_CONNECTED) {
            kvf_debug("connected to %s instance %s", kvf_proxy_role_name(inst->role), inst->url);
            inst->info.connected = true;
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            inst->epoch++;
            inst->info.connected = false;
            inst->probe_sent_ms = 0;
            kvf_proxy_inst_unhealthy_locked(inst, "connection lost");
            /* calls sent before this loss fail a grace after it (the latest loss: a
             * second loss soon after the first gives its own calls their grace too) */
            inst->lost_ms = kvf_proxy_now_ms();
        }
        pthread_mutex_unlock(&pool->lock);
    }
}

/* Probe every instance whose previous probe was answered or timed out. */
static void kvf_proxy_io_probe(struct kvf_proxy_pool *pool, int64_t now)
{
    static const Kvf__HealthRequest health = KVF__HEALTH_REQUEST__INIT;
    Kvf__ServeRequest req = KVF__SERVE_REQUEST__INIT;
    uint8_t buf[16];
    size_t len;

    req.body_case = KVF__SERVE_REQUEST__BODY_HEALTH;
    req.health = (Kvf__HealthRequest *)&health;
    len = kvf__serve_request__pack(&req, buf);

    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_instance_t *inst = &pool->inst[role][i];
            bool send;

            pthread_mutex_lock(&pool->lock);
            send = (inst->probe_sent_ms == 0);
            if (send) {
                inst->probe_sent_ms = now;
            }
            pthread_mutex_unlock(&pool->lock);
            if (send && (zmq_send(inst->sock, buf, len, ZMQ_DONTWAIT) < 0)) {
                pthread_mutex_lock(&pool->lock);
                inst->probe_sent_ms = 0;
                if (inst->info.answered) {   /* start-up connects are not failures */
                    inst->info.probes_failed++;
                }
                kvf_proxy_inst_unhealthy_locked(inst, inst->info.connected ?
                                                "health probe could not be sent" :
                                                "not connected");
                pthread_mutex_unlock(&pool->lock);
            }
        }
    }
}

static void kvf_proxy_io_check_timeouts(struct kvf_proxy_pool *pool, int64_t now)
{
    pthread_mutex_lock(&pool->lock);
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_instance_t *inst = &pool->inst[role][i];
            char why[128];

            if ((inst->probe_sent_ms != 0) && (now - inst->probe_sent_ms > pool->timeout_ms)) {
                snprintf(why, sizeof(why), "health check unanswered for %lld ms",
                         (long long)(now - inst->probe_sent_ms));
                inst->probe_sent_ms = 0;     /* a late reply still counts */
                inst->info.probes_failed++;
                kvf_proxy_inst_unhealthy_locked(inst, why);
            }
        }
    }
    pthread_mutex_unlock(&pool->lock);
}

/* Fail the calls of connections lost at least the grace ago, after their last replies. */
static void kvf_proxy_io_fail_lost(struct kvf_proxy_pool *pool, int64_t now)
{
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_instance_t *inst = &pool->inst[role][i];
            char why[384];

            if ((inst->lost_ms == 0) || (now - inst->lost_ms < KVF_PROXY_LOST_GRACE_MS)) {
                continue;
            }
            kvf_proxy_io_recv(pool, inst);   /* what came before the close */
            snprintf(why, sizeof(why), "%s instance %s closed the connection",
                     kvf_proxy_role_name(inst->role), inst->url);
            pthread_mutex_lock(&pool->lock);
            inst->lost_ms = 0;
            kvf_proxy_inst_fail_calls_locked(pool, inst, KVF_ERR_PEER_RESET, why);
            pthread_mutex_unlock(&pool->lock);
        }
    }
}

static void *kvf_proxy_io_main(void *arg)
{
    struct kvf_proxy_pool *pool = arg;
    int n = pool->count[0] + pool->count[1];
    zmq_pollitem_t *items = calloc((size_t)(1 + 2 * n), sizeof(*items));
    kvf_proxy_instance_t **owner = calloc((size_t)(1 + 2 * n), sizeof(*owner));
    int64_t next_probe = 0;
    int k = 1;

    if ((items == NULL) || (owner == NULL)) {
        kvf_error("proxy i/o thread: out of memory");
        free(items);
        free(owner);
        return NULL;
    }
    items[0].fd = pool->efd;
    items[0].events = ZMQ_POLLIN;
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            owner[k] = &pool->inst[role][i];
            items[k].socket = owner[k]->sock;
            items[k++].events = ZMQ_POLLIN;
            owner[k] = &pool->inst[role][i];
            items[k].socket = owner[k]->mon;
            items[k++].events = ZMQ_POLLIN;
        }
    }

    while (!atomic_load(&pool->stop)) {
        int64_t now = kvf_proxy_now_ms();
        long wait = (long)((next_probe > now) ? (next_probe - now) : 0);

        if (wait > 50) {
            wait = 50;    /* probe timeouts and lost connections are checked this often */
        }
        if (zmq_poll(items, k, wait) < 0) {
            if (zmq_errno() == EINTR) {
                continue;
            }
            kvf_error("zmq_poll failed: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if (items[0].revents & ZMQ_POLLIN) {
            kvf_proxy_io_drain_sendq(pool);
        }
        for (int j = 1; j < k; ++j) {
            if (!(items[j].revents & ZMQ_POLLIN)) {
                continue;
            }
            if (items[j].socket == owner[j]->sock) {
                kvf_proxy_io_recv(pool, owner[j]);
            } else {
                kvf_proxy_io_monitor(pool, owner[j]);
            }
        }
        now = kvf_proxy_now_ms();
        kvf_proxy_io_fail_lost(pool, now);
        kvf_proxy_io_check_timeouts(pool, now);
        if (now >= next_probe) {
            kvf_proxy_io_probe(pool, now);
            next_probe = now + pool->interval_ms;
        }
        if (pool->pairs != NULL) {
            kvf_proxy_io_check_pairs(pool, now);
        }
    }
    free(items);
    free(owner);
    return NULL;
}

/* ---- public API ------------------------------------------------------------ */

kvf_status_t kvf_proxy_pool_create(const kvf_proxy_pool_params_t *params,
                                   kvf_proxy_pool_h *pool_p)
{
    struct kvf_proxy_pool *pool;
    kvf_status_t status;

    if ((params->health_interval_ms <= 0) || (params->health_timeout_ms <= 0)) {
        kvf_error("health interval and timeout must be positive");
        return KVF_ERR_INVALID_PARAM;
    }
    pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&pool->lock, NULL);
    pool->efd = -1;
    pool->interval_ms = params->health_interval_ms;
    pool->timeout_ms = params->health_timeout_ms;
    atomic_init(&pool->stop, false);

    status = kvf_proxy_pool_add_list(pool, KVF_PROXY_ROLE_PREFILL, params->prefill_urls);
    if (status == KVF_OK) {
        status = kvf_proxy_pool_add_list(pool, KVF_PROXY_ROLE_DECODE, params->decode_urls);
    }
    if (status != KVF_OK) {
        goto err_free;
    }
    if ((pool->count[KVF_PROXY_ROLE_PREFILL] > 0) && (pool->count[KVF_PROXY_ROLE_DECODE] > 0)) {
        pool->pairs = calloc((size_t)pool->count[KVF_PROXY_ROLE_PREFILL] *
                             (size_t)pool->count[KVF_PROXY_ROLE_DECODE], sizeof(*pool->pairs));
        if (pool->pairs == NULL) {
            status = KVF_ERR_NO_MEMORY;
            goto err_free;
        }
    }
    pool->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pool->efd < 0) {
        kvf_error("eventfd failed: %m");
        status = KVF_ERR_IO;
        goto err_free;
    }
    pool->zctx = zmq_ctx_new();
    if (pool->zctx == NULL) {
        kvf_error("zmq_ctx_new failed: %s", zmq_strerror(zmq_errno()));
        status = KVF_ERR_ZMQ;
        goto err_close_efd;
    }
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            status = kvf_proxy_inst_open(pool, &pool->inst[role][i]);
            if (status != KVF_OK) {
                goto err_close_socks;
            }
        }
    }
    if (pthread_create(&pool->thread, NULL, kvf_proxy_io_main, pool) != 0) {
        kvf_error("failed to start the proxy i/o thread");
        status = KVF_ERR_NO_RESOURCE;
        goto err_close_socks;
    }
    pool->thread_started = true;
    *pool_p = pool;
    return KVF_OK;

err_close_socks:
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_inst_close(&pool->inst[role][i]);
        }
    }
    zmq_ctx_term(pool->zctx);
err_close_efd:
    close(pool->efd);
err_free:
    pthread_mutex_destroy(&pool->lock);
    free(pool->pairs);
    free(pool);
    return status;
}

void kvf_proxy_pool_destroy(kvf_proxy_pool_h pool)
{
    uint64_t one = 1;

    if (pool == NULL) {
        return;
    }
    atomic_store(&pool->stop, true);
    if (write(pool->efd, &one, sizeof(one)) < 0) {
        kvf_debug("eventfd write failed: %m");
    }
    if (pool->thread_started) {
        pthread_join(pool->thread, NULL);
    }
    pthread_mutex_lock(&pool->lock);
    for (struct kvf_proxy_call *c = pool->calls; c != NULL; c = c->next) {
        kvf_proxy_call_fail_locked(c, KVF_ERR_CANCELED, "proxy is shutting down");
    }
    while (pool->sendq_head != NULL) {
        kvf_proxy_msg_t *m = pool->sendq_head;
        pool->sendq_head = m->next;
        free(m);
    }
    pthread_mutex_unlock(&pool->lock);
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_inst_close(&pool->inst[role][i]);
        }
    }
    zmq_ctx_term(pool->zctx);
    close(pool->efd);
    /* Calls still registered belong to threads that will end them; the MHD
     * daemon is stopped before the pool, so there are none in practice. */
    if (pool->calls == NULL) {
        pthread_mutex_destroy(&pool->lock);
        free(pool->pairs);
        free(pool);
    }
}

int kvf_proxy_pool_count(kvf_proxy_pool_h pool, kvf_proxy_role_t role)
{
    return pool->count[role];
}

const char *kvf_proxy_pool_url(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx)
{
    return pool->inst[role][idx].url;
}

/* New requests may go to @a info's instance: healthy and not draining. */
static bool kvf_proxy_routable(const kvf_proxy_instance_info_t *info)
{
    return info->healthy && !info->draining;
}

/* Prefill @a p has no routable decode partner that did not refuse it (pool->lock held). */
static bool kvf_proxy_prefill_refused_locked(struct kvf_proxy_pool *pool, int p)
{
    bool any_healthy = false;

    for (int d = 0; d < pool->count[KVF_PROXY_ROLE_DECODE]; ++d) {
        if (!kvf_proxy_routable(&pool->inst[KVF_PROXY_ROLE_DECODE][d].info)) {
            continue;
        }
        any_healthy = true;
        if (kvf_proxy_pair(pool, p, d)->state != KVF_PROXY_PAIR_REFUSED) {
            return false;
        }
    }
    return any_healthy;
}

kvf_status_t kvf_proxy_pool_pick(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int *idx_p)
{
    kvf_status_t status = KVF_ERR_NO_RESOURCE;
    int n = pool->count[role];

    pthread_mutex_lock(&pool->lock);
    for (int k = 0; k < n; ++k) {
        int i = (int)((pool->rr[role] + (unsigned)k) % (unsigned)n);
        if (kvf_proxy_routable(&pool->inst[role][i].info) &&
            ((role != KVF_PROXY_ROLE_PREFILL) || (pool->pairs == NULL) ||
             !kvf_proxy_prefill_refused_locked(pool, i))) {
            pool->rr[role] = (unsigned)i + 1;
            *idx_p = i;
            status = KVF_OK;
            break;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return status;
}

kvf_status_t kvf_proxy_pool_pick_decode(kvf_proxy_pool_h pool, int prefill_idx, int num_tokens,
                                        int *idx_p, char *why, size_t why_cap)
{
    kvf_proxy_role_t role = KVF_PROXY_ROLE_DECODE;
    int n = pool->count[role], pick = -1;
    bool healthy = false, accepted = false;
    uint32_t largest = 0;

    pthread_mutex_lock(&pool->lock);
    /* pass 0: pairs checked compatible; pass 1: pairs without a verdict yet */
    for (int pass = 0; (pass < 2) && (pick < 0); ++pass) {
        for (int k = 0; k < n; ++k) {
            int i = (int)((pool->rr[role] + (unsigned)k) % (unsigned)n);
            kvf_proxy_pair_state_t st;

            if (!kvf_proxy_routable(&pool->inst[role][i].info)) {
                continue;
            }
            healthy = true;
            st = (pool->pairs != NULL) ? kvf_proxy_pair(pool, prefill_idx, i)->state :
                                         KVF_PROXY_PAIR_COMPATIBLE;
            if (st != KVF_PROXY_PAIR_REFUSED) {
                uint32_t cap = pool->inst[role][i].info.max_prompt_tokens;
                accepted = true;
                if ((cap != 0) && ((uint32_t)num_tokens > cap)) {
                    largest = (cap > largest) ? cap : largest;
                    continue;   /* its pool can never hold this prompt */
                }
            }
            if ((pass == 0) ? (st == KVF_PROXY_PAIR_COMPATIBLE) :
                              (st != KVF_PROXY_PAIR_REFUSED)) {
                pick = i;
                break;
            }
            if ((st == KVF_PROXY_PAIR_REFUSED) && (why != NULL)) {
                snprintf(why, why_cap, "%s", kvf_proxy_pair(pool, prefill_idx, i)->error);
            }
        }
    }
    if (pick >= 0) {
        pool->rr[role] = (unsigned)pick + 1;
        *idx_p = pick;
    }
    pthread_mutex_unlock(&pool->lock);
    if (pick >= 0) {
        return KVF_OK;
    }
    if (accepted) {
        if (why != NULL) {
            snprintf(why, why_cap, "the largest prompt a decode instance's KV cache holds is %u"
                     " tokens (raise --num-blocks on decode)", largest);
        }
        return KVF_ERR_OUT_OF_RANGE;
    }
    return healthy ? KVF_ERR_REFUSED : KVF_ERR_NO_RESOURCE;
}

void kvf_proxy_pool_info(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx,
                         kvf_proxy_instance_info_t *info_p)
{
    kvf_proxy_instance_t *inst = &pool->inst[role][idx];

    pthread_mutex_lock(&pool->lock);
    *info_p = inst->info;
    info_p->last_ok_age_ms = (inst->last_ok_ms != 0) ? kvf_proxy_now_ms() - inst->last_ok_ms : -1;
    pthread_mutex_unlock(&pool->lock);
}

bool kvf_proxy_pool_ready(kvf_proxy_pool_h pool)
{
    bool ok = false;

    pthread_mutex_lock(&pool->lock);
    for (int p = 0; (p < pool->count[KVF_PROXY_ROLE_PREFILL]) && !ok; ++p) {
        for (int d = 0; (d < pool->count[KVF_PROXY_ROLE_DECODE]) && !ok; ++d) {
            ok = kvf_proxy_routable(&pool->inst[KVF_PROXY_ROLE_PREFILL][p].info) &&
                 kvf_proxy_routable(&pool->inst[KVF_PROXY_ROLE_DECODE][d].info) &&
                 (kvf_proxy_pair(pool, p, d)->state != KVF_PROXY_PAIR_REFUSED);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return ok;
}

cJSON *kvf_proxy_pool_health_json(kvf_proxy_pool_h pool)
{
    cJSON *root = cJSON_CreateObject();

    if (root == NULL) {
        return NULL;
    }
    cJSON_AddStringToObject(root, "status", kvf_proxy_pool_ready(pool) ? "ok" : "unavailable");
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        cJSON *arr = cJSON_AddArrayToObject(root, kvf_proxy_role_name((kvf_proxy_role_t)role));
        for (int i = 0; (arr != NULL) && (i < pool->count[role]); ++i) {
            kvf_proxy_instance_info_t info;
            cJSON *o = cJSON_CreateObject();

            if (o == NULL) {
                break;
            }
            kvf_proxy_pool_info(pool, (kvf_proxy_role_t)role, i, &info);
            cJSON_AddStringToObject(o, "url", info.url);
            cJSON_AddBoolToObject(o, "healthy", info.healthy);
            cJSON_AddBoolToObject(o, "connected", info.connected);
            cJSON_AddBoolToObject(o, "draining", info.draining);
            cJSON_AddStringToObject(o, "engine_id", info.engine_id);
            cJSON_AddNumberToObject(o, "tp_size", info.tp_size);
            /* The live gauges are only current while the instance answers:
             * after a crash or disconnect the last values would read as
             * current (a "free == total" leak check would misfire), so they
             * are null until it is healthy again. */
            if (info.healthy && info.connected) {
                cJSON_AddNumberToObject(o, "free_pages", (double)info.free_pages);
                cJSON_AddNumberToObject(o, "running", info.running);
                cJSON_AddNumberToObject(o, "leases", (double)info.leases);
            } else {
                cJSON_AddNullToObject(o, "free_pages");
                cJSON_AddNullToObject(o, "running");
                cJSON_AddNullToObject(o, "leases");
            }
            cJSON_AddNumberToObject(o, "total_pages", (double)info.total_pages);
            cJSON_AddNumberToObject(o, "block_size", info.block_size);
            cJSON_AddNumberToObject(o, "handshake_refusals", (double)info.handshake_refusals);
            cJSON_AddNumberToObject(o, "peer_errors", (double)info.peer_errors);
            cJSON_AddNumberToObject(o, "queue_depth", info.queue_depth);
            cJSON_AddNumberToObject(o, "step_ms", info.step_ms);
            cJSON_AddNumberToObject(o, "step_running_ms", info.step_running_ms);
            cJSON_AddNumberToObject(o, "xfer_timeout_ms", (double)info.xfer_timeout_ms);
            cJSON_AddNumberToObject(o, "max_prompt_tokens", info.max_prompt_tokens);
            cJSON_AddNumberToObject(o, "prefill_tokens_per_s", info.prefill_tokens_per_s);
            if (role == KVF_PROXY_ROLE_PREFILL) {
                cJSON_AddNumberToObject(o, "lease_timeout_ms", (double)info.lease_timeout_ms);
            }
            cJSON_AddNumberToObject(o, "releases_refused", (double)info.releases_refused);
            cJSON_AddNumberToObject(o, "expired_lease_reads_prevented",
                                    (double)info.expired_reads_prevented);
            cJSON_AddNumberToObject(o, "quarantined_blocks", (double)info.quarantined_blocks);
            cJSON_AddNumberToObject(o, "last_ok_age_ms", (double)info.last_ok_age_ms);
            cJSON_AddNumberToObject(o, "probes_failed", (double)info.probes_failed);
            cJSON_AddNumberToObject(o, "restarts", (double)info.restarts);
            if (info.last_error[0] != '\0') {
                cJSON_AddStringToObject(o, "error", info.last_error);
            }
            cJSON_AddItemToArray(arr, o);
        }
    }
    {
        cJSON *arr = cJSON_AddArrayToObject(root, "pairs");

        pthread_mutex_lock(&pool->lock);
        for (int p = 0; (arr != NULL) && (p < pool->count[KVF_PROXY_ROLE_PREFILL]); ++p) {
            for (int d = 0; d < pool->count[KVF_PROXY_ROLE_DECODE]; ++d) {
                const kvf_proxy_pair_t *pair = kvf_proxy_pair(pool, p, d);
                cJSON *o = cJSON_CreateObject();

                if (o == NULL) {
                    break;
                }
                cJSON_AddStringToObject(o, "prefill", pool->inst[KVF_PROXY_ROLE_PREFILL][p].url);
                cJSON_AddStringToObject(o, "decode", pool->inst[KVF_PROXY_ROLE_DECODE][d].url);
                cJSON_AddStringToObject(o, "state", kvf_proxy_pair_state_str(pair->state));
                if (pair->error[0] != '\0') {
                    cJSON_AddStringToObject(o, "error", pair->error);
                }
                cJSON_AddItemToArray(arr, o);
            }
        }
        pthread_mutex_unlock(&pool->lock);
    }
    return root;
}

/* A Prometheus label value: backslash, double quote and newline escaped. */
static void kvf_proxy_label(FILE *out, const char *v)
{
    for (; *v != '\0'; ++v) {
        if ((*v == '\\') || (*v == '"')) {
            fputc('\\', out);
            fputc(*v, out);
        } else if (*v == '\n') {
            fputs("\\n", out);
        } else {
            fputc(*v, out);
        }
    }
}

void kvf_proxy_pool_render_metrics(kvf_proxy_pool_h pool, FILE *out)
{
    static const struct {
        const char *name;
        const char *type;
        const char *help;
        bool        live;   /* only shown while the instance is healthy and connected */
    } g[] = {
        {"kvf_instance_healthy", "gauge", "1 when the instance answers health checks.", false},
        {"kvf_instance_free_pages", "gauge",
         "Free cache pages, summed over ranks (absent while unhealthy).", true},
        {"kvf_instance_total_pages", "gauge", "Cache pages, summed over ranks.", false},
        {"kvf_instance_running_requests", "gauge",
         "Requests holding blocks (absent while unhealthy).", true},
        {"kvf_instance_leases", "gauge",
         "Prefill: requests held for decode (absent while unhealthy).", true},
        {"kvf_instance_handshake_refusals_total", "counter",
         "Handshakes the instance refused or had refused.", false},
        {"kvf_instance_peer_errors_total", "counter", "Peer errors the instance saw.", false},
        {"kvf_instance_health_check_failures_total", "counter",
         "Health probes unanswered or failed.", false},
        {"kvf_instance_restarts_total", "counter",
         "Restarts seen: a new process (incarnation) under the same endpoint.", false},
        {"kvf_instance_releases_refused_total", "counter",
         "Prefill: lease claims/releases refused (wrong nonce or engine, replays).", false},
        {"kvf_instance_expired_lease_reads_prevented_total", "counter",
         "Reads not trusted because the KV lease expired (prefill: answered expired; decode:"
         " pulls not used or not started).", false},
        {"kvf_instance_quarantined_blocks_total", "counter",
         "Prefill: blocks of expired or aborted leases held in quarantine before reuse.", false},
    };
    int n = pool->count[0] + pool->count[1];
    kvf_proxy_instance_info_t *infos = calloc((size_t)(n > 0 ? n : 1), sizeof(*infos));
    int k = 0;

    if (infos == NULL) {
        return;
    }
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_pool_info(pool, (kvf_proxy_role_t)role, i, &infos[k++]);
        }
    }
    for (size_t m = 0; m < sizeof(g) / sizeof(g[0]); ++m) {
        fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", g[m].name, g[m].help, g[m].name, g[m].type);
        k = 0;
        for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
            for (int i = 0; i < pool->count[role]; ++i, ++k) {
                const kvf_proxy_instance_info_t *f = &infos[k];
                uint64_t v[] = {f->healthy, f->free_pages, f->total_pages, f->running, f->leases,
                                f->handshake_refusals, f->peer_errors, f->probes_failed,
                                f->restarts, f->releases_refused, f->expired_reads_prevented,
                                f->quarantined_blocks};
                /* Live gauges of an instance that does not answer would be
                 * stale: left out until it is healthy again. */
                if (g[m].live && !(f->healthy && f->connected)) {
                    continue;
                }
                fprintf(out, "%s{instance=\"", g[m].name);
                kvf_proxy_label(out, f->url);
                fprintf(out, "\",role=\"%s\",engine_id=\"",
                        kvf_proxy_role_name((kvf_proxy_role_t)role));
                kvf_proxy_label(out, f->engine_id);
                fprintf(out, "\"} %llu\n", (unsigned long long)v[m]);
            }
        }
    }
    free(infos);
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

    /* Register before sending, so an instant reply finds its mailbox. */
    pthread_mutex_lock(&pool->lock);
    c->next = pool->calls;
    pool->calls = c;
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

    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout_ms < 0) {
        timeout_ms = 0;
    }
    deadline.tv_sec += (time_t)(timeout_ms / 1000);
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
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
    for (struct kvf_proxy_call **pp = &pool->calls; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == call) {
            *pp = call->next;
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
