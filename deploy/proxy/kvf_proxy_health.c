/*
 * kvf-proxy pool state as JSON (/health) and Prometheus gauges (/metrics),
 * from snapshots of each instance (kvf_proxy_pool_info) and the pair table.
 */
#include "kvf_prom.h"
#include "kvf_proxy_pool_int.h"
#include "kvf_log.h"
#include "kvf_proxy_route.h"

#include <stdlib.h>

/* One instance's entry of /health from its snapshot @info. */
static void kvf_proxy_instance_json(cJSON *o, int role, const kvf_proxy_instance_info_t *info)
{
    cJSON_AddStringToObject(o, "url", info->url);
    /* what a name resolved to (kvf_proxy_resolve.c); null until it does */
    if (info->address[0] != '\0') {
        cJSON_AddStringToObject(o, "address", info->address);
    } else {
        cJSON_AddNullToObject(o, "address");
    }
    if (info->resolve_error[0] != '\0') {
        cJSON_AddStringToObject(o, "resolve_error", info->resolve_error);
    }
    cJSON_AddBoolToObject(o, "healthy", info->healthy);
    cJSON_AddBoolToObject(o, "connected", info->connected);
    cJSON_AddBoolToObject(o, "draining", info->draining);
    cJSON_AddStringToObject(o, "engine_id", info->engine_id);
    cJSON_AddNumberToObject(o, "tp_size", info->tp_size);
    if (info->device[0] != '\0') {   /* --device: "cpu", "cuda:0", "cuda:2,cuda:3" */
        cJSON_AddStringToObject(o, "device", info->device);
    }
    /* The live gauges are only current while the instance answers:
     * after a crash or disconnect the last values would read as
     * current (a "free == total" leak check would misfire), so they
     * are null until it is healthy again. */
    if (info->healthy && info->connected) {
        cJSON_AddNumberToObject(o, "free_pages", (double)info->free_pages);
        cJSON_AddNumberToObject(o, "running", info->running);
        cJSON_AddNumberToObject(o, "leases", (double)info->leases);
    } else {
        cJSON_AddNullToObject(o, "free_pages");
        cJSON_AddNullToObject(o, "running");
        cJSON_AddNullToObject(o, "leases");
    }
    cJSON_AddNumberToObject(o, "total_pages", (double)info->total_pages);
    cJSON_AddNumberToObject(o, "block_size", info->block_size);
    cJSON_AddNumberToObject(o, "handshake_refusals", (double)info->handshake_refusals);
    cJSON_AddNumberToObject(o, "peer_errors", (double)info->peer_errors);
    cJSON_AddNumberToObject(o, "queue_depth", info->queue_depth);
    cJSON_AddNumberToObject(o, "step_ms", info->step_ms);
    cJSON_AddNumberToObject(o, "step_running_ms", info->step_running_ms);
    cJSON_AddNumberToObject(o, "xfer_timeout_ms", (double)info->xfer_timeout_ms);
    cJSON_AddNumberToObject(o, "max_prompt_tokens", info->max_prompt_tokens);
    cJSON_AddNumberToObject(o, "prefill_tokens_per_s", info->prefill_tokens_per_s);
    /* vLLM's hit rate: cached tokens / queried tokens, since the instance started */
    cJSON_AddBoolToObject(o, "prefix_caching", info->prefix_caching);
    cJSON_AddNumberToObject(o, "prefix_cache_hit_rate", (info->prefix_queries > 0) ?
                            (double)info->prefix_hits / (double)info->prefix_queries :
                            0.0);
    cJSON_AddNumberToObject(o, "prefix_cache_hits", (double)info->prefix_hits);
    cJSON_AddNumberToObject(o, "prefix_cache_queries", (double)info->prefix_queries);
    /* --routing prefix's picks (kvf_proxy_route.h), prefill and decode */
    cJSON_AddNumberToObject(o, "prefix_routed", (double)info->prefix_routed);
    cJSON_AddNumberToObject(o, "prefix_routed_tokens", (double)info->prefix_routed_tokens);
    if (role == KVF_PROXY_ROLE_PREFILL) {
        cJSON_AddNumberToObject(o, "lease_timeout_ms", (double)info->lease_timeout_ms);
    }
    cJSON_AddNumberToObject(o, "releases_refused", (double)info->releases_refused);
    cJSON_AddNumberToObject(o, "expired_lease_reads_prevented",
                            (double)info->expired_reads_prevented);
    cJSON_AddNumberToObject(o, "quarantined_blocks", (double)info->quarantined_blocks);
    cJSON_AddNumberToObject(o, "quarantine_cut_blocks",
                            (double)info->quarantine_cut_blocks);
    cJSON_AddNumberToObject(o, "auth_refusals_serve", (double)info->auth_refusals_serve);
    cJSON_AddNumberToObject(o, "auth_refusals_side", (double)info->auth_refusals_side);
    cJSON_AddNumberToObject(o, "last_ok_age_ms", (double)info->last_ok_age_ms);
    cJSON_AddNumberToObject(o, "probes_failed", (double)info->probes_failed);
    cJSON_AddNumberToObject(o, "restarts", (double)info->restarts);
    cJSON_AddNumberToObject(o, "outstanding", info->outstanding);
    if (role == KVF_PROXY_ROLE_DECODE) {
        cJSON_AddNumberToObject(o, "reserved", info->reserved);
    }
    cJSON_AddNumberToObject(o, "max_queue", info->max_queue);
    if (role == KVF_PROXY_ROLE_PREFILL) {
        cJSON_AddNumberToObject(o, "queued_prompt_tokens",
                                (double)kvf_proxy_route_queued(info));
        cJSON_AddNumberToObject(o, "reported_queued_prompt_tokens",
                                (double)info->queued_prompt_tokens);
        cJSON_AddNumberToObject(o, "prefill_tokens_per_s_recent",
                                info->prefill_rate_recent);
        cJSON_AddNumberToObject(o, "wait_calibration", info->wait_calibration);
    }
    if (info->last_error[0] != '\0') {
        cJSON_AddStringToObject(o, "error", info->last_error);
    }
}

/* The pair table: each prefill-decode pair's handshake state. */
static void kvf_proxy_pairs_json(kvf_proxy_pool_h pool, cJSON *root)
{
    cJSON *arr = cJSON_AddArrayToObject(root, "pairs");

    pthread_mutex_lock(&pool->lock);
    for (int p = 0; (arr != NULL) && (p < pool->count[KVF_PROXY_ROLE_PREFILL]); ++p) {
        for (int d = 0; d < pool->count[KVF_PROXY_ROLE_DECODE]; ++d) {
            const kvf_proxy_pair_t *pair = kvf_proxy_pair(pool, p, d);
            cJSON *o = cJSON_CreateObject();

            if (o == NULL) {
                break;
            }
            cJSON_AddStringToObject(o, "prefill", pool->inst[KVF_PROXY_ROLE_PREFILL][p].url);
            cJSON_AddStringToObject(o, "decode", pool->inst[KVF_PROXY_ROLE_DECODE][d].url);
            cJSON_AddStringToObject(o, "state", kvf_proxy_pair_state_str(pair->state));
            if (pair->error[0] != '\0') {
                cJSON_AddStringToObject(o, "error", pair->error);
            }
            cJSON_AddItemToArray(arr, o);
        }
    }
    pthread_mutex_unlock(&pool->lock);
}

/* The proxy's tokenizer: its fingerprint and where it came from (kvf_proxy_tokcheck.c). */
static void kvf_proxy_tok_json(kvf_proxy_pool_h pool, cJSON *root)
{
    cJSON *o = cJSON_AddObjectToObject(root, "tokenizer");

    pthread_mutex_lock(&pool->lock);
    if (o != NULL) {
        if (pool->tok_digest[0] != '\0') {
            cJSON_AddStringToObject(o, "digest", pool->tok_digest);
        } else {
            cJSON_AddNullToObject(o, "digest");
        }
        cJSON_AddStringToObject(o, "source", pool->tok_source);
    }
    pthread_mutex_unlock(&pool->lock);
}

cJSON *kvf_proxy_pool_health_json(kvf_proxy_pool_h pool)
{
    cJSON *root = cJSON_CreateObject();

    if (root == NULL) {
        return NULL;
    }
    cJSON_AddStringToObject(root, "status", kvf_proxy_pool_ready(pool) ? "ok" : "unavailable");
    cJSON_AddStringToObject(root, "routing",
                            ((pool->kvidx[KVF_PROXY_ROLE_PREFILL] != NULL) ||
                             (pool->kvidx[KVF_PROXY_ROLE_DECODE] != NULL)) ? "prefix" : "load");
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        cJSON *arr = cJSON_AddArrayToObject(root, kvf_proxy_role_name((kvf_proxy_role_t)role));
        for (int i = 0; (arr != NULL) && (i < pool->count[role]); ++i) {
            kvf_proxy_instance_info_t info;
            cJSON *o = cJSON_CreateObject();

            if (o == NULL) {
                break;
            }
            kvf_proxy_pool_info(pool, (kvf_proxy_role_t)role, i, &info);
            kvf_proxy_instance_json(o, role, &info);
            {   /* --routing prefix: what its events said */
                cJSON *ev = kvf_proxy_kvidx_json(pool->kvidx[role], i);
                if (ev != NULL) {
                    cJSON_AddItemToObject(o, "kv_events", ev);
                }
            }
            cJSON_AddItemToArray(arr, o);
        }
    }
    kvf_proxy_pairs_json(pool, root);
    kvf_proxy_tok_json(pool, root);
    return root;
}

void kvf_proxy_pool_render_metrics(kvf_proxy_pool_h pool, FILE *out)
{
    static const struct {
        const char *name;
        const char *type;
        const char *help;
        bool        live;   /* only shown while the instance is healthy and connected */
    } g[] = {
        {"kvf_instance_healthy", "gauge", "1 when the instance answers health checks.", false},
        {"kvf_instance_free_pages", "gauge",
         "Free cache pages, summed over ranks (absent while unhealthy).", true},
        {"kvf_instance_total_pages", "gauge", "Cache pages, summed over ranks.", false},
        {"kvf_instance_running_requests", "gauge",
         "Requests holding blocks (absent while unhealthy).", true},
        {"kvf_instance_leases", "gauge",
         "Prefill: requests held for decode (absent while unhealthy).", true},
        {"kvf_instance_handshake_refusals_total", "counter",
         "Handshakes the instance refused or had refused.", false},
        {"kvf_instance_peer_errors_total", "counter", "Peer errors the instance saw.", false},
        {"kvf_instance_health_check_failures_total", "counter",
         "Health probes unanswered or failed.", false},
        {"kvf_instance_restarts_total", "counter",
         "Restarts seen: a new process (incarnation) under the same endpoint.", false},
        {"kvf_instance_releases_refused_total", "counter",
         "Prefill: lease claims/releases refused (wrong nonce or engine, replays).", false},
        {"kvf_instance_expired_lease_reads_prevented_total", "counter",
         "Reads not trusted because the KV lease expired (prefill: answered expired; decode:"
         " pulls not used or not started).", false},
        {"kvf_instance_quarantined_blocks_total", "counter",
         "Prefill: blocks of expired or aborted leases held in quarantine before reuse.", false},
        {"kvf_instance_outstanding_requests", "gauge",
         "Requests this proxy sent the instance and has not seen answered (prefill) or"
         " finished (decode).", false},
        {"kvf_instance_queued_prompt_tokens", "gauge",
         "Prefill: queued prompt work routing and admission use (outstanding here plus what"
         " the instance reports beyond it).", false},
        {"kvf_instance_prefill_tokens_per_second", "gauge",
         "Prefill: recent prefill rate (EWMA over probe intervals) admission divides by.",
         false},
        {"kvf_instance_auth_refusals_serve_total", "counter",
         "Peers the key check of the instance's control channel refused (docs/SECURITY.md).",
         false},
        {"kvf_instance_auth_refusals_side_total", "counter",
         "Prefill: peers the key check of its side channel refused (docs/SECURITY.md).", false},
        {"kvf_instance_prefix_routed_total", "counter",
         "Requests routed to it for a prefix its KV events say it caches "
         "(--routing prefix; prefill and decode).", false},
        {"kvf_instance_prefix_routed_tokens_total", "counter",
         "Prompt tokens of those requests it was expected to have cached.", false},
    };
    int n = pool->count[0] + pool->count[1];
    kvf_proxy_instance_info_t *infos = calloc((size_t)(n > 0 ? n : 1), sizeof(*infos));
    int k = 0;

    if (infos == NULL) {
        return;
    }
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i) {
            kvf_proxy_pool_info(pool, (kvf_proxy_role_t)role, i, &infos[k++]);
        }
    }
    for (size_t m = 0; m < sizeof(g) / sizeof(g[0]); ++m) {
        kvf_prom_head(out, g[m].name, g[m].type, g[m].help);
        k = 0;
        for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
            for (int i = 0; i < pool->count[role]; ++i, ++k) {
                const kvf_proxy_instance_info_t *f = &infos[k];
                uint64_t v[] = {f->healthy, f->free_pages, f->total_pages, f->running, f->leases,
                                f->handshake_refusals, f->peer_errors, f->probes_failed,
                                f->restarts, f->releases_refused, f->expired_reads_prevented,
                                f->quarantined_blocks, f->outstanding,
                                kvf_proxy_route_queued(f), (uint64_t)f->prefill_rate_recent,
                                f->auth_refusals_serve, f->auth_refusals_side,
                                f->prefix_routed, f->prefix_routed_tokens};
                /* Live gauges of an instance that does not answer would be
                 * stale: left out until it is healthy again. */
                if (g[m].live && !(f->healthy && f->connected)) {
                    continue;
                }
                kvf_prom_label_t lab[] = {
                    {"kvf_instance", f->url},
                    {"role", kvf_proxy_role_name((kvf_proxy_role_t)role)},
                    {"engine_id", f->engine_id},
                };
                kvf_prom_sample_u64(out, g[m].name, lab, 3, v[m]);
            }
        }
    }
    /* where each instance runs, as a label of an info gauge (always 1) */
    kvf_prom_head(out, "kvf_instance_device_info", "gauge",
                  "The instance's --device (cpu, or each rank's GPU), from its health replies.");
    k = 0;
    for (int role = 0; role < KVF_PROXY_ROLE_COUNT; ++role) {
        for (int i = 0; i < pool->count[role]; ++i, ++k) {
            if (infos[k].device[0] == '\0') {
                continue;   /* not answered yet, or a daemon without the field */
            }
            /* kvf_instance, not instance (Prometheus sets that on every scraped target) */
            kvf_prom_label_t lab[] = {
                {"kvf_instance", infos[k].url},
                {"role", kvf_proxy_role_name((kvf_proxy_role_t)role)},
                {"engine_id", infos[k].engine_id},
                {"device", infos[k].device},
            };
            kvf_prom_sample_u64(out, "kvf_instance_device_info", lab, 4, 1);
        }
    }
    free(infos);
}
