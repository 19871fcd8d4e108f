/*
 * ZeroMQ side channel: the server thread (the client is
 * kvf_side_channel_client.c).
 *
 * Design: a ROUTER socket, so one connection per decode carries many
 * requests; a request is [identity] [ticket or empty delimiter]? [payload]
 * and its answer goes back with the same envelope, so a DEALER client
 * matches answers to tickets and a plain REQ client (tests, tools) is
 * answered as a REP would. The server owns its socket from its thread only
 * (ZeroMQ sockets are not thread-safe) and polls with a 100 ms timeout so
 * stop() is prompt without signals or inproc pipes. The metadata reply is
 * immutable after start, so it is packed once and every request costs one
 * send; sends never block (a peer that stopped reading loses its answers,
 * as it would after its own timeout).
 */
#include "kvf_side_channel.h"

#include "kvf_fault.h"
#include "kvf_log.h"
#include "kvf_time.h"
#include "kvf_zmq.h"
#include "kvf_zmq_auth.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kvf_side_channel_server {
    void           *ctx;
    void           *sock;
    pthread_t       thread;
    atomic_bool     stop;
    int             port;
    char            engine_id[KVF_ENGINE_ID_MAX];
    uint8_t        *reply;        /* packed metadata reply */
    size_t          reply_len;
    atomic_ulong    served;
    atomic_ulong    malformed;
    kvf_side_channel_lease_func_t lease_func;
    void           *lease_arg;
    bool            wedged;       /* fault side.reply=drop: answers nothing any more */
};

/* ---- server ----------------------------------------------------------- */

/* Where a reply goes: the ROUTER identity and the envelope frame the request
 * came with (a DEALER's ticket, a REQ's empty delimiter, or none). */
typedef struct kvf_sc_route {
    zmq_msg_t *id;
    zmq_msg_t *env;    /* NULL: no envelope frame */
} kvf_sc_route_t;

/* Send @a len bytes as the reply along @a route; never blocks (a peer whose
 * queue is full loses it, as it would a reply after its timeout). */
static void kvf_side_channel_send(kvf_side_channel_server_h s, const kvf_sc_route_t *route,
                                  const void *buf, size_t len)
{
    if (zmq_send(s->sock, zmq_msg_data(route->id), zmq_msg_size(route->id),
                 ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        return;
    }
    if ((route->env != NULL) &&
        (zmq_send(s->sock, zmq_msg_data(route->env), zmq_msg_size(route->env),
                  ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)) {
        return;
    }
    (void)zmq_send(s->sock, buf, len, ZMQ_DONTWAIT);
}

static void kvf_side_channel_send_error(kvf_side_channel_server_h s, const kvf_sc_route_t *route,
                                        const char *why, const kvf_refusal_t *refusal)
{
    kvf_handshake_reply_t reply;
    uint8_t *buf;
    size_t len;

    memset(&reply, 0, sizeof(reply));
    reply.accepted = false;
    snprintf(reply.engine_id, sizeof(reply.engine_id), "%s", s->engine_id);
    snprintf(reply.error, sizeof(reply.error), "%s", why);
    if (refusal != NULL) {
        reply.refusals[0] = *refusal;
        reply.num_refusals = 1;
    }
    if (kvf_handshake_reply_pack(&reply, &buf, &len) != KVF_OK) {
        kvf_side_channel_send(s, route, "", 0);   /* an empty reply is malformed: an answer */
        return;
    }
    kvf_side_channel_send(s, route, buf, len);
    free(buf);
}

static void kvf_side_channel_lease_answer(kvf_side_channel_server_h s, const kvf_sc_route_t *route,
                                          const kvf_handshake_request_t *req,
                                          const char *requester)
{
    kvf_lease_answer_t answer;
    uint8_t *buf;
    size_t len;

    memset(&answer, 0, sizeof(answer));
    if (s->lease_func == NULL) {
        answer.verdict = KVF_LEASE_REFUSED;
        snprintf(answer.why, sizeof(answer.why), "engine %s holds no leases", s->engine_id);
    } else {
        s->lease_func(s->lease_arg, requester, &req->lease, req->xfer_timeout_ms, &answer);
    }
    if (kvf_lease_reply_pack(s->engine_id, &answer, &buf, &len) != KVF_OK) {
        kvf_side_channel_send(s, route, "", 0);
        return;
    }
    kvf_side_channel_send(s, route, buf, len);
    free(buf);
}

#if KVF_FAULT_ENABLED
/* Fault points side.rkey / side.reply (kvf_fault.h): @return true when the reply was handled. */
static bool kvf_side_channel_fault_reply(kvf_side_channel_server_h s, const kvf_sc_route_t *route)
{
    kvf_fault_action_t rkey = KVF_FAULT(SIDE_RKEY);
    kvf_fault_action_t reply = KVF_FAULT(SIDE_REPLY);
    kvf_handshake_reply_t r;
    uint8_t *buf;
    size_t len;

    if (reply == KVF_FAULT_DROP) {
        kvf_warn("side channel: fault side.reply: this handshake and every request after it"
                 " are never answered (a hung side channel)");
        s->wedged = true;   /* as a hung peer's: nothing is answered from now on */
        return true;
    }
    if (reply == KVF_FAULT_CORRUPT) {
        buf = malloc(s->reply_len);
        if (buf != NULL) {
            memcpy(buf, s->reply, s->reply_len);
            kvf_fault_garble(buf, s->reply_len, s->reply_len / 2);
            kvf_side_channel_send(s, route, buf, s->reply_len);
            free(buf);
            return true;
        }
    }
    if ((rkey == KVF_FAULT_CORRUPT) &&
        (kvf_handshake_reply_unpack(s->reply, s->reply_len, &r) == KVF_OK)) {
        uint32_t x = 0x9e3779b9u;   /* xorshift: same bytes on every run */
        /* 5 bytes after each key, as a newer UCX may append (1.22 does to CUDA keys) */
        for (int i = 0; i < r.num_ranks; ++i) {
            for (int j = 0; j < r.ranks[i].num_regions; ++j) {
                kvf_xfer_region_meta_t *g = &r.ranks[i].regions[j];
                for (size_t b = 0; (b < 5) && (g->rkey_len < KVF_RKEY_MAX); ++b) {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    g->rkey[g->rkey_len++] = (uint8_t)x;
                }
            }
        }
        if (kvf_handshake_reply_pack(&r, &buf, &len) == KVF_OK) {
            kvf_side_channel_send(s, route, buf, len);
            free(buf);
            kvf_handshake_reply_cleanup(&r);
            return true;
        }
        kvf_handshake_reply_cleanup(&r);
    }
    return false;
}
#endif

/*
 * Who sent @a msg: the authenticated member id, or NULL when the socket is
 * not authenticated or the pool runs insecure (then the claimed engine id
 * stands, as before authentication existed).
 */
static const char *kvf_side_channel_peer(zmq_msg_t *msg)
{
    const char *id = kvf_zmq_msg_peer_id(msg);

    if ((id != NULL) && (id[0] != '\0') && (strcmp(id, "insecure") != 0)) {
        return id;
    }
    return NULL;
}

static void kvf_side_channel_refuse(kvf_side_channel_server_h s, const kvf_sc_route_t *route,
                                    const char *field, const char *local, const char *remote,
                                    const char *why, const char *error)
{
    kvf_refusal_t refusal;

    memset(&refusal, 0, sizeof(refusal));
    snprintf(refusal.field, sizeof(refusal.field), "%s", field);
    snprintf(refusal.local, sizeof(refusal.local), "%s", local);
    snprintf(refusal.remote, sizeof(refusal.remote), "%s", remote);
    snprintf(refusal.why, sizeof(refusal.why), "%s", why);
    kvf_side_channel_send_error(s, route, error, &refusal);
}

static void kvf_side_channel_handle(kvf_side_channel_server_h s, const kvf_sc_route_t *route,
                                    zmq_msg_t *msg, bool malformed)
{
    kvf_handshake_request_t req;
    const char *peer;
    char ver[16];

    if (malformed || (kvf_handshake_request_unpack(zmq_msg_data(msg), zmq_msg_size(msg),
                                                   &req) != KVF_OK)) {
        atomic_fetch_add(&s->malformed, 1);
        kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "side channel: malformed handshake request "
                "(%zu bytes) answered with an error", zmq_msg_size(msg));
        kvf_side_channel_send_error(s, route, "malformed handshake request", NULL);
        return;
    }
    if (req.protocol_version != KVF_XFER_PROTOCOL_VERSION) {
        char remote[16];
        snprintf(ver, sizeof(ver), "%u", KVF_XFER_PROTOCOL_VERSION);
        snprintf(remote, sizeof(remote), "%u", req.protocol_version);
        kvf_side_channel_refuse(s, route, "protocol_version", ver, remote,
                                "protocol versions differ", "protocol version mismatch");
        kvf_handshake_request_cleanup(&req);
        return;
    }
    peer = kvf_side_channel_peer(msg);
    if ((peer != NULL) && (strcmp(peer, req.engine_id) != 0) && req.has_lease) {
        kvf_lease_answer_t refused;
        uint8_t *buf;
        size_t len;

        /* a lease operation is answered as one, so the requester reads the refusal */
        kvf_warn("side channel: a peer authenticated as %s claims engine id %s: lease"
                 " operation refused", peer, req.engine_id);
        memset(&refused, 0, sizeof(refused));
        refused.verdict = KVF_LEASE_REFUSED;
        snprintf(refused.why, sizeof(refused.why), "engine id %s is not the authenticated"
                 " peer %s", req.engine_id, peer);
        if (kvf_lease_reply_pack(s->engine_id, &refused, &buf, &len) == KVF_OK) {
            kvf_side_channel_send(s, route, buf, len);
            free(buf);
        }
        kvf_handshake_request_cleanup(&req);
        return;
    }
    if ((peer != NULL) && (strcmp(peer, req.engine_id) != 0)) {
        atomic_fetch_add(&s->malformed, 1);
        kvf_warn("side channel: a peer authenticated as %s claims engine id %s: refused", peer,
                 req.engine_id);
        kvf_side_channel_refuse(s, route, "engine_id", peer, req.engine_id,
                                "the engine id differs from the peer's authenticated id",
                                "engine id does not match the authenticated peer");
        kvf_handshake_request_cleanup(&req);
        return;
    }
    if ((req.want_engine_id[0] != '\0') && (strcmp(req.want_engine_id, s->engine_id) != 0)) {
        kvf_side_channel_refuse(s, route, "engine_id", s->engine_id, req.want_engine_id,
                                "this side channel serves another engine", "wrong engine id");
        kvf_handshake_request_cleanup(&req);
        return;
    }
    if (req.has_lease) {
        kvf_side_channel_lease_answer(s, route, &req, (peer != NULL) ? peer : req.engine_id);
        kvf_handshake_request_cleanup(&req);
        return;
    }
#if KVF_FAULT_ENABLED
    if (kvf_side_channel_fault_reply(s, route)) {
        return;
    }
#endif
    kvf_side_channel_send(s, route, s->reply, s->reply_len);
}

/* Frames of one request: [identity] [envelope]? [payload]; extra ones are malformed. */
#define KVF_SC_MAX_FRAMES 4

static void kvf_side_channel_serve_one(kvf_side_channel_server_h s)
{
    zmq_msg_t frames[KVF_SC_MAX_FRAMES];
    kvf_sc_route_t route;
    int n = 0, more = 1;
    size_t more_len = sizeof(more);
    bool malformed = false;

    while (more) {
        zmq_msg_t *f = &frames[(n < KVF_SC_MAX_FRAMES) ? n : KVF_SC_MAX_FRAMES - 1];
        if (n >= KVF_SC_MAX_FRAMES) {
            zmq_msg_close(f);   /* keep the first frames, drop the rest */
            malformed = true;
        } else {
            ++n;
        }
        zmq_msg_init(f);
        if (zmq_msg_recv(f, s->sock, (n == 1) ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(f);
            if (--n == 0) {
                return;
            }
            break;
        }
        zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &more_len);
    }
    if (n < 2) {
        for (int i = 0; i < n; ++i) {
            zmq_msg_close(&frames[i]);
        }
        return;   /* an identity and nothing: nobody to answer */
    }
    /* a DEALER's ticket is 8 bytes, a REQ's delimiter empty */
    route.id = &frames[0];
    route.env = NULL;
    if ((n >= 3) && ((zmq_msg_size(&frames[1]) == 0) || (zmq_msg_size(&frames[1]) == 8))) {
        route.env = &frames[1];
    }
    malformed |= (n > ((route.env != NULL) ? 3 : 2));
    /* counted before the reply goes out, so a client holding its answer
     * always finds it in the stats (tests and /metrics read them) */
    atomic_fetch_add(&s->served, 1);
    if (!s->wedged) {
        kvf_side_channel_handle(s, &route, &frames[n - 1], malformed);
    }
    for (int i = 0; i < n; ++i) {
        zmq_msg_close(&frames[i]);
    }
}

static void *kvf_side_channel_thread(void *arg)
{
    kvf_side_channel_server_h s = arg;
    zmq_pollitem_t item = {s->sock, 0, ZMQ_POLLIN, 0};

    while (!atomic_load(&s->stop)) {
        if (zmq_poll(&item, 1, 100) <= 0) {
            continue;   /* timeout or EINTR: re-check stop */
        }
        for (int i = 0; (i < 64) && !atomic_load(&s->stop); ++i) {
            int events = 0;
            size_t elen = sizeof(events);
            if ((zmq_getsockopt(s->sock, ZMQ_EVENTS, &events, &elen) != 0) ||
                !(events & ZMQ_POLLIN)) {
                break;
            }
            kvf_side_channel_serve_one(s);
        }
    }
    return NULL;
}

kvf_status_t kvf_side_channel_server_start(const kvf_side_channel_params_t *params,
                                           kvf_side_channel_server_h *server_p)
{
    kvf_side_channel_server_h s;
    kvf_handshake_reply_t reply;
    char endpoint[128];
    size_t ep_len = sizeof(endpoint);
    const kvf_zmq_opt_t opts[] = {
        {ZMQ_LINGER, 0},
        {ZMQ_MAXMSGSIZE, KVF_SIDE_CHANNEL_MAX_MSG},
    };
    kvf_status_t status;
    const char *host;
    char *colon;

    if ((params == NULL) || (params->field_mask & ~KVF_SIDE_CHANNEL_PARAM_FIELDS_KNOWN) ||
        (params->engine_id == NULL) || (params->ranks == NULL) || (params->num_ranks < 1) ||
        (strlen(params->engine_id) >= KVF_ENGINE_ID_MAX)) {
        return KVF_ERR_INVALID_PARAM;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    snprintf(s->engine_id, sizeof(s->engine_id), "%s", params->engine_id);
    s->lease_func = params->lease_func;
    s->lease_arg = params->lease_arg;

    memset(&reply, 0, sizeof(reply));
    reply.accepted = true;
    snprintf(reply.engine_id, sizeof(reply.engine_id), "%s", params->engine_id);
    reply.num_ranks = params->num_ranks;
    reply.ranks = (kvf_rank_meta_t *)params->ranks;
    status = kvf_handshake_reply_pack(&reply, &s->reply, &s->reply_len);
    if (status != KVF_OK) {
        goto err_free;
    }

    s->ctx = zmq_ctx_new();
    if (s->ctx == NULL) {
        status = KVF_ERR_ZMQ;
        goto err_free_reply;
    }
    status = kvf_zmq_socket_open(s->ctx, ZMQ_ROUTER, opts, sizeof(opts) / sizeof(opts[0]),
                                 &s->sock);
    if (status != KVF_OK) {
        goto err_term;
    }
    host = ((params->field_mask & KVF_SIDE_CHANNEL_PARAM_FIELD_HOST) && (params->host != NULL)) ?
           params->host : "127.0.0.1";
    if ((params->field_mask & KVF_SIDE_CHANNEL_PARAM_FIELD_PORT) && (params->port > 0)) {
        snprintf(endpoint, sizeof(endpoint), "tcp://%s:%d", host, params->port);
    } else {
        snprintf(endpoint, sizeof(endpoint), "tcp://%s:*", host);
    }
    if (kvf_zmq_bind(s->ctx, s->sock, endpoint, "side") != KVF_OK) {
        kvf_error("side channel: bind %s failed: %s", endpoint, zmq_strerror(zmq_errno()));
        status = KVF_ERR_ZMQ;
        goto err_close;
    }
    KVF_ZMQ_CHECK_GOTO(zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, endpoint, &ep_len), status,
                       err_close);
    colon = strrchr(endpoint, ':');
    s->port = (colon != NULL) ? atoi(colon + 1) : 0;

    atomic_init(&s->stop, false);
    if (pthread_create(&s->thread, NULL, kvf_side_channel_thread, s) != 0) {
        kvf_error("side channel: pthread_create failed: %m");
        status = KVF_ERR_NO_RESOURCE;
        goto err_close;
    }
    kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "side channel of %s serving %d ranks on %s",
            s->engine_id, params->num_ranks, endpoint);
    *server_p = s;
    return KVF_OK;

err_close:
    zmq_close(s->sock);
err_term:
    zmq_ctx_term(s->ctx);
err_free_reply:
    free(s->reply);
err_free:
    free(s);
    return status;
}

int kvf_side_channel_server_port(kvf_side_channel_server_h server)
{
    return server->port;
}

void kvf_side_channel_server_stats(kvf_side_channel_server_h server, uint64_t *served_p,
                                   uint64_t *malformed_p)
{
    *served_p = atomic_load(&server->served);
    *malformed_p = atomic_load(&server->malformed);
}

void kvf_side_channel_server_stop(kvf_side_channel_server_h server)
{
    if (server == NULL) {
        return;
    }
    atomic_store(&server->stop, true);
    pthread_join(server->thread, NULL);
    zmq_close(server->sock);
    zmq_ctx_term(server->ctx);
    free(server->reply);
    free(server);
}

