/*
 * kvf-proxy: the series vLLM's own /metrics exports, under vLLM's names
 * ("vllm:..."), label names (model_name, engine) and histogram bucket
 * boundaries, for every series whose meaning kvferry can honour, so that a
 * vLLM dashboard, alert or autoscaler trigger reads a kvferry pool unchanged.
 * Rendered at the end of the proxy's /metrics, beside the kvf_* series.
 *
 * Source of the names, meanings and buckets: vLLM's Prometheus stat logger
 * (vllm/v1/metrics/loggers.py) and its NIXL connector's metrics; the router
 * series (vllm:healthy_pods_total, vllm:current_qps, router_*_usage_percent)
 * follow vLLM production-stack's router, whose role the proxy plays. Facts
 * only; deploy/README.md ("Metrics") lists each series and what it measures
 * here.
 *
 * Labels. model_name is the proxy's --model-name. engine names who measured:
 * "pool" for what the proxy measures over the whole pool (request latencies,
 * tokens, transfers decode instances reported), an instance's engine id for
 * that instance's gauges (running, waiting, KV cache usage; from its last
 * health reply, absent while it is unhealthy) and "proxy" for requests
 * waiting in the proxy's own admission queue. The instance's address is
 * kvf_instance, never "instance" (a label Prometheus sets on every target and
 * would rename to exported_instance).
 *
 * Request-level meanings here (vLLM measures inside one engine; kvferry's
 * request crosses a prefill and a decode instance):
 *   time_to_first_token   request received -> first token ready (prefill's)
 *   e2e_request_latency   request received -> last token
 *   request_queue_time    proxy queue + prefill queue + decode queue
 *   request_prefill_time  prefill compute as reported by the prefill instance
 *   request_decode_time   first token -> last token
 *   request_inference_time  prefill + decode time
 *   inter_token_latency / time_per_output_token   each gap between tokens
 *   request_time_per_output_token   per request: decode time / (tokens - 1)
 *   request_success{finished_reason}   stop, length, abort (client gone,
 *                          timeouts, failures after admission)
 *   nixl_*                 the KV pull decode instances reported (UCX, not
 *                          NIXL: same meaning, one transfer per request)
 *   gpu_prefix_cache_* / prefix_cache_*   every prefilled prompt token is a
 *                          query, each one prefill's prefix cache served a
 *                          hit (its reply's timing.cached_tokens)
 *   num_requests_swapped   0: kvferry never swaps a request out
 */
#ifndef KVF_PROXY_VLLM_H
#define KVF_PROXY_VLLM_H

#include "kvf_proxy_pool.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/** One finished request as the vLLM series count it. Times in seconds. */
typedef struct kvf_proxy_vllm_req {
    bool        admitted;          /* sent to an instance (false: refused before) */
    bool        first_token;       /* a first token came back */
    const char *finished_reason;   /* "stop", "length" or "abort" */
    double      ttft_s;            /* valid with first_token */
    double      e2e_s;             /* received -> finished */
    double      queue_s;           /* proxy + prefill + decode queue; < 0: not known */
    double      prefill_s;         /* prefill compute; < 0: not reported */
    uint32_t    prompt_tokens;
    uint32_t    cached_tokens;     /* of those, served by prefill's prefix cache */
    uint32_t    generation_tokens;
    uint32_t    max_tokens;        /* the request's max_tokens */
    bool        transfer;          /* decode reported a KV pull (the fields below) */
    bool        transfer_failed;   /* the pull failed; decode recomputed the prompt */
    double      transfer_s;        /* the pull's duration */
    double      post_s;            /* planning and posting its reads; < 0: not reported */
    uint64_t    transfer_bytes;
    uint64_t    transfer_descriptors;
} kvf_proxy_vllm_req_t;

/**
 * Count one finished request @a r in the process-wide vLLM series
 * (one proxy per process; thread-safe, one mutex, a few additions).
 */
void kvf_proxy_vllm_request(const kvf_proxy_vllm_req_t *r);

/**
 * Record @a count gaps of @a seconds each between consecutive tokens
 * (vllm:inter_token_latency_seconds and its older name
 * vllm:time_per_output_token_seconds).
 */
void kvf_proxy_vllm_token_gap(double seconds, uint64_t count);

/** Adjust the count of requests waiting in the proxy's admission queue by @a delta. */
void kvf_proxy_vllm_waiting(int delta);

/**
 * Write every vLLM series in Prometheus text format (HELP and TYPE lines
 * included) to @a out. @a model_name: the model_name label (escaped);
 * @a max_model_len: the token-count histograms' top 1-2-5 bound (vLLM's
 * build_1_2_5_buckets(max_model_len)); 0: unknown, up to 10^7.
 * @a pool: the instances whose gauges are shown; NULL: none.
 */
void kvf_proxy_vllm_render(kvf_proxy_pool_h pool, const char *model_name, int max_model_len,
                           FILE *out);

#endif
