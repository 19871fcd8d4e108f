/*
 * kvf-proxy connection guard: who is connected, whether each connection is
 * admitted under the caps, and the deadlines a client must meet.
 *
 * Caps: at most max_total admitted connections, and (when max_per_client is
 * not 0) at most max_per_client attributed to one client. A connection over
 * a cap is still accepted (up to the HTTP library's hard limit, well above
 * these) so it can be answered with a JSON 503 naming the cap, instead of
 * hanging.
 *
 * Clients: a connection is attributed to its peer address; a peer listed
 * in trusted_proxies (a load balancer, an ingress) is not a client itself:
 * each request's X-Forwarded-For names it (the rightmost address there that
 * is not a trusted proxy), and the connection is attributed when each
 * request's headers are in (to the proxy itself when the header names no
 * one); until then it counts for no client. X-Forwarded-For from any other peer is ignored,
 * so a client cannot pick its own attribution.
 *
 * Deadlines: a new connection must send complete request headers within
 * header_timeout; the body must arrive within body_timeout after the
 * headers; after an answer, a keep-alive connection may idle for
 * idle_timeout before its next request's headers are complete. A watchdog
 * thread shuts a connection that misses its deadline (no answer: the client
 * is too slow to take one). While a request is handled (waiting for the
 * pool, streaming), the request's own timeouts apply, not these.
 *
 * Thread safety: every call may come from any thread; the table is under
 * one lock.
 */
#ifndef KVF_PROXY_CONNS_H
#define KVF_PROXY_CONNS_H

#include "kvf_status.h"

#include <stdint.h>
#include <sys/socket.h>

typedef struct kvf_proxy_conns *kvf_proxy_conns_h;
typedef struct kvf_proxy_conn_slot kvf_proxy_conn_slot_t;

typedef struct kvf_proxy_conns_params {
    unsigned    max_total;          /* admitted connections; >= 1 */
    unsigned    max_per_client;     /* connections attributed to one client; 0: no cap */
    const char *trusted_proxies;    /* comma list of numeric addresses whose
                                     * X-Forwarded-For is believed; NULL or "": none */
    int64_t     header_timeout_ms;  /* accept -> request headers complete; > 0 */
    int64_t     body_timeout_ms;    /* headers -> body complete; > 0 */
    int64_t     idle_timeout_ms;    /* answer -> next request's headers complete; > 0 */
} kvf_proxy_conns_params_t;

typedef enum {
    KVF_PROXY_ADMIT_OK = 0,
    KVF_PROXY_ADMIT_OVER_TOTAL,     /* max_total connections were admitted already */
    KVF_PROXY_ADMIT_OVER_CLIENT,    /* max_per_client from this address already */
} kvf_proxy_admit_t;

typedef enum {
    KVF_PROXY_PHASE_HEADERS = 0,    /* waiting for request headers (new or keep-alive) */
    KVF_PROXY_PHASE_BODY,           /* headers in, body arriving */
    KVF_PROXY_PHASE_BUSY,           /* request complete: being handled or answered */
} kvf_proxy_phase_t;

/**
 * Start the watchdog.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (a timeout or max_total not
 *         positive, a trusted proxy that is not a numeric address: named);
 *         KVF_ERR_NO_MEMORY/NO_RESOURCE.
 */
kvf_status_t kvf_proxy_conns_create(const kvf_proxy_conns_params_t *params,
                                    kvf_proxy_conns_h *conns_p);

/** Stop the watchdog and free the table (connections must be closed). NULL: no-op. */
void kvf_proxy_conns_destroy(kvf_proxy_conns_h conns);

/**
 * A connection was accepted on socket @a fd from @a addr (copied): register
 * it, decide its admission, arm the header deadline.
 * @return the slot (pass it to the calls below, then to _close()); NULL when
 *         out of memory (the caller closes the connection).
 */
kvf_proxy_conn_slot_t *kvf_proxy_conns_open(kvf_proxy_conns_h conns, int fd,
                                            const struct sockaddr *addr);

/** The connection is closing: unregister @a slot (NULL: no-op); it is freed. */
void kvf_proxy_conns_close(kvf_proxy_conns_h conns, kvf_proxy_conn_slot_t *slot);

/**
 * The headers of a request on @a slot are in: when its peer is a trusted
 * proxy and @a forwarded_for (the X-Forwarded-For value; may be NULL) names
 * a client, attribute the connection to that client (under the per-client
 * cap). Other peers keep their address.
 * @return the connection's admission now.
 */
kvf_proxy_admit_t kvf_proxy_conns_attribute(kvf_proxy_conns_h conns, kvf_proxy_conn_slot_t *slot,
                                            const char *forwarded_for);

/** Admission of @a slot: over the total cap (decided at open), over its client's, or OK. */
kvf_proxy_admit_t kvf_proxy_conns_admission(kvf_proxy_conns_h conns,
                                            const kvf_proxy_conn_slot_t *slot);

/** Move @a slot to @a phase, re-arming its deadline (BUSY: none). */
void kvf_proxy_conns_phase(kvf_proxy_conns_h conns, kvf_proxy_conn_slot_t *slot,
                           kvf_proxy_phase_t phase);

/**
 * The socket of the one connection whose input the HTTP library may be
 * parsing now (phase HEADERS or BODY), or -1 when there are none or
 * several. Every other connection is being answered: the library reads no
 * request from it until the answer is out.
 */
int kvf_proxy_conns_sole_reading_fd(kvf_proxy_conns_h conns);

/** Connections closed by the watchdog so far. */
uint64_t kvf_proxy_conns_timeouts(kvf_proxy_conns_h conns);

/** Connections registered now (admitted or not). */
unsigned kvf_proxy_conns_count(kvf_proxy_conns_h conns);

#endif
