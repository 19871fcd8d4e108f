/*
 * kvf-proxy HTTP front end (libmicrohttpd, one epoll event loop; requests
 * waiting for instances are suspended, not holding a thread):
 *
 *   POST /v1/completions   OpenAI text completion; "stream": true answers
 *                          server-sent events "data: {...}\n\n" ending with
 *                          "data: [DONE]\n\n"
 *   GET  /v1/models        the served model
 *   GET  /health           200 when at least one prefill and one decode
 *                          instance are healthy, else 503; JSON per instance
 *   GET  /metrics          Prometheus text
 *
 * With an API key, /v1/... needs "Authorization: Bearer KEY" (as vLLM's
 * server); /health and /metrics too with protect_metrics. Else 401 with the
 * OpenAI error JSON. Optional TLS (HTTPS) from PEM files.
 */
#ifndef KVF_PROXY_HTTP_H
#define KVF_PROXY_HTTP_H

#include "kvf_proxy_flow.h"
#include "kvf_proxy_metrics.h"
#include "kvf_proxy_openai.h"
#include "kvf_proxy_pool.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct kvf_proxy_http *kvf_proxy_http_h;

typedef struct kvf_proxy_http_params {
    const char                   *host;             /* address to bind, e.g. "127.0.0.1" */
    int                           port;             /* 0: any free port */
    unsigned                      max_connections;  /* admitted at once; more get JSON 503 */
    unsigned                      max_per_client;   /* admitted at once from one client;
                                                     * 0: no cap */
    const char                   *trusted_proxies;  /* comma list: X-Forwarded-For believed
                                                     * from these peers; NULL/"": none */
    const char                   *api_key;          /* borrowed; NULL/"": no key needed */
    bool                          protect_metrics;  /* the key also for /health, /metrics */
    const char                   *tls_cert;         /* PEM file; NULL/"": plain HTTP */
    const char                   *tls_key;          /* PEM file, with tls_cert */
    size_t                        max_body;         /* bytes; larger bodies get 413 */
    int64_t                       header_timeout_ms;/* accept -> request headers complete */
    int64_t                       body_timeout_ms;  /* headers -> body complete */
    int64_t                       idle_timeout_ms;  /* answer -> next request's headers */
    kvf_proxy_flow_ctx_t         *flow;             /* borrowed; outlives the server;
                                                     * drain sets its cancel flag */
    const kvf_proxy_openai_ctx_t *api;              /* borrowed */
} kvf_proxy_http_params_t;

/**
 * Bind and start serving.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (bad host, a bad trusted proxy,
 *         one of tls_cert/tls_key without the other); KVF_ERR_UNSUPPORTED
 *         (TLS asked of a libmicrohttpd without it); KVF_ERR_IO (bind failed,
 *         e.g. the port is taken; a PEM file unreadable; all logged).
 */
kvf_status_t kvf_proxy_http_start(const kvf_proxy_http_params_t *params,
                                  kvf_proxy_http_h *http_p);

/** The bound TCP port (useful with port 0). */
int kvf_proxy_http_port(kvf_proxy_http_h http);

/**
 * Graceful drain (SIGTERM): stop accepting connections, answer new requests
 * on open connections with a JSON 503, give the requests in flight up to
 * @a grace_ms to finish, then end the rest (a stream with an error event
 * and [DONE], any other with a 503; both abort their instances' work) and
 * wait up to 2 s for them. Call once, before kvf_proxy_http_stop().
 */
void kvf_proxy_http_drain(kvf_proxy_http_h http, int64_t grace_ms);

/**
 * Stop accepting, wake requests waiting on instances (they end as if the
 * client had gone, aborting their instances' work) and join the threads.
 * NULL: no-op.
 */
void kvf_proxy_http_stop(kvf_proxy_http_h http);

#endif
