/*
 * kvf-proxy: the OpenAI-compatible HTTP entry point of a P/D pool. It
 * tokenizes the prompt, runs it on a prefill instance, hands the first
 * token and the transfer parameters to a decode instance and relays the
 * tokens back (docs/ARCHITECTURE.md §3). This header is the whole-program view: the
 * config table and the object that ties the pool, the metrics and the HTTP
 * front end together.
 */
#ifndef KVF_PROXY_H
#define KVF_PROXY_H

#include "kvf_config.h"
#include "kvf_status.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_proxy_config {
    char    host[KVF_CONFIG_STR_MAX];
    int     port;
    char    prefill[KVF_CONFIG_STR_MAX];
    char    decode[KVF_CONFIG_STR_MAX];
    char    model[KVF_CONFIG_STR_MAX];        /* config.json or its folder; "" = bytes only */
    char    model_name[KVF_CONFIG_STR_MAX];
    int64_t request_timeout;                  /* ms */
    int64_t prefill_timeout;                  /* ms */
    int64_t token_timeout;                    /* ms */
    int64_t health_interval;                  /* ms */
    int64_t health_timeout;                   /* ms */
    int64_t idle_timeout;                     /* ms */
    int64_t header_timeout;                   /* ms */
    int64_t body_timeout;                     /* ms */
    int64_t drain_timeout;                    /* ms */
    int     max_connections;
    int     max_per_client;                   /* 0: no per-client cap */
    int     max_outstanding;                  /* per instance (kvf_proxy_route.h) */
    char    trusted_proxy[KVF_CONFIG_STR_MAX];/* X-Forwarded-For believed from these */
    char    api_key[KVF_CONFIG_STR_MAX];      /* "" = none */
    char    api_key_file[KVF_CONFIG_STR_MAX];
    bool    protect_metrics;                  /* /health and /metrics need the key too */
    char    tls_cert[KVF_CONFIG_STR_MAX];     /* "" = plain HTTP */
    char    tls_key[KVF_CONFIG_STR_MAX];
    size_t  max_body;
    int     max_prompt_tokens;
    int     max_tokens_limit;
    int     default_max_tokens;
    bool    add_bos;
    char    keys[KVF_CONFIG_STR_MAX];         /* key set folder (kvf_zmq_auth.h); "" = none */
    char    key_id[KVF_CONFIG_STR_MAX];       /* member id in pool.pub, default "proxy" */
    bool    insecure;                         /* plain ZeroMQ (lab only; warns) */
    char    served_model_name[KVF_CONFIG_STR_MAX]; /* comma list; "" = model_name */
    size_t  admission_queue_bytes;            /* queued prompts' bytes (kvf_proxy_admit.h);
                                               * 0: no queue, a full pool answers 503 */
    char    prefill_file[KVF_CONFIG_STR_MAX]; /* file listing the prefill endpoints; "" none */
    char    decode_file[KVF_CONFIG_STR_MAX];  /* file listing the decode endpoints; "" none */
    char    scheduling_policy[KVF_CONFIG_STR_MAX]; /* "fcfs" or "priority" (kvf_proxy_admit.h) */
    char    routing[KVF_CONFIG_STR_MAX];   /* "prefix" or "load" (kvf_proxy_route.h) */
    double  prefix_routing_weight;         /* a cached token's worth in tokens of work */
    double  decode_prefix_routing_weight;  /* decode: a whole prompt to pull, in requests */
    bool    enable_auto_tool_choice;          /* tool_choice "auto" parsed (kvf_proxy_tools.h) */
    char    tool_call_parser[KVF_CONFIG_STR_MAX]; /* hermes, llama3_json, mistral; "" none */
    char    reasoning_parser[KVF_CONFIG_STR_MAX]; /* deepseek_r1, qwen3; "" none */
} kvf_proxy_config_t;

/** Flags and KVF_* variables of kvf-proxy (NULL-name terminated). */
extern const kvf_config_field_t kvf_proxy_config_table[];

typedef struct kvf_proxy *kvf_proxy_h;

/**
 * Load the tokenizer, connect to the instances and start serving HTTP.
 * @return KVF_OK; errors of kvf_tok_config_load(), kvf_proxy_pool_create()
 *         and kvf_proxy_http_start() (all logged). Nothing runs on error.
 */
kvf_status_t kvf_proxy_create(const kvf_proxy_config_t *cfg, kvf_proxy_h *proxy_p);

/** The HTTP port actually bound (with --port 0, the one the kernel chose). */
int kvf_proxy_port(kvf_proxy_h proxy);

/**
 * SIGTERM: stop accepting, let the requests in flight finish for up to
 * --drain-timeout, then end the rest (streams with an error event and
 * [DONE]). Call once, then kvf_proxy_destroy().
 */
void kvf_proxy_drain(kvf_proxy_h proxy);

/** Stop HTTP first (aborting requests in flight), then the pool. NULL: no-op. */
void kvf_proxy_destroy(kvf_proxy_h proxy);

#endif
