/*
 * kvf-proxy ZeroMQ I/O thread.
 *
 * Design: ZeroMQ sockets are not thread-safe, and the HTTP front end serves
 * many connections at once, so exactly one thread (this one) owns every
 * socket. Request threads queue serialized ServeRequests (kvf_proxy_mailbox.c)
 * and wake it through an eventfd that zmq_poll() watches next to the
 * sockets; replies are routed back by (instance, request_id) to mailboxes.
 * Rejected: a DEALER per request (a TCP connection per request and no single
 * place to see an instance's health) and inproc socket pairs per request
 * thread (more sockets, same routing work).
 *
 * The DEALERs use ZMQ_IMMEDIATE, so a send to an instance that is not
 * connected fails at once instead of queueing stale requests that would be
 * delivered minutes later. A socket monitor per DEALER reports connect and
 * disconnect; a disconnect fails the calls in flight on that instance
 * without waiting for any timeout (docs/ARCHITECTURE.md §9).
 *
 * Health: every health interval each instance gets a HealthRequest; its
 * reply refreshes the instance's info (kvf_proxy_io_health_reply).
 */
#define _GNU_SOURCE
#include "kvf_proxy_pool_int.h"
#include "kvf_log.h"
#include "kvf_pb_check.h"
#include "kvf_zmq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

kvf_status_t kvf_proxy_inst_open(struct kvf_proxy_pool *pool, kvf_proxy_instance_t *inst,
                                 const char *endpoint)
{
    static const kvf_zmq_opt_t sock_opts[] = {
        {ZMQ_LINGER, 0},
        {ZMQ_IMMEDIATE, 1},
        {ZMQ_RECONNECT_IVL, 100},
        {ZMQ_RECONNECT_IVL_MAX, 500},
        /* a link outage: ZMTP heartbeats drop the connection within 3 s (its TCP
         * socket would resume only at the next retransmission, backed off as
         * long as the outage lasted), and a connect attempt gives up after
         * 500 ms, so one lands within about 0.6 s of the link's return */
        {ZMQ_HEARTBEAT_IVL, 1000},
        {ZMQ_HEARTBEAT_TIMEOUT, 3000},
        {ZMQ_CONNECT_TIMEOUT, 500},
        /* a burst of requests (every admitted stream's prefill at once) must queue, not
         * fail: at the default 1000, a send past it got EAGAIN and the request a 502.
         * What is queued is bounded by admission (--max-connections, --max-outstanding) */
        {ZMQ_SNDHWM, KVF_ZMQ_SERVE_HWM},
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

    /* the generation: a socket reopened on a new address gets a fresh monitor name */
    snprintf(mon_url, sizeof(mon_url), "inproc://kvf-proxy-mon-%p-%d-%d-%u", (void *)pool,
             (int)inst->role, inst->idx, inst->sock_gen);
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
    if ((endpoint != NULL) && (kvf_zmq_connect(inst->sock, endpoint) != KVF_OK)) {
        kvf_error("bad %s endpoint '%s': %s", kvf_proxy_role_name(inst->role), endpoint,
                  zmq_strerror(zmq_errno()));
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

void kvf_proxy_inst_close(kvf_proxy_instance_t *inst)
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

void kvf_proxy_inst_unhealthy_locked(kvf_proxy_instance_t *inst, const char *why)
{
    if (inst->info.healthy) {
        kvf_warn("%s instance %s is unhealthy: %s", kvf_proxy_role_name(inst->role), inst->url,
                 why);
    }
    inst->info.healthy = false;
    /* cut to the field (a resolver error plus its prefix can be longer) */
    snprintf(inst->info.last_error, sizeof(inst->info.last_error), "%.*s",
             (int)sizeof(inst->info.last_error) - 1, why);
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
    /* EAGAIN: no connection is up (ZMQ_IMMEDIATE), or its queue is full; the monitor's
     * events lag, so the two are not told apart */
    snprintf(why, sizeof(why), "%s instance %s is not connected or its send queue "
             "(%d messages) is full (%s)", kvf_proxy_role_name(m->role), inst->url,
             KVF_ZMQ_SERVE_HWM, zmq_strerror(zmq_errno()));
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
        inst->rate_base = false;     /* a new process: its counters start again */
        info->prefill_rate_recent = 0;
        kvf_info("%s instance %s restarted (engine %s, restart %llu seen)", want, inst->url,
                 h->engine_id ? h->engine_id : "", (unsigned long long)info->restarts);
    }
    info->incarnation = h->incarnation;
    kvf_proxy_route_on_health_locked(inst, h);
    if (pool->kvidx[inst->role] != NULL) {   /* --routing prefix: prefill and decode alike */
        kvf_proxy_kvidx_src_t src = {
            .instance_addr = (inst->addr[0] != '\0') ? inst->addr : inst->url,
            .pub = h->kv_events_endpoint, .replay = h->kv_events_replay_endpoint,
            .incarnation = h->incarnation, .model_digest = h->model_digest,
            .hash_unit = h->has_prefix_hash_unit ? h->prefix_hash_unit : 0,
            .block_size = h->block_size};
        kvf_proxy_kvidx_update(pool->kvidx[inst->role], inst->idx, &src);   /* its own lock, never ours */
    }
    info->max_prompt_tokens = h->max_prompt_tokens;
    info->prefill_tokens_per_s = h->prefill_tokens_per_s;
    info->prefix_caching = h->prefix_caching;
    info->prefix_queries = h->prefix_queries_total;
    info->prefix_hits = h->prefix_hits_total;
    info->releases_refused = h->releases_refused;
    info->expired_reads_prevented = h->expired_reads_prevented;
    info->quarantined_blocks = h->quarantined_blocks;
    info->quarantine_cut_blocks = h->quarantine_cut_blocks;
    info->auth_refusals_serve = h->auth_refusals_serve;
    info->auth_refusals_side = h->auth_refusals_side;
    snprintf(info->device, sizeof(info->device), "%s", (h->device != NULL) ? h->device : "");
    if (h->draining && !info->draining) {
        kvf_info("%s instance %s (engine %s) is draining: no new requests go to it", want,
                 inst->url, info->engine_id);
    }
    info->draining = h->draining;
    inst->last_ok_ms = (int64_t)kvf_time_now_ms();
    if (strcmp(info->reported_role, want) != 0) {
        snprintf(why, sizeof(why), "instance reports role '%s' but is listed as %s",
                 info->reported_role, want);
        kvf_proxy_inst_unhealthy_locked(inst, why);
        goto out;
    }
    if (!kvf_proxy_tok_check_locked(pool, inst, h, why, sizeof(why))) {
        info->connected = true;   /* it answers; its model is not this proxy's */
        kvf_proxy_inst_unhealthy_locked(inst, why);
        goto out;
    }
    if ((h->cannot_serve != NULL) && (h->cannot_serve[0] != '\0')) {
        /* it answers, but cannot serve (a broken TP world): not routed, its error shown */
        snprintf(why, sizeof(why), "instance cannot serve: %s", h->cannot_serve);
        info->connected = true;
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
        if (kvf_proxy_call_deliver_locked(pool, inst, r)) {
            r = NULL;
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
            inst->lost_ms = (int64_t)kvf_time_now_ms();
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
            if (inst->addr[0] == '\0') {   /* a name with no address yet: why, in /health */
                char why[KVF_PROXY_DNS_ERROR_MAX + 32];

                if (inst->info.resolve_error[0] != '\0') {
                    snprintf(why, sizeof(why), "%s", inst->info.resolve_error);
                } else if (inst->want[0] != '\0') {
                    snprintf(why, sizeof(why), "cannot connect to %s", inst->want);
                } else {
                    snprintf(why, sizeof(why), "resolving %s", inst->host);
                }
                kvf_proxy_inst_unhealthy_locked(inst, why);
                pthread_mutex_unlock(&pool->lock);
                continue;
            }
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

/* The poll set: the eventfd, then each instance's DEALER and monitor. Its size. */
static int kvf_proxy_io_items(struct kvf_proxy_pool *pool, zmq_pollitem_t *items,
                              kvf_proxy_instance_t **owner)
{
    int k = 1;

    items[0].fd = pool->efd;
    items[0].events = ZMQ_POLLIN;
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            if (pool->inst[role][i].sock == NULL) {
                continue;        /* its reopen failed: nothing to poll until the next */
            }
            owner[k] = &pool->inst[role][i];
            items[k].socket = owner[k]->sock;
            items[k++].events = ZMQ_POLLIN;
            owner[k] = &pool->inst[role][i];
            items[k].socket = owner[k]->mon;
            items[k++].events = ZMQ_POLLIN;
        }
    }
    return k;
}

void *kvf_proxy_io_main(void *arg)
{
    struct kvf_proxy_pool *pool = arg;
    int n = pool->count[0] + pool->count[1];
    zmq_pollitem_t *items = calloc((size_t)(1 + 2 * n), sizeof(*items));
    kvf_proxy_instance_t **owner = calloc((size_t)(1 + 2 * n), sizeof(*owner));
    int64_t next_probe = 0;
    int k;

    if ((items == NULL) || (owner == NULL)) {
        kvf_error("proxy i/o thread: out of memory");
        free(items);
        free(owner);
        return NULL;
    }
    k = kvf_proxy_io_items(pool, items, owner);

    while (!atomic_load(&pool->stop)) {
        int64_t now = (int64_t)kvf_time_now_ms();
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
        if (kvf_proxy_io_apply_dns(pool)) {
            memset(items, 0, (size_t)(1 + 2 * n) * sizeof(*items));
            k = kvf_proxy_io_items(pool, items, owner);
        }
        now = (int64_t)kvf_time_now_ms();
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
