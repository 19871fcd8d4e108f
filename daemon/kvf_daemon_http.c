/*
 * A role daemon's /metrics and /health (see kvf_daemon_http.h).
 *
 * Design: a snapshot of plain numbers copied under a mutex at every publish,
 * rendered by libmicrohttpd's own thread; the run loop never waits for HTTP.
 * Rejected: answering from the engine directly (its state belongs to the
 * loop's thread; a long step would stall the probe, which is what the
 * staleness check must see instead).
 */
#include "kvf_prom.h"
#include "kvf_daemon_http.h"
#include "kvf_log.h"
#include "kvf_time.h"

#include <inttypes.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    bool     valid;
    uint64_t at_ms;
    uint64_t free_pages, total_pages, leases, handshake_refusals, peer_errors;
    uint64_t queued_prompt_tokens, prefill_tokens_total, expired_reads_prevented;
    uint64_t releases_refused, quarantined_blocks, kv_digest_mismatches;
    uint64_t auth_refusals_serve, auth_refusals_side;
    uint32_t running, queue_depth, max_queue, tp_size;
    double   step_ms, step_running_ms, prefill_seconds_total, prefill_tokens_per_s;
    bool     draining;
    char     cannot_serve[256];
    bool     prefix_caching;
    uint64_t prefix_queries, prefix_hits, prefix_hit_attn, prefix_hit_state;
    uint64_t prefix_blocks_evicted, prefix_states_evicted;
    uint32_t prefix_cached_blocks, prefix_states;
    uint64_t prefix_pulled_tokens, prefix_unknown_source, kv_pulls, kv_pulled_bytes;
    uint32_t block_size;
    bool     kv_events;                 /* publishing (daemon/kvf_kv_events.h) */
    uint64_t kve_batches, kve_dropped, kve_replays;
} kvf_daemon_snap_t;

static struct {
    pthread_mutex_t    lock;
    struct MHD_Daemon *mhd;
    atomic_bool        serving;    /* publish's check, from the run loop's thread */
    _Atomic uint64_t   last_ms;    /* the last publish kept */
    char               role[16];
    char               engine_id[64];
    char               model_name[256];
    kvf_daemon_snap_t  snap;
} kvf_dh = {.lock = PTHREAD_MUTEX_INITIALIZER};

void kvf_daemon_http_publish(const Kvf__HealthReply *h)
{
    kvf_daemon_snap_t s;

    uint64_t now = kvf_time_now_ms();

    /* every loop iteration calls: keep one copy per KVF_DAEMON_HTTP_PUBLISH_MS, except
     * the first and a change to draining or broken, which probes must see at once */
    if (!atomic_load(&kvf_dh.serving) ||
        ((now - atomic_load(&kvf_dh.last_ms) < KVF_DAEMON_HTTP_PUBLISH_MS) &&
         !(h->has_draining && h->draining) && (h->cannot_serve == NULL))) {
        return;
    }
    atomic_store(&kvf_dh.last_ms, now);
    memset(&s, 0, sizeof(s));
    s.valid = true;
    s.at_ms = now;
    s.free_pages = h->free_pages;
    s.total_pages = h->total_pages;
    s.leases = h->leases;
    s.handshake_refusals = h->handshake_refusals;
    s.peer_errors = h->peer_errors;
    s.queued_prompt_tokens = h->queued_prompt_tokens;
    s.prefill_tokens_total = h->prefill_tokens_total;
    s.expired_reads_prevented = h->expired_reads_prevented;
    s.releases_refused = h->releases_refused;
    s.quarantined_blocks = h->quarantined_blocks;
    s.kv_digest_mismatches = h->kv_digest_mismatches;
    s.auth_refusals_serve = h->auth_refusals_serve;
    s.auth_refusals_side = h->auth_refusals_side;
    s.running = h->running;
    s.queue_depth = h->queue_depth;
    s.max_queue = h->max_queue;
    s.tp_size = h->tp_size;
    s.step_ms = h->step_ms;
    s.step_running_ms = h->step_running_ms;
    s.prefill_seconds_total = h->prefill_seconds_total;
    s.prefill_tokens_per_s = h->prefill_tokens_per_s;
    s.draining = h->has_draining && h->draining;
    s.prefix_caching = h->prefix_caching;
    s.prefix_queries = h->prefix_queries_total;
    s.prefix_hits = h->prefix_hits_total;
    s.prefix_hit_attn = h->prefix_hit_attention_tokens_total;
    s.prefix_hit_state = h->prefix_hit_state_tokens_total;
    s.prefix_blocks_evicted = h->prefix_blocks_evicted_total;
    s.prefix_states_evicted = h->prefix_states_evicted_total;
    s.prefix_cached_blocks = h->prefix_cached_blocks;
    s.prefix_states = h->prefix_states;
    s.prefix_pulled_tokens = h->prefix_pulled_tokens_total;
    s.prefix_unknown_source = h->prefix_unknown_source_total;
    s.kv_pulls = h->kv_pulls_total;
    s.kv_pulled_bytes = h->kv_pulled_bytes_total;
    s.block_size = h->block_size;
    s.kv_events = h->has_kv_events_batches_total;
    s.kve_batches = h->kv_events_batches_total;
    s.kve_dropped = h->kv_events_dropped_total;
    s.kve_replays = h->kv_events_replays_total;
    if ((h->cannot_serve != NULL) && (h->cannot_serve[0] != '\0')) {
        snprintf(s.cannot_serve, sizeof(s.cannot_serve), "%s", h->cannot_serve);
    }
    pthread_mutex_lock(&kvf_dh.lock);
    kvf_dh.snap = s;
    pthread_mutex_unlock(&kvf_dh.lock);
}

/* A vllm: gauge of this engine: {model_name, engine}. */
static void kvf_dh_vllm(FILE *out, const char *name, const char *help, double v)
{
    kvf_prom_label_t l[] = {{"model_name", kvf_dh.model_name}, {"engine", kvf_dh.engine_id}};

    kvf_prom_head(out, name, "gauge", help);
    kvf_prom_sample(out, name, l, 2, v);
}

/* A kvf_daemon_ series: {engine, role}. */
static void kvf_dh_kvf(FILE *out, const char *name, const char *type, const char *help,
                       double v)
{
    kvf_prom_label_t l[] = {{"engine", kvf_dh.engine_id}, {"role", kvf_dh.role}};

    kvf_prom_head(out, name, type, help);
    kvf_prom_sample(out, name, l, 2, v);
}

/* A vllm: counter of this engine: {model_name, engine}. */
static void kvf_dh_counter(FILE *out, const char *name, const char *help, uint64_t v)
{
    kvf_prom_label_t l[] = {{"model_name", kvf_dh.model_name}, {"engine", kvf_dh.engine_id}};

    kvf_prom_head(out, name, "counter", help);
    kvf_prom_sample_u64(out, name, l, 2, v);
}

/* The prefix cache's series: vLLM's two counters per engine (tokens), and kvferry's split
 * by what served the hit (attention blocks, Mamba state checkpoints) and where it was
 * computed (local: this instance); decode's prompt tokens pulled from prefill instead. */
static void kvf_dh_prefix(FILE *out, const kvf_daemon_snap_t *s)
{
    kvf_dh_counter(out, "vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of "
                   "number of queried tokens.", s->prefix_queries);
    kvf_dh_counter(out, "vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number "
                   "of cached tokens.", s->prefix_hits);
    kvf_dh_kvf(out, "kvf_daemon_prefix_caching", "gauge", "1 when --prefix-caching is on.",
               s->prefix_caching ? 1 : 0);
    kvf_prom_head(out, "kvf_daemon_prefix_hit_tokens_total", "counter", "Prompt tokens the "
                  "prefix cache served, by kind (attention: shared KV blocks; state: restored "
                  "Mamba checkpoints, which also cover the tokens of their partial block) and "
                  "source (local: this instance's own cache; on decode, blocks it pulled or "
                  "decoded before).");
    for (int k = 0; k < 2; ++k) {
        kvf_prom_label_t l[] = {{"engine", kvf_dh.engine_id}, {"role", kvf_dh.role},
                                {"kind", k ? "state" : "attention"}, {"source", "local"}};
        kvf_prom_sample_u64(out, "kvf_daemon_prefix_hit_tokens_total", l, 4,
                            k ? s->prefix_hit_state : s->prefix_hit_attn);
    }
    kvf_dh_kvf(out, "kvf_daemon_prefix_cached_blocks", "gauge", "Prefixes with a cached "
               "attention block (each a block per attention group).",
               (double)s->prefix_cached_blocks);
    kvf_dh_kvf(out, "kvf_daemon_prefix_states", "gauge", "Mamba state checkpoints held.",
               (double)s->prefix_states);
    kvf_dh_kvf(out, "kvf_daemon_prefix_blocks_evicted_total", "counter", "Cached blocks "
               "reused for other work.", (double)s->prefix_blocks_evicted);
    kvf_dh_kvf(out, "kvf_daemon_prefix_states_evicted_total", "counter", "Checkpoints "
               "replaced (least recently used first).", (double)s->prefix_states_evicted);
    if (strcmp(kvf_dh.role, "decode") != 0) {
        return;
    }
    kvf_dh_kvf(out, "kvf_daemon_prefix_pulled_tokens_total", "counter", "Prompt tokens whose "
               "KV was pulled from prefill (not held here).", (double)s->prefix_pulled_tokens);
    kvf_dh_kvf(out, "kvf_daemon_prefix_unknown_source_total", "counter", "Imports whose "
               "prefill sent no numerics class: pulled whole, nothing kept.",
               (double)s->prefix_unknown_source);
    kvf_dh_kvf(out, "kvf_daemon_kv_pulls_total", "counter", "Pulls whose KV prefill answered "
               "valid.", (double)s->kv_pulls);
    kvf_dh_kvf(out, "kvf_daemon_kv_pulled_bytes_total", "counter", "KV bytes those pulls read, "
               "every rank (Mamba state included).", (double)s->kv_pulled_bytes);
}

static void kvf_dh_metrics(FILE *out, const kvf_daemon_snap_t *s)
{
    bool prefill = (strcmp(kvf_dh.role, "prefill") == 0);

    kvf_dh_kvf(out, "kvf_daemon_up", "gauge", "1 once the engine is loaded and its loop "
               "publishes; 0 while it starts.", s->valid ? 1 : 0);
    if (!s->valid) {
        return;
    }
    kvf_dh_vllm(out, "vllm:num_requests_running", "Number of requests in model execution "
                "batches (holding cache blocks).", s->running);
    kvf_dh_vllm(out, "vllm:num_requests_waiting", "Number of requests waiting to be "
                "processed (admitted, not running yet).", s->queue_depth);
    if (s->total_pages > 0) {
        double use = 1.0 - (double)s->free_pages / (double)s->total_pages;

        kvf_dh_vllm(out, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent "
                    "usage.", use);
        kvf_dh_vllm(out, "vllm:gpu_cache_usage_perc", "KV-cache usage (the older name of "
                    "vllm:kv_cache_usage_perc).", use);
    }
    kvf_dh_kvf(out, "kvf_daemon_free_pages", "gauge", "Free cache pages, summed over ranks.",
               (double)s->free_pages);
    kvf_dh_kvf(out, "kvf_daemon_total_pages", "gauge", "Cache pages, summed over ranks.",
               (double)s->total_pages);
    kvf_dh_kvf(out, "kvf_daemon_max_queue", "gauge", "--max-queue: requests past it are "
               "refused.", s->max_queue);
    kvf_dh_kvf(out, "kvf_daemon_draining", "gauge", "1 after SIGTERM: new requests refused.",
               s->draining ? 1 : 0);
    kvf_dh_kvf(out, "kvf_daemon_can_serve", "gauge", "0 once the TP world broke.",
               (s->cannot_serve[0] == '\0') ? 1 : 0);
    kvf_dh_kvf(out, "kvf_daemon_step_seconds", "gauge", "Duration of the last finished engine "
               "step.", s->step_ms / 1000.0);
    kvf_dh_kvf(out, "kvf_daemon_step_running_seconds", "gauge", "Age of the engine step in "
               "progress; 0 when idle.", s->step_running_ms / 1000.0);
    kvf_dh_kvf(out, "kvf_daemon_handshake_refusals_total", "counter", "Handshakes refused.",
               (double)s->handshake_refusals);
    kvf_dh_kvf(out, "kvf_daemon_peer_errors_total", "counter", "Peer errors seen.",
               (double)s->peer_errors);
    kvf_dh_kvf(out, "kvf_daemon_expired_lease_reads_prevented_total", "counter", "Reads not "
               "trusted because the KV lease expired.", (double)s->expired_reads_prevented);
    kvf_dh_kvf(out, "kvf_daemon_kv_digest_mismatches_total", "counter", "Pulls whose KV "
               "digest differed.", (double)s->kv_digest_mismatches);
    kvf_dh_kvf(out, "kvf_daemon_auth_refusals_serve_total", "counter", "Peers the control "
               "channel's key check refused.", (double)s->auth_refusals_serve);
    kvf_dh_prefix(out, s);
    if (s->kv_events) {   /* vLLM's KV events (--kv-events-*), while published */
        kvf_dh_kvf(out, "kvf_daemon_kv_events_batches_total", "counter",
                   "KV event batches published on the PUB socket.", (double)s->kve_batches);
        kvf_dh_kvf(out, "kvf_daemon_kv_events_dropped_total", "counter",
                   "KV events dropped at a full queue (max_queue_size): subscribers' view of "
                   "the cache is incomplete.", (double)s->kve_dropped);
        kvf_dh_kvf(out, "kvf_daemon_kv_events_replays_total", "counter",
                   "KV event replay requests answered.", (double)s->kve_replays);
    }
    if (prefill) {
        kvf_dh_kvf(out, "kvf_daemon_leases", "gauge", "Requests held for decode.",
                   (double)s->leases);
        kvf_dh_kvf(out, "kvf_daemon_queued_prompt_tokens", "gauge", "Prompt tokens admitted "
                   "and not yet computed.", (double)s->queued_prompt_tokens);
        kvf_dh_kvf(out, "kvf_daemon_prefill_tokens_total", "counter", "Prompt tokens "
                   "computed.", (double)s->prefill_tokens_total);
        kvf_dh_kvf(out, "kvf_daemon_prefill_seconds_total", "counter", "Engine time those "
                   "prompt tokens took.", s->prefill_seconds_total);
        kvf_dh_kvf(out, "kvf_daemon_releases_refused_total", "counter", "Lease claims or "
                   "releases refused.", (double)s->releases_refused);
        kvf_dh_kvf(out, "kvf_daemon_quarantined_blocks_total", "counter", "Blocks of "
                   "expired or aborted leases quarantined before reuse.",
                   (double)s->quarantined_blocks);
        kvf_dh_kvf(out, "kvf_daemon_auth_refusals_side_total", "counter", "Peers the side "
                   "channel's key check refused.", (double)s->auth_refusals_side);
    }
}

/* 200 or 503 and a JSON body saying why. */
static int kvf_dh_health(FILE *out, const kvf_daemon_snap_t *s)
{
    const char *why = NULL;
    uint64_t age = s->valid ? kvf_time_now_ms() - s->at_ms : 0;

    if (!s->valid) {
        why = "starting: the engine is not loaded yet";
    } else if (s->cannot_serve[0] != '\0') {
        why = s->cannot_serve;
    } else if (s->draining) {
        why = "draining: new requests are refused";
    } else if (age > KVF_DAEMON_HTTP_STALE_MS) {
        why = "stuck: the run loop has not published for longer than the bound";
    }
    fprintf(out, "{\"status\":\"%s\",\"role\":\"%s\",\"engine_id\":\"",
            (why == NULL) ? "ok" : "unavailable", kvf_dh.role);
    kvf_prom_label_write(out, kvf_dh.engine_id);
    fprintf(out, "\",\"loop_age_ms\":%" PRIu64, age);
    if (s->valid) {   /* vLLM's hit rate: cached tokens / queried tokens */
        fprintf(out, ",\"prefix_caching\":%s,\"prefix_cache_hit_rate\":%.6g,\"block_size\":%u",
                s->prefix_caching ? "true" : "false",
                (s->prefix_queries > 0) ? (double)s->prefix_hits / (double)s->prefix_queries :
                0.0, s->block_size);
    }
    if (why != NULL) {
        fputs(",\"reason\":\"", out);
        kvf_prom_label_write(out, why);
        fputc('"', out);
    }
    fputs("}\n", out);
    return (why == NULL) ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;
}

static enum MHD_Result kvf_dh_access(void *cls, struct MHD_Connection *conn, const char *url,
                                     const char *method, const char *version,
                                     const char *upload_data, size_t *upload_data_size,
                                     void **con_cls)
{
    kvf_daemon_snap_t s;
    struct MHD_Response *resp;
    const char *type = "application/json";
    char *buf = NULL;
    size_t len = 0;
    FILE *f;
    int code;
    enum MHD_Result ret;

    (void)cls;
    (void)version;
    (void)upload_data;
    if (*con_cls == NULL) {   /* first call: headers only */
        *con_cls = conn;
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        *upload_data_size = 0;   /* a body is not read */
        return MHD_YES;
    }
    pthread_mutex_lock(&kvf_dh.lock);
    s = kvf_dh.snap;
    pthread_mutex_unlock(&kvf_dh.lock);
    f = open_memstream(&buf, &len);
    if (f == NULL) {
        return MHD_NO;
    }
    if ((strcmp(method, "GET") != 0) && (strcmp(method, "HEAD") != 0)) {
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
        fprintf(f, "{\"error\":\"use GET for %s\"}\n",
                (strcmp(url, "/metrics") == 0) ? "/metrics" : "/health");
    } else if (strcmp(url, "/metrics") == 0) {
        code = MHD_HTTP_OK;
        type = "text/plain; version=0.0.4; charset=utf-8";
        kvf_dh_metrics(f, &s);
    } else if (strcmp(url, "/health") == 0) {
        code = kvf_dh_health(f, &s);
    } else {
        code = MHD_HTTP_NOT_FOUND;
        fputs("{\"error\":\"not found: this port serves GET /metrics and /health\"}\n", f);
    }
    fclose(f);
    resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(buf);
        return MHD_NO;
    }
    (void)MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    ret = MHD_queue_response(conn, (unsigned)code, resp);
    MHD_destroy_response(resp);
    return ret;
}

static void kvf_dh_log(void *cls, const char *fmt, va_list ap)
{
    char line[256];

    (void)cls;
    vsnprintf(line, sizeof(line), fmt, ap);
    kvf_debug("metrics http: %s", line);
}

kvf_status_t kvf_daemon_http_start(const kvf_daemon_http_params_t *p)
{
    uint64_t m = p->field_mask;
    int port = (m & KVF_DAEMON_HTTP_PARAM_FIELD_PORT) ? p->port : 0;

    if (m & ~KVF_DAEMON_HTTP_PARAM_FIELDS_KNOWN) {
        kvf_error("daemon http: unknown params field_mask bits 0x%" PRIx64,
                  (uint64_t)(m & ~KVF_DAEMON_HTTP_PARAM_FIELDS_KNOWN));
        return KVF_ERR_INVALID_PARAM;
    }
    if ((port < 0) || (port > 65535)) {
        kvf_error("--metrics-port %d must be in 0..65535 (0: no HTTP port)", port);
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_dh.mhd != NULL) {
        kvf_error("daemon http: already serving");
        return KVF_ERR_INVALID_PARAM;
    }
    if (port == 0) {
        return KVF_OK;
    }
    snprintf(kvf_dh.role, sizeof(kvf_dh.role), "%s",
             ((m & KVF_DAEMON_HTTP_PARAM_FIELD_ROLE) && p->role) ? p->role : "");
    snprintf(kvf_dh.engine_id, sizeof(kvf_dh.engine_id), "%s",
             ((m & KVF_DAEMON_HTTP_PARAM_FIELD_ENGINE_ID) && p->engine_id) ? p->engine_id : "");
    snprintf(kvf_dh.model_name, sizeof(kvf_dh.model_name), "%s",
             ((m & KVF_DAEMON_HTTP_PARAM_FIELD_MODEL_NAME) && p->model_name) ?
             p->model_name : "");
    memset(&kvf_dh.snap, 0, sizeof(kvf_dh.snap));
    atomic_store(&kvf_dh.last_ms, 0);
    kvf_dh.mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                                  MHD_USE_DUAL_STACK, (uint16_t)port, NULL, NULL,
                                  kvf_dh_access, NULL,
                                  MHD_OPTION_EXTERNAL_LOGGER, kvf_dh_log, NULL,
                                  MHD_OPTION_CONNECTION_LIMIT, 64u,
                                  MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                                  MHD_OPTION_END);
    if (kvf_dh.mhd == NULL) {
        /* dual stack needs IPv6: an IPv4-only host gets a plain IPv4 socket */
        kvf_dh.mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
                                      (uint16_t)port, NULL, NULL, kvf_dh_access, NULL,
                                      MHD_OPTION_EXTERNAL_LOGGER, kvf_dh_log, NULL,
                                      MHD_OPTION_CONNECTION_LIMIT, 64u,
                                      MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                                      MHD_OPTION_END);
    }
    if (kvf_dh.mhd == NULL) {
        kvf_error("--metrics-port %d: cannot serve HTTP there (port in use?)", port);
        return KVF_ERR_IO;
    }
    atomic_store(&kvf_dh.serving, true);
    kvf_info("serving GET /metrics and /health on HTTP port %d", port);
    return KVF_OK;
}

void kvf_daemon_http_stop(void)
{
    struct MHD_Daemon *mhd = kvf_dh.mhd;

    if (mhd == NULL) {
        return;
    }
    atomic_store(&kvf_dh.serving, false);
    kvf_dh.mhd = NULL;
    MHD_stop_daemon(mhd);
    pthread_mutex_lock(&kvf_dh.lock);
    memset(&kvf_dh.snap, 0, sizeof(kvf_dh.snap));
    pthread_mutex_unlock(&kvf_dh.lock);
}
