/*
 * kvf-proxy's view of which blocks each instance of one role caches, fed by
 * the instances' KV events (docs/PREFIX_CACHE.md §7), for routing by cached
 * prefix (kvf_proxy_route.h); the pool keeps one index per role (prefill's
 * cache, decode's own cache of §6), indexed by the role's instance index.
 *
 * An instance's health reply advertises its event endpoints (PUB and
 * replay, a wildcard host replaced by the host the proxy reaches the
 * instance at) and the hash unit of its block hash chain. The index's own
 * thread subscribes to each PUB socket and keeps, per instance, the set of
 * block hashes stored and not removed. On (re)connect, on a new incarnation
 * (restart) and on a gap in the sequence numbers it asks the replay socket
 * for the batches it missed; AllBlocksCleared (every publisher's first
 * batch) empties the set. Events lost beyond the publisher's replay buffer
 * leave the set approximate: routing is a guess that costs time when wrong,
 * never a wrong answer (the daemon's own cache decides what it reuses).
 *
 * A request's blocks are computed here with the instance's chain
 * (kvf_block_hash.h: the same function the engine keys its cache with; the
 * weights digest from HealthReply.model_digest, the request's cache_salt),
 * and matched from the first block on: the cached prefix is the blocks held
 * before the first one missing.
 *
 * Thread safety: every function from any thread (an internal lock); the
 * sockets are the index thread's alone.
 */
#ifndef KVF_PROXY_KVIDX_H
#define KVF_PROXY_KVIDX_H

#include "kvf_block_hash.h"
#include "kvf_status.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_proxy_kvidx *kvf_proxy_kvidx_h;

/** Start the index thread for @a n_instances instances of one role (none subscribed yet). */
kvf_status_t kvf_proxy_kvidx_create(int n_instances, kvf_proxy_kvidx_h *kx_p);

/** Stop the thread, close the sockets, free the sets. NULL: no-op. */
void kvf_proxy_kvidx_destroy(kvf_proxy_kvidx_h kx);

/** What one health reply of instance @a idx says about its events and its chain. */
typedef struct kvf_proxy_kvidx_src {
    const char *instance_addr;   /* the endpoint the proxy reaches it at (tcp://host:port) */
    const char *pub;             /* HealthReply.kv_events_endpoint; NULL/"": none */
    const char *replay;          /* HealthReply.kv_events_replay_endpoint; NULL/"": none */
    uint64_t    incarnation;     /* a new one: the sets start over */
    const char *model_digest;    /* 32 hex digits; NULL: no chain (nothing matches) */
    uint32_t    hash_unit;       /* tokens per unit; 0: no chain */
    uint32_t    block_size;      /* tokens per block, a multiple of hash_unit */
} kvf_proxy_kvidx_src_t;

/** Record @a src for instance @a idx; the thread (re)subscribes when the endpoints or
 *  the incarnation changed. Cheap when nothing changed (every probe calls it). */
void kvf_proxy_kvidx_update(kvf_proxy_kvidx_h kx, int idx, const kvf_proxy_kvidx_src_t *src);

/** A request's tokens, looked up on several instances (the chain is computed once per
 *  distinct chain definition). Zero it, set the first four fields; free with
 *  kvf_proxy_kvidx_query_done(). */
typedef struct kvf_proxy_kvidx_query {
    const int32_t    *tokens;
    int               n_tokens;
    const uint8_t    *salt;       /* cache_salt bytes; NULL when salt_len is 0 */
    size_t            salt_len;
    /* the last chain computed */
    uint8_t           digest[16];
    uint32_t          unit, block_size;
    kvf_block_hash_t *blocks;     /* [n_blocks] keys of the prompt's full blocks */
    int               n_blocks;
    bool              have;
} kvf_proxy_kvidx_query_t;

void kvf_proxy_kvidx_query_done(kvf_proxy_kvidx_query_t *q);

/**
 * Tokens of @a q's prompt that instance @a idx holds as a cached prefix
 * (whole blocks from the first on, at most n_tokens - 1 since the last token
 * is always computed); 0 when it publishes no events or its chain is unknown.
 */
int kvf_proxy_kvidx_cached_tokens(kvf_proxy_kvidx_h kx, int idx, kvf_proxy_kvidx_query_t *q);

/** {"endpoint", "replay_endpoint", "subscribed", "blocks", "last_seq", "batches",
 *  "replays", "gaps", "lost", "bad_batches", "blocks_not_indexed" (past 2^20 blocks),
 *  "model_digest", "hash_unit", "block_size"}
 *  of instance @a idx; NULL without events. */
cJSON *kvf_proxy_kvidx_json(kvf_proxy_kvidx_h kx, int idx);

#endif
