/*
 * The life of one completion request through a prefill and a decode
 * instance (docs/ARCHITECTURE.md §3):
 *
 *   pick a healthy prefill and decode instance (round robin)
 *   -> PrefillRequest to prefill; its reply carries the first token and the
 *      TransferParams (where decode finds the KV state)
 *   -> DecodeRequest to decode with those params; decode pulls the state and
 *      streams ServeReplies with the tokens after the first, ending done=true.
 *
 * The first completion token is the one prefill sampled; decode replies
 * carry only the tokens generated after it. SamplingParams.max_tokens
 * counts the first token.
 *
 * Every wait is bounded (prefill timeout, per-token timeout, request
 * deadline) and every wait slice checks whether the client went away. A
 * request that does not finish normally (client gone, timeout, error) sends
 * AbortRequest to both instances so their blocks are released.
 */
#ifndef KVF_PROXY_FLOW_H
#define KVF_PROXY_FLOW_H

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
    atomic_bool         cancel;              /* set: every wait ends the request with a 503
                                              * (the proxy is shutting down) */
    int64_t             drain_timeout_ms;    /* named in that 503 */
} kvf_proxy_flow_ctx_t;

typedef struct kvf_proxy_flow {
    const kvf_proxy_flow_ctx_t       *ctx;
    const kvf_proxy_completion_req_t *req;
    kvf_proxy_completion_t            out;      /* tokens so far, stats, instances */
    int                               cap_tokens;
    int                               prefill_idx;  /* -1: none */
    int                               decode_idx;
    kvf_proxy_call_h                  decode_call;
    int64_t                           t0_us;
    int64_t                           deadline_us;
    int64_t                           last_token_us;
    int64_t                           prefill_sent_us;   /* TTFT breakdown timestamps */
    int64_t                           prefill_recv_us;
    int64_t                           decode_sent_us;
    bool                              has_prefill_timing;
    double                            prefill_total_ms, prefill_queue_ms, prefill_compute_ms;
    bool                              done;        /* finished normally */
    bool                              client_gone;
    int                               http_code;   /* on failure */
    const char                       *error_type;  /* on failure */
    char                              error[512];  /* on failure */
    kvf_proxy_gone_func_t             gone;
    void                             *gone_arg;
} kvf_proxy_flow_t;

/**
 * Start @a flow for @a req: pick instances, run prefill, wait for the first
 * token (appended to flow->out.tokens) and send the DecodeRequest.
 *
 * @param [in] gone, gone_arg  Polled while waiting; may be NULL.
 * @return KVF_OK; otherwise flow->http_code, error_type and error say why
 *         (503 no healthy instance, 504 timeout, 502 instance failure, 400
 *         when an instance rejects the request, 499 client gone).
 *         Always call kvf_proxy_flow_finish() afterwards.
 */
kvf_status_t kvf_proxy_flow_start(kvf_proxy_flow_t *flow, const kvf_proxy_flow_ctx_t *ctx,
                                  const kvf_proxy_completion_req_t *req,
                                  kvf_proxy_gone_func_t gone, void *gone_arg);

/**
 * Wait for the next decode reply and append its tokens. Sets flow->done on
 * the last one. @a first_new_p gets the index of the first new token.
 * @return KVF_OK (possibly with no new tokens); an error as for start.
 */
kvf_status_t kvf_proxy_flow_next(kvf_proxy_flow_t *flow, int *first_new_p);

/**
 * End the flow: abort both instances unless it finished normally, release
 * the decode call, record metrics and free the token buffer.
 */
void kvf_proxy_flow_finish(kvf_proxy_flow_t *flow);

/** Microseconds of CLOCK_MONOTONIC. */
int64_t kvf_proxy_now_us(void);

#endif
