/*
 * kvf-proxy: the series a vLLM operator's dashboards read, under kvferry
 * names (Prometheus style, kvf_ prefix) and with a model_name label, rendered
 * at the end of /metrics. deploy/README.md ("Metrics") names the vLLM series
 * each one stands for; deploy/grafana/kvferry.json charts them.
 *
 *   kvf_num_requests_running{model_name,kvf_instance,role,engine_id}   gauge
 *   kvf_num_requests_waiting{model_name,kvf_instance,role,engine_id}   gauge
 *   kvf_kv_cache_usage_perc{model_name,kvf_instance,role,engine_id}   gauge, 0..1
 *   kvf_kv_transfers_total{model_name}                             counter
 *   kvf_kv_failed_transfers_total{model_name}                      counter
 *   kvf_kv_transfer_bytes{model_name}                              histogram, bytes
 *
 * The per-instance gauges come from each instance's last health reply and are
 * left out while the instance is unhealthy (a stale value would mislead).
 * The transfer series count the KV pulls decode instances reported at the end
 * of each request (TransferStats): a failed one is a pull that did not land,
 * so decode recomputed the prompt.
 */
#ifndef KVF_PROXY_EXPORT_H
#define KVF_PROXY_EXPORT_H

#include "kvf_proxy_pool.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/**
 * Count one KV transfer of @a bytes (a successful one goes into the bytes
 * histogram; a failed one, @a failed true, into the failure counter). The
 * counts are process-wide (one proxy per process); thread-safe.
 */
void kvf_proxy_export_transfer(uint64_t bytes, bool failed);

/**
 * Write the series above in Prometheus text format (HELP and TYPE lines
 * included) to @a out, each labelled model_name=@a model_name (escaped).
 * @a pool: the instances whose gauges are shown; NULL: none.
 */
void kvf_proxy_export_render(kvf_proxy_pool_h pool, const char *model_name, FILE *out);

#endif
