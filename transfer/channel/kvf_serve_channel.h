/*
 * Serving control channel of a role daemon (proto/kvf_serve.proto): a
 * ZeroMQ ROUTER socket the proxy's DEALERs connect to. One ServeRequest per
 * message in, one or more ServeReply per request out, addressed to the
 * DEALER that asked (its routing id travels with the request).
 *
 * Health without waiting for the engine: the ROUTER belongs to an I/O
 * thread inside this object. It answers HealthRequests itself, from the
 * last snapshot the leader published (kvf_serve_server_set_health()) plus
 * the age of the engine step in progress (kvf_serve_server_step_begin() /
 * _end()), so a long engine step never makes an instance look dead. Every
 * other request goes to the leader over an inproc pair, and the leader's
 * replies come back the same way.
 *
 * Thread safety: create, recv, wait, reply, set_health, step_begin/_end and
 * destroy from the daemon's leader thread only (one thread).
 */
#ifndef KVF_SERVE_CHANNEL_H
#define KVF_SERVE_CHANNEL_H

#include "kvf_status.h"
#include "kvf_serve.pb-c.h"

#include <signal.h>
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
 * Bind a ROUTER socket on @a endpoint ("tcp://127.0.0.1:5557") and start
 * the I/O thread that owns it.
 * @return KVF_OK; KVF_ERR_ZMQ when the bind fails (logged with the reason,
 *         e.g. address in use); KVF_ERR_NO_RESOURCE when the thread cannot
 *         start. Nothing is left running on error.
 */
kvf_status_t kvf_serve_server_create(const char *endpoint, kvf_serve_server_h *srv_p);

/**
 * Publish the health reply the I/O thread sends from now on. Copied;
 * step_ms and step_running_ms are filled by this object (leave them unset).
 * Until the first call, health requests go to the leader like any other.
 * @return KVF_OK; KVF_ERR_NO_MEMORY (the previous snapshot stays).
 */
kvf_status_t kvf_serve_server_set_health(kvf_serve_server_h srv, const Kvf__HealthReply *health);

/** The leader starts an engine step (health then reports its age). */
void kvf_serve_server_step_begin(kvf_serve_server_h srv);

/** The engine step started by kvf_serve_server_step_begin() ended. */
void kvf_serve_server_step_end(kvf_serve_server_h srv);

/**
 * From now on the I/O thread reads *@a stop (a signal handler's flag; NULL:
 * stop watching) when it answers a health probe, and reports draining while
 * it is non-zero, even before the leader publishes it (a long pull or step
 * blocks the leader). @a stop must outlive the server.
 */
void kvf_serve_server_watch_stop(kvf_serve_server_h srv, const volatile sig_atomic_t *stop);

/** Health requests answered by the I/O thread so far (tests, metrics). */
uint64_t kvf_serve_server_health_answered(kvf_serve_server_h srv);

/** Stop the I/O thread, close the sockets and the context; NULL is a no-op. */
void kvf_serve_server_destroy(kvf_serve_server_h srv);

/**
 * Wait up to @a timeout_ms for one request.
 *
 * @param [out] peer_p  Sender, to pass to kvf_serve_server_reply().
 * @param [out] req_p   Unpacked request; free with
 *                      kvf__serve_request__free_unpacked(req, NULL).
 * @return KVF_OK; KVF_ERR_TIMED_OUT when nothing arrived (not an error);
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
