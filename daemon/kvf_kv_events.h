/*
 * A daemon's KV event publisher, as vLLM's ZeroMQ publisher behaves
 * (docs/PREFIX_CACHE.md §7): the prefix cache's block events, gathered per
 * engine step into batches (kvf_kv_events_enc.h), each sent on a PUB socket
 * as three frames [topic, sequence number (8 bytes, big-endian), payload],
 * the sequence counting batches from 0. The last buffer_steps batches are
 * kept; a ROUTER socket (the replay endpoint) answers a request whose one
 * frame after the empty delimiter is an 8-byte big-endian sequence number
 * with every kept batch from it on, each [empty, seq, payload], then
 * [empty, -1 as 8 bytes, empty payload] to end.
 * The first batch (sequence 0) is AllBlocksCleared: a subscriber that knew a
 * previous process of this instance forgets its blocks.
 *
 * Off by default, as vLLM. Events carry prompts' token ids: the sockets are
 * plain ZeroMQ (vLLM's consumers speak no CURVE); bind them to a private
 * interface (docs/SECURITY.md).
 *
 * Thread safety: kvf_kv_events_push() from any one thread (the engine's
 * leader), the rest from the daemon's main thread; the publisher has its own
 * thread that owns both sockets.
 */
#ifndef KVF_KV_EVENTS_H
#define KVF_KV_EVENTS_H

#include "kvf_kv_events_enc.h"
#include "kvf_prefix_cache.h"
#include "kvf_status.h"

#include <stdbool.h>
#include <stdint.h>

#define KVF_KV_EVENTS_ENDPOINT_MAX 256

/** vLLM's KVEventsConfig fields, plus the encoding form. */
typedef struct kvf_kv_events_config {
    bool     enabled;                       /* enable_kv_cache_events and publisher "zmq" */
    char     endpoint[KVF_KV_EVENTS_ENDPOINT_MAX];         /* PUB (vLLM: port 5557) */
    char     replay_endpoint[KVF_KV_EVENTS_ENDPOINT_MAX];  /* ROUTER; "": no replay */
    int64_t  buffer_steps;                  /* batches kept for replay (10000) */
    int64_t  hwm;                           /* PUB send high-water mark (100000) */
    int64_t  max_queue_size;                /* events waiting for the thread (100000) */
    char     topic[128];                    /* the first frame ("") */
    kvf_kv_events_format_t format;
} kvf_kv_events_config_t;

/** vLLM's defaults, off. */
void kvf_kv_events_config_default(kvf_kv_events_config_t *cfg);

/**
 * Apply the daemon flags: @a json is --kv-events-config (vLLM's KVEventsConfig
 * as JSON: enable_kv_cache_events, publisher "null"|"zmq", endpoint,
 * replay_endpoint, buffer_steps, hwm, max_queue_size, topic; "" none);
 * @a endpoint / @a replay (--kv-events-endpoint / --kv-events-replay-endpoint,
 * "" none) enable publishing on their own and override the JSON's;
 * @a format "map" or "array" (--kv-events-format).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM, logged naming the flag, the key and
 *         the value (an unknown key, a wrong type, a value out of range).
 */
kvf_status_t kvf_kv_events_config_parse(const char *json, const char *endpoint,
                                        const char *replay, const char *format,
                                        kvf_kv_events_config_t *cfg);

typedef struct kvf_kv_events *kvf_kv_events_h;

/**
 * Bind (or connect: an endpoint without '*', "::", ipc:// or inproc://, as
 * vLLM does) the sockets and start the thread.
 * @param [in] medium  "GPU" or "CPU" (vLLM's medium field).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (ZeroMQ refused an endpoint: logged
 *         naming it); KVF_ERR_ZMQ; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_kv_events_create(const kvf_kv_events_config_t *cfg, const char *medium,
                                  kvf_kv_events_h *pub_p);

/** Publish what is queued, stop the thread, close the sockets. NULL: no-op. */
void kvf_kv_events_destroy(kvf_kv_events_h pub);

/**
 * Queue one prefix cache event (a kvf_prefix_event_fn: @a ctx is the
 * publisher). Copies what it needs; never blocks on the sockets. Past
 * max_queue_size waiting events, the event is dropped and counted.
 */
void kvf_kv_events_push(void *ctx, const kvf_prefix_event_t *ev);

/** The PUB and replay endpoints as bound (a wildcard port resolved; "" for no replay, and
 *  for a PUB connected to a broker: subscribers go to the broker). */
const char *kvf_kv_events_endpoint(kvf_kv_events_h pub);
const char *kvf_kv_events_replay_endpoint(kvf_kv_events_h pub);

typedef struct kvf_kv_events_stats {
    uint64_t batches;       /* published; the next sequence number */
    uint64_t events;        /* prefix cache events published */
    uint64_t dropped;       /* events dropped at a full queue */
    uint64_t replays;       /* replay requests answered */
} kvf_kv_events_stats_t;

void kvf_kv_events_get_stats(kvf_kv_events_h pub, kvf_kv_events_stats_t *stats_p);

#endif
