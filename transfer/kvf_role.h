/*
 * What both role daemons (kvf-prefill, kvf-decode) do around the engine and
 * the KV connector: build the engine from flags, register every rank's
 * pool with the connector, report health, and the process main (flags,
 * signals, serve until told to stop). prefill/ and decode/ never use each
 * other (DESIGN.md §4), so their common part lives here, below both.
 */
#ifndef KVF_ROLE_H
#define KVF_ROLE_H

#include "common/kvf_config.h"
#include "common/kvf_connector.h"
#include "common/kvf_engine.h"
#include "transfer/kvf_serve_channel.h"

#include <signal.h>

typedef struct kvf_role_engine_params {
    const char *model;             /* folder: config.json + model.safetensors */
    int         tp;                /* >= 1 */
    int         num_blocks;        /* per rank pool, >= 1 */
    const char *kv_dtype;          /* "fp32", "bf16", "fp16" */
    int         block_size;        /* user block size (alignment unit) */
    int         max_batch_tokens;  /* per engine step */
} kvf_role_engine_params_t;

#define KVF_ROLE_MAX_TP 64

/**
 * Check the flags both roles share; logs one line naming the first bad flag
 * and its value. @return KVF_OK or KVF_ERR_INVALID_PARAM.
 */
kvf_status_t kvf_role_check_flags(const kvf_role_engine_params_t *params, const char *engine_id,
                                  int64_t xfer_timeout_ms);

/**
 * Load the model and build the engine (rank threads, pools).
 * @param [out] cache_p  The cache params the pools were built with (what the
 *                       connector advertises).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for a bad dtype (logged with the flag);
 *         model, geometry and pool errors.
 */
kvf_status_t kvf_role_engine_create(const kvf_role_engine_params_t *params,
                                    kvf_engine_h *engine_p, kvf_cache_params_t *cache_p);

/**
 * Create the UCX connector for @a engine and register every rank's pool
 * once. @a config's cfg and tp_size are taken from the engine.
 * @return KVF_OK with *ops_p and *conn_p (destroy with (*ops_p)->destroy);
 *         connector errors; on error nothing is left allocated.
 */
kvf_status_t kvf_role_connector_create(kvf_engine_h engine, const kvf_cache_params_t *cache,
                                       const kvf_connector_config_t *config,
                                       const kvf_connector_ops_t **ops_p,
                                       kvf_connector_h *conn_p);

/**
 * Fill the engine-derived part of a health reply: role, engine id, TP size,
 * free and total pages summed over ranks, block size. The caller adds its
 * role's counters and sends it with kvf_role_reply_health().
 */
void kvf_role_health_fill(kvf_engine_h engine, const char *role, const char *engine_id,
                          Kvf__HealthReply *health);

/** Send @a health to @a peer (request_id "health", done). */
void kvf_role_reply_health(kvf_serve_server_h serve, const kvf_serve_peer_t *peer,
                           Kvf__HealthReply *health);

/** A role daemon as the process main sees it. */
typedef struct kvf_role_daemon {
    const char               *name;     /* "kvf-prefill"; for --help and logs */
    const char               *role;     /* "prefill"; the log prefix */
    const kvf_config_field_t *table;
    void                     *config;   /* struct the table fills */
    kvf_status_t (*create)(const void *config, void **server_p);
    kvf_status_t (*run)(void *server, volatile sig_atomic_t *stop);
    void         (*destroy)(void *server);
} kvf_role_daemon_t;

/**
 * Parse flags and KVF_* variables into d->config, install SIGTERM/SIGINT
 * handlers that ask the loop to stop, create, run, destroy.
 * @return the process exit code: 0 after a requested stop or --help, 1 on a
 *         setup or fatal error, 2 on bad flags.
 */
int kvf_role_main(const kvf_role_daemon_t *d, int argc, char **argv);

#endif
