/*
 * ROUTER side of the serving control channel. Frames: [routing id][body]
 * (DEALER peers send no empty delimiter). A message with any other shape is
 * answered with an error reply and dropped: the proxy is trusted, but a
 * stray client must never take the daemon down.
 */
#include "kvf_serve_channel.h"
#include "kvf_log.h"
#include "kvf_pb_check.h"
#include "kvf_zmq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct kvf_serve_server {
    void *ctx;
    void *sock;
};

kvf_status_t kvf_serve_server_create(const char *endpoint, kvf_serve_server_h *srv_p)
{
    struct kvf_serve_server *srv = calloc(1, sizeof(*srv));
    const kvf_zmq_opt_t opts[] = {
        {ZMQ_LINGER, 0},
        {ZMQ_SNDHWM, 100000},
        {ZMQ_MAXMSGSIZE, 64ll << 20},   /* a stray client cannot make us buffer more */
    };

    if (srv == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    srv->ctx = zmq_ctx_new();
    if (srv->ctx == NULL) {
        kvf_error("zmq_ctx_new failed: %s", zmq_strerror(zmq_errno()));
        goto err_free;
    }
    if (kvf_zmq_socket_open(srv->ctx, ZMQ_ROUTER, opts, sizeof(opts) / sizeof(opts[0]),
                            &srv->sock) != KVF_OK) {
        goto err_ctx;
    }
    if (zmq_bind(srv->sock, endpoint) != 0) {
        kvf_error("cannot listen on %s: %s", endpoint, zmq_strerror(zmq_errno()));
        goto err_sock;
    }
    *srv_p = srv;
    return KVF_OK;

err_sock:
    zmq_close(srv->sock);
err_ctx:
    zmq_ctx_term(srv->ctx);
err_free:
    free(srv);
    return KVF_ERR_ZMQ;
}

void kvf_serve_server_destroy(kvf_serve_server_h srv)
{
    if (srv == NULL) {
        return;
    }
    zmq_close(srv->sock);
    zmq_ctx_term(srv->ctx);
    free(srv);
}

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

kvf_status_t kvf_serve_server_recv(kvf_serve_server_h srv, int timeout_ms,
                                   kvf_serve_peer_t *peer_p, Kvf__ServeRequest **req_p)
{
    zmq_pollitem_t item = {.socket = srv->sock, .events = ZMQ_POLLIN};
    zmq_msg_t id, body;
    int more = 0;
    size_t sz = sizeof(more);
    int rc;

    rc = zmq_poll(&item, 1, timeout_ms);
    if (rc < 0) {
        if (errno == EINTR) {
            return KVF_ERR_PEER_TIMEOUT;
        }
        kvf_error("zmq_poll failed: %s", zmq_strerror(zmq_errno()));
        return KVF_ERR_ZMQ;
    }
    if (rc == 0) {
        return KVF_ERR_PEER_TIMEOUT;
    }
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, srv->sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&id);
        return KVF_ERR_PEER_TIMEOUT;
    }
    if (zmq_msg_size(&id) > KVF_SERVE_PEER_ID_MAX) {
        zmq_msg_close(&id);
        kvf_serve_drain(srv->sock);
        return KVF_ERR_PARSE;
    }
    peer_p->len = zmq_msg_size(&id);
    memcpy(peer_p->id, zmq_msg_data(&id), peer_p->len);
    zmq_msg_close(&id);

    zmq_getsockopt(srv->sock, ZMQ_RCVMORE, &more, &sz);
    if (!more) {
        kvf_serve_server_reply_error(srv, peer_p, "", KVF_ERR_PARSE, "empty message");
        return KVF_ERR_PARSE;
    }
    zmq_msg_init(&body);
    if (zmq_msg_recv(&body, srv->sock, 0) < 0) {
        zmq_msg_close(&body);
        return (errno == EINTR) ? KVF_ERR_PEER_TIMEOUT : KVF_ERR_ZMQ;   /* a signal: retry */
    }
    more = 0;
    zmq_getsockopt(srv->sock, ZMQ_RCVMORE, &more, &sz);
    if (more) {
        zmq_msg_close(&body);
        kvf_serve_drain(srv->sock);
        kvf_serve_server_reply_error(srv, peer_p, "", KVF_ERR_PARSE,
                                     "expected one frame per request");
        return KVF_ERR_PARSE;
    }
    KVF_PB_UNPACK_CHECK_IGNORE(kvf__serve_request, *req_p, zmq_msg_size(&body),
                               zmq_msg_data(&body));
    zmq_msg_close(&body);
    if ((*req_p == NULL) ||
        ((*req_p)->body_case == KVF__SERVE_REQUEST__BODY__NOT_SET)) {
        if (*req_p != NULL) {
            kvf__serve_request__free_unpacked(*req_p, NULL);
            *req_p = NULL;
        }
        kvf_serve_server_reply_error(srv, peer_p, "", KVF_ERR_PARSE,
                                     "malformed ServeRequest");
        return KVF_ERR_PARSE;
    }
    return KVF_OK;
}

bool kvf_serve_server_wait(kvf_serve_server_h srv, int timeout_ms, const int *fds, int nfds)
{
    zmq_pollitem_t items[17];
    int n = 1;

    memset(items, 0, sizeof(items));
    items[0].socket = srv->sock;
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
    size_t len = kvf__serve_reply__get_packed_size(reply);
    uint8_t *buf = malloc(len ? len : 1);
    kvf_status_t status = KVF_OK;

    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf__serve_reply__pack(reply, buf);
    if ((zmq_send(srv->sock, peer->id, peer->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
        (zmq_send(srv->sock, buf, len, ZMQ_DONTWAIT) < 0)) {
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_NET, "reply to a departed peer dropped: %s",
                zmq_strerror(zmq_errno()));
        status = KVF_ERR_ZMQ;
    }
    free(buf);
    return status;
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
