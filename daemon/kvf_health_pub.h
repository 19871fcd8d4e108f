/*
 * The one health publisher of both role daemons (kvf-prefill, kvf-decode).
 * A role says how to fill its reply (kvf_health_fill_fn: kvf_role_health_fill(),
 * then kvf_health_fill_loop() with its loop state, then its own fields); this
 * file hands that reply to where it is read: the control channel's snapshot
 * (kvf_serve_server_set_health(), answered by the channel's thread), the
 * --metrics-port HTTP endpoint (kvf_daemon_http_publish()), or one peer's
 * health request (kvf_role_reply_health()).
 * Design: a fill callback, not a struct of every role's numbers, so a role adds
 * a field in its own file without touching this one.
 * Leader thread only (the fill reads the run loop's state).
 */
#ifndef KVF_HEALTH_PUB_H
#define KVF_HEALTH_PUB_H

#include "kvf_serve_channel.h"

#include <stdbool.h>
#include <stdint.h>

/** Fill @a h completely (it starts uninitialised) from the role server @a arg. */
typedef void (*kvf_health_fill_fn)(void *arg, Kvf__HealthReply *h);

/** The run-loop state both roles report, in the fields of the same names. */
typedef struct kvf_health_loop {
    uint32_t running;       /* requests held: computing, queued or leased/pulling */
    uint32_t queue_depth;   /* of those, waiting for their turn */
    uint32_t max_queue;     /* --max-queue */
    uint64_t incarnation;   /* the connector's, changes at every restart */
    bool     draining;      /* kvf_drain_active() */
} kvf_health_loop_t;

/** Set the loop fields of @a h (and their has_ flags) from @a loop. */
void kvf_health_fill_loop(Kvf__HealthReply *h, const kvf_health_loop_t *loop);

/**
 * Fill a reply with @a fill(@a arg) and publish it as the snapshot the control
 * channel answers probes from and the one /metrics and /health serve. Strings
 * in the reply are copied by both, so they need only live for the call.
 */
void kvf_health_publish(kvf_serve_server_h serve, kvf_health_fill_fn fill, void *arg);

/** Fill a reply with @a fill(@a arg) and send it to @a peer (request_id "health", done). */
void kvf_health_answer(kvf_serve_server_h serve, const kvf_serve_peer_t *peer,
                       kvf_health_fill_fn fill, void *arg);

#endif /* KVF_HEALTH_PUB_H */
