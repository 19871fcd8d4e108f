/*
 * The life of one completion request through a prefill and a decode
 * instance (docs/ARCHITECTURE.md §3):
 *
 *   pick a healthy prefill and decode instance
 *   -> PrefillRequest to prefill; its reply carries the first token and the
 *      TransferParams (where decode finds the KV state)
 *   -> DecodeRequest to decode with those params; decode pulls the state and
 *      streams ServeReplies with the tokens after the first, ending done=true.
 *
 * The first completion token is the one prefill sampled; decode replies
 * carry only the tokens generated after it. SamplingParams.max_tokens
 * counts the first token.
 *
 * Asynchronous: nothing here blocks. kvf_proxy_flow_begin() sends the
 * prefill request; kvf_proxy_flow_step() reads whatever replies have come
 * and advances; the caller steps again when the notify callback fires (a
 * reply came or a call failed) or at kvf_proxy_flow_wake_us() (a deadline).
 * Every wait is bounded (prefill timeout, per-token timeout, request
 * deadline) and each step checks whether the client went away. A request
 * that does not finish normally (client gone, timeout, error) sends
 * AbortRequest to both instances so their blocks are released.
 *
 * A proxy that has just started has not heard from its instances yet: a
 * request that finds none healthy then waits (up to ctx->warmup_until_us)
 * for the first health round instead of failing at once. A request that
 * finds every instance at its outstanding bound waits in ctx->admit (first
 * come first served, kvf_proxy_admit.h) while its predicted wait is inside
 * its budget, until its deadline at most.
 */
#ifndef KVF_PROXY_FLOW_H
#define KVF_PROXY_FLOW_H

#include "kvf_proxy_admit.h"
#include "kvf_proxy_metrics.h"
#include "kvf_proxy_openai.h"
#include "kvf_proxy_pool.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/** True when the client that asked for the request has gone away. */
typedef bool (*kvf_proxy_gone_func_t)(void *arg);

typedef struct kvf_proxy_flow_ctx {
    kvf_proxy_pool_h    pool;
    kvf_proxy_metrics_h metrics;
    int64_t             request_timeout_ms;  /* whole request */
    int64_t             prefill_timeout_ms;  /* PrefillRequest -> first token */
    int64_t             token_timeout_ms;    /* gap between decode replies */
    atomic_bool         cancel;              /* set: every step ends the request with a 503
                                              * (the proxy is shutting down) */
    int64_t             drain_timeout_ms;    /* named in that 503 */
    int64_t             started_us;          /* kvf_proxy_now_us() when the pool started */
    int64_t             health_interval_ms;  /* the pool's probe period */
    int64_t             warmup_until_us;     /* until then a request that finds no healthy
                                              * instance waits for the first probes */
    kvf_proxy_admit_h   admit;               /* where requests wait for a slot
                                              * (kvf_proxy_admit.h); NULL: none, a full
                                              * pool answers 503 at once */
} kvf_proxy_flow_ctx_t;

typedef enum {
    KVF_PROXY_FLOW_WAIT_POOL = 0,  /* no healthy instance yet, the first probes are out */
    KVF_PROXY_FLOW_PREFILL,        /* PrefillRequest sent, waiting for the first token */
    KVF_PROXY_FLOW_DECODE,         /* DecodeRequest sent, relaying its replies */
    KVF_PROXY_FLOW_OVER,           /* done, or failed */
} kvf_proxy_flow_stage_t;

typedef struct kvf_proxy_flow {
    const kvf_proxy_flow_ctx_t       *ctx;
    const kvf_proxy_completion_req_t *req;
    kvf_proxy_completion_t            out;      /* tokens so far, stats, instances */
    kvf_proxy_flow_stage_t            stage;
    int                               cap_tokens;
    int                               prefill_idx;  /* -1: none */
    int                               decode_idx;
    bool                              decode_reserved;  /* decode_idx's slot held, call not sent */
    kvf_proxy_call_h                  prefill_call;
    kvf_proxy_call_h                  decode_call;
    Kvf__SamplingParams               sampling;     /* prefill's, reused for decode */
    int64_t                           t0_us;
    int64_t                           deadline_us;
    int64_t                           wait_start_us;     /* the current wait began */
    int64_t                           last_token_us;
    int64_t                           prefill_sent_us;   /* TTFT breakdown timestamps */
    int64_t                           prefill_recv_us;
    int64_t                           decode_sent_us;
    bool                              has_prefill_timing;
    double                            prefill_total_ms, prefill_queue_ms, prefill_compute_ms;
    uint32_t                          cached_tokens;   /* prefill's prefix cache hit */
    bool                              done;        /* finished normally */
    bool                              client_gone;
    int                               http_code;   /* on failure */
    const char                       *error_type;  /* on failure */
    char                              error[512];  /* on failure */
    int                               retry_after_s;  /* on a 503 refusal: Retry-After; 0 none */
    kvf_proxy_gone_func_t             gone;
    void                             *gone_arg;
    kvf_proxy_call_notify_t           notify;
    void                             *notify_arg;
    kvf_proxy_admit_entry_t           admit;       /* its place in ctx->admit while queued */
    int64_t                           queued_us;   /* when it queued; 0: never */
} kvf_proxy_flow_t;

/**
 * Begin @a flow for @a req: pick instances and send the PrefillRequest
 * (or, in a proxy's first health round, wait for a healthy instance).
 *
 * @param [in] gone, gone_arg      Asked at each step; may be NULL.
 * @param [in] notify, notify_arg  Set on every call of the flow
 *                                 (kvf_proxy_call_set_notify); may be NULL.
 * @return KVF_OK (under way: step it); otherwise flow->http_code,
 *         error_type and error say why (503 no healthy instance, 400 when no
 *         instance can take the prompt, 500). Always call
 *         kvf_proxy_flow_finish() afterwards.
 */
kvf_status_t kvf_proxy_flow_begin(kvf_proxy_flow_t *flow, const kvf_proxy_flow_ctx_t *ctx,
                                  const kvf_proxy_completion_req_t *req,
                                  kvf_proxy_gone_func_t gone, void *gone_arg,
                                  kvf_proxy_call_notify_t notify, void *notify_arg);

/**
 * Read the replies that have come and advance, without waiting: the first
 * token (prefill's reply, then the DecodeRequest goes out), then decode's
 * tokens, appended to flow->out.tokens; flow->done on the last one.
 * @a first_new_p gets the index of the first token this step appended.
 * @return KVF_OK when something happened (a stage passed, tokens came, or
 *         done); KVF_PROXY_FLOW_PENDING when nothing has (step again on a notification
 *         or at kvf_proxy_flow_wake_us()); otherwise a failure as for begin
 *         (also 504 timeout, 502 instance failure, 499 client gone, 503
 *         shutting down).
 */
kvf_status_t kvf_proxy_flow_step(kvf_proxy_flow_t *flow, int *first_new_p);

/** kvf_proxy_flow_step()'s "nothing yet": positive, so never taken for an error (a daemon's
 *  KVF_ERR_BUSY is one). */
#define KVF_PROXY_FLOW_PENDING ((kvf_status_t)1)

/** When to step again without a notification (the current wait's deadline), in kvf_proxy_now_us(). */
int64_t kvf_proxy_flow_wake_us(const kvf_proxy_flow_t *flow);

/**
 * End the flow: abort both instances unless it finished normally, release
 * the calls, record metrics and free the token buffer. Once it returns, no
 * notify callback of the flow runs any more.
 */
void kvf_proxy_flow_finish(kvf_proxy_flow_t *flow);

/**
 * End a flow early as finished (a stop string was found in its text): abort it on
 * the instances still holding it and mark it done with @a reason as finish_reason.
 * No-op once over. kvf_proxy_flow_finish() is still called afterwards.
 */
void kvf_proxy_flow_stop(kvf_proxy_flow_t *flow, const char *reason);

/** Microseconds of CLOCK_MONOTONIC. */
int64_t kvf_proxy_now_us(void);

#endif
