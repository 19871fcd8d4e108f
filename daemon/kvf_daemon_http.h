/*
 * A role daemon's HTTP port (kvf-prefill, kvf-decode --metrics-port N):
 * GET /metrics and GET /health over libmicrohttpd, so that in Kubernetes
 * every pod can be scraped and probed, not only the proxy's.
 *
 * What it serves comes from the health snapshot the run loop publishes
 * every iteration (the same HealthReply the proxy's probes read): no engine
 * lock is taken and a busy engine step never delays an answer.
 *
 *   /health   200 {"status":"ok",...} while the loop publishes and the
 *             instance can serve; 503 with the reason while it starts (no
 *             snapshot yet), drains (after SIGTERM), cannot serve (a broken
 *             TP world) or its loop has published nothing for
 *             KVF_DAEMON_HTTP_STALE_MS (a stuck engine step).
 *   /metrics  Prometheus text: vLLM's per-engine gauges
 *             vllm:num_requests_running, vllm:num_requests_waiting,
 *             vllm:kv_cache_usage_perc (and its older name
 *             vllm:gpu_cache_usage_perc), labels model_name and engine (the
 *             engine id); kvf_daemon_* gauges and counters of this instance
 *             (labels engine, role). No label is named "instance".
 *
 * Process-wide (one daemon per process). Thread-safe: publish from the run
 * loop, answers from libmicrohttpd's thread, one mutex around a copy.
 */
#ifndef KVF_DAEMON_HTTP_H
#define KVF_DAEMON_HTTP_H

#include "kvf_status.h"
#include "kvf_serve.pb-c.h"

#include <stdint.h>

/* A loop that has published nothing for this long answers /health 503: longer than any
 * engine step the CPU path takes on the models it serves, short enough for a liveness probe. */
#define KVF_DAEMON_HTTP_STALE_MS 60000
/* Publishes closer together than this are skipped (the loop may turn many times a ms). */
#define KVF_DAEMON_HTTP_PUBLISH_MS 100

enum kvf_daemon_http_params_field {   /* append only, never renumber */
    KVF_DAEMON_HTTP_PARAM_FIELD_PORT       = KVF_BIT(0),
    KVF_DAEMON_HTTP_PARAM_FIELD_ROLE       = KVF_BIT(1),
    KVF_DAEMON_HTTP_PARAM_FIELD_ENGINE_ID  = KVF_BIT(2),
    KVF_DAEMON_HTTP_PARAM_FIELD_MODEL_NAME = KVF_BIT(3),
};
#define KVF_DAEMON_HTTP_PARAM_FIELDS_KNOWN (KVF_BIT(4) - 1)

typedef struct kvf_daemon_http_params {
    uint64_t    field_mask;
    int         port;         /* TCP port on every interface, 1..65535; 0 (default): none */
    const char *role;         /* "prefill" or "decode"; default "" */
    const char *engine_id;    /* the engine label; default "" */
    const char *model_name;   /* the model_name label; default "" */
} kvf_daemon_http_params_t;

/**
 * Start serving on params->port (copies the strings). Port 0: nothing is
 * started, KVF_OK. @return KVF_OK; KVF_ERR_INVALID_PARAM for unknown
 * field_mask bits, a port outside 0..65535 or a second start (logged);
 * KVF_ERR_IO when the port cannot be bound (logged with the port).
 */
kvf_status_t kvf_daemon_http_start(const kvf_daemon_http_params_t *params);

/**
 * Keep a copy of the numbers of @a health (and its cannot_serve text) as
 * what /metrics and /health answer from now on. Cheap: call it every loop
 * iteration (one copy per KVF_DAEMON_HTTP_PUBLISH_MS is kept; draining or
 * broken at once). A no-op while no server runs.
 */
void kvf_daemon_http_publish(const Kvf__HealthReply *health);

/** Stop serving and forget the snapshot; a no-op when nothing runs. */
void kvf_daemon_http_stop(void);

#endif
