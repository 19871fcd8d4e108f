/*
 * kvf-proxy: vLLM's series (see kvf_proxy_vllm.h). Process-wide counts under
 * one mutex, like kvf_proxy_export.c; per-instance gauges are read from the
 * pool at each scrape; the router's host gauges from /proc at each scrape.
 *
 * Design: fixed bucket tables, the boundaries vLLM declares (a histogram
 * whose buckets differ cannot be summed with vLLM's in one query). The
 * token-count histograms keep 1-2-5 buckets up to 10^7 and render those up to
 * max_model_len, as vLLM's build_1_2_5_buckets(max_model_len) does; the counts
 * above fold into +Inf, so the cumulative counts stay exact.
 * Rejected: one label set per decode engine for the request series (the
 * engine index vLLM uses): a pool-wide series answers the same dashboards and
 * keeps the scrape's size independent of the pool's.
 */
#include "kvf_prom.h"
#include "kvf_proxy_vllm.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

#define KVF_VLLM_MAX_BOUNDS 24

typedef struct {
    const char   *name;
    const char   *help;
    const double *bounds;
    int           num_bounds;
    bool          token_counts;   /* 1-2-5 bounds cut at max_model_len */
} kvf_vllm_hist_desc_t;

typedef struct {
    uint64_t buckets[KVF_VLLM_MAX_BOUNDS + 1];   /* non-cumulative; [num_bounds] = +Inf */
    uint64_t count;
    double   sum;
} kvf_vllm_hist_t;

/* vLLM's boundaries (vllm/v1/metrics/loggers.py and the NIXL connector's metrics). */
static const double kvf_vllm_ttft_b[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                         0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                                         160.0, 640.0, 2560.0};
static const double kvf_vllm_tpot_b[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                         0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double kvf_vllm_req_b[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                        30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
                                        1920.0, 7680.0};
static const double kvf_vllm_tok_b[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4,
                                        2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7};
static const double kvf_vllm_n_b[] = {1, 2, 5, 10, 20};
static const double kvf_vllm_post_b[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3,
                                         0.5, 0.75, 1.0, 5.0};
static const double kvf_vllm_bytes_b[] = {2048.0, 8192.0, 32768.0, 131072.0, 524288.0,
                                          2097152.0, 8388608.0, 33554432.0, 134217728.0,
                                          536870912.0, 2147483648.0, 8589934592.0};
static const double kvf_vllm_desc_b[] = {10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000,
                                         10000, 20000, 50000};

#define KVF_NB(_a) ((int)(sizeof(_a) / sizeof((_a)[0])))

enum {
    KVF_VLLM_H_TTFT = 0,
    KVF_VLLM_H_ITL,
    KVF_VLLM_H_TPOT,
    KVF_VLLM_H_REQ_TPOT,
    KVF_VLLM_H_E2E,
    KVF_VLLM_H_QUEUE,
    KVF_VLLM_H_INFERENCE,
    KVF_VLLM_H_PREFILL,
    KVF_VLLM_H_DECODE,
    KVF_VLLM_H_PROMPT_TOKENS,
    KVF_VLLM_H_GEN_TOKENS,
    KVF_VLLM_H_MAX_GEN_TOKENS,
    KVF_VLLM_H_MAX_TOKENS,
    KVF_VLLM_H_N,
    KVF_VLLM_H_XFER_TIME,
    KVF_VLLM_H_POST_TIME,
    KVF_VLLM_H_BYTES,
    KVF_VLLM_H_DESCRIPTORS,
    KVF_VLLM_H_COUNT
};

/* NOTE: indexed by the enum above. */
static const kvf_vllm_hist_desc_t kvf_vllm_hist_desc[KVF_VLLM_H_COUNT] = {
    {"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     kvf_vllm_ttft_b, KVF_NB(kvf_vllm_ttft_b), false},
    {"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     kvf_vllm_tpot_b, KVF_NB(kvf_vllm_tpot_b), false},
    {"vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds "
     "(the older name of vllm:inter_token_latency_seconds).",
     kvf_vllm_tpot_b, KVF_NB(kvf_vllm_tpot_b), false},
    {"vllm:request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request.",
     kvf_vllm_tpot_b, KVF_NB(kvf_vllm_tpot_b), false},
    {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
     kvf_vllm_req_b, KVF_NB(kvf_vllm_req_b), false},
    {"vllm:request_queue_time_seconds",
     "Histogram of time spent waiting (proxy, prefill and decode queues) per request.",
     kvf_vllm_req_b, KVF_NB(kvf_vllm_req_b), false},
    {"vllm:request_inference_time_seconds",
     "Histogram of time spent running (prefill + decode) per request.",
     kvf_vllm_req_b, KVF_NB(kvf_vllm_req_b), false},
    {"vllm:request_prefill_time_seconds",
     "Histogram of prefill compute time per request, as the prefill instance reported it.",
     kvf_vllm_req_b, KVF_NB(kvf_vllm_req_b), false},
    {"vllm:request_decode_time_seconds",
     "Histogram of time from the first to the last token per request.",
     kvf_vllm_req_b, KVF_NB(kvf_vllm_req_b), false},
    {"vllm:request_prompt_tokens", "Number of prefill tokens processed.",
     kvf_vllm_tok_b, KVF_NB(kvf_vllm_tok_b), true},
    {"vllm:request_generation_tokens", "Number of generation tokens processed.",
     kvf_vllm_tok_b, KVF_NB(kvf_vllm_tok_b), true},
    {"vllm:request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens.",
     kvf_vllm_tok_b, KVF_NB(kvf_vllm_tok_b), true},
    {"vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
     kvf_vllm_tok_b, KVF_NB(kvf_vllm_tok_b), true},
    {"vllm:request_params_n", "Histogram of the n request parameter.",
     kvf_vllm_n_b, KVF_NB(kvf_vllm_n_b), false},
    {"vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for KV cache transfers "
     "(UCX; one per request decode pulled).", kvf_vllm_post_b + 1, KVF_NB(kvf_vllm_post_b) - 1,
     false},
    {"vllm:nixl_post_time_seconds", "Histogram of transfer post time for KV cache transfers.",
     kvf_vllm_post_b, KVF_NB(kvf_vllm_post_b), false},
    {"vllm:nixl_bytes_transferred", "Histogram of bytes transferred per KV cache transfer.",
     kvf_vllm_bytes_b, KVF_NB(kvf_vllm_bytes_b), false},
    {"vllm:nixl_num_descriptors", "Histogram of number of descriptors per KV cache transfer.",
     kvf_vllm_desc_b, KVF_NB(kvf_vllm_desc_b), false},
};

/* vLLM's FinishReason values as strings. */
static const char *const kvf_vllm_reasons[] = {"stop", "length", "abort"};
#define KVF_VLLM_NREASONS 3

/* current_qps: finished requests per second over the last KVF_VLLM_QPS_WINDOW seconds. */
#define KVF_VLLM_QPS_WINDOW 10

static struct {
    pthread_mutex_t lock;
    kvf_vllm_hist_t hists[KVF_VLLM_H_COUNT];
    uint64_t        prompt_tokens;
    uint64_t        cached_tokens;
    uint64_t        generation_tokens;
    uint64_t        success[KVF_VLLM_NREASONS];
    uint64_t        failed_transfers;
    int64_t         waiting;
    uint64_t        qps_count[KVF_VLLM_QPS_WINDOW];
    int64_t         qps_second[KVF_VLLM_QPS_WINDOW];
    uint64_t        cpu_busy, cpu_total;     /* /proc/stat at the last scrape */
} kvf_vllm = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int64_t kvf_vllm_now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec;
}

/* Call with the lock held. */
static void kvf_vllm_observe(int h, double v, uint64_t count)
{
    const kvf_vllm_hist_desc_t *d = &kvf_vllm_hist_desc[h];
    kvf_vllm_hist_t *hist = &kvf_vllm.hists[h];
    int b = 0;

    if (v < 0) {
        v = 0;
    }
    while ((b < d->num_bounds) && (v > d->bounds[b])) {
        ++b;
    }
    hist->buckets[b] += count;
    hist->count += count;
    hist->sum += v * (double)count;
}

void kvf_proxy_vllm_token_gap(double seconds, uint64_t count)
{
    if (count == 0) {
        return;
    }
    pthread_mutex_lock(&kvf_vllm.lock);
    kvf_vllm_observe(KVF_VLLM_H_ITL, seconds, count);
    kvf_vllm_observe(KVF_VLLM_H_TPOT, seconds, count);
    pthread_mutex_unlock(&kvf_vllm.lock);
}

void kvf_proxy_vllm_waiting(int delta)
{
    pthread_mutex_lock(&kvf_vllm.lock);
    kvf_vllm.waiting += delta;
    pthread_mutex_unlock(&kvf_vllm.lock);
}

void kvf_proxy_vllm_request(const kvf_proxy_vllm_req_t *r)
{
    int reason = 2;   /* abort */
    int64_t now = kvf_vllm_now_s();
    int slot = (int)(now % KVF_VLLM_QPS_WINDOW);

    for (int i = 0; i < KVF_VLLM_NREASONS; ++i) {
        if ((r->finished_reason != NULL) &&
            (strcmp(r->finished_reason, kvf_vllm_reasons[i]) == 0)) {
            reason = i;
        }
    }
    pthread_mutex_lock(&kvf_vllm.lock);
    if (kvf_vllm.qps_second[slot] != now) {
        kvf_vllm.qps_second[slot] = now;
        kvf_vllm.qps_count[slot] = 0;
    }
    kvf_vllm.qps_count[slot]++;
    if (!r->admitted) {
        pthread_mutex_unlock(&kvf_vllm.lock);
        return;
    }
    kvf_vllm.success[reason]++;
    kvf_vllm.prompt_tokens += r->prompt_tokens;
    kvf_vllm.cached_tokens += r->cached_tokens;
    kvf_vllm.generation_tokens += r->generation_tokens;
    kvf_vllm_observe(KVF_VLLM_H_E2E, r->e2e_s, 1);
    kvf_vllm_observe(KVF_VLLM_H_PROMPT_TOKENS, (double)r->prompt_tokens, 1);
    kvf_vllm_observe(KVF_VLLM_H_GEN_TOKENS, (double)r->generation_tokens, 1);
    kvf_vllm_observe(KVF_VLLM_H_MAX_GEN_TOKENS, (double)r->max_tokens, 1);
    kvf_vllm_observe(KVF_VLLM_H_MAX_TOKENS, (double)r->max_tokens, 1);
    kvf_vllm_observe(KVF_VLLM_H_N, 1.0, 1);
    if (r->queue_s >= 0) {
        kvf_vllm_observe(KVF_VLLM_H_QUEUE, r->queue_s, 1);
    }
    if (r->first_token) {
        double decode_s = r->e2e_s - r->ttft_s;
        double prefill_s = (r->prefill_s >= 0) ? r->prefill_s : 0.0;

        kvf_vllm_observe(KVF_VLLM_H_TTFT, r->ttft_s, 1);
        kvf_vllm_observe(KVF_VLLM_H_DECODE, decode_s, 1);
        kvf_vllm_observe(KVF_VLLM_H_PREFILL, prefill_s, 1);
        kvf_vllm_observe(KVF_VLLM_H_INFERENCE, prefill_s + decode_s, 1);
        if (r->generation_tokens > 1) {
            kvf_vllm_observe(KVF_VLLM_H_REQ_TPOT, decode_s / (double)(r->generation_tokens - 1),
                             1);
        }
    }
    if (r->transfer) {
        if (r->transfer_failed) {
            kvf_vllm.failed_transfers++;
        } else {
            kvf_vllm_observe(KVF_VLLM_H_XFER_TIME, r->transfer_s, 1);
            kvf_vllm_observe(KVF_VLLM_H_BYTES, (double)r->transfer_bytes, 1);
            kvf_vllm_observe(KVF_VLLM_H_DESCRIPTORS, (double)r->transfer_descriptors, 1);
            if (r->post_s >= 0) {
                kvf_vllm_observe(KVF_VLLM_H_POST_TIME, r->post_s, 1);
            }
        }
    }
    pthread_mutex_unlock(&kvf_vllm.lock);
}

/* {model_name, engine}: the first two labels of every vllm: series. */
#define KVF_VLLM_LABELS(_model, _engine) {"model_name", (_model)}, {"engine", (_engine)}

static void kvf_vllm_render_hist(FILE *out, int h, const kvf_vllm_hist_t *hist,
                                 const char *model, int max_model_len)
{
    const kvf_vllm_hist_desc_t *d = &kvf_vllm_hist_desc[h];
    kvf_prom_label_t l[] = {KVF_VLLM_LABELS(model, "pool")};
    kvf_prom_hist_t ph = {d->bounds, d->num_bounds, hist->buckets, hist->sum, hist->count,
                          /* vLLM's token buckets stop at max_model_len: the rest in +Inf */
                          (d->token_counts && (max_model_len > 0)) ? max_model_len : 0};

    kvf_prom_head(out, d->name, "histogram", d->help);
    kvf_prom_histogram(out, d->name, l, 2, &ph);
}

static void kvf_vllm_counter(FILE *out, const char *name, const char *help, const char *model,
                             uint64_t v)
{
    kvf_prom_label_t l[] = {KVF_VLLM_LABELS(model, "pool")};

    kvf_prom_head(out, name, "counter", help);
    kvf_prom_sample_u64(out, name, l, 2, v);
}

/* The per-instance gauges: vLLM's scheduler and cache gauges, one series per engine. */
static void kvf_vllm_instances(kvf_proxy_pool_h pool, const char *model, int64_t waiting,
                               FILE *out)
{
    static const struct {
        const char *name;
        const char *help;
    } g[] = {
        {"vllm:num_requests_running", "Number of requests in model execution batches."},
        {"vllm:num_requests_waiting", "Number of requests waiting to be processed."},
        {"vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."},
        {"vllm:gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage "
         "(the older name of vllm:kv_cache_usage_perc)."},
        {"vllm:num_requests_swapped", "Number of requests swapped to CPU (kvferry never "
         "swaps: 0)."},
    };
    kvf_proxy_instance_info_t info;

    for (size_t m = 0; m < sizeof(g) / sizeof(g[0]); ++m) {
        kvf_prom_head(out, g[m].name, "gauge", g[m].help);
        if (m == 1) {   /* requests waiting in the proxy's admission queue */
            kvf_prom_label_t l[] = {KVF_VLLM_LABELS(model, "proxy")};
            kvf_prom_sample(out, g[m].name, l, 2, (double)((waiting > 0) ? waiting : 0));
        }
        for (int role = 0; (pool != NULL) && (role < KVF_PROXY_ROLE_COUNT); ++role) {
            for (int i = 0; i < kvf_proxy_pool_count(pool, (kvf_proxy_role_t)role); ++i) {
                double v = 0;

                kvf_proxy_pool_info(pool, (kvf_proxy_role_t)role, i, &info);
                if (!(info.healthy && info.connected)) {
                    continue;   /* a stale value would mislead */
                }
                if (m == 0) {
                    v = (double)info.running;
                } else if (m == 1) {
                    v = (double)info.queue_depth;
                } else if ((m == 2) || (m == 3)) {
                    if (info.total_pages == 0) {
                        continue;
                    }
                    v = 1.0 - ((double)info.free_pages / (double)info.total_pages);
                }
                {
                    kvf_prom_label_t l[] = {KVF_VLLM_LABELS(model, info.engine_id),
                                            {"kvf_instance", info.url},
                                            {"role", kvf_proxy_role_name((kvf_proxy_role_t)role)}};
                    kvf_prom_sample(out, g[m].name, l, 4, v);
                }
            }
        }
    }
    /* production-stack's router: one series per serving engine, 1 while healthy */
    kvf_prom_head(out, "vllm:healthy_pods_total", "gauge",
                  "Instances of the pool, 1 while healthy (the router's series).");
    for (int role = 0; (pool != NULL) && (role < KVF_PROXY_ROLE_COUNT); ++role) {
        for (int i = 0; i < kvf_proxy_pool_count(pool, (kvf_proxy_role_t)role); ++i) {
            kvf_prom_label_t l[2] = {{"server", NULL}, {"role", NULL}};

            kvf_proxy_pool_info(pool, (kvf_proxy_role_t)role, i, &info);
            l[0].value = info.url;
            l[1].value = kvf_proxy_role_name((kvf_proxy_role_t)role);
            kvf_prom_sample(out, "vllm:healthy_pods_total", l, 2,
                            (info.healthy && info.connected) ? 1 : 0);
        }
    }
}

/* A fraction as a percentage with 3 decimals (as the router prints them). */
static double kvf_vllm_pct(double fraction)
{
    return round(fraction * 100000.0) / 1000.0;
}

/* Host usage as production-stack's router reports it: CPU (since the last scrape), memory,
 * the root file system's disk, in percent. A file that cannot be read gives no sample. */
static void kvf_vllm_host(FILE *out)
{
    unsigned long long f[10] = {0};
    unsigned long long mem_total = 0, mem_avail = 0, v;
    char line[256], key[64];
    struct statvfs vfs;
    FILE *fp = fopen("/proc/stat", "r");

    if ((fp != NULL) && (fscanf(fp, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu",
                                &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8],
                                &f[9]) >= 4)) {
        uint64_t total = 0, idle = f[3] + f[4], busy, dt, db;

        for (int i = 0; i < 8; ++i) {   /* guest time is already in user */
            total += f[i];
        }
        busy = total - idle;
        pthread_mutex_lock(&kvf_vllm.lock);
        dt = total - kvf_vllm.cpu_total;
        db = busy - kvf_vllm.cpu_busy;
        kvf_vllm.cpu_total = total;
        kvf_vllm.cpu_busy = busy;
        pthread_mutex_unlock(&kvf_vllm.lock);
        kvf_prom_head(out, "router_cpu_usage_percent", "gauge",
                      "Host CPU in use since the previous scrape, percent.");
        kvf_prom_sample(out, "router_cpu_usage_percent", NULL, 0,
                        kvf_vllm_pct((dt > 0) ? (double)db / (double)dt : 0.0));
    }
    if (fp != NULL) {
        fclose(fp);
    }
    fp = fopen("/proc/meminfo", "r");
    while ((fp != NULL) && (fgets(line, sizeof(line), fp) != NULL)) {
        if (sscanf(line, "%63[^:]: %llu", key, &v) == 2) {
            if (strcmp(key, "MemTotal") == 0) {
                mem_total = v;
            } else if (strcmp(key, "MemAvailable") == 0) {
                mem_avail = v;
            }
        }
    }
    if (fp != NULL) {
        fclose(fp);
    }
    if ((mem_total > 0) && (mem_avail <= mem_total)) {
        kvf_prom_head(out, "router_memory_usage_percent", "gauge",
                      "Host memory in use (total less available), percent.");
        kvf_prom_sample(out, "router_memory_usage_percent", NULL, 0,
                        kvf_vllm_pct((double)(mem_total - mem_avail) / (double)mem_total));
    }
    if ((statvfs("/", &vfs) == 0) && (vfs.f_blocks > 0)) {
        kvf_prom_head(out, "router_disk_usage_percent", "gauge",
                      "Root file system in use, percent.");
        kvf_prom_sample(out, "router_disk_usage_percent", NULL, 0,
                        kvf_vllm_pct((double)(vfs.f_blocks - vfs.f_bfree) /
                                     (double)vfs.f_blocks));
    }
}

void kvf_proxy_vllm_render(kvf_proxy_pool_h pool, const char *model_name, int max_model_len,
                           FILE *out)
{
    kvf_vllm_hist_t hists[KVF_VLLM_H_COUNT];
    uint64_t success[KVF_VLLM_NREASONS], prompt, cached, gen, failed, recent = 0;
    int64_t waiting, now = kvf_vllm_now_s();
    const kvf_prom_label_t server = {"server", "pool"};

    pthread_mutex_lock(&kvf_vllm.lock);
    memcpy(hists, kvf_vllm.hists, sizeof(hists));
    memcpy(success, kvf_vllm.success, sizeof(success));
    prompt = kvf_vllm.prompt_tokens;
    cached = kvf_vllm.cached_tokens;
    gen = kvf_vllm.generation_tokens;
    failed = kvf_vllm.failed_transfers;
    waiting = kvf_vllm.waiting;
    for (int s = 0; s < KVF_VLLM_QPS_WINDOW; ++s) {
        if ((kvf_vllm.qps_second[s] > now - KVF_VLLM_QPS_WINDOW) &&
            (kvf_vllm.qps_second[s] <= now)) {
            recent += kvf_vllm.qps_count[s];
        }
    }
    pthread_mutex_unlock(&kvf_vllm.lock);

    kvf_vllm_instances(pool, model_name, waiting, out);
    kvf_prom_head(out, "vllm:current_qps", "gauge",
                  "Requests finished per second over the last 10 s (the router's series).");
    kvf_prom_sample(out, "vllm:current_qps", &server, 1,
                    (double)recent / (double)KVF_VLLM_QPS_WINDOW);
    kvf_vllm_counter(out, "vllm:prompt_tokens_total", "Number of prefill tokens processed.",
                     model_name, prompt);
    kvf_vllm_counter(out, "vllm:generation_tokens_total",
                     "Number of generation tokens processed.", model_name, gen);
    kvf_vllm_counter(out, "vllm:prefix_cache_queries_total", "Prefix cache queries, in terms "
                     "of number of queried tokens.", model_name, prompt);
    kvf_vllm_counter(out, "vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of "
                     "number of cached tokens.", model_name, cached);
    kvf_vllm_counter(out, "vllm:gpu_prefix_cache_queries_total", "GPU prefix cache queries "
                     "(the older name of vllm:prefix_cache_queries).", model_name, prompt);
    kvf_vllm_counter(out, "vllm:gpu_prefix_cache_hits_total", "GPU prefix cache hits (the "
                     "older name of vllm:prefix_cache_hits).", model_name, cached);
    kvf_vllm_counter(out, "vllm:nixl_num_failed_transfers_total",
                     "Number of failed KV cache transfers (decode recomputed the prompt).",
                     model_name, failed);
    kvf_prom_head(out, "vllm:request_success_total", "counter",
                  "Count of successfully processed requests.");
    for (int i = 0; i < KVF_VLLM_NREASONS; ++i) {
        kvf_prom_label_t l[] = {KVF_VLLM_LABELS(model_name, "pool"),
                                {"finished_reason", kvf_vllm_reasons[i]}};
        kvf_prom_sample_u64(out, "vllm:request_success_total", l, 3, success[i]);
    }
    for (int h = 0; h < KVF_VLLM_H_COUNT; ++h) {
        kvf_vllm_render_hist(out, h, &hists[h], model_name, max_model_len);
    }
    kvf_vllm_host(out);
}
