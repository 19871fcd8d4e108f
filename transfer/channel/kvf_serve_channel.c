/*
 * ROUTER side of the serving control channel. Frames: [routing id][body]
 * (DEALER peers send no empty delimiter). A message with any other shape is
 * answered with an error reply and dropped: the proxy is trusted, but a
 * stray client must never take the daemon down.
 *
 * Design: an I/O thread owns the ROUTER and answers health probes from a
 * snapshot the leader publishes between engine steps, adding the age of
 * the step in progress; everything else crosses an inproc PAIR to the
 * leader as [routing id][body], and the leader's replies come back the
 * same way. So an engine step of any length (a long prompt's prefill on a
 * busy host) never delays a health answer, and the proxy tells "busy" from
 * "dead". Rejected: answering health from the leader between steps (a
 * 20 s step made instances look dead and dropped them from routing) and a
 * second ROUTER port for health (one more port per instance to configure
 * and firewall, and the proxy would learn about a dead control socket only
 * from requests).
 *
 * Inproc frames: [id][body] both ways; a single empty frame from the
 * leader tells the I/O thread to stop.
 */
#include "kvf_serve_channel.h"
#include "kvf_time.h"
#include "kvf_log.h"
#include "kvf_pb_check.h"
#include "kvf_zmq.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvf_serve_server {
    void            *ctx;
    void            *sock;          /* ROUTER: the I/O thread's after create */
    void            *io;            /* PAIR, I/O thread end */
    void            *leader;        /* PAIR, leader end */
    pthread_t        thread;
    bool             thread_started;
    pthread_mutex_t  lock;          /* guards the fields below */
    uint8_t         *health;        /* packed Kvf__HealthReply; NULL until published */
    size_t           health_len;
    double           last_step_ms;
    uint64_t         step_start_ns; /* 0: no step in progress */
    atomic_uint_fast64_t answered;
    const volatile sig_atomic_t *_Atomic stop;   /* non-zero: report draining; may be NULL */
};

/* Drain the remaining frames of a multipart message we are rejecting. */
static void kvf_serve_drain(void *sock)
{
    int more = 1;
    size_t sz = sizeof(more);
    while ((zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0) && more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, 0) < 0) {
            zmq_msg_close(&m);
            return;
        }
        zmq_msg_close(&m);
    }
}

/* Pack @a reply and send [id][body] on @a sock without blocking. */
static kvf_status_t kvf_serve_send(void *sock, const uint8_t *id, size_t id_len,
                                   const Kvf__ServeReply *reply)
{
    size_t len = kvf__serve_reply__get_packed_size(reply);
    uint8_t *buf = malloc(len ? len : 1);
    kvf_status_t status = KVF_OK;

    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf__serve_reply__pack(reply, buf);
    if ((zmq_send(sock, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
        (zmq_send(sock, buf, len, ZMQ_DONTWAIT) < 0)) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_NET, "reply to a departed peer dropped: %s",
                zmq_strerror(zmq_errno()));
        status = KVF_ERR_ZMQ;
    }
    free(buf);
    return status;
}

static void kvf_serve_send_error(void *sock, const uint8_t *id, size_t id_len,
                                 kvf_status_t status, const char *error)
{
    Kvf__ServeReply reply = KVF__SERVE_REPLY__INIT;

    reply.request_id = (char *)"";
    reply.has_status = 1;
    reply.status = status;
    reply.error = (char *)error;
    reply.has_done = 1;
    reply.done = 1;
    reply.finish_reason = (char *)"error";
    (void)kvf_serve_send(sock, id, id_len, &reply);
}

/* I/O thread: answer a health probe from the snapshot. false: none published yet. */
static bool kvf_serve_answer_health(struct kvf_serve_server *srv, const uint8_t *id,
                                    size_t id_len)
{
    Kvf__ServeReply reply = KVF__SERVE_REPLY__INIT;
    Kvf__HealthReply *h;
    uint64_t now = kvf_time_now_ns();
    double last, running;

    pthread_mutex_lock(&srv->lock);
    h = (srv->health != NULL) ?
        kvf__health_reply__unpack(NULL, srv->health_len, srv->health) : NULL;
    last = srv->last_step_ms;
    running = (srv->step_start_ns != 0) ? (double)(now - srv->step_start_ns) / 1e6 : 0.0;
    pthread_mutex_unlock(&srv->lock);
    if (h == NULL) {
        return false;
    }
    {
        const volatile sig_atomic_t *stop = atomic_load(&srv->stop);
        if ((stop != NULL) && (*stop != 0)) {
            h->has_draining = 1;
            h->draining = 1;
        }
    }
    h->has_step_ms = h->has_step_running_ms = 1;
    h->step_ms = last;
    h->step_running_ms = running;
    reply.request_id = (char *)"health";   /* proto: health replies carry this id */
    reply.health = h;
    reply.has_done = 1;
    reply.done = 1;
    /* counted before the send, so a prober holding the answer always sees it counted */
    atomic_fetch_add(&srv->answered, 1);
    (void)kvf_serve_send(srv->sock, id, id_len, &reply);
    kvf__health_reply__free_unpacked(h, NULL);
    return true;
}

/* I/O thread: one message from a peer on the ROUTER. */
static void kvf_serve_from_peer(struct kvf_serve_server *srv)
{
    zmq_msg_t id, body;
    Kvf__ServeRequest *req;
    int more = 0;
    size_t sz = sizeof(more);
    bool health;

    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, srv->sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&id);
        return;
    }
    if (zmq_msg_size(&id) > KVF_SERVE_PEER_ID_MAX) {
        zmq_msg_close(&id);
        kvf_serve_drain(srv->sock);
        return;
    }
    zmq_getsockopt(srv->sock, ZMQ_RCVMORE, &more, &sz);
    if (!more) {
        kvf_serve_send_error(srv->sock, zmq_msg_data(&id), zmq_msg_size(&id), KVF_ERR_PARSE,
                             "empty message");
        zmq_msg_close(&id);
        return;
    }
    zmq_msg_init(&body);
    if (zmq_msg_recv(&body, srv->sock, 0) < 0) {
        zmq_msg_close(&body);
        zmq_msg_close(&id);
        return;
    }
    more = 0;
    zmq_getsockopt(srv->sock, ZMQ_RCVMORE, &more, &sz);
    if (more) {
        kvf_serve_drain(srv->sock);
        kvf_serve_send_error(srv->sock, zmq_msg_data(&id), zmq_msg_size(&id), KVF_ERR_PARSE,
                             "expected one frame per request");
        goto out;
    }
    KVF_PB_UNPACK_CHECK_IGNORE(kvf__serve_request, req, zmq_msg_size(&body),
                               zmq_msg_data(&body));
    if ((req == NULL) || (req->body_case == KVF__SERVE_REQUEST__BODY__NOT_SET)) {
        if (req != NULL) {
            kvf__serve_request__free_unpacked(req, NULL);
        }
        kvf_serve_send_error(srv->sock, zmq_msg_data(&id), zmq_msg_size(&id), KVF_ERR_PARSE,
                             "malformed ServeRequest");
        goto out;
    }
    health = (req->body_case == KVF__SERVE_REQUEST__BODY_HEALTH);
    kvf__serve_request__free_unpacked(req, NULL);
    if (health && kvf_serve_answer_health(srv, zmq_msg_data(&id), zmq_msg_size(&id))) {
        goto out;
    }
    /* to the leader: [id][body]; inproc with no high-water mark never blocks */
    if ((zmq_msg_send(&id, srv->io, ZMQ_SNDMORE) < 0) || (zmq_msg_send(&body, srv->io, 0) < 0)) {
        kvf_error("control channel: forwarding a request to the leader failed: %s",
                  zmq_strerror(zmq_errno()));
    }
out:
    zmq_msg_close(&body);
    zmq_msg_close(&id);
}

/* I/O thread: one message from the leader. false: the leader asked us to stop. */
static bool kvf_serve_from_leader(struct kvf_serve_server *srv)
{
    zmq_msg_t id, body;
    int more = 0;
    size_t sz = sizeof(more);

    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, srv->io, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&id);
        return true;
    }
    zmq_getsockopt(srv->io, ZMQ_RCVMORE, &more, &sz);
    if (!more) {
        zmq_msg_close(&id);
        return false;             /* the stop frame */
    }
    zmq_msg_init(&body);
    if (zmq_msg_recv(&body, srv->io, 0) < 0) {
        zmq_msg_close(&body);
        zmq_msg_close(&id);
        return true;
    }
    if ((zmq_msg_send(&id, srv->sock, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
        (zmq_msg_send(&body, srv->sock, ZMQ_DONTWAIT) < 0)) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_NET, "reply to a departed peer dropped: %s",
                zmq_strerror(zmq_errno()));
    }
    zmq_msg_close(&body);
    zmq_msg_close(&id);
    return true;
}

static void *kvf_serve_io_main(void *arg)
{
    struct kvf_serve_server *srv = arg;
    zmq_pollitem_t items[2] = {
        {.socket = srv->sock, .events = ZMQ_POLLIN},
        {.socket = srv->io, .events = ZMQ_POLLIN},
    };

    for (;;) {
        if (zmq_poll(items, 2, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            kvf_error("control channel: zmq_poll failed: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if ((items[1].revents & ZMQ_POLLIN) && !kvf_serve_from_leader(srv)) {
            break;
        }
        if (items[0].revents & ZMQ_POLLIN) {
            kvf_serve_from_peer(srv);
        }
    }
    return NULL;
}

/* Inproc pair end: no high-water mark (0), so neither side ever blocks or drops. */
static kvf_status_t kvf_serve_pair_socket(void *ctx, void **sock_p)
{
    const kvf_zmq_opt_t opts[] = {{ZMQ_LINGER, 0}, {ZMQ_SNDHWM, 0}, {ZMQ_RCVHWM, 0}};

    return kvf_zmq_socket_open(ctx, ZMQ_PAIR, opts, sizeof(opts) / sizeof(opts[0]), sock_p);
}

kvf_status_t kvf_serve_server_create(const char *endpoint, kvf_serve_server_h *srv_p)
{
    struct kvf_serve_server *srv = calloc(1, sizeof(*srv));
    const kvf_zmq_opt_t opts[] = {
        {ZMQ_LINGER, 0},
        {ZMQ_SNDHWM, KVF_ZMQ_SERVE_HWM},   /* replies are dropped past it */
        {ZMQ_MAXMSGSIZE, 64ll << 20},   /* a stray client cannot make us buffer more */
    };
    char pair_url[64];
    kvf_status_t status = KVF_ERR_ZMQ;

    if (srv == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&srv->lock, NULL);
    atomic_init(&srv->answered, 0);
    atomic_init(&srv->stop, NULL);
    srv->ctx = zmq_ctx_new();
    if (srv->ctx == NULL) {
        kvf_error("zmq_ctx_new failed: %s", zmq_strerror(zmq_errno()));
        goto err_free;
    }
    if (kvf_zmq_socket_open(srv->ctx, ZMQ_ROUTER, opts, sizeof(opts) / sizeof(opts[0]),
                            &srv->sock) != KVF_OK) {
        goto err_ctx;
    }
    if (kvf_zmq_bind(srv->ctx, srv->sock, endpoint, "serve") != KVF_OK) {
        kvf_error("cannot listen on %s: %s", endpoint, zmq_strerror(zmq_errno()));
        goto err_socks;
    }
    snprintf(pair_url, sizeof(pair_url), "inproc://kvf-serve-%p", (void *)srv);
    if ((kvf_serve_pair_socket(srv->ctx, &srv->io) != KVF_OK) ||
        (kvf_serve_pair_socket(srv->ctx, &srv->leader) != KVF_OK)) {
        goto err_socks;
    }
    KVF_ZMQ_CHECK_GOTO(zmq_bind(srv->io, pair_url), status, err_socks);
    KVF_ZMQ_CHECK_GOTO(zmq_connect(srv->leader, pair_url), status, err_socks);
    if (pthread_create(&srv->thread, NULL, kvf_serve_io_main, srv) != 0) {
        kvf_error("control channel: cannot start its i/o thread");
        status = KVF_ERR_NO_RESOURCE;
        goto err_socks;
    }
    srv->thread_started = true;
    *srv_p = srv;
    return KVF_OK;

err_socks:
    if (srv->leader != NULL) {
        zmq_close(srv->leader);
    }
    if (srv->io != NULL) {
        zmq_close(srv->io);
    }
    zmq_close(srv->sock);
err_ctx:
    zmq_ctx_term(srv->ctx);
err_free:
    pthread_mutex_destroy(&srv->lock);
    free(srv);
    return status;
}

void kvf_serve_server_watch_stop(kvf_serve_server_h srv, const volatile sig_atomic_t *stop)
{
    atomic_store(&srv->stop, stop);
}

void kvf_serve_server_destroy(kvf_serve_server_h srv)
{
    if (srv == NULL) {
        return;
    }
    if (srv->thread_started) {
        while ((zmq_send(srv->leader, "", 0, 0) < 0) && (errno == EINTR)) {
        }
        pthread_join(srv->thread, NULL);
    }
    {
        /* the last replies (a drain's final answers) still go out: up to 1 s to
         * connected peers; messages to departed peers were dropped already */
        int linger_ms = 1000;
        (void)zmq_setsockopt(srv->sock, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
    }
    zmq_close(srv->leader);
    zmq_close(srv->io);
    zmq_close(srv->sock);
    zmq_ctx_term(srv->ctx);
    pthread_mutex_destroy(&srv->lock);
    free(srv->health);
    free(srv);
}

kvf_status_t kvf_serve_server_set_health(kvf_serve_server_h srv, const Kvf__HealthReply *health)
{
    size_t len = kvf__health_reply__get_packed_size(health);
    uint8_t *buf = malloc(len ? len : 1);
    uint8_t *old;

    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf__health_reply__pack(health, buf);
    pthread_mutex_lock(&srv->lock);
    old = srv->health;
    srv->health = buf;
    srv->health_len = len;
    pthread_mutex_unlock(&srv->lock);
    free(old);
    return KVF_OK;
}

void kvf_serve_server_step_begin(kvf_serve_server_h srv)
{
    uint64_t now = kvf_time_now_ns();

    pthread_mutex_lock(&srv->lock);
    srv->step_start_ns = (now != 0) ? now : 1;
    pthread_mutex_unlock(&srv->lock);
}

void kvf_serve_server_step_end(kvf_serve_server_h srv)
{
    uint64_t now = kvf_time_now_ns();

    pthread_mutex_lock(&srv->lock);
    if (srv->step_start_ns != 0) {
        srv->last_step_ms = (double)(now - srv->step_start_ns) / 1e6;
    }
    srv->step_start_ns = 0;
    pthread_mutex_unlock(&srv->lock);
}

uint64_t kvf_serve_server_health_answered(kvf_serve_server_h srv)
{
    return atomic_load(&srv->answered);
}

kvf_status_t kvf_serve_server_recv(kvf_serve_server_h srv, int timeout_ms,
                                   kvf_serve_peer_t *peer_p, Kvf__ServeRequest **req_p)
{
    zmq_pollitem_t item = {.socket = srv->leader, .events = ZMQ_POLLIN};
    zmq_msg_t id, body;
    int rc;

    rc = zmq_poll(&item, 1, timeout_ms);
    if (rc < 0) {
        if (errno == EINTR) {
            return KVF_ERR_TIMED_OUT;
        }
        kvf_error("zmq_poll failed: %s", zmq_strerror(zmq_errno()));
        return KVF_ERR_ZMQ;
    }
    if (rc == 0) {
        return KVF_ERR_TIMED_OUT;   /* a local wait: no peer owed us anything */
    }
    /* The I/O thread forwards only [id][body] with a checked id length. */
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, srv->leader, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&id);
        return KVF_ERR_TIMED_OUT;
    }
    peer_p->len = zmq_msg_size(&id);
    memcpy(peer_p->id, zmq_msg_data(&id), peer_p->len);
    zmq_msg_close(&id);
    zmq_msg_init(&body);
    while (zmq_msg_recv(&body, srv->leader, 0) < 0) {
        if (errno != EINTR) {
            zmq_msg_close(&body);
            return KVF_ERR_ZMQ;
        }
    }
    KVF_PB_UNPACK_CHECK_IGNORE(kvf__serve_request, *req_p, zmq_msg_size(&body),
                               zmq_msg_data(&body));
    zmq_msg_close(&body);
    if (*req_p == NULL) {
        kvf_serve_server_reply_error(srv, peer_p, "", KVF_ERR_PARSE, "malformed ServeRequest");
        return KVF_ERR_PARSE;
    }
    return KVF_OK;
}

bool kvf_serve_server_wait(kvf_serve_server_h srv, int timeout_ms, const int *fds, int nfds)
{
    zmq_pollitem_t items[17];
    int n = 1;

    memset(items, 0, sizeof(items));
    items[0].socket = srv->leader;
    items[0].events = ZMQ_POLLIN;
    for (int i = 0; (i < nfds) && (n < 17); ++i, ++n) {
        items[n].fd = fds[i];
        items[n].events = ZMQ_POLLIN;
    }
    if (zmq_poll(items, n, timeout_ms) <= 0) {
        return false;
    }
    return (items[0].revents & ZMQ_POLLIN) != 0;
}

kvf_status_t kvf_serve_server_reply(kvf_serve_server_h srv, const kvf_serve_peer_t *peer,
                                    const Kvf__ServeReply *reply)
{
    return kvf_serve_send(srv->leader, peer->id, peer->len, reply);
}

kvf_status_t kvf_serve_server_reply_error(kvf_serve_server_h srv, const kvf_serve_peer_t *peer,
                                          const char *request_id, kvf_status_t status,
                                          const char *error)
{
    Kvf__ServeReply reply = KVF__SERVE_REPLY__INIT;

    reply.request_id = (char *)request_id;
    reply.has_status = 1;
    reply.status = status;
    reply.error = (char *)error;
    reply.has_done = 1;
    reply.done = 1;
    reply.finish_reason = (char *)"error";
    return kvf_serve_server_reply(srv, peer, &reply);
}
