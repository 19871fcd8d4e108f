/*
 * kvf-proxy routing and admission: which prefill and decode instance a
 * request goes to, and whether it is taken at all.
 *
 * Load of an instance (kvf_proxy_instance_info_t, under the pool's lock):
 *   outstanding         the proxy's prefill/decode calls on it not yet
 *                       answered (prefill) or finished (decode);
 *   queued prompt work  prefill: prompt tokens of those calls, plus what the
 *                       daemon reports queued beyond them (other proxies);
 *   recent rate         prefill: tokens per second of engine time, an EWMA
 *                       (weight KVF_PROXY_RATE_ALPHA) over the differences of
 *                       the daemon's counters between health probes with at
 *                       least KVF_PROXY_RATE_MIN_TOKENS prefilled; before the
 *                       first sample, the daemon's lifetime average.
 *
 * Routing: the prefill instance with the least predicted wait (queued work
 * over its rate; an instance without one yet at the mean rate of those with
 * one; queued tokens while none has one), the decode instance
 * with the fewest outstanding requests (plus its reported waiting queue) in
 * a pair checked compatible, else one not checked yet; ties round robin.
 * Under --routing prefix decode's key also counts the share of the prompt
 * it would pull (its own prefix cache, docs/PREFIX_CACHE.md §6, from its KV
 * events) and blocks its free pages lack, in requests (kvf_proxy_route.c).
 * Neither draining, unhealthy nor at its bound (--max-outstanding, and the
 * daemon's reported --max-queue for prefill) instances get new work.
 *
 * Routing by cached prefix (--routing prefix, the default): the prompt work
 * of a request on a prefill instance is its tokens less the prefix that
 * instance's KV events say it caches (kvf_proxy_kvidx.h), so the predicted
 * wait above weighs the longest cached prefix against the queue in one unit,
 * time: a cached prefix wins while its instance's queue costs less than the
 * tokens it saves. Design: llm-d scores a prefix and a load scorer apart and
 * adds them with weights; one predicted time needs no weights to tune.
 * Rejected: routing to the longest prefix and breaking ties by load (one
 * popular system prompt would pile every request on one instance).
 * Admission: predicted wait = (queued prompt work + this prompt) / rate,
 * times the instance's calibration (below) when that is above 1. A
 * request whose predicted wait exceeds KVF_PROXY_ADMIT_HEADROOM of its
 * budget (min of --prefill-timeout and the time left before its deadline)
 * is refused at once with a 503 and a Retry-After, instead of waiting into a
 * 504. A prompt that alone would take longer than --prefill-timeout is a 400
 * (it can never be served). A request that finds every instance at its
 * --max-outstanding bound waits in the proxy's admission queue
 * (kvf_proxy_admit.h) while kvf_proxy_route_queue_wait_ms() is inside the same
 * headroom of its budget; past it, the same fast 503 with Retry-After.
 */
#ifndef KVF_PROXY_ROUTE_H
#define KVF_PROXY_ROUTE_H

#include "kvf_proxy_metrics.h"
#include "kvf_proxy_pool.h"

#include <stdbool.h>
#include <stdint.h>

#define KVF_PROXY_RATE_ALPHA 0.3        /* EWMA weight of the newest rate sample */
#define KVF_PROXY_RATE_MIN_TOKENS 64    /* a rate sample spans at least this many tokens */
#define KVF_PROXY_ADMIT_HEADROOM 0.65   /* admit while the predicted wait <= this x budget */
#define KVF_PROXY_RETRY_AFTER_MAX_S 60
/* Calibration: answered prefill waits over their predictions (EWMA, weight
 * UP for a ratio above it and DOWN below, each ratio clamped to MIN..MAX, only predictions of
 * at least CALIBRATE_MIN_MS); predictions are multiplied by it when above 1,
 * so a rate that overstates what a queued prompt sees (a CPU shared with
 * other processes, a scheduler that is not first come first served) is
 * corrected from what the requests really waited. */
#define KVF_PROXY_CALIBRATE_MIN_MS 200.0
#define KVF_PROXY_CALIBRATION_MIN 0.25
#define KVF_PROXY_CALIBRATION_MAX 8.0
#define KVF_PROXY_CALIBRATION_UP 0.5
#define KVF_PROXY_CALIBRATION_DOWN 0.1

typedef struct kvf_proxy_route_req {
    int     num_tokens;           /* prompt length, >= 1 */
    int64_t budget_ms;            /* how long it may wait for its first token */
    int64_t prefill_timeout_ms;   /* --prefill-timeout: a prompt alone longer is a 400 */
    const int32_t *tokens;        /* the prompt's ids, num_tokens of them; NULL: no prefix
                                     routing for this request */
    const uint8_t *salt;          /* cache_salt (its chain is its own); NULL when 0 bytes */
    size_t  salt_len;
    int64_t queued_ms;            /* > 0: it waited this long in the proxy's admission queue
                                     and is its head; admitted while the predicted wait fits
                                     the whole budget (no headroom: the margin it was queued
                                     with is what it spent waiting) */
} kvf_proxy_route_req_t;

typedef struct kvf_proxy_route {
    int                prefill_idx;        /* -1: none */
    int                decode_idx;         /* -1: none */
    double             predicted_wait_ms;  /* -1: no rate known (admitted unmeasured) */
    int                cached_tokens;      /* of the prompt, the picked prefill instance's
                                            * KV events say it caches (--routing prefix) */
    int                decode_cached_tokens;   /* the same for the picked decode instance */
    /* on failure */
    int                http;               /* 503 or 400 */
    const char        *type;               /* OpenAI error type */
    kvf_proxy_reject_t reason;             /* for a 503 */
    int                retry_after_s;      /* for a 503: seconds, >= 1 */
    char               why[448];
} kvf_proxy_route_t;

/**
 * Choose the instances for a request and decide its admission.
 * @return KVF_OK with rt->prefill_idx and decode_idx; otherwise rt's
 *         failure fields: KVF_ERR_NO_RESOURCE (503: reason NO_INSTANCE,
 *         QUEUE_FULL or PREDICTED_WAIT), KVF_ERR_REFUSED (503, NO_INSTANCE:
 *         no decode accepts the prefill), KVF_ERR_OUT_OF_RANGE (400: the
 *         prompt fits no instance, or alone takes longer than the timeout).
 */
kvf_status_t kvf_proxy_route_pick(kvf_proxy_pool_h pool, const kvf_proxy_route_req_t *rq,
                                  kvf_proxy_route_t *rt);

/** True when instance @a idx of @a role may get new work now (healthy, not draining). */
bool kvf_proxy_route_usable(kvf_proxy_pool_h pool, kvf_proxy_role_t role, int idx);

/** Wait in ms for @a num_tokens behind @a queued_tokens at @a rate_tps; -1 when rate <= 0. */
double kvf_proxy_route_wait_ms(uint64_t queued_tokens, int num_tokens, double rate_tps);

/** @a prev moved toward @a sample by @a alpha; @a sample when @a prev <= 0. */
double kvf_proxy_route_ewma(double prev, double sample, double alpha);

/** Retry-After seconds for a wait of @a wait_ms over a budget of @a budget_ms: 1..60. */
int kvf_proxy_route_retry_after_s(double wait_ms, double budget_ms);

/** The rate routing uses for @a info: the recent EWMA, else the lifetime average; 0: none. */
double kvf_proxy_route_rate(const kvf_proxy_instance_info_t *info);

/** @a wait_ms times @a info's wait calibration when that is above 1 (-1 stays -1). */
double kvf_proxy_route_calibrated(const kvf_proxy_instance_info_t *info, double wait_ms);

/**
 * Predicted wait in ms before a prompt of @a num_tokens that queues in the
 * proxy behind @a ahead queued prompt tokens gets its first token: the least
 * over routable prefill instances of (their queued work + their share of
 * @a ahead + the prompt) over their rate, calibrated; @a ahead is shared
 * evenly by the instances with a measured rate. -1 while none has one.
 */
double kvf_proxy_route_queue_wait_ms(kvf_proxy_pool_h pool, int num_tokens, uint64_t ahead);

/** Queued prompt work of prefill @a info in tokens: ours outstanding plus foreign. */
uint64_t kvf_proxy_route_queued(const kvf_proxy_instance_info_t *info);

#endif
