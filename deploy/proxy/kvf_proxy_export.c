/*
 * kvf-proxy: vLLM-equivalent series with a model_name label (see
 * kvf_proxy_export.h). Transfer counts live here, process-wide, under one
 * mutex; the per-instance gauges are read from the pool at each scrape.
 */
#include "kvf_prom.h"
#include "kvf_proxy_export.h"

#include <pthread.h>
#include <stdlib.h>

/* Bytes per transfer: 64 KiB .. 4 GiB, a factor of 4 apart. */
static const double kvf_export_bytes_bounds[] = {
    65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0, 268435456.0,
    1073741824.0, 4294967296.0,
};
#define KVF_EXPORT_NB ((int)(sizeof(kvf_export_bytes_bounds) / sizeof(kvf_export_bytes_bounds[0])))

static struct {
    pthread_mutex_t lock;
    uint64_t        buckets[KVF_EXPORT_NB + 1];   /* non-cumulative; [NB] = +Inf */
    uint64_t        count;
    double          sum;
    uint64_t        transfers;
    uint64_t        failed;
} kvf_export = {.lock = PTHREAD_MUTEX_INITIALIZER};

void kvf_proxy_export_transfer(uint64_t bytes, bool failed)
{
    int b = 0;

    while ((b < KVF_EXPORT_NB) && ((double)bytes > kvf_export_bytes_bounds[b])) {
        ++b;
    }
    pthread_mutex_lock(&kvf_export.lock);
    kvf_export.transfers++;
    if (failed) {
        kvf_export.failed++;
    } else {
        kvf_export.buckets[b]++;
        kvf_export.count++;
        kvf_export.sum += (double)bytes;
    }
    pthread_mutex_unlock(&kvf_export.lock);
}

/* The per-instance gauges of every healthy instance. */
static void kvf_export_instances(kvf_proxy_pool_h pool, const char *model_name, FILE *out)
{
    static const struct {
        const char *name;
        const char *help;
    } g[] = {
        {"kvf_num_requests_running", "Requests the instance is running (holding cache blocks); "
         "vllm:num_requests_running."},
        {"kvf_num_requests_waiting", "Requests admitted by the instance, not running yet; "
         "vllm:num_requests_waiting."},
        {"kvf_kv_cache_usage_perc", "Fraction of the instance's cache pages in use (0..1); "
         "vllm:kv_cache_usage_perc."},
    };
    kvf_proxy_instance_info_t info;
    kvf_prom_label_t l[4] = {{"model_name", NULL}, {"kvf_instance", NULL}, {"role", NULL},
                             {"engine_id", NULL}};

    for (size_t m = 0; m < sizeof(g) / sizeof(g[0]); ++m) {
        kvf_prom_head(out, g[m].name, "gauge", g[m].help);
        for (int role = 0; (pool != NULL) && (role < KVF_PROXY_ROLE_COUNT); ++role) {
            for (int i = 0; i < kvf_proxy_pool_count(pool, (kvf_proxy_role_t)role); ++i) {
                double v;

                kvf_proxy_pool_info(pool, (kvf_proxy_role_t)role, i, &info);
                if (!(info.healthy && info.connected)) {
                    continue;
                }
                if (m == 0) {
                    v = (double)info.running;
                } else if (m == 1) {
                    v = (double)info.queue_depth;
                } else if (info.total_pages > 0) {
                    v = 1.0 - ((double)info.free_pages / (double)info.total_pages);
                } else {
                    continue;
                }
                l[0].value = model_name;
                l[1].value = info.url;
                l[2].value = kvf_proxy_role_name((kvf_proxy_role_t)role);
                l[3].value = info.engine_id;
                kvf_prom_sample(out, g[m].name, l, 4, v);
            }
        }
    }
}

void kvf_proxy_export_render(kvf_proxy_pool_h pool, const char *model_name, FILE *out)
{
    uint64_t buckets[KVF_EXPORT_NB + 1], count, transfers, failed;
    double sum;
    kvf_prom_label_t lm = {"model_name", model_name};
    kvf_prom_hist_t h;

    pthread_mutex_lock(&kvf_export.lock);
    for (int b = 0; b <= KVF_EXPORT_NB; ++b) {
        buckets[b] = kvf_export.buckets[b];
    }
    count = kvf_export.count;
    sum = kvf_export.sum;
    transfers = kvf_export.transfers;
    failed = kvf_export.failed;
    pthread_mutex_unlock(&kvf_export.lock);
    h = (kvf_prom_hist_t){kvf_export_bytes_bounds, KVF_EXPORT_NB, buckets, sum, count, 0};

    kvf_export_instances(pool, model_name, out);
    kvf_prom_head(out, "kvf_kv_transfers_total", "counter", "KV transfers decode instances "
                  "reported (one per request that pulled its prompt's KV).");
    kvf_prom_sample_u64(out, "kvf_kv_transfers_total", &lm, 1, transfers);
    kvf_prom_head(out, "kvf_kv_failed_transfers_total", "counter", "KV transfers that failed "
                  "(decode recomputed the prompt); vllm:nixl_num_failed_transfers.");
    kvf_prom_sample_u64(out, "kvf_kv_failed_transfers_total", &lm, 1, failed);
    kvf_prom_head(out, "kvf_kv_transfer_bytes", "histogram", "Bytes per successful KV "
                  "transfer (KV blocks and Mamba state); vllm:nixl_bytes_transferred.");
    kvf_prom_histogram(out, "kvf_kv_transfer_bytes", &lm, 1, &h);
}
