/*
 * kvf-proxy's HTTP edge wake-ups: requests wait for the instance pool
 * without a thread each.
 *
 * A request that has nothing to do (its flow waits for a reply) suspends
 * its HTTP connection (MHD_suspend_connection) with kvf_proxy_edge_suspend().
 * It is resumed, by the edge's one thread, when
 *   - a call of its flow has a reply or failed (kvf_proxy_edge_notify(), the
 *     pool's notify callback),
 *   - its wake time passed (the flow's current deadline),
 *   - its client hung up (the sockets of suspended requests are checked
 *     every 100 ms),
 *   - the flow context's cancel flag is set (drain) or the edge stops.
 * The HTTP library then calls the request's handler (or content reader)
 * again, which steps the flow.
 *
 * Threads: kvf_proxy_edge_suspend() runs on the HTTP library's thread inside
 * one of its callbacks; kvf_proxy_edge_notify() on any thread, also with the
 * pool's lock held (it takes only the edge's lock, never calls into the
 * library); the edge thread calls MHD_resume_connection() holding no lock.
 */
#ifndef KVF_PROXY_EDGE_H
#define KVF_PROXY_EDGE_H

#include "kvf_status.h"

#include <microhttpd.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_proxy_edge *kvf_proxy_edge_h;

/** One waiting request's link to the edge; embed it in the request, zeroed, then set the fields. */
typedef struct kvf_proxy_wait {
    struct kvf_proxy_edge *edge;
    struct MHD_Connection *conn;
    int                    fd;          /* the client's socket (departure check) */
    /* under the edge's lock */
    struct kvf_proxy_wait *prev, *next; /* the suspended list */
    struct kvf_proxy_wait *ready_next;  /* the resume queue */
    bool                   suspended;
    bool                   queued;
    bool                   pending;     /* notified since it last tried to suspend */
    int64_t                wake_us;     /* kvf_proxy_now_us() to resume at regardless */
} kvf_proxy_wait_t;

/**
 * Start the edge thread. @a cancel (borrowed, may be NULL): when set, every
 * suspended request is resumed.
 * @return KVF_OK; KVF_ERR_NO_MEMORY; KVF_ERR_NO_RESOURCE (no thread, no eventfd).
 */
kvf_status_t kvf_proxy_edge_create(const atomic_bool *cancel, kvf_proxy_edge_h *edge_p);

/**
 * Resume every suspended request, refuse suspensions from now on, join the
 * thread. Call before the HTTP daemon stops. NULL: no-op.
 */
void kvf_proxy_edge_stop(kvf_proxy_edge_h edge);

/** Free the edge (stopped). NULL: no-op. */
void kvf_proxy_edge_destroy(kvf_proxy_edge_h edge);

/**
 * HTTP library thread, inside a callback of @a w's connection: suspend it
 * until a wake-up (see above), at the latest at @a wake_us.
 * @return true: suspended (return to the library: MHD_YES from the access
 *         handler, 0 from a content reader); false: a notification came
 *         meanwhile, or the edge is stopping: step the flow again now.
 */
bool kvf_proxy_edge_suspend(kvf_proxy_edge_h edge, kvf_proxy_wait_t *w, int64_t wake_us);

/** A call of @a arg's (a kvf_proxy_wait_t) flow has news: resume it (kvf_proxy_call_notify_t). */
void kvf_proxy_edge_notify(void *arg);

/** Requests suspended now. */
unsigned kvf_proxy_edge_suspended(kvf_proxy_edge_h edge);

#endif
