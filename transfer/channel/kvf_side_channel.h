/*
 * Side channel (docs/ARCHITECTURE.md §3, §5, §8): a ZeroMQ metadata and
 * lease service. A server thread per instance answers HandshakeRequest with
 * every rank's metadata, and lease operations from its lease handler
 * (ROUTER socket, bound to 127.0.0.1 unless told otherwise).
 *
 * Client: one persistent DEALER connection per remote side channel (host,
 * port), opened on first use and kept; each request carries a ticket (a
 * request id frame) that its reply echoes, so many requests to one prefill
 * are in flight at once and a reply is matched to its request whatever the
 * order. The asynchronous calls (*_start, *_poll, kvf_side_channel_wait)
 * never block on the network: a daemon's leader advances them between
 * engine steps. The synchronous calls (fetch, lease) are the same exchange
 * waited out, for tools and tests.
 *
 * Robustness: every request has a deadline (the client timeout); a socket
 * monitor fails the requests of a connection at once when it is refused
 * before it was ever made (KVF_ERR_PEER_UNREACHABLE) or closed
 * (KVF_ERR_PEER_RESET), and the connection is reopened by the next request.
 * A reply for a ticket nobody waits for any more is dropped. The server
 * bounds message size, answers malformed or multi-part requests with an
 * error reply (a plain REQ client is answered too: raw tests), and never
 * exits on bad input.
 *
 * Identity: with authenticated sockets (transfer/zmq/kvf_zmq_auth.h)
 * the server compares the engine id a request claims with the peer's
 * authenticated id and refuses a mismatch; the lease handler gets the
 * authenticated id as the requester (the lease owner), never the claimed one.
 */
#ifndef KVF_SIDE_CHANNEL_H
#define KVF_SIDE_CHANNEL_H

#include "kvf_handshake.h"

#include <stdbool.h>

#define KVF_SIDE_CHANNEL_MAX_MSG (4 << 20)   /* bytes accepted per message */

typedef struct kvf_side_channel_server *kvf_side_channel_server_h;
typedef struct kvf_side_channel_client *kvf_side_channel_client_h;

enum kvf_side_channel_params_field {       /* append only, never renumber */
    KVF_SIDE_CHANNEL_PARAM_FIELD_HOST = KVF_BIT(0),
    KVF_SIDE_CHANNEL_PARAM_FIELD_PORT = KVF_BIT(1),
};
#define KVF_SIDE_CHANNEL_PARAM_FIELDS_KNOWN (KVF_BIT(2) - 1)

/**
 * Answers one lease operation (prefill's lease table). Runs on the side
 * channel thread, so it must be thread-safe against the owner's threads and
 * must not block for long: it decides from memory. @a requester is the
 * lease owner: the authenticated peer id (kvf_zmq_msg_peer_id()), or the
 * claimed HandshakeRequest.engine_id when the pool runs insecure; @a
 * peer_timeout_ms the transfer timeout this request announced (0: unsaid).
 */
typedef void (*kvf_side_channel_lease_func_t)(void *arg, const char *requester,
                                              const kvf_lease_msg_t *msg,
                                              uint32_t peer_timeout_ms,
                                              kvf_lease_answer_t *answer);

typedef struct kvf_side_channel_params {
    uint64_t               field_mask;   /* first */
    const char            *host;         /* bind address; default "127.0.0.1" */
    int                    port;         /* default 0: an ephemeral port */
    const char            *engine_id;    /* ours; required */
    const kvf_rank_meta_t *ranks;        /* [num_ranks], ranks[i].tp_rank == i; copied */
    int                    num_ranks;
    kvf_side_channel_lease_func_t lease_func;   /* NULL: lease operations are refused */
    void                  *lease_arg;
} kvf_side_channel_params_t;

/**
 * Bind and start the server thread. The metadata reply is packed once here.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM; KVF_ERR_ZMQ (bind failure logged
 *         with the endpoint); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_side_channel_server_start(const kvf_side_channel_params_t *params,
                                           kvf_side_channel_server_h *server_p);

/** Port the server is bound to (resolved when params->port was 0). */
int kvf_side_channel_server_port(kvf_side_channel_server_h server);

/** Requests answered so far, and how many of them were malformed. */
void kvf_side_channel_server_stats(kvf_side_channel_server_h server, uint64_t *served_p,
                                   uint64_t *malformed_p);

/** Stop the thread (within ~100 ms), close the socket, free. NULL ok. */
void kvf_side_channel_server_stop(kvf_side_channel_server_h server);

/** Client with our engine id; @a timeout_ms bounds each request (send + reply). */
kvf_status_t kvf_side_channel_client_create(const char *engine_id, uint32_t timeout_ms,
                                            kvf_side_channel_client_h *client_p);
void kvf_side_channel_client_destroy(kvf_side_channel_client_h client);

/**
 * Metadata of remote engine @a remote_engine_id at @a host:@a port; served
 * from the cache after the first success.
 *
 * @param [out] reply_p  Borrowed; valid until kvf_side_channel_forget() of this
 *                       engine or client destroy. On KVF_ERR_REFUSED it points
 *                       to the refusal reply (not cached; valid until the next
 *                       fetch).
 * @return KVF_OK; KVF_ERR_PEER_TIMEOUT (no answer in time); KVF_ERR_PARSE
 *         (malformed reply, or one from another engine id); KVF_ERR_REFUSED
 *         (the server refused: reply_p->refusals / error say why);
 *         KVF_ERR_ZMQ.
 */
kvf_status_t kvf_side_channel_fetch(kvf_side_channel_client_h client,
                                    const char *remote_engine_id, const char *host, int port,
                                    const kvf_handshake_reply_t **reply_p);

/**
 * One lease operation with engine @a remote_engine_id at @a host:@a port
 * (no cache; a fresh exchange bounded by the client timeout). The request
 * announces the client timeout as the requester's transfer timeout.
 * @return KVF_OK with *answer_p; KVF_ERR_PEER_TIMEOUT; KVF_ERR_PARSE (a
 *         malformed answer, or one from another engine); KVF_ERR_ZMQ.
 */
kvf_status_t kvf_side_channel_lease(kvf_side_channel_client_h client,
                                    const char *remote_engine_id, const char *host, int port,
                                    const kvf_lease_msg_t *msg, kvf_lease_answer_t *answer_p);

/** Drop the cached metadata of @a remote_engine_id (after a peer failure). */
void kvf_side_channel_forget(kvf_side_channel_client_h client, const char *remote_engine_id);

/* ---- asynchronous client (never blocks on the network) --------------- */

/**
 * Send a metadata request to engine @a remote_engine_id at @a host:@a port
 * on the persistent connection there (opened now if needed).
 * @param [out] ticket_p  what kvf_side_channel_fetch_poll() takes.
 * @return KVF_OK (sent or queued); KVF_ERR_NO_RESOURCE when too many
 *         requests or connections are open; KVF_ERR_ZMQ; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_side_channel_fetch_start(kvf_side_channel_client_h client,
                                          const char *remote_engine_id, const char *host,
                                          int port, uint64_t *ticket_p);

/**
 * The answer to a fetch_start, if it came. Never waits. Ends the ticket
 * unless KVF_INPROGRESS is returned.
 * @param [out] reply_p  on KVF_OK the accepted reply from @a the engine asked
 *                       (the caller owns it: kvf_handshake_reply_cleanup());
 *                       on KVF_ERR_REFUSED the refusal (owned too).
 * @return KVF_INPROGRESS; KVF_OK; KVF_ERR_REFUSED; KVF_ERR_PARSE (malformed,
 *         or answered by another engine id); KVF_ERR_PEER_TIMEOUT (no answer
 *         within the client timeout); KVF_ERR_PEER_UNREACHABLE;
 *         KVF_ERR_PEER_RESET; KVF_ERR_NOT_FOUND (no such ticket).
 */
kvf_status_t kvf_side_channel_fetch_poll(kvf_side_channel_client_h client, uint64_t ticket,
                                         kvf_handshake_reply_t *reply_p);

/**
 * Send one lease operation (as kvf_side_channel_lease()) without waiting.
 * @return as kvf_side_channel_fetch_start().
 */
kvf_status_t kvf_side_channel_lease_start(kvf_side_channel_client_h client,
                                          const char *remote_engine_id, const char *host,
                                          int port, const kvf_lease_msg_t *msg,
                                          uint64_t *ticket_p);

/**
 * The answer to a lease_start, if it came. Never waits; ends the ticket
 * unless KVF_INPROGRESS. @return KVF_INPROGRESS; KVF_OK with *answer_p;
 * the errors of kvf_side_channel_fetch_poll() but KVF_ERR_REFUSED.
 */
kvf_status_t kvf_side_channel_lease_poll(kvf_side_channel_client_h client, uint64_t ticket,
                                         kvf_lease_answer_t *answer_p);

/** Forget a ticket (its answer, if it comes, is dropped). Unknown tickets are ignored. */
void kvf_side_channel_cancel(kvf_side_channel_client_h client, uint64_t ticket);

/**
 * Sleep until a reply or a connection event arrives on any open
 * connection, at most @a timeout_ms (0: only look). @return true when
 * something arrived (poll the tickets).
 */
bool kvf_side_channel_wait(kvf_side_channel_client_h client, int timeout_ms);

/** Requests in flight (tickets not yet polled to their end). */
int kvf_side_channel_inflight(kvf_side_channel_client_h client);

/**
 * One raw request/reply exchange (tests: garbage input). *reply_p is
 * malloc'd. @return KVF_OK; KVF_ERR_PEER_TIMEOUT; KVF_ERR_ZMQ.
 */
kvf_status_t kvf_side_channel_request_raw(const char *host, int port, const void *msg,
                                          size_t len, uint32_t timeout_ms, uint8_t **reply_p,
                                          size_t *reply_len_p);

#endif
