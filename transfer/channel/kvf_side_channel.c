/*
 * ZeroMQ side channel: metadata server thread and caching client.
 *
 * Design: REQ/REP, one request frame and one reply frame, both protobuf.
 * The server owns its REP socket from its thread only (ZeroMQ sockets are not
 * thread-safe) and polls with a 100 ms timeout so stop() is prompt without
 * signals or inproc pipes. The metadata reply is immutable after start, so
 * it is packed once and every request costs one send. The client opens a
 * fresh REQ socket per request: a REQ socket that timed out is stuck in
 * "expect reply" state, and recreating it is simpler and safer than
 * ZMQ_REQ_RELAXED/CORRELATE bookkeeping. Handshakes are rare (cached per
 * remote engine), so the extra connect costs nothing that matters.
 */
#include "kvf_side_channel.h"

#include "kvf_fault.h"
#include "kvf_log.h"
#include "kvf_time.h"
#include "kvf_zmq.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KVF_SIDE_CHANNEL_MAX_CACHE 64

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
    atomic_uint     peer_timeout_ms;   /* largest transfer timeout a peer announced */
    kvf_side_channel_lease_func_t lease_func;
    void           *lease_arg;
};

typedef struct kvf_side_channel_entry {
    char                  engine_id[KVF_ENGINE_ID_MAX];   /* "" marks a free slot */
    kvf_handshake_reply_t reply;
    uint64_t              seq;                            /* insertion order, for eviction */
} kvf_side_channel_entry_t;

struct kvf_side_channel_client {
    void                    *ctx;
    char                     engine_id[KVF_ENGINE_ID_MAX];
    uint32_t                 timeout_ms;
    int                      num_entries;   /* slots in use so far (high-water mark) */
    uint64_t                 next_seq;
    /* Slots never move: a returned reply pointer stays valid until its own
     * engine is forgotten or evicted. */
    kvf_side_channel_entry_t entries[KVF_SIDE_CHANNEL_MAX_CACHE];
    kvf_handshake_reply_t    last_refusal;
};

/* ---- server ----------------------------------------------------------- */

static void kvf_side_channel_send_error(kvf_side_channel_server_h s, const char *why,
                                        const kvf_refusal_t *refusal)
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
        zmq_send(s->sock, "", 0, 0);   /* REP must answer; an empty reply is malformed */
        return;
    }
    zmq_send(s->sock, buf, len, 0);
    free(buf);
}

static void kvf_side_channel_lease_answer(kvf_side_channel_server_h s,
                                          const kvf_handshake_request_t *req)
{
    kvf_lease_answer_t answer;
    uint8_t *buf;
    size_t len;

    memset(&answer, 0, sizeof(answer));
    if (s->lease_func == NULL) {
        answer.verdict = KVF_LEASE_REFUSED;
        snprintf(answer.why, sizeof(answer.why), "engine %s holds no leases", s->engine_id);
    } else {
        s->lease_func(s->lease_arg, req->engine_id, &req->lease,
                      atomic_load(&s->peer_timeout_ms), &answer);
    }
    if (kvf_lease_reply_pack(s->engine_id, &answer, &buf, &len) != KVF_OK) {
        zmq_send(s->sock, "", 0, 0);   /* REP must answer; an empty reply is malformed */
        return;
    }
    zmq_send(s->sock, buf, len, 0);
    free(buf);
}

#if KVF_FAULT_ENABLED
/* Fault points side.rkey / side.reply (kvf_fault.h): @return true when the reply was handled. */
static bool kvf_side_channel_fault_reply(kvf_side_channel_server_h s)
{
    kvf_fault_action_t rkey = KVF_FAULT(SIDE_RKEY);
    kvf_fault_action_t reply = KVF_FAULT(SIDE_REPLY);
    kvf_handshake_reply_t r;
    uint8_t *buf;
    size_t len;

    if (reply == KVF_FAULT_DROP) {
        kvf_warn("side channel: fault side.reply: this handshake is never answered");
        return true;   /* the REP socket now waits for a send that never comes */
    }
    if (reply == KVF_FAULT_CORRUPT) {
        buf = malloc(s->reply_len);
        if (buf != NULL) {
            memcpy(buf, s->reply, s->reply_len);
            kvf_fault_garble(buf, s->reply_len, s->reply_len / 2);
            zmq_send(s->sock, buf, s->reply_len, 0);
            free(buf);
            return true;
        }
    }
    if ((rkey == KVF_FAULT_CORRUPT) &&
        (kvf_handshake_reply_unpack(s->reply, s->reply_len, &r) == KVF_OK)) {
        uint32_t x = 0x9e3779b9u;   /* xorshift: same garbage on every run */
        for (int i = 0; i < r.num_ranks; ++i) {
            for (int j = 0; j < r.ranks[i].num_regions; ++j) {
                for (size_t b = 0; b < r.ranks[i].regions[j].rkey_len; ++b) {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    r.ranks[i].regions[j].rkey[b] = (uint8_t)x;
                }
            }
        }
        if (kvf_handshake_reply_pack(&r, &buf, &len) == KVF_OK) {
            zmq_send(s->sock, buf, len, 0);
            free(buf);
            kvf_handshake_reply_cleanup(&r);
            return true;
        }
        kvf_handshake_reply_cleanup(&r);
    }
    return false;
}
#endif

static void kvf_side_channel_handle(kvf_side_channel_server_h s, const zmq_msg_t *msg,
                                    bool multipart)
{
    kvf_handshake_request_t req;
    kvf_refusal_t refusal;

    if (multipart || (kvf_handshake_request_unpack(zmq_msg_data((zmq_msg_t *)msg),
                                                   zmq_msg_size(msg), &req) != KVF_OK)) {
        atomic_fetch_add(&s->malformed, 1);
        kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "side channel: malformed handshake request "
                "(%zu bytes) answered with an error", zmq_msg_size(msg));
        kvf_side_channel_send_error(s, "malformed handshake request", NULL);
        return;
    }
    if (req.protocol_version != KVF_XFER_PROTOCOL_VERSION) {
        memset(&refusal, 0, sizeof(refusal));
        snprintf(refusal.field, sizeof(refusal.field), "protocol_version");
        snprintf(refusal.local, sizeof(refusal.local), "%u", KVF_XFER_PROTOCOL_VERSION);
        snprintf(refusal.remote, sizeof(refusal.remote), "%u", req.protocol_version);
        snprintf(refusal.why, sizeof(refusal.why), "protocol versions differ");
        kvf_side_channel_send_error(s, "protocol version mismatch", &refusal);
        return;
    }
    if (req.xfer_timeout_ms > atomic_load(&s->peer_timeout_ms)) {
        atomic_store(&s->peer_timeout_ms, req.xfer_timeout_ms);   /* this thread alone writes */
    }
    if ((req.want_engine_id[0] != '\0') && (strcmp(req.want_engine_id, s->engine_id) != 0)) {
        memset(&refusal, 0, sizeof(refusal));
        snprintf(refusal.field, sizeof(refusal.field), "engine_id");
        snprintf(refusal.local, sizeof(refusal.local), "%s", s->engine_id);
        snprintf(refusal.remote, sizeof(refusal.remote), "%s", req.want_engine_id);
        snprintf(refusal.why, sizeof(refusal.why), "this side channel serves another engine");
        kvf_side_channel_send_error(s, "wrong engine id", &refusal);
        return;
    }
    if (req.has_lease) {
        kvf_side_channel_lease_answer(s, &req);
        return;
    }
#if KVF_FAULT_ENABLED
    if (kvf_side_channel_fault_reply(s)) {
        return;
    }
#endif
    zmq_send(s->sock, s->reply, s->reply_len, 0);
}

static void *kvf_side_channel_thread(void *arg)
{
    kvf_side_channel_server_h s = arg;
    zmq_pollitem_t item = {s->sock, 0, ZMQ_POLLIN, 0};

    while (!atomic_load(&s->stop)) {
        zmq_msg_t msg;
        bool multipart = false;
        int more = 0;
        size_t more_len = sizeof(more);

        if (zmq_poll(&item, 1, 100) <= 0) {
            continue;   /* timeout or EINTR: re-check stop */
        }
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, s->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            continue;
        }
        zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &more_len);
        while (more) {   /* drain extra frames; the request is malformed */
            zmq_msg_t extra;
            multipart = true;
            zmq_msg_init(&extra);
            if (zmq_msg_recv(&extra, s->sock, 0) < 0) {
                more = 0;
            } else {
                zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &more_len);
            }
            zmq_msg_close(&extra);
        }
        /* counted before the reply goes out, so a client holding its answer
         * always finds it in the stats (tests and /metrics read them) */
        atomic_fetch_add(&s->served, 1);
        kvf_side_channel_handle(s, &msg, multipart);
        zmq_msg_close(&msg);
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
    atomic_init(&s->peer_timeout_ms, 0);

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
    status = kvf_zmq_socket_open(s->ctx, ZMQ_REP, opts, sizeof(opts) / sizeof(opts[0]),
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
    if (zmq_bind(s->sock, endpoint) != 0) {
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

/* ---- client ----------------------------------------------------------- */

/*
 * One request and its reply on a fresh REQ socket, within @a timeout_ms in
 * all. A socket monitor ends the wait early when the answer cannot come: the
 * connection was refused before it was ever made (nothing listens: the
 * process is gone) -> KVF_ERR_PEER_UNREACHABLE, or the peer closed it before
 * answering (a REQ never resends) -> KVF_ERR_PEER_RESET. Without it a release
 * to a killed prefill waited out the whole transfer timeout.
 */
static kvf_status_t kvf_side_channel_exchange(void *ctx, const char *host, int port,
                                              const void *msg, size_t len, uint32_t timeout_ms,
                                              uint8_t **reply_p, size_t *reply_len_p)
{
    static atomic_uint mon_seq;
    char endpoint[128], mon_url[96];
    const kvf_zmq_opt_t opts[] = {
        {ZMQ_LINGER, 0},
        {ZMQ_SNDTIMEO, (int)timeout_ms},
        {ZMQ_MAXMSGSIZE, KVF_SIDE_CHANNEL_MAX_MSG},
    };
    const kvf_zmq_opt_t mon_opts[] = {
        {ZMQ_LINGER, 0},
    };
    uint64_t deadline = kvf_time_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    kvf_status_t status = KVF_OK;
    bool connected = false;
    void *sock, *mon = NULL;
    zmq_msg_t rep;
    int n = -1;

    status = kvf_zmq_socket_open(ctx, ZMQ_REQ, opts, sizeof(opts) / sizeof(opts[0]), &sock);
    if (status != KVF_OK) {
        return status;
    }
    snprintf(endpoint, sizeof(endpoint), "tcp://%s:%d", host, port);
    snprintf(mon_url, sizeof(mon_url), "inproc://kvf-side-mon-%p-%u", (void *)sock,
             atomic_fetch_add(&mon_seq, 1u));
    KVF_ZMQ_CHECK_GOTO(zmq_socket_monitor(sock, mon_url, ZMQ_EVENT_CONNECTED |
                                          ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED),
                       status, out);
    status = kvf_zmq_socket_open(ctx, ZMQ_PAIR, mon_opts, 1, &mon);
    if (status != KVF_OK) {
        goto out;
    }
    /* the monitor's reader first: events sent before it connects are lost */
    KVF_ZMQ_CHECK_GOTO(zmq_connect(mon, mon_url), status, out);
    KVF_ZMQ_CHECK_GOTO(zmq_connect(sock, endpoint), status, out);
    if (zmq_send(sock, msg, len, 0) < 0) {
        status = (zmq_errno() == EAGAIN) ? KVF_ERR_PEER_TIMEOUT : KVF_ERR_ZMQ;
        kvf_error("side channel: send to %s failed: %s", endpoint, zmq_strerror(zmq_errno()));
        goto out;
    }
    zmq_msg_init(&rep);
    for (;;) {
        uint64_t now = kvf_time_now_ns();
        long left_ms = (now < deadline) ? (long)((deadline - now + 999999u) / 1000000u) : 0;
        zmq_pollitem_t items[2] = {
            {.socket = sock, .events = ZMQ_POLLIN},
            {.socket = mon, .events = ZMQ_POLLIN},
        };
        int event;

        if (left_ms == 0) {
            status = KVF_ERR_PEER_TIMEOUT;
            kvf_error("side channel: no reply from %s within %u ms", endpoint, timeout_ms);
            break;
        }
        if (zmq_poll(items, 2, left_ms) < 0) {
            if (zmq_errno() == EINTR) {
                continue;
            }
            status = KVF_ERR_ZMQ;
            kvf_error("side channel: poll for %s failed: %s", endpoint,
                      zmq_strerror(zmq_errno()));
            break;
        }
        n = zmq_msg_recv(&rep, sock, ZMQ_DONTWAIT);   /* a reply wins over any event */
        if (n >= 0) {
            break;
        }
        event = (items[1].revents & ZMQ_POLLIN) ? kvf_zmq_monitor_event(mon) : -1;
        if (event == ZMQ_EVENT_CONNECTED) {
            connected = true;
        } else if ((event == ZMQ_EVENT_CONNECT_RETRIED) && !connected) {
            status = KVF_ERR_PEER_UNREACHABLE;
            kvf_error("side channel: %s refused the connection (nothing listens there)",
                      endpoint);
            break;
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            status = KVF_ERR_PEER_RESET;
            kvf_error("side channel: %s closed the connection before answering", endpoint);
            break;
        }
    }
    if (n >= 0) {
        *reply_p = malloc((size_t)n + 1);
        if (*reply_p == NULL) {
            status = KVF_ERR_NO_MEMORY;
        } else {
            memcpy(*reply_p, zmq_msg_data(&rep), (size_t)n);
            *reply_len_p = (size_t)n;
        }
    }
    zmq_msg_close(&rep);
out:
    (void)zmq_socket_monitor(sock, NULL, 0);   /* stop the monitor before either closes */
    zmq_close(sock);
    if (mon != NULL) {
        zmq_close(mon);
    }
    return status;
}

kvf_status_t kvf_side_channel_request_raw(const char *host, int port, const void *msg,
                                          size_t len, uint32_t timeout_ms, uint8_t **reply_p,
                                          size_t *reply_len_p)
{
    void *ctx = zmq_ctx_new();
    kvf_status_t status;

    if (ctx == NULL) {
        return KVF_ERR_ZMQ;
    }
    status = kvf_side_channel_exchange(ctx, host, port, msg, len, timeout_ms, reply_p,
                                       reply_len_p);
    zmq_ctx_term(ctx);
    return status;
}

kvf_status_t kvf_side_channel_client_create(const char *engine_id, uint32_t timeout_ms,
                                            kvf_side_channel_client_h *client_p)
{
    kvf_side_channel_client_h c;

    if ((engine_id == NULL) || (strlen(engine_id) >= KVF_ENGINE_ID_MAX) || (timeout_ms == 0)) {
        return KVF_ERR_INVALID_PARAM;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    c->ctx = zmq_ctx_new();
    if (c->ctx == NULL) {
        free(c);
        return KVF_ERR_ZMQ;
    }
    snprintf(c->engine_id, sizeof(c->engine_id), "%s", engine_id);
    c->timeout_ms = timeout_ms;
    *client_p = c;
    return KVF_OK;
}

void kvf_side_channel_client_destroy(kvf_side_channel_client_h client)
{
    if (client == NULL) {
        return;
    }
    for (int i = 0; i < client->num_entries; ++i) {
        kvf_handshake_reply_cleanup(&client->entries[i].reply);
    }
    kvf_handshake_reply_cleanup(&client->last_refusal);
    zmq_ctx_term(client->ctx);
    free(client);
}

kvf_status_t kvf_side_channel_fetch(kvf_side_channel_client_h client,
                                    const char *remote_engine_id, const char *host, int port,
                                    const kvf_handshake_reply_t **reply_p)
{
    kvf_handshake_request_t req;
    kvf_handshake_reply_t reply;
    kvf_side_channel_entry_t *e;
    uint8_t *buf = NULL, *rep = NULL;
    size_t len, rep_len = 0;
    kvf_status_t status;

    for (int i = 0; i < client->num_entries; ++i) {
        if ((client->entries[i].engine_id[0] != '\0') &&
            (strcmp(client->entries[i].engine_id, remote_engine_id) == 0)) {
            *reply_p = &client->entries[i].reply;
            return KVF_OK;
        }
    }
    memset(&req, 0, sizeof(req));
    snprintf(req.engine_id, sizeof(req.engine_id), "%s", client->engine_id);
    snprintf(req.want_engine_id, sizeof(req.want_engine_id), "%s", remote_engine_id);
    req.protocol_version = KVF_XFER_PROTOCOL_VERSION;
    req.xfer_timeout_ms = client->timeout_ms;
    status = kvf_handshake_request_pack(&req, &buf, &len);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_side_channel_exchange(client->ctx, host, port, buf, len, client->timeout_ms,
                                       &rep, &rep_len);
    free(buf);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_handshake_reply_unpack(rep, rep_len, &reply);
    free(rep);
    if (status != KVF_OK) {
        kvf_error("side channel: malformed handshake reply from %s:%d", host, port);
        return status;
    }
    if (!reply.accepted) {
        kvf_handshake_reply_cleanup(&client->last_refusal);
        client->last_refusal = reply;
        *reply_p = &client->last_refusal;
        return KVF_ERR_REFUSED;
    }
    if (strcmp(reply.engine_id, remote_engine_id) != 0) {
        kvf_error("side channel: %s:%d answered as engine '%s', expected '%s'", host, port,
                  reply.engine_id, remote_engine_id);
        kvf_handshake_reply_cleanup(&reply);
        return KVF_ERR_PARSE;
    }
    e = NULL;
    for (int i = 0; i < client->num_entries; ++i) {      /* a forgotten slot */
        if (client->entries[i].engine_id[0] == '\0') {
            e = &client->entries[i];
            break;
        }
    }
    if ((e == NULL) && (client->num_entries < KVF_SIDE_CHANNEL_MAX_CACHE)) {
        e = &client->entries[client->num_entries++];
    }
    if (e == NULL) {
        /* full: evict the oldest; only callers holding ITS pointer must re-fetch */
        e = &client->entries[0];
        for (int i = 1; i < client->num_entries; ++i) {
            if (client->entries[i].seq < e->seq) {
                e = &client->entries[i];
            }
        }
        kvf_handshake_reply_cleanup(&e->reply);
    }
    e->seq = client->next_seq++;
    snprintf(e->engine_id, sizeof(e->engine_id), "%s", remote_engine_id);
    e->reply = reply;
    *reply_p = &e->reply;
    return KVF_OK;
}

#if KVF_FAULT_ENABLED
typedef enum { KVF_SC_FORGE_NONCE, KVF_SC_FORGE_ENGINE, KVF_SC_FORGE_REPLAY } kvf_sc_forge_t;

/*
 * Fault point lease.send: send a copy of release @a real with a wrong
 * nonce, naming another decode engine, or unchanged (a replay after the real
 * one was answered), and log the answer prefill gave it.
 */
static void kvf_side_channel_forge(kvf_side_channel_client_h client,
                                   const kvf_handshake_request_t *real, const char *host,
                                   int port, kvf_sc_forge_t how)
{
    static const char *const what[] = {"with a wrong nonce", "naming another engine",
                                       "replayed"};
    kvf_handshake_request_t req = *real;
    kvf_lease_answer_t answer;
    char from[KVF_ENGINE_ID_MAX];
    uint8_t *buf = NULL, *rep = NULL;
    size_t len, rep_len = 0;

    if (how == KVF_SC_FORGE_NONCE) {
        req.lease.nonce ^= 0x5a5a5a5a5a5a5a5aull;
    } else if (how == KVF_SC_FORGE_ENGINE) {
        snprintf(req.engine_id, sizeof(req.engine_id), "forged-%.*s",
                 (int)sizeof(req.engine_id) - 8, real->engine_id);
    }
    if (kvf_handshake_request_pack(&req, &buf, &len) != KVF_OK) {
        return;
    }
    if ((kvf_side_channel_exchange(client->ctx, host, port, buf, len, client->timeout_ms,
                                   &rep, &rep_len) == KVF_OK) &&
        (kvf_lease_reply_unpack(rep, rep_len, from, &answer) == KVF_OK)) {
        kvf_warn("side channel: fault lease.send: release of %s %s answered %s: %s",
                 req.lease.request_id, what[how], (answer.verdict == KVF_LEASE_VALID) ? "valid" :
                 (answer.verdict == KVF_LEASE_EXPIRED) ? "expired" : "refused", answer.why);
    } else {
        kvf_warn("side channel: fault lease.send: release of %s %s got no answer",
                 req.lease.request_id, what[how]);
    }
    free(rep);
    free(buf);
}
#endif

kvf_status_t kvf_side_channel_lease(kvf_side_channel_client_h client,
                                    const char *remote_engine_id, const char *host, int port,
                                    const kvf_lease_msg_t *msg, kvf_lease_answer_t *answer_p)
{
    kvf_handshake_request_t req;
    char from[KVF_ENGINE_ID_MAX];
    uint8_t *buf = NULL, *rep = NULL;
    size_t len, rep_len = 0;
    kvf_status_t status;
#if KVF_FAULT_ENABLED
    kvf_fault_action_t fault = KVF_FAULT_NONE;
#endif

    memset(&req, 0, sizeof(req));
    snprintf(req.engine_id, sizeof(req.engine_id), "%s", client->engine_id);
    snprintf(req.want_engine_id, sizeof(req.want_engine_id), "%s", remote_engine_id);
    req.protocol_version = KVF_XFER_PROTOCOL_VERSION;
    req.xfer_timeout_ms = client->timeout_ms;
    req.has_lease = true;
    req.lease = *msg;
#if KVF_FAULT_ENABLED
    if (msg->op == KVF_LEASE_OP_RELEASE) {
        fault = KVF_FAULT(LEASE_SEND);
        if (fault == KVF_FAULT_DROP) {
            kvf_warn("side channel: fault lease.send: release of %s not sent", msg->request_id);
            return KVF_ERR_PEER_TIMEOUT;   /* as if it never got an answer */
        }
        if (fault == KVF_FAULT_CORRUPT) {
            kvf_side_channel_forge(client, &req, host, port, KVF_SC_FORGE_NONCE);
            kvf_side_channel_forge(client, &req, host, port, KVF_SC_FORGE_ENGINE);
        }
    }
#endif
    status = kvf_handshake_request_pack(&req, &buf, &len);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_side_channel_exchange(client->ctx, host, port, buf, len, client->timeout_ms,
                                       &rep, &rep_len);
    free(buf);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_lease_reply_unpack(rep, rep_len, from, answer_p);
    free(rep);
    if (status != KVF_OK) {
        kvf_error("side channel: malformed lease answer from %s:%d", host, port);
        return status;
    }
    if (strcmp(from, remote_engine_id) != 0) {
        kvf_error("side channel: %s:%d answered the lease as engine '%s', expected '%s'", host,
                  port, from, remote_engine_id);
        return KVF_ERR_PARSE;
    }
#if KVF_FAULT_ENABLED
    if (fault == KVF_FAULT_REPLAY) {
        kvf_side_channel_forge(client, &req, host, port, KVF_SC_FORGE_REPLAY);
    }
#endif
    return KVF_OK;
}

void kvf_side_channel_forget(kvf_side_channel_client_h client, const char *remote_engine_id)
{
    for (int i = 0; i < client->num_entries; ++i) {
        if ((client->entries[i].engine_id[0] != '\0') &&
            (strcmp(client->entries[i].engine_id, remote_engine_id) == 0)) {
            kvf_handshake_reply_cleanup(&client->entries[i].reply);
            client->entries[i].engine_id[0] = '\0';   /* free; other slots stay put */
            return;
        }
    }
}
