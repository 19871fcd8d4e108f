/*
 * What both role daemons (kvf-prefill, kvf-decode) do around the engine and
 * the KV connector: create the connector, build the engine from flags with
 * every rank's pool in the connector's memory (or registered with it:
 * --pool-alloc heap), report health, and the process main (flags,
 * signals, serve until told to stop). prefill/ and decode/ never use each
 * other (docs/ARCHITECTURE.md §4), so their common part lives here, below both.
 */
#ifndef KVF_ROLE_H
#define KVF_ROLE_H

#include "kvf_config.h"
#include "kvf_connector.h"
#include "kvf_engine.h"
#include "kvf_engine_opts.h"
#include "kvf_serve_channel.h"

#include <signal.h>
#include <stddef.h>

/** The flags both roles share; each role's config struct embeds it as `role`. */
typedef struct kvf_role_config {
    char    model[KVF_CONFIG_STR_MAX];       /* folder: config.json + model.safetensors */
    int     tp;                              /* ranks, 1..KVF_ROLE_MAX_TP */
    char    listen[KVF_CONFIG_STR_MAX];      /* ZeroMQ endpoint the proxy connects to */
    char    engine_id[KVF_CONFIG_STR_MAX];   /* unique in the pool, < 64 bytes */
    int     num_blocks;                      /* per rank pool */
    char    kv_dtype[KVF_CONFIG_STR_MAX];    /* fp32, bf16, fp16 */
    int     block_size;                      /* user block size (alignment unit), >= 1 */
    char    kv_layout[KVF_CONFIG_STR_MAX];   /* layer-major or head-major */
    int     max_batch_tokens;                /* per engine step */
    int64_t xfer_timeout_ms;                 /* bound on every transfer wait */
    int64_t drain_timeout_ms;                /* after SIGTERM: longest drain before exit */
    char    pool_alloc[KVF_CONFIG_STR_MAX];  /* ucx (connector's shared memory) or heap */
    char    keys[KVF_CONFIG_STR_MAX];        /* key set folder (kvf_zmq_auth.h), "" = none */
    char    key_id[KVF_CONFIG_STR_MAX];      /* this daemon's member id; "" = engine_id */
    bool    insecure;                        /* plain ZeroMQ, any peer (lab only; warns) */
    bool    test_no_block_zero;              /* TEST ONLY: fresh attention blocks not zeroed */
    char    device[KVF_CONFIG_STR_MAX];      /* cpu, cuda or cuda:N (rank r on cuda:N+r) */
    int     metrics_port;                    /* HTTP /metrics and /health; 0: none */
    char    served_model_name[KVF_CONFIG_STR_MAX]; /* model_name label; "": --model */
    bool    prefix_caching;                  /* docs/PREFIX_CACHE.md */
    size_t  prefix_state_bytes;              /* Mamba state checkpoints per rank */
    int     prefix_state_grid;               /* tokens; also the prompt chunk grid */
    char    kv_events_config[KVF_CONFIG_STR_MAX];   /* vLLM's KVEventsConfig JSON; "" none */
    char    kv_events_endpoint[KVF_CONFIG_STR_MAX]; /* PUB; "" none (daemon/kvf_kv_events.h) */
    char    kv_events_replay[KVF_CONFIG_STR_MAX];   /* ROUTER for replay; "" none */
    char    kv_events_format[KVF_CONFIG_STR_MAX];   /* map or array */
} kvf_role_config_t;

#define KVF_ROLE_MAX_TP 64

/*
 * The timeout model (deploy/README.md, "Timeouts"): one unit T, the
 * transfer timeout, the same default in both roles. Prefill's lease is 3T
 * (decode may queue a request for blocks until T before it expires, then
 * pull within T); the proxy waits 3T for prefill's first token and for each
 * decode reply, 6T for a whole request, and T/2 for a health answer.
 * NOTE: change these together with kvf_proxy_config_table and the README.
 */
#define KVF_ROLE_XFER_TIMEOUT_DEFAULT "10s"
/* Drain on SIGTERM: as long as a lease (3T), so every lease handed out can be used. */
#define KVF_ROLE_DRAIN_TIMEOUT_DEFAULT "30s"

/*
 * Config-table rows for the shared flags of a config struct @a _type that
 * holds a kvf_role_config_t named `role`. Defaults that differ per role are
 * arguments, as strings. TEST_NO_BLOCK_ZERO is hidden (not in --help or
 * --print-config) but parsed like every row: --test-no-block-zero [yes|no]
 * or KVF_TEST_NO_BLOCK_ZERO=yes, a bad value refused naming the flag.
 */
#define KVF_ROLE_CONFIG_FIELDS(_type, _listen, _engine_id)                                    \
    KVF_ENGINE_OPT(MODEL, _type, role.),                                                      \
    KVF_ENGINE_OPT(TP, _type, role.),                                                         \
    {"LISTEN", _listen, "ZeroMQ endpoint the proxy connects to",                              \
     offsetof(_type, role.listen), KVF_CONFIG_TYPE_STRING, 0},                                \
    {"ENGINE_ID", _engine_id, "engine id, unique in the pool",                                \
     offsetof(_type, role.engine_id), KVF_CONFIG_TYPE_STRING, 0},                             \
    KVF_ENGINE_OPT(NUM_BLOCKS, _type, role.),                                                 \
    KVF_ENGINE_OPT(KV_DTYPE, _type, role.),                                                   \
    KVF_ENGINE_OPT(BLOCK_SIZE, _type, role.),                                                 \
    KVF_ENGINE_OPT(KV_LAYOUT, _type, role.),                                                  \
    KVF_ENGINE_OPT(MAX_BATCH_TOKENS, _type, role.),                                           \
    KVF_ENGINE_OPT(DEVICE, _type, role.),                                                     \
    {"XFER_TIMEOUT", KVF_ROLE_XFER_TIMEOUT_DEFAULT,                                           \
     "bound on every transfer wait (handshake, pull, release); the unit of the timeout model", \
     offsetof(_type, role.xfer_timeout_ms), KVF_CONFIG_TYPE_TIME, 0},                         \
    {"DRAIN_TIMEOUT", KVF_ROLE_DRAIN_TIMEOUT_DEFAULT,                                         \
     "after SIGTERM: longest wait for leases and requests in flight before exiting (a second " \
     "SIGTERM exits at once)", offsetof(_type, role.drain_timeout_ms), KVF_CONFIG_TYPE_TIME, 0}, \
    {"POOL_ALLOC", "ucx",                                                                     \
     "where the page pools live: ucx (shared memory UCX maps, which a peer on the same host " \
     "reads with a plain copy) or heap (malloc, registered with UCX)",                        \
     offsetof(_type, role.pool_alloc), KVF_CONFIG_TYPE_STRING, 0},                            \
    {"KEYS", "", "key set folder (server.key, <id>.key, pool.pub; made by kvf-up or `kvf "  \
     "keygen`): CURVE on every channel, only pool members accepted (docs/SECURITY.md)",     \
     offsetof(_type, role.keys), KVF_CONFIG_TYPE_STRING, 0},                                  \
    {"KEY_ID", "", "this daemon's member id in pool.pub (empty: the engine id)",             \
     offsetof(_type, role.key_id), KVF_CONFIG_TYPE_STRING, 0},                                \
    {"INSECURE", "no", "no keys: plain ZeroMQ that accepts any peer (closed lab networks "    \
     "only; warns at every start)", offsetof(_type, role.insecure), KVF_CONFIG_TYPE_BOOL, 0}, \
    {"METRICS_PORT", "0", "HTTP port serving GET /metrics (vLLM's per-engine gauges and "      \
     "kvf_daemon_*) and GET /health (503 while starting, draining or broken); 0: none",     \
     offsetof(_type, role.metrics_port), KVF_CONFIG_TYPE_INT, 0},                            \
    {"SERVED_MODEL_NAME", "", "the model_name label of /metrics (empty: --model as given, "   \
     "as vLLM does; give the proxy's --model-name)",                                         \
     offsetof(_type, role.served_model_name), KVF_CONFIG_TYPE_STRING, 0},                    \
    KVF_ENGINE_OPT(PREFIX_CACHING, _type, role.),                                             \
    KVF_ENGINE_OPT(PREFIX_STATE_BYTES, _type, role.),                                         \
    KVF_ENGINE_OPT(PREFIX_STATE_GRID, _type, role.),                                          \
    {"KV_EVENTS_CONFIG", "", "vLLM's KV events (docs/PREFIX_CACHE.md section 7), as vLLM's "  \
     "--kv-events-config JSON: enable_kv_cache_events, publisher (zmq or null), endpoint "     \
     "(PUB, default tcp://*:5557), replay_endpoint, buffer_steps, hwm, max_queue_size, topic; " \
     "off by default", offsetof(_type, role.kv_events_config), KVF_CONFIG_TYPE_STRING, 0},    \
    {"KV_EVENTS_ENDPOINT", "", "publish KV events on this ZeroMQ PUB endpoint (as "           \
     "--kv-events-config's endpoint; tcp://*:0 binds a free port, shown in /health)",          \
     offsetof(_type, role.kv_events_endpoint), KVF_CONFIG_TYPE_STRING, 0},                    \
    {"KV_EVENTS_REPLAY_ENDPOINT", "", "ZeroMQ ROUTER endpoint answering replay requests (as " \
     "--kv-events-config's replay_endpoint)",                                                  \
     offsetof(_type, role.kv_events_replay), KVF_CONFIG_TYPE_STRING, 0},                      \
    {"KV_EVENTS_FORMAT", "map", "KV event encoding: map (vLLM's named fields, current vLLM) " \
     "or array (the positional form of earlier vLLM)",                                        \
     offsetof(_type, role.kv_events_format), KVF_CONFIG_TYPE_STRING, 0},                      \
    {"TEST_NO_BLOCK_ZERO", "no",                                                              \
     "test only: fresh attention blocks are not zeroed (reproduces the stale-bytes NaN)",     \
     offsetof(_type, role.test_no_block_zero), KVF_CONFIG_TYPE_BOOL, KVF_CONFIG_FLAG_HIDDEN}

/**
 * Check the shared flags; logs one line naming the first bad flag and its
 * value. @return KVF_OK or KVF_ERR_INVALID_PARAM.
 */
kvf_status_t kvf_role_check_flags(const kvf_role_config_t *config);

/**
 * The attention KV dtype of --kv-dtype @a text as the daemons accept it:
 * kvf_engine_opts_dtype() for an engine that computes in it (fp32, bf16, fp16 and their
 * aliases, auto = bf16; fp8 refused naming why). Logs one line when refused.
 * @return KVF_OK (@a dtype_p set) or KVF_ERR_INVALID_PARAM.
 */
kvf_status_t kvf_role_kv_dtype(const char *text, kvf_dtype_t *dtype_p);

/**
 * Refuse two durations that contradict each other: @a a_ms (flag @a a_flag,
 * e.g. "--lease-timeout") must not be shorter than @a b_ms (@a b_flag, e.g.
 * "--xfer-timeout"). Logs one line naming both values and @a consequence:
 * "--lease-timeout 5000 ms is shorter than --xfer-timeout 10000 ms: a lease
 * would expire during a transfer". kvf-up makes the same checks across the
 * pool's daemons before it starts any (deploy/pool/kvf-up).
 * @return KVF_OK or KVF_ERR_INVALID_PARAM.
 */
kvf_status_t kvf_role_check_not_shorter(const char *a_flag, int64_t a_ms, const char *b_flag,
                                        int64_t b_ms, const char *consequence);

/**
 * Load the model, create the UCX connector for @a role, build the engine
 * (rank threads, pools) and give the connector every rank's pool once:
 * with POOL_ALLOC ucx the connector allocates the pools (alloc_pool: UCX-
 * mapped shared memory, read by a same-host peer with a plain copy, no
 * progress needed on this side; measured in tests/bench/results/peers.md),
 * with heap the pools are malloc'd and registered (register_pool).
 * @a listen_host / @a listen_port: the prefill side channel (NULL/0 for decode).
 * @return KVF_OK with *engine_p, *ops_p, *conn_p (the caller destroys them);
 *         KVF_ERR_INVALID_PARAM for a bad dtype; model, geometry, pool and
 *         connector errors, each logged. On error *engine_p may be set (destroy it).
 */
kvf_status_t kvf_role_start(const kvf_role_config_t *config, kvf_connector_role_t role,
                            const char *listen_host, int listen_port, kvf_engine_h *engine_p,
                            const kvf_connector_ops_t **ops_p, kvf_connector_h *conn_p);

/**
 * The longest prompt @a engine's page pool can hold at all (tokens), from
 * its block manager: what decides "this prompt can never fit here".
 */
int kvf_role_max_prompt_tokens(kvf_engine_h engine);

/**
 * Fill the engine-derived part of a health reply: role, engine id, TP size,
 * free and total pages summed over ranks, block size, transfer timeout,
 * the longest prompt the pool holds and the measured prefill rate.
 * @a role and @a config must outlive @a health (strings are not copied).
 * The caller adds its role's counters and publishes it with
 * kvf_serve_server_set_health() (or sends it with kvf_role_reply_health()).
 */
void kvf_role_health_fill(kvf_engine_h engine, const char *role,
                          const kvf_role_config_t *config, Kvf__HealthReply *health);

/*
 * A TP world that broke (a barrier timed out: a rank thread stuck or gone,
 * common/runtime/kvf_collectives.h) fails every later collective, so the
 * instance can never compute again. It stays up this long after it noticed,
 * answering health with HealthReply.cannot_serve = the world's error (the
 * proxy marks it unhealthy with that text and routes around it; 500 ms
 * probes see it several times) and refusing new work, then exits 1 so a
 * supervisor (kvf-up --supervise, a Kubernetes restart policy) starts it anew.
 */
#define KVF_ROLE_BROKEN_EXIT_MS 3000

/**
 * Why @a engine can no longer serve (its TP world broke), or NULL while it
 * can. The text is stable once set. kvf_role_health_fill() puts it in
 * HealthReply.cannot_serve.
 */
const char *kvf_role_cannot_serve(kvf_engine_h engine);

/**
 * The run loop's check, once per iteration: false while the TP world is
 * whole; once it broke, logs the error and the coming exit (once, keeping
 * the time in *broken_ms_p, which starts at 0) and returns true
 * KVF_ROLE_BROKEN_EXIT_MS later, when the loop should return an error
 * (the process then exits 1).
 */
bool kvf_role_broken_exit(kvf_engine_h engine, uint64_t *broken_ms_p);

/**
 * Stop the KV event publisher kvf_role_start() started (after the engine is
 * destroyed, so its AllBlocksCleared goes out). No-op when none runs.
 */
void kvf_role_events_stop(void);

/** Longest --device description kept: "cuda:0,cuda:1,..." for every rank. */
#define KVF_ROLE_DEVICE_NAMES_MAX 256

/**
 * Where this process's ranks run, as HealthReply.device and the ready line
 * say it: "cpu", or each rank's GPU in rank order ("cuda:0"; TP 2 from
 * cuda:2: "cuda:2,cuda:3"). "cpu" before kvf_role_start() placed the pools.
 * Static storage, stable after start-up; any thread.
 */
const char *kvf_role_device_names_get(void);

/**
 * Wait until the block zeroing enqueued on every rank's pool device is done
 * (CUDA: the pool stream of each rank synchronised, rank 0's device current
 * again on return; the CPU: nothing to wait for). Decode calls it after
 * kvf_engine_import_begin() and before any GET is posted: a transfer
 * engine's copies run on streams of their own, so a zeroing kernel still
 * queued could land after, and over, the pulled bytes. Leader thread.
 * @return KVF_OK; KVF_ERR_CUDA (logged, naming the rank and the device).
 */
kvf_status_t kvf_role_pools_sync(kvf_engine_h engine);

/** Send @a health to @a peer (request_id "health", done). */
void kvf_role_reply_health(kvf_serve_server_h serve, const kvf_serve_peer_t *peer,
                           Kvf__HealthReply *health);

/** Values of the run loop's *stop (kvf_role_daemon_t.run). */
#define KVF_ROLE_STOP_DRAIN 1   /* drain: refuse new work, finish what was handed out */
#define KVF_ROLE_STOP_NOW   2   /* stop at once */

/*
 * After a drain finished, the daemon keeps its control channel serving this
 * long before it closes it: the last replies are still in socket buffers,
 * and a close while a peer's message sits unread makes the kernel reset the
 * connection and drop them (the proxy would lose a stream's last tokens).
 */
#define KVF_ROLE_DRAIN_FLUSH_MS 250

/** A role daemon as the process main sees it. */
typedef struct kvf_role_daemon {
    const char               *name;     /* "kvf-prefill"; for --help and logs */
    const char               *role;     /* "prefill"; the log prefix */
    const kvf_config_field_t *table;
    void                     *config;   /* struct the table fills; its first member is the
                                         * kvf_role_config_t (engine id for the log prefix) */
    kvf_status_t (*create)(const void *config, void **server_p);
    /* serve until *stop: 1 = drain (first SIGTERM/SIGINT), then return
     * KVF_OK once drained or after --drain-timeout; 2 or more = return now */
    kvf_status_t (*run)(void *server, volatile sig_atomic_t *stop);
    void         (*destroy)(void *server);
} kvf_role_daemon_t;

/**
 * Parse flags and KVF_* variables into d->config, install SIGTERM/SIGINT
 * handlers (the first asks the loop to drain, a second to stop at once),
 * create, run, destroy.
 * @return the process exit code: 0 after a requested stop or --help, 1 on a
 *         setup or fatal error, 2 on bad flags.
 */
int kvf_role_main(const kvf_role_daemon_t *d, int argc, char **argv);

#endif
