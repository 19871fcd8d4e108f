/*
 * Serving control channel of a role daemon (proto/kvf_serve.proto): a
 * ZeroMQ ROUTER socket the proxy's DEALERs connect to. One ServeRequest per
 * message in, one or more ServeReply per request out, addressed to the
 * DEALER that asked (its routing id travels with the request).
 *
 * Thread safety: a ZeroMQ socket belongs to one thread; create, receive and
 * reply from the daemon's leader thread only.
 */
#ifndef KVF_SERVE_CHANNEL_H
#define KVF_SERVE_CHANNEL_H

#include "kvf_status.h"
#include "kvf_serve.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_serve_server *kvf_serve_server_h;

#define KVF_SERVE_PEER_ID_MAX 256

/** Who sent a request: the ROUTER routing id, copied by value. */
typedef struct kvf_serve_peer {
    size_t  len;
    uint8_t id[KVF_SERVE_PEER_ID_MAX];
} kvf_serve_peer_t;

/**
 * Bind a ROUTER socket on @a endpoint ("tcp://127.0.0.1:5557").
 * @return KVF_OK; KVF_ERR_ZMQ when the bind fails (logged with the reason,
 *         e.g. address in use).
 */
kvf_status_t kvf_serve_server_create(const char *endpoint, kvf_serve_server_h *srv_p);

/** Close the socket and its context; NULL is a no-op. */
void kvf_serve_server_destroy(kvf_serve_server_h srv);

/**
 * Wait up to @a timeout_ms for one request.
 *
 * @param [out] peer_p  Sender, to pass to kvf_serve_server_reply().
 * @param [out] req_p   Unpacked request; free with
 *                      kvf__serve_request__free_unpacked(req, NULL).
 * @return KVF_OK; KVF_ERR_PEER_TIMEOUT when nothing arrived (not an error);
 *         KVF_ERR_PARSE for a malformed message (already answered with an
 *         error reply when the sender could be identified; nothing to free);
 *         KVF_ERR_ZMQ.
 */
kvf_status_t kvf_serve_server_recv(kvf_serve_server_h srv, int timeout_ms,
                                   kvf_serve_peer_t *peer_p, Kvf__ServeRequest **req_p);

/**
 * Sleep until a request is waiting, one of @a fds (nfds <= 16) is readable,
 * or @a timeout_ms passes. Lets a daemon wait on its control socket and its
 * transfer workers at once instead of spinning.
 * @return true when a request is waiting on the control socket.
 */
bool kvf_serve_server_wait(kvf_serve_server_h srv, int timeout_ms, const int *fds, int nfds);

/**
 * Send @a reply to @a peer. Never blocks: a peer that went away or whose
 * queue is full loses the reply (ZMQ_ROUTER_MANDATORY off, DONTWAIT).
 * @return KVF_OK; KVF_ERR_NO_MEMORY; KVF_ERR_ZMQ.
 */
kvf_status_t kvf_serve_server_reply(kvf_serve_server_h srv, const kvf_serve_peer_t *peer,
                                    const Kvf__ServeReply *reply);

/** Shorthand: reply {request_id, status, error, done = true}. */
kvf_status_t kvf_serve_server_reply_error(kvf_serve_server_h srv, const kvf_serve_peer_t *peer,
                                          const char *request_id, kvf_status_t status,
                                          const char *error);

#endif
