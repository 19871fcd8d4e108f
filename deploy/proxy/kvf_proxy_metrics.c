/*
 * kvf-proxy metrics. Fixed tables of counters and histograms with fixed
 * bucket bounds, rendered on demand in Prometheus text format. Histograms
 * rather than summaries: they aggregate across several proxies and need no
 * sliding windows here. Per-instance gauges (free pages, health) live with
 * the instance pool, which renders them next to these.
 */
#include "kvf_proxy_metrics.h"
#include "kvf_prom.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#define KVF_PROXY_MAX_CODES 16
#define KVF_PROXY_MAX_BUCKETS 16

typedef struct {
    const char *name;
    const char *help;
} kvf_proxy_metric_desc_t;

/* NOTE: indexed by kvf_proxy_counter_t. */
static const kvf_proxy_metric_desc_t kvf_proxy_counter_desc[KVF_PROXY_CTR_COUNT] = {
    {"kvf_proxy_prompt_tokens", "Prompt tokens sent to prefill."},
    {"kvf_proxy_generation_tokens", "Completion tokens relayed to clients."},
    {"kvf_proxy_kv_transfer_bytes", "KV cache and Mamba state bytes decode instances pulled."},
    {"kvf_proxy_kv_transfer_descriptors", "Transfer descriptors decode instances posted."},
    {"kvf_proxy_kv_transfer_reads", "Prefill rank to decode rank reads."},
    {"kvf_proxy_kv_recomputed", "Requests whose KV load failed and whose prompt was recomputed."},
    {"kvf_proxy_handshake_refusals", "Requests that failed because a handshake was refused."},
    {"kvf_proxy_peer_errors", "Requests that failed because an instance or peer went away."},
    {"kvf_proxy_timeouts", "Requests that ran out of time waiting for an instance."},
    {"kvf_proxy_client_aborts", "Requests whose client disconnected before the end."},
    {"kvf_proxy_decode_reroutes", "Requests sent to another decode instance because the one"
     " picked died or began draining while they were in prefill."},
};

typedef struct {
    const char   *name;
    const char   *help;
    const double *bounds;
    int           num_bounds;
} kvf_proxy_hist_desc_t;

static const double kvf_proxy_latency_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double kvf_proxy_fast_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                               0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5};

#define KVF_NB(_a) ((int)(sizeof(_a) / sizeof((_a)[0])))

/* NOTE: indexed by kvf_proxy_hist_t. */
static const kvf_proxy_hist_desc_t kvf_proxy_hist_desc[KVF_PROXY_HIST_COUNT] = {
    {"kvf_proxy_time_to_first_token_seconds", "Request received to first token ready.",
     kvf_proxy_latency_bounds, KVF_NB(kvf_proxy_latency_bounds)},
    {"kvf_proxy_inter_token_latency_seconds", "Gap between consecutive completion tokens.",
     kvf_proxy_fast_bounds, KVF_NB(kvf_proxy_fast_bounds)},
    {"kvf_proxy_request_duration_seconds", "Request received to last token.",
     kvf_proxy_latency_bounds, KVF_NB(kvf_proxy_latency_bounds)},
    {"kvf_proxy_prefill_seconds", "Prefill compute time reported by prefill instances.",
     kvf_proxy_latency_bounds, KVF_NB(kvf_proxy_latency_bounds)},
    {"kvf_proxy_kv_transfer_seconds", "KV transfer time reported by decode instances.",
     kvf_proxy_fast_bounds, KVF_NB(kvf_proxy_fast_bounds)},
    {"kvf_proxy_kv_handshake_seconds", "Handshake time when decode had no cached metadata.",
     kvf_proxy_fast_bounds, KVF_NB(kvf_proxy_fast_bounds)},
    {"kvf_proxy_time_to_first_decode_token_seconds",
     "Request received to the first reply from decode (the first token decoded after the KV "
     "pull).", kvf_proxy_latency_bounds, KVF_NB(kvf_proxy_latency_bounds)},
};

/* NOTE: indexed by kvf_proxy_ttft_phase_t. */
static const char *const kvf_proxy_ttft_phase_names[KVF_PROXY_TTFT_PHASE_COUNT] = {
    "proxy_queue", "prefill_queue", "prefill_compute", "prefill_relay", "proxy_dispatch",
    "decode_queue", "block_alloc", "handshake", "descriptor_posting", "wire", "post_ops",
    "first_decode_step", "decode_relay", "unaccounted",
};

/* NOTE: indexed by kvf_proxy_reject_t. */
static const char *const kvf_proxy_reject_names[KVF_PROXY_REJECT_COUNT] = {
    "predicted_wait", "queue_full", "no_instance", "instance_busy", "connections", "shutdown",
};

const char *kvf_proxy_reject_name(kvf_proxy_reject_t reason)
{
    return ((unsigned)reason < KVF_PROXY_REJECT_COUNT) ? kvf_proxy_reject_names[reason] : "?";
}

const char *kvf_proxy_ttft_phase_name(kvf_proxy_ttft_phase_t phase)
{
    return ((unsigned)phase < KVF_PROXY_TTFT_PHASE_COUNT) ? kvf_proxy_ttft_phase_names[phase] : "?";
}

typedef struct {
    uint64_t buckets[KVF_PROXY_MAX_BUCKETS]; /* non-cumulative; [num_bounds] = +Inf */
    uint64_t count;
    double   sum;
} kvf_proxy_hist_data_t;

struct kvf_proxy_metrics {
    pthread_mutex_t       lock;
    int                   codes[KVF_PROXY_MAX_CODES];
    uint64_t              code_counts[KVF_PROXY_MAX_CODES];
    int                   num_codes;
    uint64_t              counters[KVF_PROXY_CTR_COUNT];
    kvf_proxy_hist_data_t hists[KVF_PROXY_HIST_COUNT];
    kvf_proxy_hist_data_t phases[KVF_PROXY_TTFT_PHASE_COUNT];
    int64_t               in_flight;
    uint64_t              rejected[KVF_PROXY_REJECT_COUNT];
};

kvf_status_t kvf_proxy_metrics_create(kvf_proxy_metrics_h *metrics_p)
{
    struct kvf_proxy_metrics *m = calloc(1, sizeof(*m));

    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&m->lock, NULL);
    *metrics_p = m;
    return KVF_OK;
}

void kvf_proxy_metrics_destroy(kvf_proxy_metrics_h metrics)
{
    if (metrics == NULL) {
        return;
    }
    pthread_mutex_destroy(&metrics->lock);
    free(metrics);
}

void kvf_proxy_metrics_request(kvf_proxy_metrics_h metrics, int code)
{
    int i;

    pthread_mutex_lock(&metrics->lock);
    for (i = 0; i < metrics->num_codes; ++i) {
        if (metrics->codes[i] == code) {
            break;
        }
    }
    if ((i == metrics->num_codes) && (i < KVF_PROXY_MAX_CODES)) {
        metrics->codes[i] = code;
        metrics->num_codes++;
    }
    if (i < KVF_PROXY_MAX_CODES) {
        metrics->code_counts[i]++;
    }
    pthread_mutex_unlock(&metrics->lock);
}

void kvf_proxy_metrics_add(kvf_proxy_metrics_h metrics, kvf_proxy_counter_t ctr, uint64_t n)
{
    pthread_mutex_lock(&metrics->lock);
    metrics->counters[ctr] += n;
    pthread_mutex_unlock(&metrics->lock);
}

static void kvf_proxy_hist_add(kvf_proxy_metrics_h metrics, const kvf_proxy_hist_desc_t *d,
                               kvf_proxy_hist_data_t *h, double seconds, uint64_t count);

void kvf_proxy_metrics_observe(kvf_proxy_metrics_h metrics, kvf_proxy_hist_t hist,
                               double seconds, uint64_t count)
{
    kvf_proxy_hist_add(metrics, &kvf_proxy_hist_desc[hist], &metrics->hists[hist], seconds,
                       count);
}

static const kvf_proxy_hist_desc_t kvf_proxy_ttft_phase_desc = {
    "kvf_proxy_ttft_phase_seconds",
    "Time to the first decoded token by phase (max over TP ranks); the phases add up to "
    "kvf_proxy_time_to_first_decode_token_seconds.",
    kvf_proxy_fast_bounds, KVF_NB(kvf_proxy_fast_bounds)};

void kvf_proxy_metrics_observe_phase(kvf_proxy_metrics_h metrics, kvf_proxy_ttft_phase_t phase,
                                     double seconds)
{
    if ((unsigned)phase < KVF_PROXY_TTFT_PHASE_COUNT) {
        kvf_proxy_hist_add(metrics, &kvf_proxy_ttft_phase_desc, &metrics->phases[phase], seconds, 1);
    }
}

static void kvf_proxy_hist_add(kvf_proxy_metrics_h metrics, const kvf_proxy_hist_desc_t *d,
                               kvf_proxy_hist_data_t *h, double seconds, uint64_t count)
{
    int b;

    if (count == 0) {
        return;
    }
    if (seconds < 0) {
        seconds = 0;
    }
    for (b = 0; b < d->num_bounds; ++b) {
        if (seconds <= d->bounds[b]) {
            break;
        }
    }
    pthread_mutex_lock(&metrics->lock);
    h->buckets[b] += count;
    h->count += count;
    h->sum += seconds * (double)count;
    pthread_mutex_unlock(&metrics->lock);
}

void kvf_proxy_metrics_in_flight(kvf_proxy_metrics_h metrics, int delta)
{
    pthread_mutex_lock(&metrics->lock);
    metrics->in_flight += delta;
    pthread_mutex_unlock(&metrics->lock);
}

void kvf_proxy_metrics_reject(kvf_proxy_metrics_h metrics, kvf_proxy_reject_t reason)
{
    if ((unsigned)reason < KVF_PROXY_REJECT_COUNT) {
        pthread_mutex_lock(&metrics->lock);
        metrics->rejected[reason]++;
        pthread_mutex_unlock(&metrics->lock);
    }
}

uint64_t kvf_proxy_metrics_rejected(kvf_proxy_metrics_h metrics, kvf_proxy_reject_t reason)
{
    uint64_t n = 0;

    if ((unsigned)reason < KVF_PROXY_REJECT_COUNT) {
        pthread_mutex_lock(&metrics->lock);
        n = metrics->rejected[reason];
        pthread_mutex_unlock(&metrics->lock);
    }
    return n;
}

/* One histogram series of @a d's family from @a h (the family's head written before). */
static void kvf_proxy_hist_render(FILE *out, const kvf_proxy_hist_desc_t *d,
                                  const kvf_proxy_hist_data_t *h, const kvf_prom_label_t *labels,
                                  int nlabels)
{
    kvf_prom_hist_t ph = {d->bounds, d->num_bounds, h->buckets, h->sum, h->count, 0};

    kvf_prom_histogram(out, d->name, labels, nlabels, &ph);
}

void kvf_proxy_metrics_render(kvf_proxy_metrics_h metrics, FILE *out)
{
    struct kvf_proxy_metrics snap;
    char name[128];

    /* Copy under the lock, format without it. */
    pthread_mutex_lock(&metrics->lock);
    snap = *metrics;
    pthread_mutex_unlock(&metrics->lock);

    kvf_prom_head(out, "kvf_proxy_requests_total", "counter",
                  "Completion requests by HTTP status code.");
    for (int i = 0; i < snap.num_codes; ++i) {
        char code[16];
        kvf_prom_label_t l = {"code", code};
        snprintf(code, sizeof(code), "%d", snap.codes[i]);
        kvf_prom_sample_u64(out, "kvf_proxy_requests_total", &l, 1, snap.code_counts[i]);
    }
    kvf_prom_head(out, "kvf_proxy_requests_in_flight", "gauge",
                  "Completion requests being served.");
    kvf_prom_sample(out, "kvf_proxy_requests_in_flight", NULL, 0, (double)snap.in_flight);
    kvf_prom_head(out, "kvf_proxy_rejected_total", "counter",
                  "Requests refused with a 503 before being served, by reason.");
    for (int r = 0; r < KVF_PROXY_REJECT_COUNT; ++r) {
        kvf_prom_label_t l = {"reason", kvf_proxy_reject_names[r]};
        kvf_prom_sample_u64(out, "kvf_proxy_rejected_total", &l, 1, snap.rejected[r]);
    }
    for (int c = 0; c < KVF_PROXY_CTR_COUNT; ++c) {
        const kvf_proxy_metric_desc_t *d = &kvf_proxy_counter_desc[c];
        snprintf(name, sizeof(name), "%s_total", d->name);
        kvf_prom_head(out, name, "counter", d->help);
        kvf_prom_sample_u64(out, name, NULL, 0, snap.counters[c]);
    }
    for (int hi = 0; hi < KVF_PROXY_HIST_COUNT; ++hi) {
        const kvf_proxy_hist_desc_t *d = &kvf_proxy_hist_desc[hi];
        kvf_prom_head(out, d->name, "histogram", d->help);
        kvf_proxy_hist_render(out, d, &snap.hists[hi], NULL, 0);
    }
    kvf_prom_head(out, kvf_proxy_ttft_phase_desc.name, "histogram",
                  kvf_proxy_ttft_phase_desc.help);
    for (int ph = 0; ph < KVF_PROXY_TTFT_PHASE_COUNT; ++ph) {
        kvf_prom_label_t l = {"phase", kvf_proxy_ttft_phase_names[ph]};
        kvf_proxy_hist_render(out, &kvf_proxy_ttft_phase_desc, &snap.phases[ph], &l, 1);
    }
}
