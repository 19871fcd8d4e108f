/*
 * kvf-proxy instance pool: the prefill and decode instances the proxy
 * serves from, their health, round-robin choice, and request/reply calls.
 *
 * One I/O thread owns every ZeroMQ socket: one DEALER per instance
 * (connected to the daemon's ROUTER) plus a socket monitor per DEALER. Other
 * threads never touch a socket; they queue serialized ServeRequests and wait
 * on a per-call mailbox the I/O thread fills with the ServeReplies that
 * carry the call's request_id from that instance.
 *
 * Health: the I/O thread sends a HealthRequest to every instance each
 * health interval. An instance is healthy while it is connected, its last
 * probe was answered within the health timeout, and it reports the role it
 * was listed under. A lost connection marks the instance unhealthy at once
 * and fails every call in flight on it (KVF_ERR_PEER_RESET).
 *
 * Pairs: once a prefill and a decode instance are both healthy, the I/O
 * thread asks the decode instance to handshake with that prefill engine
 * (CheckPeerRequest), again whenever either restarts (a new incarnation).
 * A refused pair is never routed; /health lists every pair's verdict.
 */
#ifndef KVF_PROXY_POOL_H
#define KVF_PROXY_POOL_H

#include "kvf_status.h"
#include "kvf_serve.pb-c.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    KVF_PROXY_ROLE_PREFILL = 0,
    KVF_PROXY_ROLE_DECODE  = 1,
    KVF_PROXY_ROLE_COUNT
} kvf_proxy_role_t;

#define KVF_PROXY_MAX_INSTANCES 64
#define KVF_PROXY_URL_MAX 256
#define KVF_PROXY_DNS_ERROR_MAX 320

typedef struct kvf_proxy_pool *kvf_proxy_pool_h;
typedef struct kvf_proxy_call *kvf_proxy_call_h;

typedef struct kvf_proxy_pool_params {
    const char *prefill_urls;        /* comma list of ZeroMQ endpoints; may be empty */
    const char *decode_urls;         /* comma list; may be empty */
    int64_t     health_interval_ms;  /* probe period; > 0 */
    int64_t     health_timeout_ms;   /* a probe unanswered this long marks the instance unhealthy */
    int         max_outstanding;     /* requests per instance the proxy has sent and not seen
                                      * answered (prefill) or finished (decode); 0: default
                                      * KVF_PROXY_MAX_OUTSTANDING_DEFAULT */
    /* This proxy's tokenizer fingerprint (common/tokenizer/kvf_tok_digest.h): an instance
     * reporting another is marked unhealthy ("incompatible: tokenizer ..."). NULL or "":
     * none yet (no --model): the first instance's model folder that @a adopt can read
     * gives it (kvf_proxy_tokcheck.c). */
    const char *tokenizer_digest;
    const char *tokenizer_source;    /* where it came from, for logs and /health */
    /* Load the tokenizer of model folder @a path, which must have fingerprint @a digest,
     * and start serving text with it (@a path NULL: byte ids, for instances that report
     * no tokenizer). KVF_OK, or an error with its reason in @a why.
     * Called by the pool's thread with the pool locked, at most once per folder. */
    kvf_status_t (*adopt)(void *ctx, const char *path, const char *digest, char *why,
                          size_t cap);
    void       *adopt_ctx;
    /* --routing prefix: subscribe to the prefill instances' KV events and prefer the one
     * caching the longest prefix of a request, weighed against load (kvf_proxy_route.h);
     * false (--routing load): by load alone */
    bool        prefix_routing;
    double      prefix_weight;       /* work a cached prompt token saves, in tokens; >= 0 */
    double      decode_prefix_weight;   /* decode: a whole prompt to pull, in requests; >= 0 */
} kvf_proxy_pool_params_t;

#define KVF_PROXY_MAX_OUTSTANDING_DEFAULT 128

/** What the last health reply of one instance said, and what the proxy thinks of it. */
typedef struct kvf_proxy_instance_info {
    char     url[KVF_PROXY_URL_MAX];
    bool     connected;
    bool     healthy;
    bool     draining;               /* it said so (SIGTERM): healthy, but not routed to */
    bool     answered;               /* at least one health reply so far */
    char     engine_id[64];
    char     reported_role[16];
    uint32_t tp_size;
    uint64_t free_pages;
    uint64_t total_pages;
    uint32_t running;
    uint32_t block_size;
    uint64_t leases;
    uint64_t handshake_refusals;
    uint64_t peer_errors;
    uint32_t queue_depth;            /* requests admitted, not yet running */
    double   step_ms;                /* last finished engine step */
    double   step_running_ms;        /* age of the step in progress; 0 when idle */
    uint64_t xfer_timeout_ms;        /* the instance's --xfer-timeout; 0: not reported */
    uint64_t lease_timeout_ms;       /* prefill: --lease-timeout; 0: not reported */
    char     side_host[64];          /* prefill: side channel for handshakes */
    uint32_t side_port;
    uint64_t incarnation;            /* per process; 0: not reported */
    uint64_t restarts;               /* incarnation changes seen (the process restarted) */
    uint32_t max_prompt_tokens;      /* longest prompt its pool holds; 0: not reported */
    double   prefill_tokens_per_s;   /* measured prefill rate; 0: not measured yet */
    bool     prefix_caching;         /* the instance's --prefix-caching */
    uint64_t prefix_queries, prefix_hits;   /* its prefix cache counters, tokens */
    uint64_t releases_refused;       /* prefill: lease operations refused */
    uint64_t expired_reads_prevented;/* reads not trusted because the lease expired */
    uint64_t quarantined_blocks;     /* prefill: blocks quarantined before reuse */
    uint64_t quarantine_cut_blocks;  /* prefill: of those, freed early by an abandon */
    uint64_t auth_refusals_serve;    /* peers its control channel's key check refused */
    uint64_t auth_refusals_side;     /* prefill: peers its side channel's key check refused */
    int64_t  last_ok_age_ms;         /* since the last answered probe; -1: never */
    uint64_t probes_failed;
    char     last_error[256];        /* why it is unhealthy; "" when healthy */
    /* load (kvf_proxy_route.h) */
    uint64_t queued_prompt_tokens;   /* prefill: reported prompt tokens not yet computed */
    uint32_t max_queue;              /* the daemon's --max-queue; 0: not reported */
    double   prefill_rate_recent;    /* prefill: tokens/s, EWMA over probe intervals; 0: none */
    uint32_t outstanding;            /* proxy's calls on it not answered / finished */
    uint32_t reserved;               /* decode: picked for requests still in prefill (their
                                      * decode call not sent): counted against the bound */
    uint64_t outstanding_tokens;     /* prefill: prompt tokens of those calls */
    uint64_t foreign_tokens;         /* prefill: reported queue beyond ours (other proxies) */
    double   wait_calibration;       /* prefill: EWMA of answered / predicted wait; 0: none yet */
    uint64_t prefix_routed;          /* requests routed here for a cached prefix */
    uint64_t prefix_routed_tokens;   /* their tokens expected cached here */
    char     device[64];             /* HealthReply.device: "cpu", "cuda:0", ...; "" unknown */
    /* url by name (kvf_proxy_resolve.c): the address it resolved to, connected to ("" none
     * yet; url itself when url is an address) and the last resolution's error ("" none) */
    char     address[KVF_PROXY_URL_MAX];
    char     resolve_error[KVF_PROXY_DNS_ERROR_MAX];
} kvf_proxy_instance_info_t;

/**
 * Parse the endpoint lists, create the sockets and start the I/O thread.
 * Every instance starts unhealthy until it answers a probe.
 *
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for a malformed list (empty item,
 *         more than KVF_PROXY_MAX_INSTANCES, an endpoint ZeroMQ rejects);
 *         KVF_ERR_ZMQ or KVF_ERR_NO_MEMORY. Nothing is left running on error.
 */
kvf_status_t kvf_proxy_pool_create(const kvf_proxy_pool_params_t *params,
                                   kvf_proxy_pool_h *pool_p);

/** Stop the I/O thread, fail calls still registered, close the sockets. NULL: no-op. */
void kvf_proxy_pool_destroy(kvf_proxy_pool_h pool);

/** Number of instances of @a role listed. */
int kvf_proxy_pool_count(kvf_proxy_pool_h pool, kvf_proxy_role_t role);

/**
 * Pick a healthy instance of @a role that is not draining (healthy below
 * means that, here and in kvf_proxy_pool_pick_decode and
 * kvf_proxy_pool_ready) and below its outstanding bound: for prefill the
 * least predicted wait, for decode the fewest outstanding requests
 * (kvf_proxy_route.h), ties round robin. A prefill instance every healthy
 * decode instance refused is skipped. Implemented in kvf_proxy_route.c.
 * @return KVF_OK with *idx_p set; KVF_ERR_NO_RESOURCE when none is healthy;
 *         KVF_ERR_BUSY when every healthy one is at its bound.
 */
kvf_status_t kvf_proxy_pool_pick(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int *idx_p);

/**
 * Pick a healthy decode instance for prefill instance @a prefill_idx and a
 * prompt of @a num_tokens with room (below its outstanding bound), the
 * least loaded: pairs checked compatible first, then pairs not checked yet;
 * a refused pair never, nor an instance whose pool cannot hold the prompt.
 * @return KVF_OK with *idx_p; KVF_ERR_NO_RESOURCE when no decode instance is
 *         healthy; KVF_ERR_BUSY when every one that would do is at its
 *         bound; KVF_ERR_REFUSED when every healthy one refused this
 *         prefill (@a why, capacity @a why_cap, gets one refusal text);
 *         KVF_ERR_OUT_OF_RANGE when none that accepts it can hold the prompt
 *         (@a why says the largest prompt one can hold).
 * On KVF_OK the pick holds a reservation on the instance, counted against
 * its bound like an outstanding request (under the same lock as the check,
 * so concurrent picks cannot all take the last slot, and requests still in
 * prefill count on the decode instance they will go to): the request's
 * decode call takes it over (kvf_proxy_call_start with a DecodeRequest), or
 * kvf_proxy_pool_unreserve() gives it back. Without it, a decode instance
 * saw only the decode calls already sent and could get one request per
 * prefill slot of the whole pool beyond --max-outstanding.
 */
kvf_status_t kvf_proxy_pool_pick_decode(kvf_proxy_pool_h pool, int prefill_idx, int num_tokens,
                                        int *idx_p, char *why, size_t why_cap);

/** Give back a reservation of kvf_proxy_pool_pick_decode() on decode instance @a idx whose
 *  decode call will not be sent (the request failed or moved to another instance). */
void kvf_proxy_pool_unreserve(kvf_proxy_pool_h pool, int idx);

/** Endpoint of instance @a idx of @a role (stable for the pool's lifetime). */
const char *kvf_proxy_pool_url(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx);

/** Snapshot of one instance's state. */
void kvf_proxy_pool_info(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx,
                         kvf_proxy_instance_info_t *info_p);

/** True when a healthy prefill and a healthy decode instance form a pair not refused. */
bool kvf_proxy_pool_ready(kvf_proxy_pool_h pool);

/**
 * JSON object {"status", "prefill": [...], "decode": [...], "pairs": [{"prefill",
 * "decode", "state": "compatible"|"refused"|"checking"|"unchecked", "error"}]};
 * caller frees with cJSON_Delete.
 */
cJSON *kvf_proxy_pool_health_json(kvf_proxy_pool_h pool);

/** Per-instance gauges in Prometheus text format (label kvf_instance="<url>", role). */
void kvf_proxy_pool_render_metrics(kvf_proxy_pool_h pool, FILE *out);

/**
 * Register a mailbox for the replies to @a request_id from instance @a idx
 * of @a role, then queue @a req for that instance. Replies that arrive
 * before the caller waits are kept.
 *
 * @param [in]  request_id  Copied; at most 127 bytes.
 * @param [in]  req         Serialized here; the caller keeps ownership.
 * @param [out] call_p      End it with kvf_proxy_call_end().
 *
 * @return KVF_OK; KVF_ERR_INVALID_PARAM; KVF_ERR_NO_MEMORY. A send that
 *         fails later (no connection) is reported by kvf_proxy_call_next().
 */
kvf_status_t kvf_proxy_call_start(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx,
                                  const char *request_id, const Kvf__ServeRequest *req,
                                  kvf_proxy_call_h *call_p);

/**
 * Wait up to @a timeout_ms for the next reply of @a call.
 *
 * @param [out] reply_p  Owned by the caller: kvf__serve_reply__free_unpacked(r, NULL).
 * @return KVF_OK; KVF_ERR_PEER_TIMEOUT when nothing came in time (the call
 *         stays usable); KVF_ERR_PEER_RESET when the instance's connection
 *         was lost; KVF_ERR_PEER_UNREACHABLE when the request could not be
 *         sent (not connected). @a msg (capacity @a msg_cap, may be NULL)
 *         then says what happened, naming the instance.
 */
kvf_status_t kvf_proxy_call_next(kvf_proxy_call_h call, int64_t timeout_ms,
                                 Kvf__ServeReply **reply_p, char *msg, size_t msg_cap);

/** Unregister @a call and free replies it did not read. NULL: no-op. */
void kvf_proxy_call_end(kvf_proxy_call_h call);

/** Called when a call has something to read (see kvf_proxy_call_set_notify). */
typedef void (*kvf_proxy_call_notify_t)(void *arg);

/**
 * Have @a fn(@a arg) called whenever a reply for @a call arrives or the call
 * fails, and once now if one is already waiting: so an event loop can wait
 * without a thread per call (the HTTP edge). It runs on the pool's I/O
 * thread (or the thread failing the call) with the pool's lock held: it must
 * be short and must not call into the pool. @a fn NULL: none.
 */
void kvf_proxy_call_set_notify(kvf_proxy_call_h call, kvf_proxy_call_notify_t fn, void *arg);

/**
 * Queue @a req for instance @a idx of @a role without waiting for a reply
 * (AbortRequest). Best effort: a failed send is logged.
 */
kvf_status_t kvf_proxy_pool_send(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx,
                                 const Kvf__ServeRequest *req);

/** "prefill" or "decode". */
const char *kvf_proxy_role_name(kvf_proxy_role_t role);

#endif
