/*
 * kvf-proxy's admission queue: requests that found every prefill (or
 * decode) instance at its --max-outstanding bound wait here, first come
 * first served within a priority (lower first: vLLM's priority scheduling,
 * the request's "priority" with --scheduling-policy priority; 0 otherwise),
 * instead of getting a 503, while their predicted wait is
 * inside their deadline (kvf_proxy_route.h); vLLM queues what it cannot run
 * yet, and a burst behind an ingress should not see refusals the pool could
 * have served in time.
 *
 * Only the head of the queue tries the pool; when it gets instances it
 * leaves and wakes the next (kvf_proxy_admit_remove), which tries at once,
 * so one freed slot after another admits a run of requests without polling.
 * A slot frees when a prefill answers or a request ends: the flow calls
 * kvf_proxy_admit_kick() there. Waking is the flow's notify callback (the
 * HTTP edge resumes the request's connection).
 *
 * Bound: the queued prompts' bytes (4 per token id), --admission-queue-bytes;
 * past it a request is refused (503 queue_full) naming the option. The
 * connection caps of the HTTP edge bound the count as before.
 *
 * Thread-safe: one mutex; notify callbacks are called with it held (the
 * edge's notify takes only its own lock).
 */
#ifndef KVF_PROXY_ADMIT_H
#define KVF_PROXY_ADMIT_H

#include "kvf_proxy_pool.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_proxy_admit *kvf_proxy_admit_h;

/** A waiting request's place; embed it in the flow, zeroed. */
typedef struct kvf_proxy_admit_entry {
    struct kvf_proxy_admit_entry *prev, *next;   /* under the queue's lock */
    kvf_proxy_call_notify_t       notify;
    void                         *notify_arg;
    uint64_t                      tokens;
    int64_t                       priority;      /* lower is served first */
    bool                          queued;
    int64_t                       since_us;      /* kvf_proxy_now_us() when it queued */
} kvf_proxy_admit_entry_t;

/** Bytes a queued prompt counts per token (its ids as the proxy holds them). */
#define KVF_PROXY_ADMIT_BYTES_PER_TOKEN 4

/**
 * An empty queue bounded by @a max_bytes of queued prompt tokens (> 0).
 * @return KVF_OK; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_admit_create(uint64_t max_bytes, kvf_proxy_admit_h *queue_p);

/** Free @a queue (empty or not: entries belong to their flows). NULL: no-op. */
void kvf_proxy_admit_destroy(kvf_proxy_admit_h queue);

/**
 * Queue @a e for a prompt of @a tokens behind every entry of a priority <= @a priority
 * (ahead of the higher ones); @a notify(@a arg) wakes it. An entry put at the head wakes
 * at once (the one it passed goes back to waiting).
 * @return false (nothing queued) when the bytes bound would be passed.
 */
bool kvf_proxy_admit_enqueue(kvf_proxy_admit_h queue, kvf_proxy_admit_entry_t *e,
                             uint64_t tokens, int64_t priority, kvf_proxy_call_notify_t notify,
                             void *arg);

/** True when @a e is first in the queue. */
bool kvf_proxy_admit_is_head(kvf_proxy_admit_h queue, const kvf_proxy_admit_entry_t *e);

/** Take @a e out (admitted, failed or its client left) and wake the new head. No-op when
 *  @a e is not queued. */
void kvf_proxy_admit_remove(kvf_proxy_admit_h queue, kvf_proxy_admit_entry_t *e);

/** A slot may have freed: wake the head. NULL queue: no-op. */
void kvf_proxy_admit_kick(kvf_proxy_admit_h queue);

/** The queue at one instant (read under its lock, so the fields agree). */
typedef struct kvf_proxy_admit_stats {
    uint32_t count;    /* requests queued now */
    uint64_t tokens;   /* their prompt tokens (the work ahead of a new request) */
    uint64_t total;    /* requests that ever queued (a counter) */
} kvf_proxy_admit_stats_t;

/** @a queue's kvf_proxy_admit_stats_t now. */
kvf_proxy_admit_stats_t kvf_proxy_admit_stats(kvf_proxy_admit_h queue);

/** The bytes bound (--admission-queue-bytes). */
uint64_t kvf_proxy_admit_max_bytes(kvf_proxy_admit_h queue);

#endif
