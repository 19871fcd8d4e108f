/*
 * ZeroMQ error domain (docs/CODE_RULES.md §5): check macros that map a
 * failed libzmq call to KVF_ERR_ZMQ and log it, with zmq_strerror(zmq_errno()),
 * where it is first seen; and the one socket set-up every ZeroMQ user in
 * the tree goes through (create, set every option, checked).
 *
 * This is the lowest layer that uses ZeroMQ; layers above it (deploy/proxy)
 * link transfer/channel for it.
 */
#ifndef KVF_ZMQ_H
#define KVF_ZMQ_H

#include "kvf_log.h"
#include "kvf_status.h"
#include "kvf_zmq_auth.h"   /* kvf_zmq_bind / kvf_zmq_connect for every tcp endpoint */

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

/* libzmq calls that return int report failure as -1 and set zmq_errno(). */

/** Return KVF_ERR_ZMQ from the enclosing function when @a _call fails. */
#define KVF_ZMQ_CHECK(_call)                                                  \
    do {                                                                      \
        if ((_call) == -1) {                                                  \
            kvf_error("%s failed: %s", #_call, zmq_strerror(zmq_errno()));    \
            return KVF_ERR_ZMQ;                                               \
        }                                                                     \
    } while (0)

/** Set @a _status to KVF_ERR_ZMQ and jump to @a _label when @a _call fails. */
#define KVF_ZMQ_CHECK_GOTO(_call, _status, _label)                            \
    do {                                                                      \
        if ((_call) == -1) {                                                  \
            kvf_error("%s failed: %s", #_call, zmq_strerror(zmq_errno()));    \
            (_status) = KVF_ERR_ZMQ;                                          \
            goto _label;                                                      \
        }                                                                     \
    } while (0)

/** Log a failure of @a _call (debug level: teardown paths) and carry on. */
#define KVF_ZMQ_CHECK_IGNORE(_call)                                           \
    do {                                                                      \
        if ((_call) == -1) {                                                  \
            kvf_log(KVF_LOG_DEBUG, KVF_SUB_NET, "%s failed (ignored): %s",    \
                    #_call, zmq_strerror(zmq_errno()));                       \
        }                                                                     \
    } while (0)

/** One socket option: ZMQ_MAXMSGSIZE takes an int64_t, every other one an int. */
typedef struct kvf_zmq_opt {
    int     name;       /* ZMQ_LINGER, ZMQ_RCVTIMEO, ... */
    int64_t value;
} kvf_zmq_opt_t;

/* Every socket starts with these (then @a opts of kvf_zmq_socket_open may
 * change them): bounded send/receive queues (messages) and a largest
 * accepted message (bytes), so a peer cannot make a process buffer without
 * bound. */
#define KVF_ZMQ_DEFAULT_HWM        1000
#define KVF_ZMQ_DEFAULT_MAXMSGSIZE (64ll << 20)

/* The send queues of the serving link (messages). The daemons' ROUTER (serve
 * channel; the tests' fake daemon) sends with it: a ROUTER drops, without a
 * word, a message to a peer whose queue is full (ZMQ_ROUTER_MANDATORY off).
 * kvf-proxy's DEALER to each instance sends with it: at the default (1000) a
 * burst of requests got EAGAIN and a 502 (test_proxy_many under load). What
 * is queued is bounded by the proxy's admission. */
#define KVF_ZMQ_SERVE_HWM       100000

/**
 * Create a socket of @a type on @a ctx, set the defaults above, then
 * @a opts[0..num_opts) in order. When the process is configured secure
 * (kvf_zmq_auth.h), @a ctx gets its ZAP handler here first.
 *
 * @param [in]  ctx       A zmq context.
 * @param [in]  type      ZMQ_REQ, ZMQ_REP, ZMQ_ROUTER, ZMQ_DEALER, ZMQ_PAIR, ...
 * @param [in]  opts      Options to set; may be NULL when @a num_opts is 0.
 * @param [out] sock_p    The socket, owned by the caller (zmq_close()); set
 *                        only on success.
 * @return KVF_OK; KVF_ERR_ZMQ when the socket cannot be created or an option
 *         is refused (logged with the call and zmq_strerror()); nothing is
 *         left open on error. Thread rules: those of the context.
 */
kvf_status_t kvf_zmq_socket_open(void *ctx, int type, const kvf_zmq_opt_t *opts,
                                 size_t num_opts, void **sock_p);

/**
 * Take one event from a socket monitor's reader (the ZMQ_PAIR connected to
 * the endpoint given to zmq_socket_monitor()), without waiting. An event is
 * two frames (16-bit event id + 32-bit value, then the peer address); both
 * are consumed.
 * @return the ZMQ_EVENT_* id; -1 when none is queued.
 */
int kvf_zmq_monitor_event(void *mon);

#endif
